//! ferrited as a node of an HA cluster (`cluster` in the configuration,
//! docs/cluster.md): a [`ferrite_cluster::Node`] keeps this node's lease in
//! etcd and says which node owns each clustered device group (one whose
//! target groups name their node); this module turns that into the groups'
//! ALUA states and keeps the persistent reservations of their devices in
//! etcd.
//!
//! States, as each node sets them for every target group of a clustered
//! device group:
//!
//! - the owner's target groups active/optimized, every other node's
//!   active/non-optimized (shared storage serves both; the optimized path is
//!   where multipath sends I/O);
//! - no owner known yet: every group transitioning (initiators retry);
//!
//! Initiators see implicit ALUA only: SET TARGET PORT GROUPS is not offered
//! on a clustered group, since the cluster alone decides its states.
//! - this node fenced (its lease may have run out in etcd, so another node
//!   may own the groups now): its own target groups standby, so it neither
//!   reports active/optimized nor takes writes until it is live again and
//!   hears who owns what. Until the cluster says anything at start, the
//!   node is fenced.
//!
//! Reservations: each device of a clustered group saves its persistent
//! reservation state to etcd before a PERSISTENT RESERVE OUT's status goes
//! out (a shared [`PrStore`]; a save that fails fails the command, and the
//! change is undone), and it returns once every other live node applied
//! the change (`ferrite_cluster::Node::save`), so no node serves as if a
//! reservation the initiator was told of did not exist; PERSISTENT RESERVE
//! IN and OUT read the state from etcd first.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Result;
use ferrite_cluster::{Event, Node, NodeConfig};
use ferrite_core::alua::{AccessState, Cause, Change, DeviceGroup};
use ferrite_core::device::Device;
use ferrite_core::pr::PrStore;
use ferrite_mgmt::config::{ClusterConfig, DeviceGroupConfig};

use crate::system::System;

/// A running cluster node; stopped cleanly on drop (its lease revoked, so
/// another node takes its groups over at once).
pub struct Clustered {
    node: Arc<Node>,
}

impl Drop for Clustered {
    fn drop(&mut self) {
        self.node.stop();
    }
}

/// What this node knows of a device group's ownership.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Known {
    /// Cut off from etcd (or not yet heard from it).
    Fenced,
    /// Live; the owner etcd names, if any.
    Owner(Option<String>),
}

/// The state of each target group of `cfg` on node `me` given `known`:
/// `None` leaves a group as it is.
fn states(cfg: &DeviceGroupConfig, me: &str, known: &Known) -> Vec<Option<AccessState>> {
    cfg.target_groups
        .iter()
        .map(|tg| {
            let node = tg.node.as_deref();
            match known {
                Known::Fenced => (node == Some(me)).then_some(AccessState::Standby),
                Known::Owner(None) => Some(AccessState::Transitioning),
                Known::Owner(Some(owner)) => Some(if node == Some(owner.as_str()) {
                    AccessState::ActiveOptimized
                } else {
                    AccessState::ActiveNonOptimized
                }),
            }
        })
        .collect()
}

fn apply(cfg: &DeviceGroupConfig, dg: &DeviceGroup, me: &str, known: &Known) {
    let changes: Vec<Change> = cfg
        .target_groups
        .iter()
        .zip(states(cfg, me, known))
        .filter_map(|(tg, st)| {
            Some(Change {
                group: u16::try_from(tg.group_id).ok()?,
                state: st?,
                preferred: None,
            })
        })
        .collect();
    match dg.set(&changes, Cause::Implicit) {
        Ok(true) => {
            tracing::info!(group = %cfg.name, state = ?known, "ALUA states follow the cluster")
        }
        Ok(false) => {}
        Err(e) => {
            tracing::error!(group = %cfg.name, error = %e, "cannot set the cluster's ALUA states")
        }
    }
}

/// Saves a device's reservation state in etcd (shared: every change, before
/// the command's status).
#[derive(Debug)]
struct ClusterPr {
    node: Arc<Node>,
    device: String,
}

impl PrStore for ClusterPr {
    fn save(&self, bytes: &[u8]) -> std::io::Result<()> {
        self.node
            .save(&self.device, bytes)
            .map_err(|e| std::io::Error::other(format!("cluster: {e}")))
    }

    fn shared(&self) -> bool {
        true
    }

    fn load(&self) -> Option<std::io::Result<Vec<u8>>> {
        Some(
            self.node
                .load(&self.device)
                .map(Option::unwrap_or_default)
                .map_err(|e| std::io::Error::other(format!("cluster: {e}"))),
        )
    }
}

