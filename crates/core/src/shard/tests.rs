use super::*;
use crate::backend::{Backend, BackendError, Caps, Geometry};
use crate::cmd::DataDir;
use crate::device::{DeviceFlags, Identity};

/// A backend nothing is ever read from: these tests only look at unit
/// attentions and AENs.
struct NoIo;

impl Backend for NoIo {
    fn geometry(&self) -> Geometry {
        Geometry {
            block_size: 512,
            num_blocks: 2048,
            phys_exp: 0,
        }
    }
    fn caps(&self) -> Caps {
        Caps::default()
    }
    fn open_queue(&self, _depth: u32) -> Result<Box<dyn BackendQueue>, BackendError> {
        Err(BackendError::Invalid("no I/O in this test".into()))
    }
}

fn nexus(n: u32) -> Nexus {
    Nexus {
        initiator: format!("iqn.2026-11.test:i{n}"),
        initiator_port: format!("iqn.2026-11.test:i{n},i,0x{n:012x}"),
        target: "iqn.2026-11.test:t".into(),
        rel_port_id: 1,
        target_port: String::new(),
        protocol: None,
    }
}

fn tur(shard: &mut Shard, now: Instant, sid: SessionId, lun: u16) -> Response {
    let req = CmdRequest {
        lun: Lun(lun),
        lun_raw: Lun(lun).encode(),
        tag: TaskTag(7),
        cdb: Cdb::from_slice(&[0; 6]),
        attr: TaskAttr::Simple,
        dir: DataDir::None,
        expected_len: 0,
        expected_read_len: 0,
    };
    let id = shard.session(sid).unwrap().submit(now, req);
    let mut s = shard.session(sid).unwrap();
    while let Some(a) = s.poll_action() {
        if let Action::Respond { id: i, rsp, .. } = a {
            assert_eq!(i, id);
            s.response_sent(id);
            return rsp;
        }
    }
    panic!("TEST UNIT READY not answered at once");
}

fn sense(r: &Response) -> Option<(u8, u8, u8)> {
    r.sense.as_ref().map(|s| (s[2] & 0x0f, s[12], s[13]))
}

/// Runs a command that moves no Data-Out and answers without backend
/// I/O; returns its response and Data-In.
fn run(shard: &mut Shard, now: Instant, sid: SessionId, cdb: &[u8]) -> (Response, Vec<u8>) {
    let read = matches!(cdb[0], 0x12 | 0x5e);
    let req = CmdRequest {
        lun: Lun(0),
        lun_raw: Lun(0).encode(),
        tag: TaskTag(9),
        cdb: Cdb::from_slice(cdb),
        attr: TaskAttr::Simple,
        dir: if read { DataDir::Read } else { DataDir::None },
        expected_len: if read { 96 } else { 0 },
        expected_read_len: 0,
    };
    let id = shard.session(sid).unwrap().submit(now, req);
    let mut s = shard.session(sid).unwrap();
    while let Some(a) = s.poll_action() {
        if let Action::Respond { id: i, rsp, .. } = a {
            assert_eq!(i, id);
            s.response_sent(id);
            let data = rsp
                .data
                .as_ref()
                .map(|d| d.to_vec()[..rsp.data_len as usize].to_vec())
                .unwrap_or_default();
            return (rsp, data);
        }
    }
    panic!("{cdb:02x?} not answered at once");
}

fn tmf(shard: &mut Shard, now: Instant, sid: SessionId, func: TmfFunction) -> TmfResponse {
    let req = TmfRequest {
        func,
        lun: Lun(0),
        tag: TaskTag(77),
    };
    shard.session(sid).unwrap().task_mgmt(now, req);
    let mut s = shard.session(sid).unwrap();
    while let Some(a) = s.poll_action() {
        if let Action::TmfDone { rsp, .. } = a {
            return rsp;
        }
    }
    panic!("TMF not answered");
}

