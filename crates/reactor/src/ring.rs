//! The reactor: one thread per core, one io_uring per reactor, run to
//! completion, poll for a while before sleeping.
//!
//! A [`Worker`] is what runs on a reactor (the daemon's per-core part: the
//! core's shard, the connections living on this core). The worker submits
//! socket operations through [`Ctx`], which owns every buffer an operation
//! uses until its completion comes back in a [`Completion`]: that ownership is
//! what makes the `unsafe` ring submissions sound.

use std::collections::VecDeque;
use std::io;
use std::os::fd::{FromRawFd, OwnedFd, RawFd};
use std::sync::Arc;
use std::time::{Duration, Instant};

use io_uring::{IoUring, opcode, squeue, types};
use slab::Slab;

use crate::buf::SgList;
use crate::mailbox::MailboxRx;
use crate::pipe::Pipe;

/// Most iovecs one send carries (Linux IOV_MAX is 1024).
const MAX_IOVECS: usize = 256;
/// IORING_RECVSEND_POLL_FIRST (linux/io_uring.h): arm the poll before trying.
const RECVSEND_POLL_FIRST: u16 = 1;
/// user_data reserved for the mailbox wake-up poll.
const WAKE_TOKEN: u64 = u64::MAX;
/// user_data of cancellation requests (their own completions are ignored).
const CANCEL_TOKEN: u64 = u64::MAX - 1;

/// The scatter-gather list behind a [`TxSeg::Data`]: shared when several
/// PDUs each send a window of it, owned when one PDU sends it (no
/// allocation for the sharing).
#[derive(Debug)]
pub enum SgHold {
    Shared(Arc<SgList>),
    Owned(SgList),
}

impl std::ops::Deref for SgHold {
    type Target = SgList;
    fn deref(&self) -> &SgList {
        match self {
            SgHold::Shared(sg) => sg,
            SgHold::Owned(sg) => sg,
        }
    }
}

/// One piece of bytes to send: owned header bytes, or a window of a
/// scatter-gather list (response data sent straight from the backend's
/// buffer).
#[derive(Debug)]
pub enum TxSeg {
    Bytes(Vec<u8>),
    /// Up to [`INLINE_MAX`] bytes held in the segment itself (PDU headers,
    /// pads and digests): no allocation per PDU.
    Inline {
        buf: [u8; INLINE_MAX],
        len: u8,
    },
    Data {
        sg: SgHold,
        offset: usize,
        len: usize,
    },
    /// The next `len` bytes of a pipe of file pages (response data spliced
    /// from the page cache): sent with a splice of their own, no copy. One
    /// pipe may back several segments, each taking the next bytes in
    /// queue order.
    Pipe {
        pipe: PipeHold,
        len: usize,
    },
}

/// A pipe shared by the segments that drain it in turn, all on the
/// reactor thread that filled it: shared without a lock.
pub type PipeHold = std::rc::Rc<std::cell::RefCell<Pipe>>;

/// Most bytes a [`TxSeg::Inline`] holds: a basic header segment with a
/// header digest.
pub const INLINE_MAX: usize = 56;

impl TxSeg {
    /// A segment holding a copy of `bytes`: inline when they fit.
    pub fn copy_of(bytes: &[u8]) -> TxSeg {
        if bytes.len() <= INLINE_MAX {
            let mut buf = [0u8; INLINE_MAX];
            buf[..bytes.len()].copy_from_slice(bytes);
            TxSeg::Inline {
                buf,
                len: bytes.len() as u8,
            }
        } else {
            TxSeg::Bytes(bytes.to_vec())
        }
    }

    /// The bytes of an owned segment (`None` for a window of an SgList).
    pub fn bytes(&self) -> Option<&[u8]> {
        match self {
            TxSeg::Bytes(b) => Some(b),
            TxSeg::Inline { buf, len } => Some(&buf[..*len as usize]),
            TxSeg::Data { .. } | TxSeg::Pipe { .. } => None,
        }
    }

    /// Bytes in this segment.
    pub fn len(&self) -> usize {
        match self {
            TxSeg::Bytes(b) => b.len(),
            TxSeg::Inline { len, .. } => *len as usize,
            TxSeg::Data { len, .. } | TxSeg::Pipe { len, .. } => *len,
        }
    }

