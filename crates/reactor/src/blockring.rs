//! A safe io_uring for block I/O: what the file and block backends submit
//! through, plus the few block-device and file syscalls io_uring does not
//! wrap (size and sector-size ioctls, discard, zero-out, `SEEK_DATA`/`SEEK_HOLE`,
//! synchronous `fallocate`).
//!
//! A [`BlockRing`] owns one io_uring with an eventfd registered on it, and a
//! fixed number of operation slots. Every vectored read or write moves its
//! [`SgList`] into a slot together with the `iovec` array built from it; both
//! stay there, untouched, until the kernel has posted the operation's last
//! completion. That is the invariant every `SAFETY:` comment below relies on.
//! The list comes back to the caller through [`BlockRing::reap`].
//!
//! Short transfers are finished here: a read or write that moved fewer bytes
//! than asked (and more than none) is resubmitted for the rest, so the caller
//! sees one completion per operation with the total byte count. A read that
//! hits end of file (result 0) completes with the bytes read so far.
//!
//! The ring is owned by one core. It does not batch submissions by itself:
//! [`BlockRing::submit`] enters the kernel with whatever was queued.
//!
//! Not here: registered (fixed) buffers and files, SQPOLL. Dropping a ring
//! with operations in flight waits for them, because the kernel may still be
//! writing into their buffers.

use std::fs::File;
use std::io::{self, Read};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

use io_uring::{IoUring, opcode, squeue, types};

use crate::buf::SgList;

/// Most iovecs one `readv`/`writev` may carry (Linux `UIO_MAXIOV`). Longer
/// lists are transferred in several rounds by the short-transfer logic.
const IOV_MAX: usize = 1024;

/// `reap` clears the eventfd at least once every this many empty rounds.
const EFD_SWEEP: u32 = 64;

/// Builds an SQE on `$fd`: through the ring's registered file when `$fd` is
/// the one registered, else on the plain descriptor.
macro_rules! on_fd {
    ($ring:ident, $fd:expr, |$f:ident| $build:expr) => {
        if $ring.fixed == Some($fd) {
            let $f = types::Fixed(0);
            $build
        } else {
            let $f = types::Fd($fd);
            $build
        }
    };
}

/// What kind of operation a slot holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Readv,
    Writev,
    Fsync,
    Fallocate,
}

/// One operation in flight. Owns the buffer and the iovecs pointing into it.
struct Op {
    user_data: u64,
    kind: Kind,
    fd: RawFd,
    /// File offset of the first byte of the operation.
    offset: u64,
    rw_flags: i32,
    /// Bytes transferred so far (reads and writes).
    done: usize,
    /// Bytes asked for (reads and writes).
    total: usize,
    buf: Option<SgList>,
}

struct Slot {
    op: Option<Op>,
    /// The iovec array the kernel reads while the slot's op is in flight.
    /// Reused between operations to avoid an allocation per I/O.
    iov: Vec<libc::iovec>,
}

/// Counters a backend (or a test) can read to see what was submitted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RingStats {
    /// Operations accepted by a `submit_*` call.
    pub ops: u64,
    /// Extra submissions for the rest of a short read or write.
    pub resubmits: u64,
    /// Writes submitted with `RWF_DSYNC`.
    pub dsync_writes: u64,
    /// Fsyncs submitted.
    pub fsyncs: u64,
}

/// The ring has no free slot; the buffer (if the operation had one) comes back.
#[derive(Debug)]
pub struct RingFull(pub Option<SgList>);

/// The outcome of one operation as [`BlockRing::reap`] reports it:
/// `Ok(n)` is the byte count for reads and writes (the kernel's result for the
/// others), `Err(errno)` a failure.
pub type OpResult = Result<u64, i32>;

/// A safe io_uring for block I/O, owned by one core.
pub struct BlockRing {
    ring: IoUring,
    eventfd: File,
    slots: Vec<Slot>,
    free: Vec<u32>,
    in_flight: usize,
    /// SQEs pushed but not yet handed to the kernel.
    unsubmitted: usize,
    stats: RingStats,
    /// The descriptor registered as fixed file 0, if any.
    fixed: Option<RawFd>,
    /// Completions were drained since the eventfd was last cleared.
    efd_dirty: bool,
    /// `reap` calls since completions were last found.
    empty_rounds: u32,
}

// SAFETY: the raw pointers a BlockRing holds (in `iovec`s) point into heap
// buffers owned by its own slots; they stay valid wherever the ring is moved,
// and the ring is used by one thread at a time (`&mut self` everywhere).
unsafe impl Send for BlockRing {}

