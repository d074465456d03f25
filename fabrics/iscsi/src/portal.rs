//! The iSCSI portal's login decisions, shared by every core: target
//! lookup, the portal check, the core's admission (`Target::admit`: the
//! access rule every fabric shares, answered here with 0202h), LUN map
//! choice, TSIH allocation, session reinstatement (RFC 7143 §6.3.5), MC/S
//! joins and the per-address backoff after failed logins. [`CorePortal`]
//! is the [`crate::tcp::Portal`] one core's driver asks; the [`Registry`]
//! behind it is shared by all cores. Logins are control path, so a mutex
//! here is fine.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ferrite_core::device::{Refused, Target};

use crate::conn::IscsiConfig;
use crate::tcp::{Grant, Portal, Refusal, SessionLink, SessionRequest};

/// One normal session as the registry knows it (management lists them).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SessionRecord {
    pub target: String,
    pub initiator: String,
    /// RFC 7143 §11.12.5: the 6-byte ISID, as a number.
    pub isid: u64,
    pub tsih: u16,
    /// The initiator group whose LUN map the session got (None: the
    /// target's default map).
    pub group: Option<String>,
    /// Peer addresses of the session's connections.
    pub connections: Vec<String>,
}

/// Sessions known to the whole daemon.
#[derive(Debug, Default)]
pub struct Registry {
    tsihs: Mutex<TsihState>,
    sessions: Mutex<HashMap<u16, SessionRecord>>,
    /// Recent failed logins by source address.
    failures: Mutex<HashMap<IpAddr, Failures>>,
    /// Sessions replaced by a reinstatement, to be closed on their core.
    reinstated: Mutex<Vec<u16>>,
    /// `reinstated` is not empty (checked on every poll without a lock).
    reinstated_pending: AtomicBool,
    /// The core each normal session runs on (MC/S: later connections of the
    /// session move there before they log in).
    owners: Mutex<HashMap<u16, usize>>,
}

/// Failed logins from one address.
#[derive(Debug, Clone, Copy)]
struct Failures {
    count: u32,
    last: Instant,
}

/// Failures older than this are forgotten.
const FAILURE_MEMORY: Duration = Duration::from_secs(300);
/// The first failure's delay; each further one doubles it.
const FAILURE_BASE_DELAY: Duration = Duration::from_millis(250);
/// The longest a failure response is held back.
const FAILURE_MAX_DELAY: Duration = Duration::from_secs(8);

/// The delay before answering the `count`-th recent failure: 0 for the
/// first (a mistyped secret costs nothing), then doubling up to the cap.
fn backoff(count: u32) -> Duration {
    if count <= 1 {
        return Duration::ZERO;
    }
    let shift = (count - 2).min(16);
    FAILURE_BASE_DELAY
        .saturating_mul(1 << shift)
        .min(FAILURE_MAX_DELAY)
}

#[derive(Debug, Default)]
struct TsihState {
    next: u16,
    live: HashSet<u16>,
}

impl Registry {
    /// A TSIH no live session uses (RFC 7143 §11.12.6: never 0).
    fn allocate(&self) -> Option<u16> {
        let mut st = self.tsihs.lock().ok()?;
        for _ in 0..=u16::MAX {
            st.next = st.next.wrapping_add(1);
            if st.next == 0 {
                continue;
            }
            let t = st.next;
            if st.live.insert(t) {
                return Some(t);
            }
        }
        None
    }

    fn release(&self, tsih: u16) {
        if let Ok(mut st) = self.tsihs.lock() {
            st.live.remove(&tsih);
        }
        if let Ok(mut s) = self.sessions.lock() {
            s.remove(&tsih);
        }
        if let Ok(mut o) = self.owners.lock() {
            o.remove(&tsih);
        }
    }

    /// The core running session `tsih`.
    pub fn owner(&self, tsih: u16) -> Option<usize> {
        self.owners.lock().ok()?.get(&tsih).copied()
    }

    /// A connection from `peer` joins session `tsih`, which must be a live
    /// normal session of `initiator`, `isid` and `target` (RFC 7143 §6.3.1).
    fn add_connection(
        &self,
        tsih: u16,
        initiator: &str,
        isid: u64,
        target: &str,
        peer: SocketAddr,
    ) -> bool {
        let Ok(mut s) = self.sessions.lock() else {
            return false;
        };
        match s.get_mut(&tsih) {
            Some(i) if i.initiator == initiator && i.isid == isid && i.target == target => {
                i.connections.push(peer.to_string());
                true
            }
            _ => false,
        }
    }

    /// A connection of session `tsih` ended; the session goes on.
    fn remove_connection(&self, tsih: u16, peer: SocketAddr) {
        if let Ok(mut s) = self.sessions.lock()
            && let Some(i) = s.get_mut(&tsih)
        {
            let p = peer.to_string();
            if let Some(pos) = i.connections.iter().position(|c| *c == p) {
                i.connections.remove(pos);
            }
        }
    }

