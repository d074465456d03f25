//! The contract between the core and fabrics: plain calls in, actions out.
//!
//! A fabric calls its [`Session`](crate::Session) (`submit`, `data_out_done`,
//! `response_sent`, `task_mgmt`), then drains `poll_action` (or takes the
//! whole queue with `take_actions`) and carries the actions out. The core
//! never calls into a fabric, nothing re-enters, and every scenario can be
//! driven in a unit test without a socket.

use ferrite_reactor::buf::SgList;
use ferrite_reactor::pipe::Pipe;
use ferrite_scsi::{Lun, Sense, Status};
use smallvec::SmallVec;

/// A command's handle inside its session, chosen by the core.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CmdId(pub u32);

/// A task management request's handle inside its session.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TmfId(pub u32);

/// The initiator's tag for a task (iSCSI ITT, SRP tag).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TaskTag(pub u64);

/// Task attribute (SAM-5 §8.6).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum TaskAttr {
    #[default]
    Simple,
    Ordered,
    HeadOfQueue,
    Aca,
}

/// Data direction the transport announced (iSCSI R/W bits, SRP formats).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum DataDir {
    #[default]
    None,
    /// Data-In: target to initiator.
    Read,
    /// Data-Out: initiator to target.
    Write,
    /// Both.
    Bidi,
}

/// A CDB of up to 16 bytes inline; longer ones (iSCSI extended CDB AHS,
/// variable-length CDBs) spill to the heap.
pub type Cdb = SmallVec<[u8; 16]>;

/// One SCSI command as a fabric hands it to the core.
#[derive(Clone, Debug)]
pub struct CmdRequest {
    pub lun: Lun,
    /// The raw 8-byte LUN field, for LUNs [`Lun::decode`] rejects.
    pub lun_raw: [u8; 8],
    pub tag: TaskTag,
    pub cdb: Cdb,
    pub attr: TaskAttr,
    pub dir: DataDir,
    /// Expected data transfer length announced by the transport (iSCSI EDTL).
    /// For Bidi this is the write length.
    pub expected_len: u32,
    /// Expected read length for Bidi commands.
    pub expected_read_len: u32,
}

/// Why write data did not arrive.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Abort {
    /// The connection or channel went away.
    ConnectionLost,
    /// The transport detected a protocol error in the data (digest, offsets).
    TransportError,
    /// The task was aborted by task management.
    Aborted,
}

/// Residual as SAM-5 §5.4 and RFC 7143 §11.4.5 report it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Residual {
    #[default]
    None,
    /// The command transferred this many bytes fewer than expected.
    Underflow(u32),
    /// The command wanted this many bytes more than expected.
    Overflow(u32),
}

/// The outcome of a command.
#[derive(Debug)]
pub struct Response {
    pub status: Status,
    /// Sense data when `status` is CHECK CONDITION, already encoded in the
    /// format the device uses (fixed or descriptor).
    pub sense: Option<SmallVec<[u8; 32]>>,
    /// Data-In to send before the status: the first `data_len` bytes of this
    /// list. The fabric gives the list back to nobody: dropping it returns the
    /// buffers to their pool (after `response_sent`).
    pub data: Option<SgList>,
    /// Bytes of `data` (or of `pipe`) to send.
    pub data_len: u32,
    /// Data-In as file pages in a pipe instead of `data` (only to sessions
    /// that asked for it with `Session::set_pipe_reads`).
    pub pipe: Option<PipeData>,
    /// Residual for the Data-In direction (or the only direction).
    pub residual: Residual,
    /// Residual of the write part of a Bidi command.
    pub bidi_residual: Residual,
}

impl Response {
    /// GOOD status, no data.
    pub fn good() -> Response {
        Response {
            status: Status::GOOD,
            sense: None,
            data: None,
            data_len: 0,
            pipe: None,
            residual: Residual::None,
            bidi_residual: Residual::None,
        }
    }

    /// CHECK CONDITION with fixed-format sense data.
    pub fn check(sense: Sense) -> Response {
        Response {
            status: Status::CHECK_CONDITION,
            sense: Some(SmallVec::from_slice(&sense.to_fixed())),
            data: None,
            data_len: 0,
            pipe: None,
            residual: Residual::None,
            bidi_residual: Residual::None,
        }
    }