    /// True when the segment carries no bytes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Drops the first `n` bytes of `segs` (after a partial send).
pub fn advance(segs: &mut VecDeque<TxSeg>, mut n: usize) {
    // Whole segments are dropped where they lie (a send usually takes them
    // all), not moved out one by one.
    let mut whole = 0;
    for s in segs.iter() {
        let l = s.len();
        if n < l {
            break;
        }
        n -= l;
        whole += 1;
    }
    if whole == segs.len() {
        segs.clear();
        return;
    }
    segs.drain(..whole);
    if n > 0
        && let Some(front) = segs.front_mut()
    {
        match front {
            TxSeg::Bytes(b) => {
                b.drain(..n);
            }
            TxSeg::Inline { buf, len } => {
                buf.copy_within(n..*len as usize, 0);
                *len -= n as u8;
            }
            TxSeg::Data { offset, len, .. } => {
                *offset += n;
                *len -= n;
            }
            TxSeg::Pipe { len, .. } => *len -= n,
        }
    }
}

/// A finished operation, with everything it owned handed back.
#[derive(Debug)]
pub enum Completion {
    /// `n` bytes were received into `buf[start..start+n]`; `Ok(0)` is EOF.
    Recv {
        token: u64,
        result: io::Result<usize>,
        buf: Vec<u8>,
        start: usize,
    },
    /// `n` bytes of `segs` were sent (maybe fewer than all of them).
    Send {
        token: u64,
        result: io::Result<usize>,
        segs: VecDeque<TxSeg>,
    },
    /// A connection was accepted.
    Accept {
        token: u64,
        result: io::Result<OwnedFd>,
    },
    /// The polled fd became readable.
    Readable { token: u64, result: io::Result<()> },
}

enum Op {
    Recv {
        token: u64,
        buf: Vec<u8>,
        start: usize,
    },
    Send {
        token: u64,
        segs: VecDeque<TxSeg>,
        // Read by the kernel through the pointer in the SQE; kept alive here.
        iovecs: Vec<libc::iovec>,
    },
    /// A splice from the pipe of `segs`' first segment into the socket.
    Splice {
        token: u64,
        segs: VecDeque<TxSeg>,
    },
    Accept {
        token: u64,
    },
    Poll {
        token: u64,
    },
}

/// Reactor settings.
#[derive(Clone, Copy, Debug)]
pub struct ReactorConfig {
    /// Submission queue entries.
    pub entries: u32,
    /// Keep polling this long after the last piece of work before sleeping.
    pub poll: Duration,
    /// Keep polling this long after the last piece of work while the worker
    /// says it is latency-bound ([`Worker::latency_bound`]): its peers wait
    /// for each answer before they ask again, so every sleep would cost them
    /// a wake-up per request.
    pub latency_poll: Duration,
    /// Pin the thread to CPU `core`.
    pub pin: bool,
}

impl Default for ReactorConfig {
    fn default() -> Self {
        ReactorConfig {
            entries: 1024,
            poll: Duration::from_micros(0),
            latency_poll: Duration::from_micros(0),
            pin: false,
        }
    }
}

/// The submission side of a reactor, handed to the worker.
pub struct Ctx {
    ring: IoUring,
    ops: Slab<Op>,
    /// SQEs that did not fit; pushed after the next submit.
    backlog: Vec<squeue::Entry>,
    unsubmitted: usize,
    core: usize,
    now: Instant,
    /// iovec arrays of finished sends, reused by the next ones.
    iov_spare: Vec<Vec<libc::iovec>>,
}

impl Ctx {
    /// The core this reactor runs on.
    pub fn core(&self) -> usize {
        self.core
    }

    /// The time at the top of this loop iteration.
    pub fn now(&self) -> Instant {
        self.now
    }

    /// Operations in flight.
    pub fn in_flight(&self) -> usize {
        self.ops.len()
    }

    fn push(&mut self, entry: squeue::Entry) {
        // SAFETY: every pointer in `entry` points into memory owned by the
        // matching `Op` in `self.ops` (or into the Op's boxed iovecs), which is
        // removed only when the completion for this user_data is reaped, so the
        // memory outlives the kernel's use of it.
        let pushed = unsafe { self.ring.submission().push(&entry) };
        if pushed.is_err() {
            self.backlog.push(entry);
        } else {
            self.unsubmitted += 1;
        }
    }

