//! The object tree, shaped like SCST's sysfs:
//!
//! ```text
//! /{data_memory_mb,data_memory}
//! /handlers/{vdisk_fileio,vdisk_blockio,vdisk_nullio}/mgmt
//! /devices/<name>/{handler,filename,size,blocksize,read_only,...,resync_size,stats,exported}
//! /targets/iscsi/{mgmt,<iSCSI parameter>...}
//! /targets/iscsi/<iqn>/{enabled,portals,tpgt,alias}
//! /targets/iscsi/<iqn>/luns/{mgmt,<lun>/{device,read_only}}
//! /targets/iscsi/<iqn>/ini_groups/{mgmt,<g>/{initiators/{mgmt,<pattern>},luns/...}}
//! /targets/iscsi/<iqn>/sessions/<initiator>/{initiator_name,isid,tsih,group,connections,...,force_close}
//! /targets/srp/mgmt
//! /targets/srp/<port>/{enabled,port_id,provider,listen,credits}
//! /targets/srp/<port>/{luns,ini_groups,sessions}/...   (as for an iSCSI target)
//! ```
//!
//! Leaves are attributes (`get`, and `set` when writable) or `mgmt` leaves
//! (`do` runs an SCST command; `get` prints the command syntax). A read
//! shows `[key]` on a second line when the value differs from the default,
//! i.e. when a saved configuration must carry it, as SCST does.
//!
//! The tree's model is a [`Config`]: every command becomes a [`Change`] that
//! is validated against the whole configuration before the [`Runtime`] sees
//! it, so `save` writes the model and `apply` is a [`plan`] between two
//! configurations.
//!
//! Not owned here: the socket ([`crate::server`]) and the running system
//! ([`Runtime`]).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::change::{Change, device_attr_changes, plan};
use crate::config::{
    ChapUser, Config, ConfigError, DATA_MEMORY_MB, DeviceConfig, GroupConfig, Handler,
    IscsiParamsConfig, IscsiTargetConfig, LunConfig, MAX_LUNS, validate_initiator_pattern,
    validate_iscsi_name, validate_object_name,
};
use crate::runtime::{
    DataMemoryStats, Fabric, IoStats, Runtime, RuntimeError, SessionInfo, TargetAttr,
};

/// What went wrong with a management operation. Nothing changed unless the
/// error says so ([`MgmtError::Apply`]).
#[derive(Debug, thiserror::Error)]
pub enum MgmtError {
    #[error("{path}: no such object; {hint}")]
    NoSuchPath { path: String, hint: String },
    #[error("{msg}\nusage:\n{usage}")]
    Usage { msg: String, usage: String },
    #[error("{path}: {msg}")]
    NotWritable { path: String, msg: String },
    #[error("{0}")]
    Refused(String),
    #[error("invalid configuration: {0}")]
    Config(#[from] ConfigError),
    #[error("{what}: {source}")]
    Runtime {
        what: String,
        #[source]
        source: RuntimeError,
    },
    #[error("apply stopped after {done} of {total} changes at `{failed}`: {source}")]
    Apply {
        done: usize,
        total: usize,
        failed: String,
        #[source]
        source: Box<MgmtError>,
    },
}

/// What kind of node an entry is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EntryKind {
    Dir,
    Attr,
    Mgmt,
    /// A name that stands for an object elsewhere (a device under its
    /// handler, a pattern under `initiators`).
    Link,
}

/// One entry of a listing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    pub name: String,
    pub kind: EntryKind,
    pub writable: bool,
    pub description: String,
}

/// An attribute read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AttrValue {
    pub value: String,
    /// Differs from the default: a saved configuration carries it.
    pub key: bool,
    pub writable: bool,
    pub description: String,
}

impl AttrValue {
    /// SCST's text form: the value, then `[key]` on its own line if set.
    pub fn to_text(&self) -> String {
        if self.key {
            format!("{}\n[key]", self.value)
        } else {
            self.value.clone()
        }
    }
}

struct AttrDef {
    name: &'static str,
    desc: &'static str,
}

/// Attributes of `/`: the daemon-wide data memory budget.
const ROOT_ATTRS: &[AttrDef] = &[
    AttrDef {
        name: "data_memory_mb",
        desc: "MiB all commands' data buffers may hold at once, 64..1073741824; empty or \"default\": an eighth of the memory, between 256 MiB and 4 GiB",
    },
    AttrDef {
        name: "data_memory",
        desc: "data memory budget: limit, used and peak in bytes, holders (sessions holding buffers), waiting and waits (commands) (read-only)",
    },
];

const DEVICE_ATTRS: &[AttrDef] = &[
    AttrDef {
        name: "handler",
        desc: "device handler (read-only)",
    },
    AttrDef {
        name: "filename",
        desc: "backing file or block device (read-only; del_device and add_device to change)",
    },
    AttrDef {
        name: "size",
        desc: "size in bytes; writing resizes (fileio, nullio)",
    },
    AttrDef {
        name: "blocksize",
        desc: "logical block size: 512 or 4096 (read-only)",
    },
    AttrDef {
        name: "read_only",
        desc: "0|1: refuse writes",
    },
    AttrDef {
        name: "write_through",
        desc: "0|1: complete writes only once stable",
    },
    AttrDef {
        name: "thin_provisioned",
        desc: "0|1: UNMAP and WRITE SAME unmap (read-only)",
    },
    AttrDef {
        name: "rotational",
        desc: "0|1: report a rotating medium (VPD B1h)",
    },
    AttrDef {
        name: "nv_cache",
        desc: "0|1: ignore SYNCHRONIZE CACHE (battery-backed cache)",
    },
    AttrDef {
        name: "removable",
        desc: "0|1: removable medium, INQUIRY RMB; START STOP UNIT ejects and loads it (read-only)",
    },
    AttrDef {
        name: "mem",
        desc: "0|1: keep written data in RAM (nullio; read-only)",
    },
    AttrDef {
        name: "serial",
        desc: "unit serial number (VPD 80h); empty restores the derived one",
    },
    AttrDef {
        name: "t10_vendor",
        desc: "INQUIRY vendor, at most 8 characters",
    },
    AttrDef {
        name: "t10_product",
        desc: "INQUIRY product, at most 16 characters",
    },
    AttrDef {
        name: "t10_revision",
        desc: "INQUIRY revision, at most 4 characters",
    },
    AttrDef {
        name: "naa",
        desc: "NAA IEEE Registered id, 16 hex digits starting with 5",
    },
    AttrDef {
        name: "eui64",
        desc: "EUI-64 id, 16 hex digits",
    },
    AttrDef {
        name: "resync_size",
        desc: "write 1 to re-read the backing size (write-only)",
    },
    AttrDef {
        name: "stats",
        desc: "I/O counters (read-only)",
    },
    AttrDef {
        name: "exported",
        desc: "where the device is mapped: target/LUN (read-only)",
    },
];

/// Attributes of `/targets/srp/<port>`; `enabled` is writable, the others
/// are fixed when the port is added (`/targets/srp/mgmt`).
const SRP_ATTRS: &[AttrDef] = &[
    AttrDef {
        name: "enabled",
        desc: "0|1: accept new logins",
    },
    AttrDef {
        name: "port_id",
        desc: "SRP target port identifier (SRP r16a §5.5.8)",
    },
    AttrDef {
        name: "provider",
        desc: "RDMA provider: soft (test and development) or verbs",
    },
    AttrDef {
        name: "listen",
        desc: "where the port listens (socket path or address:port)",
    },
    AttrDef {
        name: "credits",
        desc: "request limit granted per channel",
    },
];

/// Node names of SRP ports inside [`Node::Luns`], [`Node::Groups`] and the
/// other per-target nodes start with this, so that those nodes and their
/// commands serve both fabrics (an iSCSI name never starts with it).
const SRP_KEY: &str = "srp:";

/// The SRP port a per-target node name designates, if it is one.
fn srp_port_of(target: &str) -> Option<&str> {
    target.strip_prefix(SRP_KEY)
}

const TARGET_ATTRS: &[AttrDef] = &[
    AttrDef {
        name: "enabled",
        desc: "0|1: accept new sessions",
    },
    AttrDef {
        name: "portals",
        desc: "listening addresses, space separated (\"192.0.2.1:3260 [::1]:3260\")",
    },
    AttrDef {
        name: "tpgt",
        desc: "target portal group tag",
    },
    AttrDef {
        name: "alias",
        desc: "TargetAlias sent at login; empty for none",
    },
    AttrDef {
        name: "incoming_users",
        desc: "CHAP users initiators log in as (read-only; IncomingUser commands in /targets/iscsi/mgmt)",
    },
    AttrDef {
        name: "outgoing_user",
        desc: "mutual CHAP user of the target (read-only; OutgoingUser commands in /targets/iscsi/mgmt)",
    },
];

/// Target and discovery attributes changed by commands, not by `set`.
fn read_only_attr(name: &str) -> bool {
    matches!(
        name,
        "incoming_users" | "outgoing_user" | "discovery_incoming_users" | "discovery_outgoing_user"
    )
}

fn chap_names(users: &[ChapUser]) -> String {
    users
        .iter()
        .map(|u| u.user.as_str())
        .collect::<Vec<_>>()
        .join("\n")
}

const LUN_ATTRS: &[AttrDef] = &[
    AttrDef {
        name: "device",
        desc: "the mapped device (read-only; use replace)",
    },
    AttrDef {
        name: "read_only",
        desc: "0|1: read-only through this map (read-only; use replace)",
    },
];

const SESSION_ATTRS: &[AttrDef] = &[
    AttrDef {
        name: "initiator_name",
        desc: "initiator IQN",
    },
    AttrDef {
        name: "isid",
        desc: "initiator session id",
    },
    AttrDef {
        name: "tsih",
        desc: "target session identifying handle",
    },
    AttrDef {
        name: "group",
        desc: "initiator group whose LUN map the session uses",
    },
    AttrDef {
        name: "connections",
        desc: "peer address of each connection",
    },
    AttrDef {
        name: "active_commands",
        desc: "commands in the task sets",
    },
    AttrDef {
        name: "lun_count",
        desc: "LUNs in the session's map",
    },
    AttrDef {
        name: "stats",
        desc: "I/O counters",
    },
    AttrDef {
        name: "force_close",
        desc: "write 1 to close the session (write-only)",
    },
];

const ISCSI_PARAMS: &[AttrDef] = &[
    AttrDef {
        name: "queue_depth",
        desc: "commands a session may have outstanding (MaxCmdSN window), 1..4096",
    },
    AttrDef {
        name: "digests",
        desc: "digests accepted, in order of preference: crc32c and/or none (RFC 7143 §13.1)",
    },
    AttrDef {
        name: "header_digests",
        desc: "HeaderDigest values accepted, in order of preference; empty: as digests (RFC 7143 §13.1)",
    },
    AttrDef {
        name: "data_digests",
        desc: "DataDigest values accepted, in order of preference; empty: as digests (RFC 7143 §13.1)",
    },
    AttrDef {
        name: "discovery_incoming_users",
        desc: "CHAP users for discovery sessions (read-only; add_attribute IncomingUser)",
    },
    AttrDef {
        name: "discovery_outgoing_user",
        desc: "mutual CHAP user for discovery sessions (read-only; add_attribute OutgoingUser)",
    },
    AttrDef {
        name: "max_recv_data_segment_length",
        desc: "MaxRecvDataSegmentLength offered, 512..16777215 (RFC 7143 §13.12)",
    },
    AttrDef {
        name: "max_burst_length",
        desc: "MaxBurstLength, 512..16777215 (RFC 7143 §13.13)",
    },
    AttrDef {
        name: "first_burst_length",
        desc: "FirstBurstLength, 512..16777215, at most max_burst_length (RFC 7143 §13.14)",
    },
    AttrDef {
        name: "immediate_data",
        desc: "0|1: ImmediateData (RFC 7143 §13.11)",
    },
    AttrDef {
        name: "initial_r2t",
        desc: "0|1: InitialR2T (RFC 7143 §13.10)",
    },
    AttrDef {
        name: "max_outstanding_r2t",
        desc: "MaxOutstandingR2T, 1..65535 (RFC 7143 §13.17)",
    },
    AttrDef {
        name: "max_connections",
        desc: "MaxConnections, 1..65535 (RFC 7143 §13.2)",
    },
    AttrDef {
        name: "nop_in_interval_s",
        desc: "seconds between NOP-In pings; 0 disables",
    },
    AttrDef {
        name: "nop_in_timeout_s",
        desc: "seconds to wait for a NOP-Out answer",
    },
    AttrDef {
        name: "login_timeout_s",
        desc: "seconds a login may take",
    },
    AttrDef {
        name: "data_out_timeout_s",
        desc: "seconds a solicited Data-Out burst may take before the connection drops; 0 disables",
    },
];

/// Usage of `/handlers/<h>/mgmt`.
pub const HANDLER_USAGE: &str = "\
add_device NAME [filename=PATH;] [size=BYTES[K|M|G|T];] [blocksize=512|4096;] [read_only=0|1;]
           [write_through=0|1;] [thin_provisioned=0|1;] [rotational=0|1;] [nv_cache=0|1;]
           [removable=0|1;] [mem=0|1 (nullio);] [serial=S;] [t10_vendor=S;] [t10_product=S;] [t10_revision=S;]
           [naa=16HEX;] [eui64=16HEX]
del_device NAME";
/// Usage of `/targets/iscsi/mgmt`.
pub const TARGETS_USAGE: &str = "\
add_target IQN [portals=ADDR:PORT[,ADDR:PORT...];] [tpgt=N;] [alias=TEXT]   (created disabled)
del_target IQN
add_target_attribute IQN IncomingUser USER SECRET    (CHAP; SECRET 12 to 255 bytes)
add_target_attribute IQN OutgoingUser USER SECRET    (mutual CHAP)
del_target_attribute IQN IncomingUser|OutgoingUser USER
add_attribute IncomingUser|OutgoingUser USER SECRET  (discovery sessions)
del_attribute IncomingUser|OutgoingUser USER";
/// Usage of `/targets/srp/mgmt`.
pub const SRP_TARGETS_USAGE: &str = "\
add_target NAME listen=PATH|ADDR:PORT [port_id=32HEX;] [credits=N]   (soft provider; created disabled)
add_target NAME provider=verbs listen=ADDR:PORT [device=HCA;] [hca_port=N;] [port_id=32HEX;] [credits=N]
del_target NAME";
/// Usage of a `luns/mgmt`.
pub const LUNS_USAGE: &str = "\
add DEVICE LUN [read_only=0|1]
del LUN
replace DEVICE LUN [read_only=0|1]
clear";
/// Usage of `ini_groups/mgmt`.
pub const GROUPS_USAGE: &str = "\
create GROUP
del GROUP";
/// Usage of `initiators/mgmt`.
pub const INITIATORS_USAGE: &str = "\
add PATTERN        (initiator name; * and ? are wildcards)
del PATTERN
move PATTERN GROUP
clear";

