//! The session layer's control requests on one connection: NOP-Out and
//! NOP-In pings (RFC 7143 §11.18, §11.19), text requests (§11.10,
//! SendTargets), logout (§11.14), task management (§11.5) and
//! asynchronous messages (§11.9). Each answer goes out through the
//! connection's datamover as a control PDU ([`Datamover::send_control`]).

use std::net::SocketAddr;
use std::time::Instant;

use ferrite_core::{Abort, TaskTag, TmfFunction, TmfRequest, TmfResponse};
use ferrite_scsi::{Lun, Sense};

use crate::datamover::Datamover;
use crate::keys::{SessionType, encode_text, parse_text};
use crate::pdu::{self, BHS_LEN, Bhs, Opcode, RESERVED_TAG, RejectReason, flags, tmf_fn, tmf_rsp};

use super::{CloseReason, Conn, ConnEvent, Phase, TaskScope, later};

/// A text response too long for one PDU (RFC 7143 §11.10.2).
#[derive(Debug)]
pub(super) struct TextCont {
    itt: u32,
    ttt: u32,
    rest: Vec<u8>,
}

impl<D: Datamover> Conn<D> {
    pub(super) fn run_control(&mut self, hdr: &[u8; BHS_LEN], data: Vec<u8>) {
        let bhs = Bhs(hdr);
        match bhs.opcode() {
            Opcode::NOP_OUT => {
                // RFC 7143 §11.19: the NOP-In echoes the ping data.
                let n = data
                    .len()
                    .min(self.params.max_xmit_data_segment_length as usize);
                let sns = self.take_sns();
                let b = pdu::nop_in(bhs.lun(), bhs.itt(), RESERVED_TAG, sns);
                self.dm.send_control(&b, &data[..n]);
            }
            Opcode::TEXT_REQ => self.text_request(hdr, data),
            Opcode::LOGOUT_REQ => self.logout(hdr),
            Opcode::TMF_REQ => self.tmf_request(hdr),
            _ => {}
        }
    }

    /// Sends a NOP-In ping unless one is out. RFC 7143 §11.19: a ping
    /// carries a TTT and ITT 0xffffffff; StatSN is not advanced. Its
    /// NOP-Out answer carries the initiator's ExpStatSN.
    pub(super) fn ping(&mut self, now: Instant) {
        if self.ping.is_some() {
            return;
        }
        let ttt = self.new_ttt();
        let b = pdu::nop_in([0; 8], RESERVED_TAG, ttt, self.sns());
        self.dm.send_control(&b, &[]);
        self.ping = Some((ttt, later(now, self.cfg.nop_in_timeout)));
    }

    fn text_request(&mut self, hdr: &[u8; BHS_LEN], data: Vec<u8>) {
        let bhs = Bhs(hdr);
        let itt = bhs.itt();
        let ttt = bhs.ttt();
        let max = self.params.max_xmit_data_segment_length.max(512) as usize;
        if ttt != RESERVED_TAG {
            // Continuation of a long response (RFC 7143 §11.10.4).
            match self.text_cont.take() {
                Some(c) if c.ttt == ttt && c.itt == itt => {
                    self.send_text_chunk(bhs.lun(), itt, c.rest, max);
                }
                _ => {
                    if self.text_in.is_empty() {
                        self.send_reject(RejectReason::InvalidPduField, hdr);
                        return;
                    }
                    self.text_in_more(hdr, data, max);
                }
            }
            return;
        }
        self.text_cont = None;
        self.text_in.clear();
        self.text_in_more(hdr, data, max);
    }

    fn text_in_more(&mut self, hdr: &[u8; BHS_LEN], data: Vec<u8>, max: usize) {
        let bhs = Bhs(hdr);
        let itt = bhs.itt();
        if self.text_in.len() + data.len() > crate::keys::MAX_TEXT {
            self.text_in.clear();
            self.send_reject(RejectReason::ProtocolError, hdr);
            return;
        }
        self.text_in.extend_from_slice(&data);
        if bhs.flags() & flags::C != 0 {
            // RFC 7143 §11.10.2: answer a partial request with an empty
            // response and a TTT to continue with.
            let ttt = self.new_ttt();
            let sns = self.take_sns();
            let b = pdu::text_response(false, false, bhs.lun(), itt, ttt, sns);
            self.dm.send_control(&b, &[]);
            return;
        }
        let text = std::mem::take(&mut self.text_in);
        let reply = match parse_text(&text) {
            Ok(pairs) => self.text_reply(&pairs),
            Err(e) => {
                tracing::debug!(peer = %self.peer, "bad text request: {e}");
                self.send_reject(RejectReason::ProtocolError, hdr);
                return;
            }
        };
        self.send_text_chunk(bhs.lun(), itt, reply, max);
    }

