//! ferrite-nullio: a backend with no storage (reads return zeroes, writes
//! vanish), the measure of the target's own cost; and a `mem` mode that keeps
//! written data in RAM (sparse), for tests.
#![forbid(unsafe_code)]
