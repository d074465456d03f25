//! SBC-4 §5.30 SANITIZE and the §4.11 sanitize operation it starts: the
//! CDB and parameter list checks, the per-device sanitize state every core
//! consults (in progress, failed), the conditions other commands meet
//! meanwhile, and the operation itself as a sequence of block operations
//! ([`Operation`]) that a [`Shard`](crate::Shard) carries out.
//!
//! Service actions: OVERWRITE (pattern, INVERT, OVERWRITE COUNT passes,
//! each pass over the whole capacity, then a flush), BLOCK ERASE (the
//! whole capacity deallocated; offered only where the device reports
//! logical block provisioning, since reads after it return what LBPRZ says
//! and GET LBA STATUS reports the blocks deallocated), EXIT FAILURE MODE.
//! CRYPTOGRAPHIC ERASE is not offered: no backend keeps its data encrypted
//! under a key it could destroy (INVALID FIELD IN CDB, not reported by
//! REPORT SUPPORTED OPERATION CODES, WACEREQ 00b).
//!
//! An operation belongs to its device, not to the command that started
//! it: SBC-4 §4.11.1 has it survive task management and nexus loss, so
//! aborting the SANITIZE task (or a LOGICAL UNIT RESET, or a logout) ends
//! the task and the operation goes on. Overwrite passes write at most
//! [`RATE_BYTES_PER_SEC`], one chunk at a time, so that a sanitize of one
//! device leaves the core's other logical units their bandwidth.
//!
//! Not owned here: running the block operations, ordering and answering
//! commands (see [`crate::shard`]). The state is not saved: a sanitize
//! interrupted by a restart of the target is not resumed.

use std::sync::atomic::{AtomicU8, AtomicU16, Ordering};
use std::time::Duration;

use ferrite_scsi::Sense;

use crate::cmd::{DataDir, Residual};
use crate::device::LunEntry;
use crate::emulate::{self, Plan};

/// SANITIZE service actions (SBC-4 table 67).
pub mod sa {
    pub const OVERWRITE: u8 = 0x01;
    pub const BLOCK_ERASE: u8 = 0x02;
    pub const CRYPTOGRAPHIC_ERASE: u8 = 0x03;
    pub const EXIT_FAILURE_MODE: u8 = 0x1f;
}

/// The bandwidth an overwrite pass may use on its device.
pub const RATE_BYTES_PER_SEC: u64 = 48 << 20;

/// Bytes per write of an overwrite pass (the largest transfer).
const WRITE_CHUNK: u64 = emulate::MAX_TRANSFER_BYTES;

/// Bytes per deallocation of a block erase.
const UNMAP_CHUNK: u64 = 1 << 30;

/// A decoded SANITIZE CDB (SBC-4 §5.30.1).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SanitizeCdb {
    pub immed: bool,
    pub ause: bool,
    pub sa: u8,
    pub param_len: u16,
}

/// Decodes and checks a SANITIZE CDB: reserved bits (byte 1 bit 6, the ZNR
/// bit of zoned devices, and bytes 2..6) must be zero; the parameter list
/// is 5 to block size + 4 bytes for OVERWRITE and empty otherwise.
pub fn decode(cdb: &[u8], block_size: u32, block_erase: bool) -> Result<SanitizeCdb, Sense> {
    if cdb.len() < 10 {
        return Err(Sense::INVALID_FIELD_IN_CDB.cdb_field(0, None));
    }
    if cdb[1] & 0x40 != 0 {
        return Err(Sense::INVALID_FIELD_IN_CDB.cdb_field(1, Some(6)));
    }
    if let Some(i) = (2..7).find(|&i| cdb[i] != 0) {
        return Err(Sense::INVALID_FIELD_IN_CDB.cdb_field(i as u16, None));
    }
    let c = SanitizeCdb {
        immed: cdb[1] & 0x80 != 0,
        ause: cdb[1] & 0x20 != 0,
        sa: cdb[1] & 0x1f,
        param_len: u16::from_be_bytes([cdb[7], cdb[8]]),
    };
    let supported = match c.sa {
        sa::OVERWRITE | sa::EXIT_FAILURE_MODE => true,
        sa::BLOCK_ERASE => block_erase,
        _ => false,
    };
    if !supported {
        return Err(Sense::INVALID_FIELD_IN_CDB.cdb_field(1, Some(4)));
    }
    // SBC-4 §5.30.2.2: OVERWRITE needs the four header bytes and a pattern
    // of at most one logical block; the other service actions take no
    // parameter list.
    let len_ok = if c.sa == sa::OVERWRITE {
        c.param_len > 4 && u32::from(c.param_len) <= block_size + 4
    } else {
        c.param_len == 0
    };
    if !len_ok {
        return Err(Sense::INVALID_FIELD_IN_CDB.cdb_field(7, None));
    }
    Ok(c)
}