/// Starts this ferrited's cluster node, if the configuration has one: the
/// clustered device groups start fenced (this node's target groups
/// standby) and follow the cluster from then on; their devices keep their
/// reservations in etcd.
pub fn start(cfg: Option<&ClusterConfig>, system: &System) -> Result<Option<Clustered>> {
    let Some(c) = cfg else {
        return Ok(None);
    };
    let groups: Vec<(DeviceGroupConfig, Arc<DeviceGroup>)> = system
        .device_groups
        .values()
        .filter(|(g, _)| g.clustered())
        .cloned()
        .collect();
    let me = c.node.clone();
    for (g, dg) in &groups {
        // The cluster decides: initiators may not (the Linux ALUA handler
        // would ask a fenced node's standby group to become optimized).
        dg.set_explicit(false);
        apply(g, dg, &me, &Known::Fenced);
    }
    let devices: BTreeMap<String, Arc<Device>> = groups
        .iter()
        .flat_map(|(g, _)| g.devices.iter())
        .filter_map(|d| system.devices.get(d).map(|dev| (d.clone(), dev.clone())))
        .collect();
    let by_name: BTreeMap<String, (DeviceGroupConfig, Arc<DeviceGroup>)> = groups
        .iter()
        .map(|(g, dg)| (g.name.clone(), (g.clone(), dg.clone())))
        .collect();
    let names: Vec<String> = by_name.keys().cloned().collect();
    let ev_devices = devices.clone();
    let node_cfg = NodeConfig::new(c.etcd.clone(), &c.node, &c.prefix)
        .with_lease_ttl(Duration::from_secs(u64::from(c.lease_ttl_s)));
    let node = Node::start(node_cfg, names, move |ev| {
        on_event(&me, &by_name, &ev_devices, ev)
    })
    .map_err(|e| anyhow::anyhow!("cluster node {}: {e}", c.node))?;
    let node = Arc::new(node);
    for (name, dev) in &devices {
        dev.set_pr_store(Arc::new(ClusterPr {
            node: node.clone(),
            device: name.clone(),
        }));
    }
    tracing::info!(node = %c.node, etcd = ?c.etcd, groups = groups.len(),
        devices = devices.len(), "cluster node started");
    Ok(Some(Clustered { node }))
}

fn on_event(
    me: &str,
    groups: &BTreeMap<String, (DeviceGroupConfig, Arc<DeviceGroup>)>,
    devices: &BTreeMap<String, Arc<Device>>,
    ev: Event,
) {
    match ev {
        Event::Live => tracing::info!(node = %me, "cluster: live (lease renewed)"),
        Event::Fenced { .. } => {
            tracing::warn!(node = %me, "cluster: fenced (lease not renewed in time): this node's target groups go standby");
            for (g, dg) in groups.values() {
                apply(g, dg, me, &Known::Fenced);
            }
        }
        Event::Owner {
            group,
            owner,
            me: mine,
        } => {
            tracing::info!(node = %me, group = %group, owner = ?owner, mine, "cluster: device group owner");
            if let Some((g, dg)) = groups.get(&group) {
                apply(g, dg, me, &Known::Owner(owner));
            }
        }
        Event::Reservations { device, bytes } => match devices.get(&device) {
            Some(dev) if dev.restore_reservations(&bytes) => {
                tracing::info!(device = %device, "cluster: reservations changed on another node");
            }
            Some(_) => {
                tracing::error!(device = %device, "cluster: unreadable reservation state in etcd; kept ours");
            }
            None => {}
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferrite_mgmt::config::TargetGroupConfig;

    fn cfg() -> DeviceGroupConfig {
        let mut g = DeviceGroupConfig::new("dg");
        let mut a = TargetGroupConfig::new("tga", 1);
        a.node = Some("a".into());
        let mut b = TargetGroupConfig::new("tgb", 2);
        b.node = Some("b".into());
        let c = TargetGroupConfig::new("local", 3);
        g.target_groups = vec![a, b, c];
        g
    }

    #[test]
    fn states_follow_ownership_and_fencing() {
        use AccessState::*;
        let g = cfg();
        let owner = |o: &str| Known::Owner(Some(o.into()));
        assert_eq!(
            states(&g, "a", &owner("a")),
            vec![
                Some(ActiveOptimized),
                Some(ActiveNonOptimized),
                Some(ActiveNonOptimized)
            ]
        );
        assert_eq!(
            states(&g, "a", &owner("b")),
            vec![
                Some(ActiveNonOptimized),
                Some(ActiveOptimized),
                Some(ActiveNonOptimized)
            ]
        );
        // Fenced: only this node's own groups change, to standby.
        assert_eq!(
            states(&g, "a", &Known::Fenced),
            vec![Some(Standby), None, None]
        );
        assert_eq!(
            states(&g, "a", &Known::Owner(None)),
            vec![Some(Transitioning); 3]
        );
    }
}
