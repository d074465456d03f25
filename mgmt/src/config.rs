//! The one JSON configuration file: serde types, validation and the atomic
//! save.
//!
//! A minimal file works: every field but the names has a default, and unknown
//! fields are refused so that a typo is an error instead of a silently ignored
//! setting. [`Config::validate`] names the JSON path of the first problem it
//! finds and what would be valid there.
//!
//! This module does not open devices, bind portals or create image files: it
//! only describes them. The daemon does the work.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::net::SocketAddr;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};

/// Highest LUN number a map may use plus one (SAM-5 §4.7: flat space
/// addressing carries 14 bits).
pub const MAX_LUNS: u16 = 16384;

/// RFC 7143 §4.2.7.1: an iSCSI name is at most 223 bytes.
pub const MAX_ISCSI_NAME_LEN: usize = 223;

/// The IQN of the target [`Config::embedded_default`] creates.
pub const DEFAULT_TARGET_IQN: &str = "iqn.2026-11.org.ferrite:default";

/// Size of the image [`Config::embedded_default`] creates: 1 GiB.
pub const DEFAULT_IMAGE_SIZE: u64 = 1 << 30;

/// Top octet of a derived EUI-64: the U/L bit set (locally administered)
/// and the SLAP quadrant of an administratively assigned identifier
/// (IEEE 802c: Z = 0, Y = 0), so a derived EUI-64 cannot be any company's
/// (whose identifiers keep the U/L bit clear). The high nibble carries
/// name bits.
pub const DERIVED_EUI64_LOCAL: u8 = 0x02;

/// Why a configuration could not be loaded, validated or saved.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The file is not JSON of the expected shape. `at` is the JSON path
    /// (`devices[1].blocksize`) where parsing stopped.
    #[error("{file}: at {at} (line {line}, column {column}): {msg}")]
    Parse {
        file: String,
        at: String,
        line: usize,
        column: usize,
        msg: String,
    },
    /// The file parsed but says something impossible. `at` is the JSON path
    /// of the offending value.
    #[error("{at}: {msg}")]
    Invalid { at: String, msg: String },
}

impl ConfigError {
    fn invalid(at: impl Into<String>, msg: impl Into<String>) -> ConfigError {
        ConfigError::Invalid {
            at: at.into(),
            msg: msg.into(),
        }
    }
}

/// The device handlers, named as SCST names them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Handler {
    /// Buffered file I/O through the page cache.
    #[serde(rename = "vdisk_fileio")]
    VdiskFileio,
    /// O_DIRECT I/O on a block device or file.
    #[serde(rename = "vdisk_blockio")]
    VdiskBlockio,
    /// No storage: reads return zeros, writes vanish (or stay in RAM with `mem`).
    #[serde(rename = "vdisk_nullio")]
    VdiskNullio,
}

impl Handler {
    pub const ALL: [Handler; 3] = [
        Handler::VdiskFileio,
        Handler::VdiskBlockio,
        Handler::VdiskNullio,
    ];

    /// The SCST name (`vdisk_fileio`).
    pub fn name(self) -> &'static str {
        match self {
            Handler::VdiskFileio => "vdisk_fileio",
            Handler::VdiskBlockio => "vdisk_blockio",
            Handler::VdiskNullio => "vdisk_nullio",
        }
    }

    /// Parses an SCST handler name.
    pub fn from_name(s: &str) -> Option<Handler> {
        Handler::ALL.into_iter().find(|h| h.name() == s)
    }

    /// Whether the handler stores blocks in `filename`.
    pub fn needs_filename(self) -> bool {
        !matches!(self, Handler::VdiskNullio)
    }

    /// Default INQUIRY product identification.
    fn default_product(self) -> &'static str {
        match self {
            Handler::VdiskFileio => "VDISK FILEIO",
            Handler::VdiskBlockio => "VDISK BLOCKIO",
            Handler::VdiskNullio => "VDISK NULLIO",
        }
    }
}

impl fmt::Display for Handler {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

fn default_blocksize() -> u32 {
    512
}
fn default_true() -> bool {
    true
}
fn default_tpgt() -> u16 {
    1
}
fn is_false(b: &bool) -> bool {
    !*b
}
fn is_default_blocksize(b: &u32) -> bool {
    *b == default_blocksize()
}

/// The whole configuration of one ferrited.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    pub devices: Vec<DeviceConfig>,
    pub targets: TargetsConfig,
    pub iscsi: IscsiParamsConfig,
    pub reactor: ReactorConfig,
    /// ALUA device groups (SCST's `DEVICE_GROUP`): devices that change
    /// access state together, seen through target port groups.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub device_groups: Vec<DeviceGroupConfig>,
    /// The HA cluster this ferrited is a node of: which node owns each
    /// device group, and the persistent reservations of its devices, live
    /// in etcd (docs/cluster.md).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cluster: Option<ClusterConfig>,
}

/// A node of an HA cluster whose state is kept in etcd.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterConfig {
    /// This node's name, as target groups name their node (`ferrited
    /// --node` overrides it, so both nodes may share one file).
    pub node: String,
    /// etcd client URLs (`http://HOST:PORT`), tried in turn.
    pub etcd: Vec<String>,
    /// The key prefix of this cluster in etcd.
    #[serde(default = "default_cluster_prefix")]
    pub prefix: String,
    /// The node's lease in seconds: how long after its last renewal the
    /// other node may take its device groups over, and how long a node cut
    /// off from etcd goes on serving as owner.
    #[serde(default = "default_lease_ttl_s")]
    pub lease_ttl_s: u32,
}

fn default_cluster_prefix() -> String {
    "/ferrite".into()
}

fn default_lease_ttl_s() -> u32 {
    5
}

/// An ALUA device group (SPC-4 §5.15, SCST's `/device_groups/<name>`): its
/// devices have one asymmetric access state per target port group.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeviceGroupConfig {
    /// Object name (`/device_groups/<name>`).
    pub name: String,
    /// Device names; a device is in at most one device group.
    #[serde(default)]
    pub devices: Vec<String>,
    #[serde(default)]
    pub target_groups: Vec<TargetGroupConfig>,
}

/// A target port group of a device group: target ports (iSCSI targets or
/// SRP ports, by name) that report one access state for the group's
/// devices.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TargetGroupConfig {
    /// Object name, unique within its device group.
    pub name: String,
    /// TARGET PORT GROUP identifier (SPC-4 §7.8.6.8): 1 to 65535, unique
    /// within its device group.
    pub group_id: u32,
    /// The asymmetric access state, by SCST's name: `active`,
    /// `nonoptimized`, `standby`, `unavailable`, `offline`,
    /// `transitioning`. A state saved by the running system (SET TARGET
    /// PORT GROUPS, management) under the state directory wins at start.
    #[serde(default = "default_alua_state")]
    pub state: String,
    /// The PREF bit of REPORT TARGET PORT GROUPS.
    #[serde(default, skip_serializing_if = "is_false")]
    pub preferred: bool,
    /// Target names (iSCSI target names or SRP port names); a target is in
    /// at most one target group of a device group.
    #[serde(default)]
    pub targets: Vec<String>,
    /// Relative target port ids of ports this ferrited does not serve (an
    /// HA peer's targets): reported in the group, served elsewhere.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rel_tgt_ids: Vec<u16>,
    /// The cluster node whose ports these are (`cluster.node`). The
    /// states of a device group with such target groups follow the
    /// cluster: the owner's groups active/optimized, the other nodes'
    /// active/non-optimized, a node cut off from etcd standby.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
}

/// The access state a target group has when none is configured.
pub const DEFAULT_ALUA_STATE: &str = "active";

fn default_alua_state() -> String {
    DEFAULT_ALUA_STATE.into()
}

impl TargetGroupConfig {
    /// A target group in the default state, not preferred, with no target.
    pub fn new(name: impl Into<String>, group_id: u32) -> TargetGroupConfig {
        TargetGroupConfig {
            name: name.into(),
            group_id,
            state: default_alua_state(),
            preferred: false,
            targets: Vec::new(),
            rel_tgt_ids: Vec::new(),
            node: None,
        }
    }

    /// The configured state (validated: see [`Config::validate`]); an
    /// unknown name reads as active/optimized.
    pub fn access_state(&self) -> ferrite_core::alua::AccessState {
        ferrite_core::alua::AccessState::parse(&self.state)
            .unwrap_or(ferrite_core::alua::AccessState::ActiveOptimized)
    }
}

impl ClusterConfig {
    fn validate(&self) -> Result<(), ConfigError> {
        if self.node.is_empty() {
            return Err(ConfigError::invalid(
                "cluster.node",
                "empty; this node's name",
            ));
        }
        if self.etcd.is_empty() {
            return Err(ConfigError::invalid(
                "cluster.etcd",
                "no endpoint; etcd client URLs such as http://127.0.0.1:2379",
            ));
        }
        for (i, e) in self.etcd.iter().enumerate() {
            let rest = e.strip_prefix("http://").unwrap_or("");
            if rest.is_empty() || rest.contains(char::is_whitespace) {
                return Err(ConfigError::invalid(
                    format!("cluster.etcd[{i}]"),
                    format!("{e:?} is not an http://HOST:PORT URL"),
                ));
            }
        }
        if !self.prefix.starts_with('/') || self.prefix.ends_with('/') {
            return Err(ConfigError::invalid(
                "cluster.prefix",
                format!(
                    "{:?}: a key prefix starts with / and does not end with one",
                    self.prefix
                ),
            ));
        }
        if !(2..=600).contains(&self.lease_ttl_s) {
            return Err(ConfigError::invalid(
                "cluster.lease_ttl_s",
                format!("{}; valid: 2 to 600 seconds", self.lease_ttl_s),
            ));
        }
        Ok(())
    }
}

impl DeviceGroupConfig {
    /// Whether the cluster decides this group's states: one of its target
    /// groups names a node.
    pub fn clustered(&self) -> bool {
        self.target_groups.iter().any(|t| t.node.is_some())
    }

    /// An empty device group.
    pub fn new(name: impl Into<String>) -> DeviceGroupConfig {
        DeviceGroupConfig {
            name: name.into(),
            devices: Vec::new(),
            target_groups: Vec::new(),
        }
    }

    pub fn target_group(&self, name: &str) -> Option<&TargetGroupConfig> {
        self.target_groups.iter().find(|g| g.name == name)
    }
}

/// One device (logical unit) and its backend.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeviceConfig {
    /// Unique device name (`[A-Za-z0-9_.-]`, at most 64 characters).
    pub name: String,
    pub handler: Handler,
    /// Backing file or block device (fileio, blockio).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub filename: Option<PathBuf>,
    /// Size in bytes: the capacity of a nullio device, or the size to create
    /// a missing fileio image with (sparse).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<u64>,
    /// Logical block size: 512 or 4096.
    #[serde(
        default = "default_blocksize",
        skip_serializing_if = "is_default_blocksize"
    )]
    pub blocksize: u32,
    #[serde(default, skip_serializing_if = "is_false")]
    pub read_only: bool,
    #[serde(default, skip_serializing_if = "is_false")]
    pub write_through: bool,
    #[serde(default, skip_serializing_if = "is_false")]
    pub thin_provisioned: bool,
    #[serde(default, skip_serializing_if = "is_false")]
    pub rotational: bool,
    /// Ignore SYNCHRONIZE CACHE (battery-backed cache).
    #[serde(default, skip_serializing_if = "is_false")]
    pub nv_cache: bool,
    /// Removable medium (INQUIRY RMB = 1), like SCST's vdisk `removable`:
    /// START STOP UNIT ejects and loads it, PREVENT ALLOW MEDIUM REMOVAL
    /// holds it in. Fixed when the device is created.
    #[serde(default, skip_serializing_if = "is_false")]
    pub removable: bool,
    /// nullio only: keep written data in RAM.
    #[serde(default, skip_serializing_if = "is_false")]
    pub mem: bool,
    /// Unit serial number (VPD 80h); derived from the name when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub serial: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub t10_vendor: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub t10_product: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub t10_revision: Option<String>,
    /// NAA designator (VPD 83h): 16 hex digits of NAA 2, 3 or 5, or 32 of
    /// NAA 6 (`"0x6001405..."` or `"6001405..."`); derived from the name
    /// (NAA 3, locally assigned) when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub naa: Option<String>,
    /// EUI-64 based designator: 16, 24 or 32 hex digits; derived from the
    /// name (a locally administered EUI-64) when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eui64: Option<String>,
    /// Vendor specific identifier of the T10 vendor ID based designator,
    /// after the vendor; the serial when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub t10_id: Option<String>,
    /// Standard INQUIRY vendor specific bytes 36..55, at most 20
    /// characters; zeros when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vendor_specific: Option<String>,
    /// SCSI name string designator of the logical unit; none when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lu_name: Option<String>,
    /// The VPD 83h designators in order, comma separated: `naa`, `t10`,
    /// `eui64`, `lu_name`, `rel_port`, `port_group=N`, `lu_group=N`,
    /// `port_name`, `target_name`; when absent
    /// `naa,t10,eui64,rel_port,target_name`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vpd83: Option<String>,
    /// Fault injection, for tests: see [`FaultConfig`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fault: Option<FaultConfig>,
}

