//! The seam between the management tree and the running system.
//!
//! The daemon implements [`Runtime`]; the tree calls it after a command has
//! been parsed and validated and before the change enters the model, so the
//! model never claims what the system refused. Calls are synchronous and run
//! on the management thread; the daemon turns them into messages to its cores.
//!
//! This module owns the trait and the plain data it exchanges; it knows
//! nothing about how the daemon carries a change out.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use ferrite_core::alua::AccessState;

use crate::config::{
    ChapUser, DeviceConfig, DeviceGroupConfig, IscsiParamsConfig, IscsiTargetConfig, LunConfig,
    SrpTargetConfig,
};

/// Why the running system refused or failed a change.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RuntimeError {
    /// The object the tree names does not exist in the running system (the
    /// model and the system disagree).
    #[error("{0} does not exist in the running system")]
    NotFound(String),
    /// The change is valid but this system cannot do it (e.g. a handler that
    /// is not built in).
    #[error("not supported: {0}")]
    Unsupported(String),
    /// The change was attempted and failed (cannot open a file, bind a
    /// portal...).
    #[error("{0}")]
    Failed(String),
}

/// A device attribute that can change while the device runs. Identity values
/// are effective ones: a derived serial is passed in full.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum DeviceAttr {
    ReadOnly(bool),
    WriteThrough(bool),
    NvCache(bool),
    Rotational(bool),
    Serial(String),
    T10Vendor(String),
    T10Product(String),
    T10Revision(String),
    /// Hex digits, as [`DeviceConfig::naa`].
    Naa(String),
    /// Hex digits, as [`DeviceConfig::eui64`].
    Eui64(String),
    /// The rest of the identity (empty: not set).
    T10Id(String),
    VendorSpecific(String),
    LuName(String),
    Vpd83(String),
    /// Resize to this many bytes (fileio: the file grows or shrinks; nullio:
    /// the capacity changes). The daemon raises CAPACITY DATA HAS CHANGED.
    Size(u64),
}

fn set(v: &str) -> Option<String> {
    (!v.is_empty()).then(|| v.to_string())
}

impl DeviceAttr {
    /// Sets the attribute in the running device's configuration `cfg`
    /// (identity values as given, the size as the new size).
    pub fn set_on(&self, cfg: &mut DeviceConfig) {
        match self {
            DeviceAttr::ReadOnly(v) => cfg.read_only = *v,
            DeviceAttr::WriteThrough(v) => cfg.write_through = *v,
            DeviceAttr::NvCache(v) => cfg.nv_cache = *v,
            DeviceAttr::Rotational(v) => cfg.rotational = *v,
            DeviceAttr::Serial(v) => cfg.serial = Some(v.clone()),
            DeviceAttr::T10Vendor(v) => cfg.t10_vendor = Some(v.clone()),
            DeviceAttr::T10Product(v) => cfg.t10_product = Some(v.clone()),
            DeviceAttr::T10Revision(v) => cfg.t10_revision = Some(v.clone()),
            DeviceAttr::Naa(v) => cfg.naa = Some(v.clone()),
            DeviceAttr::Eui64(v) => cfg.eui64 = Some(v.clone()),
            DeviceAttr::T10Id(v) => cfg.t10_id = set(v),
            DeviceAttr::VendorSpecific(v) => cfg.vendor_specific = set(v),
            DeviceAttr::LuName(v) => cfg.lu_name = set(v),
            DeviceAttr::Vpd83(v) => cfg.vpd83 = set(v),
            DeviceAttr::Size(v) => cfg.size = Some(*v),
        }
    }
}

/// A target attribute that can change while the target runs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum TargetAttr {
    /// The whole list of listening addresses, replaced.
    Portals(Vec<String>),
    Tpgt(u16),
    Alias(Option<String>),
    /// CHAP: the whole list of initiator credentials, replaced (empty: no
    /// authentication).
    IncomingUsers(Vec<ChapUser>),
    /// Mutual CHAP: the target's credentials.
    OutgoingUser(Option<ChapUser>),
}

