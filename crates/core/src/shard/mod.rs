//! The per-core target core: a [`Shard`] owns the sessions (I_T nexuses) of
//! one core, their commands and task sets, their unit attentions, pending task
//! management functions, and that core's backend queues.
//!
//! Everything here runs on one thread, with no lock: a fabric calls a
//! [`Session`] handle, the reactor calls [`Shard::poll`], and both drain the
//! actions each session queues. Commands live in one slab; their life is the
//! [`CmdState`] enum advanced in [`Shard::advance`].
//!
//! Resets that span cores: the core decides which task management crosses
//! cores, for every fabric alike. A LOGICAL UNIT RESET or TARGET RESET a
//! session of this shard receives is applied here and, when the shard has
//! other cores beside it ([`Shard::set_other_cores`]), handed out by
//! [`Shard::take_spanning_resets`]; the daemon carries each to the other
//! cores by message, where [`Shard::remote_reset`] applies it and
//! [`Shard::drained_resets`] reports when its aborted commands are gone.
//! The TMF response is held in the core until every other core has drained
//! ([`Shard::spanning_reset_drained`]), so a fabric only sends what it polls.
//!
//! Does not own: the transport (fabrics), storage (backends), or the
//! messages between cores.

use std::collections::VecDeque;

// Keys here are small integers the target itself hands out; a keyed SipHash
// buys nothing against them and costs cycles on every command.
use rustc_hash::FxHashMap as HashMap;
use std::os::fd::RawFd;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use ferrite_reactor::buf::{BufPool, SgList};
use ferrite_reactor::pipe::{Pipe, PipePool};
use ferrite_scsi::{Lun, Sense};
use slab::Slab;
use smallvec::SmallVec;

use crate::backend::{BackendQueue, BlockDone, BlockError, BlockOp, Busy};
use crate::budget::{DataBudget, WRITE_CHUNK};
use crate::cmd::{
    Abort, Action, Cdb, CmdId, CmdRequest, DeliveryHold, PipeData, Residual, Response, TaskAttr,
    TaskTag, TmfFunction, TmfId, TmfRequest, TmfResponse,
};
use crate::device::{Device, DeviceId, LunEntry, LunMap, NexusWatch, Watch};
use crate::emulate::{self, DataCtx, Plan, Rmw};
use crate::pr::{PrError, PrNexus};
use crate::sanitize::{self, Step};
use crate::stats::{Completion, IoDir, IoStats, ShardStats};

mod copy;
mod data_out;
mod delivery;
mod exec;
mod gates;
mod multi;
mod sanitizing;
mod taskset;
mod tmf;

use delivery::Deliveries;
use multi::Cont;
use tmf::HeldTmf;
use tmf::{PendingTmf, Waiter};
pub use tmf::{RemoteResetId, ResetScope, SpanningResetId};

/// Depth of each backend queue this shard opens.
pub const QUEUE_DEPTH: u32 = 128;

/// Unit attentions kept per nexus per LUN; older ones are dropped first.
const UA_QUEUE_MAX: usize = 8;

/// Reads from this size up travel as page-cache pages in a pipe when the
/// session and backend allow it; below it the copy costs less than the
/// pipe's extra system calls.
const PIPE_READ_MIN: u32 = 128 * 1024;
/// Idle pipes a shard keeps.
const PIPES_IDLE: usize = 32;
/// Pipes a shard has out at once (two descriptors each); reads beyond them
/// take buffers.
const PIPES_LIVE: usize = 64;

/// A session's handle inside its shard.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SessionId(pub u32);

/// The I_T nexus of a session (SAM-5 §4.6).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Nexus {
    /// Initiator name (iSCSI initiator name, SRP initiator port id).
    pub initiator: String,
    /// Initiator port name, e.g. `iqn...,i,0x<isid>`.
    pub initiator_port: String,
    /// Target name.
    pub target: String,
    /// Relative target port identifier (VPD 83h).
    pub rel_port_id: u16,
    /// Target port name (`iqn...,t,0x<tpgt>`); empty for none.
    pub target_port: String,
    /// SCSI transport protocol identifier (`ferrite_scsi::inquiry::protocol`).
    pub protocol: Option<u8>,
}

impl Nexus {
    /// What VPD 83h reports of this nexus's port.
    pub fn port_ids(&self) -> crate::emulate::PortIds<'_> {
        crate::emulate::PortIds {
            rel_port: self.rel_port_id,
            target: &self.target,
            target_port: &self.target_port,
            protocol: self.protocol,
        }
    }
}

