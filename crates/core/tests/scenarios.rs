//! Scenario tests: a `Shard` driven through its public API the way a fabric
//! and a reactor drive it, over an in-memory backend that completes on the
//! next poll and can be made to hold, refuse (Busy) or fail operations. The
//! expectations mirror libiscsi's iscsi-test-cu suites (SCSI.Inquiry,
//! SCSI.ReadCapacity*, SCSI.Read*/Write*, SCSI.Mandatory, iSCSI.iSCSIResiduals).

#![allow(clippy::unwrap_used)] // a test crate: a failed lock or lookup is a failed test

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use ferrite_core::backend::{
    Backend, BackendError, BackendQueue, BlockDone, BlockError, BlockOp, Busy, Caps, Geometry,
};
use ferrite_core::device::{Device, DeviceFlags, DeviceId, Identity, LunEntry, LunMap};
use ferrite_core::{
    Action, Cdb, CmdId, CmdRequest, DataDir, Nexus, ResetScope, Residual, Response, SessionId,
    Shard, TaskAttr, TaskTag, TmfFunction, TmfRequest, TmfResponse,
};
use ferrite_reactor::buf::BufPool;
use ferrite_scsi::{Lun, Status};

const BS: u32 = 512;
const BLOCKS: u64 = 1024;

/// What the in-memory backend is told to do, shared with the test.
#[derive(Default)]
struct Ctl {
    data: Vec<u8>,
    /// Queue depth; submit beyond it is Busy.
    depth: usize,
    /// Completions are withheld while set.
    hold: bool,
    /// The next completion fails with this.
    fail_next: Option<BlockError>,
    /// Refuse to open queues.
    refuse_open: bool,
    /// Every op submitted, in order: ("R"|"W"|"F", offset, len, fua).
    log: Vec<(&'static str, u64, usize, bool)>,
    busy_count: usize,
    caps: Caps,
    /// Blocks deallocated by Unmap (for `mapping`).
    dealloc: Vec<bool>,
}

struct MemBackend {
    ctl: Arc<Mutex<Ctl>>,
}

struct MemQueue {
    ctl: Arc<Mutex<Ctl>>,
    pending: VecDeque<(u64, BlockOp)>,
}

impl Backend for MemBackend {
    fn geometry(&self) -> Geometry {
        let n = self.ctl.lock().unwrap().data.len() as u64 / BS as u64;
        Geometry {
            block_size: BS,
            num_blocks: n,
            phys_exp: 0,
        }
    }
    fn caps(&self) -> Caps {
        self.ctl.lock().unwrap().caps
    }
    fn mapping(&self, offset: u64, len: u64) -> Option<(bool, u64)> {
        let c = self.ctl.lock().unwrap();
        let first = (offset / BS as u64) as usize;
        let last = ((offset + len) / BS as u64) as usize;
        let state = *c.dealloc.get(first)?;
        let run = c.dealloc[first..last]
            .iter()
            .take_while(|&&d| d == state)
            .count();
        Some((!state, run as u64 * BS as u64))
    }
    fn open_queue(&self, _depth: u32) -> Result<Box<dyn BackendQueue>, BackendError> {
        if self.ctl.lock().unwrap().refuse_open {
            return Err(BackendError::Invalid("refused".into()));
        }
        Ok(Box::new(MemQueue {
            ctl: self.ctl.clone(),
            pending: VecDeque::new(),
        }))
    }
}

impl BackendQueue for MemQueue {
    fn submit(&mut self, tag: u64, op: BlockOp) -> Result<(), Busy<BlockOp>> {
        let mut c = self.ctl.lock().unwrap();
        if self.pending.len() >= c.depth {
            c.busy_count += 1;
            return Err(Busy(op));
        }
        let e = match &op {
            BlockOp::Read { offset, buf } => ("R", *offset, buf.len(), false),
            BlockOp::ReadPipe { offset, len, .. } => ("P", *offset, *len as usize, false),
            BlockOp::Write { offset, buf, fua } => ("W", *offset, buf.len(), *fua),
            BlockOp::Flush => ("F", 0, 0, false),
            BlockOp::Unmap { offset, len } => ("U", *offset, *len as usize, false),
            BlockOp::WriteZeroes { offset, len } => ("Z", *offset, *len as usize, false),
        };
        c.log.push(e);
        self.pending.push_back((tag, op));
        Ok(())
    }

    fn poll(&mut self, out: &mut Vec<BlockDone>) {
        let mut c = self.ctl.lock().unwrap();
        if c.hold {
            return;
        }
        while let Some((tag, op)) = self.pending.pop_front() {
            let fail = c.fail_next.take();
            let (buf, result) = match op {
                BlockOp::ReadPipe {
                    offset,
                    len,
                    mut pipe,
                } => {
                    let o = offset as usize;
                    if fail.is_none() {
                        pipe.fill(&c.data[o..o + len as usize]).unwrap();
                    }
                    out.push(BlockDone {
                        tag,
                        result: fail.map_or(Ok(()), Err),
                        buf: None,
                        pipe: Some(pipe),
                    });
                    continue;
                }
                BlockOp::Read { offset, mut buf } => {
                    let o = offset as usize;
                    let n = buf.len();
                    if fail.is_none() {
                        buf.copy_in(0, &c.data[o..o + n]);
                    }
                    (Some(buf), fail.map_or(Ok(()), Err))
                }
                BlockOp::Write { offset, buf, .. } => {
                    if fail.is_none() {
                        let o = offset as usize;
                        let v = buf.to_vec();
                        c.data[o..o + v.len()].copy_from_slice(&v);
                        let b = o / BS as usize;
                        c.dealloc[b..b + v.len() / BS as usize].fill(false);
                    }
                    (Some(buf), fail.map_or(Ok(()), Err))
                }
                op @ (BlockOp::Unmap { .. } | BlockOp::WriteZeroes { .. }) => {
                    let (offset, len, unmap) = match op {
                        BlockOp::Unmap { offset, len } => (offset, len, true),
                        BlockOp::WriteZeroes { offset, len } => (offset, len, false),
                        _ => unreachable!(),
                    };
                    if fail.is_none() {
                        let (o, n) = (offset as usize, len as usize);
                        c.data[o..o + n].fill(0);
                        let b = o / BS as usize;
                        c.dealloc[b..b + n / BS as usize].fill(unmap);
                    }
                    (None, fail.map_or(Ok(()), Err))
                }
                BlockOp::Flush => (None, fail.map_or(Ok(()), Err)),
            };
            out.push(BlockDone {
                tag,
                result,
                buf,
                pipe: None,
            });
        }
    }

    fn in_flight(&self) -> usize {
        self.pending.len()
    }
}

struct H {
    shard: Shard,
    sid: SessionId,
    now: Instant,
    ctl: Arc<Mutex<Ctl>>,
    dev: Arc<Device>,
    map: Arc<LunMap>,
    next_tag: u64,
}

fn device(ctl: &Arc<Mutex<Ctl>>, flags: DeviceFlags) -> Arc<Device> {
    Arc::new(Device::new(
        DeviceId(1),
        "disk1",
        Arc::new(MemBackend { ctl: ctl.clone() }),
        Identity {
            vendor: "FERRITE".into(),
            product: "mem disk".into(),
            revision: "0.1".into(),
            serial: "SN0001".into(),
            naa: u64::to_be_bytes(0x5001_4050_0000_0001).to_vec(),
            eui64: Vec::new(),
            ..Identity::default()
        },
        flags,
    ))
}

fn nexus(isid: u32) -> Nexus {
    Nexus {
        initiator: "iqn.2026-01.test:init".into(),
        initiator_port: format!("iqn.2026-01.test:init,i,0x{isid:012x}"),
        target: "iqn.2026-01.test:target".into(),
        rel_port_id: 1,
        target_port: String::new(),
        protocol: None,
    }
}

impl H {
    fn with(flags: DeviceFlags, map_ro: bool) -> H {
        H::build(
            flags,
            map_ro,
            BLOCKS,
            Caps {
                write_cache: true,
                fua: true,
                ..Caps::default()
            },
        )
    }

    fn build(flags: DeviceFlags, map_ro: bool, blocks: u64, caps: Caps) -> H {
        let ctl = Arc::new(Mutex::new(Ctl {
            data: vec![0u8; (blocks * BS as u64) as usize],
            dealloc: vec![false; blocks as usize],
            depth: 128,
            caps,
            ..Ctl::default()
        }));
        let dev = device(&ctl, flags);
        let mut map = LunMap::default();
        map.luns.insert(
            Lun(0),
            LunEntry {
                device: dev.clone(),
                read_only: map_ro,
            },
        );
        let map = Arc::new(map);
        let now = Instant::now();
        let mut shard = Shard::new(0, BufPool::new(4096, 64));
        let sid = shard.open_session(now, nexus(1), map.clone(), true);
        H {
            shard,
            sid,
            now,
            ctl,
            dev,
            map,
            next_tag: 1,
        }
    }

    fn new() -> H {
        H::with(DeviceFlags::default(), false)
    }

    /// A fresh harness whose POWER ON unit attention is consumed.
    fn ready() -> H {
        let mut h = H::new();
        let r = h.run(&[0, 0, 0, 0, 0, 0], DataDir::None, 0, &[]);
        assert_eq!(sense_of(&r), (0x06, 0x29, 0x00));
        h
    }

    fn req(&mut self, lun: u16, cdb: &[u8], dir: DataDir, len: u32, attr: TaskAttr) -> CmdRequest {
        let tag = TaskTag(self.next_tag);
        self.next_tag += 1;
        CmdRequest {
            lun: Lun(lun),
            lun_raw: Lun(lun).encode(),
            tag,
            cdb: Cdb::from_slice(cdb),
            attr,
            dir,
            expected_len: len,
            expected_read_len: 0,
        }
    }

    fn submit(&mut self, cdb: &[u8], dir: DataDir, len: u32, attr: TaskAttr) -> CmdId {
        let r = self.req(0, cdb, dir, len, attr);
        self.shard.session(self.sid).unwrap().submit(self.now, r)
    }

    fn actions(&mut self) -> Vec<Action> {
        let mut s = self.shard.session(self.sid).unwrap();
        std::iter::from_fn(|| s.poll_action()).collect()
    }

    /// Runs one command to its response, supplying `data` as write data
    /// (truncated or padded to what FetchData asks for).
    fn run(&mut self, cdb: &[u8], dir: DataDir, len: u32, data: &[u8]) -> Response {
        self.run_lun(0, cdb, dir, len, data)
    }

    fn run_lun(&mut self, lun: u16, cdb: &[u8], dir: DataDir, len: u32, data: &[u8]) -> Response {
        let r = self.req(lun, cdb, dir, len, TaskAttr::Simple);
        let id = self.shard.session(self.sid).unwrap().submit(self.now, r);
        for _ in 0..100 {
            for a in self.actions() {
                match a {
                    Action::FetchData {
                        id: i,
                        mut buf,
                        offset,
                        len,
                        ..
                    } => {
                        assert_eq!(i, id);
                        assert_eq!(buf.len(), len as usize);
                        // A large write is fetched a chunk at a time.
                        let from = (offset as usize).min(data.len());
                        let to = (offset as usize + len as usize).min(data.len());
                        buf.copy_in(0, &data[from..to]);
                        self.shard
                            .session(self.sid)
                            .unwrap()
                            .data_out_done(id, Ok(buf));
                    }
                    Action::Respond { id: i, rsp, .. } => {
                        assert_eq!(i, id);
                        self.shard.session(self.sid).unwrap().response_sent(id);
                        return rsp;
                    }
                    other => panic!("unexpected action {other:?}"),
                }
            }
            self.shard.poll(self.now);
        }
        panic!("command did not complete");
    }

    fn poll(&mut self) {
        self.shard.poll(self.now);
    }
}

fn sense_of(r: &Response) -> (u8, u8, u8) {
    assert_eq!(r.status, Status::CHECK_CONDITION, "{r:?}");
    let s = r.sense.as_ref().expect("sense data");
    (s[2] & 0x0f, s[12], s[13])
}

fn data_of(r: &Response) -> Vec<u8> {
    match &r.data {
        Some(d) => d.to_vec()[..r.data_len as usize].to_vec(),
        None => Vec::new(),
    }
}

fn good(r: &Response) {
    assert_eq!(r.status, Status::GOOD, "{r:?}");
}

fn rw10(op: u8, lba: u32, blocks: u16, flags: u8) -> [u8; 10] {
    let mut c = [0u8; 10];
    c[0] = op;
    c[1] = flags;
    c[2..6].copy_from_slice(&lba.to_be_bytes());
    c[7..9].copy_from_slice(&blocks.to_be_bytes());
    c
}

fn rw12(op: u8, lba: u32, blocks: u32) -> [u8; 12] {
    let mut c = [0u8; 12];
    c[0] = op;
    c[2..6].copy_from_slice(&lba.to_be_bytes());
    c[6..10].copy_from_slice(&blocks.to_be_bytes());
    c
}

fn rw16(op: u8, lba: u64, blocks: u32) -> [u8; 16] {
    let mut c = [0u8; 16];
    c[0] = op;
    c[2..10].copy_from_slice(&lba.to_be_bytes());
    c[10..14].copy_from_slice(&blocks.to_be_bytes());
    c
}

fn inquiry(evpd: bool, page: u8, alloc: u16) -> [u8; 6] {
    let a = alloc.to_be_bytes();
    [0x12, evpd as u8, page, a[0], a[1], 0]
}

fn pattern(n: usize, seed: u8) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(7).wrapping_add(seed))
        .collect()
}

// ----- unit attentions -----

#[test]
fn unit_attention_on_first_command_then_cleared() {
    let mut h = H::new();
    // INQUIRY and REPORT LUNS pass a pending UA without clearing it.
    good(&h.run(&inquiry(false, 0, 96), DataDir::Read, 96, &[]));
    let rl = [0xa0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0];
    good(&h.run(&rl, DataDir::Read, 256, &[]));
    let r = h.run(&[0; 6], DataDir::None, 0, &[]);
    assert_eq!(sense_of(&r), (0x06, 0x29, 0x00));
    good(&h.run(&[0; 6], DataDir::None, 0, &[]));
}

