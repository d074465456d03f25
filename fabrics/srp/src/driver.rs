//! The SRP driver on the reactors: target ports (listeners), login policy,
//! and the pump between SRP channels ([`crate::target::TargetConn`]) and
//! their core sessions, as the crate's "Driver-facing API" describes.
//!
//! Owns: binding SRP ports (at start-up, [`bind_ports`]; while running,
//! [`bind_port`] from the management runtime), the one-line report of a
//! machine without an HCA, accepting logins on the core that owns the
//! listeners (core 0) and dealing them to the cores, the multi-channel
//! policy (SRP r16a §6.2: every channel of one I_T nexus runs on one core
//! and shares one core session), running each channel on its core for its
//! life, and the per-port channel board that `ferritectl sessions` reads.
//!
//! Does not own: the SRP protocol ([`crate::channel`], [`crate::iu`]), the
//! providers (`ferrite-rdma`), SCSI (the core's `Shard`), the messages
//! between cores (the daemon carries [`SrpMsg`] through [`Cores`]), or
//! configuration (the daemon builds [`PortConfig`]s and [`SrpTarget`]s from
//! its configuration and publishes snapshots; cores follow them).
//!
//! Providers: `soft` and `verbs` ports go through the same code (listener,
//! login, channel, pump); they differ only in how a queue pair, its
//! protection domain and completion queue are made ([`PortListener`],
//! [`Request`]). On a machine without an RDMA device the daemon logs once,
//! at start, `RDMA fabrics idle: no RDMA device found`, and a configured
//! verbs port stays idle.
//!
//! Reactor rules: nothing here blocks. Every listener and completion queue
//! has an fd the reactor sleeps on ([`SrpCore::wake_fds`]): the soft
//! listener's is readable while login requests wait, RDMA CM's is its event
//! channel.

use std::collections::{BTreeMap, HashMap};
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use ferrite_core::cmd::Abort;
use ferrite_core::device::{Admission, LunMap, Refused, Target};
use ferrite_core::shard::{Nexus, SessionId, Shard};
use ferrite_core::{Action, TmfResponse};
use ferrite_rdma::soft::{
    ConnRequest, QpAttrs, SoftAddr, SoftCq, SoftDevice, SoftListener, SoftPd, SoftQp,
};
use ferrite_rdma::verbs::{
    VerbsConnRequest, VerbsCq, VerbsListener, VerbsPd, VerbsQp, VerbsQpAttrs,
};
use ferrite_rdma::{CompletionQueue, ProtectionDomain, RdmaError, WcStatus, WorkCompletion};

use crate::channel::{self, ChannelConfig, Event, Login, LoginRefusal};
use crate::iu;
use crate::target::{RecvRing, TargetConn};

/// How an SRP target port takes logins.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Provider {
    /// The soft provider on a Unix socket path (starting with `/`) or a
    /// TCP `address:port` (test and development).
    Soft { listen: String },
    /// RDMA CM on `listen` (`address:port`); `device` and `port` narrow
    /// which HCA and HCA port the logins may come from (None/0: any).
    Verbs {
        device: Option<String>,
        port: u8,
        listen: String,
    },
}

/// What binding an SRP target port needs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PortConfig {
    pub name: String,
    /// The port's 16-byte target port identifier (SRP r16a §5.3).
    pub port_id: [u8; 16],
    pub provider: Provider,
}

/// Why a port could not be bound or a channel's resources made.
#[derive(Debug, thiserror::Error)]
pub enum DriverError {
    #[error("{0:?} is not an address:port")]
    BadAddress(String),
    #[error("SRP port {port}: listening on {listen}")]
    Listen {
        port: String,
        listen: String,
        #[source]
        source: RdmaError,
    },
    #[error("creating a completion queue")]
    CompletionQueue(#[source] std::io::Error),
}

/// The cores of the daemon as the driver reaches them: core 0 deals new
/// I_T nexuses to the others by message.
pub trait Cores {
    /// How many cores run sessions.
    fn count(&self) -> usize;
    /// Hands `msg` to core `core`; false if its mailbox is closed.
    fn send(&self, core: usize, msg: SrpMsg) -> bool;
}

/// One I_T nexus of a port as management lists it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NexusInfo {
    /// The initiator port id, named as [`hex`] names it.
    pub initiator: String,
    /// The initiator group whose LUN map the nexus got (None: the
    /// default map).
    pub group: Option<String>,
    pub lun_count: u32,
    /// Its RDMA channels: provider, core and queue pair number.
    pub channels: Vec<String>,
    /// Commands in its task sets now.
    pub active_commands: u64,
}

/// Most I_T nexuses core 0 remembers the core of.
const MAX_NEXUS_ROUTES: usize = 16384;

/// Most RDMA channels one I_T nexus may have (the Linux initiator opens up
/// to one per CPU, `ch_count`); a login past it is refused with 00010006h.
const MAX_CHANNELS_PER_NEXUS: usize = 64;

/// An SRP target port as cores read it from the snapshot.
#[derive(Debug)]
pub struct SrpTarget {
    pub target: Arc<Target>,
    pub port_id: [u8; 16],
    pub credits: u32,
    /// The port's listener when the management runtime bound it (a port
    /// added or moved while running); ports bound at start-up are handed
    /// to core 0 by [`bind_ports`] instead.
    pub listener: Option<Arc<PortListener>>,
    /// The port's logged-in channels, for the session list.
    pub board: Arc<SessionBoard>,
}

impl SrpTarget {
    /// The same port with new LUN maps, groups or enabled flag: listener and
    /// channel board carry over.
    pub fn with_target(&self, target: Arc<Target>) -> SrpTarget {
        SrpTarget {
            target,
            port_id: self.port_id,
            credits: self.credits,
            listener: self.listener.clone(),
            board: self.board.clone(),
        }
    }
}

impl SrpTarget {
    /// The snapshot entry of a port with identifier `port_id` granting
    /// `credits` (no listener: see [`SrpTarget::listener`]).
    pub fn new(target: Arc<Target>, port_id: [u8; 16], credits: u32) -> SrpTarget {
        SrpTarget {
            target,
            port_id,
            credits,
            listener: None,
            board: Arc::default(),
        }
    }
}

