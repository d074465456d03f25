//! ferrite-iser: iSCSI Extensions for RDMA (RFC 7145), the datamover that
//! carries iSCSI over an RDMA queue pair.
//!
//! Owns:
//!
//! - [`datamover`]: [`datamover::IserDatamover`], `ferrite_iscsi`'s
//!   `Datamover` for RDMA: control PDUs as Sends behind the iSER header
//!   (Send with Invalidate for a command's SCSI Response where the
//!   initiator allows), read data by RDMA WRITE, solicited write data by
//!   RDMA READ, no R2T or Data-In PDU on the wire, no digests; sans-IO, it
//!   queues [`datamover::Transmit`]s.
//! - [`conn`]: [`conn::IserConn`], the session layer over that datamover
//!   and iSER's receive path: each received Send checked against the
//!   receive size advertised and the unexpected-PDU limit, split and fed
//!   to the session layer; RDMA READ completions fed back as its
//!   Data_Completion_Notify. Sans-IO.
//! - `driver` (the `verbs` feature): the reactor driver, RDMA CM
//!   listeners on the iSER portals, the CM exchange, each connection's
//!   queue pair and completion queue, and the pump between connections
//!   and their core sessions; logins decided by iSCSI's portal code.
//! - [`fuzzing`]: entry points for the cargo-fuzz targets in `fuzz/`.
//! - [`qp`]: [`qp::IserQp`], the driver of one connection's queue pair
//!   (receive and send buffers registered once and kept for the next
//!   connection, [`qp::QpBuffers`]; work requests, completions,
//!   back-pressure of a full send queue), provider-neutral.
//!
//! and the iSER wire formats, read in place and built without I/O:
//!
//! - [`header`]: the 28-byte iSER header in front of every iSCSI PDU sent
//!   as an RDMA Send, with the initiator's STags and base
//!   offsets for the data the target moves by RDMA WRITE (Data-In) and
//!   RDMA READ (solicited Data-Out); the Hello and HelloReply messages
//!   which iSER over RDMA CM does not use and a target refuses;
//!   and [`header::split_send`], which checks one received Send against the
//!   receive size the connection advertised and splits it into header and
//!   PDU.
//! - [`cm`]: the private data of the RDMA CM connection request and reply:
//!   whether the initiator supports zero-based virtual addressing
//!   and Send with Invalidate, and what the target will use.
//!
//! Does not own: the iSCSI session layer (login, negotiation, CmdSN, task
//! management, text, logout and the portal's login decisions live in
//! `ferrite-iscsi` and are shared with iSCSI over TCP), the RDMA providers
//! (`ferrite-rdma`), SCSI (the core) or configuration (the daemon).
//!
//! Errors are values: every malformed header or private data is an
//! [`header::HeaderError`] or [`cm::CmError`] naming what was wrong; the
//! datamover answers each by closing that connection with a log line,
//! which no other connection notices.

#![forbid(unsafe_code)]

pub mod cm;
pub mod conn;
pub mod datamover;
#[cfg(feature = "verbs")]
pub mod driver;
pub mod fuzzing;
pub mod header;
pub mod qp;

#[cfg(test)]
mod tests;
