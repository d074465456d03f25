//! `/device_groups`: ALUA device groups and their target port groups, as
//! SCST's sysfs has them.
//!
//! ```text
//! /device_groups/mgmt                                   create NAME, del NAME
//! /device_groups/<dg>/devices/{mgmt,<device>}           add DEV, del DEV
//! /device_groups/<dg>/target_groups/mgmt                create TG, del TG
//! /device_groups/<dg>/target_groups/<tg>/{group_id,state,preferred}
//! /device_groups/<dg>/target_groups/<tg>/{mgmt,<target>} add TARGET, del TARGET
//! ```
//!
//! Structural commands become one [`Change::SetDeviceGroups`]; `state`
//! and `preferred` become [`Change::SetAluaState`], which the running
//! system carries out at once. `state` and `preferred` read the running
//! system's values: an initiator's SET TARGET PORT GROUPS changes them.

use ferrite_core::alua::AccessState;

use super::*;
use crate::config::{DeviceGroupConfig, TargetGroupConfig};

/// Usage of `/device_groups/mgmt`.
pub const DEVICE_GROUPS_USAGE: &str = "\
create NAME
del NAME";
/// Usage of `/device_groups/<dg>/devices/mgmt`.
pub const DG_DEVICES_USAGE: &str = "\
add DEVICE
del DEVICE";
/// Usage of `/device_groups/<dg>/target_groups/mgmt`.
pub const TARGET_GROUPS_USAGE: &str = "\
create NAME        (group_id: the lowest free one; set group_id to change it)
del NAME";
/// Usage of `/device_groups/<dg>/target_groups/<tg>/mgmt`.
pub const TG_TARGETS_USAGE: &str = "\
add TARGET         (an iSCSI target name or an SRP port name)
del TARGET";

pub(super) static TG_ATTRS: &[AttrDef] = &[
    AttrDef {
        name: "group_id",
        desc: "TARGET PORT GROUP identifier, 1 to 65535, unique in the device group",
    },
    AttrDef {
        name: "state",
        desc: "asymmetric access state: active, nonoptimized, standby, unavailable, offline, transitioning (live)",
    },
    AttrDef {
        name: "preferred",
        desc: "preferred target port group (PREF bit), 0 or 1 (live)",
    },
];

/// A node under `/device_groups`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum AluaNode {
    Groups,
    GroupsMgmt,
    Group(String),
    Devices(String),
    DevicesMgmt(String),
    Device(String, String),
    TargetGroups(String),
    TargetGroupsMgmt(String),
    TargetGroup(String, String),
    TgAttr(String, String, &'static AttrDef),
    TgMgmt(String, String),
    TgTarget(String, String, String),
}

impl AluaNode {
    /// Whether the node is a `mgmt` leaf.
    pub(super) fn is_mgmt(&self) -> bool {
        matches!(
            self,
            AluaNode::GroupsMgmt
                | AluaNode::DevicesMgmt(_)
                | AluaNode::TargetGroupsMgmt(_)
                | AluaNode::TgMgmt(..)
        )
    }

    /// Whether the node is a leaf (no children).
    pub(super) fn is_leaf(&self) -> bool {
        self.is_mgmt()
            || matches!(
                self,
                AluaNode::Device(..) | AluaNode::TgAttr(..) | AluaNode::TgTarget(..)
            )
    }
}

fn tg_path(dg: &str, tg: &str) -> String {
    format!("/device_groups/{dg}/target_groups/{tg}")
}

impl Tree {
    /// The device groups with the running system's states.
    pub(super) fn live_device_groups(&self) -> Vec<DeviceGroupConfig> {
        let mut v = self.cfg.device_groups.clone();
        for g in &mut v {
            for t in &mut g.target_groups {
                if let Some((st, pref)) = self.rt.alua_state(&g.name, &t.name) {
                    t.state = st.name().into();
                    t.preferred = pref;
                }
            }
        }
        v
    }

    /// The model with the running system's ALUA states: what `save`
    /// writes and what changes start from.
    pub fn live_config(&self) -> Config {
        let mut c = self.cfg.clone();
        c.device_groups = self.live_device_groups();
        c
    }

