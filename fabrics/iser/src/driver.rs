//! The iSER driver on the reactors: RDMA CM listeners on the iSER portals,
//! the CM exchange, and the pump between each connection ([`IserQp`] over
//! [`IserConn`]) and its core session.
//!
//! Owns: binding iSER portals at start-up ([`bind_portals`]), taking
//! connection requests on the core that owns the listeners (core 0) and
//! dealing them round-robin to the cores ([`Cores`], [`IserMsg`]), the CM
//! exchange (the iSER CM REQ parsed by [`CmRequest::parse`]; a request
//! without one is rejected with a log line; the accept carries the iSER
//! CM REP of [`CmReply::to`]), the queue pair of each connection (the
//! device's protection domain on that core, the connection's own
//! completion queue, [`recv_count_for`] receives posted before the
//! accept), and running the connection on its core for its life.
//!
//! Logins are decided by the code iSCSI/TCP's are: the session layer's
//! login state machine in `ferrite_iscsi::Conn`, and the portal's
//! decision ([`ferrite_iscsi::tcp::Portal`], the daemon's `CorePortal`:
//! target lookup, the portal check, admission, TSIH, reinstatement, the
//! backoff after failed logins) through
//! [`ferrite_iscsi::tcp::decide_session`]; the core session is opened by
//! [`ferrite_iscsi::tcp::open_nexus`].
//!
//! Does not own: the iSCSI protocol (`ferrite-iscsi`), iSER's datamover
//! and receive rules ([`crate::datamover`], [`crate::conn`]), the verbs
//! provider (`ferrite-rdma`), or configuration (the daemon hands in the
//! portal addresses and each poll's iSCSI settings and portal).
//!
//! Not yet: more than one connection per session (MC/S) over iSER: a
//! login naming an existing session is refused with 020Ah.
//!
//! Reactor rules: nothing here blocks. The listeners' RDMA CM event
//! channels, each connection's completion channel and its CM event channel
//! are fds the reactor sleeps on ([`IserCore::wake_fds`]). A protocol
//! error, a failed work request or a disconnect ends that connection only.

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::os::fd::RawFd;
use std::sync::Arc;
use std::time::Instant;

use ferrite_core::Action;
use ferrite_core::device::LunMap;
use ferrite_core::shard::{SessionId, Shard};
use ferrite_iscsi::IscsiConfig;
use ferrite_iscsi::conn::ConnEvent;
use ferrite_iscsi::tcp::{
    Grant, Portal, Refusal, SessionRequest, complete_orphan, decide_session, open_nexus,
    session_event,
};
use ferrite_rdma::verbs::{
    VerbsConnRequest, VerbsCq, VerbsListener, VerbsPd, VerbsQp, VerbsQpAttrs,
};
use ferrite_rdma::{CompletionQueue, ProtectionDomain, RdmaError, WcStatus, WorkCompletion};

use crate::cm::{CmReply, CmRequest};
use crate::conn::{IserConn, recv_count_for};
use crate::qp::{IserQp, QpBuffers};

/// iSER's well-known port (RFC 7145 §13: the iSCSI port, 3260).
pub const ISER_PORT: u16 = 3260;

/// Why a portal could not be bound.
#[derive(Debug, thiserror::Error)]
pub enum DriverError {
    #[error("iSER portal {addr}: listening on RDMA CM")]
    Listen {
        addr: SocketAddr,
        #[source]
        source: RdmaError,
    },
}

/// The cores of the daemon as the driver reaches them: core 0 deals new
/// connections to the others by message.
pub trait Cores {
    /// How many cores run sessions.
    fn count(&self) -> usize;
    /// Hands `msg` to core `core`; false if its mailbox is closed.
    fn send(&self, core: usize, msg: IserMsg) -> bool;
}

/// Messages for a core's iSER part.
pub enum IserMsg {
    /// A connection request taken by the listening core, to run here.
    Incoming(VerbsConnRequest),
}

impl std::fmt::Debug for IserMsg {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            IserMsg::Incoming(r) => write!(f, "Incoming({r:?})"),
        }
    }
}

