//! Asymmetric logical unit access (SPC-4 §5.15), SCST's model: a
//! [`DeviceGroup`] is a set of devices that change state together; it
//! holds target port groups ([`PortGroup`]), each a set of target ports
//! (by relative target port identifier) with one asymmetric access state
//! and a preferred bit for the devices of the group.
//!
//! States are atomics, read on the data path by every core without a lock;
//! they change through [`DeviceGroup::set`] (SET TARGET PORT GROUPS on
//! any core, management, a cluster) which bumps the group's generation and
//! the process-wide [`epoch`]: each core then raises ASYMMETRIC ACCESS
//! STATE CHANGED on its nexuses of the group's devices and sends it as an
//! AEN where the fabric can.
//!
//! Does not own: which devices and ports form a group (configuration), or
//! where states are kept across restarts (a [`StateStore`] the daemon
//! hands in).

use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use ferrite_scsi::Sense;

/// SPC-4 §6.37 table 307: the primary target port asymmetric access states
/// this target supports.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AccessState {
    ActiveOptimized,
    ActiveNonOptimized,
    Standby,
    Unavailable,
    Offline,
    Transitioning,
}

impl AccessState {
    pub const ALL: [AccessState; 6] = [
        AccessState::ActiveOptimized,
        AccessState::ActiveNonOptimized,
        AccessState::Standby,
        AccessState::Unavailable,
        AccessState::Offline,
        AccessState::Transitioning,
    ];

    /// The ASYMMETRIC ACCESS STATE code.
    pub fn code(self) -> u8 {
        match self {
            AccessState::ActiveOptimized => 0x0,
            AccessState::ActiveNonOptimized => 0x1,
            AccessState::Standby => 0x2,
            AccessState::Unavailable => 0x3,
            AccessState::Offline => 0xe,
            AccessState::Transitioning => 0xf,
        }
    }

    pub fn from_code(c: u8) -> Option<AccessState> {
        AccessState::ALL.into_iter().find(|s| s.code() == c)
    }

    /// The name SCST's `state` attribute uses (`active`, `nonoptimized`,
    /// `standby`, `unavailable`, `offline`, `transitioning`).
    pub fn name(self) -> &'static str {
        match self {
            AccessState::ActiveOptimized => "active",
            AccessState::ActiveNonOptimized => "nonoptimized",
            AccessState::Standby => "standby",
            AccessState::Unavailable => "unavailable",
            AccessState::Offline => "offline",
            AccessState::Transitioning => "transitioning",
        }
    }

    /// Parses [`AccessState::name`], and the long forms
    /// `active/optimized`, `active/non-optimized`.
    pub fn parse(s: &str) -> Option<AccessState> {
        match s {
            "active/optimized" | "optimized" => Some(AccessState::ActiveOptimized),
            "active/non-optimized" | "non-optimized" => Some(AccessState::ActiveNonOptimized),
            _ => AccessState::ALL.into_iter().find(|st| st.name() == s),
        }
    }

    /// Whether a command that the op table marks with `flags` is served in
    /// this state; else the sense it is refused with (SPC-4 §5.15.2.4).
    pub(crate) fn refuses(self, served_in: Served) -> Option<Sense> {
        match self {
            AccessState::ActiveOptimized | AccessState::ActiveNonOptimized => None,
            AccessState::Standby => {
                (!served_in.standby).then_some(Sense::TARGET_PORT_IN_STANDBY_STATE)
            }
            AccessState::Unavailable => {
                (!served_in.unavailable).then_some(Sense::TARGET_PORT_IN_UNAVAILABLE_STATE)
            }
            AccessState::Transitioning => {
                (!served_in.offline).then_some(Sense::ASYMMETRIC_ACCESS_STATE_TRANSITION)
            }
            AccessState::Offline => {
                (!served_in.offline).then_some(Sense::LOGICAL_UNIT_NOT_READY_OFFLINE)
            }
        }
    }

    /// Whether SET TARGET PORT GROUPS may ask for this state (SPC-4
    /// §6.36: the primary states but offline and transitioning).
    pub fn settable(self) -> bool {
        !matches!(self, AccessState::Offline | AccessState::Transitioning)
    }
}

impl std::fmt::Display for AccessState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// In which of the restricted states a command is served (the op table's
/// ALUA flags).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Served {
    pub standby: bool,
    pub unavailable: bool,
    /// Offline and transitioning: only what tells an initiator where to go.
    pub offline: bool,
}

/// SPC-4 §6.27.2 table 171: why a group last changed state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cause {
    /// Configuration, management or a cluster (implicit).
    Implicit,
    /// SET TARGET PORT GROUPS (explicit).
    Explicit,
}

