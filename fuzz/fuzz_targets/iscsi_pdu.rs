//! iSCSI framing: `Pdu::parse` on arbitrary bytes, with and without
//! digests. It never claims more bytes than it was given, and a PDU it
//! parses encodes back to the same header (`ferrite_iscsi::fuzzing`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| ferrite_iscsi::fuzzing::pdu_parse(data));
