//! The TCP driver: runs one sans-IO [`Conn`] over a socket on a reactor.
//!
//! Only this file touches sockets. It feeds received bytes to the `Conn`,
//! hands the `Conn`'s events to the core's [`Session`](ferrite_core::Session),
//! hands the session's actions back to the `Conn`, and sends what the `Conn`
//! queues. Every RFC rule about PDUs lives in the `Conn`.
//!
//! Several connections of one session (MC/S) run on the core owning the
//! session and share a [`SessionGroup`]: the core session, the CmdSN window
//! ([`SessionSeq`]), the session's identity and leading-only parameters, and
//! the core actions one connection polled for another (a command's Data-In,
//! R2Ts and status go out on the connection it arrived on: RFC 7143
//! "connection allegiance").
//! At error recovery level 0 a connection that fails ends the session
//! (RFC 7143 §6.3.6, §7.1.4); a logout of one connection (reason 1) or its
//! reinstatement does not.

use rustc_hash::FxHashMap;
use std::cell::RefCell;
use std::collections::VecDeque;
use std::mem;
use std::net::{SocketAddr, TcpStream};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use ferrite_core::device::{LunMap, NexusWatch};
use ferrite_core::shard::{Nexus, SessionId, Shard};
use ferrite_core::{Abort, Action, TaskTag};
use ferrite_reactor::ring::{Ctx, TxSeg, advance};
use ferrite_reactor::sock::tcp_left_established;

use crate::conn::{CloseReason, Conn, ConnEvent, IscsiConfig, SessionSeq, TaskScope, TxQueue};
use crate::datamover::Datamover;
use crate::keys::Params;
use crate::pdu::{BHS_LEN, Bhs, LoginStatus, Opcode};

/// Largest receive buffer per connection: a whole maximal PDU header plus a
/// large piece of data segment (the `Conn` consumes data segments partially).
pub const RX_BUF: usize = 256 * 1024 + 4096;

/// Receive buffer a connection starts with. It doubles (up to [`RX_BUF`])
/// whenever a receive fills it, so idle and small-I/O sessions stay small and
/// streams of large data segments get the large buffer they read best with.
pub const RX_BUF_START: usize = 16 * 1024;

/// Token kinds in the low byte of a reactor token.
pub const TOKEN_RECV: u64 = 1;
pub const TOKEN_SEND: u64 = 2;

/// A login that reached the end of its operational stage, for the portal to decide.
#[derive(Debug)]
pub struct SessionRequest<'a> {
    pub initiator: &'a str,
    pub isid: [u8; 6],
    pub tsih: u16,
    pub target: Option<&'a str>,
    pub discovery: bool,
    pub peer: SocketAddr,
    /// The portal the connection came in on (its local address).
    pub local: SocketAddr,
    /// The transport carrying the connection: `"tcp"` or `"iser"` (how
    /// the session list names its connections).
    pub transport: &'static str,
}

/// What the portal grants a login.
#[derive(Debug)]
pub struct Grant {
    pub tsih: u16,
    /// The LUN map of a normal session (None for discovery).
    pub luns: Option<Arc<LunMap>>,
    /// Relative target port identifier of the target.
    pub rel_port_id: u16,
    /// Target portal group tag of the target (its port name).
    pub tpgt: u16,
}

/// The connections of one session on this core (MC/S), shared by their
/// [`TcpConn`]s through a [`SessionLink`].
#[derive(Debug)]
pub struct SessionGroup {
    tsih: u16,
    sid: SessionId,
    seq: SessionSeq,
    /// The leading connection's parameters: the session's LO keys.
    lead: Params,
    initiator: String,
    isid: [u8; 6],
    target: String,
    luns: Arc<LunMap>,
    /// Live connections: (member id, CID).
    members: Vec<(u32, u16)>,
    next_member: u32,
    /// Core actions one member polled for another, by member id.
    inbox: FxHashMap<u32, VecDeque<Action>>,
    /// Members replaced by connection reinstatement, for the driver to close.
    kicked: Vec<u32>,
    /// The session ended: every connection of it closes.
    ended: bool,
    /// Bumped whenever one member leaves work for another.
    work: u64,
}

/// A handle on a [`SessionGroup`]; it never leaves its core.
pub type SessionLink = Rc<RefCell<SessionGroup>>;

impl SessionGroup {
    pub fn tsih(&self) -> u16 {
        self.tsih
    }
    /// Connections the session has now.
    pub fn connections(&self) -> usize {
        self.members.len()
    }
    /// The session ended: its connections must all close.
    pub fn ended(&self) -> bool {
        self.ended
    }
    /// Changes whenever a member has work for another (queued actions, the
    /// CmdSN window moved): the driver pumps the members until it is stable.
    pub fn generation(&self) -> (u64, u32) {
        (self.work, self.seq.exp_cmd_sn().0)
    }
    /// Members replaced by connection reinstatement, to close.
    pub fn take_kicked(&mut self) -> Vec<u32> {
        mem::take(&mut self.kicked)
    }
    /// Members another connection logged out (reason 1 with their CID).
    pub fn take_logouts(&mut self) -> Vec<u32> {
        self.seq.take_logouts()
    }
    /// TMFs one member received whose tasks on the others stop receiving
    /// data: (that member, scope).
    pub fn take_aborts(&mut self) -> Vec<(u32, TaskScope)> {
        self.seq.take_aborts()
    }
    /// TMFs one member answered whose aborted tasks the others forget:
    /// (that member, scope).
    pub fn take_finished(&mut self) -> Vec<(u32, TaskScope)> {
        self.seq.take_finished()
    }
}