const PREVENT: [u8; 6] = [0x1e, 0, 0, 0, 1, 0];
const ALLOW: [u8; 6] = [0x1e, 0, 0, 0, 0, 0];
const EJECT: [u8; 6] = [0x1b, 0, 0, 0, 0x02, 0];
const LOAD: [u8; 6] = [0x1b, 1, 0, 0, 0x03, 0];
const REMOVAL_PREVENTED: Option<(u8, u8, u8)> = Some((5, 0x53, 0x02));
const NO_MEDIUM: Option<(u8, u8, u8)> = Some((2, 0x3a, 0x00));

fn removable_map(flags: DeviceFlags) -> (Arc<Device>, Arc<LunMap>) {
    let dev = Arc::new(Device::new(
        DeviceId(910),
        "cdrom",
        Arc::new(NoIo),
        Identity {
            vendor: "FERRITE".into(),
            product: "t".into(),
            revision: "1".into(),
            serial: "r".into(),
            naa: u64::to_be_bytes(0x5001_4050_0000_0910).to_vec(),
            eui64: Vec::new(),
            ..Identity::default()
        },
        flags,
    ));
    let mut map = LunMap::default();
    map.luns.insert(
        Lun(0),
        LunEntry {
            device: dev.clone(),
            read_only: false,
        },
    );
    (dev, Arc::new(map))
}

/// A watch a test flips by hand.
#[derive(Debug, Default)]
struct Dropped(std::sync::atomic::AtomicBool);

impl NexusWatch for Dropped {
    fn gone(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }
}

#[test]
fn a_lost_transport_ends_prevention_and_reservation_before_its_core_closes_the_session() {
    let (_dev, map) = removable_map(DeviceFlags {
        removable: true,
        ..DeviceFlags::default()
    });
    let now = Instant::now();
    let mut busy = Shard::new(0, BufPool::new(4096, 8));
    let mut next = Shard::new(1, BufPool::new(4096, 8));
    let old = busy.open_session(now, nexus(1), map.clone(), false);
    let w = Arc::new(Dropped::default());
    busy.watch_session(old, w.clone());
    let new = next.open_session(now, nexus(2), map.clone(), false);
    assert_eq!(sense(&tur(&mut busy, now, old, 0)), Some((6, 0x29, 0)));
    assert_eq!(sense(&tur(&mut next, now, new, 0)), Some((6, 0x29, 0)));
    assert_eq!(sense(&run(&mut busy, now, old, &PREVENT).0), None);
    let reserve6 = [0x16, 0, 0, 0, 0, 0];
    assert_eq!(sense(&run(&mut busy, now, old, &reserve6).0), None);
    let (r, _) = run(&mut next, now, new, &EJECT);
    assert_eq!(r.status, ferrite_scsi::Status::RESERVATION_CONFLICT);
    // The initiator drops the old connection; its core has not read
    // that yet (it never runs again here), but the transport says so.
    w.0.store(true, Ordering::Release);
    assert_eq!(sense(&run(&mut next, now, new, &reserve6).0), None);
    assert_eq!(sense(&run(&mut next, now, new, &EJECT).0), None);
    // The old core closes the session later: nothing of the new
    // nexus's is released by it.
    busy.close_session(now, old);
    let third = busy.open_session(now, nexus(3), map.clone(), false);
    assert_eq!(sense(&tur(&mut busy, now, third, 0)), Some((6, 0x29, 0)));
    let (r, _) = run(&mut busy, now, third, &EJECT);
    assert_eq!(r.status, ferrite_scsi::Status::RESERVATION_CONFLICT);
}

/// Polls `sid`'s actions for a TMF response.
fn tmf_done(shard: &mut Shard, sid: SessionId) -> Option<TmfResponse> {
    let mut s = shard.session(sid).unwrap();
    let mut rsp = None;
    while let Some(a) = s.poll_action() {
        if let Action::TmfDone { rsp: r, .. } = a {
            rsp = Some(r);
        }
    }
    rsp
}

