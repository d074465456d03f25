//! The daemon's side of the management seam: carries out what the
//! management tree asks ([`Runtime`]) by rebuilding the read-mostly snapshot
//! and sending it to every core. Runs on the management thread; nothing here
//! is on the data path, so a mutex is the right tool.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};

use ferrite_core::alua::{AccessState, Cause, DeviceGroup};
use ferrite_core::device::{AccessGroup, Device, DeviceId, LunEntry, LunMap, Target};
use ferrite_mgmt::config::{
    DeviceConfig, DeviceGroupConfig, IscsiParamsConfig, IscsiTargetConfig, LunConfig,
    SrpTargetConfig,
};
use ferrite_mgmt::runtime::{DeviceAttr, Runtime, RuntimeError, SessionInfo, Stats, TargetAttr};
use ferrite_reactor::mailbox::MailboxTx;
use ferrite_scsi::Lun;

use crate::system::{Snapshot, iscsi_config_from, open_backend};
use crate::worker::Msg;
use ferrite_iscsi::portal::Registry;

/// A target as the runtime keeps it: its settings and its built maps. Maps
/// are kept as `Arc`s and replaced only when they change, so cores can tell
/// an unchanged map by pointer and raise unit attentions only where needed.
#[derive(Clone, Debug)]
struct TargetState {
    cfg: IscsiTargetConfig,
    luns: Arc<LunMap>,
    groups: Vec<AccessGroup>,
}

struct State {
    devices: BTreeMap<String, (DeviceConfig, Arc<Device>)>,
    next_device: u32,
    targets: BTreeMap<String, TargetState>,
    params: IscsiParamsConfig,
    /// Listening portals and how many targets use each.
    portals: BTreeMap<SocketAddr, usize>,
    /// SRP target ports as cores see them.
    srp_targets: BTreeMap<String, Arc<crate::srp::SrpTarget>>,
    /// Their configurations.
    srp_cfgs: BTreeMap<String, SrpTargetConfig>,
    /// ALUA device groups by name, with the configuration each was built
    /// from (its states are the group's own, live).
    device_groups: BTreeMap<String, (DeviceGroupConfig, Arc<DeviceGroup>)>,
}

/// Whether two device group configurations differ only in states and
/// preferred bits (which the built group keeps live).
fn same_shape(a: &DeviceGroupConfig, b: &DeviceGroupConfig) -> bool {
    let bare = |g: &DeviceGroupConfig| {
        let mut g = g.clone();
        for t in &mut g.target_groups {
            t.state.clear();
            t.preferred = false;
        }
        g
    };
    bare(a) == bare(b)
}

/// The running system, as the management tree sees it.
pub struct DaemonRuntime {
    state: Mutex<State>,
    cores: Vec<MailboxTx<Msg>>,
    registry: Arc<Registry>,
    stats_board: Arc<crate::stats::StatsBoard>,
    /// The data budget every core draws on.
    budget: Arc<ferrite_core::budget::DataBudget>,
    state_dir: std::path::PathBuf,
}

fn failed(e: impl std::fmt::Display) -> RuntimeError {
    RuntimeError::Failed(e.to_string())
}

impl DaemonRuntime {
    /// Takes over the system built at start-up.
    pub fn new(
        system: &crate::system::System,
        cfg: &ferrite_mgmt::Config,
        cores: Vec<MailboxTx<Msg>>,
        registry: Arc<Registry>,
    ) -> DaemonRuntime {
        let mut devices = BTreeMap::new();
        for d in &cfg.devices {
            if let Some(dev) = system.devices.get(&d.name) {
                devices.insert(d.name.clone(), (d.clone(), dev.clone()));
            }
        }
        let mut targets = BTreeMap::new();
        let mut portals = BTreeMap::new();
        for t in &cfg.targets.iscsi {
            if let Some(built) = system.snapshot.iscsi_targets.get(&t.name) {
                targets.insert(
                    t.name.clone(),
                    TargetState {
                        cfg: t.clone(),
                        luns: built.luns.clone(),
                        groups: built.groups.clone(),
                    },
                );
            }
            for p in t.portal_addrs() {
                *portals.entry(p).or_insert(0) += 1;
            }
        }
        DaemonRuntime {
            state: Mutex::new(State {
                next_device: devices.len() as u32,
                devices,
                targets,
                params: cfg.iscsi.clone(),
                portals,
                srp_targets: system.snapshot.srp_targets.clone(),
                srp_cfgs: cfg
                    .targets
                    .srp
                    .iter()
                    .map(|t| (t.name.clone(), t.clone()))
                    .collect(),
                device_groups: system.device_groups.clone(),
            }),
            cores,
            registry,
            stats_board: Arc::default(),
            budget: Arc::new(ferrite_core::budget::DataBudget::new(
                cfg.reactor.data_memory_bytes(),
            )),
            state_dir: system.state_dir.clone(),
        }
    }

