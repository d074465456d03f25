//! EXTENDED COPY and RECEIVE COPY RESULTS (SPC-4 §6.4, §6.23) on this shard.

use super::*;

// ----- EXTENDED COPY and RECEIVE COPY RESULTS (SPC-4 §6.4, §6.23) -----
//
// The copy of one EXTENDED COPY runs on the core of the nexus that sent it,
// against this core's queues of the source and destination devices
// (whatever LUs they are): [`crate::xcopy::CopyRun`] says what to submit,
// this shard submits it and feeds completions back. The command stays in
// `Exec` until the copy ends, so task management waits for its chunks.
impl Shard {
    /// Starts an EXTENDED COPY once its parameter list arrived.
    pub(super) fn xcopy_start(&mut self, key: usize, params: &[u8]) {
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
            port: s.nexus.port_ids(),
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
        self.advance(key, CmdState::Exec);
        self.xcopy_pump(key);
    }

    /// Submits what the copy of `key` may submit now; answers the command
    /// (or frees it, aborted) once the copy is over.
    pub(super) fn xcopy_pump(&mut self, key: usize) {
        let owner = self.owner(key);
        loop {
            let (issue, seq) = {
                let Some(c) = self.cmds.get_mut(key) else {
                    return;
                };
                let (aborted, seq) = (matches!(c.state, CmdState::Aborted(_)), c.seq);
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
        if matches!(c.state, CmdState::Aborted(_)) {
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
    pub(super) fn xcopy_reset(&mut self, dev: DeviceId) {
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
    pub(super) fn xcopy_done(&mut self, key: usize, seq: u32, slot: usize, d: BlockDone) {
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
    pub(super) fn xcopy_retry(&mut self) -> bool {
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
    pub(super) fn copy_results(&mut self, key: usize) {
        let c = &self.cmds[key];
        let (sid, expected) = (c.session, c.expected_len);
        let list_id = c.cdb.get(2).copied().unwrap_or(0);
        let running = self.cmds.iter().find_map(|(_, o)| match &o.cont {
            Cont::Copy(r)
                if o.session == sid
                    && !matches!(o.state, CmdState::Aborted(_))
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