/// Operation counters, monotonic since the object was created.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct IoStats {
    pub read_cmds: u64,
    pub write_cmds: u64,
    pub other_cmds: u64,
    pub read_bytes: u64,
    pub write_bytes: u64,
    /// Commands that completed with CHECK CONDITION or were aborted.
    pub errors: u64,
}

/// Statistics of the whole system.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Stats {
    /// Per device name.
    pub devices: BTreeMap<String, IoStats>,
    /// Per target name.
    pub targets: BTreeMap<String, IoStats>,
    /// Per device name: command latency histograms, one per (direction,
    /// size class) that saw a command. Empty until the core measures.
    pub latency: BTreeMap<String, Vec<LatencyHistogram>>,
    /// The data budget: limit, use, high-water mark, waiting commands.
    pub data_memory: DataMemoryStats,
}

/// The data budget of the daemon ([`ferrite_core::budget::DataBudget`]),
/// in bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct DataMemoryStats {
    pub limit: u64,
    pub used: u64,
    pub peak: u64,
    /// Sessions holding data buffers.
    pub holders: u32,
    /// Commands waiting for memory now.
    pub waiting: u64,
    /// Commands that ever waited.
    pub waits: u64,
}

impl From<ferrite_core::budget::BudgetStats> for DataMemoryStats {
    fn from(b: ferrite_core::budget::BudgetStats) -> Self {
        DataMemoryStats {
            limit: b.limit,
            used: b.used,
            peak: b.peak,
            holders: b.holders,
            waiting: b.waiting,
            waits: b.waits,
        }
    }
}

/// Upper bounds, in microseconds, of the latency buckets of
/// [`LatencyHistogram::new`]; a last, unbounded bucket follows. A histogram
/// carries its own bounds, so a producer may use others (the daemon passes
/// the core's powers of two).
pub const LATENCY_BOUNDS_US: [u64; 16] = [
    10, 25, 50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000,
    500_000, 1_000_000,
];

/// Transfer size classes: (label, largest transfer in bytes). A transfer
/// larger than every bound is in [`SIZE_CLASS_LARGE`].
pub const SIZE_CLASSES: [(&str, u64); 3] = [("4k", 4096), ("64k", 65536), ("1m", 1_048_576)];

/// The class of transfers above 1 MiB.
pub const SIZE_CLASS_LARGE: &str = "large";

/// The size class label of a transfer of `bytes` bytes (0 for commands
/// without data: class "4k").
pub fn size_class(bytes: u64) -> &'static str {
    SIZE_CLASSES
        .iter()
        .find(|(_, max)| bytes <= *max)
        .map_or(SIZE_CLASS_LARGE, |(l, _)| l)
}

/// Direction of the commands a histogram measures.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum IoDir {
    Read,
    Write,
    /// Commands that move no data or are neither reads nor writes.
    #[default]
    Other,
}

impl IoDir {
    pub fn as_str(self) -> &'static str {
        match self {
            IoDir::Read => "read",
            IoDir::Write => "write",
            IoDir::Other => "other",
        }
    }
}

/// Latency of the commands of one direction and size class on one device,
/// from arrival in the core to status sent, in microseconds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct LatencyHistogram {
    pub dir: IoDir,
    /// One of the labels of [`SIZE_CLASSES`] or [`SIZE_CLASS_LARGE`].
    pub size_class: String,
    /// Bucket upper bounds in microseconds, strictly ascending (for example
    /// [`LATENCY_BOUNDS_US`]).
    pub bounds_us: Vec<u64>,
    /// Commands per bucket, not cumulative: `counts[i]` took at most
    /// `bounds_us[i]` and more than `bounds_us[i-1]`; the last entry
    /// (`counts.len() == bounds_us.len() + 1`) counts those above every bound.
    pub counts: Vec<u64>,
    /// Sum of all latencies, microseconds.
    pub sum_us: u64,
}