    /// Reads statistics from `board`, where the cores publish them.
    pub fn with_stats(mut self, board: Arc<crate::stats::StatsBoard>) -> DaemonRuntime {
        self.stats_board = board;
        self
    }

    /// Shows and changes `budget`, the one the cores draw on.
    pub fn with_budget(mut self, budget: Arc<ferrite_core::budget::DataBudget>) -> DaemonRuntime {
        self.budget = budget;
        self
    }

    /// Asks every core for its counters of this moment and waits (a
    /// second at most) until all answered; a core that does not answer in
    /// time counts with what it published last.
    fn fresh_stats(&self) {
        let question = self.stats_board.ask();
        let mut asked = 0;
        for c in &self.cores {
            if c.send(Msg::PublishStats(question)).is_ok() {
                asked += 1;
            }
        }
        if asked == self.cores.len()
            && !self
                .stats_board
                .wait(question, asked, std::time::Duration::from_secs(1))
        {
            tracing::warn!(
                "a core did not publish its counters within a second: reporting older ones"
            );
        }
    }

    fn lock(&self) -> Result<MutexGuard<'_, State>, RuntimeError> {
        self.state
            .lock()
            .map_err(|_| RuntimeError::Failed("runtime state poisoned".into()))
    }

    /// Builds the snapshot from the state and sends it to every core.
    fn publish(&self, st: &State) {
        let mut iscsi_targets = BTreeMap::new();
        for (name, t) in &st.targets {
            iscsi_targets.insert(
                name.clone(),
                Arc::new(Target {
                    name: name.clone(),
                    rel_port_id: t.cfg.rel_port_id(),
                    enabled: t.cfg.enabled,
                    luns: t.luns.clone(),
                    groups: t.groups.clone(),
                }),
            );
        }
        let cfgs: Vec<IscsiTargetConfig> = st.targets.values().map(|t| t.cfg.clone()).collect();
        let iscsi = Arc::new(iscsi_config_from(&st.params, &cfgs, &iscsi_targets));
        let snap = Arc::new(Snapshot {
            iscsi_targets,
            iscsi,
            srp_targets: st.srp_targets.clone(),
        });
        for c in &self.cores {
            let _ = c.send(Msg::Snapshot(snap.clone()));
        }
    }

    fn build_map(st: &State, luns: &[LunConfig]) -> Result<Arc<LunMap>, RuntimeError> {
        let mut map = LunMap::default();
        for l in luns {
            let (_, dev) = st
                .devices
                .get(&l.device)
                .ok_or_else(|| RuntimeError::NotFound(format!("device {}", l.device)))?;
            map.luns.insert(
                Lun(l.lun),
                LunEntry {
                    device: dev.clone(),
                    read_only: l.read_only,
                },
            );
        }
        Ok(Arc::new(map))
    }

    /// Replaces `old` by `new` in every map that holds it.
    fn swap_device(st: &mut State, old: &Arc<Device>, new: &Arc<Device>) {
        let swap = |m: &Arc<LunMap>| -> Option<Arc<LunMap>> {
            if !m.luns.values().any(|e| Arc::ptr_eq(&e.device, old)) {
                return None;
            }
            let mut nm = (**m).clone();
            for e in nm.luns.values_mut() {
                if Arc::ptr_eq(&e.device, old) {
                    e.device = new.clone();
                }
            }
            Some(Arc::new(nm))
        };
        for t in st.targets.values_mut() {
            if let Some(m) = swap(&t.luns) {
                t.luns = m;
            }
            for g in &mut t.groups {
                if let Some(m) = swap(&g.luns) {
                    g.luns = m;
                }
            }
        }
        // SRP ports map the same devices.
        for t in st.srp_targets.values_mut() {
            let mut nt = (*t.target).clone();
            let mut changed = false;
            if let Some(m) = swap(&nt.luns) {
                nt.luns = m;
                changed = true;
            }
            for g in &mut nt.groups {
                if let Some(m) = swap(&g.luns) {
                    g.luns = m;
                    changed = true;
                }
            }
            if changed {
                *t = Arc::new(t.with_target(Arc::new(nt)));
            }
        }
    }

    /// The SRP port `cfg` as cores will see it. Maps whose configuration
    /// did not change keep their `Arc`, so that only sessions whose map
    /// changed get a unit attention; listener and channel board carry over
    /// unless the provider moved.
    fn build_srp(st: &State, cfg: &SrpTargetConfig) -> Result<crate::srp::SrpTarget, RuntimeError> {
        let old_cfg = st.srp_cfgs.get(&cfg.name);
        let old = st.srp_targets.get(&cfg.name);
        let luns = match (old_cfg, old) {
            (Some(oc), Some(o)) if oc.luns == cfg.luns => o.target.luns.clone(),
            _ => Self::build_map(st, &cfg.luns)?,
        };
        let mut groups = Vec::new();
        for g in &cfg.ini_groups {
            let same = old_cfg
                .and_then(|oc| oc.ini_groups.iter().find(|x| x.name == g.name))
                .filter(|x| x.luns == g.luns);
            let prev = old.and_then(|o| o.target.groups.iter().find(|x| x.name == g.name));
            let map = match (same, prev) {
                (Some(_), Some(p)) => p.luns.clone(),
                _ => Self::build_map(st, &g.luns)?,
            };
            groups.push(AccessGroup {
                name: g.name.clone(),
                initiators: g.initiators.clone(),
                luns: map,
            });
        }
        // Relative port ids go on after every other port's (VPD 83h tells
        // ports apart by them); a port keeps its own.
        let rel_port_id = match (cfg.rel_tgt_id, old) {
            (Some(r), _) => r,
            (None, Some(o)) => o.target.rel_port_id,
            (None, None) => {
                let iscsi = st
                    .targets
                    .values()
                    .map(|t| t.cfg.rel_port_id())
                    .max()
                    .unwrap_or(0);
                let srp = st
                    .srp_targets
                    .values()
                    .map(|t| t.target.rel_port_id)
                    .max()
                    .unwrap_or(0);
                let n = u16::try_from(st.targets.len()).unwrap_or(u16::MAX);
                iscsi.max(srp).max(n).saturating_add(1)
            }
        };
        let target = Arc::new(Target {
            name: cfg.name.clone(),
            rel_port_id,
            enabled: cfg.enabled,
            luns,
            groups,
        });
        Ok(match old {
            Some(o) => crate::srp::SrpTarget {
                port_id: cfg.port_id_bytes(),
                credits: cfg.credits,
                ..o.with_target(target)
            },
            None => crate::srp::srp_target(cfg, target),
        })
    }

    /// The relative target port id of the target or SRP port `name`.
    fn rel_port_of(st: &State, name: &str) -> Option<u16> {
        st.targets
            .get(name)
            .map(|t| t.cfg.rel_port_id())
            .or_else(|| st.srp_targets.get(name).map(|t| t.target.rel_port_id))
    }

    /// Rebuilds the device groups from `cfgs` (`None`: the ones there are,
    /// after their targets' relative ids may have moved): a group whose
    /// shape and ports are unchanged stays as it is; a changed one is
    /// built anew with the old one's runtime states. Devices whose group
    /// changed are replaced in every map (publish afterwards).
    fn sync_groups(&self, st: &mut State, cfgs: Option<&[DeviceGroupConfig]>) {
        let cfgs: Vec<DeviceGroupConfig> = match cfgs {
            Some(c) => c.to_vec(),
            None => st.device_groups.values().map(|(c, _)| c.clone()).collect(),
        };
        let mut next = BTreeMap::new();
        for c in &cfgs {
            let rel = |t: &str| Self::rel_port_of(st, t);
            let old = st.device_groups.get(&c.name);
            let ports_same = |g: &DeviceGroup| {
                c.target_groups.iter().all(|tc| {
                    g.group_named(&tc.name)
                        .is_some_and(|pg| pg.ports == crate::alua::ports(tc, &rel))
                })
            };
            let dg = match old {
                Some((oc, og)) if same_shape(oc, c) && ports_same(og) => og.clone(),
                _ => {
                    tracing::info!(group = %c.name, "ALUA device group configured");
                    crate::alua::build_group(c, &rel, &self.state_dir, old.map(|o| &*o.1))
                }
            };
            next.insert(c.name.clone(), (c.clone(), dg));
        }
        for gone in st.device_groups.keys().filter(|n| !next.contains_key(*n)) {
            // A group created again later starts as configured.
            let store = crate::alua::AluaStore::for_group(&self.state_dir, gone);
            if let Err(e) = std::fs::remove_file(&store.path)
                && e.kind() != std::io::ErrorKind::NotFound
            {
                tracing::warn!(group = %gone, error = %e, "cannot remove saved ALUA states");
            }
            tracing::info!(group = %gone, "ALUA device group removed");
        }
        st.device_groups = next;
        let member = crate::alua::membership(&st.device_groups);
        let names: Vec<String> = st.devices.keys().cloned().collect();
        for name in names {
            let Some((cfg, dev)) = st.devices.get(&name).cloned() else {
                continue;
            };
            let want = member.get(&name);
            let same = match (dev.alua(), want) {
                (None, None) => true,
                (Some(a), Some(b)) => Arc::ptr_eq(a, b),
                _ => false,
            };
            if !same {
                // The same LU in another group: reservations, range locks
                // and mode parameters carry over.
                let new = Arc::new(
                    dev.reconfigured(cfg.identity(), cfg.flags())
                        .with_alua(want.cloned()),
                );
                Self::swap_device(st, &dev, &new);
                st.devices.insert(name, (cfg, new));
            }
        }
    }

    fn listen(&self, st: &mut State, addrs: &[SocketAddr]) -> Result<(), RuntimeError> {
        for a in addrs {
            if st.portals.contains_key(a) {
                continue;
            }
            let l = crate::listen_on(*a).map_err(|e| failed(format!("listening on {a}: {e}")))?;
            tracing::info!(portal = %a, "iSCSI portal listening");
            if let Some(c) = self.cores.first() {
                c.send(Msg::Listen(l)).map_err(failed)?;
            }
            st.portals.insert(*a, 0);
        }
        for a in addrs {
            if let Some(n) = st.portals.get_mut(a) {
                *n += 1;
            }
        }
        Ok(())
    }

    fn unlisten(&self, st: &mut State, addrs: &[SocketAddr]) {
        for a in addrs {
            if let Some(n) = st.portals.get_mut(a) {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    st.portals.remove(a);
                    tracing::info!(portal = %a, "iSCSI portal closed");
                    if let Some(c) = self.cores.first() {
                        let _ = c.send(Msg::Unlisten(*a));
                    }
                }
            }
        }
    }
}

