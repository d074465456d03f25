//! ferrite-nullio: a backend with no storage (reads return zeroes, writes
//! vanish), the measure of the target's own cost; and a `mem` mode that keeps
//! written data in RAM (sparse), for tests and scenarios.
//!
//! Owns: [`NullBackend`] (both modes) and its per-core queue; [`fault`], the
//! fault-injection wrapper any backend can be put in (EIO, ENOSPC, offline,
//! delays per LBA range); [`integrity`], the data-integrity check. Does not own:
//! anything SCSI (the core turns [`BlockError`]s into sense data), nor any
//! real I/O.
//!
//! Queues do the work of an operation in the `poll` that follows its `submit`
//! (submission never completes inline) and honour the depth given to
//! `open_queue` with `Busy`. They have no eventfd: the reactor keeps polling
//! while `in_flight() > 0`.
//!
//! In `mem` mode the data lives in 64 KiB chunks allocated on first write,
//! shared by every queue of the backend. The chunk map is split into shards,
//! each behind its own `Mutex`: a lock on the data path, which the house style
//! keeps out of real backends; it is accepted here because this is a test
//! backend and the locks are held only for a memcpy of at most one chunk.
//! Unmapped chunks read as zeroes; unmap and write-zeroes free whole chunks
//! and zero partial ones.

#![forbid(unsafe_code)]

pub mod fault;
pub mod integrity;

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};

use ferrite_core::backend::{
    Backend, BackendError, BackendQueue, BlockDone, BlockError, BlockOp, Busy, Caps, Geometry,
};
use ferrite_reactor::buf::SgList;

/// Bytes per chunk of `mem` mode.
pub const CHUNK: u64 = 64 * 1024;
/// Shards of the chunk map (a power of two).
const SHARDS: usize = 64;

/// One chunk's bytes.
type Chunk = Box<[u8]>;

/// The sparse RAM store of `mem` mode.
struct MemStore {
    shards: Vec<Mutex<HashMap<u64, Chunk>>>,
}

impl MemStore {
    fn new() -> MemStore {
        MemStore {
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
        }
    }

    fn shard(&self, chunk: u64) -> MutexGuard<'_, HashMap<u64, Chunk>> {
        let m = &self.shards[(chunk as usize) & (SHARDS - 1)];
        // A poisoned shard only means a panic elsewhere while holding it; the
        // map itself is still consistent (every update is a single insert,
        // remove or memcpy).
        m.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Calls `f(chunk_index, offset_in_chunk, pos_in_op, len)` for each chunk
    /// piece of `[offset, offset+len)`.
    fn pieces(offset: u64, len: u64, mut f: impl FnMut(u64, usize, usize, usize)) {
        let mut pos = 0u64;
        while pos < len {
            let abs = offset + pos;
            let idx = abs / CHUNK;
            let within = abs % CHUNK;
            let n = (CHUNK - within).min(len - pos);
            f(idx, within as usize, pos as usize, n as usize);
            pos += n;
        }
    }

    fn read(&self, offset: u64, buf: &mut SgList) {
        let len = buf.len() as u64;
        Self::pieces(offset, len, |idx, within, pos, n| {
            let shard = self.shard(idx);
            match shard.get(&idx) {
                Some(c) => {
                    buf.copy_in(pos, &c[within..within + n]);
                }
                None => {
                    drop(shard);
                    zero_range(buf, pos, n);
                }
            }
        });
    }

    fn write(&self, offset: u64, buf: &SgList) {
        let len = buf.len() as u64;
        Self::pieces(offset, len, |idx, within, pos, n| {
            let mut shard = self.shard(idx);
            let c = shard
                .entry(idx)
                .or_insert_with(|| vec![0u8; CHUNK as usize].into_boxed_slice());
            buf.copy_out(pos, &mut c[within..within + n]);
        });
    }

    /// Unmap and write-zeroes: whole chunks are freed, partial ones zeroed.
    fn zero(&self, offset: u64, len: u64) {
        Self::pieces(offset, len, |idx, within, _pos, n| {
            let mut shard = self.shard(idx);
            if n as u64 == CHUNK {
                shard.remove(&idx);
            } else if let Some(c) = shard.get_mut(&idx) {
                c[within..within + n].fill(0);
            }
        });
    }

