//! The data plane shared by the file and block backends: one io_uring
//! ([`BlockRing`]) per core on a shared file descriptor.
//!
//! Each queue owns its ring (created in `open_queue`), whose eventfd is the
//! queue's `notify_fd`. Queue depth is the ring size; a full queue answers
//! `Busy`. Operations that need no kernel work (a flush of a read-only file, a
//! write to a read-only backend, a range past the end) still complete in the
//! next `poll`, never inline.
//!
//! Reads are first tried on the calling thread when that cannot block it:
//! on tmpfs (memory, which refuses `RWF_NOWAIT`, so io_uring would hand every
//! read to an io-wq worker thread and pay a cross-core wake-up) with a plain
//! `preadv2`, elsewhere with `RWF_NOWAIT` (page-cache hits only). What that
//! does not finish goes to the ring; `O_DIRECT` reads always do. Writes
//! always go to the ring.
//!
//! Submissions are batched without a contract change: `submit` enters the
//! kernel at once only when the kernel holds no other operation of this
//! queue; otherwise the operation waits for the next `poll`, which a pending
//! completion guarantees (its CQE signals the eventfd the reactor sleeps on).
//! [`UringQueue::set_batch_submit`] turns this off (one `io_uring_enter` per
//! operation). An explicit "end of batch" call in `BackendQueue` would let
//! the core decide instead.
//!
//! A backing file that vanishes under a live LUN (deleted, or truncated below
//! the capacity) takes the device offline with one error log line: every
//! operation of every queue then fails with `BlockError::Offline` (NOT READY
//! in the core) until a resync finds the file whole again. It is noticed by
//! one `fstat` before each flush and every [`VANISH_CHECK_EVERY`]
//! submissions, by a short read, and by the kernel's own ENOENT/ESTALE/
//! ENODEV/EBADF/ENXIO.

use std::collections::VecDeque;
use std::fs::File;
use std::os::fd::{AsFd, AsRawFd, RawFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use ferrite_core::backend::{BackendError, BackendQueue, BlockDone, BlockError, BlockOp, Busy};
use ferrite_reactor::blockring::{self, BlockRing, RingFull, RingStats};
use ferrite_reactor::buf::SgList;
use ferrite_reactor::pipe::Pipe;

/// How `BlockOp::Unmap` is carried out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UnmapVia {
    /// `fallocate(PUNCH_HOLE | KEEP_SIZE)` through the ring (files).
    PunchHole,
    /// `BLKDISCARD`, a blocking ioctl issued from `submit` (block devices;
    /// io_uring has no discard opcode before Linux 6.12's uring_cmd).
    BlkDiscard,
    /// Not supported: completes with `BlockError::Unsupported`.
    None,
}

/// How `BlockOp::WriteZeroes` is carried out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ZeroesVia {
    /// `fallocate(ZERO_RANGE | KEEP_SIZE)` through the ring; if the
    /// filesystem rejects it (tmpfs does) and `punch_fallback` is set, every
    /// later request punches a hole instead (reads back as zeroes).
    ZeroRange { punch_fallback: bool },
    /// Not supported: completes with `BlockError::Unsupported`.
    None,
}

/// What a queue needs to know about its backend.
#[derive(Clone, Copy, Debug)]
pub struct QueueConfig {
    pub block_size: u32,
    pub read_only: bool,
    /// O_DIRECT: every segment length and the offset must be multiples of
    /// this (0: no check).
    pub direct_align: u32,
    pub unmap: UnmapVia,
    pub zeroes: ZeroesVia,
}

/// State every queue of one backend shares.
#[derive(Debug)]
pub struct Shared {
    pub file: File,
    /// Capacity in bytes as last published (`resync` updates it).
    pub capacity: AtomicU64,
    /// Set once `ZERO_RANGE` was refused: punch holes from then on.
    zero_range_refused: AtomicBool,
    /// The backing store vanished (deleted, truncated below the capacity,
    /// or the kernel said so): every operation fails with
    /// `BlockError::Offline` until a resync finds it whole again.
    offline: AtomicBool,
    /// A regular file (deletion and truncation can be detected by `fstat`).
    is_file: bool,
    /// For log lines.
    path: String,
}

/// Submissions between two checks that a regular file is still there.
pub const VANISH_CHECK_EVERY: u32 = 1024;