/// Where a port takes login requests from.
pub enum PortListener {
    /// The soft provider (test and development).
    Soft(SoftListener),
    /// RDMA CM on an HCA. `device` and `hca_port` narrow which requests
    /// the port takes (None/0: any). The mutex only makes the listener
    /// shareable in a snapshot; core 0 alone takes requests from it.
    Verbs {
        listener: Mutex<VerbsListener>,
        device: Option<String>,
        hca_port: u8,
    },
}

impl std::fmt::Debug for PortListener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PortListener::Soft(l) => write!(f, "soft {:?}", l.addr()),
            PortListener::Verbs {
                device, hca_port, ..
            } => write!(f, "verbs {device:?} port {hca_port}"),
        }
    }
}

impl PortListener {
    /// Readable while requests may be waiting.
    fn fd(&self) -> Option<RawFd> {
        match self {
            PortListener::Soft(l) => Some(l.fd()),
            PortListener::Verbs { listener, .. } => listener.lock().ok().map(|l| l.fd()),
        }
    }

    fn poll_request(&self) -> Option<Request> {
        match self {
            PortListener::Soft(l) => l.poll_request().map(Request::Soft),
            PortListener::Verbs {
                listener,
                device,
                hca_port,
            } => {
                let l = listener.lock().ok()?;
                loop {
                    let r = l.poll_request()?;
                    let dev_ok = device.as_deref().is_none_or(|d| r.context().name() == d);
                    let port_ok = *hca_port == 0 || r.port_num() == *hca_port;
                    if dev_ok && port_ok {
                        return Some(Request::Verbs(r));
                    }
                    // Another HCA port's address: not this SRP port's
                    // business.
                    let why = LoginRefusal::OtherHcaPort(r.port_num());
                    let tag = iu::LoginReq::parse(r.private_data()).map_or(0, |q| q.tag);
                    tracing::warn!(device = %r.context().name(), reason = %format!("{:#010x}", why.reason().0),
                        why = %why, "SRP login rejected");
                    if let Err(e) = r.reject(&why.reject(tag).encode()) {
                        tracing::debug!(error = %e, "SRP login reject not delivered");
                    }
                }
            }
        }
    }
}

/// A login request, from either provider.
pub enum Request {
    Soft(ConnRequest),
    Verbs(VerbsConnRequest),
}

impl std::fmt::Debug for Request {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Request::Soft(r) => write!(f, "soft {r:?}"),
            Request::Verbs(r) => write!(f, "verbs {r:?}"),
        }
    }
}

impl Request {
    fn private_data(&self) -> &[u8] {
        match self {
            Request::Soft(r) => r.private_data(),
            Request::Verbs(r) => r.private_data(),
        }
    }

    fn reject(self, private_data: &[u8]) -> Result<(), ferrite_rdma::RdmaError> {
        match self {
            Request::Soft(r) => r.reject(private_data),
            Request::Verbs(r) => r.reject(private_data),
        }
    }
}

/// A bound port, owned by core 0.
pub struct SrpPort {
    pub name: String,
    listener: Arc<PortListener>,
}

impl std::fmt::Debug for SrpPort {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SrpPort({}, {:?})", self.name, self.listener)
    }
}

/// Binds every configured SRP port this machine can serve, and logs the
/// RDMA device situation once (start-up).
pub fn bind_ports(targets: &[PortConfig]) -> Result<Vec<SrpPort>, DriverError> {
    let hcas = rdma_device_count();
    let mut out = Vec::new();
    for t in targets {
        if let Some(listener) = bind_listener(t, hcas)? {
            out.push(SrpPort {
                name: t.name.clone(),
                listener: Arc::new(listener),
            });
        }
    }
    Ok(out)
}

/// Binds one port while the daemon runs (management). `Ok(None)`: a verbs
/// port on a machine without an RDMA device, configured and idle.
pub fn bind_port(t: &PortConfig) -> Result<Option<Arc<PortListener>>, DriverError> {
    let hcas = match &t.provider {
        Provider::Soft { .. } => 0,
        Provider::Verbs { .. } => ferrite_rdma::verbs::devices().map(|d| d.len()).unwrap_or(0),
    };
    Ok(bind_listener(t, hcas)?.map(Arc::new))
}

fn bind_listener(t: &PortConfig, hcas: usize) -> Result<Option<PortListener>, DriverError> {
    match &t.provider {
        Provider::Soft { listen } => {
            let addr = soft_addr(listen)?;
            if let SoftAddr::Unix(p) = &addr {
                // A stale socket from an earlier run would make bind fail.
                let _ = std::fs::remove_file(p);
            }
            let listener = SoftListener::bind(&addr).map_err(|source| DriverError::Listen {
                port: t.name.clone(),
                listen: listen.clone(),
                source,
            })?;
            tracing::info!(port = %t.name, listen = %listen, provider = "soft (test and development)",
                port_id = %hex(&t.port_id), "SRP target port listening");
            Ok(Some(PortListener::Soft(listener)))
        }
        Provider::Verbs {
            device,
            port,
            listen,
        } => {
            if hcas == 0 {
                tracing::info!(port = %t.name, "SRP target port idle: no RDMA device");
                return Ok(None);
            }
            let addr: std::net::SocketAddr = listen
                .parse()
                .map_err(|_| DriverError::BadAddress(listen.clone()))?;
            let listener =
                VerbsListener::bind(&addr, 128).map_err(|source| DriverError::Listen {
                    port: t.name.clone(),
                    listen: listen.clone(),
                    source,
                })?;
            tracing::info!(port = %t.name, listen = %listen, device = ?device, hca_port = port,
                port_id = %hex(&t.port_id), "SRP target port listening (verbs)");
            Ok(Some(PortListener::Verbs {
                listener: Mutex::new(listener),
                device: device.clone(),
                hca_port: *port,
            }))
        }
    }
}