    /// Resolves `c` under the ALUA node `node`; `Err` carries the hint.
    pub(super) fn resolve_alua(&self, node: &AluaNode, c: &str) -> Result<AluaNode, String> {
        let cfg = &self.cfg;
        let dg = |n: &str| cfg.device_group(n);
        Ok(match node {
            AluaNode::Groups => {
                if c == "mgmt" {
                    AluaNode::GroupsMgmt
                } else if dg(c).is_some() {
                    AluaNode::Group(c.into())
                } else {
                    return Err(names_hint(
                        "entries",
                        std::iter::once("mgmt")
                            .chain(cfg.device_groups.iter().map(|g| g.name.as_str())),
                    ));
                }
            }
            AluaNode::Group(g) => match c {
                "devices" => AluaNode::Devices(g.clone()),
                "target_groups" => AluaNode::TargetGroups(g.clone()),
                _ => return Err(names_hint("entries", ["devices", "target_groups"])),
            },
            AluaNode::Devices(g) => {
                let devs = dg(g).map(|x| x.devices.clone()).unwrap_or_default();
                if c == "mgmt" {
                    AluaNode::DevicesMgmt(g.clone())
                } else if devs.iter().any(|d| d == c) {
                    AluaNode::Device(g.clone(), c.into())
                } else {
                    return Err(names_hint(
                        "entries",
                        std::iter::once("mgmt".to_string()).chain(devs),
                    ));
                }
            }
            AluaNode::TargetGroups(g) => {
                let tgs: Vec<String> = dg(g)
                    .map(|x| x.target_groups.iter().map(|t| t.name.clone()).collect())
                    .unwrap_or_default();
                if c == "mgmt" {
                    AluaNode::TargetGroupsMgmt(g.clone())
                } else if tgs.iter().any(|t| t == c) {
                    AluaNode::TargetGroup(g.clone(), c.into())
                } else {
                    return Err(names_hint(
                        "entries",
                        std::iter::once("mgmt".to_string()).chain(tgs),
                    ));
                }
            }
            AluaNode::TargetGroup(g, t) => {
                let targets = dg(g)
                    .and_then(|x| x.target_group(t))
                    .map(|x| x.targets.clone())
                    .unwrap_or_default();
                if c == "mgmt" {
                    AluaNode::TgMgmt(g.clone(), t.clone())
                } else if let Some(a) = find_attr(TG_ATTRS, c) {
                    AluaNode::TgAttr(g.clone(), t.clone(), a)
                } else if targets.iter().any(|x| x == c) {
                    AluaNode::TgTarget(g.clone(), t.clone(), c.into())
                } else {
                    return Err(names_hint(
                        "entries",
                        std::iter::once("mgmt".to_string())
                            .chain(TG_ATTRS.iter().map(|a| a.name.to_string()))
                            .chain(targets),
                    ));
                }
            }
            _ => return Err("a leaf has no children".into()),
        })
    }

    pub(super) fn ls_alua(&self, node: &AluaNode) -> Vec<Entry> {
        let (dir, mgmt, link) = (Entry::dir, Entry::mgmt, Entry::link);
        let cfg = &self.cfg;
        match node {
            AluaNode::Groups => std::iter::once(mgmt("create, del"))
                .chain(
                    cfg.device_groups
                        .iter()
                        .map(|g| dir(&g.name, "ALUA device group")),
                )
                .collect(),
            AluaNode::Group(_) => vec![
                dir("devices", "devices of the group"),
                dir("target_groups", "target port groups"),
            ],
            AluaNode::Devices(g) => std::iter::once(mgmt("add, del"))
                .chain(
                    cfg.device_group(g)
                        .map(|x| x.devices.clone())
                        .unwrap_or_default()
                        .iter()
                        .map(|d| link(d, format!("-> /devices/{d}"))),
                )
                .collect(),
            AluaNode::TargetGroups(g) => std::iter::once(mgmt("create, del"))
                .chain(
                    cfg.device_group(g)
                        .map(|x| x.target_groups.clone())
                        .unwrap_or_default()
                        .iter()
                        .map(|t| dir(&t.name, "target port group")),
                )
                .collect(),
            AluaNode::TargetGroup(g, t) => std::iter::once(mgmt("add, del"))
                .chain(TG_ATTRS.iter().map(|a| Entry {
                    name: a.name.into(),
                    kind: EntryKind::Attr,
                    writable: true,
                    description: a.desc.into(),
                }))
                .chain(
                    cfg.device_group(g)
                        .and_then(|x| x.target_group(t))
                        .map(|x| x.targets.clone())
                        .unwrap_or_default()
                        .iter()
                        .map(|x| link(x, "target port".into())),
                )
                .collect(),
            _ => Vec::new(),
        }
    }