/// Plans a SANITIZE for [`emulate::plan`].
pub(crate) fn plan(cdb: &[u8], e: &LunEntry, expected_len: u32, dir: DataDir) -> Plan {
    let geo = e.device.geometry();
    let c = match decode(cdb, geo.block_size, block_erase_supported(e)) {
        Ok(c) => c,
        Err(s) => return Plan::Fail(s, Residual::None),
    };
    // SBC-4 §4.11: a sanitize alters the medium; a write-protected one
    // refuses it.
    if c.sa != sa::EXIT_FAILURE_MODE && e.write_protected() {
        return Plan::Fail(Sense::WRITE_PROTECTED, Residual::None);
    }
    match emulate::data_out_residual(
        u64::from(c.param_len),
        emulate::data_out_len(expected_len, dir),
    ) {
        Ok(residual) => Plan::Sanitize {
            sa: c.sa,
            immed: c.immed,
            ause: c.ause,
            param_len: u32::from(c.param_len),
            residual,
        },
        Err(p) => p,
    }
}

/// BLOCK ERASE is offered where blocks can be deallocated and the device
/// says so (LBPME): reads of them then return what LBPRZ promises.
pub(crate) fn block_erase_supported(e: &LunEntry) -> bool {
    emulate::lbpme(e)
}

/// The OVERWRITE parameter list (SBC-4 §5.30.2.2).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Overwrite {
    /// Invert the pattern between passes.
    pub invert: bool,
    /// OVERWRITE COUNT: passes, 1..=31.
    pub count: u8,
    /// One logical block of the initialization pattern, repeated as needed.
    pub block: Vec<u8>,
}

/// Parses an OVERWRITE parameter list for a device of `block_size`.
pub fn parse_overwrite(params: &[u8], block_size: u32) -> Result<Overwrite, Sense> {
    if params.len() < 5 {
        return Err(Sense::PARAMETER_LIST_LENGTH_ERROR);
    }
    let invert = params[0] & 0x80 != 0;
    let test = (params[0] >> 5) & 0x03;
    let count = params[0] & 0x1f;
    // The TEST field's non-zero values are vendor specific; this device
    // server has no test mode.
    if test != 0 {
        return Err(Sense::INVALID_FIELD_IN_PARAMETER_LIST.param_field(0, Some(6)));
    }
    // OVERWRITE COUNT 00h is reserved.
    if count == 0 {
        return Err(Sense::INVALID_FIELD_IN_PARAMETER_LIST.param_field(0, Some(4)));
    }
    // INITIALIZATION PATTERN LENGTH: 1..=block size, within the list.
    let ip_len = u16::from_be_bytes([params[2], params[3]]) as usize;
    if ip_len == 0 || ip_len > block_size as usize || ip_len + 4 > params.len() {
        return Err(Sense::INVALID_FIELD_IN_PARAMETER_LIST.param_field(2, None));
    }
    let pattern = &params[4..4 + ip_len];
    let block: Vec<u8> = pattern
        .iter()
        .copied()
        .cycle()
        .take(block_size as usize)
        .collect();
    Ok(Overwrite {
        invert,
        count,
        block,
    })
}

/// How a sanitize operation alters the medium.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Method {
    Overwrite(Overwrite),
    BlockErase,
}

/// The next block operation of a sanitize operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// Write the pattern (inverted or not) over `[offset, offset+len)`.
    Write {
        offset: u64,
        len: u64,
        inverted: bool,
    },
    /// Deallocate `[offset, offset+len)`.
    Unmap { offset: u64, len: u64 },
    /// Make what was written durable.
    Flush,
    /// The operation is complete.
    Done,
}

/// A sanitize operation as the sequence of block operations it takes:
/// every pass over `[0, capacity)` in chunks, then one flush.
#[derive(Clone, Debug)]
pub struct Operation {
    method: Method,
    capacity: u64,
    /// Current pass, from 0.
    pass: u32,
    /// Next byte of the current pass.
    next: u64,
    flushed: bool,
}

impl Operation {
    pub fn new(method: Method, capacity: u64) -> Operation {
        Operation {
            method,
            capacity,
            pass: 0,
            next: 0,
            flushed: false,
        }
    }

    fn passes(&self) -> u32 {
        match &self.method {
            Method::Overwrite(o) => u32::from(o.count),
            Method::BlockErase => 1,
        }
    }

    /// SBC-4 §5.30.2.2: with INVERT, the pattern is inverted between
    /// consecutive passes, starting inverted when the count is even so that
    /// the last pass writes the pattern itself.
    fn inverted(&self, pass: u32) -> bool {
        match &self.method {
            Method::Overwrite(o) => o.invert && (u32::from(o.count) - pass).is_multiple_of(2),
            Method::BlockErase => false,
        }
    }

