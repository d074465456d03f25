//! Session reinstatement (RFC 7143 §6.3.5): while a session has writes in
//! flight, a new login with the same initiator name and ISID (TSIH 0)
//! replaces it: the old connection is closed by the target, the new session
//! gets a different TSIH and serves I/O, and only one session is listed.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed step is a failed test

use std::net::TcpStream;
use std::process::Command as Proc;
use std::time::{Duration, Instant};

use ferrite_iscsi::initiator::{Command, Initiator, InitiatorError};
use ferrite_tests::{Ferrited, Login, ferrited_path, run_with_timeout};

const IQN: &str = "iqn.2026-11.org.ferrite:default";
const INI: &str = "iqn.2026-11.org.ferrite.test:reinstate";

fn login() -> Login {
    Login::new(INI, IQN)
        .isid([0x80, 0x12, 0x34, 0x56, 0x78, 0x9a])
        .read_timeout(Duration::from_secs(20))
}

fn rw10(op: u8, lba: u32, blocks: u16) -> [u8; 10] {
    let mut c = [0u8; 10];
    c[0] = op;
    c[2..6].copy_from_slice(&lba.to_be_bytes());
    c[7..9].copy_from_slice(&blocks.to_be_bytes());
    c
}

fn sessions(f: &Ferrited) -> String {
    let out = run_with_timeout(
        Proc::new(ferrited_path().with_file_name("ferritectl"))
            .arg("--socket")
            .arg(f.control())
            .arg("sessions"),
        Duration::from_secs(30),
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn io_works(i: &mut Initiator<TcpStream>) {
    let data = vec![0x5au8; 8192];
    for _ in 0..3 {
        let r = i
            .command(&Command {
                cdb: &rw10(0x2a, 4096, 16),
                write: &data,
                attr: 1,
                ..Command::default()
            })
            .expect("WRITE on the new session");
        if r.status == 0 {
            let r = i
                .command(&Command {
                    cdb: &rw10(0x28, 4096, 16),
                    read_len: 8192,
                    attr: 1,
                    ..Command::default()
                })
                .expect("READ on the new session");
            assert_eq!(r.status, 0, "{r:?}");
            assert_eq!(r.data, data);
            return;
        }
        // The new nexus' unit attention, retried.
        assert_eq!(r.status, 2, "{r:?}");
    }
    panic!("the new session cannot write");
}

#[test]
fn same_isid_and_name_replace_a_busy_session() {
    let dir = tempfile::tempdir().unwrap();
    let f = Ferrited::start_default(dir.path());
    let mut old = login().connect(f.addr);
    let old_tsih = old.tsih;
    assert_ne!(old_tsih, 0);
    // 32 writes in flight on the old session, not waited for.
    let data = vec![0xc3u8; 64 * 1024];
    for k in 0..32u32 {
        let itt = old.new_itt();
        let (p, _) = old.command_pdu(
            itt,
            &Command {
                cdb: &rw10(0x2a, k * 128, 128),
                write: &data,
                attr: 1,
                ..Command::default()
            },
        );
        old.send_pdu(&p).unwrap();
    }

    let mut new = login().connect(f.addr);
    assert_ne!(new.tsih, 0);
    assert_ne!(new.tsih, old_tsih, "RFC 7143 §6.3.5: a new TSIH");

    // The target closes the old connection.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match old.recv_pdu() {
            Err(InitiatorError::Closed) => break,
            Err(InitiatorError::Io(e)) if e.kind() != std::io::ErrorKind::WouldBlock => break,
            _ => {}
        }
        assert!(
            Instant::now() < deadline,
            "old connection still open after the reinstatement:\n{}",
            f.log_text()
        );
    }
    io_works(&mut new);
    let list = sessions(&f);
    assert_eq!(
        list.matches(INI).count(),
        1,
        "exactly one session of the initiator after reinstatement:\n{list}"
    );
    let log = f.wait_log("reinstatement", 1);
    assert!(log.contains("reinstatement"), "{log}");
}
