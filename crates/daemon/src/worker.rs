//! The per-core worker: what runs on each reactor. It owns this core's shard
//! of the target core, the connections living on this core, and (on the core
//! that got them) the listening sockets, whose accepted connections are spread
//! over all cores round-robin.

use rustc_hash::FxHashMap;
use std::net::{TcpListener, TcpStream};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ferrite_core::shard::{SessionId, Shard, SpanningResetId};
use ferrite_iscsi::tcp::{SessionLink, TOKEN_RECV, TOKEN_SEND, TcpConn};
use ferrite_mgmt::config::LATENCY_BOUND_DEPTH;
use ferrite_reactor::buf::BufPool;
use ferrite_reactor::mailbox::MailboxTx;
use ferrite_reactor::ring::{Completion, Ctx, Worker};
use slab::Slab;

use crate::system::Snapshot;
use ferrite_iscsi::portal::{CorePortal, Registry};

/// The iSCSI portal view of a worker's core (`CorePortal`), built from
/// its fields so that the other fields stay free to borrow mutably.
macro_rules! core_portal {
    ($w:ident) => {
        CorePortal {
            targets: &$w.snapshot.iscsi_targets,
            iscsi: &$w.snapshot.iscsi,
            registry: &$w.registry,
            core: $w.core,
            links: &$w.links,
        }
    };
}

/// Token kind of a listener's accept.
const TOKEN_ACCEPT: u64 = 3;

/// Messages between cores and from the control thread.
pub enum Msg {
    /// An accepted connection to run on this core.
    NewConn(OwnedFd),
    /// A connection another core accepted whose login names a session of
    /// this core (MC/S), with the bytes it already received.
    AdoptConn { fd: OwnedFd, received: Vec<u8> },
    /// New configuration snapshot.
    Snapshot(Arc<Snapshot>),
    /// Start accepting on this listener (core 0).
    Listen(TcpListener),
    /// Stop accepting on this address (core 0).
    Unlisten(std::net::SocketAddr),
    /// Close the session with this TSIH if it lives here.
    CloseSession(u16),
    /// A TARGET COLD RESET of this target was answered: drop every iSCSI
    /// connection of it here (RFC 7143 §11.5.1).
    DropTarget(String),
    /// For this core's SRP fabric.
    Srp(crate::srp::SrpMsg),
    /// A connection request for this core's iSER part.
    Iser(crate::iser::IserMsg),
    /// PREEMPT AND ABORT on another core preempted these nexuses of this
    /// device: abort their commands here too (SPC-4 §5.13.11.2.4).
    AbortPreempted(
        ferrite_core::device::DeviceId,
        Vec<ferrite_core::pr::PrNexus>,
    ),
    /// Apply a LU or target reset started on core `origin`; answer with
    /// `ResetDrained { token }` once its aborted tasks are gone.
    RemoteReset {
        scope: ferrite_core::shard::ResetScope,
        origin: usize,
        token: SpanningResetId,
    },
    /// A core finished its part of reset `token`.
    ResetDrained { token: SpanningResetId },
    /// Publish this core's counters now, answering this question of the
    /// stats board ([`crate::stats::StatsBoard::ask`]).
    PublishStats(u64),
    /// Close every connection and stop.
    Stop,
}

/// A seed nobody can predict (CHAP challenges derive from it): the
/// process's randomly keyed SipHash over the time.
fn random_seed() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    h.finish()
}

