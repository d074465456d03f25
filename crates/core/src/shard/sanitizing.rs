//! Driving a sanitize operation (SBC-4 §4.11) on this shard: one block
//! operation in flight at a time, paced, answered when it ends.

use super::*;

impl Shard {
    /// Runs a SANITIZE once its parameter list (if any) arrived (SBC-4
    /// §5.30): EXIT FAILURE MODE at once; OVERWRITE and BLOCK ERASE claim
    /// the device and start a [`SanitizeJob`], answered now with IMMED and
    /// when the operation ends without.
    pub(super) fn sanitize(&mut self, key: usize, params: &[u8]) {
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
            self.advance(key, CmdState::Background);
        }
        self.drive_sanitize(self.now);
    }

    /// Issues the next block operation of every sanitize operation with
    /// none in flight whose pacing allows it. True if any moved.
    pub(super) fn drive_sanitize(&mut self, now: Option<Instant>) -> bool {
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
    pub(super) fn sanitize_done(&mut self, d: BlockDone) {
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
    pub(super) fn finish_sanitize(&mut self, k: usize, ok: bool) {
        if !self.sanitizing.contains(k) {
            return;
        }
        let j = self.sanitizing.remove(k);
        j.dev.shared.sanitize.finish(ok, j.ause);
        if let Some((key, seq)) = j.cmd
            && self
                .cmds
                .get(key)
                .is_some_and(|c| c.seq == seq && matches!(c.state, CmdState::Background))
        {
            let rsp = if ok {
                good(j.residual)
            } else {
                Response::check(Sense::SANITIZE_COMMAND_FAILED)
            };
            self.respond(key, rsp);
        }
    }
}
