//! Fault injection: a wrapper around any backend that fails or delays chosen
//! operations, the way SCST's debug fault injection does, so the sense data a
//! backend failure produces can be tested end to end.
//!
//! It lives in `ferrite-nullio` because it stores nothing itself and is a
//! test instrument like `mem` mode; it wraps fileio and blockio as well as
//! nullio. `ferrited` wraps a device's backend in a [`FaultBackend`] when
//! its configuration carries a `fault` section.
//!
//! A [`FaultRule`] selects operations by kind (read; write, which includes
//! unmap and write-zeroes; flush) and by an LBA range, may let the first
//! `after` matching operations through, fires at most `count` times, and
//! either fails the operation with a [`BlockError`] without touching the
//! backend (EIO, ENOSPC, offline) or delays it. The first firing rule with an
//! error decides the error; delays of firing rules add up.
//!
//! Injected errors complete in the `poll` after `submit` (or after their
//! delay), never inline; their buffers come back in the completion as with
//! any backend. While an operation waits for its delay the queue reports no
//! notify fd, so the reactor keeps polling (a test mode; nothing sleeps).

use std::collections::VecDeque;
use std::os::fd::RawFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use ferrite_core::backend::{
    Backend, BackendError, BackendQueue, BlockDone, BlockError, BlockOp, Busy, Caps, Geometry,
};

/// Which operations a rule applies to.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FaultOps {
    pub read: bool,
    /// Writes, unmaps and write-zeroes.
    pub write: bool,
    pub flush: bool,
}

impl FaultOps {
    /// Every kind of operation.
    pub const ANY: FaultOps = FaultOps {
        read: true,
        write: true,
        flush: true,
    };
    pub const READ: FaultOps = FaultOps {
        read: true,
        write: false,
        flush: false,
    };
    pub const WRITE: FaultOps = FaultOps {
        read: false,
        write: true,
        flush: false,
    };
    pub const FLUSH: FaultOps = FaultOps {
        read: false,
        write: false,
        flush: true,
    };
}

/// One fault.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FaultRule {
    pub ops: FaultOps,
    /// First logical block of the range.
    pub lba: u64,
    /// Blocks in the range; `None`: to the end of the device. Flushes have
    /// no range and match on `ops` alone.
    pub blocks: Option<u64>,
    /// The error to complete a matching operation with (the backend is not
    /// called); `None`: the operation runs, maybe delayed.
    pub error: Option<BlockError>,
    /// How long a matching operation waits before it runs (or fails).
    pub delay: Duration,
    /// Matching operations let through before the rule fires.
    pub after: u64,
    /// How many times the rule fires; `None`: every time.
    pub count: Option<u64>,
}

impl FaultRule {
    /// A rule that fails `ops` in `[lba, lba+blocks)` with `error`, always.
    pub fn error(ops: FaultOps, lba: u64, blocks: Option<u64>, error: BlockError) -> FaultRule {
        FaultRule {
            ops,
            lba,
            blocks,
            error: Some(error),
            delay: Duration::ZERO,
            after: 0,
            count: None,
        }
    }

    /// A rule that delays `ops` in `[lba, lba+blocks)` by `delay`, always.
    pub fn delay(ops: FaultOps, lba: u64, blocks: Option<u64>, delay: Duration) -> FaultRule {
        FaultRule {
            ops,
            lba,
            blocks,
            error: None,
            delay,
            after: 0,
            count: None,
        }
    }
}

/// A rule and how many operations it has matched (shared by every queue).
#[derive(Debug)]
struct Armed {
    rule: FaultRule,
    matched: AtomicU64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Read,
    Write,
    Flush,
}

/// The wrapped operation's kind and byte range.
fn classify(op: &BlockOp) -> (Kind, Option<(u64, u64)>) {
    match op {
        BlockOp::Read { offset, buf } => (Kind::Read, Some((*offset, buf.len() as u64))),
        BlockOp::ReadPipe { offset, len, .. } => (Kind::Read, Some((*offset, *len as u64))),
        BlockOp::Write { offset, buf, .. } => (Kind::Write, Some((*offset, buf.len() as u64))),
        BlockOp::Unmap { offset, len } | BlockOp::WriteZeroes { offset, len } => {
            (Kind::Write, Some((*offset, *len)))
        }
        BlockOp::Flush => (Kind::Flush, None),
    }
}