    /// Receives into `buf[start..]` (buf's length is its usable size).
    pub fn recv(&mut self, fd: RawFd, buf: Vec<u8>, start: usize, token: u64) {
        self.recv_with(fd, buf, start, token, false);
    }

    /// As [`Ctx::recv`], for a socket just read empty: the kernel waits for
    /// it to become readable before trying, instead of trying once in vain.
    pub fn recv_drained(&mut self, fd: RawFd, buf: Vec<u8>, start: usize, token: u64) {
        self.recv_with(fd, buf, start, token, true);
    }

    fn recv_with(
        &mut self,
        fd: RawFd,
        mut buf: Vec<u8>,
        start: usize,
        token: u64,
        poll_first: bool,
    ) {
        let start = start.min(buf.len());
        let len = (buf.len() - start).min(u32::MAX as usize) as u32;
        // SAFETY: start <= buf.len(), so the pointer stays within the allocation.
        let ptr = unsafe { buf.as_mut_ptr().add(start) };
        // The Vec's heap allocation does not move when the Vec is moved into the slab.
        let key = self.ops.insert(Op::Recv { token, buf, start });
        let ioprio = if poll_first { RECVSEND_POLL_FIRST } else { 0 };
        let e = opcode::Recv::new(types::Fd(fd), ptr, len)
            .ioprio(ioprio)
            .build()
            .user_data(key as u64);
        self.push(e);
    }

    /// Sends `segs` with one writev (at most [`MAX_IOVECS`] pieces), up to
    /// the first pipe segment; a pipe segment at the front is sent alone,
    /// spliced from its pipe into the socket.
    pub fn send(&mut self, fd: RawFd, segs: VecDeque<TxSeg>, token: u64) {
        if let Some(TxSeg::Pipe { pipe, len }) = segs.front() {
            let pfd = pipe.try_borrow().map_or(-1, |p| p.read_fd());
            let len = u32::try_from(*len).unwrap_or(u32::MAX);
            let mut flags = libc::SPLICE_F_MOVE;
            if segs.len() > 1 {
                flags |= libc::SPLICE_F_MORE;
            }
            let key = self.ops.insert(Op::Splice { token, segs });
            let e = opcode::Splice::new(types::Fd(pfd), -1, types::Fd(fd), -1, len)
                .flags(flags)
                .build()
                .user_data(key as u64);
            self.push(e);
            return;
        }
        let mut iov = self.iov_spare.pop().unwrap_or_default();
        iov.clear();
        'outer: for s in &segs {
            match s {
                TxSeg::Pipe { .. } => break,
                TxSeg::Bytes(_) | TxSeg::Inline { .. } => {
                    if iov.len() == MAX_IOVECS {
                        break;
                    }
                    // The bytes live in the Vec's heap buffer or in the
                    // deque's: neither moves while the deque sits unchanged
                    // in the Op.
                    let b = s.bytes().unwrap_or(&[]);
                    iov.push(libc::iovec {
                        iov_base: b.as_ptr() as *mut libc::c_void,
                        iov_len: b.len(),
                    });
                }
                TxSeg::Data { sg, offset, len } => {
                    for sl in sg.slices(*offset, *len) {
                        if iov.len() == MAX_IOVECS {
                            break 'outer;
                        }
                        iov.push(libc::iovec {
                            iov_base: sl.as_ptr() as *mut libc::c_void,
                            iov_len: sl.len(),
                        });
                    }
                }
            }
        }
        // The Vec's heap buffer does not move when the Vec moves into the Op.
        let iovecs = iov;
        let (ptr, n) = (iovecs.as_ptr(), iovecs.len() as u32);
        let key = self.ops.insert(Op::Send {
            token,
            segs,
            iovecs,
        });
        let e = opcode::Writev::new(types::Fd(fd), ptr, n)
            .build()
            .user_data(key as u64);
        self.push(e);
    }

    /// Accepts one connection on a listening socket.
    pub fn accept(&mut self, fd: RawFd, token: u64) {
        let key = self.ops.insert(Op::Accept { token });
        let e = opcode::Accept::new(types::Fd(fd), std::ptr::null_mut(), std::ptr::null_mut())
            .flags(libc::SOCK_CLOEXEC)
            .build()
            .user_data(key as u64);
        self.push(e);
    }

