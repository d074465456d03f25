//! Devices (logical units), LUN maps, access groups and targets: the
//! read-mostly configuration that cores see as `Arc` snapshots.
//!
//! Writers (management) build a new snapshot and send it to every core by
//! message; a core never blocks on configuration.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU32, AtomicU64, AtomicUsize, Ordering};

use ferrite_scsi::Lun;

use crate::backend::{Backend, Geometry};
use crate::pr::{PrNexus, PrState, PrStore};

/// Bumped by every [`Device::set_num_blocks`] in the process: one load tells
/// a core whether any device's capacity moved since it last looked
/// ([`capacity_epoch`]), so it scans its sessions only after a resize.
static CAPACITY_EPOCH: AtomicU64 = AtomicU64::new(0);

/// The process-wide capacity epoch: changes whenever some device's
/// capacity does.
pub fn capacity_epoch() -> u64 {
    CAPACITY_EPOCH.load(Ordering::Acquire)
}

/// What a fabric can tell about an I_T nexus's transport from any thread,
/// before its own event loop has seen the loss and closed the session.
///
/// State one nexus holds against the others (an SPC-2 reservation, a
/// prevention of medium removal) ends with I_T nexus loss. The fabric
/// closes the session when its core reads the loss, but that core may be
/// busy while another one already serves the initiator's next session: a
/// command there that meets the held state asks the holder's watch, and a
/// nexus whose transport is gone holds nothing.
pub trait NexusWatch: Send + Sync + std::fmt::Debug {
    /// True once the initiator's side of the nexus is gone (its connection
    /// closed or reset), whether or not the session is closed yet.
    fn gone(&self) -> bool;
}

/// A nexus's watch, if its fabric gives one.
pub type Watch = Option<Arc<dyn NexusWatch>>;

fn is_gone(w: &Watch) -> bool {
    w.as_ref().is_some_and(|w| w.gone())
}

/// Process-wide identifier of a device; indexes per-core backend queues.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DeviceId(pub u32);

/// SCSI identity of a device (INQUIRY, VPD 80h and 83h): every field is
/// configuration, so a device moved from another target keeps the bytes
/// its initiators know it by.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Identity {
    /// T10 vendor identification, at most 8 ASCII characters.
    pub vendor: String,
    /// Product identification, at most 16 ASCII characters.
    pub product: String,
    /// Product revision level, at most 4 ASCII characters.
    pub revision: String,
    /// Vendor specific bytes 36..56 of the standard INQUIRY data, at most
    /// 20 ASCII characters; empty leaves them zero.
    pub vendor_specific: String,
    /// Unit serial number (VPD 80h).
    pub serial: String,
    /// Vendor specific identifier of the T10 vendor ID based designator,
    /// after the vendor; empty uses the serial (or the device name).
    pub t10_id: String,
    /// NAA designator: 8 bytes (NAA 2, 3 or 5) or 16 (NAA 6); empty for
    /// none.
    pub naa: Vec<u8>,
    /// EUI-64 based designator: 8, 12 or 16 bytes; empty for none.
    pub eui64: Vec<u8>,
    /// SCSI name string of the logical unit; empty for none.
    pub lu_name: String,
    /// The designators of VPD 83h in order; empty is [`Vpd83::DEFAULT`].
    pub layout: Vec<Vpd83>,
}

/// One entry of a device's VPD 83h layout. A designator whose value is
/// not set (no NAA, no EUI-64, no name) is left out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Vpd83 {
    Naa,
    T10,
    /// The T10 vendor ID based designator ending in a NUL that its length
    /// counts (as LIO reports it).
    T10Nul,
    Eui64,
    LuName,
    /// Relative target port of the port the command came through.
    RelPort,
    /// A target port group designator with this group.
    PortGroup(u16),
    /// A logical unit group designator with this group.
    LuGroup(u16),
    /// SCSI name string of the target port.
    PortName,
    /// SCSI name string of the target device.
    TargetName,
    /// Not a designator: the port and target designators carry no
    /// protocol identifier (PIV 0), as SCST reports them.
    NoPiv,
}

impl Vpd83 {
    /// The layout of a device that configures none.
    pub const DEFAULT: [Vpd83; 5] = [
        Vpd83::Naa,
        Vpd83::T10,
        Vpd83::Eui64,
        Vpd83::RelPort,
        Vpd83::TargetName,
    ];

    /// The configuration word of this entry (`naa`, `port_group=1`, ...).
    pub fn word(self) -> String {
        match self {
            Vpd83::Naa => "naa".into(),
            Vpd83::T10 => "t10".into(),
            Vpd83::T10Nul => "t10_nul".into(),
            Vpd83::Eui64 => "eui64".into(),
            Vpd83::LuName => "lu_name".into(),
            Vpd83::RelPort => "rel_port".into(),
            Vpd83::PortGroup(g) => format!("port_group={g}"),
            Vpd83::LuGroup(g) => format!("lu_group={g}"),
            Vpd83::PortName => "port_name".into(),
            Vpd83::TargetName => "target_name".into(),
            Vpd83::NoPiv => "no_piv".into(),
        }
    }

