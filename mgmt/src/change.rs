//! Changes to the configuration: the unit the tree executes, `diff` prints
//! and `apply` plans.
//!
//! Every management command becomes one [`Change`]. Executing a change
//! applies it to a copy of the model, validates the whole copy, asks the
//! [`Runtime`] to carry it out and only then adopts the copy, so a refused
//! change leaves the model as it was.
//!
//! [`plan`] turns the difference between two configurations into changes in
//! SCST's order: teardown first (targets, groups, unmapping, devices), then
//! objects, then attributes and LUNs, then enable.

use std::collections::BTreeSet;
use std::fmt;

use serde::Serialize;

use crate::config::{
    Config, DeviceConfig, DeviceGroupConfig, GroupConfig, Handler, IscsiParamsConfig,
    IscsiTargetConfig, LunConfig, ReactorConfig, SrpTargetConfig, data_memory_bytes,
};
use crate::runtime::{DeviceAttr, Runtime, RuntimeError, TargetAttr};
use crate::tree::{DEVICE_ATTRS, Write};

/// One change to the configuration and the running system.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "change", rename_all = "snake_case")]
pub enum Change {
    AddDevice(Box<DeviceConfig>),
    DelDevice {
        handler: Handler,
        name: String,
    },
    /// One attribute of a device; `new` is the device's whole new
    /// configuration, `attr` what the runtime changes.
    SetDevice {
        name: String,
        attr_name: String,
        attr: DeviceAttr,
        new: Box<DeviceConfig>,
    },
    ResyncSize {
        name: String,
    },
    /// A disabled target without LUNs or groups.
    AddTarget(Box<IscsiTargetConfig>),
    DelTarget {
        name: String,
    },
    SetTarget {
        name: String,
        attr: TargetAttr,
    },
    SetEnabled {
        name: String,
        enabled: bool,
    },
    AddGroup {
        target: String,
        group: String,
    },
    DelGroup {
        target: String,
        group: String,
    },
    SetInitiators {
        target: String,
        group: String,
        initiators: Vec<String>,
    },
    /// Moves a pattern between two groups of a target; the lists are the
    /// groups' whole new lists.
    MoveInitiator {
        target: String,
        pattern: String,
        from: String,
        from_list: Vec<String>,
        to: String,
        to_list: Vec<String>,
    },
    SetLunMap {
        target: String,
        group: Option<String>,
        luns: Vec<LunConfig>,
    },
    SetIscsiParams(IscsiParamsConfig),
    /// An SRP target port as a whole: added or replaced by `new`, removed
    /// when `new` is `None`.
    SetSrpTarget {
        name: String,
        new: Option<Box<SrpTargetConfig>>,
    },
    /// The data memory budget (`reactor.data_memory_mb`, MiB; `None`: the
    /// default from the machine's memory), changed in the running system
    /// at once.
    SetDataMemory {
        mb: Option<u64>,
    },
    /// The ALUA device groups as a whole (`device_groups`): `op` is the
    /// tree operation that asked for it. Target groups that stay keep
    /// their state and preferred bit (the running system's); see
    /// [`Change::SetAluaState`].
    SetDeviceGroups {
        op: String,
        groups: Vec<DeviceGroupConfig>,
    },
    /// One target group's access state and preferred bit, changed in the
    /// running system at once (an implicit ALUA transition).
    SetAluaState {
        group: String,
        target_group: String,
        state: String,
        preferred: bool,
    },
    /// The other reactor settings, which take effect at the next start: only
    /// the model changes. `data_memory_mb` is not taken from it (that is
    /// [`Change::SetDataMemory`]).
    SetReactor(ReactorConfig),
}

/// Why a change could not be applied to the model.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ModelError(pub String);

fn target_mut<'a>(
    cfg: &'a mut Config,
    name: &str,
) -> Result<&'a mut IscsiTargetConfig, ModelError> {
    cfg.targets
        .iscsi
        .iter_mut()
        .find(|t| t.name == name)
        .ok_or_else(|| ModelError(format!("no target {name:?}")))
}

fn group_mut<'a>(
    t: &'a mut IscsiTargetConfig,
    name: &str,
) -> Result<&'a mut GroupConfig, ModelError> {
    let tn = t.name.clone();
    t.ini_groups
        .iter_mut()
        .find(|g| g.name == name)
        .ok_or_else(|| ModelError(format!("target {tn:?} has no group {name:?}")))
}

fn sorted(luns: &[LunConfig]) -> Vec<LunConfig> {
    let mut v = luns.to_vec();
    v.sort();
    v
}