impl Shared {
    pub fn new(file: File, capacity: u64, path: &std::path::Path) -> Shared {
        let is_file = file.metadata().is_ok_and(|m| m.file_type().is_file());
        Shared {
            file,
            capacity: AtomicU64::new(capacity),
            zero_range_refused: AtomicBool::new(false),
            offline: AtomicBool::new(false),
            is_file,
            path: path.display().to_string(),
        }
    }

    /// Whether the backing store has been found gone.
    pub fn is_offline(&self) -> bool {
        self.offline.load(Ordering::Acquire)
    }

    /// Takes the LUN offline (once, with a log line saying why).
    pub fn set_offline(&self, why: &str) {
        if !self.offline.swap(true, Ordering::AcqRel) {
            tracing::error!(path = %self.path, reason = why, "backing store vanished: device offline");
        }
    }

    /// Why the backing file is no longer usable, if it is not: unlinked, or
    /// shorter than the published capacity. Block devices and files whose
    /// `fstat` fails for another reason are given the benefit of the doubt
    /// (their I/O errors speak for them).
    pub fn vanished(&self) -> Option<String> {
        use std::os::unix::fs::MetadataExt;
        if !self.is_file {
            return None;
        }
        let md = match self.file.metadata() {
            Ok(md) => md,
            Err(e) => return Some(format!("fstat failed: {e}")),
        };
        let cap = self.capacity.load(Ordering::Acquire);
        if md.nlink() == 0 {
            Some("the backing file was deleted".into())
        } else if md.len() < cap {
            Some(format!(
                "the backing file was truncated to {} bytes, below the capacity of {cap} bytes",
                md.len()
            ))
        } else {
            None
        }
    }

    /// Checks the backing file; goes offline if it vanished. Returns
    /// whether the store is usable.
    pub fn check(&self) -> bool {
        if let Some(why) = self.vanished() {
            self.set_offline(&why);
        }
        !self.is_offline()
    }

    /// After a resync: back online if the file is whole again (a file
    /// truncated then resynced has a smaller capacity and is whole).
    /// Fails if it is still gone.
    pub fn recheck_after_resync(&self) -> Result<(), String> {
        match self.vanished() {
            Some(why) => {
                self.set_offline(&why);
                Err(why)
            }
            None => {
                if self.offline.swap(false, Ordering::AcqRel) {
                    tracing::info!(path = %self.path, "backing store whole again after resync: device online");
                }
                Ok(())
            }
        }
    }
}

/// Maps an errno to the error the core turns into sense data.
pub fn map_errno(errno: i32) -> BlockError {
    match errno {
        libc::EIO => BlockError::Io,
        libc::ENOSPC | libc::EDQUOT => BlockError::NoSpace,
        libc::ENOENT | libc::ESTALE | libc::ENODEV | libc::EBADF | libc::ENXIO => {
            BlockError::Offline
        }
        libc::EOPNOTSUPP => BlockError::Unsupported,
        e => BlockError::Os(e),
    }
}

#[derive(Clone, Copy, Debug)]
enum Kind {
    Read,
    Write,
    Flush,
    Unmap,
    /// Kept so a refused `ZERO_RANGE` can be redone as a hole punch.
    WriteZeroes {
        offset: u64,
        len: u64,
        punched: bool,
    },
}

#[derive(Debug)]
struct Pending {
    tag: u64,
    kind: Kind,
}

/// One core's queue: a ring and the operations in it.
pub struct UringQueue {
    ring: BlockRing,
    shared: Arc<Shared>,
    cfg: QueueConfig,
    fd: RawFd,
    depth: usize,
    /// Ring user_data -> operation; indexes are reused.
    pending: Vec<Option<Pending>>,
    free: Vec<u64>,
    /// Finished without the kernel; returned by the next poll.
    ready: VecDeque<BlockDone>,
    in_flight: usize,
    /// Defer submissions to `poll` while the kernel holds other operations.
    batch: bool,
    /// Scratch space for one poll's completions (kept to avoid allocating).
    reaped: Vec<(u64, blockring::OpResult, Option<SgList>)>,
    /// Submissions since the backing file was last checked.
    since_check: u32,
    /// How reads and writes are tried before the ring.
    inline: Inline,
}

/// How a queue tries reads and writes on the calling thread first.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Inline {
    /// tmpfs: a plain `preadv2`/`pwritev2` never waits for a device.
    Memory,
    /// `RWF_NOWAIT`: done if the page cache has it, else the ring.
    NoWait,
    /// Never (`O_DIRECT`, or the file refused `RWF_NOWAIT`).
    Never,
}