pub struct CoreWorker {
    core: usize,
    shard: Shard,
    conns: Slab<TcpConn>,
    by_session: FxHashMap<SessionId, usize>,
    /// Listening sockets by index (the index is in the accept token); a
    /// closed one leaves a hole so indexes stay stable.
    listeners: Vec<Option<TcpListener>>,
    closing_listeners: Vec<usize>,
    started: bool,
    peers: Vec<MailboxTx<Msg>>,
    rr: usize,
    snapshot: Arc<Snapshot>,
    registry: Arc<Registry>,
    stopping: bool,
    ready: Vec<SessionId>,
    next_timer: Option<Instant>,
    seed: u64,
    srp: crate::srp::SrpCore,
    iser: crate::iser::IserCore,
    /// Where this core publishes its counters, and when it next does.
    stats_board: Option<Arc<crate::stats::StatsBoard>>,
    next_stats: Option<Instant>,
    /// Work happened since the counters were last published.
    stats_dirty: bool,
    /// Resets a session here received that the other cores apply: how many
    /// cores are still to report theirs drained.
    pending_resets: FxHashMap<SpanningResetId, usize>,
    /// Resets other cores started, applied here: who to tell when drained.
    remote_resets: FxHashMap<ferrite_core::shard::RemoteResetId, (usize, SpanningResetId)>,
    /// Scratch for the spanning resets taken from the shard.
    spanning: Vec<(SpanningResetId, ferrite_core::shard::ResetScope)>,
    /// Normal sessions running here, by TSIH, and the connections (slab
    /// keys) of each: MC/S joins and pumping a session's connections together.
    links: FxHashMap<u16, SessionLink>,
    groups: FxHashMap<u16, Vec<usize>>,
    /// How deep the initiators on this core queue their commands.
    depth: DepthWatch,
    /// Connections a poll pumped (kept for its allocation).
    touched: Vec<usize>,
    /// Connections whose next receive waits for the end of the poll pass
    /// ([`TcpConn::arm_deferred_recv`]).
    rx_later: Vec<usize>,
}

/// The deepest initiator queue seen on a core over the last few
/// milliseconds (from [`TcpConn::take_depth_peak`]). While it stays at
/// [`LATENCY_BOUND_DEPTH`] or below, every command waits for its answer
/// before the next is sent, and a reactor that slept between them would
/// add a thread wake-up to each: the reactor polls a while instead. Deeper
/// queues batch their responses, and the reactor sleeps at once.
#[derive(Debug, Default)]
struct DepthWatch {
    epoch: Option<Instant>,
    cur: u32,
    prev: u32,
}

/// The window over which [`DepthWatch`] keeps a peak.
const DEPTH_EPOCH: Duration = Duration::from_millis(2);

impl DepthWatch {
    fn note(&mut self, now: Instant, depth: u32) {
        match self.epoch {
            Some(e) if now.saturating_duration_since(e) < DEPTH_EPOCH => {}
            Some(e) => {
                self.prev = if now.saturating_duration_since(e) < 2 * DEPTH_EPOCH {
                    self.cur
                } else {
                    0
                };
                self.cur = 0;
                self.epoch = Some(now);
            }
            None => self.epoch = Some(now),
        }
        self.cur = self.cur.max(depth);
    }

    fn latency_bound(&self, now: Instant) -> bool {
        let Some(e) = self.epoch else {
            return false;
        };
        if now.saturating_duration_since(e) >= 2 * DEPTH_EPOCH {
            return false;
        }
        let peak = self.cur.max(self.prev);
        (1..=LATENCY_BOUND_DEPTH).contains(&peak)
    }
}

impl CoreWorker {
    pub fn new(
        core: usize,
        listeners: Vec<TcpListener>,
        peers: Vec<MailboxTx<Msg>>,
        snapshot: Arc<Snapshot>,
        registry: Arc<Registry>,
    ) -> CoreWorker {
        let mut shard = Shard::new(core, BufPool::new(256 * 1024, 1024));
        shard.set_other_cores(peers.len().saturating_sub(1));
        CoreWorker {
            core,
            shard,
            conns: Slab::new(),
            by_session: FxHashMap::default(),
            listeners: listeners.into_iter().map(Some).collect(),
            closing_listeners: Vec::new(),
            started: false,
            peers,
            rr: core,
            snapshot,
            registry,
            stopping: false,
            ready: Vec::new(),
            next_timer: None,
            seed: random_seed() ^ (core as u64),
            srp: crate::srp::SrpCore::new(core),
            iser: crate::iser::IserCore::new(core, random_seed() ^ (core as u64) << 32),
            stats_board: None,
            next_stats: None,
            stats_dirty: false,
            pending_resets: FxHashMap::default(),
            remote_resets: FxHashMap::default(),
            spanning: Vec::new(),
            links: FxHashMap::default(),
            groups: FxHashMap::default(),
            depth: DepthWatch::default(),
            touched: Vec::new(),
            rx_later: Vec::new(),
        }
    }

