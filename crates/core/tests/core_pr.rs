//! Persistent reservation scenarios through the core's public API, the way
//! the daemon and a fabric drive it: APTPL state saved through a
//! [`DirStore`] and restored into a fresh device (what ferrited must do at
//! start), and PREEMPT AND ABORT aborting the preempted nexus's queued
//! commands.

#![allow(clippy::unwrap_used)]

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use ferrite_core::backend::{
    Backend, BackendError, BackendQueue, BlockDone, BlockOp, Busy, Caps, Geometry,
};
use ferrite_core::device::{Device, DeviceFlags, DeviceId, Identity, LunEntry, LunMap};
use ferrite_core::pr::DirStore;
use ferrite_core::{
    Action, Cdb, CmdRequest, DataDir, Nexus, Response, SessionId, Shard, TaskAttr, TaskTag,
};
use ferrite_reactor::buf::BufPool;
use ferrite_scsi::{Lun, Status};

/// A backend whose completions are held until released.
struct Held {
    hold: Arc<Mutex<bool>>,
}
struct HeldQ {
    hold: Arc<Mutex<bool>>,
    pending: VecDeque<(u64, BlockOp)>,
}
impl Backend for Held {
    fn geometry(&self) -> Geometry {
        Geometry {
            block_size: 512,
            num_blocks: 1024,
            phys_exp: 0,
        }
    }
    fn caps(&self) -> Caps {
        Caps::default()
    }
    fn open_queue(&self, _depth: u32) -> Result<Box<dyn BackendQueue>, BackendError> {
        Ok(Box::new(HeldQ {
            hold: self.hold.clone(),
            pending: VecDeque::new(),
        }))
    }
}
impl BackendQueue for HeldQ {
    fn submit(&mut self, tag: u64, op: BlockOp) -> Result<(), Busy<BlockOp>> {
        self.pending.push_back((tag, op));
        Ok(())
    }
    fn poll(&mut self, out: &mut Vec<BlockDone>) {
        if *self.hold.lock().unwrap() {
            return;
        }
        while let Some((tag, op)) = self.pending.pop_front() {
            let buf = match op {
                BlockOp::Read { buf, .. } | BlockOp::Write { buf, .. } => Some(buf),
                _ => None,
            };
            out.push(BlockDone {
                tag,
                result: Ok(()),
                buf,
                pipe: None,
            });
        }
    }
    fn in_flight(&self) -> usize {
        self.pending.len()
    }
}

fn device(hold: &Arc<Mutex<bool>>) -> Arc<Device> {
    Arc::new(Device::new(
        DeviceId(7),
        "pr0",
        Arc::new(Held { hold: hold.clone() }),
        Identity {
            vendor: "FERRITE".into(),
            product: "pr".into(),
            revision: "0.1".into(),
            serial: "PR0".into(),
            naa: u64::to_be_bytes(0x5001_4050_0000_0007).to_vec(),
            eui64: Vec::new(),
            ..Identity::default()
        },
        DeviceFlags::default(),
    ))
}

fn map(dev: &Arc<Device>) -> Arc<LunMap> {
    let mut m = LunMap::default();
    m.luns.insert(
        Lun(0),
        LunEntry {
            device: dev.clone(),
            read_only: false,
        },
    );
    Arc::new(m)
}

fn nexus(i: u8) -> Nexus {
    Nexus {
        initiator: format!("iqn.2026-01.test:i{i}"),
        initiator_port: format!("iqn.2026-01.test:i{i},i,0x00023d00000{i}"),
        target: "iqn.2026-01.test:t".into(),
        rel_port_id: 1,
        target_port: String::new(),
        protocol: None,
    }
}

struct T {
    shard: Shard,
    now: Instant,
    tag: u64,
}