impl Armed {
    fn applies(&self, kind: Kind, range: Option<(u64, u64)>, bs: u64) -> bool {
        let r = &self.rule;
        let kind_ok = match kind {
            Kind::Read => r.ops.read,
            Kind::Write => r.ops.write,
            Kind::Flush => r.ops.flush,
        };
        if !kind_ok {
            return false;
        }
        let Some((off, len)) = range else {
            return true;
        };
        let start = r.lba.saturating_mul(bs);
        let end = r
            .blocks
            .map_or(u64::MAX, |b| r.lba.saturating_add(b).saturating_mul(bs));
        let op_end = off.saturating_add(len.max(1));
        off < end && start < op_end
    }

    /// Counts a matching operation; whether the rule fires for it.
    fn fires(&self) -> bool {
        let n = self.matched.fetch_add(1, Ordering::Relaxed);
        let r = &self.rule;
        n >= r.after && r.count.is_none_or(|c| n - r.after < c)
    }
}

/// What the rules decided for one operation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Verdict {
    error: Option<BlockError>,
    delay: Duration,
}

fn judge(rules: &[Armed], op: &BlockOp, bs: u64) -> Verdict {
    let (kind, range) = classify(op);
    let mut v = Verdict::default();
    for a in rules {
        if a.applies(kind, range, bs) && a.fires() {
            if v.error.is_none() {
                v.error = a.rule.error;
            }
            v.delay = v.delay.saturating_add(a.rule.delay);
        }
    }
    v
}

/// A backend whose operations go through fault rules first.
pub struct FaultBackend {
    inner: Arc<dyn Backend>,
    rules: Arc<[Armed]>,
}

impl std::fmt::Debug for FaultBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FaultBackend")
            .field("rules", &self.rules)
            .finish_non_exhaustive()
    }
}

impl FaultBackend {
    /// Wraps `inner` with `rules`.
    pub fn new(inner: Arc<dyn Backend>, rules: Vec<FaultRule>) -> FaultBackend {
        tracing::warn!(
            rules = rules.len(),
            "fault injection enabled on a device: chosen operations will fail or be delayed"
        );
        FaultBackend {
            inner,
            rules: rules
                .into_iter()
                .map(|rule| Armed {
                    rule,
                    matched: AtomicU64::new(0),
                })
                .collect(),
        }
    }

    /// How many operations rule `i` has matched so far.
    pub fn matched(&self, i: usize) -> Option<u64> {
        self.rules.get(i).map(|a| a.matched.load(Ordering::Relaxed))
    }
}

impl Backend for FaultBackend {
    fn geometry(&self) -> Geometry {
        self.inner.geometry()
    }

    fn caps(&self) -> Caps {
        self.inner.caps()
    }

    fn open_queue(&self, depth: u32) -> Result<Box<dyn BackendQueue>, BackendError> {
        let inner = self.inner.open_queue(depth)?;
        Ok(Box::new(FaultQueue {
            inner,
            rules: self.rules.clone(),
            inner_backend: self.inner.clone(),
            depth: depth as usize,
            failed: VecDeque::new(),
            waiting: VecDeque::new(),
        }))
    }

    fn resync(&self) -> Result<Geometry, BackendError> {
        self.inner.resync()
    }

    fn mapping(&self, offset: u64, len: u64) -> Option<(bool, u64)> {
        self.inner.mapping(offset, len)
    }
}

/// One core's queue: the wrapped queue plus the operations held back.
struct FaultQueue {
    inner: Box<dyn BackendQueue>,
    inner_backend: Arc<dyn Backend>,
    rules: Arc<[Armed]>,
    depth: usize,
    /// Injected failures, returned by a poll once their time has come.
    failed: VecDeque<(Instant, BlockDone)>,
    /// Delayed operations, submitted to the wrapped queue once due.
    waiting: VecDeque<(Instant, u64, BlockOp)>,
}

