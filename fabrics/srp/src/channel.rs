//! The SRP target channel: a sans-IO state machine for one RDMA channel
//! (one I_T nexus), what ib_srpt's `srpt_rdma_ch` is.
//!
//! It reads received IUs ([`Channel::handle_recv`]), turns them into core
//! requests ([`Event::Submit`], [`Event::TaskMgmt`]), carries out the core's
//! [`Action`]s ([`Channel::handle_action`]) and says what to put on the
//! queue pair as values ([`Channel::poll_transmit`]): SENDs of IUs and RDMA
//! READ/WRITE transfers between `SgList`s and the initiator's buffers. The
//! driver reports back with [`Channel::send_done`], [`Channel::rdma_done`]
//! and [`Channel::recv_reposted`]. No sockets, queue pairs or clocks here.
//!
//! Credits (SRP r16a §5.5 request limit): the login grants
//! [`ChannelConfig::credits`]; every SRP_CMD and SRP_TSK_MGMT spends one;
//! a credit comes back (REQUEST LIMIT DELTA of SRP_RSP, SRP_CRED_REQ or
//! SRP_AER_REQ) only once the receive buffer it used has been reposted
//! *and* its task has ended, so an initiator that keeps to its request
//! limit can never find the target without a receive posted, and never has
//! more tasks outstanding than the limit (as ib_srpt bounds them). [`ChannelConfig::reserve`] more receives are
//! kept for the IUs that spend no credit (SRP_I_LOGOUT and the responses to
//! the target's own SRP_CRED_REQ and SRP_AER_REQ, of which at most one is
//! outstanding at a time).
//!
//! Flow control: while the core makes the channel's session wait for data
//! memory (`Session::data_waiting`), the driver holds the channel's credits
//! ([`Channel::hold_credits`]): every IU then carries a REQUEST LIMIT DELTA
//! of 0, so the request limit stops growing and the initiator's commands
//! drain it. Once nothing waits, the credits withheld go back in the next
//! response, or in an SRP_CRED_REQ when no response is coming.

use std::borrow::Cow;
use std::collections::{HashMap, VecDeque};

use ferrite_core::{
    Abort, Action, CmdId, CmdRequest, DataDir, Residual, Response, TaskAttr, TaskTag, TmfFunction,
    TmfRequest, TmfResponse,
};
use ferrite_rdma::RemoteSeg;
use ferrite_reactor::buf::SgList;
use ferrite_scsi::{Lun, Sense, Status};
use smallvec::SmallVec;

use crate::iu::{self, DataBuf, IuError, IuType, TLogoutReason};

/// Target-side limits of a channel, fixed at login.
#[derive(Clone, Debug)]
pub struct ChannelConfig {
    /// Size of the target's receive buffers: the largest IU an initiator
    /// may send. Before login, the most this target accepts; the accepted
    /// channel's copy holds what was negotiated (the initiator's REQUESTED
    /// MAXIMUM INITIATOR TO TARGET IU LENGTH, which SRP_LOGIN_RSP echoes).
    pub max_it_iu_len: u32,
    /// Largest IU the target sends (SRP_RSP with sense, SRP_AER_REQ).
    pub max_ti_iu_len: u32,
    /// The request limit granted at login: receives reserved for SRP_CMD
    /// and SRP_TSK_MGMT.
    pub credits: u32,
    /// Receives for IUs that spend no credit (at least 1).
    pub reserve: u32,
    /// This target port's identifier (SRP r16a §4.7): logins naming another
    /// port are rejected.
    pub target_port_id: [u8; 16],
    /// Grant SRP-2 immediate data to initiators that ask for it.
    pub immediate_data: bool,
}

/// The largest IU the target takes by default: room for the Linux
/// initiator's 8 KiB of immediate data behind its 68-byte SRP_CMD
/// (`max_imm_data`, `SRP_IMM_DATA_OFFSET`), twice over.
pub const DEFAULT_MAX_IT_IU_LEN: u32 = 16 * 1024 + 256;

impl Default for ChannelConfig {
    fn default() -> ChannelConfig {
        ChannelConfig {
            max_it_iu_len: DEFAULT_MAX_IT_IU_LEN,
            max_ti_iu_len: 512,
            credits: 64,
            reserve: 2,
            target_port_id: [0; 16],
            immediate_data: true,
        }
    }
}

impl ChannelConfig {
    /// How many receive buffers of `max_it_iu_len` bytes the driver posts
    /// before accepting the connection.
    pub fn recv_count(&self) -> u32 {
        self.credits + self.reserve.max(1)
    }
}

/// Why a login is refused, with the SRP_LOGIN_REJ reason it is answered
/// with ([`LoginRefusal::reason`], SRP r16a §6.4 table 19). The channel
/// decides the first six; the others are a driver's policy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LoginRefusal {
    /// The private data is too short for either login layout.
    Short { got: usize },
    /// The IU type is not SRP_LOGIN_REQ.
    NotLoginReq(u8),
    /// The target port id names another target port.
    ForeignTargetPort([u8; 16]),
    /// REQUESTED MAXIMUM INITIATOR TO TARGET IU LENGTH above what the
    /// target receives.
    IuTooLarge { asked: u32, max: u32 },
    /// A requested IU length that cannot hold an SRP_CMD.
    IuTooSmall(u32),
    /// REQUIRED BUFFER FORMATS the target does not support.
    UnsupportedFormats(u16),
    /// MULTI-CHANNEL ACTION 2 or 3, which SRP reserves.
    ReservedMultiChannel(u8),
    /// The target port is disabled.
    PortDisabled,
    /// The target port went away while the request waited.
    PortRemoved,
    /// The request arrived on this HCA port (the listening address is
    /// shared), not on the one the target port is configured for.
    OtherHcaPort(u8),
    /// The target could not set the channel up (queue pair, buffers).
    Resources(&'static str),
    /// The I_T nexus already has this many channels, the most it may have.
    ChannelLimit(usize),
    /// The target port has initiator groups and no default LUNs, and the
    /// initiator port is in none of the groups (`Target::admits`, the rule
    /// iSCSI answers with 0202h).
    NotAdmitted,
}

