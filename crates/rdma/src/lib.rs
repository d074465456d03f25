//! ferrite-rdma: the RDMA verbs surface the RDMA fabrics (SRP, iSER) are
//! written against, and two providers behind it.
//!
//! Owns: the provider-neutral vocabulary ([`Sge`], [`SendWr`], [`RecvWr`],
//! [`WorkCompletion`], [`WcStatus`], [`Access`], [`MrSeg`], [`QpState`],
//! [`ConnEvent`]), the traits a fabric driver uses ([`QueuePair`],
//! [`CompletionQueue`], [`MemoryRegion`], [`ProtectionDomain`], whose
//! `map_sg` is the data path's registration: once per pool buffer where the
//! provider can, not once per transfer) and the providers:
//!
//! - [`verbs`] (cargo feature `verbs`, on by default; the workspace's
//!   dependency entry turns defaults off, so a crate that wants it says
//!   `features = ["verbs"]`, as `ferrite-srp` does by default): libibverbs
//!   and librdmacm, declared by this crate (`verbs/sys.rs`, only what the
//!   provider uses) and opened at run time with `dlopen`. Building it needs
//!   nothing beyond Rust, and a binary with it links neither library: on a
//!   host without rdma-core the provider's entry points ([`verbs::devices`],
//!   `Context::open`, `Context::cm_devices`, `VerbsListener::bind`) return
//!   [`RdmaError::LibraryMissing`] naming the library, and the daemon logs
//!   one line, `RDMA fabrics idle: libibverbs.so.1 not found (install
//!   rdma-core / libibverbs1 and librdmacm1): ...`. With rdma-core but
//!   without an HCA, [`verbs::devices`] returns an empty list and the line
//!   is `RDMA fabrics idle: no RDMA device found` (see
//!   [`log_idle_if_empty`]). Run against soft-RoCE (`rdma_rxe`) in the
//!   kernel lab, with the Linux SRP initiator and the project's own.
//! - [`soft`]: **a test and development provider.** The same semantics over
//!   a Unix or TCP socket per queue pair (rkey and bounds checks, SEND with
//!   Invalidate, ordering, RNR, completion errors, flush on disconnect,
//!   private data on connect/accept/reject), so RDMA fabrics run end to end without an HCA.
//!
//! Does not own: any protocol (SRP, iSER live in `fabrics/`), buffer pools
//! (`ferrite_reactor::buf`), or the reactor loop (a driver sleeps on
//! [`CompletionQueue::fd`] and calls [`CompletionQueue::poll_cq`]).
//!
//! `unsafe` is allowed in this crate only where memory is handed to a
//! provider or the provider's C libraries are loaded and called; every
//! block carries a `SAFETY:` comment.

pub mod soft;
#[cfg(feature = "verbs")]
pub mod verbs;

use std::os::fd::RawFd;
use std::time::Duration;

use ferrite_reactor::buf::SgList;
use smallvec::SmallVec;

/// Access rights of a memory region (the `IBV_ACCESS_*` flags).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Access(pub u32);

impl Access {
    /// The local HCA may write the region (RECV targets, RDMA READ sinks).
    pub const LOCAL_WRITE: Access = Access(1);
    /// A peer may RDMA WRITE into the region.
    pub const REMOTE_WRITE: Access = Access(2);
    /// A peer may RDMA READ from the region.
    pub const REMOTE_READ: Access = Access(4);
    /// Everything.
    pub const ALL: Access = Access(7);

    /// True when every right in `other` is granted.
    pub fn contains(self, other: Access) -> bool {
        self.0 & other.0 == other.0
    }
}

impl std::ops::BitOr for Access {
    type Output = Access;
    fn bitor(self, rhs: Access) -> Access {
        Access(self.0 | rhs.0)
    }
}

/// One local scatter-gather element: `len` bytes at virtual address `addr`
/// inside the memory region whose local key is `lkey`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sge {
    pub addr: u64,
    pub len: u32,
    pub lkey: u32,
}

/// A peer's memory: `len` bytes at `addr` under `rkey`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RemoteSeg {
    pub addr: u64,
    pub rkey: u32,
    pub len: u32,
}