/// The buffer of a read or write (an injected failure returns it).
fn take_buf(
    op: BlockOp,
) -> (
    Option<ferrite_reactor::buf::SgList>,
    Option<ferrite_reactor::pipe::Pipe>,
) {
    match op {
        BlockOp::Read { buf, .. } | BlockOp::Write { buf, .. } => (Some(buf), None),
        BlockOp::ReadPipe { pipe, .. } => (None, Some(pipe)),
        _ => (None, None),
    }
}

impl BackendQueue for FaultQueue {
    fn submit(&mut self, tag: u64, op: BlockOp) -> Result<(), Busy<BlockOp>> {
        if self.in_flight() >= self.depth {
            return Err(Busy(op));
        }
        let bs = self.inner_backend.geometry().block_size as u64;
        let v = judge(&self.rules, &op, bs);
        let due = Instant::now() + v.delay;
        if let Some(e) = v.error {
            let (buf, pipe) = take_buf(op);
            self.failed.push_back((
                due,
                BlockDone {
                    tag,
                    result: Err(e),
                    buf,
                    pipe,
                },
            ));
            return Ok(());
        }
        if !v.delay.is_zero() {
            self.waiting.push_back((due, tag, op));
            return Ok(());
        }
        // A full wrapped queue: hold the operation here (it was counted
        // against the rules already; handing it back would count it twice).
        if let Err(Busy(op)) = self.inner.submit(tag, op) {
            self.waiting.push_back((due, tag, op));
        }
        Ok(())
    }

    fn poll(&mut self, out: &mut Vec<BlockDone>) {
        let now = Instant::now();
        // Delays differ per rule: scan rather than assume FIFO order.
        let mut i = 0;
        while i < self.waiting.len() {
            if self.waiting[i].0 > now {
                i += 1;
                continue;
            }
            let Some((due, tag, op)) = self.waiting.remove(i) else {
                break;
            };
            if let Err(Busy(op)) = self.inner.submit(tag, op) {
                // The wrapped queue is full: retry at the next poll.
                self.waiting.insert(i, (due, tag, op));
                break;
            }
        }
        self.inner.poll(out);
        let mut i = 0;
        while i < self.failed.len() {
            if self.failed[i].0 > now {
                i += 1;
                continue;
            }
            if let Some((_, d)) = self.failed.remove(i) {
                out.push(d);
            }
        }
    }

    fn in_flight(&self) -> usize {
        self.inner.in_flight() + self.failed.len() + self.waiting.len()
    }