/// Fault injection on one device (SCST-style debug fault injection): the
/// backend is wrapped so chosen operations fail with a given error or are
/// delayed. A test instrument; never set on a production device.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FaultConfig {
    /// Rules in order; the first firing rule with an error decides the error.
    pub rules: Vec<FaultRuleConfig>,
}

/// Which block operations a fault rule applies to.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FaultOp {
    Read,
    /// Writes, unmaps and write-zeroes.
    Write,
    Flush,
    #[default]
    Any,
}

/// The error a fault rule injects.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FaultError {
    /// EIO: MEDIUM ERROR (UNRECOVERED READ ERROR or WRITE ERROR).
    Eio,
    /// ENOSPC: DATA PROTECT, SPACE ALLOCATION FAILED WRITE PROTECT.
    Enospc,
    /// The backing store vanished: NOT READY.
    Offline,
}

/// One fault rule: operations of kind `op` touching `[lba, lba+blocks)`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FaultRuleConfig {
    #[serde(default)]
    pub op: FaultOp,
    #[serde(default)]
    pub lba: u64,
    /// Blocks in the range; absent: to the end of the device.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub blocks: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<FaultError>,
    /// Delay before the operation runs (or fails), in milliseconds.
    #[serde(default)]
    pub delay_ms: u64,
    /// Matching operations let through before the rule fires.
    #[serde(default)]
    pub after: u64,
    /// Times the rule fires; absent: every time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub count: Option<u64>,
}

/// Longest injectable delay: 60 s.
pub const MAX_FAULT_DELAY_MS: u64 = 60_000;

impl FaultConfig {
    fn validate(&self, at: &str) -> Result<(), ConfigError> {
        if self.rules.is_empty() {
            return Err(ConfigError::invalid(
                format!("{at}.rules"),
                "a fault section needs at least one rule",
            ));
        }
        for (i, r) in self.rules.iter().enumerate() {
            let here = format!("{at}.rules[{i}]");
            if r.error.is_none() && r.delay_ms == 0 {
                return Err(ConfigError::invalid(
                    here,
                    "a rule needs an error (eio, enospc, offline) or a delay_ms",
                ));
            }
            if r.delay_ms > MAX_FAULT_DELAY_MS {
                return Err(ConfigError::invalid(
                    format!("{here}.delay_ms"),
                    format!(
                        "{} is too long; valid: 0 to {MAX_FAULT_DELAY_MS}",
                        r.delay_ms
                    ),
                ));
            }
            if r.blocks == Some(0) {
                return Err(ConfigError::invalid(
                    format!("{here}.blocks"),
                    "0 blocks; give a positive count or leave it out (to the end)",
                ));
            }
            if r.error == Some(FaultError::Enospc) && matches!(r.op, FaultOp::Read | FaultOp::Flush)
            {
                return Err(ConfigError::invalid(
                    format!("{here}.error"),
                    "enospc applies to writes; use op write or any",
                ));
            }
            if r.count == Some(0) {
                return Err(ConfigError::invalid(
                    format!("{here}.count"),
                    "a rule that fires 0 times does nothing; leave count out for always",
                ));
            }
        }
        Ok(())
    }
}

impl DeviceConfig {
    /// A device with every optional setting at its default.
    pub fn new(name: impl Into<String>, handler: Handler) -> DeviceConfig {
        DeviceConfig {
            name: name.into(),
            handler,
            filename: None,
            size: None,
            blocksize: default_blocksize(),
            read_only: false,
            write_through: false,
            thin_provisioned: false,
            rotational: false,
            nv_cache: false,
            removable: false,
            mem: false,
            serial: None,
            t10_vendor: None,
            t10_product: None,
            t10_revision: None,
            naa: None,
            eui64: None,
            t10_id: None,
            vendor_specific: None,
            lu_name: None,
            vpd83: None,
            fault: None,
        }
    }

    fn name_hash(&self) -> [u8; 32] {
        let mut h = Sha256::new();
        h.update(b"ferrite-device:");
        h.update(self.name.as_bytes());
        h.finalize().into()
    }

    /// The serial number: configured, or 16 hex digits derived from the name
    /// (stable across restarts).
    pub fn effective_serial(&self) -> String {
        match &self.serial {
            Some(s) => s.clone(),
            None => {
                let h = self.name_hash();
                h[..8].iter().map(|b| format!("{b:02x}")).collect()
            }
        }
    }

    /// The NAA designator: configured, or NAA 3 (locally assigned, SPC-4
    /// §7.8.6.6.3) with 60 bits derived from the name, which no company's
    /// NAA 5 or 6 can equal.
    pub fn effective_naa(&self) -> Vec<u8> {
        if let Some(v) = self
            .naa
            .as_deref()
            .and_then(|n| parse_hex_bytes(n, &[8, 16]))
        {
            return v;
        }
        let h = self.name_hash();
        let mut v = h[8..16].to_vec();
        v[0] = 0x30 | (v[0] & 0x0f);
        v
    }

    /// The EUI-64 designator: configured, or a locally administered EUI-64
    /// ([`DERIVED_EUI64_LOCAL`]) with 60 bits derived from the name.
    pub fn effective_eui64(&self) -> Vec<u8> {
        if let Some(v) = self
            .eui64
            .as_deref()
            .and_then(|e| parse_hex_bytes(e, &[8, 12, 16]))
        {
            return v;
        }
        let h = self.name_hash();
        let mut v = h[16..24].to_vec();
        v[0] = (v[0] & 0xf0) | DERIVED_EUI64_LOCAL;
        v
    }

    /// The VPD 83h layout: configured, or empty (the core's default).
    pub fn effective_vpd83(&self) -> Vec<ferrite_core::device::Vpd83> {
        let words = self.vpd83.as_deref().unwrap_or("");
        words
            .split(',')
            .map(str::trim)
            .filter(|w| !w.is_empty())
            .filter_map(ferrite_core::device::Vpd83::parse)
            .collect()
    }

    /// The SCSI identity the core reports (INQUIRY, VPD 80h, 83h).
    pub fn identity(&self) -> ferrite_core::device::Identity {
        ferrite_core::device::Identity {
            vendor: self.t10_vendor.clone().unwrap_or_else(|| "FERRITE".into()),
            product: self
                .t10_product
                .clone()
                .unwrap_or_else(|| self.handler.default_product().into()),
            revision: self.t10_revision.clone().unwrap_or_else(|| "0001".into()),
            vendor_specific: self.vendor_specific.clone().unwrap_or_default(),
            serial: self.effective_serial(),
            t10_id: self.t10_id.clone().unwrap_or_default(),
            naa: self.effective_naa(),
            eui64: self.effective_eui64(),
            lu_name: self.lu_name.clone().unwrap_or_default(),
            layout: self.effective_vpd83(),
        }
    }

    /// The settings the core keeps per device.
    pub fn flags(&self) -> ferrite_core::device::DeviceFlags {
        ferrite_core::device::DeviceFlags {
            read_only: self.read_only,
            write_through: self.write_through,
            thin_provisioned: self.thin_provisioned,
            rotational: self.rotational,
            nv_cache: self.nv_cache,
            removable: self.removable,
        }
    }

    /// Checks this device alone; `at` is its JSON path.
    pub fn validate(&self, at: &str) -> Result<(), ConfigError> {
        validate_object_name(&self.name)
            .map_err(|m| ConfigError::invalid(format!("{at}.name"), m))?;
        if self.blocksize != 512 && self.blocksize != 4096 {
            return Err(ConfigError::invalid(
                format!("{at}.blocksize"),
                format!(
                    "{} is not a valid block size; valid: 512, 4096",
                    self.blocksize
                ),
            ));
        }
        match (self.handler.needs_filename(), &self.filename) {
            (true, None) => {
                return Err(ConfigError::invalid(
                    format!("{at}.filename"),
                    format!("handler {} needs a filename", self.handler),
                ));
            }
            (true, Some(f)) if !f.is_absolute() => {
                return Err(ConfigError::invalid(
                    format!("{at}.filename"),
                    format!("{} is not an absolute path", f.display()),
                ));
            }
            (false, Some(_)) => {
                return Err(ConfigError::invalid(
                    format!("{at}.filename"),
                    format!(
                        "handler {} stores nothing in a file; remove filename",
                        self.handler
                    ),
                ));
            }
            _ => {}
        }
        match (self.handler, self.size) {
            (Handler::VdiskNullio, None) => {
                return Err(ConfigError::invalid(
                    format!("{at}.size"),
                    "handler vdisk_nullio needs a size in bytes",
                ));
            }
            (Handler::VdiskBlockio, Some(_)) => {
                return Err(ConfigError::invalid(
                    format!("{at}.size"),
                    "handler vdisk_blockio takes its size from the device; remove size",
                ));
            }
            (_, Some(s)) if s == 0 || s % u64::from(self.blocksize) != 0 => {
                return Err(ConfigError::invalid(
                    format!("{at}.size"),
                    format!(
                        "{s} is not a positive multiple of the block size {}",
                        self.blocksize
                    ),
                ));
            }
            _ => {}
        }
        if self.mem && self.handler != Handler::VdiskNullio {
            return Err(ConfigError::invalid(
                format!("{at}.mem"),
                "mem is a vdisk_nullio setting",
            ));
        }
        // SPC-4 §6.6.1 INQUIRY data: vendor 8, product 16, revision 4 ASCII
        // characters; VPD 80h serial: printable ASCII.
        for (field, value, max) in [
            ("serial", &self.serial, 254),
            ("t10_vendor", &self.t10_vendor, 8),
            ("t10_product", &self.t10_product, 16),
            ("t10_revision", &self.t10_revision, 4),
        ] {
            if let Some(v) = value
                && (v.is_empty() || v.len() > max || !v.bytes().all(|b| (0x20..0x7f).contains(&b)))
            {
                return Err(ConfigError::invalid(
                    format!("{at}.{field}"),
                    format!("{v:?}: valid is 1 to {max} printable ASCII characters"),
                ));
            }
        }
        for (field, value, max) in [
            ("t10_id", &self.t10_id, 247),
            ("vendor_specific", &self.vendor_specific, 20),
        ] {
            if let Some(v) = value
                && (v.len() > max || !v.bytes().all(|b| (0x20..0x7f).contains(&b)))
            {
                return Err(ConfigError::invalid(
                    format!("{at}.{field}"),
                    format!("{v:?}: valid is at most {max} printable ASCII characters"),
                ));
            }
        }
        if let Some(n) = &self.lu_name
            && (n.is_empty() || n.len() > 251 || n.contains('\0'))
        {
            return Err(ConfigError::invalid(
                format!("{at}.lu_name"),
                format!("{n:?}: valid is 1 to 251 bytes of UTF-8 without NUL"),
            ));
        }
        if let Some(n) = &self.naa {
            check_naa(n).map_err(|m| ConfigError::invalid(format!("{at}.naa"), m))?;
        }
        if let Some(e) = &self.eui64 {
            check_eui64(e).map_err(|m| ConfigError::invalid(format!("{at}.eui64"), m))?;
        }
        if let Some(l) = &self.vpd83 {
            check_vpd83(l).map_err(|m| ConfigError::invalid(format!("{at}.vpd83"), m))?;
        }
        if let Some(f) = &self.fault {
            f.validate(&format!("{at}.fault"))?;
        }
        Ok(())
    }
}

/// Checks an NAA designator (SPC-4 §7.8.6.6): 16 hex digits of NAA 2, 3
/// or 5, or 32 hex digits of NAA 6, with an optional `0x`.
pub fn check_naa(n: &str) -> Result<Vec<u8>, String> {
    match parse_hex_bytes(n, &[8, 16]) {
        Some(v) if v.len() == 8 && matches!(v[0] >> 4, 2 | 3 | 5) => Ok(v),
        Some(v) if v.len() == 16 && v[0] >> 4 == 6 => Ok(v),
        Some(v) => Err(format!(
            "{n:?}: NAA {:x} with {} bytes; valid is 16 hex digits of NAA 2, 3 or 5 \
             or 32 hex digits of NAA 6",
            v[0] >> 4,
            v.len()
        )),
        None => Err(format!(
            "{n:?}: valid is 16 hex digits of NAA 2, 3 or 5 or 32 hex digits of NAA 6"
        )),
    }
}

/// Checks an EUI-64 based designator (SPC-4 §7.8.6.5): 16, 24 or 32 hex
/// digits, with an optional `0x`.
pub fn check_eui64(e: &str) -> Result<Vec<u8>, String> {
    parse_hex_bytes(e, &[8, 12, 16])
        .ok_or_else(|| format!("{e:?}: valid is 16, 24 or 32 hex digits"))
}

/// Checks a VPD 83h layout: comma separated words [`DeviceConfig::vpd83`]
/// names, none twice.
pub fn check_vpd83(l: &str) -> Result<(), String> {
    let mut seen = Vec::new();
    for w in l.split(',').map(str::trim) {
        let Some(d) = ferrite_core::device::Vpd83::parse(w) else {
            return Err(format!(
                "{w:?} is not a designator; valid: naa, t10, t10_nul, eui64, lu_name, rel_port, \
                 port_group=N, lu_group=N, port_name, target_name, no_piv, comma separated"
            ));
        };
        if seen.contains(&d) {
            return Err(format!("{w:?} is listed twice"));
        }
        seen.push(d);
    }
    Ok(())
}

