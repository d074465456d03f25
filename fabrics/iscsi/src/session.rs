//! The session layer's shared state (RFC 7143 §4.2.2.1): the CmdSN
//! window, ExpCmdSN/MaxCmdSN, which connection owns which ITT and TMF, and
//! what one connection of a session (MC/S) tells the others.
//!
//! Every connection of a session runs on the core that owns the session, so
//! the state is an `Rc`, never crossing threads. Nothing here touches a
//! socket or a clock.

use rustc_hash::FxHashMap;
use std::cell::RefCell;
use std::rc::Rc;

use crate::pdu::CmdSn;

/// Session-wide command sequencing (RFC 7143 §4.2.2.1) and task ownership,
/// shared by the connections of one session: clones are handles on the same
/// state. Commands reach the core in CmdSN order across all connections; a
/// connection holds the ones ahead of a gap (bounded by the window) and runs
/// them when [`Conn::release_held`](crate::conn::Conn::release_held) sees the gap filled.
#[derive(Clone, Debug)]
pub struct SessionSeq(Rc<RefCell<SeqState>>);

#[derive(Debug)]
struct SeqState {
    exp_cmd_sn: CmdSn,
    queue_depth: u32,
    /// Non-immediate commands delivered and not yet answered.
    in_flight: u32,
    /// ITT -> member id of the connection the task arrived on (RFC 7143
    /// §11.2.1.8: ITTs are unique per session; and connection allegiance).
    tasks: FxHashMap<u32, u32>,
    /// TMF ITT -> member id of the connection that answers it.
    tmfs: FxHashMap<u32, u32>,
    /// The session's connections in full feature phase: (CID, member id).
    conns: Vec<(u16, u32)>,
    /// Members another connection logged out (reason 1 naming their CID).
    logouts: Vec<u32>,
    /// TMFs received on one connection whose tasks on the others stop
    /// receiving data: (member that got the TMF, scope).
    aborts: Vec<(u32, TaskScope)>,
    /// TMFs answered on one connection whose aborted tasks the others
    /// forget: (member that answered, scope).
    finished: Vec<(u32, TaskScope)>,
    /// The core has commands of this session waiting for data memory: the
    /// window stays where it was last shown ([`SessionSeq::hold_window`]).
    window_held: bool,
    /// The MaxCmdSN last computed.
    last_max: Option<CmdSn>,
}

/// The tasks a TMF affects, as a connection sees them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TaskScope {
    /// ABORT TASK: the task with this ITT.
    Task(u32),
    /// ABORT TASK SET, CLEAR TASK SET, LOGICAL UNIT RESET: the LUN's tasks.
    Lun([u8; 8]),
    /// TARGET RESET, I_T NEXUS RESET: every task.
    All,
}

/// TMF scopes kept for the other connections at most (a driver takes them
/// on its next pump).
const MAX_SHARED_ABORTS: usize = 64;

impl SessionSeq {
    pub fn new(exp: CmdSn, queue_depth: u32) -> SessionSeq {
        SessionSeq(Rc::new(RefCell::new(SeqState {
            exp_cmd_sn: exp,
            queue_depth: queue_depth.max(1),
            in_flight: 0,
            tasks: FxHashMap::default(),
            tmfs: FxHashMap::default(),
            conns: Vec::new(),
            logouts: Vec::new(),
            aborts: Vec::new(),
            finished: Vec::new(),
            window_held: false,
            last_max: None,
        })))
    }

    /// Holds the CmdSN window (`true`) while the core makes commands of
    /// this session wait for data memory: MaxCmdSN stops growing, so the
    /// initiator sends no new commands until memory comes back, and then
    /// the window opens again (`false`). MaxCmdSN never moves backwards.
    pub fn hold_window(&self, held: bool) {
        let mut st = self.0.borrow_mut();
        if st.window_held != held {
            tracing::debug!(held, "CmdSN window held for data memory");
            st.window_held = held;
        }
    }

    /// TMF scopes received on one connection (the member id) that the
    /// session's other connections apply ([`Conn::abort_data`](crate::conn::Conn::abort_data)).
    pub fn take_aborts(&self) -> Vec<(u32, TaskScope)> {
        std::mem::take(&mut self.0.borrow_mut().aborts)
    }

    pub(crate) fn share_abort(&self, member: u32, scope: TaskScope) {
        let mut st = self.0.borrow_mut();
        // Only a session with several connections has anyone to tell.
        if st.conns.len() > 1 && st.aborts.len() < MAX_SHARED_ABORTS {
            st.aborts.push((member, scope));
        }
    }

    /// TMFs one connection answered (the member id) whose aborted tasks
    /// the session's other connections forget ([`Conn::forget_aborted`](crate::conn::Conn::forget_aborted)).
    pub fn take_finished(&self) -> Vec<(u32, TaskScope)> {
        std::mem::take(&mut self.0.borrow_mut().finished)
    }

    pub(crate) fn share_finished(&self, member: u32, scope: TaskScope) {
        let mut st = self.0.borrow_mut();
        if st.conns.len() > 1 && st.finished.len() < MAX_SHARED_ABORTS {
            st.finished.push((member, scope));
        }
    }

    /// Members whose connection another one logged out (RFC 7143 §11.14.1
    /// reason 1 with their CID): the driver closes them.
    pub fn take_logouts(&self) -> Vec<u32> {
        std::mem::take(&mut self.0.borrow_mut().logouts)
    }

