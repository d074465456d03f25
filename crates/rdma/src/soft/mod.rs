//! The soft provider: **a test and development provider**, not a data path.
//!
//! It gives the verbs semantics the fabrics rely on without an HCA:
//!
//! - A [`SoftDevice`] holds a registry of memory regions. Each region has an
//!   lkey and an rkey; local sges and peer RDMA requests are checked against
//!   it (key, protection domain, access rights, bounds). A peer's SEND
//!   with Invalidate ([`crate::SendOp::SendInvalidate`]) naming a region's
//!   rkey ends remote access under that key for the life of the
//!   registration (RDMA READ and WRITE under it complete with
//!   [`WcStatus::RemAccessErr`]); the region's lkey stays usable, and
//!   registering the memory again gives fresh keys. The soft provider has
//!   no memory windows: every rkey names a region.
//! - Each [`SoftQp`] is one socket (Unix stream or TCP) carrying the frames
//!   of [`wire`]. Three threads serve a connected QP: a *writer* that owns
//!   the socket's sending side, a *reader* that answers the peer's SEND,
//!   RDMA WRITE and RDMA READ requests against this device's registry (the
//!   side that owns the memory serves the access, as an HCA does), and a
//!   *requester* that carries out this side's send queue one request at a
//!   time, in order, waiting for each ACK, READ response or NAK.
//! - Completions go to [`SoftCq`]s; a reactor polls them
//!   ([`CompletionQueue::poll_cq`]) and sleeps on [`CompletionQueue::fd`].
//! - Errors as hardware reports them: a bad rkey or out-of-range access
//!   completes with [`WcStatus::RemAccessErr`] and moves the requester's QP
//!   to the error state; a SEND with no receive posted is NAKed RNR and
//!   retried `rnr_retry` times, then completes with
//!   [`WcStatus::RnrRetryExcErr`]; a SEND with Invalidate naming a key
//!   that is not a valid rkey of the receiver's protection domain completes
//!   the receive and the SEND with [`WcStatus::RemInvReqErr`] and fails
//!   both QPs; a QP in the error state (after an error
//!   or a disconnect from either side) flushes every outstanding request
//!   with [`WcStatus::WrFlushErr`] and tears the connection down, so the
//!   peer sees [`crate::ConnEvent::Disconnected`].
//! - Connection management carries private data: [`SoftQp::connect`],
//!   [`SoftListener`] with [`ConnRequest::reject`] and [`SoftQp::accept`].
//!
//! Threads per QP are acceptable here because this provider exists for tests
//! and development; the `verbs` provider has none.

mod qp;
pub mod wire;

use std::collections::{HashMap, VecDeque};
use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread;
use std::time::{Duration, Instant};

use ferrite_reactor::buf::SgList;

pub use qp::{QpAttrs, SoftQp, connect_qp};

use crate::{
    Access, CompletionQueue, MemoryRegion, MrSeg, PostError, RdmaError, RecvWr, Sge, WcStatus,
    WorkCompletion,
};

/// Locks a mutex, recovering from poisoning (a panicking provider thread
/// must not take the whole device down with it).
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// High bit marks rkeys, so an lkey used as an rkey (or the reverse) fails
/// the check as it would on an HCA with distinct keys.
const RKEY_BIT: u32 = 0x8000_0000;

struct MrEntry {
    base: usize,
    len: usize,
    access: Access,
    pd: u32,
    /// False once a peer's SEND with Invalidate named the rkey: remote
    /// access under it fails from then on (the lkey stays usable).
    remote_valid: bool,
}

#[derive(Default)]
struct Registry {
    next_key: u32,
    mrs: HashMap<u32, MrEntry>,
}

struct DevShared {
    name: String,
    reg: Mutex<Registry>,
    next_pd: AtomicU32,
    next_qpn: AtomicU32,
}

/// A soft "HCA": a name and a memory registry.
#[derive(Clone)]
pub struct SoftDevice {
    shared: Arc<DevShared>,
}

impl std::fmt::Debug for SoftDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SoftDevice({})", self.shared.name)
    }
}

