//! One iSCSI connection's session layer, sans-IO (RFC 7143): received
//! PDUs in, core commands and actions in between, PDUs and task data out
//! through the connection's datamover ([`crate::datamover`]).
//!
//! The driver feeds received bytes to [`Conn::handle_input`], drains
//! [`Conn::poll_event`] (and calls the core session accordingly), hands core
//! actions to [`Conn::handle_action`], and writes what
//! [`Conn::poll_transmit`] queues. Time is an argument; nothing here touches a
//! socket or a clock.
//!
//! Here: login driving, CmdSN ordering, SCSI command and response
//! bookkeeping, the write data a task solicits (R2T offsets, lengths and
//! MaxOutstandingR2T, RFC 7143 §11.8; each solicitation is a
//! [`Datamover::get_data`]), which read data and status a response sends
//! ([`Datamover::put_data`]), and timers. `control.rs` holds the control
//! requests (NOP, text, logout, TMF, async messages); `framing.rs` is
//! iSCSI/TCP's receive path.
//!
//! Session-wide state (the CmdSN window, which connection owns which ITT)
//! lives in [`SessionSeq`], a handle the connections of one session share
//! (MC/S, RFC 7143 §4.2.2.1). Every connection of a session runs on the core
//! that owns the session, so the handle is an `Rc`, never crossing threads.

use rustc_hash::FxHashMap;
use std::collections::{BTreeMap, VecDeque};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ferrite_core::{
    Abort, Action, Cdb, CmdId, CmdRequest, DataDir, DeliveryHold, PipeData, Response, TaskAttr,
    TaskTag,
};
use ferrite_core::{TmfFunction, TmfRequest};
use ferrite_reactor::buf::{IoBuf, SgList};
use ferrite_scsi::{Lun, Status};

use crate::chap::{ChapAuth, ChapRng};
use crate::datamover::{Datamover, PutData, ReadData, Solicit, TcpDatamover};
use crate::keys::{Digest, Limits, Params, SessionType};
use crate::login::{Login, LoginReply, LoginStep};
use crate::pdu::{
    self, BHS_LEN, Bhs, CmdSn, DataSn, LoginStatus, Opcode, R2tSn, RESERVED_TAG, RejectReason, Sns,
    StatSn, flags,
};
pub use crate::session::{SessionSeq, TaskScope};

mod control;
use control::TextCont;
pub(crate) mod framing;

/// A target as this fabric exposes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IscsiTarget {
    pub name: String,
    pub alias: Option<String>,
    pub tpgt: u16,
    /// Portals announced by SendTargets; empty means the connection's local
    /// address. A wildcard address is replaced by the local address.
    pub portals: Vec<SocketAddr>,
    /// CHAP credentials of the target (RFC 7143 §12.1.3).
    pub auth: ChapAuth,
}

/// The fabric's configuration: targets, and what we offer in negotiation.
#[derive(Clone, Debug)]
pub struct IscsiConfig {
    pub targets: Vec<IscsiTarget>,
    pub max_recv_data_segment_length: u32,
    pub max_burst_length: u32,
    pub first_burst_length: u32,
    pub immediate_data: bool,
    pub initial_r2t: bool,
    pub max_outstanding_r2t: u32,
    pub max_connections: u16,
    pub nop_in_interval: Option<Duration>,
    pub nop_in_timeout: Duration,
    pub login_timeout: Duration,
    /// The longest a solicited burst may take: a connection whose oldest
    /// outstanding R2T is still unanswered after one scan period and the
    /// next is dropped (None: never).
    pub data_out_timeout: Option<Duration>,
    /// Commands the session may have outstanding: sets MaxCmdSN.
    pub queue_depth: u32,
    /// Digests accepted (header and data), in order of preference.
    pub digests: Vec<Digest>,
    /// DataDigest values accepted, if they differ from `digests` (which
    /// then holds the HeaderDigest list): RFC 7143 §13.1 negotiates the
    /// two keys separately.
    pub data_digests: Option<Vec<Digest>>,
    /// CHAP credentials of discovery sessions.
    pub discovery_auth: ChapAuth,
    /// CHAP users of initiator groups, which replace a target's incoming
    /// users for the initiators they match ([`IscsiConfig::target_auth`]).
    pub group_auth: Vec<GroupAuth>,
}

/// The CHAP users of one initiator group of a target (SCST-like
/// `IncomingUser` on a group).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GroupAuth {
    pub target: String,
    /// Initiator name patterns of the group (`*`, `?`), as its LUN map
    /// uses them.
    pub initiators: Vec<String>,
    pub incoming: Vec<crate::chap::ChapUser>,
}

impl Default for IscsiConfig {
    /// What LIO offers by default (MaxRecvDataSegmentLength 256 KiB here
    /// rather than 8 KiB, MaxBurstLength 1 MiB, FirstBurstLength 64 KiB,
    /// ImmediateData=Yes, InitialR2T=Yes as RFC 7143 §13.10 defaults).
    fn default() -> IscsiConfig {
        IscsiConfig {
            targets: Vec::new(),
            max_recv_data_segment_length: 256 * 1024,
            max_burst_length: 1024 * 1024,
            first_burst_length: 64 * 1024,
            immediate_data: true,
            initial_r2t: true,
            max_outstanding_r2t: 1,
            max_connections: 1,
            nop_in_interval: Some(Duration::from_secs(15)),
            nop_in_timeout: Duration::from_secs(30),
            login_timeout: Duration::from_secs(15),
            data_out_timeout: Some(Duration::from_secs(30)),
            queue_depth: 128,
            digests: vec![Digest::Crc32c, Digest::None],
            data_digests: None,
            discovery_auth: ChapAuth::default(),
            group_auth: Vec::new(),
        }
    }
}

impl IscsiTarget {
    /// Whether a connection that came in on `local` (the portal's address
    /// as the socket reports it) may reach this target: `local` is one of
    /// its portals, a wildcard portal (`0.0.0.0`, `[::]`) matching any
    /// address on its port. A target without portals is reachable on every
    /// portal, as SCST's target without `allowed_portal` is. The portals
    /// of the target's portal group are the ones it can be reached through
    /// (RFC 7143's portal groups); a dual-stack wildcard listener reports an
    /// IPv4 peer's local address as IPv4-mapped, so addresses are compared
    /// in canonical form.
    pub fn reachable_at(&self, local: SocketAddr) -> bool {
        let ip = local.ip().to_canonical();
        self.portals.is_empty()
            || self.portals.iter().any(|p| {
                p.port() == local.port() && (p.ip().is_unspecified() || p.ip().to_canonical() == ip)
            })
    }
}

impl IscsiConfig {
    /// The CHAP credentials a login from `initiator` to `target` must
    /// satisfy: the target's, with the incoming users of the first of its
    /// initiator groups with CHAP users whose patterns match `initiator`
    /// (the same first-match rule that picks the group's LUN map). `None`
    /// for an unknown target.
    pub fn target_auth(&self, target: &str, initiator: &str) -> Option<ChapAuth> {
        let t = self.targets.iter().find(|t| t.name == target)?;
        let mut auth = t.auth.clone();
        if let Some(g) = self.group_auth.iter().find(|g| {
            g.target == target
                && g.initiators
                    .iter()
                    .any(|p| ferrite_core::device::wildcard_match(p, initiator))
        }) {
            auth.incoming = g.incoming.clone();
        }
        Some(auth)
    }

    /// The largest data segment an RDMA connection receives in a Send
    /// (the most its TargetRecvDataSegmentLength may settle at): the
    /// MaxRecvDataSegmentLength, at most the FirstBurstLength, since only
    /// unsolicited data comes in Sends and the rest by RDMA READ. An iSER
    /// connection's receive buffers are this large, each of a window's
    /// worth, registered for the connection's life.
    pub fn rdma_recv_data_segment_length(&self) -> u32 {
        let l = self.limits();
        l.max_recv_data_segment_length.min(l.first_burst_length)
    }

    fn limits(&self) -> Limits {
        Limits {
            max_recv_data_segment_length: self
                .max_recv_data_segment_length
                .clamp(512, pdu::MAX_DATA_SEGMENT_LEN),
            max_burst_length: self.max_burst_length.clamp(512, pdu::MAX_DATA_SEGMENT_LEN),
            first_burst_length: self
                .first_burst_length
                .clamp(512, pdu::MAX_DATA_SEGMENT_LEN),
            immediate_data: self.immediate_data,
            initial_r2t: self.initial_r2t,
            max_outstanding_r2t: self.max_outstanding_r2t.max(1),
            max_connections: self.max_connections.max(1),
            digests: self.digests.clone(),
            data_digests: self.data_digests.clone(),
            ..Limits::default()
        }
    }
}

/// Why a connection ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CloseReason {
    /// The initiator logged out, closing the session (reason 0).
    Logout,
    /// The initiator logged this connection out (reason 1, RFC 7143
    /// §11.14.1): the other connections of the session go on.
    ConnectionLogout,
    /// A login with this connection's CID replaced it (connection
    /// reinstatement, RFC 7143 §6.3.4); the session goes on.
    Reinstated,
    /// The initiator broke the protocol in a way that ends the connection.
    ProtocolError,
    /// Header digest error (RFC 7143 §7.8: at ERL 0 the connection drops).
    HeaderDigest,
    /// Login refused (a login reject was sent).
    LoginFailed,
    /// The login did not complete in time.
    LoginTimeout,
    /// The initiator did not answer a NOP-In ping in time.
    NopTimeout,
    /// A solicited burst was not received in time
    /// ([`IscsiConfig::data_out_timeout`]).
    DataOutTimeout,
    /// TARGET COLD RESET.
    TargetReset,
    /// The core asked to end the nexus.
    CoreRequest,
    /// The peer closed the socket.
    PeerClosed,
}

/// What the connection asks of its driver.
#[derive(Debug)]
pub enum ConnEvent {
    /// Login reached the point of leaving the login phase: the driver checks
    /// the target, ACL, reinstatement, picks the TSIH, then calls
    /// [`Conn::accept_session`] or [`Conn::reject_session`]. Discovery
    /// sessions too (target = None).
    SessionRequest {
        initiator: String,
        isid: [u8; 6],
        tsih: u16,
        target: Option<String>,
        discovery: bool,
    },
    /// Full feature phase reached (normal session): open the core session.
    LoggedIn,
    /// The login failed authentication (0201) or authorization (0202): the
    /// driver tells the portal, which slows this address down.
    LoginFailed {
        initiator: Option<String>,
        status: LoginStatus,
    },
    /// `session.submit(now, req)`.
    Command(CmdRequest),
    /// `session.data_out_done(id, data)`.
    DataOutDone {
        id: CmdId,
        data: Result<SgList, Abort>,
    },
    /// `session.response_sent(id)`.
    ResponseSent { id: CmdId },
    /// `session.task_mgmt(now, req)`.
    TaskMgmt(TmfRequest),
    /// The connection ends: close the core session after flushing tx.
    Closed { reason: CloseReason },
}