impl T {
    fn submit(
        &mut self,
        sid: SessionId,
        cdb: &[u8],
        dir: DataDir,
        len: u32,
    ) -> ferrite_core::CmdId {
        self.tag += 1;
        let req = CmdRequest {
            lun: Lun(0),
            lun_raw: Lun(0).encode(),
            tag: TaskTag(self.tag),
            cdb: Cdb::from_slice(cdb),
            attr: TaskAttr::Simple,
            dir,
            expected_len: len,
            expected_read_len: 0,
        };
        self.shard.session(sid).unwrap().submit(self.now, req)
    }

    fn run(&mut self, sid: SessionId, cdb: &[u8], dir: DataDir, len: u32, data: &[u8]) -> Response {
        let id = self.submit(sid, cdb, dir, len);
        for _ in 0..50 {
            let mut s = self.shard.session(sid).unwrap();
            while let Some(a) = s.poll_action() {
                match a {
                    Action::FetchData { id: i, mut buf, .. } => {
                        buf.copy_in(0, data);
                        s.data_out_done(i, Ok(buf));
                    }
                    Action::Respond { id: i, rsp, .. } if i == id => {
                        s.response_sent(i);
                        return rsp;
                    }
                    _ => {}
                }
            }
            self.shard.poll(self.now);
        }
        panic!("no response")
    }

    fn prout(
        &mut self,
        sid: SessionId,
        sa: u8,
        rtype: u8,
        key: u64,
        sakey: u64,
        aptpl: bool,
    ) -> Response {
        let mut p = [0u8; 24];
        p[0..8].copy_from_slice(&key.to_be_bytes());
        p[8..16].copy_from_slice(&sakey.to_be_bytes());
        p[20] = u8::from(aptpl);
        self.run(
            sid,
            &[0x5f, sa, rtype, 0, 0, 0, 0, 0, 24, 0],
            DataDir::Write,
            24,
            &p,
        )
    }

    fn clear_ua(&mut self, sid: SessionId) {
        for _ in 0..4 {
            if self.run(sid, &[0; 6], DataDir::None, 0, &[]).status == Status::GOOD {
                return;
            }
        }
    }
}

fn new_t() -> T {
    T {
        shard: Shard::new(0, BufPool::new(4096, 64)),
        now: Instant::now(),
        tag: 0,
    }
}