/// Where a command is in its life; each state says what it waits for.
/// [`Shard::advance`] alone moves a command from one to the next, and keeps
/// the shard's wait queues (`buf_wait`, `retry`, `range_wait`) and the data
/// budget's count of waiters in step with them.
///
/// ```text
/// New -> Blocked -> (BufWait) -> NeedData -> (BufWait) ->
///   (RangeWait | QueueFull) -> Exec -> ... -> Respond -> Done
/// ```
/// A command without Data-Out goes from `New` (or `Blocked`) to `Exec` or
/// straight to `Respond`; a SANITIZE without IMMED waits in `Background`.
/// An aborted command (SAM-5 §7.2) goes to `Done` from wherever it is when
/// nothing of it is out, or else to `Aborted` until what is out comes back;
/// an answered one (`Respond`) is not aborted.
#[derive(Debug)]
enum CmdState {
    /// Checked and planned; not yet looked at by the task set.
    New,
    /// Waits for older tasks of its task set (SAM-5 §8.6: an older ORDERED
    /// task, or for an ORDERED task any older task) to finish.
    Blocked,
    /// Its data buffer does not fit the [`DataBudget`] now: waits in
    /// `Shard::buf_wait` until `want` bytes (all it will then hold) do,
    /// and then starts (or fetches its next chunk).
    BufWait { want: u64 },
    /// `Action::FetchData` is queued or carried out; waits for
    /// `data_out_done`.
    NeedData,
    /// Its write (or COMPARE AND WRITE's read), the op it holds, overlaps a
    /// range another command holds (SBC-4 §5.3), or must wait for the
    /// delivery of older pipe reads of its session; waits in
    /// `Shard::range_wait` for a retry after the next `poll`.
    RangeWait(Box<BlockOp>),
    /// The backend queue said Busy (or older ops wait for a slot): the op
    /// it holds waits in `Shard::retry` for a retry after the next `poll`.
    QueueFull(Box<BlockOp>),
    /// A block operation is in flight (or being handed to the backend);
    /// waits for its `BlockDone`.
    Exec,
    /// A SANITIZE without IMMED: waits for its device's sanitize operation
    /// (a [`SanitizeJob`]), which outlives it if it is aborted.
    Background,
    /// `Action::Respond` is queued or being sent; waits for `response_sent`.
    /// Its completion is counted in the statistics on entry.
    Respond,
    /// Aborted by task management or by its session's close while
    /// something of it was out: waits for what [`Drain`] names, then
    /// leaves (`Done`) without a status (SAM-5 §7.2), its buffers and
    /// budget given back. Task management functions that aborted it wait
    /// for it.
    Aborted(Drain),
    /// Finished or aborted: out of every wait queue, its slot given back
    /// next.
    Done,
}

/// What of an aborted command is still out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Drain {
    /// Its block operation (an EXTENDED COPY: its chunk operations) in
    /// flight: waits for the `BlockDone`.
    Backend,
    /// The Data-Out the fabric took its `Action::FetchData` for: waits for
    /// `data_out_done`.
    DataOut,
}

/// The shard's queues a command waits in, in the states that keep it there.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum WaitQueue {
    /// `Shard::buf_wait` (`BufWait`).
    Buffers,
    /// `Shard::retry` (`QueueFull`).
    Queue,
    /// `Shard::range_wait` (`RangeWait`).
    Ranges,
}

impl CmdState {
    /// The queue a command in this state waits in.
    fn wait_queue(&self) -> Option<WaitQueue> {
        match self {
            CmdState::BufWait { .. } => Some(WaitQueue::Buffers),
            CmdState::QueueFull(_) => Some(WaitQueue::Queue),
            CmdState::RangeWait(_) => Some(WaitQueue::Ranges),
            _ => None,
        }
    }
}

/// A sanitize operation this shard runs for a device (SBC-4 §4.11): one
/// block operation in flight at a time, tagged apart from commands.
struct SanitizeJob {
    dev: Arc<Device>,
    op: sanitize::Operation,
    /// The SANITIZE without IMMED that waits for the end: (slab key, seq).
    cmd: Option<(usize, u32)>,
    residual: Residual,
    ause: bool,
    /// When it started (pacing); `None` if no time was ever passed in.
    start: Option<Instant>,
    /// An operation a full queue handed back.
    busy: Option<BlockOp>,
    in_flight: bool,
    seq: u32,
}

/// Backend tags of sanitize operations: this bit in the low half (a
/// command's slab key never reaches it), the job's key below it, its
/// sequence number in the high half.
const SANITIZE_TAG: u64 = 1 << 31;

struct Cmd {
    session: SessionId,
    /// Shard-wide sequence number, the high half of the backend tag.
    seq: u32,
    tag: TaskTag,
    lun: Lun,
    attr: TaskAttr,
    cdb: Cdb,
    expected_len: u32,
    state: CmdState,
    plan: Plan,
    entry: Option<LunEntry>,
    /// Counted in its LU's task set.
    in_task_set: bool,
    /// What a command of several block operations does after the one in
    /// flight (`Exec`).
    cont: Cont,
    /// The `now` it was submitted with (statistics).
    start: Instant,
    /// Direction it is counted in.
    dir: IoDir,
    /// Data-Out bytes received.
    out_bytes: u64,
    /// Holds its byte range in the device's [`RangeLocks`](crate::device).
    locked: bool,
    /// Waited in its task set for older tasks (SAM-5 §8.6): it is ordered
    /// after them, so its writes wait for their data's delivery too.
    waited: bool,
    /// Delivery holds of its session older than this one must be released
    /// before its writes go ([`Shard::delivered`]); set when first needed.
    barrier: Option<u64>,
    /// Bytes of the [`DataBudget`] it holds.
    charged: u64,
    /// WRITE: the offset in its data of the chunk fetched or written now.
    chunk_at: u32,
}

