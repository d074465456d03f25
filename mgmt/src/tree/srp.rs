//! `/targets/srp`: SRP target ports, their attributes and `add_target`
//! and `del_target`.

use super::*;

/// Attributes of `/targets/srp/<port>`; `enabled` is writable, the others
/// are fixed when the port is added (`/targets/srp/mgmt`).
pub(super) const SRP_ATTRS: &[AttrDef] = &[
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
pub(super) const SRP_KEY: &str = "srp:";

/// The SRP port a per-target node name designates, if it is one.
pub(super) fn srp_port_of(target: &str) -> Option<&str> {
    target.strip_prefix(SRP_KEY)
}

/// Usage of `/targets/srp/mgmt`.
pub const SRP_TARGETS_USAGE: &str = "\
add_target NAME listen=PATH|ADDR:PORT [port_id=32HEX;] [credits=N]   (soft provider; created disabled)
add_target NAME provider=verbs listen=ADDR:PORT [device=HCA;] [hca_port=N;] [port_id=32HEX;] [credits=N]
del_target NAME";

impl Tree {
    /// A LUN map, group or initiator change of an SRP port (by
    /// [`SRP_KEY`]) as the port's new configuration; `None` for iSCSI.
    pub(super) fn srp_edit(
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
    pub(super) fn execute_srp(
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

    pub(super) fn srp_targets_cmd(&mut self, command: &str) -> Result<String, MgmtError> {
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
}

impl Tree {
    /// Reads attribute `a` of SRP port `t`.
    pub(super) fn get_srp_attr(&self, t: &str, a: &AttrDef) -> Result<AttrValue, MgmtError> {
        let cfg = &self.cfg;
        let t = cfg
            .targets
            .srp
            .iter()
            .find(|p| p.name == t)
            .ok_or_else(|| MgmtError::Refused(format!("no SRP port {t:?}")))?;
        let id: String = t
            .port_id_bytes()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        let (value, key) = match (a.name, &t.provider) {
            ("enabled", _) => (b01(t.enabled), !t.enabled),
            ("port_id", _) => (format!("0x{id}"), t.port_id.is_some()),
            ("provider", crate::config::SrpProviderConfig::Soft { .. }) => ("soft".into(), true),
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
        Ok(AttrValue {
            value,
            key,
            writable: a.name == "enabled",
            description: a.desc.into(),
        })
    }

    /// Writes `value` to the `enabled` attribute of SRP port `t` (at
    /// `path`).
    pub(super) fn set_srp_enabled(
        &mut self,
        t: &str,
        value: &str,
        path: &str,
    ) -> Result<String, MgmtError> {
        let bad = |msg: String| MgmtError::Refused(format!("{path}: {msg}"));
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
        self.execute_srp(t, Some(p), what)
    }
}