impl LoginRefusal {
    /// The SRP_LOGIN_REJ REASON (SRP r16a §6.4).
    pub fn reason(&self) -> iu::LoginRejReason {
        use iu::LoginRejReason as R;
        match self {
            LoginRefusal::IuTooLarge { .. } => R::IT_IU_LENGTH_TOO_LARGE,
            LoginRefusal::ForeignTargetPort(_) => R::UNABLE_TO_ASSOCIATE,
            LoginRefusal::UnsupportedFormats(_) => R::UNSUPPORTED_DESCRIPTOR_FORMAT,
            LoginRefusal::Resources(_) => R::INSUFFICIENT_RESOURCES,
            LoginRefusal::ChannelLimit(_) => R::CHANNEL_LIMIT_REACHED,
            // 00010000h: unable to establish the channel, no reason
            // specified (SRP has no code of its own for these; table 19
            // has none for access control either: its other codes name
            // resources, IU length, the target port, formats and channel
            // counts).
            LoginRefusal::Short { .. }
            | LoginRefusal::NotLoginReq(_)
            | LoginRefusal::IuTooSmall(_)
            | LoginRefusal::ReservedMultiChannel(_)
            | LoginRefusal::PortDisabled
            | LoginRefusal::PortRemoved
            | LoginRefusal::OtherHcaPort(_)
            | LoginRefusal::NotAdmitted => R::UNABLE_TO_ESTABLISH,
        }
    }

    /// The SRP_LOGIN_REJ answering `tag` for this refusal, naming the
    /// buffer formats the target supports.
    pub fn reject(&self, tag: u64) -> iu::LoginRej {
        iu::LoginRej {
            tag,
            reason: self.reason(),
            buf_fmt: SUPPORTED_BUF_FMT,
        }
    }
}

impl std::fmt::Display for LoginRefusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LoginRefusal::Short { got } => write!(
                f,
                "private data of {got} bytes is shorter than an SRP_LOGIN_REQ ({} or {} bytes)",
                iu::LOGIN_REQ_RDMA_LEN,
                iu::LOGIN_REQ_LEN
            ),
            LoginRefusal::NotLoginReq(t) => write!(f, "IU type {t:#04x} is not SRP_LOGIN_REQ"),
            LoginRefusal::ForeignTargetPort(id) => {
                write!(f, "target port id 0x")?;
                for b in id {
                    write!(f, "{b:02x}")?;
                }
                write!(f, " names another target port")
            }
            LoginRefusal::IuTooLarge { asked, max } => write!(
                f,
                "requested initiator-to-target IU length {asked} is above this target's {max}"
            ),
            LoginRefusal::IuTooSmall(n) => write!(
                f,
                "requested initiator-to-target IU length {n} cannot hold an SRP_CMD"
            ),
            LoginRefusal::UnsupportedFormats(fmt) => write!(
                f,
                "required buffer formats {fmt:#06x} include some this target lacks (it has {SUPPORTED_BUF_FMT:#06x})"
            ),
            LoginRefusal::ReservedMultiChannel(a) => {
                write!(f, "MULTI-CHANNEL ACTION {a} is reserved")
            }
            LoginRefusal::PortDisabled => write!(f, "target port disabled"),
            LoginRefusal::PortRemoved => write!(f, "target port removed"),
            LoginRefusal::OtherHcaPort(p) => write!(
                f,
                "arrived on HCA port {p}, which this target port does not serve"
            ),
            LoginRefusal::Resources(what) => write!(f, "no resources for the channel: {what}"),
            LoginRefusal::ChannelLimit(n) => {
                write!(
                    f,
                    "the I_T nexus already has {n} channels, the most it may have"
                )
            }
            LoginRefusal::NotAdmitted => write!(
                f,
                "initiator port in none of the target port's initiator groups, and the port has no default LUNs"
            ),
        }
    }
}

/// The data buffer descriptor formats this target takes (SRP r16a §6.2).
pub const SUPPORTED_BUF_FMT: u16 = iu::BUF_FORMAT_DIRECT | iu::BUF_FORMAT_INDIRECT;

/// The outcome of a login request.
#[derive(Debug)]
pub enum Login {
    /// Accept: answer with `rsp` (the connection's accept private data)
    /// after posting [`ChannelConfig::recv_count`] receives of the
    /// channel's (negotiated) `max_it_iu_len`. `req` is the request as
    /// parsed and `layout` the form it came in.
    Accept {
        channel: Box<Channel>,
        rsp: iu::LoginRsp,
        req: iu::LoginReq,
        layout: iu::LoginLayout,
    },
    /// Reject with `rej` (the reject's private data) because of `why`.
    Reject {
        rej: iu::LoginRej,
        why: LoginRefusal,
    },
}

/// A driver-chosen handle for one transmit, echoed in its completion.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct OpId(pub u64);

/// One piece of an RDMA transfer: `remote.len` bytes between `buf[offset..]`
/// and the initiator's `remote` buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Xfer {
    pub remote: RemoteSeg,
    pub offset: u32,
}

/// What the driver puts on the queue pair, in this order.
#[derive(Debug)]
pub enum Transmit {
    /// SEND `iu`; report with [`Channel::send_done`].
    Send { op: OpId, iu: Vec<u8> },
    /// RDMA READ every `xfers` entry into `buf`; report with
    /// [`Channel::rdma_done`], handing `buf` back.
    RdmaRead {
        op: OpId,
        buf: SgList,
        xfers: SmallVec<[Xfer; 4]>,
    },
    /// RDMA WRITE from `buf` to every `xfers` entry. RC ordering puts the
    /// data before the SRP_RSP that follows; report with
    /// [`Channel::rdma_done`].
    RdmaWrite {
        op: OpId,
        buf: SgList,
        xfers: SmallVec<[Xfer; 4]>,
    },
    /// Disconnect the queue pair (after the SENDs before it).
    Disconnect,
}

/// What the driver tells the core.
#[derive(Debug)]
pub enum Event {
    /// Call `Session::submit`.
    Submit(CmdRequest),
    /// Call `Session::task_mgmt`.
    TaskMgmt(TmfRequest),
    /// Call `Session::data_out_done`.
    DataOut {
        id: CmdId,
        result: Result<SgList, Abort>,
    },
    /// Call `Session::response_sent`.
    ResponseSent(CmdId),
    /// The channel ended (logout, protocol error or connection loss): end
    /// the session; the core aborts what it still holds.
    Closed,
}