    /// Counts a failed login from `ip`; the answer is how long to hold its
    /// response back.
    pub fn login_failed(&self, ip: IpAddr, now: Instant) -> Duration {
        let Ok(mut f) = self.failures.lock() else {
            return Duration::ZERO;
        };
        f.retain(|_, v| now.saturating_duration_since(v.last) < FAILURE_MEMORY);
        let e = f.entry(ip).or_insert(Failures {
            count: 0,
            last: now,
        });
        e.count = e.count.saturating_add(1);
        e.last = now;
        backoff(e.count)
    }

    /// TSIHs of sessions replaced by a reinstatement since the last call;
    /// cheap when there are none.
    pub fn take_reinstated(&self) -> Vec<u16> {
        if !self.reinstated_pending.load(Ordering::Acquire) {
            return Vec::new();
        }
        let Ok(mut r) = self.reinstated.lock() else {
            return Vec::new();
        };
        self.reinstated_pending.store(false, Ordering::Release);
        std::mem::take(&mut *r)
    }

    fn reinstate(&self, old: u16) {
        if let Ok(mut r) = self.reinstated.lock() {
            r.push(old);
            self.reinstated_pending.store(true, Ordering::Release);
        }
    }

    /// A successful login from `ip` forgets its failures.
    fn login_succeeded(&self, ip: IpAddr) {
        if let Ok(mut f) = self.failures.lock() {
            f.remove(&ip);
        }
    }

    fn record(&self, info: SessionRecord) {
        if let Ok(mut s) = self.sessions.lock() {
            s.insert(info.tsih, info);
        }
    }

    /// The normal sessions logged in now, by target then initiator.
    pub fn sessions(&self) -> Vec<SessionRecord> {
        let mut v: Vec<SessionRecord> = self
            .sessions
            .lock()
            .map(|s| s.values().cloned().collect())
            .unwrap_or_default();
        v.sort_by(|a, b| (&a.target, &a.initiator, a.isid).cmp(&(&b.target, &b.initiator, b.isid)));
        v
    }

    /// The TSIH of a session, by target, initiator and ISID.
    pub fn find(&self, target: &str, initiator: &str, isid: u64) -> Option<u16> {
        let s = self.sessions.lock().ok()?;
        s.values()
            .find(|i| i.target == target && i.initiator == initiator && i.isid == isid)
            .map(|i| i.tsih)
    }
}

/// The portal view one core uses while deciding logins.
pub struct CorePortal<'a> {
    /// The iSCSI targets by name.
    pub targets: &'a BTreeMap<String, Arc<Target>>,
    /// The iSCSI settings (each target's portals).
    pub iscsi: &'a IscsiConfig,
    pub registry: &'a Arc<Registry>,
    /// This core.
    pub core: usize,
    /// The sessions running on this core, by TSIH (MC/S joins).
    pub links: &'a rustc_hash::FxHashMap<u16, SessionLink>,
}

impl Portal for CorePortal<'_> {
    fn session_request(&self, req: &SessionRequest<'_>) -> Result<Grant, Refusal> {
        if req.tsih != 0 {
            return self.join_request(req);
        }
        if req.discovery {
            let tsih = self.registry.allocate().ok_or(Refusal::OutOfResources)?;
            return Ok(Grant {
                tsih,
                luns: None,
                rel_port_id: 0,
                tpgt: 0,
            });
        }
        let Some(name) = req.target else {
            return Err(Refusal::MissingTarget);
        };
        let Some(target) = self.targets.get(name) else {
            return Err(Refusal::NoSuchTarget);
        };
        self.check_portal(name, req)?;
        let admitted = match target.admit(req.initiator) {
            Ok(a) => a,
            Err(Refused::Disabled) => return Err(Refusal::Unavailable),
            Err(Refused::NotAdmitted) => {
                tracing::warn!(initiator = req.initiator, peer = %req.peer, target = name,
                    "initiator outside the target's ACL");
                return Err(Refusal::NotAdmitted);
            }
        };
        let luns = admitted.luns;
        let isid = req.isid.iter().fold(0u64, |a, b| a << 8 | u64::from(*b));
        if let Some(old) = self.registry.find(name, req.initiator, isid) {
            // RFC 7143 §6.3.5: a login with the ISID and initiator name of a
            // live session (TSIH 0) reinstates it: the old session is closed
            // (its tasks aborted) on its core, the new one gets a new TSIH.
            tracing::info!(
                initiator = req.initiator,
                target = name,
                old_tsih = old,
                "session reinstatement: closing the old session"
            );
            self.registry.reinstate(old);
        }
        let tsih = self.registry.allocate().ok_or(Refusal::OutOfResources)?;
        let group = admitted.group;
        self.registry.login_succeeded(req.peer.ip());
        if let Ok(mut o) = self.registry.owners.lock() {
            o.insert(tsih, self.core);
        }
        self.registry.record(SessionRecord {
            target: name.to_string(),
            initiator: req.initiator.to_string(),
            isid,
            tsih,
            group,
            connections: vec![connection_name(req)],
        });
        Ok(Grant {
            tsih,
            luns: Some(luns),
            rel_port_id: target.rel_port_id,
            tpgt: self.tpgt(name),
        })
    }

    fn session_closed(&self, tsih: u16) {
        self.registry.release(tsih);
    }

    fn connection_closed(&self, tsih: u16, peer: SocketAddr) {
        self.registry.remove_connection(tsih, peer);
    }

    fn session_elsewhere(&self, tsih: u16) -> bool {
        self.registry.owner(tsih).is_some_and(|c| c != self.core)
    }

    fn session_link(&self, tsih: u16) -> Option<SessionLink> {
        self.links.get(&tsih).cloned()
    }

    fn login_failed(&self, peer: SocketAddr, initiator: Option<&str>, status: u16) -> Duration {
        let delay = self.registry.login_failed(peer.ip(), Instant::now());
        tracing::warn!(%peer, initiator = initiator.unwrap_or("?"), status = %format!("{status:04x}"),
            delay_ms = delay.as_millis() as u64, "login failed");
        delay
    }
}