#[test]
fn the_core_carries_lu_and_target_resets_to_every_other_core_and_holds_the_response() {
    let (_dev, map) = removable_map(DeviceFlags::default());
    let now = Instant::now();
    let mut core0 = Shard::new(0, BufPool::new(4096, 8));
    let mut core1 = Shard::new(1, BufPool::new(4096, 8));
    core0.set_other_cores(1);
    core1.set_other_cores(1);
    let a = core0.open_session(now, nexus(1), map.clone(), false);
    let c = core1.open_session(now, nexus(3), map.clone(), false);
    assert_eq!(sense(&tur(&mut core0, now, a, 0)), Some((6, 0x29, 0)));
    assert_eq!(sense(&tur(&mut core1, now, c, 0)), Some((6, 0x29, 0)));
    for (func, ua) in [
        (TmfFunction::LogicalUnitReset, (6, 0x29, 0x03)),
        (TmfFunction::TargetReset, (6, 0x29, 0x00)),
    ] {
        let req = TmfRequest {
            func,
            lun: Lun(0),
            tag: TaskTag(77),
        };
        core0.session(a).unwrap().task_mgmt(now, req);
        // Drained here, but the other core has not applied it yet.
        assert_eq!(tmf_done(&mut core0, a), None);
        let mut out = Vec::new();
        core0.take_spanning_resets(&mut out);
        assert_eq!(out.len(), 1, "{func:?} crosses cores");
        let (span, scope) = out.pop().unwrap();
        let remote = core1.remote_reset(now, scope);
        let mut drained = Vec::new();
        core1.drained_resets(&mut drained);
        assert_eq!(drained, vec![remote]);
        core0.spanning_reset_drained(span);
        assert_eq!(tmf_done(&mut core0, a), Some(TmfResponse::Complete));
        // The nexus on the other core saw the reset.
        assert_eq!(sense(&tur(&mut core1, now, c, 0)), Some(ua));
        assert_eq!(sense(&tur(&mut core1, now, c, 0)), None);
    }
    // Task management of one nexus stays on its core.
    assert_eq!(
        tmf(&mut core0, now, a, TmfFunction::AbortTaskSet),
        TmfResponse::Complete
    );
    let mut out = Vec::new();
    core0.take_spanning_resets(&mut out);
    assert!(out.is_empty());
    // A session that ends while its reset is held forgets the response.
    let req = TmfRequest {
        func: TmfFunction::LogicalUnitReset,
        lun: Lun(0),
        tag: TaskTag(78),
    };
    core0.session(a).unwrap().task_mgmt(now, req);
    core0.take_spanning_resets(&mut out);
    core0.close_session(now, a);
    core0.spanning_reset_drained(out[0].0);
    assert!(core0.held.is_empty());
    // A shard alone answers at once.
    let mut alone = Shard::new(0, BufPool::new(4096, 8));
    let b = alone.open_session(now, nexus(2), map, false);
    assert_eq!(
        tmf(&mut alone, now, b, TmfFunction::LogicalUnitReset),
        TmfResponse::Complete
    );
    out.clear();
    alone.take_spanning_resets(&mut out);
    assert!(out.is_empty());
}

