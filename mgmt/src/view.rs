//! The tree view (`ferritectl tree PATH`): a subtree's directories, one per
//! line, each with the values that say what the object is (a target's
//! `enabled` and `portals`, a LUN's device and the device's size, a
//! session's connections), as targetcli's `ls` shows them. Built from the
//! tree's own `ls` and `get`, so it shows what they show; [`ViewNode`] is
//! also what `--json` prints.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

use crate::tree::{EntryKind, MgmtError, Tree};

/// Attributes whose values go on their directory's line, in this order.
/// Multi-line and write-only attributes never do.
const SUMMARY: &[&str] = &[
    "handler",
    "enabled",
    "portals",
    "provider",
    "port_id",
    "device",
    "size",
    "filename",
    "read_only",
    "thin_provisioned",
    "tsih",
    "group",
    "connections",
    "active_commands",
    "lun_count",
];

/// Deeper than any directory of the tree: a bound, not a limit users meet.
const MAX_DEPTH: usize = 16;

/// One directory of the view.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ViewNode {
    /// The directory's name (the whole path for the view's root).
    pub name: String,
    /// What `ls` says of it ("iSCSI target", "-> disk0").
    pub description: String,
    /// Its summary attributes (see the module doc), by name; a LUN also
    /// carries its device's `size`.
    pub values: BTreeMap<String, String>,
    pub children: Vec<ViewNode>,
}

/// The view of the directory at `path` and everything below it.
pub fn view(tree: &Tree, path: &str) -> Result<ViewNode, MgmtError> {
    let path = normalize(path);
    // `ls` of the path's parent gives the root's description.
    let description = match path.rsplit_once('/') {
        Some((parent, name)) if !name.is_empty() => tree
            .ls(if parent.is_empty() { "/" } else { parent })
            .ok()
            .and_then(|es| es.into_iter().find(|e| e.name == name))
            .map(|e| e.description)
            .unwrap_or_default(),
        _ => String::new(),
    };
    node(tree, &path, path.clone(), description, 0)
}

/// `path` with one leading slash and none trailing (`/` stays `/`).
fn normalize(path: &str) -> String {
    let p = path.trim_matches('/');
    format!("/{p}")
}

fn join(dir: &str, name: &str) -> String {
    if dir == "/" {
        format!("/{name}")
    } else {
        format!("{dir}/{name}")
    }
}

fn node(
    tree: &Tree,
    path: &str,
    name: String,
    description: String,
    depth: usize,
) -> Result<ViewNode, MgmtError> {
    let entries = tree.ls(path)?;
    let mut values = BTreeMap::new();
    let mut children = Vec::new();
    for e in entries {
        match e.kind {
            EntryKind::Attr if SUMMARY.contains(&e.name.as_str()) => {
                if let Ok(v) = tree.get(&join(path, &e.name))
                    && !v.value.contains('\n')
                {
                    values.insert(e.name, v.value);
                }
            }
            EntryKind::Dir if depth < MAX_DEPTH => {
                let p = join(path, &e.name);
                // A directory that vanished between `ls` and now (a session
                // that just closed) is left out, not an error.
                if let Ok(n) = node(tree, &p, e.name, e.description, depth + 1) {
                    children.push(n);
                }
            }
            _ => {}
        }
    }
    // A LUN names its device: its size belongs on the LUN's line too.
    if let Some(dev) = values.get("device").cloned()
        && !values.contains_key("size")
        && let Ok(v) = tree.get(&format!("/devices/{dev}/size"))
    {
        values.insert("size".into(), v.value);
    }
    Ok(ViewNode {
        name,
        description,
        values,
        children,
    })
}