/// A bound iSER portal, owned by core 0.
pub struct IserPortal {
    pub addr: SocketAddr,
    listener: VerbsListener,
}

impl std::fmt::Debug for IserPortal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "IserPortal({})", self.addr)
    }
}

/// Binds an RDMA CM listener on each iSER portal address. On a machine
/// without an RDMA device (or without rdma-core) the portals stay idle
/// with one log line each; the reason the RDMA fabrics are idle is logged
/// once by the daemon at start.
pub fn bind_portals(addrs: &[SocketAddr]) -> Result<Vec<IserPortal>, DriverError> {
    if addrs.is_empty() {
        return Ok(Vec::new());
    }
    let hcas = ferrite_rdma::verbs::devices().map(|d| d.len()).unwrap_or(0);
    let mut out = Vec::new();
    for &addr in addrs {
        if hcas == 0 {
            tracing::info!(portal = %addr, "iSER portal idle: no RDMA device");
            continue;
        }
        let listener = VerbsListener::bind(&addr, 128)
            .map_err(|source| DriverError::Listen { addr, source })?;
        tracing::info!(portal = %addr, "iSER portal listening (RDMA CM)");
        out.push(IserPortal { addr, listener });
    }
    Ok(out)
}

/// The login of a normal session, kept from its grant to its LoggedIn.
struct PendingLogin {
    initiator: String,
    isid: [u8; 6],
    target: Option<String>,
    grant: Grant,
}

/// One iSER connection on this core.
struct Link {
    qp: IserQp,
    cq: VerbsCq,
    /// The device it came in on (its buffers go back to that device's
    /// spares).
    device: String,
    /// The queue pair's RDMA CM event channel (disconnects).
    event_fd: RawFd,
    peer: SocketAddr,
    session: Option<SessionId>,
    tsih: Option<u16>,
    pending: Option<PendingLogin>,
    /// Target, initiator and LUN map of the normal session.
    nexus: Option<(String, String, Arc<LunMap>)>,
    /// The core session and TSIH are given up.
    closing: bool,
    /// Nothing is posted before this instant (backoff after a failed
    /// login).
    hold: Option<Instant>,
}

/// The buffers of ended connections a core keeps registered for new
/// ones: enough for an initiator that reconnects or logs in to discover
/// and then to a target, few enough that an idle core holds little.
const SPARE_BUFFERS: usize = 2;

/// The most iSER connections one core runs. Each holds a window of
/// registered receive buffers (`recv_count_for` ×
/// `rdma_recv_data_segment_length`: 8.5 MiB with the defaults) from its
/// connection request on, login or not, so the cap is what bounds the
/// memory RDMA connection requests can pin: a request beyond it is
/// rejected with a log line.
pub const MAX_CONNECTIONS_PER_CORE: usize = 64;

/// The iSER part of one core.
pub struct IserCore {
    core: usize,
    portals: Vec<IserPortal>,
    /// Protection domains of the devices connections came in on, this
    /// core's.
    pds: HashMap<String, VerbsPd>,
    /// Registered buffers of connections that ended, by device, for the
    /// next ones ([`SPARE_BUFFERS`] at most).
    spare: Vec<(String, QpBuffers)>,
    links: slab::Slab<Link>,
    wcs: Vec<WorkCompletion>,
    actions: VecDeque<Action>,
    rr: usize,
    seed: u64,
    stopping: bool,
}

impl IserCore {
    /// `seed` seeds the connections' randomness (CHAP challenges).
    pub fn new(core: usize, seed: u64) -> IserCore {
        IserCore {
            core,
            portals: Vec::new(),
            pds: HashMap::new(),
            spare: Vec::new(),
            links: slab::Slab::new(),
            wcs: Vec::new(),
            actions: VecDeque::new(),
            rr: core,
            seed,
            stopping: false,
        }
    }

    /// Hands this core the portals bound at start-up (core 0).
    pub fn set_portals(&mut self, portals: Vec<IserPortal>) {
        self.portals = portals;
    }

    /// True when no connection runs here.
    pub fn is_empty(&self) -> bool {
        self.links.is_empty()
    }

