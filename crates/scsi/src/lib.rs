//! ferrite-scsi: what the SCSI standards (SAM-5, SPC-4, SBC-4) say about bytes.
//!
//! Owns: LUN encoding, status codes, sense data (one table of named sense
//! constants; fixed and descriptor formats), opcodes, CDB decoding (errors are
//! `Sense` values with the field pointer set) and the builders of parameter
//! data (INQUIRY and VPD pages, mode pages, READ CAPACITY, REPORT LUNS,
//! REPORT SUPPORTED OPERATION CODES, third-party copy parameter lists and
//! results).
//! Does not own: any state. Every function here is pure; what a command does to
//! a device lives in `ferrite-core`.
#![forbid(unsafe_code)]

pub mod capacity;
pub mod cdb;
pub mod inquiry;
pub mod lun;
pub mod mode;
pub mod opcode;
pub mod opcodes;
pub mod sense;
pub mod status;
pub mod xcopy;

pub use lun::Lun;
pub use opcode::Opcode;
pub use sense::{Sense, SenseData, SenseKey};
pub use status::Status;