/// `n` bytes as a short human figure: `1 GiB`, `512 MiB`, `1.5 TiB`.
fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if v.fract() == 0.0 {
        format!("{v:.0} {}", UNITS[u])
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

/// The summary of one line: `[enabled, portals 127.0.0.1:3260]`, with
/// flags (0|1 values) by name and sizes in human units.
fn summary(n: &ViewNode) -> String {
    let mut parts = Vec::new();
    for key in SUMMARY {
        let Some(v) = n.values.get(*key) else {
            continue;
        };
        match (*key, v.as_str()) {
            ("enabled", "1") => parts.push("enabled".to_string()),
            ("enabled", "0") => parts.push("disabled".to_string()),
            ("read_only" | "thin_provisioned", "1") => parts.push(key.replace('_', "-")),
            ("read_only" | "thin_provisioned", _) => {}
            (_, "") => {}
            ("size", s) => match s.parse::<u64>() {
                Ok(b) => parts.push(human_bytes(b)),
                Err(_) => parts.push(format!("size {s}")),
            },
            ("device" | "handler" | "filename", s) => parts.push(s.to_string()),
            ("active_commands", s) => parts.push(format!("commands {s}")),
            ("lun_count", s) => parts.push(format!("luns {s}")),
            (k, s) => parts.push(format!("{} {s}", k.replace('_', " "))),
        }
    }
    if parts.is_empty() {
        return String::new();
    }
    format!("[{}]", parts.join(", "))
}

/// The view as text: one line per directory, indented by depth with
/// tree-drawing characters, its summary after its name.
pub fn render(root: &ViewNode) -> String {
    let mut out = String::new();
    let s = summary(root);
    let _ = writeln!(out, "{}{}", root.name, pad(&s));
    render_children(root, "", &mut out);
    out
}

fn pad(s: &str) -> String {
    if s.is_empty() {
        String::new()
    } else {
        format!(" {s}")
    }
}

fn render_children(n: &ViewNode, prefix: &str, out: &mut String) {
    let last = n.children.len().saturating_sub(1);
    for (i, c) in n.children.iter().enumerate() {
        let (branch, more) = if i == last {
            ("└─ ", "   ")
        } else {
            ("├─ ", "│  ")
        };
        let _ = writeln!(out, "{prefix}{branch}{}{}", c.name, pad(&summary(c)));
        render_children(c, &format!("{prefix}{more}"), out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn leaf(name: &str, values: &[(&str, &str)]) -> ViewNode {
        ViewNode {
            name: name.into(),
            description: String::new(),
            values: values
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            children: vec![],
        }
    }

    #[test]
    fn sizes_read_as_people_write_them() {
        assert_eq!(human_bytes(1 << 30), "1 GiB");
        assert_eq!(human_bytes(512), "512 B");
        assert_eq!(human_bytes(3 << 29), "1.5 GiB");
        assert_eq!(human_bytes(u64::MAX), "16384 PiB");
    }

    #[test]
    fn lines_carry_their_key_values_and_branches_nest() {
        let mut t = leaf("iqn.x", &[("enabled", "1"), ("portals", "127.0.0.1:3260")]);
        let mut luns = leaf("luns", &[]);
        luns.children.push(leaf(
            "0",
            &[
                ("device", "disk0"),
                ("size", "1073741824"),
                ("read_only", "0"),
            ],
        ));
        t.children.push(luns);
        t.children.push(leaf("sessions", &[]));
        let mut root = leaf("/targets/iscsi", &[]);
        root.children.push(t);
        let text = render(&root);
        assert_eq!(
            text,
            "/targets/iscsi\n\
             └─ iqn.x [enabled, portals 127.0.0.1:3260]\n\
             \u{20}  ├─ luns\n\
             \u{20}  │  └─ 0 [disk0, 1 GiB]\n\
             \u{20}  └─ sessions\n"
        );
    }

    #[test]
    fn paths_are_normalized() {
        assert_eq!(normalize("targets/iscsi/"), "/targets/iscsi");
        assert_eq!(normalize("/"), "/");
        assert_eq!(join("/", "a"), "/a");
        assert_eq!(join("/a", "b"), "/a/b");
    }
}
