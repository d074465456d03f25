//! ferrite-mgmt: the management plane of ferrited.
//!
//! Owns:
//! - the one JSON configuration file ([`config`]): its types, validation,
//!   atomic save and the embedded default configuration;
//! - the object tree shaped like SCST's sysfs ([`tree`]) with SCST's `mgmt`
//!   commands, whose model is a [`Config`];
//! - configuration changes and the `apply` plan between two configurations
//!   ([`change`]);
//! - the seam to the running system, [`Runtime`], which the daemon
//!   implements ([`runtime`]);
//! - the control socket server ([`server`]) and its JSON-lines protocol;
//! - the `scst.conf` importer ([`scst`]) and the `ferritectl` binary;
//! - the manual pages of ferrited and ferritectl, rendered from their clap
//!   definitions ([`manpage`]);
//! - the optional Prometheus listener ([`metrics`]) rendering
//!   [`Runtime::stats`].
//!
//! Does not own: opening devices, binding portals or running sessions. The
//! daemon does those when the tree asks it to, through [`Runtime`].
#![forbid(unsafe_code)]

pub mod change;
pub mod config;
pub mod lio;
pub mod manpage;
pub mod metrics;
pub mod runtime;
pub mod scst;
pub mod server;
pub mod tree;
pub mod view;

pub use change::{Change, plan};
pub use config::{
    ChapUser, Config, ConfigError, DeviceConfig, Digest, GroupConfig, Handler, IscsiParamsConfig,
    IscsiTargetConfig, LunConfig, ReactorConfig, TargetsConfig,
};
pub use lio::import_lio;
pub use metrics::MetricsServer;
pub use runtime::{
    DeviceAttr, FakeRuntime, IoDir, IoStats, LatencyHistogram, Runtime, RuntimeError, SessionInfo,
    Stats, TargetAttr,
};
pub use scst::{Import, ImportError, import_scst};
pub use server::{ControlServer, Request, Response, serve};
pub use tree::{AttrValue, Entry, EntryKind, MgmtError, Tree};