/// Where a core action goes.
enum Route {
    Here,
    Member(u32),
    /// Its connection is gone: the driver completes it towards the core.
    Nobody,
}

/// Why the daemon's side of a login ([`Portal::session_request`]) refuses
/// it; the connection answers each with its Login Response status (RFC 7143
/// §11.13.5).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// No TSIH or other resource left: 0300h.
    OutOfResources,
    /// A normal session without TargetName: 0207h.
    MissingTarget,
    /// No target of that name: 0203h.
    NoSuchTarget,
    /// The target is disabled or not reachable through this portal:
    /// 0301h (a target error the initiator may retry).
    Unavailable,
    /// The initiator is outside the target's access rule: 0202h.
    NotAdmitted,
    /// The TSIH names no live session of this initiator and ISID: 020Ah.
    NoSuchSession,
    /// The session has MaxConnections already: 0206h.
    TooManyConnections,
}

impl Refusal {
    /// The Login Response status of this refusal.
    pub fn status(self) -> LoginStatus {
        match self {
            Refusal::OutOfResources => LoginStatus::OUT_OF_RESOURCES,
            Refusal::MissingTarget => LoginStatus::MISSING_PARAMETER,
            Refusal::NoSuchTarget => LoginStatus::NOT_FOUND,
            Refusal::Unavailable => LoginStatus::SERVICE_UNAVAILABLE,
            Refusal::NotAdmitted => LoginStatus::AUTHORIZATION_FAILURE,
            Refusal::NoSuchSession => LoginStatus::SESSION_DOES_NOT_EXIST,
            Refusal::TooManyConnections => LoginStatus::TOO_MANY_CONNECTIONS,
        }
    }
}

/// The daemon side of logins: target lookup, ACLs, TSIH allocation.
pub trait Portal {
    fn session_request(&self, req: &SessionRequest<'_>) -> Result<Grant, Refusal>;
    fn session_closed(&self, tsih: u16);
    /// A connection of session `tsih`, which goes on, ended (MC/S).
    fn connection_closed(&self, _tsih: u16, _peer: SocketAddr) {}
    /// The session `tsih` runs on another core: a connection logging in to
    /// it must move there first (MC/S).
    fn session_elsewhere(&self, _tsih: u16) -> bool {
        false
    }
    /// The session with TSIH `tsih` running on this core.
    fn session_link(&self, _tsih: u16) -> Option<SessionLink> {
        None
    }
    /// A login from `peer` failed authentication or authorization with
    /// Login Response status `status` (class << 8 | detail); the answer is
    /// how long to hold the failure response back (a per-address backoff
    /// against guessing).
    fn login_failed(
        &self,
        _peer: SocketAddr,
        _initiator: Option<&str>,
        _status: u16,
    ) -> std::time::Duration {
        std::time::Duration::ZERO
    }
}

/// The core's watch on a session's leading connection
/// ([`ferrite_core::device::NexusWatch`]): the initiator dropped the nexus
/// once the kernel sees the connection leave the established state, before
/// this connection's core has read the end of the stream. It holds its own
/// descriptor of the socket, closed with the session.
#[derive(Debug)]
struct TcpWatch {
    sock: TcpStream,
    /// The connection left a session that goes on (a connection logout
    /// under MC/S): its state no longer speaks for the nexus.
    retired: AtomicBool,
}

impl NexusWatch for TcpWatch {
    fn gone(&self) -> bool {
        !self.retired.load(Ordering::Acquire) && tcp_left_established(&self.sock)
    }
}

/// One iSCSI connection on a TCP socket.
pub struct TcpConn {
    sock: TcpStream,
    peer: SocketAddr,
    conn: Conn,
    /// The receive buffer, absent while a recv is in flight.
    rx: Option<Vec<u8>>,
    /// Unconsumed bytes at the front of `rx`.
    rx_len: usize,
    /// The last receive emptied the socket: the next one waits for data first.
    rx_drained: bool,
    /// The next receive waits for [`TcpConn::arm_deferred_recv`].
    rx_deferred: bool,
    /// Bytes waiting to be sent (not yet handed to the ring).
    tx: VecDeque<TxSeg>,
    /// An emptied send queue kept for its allocation.
    tx_spare: VecDeque<TxSeg>,
    /// The session's actions being handed out (kept for its allocation).
    actions: VecDeque<Action>,
    txq: TxQueue,
    sending: bool,
    session: Option<SessionId>,
    /// The login being decided: initiator, isid, target, grant.
    pending: Option<(String, [u8; 6], Option<String>, Grant)>,
    tsih: Option<u16>,
    /// Target, initiator and LUN map of the normal session, once logged in.
    nexus: Option<(String, String, Arc<LunMap>)>,
    closing: bool,
    shut: bool,
    /// Nothing is sent before this instant (backoff after a failed login).
    hold_tx: Option<Instant>,
    /// The session's connections on this core (normal sessions).
    link: Option<SessionLink>,
    /// The first Login Request was looked at (where its session lives).
    routed: bool,
    /// The login names a session of another core: the worker moves the
    /// socket there ([`TcpConn::into_handoff`]).
    handoff: Option<u16>,
    /// A TARGET COLD RESET of this target was answered here: the worker
    /// drops every connection of the target ([`TcpConn::take_cold_reset`]).
    cold_reset: Option<String>,
    /// The watch on this connection the session it leads was given.
    watch: Option<Arc<TcpWatch>>,
}

impl TcpConn {
    /// Wraps an accepted socket.
    pub fn new(
        now: Instant,
        sock: TcpStream,
        cfg: Arc<IscsiConfig>,
        seed: u64,
    ) -> std::io::Result<TcpConn> {
        let local = sock.local_addr()?;
        let peer = sock.peer_addr()?;
        sock.set_nodelay(true)?;
        Ok(TcpConn {
            conn: Conn::new(now, cfg, local, peer, seed),
            sock,
            peer,
            rx: Some(vec![0; RX_BUF_START]),
            rx_len: 0,
            rx_drained: false,
            rx_deferred: false,
            tx: VecDeque::new(),
            tx_spare: VecDeque::new(),
            actions: VecDeque::new(),
            txq: TxQueue::default(),
            sending: false,
            session: None,
            pending: None,
            tsih: None,
            nexus: None,
            closing: false,
            shut: false,
            hold_tx: None,
            link: None,
            routed: false,
            handoff: None,
            cold_reset: None,
            watch: None,
        })
    }