impl SoftDevice {
    /// A new device named `name` with one port.
    pub fn new(name: &str) -> SoftDevice {
        SoftDevice {
            shared: Arc::new(DevShared {
                name: name.to_string(),
                reg: Mutex::new(Registry {
                    next_key: 1,
                    mrs: HashMap::new(),
                }),
                next_pd: AtomicU32::new(1),
                next_qpn: AtomicU32::new(0x100),
            }),
        }
    }

    /// The device name.
    pub fn name(&self) -> &str {
        &self.shared.name
    }

    /// Number of ports (always one).
    pub fn port_count(&self) -> u8 {
        1
    }

    /// Allocates a protection domain.
    pub fn alloc_pd(&self) -> SoftPd {
        SoftPd {
            dev: self.shared.clone(),
            id: self.shared.next_pd.fetch_add(1, Ordering::Relaxed),
        }
    }
}

impl DevShared {
    fn next_qpn(&self) -> u32 {
        self.next_qpn.fetch_add(1, Ordering::Relaxed)
    }

    /// Checks `[addr, addr+len)` against the entry under `key`.
    fn check(
        reg: &Registry,
        key: u32,
        pd: u32,
        addr: u64,
        len: u64,
        need: Access,
    ) -> Option<&MrEntry> {
        let e = reg.mrs.get(&key)?;
        let start = e.base as u64;
        let end = start + e.len as u64;
        let ok = e.pd == pd
            && e.access.contains(need)
            && addr >= start
            && addr.checked_add(len).is_some_and(|x| x <= end);
        ok.then_some(e)
    }

    /// Gathers the bytes of local sges (SEND and RDMA WRITE payloads).
    fn gather(&self, pd: u32, sges: &[Sge]) -> Result<Vec<u8>, WcStatus> {
        let reg = lock(&self.reg);
        let total: usize = sges.iter().map(|s| s.len as usize).sum();
        let mut out = Vec::with_capacity(total);
        for s in sges {
            if s.lkey & RKEY_BIT != 0 {
                return Err(WcStatus::LocProtErr);
            }
            if Self::check(&reg, s.lkey, pd, s.addr, s.len as u64, Access::default()).is_none() {
                return Err(WcStatus::LocProtErr);
            }
            let at = out.len();
            out.resize(at + s.len as usize, 0);
            // SAFETY: `check` proved [addr, addr+len) lies inside a live
            // registration; the owner of that memory (a SoftMr) keeps it
            // allocated while registered and only deregisters, or touches
            // the bytes, while holding `reg`, which we hold.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    s.addr as usize as *const u8,
                    out[at..].as_mut_ptr(),
                    s.len as usize,
                )
            };
        }
        Ok(out)
    }

    /// Scatters `data` into local sges (RECV and RDMA READ sinks).
    fn scatter(&self, pd: u32, sges: &[Sge], data: &[u8]) -> Result<(), WcStatus> {
        let reg = lock(&self.reg);
        let room: usize = sges.iter().map(|s| s.len as usize).sum();
        if data.len() > room {
            return Err(WcStatus::LocLenErr);
        }
        for s in sges {
            if s.lkey & RKEY_BIT != 0
                || Self::check(&reg, s.lkey, pd, s.addr, s.len as u64, Access::LOCAL_WRITE)
                    .is_none()
            {
                return Err(WcStatus::LocProtErr);
            }
        }
        let mut done = 0;
        for s in sges {
            if done == data.len() {
                break;
            }
            let n = (s.len as usize).min(data.len() - done);
            // SAFETY: as in `gather`: the range was checked against a live
            // registration with LOCAL_WRITE, and the registry lock we hold
            // excludes every other access to registered memory.
            unsafe {
                std::ptr::copy_nonoverlapping(data[done..].as_ptr(), s.addr as usize as *mut u8, n)
            };
            done += n;
        }
        Ok(())
    }

    /// Checks a peer's access under `rkey`: a remote key, not invalidated,
    /// and [`DevShared::check`].
    fn check_remote(
        reg: &Registry,
        rkey: u32,
        pd: u32,
        addr: u64,
        len: u64,
        need: Access,
    ) -> Option<&MrEntry> {
        if rkey & RKEY_BIT == 0 {
            return None;
        }
        Self::check(reg, rkey & !RKEY_BIT, pd, addr, len, need).filter(|e| e.remote_valid)
    }

    /// Serves the invalidation of a peer's SEND with Invalidate: true when
    /// `rkey` was a valid remote key of protection domain `pd`, which it
    /// no longer is.
    fn invalidate(&self, pd: u32, rkey: u32) -> bool {
        let mut reg = lock(&self.reg);
        if rkey & RKEY_BIT == 0 {
            return false;
        }
        match reg.mrs.get_mut(&(rkey & !RKEY_BIT)) {
            Some(e) if e.pd == pd && e.remote_valid => {
                e.remote_valid = false;
                true
            }
            _ => false,
        }
    }

    /// Serves a peer's RDMA READ.
    fn remote_read(&self, pd: u32, addr: u64, rkey: u32, len: u32) -> Option<Vec<u8>> {
        let reg = lock(&self.reg);
        Self::check_remote(&reg, rkey, pd, addr, len as u64, Access::REMOTE_READ)?;
        let mut out = vec![0u8; len as usize];
        // SAFETY: range checked against a live registration with REMOTE_READ;
        // registry lock held (see `gather`).
        unsafe {
            std::ptr::copy_nonoverlapping(addr as usize as *const u8, out.as_mut_ptr(), out.len())
        };
        Some(out)
    }

    /// Serves a peer's RDMA WRITE.
    fn remote_write(&self, pd: u32, addr: u64, rkey: u32, data: &[u8]) -> bool {
        let reg = lock(&self.reg);
        let need = Access::REMOTE_WRITE;
        if Self::check_remote(&reg, rkey, pd, addr, data.len() as u64, need).is_none() {
            return false;
        }
        // SAFETY: range checked against a live registration with
        // REMOTE_WRITE; registry lock held (see `gather`).
        unsafe {
            std::ptr::copy_nonoverlapping(data.as_ptr(), addr as usize as *mut u8, data.len())
        };
        true
    }
}

