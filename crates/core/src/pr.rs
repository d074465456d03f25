//! SPC-4 persistent reservations (§5.13) of one device: registrations,
//! the reservation, PERSISTENT RESERVE IN parameter data, PERSISTENT RESERVE
//! OUT service actions, the conflict rules, the unit attentions they raise
//! on other nexuses, and the APTPL state as bytes.
//!
//! One [`PrState`] per device, shared by every core behind a mutex in
//! [`DeviceShared`](crate::device): taken by PERSISTENT RESERVE commands,
//! and by other commands only while a reservation exists or unit
//! attentions wait for a nexus (two atomics say so).
//!
//! Persistence (APTPL): [`PrState::encode`] and [`PrState::decode`] give
//! the state as bytes; a [`PrStore`] the daemon sets on the device writes
//! them after every change while APTPL is set ([`DirStore`] writes one file
//! atomically in a directory).
//!
//! Registrations name initiator ports the way the fabrics name them
//! (`iqn...,i,0x<isid>` for iSCSI, `0x<32 hex digits>` for SRP), so a
//! registration made for a port through SPEC_I_PT or REGISTER AND MOVE
//! before that initiator logged in applies as soon as it does; an iSCSI
//! TransportID without an ISID (format 00b) names every port of that
//! initiator. ALL_TG_PT registrations hold through every target port.
//!
//! Not supported: REPLACE LOST RESERVATION (INVALID FIELD IN CDB), and
//! REGISTER AND MOVE to a target port the logical unit has seen no
//! registration through (INVALID FIELD IN PARAMETER LIST: the device
//! server knows a relative target port identifier only from a nexus).

use std::io::Write as _;
use std::path::PathBuf;

use ferrite_scsi::Sense;

use crate::ops::Pr;

/// PERSISTENT RESERVE OUT service actions (SPC-4 table 197).
pub mod out_sa {
    pub const REGISTER: u8 = 0;
    pub const RESERVE: u8 = 1;
    pub const RELEASE: u8 = 2;
    pub const CLEAR: u8 = 3;
    pub const PREEMPT: u8 = 4;
    pub const PREEMPT_AND_ABORT: u8 = 5;
    pub const REGISTER_AND_IGNORE: u8 = 6;
    pub const REGISTER_AND_MOVE: u8 = 7;
}

/// The longest PERSISTENT RESERVE OUT parameter list taken: the basic 24
/// bytes and hundreds of TransportIDs for SPEC_I_PT.
pub const MAX_OUT_PARAMS: u32 = 64 << 10;

/// PERSISTENT RESERVE IN service actions (SPC-4 table 187).
pub mod in_sa {
    pub const READ_KEYS: u8 = 0;
    pub const READ_RESERVATION: u8 = 1;
    pub const REPORT_CAPABILITIES: u8 = 2;
    pub const READ_FULL_STATUS: u8 = 3;
}

/// Reservation types (SPC-4 table 189).
pub mod kind {
    pub const WRITE_EXCLUSIVE: u8 = 1;
    pub const EXCLUSIVE_ACCESS: u8 = 3;
    pub const WRITE_EXCLUSIVE_RO: u8 = 5;
    pub const EXCLUSIVE_ACCESS_RO: u8 = 6;
    pub const WRITE_EXCLUSIVE_AR: u8 = 7;
    pub const EXCLUSIVE_ACCESS_AR: u8 = 8;
}

fn valid_type(t: u8) -> bool {
    matches!(t, 1 | 3 | 5 | 6 | 7 | 8)
}

fn all_registrants(t: u8) -> bool {
    matches!(t, kind::WRITE_EXCLUSIVE_AR | kind::EXCLUSIVE_ACCESS_AR)
}

/// An I_T nexus as reservations see it: initiator port and target port.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PrNexus {
    pub initiator_port: String,
    pub target: String,
    pub rel_port: u16,
}

/// One registration (SPC-4 §5.13.7).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Registration {
    pub nexus: PrNexus,
    /// Registered through every target port (ALL_TG_PT).
    pub all_tg_pt: bool,
    pub key: u64,
}

impl Registration {
    fn matches(&self, n: &PrNexus) -> bool {
        port_matches(&self.nexus.initiator_port, &n.initiator_port)
            && (self.all_tg_pt || self.nexus.target == n.target)
    }
}

impl PrNexus {
    /// Whether this nexus (as registered or reserving) covers the I_T
    /// nexus of `initiator_port` through `target`: the same port, or any
    /// port of an iSCSI initiator named without an ISID.
    pub fn covers(&self, initiator_port: &str, target: &str) -> bool {
        self.target == target && port_matches(&self.initiator_port, initiator_port)
    }
}

/// `registered` names `port`: the same port, or an iSCSI name without an
/// ISID (TransportID format 00b, SPC-4 §7.6.4.6) naming its initiator.
fn port_matches(registered: &str, port: &str) -> bool {
    registered == port
        || (!registered.contains(",i,0x")
            && port
                .split_once(",i,0x")
                .is_some_and(|(name, _)| name == registered))
}

/// SPC-4 §7.6.4 protocol identifiers this target parses TransportIDs of.
const PROTO_SRP: u8 = 0x4;
const PROTO_ISCSI: u8 = 0x5;

/// Parses the TransportID at the start of `b` (SPC-4 §7.6.4.5 SRP,
/// §7.6.4.6 iSCSI): the initiator port it names, as the fabrics name
/// ports, and its length. `None` if it is not one this target knows.
pub fn parse_transport_id(b: &[u8]) -> Option<(String, usize)> {
    let first = *b.first()?;
    let format = first >> 6;
    match first & 0x0f {
        PROTO_SRP if format == 0 => {
            let id = b.get(8..24)?;
            let mut port = String::from("0x");
            for x in id {
                port.push_str(&format!("{x:02x}"));
            }
            Some((port, 24))
        }
        PROTO_ISCSI if format <= 1 => {
            let addl = u16::from_be_bytes([*b.get(2)?, *b.get(3)?]) as usize;
            let len = 4 + addl;
            let field = b.get(4..len)?;
            let end = field.iter().position(|&c| c == 0).unwrap_or(field.len());
            let text = std::str::from_utf8(&field[..end]).ok()?;
            if text.is_empty() || !text.is_ascii() || text.contains(char::is_whitespace) {
                return None;
            }
            let port = match (format, text.split_once(",i,0x")) {
                (0, None) if !text.contains(',') => text.to_string(),
                (1, Some((name, isid)))
                    if !name.is_empty()
                        && isid.len() == 12
                        && isid.chars().all(|c| c.is_ascii_hexdigit()) =>
                {
                    format!("{name},i,0x{}", isid.to_ascii_lowercase())
                }
                _ => return None,
            };
            Some((port, len))
        }
        _ => None,
    }
}