/// Channel state; only moves forward.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChannelState {
    /// Logged in: IUs flow.
    Live,
    /// A logout was received or sent: nothing more is accepted; responses
    /// still owed to the core are completed without being sent.
    Closed,
}

/// A task's life inside the channel.
#[derive(Debug)]
enum TaskState {
    /// Waiting for indirect descriptor tables to arrive by RDMA READ
    /// (`pending` reads left); the command is not yet in the core.
    FetchingTables { req: CmdRequest, pending: u8 },
    /// In the core; waiting for `FetchData` or `Respond`.
    Submitted,
    /// Write data is being read from the initiator.
    FetchingData { id: CmdId },
    /// SRP_RSP (and data) on the wire; waiting for its send completion.
    Responding { id: CmdId },
    /// A task management function in the core.
    Tmf { func: TmfFunction },
    /// Its SRP_RSP is on the wire.
    TmfResponding,
}

#[derive(Debug)]
struct Task {
    state: TaskState,
    lun: [u8; 8],
    data_out: DataBuf,
    data_in: DataBuf,
    /// The SRP_CMD whose [`DataBuf::Immediate`] data-out this is, kept
    /// until the task ends (the core may fetch the data in pieces).
    imm: Option<Vec<u8>>,
}

#[derive(Clone, Copy, Debug)]
enum OpKind {
    Table { tag: u64, out: bool },
    DataOut { tag: u64 },
    DataIn,
    Rsp { tag: u64 },
    Control,
}

/// Most descriptors one data buffer may have (a 64 KiB table).
pub const MAX_TABLE_DESCS: usize = 4096;

/// Descriptor tables a channel fetches at a time; the commands behind
/// them wait their turn. The tables are held outside the data memory
/// budget, so this bounds them: at most this many tables of at most
/// 64 KiB per channel, whatever an initiator that never lets an RDMA READ
/// complete sends.
pub const MAX_TABLE_FETCHES: usize = 16;

/// Tags of target-initiated IUs carry this prefix so they never collide in
/// logs with initiator tags.
const TARGET_TAG_BASE: u64 = 0x5250_0000_0000_0000;

/// One SRP RDMA channel.
#[derive(Debug)]
pub struct Channel {
    cfg: ChannelConfig,
    state: ChannelState,
    /// Credits the initiator holds, as far as the target knows.
    granted: u32,
    /// Credit-spending IUs whose receive buffers were reposted.
    reposted: u64,
    /// Credit-spending IUs whose task has ended (response sent or owed
    /// no more).
    finished: u64,
    /// Credits returned so far.
    returned: u64,
    /// Kinds (credit or not) of received IUs whose buffers are not yet
    /// reposted, in order.
    unreposted: VecDeque<bool>,
    tasks: HashMap<u64, Task>,
    ops: HashMap<OpId, OpKind>,
    next_op: u64,
    next_tag: u64,
    /// The outstanding SRP_CRED_REQ or SRP_AER_REQ, by tag.
    target_req: Option<u64>,
    aens: VecDeque<(Lun, Sense)>,
    tx: VecDeque<Transmit>,
    events: VecDeque<Event>,
    closed_reported: bool,
    /// SRP-2 immediate data, granted at login: where it starts in an
    /// SRP_CMD.
    imm_data_offset: Option<u16>,
    /// The session's commands wait for data memory: no credit goes back.
    credits_held: bool,
    /// Descriptor table reads on the wire.
    table_reads: usize,
    /// Commands whose tables are not yet asked for, oldest first, by tag.
    table_queue: VecDeque<u64>,
}

/// Answers a login request (SRP r16a §6.2-§6.4, SRP-2 immediate data),
/// given as the connection request's private data in either layout
/// ([`iu::LoginReq::parse_layout`]).
pub fn login(cfg: ChannelConfig, private_data: &[u8]) -> Login {
    let refuse = |tag: u64, why: LoginRefusal| Login::Reject {
        rej: why.reject(tag),
        why,
    };
    let (r, layout) = match iu::LoginReq::parse_layout(private_data) {
        Ok(r) => r,
        Err(IuError::WrongType(t)) => {
            return refuse(request_tag(private_data), LoginRefusal::NotLoginReq(t));
        }
        Err(_) => {
            return refuse(
                0,
                LoginRefusal::Short {
                    got: private_data.len(),
                },
            );
        }
    };
    // §6.2: a REQUESTED MAXIMUM INITIATOR TO TARGET IU LENGTH the target
    // cannot receive is rejected with reason 00010002h.
    if r.req_it_iu_len > cfg.max_it_iu_len {
        let why = LoginRefusal::IuTooLarge {
            asked: r.req_it_iu_len,
            max: cfg.max_it_iu_len,
        };
        return refuse(r.tag, why);
    }
    if (r.req_it_iu_len as usize) < iu::CMD_LEN {
        return refuse(r.tag, LoginRefusal::IuTooSmall(r.req_it_iu_len));
    }
    // §6.2: REQUIRED BUFFER FORMATS the target does not support: 00010004h.
    if r.req_buf_fmt & !SUPPORTED_BUF_FMT != 0 {
        return refuse(r.tag, LoginRefusal::UnsupportedFormats(r.req_buf_fmt));
    }
    // §4.7, §6.4: a login for another target port cannot be associated
    // with this one: 00010003h.
    if r.target_port_id != cfg.target_port_id {
        return refuse(r.tag, LoginRefusal::ForeignTargetPort(r.target_port_id));
    }
    let action = r.multi_channel_action();
    if action != iu::MULTICHAN_SINGLE && action != iu::MULTICHAN_MULTI {
        return refuse(r.tag, LoginRefusal::ReservedMultiChannel(action));
    }
    // SRP-2: immediate data is granted when asked for with an offset that
    // leaves room for the SRP_CMD and its immediate data descriptor, inside
    // the IU length (ib_srpt grants it the same way).
    let imm = (cfg.immediate_data
        && r.immediate_requested()
        && r.imm_data_offset as usize >= iu::CMD_LEN + iu::IMM_DESC_LEN
        && u32::from(r.imm_data_offset) < r.req_it_iu_len)
        .then_some(r.imm_data_offset);
    let rsp = iu::LoginRsp {
        tag: r.tag,
        req_lim_delta: cfg.credits,
        max_it_iu_len: r.req_it_iu_len,
        max_ti_iu_len: cfg.max_ti_iu_len,
        buf_fmt: SUPPORTED_BUF_FMT,
        // Other channels of the same initiator port are the driver's
        // business (SRP r16a §6.2 MULTI-CHANNEL ACTION); it sets the
        // MULTI-CHANNEL RESULT after closing or joining them.
        rsp_flags: iu::LOGIN_RSP_NO_CHANNEL
            | if imm.is_some() {
                iu::LOGIN_RSP_IMMED_SUPP
            } else {
                0
            },
    };
    let cfg = ChannelConfig {
        max_it_iu_len: r.req_it_iu_len,
        ..cfg
    };
    let mut channel = Box::new(Channel::new(cfg));
    channel.imm_data_offset = imm;
    Login::Accept {
        channel,
        rsp,
        req: r,
        layout,
    }
}