#[test]
fn prevention_is_per_nexus_on_every_core_and_ends_with_nexus_loss_and_resets() {
    let (dev, map) = removable_map(DeviceFlags {
        removable: true,
        ..DeviceFlags::default()
    });
    let now = Instant::now();
    let mut core0 = Shard::new(0, BufPool::new(4096, 8));
    let mut core1 = Shard::new(1, BufPool::new(4096, 8));
    let a = core0.open_session(now, nexus(1), map.clone(), false);
    let b = core0.open_session(now, nexus(2), map.clone(), false);
    let c = core1.open_session(now, nexus(3), map.clone(), false);
    for sid in [a, b] {
        assert_eq!(sense(&tur(&mut core0, now, sid, 0)), Some((6, 0x29, 0)));
    }
    assert_eq!(sense(&tur(&mut core1, now, c, 0)), Some((6, 0x29, 0)));
    // SPC-4 §6.6.2: RMB = 1.
    let (r, inq) = run(&mut core0, now, a, &[0x12, 0, 0, 0, 96, 0]);
    assert_eq!(sense(&r), None);
    assert_eq!(inq[1] & 0x80, 0x80);

    // Two nexuses prevent; the other core sees it; ALLOW by one leaves
    // the other's.
    assert_eq!(sense(&run(&mut core0, now, a, &PREVENT).0), None);
    assert_eq!(sense(&run(&mut core1, now, c, &PREVENT).0), None);
    assert_eq!(sense(&run(&mut core0, now, b, &EJECT).0), REMOVAL_PREVENTED);
    assert_eq!(sense(&run(&mut core0, now, a, &ALLOW).0), None);
    assert_eq!(sense(&run(&mut core0, now, a, &EJECT).0), REMOVAL_PREVENTED);
    assert!(dev.medium_present() && dev.removal_prevented());
    // Nexus loss on the other core ends the last prevention.
    core1.close_session(now, c);
    assert!(!dev.removal_prevented());
    assert_eq!(sense(&run(&mut core0, now, b, &EJECT).0), None);
    assert!(!dev.medium_present());
    // Ejected: TEST UNIT READY and media access get NOT READY, MEDIUM
    // NOT PRESENT; INQUIRY and PREVENT still work.
    assert_eq!(sense(&tur(&mut core0, now, a, 0)), NO_MEDIUM);
    let read_cap = [0x25, 0, 0, 0, 0, 0, 0, 0, 0, 0];
    assert_eq!(sense(&run(&mut core0, now, a, &read_cap).0), NO_MEDIUM);
    assert_eq!(
        sense(&run(&mut core0, now, a, &[0x12, 0, 0, 0, 96, 0]).0),
        None
    );
    assert_eq!(sense(&run(&mut core0, now, a, &PREVENT).0), None);
    // Prevention keeps the medium out as well as in.
    assert_eq!(sense(&run(&mut core0, now, b, &LOAD).0), REMOVAL_PREVENTED);
    // LOGICAL UNIT RESET ends every prevention.
    assert_eq!(
        tmf(&mut core0, now, b, TmfFunction::LogicalUnitReset),
        TmfResponse::Complete
    );
    assert!(!dev.removal_prevented());
    for sid in [a, b] {
        assert_eq!(sense(&tur(&mut core0, now, sid, 0)), Some((6, 0x29, 0x03)));
    }
    // Loading: GOOD for the loader, a unit attention for the others.
    assert_eq!(sense(&run(&mut core0, now, b, &LOAD).0), None);
    assert_eq!(sense(&tur(&mut core0, now, b, 0)), None);
    assert_eq!(sense(&tur(&mut core0, now, a, 0)), Some((6, 0x28, 0)));
    assert_eq!(sense(&tur(&mut core0, now, a, 0)), None);
    // I_T NEXUS RESET and TARGET RESET end preventions too.
    assert_eq!(sense(&run(&mut core0, now, a, &PREVENT).0), None);
    assert_eq!(
        tmf(&mut core0, now, a, TmfFunction::ItNexusReset),
        TmfResponse::Complete
    );
    assert!(!dev.removal_prevented());
    assert_eq!(sense(&run(&mut core0, now, b, &PREVENT).0), None);
    assert_eq!(
        tmf(&mut core0, now, a, TmfFunction::TargetReset),
        TmfResponse::Complete
    );
    assert!(!dev.removal_prevented());
    assert_eq!(sense(&tur(&mut core0, now, b, 0)), Some((6, 0x29, 0)));
    // PREVENT 10b and 11b are obsolete: INVALID FIELD IN CDB.
    let (r, _) = run(&mut core0, now, b, &[0x1e, 0, 0, 0, 2, 0]);
    assert_eq!(sense(&r), Some((5, 0x24, 0)));
    // A POWER CONDITION other than 0h ignores LOEJ (StartStopUnit.PwrCnd).
    let (r, _) = run(&mut core0, now, b, &[0x1b, 1, 0, 0, 0x12, 0]);
    assert_eq!(sense(&r), None);
    assert!(dev.medium_present());
}