/// Per nexus per LUN state: unit attentions, the capacity generation last
/// seen, and the task set (TST = 001b: one per I_T nexus).
#[derive(Default)]
struct LuState {
    ua: VecDeque<Sense>,
    generation: Option<u32>,
    /// The device's mode generation last seen (MODE PARAMETERS CHANGED).
    mode_gen: Option<u32>,
    /// The device's reset generation last seen (BUS DEVICE RESET).
    reset_gen: Option<u32>,
    /// A removable device's load generation last seen (NOT READY TO READY
    /// CHANGE).
    medium_gen: Option<u32>,
    /// The device group's ALUA generation last seen (ASYMMETRIC ACCESS
    /// STATE CHANGED).
    alua_gen: Option<u32>,
    /// Active tasks in arrival order (slab keys).
    tasks: VecDeque<usize>,
    /// ORDERED tasks among `tasks`.
    ordered: usize,
}

/// Records the device counter `now` a nexus has seen in `seen`; true when
/// it moved since the last look (the first look only records it).
fn changed(seen: &mut Option<u32>, now: u32) -> bool {
    let moved = seen.is_some_and(|old| old != now);
    *seen = Some(now);
    moved
}

struct SessionState {
    nexus: Nexus,
    luns: Arc<LunMap>,
    aen: bool,
    /// Closed by the fabric; lingers until backend I/O drains.
    closing: bool,
    actions: VecDeque<Action>,
    in_ready: bool,
    lus: HashMap<Lun, LuState>,
    /// Commands of this session in the slab.
    live: usize,
    next_tmf: u32,
    stats: IoStats,
    /// The fabric's watch on this nexus's transport
    /// ([`crate::device::NexusWatch`]), given to the state it holds.
    watch: Watch,
    /// The fabric takes large reads as page-cache pages in a pipe
    /// ([`Session::set_pipe_reads`]).
    pipe_reads: bool,
    /// Those reads not yet known to be delivered.
    deliveries: std::rc::Rc<std::cell::RefCell<Deliveries>>,
    /// Bytes of the [`DataBudget`] its commands hold.
    data_held: u64,
    /// Its commands in `BufWait`.
    buf_waiting: u32,
}

impl SessionState {
    /// Puts session `id` (this one) on the shard's `ready` list once.
    fn mark_ready(&mut self, id: SessionId, ready: &mut Vec<SessionId>) {
        if !self.in_ready {
            self.in_ready = true;
            ready.push(id);
        }
    }

    /// Closed, and no command of it is left: the shard can forget it.
    fn reapable(&self) -> bool {
        self.closing && self.live == 0
    }
}

struct DevQueue {
    q: Option<Box<dyn BackendQueue>>,
    logged: bool,
}

/// The target core of one reactor core.
pub struct Shard {
    core: usize,
    pool: BufPool,
    sessions: HashMap<SessionId, SessionState>,
    next_session: u32,
    cmds: Slab<Cmd>,
    next_seq: u32,
    queues: HashMap<DeviceId, DevQueue>,
    /// Commands in `QueueFull`, oldest first.
    retry: VecDeque<usize>,
    /// Commands in `RangeWait`, oldest first.
    range_wait: VecDeque<usize>,
    tmfs: Vec<PendingTmf>,
    next_remote: u32,
    /// How many other cores run sessions (0: resets never span cores).
    other_cores: usize,
    next_span: u32,
    /// Spanning resets not yet taken by the daemon.
    spanning: Vec<(SpanningResetId, ResetScope)>,
    /// TMF responses waiting for other cores.
    held: Vec<HeldTmf>,
    /// Remote resets whose aborted commands have all drained.
    remote_done: Vec<RemoteResetId>,
    ready: Vec<SessionId>,
    done: Vec<BlockDone>,
    scratch: Vec<u8>,
    /// The latest `now` a caller passed in (statistics only).
    now: Option<Instant>,
    /// Per-device counters of this shard's commands.
    dev_stats: HashMap<DeviceId, IoStats>,
    /// PREEMPT AND ABORTs run here whose preempted nexuses may have tasks
    /// on other cores ([`Shard::drain_preempted`]).
    preempted: Vec<(DeviceId, Vec<PrNexus>)>,
    /// EXTENDED COPY: copies waiting to be pumped, results held per
    /// nexus ([`crate::xcopy`]).
    copies: crate::xcopy::Copies,
    /// Sanitize operations started on this shard.
    sanitizing: Slab<SanitizeJob>,
    next_sanitize: u32,
    /// The [`capacity_epoch`](crate::device::capacity_epoch) last scanned.
    cap_epoch: u64,
    /// The [`crate::alua::epoch`] last seen: a device group changed state.
    alua_epoch: u64,
    /// Pipes for reads handed over as page-cache pages: made on first use;
    /// `Some(None)` once the kernel refused them.
    pipes: Option<Option<PipePool>>,
    /// Memory for command data, shared with the other shards.
    budget: Arc<DataBudget>,
    /// Commands in `BufWait`, oldest first.
    buf_wait: VecDeque<usize>,
}

impl std::fmt::Debug for Shard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shard")
            .field("core", &self.core)
            .field("sessions", &self.sessions.len())
            .field("cmds", &self.cmds.len())
            .finish()
    }
}

/// A handle on one open session, borrowing its shard.
pub struct Session<'a> {
    shard: &'a mut Shard,
    id: SessionId,
}