    /// Completes once when `fd` is readable.
    pub fn poll_readable(&mut self, fd: RawFd, token: u64) {
        let key = self.ops.insert(Op::Poll { token });
        let e = opcode::PollAdd::new(types::Fd(fd), libc::POLLIN as u32)
            .build()
            .user_data(key as u64);
        self.push(e);
    }

    /// Asks the kernel to cancel every operation in flight whose token
    /// satisfies `pred`; each completes (with ECANCELED if it had not finished).
    pub fn cancel(&mut self, pred: impl Fn(u64) -> bool) {
        let keys: Vec<u64> = self
            .ops
            .iter()
            .filter(|(_, op)| {
                let token = match op {
                    Op::Recv { token, .. }
                    | Op::Send { token, .. }
                    | Op::Splice { token, .. }
                    | Op::Accept { token }
                    | Op::Poll { token } => *token,
                };
                pred(token)
            })
            .map(|(k, _)| k as u64)
            .collect();
        for k in keys {
            let e = opcode::AsyncCancel::new(k).build().user_data(CANCEL_TOKEN);
            self.push(e);
        }
    }

    fn submit(&mut self, wait: Option<Duration>) -> io::Result<()> {
        let res = match wait {
            None => self.ring.submit(),
            Some(d) => {
                let ts = types::Timespec::from(d);
                let args = types::SubmitArgs::new().timespec(&ts);
                self.ring.submitter().submit_with_args(1, &args)
            }
        };
        self.unsubmitted = 0;
        match res {
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::ETIME) | Some(libc::EINTR) | Some(libc::EBUSY)
                ) => {}
            Err(e) => return Err(e),
        }
        while let Some(e) = self.backlog.pop() {
            // SAFETY: as in `push`: the memory behind `e` is owned by its Op.
            if unsafe { self.ring.submission().push(&e) }.is_err() {
                self.backlog.push(e);
                break;
            }
            self.unsubmitted += 1;
        }
        Ok(())
    }
}

/// What runs on a reactor.
pub trait Worker {
    /// Messages from other cores.
    type Msg: Send + 'static;
    /// An operation submitted through [`Ctx`] finished.
    fn on_completion(&mut self, ctx: &mut Ctx, c: Completion);
    /// A message arrived.
    fn on_message(&mut self, ctx: &mut Ctx, msg: Self::Msg);
    /// Does non-I/O work (core shard, backends, timers); true if it progressed.
    fn poll(&mut self, ctx: &mut Ctx) -> bool;
    /// The earliest timer, so the reactor does not sleep past it.
    fn next_deadline(&self) -> Option<Instant>;
    /// True while there is work that no fd will announce (e.g. a backend
    /// queue without an eventfd): the reactor keeps polling.
    fn wants_spin(&self) -> bool;
    /// True while the work on this reactor is latency-bound: the peers keep
    /// so few requests outstanding that each one would otherwise wait for
    /// this thread to wake up. The reactor then polls for
    /// [`ReactorConfig::latency_poll`] before sleeping.
    fn latency_bound(&self, _now: Instant) -> bool {
        false
    }
    /// Fds whose readability should wake the reactor from sleep (backend
    /// eventfds). Called before each sleep.
    fn wake_fds(&self, out: &mut Vec<RawFd>);
    /// False once the worker is done; the reactor then returns.
    fn running(&self) -> bool;
}

