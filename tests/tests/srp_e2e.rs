//! SRP end to end against a real ferrited: the project's SRP initiator over
//! the soft RDMA provider (a Unix socket), beside the iSCSI initiator on the
//! same LUN. Also the start-up line of a machine without an HCA, and of one
//! without rdma-core.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed step is a failed test

mod srp_util;

use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use ferrite_iscsi::initiator::{Command as IscsiCmd, Initiator as IscsiIni};
use ferrite_scsi::Lun;
use ferrite_srp::initiator::{Completed, InitError, InitiatorConfig, Layout};
use ferrite_srp::iu::{self, RspCode, TskFunc};
use ferrite_tests::{
    Config, Device, Ferrited, Group, Login, Options, SrpTarget, Target, ferrited_command, free_port,
};
use serde_json::{Value, json};
use srp_util::{
    Srp, clear_ua, clear_ua_on, login_soft, pattern, port_id_of, report_luns, rw, try_login_soft,
};

const IQN: &str = "iqn.2026-11.org.ferrite:srp-e2e";
const PORT_ID: &str = "0x66657272697465207372702070307430";
const BS: usize = 512;
const DISK: u64 = 64 << 20;

struct Rig {
    f: Ferrited,
    sock: PathBuf,
    img: PathBuf,
    _dir: tempfile::TempDir,
}

/// ferrited with one file-backed disk behind an iSCSI target and an SRP
/// soft port; `fault` is an optional fault section for the device.
fn rig(fault: Option<&str>) -> Rig {
    let dir = tempfile::Builder::new()
        .prefix("fsrp")
        .tempdir_in("/tmp")
        .unwrap();
    let img = dir.path().join("disk0.img");
    let sock = dir.path().join("srp.sock");
    let port = free_port();
    let mut disk = Device::fileio("disk0", &img, DISK);
    if let Some(f) = fault {
        disk = disk.set(
            "fault",
            serde_json::from_str::<Value>(f).expect("fault JSON"),
        );
    }
    let cfg_path = Config::new()
        .device(disk)
        .target(
            Target::new(IQN)
                .portal(format!("127.0.0.1:{port}"))
                .lun(0, "disk0"),
        )
        .srp_target(SrpTarget::soft("srp0", PORT_ID, &sock).lun(0, "disk0"))
        .write(dir.path().join("ferrite.json"));
    let f = Ferrited::start(
        dir.path(),
        port,
        Options {
            config: Some(cfg_path),
            args: vec!["--cores".into(), "2".into()],
        },
    );
    Rig {
        f,
        sock,
        img,
        _dir: dir,
    }
}

/// An SRP initiator and the soft device it lives on.
/// Initiator port `[ini_id; 16]` to the test port.
fn srp_cfg(ini_id: u8) -> InitiatorConfig {
    InitiatorConfig {
        initiator_port_id: [ini_id; 16],
        target_port_id: port_id_of(PORT_ID),
        recv_count: 160,
        ..InitiatorConfig::default()
    }
}

fn srp_login(sock: &Path, ini_id: u8) -> Srp {
    login_soft(sock, srp_cfg(ini_id))
}

fn iscsi_login(f: &Ferrited) -> IscsiIni<TcpStream> {
    let mut i = Login::to(IQN)
        .read_timeout(Duration::from_secs(30))
        .connect(f.addr);
    for _ in 0..8 {
        let r = i
            .command(&IscsiCmd {
                cdb: &[0u8; 6],
                attr: 1,
                ..IscsiCmd::default()
            })
            .unwrap();
        if r.status == 0 {
            return i;
        }
    }
    panic!("iSCSI unit attentions never cleared");
}

fn rw10(op: u8, lba: u32, blocks: u16) -> Vec<u8> {
    let mut c = vec![0u8; 10];
    c[0] = op;
    c[2..6].copy_from_slice(&lba.to_be_bytes());
    c[7..9].copy_from_slice(&blocks.to_be_bytes());
    c
}

#[test]
fn no_hca_is_logged_once_and_iscsi_still_serves() {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("d.img");
    let port = free_port();
    // A verbs SRP port on a machine without an HCA: configured, idle.
    let cfg_path = Config::new()
        .device(Device::fileio("d", &img, 1048576))
        .target(
            Target::new(IQN)
                .portal(format!("127.0.0.1:{port}"))
                .lun(0, "d"),
        )
        .srp_target(
            SrpTarget::on(
                "hca0",
                json!({"kind": "verbs", "port": 1, "listen": "127.0.0.1:0"}),
            )
            .lun(0, "d"),
        )
        .write(dir.path().join("ferrite.json"));
    let f = Ferrited::start(
        dir.path(),
        port,
        Options {
            config: Some(cfg_path),
            args: Vec::new(),
        },
    );
    let mut i = iscsi_login(&f);
    let r = i
        .command(&IscsiCmd {
            cdb: &[0x12, 0, 0, 0, 36, 0],
            read_len: 36,
            attr: 1,
            ..IscsiCmd::default()
        })
        .unwrap();
    assert_eq!(r.status, 0);
    assert_eq!(r.data.len(), 36);
    let log = f.log_text();
    let has_hca = Path::new("/sys/class/infiniband")
        .read_dir()
        .is_ok_and(|mut d| d.next().is_some());
    if has_hca {
        eprintln!("this machine has an RDMA device; the idle line is not expected");
        return;
    }
    // Without rdma-core the one idle line names the missing library instead
    // (the test below hides rdma-core where it is installed).
    let why = match ferrite_rdma::verbs::devices() {
        Err(ferrite_rdma::RdmaError::LibraryMissing { .. }) => "RDMA fabrics idle: lib",
        _ => "RDMA fabrics idle: no RDMA device found",
    };
    assert_eq!(log.matches("RDMA fabrics idle").count(), 1, "{log}");
    assert_eq!(log.matches(why).count(), 1, "{log}");
}