    fn allocated(&self, idx: u64) -> bool {
        self.shard(idx).contains_key(&idx)
    }

    fn allocated_chunks(&self) -> usize {
        (0..SHARDS)
            .map(|s| self.shard(s as u64).len())
            .sum::<usize>()
    }
}

/// Zeroes `[pos, pos+len)` of `buf`.
fn zero_range(buf: &mut SgList, pos: usize, len: usize) {
    let mut skip = pos;
    let mut left = len;
    for seg in buf.segments_mut() {
        if left == 0 {
            break;
        }
        if skip >= seg.len() {
            skip -= seg.len();
            continue;
        }
        let n = (seg.len() - skip).min(left);
        if skip == 0 && n == seg.len() {
            // Skips the memset for a buffer known to hold zeroes.
            seg.fill_zero();
        } else {
            seg[skip..skip + n].fill(0);
        }
        left -= n;
        skip = 0;
    }
}

/// A backend with no storage, or (`mem`) with sparse RAM storage.
pub struct NullBackend {
    geometry: Geometry,
    store: Option<Arc<MemStore>>,
}

impl std::fmt::Debug for NullBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NullBackend")
            .field("geometry", &self.geometry)
            .field("mem", &self.store.is_some())
            .finish()
    }
}

fn geometry(size_bytes: u64, block_size: u32) -> Result<Geometry, BackendError> {
    if !block_size.is_power_of_two() || !(512..=65536).contains(&block_size) {
        return Err(BackendError::Invalid(format!(
            "block size {block_size} is not a power of two between 512 and 65536"
        )));
    }
    Ok(Geometry {
        block_size,
        num_blocks: size_bytes / block_size as u64,
        phys_exp: 0,
    })
}

impl NullBackend {
    /// A backend of `size_bytes` (rounded down to `block_size`) that stores
    /// nothing: reads return zeroes, writes vanish.
    pub fn new(size_bytes: u64, block_size: u32) -> Result<NullBackend, BackendError> {
        Ok(NullBackend {
            geometry: geometry(size_bytes, block_size)?,
            store: None,
        })
    }

    /// A backend of `size_bytes` that keeps written data in RAM, sparsely
    /// (64 KiB chunks allocated on first write).
    pub fn mem(size_bytes: u64, block_size: u32) -> Result<NullBackend, BackendError> {
        Ok(NullBackend {
            geometry: geometry(size_bytes, block_size)?,
            store: Some(Arc::new(MemStore::new())),
        })
    }

    /// Whether data is kept (`mem` mode).
    pub fn is_mem(&self) -> bool {
        self.store.is_some()
    }

    /// Bytes of RAM holding data (`mem` mode; 0 otherwise).
    pub fn allocated_bytes(&self) -> u64 {
        self.store
            .as_ref()
            .map_or(0, |s| s.allocated_chunks() as u64 * CHUNK)
    }
}

impl Backend for NullBackend {
    fn geometry(&self) -> Geometry {
        self.geometry
    }

    fn caps(&self) -> Caps {
        Caps {
            unmap: true,
            write_zeroes: true,
            fua: true,
            // `mem` keeps data in RAM, lost with the process as a volatile
            // cache's would be; without it nothing is kept.
            write_cache: self.store.is_some(),
            unmap_zeroes: true,
            read_pipe: false,
        }
    }

    fn open_queue(&self, depth: u32) -> Result<Box<dyn BackendQueue>, BackendError> {
        if depth == 0 {
            return Err(BackendError::Invalid("queue depth 0".into()));
        }
        Ok(Box::new(NullQueue {
            depth: depth as usize,
            capacity: self.geometry.bytes(),
            store: self.store.clone(),
            queued: VecDeque::with_capacity((depth as usize).min(1024)),
        }))
    }