/// A resolved path.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Node {
    Root,
    RootAttr(&'static AttrDef),
    Handlers,
    Handler(Handler),
    HandlerMgmt(Handler),
    HandlerDevice(Handler, String),
    Devices,
    Device(String),
    DeviceAttr(String, &'static AttrDef),
    Targets,
    Iscsi,
    IscsiMgmt,
    IscsiParam(&'static AttrDef),
    Target(String),
    TargetAttr(String, &'static AttrDef),
    Luns(String, Option<String>),
    LunsMgmt(String, Option<String>),
    Lun(String, Option<String>, u16),
    LunAttr(String, Option<String>, u16, &'static AttrDef),
    Groups(String),
    GroupsMgmt(String),
    Group(String, String),
    /// `/targets/iscsi/<iqn>/ini_groups/<g>/incoming_users`: the group's
    /// CHAP users (read-only; `group_incoming_users` in the configuration).
    GroupUsers(String, String),
    Initiators(String, String),
    InitiatorsMgmt(String, String),
    Initiator(String, String, String),
    Sessions(String),
    Session(String, SessionInfo),
    SessionAttr(String, SessionInfo, &'static AttrDef),
    /// `/targets/srp`: SRP target ports.
    Srp,
    SrpMgmt,
    SrpPort(String),
    SrpAttr(String, &'static AttrDef),
}

impl PartialEq for AttrDef {
    fn eq(&self, o: &AttrDef) -> bool {
        self.name == o.name
    }
}
impl Eq for AttrDef {}
impl std::fmt::Debug for AttrDef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name)
    }
}

fn find_attr(defs: &'static [AttrDef], name: &str) -> Option<&'static AttrDef> {
    defs.iter().find(|a| a.name == name)
}

fn names_hint<I: IntoIterator<Item = S>, S: AsRef<str>>(what: &str, it: I) -> String {
    let v: Vec<String> = it.into_iter().map(|s| s.as_ref().to_string()).collect();
    if v.is_empty() {
        format!("there is no {what}")
    } else {
        format!("valid {what}: {}", v.join(", "))
    }
}

/// Which device attributes a handler has.
fn device_attr_applies(h: Handler, name: &str) -> bool {
    match name {
        "filename" => h.needs_filename(),
        "mem" => h == Handler::VdiskNullio,
        "resync_size" => h != Handler::VdiskNullio,
        _ => true,
    }
}

fn device_attr_writable(h: Handler, name: &str) -> bool {
    match name {
        "size" => h != Handler::VdiskBlockio,
        "read_only" | "write_through" | "rotational" | "nv_cache" | "serial" | "t10_vendor"
        | "t10_product" | "t10_revision" | "naa" | "eui64" | "resync_size" => true,
        _ => false,
    }
}

fn b01(b: bool) -> String {
    if b { "1".into() } else { "0".into() }
}

/// Parses SCST's boolean forms.
pub fn parse_bool(s: &str) -> Result<bool, String> {
    match s.to_ascii_lowercase().as_str() {
        "1" | "yes" | "true" | "on" => Ok(true),
        "0" | "no" | "false" | "off" => Ok(false),
        _ => Err(format!("{s:?} is not a boolean; valid: 0, 1 (or no, yes)")),
    }
}

/// Parses a size in bytes with an optional binary suffix (K, M, G, T).
pub fn parse_size(s: &str) -> Result<u64, String> {
    let err = || format!("{s:?} is not a size; valid: BYTES with an optional K, M, G or T suffix");
    let (num, shift) = match s.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => {
            let shift = match c.to_ascii_uppercase() {
                'K' => 10,
                'M' => 20,
                'G' => 30,
                'T' => 40,
                _ => return Err(err()),
            };
            (&s[..i], shift)
        }
        _ => (s, 0),
    };
    let n: u64 = num.parse().map_err(|_| err())?;
    n.checked_mul(1u64 << shift).ok_or_else(err)
}

fn fmt_data_memory(m: &DataMemoryStats) -> String {
    format!(
        "limit {}\nused {}\npeak {}\nholders {}\nwaiting {}\nwaits {}",
        m.limit, m.used, m.peak, m.holders, m.waiting, m.waits
    )
}

/// A value written to `/data_memory_mb`: MiB in [`DATA_MEMORY_MB`], or
/// `None` (empty or `default`) for the default.
fn parse_data_memory_mb(s: &str) -> Result<Option<u64>, String> {
    if s.is_empty() || s.eq_ignore_ascii_case("default") {
        return Ok(None);
    }
    let valid = format!(
        "valid: {}..{} (MiB), or empty or \"default\" for the default",
        DATA_MEMORY_MB.start(),
        DATA_MEMORY_MB.end()
    );
    match s.parse::<u64>() {
        Ok(mb) if DATA_MEMORY_MB.contains(&mb) => Ok(Some(mb)),
        Ok(mb) => Err(format!("{mb} MiB is out of range; {valid}")),
        Err(e) if *e.kind() == std::num::IntErrorKind::PosOverflow => {
            Err(format!("{s} MiB is out of range; {valid}"))
        }
        Err(_) => Err(format!("{s:?} is not a number; {valid}")),
    }
}

fn fmt_stats(s: &IoStats) -> String {
    format!(
        "read_cmds {}\nwrite_cmds {}\nother_cmds {}\nread_bytes {}\nwrite_bytes {}\nerrors {}",
        s.read_cmds, s.write_cmds, s.other_cmds, s.read_bytes, s.write_bytes, s.errors
    )
}

/// The value of a device attribute; `rt` supplies sizes the model does not
/// hold and counters. `None` for attributes that cannot be read.
pub(crate) fn device_attr_value(
    d: &DeviceConfig,
    attr: &str,
    rt: Option<&dyn Runtime>,
) -> Option<String> {
    let id = d.identity();
    Some(match attr {
        "handler" => d.handler.name().into(),
        "filename" => d
            .filename
            .as_ref()
            .map(|f| f.display().to_string())
            .unwrap_or_default(),
        "size" => match (d.size, rt) {
            (Some(s), _) => s.to_string(),
            (None, Some(rt)) => rt
                .device_size(&d.name)
                .map(|s| s.to_string())
                .unwrap_or_else(|e| format!("unknown ({e})")),
            (None, None) => String::new(),
        },
        "blocksize" => d.blocksize.to_string(),
        "read_only" => b01(d.read_only),
        "write_through" => b01(d.write_through),
        "thin_provisioned" => b01(d.thin_provisioned),
        "rotational" => b01(d.rotational),
        "nv_cache" => b01(d.nv_cache),
        "removable" => b01(d.removable),
        "mem" => b01(d.mem),
        "serial" => id.serial,
        "t10_vendor" => id.vendor,
        "t10_product" => id.product,
        "t10_revision" => id.revision,
        "naa" => format!("0x{:016x}", id.naa),
        "eui64" => format!("0x{:016x}", id.eui64),
        "stats" => {
            let s = rt.map(|rt| rt.stats()).unwrap_or_default();
            fmt_stats(&s.devices.get(&d.name).copied().unwrap_or_default())
        }
        _ => return None,
    })
}

fn device_attr_key(d: &DeviceConfig, attr: &str) -> bool {
    match attr {
        "filename" => d.filename.is_some(),
        "size" => d.size.is_some(),
        "blocksize" => d.blocksize != 512,
        "read_only" => d.read_only,
        "write_through" => d.write_through,
        "thin_provisioned" => d.thin_provisioned,
        "rotational" => d.rotational,
        "nv_cache" => d.nv_cache,
        "removable" => d.removable,
        "mem" => d.mem,
        "serial" => d.serial.is_some(),
        "t10_vendor" => d.t10_vendor.is_some(),
        "t10_product" => d.t10_product.is_some(),
        "t10_revision" => d.t10_revision.is_some(),
        "naa" => d.naa.is_some(),
        "eui64" => d.eui64.is_some(),
        _ => false,
    }
}

/// A parsed command line: positional words and `key=value` parameters
/// (separated by `;` and/or spaces, as SCST writes them).
struct Cmd {
    words: Vec<String>,
    params: Vec<(String, String)>,
}

fn parse_cmd(line: &str, usage: &str) -> Result<Cmd, MgmtError> {
    let mut words = Vec::new();
    let mut params: Vec<(String, String)> = Vec::new();
    for tok in line.split(|c: char| c == ';' || c.is_whitespace()) {
        if tok.is_empty() {
            continue;
        }
        match tok.split_once('=') {
            Some((k, v)) => {
                if k.is_empty() {
                    return Err(usage_err(format!("parameter {tok:?} has no name"), usage));
                }
                if params.iter().any(|(pk, _)| pk == k) {
                    return Err(usage_err(format!("parameter {k:?} given twice"), usage));
                }
                params.push((k.to_string(), v.to_string()));
            }
            None => {
                if !params.is_empty() {
                    return Err(usage_err(
                        format!("{tok:?} after the parameters; parameters come last"),
                        usage,
                    ));
                }
                words.push(tok.to_string());
            }
        }
    }
    if words.is_empty() {
        return Err(usage_err("empty command".into(), usage));
    }
    Ok(Cmd { words, params })
}

fn usage_err(msg: String, usage: &str) -> MgmtError {
    MgmtError::Usage {
        msg,
        usage: usage.to_string(),
    }
}

impl Cmd {
    /// Checks the word count (command word included) and that only `allowed`
    /// parameters appear.
    fn arity(&self, words: usize, allowed: &[&str], usage: &str) -> Result<(), MgmtError> {
        let verb = &self.words[0];
        if self.words.len() < words {
            return Err(usage_err(format!("{verb}: missing argument"), usage));
        }
        if self.words.len() > words {
            return Err(usage_err(
                format!("{verb}: unexpected argument {:?}", self.words[words]),
                usage,
            ));
        }
        if let Some((k, _)) = self
            .params
            .iter()
            .find(|(k, _)| !allowed.contains(&k.as_str()))
        {
            let valid = if allowed.is_empty() {
                "none".to_string()
            } else {
                allowed.join(", ")
            };
            return Err(usage_err(
                format!("{verb}: unknown parameter {k:?}; valid: {valid}"),
                usage,
            ));
        }
        Ok(())
    }
}

fn parse_lun(s: &str, usage: &str) -> Result<u16, MgmtError> {
    match s.parse::<u16>() {
        // SAM-5 §4.7.4: flat space addressing reaches LUN 16383.
        Ok(n) if n < MAX_LUNS => Ok(n),
        _ => Err(usage_err(
            format!("{s:?} is not a LUN; valid: 0..{}", MAX_LUNS - 1),
            usage,
        )),
    }
}

/// The management tree over a [`Config`] model and a [`Runtime`].
pub struct Tree {
    cfg: Config,
    rt: Arc<dyn Runtime>,
    save_path: Option<PathBuf>,
    autosave: bool,
}

impl std::fmt::Debug for Tree {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tree")
            .field("save_path", &self.save_path)
            .finish_non_exhaustive()
    }
}

impl Tree {
    /// A tree whose model is `cfg`, which the runtime already runs.
    /// `save_path` is where `save` writes when given no file.
    pub fn new(cfg: Config, rt: Arc<dyn Runtime>, save_path: Option<PathBuf>) -> Tree {
        Tree {
            cfg,
            rt,
            save_path,
            autosave: false,
        }
    }

    /// With `on`, every change that succeeds is also saved to the save
    /// path (SCST needs an explicit `scstadmin -write_config`; this makes
    /// changes survive a restart without one).
    pub fn set_autosave(&mut self, on: bool) {
        self.autosave = on;
    }

    /// Saves after a change if autosave is on; a failure does not undo the
    /// change, it is reported with it.
    fn after_change(&self, msg: String) -> String {
        if !self.autosave {
            return msg;
        }
        match self.save(None) {
            Ok(_) => msg,
            Err(e) => {
                tracing::warn!("configuration not saved: {e}");
                format!("{msg}\nwarning: the change is live but was not saved: {e}")
            }
        }
    }

    /// The model.
    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// The runtime.
    pub fn runtime(&self) -> &Arc<dyn Runtime> {
        &self.rt
    }

    fn no_such(path: &[&str], depth: usize, hint: String) -> MgmtError {
        MgmtError::NoSuchPath {
            path: format!(
                "/{}",
                path[..=depth.min(path.len().saturating_sub(1))].join("/")
            ),
            hint,
        }
    }

    fn sessions_of(&self, target: &str) -> Vec<(String, SessionInfo)> {
        let (fabric, name) = match srp_port_of(target) {
            Some(p) => (Fabric::Srp, p),
            None => (Fabric::Iscsi, target),
        };
        let mut v: Vec<SessionInfo> = self
            .rt
            .sessions()
            .into_iter()
            .filter(|s| s.fabric == fabric && s.target == name)
            .collect();
        v.sort_by(|a, b| (&a.initiator, a.isid).cmp(&(&b.initiator, b.isid)));
        let mut out: Vec<(String, SessionInfo)> = Vec::new();
        for s in v {
            let n = out
                .iter()
                .filter(|(_, o)| o.initiator == s.initiator)
                .count();
            let name = if n == 0 {
                s.initiator.clone()
            } else {
                format!("{}_{n}", s.initiator)
            };
            out.push((name, s));
        }
        out
    }

    fn resolve(&self, path: &str) -> Result<Node, MgmtError> {
        let p: Vec<&str> = path.split('/').filter(|c| !c.is_empty()).collect();
        let cfg = &self.cfg;
        let mut node = Node::Root;
        for (i, &c) in p.iter().enumerate() {
            let no = |hint: String| Tree::no_such(&p, i, hint);
            node = match node {
                Node::Root => match c {
                    "handlers" => Node::Handlers,
                    "devices" => Node::Devices,
                    "targets" => Node::Targets,
                    _ => match find_attr(ROOT_ATTRS, c) {
                        Some(a) => Node::RootAttr(a),
                        None => {
                            return Err(no(names_hint(
                                "entries",
                                ["handlers", "devices", "targets"]
                                    .into_iter()
                                    .chain(ROOT_ATTRS.iter().map(|a| a.name)),
                            )));
                        }
                    },
                },
                Node::Handlers => match Handler::from_name(c) {
                    Some(h) => Node::Handler(h),
                    None => {
                        return Err(no(names_hint("handlers", Handler::ALL.map(Handler::name))));
                    }
                },
                Node::Handler(h) => {
                    if c == "mgmt" {
                        Node::HandlerMgmt(h)
                    } else if cfg.devices.iter().any(|d| d.handler == h && d.name == c) {
                        Node::HandlerDevice(h, c.into())
                    } else {
                        return Err(no(names_hint(
                            "entries",
                            std::iter::once("mgmt").chain(
                                cfg.devices
                                    .iter()
                                    .filter(|d| d.handler == h)
                                    .map(|d| d.name.as_str()),
                            ),
                        )));
                    }
                }
                Node::Devices => match cfg.device(c) {
                    Some(d) => Node::Device(d.name.clone()),
                    None => {
                        return Err(no(names_hint(
                            "devices",
                            cfg.devices.iter().map(|d| &d.name),
                        )));
                    }
                },
                Node::Device(ref d) => {
                    let h = cfg.device(d).map_or(Handler::VdiskFileio, |d| d.handler);
                    match find_attr(DEVICE_ATTRS, c) {
                        Some(a) if device_attr_applies(h, c) => Node::DeviceAttr(d.clone(), a),
                        _ => {
                            return Err(no(names_hint(
                                "attributes",
                                DEVICE_ATTRS
                                    .iter()
                                    .filter(|a| device_attr_applies(h, a.name))
                                    .map(|a| a.name),
                            )));
                        }
                    }
                }
                Node::Targets => match c {
                    "iscsi" => Node::Iscsi,
                    "srp" => Node::Srp,
                    _ => return Err(no(names_hint("fabrics", ["iscsi", "srp"]))),
                },
                Node::Srp => match cfg.targets.srp.iter().find(|t| t.name == c) {
                    _ if c == "mgmt" => Node::SrpMgmt,
                    Some(t) => Node::SrpPort(t.name.clone()),
                    None => {
                        return Err(no(names_hint(
                            "entries",
                            std::iter::once("mgmt")
                                .chain(cfg.targets.srp.iter().map(|t| t.name.as_str())),
                        )));
                    }
                },
                Node::SrpPort(ref t) => match c {
                    "luns" => Node::Luns(format!("{SRP_KEY}{t}"), None),
                    "ini_groups" => Node::Groups(format!("{SRP_KEY}{t}")),
                    "sessions" => Node::Sessions(format!("{SRP_KEY}{t}")),
                    _ => match find_attr(SRP_ATTRS, c) {
                        Some(a) => Node::SrpAttr(t.clone(), a),
                        None => {
                            return Err(no(names_hint(
                                "entries",
                                ["luns", "ini_groups", "sessions"]
                                    .into_iter()
                                    .chain(SRP_ATTRS.iter().map(|a| a.name)),
                            )));
                        }
                    },
                },
                Node::Iscsi => {
                    if c == "mgmt" {
                        Node::IscsiMgmt
                    } else if let Some(a) = find_attr(ISCSI_PARAMS, c) {
                        Node::IscsiParam(a)
                    } else if let Some(t) = cfg.iscsi_target(c) {
                        Node::Target(t.name.clone())
                    } else {
                        return Err(no(names_hint(
                            "entries",
                            ["mgmt"]
                                .into_iter()
                                .chain(cfg.targets.iscsi.iter().map(|t| t.name.as_str()))
                                .chain(ISCSI_PARAMS.iter().map(|a| a.name)),
                        )));
                    }
                }
                Node::Target(ref t) => match c {
                    "luns" => Node::Luns(t.clone(), None),
                    "ini_groups" => Node::Groups(t.clone()),
                    "sessions" => Node::Sessions(t.clone()),
                    _ => match find_attr(TARGET_ATTRS, c) {
                        Some(a) => Node::TargetAttr(t.clone(), a),
                        None => {
                            return Err(no(names_hint(
                                "entries",
                                ["luns", "ini_groups", "sessions"]
                                    .into_iter()
                                    .chain(TARGET_ATTRS.iter().map(|a| a.name)),
                            )));
                        }
                    },
                },
                Node::Luns(ref t, ref g) => {
                    if c == "mgmt" {
                        Node::LunsMgmt(t.clone(), g.clone())
                    } else {
                        let map = self.map(t, g.as_deref()).unwrap_or_default();
                        match c
                            .parse::<u16>()
                            .ok()
                            .filter(|n| map.iter().any(|l| l.lun == *n))
                        {
                            Some(n) => Node::Lun(t.clone(), g.clone(), n),
                            None => {
                                return Err(no(names_hint(
                                    "entries",
                                    std::iter::once("mgmt".to_string())
                                        .chain(map.iter().map(|l| l.lun.to_string())),
                                )));
                            }
                        }
                    }
                }
                Node::Lun(ref t, ref g, n) => match find_attr(LUN_ATTRS, c) {
                    Some(a) => Node::LunAttr(t.clone(), g.clone(), n, a),
                    None => {
                        return Err(no(names_hint(
                            "attributes",
                            LUN_ATTRS.iter().map(|a| a.name),
                        )));
                    }
                },
                Node::Groups(ref t) => {
                    let groups = &self.groups_of(t);
                    if c == "mgmt" {
                        Node::GroupsMgmt(t.clone())
                    } else if groups.iter().any(|g| g.name == c) {
                        Node::Group(t.clone(), c.into())
                    } else {
                        return Err(no(names_hint(
                            "entries",
                            std::iter::once("mgmt").chain(groups.iter().map(|g| g.name.as_str())),
                        )));
                    }
                }
                Node::Group(ref t, ref g) => match c {
                    "initiators" => Node::Initiators(t.clone(), g.clone()),
                    "luns" => Node::Luns(t.clone(), Some(g.clone())),
                    "incoming_users" => Node::GroupUsers(t.clone(), g.clone()),
                    _ => {
                        return Err(no(names_hint(
                            "entries",
                            ["initiators", "luns", "incoming_users"],
                        )));
                    }
                },
                Node::Initiators(ref t, ref g) => {
                    let pats = self.initiators(t, g);
                    if c == "mgmt" {
                        Node::InitiatorsMgmt(t.clone(), g.clone())
                    } else if pats.iter().any(|p| p == c) {
                        Node::Initiator(t.clone(), g.clone(), c.into())
                    } else {
                        return Err(no(names_hint(
                            "entries",
                            std::iter::once("mgmt".to_string()).chain(pats),
                        )));
                    }
                }
                Node::Sessions(ref t) => {
                    let ss = self.sessions_of(t);
                    match ss.iter().find(|(n, _)| n == c) {
                        Some((_, s)) => Node::Session(t.clone(), s.clone()),
                        None => return Err(no(names_hint("sessions", ss.iter().map(|(n, _)| n)))),
                    }
                }
                Node::Session(ref t, ref s) => match find_attr(SESSION_ATTRS, c) {
                    Some(a) => Node::SessionAttr(t.clone(), s.clone(), a),
                    None => {
                        return Err(no(names_hint(
                            "attributes",
                            SESSION_ATTRS.iter().map(|a| a.name),
                        )));
                    }
                },
                Node::RootAttr(_)
                | Node::HandlerMgmt(_)
                | Node::HandlerDevice(..)
                | Node::DeviceAttr(..)
                | Node::IscsiMgmt
                | Node::IscsiParam(_)
                | Node::TargetAttr(..)
                | Node::LunsMgmt(..)
                | Node::LunAttr(..)
                | Node::GroupsMgmt(_)
                | Node::GroupUsers(..)
                | Node::InitiatorsMgmt(..)
                | Node::Initiator(..)
                | Node::SessionAttr(..)
                | Node::SrpMgmt
                | Node::SrpAttr(..) => {
                    return Err(no("a leaf has no children".into()));
                }
            };
        }
        Ok(node)
    }

    fn map(&self, target: &str, group: Option<&str>) -> Option<Vec<LunConfig>> {
        let (luns, groups) = match srp_port_of(target) {
            Some(p) => {
                let t = self.cfg.targets.srp.iter().find(|t| t.name == p)?;
                (&t.luns, &t.ini_groups)
            }
            None => {
                let t = self.cfg.iscsi_target(target)?;
                (&t.luns, &t.ini_groups)
            }
        };
        match group {
            None => Some(luns.clone()),
            Some(g) => groups.iter().find(|x| x.name == g).map(|x| x.luns.clone()),
        }
    }

    /// The initiator groups of an iSCSI target or (by [`SRP_KEY`]) an SRP
    /// port.
    fn groups_of(&self, target: &str) -> Vec<GroupConfig> {
        match srp_port_of(target) {
            Some(p) => self
                .cfg
                .targets
                .srp
                .iter()
                .find(|t| t.name == p)
                .map(|t| t.ini_groups.clone()),
            None => self.cfg.iscsi_target(target).map(|t| t.ini_groups.clone()),
        }
        .unwrap_or_default()
    }

    fn initiators(&self, target: &str, group: &str) -> Vec<String> {
        self.groups_of(target)
            .into_iter()
            .find(|g| g.name == group)
            .map(|g| g.initiators)
            .unwrap_or_default()
    }

    /// Lists a directory (or describes a leaf as a one-entry listing).
    pub fn ls(&self, path: &str) -> Result<Vec<Entry>, MgmtError> {
        let dir = |name: &str, desc: &str| Entry {
            name: name.into(),
            kind: EntryKind::Dir,
            writable: false,
            description: desc.into(),
        };
        let mgmt = |desc: &str| Entry {
            name: "mgmt".into(),
            kind: EntryKind::Mgmt,
            writable: true,
            description: desc.into(),
        };
        let link = |name: &str, desc: String| Entry {
            name: name.into(),
            kind: EntryKind::Link,
            writable: false,
            description: desc,
        };
        let attr = |a: &AttrDef, writable: bool| Entry {
            name: a.name.into(),
            kind: EntryKind::Attr,
            writable,
            description: a.desc.into(),
        };
        let cfg = &self.cfg;
        Ok(match self.resolve(path)? {
            Node::Root => vec![
                dir("handlers", "device handlers"),
                dir("devices", "devices (logical units)"),
                dir("targets", "target ports per fabric"),
            ]
            .into_iter()
            .chain(
                ROOT_ATTRS
                    .iter()
                    .map(|a| attr(a, a.name == "data_memory_mb")),
            )
            .collect(),
            Node::Handlers => Handler::ALL
                .iter()
                .map(|h| dir(h.name(), "device handler"))
                .collect(),
            Node::Handler(h) => std::iter::once(mgmt("add_device, del_device"))
                .chain(
                    cfg.devices
                        .iter()
                        .filter(|d| d.handler == h)
                        .map(|d| link(&d.name, format!("-> /devices/{}", d.name))),
                )
                .collect(),
            Node::Devices => cfg
                .devices
                .iter()
                .map(|d| dir(&d.name, &format!("device ({})", d.handler)))
                .collect(),
            Node::Device(name) => {
                let h = cfg
                    .device(&name)
                    .map_or(Handler::VdiskFileio, |d| d.handler);
                DEVICE_ATTRS
                    .iter()
                    .filter(|a| device_attr_applies(h, a.name))
                    .map(|a| attr(a, device_attr_writable(h, a.name)))
                    .collect()
            }
            Node::Targets => vec![
                dir("iscsi", "iSCSI targets (RFC 7143)"),
                dir("srp", "SRP target ports (T10 SRP)"),
            ],
            Node::Srp => std::iter::once(mgmt("add_target, del_target"))
                .chain(
                    cfg.targets
                        .srp
                        .iter()
                        .map(|t| dir(&t.name, "SRP target port")),
                )
                .collect(),
            Node::SrpPort(_) => vec![
                dir("luns", "default LUN map"),
                dir("ini_groups", "initiator groups (LUN masking)"),
                dir("sessions", "logged-in I_T nexuses and their channels"),
            ]
            .into_iter()
            .chain(SRP_ATTRS.iter().map(|a| attr(a, a.name == "enabled")))
            .collect(),
            Node::Iscsi => std::iter::once(mgmt("add_target, del_target"))
                .chain(
                    cfg.targets
                        .iscsi
                        .iter()
                        .map(|t| dir(&t.name, "iSCSI target")),
                )
                .chain(
                    ISCSI_PARAMS
                        .iter()
                        .map(|a| attr(a, !read_only_attr(a.name))),
                )
                .collect(),
            Node::Target(_) => vec![
                dir("luns", "default LUN map"),
                dir("ini_groups", "initiator groups (LUN masking)"),
                dir("sessions", "logged-in sessions"),
            ]
            .into_iter()
            .chain(
                TARGET_ATTRS
                    .iter()
                    .map(|a| attr(a, !read_only_attr(a.name))),
            )
            .collect(),
            Node::Luns(t, g) => std::iter::once(mgmt("add, del, replace, clear"))
                .chain(
                    self.map(&t, g.as_deref())
                        .unwrap_or_default()
                        .iter()
                        .map(|l| dir(&l.lun.to_string(), &format!("-> {}", l.device))),
                )
                .collect(),
            Node::Lun(..) => LUN_ATTRS.iter().map(|a| attr(a, false)).collect(),
            Node::Groups(t) => std::iter::once(mgmt("create, del"))
                .chain(
                    self.groups_of(&t)
                        .iter()
                        .map(|g| dir(&g.name, "initiator group")),
                )
                .collect(),
            Node::Group(t, g) => vec![
                dir("initiators", "initiator name patterns"),
                dir("luns", "the group's LUN map"),
                Entry {
                    name: "incoming_users".into(),
                    kind: EntryKind::Attr,
                    writable: false,
                    description: self.get_node(&Node::GroupUsers(t, g), path)?.description,
                },
            ],
            Node::Initiators(t, g) => std::iter::once(mgmt("add, del, move, clear"))
                .chain(
                    self.initiators(&t, &g)
                        .iter()
                        .map(|p| link(p, "initiator pattern".into())),
                )
                .collect(),
            Node::Sessions(t) => self
                .sessions_of(&t)
                .iter()
                .map(|(n, _)| dir(n, "session"))
                .collect(),
            Node::Session(..) => SESSION_ATTRS
                .iter()
                .map(|a| attr(a, a.name == "force_close"))
                .collect(),
            leaf => {
                let name = path.rsplit('/').find(|c| !c.is_empty()).unwrap_or("");
                let v = self.get_node(&leaf, path)?;
                vec![Entry {
                    name: name.into(),
                    kind: match leaf {
                        Node::HandlerMgmt(_)
                        | Node::IscsiMgmt
                        | Node::SrpMgmt
                        | Node::LunsMgmt(..)
                        | Node::GroupsMgmt(_)
                        | Node::InitiatorsMgmt(..) => EntryKind::Mgmt,
                        Node::HandlerDevice(..) | Node::Initiator(..) => EntryKind::Link,
                        _ => EntryKind::Attr,
                    },
                    writable: v.writable,
                    description: v.description,
                }]
            }
        })
    }

    /// Reads a leaf: an attribute's value, or a `mgmt` leaf's usage.
    pub fn get(&self, path: &str) -> Result<AttrValue, MgmtError> {
        let node = self.resolve(path)?;
        self.get_node(&node, path)
    }

    fn get_node(&self, node: &Node, path: &str) -> Result<AttrValue, MgmtError> {
        let usage = |u: &str| AttrValue {
            value: u.into(),
            key: false,
            writable: true,
            description: "commands (do)".into(),
        };
        let cfg = &self.cfg;
        Ok(match node {
            Node::HandlerMgmt(_) => usage(HANDLER_USAGE),
            Node::IscsiMgmt => usage(TARGETS_USAGE),
            Node::SrpMgmt => usage(SRP_TARGETS_USAGE),
            Node::LunsMgmt(..) => usage(LUNS_USAGE),
            Node::GroupsMgmt(_) => usage(GROUPS_USAGE),
            Node::InitiatorsMgmt(..) => usage(INITIATORS_USAGE),
            Node::RootAttr(a) if a.name == "data_memory_mb" => AttrValue {
                value: (cfg.reactor.data_memory_bytes() >> 20).to_string(),
                key: cfg.reactor.data_memory_mb.is_some(),
                writable: true,
                description: a.desc.into(),
            },
            Node::RootAttr(a) => AttrValue {
                value: fmt_data_memory(&self.rt.stats().data_memory),
                key: false,
                writable: false,
                description: a.desc.into(),
            },
            Node::HandlerDevice(_, d) => AttrValue {
                value: format!("/devices/{d}"),
                key: false,
                writable: false,
                description: "device of this handler".into(),
            },
            Node::GroupUsers(t, g) => {
                let users = cfg
                    .iscsi_target(t)
                    .and_then(|t| t.group_incoming_users.get(g))
                    .map(|u| chap_names(u))
                    .unwrap_or_default();
                AttrValue {
                    key: !users.is_empty(),
                    value: users,
                    writable: false,
                    description: "CHAP users of this group, replacing the target's for its initiators (read-only; group_incoming_users in the configuration)".into(),
                }
            }
            Node::Initiator(_, _, p) => AttrValue {
                value: p.clone(),
                key: false,
                writable: false,
                description: "initiator pattern".into(),
            },
            Node::DeviceAttr(name, a) => {
                let d = cfg
                    .device(name)
                    .ok_or_else(|| MgmtError::Refused(format!("no device {name:?}")))?;
                let value = match a.name {
                    "resync_size" => {
                        return Err(MgmtError::NotWritable {
                            path: path.into(),
                            msg: "write-only: set it to 1 to re-read the backing size".into(),
                        });
                    }
                    "exported" => self.exported(name).join("\n"),
                    other => device_attr_value(d, other, Some(&*self.rt)).unwrap_or_default(),
                };
                AttrValue {
                    value,
                    key: device_attr_key(d, a.name),
                    writable: device_attr_writable(d.handler, a.name),
                    description: a.desc.into(),
                }
            }
            Node::IscsiParam(a) => {
                let v = serde_json::to_value(&cfg.iscsi).unwrap_or_default();
                let d = serde_json::to_value(IscsiParamsConfig::default()).unwrap_or_default();
                let fmt = |v: &serde_json::Value| match v {
                    serde_json::Value::Bool(b) => b01(*b),
                    serde_json::Value::Array(items) => items
                        .iter()
                        .map(|i| i.as_str().map_or_else(|| i.to_string(), str::to_string))
                        .collect::<Vec<_>>()
                        .join(" "),
                    other => other.to_string(),
                };
                let value = match a.name {
                    "discovery_incoming_users" => chap_names(&cfg.iscsi.discovery_incoming_users),
                    "discovery_outgoing_user" => cfg
                        .iscsi
                        .discovery_outgoing_user
                        .as_ref()
                        .map(|u| u.user.clone())
                        .unwrap_or_default(),
                    _ => fmt(&v[a.name]),
                };
                AttrValue {
                    value,
                    key: v.get(a.name) != d.get(a.name),
                    writable: !read_only_attr(a.name),
                    description: a.desc.into(),
                }
            }
            Node::TargetAttr(t, a) => {
                let t = cfg
                    .iscsi_target(t)
                    .ok_or_else(|| MgmtError::Refused(format!("no target {t:?}")))?;
                let (value, key) = match a.name {
                    "enabled" => (b01(t.enabled), !t.enabled),
                    "portals" => (t.portals.join(" "), !t.portals.is_empty()),
                    "tpgt" => (t.tpgt.to_string(), t.tpgt != 1),
                    "incoming_users" => {
                        (chap_names(&t.incoming_users), !t.incoming_users.is_empty())
                    }
                    "outgoing_user" => (
                        t.outgoing_user
                            .as_ref()
                            .map(|u| u.user.clone())
                            .unwrap_or_default(),
                        t.outgoing_user.is_some(),
                    ),
                    _ => (t.alias.clone().unwrap_or_default(), t.alias.is_some()),
                };
                AttrValue {
                    value,
                    key,
                    writable: !read_only_attr(a.name),
                    description: a.desc.into(),
                }
            }
            Node::LunAttr(t, g, n, a) => {
                let l = self
                    .map(t, g.as_deref())
                    .unwrap_or_default()
                    .into_iter()
                    .find(|l| l.lun == *n)
                    .ok_or_else(|| MgmtError::Refused(format!("no LUN {n}")))?;
                let (value, key) = match a.name {
                    "device" => (l.device, false),
                    _ => (b01(l.read_only), l.read_only),
                };
                AttrValue {
                    value,
                    key,
                    writable: false,
                    description: a.desc.into(),
                }
            }
            Node::SrpAttr(t, a) => {
                let t = cfg
                    .targets
                    .srp
                    .iter()
                    .find(|p| &p.name == t)
                    .ok_or_else(|| MgmtError::Refused(format!("no SRP port {t:?}")))?;
                let id: String = t
                    .port_id_bytes()
                    .iter()
                    .map(|b| format!("{b:02x}"))
                    .collect();
                let (value, key) = match (a.name, &t.provider) {
                    ("enabled", _) => (b01(t.enabled), !t.enabled),
                    ("port_id", _) => (format!("0x{id}"), t.port_id.is_some()),
                    ("provider", crate::config::SrpProviderConfig::Soft { .. }) => {
                        ("soft".into(), true)
                    }
                    ("provider", crate::config::SrpProviderConfig::Verbs { device, port, .. }) => (
                        format!("verbs {} port {port}", device.as_deref().unwrap_or("(any)")),
                        true,
                    ),
                    ("listen", crate::config::SrpProviderConfig::Soft { listen })
                    | ("listen", crate::config::SrpProviderConfig::Verbs { listen, .. }) => {
                        (listen.clone(), true)
                    }
                    _ => (t.credits.to_string(), true),
                };
                AttrValue {
                    value,
                    key,
                    writable: a.name == "enabled",
                    description: a.desc.into(),
                }
            }
            Node::SessionAttr(_, s, a) => {
                let value = match a.name {
                    "initiator_name" => s.initiator.clone(),
                    "isid" => format!("0x{:012x}", s.isid),
                    "tsih" => s.tsih.to_string(),
                    "group" => s.group.clone().unwrap_or_default(),
                    "connections" => s.connections.join("\n"),
                    "active_commands" => s.active_commands.to_string(),
                    "lun_count" => s.lun_count.to_string(),
                    "stats" => fmt_stats(&s.stats),
                    _ => {
                        return Err(MgmtError::NotWritable {
                            path: path.into(),
                            msg: "write-only: set it to 1 to close the session".into(),
                        });
                    }
                };
                AttrValue {
                    value,
                    key: false,
                    writable: a.name == "force_close",
                    description: a.desc.into(),
                }
            }
            _ => {
                return Err(MgmtError::NotWritable {
                    path: path.into(),
                    msg: "a directory has no value; use ls".into(),
                });
            }
        })
    }

    /// `target/LUN` and `target/group/LUN` entries mapping `device`.
    pub fn exported(&self, device: &str) -> Vec<String> {
        let mut out = Vec::new();
        for t in &self.cfg.targets.iscsi {
            for l in t.luns.iter().filter(|l| l.device == device) {
                out.push(format!("{}/luns/{}", t.name, l.lun));
            }
            for g in &t.ini_groups {
                for l in g.luns.iter().filter(|l| l.device == device) {
                    out.push(format!("{}/ini_groups/{}/luns/{}", t.name, g.name, l.lun));
                }
            }
        }
        for t in &self.cfg.targets.srp {
            for l in t.luns.iter().filter(|l| l.device == device) {
                out.push(format!("srp/{}/luns/{}", t.name, l.lun));
            }
            for g in &t.ini_groups {
                for l in g.luns.iter().filter(|l| l.device == device) {
                    out.push(format!(
                        "srp/{}/ini_groups/{}/luns/{}",
                        t.name, g.name, l.lun
                    ));
                }
            }
        }
        out
    }

    /// Executes one change: model copy, validation, runtime, adoption.
    pub fn execute(&mut self, c: Change) -> Result<String, MgmtError> {
        let msg = self.execute_unsaved(c)?;
        Ok(self.after_change(msg))
    }

    fn execute_unsaved(&mut self, c: Change) -> Result<String, MgmtError> {
        let mut cand = self.cfg.clone();
        c.apply_to(&mut cand).map_err(|e| MgmtError::Refused(e.0))?;
        cand.validate()?;
        let what = c.to_string();
        let r = c.run(&*self.rt).map_err(|source| {
            tracing::warn!(change = %what, "refused by the running system: {source}");
            MgmtError::Runtime {
                what: what.clone(),
                source,
            }
        })?;
        tracing::info!(change = %what, "configuration changed");
        if let (Change::ResyncSize { name }, Some(size)) = (&c, r) {
            if let Some(d) = cand.devices.iter_mut().find(|d| &d.name == name)
                && d.size.is_some()
            {
                d.size = Some(size);
            }
            self.cfg = cand;
            return Ok(format!("{name}: size {size} bytes"));
        }
        self.cfg = cand;
        Ok(what)
    }

    /// Writes an attribute.
    pub fn set(&mut self, path: &str, value: &str) -> Result<String, MgmtError> {
        let node = self.resolve(path)?;
        let value = value.trim();
        let bad = |msg: String| MgmtError::Refused(format!("{path}: {msg}"));
        let not_writable = |msg: &str| MgmtError::NotWritable {
            path: path.into(),
            msg: msg.into(),
        };
        let change = match node {
            Node::RootAttr(a) if a.name == "data_memory_mb" => Change::SetDataMemory {
                mb: parse_data_memory_mb(value).map_err(bad)?,
            },
            Node::DeviceAttr(name, a) => {
                let old = self
                    .cfg
                    .device(&name)
                    .cloned()
                    .ok_or_else(|| bad("no such device".into()))?;
                if !device_attr_writable(old.handler, a.name) {
                    return Err(not_writable(match a.name {
                        "size" => {
                            "read-only for vdisk_blockio: the size is the device's; write resync_size"
                        }
                        "stats" | "exported" | "handler" => "read-only",
                        _ => "read-only: del_device and add_device with the new value",
                    }));
                }
                if a.name == "resync_size" {
                    if parse_bool(value).map_err(bad)? {
                        return self.execute(Change::ResyncSize { name });
                    }
                    return Err(bad("write 1 to re-read the size".into()));
                }
                let mut new = old.clone();
                let opt = |v: &str| {
                    if v.is_empty() {
                        None
                    } else {
                        Some(v.to_string())
                    }
                };
                match a.name {
                    "size" => new.size = Some(parse_size(value).map_err(bad)?),
                    "read_only" => new.read_only = parse_bool(value).map_err(bad)?,
                    "write_through" => new.write_through = parse_bool(value).map_err(bad)?,
                    "rotational" => new.rotational = parse_bool(value).map_err(bad)?,
                    "nv_cache" => new.nv_cache = parse_bool(value).map_err(bad)?,
                    "serial" => new.serial = opt(value),
                    "t10_vendor" => new.t10_vendor = opt(value),
                    "t10_product" => new.t10_product = opt(value),
                    "t10_revision" => new.t10_revision = opt(value),
                    "naa" => new.naa = opt(value),
                    _ => new.eui64 = opt(value),
                }
                new.validate("").map_err(|e| match e {
                    ConfigError::Invalid { msg, .. } => bad(msg),
                    other => MgmtError::Config(other),
                })?;
                let mut cs = device_attr_changes(&old, &new);
                match cs.len() {
                    0 => return Ok(format!("{path}: unchanged")),
                    _ => cs.remove(0),
                }
            }
            Node::IscsiParam(a) if read_only_attr(a.name) => {
                return Err(not_writable(
                    "changed by commands: do /targets/iscsi/mgmt \"add_attribute IncomingUser USER SECRET\"",
                ));
            }
            Node::IscsiParam(a) => {
                let mut v = serde_json::to_value(&self.cfg.iscsi).unwrap_or_default();
                let newv = match &v[a.name] {
                    serde_json::Value::Array(_) => serde_json::Value::Array(
                        value
                            .split(|c: char| c == ',' || c.is_whitespace())
                            .filter(|s| !s.is_empty())
                            .map(|s| serde_json::Value::String(s.to_ascii_lowercase()))
                            .collect(),
                    ),
                    serde_json::Value::Bool(_) => {
                        serde_json::Value::Bool(parse_bool(value).map_err(bad)?)
                    }
                    _ => serde_json::Value::Number(
                        value
                            .parse::<u32>()
                            .map_err(|_| bad(format!("{value:?} is not a number; {}", a.desc)))?
                            .into(),
                    ),
                };
                v[a.name] = newv;
                let p: IscsiParamsConfig = serde_json::from_value(v)
                    .map_err(|_| bad(format!("{value:?} is out of range; {}", a.desc)))?;
                Change::SetIscsiParams(p)
            }
            Node::TargetAttr(_, a) if read_only_attr(a.name) => {
                return Err(not_writable(
                    "changed by commands: do /targets/iscsi/mgmt \"add_target_attribute IQN IncomingUser USER SECRET\"",
                ));
            }
            Node::TargetAttr(t, a) => {
                match a.name {
                    "enabled" => Change::SetEnabled {
                        name: t,
                        enabled: parse_bool(value).map_err(bad)?,
                    },
                    "portals" => Change::SetTarget {
                        name: t,
                        attr: TargetAttr::Portals(
                            value
                                .split(|c: char| c == ',' || c.is_whitespace())
                                .filter(|s| !s.is_empty())
                                .map(str::to_string)
                                .collect(),
                        ),
                    },
                    "tpgt" => Change::SetTarget {
                        name: t,
                        attr: TargetAttr::Tpgt(value.parse().map_err(|_| {
                            bad(format!("{value:?} is not a tag; valid: 0..65535"))
                        })?),
                    },
                    _ => Change::SetTarget {
                        name: t,
                        attr: TargetAttr::Alias(if value.is_empty() {
                            None
                        } else {
                            Some(value.into())
                        }),
                    },
                }
            }
            Node::SessionAttr(t, s, a) if a.name == "force_close" => {
                if !parse_bool(value).map_err(bad)? {
                    return Err(bad("write 1 to close the session".into()));
                }
                self.rt
                    .close_session(srp_port_of(&t).unwrap_or(&t), &s.initiator, s.isid)
                    .map_err(|source| MgmtError::Runtime {
                        what: format!("close session {} of {t}", s.initiator),
                        source,
                    })?;
                return Ok(format!(
                    "closed session {} (isid 0x{:012x})",
                    s.initiator, s.isid
                ));
            }
            Node::SrpAttr(t, a) if a.name == "enabled" => {
                let mut p = self
                    .cfg
                    .targets
                    .srp
                    .iter()
                    .find(|p| p.name == t)
                    .cloned()
                    .ok_or_else(|| bad("no such SRP port".into()))?;
                p.enabled = parse_bool(value).map_err(bad)?;
                let what = format!("set_enabled srp {t} {}", b01(p.enabled));
                return self.execute_srp(&t, Some(p), what);
            }
            Node::HandlerMgmt(_)
            | Node::IscsiMgmt
            | Node::SrpMgmt
            | Node::LunsMgmt(..)
            | Node::GroupsMgmt(_)
            | Node::InitiatorsMgmt(..) => {
                return Err(not_writable("a mgmt leaf takes commands: use do"));
            }
            _ => return Err(not_writable("read-only")),
        };
        self.execute(change)
    }

    /// Runs a command on a `mgmt` leaf.
    pub fn run(&mut self, path: &str, command: &str) -> Result<String, MgmtError> {
        let node = self.resolve(path)?;
        let change = match node {
            Node::HandlerMgmt(h) => self.handler_cmd(h, command)?,
            Node::IscsiMgmt => self.targets_cmd(command)?,
            Node::SrpMgmt => return self.srp_targets_cmd(command),
            Node::LunsMgmt(t, g) => self.luns_cmd(&t, g, command)?,
            Node::GroupsMgmt(t) => self.groups_cmd(&t, command)?,
            Node::InitiatorsMgmt(t, g) => self.initiators_cmd(&t, &g, command)?,
            _ => {
                return Err(MgmtError::NotWritable {
                    path: path.into(),
                    msg: "not a mgmt leaf; commands go to .../mgmt (set writes attributes)".into(),
                });
            }
        };
        if let Some((port, new)) = self.srp_edit(&change)? {
            let what = change.to_string().replace(SRP_KEY, "srp ");
            return self.execute_srp(&port, Some(new), what);
        }
        self.execute(change)
    }

    /// A LUN map, group or initiator change of an SRP port (by
    /// [`SRP_KEY`]) as the port's new configuration; `None` for iSCSI.
    fn srp_edit(
        &self,
        c: &Change,
    ) -> Result<Option<(String, crate::config::SrpTargetConfig)>, MgmtError> {
        let target = match c {
            Change::SetLunMap { target, .. }
            | Change::AddGroup { target, .. }
            | Change::DelGroup { target, .. }
            | Change::SetInitiators { target, .. }
            | Change::MoveInitiator { target, .. } => target,
            _ => return Ok(None),
        };
        let Some(port) = srp_port_of(target) else {
            return Ok(None);
        };
        let mut p = self
            .cfg
            .targets
            .srp
            .iter()
            .find(|t| t.name == port)
            .cloned()
            .ok_or_else(|| MgmtError::Refused(format!("no SRP port {port:?}")))?;
        let group = |p: &mut crate::config::SrpTargetConfig, g: &str| {
            p.ini_groups
                .iter_mut()
                .position(|x| x.name == g)
                .ok_or_else(|| MgmtError::Refused(format!("SRP port {port:?} has no group {g:?}")))
        };
        match c {
            Change::SetLunMap {
                group: None, luns, ..
            } => p.luns = luns.clone(),
            Change::SetLunMap {
                group: Some(g),
                luns,
                ..
            } => {
                let i = group(&mut p, g)?;
                p.ini_groups[i].luns = luns.clone();
            }
            Change::AddGroup { group: g, .. } => p.ini_groups.push(GroupConfig {
                name: g.clone(),
                initiators: Vec::new(),
                luns: Vec::new(),
            }),
            Change::DelGroup { group: g, .. } => {
                let i = group(&mut p, g)?;
                p.ini_groups.remove(i);
            }
            Change::SetInitiators {
                group: g,
                initiators,
                ..
            } => {
                let i = group(&mut p, g)?;
                p.ini_groups[i].initiators = initiators.clone();
            }
            Change::MoveInitiator {
                from,
                from_list,
                to,
                to_list,
                ..
            } => {
                let i = group(&mut p, from)?;
                p.ini_groups[i].initiators = from_list.clone();
                let j = group(&mut p, to)?;
                p.ini_groups[j].initiators = to_list.clone();
            }
            _ => return Ok(None),
        }
        Ok(Some((port.to_string(), p)))
    }

    /// Adds, replaces or (`new` None) removes SRP port `name`: model copy,
    /// validation, runtime, adoption, as [`Tree::execute`] does.
    fn execute_srp(
        &mut self,
        name: &str,
        new: Option<crate::config::SrpTargetConfig>,
        what: String,
    ) -> Result<String, MgmtError> {
        let mut cand = self.cfg.clone();
        let at = cand.targets.srp.iter().position(|t| t.name == name);
        match (&new, at) {
            (Some(p), Some(i)) => cand.targets.srp[i] = p.clone(),
            (Some(p), None) => cand.targets.srp.push(p.clone()),
            (None, Some(i)) => {
                cand.targets.srp.remove(i);
            }
            (None, None) => {
                return Err(MgmtError::Refused(format!("no SRP port {name:?}")));
            }
        }
        cand.validate()?;
        self.rt
            .set_srp_target(name, new.as_ref())
            .map_err(|source| {
                tracing::warn!(change = %what, "refused by the running system: {source}");
                MgmtError::Runtime {
                    what: what.clone(),
                    source,
                }
            })?;
        tracing::info!(change = %what, "configuration changed");
        self.cfg = cand;
        Ok(self.after_change(what))
    }

    fn srp_targets_cmd(&mut self, command: &str) -> Result<String, MgmtError> {
        use crate::config::{SrpProviderConfig, SrpTargetConfig, parse_port_id};
        let u = SRP_TARGETS_USAGE;
        let cmd = parse_cmd(command, u)?;
        match cmd.words[0].as_str() {
            "add_target" => {
                cmd.arity(
                    2,
                    &[
                        "listen", "provider", "device", "hca_port", "port_id", "credits",
                    ],
                    u,
                )?;
                let name = &cmd.words[1];
                validate_object_name(name).map_err(|m| usage_err(m, u))?;
                if self.cfg.targets.srp.iter().any(|t| &t.name == name) {
                    return Err(MgmtError::Refused(format!(
                        "SRP port {name:?} already exists"
                    )));
                }
                let param = |k: &str| {
                    cmd.params
                        .iter()
                        .find(|(pk, _)| pk == k)
                        .map(|(_, v)| v.as_str())
                };
                let listen = param("listen")
                    .ok_or_else(|| usage_err("add_target: listen= is required".into(), u))?;
                let mut t = SrpTargetConfig::soft(name.clone(), listen);
                t.enabled = false;
                match param("provider").unwrap_or("soft") {
                    "soft" => {
                        if param("device").is_some() || param("hca_port").is_some() {
                            return Err(usage_err(
                                "device= and hca_port= are for provider=verbs".into(),
                                u,
                            ));
                        }
                    }
                    "verbs" => {
                        t.provider = SrpProviderConfig::Verbs {
                            device: param("device").map(str::to_string),
                            port: match param("hca_port") {
                                Some(v) => v.parse().map_err(|_| {
                                    usage_err(
                                        format!("parameter hca_port: {v:?}; valid: 1..255"),
                                        u,
                                    )
                                })?,
                                None => 1,
                            },
                            listen: listen.to_string(),
                        }
                    }
                    other => {
                        return Err(usage_err(
                            format!("parameter provider: {other:?}; valid: soft, verbs"),
                            u,
                        ));
                    }
                }
                if let Some(v) = param("port_id") {
                    if parse_port_id(v).is_none() {
                        return Err(usage_err(
                            format!("parameter port_id: {v:?} is not 32 hex digits"),
                            u,
                        ));
                    }
                    t.port_id = Some(v.to_string());
                }
                if let Some(v) = param("credits") {
                    t.credits = v.parse().map_err(|_| {
                        usage_err(format!("parameter credits: {v:?}; valid: 1..4096"), u)
                    })?;
                }
                let what = format!("add_target srp {name}");
                self.execute_srp(name, Some(t), what)
            }
            "del_target" => {
                cmd.arity(2, &[], u)?;
                let name = cmd.words[1].clone();
                if !self.cfg.targets.srp.iter().any(|t| t.name == name) {
                    return Err(MgmtError::Refused(format!(
                        "no SRP port {name:?}; {}",
                        names_hint("SRP ports", self.cfg.targets.srp.iter().map(|t| &t.name))
                    )));
                }
                let what = format!("del_target srp {name}");
                self.execute_srp(&name, None, what)
            }
            other => Err(usage_err(format!("unknown command {other:?}"), u)),
        }
    }

    fn handler_cmd(&self, h: Handler, command: &str) -> Result<Change, MgmtError> {
        let u = HANDLER_USAGE;
        let cmd = parse_cmd(command, u)?;
        match cmd.words[0].as_str() {
            "add_device" => {
                const ALLOWED: &[&str] = &[
                    "filename",
                    "size",
                    "size_mb",
                    "blocksize",
                    "read_only",
                    "write_through",
                    "thin_provisioned",
                    "rotational",
                    "nv_cache",
                    "removable",
                    "mem",
                    "serial",
                    "usn",
                    "t10_vendor",
                    "t10_vendor_id",
                    "t10_product",
                    "prod_id",
                    "t10_revision",
                    "prod_rev_lvl",
                    "naa",
                    "naa_id",
                    "eui64",
                    "eui64_id",
                ];
                cmd.arity(2, ALLOWED, u)?;
                let name = &cmd.words[1];
                validate_object_name(name).map_err(|m| usage_err(m, u))?;
                if let Some(d) = self.cfg.device(name) {
                    return Err(MgmtError::Refused(format!(
                        "device {name:?} already exists (handler {})",
                        d.handler
                    )));
                }
                let mut d = DeviceConfig::new(name.clone(), h);
                for (k, v) in &cmd.params {
                    let pe = |m: String| usage_err(format!("parameter {k}: {m}"), u);
                    let opt = || Some(v.clone());
                    match k.as_str() {
                        "filename" => d.filename = Some(PathBuf::from(v)),
                        "size" => d.size = Some(parse_size(v).map_err(pe)?),
                        "size_mb" => {
                            let mb: u64 = v
                                .parse()
                                .map_err(|_| pe(format!("{v:?} is not a number")))?;
                            d.size = Some(
                                mb.checked_mul(1 << 20)
                                    .ok_or_else(|| pe("too large".into()))?,
                            );
                        }
                        "blocksize" => {
                            d.blocksize = v
                                .parse()
                                .map_err(|_| pe(format!("{v:?}; valid: 512, 4096")))?
                        }
                        "read_only" => d.read_only = parse_bool(v).map_err(pe)?,
                        "write_through" => d.write_through = parse_bool(v).map_err(pe)?,
                        "thin_provisioned" => d.thin_provisioned = parse_bool(v).map_err(pe)?,
                        "rotational" => d.rotational = parse_bool(v).map_err(pe)?,
                        "nv_cache" => d.nv_cache = parse_bool(v).map_err(pe)?,
                        "removable" => d.removable = parse_bool(v).map_err(pe)?,
                        "mem" => d.mem = parse_bool(v).map_err(pe)?,
                        "serial" | "usn" => d.serial = opt(),
                        "t10_vendor" | "t10_vendor_id" => d.t10_vendor = opt(),
                        "t10_product" | "prod_id" => d.t10_product = opt(),
                        "t10_revision" | "prod_rev_lvl" => d.t10_revision = opt(),
                        "naa" | "naa_id" => d.naa = opt(),
                        _ => d.eui64 = opt(),
                    }
                }
                d.validate("").map_err(|e| match e {
                    ConfigError::Invalid { at, msg } => usage_err(
                        format!("parameter {}: {msg}", at.trim_start_matches('.')),
                        u,
                    ),
                    other => MgmtError::Config(other),
                })?;
                Ok(Change::AddDevice(Box::new(d)))
            }
            "del_device" => {
                cmd.arity(2, &[], u)?;
                let name = &cmd.words[1];
                match self.cfg.device(name) {
                    None => Err(MgmtError::Refused(format!(
                        "no device {name:?}; {}",
                        names_hint(
                            "devices",
                            self.cfg
                                .devices
                                .iter()
                                .filter(|d| d.handler == h)
                                .map(|d| &d.name)
                        )
                    ))),
                    Some(d) if d.handler != h => Err(MgmtError::Refused(format!(
                        "device {name:?} belongs to handler {}",
                        d.handler
                    ))),
                    Some(_) => {
                        let used = self.exported(name);
                        if !used.is_empty() {
                            return Err(MgmtError::Refused(format!(
                                "device {name:?} is in use by {}; remove those LUNs first",
                                used.join(", ")
                            )));
                        }
                        Ok(Change::DelDevice {
                            handler: h,
                            name: name.clone(),
                        })
                    }
                }
            }
            other => Err(usage_err(format!("unknown command {other:?}"), u)),
        }
    }

    fn targets_cmd(&self, command: &str) -> Result<Change, MgmtError> {
        let u = TARGETS_USAGE;
        // CHAP secrets may hold '=' and ';': those commands split on spaces only.
        let cmd = match command.split_whitespace().next() {
            Some(
                "add_target_attribute" | "del_target_attribute" | "add_attribute" | "del_attribute",
            ) => Cmd {
                words: command.split_whitespace().map(str::to_string).collect(),
                params: Vec::new(),
            },
            _ => parse_cmd(command, u)?,
        };
        let kind = |w: &str| -> Result<bool, MgmtError> {
            match w {
                "IncomingUser" => Ok(true),
                "OutgoingUser" => Ok(false),
                other => Err(usage_err(
                    format!("unknown attribute {other:?}; valid: IncomingUser, OutgoingUser"),
                    u,
                )),
            }
        };
        // Edits a pair of credential lists; returns None if USER is absent
        // for a del.
        let edit = |incoming: &mut Vec<ChapUser>,
                    outgoing: &mut Option<ChapUser>,
                    is_in: bool,
                    add: bool,
                    user: &str,
                    secret: Option<&str>|
         -> Result<(), MgmtError> {
            let cred = || ChapUser {
                user: user.to_string(),
                secret: secret.unwrap_or_default().to_string(),
            };
            match (is_in, add) {
                (true, true) => {
                    if incoming.iter().any(|x| x.user == user) {
                        return Err(MgmtError::Refused(format!(
                            "CHAP user {user:?} already exists; del it first"
                        )));
                    }
                    incoming.push(cred());
                }
                (false, true) => *outgoing = Some(cred()),
                (true, false) => {
                    let before = incoming.len();
                    incoming.retain(|x| x.user != user);
                    if incoming.len() == before {
                        return Err(MgmtError::Refused(format!("no CHAP user {user:?}")));
                    }
                }
                (false, false) => {
                    if outgoing.as_ref().is_none_or(|o| o.user != user) {
                        return Err(MgmtError::Refused(format!(
                            "no outgoing CHAP user {user:?}"
                        )));
                    }
                    *outgoing = None;
                }
            }
            Ok(())
        };
        match cmd.words[0].as_str() {
            verb @ ("add_target_attribute" | "del_target_attribute") => {
                let add = verb == "add_target_attribute";
                cmd.arity(if add { 5 } else { 4 }, &[], u)?;
                let name = &cmd.words[1];
                let is_in = kind(&cmd.words[2])?;
                let Some(t) = self.cfg.iscsi_target(name) else {
                    return Err(MgmtError::Refused(format!(
                        "no target {name:?}; {}",
                        names_hint("targets", self.cfg.targets.iscsi.iter().map(|t| &t.name))
                    )));
                };
                let (mut inc, mut out) = (t.incoming_users.clone(), t.outgoing_user.clone());
                edit(
                    &mut inc,
                    &mut out,
                    is_in,
                    add,
                    &cmd.words[3],
                    cmd.words.get(4).map(String::as_str),
                )?;
                crate::config::validate_chap(
                    &inc,
                    out.as_ref(),
                    "target",
                    "IncomingUser",
                    "OutgoingUser",
                )
                .map_err(|e| MgmtError::Refused(e.to_string()))?;
                Ok(Change::SetTarget {
                    name: name.clone(),
                    attr: if is_in {
                        TargetAttr::IncomingUsers(inc)
                    } else {
                        TargetAttr::OutgoingUser(out)
                    },
                })
            }
            verb @ ("add_attribute" | "del_attribute") => {
                let add = verb == "add_attribute";
                cmd.arity(if add { 4 } else { 3 }, &[], u)?;
                let is_in = kind(&cmd.words[1])?;
                let mut p = self.cfg.iscsi.clone();
                edit(
                    &mut p.discovery_incoming_users,
                    &mut p.discovery_outgoing_user,
                    is_in,
                    add,
                    &cmd.words[2],
                    cmd.words.get(3).map(String::as_str),
                )?;
                crate::config::validate_chap(
                    &p.discovery_incoming_users,
                    p.discovery_outgoing_user.as_ref(),
                    "discovery",
                    "IncomingUser",
                    "OutgoingUser",
                )
                .map_err(|e| MgmtError::Refused(e.to_string()))?;
                Ok(Change::SetIscsiParams(p))
            }
            "add_target" => {
                cmd.arity(2, &["portals", "tpgt", "alias"], u)?;
                let name = &cmd.words[1];
                validate_iscsi_name(name).map_err(|m| usage_err(m, u))?;
                if self.cfg.iscsi_target(name).is_some() {
                    return Err(MgmtError::Refused(format!(
                        "target {name:?} already exists"
                    )));
                }
                let mut t = IscsiTargetConfig::new(name.clone());
                t.enabled = false;
                for (k, v) in &cmd.params {
                    match k.as_str() {
                        "portals" => {
                            t.portals = v
                                .split(',')
                                .filter(|s| !s.is_empty())
                                .map(str::to_string)
                                .collect();
                            if let Some(p) = t
                                .portals
                                .iter()
                                .find(|p| p.parse::<std::net::SocketAddr>().is_err())
                            {
                                return Err(usage_err(
                                    format!(
                                        "parameter portals: {p:?} is not ADDR:PORT (\"192.0.2.1:3260\", \"[::1]:3260\")"
                                    ),
                                    u,
                                ));
                            }
                        }
                        "tpgt" => {
                            t.tpgt = v.parse().map_err(|_| {
                                usage_err(format!("parameter tpgt: {v:?}; valid: 0..65535"), u)
                            })?
                        }
                        _ => t.alias = Some(v.clone()),
                    }
                }
                Ok(Change::AddTarget(Box::new(t)))
            }
            "del_target" => {
                cmd.arity(2, &[], u)?;
                let name = &cmd.words[1];
                if self.cfg.iscsi_target(name).is_none() {
                    return Err(MgmtError::Refused(format!(
                        "no target {name:?}; {}",
                        names_hint("targets", self.cfg.targets.iscsi.iter().map(|t| &t.name))
                    )));
                }
                Ok(Change::DelTarget { name: name.clone() })
            }
            other => Err(usage_err(format!("unknown command {other:?}"), u)),
        }
    }

    fn luns_cmd(
        &self,
        target: &str,
        group: Option<String>,
        command: &str,
    ) -> Result<Change, MgmtError> {
        let u = LUNS_USAGE;
        let cmd = parse_cmd(command, u)?;
        let mut luns = self.map(target, group.as_deref()).unwrap_or_default();
        let dev_check = |d: &str| -> Result<(), MgmtError> {
            if self.cfg.device(d).is_none() {
                return Err(MgmtError::Refused(format!(
                    "no device {d:?}; {}",
                    names_hint("devices", self.cfg.devices.iter().map(|d| &d.name))
                )));
            }
            Ok(())
        };
        let ro = |cmd: &Cmd| -> Result<bool, MgmtError> {
            match cmd.params.first() {
                Some((_, v)) => {
                    parse_bool(v).map_err(|m| usage_err(format!("parameter read_only: {m}"), u))
                }
                None => Ok(false),
            }
        };
        match cmd.words[0].as_str() {
            verb @ ("add" | "replace") => {
                cmd.arity(3, &["read_only"], u)?;
                let dev = &cmd.words[1];
                let lun = parse_lun(&cmd.words[2], u)?;
                let read_only = ro(&cmd)?;
                dev_check(dev)?;
                let existing = luns.iter().position(|l| l.lun == lun);
                let entry = LunConfig {
                    lun,
                    device: dev.clone(),
                    read_only,
                };
                match (verb, existing) {
                    ("add", Some(i)) => {
                        return Err(MgmtError::Refused(format!(
                            "LUN {lun} is in use by device {:?}; use replace or del first",
                            luns[i].device
                        )));
                    }
                    ("add", None) => luns.push(entry),
                    (_, Some(i)) => luns[i] = entry,
                    (_, None) => {
                        return Err(MgmtError::Refused(format!(
                            "LUN {lun} does not exist; use add"
                        )));
                    }
                }
            }
            "del" => {
                cmd.arity(2, &[], u)?;
                let lun = parse_lun(&cmd.words[1], u)?;
                let before = luns.len();
                luns.retain(|l| l.lun != lun);
                if luns.len() == before {
                    return Err(MgmtError::Refused(format!(
                        "LUN {lun} does not exist; {}",
                        names_hint("LUNs", luns.iter().map(|l| l.lun.to_string()))
                    )));
                }
            }
            "clear" => {
                cmd.arity(1, &[], u)?;
                luns.clear();
            }
            other => return Err(usage_err(format!("unknown command {other:?}"), u)),
        }
        Ok(Change::SetLunMap {
            target: target.into(),
            group,
            luns,
        })
    }

    fn groups_cmd(&self, target: &str, command: &str) -> Result<Change, MgmtError> {
        let u = GROUPS_USAGE;
        let cmd = parse_cmd(command, u)?;
        let groups = self.groups_of(target);
        match cmd.words[0].as_str() {
            "create" => {
                cmd.arity(2, &[], u)?;
                let g = &cmd.words[1];
                validate_object_name(g).map_err(|m| usage_err(m, u))?;
                if groups.iter().any(|x| &x.name == g) {
                    return Err(MgmtError::Refused(format!("group {g:?} already exists")));
                }
                Ok(Change::AddGroup {
                    target: target.into(),
                    group: g.clone(),
                })
            }
            "del" => {
                cmd.arity(2, &[], u)?;
                let g = &cmd.words[1];
                if !groups.iter().any(|x| &x.name == g) {
                    return Err(MgmtError::Refused(format!(
                        "no group {g:?}; {}",
                        names_hint("groups", groups.iter().map(|x| &x.name))
                    )));
                }
                Ok(Change::DelGroup {
                    target: target.into(),
                    group: g.clone(),
                })
            }
            other => Err(usage_err(format!("unknown command {other:?}"), u)),
        }
    }

    fn initiators_cmd(
        &self,
        target: &str,
        group: &str,
        command: &str,
    ) -> Result<Change, MgmtError> {
        let u = INITIATORS_USAGE;
        let cmd = parse_cmd(command, u)?;
        let mut pats = self.initiators(target, group);
        let set = |group: &str, initiators: Vec<String>| Change::SetInitiators {
            target: target.into(),
            group: group.into(),
            initiators,
        };
        let owner = |p: &str| -> Option<String> {
            self.groups_of(target)
                .into_iter()
                .find(|g| g.initiators.iter().any(|x| x == p))
                .map(|g| g.name)
        };
        match cmd.words[0].as_str() {
            "add" => {
                cmd.arity(2, &[], u)?;
                let p = &cmd.words[1];
                validate_initiator_pattern(p).map_err(|m| usage_err(m, u))?;
                if let Some(g) = owner(p) {
                    return Err(MgmtError::Refused(format!(
                        "initiator {p:?} is already in group {g:?}"
                    )));
                }
                pats.push(p.clone());
                Ok(set(group, pats))
            }
            "del" => {
                cmd.arity(2, &[], u)?;
                let p = &cmd.words[1];
                let before = pats.len();
                pats.retain(|x| x != p);
                if pats.len() == before {
                    return Err(MgmtError::Refused(format!(
                        "{p:?} is not in group {group:?}; {}",
                        names_hint("initiators", self.initiators(target, group))
                    )));
                }
                Ok(set(group, pats))
            }
            "move" => {
                cmd.arity(3, &[], u)?;
                let (p, dest) = (&cmd.words[1], &cmd.words[2]);
                if !pats.contains(p) {
                    return Err(MgmtError::Refused(format!(
                        "{p:?} is not in group {group:?}"
                    )));
                }
                let groups = self.groups_of(target);
                let Some(dg) = groups.iter().find(|g| &g.name == dest) else {
                    return Err(MgmtError::Refused(format!(
                        "no group {dest:?}; {}",
                        names_hint("groups", groups.iter().map(|g| &g.name))
                    )));
                };
                if dest == group {
                    return Err(MgmtError::Refused(format!(
                        "{p:?} is already in group {group:?}"
                    )));
                }
                // One change for both groups: the pattern is never in two
                // groups, nor in none, as far as the model is concerned.
                let mut to_list = dg.initiators.clone();
                to_list.push(p.clone());
                pats.retain(|x| x != p);
                Ok(Change::MoveInitiator {
                    target: target.into(),
                    pattern: p.clone(),
                    from: group.into(),
                    from_list: pats,
                    to: dest.clone(),
                    to_list,
                })
            }
            "clear" => {
                cmd.arity(1, &[], u)?;
                Ok(set(group, Vec::new()))
            }
            other => Err(usage_err(format!("unknown command {other:?}"), u)),
        }
    }

    /// The changes `apply` would make to reach `new`.
    pub fn diff(&self, new: &Config) -> Result<Vec<Change>, MgmtError> {
        new.validate()?;
        plan(&self.cfg, new).map_err(|e| MgmtError::Refused(e.0))
    }

    /// Makes the running system and the model match `new`, in SCST's order.
    /// Applying the same configuration twice changes nothing the second time.
    pub fn apply(&mut self, new: &Config) -> Result<Vec<Change>, MgmtError> {
        let changes = self.diff(new)?;
        let total = changes.len();
        for (done, c) in changes.iter().enumerate() {
            let failed = c.to_string();
            if let Err(e) = self.execute_unsaved(c.clone()) {
                if done > 0 {
                    let _ = self.after_change(String::new());
                }
                return Err(MgmtError::Apply {
                    done,
                    total,
                    failed,
                    source: Box::new(e),
                });
            }
        }
        // Same content; adopt the file's order of objects.
        self.cfg = new.clone();
        if !changes.is_empty() {
            let _ = self.after_change(String::new());
        }
        Ok(changes)
    }

    /// Saves the model to `path`, or to the tree's save path.
    pub fn save(&self, path: Option<&Path>) -> Result<PathBuf, MgmtError> {
        let p = path
            .map(Path::to_path_buf)
            .or_else(|| self.save_path.clone())
            .ok_or_else(|| {
                MgmtError::Refused("no file given and ferrited has no configuration file".into())
            })?;
        self.cfg.save_atomic(&p).map_err(|e| match e {
            // An I/O failure is not the configuration's fault: say which
            // file could not be written.
            ConfigError::Io { .. } => {
                MgmtError::Refused(format!("cannot save to {}: {e}", p.display()))
            }
            other => MgmtError::Config(other),
        })?;
        Ok(p)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::GroupConfig;
    use crate::runtime::FakeRuntime;

    const T: &str = "iqn.2026-11.org.ferrite:default";

    fn sample() -> Config {
        let mut cfg =
            Config::embedded_default(Path::new("/srv"), "127.0.0.1:3260".parse().unwrap());
        let mut null = DeviceConfig::new("null0", Handler::VdiskNullio);
        null.size = Some(1 << 20);
        cfg.devices.push(null);
        let mut spare = DeviceConfig::new("spare", Handler::VdiskNullio);
        spare.size = Some(1 << 20);
        cfg.devices.push(spare);
        let t = &mut cfg.targets.iscsi[0];
        t.luns.push(LunConfig {
            lun: 1,
            device: "null0".into(),
            read_only: false,
        });
        t.ini_groups.push(GroupConfig {
            name: "hosts".into(),
            initiators: vec!["iqn.1994-05.com.redhat:a".into()],
            luns: vec![LunConfig {
                lun: 0,
                device: "null0".into(),
                read_only: true,
            }],
        });
        t.ini_groups.push(GroupConfig {
            name: "other".into(),
            initiators: vec![],
            luns: vec![],
        });
        cfg.validate().unwrap();
        cfg
    }

    fn tree() -> (Tree, Arc<FakeRuntime>) {
        let rt = Arc::new(FakeRuntime::new());
        (Tree::new(sample(), rt.clone(), None), rt)
    }

    #[test]
    fn bad_commands_change_nothing() {
        let tl = format!("/targets/iscsi/{T}/luns/mgmt");
        let gl = format!("/targets/iscsi/{T}/ini_groups/hosts/luns/mgmt");
        let gm = format!("/targets/iscsi/{T}/ini_groups/mgmt");
        let im = format!("/targets/iscsi/{T}/ini_groups/hosts/initiators/mgmt");
        let h = "/handlers/vdisk_nullio/mgmt";
        let hf = "/handlers/vdisk_fileio/mgmt";
        let tm = "/targets/iscsi/mgmt";
        let nosuch = format!("/targets/iscsi/{T}/ini_groups/nosuch/luns/mgmt");
        let cases: Vec<(&str, String, &str)> = vec![
            // handler mgmt
            (h, "".into(), "empty command"),
            (h, "frobnicate x".into(), "unknown command \"frobnicate\""),
            (h, "add_device".into(), "missing argument"),
            (
                h,
                "add_device n1 extra size=4096".into(),
                "unexpected argument",
            ),
            (
                h,
                "add_device n1 size=4096; colour=red".into(),
                "unknown parameter \"colour\"",
            ),
            (
                h,
                "add_device n1 size=4096; size=8192".into(),
                "given twice",
            ),
            (h, "add_device n1 size=lots".into(), "not a size"),
            (
                h,
                "add_device n1 size=4096; blocksize=1000".into(),
                "512, 4096",
            ),
            (
                h,
                "add_device n1 size=4096; read_only=maybe".into(),
                "not a boolean",
            ),
            (h, "add_device n1".into(), "needs a size"),
            (
                h,
                "add_device n1 size=4096; filename=/x".into(),
                "remove filename",
            ),
            (
                h,
                "add_device bad/name size=4096".into(),
                "valid characters",
            ),
            (h, "add_device null0 size=4096".into(), "already exists"),
            (h, "add_device n1 size=4096 =3".into(), "has no name"),
            (
                h,
                "add_device n1 size=4096 trailing".into(),
                "parameters come last",
            ),
            (hf, "add_device f1 size=4096".into(), "needs a filename"),
            (hf, "add_device f1 filename=rel.img".into(), "absolute"),
            (h, "del_device".into(), "missing argument"),
            (h, "del_device nosuch".into(), "no device \"nosuch\""),
            (
                h,
                "del_device disk0".into(),
                "belongs to handler vdisk_fileio",
            ),
            (h, "del_device null0".into(), "in use by"),
            (h, "del_device spare now".into(), "unexpected argument"),
            // target mgmt
            (tm, "add_target".into(), "missing argument"),
            (tm, "add_target iqn.bad".into(), "yyyy-mm"),
            (tm, format!("add_target {T}"), "already exists"),
            (
                tm,
                "add_target iqn.2026-11.org.x:y portals=nowhere".into(),
                "not ADDR:PORT",
            ),
            (
                tm,
                "add_target iqn.2026-11.org.x:y tpgt=70000".into(),
                "0..65535",
            ),
            (
                tm,
                "add_target iqn.2026-11.org.x:y colour=red".into(),
                "unknown parameter",
            ),
            (tm, "del_target iqn.2026-11.org.x:none".into(), "no target"),
            (tm, "launch".into(), "unknown command"),
            // LUN mgmt, default map and group map
            (&tl, "add".into(), "missing argument"),
            (&tl, "add spare".into(), "missing argument"),
            (
                &tl,
                "add spare 0".into(),
                "LUN 0 is in use by device \"disk0\"",
            ),
            (&tl, "add spare 16384".into(), "0..16383"),
            (&tl, "add spare -1".into(), "not a LUN"),
            (&tl, "add spare x".into(), "not a LUN"),
            (&tl, "add nosuch 5".into(), "no device \"nosuch\""),
            (&tl, "add spare 5 read_only=2".into(), "not a boolean"),
            (&tl, "add spare 5 readonly=1".into(), "unknown parameter"),
            (&tl, "add spare 5 6".into(), "unexpected argument"),
            (&tl, "del 9".into(), "LUN 9 does not exist"),
            (&tl, "del".into(), "missing argument"),
            (&tl, "replace spare 9".into(), "does not exist; use add"),
            (&tl, "clear now".into(), "unexpected argument"),
            (&tl, "wipe".into(), "unknown command"),
            (&gl, "add spare 0".into(), "in use by device \"null0\""),
            (&gl, "del 3".into(), "does not exist"),
            // groups
            (&gm, "create".into(), "missing argument"),
            (&gm, "create hosts".into(), "already exists"),
            (&gm, "create a/b".into(), "valid characters"),
            (&gm, "create mgmt".into(), "reserved"),
            (&gm, "del nosuch".into(), "no group"),
            (&gm, "rename a b".into(), "unknown command"),
            // initiators
            (&im, "add".into(), "missing argument"),
            (
                &im,
                "add iqn.1994-05.com.redhat:a".into(),
                "already in group \"hosts\"",
            ),
            (&im, "del iqn.x".into(), "not in group"),
            (
                &im,
                "move iqn.1994-05.com.redhat:a".into(),
                "missing argument",
            ),
            (
                &im,
                "move iqn.1994-05.com.redhat:a nosuch".into(),
                "no group \"nosuch\"",
            ),
            (
                &im,
                "move iqn.1994-05.com.redhat:a hosts".into(),
                "already in group",
            ),
            (&im, "move iqn.x other".into(), "not in group"),
            (&im, "clear all".into(), "unexpected argument"),
            // paths
            (
                "/handlers/vdisk_foo/mgmt",
                "add_device x".into(),
                "valid handlers: vdisk_fileio",
            ),
            (
                "/targets/iscsi/iqn.2026-11.org.x:none/luns/mgmt",
                "clear".into(),
                "no such object",
            ),
            (&nosuch, "clear".into(), "valid entries: mgmt, hosts, other"),
            (
                "/devices/disk0/read_only",
                "add x 0".into(),
                "not a mgmt leaf",
            ),
            // CHAP
            (
                tm,
                format!("add_target_attribute {T} IncomingUser joe"),
                "missing argument",
            ),
            (
                tm,
                format!("add_target_attribute {T} IncomingUser joe short"),
                "12 to 255",
            ),
            (
                tm,
                format!("add_target_attribute {T} Password joe 0123456789abc"),
                "valid: IncomingUser, OutgoingUser",
            ),
            (
                tm,
                "add_target_attribute iqn.2026-11.org.x:none IncomingUser joe 0123456789abc".into(),
                "no target",
            ),
            (
                tm,
                format!("add_target_attribute {T} IncomingUser joe 0123456789abc extra"),
                "unexpected argument",
            ),
            (
                tm,
                format!("del_target_attribute {T} IncomingUser nobody"),
                "no CHAP user",
            ),
            (
                tm,
                format!("del_target_attribute {T} OutgoingUser nobody"),
                "no outgoing CHAP user",
            ),
            (
                tm,
                "add_attribute IncomingUser joe tiny".into(),
                "12 to 255",
            ),
            (tm, "del_attribute IncomingUser joe".into(), "no CHAP user"),
        ];
        for (path, cmd, want) in cases {
            let (mut t, rt) = tree();
            let before = t.config().clone();
            let e = t
                .run(path, &cmd)
                .expect_err(&format!("{path} {cmd:?} should fail"));
            let s = e.to_string();
            assert!(s.contains(want), "{path} {cmd:?}: {s:?} lacks {want:?}");
            assert_eq!(t.config(), &before, "{path} {cmd:?} changed the model");
            assert!(
                rt.calls().is_empty(),
                "{path} {cmd:?} reached the runtime: {:?}",
                rt.calls()
            );
        }
    }

    #[test]
    fn bad_sets_change_nothing() {
        let ta = format!("/targets/iscsi/{T}");
        let cases: Vec<(String, &str, &str)> = vec![
            ("/devices/disk0/read_only".into(), "2", "not a boolean"),
            (
                "/devices/disk0/blocksize".into(),
                "4096",
                "del_device and add_device",
            ),
            ("/devices/disk0/filename".into(), "/y", "read-only"),
            ("/devices/disk0/handler".into(), "vdisk_nullio", "read-only"),
            (
                "/devices/disk0/t10_vendor".into(),
                "WAYTOOLONGVENDOR",
                "1 to 8",
            ),
            ("/devices/disk0/naa".into(), "0x1234", "16 hex"),
            ("/devices/disk0/size".into(), "12x", "not a size"),
            ("/devices/disk0/size".into(), "1000", "multiple"),
            ("/devices/disk0/resync_size".into(), "0", "write 1"),
            ("/devices/disk0/nosuch".into(), "1", "valid attributes"),
            (
                "/devices/nosuch/read_only".into(),
                "1",
                "valid devices: disk0, null0, spare",
            ),
            ("/devices/null0/mem".into(), "1", "read-only"),
            ("/devices/null0/filename".into(), "/x", "valid attributes"),
            (format!("{ta}/enabled"), "yes please", "not a boolean"),
            (format!("{ta}/portals"), "localhost", "address:port"),
            (format!("{ta}/tpgt"), "-1", "not a tag"),
            (format!("{ta}/luns/mgmt"), "add spare 3", "use do"),
            (format!("{ta}/luns/0/device"), "spare", "read-only"),
            ("/targets/iscsi/max_burst_length".into(), "100", "512.."),
            (
                "/targets/iscsi/first_burst_length".into(),
                "16777215",
                "exceeds",
            ),
            (
                "/targets/iscsi/max_connections".into(),
                "70000",
                "out of range",
            ),
            (
                "/targets/iscsi/immediate_data".into(),
                "perhaps",
                "not a boolean",
            ),
            (
                "/targets/iscsi/max_burst_length".into(),
                "big",
                "not a number",
            ),
            ("/devices".into(), "x", "read-only"),
            ("/data_memory_mb".into(), "63", "63 MiB is out of range"),
            (
                "/data_memory_mb".into(),
                "1073741825",
                "valid: 64..1073741824",
            ),
            (
                "/data_memory_mb".into(),
                "99999999999999999999",
                "out of range",
            ),
            ("/data_memory_mb".into(), "1G", "\"1G\" is not a number"),
            ("/data_memory_mb".into(), "-1", "not a number"),
            ("/data_memory".into(), "1", "read-only"),
        ];
        for (path, value, want) in cases {
            let (mut t, rt) = tree();
            let before = t.config().clone();
            let e = t
                .set(&path, value)
                .expect_err(&format!("{path}={value} should fail"));
            let s = e.to_string();
            assert!(s.contains(want), "{path}={value}: {s:?} lacks {want:?}");
            assert_eq!(t.config(), &before);
            assert!(rt.calls().is_empty(), "{path}: {:?}", rt.calls());
        }
    }

    #[test]
    fn commands_change_model_and_runtime() {
        let (mut t, rt) = tree();
        t.run(
            "/handlers/vdisk_nullio/mgmt",
            "add_device n1 size=4M; blocksize=4096; nv_cache=1",
        )
        .unwrap();
        let d = t.config().device("n1").unwrap();
        assert_eq!(
            (d.size, d.blocksize, d.nv_cache),
            (Some(4 << 20), 4096, true)
        );
        t.run(
            &format!("/targets/iscsi/{T}/luns/mgmt"),
            "add n1 7 read_only=1",
        )
        .unwrap();
        t.run(&format!("/targets/iscsi/{T}/luns/mgmt"), "replace spare 7")
            .unwrap();
        t.run(&format!("/targets/iscsi/{T}/luns/mgmt"), "del 1")
            .unwrap();
        let luns = &t.config().iscsi_target(T).unwrap().luns;
        assert_eq!(luns.len(), 2);
        assert_eq!(
            luns[1],
            LunConfig {
                lun: 7,
                device: "spare".into(),
                read_only: false
            }
        );
        t.run(
            &format!("/targets/iscsi/{T}/ini_groups/hosts/initiators/mgmt"),
            "move iqn.1994-05.com.redhat:a other",
        )
        .unwrap();
        t.run(
            "/targets/iscsi/mgmt",
            "add_target iqn.2026-11.org.x:two portals=[::1]:3260,127.0.0.1:3261; alias=Two",
        )
        .unwrap();
        let t2 = t.config().iscsi_target("iqn.2026-11.org.x:two").unwrap();
        assert!(!t2.enabled);
        assert_eq!(t2.portals.len(), 2);
        t.set("/targets/iscsi/iqn.2026-11.org.x:two/enabled", "1")
            .unwrap();
        t.set("/devices/disk0/write_through", "yes").unwrap();
        t.set("/devices/disk0/serial", "ABC").unwrap();
        t.set("/targets/iscsi/max_burst_length", "524288").unwrap();
        t.set("/devices/disk0/resync_size", "1").unwrap();
        assert_eq!(t.config().device("disk0").unwrap().size, Some(2 << 30));
        assert_eq!(
            rt.calls(),
            vec![
                "add_device n1 vdisk_nullio".to_string(),
                format!("set_lun_map {T} - 0=disk0,1=null0,7=n1"),
                format!("set_lun_map {T} - 0=disk0,1=null0,7=spare"),
                format!("set_lun_map {T} - 0=disk0,7=spare"),
                format!("set_group_initiators {T} hosts "),
                format!("set_group_initiators {T} other iqn.1994-05.com.redhat:a"),
                "add_target iqn.2026-11.org.x:two".to_string(),
                "set_target_enabled iqn.2026-11.org.x:two true".to_string(),
                "set_device_attr disk0 WriteThrough(true)".to_string(),
                "set_device_attr disk0 Serial(\"ABC\")".to_string(),
                "set_iscsi_params".to_string(),
                "resync_size disk0".to_string(),
            ]
        );
        t.run("/handlers/vdisk_nullio/mgmt", "del_device null0")
            .unwrap_err();
        t.run(&format!("/targets/iscsi/{T}/ini_groups/mgmt"), "del hosts")
            .unwrap();
        t.run("/handlers/vdisk_nullio/mgmt", "del_device null0")
            .unwrap();
        assert!(t.config().device("null0").is_none());
        t.config().validate().unwrap();
    }

    #[test]
    fn chap_commands() {
        let (mut t, rt) = tree();
        let tm = "/targets/iscsi/mgmt";
        t.run(
            tm,
            &format!("add_target_attribute {T} IncomingUser joe s3cret=with;semi"),
        )
        .unwrap();
        t.run(
            tm,
            &format!("add_target_attribute {T} IncomingUser ann 0123456789abcdef"),
        )
        .unwrap();
        let e = t
            .run(
                tm,
                &format!("add_target_attribute {T} IncomingUser joe 0123456789abcdef"),
            )
            .unwrap_err();
        assert!(e.to_string().contains("already exists"), "{e}");
        // Mutual CHAP with an initiator's secret is refused.
        let e = t
            .run(
                tm,
                &format!("add_target_attribute {T} OutgoingUser tgt 0123456789abcdef"),
            )
            .unwrap_err();
        assert!(e.to_string().contains("different secrets"), "{e}");
        t.run(
            tm,
            &format!("add_target_attribute {T} OutgoingUser tgt target-secret-1"),
        )
        .unwrap();
        let tc = t.config().iscsi_target(T).unwrap();
        assert_eq!(tc.incoming_users[0].secret, "s3cret=with;semi");
        assert_eq!(tc.outgoing_user.as_ref().unwrap().user, "tgt");
        assert_eq!(
            t.get(&format!("/targets/iscsi/{T}/incoming_users"))
                .unwrap()
                .value,
            "joe\nann"
        );
        let e = t
            .set(&format!("/targets/iscsi/{T}/incoming_users"), "x")
            .unwrap_err();
        assert!(e.to_string().contains("add_target_attribute"), "{e}");
        t.run(tm, &format!("del_target_attribute {T} IncomingUser joe"))
            .unwrap();
        t.run(tm, "add_attribute IncomingUser disc discovery-secret")
            .unwrap();
        assert_eq!(
            t.get("/targets/iscsi/discovery_incoming_users")
                .unwrap()
                .value,
            "disc"
        );
        t.set("/targets/iscsi/digests", "none").unwrap();
        assert_eq!(t.config().iscsi.digests, vec![crate::config::Digest::Off]);
        assert_eq!(
            t.get("/targets/iscsi/digests").unwrap().to_text(),
            "none\n[key]"
        );
        assert!(t.set("/targets/iscsi/digests", "md5").is_err());
        t.set("/targets/iscsi/queue_depth", "64").unwrap();
        assert!(t.set("/targets/iscsi/queue_depth", "0").is_err());
        // Secrets never reach the recorded calls or change descriptions.
        let calls = rt.calls().join("\n");
        assert!(
            !calls.contains("s3cret") && !calls.contains("discovery-secret"),
            "{calls}"
        );
        let saved = t.config().clone();
        let (mut t2, _rt2) = tree();
        let plan = t2.diff(&saved).unwrap();
        let shown: String = plan.iter().map(ToString::to_string).collect();
        assert!(
            !shown.contains("target-secret-1") && !shown.contains("discovery-secret"),
            "{shown}"
        );
        t2.apply(&saved).unwrap();
        assert_eq!(t2.config(), &saved);
        assert!(t2.diff(&saved).unwrap().is_empty());
    }

    #[test]
    fn runtime_failure_leaves_model() {
        let (mut t, rt) = tree();
        rt.fail_on(Some("add_device"));
        let before = t.config().clone();
        let e = t
            .run("/handlers/vdisk_nullio/mgmt", "add_device n1 size=4096")
            .unwrap_err();
        assert!(matches!(e, MgmtError::Runtime { .. }), "{e}");
        assert!(e.to_string().contains("injected"), "{e}");
        assert_eq!(t.config(), &before);
    }

    #[test]
    fn removable_is_set_at_creation_and_read_only_after() {
        let (mut t, _rt) = tree();
        assert_eq!(t.get("/devices/disk0/removable").unwrap().value, "0");
        t.run(
            "/handlers/vdisk_nullio/mgmt",
            "add_device cd0 size=4M; removable=1",
        )
        .unwrap();
        assert!(t.config().device("cd0").unwrap().removable);
        assert!(t.config().device("cd0").unwrap().flags().removable);
        let v = t.get("/devices/cd0/removable").unwrap();
        assert_eq!((v.value.as_str(), v.key, v.writable), ("1", true, false));
        assert!(t.set("/devices/cd0/removable", "0").is_err());
        assert!(t.config().device("cd0").unwrap().removable);
        assert!(
            t.run(
                "/handlers/vdisk_nullio/mgmt",
                "add_device cd1 removable=maybe"
            )
            .is_err()
        );
    }

    #[test]
    fn reads_and_keys() {
        let (t, _rt) = tree();
        let v = t.get("/devices/disk0/thin_provisioned").unwrap();
        assert_eq!((v.value.as_str(), v.key, v.writable), ("1", true, false));
        assert_eq!(v.to_text(), "1\n[key]");
        let v = t.get("/devices/disk0/rotational").unwrap();
        assert_eq!((v.value.as_str(), v.key, v.writable), ("0", false, true));
        assert_eq!(v.to_text(), "0");
        assert_eq!(t.get("/devices/disk0/blocksize").unwrap().value, "512");
        assert_eq!(
            t.get("/devices/spare/size").unwrap().value,
            (1u64 << 20).to_string()
        );
        let naa = t.get("/devices/disk0/naa").unwrap().value;
        assert!(naa.starts_with("0x5001405"), "{naa}");
        assert_eq!(
            t.get("/handlers/vdisk_fileio/mgmt").unwrap().value,
            HANDLER_USAGE
        );
        assert_eq!(
            t.get(&format!("/targets/iscsi/{T}/luns/mgmt"))
                .unwrap()
                .value,
            LUNS_USAGE
        );
        assert_eq!(
            t.get(&format!(
                "/targets/iscsi/{T}/ini_groups/hosts/luns/0/read_only"
            ))
            .unwrap()
            .to_text(),
            "1\n[key]"
        );
        assert_eq!(
            t.get(&format!("/targets/iscsi/{T}/portals")).unwrap().value,
            "127.0.0.1:3260"
        );
        assert_eq!(
            t.get("/devices/null0/exported").unwrap().value,
            format!("{T}/luns/1\n{T}/ini_groups/hosts/luns/0")
        );
        let v = t.get("/targets/iscsi/immediate_data").unwrap();
        assert_eq!((v.value.as_str(), v.key), ("1", false));
        assert!(t.get("/devices/disk0/resync_size").is_err());
        assert!(t.get("/devices").is_err());
        // Paths are forgiving about slashes.
        assert_eq!(t.get("devices//disk0/blocksize/").unwrap().value, "512");
        let names = |p: &str| {
            t.ls(p)
                .unwrap()
                .into_iter()
                .map(|e| e.name)
                .collect::<Vec<_>>()
        };
        assert_eq!(
            names("/"),
            [
                "handlers",
                "devices",
                "targets",
                "data_memory_mb",
                "data_memory"
            ]
        );
        assert_eq!(names("/handlers/vdisk_nullio"), ["mgmt", "null0", "spare"]);
        assert_eq!(
            names(&format!("/targets/iscsi/{T}/luns")),
            ["mgmt", "0", "1"]
        );
        assert_eq!(
            names(&format!("/targets/iscsi/{T}/ini_groups")),
            ["mgmt", "hosts", "other"]
        );
        assert!(names("/devices/null0").contains(&"mem".to_string()));
        assert!(!names("/devices/disk0").contains(&"mem".to_string()));
        let e = t.ls("/nope").unwrap_err().to_string();
        assert!(
            e.contains("valid entries: handlers, devices, targets, data_memory_mb, data_memory"),
            "{e}"
        );
    }

    #[test]
    fn sessions_in_tree() {
        let (mut t, rt) = tree();
        let s = |isid| SessionInfo {
            target: T.into(),
            initiator: "iqn.1994-05.com.redhat:a".into(),
            isid,
            tsih: 1,
            group: Some("hosts".into()),
            connections: vec!["127.0.0.1:50000".into()],
            ..SessionInfo::default()
        };
        rt.set_sessions(vec![s(2), s(1)]);
        let names: Vec<String> = t
            .ls(&format!("/targets/iscsi/{T}/sessions"))
            .unwrap()
            .into_iter()
            .map(|e| e.name)
            .collect();
        assert_eq!(
            names,
            ["iqn.1994-05.com.redhat:a", "iqn.1994-05.com.redhat:a_1"]
        );
        let p = format!("/targets/iscsi/{T}/sessions/iqn.1994-05.com.redhat:a_1");
        assert_eq!(t.get(&format!("{p}/isid")).unwrap().value, "0x000000000002");
        assert_eq!(t.get(&format!("{p}/group")).unwrap().value, "hosts");
        t.set(&format!("{p}/force_close"), "1").unwrap();
        assert_eq!(
            rt.calls(),
            vec![format!("close_session {T} iqn.1994-05.com.redhat:a 0x2")]
        );
        assert!(t.set(&format!("{p}/tsih"), "3").is_err());
    }

    fn target_new() -> Config {
        let mut new = sample();
        // Device changes: one attribute, one recreated (blocksize), one gone, one new.
        new.devices[0].rotational = true;
        new.devices[1].blocksize = 4096;
        new.devices.retain(|d| d.name != "spare");
        let mut d2 = DeviceConfig::new("fresh", Handler::VdiskNullio);
        d2.size = Some(1 << 20);
        d2.mem = true;
        new.devices.push(d2);
        let t = &mut new.targets.iscsi[0];
        t.luns.push(LunConfig {
            lun: 2,
            device: "fresh".into(),
            read_only: false,
        });
        t.ini_groups.retain(|g| g.name != "other");
        t.ini_groups[0].initiators = vec!["iqn.1994-05.com.redhat:b".into()];
        t.ini_groups.push(GroupConfig {
            name: "newg".into(),
            initiators: vec!["iqn.1994-05.com.redhat:a".into()],
            luns: vec![LunConfig {
                lun: 3,
                device: "fresh".into(),
                read_only: false,
            }],
        });
        let mut t2 = IscsiTargetConfig::new("iqn.2026-11.org.x:two");
        t2.portals = vec!["[::1]:3260".into()];
        t2.luns = vec![LunConfig {
            lun: 0,
            device: "null0".into(),
            read_only: false,
        }];
        new.targets.iscsi.push(t2);
        new.iscsi.initial_r2t = true;
        new.validate().unwrap();
        new
    }

    #[test]
    fn apply_is_ordered_and_idempotent() {
        let (mut t, rt) = tree();
        let new = target_new();
        let plan = t.diff(&new).unwrap();
        assert!(!plan.is_empty());
        assert!(rt.calls().is_empty(), "diff must not touch the runtime");
        t.apply(&new).unwrap();
        assert_eq!(t.config(), &new);
        let calls = rt.calls();
        let pos = |p: &str| {
            calls
                .iter()
                .position(|c| c.starts_with(p))
                .unwrap_or_else(|| panic!("no {p} in {calls:#?}"))
        };
        // Unmap before deleting, delete before re-adding, enable last.
        assert!(pos(&format!("set_lun_map {T} hosts")) < pos("del_device null0"));
        assert!(pos("del_device null0") < pos("add_device null0"));
        assert!(pos("del_group") < pos("add_device"));
        assert!(pos("add_device fresh") < pos("add_target iqn.2026-11.org.x:two"));
        assert!(pos("add_group") < pos("set_device_attr disk0 Rotational(true)"));
        assert!(
            pos(&format!(
                "set_group_initiators {T} hosts iqn.1994-05.com.redhat:b"
            )) < pos(&format!("set_group_initiators {T} newg"))
        );
        assert_eq!(
            calls.last().unwrap(),
            "set_target_enabled iqn.2026-11.org.x:two true"
        );
        // Twice: nothing.
        rt.clear_calls();
        assert!(t.diff(&new).unwrap().is_empty());
        assert!(t.apply(&new).unwrap().is_empty());
        assert!(rt.calls().is_empty());
        // And back to where it started.
        t.apply(&sample()).unwrap();
        assert_eq!(t.config(), &sample());
        assert!(t.diff(&sample()).unwrap().is_empty());
    }

    #[test]
    fn apply_of_reordered_file_is_empty() {
        let (t, _rt) = tree();
        let mut same = sample();
        same.devices.reverse();
        same.targets.iscsi[0].luns.reverse();
        assert!(t.diff(&same).unwrap().is_empty());
    }

    #[test]
    fn apply_refuses_invalid_and_reports_partial() {
        let (mut t, rt) = tree();
        let mut bad = sample();
        bad.targets.iscsi[0].luns[0].device = "nosuch".into();
        let e = t.apply(&bad).unwrap_err();
        assert!(e.to_string().contains("no device"), "{e}");
        assert!(rt.calls().is_empty());
        rt.fail_on(Some("add_target"));
        let e = t.apply(&target_new()).unwrap_err();
        match &e {
            MgmtError::Apply { done, total, .. } => assert!(done < total),
            other => panic!("{other}"),
        }
        assert!(e.to_string().contains("add_target"), "{e}");
        t.config().validate().unwrap();
        // The rest goes through once the runtime recovers.
        rt.fail_on(None);
        t.apply(&target_new()).unwrap();
        assert_eq!(t.config(), &target_new());
    }

    #[test]
    fn autosave() {
        let (mut t, _rt) = tree();
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("auto.json");
        t.save_path = Some(p.clone());
        t.set("/devices/disk0/nv_cache", "1").unwrap();
        assert!(!p.exists(), "no autosave unless asked");
        t.set_autosave(true);
        t.set("/devices/disk0/rotational", "1").unwrap();
        assert_eq!(&Config::load(&p).unwrap(), t.config());
        let mut next = t.config().clone();
        next.devices[0].rotational = false;
        t.apply(&next).unwrap();
        assert_eq!(Config::load(&p).unwrap(), next);
        // A refused change saves nothing new; a failed save is reported
        // with the change, which stays.
        t.save_path = Some(dir.path().join("missing/x.json"));
        let msg = t.set("/devices/disk0/rotational", "1").unwrap();
        assert!(msg.contains("not saved"), "{msg}");
        assert!(t.config().devices[0].rotational);
    }

    #[test]
    fn data_memory_is_an_attribute_of_the_root() {
        let (mut t, rt) = tree();
        let default_mb = (t.config().reactor.data_memory_bytes() >> 20).to_string();
        // The default: its value, no [key].
        let v = t.get("/data_memory_mb").unwrap();
        assert_eq!(v.to_text(), default_mb);
        assert!(v.writable);
        assert!(
            v.description.contains("64..1073741824"),
            "{}",
            v.description
        );
        let e = t.ls("/").unwrap();
        let w: Vec<&str> = e
            .iter()
            .filter(|e| e.writable)
            .map(|e| e.name.as_str())
            .collect();
        assert_eq!(w, ["data_memory_mb"]);
        // A number: the model, the running limit (in bytes) and [key].
        let msg = t.set("/data_memory_mb", " 512 ").unwrap();
        assert_eq!(msg, "set /data_memory_mb 512");
        assert_eq!(t.config().reactor.data_memory_mb, Some(512));
        assert_eq!(rt.calls(), [format!("set_data_memory {}", 512u64 << 20)]);
        assert_eq!(t.get("/data_memory_mb").unwrap().to_text(), "512\n[key]");
        // The use, as the runtime reports it.
        assert_eq!(
            t.get("/data_memory").unwrap().value,
            format!(
                "limit {}\nused 0\npeak 0\nholders 0\nwaiting 0\nwaits 0",
                512u64 << 20
            )
        );
        // Saved, and a configuration file carries it.
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f.json");
        t.save(Some(&p)).unwrap();
        let saved = Config::load(&p).unwrap();
        assert_eq!(saved.reactor.data_memory_mb, Some(512));
        // Empty and "default" go back to the default limit.
        for v in ["", "default"] {
            rt.clear_calls();
            t.set("/data_memory_mb", "64").unwrap();
            rt.clear_calls();
            t.set("/data_memory_mb", v).unwrap();
            assert_eq!(t.config().reactor.data_memory_mb, None);
            assert_eq!(
                rt.calls(),
                [format!(
                    "set_data_memory {}",
                    t.config().reactor.data_memory_bytes()
                )]
            );
            assert_eq!(t.get("/data_memory_mb").unwrap().to_text(), default_mb);
        }
        // diff and apply of a file with another value: one change, carried
        // out on the runtime; the same file again changes nothing.
        let mut other = t.config().clone();
        other.reactor.data_memory_mb = Some(2048);
        other.reactor.poll_us = 5;
        let plan = t.diff(&other).unwrap();
        assert_eq!(
            plan.iter().map(|c| c.to_string()).collect::<Vec<_>>(),
            [
                "set /data_memory_mb 2048".to_string(),
                format!(
                    "reactor (at next start): {}",
                    serde_json::to_string(&other.reactor).unwrap()
                )
            ]
        );
        rt.clear_calls();
        t.apply(&other).unwrap();
        assert_eq!(t.config(), &other);
        assert_eq!(rt.calls(), [format!("set_data_memory {}", 2048u64 << 20)]);
        assert!(t.diff(&other).unwrap().is_empty());
        // Back to a file without it: the default.
        rt.clear_calls();
        t.apply(&saved).unwrap();
        assert_eq!(rt.calls(), [format!("set_data_memory {}", 512u64 << 20)]);
        other.reactor.data_memory_mb = None;
        t.apply(&other).unwrap();
        assert_eq!(t.config().reactor.data_memory_mb, None);
        // A refusal of the running system leaves the model.
        rt.fail_on(Some("set_data_memory"));
        assert!(t.set("/data_memory_mb", "128").is_err());
        assert_eq!(t.config().reactor.data_memory_mb, None);
    }

    #[test]
    fn save_writes_the_model() {
        let (mut t, _rt) = tree();
        t.set("/devices/disk0/nv_cache", "1").unwrap();
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f.json");
        t.save(Some(&p)).unwrap();
        assert_eq!(&Config::load(&p).unwrap(), t.config());
        assert!(t.save(None).is_err());
    }

    #[test]
    fn sizes_and_bools() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("4k"), Ok(4096));
        assert_eq!(parse_size("1G"), Ok(1 << 30));
        assert!(parse_size("1P").is_err());
        assert!(parse_size("").is_err());
        assert!(parse_size("99999999999T").is_err());
        assert_eq!(parse_bool("Yes"), Ok(true));
        assert_eq!(parse_bool("0"), Ok(false));
        assert!(parse_bool("2").is_err());
    }

    #[test]
    fn srp_ports_are_managed_like_iscsi_targets() {
        let mut cfg = sample();
        let mut p = crate::config::SrpTargetConfig::soft("srp0", "/run/ferrite/srp0.sock");
        p.luns.push(LunConfig {
            lun: 3,
            device: "spare".into(),
            read_only: true,
        });
        cfg.targets.srp.push(p);
        let rt = Arc::new(FakeRuntime::new());
        let mut t = Tree::new(cfg, rt.clone(), None);
        let names = |v: Vec<Entry>| v.into_iter().map(|e| e.name).collect::<Vec<_>>();
        assert_eq!(names(t.ls("/targets").unwrap()), ["iscsi", "srp"]);
        assert_eq!(names(t.ls("/targets/srp").unwrap()), ["mgmt", "srp0"]);
        let entries = t.ls("/targets/srp/srp0").unwrap();
        assert_eq!(entries.len(), SRP_ATTRS.len() + 3);
        let writable: Vec<String> = entries
            .iter()
            .filter(|e| e.writable)
            .map(|e| e.name.clone())
            .collect();
        assert_eq!(writable, ["enabled"]);
        let get = |t: &Tree, a: &str| t.get(&format!("/targets/srp/srp0/{a}")).unwrap().value;
        assert_eq!(get(&t, "enabled"), "1");
        assert_eq!(get(&t, "provider"), "soft");
        assert_eq!(get(&t, "listen"), "/run/ferrite/srp0.sock");
        assert_eq!(get(&t, "credits"), "128");
        assert_eq!(get(&t, "luns/3/device"), "spare");
        assert_eq!(get(&t, "luns/3/read_only"), "1");
        assert_eq!(get(&t, "port_id").len(), 34);
        assert!(t.exported("spare").contains(&"srp/srp0/luns/3".to_string()));
        assert!(t.get("/targets/srp/nosuch").is_err());
        assert!(t.get("/targets/srp/srp0/nosuch").is_err());
        // A device an SRP port maps cannot be deleted.
        assert!(
            t.run("/handlers/vdisk_nullio/mgmt", "del_device spare")
                .is_err()
        );

        // Maps, groups and initiators: the iSCSI commands, one runtime call
        // carrying the port's whole new configuration each.
        rt.clear_calls();
        t.run("/targets/srp/srp0/luns/mgmt", "add null0 0").unwrap();
        t.run("/targets/srp/srp0/ini_groups/mgmt", "create hosts")
            .unwrap();
        t.run(
            "/targets/srp/srp0/ini_groups/hosts/initiators/mgmt",
            "add 0xfe80*",
        )
        .unwrap();
        t.run(
            "/targets/srp/srp0/ini_groups/hosts/luns/mgmt",
            "add spare 0 read_only=1",
        )
        .unwrap();
        assert!(
            t.run("/targets/srp/srp0/luns/mgmt", "add nosuch 1")
                .is_err()
        );
        assert_eq!(
            rt.calls(),
            [
                "set_srp_target srp0 enabled=true luns=0=null0,3=spare groups=",
                "set_srp_target srp0 enabled=true luns=0=null0,3=spare groups=hosts[]()",
                "set_srp_target srp0 enabled=true luns=0=null0,3=spare groups=hosts[0xfe80*]()",
                "set_srp_target srp0 enabled=true luns=0=null0,3=spare groups=hosts[0xfe80*](0=spare)",
            ]
        );
        assert_eq!(
            names(
                t.ls("/targets/srp/srp0/ini_groups/hosts/initiators")
                    .unwrap()
            ),
            ["mgmt", "0xfe80*"]
        );
        let p = &t.config().targets.srp[0];
        assert_eq!(p.ini_groups[0].luns[0].device, "spare");
        assert!(p.ini_groups[0].luns[0].read_only);
        // The iSCSI target's groups are untouched.
        assert_eq!(t.config().targets.iscsi[0].ini_groups.len(), 2);

        // enabled is writable; a refused change leaves the model alone.
        rt.clear_calls();
        t.set("/targets/srp/srp0/enabled", "0").unwrap();
        assert_eq!(get(&t, "enabled"), "0");
        rt.fail_on(Some("set_srp_target"));
        assert!(t.set("/targets/srp/srp0/enabled", "1").is_err());
        assert_eq!(get(&t, "enabled"), "0");
        rt.fail_on(None);

        // Ports come and go through /targets/srp/mgmt.
        rt.clear_calls();
        assert!(
            t.run("/targets/srp/mgmt", "add_target p1").is_err(),
            "listen is required"
        );
        assert!(
            t.run("/targets/srp/mgmt", "add_target p1 listen=rel.sock")
                .is_err(),
            "a relative path fails validation"
        );
        assert!(
            t.run("/targets/srp/mgmt", "add_target srp0 listen=/x.sock")
                .is_err()
        );
        t.run(
            "/targets/srp/mgmt",
            "add_target p1 listen=/run/p1.sock credits=64",
        )
        .unwrap();
        assert_eq!(get_p1(&t, "enabled"), "0", "created disabled");
        assert_eq!(get_p1(&t, "credits"), "64");
        t.run(
            "/targets/srp/mgmt",
            "add_target h1 provider=verbs listen=192.0.2.1:5000 device=mlx5_0 hca_port=2",
        )
        .unwrap();
        assert_eq!(
            t.get("/targets/srp/h1/provider").unwrap().value,
            "verbs mlx5_0 port 2"
        );
        t.run("/targets/srp/mgmt", "del_target h1").unwrap();
        assert!(t.run("/targets/srp/mgmt", "del_target h1").is_err());
        assert_eq!(
            rt.calls(),
            [
                "set_srp_target p1 enabled=false luns= groups=",
                "set_srp_target h1 enabled=false luns= groups=",
                "set_srp_target h1 -",
            ]
        );
        assert!(
            t.get("/targets/srp/mgmt")
                .unwrap()
                .value
                .contains("add_target")
        );

        // SRP sessions are listed under their port, not under an iSCSI
        // target of the same name.
        rt.set_sessions(vec![SessionInfo {
            fabric: Fabric::Srp,
            target: "srp0".into(),
            initiator: "0xfe800000000000000000000000000001".into(),
            connections: vec!["soft core 0 qpn 0x1".into(), "soft core 0 qpn 0x2".into()],
            lun_count: 2,
            active_commands: 5,
            ..SessionInfo::default()
        }]);
        let s = "/targets/srp/srp0/sessions/0xfe800000000000000000000000000001";
        assert_eq!(
            names(t.ls("/targets/srp/srp0/sessions").unwrap()),
            ["0xfe800000000000000000000000000001"]
        );
        assert_eq!(t.get(&format!("{s}/lun_count")).unwrap().value, "2");
        assert_eq!(t.get(&format!("{s}/active_commands")).unwrap().value, "5");
        assert_eq!(
            t.get(&format!("{s}/connections"))
                .unwrap()
                .value
                .lines()
                .count(),
            2
        );
        assert!(names(t.ls(&format!("/targets/iscsi/{T}/sessions")).unwrap()).is_empty());

        // Applying a configuration whose SRP port differs replaces the port
        // on the running system; the same section again changes nothing.
        let mut other = t.config().clone();
        other.targets.srp[0].credits = 64;
        let changes = t.apply(&other).unwrap();
        assert!(matches!(&changes[..], [Change::SetSrpTarget { .. }]));
        assert_eq!(t.config().targets.srp[0].credits, 64);
        let same = t.config().clone();
        assert!(t.apply(&same).unwrap().is_empty());
    }

    fn get_p1(t: &Tree, a: &str) -> String {
        t.get(&format!("/targets/srp/p1/{a}")).unwrap().value
    }

    #[test]
    fn group_chap_users_and_digest_lists() {
        let mut cfg = sample();
        cfg.targets.iscsi[0].group_incoming_users.insert(
            "hosts".into(),
            vec![crate::config::ChapUser {
                user: "grp".into(),
                secret: "group-secret-99".into(),
            }],
        );
        cfg.validate().unwrap();
        let rt = Arc::new(FakeRuntime::new());
        let mut t = Tree::new(cfg, rt, None);
        let hosts = format!("/targets/iscsi/{T}/ini_groups/hosts");
        let v = t.get(&format!("{hosts}/incoming_users")).unwrap();
        assert_eq!((v.value.as_str(), v.key, v.writable), ("grp", true, false));
        assert!(
            t.ls(&hosts)
                .unwrap()
                .iter()
                .any(|e| e.name == "incoming_users")
        );
        let v = t
            .get(&format!(
                "/targets/iscsi/{T}/ini_groups/other/incoming_users"
            ))
            .unwrap();
        assert_eq!(v.value, "");
        assert!(
            t.set(&format!("{hosts}/incoming_users"), "x").is_err(),
            "read-only"
        );

        // Header and data digests: lists of their own, empty = `digests`.
        assert_eq!(t.get("/targets/iscsi/data_digests").unwrap().value, "");
        t.set("/targets/iscsi/header_digests", "crc32c").unwrap();
        t.set("/targets/iscsi/data_digests", "none,crc32c").unwrap();
        let p = &t.config().iscsi;
        use crate::config::Digest;
        assert_eq!(p.header_digest_list(), [Digest::Crc32c]);
        assert_eq!(p.data_digest_list(), [Digest::Off, Digest::Crc32c]);
        assert_eq!(
            t.get("/targets/iscsi/data_digests").unwrap().to_text(),
            "none crc32c\n[key]"
        );
        assert!(t.set("/targets/iscsi/data_digests", "none none").is_err());
        t.set("/targets/iscsi/header_digests", "").unwrap();
        assert_eq!(
            t.config().iscsi.header_digest_list(),
            t.config().iscsi.digests.as_slice()
        );
    }
}
