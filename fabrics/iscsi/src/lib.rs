//! ferrite-iscsi: iSCSI over TCP (RFC 7143).
//!
//! Owns: CHAP ([`chap`]), the PDU codec ([`pdu`]: BHS views, builders, digests, sequence
//! numbers), text key negotiation ([`keys`]), the login state machine
//! ([`login`]), the sans-IO connection ([`conn`]), the project's own
//! initiator ([`initiator`], for tools and tests), entry points for fuzz
//! targets ([`fuzzing`]) and the TCP driver ([`tcp`]) that runs a connection
//! on a reactor. Does not own: SCSI semantics (the core) or storage
//! (backends); everything but the driver reads no clock and opens no socket.
#![forbid(unsafe_code)]

pub mod chap;
pub mod conn;
pub mod datamover;
pub mod fuzzing;
pub mod initiator;
pub mod keys;
pub mod login;
pub mod pdu;
pub mod session;
pub mod tcp;

#[cfg(test)]
mod scenario_tests;

pub use conn::{
    CloseReason, Conn, ConnEvent, IscsiConfig, IscsiTarget, SessionSeq, TxQueue, TxSeg,
};
pub use pdu::{LoginStatus, RejectReason};
