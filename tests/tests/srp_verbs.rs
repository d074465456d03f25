//! SRP over the `verbs` provider (libibverbs and RDMA CM on a real RDMA
//! device) against a real ferrited: the project's initiator logs in with
//! the 56-byte RDMA CM layout Linux sends, gets immediate data, moves data
//! through direct, indirect and fetched descriptors, joins a second channel
//! to the nexus, and is refused with the SRP_LOGIN_REJ reason as the
//! reject's private data (a login cut short, another IU type, another
//! target port, an IU length above the target's); a channel lost
//! mid-transfer loses no acknowledged write and the nexus's other channel
//! goes on.
//!
//! Needs an RDMA device with an IPv4 address (soft-RoCE `rdma_rxe` will do):
//! `FERRITE_SRP_VERBS=DEVICE,ADDRESS`, for instance `rxe0,10.99.0.1` in the
//! kernel lab. Without it the tests say so and pass: the machines this
//! project builds on have no RDMA device.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed step is a failed test

mod srp_util;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ferrite_rdma::RdmaError;
use ferrite_rdma::verbs::{Context, VerbsCq, VerbsPd, VerbsQp, VerbsQpAttrs};
use ferrite_scsi::Lun;
use ferrite_srp::initiator::{self, InitError, Initiator, InitiatorConfig, Layout};
use ferrite_srp::iu::{self, LoginLayout};
use ferrite_tests::{Config, Device, Ferrited, SrpTarget, free_port, rdma_device};
use serde_json::json;
use srp_util::{BS, clear_ua, lose_channel_mid_transfer, pattern, port_id_of, rw};

const PORT_ID: &str = "0x66657272697465207672627320703030";

struct Rig {
    f: Ferrited,
    addr: SocketAddr,
    ctx: Arc<Context>,
    _dir: tempfile::TempDir,
}

/// ferrited with a RAM disk behind a verbs SRP port on `dev` at `ip`.
fn rig(dev: &str, ip: &str) -> Rig {
    let dir = tempfile::Builder::new()
        .prefix("fsrpv")
        .tempdir_in("/tmp")
        .unwrap();
    let addr: SocketAddr = format!("{ip}:{}", free_port()).parse().unwrap();
    let provider = json!({"kind": "verbs", "device": dev, "port": 1, "listen": addr.to_string()});
    let cfg_path = Config::new()
        .device(Device::mem("mem0", 64 << 20))
        .srp_target(
            SrpTarget::on("srp0", provider)
                .set("port_id", PORT_ID)
                .lun(0, "mem0"),
        )
        .write(dir.path().join("ferrite.json"));
    let f = Ferrited::start_config(dir.path(), &cfg_path, &[]);
    f.wait_log("SRP target port listening (verbs)", 1);
    let ctx = Context::cm_devices()
        .unwrap()
        .into_iter()
        .find(|c| c.name() == dev)
        .unwrap_or_else(|| panic!("RDMA CM has no device {dev}"));
    Rig {
        f,
        addr,
        ctx,
        _dir: dir,
    }
}

/// As ib_srp logs in over RDMA CM: immediate data asked for at offset 68,
/// an IU of 8260 bytes.
fn linux_cfg(ini_id: u8) -> InitiatorConfig {
    InitiatorConfig {
        initiator_port_id: [ini_id; 16],
        target_port_id: port_id_of(PORT_ID),
        recv_count: 160,
        max_it_iu_len: 68 + 8192,
        login_layout: LoginLayout::RdmaCm,
        immediate_data: true,
        ..InitiatorConfig::default()
    }
}

struct Verbs {
    ini: Initiator,
    _pd: VerbsPd,
    _cq: VerbsCq,
}

fn try_login(r: &Rig, cfg: InitiatorConfig) -> Result<Verbs, InitError> {
    let pd = r.ctx.alloc_pd().unwrap();
    let cq = r.ctx.create_cq(4096).unwrap();
    initiator::connect_verbs(&pd, &cq, &r.addr, cfg).map(|ini| Verbs {
        ini,
        _pd: pd,
        _cq: cq,
    })
}

