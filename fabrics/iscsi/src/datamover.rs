//! The datamover: what carries a connection's PDUs and task data, under the
//! session layer ([`Conn`](crate::conn::Conn)).
//!
//! The split follows the iSCSI Datamover Architecture (RFC 5047) that iSER
//! (RFC 7145) implements: the session layer decides what is sent (login
//! and text responses, CmdSN window, TMF, logout, NOP, async messages,
//! command status, which read data and which write data a task moves) and
//! the datamover how it crosses the wire:
//!
//! | primitive (RFC 7145) | [`Datamover`]                  | iSCSI/TCP ([`TcpDatamover`])            | iSER                        |
//! |-------------------------|--------------------------------|-----------------------------------------|-----------------------------|
//! | Send_Control            | [`Datamover::send_control`]    | a PDU on the byte stream, with digests  | an RDMA Send with the iSER header |
//! | Put_Data                | [`Datamover::put_data`]        | Data-In PDUs (status in the last one)   | RDMA WRITEs, status in a Send |
//! | Get_Data                | [`Datamover::get_data`]        | an R2T; Data-Out PDUs answer it         | an RDMA READ                |
//! | Enable_Datamover        | [`Datamover::enable_datamover`]| digests from the next PDU (§13.1 of 7143)| iSER-assisted mode          |
//!
//! Received PDUs reach the session layer from the transport's own receive
//! path (for TCP, `Conn<TcpDatamover>::handle_input`, which frames PDUs
//! and checks digests): `Conn::pdu_received` for a whole PDU
//! (Control_Notify); `Conn::data_out_header` and `Conn::data_out_bytes`
//! for a Data-Out PDU, whose payload the session layer places; and
//! `Conn::unsolicited_data_received` and `Conn::solicited_data_received`
//! once write data is in (Data_Completion_Notify for what a
//! [`Datamover::get_data`] asked for).
//!
//! Nothing here does I/O: a datamover queues what its driver writes.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::Arc;

use ferrite_core::Residual;
use ferrite_reactor::buf::SgList;
use ferrite_reactor::ring::{PipeHold, SgHold, TxSeg};

use crate::conn::framing::Rx;
use crate::keys::{Digest, Params};
use crate::pdu::{
    self, BHS_LEN, BhsBuf, DIGEST_LEN, DataSn, R2tSn, Sns, crc32c, crc32c_append, digest_bytes,
    pad_len,
};

/// A task's read data as the session layer hands it to
/// [`Datamover::put_data`].
#[derive(Debug)]
pub enum ReadData {
    /// A buffer list: owned while one PDU sends it, shared by several.
    Sg(Option<SgList>, Option<Arc<SgList>>),
    /// Page-cache pages in a pipe, each PDU taking the next bytes; and how
    /// many it holds (only where [`Datamover::can_splice`]).
    Pipe(PipeHold, usize),
}

impl ReadData {
    /// Bytes held.
    pub fn len(&self) -> usize {
        match self {
            ReadData::Sg(Some(sg), _) => sg.len(),
            ReadData::Sg(None, Some(sg)) => sg.len(),
            ReadData::Sg(None, None) => 0,
            ReadData::Pipe(_, len) => *len,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Several PDUs will send this list: share it.
    fn share(&mut self) {
        if let ReadData::Sg(owned, shared) = self
            && let Some(sg) = owned.take()
        {
            *shared = Some(Arc::new(sg));
        }
    }
}

/// Put_Data: the first `len` bytes of a task's read data.
#[derive(Debug)]
pub struct PutData {
    pub itt: u32,
    pub data: ReadData,
    pub len: usize,
    /// The command's status and residual, when it may travel with the last
    /// of the data (RFC 7143 §11.7.4: GOOD without sense data, not Bidi);
    /// a datamover that sends it says so in [`PutDone::status_sent`].
    pub status: Option<(u8, Residual)>,
}

/// What [`Datamover::put_data`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PutDone {
    /// The DataSN after the last Data-In PDU sent (DataSN 0 when the data
    /// went without PDUs of its own): ExpDataSN counts them (RFC 7143
    /// §11.4.8).
    pub next_data_sn: DataSn,
    /// The status went with the data: StatSN advanced by one, and no SCSI
    /// Response follows.
    pub status_sent: bool,
}

/// Get_Data: one solicitation of write data, `[offset, offset + len)` of
/// task `itt` (RFC 7143 §11.8: an R2T with TTT `ttt` and R2TSN `r2t_sn`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Solicit {
    pub lun: [u8; 8],
    pub itt: u32,
    pub ttt: u32,
    pub r2t_sn: R2tSn,
    pub offset: u32,
    pub len: u32,
}

