//! SRP target ports managed while ferrited runs, the SRP nexuses in the
//! session list, and several RDMA channels per I_T nexus (SRP r16a §6.2
//! MULTI-CHANNEL ACTION), all over the soft provider against a real
//! ferrited driven by ferritectl.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed step is a failed test

mod srp_util;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use ferrite_scsi::Lun;
use ferrite_srp::initiator::{InitError, Initiator, InitiatorConfig, Layout};
use ferrite_srp::iu;
use ferrite_tests::{Config, Device, Ferrited, Options, SrpTarget, Target, free_port};
use srp_util::{Srp, login_soft, try_login_soft};

const IQN: &str = "iqn.2026-11.org.ferrite:srp-mgmt";
const PORT_ID: &str = "0x66657272697465206d676d7420703100";
const BS: usize = 512;

fn port_id() -> [u8; 16] {
    let h = PORT_ID.trim_start_matches("0x");
    let mut out = [0u8; 16];
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(&h[2 * i..2 * i + 2], 16).unwrap();
    }
    out
}

struct Rig {
    f: Ferrited,
    dir: tempfile::TempDir,
}

/// ferrited with two RAM disks behind an iSCSI target and no SRP port.
fn rig() -> Rig {
    rig_with(|_| Vec::new(), &[])
}

/// [`rig`] with the SRP ports `srp` makes from the rig's directory, and
/// more arguments.
fn rig_with(srp: impl FnOnce(&Path) -> Vec<SrpTarget>, args: &[&str]) -> Rig {
    let dir = tempfile::Builder::new()
        .prefix("fsrpm")
        .tempdir_in("/tmp")
        .unwrap();
    let port = free_port();
    let mut cfg = Config::new()
        .device(Device::mem("d0", 16777216))
        .device(Device::mem("d1", 8388608))
        .target(
            Target::new(IQN)
                .portal(format!("127.0.0.1:{port}"))
                .lun(0, "d0"),
        );
    for t in srp(dir.path()) {
        cfg = cfg.srp_target(t);
    }
    let cfg_path = cfg.write(dir.path().join("ferrite.json"));
    let f = Ferrited::start(
        dir.path(),
        port,
        Options {
            config: Some(cfg_path),
            args: ["--cores", "2"]
                .iter()
                .chain(args)
                .map(|a| a.to_string())
                .collect(),
        },
    );
    Rig { f, dir }
}

/// The `srp ...` lines of `ferritectl sessions`.
fn srp_sessions(f: &Ferrited) -> Vec<String> {
    f.ctl(&["sessions"])
        .lines()
        .filter(|l| l.starts_with("srp "))
        .map(str::to_string)
        .collect()
}

/// Polls `ferritectl sessions` until `pred` holds (channels register on
/// their core a moment after the login answer).
fn sessions_until(f: &Ferrited, pred: impl Fn(&[String]) -> bool) -> Vec<String> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let s = srp_sessions(f);
        if pred(&s) || Instant::now() > deadline {
            return s;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn cfg(ini_id: u8, multi: bool, first_tag: u64) -> InitiatorConfig {
    InitiatorConfig {
        initiator_port_id: [ini_id; 16],
        target_port_id: port_id(),
        recv_count: 160,
        multi_channel: multi,
        first_tag,
        ..InitiatorConfig::default()
    }
}

fn try_login(sock: &Path, ini_id: u8, multi: bool, first_tag: u64) -> Result<Srp, InitError> {
    try_login_soft(sock, cfg(ini_id, multi, first_tag))
}

fn login(sock: &Path, ini_id: u8) -> Srp {
    login_soft(sock, cfg(ini_id, false, 0x1000))
}

fn tur(s: &mut Srp) -> u8 {
    s.ini
        .command(Lun(0), &[0u8; 6], None, 0, Layout::default())
        .unwrap()
        .rsp
        .status
}

fn clear_ua(s: &mut Srp, lun: u16) {
    for _ in 0..8 {
        let c = s
            .ini
            .command(Lun(lun), &[0u8; 6], None, 0, Layout::default())
            .unwrap();
        if c.rsp.status == 0 {
            return;
        }
    }
    panic!("unit attentions never cleared");
}

fn rw10(op: u8, lba: u32, blocks: u16) -> Vec<u8> {
    let mut c = vec![0u8; 10];
    c[0] = op;
    c[2..6].copy_from_slice(&lba.to_be_bytes());
    c[7..9].copy_from_slice(&blocks.to_be_bytes());
    c
}

fn pattern(seed: u32, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| ((i as u32).wrapping_mul(2_654_435_761).wrapping_add(seed) >> 13) as u8)
        .collect()
}

