//! ferrite-tools: the side-by-side benchmark (`ferrite-bench`) and the
//! pieces it is built from: a pipelined load generator over the project's
//! own iSCSI initiator (`ferrite_iscsi::initiator`), a driver and parser for
//! libiscsi's `iscsi-perf`, start/stop of the targets compared (ferrited,
//! tgtd, istgt) on loopback, the loopback ceiling, `/proc` sampling, the
//! statistics (median and spread, percentiles, least squares) and the SVG
//! plot.
//!
//! It owns no protocol: PDUs and login come from `ferrite-iscsi`. It does
//! not own `tools/test-all` or `tools/install-test-deps` (the test runner).
//! Benchmarks here report numbers; nothing in them asserts on timing.
#![forbid(unsafe_code)]

pub mod ceiling;
pub mod iscsi_perf;
pub mod load;
pub mod peers;
pub mod plot;
pub mod procfs;
pub mod stats;
