//! Login decisions shared by every core: target lookup, LUN map choice and
//! TSIH allocation. Logins are control path, so a mutex here is fine.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use ferrite_iscsi::pdu::LoginStatus;
use ferrite_iscsi::tcp::{Grant, Portal, SessionRequest};

use crate::system::Snapshot;

/// Sessions known to the whole daemon.
#[derive(Debug, Default)]
pub struct Registry {
    tsihs: Mutex<TsihState>,
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
    }

    /// Live sessions.
    pub fn count(&self) -> usize {
        self.tsihs.lock().map(|s| s.live.len()).unwrap_or(0)
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