    /// Wraps a socket another core accepted and moved here, with the bytes
    /// it already received (the start of a login to a session of this core).
    pub fn adopt(
        now: Instant,
        sock: TcpStream,
        cfg: Arc<IscsiConfig>,
        seed: u64,
        received: Vec<u8>,
    ) -> std::io::Result<TcpConn> {
        let mut c = TcpConn::new(now, sock, cfg, seed)?;
        c.routed = true;
        c.rx_len = received.len();
        let mut buf = received;
        buf.resize(buf.len().max(RX_BUF_START), 0);
        c.rx = Some(buf);
        Ok(c)
    }

    /// Processes the bytes an adopted connection brought, then reads on.
    pub fn start_adopted(
        &mut self,
        ctx: &mut Ctx,
        key: u64,
        shard: &mut Shard,
        portal: &dyn Portal,
    ) {
        match self.rx.take() {
            Some(buf) if self.rx_len > 0 => self.process(ctx, key, buf, shard, portal),
            other => {
                self.rx = other;
                self.arm_recv(ctx, key);
            }
        }
    }

    /// The TSIH of the session on another core this connection must move
    /// to; no operation is in flight on it then.
    pub fn handoff(&self) -> Option<u16> {
        self.handoff
    }

    /// The socket and the bytes received so far, for the core owning the
    /// session ([`TcpConn::adopt`]).
    pub fn into_handoff(self) -> (OwnedFd, Vec<u8>) {
        let mut bytes = self.rx.unwrap_or_default();
        bytes.truncate(self.rx_len);
        (OwnedFd::from(self.sock), bytes)
    }

    /// The session's connections on this core, once logged in.
    pub fn link(&self) -> Option<&SessionLink> {
        self.link.as_ref()
    }

    /// This connection's member id in its session.
    pub fn member(&self) -> u32 {
        self.conn.member()
    }

    /// A TMF another connection of the session received (by member
    /// `origin`) affects tasks in `scope`: those of this connection get no
    /// more R2Ts and their write data fails (RFC 7143 §11.5.1).
    pub fn abort_data(&mut self, origin: u32, scope: TaskScope) {
        if origin != self.conn.member() {
            self.conn.abort_data(scope);
        }
    }

    /// A TMF another connection of the session (member `origin`) answered:
    /// this connection's tasks it aborted are gone (their ITTs and window
    /// slots free).
    pub fn forget_aborted(&mut self, origin: u32, scope: TaskScope) {
        if origin != self.conn.member() {
            self.conn.forget_aborted(scope);
        }
    }

    /// Closing or closed.
    /// See [`Conn::take_depth_peak`].
    pub fn take_depth_peak(&mut self) -> u32 {
        self.conn.take_depth_peak()
    }

    pub fn is_closing(&self) -> bool {
        self.closing
    }

    /// Another login took this connection's CID (connection reinstatement,
    /// RFC 7143 §6.3.4), or another connection logged it out (RFC 7143
    /// §11.14.1, `logout`): it ends, its tasks are aborted, the session goes
    /// on.
    pub fn kick(&mut self, now: Instant, shard: &mut Shard, portal: &dyn Portal, logout: bool) {
        if self.closing {
            return;
        }
        if logout {
            tracing::info!(peer = %self.peer, cid = self.conn.cid(), "connection logged out by another connection of its session");
            self.conn.logged_out_elsewhere();
        } else {
            tracing::info!(peer = %self.peer, cid = self.conn.cid(), "connection reinstated by a new login");
            self.conn.reinstated();
        }
        self.drive(now, shard, portal);
        self.close(now, shard, portal);
    }

    fn fd(&self) -> RawFd {
        self.sock.as_raw_fd()
    }

    /// The peer's address.
    pub fn peer(&self) -> SocketAddr {
        self.peer
    }

    /// The portal this connection came in on (the socket's local address).
    pub fn local(&self) -> SocketAddr {
        self.conn.local_addr()
    }