/// Transmit queue: owned header bytes, and zero-copy references into a
/// response's buffers.
#[derive(Debug, Default)]
pub struct TxQueue {
    pub segs: VecDeque<TxSeg>,
}

/// One piece of outgoing bytes (the reactor's send segment, so the driver
/// hands the queue to the ring as is).
pub use ferrite_reactor::ring::TxSeg;

impl TxQueue {
    pub fn new() -> TxQueue {
        TxQueue::default()
    }
    /// Bytes queued.
    pub fn len(&self) -> usize {
        self.segs.iter().map(TxSeg::len).sum()
    }
    pub fn is_empty(&self) -> bool {
        self.segs.is_empty()
    }
    /// Copies everything queued into one vector and empties the queue
    /// (tests and the in-memory initiator).
    pub fn drain_to_vec(&mut self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.len());
        for s in self.segs.drain(..) {
            match &s {
                TxSeg::Data { sg, offset, len } => {
                    for sl in sg.slices(*offset, *len) {
                        out.extend_from_slice(sl);
                    }
                }
                TxSeg::Pipe { pipe, len } => {
                    if let Ok(mut p) = pipe.try_borrow_mut() {
                        let _ = p.read_to(&mut out, *len);
                    }
                }
                other => out.extend_from_slice(other.bytes().unwrap_or(&[])),
            }
        }
        out
    }
}

/// Lifecycle of the connection; it only moves forward.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// Login PDUs only.
    Login,
    /// Full feature phase.
    FullFeature,
    /// Closing: nothing more is read; pending tx is flushed.
    Closing,
}

/// An outstanding R2T (RFC 7143 §11.8).
#[derive(Debug)]
struct R2tState {
    ttt: u32,
    offset: u32,
    len: u32,
    /// Bytes announced by accepted Data-Out headers.
    announced: u32,
    /// Bytes received with good digests.
    got: u32,
    next_data_sn: DataSn,
}

/// Where the core wants write data.
#[derive(Debug)]
struct Fetch {
    id: CmdId,
    buf: SgList,
    /// Data offset of `buf[0]`.
    base: u32,
    offset: u32,
    len: u32,
    got: u32,
}

/// A SCSI command this connection knows.
#[derive(Debug)]
struct Task {
    lun_raw: [u8; 8],
    edtl: u32,
    /// Data-In the initiator expects (EDTL, or the Bidi read length).
    read_len: u32,
    dir: DataDir,
    /// Counted in `SessionSeq::in_flight`.
    counted: bool,
    /// Unsolicited bytes the initiator will send (immediate + Data-Out).
    unsol_expected: u32,
    /// Unsolicited bytes announced by accepted headers.
    unsol_announced: u32,
    /// Unsolicited bytes received intact (they sit in `unsol_buf`).
    unsol_got: u32,
    unsol_buf: Vec<u8>,
    unsol_next_data_sn: DataSn,
    unsol_done: bool,
    /// Write data went bad (digest or sequence error): the fetch fails.
    failed: bool,
    /// Handed to the core (in CmdSN order, or at once if immediate).
    submitted: bool,
    /// Submitted and then caught by a TMF (ABORT TASK, ..., a reset): the
    /// core ends it without a response, so the connection forgets it when
    /// the TMF is answered ([`Conn::forget_aborted`]).
    aborted: bool,
    fetch: Option<Fetch>,
    r2ts: Vec<R2tState>,
    next_r2t_offset: u32,
    r2t_end: u32,
    r2t_sn: R2tSn,
    /// The TTT of its oldest outstanding R2T at the last Data-Out scan.
    stall_mark: Option<u32>,
}

/// Where a Data-Out payload goes ([`Conn::data_out_header`]).
#[derive(Debug)]
pub enum DataOutPlace {
    /// Unsolicited data: appended to the task's `unsol_buf`.
    Unsolicited { itt: u32 },
    /// Solicited data: into the fetch buffer at data offset `pos`.
    Solicited { itt: u32, ttt: u32, pos: u32 },
    /// Dropped (no such task, or its data already failed).
    Discard,
}

/// A request held until the CmdSN gap before it fills.
#[derive(Debug)]
enum Held {
    Scsi(u32, CmdRequest),
    Pdu(Box<[u8; BHS_LEN]>, Vec<u8>),
    /// A rejected command whose CmdSN still counts.
    Skip,
}

/// The target side of one iSCSI connection: the session layer over a
/// datamover `D` ([`crate::datamover`]).
#[derive(Debug)]
pub struct Conn<D: Datamover = TcpDatamover> {
    cfg: Arc<IscsiConfig>,
    local: SocketAddr,
    peer: SocketAddr,
    phase: Phase,
    login: Login,
    params: Params,
    tsih: u16,
    seq: SessionSeq,
    seq_started: bool,
    /// This connection's id among the session's connections (0 for the
    /// leading one; the driver numbers the others, see [`Conn::join_session`]).
    member: u32,
    /// The session's operational parameters when this connection joined an
    /// existing session: its leading-only values replace ours at accept.
    lead: Option<Box<Params>>,
    stat_sn: StatSn,
    tasks: FxHashMap<u32, Task>,
    held: BTreeMap<u32, Held>,
    /// TMFs sent to the core: ITT -> function code and the tasks it aborts.
    tmfs: FxHashMap<u32, (u8, Option<TaskScope>)>,
    events: VecDeque<ConnEvent>,
    /// What carries this connection's PDUs and task data.
    dm: D,
    next_ttt: u32,
    last_rx: Instant,
    login_deadline: Instant,
    ping: Option<(u32, Instant)>,
    logout_deadline: Option<Instant>,
    /// When outstanding R2Ts are looked at next ([`IscsiConfig::data_out_timeout`]).
    data_scan: Option<Instant>,
    text_in: Vec<u8>,
    text_cont: Option<TextCont>,
    close_reason: Option<CloseReason>,
    /// The most commands the initiator had outstanding, as seen from here,
    /// since the driver last asked ([`Conn::take_depth_peak`]).
    depth_peak: u32,
    /// Responses whose data left as page-cache pages, oldest first: their
    /// StatSN, and the hold the core keeps until the initiator's ExpStatSN
    /// shows it has them.
    read_holds: VecDeque<(StatSn, DeliveryHold)>,
}

/// Requests held for CmdSN order at most (the window bounds it anyway).
const MAX_HELD: usize = 4096;

/// The bits of a random first StatSN that are kept (see [`Conn::new`]).
const STAT_SN_START_MASK: u32 = 0x0fff_ffff;

impl Conn<TcpDatamover> {
    /// An iSCSI/TCP connection that just came in on `local` from `peer`;
    /// `seed` seeds everything random on it (StatSN, TTTs, CHAP
    /// challenges).
    pub fn new(
        now: Instant,
        cfg: Arc<IscsiConfig>,
        local: SocketAddr,
        peer: SocketAddr,
        seed: u64,
    ) -> Conn {
        Conn::with_datamover(now, cfg, local, peer, seed, TcpDatamover::new(peer))
    }
}

impl<D: Datamover> Conn<D> {
    /// A connection whose PDUs and data `dm` carries.
    pub fn with_datamover(
        now: Instant,
        cfg: Arc<IscsiConfig>,
        local: SocketAddr,
        peer: SocketAddr,
        seed: u64,
        dm: D,
    ) -> Conn<D> {
        // One generator for everything random on this connection: SHA-256
        // in counter mode, so the StatSN and TTT an initiator sees reveal
        // nothing about the CHAP challenges drawn after them.
        let mut rng = ChapRng::new(seed);
        let data_scan = cfg.data_out_timeout.map(|d| later(now, d));
        let mut w = [0u8; 8];
        rng.fill(&mut w);
        // The first StatSN stays below 2^28: some initiators (libiscsi up
        // to at least 1.19) compare StatSN as a signed 32-bit number, and
        // one that starts at 2^31 or above never advances their ExpStatSN.
        // From below 2^28 it takes 1.8 billion responses to get there.
        let stat = StatSn(u32::from_le_bytes([w[0], w[1], w[2], w[3]]) & STAT_SN_START_MASK);
        let ttt = u32::from_le_bytes([w[4], w[5], w[6], w[7]]);
        let mut limits = cfg.limits();
        limits.rdma = dm.is_rdma();
        if limits.rdma {
            limits.max_recv_data_segment_length = cfg.rdma_recv_data_segment_length();
        }
        limits.max_outstanding_unexpected_pdus = dm.max_unexpected_pdus();
        let login = Login::with_rng(limits, cfg.clone(), rng);
        Conn {
            login_deadline: later(now, cfg.login_timeout),
            seq: SessionSeq::new(CmdSn(0), cfg.queue_depth),
            cfg,
            local,
            peer,
            phase: Phase::Login,
            login,
            params: Params::default(),
            tsih: 0,
            seq_started: false,
            member: 0,
            lead: None,
            stat_sn: stat,
            tasks: FxHashMap::default(),
            held: BTreeMap::new(),
            tmfs: FxHashMap::default(),
            events: VecDeque::new(),
            dm,
            next_ttt: ttt,
            last_rx: now,
            ping: None,
            logout_deadline: None,
            data_scan,
            text_in: Vec::new(),
            text_cont: None,
            close_reason: None,
            depth_peak: 0,
            read_holds: VecDeque::new(),
        }
    }

    // ---- accessors for the driver ----