/// The tag of a login request that did not parse, where its layout puts
/// it (bytes 8..16 of the IU, 0..8 of the RDMA CM layout).
fn request_tag(b: &[u8]) -> u64 {
    let at = if b.len() >= iu::LOGIN_REQ_LEN { 8 } else { 0 };
    b.get(at..at + 8)
        .and_then(|t| <[u8; 8]>::try_from(t).ok())
        .map_or(0, u64::from_be_bytes)
}

fn abort_cmd_logout(e: IuError) -> TLogoutReason {
    match e {
        IuError::DataOutFormat(_) => TLogoutReason::UNSUPPORTED_DATA_OUT_FORMAT,
        IuError::DataInFormat(_) => TLogoutReason::UNSUPPORTED_DATA_IN_FORMAT,
        IuError::DataOutCount => TLogoutReason::INVALID_DATA_OUT_COUNT,
        IuError::DataInCount => TLogoutReason::INVALID_DATA_IN_COUNT,
        IuError::Short { .. } | IuError::WrongType(_) => TLogoutReason::NO_REASON,
    }
}

/// The part of `segs` covering data bytes `[offset, offset+len)`, as
/// transfers at the same offsets in the local buffer.
fn map_range(segs: &[RemoteSeg], offset: u64, len: u64) -> Option<SmallVec<[Xfer; 4]>> {
    let mut out = SmallVec::new();
    let mut pos = 0u64;
    let end = offset.checked_add(len)?;
    for s in segs {
        let (a, b) = (pos, pos + s.len as u64);
        pos = b;
        let (lo, hi) = (a.max(offset), b.min(end));
        if lo >= hi {
            continue;
        }
        out.push(Xfer {
            remote: RemoteSeg {
                addr: s.addr.checked_add(lo - a)?,
                rkey: s.rkey,
                len: (hi - lo) as u32,
            },
            offset: u32::try_from(lo).ok()?,
        });
    }
    (pos >= end).then_some(out)
}

impl Channel {
    fn new(cfg: ChannelConfig) -> Channel {
        Channel {
            granted: cfg.credits,
            cfg,
            state: ChannelState::Live,
            reposted: 0,
            finished: 0,
            returned: 0,
            unreposted: VecDeque::new(),
            tasks: HashMap::new(),
            ops: HashMap::new(),
            next_op: 1,
            next_tag: TARGET_TAG_BASE,
            target_req: None,
            aens: VecDeque::new(),
            tx: VecDeque::new(),
            events: VecDeque::new(),
            closed_reported: false,
            imm_data_offset: None,
            credits_held: false,
            table_reads: 0,
            table_queue: VecDeque::new(),
        }
    }

    /// The configuration the channel was accepted with.
    pub fn config(&self) -> &ChannelConfig {
        &self.cfg
    }

    /// Where immediate data starts in an SRP_CMD, when the login granted
    /// SRP-2 immediate data.
    pub fn immediate_data_offset(&self) -> Option<u16> {
        self.imm_data_offset
    }

    /// The current state.
    pub fn state(&self) -> ChannelState {
        self.state
    }

    /// Credits the initiator holds as the target counts them.
    pub fn credits_granted(&self) -> u32 {
        self.granted
    }

    /// Holds the credits (`true`) while the core makes this channel's
    /// session wait for data memory: every IU carries a REQUEST LIMIT DELTA
    /// of 0 and no SRP_CRED_REQ goes out, so the initiator's request limit
    /// stops growing and it sends no more commands than the credits it
    /// still has. Released (`false`), the credits withheld go back in the
    /// next response, or at once in an SRP_CRED_REQ when no response is
    /// coming to carry them. Credits already granted are never taken back.
    pub fn hold_credits(&mut self, held: bool) {
        if self.credits_held == held {
            return;
        }
        self.credits_held = held;
        if !held {
            self.next_target_req();
        }
    }

    /// Tasks (commands and TMFs) the channel knows.
    pub fn tasks(&self) -> usize {
        self.tasks.len()
    }

    /// True when the task with this initiator tag belongs to this channel:
    /// a driver running several channels on one I_T nexus (SRP r16a §6.2
    /// MULTI-CHANNEL ACTION 1) routes the core's actions by it.
    pub fn has_task(&self, tag: u64) -> bool {
        self.tasks.contains_key(&tag)
    }

    /// Ends the channel from the target side with `reason` (SRP r16a §6.6
    /// SRP_T_LOGOUT), e.g. [`TLogoutReason::MULTI_CHANNEL_ACTION`] when a
    /// new login of the same initiator port asked for its channels to be
    /// terminated.
    pub fn terminate(&mut self, reason: TLogoutReason) {
        self.logout(reason);
    }

    /// The next thing to put on the queue pair.
    pub fn poll_transmit(&mut self) -> Option<Transmit> {
        self.tx.pop_front()
    }

    /// The next thing to tell the core.
    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    fn op(&mut self, kind: OpKind) -> OpId {
        let id = OpId(self.next_op);
        self.next_op += 1;
        self.ops.insert(id, kind);
        id
    }

    fn send(&mut self, kind: OpKind, iu: Vec<u8>) {
        let op = self.op(kind);
        self.tx.push_back(Transmit::Send { op, iu });
    }

    /// Credits that may be returned now: a credit comes back once its IU's
    /// buffer is reposted and its task has ended.
    fn returnable(&self) -> u64 {
        self.reposted.min(self.finished) - self.returned
    }

    fn take_delta(&mut self) -> u32 {
        if self.credits_held {
            return 0;
        }
        let d = u32::try_from(self.returnable()).unwrap_or(u32::MAX);
        self.returned += d as u64;
        self.granted += d;
        d
    }