    /// `mem` mode: chunk by chunk from `offset`. Without `mem`, nothing is
    /// ever allocated: the whole range is reported deallocated (it reads as
    /// zeroes, which `unmap_zeroes` promises).
    fn mapping(&self, offset: u64, len: u64) -> Option<(bool, u64)> {
        let end = offset.checked_add(len)?.min(self.geometry.bytes());
        if offset >= end {
            return None;
        }
        let Some(store) = &self.store else {
            return Some((false, end - offset));
        };
        let first = store.allocated(offset / CHUNK);
        let mut pos = (offset / CHUNK + 1) * CHUNK;
        while pos < end && store.allocated(pos / CHUNK) == first {
            pos += CHUNK;
        }
        Some((first, pos.min(end) - offset))
    }
}

/// One core's queue on a [`NullBackend`].
struct NullQueue {
    depth: usize,
    capacity: u64,
    store: Option<Arc<MemStore>>,
    queued: VecDeque<(u64, BlockOp)>,
}

impl NullQueue {
    fn in_range(&self, offset: u64, len: u64) -> bool {
        offset
            .checked_add(len)
            .is_some_and(|end| end <= self.capacity)
    }

    fn execute(&self, tag: u64, op: BlockOp) -> BlockDone {
        // Out-of-range requests are the core's bug, but never a panic here.
        let range_err = Err(BlockError::Os(libc::EINVAL));
        let (result, buf) = match op {
            // Not in this backend's caps: refused, the pipe handed back.
            BlockOp::ReadPipe { pipe, .. } => {
                return BlockDone {
                    tag,
                    result: Err(BlockError::Unsupported),
                    buf: None,
                    pipe: Some(pipe),
                };
            }
            BlockOp::Read { offset, mut buf } => {
                if !self.in_range(offset, buf.len() as u64) {
                    (range_err, Some(buf))
                } else {
                    match &self.store {
                        Some(s) => s.read(offset, &mut buf),
                        None => {
                            for seg in buf.segments_mut() {
                                seg.fill_zero();
                            }
                        }
                    }
                    (Ok(()), Some(buf))
                }
            }
            // FUA: nothing is volatile here, so every write is as durable as
            // this backend gets.
            BlockOp::Write {
                offset,
                buf,
                fua: _,
            } => {
                if !self.in_range(offset, buf.len() as u64) {
                    (range_err, Some(buf))
                } else {
                    if let Some(s) = &self.store {
                        s.write(offset, &buf);
                    }
                    (Ok(()), Some(buf))
                }
            }
            BlockOp::Flush => (Ok(()), None),
            BlockOp::Unmap { offset, len } | BlockOp::WriteZeroes { offset, len } => {
                if !self.in_range(offset, len) {
                    (range_err, None)
                } else {
                    if let Some(s) = &self.store {
                        s.zero(offset, len);
                    }
                    (Ok(()), None)
                }
            }
        };
        BlockDone {
            tag,
            result,
            buf,
            pipe: None,
        }
    }
}

impl BackendQueue for NullQueue {
    fn submit(&mut self, tag: u64, op: BlockOp) -> Result<(), Busy<BlockOp>> {
        if self.queued.len() >= self.depth {
            return Err(Busy(op));
        }
        self.queued.push_back((tag, op));
        Ok(())
    }

    fn poll(&mut self, out: &mut Vec<BlockDone>) {
        // Only what was queued before this poll: completions of this round
        // never include work submitted from inside it.
        let n = self.queued.len();
        for _ in 0..n {
            if let Some((tag, op)) = self.queued.pop_front() {
                out.push(self.execute(tag, op));
            }
        }
    }