    pub(crate) fn member_of_cid(&self, cid: u16) -> Option<u32> {
        let st = self.0.borrow();
        st.conns.iter().find(|(c, _)| *c == cid).map(|(_, m)| *m)
    }

    /// ExpCmdSN: the next CmdSN the session runs.
    pub fn exp_cmd_sn(&self) -> CmdSn {
        self.0.borrow().exp_cmd_sn
    }

    /// Non-immediate commands delivered and not yet answered.
    pub fn in_flight(&self) -> u32 {
        self.0.borrow().in_flight
    }

    /// MaxCmdSN: the window shrinks by the commands outstanding, so it never
    /// moves backwards (a command in raises ExpCmdSN, its response frees a slot).
    pub fn max_cmd_sn(&self) -> CmdSn {
        let mut st = self.0.borrow_mut();
        if st.window_held
            && let Some(last) = st.last_max
        {
            return last;
        }
        let free = st.queue_depth.saturating_sub(st.in_flight);
        let max = CmdSn(st.exp_cmd_sn.0.wrapping_add(free).wrapping_sub(1));
        st.last_max = Some(max);
        max
    }

    /// RFC 7143 §4.2.2.1: ExpCmdSN <= CmdSN <= MaxCmdSN.
    pub fn in_window(&self, sn: CmdSn) -> bool {
        sn.diff(self.exp_cmd_sn()) >= 0 && sn.diff(self.max_cmd_sn()) <= 0
    }

    /// Whether two handles are the same session's.
    pub fn same(&self, other: &SessionSeq) -> bool {
        Rc::ptr_eq(&self.0, &other.0)
    }

    /// The member id of the connection that owns task `itt`.
    pub fn task_owner(&self, itt: u32) -> Option<u32> {
        self.0.borrow().tasks.get(&itt).copied()
    }

    /// The member id of the connection that answers TMF `itt`.
    pub fn tmf_owner(&self, itt: u32) -> Option<u32> {
        self.0.borrow().tmfs.get(&itt).copied()
    }

    pub(crate) fn advance(&self) {
        let mut st = self.0.borrow_mut();
        st.exp_cmd_sn = st.exp_cmd_sn.next();
    }

    pub(crate) fn add_in_flight(&self, n: i64) {
        let mut st = self.0.borrow_mut();
        st.in_flight = (st.in_flight as i64 + n).clamp(0, u32::MAX as i64) as u32;
    }

    pub(crate) fn itt_in_use(&self, itt: u32) -> bool {
        self.0.borrow().tasks.contains_key(&itt)
    }

    pub(crate) fn claim_task(&self, itt: u32, member: u32) {
        self.0.borrow_mut().tasks.insert(itt, member);
    }

    /// Forgets task `itt` if `member` owns it.
    pub(crate) fn release_task(&self, itt: u32, member: u32) {
        let mut st = self.0.borrow_mut();
        if st.tasks.get(&itt) == Some(&member) {
            st.tasks.remove(&itt);
        }
    }

    pub(crate) fn claim_tmf(&self, itt: u32, member: u32) {
        self.0.borrow_mut().tmfs.insert(itt, member);
    }

    pub(crate) fn release_tmf(&self, itt: u32, member: u32) {
        let mut st = self.0.borrow_mut();
        if st.tmfs.get(&itt) == Some(&member) {
            st.tmfs.remove(&itt);
        }
    }

    /// Connection `cid` (member `member`) reached full feature phase; a
    /// reinstated CID's old connection is replaced (RFC 7143 §6.3.4).
    pub(crate) fn add_conn(&self, cid: u16, member: u32) {
        let mut st = self.0.borrow_mut();
        st.conns.retain(|(c, _)| *c != cid);
        st.conns.push((cid, member));
    }

    /// Another connection logged `member` out (RFC 7143 §11.14.1 reason 1
    /// naming its CID): its driver closes it ([`SessionSeq::take_logouts`]).
    pub(crate) fn log_out_member(&self, member: u32) {
        self.0.borrow_mut().logouts.push(member);
    }

    /// Everything `member` owned is forgotten (its connection ended).
    pub(crate) fn release_member(&self, member: u32) {
        let mut st = self.0.borrow_mut();
        st.tasks.retain(|_, m| *m != member);
        st.tmfs.retain(|_, m| *m != member);
        st.conns.retain(|(_, m)| *m != member);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn window_math() {
        let s = SessionSeq::new(CmdSn(10), 4);
        assert_eq!(s.max_cmd_sn(), CmdSn(13));
        assert!(s.in_window(CmdSn(10)) && s.in_window(CmdSn(13)));
        assert!(!s.in_window(CmdSn(14)) && !s.in_window(CmdSn(9)));
        s.advance();
        s.add_in_flight(1);
        assert_eq!(s.exp_cmd_sn(), CmdSn(11));
        assert_eq!(s.max_cmd_sn(), CmdSn(13));
        // A clone is the same session's window.
        let other = s.clone();
        other.add_in_flight(3);
        assert!(other.same(&s));
        assert_eq!(s.max_cmd_sn(), CmdSn(10));
        assert!(!s.in_window(CmdSn(11)));
        s.add_in_flight(-10);
        assert_eq!(s.in_flight(), 0);
        let s = SessionSeq::new(CmdSn(u32::MAX), 2);
        assert_eq!(s.max_cmd_sn(), CmdSn(0));
        assert!(s.in_window(CmdSn(0)));
    }
}