impl std::fmt::Debug for Session<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Session({:?})", self.id)
    }
}

/// A `CmdId` holds the slab key in its low [`KEY_BITS`] bits and the low bits
/// of the command's sequence number above them, so that an id a fabric keeps
/// too long never reaches a newer command in the same slot.
const KEY_BITS: u32 = 20;

/// How often a shard with commands in `BufWait` looks at the budget again
/// when nothing else wakes it.
const BUF_WAIT_RECHECK: std::time::Duration = std::time::Duration::from_millis(2);
const KEY_MASK: u32 = (1 << KEY_BITS) - 1;

fn cmd_id(key: usize, seq: u32) -> CmdId {
    CmdId((seq << KEY_BITS) | (key as u32 & KEY_MASK))
}

fn tag_of(key: usize, seq: u32) -> u64 {
    ((seq as u64) << 32) | key as u64
}

/// Rewrites fixed-format sense data (SPC-4 §4.5.3) in descriptor format
/// (§4.5.2) for a device whose Control page sets D_SENSE: the key and
/// codes, an information descriptor if VALID, a sense-key specific
/// descriptor if SKSV.
fn descriptor_sense(sense: &mut SmallVec<[u8; 32]>) {
    if sense.len() < 18 || sense[0] & 0x7f != 0x70 {
        return;
    }
    let f: [u8; 18] = match sense[..18].try_into() {
        Ok(f) => f,
        Err(_) => return,
    };
    let mut d: SmallVec<[u8; 32]> =
        SmallVec::from_slice(&[0x72, f[2] & 0x0f, f[12], f[13], 0, 0, 0, 0]);
    if f[0] & 0x80 != 0 {
        d.extend_from_slice(&[0x00, 0x0a, 0x80, 0, 0, 0, 0, 0]);
        d.extend_from_slice(&f[3..7]);
    }
    if f[15] & 0x80 != 0 {
        d.extend_from_slice(&[0x02, 0x06, 0, 0, f[15], f[16], f[17], 0]);
    }
    d[7] = (d.len() - 8) as u8;
    *sense = d;
}

/// The nexus as persistent reservations see it.
fn pr_nexus(n: &Nexus) -> PrNexus {
    PrNexus {
        initiator_port: n.initiator_port.clone(),
        target: n.target.clone(),
        rel_port: n.rel_port_id,
    }
}

/// The token a session holds medium removal prevention by (SBC-4 §5.13):
/// unique in the process, and gone with the session, so that a late close
/// of a reinstated session cannot clear its successor's prevention.
fn medium_holder(core: usize, id: SessionId) -> u64 {
    ((core as u64) << 32) | id.0 as u64
}

/// The I_T nexus identifier SPC-2 reservations are held by.
fn nexus_key(n: &Nexus) -> String {
    format!("{}|{}", n.initiator_port, n.target)
}

/// The sense a failed block operation reports (codes from SPC-4 Annex D).
fn block_error_sense(e: BlockError, write: bool) -> Sense {
    match e {
        BlockError::Io if write => Sense::WRITE_ERROR,
        BlockError::Io => Sense::UNRECOVERED_READ_ERROR,
        BlockError::NoSpace => Sense::SPACE_ALLOCATION_FAILED_WRITE_PROTECT,
        BlockError::Offline => Sense::LOGICAL_UNIT_NOT_READY_CAUSE_NOT_REPORTABLE,
        BlockError::Unsupported | BlockError::Os(_) => Sense::INTERNAL_TARGET_FAILURE,
    }
}

/// The bytes of a WRITE of `len` fetched and written from `at` in one go:
/// a [`WRITE_CHUNK`], or the rest if it is shorter or the write is atomic
/// (WRITE ATOMIC (16) goes to the backend as one operation).
fn write_chunk(len: u32, at: u32, atomic: bool) -> u32 {
    let rest = len.saturating_sub(at);
    if atomic { rest } else { rest.min(WRITE_CHUNK) }
}

fn check(sense: Sense, residual: Residual) -> Response {
    let mut r = Response::check(sense);
    r.residual = residual;
    r
}

fn good(residual: Residual) -> Response {
    let mut r = Response::good();
    r.residual = residual;
    r
}

impl Shard {
    /// A shard for reactor core `core`, taking buffers from `pool`.
    pub fn new(core: usize, pool: BufPool) -> Shard {
        Shard {
            core,
            pool,
            sessions: HashMap::default(),
            next_session: 1,
            cmds: Slab::with_capacity(256),
            next_seq: 1,
            queues: HashMap::default(),
            retry: VecDeque::new(),
            range_wait: VecDeque::new(),
            tmfs: Vec::new(),
            next_remote: 1,
            other_cores: 0,
            next_span: 1,
            spanning: Vec::new(),
            held: Vec::new(),
            remote_done: Vec::new(),
            ready: Vec::new(),
            done: Vec::with_capacity(QUEUE_DEPTH as usize),
            scratch: Vec::with_capacity(512),
            now: None,
            dev_stats: HashMap::default(),
            preempted: Vec::new(),
            copies: crate::xcopy::Copies::default(),
            sanitizing: Slab::new(),
            next_sanitize: 1,
            cap_epoch: crate::device::capacity_epoch(),
            alua_epoch: crate::alua::epoch(),
            pipes: None,
            budget: Arc::new(DataBudget::unlimited()),
            buf_wait: VecDeque::new(),
        }
    }