#[test]
fn aptpl_state_survives_a_restart_through_the_store() {
    let dir = std::env::temp_dir().join(format!("ferrite-core-pr-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let store = Arc::new(DirStore { dir: dir.clone() });
    let hold = Arc::new(Mutex::new(false));
    {
        let dev = device(&hold);
        dev.set_pr_store(store.clone());
        let mut t = new_t();
        let a = t.shard.open_session(t.now, nexus(1), map(&dev), false);
        let b = t.shard.open_session(t.now, nexus(2), map(&dev), false);
        t.clear_ua(a);
        t.clear_ua(b);
        // REGISTER AND IGNORE EXISTING KEY with APTPL, then RESERVE
        // (EXCLUSIVE ACCESS).
        assert_eq!(t.prout(a, 6, 0, 0, 0xaaaa, true).status, Status::GOOD);
        assert_eq!(t.prout(b, 6, 0, 0, 0xbbbb, true).status, Status::GOOD);
        assert_eq!(t.prout(a, 1, 3, 0xaaaa, 0, true).status, Status::GOOD);
    }
    // "Restart": a fresh device and shard, the state read back from the
    // directory.
    let saved = store.load().unwrap().expect("state saved");
    let dev = device(&hold);
    assert!(dev.restore_reservations(&saved));
    let mut t = new_t();
    let a = t.shard.open_session(t.now, nexus(1), map(&dev), false);
    let b = t.shard.open_session(t.now, nexus(2), map(&dev), false);
    t.clear_ua(a);
    t.clear_ua(b);
    // READ KEYS: both keys; READ RESERVATION: A's key, EXCLUSIVE ACCESS.
    let r = t.run(
        a,
        &[0x5e, 0, 0, 0, 0, 0, 0, 0, 64, 0],
        DataDir::Read,
        64,
        &[],
    );
    let d = r.data.as_ref().unwrap().to_vec();
    assert_eq!(&d[4..8], &16u32.to_be_bytes());
    assert_eq!(&d[8..16], &0xaaaau64.to_be_bytes());
    assert_eq!(&d[16..24], &0xbbbbu64.to_be_bytes());
    let r = t.run(
        a,
        &[0x5e, 1, 0, 0, 0, 0, 0, 0, 64, 0],
        DataDir::Read,
        64,
        &[],
    );
    let d = r.data.as_ref().unwrap().to_vec();
    assert_eq!(&d[8..16], &0xaaaau64.to_be_bytes());
    assert_eq!(d[21], 3);
    // B is registered but not the holder of an EXCLUSIVE ACCESS: conflict.
    let r = t.run(
        b,
        &[0x28, 0, 0, 0, 0, 0, 0, 0, 1, 0],
        DataDir::Read,
        512,
        &[],
    );
    assert_eq!(r.status, Status::RESERVATION_CONFLICT);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn preempt_and_abort_aborts_the_preempted_nexus_queued_commands() {
    let hold = Arc::new(Mutex::new(false));
    let dev = device(&hold);
    let mut t = new_t();
    let a = t.shard.open_session(t.now, nexus(1), map(&dev), false);
    let b = t.shard.open_session(t.now, nexus(2), map(&dev), false);
    t.clear_ua(a);
    t.clear_ua(b);
    assert_eq!(t.prout(a, 6, 0, 0, 0xa, false).status, Status::GOOD);
    assert_eq!(t.prout(b, 6, 0, 0, 0xb, false).status, Status::GOOD);
    assert_eq!(t.prout(b, 1, 1, 0xb, 0, false).status, Status::GOOD);
    // B queues reads the backend holds.
    *hold.lock().unwrap() = true;
    for lba in 0..4u8 {
        t.submit(b, &[0x28, 0, 0, 0, 0, lba, 0, 0, 1, 0], DataDir::Read, 512);
    }
    // A preempts B's reservation and aborts its tasks.
    let mut p = [0u8; 24];
    p[0..8].copy_from_slice(&0xau64.to_be_bytes());
    p[8..16].copy_from_slice(&0xbu64.to_be_bytes());
    let id = t.submit(a, &[0x5f, 5, 3, 0, 0, 0, 0, 0, 24, 0], DataDir::Write, 24);
    let act = t.shard.session(a).unwrap().poll_action();
    let Some(Action::FetchData { mut buf, .. }) = act else {
        panic!("{act:?}")
    };
    buf.copy_in(0, &p);
    t.shard.session(a).unwrap().data_out_done(id, Ok(buf));
    let act = t.shard.session(a).unwrap().poll_action();
    let Some(Action::Respond { rsp, .. }) = act else {
        panic!("{act:?}")
    };
    assert_eq!(rsp.status, Status::GOOD);
    *hold.lock().unwrap() = false;
    for _ in 0..5 {
        t.shard.poll(t.now);
    }
    // The daemon is told, to abort B's tasks on the other cores too.
    let mut pre = Vec::new();
    t.shard.drain_preempted(&mut pre);
    assert_eq!(pre.len(), 1);
    assert_eq!(pre[0].0, DeviceId(7));
    assert_eq!(pre[0].1[0].initiator_port, nexus(2).initiator_port);
    // None of B's reads answers: they were aborted (SAM-5 §7.2).
    let mut s = t.shard.session(b).unwrap();
    assert!(std::iter::from_fn(|| s.poll_action()).next().is_none());
    assert_eq!(t.shard.stats().sessions[&b].active, 0);
    // B's next command sees REGISTRATIONS PREEMPTED, then the conflict.
    let r = t.run(b, &[0; 6], DataDir::None, 0, &[]);
    let sense = r.sense.unwrap();
    assert_eq!((sense[2] & 0xf, sense[12], sense[13]), (0x06, 0x2a, 0x05));
    let r = t.run(
        b,
        &[0x28, 0, 0, 0, 0, 0, 0, 0, 1, 0],
        DataDir::Read,
        512,
        &[],
    );
    assert_eq!(r.status, Status::RESERVATION_CONFLICT);
}
