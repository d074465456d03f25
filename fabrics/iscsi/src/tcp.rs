//! The TCP driver: runs one sans-IO [`Conn`] over a socket on a reactor.
//!
//! Only this file touches sockets. It feeds received bytes to the `Conn`,
//! hands the `Conn`'s events to the core's [`Session`](ferrite_core::Session),
//! hands the session's actions back to the `Conn`, and sends what the `Conn`
//! queues. Every RFC rule lives in the `Conn`; nothing here depends on one.

use std::collections::VecDeque;
use std::mem;
use std::net::{SocketAddr, TcpStream};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::Arc;
use std::time::Instant;

use ferrite_core::device::LunMap;
use ferrite_core::shard::{Nexus, ResetScope, SessionId, Shard};
use ferrite_core::{TaskTag, TmfFunction};
use ferrite_reactor::ring::{Ctx, TxSeg, advance};

use crate::conn::{Conn, ConnEvent, IscsiConfig, TxQueue};
use crate::pdu::LoginStatus;

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
}

/// What the portal grants a login.
#[derive(Debug)]
pub struct Grant {
    pub tsih: u16,
    /// The LUN map of a normal session (None for discovery).
    pub luns: Option<Arc<LunMap>>,
    /// Relative target port identifier of the target.
    pub rel_port_id: u16,
}