/// The persistent reservation: its holder (a registration index is not
/// stable, so the holder's nexus), type and scope (LU_SCOPE only).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reservation {
    /// `None` for the all-registrants types: every registrant holds it.
    pub holder: Option<PrNexus>,
    pub kind: u8,
}

/// Where persistent reservation state goes when APTPL is set.
pub trait PrStore: Send + Sync + std::fmt::Debug {
    /// Replaces the saved state with `bytes` (empty: nothing persists).
    fn save(&self, bytes: &[u8]) -> std::io::Result<()>;

    /// A store other targets serving the same devices read (a cluster):
    /// every change is saved, APTPL or not, and one that cannot be saved
    /// fails its command and is undone, so no node acts on a reservation
    /// the others do not know of.
    fn shared(&self) -> bool {
        false
    }

    /// A shared store's state as it is now (another target may have
    /// changed it), read before a PERSISTENT RESERVE IN or OUT runs; `None`
    /// for a store only this target writes.
    fn load(&self) -> Option<std::io::Result<Vec<u8>>> {
        None
    }
}

/// A [`PrStore`] writing `<dir>/pr_state` atomically: temporary file,
/// fsync, rename, fsync of the directory. PERSISTENT RESERVE OUT with APTPL
/// is rare control traffic; the write happens on the core that runs it.
#[derive(Debug, Clone)]
pub struct DirStore {
    pub dir: PathBuf,
}

impl DirStore {
    /// The file the state lives in.
    pub fn path(&self) -> PathBuf {
        self.dir.join("pr_state")
    }

    /// The saved state, if any (for [`Device::restore_reservations`](crate::device::Device::restore_reservations)).
    pub fn load(&self) -> std::io::Result<Option<Vec<u8>>> {
        match std::fs::read(self.path()) {
            Ok(b) => Ok(Some(b)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }
}

impl PrStore for DirStore {
    fn save(&self, bytes: &[u8]) -> std::io::Result<()> {
        write_atomic(&self.path(), bytes)
    }
}

/// Writes `bytes` to `path` so that a crash leaves the old or the new
/// content: its folder made if need be, a temporary file beside it written
/// and fsynced, renamed over it, then the folder fsynced. The saved state
/// of reservations and of ALUA groups is written this way.
pub fn write_atomic(path: &std::path::Path, bytes: &[u8]) -> std::io::Result<()> {
    let dir = path.parent().unwrap_or(std::path::Path::new("."));
    std::fs::create_dir_all(dir)?;
    let name = path
        .file_name()
        .map_or_else(|| "state".into(), |n| n.to_string_lossy().into_owned());
    let tmp = dir.join(format!(".{name}.tmp"));
    let r = (|| {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)?;
        std::fs::File::open(dir)?.sync_all()
    })();
    if r.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    r
}

/// What a PERSISTENT RESERVE OUT did besides its status: unit attentions
/// for other nexuses and nexuses whose tasks PREEMPT AND ABORT aborts.
#[derive(Debug, Default)]
pub struct OutEffects {
    pub ua: Vec<(PrNexus, Sense)>,
    pub abort: Vec<PrNexus>,
}

/// Why a PERSISTENT RESERVE OUT failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PrError {
    /// RESERVATION CONFLICT status.
    Conflict,
    /// CHECK CONDITION with this sense.
    Check(Sense),
}

/// Persistent reservation state of one device.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PrState {
    /// PRGENERATION: bumped by every registration change (SPC-4 §6.16.2).
    pub generation: u32,
    pub regs: Vec<Registration>,
    pub res: Option<Reservation>,
    /// Activate persist through power loss.
    pub aptpl: bool,
}

impl PrState {
    fn reg_of(&self, n: &PrNexus) -> Option<usize> {
        self.regs.iter().position(|r| r.matches(n))
    }

    fn is_holder(&self, n: &PrNexus) -> bool {
        match &self.res {
            None => false,
            Some(r) => match &r.holder {
                None => self.reg_of(n).is_some(),
                Some(h) => h.covers(&n.initiator_port, &n.target),
            },
        }
    }

    /// The key the holder registered (0 for the all-registrants types).
    fn holder_key(&self) -> u64 {
        match self.res.as_ref().and_then(|r| r.holder.as_ref()) {
            Some(h) => self.reg_of(h).map_or(0, |i| self.regs[i].key),
            None => 0,
        }
    }

    /// SPC-4 §5.13.1 table 66: does `op` from `n` conflict with the
    /// reservation?
    pub fn conflicts(&self, n: &PrNexus, op: u8) -> bool {
        let Some(r) = &self.res else {
            return false;
        };
        if self.is_holder(n) {
            return false;
        }
        let access = crate::ops::of(op).pr;
        if access == Pr::Always {
            return false;
        }
        let registered = self.reg_of(n).is_some();
        match r.kind {
            kind::WRITE_EXCLUSIVE => access == Pr::Write,
            kind::EXCLUSIVE_ACCESS => true,
            kind::WRITE_EXCLUSIVE_RO | kind::WRITE_EXCLUSIVE_AR => {
                !registered && access == Pr::Write
            }
            _ => !registered,
        }
    }

    /// The other registered nexuses (for unit attentions).
    fn others(&self, n: &PrNexus) -> Vec<PrNexus> {
        self.regs
            .iter()
            .filter(|r| !r.matches(n))
            .map(|r| r.nexus.clone())
            .collect()
    }