    /// Publishes this core's counters to `board` about once a second.
    /// Makes this core's shard draw its data buffers from `budget`.
    pub fn with_budget(mut self, budget: Arc<ferrite_core::budget::DataBudget>) -> CoreWorker {
        self.shard.set_budget(budget);
        self
    }

    pub fn with_stats(mut self, board: Arc<crate::stats::StatsBoard>) -> CoreWorker {
        self.stats_board = Some(board);
        self
    }

    /// Carries the resets the shard's sessions received, on any fabric, to
    /// every other core (SAM-5 §6.3); the shard holds each TMF response
    /// until all of them drained.
    fn forward_spanning_resets(&mut self) {
        self.shard.take_spanning_resets(&mut self.spanning);
        for (token, scope) in std::mem::take(&mut self.spanning) {
            let mut others = 0;
            for (core, peer) in self.peers.iter().enumerate() {
                if core == self.core {
                    continue;
                }
                let msg = Msg::RemoteReset {
                    scope: scope.clone(),
                    origin: self.core,
                    token,
                };
                // A core that is gone holds no task.
                if peer.send(msg).is_ok() {
                    others += 1;
                }
            }
            if others == 0 {
                self.shard.spanning_reset_drained(token);
            } else {
                self.pending_resets.insert(token, others);
            }
        }
    }

    /// One more core finished its part of reset `token`; the last one
    /// releases the TMF response.
    fn reset_drained(&mut self, token: SpanningResetId) {
        let Some(left) = self.pending_resets.get_mut(&token) else {
            return;
        };
        *left = left.saturating_sub(1);
        if *left == 0 {
            self.pending_resets.remove(&token);
            self.shard.spanning_reset_drained(token);
        }
    }

    /// Reports drained remote resets to the cores that started them.
    fn forward_drained_resets(&mut self) {
        let mut ids = Vec::new();
        self.shard.drained_resets(&mut ids);
        for id in ids {
            if let Some((origin, token)) = self.remote_resets.remove(&id) {
                if origin == self.core {
                    self.reset_drained(token);
                } else if let Some(p) = self.peers.get(origin) {
                    let _ = p.send(Msg::ResetDrained { token });
                }
            }
        }
    }

    /// Carries PREEMPT AND ABORT to the other cores: the sessions of the
    /// preempted nexuses may live anywhere.
    fn forward_preempted(&mut self) {
        let mut v = Vec::new();
        self.shard.drain_preempted(&mut v);
        for (dev, nexuses) in v {
            for (core, peer) in self.peers.iter().enumerate() {
                if core != self.core
                    && peer
                        .send(Msg::AbortPreempted(dev, nexuses.clone()))
                        .is_err()
                {
                    tracing::warn!(
                        core,
                        "core mailbox closed: preempted commands not aborted there"
                    );
                }
            }
        }
    }

    /// Publishes the counters when a second passed since the last time and
    /// work happened since.
    fn publish_stats(&mut self, now: Instant) {
        if !self.stats_dirty || self.next_stats.is_some_and(|t| now < t) {
            return;
        }
        self.publish_stats_now(now, 0);
    }

    /// Publishes the counters as they are, answering `question` (0: none).
    fn publish_stats_now(&mut self, now: Instant, question: u64) {
        let Some(board) = &self.stats_board else {
            return;
        };
        self.stats_dirty = false;
        self.next_stats = Some(now + std::time::Duration::from_secs(1));
        let st = self.shard.stats();
        let mut sessions = std::collections::BTreeMap::new();
        for (sid, io) in st.sessions {
            if let Some(c) = self.by_session.get(&sid).and_then(|k| self.conns.get(*k))
                && let (Some(tsih), Some((target, _, _))) = (c.tsih(), c.nexus())
            {
                sessions.insert(tsih, (target.to_string(), io));
            }
        }
        board.publish(self.core, st.devices, sessions, question);
    }

    /// Gives this core the SRP target ports to accept logins on.
    pub fn with_srp_ports(mut self, ports: Vec<crate::srp::SrpPort>) -> CoreWorker {
        self.srp.set_ports(ports);
        self
    }