/// The daemon side of logins: target lookup, ACLs, TSIH allocation.
pub trait Portal {
    fn session_request(&self, req: &SessionRequest<'_>) -> Result<Grant, LoginStatus>;
    fn session_closed(&self, tsih: u16);
    /// A login from `peer` failed authentication or authorization; the
    /// answer is how long to hold the failure response back (a per-address
    /// backoff against guessing).
    fn login_failed(
        &self,
        _peer: SocketAddr,
        _initiator: Option<&str>,
        _status: LoginStatus,
    ) -> std::time::Duration {
        std::time::Duration::ZERO
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
    /// Bytes waiting to be sent (not yet handed to the ring).
    tx: VecDeque<TxSeg>,
    txq: TxQueue,
    sending: bool,
    session: Option<SessionId>,
    /// The login being decided: initiator, isid, target, grant.
    pending: Option<(String, [u8; 6], Option<String>, Grant)>,
    tsih: Option<u16>,
    /// Target, initiator and LUN map of the normal session, once logged in.
    nexus: Option<(String, String, Arc<LunMap>)>,
    closing: bool,
    /// LU and target resets that other cores must carry out too: the
    /// worker takes them ([`TcpConn::take_remote_resets`]) and sends them.
    remote_resets: Vec<(TaskTag, ResetScope)>,
    /// TMF responses held until every other core reported its part of the
    /// reset drained (SAM-5 §7.11: the response follows the last affected
    /// task), with the response once the local part is done.
    held_tmfs: Vec<(TaskTag, Option<ferrite_core::Action>)>,
    shut: bool,
    /// Nothing is sent before this instant (backoff after a failed login).
    hold_tx: Option<Instant>,
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
            tx: VecDeque::new(),
            txq: TxQueue::default(),
            sending: false,
            session: None,
            pending: None,
            tsih: None,
            nexus: None,
            closing: false,
            remote_resets: Vec::new(),
            held_tmfs: Vec::new(),
            shut: false,
            hold_tx: None,
        })
    }

    fn fd(&self) -> RawFd {
        self.sock.as_raw_fd()
    }

    /// The peer's address.
    pub fn peer(&self) -> SocketAddr {
        self.peer
    }

    /// The core session of this connection, once logged in.
    pub fn session(&self) -> Option<SessionId> {
        self.session
    }

    /// Resets this connection's initiator started that other cores must
    /// apply; the TMF response is held until [`TcpConn::release_tmf`].
    pub fn take_remote_resets(&mut self) -> Vec<(TaskTag, ResetScope)> {
        std::mem::take(&mut self.remote_resets)
    }

    /// Every other core drained its part of the reset with this tag: the
    /// response goes out once the local part is done too.
    pub fn release_tmf(
        &mut self,
        ctx: &mut Ctx,
        key: u64,
        tag: TaskTag,
        shard: &mut Shard,
        portal: &dyn Portal,
    ) {
        if let Some(pos) = self.held_tmfs.iter().position(|(t, _)| *t == tag) {
            let (_, done) = self.held_tmfs.remove(pos);
            if let Some(a) = done {
                self.conn.handle_action(ctx.now(), a);
            }
            self.pump(ctx, key, shard, portal);
        }
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
            ctx.recv(self.fd(), buf, self.rx_len, key << 8 | TOKEN_RECV);
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
        self.rx_len += n;
        if self.rx_len == buf.len() && buf.len() < RX_BUF {
            // The socket had at least a buffer's worth: read larger pieces.
            buf.resize((buf.len() * 2).min(RX_BUF), 0);
        }
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
        self.arm_recv(ctx, key);
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
            while let Some(ev) = self.conn.poll_event() {
                progress = true;
                self.on_event(now, ev, shard, portal);
            }
            if let Some(sid) = self.session
                && let Some(mut s) = shard.session(sid)
            {
                while let Some(a) = s.poll_action() {
                    progress = true;
                    if let ferrite_core::Action::TmfDone { tag, .. } = &a
                        && let Some(h) = self.held_tmfs.iter_mut().find(|(t, _)| t == tag)
                    {
                        h.1 = Some(a);
                        continue;
                    }
                    self.conn.handle_action(now, a);
                }
            }
            if !progress {
                break;
            }
        }
        if self.conn.is_closed() && !self.closing {
            self.begin_close(now, shard, portal);
        }
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
                };
                match portal.session_request(&req) {
                    Ok(grant) => {
                        tracing::info!(peer = %self.peer, initiator = %initiator,
                            target = target.as_deref().unwrap_or("(discovery)"), tsih = grant.tsih, "login");
                        self.tsih = Some(grant.tsih);
                        self.conn.accept_session(grant.tsih);
                        self.pending = Some((initiator, isid, target, grant));
                    }
                    Err(status) => {
                        tracing::warn!(peer = %self.peer, initiator = %initiator,
                            target = target.as_deref().unwrap_or("(discovery)"),
                            class = status.class, detail = status.detail, "login refused");
                        self.conn.reject_session(status);
                    }
                }
            }
            ConnEvent::LoginFailed { initiator, status } => {
                let delay = portal.login_failed(self.peer, initiator.as_deref(), status);
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
                    let isid_hex: String = isid.iter().map(|b| format!("{b:02x}")).collect();
                    let nexus = Nexus {
                        initiator_port: format!("{initiator},i,0x{isid_hex}"),
                        initiator: initiator.clone(),
                        target: target.clone(),
                        rel_port_id: grant.rel_port_id,
                    };
                    self.session = Some(shard.open_session(now, nexus, luns.clone(), true));
                    self.nexus = Some((target, initiator, luns));
                }
            }
            ConnEvent::Command(req) => match self.session.and_then(|s| shard.session(s)) {
                Some(mut s) => {
                    s.submit(now, req);
                }
                None => {
                    tracing::warn!(peer = %self.peer, "command outside a normal session dropped")
                }
            },
            ConnEvent::DataOutDone { id, data } => {
                if let Some(mut s) = self.session.and_then(|s| shard.session(s)) {
                    s.data_out_done(id, data);
                }
            }
            ConnEvent::ResponseSent { id } => {
                if let Some(mut s) = self.session.and_then(|s| shard.session(s)) {
                    s.response_sent(id);
                }
            }
            ConnEvent::TaskMgmt(req) => {
                let scope = match req.func {
                    TmfFunction::LogicalUnitReset => self
                        .nexus
                        .as_ref()
                        .and_then(|(_, _, luns)| luns.get(req.lun))
                        .map(|e| ResetScope::LogicalUnit(e.device.id)),
                    TmfFunction::TargetReset => self
                        .nexus
                        .as_ref()
                        .map(|(t, _, _)| ResetScope::Target(t.clone())),
                    _ => None,
                };
                if let Some(scope) = scope {
                    self.remote_resets.push((req.tag, scope));
                    self.held_tmfs.push((req.tag, None));
                }
                if let Some(mut s) = self.session.and_then(|s| shard.session(s)) {
                    s.task_mgmt(now, req);
                }
            }
            ConnEvent::Closed { reason } => {
                tracing::info!(peer = %self.peer, ?reason, "connection closing");
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
        self.tx.extend(self.txq.segs.drain(..));
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
        let segs = mem::take(&mut self.tx);
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
                if let TxSeg::Bytes(b) = seg {
                    bytes.extend_from_slice(&b);
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
