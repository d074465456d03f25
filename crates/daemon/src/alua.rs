//! ALUA device groups as the daemon builds them from the configuration,
//! and where their states are kept across restarts:
//! `STATE_DIR/alua/<device group>` (the core's [`DeviceGroup::encode`]
//! format), written atomically by every change and read back at start
//! (a saved state wins over the configured one).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use ferrite_core::alua::{DeviceGroup, PortGroup, StateStore};
use ferrite_mgmt::config::{DeviceGroupConfig, TargetGroupConfig};

/// The saved states of one device group.
#[derive(Debug)]
pub struct AluaStore {
    pub path: PathBuf,
}

impl AluaStore {
    /// Where the states of device group `name` live.
    pub fn for_group(state_dir: &Path, name: &str) -> AluaStore {
        AluaStore {
            path: state_dir.join("alua").join(name),
        }
    }
}

impl StateStore for AluaStore {
    fn save(&self, bytes: &[u8]) -> std::io::Result<()> {
        ferrite_core::pr::write_atomic(&self.path, bytes)
    }
}

/// The relative target port ids of target group `t`: its targets' (as
/// `rel` gives them) and the other nodes' ports it lists.
pub fn ports(t: &TargetGroupConfig, rel: &dyn Fn(&str) -> Option<u16>) -> Vec<u16> {
    t.targets
        .iter()
        .filter_map(|x| rel(x))
        .chain(t.rel_tgt_ids.iter().copied())
        .collect()
}

/// Builds the device group `cfg`: each target group's ports are its
/// [`ports`]. With `old` (the same
/// group before a configuration change) target groups of the same name
/// keep their runtime states; without, the saved states are restored if
/// there are any. States are saved under `state_dir` from now on.
pub fn build_group(
    cfg: &DeviceGroupConfig,
    rel: &dyn Fn(&str) -> Option<u16>,
    state_dir: &Path,
    old: Option<&DeviceGroup>,
) -> Arc<DeviceGroup> {
    let groups = cfg
        .target_groups
        .iter()
        .map(|t| {
            PortGroup::new(
                t.name.clone(),
                // Validated: 1 to 65535.
                u16::try_from(t.group_id).unwrap_or(u16::MAX),
                ports(t, rel),
                t.access_state(),
                t.preferred,
            )
        })
        .collect();
    let dg = DeviceGroup::new(cfg.name.clone(), groups);
    let store = AluaStore::for_group(state_dir, &cfg.name);
    match old {
        Some(o) => dg.carry_states(o),
        None => match std::fs::read(&store.path) {
            Ok(bytes) => {
                if dg.restore(&bytes).is_some() {
                    tracing::info!(group = %cfg.name, "ALUA states restored");
                } else {
                    tracing::warn!(group = %cfg.name, path = %store.path.display(),
                        "saved ALUA states unreadable; starting with the configured ones");
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => tracing::warn!(group = %cfg.name, path = %store.path.display(),
                error = %e, "cannot read saved ALUA states; starting with the configured ones"),
        },
    }
    dg.set_store(Arc::new(store));
    Arc::new(dg)
}

/// The device group of every grouped device, by device name.
pub fn membership(
    groups: &BTreeMap<String, (DeviceGroupConfig, Arc<DeviceGroup>)>,
) -> BTreeMap<String, Arc<DeviceGroup>> {
    let mut out = BTreeMap::new();
    for (cfg, dg) in groups.values() {
        for d in &cfg.devices {
            out.insert(d.clone(), dg.clone());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferrite_core::alua::{AccessState, Cause, Change};
    use ferrite_mgmt::config::TargetGroupConfig;

    fn cfg() -> DeviceGroupConfig {
        let mut g = DeviceGroupConfig::new("dg1");
        g.devices.push("disk0".into());
        let mut a = TargetGroupConfig::new("tg_a", 1);
        a.targets.push("ta".into());
        let mut b = TargetGroupConfig::new("tg_b", 2);
        b.targets.push("tb".into());
        b.state = "nonoptimized".into();
        g.target_groups = vec![a, b];
        g
    }

    fn rel(t: &str) -> Option<u16> {
        match t {
            "ta" => Some(1),
            "tb" => Some(2),
            _ => None,
        }
    }

    #[test]
    fn states_are_saved_and_win_at_the_next_start() {
        let dir = std::env::temp_dir().join(format!("ferrite-alua-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let dg = build_group(&cfg(), &rel, &dir, None);
        assert_eq!(dg.state_of_port(2), AccessState::ActiveNonOptimized);
        assert_eq!(
            dg.group_named("tg_a").map(|g| g.ports.clone()),
            Some(vec![1])
        );
        let moved = dg
            .set(
                &[Change {
                    group: 1,
                    state: AccessState::Standby,
                    preferred: Some(true),
                }],
                Cause::Implicit,
            )
            .expect("saved");
        assert!(moved);
        assert!(dir.join("alua/dg1").exists());
        // A new start: the saved state wins over the configured one.
        let again = build_group(&cfg(), &rel, &dir, None);
        assert_eq!(again.state_of_port(1), AccessState::Standby);
        assert!(again.group_named("tg_a").is_some_and(|g| g.preferred()));
        // A reconfigured group keeps the runtime state of the one it replaces.
        let mut changed = cfg();
        changed.target_groups[1].group_id = 7;
        let carried = build_group(&changed, &rel, &dir, Some(&dg));
        assert_eq!(carried.state_of_port(1), AccessState::Standby);
        assert_eq!(carried.group_named("tg_b").map(|g| g.id), Some(7));
        // Unreadable: the configured states.
        std::fs::write(dir.join("alua/dg1"), b"garbage").expect("write");
        let fresh = build_group(&cfg(), &rel, &dir, None);
        assert_eq!(fresh.state_of_port(1), AccessState::ActiveOptimized);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