/// A target port group: its ports and, for the devices of its device
/// group, one state.
#[derive(Debug)]
pub struct PortGroup {
    pub name: String,
    /// TARGET PORT GROUP identifier.
    pub id: u16,
    /// Relative target port identifiers of its ports.
    pub ports: Vec<u16>,
    state: AtomicU8,
    preferred: AtomicBool,
    /// STATUS CODE of REPORT TARGET PORT GROUPS: 0 none, 1 altered by
    /// SET TARGET PORT GROUPS, 2 altered by implicit behaviour.
    status: AtomicU8,
}

impl PortGroup {
    pub fn new(
        name: impl Into<String>,
        id: u16,
        ports: Vec<u16>,
        state: AccessState,
        preferred: bool,
    ) -> PortGroup {
        PortGroup {
            name: name.into(),
            id,
            ports,
            state: AtomicU8::new(state.code()),
            preferred: AtomicBool::new(preferred),
            status: AtomicU8::new(0),
        }
    }

    pub fn state(&self) -> AccessState {
        AccessState::from_code(self.state.load(Ordering::Acquire))
            .unwrap_or(AccessState::Unavailable)
    }

    pub fn preferred(&self) -> bool {
        self.preferred.load(Ordering::Acquire)
    }
}

/// Where a device group's states are kept across restarts (the daemon
/// writes a file under its state directory).
pub trait StateStore: Send + Sync + std::fmt::Debug {
    /// Replaces the saved states with `bytes` ([`DeviceGroup::encode`]).
    fn save(&self, bytes: &[u8]) -> std::io::Result<()>;
}

/// Bumped by every state change of any device group; each core compares
/// it with the last it saw to raise the unit attentions and AENs.
static EPOCH: AtomicU64 = AtomicU64::new(0);

/// The process-wide ALUA epoch (see [`EPOCH`]).
pub fn epoch() -> u64 {
    EPOCH.load(Ordering::Acquire)
}

/// Devices that move together, and the target port groups they are seen
/// through.
#[derive(Debug)]
pub struct DeviceGroup {
    pub name: String,
    pub groups: Vec<PortGroup>,
    /// Bumped by every change of a state or preferred bit.
    generation: AtomicU32,
    store: Mutex<Option<Arc<dyn StateStore>>>,
    /// Serializes changes, so the saved states are always the last ones.
    changing: Mutex<()>,
    /// Whether initiators may change the states (explicit ALUA, SET TARGET
    /// PORT GROUPS); off where something else decides them (a cluster).
    explicit: AtomicBool,
}

/// One change of [`DeviceGroup::set`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Change {
    /// The TARGET PORT GROUP identifier.
    pub group: u16,
    pub state: AccessState,
    /// `None` leaves the preferred bit as it is.
    pub preferred: Option<bool>,
}

/// Why [`DeviceGroup::set`] refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SetError {
    /// No target port group with this identifier.
    UnknownGroup(u16),
    /// The saved states could not be written; nothing changed.
    Save(String),
}

impl std::fmt::Display for SetError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SetError::UnknownGroup(g) => write!(f, "no target port group {g}"),
            SetError::Save(e) => write!(f, "saving the ALUA state failed: {e}"),
        }
    }
}

impl DeviceGroup {
    pub fn new(name: impl Into<String>, groups: Vec<PortGroup>) -> DeviceGroup {
        DeviceGroup {
            name: name.into(),
            groups,
            generation: AtomicU32::new(0),
            store: Mutex::new(None),
            changing: Mutex::new(()),
            explicit: AtomicBool::new(true),
        }
    }

    /// Whether SET TARGET PORT GROUPS may change the states (INQUIRY then
    /// reports explicit ALUA besides implicit).
    pub fn explicit(&self) -> bool {
        self.explicit.load(Ordering::Acquire)
    }

    /// Turns explicit ALUA off where something else owns the states (an HA
    /// cluster): initiators then see implicit ALUA only, and SET TARGET
    /// PORT GROUPS is not offered. The Linux ALUA handler, for one, asks a
    /// standby group it activates to become active/optimized.
    pub fn set_explicit(&self, on: bool) {
        self.explicit.store(on, Ordering::Release);
    }

    /// Where state changes are saved from now on.
    pub fn set_store(&self, store: Arc<dyn StateStore>) {
        if let Ok(mut s) = self.store.lock() {
            *s = Some(store);
        }
    }

    /// Bumped by every change; each nexus compares it with the last it saw.
    pub fn generation(&self) -> u32 {
        self.generation.load(Ordering::Acquire)
    }