    /// Parses one configuration word; `None` names nothing known.
    pub fn parse(w: &str) -> Option<Vpd83> {
        let group = |v: &str| v.parse::<u16>().ok();
        Some(match w {
            "naa" => Vpd83::Naa,
            "t10" => Vpd83::T10,
            "t10_nul" => Vpd83::T10Nul,
            "no_piv" => Vpd83::NoPiv,
            "eui64" => Vpd83::Eui64,
            "lu_name" => Vpd83::LuName,
            "rel_port" => Vpd83::RelPort,
            "port_name" => Vpd83::PortName,
            "target_name" => Vpd83::TargetName,
            _ => {
                if let Some(v) = w.strip_prefix("port_group=") {
                    Vpd83::PortGroup(group(v)?)
                } else if let Some(v) = w.strip_prefix("lu_group=") {
                    Vpd83::LuGroup(group(v)?)
                } else {
                    return None;
                }
            }
        })
    }
}

/// Per-device settings an operator may change.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DeviceFlags {
    pub read_only: bool,
    pub write_through: bool,
    pub thin_provisioned: bool,
    pub rotational: bool,
    /// Ignore flushes (battery-backed cache), like SCST's nv_cache.
    pub nv_cache: bool,
    /// Removable medium (INQUIRY RMB = 1), like SCST's vdisk `removable`:
    /// START STOP UNIT with LOEJ ejects and loads it, PREVENT ALLOW MEDIUM
    /// REMOVAL holds it in (SBC-4 §4.15).
    pub removable: bool,
}

/// A logical unit: a name, a backend, an identity and settings.
pub struct Device {
    pub id: DeviceId,
    pub name: String,
    pub backend: Arc<dyn Backend>,
    pub identity: Identity,
    pub flags: DeviceFlags,
    /// Current number of blocks; changes on resize.
    num_blocks: AtomicU64,
    /// Bumped on every capacity change; cores compare it to raise CAPACITY
    /// DATA HAS CHANGED.
    generation: AtomicU32,
    block_size: u32,
    phys_exp: u8,
    /// State every core shares: reservations and the ranges COMPARE AND
    /// WRITE and ORWRITE hold.
    /// State that outlives a change of settings (reservations, range locks,
    /// mode parameters): shared by every `Device` value of this LU.
    pub(crate) shared: Arc<DeviceShared>,
    /// The ALUA device group this device belongs to, if any.
    alua: Option<Arc<crate::alua::DeviceGroup>>,
}

/// The per-device state that commands on every core must agree on. Both
/// parts have a lock-free fast path (an atomic read) for the common case
/// where nothing is reserved or held; the mutexes are taken only by the
/// commands that reserve or hold, and by commands that meet a reservation
/// or a held range.
#[derive(Debug, Default)]
pub(crate) struct DeviceShared {
    /// Set while `holder` is `Some`.
    reserved: AtomicBool,
    /// SPC-2 §5.5.1 RESERVE(6)/(10): the I_T nexus holding the logical
    /// unit, and its watch.
    holder: Mutex<Option<(String, Watch)>>,
    pub(crate) ranges: RangeLocks,
    /// SPC-4 persistent reservations.
    pub(crate) pr: Mutex<PrState>,
    /// Set while a persistent reservation exists (conflict checks).
    pub(crate) pr_reserved: AtomicBool,
    /// Unit attentions PERSISTENT RESERVE OUT raised for nexuses on any
    /// core, collected by each nexus's next command.
    pub(crate) pr_ua: Mutex<Vec<(PrNexus, ferrite_scsi::Sense)>>,
    pub(crate) pr_ua_count: AtomicUsize,
    /// Where the APTPL state is saved.
    pub(crate) pr_store: Mutex<Option<Arc<dyn PrStore>>>,
    /// Control mode page bits MODE SELECT changed: [`MODE_D_SENSE`],
    /// [`MODE_SWP`].
    pub(crate) mode: AtomicU8,
    /// Bumped by every MODE SELECT that changes a value; each nexus
    /// compares it with the last it saw to raise MODE PARAMETERS CHANGED.
    pub(crate) mode_gen: AtomicU32,
    /// Bumped by every LOGICAL UNIT RESET; each nexus, on any core,
    /// compares it with the last it saw to raise BUS DEVICE RESET FUNCTION
    /// OCCURRED (SAM-5 §6.3.3) without a message between cores.
    pub(crate) reset_gen: AtomicU32,
    /// SBC-4 §4.11: a sanitize operation running or failed.
    pub(crate) sanitize: crate::sanitize::SanitizeShared,
    /// SBC-4 §4.15: the removable medium, loaded or ejected, and who
    /// prevents its removal.
    pub(crate) medium: Medium,
}