/// A protection domain of a [`SoftDevice`].
#[derive(Clone)]
pub struct SoftPd {
    dev: Arc<DevShared>,
    id: u32,
}

impl std::fmt::Debug for SoftPd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SoftPd({})", self.id)
    }
}

impl crate::ProtectionDomain for SoftPd {
    fn reg_sg(&self, sg: SgList, access: Access) -> Result<Box<dyn MemoryRegion>, RdmaError> {
        Ok(Box::new(SoftPd::reg_sg(self, sg, access)?))
    }
}

impl SoftPd {
    /// Registers the segments of `sg` (one region per segment). The region
    /// owns the list until [`MemoryRegion::into_sg`].
    pub fn reg_sg(&self, mut sg: SgList, access: Access) -> Result<SoftMr, RdmaError> {
        let mut segs = Vec::with_capacity(sg.segments().len());
        let mut reg = lock(&self.dev.reg);
        for b in sg.segments_mut() {
            let key = reg.next_key;
            if key >= RKEY_BIT - 1 {
                return Err(RdmaError::TooLarge);
            }
            reg.next_key += 1;
            let base = b.as_mut_ptr() as usize;
            let len = b.len();
            let len32 = u32::try_from(len).map_err(|_| RdmaError::TooLarge)?;
            reg.mrs.insert(
                key,
                MrEntry {
                    base,
                    len,
                    access,
                    pd: self.id,
                    remote_valid: true,
                },
            );
            segs.push(MrSeg {
                addr: base as u64,
                len: len32,
                lkey: key,
                rkey: key | RKEY_BIT,
            });
        }
        drop(reg);
        Ok(SoftMr {
            dev: self.dev.clone(),
            segs,
            sg,
        })
    }

    /// Registers a fresh zeroed buffer of `len` bytes.
    pub fn reg_zeroed(&self, len: usize, access: Access) -> Result<SoftMr, RdmaError> {
        self.reg_sg(SgList::zeroed(len), access)
    }
}