    /// One block of what pass writes: the pattern, or its inversion.
    pub fn block(&self, inverted: bool) -> Vec<u8> {
        match &self.method {
            Method::Overwrite(o) if inverted => o.block.iter().map(|b| !b).collect(),
            Method::Overwrite(o) => o.block.clone(),
            Method::BlockErase => Vec::new(),
        }
    }

    /// The next block operation; call once the previous one completed.
    pub fn next_step(&mut self) -> Step {
        if self.pass >= self.passes() || self.capacity == 0 {
            if self.flushed {
                return Step::Done;
            }
            self.flushed = true;
            return Step::Flush;
        }
        let offset = self.next;
        let step = match self.method {
            Method::Overwrite(_) => {
                let len = WRITE_CHUNK.min(self.capacity - offset);
                Step::Write {
                    offset,
                    len,
                    inverted: self.inverted(self.pass),
                }
            }
            Method::BlockErase => Step::Unmap {
                offset,
                len: UNMAP_CHUNK.min(self.capacity - offset),
            },
        };
        let len = match step {
            Step::Write { len, .. } | Step::Unmap { len, .. } => len,
            _ => 0,
        };
        self.next += len;
        if self.next >= self.capacity {
            self.next = 0;
            self.pass += 1;
        }
        step
    }

    /// Bytes handed out so far over all passes.
    fn done_bytes(&self) -> u64 {
        u64::from(self.pass)
            .saturating_mul(self.capacity)
            .saturating_add(self.next)
    }

    /// PROGRESS INDICATION (SPC-4 §4.5.2.4.4): the fraction handed out, in
    /// 65536ths.
    pub fn progress(&self) -> u16 {
        let total = u128::from(self.passes()) * u128::from(self.capacity);
        if total == 0 {
            return 0;
        }
        let p = u128::from(self.done_bytes()) * 65536 / total;
        p.min(65535) as u16
    }

    /// How long after its start the operation may issue its next write:
    /// overwrite bytes go out at [`RATE_BYTES_PER_SEC`]; a block erase is
    /// not paced.
    pub fn next_write_after(&self) -> Duration {
        match self.method {
            Method::Overwrite(_) => {
                let ns =
                    u128::from(self.done_bytes()) * 1_000_000_000 / u128::from(RATE_BYTES_PER_SEC);
                Duration::from_nanos(u64::try_from(ns).unwrap_or(u64::MAX))
            }
            Method::BlockErase => Duration::ZERO,
        }
    }
}

const IDLE: u8 = 0;
const RUNNING: u8 = 1;
/// Failed; EXIT FAILURE MODE may clear it (AUSE was one).
const FAILED_UNRESTRICTED: u8 = 2;
/// Failed in the restricted completion mode (AUSE was zero): only a
/// sanitize that completes clears it.
const FAILED_RESTRICTED: u8 = 3;

/// Where a device's sanitize stands (SBC-4 §4.11).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    Idle,
    /// In progress, with the fraction done in 65536ths.
    Running(u16),
    /// The last sanitize failed; `ause`: EXIT FAILURE MODE may leave.
    Failed {
        ause: bool,
    },
}

/// The sanitize state of one device, shared by every core: commands on
/// any core read it with one atomic load.
#[derive(Debug, Default)]
pub(crate) struct SanitizeShared {
    state: AtomicU8,
    progress: AtomicU16,
}

impl SanitizeShared {
    pub(crate) fn status(&self) -> Status {
        match self.state.load(Ordering::Acquire) {
            RUNNING => Status::Running(self.progress.load(Ordering::Acquire)),
            FAILED_UNRESTRICTED => Status::Failed { ause: true },
            FAILED_RESTRICTED => Status::Failed { ause: false },
            _ => Status::Idle,
        }
    }

    /// Claims the device for a sanitize operation.
    pub(crate) fn begin(&self, ause: bool) -> Result<(), Sense> {
        let mut cur = self.state.load(Ordering::Acquire);
        loop {
            match cur {
                RUNNING => return Err(Sense::SANITIZE_IN_PROGRESS),
                // SBC-4 §4.11.3: after a failure in the restricted mode, a
                // sanitize asking for the unrestricted mode is refused.
                FAILED_RESTRICTED if ause => {
                    return Err(Sense::INVALID_FIELD_IN_CDB.cdb_field(1, Some(5)));
                }
                _ => {}
            }
            match self
                .state
                .compare_exchange(cur, RUNNING, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => {
                    self.progress.store(0, Ordering::Release);
                    return Ok(());
                }
                Err(now) => cur = now,
            }
        }
    }

    pub(crate) fn set_progress(&self, p: u16) {
        self.progress.store(p, Ordering::Release);
    }

    /// Ends the operation: idle if it completed, failed (in the mode AUSE
    /// chose) if not.
    pub(crate) fn finish(&self, ok: bool, ause: bool) {
        let s = match (ok, ause) {
            (true, _) => IDLE,
            (false, true) => FAILED_UNRESTRICTED,
            (false, false) => FAILED_RESTRICTED,
        };
        self.progress.store(0, Ordering::Release);
        self.state.store(s, Ordering::Release);
    }

