//! iSCSI/TCP's receive path: PDUs framed out of the byte stream, header
//! and data digests checked (RFC 7143 §7.8), data segments over
//! MaxRecvDataSegmentLength skipped (§13.12). Whole PDUs go to the
//! session layer ([`Conn::pdu_received`]); a Data-Out payload streams into
//! the place the session layer picks from its header
//! ([`Conn::data_out_header`], [`Conn::data_out_bytes`]), and its end is
//! reported with [`Conn::unsolicited_data_received`] or
//! [`Conn::solicited_data_received`].

use std::time::Instant;

use crate::datamover::TcpDatamover;
use crate::pdu::{
    BHS_LEN, Bhs, DIGEST_LEN, LoginStatus, Opcode, RejectReason, crc32c, crc32c_append,
    digest_from, pad_len,
};

use super::{CloseReason, Conn, DataOutPlace, Phase, TxQueue};

/// Where the bytes of the data segment being read go.
#[derive(Debug)]
pub(crate) enum Sink {
    /// A PDU other than Data-Out.
    Buffer(Vec<u8>),
    /// A Data-Out payload, placed by the session layer.
    DataOut(DataOutPlace),
    /// Skipped.
    Discard,
}

#[derive(Debug)]
pub(crate) struct Segment {
    hdr: [u8; BHS_LEN],
    ahs: Vec<u8>,
    len: usize,
    pad: usize,
    digest: bool,
    done: usize,
    crc: u32,
    dig: [u8; 4],
    dig_have: usize,
    sink: Sink,
}

#[derive(Debug)]
pub(crate) enum Rx {
    Header,
    Segment(Segment),
}

impl Conn<TcpDatamover> {
    /// Feeds received bytes; returns how many were consumed. The driver keeps
    /// the rest and presents them again with more appended.
    pub fn handle_input(&mut self, now: Instant, data: &[u8]) -> usize {
        let mut used = 0;
        loop {
            if self.phase == Phase::Closing {
                // Nothing more is read from a closing connection.
                return data.len();
            }
            let rest = &data[used..];
            if rest.is_empty() {
                break;
            }
            match std::mem::replace(&mut self.dm.rx, Rx::Header) {
                Rx::Header => {
                    let Some(bhs) = Bhs::from_slice(rest) else {
                        break;
                    };
                    let ahs_len = bhs.total_ahs_len() as usize * 4;
                    let hd = if self.dm.header_digest { DIGEST_LEN } else { 0 };
                    let need = BHS_LEN + ahs_len + hd;
                    if rest.len() < need {
                        break;
                    }
                    if self.dm.header_digest {
                        let crc = crc32c(&rest[..BHS_LEN + ahs_len]);
                        let at = BHS_LEN + ahs_len;
                        let got = digest_from([rest[at], rest[at + 1], rest[at + 2], rest[at + 3]]);
                        if crc != got {
                            // RFC 7143 §7.8: at ERL 0 a header digest error
                            // ends the connection (the PDU length is unknown).
                            tracing::warn!(peer = %self.peer, "header digest error, dropping the connection");
                            self.close(CloseReason::HeaderDigest);
                            return data.len();
                        }
                    }
                    self.last_rx = now;
                    let mut hdr = [0u8; BHS_LEN];
                    hdr.copy_from_slice(&rest[..BHS_LEN]);
                    let ahs = rest[BHS_LEN..BHS_LEN + ahs_len].to_vec();
                    used += need;
                    self.start_pdu(hdr, ahs);
                }
                Rx::Segment(mut seg) => {
                    let n = self.feed_segment(&mut seg, rest);
                    used += n;
                    self.last_rx = now;
                    if seg.done == seg.len + seg.pad && (!seg.digest || seg.dig_have == DIGEST_LEN)
                    {
                        let ok = !seg.digest || digest_from(seg.dig) == seg.crc;
                        self.finish_pdu(seg, ok);
                    } else {
                        self.dm.rx = Rx::Segment(seg);
                    }
                }
            }
        }
        used
    }

    /// Appends PDUs to send.
    pub fn poll_transmit(&mut self, tx: &mut TxQueue) {
        self.dm.poll_transmit(&mut tx.segs);
    }