/// The medium of a removable logical unit (SBC-4 §4.15), shared by every
/// core. Commands read `ejected` (one atomic load, only on removable
/// devices); the mutex is taken by PREVENT ALLOW MEDIUM REMOVAL, START STOP
/// UNIT with LOEJ, resets and I_T nexus loss.
#[derive(Debug, Default)]
pub(crate) struct Medium {
    ejected: AtomicBool,
    /// SBC-4 §5.13: the I_T nexuses (session tokens, see
    /// [`crate::shard`]) that set PREVENT = 01b, with their watches;
    /// removal is prevented while any does whose transport stands.
    holders: Mutex<Vec<(u64, Watch)>>,
    /// Bumped by every load of an ejected medium; each nexus compares it
    /// with the last it saw to raise NOT READY TO READY CHANGE, MEDIUM MAY
    /// HAVE CHANGED.
    pub(crate) load_gen: AtomicU32,
}

impl Medium {
    /// True unless the medium was ejected.
    pub(crate) fn present(&self) -> bool {
        !self.ejected.load(Ordering::Acquire)
    }

    /// True while some nexus prevents medium removal.
    pub(crate) fn prevented(&self) -> bool {
        self.holders.lock().is_ok_and(|mut h| {
            h.retain(|(_, w)| !is_gone(w));
            !h.is_empty()
        })
    }

    /// SBC-4 §5.13 PREVENT ALLOW MEDIUM REMOVAL by `holder` (watched by
    /// `watch`): PREVENT 01b (`on`) sets its prevention, 00b clears it.
    /// Prevention is per I_T nexus: another nexus's is left alone.
    pub(crate) fn prevent(&self, holder: u64, on: bool, watch: &Watch) {
        if let Ok(mut h) = self.holders.lock() {
            h.retain(|(x, _)| *x != holder);
            if on {
                h.push((holder, watch.clone()));
            }
        }
    }

    /// I_T nexus loss of `holder` (SBC-4 §5.13: its prevention ends).
    pub(crate) fn forget(&self, holder: u64) {
        self.prevent(holder, false, &None);
    }

    /// A logical unit reset or a hard reset: every prevention ends (SBC-4
    /// §5.13, SAM-5 §6.3).
    pub(crate) fn clear(&self) {
        if let Ok(mut h) = self.holders.lock() {
            h.clear();
        }
    }

    /// START STOP UNIT with LOEJ = 1 (SBC-4 §5.25): loads (`load`) or ejects
    /// the medium unless removal is prevented. `Ok(true)` when an ejected
    /// medium was loaded (the other nexuses get a unit attention).
    pub(crate) fn load_eject(&self, load: bool) -> Result<bool, ferrite_scsi::Sense> {
        let mut h = self
            .holders
            .lock()
            .map_err(|_| ferrite_scsi::Sense::INTERNAL_TARGET_FAILURE)?;
        // A holder whose connection is already gone lost its nexus.
        h.retain(|(_, w)| !is_gone(w));
        // SBC-4 §5.13: while prevention is in effect, START STOP UNIT with
        // LOEJ fails with ILLEGAL REQUEST, MEDIUM REMOVAL PREVENTED (SBC-4
        // §5.25); libiscsi's PreventAllow.Eject expects it for loading
        // too.
        if !h.is_empty() {
            return Err(ferrite_scsi::Sense::MEDIUM_REMOVAL_PREVENTED);
        }
        let was_ejected = self.ejected.swap(!load, Ordering::AcqRel);
        let loaded = load && was_ejected;
        if loaded {
            self.load_gen.fetch_add(1, Ordering::AcqRel);
        }
        Ok(loaded)
    }
}

/// Control page D_SENSE: sense data in descriptor format.
pub(crate) const MODE_D_SENSE: u8 = 1;
/// Control page SWP: software write protect.
pub(crate) const MODE_SWP: u8 = 2;

impl DeviceShared {
    /// Queues unit attentions for other nexuses.
    pub(crate) fn queue_pr_ua(&self, ua: Vec<(PrNexus, ferrite_scsi::Sense)>) {
        if ua.is_empty() {
            return;
        }
        if let Ok(mut q) = self.pr_ua.lock() {
            q.extend(ua);
            self.pr_ua_count.store(q.len(), Ordering::Release);
        }
    }