#[test]
fn request_sense_reports_and_clears_unit_attention() {
    let mut h = H::new();
    let r = h.run(&[0x03, 0, 0, 0, 252, 0], DataDir::Read, 252, &[]);
    good(&r);
    let d = data_of(&r);
    assert_eq!(d.len(), 18);
    assert_eq!((d[0], d[2], d[12], d[13]), (0x70, 0x06, 0x29, 0x00));
    assert_eq!(r.residual, Residual::Underflow(252 - 18));
    good(&h.run(&[0; 6], DataDir::None, 0, &[]));
    // Nothing pending: NO SENSE, in descriptor format when DESC = 1.
    let r = h.run(&[0x03, 1, 0, 0, 252, 0], DataDir::Read, 252, &[]);
    assert_eq!(data_of(&r), [0x72, 0, 0, 0, 0, 0, 0, 0]);
}

#[test]
fn capacity_change_raises_unit_attention_once() {
    let mut h = H::ready();
    h.dev.set_num_blocks(BLOCKS / 2);
    let r = h.run(&[0; 6], DataDir::None, 0, &[]);
    assert_eq!(sense_of(&r), (0x06, 0x2a, 0x09));
    good(&h.run(&[0; 6], DataDir::None, 0, &[]));
    let r = h.run(&[0x25, 0, 0, 0, 0, 0, 0, 0, 0, 0], DataDir::Read, 8, &[]);
    assert_eq!(&data_of(&r)[..4], &((BLOCKS / 2 - 1) as u32).to_be_bytes());
}

#[test]
fn lun_map_change_raises_unit_attention_and_aen() {
    let mut h = H::ready();
    let mut m = (*h.map).clone();
    m.luns.insert(
        Lun(1),
        LunEntry {
            device: h.dev.clone(),
            read_only: true,
        },
    );
    h.shard.set_luns(h.sid, Arc::new(m));
    let mut ready = Vec::new();
    h.shard.ready_sessions(&mut ready);
    assert_eq!(ready, vec![h.sid]);
    let a = h.actions();
    assert!(
        matches!(&a[..], [Action::Aen { sense, .. }] if sense.asc == 0x3f && sense.ascq == 0x0e)
    );
    let r = h.run(&[0; 6], DataDir::None, 0, &[]);
    assert_eq!(sense_of(&r), (0x06, 0x3f, 0x0e));
    let r = h.run_lun(1, &[0; 6], DataDir::None, 0, &[]);
    assert_eq!(sense_of(&r), (0x06, 0x3f, 0x0e));
    good(&h.run_lun(1, &[0; 6], DataDir::None, 0, &[]));
    // LUN 1 is a read-only mapping.
    let r = h.run_lun(1, &rw10(0x2a, 0, 1, 0), DataDir::Write, BS, &[0; 512]);
    assert_eq!(sense_of(&r), (0x07, 0x27, 0x00));
}

#[test]
fn replaced_lun_and_new_identity_raise_inquiry_data_has_changed() {
    let mut h = H::ready();
    // The same device with a new serial on LUN 0, a new LUN 1: LUN 0
    // reports both changes, LUN 1 only the map's.
    let mut identity = h.dev.identity.clone();
    identity.serial = "other".into();
    let new = Arc::new(h.dev.reconfigured(identity, h.dev.flags));
    let mut m = (*h.map).clone();
    m.luns.insert(
        Lun(0),
        LunEntry {
            device: new.clone(),
            read_only: false,
        },
    );
    m.luns.insert(
        Lun(1),
        LunEntry {
            device: h.dev.clone(),
            read_only: false,
        },
    );
    h.shard.set_luns(h.sid, Arc::new(m.clone()));
    assert_eq!(h.actions().len(), 1, "one AEN");
    let r = h.run(&[0; 6], DataDir::None, 0, &[]);
    assert_eq!(sense_of(&r), (0x06, 0x3f, 0x0e));
    let r = h.run(&[0; 6], DataDir::None, 0, &[]);
    assert_eq!(sense_of(&r), (0x06, 0x3f, 0x03));
    good(&h.run(&[0; 6], DataDir::None, 0, &[]));
    let r = h.run_lun(1, &[0; 6], DataDir::None, 0, &[]);
    assert_eq!(sense_of(&r), (0x06, 0x3f, 0x0e));
    good(&h.run_lun(1, &[0; 6], DataDir::None, 0, &[]));
    // The same map again: nothing about INQUIRY data.
    h.shard.set_luns(h.sid, Arc::new(m));
    assert_eq!(h.actions().len(), 1, "one AEN");
    let r = h.run(&[0; 6], DataDir::None, 0, &[]);
    assert_eq!(sense_of(&r), (0x06, 0x3f, 0x0e));
    good(&h.run(&[0; 6], DataDir::None, 0, &[]));
}

// ----- reads and writes -----

#[test]
fn write_then_read_back_all_sizes() {
    let mut h = H::ready();
    let d = pattern(3 * BS as usize, 1);
    good(&h.run(&rw10(0x2a, 10, 3, 0), DataDir::Write, 3 * BS, &d));
    let r = h.run(&rw10(0x28, 10, 3, 0), DataDir::Read, 3 * BS, &[]);
    good(&r);
    assert_eq!(r.residual, Residual::None);
    assert_eq!(data_of(&r), d);
    // READ (6), (12), (16) see the same blocks.
    let r = h.run(&[0x08, 0, 0, 11, 1, 0], DataDir::Read, BS, &[]);
    assert_eq!(data_of(&r), &d[512..1024]);
    let r = h.run(&rw12(0xa8, 12, 1), DataDir::Read, BS, &[]);
    assert_eq!(data_of(&r), &d[1024..]);
    let r = h.run(&rw16(0x88, 10, 3), DataDir::Read, 3 * BS, &[]);
    assert_eq!(data_of(&r), d);
    // WRITE (6), (12), (16).
    let d2 = pattern(BS as usize, 9);
    good(&h.run(&[0x0a, 0, 0, 20, 1, 0], DataDir::Write, BS, &d2));
    good(&h.run(&rw12(0xaa, 21, 1), DataDir::Write, BS, &d2));
    good(&h.run(&rw16(0x8a, 22, 1), DataDir::Write, BS, &d2));
    let r = h.run(&rw10(0x28, 20, 3, 0), DataDir::Read, 3 * BS, &[]);
    assert_eq!(data_of(&r), [d2.clone(), d2.clone(), d2].concat());
}

#[test]
fn fua_reaches_the_backend_and_dpo_is_accepted() {
    let mut h = H::ready();
    good(&h.run(&rw10(0x2a, 0, 1, 0x18), DataDir::Write, BS, &[1; 512]));
    good(&h.run(&rw10(0x2a, 0, 1, 0x02), DataDir::Write, BS, &[1; 512]));
    good(&h.run(&rw10(0x28, 0, 1, 0x18), DataDir::Read, BS, &[]));
    let log = h.ctl.lock().unwrap().log.clone();
    assert_eq!(log[0], ("W", 0, 512, true));
    assert_eq!(log[1], ("W", 0, 512, false));
    // Write-through: the core sets FUA on every write, asked for or not
    // (the backend only honours what it is given).
    let mut h = H::with(
        DeviceFlags {
            write_through: true,
            ..Default::default()
        },
        false,
    );
    h.run(&[0; 6], DataDir::None, 0, &[]);
    good(&h.run(&rw10(0x2a, 0, 1, 0x08), DataDir::Write, BS, &[1; 512]));
    good(&h.run(&rw10(0x2a, 0, 1, 0x00), DataDir::Write, BS, &[1; 512]));
    let log = h.ctl.lock().unwrap().log.clone();
    assert_eq!(log[0], ("W", 0, 512, true));
    assert_eq!(log[1], ("W", 0, 512, true));
    // nv_cache: FUA is not passed, and SYNCHRONIZE CACHE does no flush.
    let mut h = H::with(
        DeviceFlags {
            nv_cache: true,
            ..Default::default()
        },
        false,
    );
    h.run(&[0; 6], DataDir::None, 0, &[]);
    good(&h.run(&rw10(0x2a, 0, 1, 0x08), DataDir::Write, BS, &[1; 512]));
    good(&h.run(&[0x35, 0, 0, 0, 0, 0, 0, 0, 0, 0], DataDir::None, 0, &[]));
    assert_eq!(h.ctl.lock().unwrap().log, vec![("W", 0, 512, false)]);
}

#[test]
fn zero_length_transfers_do_no_io() {
    let mut h = H::ready();
    good(&h.run(&rw10(0x28, 0, 0, 0), DataDir::Read, 0, &[]));
    good(&h.run(&rw10(0x2a, 0, 0, 0), DataDir::Write, 0, &[]));
    good(&h.run(&rw16(0x88, 0, 0), DataDir::Read, 0, &[]));
    assert!(h.ctl.lock().unwrap().log.is_empty());
    // READ (6) with 0 means 256 blocks.
    let r = h.run(&[0x08, 0, 0, 0, 0, 0], DataDir::Read, 256 * BS, &[]);
    good(&r);
    assert_eq!(r.data_len, 256 * BS);
}

#[test]
fn out_of_range_lbas() {
    let mut h = H::ready();
    let last = (BLOCKS - 1) as u32;
    good(&h.run(&rw10(0x28, last, 1, 0), DataDir::Read, BS, &[]));
    for (lba, n) in [
        (last, 2u16),
        (last + 1, 1),
        (last + 2, 0),
        (0x8000_0000, 1),
        (u32::MAX, 1),
    ] {
        let r = h.run(&rw10(0x28, lba, n, 0), DataDir::Read, n as u32 * BS, &[]);
        assert_eq!(sense_of(&r), (0x05, 0x21, 0x00), "lba {lba} n {n}");
        let r = h.run(
            &rw10(0x2a, lba, n, 0),
            DataDir::Write,
            n as u32 * BS,
            &[0; 1024],
        );
        assert_eq!(sense_of(&r), (0x05, 0x21, 0x00), "lba {lba} n {n}");
    }
    let r = h.run(&rw16(0x88, u64::MAX, 1), DataDir::Read, BS, &[]);
    assert_eq!(sense_of(&r), (0x05, 0x21, 0x00));
    let r = h.run(&[0x08, 0x1f, 0xff, 0xff, 1, 0], DataDir::Read, BS, &[]);
    assert_eq!(sense_of(&r), (0x05, 0x21, 0x00));
    assert!(h.ctl.lock().unwrap().log.len() == 1);
}