/// Runs `worker` on the calling thread until it stops running.
pub fn run<W: Worker>(
    core: usize,
    cfg: ReactorConfig,
    mailbox: MailboxRx<W::Msg>,
    mut worker: W,
) -> io::Result<W> {
    if cfg.pin {
        pin_to_cpu(core);
    }
    // Completions are posted when this thread next asks for them (every
    // submit that finds the task-run flag set, every sleep) instead of
    // interrupting it with an IPI while it runs; the flag tells it when some
    // are waiting. Only this thread ever submits to the ring.
    let entries = cfg.entries.max(8);
    let ring = IoUring::builder()
        .setup_single_issuer()
        .setup_defer_taskrun()
        .setup_taskrun_flag()
        .build(entries)
        .or_else(|_| {
            IoUring::builder()
                .setup_coop_taskrun()
                .setup_taskrun_flag()
                .build(entries)
        })
        .or_else(|_| IoUring::new(entries))?;
    let mut ctx = Ctx {
        ring,
        ops: Slab::with_capacity(cfg.entries as usize),
        backlog: Vec::new(),
        unsubmitted: 0,
        core,
        now: Instant::now(),
        iov_spare: Vec::new(),
    };
    let mut cqes: Vec<(u64, i32)> = Vec::with_capacity(cfg.entries as usize);
    let mut wake_fds: Vec<RawFd> = Vec::new();
    let mut wake_armed = false;
    // fds with a wake-up poll armed: token = fd (only used while asleep)
    let mut armed: Vec<RawFd> = Vec::new();
    let mut last_work = Instant::now();

    while worker.running() {
        ctx.now = Instant::now();
        let mut progressed = false;

        cqes.clear();
        cqes.extend(ctx.ring.completion().map(|c| (c.user_data(), c.result())));
        for &(ud, res) in &cqes {
            progressed = true;
            if ud == WAKE_TOKEN {
                wake_armed = false;
                mailbox.drain_wake();
                continue;
            }
            if ud == CANCEL_TOKEN {
                continue;
            }
            let key = ud as usize;
            if !ctx.ops.contains(key) {
                continue;
            }
            let op = ctx.ops.remove(key);
            let (c, iov) = complete(op, res);
            if let Some(iov) = iov
                && ctx.iov_spare.len() < 64
            {
                ctx.iov_spare.push(iov);
            }
            if let Completion::Readable { token, .. } = &c
                && *token >> 32 == 0xffff_fffe
            {
                armed.retain(|&fd| fd as u64 != token & 0xffff_ffff);
                continue;
            }
            worker.on_completion(&mut ctx, c);
        }
        while let Some(m) = mailbox.try_recv() {
            progressed = true;
            worker.on_message(&mut ctx, m);
        }
        if worker.poll(&mut ctx) {
            progressed = true;
        }
        if progressed {
            last_work = ctx.now;
        }
        if ctx.unsubmitted > 0 || !ctx.backlog.is_empty() {
            ctx.submit(None)?;
            continue;
        }
        let idle = ctx.now.duration_since(last_work);
        if progressed || worker.wants_spin() || idle < cfg.poll {
            if ctx.ring.submission().taskrun() {
                // Completions wait for a trip into the kernel.
                ctx.submit(None)?;
            }
            continue;
        }
        if idle < cfg.latency_poll && worker.latency_bound(ctx.now) {
            if ctx.ring.submission().taskrun() {
                ctx.submit(None)?;
            } else {
                // Give the CPU to whatever else is runnable here (often
                // the peer itself on a small machine).
                std::thread::yield_now();
            }
            continue;
        }
        // Sleep: arm wake-ups for the mailbox and the worker's fds.
        if !wake_armed {
            let e = opcode::PollAdd::new(types::Fd(mailbox.fd()), libc::POLLIN as u32)
                .build()
                .user_data(WAKE_TOKEN);
            ctx.push(e);
            wake_armed = true;
        }
        wake_fds.clear();
        worker.wake_fds(&mut wake_fds);
        for &fd in &wake_fds {
            if !armed.contains(&fd) {
                armed.push(fd);
                ctx.poll_readable(fd, (0xffff_fffe_u64 << 32) | fd as u32 as u64);
            }
        }
        if mailbox.set_sleeping(true) {
            mailbox.set_sleeping(false);
            continue;
        }
        let timeout = worker
            .next_deadline()
            .map(|d| d.saturating_duration_since(Instant::now()))
            .unwrap_or(Duration::from_millis(500))
            .max(Duration::from_micros(1));
        let r = ctx.submit(Some(timeout));
        mailbox.set_sleeping(false);
        r?;
        // A wake-up poll holds the file it was armed on, not its number: a
        // worker's fd closed and its number given to a new file (one
        // connection gone, another come) would leave the old poll armed
        // and the new file never watched. So wake-up polls last one sleep
        // and are withdrawn after it (their completions are skipped above).
        if !armed.is_empty() {
            ctx.cancel(|t| t >> 32 == 0xffff_fffe);
            armed.clear();
        }
    }
    drain(&mut ctx, wake_armed)?;
    Ok(worker)
}