impl std::fmt::Debug for UringQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UringQueue")
            .field("depth", &self.depth)
            .field("in_flight", &self.in_flight)
            .field("ring", &self.ring)
            .finish()
    }
}

impl UringQueue {
    /// A queue of `depth` operations on `shared.file`.
    pub fn new(
        shared: Arc<Shared>,
        cfg: QueueConfig,
        depth: u32,
    ) -> Result<UringQueue, BackendError> {
        if depth == 0 {
            return Err(BackendError::Invalid("queue depth 0".into()));
        }
        let mut ring = BlockRing::new(depth).map_err(|source| BackendError::Io {
            what: format!("io_uring of {depth} entries"),
            source,
        })?;
        let depth = ring.capacity();
        let fd = shared.file.as_raw_fd();
        let inline = if cfg.direct_align != 0 {
            Inline::Never
        } else if blockring::on_tmpfs(shared.file.as_fd()) {
            Inline::Memory
        } else {
            Inline::NoWait
        };
        // A registered file saves a lookup and a shared reference count per
        // operation; without it the plain descriptor works the same.
        if let Err(e) = ring.register_file(fd) {
            tracing::debug!(error = %e, "io_uring file registration refused; using the descriptor");
        }
        Ok(UringQueue {
            ring,
            shared,
            cfg,
            fd,
            depth,
            pending: Vec::with_capacity(depth),
            free: Vec::new(),
            ready: VecDeque::new(),
            in_flight: 0,
            reaped: Vec::with_capacity(depth),
            batch: true,
            since_check: 0,
            inline,
        })
    }

    /// Whether submissions made while the kernel holds other operations of
    /// this queue wait for the next `poll` (default) or enter the kernel at
    /// once (one io_uring_enter per operation).
    pub fn set_batch_submit(&mut self, on: bool) {
        self.batch = on;
    }

    /// What this queue's ring has submitted (for tests and statistics).
    pub fn ring_stats(&self) -> RingStats {
        self.ring.stats()
    }

    /// Tries a read (or write) on this thread (see [`Inline`]); gives the
    /// buffer back unless it finished the whole transfer.
    fn try_inline(&mut self, write: bool, offset: u64, mut buf: SgList) -> Result<SgList, SgList> {
        let flags = match self.inline {
            Inline::Memory => 0,
            Inline::NoWait => libc::RWF_NOWAIT,
            Inline::Never => return Err(buf),
        };
        let fd = self.shared.file.as_fd();
        let r = if write {
            blockring::pwritev2_now(fd, offset, &buf, flags)
        } else {
            blockring::preadv2_now(fd, offset, &mut buf, flags)
        };
        match r {
            Ok(n) if n == buf.len() => Ok(buf),
            Err(e) if e.raw_os_error() == Some(libc::EOPNOTSUPP) => {
                // This file cannot say "would block": leave it to the ring.
                self.inline = Inline::Never;
                Err(buf)
            }
            // Short, would block or failed: the ring does it again and
            // reports whatever error there is.
            _ => Err(buf),
        }
    }

    fn finish_now(&mut self, tag: u64, result: Result<(), BlockError>, buf: Option<SgList>) {
        self.in_flight += 1;
        self.ready.push_back(BlockDone {
            tag,
            result,
            buf,
            pipe: None,
        });
    }

    fn finish_pipe(&mut self, tag: u64, result: Result<(), BlockError>, pipe: Pipe) {
        self.in_flight += 1;
        self.ready.push_back(BlockDone {
            tag,
            result,
            buf: None,
            pipe: Some(pipe),
        });
    }

    /// `BlockOp::ReadPipe`: the file's pages go into the pipe on this
    /// thread, as a tmpfs read would be copied here (see [`Inline`]); no
    /// byte is copied.
    fn read_pipe(&mut self, tag: u64, offset: u64, len: u32, mut pipe: Pipe) {
        if !self.in_range(offset, len as u64) {
            self.finish_pipe(tag, Err(BlockError::Os(libc::EINVAL)), pipe);
            return;
        }
        if self.inline != Inline::Memory {
            // Only files in memory offer pipes (`Caps::read_pipe`).
            self.finish_pipe(tag, Err(BlockError::Unsupported), pipe);
            return;
        }
        let result = match pipe.splice_from_file(&self.shared.file, offset, len as usize) {
            Ok(n) if n == len as usize => Ok(()),
            // Short: the file was truncated below the capacity under us
            // (the LUN goes offline), or the pipe could not take it all.
            Ok(_) if !self.shared.check() => Err(BlockError::Offline),
            Ok(_) => Err(BlockError::Io),
            Err(e) => Err(map_errno(e.raw_os_error().unwrap_or(libc::EIO))),
        };
        self.finish_pipe(tag, result, pipe);
    }