    /// Negotiated parameters (meaningful once logged in).
    pub fn params(&self) -> &Params {
        &self.params
    }
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }
    pub fn peer_addr(&self) -> SocketAddr {
        self.peer
    }
    pub fn tsih(&self) -> u16 {
        self.tsih
    }
    pub fn isid(&self) -> [u8; 6] {
        self.login.isid()
    }
    pub fn cid(&self) -> u16 {
        self.login.cid()
    }
    pub fn is_full_feature(&self) -> bool {
        self.phase == Phase::FullFeature
    }
    pub fn close_reason(&self) -> Option<CloseReason> {
        self.close_reason
    }
    /// Session-wide sequencing state.
    pub fn session_seq(&self) -> &SessionSeq {
        &self.seq
    }
    /// This connection's member id in its session.
    pub fn member(&self) -> u32 {
        self.member
    }

    /// The datamover under this connection.
    pub fn datamover(&self) -> &D {
        &self.dm
    }

    /// The datamover under this connection, for its transport's receive
    /// path.
    pub fn datamover_mut(&mut self) -> &mut D {
        &mut self.dm
    }

    /// The transport received something from the initiator at `now` (the
    /// NOP-In interval counts from the last input). iSCSI/TCP's
    /// [`Conn::handle_input`] does this itself.
    pub fn input_seen(&mut self, now: Instant) {
        self.last_rx = now;
    }

    /// The transport found the initiator breaking its rules (RFC 7145: a
    /// Send larger than the receive buffers advertised, too many
    /// unexpected PDUs, a malformed iSER header; a failed RDMA transfer):
    /// nothing queued is sent, and the connection ends with
    /// [`CloseReason::ProtocolError`]. The caller logs why.
    pub fn transport_error(&mut self) {
        self.dm.discard_tx();
        self.close(CloseReason::ProtocolError);
    }

    /// The largest number of commands the initiator had outstanding when it
    /// sent a command on this connection, since the last call (0: no
    /// command came). Each command's ExpStatSN says which responses the
    /// initiator had seen when it built the command: the responses sent
    /// after those, plus the commands this connection still holds (this
    /// one included), were outstanding on its side. An initiator at queue
    /// depth 1 gives 1 whatever the target's speed; deeper queues give
    /// their depth once the responses batch.
    pub fn take_depth_peak(&mut self) -> u32 {
        std::mem::take(&mut self.depth_peak)
    }

    /// Makes this connection, still logging in, part of an existing session
    /// (MC/S: a login with the session's TSIH, RFC 7143 §6.3.1): it shares
    /// the session's CmdSN window and ITT space (`seq`), and once accepted
    /// its leading-only parameters are the session's (`lead`, RFC 7143
    /// §13). `member` tells it apart from the session's other connections.
    /// Call before [`Conn::accept_session`].
    pub fn join_session(&mut self, seq: SessionSeq, lead: &Params, member: u32) {
        self.seq = seq;
        self.seq_started = true;
        self.member = member;
        self.lead = Some(Box::new(lead.clone()));
    }

    /// Runs the requests this connection holds whose CmdSN is now next
    /// (another connection of the session filled the gap before them).
    /// Returns whether any ran.
    pub fn release_held(&mut self) -> bool {
        let mut ran = false;
        while self.phase == Phase::FullFeature
            && let Some(h) = self.held.remove(&self.seq.exp_cmd_sn().0)
        {
            self.seq.advance();
            self.run_held(h, true);
            ran = true;
        }
        ran
    }

    fn sns(&self) -> Sns {
        Sns {
            stat_sn: self.stat_sn,
            exp_cmd_sn: self.seq.exp_cmd_sn(),
            max_cmd_sn: self.seq.max_cmd_sn(),
        }
    }

    /// The sequence numbers for a status-bearing PDU; advances StatSN.
    fn take_sns(&mut self) -> Sns {
        let s = self.sns();
        self.stat_sn = self.stat_sn.next();
        s
    }

    fn new_ttt(&mut self) -> u32 {
        loop {
            self.next_ttt = self.next_ttt.wrapping_add(1);
            if self.next_ttt != RESERVED_TAG {
                return self.next_ttt;
            }
        }
    }

    // ---- rejects and closing ----

    fn send_reject(&mut self, reason: RejectReason, hdr: &[u8; BHS_LEN]) {
        tracing::debug!(peer = %self.peer, ?reason, "reject {:?}", Bhs(hdr));
        let sns = self.take_sns();
        let b = pdu::reject(reason, sns);
        self.dm.send_control(&b, hdr);
    }

    fn close(&mut self, reason: CloseReason) {
        if self.phase == Phase::Closing {
            return;
        }
        self.phase = Phase::Closing;
        self.close_reason = Some(reason);
        // Write data that will never come.
        let mut fetches: Vec<CmdId> = Vec::new();
        for t in self.tasks.values_mut() {
            if let Some(f) = t.fetch.take() {
                fetches.push(f.id);
            }
        }
        fetches.sort();
        for id in fetches {
            self.events.push_back(ConnEvent::DataOutDone {
                id,
                data: Err(Abort::ConnectionLost),
            });
        }
        // RFC 7143 §6.3.4 / §11.14.1: when the session outlives this
        // connection (ERL 0, no task reassignment) its tasks are terminated
        // without further notice: the core aborts them. Tags above 32 bits
        // never collide with an ITT.
        if matches!(
            reason,
            CloseReason::ConnectionLogout | CloseReason::Reinstated
        ) {
            let mut itts: Vec<(u32, [u8; 8])> =
                self.tasks.iter().map(|(i, t)| (*i, t.lun_raw)).collect();
            itts.sort();
            for (itt, lun_raw) in itts {
                self.events.push_back(ConnEvent::TaskMgmt(TmfRequest {
                    func: TmfFunction::AbortTask {
                        tag: TaskTag(itt as u64),
                    },
                    lun: Lun::decode(lun_raw).unwrap_or(Lun(u16::MAX)),
                    tag: TaskTag(1 << 32 | itt as u64),
                }));
            }
        }
        // Slots of the session's window this connection's commands held.
        let counted = self.tasks.values().filter(|t| t.counted).count();
        self.seq.add_in_flight(-(counted as i64));
        self.seq.release_member(self.member);
        self.tasks.clear();
        self.held.clear();
        self.events.push_back(ConnEvent::Closed { reason });
    }

    // ---- the driver's API ----

    /// Returns the next event for the driver.
    pub fn poll_event(&mut self) -> Option<ConnEvent> {
        self.events.pop_front()
    }

    /// Answers [`ConnEvent::SessionRequest`].
    pub fn accept_session(&mut self, tsih: u16) {
        if self.phase != Phase::Login {
            return;
        }
        let Some(reply) = self.login.accept(tsih) else {
            return;
        };
        self.tsih = tsih;
        self.params = self.login.params().clone();
        if let Some(l) = self.lead.take() {
            // RFC 7143 §13: leading-only keys are the session's.
            let p = &mut self.params;
            p.max_connections = l.max_connections;
            p.initial_r2t = l.initial_r2t;
            p.immediate_data = l.immediate_data;
            p.max_burst_length = l.max_burst_length;
            p.first_burst_length = l.first_burst_length;
            p.default_time2wait = l.default_time2wait;
            p.default_time2retain = l.default_time2retain;
            p.max_outstanding_r2t = l.max_outstanding_r2t;
            p.data_pdu_in_order = l.data_pdu_in_order;
            p.data_sequence_in_order = l.data_sequence_in_order;
            p.error_recovery_level = l.error_recovery_level;
        }
        self.send_login_reply(&reply);
        self.dm.enable_datamover(&self.params);
        self.phase = Phase::FullFeature;
        if self.params.session_type == SessionType::Normal {
            self.seq.add_conn(self.cid(), self.member);
            self.events.push_back(ConnEvent::LoggedIn);
        }
    }

    /// Refuses the session with a login status.
    pub fn reject_session(&mut self, status: LoginStatus) {
        if let Some(LoginStep::Fail { status, itt }) = self.login.reject(status) {
            self.login_fail(status, itt);
        }
    }

    /// When [`Conn::handle_timeout`] wants to be called.
    pub fn poll_timeout(&self) -> Option<Instant> {
        match self.phase {
            Phase::Closing => None,
            Phase::Login => Some(self.login_deadline),
            Phase::FullFeature => {
                let mut t = self.logout_deadline;
                let nop = match (self.ping, self.cfg.nop_in_interval) {
                    (Some((_, deadline)), _) => Some(deadline),
                    (None, Some(iv)) => Some(later(self.last_rx, iv)),
                    (None, None) => None,
                };
                for n in [nop, self.data_scan].into_iter().flatten() {
                    t = Some(t.map_or(n, |x| x.min(n)));
                }
                t
            }
        }
    }

    pub fn handle_timeout(&mut self, now: Instant) {
        match self.phase {
            Phase::Closing => {}
            Phase::Login => {
                if now >= self.login_deadline {
                    tracing::info!(peer = %self.peer, "login timed out");
                    self.close(CloseReason::LoginTimeout);
                }
            }
            Phase::FullFeature => {
                if self.logout_deadline.is_some_and(|d| now >= d) {
                    // The requested logout did not come: the target drops
                    // the connection, and says so (AsyncEvent 3).
                    tracing::info!(peer = %self.peer, "requested logout not received in time, dropping the connection");
                    self.announce_drop_all(2, 0);
                    self.close(CloseReason::CoreRequest);
                    return;
                }
                if let (Some(at), Some(period)) = (self.data_scan, self.cfg.data_out_timeout)
                    && now >= at
                {
                    self.data_scan = Some(later(now, period));
                    if let Some(itt) = self.stalled_task() {
                        tracing::warn!(peer = %self.peer, itt = format_args!("{itt:#x}"), timeout_s = period.as_secs(),
                            "solicited Data-Out not received in time, dropping the connection");
                        self.close(CloseReason::DataOutTimeout);
                        return;
                    }
                }
                match self.ping {
                    Some((_, deadline)) if now >= deadline => {
                        tracing::info!(peer = %self.peer, "NOP-In ping not answered, dropping the connection");
                        self.close(CloseReason::NopTimeout);
                    }
                    Some(_) => {}
                    None => {
                        if let Some(iv) = self.cfg.nop_in_interval
                            && now >= later(self.last_rx, iv)
                        {
                            self.ping(now);
                        }
                    }
                }
            }
        }
    }

    /// One Data-Out scan: a task whose oldest outstanding R2T is the one
    /// it had at the previous scan has not finished that burst in a whole
    /// period (the initiator sends nothing, or trickles it); marks the
    /// others for the next scan.
    fn stalled_task(&mut self) -> Option<u32> {
        let mut stalled = None;
        for (itt, t) in self.tasks.iter_mut() {
            let oldest = t.r2ts.first().map(|r| r.ttt);
            if oldest.is_some() && oldest == t.stall_mark {
                stalled = Some(*itt);
            }
            t.stall_mark = oldest;
        }
        stalled
    }

    /// True once the connection is finished and everything to send was handed
    /// to the driver: close the socket after flushing.
    pub fn is_closed(&self) -> bool {
        self.phase == Phase::Closing && self.dm.is_flushed()
    }

    /// A login with this connection's CID joined the session in its place
    /// (connection reinstatement, RFC 7143 §6.3.4): this connection ends,
    /// its tasks are terminated, the session goes on.
    pub fn reinstated(&mut self) {
        self.dm.discard_tx();
        self.close(CloseReason::Reinstated);
    }

    /// Another connection of the session logged this one out (RFC 7143
    /// §11.14.1 reason 1 with this CID): it ends, its tasks are
    /// terminated, the session goes on.
    pub fn logged_out_elsewhere(&mut self) {
        self.close(CloseReason::ConnectionLogout);
    }

    /// The driver saw the peer close the socket (or a socket error).
    pub fn handle_peer_closed(&mut self, _now: Instant) {
        self.dm.discard_tx();
        self.close(CloseReason::PeerClosed);
    }

    /// Carries out a core action for this connection's session.
    pub fn handle_action(&mut self, now: Instant, action: Action) {
        match action {
            Action::FetchData {
                id,
                tag,
                buf,
                offset,
                len,
            } => self.fetch_data(id, tag, buf, offset, len),
            Action::Respond { id, tag, rsp } => self.respond(id, tag, rsp),
            Action::TmfDone { tag, rsp, .. } => self.tmf_done(tag, rsp),
            Action::Aen { lun, sense } => self.aen(lun, sense),
            Action::ConfirmDelivery => {
                if !self.read_holds.is_empty() && self.phase == Phase::FullFeature {
                    self.ping(now);
                }
            }
            Action::Close => {
                if self.phase != Phase::FullFeature || self.logout_deadline.is_some() {
                    return;
                }
                // RFC 7143 §11.9.1 AsyncEvent 1: the target requests a logout
                // within Parameter3 seconds.
                let secs = self.cfg.login_timeout.as_secs().clamp(1, 3600) as u16;
                let sns = self.take_sns();
                let b = pdu::async_message([0; 8], 1, [0, 0, secs], sns);
                self.dm.send_control(&b, &[]);
                self.logout_deadline = Some(later(now, Duration::from_secs(secs as u64)));
            }
        }
    }

    // ---- what the datamover received ----

    /// A whole PDU other than Data-Out arrived (Control_Notify, RFC 7145
    /// §7): its header, AHS and data segment; `ok` is false when its data
    /// segment came damaged (a data digest error), and the PDU is then
    /// rejected (RFC 7143 §7.8), a SCSI command still taking its CmdSN
    /// with its write data failed.
    pub fn pdu_received(&mut self, hdr: &[u8; BHS_LEN], ahs: &[u8], data: Vec<u8>, ok: bool) {
        let op = Bhs(hdr).opcode();
        match self.phase {
            Phase::Closing => {}
            Phase::Login => {
                if op != Opcode::LOGIN_REQ {
                    // RFC 7143 §6.3: only Login Requests during login.
                    tracing::warn!(peer = %self.peer, "non-login PDU {:?} during login", Bhs(hdr));
                    self.close(CloseReason::ProtocolError);
                    return;
                }
                self.login_pdu(hdr, &data);
            }
            Phase::FullFeature => {
                if !ok {
                    tracing::warn!(peer = %self.peer, "data digest error on {:?}", Bhs(hdr));
                    // RFC 7143 §7.8: Reject with reason Data Digest Error.
                    self.send_reject(RejectReason::DataDigestError, hdr);
                    if op == Opcode::SCSI_CMD {
                        // The command still counts; its data fails.
                        self.scsi_command(hdr, ahs, Vec::new(), true);
                    }
                    return;
                }
                self.ffp_pdu(hdr, ahs, data);
            }
        }
    }

    // ---- login ----

    fn login_pdu(&mut self, hdr: &[u8; BHS_LEN], data: &[u8]) {
        let bhs = Bhs(hdr);
        if !self.seq_started {
            // RFC 7143 §11.12.8: the first non-immediate command after login
            // carries the CmdSN of the Login Request (a connection joining a
            // session shares the session's instead: join_session).
            self.seq = SessionSeq::new(bhs.cmd_sn(), self.cfg.queue_depth);
            self.seq_started = true;
        }
        match self.login.handle(bhs, data) {
            LoginStep::Reply(r) => self.send_login_reply(&r),
            LoginStep::Fail { status, itt } => self.login_fail(status, itt),
            LoginStep::SessionRequest {
                initiator,
                isid,
                tsih,
                target,
                discovery,
            } => self.events.push_back(ConnEvent::SessionRequest {
                initiator,
                isid,
                tsih,
                target,
                discovery,
            }),
        }
    }

    fn send_login_reply(&mut self, r: &LoginReply) {
        let sns = self.take_sns();
        let b = pdu::login_response(
            r.transit,
            r.cont,
            r.csg,
            r.nsg,
            self.login.isid(),
            r.tsih,
            r.itt,
            sns,
            LoginStatus::SUCCESS,
        );
        self.dm.send_control(&b, &r.data);
    }

    fn login_fail(&mut self, status: LoginStatus, itt: u32) {
        let initiator = self.login.params().initiator_name.clone();
        tracing::info!(peer = %self.peer, initiator = initiator.as_deref().unwrap_or("?"),
            class = status.class, detail = status.detail, "login rejected");
        if status == LoginStatus::AUTH_FAILURE || status == LoginStatus::AUTHORIZATION_FAILURE {
            self.events
                .push_back(ConnEvent::LoginFailed { initiator, status });
        }
        let sns = self.take_sns();
        let b = pdu::login_response(false, false, 0, 0, self.login.isid(), 0, itt, sns, status);
        self.dm.send_control(&b, &[]);
        self.close(CloseReason::LoginFailed);
    }

    // ---- full feature phase ----

    /// Runs `f` now if the request is immediate or next in CmdSN order, holds
    /// it if it is ahead within the window, drops it otherwise.
    fn sequence(&mut self, hdr: &[u8; BHS_LEN], held: Held) {
        let bhs = Bhs(hdr);
        if bhs.immediate() {
            self.run_held(held, false);
            return;
        }
        let sn = bhs.cmd_sn();
        if !self.seq.in_window(sn) {
            // RFC 7143 §4.2.2.1: outside [ExpCmdSN, MaxCmdSN] a non-immediate
            // command is silently ignored.
            tracing::debug!(peer = %self.peer, cmd_sn = sn.0, exp = self.seq.exp_cmd_sn().0, "CmdSN outside the window, dropped");
            self.drop_held(held);
            return;
        }
        if sn != self.seq.exp_cmd_sn() {
            // Ahead of a gap, which this or another connection of the
            // session fills (RFC 7143 §4.2.2.1: delivery in CmdSN order
            // across the session's connections).
            if self.held.len() >= MAX_HELD || self.held.contains_key(&sn.0) {
                self.drop_held(held);
                return;
            }
            self.held.insert(sn.0, held);
            return;
        }
        self.seq.advance();
        self.run_held(held, true);
        self.release_held();
    }

    /// A request that will never run: a command's task is forgotten.
    fn drop_held(&mut self, h: Held) {
        if let Held::Scsi(itt, _) = h {
            self.tasks.remove(&itt);
            self.seq.release_task(itt, self.member);
        }
    }

    fn run_held(&mut self, h: Held, ordered: bool) {
        match h {
            Held::Skip => {}
            Held::Scsi(itt, req) => {
                if let Some(t) = self.tasks.get_mut(&itt) {
                    if ordered {
                        t.counted = true;
                        self.seq.add_in_flight(1);
                    }
                    t.submitted = true;
                    self.events.push_back(ConnEvent::Command(req));
                }
            }
            Held::Pdu(hdr, data) => self.run_control(&hdr, data),
        }
    }

    fn ffp_pdu(&mut self, hdr: &[u8; BHS_LEN], ahs: &[u8], data: Vec<u8>) {
        let bhs = Bhs(hdr);
        match bhs.opcode() {
            Opcode::SCSI_CMD => self.scsi_command(hdr, ahs, data, false),
            Opcode::NOP_OUT => {
                if bhs.itt() == RESERVED_TAG {
                    // RFC 7143 §11.18: an answer to our ping, or just an
                    // ExpStatSN update; never answered, never ordered.
                    if let Some((ttt, _)) = self.ping
                        && ttt == bhs.ttt()
                    {
                        self.ping = None;
                    }
                    return;
                }
                self.sequence(hdr, Held::Pdu(Box::new(*hdr), data));
            }
            Opcode::TEXT_REQ | Opcode::LOGOUT_REQ | Opcode::TMF_REQ => {
                self.sequence(hdr, Held::Pdu(Box::new(*hdr), data));
            }
            Opcode::LOGIN_REQ => {
                // RFC 7143 §6.3: no login in full feature phase.
                self.send_reject(RejectReason::ProtocolError, hdr);
            }
            Opcode::SNACK => {
                // RFC 7143 §11.16: SNACK needs ErrorRecoveryLevel > 0.
                self.send_reject(RejectReason::ProtocolError, hdr);
            }
            _ => {
                // RFC 7143 §11.17.1: reason 05h, Command not supported.
                self.send_reject(RejectReason::CommandNotSupported, hdr);
            }
        }
    }

    fn scsi_command(&mut self, hdr: &[u8; BHS_LEN], ahs: &[u8], data: Vec<u8>, data_bad: bool) {
        let bhs = Bhs(hdr);
        let itt = bhs.itt();
        if self.params.session_type == SessionType::Discovery {
            // RFC 7143 §4.3: a discovery session carries text, NOP and logout only.
            self.send_reject(RejectReason::ProtocolError, hdr);
            self.sequence(hdr, Held::Skip);
            return;
        }
        let f = bhs.flags();
        let dir = match (f & flags::R != 0, f & flags::W != 0) {
            (true, true) => DataDir::Bidi,
            (true, false) => DataDir::Read,
            (false, true) => DataDir::Write,
            (false, false) => DataDir::None,
        };
        let edtl = bhs.edtl();
        let imm = data.len() as u32;
        let p = &self.params;
        // RFC 7143 §11.3.4/§13.11: immediate data needs W, ImmediateData=Yes,
        // and at most FirstBurstLength and EDTL bytes.
        let bad_imm = imm > 0
            && (!matches!(dir, DataDir::Write | DataDir::Bidi)
                || !p.immediate_data
                || imm > p.first_burst_length
                || imm > edtl);
        let Some((cdb, read_len)) = parse_cdb(bhs.cdb(), ahs) else {
            self.send_reject(RejectReason::InvalidPduField, hdr);
            self.sequence(hdr, Held::Skip);
            return;
        };
        if bad_imm {
            self.send_reject(RejectReason::ProtocolError, hdr);
            self.sequence(hdr, Held::Skip);
            return;
        }
        if self.tasks.contains_key(&itt) || self.seq.itt_in_use(itt) || itt == RESERVED_TAG {
            // RFC 7143 §11.2.1.8: ITTs are unique per session.
            self.send_reject(RejectReason::InvalidPduField, hdr);
            self.sequence(hdr, Held::Skip);
            return;
        }
        let writes = matches!(dir, DataDir::Write | DataDir::Bidi);
        let unsol_expected = if !writes {
            0
        } else if p.initial_r2t || f & flags::F != 0 {
            // RFC 7143 §11.3.1: F set on the command means no unsolicited
            // Data-Out follows.
            imm
        } else {
            // RFC 7143 §13.10/§13.14: with InitialR2T=No the initiator sends
            // min(FirstBurstLength, EDTL) unsolicited bytes.
            p.first_burst_length.min(edtl).max(imm)
        };
        let lun_raw = bhs.lun();
        let attr = match f & 7 {
            2 => TaskAttr::Ordered,
            3 => TaskAttr::HeadOfQueue,
            4 => TaskAttr::Aca,
            _ => TaskAttr::Simple,
        };
        let req = CmdRequest {
            lun: Lun::decode(lun_raw).unwrap_or(Lun(u16::MAX)),
            lun_raw,
            tag: TaskTag(itt as u64),
            cdb,
            attr,
            dir,
            expected_len: edtl,
            expected_read_len: if dir == DataDir::Bidi { read_len } else { 0 },
        };
        let task = Task {
            lun_raw,
            edtl,
            read_len: match dir {
                DataDir::Read => edtl,
                DataDir::Bidi => read_len,
                _ => 0,
            },
            dir,
            counted: false,
            unsol_expected,
            unsol_announced: imm,
            unsol_got: if data_bad { 0 } else { imm },
            unsol_buf: data,
            unsol_next_data_sn: DataSn(0),
            unsol_done: unsol_expected == imm,
            failed: data_bad,
            submitted: false,
            aborted: false,
            fetch: None,
            r2ts: Vec::new(),
            next_r2t_offset: 0,
            r2t_end: 0,
            r2t_sn: R2tSn(0),
            stall_mark: None,
        };
        self.tasks.insert(itt, task);
        // An ExpStatSN ahead of StatSN or absurdly far behind is the
        // initiator's error, not a depth: it counts as nothing seen unsent.
        let unseen = self.stat_sn.0.wrapping_sub(bhs.exp_stat_sn().0);
        let unseen = if unseen <= self.cfg.queue_depth.saturating_mul(2) {
            unseen
        } else {
            0
        };
        let depth = unseen.saturating_add(self.tasks.len() as u32);
        self.depth_peak = self.depth_peak.max(depth);
        self.seq.claim_task(itt, self.member);
        self.sequence(hdr, Held::Scsi(itt, req));
    }

    /// Validates the header of a Data-Out PDU carrying `len` bytes (RFC
    /// 7143 §11.7) and picks where its payload goes; a transport's receive
    /// path then hands the payload to [`Conn::data_out_bytes`].
    pub fn data_out_header(&mut self, hdr: &[u8; BHS_LEN], len: u32) -> DataOutPlace {
        let bhs = Bhs(hdr);
        let itt = bhs.itt();
        let ttt = bhs.ttt();
        let off = bhs.buffer_offset();
        let sn = bhs.data_sn();
        let fin = bhs.final_bit();
        let initial_r2t = self.params.initial_r2t;
        let Some(t) = self.tasks.get_mut(&itt) else {
            // A task already answered or unknown: the data is dropped.
            tracing::debug!(peer = %self.peer, itt, "Data-Out for no task, dropped");
            return DataOutPlace::Discard;
        };
        if t.failed {
            return DataOutPlace::Discard;
        }
        let err = if ttt == RESERVED_TAG {
            // Unsolicited data (RFC 7143 §4.2.5.1).
            if initial_r2t || t.unsol_done || sn != t.unsol_next_data_sn {
                Some(RejectReason::ProtocolError)
            } else if off != t.unsol_announced || off as u64 + len as u64 > t.unsol_expected as u64
            {
                Some(RejectReason::InvalidPduField)
            } else {
                t.unsol_next_data_sn = sn.next();
                t.unsol_announced += len;
                if fin {
                    t.unsol_done = true;
                }
                if fin && t.unsol_announced < t.unsol_expected {
                    // The unsolicited burst ended early: solicit from here,
                    // unless R2Ts past this point already went out.
                    let end = t.unsol_announced;
                    let issued = t.next_r2t_offset > t.unsol_expected || !t.r2ts.is_empty();
                    t.unsol_expected = end;
                    match &t.fetch {
                        Some(_) if issued => Some(RejectReason::ProtocolError),
                        Some(f) => {
                            t.next_r2t_offset = f.offset.max(end);
                            None
                        }
                        None => None,
                    }
                } else {
                    None
                }
            }
        } else {
            match t.r2ts.iter_mut().find(|r| r.ttt == ttt) {
                None => Some(RejectReason::InvalidPduField),
                Some(r) => {
                    // RFC 7143 §11.7.5/§11.7.6: DataSN counts from 0 per R2T,
                    // offsets in order (DataPDUInOrder=Yes), within the burst.
                    if sn != r.next_data_sn {
                        Some(RejectReason::ProtocolError)
                    } else if off != r.offset + r.announced
                        || off as u64 + len as u64 > (r.offset + r.len) as u64
                    {
                        Some(RejectReason::InvalidPduField)
                    } else if fin && off + len != r.offset + r.len {
                        Some(RejectReason::ProtocolError)
                    } else {
                        r.next_data_sn = sn.next();
                        r.announced += len;
                        None
                    }
                }
            }
        };
        match err {
            Some(reason) => {
                tracing::warn!(peer = %self.peer, itt, ?reason, "bad Data-Out");
                self.send_reject(reason, hdr);
                self.fail_task_data(itt);
                DataOutPlace::Discard
            }
            None if ttt == RESERVED_TAG => DataOutPlace::Unsolicited { itt },
            None => DataOutPlace::Solicited { itt, ttt, pos: off },
        }
    }

    /// Bytes of a Data-Out payload whose header
    /// [`Conn::data_out_header`] placed, in order: unsolicited ones join
    /// the task's unsolicited bytes, solicited ones go straight into the
    /// core's buffer.
    pub fn data_out_bytes(&mut self, place: &mut DataOutPlace, chunk: &[u8]) {
        match place {
            DataOutPlace::Discard => {}
            DataOutPlace::Unsolicited { itt } => {
                if let Some(t) = self.tasks.get_mut(itt) {
                    t.unsol_buf.extend_from_slice(chunk);
                }
            }
            DataOutPlace::Solicited { itt, ttt, pos } => {
                // Only into a solicitation still outstanding: bytes of one
                // that a task management function ended (an RDMA READ
                // completing late) never reach a later task's buffer.
                if let Some(t) = self.tasks.get_mut(itt)
                    && t.r2ts.iter().any(|r| r.ttt == *ttt)
                    && let Some(f) = t.fetch.as_mut()
                {
                    let at = pos.saturating_sub(f.base) as usize;
                    f.buf.copy_in(at, chunk);
                }
                *pos = pos.wrapping_add(chunk.len() as u32);
            }
        }
    }

    /// The write data of `itt` cannot be trusted: the core's fetch fails with
    /// a transport error (now, or when it asks).
    fn fail_task_data(&mut self, itt: u32) {
        if let Some(t) = self.tasks.get_mut(&itt) {
            t.failed = true;
            t.r2ts.clear();
            if let Some(f) = t.fetch.take() {
                self.events.push_back(ConnEvent::DataOutDone {
                    id: f.id,
                    data: Err(Abort::TransportError),
                });
            }
        }
    }

    /// Unsolicited write data of task `itt` arrived, `len` bytes at data
    /// offset `off` (immediate data rides in the command): `ok` unless a
    /// digest or the transport found it damaged. The bytes are in the
    /// task's unsolicited buffer; once the unsolicited burst is complete,
    /// solicitation starts.
    pub fn unsolicited_data_received(&mut self, itt: u32, off: u32, len: u32, ok: bool) {
        if !ok {
            self.fail_task_data(itt);
            return;
        }
        let Some(t) = self.tasks.get_mut(&itt) else {
            return;
        };
        t.unsol_got += len;
        if let Some(f) = t.fetch.as_mut() {
            copy_overlap(f, &t.unsol_buf, off, len);
        }
        self.issue_r2ts(itt);
        self.check_fetch(itt);
    }

    /// Solicited write data of task `itt` arrived: `len` bytes answering
    /// the solicitation with TTT `ttt` ([`Datamover::get_data`]), already
    /// in the core's buffer (Data_Completion_Notify, RFC 7145); `ok`
    /// unless it came damaged. A completed
    /// solicitation makes room for the next; the core gets its buffer once
    /// the whole range is in.
    pub fn solicited_data_received(&mut self, itt: u32, ttt: u32, len: u32, ok: bool) {
        if !ok {
            self.fail_task_data(itt);
            return;
        }
        let Some(t) = self.tasks.get_mut(&itt) else {
            return;
        };
        let Some(i) = t.r2ts.iter().position(|r| r.ttt == ttt) else {
            return;
        };
        t.r2ts[i].got += len;
        if let Some(f) = t.fetch.as_mut() {
            f.got += len;
        }
        if t.r2ts[i].got >= t.r2ts[i].len {
            t.r2ts.swap_remove(i);
        }
        self.issue_r2ts(itt);
        self.check_fetch(itt);
    }

    fn fetch_data(&mut self, id: CmdId, tag: TaskTag, buf: SgList, offset: u32, len: u32) {
        let itt = tag.0 as u32;
        let Some(t) = self.tasks.get_mut(&itt) else {
            self.events.push_back(ConnEvent::DataOutDone {
                id,
                data: Err(Abort::ConnectionLost),
            });
            return;
        };
        if t.failed || t.fetch.is_some() || !matches!(t.dir, DataDir::Write | DataDir::Bidi) {
            self.events.push_back(ConnEvent::DataOutDone {
                id,
                data: Err(Abort::TransportError),
            });
            return;
        }
        // Never solicit past EDTL (RFC 7143 §11.8.4).
        let end = (offset as u64 + len as u64).min(t.edtl as u64) as u32;
        let want = end.saturating_sub(offset);
        // `buf` covers the command's data from 0, or just this range.
        let base = if buf.len() as u64 >= offset as u64 + want as u64 {
            0
        } else {
            offset
        };
        let mut f = Fetch {
            id,
            buf,
            base,
            offset,
            len: want,
            got: 0,
        };
        let have = t.unsol_got.min(t.unsol_buf.len() as u32);
        copy_overlap(&mut f, &t.unsol_buf, 0, have);
        t.fetch = Some(f);
        t.next_r2t_offset = offset.max(t.unsol_expected);
        t.r2t_end = end;
        self.issue_r2ts(itt);
        self.check_fetch(itt);
    }

    /// RFC 7143 §11.8: R2Ts of at most MaxBurstLength, up to
    /// MaxOutstandingR2T at a time.
    fn issue_r2ts(&mut self, itt: u32) {
        let max_out = self.params.max_outstanding_r2t.max(1) as usize;
        let burst = self.params.max_burst_length.max(512);
        loop {
            let sns = self.sns();
            let ttt = self.next_ttt.wrapping_add(1);
            let Some(t) = self.tasks.get_mut(&itt) else {
                return;
            };
            // Solicit only once the unsolicited burst is complete, so that its
            // end is known and sequences go in order (DataSequenceInOrder=Yes).
            let unsol_open = !t.unsol_done && t.unsol_announced < t.unsol_expected;
            if t.failed
                || unsol_open
                || t.fetch.is_none()
                || t.r2ts.len() >= max_out
                || t.next_r2t_offset >= t.r2t_end
            {
                return;
            }
            let ttt = if ttt == RESERVED_TAG { 0 } else { ttt };
            let off = t.next_r2t_offset;
            let len = (t.r2t_end - off).min(burst);
            t.next_r2t_offset += len;
            t.r2ts.push(R2tState {
                ttt,
                offset: off,
                len,
                announced: 0,
                got: 0,
                next_data_sn: DataSn(0),
            });
            let sn = t.r2t_sn;
            t.r2t_sn = sn.next();
            let lun = t.lun_raw;
            self.next_ttt = ttt;
            self.dm.get_data(
                Solicit {
                    lun,
                    itt,
                    ttt,
                    r2t_sn: sn,
                    offset: off,
                    len,
                },
                sns,
            );
        }
    }

    fn check_fetch(&mut self, itt: u32) {
        let Some(t) = self.tasks.get_mut(&itt) else {
            return;
        };
        let done = t.fetch.as_ref().is_some_and(|f| f.got >= f.len);
        if done && let Some(f) = t.fetch.take() {
            t.r2ts.clear();
            self.events.push_back(ConnEvent::DataOutDone {
                id: f.id,
                data: Ok(f.buf),
            });
        }
    }

    /// Releases the delivery holds of the responses the initiator has seen:
    /// those before `exp` (RFC 7143 §3.2.2.2: ExpStatSN acknowledges every
    /// status before it). An ExpStatSN beyond the last StatSN sent is
    /// ignored.
    fn ack_reads(&mut self, exp: StatSn) {
        let ahead = exp.0.wrapping_sub(self.stat_sn.0) as i32;
        if ahead > 0 {
            return;
        }
        while let Some((sn, _)) = self.read_holds.front()
            && (exp.0.wrapping_sub(sn.0) as i32) > 0
        {
            self.read_holds.pop_front();
        }
    }

    fn respond(&mut self, id: CmdId, tag: TaskTag, rsp: Response) {
        let itt = tag.0 as u32;
        let task = self.tasks.remove(&itt);
        if task.is_some() {
            self.seq.release_task(itt, self.member);
        }
        if self.phase != Phase::FullFeature {
            self.events.push_back(ConnEvent::ResponseSent { id });
            return;
        }
        if let Some(t) = &task
            && t.counted
        {
            self.seq.add_in_flight(-1);
        }
        let dir = task.as_ref().map_or(DataDir::Read, |t| t.dir);
        let read_len = task.as_ref().map_or(0, |t| t.read_len) as usize;
        let r2ts_sent = task.as_ref().map_or(0, |t| t.r2t_sn.0);
        let Response {
            status,
            sense,
            data,
            data_len,
            pipe,
            residual,
            bidi_residual,
        } = rsp;
        let mut data_sn = DataSn(0);
        let mut collapsed = false;
        let (payload, hold) = match (data, pipe) {
            (_, Some(PipeData { mut pipe, hold })) => {
                if !self.dm.can_splice() {
                    // The datamover needs the bytes (TCP: for the data
                    // digest): they are copied out, and the pages are free
                    // at once.
                    let mut bytes = Vec::new();
                    let held = pipe.held();
                    match pipe.read_to(&mut bytes, held) {
                        Ok(_) => {
                            let mut sg = SgList::new();
                            sg.push(IoBuf::from_slice(&bytes));
                            (Some(ReadData::Sg(Some(sg), None)), None)
                        }
                        Err(e) => {
                            tracing::warn!(peer = %self.peer, error = %e, "read data lost from its pipe, dropping the connection");
                            self.close(CloseReason::CoreRequest);
                            self.events.push_back(ConnEvent::ResponseSent { id });
                            return;
                        }
                    }
                } else {
                    let hold_len = pipe.held();
                    (
                        Some(ReadData::Pipe(
                            std::rc::Rc::new(std::cell::RefCell::new(pipe)),
                            hold_len,
                        )),
                        Some(hold),
                    )
                }
            }
            (Some(sg), None) => (Some(ReadData::Sg(Some(sg), None)), None),
            (None, None) => (None, None),
        };
        if let Some(payload) = payload
            && matches!(dir, DataDir::Read | DataDir::Bidi)
        {
            // RFC 7143 §11.7: never more Data-In than the initiator expects.
            let total = (data_len as usize).min(payload.len()).min(read_len);
            // RFC 7143 §11.7.4: status may ride with the data only without
            // sense data (and never for Bidi, whose write residual needs
            // the SCSI Response).
            let collapse = sense.is_none() && status == Status::GOOD && dir == DataDir::Read;
            let put = PutData {
                itt,
                data: payload,
                len: total,
                status: collapse.then_some((status.0, residual)),
            };
            let done = self.dm.put_data(put, self.sns());
            if done.status_sent {
                self.stat_sn = self.stat_sn.next();
            }
            data_sn = done.next_data_sn;
            collapsed = done.status_sent;
        }
        if !collapsed {
            let sns = self.take_sns();
            // RFC 7143 §11.4.8: ExpDataSN counts the R2T and Data-In PDUs
            // sent for the command.
            let exp_data_sn = data_sn.plus(r2ts_sent);
            let b = pdu::scsi_response(itt, status.0, residual, bidi_residual, exp_data_sn, sns);
            match sense {
                Some(s) => {
                    let seg = pdu::sense_segment(&s);
                    self.dm.send_control(&b, &seg);
                }
                None => self.dm.send_control(&b, &[]),
            }
        }
        if let Some(hold) = hold {
            // The status just sent carries the last StatSN.
            let sn = StatSn(self.stat_sn.0.wrapping_sub(1));
            self.read_holds.push_back((sn, hold));
        }
        self.events.push_back(ConnEvent::ResponseSent { id });
    }
}