    /// Ends the channel from the target side: SRP_T_LOGOUT, then disconnect.
    fn logout(&mut self, reason: TLogoutReason) {
        if self.state == ChannelState::Closed {
            return;
        }
        let tag = self.next_tag;
        self.next_tag += 1;
        // SRP r16a §6.6: the target reports why it ends the channel.
        self.send(OpKind::Control, iu::t_logout(tag, reason).to_vec());
        self.tx.push_back(Transmit::Disconnect);
        self.close();
    }

    fn close(&mut self) {
        self.state = ChannelState::Closed;
        // Commands still waiting for their tables never reached the core.
        self.table_queue.clear();
        self.tasks
            .retain(|_, t| !matches!(t.state, TaskState::FetchingTables { .. }));
        if !self.closed_reported {
            self.closed_reported = true;
            self.events.push_back(Event::Closed);
        }
    }

    /// The queue pair disconnected or failed: nothing more is sent.
    pub fn connection_lost(&mut self) {
        self.tx.clear();
        self.close();
    }

    /// A receive completed with this IU. The driver reposts the buffer and
    /// then calls [`Channel::recv_reposted`].
    pub fn handle_recv(&mut self, iu_bytes: &[u8]) {
        self.recv(Cow::Borrowed(iu_bytes));
    }

    /// [`Channel::handle_recv`] with the IU already copied out of the
    /// receive buffer: an SRP_CMD carrying immediate data keeps it as the
    /// task's data instead of copying it again.
    pub fn handle_recv_owned(&mut self, iu_bytes: Vec<u8>) {
        self.recv(Cow::Owned(iu_bytes));
    }

    fn recv(&mut self, iu: Cow<'_, [u8]>) {
        let iu_bytes: &[u8] = &iu;
        let t = iu::iu_type(iu_bytes);
        let spends_credit = matches!(t, Some(IuType::CMD) | Some(IuType::TSK_MGMT));
        // Only a credit actually spent comes back when the buffer is reposted.
        let spent = spends_credit && self.granted > 0 && self.state == ChannelState::Live;
        self.unreposted.push_back(spent);
        if self.state == ChannelState::Closed {
            return;
        }
        if spends_credit {
            // §5.5: an initiator never has more requests outstanding than its
            // request limit; one that does is answered BUSY.
            if self.granted == 0 {
                let tag = iu::iu_tag(iu_bytes).unwrap_or(0);
                let rsp = iu::Rsp {
                    tag,
                    status: Status::BUSY.0,
                    ..iu::Rsp::default()
                };
                self.send(OpKind::Control, rsp.encode());
                return;
            }
            self.granted -= 1;
        }
        match t {
            Some(IuType::CMD) => self.handle_cmd(iu),
            Some(IuType::TSK_MGMT) => self.handle_tsk_mgmt(iu_bytes),
            Some(IuType::I_LOGOUT) => {
                // §6.5: the initiator ends the channel.
                self.tx.push_back(Transmit::Disconnect);
                self.close();
            }
            Some(IuType::CRED_RSP) | Some(IuType::AER_RSP) => {
                let tag = iu::iu_tag(iu_bytes);
                if tag.is_some() && tag == self.target_req {
                    self.target_req = None;
                    self.next_target_req();
                } else {
                    self.logout(TLogoutReason::UNEXPECTED_RESPONSE);
                }
            }
            _ => self.logout(TLogoutReason::INVALID_IU_TYPE),
        }
    }

    /// One receive buffer went back on the receive queue.
    pub fn recv_reposted(&mut self) {
        if self.unreposted.pop_front() == Some(true) {
            self.reposted += 1;
        }
        self.next_target_req();
    }

    fn handle_cmd(&mut self, b: Cow<'_, [u8]>) {
        // SRP-2: the immediate data descriptor format exists only on a
        // channel whose login granted it; elsewhere it is unsupported.
        let cmd = match iu::Cmd::parse_imm(&b, self.imm_data_offset) {
            Ok(c) => c,
            Err(e) => return self.logout(abort_cmd_logout(e)),
        };
        if self.tasks.contains_key(&cmd.tag) {
            // SAM-5 §5.9: a task tag already in use is an overlapped command.
            let sense = Sense::OVERLAPPED_COMMANDS_ATTEMPTED.to_fixed();
            self.finished += 1;
            let rsp = iu::Rsp {
                tag: cmd.tag,
                req_lim_delta: self.take_delta(),
                status: Status::CHECK_CONDITION.0,
                sense: sense.to_vec(),
                ..iu::Rsp::default()
            };
            self.send(OpKind::Control, rsp.encode());
            return;
        }
        let dir = match (&cmd.data_out, &cmd.data_in) {
            (DataBuf::None, DataBuf::None) => DataDir::None,
            (_, DataBuf::None) => DataDir::Write,
            (DataBuf::None, _) => DataDir::Read,
            _ => DataDir::Bidi,
        };
        let clamp = |v: u64| u32::try_from(v).unwrap_or(u32::MAX);
        let (expected_len, expected_read_len) = match dir {
            DataDir::None => (0, 0),
            DataDir::Write => (clamp(cmd.data_out.total()), 0),
            DataDir::Read => (clamp(cmd.data_in.total()), 0),
            DataDir::Bidi => (clamp(cmd.data_out.total()), clamp(cmd.data_in.total())),
        };
        let attr = match cmd.task_attr {
            iu::TASK_ATTR_HEAD_OF_QUEUE => TaskAttr::HeadOfQueue,
            iu::TASK_ATTR_ORDERED => TaskAttr::Ordered,
            iu::TASK_ATTR_ACA => TaskAttr::Aca,
            _ => TaskAttr::Simple,
        };
        let req = CmdRequest {
            // An address the target never hands out maps to no LUN: the core
            // answers LOGICAL UNIT NOT SUPPORTED from `lun_raw`.
            lun: Lun::decode(cmd.lun).unwrap_or(Lun(u16::MAX)),
            lun_raw: cmd.lun,
            tag: TaskTag(cmd.tag),
            cdb: cmd.cdb.clone(),
            attr,
            dir,
            expected_len,
            expected_read_len,
        };
        // A table larger than any this target accepts would make it
        // allocate whatever the initiator asks for.
        for (buf, reason) in [
            (&cmd.data_out, TLogoutReason::INVALID_DATA_OUT_COUNT),
            (&cmd.data_in, TLogoutReason::INVALID_DATA_IN_COUNT),
        ] {
            if let DataBuf::Table { table, .. } = buf
                && table.len as usize > MAX_TABLE_DESCS * iu::DIRECT_DESC_LEN
            {
                return self.logout(reason);
            }
        }
        // §5.2.3: descriptor tables that are not all in the IU are fetched
        // from the initiator by RDMA READ before the command can run, a
        // few commands' at a time (`start_table_reads`).
        let pending = [&cmd.data_out, &cmd.data_in]
            .iter()
            .filter(|b| matches!(b, DataBuf::Table { .. }))
            .count() as u8;
        if pending > 0 {
            self.table_queue.push_back(cmd.tag);
        }
        let state = if pending > 0 {
            TaskState::FetchingTables { req, pending }
        } else {
            self.events.push_back(Event::Submit(req));
            TaskState::Submitted
        };
        self.tasks.insert(
            cmd.tag,
            Task {
                state,
                lun: cmd.lun,
                imm: matches!(cmd.data_out, DataBuf::Immediate { .. }).then(|| b.into_owned()),
                data_out: cmd.data_out,
                data_in: cmd.data_in,
            },
        );
        self.start_table_reads();
    }

