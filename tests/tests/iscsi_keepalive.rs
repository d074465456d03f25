//! NOP-In keepalive (RFC 7143 §11.19): an initiator that keeps its
//! connection open but stops answering is detected within the configured
//! interval + timeout, its connection closed and its session removed.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed step is a failed test

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Command as Proc;
use std::time::{Duration, Instant};

use ferrite_iscsi::initiator::Command;
use ferrite_tests::{
    Config, Device, Ferrited, Login, Options, Target, ferrited_path, free_port, run_with_timeout,
};

const IQN: &str = "iqn.2026-11.org.ferrite:keepalive";
const INI: &str = "iqn.2026-11.org.ferrite.test:silent";
const INTERVAL_S: u64 = 1;
const TIMEOUT_S: u64 = 2;

fn config(dir: &Path, port: u16) -> PathBuf {
    Config::new()
        .device(Device::nullio("n0", 16777216))
        .iscsi("nop_in_interval_s", INTERVAL_S)
        .iscsi("nop_in_timeout_s", TIMEOUT_S)
        .target(
            Target::new(IQN)
                .set("enabled", true)
                .portal(format!("127.0.0.1:{port}"))
                .lun(0, "n0"),
        )
        .write(dir.join("keepalive.json"))
}

fn sessions(f: &Ferrited) -> String {
    let ctl = ferrited_path().with_file_name("ferritectl");
    let out = run_with_timeout(
        Proc::new(ctl)
            .arg("--socket")
            .arg(f.control())
            .arg("sessions"),
        Duration::from_secs(30),
    );
    assert!(
        out.status.success(),
        "ferritectl sessions: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn silent_initiator_is_dropped_within_the_nop_in_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let cfg = config(dir.path(), port);
    let f = Ferrited::start(
        dir.path(),
        port,
        Options {
            config: Some(cfg),
            args: Vec::new(),
        },
    );
    let mut i = Login::new(INI, IQN)
        .read_timeout(Duration::from_secs(30))
        .connect(f.addr);
    let tur = [0u8; 6];
    i.command(&Command {
        cdb: &tur,
        attr: 1,
        ..Command::default()
    })
    .expect("TEST UNIT READY");
    let silent_since = Instant::now();
    assert!(
        sessions(&f).contains(INI),
        "session missing after login:\n{}",
        sessions(&f)
    );
    // From here on the initiator says nothing: no NOP-Out answers the
    // target's NOP-Ins. Poll the session list until the session is gone.
    let bound = Duration::from_secs(INTERVAL_S + TIMEOUT_S + 10);
    let gone = loop {
        if !sessions(&f).contains(INI) {
            break silent_since.elapsed();
        }
        assert!(
            silent_since.elapsed() < bound,
            "session still listed {bound:?} after the initiator went silent:\n{}",
            f.log_text()
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    // Not before the target asked: one interval without traffic, then the
    // ping's timeout.
    assert!(
        gone >= Duration::from_secs(INTERVAL_S + TIMEOUT_S) - Duration::from_millis(500),
        "session dropped after {gone:?}, before interval + timeout"
    );
    // The target pinged (NOP-In with a target transfer tag) and then closed
    // the connection: the socket drains to end of file.
    let mut buf = Vec::new();
    let n = i.t.read_to_end(&mut buf);
    assert!(n.is_ok(), "socket not closed cleanly: {n:?}");
    assert!(
        buf.len() >= 48 && buf[0] & 0x3f == 0x20,
        "no NOP-In before the close ({} bytes)",
        buf.len()
    );
}