    pub(super) fn get_alua(&self, node: &AluaNode, path: &str) -> Result<AttrValue, MgmtError> {
        let usage = |u: &str| AttrValue {
            value: u.into(),
            key: false,
            writable: true,
            description: "commands (do)".into(),
        };
        Ok(match node {
            AluaNode::GroupsMgmt => usage(DEVICE_GROUPS_USAGE),
            AluaNode::DevicesMgmt(_) => usage(DG_DEVICES_USAGE),
            AluaNode::TargetGroupsMgmt(_) => usage(TARGET_GROUPS_USAGE),
            AluaNode::TgMgmt(..) => usage(TG_TARGETS_USAGE),
            AluaNode::Device(_, d) => AttrValue {
                value: format!("/devices/{d}"),
                key: false,
                writable: false,
                description: "device of this group".into(),
            },
            AluaNode::TgTarget(_, _, t) => AttrValue {
                value: t.clone(),
                key: false,
                writable: false,
                description: "target port of this group".into(),
            },
            AluaNode::TgAttr(g, t, a) => {
                let tg = self.live_target_group(g, t)?;
                let (value, key) = match a.name {
                    "group_id" => (tg.group_id.to_string(), true),
                    "state" => (tg.state.clone(), true),
                    _ => (b01(tg.preferred), tg.preferred),
                };
                AttrValue {
                    value,
                    key,
                    writable: true,
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

    fn live_target_group(&self, g: &str, t: &str) -> Result<TargetGroupConfig, MgmtError> {
        self.live_device_groups()
            .into_iter()
            .find(|x| x.name == g)
            .and_then(|x| x.target_group(t).cloned())
            .ok_or_else(|| MgmtError::Refused(format!("no target group {t:?} in {g:?}")))
    }

    /// The change a write of a target group attribute makes; `None` when
    /// the value is the current one.
    pub(super) fn set_alua(
        &self,
        node: &AluaNode,
        value: &str,
        path: &str,
    ) -> Result<Option<Change>, MgmtError> {
        let bad = |msg: String| MgmtError::Refused(format!("{path}: {msg}"));
        let AluaNode::TgAttr(g, t, a) = node else {
            return Err(MgmtError::NotWritable {
                path: path.into(),
                msg: if node.is_mgmt() {
                    "a mgmt leaf takes commands: use do".into()
                } else {
                    "read-only".into()
                },
            });
        };
        let cur = self.live_target_group(g, t)?;
        let alua = |state: AccessState, preferred: bool| {
            if (state, preferred) == (cur.access_state(), cur.preferred) {
                None
            } else {
                Some(Change::SetAluaState {
                    group: g.clone(),
                    target_group: t.clone(),
                    state: state.name().into(),
                    preferred,
                })
            }
        };
        match a.name {
            "state" => {
                let st = AccessState::parse(value).ok_or_else(|| {
                    bad(format!(
                        "{value:?} is not an access state; valid: {}",
                        AccessState::ALL.map(|s| s.name()).join(", ")
                    ))
                })?;
                Ok(alua(st, cur.preferred))
            }
            "preferred" => Ok(alua(cur.access_state(), parse_bool(value).map_err(bad)?)),
            _ => {
                let id: u32 = value
                    .parse()
                    .ok()
                    .filter(|n| (1..=65535).contains(n))
                    .ok_or_else(|| bad(format!("{value:?}; valid: 1 to 65535")))?;
                if id == cur.group_id {
                    return Ok(None);
                }
                let mut groups = self.cfg.device_groups.clone();
                for tg in groups
                    .iter_mut()
                    .filter(|x| &x.name == g)
                    .flat_map(|x| x.target_groups.iter_mut())
                    .filter(|x| &x.name == t)
                {
                    tg.group_id = id;
                }
                Ok(Some(Change::SetDeviceGroups {
                    op: format!("set {}/group_id {id}", tg_path(g, t)),
                    groups,
                }))
            }
        }
    }

    /// Runs a command on an ALUA `mgmt` leaf.
    pub(super) fn run_alua(&self, node: &AluaNode, command: &str) -> Result<Change, MgmtError> {
        let mut groups = self.cfg.device_groups.clone();
        let refused = |m: String| MgmtError::Refused(m);
        let (usage, prefix) = match node {
            AluaNode::GroupsMgmt => (DEVICE_GROUPS_USAGE, "/device_groups".to_string()),
            AluaNode::DevicesMgmt(g) => (DG_DEVICES_USAGE, format!("/device_groups/{g}/devices")),
            AluaNode::TargetGroupsMgmt(g) => (
                TARGET_GROUPS_USAGE,
                format!("/device_groups/{g}/target_groups"),
            ),
            AluaNode::TgMgmt(g, t) => (TG_TARGETS_USAGE, tg_path(g, t)),
            _ => {
                return Err(MgmtError::NotWritable {
                    path: "/device_groups".into(),
                    msg: "not a mgmt leaf".into(),
                });
            }
        };
        let cmd = parse_cmd(command, usage)?;
        let verb = cmd.words[0].clone();
        let valid_verbs: &[&str] = match node {
            AluaNode::GroupsMgmt | AluaNode::TargetGroupsMgmt(_) => &["create", "del"],
            _ => &["add", "del"],
        };
        if !valid_verbs.contains(&verb.as_str()) {
            return Err(usage_err(format!("unknown command {verb:?}"), usage));
        }
        cmd.arity(2, &[], usage)?;
        let arg = cmd.words[1].clone();
        let dg_mut = |groups: &mut Vec<DeviceGroupConfig>, g: &str| -> Result<usize, MgmtError> {
            groups
                .iter()
                .position(|x| x.name == g)
                .ok_or_else(|| refused(format!("no device group {g:?}")))
        };
        match (node, verb.as_str()) {
            (AluaNode::GroupsMgmt, "create") => {
                validate_object_name(&arg).map_err(|m| usage_err(m, usage))?;
                if groups.iter().any(|x| x.name == arg) {
                    return Err(refused(format!("device group {arg:?} already exists")));
                }
                groups.push(DeviceGroupConfig::new(arg.clone()));
            }
            (AluaNode::GroupsMgmt, _) => {
                let i = dg_mut(&mut groups, &arg).map_err(|_| {
                    refused(format!(
                        "no device group {arg:?}; {}",
                        names_hint("device groups", groups.iter().map(|x| &x.name))
                    ))
                })?;
                groups.remove(i);
            }
            (AluaNode::DevicesMgmt(g), "add") => {
                let i = dg_mut(&mut groups, g)?;
                if self.cfg.device(&arg).is_none() {
                    return Err(refused(format!(
                        "no device {arg:?}; {}",
                        names_hint("devices", self.cfg.devices.iter().map(|d| &d.name))
                    )));
                }
                if let Some(other) = groups.iter().find(|x| x.devices.contains(&arg)) {
                    return Err(refused(format!(
                        "device {arg:?} is already in device group {:?}",
                        other.name
                    )));
                }
                groups[i].devices.push(arg.clone());
            }
            (AluaNode::DevicesMgmt(g), _) => {
                let i = dg_mut(&mut groups, g)?;
                if !groups[i].devices.contains(&arg) {
                    return Err(refused(format!(
                        "device {arg:?} is not in device group {g:?}; {}",
                        names_hint("devices", &groups[i].devices)
                    )));
                }
                groups[i].devices.retain(|d| d != &arg);
            }
            (AluaNode::TargetGroupsMgmt(g), "create") => {
                validate_object_name(&arg).map_err(|m| usage_err(m, usage))?;
                let i = dg_mut(&mut groups, g)?;
                let dg = &mut groups[i];
                if dg.target_group(&arg).is_some() {
                    return Err(refused(format!(
                        "target group {arg:?} already exists in {g:?}"
                    )));
                }
                let id = (1..=65535u32)
                    .find(|id| !dg.target_groups.iter().any(|t| t.group_id == *id))
                    .ok_or_else(|| refused("every group_id is taken".into()))?;
                dg.target_groups
                    .push(TargetGroupConfig::new(arg.clone(), id));
            }
            (AluaNode::TargetGroupsMgmt(g), _) => {
                let i = dg_mut(&mut groups, g)?;
                let dg = &mut groups[i];
                if dg.target_group(&arg).is_none() {
                    return Err(refused(format!(
                        "no target group {arg:?} in {g:?}; {}",
                        names_hint("target groups", dg.target_groups.iter().map(|t| &t.name))
                    )));
                }
                dg.target_groups.retain(|t| t.name != arg);
            }
            (AluaNode::TgMgmt(g, t), "add") => {
                let ports = self.cfg.rel_port_ids();
                if !ports.contains_key(arg.as_str()) {
                    return Err(refused(format!(
                        "no iSCSI target or SRP port {arg:?}; {}",
                        names_hint("targets", ports.keys())
                    )));
                }
                let i = dg_mut(&mut groups, g)?;
                let dg = &mut groups[i];
                if let Some(other) = dg.target_groups.iter().find(|x| x.targets.contains(&arg)) {
                    return Err(refused(format!(
                        "target {arg:?} is already in target group {:?}",
                        other.name
                    )));
                }
                let tg = dg
                    .target_groups
                    .iter_mut()
                    .find(|x| &x.name == t)
                    .ok_or_else(|| refused(format!("no target group {t:?} in {g:?}")))?;
                tg.targets.push(arg.clone());
            }
            (AluaNode::TgMgmt(g, t), _) => {
                let i = dg_mut(&mut groups, g)?;
                let tg = groups[i]
                    .target_groups
                    .iter_mut()
                    .find(|x| &x.name == t)
                    .ok_or_else(|| refused(format!("no target group {t:?} in {g:?}")))?;
                if !tg.targets.contains(&arg) {
                    return Err(refused(format!(
                        "target {arg:?} is not in target group {t:?}; {}",
                        names_hint("targets", &tg.targets)
                    )));
                }
                tg.targets.retain(|x| x != &arg);
            }
            _ => return Err(usage_err(format!("unknown command {verb:?}"), usage)),
        }
        Ok(Change::SetDeviceGroups {
            op: format!("do {prefix}/mgmt \"{verb} {arg}\""),
            groups,
        })
    }
}