impl std::fmt::Debug for BlockRing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BlockRing")
            .field("slots", &self.slots.len())
            .field("in_flight", &self.in_flight)
            .field("stats", &self.stats)
            .finish()
    }
}

impl BlockRing {
    /// A ring with room for `entries` operations in flight (at least 1), with
    /// an eventfd registered that becomes readable when completions arrive.
    pub fn new(entries: u32) -> io::Result<BlockRing> {
        let entries = entries.clamp(1, 32768);
        let cq = entries.saturating_mul(2).next_power_of_two();
        // COOP_TASKRUN (Linux 5.19): completions that need the submitting
        // task's context (io-wq punts, as for buffered and tmpfs I/O) no
        // longer interrupt a running core with an IPI; they wait for its next
        // kernel entry, which `reap` makes when TASKRUN_FLAG says some wait.
        // A sleeping core is still woken. Older kernels: a plain ring.
        let ring = match IoUring::builder()
            .setup_cqsize(cq)
            .setup_coop_taskrun()
            .setup_taskrun_flag()
            .build(entries)
        {
            Ok(r) => r,
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                IoUring::builder().setup_cqsize(cq).build(entries)?
            }
            Err(e) => return Err(e),
        };
        // SAFETY: eventfd(2) takes no pointers; the result is checked below.
        let efd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if efd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `efd` is a fresh descriptor returned by eventfd(2) and owned
        // by nothing else; OwnedFd takes sole ownership of it.
        let owned = unsafe { OwnedFd::from_raw_fd(efd) };
        ring.submitter().register_eventfd(owned.as_raw_fd())?;
        let n = entries as usize;
        let slots = (0..n)
            .map(|_| Slot {
                op: None,
                iov: Vec::new(),
            })
            .collect();
        let free = (0..entries).rev().collect();
        Ok(BlockRing {
            ring,
            eventfd: File::from(owned),
            slots,
            free,
            in_flight: 0,
            unsubmitted: 0,
            stats: RingStats::default(),
            fixed: None,
            efd_dirty: false,
            empty_rounds: 0,
        })
    }

    /// The eventfd registered on the ring: readable when completions wait.
    /// [`BlockRing::reap`] clears it.
    pub fn eventfd(&self) -> RawFd {
        self.eventfd.as_raw_fd()
    }

    /// Operation slots in all.
    pub fn capacity(&self) -> usize {
        self.slots.len()
    }

    /// Operations submitted and not yet reaped.
    pub fn in_flight(&self) -> usize {
        self.in_flight
    }

    /// Registers `fd` as the ring's fixed file: later operations on `fd` skip
    /// the per-operation file lookup and reference count (shared across
    /// cores, that count is a contended cache line). One file per ring. The
    /// ring keeps its own reference to the file: operations on the number
    /// `fd` reach this file even if the caller closes and reuses the number.
    pub fn register_file(&mut self, fd: RawFd) -> io::Result<()> {
        if self.fixed.is_some() {
            return Err(io::Error::from_raw_os_error(libc::EBUSY));
        }
        self.ring.submitter().register_files(&[fd])?;
        self.fixed = Some(fd);
        Ok(())
    }

    /// Operations queued but not yet handed to the kernel.
    pub fn unsubmitted(&self) -> usize {
        self.unsubmitted
    }

    /// Whether another operation fits.
    pub fn has_room(&self) -> bool {
        !self.free.is_empty()
    }

    /// What was submitted so far.
    pub fn stats(&self) -> RingStats {
        self.stats
    }

    /// Queues a vectored read of `buf.len()` bytes at `offset` of `fd` into
    /// `buf`. `fd` must stay open until the completion is reaped (if it does
    /// not, the read fails or reads another file; memory stays safe).
    pub fn submit_readv(
        &mut self,
        fd: RawFd,
        offset: u64,
        buf: SgList,
        user_data: u64,
        rw_flags: i32,
    ) -> Result<(), RingFull> {
        self.start_rw(Kind::Readv, fd, offset, buf, user_data, rw_flags)
    }

    /// Queues a vectored write of `buf` at `offset` of `fd`; `rw_flags` as for
    /// `pwritev2(2)` (e.g. `libc::RWF_DSYNC`).
    pub fn submit_writev(
        &mut self,
        fd: RawFd,
        offset: u64,
        buf: SgList,
        user_data: u64,
        rw_flags: i32,
    ) -> Result<(), RingFull> {
        if rw_flags & libc::RWF_DSYNC != 0 {
            self.stats.dsync_writes += 1;
        }
        self.start_rw(Kind::Writev, fd, offset, buf, user_data, rw_flags)
    }

    /// Queues an `fsync` (`fdatasync` when `datasync`).
    pub fn submit_fsync(
        &mut self,
        fd: RawFd,
        datasync: bool,
        user_data: u64,
    ) -> Result<(), RingFull> {
        let Some(idx) = self.free.pop() else {
            return Err(RingFull(None));
        };
        let flags = if datasync {
            types::FsyncFlags::DATASYNC
        } else {
            types::FsyncFlags::empty()
        };
        let sqe =
            on_fd!(self, fd, |f| opcode::Fsync::new(f).flags(flags).build()).user_data(idx as u64);
        self.stats.fsyncs += 1;
        self.start_simple(idx, Kind::Fsync, fd, user_data, sqe)
    }

    /// Queues an `fallocate(2)` of `[offset, offset+len)` with `mode`
    /// (`FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE`, `FALLOC_FL_ZERO_RANGE`, ...).
    pub fn submit_fallocate(
        &mut self,
        fd: RawFd,
        mode: i32,
        offset: u64,
        len: u64,
        user_data: u64,
    ) -> Result<(), RingFull> {
        let Some(idx) = self.free.pop() else {
            return Err(RingFull(None));
        };
        let sqe = on_fd!(self, fd, |f| opcode::Fallocate::new(f, len)
            .offset(offset)
            .mode(mode)
            .build())
        .user_data(idx as u64);
        self.start_simple(idx, Kind::Fallocate, fd, user_data, sqe)
    }

    /// Hands every queued operation to the kernel. Returns how many were
    /// consumed. On error the operations stay queued for the next call.
    pub fn submit(&mut self) -> io::Result<usize> {
        if self.unsubmitted == 0 {
            return Ok(0);
        }
        loop {
            match self.ring.submit() {
                Ok(n) => {
                    self.unsubmitted = self.unsubmitted.saturating_sub(n);
                    return Ok(n);
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
        }
    }

    /// Clears the eventfd, then calls `f(user_data, result, buffer)` once for
    /// every finished operation. Short reads and writes are resubmitted for
    /// the rest instead of being reported. Returns the number reported.
    pub fn reap(&mut self, mut f: impl FnMut(u64, OpResult, Option<SgList>)) -> usize {
        // Reading the eventfd is a syscall; a busy-polling core calls this
        // far more often than completions arrive. Clear it when completions
        // wait (before draining them, so a later one signals again), once
        // more after a round that drained some (their signals may land
        // after the clear), and every EFD_SWEEP empty rounds regardless:
        // the kernel signals the eventfd just after posting a CQE, so a
        // signal can outlive its CQE; the sweep bounds the spurious
        // wake-ups that would cause.
        let mut cq_ready = !self.ring.completion().is_empty();
        if !cq_ready && self.in_flight > 0 && self.ring.submission().taskrun() {
            // Task work holds completions back (COOP_TASKRUN): any kernel
            // entry runs it. `submit` also hands over queued SQEs.
            self.enter();
            cq_ready = !self.ring.completion().is_empty();
        }
        self.empty_rounds = self.empty_rounds.wrapping_add(1);
        if cq_ready || self.efd_dirty || self.empty_rounds.is_multiple_of(EFD_SWEEP) {
            self.clear_eventfd();
            self.efd_dirty = false;
            // Look again after the clear: a CQE posted just before it lost
            // its signal and must be drained now; one posted after it
            // signals again.
            cq_ready = !self.ring.completion().is_empty();
        }
        if !cq_ready {
            return 0;
        }
        self.efd_dirty = true;
        self.empty_rounds = 0;
        let mut reported = 0;
        loop {
            // Collect first: the completion queue borrows the ring, and
            // resubmitting needs the submission queue.
            let mut batch: smallvec::SmallVec<[(u64, i32); 32]> = smallvec::SmallVec::new();
            batch.extend(
                self.ring
                    .completion()
                    .take(32)
                    .map(|c| (c.user_data(), c.result())),
            );
            if batch.is_empty() {
                break;
            }
            for (idx, res) in batch {
                if let Some((ud, r, buf)) = self.complete(idx, res, true) {
                    reported += 1;
                    f(ud, r, buf);
                }
            }
        }
        if self.unsubmitted > 0 {
            // A failure here leaves the resubmissions queued; the next
            // `submit` or `reap` retries.
            let _ = self.submit();
        }
        reported
    }

    /// Submits what is queued and blocks until at least one completion is
    /// available (for tests, benchmarks and shutdown, not for reactors).
    pub fn wait(&mut self) -> io::Result<()> {
        loop {
            match self.ring.submit_and_wait(1) {
                Ok(_) => {
                    self.unsubmitted = 0;
                    return Ok(());
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
        }
    }

    /// Enters the kernel even with nothing to submit (runs pending task work).
    fn enter(&mut self) {
        if let Ok(n) = self.ring.submitter().submit() {
            self.unsubmitted = self.unsubmitted.saturating_sub(n);
        }
    }

    fn clear_eventfd(&mut self) {
        let mut cnt = [0u8; 8];
        // Non-blocking: WouldBlock means the counter was already zero.
        let _ = self.eventfd.read(&mut cnt);
    }

    fn start_simple(
        &mut self,
        idx: u32,
        kind: Kind,
        fd: RawFd,
        user_data: u64,
        sqe: squeue::Entry,
    ) -> Result<(), RingFull> {
        let slot = &mut self.slots[idx as usize];
        slot.op = Some(Op {
            user_data,
            kind,
            fd,
            offset: 0,
            rw_flags: 0,
            done: 0,
            total: 0,
            buf: None,
        });
        // SAFETY: fsync and fallocate SQEs carry no pointers into user memory.
        let pushed = unsafe { self.ring.submission().push(&sqe) };
        if pushed.is_err() {
            self.slots[idx as usize].op = None;
            self.free.push(idx);
            return Err(RingFull(None));
        }
        self.unsubmitted += 1;
        self.in_flight += 1;
        self.stats.ops += 1;
        Ok(())
    }

    fn start_rw(
        &mut self,
        kind: Kind,
        fd: RawFd,
        offset: u64,
        buf: SgList,
        user_data: u64,
        rw_flags: i32,
    ) -> Result<(), RingFull> {
        let Some(idx) = self.free.pop() else {
            return Err(RingFull(Some(buf)));
        };
        let total = buf.len();
        self.slots[idx as usize].op = Some(Op {
            user_data,
            kind,
            fd,
            offset,
            rw_flags,
            done: 0,
            total,
            buf: Some(buf),
        });
        if !self.push_rw(idx) {
            let buf = self.slots[idx as usize].op.take().and_then(|o| o.buf);
            self.free.push(idx);
            return Err(RingFull(buf));
        }
        self.in_flight += 1;
        self.stats.ops += 1;
        Ok(())
    }

    /// Builds the iovecs for the untransferred part of slot `idx`'s buffer
    /// and pushes its SQE. False if the submission queue is full.
    fn push_rw(&mut self, idx: u32) -> bool {
        let slot = &mut self.slots[idx as usize];
        let Some(op) = slot.op.as_mut() else {
            return false;
        };
        slot.iov.clear();
        let mut skip = op.done;
        if let Some(buf) = op.buf.as_mut() {
            for seg in buf.segments_mut() {
                if slot.iov.len() == IOV_MAX {
                    break;
                }
                let len = seg.len();
                if skip >= len {
                    skip -= len;
                    continue;
                }
                let base = seg.as_mut_ptr().wrapping_add(skip);
                slot.iov.push(libc::iovec {
                    iov_base: base.cast(),
                    iov_len: len - skip,
                });
                skip = 0;
            }
        }
        let off = op.offset + op.done as u64;
        let n = slot.iov.len() as u32;
        let iov = slot.iov.as_ptr();
        let sqe = match op.kind {
            Kind::Readv => on_fd!(self, op.fd, |f| opcode::Readv::new(f, iov, n)
                .offset(off)
                .rw_flags(op.rw_flags)
                .build()),
            _ => on_fd!(self, op.fd, |f| opcode::Writev::new(f, iov, n)
                .offset(off)
                .rw_flags(op.rw_flags)
                .build()),
        }
        .user_data(idx as u64);
        // SAFETY: the SQE points at `slot.iov`, whose heap array is neither
        // touched nor reallocated until this op's completion is reaped (the
        // slot is not reused before then), and every iovec points into a
        // segment of `op.buf`, an owned SgList held in the same slot until
        // then; IoBuf memory does not move when the list moves. Each iovec
        // covers only the first `len()` bytes of its segment, which are
        // allocated. Drop waits for in-flight operations before freeing.
        let pushed = unsafe { self.ring.submission().push(&sqe) };
        if pushed.is_ok() {
            self.unsubmitted += 1;
        }
        pushed.is_ok()
    }

    /// Accounts for one CQE. Returns the report for the caller when the
    /// operation is finished; `None` when it was resubmitted (or unknown).
    fn complete(
        &mut self,
        idx: u64,
        res: i32,
        resubmit: bool,
    ) -> Option<(u64, OpResult, Option<SgList>)> {
        let i = usize::try_from(idx)
            .ok()
            .filter(|&i| i < self.slots.len())?;
        let op = self.slots[i].op.as_mut()?;
        let result = if res < 0 {
            Err(-res)
        } else if matches!(op.kind, Kind::Readv | Kind::Writev) {
            op.done += res as usize;
            let (done, total) = (op.done, op.total);
            if resubmit && res > 0 && done < total {
                self.stats.resubmits += 1;
                if self.push_rw(i as u32) {
                    return None;
                }
                // Cannot happen: at most one SQE per slot and no more slots
                // than SQ entries. Report the shortfall rather than lose it.
            }
            Ok(done as u64)
        } else {
            Ok(res as u64)
        };
        let op = self.slots[i].op.take()?;
        self.free.push(i as u32);
        self.in_flight -= 1;
        Some((op.user_data, result, op.buf))
    }
}

impl Drop for BlockRing {
    fn drop(&mut self) {
        // The kernel may still write into buffers of operations in flight:
        // wait for every one of them before the slots (and buffers) are freed.
        while self.in_flight > 0 {
            if self.wait().is_err() {
                // Cannot wait: leak the buffers rather than free memory the
                // kernel may still write to.
                std::mem::forget(std::mem::take(&mut self.slots));
                return;
            }
            let done: Vec<(u64, i32)> = self
                .ring
                .completion()
                .map(|c| (c.user_data(), c.result()))
                .collect();
            for (idx, res) in done {
                let _ = self.complete(idx, res, false);
            }
        }
    }
}

fn cvt(r: libc::c_int) -> io::Result<libc::c_int> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

/// Blocks until `fd` is readable or `timeout` passes (`poll(2)`); true if
/// readable. For tools and tests that sleep on a queue's eventfd without a
/// reactor. A raw descriptor is enough: poll(2) only reports on it (a
/// closed one comes back as not readable).
pub fn wait_readable(fd: RawFd, timeout: std::time::Duration) -> io::Result<bool> {
    let mut pfd = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    let ms = libc::c_int::try_from(timeout.as_millis()).unwrap_or(libc::c_int::MAX);
    loop {
        // SAFETY: one valid, initialised pollfd on the stack; nfds is 1.
        let r = unsafe { libc::poll(&mut pfd, 1, ms) };
        if r >= 0 {
            return Ok(r > 0 && pfd.revents & libc::POLLIN != 0);
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// `fallocate(2)` now, outside the ring (probes and control paths).
pub fn fallocate(fd: BorrowedFd<'_>, mode: i32, offset: u64, len: u64) -> io::Result<()> {
    let off = i64::try_from(offset).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    let len = i64::try_from(len).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: fallocate takes no pointers; `fd` is a live borrowed descriptor.
    cvt(unsafe { libc::fallocate(fd.as_raw_fd(), mode, off, len) }).map(drop)
}

fn lseek(fd: BorrowedFd<'_>, offset: u64, whence: i32) -> io::Result<Option<u64>> {
    let off = i64::try_from(offset).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: lseek takes no pointers; `fd` is a live borrowed descriptor.
    let r = unsafe { libc::lseek(fd.as_raw_fd(), off, whence) };
    if r < 0 {
        let e = io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::ENXIO) {
            return Ok(None);
        }
        return Err(e);
    }
    Ok(Some(r as u64))
}

/// `lseek(SEEK_DATA)`: the first data byte at or after `offset`; `None` when
/// there is none before end of file (ENXIO). Moves the file position.
pub fn seek_data(fd: BorrowedFd<'_>, offset: u64) -> io::Result<Option<u64>> {
    lseek(fd, offset, libc::SEEK_DATA)
}

/// `lseek(SEEK_HOLE)`: the first hole at or after `offset` (end of file
/// counts as a hole); `None` when `offset` is past end of file.
pub fn seek_hole(fd: BorrowedFd<'_>, offset: u64) -> io::Result<Option<u64>> {
    lseek(fd, offset, libc::SEEK_HOLE)
}

// <linux/fs.h> block ioctls libc does not define (generic Linux encoding,
// as on x86, x86_64, arm and aarch64).
/// `_IOR(0x12, 114, size_t)`
const BLKGETSIZE64: libc::c_ulong = 0x8008_1272;
/// `_IO(0x12, 119)`
const BLKDISCARD: libc::c_ulong = 0x1277;
/// `_IO(0x12, 127)`
const BLKZEROOUT: libc::c_ulong = 0x127f;

/// Size in bytes of a block device (`BLKGETSIZE64`).
pub fn blk_size_bytes(fd: BorrowedFd<'_>) -> io::Result<u64> {
    let mut size: u64 = 0;
    // SAFETY: BLKGETSIZE64 writes one u64 through the pointer, which points at
    // a live local of that type.
    cvt(unsafe { libc::ioctl(fd.as_raw_fd(), BLKGETSIZE64 as _, &mut size as *mut u64) })?;
    Ok(size)
}

/// Logical block size of a block device (`BLKSSZGET`).
pub fn blk_logical_block_size(fd: BorrowedFd<'_>) -> io::Result<u32> {
    let mut v: libc::c_int = 0;
    // SAFETY: BLKSSZGET writes one int through the pointer, a live local int.
    cvt(unsafe {
        libc::ioctl(
            fd.as_raw_fd(),
            libc::BLKSSZGET as _,
            &mut v as *mut libc::c_int,
        )
    })?;
    u32::try_from(v).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
}

/// Physical block size of a block device (`BLKPBSZGET`).
pub fn blk_physical_block_size(fd: BorrowedFd<'_>) -> io::Result<u32> {
    let mut v: libc::c_uint = 0;
    // SAFETY: BLKPBSZGET writes one unsigned int through the pointer, a live
    // local of that type.
    cvt(unsafe {
        libc::ioctl(
            fd.as_raw_fd(),
            libc::BLKPBSZGET as _,
            &mut v as *mut libc::c_uint,
        )
    })?;
    Ok(v)
}

/// Discards `[offset, offset+len)` of a block device (`BLKDISCARD`). Blocks
/// until the device has done it.
pub fn blk_discard(fd: BorrowedFd<'_>, offset: u64, len: u64) -> io::Result<()> {
    let range = [offset, len];
    // SAFETY: BLKDISCARD reads two u64 (start, length) through the pointer,
    // which points at a live local array of two u64.
    cvt(unsafe { libc::ioctl(fd.as_raw_fd(), BLKDISCARD as _, range.as_ptr()) }).map(drop)
}

/// Reads into `buf` at `offset` of `fd` with one `preadv2(2)` on the calling
/// thread, `flags` being `RWF_*` (e.g. `RWF_NOWAIT`: only from the page cache,
/// `EAGAIN` otherwise). Returns the bytes read (possibly fewer than asked).
pub fn preadv2_now(
    fd: BorrowedFd<'_>,
    offset: u64,
    buf: &mut SgList,
    flags: i32,
) -> io::Result<usize> {
    let iov: smallvec::SmallVec<[libc::iovec; 8]> = buf
        .segments_mut()
        .iter_mut()
        .take(IOV_MAX_NOW)
        .map(|s| libc::iovec {
            iov_base: s.as_mut_ptr().cast(),
            iov_len: s.len(),
        })
        .collect();
    // SAFETY: each iovec points at a live segment of `buf`, which the
    // exclusive borrow keeps alive and unaliased for the call's duration.
    let n = unsafe {
        libc::preadv2(
            fd.as_raw_fd(),
            iov.as_ptr(),
            iov.len() as libc::c_int,
            offset as libc::off_t,
            flags,
        )
    };
    if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}

/// Writes `buf` at `offset` of `fd` with one `pwritev2(2)` on the calling
/// thread; `flags` as for [`preadv2_now`]. Returns the bytes written.
pub fn pwritev2_now(
    fd: BorrowedFd<'_>,
    offset: u64,
    buf: &SgList,
    flags: i32,
) -> io::Result<usize> {
    let iov: smallvec::SmallVec<[libc::iovec; 8]> = buf
        .segments()
        .iter()
        .take(IOV_MAX_NOW)
        .map(|s| libc::iovec {
            iov_base: s.as_ptr() as *mut libc::c_void,
            iov_len: s.len(),
        })
        .collect();
    // SAFETY: each iovec points at a live segment of `buf`, borrowed for the
    // call's duration; the kernel only reads through them.
    let n = unsafe {
        libc::pwritev2(
            fd.as_raw_fd(),
            iov.as_ptr(),
            iov.len() as libc::c_int,
            offset as libc::off_t,
            flags,
        )
    };
    if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}

/// At most this many segments go into one inline `preadv2`/`pwritev2`
/// (IOV_MAX is 1024); a longer list is done in part and reported short.
const IOV_MAX_NOW: usize = 1024;

/// Whether `fd` lives on tmpfs (memory: its reads and writes never wait
/// for a device, but it refuses `RWF_NOWAIT`, so io_uring hands every one
/// of them to a worker thread).
pub fn on_tmpfs(fd: BorrowedFd<'_>) -> bool {
    const TMPFS_MAGIC: i64 = 0x0102_1994;
    // SAFETY: statfs is plain data; all-zero is a valid value.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: `st` is a live, writable statfs the kernel fills in.
    let r = unsafe { libc::fstatfs(fd.as_raw_fd(), &mut st) };
    r == 0 && st.f_type as i64 == TMPFS_MAGIC
}

/// Writes zeroes to `[offset, offset+len)` of a block device (`BLKZEROOUT`).
/// Blocks until done.
pub fn blk_zeroout(fd: BorrowedFd<'_>, offset: u64, len: u64) -> io::Result<()> {
    let range = [offset, len];
    // SAFETY: BLKZEROOUT reads two u64 (start, length) through the pointer,
    // which points at a live local array of two u64.
    cvt(unsafe { libc::ioctl(fd.as_raw_fd(), BLKZEROOUT as _, range.as_ptr()) }).map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::buf::{BufPool, IoBuf};
    use std::os::fd::AsFd;
    use std::path::PathBuf;
    use std::sync::atomic::{AtomicU32, Ordering};

    /// A file in the temp directory, removed on drop (the reactor crate has
    /// no tempfile dependency).
    struct Tmp {
        path: PathBuf,
        file: File,
    }

    impl Drop for Tmp {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.path);
        }
    }

    fn tmp() -> Tmp {
        static N: AtomicU32 = AtomicU32::new(0);
        let path = std::env::temp_dir().join(format!(
            "ferrite-blockring-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)
            .unwrap();
        Tmp { path, file }
    }

    fn ring_or_skip(n: u32) -> Option<BlockRing> {
        match BlockRing::new(n) {
            Ok(r) => Some(r),
            Err(e) => {
                eprintln!("skipping: io_uring unavailable: {e}");
                None
            }
        }
    }

    fn reap_all(r: &mut BlockRing) -> Vec<(u64, OpResult, Option<SgList>)> {
        let mut out = Vec::new();
        while r.in_flight() > 0 {
            r.wait().unwrap();
            r.reap(|u, res, b| out.push((u, res, b)));
        }
        out
    }

    #[test]
    fn write_then_read_multi_segment() {
        let Some(mut r) = ring_or_skip(4) else { return };
        let t = tmp();
        let f = &t.file;
        r.register_file(f.as_raw_fd()).unwrap();
        assert!(r.register_file(f.as_raw_fd()).is_err());
        let pool = BufPool::new(4096, 8);
        let mut sg = pool.sg(10000);
        let data: Vec<u8> = (0..10000u32).map(|i| (i * 7) as u8).collect();
        sg.copy_in(0, &data);
        r.submit_writev(f.as_raw_fd(), 512, sg, 7, libc::RWF_DSYNC)
            .unwrap();
        r.submit().unwrap();
        let done = reap_all(&mut r);
        assert_eq!(done.len(), 1);
        assert_eq!(done[0].0, 7);
        assert_eq!(done[0].1, Ok(10000));
        assert_eq!(r.stats().dsync_writes, 1);

        let sg = pool.sg(10000);
        r.submit_readv(f.as_raw_fd(), 512, sg, 8, 0).unwrap();
        r.submit().unwrap();
        let mut done = reap_all(&mut r);
        let (ud, res, buf) = done.pop().unwrap();
        assert_eq!((ud, res), (8, Ok(10000)));
        assert_eq!(buf.unwrap().to_vec(), data);
    }

    #[test]
    fn read_past_eof_is_short() {
        let Some(mut r) = ring_or_skip(2) else { return };
        let t = tmp();
        let f = &t.file;
        f.set_len(1000).unwrap();
        r.submit_readv(f.as_raw_fd(), 0, SgList::zeroed(4096), 1, 0)
            .unwrap();
        r.submit().unwrap();
        let done = reap_all(&mut r);
        assert_eq!(done[0].1, Ok(1000));
    }

    #[test]
    fn full_ring_hands_buffer_back() {
        let Some(mut r) = ring_or_skip(2) else { return };
        let t = tmp();
        let f = &t.file;
        for i in 0..2 {
            r.submit_readv(f.as_raw_fd(), 0, SgList::zeroed(512), i, 0)
                .unwrap();
        }
        assert!(!r.has_room());
        let err = r
            .submit_readv(f.as_raw_fd(), 0, IoBuf::new(512).into(), 9, 0)
            .unwrap_err();
        assert_eq!(err.0.map(|b| b.len()), Some(512));
        r.submit().unwrap();
        assert_eq!(reap_all(&mut r).len(), 2);
        assert!(r.has_room());
    }

    #[test]
    fn write_to_read_only_fd_fails_with_ebadf() {
        let Some(mut r) = ring_or_skip(2) else { return };
        let t = tmp();
        let ro = File::open(&t.path).unwrap();
        r.submit_writev(ro.as_raw_fd(), 0, SgList::zeroed(512), 3, 0)
            .unwrap();
        r.submit().unwrap();
        let done = reap_all(&mut r);
        assert_eq!(done[0].1, Err(libc::EBADF));
        assert_eq!(done[0].2.as_ref().map(|b| b.len()), Some(512));
    }

    #[test]
    fn eventfd_signals_and_reap_clears_it() {
        let Some(mut r) = ring_or_skip(2) else { return };
        let t = tmp();
        let f = &t.file;
        r.submit_fsync(f.as_raw_fd(), true, 5).unwrap();
        r.submit().unwrap();
        let mut pfd = libc::pollfd {
            fd: r.eventfd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd on the stack.
        let n = unsafe { libc::poll(&mut pfd, 1, 5000) };
        assert_eq!(n, 1, "eventfd never became readable");
        let mut got = Vec::new();
        r.reap(|u, res, _| got.push((u, res)));
        assert_eq!(got, vec![(5, Ok(0))]);
        pfd.revents = 0;
        // SAFETY: as above.
        let n = unsafe { libc::poll(&mut pfd, 1, 0) };
        assert_eq!(n, 0, "eventfd still readable after reap");
    }

    /// The reactor's way of sleeping: in another ring, on a poll of the
    /// eventfd. A completion that needs task work (an fsync goes through
    /// io-wq) must still wake it, COOP_TASKRUN or not.
    #[test]
    fn eventfd_wakes_a_sleeper_in_another_ring() {
        let Some(mut r) = ring_or_skip(2) else { return };
        let t = tmp();
        std::os::unix::fs::FileExt::write_all_at(&t.file, &[1u8; 4096], 0).unwrap();
        let mut sleeper = IoUring::new(4).unwrap();
        let poll = opcode::PollAdd::new(types::Fd(r.eventfd()), libc::POLLIN as u32)
            .build()
            .user_data(1);
        let ts = types::Timespec::new().sec(5);
        let timeout = opcode::Timeout::new(&ts).build().user_data(2);
        // SAFETY: `ts` outlives the wait below, which returns only after a
        // completion; the poll SQE holds no pointers. The timeout may still
        // be armed when `ts` goes out of scope only if the poll won, and the
        // ring is dropped (cancelling it) in the same scope.
        unsafe {
            sleeper.submission().push(&poll).unwrap();
            sleeper.submission().push(&timeout).unwrap();
        }
        r.submit_fsync(t.file.as_raw_fd(), true, 7).unwrap();
        r.submit().unwrap();
        sleeper.submit_and_wait(1).unwrap();
        let first = sleeper.completion().next().map(|c| c.user_data());
        assert_eq!(first, Some(1), "the eventfd did not wake the sleeping ring");
        let mut got = Vec::new();
        r.reap(|u, res, _| got.push((u, res)));
        assert_eq!(got, vec![(7, Ok(0))]);
    }

    #[test]
    fn punch_hole_and_seek() {
        let Some(mut r) = ring_or_skip(2) else { return };
        let t = tmp();
        let f = &t.file;
        let data = vec![0xa5u8; 1 << 20];
        std::os::unix::fs::FileExt::write_all_at(f, &data, 0).unwrap();
        let mode = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
        r.submit_fallocate(f.as_raw_fd(), mode, 256 << 10, 256 << 10, 1)
            .unwrap();
        r.submit().unwrap();
        let done = reap_all(&mut r);
        match done[0].1 {
            Ok(_) => {}
            Err(e) if e == libc::EOPNOTSUPP => {
                eprintln!("skipping: filesystem cannot punch holes");
                return;
            }
            Err(e) => panic!("fallocate failed: {e}"),
        }
        assert_eq!(seek_hole(f.as_fd(), 0).unwrap(), Some(256 << 10));
        assert_eq!(seek_data(f.as_fd(), 256 << 10).unwrap(), Some(512 << 10));
        assert_eq!(seek_hole(f.as_fd(), 512 << 10).unwrap(), Some(1 << 20));
        assert_eq!(seek_data(f.as_fd(), 1 << 20).unwrap(), None);
    }

    #[test]
    fn block_ioctls_fail_on_a_regular_file() {
        let t = tmp();
        let f = &t.file;
        assert!(blk_size_bytes(f.as_fd()).is_err());
        assert!(blk_logical_block_size(f.as_fd()).is_err());
    }
}