/// Parses hex digits, with an optional `0x`, into one of the byte lengths
/// `lens`.
pub fn parse_hex_bytes(s: &str, lens: &[usize]) -> Option<Vec<u8>> {
    let d = s
        .strip_prefix("0x")
        .or_else(|| s.strip_prefix("0X"))
        .unwrap_or(s);
    if !lens.contains(&(d.len() / 2))
        || !d.len().is_multiple_of(2)
        || !d.bytes().all(|b| b.is_ascii_hexdigit())
    {
        return None;
    }
    (0..d.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&d[i..i + 2], 16).ok())
        .collect()
}

/// Lower-case hex digits of `b`, with `0x`.
pub fn hex_id(b: &[u8]) -> String {
    let mut s = String::from("0x");
    for x in b {
        s.push_str(&format!("{x:02x}"));
    }
    s
}

/// Parses exactly 16 hex digits, with an optional `0x`.
pub fn parse_hex_u64(s: &str) -> Option<u64> {
    let d = s
        .strip_prefix("0x")
        .or_else(|| s.strip_prefix("0X"))
        .unwrap_or(s);
    if d.len() != 16 || !d.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    u64::from_str_radix(d, 16).ok()
}

/// Target ports, per fabric.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TargetsConfig {
    pub iscsi: Vec<IscsiTargetConfig>,
    /// SRP target ports (`/targets/srp/<port>`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub srp: Vec<SrpTargetConfig>,
}

/// Where an SRP target port listens.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, tag = "kind", rename_all = "snake_case")]
pub enum SrpProviderConfig {
    /// The socket-backed test and development provider: `listen` is an
    /// absolute Unix socket path or `ADDR:PORT`.
    Soft { listen: String },
    /// An HCA port through libibverbs and RDMA CM: `listen` is the
    /// `ADDR:PORT` RDMA CM binds (an IPoIB or RoCE address); `device`
    /// narrows it to one HCA by name.
    Verbs {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        device: Option<String>,
        #[serde(default = "default_srp_hca_port")]
        port: u8,
        listen: String,
    },
}

fn default_srp_hca_port() -> u8 {
    1
}

/// One SRP target port: what ib_srpt makes of one HCA port, or one soft
/// provider endpoint.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SrpTargetConfig {
    /// Port name (an object name; the tree path `/targets/srp/<name>`).
    pub name: String,
    /// Whether new logins are accepted.
    #[serde(default = "default_true")]
    pub enabled: bool,
    /// SRP target port identifier, 32 hex digits (SRP r16a §5.5.8). Absent:
    /// derived from the name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port_id: Option<String>,
    pub provider: SrpProviderConfig,
    /// Request limit granted per channel (SRP_LOGIN_RSP REQUEST LIMIT DELTA).
    #[serde(default = "default_srp_credits")]
    pub credits: u32,
    /// The default LUN map: for initiator ports in no group.
    #[serde(default)]
    pub luns: Vec<LunConfig>,
    /// Groups of initiator port ids (`0x` and 32 hex digits, patterns
    /// allowed) with their own LUN maps.
    #[serde(default)]
    pub ini_groups: Vec<GroupConfig>,
    /// Relative target port identifier (VPD 83h), as SCST's `rel_tgt_id`;
    /// absent: derived (see [`Config::validate`] for uniqueness).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rel_tgt_id: Option<u16>,
}

fn default_srp_credits() -> u32 {
    128
}

impl SrpTargetConfig {
    /// An enabled soft-provider port listening on `listen`, no LUN.
    pub fn soft(name: impl Into<String>, listen: impl Into<String>) -> SrpTargetConfig {
        SrpTargetConfig {
            name: name.into(),
            enabled: true,
            port_id: None,
            provider: SrpProviderConfig::Soft {
                listen: listen.into(),
            },
            credits: default_srp_credits(),
            luns: Vec::new(),
            ini_groups: Vec::new(),
            rel_tgt_id: None,
        }
    }

    /// The 16-byte target port identifier: `port_id` if given (validated by
    /// [`Config::validate`]), else a stable value derived from the name.
    pub fn port_id_bytes(&self) -> [u8; 16] {
        if let Some(b) = self.port_id.as_deref().and_then(parse_port_id) {
            return b;
        }
        let d = Sha256::digest(format!("ferrite srp port {}", self.name).as_bytes());
        let mut out = [0u8; 16];
        out.copy_from_slice(&d[..16]);
        out
    }
}

/// 32 hex digits (an optional `0x` prefix) as a 16-byte SRP port id.
pub fn parse_port_id(s: &str) -> Option<[u8; 16]> {
    let h = s.strip_prefix("0x").unwrap_or(s);
    if h.len() != 32 || !h.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    let mut out = [0u8; 16];
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(h.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

/// Checks the SRP target ports of a configuration.
fn validate_srp_targets(
    targets: &[SrpTargetConfig],
    devices: &BTreeSet<&str>,
) -> Result<(), ConfigError> {
    let mut names = BTreeMap::new();
    let mut listens = BTreeMap::new();
    for (i, t) in targets.iter().enumerate() {
        let at = format!("targets.srp[{i}]");
        validate_object_name(&t.name).map_err(|m| ConfigError::invalid(format!("{at}.name"), m))?;
        if let Some(prev) = names.insert(t.name.as_str(), i) {
            return Err(ConfigError::invalid(
                format!("{at}.name"),
                format!(
                    "SRP port {:?} is already defined at targets.srp[{prev}]",
                    t.name
                ),
            ));
        }
        if let Some(p) = &t.port_id
            && parse_port_id(p).is_none()
        {
            return Err(ConfigError::invalid(
                format!("{at}.port_id"),
                format!("{p:?} is not 32 hex digits (an optional 0x before them)"),
            ));
        }
        // SRP r16a §5.6.4: the request limit is a 32-bit count; a channel
        // needs at least one credit, and each is a posted receive buffer.
        if t.credits == 0 || t.credits > 4096 {
            return Err(ConfigError::invalid(
                format!("{at}.credits"),
                format!("{}; valid: 1..4096", t.credits),
            ));
        }
        let listen = match &t.provider {
            SrpProviderConfig::Soft { listen } => {
                let unix = listen.starts_with('/');
                if !unix && listen.parse::<SocketAddr>().is_err() {
                    return Err(ConfigError::invalid(
                        format!("{at}.provider.listen"),
                        format!(
                            "{listen:?} is neither an absolute socket path nor an address:port"
                        ),
                    ));
                }
                // sockaddr_un holds 108 bytes with the terminating NUL.
                if unix && listen.len() > 107 {
                    return Err(ConfigError::invalid(
                        format!("{at}.provider.listen"),
                        "a Unix socket path is at most 107 bytes",
                    ));
                }
                listen
            }
            SrpProviderConfig::Verbs { port, listen, .. } => {
                if *port == 0 {
                    return Err(ConfigError::invalid(
                        format!("{at}.provider.port"),
                        "HCA ports are numbered from 1",
                    ));
                }
                if listen.parse::<SocketAddr>().is_err() {
                    return Err(ConfigError::invalid(
                        format!("{at}.provider.listen"),
                        format!("{listen:?} is not an address:port"),
                    ));
                }
                listen
            }
        };
        if let Some(prev) = listens.insert(listen.as_str(), i) {
            return Err(ConfigError::invalid(
                format!("{at}.provider.listen"),
                format!("{listen:?} is already used by targets.srp[{prev}]"),
            ));
        }
        validate_lun_map(&t.luns, devices, &format!("{at}.luns"))?;
        let mut groups = BTreeMap::new();
        let mut patterns: BTreeMap<&str, &str> = BTreeMap::new();
        for (j, g) in t.ini_groups.iter().enumerate() {
            let gat = format!("{at}.ini_groups[{j}]");
            validate_object_name(&g.name)
                .map_err(|m| ConfigError::invalid(format!("{gat}.name"), m))?;
            if let Some(prev) = groups.insert(g.name.as_str(), j) {
                return Err(ConfigError::invalid(
                    format!("{gat}.name"),
                    format!(
                        "group {:?} is already defined at {at}.ini_groups[{prev}]",
                        g.name
                    ),
                ));
            }
            for (k, p) in g.initiators.iter().enumerate() {
                validate_initiator_pattern(p)
                    .map_err(|m| ConfigError::invalid(format!("{gat}.initiators[{k}]"), m))?;
                if let Some(other) = patterns.insert(p.as_str(), g.name.as_str()) {
                    return Err(ConfigError::invalid(
                        format!("{gat}.initiators[{k}]"),
                        format!("initiator {p:?} is already in group {other:?}"),
                    ));
                }
            }
            validate_lun_map(&g.luns, devices, &format!("{gat}.luns"))?;
        }
    }
    Ok(())
}

/// One iSCSI target node.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IscsiTargetConfig {
    /// iSCSI name (`iqn.`, `eui.` or `naa.` form).
    pub name: String,
    /// Whether new sessions are accepted.
    #[serde(default = "default_true")]
    pub enabled: bool,
    /// Listening addresses: `"127.0.0.1:3260"`, `"[::1]:3260"` (iSCSI
    /// over TCP), or the same after `iser:` for an iSER portal (RDMA CM on
    /// that address: `"iser:192.0.2.1:3260"`, LIO's portal with
    /// `enable_iser`). One target may have both kinds.
    #[serde(default)]
    pub portals: Vec<String>,
    /// Target portal group tag.
    #[serde(default = "default_tpgt")]
    pub tpgt: u16,
    /// The default LUN map: for initiators in no group.
    #[serde(default)]
    pub luns: Vec<LunConfig>,
    #[serde(default)]
    pub ini_groups: Vec<GroupConfig>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub alias: Option<String>,
    /// CHAP: initiators must authenticate as one of these (none: no
    /// authentication required).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub incoming_users: Vec<ChapUser>,
    /// Mutual CHAP: how the target authenticates to initiators that ask.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outgoing_user: Option<ChapUser>,
    /// CHAP per initiator group, by group name (SCST-like `IncomingUser`
    /// on a group): an initiator whose name matches a group listed here
    /// must authenticate as one of that group's users, and the target's
    /// `incoming_users` do not apply to it. Mutual CHAP still answers with
    /// the target's `outgoing_user`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub group_incoming_users: BTreeMap<String, Vec<ChapUser>>,
    /// Relative target port identifier (VPD 83h), as SCST's `rel_tgt_id`;
    /// absent: derived (see [`Config::validate`] for uniqueness).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rel_tgt_id: Option<u16>,
}

/// A CHAP name and secret (RFC 7143 §12.1.3). Debug output hides the secret.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChapUser {
    pub user: String,
    pub secret: String,
}

impl fmt::Debug for ChapUser {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ChapUser")
            .field("user", &self.user)
            .field("secret", &"<hidden>")
            .finish()
    }
}

/// Shortest CHAP secret accepted: 12 bytes (96 bits); shorter ones fall to
/// an offline dictionary attack on one captured exchange.
pub const MIN_CHAP_SECRET: usize = 12;
/// Longest CHAP secret accepted.
pub const MAX_CHAP_SECRET: usize = 255;

/// Checks CHAP credentials: `incoming` for initiators, `outgoing` for the
/// target itself; `at` is the JSON path of the object holding them and
/// `in_field`/`out_field` the field names.
pub fn validate_chap(
    incoming: &[ChapUser],
    outgoing: Option<&ChapUser>,
    at: &str,
    in_field: &str,
    out_field: &str,
) -> Result<(), ConfigError> {
    let check = |u: &ChapUser, here: String| -> Result<(), ConfigError> {
        if u.user.is_empty() || u.user.len() > 255 || u.user.chars().any(|c| c.is_control()) {
            return Err(ConfigError::invalid(
                format!("{here}.user"),
                "a CHAP name is 1 to 255 bytes of printable text",
            ));
        }
        if u.secret.len() < MIN_CHAP_SECRET || u.secret.len() > MAX_CHAP_SECRET {
            return Err(ConfigError::invalid(
                format!("{here}.secret"),
                format!(
                    "a CHAP secret has {MIN_CHAP_SECRET} to {MAX_CHAP_SECRET} bytes; this one has {}",
                    u.secret.len()
                ),
            ));
        }
        Ok(())
    };
    let mut seen = BTreeSet::new();
    for (i, u) in incoming.iter().enumerate() {
        let here = format!("{at}.{in_field}[{i}]");
        check(u, here.clone())?;
        if !seen.insert(u.user.as_str()) {
            return Err(ConfigError::invalid(
                format!("{here}.user"),
                format!("CHAP user {:?} is listed twice", u.user),
            ));
        }
    }
    if let Some(o) = outgoing {
        let here = format!("{at}.{out_field}");
        check(o, here.clone())?;
        // RFC 7143 §12.1.3: a secret used to authenticate initiators must
        // not also authenticate the target.
        if incoming.iter().any(|u| u.secret == o.secret) {
            return Err(ConfigError::invalid(
                format!("{here}.secret"),
                "the target's secret equals an initiator's; mutual CHAP needs different secrets",
            ));
        }
    }
    Ok(())
}