fn fmt_map(luns: &[LunConfig]) -> String {
    if luns.is_empty() {
        return "(empty)".into();
    }
    sorted(luns)
        .iter()
        .map(|l| {
            if l.read_only {
                format!("{}={}(read_only)", l.lun, l.device)
            } else {
                format!("{}={}", l.lun, l.device)
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// `add_device` parameters that reproduce `d` (SCST syntax).
pub fn device_params(d: &DeviceConfig) -> String {
    DEVICE_ATTRS
        .iter()
        .filter_map(|a| (a.saved)(d).map(|v| format!("{}={v}", a.name)))
        .collect::<Vec<_>>()
        .join("; ")
}

fn lun_prefix(target: &str, group: &Option<String>) -> String {
    match group {
        None => format!("/targets/iscsi/{target}/luns"),
        Some(g) => format!("/targets/iscsi/{target}/ini_groups/{g}/luns"),
    }
}

impl fmt::Display for Change {
    /// The change as the tree operation that makes it.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Change::AddDevice(d) => write!(
                f,
                "do /handlers/{}/mgmt \"{}\"",
                d.handler,
                with_params(&format!("add_device {}", d.name), &device_params(d))
            ),
            Change::DelDevice { handler, name } => {
                write!(f, "do /handlers/{handler}/mgmt \"del_device {name}\"")
            }
            Change::SetDevice {
                name,
                attr_name,
                new,
                ..
            } => {
                let v = crate::tree::device_attr_value(new, attr_name, None).unwrap_or_default();
                write!(f, "set /devices/{name}/{attr_name} {v:?}")
            }
            Change::ResyncSize { name } => write!(f, "set /devices/{name}/resync_size 1"),
            Change::AddTarget(t) => {
                write!(
                    f,
                    "do /targets/iscsi/mgmt \"{}\"",
                    with_params(&format!("add_target {}", t.name), &target_params(t))
                )?;
                if !t.incoming_users.is_empty() || t.outgoing_user.is_some() {
                    write!(f, " (with its CHAP users)")?;
                }
                Ok(())
            }
            Change::DelTarget { name } => write!(f, "do /targets/iscsi/mgmt \"del_target {name}\""),
            Change::SetTarget { name, attr } => match attr {
                TargetAttr::Portals(p) => {
                    write!(f, "set /targets/iscsi/{name}/portals {:?}", p.join(" "))
                }
                TargetAttr::Tpgt(n) => write!(f, "set /targets/iscsi/{name}/tpgt {n}"),
                TargetAttr::IncomingUsers(u) => write!(
                    f,
                    "CHAP users of /targets/iscsi/{name}: {}",
                    if u.is_empty() {
                        "(none)".to_string()
                    } else {
                        u.iter()
                            .map(|u| u.user.as_str())
                            .collect::<Vec<_>>()
                            .join(" ")
                    }
                ),
                TargetAttr::OutgoingUser(u) => write!(
                    f,
                    "mutual CHAP user of /targets/iscsi/{name}: {}",
                    u.as_ref().map_or("(none)", |u| u.user.as_str())
                ),
                TargetAttr::Alias(a) => write!(
                    f,
                    "set /targets/iscsi/{name}/alias {:?}",
                    a.as_deref().unwrap_or("")
                ),
            },
            Change::SetEnabled { name, enabled } => {
                write!(
                    f,
                    "set /targets/iscsi/{name}/enabled {}",
                    u8::from(*enabled)
                )
            }
            Change::AddGroup { target, group } => {
                write!(
                    f,
                    "do /targets/iscsi/{target}/ini_groups/mgmt \"create {group}\""
                )
            }
            Change::DelGroup { target, group } => {
                write!(
                    f,
                    "do /targets/iscsi/{target}/ini_groups/mgmt \"del {group}\""
                )
            }
            Change::SetInitiators {
                target,
                group,
                initiators,
            } => write!(
                f,
                "initiators of /targets/iscsi/{target}/ini_groups/{group}: {}",
                if initiators.is_empty() {
                    "(none)".to_string()
                } else {
                    initiators.join(" ")
                }
            ),
            Change::MoveInitiator {
                target,
                pattern,
                from,
                to,
                ..
            } => write!(
                f,
                "do /targets/iscsi/{target}/ini_groups/{from}/initiators/mgmt \"move {pattern} {to}\""
            ),
            Change::SetLunMap {
                target,
                group,
                luns,
            } => write!(f, "map of {}: {}", lun_prefix(target, group), fmt_map(luns)),
            Change::SetIscsiParams(p) => {
                // Secrets stay out of listings and logs.
                let mut shown = p.clone();
                for u in shown
                    .discovery_incoming_users
                    .iter_mut()
                    .chain(shown.discovery_outgoing_user.iter_mut())
                {
                    u.secret = "***".into();
                }
                write!(
                    f,
                    "iSCSI parameters: {}",
                    serde_json::to_string(&shown).unwrap_or_default()
                )
            }
            Change::SetSrpTarget { name, new: None } => {
                write!(f, "do /targets/srp/mgmt \"del_target {name}\"")
            }
            Change::SetSrpTarget { name, new: Some(t) } => write!(
                f,
                "SRP port /targets/srp/{name}: {}",
                serde_json::to_string(t).unwrap_or_default()
            ),
            Change::SetDataMemory { mb: Some(mb) } => write!(f, "set /data_memory_mb {mb}"),
            Change::SetDataMemory { mb: None } => {
                write!(f, "set /data_memory_mb \"\" (the default)")
            }
            Change::SetDeviceGroups { op, .. } => f.write_str(op),
            Change::SetAluaState {
                group,
                target_group,
                state,
                preferred,
            } => write!(
                f,
                "set /device_groups/{group}/target_groups/{target_group}/state {state} (preferred {})",
                u8::from(*preferred)
            ),
            Change::SetReactor(r) => write!(
                f,
                "reactor (at next start): {}",
                serde_json::to_string(r).unwrap_or_default()
            ),
        }
    }
}

fn with_params(cmd: &str, params: &str) -> String {
    if params.is_empty() {
        cmd.to_string()
    } else {
        format!("{cmd} {params}")
    }
}

/// `add_target` parameters that reproduce `t`'s attributes.
pub fn target_params(t: &IscsiTargetConfig) -> String {
    let mut p = Vec::new();
    if !t.portals.is_empty() {
        p.push(format!("portals={}", t.portals.join(",")));
    }
    if t.tpgt != 1 {
        p.push(format!("tpgt={}", t.tpgt));
    }
    if let Some(a) = &t.alias {
        p.push(format!("alias={a}"));
    }
    p.join("; ")
}

impl Change {
    /// Applies the change to a model. Errors name what does not exist.
    pub fn apply_to(&self, cfg: &mut Config) -> Result<(), ModelError> {
        match self {
            Change::AddDevice(d) => {
                if cfg.device(&d.name).is_some() {
                    return Err(ModelError(format!("device {:?} already exists", d.name)));
                }
                cfg.devices.push((**d).clone());
            }
            Change::DelDevice { name, .. } => {
                let before = cfg.devices.len();
                cfg.devices.retain(|d| &d.name != name);
                if cfg.devices.len() == before {
                    return Err(ModelError(format!("no device {name:?}")));
                }
            }
            Change::SetDevice { name, new, .. } => {
                let d = cfg
                    .devices
                    .iter_mut()
                    .find(|d| &d.name == name)
                    .ok_or_else(|| ModelError(format!("no device {name:?}")))?;
                *d = (**new).clone();
            }
            Change::ResyncSize { name } => {
                if cfg.device(name).is_none() {
                    return Err(ModelError(format!("no device {name:?}")));
                }
            }
            Change::AddTarget(t) => {
                if cfg.iscsi_target(&t.name).is_some() {
                    return Err(ModelError(format!("target {:?} already exists", t.name)));
                }
                let mut t = (**t).clone();
                t.enabled = false;
                t.luns.clear();
                t.ini_groups.clear();
                cfg.targets.iscsi.push(t);
            }
            Change::DelTarget { name } => {
                let before = cfg.targets.iscsi.len();
                cfg.targets.iscsi.retain(|t| &t.name != name);
                if cfg.targets.iscsi.len() == before {
                    return Err(ModelError(format!("no target {name:?}")));
                }
            }
            Change::SetTarget { name, attr } => {
                let t = target_mut(cfg, name)?;
                match attr {
                    TargetAttr::Portals(p) => t.portals = p.clone(),
                    TargetAttr::Tpgt(n) => t.tpgt = *n,
                    TargetAttr::Alias(a) => t.alias = a.clone(),
                    TargetAttr::IncomingUsers(u) => t.incoming_users = u.clone(),
                    TargetAttr::OutgoingUser(u) => t.outgoing_user = u.clone(),
                }
            }
            Change::SetEnabled { name, enabled } => target_mut(cfg, name)?.enabled = *enabled,
            Change::AddGroup { target, group } => {
                let t = target_mut(cfg, target)?;
                if t.ini_groups.iter().any(|g| &g.name == group) {
                    return Err(ModelError(format!(
                        "target {target:?} already has group {group:?}"
                    )));
                }
                t.ini_groups.push(GroupConfig {
                    name: group.clone(),
                    initiators: Vec::new(),
                    luns: Vec::new(),
                });
            }
            Change::DelGroup { target, group } => {
                let t = target_mut(cfg, target)?;
                group_mut(t, group)?;
                t.ini_groups.retain(|g| &g.name != group);
            }
            Change::SetInitiators {
                target,
                group,
                initiators,
            } => group_mut(target_mut(cfg, target)?, group)?.initiators = initiators.clone(),
            Change::MoveInitiator {
                target,
                from,
                from_list,
                to,
                to_list,
                ..
            } => {
                let t = target_mut(cfg, target)?;
                group_mut(t, to)?;
                group_mut(t, from)?.initiators = from_list.clone();
                group_mut(t, to)?.initiators = to_list.clone();
            }
            Change::SetLunMap {
                target,
                group,
                luns,
            } => {
                let t = target_mut(cfg, target)?;
                match group {
                    None => t.luns = luns.clone(),
                    Some(g) => group_mut(t, g)?.luns = luns.clone(),
                }
            }
            Change::SetIscsiParams(p) => cfg.iscsi = p.clone(),
            Change::SetSrpTarget { name, new } => {
                let at = cfg.targets.srp.iter().position(|t| &t.name == name);
                match (at, new) {
                    (Some(i), Some(t)) => cfg.targets.srp[i] = (**t).clone(),
                    (None, Some(t)) => cfg.targets.srp.push((**t).clone()),
                    (Some(i), None) => {
                        cfg.targets.srp.remove(i);
                    }
                    (None, None) => return Err(ModelError(format!("no SRP port {name:?}"))),
                }
            }
            Change::SetDataMemory { mb } => cfg.reactor.data_memory_mb = *mb,
            Change::SetDeviceGroups { groups, .. } => {
                cfg.device_groups = carry_alua_states(&cfg.device_groups, groups);
            }
            Change::SetAluaState {
                group,
                target_group,
                state,
                preferred,
            } => {
                let tg = cfg
                    .device_groups
                    .iter_mut()
                    .find(|g| &g.name == group)
                    .ok_or_else(|| ModelError(format!("no device group {group:?}")))?
                    .target_groups
                    .iter_mut()
                    .find(|t| &t.name == target_group)
                    .ok_or_else(|| {
                        ModelError(format!(
                            "device group {group:?} has no target group {target_group:?}"
                        ))
                    })?;
                tg.state = state.clone();
                tg.preferred = *preferred;
            }
            Change::SetReactor(r) => {
                cfg.reactor = ReactorConfig {
                    data_memory_mb: cfg.reactor.data_memory_mb,
                    ..r.clone()
                }
            }
        }
        Ok(())
    }

    /// Carries the change out on the running system. Returns a size for
    /// [`Change::ResyncSize`].
    pub fn run(&self, rt: &dyn Runtime) -> Result<Option<u64>, RuntimeError> {
        match self {
            Change::AddDevice(d) => rt.add_device(d)?,
            Change::DelDevice { name, .. } => rt.del_device(name)?,
            Change::SetDevice { name, attr, .. } => rt.set_device_attr(name, attr)?,
            Change::ResyncSize { name } => return rt.resync_size(name).map(Some),
            Change::AddTarget(t) => rt.add_target(t)?,
            Change::DelTarget { name } => rt.del_target(name)?,
            Change::SetTarget { name, attr } => rt.set_target_attr(name, attr)?,
            Change::SetEnabled { name, enabled } => rt.set_target_enabled(name, *enabled)?,
            Change::AddGroup { target, group } => rt.add_group(target, group)?,
            Change::DelGroup { target, group } => rt.del_group(target, group)?,
            Change::SetInitiators {
                target,
                group,
                initiators,
            } => rt.set_group_initiators(target, group, initiators)?,
            Change::MoveInitiator {
                target,
                from,
                from_list,
                to,
                to_list,
                ..
            } => {
                rt.set_group_initiators(target, from, from_list)?;
                rt.set_group_initiators(target, to, to_list)?;
            }
            Change::SetLunMap {
                target,
                group,
                luns,
            } => rt.set_lun_map(target, group.as_deref(), luns)?,
            Change::SetIscsiParams(p) => rt.set_iscsi_params(p)?,
            Change::SetSrpTarget { name, new } => rt.set_srp_target(name, new.as_deref())?,
            Change::SetDataMemory { mb } => rt.set_data_memory(data_memory_bytes(*mb))?,
            Change::SetDeviceGroups { groups, .. } => rt.set_device_groups(groups)?,
            Change::SetAluaState {
                group,
                target_group,
                state,
                preferred,
            } => {
                let st = ferrite_core::alua::AccessState::parse(state).ok_or_else(|| {
                    RuntimeError::Failed(format!("{state:?} is not an access state"))
                })?;
                rt.set_alua_state(group, target_group, st, *preferred)?
            }
            Change::SetReactor(_) => {}
        }
        Ok(None)
    }
}

/// `groups` with the state and preferred bit of every target group that
/// `old` has too (same device group and name): what the running system
/// does with them.
pub fn carry_alua_states(
    old: &[DeviceGroupConfig],
    groups: &[DeviceGroupConfig],
) -> Vec<DeviceGroupConfig> {
    let mut out = groups.to_vec();
    for g in &mut out {
        let Some(og) = old.iter().find(|o| o.name == g.name) else {
            continue;
        };
        for t in &mut g.target_groups {
            if let Some(ot) = og.target_group(&t.name) {
                t.state = ot.state.clone();
                t.preferred = ot.preferred;
            }
        }
    }
    out
}

/// `groups` without the devices and targets `keep` rejects, and without
/// the device groups and target groups absent from `new`: what can stay
/// while objects go.
fn prune_device_groups(
    groups: &[DeviceGroupConfig],
    new: &[DeviceGroupConfig],
    keep_device: impl Fn(&str) -> bool,
    keep_target: impl Fn(&str) -> bool,
) -> Vec<DeviceGroupConfig> {
    let mut out = Vec::new();
    for g in groups {
        let Some(ng) = new.iter().find(|n| n.name == g.name) else {
            continue;
        };
        let mut g = g.clone();
        g.devices
            .retain(|d| keep_device(d) && ng.devices.contains(d));
        g.target_groups.retain(|t| {
            ng.target_group(&t.name)
                .is_some_and(|nt| nt.group_id == t.group_id)
        });
        for t in &mut g.target_groups {
            let nt = ng.target_group(&t.name).map(|n| n.targets.clone());
            t.targets
                .retain(|x| keep_target(x) && nt.as_ref().is_some_and(|n| n.contains(x)));
        }
        out.push(g);
    }
    out
}

/// Whether going from `old` to `new` needs the device closed and opened
/// again: its handler or an attribute fixed when the device is created
/// (`Write::No` in the device attribute table: backing file, block size,
/// mem mode, thin provisioning (which changes the backend's capabilities),
/// removable medium (which the core fixes when it opens the device)) differ.
pub fn needs_recreate(old: &DeviceConfig, new: &DeviceConfig) -> bool {
    old.handler != new.handler
        || DEVICE_ATTRS
            .iter()
            .any(|a| matches!(a.write, Write::No(_)) && (a.saved)(old) != (a.saved)(new))
}

/// The runtime-changeable attribute differences between two versions of a
/// device, as changes (each carrying the device as it is after it).
pub fn device_attr_changes(old: &DeviceConfig, new: &DeviceConfig) -> Vec<Change> {
    let mut out = Vec::new();
    let mut cur = old.clone();
    for a in DEVICE_ATTRS {
        let Write::Live(l) = &a.write else { continue };
        if (a.saved)(old) != (a.saved)(new)
            && let Some(attr) = (l.change)(new)
        {
            (l.copy)(&mut cur, new);
            out.push(Change::SetDevice {
                name: new.name.clone(),
                attr_name: a.name.into(),
                attr,
                new: Box::new(cur.clone()),
            });
        }
    }
    out
}

/// The changes that turn `old` into `new`, in SCST's order. `new` must be
/// valid. Executing them in order on a system configured as `old` gives one
/// configured as `new`; when the two are equal (up to the order of objects
/// and of LUN entries) the plan is empty.
pub fn plan(old: &Config, new: &Config) -> Result<Vec<Change>, ModelError> {
    let mut sim = old.clone();
    let mut out = Vec::new();
    let mut step = |sim: &mut Config, c: Change| -> Result<(), ModelError> {
        c.apply_to(sim)?;
        out.push(c);
        Ok(())
    };

    // 0. ALUA device groups let go of what goes (devices closed, targets
    // and SRP ports removed, groups and target groups that go) before it
    // goes; they get their new shape once everything exists (below).
    let closing = |d: &str| {
        old.device(d)
            .is_some_and(|od| new.device(d).is_none_or(|n| needs_recreate(od, n)))
    };
    let srp_removed = |t: &str| {
        old.targets.srp.iter().any(|o| {
            o.name == t
                && (!new.targets.srp.iter().any(|n| n.name == t)
                    || o.luns
                        .iter()
                        .chain(o.ini_groups.iter().flat_map(|g| g.luns.iter()))
                        .any(|l| closing(&l.device)))
        })
    };
    let target_kept = |t: &str| {
        (new.iscsi_target(t).is_some() || new.targets.srp.iter().any(|n| n.name == t))
            && !srp_removed(t)
    };
    let pruned = prune_device_groups(
        &old.device_groups,
        &new.device_groups,
        |d| new.device(d).is_some() && !closing(d),
        target_kept,
    );
    if pruned != old.device_groups {
        step(
            &mut sim,
            Change::SetDeviceGroups {
                op: "device groups: let go of what goes".into(),
                groups: pruned,
            },
        )?;
    }

    // 1. Teardown: targets that go, targets that get disabled.
    for t in &old.targets.iscsi {
        match new.iscsi_target(&t.name) {
            None => step(
                &mut sim,
                Change::DelTarget {
                    name: t.name.clone(),
                },
            )?,
            Some(n) if t.enabled && !n.enabled => step(
                &mut sim,
                Change::SetEnabled {
                    name: t.name.clone(),
                    enabled: false,
                },
            )?,
            Some(_) => {}
        }
    }
    let doomed: BTreeSet<String> = old
        .devices
        .iter()
        .filter(|d| new.device(&d.name).is_none_or(|n| needs_recreate(d, n)))
        .map(|d| d.name.clone())
        .collect();
    let targets: Vec<IscsiTargetConfig> = sim.targets.iscsi.clone();
    for t in &targets {
        let nt = new.iscsi_target(&t.name);
        for g in &t.ini_groups {
            if nt.is_none_or(|nt| !nt.ini_groups.iter().any(|ng| ng.name == g.name)) {
                step(
                    &mut sim,
                    Change::DelGroup {
                        target: t.name.clone(),
                        group: g.name.clone(),
                    },
                )?;
            } else if g.luns.iter().any(|l| doomed.contains(&l.device)) {
                step(
                    &mut sim,
                    Change::SetLunMap {
                        target: t.name.clone(),
                        group: Some(g.name.clone()),
                        luns: g
                            .luns
                            .iter()
                            .filter(|l| !doomed.contains(&l.device))
                            .cloned()
                            .collect(),
                    },
                )?;
            }
        }
        if t.luns.iter().any(|l| doomed.contains(&l.device)) {
            step(
                &mut sim,
                Change::SetLunMap {
                    target: t.name.clone(),
                    group: None,
                    luns: t
                        .luns
                        .iter()
                        .filter(|l| !doomed.contains(&l.device))
                        .cloned()
                        .collect(),
                },
            )?;
        }
    }
    // SRP ports that go, or that map a device about to be closed: removed
    // now (and added back below, after the devices exist again).
    for t in &old.targets.srp {
        let uses_doomed = t
            .luns
            .iter()
            .chain(t.ini_groups.iter().flat_map(|g| g.luns.iter()))
            .any(|l| doomed.contains(&l.device));
        let kept = new.targets.srp.iter().find(|n| n.name == t.name);
        if kept.is_none() || uses_doomed {
            step(
                &mut sim,
                Change::SetSrpTarget {
                    name: t.name.clone(),
                    new: None,
                },
            )?;
        }
    }
    for d in &old.devices {
        if doomed.contains(&d.name) {
            step(
                &mut sim,
                Change::DelDevice {
                    handler: d.handler,
                    name: d.name.clone(),
                },
            )?;
        }
    }

    // 2. Objects: devices, targets, groups.
    for d in &new.devices {
        if sim.device(&d.name).is_none() {
            step(&mut sim, Change::AddDevice(Box::new(d.clone())))?;
        }
    }
    for t in &new.targets.iscsi {
        if sim.iscsi_target(&t.name).is_none() {
            let mut bare = t.clone();
            bare.enabled = false;
            bare.luns.clear();
            bare.ini_groups.clear();
            step(&mut sim, Change::AddTarget(Box::new(bare)))?;
        }
        for g in &t.ini_groups {
            let exists = sim
                .iscsi_target(&t.name)
                .is_some_and(|st| st.ini_groups.iter().any(|sg| sg.name == g.name));
            if !exists {
                step(
                    &mut sim,
                    Change::AddGroup {
                        target: t.name.clone(),
                        group: g.name.clone(),
                    },
                )?;
            }
        }
    }

    // 3. Attributes and LUNs.
    for d in &new.devices {
        if let Some(cur) = sim.device(&d.name).cloned() {
            for c in device_attr_changes(&cur, d) {
                step(&mut sim, c)?;
            }
        }
    }
    for t in &new.targets.iscsi {
        let Some(cur) = sim.iscsi_target(&t.name).cloned() else {
            continue;
        };
        if cur.portals != t.portals {
            step(
                &mut sim,
                Change::SetTarget {
                    name: t.name.clone(),
                    attr: TargetAttr::Portals(t.portals.clone()),
                },
            )?;
        }
        if cur.tpgt != t.tpgt {
            step(
                &mut sim,
                Change::SetTarget {
                    name: t.name.clone(),
                    attr: TargetAttr::Tpgt(t.tpgt),
                },
            )?;
        }
        if cur.alias != t.alias {
            step(
                &mut sim,
                Change::SetTarget {
                    name: t.name.clone(),
                    attr: TargetAttr::Alias(t.alias.clone()),
                },
            )?;
        }
        // The outgoing user first when both change: a new incoming list
        // may take the old outgoing secret.
        if cur.outgoing_user != t.outgoing_user {
            step(
                &mut sim,
                Change::SetTarget {
                    name: t.name.clone(),
                    attr: TargetAttr::OutgoingUser(None),
                },
            )?;
        }
        if cur.incoming_users != t.incoming_users {
            step(
                &mut sim,
                Change::SetTarget {
                    name: t.name.clone(),
                    attr: TargetAttr::IncomingUsers(t.incoming_users.clone()),
                },
            )?;
        }
        if t.outgoing_user.is_some() && cur.outgoing_user != t.outgoing_user {
            step(
                &mut sim,
                Change::SetTarget {
                    name: t.name.clone(),
                    attr: TargetAttr::OutgoingUser(t.outgoing_user.clone()),
                },
            )?;
        }
    }
    if sim.iscsi != new.iscsi {
        step(&mut sim, Change::SetIscsiParams(new.iscsi.clone()))?;
    }
    if sim.reactor.data_memory_mb != new.reactor.data_memory_mb {
        step(
            &mut sim,
            Change::SetDataMemory {
                mb: new.reactor.data_memory_mb,
            },
        )?;
    }
    if sim.reactor != new.reactor {
        step(&mut sim, Change::SetReactor(new.reactor.clone()))?;
    }
    // Initiators: removals first so a pattern moving between groups is
    // never in two groups at once.
    for pass in 0..2 {
        for t in &new.targets.iscsi {
            for g in &t.ini_groups {
                let cur: Vec<String> = sim
                    .iscsi_target(&t.name)
                    .and_then(|st| st.ini_groups.iter().find(|sg| sg.name == g.name))
                    .map(|sg| sg.initiators.clone())
                    .unwrap_or_default();
                let want: Vec<String> = if pass == 0 {
                    cur.iter()
                        .filter(|p| g.initiators.contains(p))
                        .cloned()
                        .collect()
                } else {
                    g.initiators.clone()
                };
                if cur != want {
                    step(
                        &mut sim,
                        Change::SetInitiators {
                            target: t.name.clone(),
                            group: g.name.clone(),
                            initiators: want,
                        },
                    )?;
                }
            }
        }
    }
    for t in &new.targets.iscsi {
        let Some(cur) = sim.iscsi_target(&t.name).cloned() else {
            continue;
        };
        if sorted(&cur.luns) != sorted(&t.luns) {
            step(
                &mut sim,
                Change::SetLunMap {
                    target: t.name.clone(),
                    group: None,
                    luns: t.luns.clone(),
                },
            )?;
        }
        for g in &t.ini_groups {
            let cur_luns = cur
                .ini_groups
                .iter()
                .find(|cg| cg.name == g.name)
                .map(|cg| sorted(&cg.luns))
                .unwrap_or_default();
            if cur_luns != sorted(&g.luns) {
                step(
                    &mut sim,
                    Change::SetLunMap {
                        target: t.name.clone(),
                        group: Some(g.name.clone()),
                        luns: g.luns.clone(),
                    },
                )?;
            }
        }
    }

    // SRP ports: added or replaced whole, now that their devices exist.
    for t in &new.targets.srp {
        if sim.targets.srp.iter().find(|c| c.name == t.name) != Some(t) {
            step(
                &mut sim,
                Change::SetSrpTarget {
                    name: t.name.clone(),
                    new: Some(Box::new(t.clone())),
                },
            )?;
        }
    }

    // ALUA device groups, now that their devices and targets exist; then
    // the states that differ (target groups that stayed kept theirs).
    if sim.device_groups != new.device_groups {
        let groups = carry_alua_states(&sim.device_groups, &new.device_groups);
        if groups != sim.device_groups {
            step(
                &mut sim,
                Change::SetDeviceGroups {
                    op: format!(
                        "device groups: {}",
                        new.device_groups
                            .iter()
                            .map(|g| g.name.as_str())
                            .collect::<Vec<_>>()
                            .join(" ")
                    ),
                    groups: new.device_groups.clone(),
                },
            )?;
        }
        for g in &new.device_groups {
            for t in &g.target_groups {
                let cur = sim
                    .device_group(&g.name)
                    .and_then(|sg| sg.target_group(&t.name))
                    .map(|st| (st.access_state(), st.preferred));
                if cur != Some((t.access_state(), t.preferred)) {
                    step(
                        &mut sim,
                        Change::SetAluaState {
                            group: g.name.clone(),
                            target_group: t.name.clone(),
                            state: t.access_state().name().into(),
                            preferred: t.preferred,
                        },
                    )?;
                }
            }
        }
    }

    // 4. Enable.
    for t in &new.targets.iscsi {
        if t.enabled && sim.iscsi_target(&t.name).is_some_and(|st| !st.enabled) {
            step(
                &mut sim,
                Change::SetEnabled {
                    name: t.name.clone(),
                    enabled: true,
                },
            )?;
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Handler;

    #[test]
    fn removable_needs_the_device_opened_again_and_is_reproduced() {
        let old = DeviceConfig::new("d", Handler::VdiskFileio);
        let mut new = old.clone();
        assert!(!needs_recreate(&old, &new));
        new.removable = true;
        assert!(needs_recreate(&old, &new));
        assert!(device_params(&new).contains("removable=1"));
        assert!(!device_params(&old).contains("removable"));
    }

    fn srp_port(name: &str, dev: &str) -> SrpTargetConfig {
        let mut t = SrpTargetConfig::soft(name, format!("/tmp/{name}.sock"));
        t.luns.push(LunConfig {
            lun: 0,
            device: dev.into(),
            read_only: false,
        });
        t
    }

    fn with(devs: &[DeviceConfig], ports: &[SrpTargetConfig]) -> Config {
        let mut c = Config {
            devices: devs.to_vec(),
            ..Config::default()
        };
        c.targets.srp = ports.to_vec();
        c
    }

    #[test]
    fn srp_ports_are_added_changed_and_removed_around_their_devices() {
        let d = DeviceConfig::new("d", Handler::VdiskFileio);
        let empty = with(std::slice::from_ref(&d), &[]);
        let one = with(std::slice::from_ref(&d), &[srp_port("p", "d")]);
        // Added after its device exists; removed as a whole.
        let add = plan(&empty, &one).unwrap();
        assert!(matches!(
            &add[..],
            [Change::SetSrpTarget { new: Some(_), .. }]
        ));
        let del = plan(&one, &empty).unwrap();
        assert_eq!(
            del,
            vec![Change::SetSrpTarget {
                name: "p".into(),
                new: None
            }]
        );
        // A changed port is replaced in place.
        let mut other = srp_port("p", "d");
        other.credits = 16;
        let set = plan(&one, &with(std::slice::from_ref(&d), &[other.clone()])).unwrap();
        assert_eq!(
            set,
            vec![Change::SetSrpTarget {
                name: "p".into(),
                new: Some(Box::new(other))
            }]
        );
        // Its device is opened again: the port goes first and comes back
        // after the device.
        let mut d2 = d.clone();
        d2.removable = true;
        let re = plan(&one, &with(&[d2], &[srp_port("p", "d")])).unwrap();
        let kinds: Vec<&str> = re
            .iter()
            .map(|c| match c {
                Change::SetSrpTarget { new: None, .. } => "del port",
                Change::DelDevice { .. } => "del device",
                Change::AddDevice(_) => "add device",
                Change::SetSrpTarget { new: Some(_), .. } => "add port",
                _ => "other",
            })
            .collect();
        assert_eq!(kinds, ["del port", "del device", "add device", "add port"]);
        // The model follows.
        let mut m = one.clone();
        for c in &del {
            c.apply_to(&mut m).unwrap();
        }
        assert!(m.targets.srp.is_empty());
    }
}
