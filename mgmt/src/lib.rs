//! ferrite-mgmt: the management plane of ferrited.
//!
//! Owns the one JSON configuration file ([`config`]): its types, validation
//! and atomic save, and the embedded default configuration.
//!
//! Does not own: opening devices, binding portals or running sessions. The
//! daemon does those; this crate only describes what should exist.
#![forbid(unsafe_code)]

pub mod config;

pub use config::{
    Config, ConfigError, DeviceConfig, GroupConfig, Handler, IscsiParamsConfig, IscsiTargetConfig,
    LunConfig, ReactorConfig, TargetsConfig,
};
