//! Shared by the `mgmt_*` end-to-end tests: a ferrited started from a
//! configuration file (it may have no portal at all, so readiness is the
//! control socket answering), `ferritectl` runs, raw control-socket requests
//! and the project's initiator.
#![allow(dead_code)] // each test binary uses a part

use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use ferrite_iscsi::initiator::{Command as ScsiCmd, Initiator, ScsiResult};
use ferrite_tests::{Ferrited, Login, control_request, ferrited_path, free_port, run_with_timeout};

/// `ferritectl`: `$FERRITECTL`, else next to ferrited.
pub fn ctl_path() -> PathBuf {
    if let Some(p) = std::env::var_os("FERRITECTL") {
        return PathBuf::from(p);
    }
    let p = ferrited_path().with_file_name("ferritectl");
    assert!(
        p.exists(),
        "{} not found: cargo build --release --bin ferritectl (same profile as ferrited) or set FERRITECTL",
        p.display()
    );
    p
}

/// A free loopback portal.
pub fn portal() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], free_port()))
}

/// A ferrited started with `--config FILE` on two cores, stopped when
/// dropped: the harness's [`Ferrited`] plus `ferritectl` runs.
pub struct Daemon {
    f: Ferrited,
    pub socket: PathBuf,
    pub dir: PathBuf,
}

impl Daemon {
    pub fn start(dir: &Path, config: &Path, extra: &[&str]) -> Daemon {
        let mut args = vec!["--cores", "2"];
        args.extend_from_slice(extra);
        let f = Ferrited::start_config(dir, config, &args);
        Daemon {
            socket: f.control(),
            dir: dir.to_path_buf(),
            f,
        }
    }

    pub fn log_text(&self) -> String {
        self.f.log_text()
    }

    /// Runs ferritectl against this daemon; returns its output.
    pub fn ctl(&self, args: &[&str]) -> Output {
        run_with_timeout(
            Command::new(ctl_path())
                .arg("--socket")
                .arg(&self.socket)
                .args(args),
            Duration::from_secs(60),
        )
    }

    /// Runs ferritectl and requires success; returns standard output.
    pub fn ok(&self, args: &[&str]) -> String {
        let o = self.ctl(args);
        assert!(
            o.status.success(),
            "ferritectl {args:?} failed: {}\n--- ferrited log ---\n{}",
            String::from_utf8_lossy(&o.stderr),
            self.log_text()
        );
        String::from_utf8_lossy(&o.stdout).into_owned()
    }

    /// The running configuration as ferritectl prints it.
    pub fn config(&self) -> String {
        self.ok(&["config"])
    }

    /// SIGTERM and wait.
    pub fn stop(&mut self) {
        self.f.stop();
    }
}

/// One request line on the control socket; returns the answer line.
pub fn raw(socket: &Path, line: &str) -> std::io::Result<String> {
    control_request(socket, line)
}

/// Writes a configuration file with no device and no target.
pub fn empty_config(dir: &Path) -> PathBuf {
    let p = dir.join("empty.json");
    std::fs::write(&p, "{}\n").unwrap();
    p
}

/// Logs in as `initiator` to `target` and takes the POWER ON unit attention.
pub fn login(
    addr: SocketAddr,
    initiator: &str,
    target: &str,
    isid_last: u8,
) -> Initiator<TcpStream> {
    let mut i = Login::new(initiator, target)
        .isid([0x80, 0, 0, 0, 0x4d, isid_last])
        .read_timeout(Duration::from_secs(30))
        .connect(addr);
    for _ in 0..4 {
        let r = scsi(&mut i, 0, &[0u8; 6], 0, &[]);
        if r.status == 0 {
            return i;
        }
        assert!(is_ua(&r), "TEST UNIT READY: {r:?}");
    }
    panic!("TEST UNIT READY kept failing");
}

pub fn scsi(
    i: &mut Initiator<TcpStream>,
    lun: u64,
    cdb: &[u8],
    read_len: u32,
    write: &[u8],
) -> ScsiResult {
    i.command(&ScsiCmd {
        lun: lun_field(lun),
        cdb,
        read_len,
        write,
        attr: 1,
        ..ScsiCmd::default()
    })
    .unwrap_or_else(|e| panic!("command {:02x} to LUN {lun}: {e:?}", cdb[0]))
}

/// SAM-5 §4.7.3: the 8-byte LUN field of LUN number `n` as the initiator's
/// `Command::lun` carries it (big-endian): peripheral addressing below 256,
/// flat space addressing above.
pub fn lun_field(n: u64) -> u64 {
    if n < 256 { n << 48 } else { (0x4000 | n) << 48 }
}

/// SAM-5 §5.14: CHECK CONDITION with sense key UNIT ATTENTION (6h).
pub fn is_ua(r: &ScsiResult) -> bool {
    r.status == 2 && r.sense.get(2).map(|k| k & 0x0f) == Some(6)
}

/// (ASC, ASCQ) of fixed-format sense data.
pub fn asc(r: &ScsiResult) -> (u8, u8) {
    (
        r.sense.get(12).copied().unwrap_or(0),
        r.sense.get(13).copied().unwrap_or(0),
    )
}

/// SPC-4 §6.29: REPORT LUNS, the LUN numbers (single level, peripheral).
pub fn report_luns(i: &mut Initiator<TcpStream>) -> Vec<u64> {
    let mut cdb = [0u8; 12];
    cdb[0] = 0xa0;
    cdb[6..10].copy_from_slice(&4096u32.to_be_bytes());
    let mut r = scsi(i, 0, &cdb, 4096, &[]);
    for _ in 0..4 {
        if !is_ua(&r) {
            break;
        }
        r = scsi(i, 0, &cdb, 4096, &[]);
    }
    assert_eq!(r.status, 0, "REPORT LUNS: {r:?}");
    let len = u32::from_be_bytes(r.data[0..4].try_into().unwrap()) as usize;
    r.data[8..8 + len]
        .chunks(8)
        .map(|e| u64::from(u16::from_be_bytes([e[0] & 0x3f, e[1]])))
        .collect()
}

/// `iscsi-ls -s` as `initiator`: the LUN numbers listed for `target`.
pub fn iscsi_ls_luns(addr: SocketAddr, initiator: &str, target: &str) -> Vec<u64> {
    ferrite_tests::require_tool("iscsi-ls", "libiscsi-bin");
    let o = run_with_timeout(
        Command::new("iscsi-ls")
            .arg("-i")
            .arg(initiator)
            .arg("-s")
            .arg(format!("iscsi://{addr}")),
        Duration::from_secs(60),
    );
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(
        o.status.success(),
        "iscsi-ls -i {initiator}: {out}{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let mut luns = Vec::new();
    let mut in_target = false;
    for line in out.lines() {
        if let Some(rest) = line.strip_prefix("Target:") {
            in_target = rest.split_whitespace().next() == Some(target);
        } else if in_target && let Some(rest) = line.trim().strip_prefix("Lun:") {
            let n = rest.split_whitespace().next().unwrap_or("");
            luns.push(
                n.parse()
                    .unwrap_or_else(|_| panic!("iscsi-ls line {line:?}")),
            );
        }
    }
    luns
}