    /// Takes the unit attentions queued for `initiator_port`/`target`.
    pub(crate) fn take_pr_ua(
        &self,
        initiator_port: &str,
        target: &str,
        out: &mut Vec<ferrite_scsi::Sense>,
    ) {
        if self.pr_ua_count.load(Ordering::Acquire) == 0 {
            return;
        }
        if let Ok(mut q) = self.pr_ua.lock() {
            q.retain(|(n, s)| {
                if n.covers(initiator_port, target) {
                    out.push(*s);
                    false
                } else {
                    true
                }
            });
            self.pr_ua_count.store(q.len(), Ordering::Release);
        }
    }

    /// Saves the persistent reservation state if a store is set: the state
    /// while APTPL is set, nothing otherwise (SPC-4 §5.13.4).
    /// Saves the state where the device's store keeps it. A failure is
    /// logged; it is returned only where the store is shared
    /// ([`PrStore::shared`]), whose changes must not take effect unsaved.
    /// Takes a shared store's current state into the device before a
    /// PERSISTENT RESERVE IN or OUT (another target may have changed it
    /// since this one last heard). `Err` when the store cannot tell: the
    /// command must not run on what may be stale.
    pub(crate) fn refresh_pr(&self) -> std::io::Result<()> {
        let store = self.pr_store.lock().ok().and_then(|s| s.clone());
        let Some(loaded) = store.and_then(|s| s.load()) else {
            return Ok(());
        };
        if self.replace_pr(&loaded?) {
            Ok(())
        } else {
            Err(std::io::Error::other("unreadable shared reservation state"))
        }
    }

    /// Replaces the reservation state with saved `bytes`
    /// ([`PrState::encode`]; empty: nothing is reserved or registered).
    /// False, changing nothing, if they are not that format.
    pub(crate) fn replace_pr(&self, bytes: &[u8]) -> bool {
        let st = if bytes.is_empty() {
            PrState::default()
        } else {
            match PrState::decode(bytes) {
                Some(st) => st,
                None => return false,
            }
        };
        if let Ok(mut pr) = self.pr.lock() {
            self.pr_reserved.store(st.res.is_some(), Ordering::Release);
            *pr = st;
        }
        true
    }

    pub(crate) fn persist_pr(&self, st: &PrState) -> std::io::Result<()> {
        let store = self.pr_store.lock().ok().and_then(|s| s.clone());
        let Some(store) = store else {
            return Ok(());
        };
        let bytes = if st.aptpl || store.shared() {
            st.encode()
        } else {
            Vec::new()
        };
        match store.save(&bytes) {
            Ok(()) => Ok(()),
            Err(e) => {
                tracing::error!(error = %e, "cannot save persistent reservations");
                if store.shared() { Err(e) } else { Ok(()) }
            }
        }
    }

    /// The nexus holding an SPC-2 reservation, if any. A holder whose
    /// transport is gone lost its nexus, and with it the reservation
    /// (SPC-2 §5.5.1).
    #[cfg(test)]
    pub(crate) fn reservation(&self) -> Option<String> {
        if !self.reserved.load(Ordering::Acquire) {
            return None;
        }
        let mut h = self.holder.lock().ok()?;
        self.drop_gone_holder(&mut h);
        h.as_ref().map(|(n, _)| n.clone())
    }

    /// True while some nexus may hold an SPC-2 reservation (one atomic
    /// load: the command path's check before it builds its nexus key).
    pub(crate) fn is_reserved(&self) -> bool {
        self.reserved.load(Ordering::Acquire)
    }

    /// True while a nexus other than `nexus` holds an SPC-2 reservation.
    /// The holder's own commands never ask its watch; another nexus's ask
    /// it only when they meet the reservation, so a holder whose transport
    /// is gone stops conflicting at once (SPC-2 §5.5.1).
    pub(crate) fn reserved_by_other(&self, nexus: &str) -> bool {
        if !self.is_reserved() {
            return false;
        }
        let Ok(mut h) = self.holder.lock() else {
            return false;
        };
        if h.as_ref().is_none_or(|(n, _)| n == nexus) {
            return false;
        }
        self.drop_gone_holder(&mut h);
        h.is_some()
    }

    fn drop_gone_holder(&self, h: &mut Option<(String, Watch)>) {
        if h.as_ref().is_some_and(|(_, w)| is_gone(w)) {
            *h = None;
            self.reserved.store(false, Ordering::Release);
        }
    }

    /// RESERVE by `nexus` (watched by `watch`): true if it now holds the
    /// reservation (SPC-2 §5.5.1: a reservation by the holder again
    /// succeeds).
    pub(crate) fn reserve(&self, nexus: &str, watch: &Watch) -> bool {
        let Ok(mut h) = self.holder.lock() else {
            return false;
        };
        self.drop_gone_holder(&mut h);
        match h.as_ref() {
            Some((n, _)) if n != nexus => false,
            _ => {
                *h = Some((nexus.to_string(), watch.clone()));
                self.reserved.store(true, Ordering::Release);
                true
            }
        }
    }