impl Default for LatencyHistogram {
    fn default() -> Self {
        LatencyHistogram::new(IoDir::Other, size_class(0))
    }
}

impl LatencyHistogram {
    /// An empty histogram with the standard bounds.
    pub fn new(dir: IoDir, size_class: &str) -> LatencyHistogram {
        LatencyHistogram {
            dir,
            size_class: size_class.to_string(),
            bounds_us: LATENCY_BOUNDS_US.to_vec(),
            counts: vec![0; LATENCY_BOUNDS_US.len() + 1],
            sum_us: 0,
        }
    }

    /// Counts one command that took `us` microseconds.
    pub fn record(&mut self, us: u64) {
        let i = self.bounds_us.partition_point(|b| *b < us);
        if self.counts.len() != self.bounds_us.len() + 1 {
            self.counts.resize(self.bounds_us.len() + 1, 0);
        }
        if let Some(c) = self.counts.get_mut(i) {
            *c += 1;
        }
        self.sum_us = self.sum_us.saturating_add(us);
    }

    /// Adds another histogram with the same bounds (false, nothing added:
    /// the bounds differ).
    pub fn merge(&mut self, other: &LatencyHistogram) -> bool {
        if self.bounds_us != other.bounds_us || self.counts.len() != other.counts.len() {
            return false;
        }
        for (a, b) in self.counts.iter_mut().zip(&other.counts) {
            *a += b;
        }
        self.sum_us = self.sum_us.saturating_add(other.sum_us);
        true
    }

    /// Number of commands measured.
    pub fn count(&self) -> u64 {
        self.counts.iter().sum()
    }

    /// The `q`-quantile (0..=1) as the upper bound of the bucket holding it,
    /// in microseconds; `None` when empty, or when it lies in the unbounded
    /// bucket (then it is above the last bound).
    pub fn percentile(&self, q: f64) -> Option<u64> {
        let n = self.count();
        if n == 0 {
            return None;
        }
        let q = q.clamp(0.0, 1.0);
        // The rank of the quantile among the n samples, 1-based.
        let rank = ((q * n as f64).ceil() as u64).max(1);
        let mut seen = 0;
        for (i, c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                return self.bounds_us.get(i).copied();
            }
        }
        None
    }
}

/// The fabric a session came in on.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Fabric {
    #[default]
    Iscsi,
    Srp,
}

impl Fabric {
    pub fn as_str(self) -> &'static str {
        match self {
            Fabric::Iscsi => "iscsi",
            Fabric::Srp => "srp",
        }
    }
}

/// One I_T nexus as the daemon reports it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct SessionInfo {
    /// iSCSI or SRP.
    pub fabric: Fabric,
    /// Target name (iSCSI: the IQN; SRP: the target port's object name).
    pub target: String,
    /// Initiator name (iSCSI: the IQN; SRP: the initiator port identifier
    /// as `0x` and 32 hex digits, as ib_srpt names its sessions).
    pub initiator: String,
    /// RFC 7143 §11.12.5: the 6-byte ISID, as a number.
    pub isid: u64,
    /// Target session identifying handle.
    pub tsih: u16,
    /// The initiator group whose LUN map the session got; `None`: the
    /// target's default map.
    pub group: Option<String>,
    /// The session's connections (iSCSI: peer addresses; SRP: its RDMA
    /// channels, one entry each: provider, core and queue pair number).
    pub connections: Vec<String>,
    /// LUNs in the session's map.
    pub lun_count: u32,
    /// Commands in the task sets now.
    pub active_commands: u64,
    pub stats: IoStats,
    /// Command latency histograms of this session, as in [`Stats::latency`]
    /// (empty until the core measures).
    pub latency: Vec<LatencyHistogram>,
}