    /// Asks for the descriptor tables of the commands waiting for them, as
    /// long as fewer than [`MAX_TABLE_FETCHES`] reads are on the wire.
    fn start_table_reads(&mut self) {
        while self.table_reads < MAX_TABLE_FETCHES && self.state == ChannelState::Live {
            let Some(tag) = self.table_queue.pop_front() else {
                return;
            };
            // A task aborted meanwhile is gone.
            let Some(task) = self.tasks.get(&tag) else {
                continue;
            };
            let tables: SmallVec<[(RemoteSeg, bool); 2]> =
                [(&task.data_out, true), (&task.data_in, false)]
                    .into_iter()
                    .filter_map(|(b, out)| match b {
                        DataBuf::Table { table, .. } => Some((*table, out)),
                        _ => None,
                    })
                    .collect();
            for (table, out) in tables {
                let op = self.op(OpKind::Table { tag, out });
                self.tx.push_back(Transmit::RdmaRead {
                    op,
                    buf: SgList::zeroed(table.len as usize),
                    xfers: smallvec::smallvec![Xfer {
                        remote: table,
                        offset: 0
                    }],
                });
                self.table_reads += 1;
            }
        }
    }

    fn handle_tsk_mgmt(&mut self, b: &[u8]) {
        let t = match iu::TskMgmt::parse(b) {
            Ok(t) => t,
            Err(_) => return self.logout(TLogoutReason::NO_REASON),
        };
        // SRP r16a §6.7 table 21: the functions SRP defines.
        let func = match t.func {
            iu::TskFunc::ABORT_TASK => Some(TmfFunction::AbortTask {
                tag: TaskTag(t.task_tag),
            }),
            iu::TskFunc::ABORT_TASK_SET => Some(TmfFunction::AbortTaskSet),
            iu::TskFunc::CLEAR_TASK_SET => Some(TmfFunction::ClearTaskSet),
            iu::TskFunc::LUN_RESET => Some(TmfFunction::LogicalUnitReset),
            iu::TskFunc::CLEAR_ACA => Some(TmfFunction::ClearAca),
            _ => None,
        };
        let lun = Lun::decode(t.lun);
        let (Some(func), Some(lun), false) = (func, lun, self.tasks.contains_key(&t.tag)) else {
            let code = match (func, lun) {
                (None, _) => iu::RspCode::NOT_SUPPORTED,
                (_, None) => iu::RspCode::INCORRECT_LUN,
                // A TMF reusing a live tag.
                _ => iu::RspCode::INVALID_FIELDS,
            };
            self.finished += 1;
            let rsp = iu::Rsp {
                tag: t.tag,
                req_lim_delta: self.take_delta(),
                resp_data: vec![0, 0, 0, code.0],
                ..iu::Rsp::default()
            };
            self.send(OpKind::Control, rsp.encode());
            return;
        };
        self.tasks.insert(
            t.tag,
            Task {
                state: TaskState::Tmf { func },
                lun: t.lun,
                data_out: DataBuf::None,
                data_in: DataBuf::None,
                imm: None,
            },
        );
        self.events.push_back(Event::TaskMgmt(TmfRequest {
            func,
            lun,
            tag: TaskTag(t.tag),
        }));
    }

    /// Carries out one action of the core.
    pub fn handle_action(&mut self, action: Action) {
        match action {
            Action::FetchData {
                id,
                tag,
                buf,
                offset,
                len,
            } => self.fetch_data(id, tag.0, buf, offset, len),
            Action::Respond { id, tag, rsp } => self.respond(id, tag.0, rsp),
            Action::TmfDone { tag, rsp, .. } => self.tmf_done(tag.0, rsp),
            Action::Aen { lun, sense } => {
                if self.state == ChannelState::Live {
                    self.aens.push_back((lun, sense));
                    self.next_target_req();
                }
            }
            Action::Close => self.logout(TLogoutReason::NO_REASON),
            // SRP sessions never take pipe data, so nothing is held.
            Action::ConfirmDelivery => {}
        }
    }