    /// RELEASE by `nexus` (`None`: by a reset, whoever holds it). A release
    /// by another nexus does nothing (SPC-2 §5.5.1).
    pub(crate) fn release(&self, nexus: Option<&str>) {
        if !self.reserved.load(Ordering::Acquire) {
            return;
        }
        if let Ok(mut h) = self.holder.lock()
            && (nexus.is_none() || h.as_ref().map(|(n, _)| n.as_str()) == nexus)
        {
            *h = None;
            self.reserved.store(false, Ordering::Release);
        }
    }
}

/// Byte ranges of a device held by COMPARE AND WRITE or ORWRITE while they
/// read, combine and write (SBC-4 §5.3: atomic with respect to every other
/// command that writes those blocks). A short mutex on their path only;
/// other writers read `held` (one atomic load) and look at the list only
/// while something is held.
#[derive(Debug, Default)]
pub(crate) struct RangeLocks {
    held: AtomicUsize,
    /// (start, end, owner) byte ranges.
    list: Mutex<Vec<(u64, u64, u64)>>,
}

impl RangeLocks {
    /// Takes `[start, end)` for `owner` unless another owner holds an
    /// overlapping range.
    pub(crate) fn try_lock(&self, start: u64, end: u64, owner: u64) -> bool {
        let Ok(mut l) = self.list.lock() else {
            return false;
        };
        if l.iter()
            .any(|&(s, e, o)| o != owner && s < end && start < e)
        {
            return false;
        }
        l.push((start, end, owner));
        self.held.fetch_add(1, Ordering::AcqRel);
        true
    }

    /// Releases every range of `owner`.
    pub(crate) fn unlock(&self, owner: u64) {
        if let Ok(mut l) = self.list.lock() {
            let before = l.len();
            l.retain(|&(_, _, o)| o != owner);
            let gone = before - l.len();
            self.held.fetch_sub(gone, Ordering::AcqRel);
        }
    }

    /// True if another owner holds a range overlapping `[start, end)`.
    pub(crate) fn conflicts(&self, start: u64, end: u64, owner: u64) -> bool {
        if self.held.load(Ordering::Acquire) == 0 {
            return false;
        }
        self.list.lock().is_ok_and(|l| {
            l.iter()
                .any(|&(s, e, o)| o != owner && s < end && start < e)
        })
    }
}

impl std::fmt::Debug for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Device")
            .field("id", &self.id)
            .field("name", &self.name)
            .field("geometry", &self.geometry())
            .field("flags", &self.flags)
            .finish()
    }
}

impl Device {
    /// A device over `backend` with the backend's current geometry.
    pub fn new(
        id: DeviceId,
        name: impl Into<String>,
        backend: Arc<dyn Backend>,
        identity: Identity,
        flags: DeviceFlags,
    ) -> Device {
        let g = backend.geometry();
        Device {
            id,
            name: name.into(),
            backend,
            identity,
            flags,
            num_blocks: AtomicU64::new(g.num_blocks),
            generation: AtomicU32::new(0),
            block_size: g.block_size,
            phys_exp: g.phys_exp,
            shared: Arc::default(),
            alua: None,
        }
    }

    /// The same device as a member of the ALUA device group `group` (or of
    /// none): it reports target port groups (INQUIRY TPGS, VPD 83h, REPORT
    /// TARGET PORT GROUPS), takes SET TARGET PORT GROUPS, and serves each
    /// port as its group's state allows.
    pub fn with_alua(mut self, group: Option<Arc<crate::alua::DeviceGroup>>) -> Device {
        self.alua = group;
        self
    }

    /// The ALUA device group this device belongs to.
    pub fn alua(&self) -> Option<&Arc<crate::alua::DeviceGroup>> {
        self.alua.as_ref()
    }

    /// The same logical unit with new identity and settings (an operator
    /// changed an attribute): backend, capacity, reservations, range locks
    /// and mode parameters carry over, so nothing an initiator holds is lost.
    pub fn reconfigured(&self, identity: Identity, flags: DeviceFlags) -> Device {
        Device {
            id: self.id,
            name: self.name.clone(),
            backend: self.backend.clone(),
            identity,
            flags,
            num_blocks: AtomicU64::new(self.num_blocks.load(Ordering::Acquire)),
            generation: AtomicU32::new(self.generation.load(Ordering::Acquire)),
            block_size: self.block_size,
            phys_exp: self.phys_exp,
            shared: self.shared.clone(),
            alua: self.alua.clone(),
        }
    }

    /// Geometry as last published.
    pub fn geometry(&self) -> Geometry {
        Geometry {
            block_size: self.block_size,
            num_blocks: self.num_blocks.load(Ordering::Acquire),
            phys_exp: self.phys_exp,
        }
    }