/// What a transport implements to carry iSCSI under the session layer. Each
/// call takes the sequence numbers the session layer computed; none reads a
/// clock or touches a socket.
pub trait Datamover: std::fmt::Debug {
    /// Enable_Datamover: login is over and `params` are the connection's
    /// operational parameters, in force from the next PDU on. On an RDMA
    /// connection they carry what iSER negotiated: `rdma_extensions`,
    /// `target_recv_data_segment_length` (the receive buffers' size for
    /// the initiator's Sends), `initiator_recv_data_segment_length` (the
    /// longest control PDU data segment sent) and
    /// `max_outstanding_unexpected_pdus` (unexpected-PDU credits, 0 for no
    /// limit); digests are None.
    fn enable_datamover(&mut self, params: &Params);

    /// Send_Control: one PDU, its header `bhs` (the data segment length is
    /// set from `data`) and data segment `data`.
    fn send_control(&mut self, bhs: &BhsBuf, data: &[u8]);

    /// Put_Data: sends read data to the initiator.
    fn put_data(&mut self, put: PutData, sns: Sns) -> PutDone;

    /// Get_Data: asks the initiator for write data. The data arrives
    /// through the transport's receive path, which hands it to the session
    /// layer's write bookkeeping.
    fn get_data(&mut self, solicit: Solicit, sns: Sns);

    /// Whether this datamover is RDMA (iSER, RFC 7145): fixed when the
    /// driver builds the connection, it decides the login's answer to
    /// RDMAExtensions and whether the iSER keys apply.
    fn is_rdma(&self) -> bool;

    /// The most unexpected PDUs (RFC 7145 MaxOutstandingUnexpectedPDUs)
    /// this datamover takes from the initiator at once, which the login
    /// declares: on RDMA, the receive buffers it keeps posted. 0 is no
    /// limit (TCP, whose byte stream has no receive buffers per PDU).
    fn max_unexpected_pdus(&self) -> u32 {
        0
    }

    /// Whether [`ReadData::Pipe`] may be given to [`Datamover::put_data`]
    /// (the bytes go from the pipe to the wire unread); if not, the
    /// session layer copies a pipe's bytes into a buffer first.
    fn can_splice(&self) -> bool;

    /// Everything queued was handed to the driver.
    fn is_flushed(&self) -> bool;

    /// Drops everything queued and not yet handed to the driver (the peer
    /// is gone, or another connection replaced this one).
    fn discard_tx(&mut self);
}

/// iSCSI over TCP (RFC 7143): PDUs framed on the byte stream with their
/// digests, read data as Data-In PDUs, write data solicited by R2Ts.
#[derive(Debug)]
pub struct TcpDatamover {
    peer: SocketAddr,
    out: VecDeque<TxSeg>,
    /// HeaderDigest=CRC32C negotiated (from the first PDU after login).
    pub(crate) header_digest: bool,
    /// DataDigest=CRC32C negotiated.
    pub(crate) data_digest: bool,
    /// MaxRecvDataSegmentLength the initiator declared: the longest data
    /// segment sent.
    max_xmit: usize,
    /// MaxBurstLength: the longest Data-In sequence.
    max_burst: usize,
    /// The PDU being read.
    pub(crate) rx: Rx,
}

impl TcpDatamover {
    pub fn new(peer: SocketAddr) -> TcpDatamover {
        TcpDatamover {
            peer,
            out: VecDeque::new(),
            header_digest: false,
            data_digest: false,
            max_xmit: 8192,
            max_burst: 8192,
            rx: Rx::Header,
        }
    }

    /// Moves what is queued onto `segs`.
    pub(crate) fn poll_transmit(&mut self, segs: &mut VecDeque<TxSeg>) {
        if segs.is_empty() {
            // Hand the whole queue over (its allocation too) instead of
            // moving each segment.
            std::mem::swap(segs, &mut self.out);
        } else {
            segs.extend(self.out.drain(..));
        }
    }

    fn send_sg(&mut self, bhs: &BhsBuf, sg: SgHold, offset: usize, len: usize) {
        tracing::trace!(peer = %self.peer, "tx {bhs:?} offset={offset}");
        let (hdr, n) = self.header_bytes(bhs, len as u32);
        self.out.push_back(TxSeg::copy_of(&hdr[..n]));
        if len == 0 {
            return;
        }
        let pad = [0u8; 3];
        let pad = &pad[..pad_len(len)];
        let mut trailer = [0u8; 3 + DIGEST_LEN];
        let mut n = pad.len();
        if self.data_digest {
            let mut crc = 0;
            for s in sg.slices(offset, len) {
                crc = crc32c_append(crc, s);
            }
            crc = crc32c_append(crc, pad);
            trailer[n..n + DIGEST_LEN].copy_from_slice(&digest_bytes(crc));
            n += DIGEST_LEN;
        }
        self.out.push_back(TxSeg::Data { sg, offset, len });
        if n > 0 {
            self.out.push_back(TxSeg::copy_of(&trailer[..n]));
        }
    }

