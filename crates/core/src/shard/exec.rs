//! Execution: starting a planned command, backend submission and its
//! retries (a full queue is a waiting state), completions and responses.

use super::*;

impl Shard {
    /// Moves command `key` to state `to`: the one place a command's state
    /// changes; returns the state it left (with what that state held, such
    /// as a parked op). Entering `BufWait`, `QueueFull` or `RangeWait`
    /// queues it for its retry (the retry loops take it off again before
    /// they move it on); entering `Done` takes it off whatever queue its
    /// state kept it in; leaving `BufWait` ends its wait in the budget's and
    /// its session's count of waiters.
    pub(super) fn advance(&mut self, key: usize, to: CmdState) -> Option<CmdState> {
        let c = self.cmds.get_mut(key)?;
        let (into, done) = (to.wait_queue(), matches!(to, CmdState::Done));
        if matches!(to, CmdState::Blocked) {
            c.waited = true;
        }
        let from = std::mem::replace(&mut c.state, to);
        let sid = c.session;
        let left = from.wait_queue();
        if left == Some(WaitQueue::Buffers) && into != Some(WaitQueue::Buffers) {
            self.budget.note_wait(false);
            if let Some(s) = self.sessions.get_mut(&sid) {
                s.buf_waiting = s.buf_waiting.saturating_sub(1);
            }
        }
        if done && let Some(w) = left {
            let q = self.wait_queue(w);
            if let Some(p) = q.iter().position(|&k| k == key) {
                q.remove(p);
            }
        }
        match into {
            Some(WaitQueue::Buffers) if left != Some(WaitQueue::Buffers) => {
                self.buf_wait.push_back(key);
                self.budget.note_wait(true);
                if let Some(s) = self.sessions.get_mut(&sid) {
                    s.buf_waiting += 1;
                }
            }
            Some(w @ (WaitQueue::Queue | WaitQueue::Ranges)) => self.wait_queue(w).push_back(key),
            _ => {}
        }
        Some(from)
    }

    /// The shard's queue of commands waiting for `w`.
    fn wait_queue(&mut self, w: WaitQueue) -> &mut VecDeque<usize> {
        match w {
            WaitQueue::Buffers => &mut self.buf_wait,
            WaitQueue::Queue => &mut self.retry,
            WaitQueue::Ranges => &mut self.range_wait,
        }
    }

    /// Takes the op a `QueueFull` or `RangeWait` command parked: the
    /// command moves to `Exec`, its op handed to the backend now (or parked
    /// again if it still may not go). `None` for a command in another state.
    fn unpark(&mut self, key: usize) -> Option<BlockOp> {
        let parked = self
            .cmds
            .get(key)
            .is_some_and(|c| matches!(c.state, CmdState::QueueFull(_) | CmdState::RangeWait(_)));
        if !parked {
            return None;
        }
        match self.advance(key, CmdState::Exec)? {
            CmdState::QueueFull(op) | CmdState::RangeWait(op) => Some(*op),
            _ => None,
        }
    }

