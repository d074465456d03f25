//! Arbitrary Sends and RDMA completions through an iSER connection, one
//! still logging in and two in full feature phase
//! (`ferrite_iser::fuzzing::conn_input`). No panic; every Send the target
//! makes starts with its iSER header, no RDMA WRITE runs past its data,
//! and the unexpected PDUs outstanding never exceed the limit.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| ferrite_iser::fuzzing::conn_input(data));