#[test]
fn bad_fields_and_opcodes() {
    let mut h = H::ready();
    for p in 1..8u8 {
        let r = h.run(&rw10(0x28, 0, 1, p << 5), DataDir::Read, BS, &[]);
        assert_eq!(sense_of(&r), (0x05, 0x24, 0x00));
        let s = r.sense.as_ref().unwrap();
        // SKSV, C/D, BPV, bit 7; byte 1.
        assert_eq!((s[15], s[16], s[17]), (0x80 | 0x40 | 0x08 | 7, 0, 1));
        let r = h.run(&rw10(0x2a, 0, 1, p << 5), DataDir::Write, BS, &[0; 512]);
        assert_eq!(sense_of(&r), (0x05, 0x24, 0x00));
    }
    // INQUIRY with EVPD = 0 and a page code.
    let r = h.run(&inquiry(false, 1, 256), DataDir::Read, 256, &[]);
    assert_eq!(sense_of(&r), (0x05, 0x24, 0x00));
    // Unknown VPD page.
    let r = h.run(&inquiry(true, 0x99, 256), DataDir::Read, 256, &[]);
    assert_eq!(sense_of(&r), (0x05, 0x24, 0x00));
    // Unsupported opcode.
    let r = h.run(
        &[0xc5, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
        DataDir::None,
        0,
        &[],
    );
    assert_eq!(sense_of(&r), (0x05, 0x20, 0x00));
    let r = h.run(&[0x04, 0, 0, 0, 0, 0], DataDir::None, 0, &[]);
    assert_eq!(sense_of(&r), (0x05, 0x20, 0x00));
    // NACA in the CONTROL byte.
    let r = h.run(&[0, 0, 0, 0, 0, 4], DataDir::None, 0, &[]);
    assert_eq!(sense_of(&r), (0x05, 0x24, 0x00));
    // MODE SENSE saved values.
    let r = h.run(&[0x1a, 0, 0xff, 0, 255, 0], DataDir::Read, 255, &[]);
    assert_eq!(sense_of(&r), (0x05, 0x39, 0x00));
}

#[test]
fn unmapped_lun() {
    let mut h = H::ready();
    let r = h.run_lun(7, &[0; 6], DataDir::None, 0, &[]);
    assert_eq!(sense_of(&r), (0x05, 0x25, 0x00));
    let r = h.run_lun(7, &rw10(0x28, 0, 1, 0), DataDir::Read, BS, &[]);
    assert_eq!(sense_of(&r), (0x05, 0x25, 0x00));
    let r = h.run_lun(7, &inquiry(false, 0, 96), DataDir::Read, 96, &[]);
    good(&r);
    assert_eq!(data_of(&r)[0], 0x7f);
    let rl = [0xa0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0];
    let r = h.run_lun(7, &rl, DataDir::Read, 256, &[]);
    assert_eq!(
        data_of(&r),
        [&[0, 0, 0, 8, 0, 0, 0, 0][..], &Lun(0).encode()].concat()
    );
    let r = h.run_lun(7, &[0x03, 0, 0, 0, 18, 0], DataDir::Read, 18, &[]);
    let d = data_of(&r);
    assert_eq!((d[2], d[12]), (0x05, 0x25));
}

#[test]
fn read_only_device_refuses_writes() {
    let mut h = H::with(
        DeviceFlags {
            read_only: true,
            ..Default::default()
        },
        false,
    );
    h.run(&[0; 6], DataDir::None, 0, &[]);
    let r = h.run(&rw10(0x2a, 0, 1, 0), DataDir::Write, BS, &[0; 512]);
    assert_eq!(sense_of(&r), (0x07, 0x27, 0x00));
    let r = h.run(&[0x1a, 0, 0x3f, 0, 255, 0], DataDir::Read, 255, &[]);
    assert_eq!(data_of(&r)[2] & 0x80, 0x80);
    good(&h.run(&rw10(0x28, 0, 1, 0), DataDir::Read, BS, &[]));
}

#[test]
fn backend_errors_map_to_sense() {
    let mut h = H::ready();
    let cases = [
        (BlockError::Io, false, (0x03, 0x11, 0x00)),
        (BlockError::Io, true, (0x03, 0x0c, 0x00)),
        (BlockError::NoSpace, true, (0x07, 0x27, 0x07)),
        (BlockError::Offline, false, (0x02, 0x04, 0x00)),
        (BlockError::Os(5), false, (0x04, 0x44, 0x00)),
    ];
    for (e, write, want) in cases {
        h.ctl.lock().unwrap().fail_next = Some(e);
        let r = if write {
            h.run(&rw10(0x2a, 0, 1, 0), DataDir::Write, BS, &[0; 512])
        } else {
            h.run(&rw10(0x28, 0, 1, 0), DataDir::Read, BS, &[])
        };
        assert_eq!(sense_of(&r), want, "{e:?}");
        assert!(r.data.is_none());
    }
}

#[test]
fn queue_open_failure_is_a_check_condition() {
    let mut h = H::ready();
    h.ctl.lock().unwrap().refuse_open = true;
    let r = h.run(&rw10(0x28, 0, 1, 0), DataDir::Read, BS, &[]);
    assert_eq!(sense_of(&r), (0x0b, 0x08, 0x00));
    // It is retried on the next command.
    h.ctl.lock().unwrap().refuse_open = false;
    good(&h.run(&rw10(0x28, 0, 1, 0), DataDir::Read, BS, &[]));
}

#[test]
fn synchronize_cache_flushes_unless_nv_cache() {
    let mut h = H::ready();
    good(&h.run(&[0x35, 0, 0, 0, 0, 0, 0, 0, 0, 0], DataDir::None, 0, &[]));
    good(&h.run(&rw16(0x91, 0, 0), DataDir::None, 0, &[]));
    let r = h.run(&[0x35, 0, 0, 0, 0x10, 0, 0, 0, 1, 0], DataDir::None, 0, &[]);
    assert_eq!(sense_of(&r), (0x05, 0x21, 0x00));
    assert_eq!(h.ctl.lock().unwrap().log.len(), 2);
    assert_eq!(h.ctl.lock().unwrap().log[0].0, "F");
    let mut h = H::with(
        DeviceFlags {
            nv_cache: true,
            ..Default::default()
        },
        false,
    );
    h.run(&[0; 6], DataDir::None, 0, &[]);
    good(&h.run(&[0x35, 0, 0, 0, 0, 0, 0, 0, 0, 0], DataDir::None, 0, &[]));
    assert!(h.ctl.lock().unwrap().log.is_empty());
}

#[test]
fn verify_start_stop_prevent_allow() {
    let mut h = H::ready();
    good(&h.run(&rw10(0x2f, 0, 8, 0), DataDir::None, 0, &[]));
    let r = h.run(&rw10(0x2f, BLOCKS as u32, 1, 0), DataDir::None, 0, &[]);
    assert_eq!(sense_of(&r), (0x05, 0x21, 0x00));
    // BYTCHK = 10b is reserved.
    let r = h.run(&rw10(0x2f, 0, 1, 0x04), DataDir::Write, BS, &[0; 512]);
    assert_eq!(sense_of(&r), (0x05, 0x24, 0x00));
    good(&h.run(&rw16(0x8f, 0, 1), DataDir::None, 0, &[]));
    good(&h.run(&[0x1b, 0, 0, 0, 1, 0], DataDir::None, 0, &[]));
    good(&h.run(&[0x1e, 0, 0, 0, 1, 0], DataDir::None, 0, &[]));
    assert!(h.ctl.lock().unwrap().log.is_empty());
}

// ----- residuals (iSCSI.iSCSIResiduals) -----

#[test]
fn read_residuals() {
    let mut h = H::ready();
    let d = pattern(2 * BS as usize, 3);
    good(&h.run(&rw10(0x2a, 0, 2, 0), DataDir::Write, 2 * BS, &d));
    // One block, EDTL 0: GOOD, overflow of a block, no data.
    let r = h.run(&rw10(0x28, 0, 1, 0), DataDir::Read, 0, &[]);
    good(&r);
    assert_eq!((r.data_len, r.residual), (0, Residual::Overflow(BS)));
    // One block, EDTL 10000: the block, underflow.
    let r = h.run(&rw10(0x28, 0, 1, 0), DataDir::Read, 10000, &[]);
    assert_eq!(data_of(&r), &d[..512]);
    assert_eq!(r.residual, Residual::Underflow(10000 - BS));
    // One block, EDTL 200: 200 bytes, overflow.
    let r = h.run(&rw10(0x28, 0, 1, 0), DataDir::Read, 200, &[]);
    assert_eq!(data_of(&r), &d[..200]);
    assert_eq!(r.residual, Residual::Overflow(BS - 200));
    // Two blocks, EDTL one block.
    let r = h.run(&rw12(0xa8, 0, 2), DataDir::Read, BS, &[]);
    assert_eq!(data_of(&r), &d[..512]);
    assert_eq!(r.residual, Residual::Overflow(BS));
    // READ flagged as a write on the transport: still served.
    good(&h.run(&rw16(0x88, 0, 1), DataDir::Write, BS, &[]));
}

/// Mirrors libiscsi's write_residuals_test: fill with 'a', write 'b' with a
/// CDB length and EDTL that disagree, then check status, residual and what
/// reached the medium.
fn write_residual_case(op: u8, xfer_blocks: u32, edtl: u32, want: Residual) {
    let mut h = H::ready();
    let max = (xfer_blocks * BS).max(edtl).div_ceil(BS) * BS;
    good(&h.run(
        &rw16(0x8a, 0, max / BS),
        DataDir::Write,
        max,
        &vec![b'a'; max as usize],
    ));
    let cdb: Vec<u8> = match op {
        0x2a => rw10(op, 0, xfer_blocks as u16, 0).to_vec(),
        0xaa => rw12(op, 0, xfer_blocks).to_vec(),
        _ => rw16(op, 0, xfer_blocks).to_vec(),
    };
    let r = h.run(&cdb, DataDir::Write, edtl, &vec![b'b'; edtl as usize]);
    assert_eq!(r.residual, want);
    let r2 = h.run(&rw16(0x88, 0, max / BS), DataDir::Read, max, &[]);
    let got = data_of(&r2);
    let spdtl = xfer_blocks * BS;
    if edtl < spdtl {
        // Overflow (FCP-4 §9.4.2 a)): GOOD; exactly the whole blocks within
        // EDTL are written, nothing beyond them.
        good(&r);
        let whole = (edtl / BS * BS) as usize;
        assert!(got[..whole].iter().all(|&b| b == b'b'));
        assert!(got[whole..].iter().all(|&b| b == b'a'));
    } else {
        good(&r);
        assert!(got[..spdtl as usize].iter().all(|&b| b == b'b'));
        assert!(got[spdtl as usize..].iter().all(|&b| b == b'a'));
    }
}

#[test]
fn write_residuals() {
    for op in [0x2a, 0xaa, 0x8a] {
        write_residual_case(op, 1, 0, Residual::Overflow(BS));
        write_residual_case(op, 1, 2 * BS, Residual::Underflow(BS));
        write_residual_case(op, 2, BS, Residual::Overflow(BS));
        write_residual_case(op, 1, 10000, Residual::Underflow(10000 - BS));
        write_residual_case(op, 1, 200, Residual::Overflow(BS - 200));
    }
}

// ----- parameter data (SCSI.Inquiry, ReadCapacity, Mandatory) -----

#[test]
fn inquiry_standard_and_alloc_lengths() {
    let mut h = H::ready();
    let r = h.run(&inquiry(false, 0, 260), DataDir::Read, 260, &[]);
    let d = data_of(&r);
    assert!(d.len() >= 36);
    assert_eq!(d[0], 0);
    assert_eq!(d[2], 6);
    assert_eq!(d[3] & 0x0f, 2);
    assert_eq!(d[4] as usize, d.len() - 5);
    assert_eq!(&d[8..16], b"FERRITE ");
    assert!(
        d[8..36]
            .iter()
            .all(|&c| c == 0 || (0x20..=0x7e).contains(&c))
    );
    // SBC-3 version descriptor (libiscsi's sbc3_support).
    assert!(d[58..74].chunks(2).any(|v| v == [0x04, 0xc0]));
    for alloc in 5..256u16 {
        let r = h.run(&inquiry(false, 0, alloc), DataDir::Read, alloc as u32, &[]);
        good(&r);
        assert_eq!(r.data_len as usize, (alloc as usize).min(96));
    }
    let a = data_of(&h.run(&inquiry(false, 0, 511), DataDir::Read, 511, &[]));
    let b = data_of(&h.run(&inquiry(false, 0, 512), DataDir::Read, 512, &[]));
    assert_eq!(a, b);
    // EDTL smaller than the allocation length: truncated, overflow.
    let r = h.run(&inquiry(false, 0, 255), DataDir::Read, 36, &[]);
    assert_eq!((r.data_len, r.residual), (36, Residual::Overflow(96 - 36)));
}

#[test]
fn vpd_pages_sorted_and_readable() {
    let mut h = H::ready();
    let d = data_of(&h.run(&inquiry(true, 0, 255), DataDir::Read, 255, &[]));
    let pages = &d[4..4 + d[3] as usize];
    assert!(pages.windows(2).all(|w| w[0] < w[1]));
    assert!(pages.contains(&0x80) && pages.contains(&0x83));
    for &p in pages {
        let r = h.run(&inquiry(true, p, 255), DataDir::Read, 255, &[]);
        good(&r);
        let v = data_of(&r);
        assert_eq!(v[1], p);
        assert_eq!(u16::from_be_bytes([v[2], v[3]]) as usize + 4, v.len());
    }
    let bl = data_of(&h.run(&inquiry(true, 0xb0, 255), DataDir::Read, 255, &[]));
    assert_eq!(bl[3], 0x3c);
    assert_eq!(&bl[20..28], &[0; 8]); // no UNMAP claimed
    let di = data_of(&h.run(&inquiry(true, 0x83, 255), DataDir::Read, 255, &[]));
    assert_eq!(&di[8..16], &0x5001_4050_0000_0001u64.to_be_bytes());
    let sn = data_of(&h.run(&inquiry(true, 0x80, 255), DataDir::Read, 255, &[]));
    assert_eq!(&sn[4..], b"SN0001");
}

#[test]
fn read_capacity_10_and_16() {
    let mut h = H::ready();
    let r = h.run(&[0x25, 0, 0, 0, 0, 0, 0, 0, 0, 0], DataDir::Read, 8, &[]);
    assert_eq!(data_of(&r), [0, 0, 3, 0xff, 0, 0, 2, 0]);
    let mut c = [0u8; 16];
    c[0] = 0x9e;
    c[1] = 0x10;
    for alloc in 0..=32u8 {
        c[13] = alloc;
        let r = h.run(&c, DataDir::Read, alloc as u32, &[]);
        good(&r);
        assert_eq!(r.data_len, alloc as u32);
    }
    c[13] = 32;
    let d = data_of(&h.run(&c, DataDir::Read, 32, &[]));
    assert_eq!(&d[..8], &(BLOCKS - 1).to_be_bytes());
    assert_eq!(&d[8..12], &BS.to_be_bytes());
    assert_eq!(d[12], 0); // PROT_EN = 0
    // Another SERVICE ACTION IN (16) action is not supported.
    c[1] = 0x1f;
    let r = h.run(&c, DataDir::Read, 32, &[]);
    assert_eq!(sense_of(&r), (0x05, 0x24, 0x00));
}

#[test]
fn mode_sense_pages() {
    let mut h = H::ready();
    let d = data_of(&h.run(&[0x1a, 0, 0x3f, 0, 255, 0], DataDir::Read, 255, &[]));
    assert_eq!(d[0] as usize, d.len() - 1);
    assert_eq!(d[2] & 0x10, 0x10); // DPOFUA
    assert_eq!(d[3], 8);
    assert_eq!(d[12], 0x08);
    assert_eq!(d[14] & 0x04, 0x04); // WCE: write-back
    assert_eq!(d[32], 0x0a);
    assert_eq!(d[34] >> 5, 1); // TST = 001b
    let d = data_of(&h.run(
        &[0x5a, 0x08, 0x0a, 0, 0, 0, 0, 0, 255, 0],
        DataDir::Read,
        255,
        &[],
    ));
    assert_eq!(d.len(), 8 + 12);
    assert_eq!(d[8], 0x0a);
    // Allocation length smaller than the data.
    let r = h.run(&[0x1a, 0, 0x3f, 0, 4, 0], DataDir::Read, 4, &[]);
    assert_eq!(r.data_len, 4);
}

#[test]
fn report_luns_selects() {
    let mut h = H::ready();
    let rl = |sel: u8| [0xa0, 0, sel, 0, 0, 0, 0, 0, 1, 0, 0, 0];
    let d = data_of(&h.run(&rl(0), DataDir::Read, 256, &[]));
    assert_eq!(&d[..4], &8u32.to_be_bytes());
    let d = data_of(&h.run(&rl(2), DataDir::Read, 256, &[]));
    assert_eq!(d.len(), 16);
    let d = data_of(&h.run(&rl(1), DataDir::Read, 256, &[]));
    assert_eq!(d, [0; 8]);
    let r = h.run(&rl(5), DataDir::Read, 256, &[]);
    assert_eq!(sense_of(&r), (0x05, 0x24, 0x00));
}

// ----- task set ordering -----

#[test]
fn ordered_blocks_younger_and_waits_for_older() {
    let mut h = H::ready();
    h.ctl.lock().unwrap().hold = true;
    let a = h.submit(&rw10(0x28, 0, 1, 0), DataDir::Read, BS, TaskAttr::Simple);
    let b = h.submit(&rw10(0x2a, 1, 1, 0), DataDir::Write, BS, TaskAttr::Ordered);
    let c = h.submit(&rw10(0x28, 2, 1, 0), DataDir::Read, BS, TaskAttr::Simple);
    let hq = h.submit(
        &rw10(0x28, 3, 1, 0),
        DataDir::Read,
        BS,
        TaskAttr::HeadOfQueue,
    );
    // Only A and the HEAD OF QUEUE read reached the backend; B has not even
    // asked for its data.
    assert!(h.actions().is_empty());
    assert_eq!(h.ctl.lock().unwrap().log.len(), 2);
    h.ctl.lock().unwrap().hold = false;
    h.poll();
    let acts = h.actions();
    let ids: Vec<CmdId> = acts
        .iter()
        .map(|a| match a {
            Action::Respond { id, .. } | Action::FetchData { id, .. } => *id,
            _ => panic!(),
        })
        .collect();
    // B asks for its data only after A responded; HEAD OF QUEUE is younger
    // than B and did not wait.
    let pos = |x: CmdId| ids.iter().position(|i| *i == x).unwrap();
    assert_eq!(ids.len(), 3);
    assert!(pos(a) < pos(b));
    assert!(!ids.contains(&c));
    for x in [a, hq] {
        h.shard.session(h.sid).unwrap().response_sent(x);
    }
    let Some(Action::FetchData { buf, .. }) = acts.into_iter().nth(pos(b)) else {
        panic!()
    };
    h.shard.session(h.sid).unwrap().data_out_done(b, Ok(buf));
    // C still waits for B's write.
    assert_eq!(h.ctl.lock().unwrap().log.len(), 3);
    h.poll();
    let acts = h.actions();
    assert!(matches!(acts[..], [Action::Respond { id, .. }] if id == b));
    assert_eq!(h.ctl.lock().unwrap().log.len(), 4);
    h.poll();
    let acts = h.actions();
    assert!(matches!(acts[..], [Action::Respond { id, .. }] if id == c));
}

/// A large read to a session that takes pipes comes back as pages in a
/// pipe. A write that waited in the task set for that read (ORDERED) must
/// not change the pages before the initiator has them: it waits for the
/// response's delivery hold, and the fabric is asked to confirm delivery.
/// A write that did not wait for it goes at once.
#[test]
fn pipe_read_holds_writes_ordered_after_it_until_delivered() {
    let caps = Caps {
        read_pipe: true,
        write_cache: true,
        fua: true,
        ..Caps::default()
    };
    let mut h = H::build(DeviceFlags::default(), false, BLOCKS, caps);
    let r = h.run(&[0; 6], DataDir::None, 0, &[]);
    assert_eq!(sense_of(&r), (0x06, 0x29, 0x00));
    let len = 256 * 1024u32;
    let blocks = (len / BS) as u16;
    let data = pattern(len as usize, 3);
    good(&h.run(&rw10(0x2a, 0, blocks, 0), DataDir::Write, len, &data));
    // Not asked for: buffers.
    let r = h.run(&rw10(0x28, 0, blocks, 0), DataDir::Read, len, &[]);
    good(&r);
    assert!(r.pipe.is_none());
    assert_eq!(data_of(&r), data);

    h.shard.session(h.sid).unwrap().set_pipe_reads(true);
    // Small reads still use buffers.
    let r = h.run(&rw10(0x28, 0, 8, 0), DataDir::Read, 8 * BS, &[]);
    assert!(r.pipe.is_none());
    assert_eq!(data_of(&r), data[..8 * BS as usize]);
    // A SIMPLE write after a pipe read does not wait for its delivery.
    let r = h.run(&rw10(0x28, 0, blocks, 0), DataDir::Read, len, &[]);
    let held = r.pipe.expect("the read came as a pipe");
    good(&h.run(
        &rw10(0x2a, 600, 1, 0),
        DataDir::Write,
        BS,
        &pattern(BS as usize, 1),
    ));
    drop(held);

    // The read waits in the backend; an ORDERED write queues behind it.
    h.ctl.lock().unwrap().hold = true;
    let read = h.submit(
        &rw10(0x28, 0, blocks, 0),
        DataDir::Read,
        len,
        TaskAttr::Simple,
    );
    let write = h.submit(
        &rw10(0x2a, 100, 1, 0),
        DataDir::Write,
        BS,
        TaskAttr::Ordered,
    );
    assert!(h.actions().is_empty());
    h.ctl.lock().unwrap().hold = false;
    let mut pd = None;
    let mut asked = 0;
    let mut answered = Vec::new();
    for _ in 0..6 {
        h.poll();
        for a in h.actions() {
            match a {
                Action::Respond { id, mut rsp, .. } => {
                    good(&rsp);
                    if id == read {
                        assert_eq!(rsp.data_len, len);
                        pd = Some(rsp.pipe.take().expect("pipe data"));
                    }
                    h.shard.session(h.sid).unwrap().response_sent(id);
                    answered.push(id);
                }
                Action::FetchData { id, mut buf, .. } => {
                    assert_eq!(id, write);
                    buf.copy_in(0, &pattern(BS as usize, 9));
                    h.shard.session(h.sid).unwrap().data_out_done(id, Ok(buf));
                }
                Action::ConfirmDelivery => asked += 1,
                other => panic!("unexpected action {other:?}"),
            }
        }
    }
    // The write has its data but waits; the fabric was asked once.
    assert_eq!(answered, vec![read]);
    assert_eq!(asked, 1);
    let mut pd = pd.expect("the read answered");
    let mut got = Vec::new();
    assert_eq!(
        pd.pipe.read_to(&mut got, len as usize).unwrap(),
        len as usize
    );
    assert_eq!(got, data, "the pages still hold what was read");
    drop(pd);
    for _ in 0..4 {
        h.poll();
        for a in h.actions() {
            if let Action::Respond { id, rsp, .. } = a {
                good(&rsp);
                h.shard.session(h.sid).unwrap().response_sent(id);
                answered.push(id);
            }
        }
    }
    assert_eq!(answered, vec![read, write]);
    let r = h.run(&rw10(0x28, 100, 1, 0), DataDir::Read, BS, &[]);
    assert_eq!(data_of(&r), pattern(BS as usize, 9));
}

#[test]
fn simple_commands_run_concurrently() {
    let mut h = H::ready();
    h.ctl.lock().unwrap().hold = true;
    for i in 0..10 {
        h.submit(&rw10(0x28, i, 1, 0), DataDir::Read, BS, TaskAttr::Simple);
    }
    assert_eq!(h.ctl.lock().unwrap().log.len(), 10);
    assert!(h.shard.wants_spin());
    h.ctl.lock().unwrap().hold = false;
    h.poll();
    assert_eq!(h.actions().len(), 10);
    assert!(!h.shard.wants_spin());
}

// ----- back-pressure -----

#[test]
fn busy_queue_is_a_waiting_state() {
    let mut h = H::ready();
    let d = pattern(8 * BS as usize, 5);
    good(&h.run(&rw10(0x2a, 0, 8, 0), DataDir::Write, 8 * BS, &d));
    h.ctl.lock().unwrap().depth = 2;
    let ids: Vec<CmdId> = (0..8)
        .map(|i| h.submit(&rw10(0x28, i, 1, 0), DataDir::Read, BS, TaskAttr::Simple))
        .collect();
    assert!(h.ctl.lock().unwrap().busy_count >= 1);
    assert!(h.shard.wants_spin());
    let mut got = Vec::new();
    for _ in 0..20 {
        h.poll();
        for a in h.actions() {
            let Action::Respond { id, rsp, .. } = a else {
                panic!()
            };
            good(&rsp);
            let i = ids.iter().position(|x| *x == id).unwrap();
            assert_eq!(data_of(&rsp), &d[i * 512..(i + 1) * 512]);
            h.shard.session(h.sid).unwrap().response_sent(id);
            got.push(i);
        }
    }
    // Every read answered, in submission order.
    assert_eq!(got, (0..8).collect::<Vec<_>>());
}

// ----- task management -----

#[test]
fn abort_task_set_waits_for_io_and_silences_aborted() {
    let mut h = H::ready();
    h.ctl.lock().unwrap().hold = true;
    let r1 = h.submit(&rw10(0x28, 0, 1, 0), DataDir::Read, BS, TaskAttr::Simple);
    let w = h.submit(&rw10(0x2a, 1, 1, 0), DataDir::Write, BS, TaskAttr::Simple);
    let _o = h.submit(&rw10(0x28, 2, 1, 0), DataDir::Read, BS, TaskAttr::Ordered);
    // The fabric took the FetchData of w.
    let acts = h.actions();
    let Some(Action::FetchData { buf, .. }) = acts.into_iter().next() else {
        panic!()
    };
    let tmf = h.shard.session(h.sid).unwrap().task_mgmt(
        h.now,
        TmfRequest {
            func: TmfFunction::AbortTaskSet,
            lun: Lun(0),
            tag: TaskTag(999),
        },
    );
    assert!(h.actions().is_empty(), "TMF done before I/O drained");
    h.ctl.lock().unwrap().hold = false;
    h.poll();
    assert!(h.actions().is_empty(), "TMF done before the data came back");
    h.shard.session(h.sid).unwrap().data_out_done(w, Ok(buf));
    let acts = h.actions();
    assert!(
        matches!(acts[..], [Action::TmfDone { id, rsp: TmfResponse::Complete, tag: TaskTag(999) }] if id == tmf),
        "{acts:?}"
    );
    h.poll();
    assert!(h.actions().is_empty());
    // Nothing of the aborted commands reached the backend but the first read.
    assert_eq!(h.ctl.lock().unwrap().log.len(), 1);
    let _ = r1;
    good(&h.run(&[0; 6], DataDir::None, 0, &[]));
}

#[test]
fn abort_task_by_tag_and_query_task() {
    let mut h = H::ready();
    h.ctl.lock().unwrap().hold = true;
    h.submit(&rw10(0x28, 0, 1, 0), DataDir::Read, BS, TaskAttr::Simple);
    let tag = TaskTag(h.next_tag - 1);
    let mut s = h.shard.session(h.sid).unwrap();
    let q = |func| TmfRequest {
        func,
        lun: Lun(0),
        tag: TaskTag(500),
    };
    s.task_mgmt(h.now, q(TmfFunction::QueryTask { tag }));
    s.task_mgmt(h.now, q(TmfFunction::AbortTask { tag: TaskTag(77) }));
    s.task_mgmt(h.now, q(TmfFunction::ClearAca));
    s.task_mgmt(h.now, q(TmfFunction::AbortTask { tag }));
    let rsps: Vec<TmfResponse> = std::iter::from_fn(|| s.poll_action())
        .map(|a| match a {
            Action::TmfDone { rsp, .. } => rsp,
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(
        rsps,
        vec![
            TmfResponse::Succeeded,
            TmfResponse::TaskNotFound,
            TmfResponse::Rejected
        ]
    );
    h.ctl.lock().unwrap().hold = false;
    h.poll();
    let acts = h.actions();
    assert!(
        matches!(
            acts[..],
            [Action::TmfDone {
                rsp: TmfResponse::Complete,
                ..
            }]
        ),
        "{acts:?}"
    );
    let mut s = h.shard.session(h.sid).unwrap();
    s.task_mgmt(h.now, q(TmfFunction::QueryTask { tag }));
    assert!(matches!(
        s.poll_action(),
        Some(Action::TmfDone {
            rsp: TmfResponse::Complete,
            ..
        })
    ));
    s.task_mgmt(
        h.now,
        TmfRequest {
            func: TmfFunction::AbortTaskSet,
            lun: Lun(9),
            tag: TaskTag(1),
        },
    );
    assert!(matches!(
        s.poll_action(),
        Some(Action::TmfDone {
            rsp: TmfResponse::IncorrectLun,
            ..
        })
    ));
}

#[test]
fn abort_cancels_unsent_fetch_and_blocked_commands() {
    let mut h = H::ready();
    h.ctl.lock().unwrap().hold = true;
    h.submit(&rw10(0x2a, 0, 1, 0), DataDir::Write, BS, TaskAttr::Simple);
    h.submit(&rw10(0x28, 0, 1, 0), DataDir::Read, BS, TaskAttr::Ordered);
    // FetchData still queued: the abort removes it and completes at once.
    h.shard.session(h.sid).unwrap().task_mgmt(
        h.now,
        TmfRequest {
            func: TmfFunction::ClearTaskSet,
            lun: Lun(0),
            tag: TaskTag(1),
        },
    );
    let acts = h.actions();
    assert!(
        matches!(
            acts[..],
            [Action::TmfDone {
                rsp: TmfResponse::Complete,
                ..
            }]
        ),
        "{acts:?}"
    );
    assert!(h.ctl.lock().unwrap().log.is_empty());
}

#[test]
fn lu_reset_raises_unit_attention_on_every_nexus() {
    let mut h = H::ready();
    let other = h.shard.open_session(h.now, nexus(2), h.map.clone(), false);
    {
        let r = h.req(0, &[0; 6], DataDir::None, 0, TaskAttr::Simple);
        let mut s = h.shard.session(other).unwrap();
        s.submit(h.now, r);
        let Some(Action::Respond { id, rsp, .. }) = s.poll_action() else {
            panic!()
        };
        assert_eq!(sense_of(&rsp), (0x06, 0x29, 0x00));
        s.response_sent(id);
    }
    h.shard.session(h.sid).unwrap().task_mgmt(
        h.now,
        TmfRequest {
            func: TmfFunction::LogicalUnitReset,
            lun: Lun(0),
            tag: TaskTag(1),
        },
    );
    assert!(matches!(
        h.actions()[..],
        [Action::TmfDone {
            rsp: TmfResponse::Complete,
            ..
        }]
    ));
    // SAM-5 §6.3.3: the nexus that asked sees it too, once.
    assert_eq!(
        sense_of(&h.run(&[0; 6], DataDir::None, 0, &[])),
        (0x06, 0x29, 0x03)
    );
    good(&h.run(&[0; 6], DataDir::None, 0, &[]));
    let r = h.req(0, &[0; 6], DataDir::None, 0, TaskAttr::Simple);
    let mut s = h.shard.session(other).unwrap();
    s.submit(h.now, r);
    let Some(Action::Respond { rsp, .. }) = s.poll_action() else {
        panic!()
    };
    assert_eq!(sense_of(&rsp), (0x06, 0x29, 0x03));
}

#[test]
fn it_nexus_reset_raises_nexus_loss() {
    let mut h = H::ready();
    h.shard.session(h.sid).unwrap().task_mgmt(
        h.now,
        TmfRequest {
            func: TmfFunction::ItNexusReset,
            lun: Lun(0),
            tag: TaskTag(1),
        },
    );
    assert_eq!(h.actions().len(), 1);
    let r = h.run(&[0; 6], DataDir::None, 0, &[]);
    assert_eq!(sense_of(&r), (0x06, 0x29, 0x07));
}

// ----- session close -----

#[test]
fn close_session_lingers_until_io_drains() {
    let mut h = H::ready();
    h.ctl.lock().unwrap().hold = true;
    h.submit(&rw10(0x28, 0, 1, 0), DataDir::Read, BS, TaskAttr::Simple);
    h.submit(&rw10(0x2a, 0, 1, 0), DataDir::Write, BS, TaskAttr::Simple);
    h.shard.close_session(h.now, h.sid);
    assert!(h.shard.session(h.sid).is_none());
    h.ctl.lock().unwrap().hold = false;
    assert!(h.shard.poll(h.now));
    let mut ready = Vec::new();
    h.shard.ready_sessions(&mut ready);
    assert!(ready.is_empty());
    assert!(!h.shard.wants_spin());
    // A new session works as before.
    let sid = h.shard.open_session(h.now, nexus(3), h.map.clone(), false);
    assert_ne!(sid, h.sid);
    h.sid = sid;
    let r = h.run(&[0; 6], DataDir::None, 0, &[]);
    assert_eq!(sense_of(&r), (0x06, 0x29, 0x00));
}

#[test]
fn ready_sessions_lists_sessions_with_actions() {
    let mut h = H::ready();
    h.ctl.lock().unwrap().hold = true;
    let id = h.submit(&rw10(0x28, 0, 1, 0), DataDir::Read, BS, TaskAttr::Simple);
    let mut ready = Vec::new();
    h.shard.ready_sessions(&mut ready);
    assert!(ready.is_empty());
    h.ctl.lock().unwrap().hold = false;
    h.poll();
    h.shard.ready_sessions(&mut ready);
    assert_eq!(ready, vec![h.sid]);
    let a = h.actions();
    assert!(matches!(a[..], [Action::Respond { id: i, .. }] if i == id));
}

#[test]
fn stale_command_ids_are_ignored() {
    let mut h = H::ready();
    let old = h.submit(&[0; 6], DataDir::None, 0, TaskAttr::Simple);
    let a = h.actions();
    assert!(matches!(a[..], [Action::Respond { id, .. }] if id == old));
    h.shard.session(h.sid).unwrap().response_sent(old);
    h.ctl.lock().unwrap().hold = true;
    let new = h.submit(&rw10(0x2a, 0, 1, 0), DataDir::Write, BS, TaskAttr::Simple);
    assert_ne!(old, new);
    let Some(Action::FetchData { mut buf, .. }) = h.actions().into_iter().next() else {
        panic!()
    };
    // A stale id for the same slot reaches nothing.
    h.shard.session(h.sid).unwrap().response_sent(old);
    h.shard
        .session(h.sid)
        .unwrap()
        .data_out_done(old, Err(ferrite_core::Abort::Aborted));
    buf.copy_in(0, &[7; 512]);
    h.shard.session(h.sid).unwrap().data_out_done(new, Ok(buf));
    h.ctl.lock().unwrap().hold = false;
    h.poll();
    let a = h.actions();
    assert!(
        matches!(&a[..], [Action::Respond { id, rsp, .. }] if *id == new && rsp.status == Status::GOOD)
    );
    assert_eq!(&h.ctl.lock().unwrap().data[..512], &[7; 512]);
}

// ----- WRITE SAME and UNMAP -----

fn thin(blocks: u64, caps: Caps) -> H {
    let mut h = H::build(
        DeviceFlags {
            thin_provisioned: true,
            ..Default::default()
        },
        false,
        blocks,
        caps,
    );
    h.run(&[0; 6], DataDir::None, 0, &[]);
    h
}

const THIN_CAPS: Caps = Caps {
    unmap: true,
    write_zeroes: true,
    fua: true,
    write_cache: true,
    unmap_zeroes: true,
    read_pipe: false,
};

#[test]
fn write_same_replicates_the_block_in_chunks() {
    // 20000 blocks of 512 bytes: more than one MAXIMUM TRANSFER LENGTH.
    let mut h = H::build(DeviceFlags::default(), false, 20000, Caps::default());
    h.run(&[0; 6], DataDir::None, 0, &[]);
    let block = pattern(512, 42);
    let mut ws = rw16(0x93, 100, 19000);
    ws[1] = 0;
    good(&h.run(&ws, DataDir::Write, BS, &block));
    let c = h.ctl.lock().unwrap();
    // One write per chunk of at most WRITE_CHUNK bytes, in order.
    let (total, chunk) = (19000 * 512u64, u64::from(ferrite_core::budget::WRITE_CHUNK));
    assert_eq!(c.log.len() as u64, total.div_ceil(chunk));
    for (i, w) in c.log.iter().enumerate() {
        let at = i as u64 * chunk;
        assert_eq!(
            *w,
            ("W", 100 * 512 + at, (total - at).min(chunk) as usize, false)
        );
    }
    for b in 100..19100usize {
        assert_eq!(&c.data[b * 512..(b + 1) * 512], &block[..], "block {b}");
    }
    assert!(c.data[..100 * 512].iter().all(|&x| x == 0));
    assert!(c.data[19100 * 512..].iter().all(|&x| x == 0));
}

#[test]
fn write_same_zero_and_unmap_paths() {
    let mut h = thin(BLOCKS, THIN_CAPS);
    good(&h.run(&rw10(0x2a, 0, 4, 0), DataDir::Write, 4 * BS, &[9; 2048]));
    // Zero pattern without UNMAP: WRITE ZEROES.
    good(&h.run(&rw10(0x41, 0, 2, 0), DataDir::Write, BS, &[0; 512]));
    // Zero pattern with UNMAP on a thin device: deallocate.
    good(&h.run(
        &rw16(0x93, 2, 1).map_or_flag(1, 0x08),
        DataDir::Write,
        BS,
        &[0; 512],
    ));
    // NDOB (no Data-Out) with UNMAP.
    good(&h.run(
        &rw16(0x93, 3, 1).map_or_flag(1, 0x09),
        DataDir::None,
        0,
        &[],
    ));
    let c = h.ctl.lock().unwrap();
    let kinds: Vec<&str> = c.log.iter().map(|e| e.0).collect();
    assert_eq!(kinds, ["W", "Z", "U", "U"]);
    assert!(c.data[..2048].iter().all(|&x| x == 0));
}

#[test]
fn write_same_checks() {
    let mut h = H::ready();
    // 0 blocks means to the end of the device (WSNZ = 0).
    good(&h.run(&rw10(0x41, 1000, 0, 0), DataDir::Write, BS, &[3; 512]));
    assert_eq!(
        h.ctl.lock().unwrap().log[0],
        ("W", 1000 * 512, 24 * 512, false)
    );
    let r = h.run(
        &rw10(0x41, BLOCKS as u32 + 1, 0, 0),
        DataDir::Write,
        BS,
        &[3; 512],
    );
    assert_eq!(sense_of(&r), (0x05, 0x21, 0x00));
    let r = h.run(
        &rw10(0x41, BLOCKS as u32 - 1, 2, 0),
        DataDir::Write,
        BS,
        &[3; 512],
    );
    assert_eq!(sense_of(&r), (0x05, 0x21, 0x00));
    // UNMAP bit on a device without logical block provisioning.
    let r = h.run(&rw10(0x41, 0, 1, 0x08), DataDir::Write, BS, &[0; 512]);
    assert_eq!(sense_of(&r), (0x05, 0x24, 0x00));
    // No Data-Out for the block: overflow.
    let r = h.run(&rw10(0x41, 0, 1, 0), DataDir::Write, 0, &[]);
    assert_eq!(sense_of(&r), (0x05, 0x0e, 0x03));
    assert_eq!(r.residual, Residual::Overflow(BS));
    // UNMAP is not an operation of a fully provisioned device.
    let r = h.run(
        &[0x42, 0, 0, 0, 0, 0, 0, 0, 24, 0],
        DataDir::Write,
        24,
        &[0; 24],
    );
    assert_eq!(sense_of(&r), (0x05, 0x20, 0x00));
}

fn unmap_list(descs: &[(u64, u32)]) -> Vec<u8> {
    let mut v = Vec::new();
    v.extend(((6 + 16 * descs.len()) as u16).to_be_bytes());
    v.extend(((16 * descs.len()) as u16).to_be_bytes());
    v.extend([0u8; 4]);
    for (lba, n) in descs {
        v.extend(lba.to_be_bytes());
        v.extend(n.to_be_bytes());
        v.extend([0u8; 4]);
    }
    v
}

fn unmap_cdb(len: u16) -> [u8; 10] {
    let l = len.to_be_bytes();
    [0x42, 0, 0, 0, 0, 0, 0, l[0], l[1], 0]
}

#[test]
fn unmap_descriptors() {
    let mut h = thin(BLOCKS, THIN_CAPS);
    good(&h.run(&rw10(0x2a, 0, 8, 0), DataDir::Write, 8 * BS, &[5; 4096]));
    let list = unmap_list(&[(1, 2), (5, 1), (7, 0)]);
    let n = list.len() as u16;
    good(&h.run(&unmap_cdb(n), DataDir::Write, n as u32, &list));
    {
        let c = h.ctl.lock().unwrap();
        let ops: Vec<_> = c.log[1..].to_vec();
        assert_eq!(ops, [("U", 512, 1024, false), ("U", 2560, 512, false)]);
        let blocks: Vec<u8> = (0..8).map(|b| c.data[b * 512]).collect();
        assert_eq!(blocks, [5, 0, 0, 5, 5, 0, 5, 5]);
    }
    // Zero-length descriptor at the end of the device is fine; one block
    // beyond it fails the whole list.
    let list = unmap_list(&[(BLOCKS, 0)]);
    good(&h.run(&unmap_cdb(24), DataDir::Write, 24, &list));
    let list = unmap_list(&[(0, 1), (BLOCKS, 1)]);
    let r = h.run(&unmap_cdb(40), DataDir::Write, 40, &list);
    assert_eq!(sense_of(&r), (0x05, 0x21, 0x00));
    assert_eq!(h.ctl.lock().unwrap().log.len(), 3);
    // Parameter list length 0 is a no-op; 1..7 is an error.
    good(&h.run(&unmap_cdb(0), DataDir::None, 0, &[]));
    let r = h.run(&unmap_cdb(4), DataDir::Write, 4, &[0; 4]);
    assert_eq!(sense_of(&r), (0x05, 0x1a, 0x00));
}

#[test]
fn thin_device_reports_provisioning() {
    let mut h = thin(BLOCKS, THIN_CAPS);
    let mut c = [0u8; 16];
    c[0] = 0x9e;
    c[1] = 0x10;
    c[13] = 32;
    let d = data_of(&h.run(&c, DataDir::Read, 32, &[]));
    assert_eq!(d[14] & 0xc0, 0xc0); // LBPME, LBPRZ
    let b2 = data_of(&h.run(&inquiry(true, 0xb2, 255), DataDir::Read, 255, &[]));
    assert_eq!((b2[5] & 0xe0, b2[6] & 7), (0xe0, 2));
    let b0 = data_of(&h.run(&inquiry(true, 0xb0, 255), DataDir::Read, 255, &[]));
    let max_unmap = u32::from_be_bytes([b0[20], b0[21], b0[22], b0[23]]);
    let max_desc = u32::from_be_bytes([b0[24], b0[25], b0[26], b0[27]]);
    assert!(max_unmap > 0 && max_unmap <= 1 << 20);
    assert!(max_desc > 0 && max_desc <= 1 << 20);
    // A thin device whose backend cannot deallocate claims nothing.
    let mut h = thin(BLOCKS, Caps::default());
    let d = data_of(&h.run(&c, DataDir::Read, 32, &[]));
    assert_eq!(d[14] & 0xc0, 0);
}

trait Flag {
    fn map_or_flag(self, byte: usize, bits: u8) -> Self;
}

impl Flag for [u8; 16] {
    fn map_or_flag(mut self, byte: usize, bits: u8) -> Self {
        self[byte] |= bits;
        self
    }
}

// ----- VERIFY with BYTCHK, WRITE AND VERIFY -----

#[test]
fn verify_compares_data_out_with_the_medium() {
    let mut h = H::ready();
    let d = pattern(3 * BS as usize, 11);
    good(&h.run(&rw10(0x2a, 4, 3, 0), DataDir::Write, 3 * BS, &d));
    // BYTCHK = 01b, equal.
    good(&h.run(&rw10(0x2f, 4, 3, 0x02), DataDir::Write, 3 * BS, &d));
    good(&h.run(
        &rw16(0x8f, 4, 3).map_or_flag(1, 0x02),
        DataDir::Write,
        3 * BS,
        &d,
    ));
    // One byte differs: MISCOMPARE with its offset in INFORMATION.
    let mut bad = d.clone();
    bad[700] ^= 0xff;
    let r = h.run(&rw10(0x2f, 4, 3, 0x02), DataDir::Write, 3 * BS, &bad);
    assert_eq!(sense_of(&r), (0x0e, 0x1d, 0x00));
    let s = r.sense.as_ref().unwrap();
    assert_eq!(s[0] & 0x80, 0x80);
    assert_eq!(&s[3..7], &700u32.to_be_bytes());
    // BYTCHK = 11b: one block against every block.
    good(&h.run(&rw10(0x2a, 10, 2, 0), DataDir::Write, 2 * BS, &[6; 1024]));
    good(&h.run(&rw10(0x2f, 10, 2, 0x06), DataDir::Write, BS, &[6; 512]));
    let r = h.run(&rw10(0x2f, 9, 2, 0x06), DataDir::Write, BS, &[6; 512]);
    assert_eq!(sense_of(&r), (0x0e, 0x1d, 0x00));
    // Out of range is checked before any data moves; zero blocks is GOOD.
    let r = h.run(
        &rw10(0x2f, BLOCKS as u32, 1, 0x02),
        DataDir::Write,
        BS,
        &[0; 512],
    );
    assert_eq!(sense_of(&r), (0x05, 0x21, 0x00));
    good(&h.run(&rw10(0x2f, 0, 0, 0x02), DataDir::None, 0, &[]));
    // BYTCHK = 00b with different data: the medium alone is verified.
    good(&h.run(&rw10(0x2f, 4, 3, 0), DataDir::Write, 3 * BS, &bad));
}

#[test]
fn write_and_verify_writes() {
    let mut h = H::ready();
    let d = pattern(2 * BS as usize, 21);
    for op in [0x2e, 0xae, 0x8e] {
        let cdb: Vec<u8> = match op {
            0x2e => rw10(op, 30, 2, 0x02).to_vec(),
            0xae => rw12(op, 30, 2).to_vec(),
            _ => rw16(op, 30, 2).to_vec(),
        };
        good(&h.run(&cdb, DataDir::Write, 2 * BS, &d));
        let r = h.run(&rw10(0x28, 30, 2, 0), DataDir::Read, 2 * BS, &[]);
        assert_eq!(data_of(&r), d);
    }
    // Durable when it completes.
    assert!(h.ctl.lock().unwrap().log.iter().any(|e| e.0 == "W" && e.3));
    let r = h.run(&rw10(0x2e, 0, 1, 0x20), DataDir::Write, BS, &[0; 512]);
    assert_eq!(sense_of(&r), (0x05, 0x24, 0x00));
}

#[test]
fn write_same_unmap_ignores_the_pattern_and_checks_data_out_size() {
    let mut h = thin(BLOCKS, THIN_CAPS);
    good(&h.run(&rw10(0x2a, 0, 2, 0), DataDir::Write, 2 * BS, &[9; 1024]));
    good(&h.run(&rw10(0x41, 0, 2, 0x08), DataDir::Write, BS, &[0xff; 512]));
    assert_eq!(h.ctl.lock().unwrap().log[1], ("U", 0, 1024, false));
    let r = h.run(&rw10(0x28, 0, 2, 0), DataDir::Read, 2 * BS, &[]);
    assert!(data_of(&r).iter().all(|&b| b == 0));
    // Data-Out of two blocks, or of half a block.
    let r = h.run(&rw10(0x41, 0, 1, 0x08), DataDir::Write, 2 * BS, &[0; 1024]);
    assert_eq!(sense_of(&r), (0x05, 0x24, 0x00));
    let r = h.run(&rw10(0x41, 0, 1, 0x08), DataDir::Write, BS / 2, &[0; 256]);
    assert_eq!(r.status, Status::CHECK_CONDITION);
    // Only the first write, the unmap and the read reached the backend.
    assert_eq!(h.ctl.lock().unwrap().log.len(), 3);
}

#[test]
fn report_supported_operation_codes() {
    let rsoc = |rctd: bool, options: u8, opcode: u8, sa: u16| -> [u8; 12] {
        let s = sa.to_be_bytes();
        [
            0xa3,
            0x0c,
            (rctd as u8) << 7 | options,
            opcode,
            s[0],
            s[1],
            0,
            0,
            0x10,
            0,
            0,
            0,
        ]
    };
    let mut h = H::ready();
    let d = data_of(&h.run(&rsoc(false, 0, 0, 0), DataDir::Read, 4096, &[]));
    let n = u32::from_be_bytes([d[0], d[1], d[2], d[3]]) as usize;
    assert_eq!(n + 4, d.len());
    let ops: Vec<u8> = d[4..].chunks(8).map(|c| c[0]).collect();
    assert!(ops.contains(&0x28) && ops.contains(&0x9e) && !ops.contains(&0x42));
    // Every reported command answers option 001b/010b with its usage data.
    for c in d[4..].chunks(8) {
        let servactv = c[5] & 1 != 0;
        let sa = u16::from_be_bytes([c[2], c[3]]);
        let r = h.run(
            &rsoc(false, if servactv { 2 } else { 1 }, c[0], sa),
            DataDir::Read,
            4096,
            &[],
        );
        let one = data_of(&r);
        assert_eq!(one[1] & 7, 3);
        assert_eq!(
            u16::from_be_bytes([one[2], one[3]]),
            u16::from_be_bytes([c[6], c[7]])
        );
        assert_eq!(one[4], c[0]);
    }
    // READ (10): DPO and FUA are evaluated, as MODE SENSE's DPOFUA says.
    let one = data_of(&h.run(&rsoc(false, 1, 0x28, 0), DataDir::Read, 4096, &[]));
    assert_ne!(one[5] & 0x18, 0);
    // Option 001b on READ CAPACITY (16)'s opcode, which has service actions.
    let r = h.run(&rsoc(false, 1, 0x9e, 0), DataDir::Read, 4096, &[]);
    assert_eq!(sense_of(&r), (0x05, 0x24, 0x00));
    // Timeouts descriptors with RCTD.
    let d = data_of(&h.run(&rsoc(true, 0, 0, 0), DataDir::Read, 4096, &[]));
    assert!(
        d[4..]
            .chunks(20)
            .all(|c| c[5] & 2 != 0 && c[8..10] == [0, 0x0a])
    );
    // Other MAINTENANCE IN service actions are not supported.
    let r = h.run(
        &[0xa3, 0x05, 0, 0, 0, 0, 0, 0, 0x10, 0, 0, 0],
        DataDir::Read,
        4096,
        &[],
    );
    assert_eq!(sense_of(&r), (0x05, 0x20, 0x00));
    // A thin device lists UNMAP.
    let mut h = thin(BLOCKS, THIN_CAPS);
    let d = data_of(&h.run(&rsoc(false, 0, 0, 0), DataDir::Read, 4096, &[]));
    assert!(d[4..].chunks(8).any(|c| c[0] == 0x42));
}

/// Random CDBs (every opcode, random fields and lengths, random transport
/// lengths and directions) never panic and always end in a response, with
/// Data-In never longer than the transport expects.
#[test]
fn random_cdbs_always_answered() {
    let mut h = thin(BLOCKS, THIN_CAPS);
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    for i in 0..20000u32 {
        let len = (next() % 20) as usize;
        let mut cdb: Vec<u8> = (0..len).map(|_| next() as u8).collect();
        if let Some(b) = cdb.first_mut() {
            *b = (i % 256) as u8;
        }
        // Keep most transfer lengths small so that some commands run.
        if cdb.len() > 9 && next() % 2 == 0 {
            for b in &mut cdb[1..] {
                *b &= 0x01;
            }
        }
        let dir = match next() % 4 {
            0 => DataDir::None,
            1 => DataDir::Read,
            2 => DataDir::Write,
            _ => DataDir::Bidi,
        };
        let edtl = (next() % 8192) as u32;
        let data = vec![0u8; edtl as usize];
        let r = h.run(&cdb, dir, edtl, &data);
        assert!(r.data_len <= edtl, "{cdb:02x?}: {r:?}");
        if let Some(d) = &r.data {
            assert!(d.len() >= r.data_len as usize);
        }
        if r.status == Status::CHECK_CONDITION {
            let s = r.sense.as_ref().unwrap();
            assert_eq!(s[0] & 0x7f, 0x70);
        }
    }
    // The mix reached the backend with reads, writes and flushes.
    let c = h.ctl.lock().unwrap();
    for kind in ["R", "W", "F"] {
        assert!(c.log.iter().any(|e| e.0 == kind), "no {kind} op");
    }
}

#[test]
fn undecodable_lun_leaves_lun_0_alone() {
    let mut h = H::new();
    let mut r = h.req(
        0,
        &[0x03, 0, 0, 0, 18, 0],
        DataDir::Read,
        18,
        TaskAttr::Simple,
    );
    r.lun_raw = [0xc0, 1, 0, 0, 0, 0, 0, 0];
    let mut s = h.shard.session(h.sid).unwrap();
    s.submit(h.now, r);
    let Some(Action::Respond { id, rsp, .. }) = s.poll_action() else {
        panic!()
    };
    s.response_sent(id);
    let d = data_of(&rsp);
    assert_eq!((d[2], d[12]), (0x05, 0x25));
    // LUN 0 still has its POWER ON unit attention.
    let r = h.run(&[0; 6], DataDir::None, 0, &[]);
    assert_eq!(sense_of(&r), (0x06, 0x29, 0x00));
}

#[test]
fn close_session_starts_nothing_it_unblocks() {
    let mut h = H::ready();
    h.ctl.lock().unwrap().hold = true;
    // A runs; B (ORDERED) waits for A; C waits for B. Freeing B must not
    // start C.
    h.submit(&rw10(0x28, 0, 1, 0), DataDir::Read, BS, TaskAttr::Simple);
    h.submit(&rw10(0x28, 1, 1, 0), DataDir::Read, BS, TaskAttr::Ordered);
    h.submit(&rw10(0x28, 2, 1, 0), DataDir::Read, BS, TaskAttr::Simple);
    assert_eq!(h.ctl.lock().unwrap().log.len(), 1);
    h.shard.close_session(h.now, h.sid);
    assert_eq!(h.ctl.lock().unwrap().log.len(), 1);
    h.ctl.lock().unwrap().hold = false;
    h.poll();
    assert_eq!(h.ctl.lock().unwrap().log.len(), 1);
    assert!(!h.shard.wants_spin());
}

#[test]
fn target_reset_aborts_every_session_of_the_target() {
    let mut h = H::ready();
    let other = h.shard.open_session(h.now, nexus(2), h.map.clone(), false);
    {
        let r = h.req(0, &[0; 6], DataDir::None, 0, TaskAttr::Simple);
        let mut s = h.shard.session(other).unwrap();
        s.submit(h.now, r);
        let Some(Action::Respond { id, rsp, .. }) = s.poll_action() else {
            panic!()
        };
        assert_eq!(sense_of(&rsp), (0x06, 0x29, 0x00));
        s.response_sent(id);
    }
    h.ctl.lock().unwrap().hold = true;
    // A read in flight on the other session, one on this one.
    let r = h.req(0, &rw10(0x28, 0, 1, 0), DataDir::Read, BS, TaskAttr::Simple);
    h.shard.session(other).unwrap().submit(h.now, r);
    h.submit(&rw10(0x28, 1, 1, 0), DataDir::Read, BS, TaskAttr::Simple);
    h.shard.session(h.sid).unwrap().task_mgmt(
        h.now,
        TmfRequest {
            func: TmfFunction::TargetReset,
            lun: Lun(0),
            tag: TaskTag(3),
        },
    );
    assert!(h.actions().is_empty());
    h.ctl.lock().unwrap().hold = false;
    h.poll();
    let a = h.actions();
    assert!(
        matches!(
            a[..],
            [Action::TmfDone {
                rsp: TmfResponse::Complete,
                ..
            }]
        ),
        "{a:?}"
    );
    // The aborted read of the other session never answers; its next command
    // gets the reset unit attention.
    let mut s = h.shard.session(other).unwrap();
    assert!(s.poll_action().is_none());
    let mut seen = Vec::new();
    for _ in 0..3 {
        let r = h.req(0, &[0; 6], DataDir::None, 0, TaskAttr::Simple);
        let mut s = h.shard.session(other).unwrap();
        s.submit(h.now, r);
        let Some(Action::Respond { id, rsp, .. }) = s.poll_action() else {
            panic!()
        };
        s.response_sent(id);
        seen.push(rsp.status);
    }
    assert_eq!(seen, [Status::CHECK_CONDITION, Status::GOOD, Status::GOOD]);
    good(&h.run(&[0; 6], DataDir::None, 0, &[]));
}

#[test]
fn remote_reset_on_another_shard() {
    // Shard B (another core) has a session on the same device with a read in
    // flight; the LU reset received on shard A reaches B by message.
    let h = H::ready();
    let mut b = Shard::new(1, BufPool::new(4096, 8));
    let sb = b.open_session(h.now, nexus(9), h.map.clone(), false);
    let req = |tag: u64, cdb: &[u8]| CmdRequest {
        lun: Lun(0),
        lun_raw: Lun(0).encode(),
        tag: TaskTag(tag),
        cdb: Cdb::from_slice(cdb),
        attr: TaskAttr::Simple,
        dir: DataDir::Read,
        expected_len: BS,
        expected_read_len: 0,
    };
    let mut s = b.session(sb).unwrap();
    s.submit(h.now, req(1, &[0; 6]));
    let Some(Action::Respond { id, .. }) = s.poll_action() else {
        panic!()
    };
    s.response_sent(id);
    h.ctl.lock().unwrap().hold = true;
    b.session(sb)
        .unwrap()
        .submit(h.now, req(2, &rw10(0x28, 0, 1, 0)));
    let r = b.remote_reset(h.now, ResetScope::LogicalUnit(h.dev.id));
    let mut done = Vec::new();
    b.drained_resets(&mut done);
    assert!(done.is_empty(), "drained before the backend answered");
    h.ctl.lock().unwrap().hold = false;
    b.poll(h.now);
    b.drained_resets(&mut done);
    assert_eq!(done, vec![r]);
    let mut s = b.session(sb).unwrap();
    assert!(s.poll_action().is_none(), "the aborted read answered");
    s.submit(h.now, req(3, &[0; 6]));
    let Some(Action::Respond { rsp, .. }) = s.poll_action() else {
        panic!()
    };
    assert_eq!(sense_of(&rsp), (0x06, 0x29, 0x03));
    // Nothing to drain: done at once.
    let r2 = b.remote_reset(h.now, ResetScope::Target("iqn.2026-01.test:other".into()));
    b.drained_resets(&mut done);
    assert_eq!(done, vec![r, r2]);
}

#[test]
fn get_lba_status_reports_the_backend_mapping() {
    let gls = |lba: u64, alloc: u32| -> [u8; 16] {
        let mut c = rw16(0x9e, lba, alloc);
        c[1] = 0x12;
        c
    };
    let mut h = thin(BLOCKS, THIN_CAPS);
    good(&h.run(&rw10(0x2a, 0, 16, 0), DataDir::Write, 16 * BS, &[1; 8192]));
    let list = unmap_list(&[(4, 4)]);
    good(&h.run(&unmap_cdb(24), DataDir::Write, 24, &list));
    let d = data_of(&h.run(&gls(0, 64), DataDir::Read, 64, &[]));
    // Header plus three descriptors: 0..4 mapped, 4..8 deallocated, 8.. mapped.
    assert_eq!(&d[..4], &(4u32 + 48).to_be_bytes());
    let desc = |i: usize| {
        let x = &d[8 + 16 * i..8 + 16 * (i + 1)];
        (
            u64::from_be_bytes(x[..8].try_into().unwrap()),
            u32::from_be_bytes(x[8..12].try_into().unwrap()),
            x[12],
        )
    };
    assert_eq!(desc(0), (0, 4, 0));
    assert_eq!(desc(1), (4, 4, 1));
    assert_eq!(desc(2), (8, (BLOCKS - 8) as u32, 0));
    // The allocation length bounds the descriptors (at least one).
    let d = data_of(&h.run(&gls(5, 24), DataDir::Read, 24, &[]));
    assert_eq!(d.len(), 24);
    assert_eq!(&d[8..16], &5u64.to_be_bytes());
    assert_eq!(d[20], 1);
    // Starting beyond the capacity.
    let r = h.run(&gls(BLOCKS, 24), DataDir::Read, 24, &[]);
    assert_eq!(sense_of(&r), (0x05, 0x21, 0x00));
    let r = h.run(&gls(u64::MAX, 24), DataDir::Read, 24, &[]);
    assert_eq!(sense_of(&r), (0x05, 0x21, 0x00));
}

// ----- statistics -----

#[test]
fn statistics_count_directions_bytes_errors_and_latency() {
    use ferrite_core::{IoDir, SizeClass};
    use std::time::Duration;
    let mut h = H::ready();
    let base = h.shard.stats();
    let dev = DeviceId(1);
    // The POWER ON unit attention of `ready` was one failed command.
    assert_eq!(base.devices[&dev].errors, 1);
    assert_eq!(base.devices[&dev].cmds(IoDir::Other), 1);
    // A 8 KiB write and a 4 KiB read, each taking 300 us of virtual time
    // between submit and the poll that completes it.
    let d = pattern(16 * BS as usize, 3);
    let w = h.submit(
        &rw10(0x2a, 0, 16, 0),
        DataDir::Write,
        16 * BS,
        TaskAttr::Simple,
    );
    let Some(Action::FetchData { mut buf, .. }) = h.actions().into_iter().next() else {
        panic!("no FetchData")
    };
    buf.copy_in(0, &d);
    h.now += Duration::from_micros(300);
    h.shard
        .session(h.sid)
        .unwrap()
        .data_out_done_at(h.now, w, Ok(buf));
    assert_eq!(h.shard.stats().devices[&dev].active, 1);
    h.now += Duration::from_micros(300);
    h.poll();
    let acts = h.actions();
    assert!(matches!(acts.as_slice(), [Action::Respond { .. }]));
    h.shard.session(h.sid).unwrap().response_sent(w);
    let r = h.submit(
        &rw10(0x28, 0, 8, 0),
        DataDir::Read,
        8 * BS,
        TaskAttr::Simple,
    );
    h.now += Duration::from_micros(3000);
    h.poll();
    assert_eq!(h.actions().len(), 1);
    h.shard.session(h.sid).unwrap().response_sent(r);
    // An unknown opcode: CHECK CONDITION.
    let r = h.run(&[0xff, 0, 0, 0, 0, 0], DataDir::None, 0, &[]);
    assert_eq!(r.status, Status::CHECK_CONDITION);
    // A read held in the backend, then aborted: active, then an error.
    h.ctl.lock().unwrap().hold = true;
    h.submit(&rw10(0x28, 0, 1, 0), DataDir::Read, BS, TaskAttr::Simple);
    let s = h.shard.stats();
    assert_eq!(s.devices[&dev].active, 1);
    assert_eq!(s.sessions[&h.sid].active, 1);
    let tmf = TmfRequest {
        func: TmfFunction::AbortTaskSet,
        lun: Lun(0),
        tag: TaskTag(999),
    };
    h.shard.session(h.sid).unwrap().task_mgmt(h.now, tmf);
    h.ctl.lock().unwrap().hold = false;
    h.poll();
    h.actions();

    let s = h.shard.stats();
    let dv = &s.devices[&dev];
    assert_eq!(dv.active, 0);
    assert_eq!(dv.cmds(IoDir::Write), 1);
    assert_eq!(dv.bytes(IoDir::Write), 16 * 512);
    assert_eq!(dv.cmds(IoDir::Read), 2);
    assert_eq!(dv.bytes(IoDir::Read), 8 * 512);
    assert_eq!(dv.cmds(IoDir::Other), 2);
    assert_eq!(dv.errors, 3);
    // The write took 600 us (bucket <= 1024 us), in the <= 64 KiB class.
    let wl = dv.latency(IoDir::Write, SizeClass::UpTo64K);
    assert_eq!(wl.count, 1);
    assert_eq!(wl.sum_us, 600);
    assert_eq!(wl.buckets[10], 1);
    // The read took 3 ms, 4 KiB: class <= 4 KiB, bucket <= 4096 us. The
    // aborted read has no latency.
    let rl = dv.latency(IoDir::Read, SizeClass::UpTo4K);
    assert_eq!((rl.count, rl.sum_us, rl.buckets[12]), (1, 3000, 1));
    // The session saw the same commands.
    let ss = &s.sessions[&h.sid];
    assert_eq!(ss.cmds, dv.cmds);
    assert_eq!(ss.bytes, dv.bytes);
    assert_eq!(ss.errors, dv.errors);
    // Merging two cores adds up.
    let mut m = s.clone();
    m.merge(&s);
    assert_eq!(m.devices[&dev].cmds(IoDir::Read), 4);
    assert_eq!(m.total().errors, 6);
    // A closed session's counters go; the device's stay.
    h.shard.close_session(h.now, h.sid);
    let s = h.shard.stats();
    assert!(s.sessions.is_empty());
    assert_eq!(s.devices[&dev].cmds(IoDir::Write), 1);
}

// ----- COMPARE AND WRITE, ORWRITE, RESERVE/RELEASE -----

fn caw(lba: u64, blocks: u8) -> [u8; 16] {
    let mut c = [0u8; 16];
    c[0] = 0x89;
    c[2..10].copy_from_slice(&lba.to_be_bytes());
    c[13] = blocks;
    c
}

impl H {
    fn run_as(
        &mut self,
        sid: SessionId,
        cdb: &[u8],
        dir: DataDir,
        len: u32,
        data: &[u8],
    ) -> Response {
        let me = self.sid;
        self.sid = sid;
        let r = self.run(cdb, dir, len, data);
        self.sid = me;
        r
    }
}

#[test]
fn compare_and_write_matches_miscompares_and_checks_sizes() {
    let mut h = H::ready();
    let a = vec![b'A'; BS as usize];
    good(&h.run(&rw10(0x2a, 3, 1, 0), DataDir::Write, BS, &a));
    let mut d = a.clone();
    d.extend(vec![b'B'; BS as usize]);
    good(&h.run(&caw(3, 1), DataDir::Write, 2 * BS, &d));
    assert_eq!(
        data_of(&h.run(&rw10(0x28, 3, 1, 0), DataDir::Read, BS, &[])),
        vec![b'B'; 512]
    );
    // The medium now holds 'B': a compare half that differs at byte 100
    // miscompares there, and nothing is written.
    let mut d2 = vec![b'B'; BS as usize];
    d2[100] = b'Z';
    d2.extend(vec![b'C'; BS as usize]);
    let r = h.run(&caw(3, 1), DataDir::Write, 2 * BS, &d2);
    assert_eq!(sense_of(&r), (0x0e, 0x1d, 0x00));
    let s = r.sense.as_ref().unwrap();
    assert_eq!(u32::from_be_bytes([s[3], s[4], s[5], s[6]]), 100);
    assert_eq!(
        data_of(&h.run(&rw10(0x28, 3, 1, 0), DataDir::Read, BS, &[])),
        vec![b'B'; 512]
    );
    // A Data-Out that is not exactly twice the blocks is refused.
    let r = h.run(&caw(3, 1), DataDir::Write, 4 * BS, &d);
    assert_eq!(sense_of(&r), (0x05, 0x24, 0x00));
    let r = h.run(&caw(3, 0), DataDir::Write, 2 * BS, &d);
    assert_eq!(sense_of(&r), (0x05, 0x24, 0x00));
    // Beyond the end.
    let r = h.run(&caw(BLOCKS, 1), DataDir::Write, 2 * BS, &d);
    assert_eq!(sense_of(&r), (0x05, 0x21, 0x00));
}

#[test]
fn orwrite_ors_data_into_the_medium() {
    let mut h = H::ready();
    good(&h.run(
        &rw10(0x2a, 0, 2, 0),
        DataDir::Write,
        2 * BS,
        &vec![0x0f; 1024],
    ));
    let mut c = rw16(0x8b, 0, 2);
    c[1] = 0x08; // FUA
    good(&h.run(&c, DataDir::Write, 2 * BS, &vec![0xf0; 1024]));
    assert_eq!(
        data_of(&h.run(&rw10(0x28, 0, 2, 0), DataDir::Read, 2 * BS, &[])),
        vec![0xff; 1024]
    );
    // ORPROTECT is not supported.
    let mut c = rw16(0x8b, 0, 1);
    c[1] = 0x20;
    assert_eq!(
        sense_of(&h.run(&c, DataDir::Write, BS, &[0; 512])),
        (0x05, 0x24, 0x00)
    );
}

#[test]
fn compare_and_write_holds_its_range_against_other_writers() {
    let mut h = H::ready();
    let other = h.shard.open_session(h.now, nexus(2), h.map.clone(), false);
    let _ = h.run_as(other, &[0; 6], DataDir::None, 0, &[]); // POWER ON
    good(&h.run(&rw10(0x2a, 0, 1, 0), DataDir::Write, BS, &[b'A'; 512]));
    // Two COMPARE AND WRITEs of 'A' -> own letter, one per session, and a
    // plain WRITE of the same block, all issued while the backend holds.
    h.ctl.lock().unwrap().hold = true;
    let mut ids = Vec::new();
    for (sid, letter) in [(h.sid, b'X'), (other, b'Y')] {
        let r = h.req(0, &caw(0, 1), DataDir::Write, 2 * BS, TaskAttr::Simple);
        let id = h.shard.session(sid).unwrap().submit(h.now, r);
        let a = h.shard.session(sid).unwrap().poll_action();
        let Some(Action::FetchData { mut buf, .. }) = a else {
            panic!("{a:?}")
        };
        buf.copy_in(0, &[b'A'; 512]);
        buf.copy_in(512, &[letter; 512]);
        h.shard.session(sid).unwrap().data_out_done(id, Ok(buf));
        ids.push((sid, id));
    }
    // Only the first read reached the backend; the second COMPARE AND WRITE
    // waits for the range.
    assert_eq!(
        h.ctl
            .lock()
            .unwrap()
            .log
            .iter()
            .filter(|l| l.0 == "R")
            .count(),
        1
    );
    assert!(h.shard.wants_spin());
    h.ctl.lock().unwrap().hold = false;
    let mut results = Vec::new();
    for _ in 0..20 {
        h.poll();
        for (sid, id) in &ids {
            let mut s = h.shard.session(*sid).unwrap();
            while let Some(a) = s.poll_action() {
                if let Action::Respond { id: i, rsp, .. } = a {
                    assert_eq!(i, *id);
                    results.push(rsp.status);
                    s.response_sent(i);
                }
            }
        }
    }
    assert_eq!(results.len(), 2);
    assert_eq!(results.iter().filter(|s| **s == Status::GOOD).count(), 1);
    assert_eq!(
        results
            .iter()
            .filter(|s| **s == Status::CHECK_CONDITION)
            .count(),
        1
    );
    assert_eq!(
        data_of(&h.run(&rw10(0x28, 0, 1, 0), DataDir::Read, BS, &[])),
        vec![b'X'; 512]
    );
}

#[test]
fn spc2_reserve_release_between_two_nexuses() {
    let mut h = H::ready();
    let other = h.shard.open_session(h.now, nexus(2), h.map.clone(), false);
    let _ = h.run_as(other, &[0; 6], DataDir::None, 0, &[]); // POWER ON
    good(&h.run(&[0x16, 0, 0, 0, 0, 0], DataDir::None, 0, &[]));
    good(&h.run(&[0x16, 0, 0, 0, 0, 0], DataDir::None, 0, &[]));
    let conflict = |r: &Response| assert_eq!(r.status, Status::RESERVATION_CONFLICT);
    conflict(&h.run_as(other, &[0x16, 0, 0, 0, 0, 0], DataDir::None, 0, &[]));
    conflict(&h.run_as(other, &[0; 6], DataDir::None, 0, &[]));
    conflict(&h.run_as(other, &rw10(0x28, 0, 1, 0), DataDir::Read, BS, &[]));
    good(&h.run_as(other, &inquiry(false, 0, 36), DataDir::Read, 36, &[]));
    // RELEASE from the other nexus: GOOD, and nothing changes.
    good(&h.run_as(other, &[0x17, 0, 0, 0, 0, 0], DataDir::None, 0, &[]));
    conflict(&h.run_as(other, &[0; 6], DataDir::None, 0, &[]));
    good(&h.run(&[0; 6], DataDir::None, 0, &[]));
    // The holder's nexus goes away: released.
    h.shard.close_session(h.now, h.sid);
    good(&h.run_as(
        other,
        &[0x56, 0, 0, 0, 0, 0, 0, 0, 0, 0],
        DataDir::None,
        0,
        &[],
    ));
    good(&h.run_as(other, &[0; 6], DataDir::None, 0, &[]));
    // A LOGICAL UNIT RESET releases it too.
    let third = h.shard.open_session(h.now, nexus(3), h.map.clone(), false);
    let _ = h.run_as(third, &[0; 6], DataDir::None, 0, &[]);
    conflict(&h.run_as(third, &[0; 6], DataDir::None, 0, &[]));
    h.shard.session(other).unwrap().task_mgmt(
        h.now,
        TmfRequest {
            func: TmfFunction::LogicalUnitReset,
            lun: Lun(0),
            tag: TaskTag(77),
        },
    );
    let _ = h.run_as(third, &[0; 6], DataDir::None, 0, &[]); // BUS DEVICE RESET UA
    good(&h.run_as(third, &[0; 6], DataDir::None, 0, &[]));
}

#[test]
fn prefetch_and_read_defect_data() {
    let mut h = H::ready();
    good(&h.run(&rw10(0x34, 0, 8, 0), DataDir::None, 0, &[]));
    assert_eq!(
        sense_of(&h.run(&rw10(0x34, BLOCKS as u32, 1, 0), DataDir::None, 0, &[])),
        (0x05, 0x21, 0x00)
    );
    good(&h.run(&rw16(0x90, 0, 8), DataDir::None, 0, &[]));
    let r = h.run(
        &[0x37, 0, 0x18, 0, 0, 0, 0, 0, 32, 0],
        DataDir::Read,
        32,
        &[],
    );
    assert_eq!(data_of(&r), vec![0, 0x18, 0, 0]);
    let r = h.run(
        &[0xb7, 0x0d, 0, 0, 0, 0, 0, 0, 0, 32, 0, 0],
        DataDir::Read,
        32,
        &[],
    );
    assert_eq!(data_of(&r), vec![0, 0x0d, 0, 0, 0, 0, 0, 0]);
}

#[test]
fn mode_select_swp_and_d_sense_with_unit_attention_elsewhere() {
    let mut h = H::ready();
    let other = h.shard.open_session(h.now, nexus(2), h.map.clone(), false);
    let _ = h.run_as(other, &[0; 6], DataDir::None, 0, &[]); // POWER ON
    // Current Control page, then SWP and D_SENSE set.
    let r = h.run(&[0x1a, 0x08, 0x0a, 0, 255, 0], DataDir::Read, 255, &[]);
    let page = data_of(&r)[4..].to_vec();
    assert_eq!(page[0], 0x0a);
    let mut data = vec![0u8, 0, 0, 0];
    data.extend(&page);
    data[4] &= 0x3f;
    data[4 + 2] |= 0x04;
    data[4 + 4] |= 0x08;
    let n = data.len() as u8;
    good(&h.run(&[0x15, 0x10, 0, 0, n, 0], DataDir::Write, n as u32, &data));
    // Writes are refused (DATA PROTECT) and sense is in descriptor format.
    let r = h.run(&rw10(0x2a, 0, 1, 0), DataDir::Write, BS, &[0; 512]);
    let s = r.sense.as_ref().unwrap();
    assert_eq!((s[0], s[1], s[2], s[3]), (0x72, 0x07, 0x27, 0x00));
    // MODE SENSE reports WP.
    let r = h.run(&[0x1a, 0x08, 0x0a, 0, 255, 0], DataDir::Read, 255, &[]);
    assert_eq!(data_of(&r)[2] & 0x80, 0x80);
    // The other nexus sees MODE PARAMETERS CHANGED once.
    let r = h.run_as(other, &[0; 6], DataDir::None, 0, &[]);
    let s = r.sense.as_ref().unwrap();
    assert_eq!((s[1], s[2], s[3]), (0x06, 0x2a, 0x01));
    good(&h.run_as(other, &[0; 6], DataDir::None, 0, &[]));
    // A non-changeable bit is refused; SP is refused.
    let mut bad = data.clone();
    bad[4 + 3] ^= 0x02;
    let r = h.run(&[0x15, 0x10, 0, 0, n, 0], DataDir::Write, n as u32, &bad);
    assert_eq!(r.status, Status::CHECK_CONDITION);
    let r = h.run(&[0x15, 0x11, 0, 0, n, 0], DataDir::Write, n as u32, &data);
    assert_eq!(r.status, Status::CHECK_CONDITION);
    // Clearing both restores writes and fixed sense.
    data[4 + 2] &= !0x04;
    data[4 + 4] &= !0x08;
    good(&h.run(&[0x15, 0x10, 0, 0, n, 0], DataDir::Write, n as u32, &data));
    good(&h.run(&rw10(0x2a, 0, 1, 0), DataDir::Write, BS, &[0; 512]));
    let r = h.run(
        &rw10(0x2a, BLOCKS as u32, 1, 0),
        DataDir::Write,
        BS,
        &[0; 512],
    );
    assert_eq!(sense_of(&r), (0x05, 0x21, 0x00));
}

#[test]
fn write_atomic_16_writes_and_reports_its_limits() {
    let mut h = H::ready();
    let mut c = [0u8; 16];
    c[0] = 0x9c;
    c[2..10].copy_from_slice(&5u64.to_be_bytes());
    c[13] = 2;
    good(&h.run(&c, DataDir::Write, 2 * BS, &pattern(1024, 9)));
    assert_eq!(
        data_of(&h.run(&rw10(0x28, 5, 2, 0), DataDir::Read, 2 * BS, &[])),
        pattern(1024, 9)
    );
    // An ATOMIC BOUNDARY is not supported; beyond the end is out of range.
    let mut b = c;
    b[11] = 1;
    assert_eq!(
        sense_of(&h.run(&b, DataDir::Write, 2 * BS, &pattern(1024, 9))),
        (0x05, 0x24, 0x00)
    );
    let mut e = c;
    e[2..10].copy_from_slice(&(BLOCKS - 1).to_be_bytes());
    assert_eq!(
        sense_of(&h.run(&e, DataDir::Write, 2 * BS, &pattern(1024, 9))),
        (0x05, 0x21, 0x00)
    );
    // Block limits: MAXIMUM ATOMIC TRANSFER LENGTH <= MAXIMUM TRANSFER
    // LENGTH, alignment and granularity 1.
    let v = data_of(&h.run(&inquiry(true, 0xb0, 64), DataDir::Read, 64, &[]));
    let be = |i: usize| u32::from_be_bytes([v[i], v[i + 1], v[i + 2], v[i + 3]]);
    assert!(be(44) > 0 && be(44) <= be(8));
    assert_eq!((be(48), be(52)), (1, 1));
}

#[test]
fn lu_reset_reaches_nexuses_of_other_shards_through_the_device() {
    let mut h = H::ready();
    // A nexus of another core, its POWER ON unit attention consumed.
    let mut b = Shard::new(1, BufPool::new(4096, 16));
    let sb = b.open_session(h.now, nexus(9), h.map.clone(), false);
    let tur = |b: &mut Shard, tag: u64| {
        let mut s = b.session(sb).unwrap();
        let req = CmdRequest {
            lun: Lun(0),
            lun_raw: Lun(0).encode(),
            tag: TaskTag(tag),
            cdb: Cdb::from_slice(&[0; 6]),
            attr: TaskAttr::Simple,
            dir: DataDir::None,
            expected_len: 0,
            expected_read_len: 0,
        };
        s.submit(Instant::now(), req);
        let Some(Action::Respond { id, rsp, .. }) = s.poll_action() else {
            panic!()
        };
        s.response_sent(id);
        rsp
    };
    assert_eq!(sense_of(&tur(&mut b, 1)), (0x06, 0x29, 0x00));
    good(&tur(&mut b, 2));
    h.shard.session(h.sid).unwrap().task_mgmt(
        h.now,
        TmfRequest {
            func: TmfFunction::LogicalUnitReset,
            lun: Lun(0),
            tag: TaskTag(50),
        },
    );
    h.actions();
    // No message between the shards: the device's reset generation moved.
    assert_eq!(sense_of(&tur(&mut b, 3)), (0x06, 0x29, 0x03));
    good(&tur(&mut b, 4));
    assert_eq!(
        sense_of(&h.run(&[0; 6], DataDir::None, 0, &[])),
        (0x06, 0x29, 0x03)
    );
    good(&h.run(&[0; 6], DataDir::None, 0, &[]));
}

#[test]
fn report_supported_task_management_functions() {
    let mut h = H::ready();
    let r = h.run(
        &[0xa3, 0x0d, 0, 0, 0, 0, 0, 0, 0, 16, 0, 0],
        DataDir::Read,
        16,
        &[],
    );
    assert_eq!(data_of(&r), vec![0xde, 0x07, 0, 0]);
    let r = h.run(
        &[0xa3, 0x0d, 0x80, 0, 0, 0, 0, 0, 0, 16, 0, 0],
        DataDir::Read,
        16,
        &[],
    );
    let d = data_of(&r);
    assert_eq!((d.len(), d[3]), (16, 0x0c));
    // Listed in REPORT SUPPORTED OPERATION CODES (one command, with SA).
    let r = h.run(
        &[0xa3, 0x0c, 0x02, 0xa3, 0, 0x0d, 0, 0, 0, 64, 0, 0],
        DataDir::Read,
        64,
        &[],
    );
    assert_eq!(data_of(&r)[1] & 0x07, 0x03);
}

// ----- the data budget -----

#[test]
fn large_write_is_fetched_and_written_a_chunk_at_a_time() {
    let mut h = H::build(DeviceFlags::default(), false, 20000, Caps::default());
    h.run(&[0; 6], DataDir::None, 0, &[]);
    let len = 3 * (1 << 20) + 4096;
    let data = pattern(len, 9);
    let cdb = rw16(0x8a, 8, (len / 512) as u32);
    good(&h.run(&cdb, DataDir::Write, len as u32, &data));
    let c = h.ctl.lock().unwrap();
    let chunk = ferrite_core::budget::WRITE_CHUNK as usize;
    let writes: Vec<_> = c.log.iter().filter(|e| e.0 == "W").collect();
    assert_eq!(writes.len(), 4);
    for (i, w) in writes.iter().enumerate() {
        assert_eq!(w.1, (8 * 512 + i * chunk) as u64);
        assert_eq!(w.2, (len - i * chunk).min(chunk));
    }
    assert_eq!(&c.data[8 * 512..8 * 512 + len], &data[..]);
}

/// FetchData actions of one session, answered later by the test.
fn fetches(h: &mut H, sid: SessionId) -> Vec<(CmdId, ferrite_reactor::buf::SgList)> {
    let mut s = h.shard.session(sid).unwrap();
    std::iter::from_fn(|| s.poll_action())
        .map(|a| match a {
            Action::FetchData { id, buf, .. } => (id, buf),
            other => panic!("unexpected action {other:?}"),
        })
        .collect()
}

#[test]
fn commands_wait_for_the_data_budget_and_a_quiet_session_is_served() {
    use ferrite_core::budget::{DataBudget, MIN_LIMIT};
    let mut h = H::build(DeviceFlags::default(), false, 4096, Caps::default());
    h.run(&[0; 6], DataDir::None, 0, &[]);
    let budget = Arc::new(DataBudget::new(MIN_LIMIT));
    h.shard.set_budget(budget.clone());
    // A session asks for 80 writes of 1 MiB and sends no data: it gets the
    // shared part (56 of 64 MiB) and the rest wait.
    let mib = 1u32 << 20;
    for _ in 0..80 {
        h.submit(
            &rw16(0x8a, 0, mib / 512),
            DataDir::Write,
            mib,
            TaskAttr::Simple,
        );
    }
    let sid = h.sid;
    let mut held = fetches(&mut h, sid);
    assert_eq!(held.len(), 56);
    let st = budget.stats();
    assert_eq!((st.used, st.waiting), (56 << 20, 24));
    // Another session, holding nothing, is served from the reserve.
    let other = h.shard.open_session(h.now, nexus(2), h.map.clone(), false);
    let r = h.req(0, &[0; 6], DataDir::None, 0, TaskAttr::Simple);
    h.shard.session(other).unwrap().submit(h.now, r);
    let mut s = h.shard.session(other).unwrap();
    while s.poll_action().is_some() {}
    let r = h.req(0, &rw16(0x8a, 8, 8), DataDir::Write, 4096, TaskAttr::Simple);
    let small = h.shard.session(other).unwrap().submit(h.now, r);
    let got = fetches(&mut h, other);
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].0, small);
    // While both hold buffers, the first is over its share (28 MiB) and
    // its waiters stay put even when it gives some back.
    let (id, buf) = held.pop().unwrap();
    h.shard.session(sid).unwrap().data_out_done(id, Ok(buf));
    let mut done = 0;
    for _ in 0..4 {
        h.shard.poll(h.now);
        let mut s = h.shard.session(sid).unwrap();
        while let Some(a) = s.poll_action() {
            match a {
                Action::Respond { id, .. } => {
                    s.response_sent(id);
                    done += 1;
                }
                other => panic!("unexpected action {other:?}"),
            }
        }
    }
    assert_eq!(done, 1);
    assert_eq!(budget.stats().waiting, 24);
    let (id, buf) = got.into_iter().next().unwrap();
    h.shard.session(other).unwrap().data_out_done(id, Ok(buf));
    for _ in 0..4 {
        h.shard.poll(h.now);
        let mut s = h.shard.session(other).unwrap();
        while let Some(a) = s.poll_action() {
            match a {
                Action::Respond { id, .. } => s.response_sent(id),
                other => panic!("unexpected action {other:?}"),
            }
        }
    }
    // The first session alone again: its share is the shared part, and
    // one more write of it completing lets one waiter in.
    let (id, buf) = held.pop().unwrap();
    h.shard.session(h.sid).unwrap().data_out_done(id, Ok(buf));
    for _ in 0..4 {
        h.shard.poll(h.now);
    }
    let mut s = h.shard.session(h.sid).unwrap();
    let mut next = Vec::new();
    while let Some(a) = s.poll_action() {
        match a {
            Action::Respond { id, rsp, .. } => {
                assert_eq!(rsp.status, Status::GOOD);
                s.response_sent(id);
            }
            Action::FetchData { id, buf, .. } => next.push((id, buf)),
            other => panic!("unexpected action {other:?}"),
        }
    }
    // The response sent frees that write's buffer for the next waiter.
    h.shard.poll(h.now);
    next.extend(fetches(&mut h, sid));
    assert_eq!(next.len(), 2);
    assert_eq!(budget.stats().waiting, 22);
    // Closing the session releases every buffer it held or waited for.
    drop(held);
    drop(next);
    h.shard.close_session(h.now, h.sid);
    h.shard.poll(h.now);
    let st = budget.stats();
    assert_eq!((st.used, st.waiting, st.holders), (0, 0, 0));
}