    /// Gives this core the iSER portals to accept connections on.
    pub fn with_iser_portals(mut self, portals: Vec<crate::iser::IserPortal>) -> CoreWorker {
        self.iser.set_portals(portals);
        self
    }

    fn add_conn(&mut self, ctx: &mut Ctx, fd: OwnedFd, received: Option<Vec<u8>>) {
        if self.stopping {
            return;
        }
        let sock = TcpStream::from(fd);
        self.seed = self.seed.wrapping_mul(6364136223846793005).wrapping_add(1);
        let adopted = received.is_some();
        let made = match received {
            None => TcpConn::new(ctx.now(), sock, self.snapshot.iscsi.clone(), self.seed),
            Some(bytes) => TcpConn::adopt(
                ctx.now(),
                sock,
                self.snapshot.iscsi.clone(),
                self.seed,
                bytes,
            ),
        };
        match made {
            Ok(c) => {
                tracing::debug!(core = self.core, peer = %c.peer(), adopted, "connection");
                let key = self.conns.insert(c);
                let portal = core_portal!(self);
                if let Some(c) = self.conns.get_mut(key) {
                    if adopted {
                        c.start_adopted(ctx, key as u64, &mut self.shard, &portal);
                        self.rx_later.push(key);
                    } else {
                        c.start(ctx, key as u64);
                    }
                }
                if adopted {
                    self.after_conn(ctx, key);
                }
            }
            Err(e) => tracing::warn!(error = %e, "accepted socket unusable"),
        }
    }

    /// Moves a connection whose login names a session of another core
    /// there (all connections of a session run on the session's core).
    fn hand_off(&mut self, key: usize, tsih: u16) {
        let c = self.conns.remove(key);
        let owner = self.registry.owner(tsih);
        let (fd, received) = c.into_handoff();
        // No owner any more (the session ended meanwhile): the connection
        // stays here, through this core's own mailbox, and its login is
        // answered 020Ah.
        let core = owner.filter(|o| *o < self.peers.len()).unwrap_or(self.core);
        tracing::debug!(
            from = self.core,
            to = core,
            tsih,
            "connection moved to its session's core"
        );
        match self.peers.get(core) {
            Some(p) if p.send(Msg::AdoptConn { fd, received }).is_ok() => {}
            _ => tracing::warn!(core, "core mailbox closed: connection dropped"),
        }
    }

    /// A new configuration: sessions whose LUN map changed get the new map
    /// (the core raises the unit attentions); sessions of a disabled target
    /// are asked to log out (RFC 7143 §11.9.1 AsyncEvent 1, dropped if they
    /// do not in time), sessions of a removed target are dropped at once
    /// (AsyncEvent 3).
    fn apply_snapshot(&mut self, ctx: &mut Ctx) {
        let portal = core_portal!(self);
        let now = ctx.now();
        let mut touched = Vec::new();
        for (key, c) in self.conns.iter_mut() {
            let Some((target, initiator, luns)) = c.nexus() else {
                continue;
            };
            let portal_gone = || {
                self.snapshot
                    .iscsi
                    .targets
                    .iter()
                    .find(|t| t.name == *target)
                    .is_some_and(|t| !t.reachable_at(c.local()))
            };
            match self.snapshot.iscsi_targets.get(target) {
                Some(t) if t.enabled && portal_gone() => {
                    // The portal the connection came in on was taken from
                    // the target: its sessions there end, as they do when
                    // the target goes (AsyncEvent 3, then the close); the
                    // initiator's logins there now get 0301 until the
                    // portal is back.
                    tracing::info!(target, peer = %c.peer(), portal = %c.local(),
                        "portal removed from the target: closing its session there");
                    c.close_with_notice(now, &mut self.shard, &portal);
                    touched.push(key);
                }
                Some(t) if t.enabled => {
                    let new = t.map_for(initiator);
                    if !Arc::ptr_eq(&new, luns) {
                        c.set_luns(&mut self.shard, new);
                    }
                }
                Some(_) => {
                    tracing::info!(target, peer = %c.peer(), "target disabled: requesting a logout");
                    c.request_logout(now);
                    touched.push(key);
                }
                None => {
                    tracing::info!(target, peer = %c.peer(), "target removed: closing its session");
                    c.close_with_notice(now, &mut self.shard, &portal);
                    touched.push(key);
                }
            }
        }
        for key in touched {
            self.after_conn(ctx, key);
        }
    }