#[test]
fn a_medium_that_is_not_removable_ignores_loej_and_prevent() {
    let (dev, map) = removable_map(DeviceFlags::default());
    let now = Instant::now();
    let mut core0 = Shard::new(0, BufPool::new(4096, 8));
    let a = core0.open_session(now, nexus(1), map, false);
    assert_eq!(sense(&tur(&mut core0, now, a, 0)), Some((6, 0x29, 0)));
    let (_, inq) = run(&mut core0, now, a, &[0x12, 0, 0, 0, 96, 0]);
    assert_eq!(inq[1] & 0x80, 0);
    assert_eq!(sense(&run(&mut core0, now, a, &PREVENT).0), None);
    assert!(!dev.removal_prevented());
    assert_eq!(sense(&run(&mut core0, now, a, &EJECT).0), None);
    assert!(dev.medium_present());
    assert_eq!(sense(&tur(&mut core0, now, a, 0)), None);
}

#[test]
fn resize_queues_an_aen_where_the_fabric_reports_events_and_a_ua_everywhere() {
    let dev = Arc::new(Device::new(
        DeviceId(900),
        "resized",
        Arc::new(NoIo),
        Identity {
            vendor: "FERRITE".into(),
            product: "t".into(),
            revision: "1".into(),
            serial: "s".into(),
            naa: u64::to_be_bytes(0x5001_4050_0000_0900).to_vec(),
            eui64: Vec::new(),
            ..Identity::default()
        },
        DeviceFlags::default(),
    ));
    let other = Arc::new(Device::new(
        DeviceId(901),
        "other",
        Arc::new(NoIo),
        Identity {
            vendor: "FERRITE".into(),
            product: "t".into(),
            revision: "1".into(),
            serial: "s2".into(),
            naa: u64::to_be_bytes(0x5001_4050_0000_0901).to_vec(),
            eui64: Vec::new(),
            ..Identity::default()
        },
        DeviceFlags::default(),
    ));
    let mut map = LunMap::default();
    for (l, d) in [(0, &dev), (1, &other)] {
        map.luns.insert(
            Lun(l),
            LunEntry {
                device: d.clone(),
                read_only: false,
            },
        );
    }
    let map = Arc::new(map);
    let now = Instant::now();
    let mut shard = Shard::new(0, BufPool::new(4096, 8));
    let with_aen = shard.open_session(now, nexus(1), map.clone(), true);
    let without = shard.open_session(now, nexus(2), map.clone(), false);
    for sid in [with_aen, without] {
        for lun in [0, 1] {
            assert_eq!(sense(&tur(&mut shard, now, sid, lun)), Some((6, 0x29, 0)));
            assert_eq!(sense(&tur(&mut shard, now, sid, lun)), None);
        }
    }

    dev.set_num_blocks(4096);
    shard.poll(now);
    let mut ready = Vec::new();
    shard.ready_sessions(&mut ready);
    assert_eq!(ready, vec![with_aen], "only the AEN-capable session woke");
    let mut s = shard.session(with_aen).unwrap();
    let a: Vec<Action> = std::iter::from_fn(|| s.poll_action()).collect();
    assert!(
        matches!(&a[..], [Action::Aen { lun: Lun(0), sense }]
            if *sense == Sense::CAPACITY_DATA_HAS_CHANGED),
        "{a:?}"
    );
    assert!(shard.session(without).unwrap().poll_action().is_none());
    // The unit attention is pending on the resized LUN for both, once.
    for sid in [with_aen, without] {
        assert_eq!(sense(&tur(&mut shard, now, sid, 1)), None);
        assert_eq!(sense(&tur(&mut shard, now, sid, 0)), Some((6, 0x2a, 0x09)));
        assert_eq!(sense(&tur(&mut shard, now, sid, 0)), None);
    }
    // Nothing more on the next poll: one resize, one event.
    shard.poll(now);
    assert!(shard.session(with_aen).unwrap().poll_action().is_none());
}