    /// Runs one PERSISTENT RESERVE OUT (SPC-4 §6.17) from `n`.
    pub fn out(&mut self, n: &PrNexus, cdb: &[u8], params: &[u8]) -> Result<OutEffects, PrError> {
        let sa = cdb[1] & 0x1f;
        let scope = cdb[2] >> 4;
        let rtype = cdb[2] & 0x0f;
        let plen = u32::from_be_bytes([cdb[5], cdb[6], cdb[7], cdb[8]]) as usize;
        if !matches!(sa, 0..=7) {
            return Err(PrError::Check(
                Sense::INVALID_FIELD_IN_CDB.cdb_field(1, Some(4)),
            ));
        }
        // SPC-4 §6.17.3: the basic parameter list is 24 bytes; REGISTER
        // with SPEC_I_PT (§6.17.3) and REGISTER AND MOVE (§6.17.4) add
        // TransportIDs after it, their length in bytes 24..28 and 20..24.
        if plen < 24 || params.len() < plen {
            return Err(PrError::Check(Sense::PARAMETER_LIST_LENGTH_ERROR));
        }
        let be32 = |at: usize| {
            u32::from_be_bytes([params[at], params[at + 1], params[at + 2], params[at + 3]])
                as usize
        };
        let key = u64::from_be_bytes(params[0..8].try_into().unwrap_or([0; 8]));
        let sakey = u64::from_be_bytes(params[8..16].try_into().unwrap_or([0; 8]));
        let flags = params[20];
        let spec_i_pt = sa != out_sa::REGISTER_AND_MOVE && flags & 0x08 != 0;
        let all_tg_pt = flags & 0x04 != 0;
        let aptpl = flags & 0x01 != 0;
        let want = if sa == out_sa::REGISTER_AND_MOVE {
            24 + be32(20)
        } else if spec_i_pt {
            if plen >= 28 { 28 + be32(24) } else { 28 }
        } else {
            24
        };
        if plen != want {
            return Err(PrError::Check(Sense::PARAMETER_LIST_LENGTH_ERROR));
        }
        let params = &params[..plen];
        let mut fx = OutEffects::default();
        let me = self.reg_of(n);
        if spec_i_pt && (sa != out_sa::REGISTER || me.is_some()) {
            // SPC-4 §6.17.3: SPEC_I_PT is for REGISTER from an
            // unregistered I_T nexus only.
            return Err(PrError::Check(
                Sense::INVALID_FIELD_IN_PARAMETER_LIST.param_field(20, Some(3)),
            ));
        }
        match sa {
            out_sa::REGISTER | out_sa::REGISTER_AND_IGNORE => {
                let ignore = sa == out_sa::REGISTER_AND_IGNORE;
                match me {
                    None => {
                        // SPC-4 §5.13.7.2: an unregistered nexus must give
                        // a reservation key of zero.
                        if !ignore && key != 0 {
                            return Err(PrError::Conflict);
                        }
                        // SPC-4 §5.14.7: with SPEC_I_PT, every I_T nexus a
                        // TransportID names through this target port (or
                        // every port, ALL_TG_PT) is registered too; all of
                        // them or none.
                        let others = if spec_i_pt {
                            self.specified_nexuses(n, &params[28..])?
                        } else {
                            Vec::new()
                        };
                        if sakey != 0 {
                            self.regs.push(Registration {
                                nexus: n.clone(),
                                all_tg_pt,
                                key: sakey,
                            });
                            for nexus in others {
                                self.regs.push(Registration {
                                    nexus,
                                    all_tg_pt,
                                    key: sakey,
                                });
                            }
                            self.generation = self.generation.wrapping_add(1);
                        }
                    }
                    Some(i) => {
                        if !ignore && key != self.regs[i].key {
                            return Err(PrError::Conflict);
                        }
                        if sakey == 0 {
                            self.unregister(i, &mut fx);
                        } else {
                            self.regs[i].key = sakey;
                        }
                        self.generation = self.generation.wrapping_add(1);
                    }
                }
                self.aptpl = aptpl;
            }
            _ => {
                let Some(i) = me else {
                    return Err(PrError::Conflict);
                };
                if key != self.regs[i].key {
                    return Err(PrError::Conflict);
                }
                match sa {
                    out_sa::RESERVE => {
                        check_scope_type(scope, rtype)?;
                        match &self.res {
                            None => {
                                self.res = Some(Reservation {
                                    holder: (!all_registrants(rtype)).then(|| n.clone()),
                                    kind: rtype,
                                })
                            }
                            Some(r) => {
                                if !(self.is_holder(n) && r.kind == rtype) {
                                    return Err(PrError::Conflict);
                                }
                            }
                        }
                    }
                    out_sa::RELEASE => {
                        let Some(r) = self.res.clone() else {
                            return Ok(fx);
                        };
                        if !self.is_holder(n) {
                            return Ok(fx);
                        }
                        // SPC-4 §5.13.11.2: a type or scope that differs is
                        // INVALID RELEASE OF PERSISTENT RESERVATION.
                        if r.kind != rtype || scope != 0 {
                            return Err(PrError::Check(Sense::INVALID_RELEASE_OF_PR));
                        }
                        self.res = None;
                        if !matches!(r.kind, kind::WRITE_EXCLUSIVE | kind::EXCLUSIVE_ACCESS) {
                            for o in self.others(n) {
                                fx.ua.push((o, Sense::RESERVATIONS_RELEASED));
                            }
                        }
                    }
                    out_sa::REGISTER_AND_MOVE => {
                        self.register_and_move(n, i, sakey, params)?;
                        self.generation = self.generation.wrapping_add(1);
                    }
                    out_sa::CLEAR => {
                        for o in self.others(n) {
                            fx.ua.push((o, Sense::RESERVATIONS_PREEMPTED));
                        }
                        self.regs.clear();
                        self.res = None;
                        self.generation = self.generation.wrapping_add(1);
                    }
                    _ => {
                        // PREEMPT, PREEMPT AND ABORT (SPC-4 §5.13.11.4).
                        let abort = sa == out_sa::PREEMPT_AND_ABORT;
                        self.preempt(n, sakey, scope, rtype, abort, &mut fx)?;
                        self.generation = self.generation.wrapping_add(1);
                    }
                }
            }
        }
        Ok(fx)
    }

    /// The I_T nexuses the TransportIDs of a SPEC_I_PT list name through
    /// the target port of `n`; INVALID FIELD IN PARAMETER LIST (pointing
    /// at the TransportID) for one this target cannot parse or one already
    /// registered.
    fn specified_nexuses(&self, n: &PrNexus, tids: &[u8]) -> Result<Vec<PrNexus>, PrError> {
        let mut out: Vec<PrNexus> = Vec::new();
        let mut at = 0;
        while at < tids.len() {
            let bad = || {
                PrError::Check(
                    Sense::INVALID_FIELD_IN_PARAMETER_LIST.param_field((28 + at) as u16, None),
                )
            };
            let (port, len) = parse_transport_id(&tids[at..]).ok_or_else(bad)?;
            let nexus = PrNexus {
                initiator_port: port,
                target: n.target.clone(),
                rel_port: n.rel_port,
            };
            // Already registered, or (a name without ISID) covering a port
            // that is.
            let taken = self.reg_of(&nexus).is_some()
                || self
                    .regs
                    .iter()
                    .any(|r| nexus.covers(&r.nexus.initiator_port, &r.nexus.target))
                || nexus.covers(&n.initiator_port, &n.target)
                || out
                    .iter()
                    .any(|o| o.covers(&nexus.initiator_port, &nexus.target));
            if taken {
                return Err(bad());
            }
            out.push(nexus);
            at += len;
        }
        Ok(out)
    }