    /// Closes every iSCSI connection of this core that `which` picks.
    fn close_where(&mut self, ctx: &mut Ctx, why: &str, which: impl Fn(&TcpConn) -> bool) {
        let portal = core_portal!(self);
        let now = ctx.now();
        let mut touched = Vec::new();
        for (key, c) in self.conns.iter_mut() {
            if which(c) {
                tracing::info!(peer = %c.peer(), tsih = ?c.tsih(), "{why}");
                c.close(now, &mut self.shard, &portal);
                touched.push(key);
            }
        }
        for key in touched {
            self.after_conn(ctx, key);
        }
    }

    /// Bookkeeping after a connection did work: a move to another core,
    /// cross-core resets, session membership, removal once finished; then
    /// the other connections of its session get their share (MC/S).
    fn after_conn(&mut self, ctx: &mut Ctx, key: usize) {
        if let Some(tsih) = self.conns.get(key).and_then(|c| c.handoff()) {
            self.hand_off(key, tsih);
            return;
        }
        // Taken first: settling may remove a finished connection.
        let link = self.conns.get(key).and_then(|c| c.link().cloned());
        self.settle(key);
        if let Some(link) = link {
            self.pump_group(ctx, &link);
        }
    }

    /// Pumps the connections of `key`'s session until none leaves work for
    /// another: actions polled by one for another, CmdSN gaps one filled for
    /// another; closes them all once the session ended (RFC 7143 §6.3.6: at
    /// ERL 0 a failed connection fails the session), and the ones replaced
    /// by connection reinstatement.
    fn pump_group(&mut self, ctx: &mut Ctx, link: &SessionLink) {
        let tsih = link.borrow().tsih();
        if !self.links.get(&tsih).is_some_and(|l| Rc::ptr_eq(l, link)) {
            return;
        }
        let Some(keys) = self.groups.get(&tsih) else {
            return;
        };
        // The common case, one connection per session, costs no more.
        if keys.is_empty() || (keys.len() == 1 && !link.borrow().ended()) {
            return;
        }
        let keys = keys.clone();
        let portal = core_portal!(self);
        let now = ctx.now();
        // Bounded: each round either settles or moves work along.
        for _ in 0..64 {
            let before = link.borrow().generation();
            let ended = link.borrow().ended();
            let kicked = link.borrow_mut().take_kicked();
            let logouts = link.borrow_mut().take_logouts();
            let aborts = link.borrow_mut().take_aborts();
            let finished = link.borrow_mut().take_finished();
            for &k in &keys {
                let Some(c) = self.conns.get_mut(k) else {
                    continue;
                };
                if !c.link().is_some_and(|l| Rc::ptr_eq(l, link)) {
                    continue;
                }
                if ended {
                    if !c.is_closing() {
                        tracing::info!(tsih, peer = %c.peer(), "session failed: closing its other connections");
                        c.close(now, &mut self.shard, &portal);
                    }
                } else if kicked.contains(&c.member()) {
                    c.kick(now, &mut self.shard, &portal, false);
                } else if logouts.contains(&c.member()) {
                    c.kick(now, &mut self.shard, &portal, true);
                } else {
                    for (origin, scope) in &aborts {
                        c.abort_data(*origin, *scope);
                    }
                    for (origin, scope) in &finished {
                        c.forget_aborted(*origin, *scope);
                    }
                    c.pump(ctx, k as u64, &mut self.shard, &portal);
                }
            }
            if link.borrow().generation() == before && link.borrow().ended() == ended {
                break;
            }
        }
        for k in keys {
            self.settle(k);
        }
    }