/// Copies the part of `src` (unsolicited bytes from data offset 0) lying in
/// `[off, off+len)` and inside the fetch's range into the fetch buffer.
fn copy_overlap(f: &mut Fetch, src: &[u8], off: u32, len: u32) {
    let lo = off.max(f.offset) as usize;
    let hi =
        ((off as u64 + len as u64).min(f.offset as u64 + f.len as u64) as usize).min(src.len());
    if lo >= hi {
        return;
    }
    let at = lo - f.base as usize;
    f.buf.copy_in(at, &src[lo..hi]);
    f.got += (hi - lo) as u32;
}

/// The CDB (16 bytes plus an extended CDB AHS) and the Bidi expected read
/// length (RFC 7143 §11.2.2, §11.3.5, §11.3.6).
fn parse_cdb(cdb16: &[u8], mut ahs: &[u8]) -> Option<(Cdb, u32)> {
    let mut cdb = Cdb::from_slice(cdb16);
    let mut read_len = 0;
    while ahs.len() >= 4 {
        let len = u16::from_be_bytes([ahs[0], ahs[1]]) as usize;
        let ty = ahs[2];
        let body = ahs.get(3..3 + len)?;
        match ty {
            1 => {
                // Extended CDB: reserved byte, then CDB bytes 16..
                cdb.extend_from_slice(body.get(1..)?);
            }
            2 => {
                let b = body.get(1..5)?;
                read_len = u32::from_be_bytes([b[0], b[1], b[2], b[3]]);
            }
            _ => return None,
        }
        let used = (3 + len).next_multiple_of(4);
        ahs = ahs.get(used.min(ahs.len())..)?;
    }
    Some((cdb, read_len))
}