    /// Connections running here: (TSIH, peer), for tests and logs.
    pub fn connections(&self) -> Vec<(Option<u16>, SocketAddr)> {
        self.links.iter().map(|(_, l)| (l.tsih, l.peer)).collect()
    }

    /// Takes waiting connection requests (core 0) and deals them to the
    /// cores, round-robin; returns those to run here.
    fn take_requests(&mut self, cores: &dyn Cores) -> Vec<VerbsConnRequest> {
        let mut here = Vec::new();
        if self.stopping {
            return here;
        }
        let n = cores.count().max(1);
        for p in &self.portals {
            while let Some(req) = p.listener.poll_request() {
                let target = self.rr % n;
                self.rr = self.rr.wrapping_add(1);
                if target == self.core || cores.count() == 0 {
                    here.push(req);
                } else if !cores.send(target, IserMsg::Incoming(req)) {
                    tracing::warn!(
                        core = target,
                        "core mailbox closed; iSER connection dropped"
                    );
                }
            }
        }
        here
    }

    /// A connection request dealt to this core: the iSER CM REQ checked,
    /// the queue pair made with its receives posted, and the request
    /// accepted with the iSER CM REP. Every refusal is a CM reject and a
    /// log line.
    pub fn incoming(&mut self, now: Instant, cfg: &Arc<IscsiConfig>, mut req: VerbsConnRequest) {
        if self.stopping {
            return;
        }
        let (local, peer) = req.addrs();
        let peer_s = peer.map_or_else(|| "?".to_string(), |p| p.to_string());
        if self.links.len() >= MAX_CONNECTIONS_PER_CORE {
            tracing::warn!(core = self.core, peer = %peer_s, limit = MAX_CONNECTIONS_PER_CORE,
                "iSER connection rejected: this core runs as many connections as it takes");
            if let Err(e) = req.reject(&[]) {
                tracing::debug!(error = %e, "iSER reject not delivered");
            }
            return;
        }
        let cm = match CmRequest::parse(req.private_data()) {
            Ok(cm) => cm,
            Err(e) => {
                tracing::warn!(peer = %peer_s, error = %e, "iSER connection rejected");
                if let Err(e) = req.reject(&[]) {
                    tracing::debug!(error = %e, "iSER reject not delivered");
                }
                return;
            }
        };
        let (Some(local), Some(peer)) = (local, peer) else {
            tracing::warn!(peer = %peer_s, "iSER connection rejected: not an IP address");
            if let Err(e) = req.reject(&[]) {
                tracing::debug!(error = %e, "iSER reject not delivered");
            }
            return;
        };
        let ctx = req.context();
        let name = ctx.name();
        if !self.pds.contains_key(&name) {
            match ctx.alloc_pd() {
                Ok(pd) => {
                    self.pds.insert(name.clone(), pd);
                }
                Err(e) => {
                    tracing::warn!(%peer, device = %name, error = %e,
                        "iSER connection rejected: no protection domain");
                    return;
                }
            }
        }
        let Some(pd) = self.pds.get(&name).cloned() else {
            return;
        };
        let recvs = recv_count_for(cfg);
        let attrs = VerbsQpAttrs {
            // Responses, NOP-Ins and the RDMA READs and WRITEs of a full
            // window of commands (a full send queue holds work back).
            max_send_wr: (recvs * 4).max(256),
            max_recv_wr: recvs,
            ..VerbsQpAttrs::default()
        };
        let cq = match ctx.create_cq((attrs.max_send_wr + attrs.max_recv_wr) as i32) {
            Ok(cq) => cq,
            Err(e) => {
                tracing::warn!(%peer, device = %name, error = %e,
                    "iSER connection rejected: no completion queue");
                return;
            }
        };
        // Dropped on a failure from here on, the request is refused.
        req.set_refusal(&[]);
        let qp = match VerbsQp::for_request(req, &pd, &cq, &cq, None, attrs) {
            Ok(qp) => qp,
            Err(e) => {
                tracing::warn!(%peer, device = %name, error = %e,
                    "iSER connection rejected: no queue pair");
                return;
            }
        };
        let pd_dyn: &dyn ProtectionDomain = &pd;
        let data_len = cfg.rdma_recv_data_segment_length();
        let spare = self
            .spare
            .iter()
            .position(|(d, b)| *d == name && b.fits(recvs, data_len))
            .map(|i| self.spare.swap_remove(i).1);
        let bufs = match spare
            .map_or_else(|| QpBuffers::new(pd_dyn, recvs, data_len), Ok)
            .and_then(|b| b.post_all(&qp).map(|_| b))
        {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(%peer, error = %e, "iSER connection rejected: no receive buffers");
                qp.refuse(&[]);
                return;
            }
        };
        let rep = CmReply::to(&cm, true);
        if let Err(e) = qp.accept(&rep.encode()) {
            tracing::warn!(%peer, error = %e, "iSER accept failed");
            return;
        }
        let event_fd = qp.event_fd();
        self.seed = self.seed.wrapping_mul(6364136223846793005).wrapping_add(1);
        let conn = IserConn::new(now, cfg.clone(), local, peer, self.seed, &cm, bufs.count());
        let max_sge = attrs.max_sge as usize;
        let qp = IserQp::new(conn, Box::new(qp), Box::new(pd), bufs, max_sge);
        tracing::info!(core = self.core, %peer, portal = %local, qpn = qp.qp().qp_num(),
            zero_based = cm.zero_based, send_invalidate = rep.send_invalidate,
            receives = recvs, "iSER connection");
        self.links.insert(Link {
            qp,
            cq,
            device: name,
            event_fd,
            peer,
            session: None,
            tsih: None,
            pending: None,
            nexus: None,
            closing: false,
            hold: None,
        });
    }

    /// Runs every connection: requests taken (core 0), completions and
    /// CM events in, events to the core and its actions back, timers, work
    /// requests posted; finished connections dropped.
    pub fn poll(
        &mut self,
        now: Instant,
        shard: &mut Shard,
        portal: &dyn Portal,
        cfg: &Arc<IscsiConfig>,
        cores: &dyn Cores,
    ) -> bool {
        let mut progress = false;
        if !self.portals.is_empty() {
            for req in self.take_requests(cores) {
                progress = true;
                self.incoming(now, cfg, req);
            }
        }
        let core = self.core;
        for (_, l) in self.links.iter_mut() {
            self.wcs.clear();
            if l.cq.poll_cq(&mut self.wcs) > 0 {
                progress = true;
            }
            for wc in &self.wcs {
                log_failed(core, wc);
                l.qp.handle_completion(now, wc);
            }
            l.qp.poll_conn_events(now);
            if l.qp.conn().conn().poll_timeout().is_some_and(|t| t <= now) {
                l.qp.conn_mut().conn_mut().handle_timeout(now);
                progress = true;
            }
            progress |= drive(now, l, shard, portal, &mut self.actions);
            if l.hold.is_some_and(|t| t <= now) {
                l.hold = None;
            }
            if l.hold.is_none() {
                l.qp.pump();
            }
        }
        let finished: Vec<usize> = self
            .links
            .iter()
            .filter(|(_, l)| l.closing && l.qp.finished())
            .map(|(k, _)| k)
            .collect();
        for k in finished {
            let l = self.links.remove(k);
            progress = true;
            tracing::info!(core = self.core, peer = %l.peer, "iSER connection closed");
            let bufs = l.qp.into_buffers();
            if self.spare.len() < SPARE_BUFFERS {
                self.spare.push((l.device, bufs));
            }
        }
        progress
    }

    /// A new configuration: sessions of a removed or disabled target, or
    /// reached through a portal taken from it, are logged out (RFC 7143
    /// §11.9.1 AsyncEvent 1); those whose LUN map changed get the new one
    /// (the core raises the unit attentions).
    pub fn apply_snapshot(
        &mut self,
        now: Instant,
        shard: &mut Shard,
        targets: &std::collections::BTreeMap<String, Arc<ferrite_core::device::Target>>,
        cfg: &IscsiConfig,
    ) {
        for (_, l) in self.links.iter_mut() {
            let Some((target, initiator, luns)) = l.nexus.as_mut() else {
                continue;
            };
            let local = l.qp.conn().conn().local_addr();
            let reachable = cfg
                .targets
                .iter()
                .find(|t| t.name == *target)
                .is_some_and(|t| t.reachable_at(local));
            match targets.get(target.as_str()) {
                Some(t) if t.enabled && reachable => {
                    let new = t.map_for(initiator);
                    if !Arc::ptr_eq(&new, luns) {
                        *luns = new.clone();
                        if let Some(sid) = l.session {
                            shard.set_luns(sid, new);
                        }
                    }
                }
                _ => {
                    tracing::info!(peer = %l.peer, target = %target,
                        "target removed, disabled or not at this portal: asking the iSER session to log out");
                    l.qp.conn_mut().conn_mut().handle_action(now, Action::Close);
                }
            }
        }
    }

    /// Closes the connection of session `tsih` (replaced by a
    /// reinstatement on any core, or closed by management).
    pub fn close_session(
        &mut self,
        now: Instant,
        shard: &mut Shard,
        portal: &dyn Portal,
        tsih: u16,
    ) {
        for (_, l) in self.links.iter_mut() {
            if l.tsih == Some(tsih) && !l.closing {
                tracing::info!(peer = %l.peer, tsih, "iSER session closed on request (reinstatement or management)");
                l.qp.conn_mut().conn_mut().transport_error();
                begin_close(now, l, shard, portal);
            }
        }
    }

    /// Ends every connection (daemon stop).
    pub fn stop(&mut self, now: Instant, shard: &mut Shard, portal: &dyn Portal) {
        self.stopping = true;
        self.portals.clear();
        for (_, l) in self.links.iter_mut() {
            l.qp.conn_mut().conn_mut().announce_drop_all(2, 0);
            l.qp.pump();
            l.qp.conn_mut().conn_mut().transport_error();
            begin_close(now, l, shard, portal);
            l.qp.pump();
        }
    }

    /// The earliest timer of a connection (keepalive, login and logout
    /// timeouts, a login's backoff).
    pub fn next_deadline(&self) -> Option<Instant> {
        self.links
            .iter()
            .flat_map(|(_, l)| [l.qp.conn().conn().poll_timeout(), l.hold])
            .flatten()
            .min()
    }

    /// The fds that wake this core: listeners (core 0), each connection's
    /// completion channel and RDMA CM event channel.
    pub fn wake_fds(&self, out: &mut Vec<RawFd>) {
        for p in &self.portals {
            out.push(p.listener.fd());
        }
        for (_, l) in self.links.iter() {
            out.push(l.cq.fd());
            out.push(l.event_fd);
        }
    }
}