    /// Makes the shard draw its command data buffers from `budget` (shared
    /// by the daemon's shards); a new shard has a budget of its own that no
    /// load reaches.
    pub fn set_budget(&mut self, budget: Arc<DataBudget>) {
        self.budget = budget;
    }

    /// The reactor core this shard belongs to.
    pub fn core(&self) -> usize {
        self.core
    }

    /// Opens a session (I_T nexus) with `luns`. SAM-5 §5.14: every LUN starts
    /// with POWER ON, RESET, OR BUS DEVICE RESET OCCURRED pending.
    pub fn open_session(
        &mut self,
        now: Instant,
        nexus: Nexus,
        luns: Arc<LunMap>,
        aen: bool,
    ) -> SessionId {
        self.tick(now);
        let id = SessionId(self.next_session);
        self.next_session = self.next_session.wrapping_add(1).max(1);
        let mut lus = HashMap::default();
        for (lun, e) in &luns.luns {
            let mut st = LuState {
                generation: Some(e.device.generation()),
                reset_gen: Some(e.device.shared.reset_gen.load(Ordering::Acquire)),
                ..LuState::default()
            };
            st.raise(Sense::POWER_ON_RESET);
            lus.insert(*lun, st);
        }
        self.sessions.insert(
            id,
            SessionState {
                nexus,
                luns,
                aen,
                closing: false,
                actions: VecDeque::new(),
                in_ready: false,
                lus,
                live: 0,
                next_tmf: 1,
                stats: IoStats::default(),
                watch: None,
                pipe_reads: false,
                deliveries: std::rc::Rc::default(),
                data_held: 0,
                buf_waiting: 0,
            },
        );
        id
    }

    /// Gives session `id` a watch on its transport: a reservation or a
    /// prevention of medium removal it holds ends as soon as the watch
    /// says the transport is gone, even before the fabric closes the
    /// session.
    pub fn watch_session(&mut self, id: SessionId, watch: Arc<dyn NexusWatch>) {
        if let Some(s) = self.sessions.get_mut(&id) {
            s.watch = Some(watch);
        }
    }