    fn settle(&mut self, key: usize) {
        // RFC 7143 §11.5.1: after a TARGET COLD RESET response the target
        // drops every connection of the target, on every core.
        if let Some(target) = self.conns.get_mut(key).and_then(|c| c.take_cold_reset()) {
            for peer in &self.peers {
                let _ = peer.send(Msg::DropTarget(target.clone()));
            }
        }
        let Some(c) = self.conns.get(key) else {
            return;
        };
        if let Some(sid) = c.session() {
            self.by_session.insert(sid, key);
        }
        if let Some(link) = c.link() {
            let tsih = link.borrow().tsih();
            match self.links.get(&tsih) {
                Some(l) if Rc::ptr_eq(l, link) => {
                    let keys = self.groups.entry(tsih).or_default();
                    if !keys.contains(&key) {
                        keys.push(key);
                    }
                }
                // A TSIH reused after its old session ended: the new one.
                Some(l) if !l.borrow().ended() && !link.borrow().ended() => {}
                _ if !link.borrow().ended() => {
                    self.links.insert(tsih, link.clone());
                    self.groups.insert(tsih, vec![key]);
                }
                _ => {}
            }
        }
        if c.is_finished() {
            let c = self.conns.remove(key);
            self.by_session.retain(|_, k| *k != key);
            if let Some(link) = c.link() {
                let tsih = link.borrow().tsih();
                if self.links.get(&tsih).is_some_and(|l| Rc::ptr_eq(l, link)) {
                    let empty = self.groups.get_mut(&tsih).is_none_or(|keys| {
                        keys.retain(|k| *k != key);
                        keys.is_empty()
                    });
                    if empty {
                        self.links.remove(&tsih);
                        self.groups.remove(&tsih);
                    }
                }
            }
            tracing::debug!(core = self.core, peer = %c.peer(), "connection finished");
        }
    }
}

impl Worker for CoreWorker {
    type Msg = Msg;

    fn on_completion(&mut self, ctx: &mut Ctx, c: Completion) {
        self.stats_dirty = true;
        let portal = core_portal!(self);
        match c {
            Completion::Accept { token, result } => {
                let idx = (token >> 8) as usize;
                match result {
                    Ok(fd) => {
                        let n = self.peers.len().max(1);
                        let target = self.rr % n;
                        self.rr = self.rr.wrapping_add(1);
                        if target == self.core || self.peers.is_empty() {
                            self.add_conn(ctx, fd, None);
                        } else if let Err(e) = self.peers[target].send(Msg::NewConn(fd)) {
                            tracing::warn!(error = %e, "core mailbox closed; connection dropped");
                        }
                    }
                    Err(e) if e.raw_os_error() == Some(libc::ECANCELED) => {}
                    Err(e) => tracing::warn!(error = %e, "accept failed"),
                }
                if let Some(pos) = self.closing_listeners.iter().position(|&i| i == idx) {
                    self.closing_listeners.swap_remove(pos);
                    if let Some(slot) = self.listeners.get_mut(idx) {
                        *slot = None;
                    }
                } else if !self.stopping
                    && let Some(Some(l)) = self.listeners.get(idx)
                {
                    ctx.accept(l.as_raw_fd(), (idx as u64) << 8 | TOKEN_ACCEPT);
                }
            }
            Completion::Recv {
                token, result, buf, ..
            } if token & 0xff == TOKEN_RECV => {
                let key = (token >> 8) as usize;
                if let Some(conn) = self.conns.get_mut(key) {
                    conn.on_recv(ctx, key as u64, result, buf, &mut self.shard, &portal);
                    self.rx_later.push(key);
                    let depth = conn.take_depth_peak();
                    if depth > 0 {
                        self.depth.note(ctx.now(), depth);
                    }
                }
                self.after_conn(ctx, key);
            }
            Completion::Send {
                token,
                result,
                segs,
            } if token & 0xff == TOKEN_SEND => {
                let key = (token >> 8) as usize;
                if let Some(conn) = self.conns.get_mut(key) {
                    conn.on_send(ctx, key as u64, result, segs, &mut self.shard, &portal);
                }
                self.after_conn(ctx, key);
            }
            other => tracing::debug!(?other, "unexpected completion"),
        }
    }