    pub fn group(&self, id: u16) -> Option<&PortGroup> {
        self.groups.iter().find(|g| g.id == id)
    }

    pub fn group_named(&self, name: &str) -> Option<&PortGroup> {
        self.groups.iter().find(|g| g.name == name)
    }

    /// The target port group the port `rel_port` belongs to.
    pub fn group_of_port(&self, rel_port: u16) -> Option<&PortGroup> {
        self.groups.iter().find(|g| g.ports.contains(&rel_port))
    }

    /// The state of the devices of this group through port `rel_port`; a
    /// port in none of its target port groups sees them active/optimized
    /// (it does not take part in ALUA).
    pub fn state_of_port(&self, rel_port: u16) -> AccessState {
        self.group_of_port(rel_port)
            .map_or(AccessState::ActiveOptimized, PortGroup::state)
    }

    /// Applies `changes` all or none: the states are saved first (when a
    /// store is set), then published; the generation and [`epoch`] move
    /// when anything changed. Returns whether anything did.
    pub fn set(&self, changes: &[Change], cause: Cause) -> Result<bool, SetError> {
        for c in changes {
            if self.group(c.group).is_none() {
                return Err(SetError::UnknownGroup(c.group));
            }
        }
        let _one = self.changing.lock().unwrap_or_else(|p| p.into_inner());
        let next = |g: &PortGroup| {
            let mut st = g.state();
            let mut pref = g.preferred();
            for c in changes.iter().filter(|c| c.group == g.id) {
                st = c.state;
                if let Some(p) = c.preferred {
                    pref = p;
                }
            }
            (st, pref)
        };
        let moved = self
            .groups
            .iter()
            .any(|g| next(g) != (g.state(), g.preferred()));
        if !moved {
            return Ok(false);
        }
        let store = self.store.lock().ok().and_then(|s| s.clone());
        if let Some(store) = store {
            let bytes = encode_states(self.groups.iter().map(|g| (g.name.as_str(), next(g))));
            store
                .save(&bytes)
                .map_err(|e| SetError::Save(e.to_string()))?;
        }
        let status = match cause {
            Cause::Explicit => 1,
            Cause::Implicit => 2,
        };
        // Groups leaving active/optimized first, then those entering it: a
        // reader between the two never sees two optimized groups where the
        // change swaps them.
        for promote in [false, true] {
            for g in &self.groups {
                let (st, pref) = next(g);
                if (st == AccessState::ActiveOptimized) == promote
                    && (st, pref) != (g.state(), g.preferred())
                {
                    g.state.store(st.code(), Ordering::Release);
                    g.preferred.store(pref, Ordering::Release);
                    g.status.store(status, Ordering::Release);
                }
            }
        }
        self.generation.fetch_add(1, Ordering::AcqRel);
        EPOCH.fetch_add(1, Ordering::AcqRel);
        Ok(true)
    }

    /// The states and preferred bits as saved bytes (one line per target
    /// port group: `name state preferred`).
    pub fn encode(&self) -> Vec<u8> {
        encode_states(
            self.groups
                .iter()
                .map(|g| (g.name.as_str(), (g.state(), g.preferred()))),
        )
    }

    /// Restores what [`DeviceGroup::encode`] saved, as an implicit change
    /// that raises nothing (no nexus exists yet): target port groups it
    /// does not name keep their configured state, names it has that the
    /// group has not are ignored. `None` if the bytes are not that format.
    pub fn restore(&self, bytes: &[u8]) -> Option<()> {
        let text = std::str::from_utf8(bytes).ok()?;
        let mut lines = text.lines();
        if lines.next()? != "ferrite-alua 1" {
            return None;
        }
        let mut parsed = Vec::new();
        for l in lines.filter(|l| !l.is_empty()) {
            let mut w = l.split(' ');
            let (Some(name), Some(st), Some(pref), None) = (w.next(), w.next(), w.next(), w.next())
            else {
                return None;
            };
            let st = AccessState::parse(st)?;
            let pref = match pref {
                "1" => true,
                "0" => false,
                _ => return None,
            };
            parsed.push((name.to_string(), st, pref));
        }
        for (name, st, pref) in parsed {
            if let Some(g) = self.group_named(&name) {
                g.state.store(st.code(), Ordering::Release);
                g.preferred.store(pref, Ordering::Release);
            }
        }
        Some(())
    }