/// What the management tree needs from the running system. Object-safe and
/// synchronous: the daemon runs it on the management thread.
///
/// The tree holds its lock while it calls these methods: an implementation
/// must not call back into the tree (or the control socket) from them.
///
/// Every method is called only after the tree validated the change against
/// the whole configuration, so an implementation may assume names exist,
/// LUN numbers are in range and unique and devices referenced by a map
/// exist. Map changes always carry the whole new map; the daemon computes
/// the unit attentions (REPORTED LUNS DATA HAS CHANGED) from the difference.
pub trait Runtime: Send + Sync {
    /// Opens the backend and registers the device (not yet in any map).
    fn add_device(&self, dev: &DeviceConfig) -> Result<(), RuntimeError>;
    /// Unregisters a device that no map uses any more.
    fn del_device(&self, name: &str) -> Result<(), RuntimeError>;
    /// Changes one attribute of a running device.
    fn set_device_attr(&self, name: &str, attr: &DeviceAttr) -> Result<(), RuntimeError>;
    /// Re-reads the backing file's or device's size; returns it in bytes.
    fn resync_size(&self, name: &str) -> Result<u64, RuntimeError>;
    /// The device's current size in bytes.
    fn device_size(&self, name: &str) -> Result<u64, RuntimeError>;

    /// Creates a disabled target with no LUN and no group; portals, tpgt,
    /// alias and CHAP credentials are taken from `target`, maps and
    /// `enabled` are not.
    fn add_target(&self, target: &IscsiTargetConfig) -> Result<(), RuntimeError>;
    /// Closes the target's sessions and removes it.
    fn del_target(&self, name: &str) -> Result<(), RuntimeError>;
    /// Accepts (true) or refuses (false) new sessions; disabling also
    /// closes the running ones, as SCST does.
    fn set_target_enabled(&self, name: &str, enabled: bool) -> Result<(), RuntimeError>;
    fn set_target_attr(&self, name: &str, attr: &TargetAttr) -> Result<(), RuntimeError>;

    /// Creates an empty initiator group.
    fn add_group(&self, target: &str, group: &str) -> Result<(), RuntimeError>;
    /// Removes a group; its sessions fall back to the default map.
    fn del_group(&self, target: &str, group: &str) -> Result<(), RuntimeError>;
    /// Replaces a group's initiator patterns.
    fn set_group_initiators(
        &self,
        target: &str,
        group: &str,
        initiators: &[String],
    ) -> Result<(), RuntimeError>;
    /// Replaces a whole LUN map: the target's default map (`group` None) or
    /// a group's.
    fn set_lun_map(
        &self,
        target: &str,
        group: Option<&str>,
        luns: &[LunConfig],
    ) -> Result<(), RuntimeError>;

    /// Adds, changes or (`target` None) removes the SRP target port
    /// `name`; `target` is the port's whole new configuration, LUN maps and
    /// initiator groups included. A new port listens before this returns;
    /// a removed or disabled port logs its channels out (SRP_T_LOGOUT); a
    /// changed map reaches logged-in channels as for iSCSI (unit attention
    /// and SRP_AER_REQ REPORTED LUNS DATA HAS CHANGED).
    fn set_srp_target(
        &self,
        name: &str,
        target: Option<&SrpTargetConfig>,
    ) -> Result<(), RuntimeError>;

    /// New portal-independent iSCSI settings (negotiation limits, timers,
    /// digests, discovery CHAP), for logins from now on.
    fn set_iscsi_params(&self, params: &IscsiParamsConfig) -> Result<(), RuntimeError>;

    /// A new limit, in bytes, for the data memory budget every command's
    /// buffers come out of (`reactor.data_memory_mb`; the tree passes the
    /// default in bytes when it is unset). Buffers already held stay;
    /// commands waiting for memory are served once they fit the new limit.
    fn set_data_memory(&self, limit: u64) -> Result<(), RuntimeError>;