/// Sends `private_data` as an RDMA CM connect request and returns the
/// target's SRP_LOGIN_REJ from the reject's private data (which the CM pads
/// to its own size); fails the test if the target accepted.
fn refused_raw(r: &Rig, private_data: &[u8]) -> iu::LoginRej {
    let pd = r.ctx.alloc_pd().unwrap();
    let cq = r.ctx.create_cq(64).unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match VerbsQp::connect(
            &r.addr,
            &pd,
            &cq,
            &cq,
            VerbsQpAttrs::default(),
            &[],
            private_data,
            Duration::from_secs(10),
        ) {
            Err(RdmaError::Rejected { private_data }) => {
                assert!(
                    private_data.len() >= iu::LOGIN_REJ_LEN,
                    "{private_data:02x?}"
                );
                return iu::LoginRej::parse(&private_data).expect("an SRP_LOGIN_REJ");
            }
            Ok(_) => panic!(
                "the target accepted {} bytes of bad private data",
                private_data.len()
            ),
            Err(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(100)),
            Err(e) => panic!("connect to {}: {e}", r.addr),
        }
    }
}

fn login(r: &Rig, cfg: InitiatorConfig) -> Verbs {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match try_login(r, cfg.clone()) {
            Ok(v) => return v,
            Err(InitError::LoginRejected(x)) => panic!("login rejected: {x:#x}"),
            Err(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(100)),
            Err(e) => panic!("SRP login over verbs to {}: {e}", r.addr),
        }
    }
}

#[test]
fn linux_style_login_and_verified_io_over_rdma_cm() {
    let Some((dev, ip)) = rdma_device("FERRITE_SRP_VERBS") else {
        eprintln!("FERRITE_SRP_VERBS unset (no RDMA device): skipping SRP over verbs");
        return;
    };
    let r = rig(&dev, &ip);
    let mut a = login(&r, linux_cfg(0x31));
    let rsp = a.ini.login_rsp.clone();
    assert_eq!(
        rsp.rsp_flags,
        iu::LOGIN_RSP_NO_CHANNEL | iu::LOGIN_RSP_IMMED_SUPP
    );
    assert_eq!(rsp.max_it_iu_len, 68 + 8192);
    assert_eq!(a.ini.immediate_data(), Some((68, 8192)));
    clear_ua(&mut a.ini);
    let layouts = [
        Layout {
            segments: 1,
            inline_max: 16,
        },
        Layout {
            segments: 4,
            inline_max: 16,
        },
        Layout {
            segments: 8,
            inline_max: 2,
        },
    ];
    let mut lba = 0u64;
    for (k, layout) in layouts.iter().enumerate() {
        for size in [512usize, 8192, 65536, 1 << 20] {
            let data = pattern((k * 31 + size) as u32, size);
            let blocks = (size / BS) as u32;
            let w = a
                .ini
                .command(Lun(0), &rw(0x8a, lba, blocks), Some(&data), 0, *layout)
                .unwrap();
            assert_eq!(w.rsp.status, 0, "write {size} {layout:?}: {:?}", w.rsp);
            let rd = a
                .ini
                .command(Lun(0), &rw(0x88, lba, blocks), None, size as u32, *layout)
                .unwrap();
            assert_eq!(rd.rsp.status, 0);
            assert!(rd.data == data, "read back differs: {size}, {layout:?}");
            lba += u64::from(blocks);
        }
    }
    assert!(a.ini.immediate_writes >= 6, "immediate data was used");
    // Queue depth 64 of mixed 4 KiB writes and reads.
    let mut tags = std::collections::VecDeque::new();
    for n in 0..512u32 {
        let l = 100_000 + u64::from(n % 128) * 8;
        let t = if n % 2 == 0 {
            a.ini.submit(
                Lun(0),
                &rw(0x8a, l, 8),
                Some(&pattern(n, 4096)),
                0,
                Layout::default(),
                iu::TASK_ATTR_SIMPLE,
            )
        } else {
            a.ini.submit(
                Lun(0),
                &rw(0x88, l, 8),
                None,
                4096,
                Layout::default(),
                iu::TASK_ATTR_SIMPLE,
            )
        };
        tags.push_back(t.unwrap());
        if tags.len() >= 64 {
            let t = tags.pop_front().unwrap();
            assert_eq!(a.ini.wait(t).unwrap().rsp.status, 0);
        }
    }
    while let Some(t) = tags.pop_front() {
        assert_eq!(a.ini.wait(t).unwrap().rsp.status, 0);
    }
    assert!(a.ini.closed().is_none());

    // A second channel joins the nexus (MULTI-CHANNEL ACTION 1).
    let mut b = login(
        &r,
        InitiatorConfig {
            multi_channel: true,
            first_tag: 0x10_0000,
            ..linux_cfg(0x31)
        },
    );
    assert_eq!(
        b.ini.login_rsp.rsp_flags,
        iu::LOGIN_RSP_MAINTAINED | iu::LOGIN_RSP_IMMED_SUPP
    );
    let data = pattern(99, 1 << 20);
    let w = b
        .ini
        .command(
            Lun(0),
            &rw(0x8a, 0, 2048),
            Some(&data),
            0,
            Layout::default(),
        )
        .unwrap();
    assert_eq!(w.rsp.status, 0);
    let rd = a
        .ini
        .command(Lun(0), &rw(0x88, 0, 2048), None, 1 << 20, Layout::default())
        .unwrap();
    assert!(rd.data == data, "a channel reads what the other wrote");
    let log = r.f.log_text();
    assert_eq!(log.matches("layout=RdmaCm").count(), 2, "{log}");
    b.ini.logout().unwrap();
    a.ini.logout().unwrap();
}