impl IscsiTargetConfig {
    /// An enabled target with no portal, LUN or group.
    pub fn new(name: impl Into<String>) -> IscsiTargetConfig {
        IscsiTargetConfig {
            name: name.into(),
            enabled: true,
            portals: Vec::new(),
            tpgt: default_tpgt(),
            luns: Vec::new(),
            ini_groups: Vec::new(),
            alias: None,
            incoming_users: Vec::new(),
            outgoing_user: None,
            group_incoming_users: BTreeMap::new(),
            rel_tgt_id: None,
        }
    }

    /// The relative target port identifier: `rel_tgt_id`, else the portal
    /// group tag (at least 1).
    pub fn rel_port_id(&self) -> u16 {
        self.rel_tgt_id.unwrap_or(self.tpgt.max(1))
    }

    /// The iSCSI/TCP portals as socket addresses (entries that do not
    /// parse are skipped; [`Config::validate`] refuses them).
    pub fn portal_addrs(&self) -> Vec<SocketAddr> {
        self.portals
            .iter()
            .filter_map(|p| match parse_portal(p) {
                Ok((PortalTransport::Tcp, a)) => Some(a),
                _ => None,
            })
            .collect()
    }

    /// The iSER portals (`iser:address:port`) as socket addresses.
    pub fn iser_portal_addrs(&self) -> Vec<SocketAddr> {
        self.portals
            .iter()
            .filter_map(|p| match parse_portal(p) {
                Ok((PortalTransport::Iser, a)) => Some(a),
                _ => None,
            })
            .collect()
    }

    /// Every portal's address, TCP and iSER, each once: where the target
    /// is reached and what SendTargets announces.
    pub fn all_portal_addrs(&self) -> Vec<SocketAddr> {
        let mut v: Vec<SocketAddr> = Vec::new();
        for a in self.portals.iter().filter_map(|p| parse_portal(p).ok()) {
            if !v.contains(&a.1) {
                v.push(a.1);
            }
        }
        v
    }
}

/// The transport of an iSCSI portal.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PortalTransport {
    /// iSCSI over TCP (RFC 7143).
    Tcp,
    /// iSER (RFC 7145) on RDMA CM.
    Iser,
}

/// The prefix of an iSER portal in `portals`.
pub const ISER_PORTAL_PREFIX: &str = "iser:";

/// Reads one portal entry: `address:port` (TCP) or `iser:address:port`.
pub fn parse_portal(p: &str) -> Result<(PortalTransport, SocketAddr), std::net::AddrParseError> {
    match p.strip_prefix(ISER_PORTAL_PREFIX) {
        Some(a) => a.parse().map(|a| (PortalTransport::Iser, a)),
        None => p.parse().map(|a| (PortalTransport::Tcp, a)),
    }
}

/// One LUN of a map.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LunConfig {
    pub lun: u16,
    /// Name of a device in `devices`.
    pub device: String,
    /// Read-only through this mapping even if the device is writable.
    #[serde(default, skip_serializing_if = "is_false")]
    pub read_only: bool,
}

/// An initiator group: name patterns (`*`, `?`) and their own LUN map.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GroupConfig {
    pub name: String,
    #[serde(default)]
    pub initiators: Vec<String>,
    #[serde(default)]
    pub luns: Vec<LunConfig>,
}

/// Portal-independent iSCSI settings: the values the target offers or
/// accepts in login negotiation (RFC 7143 §13) and its timers.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct IscsiParamsConfig {
    /// RFC 7143 §13.12: the target's MaxRecvDataSegmentLength, 512..2^24-1.
    pub max_recv_data_segment_length: u32,
    /// RFC 7143 §13.13: 512..2^24-1.
    pub max_burst_length: u32,
    /// RFC 7143 §13.14: 512..2^24-1, at most max_burst_length.
    pub first_burst_length: u32,
    /// RFC 7143 §13.11.
    pub immediate_data: bool,
    /// RFC 7143 §13.10.
    pub initial_r2t: bool,
    /// RFC 7143 §13.17: 1..65535.
    pub max_outstanding_r2t: u16,
    /// RFC 7143 §13.2: 1..65535.
    pub max_connections: u16,
    /// Seconds between NOP-In pings on an idle connection; 0 disables.
    pub nop_in_interval_s: u32,
    /// Seconds to wait for the NOP-Out answer before dropping the connection.
    pub nop_in_timeout_s: u32,
    /// Seconds a connection may take to reach full feature phase.
    pub login_timeout_s: u32,
    /// Seconds a solicited burst (an R2T's Data-Out) may take: a connection
    /// whose oldest outstanding R2T is unanswered for between one and two
    /// of these is dropped. 0 turns it off.
    pub data_out_timeout_s: u32,
    /// Commands a session may have outstanding (sets MaxCmdSN; SCST's
    /// QueuedCommands), 1..4096.
    pub queue_depth: u32,
    /// Digests accepted for headers and data (RFC 7143 §13.1), in order of
    /// preference.
    pub digests: Vec<Digest>,
    /// HeaderDigest only, in order of preference; empty: `digests`.
    pub header_digests: Vec<Digest>,
    /// DataDigest only, in order of preference; empty: `digests`.
    pub data_digests: Vec<Digest>,
    /// CHAP for discovery sessions: initiators must authenticate as one of
    /// these (none: no authentication).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub discovery_incoming_users: Vec<ChapUser>,
    /// Mutual CHAP for discovery sessions.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub discovery_outgoing_user: Option<ChapUser>,
}

/// A digest of RFC 7143 §13.1 (HeaderDigest, DataDigest).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Digest {
    #[serde(rename = "crc32c")]
    Crc32c,
    #[serde(rename = "none")]
    Off,
}

impl Default for IscsiParamsConfig {
    fn default() -> Self {
        IscsiParamsConfig {
            max_recv_data_segment_length: 1 << 18,
            max_burst_length: 1 << 20,
            first_burst_length: 1 << 16,
            immediate_data: true,
            initial_r2t: false,
            max_outstanding_r2t: 32,
            max_connections: 1,
            nop_in_interval_s: 30,
            nop_in_timeout_s: 30,
            login_timeout_s: 15,
            data_out_timeout_s: 30,
            queue_depth: 128,
            digests: vec![Digest::Crc32c, Digest::Off],
            header_digests: Vec::new(),
            data_digests: Vec::new(),
            discovery_incoming_users: Vec::new(),
            discovery_outgoing_user: None,
        }
    }
}

/// The reactors: how many cores, and how long each polls before sleeping.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ReactorConfig {
    /// Number of reactor threads; `None`: the available parallelism.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cores: Option<usize>,
    /// Microseconds a reactor busy-polls before it sleeps on its ring.
    pub poll_us: u32,
    /// Microseconds a reactor polls before sleeping while its initiators
    /// are latency-bound (each keeps at most [`LATENCY_BOUND_DEPTH`]
    /// commands outstanding, so each would otherwise wait for a wake-up).
    /// 0 turns this off.
    pub latency_poll_us: u32,
    /// MiB of memory all commands' data buffers may hold at once (write
    /// data fetched, read data on its way out); commands past it wait for
    /// memory, and a session that uses its share gets no new CmdSN window.
    /// `None`: an eighth of the machine's memory, between 256 MiB and 4 GiB
    /// ([`ferrite_core::budget::DataBudget::default_limit`]). At least 64.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub data_memory_mb: Option<u64>,
}

/// Initiator queue depth up to which a reactor counts as latency-bound.
pub const LATENCY_BOUND_DEPTH: u32 = 2;

/// The values `reactor.data_memory_mb` takes, in MiB: from
/// [`ferrite_core::budget::MIN_LIMIT`] to 1 PiB.
pub const DATA_MEMORY_MB: std::ops::RangeInclusive<u64> =
    (ferrite_core::budget::MIN_LIMIT >> 20)..=(1 << 30);

/// The data budget in bytes for a `data_memory_mb` of `mb`: `mb` MiB, or
/// (`None`) the default for this machine's memory.
pub fn data_memory_bytes(mb: Option<u64>) -> u64 {
    match mb {
        Some(mb) => mb.saturating_mul(1 << 20),
        None => ferrite_core::budget::DataBudget::default_limit(mem_total()),
    }
}

impl Default for ReactorConfig {
    fn default() -> Self {
        ReactorConfig {
            cores: None,
            poll_us: 0,
            latency_poll_us: 200,
            data_memory_mb: None,
        }
    }
}

impl ReactorConfig {
    /// The data budget in bytes: `data_memory_mb`, or the default for
    /// this machine's memory.
    pub fn data_memory_bytes(&self) -> u64 {
        data_memory_bytes(self.data_memory_mb)
    }

    /// `cores`, or the machine's available parallelism.
    pub fn effective_cores(&self) -> usize {
        self.cores.unwrap_or_else(|| {
            std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1)
        })
    }
}

/// MemTotal of /proc/meminfo in bytes (4 GiB if it cannot be read).
fn mem_total() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find_map(|l| l.strip_prefix("MemTotal:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .map_or(4 << 30, |kb| kb * 1024)
}

/// Device, group and handler object names: what SCST accepts in sysfs and
/// what needs no quoting in a command line.
pub fn validate_object_name(name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > 64 {
        return Err(format!("{name:?}: a name has 1 to 64 characters"));
    }
    if !name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-' || b == b'.')
    {
        return Err(format!("{name:?}: valid characters are A-Z a-z 0-9 _ - ."));
    }
    if name == "." || name == ".." || name == "mgmt" {
        return Err(format!("{name:?} is reserved"));
    }
    Ok(())
}

/// Checks an iSCSI name: RFC 7143 §4.2.7.2 (RFC 3720 §3.2.6.3.1) `iqn.`
/// (`iqn.yyyy-mm.reversed.domain[:unique]`), `eui.` (16 hex digits) and
/// RFC 3980 `naa.` (16 or 32 hex digits); at most 223 bytes (§4.2.7.1) of
/// the characters stringprep leaves (RFC 3722): lower-case letters, digits,
/// `-`, `.`, `:`.
pub fn validate_iscsi_name(name: &str) -> Result<(), String> {
    const VALID: &str = "valid forms: iqn.yyyy-mm.reversed.domain[:unique], \
                         eui.<16 hex digits>, naa.<16 or 32 hex digits>";
    if name.is_empty() || name.len() > MAX_ISCSI_NAME_LEN {
        return Err(format!(
            "{name:?}: an iSCSI name has 1 to {MAX_ISCSI_NAME_LEN} bytes"
        ));
    }
    if let Some(bad) = name
        .chars()
        .find(|&c| !(c.is_ascii_lowercase() || c.is_ascii_digit() || "-.:".contains(c)))
    {
        return Err(format!(
            "{name:?}: character {bad:?} is not allowed; iSCSI names are lower-case \
             letters, digits, '-', '.' and ':' (RFC 3722)"
        ));
    }
    if let Some(rest) = name.strip_prefix("iqn.") {
        let b = rest.as_bytes();
        let date_ok = b.len() >= 7
            && b[..4].iter().all(u8::is_ascii_digit)
            && b[4] == b'-'
            && b[5..7].iter().all(u8::is_ascii_digit)
            && matches!(
                &rest[5..7],
                "01" | "02" | "03" | "04" | "05" | "06" | "07" | "08" | "09" | "10" | "11" | "12"
            );
        if !date_ok {
            return Err(format!(
                "{name:?}: iqn. must be followed by yyyy-mm; {VALID}"
            ));
        }
        let after = &rest[7..];
        let domain = after
            .strip_prefix('.')
            .map(|d| d.split(':').next().unwrap_or(""))
            .unwrap_or("");
        if domain.is_empty() || domain.split('.').any(str::is_empty) {
            return Err(format!(
                "{name:?}: iqn.yyyy-mm must be followed by .reversed.domain; {VALID}"
            ));
        }
        return Ok(());
    }
    let hex_ok = |h: &str, lens: &[usize]| {
        lens.contains(&h.len()) && h.bytes().all(|b| b.is_ascii_hexdigit())
    };
    if let Some(h) = name.strip_prefix("eui.") {
        return if hex_ok(h, &[16]) {
            Ok(())
        } else {
            Err(format!("{name:?}: eui. takes 16 hex digits; {VALID}"))
        };
    }
    if let Some(h) = name.strip_prefix("naa.") {
        return if hex_ok(h, &[16, 32]) {
            Ok(())
        } else {
            Err(format!("{name:?}: naa. takes 16 or 32 hex digits; {VALID}"))
        };
    }
    Err(format!("{name:?}: unknown iSCSI name type; {VALID}"))
}

/// Checks an initiator name pattern (`*` and `?` wildcards allowed).
pub fn validate_initiator_pattern(p: &str) -> Result<(), String> {
    if p.is_empty() || p.len() > MAX_ISCSI_NAME_LEN {
        return Err(format!(
            "{p:?}: an initiator pattern has 1 to {MAX_ISCSI_NAME_LEN} bytes"
        ));
    }
    if p.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(format!("{p:?}: an initiator pattern has no spaces"));
    }
    Ok(())
}