    fn fetch_data(&mut self, id: CmdId, tag: u64, buf: SgList, offset: u32, len: u32) {
        let live = self.state == ChannelState::Live;
        let Some(task) = self.tasks.get_mut(&tag) else {
            self.events.push_back(Event::DataOut {
                id,
                result: Err(Abort::TransportError),
            });
            return;
        };
        if !live {
            self.events.push_back(Event::DataOut {
                id,
                result: Err(Abort::ConnectionLost),
            });
            return;
        }
        if len == 0 {
            self.events.push_back(Event::DataOut {
                id,
                result: Ok(buf),
            });
            return;
        }
        // `buf` holds the command's data from 0, or just this range (the
        // core fetches a large write a chunk at a time).
        let base = if (offset as u64 + len as u64) <= buf.len() as u64 {
            0
        } else {
            offset
        };
        let fits = (offset - base) as u64 + len as u64 <= buf.len() as u64;
        if let DataBuf::Immediate { offset: at, len: n } = task.data_out {
            // SRP-2: the data came inside the SRP_CMD; no RDMA READ.
            let (start, end) = (offset as u64, offset as u64 + len as u64);
            let src = task
                .imm
                .as_deref()
                .filter(|_| fits && end <= n as u64)
                .and_then(|iu| iu.get(at as usize + start as usize..at as usize + end as usize));
            let result = match src {
                Some(src) => {
                    let mut buf = buf;
                    buf.copy_in((offset - base) as usize, src);
                    Ok(buf)
                }
                None => Err(Abort::TransportError),
            };
            self.events.push_back(Event::DataOut { id, result });
            return;
        }
        let segs = match &task.data_out {
            DataBuf::Segs(s) => s.clone(),
            _ => SmallVec::new(),
        };
        let Some(mut xfers) = map_range(&segs, offset as u64, len as u64).filter(|_| fits) else {
            // The core asked for bytes the initiator's buffer does not have.
            self.events.push_back(Event::DataOut {
                id,
                result: Err(Abort::TransportError),
            });
            return;
        };
        for x in &mut xfers {
            x.offset -= base;
        }
        task.state = TaskState::FetchingData { id };
        let op = self.op(OpKind::DataOut { tag });
        self.tx.push_back(Transmit::RdmaRead { op, buf, xfers });
    }

    fn respond(&mut self, id: CmdId, tag: u64, rsp: Response) {
        let live = self.state == ChannelState::Live;
        let task = match self.tasks.get_mut(&tag) {
            Some(t) if live => t,
            _ => {
                self.tasks.remove(&tag);
                self.events.push_back(Event::ResponseSent(id));
                return;
            }
        };
        task.state = TaskState::Responding { id };
        self.finished += 1;
        let in_segs = match &task.data_in {
            DataBuf::Segs(s) => s.clone(),
            _ => SmallVec::new(),
        };
        let room: u64 = in_segs.iter().map(|s| s.len as u64).sum();
        let is_write = matches!(task.data_out, DataBuf::Segs(_)) && in_segs.is_empty();
        let mut out = iu::Rsp {
            tag,
            status: rsp.status.0,
            ..iu::Rsp::default()
        };
        let mut sent = 0u64;
        if let Some(buf) = rsp.data {
            let want = (rsp.data_len as u64).min(buf.len() as u64);
            sent = want.min(room);
            if sent > 0
                && let Some(xfers) = map_range(&in_segs, 0, sent)
            {
                let op = self.op(OpKind::DataIn);
                self.tx.push_back(Transmit::RdmaWrite { op, buf, xfers });
            }
        }
        // SRP r16a §6.9: DIOVER/DIUNDER and DOOVER/DOUNDER with the residual
        // counts; data the initiator's buffer could not hold is an overflow.
        let overflow_in = (rsp.data_len as u64).saturating_sub(sent);
        let (mut res, bidi) = (rsp.residual, rsp.bidi_residual);
        if overflow_in > 0 && !is_write {
            res = match res {
                Residual::Overflow(n) => Residual::Overflow(n.max(overflow_in as u32)),
                _ => Residual::Overflow(overflow_in as u32),
            };
        }
        let (in_res, out_res) = if is_write {
            (Residual::None, res)
        } else {
            (res, bidi)
        };
        match in_res {
            Residual::Underflow(n) => {
                out.flags |= iu::RSP_FLAG_DIUNDER;
                out.data_in_res_cnt = n;
            }
            Residual::Overflow(n) => {
                out.flags |= iu::RSP_FLAG_DIOVER;
                out.data_in_res_cnt = n;
            }
            Residual::None => {}
        }
        match out_res {
            Residual::Underflow(n) => {
                out.flags |= iu::RSP_FLAG_DOUNDER;
                out.data_out_res_cnt = n;
            }
            Residual::Overflow(n) => {
                out.flags |= iu::RSP_FLAG_DOOVER;
                out.data_out_res_cnt = n;
            }
            Residual::None => {}
        }
        if let Some(s) = rsp.sense {
            // Sense data is cut to what fits the initiator's receive buffer.
            let room = (self.cfg.max_ti_iu_len as usize).saturating_sub(iu::RSP_LEN);
            out.sense = s[..s.len().min(room)].to_vec();
        }
        out.req_lim_delta = self.take_delta();
        self.send(OpKind::Rsp { tag }, out.encode());
    }

    fn tmf_done(&mut self, tag: u64, rsp: TmfResponse) {
        let live = self.state == ChannelState::Live;
        let (func, lun) = match self.tasks.get_mut(&tag) {
            Some(t) if live => {
                let st = std::mem::replace(&mut t.state, TaskState::TmfResponding);
                let TaskState::Tmf { func } = st else {
                    t.state = st;
                    return;
                };
                (func, t.lun)
            }
            _ => {
                self.tasks.remove(&tag);
                return;
            }
        };
        // The TMF's own credit, and those of the tasks it ended. An ABORT
        // TASK the core answers "no such task" for a task this channel
        // still waits on ends it too: the core dropped it without a
        // response (a reset or PREEMPT AND ABORT from another nexus, SAM-5
        // §5.6), so nothing will ever answer it, and the initiator has
        // just given up on it.
        self.finished += 1;
        let not_found =
            rsp == TmfResponse::TaskNotFound && matches!(func, TmfFunction::AbortTask { .. });
        if rsp == TmfResponse::Complete || not_found {
            self.finished += self.forget_aborted(func, lun);
        }
        let code = match rsp {
            TmfResponse::Complete => iu::RspCode::COMPLETE,
            // SAM-5 §7.2: aborting a task that does not exist completes.
            TmfResponse::TaskNotFound => iu::RspCode::COMPLETE,
            TmfResponse::Succeeded => iu::RspCode::SUCCEEDED,
            TmfResponse::Rejected => iu::RspCode::NOT_SUPPORTED,
            TmfResponse::IncorrectLun => iu::RspCode::INCORRECT_LUN,
            TmfResponse::Failed => iu::RspCode::FAILED,
        };
        let out = iu::Rsp {
            tag,
            req_lim_delta: self.take_delta(),
            resp_data: vec![0, 0, 0, code.0],
            ..iu::Rsp::default()
        };
        self.send(OpKind::Rsp { tag }, out.encode());
    }

