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
}

/// Where a command is in its life; each state says what it waits for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum CmdState {
    /// Checked and planned; not yet looked at by the task set.
    New,
    /// Waits for older tasks of its task set (SAM-5 §8.6: an older ORDERED
    /// task, or for an ORDERED task any older task) to finish.
    Blocked,
    /// `Action::FetchData` is queued or carried out; waits for
    /// `data_out_done`.
    NeedData,
    /// The backend queue said Busy; the op waits in `Cmd::op` for a retry
    /// after the next `poll`.
    QueueFull,
    /// Its write (or COMPARE AND WRITE's read) overlaps a range another
    /// command holds (SBC-4 §5.3); the op waits in `Cmd::op` for a retry
    /// after the next `poll`.
    RangeWait,
    /// A block operation is in flight; waits for its `BlockDone`.
    Exec,
    /// `Action::Respond` is queued or being sent; waits for `response_sent`.
    Respond,
    /// A SANITIZE without IMMED: waits for its device's sanitize operation
    /// (a [`SanitizeJob`]), which outlives it if it is aborted.
    Background,
    /// Its data buffer does not fit the [`DataBudget`] now; waits in
    /// `Shard::buf_wait` and starts (or fetches its next chunk) once it
    /// does.
    BufWait,
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

/// What a command made of several block operations still has to do once
/// the current one completes.
enum Cont {
    None,
    /// WRITE SAME by writes: the pattern buffer comes back with each
    /// completion and is written again at `next`, until `end`.
    Fill {
        next: u64,
        end: u64,
    },
    /// UNMAP: byte ranges still to deallocate, last first.
    Unmap(Vec<(u64, u64)>),
    /// COMPARE AND WRITE / ORWRITE: the medium read completes; combine it
    /// with the held Data-Out and write.
    Combine,
    /// EXTENDED COPY: the copy runs its own chunks ([`crate::xcopy`]).
    Copy(Box<crate::xcopy::CopyRun>),
}

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
    /// Aborted by task management or session close: never responds.
    aborted: bool,
    /// Counted in its LU's task set.
    in_task_set: bool,
    /// A block operation handed back by a Busy queue.
    op: Option<BlockOp>,
    cont: Cont,
    /// VERIFY's Data-Out, kept while the medium is read for the comparison.
    held: Option<SgList>,
    /// The `now` it was submitted with (statistics).
    start: Instant,
    /// Direction it is counted in.
    dir: IoDir,
    /// Data-Out bytes received.
    out_bytes: u64,
    /// Counted as active in the statistics (until its response is queued).
    active: bool,
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
    /// Bytes of the budget it waits for in `BufWait`.
    want: u64,
    /// WRITE: the offset in its data of the chunk fetched or written now.
    chunk_at: u32,
}

/// Reads of a session whose data left as page-cache pages and that the
/// initiator has not yet shown it received ([`DeliveryHold`]).
#[derive(Debug, Default)]
struct Deliveries {
    next: u64,
    open: std::collections::BTreeSet<u64>,
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
    /// Active tasks in arrival order (slab keys).
    tasks: VecDeque<usize>,
    /// ORDERED tasks among `tasks`.
    ordered: usize,
}

impl LuState {
    fn raise(&mut self, s: Sense) {
        if self.ua.contains(&s) {
            return;
        }
        if self.ua.len() >= UA_QUEUE_MAX {
            self.ua.pop_front();
        }
        self.ua.push_back(s);
    }

    /// SAM-5 §8.6 for task `key` of attribute `attr`, already in `tasks`,
    /// where this set alone decides: HEAD OF QUEUE at once, ORDERED when
    /// first, SIMPLE when no ORDERED task is in the set. `None`: a SIMPLE
    /// task with ORDERED ones in the set, which runs only if none is older.
    fn admits(&self, key: usize, attr: TaskAttr) -> Option<bool> {
        match attr {
            TaskAttr::HeadOfQueue => Some(true),
            TaskAttr::Ordered => Some(self.tasks.front() == Some(&key)),
            TaskAttr::Simple | TaskAttr::Aca => (self.ordered == 0).then_some(true),
        }
    }
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

/// Who waits for a set of aborted commands to drain.
enum Waiter {
    /// A task management function of a session of this shard.
    Tmf {
        session: SessionId,
        id: TmfId,
        tag: TaskTag,
        rsp: TmfResponse,
        /// Set when other cores apply the reset too: the response also
        /// waits for them.
        span: Option<SpanningResetId>,
    },
    /// A reset another core started ([`Shard::remote_reset`]).
    Remote(RemoteResetId),
}

struct PendingTmf {
    waiter: Waiter,
    /// Commands (slab key, seq) still draining.
    waiting: SmallVec<[(usize, u32); 8]>,
}

/// What a reset started on another core covers on this one (the daemon
/// carries it here by message, SAM-5 §6.3 resets spanning cores).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ResetScope {
    /// LOGICAL UNIT RESET of this device: its commands on every nexus here
    /// are aborted and BUS DEVICE RESET FUNCTION OCCURRED is raised.
    LogicalUnit(DeviceId),
    /// TARGET RESET of the target with this name: every command of its
    /// nexuses here is aborted and POWER ON, RESET, OR BUS DEVICE RESET
    /// OCCURRED is raised.
    Target(String),
}

/// A remote reset's handle on this shard.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RemoteResetId(pub u32);

/// A reset received by a session of this shard that every other core must
/// apply too (SAM-5 §6.3: a logical unit or target reset covers every I_T
/// nexus, wherever it runs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SpanningResetId(pub u32);