impl Runtime for DaemonRuntime {
    fn add_device(&self, dev: &DeviceConfig) -> Result<(), RuntimeError> {
        let mut st = self.lock()?;
        if st.devices.contains_key(&dev.name) {
            return Err(failed(format!("device {} exists", dev.name)));
        }
        let backend = open_backend(dev).map_err(|e| failed(format!("{e:#}")))?;
        let id = DeviceId(st.next_device);
        st.next_device += 1;
        let d = Arc::new(Device::new(
            id,
            dev.name.clone(),
            backend,
            dev.identity(),
            dev.flags(),
        ));
        crate::system::attach_pr_store(&d, &self.state_dir);
        tracing::info!(device = %dev.name, handler = dev.handler.name(), "device added");
        st.devices.insert(dev.name.clone(), (dev.clone(), d));
        Ok(())
    }

    fn del_device(&self, name: &str) -> Result<(), RuntimeError> {
        let mut st = self.lock()?;
        let (_, dev) = st
            .devices
            .get(name)
            .ok_or_else(|| RuntimeError::NotFound(format!("device {name}")))?;
        let used = st.targets.values().any(|t| {
            t.luns.luns.values().any(|e| Arc::ptr_eq(&e.device, dev))
                || t.groups
                    .iter()
                    .any(|g| g.luns.luns.values().any(|e| Arc::ptr_eq(&e.device, dev)))
        });
        let used = used
            || st.srp_targets.values().any(|t| {
                let t = &t.target;
                t.luns.luns.values().any(|e| Arc::ptr_eq(&e.device, dev))
                    || t.groups
                        .iter()
                        .any(|g| g.luns.luns.values().any(|e| Arc::ptr_eq(&e.device, dev)))
            });
        if used {
            return Err(failed(format!("device {name} is still mapped")));
        }
        st.devices.remove(name);
        tracing::info!(device = %name, "device removed");
        Ok(())
    }