/// The operation of a send work request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SendOp {
    /// SEND: consumes one receive on the peer.
    Send,
    /// RDMA WRITE of the gathered local bytes to `remote_addr` under `rkey`.
    RdmaWrite { remote_addr: u64, rkey: u32 },
    /// RDMA READ of `sum(sges.len)` bytes from `remote_addr` under `rkey`,
    /// scattered into the local sges.
    RdmaRead { remote_addr: u64, rkey: u32 },
    /// SEND with Invalidate (`IBV_WR_SEND_WITH_INV`): consumes one receive
    /// on the peer like [`SendOp::Send`] and invalidates the peer's memory
    /// region or window whose remote key is `rkey`, so later RDMA READ or
    /// WRITE requests under it fail with [`WcStatus::RemAccessErr`]. The
    /// peer's receive completion names the key
    /// ([`WorkCompletion::invalidated_rkey`]). If `rkey` is not a valid key
    /// of the peer's protection domain, the peer's receive completes in
    /// error and both queue pairs go to the error state (the soft provider
    /// completes the receive and this request with
    /// [`WcStatus::RemInvReqErr`], as soft-RoCE completes the receive).
    SendInvalidate { rkey: u32 },
}

/// Scatter-gather list of a work request (most have one or two entries).
pub type SgeList = SmallVec<[Sge; 4]>;

/// A work request on the send queue.
#[derive(Clone, Debug)]
pub struct SendWr {
    pub wr_id: u64,
    pub op: SendOp,
    pub sges: SgeList,
    /// Generate a completion on success (errors always complete).
    pub signaled: bool,
}

/// A work request on the receive queue (or an SRQ).
#[derive(Clone, Debug)]
pub struct RecvWr {
    pub wr_id: u64,
    pub sges: SgeList,
}

/// Completion status (the `IBV_WC_*` codes a fabric needs to tell apart).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WcStatus {
    Success,
    /// A receive was too small for the incoming SEND.
    LocLenErr,
    /// A local sge does not lie inside a region registered with that lkey
    /// and the needed rights.
    LocProtErr,
    /// The QP went to the error state (disconnect or an earlier error)
    /// before this request was carried out.
    WrFlushErr,
    /// The peer refused an RDMA access: bad rkey, rights or bounds.
    RemAccessErr,
    /// The peer could not take a SEND (its receive was too small).
    RemInvReqErr,
    /// The peer had no receive posted for longer than the RNR retry count.
    RnrRetryExcErr,
    /// The peer stopped answering (transport retry counter exceeded).
    RetryExcErr,
    /// Any other failure.
    GeneralErr,
}

/// What a completion completes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WcOpcode {
    Send,
    RdmaWrite,
    RdmaRead,
    Recv,
}

/// One entry of a completion queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WorkCompletion {
    pub wr_id: u64,
    pub status: WcStatus,
    pub opcode: WcOpcode,
    /// Bytes received (Recv) or transferred (RdmaRead).
    pub byte_len: u32,
    pub qp_num: u32,
    /// A successful receive of a [`SendOp::SendInvalidate`]: the remote key
    /// of this side's memory that the SEND invalidated (`IBV_WC_WITH_INV`).
    pub invalidated_rkey: Option<u32>,
}

impl WorkCompletion {
    /// A completion that invalidated nothing.
    pub fn new(
        wr_id: u64,
        status: WcStatus,
        opcode: WcOpcode,
        byte_len: u32,
        qp_num: u32,
    ) -> WorkCompletion {
        WorkCompletion {
            wr_id,
            status,
            opcode,
            byte_len,
            qp_num,
            invalidated_rkey: None,
        }
    }
}

/// Queue pair state, as far as a fabric needs it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QpState {
    /// Created; receives may be posted; not connected yet.
    Init,
    /// Connected: ready to send and receive.
    Rts,
    /// An error or a disconnect: every outstanding request completes with
    /// [`WcStatus::WrFlushErr`].
    Error,
}