    fn slot(&mut self, p: Pending) -> u64 {
        match self.free.pop() {
            Some(i) => {
                self.pending[i as usize] = Some(p);
                i
            }
            None => {
                self.pending.push(Some(p));
                (self.pending.len() - 1) as u64
            }
        }
    }

    fn unslot(&mut self, ud: u64) -> Option<Pending> {
        let p = self.pending.get_mut(ud as usize)?.take()?;
        self.free.push(ud);
        Some(p)
    }

    fn in_range(&self, offset: u64, len: u64) -> bool {
        let cap = self.shared.capacity.load(Ordering::Acquire);
        offset.checked_add(len).is_some_and(|end| end <= cap)
    }

    fn aligned(&self, offset: u64, buf: &SgList) -> bool {
        let a = self.cfg.direct_align as u64;
        a == 0
            || (offset.is_multiple_of(a)
                && buf
                    .segments()
                    .iter()
                    .all(|s| (s.len() as u64).is_multiple_of(a)))
    }

    /// Submits a ring operation for `p`; on a full ring, gives back `p` and the buffer.
    fn push(&mut self, p: Pending, op: RingOp) -> Result<(), (Pending, Option<SgList>)> {
        let kind = p.kind;
        let ud = self.slot(p);
        let r = match op {
            RingOp::Read { offset, buf } => self.ring.submit_readv(self.fd, offset, buf, ud, 0),
            RingOp::Write { offset, buf, flags } => {
                self.ring.submit_writev(self.fd, offset, buf, ud, flags)
            }
            RingOp::Fsync => self.ring.submit_fsync(self.fd, true, ud),
            RingOp::Fallocate { mode, offset, len } => {
                self.ring.submit_fallocate(self.fd, mode, offset, len, ud)
            }
        };
        match r {
            Ok(()) => {
                self.in_flight += 1;
                // Submission batching within the contract: enter the kernel
                // now only if it holds none of our operations. Otherwise a
                // completion is on its way; it signals the eventfd, the
                // reactor polls, and `poll` submits everything queued since
                // in one io_uring_enter. A reactor that keeps polling (it
                // does while it has work) submits on its next round.
                let in_kernel = self
                    .ring
                    .in_flight()
                    .saturating_sub(self.ring.unsubmitted());
                if in_kernel == 0 || !self.batch {
                    // A failure leaves the SQE queued; poll submits it again.
                    let _ = self.ring.submit();
                }
                Ok(())
            }
            Err(RingFull(buf)) => {
                let p = self.unslot(ud).unwrap_or(Pending { tag: 0, kind });
                Err((p, buf))
            }
        }
    }

    fn zero_range_op(&self, offset: u64, len: u64) -> RingOp {
        let punch = match self.cfg.zeroes {
            ZeroesVia::ZeroRange { punch_fallback } => {
                punch_fallback && self.shared.zero_range_refused.load(Ordering::Relaxed)
            }
            ZeroesVia::None => false,
        };
        let mode = if punch {
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE
        } else {
            libc::FALLOC_FL_ZERO_RANGE | libc::FALLOC_FL_KEEP_SIZE
        };
        RingOp::Fallocate { mode, offset, len }
    }
}

enum RingOp {
    Read {
        offset: u64,
        buf: SgList,
    },
    Write {
        offset: u64,
        buf: SgList,
        flags: i32,
    },
    Fsync,
    Fallocate {
        mode: i32,
        offset: u64,
        len: u64,
    },
}

/// Rebuilds the `BlockOp` a full ring refused, so `Busy` hands it back whole.
fn give_back(op_for_busy: OpShape, buf: Option<SgList>) -> BlockOp {
    match (op_for_busy, buf) {
        (OpShape::Read { offset }, Some(buf)) => BlockOp::Read { offset, buf },
        (OpShape::Write { offset, fua }, Some(buf)) => BlockOp::Write { offset, buf, fua },
        (OpShape::Unmap { offset, len }, _) => BlockOp::Unmap { offset, len },
        (OpShape::WriteZeroes { offset, len }, _) => BlockOp::WriteZeroes { offset, len },
        // Flush, or a buffer-less read/write (cannot happen: the ring returns
        // the buffer it was given).
        _ => BlockOp::Flush,
    }
}

