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