fn log_failed(core: usize, wc: &WorkCompletion) {
    if !matches!(wc.status, WcStatus::Success | WcStatus::WrFlushErr) {
        tracing::warn!(core, qpn = wc.qp_num, status = ?wc.status, opcode = ?wc.opcode,
            "iSER connection: work request failed");
    }
}

/// Moves events and actions between the connection's session layer and
/// its core session until both are quiet.
fn drive(
    now: Instant,
    l: &mut Link,
    shard: &mut Shard,
    portal: &dyn Portal,
    actions: &mut VecDeque<Action>,
) -> bool {
    let mut any = false;
    loop {
        let mut progress = false;
        while let Some(ev) = l.qp.conn_mut().conn_mut().poll_event() {
            progress = true;
            on_event(now, l, ev, shard, portal);
        }
        if let Some(sid) = l.session
            && let Some(mut s) = shard.session(sid)
        {
            l.qp.conn()
                .conn()
                .session_seq()
                .hold_window(s.data_waiting());
            actions.clear();
            s.take_actions(actions);
            while let Some(a) = actions.pop_front() {
                progress = true;
                if l.closing {
                    complete_orphan(&mut s, a);
                } else {
                    l.qp.conn_mut().conn_mut().handle_action(now, a);
                }
            }
        }
        if !progress {
            break;
        }
        any = true;
    }
    if l.qp.conn().conn().is_closed() && !l.closing {
        begin_close(now, l, shard, portal);
        any = true;
    }
    any
}

