//! What the Linux SRP initiator (`ib_srp`) negotiates, end to end against a
//! real ferrited over the soft RDMA provider, with the project's initiator
//! speaking as ib_srp does: the 56-byte RDMA CM login layout beside the
//! 64-byte IU, SRP-2 immediate data, two channels on one I_T nexus, every
//! refused login answered with its SRP_LOGIN_REJ reason and a log line, and
//! a channel lost mid-transfer while the nexus's other channel goes on.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed step is a failed test

mod srp_util;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use ferrite_rdma::RdmaError;
use ferrite_rdma::soft::{QpAttrs, SoftAddr, SoftCq, SoftDevice, SoftQp};
use ferrite_scsi::Lun;
use ferrite_srp::initiator::{InitError, InitiatorConfig, Layout};
use ferrite_srp::iu::{self, LoginLayout, LoginRejReason};
use ferrite_tests::{Config, Device, Ferrited, Options, SrpTarget, Target, free_port};
use serde_json::{Value, json};
use srp_util::{
    BS, Srp, clear_ua, login_soft, lose_channel_mid_transfer, pattern, port_id_of, read16, rw,
    try_login_soft, write16,
};

const PORT_ID: &str = "0x66657272697465207372702070307430";
/// What ib_srp asks for by default: an 8 KiB immediate data payload behind
/// a 68-byte SRP_CMD.
const LINUX_IT_IU_LEN: u32 = 68 + 8192;

struct Rig {
    f: Ferrited,
    sock: PathBuf,
    _dir: tempfile::TempDir,
}

/// ferrited with a file-backed disk behind one SRP soft port (and an
/// iSCSI portal, which is what the test harness waits for).
fn rig() -> Rig {
    rig_with(None)
}