    /// The core session of this connection, once logged in.
    pub fn session(&self) -> Option<SessionId> {
        self.session
    }

    /// RFC 7143 §11.9.1 AsyncEvent 1: asks the initiator to log out within
    /// the login timeout; past it the connection is dropped (AsyncEvent 3).
    pub fn request_logout(&mut self, now: Instant) {
        self.conn.handle_action(now, Action::Close);
    }

    /// The target whose every connection must be dropped because this
    /// connection answered a TARGET COLD RESET (RFC 7143 §11.5.1), once.
    pub fn take_cold_reset(&mut self) -> Option<String> {
        self.cold_reset.take()
    }

    /// Target name, initiator name and LUN map of the logged-in session.
    pub fn nexus(&self) -> Option<(&str, &str, &Arc<LunMap>)> {
        self.nexus
            .as_ref()
            .map(|(t, i, l)| (t.as_str(), i.as_str(), l))
    }

    /// The TSIH of this connection's session.
    pub fn tsih(&self) -> Option<u16> {
        self.tsih
    }

    /// Gives the session a new LUN map (live reconfiguration); the core
    /// raises the unit attentions.
    pub fn set_luns(&mut self, shard: &mut Shard, luns: Arc<LunMap>) {
        if let (Some(sid), Some(n)) = (self.session, self.nexus.as_mut()) {
            n.2 = luns.clone();
            if let Some(link) = &self.link {
                // One core session for all the connections: changed once.
                let mut g = link.borrow_mut();
                if Arc::ptr_eq(&g.luns, &luns) {
                    return;
                }
                g.luns = luns.clone();
            }
            shard.set_luns(sid, luns);
        }
    }

    /// Arms the first receive.
    pub fn start(&mut self, ctx: &mut Ctx, key: u64) {
        self.arm_recv(ctx, key);
    }

    fn arm_recv(&mut self, ctx: &mut Ctx, key: u64) {
        if self.closing {
            return;
        }
        if let Some(mut buf) = self.rx.take() {
            if self.rx_len >= buf.len() && buf.len() < RX_BUF {
                // Full: a PDU needs more room than this buffer has.
                buf.resize((buf.len() * 2).min(RX_BUF), 0);
            }
            if self.rx_len >= buf.len() {
                // The Conn consumed nothing from a full buffer: it cannot make
                // progress, which only a protocol violation causes.
                tracing::warn!(peer = %self.peer, "receive buffer full without progress; closing");
                self.rx = Some(buf);
                self.closing = true;
                return;
            }
            if std::mem::take(&mut self.rx_drained) {
                ctx.recv_drained(self.fd(), buf, self.rx_len, key << 8 | TOKEN_RECV);
            } else {
                ctx.recv(self.fd(), buf, self.rx_len, key << 8 | TOKEN_RECV);
            }
        }
    }

    /// A receive finished.
    pub fn on_recv(
        &mut self,
        ctx: &mut Ctx,
        key: u64,
        result: std::io::Result<usize>,
        mut buf: Vec<u8>,
        shard: &mut Shard,
        portal: &dyn Portal,
    ) {
        let n = match result {
            Ok(0) => {
                if self.rx_len > 0 {
                    tracing::warn!(peer = %self.peer, pending = self.rx_len,
                        "peer closed the connection in the middle of a PDU");
                } else {
                    tracing::debug!(peer = %self.peer, "connection closed by peer");
                }
                self.rx = Some(buf);
                self.begin_close(ctx.now(), shard, portal);
                self.finish_close();
                return;
            }
            Ok(n) => n,
            Err(e) => {
                tracing::debug!(peer = %self.peer, error = %e, "receive failed");
                self.rx = Some(buf);
                self.begin_close(ctx.now(), shard, portal);
                self.finish_close();
                return;
            }
        };
        // A receive that left room took everything the socket had.
        self.rx_drained = self.rx_len + n < buf.len();
        self.rx_len += n;
        if self.rx_len == buf.len() && buf.len() < RX_BUF {
            // The socket had at least a buffer's worth: read larger pieces.
            buf.resize((buf.len() * 2).min(RX_BUF), 0);
        }
        if !self.routed && self.rx_len >= BHS_LEN {
            self.routed = true;
            if let Some(b) = Bhs::from_slice(&buf[..self.rx_len])
                && b.opcode() == Opcode::LOGIN_REQ
                && b.tsih() != 0
                && portal.session_elsewhere(b.tsih())
            {
                // RFC 7143 §6.3.1: a login naming an existing session joins
                // it; its connections all live on the session's core.
                self.handoff = Some(b.tsih());
                self.rx = Some(buf);
                return;
            }
        }
        self.process(ctx, key, buf, shard, portal);
    }

    /// Feeds the received bytes in `buf[..rx_len]` to the `Conn`, then
    /// reads on.
    fn process(
        &mut self,
        ctx: &mut Ctx,
        key: u64,
        mut buf: Vec<u8>,
        shard: &mut Shard,
        portal: &dyn Portal,
    ) {
        let now = ctx.now();
        let mut off = 0;
        while off < self.rx_len {
            let used = self.conn.handle_input(now, &buf[off..self.rx_len]);
            if used == 0 {
                break;
            }
            off += used;
            // Deliver what that input produced before more input arrives.
            self.drive(now, shard, portal);
        }
        if off > 0 {
            buf.copy_within(off..self.rx_len, 0);
            self.rx_len -= off;
        }
        self.rx = Some(buf);
        self.pump(ctx, key, shard, portal);
        // The worker arms the next receive once this round's responses are
        // queued to be sent ([`TcpConn::arm_deferred_recv`]).
        self.rx_deferred = true;
    }