fn write(s: &mut Srp, lun: u16, lba: u32, data: &[u8]) {
    let c = s
        .ini
        .command(
            Lun(lun),
            &rw10(0x2a, lba, (data.len() / BS) as u16),
            Some(data),
            0,
            Layout::default(),
        )
        .unwrap();
    assert_eq!(c.rsp.status, 0, "WRITE(10) LUN {lun}");
}

fn read(s: &mut Srp, lun: u16, lba: u32, len: usize) -> Vec<u8> {
    let c = s
        .ini
        .command(
            Lun(lun),
            &rw10(0x28, lba, (len / BS) as u16),
            None,
            len as u32,
            Layout::default(),
        )
        .unwrap();
    assert_eq!(
        c.rsp.status, 0,
        "READ(10) LUN {lun}: sense {:02x?}",
        c.rsp.sense
    );
    c.data
}

/// The LUNs REPORT LUNS lists (after the unit attentions are taken).
fn report_luns(s: &mut Srp) -> Vec<u16> {
    let mut cdb = [0u8; 12];
    cdb[0] = 0xa0;
    cdb[6..10].copy_from_slice(&1024u32.to_be_bytes());
    for _ in 0..8 {
        let c = s
            .ini
            .command(Lun(0), &cdb, None, 1024, Layout::default())
            .unwrap();
        if c.rsp.status != 0 {
            continue;
        }
        let n = u32::from_be_bytes(c.data[0..4].try_into().unwrap()) as usize / 8;
        return (0..n)
            .map(|i| u16::from_be_bytes([c.data[8 + 8 * i] & 0x3f, c.data[9 + 8 * i]]))
            .collect();
    }
    panic!("REPORT LUNS kept failing");
}

/// Lets the initiator take what the target sends on its own (AERs,
/// logouts) until `done` holds or 10 s pass.
fn pump_until(s: &mut Srp, done: impl Fn(&Initiator) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !done(&s.ini) && Instant::now() < deadline {
        let _ = s.ini.progress(Instant::now() + Duration::from_millis(100));
    }
}

/// The body of `GET /metrics`.
fn metrics(addr: &str) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(b"GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n")
        .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

fn hex_id(b: u8) -> String {
    format!("0x{}", format!("{b:02x}").repeat(16))
}