/// [`rig`] with a fault section for the disk.
fn rig_with(fault: Option<&str>) -> Rig {
    let dir = tempfile::Builder::new()
        .prefix("fsrpl")
        .tempdir_in("/tmp")
        .unwrap();
    let img = dir.path().join("disk0.img");
    let sock = dir.path().join("srp.sock");
    let port = free_port();
    let mut disk = Device::fileio("disk0", &img, 64 << 20);
    if let Some(f) = fault {
        disk = disk.set(
            "fault",
            serde_json::from_str::<Value>(f).expect("fault JSON"),
        );
    }
    let cfg_path = Config::new()
        .device(disk)
        .target(
            Target::new("iqn.2026-12.org.ferrite:srp-linux")
                .portal(format!("127.0.0.1:{port}"))
                .set("luns", json!([])),
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
    Rig { f, sock, _dir: dir }
}

/// The initiator configured as ib_srp logs in over RDMA CM: the 56-byte
/// layout, immediate data asked for at offset 68, an IU of 8260 bytes.
fn linux_cfg(ini_id: u8) -> InitiatorConfig {
    InitiatorConfig {
        initiator_port_id: [ini_id; 16],
        target_port_id: port_id_of(PORT_ID),
        recv_count: 160,
        max_it_iu_len: LINUX_IT_IU_LEN,
        login_layout: LoginLayout::RdmaCm,
        immediate_data: true,
        imm_data_offset: 68,
        ..InitiatorConfig::default()
    }
}

fn try_login(sock: &Path, cfg: InitiatorConfig) -> Result<Srp, InitError> {
    try_login_soft(sock, cfg)
}

/// Logs in, retrying while ferrited starts.
fn login(sock: &Path, cfg: InitiatorConfig) -> Srp {
    login_soft(sock, cfg)
}

/// Sends `private_data` as a connect request and returns the target's
/// SRP_LOGIN_REJ, or `None` if it accepted (the connection is dropped).
fn answer(sock: &Path, private_data: &[u8]) -> Option<iu::LoginRej> {
    let dev = SoftDevice::new("raw");
    let pd = dev.alloc_pd();
    let cq = SoftCq::new().unwrap();
    let qp = SoftQp::create(&pd, &cq, &cq, None, QpAttrs::default());
    match qp.connect(
        &SoftAddr::Unix(sock.into()),
        private_data,
        Duration::from_secs(10),
    ) {
        Err(RdmaError::Rejected { private_data }) => {
            assert_eq!(private_data.len(), iu::LOGIN_REJ_LEN);
            Some(iu::LoginRej::parse(&private_data).expect("an SRP_LOGIN_REJ"))
        }
        Ok(_) => None,
        Err(e) => panic!("connect: {e}"),
    }
}

/// [`answer`], which must be a refusal.
fn refused(sock: &Path, private_data: &[u8]) -> iu::LoginRej {
    answer(sock, private_data).expect("login accepted")
}

/// Checks refusal number `n` (counting from 1 in ferrited's log): its
/// reason, tag and formats, and its log line, which says `why`.
/// `rej` is `None` where the refusal was seen by the initiator library.
fn check(
    f: &Ferrited,
    n: usize,
    rej: Option<iu::LoginRej>,
    reason: LoginRejReason,
    tag: u64,
    why: &str,
) {
    if let Some(rej) = rej {
        assert_eq!((rej.reason, rej.tag), (reason, tag), "{why}");
        assert_eq!(
            rej.buf_fmt,
            iu::BUF_FORMAT_DIRECT | iu::BUF_FORMAT_INDIRECT,
            "the target's formats"
        );
    }
    let log = f.wait_log("SRP login rejected", n);
    let line = log
        .lines()
        .filter(|l| l.contains("SRP login rejected"))
        .nth(n - 1)
        .unwrap_or_else(|| panic!("no log line for {why}:\n{log}"));
    assert!(line.contains(why), "{why}: {line}");
    assert!(
        line.contains(&format!("reason={:#010x}", reason.0)),
        "{line}"
    );
}

#[test]
fn rdma_cm_login_with_immediate_data_and_two_channels() {
    let r = rig();
    // The first channel, as ib_srp sends it over RDMA CM: single-channel
    // action, immediate data asked for.
    let mut a = login(&r.sock, linux_cfg(0xa1));
    let rsp = a.ini.login_rsp.clone();
    assert_eq!(rsp.rsp_flags & iu::MULTICHAN_MASK, iu::LOGIN_RSP_NO_CHANNEL);
    assert_ne!(
        rsp.rsp_flags & iu::LOGIN_RSP_IMMED_SUPP,
        0,
        "immediate data supported"
    );
    assert_eq!(rsp.max_it_iu_len, LINUX_IT_IU_LEN, "the IU length echoed");
    assert_eq!(rsp.req_lim_delta, 128);
    assert_eq!(a.ini.immediate_data(), Some((68, 8192)));
    clear_ua(&mut a.ini);
    // Writes that fit in the SRP_CMD carry their data in it; larger ones
    // go by RDMA READ; both read back.
    let mut lba = 0u64;
    for size in [512usize, 4096, 8192, 8704, 65536] {
        let data = pattern(size as u32, size);
        let before = a.ini.immediate_writes;
        write16(&mut a.ini, lba, &data);
        assert_eq!(
            a.ini.immediate_writes - before,
            u64::from(size <= 8192),
            "{size}-byte write: immediate data only where it fits"
        );
        assert_eq!(read16(&mut a.ini, lba, size), data, "{size} bytes");
        lba += (size / BS) as u64 + 64;
    }
    // Many immediate writes in flight at once, within the credits.
    let mut tags = Vec::new();
    for k in 0..96u64 {
        let data = pattern(k as u32, 4096);
        tags.push(
            a.ini
                .submit(
                    Lun(0),
                    &rw(0x8a, 4096 + k * 8, 8),
                    Some(&data),
                    0,
                    Layout::default(),
                    iu::TASK_ATTR_SIMPLE,
                )
                .unwrap(),
        );
    }
    for t in tags {
        assert_eq!(a.ini.wait(t).unwrap().rsp.status, 0);
    }
    for k in (0..96u64).step_by(7) {
        assert_eq!(
            read16(&mut a.ini, 4096 + k * 8, 4096),
            pattern(k as u32, 4096)
        );
    }

    // The second channel joins the nexus (MULTI-CHANNEL ACTION 1, as
    // ib_srp logs in its channels after the first), also with immediate
    // data: the result says the first was maintained.
    let mut b = login(
        &r.sock,
        InitiatorConfig {
            multi_channel: true,
            first_tag: 0x10_0000,
            ..linux_cfg(0xa1)
        },
    );
    let rsp = &b.ini.login_rsp;
    assert_eq!(
        rsp.rsp_flags,
        iu::LOGIN_RSP_MAINTAINED | iu::LOGIN_RSP_IMMED_SUPP
    );
    // One nexus: no new unit attention, and each channel sees the other's
    // writes.
    let c = b
        .ini
        .command(Lun(0), &[0u8; 6], None, 0, Layout::default())
        .unwrap();
    assert_eq!(c.rsp.status, 0, "the joined channel is the same nexus");
    let data = pattern(77, 8192);
    write16(&mut b.ini, 20_000, &data);
    assert_eq!(read16(&mut a.ini, 20_000, 8192), data);
    assert!(b.ini.immediate_writes > 0);
    let s = r.f.ctl(&["sessions"]);
    let line = s.lines().find(|l| l.starts_with("srp ")).unwrap_or("");
    assert!(line.contains("channels=2"), "{s}");

    // The 64-byte IU without immediate data: granted nothing of SRP-2, and
    // the writes go by RDMA READ.
    let mut c = login(
        &r.sock,
        InitiatorConfig {
            login_layout: LoginLayout::Iu,
            immediate_data: false,
            ..linux_cfg(0xb2)
        },
    );
    assert_eq!(c.ini.login_rsp.rsp_flags, iu::LOGIN_RSP_NO_CHANNEL);
    assert_eq!(c.ini.immediate_data(), None);
    clear_ua(&mut c.ini);
    write16(&mut c.ini, 30_000, &data);
    assert_eq!(c.ini.immediate_writes, 0);
    assert_eq!(read16(&mut b.ini, 30_000, 8192), data);

    let log = r.f.log_text();
    assert_eq!(
        log.matches("layout=RdmaCm it_iu_len=8260 immediate_data_offset=Some(68)")
            .count(),
        2,
        "{log}"
    );
    assert!(
        log.contains("layout=Iu it_iu_len=8260 immediate_data_offset=None"),
        "{log}"
    );
}

#[test]
fn every_refused_login_gets_its_srp_reason_and_a_log_line() {
    let r = rig();
    let sock = &r.sock;
    // A good login first: the port is up.
    let mut good = login(sock, linux_cfg(0x01));
    clear_ua(&mut good.ini);
    let mut req = linux_cfg(0x02).login_req();
    req.tag = 0x5152_5354_5556_5758;
    // Refusals so far, which is also their number in ferrited's log.
    let mut n = 0;
    let mut expect = |rej: Option<iu::LoginRej>, reason: LoginRejReason, tag: u64, why: &str| {
        n += 1;
        check(&r.f, n, rej, reason, tag, why);
        n
    };
    // Private data too short for either layout.
    expect(
        Some(refused(sock, &req.encode_rdma_cm()[..30])),
        LoginRejReason::UNABLE_TO_ESTABLISH,
        0,
        "private data of 30 bytes is shorter",
    );
    // Another IU type where SRP_LOGIN_REQ belongs, in each layout.
    let mut b = req.encode_rdma_cm();
    b[11] = iu::IuType::CMD.0;
    expect(
        Some(refused(sock, &b)),
        LoginRejReason::UNABLE_TO_ESTABLISH,
        req.tag,
        "IU type 0x02 is not SRP_LOGIN_REQ",
    );
    let mut b = req.encode();
    b[0] = iu::IuType::I_LOGOUT.0;
    expect(
        Some(refused(sock, &b)),
        LoginRejReason::UNABLE_TO_ESTABLISH,
        req.tag,
        "IU type 0x03 is not SRP_LOGIN_REQ",
    );
    // A target port id naming another target port.
    let mut x = req.clone();
    x.target_port_id[15] ^= 1;
    expect(
        Some(refused(sock, &x.encode_rdma_cm())),
        LoginRejReason::UNABLE_TO_ASSOCIATE,
        req.tag,
        "names another target port",
    );
    // The project's initiator reports the reason it was refused with.
    let wrong = InitiatorConfig {
        target_port_id: [0x42; 16],
        ..linux_cfg(0x03)
    };
    assert!(matches!(
        try_login(sock, wrong).map(|_| ()),
        Err(InitError::LoginRejected(0x0001_0003))
    ));
    expect(
        None,
        LoginRejReason::UNABLE_TO_ASSOCIATE,
        0,
        "names another target port",
    );
    // An IU length above what the target receives (ib_srp with
    // max_imm_data=1048576).
    let mut x = req.clone();
    x.req_it_iu_len = 68 + (1 << 20);
    expect(
        Some(refused(sock, &x.encode_rdma_cm())),
        LoginRejReason::IT_IU_LENGTH_TOO_LARGE,
        req.tag,
        "requested initiator-to-target IU length 1048644 is above",
    );
    // Required buffer formats the target lacks.
    let mut x = req.clone();
    x.req_buf_fmt |= 1 << 8;
    expect(
        Some(refused(sock, &x.encode())),
        LoginRejReason::UNSUPPORTED_DESCRIPTOR_FORMAT,
        req.tag,
        "required buffer formats 0x0106",
    );
    // A reserved MULTI-CHANNEL ACTION.
    let mut x = req.clone();
    x.req_flags |= 0x03;
    expect(
        Some(refused(sock, &x.encode_rdma_cm())),
        LoginRejReason::UNABLE_TO_ESTABLISH,
        req.tag,
        "MULTI-CHANNEL ACTION 3 is reserved",
    );
    // A disabled port takes no login; enabled again, it does.
    r.f.ctl(&["set", "/targets/srp/srp0/enabled", "0"]);
    let deadline = Instant::now() + Duration::from_secs(10);
    let rej = loop {
        // Until the cores have the new snapshot, logins are still taken.
        if let Some(rej) = answer(sock, &req.encode_rdma_cm()) {
            break rej;
        }
        assert!(Instant::now() < deadline, "the port stayed enabled");
        std::thread::sleep(Duration::from_millis(20));
    };
    let n = expect(
        Some(rej),
        LoginRejReason::UNABLE_TO_ESTABLISH,
        req.tag,
        "target port disabled",
    );
    assert_eq!(n, 9);
    r.f.ctl(&["set", "/targets/srp/srp0/enabled", "1"]);
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut again = loop {
        match try_login(sock, linux_cfg(0x02)) {
            Ok(s) => break s,
            Err(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(50)),
            Err(e) => panic!("{e}"),
        }
    };
    clear_ua(&mut again.ini);
    let data = pattern(5, 8192);
    write16(&mut again.ini, 0, &data);
    assert_eq!(read16(&mut again.ini, 0, 8192), data);
}

#[test]
fn a_channel_lost_mid_transfer_leaves_acknowledged_writes_and_the_other_channel_going() {
    let r = rig();
    let mut a = login(&r.sock, linux_cfg(0xc7));
    clear_ua(&mut a.ini);
    let mut b = login(
        &r.sock,
        InitiatorConfig {
            multi_channel: true,
            first_tag: 0x10_0000,
            ..linux_cfg(0xc7)
        },
    );
    lose_channel_mid_transfer(&r.f, a, |a| &mut a.ini, &mut b.ini);
}

/// Writes to LBAs 8192.. are held 1.5 s by the disk's fault rule, so they
/// are in flight when task management arrives.
const SLOW: &str = r#"{"rules": [{"op": "write", "lba": 8192, "blocks": 1024, "delay_ms": 1500}]}"#;

#[test]
fn a_lun_reset_on_one_channel_ends_the_other_channels_tasks_and_returns_their_credits() {
    let r = rig_with(Some(SLOW));
    let mut a = login(&r.sock, linux_cfg(0xd1));
    clear_ua(&mut a.ini);
    let mut b = login(
        &r.sock,
        InitiatorConfig {
            multi_channel: true,
            first_tag: 0x10_0000,
            ..linux_cfg(0xd1)
        },
    );
    let full = b.ini.credits();
    // Slow writes on channel B (immediate data and RDMA READ alike).
    let mut slow = Vec::new();
    for k in 0..6u64 {
        let len = if k % 2 == 0 { 4096 } else { 65536 };
        slow.push(
            b.ini
                .submit(
                    Lun(0),
                    &rw(0x8a, 8192 + k * 128, (len / BS) as u32),
                    Some(&pattern(k as u32, len)),
                    0,
                    Layout::default(),
                    iu::TASK_ATTR_SIMPLE,
                )
                .unwrap(),
        );
    }
    assert_eq!(b.ini.credits(), full - 6);
    std::thread::sleep(Duration::from_millis(300));
    // LOGICAL UNIT RESET on channel A, as ib_srp sends it (on its first
    // channel): it ends B's commands too.
    let rsp = a
        .ini
        .task_mgmt(Lun(0), iu::TskFunc::LUN_RESET, u64::from(u32::MAX))
        .unwrap();
    assert_eq!(rsp.rsp_code(), Some(iu::RspCode::COMPLETE), "{rsp:?}");
    // SAM-5 §7: B's aborted commands get no response, and B gets their
    // credits back (SRP_CRED_REQ: no response is coming to carry them).
    let deadline = Instant::now() + Duration::from_secs(10);
    while b.ini.credits() < full && Instant::now() < deadline {
        let _ = b.ini.progress(Instant::now() + Duration::from_millis(50));
    }
    assert_eq!(b.ini.credits(), full, "channel B's credits came back");
    assert!(b.ini.cred_reqs >= 1);
    for t in &slow {
        assert!(!b.ini.answered(*t), "an aborted command was answered");
    }
    assert!(b.ini.closed().is_none());
    // B goes on with its whole request limit.
    let mut tags = Vec::new();
    for k in 0..u64::from(full) {
        tags.push(
            b.ini
                .submit(
                    Lun(0),
                    &rw(0x88, k * 8, 8),
                    None,
                    4096,
                    Layout::default(),
                    iu::TASK_ATTR_SIMPLE,
                )
                .unwrap(),
        );
    }
    for t in tags {
        let c = b.ini.wait(t).unwrap();
        // The reset's unit attention comes first, on one of them.
        assert!(c.rsp.status == 0 || c.rsp.status == 2, "{:?}", c.rsp);
    }
}