/// `now + d`, saturating far in the future instead of overflowing on an
/// absurd configured duration.
fn later(now: Instant, d: Duration) -> Instant {
    now.checked_add(d)
        .or_else(|| now.checked_add(Duration::from_secs(1 << 32)))
        .unwrap_or(now)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::datamover::PutDone;
    use crate::keys::encode_text;
    use crate::pdu::{BhsBuf, pad_len, tmf_fn, tmf_rsp};
    use ferrite_core::TmfResponse;

    #[test]
    fn a_target_is_reachable_only_through_its_portals() {
        let at = |portals: &[&str]| IscsiTarget {
            name: "iqn.2026-12.test:t".into(),
            alias: None,
            tpgt: 1,
            portals: portals.iter().map(|p| p.parse().unwrap()).collect(),
            auth: ChapAuth::default(),
        };
        let local = |a: &str| a.parse::<SocketAddr>().unwrap();
        let two = at(&["127.0.0.1:3260", "[::1]:3261"]);
        assert!(two.reachable_at(local("127.0.0.1:3260")));
        assert!(two.reachable_at(local("[::1]:3261")));
        // Another port of the same address, another address on the port.
        assert!(!two.reachable_at(local("127.0.0.1:3261")));
        assert!(!two.reachable_at(local("127.0.0.2:3260")));
        assert!(!two.reachable_at(local("[::1]:3260")));
        // An IPv4 peer of a dual-stack listener: the local address is
        // IPv4-mapped.
        assert!(two.reachable_at(local("[::ffff:127.0.0.1]:3260")));
        // Wildcards match every address on their port.
        let any = at(&["0.0.0.0:3260", "[::]:3262"]);
        assert!(any.reachable_at(local("10.1.2.3:3260")));
        assert!(any.reachable_at(local("[fe80::1]:3262")));
        assert!(!any.reachable_at(local("10.1.2.3:3261")));
        // No portals: every portal of the daemon.
        assert!(at(&[]).reachable_at(local("192.0.2.7:4000")));
    }

    const TARGET: &str = "iqn.2026-01.test:mcs";

    /// A datamover that records what the session layer asks of it and,
    /// as an RDMA transport would, sends read data without PDUs of its own
    /// and never the status with it.
    #[derive(Debug, Default)]
    struct Recorder {
        enabled: bool,
        control: Vec<Opcode>,
        puts: Vec<(u32, usize, bool)>,
        gets: Vec<Solicit>,
    }

    impl Datamover for Recorder {
        fn enable_datamover(&mut self, _params: &Params) {
            self.enabled = true;
        }
        fn send_control(&mut self, bhs: &BhsBuf, _data: &[u8]) {
            self.control.push(Bhs(&bhs.0).opcode());
        }
        fn put_data(&mut self, put: PutData, _sns: Sns) -> PutDone {
            self.puts.push((put.itt, put.len, put.status.is_some()));
            PutDone {
                next_data_sn: DataSn(0),
                status_sent: false,
            }
        }
        fn get_data(&mut self, solicit: Solicit, _sns: Sns) {
            self.gets.push(solicit);
        }
        fn is_rdma(&self) -> bool {
            false
        }
        fn can_splice(&self) -> bool {
            false
        }
        fn is_flushed(&self) -> bool {
            true
        }
        fn discard_tx(&mut self) {}
    }

    #[test]
    fn the_session_layer_runs_over_another_datamover() {
        let now = Instant::now();
        let cfg = Arc::new(IscsiConfig {
            targets: vec![IscsiTarget {
                name: TARGET.into(),
                alias: None,
                tpgt: 1,
                portals: vec![],
                auth: ChapAuth::default(),
            }],
            ..IscsiConfig::default()
        });
        let addr: SocketAddr = "127.0.0.1:3260".parse().unwrap();
        let mut c = Conn::with_datamover(now, cfg, addr, addr, 1, Recorder::default());
        // Login in one PDU, straight to full feature phase.
        let mut b = BhsBuf::new(Opcode::LOGIN_REQ, flags::T | (1 << 2) | 3);
        b.set_immediate();
        b.0[8..14].copy_from_slice(&[0x80, 0, 0, 0, 0, 1]);
        b.set_u32(24, 10);
        let keys = encode_text(&[
            ("InitiatorName", "iqn.i"),
            ("TargetName", TARGET),
            ("SessionType", "Normal"),
        ]);
        c.pdu_received(&b.0, &[], keys, true);
        assert!(matches!(
            c.poll_event(),
            Some(ConnEvent::SessionRequest { .. })
        ));
        assert!(!c.dm.enabled);
        c.accept_session(0x55);
        assert!(matches!(c.poll_event(), Some(ConnEvent::LoggedIn)));
        assert!(c.dm.enabled);
        assert_eq!(c.dm.control, vec![Opcode::LOGIN_RSP]);

        // A write: the session layer solicits its 8 KiB (Get_Data) once the
        // core gives a buffer, and hands the buffer back when the
        // datamover says the data is in.
        let mut w = BhsBuf::new(Opcode::SCSI_CMD, flags::F | flags::W | 1);
        w.set_itt(7).set_u32(20, 8192).set_u32(24, 10);
        w.0[32] = 0x2a;
        c.pdu_received(&w.0, &[], Vec::new(), true);
        assert!(matches!(c.poll_event(), Some(ConnEvent::Command(r)) if r.tag == TaskTag(7)));
        let mut buf = SgList::new();
        buf.push(IoBuf::from_slice(&[0u8; 8192]));
        let fetch = Action::FetchData {
            id: CmdId(1),
            tag: TaskTag(7),
            buf,
            offset: 0,
            len: 8192,
        };
        c.handle_action(now, fetch);
        let [s] = c.dm.gets[..] else {
            panic!("one solicitation expected: {:?}", c.dm.gets);
        };
        assert_eq!((s.itt, s.offset, s.len, s.r2t_sn), (7, 0, 8192, R2tSn(0)));
        assert!(c.poll_event().is_none());
        c.solicited_data_received(7, s.ttt, 8192, true);
        assert!(matches!(
            c.poll_event(),
            Some(ConnEvent::DataOutDone { id: CmdId(1), data: Ok(sg) }) if sg.len() == 8192
        ));
        let rsp = Action::Respond {
            id: CmdId(1),
            tag: TaskTag(7),
            rsp: Response::good(),
        };
        c.handle_action(now, rsp);
        assert!(matches!(
            c.poll_event(),
            Some(ConnEvent::ResponseSent { id: CmdId(1) })
        ));

        // A read: its data goes by Put_Data, offered the status; this
        // datamover does not take it, so a SCSI Response follows.
        let mut r = BhsBuf::new(Opcode::SCSI_CMD, flags::F | flags::R | 1);
        r.set_itt(8).set_u32(20, 4096).set_u32(24, 11);
        r.0[32] = 0x28;
        c.pdu_received(&r.0, &[], Vec::new(), true);
        assert!(matches!(c.poll_event(), Some(ConnEvent::Command(r)) if r.tag == TaskTag(8)));
        let mut data = SgList::new();
        data.push(IoBuf::from_slice(&[7u8; 4096]));
        let rsp = Response {
            data: Some(data),
            data_len: 4096,
            ..Response::good()
        };
        c.handle_action(
            now,
            Action::Respond {
                id: CmdId(2),
                tag: TaskTag(8),
                rsp,
            },
        );
        assert_eq!(c.dm.puts, vec![(8, 4096, true)]);
        assert_eq!(
            c.dm.control,
            vec![Opcode::LOGIN_RSP, Opcode::SCSI_RSP, Opcode::SCSI_RSP]
        );
        assert!(matches!(
            c.poll_event(),
            Some(ConnEvent::ResponseSent { id: CmdId(2) })
        ));
    }

    /// A connection logged in through one Login Request (no security
    /// stage); `join` makes it a later connection of `join`'s session.
    fn logged_in(now: Instant, tsih: u16, cid: u16, join: Option<&Conn>) -> Conn {
        let cfg = Arc::new(IscsiConfig {
            targets: vec![IscsiTarget {
                name: TARGET.into(),
                alias: None,
                tpgt: 1,
                portals: vec![],
                auth: ChapAuth::default(),
            }],
            max_connections: 4,
            ..IscsiConfig::default()
        });
        let addr: SocketAddr = "127.0.0.1:3260".parse().unwrap();
        let mut c = Conn::new(now, cfg, addr, addr, u64::from(cid));
        let mut b = BhsBuf::new(Opcode::LOGIN_REQ, flags::T | (1 << 2) | 3);
        b.set_immediate();
        b.0[8..14].copy_from_slice(&[0x80, 0, 0, 0, 0, 1]);
        b.set_u16(14, tsih).set_u16(20, cid).set_u32(24, 10);
        let mut keys = vec![
            ("InitiatorName", "iqn.i"),
            ("TargetName", TARGET),
            ("SessionType", "Normal"),
        ];
        if join.is_none() {
            keys.push(("MaxConnections", "4"));
        }
        let bytes = pdu::Pdu::with_data(b, encode_text(&keys)).encode(false, false);
        assert_eq!(c.handle_input(now, &bytes), bytes.len());
        assert!(matches!(
            c.poll_event(),
            Some(ConnEvent::SessionRequest { tsih: t, .. }) if t == tsih
        ));
        if let Some(lead) = join {
            c.join_session(lead.session_seq().clone(), lead.params(), u32::from(cid));
        }
        c.accept_session(0x55);
        assert!(c.is_full_feature());
        assert!(matches!(c.poll_event(), Some(ConnEvent::LoggedIn)));
        let mut tx = TxQueue::new();
        c.poll_transmit(&mut tx);
        c
    }

    fn tur(itt: u32, cmd_sn: u32) -> Vec<u8> {
        let mut b = BhsBuf::new(Opcode::SCSI_CMD, flags::F | 1);
        b.set_itt(itt).set_u32(24, cmd_sn);
        pdu::Pdu::new(b).encode(false, false)
    }

    fn commands(c: &mut Conn) -> Vec<u64> {
        let mut v = Vec::new();
        while let Some(ev) = c.poll_event() {
            if let ConnEvent::Command(r) = ev {
                v.push(r.tag.0);
            }
        }
        v
    }

    /// Sends TMF `function` (immediate) with `itt` for `ref_itt` on LUN 0;
    /// returns what it asks of the core.
    fn tmf(c: &mut Conn, now: Instant, function: u8, itt: u32, ref_itt: u32) -> TmfRequest {
        let mut t = BhsBuf::new(Opcode::TMF_REQ, flags::F | function);
        t.set_immediate().set_itt(itt).set_word20(ref_itt);
        c.handle_input(now, &pdu::Pdu::new(t).encode(false, false));
        match c.poll_event() {
            Some(ConnEvent::TaskMgmt(r)) => r,
            other => panic!("no TMF for the core: {other:?}"),
        }
    }

    /// The opcodes and the response/reason byte (BHS byte 2) of what `c`
    /// sends next.
    fn sent(c: &mut Conn) -> Vec<(u8, u8)> {
        let mut tx = TxQueue::new();
        c.poll_transmit(&mut tx);
        let out = tx.drain_to_vec();
        let mut v = Vec::new();
        let mut at = 0;
        while at + BHS_LEN <= out.len() {
            let h = &out[at..at + BHS_LEN];
            v.push((h[0] & 0x3f, h[2]));
            let len = u32::from_be_bytes([0, h[5], h[6], h[7]]) as usize;
            at += BHS_LEN + usize::from(h[4]) * 4 + len + pad_len(len);
        }
        v
    }

    /// A task the core aborted is never answered; once the TMF is answered
    /// its ITT and its window slot are free again. Linux reuses an aborted
    /// command's ITT right after the TMF response: refusing it (Reject,
    /// ITT in use) left the new command hanging until the kernel's own
    /// timeout, and each abort shrank the window for good.
    #[test]
    fn an_aborted_tasks_itt_and_window_slot_are_free_once_the_tmf_is_answered() {
        let now = Instant::now();
        let mut c = logged_in(now, 0, 1, None);
        let max = c.session_seq().max_cmd_sn();
        c.handle_input(now, &tur(0x31, 10));
        assert_eq!(commands(&mut c), vec![0x31]);
        assert_eq!(c.session_seq().in_flight(), 1);
        let req = tmf(&mut c, now, tmf_fn::ABORT_TASK, 0x40, 0x31);
        assert_eq!(req.func, TmfFunction::AbortTask { tag: TaskTag(0x31) });
        // While the abort drains, the task is still outstanding: its ITT
        // is refused.
        c.handle_input(now, &tur(0x31, 11));
        assert!(commands(&mut c).is_empty());
        assert_eq!(sent(&mut c), vec![(Opcode::REJECT.0, 0x09)]);
        // The core reports the abort done (the task sends nothing).
        c.handle_action(
            now,
            Action::TmfDone {
                id: ferrite_core::TmfId(1),
                tag: req.tag,
                rsp: TmfResponse::Complete,
            },
        );
        assert_eq!(sent(&mut c), vec![(Opcode::TMF_RSP.0, tmf_rsp::COMPLETE)]);
        assert_eq!(c.session_seq().in_flight(), 0);
        assert_eq!(c.session_seq().task_owner(0x31), None);
        assert_eq!(
            c.session_seq().max_cmd_sn().diff(max),
            2,
            "the window slides on"
        );
        c.handle_input(now, &tur(0x31, 12));
        assert_eq!(commands(&mut c), vec![0x31], "the ITT is taken again");
        assert!(sent(&mut c).is_empty());

        // A LUN reset frees every task of the LUN it aborted; one the core
        // did not abort (answered "task does not exist" to an ABORT TASK)
        // keeps its ITT until it is answered.
        c.handle_input(now, &tur(0x32, 13));
        assert_eq!(commands(&mut c), vec![0x32]);
        let req = tmf(&mut c, now, tmf_fn::LUN_RESET, 0x41, RESERVED_TAG);
        c.handle_action(
            now,
            Action::TmfDone {
                id: ferrite_core::TmfId(2),
                tag: req.tag,
                rsp: TmfResponse::Complete,
            },
        );
        assert_eq!(sent(&mut c), vec![(Opcode::TMF_RSP.0, tmf_rsp::COMPLETE)]);
        assert_eq!(c.session_seq().in_flight(), 0);
        c.handle_input(now, &tur(0x33, 14));
        assert_eq!(commands(&mut c), vec![0x33]);
        let req = tmf(&mut c, now, tmf_fn::ABORT_TASK, 0x42, 0x33);
        c.handle_action(
            now,
            Action::TmfDone {
                id: ferrite_core::TmfId(3),
                tag: req.tag,
                rsp: TmfResponse::TaskNotFound,
            },
        );
        assert_eq!(
            sent(&mut c),
            vec![(Opcode::TMF_RSP.0, tmf_rsp::TASK_DOES_NOT_EXIST)]
        );
        assert_eq!(c.session_seq().task_owner(0x33), Some(c.member()));
        assert_eq!(c.session_seq().in_flight(), 1);
    }

    /// MC/S: a TMF answered on one connection frees the ITTs and window
    /// slots of the tasks it aborted on the others.
    #[test]
    fn a_tmf_answered_on_one_connection_frees_the_aborted_tasks_of_the_others() {
        let now = Instant::now();
        let mut a = logged_in(now, 0, 1, None);
        let mut b = logged_in(now, 0x55, 2, Some(&a));
        b.handle_input(now, &tur(0x51, 10));
        assert_eq!(commands(&mut b), vec![0x51]);
        let req = tmf(&mut a, now, tmf_fn::ABORT_TASK_SET, 0x60, RESERVED_TAG);
        for (_, scope) in a.session_seq().take_aborts() {
            b.abort_data(scope);
        }
        a.handle_action(
            now,
            Action::TmfDone {
                id: ferrite_core::TmfId(1),
                tag: req.tag,
                rsp: TmfResponse::Complete,
            },
        );
        let finished = a.session_seq().take_finished();
        assert_eq!(finished, vec![(a.member(), TaskScope::Lun([0; 8]))]);
        assert_eq!(a.session_seq().task_owner(0x51), Some(b.member()));
        b.forget_aborted(finished[0].1);
        assert_eq!(a.session_seq().task_owner(0x51), None);
        assert_eq!(a.session_seq().in_flight(), 0);
        a.handle_input(now, &tur(0x51, 11));
        assert_eq!(commands(&mut a), vec![0x51]);
    }

    /// MC/S: commands reach the core in CmdSN order across the session's
    /// connections; one ahead of a gap waits on its connection until
    /// another fills the gap (RFC 7143 §4.2.2.1); ITTs are unique per
    /// session; the window is the session's.
    #[test]
    fn cmd_sn_order_across_connections() {
        let now = Instant::now();
        let mut a = logged_in(now, 0, 1, None);
        let mut b = logged_in(now, 0x55, 2, Some(&a));
        assert!(a.session_seq().same(b.session_seq()));
        assert_eq!(b.params().max_connections, 4);
        // CmdSN 11 and 12 arrive on B first: held.
        b.handle_input(now, &tur(0x12, 12));
        b.handle_input(now, &tur(0x11, 11));
        assert!(commands(&mut b).is_empty());
        assert!(!b.release_held());
        // 10 arrives on A: it runs; B's held commands follow, in order.
        a.handle_input(now, &tur(0x10, 10));
        assert_eq!(commands(&mut a), vec![0x10]);
        assert!(b.release_held());
        assert_eq!(commands(&mut b), vec![0x11, 0x12]);
        assert_eq!(a.session_seq().exp_cmd_sn(), CmdSn(13));
        assert_eq!(a.session_seq().in_flight(), 3);
        // An ITT in use on A is refused on B (RFC 7143 §11.2.1.8).
        b.handle_input(now, &tur(0x10, 13));
        assert!(commands(&mut b).is_empty());
        let mut tx = TxQueue::new();
        b.poll_transmit(&mut tx);
        let out = tx.drain_to_vec();
        assert_eq!(out[0] & 0x3f, Opcode::REJECT.0);
        // The task owners are known session-wide.
        assert_eq!(a.session_seq().task_owner(0x10), Some(a.member()));
        assert_eq!(a.session_seq().task_owner(0x12), Some(b.member()));
        // A logout of B alone frees its window slots and ITTs and aborts
        // its tasks; A goes on.
        let mut lo = BhsBuf::new(Opcode::LOGOUT_REQ, flags::F | 1);
        lo.set_immediate()
            .set_itt(0x99)
            .set_u16(20, 2)
            .set_u32(24, 14);
        b.handle_input(now, &pdu::Pdu::new(lo).encode(false, false));
        let mut aborts = Vec::new();
        let mut closed = None;
        while let Some(ev) = b.poll_event() {
            match ev {
                ConnEvent::TaskMgmt(t) => aborts.push(t.func),
                ConnEvent::Closed { reason } => closed = Some(reason),
                _ => {}
            }
        }
        assert_eq!(closed, Some(CloseReason::ConnectionLogout));
        assert_eq!(aborts.len(), 2, "{aborts:?}");
        assert_eq!(a.session_seq().in_flight(), 1);
        assert_eq!(a.session_seq().task_owner(0x12), None);
        a.handle_input(now, &tur(0x13, 14));
        assert_eq!(commands(&mut a), vec![0x13]);
        // Reason 1 naming a CID no connection has: "CID not found"; naming
        // another live connection: that one is to be closed, A goes on.
        let mut c = logged_in(now, 0x55, 3, Some(&a));
        for (cid, code) in [(2u16, 1u8), (3, 0)] {
            let mut lo = BhsBuf::new(Opcode::LOGOUT_REQ, flags::F | 1);
            lo.set_immediate().set_itt(0x98).set_u16(20, cid);
            a.handle_input(now, &pdu::Pdu::new(lo).encode(false, false));
            let mut tx = TxQueue::new();
            a.poll_transmit(&mut tx);
            let out = tx.drain_to_vec();
            assert_eq!((out[0] & 0x3f, out[2]), (Opcode::LOGOUT_RSP.0, code));
        }
        assert!(a.is_full_feature());
        assert_eq!(a.session_seq().take_logouts(), vec![c.member()]);
        c.logged_out_elsewhere();
        assert!(matches!(
            c.poll_event(),
            Some(ConnEvent::Closed {
                reason: CloseReason::ConnectionLogout
            })
        ));
    }

    /// MC/S: a TMF on one connection stops the data of the affected tasks
    /// of the session's other connections too (RFC 7143 §11.5.1).
    #[test]
    fn tmf_on_one_connection_stops_data_on_the_others() {
        let now = Instant::now();
        let mut a = logged_in(now, 0, 1, None);
        let mut b = logged_in(now, 0x55, 2, Some(&a));
        // A 4 KiB WRITE(10) on B, waiting for its data.
        let mut w = BhsBuf::new(Opcode::SCSI_CMD, flags::F | flags::W | 1);
        w.set_itt(0x21).set_word20(4096).set_u32(24, 10);
        w.0[32] = 0x2a;
        w.0[38] = 8;
        b.handle_input(now, &pdu::Pdu::new(w).encode(false, false));
        assert_eq!(commands(&mut b), vec![0x21]);
        let pool = ferrite_reactor::buf::BufPool::new(64 * 1024, 4);
        b.handle_action(
            now,
            Action::FetchData {
                id: CmdId(7),
                tag: TaskTag(0x21),
                buf: pool.sg(4096),
                offset: 0,
                len: 4096,
            },
        );
        let mut tx = TxQueue::new();
        b.poll_transmit(&mut tx);
        assert_eq!(tx.drain_to_vec()[0] & 0x3f, Opcode::R2T.0);
        // ABORT TASK SET for LUN 0 arrives on A.
        let mut t = BhsBuf::new(Opcode::TMF_REQ, flags::F | tmf_fn::ABORT_TASK_SET);
        t.set_immediate()
            .set_itt(0x77)
            .set_word20(RESERVED_TAG)
            .set_u32(24, 11);
        a.handle_input(now, &pdu::Pdu::new(t).encode(false, false));
        assert!(matches!(a.poll_event(), Some(ConnEvent::TaskMgmt(_))));
        let shared = a.session_seq().take_aborts();
        assert_eq!(shared, vec![(a.member(), TaskScope::Lun([0; 8]))]);
        assert!(b.poll_event().is_none());
        b.abort_data(shared[0].1);
        assert!(matches!(
            b.poll_event(),
            Some(ConnEvent::DataOutDone {
                id: CmdId(7),
                data: Err(Abort::Aborted)
            })
        ));
        // The TMF's response belongs to A.
        assert_eq!(a.session_seq().tmf_owner(0x77), Some(a.member()));
    }

    #[test]
    fn cdb_with_ahs() {
        let c16: Vec<u8> = (0..16).collect();
        let (cdb, rl) = parse_cdb(&c16, &[]).unwrap();
        assert_eq!(cdb.len(), 16);
        assert_eq!(rl, 0);
        // 32-byte CDB: AHSLength = 16 + 1, padded to 20 bytes.
        let mut ahs = vec![0, 17, 1, 0];
        ahs.extend(16u8..32);
        let (cdb, _) = parse_cdb(&c16, &ahs).unwrap();
        assert_eq!(cdb.as_slice(), (0u8..32).collect::<Vec<_>>().as_slice());
        let ahs = [0, 5, 2, 0, 0, 0, 0x10, 0];
        assert_eq!(parse_cdb(&c16, &ahs).unwrap().1, 0x1000);
        assert!(parse_cdb(&c16, &[0, 40, 1, 0]).is_none());
        assert!(parse_cdb(&c16, &[0, 1, 9, 0]).is_none());
    }

    #[test]
    fn group_chap_users_replace_the_targets_for_matching_initiators() {
        let user = |u: &str| crate::chap::ChapUser {
            user: u.into(),
            secret: format!("{u}-secret-123").into_bytes(),
        };
        let target = |name: &str| IscsiTarget {
            name: name.into(),
            alias: None,
            tpgt: 1,
            portals: vec![],
            auth: ChapAuth {
                incoming: vec![user("alice")],
                outgoing: Some(user("tgt")),
            },
        };
        let cfg = IscsiConfig {
            targets: vec![target("iqn.t:a"), target("iqn.t:b")],
            group_auth: vec![GroupAuth {
                target: "iqn.t:a".into(),
                initiators: vec!["iqn.i:admin*".into()],
                incoming: vec![user("bob")],
            }],
            ..IscsiConfig::default()
        };
        let a = cfg.target_auth("iqn.t:a", "iqn.i:admin-1").unwrap();
        assert_eq!(a.incoming, vec![user("bob")]);
        assert_eq!(
            a.outgoing,
            Some(user("tgt")),
            "mutual CHAP stays the target's"
        );
        let a = cfg.target_auth("iqn.t:a", "iqn.i:other").unwrap();
        assert_eq!(a.incoming, vec![user("alice")]);
        // Another target's groups do not apply.
        let a = cfg.target_auth("iqn.t:b", "iqn.i:admin-1").unwrap();
        assert_eq!(a.incoming, vec![user("alice")]);
        assert!(cfg.target_auth("iqn.t:none", "iqn.i:admin-1").is_none());
    }
}