#[test]
fn ports_maps_and_groups_change_while_running() {
    let r = rig();
    let f = &r.f;
    let sock: PathBuf = r.dir.path().join("p1.sock");
    assert!(f.ctl(&["ls", "/targets/srp"]).contains("mgmt"));

    // A port added while running listens at once, disabled.
    f.ctl(&[
        "do",
        "/targets/srp/mgmt",
        "add_target",
        "p1",
        &format!("listen={}", sock.display()),
        &format!("port_id={PORT_ID}"),
    ]);
    assert!(f.ctl(&["ls", "/targets/srp"]).contains("p1/"));
    assert!(sock.exists(), "the new port listens");
    assert_eq!(
        f.ctl(&["get", "/targets/srp/p1/enabled"]).lines().next(),
        Some("0")
    );
    match try_login(&sock, 0xa1, false, 0x1000) {
        Err(InitError::LoginRejected(reason)) => {
            assert_eq!(reason, iu::LoginRejReason::UNABLE_TO_ESTABLISH.0)
        }
        other => panic!("a disabled port must refuse the login: {:?}", other.err()),
    }
    // A second port on the same endpoint is refused by validation.
    let dup = f.ctl_output(&[
        "do",
        "/targets/srp/mgmt",
        "add_target",
        "p2",
        &format!("listen={}", sock.display()),
    ]);
    assert!(!dup.status.success());

    f.ctl(&["set", "/targets/srp/p1/enabled", "1"]);
    f.ctl(&["do", "/targets/srp/p1/luns/mgmt", "add", "d0", "0"]);
    let mut a = login(&sock, 0xa1);
    clear_ua(&mut a, 0);
    let data = pattern(1, 8192);
    write(&mut a, 0, 64, &data);
    assert_eq!(read(&mut a, 0, 64, data.len()), data);
    let s = sessions_until(f, |s| s.len() == 1);
    assert_eq!(s.len(), 1, "{s:?}");
    assert!(
        s[0].starts_with(&format!(
            "srp p1 {} group=- luns=1 channels=1 ",
            hex_id(0xa1)
        )),
        "{s:?}"
    );

    // A LUN added live: SRP_AER_REQ REPORTED LUNS DATA HAS CHANGED, and
    // REPORT LUNS shows it.
    f.ctl(&["do", "/targets/srp/p1/luns/mgmt", "add", "d1", "1"]);
    pump_until(&mut a, |i| !i.aens.is_empty());
    let aer = a
        .ini
        .aens
        .first()
        .expect("no SRP_AER_REQ after a LUN was added");
    // SPC-4: UNIT ATTENTION, REPORTED LUNS DATA HAS CHANGED (3Fh/0Eh).
    assert_eq!(aer.sense.get(2).map(|k| k & 0x0f), Some(0x06), "{aer:?}");
    assert_eq!(aer.sense.get(12..14), Some(&[0x3f, 0x0e][..]), "{aer:?}");
    assert_eq!(report_luns(&mut a), [0, 1]);
    let s = sessions_until(f, |s| s.first().is_some_and(|l| l.contains("luns=2")));
    assert!(s[0].contains("luns=2"), "{s:?}");
    clear_ua(&mut a, 1);
    // REPORT LUNS may leave LUN 0's own unit attention for the next command.
    clear_ua(&mut a, 0);
    let d1 = pattern(2, 4096);
    write(&mut a, 1, 8, &d1);

    // An initiator group: initiator port 0xb2... sees d1 as its LUN 0.
    f.ctl(&["do", "/targets/srp/p1/ini_groups/mgmt", "create", "g"]);
    f.ctl(&[
        "do",
        "/targets/srp/p1/ini_groups/g/initiators/mgmt",
        "add",
        "0xb2*",
    ]);
    f.ctl(&[
        "do",
        "/targets/srp/p1/ini_groups/g/luns/mgmt",
        "add",
        "d1",
        "0",
    ]);
    let mut b = login(&sock, 0xb2);
    clear_ua(&mut b, 0);
    assert_eq!(report_luns(&mut b), [0]);
    assert_eq!(read(&mut b, 0, 8, d1.len()), d1, "group map: LUN 0 is d1");
    let s = sessions_until(f, |s| s.len() == 2);
    assert!(
        s.iter().any(|l| l.starts_with(&format!(
            "srp p1 {} group=g luns=1 channels=1 ",
            hex_id(0xb2)
        ))),
        "{s:?}"
    );
    assert!(
        f.ctl(&["ls", "/targets/srp/p1/sessions"])
            .contains(&hex_id(0xb2)),
        "the tree's sessions view lists SRP nexuses"
    );
    assert_eq!(
        f.ctl(&[
            "get",
            &format!("/targets/srp/p1/sessions/{}/lun_count", hex_id(0xb2))
        ])
        .trim(),
        "1"
    );
    // The group's map changes under a logged-in channel too.
    f.ctl(&[
        "do",
        "/targets/srp/p1/ini_groups/g/luns/mgmt",
        "add",
        "d0",
        "5",
    ]);
    pump_until(&mut b, |i| !i.aens.is_empty());
    assert!(
        !b.ini.aens.is_empty(),
        "no SRP_AER_REQ after the group map changed"
    );
    assert_eq!(report_luns(&mut b), [0, 5]);
    clear_ua(&mut b, 5);
    assert_eq!(read(&mut b, 5, 64, data.len()), data, "LUN 5 is d0");

    // A device an SRP port maps cannot be deleted.
    assert!(
        !f.ctl_output(&["do", "/handlers/vdisk_nullio/mgmt", "del_device", "d1"])
            .status
            .success()
    );
    // The configuration saved from the tree carries the port.
    let cfg = f.ctl(&["config"]);
    assert!(cfg.contains("\"p1\"") && cfg.contains("0xb2*"), "{cfg}");

    // force_close ends one nexus (SRP_T_LOGOUT); the other carries on.
    f.ctl(&[
        "set",
        &format!("/targets/srp/p1/sessions/{}/force_close", hex_id(0xb2)),
        "1",
    ]);
    pump_until(&mut b, |i| i.closed().is_some());
    assert!(
        b.ini.closed().is_some(),
        "force_close did not end channel b"
    );
    assert_eq!(read(&mut a, 0, 64, data.len()), data);
    let s = sessions_until(f, |s| s.len() == 1);
    assert_eq!(s.len(), 1, "{s:?}");
    let mut b = login(&sock, 0xb2);
    clear_ua(&mut b, 0);

    // Disabling logs every channel out; new logins are refused.
    f.ctl(&["set", "/targets/srp/p1/enabled", "0"]);
    pump_until(&mut a, |i| i.closed().is_some());
    pump_until(&mut b, |i| i.closed().is_some());
    assert!(a.ini.closed().is_some(), "channel a still open");
    assert!(b.ini.closed().is_some(), "channel b still open");
    assert!(try_login(&sock, 0xa1, false, 0x1000).is_err());
    let s = sessions_until(f, |s| s.is_empty());
    assert!(s.is_empty(), "{s:?}");

    // Removing the port closes its listener.
    f.ctl(&["do", "/targets/srp/mgmt", "del_target", "p1"]);
    let deadline = Instant::now() + Duration::from_secs(10);
    while sock.exists() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(!sock.exists(), "the removed port's socket is gone");
    assert!(!f.ctl(&["ls", "/targets/srp"]).contains("p1"));
    assert!(
        !f.ctl(&["get", "/devices/d1/exported"]).contains("srp/"),
        "d1 is no longer exported by SRP"
    );
    f.ctl(&["do", "/handlers/vdisk_nullio/mgmt", "del_device", "d1"]);
}