/// Cancels every operation still in flight and waits (up to two seconds)
/// for the kernel to give each one back. Their buffers are freed with
/// `ctx`, so the kernel must be done with them first; and an accept left in
/// flight would keep its listening socket open after the process has gone
/// (a restarted ferrited would find the port taken, and a client connecting
/// meanwhile would be reset).
fn drain(ctx: &mut Ctx, wake_armed: bool) -> io::Result<()> {
    ctx.cancel(|_| true);
    if wake_armed {
        let e = opcode::AsyncCancel::new(WAKE_TOKEN)
            .build()
            .user_data(CANCEL_TOKEN);
        ctx.push(e);
    }
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        let done: Vec<u64> = ctx.ring.completion().map(|c| c.user_data()).collect();
        for ud in done {
            let key = ud as usize;
            if ud != WAKE_TOKEN && ud != CANCEL_TOKEN && ctx.ops.contains(key) {
                ctx.ops.remove(key);
            }
        }
        if ctx.ops.is_empty() || Instant::now() >= deadline {
            if !ctx.ops.is_empty() {
                tracing::warn!(
                    left = ctx.ops.len(),
                    "reactor stopping with operations the kernel has not returned"
                );
            }
            return Ok(());
        }
        ctx.submit(Some(Duration::from_millis(10)))?;
    }
}

/// The completion of `op`, and the iovec array it used (for reuse).
fn complete(op: Op, res: i32) -> (Completion, Option<Vec<libc::iovec>>) {
    let result = |res: i32| -> io::Result<usize> {
        if res < 0 {
            Err(io::Error::from_raw_os_error(-res))
        } else {
            Ok(res as usize)
        }
    };
    match op {
        Op::Recv { token, buf, start } => (
            Completion::Recv {
                token,
                result: result(res),
                buf,
                start,
            },
            None,
        ),
        Op::Send {
            token,
            segs,
            iovecs,
        } => (
            Completion::Send {
                token,
                result: result(res),
                segs,
            },
            Some(iovecs),
        ),
        Op::Splice { token, segs } => {
            let result = match (result(res), segs.front()) {
                (Ok(n), Some(TxSeg::Pipe { pipe, .. })) if n > 0 => {
                    if let Ok(mut p) = pipe.try_borrow_mut() {
                        p.taken(n);
                    }
                    Ok(n)
                }
                // The pipe held less than the segment says: the bytes
                // promised to the peer cannot be sent.
                (Ok(_), _) => Err(io::Error::from_raw_os_error(libc::EPIPE)),
                (Err(e), _) => Err(e),
            };
            (
                Completion::Send {
                    token,
                    result,
                    segs,
                },
                None,
            )
        }
        Op::Accept { token } => (
            Completion::Accept {
                token,
                result: result(res).map(|fd| {
                    // SAFETY: a successful accept returns a new descriptor we now own.
                    unsafe { OwnedFd::from_raw_fd(fd as RawFd) }
                }),
            },
            None,
        ),
        Op::Poll { token } => (
            Completion::Readable {
                token,
                result: result(res).map(|_| ()),
            },
            None,
        ),
    }
}