    /// Takes the states and preferred bits of `old` for the target port
    /// groups of the same name, and whether initiators may set them (a
    /// reconfigured group keeps its runtime state).
    pub fn carry_states(&self, old: &DeviceGroup) {
        for g in &self.groups {
            if let Some(o) = old.group_named(&g.name) {
                g.state.store(o.state().code(), Ordering::Release);
                g.preferred.store(o.preferred(), Ordering::Release);
                g.status
                    .store(o.status.load(Ordering::Acquire), Ordering::Release);
            }
        }
        self.generation.store(old.generation(), Ordering::Release);
        self.set_explicit(old.explicit());
        if let Ok(s) = old.store.lock()
            && let Some(st) = s.clone()
        {
            self.set_store(st);
        }
    }

    /// REPORT TARGET PORT GROUPS parameter data (SPC-4 §6.27.2): one
    /// descriptor per target port group with its ports; the extended
    /// header (`extended`) with an implicit transition time of
    /// `transition_secs`.
    pub fn report(&self, extended: bool, transition_secs: u8, out: &mut Vec<u8>) {
        let start = out.len();
        out.extend([0u8; 4]);
        if extended {
            // FORMAT TYPE 001b.
            out.extend([0x10, transition_secs, 0, 0]);
        }
        for g in &self.groups {
            // PREF, ASYMMETRIC ACCESS STATE; T_SUP O_SUP U_SUP S_SUP AN_SUP
            // AO_SUP.
            out.push((u8::from(g.preferred()) << 7) | g.state().code());
            out.push(0x80 | 0x40 | 0x08 | 0x04 | 0x02 | 0x01);
            out.extend(g.id.to_be_bytes());
            out.push(0);
            out.push(g.status.load(Ordering::Acquire));
            out.push(0);
            out.push(g.ports.len().min(255) as u8);
            for p in g.ports.iter().take(255) {
                out.extend([0, 0]);
                out.extend(p.to_be_bytes());
            }
        }
        let len = (out.len() - start - 4) as u32;
        out[start..start + 4].copy_from_slice(&len.to_be_bytes());
    }
}

fn encode_states<'a>(groups: impl Iterator<Item = (&'a str, (AccessState, bool))>) -> Vec<u8> {
    let mut s = String::from("ferrite-alua 1\n");
    for (name, (st, pref)) in groups {
        s.push_str(&format!("{name} {} {}\n", st.name(), u8::from(pref)));
    }
    s.into_bytes()
}