/// A registered [`SgList`].
pub struct SoftMr {
    dev: Arc<DevShared>,
    segs: Vec<MrSeg>,
    sg: SgList,
}

impl std::fmt::Debug for SoftMr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SoftMr({:?})", self.segs)
    }
}

impl SoftMr {
    fn dereg(&mut self) {
        let mut reg = lock(&self.dev.reg);
        for s in &self.segs {
            reg.mrs.remove(&s.lkey);
        }
    }
}

impl Drop for SoftMr {
    fn drop(&mut self) {
        self.dereg();
    }
}

impl MemoryRegion for SoftMr {
    fn segs(&self) -> &[MrSeg] {
        &self.segs
    }

    fn read_at(&self, offset: u64, dst: &mut [u8]) -> usize {
        // Provider threads only touch registered memory under this lock.
        let _reg = lock(&self.dev.reg);
        self.sg.copy_out(offset as usize, dst)
    }

    fn write_at(&mut self, offset: u64, src: &[u8]) -> usize {
        let reg = lock(&self.dev.reg);
        let n = self.sg.copy_in(offset as usize, src);
        drop(reg);
        n
    }

    fn into_sg(mut self: Box<Self>) -> SgList {
        self.dereg();
        std::mem::take(&mut self.sg)
    }
}

impl SoftMr {
    /// [`MemoryRegion::into_sg`] without boxing.
    pub fn into_sg(self) -> SgList {
        MemoryRegion::into_sg(Box::new(self))
    }
}

struct CqShared {
    q: Mutex<VecDeque<WorkCompletion>>,
    cv: Condvar,
    wake_tx: UnixStream,
    wake_rx: UnixStream,
}

/// A completion queue. Cloning shares it (several QPs may complete into one).
#[derive(Clone)]
pub struct SoftCq {
    shared: Arc<CqShared>,
}

impl std::fmt::Debug for SoftCq {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SoftCq({})", lock(&self.shared.q).len())
    }
}

impl SoftCq {
    /// A new, empty completion queue.
    pub fn new() -> io::Result<SoftCq> {
        let (wake_tx, wake_rx) = UnixStream::pair()?;
        wake_tx.set_nonblocking(true)?;
        wake_rx.set_nonblocking(true)?;
        Ok(SoftCq {
            shared: Arc::new(CqShared {
                q: Mutex::new(VecDeque::new()),
                cv: Condvar::new(),
                wake_tx,
                wake_rx,
            }),
        })
    }

    fn push(&self, wc: WorkCompletion) {
        let mut q = lock(&self.shared.q);
        let was_empty = q.is_empty();
        q.push_back(wc);
        if was_empty {
            // A full pipe already means "readable"; nothing to do then.
            let _ = (&self.shared.wake_tx).write(&[1]);
        }
        drop(q);
        self.shared.cv.notify_all();
    }

    /// Makes the fd readable without a completion (connection events).
    fn nudge(&self) {
        let _q = lock(&self.shared.q);
        let _ = (&self.shared.wake_tx).write(&[1]);
    }

    /// Blocks until a completion is available or `timeout` passes; true if
    /// one is available (for threads that do not run a reactor, and tests).
    pub fn wait(&self, timeout: Duration) -> bool {
        CompletionQueue::wait(self, timeout)
    }

    fn wait_nonempty(&self, timeout: Duration) -> bool {
        let q = lock(&self.shared.q);
        let (q, _) = self
            .shared
            .cv
            .wait_timeout_while(q, timeout, |q| q.is_empty())
            .unwrap_or_else(|e| e.into_inner());
        !q.is_empty()
    }
}

impl CompletionQueue for SoftCq {
    fn poll_cq(&self, out: &mut Vec<WorkCompletion>) -> usize {
        let mut q = lock(&self.shared.q);
        // Drain the wake pipe under the lock, before the queue, so that a
        // completion pushed later always leaves the fd readable.
        let mut sink = [0u8; 64];
        while matches!((&self.shared.wake_rx).read(&mut sink), Ok(n) if n > 0) {}
        let n = q.len();
        out.extend(q.drain(..));
        n
    }