    /// A handle on an open session; `None` once it is closed.
    pub fn session(&mut self, id: SessionId) -> Option<Session<'_>> {
        match self.sessions.get(&id) {
            Some(s) if !s.closing => Some(Session { shard: self, id }),
            _ => None,
        }
    }

    /// Ends a session: aborts its tasks and drops its queued actions. It
    /// lingers until its backend I/O drains; no further actions are queued
    /// for it.
    pub fn close_session(&mut self, now: Instant, id: SessionId) {
        self.tick(now);
        let Some(s) = self.sessions.get_mut(&id) else {
            return;
        };
        s.closing = true;
        s.actions.clear();
        // SPC-2 §5.5.1: I_T nexus loss releases the nexus's reservations.
        // SBC-4 §5.13: and ends its prevention of medium removal.
        let me = nexus_key(&s.nexus);
        let holder = medium_holder(self.core, id);
        for e in s.luns.luns.values() {
            e.device.shared.release(Some(&me));
            e.device.shared.medium.forget(holder);
        }
        self.tmfs
            .retain(|t| !matches!(t.waiter, Waiter::Tmf { session, .. } if session == id));
        self.held.retain(|h| h.session != id);
        let keys: Vec<usize> = self
            .cmds
            .iter()
            .filter(|(_, c)| c.session == id)
            .map(|(k, _)| k)
            .collect();
        // The fabric will not call back for this session: a command waiting
        // for data or for response_sent is gone now; one with backend I/O in
        // flight waits for it. Abort them all first, so that freeing one
        // starts none of the others.
        let mut gone: SmallVec<[usize; 16]> = SmallVec::new();
        for k in keys {
            match self.cmds[k].state {
                CmdState::Exec => {
                    self.advance(k, CmdState::Aborted(Drain::Backend));
                }
                CmdState::Aborted(Drain::Backend) => {}
                // Answered: counted already.
                CmdState::Respond => gone.push(k),
                _ => {
                    self.advance(k, CmdState::Done);
                    gone.push(k);
                }
            }
        }
        for k in gone {
            self.free(k);
        }
        // SPC-4 §6.23: held copy results end with the I_T nexus.
        self.copies.forget(id);
        self.reap(id);
    }

    /// Polls backend queues, completes commands and retries operations a
    /// full queue handed back. True if anything moved.
    pub fn poll(&mut self, now: Instant) -> bool {
        self.tick(now);
        let mut done = std::mem::take(&mut self.done);
        for dq in self.queues.values_mut() {
            if let Some(q) = dq.q.as_mut()
                && q.in_flight() > 0
            {
                q.poll(&mut done);
            }
        }
        let mut progress = !done.is_empty();
        for d in done.drain(..) {
            self.complete(d);
        }
        self.done = done;
        if !self.retry.is_empty() {
            progress |= self.retry_busy();
        }
        if !self.range_wait.is_empty() {
            progress |= self.retry_ranges();
        }
        if !self.buf_wait.is_empty() {
            progress |= self.retry_buffers();
        }
        if !self.copies.wait.is_empty() {
            progress |= self.xcopy_retry();
        }
        if !self.sanitizing.is_empty() {
            progress |= self.drive_sanitize(Some(now));
        }
        let epoch = crate::device::capacity_epoch();
        if epoch != self.cap_epoch {
            self.cap_epoch = epoch;
            progress |= self.device_changed(
                Sense::CAPACITY_DATA_HAS_CHANGED,
                |e| Some(e.device.generation()),
                |st| &mut st.generation,
            );
        }
        let epoch = crate::alua::epoch();
        if epoch != self.alua_epoch {
            self.alua_epoch = epoch;
            progress |= self.device_changed(
                Sense::ASYMMETRIC_ACCESS_STATE_CHANGED,
                |e| e.device.alua().map(|dg| dg.generation()),
                |st| &mut st.alua_gen,
            );
        }
        progress
    }

    /// A device counter moved (`counter`: a resize's capacity generation,
    /// a device group's ALUA generation): every nexus of this core whose
    /// LUN map holds such a device and saw the counter before (`seen`) gets
    /// the unit attention `sense` (SBC-4 §4.10 CAPACITY DATA HAS CHANGED,
    /// SPC-4 §5.15.2.3 ASYMMETRIC ACCESS STATE CHANGED). A session whose
    /// fabric reports asynchronous events also gets it as an AEN at once
    /// (SAM-5 §5.14.4 asynchronous event reporting), queued here rather than
    /// on the initiator's next command. The unit attention stays pending for
    /// those sessions as well: iSCSI initiators commonly ignore AsyncEvent 0
    /// (libiscsi, open-iscsi), and a change they never learn of is worse
    /// than one reported twice. True if any nexus was affected.
    fn device_changed(
        &mut self,
        sense: Sense,
        counter: impl Fn(&LunEntry) -> Option<u32>,
        seen: impl Fn(&mut LuState) -> &mut Option<u32>,
    ) -> bool {
        let mut woke = Vec::new();
        for (id, s) in self.sessions.iter_mut() {
            if s.closing {
                continue;
            }
            for (lun, e) in &s.luns.luns {
                let Some(g) = counter(e) else {
                    continue;
                };
                let st = s.lus.entry(*lun).or_default();
                let last = seen(st);
                match *last {
                    Some(old) if old != g => {}
                    Some(_) => continue,
                    None => {
                        *last = Some(g);
                        continue;
                    }
                }
                *last = Some(g);
                st.raise(sense);
                if s.aen {
                    s.actions.push_back(Action::Aen { lun: *lun, sense });
                    woke.push(*id);
                }
            }
        }
        let any = !woke.is_empty();
        for id in woke {
            self.mark_ready(id);
        }
        any
    }

    /// Moves the sessions with queued actions into `out`.
    pub fn ready_sessions(&mut self, out: &mut Vec<SessionId>) {
        for id in self.ready.drain(..) {
            if let Some(s) = self.sessions.get_mut(&id) {
                s.in_ready = false;
                if !s.actions.is_empty() {
                    out.push(id);
                }
            }
        }
    }

    /// True while some backend queue without a notify fd has I/O in flight, or
    /// an operation waits for a queue slot: the reactor must keep polling.
    pub fn wants_spin(&self) -> bool {
        !self.retry.is_empty()
            || !self.range_wait.is_empty()
            || !self.copies.wait.is_empty()
            // A sanitize write the backend handed back is retried at once;
            // one waiting for its paced slot is woken by
            // `Shard::next_deadline` instead.
            || self.sanitizing.iter().any(|(_, j)| !j.in_flight && j.busy.is_some())
            || self.queues.values().any(|d| {
                d.q.as_ref()
                    .is_some_and(|q| q.notify_fd().is_none() && q.in_flight() > 0)
            })
    }

    /// When a paced sanitize operation may issue its next write, if one
    /// waits with nothing in flight: a reactor that sleeps until then
    /// instead of spinning need not keep polling for it.
    pub fn next_deadline(&self) -> Option<Instant> {
        // Commands waiting for the data budget: memory another shard gives
        // back wakes nobody here, so look again shortly.
        let buffers = (!self.buf_wait.is_empty())
            .then(|| self.now.and_then(|n| n.checked_add(BUF_WAIT_RECHECK)))
            .flatten();
        self.sanitizing
            .iter()
            .filter(|(_, j)| !j.in_flight && j.busy.is_none())
            .filter_map(|(_, j)| j.start?.checked_add(j.op.next_write_after()))
            .chain(buffers)
            .min()
    }

    /// The notify fd of every open backend queue.
    pub fn notify_fds(&self, out: &mut Vec<RawFd>) {
        for d in self.queues.values() {
            if let Some(fd) = d.q.as_ref().and_then(|q| q.notify_fd()) {
                out.push(fd);
            }
        }
    }

    /// Replaces a session's LUN map: SPC-4 §5.12 (table 25) REPORTED LUNS DATA
    /// HAS CHANGED on every LUN of the new map, and an AEN if the fabric can
    /// carry one.
    pub fn set_luns(&mut self, id: SessionId, luns: Arc<LunMap>) {
        let Some(s) = self.sessions.get_mut(&id) else {
            return;
        };
        if s.closing {
            return;
        }
        for (lun, e) in &luns.luns {
            let st = s.lus.entry(*lun).or_default();
            if st.generation.is_none() {
                st.generation = Some(e.device.generation());
            }
            if st.reset_gen.is_none() {
                st.reset_gen = Some(e.device.shared.reset_gen.load(Ordering::Acquire));
            }
            st.raise(Sense::REPORTED_LUNS_DATA_HAS_CHANGED);
            // SPC-4 §6.6.1 (as SCST does on `replace`): a LUN now served
            // by another device, or by the same one with a new identity,
            // reports that its INQUIRY data changed.
            let changed = s.luns.luns.get(lun).is_some_and(|old| {
                old.device.id != e.device.id || old.device.identity != e.device.identity
            });
            if changed {
                st.raise(Sense::INQUIRY_DATA_HAS_CHANGED);
            }
        }
        let first = luns.luns.keys().next().copied().unwrap_or_default();
        s.luns = luns;
        if s.aen {
            s.actions.push_back(Action::Aen {
                lun: first,
                sense: Sense::REPORTED_LUNS_DATA_HAS_CHANGED,
            });
            self.mark_ready(id);
        }
    }

    /// A snapshot of this shard's counters: every device it has seen a
    /// command for, and every open session. Cheap (plain arrays); merge the
    /// snapshots of all cores with [`ShardStats::merge`].
    pub fn stats(&self) -> ShardStats {
        ShardStats {
            devices: self.dev_stats.iter().map(|(k, v)| (*k, *v)).collect(),
            sessions: self
                .sessions
                .iter()
                .filter(|(_, s)| !s.closing)
                .map(|(k, s)| (*k, s.stats))
                .collect(),
        }
    }

    /// Records the time a caller passed in; it never goes backwards.
    fn tick(&mut self, now: Instant) {
        if self.now.is_none_or(|n| now > n) {
            self.now = Some(now);
        }
    }

    // ----- internals -----

    fn mark_ready(&mut self, id: SessionId) {
        if let Some(s) = self.sessions.get_mut(&id) {
            s.mark_ready(id, &mut self.ready);
        }
    }

    fn push_action(&mut self, id: SessionId, a: Action) {
        if let Some(s) = self.sessions.get_mut(&id)
            && !s.closing
        {
            s.actions.push_back(a);
            s.mark_ready(id, &mut self.ready);
        }
    }

    fn submit(&mut self, id: SessionId, now: Instant, req: CmdRequest) -> CmdId {
        self.tick(now);
        // The LUN as the fabric decoded it, unless the raw field says
        // otherwise (a fabric may leave `lun_raw` zeroed).
        let lun = if req.lun_raw == [0; 8] {
            Some(req.lun)
        } else {
            Lun::decode(req.lun_raw)
        };
        let Some(s) = self.sessions.get_mut(&id) else {
            // No such session: nothing will ever be answered; hand back an id
            // that no command has.
            return CmdId(u32::MAX);
        };
        let entry = lun.and_then(|l| s.luns.get(l).cloned());
        let op = req.cdb.first().copied().unwrap_or(0);
        let early = s.gate(lun, entry.as_ref(), op);
        let plan = match early {
            Some(_) => Plan::Good(Residual::None),
            None => emulate::plan(&req.cdb, entry.as_ref(), req.expected_len, req.dir),
        };
        if self.cmds.vacant_key() > KEY_MASK as usize {
            // SAM-5 §5.3: more tasks than this shard can track.
            s.actions.push_back(Action::Respond {
                id: CmdId(u32::MAX),
                tag: req.tag,
                rsp: Response::status(ferrite_scsi::Status::TASK_SET_FULL),
            });
            self.mark_ready(id);
            return CmdId(u32::MAX);
        }
        s.live += 1;
        let seq = self.next_seq;
        self.next_seq = self.next_seq.wrapping_add(1);
        let key = self.cmds.insert(Cmd {
            session: id,
            seq,
            tag: req.tag,
            lun: lun.unwrap_or_default(),
            // SBC-4 §5.30.1: SANITIZE is processed as HEAD OF QUEUE.
            attr: if op == ferrite_scsi::Opcode::SANITIZE.0 {
                TaskAttr::HeadOfQueue
            } else {
                req.attr
            },
            cdb: req.cdb,
            expected_len: req.expected_len,
            state: CmdState::New,
            plan,
            entry,
            in_task_set: false,
            cont: Cont::None,
            start: now,
            dir: match plan {
                Plan::Read { .. } => IoDir::Read,
                Plan::Write { .. } | Plan::WriteSame { .. } => IoDir::Write,
                _ => IoDir::Other,
            },
            out_bytes: 0,
            locked: false,
            waited: false,
            barrier: None,
            charged: 0,
            chunk_at: 0,
        });
        s.stats.started();
        if let Some(e) = self.cmds[key].entry.as_ref() {
            self.dev_stats.entry(e.device.id).or_default().started();
        }
        let cid = cmd_id(key, seq);
        if let Some(rsp) = early {
            self.respond(key, rsp);
            return cid;
        }
        if let Plan::Fail(sense, residual) = plan {
            self.respond(key, check(sense, residual));
            return cid;
        }
        // Enter the task set of this nexus and LU (a LUN with no logical unit
        // has none: INQUIRY, REPORT LUNS and REQUEST SENSE there just run).
        let attr = self.cmds[key].attr;
        // Admitted while the task set is at hand (no second lookup through
        // `advance`); only a SIMPLE task among ORDERED ones takes the full
        // check there.
        let mut admitted = Some(true);
        if self.cmds[key].entry.is_some()
            && let Some(st) = self.lu_mut(key)
        {
            st.tasks.push_back(key);
            if attr == TaskAttr::Ordered {
                st.ordered += 1;
            }
            admitted = st.admits(key, attr);
            self.cmds[key].in_task_set = true;
        }
        if admitted == Some(true) {
            self.start(key);
        } else {
            self.admit(key);
        }
        cid
    }

    fn count_finished(&mut self, sid: SessionId, dev: Option<DeviceId>, done: &Completion) {
        if let Some(s) = self.sessions.get_mut(&sid) {
            s.stats.finished(done);
        }
        if let Some(d) = dev.and_then(|d| self.dev_stats.get_mut(&d)) {
            d.finished(done);
        }
    }

    /// Frees a closed session once nothing of it remains.
    fn reap(&mut self, id: SessionId) {
        if self.sessions.get(&id).is_some_and(SessionState::reapable) {
            self.sessions.remove(&id);
        }
    }

    /// The slab key of a live command, if `id` is still its id.
    fn key_of(&self, id: CmdId) -> Option<usize> {
        let key = (id.0 & KEY_MASK) as usize;
        let c = self.cmds.get(key)?;
        (cmd_id(key, c.seq) == id).then_some(key)
    }
}