    /// SPC-4 §5.14.8 REGISTER AND MOVE by `n` (registration `i`, its key
    /// checked): the reservation `n` holds moves, type and scope kept, to
    /// the I_T nexus of the TransportID and RELATIVE TARGET PORT
    /// IDENTIFIER, registered with the service action key if it was not;
    /// UNREG then unregisters `n`.
    fn register_and_move(
        &mut self,
        n: &PrNexus,
        i: usize,
        sakey: u64,
        params: &[u8],
    ) -> Result<(), PrError> {
        let res = match &self.res {
            // Only the holder of a reservation that has one holder moves it.
            Some(r) if r.holder.is_some() && self.is_holder(n) => r.clone(),
            _ => return Err(PrError::Conflict),
        };
        if sakey == 0 {
            return Err(PrError::Check(
                Sense::INVALID_FIELD_IN_PARAMETER_LIST.param_field(8, None),
            ));
        }
        let unreg = params[17] & 0x02 != 0;
        let aptpl = params[17] & 0x01 != 0;
        let rel = u16::from_be_bytes([params[18], params[19]]);
        let bad_tid =
            || PrError::Check(Sense::INVALID_FIELD_IN_PARAMETER_LIST.param_field(24, None));
        let (port, len) = parse_transport_id(&params[24..]).ok_or_else(bad_tid)?;
        if 24 + len > params.len() {
            return Err(bad_tid());
        }
        let target = if rel == n.rel_port {
            n.target.clone()
        } else {
            match self.regs.iter().find(|r| r.nexus.rel_port == rel) {
                Some(r) => r.nexus.target.clone(),
                None => {
                    return Err(PrError::Check(
                        Sense::INVALID_FIELD_IN_PARAMETER_LIST.param_field(18, None),
                    ));
                }
            }
        };
        let dest = PrNexus {
            initiator_port: port,
            target,
            rel_port: rel,
        };
        // Moving to itself is not a move.
        if dest.covers(&n.initiator_port, &n.target) || n.covers(&dest.initiator_port, &dest.target)
        {
            return Err(bad_tid());
        }
        if self.reg_of(&dest).is_none() {
            self.regs.push(Registration {
                nexus: dest.clone(),
                all_tg_pt: false,
                key: sakey,
            });
        }
        self.res = Some(Reservation {
            holder: Some(dest),
            kind: res.kind,
        });
        if unreg {
            self.regs.remove(i);
        }
        self.aptpl = aptpl;
        Ok(())
    }

    /// Removes registration `i`; SPC-4 §5.13.11.2.3: the holder's
    /// unregistration releases its reservation (the last registrant's, for
    /// the all-registrants types).
    fn unregister(&mut self, i: usize, fx: &mut OutEffects) {
        let r = self.regs.remove(i);
        let Some(res) = self.res.clone() else {
            return;
        };
        let released = match &res.holder {
            Some(h) => r.matches(h),
            None => self.regs.is_empty(),
        };
        if released {
            self.res = None;
            if matches!(
                res.kind,
                kind::WRITE_EXCLUSIVE_RO | kind::EXCLUSIVE_ACCESS_RO
            ) {
                for o in &self.regs {
                    fx.ua.push((o.nexus.clone(), Sense::RESERVATIONS_RELEASED));
                }
            }
        }
    }

    fn preempt(
        &mut self,
        n: &PrNexus,
        sakey: u64,
        scope: u8,
        rtype: u8,
        abort: bool,
        fx: &mut OutEffects,
    ) -> Result<(), PrError> {
        let take = |st: &mut PrState, pred: &dyn Fn(&Registration) -> bool, fx: &mut OutEffects| {
            let mut removed = 0;
            st.regs.retain(|r| {
                if !r.matches(n) && pred(r) {
                    fx.ua
                        .push((r.nexus.clone(), Sense::REGISTRATIONS_PREEMPTED));
                    if abort {
                        fx.abort.push(r.nexus.clone());
                    }
                    removed += 1;
                    false
                } else {
                    true
                }
            });
            removed
        };
        let res = self.res.clone();
        match res {
            Some(r) if r.holder.is_none() => {
                // All-registrants reservation: a key of zero preempts every
                // other registration and the reservation.
                if sakey == 0 {
                    check_scope_type(scope, rtype)?;
                    take(self, &|_| true, fx);
                    self.res = Some(Reservation {
                        holder: (!all_registrants(rtype)).then(|| n.clone()),
                        kind: rtype,
                    });
                } else {
                    take(self, &|r| r.key == sakey, fx);
                }
            }
            Some(_) if sakey == self.holder_key() => {
                check_scope_type(scope, rtype)?;
                take(self, &|r| r.key == sakey, fx);
                self.res = Some(Reservation {
                    holder: (!all_registrants(rtype)).then(|| n.clone()),
                    kind: rtype,
                });
            }
            _ => {
                if sakey == 0 {
                    return Err(PrError::Check(
                        Sense::INVALID_FIELD_IN_PARAMETER_LIST.param_field(8, None),
                    ));
                }
                if take(self, &|r| r.key == sakey, fx) == 0 {
                    return Err(PrError::Conflict);
                }
            }
        }
        Ok(())
    }

    /// PERSISTENT RESERVE IN parameter data (SPC-4 §6.16) into `out`;
    /// returns the allocation length.
    pub fn data_in(&self, cdb: &[u8], out: &mut Vec<u8>) -> Result<u32, Sense> {
        let sa = cdb[1] & 0x1f;
        let alloc = u16::from_be_bytes([cdb[7], cdb[8]]) as u32;
        out.clear();
        match sa {
            in_sa::READ_KEYS => {
                out.extend(self.generation.to_be_bytes());
                out.extend(((self.regs.len() * 8) as u32).to_be_bytes());
                for r in &self.regs {
                    out.extend(r.key.to_be_bytes());
                }
            }
            in_sa::READ_RESERVATION => {
                out.extend(self.generation.to_be_bytes());
                match &self.res {
                    None => out.extend(0u32.to_be_bytes()),
                    Some(r) => {
                        out.extend(16u32.to_be_bytes());
                        out.extend(self.holder_key().to_be_bytes());
                        out.extend([0u8; 4]);
                        out.push(0);
                        out.push(r.kind & 0x0f);
                        out.extend([0u8; 2]);
                    }
                }
            }
            in_sa::REPORT_CAPABILITIES => {
                out.extend(8u16.to_be_bytes());
                // CRH = 1 (RESERVE/RELEASE(6/10) with a persistent
                // reservation: RESERVATION CONFLICT), SIP_C, ATP_C, PTPL_C.
                out.push(0x10 | 0x08 | 0x04 | 0x01);
                // TMV, ALLOW COMMANDS = 000b, PTPL_A.
                out.push(0x80 | u8::from(self.aptpl));
                // Type mask: WR_EX_AR, EX_AC_RO, WR_EX_RO, EX_AC, WR_EX;
                // EX_AC_AR.
                out.push(0x80 | 0x40 | 0x20 | 0x08 | 0x02);
                out.push(0x01);
                out.extend([0u8; 2]);
            }
            in_sa::READ_FULL_STATUS => {
                out.extend(self.generation.to_be_bytes());
                out.extend(0u32.to_be_bytes());
                for r in &self.regs {
                    // The registration the holder holds through (the
                    // holder may be one port of a name registered whole).
                    let holder = match self.res.as_ref().map(|x| &x.holder) {
                        None => false,
                        Some(None) => true,
                        Some(Some(h)) => r.matches(h),
                    };
                    out.extend(r.key.to_be_bytes());
                    out.extend([0u8; 4]);
                    out.push(u8::from(r.all_tg_pt) << 1 | u8::from(holder));
                    out.push(if holder {
                        self.res.as_ref().map_or(0, |x| x.kind)
                    } else {
                        0
                    });
                    out.extend([0u8; 4]);
                    out.extend(r.nexus.rel_port.to_be_bytes());
                    let tid = transport_id(&r.nexus.initiator_port);
                    out.extend((tid.len() as u32).to_be_bytes());
                    out.extend(tid);
                }
                let len = (out.len() - 8) as u32;
                out[4..8].copy_from_slice(&len.to_be_bytes());
            }
            _ => return Err(Sense::INVALID_FIELD_IN_CDB.cdb_field(1, Some(4))),
        }
        Ok(alloc)
    }