/// Connection events of a connected QP (`RDMA_CM_EVENT_*`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ConnEvent {
    /// The peer (or this side) disconnected.
    Disconnected,
}

/// Why a post was refused outright (the request does not complete).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PostError {
    #[error("queue pair is not connected")]
    NotConnected,
    #[error("too many scatter-gather entries ({0})")]
    TooManySges(usize),
    #[error("work queue full")]
    QueueFull,
    #[error("the queue pair receives through a shared receive queue")]
    UsesSrq,
    #[error("provider refused the post: errno {0}")]
    Os(i32),
}

/// Infrastructure errors of the providers.
#[derive(Debug, thiserror::Error)]
pub enum RdmaError {
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
    #[error("{call} failed: errno {errno}")]
    Verbs { call: &'static str, errno: i32 },
    #[error("connection rejected by the peer")]
    Rejected { private_data: Vec<u8> },
    #[error("connection protocol error: {0}")]
    Protocol(&'static str),
    #[error("timed out")]
    Timeout,
    #[error("queue pair is in the wrong state for this")]
    BadState,
    #[error("memory region too large")]
    TooLarge,
    /// A shared library the `verbs` provider needs could not be opened
    /// (not installed, or not loadable: `detail` is the loader's reason).
    /// The provider is idle; nothing else is affected.
    #[error("{library} not found (install rdma-core / libibverbs1 and librdmacm1): {detail}")]
    LibraryMissing {
        /// The soname: `libibverbs.so.1` or `librdmacm.so.1`.
        library: &'static str,
        detail: String,
    },
    /// The library is there but lacks an entry point the `verbs` provider
    /// calls (at the symbol version it was written for).
    #[error("{library} has no {symbol} (symbol version {version}): rdma-core too old or broken")]
    SymbolMissing {
        library: &'static str,
        symbol: &'static str,
        version: &'static str,
    },
}

/// One registered segment of a [`MemoryRegion`]: where it is and its keys.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MrSeg {
    pub addr: u64,
    pub len: u32,
    pub lkey: u32,
    pub rkey: u32,
}

impl MrSeg {
    /// This segment as a peer addresses it.
    pub fn remote(&self) -> RemoteSeg {
        RemoteSeg {
            addr: self.addr,
            rkey: self.rkey,
            len: self.len,
        }
    }
}

/// Local sges covering bytes `[offset, offset+len)` of a region made of
/// `segs` (in order). Returns `None` when the range runs past the end.
pub fn sges_for(segs: &[MrSeg], offset: u64, len: u64) -> Option<SgeList> {
    let mut out = SgeList::new();
    let mut skip = offset;
    let mut left = len;
    for s in segs {
        if left == 0 {
            break;
        }
        let sl = s.len as u64;
        if skip >= sl {
            skip -= sl;
            continue;
        }
        let n = (sl - skip).min(left);
        out.push(Sge {
            addr: s.addr + skip,
            len: n as u32,
            lkey: s.lkey,
        });
        left -= n;
        skip = 0;
    }
    (left == 0).then_some(out)
}

/// Memory registered with a protection domain. It owns the [`SgList`] it
/// was made from (one registration per segment): the memory cannot be freed
/// or touched by anyone else while a provider may access it.
/// [`MemoryRegion::into_sg`] deregisters and gives the list back.
pub trait MemoryRegion: Send {
    /// The registered segments, in list order.
    fn segs(&self) -> &[MrSeg];
    /// Total registered bytes.
    fn len(&self) -> u64 {
        self.segs().iter().map(|s| s.len as u64).sum()
    }
    /// True when nothing is registered.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Local sges for `[offset, offset+len)`.
    fn sges(&self, offset: u64, len: u64) -> Option<SgeList> {
        sges_for(self.segs(), offset, len)
    }
    /// Copies bytes at `offset` into `dst` (control path and tests).
    fn read_at(&self, offset: u64, dst: &mut [u8]) -> usize;
    /// Copies `src` into the region at `offset` (control path and tests).
    fn write_at(&mut self, offset: u64, src: &[u8]) -> usize;
    /// Deregisters and returns the memory.
    fn into_sg(self: Box<Self>) -> SgList;
}

/// A protection domain: registers memory for local and remote access.
pub trait ProtectionDomain: Send + Sync {
    /// Registers every segment of `sg` with `access`; the registration ends
    /// with the region ([`MemoryRegion::into_sg`] or drop).
    fn reg_sg(&self, sg: SgList, access: Access) -> Result<Box<dyn MemoryRegion>, RdmaError>;

