//! ferrite-tests: end-to-end tests that start `ferrited` and drive it with real
//! initiators (libiscsi's tools, qemu-img) and the project's own initiator.
#![forbid(unsafe_code)]