#[test]
fn the_core_alone_sets_a_writes_fua_and_the_caching_page_follows_the_backend() {
    let dev = |flags| crate::testing::device(920, Caps::default(), flags);
    let fua_of = |d: &Device, asked: bool| match with_policy(
        d,
        BlockOp::Write {
            offset: 0,
            buf: SgList::zeroed(512),
            fua: asked,
        },
    ) {
        BlockOp::Write { fua, .. } => fua,
        other => panic!("{other:?}"),
    };
    let plain = dev(DeviceFlags::default());
    assert!(!fua_of(&plain, false) && fua_of(&plain, true));
    // Write-through: every write, whichever path made it, is durable
    // when it completes, also after a change at run time (the backend
    // is the same; only the device's flags differ).
    let wt = dev(DeviceFlags {
        write_through: true,
        ..DeviceFlags::default()
    });
    assert!(fua_of(&wt, false) && fua_of(&wt, true));
    // nv_cache: FUA is dropped; write-through still wins.
    let nv = dev(DeviceFlags {
        nv_cache: true,
        ..DeviceFlags::default()
    });
    assert!(!fua_of(&nv, true));
    let both = dev(DeviceFlags {
        nv_cache: true,
        write_through: true,
        ..DeviceFlags::default()
    });
    assert!(fua_of(&both, false));
    // Other operations pass unchanged.
    assert!(matches!(with_policy(&wt, BlockOp::Flush), BlockOp::Flush));
    // WCE: the backend's volatile cache (NoIo has none), never with
    // write-through.
    assert!(!plain.write_cache_enabled());
    let cached = |flags| {
        let caps = Caps {
            write_cache: true,
            ..Caps::default()
        };
        crate::testing::device(921, caps, flags)
    };
    assert!(cached(DeviceFlags::default()).write_cache_enabled());
    assert!(
        !cached(DeviceFlags {
            write_through: true,
            ..DeviceFlags::default()
        })
        .write_cache_enabled()
    );
}

/// Runs `cdb` with `params` as its Data-Out; its response.
fn run_out(shard: &mut Shard, now: Instant, sid: SessionId, cdb: &[u8], params: &[u8]) -> Response {
    let req = CmdRequest {
        lun: Lun(0),
        lun_raw: Lun(0).encode(),
        tag: TaskTag(11),
        cdb: Cdb::from_slice(cdb),
        attr: TaskAttr::Simple,
        dir: DataDir::Write,
        expected_len: params.len() as u32,
        expected_read_len: 0,
    };
    shard.session(sid).unwrap().submit(now, req);
    let mut s = shard.session(sid).unwrap();
    while let Some(a) = s.poll_action() {
        match a {
            Action::FetchData { id, mut buf, .. } => {
                buf.copy_in(0, params);
                s.data_out_done(id, Ok(buf));
            }
            Action::Respond { id, rsp, .. } => {
                s.response_sent(id);
                return rsp;
            }
            _ => {}
        }
    }
    panic!("{cdb:02x?} not answered at once");
}