    fn set_device_attr(&self, name: &str, attr: &DeviceAttr) -> Result<(), RuntimeError> {
        let mut st = self.lock()?;
        let (cfg, dev) = st
            .devices
            .get(name)
            .cloned()
            .ok_or_else(|| RuntimeError::NotFound(format!("device {name}")))?;
        let mut cfg = cfg;
        match attr {
            DeviceAttr::Size(bytes) => {
                let path = cfg.filename.clone().ok_or_else(|| {
                    RuntimeError::Unsupported(format!(
                        "device {name} has no backing file to resize"
                    ))
                })?;
                let f = std::fs::OpenOptions::new()
                    .write(true)
                    .open(&path)
                    .map_err(|e| failed(format!("{}: {e}", path.display())))?;
                f.set_len(*bytes)
                    .map_err(|e| failed(format!("{}: {e}", path.display())))?;
                let g = dev.backend.resync().map_err(failed)?;
                dev.set_num_blocks(g.num_blocks);
                cfg.size = Some(*bytes);
                tracing::info!(device = %name, blocks = g.num_blocks, "device resized");
                st.devices.insert(name.to_string(), (cfg, dev));
                return Ok(());
            }
            other => other.set_on(&mut cfg),
        }
        // The same LU with new settings: reservations, range locks and mode
        // parameters carry over.
        let new = Arc::new(dev.reconfigured(cfg.identity(), cfg.flags()));
        Self::swap_device(&mut st, &dev, &new);
        st.devices.insert(name.to_string(), (cfg, new));
        self.publish(&st);
        Ok(())
    }

