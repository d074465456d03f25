//! Every PDU through `Conn::handle_input`: a connection fed arbitrary
//! bytes from its first byte, and one fed them after a completed login.
//! No panic, and the connection never consumes more than it was offered
//! (`ferrite_iscsi::fuzzing`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| ferrite_iscsi::fuzzing::conn_input(data));