    /// A Data-In PDU whose `len` data bytes are the next ones of `pipe`
    /// (never with a data digest: see [`Datamover::can_splice`]).
    fn send_pipe(&mut self, bhs: &BhsBuf, pipe: PipeHold, len: usize) {
        tracing::trace!(peer = %self.peer, "tx {bhs:?} from a pipe");
        let (hdr, n) = self.header_bytes(bhs, len as u32);
        self.out.push_back(TxSeg::copy_of(&hdr[..n]));
        if len == 0 {
            return;
        }
        self.out.push_back(TxSeg::Pipe { pipe, len });
        let pad = [0u8; 3];
        if pad_len(len) > 0 {
            self.out.push_back(TxSeg::copy_of(&pad[..pad_len(len)]));
        }
    }

    /// The header segment of a PDU without AHS carrying `data_len` bytes,
    /// with its digest when negotiated, built on the stack.
    fn header_bytes(&self, bhs: &BhsBuf, data_len: u32) -> ([u8; BHS_LEN + DIGEST_LEN], usize) {
        let mut b = *bhs;
        b.set_data_len(data_len);
        b.set_ahs_len(0);
        let mut out = [0u8; BHS_LEN + DIGEST_LEN];
        out[..BHS_LEN].copy_from_slice(&b.0);
        if self.header_digest {
            let crc = crc32c(&out[..BHS_LEN]);
            out[BHS_LEN..].copy_from_slice(&digest_bytes(crc));
            (out, BHS_LEN + DIGEST_LEN)
        } else {
            (out, BHS_LEN)
        }
    }
}

impl Datamover for TcpDatamover {
    fn enable_datamover(&mut self, params: &Params) {
        // RFC 7143 §13.1: digests apply from the first PDU after login.
        self.header_digest = params.header_digest == Digest::Crc32c;
        self.data_digest = params.data_digest == Digest::Crc32c;
        self.max_xmit = params.max_xmit_data_segment_length.max(512) as usize;
        self.max_burst = params.max_burst_length.max(512) as usize;
    }

    fn send_control(&mut self, bhs: &BhsBuf, data: &[u8]) {
        tracing::trace!(peer = %self.peer, "tx {bhs:?} status={:#x}", bhs.0[3]);
        if data.is_empty() {
            let (hdr, n) = self.header_bytes(bhs, 0);
            self.out.push_back(TxSeg::copy_of(&hdr[..n]));
            return;
        }
        let mut out = Vec::with_capacity(BHS_LEN + data.len() + 12);
        pdu::encode_header(bhs, &[], data.len() as u32, self.header_digest, &mut out);
        let start = out.len();
        out.extend_from_slice(data);
        out.resize(out.len() + pad_len(data.len()), 0);
        if self.data_digest {
            let crc = crc32c(&out[start..]);
            out.extend_from_slice(&digest_bytes(crc));
        }
        self.out.push_back(TxSeg::Bytes(out));
    }

    /// Data-In PDUs of at most MaxRecvDataSegmentLength bytes, F ending
    /// each MaxBurstLength sequence and the last (RFC 7143 §11.7); the
    /// status rides in the last one when given.
    fn put_data(&mut self, put: PutData, sns: Sns) -> PutDone {
        let PutData {
            itt,
            mut data,
            len: total,
            status,
        } = put;
        let (mrdsl, burst) = (self.max_xmit, self.max_burst);
        // One Data-In PDU owns the list; several share it.
        if total > mrdsl.min(burst) {
            data.share();
        }
        let mut data_sn = DataSn(0);
        let mut status_sent = false;
        let mut off = 0;
        let mut in_burst = 0;
        while off < total {
            let n = (total - off).min(mrdsl).min(burst - in_burst);
            let last = off + n == total;
            in_burst += n;
            let fin = last || in_burst == burst;
            if fin {
                in_burst = 0;
            }
            let st = if last { status } else { None };
            let b = pdu::data_in(itt, fin, st, data_sn, off as u32, n as u32, sns);
            match &mut data {
                ReadData::Sg(owned, shared) => {
                    let hold = match (owned.take(), &shared) {
                        (Some(sg), _) => SgHold::Owned(sg),
                        (None, Some(sg)) => SgHold::Shared(sg.clone()),
                        (None, None) => break,
                    };
                    self.send_sg(&b, hold, off, n);
                }
                ReadData::Pipe(pipe, _) => self.send_pipe(&b, pipe.clone(), n),
            }
            status_sent = st.is_some();
            data_sn = data_sn.next();
            off += n;
        }
        PutDone {
            next_data_sn: data_sn,
            status_sent,
        }
    }

    fn get_data(&mut self, s: Solicit, sns: Sns) {
        let b = pdu::r2t(s.lun, s.itt, s.ttt, s.r2t_sn, s.offset, s.len, sns);
        self.send_control(&b, &[]);
    }

    fn is_rdma(&self) -> bool {
        false
    }

    /// A data digest needs the bytes, so a pipe's pages go unread only
    /// without one.
    fn can_splice(&self) -> bool {
        !self.data_digest
    }

    fn is_flushed(&self) -> bool {
        self.out.is_empty()
    }

    fn discard_tx(&mut self) {
        self.out.clear();
    }
}