    /// Publishes a new capacity (after the backend was resized).
    pub fn set_num_blocks(&self, n: u64) {
        self.num_blocks.store(n, Ordering::Release);
        self.generation.fetch_add(1, Ordering::AcqRel);
        CAPACITY_EPOCH.fetch_add(1, Ordering::AcqRel);
    }

    /// Saves persistent reservations through `store` from now on (the
    /// daemon gives each device a directory: [`crate::pr::DirStore`]).
    pub fn set_pr_store(&self, store: Arc<dyn PrStore>) {
        if let Ok(mut s) = self.shared.pr_store.lock() {
            *s = Some(store);
        }
    }

    /// Replaces the persistent reservations with a saved state: APTPL's at
    /// start, before sessions, or another cluster node's change. False,
    /// changing nothing, if `bytes` are not a saved state; empty bytes
    /// (nothing saved) leave no reservation or registration.
    pub fn restore_reservations(&self, bytes: &[u8]) -> bool {
        self.shared.replace_pr(bytes)
    }

    /// A copy of the persistent reservation state (management, tests).
    pub fn reservations(&self) -> PrState {
        self.shared.pr.lock().map(|p| p.clone()).unwrap_or_default()
    }

    /// Where a sanitize of this logical unit stands (management, tests).
    pub fn sanitize_status(&self) -> crate::sanitize::Status {
        self.shared.sanitize.status()
    }

    /// False while a removable medium is ejected (always true for a
    /// device that is not removable).
    pub fn medium_present(&self) -> bool {
        !self.flags.removable || self.shared.medium.present()
    }

    /// True while some I_T nexus prevents medium removal (PREVENT ALLOW
    /// MEDIUM REMOVAL, SBC-4 §5.13).
    pub fn removal_prevented(&self) -> bool {
        self.shared.medium.prevented()
    }

    /// The FUA a write to this device goes to its backend with: set for
    /// every write of a write-through device, clear where `nv_cache` says
    /// the cache is non-volatile, else what the command asked for. The core
    /// alone decides it; backends honour the FUA they are given
    /// (`Caps::fua`).
    pub fn write_fua(&self, asked: bool) -> bool {
        self.flags.write_through || (asked && !self.flags.nv_cache)
    }

    /// WCE of the Caching mode page (SBC-4 §6.5.5): the backend keeps
    /// written data in a volatile cache (`Caps::write_cache`) and the device
    /// is not write-through, which makes every write durable on its own.
    pub fn write_cache_enabled(&self) -> bool {
        !self.flags.write_through && self.backend.caps().write_cache
    }

    /// Software write protect (Control mode page SWP, SPC-4 §7.5.7).
    pub fn swp(&self) -> bool {
        self.shared.mode.load(Ordering::Acquire) & MODE_SWP != 0
    }

    /// Descriptor-format sense data (Control mode page D_SENSE).
    pub fn d_sense(&self) -> bool {
        self.shared.mode.load(Ordering::Acquire) & MODE_D_SENSE != 0
    }

    /// Capacity generation: changes whenever the capacity does.
    pub fn generation(&self) -> u32 {
        self.generation.load(Ordering::Acquire)
    }
}

/// One LUN of a map.
#[derive(Clone, Debug)]
pub struct LunEntry {
    pub device: Arc<Device>,
    /// Read-only for this mapping even if the device is writable.
    pub read_only: bool,
}

impl LunEntry {
    /// SBC-4 §4.11: writes through this LUN fail with WRITE PROTECTED: a
    /// read-only device, a read-only mapping, or SWP set.
    pub fn write_protected(&self) -> bool {
        self.read_only || self.device.flags.read_only || self.device.swp()
    }
}

/// LUN -> device.
#[derive(Clone, Debug, Default)]
pub struct LunMap {
    pub luns: BTreeMap<Lun, LunEntry>,
}

impl LunMap {
    pub fn get(&self, lun: Lun) -> Option<&LunEntry> {
        self.luns.get(&lun)
    }
}

/// An initiator group: initiator name patterns (`*` and `?` wildcards) with
/// their own LUN map (LUN masking).
#[derive(Clone, Debug)]
pub struct AccessGroup {
    pub name: String,
    pub initiators: Vec<String>,
    pub luns: Arc<LunMap>,
}

/// A SCSI target port as the core sees it.
#[derive(Clone, Debug)]
pub struct Target {
    /// Name (iSCSI IQN, SRP port GUID).
    pub name: String,
    /// Relative target port identifier (VPD 83h), 1-based.
    pub rel_port_id: u16,
    /// Whether new sessions are accepted.
    pub enabled: bool,
    /// LUN map for initiators in no group.
    pub luns: Arc<LunMap>,
    pub groups: Vec<AccessGroup>,
}

/// Why a target refuses a login ([`Target::admit`]); each fabric answers
/// with its own wire code.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refused {
    /// The target (port) takes no new sessions.
    Disabled,
    /// The initiator is outside the target's access rule
    /// ([`Target::admits`]).
    NotAdmitted,
}

