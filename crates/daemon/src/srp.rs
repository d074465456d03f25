//! The SRP fabric on the reactors: target ports (listeners), login policy,
//! and the pump between each SRP channel ([`ferrite_srp::target::TargetConn`])
//! and its core session, as `fabrics/srp`'s "Driver-facing API" describes.
//!
//! Owns: binding the configured SRP ports at start-up, the one-line report
//! of a machine without an HCA, accepting logins (on the core that owns the
//! listeners) and spreading the accepted connections over the cores, and
//! running each connection on its core for its life.
//!
//! Does not own: the SRP protocol (`ferrite-srp`), the providers
//! (`ferrite-rdma`), SCSI (the core's `Shard`), or configuration changes
//! (`runtime.rs` publishes snapshots; a port's LUN maps follow them, its
//! listener does not move).
//!
//! Providers: `soft` ports are served. A `verbs` port is bound only when an
//! RDMA device exists; on a machine without one the daemon logs once, at
//! start, `RDMA fabrics idle: no RDMA device found`, and serves everything
//! else. Serving verbs ports from the reactor is not wired yet: with a
//! device present they are reported as not served (see `docs/srp.md`).
//!
//! Reactor rules: nothing here blocks. The soft provider's listener queues
//! requests from its own thread and has no fd, so the owning core looks at
//! it on a short timer ([`LISTEN_TICK`]); completions wake the reactor
//! through the completion queue's fd ([`SrpCore::wake_fds`]).

use std::collections::{BTreeMap, HashMap};
use std::os::fd::RawFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use ferrite_core::device::{LunMap, Target};
use ferrite_core::shard::{Nexus, SessionId, Shard};
use ferrite_mgmt::config::{SrpProviderConfig, SrpTargetConfig};
use ferrite_rdma::soft::{
    ConnRequest, QpAttrs, SoftAddr, SoftCq, SoftDevice, SoftListener, SoftPd, SoftQp,
};
use ferrite_rdma::{CompletionQueue, QueuePair, WcStatus, WorkCompletion};
use ferrite_scsi::{Lun, Sense};
use ferrite_srp::channel::{self, ChannelConfig, Event, Login};
use ferrite_srp::iu;
use ferrite_srp::target::{RecvRing, TargetConn};

/// How often the core owning soft listeners looks for login requests.
pub const LISTEN_TICK: Duration = Duration::from_millis(5);

/// An SRP target port as cores read it from the snapshot.
#[derive(Debug)]
pub struct SrpTarget {
    pub target: Arc<Target>,
    pub port_id: [u8; 16],
    pub credits: u32,
}

/// Builds the snapshot entry of an SRP port configuration.
pub fn srp_target(t: &SrpTargetConfig, target: Arc<Target>) -> SrpTarget {
    SrpTarget {
        target,
        port_id: t.port_id_bytes(),
        credits: t.credits,
    }
}

/// A bound port, owned by one core.
pub struct SrpPort {
    pub name: String,
    listener: SoftListener,
}

impl std::fmt::Debug for SrpPort {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SrpPort({}, {:?})", self.name, self.listener.addr())
    }
}

/// Binds every configured SRP port this machine can serve, and logs the
/// RDMA device situation once.
pub fn bind_ports(targets: &[SrpTargetConfig]) -> Result<Vec<SrpPort>> {
    let hcas = rdma_device_count();
    let mut out = Vec::new();
    for t in targets {
        match &t.provider {
            SrpProviderConfig::Soft { listen } => {
                let addr = soft_addr(listen)?;
                if let SoftAddr::Unix(p) = &addr {
                    // A stale socket from an earlier run would make bind fail.
                    let _ = std::fs::remove_file(p);
                }
                let listener = SoftListener::bind(&addr)
                    .with_context(|| format!("SRP port {}: listening on {listen}", t.name))?;
                tracing::info!(port = %t.name, listen = %listen, provider = "soft (test and development)",
                    port_id = %hex(&t.port_id_bytes()), "SRP target port listening");
                out.push(SrpPort {
                    name: t.name.clone(),
                    listener,
                });
            }
            SrpProviderConfig::Verbs { device, port, .. } => {
                if hcas == 0 {
                    tracing::info!(port = %t.name, "SRP target port idle: no RDMA device");
                } else {
                    tracing::warn!(port = %t.name, device = ?device, hca_port = port,
                        "SRP over the verbs provider is not served by ferrited yet; port idle");
                }
            }
        }
    }
    Ok(out)
}