    fn send_text_chunk(&mut self, lun: [u8; 8], itt: u32, mut text: Vec<u8>, max: usize) {
        if text.len() > max {
            let rest = text.split_off(max);
            let ttt = self.new_ttt();
            let sns = self.take_sns();
            let b = pdu::text_response(false, true, lun, itt, ttt, sns);
            self.dm.send_control(&b, &text);
            self.text_cont = Some(TextCont { itt, ttt, rest });
        } else {
            let sns = self.take_sns();
            let b = pdu::text_response(true, false, lun, itt, RESERVED_TAG, sns);
            self.dm.send_control(&b, &text);
        }
    }

    /// Full-feature text keys: SendTargets (RFC 7143 Appendix C); others are
    /// not negotiable here.
    fn text_reply(&self, pairs: &[(&str, &str)]) -> Vec<u8> {
        let mut out: Vec<(String, String)> = Vec::new();
        for (k, v) in pairs {
            if *k != "SendTargets" {
                // Renegotiation in full feature phase is not supported: a
                // known key is refused, an unknown one not understood.
                let v = if crate::keys::KNOWN_KEYS.contains(k) {
                    "Reject"
                } else {
                    "NotUnderstood"
                };
                out.push((k.to_string(), v.into()));
                continue;
            }
            let discovery = self.params.session_type == SessionType::Discovery;
            let current = self.params.target_name.as_deref();
            for t in &self.cfg.targets {
                // RFC 7143 Appendix C: All on a discovery session lists every
                // target; on a normal session only the current one is shown;
                // an empty value means the current target; a name that one.
                let show = match *v {
                    "All" if discovery => true,
                    "All" | "" => Some(t.name.as_str()) == current,
                    name => t.name == name && (discovery || Some(name) == current),
                };
                if !show {
                    continue;
                }
                out.push(("TargetName".into(), t.name.clone()));
                let portals: Vec<SocketAddr> = if t.portals.is_empty() {
                    vec![self.local]
                } else {
                    t.portals.clone()
                };
                for mut p in portals {
                    if p.ip().is_unspecified() {
                        p.set_ip(self.local.ip());
                    }
                    let addr = match p {
                        SocketAddr::V4(a) => format!("{}:{}", a.ip(), a.port()),
                        SocketAddr::V6(a) => format!("[{}]:{}", a.ip(), a.port()),
                    };
                    out.push(("TargetAddress".into(), format!("{addr},{}", t.tpgt)));
                }
            }
        }
        encode_text(&out)
    }

    fn logout(&mut self, hdr: &[u8; BHS_LEN]) {
        let bhs = Bhs(hdr);
        // RFC 7143 §11.14.1 reason codes; §11.15.1 responses.
        let reason = bhs.function();
        // Reason 1 may name another connection of the session (RFC 7143
        // §11.14.1): that one is closed, this one goes on.
        let other = if reason == 1 && bhs.cid() != self.cid() {
            self.seq.member_of_cid(bhs.cid())
        } else {
            None
        };
        let response = match reason {
            0 => 0,
            1 if bhs.cid() == self.cid() || other.is_some() => 0,
            1 => 1,
            // Removing a connection for recovery needs ERL 2.
            2 => 2,
            _ => {
                self.send_reject(RejectReason::InvalidPduField, hdr);
                return;
            }
        };
        let sns = self.take_sns();
        let b = pdu::logout_response(bhs.itt(), response, 0, 0, sns);
        self.dm.send_control(&b, &[]);
        if let Some(m) = other {
            self.seq.log_out_member(m);
            return;
        }
        if response == 0 {
            // RFC 7143 §11.14.1: reason 0 closes the session (every
            // connection), reason 1 this connection only.
            self.close(if reason == 1 {
                CloseReason::ConnectionLogout
            } else {
                CloseReason::Logout
            });
        }
    }