fn on_event(now: Instant, l: &mut Link, ev: ConnEvent, shard: &mut Shard, portal: &dyn Portal) {
    match ev {
        ConnEvent::SessionRequest {
            initiator,
            isid,
            tsih,
            target,
            discovery,
        } => {
            let conn = l.qp.conn_mut().conn_mut();
            if tsih != 0 {
                // MC/S over iSER is not offered (RFC 7143 §11.13.5 020Ah).
                let status = Refusal::NoSuchSession.status();
                tracing::warn!(peer = %l.peer, initiator = %initiator, tsih,
                    "iSER login to an existing session refused: one connection per session");
                conn.reject_session(status);
                return;
            }
            let req = SessionRequest {
                initiator: &initiator,
                isid,
                tsih,
                target: target.as_deref(),
                discovery,
                peer: l.peer,
                local: conn.local_addr(),
                transport: "iser",
            };
            if let Some(grant) = decide_session(conn, portal, &req) {
                l.tsih = Some(grant.tsih);
                l.pending = Some(PendingLogin {
                    initiator,
                    isid,
                    target,
                    grant,
                });
            }
        }
        ConnEvent::LoginFailed { initiator, status } => {
            let code = u16::from(status.class) << 8 | u16::from(status.detail);
            let delay = portal.login_failed(l.peer, initiator.as_deref(), code);
            if !delay.is_zero() {
                l.hold = Some(now + delay);
            }
        }
        ConnEvent::LoggedIn => {
            if let Some(PendingLogin {
                initiator,
                isid,
                target: Some(target),
                grant,
            }) = l.pending.take()
                && let Some(luns) = grant.luns.clone()
            {
                let sid = open_nexus(
                    now,
                    shard,
                    &initiator,
                    isid,
                    &target,
                    (grant.rel_port_id, grant.tpgt),
                    &luns,
                );
                l.session = Some(sid);
                l.nexus = Some((target, initiator, luns));
            }
        }
        ev @ (ConnEvent::Command(_)
        | ConnEvent::DataOutDone { .. }
        | ConnEvent::ResponseSent { .. }
        | ConnEvent::TaskMgmt(_)) => session_event(now, shard, l.session, l.peer, ev),
        ConnEvent::Closed { reason } => {
            tracing::info!(peer = %l.peer, ?reason, "iSER connection closing");
            begin_close(now, l, shard, portal);
        }
    }
}