/// Counts RDMA devices, logging once why the RDMA fabrics are idle when
/// they are (once per daemon start: this is called once): `RDMA fabrics
/// idle: no RDMA device found`, or, on a host without rdma-core, `RDMA
/// fabrics idle: libibverbs.so.1 not found (install rdma-core / libibverbs1
/// and librdmacm1): ...` (librdmacm.so.1 likewise).
fn rdma_device_count() -> usize {
    match ferrite_rdma::verbs::devices() {
        Ok(d) => {
            if !ferrite_rdma::log_idle_if_empty(&d) {
                for dev in &d {
                    tracing::info!(device = %dev.name, ports = dev.ports,
                        guid = %format!("{:016x}", dev.guid), "RDMA device found");
                }
            }
            d.len()
        }
        Err(e) => {
            tracing::info!("RDMA fabrics idle: {e}");
            0
        }
    }
}

fn soft_addr(listen: &str) -> Result<SoftAddr, DriverError> {
    if listen.starts_with('/') {
        return Ok(SoftAddr::Unix(listen.into()));
    }
    listen
        .parse()
        .map(SoftAddr::Tcp)
        .map_err(|_| DriverError::BadAddress(listen.to_string()))
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

/// One channel as the board shows it.
#[derive(Debug)]
struct BoardEntry {
    initiator: String,
    /// The I_T nexus: channels with the same `(core, nexus)` share a core
    /// session.
    core: usize,
    nexus: u32,
    channel: String,
    group: Option<String>,
    luns: u32,
    active: Arc<AtomicU64>,
    /// Management asked for this nexus to be closed (`force_close`).
    close: bool,
}

/// The channels logged in on one SRP port. Written by cores at login,
/// logout and map changes (the control path), read by the management
/// thread; commands in flight are counters the owning core stores.
#[derive(Debug, Default)]
pub struct SessionBoard {
    next: AtomicU64,
    channels: Mutex<BTreeMap<u64, BoardEntry>>,
}

impl SessionBoard {
    fn add(&self, e: BoardEntry) -> u64 {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        if let Ok(mut m) = self.channels.lock() {
            m.insert(id, e);
        }
        id
    }

    fn remove(&self, id: u64) {
        if let Ok(mut m) = self.channels.lock() {
            m.remove(&id);
        }
    }

    fn set_map(&self, id: u64, group: Option<String>, luns: u32) {
        if let Ok(mut m) = self.channels.lock()
            && let Some(e) = m.get_mut(&id)
        {
            e.group = group;
            e.luns = luns;
        }
    }

    /// Marks every channel of `initiator`'s nexus for closing (the owning
    /// core logs them out at its next snapshot); false if it has none.
    pub fn request_close(&self, initiator: &str) -> bool {
        let Ok(mut m) = self.channels.lock() else {
            return false;
        };
        let mut any = false;
        for e in m.values_mut().filter(|e| e.initiator == initiator) {
            e.close = true;
            any = true;
        }
        any
    }

    fn close_requested(&self, id: u64) -> bool {
        self.channels
            .lock()
            .ok()
            .and_then(|m| m.get(&id).map(|e| e.close))
            .unwrap_or(false)
    }

    /// The port's I_T nexuses, one [`NexusInfo`] each, with their
    /// channels.
    pub fn sessions(&self) -> Vec<NexusInfo> {
        let Ok(m) = self.channels.lock() else {
            return Vec::new();
        };
        let mut by_nexus: BTreeMap<(usize, u32), NexusInfo> = BTreeMap::new();
        for e in m.values() {
            let s = by_nexus
                .entry((e.core, e.nexus))
                .or_insert_with(|| NexusInfo {
                    initiator: e.initiator.clone(),
                    group: e.group.clone(),
                    lun_count: e.luns,
                    ..NexusInfo::default()
                });
            s.channels.push(e.channel.clone());
            s.active_commands += e.active.load(Ordering::Relaxed);
        }
        by_nexus.into_values().collect()
    }
}

/// Messages for a core's SRP part.
pub enum SrpMsg {
    /// A login request taken by the listening core, to run on this one.
    Incoming { port: String, req: Request },
}

/// How a channel's queue pair completes: into the core's shared soft CQ,
/// or into its own verbs CQ.
enum ChanCq {
    Soft,
    Verbs { cq: VerbsCq, event_fd: RawFd },
}

/// One channel on this core.
struct SrpConn {
    conn: TargetConn,
    cq: ChanCq,
    /// The core session (I_T nexus) this channel belongs to; several
    /// channels may share one (SRP r16a §6.2 MULTI-CHANNEL ACTION 1).
    /// None once the session is closed.
    session: Option<SessionId>,
    /// The channel has ended (logout, error, disconnect).
    closed: bool,
    port: String,
    initiator: String,
    initiator_id: [u8; 16],
    luns: Arc<LunMap>,
    board: Arc<SessionBoard>,
    board_id: u64,
    active: Arc<AtomicU64>,
}

/// Verbs resources of one device on one core.
struct VerbsDev {
    pd: VerbsPd,
}

/// The SRP part of one core.
pub struct SrpCore {
    core: usize,
    ports: Vec<SrpPort>,
    _dev: SoftDevice,
    pd: SoftPd,
    cq: Option<SoftCq>,
    verbs: HashMap<String, VerbsDev>,
    conns: slab::Slab<SrpConn>,
    /// Soft queue pairs by number (they share the core's CQ).
    by_qpn: HashMap<u32, usize>,
    wcs: Vec<WorkCompletion>,
    rr: usize,
    /// Core 0: where each I_T nexus's channels run, so that every channel
    /// of one initiator port on one target port lands on one core.
    nexus_core: HashMap<(String, [u8; 16]), usize>,
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
            verbs: HashMap::new(),
            conns: slab::Slab::new(),
            by_qpn: HashMap::new(),
            wcs: Vec::new(),
            rr: core,
            nexus_core: HashMap::new(),
            stopping: false,
        }
    }

    /// Hands this core the ports bound at start-up (core 0).
    pub fn set_ports(&mut self, ports: Vec<SrpPort>) {
        self.ports = ports;
    }

    /// True when nothing runs here.
    pub fn is_empty(&self) -> bool {
        self.conns.is_empty()
    }

    fn soft_cq(&mut self) -> Result<SoftCq, DriverError> {
        if let Some(cq) = &self.cq {
            return Ok(cq.clone());
        }
        let cq = SoftCq::new().map_err(DriverError::CompletionQueue)?;
        self.cq = Some(cq.clone());
        Ok(cq)
    }

    /// Takes waiting login requests and sends each to a core. Returns the
    /// requests to run here.
    fn take_requests(&mut self, cores: &dyn Cores) -> Vec<(String, Request)> {
        let mut here = Vec::new();
        if self.stopping {
            return here;
        }
        let n = cores.count().max(1);
        for p in &self.ports {
            while let Some(req) = p.listener.poll_request() {
                // SRP r16a §6.2: channels of one I_T nexus (initiator port
                // id, target port) are one nexus, so they share one core
                // session, so they run on one core. A new nexus is dealt
                // round-robin.
                let nexus = iu::LoginReq::parse(req.private_data())
                    .ok()
                    .map(|r| (p.name.clone(), r.initiator_port_id));
                let target = match nexus.as_ref().and_then(|k| self.nexus_core.get(k)) {
                    Some(&c) if c < n => c,
                    _ => {
                        let c = self.rr % n;
                        self.rr = self.rr.wrapping_add(1);
                        if self.nexus_core.len() >= MAX_NEXUS_ROUTES {
                            // Bounded whatever logins a peer invents; a
                            // forgotten nexus is dealt afresh (its later
                            // channels may then meet no channel to join).
                            self.nexus_core.clear();
                        }
                        if let Some(k) = nexus {
                            self.nexus_core.insert(k, c);
                        }
                        c
                    }
                };
                if target == self.core || cores.count() == 0 {
                    here.push((p.name.clone(), req));
                } else if !cores.send(
                    target,
                    SrpMsg::Incoming {
                        port: p.name.clone(),
                        req,
                    },
                ) {
                    tracing::warn!(core = target, "core mailbox closed; SRP login dropped");
                }
            }
        }
        here
    }

    /// A login request: SRP r16a §6.2-§6.4 through `channel::login`, then
    /// the port's policy ([`admit`]: enabled, the initiator admitted; LUN
    /// map by initiator port id) and the multi-channel action.
    pub fn incoming(
        &mut self,
        now: Instant,
        shard: &mut Shard,
        targets: &BTreeMap<String, Arc<SrpTarget>>,
        port: &str,
        req: Request,
    ) {
        if self.stopping {
            return;
        }
        let Some(t) = targets.get(port).cloned() else {
            let tag = iu::LoginReq::parse(req.private_data()).map_or(0, |r| r.tag);
            return reject(req, port, None, tag, LoginRefusal::PortRemoved);
        };
        let cfg = ChannelConfig {
            credits: t.credits,
            target_port_id: t.port_id,
            ..ChannelConfig::default()
        };
        // SRP r16a §6.2-§6.4: the request in either layout (the 64-byte IU,
        // or the 56 bytes Linux sends over RDMA CM), every refusal an
        // SRP_LOGIN_REJ with its reason.
        let (channel, mut rsp, login_req, layout) =
            match channel::login(cfg.clone(), req.private_data()) {
                Login::Reject { rej, why } => {
                    let initiator = iu::LoginReq::parse(req.private_data())
                        .ok()
                        .map(|r| hex(&r.initiator_port_id));
                    return reject(req, port, initiator.as_deref(), rej.tag, why);
                }
                Login::Accept {
                    channel,
                    rsp,
                    req,
                    layout,
                } => (channel, rsp, req, layout),
            };
        let initiator_id = login_req.initiator_port_id;
        let initiator = hex(&initiator_id);
        let admitted = match admit(&t.target, &initiator) {
            Ok(a) => a,
            Err(why) => return reject(req, port, Some(&initiator), login_req.tag, why),
        };
        let attrs = QpAttrs {
            max_send_wr: (cfg.credits as usize * 4).max(256),
            max_recv_wr: cfg.recv_count() as usize,
            ..QpAttrs::default()
        };
        // The channels this login joins or ends (SRP r16a §6.2).
        let same_nexus: Vec<usize> = self
            .conns
            .iter()
            .filter(|(_, c)| {
                !c.closed && c.session.is_some() && c.port == port && c.initiator_id == initiator_id
            })
            .map(|(k, _)| k)
            .collect();
        let multi = login_req.multi_channel_action() == iu::MULTICHAN_MULTI;
        if multi && same_nexus.len() >= MAX_CHANNELS_PER_NEXUS {
            // Bounded whatever an initiator asks: SRP r16a §6.4 00010006h.
            return reject(
                req,
                port,
                Some(&initiator),
                login_req.tag,
                LoginRefusal::ChannelLimit(same_nexus.len()),
            );
        }
        let imm = channel.immediate_data_offset();
        let it_iu_len = channel.config().max_it_iu_len;
        Self::multi_result(&mut rsp, &same_nexus, multi);
        let who = Refuser {
            port,
            initiator: &initiator,
            tag: login_req.tag,
        };
        let made = match req {
            Request::Soft(r) => self.accept_soft(r, &who, attrs, channel, &rsp),
            Request::Verbs(r) => self.accept_verbs(r, &who, attrs, channel, &rsp),
        };
        let Some((conn, cq)) = made else { return };
        // SRP r16a §6.2 MULTI-CHANNEL ACTION: 0 ends the nexus's other
        // channels (their tasks are aborted with the old nexus), 1 adds
        // this channel to it.
        let joined = match (multi, same_nexus.first()) {
            (true, Some(&k)) => self.conns.get(k).and_then(|c| c.session),
            _ => None,
        };
        if !multi && !same_nexus.is_empty() {
            let mut ended = Vec::new();
            for &k in &same_nexus {
                if let Some(c) = self.conns.get_mut(k) {
                    c.conn.terminate(iu::TLogoutReason::MULTI_CHANNEL_ACTION);
                    c.conn.pump();
                    c.closed = true;
                    if let Some(sid) = c.session.take() {
                        ended.push(sid);
                    }
                }
            }
            ended.sort_by_key(|s| s.0);
            ended.dedup();
            for sid in ended {
                shard.close_session(now, sid);
            }
            tracing::info!(core = self.core, port, initiator = %initiator, channels = same_nexus.len(),
                "SRP single-channel login: the initiator port's other channels terminated");
        }
        let (sid, luns) = match joined.and_then(|sid| {
            same_nexus
                .first()
                .and_then(|&k| self.conns.get(k))
                .map(|c| (sid, c.luns.clone()))
        }) {
            Some(j) => j,
            None => {
                let luns = admitted.luns.clone();
                let nexus = Nexus {
                    initiator: initiator.clone(),
                    initiator_port: initiator.clone(),
                    target: t.target.name.clone(),
                    rel_port_id: t.target.rel_port_id,
                    target_port: String::new(),
                    protocol: Some(ferrite_scsi::inquiry::protocol::SRP),
                };
                // The SRP target can report events (SRP_AER_REQ): aen = true.
                (shard.open_session(now, nexus, luns.clone(), true), luns)
            }
        };
        let qpn = conn.qp().qp_num();
        let provider = match cq {
            ChanCq::Soft => "soft",
            ChanCq::Verbs { .. } => "verbs",
        };
        let active = Arc::new(AtomicU64::new(0));
        let board_id = t.board.add(BoardEntry {
            initiator: initiator.clone(),
            core: self.core,
            nexus: sid.0,
            channel: format!("{provider} core {} qpn {qpn:#x}", self.core),
            group: t.target.group_of(&luns),
            luns: luns.luns.len() as u32,
            active: active.clone(),
            close: false,
        });
        tracing::info!(core = self.core, port, initiator = %initiator, qpn,
            channels = if joined.is_some() { same_nexus.len() + 1 } else { 1 },
            layout = ?layout, it_iu_len, immediate_data_offset = ?imm, "SRP login");
        let soft = matches!(cq, ChanCq::Soft);
        let key = self.conns.insert(SrpConn {
            conn,
            cq,
            session: Some(sid),
            closed: false,
            port: port.to_string(),
            initiator,
            initiator_id,
            luns,
            board: t.board.clone(),
            board_id,
            active,
        });
        if soft {
            self.by_qpn.insert(qpn, key);
        }
    }

    /// The MULTI-CHANNEL RESULT of a login (SRP r16a §6.3).
    /// Bits 1:0 of RSP_FLAGS; the others (SRP-2 immediate data supported)
    /// are the channel's.
    fn multi_result(rsp: &mut iu::LoginRsp, same_nexus: &[usize], multi: bool) {
        let result = match (same_nexus.is_empty(), multi) {
            (true, _) => iu::LOGIN_RSP_NO_CHANNEL,
            (false, true) => iu::LOGIN_RSP_MAINTAINED,
            (false, false) => iu::LOGIN_RSP_TERMINATED,
        };
        rsp.rsp_flags = (rsp.rsp_flags & !iu::MULTICHAN_MASK) | result;
    }

    fn accept_soft(
        &mut self,
        req: ConnRequest,
        who: &Refuser<'_>,
        attrs: QpAttrs,
        channel: Box<channel::Channel>,
        rsp: &iu::LoginRsp,
    ) -> Option<(TargetConn, ChanCq)> {
        let cq = match self.soft_cq() {
            Ok(cq) => cq,
            Err(e) => {
                tracing::warn!(error = %e, "SRP channel: no completion queue");
                who.refuse(Request::Soft(req), "completion queue");
                return None;
            }
        };
        let qp = SoftQp::create(&self.pd, &cq, &cq, None, attrs);
        // The receive ring has the negotiated IU length.
        let ring = match RecvRing::for_config(&self.pd, channel.config())
            .and_then(|r| r.post_all(&qp).map(|_| r))
        {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(error = %e, "SRP channel: no receive ring");
                who.refuse(Request::Soft(req), "receive ring");
                return None;
            }
        };
        if let Err(e) = qp.accept(req, &rsp.encode()) {
            tracing::warn!(error = %e, "SRP accept failed");
            return None;
        }
        match TargetConn::new(
            channel,
            Box::new(qp),
            Box::new(self.pd.clone()),
            ring,
            attrs.max_sge,
        ) {
            Ok(c) => Some((c, ChanCq::Soft)),
            Err(e) => {
                tracing::warn!(error = %e, "SRP channel setup failed");
                None
            }
        }
    }

    /// The same as [`SrpCore::accept_soft`] on an HCA: the protection
    /// domain is the device's on this core, the completion queue the
    /// channel's own (sized for it, so it can never overflow).
    fn accept_verbs(
        &mut self,
        mut req: VerbsConnRequest,
        who: &Refuser<'_>,
        attrs: QpAttrs,
        channel: Box<channel::Channel>,
        rsp: &iu::LoginRsp,
    ) -> Option<(TargetConn, ChanCq)> {
        let ctx = req.context();
        let name = ctx.name();
        if !self.verbs.contains_key(&name) {
            match ctx.alloc_pd() {
                Ok(pd) => {
                    self.verbs.insert(name.clone(), VerbsDev { pd });
                }
                Err(e) => {
                    tracing::warn!(device = %name, error = %e, "SRP channel: no protection domain");
                    who.refuse(Request::Verbs(req), "protection domain");
                    return None;
                }
            }
        }
        let pd = self.verbs.get(&name)?.pd.clone();
        let vattrs = VerbsQpAttrs {
            max_send_wr: attrs.max_send_wr as u32,
            max_recv_wr: attrs.max_recv_wr as u32,
            max_sge: attrs.max_sge as u32,
            ..VerbsQpAttrs::default()
        };
        let depth = (vattrs.max_send_wr + vattrs.max_recv_wr) as i32;
        let cq = match ctx.create_cq(depth) {
            Ok(cq) => cq,
            Err(e) => {
                tracing::warn!(device = %name, error = %e, "SRP channel: no completion queue");
                who.refuse(Request::Verbs(req), "completion queue");
                return None;
            }
        };
        // Should the queue pair not come up, the request is refused with
        // this SRP_LOGIN_REJ (the connection manager sends it).
        req.set_refusal(&who.rej("queue pair").encode());
        let qp = match VerbsQp::for_request(req, &pd, &cq, &cq, None, vattrs) {
            Ok(qp) => qp,
            Err(e) => {
                tracing::warn!(device = %name, error = %e, "SRP channel: no queue pair");
                who.log("queue pair");
                return None;
            }
        };
        let pd_dyn: &dyn ProtectionDomain = &pd;
        let ring = match RecvRing::for_config(pd_dyn, channel.config())
            .and_then(|r| r.post_all(&qp).map(|_| r))
        {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(error = %e, "SRP channel: no receive ring");
                qp.refuse(&who.rej("receive ring").encode());
                who.log("receive ring");
                return None;
            }
        };
        if let Err(e) = qp.accept(&rsp.encode()) {
            tracing::warn!(error = %e, "SRP accept failed");
            return None;
        }
        let event_fd = qp.event_fd();
        match TargetConn::new(channel, Box::new(qp), Box::new(pd), ring, attrs.max_sge) {
            Ok(c) => Some((c, ChanCq::Verbs { cq, event_fd })),
            Err(e) => {
                tracing::warn!(error = %e, "SRP channel setup failed");
                None
            }
        }
    }

    /// A new snapshot: channels whose port is gone or disabled are logged
    /// out (SRP_T_LOGOUT); sessions whose LUN map changed get the new one
    /// (the core raises REPORTED LUNS DATA HAS CHANGED, as an AEN too).
    /// Core 0 also takes the ports the runtime bound and drops those
    /// removed.
    pub fn apply_snapshot(
        &mut self,
        shard: &mut Shard,
        targets: &BTreeMap<String, Arc<SrpTarget>>,
    ) {
        if self.core == 0 && !self.stopping {
            self.ports.retain(|p| match targets.get(&p.name) {
                None => {
                    tracing::info!(port = %p.name, "SRP target port closed");
                    false
                }
                Some(t) => t
                    .listener
                    .as_ref()
                    .is_none_or(|l| Arc::ptr_eq(l, &p.listener)),
            });
            for (name, t) in targets {
                if let Some(l) = &t.listener
                    && !self.ports.iter().any(|p| &p.name == name)
                {
                    self.ports.push(SrpPort {
                        name: name.clone(),
                        listener: l.clone(),
                    });
                }
            }
        }
        let mut remapped: Vec<SessionId> = Vec::new();
        for (_, c) in self.conns.iter_mut() {
            let Some(sid) = c.session else { continue };
            if c.board.close_requested(c.board_id) {
                tracing::info!(port = %c.port, initiator = %c.initiator, "SRP nexus closed by management: logging out");
                c.conn.handle_action(Action::Close);
                c.conn.pump();
                continue;
            }
            match targets.get(&c.port) {
                Some(t) if t.target.enabled => {
                    let new = t.target.map_for(&c.initiator);
                    if !Arc::ptr_eq(&new, &c.luns) {
                        if !remapped.contains(&sid) {
                            shard.set_luns(sid, new.clone());
                            remapped.push(sid);
                        }
                        c.board
                            .set_map(c.board_id, t.target.group_of(&new), new.luns.len() as u32);
                        c.luns = new;
                    }
                }
                _ => {
                    tracing::info!(port = %c.port, initiator = %c.initiator, "SRP port removed or disabled: logging out");
                    c.conn.handle_action(Action::Close);
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
            c.conn.handle_action(Action::Close);
            c.conn.pump();
        }
    }

    /// Runs every channel: completions in, events to the core, actions out.
    pub fn poll(
        &mut self,
        now: Instant,
        shard: &mut Shard,
        targets: &BTreeMap<String, Arc<SrpTarget>>,
        cores: &dyn Cores,
    ) -> bool {
        let mut progress = false;
        if !self.ports.is_empty() {
            for (port, req) in self.take_requests(cores) {
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
                log_failed(self.core, wc);
                if let Some(&key) = self.by_qpn.get(&wc.qp_num)
                    && let Some(c) = self.conns.get_mut(key)
                {
                    c.conn.handle_completion(wc);
                }
            }
        }
        for (_, c) in self.conns.iter_mut() {
            if let ChanCq::Verbs { cq, .. } = &c.cq {
                self.wcs.clear();
                if cq.poll_cq(&mut self.wcs) > 0 {
                    progress = true;
                }
                for wc in &self.wcs {
                    log_failed(self.core, wc);
                    c.conn.handle_completion(wc);
                }
            }
            c.conn.poll_conn_events();
        }
        progress |= drive(now, &mut self.conns, shard);
        let finished: Vec<usize> = self
            .conns
            .iter()
            .filter(|(_, c)| c.closed && c.conn.finished())
            .map(|(k, _)| k)
            .collect();
        for key in finished {
            let c = self.conns.remove(key);
            let qpn = c.conn.qp().qp_num();
            if matches!(c.cq, ChanCq::Soft) {
                self.by_qpn.remove(&qpn);
            }
            c.board.remove(c.board_id);
            tracing::info!(core = self.core, port = %c.port, initiator = %c.initiator, "SRP channel closed");
        }
        progress
    }

    /// No timer: listeners and completion queues wake the reactor.
    pub fn next_deadline(&self) -> Option<Instant> {
        None
    }

    /// The fds that wake this core: listeners (core 0), the soft
    /// completion queue, and each verbs channel's CQ and RDMA CM events.
    pub fn wake_fds(&self, out: &mut Vec<RawFd>) {
        for p in &self.ports {
            if let Some(fd) = p.listener.fd() {
                out.push(fd);
            }
        }
        if let Some(cq) = &self.cq {
            out.push(cq.fd());
        }
        for (_, c) in self.conns.iter() {
            if let ChanCq::Verbs { cq, event_fd } = &c.cq {
                out.push(cq.fd());
                out.push(*event_fd);
            }
        }
    }
}

fn log_failed(core: usize, wc: &WorkCompletion) {
    if !matches!(wc.status, WcStatus::Success | WcStatus::WrFlushErr) {
        // A remote access error (bad rkey, bounds) or a transport failure
        // breaks the queue pair: the channel ends.
        tracing::warn!(core, qpn = wc.qp_num, status = ?wc.status,
            opcode = ?wc.opcode, "SRP channel: work request failed; closing the channel");
    }
}

/// The port's policy for a login that passed SRP's own checks: the core's
/// admission every fabric shares ([`Target::admit`]: the port is enabled
/// and its access rule admits the initiator port; iSCSI refuses with
/// 0202h), answered with SRP's reasons.
fn admit(t: &Target, initiator: &str) -> Result<Admission, LoginRefusal> {
    t.admit(initiator).map_err(|r| match r {
        // SRP r16a §6.4: the target cannot take the channel now.
        Refused::Disabled => LoginRefusal::PortDisabled,
        Refused::NotAdmitted => LoginRefusal::NotAdmitted,
    })
}

/// What a refusal of a login that passed the protocol checks needs.
struct Refuser<'a> {
    port: &'a str,
    initiator: &'a str,
    tag: u64,
}