/// What a login admitted by [`Target::admit`] gets.
#[derive(Clone, Debug)]
pub struct Admission {
    /// The LUN map of the new I_T nexus.
    pub luns: Arc<LunMap>,
    /// The initiator group the map is of (None: the default map).
    pub group: Option<String>,
}

impl Target {
    /// Admission, the one login decision every fabric asks of the core
    /// once its protocol checks passed: the target is enabled and admits
    /// the initiator ([`Target::admits`]); the nexus gets its group's LUN
    /// map or the default ([`Target::map_for`]).
    pub fn admit(&self, initiator: &str) -> Result<Admission, Refused> {
        if !self.enabled {
            return Err(Refused::Disabled);
        }
        if !self.admits(initiator) {
            return Err(Refused::NotAdmitted);
        }
        let luns = self.map_for(initiator);
        let group = self.group_of(&luns);
        Ok(Admission { luns, group })
    }

    /// The initiator group whose map `luns` is (None: the default map).
    pub fn group_of(&self, luns: &Arc<LunMap>) -> Option<String> {
        self.groups
            .iter()
            .find(|g| Arc::ptr_eq(&g.luns, luns))
            .map(|g| g.name.clone())
    }

    /// The LUN map an initiator gets at login: its group's, or the default.
    pub fn map_for(&self, initiator: &str) -> Arc<LunMap> {
        self.groups
            .iter()
            .find(|g| g.initiators.iter().any(|p| wildcard_match(p, initiator)))
            .map_or_else(|| self.luns.clone(), |g| g.luns.clone())
    }

    /// The access rule every fabric applies at login (SCST's): a target
    /// admits every initiator unless it has initiator groups and an empty
    /// default LUN map; then only an initiator matching some group's
    /// patterns. iSCSI refuses the others with 0202h, SRP with an
    /// SRP_LOGIN_REJ.
    pub fn admits(&self, initiator: &str) -> bool {
        self.groups.is_empty()
            || !self.luns.luns.is_empty()
            || self
                .groups
                .iter()
                .any(|g| g.initiators.iter().any(|p| wildcard_match(p, initiator)))
    }
}

