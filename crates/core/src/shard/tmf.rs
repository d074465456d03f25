//! Task management functions and resets (SAM-5 §7, §6.3): aborting
//! commands, waiting for the aborted ones to drain, the resets this shard's
//! sessions received that other cores must apply too
//! ([`Shard::take_spanning_resets`], their responses held until
//! [`Shard::spanning_reset_drained`]), and resets another core started
//! ([`Shard::remote_reset`]).

use super::*;

/// Who waits for a set of aborted commands to drain.
pub(super) enum Waiter {
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

pub(super) struct PendingTmf {
    pub(super) waiter: Waiter,
    /// Commands (slab key, seq) still draining.
    pub(super) waiting: SmallVec<[(usize, u32); 8]>,
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
pub(super) struct HeldTmf {
    pub(super) span: SpanningResetId,
    pub(super) session: SessionId,
    /// The response, once this shard's part drained.
    pub(super) done: Option<Action>,
    /// Every other core reported its part drained.
    pub(super) others_drained: bool,
}

impl Shard {
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

    /// Aborts command `key` (SAM-5 §7.2: it will send no status): it moves
    /// to `Aborted` if its data transfer or backend I/O is still under way
    /// (true: the caller waits for it), or else to `Done`, for the caller to
    /// free. An answered command (`Respond`) is not aborted.
    fn abort(&mut self, key: usize) -> bool {
        let Some(c) = self.cmds.get(key) else {
            return false;
        };
        let to = match c.state {
            // SBC-4 §4.11.1: the sanitize operation goes on without its task.
            CmdState::New
            | CmdState::Blocked
            | CmdState::QueueFull(_)
            | CmdState::RangeWait(_)
            | CmdState::BufWait { .. }
            | CmdState::Background => CmdState::Done,
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
                    CmdState::Done
                } else {
                    CmdState::Aborted(Drain::DataOut)
                }
            }
            CmdState::Exec => CmdState::Aborted(Drain::Backend),
            CmdState::Aborted(_) => return true,
            CmdState::Respond | CmdState::Done => return false,
        };
        let wait = matches!(to, CmdState::Aborted(_));
        self.advance(key, to);
        wait
    }

    /// Aborts every command matching `pred`; returns those to wait for,
    /// including ones an earlier abort left draining.
    pub(super) fn abort_where(
        &mut self,
        pred: impl Fn(&Cmd) -> bool,
    ) -> SmallVec<[(usize, u32); 8]> {
        let keys: SmallVec<[(usize, u32); 16]> = self
            .cmds
            .iter()
            .filter(|(_, c)| !matches!(c.state, CmdState::Respond | CmdState::Done) && pred(c))
            .map(|(k, c)| (k, c.seq))
            .collect();
        // Abort them all first, so that freeing one does not start another
        // that is about to be aborted.
        let mut wait = SmallVec::new();
        let mut gone: SmallVec<[usize; 16]> = SmallVec::new();
        for (k, seq) in keys {
            if self.abort(k) {
                wait.push((k, seq));
            } else {
                gone.push(k);
            }
        }
        for k in gone {
            self.free(k);
        }
        wait
    }

    pub(super) fn task_mgmt(&mut self, sid: SessionId, req: TmfRequest) -> TmfId {
        let Some(s) = self.sessions.get_mut(&sid) else {
            return TmfId(u32::MAX);
        };
        let id = TmfId(s.next_tmf);
        s.next_tmf = s.next_tmf.wrapping_add(1);
        let lu_device = s.luns.get(req.lun).map(|e| e.device.id);
        let lun = req.lun;
        let target = s.nexus.target.clone();
        let live = |c: &Cmd| {
            !matches!(
                c.state,
                CmdState::Respond | CmdState::Aborted(_) | CmdState::Done
            )
        };
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
    pub(super) fn wait_for(&mut self, waiter: Waiter, wait: SmallVec<[(usize, u32); 8]>) {
        if wait.is_empty() {
            self.finish_waiter(waiter);
        } else {
            self.tmfs.push(PendingTmf {
                waiter,
                waiting: wait,
            });
        }
    }

    pub(super) fn finish_waiter(&mut self, w: Waiter) {
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
    pub(super) fn raise_where(
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
}