/// How the session list names a connection: its peer address, after
/// `iser:` for one over iSER (the portal syntax of the configuration).
fn connection_name(req: &SessionRequest<'_>) -> String {
    match req.transport {
        "tcp" => req.peer.to_string(),
        t => format!("{t}:{}", req.peer),
    }
}

impl CorePortal<'_> {
    /// A target is reached only through its own portals
    /// ([`crate::conn::IscsiTarget::reachable_at`]). Through any
    /// other, and through one just taken away from it, the login gets 0301
    /// (service unavailable), as LIO answers a portal outside the target's
    /// portal group: RFC 7143 §11.13.5 makes it a target error the
    /// initiator may retry, so a path comes back when the portal does.
    /// The target portal group tag of the target `name`.
    fn tpgt(&self, name: &str) -> u16 {
        let t = self.iscsi.targets.iter().find(|t| t.name == name);
        t.map_or(1, |t| t.tpgt)
    }

    fn check_portal(&self, name: &str, req: &SessionRequest<'_>) -> Result<(), Refusal> {
        let reachable = self
            .iscsi
            .targets
            .iter()
            .find(|t| t.name == name)
            .is_none_or(|t| t.reachable_at(req.local));
        if reachable {
            return Ok(());
        }
        tracing::warn!(initiator = req.initiator, peer = %req.peer, portal = %req.local,
            target = name, "login through a portal that is not the target's");
        Err(Refusal::Unavailable)
    }

    /// A login with the TSIH of an existing session: a further connection
    /// of it (MC/S). The target must still admit the initiator.
    fn join_request(&self, req: &SessionRequest<'_>) -> Result<Grant, Refusal> {
        // RFC 7143 §6.3.1 / §11.13.5: 020Ah unless the TSIH names a live
        // session of this initiator and ISID (discovery sessions take one
        // connection).
        let Some(name) = req.target.filter(|_| !req.discovery) else {
            return Err(Refusal::NoSuchSession);
        };
        let Some(target) = self.targets.get(name) else {
            return Err(Refusal::NoSuchSession);
        };
        self.check_portal(name, req)?;
        match target.admit(req.initiator) {
            Ok(_) => {}
            Err(Refused::Disabled) => return Err(Refusal::Unavailable),
            Err(Refused::NotAdmitted) => return Err(Refusal::NotAdmitted),
        }
        let isid = req.isid.iter().fold(0u64, |a, b| a << 8 | u64::from(*b));
        if self.registry.owner(req.tsih) != Some(self.core)
            || !self
                .registry
                .add_connection(req.tsih, req.initiator, isid, name, req.peer)
        {
            return Err(Refusal::NoSuchSession);
        }
        self.registry.login_succeeded(req.peer.ip());
        Ok(Grant {
            tsih: req.tsih,
            luns: None,
            rel_port_id: target.rel_port_id,
            tpgt: self.tpgt(name),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn iser_connections_are_named_with_their_transport() {
        let peer: SocketAddr = "192.0.2.9:40000".parse().unwrap();
        let req = |transport| SessionRequest {
            initiator: "iqn.x",
            isid: [0; 6],
            tsih: 0,
            target: None,
            discovery: true,
            peer,
            local: peer,
            transport,
        };
        assert_eq!(connection_name(&req("tcp")), "192.0.2.9:40000");
        assert_eq!(connection_name(&req("iser")), "iser:192.0.2.9:40000");
    }

    #[test]
    fn backoff_grows_and_is_capped() {
        assert_eq!(backoff(1), Duration::ZERO);
        assert_eq!(backoff(2), FAILURE_BASE_DELAY);
        assert_eq!(backoff(3), FAILURE_BASE_DELAY * 2);
        assert_eq!(backoff(1000), FAILURE_MAX_DELAY);
        let r = Registry::default();
        let ip: IpAddr = "192.0.2.1".parse().unwrap();
        let now = Instant::now();
        assert_eq!(r.login_failed(ip, now), Duration::ZERO);
        assert_eq!(r.login_failed(ip, now), FAILURE_BASE_DELAY);
        r.login_succeeded(ip);
        assert_eq!(r.login_failed(ip, now), Duration::ZERO);
        // Forgotten after a while.
        r.login_failed(ip, now);
        assert_eq!(r.login_failed(ip, now + FAILURE_MEMORY * 2), Duration::ZERO);
    }
}