    fn tmf_request(&mut self, hdr: &[u8; BHS_LEN]) {
        let bhs = Bhs(hdr);
        let itt = bhs.itt();
        let lun_raw = bhs.lun();
        let lun = Lun::decode(lun_raw).unwrap_or(Lun(u16::MAX));
        let rtt = bhs.word20();
        let code = bhs.function();
        // TMFs are rare and mark error recovery on the initiator's side:
        // a line each, and one for the answer (`send_tmf_rsp`).
        tracing::info!(peer = %self.peer, itt, lun = lun.0, ref_itt = rtt,
            "task management request: {}", tmf_fn::name(code));
        let func = match code {
            tmf_fn::ABORT_TASK => TmfFunction::AbortTask {
                tag: TaskTag(rtt as u64),
            },
            tmf_fn::ABORT_TASK_SET => TmfFunction::AbortTaskSet,
            tmf_fn::CLEAR_ACA => TmfFunction::ClearAca,
            tmf_fn::CLEAR_TASK_SET => TmfFunction::ClearTaskSet,
            tmf_fn::LUN_RESET => TmfFunction::LogicalUnitReset,
            tmf_fn::TARGET_WARM_RESET | tmf_fn::TARGET_COLD_RESET => TmfFunction::TargetReset,
            tmf_fn::QUERY_TASK => TmfFunction::QueryTask {
                tag: TaskTag(rtt as u64),
            },
            tmf_fn::QUERY_TASK_SET => TmfFunction::QueryTaskSet,
            tmf_fn::I_T_NEXUS_RESET => TmfFunction::ItNexusReset,
            tmf_fn::QUERY_ASYNC_EVENT => TmfFunction::QueryAsyncEvent,
            tmf_fn::TASK_REASSIGN => {
                // RFC 7143 §11.5.1: TASK REASSIGN needs ERL 2.
                self.send_tmf_rsp(itt, Some(code), tmf_rsp::REASSIGN_NOT_SUPPORTED);
                return;
            }
            _ => {
                self.send_tmf_rsp(itt, Some(code), tmf_rsp::REJECTED);
                return;
            }
        };
        // RFC 7143 §11.5.1: affected tasks get no more R2Ts and their
        // Data-Out is discarded: the core's pending fetches end now, on
        // every connection of the session (the others through their driver,
        // SessionSeq::take_aborts).
        let scope = match func {
            TmfFunction::AbortTask { .. } => Some(TaskScope::Task(rtt)),
            TmfFunction::AbortTaskSet
            | TmfFunction::ClearTaskSet
            | TmfFunction::LogicalUnitReset => Some(TaskScope::Lun(lun_raw)),
            TmfFunction::TargetReset | TmfFunction::ItNexusReset => Some(TaskScope::All),
            _ => None,
        };
        if let Some(scope) = scope {
            self.abort_data(scope);
            self.seq.share_abort(self.member, scope);
        }
        self.tmfs.insert(itt, (code, scope));
        self.seq.claim_tmf(itt, self.member);
        self.events.push_back(ConnEvent::TaskMgmt(TmfRequest {
            func,
            lun,
            tag: TaskTag(itt as u64),
        }));
    }

    /// The tasks in `scope` get no more R2Ts, their Data-Out is discarded
    /// and the core's fetches for them end (RFC 7143 §11.5.1); for a TMF
    /// received on another connection of the session too.
    pub fn abort_data(&mut self, scope: TaskScope) {
        let mut affected: Vec<u32> = self
            .tasks
            .iter()
            .filter(|(itt, t)| match scope {
                TaskScope::Task(rtt) => **itt == rtt,
                TaskScope::Lun(lun) => t.lun_raw == lun,
                TaskScope::All => true,
            })
            .map(|(i, _)| *i)
            .collect();
        affected.sort();
        for a in affected {
            if let Some(t) = self.tasks.get_mut(&a) {
                t.failed = true;
                // A task still held for its CmdSN never reached the core,
                // which runs it later as usual (RFC 7143 §11.5.1: a TMF
                // acts on the tasks before it in CmdSN order).
                t.aborted = t.submitted;
                t.r2ts.clear();
                if let Some(f) = t.fetch.take() {
                    self.events.push_back(ConnEvent::DataOutDone {
                        id: f.id,
                        data: Err(Abort::Aborted),
                    });
                }
            }
        }
    }