    fn fd(&self) -> RawFd {
        self.shared.wake_rx.as_raw_fd()
    }

    fn wait(&self, timeout: Duration) -> bool {
        self.wait_nonempty(timeout)
    }
}

/// A receive queue: a QP's own, or a shared one ([`SoftSrq`]).
#[derive(Default)]
struct RecvQueue {
    q: Mutex<VecDeque<RecvWr>>,
}

/// A shared receive queue: several QPs take receives from it.
#[derive(Clone, Default)]
pub struct SoftSrq {
    rq: Arc<RecvQueue>,
    max_wr: usize,
}

impl std::fmt::Debug for SoftSrq {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SoftSrq({})", lock(&self.rq.q).len())
    }
}

impl SoftSrq {
    /// An SRQ holding up to `max_wr` receives.
    pub fn new(max_wr: usize) -> SoftSrq {
        SoftSrq {
            rq: Arc::default(),
            max_wr,
        }
    }

    /// Posts a receive to the SRQ.
    pub fn post_recv(&self, wr: &RecvWr) -> Result<(), PostError> {
        let mut q = lock(&self.rq.q);
        if q.len() >= self.max_wr {
            return Err(PostError::QueueFull);
        }
        q.push_back(wr.clone());
        Ok(())
    }

    /// Receives currently posted.
    pub fn posted(&self) -> usize {
        lock(&self.rq.q).len()
    }
}

/// Where a soft QP connects or listens.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SoftAddr {
    Unix(PathBuf),
    Tcp(SocketAddr),
}

/// One QP's socket.
enum Stream {
    Unix(UnixStream),
    Tcp(TcpStream),
}

impl Stream {
    fn connect(addr: &SoftAddr) -> io::Result<Stream> {
        Ok(match addr {
            SoftAddr::Unix(p) => Stream::Unix(UnixStream::connect(p)?),
            SoftAddr::Tcp(a) => {
                let s = TcpStream::connect(a)?;
                s.set_nodelay(true)?;
                Stream::Tcp(s)
            }
        })
    }

    fn try_clone(&self) -> io::Result<Stream> {
        Ok(match self {
            Stream::Unix(s) => Stream::Unix(s.try_clone()?),
            Stream::Tcp(s) => Stream::Tcp(s.try_clone()?),
        })
    }

    fn shutdown(&self) {
        let _ = match self {
            Stream::Unix(s) => s.shutdown(Shutdown::Both),
            Stream::Tcp(s) => s.shutdown(Shutdown::Both),
        };
    }

    fn set_read_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        match self {
            Stream::Unix(s) => s.set_read_timeout(t),
            Stream::Tcp(s) => s.set_read_timeout(t),
        }
    }

    fn set_nonblocking(&self, nb: bool) -> io::Result<()> {
        match self {
            Stream::Unix(s) => s.set_nonblocking(nb),
            Stream::Tcp(s) => s.set_nonblocking(nb),
        }
    }
}

impl Read for Stream {
    fn read(&mut self, b: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Unix(s) => s.read(b),
            Stream::Tcp(s) => s.read(b),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, b: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Unix(s) => s.write(b),
            Stream::Tcp(s) => s.write(b),
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        match self {
            Stream::Unix(s) => s.flush(),
            Stream::Tcp(s) => s.flush(),
        }
    }
}

/// How long dropping a listener waits for its thread.
const LISTENER_STOP_WAIT: Duration = Duration::from_millis(50);

/// How long a new connection may take to send its connect request.
const CONN_REQ_TIMEOUT: Duration = Duration::from_secs(5);

/// An incoming connection with the initiator's private data. Accept it with
/// [`SoftQp::accept`] or refuse it with [`ConnRequest::reject`].
pub struct ConnRequest {
    stream: Stream,
    private_data: Vec<u8>,
}

impl std::fmt::Debug for ConnRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "ConnRequest({} bytes private data)",
            self.private_data.len()
        )
    }
}

