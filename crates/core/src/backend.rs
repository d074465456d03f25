//! The contract between the core and backends: submit, then poll.
//!
//! A backend knows block operations only (read, write, flush, unmap, write
//! zeroes); it knows nothing about CDBs, sense data or mode pages. The control
//! plane ([`Backend`]) is shared by every core; the data plane
//! ([`BackendQueue`]) is opened once per core and used only by that core.
//!
//! Rules every backend follows:
//! - `submit` never completes inline: the completion is returned by a later
//!   `poll`, even if the operation finished at once.
//! - Back-pressure hands the operation back: `Err(Busy(op))`. The core keeps it
//!   and retries after the next `poll`; it is never an error to the initiator.
//! - Buffers are owned: the [`SgList`] of a read or write comes back inside its
//!   [`BlockDone`], whatever the outcome.

use std::os::fd::RawFd;

use ferrite_reactor::buf::SgList;
use ferrite_reactor::pipe::Pipe;

/// Size and shape of a device as the backend sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Geometry {
    /// Logical block size in bytes (512 or 4096).
    pub block_size: u32,
    /// Number of logical blocks.
    pub num_blocks: u64,
    /// Logical blocks per physical block, as a power of two (SBC-4 READ
    /// CAPACITY (16) LOGICAL BLOCKS PER PHYSICAL BLOCK EXPONENT).
    pub phys_exp: u8,
}

impl Geometry {
    /// Capacity in bytes.
    pub fn bytes(&self) -> u64 {
        self.num_blocks * self.block_size as u64
    }
}

/// What a backend can do beyond read and write.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Caps {
    /// `BlockOp::Unmap` deallocates (thin provisioning).
    pub unmap: bool,
    /// `BlockOp::WriteZeroes` is done without a data buffer.
    pub write_zeroes: bool,
    /// Writes honour `fua` (durable before completion).
    pub fua: bool,
    /// The backend has a volatile write cache that `Flush` empties.
    pub write_cache: bool,
    /// Unmapped ranges read back as zeroes (LBPRZ).
    pub unmap_zeroes: bool,
    /// `BlockOp::ReadPipe` is served: read data can be handed over as
    /// references to page-cache pages in a pipe instead of a copy.
    pub read_pipe: bool,
}

/// One block operation. Offsets and lengths are in bytes and are multiples of
/// the logical block size; the core has checked them against the capacity.
#[derive(Debug)]
pub enum BlockOp {
    /// Read `buf.len()` bytes at `offset` into `buf`.
    Read { offset: u64, buf: SgList },
    /// Put `len` bytes at `offset` into `pipe` as page references (only to
    /// backends whose caps say `read_pipe`); the pipe comes back in
    /// [`BlockDone::pipe`] holding exactly `len` bytes on success.
    ReadPipe { offset: u64, len: u32, pipe: Pipe },
    /// Write `buf` at `offset`; with `fua` it is durable before completion.
    Write { offset: u64, buf: SgList, fua: bool },
    /// Make every completed write durable.
    Flush,
    /// Deallocate `[offset, offset+len)`; reads of it return zeroes if the
    /// backend reports `unmap_zeroes`.
    Unmap { offset: u64, len: u64 },
    /// Set `[offset, offset+len)` to zeroes.
    WriteZeroes { offset: u64, len: u64 },
}

/// Why a block operation failed. Each maps to one sense condition in the core.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum BlockError {
    /// EIO and friends: MEDIUM ERROR (UNRECOVERED READ ERROR / WRITE ERROR).
    #[error("I/O error")]
    Io,
    /// ENOSPC on a thin device: SPACE ALLOCATION FAILED WRITE PROTECT.
    #[error("no space left")]
    NoSpace,
    /// The backing store vanished; the LUN goes offline.
    #[error("backing store offline")]
    Offline,
    /// The operation is not supported by this backend.
    #[error("operation not supported")]
    Unsupported,
    /// Any other OS error, by errno.
    #[error("os error {0}")]
    Os(i32),
}

/// The completion of one [`BlockOp`].
#[derive(Debug)]
pub struct BlockDone {
    /// The tag given to `submit`.
    pub tag: u64,
    /// The outcome.
    pub result: Result<(), BlockError>,
    /// The read or write buffer, returned whatever the outcome.
    pub buf: Option<SgList>,
    /// The pipe of a `ReadPipe`, returned whatever the outcome.
    pub pipe: Option<Pipe>,
}

/// Back-pressure: the queue is full; here is the operation back.
#[derive(Debug)]
pub struct Busy<T>(pub T);

/// A control-plane failure (opening a queue, probing a file).
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{0}")]
    Invalid(String),
}

/// The control plane of a backend, shared by every core.
pub trait Backend: Send + Sync {
    /// Current geometry. May change after [`Backend::resync`].
    fn geometry(&self) -> Geometry;
    /// Capabilities.
    fn caps(&self) -> Caps;
    /// Opens a data-plane queue for the calling core.
    fn open_queue(&self, depth: u32) -> Result<Box<dyn BackendQueue>, BackendError>;
    /// Re-reads the size of the backing store; returns the new geometry.
    fn resync(&self) -> Result<Geometry, BackendError> {
        Ok(self.geometry())
    }
    /// Reports which of `[offset, offset+len)` is mapped, as
    /// `(mapped, length_in_bytes)` from `offset`; `None` if unknown. Used by GET
    /// LBA STATUS. Control-path speed is fine.
    fn mapping(&self, _offset: u64, _len: u64) -> Option<(bool, u64)> {
        None
    }
}

/// The data plane of a backend on one core.
pub trait BackendQueue {
    /// Queues an operation; never completes inline.
    fn submit(&mut self, tag: u64, op: BlockOp) -> Result<(), Busy<BlockOp>>;
    /// Moves finished operations into `out`.
    fn poll(&mut self, out: &mut Vec<BlockDone>);
    /// Operations submitted and not yet returned by `poll`.
    fn in_flight(&self) -> usize;
    /// A file descriptor that becomes readable when `poll` has work (an
    /// eventfd), so the reactor can sleep. `None`: the reactor must keep
    /// polling while `in_flight() > 0`.
    fn notify_fd(&self) -> Option<RawFd> {
        None
    }
}