    /// Replaces the ALUA device groups (SPC-4 §5.15) by `groups`, which
    /// name devices and targets that exist. Target port groups that stay
    /// (same device group and name) keep their runtime state and preferred
    /// bit, whatever `groups` says; new ones start as configured, or as
    /// last saved under the state directory. Devices that join or leave a
    /// group are republished to the cores.
    fn set_device_groups(&self, groups: &[DeviceGroupConfig]) -> Result<(), RuntimeError>;

    /// Moves the target port group `target_group` of `group` to `state`
    /// with the preferred bit `preferred`, as an implicit transition: the
    /// state is saved, then initiators get ASYMMETRIC ACCESS STATE
    /// CHANGED.
    fn set_alua_state(
        &self,
        group: &str,
        target_group: &str,
        state: AccessState,
        preferred: bool,
    ) -> Result<(), RuntimeError>;

    /// The live state and preferred bit of a target port group (SET
    /// TARGET PORT GROUPS from an initiator may have changed them); `None`
    /// when the running system has no such group.
    fn alua_state(&self, group: &str, target_group: &str) -> Option<(AccessState, bool)>;

    /// The sessions now logged in.
    fn sessions(&self) -> Vec<SessionInfo>;
    /// Closes one session (SCST's `force_close`).
    fn close_session(&self, target: &str, initiator: &str, isid: u64) -> Result<(), RuntimeError>;
    /// Counters.
    fn stats(&self) -> Stats;
}

/// A [`Runtime`] that records calls and can be told to fail: a test double
/// for the tree, the control socket and the daemon's own tests. It runs
/// nothing.
#[derive(Debug, Default)]
pub struct FakeRuntime {
    calls: std::sync::Mutex<Vec<String>>,
    /// A call whose record starts with this string fails.
    fail_on: std::sync::Mutex<Option<String>>,
    sessions: std::sync::Mutex<Vec<SessionInfo>>,
    stats: std::sync::Mutex<Stats>,
    /// Live ALUA states by (device group, target group).
    alua: std::sync::Mutex<BTreeMap<(String, String), (AccessState, bool)>>,
}

impl FakeRuntime {
    pub fn new() -> FakeRuntime {
        FakeRuntime::default()
    }