/// The TMF response of a spanning reset, held until both this shard's
/// aborted commands and every other core's have drained.
struct HeldTmf {
    span: SpanningResetId,
    session: SessionId,
    /// The response, once this shard's part drained.
    done: Option<Action>,
    /// Every other core reported its part drained.
    others_drained: bool,
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
        // Mark them all first, so that freeing one starts none of the others.
        for &k in &keys {
            self.cmds[k].aborted = true;
        }
        for k in keys {
            // The fabric will not call back for this session: a command
            // waiting for data or for response_sent is gone now.
            match self.cmds[k].state {
                CmdState::Exec => self.cmds[k].aborted = true,
                _ => self.free(k),
            }
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
            progress |= self.capacity_changed();
        }
        progress
    }

    /// Some device was resized: SBC-4 §4.10 / SPC-4 §5.14, every nexus of
    /// this core whose LUN map holds it gets CAPACITY DATA HAS CHANGED (2Ah/
    /// 09h). A session whose fabric reports asynchronous events also gets
    /// it as an AEN at once (SAM-5 §5.14.4 asynchronous event reporting),
    /// queued here rather than on the initiator's next command. The unit
    /// attention stays pending for those sessions as well: iSCSI initiators
    /// commonly ignore AsyncEvent 0 (libiscsi, open-iscsi), and a resize
    /// they never learn of is worse than one reported twice. True if any
    /// nexus was affected.
    fn capacity_changed(&mut self) -> bool {
        let mut woke = Vec::new();
        for (id, s) in self.sessions.iter_mut() {
            if s.closing {
                continue;
            }
            for (lun, e) in &s.luns.luns {
                let g = e.device.generation();
                let st = s.lus.entry(*lun).or_default();
                match st.generation {
                    Some(old) if old != g => {}
                    Some(_) => continue,
                    None => {
                        st.generation = Some(g);
                        continue;
                    }
                }
                st.generation = Some(g);
                st.raise(Sense::CAPACITY_DATA_HAS_CHANGED);
                if s.aen {
                    s.actions.push_back(Action::Aen {
                        lun: *lun,
                        sense: Sense::CAPACITY_DATA_HAS_CHANGED,
                    });
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
        let mut early: Option<Response> = None;
        if let (Some(l), Some(e)) = (lun, entry.as_ref()) {
            let st = s.lus.entry(l).or_default();
            // SBC-4 §4.10: CAPACITY DATA HAS CHANGED once per nexus after a
            // resize.
            if changed(&mut st.generation, e.device.generation()) {
                st.raise(Sense::CAPACITY_DATA_HAS_CHANGED);
            }
            // SPC-4 §5.12: MODE PARAMETERS CHANGED for the nexuses that did
            // not change them.
            let shared = &e.device.shared;
            if changed(&mut st.mode_gen, shared.mode_gen.load(Ordering::Acquire)) {
                st.raise(Sense::MODE_PARAMETERS_CHANGED);
            }
            if changed(&mut st.reset_gen, shared.reset_gen.load(Ordering::Acquire)) {
                st.raise(Sense::BUS_DEVICE_RESET);
            }
            // SBC-4 §4.15: a removable medium loaded by another nexus:
            // NOT READY TO READY CHANGE, MEDIUM MAY HAVE CHANGED.
            if e.device.flags.removable
                && changed(
                    &mut st.medium_gen,
                    shared.medium.load_gen.load(Ordering::Acquire),
                )
            {
                st.raise(Sense::NOT_READY_TO_READY_CHANGE);
            }
            // SBC-4 §4.11.1: while a sanitize runs (on any core) the device
            // server answers little else, and that before a unit attention
            // (libiscsi's Sanitize.Reset: the first command of a new nexus
            // meets SANITIZE IN PROGRESS); after a failed one, media access
            // meets MEDIUM FORMAT CORRUPTED.
            if let Some(sense) = e.device.shared.sanitize.gate(op) {
                early = Some(Response::check(sense));
            }
            // SAM-5 §5.14: a pending unit attention fails the next command,
            // except INQUIRY, REPORT LUNS and REQUEST SENSE, and is cleared.
            if early.is_none()
                && !crate::ops::passes_unit_attention(op)
                && let Some(ua) = st.ua.pop_front()
            {
                early = Some(Response::check(ua));
            }
            // SPC-4 §5.13.11: unit attentions a PERSISTENT RESERVE OUT of
            // another nexus (on any core) raised for this one.
            let mut pr_ua = Vec::new();
            e.device
                .shared
                .take_pr_ua(&s.nexus.initiator_port, &s.nexus.target, &mut pr_ua);
            for ua in pr_ua {
                st.raise(ua);
            }
            if early.is_none()
                && !crate::ops::passes_unit_attention(op)
                && let Some(ua) = st.ua.pop_front()
            {
                early = Some(Response::check(ua));
            }
            // SPC-4 §5.13.1 table 66: a persistent reservation another nexus
            // holds.
            if early.is_none()
                && e.device.shared.pr_reserved.load(Ordering::Acquire)
                && e.device
                    .shared
                    .pr
                    .lock()
                    .is_ok_and(|pr| pr.conflicts(&pr_nexus(&s.nexus), op))
            {
                early = Some(Response::status(ferrite_scsi::Status::RESERVATION_CONFLICT));
            }
            // SPC-2 §5.5.1: a logical unit reserved by another I_T nexus
            // answers RESERVATION CONFLICT to all but a few commands.
            if early.is_none()
                && !crate::ops::passes_reservation(op)
                && e.device.shared.is_reserved()
                && e.device.shared.reserved_by_other(&nexus_key(&s.nexus))
            {
                early = Some(Response::status(ferrite_scsi::Status::RESERVATION_CONFLICT));
            }
        } else if !crate::ops::serves_unmapped_lun(op) {
            // SAM-5 (incorrect logical unit selection): a LUN with no logical
            // unit behind it answers LOGICAL UNIT NOT SUPPORTED.
            early = Some(Response::check(Sense::LOGICAL_UNIT_NOT_SUPPORTED));
        }
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
            aborted: false,
            in_task_set: false,
            op: None,
            cont: Cont::None,
            held: None,
            start: now,
            dir: match plan {
                Plan::Read { .. } => IoDir::Read,
                Plan::Write { .. } | Plan::WriteSame { .. } => IoDir::Write,
                _ => IoDir::Other,
            },
            out_bytes: 0,
            active: true,
            locked: false,
            waited: false,
            barrier: None,
            charged: 0,
            want: 0,
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
            self.advance(key);
        }
        cid
    }

    fn lu_mut(&mut self, key: usize) -> Option<&mut LuState> {
        let c = self.cmds.get(key)?;
        let (sid, lun) = (c.session, c.lun);
        self.sessions.get_mut(&sid)?.lus.get_mut(&lun)
    }

    /// SAM-5 §8.6: may this task start? HEAD OF QUEUE at once; SIMPLE when no
    /// older ORDERED task is active; ORDERED when no older task is active.
    fn may_start(&self, key: usize) -> bool {
        let Some(c) = self.cmds.get(key) else {
            return false;
        };
        if !c.in_task_set {
            return true;
        }
        let Some(st) = self
            .sessions
            .get(&c.session)
            .and_then(|s| s.lus.get(&c.lun))
        else {
            return true;
        };
        if let Some(decided) = st.admits(key, c.attr) {
            return decided;
        }
        // A SIMPLE task among ORDERED ones: it runs if none is older.
        for &k in &st.tasks {
            if k == key {
                return true;
            }
            if self
                .cmds
                .get(k)
                .is_some_and(|o| o.attr == TaskAttr::Ordered)
            {
                return false;
            }
        }
        true
    }

    /// Advances a command as far as it can go now.
    fn advance(&mut self, key: usize) {
        let Some(c) = self.cmds.get(key) else {
            return;
        };
        match c.state {
            CmdState::New | CmdState::Blocked => {
                if c.aborted {
                    return;
                }
                if !self.may_start(key) {
                    self.cmds[key].state = CmdState::Blocked;
                    self.cmds[key].waited = true;
                    return;
                }
                self.start(key);
            }
            // The others move on events: data_out_done, poll, response_sent.
            CmdState::NeedData
            | CmdState::QueueFull
            | CmdState::RangeWait
            | CmdState::BufWait
            | CmdState::Exec
            | CmdState::Respond
            | CmdState::Background => {}
        }
    }

    /// Runs a command the task set let through.
    fn start(&mut self, key: usize) {
        let c = &self.cmds[key];
        match c.plan {
            Plan::Fail(s, r) => self.respond(key, check(s, r)),
            Plan::Good(r) => self.respond(key, good(r)),
            Plan::DataIn => self.start_data_in(key),
            Plan::Read {
                offset, len, xfer, ..
            } => {
                let op = match self.read_pipe(key, offset, len, xfer) {
                    Some(pipe) => BlockOp::ReadPipe { offset, len, pipe },
                    None if !self.reserve(key, u64::from(len)) => return,
                    None => BlockOp::Read {
                        offset,
                        buf: self.pool.sg(len as usize),
                    },
                };
                self.submit_op(key, op);
            }
            Plan::Write { .. } => self.fetch_write(key, None),
            Plan::Flush(_) => self.submit_op(key, BlockOp::Flush),
            Plan::WriteSame { ndob: true, .. } => self.write_same(key, None),
            Plan::WriteSame { .. } => {
                let bs = c
                    .entry
                    .as_ref()
                    .map_or(0, |e| e.device.geometry().block_size);
                self.fetch(key, bs)
            }
            Plan::Unmap { param_len, .. } => self.fetch(key, param_len),
            Plan::Compare { data_len, .. } => self.fetch(key, data_len),
            Plan::ReadModifyWrite { data_len, .. } => self.fetch(key, data_len),
            Plan::PrOut { param_len: 0, .. } => self.pr_out(key, &[]),
            Plan::ModeSelect { param_len, .. } => self.fetch(key, param_len),
            Plan::PrOut { param_len, .. } => self.fetch(key, param_len),
            Plan::ExtendedCopy { param_len, .. } => self.fetch(key, param_len),
            Plan::CopyResults => self.copy_results(key),
            Plan::PreventAllow { prevent, residual } => {
                let holder = medium_holder(self.core, c.session);
                let watch = self.sessions.get(&c.session).and_then(|s| s.watch.clone());
                if let Some(e) = c.entry.as_ref() {
                    e.device.shared.medium.prevent(holder, prevent, &watch);
                }
                self.respond(key, good(residual));
            }
            Plan::LoadEject { load, residual } => self.load_eject(key, load, residual),
            Plan::Sanitize { param_len: 0, .. } => self.sanitize(key, &[]),
            Plan::Sanitize { param_len, .. } => self.fetch(key, param_len),
            Plan::Reserve | Plan::Release => {
                let Some(s) = self.sessions.get(&c.session) else {
                    return;
                };
                let me = nexus_key(&s.nexus);
                let Some(dev) = c.entry.as_ref().map(|e| e.device.clone()) else {
                    return;
                };
                let rsp = if c.plan == Plan::Reserve {
                    if dev.shared.reserve(&me, &s.watch) {
                        Response::good()
                    } else {
                        Response::status(ferrite_scsi::Status::RESERVATION_CONFLICT)
                    }
                } else {
                    // SPC-2 §7.17: a RELEASE from another nexus is GOOD and
                    // changes nothing.
                    dev.shared.release(Some(&me));
                    Response::good()
                };
                self.respond(key, rsp);
            }
        }
    }

    /// SBC-4 §5.25 START STOP UNIT with LOEJ on a removable device: load
    /// or eject unless some nexus (on any core) prevents medium removal.
    /// Loading an ejected medium raises NOT READY TO READY CHANGE on the
    /// other nexuses (seen at their next command through the device's load
    /// generation), not on this one, which knows.
    fn load_eject(&mut self, key: usize, load: bool, residual: Residual) {
        let c = &self.cmds[key];
        let (sid, lun) = (c.session, c.lun);
        let Some(dev) = c.entry.as_ref().map(|e| e.device.clone()) else {
            return;
        };
        let rsp = match dev.shared.medium.load_eject(load) {
            Ok(loaded) => {
                if loaded
                    && let Some(st) = self
                        .sessions
                        .get_mut(&sid)
                        .and_then(|s| s.lus.get_mut(&lun))
                {
                    st.medium_gen = Some(dev.shared.medium.load_gen.load(Ordering::Acquire));
                }
                good(residual)
            }
            Err(sense) => check(sense, residual),
        };
        self.respond(key, rsp);
    }

    /// Asks the fabric for `len` bytes of Data-Out in a pool buffer.
    fn fetch(&mut self, key: usize, len: u32) {
        self.fetch_at(key, 0, len, None);
    }

    /// Asks the fabric for the WRITE's current chunk (from `chunk_at`),
    /// into `reuse` if it is large enough.
    fn fetch_write(&mut self, key: usize, reuse: Option<SgList>) {
        let c = &self.cmds[key];
        let Plan::Write { len, atomic, .. } = c.plan else {
            return;
        };
        let at = c.chunk_at;
        let n = write_chunk(len, at, atomic);
        self.fetch_at(key, at, n, reuse);
    }

    /// Asks the fabric for `len` bytes of Data-Out from `offset` of the
    /// command's data, in a buffer of `len` bytes; waits in `BufWait` if
    /// the budget has no room for it.
    fn fetch_at(&mut self, key: usize, offset: u32, len: u32, reuse: Option<SgList>) {
        if !self.reserve(key, u64::from(len)) {
            return;
        }
        let buf = match reuse {
            Some(mut b) if b.len() >= len as usize => {
                b.truncate(len as usize);
                b
            }
            _ => self.pool.sg(len as usize),
        };
        let c = &mut self.cmds[key];
        c.state = CmdState::NeedData;
        let (sid, tag, id) = (c.session, c.tag, cmd_id(key, c.seq));
        self.push_action(
            sid,
            Action::FetchData {
                id,
                tag,
                buf,
                offset,
                len,
            },
        );
    }

    /// Makes the command hold `n` bytes of the data budget. False if they
    /// do not fit now: the command then waits in `BufWait` (and is started
    /// again by [`Shard::retry_buffers`]).
    fn reserve(&mut self, key: usize, n: u64) -> bool {
        let c = &self.cmds[key];
        if c.charged >= n {
            return true;
        }
        let (sid, extra) = (c.session, n - c.charged);
        let held = self.sessions.get(&sid).map_or(0, |s| s.data_held);
        if self.budget.try_take(extra, held) {
            if let Some(s) = self.sessions.get_mut(&sid) {
                s.data_held += extra;
            }
            self.cmds[key].charged = n;
            return true;
        }
        let c = &mut self.cmds[key];
        c.want = n;
        if c.state != CmdState::BufWait {
            c.state = CmdState::BufWait;
            self.buf_wait.push_back(key);
            self.budget.note_wait(true);
            if let Some(s) = self.sessions.get_mut(&sid) {
                s.buf_waiting += 1;
            }
        }
        false
    }

    /// Starts again the commands in `BufWait` whose buffers now fit, oldest
    /// first; a command that still does not fit keeps its place. True if
    /// any did.
    fn retry_buffers(&mut self) -> bool {
        let mut progress = false;
        let mut i = 0;
        while i < self.buf_wait.len() {
            let key = self.buf_wait[i];
            let Some(c) = self.cmds.get(key).filter(|c| c.state == CmdState::BufWait) else {
                self.buf_wait.remove(i);
                continue;
            };
            let (sid, want, extra) = (c.session, c.want, c.want.saturating_sub(c.charged));
            let held = self.sessions.get(&sid).map_or(0, |s| s.data_held);
            if !self.budget.try_take(extra, held) {
                i += 1;
                continue;
            }
            self.buf_wait.remove(i);
            self.budget.note_wait(false);
            if let Some(s) = self.sessions.get_mut(&sid) {
                s.data_held += extra;
                s.buf_waiting = s.buf_waiting.saturating_sub(1);
            }
            let c = &mut self.cmds[key];
            c.charged = want;
            c.state = CmdState::New;
            // Every plan that takes a buffer is started again from the top:
            // a WRITE goes on from `chunk_at`, and the buffer is held now.
            self.start(key);
            progress = true;
        }
        progress
    }

    /// Gives back the budget a command holds and takes it off `buf_wait`.
    fn release_budget(&mut self, c: &Cmd, key: usize) {
        let s = self.sessions.get_mut(&c.session);
        if c.state == CmdState::BufWait {
            if let Some(p) = self.buf_wait.iter().position(|&k| k == key) {
                self.buf_wait.remove(p);
            }
            self.budget.note_wait(false);
        }
        let mut left = 0;
        if let Some(s) = s {
            if c.state == CmdState::BufWait {
                s.buf_waiting = s.buf_waiting.saturating_sub(1);
            }
            s.data_held = s.data_held.saturating_sub(c.charged);
            left = s.data_held;
        }
        self.budget.give(c.charged, left);
    }

    /// Carries out a WRITE SAME (SBC-4 §5.48, §5.49) with its one-block
    /// `pattern` (`None`: NDOB, zeroes): unmap if asked and the result reads
    /// as the pattern, write zeroes without a buffer if the backend can, or
    /// write the pattern in chunks of at most MAXIMUM TRANSFER LENGTH.
    fn write_same(&mut self, key: usize, pattern: Option<SgList>) {
        let c = &self.cmds[key];
        let (
            Plan::WriteSame {
                offset, len, unmap, ..
            },
            Some(dev),
        ) = (c.plan, c.entry.as_ref().map(|e| e.device.clone()))
        else {
            return;
        };
        let caps = dev.backend.caps();
        let bs = dev.geometry().block_size as usize;
        let zero = pattern
            .as_ref()
            .is_none_or(|p| p.slices(0, p.len()).all(|s| s.iter().all(|&b| b == 0)));
        // SBC-4 §5.48 with LBPWS set: the UNMAP bit deallocates the range;
        // it then reads as LBPRZ says, whatever the Data-Out held (as Linux
        // LIO does, and libiscsi's WriteSame*.Unmap tests expect).
        if unmap && caps.unmap {
            self.submit_op(key, BlockOp::Unmap { offset, len });
            return;
        }
        if zero && caps.write_zeroes {
            self.submit_op(key, BlockOp::WriteZeroes { offset, len });
            return;
        }
        let mut block = vec![0u8; bs];
        if let Some(p) = &pattern {
            p.copy_out(0, &mut block);
        }
        let chunk = len.min(u64::from(WRITE_CHUNK));
        let mut buf = self.pool.sg(chunk as usize);
        let mut at = 0;
        while at < chunk as usize {
            at += buf.copy_in(at, &block).max(1);
        }
        self.cmds[key].cont = Cont::Fill {
            next: offset + chunk,
            end: offset + len,
        };
        self.submit_op(
            key,
            BlockOp::Write {
                offset,
                buf,
                fua: false,
            },
        );
    }

    /// Starts an UNMAP once its parameter list arrived.
    fn unmap(&mut self, key: usize, list: SgList) {
        let c = &self.cmds[key];
        let (Plan::Unmap { residual, .. }, Some(dev)) =
            (c.plan, c.entry.as_ref().map(|e| e.device.clone()))
        else {
            return;
        };
        let g = dev.geometry();
        let mut ranges = Vec::new();
        match emulate::unmap_ranges(&list.to_vec(), g.num_blocks, g.block_size, &mut ranges) {
            Err(s) => self.respond(key, Response::check(s)),
            Ok(()) => {
                ranges.reverse();
                match ranges.pop() {
                    None => self.respond(key, good(residual)),
                    Some((offset, len)) => {
                        self.cmds[key].cont = Cont::Unmap(ranges);
                        self.submit_op(key, BlockOp::Unmap { offset, len });
                    }
                }
            }
        }
    }

    /// Submits the next operation of a multi-operation command, if any;
    /// hands the buffer back if there was nothing left to do.
    fn continue_cmd(&mut self, key: usize, buf: Option<SgList>) -> Result<(), Option<SgList>> {
        let c = &mut self.cmds[key];
        match &mut c.cont {
            Cont::None => Err(buf),
            Cont::Fill { next, end } => {
                if *next >= *end {
                    return Err(buf);
                }
                let Some(mut buf) = buf else {
                    return Err(None);
                };
                let offset = *next;
                let n = (*end - *next).min(buf.len() as u64);
                buf.truncate(n as usize);
                *next += n;
                self.submit_op(
                    key,
                    BlockOp::Write {
                        offset,
                        buf,
                        fua: false,
                    },
                );
                Ok(())
            }
            Cont::Copy(_) => Err(buf),
            Cont::Combine => Err(buf),
            Cont::Unmap(ranges) => match ranges.pop() {
                None => Err(buf),
                Some((offset, len)) => {
                    self.submit_op(key, BlockOp::Unmap { offset, len });
                    Ok(())
                }
            },
        }
    }

    fn start_data_in(&mut self, key: usize) {
        let c = &self.cmds[key];
        let Some(s) = self.sessions.get_mut(&c.session) else {
            return;
        };
        // REQUEST SENSE reports (and so clears) a pending unit attention;
        // SBC-4 §4.11.1: while a sanitize runs, its progress instead.
        let pending = match c.entry.as_ref() {
            Some(e) if c.cdb.first() == Some(&ferrite_scsi::Opcode::REQUEST_SENSE.0) => {
                match e.device.shared.sanitize.status() {
                    sanitize::Status::Running(p) => {
                        Some(Sense::SANITIZE_IN_PROGRESS.with_progress(p))
                    }
                    _ => s.lus.get_mut(&c.lun).and_then(|st| st.ua.pop_front()),
                }
            }
            _ => None,
        };
        let ctx = DataCtx {
            entry: c.entry.as_ref(),
            luns: &s.luns,
            rel_port: s.nexus.rel_port_id,
            target: &s.nexus.target,
            pending,
        };
        let mut out = std::mem::take(&mut self.scratch);
        let r = emulate::data_in(&c.cdb, &ctx, &mut out);
        let rsp = self.data_in_response(r, &out, c.expected_len);
        self.scratch = out;
        self.respond(key, rsp);
    }

    /// The response to an emulated command that returns `out` (or failed):
    /// SPC-4 §4.2.5.6, the data truncated to the allocation length, then to
    /// what the transport expects, with the residual.
    fn data_in_response(&self, r: Result<u32, Sense>, out: &[u8], expected: u32) -> Response {
        match r {
            Ok(alloc) => {
                let spdtl = out.len().min(alloc as usize);
                let (xfer, residual) = emulate::residual_in(spdtl as u64, expected);
                let mut rsp = good(residual);
                if xfer > 0 {
                    let mut sg = self.pool.sg(xfer as usize);
                    sg.copy_in(0, &out[..xfer as usize]);
                    rsp.data = Some(sg);
                    rsp.data_len = xfer;
                }
                rsp
            }
            Err(s) => Response::check(s),
        }
    }

    /// The backend queue of `dev` on this shard, opened on first use.
    fn queue(&mut self, dev: &Device) -> Option<&mut Box<dyn BackendQueue>> {
        let dq = self.queues.entry(dev.id).or_insert(DevQueue {
            q: None,
            logged: false,
        });
        if dq.q.is_none() {
            match dev.backend.open_queue(QUEUE_DEPTH) {
                Ok(q) => dq.q = Some(q),
                Err(e) => {
                    if !dq.logged {
                        dq.logged = true;
                        tracing::error!(device = %dev.name, core = self.core, error = %e,
                            "cannot open backend queue");
                    }
                }
            }
        }
        dq.q.as_mut()
    }

    fn submit_op(&mut self, key: usize, op: BlockOp) {
        let Some(dev) = self.cmds[key].entry.as_ref().map(|e| e.device.clone()) else {
            self.respond(key, Response::check(Sense::LOGICAL_UNIT_NOT_SUPPORTED));
            return;
        };
        // A write ordered after older tasks must not change pages that
        // their responses still carry to the initiator (`Response::pipe`):
        // it waits until the initiator has them.
        if self.cmds[key].waited
            && matches!(
                op,
                BlockOp::Write { .. } | BlockOp::WriteZeroes { .. } | BlockOp::Unmap { .. }
            )
            && !self.delivered(key)
        {
            self.cmds[key].op = Some(op);
            self.cmds[key].state = CmdState::RangeWait;
            self.range_wait.push_back(key);
            return;
        }
        // SBC-4 §5.3: COMPARE AND WRITE (and ORWRITE) hold their range from
        // the read to the write; writes of others wait for it.
        let owner = self.owner(key);
        let c = &self.cmds[key];
        let range = match (&op, c.plan) {
            (BlockOp::Read { offset, buf }, Plan::ReadModifyWrite { .. }) if !c.locked => {
                Some((*offset, *offset + buf.len() as u64, true))
            }
            (BlockOp::Write { offset, buf, .. }, plan) if !c.locked => Some((
                *offset,
                *offset + buf.len() as u64,
                matches!(plan, Plan::Write { atomic: true, .. }),
            )),
            (BlockOp::WriteZeroes { offset, len } | BlockOp::Unmap { offset, len }, _)
                if !c.locked =>
            {
                Some((*offset, *offset + *len, false))
            }
            _ => None,
        };
        if let Some((start, end, take)) = range {
            let locks = &dev.shared.ranges;
            let wait = if take {
                !locks.try_lock(start, end, owner)
            } else {
                locks.conflicts(start, end, owner)
            };
            if wait {
                self.cmds[key].op = Some(op);
                self.cmds[key].state = CmdState::RangeWait;
                self.range_wait.push_back(key);
                return;
            }
            if take {
                self.cmds[key].locked = true;
            }
        }
        // Keep arrival order behind operations already waiting for a slot.
        if !self.retry.is_empty() {
            self.cmds[key].op = Some(op);
            self.cmds[key].state = CmdState::QueueFull;
            self.retry.push_back(key);
            return;
        }
        let tag = tag_of(key, self.cmds[key].seq);
        let Some(q) = self.queue(&dev) else {
            drop(op);
            self.respond(
                key,
                Response::check(Sense::LOGICAL_UNIT_COMMUNICATION_FAILURE),
            );
            return;
        };
        match q.submit(tag, with_policy(&dev, op)) {
            Ok(()) => self.cmds[key].state = CmdState::Exec,
            Err(Busy(op)) => {
                // SPDK/STYLE rule 5: a full queue is a waiting state.
                self.cmds[key].op = Some(op);
                self.cmds[key].state = CmdState::QueueFull;
                self.retry.push_back(key);
            }
        }
    }

    /// Retries operations a full queue handed back, oldest first; one that is
    /// still refused keeps its place. True if any was accepted.
    fn retry_busy(&mut self) -> bool {
        let mut progress = false;
        let n = self.retry.len();
        let mut refused: SmallVec<[DeviceId; 4]> = SmallVec::new();
        for _ in 0..n {
            let Some(key) = self.retry.pop_front() else {
                break;
            };
            let Some(c) = self.cmds.get_mut(key) else {
                continue;
            };
            let tag = tag_of(key, c.seq);
            let (Some(op), Some(dev)) = (c.op.take(), c.entry.as_ref().map(|e| e.device.clone()))
            else {
                continue;
            };
            if refused.contains(&dev.id) {
                self.cmds[key].op = Some(op);
                self.retry.push_back(key);
                continue;
            }
            let Some(q) = self.queue(&dev) else {
                drop(op);
                self.respond(
                    key,
                    Response::check(Sense::LOGICAL_UNIT_COMMUNICATION_FAILURE),
                );
                progress = true;
                continue;
            };
            match q.submit(tag, with_policy(&dev, op)) {
                Ok(()) => {
                    self.cmds[key].state = CmdState::Exec;
                    progress = true;
                }
                Err(Busy(op)) => {
                    self.cmds[key].op = Some(op);
                    self.retry.push_back(key);
                    refused.push(dev.id);
                }
            }
        }
        progress
    }

    /// Runs a PERSISTENT RESERVE OUT with its parameter list (SPC-4 §6.17):
    /// the state changes under the device's lock; unit attentions go to the
    /// other nexuses on every core; PREEMPT AND ABORT aborts the preempted
    /// nexuses' tasks of this device on this shard (SAM-5 §5.6; other cores
    /// through [`Shard::abort_preempted`]).
    fn pr_out(&mut self, key: usize, params: &[u8]) {
        let c = &self.cmds[key];
        let (Some(dev), Some(s)) = (
            c.entry.as_ref().map(|e| e.device.clone()),
            self.sessions.get(&c.session),
        ) else {
            return;
        };
        let residual = match c.plan {
            Plan::PrOut { residual, .. } => residual,
            _ => Residual::None,
        };
        let me = pr_nexus(&s.nexus);
        let cdb = c.cdb.clone();
        let result = match dev.shared.pr.lock() {
            Ok(mut pr) => {
                let r = pr.out(&me, &cdb, params);
                if r.is_ok() {
                    dev.shared
                        .pr_reserved
                        .store(pr.res.is_some(), std::sync::atomic::Ordering::Release);
                    dev.shared.persist_pr(&pr);
                }
                r
            }
            Err(_) => Err(PrError::Check(Sense::INTERNAL_TARGET_FAILURE)),
        };
        match result {
            Ok(fx) => {
                if !fx.abort.is_empty() {
                    self.abort_preempted(dev.id, &fx.abort);
                    self.preempted.push((dev.id, fx.abort));
                }
                dev.shared.queue_pr_ua(fx.ua);
                self.respond(key, good(residual));
            }
            Err(PrError::Conflict) => self.respond(
                key,
                Response::status(ferrite_scsi::Status::RESERVATION_CONFLICT),
            ),
            Err(PrError::Check(sense)) => self.respond(key, check(sense, residual)),
        }
    }

    /// Applies MODE SELECT parameter data (SPC-4 §6.9): D_SENSE and SWP of
    /// the Control page are shared by every nexus; a change raises MODE
    /// PARAMETERS CHANGED on the others (through the device's mode
    /// generation).
    fn mode_select(&mut self, key: usize, params: &[u8]) {
        let c = &self.cmds[key];
        let (Some(e), Plan::ModeSelect { residual, .. }) = (c.entry.clone(), c.plan) else {
            return;
        };
        let ten = c.cdb.first() == Some(&ferrite_scsi::Opcode::MODE_SELECT_10.0);
        let dev = &e.device;
        let g = dev.geometry();
        let st = ferrite_scsi::mode::ModeState {
            num_blocks: g.num_blocks,
            block_size: g.block_size,
            write_protect: e.write_protected(),
            write_cache: dev.write_cache_enabled(),
            d_sense: dev.d_sense(),
            swp: dev.swp(),
        };
        match ferrite_scsi::mode::mode_select(ten, params, &st) {
            Err(s) => self.respond(key, check(s, residual)),
            Ok(ch) => {
                let bits = (u8::from(ch.d_sense) * crate::device::MODE_D_SENSE)
                    | (u8::from(ch.swp) * crate::device::MODE_SWP);
                let old = dev
                    .shared
                    .mode
                    .swap(bits, std::sync::atomic::Ordering::AcqRel);
                if old != bits {
                    let mg = dev
                        .shared
                        .mode_gen
                        .fetch_add(1, std::sync::atomic::Ordering::AcqRel)
                        .wrapping_add(1);
                    if let Some(st) = self.lu_mut(key) {
                        st.mode_gen = Some(mg);
                    }
                }
                self.respond(key, good(residual));
            }
        }
    }

    /// Moves the PREEMPT AND ABORTs this shard ran into `out`: the daemon
    /// sends each to every other core, which calls
    /// [`Shard::abort_preempted`] with it (SPC-4 §5.13.11.5: the preempted
    /// nexuses' tasks are aborted wherever they run).
    pub fn drain_preempted(&mut self, out: &mut Vec<(DeviceId, Vec<PrNexus>)>) {
        out.append(&mut self.preempted);
    }

    /// Aborts the tasks of `device` from the `preempted` nexuses on this
    /// shard (PREEMPT AND ABORT, SPC-4 §5.13.11.5). Aborted tasks send no
    /// status. The core that ran the PERSISTENT RESERVE OUT calls it for its
    /// own sessions; the daemon forwards it to the other cores.
    pub fn abort_preempted(&mut self, device: DeviceId, preempted: &[PrNexus]) {
        let sessions: SmallVec<[SessionId; 8]> = self
            .sessions
            .iter()
            .filter(|(_, s)| {
                preempted
                    .iter()
                    .any(|n| n.covers(&s.nexus.initiator_port, &s.nexus.target))
            })
            .map(|(k, _)| *k)
            .collect();
        if sessions.is_empty() {
            return;
        }
        let _ = self.abort_where(|c| {
            sessions.contains(&c.session) && c.entry.as_ref().is_some_and(|e| e.device.id == device)
        });
    }

    /// The owner token of a command in the device range locks: unique
    /// across cores.
    /// A pipe for a read of `len` bytes at `offset` that can travel as
    /// page-cache pages: large enough for the pipe to pay, sent whole, to a
    /// session that takes pipes, from a backend that fills them.
    fn read_pipe(&mut self, key: usize, offset: u64, len: u32, xfer: u32) -> Option<Pipe> {
        if len < PIPE_READ_MIN || xfer != len {
            return None;
        }
        let c = &self.cmds[key];
        if !self.sessions.get(&c.session).is_some_and(|s| s.pipe_reads) {
            return None;
        }
        if !c.entry.as_ref()?.device.backend.caps().read_pipe {
            return None;
        }
        let pool = self
            .pipes
            .get_or_insert_with(|| PipePool::new(PIPES_IDLE, PIPES_LIVE))
            .as_ref()?;
        if !pool.fits(offset, len as usize) {
            return None;
        }
        pool.get()
    }

    /// A hold on the command's session until the initiator has the
    /// response's pipe data (see [`PipeData`]).
    fn delivery_hold(&self, key: usize) -> Option<DeliveryHold> {
        let d = self
            .sessions
            .get(&self.cmds[key].session)?
            .deliveries
            .clone();
        let id = {
            let mut g = d.try_borrow_mut().ok()?;
            let id = g.next;
            g.next += 1;
            g.open.insert(id);
            id
        };
        Some(DeliveryHold::on_drop(move || {
            if let Ok(mut g) = d.try_borrow_mut() {
                g.open.remove(&id);
            }
        }))
    }

    /// Whether every response of the command's session that carried pipe
    /// data before the command started has been delivered. The first time
    /// it is not, the fabric is asked to find out
    /// ([`Action::ConfirmDelivery`]).
    fn delivered(&mut self, key: usize) -> bool {
        let c = &mut self.cmds[key];
        let Some(s) = self.sessions.get_mut(&c.session) else {
            return true;
        };
        let Ok(d) = s.deliveries.try_borrow() else {
            return true;
        };
        let first = c.barrier.is_none();
        let barrier = *c.barrier.get_or_insert(d.next);
        let done = d.open.first().is_none_or(|&f| f >= barrier);
        drop(d);
        if !done && first {
            let sid = c.session;
            s.actions.push_back(Action::ConfirmDelivery);
            s.mark_ready(sid, &mut self.ready);
        }
        done
    }

    fn owner(&self, key: usize) -> u64 {
        ((self.core as u64) << 32) | self.cmds[key].seq as u64
    }

    /// Retries operations that waited for a held range, oldest first.
    fn retry_ranges(&mut self) -> bool {
        let mut progress = false;
        for _ in 0..self.range_wait.len() {
            let Some(key) = self.range_wait.pop_front() else {
                break;
            };
            let Some(op) = self.cmds.get_mut(key).and_then(|c| c.op.take()) else {
                continue;
            };
            self.submit_op(key, op);
            if self
                .cmds
                .get(key)
                .is_some_and(|c| c.state != CmdState::RangeWait)
            {
                progress = true;
            }
        }
        progress
    }

    /// COMPARE AND WRITE / ORWRITE: the medium was read into `medium`;
    /// compare or OR with the held Data-Out, then write (the range stays
    /// held until the response).
    fn combine(&mut self, key: usize, medium: Option<SgList>) {
        let c = &mut self.cmds[key];
        let Plan::ReadModifyWrite {
            offset,
            len,
            fua,
            kind,
            ..
        } = c.plan
        else {
            return;
        };
        let (Some(data), Some(mut medium)) = (c.held.take(), medium) else {
            self.respond(key, Response::check(Sense::INTERNAL_TARGET_FAILURE));
            return;
        };
        let len = len as usize;
        let mut d = vec![0u8; data.len()];
        data.copy_out(0, &mut d);
        let mut m = vec![0u8; len];
        medium.copy_out(0, &mut m);
        match kind {
            Rmw::CompareAndWrite => {
                // SBC-4 §5.3: MISCOMPARE with the offset of the first
                // differing byte in INFORMATION; nothing is written.
                if let Some(at) = emulate::first_miscompare(&d[..len], &m) {
                    self.respond(
                        key,
                        Response::check(Sense::MISCOMPARE_DURING_VERIFY.with_info(at as u64)),
                    );
                    return;
                }
                medium.copy_in(0, &d[len..]);
            }
            Rmw::Or => {
                for (a, b) in m.iter_mut().zip(&d) {
                    *a |= *b;
                }
                medium.copy_in(0, &m);
            }
        }
        medium.truncate(len);
        self.submit_op(
            key,
            BlockOp::Write {
                offset,
                buf: medium,
                fua,
            },
        );
    }

    /// Runs a SANITIZE once its parameter list (if any) arrived (SBC-4
    /// §5.30): EXIT FAILURE MODE at once; OVERWRITE and BLOCK ERASE claim
    /// the device and start a [`SanitizeJob`], answered now with IMMED and
    /// when the operation ends without.
    fn sanitize(&mut self, key: usize, params: &[u8]) {
        let c = &self.cmds[key];
        let (
            Some(dev),
            Plan::Sanitize {
                sa,
                immed,
                ause,
                residual,
                ..
            },
        ) = (c.entry.as_ref().map(|e| e.device.clone()), c.plan)
        else {
            return;
        };
        let seq = c.seq;
        let g = dev.geometry();
        let method = match sa {
            sanitize::sa::EXIT_FAILURE_MODE => {
                let rsp = match dev.shared.sanitize.exit_failure_mode() {
                    Ok(()) => good(residual),
                    Err(s) => check(s, residual),
                };
                self.respond(key, rsp);
                return;
            }
            sanitize::sa::OVERWRITE => match sanitize::parse_overwrite(params, g.block_size) {
                Ok(o) => sanitize::Method::Overwrite(o),
                Err(s) => {
                    self.respond(key, check(s, residual));
                    return;
                }
            },
            _ => sanitize::Method::BlockErase,
        };
        if let Err(s) = dev.shared.sanitize.begin(ause) {
            self.respond(key, check(s, residual));
            return;
        }
        let job_seq = self.next_sanitize;
        self.next_sanitize = self.next_sanitize.wrapping_add(1);
        self.sanitizing.insert(SanitizeJob {
            dev,
            op: sanitize::Operation::new(method, g.bytes()),
            cmd: (!immed).then_some((key, seq)),
            residual,
            ause,
            start: self.now,
            busy: None,
            in_flight: false,
            seq: job_seq,
        });
        if immed {
            self.respond(key, good(residual));
        } else {
            self.cmds[key].state = CmdState::Background;
        }
        self.drive_sanitize(self.now);
    }

    /// Issues the next block operation of every sanitize operation with
    /// none in flight whose pacing allows it. True if any moved.
    fn drive_sanitize(&mut self, now: Option<Instant>) -> bool {
        let keys: SmallVec<[usize; 4]> = self
            .sanitizing
            .iter()
            .filter(|(_, j)| !j.in_flight)
            .map(|(k, _)| k)
            .collect();
        let mut progress = false;
        for k in keys {
            let j = &mut self.sanitizing[k];
            let op = match j.busy.take() {
                Some(op) => op,
                None => {
                    if let (Some(now), Some(start)) = (now, j.start)
                        && start
                            .checked_add(j.op.next_write_after())
                            .is_none_or(|due| now < due)
                    {
                        continue;
                    }
                    match j.op.next_step() {
                        Step::Done => {
                            self.finish_sanitize(k, true);
                            progress = true;
                            continue;
                        }
                        Step::Write {
                            offset,
                            len,
                            inverted,
                        } => {
                            let block = j.op.block(inverted);
                            let mut buf = self.pool.sg(len as usize);
                            let mut at = 0;
                            while at < len as usize {
                                at += buf.copy_in(at, &block).max(1);
                            }
                            BlockOp::Write {
                                offset,
                                buf,
                                fua: false,
                            }
                        }
                        Step::Unmap { offset, len } => BlockOp::Unmap { offset, len },
                        Step::Flush => BlockOp::Flush,
                    }
                }
            };
            let j = &self.sanitizing[k];
            let tag = ((j.seq as u64) << 32) | SANITIZE_TAG | k as u64;
            let dev = j.dev.clone();
            let Some(q) = self.queue(&dev) else {
                self.finish_sanitize(k, false);
                progress = true;
                continue;
            };
            match q.submit(tag, with_policy(&dev, op)) {
                Ok(()) => {
                    self.sanitizing[k].in_flight = true;
                    progress = true;
                }
                Err(Busy(op)) => self.sanitizing[k].busy = Some(op),
            }
        }
        progress
    }

    /// A block operation of a sanitize operation finished.
    fn sanitize_done(&mut self, d: BlockDone) {
        let k = (d.tag & (SANITIZE_TAG - 1)) as usize;
        let seq = (d.tag >> 32) as u32;
        let Some(j) = self.sanitizing.get_mut(k) else {
            return;
        };
        if j.seq != seq {
            return;
        }
        j.in_flight = false;
        drop(d.buf);
        match d.result {
            Ok(()) => {
                j.dev.shared.sanitize.set_progress(j.op.progress());
                self.drive_sanitize(self.now);
            }
            Err(e) => {
                tracing::error!(device = %j.dev.name, error = %e, "sanitize failed");
                self.finish_sanitize(k, false);
            }
        }
    }

    /// Ends a sanitize operation: the device's state says how, and the
    /// SANITIZE that waited for it (if still there) is answered.
    fn finish_sanitize(&mut self, k: usize, ok: bool) {
        if !self.sanitizing.contains(k) {
            return;
        }
        let j = self.sanitizing.remove(k);
        j.dev.shared.sanitize.finish(ok, j.ause);
        if let Some((key, seq)) = j.cmd
            && self
                .cmds
                .get(key)
                .is_some_and(|c| c.seq == seq && c.state == CmdState::Background && !c.aborted)
        {
            let rsp = if ok {
                good(j.residual)
            } else {
                Response::check(Sense::SANITIZE_COMMAND_FAILED)
            };
            self.respond(key, rsp);
        }
    }

    /// A block operation finished.
    fn complete(&mut self, d: BlockDone) {
        if let Some((key, seq, slot)) = crate::xcopy::untag(d.tag) {
            self.xcopy_done(key, seq, slot, d);
            return;
        }
        if d.tag & SANITIZE_TAG != 0 {
            self.sanitize_done(d);
            return;
        }
        let key = (d.tag & 0xffff_ffff) as usize;
        let seq = (d.tag >> 32) as u32;
        let Some(c) = self.cmds.get(key) else {
            return;
        };
        if c.seq != seq || c.state != CmdState::Exec {
            return;
        }
        if c.aborted {
            // SAM-5 §7.2: an aborted task sends no status; its buffer goes
            // back to the pool here.
            drop(d.buf);
            self.free(key);
            return;
        }
        let mut dbuf = d.buf;
        if let Plan::Write { len, atomic, .. } = c.plan
            && d.result.is_ok()
        {
            let next = c.chunk_at + write_chunk(len, c.chunk_at, atomic);
            if next < len {
                self.cmds[key].chunk_at = next;
                self.fetch_write(key, dbuf);
                return;
            }
        }
        if d.result.is_ok() && matches!(c.cont, Cont::Combine) {
            self.cmds[key].cont = Cont::None;
            self.combine(key, dbuf);
            return;
        }
        if d.result.is_ok() && !matches!(c.cont, Cont::None) {
            match self.continue_cmd(key, dbuf) {
                Ok(()) => return,
                Err(b) => dbuf = b,
            }
        }
        let c = &self.cmds[key];
        let rsp = match (c.plan, d.result) {
            (Plan::Read { xfer, residual, .. }, Ok(())) => {
                let mut rsp = good(residual);
                match (dbuf, d.pipe) {
                    (_, Some(pipe)) if pipe.held() == xfer as usize => {
                        match self.delivery_hold(key) {
                            Some(hold) => {
                                rsp.pipe = Some(PipeData { pipe, hold });
                                rsp.data_len = xfer;
                            }
                            None => rsp = Response::check(Sense::INTERNAL_TARGET_FAILURE),
                        }
                    }
                    (Some(buf), None) if buf.len() >= xfer as usize => {
                        rsp.data = Some(buf);
                        rsp.data_len = xfer;
                    }
                    _ => {
                        tracing::error!(core = self.core, "backend returned a short read buffer");
                        rsp = Response::check(Sense::INTERNAL_TARGET_FAILURE);
                    }
                }
                rsp
            }
            (Plan::Write { residual, .. }, Ok(()))
            | (Plan::ReadModifyWrite { residual, .. }, Ok(()))
            | (Plan::Flush(residual), Ok(()))
            | (Plan::WriteSame { residual, .. }, Ok(()))
            | (Plan::Unmap { residual, .. }, Ok(())) => good(residual),
            (Plan::Compare { residual, .. }, Ok(())) => {
                let data = self.cmds[key].held.take().map(|b| b.to_vec());
                let medium = dbuf.map(|b| b.to_vec());
                match (data, medium) {
                    (Some(d), Some(m)) => match emulate::first_miscompare(&d, &m) {
                        // SBC-4 §5.34: MISCOMPARE, INFORMATION = offset of the
                        // first byte that differs.
                        Some(at) => {
                            Response::check(Sense::MISCOMPARE_DURING_VERIFY.with_info(at as u64))
                        }
                        None => good(residual),
                    },
                    _ => Response::check(Sense::INTERNAL_TARGET_FAILURE),
                }
            }
            (Plan::Read { .. } | Plan::Compare { .. }, Err(e)) => {
                Response::check(block_error_sense(e, false))
            }
            (_, Err(e)) => Response::check(block_error_sense(e, true)),
            (_, Ok(())) => Response::good(),
        };
        self.respond(key, rsp);
    }

    /// Finishes a command's execution: it leaves its task set (unblocking
    /// younger tasks) and its response is queued.
    fn respond(&mut self, key: usize, rsp: Response) {
        let Some(c) = self.cmds.get_mut(key) else {
            return;
        };
        c.state = CmdState::Respond;
        let (sid, tag, id) = (c.session, c.tag, cmd_id(key, c.seq));
        let d_sense = c.entry.as_ref().is_some_and(|e| e.device.d_sense());
        if c.locked {
            c.locked = false;
            let owner = ((self.core as u64) << 32) | c.seq as u64;
            if let Some(e) = c.entry.as_ref() {
                e.device.shared.ranges.unlock(owner);
            }
        }
        if c.active {
            c.active = false;
            let done = Completion {
                dir: c.dir,
                bytes: u64::from(rsp.data_len) + c.out_bytes,
                error: rsp.status == ferrite_scsi::Status::CHECK_CONDITION,
                latency: self.now.map(|n| n.saturating_duration_since(c.start)),
            };
            let dev = c.entry.as_ref().map(|e| e.device.id);
            self.count_finished(sid, dev, &done);
        }
        let mut rsp = rsp;
        if let Some(sense) = rsp.sense.as_mut()
            && d_sense
        {
            descriptor_sense(sense);
        }
        self.push_action(sid, Action::Respond { id, tag, rsp });
        self.leave_task_set(key);
    }

    fn leave_task_set(&mut self, key: usize) {
        let Some(c) = self.cmds.get_mut(key) else {
            return;
        };
        if !c.in_task_set {
            return;
        }
        c.in_task_set = false;
        let ordered = c.attr == TaskAttr::Ordered;
        let (sid, lun) = (c.session, c.lun);
        let Some(st) = self
            .sessions
            .get_mut(&sid)
            .and_then(|s| s.lus.get_mut(&lun))
        else {
            return;
        };
        if let Some(pos) = st.tasks.iter().position(|&k| k == key) {
            st.tasks.remove(pos);
        }
        if ordered {
            st.ordered = st.ordered.saturating_sub(1);
        } else if st.ordered == 0 {
            // Only an ORDERED task in the set blocks others (`may_start`):
            // with none there before this one left, none waits.
            return;
        }
        // Unblock younger tasks that may now run.
        let cmds = &self.cmds;
        let blocked: SmallVec<[usize; 16]> = st
            .tasks
            .iter()
            .copied()
            .filter(|&k| cmds.get(k).is_some_and(|c| c.state == CmdState::Blocked))
            .collect();
        for k in blocked {
            self.advance(k);
        }
    }

    /// Removes a command; drains pending TMFs and lingering sessions.
    fn free(&mut self, key: usize) {
        self.leave_task_set(key);
        if !self.cmds.contains(key) {
            return;
        }
        let c = self.cmds.remove(key);
        if c.charged > 0 || c.state == CmdState::BufWait {
            self.release_budget(&c, key);
        }
        if c.locked
            && let Some(e) = c.entry.as_ref()
        {
            e.device
                .shared
                .ranges
                .unlock(((self.core as u64) << 32) | c.seq as u64);
        }
        if c.state == CmdState::RangeWait
            && let Some(p) = self.range_wait.iter().position(|&k| k == key)
        {
            self.range_wait.remove(p);
        }
        if c.active {
            // Aborted (or dropped with its session) before it could answer.
            let done = Completion {
                dir: c.dir,
                bytes: c.out_bytes,
                error: true,
                latency: None,
            };
            let dev = c.entry.as_ref().map(|e| e.device.id);
            self.count_finished(c.session, dev, &done);
        }
        if c.state == CmdState::QueueFull
            && let Some(p) = self.retry.iter().position(|&k| k == key)
        {
            self.retry.remove(p);
        }
        if !self.tmfs.is_empty() {
            let mut finished: SmallVec<[usize; 2]> = SmallVec::new();
            for (i, t) in self.tmfs.iter_mut().enumerate() {
                t.waiting.retain(|w| *w != (key, c.seq));
                if t.waiting.is_empty() {
                    finished.push(i);
                }
            }
            for i in finished.into_iter().rev() {
                let t = self.tmfs.remove(i);
                self.finish_waiter(t.waiter);
            }
        }
        // The last command of a closed session frees it (`reap`, with one
        // lookup).
        if let Some(s) = self.sessions.get_mut(&c.session) {
            s.live = s.live.saturating_sub(1);
            if s.reapable() {
                self.sessions.remove(&c.session);
            }
        }
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

    /// Aborts one command already marked `aborted` (SAM-5 §7.2). Returns true
    /// if the caller must wait for it (its data transfer or backend I/O is
    /// still under way).
    fn abort(&mut self, key: usize) -> bool {
        let Some(c) = self.cmds.get_mut(key) else {
            return false;
        };
        c.aborted = true;
        match c.state {
            // SBC-4 §4.11.1: the sanitize operation goes on without its task.
            CmdState::New
            | CmdState::Blocked
            | CmdState::QueueFull
            | CmdState::RangeWait
            | CmdState::BufWait
            | CmdState::Background => {
                self.free(key);
                false
            }
            CmdState::NeedData => {
                // Cancel the FetchData if the fabric has not taken it yet.
                let sid = c.session;
                let id = cmd_id(key, c.seq);
                let removed = self.sessions.get_mut(&sid).is_some_and(|s| {
                    let before = s.actions.len();
                    s.actions
                        .retain(|a| !matches!(a, Action::FetchData { id: i, .. } if *i == id));
                    s.actions.len() != before
                });
                if removed {
                    self.free(key);
                    false
                } else {
                    self.cmds[key].aborted = true;
                    true
                }
            }
            CmdState::Exec => {
                c.aborted = true;
                true
            }
            CmdState::Respond => {
                // SAM-5 §7.2: no status for an aborted task, if it is not on
                // its way already.
                let sid = c.session;
                let id = cmd_id(key, c.seq);
                let removed = self.sessions.get_mut(&sid).is_some_and(|s| {
                    let before = s.actions.len();
                    s.actions
                        .retain(|a| !matches!(a, Action::Respond { id: i, .. } if *i == id));
                    s.actions.len() != before
                });
                if removed {
                    self.free(key);
                }
                false
            }
        }
    }

    /// Aborts every command matching `pred`; returns those to wait for,
    /// including ones an earlier abort left draining.
    fn abort_where(&mut self, pred: impl Fn(&Cmd) -> bool) -> SmallVec<[(usize, u32); 8]> {
        let keys: SmallVec<[usize; 16]> = self
            .cmds
            .iter()
            .filter(|(_, c)| (c.aborted || c.state != CmdState::Respond) && pred(c))
            .map(|(k, _)| k)
            .collect();
        // Mark them all first, so that freeing one does not start another
        // that is about to be aborted.
        let mut wait = SmallVec::new();
        let mut fresh: SmallVec<[usize; 16]> = SmallVec::new();
        for &k in &keys {
            let c = &mut self.cmds[k];
            if c.aborted {
                wait.push((k, c.seq));
            } else {
                c.aborted = true;
                fresh.push(k);
            }
        }
        for k in fresh {
            let seq = self.cmds.get(k).map(|c| c.seq);
            if self.abort(k)
                && let Some(seq) = seq
            {
                wait.push((k, seq));
            }
        }
        wait
    }

    fn task_mgmt(&mut self, sid: SessionId, req: TmfRequest) -> TmfId {
        let Some(s) = self.sessions.get_mut(&sid) else {
            return TmfId(u32::MAX);
        };
        let id = TmfId(s.next_tmf);
        s.next_tmf = s.next_tmf.wrapping_add(1);
        let lu_device = s.luns.get(req.lun).map(|e| e.device.id);
        let lun = req.lun;
        let target = s.nexus.target.clone();
        let live = |c: &Cmd| !c.aborted && c.state != CmdState::Respond;
        let mut spans: Option<ResetScope> = None;
        let (rsp, wait) = match req.func {
            // SAM-5 §7.3: ACA is not supported (NormACA = 0).
            TmfFunction::ClearAca => (TmfResponse::Rejected, SmallVec::new()),
            TmfFunction::QueryTask { tag } => {
                // SAM-5 §7.8: FUNCTION SUCCEEDED if the task exists.
                let found = self
                    .cmds
                    .iter()
                    .any(|(_, c)| c.session == sid && c.tag == tag && live(c));
                let r = if found {
                    TmfResponse::Succeeded
                } else {
                    TmfResponse::Complete
                };
                (r, SmallVec::new())
            }
            TmfFunction::QueryTaskSet => {
                let found = self
                    .cmds
                    .iter()
                    .any(|(_, c)| c.session == sid && c.lun == lun && live(c));
                let r = if found {
                    TmfResponse::Succeeded
                } else {
                    TmfResponse::Complete
                };
                (r, SmallVec::new())
            }
            TmfFunction::QueryAsyncEvent => {
                let pending = s.lus.get(&lun).is_some_and(|st| !st.ua.is_empty());
                let r = if pending {
                    TmfResponse::Succeeded
                } else {
                    TmfResponse::Complete
                };
                (r, SmallVec::new())
            }
            TmfFunction::AbortTask { tag } => {
                let key = self
                    .cmds
                    .iter()
                    .find(|(_, c)| c.session == sid && c.tag == tag && live(c))
                    .map(|(k, _)| k);
                match key {
                    Some(k) => {
                        let seq = self.cmds[k].seq;
                        (TmfResponse::Complete, self.abort_where(|c| c.seq == seq))
                    }
                    None => (TmfResponse::TaskNotFound, SmallVec::new()),
                }
            }
            TmfFunction::AbortTaskSet | TmfFunction::ClearTaskSet => {
                // TST = 001b: the task set is this nexus's, so CLEAR TASK SET
                // affects no other initiator.
                if lu_device.is_none() {
                    (TmfResponse::IncorrectLun, SmallVec::new())
                } else {
                    let w = self.abort_where(|c| c.session == sid && c.lun == lun);
                    (TmfResponse::Complete, w)
                }
            }
            TmfFunction::LogicalUnitReset => match lu_device {
                None => (TmfResponse::IncorrectLun, SmallVec::new()),
                Some(dev) => {
                    // SPC-2 §5.5.1: a logical unit reset releases the
                    // reservation.
                    // SAM-5 §6.3.3: BUS DEVICE RESET FUNCTION OCCURRED for
                    // every I_T nexus of the logical unit on every core, the
                    // one that asked included (libiscsi's MultipathIO.Reset
                    // checks each path): each nexus raises it at its next
                    // command, seeing the device's reset generation move.
                    // SBC-4 §5.13: and ends every prevention of medium
                    // removal.
                    if let Some(e) = s.luns.get(lun) {
                        e.device.shared.release(None);
                        e.device.shared.medium.clear();
                        e.device
                            .shared
                            .reset_gen
                            .fetch_add(1, std::sync::atomic::Ordering::AcqRel);
                    }
                    let w =
                        self.abort_where(|c| c.entry.as_ref().is_some_and(|e| e.device.id == dev));
                    self.xcopy_reset(dev);
                    spans = Some(ResetScope::LogicalUnit(dev));
                    (TmfResponse::Complete, w)
                }
            },
            TmfFunction::ItNexusReset => {
                let me = nexus_key(&s.nexus);
                let holder = medium_holder(self.core, sid);
                for e in s.luns.luns.values() {
                    e.device.shared.release(Some(&me));
                    // SBC-4 §5.13: I_T nexus loss ends its prevention.
                    e.device.shared.medium.forget(holder);
                }
                let w = self.abort_where(|c| c.session == sid);
                // SAM-5 §6.3.4: I_T NEXUS LOSS OCCURRED on this nexus.
                self.raise_where(|sess_id, _| sess_id == sid, |_| true, Sense::I_T_NEXUS_LOSS);
                (TmfResponse::Complete, w)
            }
            TmfFunction::TargetReset => {
                // SPC-2 §5.5.1: a reset releases the reservations of the
                // logical units it resets; SBC-4 §5.13: a hard reset ends
                // every prevention of medium removal.
                for e in s.luns.luns.values() {
                    e.device.shared.release(None);
                    e.device.shared.medium.clear();
                }
                let sessions: SmallVec<[SessionId; 8]> = self
                    .sessions
                    .iter()
                    .filter(|(_, s)| s.nexus.target == target)
                    .map(|(k, _)| *k)
                    .collect();
                let w = self.abort_where(|c| sessions.contains(&c.session));
                self.raise_where(
                    |sess_id, s| sess_id != sid && s.nexus.target == target,
                    |_| true,
                    Sense::POWER_ON_RESET,
                );
                spans = Some(ResetScope::Target(target.clone()));
                (TmfResponse::Complete, w)
            }
        };
        let span = spans.filter(|_| self.other_cores > 0).map(|scope| {
            let span = SpanningResetId(self.next_span);
            self.next_span = self.next_span.wrapping_add(1);
            self.spanning.push((span, scope));
            self.held.push(HeldTmf {
                span,
                session: sid,
                done: None,
                others_drained: false,
            });
            span
        });
        self.wait_for(
            Waiter::Tmf {
                session: sid,
                id,
                tag: req.tag,
                rsp,
                span,
            },
            wait,
        );
        id
    }

    /// Tells the shard how many other cores run sessions: with none, a
    /// reset is this shard's alone and its response goes out once it
    /// drained here.
    pub fn set_other_cores(&mut self, n: usize) {
        self.other_cores = n;
    }

    /// Moves the resets this shard's sessions received that the other cores
    /// must apply ([`Shard::remote_reset`] there) into `out`. Each one's TMF
    /// response waits for [`Shard::spanning_reset_drained`].
    pub fn take_spanning_resets(&mut self, out: &mut Vec<(SpanningResetId, ResetScope)>) {
        out.append(&mut self.spanning);
    }

    /// Every other core drained its part of reset `span`: its TMF response
    /// goes out once this shard's part drained too (a core that is gone
    /// counts as drained).
    pub fn spanning_reset_drained(&mut self, span: SpanningResetId) {
        let Some(pos) = self.held.iter().position(|h| h.span == span) else {
            return;
        };
        if self.held[pos].done.is_some() {
            let h = self.held.remove(pos);
            if let Some(a) = h.done {
                self.push_action(h.session, a);
            }
        } else {
            self.held[pos].others_drained = true;
        }
    }

    /// Finishes `waiter` once `wait` has drained (at once if it is empty).
    fn wait_for(&mut self, waiter: Waiter, wait: SmallVec<[(usize, u32); 8]>) {
        if wait.is_empty() {
            self.finish_waiter(waiter);
        } else {
            self.tmfs.push(PendingTmf {
                waiter,
                waiting: wait,
            });
        }
    }

    fn finish_waiter(&mut self, w: Waiter) {
        match w {
            Waiter::Tmf {
                session,
                id,
                tag,
                rsp,
                span,
            } => {
                let a = Action::TmfDone { id, tag, rsp };
                match span.and_then(|s| self.held.iter().position(|h| h.span == s)) {
                    Some(pos) if !self.held[pos].others_drained => self.held[pos].done = Some(a),
                    Some(pos) => {
                        self.held.remove(pos);
                        self.push_action(session, a);
                    }
                    None => self.push_action(session, a),
                }
            }
            Waiter::Remote(id) => self.remote_done.push(id),
        }
    }

    /// Applies on this shard a reset that a session of another core received
    /// (the originating core answers its TMF once every core reported the
    /// reset drained). Aborted commands send no status; see
    /// [`Shard::drained_resets`].
    pub fn remote_reset(&mut self, now: Instant, scope: ResetScope) -> RemoteResetId {
        self.tick(now);
        let id = RemoteResetId(self.next_remote);
        self.next_remote = self.next_remote.wrapping_add(1);
        let wait = match &scope {
            ResetScope::LogicalUnit(dev) => {
                let dev = *dev;
                // The originating core ended the device's preventions
                // (SBC-4 §5.13) before it sent the reset here.
                let w = self.abort_where(|c| c.entry.as_ref().is_some_and(|e| e.device.id == dev));
                self.xcopy_reset(dev);
                // BUS DEVICE RESET on this shard's nexuses now, marking the
                // device's reset generation seen so that the originating
                // core's bump does not raise it twice.
                for s in self.sessions.values_mut() {
                    if s.closing {
                        continue;
                    }
                    let luns = s.luns.clone();
                    for (l, e) in &luns.luns {
                        if e.device.id == dev {
                            let st = s.lus.entry(*l).or_default();
                            st.raise(Sense::BUS_DEVICE_RESET);
                            st.reset_gen = Some(e.device.shared.reset_gen.load(Ordering::Acquire));
                        }
                    }
                }
                w
            }
            ResetScope::Target(target) => {
                let sessions: SmallVec<[SessionId; 8]> = self
                    .sessions
                    .iter()
                    .filter(|(_, s)| &s.nexus.target == target)
                    .map(|(k, _)| *k)
                    .collect();
                let w = self.abort_where(|c| sessions.contains(&c.session));
                // SBC-4 §5.13: the hard reset ends every prevention of
                // medium removal on the logical units of the target, also
                // those mapped only in another initiator group's map.
                for sid in &sessions {
                    if let Some(s) = self.sessions.get(sid) {
                        for e in s.luns.luns.values() {
                            e.device.shared.medium.clear();
                        }
                    }
                }
                self.raise_where(
                    |_, s| &s.nexus.target == target,
                    |_| true,
                    Sense::POWER_ON_RESET,
                );
                w
            }
        };
        self.wait_for(Waiter::Remote(id), wait);
        id
    }

    /// Moves the remote resets whose aborted commands have all finished into
    /// `out`.
    pub fn drained_resets(&mut self, out: &mut Vec<RemoteResetId>) {
        out.append(&mut self.remote_done);
    }

    /// Raises `sense` on every LU of every session `sess` accepts whose map
    /// entry `lu` accepts.
    fn raise_where(
        &mut self,
        sess: impl Fn(SessionId, &SessionState) -> bool,
        lu: impl Fn(&LunEntry) -> bool,
        sense: Sense,
    ) {
        for (sid, s) in self.sessions.iter_mut() {
            if s.closing || !sess(*sid, s) {
                continue;
            }
            let luns = s.luns.clone();
            for (l, e) in &luns.luns {
                if lu(e) {
                    s.lus.entry(*l).or_default().raise(sense);
                }
            }
        }
    }

    /// The slab key of a live command, if `id` is still its id.
    fn key_of(&self, id: CmdId) -> Option<usize> {
        let key = (id.0 & KEY_MASK) as usize;
        let c = self.cmds.get(key)?;
        (cmd_id(key, c.seq) == id).then_some(key)
    }

    fn data_out_done(&mut self, sid: SessionId, id: CmdId, data: Result<SgList, Abort>) {
        let Some(key) = self.key_of(id) else {
            return;
        };
        let c = &self.cmds[key];
        if c.session != sid || c.state != CmdState::NeedData {
            return;
        }
        if c.aborted {
            // Dropping the buffer returns it to the pool.
            drop(data);
            self.free(key);
            return;
        }
        let plan = c.plan;
        let bs = c
            .entry
            .as_ref()
            .map_or(0, |e| e.device.geometry().block_size);
        match data {
            Ok(mut buf) => {
                let want = match plan {
                    Plan::Write { len, atomic, .. } => {
                        write_chunk(len, self.cmds[key].chunk_at, atomic)
                    }
                    Plan::WriteSame { .. } => bs,
                    Plan::Unmap { param_len, .. } => param_len,
                    Plan::Compare { data_len, .. } => data_len,
                    Plan::ReadModifyWrite { data_len, .. } => data_len,
                    Plan::PrOut { param_len, .. } => param_len,
                    Plan::ModeSelect { param_len, .. } => param_len,
                    Plan::ExtendedCopy { param_len, .. } => param_len,
                    Plan::Sanitize { param_len, .. } => param_len,
                    _ => return,
                };
                if buf.len() < want as usize {
                    // The fabric must deliver what FetchData asked for.
                    self.respond(key, Response::check(Sense::DATA_PHASE_ERROR));
                    return;
                }
                buf.truncate(want as usize);
                self.cmds[key].out_bytes += u64::from(want);
                match plan {
                    Plan::Write { offset, fua, .. } => {
                        let offset = offset + u64::from(self.cmds[key].chunk_at);
                        self.submit_op(key, BlockOp::Write { offset, buf, fua })
                    }
                    Plan::WriteSame { .. } => self.write_same(key, Some(buf)),
                    Plan::PrOut { .. } => {
                        let params = buf.to_vec();
                        self.pr_out(key, &params);
                    }
                    Plan::ModeSelect { .. } => {
                        let params = buf.to_vec();
                        self.mode_select(key, &params);
                    }
                    Plan::ReadModifyWrite { offset, len, .. } => {
                        // Hold the range from the read to the write (SBC-4
                        // §5.3): the read waits while another command
                        // holds an overlapping one.
                        self.cmds[key].held = Some(buf);
                        let medium = self.pool.sg(len as usize);
                        self.cmds[key].cont = Cont::Combine;
                        self.submit_op(
                            key,
                            BlockOp::Read {
                                offset,
                                buf: medium,
                            },
                        );
                    }
                    Plan::Compare { offset, len, .. } => {
                        self.cmds[key].held = Some(buf);
                        let medium = self.pool.sg(len as usize);
                        self.submit_op(
                            key,
                            BlockOp::Read {
                                offset,
                                buf: medium,
                            },
                        );
                    }
                    Plan::Sanitize { .. } => {
                        let params = buf.to_vec();
                        self.sanitize(key, &params);
                    }
                    Plan::ExtendedCopy { .. } => {
                        let params = buf.to_vec();
                        self.xcopy_start(key, &params);
                    }
                    _ => self.unmap(key, buf),
                }
            }
            Err(Abort::ConnectionLost) | Err(Abort::Aborted) => {
                // Nobody to answer: the command ends here.
                self.free(key);
            }
            Err(Abort::TransportError) => {
                // RFC 7143 (digest errors): a Data-Out the transport had to drop
                // ends the command with ABORTED COMMAND.
                self.respond(key, Response::check(Sense::PROTOCOL_SERVICE_CRC_ERROR));
            }
        }
    }

    fn response_sent(&mut self, sid: SessionId, id: CmdId) {
        let Some(key) = self.key_of(id) else {
            return;
        };
        if self
            .cmds
            .get(key)
            .is_some_and(|c| c.session == sid && c.state == CmdState::Respond)
        {
            self.free(key);
        }
    }
}

// ----- EXTENDED COPY and RECEIVE COPY RESULTS (SPC-4 §6.4, §6.23) -----
//
// The copy of one EXTENDED COPY runs on the core of the nexus that sent it,
// against this core's queues of the source and destination devices
// (whatever LUs they are): [`crate::xcopy::CopyRun`] says what to submit,
// this shard submits it and feeds completions back. The command stays in
// `Exec` until the copy ends, so task management waits for its chunks.
impl Shard {
    /// Starts an EXTENDED COPY once its parameter list arrived.
    fn xcopy_start(&mut self, key: usize, params: &[u8]) {
        let c = &self.cmds[key];
        let residual = match c.plan {
            Plan::ExtendedCopy { residual, .. } => residual,
            _ => Residual::None,
        };
        let sid = c.session;
        let Some(s) = self.sessions.get(&sid) else {
            return;
        };
        let spc2 = nexus_key(&s.nexus);
        let pr = pr_nexus(&s.nexus);
        let req = crate::xcopy::Requester {
            luns: &s.luns,
            rel_port: s.nexus.rel_port_id,
            target: &s.nexus.target,
            spc2: &spc2,
            pr: &pr,
        };
        let run = match crate::xcopy::prepare(params, &req) {
            Ok(run) => run,
            Err(r) => {
                let rsp = match r.why {
                    crate::xcopy::Refusal::Check(sense) => check(sense, residual),
                    crate::xcopy::Refusal::Conflict => {
                        Response::status(ferrite_scsi::Status::RESERVATION_CONFLICT)
                    }
                };
                if rsp.sense.is_some() {
                    self.copies.record(sid, r.list, 0, 0, rsp.sense.clone());
                }
                self.respond(key, rsp);
                return;
            }
        };
        // SPC-4 §6.4.1: a list identifier in use by a copy of this nexus
        // still in progress: OPERATION IN PROGRESS. Only where one of the
        // two holds its results (LIST ID USAGE 00b) can they be confused:
        // copies that hold nothing (10b) may share an identifier, as QEMU's
        // copy offload sends several at once, all with list identifier 1.
        use ferrite_scsi::xcopy::ListIdUsage;
        let listed = run.usage != ListIdUsage::None;
        if listed
            && self.cmds.iter().any(|(k, o)| {
                k != key
                    && o.session == sid
                    && matches!(&o.cont, Cont::Copy(r)
                        if r.usage != ListIdUsage::None
                            && r.list_id == run.list_id
                            && (r.usage == ListIdUsage::Hold || run.usage == ListIdUsage::Hold))
            })
        {
            self.respond(key, check(Sense::OPERATION_IN_PROGRESS, residual));
            return;
        }
        self.cmds[key].cont = Cont::Copy(Box::new(run));
        self.cmds[key].state = CmdState::Exec;
        self.xcopy_pump(key);
    }

    /// Submits what the copy of `key` may submit now; answers the command
    /// (or frees it, aborted) once the copy is over.
    fn xcopy_pump(&mut self, key: usize) {
        let owner = self.owner(key);
        loop {
            let (issue, seq) = {
                let Some(c) = self.cmds.get_mut(key) else {
                    return;
                };
                let (aborted, seq) = (c.aborted, c.seq);
                let Cont::Copy(run) = &mut c.cont else {
                    return;
                };
                if aborted {
                    // SAM-5 §7.2: an aborted copy stops; what is in flight
                    // drains first.
                    run.fail(Sense::COPY_ABORTED);
                }
                match run.next(&self.pool) {
                    Some(i) => (i, seq),
                    None => break,
                }
            };
            // SBC-4 §5.3: a write waits while COMPARE AND WRITE holds an
            // overlapping range.
            let held =
                match &issue.op {
                    BlockOp::Write { offset, buf, .. } => issue.dev.shared.ranges.conflicts(
                        *offset,
                        *offset + buf.len() as u64,
                        owner,
                    ),
                    _ => false,
                };
            let crate::xcopy::Issue { slot, dev, op } = issue;
            let refused = if held {
                Some(op)
            } else {
                let tag = crate::xcopy::tag(key, seq, slot);
                match self.queue(&dev) {
                    None => {
                        drop(op);
                        if let Some(Cont::Copy(run)) = self.cmds.get_mut(key).map(|c| &mut c.cont) {
                            run.abandon(slot, Sense::COPY_TARGET_DEVICE_NOT_REACHABLE);
                        }
                        continue;
                    }
                    Some(q) => match q.submit(tag, with_policy(&dev, op)) {
                        Ok(()) => None,
                        Err(Busy(op)) => Some(op),
                    },
                }
            };
            if let Some(op) = refused {
                // STYLE rule 5: a full queue (or a held range) is a wait.
                if let Some(Cont::Copy(run)) = self.cmds.get_mut(key).map(|c| &mut c.cont) {
                    run.stall(crate::xcopy::Issue { slot, dev, op });
                }
                if !self.copies.wait.contains(&(key, seq)) {
                    self.copies.wait.push((key, seq));
                }
                break;
            }
        }
        let Some(c) = self.cmds.get(key) else {
            return;
        };
        let Cont::Copy(run) = &c.cont else {
            return;
        };
        if !run.finished() {
            return;
        }
        if c.aborted {
            self.free(key);
            return;
        }
        let residual = match c.plan {
            Plan::ExtendedCopy { residual, .. } => residual,
            _ => Residual::None,
        };
        let (sid, list) = (c.session, Some((run.list_id, run.usage)));
        let (segments, bytes) = (run.segments_processed(), run.bytes_done());
        let rsp = match run.outcome() {
            Ok(()) => good(residual),
            Err(sense) => check(sense, residual),
        };
        self.copies
            .record(sid, list, segments, bytes, rsp.sense.clone());
        self.cmds[key].cont = Cont::None;
        self.respond(key, rsp);
    }

    /// A LOGICAL UNIT RESET of `dev` (SAM-5 §6.3.3): copies of other LUs
    /// that read or write it lose their operations there and end with
    /// COPY ABORTED once what is in flight returns.
    fn xcopy_reset(&mut self, dev: DeviceId) {
        let keys: SmallVec<[usize; 4]> = self
            .cmds
            .iter_mut()
            .filter_map(|(k, c)| match &mut c.cont {
                Cont::Copy(run) if run.touches(dev) => {
                    run.fail(Sense::COPY_ABORTED);
                    Some(k)
                }
                _ => None,
            })
            .collect();
        for k in keys {
            self.xcopy_pump(k);
        }
    }

    /// A chunk operation of a copy completed.
    fn xcopy_done(&mut self, key: usize, seq: u32, slot: usize, d: BlockDone) {
        let Some(c) = self.cmds.get_mut(key) else {
            return;
        };
        if c.seq != seq {
            return;
        }
        let Cont::Copy(run) = &mut c.cont else {
            return;
        };
        run.done(slot, d.result, d.buf);
        self.xcopy_pump(key);
    }

    /// Pumps the copies that waited for a queue slot or a held range.
    fn xcopy_retry(&mut self) -> bool {
        let waiting = std::mem::take(&mut self.copies.wait);
        let before = waiting.len();
        for (key, seq) in waiting {
            if self.cmds.get(key).is_some_and(|c| c.seq == seq) {
                self.xcopy_pump(key);
            }
        }
        self.copies.wait.len() < before
    }

    /// RECEIVE COPY RESULTS for this command's nexus.
    fn copy_results(&mut self, key: usize) {
        let c = &self.cmds[key];
        let (sid, expected) = (c.session, c.expected_len);
        let list_id = c.cdb.get(2).copied().unwrap_or(0);
        let running = self.cmds.iter().find_map(|(_, o)| match &o.cont {
            Cont::Copy(r)
                if o.session == sid
                    && !o.aborted
                    && r.usage != ferrite_scsi::xcopy::ListIdUsage::None
                    && r.list_id == list_id =>
            {
                Some(crate::xcopy::Running {
                    segments: r.segments_processed(),
                    bytes: r.bytes_done(),
                })
            }
            _ => None,
        });
        let cdb = c.cdb.clone();
        let mut out = std::mem::take(&mut self.scratch);
        let r = self.copies.results(sid, &cdb, running, &mut out);
        let rsp = self.data_in_response(r, &out, expected);
        self.scratch = out;
        self.respond(key, rsp);
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
mod tests {
    use super::*;
    use crate::backend::{Backend, BackendError, Caps, Geometry};
    use crate::cmd::DataDir;
    use crate::device::{DeviceFlags, Identity};

    /// A backend nothing is ever read from: these tests only look at unit
    /// attentions and AENs.
    struct NoIo;

    impl Backend for NoIo {
        fn geometry(&self) -> Geometry {
            Geometry {
                block_size: 512,
                num_blocks: 2048,
                phys_exp: 0,
            }
        }
        fn caps(&self) -> Caps {
            Caps::default()
        }
        fn open_queue(&self, _depth: u32) -> Result<Box<dyn BackendQueue>, BackendError> {
            Err(BackendError::Invalid("no I/O in this test".into()))
        }
    }

    fn nexus(n: u32) -> Nexus {
        Nexus {
            initiator: format!("iqn.2026-11.test:i{n}"),
            initiator_port: format!("iqn.2026-11.test:i{n},i,0x{n:012x}"),
            target: "iqn.2026-11.test:t".into(),
            rel_port_id: 1,
        }
    }

    fn tur(shard: &mut Shard, now: Instant, sid: SessionId, lun: u16) -> Response {
        let req = CmdRequest {
            lun: Lun(lun),
            lun_raw: Lun(lun).encode(),
            tag: TaskTag(7),
            cdb: Cdb::from_slice(&[0; 6]),
            attr: TaskAttr::Simple,
            dir: DataDir::None,
            expected_len: 0,
            expected_read_len: 0,
        };
        let id = shard.session(sid).unwrap().submit(now, req);
        let mut s = shard.session(sid).unwrap();
        while let Some(a) = s.poll_action() {
            if let Action::Respond { id: i, rsp, .. } = a {
                assert_eq!(i, id);
                s.response_sent(id);
                return rsp;
            }
        }
        panic!("TEST UNIT READY not answered at once");
    }

    fn sense(r: &Response) -> Option<(u8, u8, u8)> {
        r.sense.as_ref().map(|s| (s[2] & 0x0f, s[12], s[13]))
    }

    /// Runs a command that moves no Data-Out and answers without backend
    /// I/O; returns its response and Data-In.
    fn run(shard: &mut Shard, now: Instant, sid: SessionId, cdb: &[u8]) -> (Response, Vec<u8>) {
        let read = cdb[0] == 0x12;
        let req = CmdRequest {
            lun: Lun(0),
            lun_raw: Lun(0).encode(),
            tag: TaskTag(9),
            cdb: Cdb::from_slice(cdb),
            attr: TaskAttr::Simple,
            dir: if read { DataDir::Read } else { DataDir::None },
            expected_len: if read { 96 } else { 0 },
            expected_read_len: 0,
        };
        let id = shard.session(sid).unwrap().submit(now, req);
        let mut s = shard.session(sid).unwrap();
        while let Some(a) = s.poll_action() {
            if let Action::Respond { id: i, rsp, .. } = a {
                assert_eq!(i, id);
                s.response_sent(id);
                let data = rsp
                    .data
                    .as_ref()
                    .map(|d| d.to_vec()[..rsp.data_len as usize].to_vec())
                    .unwrap_or_default();
                return (rsp, data);
            }
        }
        panic!("{cdb:02x?} not answered at once");
    }

    fn tmf(shard: &mut Shard, now: Instant, sid: SessionId, func: TmfFunction) -> TmfResponse {
        let req = TmfRequest {
            func,
            lun: Lun(0),
            tag: TaskTag(77),
        };
        shard.session(sid).unwrap().task_mgmt(now, req);
        let mut s = shard.session(sid).unwrap();
        while let Some(a) = s.poll_action() {
            if let Action::TmfDone { rsp, .. } = a {
                return rsp;
            }
        }
        panic!("TMF not answered");
    }

    const PREVENT: [u8; 6] = [0x1e, 0, 0, 0, 1, 0];
    const ALLOW: [u8; 6] = [0x1e, 0, 0, 0, 0, 0];
    const EJECT: [u8; 6] = [0x1b, 0, 0, 0, 0x02, 0];
    const LOAD: [u8; 6] = [0x1b, 1, 0, 0, 0x03, 0];
    const REMOVAL_PREVENTED: Option<(u8, u8, u8)> = Some((5, 0x53, 0x02));
    const NO_MEDIUM: Option<(u8, u8, u8)> = Some((2, 0x3a, 0x00));

    fn removable_map(flags: DeviceFlags) -> (Arc<Device>, Arc<LunMap>) {
        let dev = Arc::new(Device::new(
            DeviceId(910),
            "cdrom",
            Arc::new(NoIo),
            Identity {
                vendor: "FERRITE".into(),
                product: "t".into(),
                revision: "1".into(),
                serial: "r".into(),
                naa: 0x5001_4050_0000_0910,
                eui64: 0,
            },
            flags,
        ));
        let mut map = LunMap::default();
        map.luns.insert(
            Lun(0),
            LunEntry {
                device: dev.clone(),
                read_only: false,
            },
        );
        (dev, Arc::new(map))
    }

    /// A watch a test flips by hand.
    #[derive(Debug, Default)]
    struct Dropped(std::sync::atomic::AtomicBool);

    impl NexusWatch for Dropped {
        fn gone(&self) -> bool {
            self.0.load(Ordering::Acquire)
        }
    }

    #[test]
    fn a_lost_transport_ends_prevention_and_reservation_before_its_core_closes_the_session() {
        let (_dev, map) = removable_map(DeviceFlags {
            removable: true,
            ..DeviceFlags::default()
        });
        let now = Instant::now();
        let mut busy = Shard::new(0, BufPool::new(4096, 8));
        let mut next = Shard::new(1, BufPool::new(4096, 8));
        let old = busy.open_session(now, nexus(1), map.clone(), false);
        let w = Arc::new(Dropped::default());
        busy.watch_session(old, w.clone());
        let new = next.open_session(now, nexus(2), map.clone(), false);
        assert_eq!(sense(&tur(&mut busy, now, old, 0)), Some((6, 0x29, 0)));
        assert_eq!(sense(&tur(&mut next, now, new, 0)), Some((6, 0x29, 0)));
        assert_eq!(sense(&run(&mut busy, now, old, &PREVENT).0), None);
        let reserve6 = [0x16, 0, 0, 0, 0, 0];
        assert_eq!(sense(&run(&mut busy, now, old, &reserve6).0), None);
        let (r, _) = run(&mut next, now, new, &EJECT);
        assert_eq!(r.status, ferrite_scsi::Status::RESERVATION_CONFLICT);
        // The initiator drops the old connection; its core has not read
        // that yet (it never runs again here), but the transport says so.
        w.0.store(true, Ordering::Release);
        assert_eq!(sense(&run(&mut next, now, new, &reserve6).0), None);
        assert_eq!(sense(&run(&mut next, now, new, &EJECT).0), None);
        // The old core closes the session later: nothing of the new
        // nexus's is released by it.
        busy.close_session(now, old);
        let third = busy.open_session(now, nexus(3), map.clone(), false);
        assert_eq!(sense(&tur(&mut busy, now, third, 0)), Some((6, 0x29, 0)));
        let (r, _) = run(&mut busy, now, third, &EJECT);
        assert_eq!(r.status, ferrite_scsi::Status::RESERVATION_CONFLICT);
    }

    /// Polls `sid`'s actions for a TMF response.
    fn tmf_done(shard: &mut Shard, sid: SessionId) -> Option<TmfResponse> {
        let mut s = shard.session(sid).unwrap();
        let mut rsp = None;
        while let Some(a) = s.poll_action() {
            if let Action::TmfDone { rsp: r, .. } = a {
                rsp = Some(r);
            }
        }
        rsp
    }

    #[test]
    fn the_core_carries_lu_and_target_resets_to_every_other_core_and_holds_the_response() {
        let (_dev, map) = removable_map(DeviceFlags::default());
        let now = Instant::now();
        let mut core0 = Shard::new(0, BufPool::new(4096, 8));
        let mut core1 = Shard::new(1, BufPool::new(4096, 8));
        core0.set_other_cores(1);
        core1.set_other_cores(1);
        let a = core0.open_session(now, nexus(1), map.clone(), false);
        let c = core1.open_session(now, nexus(3), map.clone(), false);
        assert_eq!(sense(&tur(&mut core0, now, a, 0)), Some((6, 0x29, 0)));
        assert_eq!(sense(&tur(&mut core1, now, c, 0)), Some((6, 0x29, 0)));
        for (func, ua) in [
            (TmfFunction::LogicalUnitReset, (6, 0x29, 0x03)),
            (TmfFunction::TargetReset, (6, 0x29, 0x00)),
        ] {
            let req = TmfRequest {
                func,
                lun: Lun(0),
                tag: TaskTag(77),
            };
            core0.session(a).unwrap().task_mgmt(now, req);
            // Drained here, but the other core has not applied it yet.
            assert_eq!(tmf_done(&mut core0, a), None);
            let mut out = Vec::new();
            core0.take_spanning_resets(&mut out);
            assert_eq!(out.len(), 1, "{func:?} crosses cores");
            let (span, scope) = out.pop().unwrap();
            let remote = core1.remote_reset(now, scope);
            let mut drained = Vec::new();
            core1.drained_resets(&mut drained);
            assert_eq!(drained, vec![remote]);
            core0.spanning_reset_drained(span);
            assert_eq!(tmf_done(&mut core0, a), Some(TmfResponse::Complete));
            // The nexus on the other core saw the reset.
            assert_eq!(sense(&tur(&mut core1, now, c, 0)), Some(ua));
            assert_eq!(sense(&tur(&mut core1, now, c, 0)), None);
        }
        // Task management of one nexus stays on its core.
        assert_eq!(
            tmf(&mut core0, now, a, TmfFunction::AbortTaskSet),
            TmfResponse::Complete
        );
        let mut out = Vec::new();
        core0.take_spanning_resets(&mut out);
        assert!(out.is_empty());
        // A session that ends while its reset is held forgets the response.
        let req = TmfRequest {
            func: TmfFunction::LogicalUnitReset,
            lun: Lun(0),
            tag: TaskTag(78),
        };
        core0.session(a).unwrap().task_mgmt(now, req);
        core0.take_spanning_resets(&mut out);
        core0.close_session(now, a);
        core0.spanning_reset_drained(out[0].0);
        assert!(core0.held.is_empty());
        // A shard alone answers at once.
        let mut alone = Shard::new(0, BufPool::new(4096, 8));
        let b = alone.open_session(now, nexus(2), map, false);
        assert_eq!(
            tmf(&mut alone, now, b, TmfFunction::LogicalUnitReset),
            TmfResponse::Complete
        );
        out.clear();
        alone.take_spanning_resets(&mut out);
        assert!(out.is_empty());
    }

    #[test]
    fn prevention_is_per_nexus_on_every_core_and_ends_with_nexus_loss_and_resets() {
        let (dev, map) = removable_map(DeviceFlags {
            removable: true,
            ..DeviceFlags::default()
        });
        let now = Instant::now();
        let mut core0 = Shard::new(0, BufPool::new(4096, 8));
        let mut core1 = Shard::new(1, BufPool::new(4096, 8));
        let a = core0.open_session(now, nexus(1), map.clone(), false);
        let b = core0.open_session(now, nexus(2), map.clone(), false);
        let c = core1.open_session(now, nexus(3), map.clone(), false);
        for sid in [a, b] {
            assert_eq!(sense(&tur(&mut core0, now, sid, 0)), Some((6, 0x29, 0)));
        }
        assert_eq!(sense(&tur(&mut core1, now, c, 0)), Some((6, 0x29, 0)));
        // SPC-4 §6.6.2: RMB = 1.
        let (r, inq) = run(&mut core0, now, a, &[0x12, 0, 0, 0, 96, 0]);
        assert_eq!(sense(&r), None);
        assert_eq!(inq[1] & 0x80, 0x80);

        // Two nexuses prevent; the other core sees it; ALLOW by one leaves
        // the other's.
        assert_eq!(sense(&run(&mut core0, now, a, &PREVENT).0), None);
        assert_eq!(sense(&run(&mut core1, now, c, &PREVENT).0), None);
        assert_eq!(sense(&run(&mut core0, now, b, &EJECT).0), REMOVAL_PREVENTED);
        assert_eq!(sense(&run(&mut core0, now, a, &ALLOW).0), None);
        assert_eq!(sense(&run(&mut core0, now, a, &EJECT).0), REMOVAL_PREVENTED);
        assert!(dev.medium_present() && dev.removal_prevented());
        // Nexus loss on the other core ends the last prevention.
        core1.close_session(now, c);
        assert!(!dev.removal_prevented());
        assert_eq!(sense(&run(&mut core0, now, b, &EJECT).0), None);
        assert!(!dev.medium_present());
        // Ejected: TEST UNIT READY and media access get NOT READY, MEDIUM
        // NOT PRESENT; INQUIRY and PREVENT still work.
        assert_eq!(sense(&tur(&mut core0, now, a, 0)), NO_MEDIUM);
        let read_cap = [0x25, 0, 0, 0, 0, 0, 0, 0, 0, 0];
        assert_eq!(sense(&run(&mut core0, now, a, &read_cap).0), NO_MEDIUM);
        assert_eq!(
            sense(&run(&mut core0, now, a, &[0x12, 0, 0, 0, 96, 0]).0),
            None
        );
        assert_eq!(sense(&run(&mut core0, now, a, &PREVENT).0), None);
        // Prevention keeps the medium out as well as in.
        assert_eq!(sense(&run(&mut core0, now, b, &LOAD).0), REMOVAL_PREVENTED);
        // LOGICAL UNIT RESET ends every prevention.
        assert_eq!(
            tmf(&mut core0, now, b, TmfFunction::LogicalUnitReset),
            TmfResponse::Complete
        );
        assert!(!dev.removal_prevented());
        for sid in [a, b] {
            assert_eq!(sense(&tur(&mut core0, now, sid, 0)), Some((6, 0x29, 0x03)));
        }
        // Loading: GOOD for the loader, a unit attention for the others.
        assert_eq!(sense(&run(&mut core0, now, b, &LOAD).0), None);
        assert_eq!(sense(&tur(&mut core0, now, b, 0)), None);
        assert_eq!(sense(&tur(&mut core0, now, a, 0)), Some((6, 0x28, 0)));
        assert_eq!(sense(&tur(&mut core0, now, a, 0)), None);
        // I_T NEXUS RESET and TARGET RESET end preventions too.
        assert_eq!(sense(&run(&mut core0, now, a, &PREVENT).0), None);
        assert_eq!(
            tmf(&mut core0, now, a, TmfFunction::ItNexusReset),
            TmfResponse::Complete
        );
        assert!(!dev.removal_prevented());
        assert_eq!(sense(&run(&mut core0, now, b, &PREVENT).0), None);
        assert_eq!(
            tmf(&mut core0, now, a, TmfFunction::TargetReset),
            TmfResponse::Complete
        );
        assert!(!dev.removal_prevented());
        assert_eq!(sense(&tur(&mut core0, now, b, 0)), Some((6, 0x29, 0)));
        // PREVENT 10b and 11b are obsolete: INVALID FIELD IN CDB.
        let (r, _) = run(&mut core0, now, b, &[0x1e, 0, 0, 0, 2, 0]);
        assert_eq!(sense(&r), Some((5, 0x24, 0)));
        // A POWER CONDITION other than 0h ignores LOEJ (StartStopUnit.PwrCnd).
        let (r, _) = run(&mut core0, now, b, &[0x1b, 1, 0, 0, 0x12, 0]);
        assert_eq!(sense(&r), None);
        assert!(dev.medium_present());
    }

    #[test]
    fn a_medium_that_is_not_removable_ignores_loej_and_prevent() {
        let (dev, map) = removable_map(DeviceFlags::default());
        let now = Instant::now();
        let mut core0 = Shard::new(0, BufPool::new(4096, 8));
        let a = core0.open_session(now, nexus(1), map, false);
        assert_eq!(sense(&tur(&mut core0, now, a, 0)), Some((6, 0x29, 0)));
        let (_, inq) = run(&mut core0, now, a, &[0x12, 0, 0, 0, 96, 0]);
        assert_eq!(inq[1] & 0x80, 0);
        assert_eq!(sense(&run(&mut core0, now, a, &PREVENT).0), None);
        assert!(!dev.removal_prevented());
        assert_eq!(sense(&run(&mut core0, now, a, &EJECT).0), None);
        assert!(dev.medium_present());
        assert_eq!(sense(&tur(&mut core0, now, a, 0)), None);
    }

    #[test]
    fn resize_queues_an_aen_where_the_fabric_reports_events_and_a_ua_everywhere() {
        let dev = Arc::new(Device::new(
            DeviceId(900),
            "resized",
            Arc::new(NoIo),
            Identity {
                vendor: "FERRITE".into(),
                product: "t".into(),
                revision: "1".into(),
                serial: "s".into(),
                naa: 0x5001_4050_0000_0900,
                eui64: 0,
            },
            DeviceFlags::default(),
        ));
        let other = Arc::new(Device::new(
            DeviceId(901),
            "other",
            Arc::new(NoIo),
            Identity {
                vendor: "FERRITE".into(),
                product: "t".into(),
                revision: "1".into(),
                serial: "s2".into(),
                naa: 0x5001_4050_0000_0901,
                eui64: 0,
            },
            DeviceFlags::default(),
        ));
        let mut map = LunMap::default();
        for (l, d) in [(0, &dev), (1, &other)] {
            map.luns.insert(
                Lun(l),
                LunEntry {
                    device: d.clone(),
                    read_only: false,
                },
            );
        }
        let map = Arc::new(map);
        let now = Instant::now();
        let mut shard = Shard::new(0, BufPool::new(4096, 8));
        let with_aen = shard.open_session(now, nexus(1), map.clone(), true);
        let without = shard.open_session(now, nexus(2), map.clone(), false);
        for sid in [with_aen, without] {
            for lun in [0, 1] {
                assert_eq!(sense(&tur(&mut shard, now, sid, lun)), Some((6, 0x29, 0)));
                assert_eq!(sense(&tur(&mut shard, now, sid, lun)), None);
            }
        }

        dev.set_num_blocks(4096);
        shard.poll(now);
        let mut ready = Vec::new();
        shard.ready_sessions(&mut ready);
        assert_eq!(ready, vec![with_aen], "only the AEN-capable session woke");
        let mut s = shard.session(with_aen).unwrap();
        let a: Vec<Action> = std::iter::from_fn(|| s.poll_action()).collect();
        assert!(
            matches!(&a[..], [Action::Aen { lun: Lun(0), sense }]
                if *sense == Sense::CAPACITY_DATA_HAS_CHANGED),
            "{a:?}"
        );
        assert!(shard.session(without).unwrap().poll_action().is_none());
        // The unit attention is pending on the resized LUN for both, once.
        for sid in [with_aen, without] {
            assert_eq!(sense(&tur(&mut shard, now, sid, 1)), None);
            assert_eq!(sense(&tur(&mut shard, now, sid, 0)), Some((6, 0x2a, 0x09)));
            assert_eq!(sense(&tur(&mut shard, now, sid, 0)), None);
        }
        // Nothing more on the next poll: one resize, one event.
        shard.poll(now);
        assert!(shard.session(with_aen).unwrap().poll_action().is_none());
    }

    #[test]
    fn the_core_alone_sets_a_writes_fua_and_the_caching_page_follows_the_backend() {
        let dev = |flags| crate::testing::device(920, Caps::default(), flags);
        let fua_of = |d: &Device, asked: bool| match with_policy(
            d,
            BlockOp::Write {
                offset: 0,
                buf: SgList::zeroed(512),
                fua: asked,
            },
        ) {
            BlockOp::Write { fua, .. } => fua,
            other => panic!("{other:?}"),
        };
        let plain = dev(DeviceFlags::default());
        assert!(!fua_of(&plain, false) && fua_of(&plain, true));
        // Write-through: every write, whichever path made it, is durable
        // when it completes, also after a change at run time (the backend
        // is the same; only the device's flags differ).
        let wt = dev(DeviceFlags {
            write_through: true,
            ..DeviceFlags::default()
        });
        assert!(fua_of(&wt, false) && fua_of(&wt, true));
        // nv_cache: FUA is dropped; write-through still wins.
        let nv = dev(DeviceFlags {
            nv_cache: true,
            ..DeviceFlags::default()
        });
        assert!(!fua_of(&nv, true));
        let both = dev(DeviceFlags {
            nv_cache: true,
            write_through: true,
            ..DeviceFlags::default()
        });
        assert!(fua_of(&both, false));
        // Other operations pass unchanged.
        assert!(matches!(with_policy(&wt, BlockOp::Flush), BlockOp::Flush));
        // WCE: the backend's volatile cache (NoIo has none), never with
        // write-through.
        assert!(!plain.write_cache_enabled());
        let cached = |flags| {
            let caps = Caps {
                write_cache: true,
                ..Caps::default()
            };
            crate::testing::device(921, caps, flags)
        };
        assert!(cached(DeviceFlags::default()).write_cache_enabled());
        assert!(
            !cached(DeviceFlags {
                write_through: true,
                ..DeviceFlags::default()
            })
            .write_cache_enabled()
        );
    }
}