    /// Arms the receive that processing the last one left for later. The
    /// worker calls it after its poll pass, so the ring sends a round's
    /// responses before it reads the next commands: the responses carry
    /// the ACK of whatever arrived meanwhile, and the kernel's read then
    /// has none left to send on its own (a read that empties the socket
    /// after two or more small segments otherwise sends a bare ACK).
    pub fn arm_deferred_recv(&mut self, ctx: &mut Ctx, key: u64) {
        if std::mem::take(&mut self.rx_deferred) {
            self.arm_recv(ctx, key);
        }
    }

    /// A send finished.
    pub fn on_send(
        &mut self,
        ctx: &mut Ctx,
        key: u64,
        result: std::io::Result<usize>,
        mut segs: VecDeque<TxSeg>,
        shard: &mut Shard,
        portal: &dyn Portal,
    ) {
        self.sending = false;
        match result {
            Ok(n) => {
                advance(&mut segs, n);
                // Unsent bytes go out before anything queued since.
                while let Some(s) = segs.pop_back() {
                    self.tx.push_front(s);
                }
                if self.tx_spare.capacity() < segs.capacity() {
                    self.tx_spare = segs;
                }
            }
            Err(e) => {
                tracing::debug!(peer = %self.peer, error = %e, "send failed");
                self.tx.clear();
                self.begin_close(ctx.now(), shard, portal);
                self.finish_close();
                return;
            }
        }
        self.pump(ctx, key, shard, portal);
    }