/// Counts RDMA devices, logging `RDMA fabrics idle: no RDMA device found`
/// when there is none (once per daemon start: this is called once).
fn rdma_device_count() -> usize {
    match ferrite_rdma::verbs::devices() {
        Ok(d) => {
            ferrite_rdma::log_idle_if_empty(&d);
            d.len()
        }
        Err(e) => {
            tracing::info!(error = %e, "RDMA fabrics idle: no RDMA device found");
            0
        }
    }
}

fn soft_addr(listen: &str) -> Result<SoftAddr> {
    if listen.starts_with('/') {
        return Ok(SoftAddr::Unix(listen.into()));
    }
    Ok(SoftAddr::Tcp(listen.parse().with_context(|| {
        format!("{listen:?} is not an address:port")
    })?))
}

/// SRP initiator port ids are named `0x` and 32 hex digits, as ib_srpt
/// names its sessions; initiator group patterns match this form.
pub fn hex(id: &[u8; 16]) -> String {
    let mut s = String::with_capacity(34);
    s.push_str("0x");
    for b in id {
        s.push_str(&format!("{b:02x}"));
    }
    s
}

/// Messages for a core's SRP part.
pub enum SrpMsg {
    /// A login request taken by the listening core, to run on this one.
    Incoming { port: String, req: ConnRequest },
}

/// One channel on this core.
struct SrpConn {
    conn: TargetConn,
    session: Option<SessionId>,
    port: String,
    initiator: String,
    luns: Arc<LunMap>,
    /// Capacity generation last seen per LUN (an AER on change).
    gens: Vec<(Lun, u32)>,
}

/// The SRP part of one core.
pub struct SrpCore {
    core: usize,
    ports: Vec<SrpPort>,
    _dev: SoftDevice,
    pd: SoftPd,
    cq: Option<SoftCq>,
    conns: slab::Slab<SrpConn>,
    by_qpn: HashMap<u32, usize>,
    wcs: Vec<WorkCompletion>,
    rr: usize,
    next_listen: Option<Instant>,
    stopping: bool,
}

impl SrpCore {
    pub fn new(core: usize) -> SrpCore {
        let dev = SoftDevice::new(&format!("soft{core}"));
        let pd = dev.alloc_pd();
        SrpCore {
            core,
            ports: Vec::new(),
            _dev: dev,
            pd,
            cq: None,
            conns: slab::Slab::new(),
            by_qpn: HashMap::new(),
            wcs: Vec::new(),
            rr: core,
            next_listen: None,
            stopping: false,
        }
    }

    /// Hands this core the bound ports (core 0).
    pub fn set_ports(&mut self, ports: Vec<SrpPort>) {
        self.ports = ports;
    }

    /// True when nothing runs here.
    pub fn is_empty(&self) -> bool {
        self.conns.is_empty()
    }

    fn cq(&mut self) -> Result<&SoftCq> {
        if self.cq.is_none() {
            self.cq = Some(SoftCq::new().context("creating a completion queue")?);
        }
        self.cq.as_ref().context("completion queue")
    }