    fn resync_size(&self, name: &str) -> Result<u64, RuntimeError> {
        let st = self.lock()?;
        let (_, dev) = st
            .devices
            .get(name)
            .ok_or_else(|| RuntimeError::NotFound(format!("device {name}")))?;
        let g = dev.backend.resync().map_err(failed)?;
        if g.num_blocks != dev.geometry().num_blocks {
            dev.set_num_blocks(g.num_blocks);
            tracing::info!(device = %name, blocks = g.num_blocks, "device capacity changed");
        }
        Ok(g.bytes())
    }

    fn device_size(&self, name: &str) -> Result<u64, RuntimeError> {
        let st = self.lock()?;
        let (_, dev) = st
            .devices
            .get(name)
            .ok_or_else(|| RuntimeError::NotFound(format!("device {name}")))?;
        Ok(dev.geometry().bytes())
    }

    fn add_target(&self, target: &IscsiTargetConfig) -> Result<(), RuntimeError> {
        let mut st = self.lock()?;
        if st.targets.contains_key(&target.name) {
            return Err(failed(format!("target {} exists", target.name)));
        }
        let mut cfg = target.clone();
        cfg.enabled = false;
        cfg.luns.clear();
        cfg.ini_groups.clear();
        self.listen(&mut st, &cfg.portal_addrs())?;
        st.targets.insert(
            cfg.name.clone(),
            TargetState {
                cfg,
                luns: Arc::new(LunMap::default()),
                groups: Vec::new(),
            },
        );
        self.publish(&st);
        Ok(())
    }

    fn del_target(&self, name: &str) -> Result<(), RuntimeError> {
        let mut st = self.lock()?;
        let t = st
            .targets
            .remove(name)
            .ok_or_else(|| RuntimeError::NotFound(format!("target {name}")))?;
        self.unlisten(&mut st, &t.cfg.portal_addrs());
        // Cores close the sessions of a target missing from the snapshot.
        self.publish(&st);
        Ok(())
    }

    fn set_target_enabled(&self, name: &str, enabled: bool) -> Result<(), RuntimeError> {
        let mut st = self.lock()?;
        let t = st
            .targets
            .get_mut(name)
            .ok_or_else(|| RuntimeError::NotFound(format!("target {name}")))?;
        t.cfg.enabled = enabled;
        self.publish(&st);
        Ok(())
    }

    fn set_target_attr(&self, name: &str, attr: &TargetAttr) -> Result<(), RuntimeError> {
        let mut st = self.lock()?;
        let old = st
            .targets
            .get(name)
            .cloned()
            .ok_or_else(|| RuntimeError::NotFound(format!("target {name}")))?;
        let mut cfg = old.cfg.clone();
        match attr {
            TargetAttr::Portals(p) => {
                cfg.portals = p.clone();
                let new_addrs = cfg.portal_addrs();
                self.listen(&mut st, &new_addrs)?;
                self.unlisten(&mut st, &old.cfg.portal_addrs());
            }
            TargetAttr::Tpgt(t) => cfg.tpgt = *t,
            TargetAttr::Alias(a) => cfg.alias = a.clone(),
            TargetAttr::IncomingUsers(u) => cfg.incoming_users = u.clone(),
            TargetAttr::OutgoingUser(u) => cfg.outgoing_user = u.clone(),
        }
        if let Some(t) = st.targets.get_mut(name) {
            t.cfg = cfg;
        }
        // A new portal group tag may move the target's relative port id.
        self.sync_groups(&mut st, None);
        self.publish(&st);
        Ok(())
    }

