//! Login decisions shared by every core: target lookup, LUN map choice and
//! TSIH allocation. Logins are control path, so a mutex here is fine.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use ferrite_mgmt::runtime::{SessionInfo, Stats};

use ferrite_iscsi::pdu::LoginStatus;
use ferrite_iscsi::tcp::{Grant, Portal, SessionRequest};

use crate::system::Snapshot;

/// Sessions known to the whole daemon.
#[derive(Debug, Default)]
pub struct Registry {
    tsihs: Mutex<TsihState>,
    sessions: Mutex<HashMap<u16, SessionInfo>>,
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
    }

    fn record(&self, info: SessionInfo) {
        if let Ok(mut s) = self.sessions.lock() {
            s.insert(info.tsih, info);
        }
    }

    /// The normal sessions logged in now, by target then initiator.
    pub fn sessions(&self) -> Vec<SessionInfo> {
        let mut v: Vec<SessionInfo> = self
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

    /// Counters (per device and target; filled once the core keeps them).
    pub fn stats(&self) -> Stats {
        Stats::default()
    }
}

/// The portal view one core uses while deciding logins.
pub struct CorePortal<'a> {
    pub snapshot: &'a Snapshot,
    pub registry: &'a Arc<Registry>,
}

impl Portal for CorePortal<'_> {
    fn session_request(&self, req: &SessionRequest<'_>) -> Result<Grant, LoginStatus> {
        if req.tsih != 0 {
            // RFC 7143 §6.3.1: adding a connection to an existing session
            // (MC/S) is not offered yet; the initiator can open a new session.
            return Err(LoginStatus::SESSION_DOES_NOT_EXIST);
        }
        if req.discovery {
            let tsih = self
                .registry
                .allocate()
                .ok_or(LoginStatus::OUT_OF_RESOURCES)?;
            return Ok(Grant {
                tsih,
                luns: None,
                rel_port_id: 0,
            });
        }
        let Some(name) = req.target else {
            return Err(LoginStatus::MISSING_PARAMETER);
        };
        let Some(target) = self.snapshot.iscsi_targets.get(name) else {
            return Err(LoginStatus::NOT_FOUND);
        };
        if !target.enabled {
            return Err(LoginStatus::SERVICE_UNAVAILABLE);
        }
        let luns = target.map_for(req.initiator);
        let tsih = self
            .registry
            .allocate()
            .ok_or(LoginStatus::OUT_OF_RESOURCES)?;
        let group = target
            .groups
            .iter()
            .find(|g| Arc::ptr_eq(&g.luns, &luns))
            .map(|g| g.name.clone());
        self.registry.record(SessionInfo {
            target: name.to_string(),
            initiator: req.initiator.to_string(),
            isid: req.isid.iter().fold(0u64, |a, b| a << 8 | u64::from(*b)),
            tsih,
            group,
            connections: vec![req.peer.to_string()],
            ..SessionInfo::default()
        });
        Ok(Grant {
            tsih,
            luns: Some(luns),
            rel_port_id: target.rel_port_id,
        })
    }

    fn session_closed(&self, tsih: u16) {
        self.registry.release(tsih);
    }
}
