//! `.../sessions/<initiator>`: the logged-in sessions of a target.

use super::*;

pub(super) const SESSION_ATTRS: &[AttrDef] = &[
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

impl Tree {
    pub(super) fn sessions_of(&self, target: &str) -> Vec<(String, SessionInfo)> {
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
}

impl Tree {
    /// Reads attribute `a` of session `s` (at `path`).
    pub(super) fn get_session_attr(
        &self,
        s: &SessionInfo,
        a: &AttrDef,
        path: &str,
    ) -> Result<AttrValue, MgmtError> {
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
        Ok(AttrValue {
            value,
            key: false,
            writable: a.name == "force_close",
            description: a.desc.into(),
        })
    }

    /// Writes `value` to the `force_close` attribute of session `s` of
    /// target `t` (at `path`): 1 closes the session.
    pub(super) fn force_close(
        &self,
        t: &str,
        s: &SessionInfo,
        value: &str,
        path: &str,
    ) -> Result<String, MgmtError> {
        let bad = |msg: String| MgmtError::Refused(format!("{path}: {msg}"));
        if !parse_bool(value).map_err(bad)? {
            return Err(bad("write 1 to close the session".into()));
        }
        self.rt
            .close_session(srp_port_of(t).unwrap_or(t), &s.initiator, s.isid)
            .map_err(|source| MgmtError::Runtime {
                what: format!("close session {} of {t}", s.initiator),
                source,
            })?;
        Ok(format!(
            "closed session {} (isid 0x{:012x})",
            s.initiator, s.isid
        ))
    }
}
