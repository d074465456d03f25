//! iSCSI text (`key=value\0...`, RFC 7143 §6.1): what parses encodes back
//! to text that parses to the same pairs (`ferrite_iscsi::fuzzing`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| ferrite_iscsi::fuzzing::text(data));