impl ConnRequest {
    /// The private data of the connect request (SRP: SRP_LOGIN_REQ).
    pub fn private_data(&self) -> &[u8] {
        &self.private_data
    }

    /// Refuses the connection, handing `private_data` to the initiator
    /// (SRP: SRP_LOGIN_REJ).
    pub fn reject(mut self, private_data: &[u8]) -> Result<(), RdmaError> {
        wire::Frame::ConnRej(private_data.to_vec()).write_to(&mut self.stream)?;
        self.stream.shutdown();
        Ok(())
    }
}

struct ListenShared {
    pending: Mutex<VecDeque<ConnRequest>>,
    cv: Condvar,
    stop: AtomicBool,
    /// Readable while requests are pending (a reactor sleeps on it).
    wake_tx: UnixStream,
    wake_rx: UnixStream,
}

/// A listening endpoint (`rdma_listen`).
pub struct SoftListener {
    shared: Arc<ListenShared>,
    addr: SoftAddr,
    thread: Option<thread::JoinHandle<()>>,
    /// The socket file's (device, inode) as bound: dropping removes the
    /// file only if it is still this listener's (a port re-bound at the
    /// same path meanwhile keeps its socket).
    file_id: Option<(u64, u64)>,
}

impl std::fmt::Debug for SoftListener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SoftListener({:?})", self.addr)
    }
}

enum RawListener {
    Unix(UnixListener),
    Tcp(TcpListener),
}

impl RawListener {
    fn accept(&self) -> io::Result<Stream> {
        Ok(match self {
            RawListener::Unix(l) => Stream::Unix(l.accept()?.0),
            RawListener::Tcp(l) => {
                let s = l.accept()?.0;
                s.set_nodelay(true)?;
                Stream::Tcp(s)
            }
        })
    }
}

impl SoftListener {
    /// Listens on `addr` (a TCP port of 0 picks a free one; see
    /// [`SoftListener::addr`]).
    pub fn bind(addr: &SoftAddr) -> Result<SoftListener, RdmaError> {
        let (raw, bound) = match addr {
            SoftAddr::Unix(p) => {
                let l = UnixListener::bind(p)?;
                l.set_nonblocking(true)?;
                (RawListener::Unix(l), addr.clone())
            }
            SoftAddr::Tcp(a) => {
                let l = TcpListener::bind(a)?;
                l.set_nonblocking(true)?;
                let local = l.local_addr()?;
                (RawListener::Tcp(l), SoftAddr::Tcp(local))
            }
        };
        let (wake_tx, wake_rx) = UnixStream::pair()?;
        wake_tx.set_nonblocking(true)?;
        wake_rx.set_nonblocking(true)?;
        let shared = Arc::new(ListenShared {
            pending: Mutex::new(VecDeque::new()),
            cv: Condvar::new(),
            stop: AtomicBool::new(false),
            wake_tx,
            wake_rx,
        });
        let file_id = match &bound {
            SoftAddr::Unix(p) => socket_file_id(p),
            SoftAddr::Tcp(_) => None,
        };
        let sh = shared.clone();
        let thread = thread::Builder::new()
            .name("soft-rdma-listen".into())
            .spawn(move || listen_loop(raw, sh))?;
        Ok(SoftListener {
            shared,
            addr: bound,
            thread: Some(thread),
            file_id,
        })
    }

    /// The address peers connect to.
    pub fn addr(&self) -> &SoftAddr {
        &self.addr
    }

    /// The next connection request, if one is waiting.
    pub fn poll_request(&self) -> Option<ConnRequest> {
        let mut q = lock(&self.shared.pending);
        if q.len() <= 1 {
            // Drained under the lock, before the last request leaves: a
            // request queued later always leaves the fd readable.
            let mut sink = [0u8; 64];
            while matches!((&self.shared.wake_rx).read(&mut sink), Ok(n) if n > 0) {}
        }
        q.pop_front()
    }