    fn start_pdu(&mut self, hdr: [u8; BHS_LEN], ahs: Vec<u8>) {
        let bhs = Bhs(&hdr);
        if !self.read_holds.is_empty() {
            self.ack_reads(bhs.exp_stat_sn());
        }
        tracing::trace!(peer = %self.peer, "rx {bhs:?} sn={:#x}", bhs.cmd_sn().0);
        let len = bhs.data_segment_len() as usize;
        let op = bhs.opcode();
        // RFC 7143 §13.12: during login the limit is the 8192 default.
        let limit = match self.phase {
            Phase::Login => 8192,
            _ => self.params.max_recv_data_segment_length,
        } as usize;
        let mut sink = Sink::Buffer(Vec::new());
        if len > limit {
            tracing::warn!(peer = %self.peer, len, limit, "data segment exceeds MaxRecvDataSegmentLength");
            if self.phase == Phase::Login {
                let itt = bhs.itt();
                self.login_fail(LoginStatus::INITIATOR_ERROR, itt);
                return;
            }
            // RFC 7143 §13.12: a PDU over the declared limit is a protocol
            // error; the segment is skipped without being stored.
            self.send_reject(RejectReason::ProtocolError, &hdr);
            if op == Opcode::DATA_OUT {
                // The burst can no longer complete: the write fails.
                self.fail_task_data(bhs.itt());
            }
            sink = Sink::Discard;
        } else if self.phase == Phase::FullFeature && op == Opcode::DATA_OUT {
            sink = Sink::DataOut(self.data_out_header(&hdr, len as u32));
        } else {
            sink = match sink {
                Sink::Buffer(_) => Sink::Buffer(Vec::with_capacity(len)),
                s => s,
            };
        }
        let digest = self.dm.data_digest && len > 0;
        let seg = Segment {
            hdr,
            ahs,
            len,
            pad: pad_len(len),
            digest,
            done: 0,
            crc: 0,
            dig: [0; 4],
            dig_have: 0,
            sink,
        };
        if len == 0 {
            self.finish_pdu(seg, true);
        } else {
            self.dm.rx = Rx::Segment(seg);
        }
    }

    /// Consumes segment bytes; returns how many.
    fn feed_segment(&mut self, seg: &mut Segment, input: &[u8]) -> usize {
        let mut used = 0;
        // Data bytes.
        if seg.done < seg.len {
            let n = (seg.len - seg.done).min(input.len());
            let chunk = &input[..n];
            if seg.digest {
                seg.crc = crc32c_append(seg.crc, chunk);
            }
            match &mut seg.sink {
                Sink::Buffer(v) => v.extend_from_slice(chunk),
                Sink::Discard => {}
                Sink::DataOut(place) => self.data_out_bytes(place, chunk),
            }
            seg.done += n;
            used += n;
        }
        // Padding (covered by the data digest).
        if seg.done >= seg.len && seg.done < seg.len + seg.pad {
            let n = (seg.len + seg.pad - seg.done).min(input.len() - used);
            if seg.digest {
                seg.crc = crc32c_append(seg.crc, &input[used..used + n]);
            }
            seg.done += n;
            used += n;
        }
        if seg.done == seg.len + seg.pad && seg.digest {
            let n = (DIGEST_LEN - seg.dig_have).min(input.len() - used);
            seg.dig[seg.dig_have..seg.dig_have + n].copy_from_slice(&input[used..used + n]);
            seg.dig_have += n;
            used += n;
        }
        used
    }

    fn finish_pdu(&mut self, seg: Segment, digest_ok: bool) {
        let hdr = seg.hdr;
        let sink = match seg.sink {
            Sink::Buffer(data) => return self.pdu_received(&hdr, &seg.ahs, data, digest_ok),
            _ if self.phase != Phase::FullFeature => return,
            sink => sink,
        };
        if !digest_ok {
            tracing::warn!(peer = %self.peer, "data digest error on {:?}", Bhs(&hdr));
            // RFC 7143 §7.8: Reject with reason Data Digest Error.
            self.send_reject(RejectReason::DataDigestError, &hdr);
        }
        let b = Bhs(&hdr);
        match sink {
            Sink::Buffer(_) | Sink::Discard | Sink::DataOut(DataOutPlace::Discard) => {}
            Sink::DataOut(DataOutPlace::Unsolicited { itt }) => self.unsolicited_data_received(
                itt,
                b.buffer_offset(),
                b.data_segment_len(),
                digest_ok,
            ),
            Sink::DataOut(DataOutPlace::Solicited { itt, ttt, .. }) => {
                self.solicited_data_received(itt, ttt, b.data_segment_len(), digest_ok)
            }
        }
    }
}