    /// Runs a command the task set let through.
    pub(super) fn start(&mut self, key: usize) {
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
            Plan::Flush(_) => self.submit_op(key, BlockOp::Flush),
            Plan::WriteSame { ndob: true, .. } => self.write_same(key, None),
            Plan::PrOut { param_len: 0, .. } => self.pr_out(key, &[]),
            Plan::Sanitize { param_len: 0, .. } => self.sanitize(key, &[]),
            // Data-Out first (`Cmd::data_out_len`).
            Plan::Write { .. }
            | Plan::WriteSame { .. }
            | Plan::Unmap { .. }
            | Plan::Compare { .. }
            | Plan::ReadModifyWrite { .. }
            | Plan::ModeSelect { .. }
            | Plan::PrOut { .. }
            | Plan::SetPortGroups { .. }
            | Plan::ExtendedCopy { .. }
            | Plan::Sanitize { .. } => self.fetch(key, None),
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
    pub(super) fn load_eject(&mut self, key: usize, load: bool, residual: Residual) {
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

    pub(super) fn start_data_in(&mut self, key: usize) {
        let c = &self.cmds[key];
        // A shared reservation store (a cluster): PERSISTENT RESERVE IN
        // reports the state as it is there now.
        if c.cdb.first() == Some(&ferrite_scsi::Opcode::PERSISTENT_RESERVE_IN.0)
            && let Some(e) = c.entry.as_ref()
            && e.device.shared.refresh_pr().is_err()
        {
            self.respond(
                key,
                Response::check(Sense::LOGICAL_UNIT_COMMUNICATION_FAILURE),
            );
            return;
        }
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
            port: s.nexus.port_ids(),
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
    pub(super) fn data_in_response(
        &self,
        r: Result<u32, Sense>,
        out: &[u8],
        expected: u32,
    ) -> Response {
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
    pub(super) fn queue(&mut self, dev: &Device) -> Option<&mut Box<dyn BackendQueue>> {
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

    pub(super) fn submit_op(&mut self, key: usize, op: BlockOp) {
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
            self.advance(key, CmdState::RangeWait(Box::new(op)));
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
                self.advance(key, CmdState::RangeWait(Box::new(op)));
                return;
            }
            if take {
                self.cmds[key].locked = true;
            }
        }
        // Keep arrival order behind operations already waiting for a slot.
        if !self.retry.is_empty() {
            self.advance(key, CmdState::QueueFull(Box::new(op)));
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
            Ok(()) => {
                self.advance(key, CmdState::Exec);
            }
            Err(Busy(op)) => {
                // SPDK/STYLE rule 5: a full queue is a waiting state.
                self.advance(key, CmdState::QueueFull(Box::new(op)));
            }
        }
    }

    /// Retries operations a full queue handed back, oldest first; one that is
    /// still refused keeps its place. True if any was accepted.
    pub(super) fn retry_busy(&mut self) -> bool {
        let mut progress = false;
        let n = self.retry.len();
        let mut refused: SmallVec<[DeviceId; 4]> = SmallVec::new();
        for _ in 0..n {
            let Some(key) = self.retry.pop_front() else {
                break;
            };
            let Some(c) = self.cmds.get(key) else {
                continue;
            };
            let tag = tag_of(key, c.seq);
            let (CmdState::QueueFull(_), Some(dev)) =
                (&c.state, c.entry.as_ref().map(|e| e.device.clone()))
            else {
                continue;
            };
            if refused.contains(&dev.id) {
                self.retry.push_back(key);
                continue;
            }
            let Some(op) = self.unpark(key) else {
                continue;
            };
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
                Ok(()) => progress = true,
                Err(Busy(op)) => {
                    self.advance(key, CmdState::QueueFull(Box::new(op)));
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
    pub(super) fn pr_out(&mut self, key: usize, params: &[u8]) {
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
        if dev.shared.refresh_pr().is_err() {
            self.respond(
                key,
                check(Sense::LOGICAL_UNIT_COMMUNICATION_FAILURE, residual),
            );
            return;
        }
        let result = match dev.shared.pr.lock() {
            Ok(mut pr) => {
                let before = pr.clone();
                let r = pr.out(&me, &cdb, params);
                if r.is_ok() && dev.shared.persist_pr(&pr).is_err() {
                    // A shared store (a cluster) that cannot take the change:
                    // it does not happen here either.
                    *pr = before;
                    Err(PrError::Check(Sense::LOGICAL_UNIT_COMMUNICATION_FAILURE))
                } else {
                    dev.shared
                        .pr_reserved
                        .store(pr.res.is_some(), std::sync::atomic::Ordering::Release);
                    r
                }
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
    pub(super) fn mode_select(&mut self, key: usize, params: &[u8]) {
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
            dpofua: dev.backend.caps().fua,
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

    /// Applies SET TARGET PORT GROUPS parameter data (SPC-4 §6.36) to the
    /// device's device group: all descriptors or none, saved before they
    /// take effect; the other nexuses of the group's devices get
    /// ASYMMETRIC ACCESS STATE CHANGED (through the group's generation).
    pub(super) fn set_port_groups(&mut self, key: usize, params: &[u8]) {
        let c = &self.cmds[key];
        let (Some(e), Plan::SetPortGroups { residual, .. }) = (c.entry.clone(), c.plan) else {
            return;
        };
        let Some(dg) = e.device.alua().filter(|dg| dg.explicit()).cloned() else {
            self.respond(key, check(Sense::INVALID_COMMAND_OPERATION_CODE, residual));
            return;
        };
        let changes = match crate::alua::parse_set(params, &dg) {
            Ok(ch) => ch,
            Err(s) => {
                self.respond(key, check(s, residual));
                return;
            }
        };
        match dg.set(&changes, crate::alua::Cause::Explicit) {
            Ok(moved) => {
                if moved && let Some(st) = self.lu_mut(key) {
                    st.alua_gen = Some(dg.generation());
                }
                self.respond(key, good(residual));
            }
            Err(_) => self.respond(
                key,
                check(Sense::SET_TARGET_PORT_GROUPS_COMMAND_FAILED, residual),
            ),
        }
    }

    /// Retries operations that waited for a held range, oldest first.
    pub(super) fn retry_ranges(&mut self) -> bool {
        let mut progress = false;
        for _ in 0..self.range_wait.len() {
            let Some(key) = self.range_wait.pop_front() else {
                break;
            };
            let Some(op) = self.unpark(key) else {
                continue;
            };
            self.submit_op(key, op);
            if self
                .cmds
                .get(key)
                .is_some_and(|c| !matches!(c.state, CmdState::RangeWait(_)))
            {
                progress = true;
            }
        }
        progress
    }

    /// A block operation finished.
    pub(super) fn complete(&mut self, d: BlockDone) {
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
        if c.seq != seq {
            return;
        }
        match c.state {
            CmdState::Exec => {}
            CmdState::Aborted(Drain::Backend) => {
                // SAM-5 §7.2: an aborted task sends no status; its buffer
                // goes back to the pool here.
                drop(d.buf);
                self.free(key);
                return;
            }
            _ => return,
        }
        let mut dbuf = d.buf;
        if let Plan::Write { len, atomic, .. } = c.plan
            && d.result.is_ok()
        {
            let next = c.chunk_at + write_chunk(len, c.chunk_at, atomic);
            if next < len {
                self.cmds[key].chunk_at = next;
                self.fetch(key, dbuf);
                return;
            }
        }
        if d.result.is_ok() && matches!(c.cont, Cont::Combine(_)) {
            if let Cont::Combine(data) = std::mem::replace(&mut self.cmds[key].cont, Cont::None) {
                self.combine(key, data, dbuf);
            }
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
                let data = match std::mem::replace(&mut self.cmds[key].cont, Cont::None) {
                    Cont::Verify(b) => Some(b.to_vec()),
                    _ => None,
                };
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
    pub(super) fn respond(&mut self, key: usize, rsp: Response) {
        let Some(c) = self.cmds.get(key) else {
            return;
        };
        let counted = matches!(c.state, CmdState::Respond);
        self.advance(key, CmdState::Respond);
        let c = &mut self.cmds[key];
        let (sid, tag, id) = (c.session, c.tag, cmd_id(key, c.seq));
        let d_sense = c.entry.as_ref().is_some_and(|e| e.device.d_sense());
        if c.locked {
            c.locked = false;
            let owner = ((self.core as u64) << 32) | c.seq as u64;
            if let Some(e) = c.entry.as_ref() {
                e.device.shared.ranges.unlock(owner);
            }
        }
        if !counted {
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

    /// Removes a command; drains pending TMFs and lingering sessions.
    pub(super) fn free(&mut self, key: usize) {
        self.leave_task_set(key);
        let Some(answered) = self
            .advance(key, CmdState::Done)
            .map(|from| matches!(from, CmdState::Respond))
        else {
            return;
        };
        let c = self.cmds.remove(key);
        if c.charged > 0 {
            self.release_budget(&c);
        }
        if c.locked
            && let Some(e) = c.entry.as_ref()
        {
            e.device
                .shared
                .ranges
                .unlock(((self.core as u64) << 32) | c.seq as u64);
        }
        if !answered {
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

    pub(super) fn response_sent(&mut self, sid: SessionId, id: CmdId) {
        let Some(key) = self.key_of(id) else {
            return;
        };
        if self
            .cmds
            .get(key)
            .is_some_and(|c| c.session == sid && matches!(c.state, CmdState::Respond))
        {
            self.free(key);
        }
    }
}