    /// Answers TMF `itt` (function `func`) with response `code`.
    /// The tasks in `scope` that a TMF aborted are gone in the core: their
    /// ITTs, window slots and transfer state are released. For a TMF
    /// answered on another connection of the session too
    /// ([`SessionSeq::take_finished`](crate::session::SessionSeq::take_finished)).
    pub fn forget_aborted(&mut self, scope: TaskScope) {
        let gone: Vec<u32> = self
            .tasks
            .iter()
            .filter(|(itt, t)| {
                t.aborted
                    && match scope {
                        TaskScope::Task(rtt) => **itt == rtt,
                        TaskScope::Lun(lun) => t.lun_raw == lun,
                        TaskScope::All => true,
                    }
            })
            .map(|(i, _)| *i)
            .collect();
        for itt in gone {
            if let Some(t) = self.tasks.remove(&itt) {
                self.seq.release_task(itt, self.member);
                if t.counted {
                    self.seq.add_in_flight(-1);
                }
            }
        }
    }

    fn send_tmf_rsp(&mut self, itt: u32, func: Option<u8>, code: u8) {
        tracing::info!(peer = %self.peer, itt, response = code, "task management response to {}: {}",
            func.map_or("a TMF", tmf_fn::name), tmf_rsp::name(code));
        let sns = self.take_sns();
        let b = pdu::tmf_response(itt, code, sns);
        self.dm.send_control(&b, &[]);
    }

    pub(super) fn tmf_done(&mut self, tag: TaskTag, rsp: TmfResponse) {
        if self.phase != Phase::FullFeature {
            return;
        }
        let itt = tag.0 as u32;
        let (func, scope) = self.tmfs.remove(&itt).unzip();
        self.seq.release_tmf(itt, self.member);
        if rsp == TmfResponse::Complete
            && let Some(scope) = scope.flatten()
        {
            // The core answers a TMF once the tasks it aborted are gone,
            // and says nothing more about them: their ITTs and window slots
            // are free from here, on every connection of the session. RFC
            // 7143 §11.2.1.8 keeps an ITT unique among the tasks still
            // outstanding, which an aborted task is not once the TMF is
            // answered; Linux reuses the ITT at once.
            self.forget_aborted(scope);
            self.seq.share_finished(self.member, scope);
        }
        let code = match rsp {
            TmfResponse::Complete => tmf_rsp::COMPLETE,
            TmfResponse::Succeeded => tmf_rsp::SUCCEEDED,
            TmfResponse::TaskNotFound => tmf_rsp::TASK_DOES_NOT_EXIST,
            TmfResponse::IncorrectLun => tmf_rsp::LUN_DOES_NOT_EXIST,
            TmfResponse::Rejected | TmfResponse::Failed => tmf_rsp::REJECTED,
        };
        self.send_tmf_rsp(itt, func, code);
        if func == Some(tmf_fn::TARGET_COLD_RESET) {
            // RFC 7143 §11.5.1: after a cold reset the target drops all
            // connections once the response is sent.
            self.close(CloseReason::TargetReset);
        }
    }

    /// RFC 7143 §11.9.1 AsyncEvent 3: the target drops every connection of
    /// the session (shutdown, target disabled); the initiator may come back
    /// after `time2wait` seconds. Only in the full feature phase of a normal
    /// session.
    pub fn announce_drop_all(&mut self, time2wait: u16, time2retain: u16) {
        if self.phase != Phase::FullFeature || self.params.session_type != SessionType::Normal {
            return;
        }
        let sns = self.take_sns();
        let b = pdu::async_message([0; 8], 3, [0, time2wait, time2retain], sns);
        self.dm.send_control(&b, &[]);
    }

    pub(super) fn aen(&mut self, lun: Lun, sense: Sense) {
        if self.phase != Phase::FullFeature || self.params.session_type != SessionType::Normal {
            return;
        }
        // RFC 7143 §11.9.1 AsyncEvent 0: a SCSI asynchronous event, sense
        // data in the data segment.
        let data = pdu::sense_segment(&sense.to_fixed());
        let sns = self.take_sns();
        let b = pdu::async_message(lun.encode(), 0, [0, 0, 0], sns);
        self.dm.send_control(&b, &data);
    }
}
