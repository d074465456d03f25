//! Builds the running system from a configuration: backends, devices,
//! targets, and the snapshot that cores read.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use ferrite_blockio::{BlockBackend, BlockOptions};
use ferrite_core::backend::Backend;
use ferrite_core::device::{AccessGroup, Device, DeviceId, LunEntry, LunMap, Target};
use ferrite_fileio::{FileBackend, FileOptions};
use ferrite_iscsi::chap::{ChapAuth, ChapUser};
use ferrite_iscsi::conn::{GroupAuth, IscsiConfig, IscsiTarget};
use ferrite_iscsi::keys::Digest;
use ferrite_mgmt::config::Digest as ConfigDigest;
use ferrite_mgmt::config::{
    Config, DeviceConfig, Handler, IscsiParamsConfig, IscsiTargetConfig, LunConfig,
};
use ferrite_nullio::NullBackend;
use ferrite_scsi::Lun;

/// What every core reads: targets by name and the iSCSI settings.
#[derive(Debug)]
pub struct Snapshot {
    pub iscsi_targets: BTreeMap<String, Arc<Target>>,
    pub iscsi: Arc<IscsiConfig>,
    /// SRP target ports by name (`crate::srp`).
    pub srp_targets: BTreeMap<String, Arc<crate::srp::SrpTarget>>,
}

/// The devices and targets built from a configuration.
pub struct System {
    /// Where per-device state (persistent reservations) lives.
    pub state_dir: PathBuf,
    pub devices: BTreeMap<String, Arc<Device>>,
    /// ALUA device groups by name, with their configurations.
    pub device_groups: BTreeMap<
        String,
        (
            ferrite_mgmt::config::DeviceGroupConfig,
            Arc<ferrite_core::alua::DeviceGroup>,
        ),
    >,
    pub snapshot: Arc<Snapshot>,
    /// Every portal to listen on, with the targets reachable there.
    pub portals: Vec<SocketAddr>,
}

/// Persistent reservations of `dev` are saved under
/// `STATE_DIR/devices/NAME/` (APTPL, SPC-4 §5.13.5) and restored from there.
pub fn attach_pr_store(dev: &Device, state_dir: &Path) {
    let store = ferrite_core::pr::DirStore {
        dir: state_dir.join("devices").join(&dev.name),
    };
    match store.load() {
        Ok(Some(bytes)) => {
            if dev.restore_reservations(&bytes) {
                tracing::info!(device = %dev.name, "persistent reservations restored");
            } else {
                tracing::warn!(device = %dev.name, path = %store.path().display(),
                    "saved persistent reservations unreadable; starting without them");
            }
        }
        Ok(None) => {}
        Err(e) => {
            tracing::warn!(device = %dev.name, error = %e, "cannot read saved persistent reservations")
        }
    }
    dev.set_pr_store(Arc::new(store));
}

/// Opens the backend a device configuration names.
pub fn open_backend(d: &DeviceConfig) -> Result<Arc<dyn Backend>> {
    let backend: Arc<dyn Backend> = match d.handler {
        Handler::VdiskBlockio => {
            let path = d
                .filename
                .as_ref()
                .with_context(|| format!("device {}: filename is required", d.name))?;
            let opts = BlockOptions {
                block_size: Some(d.blocksize),
                read_only: d.read_only,
                create_size: d.size,
            };
            Arc::new(
                BlockBackend::open(path, opts)
                    .with_context(|| format!("device {}: opening {}", d.name, path.display()))?,
            )
        }
        Handler::VdiskFileio => {
            let path = d
                .filename
                .as_ref()
                .with_context(|| format!("device {}: filename is required", d.name))?;
            let opts = FileOptions {
                block_size: d.blocksize,
                create_size: d.size,
                read_only: d.read_only,
            };
            if let Some(dir) = path.parent()
                && d.size.is_some()
                && !dir.as_os_str().is_empty()
            {
                std::fs::create_dir_all(dir)
                    .with_context(|| format!("device {}: creating {}", d.name, dir.display()))?;
            }
            Arc::new(
                FileBackend::open(path, opts)
                    .with_context(|| format!("device {}: opening {}", d.name, path.display()))?,
            )
        }
        Handler::VdiskNullio => {
            let size = d.size.unwrap_or(1 << 30);
            let b = if d.mem {
                NullBackend::mem(size, d.blocksize)
            } else {
                NullBackend::new(size, d.blocksize)
            };
            Arc::new(b.with_context(|| format!("device {}", d.name))?)
        }
    };
    Ok(match &d.fault {
        Some(f) => {
            tracing::warn!(device = %d.name, rules = f.rules.len(), "fault injection configured");
            Arc::new(ferrite_nullio::fault::FaultBackend::new(
                backend,
                f.rules.iter().map(fault_rule).collect(),
            ))
        }
        None => backend,
    })
}