    /// The data path's registration: every segment of `sg` as a region with
    /// at least `access`, registered once for the life of its memory rather
    /// than for this transfer where the provider can (the verbs provider
    /// keeps the memory region on the buffer, `ferrite_reactor::buf::
    /// Attachment`, so a pool buffer is registered once and carries its keys
    /// to every later user). [`MemoryRegion::into_sg`] gives the list back
    /// and leaves the memory registered. The default registers for this
    /// transfer only.
    fn map_sg(&self, sg: SgList, access: Access) -> Result<Box<dyn MemoryRegion>, RdmaError> {
        self.reg_sg(sg, access)
    }
}

/// A completion queue: non-blocking polling plus an fd to sleep on.
pub trait CompletionQueue: Send + Sync {
    /// Moves every available completion to `out`; returns how many. Never
    /// blocks.
    fn poll_cq(&self, out: &mut Vec<WorkCompletion>) -> usize;
    /// Readable when completions may be available (re-armed by `poll_cq`).
    fn fd(&self) -> RawFd;
    /// Sleeps until [`CompletionQueue::fd`] is readable or `timeout`
    /// passes (threads without a reactor, tools and tests). True if
    /// readable.
    fn wait(&self, timeout: Duration) -> bool {
        let mut pfd = libc::pollfd {
            fd: self.fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        let ms = timeout.as_millis().min(i32::MAX as u128) as i32;
        // SAFETY: `pfd` is a valid, initialised pollfd that outlives the
        // call, and the count passed is 1.
        let n = unsafe { libc::poll(&mut pfd, 1, ms) };
        n > 0
    }
}

/// A reliable-connected queue pair.
pub trait QueuePair: Send {
    /// The QP number carried in completions.
    fn qp_num(&self) -> u32;
    /// The current state.
    fn state(&self) -> QpState;
    /// Posts a send work request. On a QP in the error state the request
    /// completes with [`WcStatus::WrFlushErr`].
    fn post_send(&self, wr: &SendWr) -> Result<(), PostError>;
    /// Posts a receive.
    fn post_recv(&self, wr: &RecvWr) -> Result<(), PostError>;
    /// Starts a disconnect; both sides flush what is outstanding.
    fn disconnect(&self);
    /// The next connection event, if any (non-blocking).
    fn poll_event(&self) -> Option<ConnEvent>;
}

/// Logs the one line the daemon prints when no RDMA device exists, and
/// tells whether that was the case.
pub fn log_idle_if_empty<T>(devices: &[T]) -> bool {
    if devices.is_empty() {
        tracing::info!("RDMA fabrics idle: no RDMA device found");
        true
    } else {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sges_cover_ranges_across_segments() {
        let segs = [
            MrSeg {
                addr: 1000,
                len: 100,
                lkey: 1,
                rkey: 11,
            },
            MrSeg {
                addr: 5000,
                len: 50,
                lkey: 2,
                rkey: 12,
            },
        ];
        let s = sges_for(&segs, 90, 30).unwrap();
        assert_eq!(
            s.as_slice(),
            &[
                Sge {
                    addr: 1090,
                    len: 10,
                    lkey: 1
                },
                Sge {
                    addr: 5000,
                    len: 20,
                    lkey: 2
                }
            ]
        );
        assert!(sges_for(&segs, 100, 51).is_none());
        assert_eq!(sges_for(&segs, 150, 0).unwrap().len(), 0);
    }

    #[test]
    fn access_flags() {
        let a = Access::LOCAL_WRITE | Access::REMOTE_READ;
        assert!(a.contains(Access::REMOTE_READ));
        assert!(!a.contains(Access::REMOTE_WRITE));
    }
}
