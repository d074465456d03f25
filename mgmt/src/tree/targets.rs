//! `/targets/iscsi`: the iSCSI parameters, targets and their attributes,
//! CHAP users, and the LUN maps, initiator groups and initiator patterns
//! that iSCSI targets and SRP ports share.

use super::*;

/// One attribute of `/targets/iscsi/<iqn>`.
pub(super) struct TargetAttrDef {
    pub name: &'static str,
    pub desc: &'static str,
    /// The value, and whether a saved configuration carries it (it differs
    /// from the default).
    pub read: fn(&IscsiTargetConfig) -> (String, bool),
    /// The change `set` makes of a value for the named target (an error
    /// says what is wrong with the value); `Err`: changed by commands, not
    /// by `set`, and what `set` says.
    pub write: Result<SetTarget, &'static str>,
}

/// Parses a value written to a target attribute into its change.
pub(super) type SetTarget = fn(String, &str) -> Result<Change, String>;

impl PartialEq for TargetAttrDef {
    fn eq(&self, o: &TargetAttrDef) -> bool {
        self.name == o.name
    }
}
impl Eq for TargetAttrDef {}
impl std::fmt::Debug for TargetAttrDef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name)
    }
}

const BY_CHAP_COMMANDS: &str = "changed by commands: do /targets/iscsi/mgmt \"add_target_attribute IQN IncomingUser USER SECRET\"";

/// The attributes of an iSCSI target, in the order `ls` lists them.
pub(super) static TARGET_ATTRS: &[TargetAttrDef] = &[
    TargetAttrDef {
        name: "enabled",
        desc: "0|1: accept new sessions",
        read: |t| (b01(t.enabled), !t.enabled),
        write: Ok(|name, v| {
            Ok(Change::SetEnabled {
                name,
                enabled: parse_bool(v)?,
            })
        }),
    },
    TargetAttrDef {
        name: "portals",
        desc: "listening addresses, space separated (\"192.0.2.1:3260 [::1]:3260\")",
        read: |t| (t.portals.join(" "), !t.portals.is_empty()),
        write: Ok(|name, v| {
            Ok(Change::SetTarget {
                name,
                attr: TargetAttr::Portals(
                    v.split(|c: char| c == ',' || c.is_whitespace())
                        .filter(|s| !s.is_empty())
                        .map(str::to_string)
                        .collect(),
                ),
            })
        }),
    },
    TargetAttrDef {
        name: "tpgt",
        desc: "target portal group tag",
        read: |t| (t.tpgt.to_string(), t.tpgt != 1),
        write: Ok(|name, v| {
            Ok(Change::SetTarget {
                name,
                attr: TargetAttr::Tpgt(
                    v.parse()
                        .map_err(|_| format!("{v:?} is not a tag; valid: 0..65535"))?,
                ),
            })
        }),
    },
    TargetAttrDef {
        name: "alias",
        desc: "TargetAlias sent at login; empty for none",
        read: |t| (t.alias.clone().unwrap_or_default(), t.alias.is_some()),
        write: Ok(|name, v| {
            Ok(Change::SetTarget {
                name,
                attr: TargetAttr::Alias((!v.is_empty()).then(|| v.to_string())),
            })
        }),
    },
    TargetAttrDef {
        name: "incoming_users",
        desc: "CHAP users initiators log in as (read-only; IncomingUser commands in /targets/iscsi/mgmt)",
        read: |t| (chap_names(&t.incoming_users), !t.incoming_users.is_empty()),
        write: Err(BY_CHAP_COMMANDS),
    },
    TargetAttrDef {
        name: "outgoing_user",
        desc: "mutual CHAP user of the target (read-only; OutgoingUser commands in /targets/iscsi/mgmt)",
        read: |t| {
            (
                t.outgoing_user
                    .as_ref()
                    .map(|u| u.user.clone())
                    .unwrap_or_default(),
                t.outgoing_user.is_some(),
            )
        },
        write: Err(BY_CHAP_COMMANDS),
    },
];

/// Discovery attributes changed by commands, not by `set`.
pub(super) fn read_only_attr(name: &str) -> bool {
    matches!(name, "discovery_incoming_users" | "discovery_outgoing_user")
}

pub(super) fn chap_names(users: &[ChapUser]) -> String {
    users
        .iter()
        .map(|u| u.user.as_str())
        .collect::<Vec<_>>()
        .join("\n")
}

pub(super) const LUN_ATTRS: &[AttrDef] = &[
    AttrDef {
        name: "device",
        desc: "the mapped device (read-only; use replace)",
    },
    AttrDef {
        name: "read_only",
        desc: "0|1: read-only through this map (read-only; use replace)",
    },
];

pub(super) const ISCSI_PARAMS: &[AttrDef] = &[
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

/// Usage of `/targets/iscsi/mgmt`.
pub const TARGETS_USAGE: &str = "\
add_target IQN [portals=ADDR:PORT[,ADDR:PORT...];] [tpgt=N;] [alias=TEXT]   (created disabled)
del_target IQN
add_target_attribute IQN IncomingUser USER SECRET    (CHAP; SECRET 12 to 255 bytes)
add_target_attribute IQN OutgoingUser USER SECRET    (mutual CHAP)
del_target_attribute IQN IncomingUser|OutgoingUser USER
add_attribute IncomingUser|OutgoingUser USER SECRET  (discovery sessions)
del_attribute IncomingUser|OutgoingUser USER";

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

impl Tree {
    pub(super) fn map(&self, target: &str, group: Option<&str>) -> Option<Vec<LunConfig>> {
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
    pub(super) fn groups_of(&self, target: &str) -> Vec<GroupConfig> {
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

    pub(super) fn initiators(&self, target: &str, group: &str) -> Vec<String> {
        self.groups_of(target)
            .into_iter()
            .find(|g| g.name == group)
            .map(|g| g.initiators)
            .unwrap_or_default()
    }
}

impl Tree {
    pub(super) fn targets_cmd(&self, command: &str) -> Result<Change, MgmtError> {
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

    pub(super) fn luns_cmd(
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

    pub(super) fn groups_cmd(&self, target: &str, command: &str) -> Result<Change, MgmtError> {
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

    pub(super) fn initiators_cmd(
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
}

impl Tree {
    /// Reads iSCSI parameter `a`.
    pub(super) fn get_iscsi_param(&self, a: &AttrDef) -> AttrValue {
        let cfg = &self.cfg;
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

    /// The change writing `value` to iSCSI parameter `a` (at `path`) makes.
    pub(super) fn iscsi_param_change(
        &self,
        a: &AttrDef,
        value: &str,
        path: &str,
    ) -> Result<Change, MgmtError> {
        let bad = |msg: String| MgmtError::Refused(format!("{path}: {msg}"));
        let mut v = serde_json::to_value(&self.cfg.iscsi).unwrap_or_default();
        let newv = match &v[a.name] {
            serde_json::Value::Array(_) => serde_json::Value::Array(
                value
                    .split(|c: char| c == ',' || c.is_whitespace())
                    .filter(|s| !s.is_empty())
                    .map(|s| serde_json::Value::String(s.to_ascii_lowercase()))
                    .collect(),
            ),
            serde_json::Value::Bool(_) => serde_json::Value::Bool(parse_bool(value).map_err(bad)?),
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
        Ok(Change::SetIscsiParams(p))
    }
}