    fn in_flight(&self) -> usize {
        self.queued.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::integrity::{self, Rng};
    use ferrite_reactor::buf::BufPool;

    fn run(q: &mut dyn BackendQueue, tag: u64, op: BlockOp) -> BlockDone {
        q.submit(tag, op).unwrap();
        let mut out = Vec::new();
        q.poll(&mut out);
        assert_eq!(out.len(), 1);
        out.pop().unwrap()
    }

    #[test]
    fn null_reads_zeroes_and_forgets_writes() {
        let b = NullBackend::new(1 << 20, 512).unwrap();
        let mut q = b.open_queue(4).unwrap();
        let mut sg = SgList::zeroed(4096);
        sg.copy_in(0, &[0xff; 4096]);
        let d = run(
            &mut *q,
            1,
            BlockOp::Write {
                offset: 0,
                buf: sg,
                fua: true,
            },
        );
        assert_eq!(d.result, Ok(()));
        // The returned buffer is dirty: the read must clear it.
        let d = run(
            &mut *q,
            2,
            BlockOp::Read {
                offset: 0,
                buf: d.buf.unwrap(),
            },
        );
        assert_eq!(d.result, Ok(()));
        assert!(d.buf.unwrap().to_vec().iter().all(|&b| b == 0));
        assert_eq!(b.allocated_bytes(), 0);
        assert_eq!(b.mapping(0, 1 << 20), Some((false, 1 << 20)));
    }

    #[test]
    fn submit_never_completes_inline() {
        let b = NullBackend::mem(1 << 20, 512).unwrap();
        let mut q = b.open_queue(4).unwrap();
        q.submit(9, BlockOp::Flush).unwrap();
        assert_eq!(q.in_flight(), 1);
        let mut out = Vec::new();
        q.poll(&mut out);
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].tag, 9);
        assert!(out[0].buf.is_none());
        assert_eq!(q.in_flight(), 0);
    }

    #[test]
    fn busy_at_full_depth_hands_op_back() {
        let b = NullBackend::mem(1 << 20, 512).unwrap();
        let mut q = b.open_queue(3).unwrap();
        for t in 0..3 {
            q.submit(
                t,
                BlockOp::Read {
                    offset: 0,
                    buf: SgList::zeroed(512),
                },
            )
            .unwrap();
        }
        match q.submit(
            7,
            BlockOp::Read {
                offset: 512,
                buf: SgList::zeroed(1024),
            },
        ) {
            Err(Busy(BlockOp::Read { offset, buf })) => {
                assert_eq!(offset, 512);
                assert_eq!(buf.len(), 1024);
            }
            other => panic!("expected Busy with the read back, got {other:?}"),
        }
        let mut out = Vec::new();
        q.poll(&mut out);
        assert_eq!(out.len(), 3);
        assert!(q.submit(7, BlockOp::Flush).is_ok());
    }

    #[test]
    fn mem_round_trip_across_chunks_and_queues() {
        let b = NullBackend::mem(4 << 20, 512).unwrap();
        let mut q1 = b.open_queue(4).unwrap();
        let mut q2 = b.open_queue(4).unwrap();
        let pool = BufPool::new(4096, 16);
        let len = 3 * CHUNK as usize + 1536;
        let off = CHUNK - 512;
        let data: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
        let mut sg = pool.sg(len);
        sg.copy_in(0, &data);
        let d = run(
            &mut *q1,
            1,
            BlockOp::Write {
                offset: off,
                buf: sg,
                fua: false,
            },
        );
        assert_eq!(d.result, Ok(()));
        let d = run(
            &mut *q2,
            2,
            BlockOp::Read {
                offset: off,
                buf: pool.sg(len),
            },
        );
        assert_eq!(d.buf.unwrap().to_vec(), data);
        assert_eq!(b.allocated_bytes(), 5 * CHUNK);
    }

    #[test]
    fn unmap_frees_chunks_and_mapping_shows_hole() {
        let b = NullBackend::mem(1 << 20, 512).unwrap();
        let mut q = b.open_queue(4).unwrap();
        let mut sg = SgList::zeroed(4 * CHUNK as usize);
        sg.copy_in(0, &vec![0x5a; 4 * CHUNK as usize]);
        run(
            &mut *q,
            1,
            BlockOp::Write {
                offset: 0,
                buf: sg,
                fua: false,
            },
        );
        assert_eq!(b.mapping(0, 1 << 20), Some((true, 4 * CHUNK)));
        // Whole chunk 1, plus the first 512 bytes of chunk 2.
        let d = run(
            &mut *q,
            2,
            BlockOp::Unmap {
                offset: CHUNK,
                len: CHUNK + 512,
            },
        );
        assert_eq!(d.result, Ok(()));
        assert_eq!(b.allocated_bytes(), 3 * CHUNK);
        assert_eq!(b.mapping(0, 1 << 20), Some((true, CHUNK)));
        assert_eq!(b.mapping(CHUNK, 1 << 20), Some((false, CHUNK)));
        assert_eq!(b.mapping(2 * CHUNK, 1 << 20), Some((true, 2 * CHUNK)));
        assert_eq!(b.mapping(4 * CHUNK, 100 * 512), Some((false, 100 * 512)));
        let d = run(
            &mut *q,
            3,
            BlockOp::Read {
                offset: 0,
                buf: SgList::zeroed(3 * CHUNK as usize),
            },
        );
        let v = d.buf.unwrap().to_vec();
        let c = CHUNK as usize;
        assert!(v[..c].iter().all(|&x| x == 0x5a));
        assert!(v[c..2 * c + 512].iter().all(|&x| x == 0));
        assert!(v[2 * c + 512..].iter().all(|&x| x == 0x5a));
    }

    #[test]
    fn write_zeroes_partial_chunk() {
        let b = NullBackend::mem(1 << 20, 512).unwrap();
        let mut q = b.open_queue(4).unwrap();
        let mut sg = SgList::zeroed(8192);
        sg.copy_in(0, &[1u8; 8192]);
        run(
            &mut *q,
            1,
            BlockOp::Write {
                offset: 0,
                buf: sg,
                fua: false,
            },
        );
        run(
            &mut *q,
            2,
            BlockOp::WriteZeroes {
                offset: 1024,
                len: 2048,
            },
        );
        let d = run(
            &mut *q,
            3,
            BlockOp::Read {
                offset: 0,
                buf: SgList::zeroed(8192),
            },
        );
        let v = d.buf.unwrap().to_vec();
        assert!(v[..1024].iter().all(|&x| x == 1));
        assert!(v[1024..3072].iter().all(|&x| x == 0));
        assert!(v[3072..].iter().all(|&x| x == 1));
    }

    #[test]
    fn out_of_range_is_an_error_with_buffer_back() {
        let b = NullBackend::mem(1 << 20, 512).unwrap();
        let mut q = b.open_queue(4).unwrap();
        let d = run(
            &mut *q,
            1,
            BlockOp::Read {
                offset: (1 << 20) - 512,
                buf: SgList::zeroed(1024),
            },
        );
        assert_eq!(d.result, Err(BlockError::Os(libc::EINVAL)));
        assert_eq!(d.buf.map(|b| b.len()), Some(1024));
        let d = run(
            &mut *q,
            2,
            BlockOp::Unmap {
                offset: u64::MAX - 511,
                len: 1024,
            },
        );
        assert_eq!(d.result, Err(BlockError::Os(libc::EINVAL)));
    }

    #[test]
    fn bad_block_size_rejected() {
        assert!(NullBackend::new(1 << 20, 1000).is_err());
        assert!(NullBackend::mem(1 << 20, 256).is_err());
        assert_eq!(
            NullBackend::new(1 << 20, 4096)
                .unwrap()
                .geometry()
                .num_blocks,
            256
        );
    }

    #[test]
    fn integrity_at_qd32() {
        let b = NullBackend::mem(8 << 20, 512).unwrap();
        let mut q = b.open_queue(32).unwrap();
        let mut rng = Rng::new(0x5eed);
        let report = integrity::run(&mut *q, &mut || {}, b.geometry(), &mut rng, 400).unwrap();
        assert_eq!(report.writes + report.zeroings, 400);
        assert!(report.writes > 300 && report.zeroings > 0);
        assert_eq!(report.blocks_checked, b.geometry().num_blocks);
    }

    #[test]
    fn integrity_catches_a_lying_backend() {
        // A queue that drops every write must fail the check: proof the
        // helper can fail.
        let b = NullBackend::new(1 << 20, 512).unwrap();
        let mut q = b.open_queue(32).unwrap();
        let mut rng = Rng::new(1);
        assert!(integrity::run(&mut *q, &mut || {}, b.geometry(), &mut rng, 50).is_err());
    }
}