/// Parses SET TARGET PORT GROUPS parameter data (SPC-4 §6.36.2): after four
/// reserved bytes, descriptors of four bytes (ASYMMETRIC ACCESS STATE in
/// the low nibble of byte 0, TARGET PORT GROUP in bytes 2-3). A state the
/// command may not ask for, or a group the device group has not, is
/// INVALID FIELD IN PARAMETER LIST at its byte.
pub fn parse_set(params: &[u8], dg: &DeviceGroup) -> Result<Vec<Change>, Sense> {
    let mut out = Vec::new();
    let body = params.get(4..).unwrap_or(&[]);
    for (i, d) in body.chunks(4).enumerate() {
        let at = (4 + i * 4) as u16;
        let [b0, _, g0, g1] = *d else {
            return Err(Sense::PARAMETER_LIST_LENGTH_ERROR);
        };
        let state = AccessState::from_code(b0 & 0x0f)
            .filter(|s| s.settable())
            .ok_or(Sense::INVALID_FIELD_IN_PARAMETER_LIST.param_field(at, Some(3)))?;
        let group = u16::from_be_bytes([g0, g1]);
        if dg.group(group).is_none() {
            return Err(Sense::INVALID_FIELD_IN_PARAMETER_LIST.param_field(at + 2, Some(7)));
        }
        out.push(Change {
            group,
            state,
            preferred: None,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dg() -> DeviceGroup {
        DeviceGroup::new(
            "dg",
            vec![
                PortGroup::new("a", 1, vec![1], AccessState::ActiveOptimized, true),
                PortGroup::new("b", 2, vec![2, 3], AccessState::ActiveNonOptimized, false),
            ],
        )
    }

    #[derive(Debug, Default)]
    struct Mem(Mutex<Vec<u8>>, AtomicBool);
    impl StateStore for Mem {
        fn save(&self, b: &[u8]) -> std::io::Result<()> {
            if self.1.load(Ordering::Acquire) {
                return Err(std::io::Error::other("disk full"));
            }
            *self.0.lock().unwrap() = b.to_vec();
            Ok(())
        }
    }

    #[test]
    fn states_by_port_and_names() {
        let g = dg();
        assert_eq!(g.state_of_port(1), AccessState::ActiveOptimized);
        assert_eq!(g.state_of_port(3), AccessState::ActiveNonOptimized);
        assert_eq!(g.state_of_port(9), AccessState::ActiveOptimized);
        for s in AccessState::ALL {
            assert_eq!(AccessState::parse(s.name()), Some(s));
            assert_eq!(AccessState::from_code(s.code()), Some(s));
        }
        assert_eq!(AccessState::parse("bogus"), None);
    }

    #[test]
    fn set_saves_then_publishes_and_refuses_all_or_none() {
        let g = dg();
        let store = Arc::new(Mem::default());
        g.set_store(store.clone());
        let e0 = epoch();
        let swap = [
            Change {
                group: 1,
                state: AccessState::Standby,
                preferred: Some(false),
            },
            Change {
                group: 2,
                state: AccessState::ActiveOptimized,
                preferred: Some(true),
            },
        ];
        assert_eq!(g.set(&swap, Cause::Explicit), Ok(true));
        assert!(epoch() > e0);
        assert_eq!(g.generation(), 1);
        assert_eq!(g.state_of_port(2), AccessState::ActiveOptimized);
        let saved = store.0.lock().unwrap().clone();
        assert_eq!(saved, g.encode());
        // The same again changes nothing.
        assert_eq!(g.set(&swap, Cause::Explicit), Ok(false));
        // An unknown group refuses the whole list.
        let bad = [
            Change {
                group: 1,
                state: AccessState::ActiveOptimized,
                preferred: None,
            },
            Change {
                group: 7,
                state: AccessState::Standby,
                preferred: None,
            },
        ];
        assert_eq!(g.set(&bad, Cause::Implicit), Err(SetError::UnknownGroup(7)));
        assert_eq!(g.state_of_port(1), AccessState::Standby);
        // A failed save changes nothing.
        store.1.store(true, Ordering::Release);
        assert!(matches!(
            g.set(&bad[..1], Cause::Implicit),
            Err(SetError::Save(_))
        ));
        assert_eq!(g.state_of_port(1), AccessState::Standby);
        // Restored into a fresh group.
        let h = dg();
        assert_eq!(h.restore(&saved), Some(()));
        assert_eq!(h.state_of_port(1), AccessState::Standby);
        assert!(h.group(2).unwrap().preferred());
        assert_eq!(h.restore(b"nonsense"), None);
    }

    #[test]
    fn report_and_set_parameter_data() {
        let g = dg();
        let mut out = Vec::new();
        g.report(true, 10, &mut out);
        assert_eq!(&out[4..8], &[0x10, 10, 0, 0]);
        // Group 1: preferred, active/optimized, one port.
        assert_eq!(&out[8..16], &[0x80, 0xcf, 0, 1, 0, 0, 0, 1]);
        assert_eq!(&out[16..20], &[0, 0, 0, 1]);
        // Group 2: two ports.
        assert_eq!(&out[20..28], &[0x01, 0xcf, 0, 2, 0, 0, 0, 2]);
        assert_eq!(
            u32::from_be_bytes(out[..4].try_into().unwrap()) as usize,
            out.len() - 4
        );
        let ok = [0, 0, 0, 0, 0x02, 0, 0, 1];
        assert_eq!(
            parse_set(&ok, &g).unwrap(),
            vec![Change {
                group: 1,
                state: AccessState::Standby,
                preferred: None
            }]
        );
        assert_eq!(
            parse_set(&[0, 0, 0, 0, 0x0e, 0, 0, 1], &g),
            Err(Sense::INVALID_FIELD_IN_PARAMETER_LIST.param_field(4, Some(3)))
        );
        assert_eq!(
            parse_set(&[0, 0, 0, 0, 0x00, 0, 0, 5], &g),
            Err(Sense::INVALID_FIELD_IN_PARAMETER_LIST.param_field(6, Some(7)))
        );
        assert_eq!(
            parse_set(&[0, 0, 0, 0, 0x00, 0], &g),
            Err(Sense::PARAMETER_LIST_LENGTH_ERROR)
        );
    }

    #[test]
    fn restricted_states_serve_what_spc_lists() {
        let none = Served::default();
        let standby = Served {
            standby: true,
            ..Served::default()
        };
        assert_eq!(AccessState::ActiveNonOptimized.refuses(none), None);
        assert_eq!(
            AccessState::Standby.refuses(none),
            Some(Sense::TARGET_PORT_IN_STANDBY_STATE)
        );
        assert_eq!(AccessState::Standby.refuses(standby), None);
        assert_eq!(
            AccessState::Unavailable.refuses(standby),
            Some(Sense::TARGET_PORT_IN_UNAVAILABLE_STATE)
        );
        assert_eq!(
            AccessState::Transitioning.refuses(standby),
            Some(Sense::ASYMMETRIC_ACCESS_STATE_TRANSITION)
        );
    }
}