#[derive(Clone, Copy)]
enum OpShape {
    Read { offset: u64 },
    Write { offset: u64, fua: bool },
    Flush,
    Unmap { offset: u64, len: u64 },
    WriteZeroes { offset: u64, len: u64 },
}

impl BackendQueue for UringQueue {
    fn submit(&mut self, tag: u64, op: BlockOp) -> Result<(), Busy<BlockOp>> {
        if self.in_flight >= self.depth || !self.ring.has_room() {
            return Err(Busy(op));
        }
        // A vanished backing store fails everything (NOT READY in the core)
        // instead of reading a deleted file's ghost or zeroes past a
        // truncation. Checked with one fstat every VANISH_CHECK_EVERY
        // submissions and before every flush (SYNCHRONIZE CACHE promises
        // durability, which a deleted file cannot give).
        self.since_check += 1;
        let due = self.since_check >= VANISH_CHECK_EVERY || matches!(op, BlockOp::Flush);
        if due {
            self.since_check = 0;
        }
        if self.shared.is_offline() || (due && !self.shared.check()) {
            let buf = match op {
                BlockOp::Read { buf, .. } | BlockOp::Write { buf, .. } => Some(buf),
                BlockOp::ReadPipe { pipe, .. } => {
                    self.finish_pipe(tag, Err(BlockError::Offline), pipe);
                    return Ok(());
                }
                _ => None,
            };
            self.finish_now(tag, Err(BlockError::Offline), buf);
            return Ok(());
        }
        let range_err = Err(BlockError::Os(libc::EINVAL));
        let rofs = Err(BlockError::Os(libc::EROFS));
        let (shape, p, rop) = match op {
            BlockOp::ReadPipe { offset, len, pipe } => {
                self.read_pipe(tag, offset, len, pipe);
                return Ok(());
            }
            BlockOp::Read { offset, buf } => {
                if !self.in_range(offset, buf.len() as u64) || !self.aligned(offset, &buf) {
                    self.finish_now(tag, range_err, Some(buf));
                    return Ok(());
                }
                if buf.is_empty() {
                    self.finish_now(tag, Ok(()), Some(buf));
                    return Ok(());
                }
                let buf = match self.try_inline(false, offset, buf) {
                    Ok(buf) => {
                        self.finish_now(tag, Ok(()), Some(buf));
                        return Ok(());
                    }
                    Err(buf) => buf,
                };
                (
                    OpShape::Read { offset },
                    Pending {
                        tag,
                        kind: Kind::Read,
                    },
                    RingOp::Read { offset, buf },
                )
            }
            BlockOp::Write { offset, buf, fua } => {
                if self.cfg.read_only {
                    self.finish_now(tag, rofs, Some(buf));
                    return Ok(());
                }
                if !self.in_range(offset, buf.len() as u64) || !self.aligned(offset, &buf) {
                    self.finish_now(tag, range_err, Some(buf));
                    return Ok(());
                }
                if buf.is_empty() {
                    self.finish_now(tag, Ok(()), Some(buf));
                    return Ok(());
                }
                // SBC-4 §5.40 WRITE (10): FUA=1 means the data is on the
                // medium before GOOD status; RWF_DSYNC gives exactly that
                // for this write. The core sets `fua` (for every write of
                // a write-through device, for none where nv_cache says the
                // cache is safe).
                let flags = if fua { libc::RWF_DSYNC } else { 0 };
                (
                    OpShape::Write { offset, fua },
                    Pending {
                        tag,
                        kind: Kind::Write,
                    },
                    RingOp::Write { offset, buf, flags },
                )
            }
            BlockOp::Flush => {
                if self.cfg.read_only {
                    self.finish_now(tag, Ok(()), None);
                    return Ok(());
                }
                // SBC-4 §5.27 SYNCHRONIZE CACHE: every write completed so
                // far must be on the medium: fdatasync.
                (
                    OpShape::Flush,
                    Pending {
                        tag,
                        kind: Kind::Flush,
                    },
                    RingOp::Fsync,
                )
            }
            BlockOp::Unmap { offset, len } => {
                if self.cfg.read_only {
                    self.finish_now(tag, rofs, None);
                    return Ok(());
                }
                if !self.in_range(offset, len) {
                    self.finish_now(tag, range_err, None);
                    return Ok(());
                }
                match self.cfg.unmap {
                    UnmapVia::None => {
                        self.finish_now(tag, Err(BlockError::Unsupported), None);
                        return Ok(());
                    }
                    UnmapVia::BlkDiscard => {
                        // Blocking: see `UnmapVia::BlkDiscard`.
                        let r = blockring::blk_discard(self.shared.file.as_fd(), offset, len)
                            .map_err(|e| map_errno(e.raw_os_error().unwrap_or(libc::EIO)));
                        self.finish_now(tag, r, None);
                        return Ok(());
                    }
                    UnmapVia::PunchHole => (
                        OpShape::Unmap { offset, len },
                        Pending {
                            tag,
                            kind: Kind::Unmap,
                        },
                        RingOp::Fallocate {
                            mode: libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                            offset,
                            len,
                        },
                    ),
                }
            }
            BlockOp::WriteZeroes { offset, len } => {
                if self.cfg.read_only {
                    self.finish_now(tag, rofs, None);
                    return Ok(());
                }
                if !self.in_range(offset, len) {
                    self.finish_now(tag, range_err, None);
                    return Ok(());
                }
                if self.cfg.zeroes == ZeroesVia::None {
                    self.finish_now(tag, Err(BlockError::Unsupported), None);
                    return Ok(());
                }
                let rop = self.zero_range_op(offset, len);
                let punched = matches!(rop, RingOp::Fallocate { mode, .. } if mode & libc::FALLOC_FL_PUNCH_HOLE != 0);
                (
                    OpShape::WriteZeroes { offset, len },
                    Pending {
                        tag,
                        kind: Kind::WriteZeroes {
                            offset,
                            len,
                            punched,
                        },
                    },
                    rop,
                )
            }
        };
        match self.push(p, rop) {
            Ok(()) => Ok(()),
            // Cannot happen after the `has_room` check above (one slot per
            // operation), but a full ring is back-pressure, never a panic.
            Err((_, buf)) => Err(Busy(give_back(shape, buf))),
        }
    }