fn pin_to_cpu(cpu: usize) {
    // SAFETY: cpu_set_t is plain data; CPU_ZERO/CPU_SET write within it, and
    // sched_setaffinity only reads it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_ZERO(&mut set);
        libc::CPU_SET(cpu, &mut set);
        if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
            tracing::warn!(cpu, "could not pin reactor thread");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mailbox::mailbox;
    use std::io::{Read, Write};
    use std::net::{TcpListener, TcpStream};
    use std::os::fd::AsRawFd;

    /// An echo server worker on one accepted socket, driven by the reactor.
    struct Echo {
        /// Kept open while the reactor accepts on it.
        _listener: TcpListener,
        conn: Option<OwnedFd>,
        done: bool,
        echoed: usize,
    }

    impl Worker for Echo {
        type Msg = ();
        fn on_completion(&mut self, ctx: &mut Ctx, c: Completion) {
            match c {
                Completion::Accept { result, .. } => {
                    let fd = result.unwrap();
                    ctx.recv(fd.as_raw_fd(), vec![0; 4096], 0, 1);
                    self.conn = Some(fd);
                }
                Completion::Recv {
                    result, buf, start, ..
                } => {
                    let n = result.unwrap();
                    let fd = self.conn.as_ref().unwrap().as_raw_fd();
                    if n == 0 {
                        self.done = true;
                        return;
                    }
                    let mut q = VecDeque::new();
                    q.push_back(TxSeg::Bytes(buf[start..start + n].to_vec()));
                    ctx.send(fd, q, 2);
                    ctx.recv(fd, buf, 0, 1);
                }
                Completion::Send { result, .. } => {
                    self.echoed += result.unwrap();
                }
                Completion::Readable { .. } => {}
            }
        }
        fn on_message(&mut self, _ctx: &mut Ctx, _m: ()) {}
        fn poll(&mut self, _ctx: &mut Ctx) -> bool {
            false
        }
        fn next_deadline(&self) -> Option<Instant> {
            None
        }
        fn wants_spin(&self) -> bool {
            false
        }
        fn wake_fds(&self, _out: &mut Vec<RawFd>) {}
        fn running(&self) -> bool {
            !self.done
        }
    }

    #[test]
    fn echo_over_io_uring() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let (_tx, rx) = mailbox::<()>().unwrap();
        let t = std::thread::spawn(move || {
            let lfd = listener.as_raw_fd();
            let w = Echo {
                _listener: listener,
                conn: None,
                done: false,
                echoed: 0,
            };
            run_with_accept(ReactorConfig::default(), rx, w, lfd)
        });
        let mut s = TcpStream::connect(addr).unwrap();
        let msg = vec![7u8; 10000];
        s.write_all(&msg).unwrap();
        let mut back = vec![0u8; 10000];
        s.read_exact(&mut back).unwrap();
        assert_eq!(back, msg);
        drop(s);
        let w = t.join().unwrap();
        assert_eq!(w.echoed, 10000);
    }

    /// Wraps the worker so the first poll submits the accept.
    fn run_with_accept(cfg: ReactorConfig, rx: MailboxRx<()>, w: Echo, lfd: RawFd) -> Echo {
        struct First {
            inner: Echo,
            lfd: RawFd,
            started: bool,
        }
        impl Worker for First {
            type Msg = ();
            fn on_completion(&mut self, ctx: &mut Ctx, c: Completion) {
                self.inner.on_completion(ctx, c)
            }
            fn on_message(&mut self, ctx: &mut Ctx, m: ()) {
                self.inner.on_message(ctx, m)
            }
            fn poll(&mut self, ctx: &mut Ctx) -> bool {
                if !self.started {
                    self.started = true;
                    ctx.accept(self.lfd, 0);
                    return true;
                }
                false
            }
            fn next_deadline(&self) -> Option<Instant> {
                None
            }
            fn wants_spin(&self) -> bool {
                false
            }
            fn wake_fds(&self, _out: &mut Vec<RawFd>) {}
            fn running(&self) -> bool {
                self.inner.running()
            }
        }
        let f = run(
            0,
            cfg,
            rx,
            First {
                inner: w,
                lfd,
                started: false,
            },
        )
        .unwrap();
        f.inner
    }

    /// A worker whose wake fd is the read end of a pipe; told through its
    /// mailbox, it closes that pipe and puts a new one's read end on the
    /// same fd number, then waits (its next deadline a minute away) for a
    /// byte on the new pipe.
    struct Reuse {
        read: OwnedFd,
        /// The old pipe's write end, kept open so its read end stays quiet.
        old_write: Option<OwnedFd>,
        new_write: std::sync::mpsc::Sender<OwnedFd>,
        got: bool,
    }

    fn pipe() -> (OwnedFd, OwnedFd) {
        let mut fds = [0; 2];
        // SAFETY: fds has room for the two descriptors pipe2 returns.
        let rc = unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_NONBLOCK) };
        assert_eq!(rc, 0);
        // SAFETY: both were just opened and are owned by nobody else.
        unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) }
    }

    impl Worker for Reuse {
        type Msg = OwnedFd;
        fn on_completion(&mut self, _ctx: &mut Ctx, _c: Completion) {}
        fn on_message(&mut self, _ctx: &mut Ctx, old_write: OwnedFd) {
            let number = self.read.as_raw_fd();
            let (r, w) = pipe();
            // SAFETY: both are open; dup2 closes `number` (the old read
            // end) and makes it refer to the new pipe.
            assert_eq!(unsafe { libc::dup2(r.as_raw_fd(), number) }, number);
            self.old_write = Some(old_write);
            self.new_write.send(w).unwrap();
        }
        fn poll(&mut self, _ctx: &mut Ctx) -> bool {
            let mut b = [0u8; 1];
            // SAFETY: reads at most one byte into b from an open fd.
            let n = unsafe { libc::read(self.read.as_raw_fd(), b.as_mut_ptr().cast(), 1) };
            if n == 1 {
                self.got = true;
            }
            n == 1
        }
        fn next_deadline(&self) -> Option<Instant> {
            Some(Instant::now() + Duration::from_secs(60))
        }
        fn wants_spin(&self) -> bool {
            false
        }
        fn wake_fds(&self, out: &mut Vec<RawFd>) {
            out.push(self.read.as_raw_fd());
        }
        fn running(&self) -> bool {
            !self.got
        }
    }

    /// A wake fd whose number was closed and given to a new file while the
    /// reactor slept still wakes it: the poll armed on the old file does
    /// not stand for the new one.
    #[test]
    fn a_wake_fd_number_reused_by_a_new_file_still_wakes_the_reactor() {
        let (tx, rx) = mailbox::<OwnedFd>().unwrap();
        let (r, w) = pipe();
        let (new_tx, new_rx) = std::sync::mpsc::channel();
        let t = std::thread::spawn(move || {
            let cfg = ReactorConfig {
                poll: Duration::ZERO,
                latency_poll: Duration::ZERO,
                ..ReactorConfig::default()
            };
            let worker = Reuse {
                read: r,
                old_write: None,
                new_write: new_tx,
                got: false,
            };
            run(0, cfg, rx, worker).unwrap()
        });
        // Let the reactor go to sleep with a poll armed on the first pipe.
        std::thread::sleep(Duration::from_millis(200));
        tx.send(w).unwrap();
        let new_w = new_rx.recv_timeout(Duration::from_secs(30)).unwrap();
        // Asleep again, now with the new pipe behind the same number.
        std::thread::sleep(Duration::from_millis(200));
        let start = Instant::now();
        // SAFETY: writes one byte from a live buffer to an open pipe.
        let n = unsafe { libc::write(new_w.as_raw_fd(), [1u8].as_ptr().cast(), 1) };
        assert_eq!(n, 1);
        let w = t.join().unwrap();
        assert!(w.got);
        // Without a poll on the new file the reactor would sleep out its
        // worker's minute-long deadline.
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "the reactor woke only after {:?}",
            start.elapsed()
        );
    }

    #[test]
    fn advance_partial() {
        let mut q = VecDeque::new();
        q.push_back(TxSeg::Bytes(vec![1, 2, 3]));
        let sg = Arc::new(SgList::zeroed(10));
        q.push_back(TxSeg::Data {
            sg: SgHold::Shared(sg),
            offset: 0,
            len: 10,
        });
        advance(&mut q, 5);
        assert_eq!(q.len(), 1);
        assert_eq!(q[0].len(), 8);
        advance(&mut q, 8);
        assert!(q.is_empty());
    }

    #[test]
    fn advance_at_boundaries_and_past_empty_segments() {
        let mut q = VecDeque::new();
        q.push_back(TxSeg::copy_of(&[1, 2, 3, 4]));
        q.push_back(TxSeg::copy_of(&[]));
        q.push_back(TxSeg::copy_of(&[5, 6]));
        q.push_back(TxSeg::Bytes(vec![7, 8, 9]));
        // Ends on a boundary: the empty segment after it goes too.
        advance(&mut q, 4);
        assert_eq!(q.len(), 2);
        assert_eq!(q[0].bytes(), Some(&[5u8, 6][..]));
        // Into the middle of an inline segment.
        advance(&mut q, 1);
        assert_eq!(q[0].bytes(), Some(&[6u8][..]));
        advance(&mut q, 0);
        assert_eq!(q.len(), 2);
        // Over one segment into the next.
        advance(&mut q, 2);
        assert_eq!(q.len(), 1);
        assert_eq!(q[0].bytes(), Some(&[8u8, 9][..]));
        advance(&mut q, 2);
        assert!(q.is_empty());
        // More than there is empties the queue.
        q.push_back(TxSeg::copy_of(&[1]));
        advance(&mut q, 5);
        assert!(q.is_empty());
    }
}