    fn add_group(&self, target: &str, group: &str) -> Result<(), RuntimeError> {
        let mut st = self.lock()?;
        let t = st
            .targets
            .get_mut(target)
            .ok_or_else(|| RuntimeError::NotFound(format!("target {target}")))?;
        if t.groups.iter().any(|g| g.name == group) {
            return Err(failed(format!("group {group} exists")));
        }
        t.groups.push(AccessGroup {
            name: group.to_string(),
            initiators: Vec::new(),
            luns: Arc::new(LunMap::default()),
        });
        self.publish(&st);
        Ok(())
    }

    fn del_group(&self, target: &str, group: &str) -> Result<(), RuntimeError> {
        let mut st = self.lock()?;
        let t = st
            .targets
            .get_mut(target)
            .ok_or_else(|| RuntimeError::NotFound(format!("target {target}")))?;
        let before = t.groups.len();
        t.groups.retain(|g| g.name != group);
        if t.groups.len() == before {
            return Err(RuntimeError::NotFound(format!("group {group}")));
        }
        self.publish(&st);
        Ok(())
    }

    fn set_group_initiators(
        &self,
        target: &str,
        group: &str,
        initiators: &[String],
    ) -> Result<(), RuntimeError> {
        let mut st = self.lock()?;
        let t = st
            .targets
            .get_mut(target)
            .ok_or_else(|| RuntimeError::NotFound(format!("target {target}")))?;
        let g = t
            .groups
            .iter_mut()
            .find(|g| g.name == group)
            .ok_or_else(|| RuntimeError::NotFound(format!("group {group}")))?;
        g.initiators = initiators.to_vec();
        self.publish(&st);
        Ok(())
    }

    fn set_lun_map(
        &self,
        target: &str,
        group: Option<&str>,
        luns: &[LunConfig],
    ) -> Result<(), RuntimeError> {
        let mut st = self.lock()?;
        let map = Self::build_map(&st, luns)?;
        let t = st
            .targets
            .get_mut(target)
            .ok_or_else(|| RuntimeError::NotFound(format!("target {target}")))?;
        match group {
            None => {
                t.luns = map;
                t.cfg.luns = luns.to_vec();
            }
            Some(g) => {
                let grp = t
                    .groups
                    .iter_mut()
                    .find(|x| x.name == g)
                    .ok_or_else(|| RuntimeError::NotFound(format!("group {g}")))?;
                grp.luns = map;
            }
        }
        self.publish(&st);
        Ok(())
    }

    fn set_iscsi_params(&self, params: &IscsiParamsConfig) -> Result<(), RuntimeError> {
        let mut st = self.lock()?;
        st.params = params.clone();
        self.publish(&st);
        Ok(())
    }

    fn set_data_memory(&self, limit: u64) -> Result<(), RuntimeError> {
        // The cores read the limit at every take; commands waiting in
        // BufWait look at the budget again on their shard's next poll.
        self.budget.set_limit(limit);
        tracing::info!(
            data_memory_mb = self.budget.limit() >> 20,
            "data memory budget changed"
        );
        Ok(())
    }

    fn set_srp_target(
        &self,
        name: &str,
        target: Option<&SrpTargetConfig>,
    ) -> Result<(), RuntimeError> {
        let mut st = self.lock()?;
        let Some(cfg) = target else {
            st.srp_targets
                .remove(name)
                .ok_or_else(|| RuntimeError::NotFound(format!("SRP port {name}")))?;
            st.srp_cfgs.remove(name);
            // Cores log the port's channels out; core 0 closes its listener.
            self.publish(&st);
            tracing::info!(port = %name, "SRP target port removed");
            return Ok(());
        };
        let mut built = Self::build_srp(&st, cfg)?;
        let moved = st
            .srp_cfgs
            .get(name)
            .is_none_or(|old| old.provider != cfg.provider);
        if moved {
            // A new port, or one whose endpoint changed: bound here, so
            // that a failure (address in use, no permission) is the
            // command's answer; core 0 takes the listener from the snapshot.
            built.listener = crate::srp::bind_port(cfg).map_err(|e| failed(format!("{e:#}")))?;
            if st.srp_cfgs.contains_key(name) {
                // Channels of the old endpoint stay; new logins come here.
                tracing::info!(port = %name, "SRP target port moved");
            }
        }
        st.srp_targets.insert(name.to_string(), Arc::new(built));
        st.srp_cfgs.insert(name.to_string(), cfg.clone());
        self.sync_groups(&mut st, None);
        self.publish(&st);
        Ok(())
    }