    fn poll(&mut self, out: &mut Vec<BlockDone>) {
        // Anything a failed io_uring_enter left queued goes now.
        let _ = self.ring.submit();
        while let Some(d) = self.ready.pop_front() {
            self.in_flight -= 1;
            out.push(d);
        }
        let mut reaped = std::mem::take(&mut self.reaped);
        self.ring.reap(|ud, r, buf| reaped.push((ud, r, buf)));
        for (ud, r, buf) in reaped.drain(..) {
            let Some(p) = self.unslot(ud) else { continue };
            let tag = p.tag;
            self.in_flight -= 1;
            let (result, buf) = match (p.kind, r) {
                (Kind::Read, Ok(n)) => {
                    let mut buf = buf;
                    let want = buf.as_ref().map_or(0, |b| b.len() as u64);
                    if n < want && !self.shared.check() {
                        // Short read: the file was truncated below the
                        // capacity under us. The LUN goes offline rather
                        // than inventing zeroes.
                        (Err(BlockError::Offline), buf)
                    } else {
                        if let Some(b) = buf.as_mut() {
                            // Short read of a file that is whole again (or
                            // that is not a regular file): zero the rest.
                            zero_from(b, n as usize);
                        }
                        (Ok(()), buf)
                    }
                }
                (Kind::Write, Ok(n)) => {
                    let want = buf.as_ref().map_or(0, |b| b.len() as u64);
                    // The ring resubmits short writes; a write that stops
                    // making progress is an I/O error.
                    (
                        if n == want {
                            Ok(())
                        } else {
                            Err(BlockError::Io)
                        },
                        buf,
                    )
                }
                (
                    Kind::WriteZeroes {
                        offset,
                        len,
                        punched: false,
                    },
                    Err(e),
                ) if matches!(e, libc::EOPNOTSUPP | libc::EINVAL)
                    && matches!(
                        self.cfg.zeroes,
                        ZeroesVia::ZeroRange {
                            punch_fallback: true
                        }
                    ) =>
                {
                    // The filesystem has no ZERO_RANGE (tmpfs): punch a hole,
                    // which reads back as zeroes, and remember.
                    self.shared
                        .zero_range_refused
                        .store(true, Ordering::Relaxed);
                    let p = Pending {
                        tag,
                        kind: Kind::WriteZeroes {
                            offset,
                            len,
                            punched: true,
                        },
                    };
                    let rop = self.zero_range_op(offset, len);
                    match self.push(p, rop) {
                        Ok(()) => continue,
                        Err(_) => (Err(BlockError::Unsupported), None),
                    }
                }
                (_, Ok(_)) => (Ok(()), buf),
                (_, Err(e)) => {
                    let err = map_errno(e);
                    if err == BlockError::Offline {
                        self.shared.set_offline(&format!(
                            "the kernel answered {}",
                            std::io::Error::from_raw_os_error(e)
                        ));
                    } else {
                        // An I/O error may be the first sign of a vanished
                        // file; the error itself is reported either way.
                        self.shared.check();
                    }
                    (Err(err), buf)
                }
            };
            out.push(BlockDone {
                tag,
                result,
                buf,
                pipe: None,
            });
        }
        self.reaped = reaped;
    }