    /// A status without sense data (BUSY, RESERVATION CONFLICT, TASK SET FULL).
    pub fn status(status: Status) -> Response {
        Response {
            status,
            ..Response::good()
        }
    }
}

/// Read data handed over as page-cache pages in a pipe.
///
/// The pages are the file's own, so a write to those blocks lands in them
/// even after the response has left. A write the initiator issues after it
/// saw the response cannot be early: the status comes after the data. A
/// write that only waited in the task set for this read (SAM-5 §8.6: an
/// ORDERED task, or any task behind one) could be; such a write waits until
/// `hold` is dropped, which the fabric does once the initiator has shown it
/// received the response (iSCSI: its ExpStatSN passed the response's
/// StatSN), or the connection is gone.
#[derive(Debug)]
pub struct PipeData {
    /// The pipe, holding exactly the response's `data_len` bytes.
    pub pipe: Pipe,
    /// Released when the initiator has the data.
    pub hold: DeliveryHold,
}

/// Marks a response as not yet delivered; released on drop.
pub struct DeliveryHold {
    release: Option<Box<dyn FnOnce()>>,
}

impl DeliveryHold {
    /// A hold whose release is `f`, run once when the hold is dropped.
    pub fn on_drop(f: impl FnOnce() + 'static) -> DeliveryHold {
        DeliveryHold {
            release: Some(Box::new(f)),
        }
    }
}

impl std::fmt::Debug for DeliveryHold {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("DeliveryHold")
    }
}

impl Drop for DeliveryHold {
    fn drop(&mut self) {
        if let Some(f) = self.release.take() {
            f();
        }
    }
}

/// Task management functions (SAM-5 §7).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TmfFunction {
    AbortTask {
        tag: TaskTag,
    },
    AbortTaskSet,
    ClearTaskSet,
    ClearAca,
    LogicalUnitReset,
    ItNexusReset,
    /// Target warm reset (iSCSI TARGET WARM RESET, SRP has none).
    TargetReset,
    QueryTask {
        tag: TaskTag,
    },
    QueryTaskSet,
    QueryAsyncEvent,
}

/// A task management request.
#[derive(Clone, Copy, Debug)]
pub struct TmfRequest {
    pub func: TmfFunction,
    pub lun: Lun,
    /// The TMF's own tag.
    pub tag: TaskTag,
}

/// Task management service responses (SAM-5 §7.1).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TmfResponse {
    /// FUNCTION COMPLETE.
    Complete,
    /// FUNCTION SUCCEEDED (QUERY TASK: the task exists).
    Succeeded,
    /// FUNCTION REJECTED / not supported.
    Rejected,
    /// INCORRECT LOGICAL UNIT NUMBER.
    IncorrectLun,
    /// The referenced task does not exist (iSCSI response 1).
    TaskNotFound,
    /// SERVICE DELIVERY OR TARGET FAILURE.
    Failed,
}

/// What the core asks the fabric to do.
#[derive(Debug)]
pub enum Action {
    /// Move write data into `buf[offset..offset+len]` (iSCSI: R2T and Data-Out,
    /// including data already received unsolicited; SRP/iSER: RDMA READ), then
    /// call `data_out_done(id, Ok(buf))`.
    FetchData {
        id: CmdId,
        tag: TaskTag,
        buf: SgList,
        offset: u32,
        len: u32,
    },
    /// Send the data (if any) and the status; then call `response_sent(id)`.
    Respond {
        id: CmdId,
        tag: TaskTag,
        rsp: Response,
    },
    /// Send the task management response.
    TmfDone {
        id: TmfId,
        tag: TaskTag,
        rsp: TmfResponse,
    },
    /// An asynchronous event for `lun` (iSCSI Async Message, SRP_AER_REQ).
    /// A fabric that cannot deliver it drops it: the core keeps the unit
    /// attention pending either way.
    Aen { lun: Lun, sense: Sense },
    /// The core ends the nexus (e.g. TARGET COLD RESET, target removed):
    /// the fabric logs the session out or drops its connections.
    Close,
    /// A command waits for the [`DeliveryHold`]s of earlier responses: the
    /// fabric makes the initiator show what it has received (iSCSI: a
    /// NOP-In ping, answered with ExpStatSN). Only sessions that take pipe
    /// data see it.
    ConfirmDelivery,
}