    /// The state as bytes for a [`PrStore`] (a small line format: generation,
    /// then one line per registration, then the reservation). Names are
    /// written with [`escape_name`], so whatever an initiator called itself
    /// reads back as it was.
    pub fn encode(&self) -> Vec<u8> {
        let mut s = format!(
            "ferrite-pr 2\ngeneration {}\naptpl {}\n",
            self.generation,
            u8::from(self.aptpl)
        );
        for r in &self.regs {
            s.push_str(&format!(
                "reg {:016x} {} {} {} {}\n",
                r.key,
                u8::from(r.all_tg_pt),
                r.nexus.rel_port,
                escape_name(&r.nexus.initiator_port),
                escape_name(&r.nexus.target)
            ));
        }
        if let Some(r) = &self.res {
            match &r.holder {
                Some(h) => s.push_str(&format!(
                    "res {} {} {}\n",
                    r.kind,
                    escape_name(&h.initiator_port),
                    escape_name(&h.target)
                )),
                None => s.push_str(&format!("res {} * *\n", r.kind)),
            }
        }
        s.into_bytes()
    }

    /// Parses [`PrState::encode`]'s bytes; `None` if they are not that.
    /// Version 1 files (names written as they were, saved only with APTPL
    /// set) read too.
    pub fn decode(b: &[u8]) -> Option<PrState> {
        let text = std::str::from_utf8(b).ok()?;
        let mut lines = text.lines();
        let name: fn(&str) -> Option<String> = match lines.next()? {
            "ferrite-pr 1" => |n| Some(n.to_string()),
            "ferrite-pr 2" => unescape_name,
            _ => return None,
        };
        let mut st = PrState {
            aptpl: true,
            ..PrState::default()
        };
        for l in lines {
            let f: Vec<&str> = l.split(' ').collect();
            match f.as_slice() {
                ["generation", g] => st.generation = g.parse().ok()?,
                ["aptpl", a] => st.aptpl = *a == "1",
                ["reg", key, atp, port, ip, tgt] => st.regs.push(Registration {
                    key: u64::from_str_radix(key, 16).ok()?,
                    all_tg_pt: *atp == "1",
                    nexus: PrNexus {
                        initiator_port: name(ip)?,
                        target: name(tgt)?,
                        rel_port: port.parse().ok()?,
                    },
                }),
                ["res", k, ip, tgt] => {
                    let kind: u8 = k.parse().ok()?;
                    let holder = if *ip == "*" {
                        None
                    } else {
                        Some(PrNexus {
                            initiator_port: name(ip)?,
                            target: name(tgt)?,
                            rel_port: 0,
                        })
                    };
                    st.res = Some(Reservation { holder, kind });
                }
                [""] | [] => {}
                _ => return None,
            }
        }
        Some(st)
    }
}