/// Checks one LUN map: numbers below 16384, each used once, devices that
/// exist. `at` is the JSON path of the map.
pub fn validate_lun_map(
    luns: &[LunConfig],
    devices: &BTreeSet<&str>,
    at: &str,
) -> Result<(), ConfigError> {
    let mut seen = BTreeMap::new();
    for (i, l) in luns.iter().enumerate() {
        let here = format!("{at}[{i}]");
        // SAM-5 §4.7.4: flat space addressing reaches LUN 16383.
        if l.lun >= MAX_LUNS {
            return Err(ConfigError::invalid(
                format!("{here}.lun"),
                format!("LUN {} is out of range; valid: 0..{}", l.lun, MAX_LUNS - 1),
            ));
        }
        if let Some(prev) = seen.insert(l.lun, i) {
            return Err(ConfigError::invalid(
                format!("{here}.lun"),
                format!("LUN {} is already used by {at}[{prev}]", l.lun),
            ));
        }
        if !devices.contains(l.device.as_str()) {
            return Err(ConfigError::invalid(
                format!("{here}.device"),
                format!("no device named {:?}", l.device),
            ));
        }
    }
    Ok(())
}

impl Config {
    /// Reads, parses and validates `path`.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = fs::read_to_string(path).map_err(|source| ConfigError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        let cfg = Config::from_json(&text, &path.display().to_string())?;
        cfg.validate()?;
        Ok(cfg)
    }

    /// Parses JSON text (no validation); `file` names it in errors.
    pub fn from_json(text: &str, file: &str) -> Result<Config, ConfigError> {
        let de = &mut serde_json::Deserializer::from_str(text);
        let cfg: Config = serde_path_to_error::deserialize(de).map_err(|e| {
            let at = e.path().to_string();
            let inner = e.into_inner();
            ConfigError::Parse {
                file: file.to_string(),
                at: if at.is_empty() { ".".into() } else { at },
                line: inner.line(),
                column: inner.column(),
                msg: strip_position(&inner.to_string()),
            }
        })?;
        Ok(cfg)
    }

    /// Pretty JSON, as [`Config::save_atomic`] writes it.
    pub fn to_json(&self) -> String {
        // Serializing these types cannot fail: every map key is a string.
        serde_json::to_string_pretty(self).unwrap_or_default()
    }

    /// Checks everything that can be checked without touching the system.
    /// SPC-4 §7.8.6.7: relative port 0 is reserved; a configured id names
    /// one port of all.
    fn validate_rel_tgt_ids(&self) -> Result<(), ConfigError> {
        let iscsi = self.targets.iscsi.iter().enumerate();
        let iscsi = iscsi.map(|(i, t)| (format!("targets.iscsi[{i}]"), t.rel_tgt_id));
        let srp = self.targets.srp.iter().enumerate();
        let srp = srp.map(|(i, t)| (format!("targets.srp[{i}]"), t.rel_tgt_id));
        let mut seen: BTreeMap<u16, String> = BTreeMap::new();
        for (at, r) in iscsi.chain(srp) {
            let Some(r) = r else { continue };
            if r == 0 {
                return Err(ConfigError::invalid(
                    format!("{at}.rel_tgt_id"),
                    "0 is reserved; valid is 1 to 65535",
                ));
            }
            if let Some(prev) = seen.insert(r, at.clone()) {
                return Err(ConfigError::invalid(
                    format!("{at}.rel_tgt_id"),
                    format!("{r} is already the relative port of {prev}"),
                ));
            }
        }
        Ok(())
    }

    /// The relative target port identifier of every target port by name,
    /// as ferrited numbers them at start: an iSCSI target's `rel_tgt_id`,
    /// else its portal group tag; an SRP port's `rel_tgt_id`, else one
    /// past the largest iSCSI one plus the port's index.
    pub fn rel_port_ids(&self) -> BTreeMap<&str, u16> {
        let mut out = BTreeMap::new();
        for t in &self.targets.iscsi {
            out.insert(t.name.as_str(), t.rel_port_id());
        }
        let first = out.values().copied().max().map_or(0, usize::from);
        for (i, t) in self.targets.srp.iter().enumerate() {
            let derived = u16::try_from(first + i + 1).unwrap_or(u16::MAX);
            out.insert(t.name.as_str(), t.rel_tgt_id.unwrap_or(derived));
        }
        out
    }

    /// The device group named `name`.
    pub fn device_group(&self, name: &str) -> Option<&DeviceGroupConfig> {
        self.device_groups.iter().find(|g| g.name == name)
    }

    /// Checks the ALUA device groups against the devices and targets.
    fn validate_device_groups(&self) -> Result<(), ConfigError> {
        let rel = self.rel_port_ids();
        let mut names = BTreeMap::new();
        let mut member: BTreeMap<&str, &str> = BTreeMap::new();
        for (i, dg) in self.device_groups.iter().enumerate() {
            let at = format!("device_groups[{i}]");
            validate_object_name(&dg.name)
                .map_err(|m| ConfigError::invalid(format!("{at}.name"), m))?;
            if let Some(prev) = names.insert(dg.name.as_str(), i) {
                return Err(ConfigError::invalid(
                    format!("{at}.name"),
                    format!(
                        "device group {:?} is already defined at device_groups[{prev}]",
                        dg.name
                    ),
                ));
            }
            for (j, d) in dg.devices.iter().enumerate() {
                let here = format!("{at}.devices[{j}]");
                if self.device(d).is_none() {
                    return Err(ConfigError::invalid(
                        here,
                        format!("no device {d:?} is defined"),
                    ));
                }
                // SPC-4 §5.15.2: a logical unit has one access state per
                // target port group, so it belongs to one device group.
                if let Some(other) = member.insert(d.as_str(), dg.name.as_str()) {
                    return Err(ConfigError::invalid(
                        here,
                        format!("device {d:?} is already in device group {other:?}"),
                    ));
                }
            }
            let mut tg_names = BTreeMap::new();
            let mut ids = BTreeMap::new();
            let mut in_tg: BTreeMap<&str, &str> = BTreeMap::new();
            let mut ports: BTreeMap<u16, &str> = BTreeMap::new();
            for (j, tg) in dg.target_groups.iter().enumerate() {
                let gat = format!("{at}.target_groups[{j}]");
                validate_object_name(&tg.name)
                    .map_err(|m| ConfigError::invalid(format!("{gat}.name"), m))?;
                if let Some(prev) = tg_names.insert(tg.name.as_str(), j) {
                    return Err(ConfigError::invalid(
                        format!("{gat}.name"),
                        format!(
                            "target group {:?} is already defined at {at}.target_groups[{prev}]",
                            tg.name
                        ),
                    ));
                }
                // SPC-4 §6.27.2: TARGET PORT GROUP is a 16-bit field.
                if !(1..=65535).contains(&tg.group_id) {
                    return Err(ConfigError::invalid(
                        format!("{gat}.group_id"),
                        format!("{}; valid: 1 to 65535", tg.group_id),
                    ));
                }
                if let Some(prev) = ids.insert(tg.group_id, tg.name.as_str()) {
                    return Err(ConfigError::invalid(
                        format!("{gat}.group_id"),
                        format!("{} is already the id of target group {prev:?}", tg.group_id),
                    ));
                }
                if ferrite_core::alua::AccessState::parse(&tg.state).is_none() {
                    return Err(ConfigError::invalid(
                        format!("{gat}.state"),
                        format!(
                            "{:?} is not an access state; valid: {}",
                            tg.state,
                            ferrite_core::alua::AccessState::ALL
                                .map(|s| s.name())
                                .join(", ")
                        ),
                    ));
                }
                for (k, t) in tg.targets.iter().enumerate() {
                    let here = format!("{gat}.targets[{k}]");
                    let Some(&r) = rel.get(t.as_str()) else {
                        return Err(ConfigError::invalid(
                            here,
                            format!("no iSCSI target or SRP port {t:?} is defined"),
                        ));
                    };
                    if let Some(other) = in_tg.insert(t.as_str(), tg.name.as_str()) {
                        return Err(ConfigError::invalid(
                            here,
                            format!("target {t:?} is already in target group {other:?}"),
                        ));
                    }
                    // REPORT TARGET PORT GROUPS names ports by relative
                    // target port identifier: two targets with one id
                    // would be one port.
                    if let Some(other) = ports.insert(r, t.as_str()) {
                        return Err(ConfigError::invalid(
                            here,
                            format!(
                                "target {t:?} has relative target port id {r}, as {other:?} has; \
                                 give one of them another rel_tgt_id"
                            ),
                        ));
                    }
                }
                for (k, &r) in tg.rel_tgt_ids.iter().enumerate() {
                    let here = format!("{gat}.rel_tgt_ids[{k}]");
                    if r == 0 {
                        return Err(ConfigError::invalid(here, "0; valid: 1 to 65535"));
                    }
                    if let Some(other) = ports.insert(r, "a port of another node") {
                        return Err(ConfigError::invalid(
                            here,
                            format!("relative target port id {r} is already {other:?}'s"),
                        ));
                    }
                }
                if let Some(n) = &tg.node
                    && n.is_empty()
                {
                    return Err(ConfigError::invalid(
                        format!("{gat}.node"),
                        "empty; a cluster node's name",
                    ));
                }
            }
        }
        Ok(())
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        let mut names = BTreeMap::new();
        for (i, d) in self.devices.iter().enumerate() {
            let at = format!("devices[{i}]");
            d.validate(&at)?;
            if let Some(prev) = names.insert(d.name.as_str(), i) {
                return Err(ConfigError::invalid(
                    format!("{at}.name"),
                    format!("device {:?} is already defined at devices[{prev}]", d.name),
                ));
            }
        }
        let devices: BTreeSet<&str> = names.keys().copied().collect();
        self.validate_rel_tgt_ids()?;
        let mut targets = BTreeMap::new();
        for (i, t) in self.targets.iscsi.iter().enumerate() {
            let at = format!("targets.iscsi[{i}]");
            validate_iscsi_name(&t.name)
                .map_err(|m| ConfigError::invalid(format!("{at}.name"), m))?;
            if let Some(prev) = targets.insert(t.name.as_str(), i) {
                return Err(ConfigError::invalid(
                    format!("{at}.name"),
                    format!(
                        "target {:?} is already defined at targets.iscsi[{prev}]",
                        t.name
                    ),
                ));
            }
            for (j, p) in t.portals.iter().enumerate() {
                if parse_portal(p).is_err() {
                    return Err(ConfigError::invalid(
                        format!("{at}.portals[{j}]"),
                        format!(
                            "{p:?} is not an address:port; valid: \"192.0.2.1:3260\", \"[::1]:3260\", \"iser:192.0.2.1:3260\""
                        ),
                    ));
                }
            }
            if let Some(a) = &t.alias {
                // RFC 7143 §13.6 TargetAlias: UTF-8 text, at most 255 bytes.
                if a.len() > 255 || a.chars().any(char::is_control) {
                    return Err(ConfigError::invalid(
                        format!("{at}.alias"),
                        "an alias is at most 255 bytes of printable text",
                    ));
                }
            }
            validate_lun_map(&t.luns, &devices, &format!("{at}.luns"))?;
            validate_chap(
                &t.incoming_users,
                t.outgoing_user.as_ref(),
                &at,
                "incoming_users",
                "outgoing_user",
            )?;
            let mut groups = BTreeMap::new();
            let mut patterns: BTreeMap<&str, &str> = BTreeMap::new();
            for (j, g) in t.ini_groups.iter().enumerate() {
                let gat = format!("{at}.ini_groups[{j}]");
                validate_object_name(&g.name)
                    .map_err(|m| ConfigError::invalid(format!("{gat}.name"), m))?;
                if let Some(prev) = groups.insert(g.name.as_str(), j) {
                    return Err(ConfigError::invalid(
                        format!("{gat}.name"),
                        format!(
                            "group {:?} is already defined at {at}.ini_groups[{prev}]",
                            g.name
                        ),
                    ));
                }
                for (k, p) in g.initiators.iter().enumerate() {
                    validate_initiator_pattern(p)
                        .map_err(|m| ConfigError::invalid(format!("{gat}.initiators[{k}]"), m))?;
                    // An initiator belongs to at most one group of a target,
                    // or its LUN map would be ambiguous.
                    if let Some(other) = patterns.insert(p.as_str(), g.name.as_str()) {
                        return Err(ConfigError::invalid(
                            format!("{gat}.initiators[{k}]"),
                            format!("initiator {p:?} is already in group {other:?}"),
                        ));
                    }
                }
                validate_lun_map(&g.luns, &devices, &format!("{gat}.luns"))?;
            }
            for (g, users) in &t.group_incoming_users {
                let gat = format!("{at}.group_incoming_users.{g}");
                if !groups.contains_key(g.as_str()) {
                    return Err(ConfigError::invalid(
                        gat,
                        format!("target has no initiator group {g:?}"),
                    ));
                }
                // The same rules as the target's users, including RFC 7143
                // §12.1.3: not the secret the target answers mutual CHAP with.
                validate_chap(
                    users,
                    t.outgoing_user.as_ref(),
                    &format!("{at}.group_incoming_users"),
                    g,
                    "outgoing_user",
                )?;
            }
        }
        validate_srp_targets(&self.targets.srp, &devices)?;
        self.validate_device_groups()?;
        if let Some(c) = &self.cluster {
            c.validate()?;
        }
        self.iscsi.validate()?;
        if self.reactor.cores == Some(0) {
            return Err(ConfigError::invalid(
                "reactor.cores",
                "0 cores; valid: at least 1, or absent for all available",
            ));
        }
        for (path, us) in [
            ("reactor.poll_us", self.reactor.poll_us),
            ("reactor.latency_poll_us", self.reactor.latency_poll_us),
        ] {
            if us > 1_000_000 {
                return Err(ConfigError::invalid(
                    path,
                    format!("{us} is over one second; valid: 0..1000000"),
                ));
            }
        }
        if let Some(mb) = self.reactor.data_memory_mb
            && !DATA_MEMORY_MB.contains(&mb)
        {
            return Err(ConfigError::invalid(
                "reactor.data_memory_mb",
                format!(
                    "{mb} MiB; valid: {}..{}",
                    DATA_MEMORY_MB.start(),
                    DATA_MEMORY_MB.end()
                ),
            ));
        }
        Ok(())
    }

    /// Writes the configuration so that a crash leaves either the old or the
    /// new file: a temporary file in the same directory (mode 0600), written
    /// and fsynced, renamed over `path`, then the directory fsynced.
    pub fn save_atomic(&self, path: &Path) -> Result<(), ConfigError> {
        let io = |p: &Path| {
            let p = p.to_path_buf();
            move |source| ConfigError::Io { path: p, source }
        };
        let dir = match path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
            _ => PathBuf::from("."),
        };
        let file_name = path
            .file_name()
            .ok_or_else(|| ConfigError::invalid(path.display().to_string(), "not a file name"))?;
        let tmp = dir.join(format!(
            ".{}.tmp.{}",
            file_name.to_string_lossy(),
            std::process::id()
        ));
        let mut text = self.to_json();
        text.push('\n');
        let write = || -> Result<(), ConfigError> {
            let mut f = OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&tmp)
                .map_err(io(&tmp))?;
            f.write_all(text.as_bytes()).map_err(io(&tmp))?;
            f.sync_all().map_err(io(&tmp))?;
            fs::rename(&tmp, path).map_err(io(path))?;
            File::open(&dir)
                .and_then(|d| d.sync_all())
                .map_err(io(&dir))?;
            Ok(())
        };
        let r = write();
        if r.is_err() {
            let _ = fs::remove_file(&tmp);
        }
        r
    }

    /// The configuration ferrited runs with when it has none: target
    /// [`DEFAULT_TARGET_IQN`] on `listen`, LUN 0 the fileio device `disk0`
    /// on `state_dir/disk0.img`, 1 GiB, thin provisioned, created sparse on
    /// first start.
    pub fn embedded_default(state_dir: &Path, listen: SocketAddr) -> Config {
        let mut disk = DeviceConfig::new("disk0", Handler::VdiskFileio);
        // Filenames are absolute (validate): a relative state directory is
        // taken from the current directory.
        let dir = std::path::absolute(state_dir).unwrap_or_else(|_| state_dir.to_path_buf());
        disk.filename = Some(dir.join("disk0.img"));
        disk.size = Some(DEFAULT_IMAGE_SIZE);
        disk.thin_provisioned = true;
        let mut target = IscsiTargetConfig::new(DEFAULT_TARGET_IQN);
        target.portals = vec![listen.to_string()];
        target.luns = vec![LunConfig {
            lun: 0,
            device: "disk0".into(),
            read_only: false,
        }];
        Config {
            devices: vec![disk],
            targets: TargetsConfig {
                iscsi: vec![target],
                srp: Vec::new(),
            },
            iscsi: IscsiParamsConfig::default(),
            reactor: ReactorConfig::default(),
            device_groups: Vec::new(),
            cluster: None,
        }
    }

    /// The device named `name`.
    pub fn device(&self, name: &str) -> Option<&DeviceConfig> {
        self.devices.iter().find(|d| d.name == name)
    }

    /// The iSCSI target named `name`.
    pub fn iscsi_target(&self, name: &str) -> Option<&IscsiTargetConfig> {
        self.targets.iscsi.iter().find(|t| t.name == name)
    }
}