    /// Readable while connection requests are waiting (what `rdma_cm`'s
    /// event channel fd is to a reactor); [`SoftListener::poll_request`]
    /// until it returns `None` re-arms it.
    pub fn fd(&self) -> RawFd {
        self.shared.wake_rx.as_raw_fd()
    }

    /// Waits up to `timeout` for a connection request.
    pub fn wait_request(&self, timeout: Duration) -> Option<ConnRequest> {
        let q = lock(&self.shared.pending);
        let (mut q, _) = self
            .shared
            .cv
            .wait_timeout_while(q, timeout, |q| q.is_empty())
            .unwrap_or_else(|e| e.into_inner());
        q.pop_front()
    }
}

impl Drop for SoftListener {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            // The accept loop sees `stop` within a few milliseconds, but a
            // peer that connected and sends nothing holds it in a read for
            // up to CONN_REQ_TIMEOUT: the owner (a reactor) does not wait
            // that long; the thread then ends on its own.
            let until = Instant::now() + LISTENER_STOP_WAIT;
            while !t.is_finished() && Instant::now() < until {
                thread::sleep(Duration::from_millis(1));
            }
            if t.is_finished() {
                let _ = t.join();
            } else {
                tracing::debug!(addr = ?self.addr, "soft rdma listener: thread left to finish its read");
            }
        }
        if let SoftAddr::Unix(p) = &self.addr
            && self.file_id.is_some()
            && socket_file_id(p) == self.file_id
        {
            let _ = std::fs::remove_file(p);
        }
    }
}

fn socket_file_id(p: &std::path::Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::symlink_metadata(p)
        .ok()
        .map(|m| (m.dev(), m.ino()))
}

fn listen_loop(raw: RawListener, sh: Arc<ListenShared>) {
    while !sh.stop.load(Ordering::Relaxed) {
        let mut stream = match raw.accept() {
            Ok(s) => s,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                thread::sleep(Duration::from_millis(2));
                continue;
            }
            Err(e) => {
                tracing::warn!("soft rdma listener: accept failed: {e}");
                thread::sleep(Duration::from_millis(20));
                continue;
            }
        };
        // Accepted sockets may inherit non-blocking mode on some systems.
        if stream.set_nonblocking(false).is_err()
            || stream.set_read_timeout(Some(CONN_REQ_TIMEOUT)).is_err()
        {
            continue;
        }
        match wire::Frame::read_from(&mut stream) {
            Ok(Some(wire::Frame::ConnReq(private_data))) => {
                if stream.set_read_timeout(None).is_err() {
                    continue;
                }
                let mut q = lock(&sh.pending);
                q.push_back(ConnRequest {
                    stream,
                    private_data,
                });
                // A full pipe already means "readable".
                let _ = (&sh.wake_tx).write(&[1]);
                drop(q);
                sh.cv.notify_all();
            }
            _ => stream.shutdown(),
        }
    }
}

/// Connects a stream and exchanges the connect request and reply.
fn connect_stream(
    addr: &SoftAddr,
    private_data: &[u8],
    timeout: Duration,
) -> Result<(Stream, Vec<u8>), RdmaError> {
    let deadline = Instant::now() + timeout;
    let mut stream = Stream::connect(addr)?;
    stream.set_read_timeout(Some(timeout))?;
    wire::Frame::ConnReq(private_data.to_vec()).write_to(&mut stream)?;
    let reply = match wire::Frame::read_from(&mut stream) {
        Ok(f) => f,
        Err(e)
            if matches!(
                e.kind(),
                io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
            ) =>
        {
            return Err(RdmaError::Timeout);
        }
        Err(e) => return Err(e.into()),
    };
    if Instant::now() > deadline {
        return Err(RdmaError::Timeout);
    }
    match reply {
        Some(wire::Frame::ConnRep(p)) => {
            stream.set_read_timeout(None)?;
            Ok((stream, p))
        }
        Some(wire::Frame::ConnRej(p)) => Err(RdmaError::Rejected { private_data: p }),
        Some(_) => Err(RdmaError::Protocol("unexpected reply to connect request")),
        None => Err(RdmaError::Protocol("peer closed during connect")),
    }
}

#[cfg(test)]
mod tests;