    fn set_device_groups(&self, groups: &[DeviceGroupConfig]) -> Result<(), RuntimeError> {
        let mut st = self.lock()?;
        for g in groups {
            for t in g.target_groups.iter().flat_map(|t| t.targets.iter()) {
                if Self::rel_port_of(&st, t).is_none() {
                    return Err(RuntimeError::NotFound(format!("target {t}")));
                }
            }
            for d in &g.devices {
                if !st.devices.contains_key(d) {
                    return Err(RuntimeError::NotFound(format!("device {d}")));
                }
            }
        }
        self.sync_groups(&mut st, Some(groups));
        self.publish(&st);
        Ok(())
    }

    fn set_alua_state(
        &self,
        group: &str,
        target_group: &str,
        state: AccessState,
        preferred: bool,
    ) -> Result<(), RuntimeError> {
        let st = self.lock()?;
        let (_, dg) = st
            .device_groups
            .get(group)
            .ok_or_else(|| RuntimeError::NotFound(format!("device group {group}")))?;
        if !dg.explicit() {
            return Err(RuntimeError::Unsupported(format!(
                "device group {group} follows the cluster, which alone sets its states"
            )));
        }
        let id = dg
            .group_named(target_group)
            .ok_or_else(|| RuntimeError::NotFound(format!("target group {target_group}")))?
            .id;
        // SPC-4 §5.15.2.2: an implicit transition; the cores raise
        // ASYMMETRIC ACCESS STATE CHANGED on the group's nexuses.
        let change = ferrite_core::alua::Change {
            group: id,
            state,
            preferred: Some(preferred),
        };
        if dg.set(&[change], Cause::Implicit).map_err(failed)? {
            tracing::info!(%group, %target_group, %state, preferred, "ALUA state changed");
        }
        Ok(())
    }

    fn alua_state(&self, group: &str, target_group: &str) -> Option<(AccessState, bool)> {
        let st = self.state.lock().ok()?;
        let (_, dg) = st.device_groups.get(group)?;
        dg.group_named(target_group)
            .map(|g| (g.state(), g.preferred()))
    }

    fn sessions(&self) -> Vec<SessionInfo> {
        self.fresh_stats();
        let mut v: Vec<SessionInfo> = self
            .registry
            .sessions()
            .into_iter()
            .map(|r| SessionInfo {
                fabric: ferrite_mgmt::runtime::Fabric::Iscsi,
                target: r.target,
                initiator: r.initiator,
                isid: r.isid,
                tsih: r.tsih,
                group: r.group,
                connections: r.connections,
                ..SessionInfo::default()
            })
            .collect();
        for s in &mut v {
            if let Some(io) = self.stats_board.session(s.tsih) {
                s.stats = crate::stats::to_mgmt(&io);
                s.latency = crate::stats::histograms(&io);
                s.active_commands = io.active;
            }
        }
        if let Ok(st) = self.state.lock() {
            for s in &mut v {
                if let Some(t) = st.targets.get(&s.target) {
                    let map = match &s.group {
                        Some(g) => t.groups.iter().find(|x| &x.name == g).map(|x| &x.luns),
                        None => Some(&t.luns),
                    };
                    s.lun_count = map.map_or(0, |m| m.luns.len() as u32);
                }
            }
            for (name, t) in &st.srp_targets {
                v.extend(crate::srp::sessions(name, t));
            }
        }
        v
    }

    fn close_session(&self, target: &str, initiator: &str, isid: u64) -> Result<(), RuntimeError> {
        {
            let st = self.lock()?;
            if let Some(t) = st.srp_targets.get(target) {
                if !t.board.request_close(initiator) {
                    return Err(RuntimeError::NotFound(format!(
                        "SRP nexus of {initiator} on {target}"
                    )));
                }
                // The snapshot wakes the cores; the owning one logs the
                // nexus's channels out (SRP_T_LOGOUT).
                self.publish(&st);
                return Ok(());
            }
        }
        let Some(tsih) = self.registry.find(target, initiator, isid) else {
            return Err(RuntimeError::NotFound(format!(
                "session of {initiator} (isid {isid:#014x}) on {target}"
            )));
        };
        for c in &self.cores {
            let _ = c.send(Msg::CloseSession(tsih));
        }
        Ok(())
    }