#[test]
fn alua_states_gate_each_port_and_a_set_reaches_the_other_nexuses() {
    use crate::alua::{AccessState, DeviceGroup, PortGroup};
    let dg = Arc::new(DeviceGroup::new(
        "dg",
        vec![
            PortGroup::new("a", 1, vec![1], AccessState::ActiveOptimized, true),
            PortGroup::new("b", 2, vec![2], AccessState::Standby, false),
        ],
    ));
    let dev = Arc::new(
        Device::new(
            DeviceId(920),
            "alua",
            Arc::new(NoIo),
            Identity {
                vendor: "FERRITE".into(),
                product: "t".into(),
                revision: "1".into(),
                serial: "a".into(),
                naa: u64::to_be_bytes(0x5001_4050_0000_0920).to_vec(),
                ..Identity::default()
            },
            DeviceFlags::default(),
        )
        .with_alua(Some(dg.clone())),
    );
    let mut map = LunMap::default();
    map.luns.insert(
        Lun(0),
        LunEntry {
            device: dev,
            read_only: false,
        },
    );
    let map = Arc::new(map);
    let mut shard = Shard::new(0, BufPool::new(4096, 8));
    let now = Instant::now();
    let mut through_b = nexus(2);
    through_b.rel_port_id = 2;
    let a = shard.open_session(now, nexus(1), map.clone(), false);
    let b = shard.open_session(now, through_b, map, true);
    tur(&mut shard, now, a, 0);
    tur(&mut shard, now, b, 0);
    const STANDBY: Option<(u8, u8, u8)> = Some((2, 0x04, 0x0b));
    const CHANGED: Option<(u8, u8, u8)> = Some((6, 0x2a, 0x06));
    assert_eq!(sense(&tur(&mut shard, now, a, 0)), None);
    assert_eq!(sense(&tur(&mut shard, now, b, 0)), STANDBY);
    // A standby port still answers INQUIRY (implicit and explicit ALUA,
    // its own group in VPD 83h), REPORT TARGET PORT GROUPS and MODE SENSE;
    // a read is refused.
    let (r, inq) = run(&mut shard, now, b, &[0x12, 0, 0, 0, 96, 0]);
    assert_eq!((sense(&r), inq[5] & 0x30), (None, 0x30));
    let (_, vpd) = run(&mut shard, now, b, &[0x12, 1, 0x83, 0, 96, 0]);
    let mut tpg = None;
    let mut i = 4;
    while i + 4 <= vpd.len() {
        let len = vpd[i + 3] as usize;
        if vpd[i + 1] & 0x3f == 0x15 {
            tpg = Some(u16::from_be_bytes([vpd[i + 6], vpd[i + 7]]));
        }
        i += 4 + len;
    }
    assert_eq!(tpg, Some(2), "{vpd:02x?}");
    let rtpg = [0xa3, 0x0a, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0];
    let (r, _) = run(&mut shard, now, b, &rtpg);
    assert_eq!(sense(&r), None);
    let (r, _) = run(&mut shard, now, b, &[0x1a, 0x08, 0x3f, 0, 96, 0]);
    assert_eq!(sense(&r), None);
    let (r, _) = run(&mut shard, now, b, &[0x28, 0, 0, 0, 0, 0, 0, 0, 1, 0]);
    assert_eq!(sense(&r), STANDBY);
    // SET TARGET PORT GROUPS through A: B's group active/optimized, A's
    // standby. A (which asked) gets no unit attention; B gets the AEN at
    // once and the unit attention on its next command.
    let stpg = [0xa4, 0x0a, 0, 0, 0, 0, 0, 0, 0, 12, 0, 0];
    let params = [0, 0, 0, 0, 0x00, 0, 0, 2, 0x02, 0, 0, 1];
    assert_eq!(sense(&run_out(&mut shard, now, a, &stpg, &params)), None);
    assert_eq!(dg.state_of_port(2), AccessState::ActiveOptimized);
    shard.poll(now);
    let mut aen = None;
    {
        let mut s = shard.session(b).unwrap();
        while let Some(act) = s.poll_action() {
            if let Action::Aen { sense, .. } = act {
                aen = Some(sense);
            }
        }
    }
    assert_eq!(aen, Some(Sense::ASYMMETRIC_ACCESS_STATE_CHANGED));
    assert_eq!(sense(&tur(&mut shard, now, a, 0)), STANDBY);
    assert_eq!(sense(&tur(&mut shard, now, b, 0)), CHANGED);
    assert_eq!(sense(&tur(&mut shard, now, b, 0)), None);
    // Offline is not a state SET TARGET PORT GROUPS may ask for; nothing
    // changes.
    let bad = [0, 0, 0, 0, 0x0e, 0, 0, 2];
    let mut stpg8 = stpg;
    stpg8[9] = 8;
    assert_eq!(
        sense(&run_out(&mut shard, now, b, &stpg8, &bad)),
        Some((5, 0x26, 0x00))
    );
    assert_eq!(dg.state_of_port(2), AccessState::ActiveOptimized);
    // REPORT SUPPORTED OPERATION CODES lists it for a device in a group.
    let (r, _) = run(
        &mut shard,
        now,
        b,
        &[0xa3, 0x0c, 0x02, 0xa4, 0, 0x0a, 0, 0, 0, 64, 0, 0],
    );
    assert_eq!(sense(&r), None, "listed on a device in a group");
    // Where a cluster owns the states: implicit ALUA only, no SET TARGET
    // PORT GROUPS.
    dg.set_explicit(false);
    let (_, inq) = run(&mut shard, now, b, &[0x12, 0, 0, 0, 96, 0]);
    assert_eq!(inq[5] & 0x30, 0x10);
    let params = [0, 0, 0, 0, 0x02, 0, 0, 2];
    assert_eq!(
        sense(&run_out(&mut shard, now, b, &stpg8, &params)),
        Some((5, 0x20, 0x00))
    );
    assert_eq!(dg.state_of_port(2), AccessState::ActiveOptimized);
}

