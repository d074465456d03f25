//! ferrite-iscsi: iSCSI over TCP (RFC 7143).
//!
//! Owns: CHAP ([`chap`]), the PDU codec ([`pdu`]: BHS views, builders, digests, sequence
//! numbers), text key negotiation ([`keys`]), the login state machine
//! ([`login`]), the session layer ([`session`]: the CmdSN window and MC/S
//! state a session's connections share; [`conn`]: one connection's login,
//! command sequencing, command and response bookkeeping, R2T windows, task
//! management, text, logout, NOP and async messages), the datamover
//! interface under it and its iSCSI/TCP implementation ([`datamover`]), the
//! project's own initiator ([`initiator`], for tools and tests), entry
//! points for fuzz targets ([`fuzzing`]), the portal's login decisions
//! ([`portal`]) and the TCP driver ([`tcp`]) that runs a connection on a
//! reactor, with the pieces every transport's driver shares
//! ([`tcp::decide_session`], [`tcp::open_nexus`], [`tcp::session_event`],
//! [`tcp::complete_orphan`]: `ferrite-iser`'s driver runs its logins and
//! sessions through them). Does not own: SCSI semantics (the core)
//! or storage (backends); everything but the driver reads no clock and
//! opens no socket.
//!
//! # Session layer and datamover
//!
//! [`Conn<D>`](conn::Conn) is the session layer of one connection over a
//! datamover `D` ([`datamover::Datamover`], RFC 7145's primitives). A
//! second transport (iSER) implements the trait:
//!
//! - [`Datamover::enable_datamover`](datamover::Datamover::enable_datamover):
//!   login is over, the operational parameters apply;
//! - [`Datamover::send_control`](datamover::Datamover::send_control):
//!   Send_Control, one PDU (login, text, logout, TMF, NOP-In, Reject, async
//!   message, SCSI Response);
//! - [`Datamover::put_data`](datamover::Datamover::put_data): Put_Data, a
//!   task's read data (TCP: Data-In PDUs, status in the last one; iSER:
//!   RDMA WRITEs);
//! - [`Datamover::get_data`](datamover::Datamover::get_data): Get_Data, one
//!   solicitation of write data (TCP: an R2T; iSER: an RDMA READ);
//! - [`Datamover::is_rdma`](datamover::Datamover::is_rdma): whether the
//!   login negotiates iSER (RDMAExtensions=Yes and the iSER keys);
//! - [`Datamover::max_unexpected_pdus`](datamover::Datamover::max_unexpected_pdus):
//!   the MaxOutstandingUnexpectedPDUs the target declares (iSER: its
//!   posted receives);
//! - [`Datamover::can_splice`](datamover::Datamover::can_splice),
//!   [`Datamover::is_flushed`](datamover::Datamover::is_flushed),
//!   [`Datamover::discard_tx`](datamover::Datamover::discard_tx): whether
//!   page-cache pipes may go out as they are, and the transmit queue.
//!
//! The transport's receive path hands complete PDUs and write data to the
//! session layer; for TCP that is `Conn<TcpDatamover>::handle_input`
//! (`conn/framing.rs`: PDU framing, digests, Data-Out placement), which
//! ends in the session layer's public entry points
//! [`Conn::pdu_received`](conn::Conn::pdu_received),
//! [`Conn::data_out_header`](conn::Conn::data_out_header),
//! [`Conn::data_out_bytes`](conn::Conn::data_out_bytes),
//! [`Conn::unsolicited_data_received`](conn::Conn::unsolicited_data_received)
//! and [`Conn::solicited_data_received`](conn::Conn::solicited_data_received);
//! another transport (`ferrite-iser`) calls them from its own receive path,
//! with [`Conn::input_seen`](conn::Conn::input_seen) and, when the
//! initiator breaks the transport's rules,
//! [`Conn::transport_error`](conn::Conn::transport_error).
//! [`Conn::new`](conn::Conn::new)
//! builds a connection over [`TcpDatamover`](datamover::TcpDatamover),
//! [`Conn::with_datamover`](conn::Conn::with_datamover) over any other.
#![forbid(unsafe_code)]

pub mod chap;
pub mod conn;
pub mod datamover;
pub mod fuzzing;
pub mod initiator;
pub mod keys;
pub mod login;
pub mod pdu;
pub mod portal;
pub mod session;
pub mod tcp;

#[cfg(test)]
mod scenario_tests;

pub use conn::{
    CloseReason, Conn, ConnEvent, IscsiConfig, IscsiTarget, SessionSeq, TxQueue, TxSeg,
};
pub use pdu::{LoginStatus, RejectReason};