    /// Timers: keepalive, login and logout timeouts.
    pub fn poll_timeout(&self) -> Option<Instant> {
        match (self.conn.poll_timeout(), self.hold_tx) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Fires the `Conn`'s timers if due.
    pub fn on_timer(&mut self, ctx: &mut Ctx, key: u64, shard: &mut Shard, portal: &dyn Portal) {
        if self.hold_tx.is_some_and(|t| t <= ctx.now()) {
            self.hold_tx = None;
            self.pump(ctx, key, shard, portal);
        }
        if self.conn.poll_timeout().is_some_and(|t| t <= ctx.now()) {
            self.conn.handle_timeout(ctx.now());
            self.pump(ctx, key, shard, portal);
        }
    }

    /// Moves events and actions between the `Conn` and the core until both are
    /// quiet, then sends what is queued.
    pub fn pump(&mut self, ctx: &mut Ctx, key: u64, shard: &mut Shard, portal: &dyn Portal) {
        self.drive(ctx.now(), shard, portal);
        self.flush(ctx, key);
    }

    fn drive(&mut self, now: Instant, shard: &mut Shard, portal: &dyn Portal) {
        loop {
            let mut progress = false;
            // Only a session another connection ever joined has actions
            // polled for this one elsewhere, or CmdSN gaps others fill.
            if let Some(link) = &self.link
                && link.borrow().next_member != 0
            {
                let link = link.clone();
                // Actions another connection of the session polled for this one.
                let mine = link.borrow_mut().inbox.remove(&self.conn.member());
                for a in mine.into_iter().flatten() {
                    progress = true;
                    self.deliver(now, a);
                }
                // Another connection may have filled the CmdSN gap before
                // requests held here.
                progress |= self.conn.release_held();
            }
            while let Some(ev) = self.conn.poll_event() {
                progress = true;
                self.on_event(now, ev, shard, portal);
            }
            if let Some(sid) = self.session
                && let Some(mut s) = shard.session(sid)
            {
                self.conn.session_seq().hold_window(s.data_waiting());
                let mut actions = std::mem::take(&mut self.actions);
                s.take_actions(&mut actions);
                while let Some(a) = actions.pop_front() {
                    progress = true;
                    match self.route(&a) {
                        Route::Here => self.deliver(now, a),
                        Route::Member(m) => {
                            if let Some(link) = &self.link {
                                let mut g = link.borrow_mut();
                                g.inbox.entry(m).or_default().push_back(a);
                                g.work += 1;
                            }
                        }
                        Route::Nobody => complete_orphan(&mut s, a),
                    }
                }
                self.actions = actions;
            }
            if !progress {
                break;
            }
        }
        if self.conn.is_closed() && !self.closing {
            self.begin_close(now, shard, portal);
        }
    }

    /// Hands a core action to this connection's `Conn`.
    fn deliver(&mut self, now: Instant, a: Action) {
        self.conn.handle_action(now, a);
    }

    /// Which connection of the session an action belongs to: a command's
    /// to the one it arrived on (RFC 7143 "connection allegiance"), a
    /// TMF response to the one that asked, an AEN or logout request to the
    /// session's oldest connection.
    fn route(&self, a: &Action) -> Route {
        let Some(link) = &self.link else {
            return Route::Here;
        };
        let g = link.borrow();
        let me = self.conn.member();
        if g.next_member == 0 {
            // No connection ever joined the leading one: every action is
            // its own (a closed one polls none), so the common case costs
            // no lookup.
            return Route::Here;
        }
        let itt = |tag: &TaskTag| u32::try_from(tag.0).ok();
        let owner = match a {
            Action::FetchData { tag, .. } | Action::Respond { tag, .. } => {
                itt(tag).and_then(|i| g.seq.task_owner(i))
            }
            Action::TmfDone { tag, .. } => itt(tag).and_then(|i| g.seq.tmf_owner(i)),
            Action::Aen { .. } | Action::Close | Action::ConfirmDelivery => {
                g.members.first().map(|(m, _)| *m)
            }
        };
        match owner {
            Some(m) if m == me => Route::Here,
            Some(m) => Route::Member(m),
            None => Route::Nobody,
        }
    }

    /// A login with a nonzero TSIH adds this connection to that session
    /// (MC/S, RFC 7143 §6.3.1).
    fn join(
        &mut self,
        req: &SessionRequest<'_>,
        portal: &dyn Portal,
    ) -> Result<(SessionLink, Grant, Option<u32>), Refusal> {
        // RFC 7143 §6.3.1 / §11.13.5: the TSIH must name a live session of
        // this initiator name and ISID, else 020Ah.
        let link = portal
            .session_link(req.tsih)
            .filter(|l| !l.borrow().ended)
            .ok_or(Refusal::NoSuchSession)?;
        let replaced = {
            let g = link.borrow();
            if g.initiator != req.initiator
                || g.isid != req.isid
                || req.target != Some(g.target.as_str())
                || req.discovery
            {
                return Err(Refusal::NoSuchSession);
            }
            let cid = self.conn.cid();
            let replaced = g.members.iter().find(|(_, c)| *c == cid).map(|(m, _)| *m);
            let others = g.members.len() - usize::from(replaced.is_some());
            // RFC 7143 §13.2 MaxConnections; §11.13.5: 0206h too many
            // connections on this session.
            if others >= usize::from(g.lead.max_connections.max(1)) {
                return Err(Refusal::TooManyConnections);
            }
            replaced
        };
        let grant = portal.session_request(req)?;
        Ok((link, grant, replaced))
    }

    fn on_event(&mut self, now: Instant, ev: ConnEvent, shard: &mut Shard, portal: &dyn Portal) {
        match ev {
            ConnEvent::SessionRequest {
                initiator,
                isid,
                tsih,
                target,
                discovery,
            } => {
                let req = SessionRequest {
                    initiator: &initiator,
                    isid,
                    tsih,
                    target: target.as_deref(),
                    discovery,
                    peer: self.peer,
                    local: self.conn.local_addr(),
                    transport: "tcp",
                };
                if tsih != 0 {
                    match self.join(&req, portal) {
                        Ok((link, grant, replaced)) => {
                            let (member, seq, lead, sid, luns) = {
                                let mut g = link.borrow_mut();
                                if let Some(old) = replaced {
                                    // RFC 7143 §6.3.4: connection reinstatement.
                                    g.members.retain(|(m, _)| *m != old);
                                    g.kicked.push(old);
                                    g.work += 1;
                                }
                                g.next_member += 1;
                                let member = g.next_member;
                                g.members.push((member, self.conn.cid()));
                                (member, g.seq.clone(), g.lead.clone(), g.sid, g.luns.clone())
                            };
                            tracing::info!(peer = %self.peer, initiator = %initiator, tsih,
                                cid = self.conn.cid(), connections = link.borrow().members.len(),
                                "connection added to the session");
                            self.conn.join_session(seq, &lead, member);
                            self.tsih = Some(grant.tsih);
                            self.session = Some(sid);
                            // Responses may now leave on several connections,
                            // each acknowledged on its own: no more pipe data
                            // (the holds already out stay with the leading
                            // connection, which ConfirmDelivery reaches).
                            if let Some(mut s) = shard.session(sid) {
                                s.set_pipe_reads(false);
                            }
                            self.nexus = target.map(|t| (t, initiator, luns));
                            self.link = Some(link);
                            self.conn.accept_session(tsih);
                        }
                        Err(why) => {
                            let status = why.status();
                            tracing::warn!(peer = %self.peer, initiator = %initiator, tsih,
                                class = status.class, detail = status.detail, ?why,
                                "connection refused to the session");
                            self.conn.reject_session(status);
                        }
                    }
                    return;
                }
                if let Some(grant) = decide_session(&mut self.conn, portal, &req) {
                    self.tsih = Some(grant.tsih);
                    self.pending = Some((initiator, isid, target, grant));
                }
            }
            ConnEvent::LoginFailed { initiator, status } => {
                let code = u16::from(status.class) << 8 | u16::from(status.detail);
                let delay = portal.login_failed(self.peer, initiator.as_deref(), code);
                if !delay.is_zero() {
                    tracing::info!(peer = %self.peer, delay_ms = delay.as_millis() as u64,
                        "failed login answered late (backoff)");
                    self.hold_tx = Some(now + delay);
                }
            }
            ConnEvent::LoggedIn => {
                if let Some((initiator, isid, Some(target), grant)) = self.pending.take()
                    && let Some(luns) = grant.luns
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
                    // Large reads from file LUNs in memory travel as their
                    // pages, spliced into the socket (`TxSeg::Pipe`).
                    if let Some(mut s) = shard.session(sid) {
                        s.set_pipe_reads(true);
                    }
                    match self.sock.try_clone() {
                        Ok(sock) => {
                            let w = Arc::new(TcpWatch {
                                sock,
                                retired: AtomicBool::new(false),
                            });
                            shard.watch_session(sid, w.clone());
                            self.watch = Some(w);
                        }
                        Err(e) => tracing::warn!(peer = %self.peer, error = %e,
                            "no watch on the connection: its session's loss is seen when read"),
                    }
                    self.session = Some(sid);
                    self.link = Some(Rc::new(RefCell::new(SessionGroup {
                        tsih: grant.tsih,
                        sid,
                        seq: self.conn.session_seq().clone(),
                        lead: self.conn.params().clone(),
                        initiator: initiator.clone(),
                        isid,
                        target: target.clone(),
                        luns: luns.clone(),
                        members: vec![(self.conn.member(), self.conn.cid())],
                        next_member: self.conn.member(),
                        inbox: FxHashMap::default(),
                        kicked: Vec::new(),
                        ended: false,
                        work: 0,
                    })));
                    self.nexus = Some((target, initiator, luns));
                }
            }
            ev @ (ConnEvent::Command(_)
            | ConnEvent::DataOutDone { .. }
            | ConnEvent::ResponseSent { .. }
            | ConnEvent::TaskMgmt(_)) => session_event(now, shard, self.session, self.peer, ev),
            ConnEvent::Closed { reason } => {
                tracing::info!(peer = %self.peer, ?reason, "connection closing");
                if reason == CloseReason::TargetReset {
                    self.cold_reset = self.nexus.as_ref().map(|(t, _, _)| t.clone());
                }
                self.begin_close(now, shard, portal);
            }
        }
    }

