//! ferrite-iscsi: iSCSI over TCP (RFC 7143).
//!
//! Owns: the PDU codec (BHS views, AHS, digests), text key negotiation, the
//! login state machine, the sans-IO connection ([`conn`]) and the TCP driver
//! that runs it on a reactor. Does not own: SCSI semantics (the core) or
//! storage (backends).
#![forbid(unsafe_code)]