impl Session<'_> {
    /// This session's id.
    pub fn id(&self) -> SessionId {
        self.id
    }

    /// Accepts a command. Its response (or its FetchData) comes out of
    /// [`Session::poll_action`], possibly at once.
    pub fn submit(&mut self, now: Instant, req: CmdRequest) -> CmdId {
        self.shard.submit(self.id, now, req)
    }

    /// The write data of a command arrived (or will not). Latency of a
    /// response queued here is measured at the last `now` the shard saw;
    /// [`Session::data_out_done_at`] gives it the time.
    pub fn data_out_done(&mut self, id: CmdId, data: Result<SgList, Abort>) {
        self.shard.data_out_done(self.id, id, data)
    }

    /// [`Session::data_out_done`] at time `now`.
    pub fn data_out_done_at(&mut self, now: Instant, id: CmdId, data: Result<SgList, Abort>) {
        self.shard.tick(now);
        self.shard.data_out_done(self.id, id, data)
    }

    /// True while commands of this session wait for data memory (the
    /// budget, [`Shard::set_budget`]): a fabric stops widening its command
    /// window (iSCSI MaxCmdSN, SRP request limit) meanwhile.
    pub fn data_waiting(&self) -> bool {
        self.shard
            .sessions
            .get(&self.id)
            .is_some_and(|s| s.buf_waiting > 0)
    }

    /// Whether this session's fabric takes large reads as page-cache pages
    /// in a pipe ([`Response::pipe`]) where the backend can give them. Off
    /// by default: a fabric says yes only if it can splice a pipe into its
    /// transport and release each response's [`DeliveryHold`] once the
    /// initiator has received it.
    pub fn set_pipe_reads(&mut self, on: bool) {
        if let Some(s) = self.shard.sessions.get_mut(&self.id) {
            s.pipe_reads = on;
        }
    }

    /// The response of `id` is sent; the command is forgotten.
    pub fn response_sent(&mut self, id: CmdId) {
        self.shard.response_sent(self.id, id)
    }

    /// Starts a task management function. `Action::TmfDone` is queued once
    /// every affected command has finished or been aborted.
    pub fn task_mgmt(&mut self, now: Instant, req: TmfRequest) -> TmfId {
        self.shard.tick(now);
        self.shard.task_mgmt(self.id, req)
    }

    /// This session's counters so far.
    pub fn stats(&self) -> crate::stats::SessionStats {
        self.shard
            .sessions
            .get(&self.id)
            .map(|s| s.stats)
            .unwrap_or_default()
    }

    /// The next action for the fabric.
    pub fn poll_action(&mut self) -> Option<Action> {
        self.shard.sessions.get_mut(&self.id)?.actions.pop_front()
    }

    /// Moves every queued action to the end of `out`, in order: one
    /// lookup for a whole batch instead of one per action. When `out` is
    /// empty the two queues trade places, so both keep their allocations.
    pub fn take_actions(&mut self, out: &mut VecDeque<Action>) {
        if let Some(s) = self.shard.sessions.get_mut(&self.id) {
            if out.is_empty() {
                std::mem::swap(out, &mut s.actions);
            } else {
                out.append(&mut s.actions);
            }
        }
    }
}

/// `op` as the backend of `dev` gets it: a write carries the FUA the
/// device's policy gives it ([`Device::write_fua`]), whatever path made
/// it (a command, a WRITE SAME fill, a sanitize overwrite, a copy).
fn with_policy(dev: &Device, op: BlockOp) -> BlockOp {
    match op {
        BlockOp::Write { offset, buf, fua } => BlockOp::Write {
            offset,
            buf,
            fua: dev.write_fua(fua),
        },
        op => op,
    }
}

#[cfg(test)]
mod tests;