    fn stats(&self) -> Stats {
        self.fresh_stats();
        let (devices, targets) = self.stats_board.totals();
        let mut out = Stats::default();
        if let Ok(st) = self.state.lock() {
            for (name, (_, dev)) in &st.devices {
                let io = devices.get(&dev.id).copied().unwrap_or_default();
                out.devices.insert(name.clone(), crate::stats::to_mgmt(&io));
                out.latency
                    .insert(name.clone(), crate::stats::histograms(&io));
            }
            for name in st.targets.keys() {
                let io = targets.get(name).copied().unwrap_or_default();
                out.targets.insert(name.clone(), crate::stats::to_mgmt(&io));
            }
        }
        out.data_memory = self.budget.stats().into();
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferrite_mgmt::config::{Config, Handler, TargetGroupConfig};

    const TA: &str = "iqn.2026-11.org.example:a";
    const TB: &str = "iqn.2026-11.org.example:b";

    fn config() -> Config {
        let mut cfg = Config::default();
        for n in ["d0", "d1"] {
            let mut d = DeviceConfig::new(n, Handler::VdiskNullio);
            d.size = Some(1 << 20);
            cfg.devices.push(d);
        }
        cfg.targets.iscsi.push(IscsiTargetConfig::new(TA));
        let mut tb = IscsiTargetConfig::new(TB);
        tb.tpgt = 2;
        cfg.targets.iscsi.push(tb);
        let mut g = DeviceGroupConfig::new("dg1");
        g.devices.push("d0".into());
        let mut a = TargetGroupConfig::new("tg_a", 1);
        a.targets.push(TA.into());
        let mut b = TargetGroupConfig::new("tg_b", 2);
        b.targets.push(TB.into());
        g.target_groups = vec![a, b];
        cfg.device_groups.push(g);
        cfg.validate().expect("valid");
        cfg
    }

    fn group_of(rt: &DaemonRuntime, dev: &str) -> Option<Arc<DeviceGroup>> {
        let st = rt.state.lock().expect("lock");
        st.devices.get(dev).and_then(|(_, d)| d.alua().cloned())
    }

    #[test]
    fn groups_follow_configuration_changes_and_keep_their_states() {
        let dir = std::env::temp_dir().join(format!("ferrite-rt-alua-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let cfg = config();
        let sys = crate::system::System::build(&cfg, &dir).expect("system");
        let rt = DaemonRuntime::new(&sys, &cfg, Vec::new(), Arc::new(Registry::default()));
        let g0 = group_of(&rt, "d0").expect("d0 is in dg1");
        assert!(group_of(&rt, "d1").is_none());
        assert_eq!(g0.state_of_port(2), AccessState::ActiveOptimized);

        rt.set_alua_state("dg1", "tg_b", AccessState::Standby, true)
            .expect("set");
        assert_eq!(
            rt.alua_state("dg1", "tg_b"),
            Some((AccessState::Standby, true))
        );
        assert_eq!(g0.state_of_port(2), AccessState::Standby);
        assert!(dir.join("alua/dg1").exists());
        assert!(
            rt.set_alua_state("dg1", "nope", AccessState::Standby, true)
                .is_err()
        );

        // d1 joins: both devices in one new group that kept the state.
        let mut groups = cfg.device_groups.clone();
        groups[0].devices.push("d1".into());
        rt.set_device_groups(&groups).expect("join");
        let g1 = group_of(&rt, "d0").expect("d0");
        assert!(Arc::ptr_eq(&g1, &group_of(&rt, "d1").expect("d1")));
        assert_eq!(g1.state_of_port(2), AccessState::Standby);

        // The same shape again keeps the very group.
        rt.set_device_groups(&groups).expect("same");
        assert!(Arc::ptr_eq(&g1, &group_of(&rt, "d0").expect("d0")));

        // The target's relative port id moves with its tpgt; its target
        // group follows, and keeps its state.
        rt.set_target_attr(TB, &TargetAttr::Tpgt(7)).expect("tpgt");
        let g2 = group_of(&rt, "d0").expect("d0");
        assert_eq!(
            g2.group_named("tg_b").map(|g| g.ports.clone()),
            Some(vec![7])
        );
        assert_eq!(g2.state_of_port(7), AccessState::Standby);

        // A group the cluster decides is not set by hand, and stays so
        // when rebuilt.
        g2.set_explicit(false);
        assert!(matches!(
            rt.set_alua_state("dg1", "tg_b", AccessState::ActiveOptimized, false),
            Err(RuntimeError::Unsupported(_))
        ));
        let mut moved = groups.clone();
        moved[0].target_groups[0].group_id = 9;
        rt.set_device_groups(&moved).expect("reshape");
        assert!(!group_of(&rt, "d0").expect("d0").explicit());
        assert_eq!(g2.state_of_port(7), AccessState::Standby);

        // No groups: the devices leave, the saved states go.
        rt.set_device_groups(&[]).expect("none");
        assert!(group_of(&rt, "d0").is_none() && group_of(&rt, "d1").is_none());
        assert!(rt.alua_state("dg1", "tg_b").is_none());
        assert!(!dir.join("alua/dg1").exists());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