/// A configured fault rule as the fault-injection wrapper takes it.
fn fault_rule(r: &ferrite_mgmt::config::FaultRuleConfig) -> ferrite_nullio::fault::FaultRule {
    use ferrite_core::backend::BlockError;
    use ferrite_mgmt::config::{FaultError, FaultOp};
    use ferrite_nullio::fault::{FaultOps, FaultRule};
    FaultRule {
        ops: match r.op {
            FaultOp::Read => FaultOps::READ,
            FaultOp::Write => FaultOps::WRITE,
            FaultOp::Flush => FaultOps::FLUSH,
            FaultOp::Any => FaultOps::ANY,
        },
        lba: r.lba,
        blocks: r.blocks,
        error: r.error.map(|e| match e {
            FaultError::Eio => BlockError::Io,
            FaultError::Enospc => BlockError::NoSpace,
            FaultError::Offline => BlockError::Offline,
        }),
        delay: Duration::from_millis(r.delay_ms),
        after: r.after,
        count: r.count,
    }
}

fn lun_map(
    luns: &[LunConfig],
    devices: &BTreeMap<String, Arc<Device>>,
    at: &str,
) -> Result<Arc<LunMap>> {
    let mut map = LunMap::default();
    for l in luns {
        let Some(dev) = devices.get(&l.device) else {
            bail!("{at}: LUN {} names unknown device {}", l.lun, l.device);
        };
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

/// The iSCSI settings of a configuration.
pub fn iscsi_config(cfg: &Config, targets: &BTreeMap<String, Arc<Target>>) -> IscsiConfig {
    iscsi_config_from(&cfg.iscsi, &cfg.targets.iscsi, targets)
}

/// The iSCSI settings from the portal-independent parameters and the targets.
pub fn iscsi_config_from(
    p: &IscsiParamsConfig,
    target_cfgs: &[IscsiTargetConfig],
    targets: &BTreeMap<String, Arc<Target>>,
) -> IscsiConfig {
    let mut ic = IscsiConfig {
        max_recv_data_segment_length: p.max_recv_data_segment_length,
        max_burst_length: p.max_burst_length,
        first_burst_length: p.first_burst_length,
        immediate_data: p.immediate_data,
        initial_r2t: p.initial_r2t,
        max_outstanding_r2t: u32::from(p.max_outstanding_r2t),
        max_connections: p.max_connections,
        nop_in_interval: (p.nop_in_interval_s > 0)
            .then(|| Duration::from_secs(p.nop_in_interval_s as u64)),
        nop_in_timeout: Duration::from_secs(p.nop_in_timeout_s.max(1) as u64),
        login_timeout: Duration::from_secs(p.login_timeout_s.max(1) as u64),
        data_out_timeout: (p.data_out_timeout_s > 0)
            .then(|| Duration::from_secs(p.data_out_timeout_s as u64)),
        queue_depth: p.queue_depth,
        // RFC 7143 §13.1: HeaderDigest and DataDigest are negotiated on
        // their own lists (`digests` when a specific one is empty).
        digests: digest_list(p.header_digest_list()),
        data_digests: Some(digest_list(p.data_digest_list())),
        ..IscsiConfig::default()
    };
    ic.targets = target_cfgs
        .iter()
        .filter(|t| targets.get(&t.name).is_some_and(|t| t.enabled))
        .map(|t| IscsiTarget {
            name: t.name.clone(),
            alias: t.alias.clone(),
            tpgt: t.tpgt,
            portals: t.all_portal_addrs(),
            auth: chap_auth(&t.incoming_users, t.outgoing_user.as_ref()),
        })
        .collect();
    // CHAP per initiator group: in the order of the target's groups, as
    // the LUN map is chosen.
    ic.group_auth = target_cfgs
        .iter()
        .filter(|t| targets.get(&t.name).is_some_and(|t| t.enabled))
        .flat_map(|t| {
            t.ini_groups.iter().filter_map(move |g| {
                let users = t.group_incoming_users.get(&g.name)?;
                Some(GroupAuth {
                    target: t.name.clone(),
                    initiators: g.initiators.clone(),
                    incoming: chap_auth(users, None).incoming,
                })
            })
        })
        .collect();
    ic.discovery_auth = chap_auth(
        &p.discovery_incoming_users,
        p.discovery_outgoing_user.as_ref(),
    );
    ic
}

fn digest_list(list: &[ConfigDigest]) -> Vec<Digest> {
    list.iter()
        .map(|d| match d {
            ConfigDigest::Crc32c => Digest::Crc32c,
            ConfigDigest::Off => Digest::None,
        })
        .collect()
}

/// CHAP credentials as the iSCSI fabric takes them (validated by mgmt:
/// secrets of 12 to 255 bytes).
fn chap_auth(
    incoming: &[ferrite_mgmt::config::ChapUser],
    outgoing: Option<&ferrite_mgmt::config::ChapUser>,
) -> ChapAuth {
    let user = |u: &ferrite_mgmt::config::ChapUser| ChapUser {
        user: u.user.clone(),
        secret: u.secret.as_bytes().to_vec(),
    };
    ChapAuth {
        incoming: incoming.iter().map(user).collect(),
        outgoing: outgoing.map(user),
    }
}

impl System {
    /// Opens every device and builds every target.
    pub fn build(cfg: &Config, state_dir: &Path) -> Result<System> {
        cfg.validate().map_err(|e| anyhow::anyhow!("{e}"))?;
        // ALUA device groups first: the devices are built in theirs. Ports
        // are numbered as below (Config::rel_port_ids).
        let rel = cfg.rel_port_ids();
        let rel = |t: &str| rel.get(t).copied();
        let mut device_groups = BTreeMap::new();
        for g in &cfg.device_groups {
            let dg = crate::alua::build_group(g, &rel, state_dir, None);
            device_groups.insert(g.name.clone(), (g.clone(), dg));
        }
        let member = crate::alua::membership(&device_groups);
        let mut devices = BTreeMap::new();
        for (i, d) in cfg.devices.iter().enumerate() {
            let backend = open_backend(d)?;
            let dev = Device::new(
                DeviceId(i as u32),
                d.name.clone(),
                backend,
                d.identity(),
                d.flags(),
            )
            .with_alua(member.get(&d.name).cloned());
            tracing::info!(device = %d.name, handler = d.handler.name(),
                blocks = dev.geometry().num_blocks, block_size = dev.geometry().block_size, "device ready");
            attach_pr_store(&dev, state_dir);
            devices.insert(d.name.clone(), Arc::new(dev));
        }
        let mut targets = BTreeMap::new();
        let mut portals: Vec<SocketAddr> = Vec::new();
        for (i, t) in cfg.targets.iscsi.iter().enumerate() {
            let at = format!("targets.iscsi[{i}]");
            let mut groups = Vec::new();
            for g in &t.ini_groups {
                groups.push(AccessGroup {
                    name: g.name.clone(),
                    initiators: g.initiators.clone(),
                    luns: lun_map(&g.luns, &devices, &format!("{at}.ini_groups.{}", g.name))?,
                });
            }
            let target = Target {
                name: t.name.clone(),
                rel_port_id: t.rel_port_id(),
                enabled: t.enabled,
                luns: lun_map(&t.luns, &devices, &at)?,
                groups,
            };
            for p in t.portal_addrs() {
                if !portals.contains(&p) {
                    portals.push(p);
                }
            }
            targets.insert(t.name.clone(), Arc::new(target));
        }
        let iscsi = Arc::new(iscsi_config(cfg, &targets));
        let first_rel = targets.values().map(|t| usize::from(t.rel_port_id)).max();
        let srp_targets = srp_targets(cfg, &devices, first_rel.unwrap_or(0))?;
        Ok(System {
            state_dir: state_dir.to_path_buf(),
            devices,
            device_groups,
            snapshot: Arc::new(Snapshot {
                iscsi_targets: targets,
                iscsi,
                srp_targets,
            }),
            portals,
        })
    }
}

/// The SRP target ports of a configuration; a port without `rel_tgt_id`
/// takes a relative port id after the iSCSI targets' (the largest of which
/// is `first_rel`) so that VPD page 83h tells ports apart.
pub fn srp_targets(
    cfg: &Config,
    devices: &BTreeMap<String, Arc<Device>>,
    first_rel: usize,
) -> Result<BTreeMap<String, Arc<crate::srp::SrpTarget>>> {
    let mut out = BTreeMap::new();
    for (i, t) in cfg.targets.srp.iter().enumerate() {
        let at = format!("targets.srp[{i}]");
        let mut groups = Vec::new();
        for g in &t.ini_groups {
            groups.push(AccessGroup {
                name: g.name.clone(),
                initiators: g.initiators.clone(),
                luns: lun_map(&g.luns, devices, &format!("{at}.ini_groups.{}", g.name))?,
            });
        }
        let target = Arc::new(Target {
            name: t.name.clone(),
            rel_port_id: t
                .rel_tgt_id
                .unwrap_or_else(|| u16::try_from(first_rel + i + 1).unwrap_or(u16::MAX)),
            enabled: t.enabled,
            luns: lun_map(&t.luns, devices, &at)?,
            groups,
        });
        out.insert(t.name.clone(), Arc::new(crate::srp::srp_target(t, target)));
    }
    Ok(out)
}