    /// Takes waiting login requests and sends each to a core. Returns the
    /// requests to run here.
    fn take_requests(
        &mut self,
        peers: &[ferrite_reactor::mailbox::MailboxTx<crate::worker::Msg>],
    ) -> Vec<(String, ConnRequest)> {
        let mut here = Vec::new();
        if self.stopping {
            return here;
        }
        for p in &self.ports {
            while let Some(req) = p.listener.poll_request() {
                let n = peers.len().max(1);
                let target = self.rr % n;
                self.rr = self.rr.wrapping_add(1);
                if target == self.core || peers.is_empty() {
                    here.push((p.name.clone(), req));
                } else if let Err(e) =
                    peers[target].send(crate::worker::Msg::Srp(SrpMsg::Incoming {
                        port: p.name.clone(),
                        req,
                    }))
                {
                    tracing::warn!(error = %e, "core mailbox closed; SRP login dropped");
                }
            }
        }
        here
    }

    /// A login request: SRP r16a §6.2-§6.4 through `channel::login`, then
    /// the port's policy (enabled, LUN map by initiator port id).
    pub fn incoming(
        &mut self,
        now: Instant,
        shard: &mut Shard,
        targets: &BTreeMap<String, Arc<SrpTarget>>,
        port: &str,
        req: ConnRequest,
    ) {
        if self.stopping {
            return;
        }
        let Some(t) = targets.get(port).cloned() else {
            return reject(req, iu::LoginRejReason::UNABLE_TO_ESTABLISH, "port removed");
        };
        let cfg = ChannelConfig {
            credits: t.credits,
            target_port_id: t.port_id,
            ..ChannelConfig::default()
        };
        let initiator = match iu::LoginReq::parse(req.private_data()) {
            Ok(r) => hex(&r.initiator_port_id),
            Err(_) => String::new(),
        };
        let (channel, rsp) = match channel::login(cfg.clone(), req.private_data()) {
            Login::Reject(rej) => {
                tracing::warn!(port, initiator = %initiator, reason = rej.reason.0, "SRP login rejected");
                if let Err(e) = req.reject(&rej.encode()) {
                    tracing::debug!(error = %e, "SRP login reject not delivered");
                }
                return;
            }
            Login::Accept { channel, rsp } => (channel, rsp),
        };
        if !t.target.enabled {
            // SRP r16a §6.4: the target cannot take the channel now.
            return reject(
                req,
                iu::LoginRejReason::UNABLE_TO_ESTABLISH,
                "port disabled",
            );
        }
        let cq = match self.cq() {
            Ok(cq) => cq.clone(),
            Err(e) => {
                tracing::warn!(error = %e, "SRP login refused");
                return reject(req, iu::LoginRejReason::INSUFFICIENT_RESOURCES, "no CQ");
            }
        };
        let attrs = QpAttrs {
            max_send_wr: (cfg.credits as usize * 4).max(256),
            max_recv_wr: cfg.recv_count() as usize,
            ..QpAttrs::default()
        };
        let qp = SoftQp::create(&self.pd, &cq, &cq, None, attrs);
        let ring =
            match RecvRing::for_config(&self.pd, &cfg).and_then(|r| r.post_all(&qp).map(|_| r)) {
                Ok(r) => r,
                Err(e) => {
                    tracing::warn!(error = %e, "SRP login refused");
                    return reject(
                        req,
                        iu::LoginRejReason::INSUFFICIENT_RESOURCES,
                        "receive ring",
                    );
                }
            };
        if let Err(e) = qp.accept(req, &rsp.encode()) {
            tracing::warn!(error = %e, "SRP accept failed");
            return;
        }
        let qpn = qp.qp_num();
        let conn = match TargetConn::new(
            channel,
            Box::new(qp),
            Box::new(self.pd.clone()),
            ring,
            attrs.max_sge,
        ) {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(error = %e, "SRP channel setup failed");
                return;
            }
        };
        let luns = t.target.map_for(&initiator);
        let nexus = Nexus {
            initiator: initiator.clone(),
            initiator_port: initiator.clone(),
            target: t.target.name.clone(),
            rel_port_id: t.target.rel_port_id,
        };
        // The SRP target can report events (SRP_AER_REQ): aen = true.
        let sid = shard.open_session(now, nexus, luns.clone(), true);
        let gens = luns
            .luns
            .iter()
            .map(|(l, e)| (*l, e.device.generation()))
            .collect();
        tracing::info!(core = self.core, port, initiator = %initiator, qpn, "SRP login");
        let key = self.conns.insert(SrpConn {
            conn,
            session: Some(sid),
            port: port.to_string(),
            initiator,
            luns,
            gens,
        });
        self.by_qpn.insert(qpn, key);
    }

    /// A new snapshot: channels whose port is gone or disabled are logged
    /// out (SRP_T_LOGOUT); those whose LUN map changed get the new one.
    pub fn apply_snapshot(
        &mut self,
        shard: &mut Shard,
        targets: &BTreeMap<String, Arc<SrpTarget>>,
    ) {
        for (_, c) in self.conns.iter_mut() {
            let Some(sid) = c.session else { continue };
            match targets.get(&c.port) {
                Some(t) if t.target.enabled => {
                    let new = t.target.map_for(&c.initiator);
                    if !Arc::ptr_eq(&new, &c.luns) {
                        shard.set_luns(sid, new.clone());
                        c.gens = new
                            .luns
                            .iter()
                            .map(|(l, e)| (*l, e.device.generation()))
                            .collect();
                        c.luns = new;
                    }
                }
                _ => {
                    tracing::info!(port = %c.port, initiator = %c.initiator, "SRP port removed or disabled: logging out");
                    c.conn.handle_action(ferrite_core::Action::Close);
                    c.conn.pump();
                }
            }
        }
    }

    /// Logs every channel out (daemon stop).
    pub fn stop(&mut self) {
        self.stopping = true;
        self.ports.clear();
        for (_, c) in self.conns.iter_mut() {
            c.conn.handle_action(ferrite_core::Action::Close);
            c.conn.pump();
        }
    }

    /// Runs every channel: completions in, events to the core, actions out.
    pub fn poll(
        &mut self,
        now: Instant,
        shard: &mut Shard,
        targets: &BTreeMap<String, Arc<SrpTarget>>,
        peers: &[ferrite_reactor::mailbox::MailboxTx<crate::worker::Msg>],
    ) -> bool {
        let mut progress = false;
        if !self.ports.is_empty() && self.next_listen.is_none_or(|t| t <= now) {
            self.next_listen = Some(now + LISTEN_TICK);
            for (port, req) in self.take_requests(peers) {
                progress = true;
                self.incoming(now, shard, targets, &port, req);
            }
        }
        if let Some(cq) = &self.cq {
            self.wcs.clear();
            if cq.poll_cq(&mut self.wcs) > 0 {
                progress = true;
            }
            for wc in &self.wcs {
                if !matches!(wc.status, WcStatus::Success | WcStatus::WrFlushErr) {
                    // A remote access error (bad rkey, bounds) or a transport
                    // failure breaks the queue pair: the channel ends.
                    tracing::warn!(core = self.core, qpn = wc.qp_num, status = ?wc.status,
                        opcode = ?wc.opcode, "SRP channel: work request failed; closing the channel");
                }
                if let Some(&key) = self.by_qpn.get(&wc.qp_num)
                    && let Some(c) = self.conns.get_mut(key)
                {
                    c.conn.handle_completion(wc);
                }
            }
        }
        let mut finished = Vec::new();
        for (key, c) in self.conns.iter_mut() {
            c.conn.poll_conn_events();
            if c.session.is_some() {
                // SBC-4 §4.10 / SPC-4 §5.12: a capacity change is reported
                // as an event where the fabric can (SRP_AER_REQ).
                for (lun, g) in c.gens.iter_mut() {
                    if let Some(e) = c.luns.luns.get(lun) {
                        let now_g = e.device.generation();
                        if now_g != *g {
                            *g = now_g;
                            c.conn.handle_action(ferrite_core::Action::Aen {
                                lun: *lun,
                                sense: Sense::CAPACITY_DATA_HAS_CHANGED,
                            });
                            progress = true;
                        }
                    }
                }
            }
            progress |= drive(now, c, shard);
            if c.session.is_none() && c.conn.finished() {
                finished.push(key);
            }
        }
        for key in finished {
            let c = self.conns.remove(key);
            let qpn = c.conn.qp().qp_num();
            self.by_qpn.remove(&qpn);
            tracing::info!(core = self.core, port = %c.port, initiator = %c.initiator, "SRP channel closed");
        }
        progress
    }

    /// When the listening core must look at its listeners next.
    pub fn next_deadline(&self) -> Option<Instant> {
        if self.ports.is_empty() {
            None
        } else {
            self.next_listen
        }
    }

    /// The completion queue's fd.
    pub fn wake_fds(&self, out: &mut Vec<RawFd>) {
        if let Some(cq) = &self.cq {
            out.push(cq.fd());
        }
    }
}

