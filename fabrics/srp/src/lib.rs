//! ferrite-srp: the SCSI RDMA Protocol target (T10 SRP r16a), what SCST's
//! `ib_srpt` is.
#![forbid(unsafe_code)]

pub mod channel;
pub mod initiator;
pub mod iu;
pub mod target;