    /// Ends the core session; the socket is shut once queued bytes are sent.
    fn begin_close(&mut self, now: Instant, shard: &mut Shard, portal: &dyn Portal) {
        if self.closing {
            return;
        }
        self.closing = true;
        if let Some(link) = self.link.clone() {
            let me = self.conn.member();
            let (orphans, goes_on, first) = {
                let mut g = link.borrow_mut();
                g.members.retain(|(m, _)| *m != me);
                g.work += 1;
                let orphans = g.inbox.remove(&me);
                // RFC 7143 §6.3.6 / §7.1.4: at ERL 0 a failed connection
                // fails the session; a logged-out or reinstated one does not.
                let goes_on = !g.ended
                    && !g.members.is_empty()
                    && matches!(
                        self.conn.close_reason(),
                        Some(CloseReason::ConnectionLogout | CloseReason::Reinstated)
                    );
                let first = !goes_on && !g.ended;
                if !goes_on {
                    g.ended = true;
                }
                (orphans, goes_on, first)
            };
            if let Some(sid) = self.session.take() {
                if let Some(mut s) = shard.session(sid) {
                    for a in orphans.into_iter().flatten() {
                        complete_orphan(&mut s, a);
                    }
                }
                if first {
                    shard.close_session(now, sid);
                }
            }
            if goes_on && let Some(w) = self.watch.take() {
                w.retired.store(true, Ordering::Release);
            }
            if let Some(tsih) = self.tsih.take() {
                if goes_on {
                    tracing::info!(peer = %self.peer, tsih, "connection left the session");
                    portal.connection_closed(tsih, self.peer);
                } else if first {
                    portal.session_closed(tsih);
                }
            }
            return;
        }
        if let Some(sid) = self.session.take() {
            shard.close_session(now, sid);
        }
        if let Some(tsih) = self.tsih.take() {
            portal.session_closed(tsih);
        }
    }

    fn finish_close(&mut self) {
        if !self.shut {
            self.shut = true;
            let _ = self.sock.shutdown(std::net::Shutdown::Both);
        }
    }

    fn flush(&mut self, ctx: &mut Ctx, key: u64) {
        self.conn.poll_transmit(&mut self.txq);
        if self.tx.is_empty() {
            mem::swap(&mut self.tx, &mut self.txq.segs);
        } else {
            self.tx.extend(self.txq.segs.drain(..));
        }
        if self.sending || self.hold_tx.is_some() {
            return;
        }
        if self.tx.is_empty() {
            if self.closing {
                self.finish_close();
            }
            return;
        }
        if self.shut {
            self.tx.clear();
            return;
        }
        // The deque of the last finished send takes the place of this one:
        // its allocation goes round instead of a new one per send.
        let segs = mem::replace(&mut self.tx, mem::take(&mut self.tx_spare));
        self.sending = true;
        ctx.send(self.fd(), segs, key << 8 | TOKEN_SEND);
    }

    /// True once the connection is closed and no operation is in flight:
    /// the worker may drop it.
    pub fn is_finished(&self) -> bool {
        self.closing && self.shut && !self.sending && self.rx.is_some()
    }

    /// Closes the connection from the target side after telling the
    /// initiator with an Async Message (AsyncEvent 3, RFC 7143 §11.9.1):
    /// best effort, written without blocking when nothing else is queued
    /// (so it cannot land inside another PDU), then [`TcpConn::close`].
    pub fn close_with_notice(&mut self, now: Instant, shard: &mut Shard, portal: &dyn Portal) {
        if !self.closing && !self.sending && self.tx.is_empty() {
            self.conn.announce_drop_all(2, 0);
            self.conn.poll_transmit(&mut self.txq);
            let mut bytes = Vec::new();
            for seg in self.txq.segs.drain(..) {
                if let Some(b) = seg.bytes() {
                    bytes.extend_from_slice(b);
                }
            }
            if !bytes.is_empty() && self.sock.set_nonblocking(true).is_ok() {
                use std::io::Write;
                if let Err(e) = (&self.sock).write_all(&bytes) {
                    tracing::debug!(peer = %self.peer, error = %e, "drop notice not sent");
                }
            }
        }
        self.close(now, shard, portal);
    }