    fn in_flight(&self) -> usize {
        self.in_flight
    }

    fn notify_fd(&self) -> Option<RawFd> {
        Some(self.ring.eventfd())
    }
}

/// Zeroes `buf` from byte `from` to its end.
fn zero_from(buf: &mut SgList, from: usize) {
    let mut skip = from;
    for seg in buf.segments_mut() {
        if skip >= seg.len() {
            skip -= seg.len();
            continue;
        }
        seg[skip..].fill(0);
        skip = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errno_mapping() {
        assert_eq!(map_errno(libc::EIO), BlockError::Io);
        assert_eq!(map_errno(libc::ENOSPC), BlockError::NoSpace);
        assert_eq!(map_errno(libc::ENOENT), BlockError::Offline);
        assert_eq!(map_errno(libc::ESTALE), BlockError::Offline);
        assert_eq!(map_errno(libc::ENODEV), BlockError::Offline);
        assert_eq!(map_errno(libc::EBADF), BlockError::Offline);
        assert_eq!(map_errno(libc::EOPNOTSUPP), BlockError::Unsupported);
        assert_eq!(map_errno(libc::EPERM), BlockError::Os(libc::EPERM));
    }

    /// Reads are answered from the calling thread where that cannot block
    /// (tmpfs, or a page-cache hit elsewhere); either way the data is right.
    #[test]
    fn reads_finish_inline_where_they_cannot_block() {
        use std::io::Write;
        let shm = std::path::Path::new("/dev/shm");
        let dir = if shm.is_dir() {
            tempfile::tempdir_in(shm).unwrap()
        } else {
            tempfile::tempdir().unwrap()
        };
        let path = dir.path().join("lun");
        let mut f = File::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .unwrap();
        let data: Vec<u8> = (0..65536u32).map(|i| (i % 251) as u8).collect();
        f.write_all(&data).unwrap();
        let tmpfs = blockring::on_tmpfs(f.as_fd());
        let shared = Arc::new(Shared::new(f, data.len() as u64, &path));
        let cfg = QueueConfig {
            block_size: 512,
            read_only: false,
            direct_align: 0,
            unmap: UnmapVia::None,
            zeroes: ZeroesVia::None,
        };
        let mut q = UringQueue::new(shared, cfg, 8).unwrap();
        let pool = ferrite_reactor::buf::BufPool::new(16384, 4);
        q.submit(
            1,
            BlockOp::Read {
                offset: 4096,
                buf: pool.sg(20000),
            },
        )
        .unwrap();
        let mut done = Vec::new();
        for _ in 0..1000 {
            q.poll(&mut done);
            if !done.is_empty() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        assert_eq!(done.len(), 1);
        assert!(done[0].result.is_ok());
        let got = done[0].buf.as_ref().unwrap().to_vec();
        assert_eq!(got, data[4096..24096]);
        if tmpfs {
            assert_eq!(q.ring_stats().ops, 0, "a tmpfs read went through the ring");
        }
    }

    #[test]
    fn zero_from_spans_segments() {
        let mut sg = SgList::new();
        for _ in 0..3 {
            sg.push(ferrite_reactor::buf::IoBuf::from_slice(&[7u8; 100]));
        }
        zero_from(&mut sg, 150);
        let v = sg.to_vec();
        assert!(v[..150].iter().all(|&b| b == 7));
        assert!(v[150..].iter().all(|&b| b == 0));
    }
}
