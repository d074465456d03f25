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
//! /device_groups/{mgmt,<dg>/{devices/mgmt,target_groups/{mgmt,<tg>/{group_id,state,preferred,mgmt}}}}
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
//! This module resolves paths and carries out `ls`, `get`, `set`, `do`,
//! `diff`, `apply` and `save`; each kind of object has its own file with
//! its attributes and commands: `devices` (the device attribute table,
//! `add_device`, `del_device`), `targets` (iSCSI parameters, the target
//! attribute table, CHAP, LUN maps, initiator groups), `srp`, `sessions`,
//! `alua` (ALUA device groups) and `system` (the root attributes).
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

mod alua;
mod devices;
mod sessions;
mod srp;
mod system;
mod targets;
#[cfg(test)]
mod tests;

use alua::AluaNode;
pub use alua::{DEVICE_GROUPS_USAGE, DG_DEVICES_USAGE, TARGET_GROUPS_USAGE, TG_TARGETS_USAGE};
pub use devices::HANDLER_USAGE;
pub(crate) use devices::{
    DEVICE_ATTRS, DeviceAttrDef, Write, device_attr_by_scst_name, device_attr_value, parse_size_mb,
};
pub use srp::SRP_TARGETS_USAGE;
pub use targets::{GROUPS_USAGE, INITIATORS_USAGE, LUNS_USAGE, TARGETS_USAGE};
use {devices::*, sessions::*, srp::*, system::*, targets::*};

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

impl Entry {
    /// A directory.
    pub(crate) fn dir(name: &str, desc: &str) -> Entry {
        Entry {
            name: name.into(),
            kind: EntryKind::Dir,
            writable: false,
            description: desc.into(),
        }
    }

    /// A directory's `mgmt` leaf.
    pub(crate) fn mgmt(desc: &str) -> Entry {
        Entry {
            name: "mgmt".into(),
            kind: EntryKind::Mgmt,
            writable: true,
            description: desc.into(),
        }
    }

    /// A link to another object.
    pub(crate) fn link(name: &str, desc: String) -> Entry {
        Entry {
            name: name.into(),
            kind: EntryKind::Link,
            writable: false,
            description: desc,
        }
    }
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
    DeviceAttr(String, &'static DeviceAttrDef),
    Targets,
    Iscsi,
    IscsiMgmt,
    IscsiParam(&'static AttrDef),
    Target(String),
    TargetAttr(String, &'static TargetAttrDef),
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
    /// `/device_groups/...`: ALUA device groups.
    Alua(AluaNode),
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

fn fmt_stats(s: &IoStats) -> String {
    format!(
        "read_cmds {}\nwrite_cmds {}\nother_cmds {}\nread_bytes {}\nwrite_bytes {}\nerrors {}",
        s.read_cmds, s.write_cmds, s.other_cmds, s.read_bytes, s.write_bytes, s.errors
    )
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
                    "device_groups" => Node::Alua(AluaNode::Groups),
                    _ => match find_attr(ROOT_ATTRS, c) {
                        Some(a) => Node::RootAttr(a),
                        None => {
                            return Err(no(names_hint(
                                "entries",
                                ["handlers", "devices", "targets", "device_groups"]
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
                    match device_attr(c) {
                        Some(a) if (a.applies)(h) => Node::DeviceAttr(d.clone(), a),
                        _ => {
                            return Err(no(names_hint(
                                "attributes",
                                DEVICE_ATTRS
                                    .iter()
                                    .filter(|a| (a.applies)(h))
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
                    _ => match TARGET_ATTRS.iter().find(|a| a.name == c) {
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
                Node::Alua(ref n) => Node::Alua(self.resolve_alua(n, c).map_err(no)?),
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

    /// Lists a directory (or describes a leaf as a one-entry listing).
    pub fn ls(&self, path: &str) -> Result<Vec<Entry>, MgmtError> {
        let (dir, mgmt, link) = (Entry::dir, Entry::mgmt, Entry::link);
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
                dir("device_groups", "ALUA device groups"),
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
                    .filter(|a| (a.applies)(h))
                    .map(|a| Entry {
                        name: a.name.into(),
                        kind: EntryKind::Attr,
                        writable: a.writable(h),
                        description: a.desc.into(),
                    })
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
            .chain(TARGET_ATTRS.iter().map(|a| Entry {
                name: a.name.into(),
                kind: EntryKind::Attr,
                writable: a.write.is_ok(),
                description: a.desc.into(),
            }))
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
            Node::Alua(n) if !n.is_leaf() => self.ls_alua(&n),
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
                        Node::Alua(ref n) if n.is_mgmt() => EntryKind::Mgmt,
                        Node::Alua(AluaNode::Device(..) | AluaNode::TgTarget(..)) => {
                            EntryKind::Link
                        }
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
            Node::DeviceAttr(name, a) => self.get_device_attr(name, a, path)?,
            Node::IscsiParam(a) => self.get_iscsi_param(a),
            Node::TargetAttr(t, a) => {
                let t = cfg
                    .iscsi_target(t)
                    .ok_or_else(|| MgmtError::Refused(format!("no target {t:?}")))?;
                let (value, key) = (a.read)(t);
                AttrValue {
                    value,
                    key,
                    writable: a.write.is_ok(),
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
            Node::SrpAttr(t, a) => self.get_srp_attr(t, a)?,
            Node::Alua(n) => self.get_alua(n, path)?,
            Node::SessionAttr(_, s, a) => self.get_session_attr(s, a, path)?,
            _ => {
                return Err(MgmtError::NotWritable {
                    path: path.into(),
                    msg: "a directory has no value; use ls".into(),
                });
            }
        })
    }

    /// Executes one change: model copy, validation, runtime, adoption.
    pub fn execute(&mut self, c: Change) -> Result<String, MgmtError> {
        let msg = self.execute_unsaved(c)?;
        Ok(self.after_change(msg))
    }

    fn execute_unsaved(&mut self, c: Change) -> Result<String, MgmtError> {
        let mut cand = self.live_config();
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
            Node::DeviceAttr(name, a) => match self.device_attr_change(&name, a, value, path)? {
                Some(c) => c,
                None => return Ok(format!("{path}: unchanged")),
            },
            Node::IscsiParam(a) if read_only_attr(a.name) => {
                return Err(not_writable(
                    "changed by commands: do /targets/iscsi/mgmt \"add_attribute IncomingUser USER SECRET\"",
                ));
            }
            Node::IscsiParam(a) => self.iscsi_param_change(a, value, path)?,
            Node::TargetAttr(t, a) => match a.write {
                Ok(write) => write(t, value).map_err(bad)?,
                Err(msg) => return Err(not_writable(msg)),
            },
            Node::SessionAttr(t, s, a) if a.name == "force_close" => {
                return self.force_close(&t, &s, value, path);
            }
            Node::SrpAttr(t, a) if a.name == "enabled" => {
                return self.set_srp_enabled(&t, value, path);
            }
            Node::Alua(n) => match self.set_alua(&n, value, path)? {
                Some(c) => c,
                None => return Ok(format!("{path}: unchanged")),
            },
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
            Node::Alua(n) if n.is_mgmt() => self.run_alua(&n, command)?,
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

    /// The changes `apply` would make to reach `new`.
    pub fn diff(&self, new: &Config) -> Result<Vec<Change>, MgmtError> {
        new.validate()?;
        plan(&self.live_config(), new).map_err(|e| MgmtError::Refused(e.0))
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
        self.live_config().save_atomic(&p).map_err(|e| match e {
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