/// Matches `name` against `pattern` with `*` (any run) and `?` (one char).
pub fn wildcard_match(pattern: &str, name: &str) -> bool {
    let p: Vec<char> = pattern.chars().collect();
    let n: Vec<char> = name.chars().collect();
    let (mut pi, mut ni) = (0, 0);
    let (mut star, mut mark) = (None, 0);
    while ni < n.len() {
        if pi < p.len() && (p[pi] == '?' || p[pi] == n[ni]) {
            pi += 1;
            ni += 1;
        } else if pi < p.len() && p[pi] == '*' {
            star = Some(pi);
            mark = ni;
            pi += 1;
        } else if let Some(s) = star {
            pi = s + 1;
            mark += 1;
            ni = mark;
        } else {
            return false;
        }
    }
    while pi < p.len() && p[pi] == '*' {
        pi += 1;
    }
    pi == p.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A target whose default LUN map is `default`, with one group per
    /// pattern.
    fn acl_target(default: LunMap, patterns: &[&str]) -> Target {
        Target {
            name: "t".into(),
            rel_port_id: 1,
            enabled: true,
            luns: Arc::new(default),
            groups: patterns
                .iter()
                .map(|p| AccessGroup {
                    name: "g".into(),
                    initiators: vec![p.to_string()],
                    luns: Arc::new(LunMap::default()),
                })
                .collect(),
        }
    }

    #[test]
    fn a_target_without_groups_admits_everyone() {
        assert!(acl_target(LunMap::default(), &[]).admits("iqn.any"));
    }

    #[test]
    fn groups_and_an_empty_default_map_admit_members_only() {
        let t = acl_target(LunMap::default(), &["iqn.2026-01.ok:*", "0xfe80*"]);
        assert!(t.admits("iqn.2026-01.ok:host1"));
        assert!(t.admits("0xfe800000000000000000000000000001"));
        assert!(!t.admits("iqn.2026-01.other:host1"));
        assert!(!t.admits("0x00000000000000000000000000000001"));
        // admit(): the same rule, the group's map, and a disabled target
        // refusing everyone.
        let a = t.admit("iqn.2026-01.ok:host1").unwrap();
        assert!(Arc::ptr_eq(&a.luns, &t.groups[0].luns));
        assert_eq!(a.group.as_deref(), Some("g"));
        assert_eq!(
            t.admit("iqn.2026-01.other:host1").unwrap_err(),
            Refused::NotAdmitted
        );
        let off = Target {
            enabled: false,
            ..t.clone()
        };
        assert_eq!(
            off.admit("iqn.2026-01.ok:host1").unwrap_err(),
            Refused::Disabled
        );
    }

    #[test]
    fn range_locks_exclude_overlaps_of_other_owners() {
        let l = RangeLocks::default();
        assert!(!l.conflicts(0, 10, 1));
        assert!(l.try_lock(0, 512, 1));
        assert!(!l.try_lock(511, 1024, 2));
        assert!(l.try_lock(512, 1024, 2));
        assert!(l.conflicts(100, 101, 3));
        assert!(!l.conflicts(100, 101, 1));
        assert!(!l.conflicts(1024, 2048, 3));
        l.unlock(1);
        assert!(l.try_lock(0, 100, 3));
        l.unlock(2);
        l.unlock(3);
        assert!(!l.conflicts(0, u64::MAX, 9));
    }

    #[test]
    fn spc2_reservation() {
        let d = DeviceShared::default();
        assert_eq!(d.reservation(), None);
        assert!(d.reserve("a", &None));
        assert!(d.reserve("a", &None));
        assert!(!d.reserve("b", &None));
        d.release(Some("b"));
        assert_eq!(d.reservation().as_deref(), Some("a"));
        d.release(Some("a"));
        assert!(d.reserve("b", &None));
        d.release(None);
        assert_eq!(d.reservation(), None);
    }

    #[test]
    fn medium_prevention_is_per_nexus_and_blocks_load_and_eject() {
        let m = Medium::default();
        assert!(m.present() && !m.prevented());
        m.prevent(1, true, &None);
        m.prevent(2, true, &None);
        m.prevent(2, true, &None);
        assert_eq!(
            m.load_eject(false),
            Err(ferrite_scsi::Sense::MEDIUM_REMOVAL_PREVENTED)
        );
        assert!(m.present());
        // ALLOW from one nexus leaves the other's prevention in place.
        m.prevent(1, false, &None);
        assert!(m.prevented());
        assert!(m.load_eject(false).is_err());
        // Nexus loss of the last holder ends it.
        m.forget(2);
        assert!(!m.prevented());
        assert_eq!(m.load_eject(false), Ok(false));
        assert!(!m.present());
        assert_eq!(m.load_eject(false), Ok(false));
        let g = m.load_gen.load(Ordering::Acquire);
        // Prevention holds the ejected medium out too.
        m.prevent(3, true, &None);
        assert!(m.load_eject(true).is_err());
        assert!(!m.present());
        m.clear();
        assert_eq!(m.load_eject(true), Ok(true));
        assert!(m.present());
        assert_eq!(m.load_gen.load(Ordering::Acquire), g + 1);
        // Loading a loaded medium changes nothing.
        assert_eq!(m.load_eject(true), Ok(false));
        assert_eq!(m.load_gen.load(Ordering::Acquire), g + 1);
    }

    /// A watch a test flips by hand.
    #[derive(Debug, Default)]
    struct Flag(AtomicBool);

    impl NexusWatch for Flag {
        fn gone(&self) -> bool {
            self.0.load(Ordering::Acquire)
        }
    }

    #[test]
    fn a_holder_whose_transport_is_gone_holds_nothing() {
        let flag = Arc::new(Flag::default());
        let w: Watch = Some(flag.clone());
        // Medium prevention: held while the transport stands.
        let m = Medium::default();
        m.prevent(1, true, &w);
        assert!(m.prevented());
        assert!(m.load_eject(false).is_err());
        // Another nexus's prevention is not touched by this one's loss.
        let other = Arc::new(Flag::default());
        m.prevent(2, true, &Some(other.clone()));
        flag.0.store(true, Ordering::Release);
        assert!(m.prevented());
        other.0.store(true, Ordering::Release);
        assert!(!m.prevented());
        assert_eq!(m.load_eject(false), Ok(false));
        // SPC-2 reservation: another nexus conflicts while the holder's
        // transport stands, and takes it over once it is gone.
        let flag = Arc::new(Flag::default());
        let d = DeviceShared::default();
        assert!(d.reserve("a", &Some(flag.clone())));
        assert!(!d.reserve("b", &None));
        assert_eq!(d.reservation().as_deref(), Some("a"));
        flag.0.store(true, Ordering::Release);
        assert_eq!(d.reservation(), None);
        assert!(d.reserve("b", &None));
        assert_eq!(d.reservation().as_deref(), Some("b"));
    }

    #[test]
    fn wildcards() {
        assert!(wildcard_match("iqn.*", "iqn.1994-05.com.redhat:abc"));
        assert!(wildcard_match("*:abc", "iqn.1994-05.com.redhat:abc"));
        assert!(wildcard_match("iqn.?994*", "iqn.1994-05"));
        assert!(!wildcard_match("iqn.*:x", "iqn.1994-05.com.redhat:abc"));
        assert!(wildcard_match("*", ""));
        assert!(!wildcard_match("a", ""));
    }
}