/// A name as one word of the saved state: bytes other than printable ASCII,
/// `%` and `*` as `%XX`, an empty name as `%`. Names come from initiators,
/// and nothing stops one from putting a space or a newline in its own.
fn escape_name(n: &str) -> String {
    if n.is_empty() {
        return "%".into();
    }
    let mut out = String::with_capacity(n.len());
    for &b in n.as_bytes() {
        if b.is_ascii_graphic() && b != b'%' && b != b'*' {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The inverse of [`escape_name`]; `None` for a word it cannot have written.
fn unescape_name(w: &str) -> Option<String> {
    if w == "%" {
        return Some(String::new());
    }
    let mut out = Vec::with_capacity(w.len());
    let mut b = w.bytes();
    while let Some(c) = b.next() {
        if c == b'%' {
            let hex = [b.next()?, b.next()?];
            out.push(u8::from_str_radix(std::str::from_utf8(&hex).ok()?, 16).ok()?);
        } else {
            out.push(c);
        }
    }
    String::from_utf8(out).ok()
}

fn check_scope_type(scope: u8, rtype: u8) -> Result<(), PrError> {
    // SPC-4 §6.17.2: LU_SCOPE only; unknown types are invalid.
    if scope != 0 {
        return Err(PrError::Check(
            Sense::INVALID_FIELD_IN_CDB.cdb_field(2, Some(7)),
        ));
    }
    if !valid_type(rtype) {
        return Err(PrError::Check(
            Sense::INVALID_FIELD_IN_CDB.cdb_field(2, Some(3)),
        ));
    }
    Ok(())
}

/// The TransportID of an initiator port: SRP (SPC-4 §7.6.4.5) for a port
/// named `0x<32 hex digits>`, else iSCSI (§7.6.4.6) for one named
/// `iqn...,i,0x<isid>`: FORMAT CODE 01b (name and ISID), or 00b for a bare
/// name; padded to a multiple of four bytes.
fn transport_id(port: &str) -> Vec<u8> {
    if let Some(hex) = port.strip_prefix("0x")
        && hex.len() == 32
        && let Ok(id) = u128::from_str_radix(hex, 16)
    {
        let mut v = vec![PROTO_SRP, 0, 0, 0, 0, 0, 0, 0];
        v.extend(id.to_be_bytes());
        return v;
    }
    let format = if port.contains(",i,0x") { 0x40 } else { 0x00 };
    let mut name = port.as_bytes().to_vec();
    name.push(0);
    while !(name.len() + 4).is_multiple_of(4) || name.len() + 4 < 24 {
        name.push(0);
    }
    let mut v = vec![format | 0x05, 0];
    v.extend((name.len() as u16).to_be_bytes());
    v.extend(name);
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nx(i: u8) -> PrNexus {
        PrNexus {
            initiator_port: format!("iqn.test:i{i},i,0x00023d000001"),
            target: "iqn.test:t".into(),
            rel_port: 1,
        }
    }

    fn cdb(sa: u8, rtype: u8) -> [u8; 10] {
        [0x5f, sa, rtype, 0, 0, 0, 0, 0, 24, 0]
    }

    fn params(key: u64, sakey: u64, flags: u8) -> [u8; 24] {
        let mut p = [0u8; 24];
        p[0..8].copy_from_slice(&key.to_be_bytes());
        p[8..16].copy_from_slice(&sakey.to_be_bytes());
        p[20] = flags;
        p
    }

    #[test]
    fn register_reserve_conflicts_release() {
        let mut st = PrState::default();
        let (a, b) = (nx(1), nx(2));
        // An unregistered nexus must give key 0.
        assert_eq!(
            st.out(&a, &cdb(0, 0), &params(5, 1, 0)).unwrap_err(),
            PrError::Conflict
        );
        st.out(&a, &cdb(0, 0), &params(0, 0xa, 0)).unwrap();
        st.out(&b, &cdb(6, 0), &params(0, 0xb, 0)).unwrap();
        assert_eq!(st.generation, 2);
        // RESERVE needs the right key.
        assert_eq!(
            st.out(&a, &cdb(1, 1), &params(0xb, 0, 0)).unwrap_err(),
            PrError::Conflict
        );
        st.out(&a, &cdb(1, kind::WRITE_EXCLUSIVE), &params(0xa, 0, 0))
            .unwrap();
        assert!(!st.conflicts(&b, 0x28));
        assert!(st.conflicts(&b, 0x2a));
        assert!(!st.conflicts(&a, 0x2a));
        assert!(!st.conflicts(&b, 0x12));
        // B cannot reserve; A reserving again with the same type is GOOD.
        assert_eq!(
            st.out(&b, &cdb(1, 1), &params(0xb, 0, 0)).unwrap_err(),
            PrError::Conflict
        );
        st.out(&a, &cdb(1, 1), &params(0xa, 0, 0)).unwrap();
        // Releasing with another type is INVALID RELEASE.
        assert_eq!(
            st.out(&a, &cdb(2, 3), &params(0xa, 0, 0)).unwrap_err(),
            PrError::Check(Sense::INVALID_RELEASE_OF_PR)
        );
        st.out(&a, &cdb(2, 1), &params(0xa, 0, 0)).unwrap();
        assert!(st.res.is_none());
        // Bad parameter list length.
        let mut c = cdb(0, 0);
        c[8] = 23;
        assert_eq!(
            st.out(&a, &c, &params(0xa, 0, 0)).unwrap_err(),
            PrError::Check(Sense::PARAMETER_LIST_LENGTH_ERROR)
        );
    }

    #[test]
    fn exclusive_access_registrants_and_ownership() {
        let mut st = PrState::default();
        let (a, b, c) = (nx(1), nx(2), nx(3));
        st.out(&a, &cdb(6, 0), &params(0, 1, 0)).unwrap();
        st.out(&b, &cdb(6, 0), &params(0, 2, 0)).unwrap();
        st.out(&a, &cdb(1, kind::EXCLUSIVE_ACCESS_RO), &params(1, 0, 0))
            .unwrap();
        assert!(!st.conflicts(&b, 0x28));
        assert!(st.conflicts(&c, 0x28));
        assert!(!st.conflicts(&c, 0x00));
        // The holder unregisters: released, RESERVATIONS RELEASED to B.
        let fx = st.out(&a, &cdb(0, 0), &params(1, 0, 0)).unwrap();
        assert!(st.res.is_none());
        assert_eq!(fx.ua, vec![(b.clone(), Sense::RESERVATIONS_RELEASED)]);
        // All registrants: survives the reserving nexus leaving.
        st.out(&a, &cdb(6, 0), &params(0, 1, 0)).unwrap();
        st.out(&a, &cdb(1, kind::EXCLUSIVE_ACCESS_AR), &params(1, 0, 0))
            .unwrap();
        st.out(&a, &cdb(0, 0), &params(1, 0, 0)).unwrap();
        assert!(st.res.is_some());
        assert!(!st.conflicts(&b, 0x2a));
        assert!(st.conflicts(&c, 0x2a));
    }

    #[test]
    fn preempt_and_clear() {
        let mut st = PrState::default();
        let (a, b) = (nx(1), nx(2));
        st.out(&a, &cdb(6, 0), &params(0, 1, 0)).unwrap();
        st.out(&b, &cdb(6, 0), &params(0, 2, 0)).unwrap();
        st.out(&b, &cdb(1, kind::WRITE_EXCLUSIVE), &params(2, 0, 0))
            .unwrap();
        let fx = st
            .out(&a, &cdb(5, kind::EXCLUSIVE_ACCESS), &params(1, 2, 0))
            .unwrap();
        assert_eq!(fx.abort, vec![b.clone()]);
        assert_eq!(fx.ua, vec![(b.clone(), Sense::REGISTRATIONS_PREEMPTED)]);
        assert_eq!(st.regs.len(), 1);
        assert_eq!(st.res.as_ref().unwrap().kind, kind::EXCLUSIVE_ACCESS);
        assert!(st.conflicts(&b, 0x28));
        // Preempting a key nobody has: RESERVATION CONFLICT.
        assert_eq!(
            st.out(&a, &cdb(4, 1), &params(1, 9, 0)).unwrap_err(),
            PrError::Conflict
        );
        st.out(&b, &cdb(6, 0), &params(0, 2, 0)).unwrap();
        let fx = st.out(&a, &cdb(3, 0), &params(1, 0, 0)).unwrap();
        assert_eq!(fx.ua, vec![(b, Sense::RESERVATIONS_PREEMPTED)]);
        assert!(st.regs.is_empty() && st.res.is_none());
    }

    #[test]
    fn prin_pages_and_encoding_round_trip() {
        let mut st = PrState::default();
        let a = nx(1);
        st.out(&a, &cdb(6, 0), &params(0, 0x1122, 0x05)).unwrap();
        st.out(&a, &cdb(1, 3), &params(0x1122, 0, 0)).unwrap();
        let mut out = Vec::new();
        st.data_in(&[0x5e, 0, 0, 0, 0, 0, 0, 0, 255, 0], &mut out)
            .unwrap();
        assert_eq!(&out[4..8], &8u32.to_be_bytes());
        assert_eq!(&out[8..16], &0x1122u64.to_be_bytes());
        st.data_in(&[0x5e, 1, 0, 0, 0, 0, 0, 0, 255, 0], &mut out)
            .unwrap();
        assert_eq!((out.len(), out[21]), (24, 3));
        st.data_in(&[0x5e, 2, 0, 0, 0, 0, 0, 0, 255, 0], &mut out)
            .unwrap();
        assert_eq!(out.len(), 8);
        assert_eq!(out[3] & 1, 1); // PTPL_A
        st.data_in(&[0x5e, 3, 0, 0, 0, 0, 0, 0, 255, 0], &mut out)
            .unwrap();
        assert_eq!(out[20], 0x01 | 0x02); // holder, ALL_TG_PT
        assert!(
            st.data_in(&[0x5e, 4, 0, 0, 0, 0, 0, 0, 255, 0], &mut out)
                .is_err()
        );
        let back = PrState::decode(&st.encode()).unwrap();
        assert_eq!(back.regs, st.regs);
        assert_eq!(back.generation, st.generation);
        assert_eq!(back.res.as_ref().unwrap().kind, 3);
        assert!(back.is_holder(&a));
        assert!(PrState::decode(b"nonsense").is_none());
    }

    #[test]
    fn saved_state_keeps_any_name_an_initiator_gives() {
        let odd = PrNexus {
            initiator_port: "iqn. spaced { \"x\"\n%41*,i,0x00023d000001".into(),
            target: String::new(),
            rel_port: 7,
        };
        let st = PrState {
            aptpl: true,
            generation: 9,
            regs: vec![Registration {
                nexus: odd.clone(),
                all_tg_pt: false,
                key: 5,
            }],
            res: Some(Reservation {
                holder: Some(PrNexus {
                    rel_port: 0,
                    ..odd.clone()
                }),
                kind: 1,
            }),
        };
        let back = PrState::decode(&st.encode()).unwrap();
        assert_eq!(back.regs, st.regs);
        assert_eq!(back.res, st.res);
        // Version 1 (names as they were) still reads.
        let v1 =
            b"ferrite-pr 1\ngeneration 2\nreg 0000000000000005 0 1 iqn.a,i,0x00023d000001 iqn.t\n";
        let old = PrState::decode(v1).unwrap();
        assert_eq!(old.regs[0].nexus.initiator_port, "iqn.a,i,0x00023d000001");
        // A word version 2 cannot have written is refused.
        assert!(PrState::decode(b"ferrite-pr 2\nreg 0000000000000005 0 1 a%4 iqn.t\n").is_none());
    }

    /// An iSCSI TransportID, format 01b with an ISID or 00b without.
    fn iscsi_tid(port: &str) -> Vec<u8> {
        let format = if port.contains(",i,0x") { 0x40 } else { 0 };
        let mut name = port.as_bytes().to_vec();
        name.push(0);
        while !name.len().is_multiple_of(4) || name.len() < 20 {
            name.push(0);
        }
        let mut v = vec![format | 0x05, 0];
        v.extend((name.len() as u16).to_be_bytes());
        v.extend(name);
        v
    }

    fn spec_i_pt(key: u64, sakey: u64, flags: u8, tids: &[Vec<u8>]) -> (Vec<u8>, [u8; 10]) {
        let mut p = params(key, sakey, flags | 0x08).to_vec();
        let list: Vec<u8> = tids.concat();
        p.extend((list.len() as u32).to_be_bytes());
        p.extend(list);
        let mut c = cdb(0, 0);
        c[5..9].copy_from_slice(&(p.len() as u32).to_be_bytes());
        (p, c)
    }

    fn move_params(key: u64, sakey: u64, byte17: u8, rel: u16, tid: &[u8]) -> (Vec<u8>, [u8; 10]) {
        let mut p = params(key, sakey, 0).to_vec();
        p[17] = byte17;
        p[18..20].copy_from_slice(&rel.to_be_bytes());
        p[20..24].copy_from_slice(&(tid.len() as u32).to_be_bytes());
        p.extend(tid);
        let mut c = cdb(7, 0);
        c[5..9].copy_from_slice(&(p.len() as u32).to_be_bytes());
        (p, c)
    }

    #[test]
    fn transport_ids() {
        let a = nx(1);
        let (port, len) = parse_transport_id(&iscsi_tid(&a.initiator_port)).unwrap();
        assert_eq!((port.as_str(), len), (a.initiator_port.as_str(), 4 + 32));
        // Upper-case ISID digits name the same port.
        let up = iscsi_tid("iqn.test:i1,i,0x00023D000001");
        assert_eq!(parse_transport_id(&up).unwrap().0, a.initiator_port);
        assert_eq!(
            parse_transport_id(&iscsi_tid("iqn.test:i9")).unwrap().0,
            "iqn.test:i9"
        );
        // SRP: the 16-byte initiator port identifier, as the SRP target names it.
        let mut srp = vec![0x04, 0, 0, 0, 0, 0, 0, 0];
        srp.extend([0xab; 16]);
        let (port, len) = parse_transport_id(&srp).unwrap();
        assert_eq!((port, len), (format!("0x{}", "ab".repeat(16)), 24));
        assert_eq!(transport_id(&format!("0x{}", "ab".repeat(16))), srp);
        // Round trip of what READ FULL STATUS reports.
        assert_eq!(
            parse_transport_id(&transport_id(&a.initiator_port))
                .unwrap()
                .0,
            a.initiator_port
        );
        // Unknown protocols, a format 01b without an ISID, a truncated one.
        assert!(parse_transport_id(&[0x00; 24]).is_none());
        let mut bad = iscsi_tid("iqn.test:i9");
        bad[0] |= 0x40;
        assert!(parse_transport_id(&bad).is_none());
        assert!(parse_transport_id(&iscsi_tid("iqn.test:i9")[..10]).is_none());
        assert!(parse_transport_id(&[]).is_none());
    }

    #[test]
    fn spec_i_pt_registers_every_named_nexus_or_none() {
        let mut st = PrState::default();
        let (a, b, c) = (nx(1), nx(2), nx(3));
        let (p, cd) = spec_i_pt(
            0,
            0x77,
            0,
            &[iscsi_tid(&b.initiator_port), iscsi_tid("iqn.test:i3")],
        );
        st.out(&a, &cd, &p).unwrap();
        assert_eq!(st.regs.len(), 3);
        assert!(st.regs.iter().all(|r| r.key == 0x77));
        assert_eq!(st.generation, 1);
        // B holds a registration before it ever sent a command; C's bare
        // name covers every port of that initiator.
        assert!(st.reg_of(&b).is_some() && st.reg_of(&c).is_some());
        // A TransportID already registered: nothing at all is registered.
        let d = nx(4);
        let (p, cd) = spec_i_pt(
            0,
            0x88,
            0,
            &[iscsi_tid("iqn.test:i5"), iscsi_tid(&b.initiator_port)],
        );
        assert_eq!(
            st.out(&d, &cd, &p).unwrap_err(),
            PrError::Check(Sense::INVALID_FIELD_IN_PARAMETER_LIST.param_field(28 + 24, None))
        );
        assert_eq!(st.regs.len(), 3);
        // A name without ISID whose port B is registered is taken too.
        let (p, cd) = spec_i_pt(0, 0x88, 0, &[iscsi_tid("iqn.test:i2")]);
        assert!(matches!(st.out(&d, &cd, &p), Err(PrError::Check(_))));
        // A registered nexus cannot use SPEC_I_PT, nor REGISTER AND IGNORE.
        let (p, cd) = spec_i_pt(0x77, 0x99, 0, &[iscsi_tid("iqn.test:i5")]);
        assert!(matches!(st.out(&a, &cd, &p), Err(PrError::Check(_))));
        let (p, mut cd) = spec_i_pt(0, 0x99, 0, &[iscsi_tid("iqn.test:i5")]);
        cd[1] = 6;
        assert!(matches!(st.out(&d, &cd, &p), Err(PrError::Check(_))));
        // The TransportID list length must match the parameter list.
        let (mut p, cd) = spec_i_pt(0, 0x99, 0, &[iscsi_tid("iqn.test:i5")]);
        p[27] += 4;
        assert_eq!(
            st.out(&d, &cd, &p).unwrap_err(),
            PrError::Check(Sense::PARAMETER_LIST_LENGTH_ERROR)
        );
        // ALL_TG_PT: the registrations hold through another target port.
        let (p, cd) = spec_i_pt(0, 0x99, 0x04, &[iscsi_tid("iqn.test:i6")]);
        st.out(&d, &cd, &p).unwrap();
        let other_port = PrNexus {
            initiator_port: "iqn.test:i6,i,0x000000000001".into(),
            target: "iqn.test:other".into(),
            rel_port: 2,
        };
        assert_eq!(st.reg_of(&other_port).map(|i| st.regs[i].key), Some(0x99));
        // READ FULL STATUS reports each with its TransportID.
        let mut out = Vec::new();
        st.data_in(&[0x5e, 3, 0, 0, 0, 0, 0, 0x10, 0, 0], &mut out)
            .unwrap();
        let mut at = 8;
        let mut ports = Vec::new();
        while at < out.len() {
            let len = u32::from_be_bytes(out[at + 20..at + 24].try_into().unwrap()) as usize;
            ports.push(parse_transport_id(&out[at + 24..at + 24 + len]).unwrap().0);
            at += 24 + len;
        }
        assert_eq!(
            ports,
            vec![
                a.initiator_port.clone(),
                b.initiator_port.clone(),
                "iqn.test:i3".to_string(),
                d.initiator_port.clone(),
                "iqn.test:i6".to_string()
            ]
        );
        // The encoded state keeps them.
        assert_eq!(PrState::decode(&st.encode()).unwrap().regs, st.regs);
    }

    #[test]
    fn register_and_move() {
        let mut st = PrState::default();
        let (a, b, c) = (nx(1), nx(2), nx(3));
        st.out(&a, &cdb(0, 0), &params(0, 0xa, 0)).unwrap();
        st.out(&c, &cdb(0, 0), &params(0, 0xc, 0)).unwrap();
        let tid = iscsi_tid(&b.initiator_port);
        // No reservation yet: RESERVATION CONFLICT.
        let (p, cd) = move_params(0xa, 0xb, 0, 1, &tid);
        assert_eq!(st.out(&a, &cd, &p).unwrap_err(), PrError::Conflict);
        st.out(&a, &cdb(1, kind::WRITE_EXCLUSIVE), &params(0xa, 0, 0))
            .unwrap();
        // Only the holder moves it, with its own key, to another nexus,
        // with a non-zero key, through a known target port.
        let (p, cd) = move_params(0xc, 0xb, 0, 1, &tid);
        assert_eq!(st.out(&c, &cd, &p).unwrap_err(), PrError::Conflict);
        let (p, cd) = move_params(0xbad, 0xb, 0, 1, &tid);
        assert_eq!(st.out(&a, &cd, &p).unwrap_err(), PrError::Conflict);
        let (p, cd) = move_params(0xa, 0xb, 0, 1, &iscsi_tid(&a.initiator_port));
        assert!(matches!(st.out(&a, &cd, &p), Err(PrError::Check(_))));
        let (p, cd) = move_params(0xa, 0, 0, 1, &tid);
        assert!(matches!(st.out(&a, &cd, &p), Err(PrError::Check(_))));
        let (p, cd) = move_params(0xa, 0xb, 0, 9, &tid);
        assert_eq!(
            st.out(&a, &cd, &p).unwrap_err(),
            PrError::Check(Sense::INVALID_FIELD_IN_PARAMETER_LIST.param_field(18, None))
        );
        let before = st.generation;
        // The move: B is registered with the key and holds the reservation
        // (same type); A stays registered without UNREG.
        let (p, cd) = move_params(0xa, 0xb, 0x01, 1, &tid);
        st.out(&a, &cd, &p).unwrap();
        assert!(st.generation != before);
        assert!(st.aptpl);
        assert_eq!(st.reg_of(&b).map(|i| st.regs[i].key), Some(0xb));
        assert!(st.is_holder(&b) && !st.is_holder(&a));
        assert_eq!(st.res.as_ref().unwrap().kind, kind::WRITE_EXCLUSIVE);
        assert!(st.conflicts(&a, 0x2a));
        assert!(!st.conflicts(&b, 0x2a));
        // B moves it back with UNREG: A holds it, B is gone.
        let (p, cd) = move_params(0xb, 0xa, 0x02, 1, &iscsi_tid(&a.initiator_port));
        st.out(&b, &cd, &p).unwrap();
        assert!(st.is_holder(&a));
        assert!(st.reg_of(&b).is_none());
        assert_eq!(st.reg_of(&a).map(|i| st.regs[i].key), Some(0xa));
        // An all-registrants reservation has no holder to move.
        st.out(&a, &cdb(2, kind::WRITE_EXCLUSIVE), &params(0xa, 0, 0))
            .unwrap();
        st.out(&a, &cdb(1, kind::WRITE_EXCLUSIVE_AR), &params(0xa, 0, 0))
            .unwrap();
        let (p, cd) = move_params(0xa, 0xb, 0, 1, &tid);
        assert_eq!(st.out(&a, &cd, &p).unwrap_err(), PrError::Conflict);
        // The TransportID length must match the parameter list.
        let (mut p, cd) = move_params(0xa, 0xb, 0, 1, &tid);
        p[23] += 4;
        assert_eq!(
            st.out(&a, &cd, &p).unwrap_err(),
            PrError::Check(Sense::PARAMETER_LIST_LENGTH_ERROR)
        );
    }

    #[test]
    fn dir_store_writes_atomically() {
        let dir = std::env::temp_dir().join(format!("ferrite-pr-{}", std::process::id()));
        let s = DirStore { dir: dir.clone() };
        assert_eq!(s.load().unwrap(), None);
        s.save(b"abc").unwrap();
        assert_eq!(s.load().unwrap().as_deref(), Some(&b"abc"[..]));
        let _ = std::fs::remove_dir_all(dir);
    }
}