fn reject(req: ConnRequest, reason: iu::LoginRejReason, why: &str) {
    tracing::warn!(why, reason = reason.0, "SRP login rejected");
    let rej = iu::LoginRej {
        tag: iu::iu_tag(req.private_data()).unwrap_or(0),
        reason,
        buf_fmt: iu::BUF_FORMAT_DIRECT | iu::BUF_FORMAT_INDIRECT,
    };
    if let Err(e) = req.reject(&rej.encode()) {
        tracing::debug!(error = %e, "SRP login reject not delivered");
    }
}

/// Moves events and actions between a channel and its session until both
/// are quiet, then posts what the channel produced.
fn drive(now: Instant, c: &mut SrpConn, shard: &mut Shard) -> bool {
    let mut any = false;
    loop {
        let mut progress = false;
        while let Some(ev) = c.conn.poll_event() {
            progress = true;
            let session = c.session.and_then(|s| shard.session(s));
            match (ev, session) {
                (Event::Submit(req), Some(mut s)) => {
                    s.submit(now, req);
                }
                (Event::TaskMgmt(t), Some(mut s)) => {
                    s.task_mgmt(now, t);
                }
                (Event::DataOut { id, result }, Some(mut s)) => s.data_out_done_at(now, id, result),
                (Event::ResponseSent(id), Some(mut s)) => s.response_sent(id),
                (Event::Closed, _) => {
                    // The core aborts what it holds; nothing it still has
                    // will be answered on this channel.
                    if let Some(sid) = c.session.take() {
                        shard.close_session(now, sid);
                    }
                }
                (_, None) => {}
            }
        }
        if let Some(sid) = c.session
            && let Some(mut s) = shard.session(sid)
        {
            while let Some(a) = s.poll_action() {
                progress = true;
                c.conn.handle_action(a);
            }
        }
        c.conn.pump();
        if !progress {
            break;
        }
        any = true;
    }
    any
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn initiator_port_ids_are_named_like_ib_srpt() {
        let mut id = [0u8; 16];
        id[0] = 0xfe;
        id[15] = 0x01;
        assert_eq!(hex(&id), "0xfe000000000000000000000000000001");
    }

    #[test]
    fn soft_listen_addresses() {
        assert!(
            matches!(soft_addr("/run/x.sock").unwrap(), SoftAddr::Unix(p) if p == std::path::Path::new("/run/x.sock"))
        );
        assert!(
            matches!(soft_addr("127.0.0.1:4000").unwrap(), SoftAddr::Tcp(a) if a.port() == 4000)
        );
        assert!(soft_addr("x.sock").is_err());
    }

    #[test]
    fn bind_serves_soft_ports_only() {
        let dir = std::env::temp_dir().join(format!("fsrp-unit-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let sock = dir.join("p.sock");
        let soft = SrpTargetConfig::soft("p0", sock.to_string_lossy());
        let mut verbs = SrpTargetConfig::soft("h0", "/unused");
        verbs.provider = SrpProviderConfig::Verbs {
            device: None,
            port: 1,
            listen: "127.0.0.1:0".into(),
        };
        let ports = bind_ports(&[soft, verbs]).unwrap();
        assert_eq!(ports.len(), 1);
        assert_eq!(ports[0].name, "p0");
        assert!(sock.exists());
        drop(ports);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