    /// The calls so far, one line each (`add_device disk0`, `set_lun_map t - 0=d`).
    pub fn calls(&self) -> Vec<String> {
        self.calls.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Forgets the recorded calls.
    pub fn clear_calls(&self) {
        self.calls.lock().unwrap_or_else(|e| e.into_inner()).clear();
    }

    /// Makes calls whose record starts with `prefix` fail (None: none fail).
    pub fn fail_on(&self, prefix: Option<&str>) {
        *self.fail_on.lock().unwrap_or_else(|e| e.into_inner()) = prefix.map(str::to_string);
    }

    /// Sets what [`Runtime::sessions`] reports.
    pub fn set_sessions(&self, s: Vec<SessionInfo>) {
        *self.sessions.lock().unwrap_or_else(|e| e.into_inner()) = s;
    }

    /// Sets what [`Runtime::stats`] reports.
    pub fn set_stats(&self, s: Stats) {
        *self.stats.lock().unwrap_or_else(|e| e.into_inner()) = s;
    }

    /// Changes a live ALUA state as an initiator's SET TARGET PORT GROUPS
    /// would, without a call record.
    pub fn set_live_alua(&self, group: &str, target_group: &str, state: AccessState, pref: bool) {
        self.alua
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert((group.into(), target_group.into()), (state, pref));
    }

    fn record(&self, call: String) -> Result<(), RuntimeError> {
        let fail = self
            .fail_on
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_deref()
            .is_some_and(|p| call.starts_with(p));
        if fail {
            return Err(RuntimeError::Failed(format!("injected failure: {call}")));
        }
        self.calls
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(call);
        Ok(())
    }
}

impl Runtime for FakeRuntime {
    fn add_device(&self, dev: &DeviceConfig) -> Result<(), RuntimeError> {
        self.record(format!("add_device {} {}", dev.name, dev.handler))
    }
    fn del_device(&self, name: &str) -> Result<(), RuntimeError> {
        self.record(format!("del_device {name}"))
    }
    fn set_device_attr(&self, name: &str, attr: &DeviceAttr) -> Result<(), RuntimeError> {
        self.record(format!("set_device_attr {name} {attr:?}"))
    }
    fn resync_size(&self, name: &str) -> Result<u64, RuntimeError> {
        self.record(format!("resync_size {name}"))?;
        Ok(2 << 30)
    }
    fn device_size(&self, _name: &str) -> Result<u64, RuntimeError> {
        Ok(1 << 30)
    }
    fn add_target(&self, target: &IscsiTargetConfig) -> Result<(), RuntimeError> {
        self.record(format!("add_target {}", target.name))
    }
    fn del_target(&self, name: &str) -> Result<(), RuntimeError> {
        self.record(format!("del_target {name}"))
    }
    fn set_target_enabled(&self, name: &str, enabled: bool) -> Result<(), RuntimeError> {
        self.record(format!("set_target_enabled {name} {enabled}"))
    }
    fn set_target_attr(&self, name: &str, attr: &TargetAttr) -> Result<(), RuntimeError> {
        self.record(format!("set_target_attr {name} {attr:?}"))
    }
    fn add_group(&self, target: &str, group: &str) -> Result<(), RuntimeError> {
        self.record(format!("add_group {target} {group}"))
    }
    fn del_group(&self, target: &str, group: &str) -> Result<(), RuntimeError> {
        self.record(format!("del_group {target} {group}"))
    }
    fn set_group_initiators(
        &self,
        target: &str,
        group: &str,
        initiators: &[String],
    ) -> Result<(), RuntimeError> {
        self.record(format!(
            "set_group_initiators {target} {group} {}",
            initiators.join(",")
        ))
    }
    fn set_lun_map(
        &self,
        target: &str,
        group: Option<&str>,
        luns: &[LunConfig],
    ) -> Result<(), RuntimeError> {
        let mut v: Vec<String> = luns
            .iter()
            .map(|l| format!("{}={}", l.lun, l.device))
            .collect();
        v.sort();
        self.record(format!(
            "set_lun_map {target} {} {}",
            group.unwrap_or("-"),
            v.join(",")
        ))
    }
    fn set_iscsi_params(&self, _params: &IscsiParamsConfig) -> Result<(), RuntimeError> {
        self.record("set_iscsi_params".into())
    }
    fn set_data_memory(&self, limit: u64) -> Result<(), RuntimeError> {
        self.record(format!("set_data_memory {limit}"))?;
        self.stats
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .data_memory
            .limit = limit;
        Ok(())
    }
    fn set_srp_target(
        &self,
        name: &str,
        target: Option<&SrpTargetConfig>,
    ) -> Result<(), RuntimeError> {
        match target {
            None => self.record(format!("set_srp_target {name} -")),
            Some(t) => {
                let mut v: Vec<String> = t
                    .luns
                    .iter()
                    .map(|l| format!("{}={}", l.lun, l.device))
                    .collect();
                v.sort();
                let groups: Vec<String> = t
                    .ini_groups
                    .iter()
                    .map(|g| {
                        let mut m: Vec<String> = g
                            .luns
                            .iter()
                            .map(|l| format!("{}={}", l.lun, l.device))
                            .collect();
                        m.sort();
                        format!("{}[{}]({})", g.name, g.initiators.join(","), m.join(","))
                    })
                    .collect();
                self.record(format!(
                    "set_srp_target {name} enabled={} luns={} groups={}",
                    t.enabled,
                    v.join(","),
                    groups.join(";")
                ))
            }
        }
    }
    fn set_device_groups(&self, groups: &[DeviceGroupConfig]) -> Result<(), RuntimeError> {
        let shown: Vec<String> = groups
            .iter()
            .map(|g| {
                let tgs: Vec<String> = g
                    .target_groups
                    .iter()
                    .map(|t| format!("{}={}[{}]", t.name, t.group_id, t.targets.join(",")))
                    .collect();
                format!("{}({};{})", g.name, g.devices.join(","), tgs.join(";"))
            })
            .collect();
        self.record(format!("set_device_groups {}", shown.join(" ")))?;
        let mut live = self.alua.lock().unwrap_or_else(|e| e.into_inner());
        let mut next = BTreeMap::new();
        for g in groups {
            for t in &g.target_groups {
                let key = (g.name.clone(), t.name.clone());
                let v = live
                    .get(&key)
                    .copied()
                    .unwrap_or((t.access_state(), t.preferred));
                next.insert(key, v);
            }
        }
        *live = next;
        Ok(())
    }
    fn set_alua_state(
        &self,
        group: &str,
        target_group: &str,
        state: AccessState,
        preferred: bool,
    ) -> Result<(), RuntimeError> {
        self.record(format!(
            "set_alua_state {group} {target_group} {state} {}",
            u8::from(preferred)
        ))?;
        self.set_live_alua(group, target_group, state, preferred);
        Ok(())
    }
    fn alua_state(&self, group: &str, target_group: &str) -> Option<(AccessState, bool)> {
        self.alua
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&(group.to_string(), target_group.to_string()))
            .copied()
    }
    fn sessions(&self) -> Vec<SessionInfo> {
        self.sessions
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
    fn close_session(&self, target: &str, initiator: &str, isid: u64) -> Result<(), RuntimeError> {
        self.record(format!("close_session {target} {initiator} {isid:#x}"))
    }
    fn stats(&self) -> Stats {
        self.stats.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn size_classes_cover_every_size() {
        assert_eq!(size_class(0), "4k");
        assert_eq!(size_class(4096), "4k");
        assert_eq!(size_class(4097), "64k");
        assert_eq!(size_class(1 << 20), "1m");
        assert_eq!(size_class((1 << 20) + 1), SIZE_CLASS_LARGE);
    }

    #[test]
    fn histogram_buckets_sum_and_percentiles() {
        let mut h = LatencyHistogram::new(IoDir::Read, "4k");
        assert_eq!(h.percentile(0.5), None);
        for us in [5, 10, 11, 90, 2_000_000] {
            h.record(us);
        }
        assert_eq!(h.count(), 5);
        assert_eq!(h.sum_us, 5 + 10 + 11 + 90 + 2_000_000);
        assert_eq!(h.counts[0], 2, "5 and 10 are <= 10");
        assert_eq!(h.counts[1], 1, "11 is <= 25");
        assert_eq!(h.counts[3], 1, "90 is <= 100");
        assert_eq!(h.counts[LATENCY_BOUNDS_US.len()], 1, "above every bound");
        assert_eq!(h.percentile(0.0), Some(10));
        assert_eq!(h.percentile(0.5), Some(25));
        assert_eq!(h.percentile(0.8), Some(100));
        assert_eq!(h.percentile(1.0), None, "the maximum is unbounded");
        let mut g = LatencyHistogram::new(IoDir::Read, "4k");
        assert!(g.merge(&h));
        assert!(g.merge(&h));
        assert_eq!(g.count(), 10);
        let mut odd = LatencyHistogram::new(IoDir::Read, "4k");
        odd.bounds_us.pop();
        assert!(!odd.merge(&h), "different bounds do not merge");
    }

    #[test]
    fn stats_without_latency_still_parse() {
        let s: Stats = serde_json::from_str(r#"{"devices":{"d":{"read_cmds":3}}}"#).unwrap();
        assert_eq!(s.devices["d"].read_cmds, 3);
        assert!(s.latency.is_empty());
    }
}