impl Refuser<'_> {
    /// The SRP_LOGIN_REJ of a channel the target could not set up.
    fn rej(&self, what: &'static str) -> iu::LoginRej {
        LoginRefusal::Resources(what).reject(self.tag)
    }

    fn refuse(&self, req: Request, what: &'static str) {
        reject(
            req,
            self.port,
            Some(self.initiator),
            self.tag,
            LoginRefusal::Resources(what),
        );
    }

    /// The log line of a refusal the provider delivers itself.
    fn log(&self, what: &'static str) {
        let why = LoginRefusal::Resources(what);
        tracing::warn!(port = self.port, initiator = self.initiator,
            reason = %format!("{:#010x}", why.reason().0), why = %why, "SRP login rejected");
    }
}

/// Refuses a login: an SRP_LOGIN_REJ with the reason SRP prescribes as the
/// reject's private data (the Linux initiator reads it from there and
/// reports the reason), and one log line saying why.
fn reject(req: Request, port: &str, initiator: Option<&str>, tag: u64, why: LoginRefusal) {
    let rej = why.reject(tag);
    tracing::warn!(port, initiator = initiator.unwrap_or("?"),
        reason = %format!("{:#010x}", rej.reason.0), why = %why, "SRP login rejected");
    if let Err(e) = req.reject(&rej.encode()) {
        tracing::debug!(error = %e, "SRP login reject not delivered");
    }
}