    fn on_message(&mut self, ctx: &mut Ctx, msg: Msg) {
        match msg {
            Msg::NewConn(fd) => self.add_conn(ctx, fd, None),
            Msg::AdoptConn { fd, received } => self.add_conn(ctx, fd, Some(received)),
            Msg::Snapshot(s) => {
                self.snapshot = s;
                self.apply_snapshot(ctx);
                self.srp
                    .apply_snapshot(&mut self.shard, &self.snapshot.srp_targets);
                self.iser.apply_snapshot(
                    ctx.now(),
                    &mut self.shard,
                    &self.snapshot.iscsi_targets,
                    &self.snapshot.iscsi,
                );
            }
            Msg::Iser(crate::iser::IserMsg::Incoming(req)) => {
                let now = ctx.now();
                self.iser.incoming(now, &self.snapshot.iscsi, req);
            }
            Msg::Srp(crate::srp::SrpMsg::Incoming { port, req }) => {
                let now = ctx.now();
                self.srp
                    .incoming(now, &mut self.shard, &self.snapshot.srp_targets, &port, req);
            }
            Msg::Listen(l) => {
                let idx = self.listeners.len();
                ctx.accept(l.as_raw_fd(), (idx as u64) << 8 | TOKEN_ACCEPT);
                self.listeners.push(Some(l));
            }
            Msg::Unlisten(addr) => {
                for (idx, slot) in self.listeners.iter_mut().enumerate() {
                    if slot
                        .as_ref()
                        .and_then(|l| l.local_addr().ok())
                        .is_some_and(|a| a == addr)
                    {
                        ctx.cancel(|t| t == (idx as u64) << 8 | TOKEN_ACCEPT);
                        // Dropped once the cancelled accept completes.
                        self.closing_listeners.push(idx);
                    }
                }
            }
            Msg::RemoteReset {
                scope,
                origin,
                token,
            } => {
                let id = self.shard.remote_reset(ctx.now(), scope);
                self.remote_resets.insert(id, (origin, token));
            }
            Msg::ResetDrained { token } => self.reset_drained(token),
            Msg::PublishStats(question) => self.publish_stats_now(ctx.now(), question),
            Msg::AbortPreempted(dev, nexuses) => {
                self.shard.abort_preempted(dev, &nexuses);
            }
            Msg::CloseSession(tsih) => {
                self.close_where(ctx, "closing session on request", |c| {
                    c.tsih() == Some(tsih)
                });
                let portal = core_portal!(self);
                self.iser
                    .close_session(ctx.now(), &mut self.shard, &portal, tsih);
            }
            Msg::DropTarget(target) => {
                self.close_where(ctx, "target cold reset: dropping the connection", |c| {
                    !c.is_closing() && c.nexus().is_some_and(|(t, _, _)| t == target)
                });
            }
            Msg::Stop => {
                self.stopping = true;
                self.srp.stop();
                let portal = core_portal!(self);
                let now = ctx.now();
                for (_, c) in self.conns.iter_mut() {
                    // RFC 7143 §11.9.1: the initiator learns why.
                    c.close_with_notice(now, &mut self.shard, &portal);
                }
                self.iser.stop(now, &mut self.shard, &portal);
                // Pending accepts are cancelled; the sockets close when the
                // worker is dropped.
                ctx.cancel(|t| t & 0xff == TOKEN_ACCEPT);
            }
        }
    }