impl IscsiParamsConfig {
    /// The HeaderDigest values accepted, in order of preference (RFC 7143
    /// §13.1): `header_digests`, else `digests`.
    pub fn header_digest_list(&self) -> &[Digest] {
        if self.header_digests.is_empty() {
            &self.digests
        } else {
            &self.header_digests
        }
    }

    /// The DataDigest values accepted: `data_digests`, else `digests`.
    pub fn data_digest_list(&self) -> &[Digest] {
        if self.data_digests.is_empty() {
            &self.digests
        } else {
            &self.data_digests
        }
    }

    fn validate(&self) -> Result<(), ConfigError> {
        const MAX_24: u32 = (1 << 24) - 1;
        for (field, v, sec) in [
            (
                "max_recv_data_segment_length",
                self.max_recv_data_segment_length,
                "13.12",
            ),
            ("max_burst_length", self.max_burst_length, "13.13"),
            ("first_burst_length", self.first_burst_length, "13.14"),
        ] {
            // RFC 7143 §13.12-13.14: 512 to 2^24-1.
            if !(512..=MAX_24).contains(&v) {
                return Err(ConfigError::invalid(
                    format!("iscsi.{field}"),
                    format!("{v} is out of range; valid: 512..{MAX_24} (RFC 7143 §{sec})"),
                ));
            }
        }
        // RFC 7143 §13.14: FirstBurstLength MUST NOT exceed MaxBurstLength.
        if self.first_burst_length > self.max_burst_length {
            return Err(ConfigError::invalid(
                "iscsi.first_burst_length",
                format!(
                    "{} exceeds max_burst_length {} (RFC 7143 §13.14)",
                    self.first_burst_length, self.max_burst_length
                ),
            ));
        }
        // RFC 7143 §13.17 MaxOutstandingR2T and §13.2 MaxConnections: 1..65535.
        if self.max_outstanding_r2t == 0 {
            return Err(ConfigError::invalid(
                "iscsi.max_outstanding_r2t",
                "0 is out of range; valid: 1..65535 (RFC 7143 §13.17)",
            ));
        }
        if self.max_connections == 0 {
            return Err(ConfigError::invalid(
                "iscsi.max_connections",
                "0 is out of range; valid: 1..65535 (RFC 7143 §13.2)",
            ));
        }
        if self.nop_in_interval_s > 0 && self.nop_in_timeout_s == 0 {
            return Err(ConfigError::invalid(
                "iscsi.nop_in_timeout_s",
                "0 with NOP-In enabled; valid: at least 1 second",
            ));
        }
        if !(1..=4096).contains(&self.queue_depth) {
            return Err(ConfigError::invalid(
                "iscsi.queue_depth",
                format!("{} is out of range; valid: 1..4096", self.queue_depth),
            ));
        }
        if self.digests.is_empty() {
            return Err(ConfigError::invalid(
                "iscsi.digests",
                "empty; valid: a list of \"crc32c\" and/or \"none\"",
            ));
        }
        for (field, list) in [
            ("iscsi.digests", &self.digests),
            ("iscsi.header_digests", &self.header_digests),
            ("iscsi.data_digests", &self.data_digests),
        ] {
            if list.len() > 2 || (list.len() == 2 && list[0] == list[1]) {
                return Err(ConfigError::invalid(
                    field,
                    "a digest is listed twice; valid: a list of \"crc32c\" and/or \"none\"",
                ));
            }
        }
        validate_chap(
            &self.discovery_incoming_users,
            self.discovery_outgoing_user.as_ref(),
            "iscsi",
            "discovery_incoming_users",
            "discovery_outgoing_user",
        )?;
        if self.login_timeout_s == 0 {
            return Err(ConfigError::invalid(
                "iscsi.login_timeout_s",
                "0; valid: at least 1 second",
            ));
        }
        Ok(())
    }
}