#[test]
fn a_reservation_a_shared_store_cannot_take_fails_and_is_undone() {
    use crate::pr::PrStore;
    use std::sync::atomic::{AtomicBool, Ordering};
    #[derive(Debug, Default)]
    struct Cluster {
        down: AtomicBool,
        saved: std::sync::Mutex<Vec<u8>>,
    }
    impl PrStore for Cluster {
        fn save(&self, b: &[u8]) -> std::io::Result<()> {
            if self.down.load(Ordering::Acquire) {
                return Err(std::io::Error::other("etcd unreachable"));
            }
            *self.saved.lock().unwrap() = b.to_vec();
            Ok(())
        }
        fn shared(&self) -> bool {
            true
        }
        fn load(&self) -> Option<std::io::Result<Vec<u8>>> {
            if self.down.load(Ordering::Acquire) {
                return Some(Err(std::io::Error::other("etcd unreachable")));
            }
            Some(Ok(self.saved.lock().unwrap().clone()))
        }
    }
    let (dev, map) = removable_map(DeviceFlags::default());
    let store = Arc::new(Cluster::default());
    dev.set_pr_store(store.clone());
    let mut shard = Shard::new(0, BufPool::new(4096, 8));
    let now = Instant::now();
    let a = shard.open_session(now, nexus(1), map, false);
    tur(&mut shard, now, a, 0);
    // REGISTER key 0x11 (no APTPL): saved all the same, APTPL off.
    let register = [0x5f, 0, 0, 0, 0, 0, 0, 0, 24, 0];
    let mut p = [0u8; 24];
    p[8..16].copy_from_slice(&0x11u64.to_be_bytes());
    assert_eq!(sense(&run_out(&mut shard, now, a, &register, &p)), None);
    let saved = crate::pr::PrState::decode(&store.saved.lock().unwrap()).unwrap();
    assert_eq!((saved.regs.len(), saved.aptpl), (1, false));
    // The store down: RESERVE fails with a sense at once and holds nothing.
    store.down.store(true, Ordering::Release);
    let reserve = [0x5f, 1, 0x01, 0, 0, 0, 0, 0, 24, 0];
    let mut p = [0u8; 24];
    p[0..8].copy_from_slice(&0x11u64.to_be_bytes());
    assert_eq!(
        sense(&run_out(&mut shard, now, a, &reserve, &p)),
        Some((0xb, 0x08, 0x00))
    );
    assert!(dev.reservations().res.is_none());
    store.down.store(false, Ordering::Release);
    assert_eq!(sense(&run_out(&mut shard, now, a, &reserve, &p)), None);
    assert!(dev.reservations().res.is_some());
    // Another target released and registered a second key: PERSISTENT
    // RESERVE IN reports the store's state, not what this core last saw.
    let mut other = crate::pr::PrState::decode(&store.saved.lock().unwrap()).unwrap();
    other.res = None;
    let mut second = other.regs[0].clone();
    second.key = 0x22;
    second.nexus.initiator_port.push('x');
    other.regs.push(second);
    *store.saved.lock().unwrap() = other.encode();
    let read_keys = [0x5e, 0, 0, 0, 0, 0, 0, 0, 96, 0];
    let (r, keys) = run(&mut shard, now, a, &read_keys);
    assert_eq!(sense(&r), None);
    assert_eq!(
        u32::from_be_bytes(keys[4..8].try_into().unwrap()),
        16,
        "{keys:02x?}"
    );
    assert!(dev.reservations().res.is_none());
    // The store down: PERSISTENT RESERVE IN fails rather than report what
    // may be stale.
    store.down.store(true, Ordering::Release);
    let (r, _) = run(&mut shard, now, a, &read_keys);
    assert_eq!(sense(&r), Some((0xb, 0x08, 0x00)));
}