/// Ends the core session and gives the TSIH back; the queue pair
/// disconnects once the last Send completed ([`IserQp::pump`]).
fn begin_close(now: Instant, l: &mut Link, shard: &mut Shard, portal: &dyn Portal) {
    if l.closing {
        return;
    }
    l.closing = true;
    if let Some(sid) = l.session.take() {
        shard.close_session(now, sid);
    }
    if let Some(tsih) = l.tsih.take() {
        portal.session_closed(tsih);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn portals_bind_only_with_an_rdma_device() {
        assert!(bind_portals(&[]).unwrap().is_empty());
        let hcas = ferrite_rdma::verbs::devices().map(|d| d.len()).unwrap_or(0);
        let addr: SocketAddr = "127.0.0.1:0".parse().unwrap();
        match bind_portals(&[addr]) {
            // Without an HCA (CI, most build machines) the portal is idle;
            // with one, RDMA CM binds it or says why not.
            Ok(p) if hcas == 0 => assert!(p.is_empty()),
            Ok(p) => assert_eq!(p.len(), 1),
            Err(DriverError::Listen { addr: a, .. }) => {
                assert!(hcas > 0);
                assert_eq!(a, addr);
            }
        }
    }

    #[test]
    fn a_core_without_connections_is_idle() {
        let c = IserCore::new(0, 1);
        assert!(c.is_empty());
        assert!(c.next_deadline().is_none());
        let mut fds = Vec::new();
        c.wake_fds(&mut fds);
        assert!(fds.is_empty());
    }
}