    /// Closes the connection from the target side (shutdown, target removed).
    pub fn close(&mut self, now: Instant, shard: &mut Shard, portal: &dyn Portal) {
        self.begin_close(now, shard, portal);
        self.tx.clear();
        self.finish_close();
    }
}

/// The portal's decision on the login of a new session (TSIH 0), for
/// every transport's driver (TCP here, iSER's in `ferrite-iser`): asks
/// `portal` (target lookup, portal check, admission, TSIH,
/// reinstatement), logs the outcome, and answers the login in `conn`
/// (accepted with the TSIH, or refused with the refusal's status). The
/// grant to keep until [`ConnEvent::LoggedIn`], or None if refused.
pub fn decide_session<D: Datamover>(
    conn: &mut Conn<D>,
    portal: &dyn Portal,
    req: &SessionRequest<'_>,
) -> Option<Grant> {
    let target = req.target.unwrap_or("(discovery)");
    match portal.session_request(req) {
        Ok(grant) => {
            tracing::info!(peer = %req.peer, initiator = %req.initiator, target,
                tsih = grant.tsih, "login");
            conn.accept_session(grant.tsih);
            Some(grant)
        }
        Err(why) => {
            let status = why.status();
            tracing::warn!(peer = %req.peer, initiator = %req.initiator, target,
                class = status.class, detail = status.detail, ?why, "login refused");
            conn.reject_session(status);
            None
        }
    }
}

/// Hands core session `sid` what a connection's session layer asks of it
/// (a command, write data placed, a response sent, task management),
/// whichever transport carries the connection; a command outside a normal
/// session is dropped with a log line. Other events are the driver's and
/// are ignored here.
pub fn session_event(
    now: Instant,
    shard: &mut Shard,
    sid: Option<SessionId>,
    peer: SocketAddr,
    ev: ConnEvent,
) {
    let Some(mut s) = sid.and_then(|s| shard.session(s)) else {
        if let ConnEvent::Command(_) = ev {
            tracing::warn!(%peer, "command outside a normal session dropped");
        }
        return;
    };
    match ev {
        ConnEvent::Command(req) => {
            s.submit(now, req);
        }
        ConnEvent::DataOutDone { id, data } => s.data_out_done(id, data),
        ConnEvent::ResponseSent { id } => s.response_sent(id),
        ConnEvent::TaskMgmt(req) => {
            s.task_mgmt(now, req);
        }
        ConnEvent::SessionRequest { .. }
        | ConnEvent::LoggedIn
        | ConnEvent::LoginFailed { .. }
        | ConnEvent::Closed { .. } => {}
    }
}

/// Opens the core session of a normal session that logged in: the I_T
/// nexus names the initiator port `initiator,i,0x<ISID>` (RFC 7143
/// §4.4.1's SCSI initiator port name) and the session reports events
/// (Async Messages), whichever transport carries it. `port` is the
/// relative target port identifier and the portal group tag, which names
/// the target port `target,t,0x<TPGT>`.
pub fn open_nexus(
    now: Instant,
    shard: &mut Shard,
    initiator: &str,
    isid: [u8; 6],
    target: &str,
    port: (u16, u16),
    luns: &Arc<LunMap>,
) -> SessionId {
    let isid_hex: String = isid.iter().map(|b| format!("{b:02x}")).collect();
    let nexus = Nexus {
        initiator_port: format!("{initiator},i,0x{isid_hex}"),
        initiator: initiator.to_string(),
        target: target.to_string(),
        rel_port_id: port.0,
        target_port: format!("{target},t,0x{:04x}", port.1),
        protocol: Some(ferrite_scsi::inquiry::protocol::ISCSI),
    };
    shard.open_session(now, nexus, luns.clone(), true)
}

/// Completes towards the core an action whose connection is gone: the
/// response slot is freed, write data will never come.
pub fn complete_orphan(s: &mut ferrite_core::shard::Session<'_>, a: Action) {
    match a {
        Action::Respond { id, .. } => s.response_sent(id),
        Action::FetchData { id, .. } => s.data_out_done(id, Err(Abort::ConnectionLost)),
        // Holds die with their connection: nothing to confirm.
        Action::TmfDone { .. } | Action::Aen { .. } | Action::Close | Action::ConfirmDelivery => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    #[test]
    fn the_watch_sees_the_initiator_drop_its_connection_unless_retired() {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind");
        let ini = TcpStream::connect(l.local_addr().expect("addr")).expect("connect");
        let (tgt, _) = l.accept().expect("accept");
        let w = TcpWatch {
            sock: tgt.try_clone().expect("clone"),
            retired: AtomicBool::new(false),
        };
        assert!(!w.gone());
        drop(ini);
        // Wait for the FIN on the target's own descriptor without reading it.
        let mut b = [0u8; 1];
        assert_eq!(tgt.peek(&mut b).expect("peek"), 0);
        assert!(w.gone());
        w.retired.store(true, Ordering::Release);
        assert!(!w.gone());
    }
}
