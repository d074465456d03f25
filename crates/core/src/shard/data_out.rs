//! Data-Out: asking the fabric for write data, the data budget a
//! command holds, and what a command does once its data arrived.

use super::*;

impl Cmd {
    /// The bytes of Data-Out the command takes next, from `chunk_at` of
    /// its data: a WRITE's current chunk, WRITE SAME's one block, the data
    /// or parameter list of the others; `None` for a plan without
    /// Data-Out.
    pub(super) fn data_out_len(&self) -> Option<u32> {
        match self.plan {
            Plan::Write { len, atomic, .. } => Some(write_chunk(len, self.chunk_at, atomic)),
            Plan::WriteSame { ndob: false, .. } => Some(
                self.entry
                    .as_ref()
                    .map_or(0, |e| e.device.geometry().block_size),
            ),
            Plan::PrOut { param_len: 0, .. } | Plan::Sanitize { param_len: 0, .. } => None,
            Plan::Unmap { param_len, .. }
            | Plan::PrOut { param_len, .. }
            | Plan::SetPortGroups { param_len, .. }
            | Plan::ModeSelect { param_len, .. }
            | Plan::ExtendedCopy { param_len, .. }
            | Plan::Sanitize { param_len, .. } => Some(param_len),
            Plan::Compare { data_len, .. } | Plan::ReadModifyWrite { data_len, .. } => {
                Some(data_len)
            }
            _ => None,
        }
    }
}

impl Shard {
    /// Asks the fabric for the command's next Data-Out
    /// ([`Cmd::data_out_len`] bytes from `chunk_at`), into `reuse` if it
    /// is large enough; waits in `BufWait` if the budget has no room for
    /// it.
    pub(super) fn fetch(&mut self, key: usize, reuse: Option<SgList>) {
        let c = &self.cmds[key];
        let Some(len) = c.data_out_len() else {
            return;
        };
        let offset = c.chunk_at;
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
        self.advance(key, CmdState::NeedData);
        let c = &self.cmds[key];
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
    pub(super) fn reserve(&mut self, key: usize, n: u64) -> bool {
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
        self.advance(key, CmdState::BufWait { want: n });
        false
    }

    /// Starts again the commands in `BufWait` whose buffers now fit, oldest
    /// first; a command that still does not fit keeps its place. True if
    /// any did.
    pub(super) fn retry_buffers(&mut self) -> bool {
        let mut progress = false;
        let mut i = 0;
        while i < self.buf_wait.len() {
            let key = self.buf_wait[i];
            let Some((c, want)) = self.cmds.get(key).and_then(|c| match c.state {
                CmdState::BufWait { want } => Some((c, want)),
                _ => None,
            }) else {
                self.buf_wait.remove(i);
                continue;
            };
            let (sid, extra) = (c.session, want.saturating_sub(c.charged));
            let held = self.sessions.get(&sid).map_or(0, |s| s.data_held);
            if !self.budget.try_take(extra, held) {
                i += 1;
                continue;
            }
            self.buf_wait.remove(i);
            if let Some(s) = self.sessions.get_mut(&sid) {
                s.data_held += extra;
            }
            self.cmds[key].charged = want;
            self.advance(key, CmdState::New);
            // Every plan that takes a buffer is started again from the top:
            // a WRITE goes on from `chunk_at`, and the buffer is held now.
            self.start(key);
            progress = true;
        }
        progress
    }

    /// Gives back the budget a command leaving the slab holds.
    pub(super) fn release_budget(&mut self, c: &Cmd) {
        let mut left = 0;
        if let Some(s) = self.sessions.get_mut(&c.session) {
            s.data_held = s.data_held.saturating_sub(c.charged);
            left = s.data_held;
        }
        self.budget.give(c.charged, left);
    }

    pub(super) fn data_out_done(&mut self, sid: SessionId, id: CmdId, data: Result<SgList, Abort>) {
        let Some(key) = self.key_of(id) else {
            return;
        };
        let c = &self.cmds[key];
        if c.session != sid {
            return;
        }
        match c.state {
            CmdState::NeedData => {}
            CmdState::Aborted(Drain::DataOut) => {
                // Dropping the buffer returns it to the pool.
                drop(data);
                self.free(key);
                return;
            }
            _ => return,
        }
        let plan = c.plan;
        let want = c.data_out_len();
        match data {
            Ok(mut buf) => {
                let Some(want) = want else {
                    return;
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
                    Plan::SetPortGroups { .. } => {
                        let params = buf.to_vec();
                        self.set_port_groups(key, &params);
                    }
                    Plan::ReadModifyWrite { offset, len, .. } => {
                        // Hold the range from the read to the write (SBC-4
                        // §5.3): the read waits while another command
                        // holds an overlapping one.
                        let medium = self.pool.sg(len as usize);
                        self.cmds[key].cont = Cont::Combine(buf);
                        self.submit_op(
                            key,
                            BlockOp::Read {
                                offset,
                                buf: medium,
                            },
                        );
                    }
                    Plan::Compare { offset, len, .. } => {
                        self.cmds[key].cont = Cont::Verify(buf);
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
}