/// ferrited on a host without rdma-core: it starts, says once that the RDMA
/// fabrics are idle because libibverbs.so.1 is missing, and serves iSCSI.
/// Where rdma-core is installed, its two libraries are hidden behind empty
/// files in a private mount namespace (`unshare -m`, which needs root: the
/// test skips with a message without it).
#[test]
fn without_rdma_core_the_idle_line_names_the_library_and_iscsi_still_serves() {
    let dirs = [
        "/usr/lib/x86_64-linux-gnu",
        "/usr/lib/aarch64-linux-gnu",
        "/usr/lib64",
        "/usr/lib",
    ];
    let installed: Vec<PathBuf> = dirs
        .iter()
        .flat_map(|d| ["libibverbs.so.1", "librdmacm.so.1"].map(|l| Path::new(d).join(l)))
        .filter(|p| p.exists())
        .collect();
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let ferrited = ferrited_command(dir.path());
    let mut cmd = if installed.is_empty() {
        ferrited
    } else {
        let empty = dir.path().join("empty");
        std::fs::write(&empty, b"").unwrap();
        let mut hide = String::from("set -e\n");
        for lib in &installed {
            hide.push_str(&format!(
                "mount --bind '{}' '{}'\n",
                empty.display(),
                lib.display()
            ));
        }
        let probe = std::process::Command::new("unshare")
            .args(["-m", "sh", "-c", &hide])
            .stderr(std::process::Stdio::null())
            .status();
        if !probe.is_ok_and(|s| s.success()) {
            eprintln!(
                "rdma-core is installed and cannot be hidden (unshare -m needs root): skipped"
            );
            return;
        }
        hide.push_str("exec \"$@\"\n");
        // ferrited's own command line, run inside the namespace.
        let mut c = std::process::Command::new("unshare");
        c.args(["-m", "sh", "-c", &hide, "sh"])
            .arg(ferrited.get_program())
            .args(ferrited.get_args());
        for (k, v) in ferrited.get_envs() {
            match v {
                Some(v) => c.env(k, v),
                None => c.env_remove(k),
            };
        }
        c
    };
    cmd.arg("--listen")
        .arg(format!("127.0.0.1:{port}"))
        .env("RUST_LOG", "info");
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let mut f = Ferrited::spawn(cmd, dir.path(), addr);
    let deadline = Instant::now() + Duration::from_secs(60);
    while !f.log_text().contains("ferrited running") {
        if let Some(st) = f.try_wait() {
            panic!("ferrited exited with {st}:\n{}", f.log_text());
        }
        assert!(
            Instant::now() < deadline,
            "ferrited did not start:\n{}",
            f.log_text()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let mut i = Login::to("iqn.2026-11.org.ferrite:default")
        .read_timeout(Duration::from_secs(30))
        .connect(addr);
    let r = i
        .command(&IscsiCmd {
            cdb: &[0x12, 0, 0, 0, 36, 0],
            read_len: 36,
            attr: 1,
            ..IscsiCmd::default()
        })
        .unwrap();
    assert_eq!(r.status, 0);
    assert_eq!(&r.data[8..15], b"FERRITE");
    drop(i);
    f.kill();
    let log = f.log_text();
    assert_eq!(log.matches("RDMA fabrics idle").count(), 1, "{log}");
    assert_eq!(
        log.matches(
            "RDMA fabrics idle: libibverbs.so.1 not found (install rdma-core / libibverbs1 and librdmacm1)"
        )
        .count(),
        1,
        "{log}"
    );
}

#[test]
fn reads_and_writes_verify_with_direct_and_indirect_descriptors() {
    let r = rig(None);
    let mut s = srp_login(&r.sock, 1);
    assert_eq!(s.ini.login_rsp.req_lim_delta, 128);
    clear_ua(&mut s.ini);
    let layouts = [
        Layout {
            segments: 1,
            inline_max: 16,
        }, // direct descriptor
        Layout {
            segments: 4,
            inline_max: 16,
        }, // indirect, all in the SRP_CMD
        Layout {
            segments: 8,
            inline_max: 2,
        }, // indirect, table fetched by RDMA READ
    ];
    let mut lba = 0u64;
    for (k, layout) in layouts.iter().enumerate() {
        for size in [4usize << 10, 64 << 10, 256 << 10, 1 << 20] {
            let blocks = (size / BS) as u32;
            let data = pattern((k * 7 + size) as u32, size);
            let w = s
                .ini
                .command(Lun(0), &rw(0x8a, lba, blocks), Some(&data), 0, *layout)
                .unwrap();
            assert_eq!(w.rsp.status, 0, "write {size} {layout:?}: {:?}", w.rsp);
            let rd = s
                .ini
                .command(Lun(0), &rw(0x88, lba, blocks), None, size as u32, *layout)
                .unwrap();
            assert_eq!(rd.rsp.status, 0);
            assert!(
                rd.data == data,
                "read back differs: {size} bytes, {layout:?}"
            );
            lba += blocks as u64;
        }
    }
    s.ini.logout().unwrap();
    // The data reached the disk image, not only a cache in front of it.
    drop(r.f);
    let img = std::fs::read(&r.img).unwrap();
    let first = pattern(4096, 4096);
    assert_eq!(&img[..4096], &first[..]);
}

#[test]
fn queue_depth_128_never_overruns_credits() {
    let r = rig(None);
    let mut s = srp_login(&r.sock, 2);
    clear_ua(&mut s.ini);
    let credits = s.ini.credits();
    assert_eq!(credits, 128);
    let mut tags = std::collections::VecDeque::new();
    let mut done = 0;
    let mut max_out = 0;
    for n in 0..1024u32 {
        let lba = u64::from(n % 512) * 8;
        let tag = if n % 2 == 0 {
            s.ini.submit(
                Lun(0),
                &rw(0x8a, lba, 8),
                Some(&pattern(n, 4096)),
                0,
                Layout::default(),
                iu::TASK_ATTR_SIMPLE,
            )
        } else {
            s.ini.submit(
                Lun(0),
                &rw(0x88, lba, 8),
                None,
                4096,
                Layout::default(),
                iu::TASK_ATTR_SIMPLE,
            )
        }
        .unwrap();
        tags.push_back(tag);
        max_out = max_out.max(s.ini.outstanding());
        if tags.len() >= 128 {
            let t = tags.pop_front().unwrap();
            let c = s.ini.wait(t).unwrap();
            assert_eq!(c.rsp.status, 0, "{:?}", c.rsp);
            done += 1;
        }
    }
    while let Some(t) = tags.pop_front() {
        assert_eq!(s.ini.wait(t).unwrap().rsp.status, 0);
        done += 1;
    }
    assert_eq!(done, 1024);
    assert_eq!(max_out, 128, "queue depth 128 was reached");
    assert!(s.ini.credits() <= 128, "credits returned above the grant");
    assert!(s.ini.closed().is_none(), "channel closed: credit overrun?");
    let log = r.f.log_text();
    assert!(!log.contains("overrun"), "{log}");
    // SIGTERM with the channel still logged in: the target logs it out
    // (SRP_T_LOGOUT) and exits by itself.
    let mut r = r;
    assert!(r.f.stop(), "ferrited did not stop with an SRP channel open");
    let deadline = Instant::now() + Duration::from_secs(5);
    while s.ini.closed().is_none() && Instant::now() < deadline {
        let _ = s.ini.progress(Instant::now() + Duration::from_millis(50));
    }
    assert!(s.ini.closed().is_some(), "no target logout seen");
}

/// Writes to LBAs 8192.. are held 1.5 s by the device's fault rule, so they
/// are in flight when task management arrives.
const SLOW: &str = r#"{"rules": [{"op": "write", "lba": 8192, "blocks": 1024, "delay_ms": 1500}]}"#;

/// Four 4 KiB writes of pattern `seed` into the slow range, left in flight:
/// their tags.
fn slow_writes(ini: &mut ferrite_srp::initiator::Initiator, seed: u32) -> Vec<u64> {
    (0..4u64)
        .map(|k| {
            ini.submit(
                Lun(0),
                &rw(0x8a, 8192 + k * 8, 8),
                Some(&pattern(seed, 4096)),
                0,
                Layout::default(),
                iu::TASK_ATTR_SIMPLE,
            )
            .unwrap()
        })
        .collect()
}

#[test]
fn abort_task_and_lun_reset_with_commands_in_flight() {
    let r = rig(Some(SLOW));
    let mut s = srp_login(&r.sock, 3);
    clear_ua(&mut s.ini);
    // ABORT TASK of one slow write.
    let victim = s
        .ini
        .submit(
            Lun(0),
            &rw(0x8a, 8192, 8),
            Some(&pattern(1, 4096)),
            0,
            Layout::default(),
            iu::TASK_ATTR_SIMPLE,
        )
        .unwrap();
    std::thread::sleep(Duration::from_millis(200));
    let rsp = s
        .ini
        .task_mgmt(Lun(0), TskFunc::ABORT_TASK, victim)
        .unwrap();
    let code = rsp.resp_data.get(3).copied();
    assert!(
        code == Some(RspCode::COMPLETE.0) || code == Some(RspCode::SUCCEEDED.0),
        "ABORT TASK: {rsp:?}"
    );
    // SAM-5 §7.2: an aborted command gets no response on its nexus.
    assert!(!s.ini.has_response(victim));
    // LUN RESET with several in flight.
    let slow = slow_writes(&mut s.ini, 2);
    std::thread::sleep(Duration::from_millis(200));
    let rsp = s.ini.task_mgmt(Lun(0), TskFunc::LUN_RESET, 0).unwrap();
    let code = rsp.resp_data.get(3).copied();
    assert!(
        code == Some(RspCode::COMPLETE.0) || code == Some(RspCode::SUCCEEDED.0),
        "LUN RESET: {rsp:?}"
    );
    for t in &slow {
        assert!(!s.ini.has_response(*t), "a reset command answered");
    }
    // The channel goes on: the reset raised a unit attention, then I/O works.
    clear_ua(&mut s.ini);
    let c = s
        .ini
        .command(Lun(0), &rw(0x88, 0, 8), None, 4096, Layout::default())
        .unwrap();
    assert_eq!(c.rsp.status, 0);
    assert!(s.ini.closed().is_none());
}

/// The core each SRP nexus of the port runs on, from `ferritectl sessions`
/// (its channels read "soft core N qpn ..."), by initiator id byte.
fn srp_cores(f: &Ferrited, ids: &[u8]) -> Vec<Option<usize>> {
    let out = f.ctl(&["sessions"]);
    ids.iter()
        .map(|id| {
            let hex = format!("0x{}", format!("{id:02x}").repeat(16));
            let line = out
                .lines()
                .find(|l| l.starts_with("srp ") && l.contains(&hex))?;
            let at = line.find("core ")? + 5;
            line[at..]
                .split(|c: char| !c.is_ascii_digit())
                .next()?
                .parse()
                .ok()
        })
        .collect()
}

/// SAM-5 §6.3.3: a LOGICAL UNIT RESET over SRP covers every nexus of the
/// logical unit on every core: writes another nexus has in flight on the
/// other core are aborted (never answered), that nexus sees BUS DEVICE
/// RESET FUNCTION OCCURRED, and the TMF response waits until those writes
/// have left the device.
#[test]
fn lun_reset_over_srp_drains_every_core() {
    let r = rig(Some(SLOW));
    let mut a = srp_login(&r.sock, 0x21);
    clear_ua(&mut a.ini);
    // Nexuses are dealt to the cores in turn: log in until one runs on a
    // core other than A's.
    let mut others = Vec::new();
    let mut b = None;
    for id in 0x22..0x26u8 {
        let mut s = srp_login(&r.sock, id);
        clear_ua(&mut s.ini);
        let deadline = Instant::now() + Duration::from_secs(10);
        let cores = loop {
            let c = srp_cores(&r.f, &[0x21, id]);
            if c.iter().all(Option::is_some) || Instant::now() > deadline {
                break c;
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        assert!(
            cores.iter().all(Option::is_some),
            "cores of nexuses: {cores:?}"
        );
        if cores[0] != cores[1] {
            b = Some(s);
            break;
        }
        others.push(s);
    }
    let mut b = b.expect("two cores: a nexus on each");
    let start = Instant::now();
    let slow = slow_writes(&mut b.ini, 7);
    std::thread::sleep(Duration::from_millis(200));
    let rsp = a.ini.task_mgmt(Lun(0), TskFunc::LUN_RESET, 0).unwrap();
    let took = start.elapsed();
    assert_eq!(
        rsp.resp_data.get(3).copied(),
        Some(RspCode::COMPLETE.0),
        "{rsp:?}"
    );
    // The device holds each write 1.5 s: the response came after them.
    assert!(
        took >= Duration::from_millis(1400),
        "answered after {took:?}"
    );
    // Aborted on B's core: no response ever.
    std::thread::sleep(Duration::from_millis(300));
    for t in &slow {
        assert!(!b.ini.has_response(*t), "a write of the reset LU answered");
    }
    let c = b
        .ini
        .command(Lun(0), &[0u8; 6], None, 0, Layout::default())
        .unwrap();
    assert_eq!(c.rsp.status, 2, "{:?}", c.rsp);
    assert_eq!(
        c.rsp.sense.get(2).map(|k| k & 0x0f),
        Some(0x06),
        "{:?}",
        c.rsp
    );
    assert_eq!(
        c.rsp.sense.get(12..14),
        Some(&[0x29, 0x03][..]),
        "{:?}",
        c.rsp
    );
    // Both nexuses go on.
    clear_ua(&mut a.ini);
    clear_ua(&mut b.ini);
    for s in [&mut a, &mut b] {
        let c = s
            .ini
            .command(Lun(0), &rw(0x88, 0, 8), None, 4096, Layout::default())
            .unwrap();
        assert_eq!(c.rsp.status, 0);
        assert!(s.ini.closed().is_none());
    }
    drop(others);
}

#[test]
fn resize_sends_an_aer_and_logout_reconnect_works() {
    let r = rig(None);
    let mut s = srp_login(&r.sock, 4);
    clear_ua(&mut s.ini);
    r.f.ctl(&["set", "/devices/disk0/size", &(DISK * 2).to_string()]);
    let deadline = Instant::now() + Duration::from_secs(10);
    while s.ini.aens.is_empty() && Instant::now() < deadline {
        let _ = s.ini.progress(Instant::now() + Duration::from_millis(100));
    }
    let aer = s.ini.aens.first().expect("no SRP_AER_REQ after the resize");
    // SBC-4 §4.10: CAPACITY DATA HAS CHANGED (2Ah/09h), UNIT ATTENTION.
    assert_eq!(aer.sense.get(2).map(|k| k & 0x0f), Some(0x06), "{aer:?}");
    assert_eq!(aer.sense.get(12..14), Some(&[0x2a, 0x09][..]), "{aer:?}");
    // The new capacity is visible.
    let rc = s.ini.command(
        Lun(0),
        &[0x25, 0, 0, 0, 0, 0, 0, 0, 0, 0],
        None,
        8,
        Layout::default(),
    );
    let mut rc = rc.unwrap();
    if rc.rsp.status != 0 {
        rc = s
            .ini
            .command(
                Lun(0),
                &[0x25, 0, 0, 0, 0, 0, 0, 0, 0, 0],
                None,
                8,
                Layout::default(),
            )
            .unwrap();
    }
    assert_eq!(rc.rsp.status, 0);
    let last = u32::from_be_bytes(rc.data[0..4].try_into().unwrap());
    assert_eq!(u64::from(last) + 1, DISK * 2 / BS as u64);
    // Logout, then the same initiator port logs in again and works.
    let data = pattern(9, 8192);
    let w = s
        .ini
        .command(
            Lun(0),
            &rw10(0x2a, 100, 16),
            Some(&data),
            0,
            Layout::default(),
        )
        .unwrap();
    assert_eq!(w.rsp.status, 0);
    s.ini.logout().unwrap();
    for _ in 0..3 {
        let mut s2 = srp_login(&r.sock, 4);
        clear_ua(&mut s2.ini);
        let rd = s2
            .ini
            .command(Lun(0), &rw10(0x28, 100, 16), None, 8192, Layout::default())
            .unwrap();
        assert_eq!(rd.rsp.status, 0);
        assert!(rd.data == data);
        s2.ini.logout().unwrap();
    }
}

/// The SCSI answer of a command, fabric-neutral: status, sense, and the data
/// bytes the target transferred.
#[derive(Debug, PartialEq, Eq)]
struct Answer {
    status: u8,
    sense: Vec<u8>,
    /// Data-in of a GOOD command (a failed one carries none).
    data: Vec<u8>,
    residual: u32,
}

fn srp_answer(c: Completed, read_len: u32) -> Answer {
    let residual = if read_len > 0 {
        c.rsp.data_in_res_cnt
    } else {
        c.rsp.data_out_res_cnt
    };
    let mut data = c.data;
    if c.rsp.status == 0 {
        data.truncate(read_len.saturating_sub(residual) as usize);
    } else {
        data.clear();
    }
    Answer {
        status: c.rsp.status,
        sense: c.rsp.sense,
        data,
        residual,
    }
}

/// A conformance case: name, CDB, bytes to read, data to write.
type Case = (&'static str, Vec<u8>, u32, Option<Vec<u8>>);

#[test]
fn scsi_conformance_cases_answer_the_same_over_iscsi_and_srp() {
    let r = rig(None);
    let mut s = srp_login(&r.sock, 5);
    clear_ua(&mut s.ini);
    let mut i = iscsi_login(&r.f);
    let blocks = DISK / BS as u64;
    let block = pattern(77, BS);
    let cases: Vec<Case> = vec![
        ("INQUIRY standard", vec![0x12, 0, 0, 0, 96, 0], 96, None),
        ("INQUIRY VPD 00h", vec![0x12, 1, 0x00, 0, 255, 0], 255, None),
        ("INQUIRY VPD 80h", vec![0x12, 1, 0x80, 0, 255, 0], 255, None),
        ("INQUIRY VPD 86h", vec![0x12, 1, 0x86, 0, 255, 0], 255, None),
        ("INQUIRY VPD B0h", vec![0x12, 1, 0xb0, 0, 255, 0], 255, None),
        ("INQUIRY VPD B1h", vec![0x12, 1, 0xb1, 0, 255, 0], 255, None),
        ("INQUIRY VPD B2h", vec![0x12, 1, 0xb2, 0, 255, 0], 255, None),
        (
            "INQUIRY unknown VPD page",
            vec![0x12, 1, 0x7f, 0, 255, 0],
            255,
            None,
        ),
        (
            "INQUIRY EVPD=0 page code set",
            vec![0x12, 0, 0x80, 0, 255, 0],
            255,
            None,
        ),
        (
            "READ CAPACITY(10)",
            vec![0x25, 0, 0, 0, 0, 0, 0, 0, 0, 0],
            8,
            None,
        ),
        (
            "READ CAPACITY(16)",
            vec![0x9e, 0x10, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 32, 0, 0],
            32,
            None,
        ),
        ("WRITE(10) LBA 7", rw10(0x2a, 7, 1), 0, Some(block.clone())),
        ("READ(10) LBA 7", rw10(0x28, 7, 1), BS as u32, None),
        (
            "WRITE(16) last LBA",
            rw(0x8a, blocks - 1, 1),
            0,
            Some(block.clone()),
        ),
        (
            "READ(16) last LBA",
            rw(0x88, blocks - 1, 1),
            BS as u32,
            None,
        ),
        ("READ(10) zero length", rw10(0x28, 0, 0), 0, None),
        (
            "READ(16) past the end",
            rw(0x88, blocks, 1),
            BS as u32,
            None,
        ),
        (
            "READ(16) straddling the end",
            rw(0x88, blocks - 1, 2),
            2 * BS as u32,
            None,
        ),
        (
            "READ(10) LBA out of range",
            rw10(0x28, blocks as u32, 1),
            BS as u32,
            None,
        ),
        (
            "WRITE(16) past the end",
            rw(0x8a, blocks, 1),
            0,
            Some(block.clone()),
        ),
        ("READ(16) huge LBA", rw(0x88, u64::MAX, 1), BS as u32, None),
        ("invalid opcode", vec![0xff, 0, 0, 0, 0, 0], 0, None),
        ("unassigned opcode 0x02", vec![0x02, 0, 0, 0, 0, 0], 0, None),
        (
            "REPORT LUNS",
            vec![0xa0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0],
            256,
            None,
        ),
        (
            "REPORT LUNS bad select report",
            vec![0xa0, 0, 0x7f, 0, 0, 0, 0, 0, 1, 0, 0, 0],
            256,
            None,
        ),
        (
            "MODE SENSE(6) all pages",
            vec![0x1a, 0, 0x3f, 0, 255, 0],
            255,
            None,
        ),
        (
            "MODE SENSE(10) all pages",
            vec![0x5a, 0, 0x3f, 0, 0, 0, 0, 0x10, 0, 0],
            4096,
            None,
        ),
        (
            "MODE SENSE(6) caching page",
            vec![0x1a, 0, 0x08, 0, 255, 0],
            255,
            None,
        ),
        (
            "MODE SENSE(6) unknown page",
            vec![0x1a, 0, 0x2e, 0, 255, 0],
            255,
            None,
        ),
        ("TEST UNIT READY", vec![0, 0, 0, 0, 0, 0], 0, None),
        ("REQUEST SENSE", vec![0x03, 0, 0, 0, 252, 0], 252, None),
    ];
    let mut compared = 0;
    for (name, cdb, read_len, write) in &cases {
        let ia = {
            let res = i
                .command(&IscsiCmd {
                    cdb,
                    read_len: *read_len,
                    write: write.as_deref().unwrap_or(&[]),
                    attr: 1,
                    ..IscsiCmd::default()
                })
                .unwrap_or_else(|e| panic!("{name} over iSCSI: {e:?}"));
            Answer {
                status: res.status,
                sense: res.sense,
                data: if res.status == 0 {
                    res.data
                } else {
                    Vec::new()
                },
                residual: res.residual,
            }
        };
        let sa = srp_answer(
            s.ini
                .command(Lun(0), cdb, write.as_deref(), *read_len, Layout::default())
                .unwrap_or_else(|e| panic!("{name} over SRP: {e}")),
            *read_len,
        );
        assert_eq!(ia, sa, "{name}: iSCSI and SRP answers differ");
        compared += 1;
    }
    assert_eq!(compared, cases.len());
    // VPD 83h names the target port, which differs by design (SPC-4 §7.8.6:
    // relative target port and target port designators); the logical unit
    // designators are the same.
    let cdb = [0x12, 1, 0x83, 0, 255, 0];
    let ia = i
        .command(&IscsiCmd {
            cdb: &cdb,
            read_len: 255,
            attr: 1,
            ..IscsiCmd::default()
        })
        .unwrap();
    let sa = srp_answer(
        s.ini
            .command(Lun(0), &cdb, None, 255, Layout::default())
            .unwrap(),
        255,
    );
    assert_eq!((ia.status, sa.status), (0, 0));
    let lu_ids = |d: &[u8]| -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        let mut p = 4;
        while p + 4 <= d.len() {
            let len = d[p + 3] as usize;
            // ASSOCIATION (byte 1 bits 5:4) 00b: the logical unit.
            if (d[p + 1] >> 4) & 3 == 0 {
                out.push(d[p..(p + 4 + len).min(d.len())].to_vec());
            }
            p += 4 + len;
        }
        out
    };
    assert!(!lu_ids(&ia.data).is_empty());
    assert_eq!(lu_ids(&ia.data), lu_ids(&sa.data));
}

#[test]
fn bad_rkey_fails_the_channel_and_spares_another() {
    let r = rig(None);
    let mut good = srp_login(&r.sock, 6);
    clear_ua(&mut good.ini);
    let mut bad = srp_login(&r.sock, 7);
    clear_ua(&mut bad.ini);
    // A WRITE whose data-out descriptor names memory under an rkey that
    // the initiator never registered.
    let tag = bad
        .ini
        .submit_raw(|tag| {
            iu::CmdBuilder {
                tag,
                lun: Lun(0).encode(),
                task_attr: iu::TASK_ATTR_SIMPLE,
                cdb: &rw10(0x2a, 50, 8),
                data_out: &[ferrite_rdma::RemoteSeg {
                    addr: 0x1000,
                    rkey: 0xdead_beef,
                    len: 4096,
                }],
                data_in: &[],
                out_table: None,
                in_table: None,
                inline_max: 16,
            }
            .encode()
        })
        .unwrap();
    // The remote access error breaks the queue pair, as on hardware: the
    // command fails and the channel is closed.
    // The initiator learns it from its own queue pair (flushed receives),
    // never from an SRP_RSP claiming success, and not by running out of
    // time (InitError::Timeout).
    match bad.ini.wait(tag) {
        Err(InitError::Closed(_)) | Err(InitError::Completion(_)) => {}
        Ok(c) => panic!("a response arrived over a broken queue pair: {:?}", c.rsp),
        Err(e) => panic!("unexpected: {e}"),
    }
    let again = bad
        .ini
        .command(Lun(0), &[0u8; 6], None, 0, Layout::default());
    assert!(again.is_err(), "the channel with the bad rkey still works");
    // Nothing reached the disk for it (LBA 50 still zero) and the other
    // channel is unaffected.
    let rd = good
        .ini
        .command(Lun(0), &rw10(0x28, 50, 8), None, 4096, Layout::default())
        .unwrap();
    assert_eq!(rd.rsp.status, 0);
    assert!(rd.data.iter().all(|b| *b == 0));
    let data = pattern(3, 4096);
    let w = good
        .ini
        .command(
            Lun(0),
            &rw10(0x2a, 60, 8),
            Some(&data),
            0,
            Layout::default(),
        )
        .unwrap();
    assert_eq!(w.rsp.status, 0);
    assert!(good.ini.closed().is_none());
    // The target saw the remote access error on its RDMA READ.
    let deadline = Instant::now() + Duration::from_secs(5);
    while !r
        .f
        .log_text()
        .contains("status=RemAccessErr opcode=RdmaRead")
    {
        assert!(Instant::now() < deadline, "{}", r.f.log_text());
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn dropped_connection_mid_transfer_frees_everything_and_acks_nothing() {
    let r = rig(None);
    let mut s = srp_login(&r.sock, 8);
    clear_ua(&mut s.ini);
    // Many 1 MiB writes in flight, then the initiator vanishes (its queue
    // pair is dropped: a disconnect with no logout).
    let mut tags = Vec::new();
    for k in 0..16u64 {
        tags.push(
            s.ini
                .submit(
                    Lun(0),
                    &rw(0x8a, k * 2048, 2048),
                    Some(&pattern(k as u32 + 100, 1 << 20)),
                    0,
                    Layout {
                        segments: 8,
                        inline_max: 2,
                    },
                    iu::TASK_ATTR_SIMPLE,
                )
                .unwrap(),
        );
    }
    // Transfers are under way once the first write is answered; eight more
    // 1 MiB writes just sent are certainly in flight at the drop.
    assert_eq!(s.ini.wait(tags[0]).unwrap().rsp.status, 0);
    for k in 16..24u64 {
        tags.push(
            s.ini
                .submit(
                    Lun(0),
                    &rw(0x8a, k * 2048, 2048),
                    Some(&pattern(k as u32 + 100, 1 << 20)),
                    0,
                    Layout {
                        segments: 8,
                        inline_max: 2,
                    },
                    iu::TASK_ATTR_SIMPLE,
                )
                .unwrap(),
        );
    }
    let mut acked: Vec<u64> = vec![tags[0]];
    acked.extend(tags[1..].iter().copied().filter(|t| s.ini.has_response(*t)));
    assert!(
        acked.len() < tags.len(),
        "everything finished before the drop"
    );
    drop(s);
    // The daemon logs the channel closed and goes on serving new channels
    // many times over (a leak of pool buffers per dropped channel would run
    // the pool dry).
    let deadline = Instant::now() + Duration::from_secs(20);
    while !r.f.log_text().contains("SRP channel closed") {
        assert!(
            Instant::now() < deadline,
            "channel never closed:\n{}",
            r.f.log_text()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // Drop cycles: 16 MiB in flight each time. The target's resident
    // memory after 4 warm-up cycles and after 16 more must not grow by
    // anything like a cycle's worth per cycle: buffers and registrations of
    // a dropped channel are all freed.
    let drop_cycle = |round: u32| {
        let mut t = srp_login(&r.sock, 9);
        clear_ua(&mut t.ini);
        let mut first = None;
        for k in 0..16u64 {
            let tag = t
                .ini
                .submit(
                    Lun(0),
                    &rw(0x8a, 24 * 2048 + k * 2048, 2048),
                    Some(&pattern(round, 1 << 20)),
                    0,
                    Layout::default(),
                    iu::TASK_ATTR_SIMPLE,
                )
                .unwrap();
            first.get_or_insert(tag);
        }
        // Mid-transfer: the first write is done, the rest are moving.
        if let Some(tag) = first {
            let c = t.ini.wait(tag).unwrap();
            assert_eq!(c.rsp.status, 0, "{:?}", c.rsp);
        }
        drop(t);
    };
    let closed = |f: &Ferrited| f.log_text().matches("SRP channel closed").count();
    let settle = |f: &Ferrited, n: usize| {
        let deadline = Instant::now() + Duration::from_secs(30);
        while closed(f) < n {
            assert!(
                Instant::now() < deadline,
                "channels not closed:\n{}",
                f.log_text()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    let base = closed(&r.f);
    for round in 0..4 {
        drop_cycle(round);
    }
    settle(&r.f, base + 4);
    let rss0 = rss_kib(r.f.pid());
    for round in 4..20 {
        drop_cycle(round);
    }
    settle(&r.f, base + 20);
    let rss1 = rss_kib(r.f.pid());
    eprintln!("ferrited RSS after warm-up {rss0} KiB, after 16 more dropped channels {rss1} KiB");
    assert!(
        rss1 < rss0 + 48 * 1024,
        "ferrited grew from {rss0} KiB to {rss1} KiB over 16 dropped channels"
    );
    let mut t = srp_login(&r.sock, 10);
    clear_ua(&mut t.ini);
    // Every block the dropped channel touched holds either its old data
    // (zeros) or the complete new data of its command, and every
    // acknowledged write is complete.
    for (k, tag) in tags.iter().enumerate() {
        let rd = t
            .ini
            .command(
                Lun(0),
                &rw(0x88, k as u64 * 2048, 2048),
                None,
                1 << 20,
                Layout::default(),
            )
            .unwrap();
        assert_eq!(rd.rsp.status, 0);
        let new = pattern(k as u32 + 100, 1 << 20);
        for (b, chunk) in rd.data.chunks(BS).enumerate() {
            let want = &new[b * BS..(b + 1) * BS];
            assert!(
                chunk == want || chunk.iter().all(|x| *x == 0),
                "block {b} of command {k} is half written"
            );
            if acked.contains(tag) {
                assert_eq!(chunk, want, "acknowledged write {k} incomplete");
            }
        }
    }
    let big = t
        .ini
        .command(Lun(0), &rw(0x88, 0, 2048), None, 1 << 20, Layout::default())
        .unwrap();
    assert_eq!(big.rsp.status, 0);
}

/// Resident set size of a process, KiB.
fn rss_kib(pid: u32) -> u64 {
    let st = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    st.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap()
}

/// One login attempt (no retry) with initiator port id `[ini_id; 16]`.
fn try_srp_login(sock: &Path, ini_id: u8) -> Result<Srp, InitError> {
    try_login_soft(sock, srp_cfg(ini_id))
}

#[test]
fn a_port_with_groups_and_no_default_luns_refuses_initiators_in_no_group() {
    let dir = tempfile::Builder::new()
        .prefix("fsrpg")
        .tempdir_in("/tmp")
        .unwrap();
    let sock = dir.path().join("srp.sock");
    // Initiator ports 0xb2b2... are in group `hosts` (two LUNs); the port
    // has no default LUNs, so 0xa1a1... is in no group and has no access.
    let cfg_path = Config::new()
        .device(Device::mem("d0", 16777216))
        .device(Device::mem("d1", 8388608))
        .srp_target(
            SrpTarget::soft("srp0", PORT_ID, &sock)
                .set("luns", json!([]))
                .group(
                    Group::new("hosts")
                        .initiator("0xb2*")
                        .lun(0, "d0")
                        .lun(1, "d1"),
                ),
        )
        .write(dir.path().join("ferrite.json"));
    let f = Ferrited::start_config(dir.path(), &cfg_path, &["--cores", "2"]);
    let outsider = format!("0x{}", "a1".repeat(16));

    // SRP r16a §6.4: an SRP_LOGIN_REJ, reason 00010000h (unable to
    // establish the channel; SRP has no code for access control), and a
    // log line naming the initiator port and why.
    match try_srp_login(&sock, 0xa1) {
        Err(InitError::LoginRejected(reason)) => {
            assert_eq!(reason, iu::LoginRejReason::UNABLE_TO_ESTABLISH.0)
        }
        Err(e) => panic!("an initiator in no group must get an SRP_LOGIN_REJ: {e}"),
        Ok(_) => panic!("an initiator in no group logged in"),
    }
    let log = f.wait_log("in none of the target port's initiator groups", 1);
    let line = log
        .lines()
        .find(|l| l.contains("SRP login rejected") && l.contains(&outsider))
        .unwrap_or_else(|| panic!("no log line for the refused initiator:\n{log}"));
    assert!(line.contains("reason=0x00010000"), "{line}");
    assert!(
        line.contains("in none of the target port's initiator groups"),
        "{line}"
    );

    // A member logs in and sees its group's LUNs, and reads back what it
    // writes on them.
    let mut m = try_srp_login(&sock, 0xb2).expect("a group member logs in");
    clear_ua(&mut m.ini);
    assert_eq!(report_luns(&mut m.ini), [0, 1]);
    clear_ua(&mut m.ini);
    clear_ua_on(&mut m.ini, 1);
    let data = pattern(9, 8192);
    let blocks = (data.len() / BS) as u32;
    let w = m
        .ini
        .command(
            Lun(1),
            &rw(0x8a, 16, blocks),
            Some(&data),
            0,
            Layout::default(),
        )
        .unwrap();
    assert_eq!(w.rsp.status, 0, "{:?}", w.rsp);
    let rd = m
        .ini
        .command(
            Lun(1),
            &rw(0x88, 16, blocks),
            None,
            data.len() as u32,
            Layout::default(),
        )
        .unwrap();
    assert_eq!(rd.rsp.status, 0, "{:?}", rd.rsp);
    assert!(rd.data == data, "LUN 1 read back differs");
    m.ini.logout().unwrap();

    // With a default LUN the port admits everyone: the outsider gets it.
    f.ctl(&["do", "/targets/srp/srp0/luns/mgmt", "add", "d1", "0"]);
    let mut o = try_srp_login(&sock, 0xa1).expect("with default LUNs every initiator logs in");
    clear_ua(&mut o.ini);
    assert_eq!(report_luns(&mut o.ini), [0]);
    o.ini.logout().unwrap();
}
