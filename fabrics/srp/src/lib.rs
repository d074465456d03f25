//! ferrite-srp: the SCSI RDMA Protocol target.
#![forbid(unsafe_code)]
