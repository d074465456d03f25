//! ferrite-iser: iSCSI Extensions for RDMA (RFC 7145), the datamover that
//! carries iSCSI over an RDMA queue pair.
//!
//! Owns the iSER wire formats, read in place and built without I/O:
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
//! management, text, logout live in `ferrite-iscsi` and are shared with
//! iSCSI over TCP), the RDMA providers (`ferrite-rdma`) or SCSI (the core).
//!
//! Errors are values: every malformed header or private data is an
//! [`header::HeaderError`] or [`cm::CmError`] naming what was wrong; the
//! datamover answers each by closing that connection with a log line,
//! which no other connection notices.

#![forbid(unsafe_code)]

pub mod cm;
pub mod header;