    /// SBC-4 §5.30.2.5 EXIT FAILURE MODE: leaves a failure of the
    /// unrestricted mode; refused after a failure of the restricted mode
    /// (INVALID FIELD IN CDB) or while a sanitize runs; nothing to do
    /// otherwise.
    pub(crate) fn exit_failure_mode(&self) -> Result<(), Sense> {
        match self.state.compare_exchange(
            FAILED_UNRESTRICTED,
            IDLE,
            Ordering::AcqRel,
            Ordering::Acquire,
        ) {
            Ok(_) | Err(IDLE) => Ok(()),
            Err(RUNNING) => Err(Sense::SANITIZE_IN_PROGRESS),
            Err(_) => Err(Sense::INVALID_FIELD_IN_CDB.cdb_field(1, Some(4))),
        }
    }

    /// SBC-4 §4.11.1: what `op` meets while a sanitize runs or after one
    /// failed, if anything. While it runs, every command but INQUIRY,
    /// REPORT LUNS, REQUEST SENSE and the MAINTENANCE IN reports gets NOT
    /// READY, SANITIZE IN PROGRESS with the progress indication; after a
    /// failure, commands that access the medium get MEDIUM FORMAT
    /// CORRUPTED until a sanitize completes or EXIT FAILURE MODE.
    pub(crate) fn gate(&self, op: u8) -> Option<Sense> {
        match self.state.load(Ordering::Acquire) {
            IDLE => None,
            RUNNING => {
                let exempt = crate::ops::of(op).has(crate::ops::SANITIZING);
                (!exempt).then(|| {
                    Sense::SANITIZE_IN_PROGRESS.with_progress(self.progress.load(Ordering::Acquire))
                })
            }
            _ => crate::ops::of(op)
                .has(crate::ops::BLOCKS)
                .then_some(Sense::MEDIUM_FORMAT_CORRUPTED),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cdb(b1: u8, plen: u16) -> [u8; 10] {
        let l = plen.to_be_bytes();
        [0x48, b1, 0, 0, 0, 0, 0, l[0], l[1], 0]
    }

    #[test]
    fn cdb_checks() {
        let c = decode(&cdb(0x80 | 0x20 | sa::OVERWRITE, 516), 512, true).unwrap();
        assert_eq!(
            c,
            SanitizeCdb {
                immed: true,
                ause: true,
                sa: sa::OVERWRITE,
                param_len: 516
            }
        );
        let bad = |b1, plen, be| decode(&cdb(b1, plen), 512, be).unwrap_err();
        // Overwrite: 5..=block size + 4 bytes of parameter list.
        for plen in [0, 4, 517] {
            assert_eq!(
                bad(sa::OVERWRITE, plen, true),
                Sense::INVALID_FIELD_IN_CDB.cdb_field(7, None)
            );
        }
        assert!(decode(&cdb(sa::OVERWRITE, 5), 512, true).is_ok());
        // Block erase and exit failure mode take none.
        assert!(decode(&cdb(sa::BLOCK_ERASE, 0), 512, true).is_ok());
        assert_eq!(
            bad(sa::BLOCK_ERASE, 8, true),
            Sense::INVALID_FIELD_IN_CDB.cdb_field(7, None)
        );
        assert_eq!(
            bad(sa::EXIT_FAILURE_MODE, 8, true).field.map(|f| f.byte),
            Some(7)
        );
        // Unsupported service actions: crypto erase, block erase without
        // provisioning, the reserved ones.
        for s in [0, sa::CRYPTOGRAPHIC_ERASE, 4, 0x1e] {
            assert_eq!(
                bad(s, 0, true),
                Sense::INVALID_FIELD_IN_CDB.cdb_field(1, Some(4))
            );
        }
        assert_eq!(
            bad(sa::BLOCK_ERASE, 0, false),
            Sense::INVALID_FIELD_IN_CDB.cdb_field(1, Some(4))
        );
        // Reserved bits and bytes.
        assert_eq!(
            bad(0x40 | sa::BLOCK_ERASE, 0, true).field.map(|f| f.byte),
            Some(1)
        );
        for i in 2..7 {
            let mut c = cdb(sa::BLOCK_ERASE, 0);
            c[i] = i as u8;
            assert_eq!(
                decode(&c, 512, true).unwrap_err().field.map(|f| f.byte),
                Some(i as u16)
            );
        }
    }

    #[test]
    fn overwrite_parameters() {
        let mut p = vec![0x01, 0, 0, 3, 0xa, 0xb, 0xc];
        let o = parse_overwrite(&p, 8).unwrap();
        assert_eq!(o.block, vec![0xa, 0xb, 0xc, 0xa, 0xb, 0xc, 0xa, 0xb]);
        assert_eq!((o.invert, o.count), (false, 1));
        // Count zero, a test mode, a pattern longer than a block or than
        // the list, an empty pattern.
        p[0] = 0;
        assert_eq!(
            parse_overwrite(&p, 8).unwrap_err(),
            Sense::INVALID_FIELD_IN_PARAMETER_LIST.param_field(0, Some(4))
        );
        p[0] = 0x21;
        assert!(parse_overwrite(&p, 8).is_err());
        p[0] = 0x81;
        p[3] = 9;
        assert!(parse_overwrite(&p, 8).is_err());
        p[3] = 4;
        assert!(parse_overwrite(&p, 8).is_err());
        p[3] = 0;
        assert!(parse_overwrite(&p, 8).is_err());
        p[3] = 2;
        assert!(parse_overwrite(&p, 8).unwrap().invert);
    }

    #[test]
    fn overwrite_passes_end_with_the_pattern() {
        let o = Overwrite {
            invert: true,
            count: 2,
            block: vec![0x0f; 4],
        };
        let cap = WRITE_CHUNK + 4096;
        let mut op = Operation::new(Method::Overwrite(o), cap);
        let mut steps = Vec::new();
        loop {
            let s = op.next_step();
            steps.push(s);
            if s == Step::Done {
                break;
            }
        }
        assert_eq!(
            steps,
            vec![
                Step::Write {
                    offset: 0,
                    len: WRITE_CHUNK,
                    inverted: true
                },
                Step::Write {
                    offset: WRITE_CHUNK,
                    len: 4096,
                    inverted: true
                },
                Step::Write {
                    offset: 0,
                    len: WRITE_CHUNK,
                    inverted: false
                },
                Step::Write {
                    offset: WRITE_CHUNK,
                    len: 4096,
                    inverted: false
                },
                Step::Flush,
                Step::Done,
            ]
        );
        assert_eq!(op.progress(), 65535);
        assert_eq!(op.block(true), vec![0xf0; 4]);
        // Pacing: the whole of both passes at the rate.
        let secs = 2.0 * cap as f64 / RATE_BYTES_PER_SEC as f64;
        assert!((op.next_write_after().as_secs_f64() - secs).abs() < 1e-6);
    }

    #[test]
    fn block_erase_unmaps_everything_once() {
        let mut op = Operation::new(Method::BlockErase, 3 * UNMAP_CHUNK / 2);
        assert_eq!(
            op.next_step(),
            Step::Unmap {
                offset: 0,
                len: UNMAP_CHUNK
            }
        );
        assert_eq!(op.progress(), 43690);
        assert_eq!(
            op.next_step(),
            Step::Unmap {
                offset: UNMAP_CHUNK,
                len: UNMAP_CHUNK / 2
            }
        );
        assert_eq!(op.next_step(), Step::Flush);
        assert_eq!(op.next_step(), Step::Done);
        assert_eq!(op.next_write_after(), Duration::ZERO);
    }

    /// The whole path through a shard: a device in memory, two nexuses.
    mod through_a_shard {
        use std::collections::VecDeque;
        use std::sync::{Arc, Mutex};
        use std::time::{Duration, Instant};

        use ferrite_reactor::buf::BufPool;
        use ferrite_scsi::Lun;

        use crate::backend::{
            Backend, BackendError, BackendQueue, BlockDone, BlockError, BlockOp, Busy, Caps,
            Geometry,
        };
        use crate::cmd::{Action, Cdb, CmdRequest, DataDir, Response, TaskAttr, TaskTag};
        use crate::device::{Device, DeviceFlags, DeviceId, Identity, LunEntry, LunMap};
        use crate::sanitize::Status;
        use crate::{Nexus, SessionId, Shard, TmfFunction, TmfRequest, TmfResponse};

        const BLOCKS: u64 = 64;

        #[derive(Default)]
        struct Medium {
            data: Vec<u8>,
            fail_writes: bool,
        }

        struct Mem(Arc<Mutex<Medium>>);
        struct MemQ(Arc<Mutex<Medium>>, VecDeque<(u64, BlockOp)>);

        impl Backend for Mem {
            fn geometry(&self) -> Geometry {
                Geometry {
                    block_size: 512,
                    num_blocks: BLOCKS,
                    phys_exp: 0,
                }
            }
            fn caps(&self) -> Caps {
                Caps {
                    unmap: true,
                    unmap_zeroes: true,
                    ..Caps::default()
                }
            }
            fn open_queue(&self, _: u32) -> Result<Box<dyn BackendQueue>, BackendError> {
                Ok(Box::new(MemQ(self.0.clone(), VecDeque::new())))
            }
        }

        impl BackendQueue for MemQ {
            fn submit(&mut self, tag: u64, op: BlockOp) -> Result<(), Busy<BlockOp>> {
                self.1.push_back((tag, op));
                Ok(())
            }
            fn poll(&mut self, out: &mut Vec<BlockDone>) {
                let mut m = self.0.lock().unwrap();
                while let Some((tag, op)) = self.1.pop_front() {
                    let (result, buf) = match op {
                        BlockOp::Write { .. } if m.fail_writes => (Err(BlockError::Io), None),
                        BlockOp::Write { offset, buf, .. } => {
                            let o = offset as usize;
                            let v = buf.to_vec();
                            m.data[o..o + v.len()].copy_from_slice(&v);
                            (Ok(()), Some(buf))
                        }
                        BlockOp::Read { offset, mut buf } => {
                            let o = offset as usize;
                            let n = buf.len();
                            buf.copy_in(0, &m.data[o..o + n]);
                            (Ok(()), Some(buf))
                        }
                        BlockOp::Unmap { offset, len } | BlockOp::WriteZeroes { offset, len } => {
                            m.data[offset as usize..(offset + len) as usize].fill(0);
                            (Ok(()), None)
                        }
                        BlockOp::Flush | BlockOp::ReadPipe { .. } => (Ok(()), None),
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
                self.1.len()
            }
        }

        struct T {
            shard: Shard,
            dev: Arc<Device>,
            medium: Arc<Mutex<Medium>>,
            now: Instant,
            tag: u64,
        }

        impl T {
            fn new() -> (T, SessionId, SessionId) {
                let medium = Arc::new(Mutex::new(Medium {
                    data: vec![0x77; (BLOCKS * 512) as usize],
                    fail_writes: false,
                }));
                let dev = Arc::new(Device::new(
                    DeviceId(7),
                    "sanitized",
                    Arc::new(Mem(medium.clone())),
                    Identity {
                        vendor: "FERRITE".into(),
                        product: "TEST".into(),
                        revision: "1".into(),
                        serial: "s".into(),
                        naa: u64::to_be_bytes(0x5000_0000_0000_0001).to_vec(),
                        eui64: u64::to_be_bytes(1).to_vec(),
                        ..Identity::default()
                    },
                    DeviceFlags {
                        thin_provisioned: true,
                        ..DeviceFlags::default()
                    },
                ));
                let mut map = LunMap::default();
                map.luns.insert(
                    Lun(0),
                    LunEntry {
                        device: dev.clone(),
                        read_only: false,
                    },
                );
                let map = Arc::new(map);
                let now = Instant::now();
                let mut shard = Shard::new(0, BufPool::new(4096, 8));
                let nexus = |n: u32| Nexus {
                    initiator: format!("iqn.test:i{n}"),
                    initiator_port: format!("iqn.test:i{n},i,0x{n:012x}"),
                    target: "iqn.test:t".into(),
                    rel_port_id: 1,
                    target_port: String::new(),
                    protocol: None,
                };
                let a = shard.open_session(now, nexus(1), map.clone(), false);
                let b = shard.open_session(now, nexus(2), map, false);
                let mut t = T {
                    shard,
                    dev,
                    medium,
                    now,
                    tag: 0,
                };
                // Take the POWER ON unit attentions.
                t.cmd(a, &[0; 6], &[]);
                t.cmd(b, &[0; 6], &[]);
                (t, a, b)
            }

            /// Submits `cdb` with `data` as Data-Out; the response, if one
            /// came at once.
            fn cmd(&mut self, sid: SessionId, cdb: &[u8], data: &[u8]) -> Option<Response> {
                self.tag += 1;
                let req = CmdRequest {
                    lun: Lun(0),
                    lun_raw: Lun(0).encode(),
                    tag: TaskTag(self.tag),
                    cdb: Cdb::from_slice(cdb),
                    attr: TaskAttr::Simple,
                    dir: if data.is_empty() {
                        DataDir::Read
                    } else {
                        DataDir::Write
                    },
                    expected_len: if data.is_empty() {
                        255
                    } else {
                        data.len() as u32
                    },
                    expected_read_len: 0,
                };
                let mut s = self.shard.session(sid).unwrap();
                s.submit(self.now, req);
                let mut out = None;
                while let Some(a) = s.poll_action() {
                    match a {
                        Action::FetchData { id, mut buf, .. } => {
                            buf.copy_in(0, data);
                            s.data_out_done(id, Ok(buf));
                        }
                        Action::Respond { id, rsp, .. } => {
                            s.response_sent(id);
                            out = Some(rsp);
                        }
                        _ => {}
                    }
                }
                out
            }

            /// Advances virtual time until the sanitize ends; the response
            /// that came meanwhile for `sid`, if any.
            fn run_out(&mut self, sid: SessionId) -> Option<Response> {
                let mut out = None;
                for _ in 0..10_000 {
                    self.now += Duration::from_millis(50);
                    self.shard.poll(self.now);
                    let mut s = self.shard.session(sid).unwrap();
                    while let Some(a) = s.poll_action() {
                        if let Action::Respond { id, rsp, .. } = a {
                            s.response_sent(id);
                            out = Some(rsp);
                        }
                    }
                    if !matches!(self.dev.sanitize_status(), Status::Running(_)) {
                        return out;
                    }
                }
                panic!("the sanitize never ended");
            }
        }

        fn sense(r: &Option<Response>) -> (u8, u8, u8) {
            let s = r.as_ref().unwrap().sense.as_ref().unwrap();
            (s[2] & 0x0f, s[12], s[13])
        }

        fn good(r: &Option<Response>) -> bool {
            r.as_ref().is_some_and(|r| r.status.0 == 0)
        }

        fn overwrite(b1: u8) -> ([u8; 10], Vec<u8>) {
            (
                [0x48, b1 | 0x01, 0, 0, 0, 0, 0, 0, 6, 0],
                vec![0x01, 0, 0, 2, 0x12, 0x34],
            )
        }

        #[test]
        fn overwrite_outlives_its_aborted_task_and_holds_off_other_commands() {
            let (mut t, a, b) = T::new();
            let (cdb, p) = overwrite(0);
            // No IMMED: no answer until the operation ends.
            assert!(t.cmd(a, &cdb, &p).is_none());
            assert!(matches!(t.dev.sanitize_status(), Status::Running(_)));
            // Other commands, from either nexus: NOT READY, SANITIZE IN
            // PROGRESS, with SKSV and a progress indication.
            let r = t.cmd(b, &[0; 6], &[]);
            assert_eq!(sense(&r), (0x02, 0x04, 0x1b));
            assert_eq!(r.as_ref().unwrap().sense.as_ref().unwrap()[15], 0x80);
            assert_eq!(
                sense(&t.cmd(a, &[0x28, 0, 0, 0, 0, 0, 0, 0, 1, 0], &[])),
                (2, 4, 0x1b)
            );
            // A second SANITIZE too.
            assert_eq!(sense(&t.cmd(b, &cdb, &p)), (2, 4, 0x1b));
            // INQUIRY is served; REQUEST SENSE reports the progress, GOOD.
            assert!(good(&t.cmd(b, &[0x12, 0, 0, 0, 36, 0], &[])));
            let r = t.cmd(b, &[0x03, 0, 0, 0, 18, 0], &[]).unwrap();
            assert_eq!(r.status.0, 0);
            // ABORT TASK SET ends the task at once; the operation goes on.
            let mut s = t.shard.session(a).unwrap();
            s.task_mgmt(
                t.now,
                TmfRequest {
                    func: TmfFunction::AbortTaskSet,
                    lun: Lun(0),
                    tag: TaskTag(999),
                },
            );
            let done = std::iter::from_fn(|| s.poll_action()).any(|x| {
                matches!(
                    x,
                    Action::TmfDone {
                        rsp: TmfResponse::Complete,
                        ..
                    }
                )
            });
            assert!(done, "the abort waited for the sanitize");
            assert!(matches!(t.dev.sanitize_status(), Status::Running(_)));
            // The first write is in flight; once it is done the next step
            // waits for its slot at RATE_BYTES_PER_SEC.
            assert_eq!(t.shard.next_deadline(), None);
            let now = t.now;
            t.shard.poll(now);
            let due = t.shard.next_deadline().expect("a paced step waits");
            assert!(due > now && due - now < Duration::from_millis(5));
            // The reactor sleeps until then rather than spinning.
            assert!(!t.shard.wants_spin());
            // The aborted task never answers; the medium is overwritten.
            assert!(t.run_out(a).is_none());
            assert_eq!(t.dev.sanitize_status(), Status::Idle);
            let m = t.medium.lock().unwrap();
            assert!(m.data.chunks(2).all(|c| c == [0x12, 0x34]));
            drop(m);
            assert!(good(&t.cmd(b, &[0; 6], &[])));
        }

        #[test]
        fn another_nexus_reservation_refuses_the_sanitize_and_starts_nothing() {
            let (mut t, a, b) = T::new();
            let conflict = |r: &Option<Response>| {
                r.as_ref()
                    .is_some_and(|r| r.status == ferrite_scsi::Status::RESERVATION_CONFLICT)
            };
            // SPC-2 §5.5.1: while b holds a RESERVE(6), every command of
            // another nexus but a few (INQUIRY, REPORT LUNS, REQUEST SENSE
            // and RELEASE among them) meets RESERVATION CONFLICT; SANITIZE
            // is not exempt, so no sanitize operation starts, and TEST UNIT
            // READY conflicts too rather than reporting one in progress.
            assert!(good(&t.cmd(b, &[0x16, 0, 0, 0, 0, 0], &[])));
            let (cdb, p) = overwrite(0);
            assert!(conflict(&t.cmd(a, &cdb, &p)));
            assert_eq!(t.dev.sanitize_status(), Status::Idle);
            assert!(conflict(&t.cmd(a, &[0; 6], &[])));
            assert!(t.medium.lock().unwrap().data.iter().all(|&x| x == 0x77));
            // The holder's RELEASE(6) lets the same SANITIZE run.
            assert!(good(&t.cmd(b, &[0x17, 0, 0, 0, 0, 0], &[])));
            assert!(t.cmd(a, &cdb, &p).is_none());
            assert!(matches!(t.dev.sanitize_status(), Status::Running(_)));
            assert_eq!(sense(&t.cmd(b, &[0; 6], &[])), (0x02, 0x04, 0x1b));
            assert!(good(&t.run_out(a)));
            assert!(
                t.medium
                    .lock()
                    .unwrap()
                    .data
                    .chunks(2)
                    .all(|c| c == [0x12, 0x34])
            );
        }

        #[test]
        fn block_erase_with_immed_and_a_failed_overwrite() {
            let (mut t, a, b) = T::new();
            // IMMED: GOOD at once; the blocks are deallocated after.
            let r = t.cmd(a, &[0x48, 0x82, 0, 0, 0, 0, 0, 0, 0, 0], &[]);
            assert!(good(&r));
            t.run_out(a);
            assert!(t.medium.lock().unwrap().data.iter().all(|&x| x == 0));
            // A failed overwrite (AUSE = 0): the SANITIZE gets SANITIZE
            // COMMAND FAILED, media access MEDIUM FORMAT CORRUPTED, EXIT
            // FAILURE MODE and an AUSE = 1 sanitize are refused.
            t.medium.lock().unwrap().fail_writes = true;
            let (cdb, p) = overwrite(0);
            assert!(t.cmd(a, &cdb, &p).is_none());
            let r = t.run_out(a);
            assert_eq!(sense(&r), (0x03, 0x31, 0x03));
            assert_eq!(t.dev.sanitize_status(), Status::Failed { ause: false });
            let read = [0x28, 0, 0, 0, 0, 0, 0, 0, 1, 0];
            assert_eq!(sense(&t.cmd(b, &read, &[])), (0x03, 0x31, 0x00));
            assert!(good(&t.cmd(b, &[0; 6], &[])));
            let exit = [0x48, 0x1f, 0, 0, 0, 0, 0, 0, 0, 0];
            assert_eq!(sense(&t.cmd(b, &exit, &[])), (0x05, 0x24, 0x00));
            let (cdb, p) = overwrite(0x20);
            assert_eq!(sense(&t.cmd(b, &cdb, &p)), (0x05, 0x24, 0x00));
            // A sanitize that completes leaves the failure.
            t.medium.lock().unwrap().fail_writes = false;
            let (cdb, p) = overwrite(0x80);
            assert!(good(&t.cmd(b, &cdb, &p)));
            t.run_out(b);
            assert_eq!(t.dev.sanitize_status(), Status::Idle);
            // The read goes to the backend again.
            assert!(t.cmd(b, &read, &[]).is_none());
            assert!(good(&t.run_out(b)));
            // Parameter list checks reach the initiator: OVERWRITE COUNT 0.
            let (cdb, mut p) = overwrite(0);
            p[0] = 0;
            assert_eq!(sense(&t.cmd(b, &cdb, &p)), (0x05, 0x26, 0x00));
            assert_eq!(t.dev.sanitize_status(), Status::Idle);
        }
    }

    #[test]
    fn device_state() {
        let s = SanitizeShared::default();
        assert_eq!(s.status(), Status::Idle);
        assert_eq!(s.gate(0x28), None);
        s.begin(false).unwrap();
        assert_eq!(s.begin(false), Err(Sense::SANITIZE_IN_PROGRESS));
        s.set_progress(100);
        assert_eq!(s.status(), Status::Running(100));
        assert_eq!(
            s.gate(0x00),
            Some(Sense::SANITIZE_IN_PROGRESS.with_progress(100))
        );
        assert_eq!(s.gate(0x12), None);
        assert_eq!(s.gate(0x03), None);
        assert_eq!(s.exit_failure_mode(), Err(Sense::SANITIZE_IN_PROGRESS));
        // Restricted failure: media access fails, EXIT FAILURE MODE and an
        // unrestricted sanitize are refused, a restricted one may run.
        s.finish(false, false);
        assert_eq!(s.gate(0x28), Some(Sense::MEDIUM_FORMAT_CORRUPTED));
        assert_eq!(s.gate(0x00), None);
        assert!(s.exit_failure_mode().is_err());
        assert!(s.begin(true).is_err());
        s.begin(false).unwrap();
        s.finish(false, true);
        assert_eq!(s.status(), Status::Failed { ause: true });
        s.exit_failure_mode().unwrap();
        assert_eq!(s.status(), Status::Idle);
        assert_eq!(s.exit_failure_mode(), Ok(()));
    }
}