#[test]
fn several_channels_share_one_nexus_and_a_single_login_ends_them() {
    let m = format!("127.0.0.1:{}", free_port());
    let r = rig_with(
        |dir| vec![SrpTarget::soft("srp0", PORT_ID, &dir.join("s.sock")).lun(0, "d0")],
        &["--metrics", &m],
    );
    let f = &r.f;
    let sock = r.dir.path().join("s.sock");

    // SRP r16a §6.3: the first channel finds no other (result 0).
    let mut a = login(&sock, 0xc3);
    assert_eq!(a.ini.login_rsp.rsp_flags & 3, iu::LOGIN_RSP_NO_CHANNEL);
    clear_ua(&mut a, 0);

    // MULTI-CHANNEL ACTION 1: the channel joins the nexus (result 2). It
    // is the same I_T nexus: no new unit attention, shared task set.
    let mut b = try_login(&sock, 0xc3, true, 0x10_0000).unwrap();
    assert_eq!(b.ini.login_rsp.rsp_flags & 3, iu::LOGIN_RSP_MAINTAINED);
    assert_eq!(tur(&mut b), 0, "the joined channel sees the nexus's state");
    let data = pattern(7, 65536);
    write(&mut a, 0, 256, &data);
    assert_eq!(read(&mut b, 0, 256, data.len()), data);
    // Commands in flight on both channels at once.
    let ta = a
        .ini
        .submit(
            Lun(0),
            &rw10(0x28, 256, 128),
            None,
            65536,
            Layout::default(),
            iu::TASK_ATTR_SIMPLE,
        )
        .unwrap();
    let tb = b
        .ini
        .submit(
            Lun(0),
            &rw10(0x28, 256, 128),
            None,
            65536,
            Layout::default(),
            iu::TASK_ATTR_SIMPLE,
        )
        .unwrap();
    let (ca, cb) = (a.ini.wait(ta).unwrap(), b.ini.wait(tb).unwrap());
    assert_eq!((ca.rsp.status, cb.rsp.status), (0, 0));
    assert!(ca.data == data && cb.data == data);
    let s = sessions_until(f, |s| s.first().is_some_and(|l| l.contains("channels=2")));
    assert_eq!(s.len(), 1, "one nexus: {s:?}");
    assert!(s[0].contains("channels=2"), "{s:?}");
    // Another initiator port is another nexus.
    let mut other = login(&sock, 0xd4);
    clear_ua(&mut other, 0);
    let s = sessions_until(f, |s| s.len() == 2);
    assert_eq!(s.len(), 2, "{s:?}");
    // The metrics count SRP nexuses as sessions of their port.
    let text = metrics(&m);
    assert!(
        text.contains("ferrite_sessions{target=\"srp0\"} 2\n"),
        "{text}"
    );

    // MULTI-CHANNEL ACTION 0: the nexus's channels are logged out with
    // reason MULTI-CHANNEL ACTION (result 1); the new channel is a new
    // nexus (its first command meets POWER ON/RESET).
    let mut c = try_login(&sock, 0xc3, false, 0x20_0000).unwrap();
    assert_eq!(c.ini.login_rsp.rsp_flags & 3, iu::LOGIN_RSP_TERMINATED);
    pump_until(&mut a, |i| i.closed().is_some());
    pump_until(&mut b, |i| i.closed().is_some());
    let reason = Some(Some(iu::TLogoutReason::MULTI_CHANNEL_ACTION.0));
    assert_eq!(a.ini.closed(), reason);
    assert_eq!(b.ini.closed(), reason);
    assert_eq!(tur(&mut c), 2, "a new nexus starts with a unit attention");
    clear_ua(&mut c, 0);
    assert_eq!(read(&mut c, 0, 256, data.len()), data);
    // The other initiator port's nexus is untouched.
    assert_eq!(tur(&mut other), 0);
    assert!(other.ini.closed().is_none());
    let s = sessions_until(f, |s| {
        s.len() == 2 && s.iter().all(|l| l.contains("channels=1"))
    });
    assert_eq!(s.len(), 2, "{s:?}");
    assert!(s.iter().all(|l| l.contains("channels=1")), "{s:?}");

    // A MULTI login with no channel to join is a plain new nexus.
    c.ini.logout().unwrap();
    let _ = sessions_until(f, |s| s.len() == 1);
    let mut d = try_login(&sock, 0xc3, true, 0x30_0000).unwrap();
    assert_eq!(d.ini.login_rsp.rsp_flags & 3, iu::LOGIN_RSP_NO_CHANNEL);
    clear_ua(&mut d, 0);
}
