//! ferrite-core: the target core, what SCST's `scst` module is.
//!
//! Owns every SCSI-visible behaviour: devices and their identity, LUN maps and
//! access groups, sessions (I_T nexuses) with a task set per LUN, task
//! management, unit attentions and AENs, the SPC-4/SBC-4 emulation, and
//! per-device and per-session command statistics ([`stats`]).
//! It is sans-IO: no sockets, no threads, no clock (time is an argument).
//!
//! Layout: [`cmd`], [`backend`] and [`device`] are the contracts with
//! fabrics, backends and management; [`emulate`] is the SCSI emulation as
//! pure functions, over `ops`, one row per implemented command (its CDB
//! usage data for REPORT SUPPORTED OPERATION CODES and how it stands
//! against unit attentions, reservations, a missing medium, a sanitize and
//! persistent reservations), which every gate reads; [`shard`] is the per-core state machine ([`Shard`],
//! [`Session`]) that orders, executes, aborts and answers commands;
//! [`xcopy`] is the copy manager (EXTENDED COPY, RECEIVE COPY RESULTS) the
//! shard runs copies inside the target with; [`pr`] holds persistent
//! reservations (registrations by TransportID, REGISTER AND MOVE, APTPL
//! state); [`sanitize`] is SANITIZE and the per-device sanitize operation
//! the shard carries out; [`alua`] holds the device groups and target port
//! groups of asymmetric logical unit access.
//!
//! Does not own: transports (fabrics call [`Session`] and carry out the
//! [`Action`]s it returns) or storage (backends implement
//! [`backend::Backend`] and are driven through per-core
//! [`backend::BackendQueue`]s).
#![forbid(unsafe_code)]

pub mod alua;
pub mod backend;
pub mod budget;
pub mod cmd;
pub mod device;
pub mod emulate;
mod ops;
pub mod pr;
pub mod sanitize;
pub mod shard;
pub mod stats;
#[cfg(test)]
mod testing;
pub mod xcopy;

pub use cmd::{
    Abort, Action, Cdb, CmdId, CmdRequest, DataDir, DeliveryHold, PipeData, Residual, Response,
    TaskAttr, TaskTag, TmfFunction, TmfId, TmfRequest, TmfResponse,
};
pub use shard::{Nexus, RemoteResetId, ResetScope, Session, SessionId, Shard};
pub use stats::{
    DeviceStats, IoDir, IoStats, LatencyHistogram, SessionStats, ShardStats, SizeClass,
};
