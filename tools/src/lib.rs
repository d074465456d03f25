//! ferrite-tools: the project's own initiator library, load generator and
//! benchmarks.
#![forbid(unsafe_code)]