/// serde_json appends " at line L column C"; the error carries those apart.
fn strip_position(msg: &str) -> String {
    match msg.rfind(" at line ") {
        Some(i) => msg[..i].to_string(),
        None => msg.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Config {
        let mut cfg = Config::embedded_default(
            Path::new("/var/lib/ferrite"),
            "127.0.0.1:3260".parse().unwrap(),
        );
        let mut null = DeviceConfig::new("null0", Handler::VdiskNullio);
        null.size = Some(1 << 30);
        null.mem = true;
        null.blocksize = 4096;
        cfg.devices.push(null);
        let t = &mut cfg.targets.iscsi[0];
        t.incoming_users.push(ChapUser {
            user: "ini".into(),
            secret: "initiator-secret".into(),
        });
        t.outgoing_user = Some(ChapUser {
            user: "tgt".into(),
            secret: "target-secret!".into(),
        });
        t.luns.push(LunConfig {
            lun: 1,
            device: "null0".into(),
            read_only: true,
        });
        t.ini_groups.push(GroupConfig {
            name: "hosts".into(),
            initiators: vec!["iqn.1994-05.com.redhat:*".into()],
            luns: vec![LunConfig {
                lun: 0,
                device: "null0".into(),
                read_only: false,
            }],
        });
        cfg
    }

    #[test]
    fn minimal_file_works() {
        let cfg = Config::from_json("{}", "t").unwrap();
        assert_eq!(cfg, Config::default());
        cfg.validate().unwrap();
        let cfg = Config::from_json(
            r#"{"devices":[{"name":"d","handler":"vdisk_nullio","size":4096}],
                "targets":{"iscsi":[{"name":"iqn.2026-01.org.example:t","luns":[{"lun":0,"device":"d"}]}]}}"#,
            "t",
        )
        .unwrap();
        cfg.validate().unwrap();
        assert_eq!(cfg.devices[0].blocksize, 512);
        assert!(cfg.targets.iscsi[0].enabled);
        assert_eq!(cfg.targets.iscsi[0].tpgt, 1);
        assert_eq!(cfg.iscsi, IscsiParamsConfig::default());
    }

    #[test]
    fn round_trip() {
        let cfg = sample();
        cfg.validate().unwrap();
        let back = Config::from_json(&cfg.to_json(), "t").unwrap();
        assert_eq!(back, cfg);
    }

    #[test]
    fn parse_errors_name_the_path() {
        let e = Config::from_json(
            r#"{"devices":[{"name":"d","handler":"vdisk_nullio","blocksiz":512}]}"#,
            "f.json",
        )
        .unwrap_err();
        let s = e.to_string();
        assert!(s.contains("devices[0]"), "{s}");
        assert!(s.contains("blocksiz"), "{s}");
        let e = Config::from_json(
            r#"{"devices":[{"name":"d","handler":"vdisk_foo"}]}"#,
            "f.json",
        )
        .unwrap_err();
        let s = e.to_string();
        assert!(
            s.contains("devices[0].handler") && s.contains("vdisk_fileio"),
            "{s}"
        );
        let e = Config::from_json(r#"{"devices": ["#, "f.json").unwrap_err();
        assert!(matches!(e, ConfigError::Parse { .. }), "{e}");
    }

    #[test]
    fn every_validation_error() {
        type Edit = fn(&mut Config);
        let cases: Vec<(&str, Edit, &str)> = vec![
            (
                "devices[0].name",
                |c| c.devices[0].name = "bad name".into(),
                "valid characters",
            ),
            (
                "devices[0].name",
                |c| c.devices[0].name = String::new(),
                "1 to 64",
            ),
            (
                "devices[1].name",
                |c| c.devices[1].name = "disk0".into(),
                "already defined",
            ),
            (
                "devices[0].blocksize",
                |c| c.devices[0].blocksize = 1024,
                "512, 4096",
            ),
            (
                "devices[0].filename",
                |c| c.devices[0].filename = None,
                "needs a filename",
            ),
            (
                "devices[0].filename",
                |c| c.devices[0].filename = Some("rel.img".into()),
                "absolute",
            ),
            (
                "devices[1].filename",
                |c| c.devices[1].filename = Some("/x".into()),
                "remove filename",
            ),
            (
                "devices[1].size",
                |c| c.devices[1].size = None,
                "needs a size",
            ),
            (
                "devices[0].size",
                |c| c.devices[0].size = Some(1000),
                "multiple",
            ),
            (
                "devices[0].size",
                |c| c.devices[0].size = Some(0),
                "multiple",
            ),
            (
                "devices[0].size",
                |c| {
                    c.devices[0].handler = Handler::VdiskBlockio;
                },
                "remove size",
            ),
            ("devices[0].mem", |c| c.devices[0].mem = true, "nullio"),
            (
                "devices[0].t10_vendor",
                |c| c.devices[0].t10_vendor = Some("TOOLONGVENDOR".into()),
                "1 to 8",
            ),
            (
                "devices[0].t10_product",
                |c| c.devices[0].t10_product = Some("x".repeat(17)),
                "1 to 16",
            ),
            (
                "devices[0].t10_revision",
                |c| c.devices[0].t10_revision = Some("12345".into()),
                "1 to 4",
            ),
            (
                "devices[0].serial",
                |c| c.devices[0].serial = Some("caf\u{e9}".into()),
                "ASCII",
            ),
            (
                "devices[0].naa",
                |c| c.devices[0].naa = Some("0x6001405000000000".into()),
                "NAA 6 with 8 bytes",
            ),
            (
                "devices[0].naa",
                |c| c.devices[0].naa = Some("0x5001405000000000000000000000000a".into()),
                "NAA 5 with 16 bytes",
            ),
            (
                "devices[0].vpd83",
                |c| c.devices[0].vpd83 = Some("naa,t10,bogus".into()),
                "\"bogus\" is not a designator",
            ),
            (
                "devices[0].vpd83",
                |c| c.devices[0].vpd83 = Some("naa,naa".into()),
                "listed twice",
            ),
            (
                "devices[0].vendor_specific",
                |c| c.devices[0].vendor_specific = Some("x".repeat(21)),
                "at most 20",
            ),
            (
                "devices[0].naa",
                |c| c.devices[0].naa = Some("5001".into()),
                "16 hex",
            ),
            (
                "devices[0].eui64",
                |c| c.devices[0].eui64 = Some("xyz".into()),
                "16, 24 or 32 hex",
            ),
            (
                "targets.iscsi[0].name",
                |c| c.targets.iscsi[0].name = "iqn.2026.org.x".into(),
                "yyyy-mm",
            ),
            (
                "targets.iscsi[0].name",
                |c| c.targets.iscsi[0].name = "iqn.2026-13.org.x".into(),
                "yyyy-mm",
            ),
            (
                "targets.iscsi[0].name",
                |c| c.targets.iscsi[0].name = "iqn.2026-11".into(),
                "reversed.domain",
            ),
            (
                "targets.iscsi[0].name",
                |c| c.targets.iscsi[0].name = "iqn.2026-11.Org.x".into(),
                "lower-case",
            ),
            (
                "targets.iscsi[0].name",
                |c| c.targets.iscsi[0].name = "eui.12".into(),
                "16 hex",
            ),
            (
                "targets.iscsi[0].name",
                |c| c.targets.iscsi[0].name = "naa.123".into(),
                "16 or 32",
            ),
            (
                "targets.iscsi[0].name",
                |c| c.targets.iscsi[0].name = "foo.bar".into(),
                "unknown iSCSI name type",
            ),
            (
                "targets.iscsi[0].name",
                |c| c.targets.iscsi[0].name = format!("iqn.2026-11.org.x:{}", "a".repeat(220)),
                "223",
            ),
            (
                "targets.iscsi[1].name",
                |c| {
                    let t = c.targets.iscsi[0].clone();
                    c.targets.iscsi.push(t);
                },
                "already defined",
            ),
            (
                "targets.iscsi[0].portals[0]",
                |c| c.targets.iscsi[0].portals[0] = "localhost".into(),
                "address:port",
            ),
            (
                "targets.iscsi[0].alias",
                |c| c.targets.iscsi[0].alias = Some("a\nb".into()),
                "alias",
            ),
            (
                "targets.iscsi[0].luns[1].lun",
                |c| c.targets.iscsi[0].luns[1].lun = 0,
                "already used",
            ),
            (
                "targets.iscsi[0].luns[1].lun",
                |c| c.targets.iscsi[0].luns[1].lun = 16384,
                "0..16383",
            ),
            (
                "targets.iscsi[0].luns[1].device",
                |c| c.targets.iscsi[0].luns[1].device = "nope".into(),
                "no device",
            ),
            (
                "targets.iscsi[0].ini_groups[0].name",
                |c| c.targets.iscsi[0].ini_groups[0].name = "a/b".into(),
                "valid characters",
            ),
            (
                "targets.iscsi[0].ini_groups[1].name",
                |c| {
                    let mut g = c.targets.iscsi[0].ini_groups[0].clone();
                    g.initiators.clear();
                    c.targets.iscsi[0].ini_groups.push(g);
                },
                "already defined",
            ),
            (
                "targets.iscsi[0].ini_groups[1].initiators[0]",
                |c| {
                    let mut g = c.targets.iscsi[0].ini_groups[0].clone();
                    g.name = "other".into();
                    c.targets.iscsi[0].ini_groups.push(g);
                },
                "already in group",
            ),
            (
                "targets.iscsi[0].ini_groups[0].initiators[0]",
                |c| c.targets.iscsi[0].ini_groups[0].initiators[0] = "a b".into(),
                "no spaces",
            ),
            (
                "targets.iscsi[0].ini_groups[0].luns[0].device",
                |c| c.targets.iscsi[0].ini_groups[0].luns[0].device = "x".into(),
                "no device",
            ),
            (
                "iscsi.max_burst_length",
                |c| c.iscsi.max_burst_length = 100,
                "512..",
            ),
            (
                "iscsi.max_recv_data_segment_length",
                |c| c.iscsi.max_recv_data_segment_length = 1 << 24,
                "512..",
            ),
            (
                "iscsi.first_burst_length",
                |c| c.iscsi.first_burst_length = 1 << 23,
                "exceeds",
            ),
            (
                "iscsi.max_outstanding_r2t",
                |c| c.iscsi.max_outstanding_r2t = 0,
                "1..65535",
            ),
            (
                "iscsi.max_connections",
                |c| c.iscsi.max_connections = 0,
                "1..65535",
            ),
            (
                "iscsi.nop_in_timeout_s",
                |c| c.iscsi.nop_in_timeout_s = 0,
                "at least 1",
            ),
            (
                "iscsi.login_timeout_s",
                |c| c.iscsi.login_timeout_s = 0,
                "at least 1",
            ),
            ("reactor.cores", |c| c.reactor.cores = Some(0), "at least 1"),
            (
                "reactor.data_memory_mb",
                |c| c.reactor.data_memory_mb = Some(10),
                "64..",
            ),
            ("iscsi.queue_depth", |c| c.iscsi.queue_depth = 0, "1..4096"),
            ("iscsi.digests", |c| c.iscsi.digests.clear(), "empty"),
            (
                "iscsi.data_digests",
                |c| c.iscsi.data_digests = vec![Digest::Crc32c, Digest::Crc32c],
                "twice",
            ),
            (
                "targets.iscsi[0].group_incoming_users.nogroup",
                |c| {
                    c.targets.iscsi[0].group_incoming_users.insert(
                        "nogroup".into(),
                        vec![ChapUser {
                            user: "g".into(),
                            secret: "group-secret-1234".into(),
                        }],
                    );
                },
                "no initiator group",
            ),
            (
                "iscsi.digests",
                |c| c.iscsi.digests = vec![Digest::Off, Digest::Off],
                "twice",
            ),
            (
                "iscsi.discovery_incoming_users[0].secret",
                |c| {
                    c.iscsi.discovery_incoming_users = vec![ChapUser {
                        user: "u".into(),
                        secret: "short".into(),
                    }]
                },
                "12 to 255",
            ),
            (
                "targets.iscsi[0].incoming_users[1].user",
                |c| {
                    let u = ChapUser {
                        user: "u".into(),
                        secret: "0123456789ab".into(),
                    };
                    c.targets.iscsi[0].incoming_users = vec![u.clone(), u];
                },
                "listed twice",
            ),
            (
                "targets.iscsi[0].incoming_users[0].user",
                |c| {
                    c.targets.iscsi[0].incoming_users = vec![ChapUser {
                        user: String::new(),
                        secret: "0123456789ab".into(),
                    }]
                },
                "1 to 255",
            ),
            (
                "targets.iscsi[0].outgoing_user.secret",
                |c| {
                    let u = ChapUser {
                        user: "u".into(),
                        secret: "0123456789ab".into(),
                    };
                    c.targets.iscsi[0].incoming_users = vec![u.clone()];
                    c.targets.iscsi[0].outgoing_user = Some(ChapUser {
                        user: "t".into(),
                        ..u
                    });
                },
                "different secrets",
            ),
            (
                "reactor.poll_us",
                |c| c.reactor.poll_us = 2_000_000,
                "0..1000000",
            ),
            (
                "reactor.latency_poll_us",
                |c| c.reactor.latency_poll_us = 2_000_000,
                "0..1000000",
            ),
        ];
        for (want_at, edit, want_msg) in cases {
            let mut cfg = sample();
            edit(&mut cfg);
            match cfg.validate() {
                Err(ConfigError::Invalid { at, msg }) => {
                    assert_eq!(at, want_at, "{msg}");
                    assert!(msg.contains(want_msg), "{at}: {msg:?} lacks {want_msg:?}");
                }
                other => panic!("{want_at}: expected an error, got {other:?}"),
            }
        }
    }

    #[test]
    fn iscsi_names() {
        for ok in [
            "iqn.2026-11.org.ferrite:default",
            "iqn.1994-05.com.redhat:abc",
            "iqn.2001-04.com.example",
            "eui.02004567a425678d",
            "naa.52004567ba64678d",
            "naa.62004567ba64678d0123456789abcdef",
        ] {
            validate_iscsi_name(ok).unwrap();
        }
    }

    #[test]
    fn a_target_may_have_tcp_and_iser_portals() {
        let mut t = IscsiTargetConfig::new("iqn.2026-12.org.ferrite:t");
        t.portals = vec![
            "192.0.2.1:3260".into(),
            "iser:192.0.2.1:3260".into(),
            "iser:[::1]:3261".into(),
        ];
        let a = |s: &str| s.parse::<SocketAddr>().unwrap();
        assert_eq!(t.portal_addrs(), vec![a("192.0.2.1:3260")]);
        assert_eq!(
            t.iser_portal_addrs(),
            vec![a("192.0.2.1:3260"), a("[::1]:3261")]
        );
        assert_eq!(
            t.all_portal_addrs(),
            vec![a("192.0.2.1:3260"), a("[::1]:3261")]
        );
        assert!(parse_portal("iser:192.0.2.1").is_err());
        assert!(parse_portal("rdma:192.0.2.1:3260").is_err());
        let mut cfg = Config::default();
        cfg.targets.iscsi = vec![t.clone()];
        cfg.validate().unwrap();
        t.portals = vec!["iser:nowhere".into()];
        cfg.targets.iscsi = vec![t];
        assert!(cfg.validate().is_err());
    }

    #[test]
    fn derived_ids_are_stable_and_distinct() {
        let a = DeviceConfig::new("disk0", Handler::VdiskFileio);
        let b = DeviceConfig::new("disk1", Handler::VdiskFileio);
        assert_eq!(
            a.effective_naa(),
            DeviceConfig::new("disk0", Handler::VdiskNullio).effective_naa()
        );
        assert_ne!(a.effective_naa(), b.effective_naa());
        assert_ne!(a.effective_eui64(), b.effective_eui64());
        assert_ne!(a.effective_serial(), b.effective_serial());
        // Derived ids are locally assigned: NAA 3, and an EUI-64 with the
        // U/L bit set, so no company's id can equal them.
        assert_eq!(a.effective_naa().len(), 8);
        assert_eq!(a.effective_naa()[0] >> 4, 3);
        assert_eq!(a.effective_eui64().len(), 8);
        assert_eq!(a.effective_eui64()[0] & 0x0f, DERIVED_EUI64_LOCAL);
        assert_eq!(a.effective_serial().len(), 16);
        // Fixed values: a change here changes every deployed device's identity.
        let sha = Sha256::digest(b"ferrite-device:disk0");
        let expect: String = sha[..8].iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(a.effective_serial(), expect);
        let mut naa = sha[8..16].to_vec();
        naa[0] = 0x30 | (naa[0] & 0x0f);
        assert_eq!(a.effective_naa(), naa);
        let mut eui = sha[16..24].to_vec();
        eui[0] = (eui[0] & 0xf0) | 0x02;
        assert_eq!(a.effective_eui64(), eui);
        let mut c = a.clone();
        c.naa = Some("0x5000000000000001".into());
        c.eui64 = Some("0011223344556677".into());
        c.serial = Some("S1".into());
        assert_eq!(c.effective_naa(), 0x5000_0000_0000_0001u64.to_be_bytes());
        assert_eq!(c.effective_eui64(), 0x0011_2233_4455_6677u64.to_be_bytes());
        c.naa = Some("0x6001405abcdef0123456789abcdef012".into());
        assert_eq!(c.effective_naa().len(), 16);
        assert_eq!(
            hex_id(&c.effective_naa()),
            "0x6001405abcdef0123456789abcdef012"
        );
        let id = c.identity();
        assert_eq!(id.serial, "S1");
        assert_eq!(id.vendor, "FERRITE");
    }

    #[test]
    fn default_config() {
        let dir = Path::new("/srv/ferrite");
        let cfg = Config::embedded_default(dir, "127.0.0.1:3260".parse().unwrap());
        cfg.validate().unwrap();
        assert_eq!(cfg.devices.len(), 1);
        let d = &cfg.devices[0];
        assert_eq!(d.name, "disk0");
        assert_eq!(d.handler, Handler::VdiskFileio);
        assert_eq!(d.filename.as_deref(), Some(dir.join("disk0.img").as_path()));
        assert_eq!(d.size, Some(1 << 30));
        assert!(d.thin_provisioned);
        let t = &cfg.targets.iscsi[0];
        assert_eq!(t.name, DEFAULT_TARGET_IQN);
        assert!(t.enabled);
        assert_eq!(
            t.portal_addrs(),
            vec!["127.0.0.1:3260".parse::<SocketAddr>().unwrap()]
        );
        assert_eq!(
            t.luns,
            vec![LunConfig {
                lun: 0,
                device: "disk0".into(),
                read_only: false
            }]
        );
        let rel = Config::embedded_default(Path::new("state"), "127.0.0.1:3260".parse().unwrap());
        rel.validate().unwrap();
        let f = rel.devices[0].filename.clone().unwrap();
        assert!(
            f.is_absolute() && f.ends_with("state/disk0.img"),
            "{}",
            f.display()
        );
        let v6 = Config::embedded_default(dir, "[::1]:3260".parse().unwrap());
        v6.validate().unwrap();
        assert_eq!(v6.targets.iscsi[0].portals, vec!["[::1]:3260".to_string()]);
    }

    #[test]
    fn atomic_save_leaves_no_temp_file() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ferrite.json");
        let cfg = sample();
        cfg.save_atomic(&path).unwrap();
        // Overwrite an existing file too.
        let mut cfg2 = cfg.clone();
        cfg2.reactor.poll_us = 50;
        cfg2.save_atomic(&path).unwrap();
        let names: Vec<_> = fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert_eq!(names, vec!["ferrite.json".to_string()]);
        let mode = fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        assert_eq!(Config::load(&path).unwrap(), cfg2);
        // A directory that does not exist: an error naming it, nothing left.
        let bad = dir.path().join("missing").join("x.json");
        let e = cfg.save_atomic(&bad).unwrap_err();
        assert!(e.to_string().contains("missing"), "{e}");
    }

    #[test]
    fn shipped_example_is_valid() {
        let cfg = Config::from_json(include_str!("../examples/ferrite.json"), "example").unwrap();
        cfg.validate().unwrap();
        assert_eq!(cfg.devices.len(), 3);
        assert_eq!(cfg.iscsi.nop_in_interval_s, 15);
        assert_eq!(
            cfg.iscsi.max_burst_length,
            IscsiParamsConfig::default().max_burst_length
        );
    }

    #[test]
    fn load_validates() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.json");
        fs::write(
            &path,
            r#"{"devices":[{"name":"d","handler":"vdisk_nullio"}]}"#,
        )
        .unwrap();
        let e = Config::load(&path).unwrap_err();
        assert!(e.to_string().contains("devices[0].size"), "{e}");
        let e = Config::load(&dir.path().join("none.json")).unwrap_err();
        assert!(matches!(e, ConfigError::Io { .. }));
    }

    fn with_srp(t: SrpTargetConfig) -> Config {
        let mut cfg = sample();
        cfg.targets.srp.push(t);
        cfg
    }

    #[test]
    fn srp_ports_validate_and_round_trip() {
        let mut t = SrpTargetConfig::soft("srp0", "/run/ferrite/srp0.sock");
        t.luns.push(LunConfig {
            lun: 0,
            device: "disk0".into(),
            read_only: false,
        });
        t.ini_groups.push(GroupConfig {
            name: "hosts".into(),
            initiators: vec!["0x0707*".into()],
            luns: Vec::new(),
        });
        let cfg = with_srp(t.clone());
        cfg.validate().unwrap();
        let back: Config = serde_json::from_str(&cfg.to_json()).unwrap();
        assert_eq!(back, cfg);
        // Configurations without SRP keep their old shape.
        assert!(!sample().to_json().contains("\"srp\""));

        let bad = |f: &dyn Fn(&mut SrpTargetConfig), field: &str| {
            let mut b = t.clone();
            f(&mut b);
            let e = with_srp(b).validate().unwrap_err();
            assert!(e.to_string().contains(field), "{field}: {e}");
        };
        bad(&|b| b.name = "a b".into(), "targets.srp[0].name");
        bad(
            &|b| b.port_id = Some("0x12".into()),
            "targets.srp[0].port_id",
        );
        bad(&|b| b.credits = 0, "targets.srp[0].credits");
        bad(
            &|b| {
                b.provider = SrpProviderConfig::Soft {
                    listen: "relative.sock".into(),
                }
            },
            "targets.srp[0].provider.listen",
        );
        bad(
            &|b| {
                b.provider = SrpProviderConfig::Verbs {
                    device: None,
                    port: 0,
                    listen: "0.0.0.0:0".into(),
                }
            },
            "targets.srp[0].provider.port",
        );
        bad(
            &|b| b.luns[0].device = "nosuch".into(),
            "targets.srp[0].luns",
        );
        bad(
            &|b| b.ini_groups.push(b.ini_groups[0].clone()),
            "targets.srp[0].ini_groups[1].name",
        );
        // Two ports on one endpoint, or with one name.
        let mut cfg = with_srp(t.clone());
        let mut t2 = t.clone();
        t2.name = "srp1".into();
        cfg.targets.srp.push(t2);
        let e = cfg.validate().unwrap_err();
        assert!(
            e.to_string().contains("targets.srp[1].provider.listen"),
            "{e}"
        );
    }

    #[test]
    fn srp_port_ids() {
        assert_eq!(
            parse_port_id("0x000102030405060708090a0b0c0d0e0f"),
            Some([0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15])
        );
        assert_eq!(parse_port_id("000102030405060708090a0b0c0d0e0"), None);
        assert_eq!(parse_port_id("0x000102030405060708090a0b0c0d0e0g"), None);
        let mut a = SrpTargetConfig::soft("a", "/x");
        let b = SrpTargetConfig::soft("b", "/y");
        assert_ne!(a.port_id_bytes(), b.port_id_bytes());
        assert_eq!(
            a.port_id_bytes(),
            SrpTargetConfig::soft("a", "/z").port_id_bytes()
        );
        a.port_id = Some("ff".repeat(16));
        assert_eq!(a.port_id_bytes(), [0xff; 16]);
    }

    const ALUA_JSON: &str = r#"{
      "devices": [{"name": "disk0", "handler": "vdisk_nullio", "size": 4096},
                  {"name": "disk1", "handler": "vdisk_nullio", "size": 4096}],
      "targets": {"iscsi": [
        {"name": "iqn.2026-11.org.example:a", "tpgt": 1},
        {"name": "iqn.2026-11.org.example:b", "tpgt": 2}],
        "srp": [{"name": "srp0", "provider": {"kind": "soft", "listen": "/tmp/ferrite-srp0"}}]},
      "device_groups": [
        { "name": "dg1", "devices": ["disk0"],
          "target_groups": [
            { "name": "tg_a", "group_id": 1, "state": "active", "preferred": true,
              "targets": ["iqn.2026-11.org.example:a"] },
            { "name": "tg_b", "group_id": 2, "state": "nonoptimized",
              "targets": ["iqn.2026-11.org.example:b", "srp0"] } ] } ]
    }"#;

    fn alua() -> Config {
        let cfg = Config::from_json(ALUA_JSON, "t").unwrap();
        cfg.validate().unwrap();
        cfg
    }

    #[test]
    fn device_groups_round_trip_and_defaults() {
        let cfg = alua();
        let dg = &cfg.device_groups[0];
        assert_eq!(dg.target_groups[1].state, "nonoptimized");
        assert!(!dg.target_groups[1].preferred);
        let back = Config::from_json(&cfg.to_json(), "t").unwrap();
        assert_eq!(back, cfg);
        let defaulted = Config::from_json(
            &ALUA_JSON.replace(r#""state": "active", "preferred": true,"#, ""),
            "t",
        )
        .unwrap();
        assert_eq!(defaulted.device_groups[0].target_groups[0].state, "active");
        assert!(!defaulted.device_groups[0].target_groups[0].preferred);
        // Absent when empty; preferred false is left out.
        assert!(!sample().to_json().contains("device_groups"));
        assert!(!defaulted.to_json().contains("\"preferred\""));
        // The SRP port's relative id follows the iSCSI targets'.
        assert_eq!(cfg.rel_port_ids().get("srp0"), Some(&3));
    }

    /// `c`'s cluster, a valid one made first if it has none.
    fn cluster(c: &mut Config) -> &mut ClusterConfig {
        c.cluster.get_or_insert_with(|| ClusterConfig {
            node: "a".into(),
            etcd: vec!["http://127.0.0.1:2379".into()],
            prefix: "/ferrite/t".into(),
            lease_ttl_s: 5,
        })
    }

    #[test]
    fn a_cluster_node_round_trips_with_defaults() {
        let mut c = alua();
        cluster(&mut c);
        c.device_groups[0].target_groups[0].node = Some("a".into());
        c.device_groups[0].target_groups[1].node = Some("b".into());
        c.device_groups[0].target_groups[1].rel_tgt_ids = vec![9];
        c.validate().unwrap();
        assert!(c.device_groups[0].clustered());
        let back = Config::from_json(&c.to_json(), "t").unwrap();
        assert_eq!(back, c);
        let mut v: serde_json::Value = serde_json::from_str(&c.to_json()).unwrap();
        let cl = v["cluster"].as_object_mut().unwrap();
        cl.remove("prefix");
        cl.remove("lease_ttl_s");
        let min = Config::from_json(&v.to_string(), "t").unwrap();
        let mc = min.cluster.unwrap();
        assert_eq!((mc.prefix.as_str(), mc.lease_ttl_s), ("/ferrite", 5));
        assert!(!alua().to_json().contains("cluster"));
    }

    #[test]
    fn every_device_group_refusal() {
        type Edit = fn(&mut Config);
        let cases: Vec<(&str, Edit, &str)> = vec![
            (
                "device_groups[1].name",
                |c| c.device_groups.push(DeviceGroupConfig::new("dg1")),
                "already defined",
            ),
            (
                "device_groups[0].name",
                |c| c.device_groups[0].name = "bad name".into(),
                "valid characters",
            ),
            (
                "device_groups[0].devices[1]",
                |c| c.device_groups[0].devices.push("nope".into()),
                "no device",
            ),
            (
                "device_groups[1].devices[0]",
                |c| {
                    let mut g = DeviceGroupConfig::new("dg2");
                    g.devices.push("disk0".into());
                    c.device_groups.push(g);
                },
                "already in device group \"dg1\"",
            ),
            (
                "device_groups[0].target_groups[1].name",
                |c| c.device_groups[0].target_groups[1].name = "tg_a".into(),
                "already defined",
            ),
            (
                "device_groups[0].target_groups[0].group_id",
                |c| c.device_groups[0].target_groups[0].group_id = 0,
                "1 to 65535",
            ),
            (
                "device_groups[0].target_groups[0].group_id",
                |c| c.device_groups[0].target_groups[0].group_id = 65536,
                "1 to 65535",
            ),
            (
                "device_groups[0].target_groups[1].group_id",
                |c| c.device_groups[0].target_groups[1].group_id = 1,
                "already the id of target group \"tg_a\"",
            ),
            (
                "device_groups[0].target_groups[0].state",
                |c| c.device_groups[0].target_groups[0].state = "sleepy".into(),
                "nonoptimized, standby",
            ),
            (
                "device_groups[0].target_groups[0].targets[1]",
                |c| {
                    c.device_groups[0].target_groups[0]
                        .targets
                        .push("iqn.2026-11.org.example:z".into())
                },
                "no iSCSI target or SRP port",
            ),
            (
                "device_groups[0].target_groups[1].targets[1]",
                |c| {
                    c.device_groups[0].target_groups[0]
                        .targets
                        .push("srp0".into())
                },
                "already in target group \"tg_a\"",
            ),
            (
                "device_groups[0].target_groups[0].targets[1]",
                |c| {
                    c.device_groups[0].target_groups[0]
                        .targets
                        .insert(0, "iqn.2026-11.org.example:a".into())
                },
                "already in target group \"tg_a\"",
            ),
            (
                "device_groups[0].target_groups[1].targets[1]",
                // The SRP port's explicit id is the first target's tpgt.
                |c| c.targets.srp[0].rel_tgt_id = Some(2),
                "relative target port id 2",
            ),
            (
                "device_groups[0].target_groups[1].targets[0]",
                // Derived ids: the second target's tpgt equals the first's.
                |c| c.targets.iscsi[1].tpgt = 1,
                "relative target port id 1",
            ),
            (
                "device_groups[0].target_groups[1].rel_tgt_ids[0]",
                // A peer's port with the id of a local target.
                |c| c.device_groups[0].target_groups[1].rel_tgt_ids = vec![1],
                "relative target port id 1 is already",
            ),
            (
                "device_groups[0].target_groups[0].rel_tgt_ids[0]",
                |c| c.device_groups[0].target_groups[0].rel_tgt_ids = vec![0],
                "valid: 1 to 65535",
            ),
            (
                "device_groups[0].target_groups[0].node",
                |c| c.device_groups[0].target_groups[0].node = Some(String::new()),
                "cluster node",
            ),
            (
                "cluster.node",
                |c| cluster(c).node.clear(),
                "this node's name",
            ),
            ("cluster.etcd", |c| cluster(c).etcd.clear(), "no endpoint"),
            (
                "cluster.etcd[0]",
                |c| cluster(c).etcd = vec!["127.0.0.1:2379".into()],
                "http://HOST:PORT",
            ),
            (
                "cluster.prefix",
                |c| cluster(c).prefix = "ferrite/".into(),
                "starts with /",
            ),
            (
                "cluster.lease_ttl_s",
                |c| cluster(c).lease_ttl_s = 1,
                "2 to 600",
            ),
        ];
        for (at, edit, want) in cases {
            let mut c = alua();
            edit(&mut c);
            match c.validate() {
                Err(ConfigError::Invalid { at: a, msg }) => {
                    assert_eq!(a, at, "{msg}");
                    assert!(msg.contains(want), "{at}: {msg}");
                }
                other => panic!("{at}: expected a refusal, got {other:?}"),
            }
        }
    }
}