#[test]
fn refusals_reach_the_initiator_through_rdma_cm() {
    let Some((dev, ip)) = rdma_device("FERRITE_SRP_VERBS") else {
        eprintln!("FERRITE_SRP_VERBS unset (no RDMA device): skipping SRP over verbs");
        return;
    };
    let r = rig(&dev, &ip);
    // A login cut short: RDMA CM pads a connect request's private data
    // with zeros to its 56 bytes, so the target reads a target port id of
    // zeros and refuses it as another port's (00010003h, the request's tag).
    let mut req = linux_cfg(0x41).login_req();
    req.tag = 0x5152_5354_5556_5758;
    let rej = refused_raw(&r, &req.encode_rdma_cm()[..30]);
    assert_eq!(
        (rej.reason, rej.tag),
        (iu::LoginRejReason::UNABLE_TO_ASSOCIATE, req.tag)
    );
    // Another IU type where SRP_LOGIN_REQ belongs: 00010000h.
    let mut b = req.encode_rdma_cm();
    b[11] = iu::IuType::CMD.0;
    let rej = refused_raw(&r, &b);
    assert_eq!(
        (rej.reason, rej.tag),
        (iu::LoginRejReason::UNABLE_TO_ESTABLISH, req.tag)
    );
    // Another target port's id: 00010003h, from the reject's private data.
    let wrong = InitiatorConfig {
        target_port_id: [0x42; 16],
        ..linux_cfg(0x41)
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    let reason = loop {
        match try_login(&r, wrong.clone()) {
            Err(InitError::LoginRejected(x)) => break x,
            Err(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(100)),
            Err(e) => panic!("{e}"),
            Ok(_) => panic!("accepted a login for another port"),
        }
    };
    assert_eq!(reason, iu::LoginRejReason::UNABLE_TO_ASSOCIATE.0);
    // An IU length above the target's: 00010002h.
    let big = InitiatorConfig {
        max_it_iu_len: 68 + (1 << 20),
        recv_len: 4096,
        ..linux_cfg(0x41)
    };
    assert!(matches!(
        try_login(&r, big).map(|_| ()),
        Err(InitError::LoginRejected(0x0001_0002))
    ));
    let log = r.f.wait_log("SRP login rejected", 4);
    assert!(log.contains("IU type 0x02 is not SRP_LOGIN_REQ"), "{log}");
    assert_eq!(log.matches("names another target port").count(), 2, "{log}");
    assert!(log.contains("IU length 1048644 is above"), "{log}");
    // And a good login still goes through.
    let mut ok = login(&r, linux_cfg(0x41));
    clear_ua(&mut ok.ini);
}

#[test]
fn a_channel_lost_mid_transfer_over_rdma_cm_spares_the_other_channel() {
    let Some((dev, ip)) = rdma_device("FERRITE_SRP_VERBS") else {
        eprintln!("FERRITE_SRP_VERBS unset (no RDMA device): skipping SRP over verbs");
        return;
    };
    let r = rig(&dev, &ip);
    let mut a = login(&r, linux_cfg(0xc7));
    clear_ua(&mut a.ini);
    let mut b = login(
        &r,
        InitiatorConfig {
            multi_channel: true,
            first_tag: 0x10_0000,
            ..linux_cfg(0xc7)
        },
    );
    lose_channel_mid_transfer(&r.f, a, |a| &mut a.ini, &mut b.ini);
}