    /// The wrapped queue's fd while nothing is held back here; `None` (keep
    /// polling) while an operation waits for its time.
    fn notify_fd(&self) -> Option<RawFd> {
        if self.failed.is_empty() && self.waiting.is_empty() {
            self.inner.notify_fd()
        } else {
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::NullBackend;
    use ferrite_reactor::buf::SgList;

    fn wrap(rules: Vec<FaultRule>) -> FaultBackend {
        FaultBackend::new(Arc::new(NullBackend::mem(1 << 20, 512).unwrap()), rules)
    }

    fn run(q: &mut dyn BackendQueue, op: BlockOp) -> BlockDone {
        q.submit(1, op).unwrap();
        let mut out = Vec::new();
        while out.is_empty() {
            q.poll(&mut out);
            std::thread::yield_now();
        }
        assert_eq!(q.in_flight(), 0);
        out.pop().unwrap()
    }

    fn read(lba: u64, blocks: usize) -> BlockOp {
        BlockOp::Read {
            offset: lba * 512,
            buf: SgList::zeroed(blocks * 512),
        }
    }

    fn write(lba: u64, blocks: usize, fill: u8) -> BlockOp {
        let mut buf = SgList::zeroed(blocks * 512);
        buf.copy_in(0, &vec![fill; blocks * 512]);
        BlockOp::Write {
            offset: lba * 512,
            buf,
            fua: false,
        }
    }

    #[test]
    fn read_error_in_range_only() {
        let b = wrap(vec![FaultRule::error(
            FaultOps::READ,
            100,
            Some(8),
            BlockError::Io,
        )]);
        let mut q = b.open_queue(8).unwrap();
        assert_eq!(run(&mut *q, read(92, 8)).result, Ok(()), "ends before 100");
        let d = run(&mut *q, read(95, 8));
        assert_eq!(d.result, Err(BlockError::Io), "overlaps 100");
        assert_eq!(d.buf.map(|b| b.len()), Some(4096), "buffer comes back");
        assert_eq!(run(&mut *q, read(107, 1)).result, Err(BlockError::Io));
        assert_eq!(run(&mut *q, read(108, 1)).result, Ok(()), "past the range");
        assert_eq!(run(&mut *q, write(100, 1, 1)).result, Ok(()), "writes pass");
        assert_eq!(run(&mut *q, BlockOp::Flush).result, Ok(()));
    }

    #[test]
    fn injected_write_error_leaves_the_medium_alone() {
        let b = wrap(vec![FaultRule::error(
            FaultOps::WRITE,
            10,
            Some(1),
            BlockError::NoSpace,
        )]);
        let mut q = b.open_queue(8).unwrap();
        assert_eq!(
            run(&mut *q, write(9, 3, 7)).result,
            Err(BlockError::NoSpace)
        );
        let d = run(&mut *q, read(9, 3));
        assert!(d.buf.unwrap().to_vec().iter().all(|&x| x == 0));
        assert_eq!(run(&mut *q, write(11, 1, 7)).result, Ok(()));
        let unmap = BlockOp::Unmap {
            offset: 0,
            len: 1 << 20,
        };
        assert_eq!(run(&mut *q, unmap).result, Err(BlockError::NoSpace));
    }

    #[test]
    fn submit_never_completes_inline() {
        let b = wrap(vec![FaultRule::error(
            FaultOps::ANY,
            0,
            None,
            BlockError::Offline,
        )]);
        let mut q = b.open_queue(2).unwrap();
        q.submit(5, BlockOp::Flush).unwrap();
        q.submit(6, read(0, 1)).unwrap();
        assert_eq!(q.in_flight(), 2);
        assert!(matches!(
            q.submit(7, BlockOp::Flush),
            Err(Busy(BlockOp::Flush))
        ));
        let mut out = Vec::new();
        q.poll(&mut out);
        let tags: Vec<u64> = out.iter().map(|d| d.tag).collect();
        assert_eq!(tags, vec![5, 6]);
        assert!(out.iter().all(|d| d.result == Err(BlockError::Offline)));
    }

    #[test]
    fn after_and_count_bound_the_rule() {
        let mut r = FaultRule::error(FaultOps::WRITE, 0, None, BlockError::Io);
        r.after = 2;
        r.count = Some(1);
        let b = wrap(vec![r]);
        let mut q = b.open_queue(4).unwrap();
        let results: Vec<_> = (0..5)
            .map(|i| run(&mut *q, write(i, 1, 1)).result)
            .collect();
        assert_eq!(
            results,
            vec![Ok(()), Ok(()), Err(BlockError::Io), Ok(()), Ok(())]
        );
        assert_eq!(b.matched(0), Some(5));
        assert_eq!(b.matched(1), None);
    }

    #[test]
    fn delay_holds_the_operation_back_at_least_that_long() {
        let b = wrap(vec![FaultRule::delay(
            FaultOps::WRITE,
            0,
            Some(1),
            Duration::from_millis(30),
        )]);
        let mut q = b.open_queue(4).unwrap();
        let t = Instant::now();
        assert_eq!(run(&mut *q, write(0, 1, 9)).result, Ok(()));
        assert!(t.elapsed() >= Duration::from_millis(30));
        assert!(q.notify_fd().is_none() || q.in_flight() == 0);
        let d = run(&mut *q, read(0, 1));
        assert!(
            d.buf.unwrap().to_vec().iter().all(|&x| x == 9),
            "ran after the delay"
        );
    }

    #[test]
    fn first_error_wins_and_geometry_passes_through() {
        let b = wrap(vec![
            FaultRule::error(FaultOps::READ, 0, Some(4), BlockError::Io),
            FaultRule::error(FaultOps::ANY, 0, None, BlockError::Offline),
        ]);
        assert_eq!(b.geometry().num_blocks, 2048);
        assert!(b.caps().unmap);
        let mut q = b.open_queue(4).unwrap();
        assert_eq!(run(&mut *q, read(0, 1)).result, Err(BlockError::Io));
        assert_eq!(run(&mut *q, read(8, 1)).result, Err(BlockError::Offline));
    }
}