/// The initiator tag an action is about (None: not a task's).
fn action_tag(a: &Action) -> Option<u64> {
    match a {
        Action::FetchData { tag, .. } | Action::Respond { tag, .. } => Some(tag.0),
        Action::TmfDone { tag, .. } => Some(tag.0),
        Action::Aen { .. } | Action::Close | Action::ConfirmDelivery => None,
    }
}

/// Moves events and actions between the channels and their sessions until
/// all are quiet, then posts what the channels produced. A session's
/// actions go to the channel holding the task's tag (tags are unique in an
/// I_T nexus, across its channels); an event goes to one live channel; a
/// close to all of them. A session's channels hold their credits while the
/// core makes it wait for data memory (`Session::data_waiting`).
fn drive(now: Instant, conns: &mut slab::Slab<SrpConn>, shard: &mut Shard) -> bool {
    let mut any = false;
    // (session, channel) pairs sorted by session: each session's channels
    // are one run of it (most sessions have one channel).
    let mut members: Vec<(u32, usize)> = Vec::new();
    loop {
        let mut progress = false;
        let mut ended: Vec<SessionId> = Vec::new();
        for (_, c) in conns.iter_mut() {
            while let Some(ev) = c.conn.poll_event() {
                progress = true;
                if let Event::Closed = ev {
                    c.closed = true;
                    if let Some(sid) = c.session {
                        ended.push(sid);
                    }
                    continue;
                }
                let Some(mut s) = c.session.and_then(|s| shard.session(s)) else {
                    continue;
                };
                match ev {
                    Event::Submit(req) => {
                        s.submit(now, req);
                    }
                    Event::TaskMgmt(t) => {
                        s.task_mgmt(now, t);
                    }
                    Event::DataOut { id, result } => s.data_out_done_at(now, id, result),
                    Event::ResponseSent(id) => s.response_sent(id),
                    Event::Closed => {}
                }
            }
        }
        // A session ends with its last channel; the core aborts what it
        // still holds, and nothing it has is answered.
        for sid in ended {
            let live = conns
                .iter()
                .any(|(_, c)| c.session == Some(sid) && !c.closed);
            if !live {
                for (_, c) in conns.iter_mut() {
                    if c.session == Some(sid) {
                        c.session = None;
                    }
                }
                shard.close_session(now, sid);
            }
        }
        members.clear();
        members.extend(
            conns
                .iter()
                .filter_map(|(k, c)| c.session.map(|s| (s.0, k))),
        );
        members.sort_unstable();
        for run in members.chunk_by(|a, b| a.0 == b.0) {
            let sid = SessionId(run[0].0);
            let Some(mut s) = shard.session(sid) else {
                continue;
            };
            // While the core makes the nexus wait for data memory, its
            // channels' request limits stop growing (SRP's MaxCmdSN).
            let waiting = s.data_waiting();
            for (_, k) in run {
                if let Some(c) = conns.get_mut(*k) {
                    c.conn.hold_credits(waiting);
                }
            }
            let mut orphans = Vec::new();
            while let Some(a) = s.poll_action() {
                progress = true;
                let target = match (run, action_tag(&a)) {
                    // One channel: everything is its.
                    ([(_, k)], _) => Some(*k),
                    (_, Some(tag)) => run.iter().map(|(_, k)| *k).find(|k| {
                        conns
                            .get(*k)
                            .is_some_and(|c| c.conn.channel().has_task(tag))
                    }),
                    (_, None) if matches!(a, Action::Close) => {
                        for (_, k) in run {
                            if let Some(c) = conns.get_mut(*k) {
                                c.conn.handle_action(Action::Close);
                            }
                        }
                        continue;
                    }
                    (_, None) => run
                        .iter()
                        .map(|(_, k)| *k)
                        .find(|k| conns.get(*k).is_some_and(|c| !c.closed)),
                };
                // A completed TMF ended the tasks it covers on every channel
                // of the nexus (SAM-5 §7; SRP r16a §6.2): the others forget
                // theirs too and return those credits.
                if let (Action::TmfDone { tag, rsp, .. }, Some(k), [_, _, ..]) = (&a, target, run)
                    && *rsp == TmfResponse::Complete
                    && let Some((func, lun)) = conns
                        .get(k)
                        .and_then(|c| c.conn.channel().tmf_in_core(tag.0))
                {
                    for &(_, other) in run.iter().filter(|(_, o)| *o != k) {
                        if let Some(c) = conns.get_mut(other) {
                            c.conn.tmf_done_elsewhere(func, lun);
                        }
                    }
                }
                match target.and_then(|k| conns.get_mut(k)) {
                    Some(c) => c.conn.handle_action(a),
                    None => orphans.push(a),
                }
            }
            // A task whose channel is gone while its nexus lives on (a
            // channel of several ended): complete it toward the core
            // without sending anything.
            for a in orphans {
                match a {
                    Action::FetchData { id, .. } => {
                        s.data_out_done_at(now, id, Err(Abort::ConnectionLost))
                    }
                    Action::Respond { id, .. } => s.response_sent(id),
                    _ => {}
                }
            }
        }
        for (_, c) in conns.iter_mut() {
            c.conn.pump();
        }
        if !progress {
            break;
        }
        any = true;
    }
    for (_, c) in conns.iter_mut() {
        let n = c.conn.channel().tasks() as u64;
        if c.active.load(Ordering::Relaxed) != n {
            c.active.store(n, Ordering::Relaxed);
        }
    }
    any
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferrite_core::device::AccessGroup;

    /// A port with no default LUNs and one group of initiator ports.
    fn grouped_port(enabled: bool) -> Target {
        Target {
            name: "srp0".into(),
            rel_port_id: 1,
            enabled,
            luns: Arc::new(LunMap::default()),
            groups: vec![AccessGroup {
                name: "hosts".into(),
                initiators: vec!["0xfe80*".into()],
                luns: Arc::new(LunMap::default()),
            }],
        }
    }

    #[test]
    fn a_port_with_groups_and_no_default_luns_refuses_initiators_in_no_group() {
        let t = grouped_port(true);
        assert!(admit(&t, "0xfe800000000000000000000000000001").is_ok());
        let refused = admit(&t, "0x00000000000000000000000000000001").unwrap_err();
        assert_eq!(refused, LoginRefusal::NotAdmitted);
        // SRP r16a §6.4: reason 00010000h in the SRP_LOGIN_REJ.
        let rej = refused.reject(7);
        assert_eq!((rej.tag, rej.reason.0), (7, 0x0001_0000));
        // Without groups every initiator port is admitted.
        let open = Target {
            groups: Vec::new(),
            ..grouped_port(true)
        };
        assert!(admit(&open, "0x00000000000000000000000000000001").is_ok());
        // A disabled port refuses everyone, members too.
        assert_eq!(
            admit(&grouped_port(false), "0xfe800000000000000000000000000001").unwrap_err(),
            LoginRefusal::PortDisabled
        );
    }

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
    fn bind_serves_soft_ports_and_verbs_ports_only_with_a_device() {
        let dir = std::env::temp_dir().join(format!("fsrp-unit-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let sock = dir.join("p.sock");
        let soft = PortConfig {
            name: "p0".into(),
            port_id: [1; 16],
            provider: Provider::Soft {
                listen: sock.to_string_lossy().into_owned(),
            },
        };
        let verbs = PortConfig {
            name: "h0".into(),
            port_id: [2; 16],
            provider: Provider::Verbs {
                device: None,
                port: 1,
                listen: "127.0.0.1:0".into(),
            },
        };
        let hcas = ferrite_rdma::verbs::devices().map(|d| d.len()).unwrap_or(0);
        let ports = bind_ports(&[soft, verbs.clone()]).unwrap();
        // Without an HCA (CI, this machine) the verbs port is idle; with
        // one it is bound through RDMA CM like any other port.
        assert_eq!(ports.len(), if hcas == 0 { 1 } else { 2 });
        assert_eq!(ports[0].name, "p0");
        assert!(matches!(*ports[0].listener, PortListener::Soft(_)));
        assert!(sock.exists());
        if hcas == 0 {
            assert!(bind_port(&verbs).unwrap().is_none());
        }
        let fd = ports[0].listener.fd();
        assert!(fd.is_some_and(|fd| fd >= 0));
        drop(ports);
        assert!(!sock.exists(), "a dropped soft port removes its socket");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn the_board_groups_channels_by_nexus() {
        let b = SessionBoard::default();
        let e = |core, nexus, ch: &str, n| BoardEntry {
            initiator: "0x01".into(),
            core,
            nexus,
            channel: ch.into(),
            group: None,
            luns: 2,
            active: Arc::new(AtomicU64::new(n)),
            close: false,
        };
        let a = b.add(e(1, 7, "soft core 1 qpn 0x1", 3));
        b.add(e(1, 7, "soft core 1 qpn 0x2", 4));
        b.add(e(0, 7, "soft core 0 qpn 0x3", 0));
        let s = b.sessions();
        assert_eq!(s.len(), 2, "same nexus id on another core is another nexus");
        let two = s.iter().find(|s| s.channels.len() == 2).unwrap();
        assert_eq!(two.active_commands, 7);
        assert_eq!(two.initiator, "0x01");
        assert_eq!(two.lun_count, 2);
        b.set_map(a, Some("g".into()), 5);
        assert!(!b.close_requested(a));
        assert!(b.request_close("0x01"));
        assert!(b.close_requested(a));
        assert!(!b.request_close("0x02"), "no such initiator");
        b.remove(a);
        let s = b.sessions();
        assert_eq!(s.iter().map(|s| s.channels.len()).sum::<usize>(), 2);
    }
}