    /// The function and LUN of the task management function `tag` while it
    /// is in the core: what its completion ends on the nexus's other
    /// channels too ([`Channel::tmf_done_elsewhere`]).
    pub fn tmf_in_core(&self, tag: u64) -> Option<(TmfFunction, [u8; 8])> {
        match self.tasks.get(&tag) {
            Some(Task {
                state: TaskState::Tmf { func },
                lun,
                ..
            }) => Some((*func, *lun)),
            _ => None,
        }
    }

    /// A task management function another channel of this channel's I_T
    /// nexus received has completed (SRP r16a §6.2: the channels of a
    /// nexus share its task sets; the Linux initiator sends LOGICAL UNIT
    /// RESET on its first channel whichever channel the commands are on).
    /// The tasks it ended here get no response either (SAM-5 §7): forget
    /// them, and return their credits (SRP_CRED_REQ when no response is
    /// coming to carry them).
    pub fn tmf_done_elsewhere(&mut self, func: TmfFunction, lun: [u8; 8]) {
        if self.state != ChannelState::Live {
            return;
        }
        let n = self.forget_aborted(func, lun);
        if n > 0 {
            self.finished += n;
            self.next_target_req();
        }
    }

    /// SAM-5 §7.2-§7.5: tasks aborted on this nexus end without a
    /// response, so the channel forgets them once the TMF completes (their
    /// credits were already returned when their buffers were reposted).
    fn forget_aborted(&mut self, func: TmfFunction, lun: [u8; 8]) -> u64 {
        let before = self.tasks.len();
        let waiting = |t: &Task| {
            matches!(
                t.state,
                TaskState::Submitted
                    | TaskState::FetchingData { .. }
                    | TaskState::FetchingTables { .. }
            )
        };
        match func {
            TmfFunction::AbortTask { tag }
                if self
                    .tasks
                    .get(&tag.0)
                    .is_some_and(|t| waiting(t) && t.lun == lun) =>
            {
                self.tasks.remove(&tag.0);
            }
            TmfFunction::AbortTaskSet
            | TmfFunction::ClearTaskSet
            | TmfFunction::LogicalUnitReset => {
                self.tasks.retain(|_, t| !(waiting(t) && t.lun == lun));
            }
            _ => {}
        }
        (before - self.tasks.len()) as u64
    }

    /// Sends the next SRP_AER_REQ, or an SRP_CRED_REQ when credits are owed
    /// and no response is coming to carry them (SRP r16a §6.10), if no
    /// target request is outstanding.
    fn next_target_req(&mut self) {
        if self.state != ChannelState::Live || self.target_req.is_some() {
            return;
        }
        let tag = self.next_tag;
        if let Some((lun, sense)) = self.aens.pop_front() {
            self.next_tag += 1;
            self.target_req = Some(tag);
            let aer = iu::AerReq {
                tag,
                req_lim_delta: self.take_delta(),
                lun: lun.to_u64(),
                sense: sense.to_fixed().to_vec(),
            };
            self.send(OpKind::Control, aer.encode());
            return;
        }
        let responses_coming = self.tasks.values().any(|t| {
            !matches!(
                t.state,
                TaskState::Responding { .. } | TaskState::TmfResponding
            )
        });
        if !self.credits_held && self.returnable() > 0 && !responses_coming {
            self.next_tag += 1;
            self.target_req = Some(tag);
            let cred = iu::CredReq {
                tag,
                req_lim_delta: self.take_delta(),
            };
            self.send(OpKind::Control, cred.encode().to_vec());
        }
    }

    /// A SEND completed (`ok == false`: flushed or failed).
    pub fn send_done(&mut self, op: OpId, ok: bool) {
        let Some(kind) = self.ops.remove(&op) else {
            return;
        };
        if let OpKind::Rsp { tag } = kind
            && let Some(t) = self.tasks.remove(&tag)
            && let TaskState::Responding { id } = t.state
        {
            self.events.push_back(Event::ResponseSent(id));
        }
        if !ok {
            self.connection_lost();
        } else {
            self.next_target_req();
        }
    }

    /// An RDMA transfer completed; `buf` is the list it was given.
    pub fn rdma_done(&mut self, op: OpId, buf: SgList, ok: bool) {
        let Some(kind) = self.ops.remove(&op) else {
            return;
        };
        match kind {
            OpKind::Table { tag, out } => self.table_done(tag, out, buf, ok),
            OpKind::DataOut { tag } => {
                if let Some(t) = self.tasks.get_mut(&tag)
                    && let TaskState::FetchingData { id } = t.state
                {
                    t.state = TaskState::Submitted;
                    let result = if ok {
                        Ok(buf)
                    } else {
                        Err(Abort::ConnectionLost)
                    };
                    self.events.push_back(Event::DataOut { id, result });
                }
            }
            // The SRP_RSP behind it reports the command done.
            OpKind::DataIn | OpKind::Rsp { .. } | OpKind::Control => {}
        }
        if !ok {
            self.connection_lost();
        }
    }

    fn table_done(&mut self, tag: u64, out: bool, buf: SgList, ok: bool) {
        self.table_reads = self.table_reads.saturating_sub(1);
        self.table_read(tag, out, buf, ok);
        self.start_table_reads();
    }

    fn table_read(&mut self, tag: u64, out: bool, buf: SgList, ok: bool) {
        if !ok {
            self.tasks.remove(&tag);
            return;
        }
        let Some(task) = self.tasks.get_mut(&tag) else {
            return;
        };
        let segs = iu::parse_table(&buf.to_vec());
        let sum: u64 = segs.iter().map(|s| s.len as u64).sum();
        let slot = if out {
            &mut task.data_out
        } else {
            &mut task.data_in
        };
        if sum != slot.total() {
            // §5.2.3: the table must describe exactly the total length.
            return self.logout(if out {
                TLogoutReason::INVALID_DATA_OUT_COUNT
            } else {
                TLogoutReason::INVALID_DATA_IN_COUNT
            });
        }
        *slot = DataBuf::Segs(segs);
        if let TaskState::FetchingTables { pending, .. } = &mut task.state {
            *pending = pending.saturating_sub(1);
            if *pending == 0 {
                let st = std::mem::replace(&mut task.state, TaskState::Submitted);
                if let TaskState::FetchingTables { req, .. } = st {
                    self.events.push_back(Event::Submit(req));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;