    fn poll(&mut self, ctx: &mut Ctx) -> bool {
        let mut progress = false;
        if !self.started {
            self.started = true;
            for (i, l) in self.listeners.iter().enumerate() {
                if let Some(l) = l {
                    ctx.accept(l.as_raw_fd(), (i as u64) << 8 | TOKEN_ACCEPT);
                }
            }
            progress = true;
        }
        // A fresh clock reading (not the top of the loop's): backend
        // completions reaped now are timed from when they really finished.
        let now = Instant::now();
        if self.shard.poll(now) {
            progress = true;
        }
        self.forward_preempted();
        self.forward_spanning_resets();
        self.forward_drained_resets();
        self.ready.clear();
        self.shard.ready_sessions(&mut self.ready);
        let portal = core_portal!(self);
        // Sessions replaced by a reinstatement (decided on any core): every
        // core closes the ones it runs.
        for old in self.registry.take_reinstated() {
            for p in &self.peers {
                let _ = p.send(Msg::CloseSession(old));
            }
        }
        let mut touched = std::mem::take(&mut self.touched);
        touched.clear();
        for sid in &self.ready {
            if let Some(&key) = self.by_session.get(sid)
                && let Some(conn) = self.conns.get_mut(key)
            {
                progress = true;
                conn.pump(ctx, key as u64, &mut self.shard, &portal);
                touched.push(key);
            }
        }
        // Timers.
        if self.next_timer.is_some_and(|t| t <= now) {
            for (key, conn) in self.conns.iter_mut() {
                if conn.poll_timeout().is_some_and(|t| t <= now) {
                    conn.on_timer(ctx, key as u64, &mut self.shard, &portal);
                    touched.push(key);
                    progress = true;
                }
            }
        }
        for &key in &touched {
            self.after_conn(ctx, key);
        }
        self.touched = touched;
        // After the responses above were queued to be sent.
        for key in self.rx_later.drain(..) {
            if let Some(conn) = self.conns.get_mut(key) {
                conn.arm_deferred_recv(ctx, key as u64);
            }
        }
        progress |= self.srp.poll(
            now,
            &mut self.shard,
            &self.snapshot.srp_targets,
            &crate::srp::Peers(&self.peers),
        );
        let portal = core_portal!(self);
        progress |= self.iser.poll(
            now,
            &mut self.shard,
            &portal,
            &self.snapshot.iscsi,
            &crate::iser::Peers(&self.peers),
        );
        self.forward_spanning_resets();
        self.next_timer = self
            .conns
            .iter()
            .filter_map(|(_, c)| c.poll_timeout())
            .min();
        self.stats_dirty |= progress;
        self.publish_stats(now);
        progress
    }

    fn next_deadline(&self) -> Option<Instant> {
        // Counters not yet published are published on time even when idle.
        let stats = self.next_stats.filter(|_| self.stats_dirty);
        [
            self.next_timer,
            self.srp.next_deadline(),
            self.iser.next_deadline(),
            // A paced sanitize's next write.
            self.shard.next_deadline(),
            stats,
        ]
        .into_iter()
        .flatten()
        .min()
    }

    fn wants_spin(&self) -> bool {
        self.shard.wants_spin()
    }

    fn latency_bound(&self, now: Instant) -> bool {
        self.depth.latency_bound(now)
    }

    fn wake_fds(&self, out: &mut Vec<RawFd>) {
        self.shard.notify_fds(out);
        self.srp.wake_fds(out);
        self.iser.wake_fds(out);
    }

    fn running(&self) -> bool {
        !(self.stopping && self.conns.is_empty() && self.srp.is_empty() && self.iser.is_empty())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn depth_watch_polls_only_for_shallow_queues_seen_lately() {
        let t0 = Instant::now();
        let mut w = DepthWatch::default();
        assert!(!w.latency_bound(t0), "no command yet");
        w.note(t0, 1);
        assert!(w.latency_bound(t0));
        // A deep queue anywhere in the window turns polling off.
        w.note(t0 + Duration::from_micros(500), 32);
        assert!(!w.latency_bound(t0 + Duration::from_micros(600)));
        // It is remembered for one more window after it ends ...
        w.note(t0 + DEPTH_EPOCH, 1);
        assert!(!w.latency_bound(t0 + DEPTH_EPOCH));
        // ... and forgotten after that.
        w.note(t0 + 2 * DEPTH_EPOCH + Duration::from_micros(10), 1);
        w.note(t0 + 3 * DEPTH_EPOCH + Duration::from_micros(20), 2);
        assert!(w.latency_bound(t0 + 3 * DEPTH_EPOCH + Duration::from_micros(30)));
        // Silence for two windows: nothing to poll for.
        assert!(!w.latency_bound(t0 + 6 * DEPTH_EPOCH));
        // A long gap does not carry an old peak over.
        w.note(t0 + 7 * DEPTH_EPOCH, 40);
        w.note(t0 + 20 * DEPTH_EPOCH, 1);
        assert!(w.latency_bound(t0 + 20 * DEPTH_EPOCH));
    }
}
