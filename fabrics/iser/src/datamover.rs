//! The iSER datamover (RFC 7145): what the iSCSI session layer
//! (`ferrite_iscsi::Conn`) asks of its transport, turned into the RDMA
//! operations of one connection, sans-IO.
//!
//! - Send_Control: an RDMA Send of the iSER header and the PDU (BHS and
//!   data segment, no digests). The SCSI Response of a command whose
//!   initiator advertised an STag is a Send with Invalidate of it when the
//!   RDMA CM request allowed (the I flag clear).
//! - Put_Data: an RDMA WRITE of the read data to the Read STag and base
//!   offset of the command's iSER header; the status follows in a SCSI
//!   Response (RFC 7145: no Data-In PDU goes on the wire).
//! - Get_Data: an RDMA READ of the solicited range from the Write STag and
//!   base offset (RFC 7145: no R2T PDU goes on the wire); its completion
//!   is the Data_Completion_Notify the driver hands back
//!   ([`crate::conn::IserConn::read_done`]).
//!
//! The addresses of RDMA operations are the header's base offset plus the
//! offset in the command's data. With zero-based addressing the base is an
//! offset into the initiator's region rather than a virtual address; the
//! sum is the same, and this target declines zero-based addressing anyway
//! ([`crate::cm::CmReply::to`]).
//!
//! Nothing here does I/O: the datamover queues [`Transmit`]s, which the
//! queue-pair driver ([`crate::qp`]) posts.

use std::collections::VecDeque;
use std::sync::Arc;

use ferrite_iscsi::datamover::{Datamover, PutData, PutDone, ReadData, Solicit};
use ferrite_iscsi::keys::Params;
use ferrite_iscsi::pdu::{BHS_LEN, Bhs, BhsBuf, DataSn, Opcode, RESERVED_TAG, Sns};
use ferrite_rdma::RemoteSeg;
use ferrite_reactor::buf::{IoBuf, SgList};
use rustc_hash::FxHashMap;

use crate::header::{HEADER_LEN, Header, Remote, recv_size};

/// The data segment a Send may carry before the full feature phase: the
/// iSCSI default MaxRecvDataSegmentLength (RFC 7145: iSER's
/// receive lengths apply once login is over).
pub const LOGIN_DATA_LEN: usize = 8192;

/// One RDMA operation the driver posts on the connection's queue pair, in
/// order (RC queue pairs keep it: the RDMA WRITEs of a read land before
/// the Send with its status).
#[derive(Debug)]
pub enum Transmit {
    /// An RDMA Send of `msg` (iSER header and PDU); with `invalidate`, a
    /// Send with Invalidate of that STag of the initiator.
    Send {
        msg: Vec<u8>,
        invalidate: Option<u32>,
    },
    /// An RDMA WRITE of the first `remote.len` bytes of `data` to the
    /// initiator's buffer (the read data of task `itt`).
    Write {
        itt: u32,
        data: SgList,
        remote: RemoteSeg,
    },
    /// An RDMA READ of `remote.len` bytes of the initiator's buffer: the
    /// write data of task `itt` at data offset `offset`, answering the
    /// solicitation with TTT `ttt`.
    Read {
        itt: u32,
        ttt: u32,
        offset: u32,
        remote: RemoteSeg,
    },
}

/// Why the datamover cannot carry out what the session layer asked: the
/// initiator did not give what the transfer needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum MoveError {
    #[error("read data for ITT {0:#x}, whose command advertised no Read STag")]
    NoWriteStag(u32),
    #[error("solicited data for ITT {0:#x}, whose command advertised no Write STag")]
    NoReadStag(u32),
    #[error("read data for ITT {0:#x} came as a pipe, which iSER cannot send")]
    Pipe(u32),
}

/// The iSER datamover of one connection.
#[derive(Debug)]
pub struct IserDatamover {
    /// The initiator takes Send with Invalidate (CM request I flag clear).
    send_invalidate: bool,
    /// Receive buffers the driver keeps posted.
    recv_count: u32,
    /// The longest Send the target takes now: the login size, then
    /// TargetRecvDataSegmentLength plus headers.
    recv_limit: usize,
    /// MaxOutstandingUnexpectedPDUs in force (never above `recv_count`).
    unexpected_limit: usize,
    out: VecDeque<Transmit>,
    /// The STags of each command the initiator advertised them for, until
    /// its SCSI Response goes.
    stags: FxHashMap<u32, Header>,
    /// The data offset of each write command's first solicited byte: the
    /// one its Write Base Offset addresses (the initiator's buffer past
    /// the data it sent unsolicited).
    solicited_from: FxHashMap<u32, u32>,
    /// The unexpected PDUs outstanding, by ITT (true: a SCSI command).
    unexpected: FxHashMap<u32, bool>,
    broken: Option<MoveError>,
}

impl IserDatamover {
    /// The datamover of a connection whose RDMA CM request said
    /// `send_invalidate` (I flag clear) and whose driver keeps
    /// `recv_count` receive buffers posted.
    pub fn new(send_invalidate: bool, recv_count: u32) -> IserDatamover {
        // MaxOutstandingUnexpectedPDUs is 0 or at least 2 (RFC 7145).
        let recv_count = recv_count.max(2);
        IserDatamover {
            send_invalidate,
            recv_count,
            recv_limit: recv_size(LOGIN_DATA_LEN),
            unexpected_limit: recv_count as usize,
            out: VecDeque::new(),
            stags: FxHashMap::default(),
            solicited_from: FxHashMap::default(),
            unexpected: FxHashMap::default(),
            broken: None,
        }
    }

    /// The next operation to post.
    pub fn poll_transmit(&mut self) -> Option<Transmit> {
        self.out.pop_front()
    }

    /// What the datamover could not carry out, once.
    pub fn take_error(&mut self) -> Option<MoveError> {
        self.broken.take()
    }

    /// The longest Send accepted now (iSER header included).
    pub fn recv_limit(&self) -> usize {
        self.recv_limit
    }

    /// The unexpected PDUs the initiator may have outstanding.
    pub fn unexpected_limit(&self) -> usize {
        self.unexpected_limit
    }

    /// Unexpected PDUs outstanding.
    pub fn unexpected_outstanding(&self) -> usize {
        self.unexpected.len()
    }

    /// Whether Send with Invalidate is used.
    pub fn sends_with_invalidate(&self) -> bool {
        self.send_invalidate
    }

    /// A SCSI command arrived with iSER header `h`: its STags.
    pub fn note_command(&mut self, itt: u32, h: Header) {
        self.solicited_from.remove(&itt);
        if h.write.is_some() || h.read.is_some() {
            self.stags.insert(itt, h);
        } else {
            self.stags.remove(&itt);
        }
    }

    /// An unexpected PDU with `itt` arrived (a PDU not sent
    /// in answer to the target, outstanding until the target answers it:
    /// RFC 7145 MaxOutstandingUnexpectedPDUs); false when that is one more
    /// than allowed.
    pub fn note_unexpected(&mut self, itt: u32, scsi: bool) -> bool {
        if self.unexpected.len() >= self.unexpected_limit && !self.unexpected.contains_key(&itt) {
            return false;
        }
        self.unexpected.insert(itt, scsi);
        true
    }

    /// Forgets the commands `known` says the session layer no longer has
    /// (ended by task management without a SCSI Response): they are no
    /// longer outstanding, and their STags are never used.
    pub fn forget_ended(&mut self, known: impl Fn(u32) -> bool) {
        self.unexpected.retain(|itt, scsi| !*scsi || known(*itt));
        self.stags.retain(|itt, _| known(*itt));
        let stags = &self.stags;
        self.solicited_from.retain(|itt, _| stags.contains_key(itt));
    }

    /// Commands whose STags are kept (bounded by the driver's pruning).
    pub fn stags_kept(&self) -> usize {
        self.stags.len()
    }

    /// The response `bhs` answers an unexpected PDU: it is no longer
    /// outstanding.
    fn answered(&mut self, bhs: Bhs<'_>, data: &[u8]) {
        let itt = match bhs.opcode() {
            Opcode::SCSI_RSP | Opcode::TMF_RSP | Opcode::TEXT_RSP | Opcode::LOGOUT_RSP => bhs.itt(),
            Opcode::NOP_IN if bhs.itt() != RESERVED_TAG => bhs.itt(),
            // The rejected PDU's header is the Reject's data segment.
            Opcode::REJECT => match Bhs::from_slice(data) {
                Some(h) => h.itt(),
                None => return,
            },
            _ => return,
        };
        self.unexpected.remove(&itt);
    }

    fn remote(r: Remote, offset: u64, len: u32) -> RemoteSeg {
        RemoteSeg {
            addr: r.base.wrapping_add(offset),
            rkey: r.stag,
            len,
        }
    }
}

impl Datamover for IserDatamover {
    fn enable_datamover(&mut self, params: &Params) {
        // RFC 7145: with RDMAExtensions=Yes the initiator's Sends
        // carry at most TargetRecvDataSegmentLength bytes of data segment
        // (the login settles it into MaxRecvDataSegmentLength).
        self.recv_limit = recv_size(params.max_recv_data_segment_length as usize);
        let n = params.max_outstanding_unexpected_pdus;
        self.unexpected_limit = if n == 0 {
            self.recv_count
        } else {
            n.min(self.recv_count)
        } as usize;
    }

    fn send_control(&mut self, bhs: &BhsBuf, data: &[u8]) {
        let mut b = *bhs;
        b.set_data_len(data.len() as u32);
        b.set_ahs_len(0);
        let view = Bhs(&b.0);
        self.answered(view, data);
        let mut invalidate = None;
        if view.opcode() == Opcode::SCSI_RSP {
            self.solicited_from.remove(&view.itt());
        }
        if view.opcode() == Opcode::SCSI_RSP
            && let Some(h) = self.stags.remove(&view.itt())
            && self.send_invalidate
        {
            // RFC 7145: the SCSI Response may invalidate the STag
            // the command advertised; with two (bidirectional) the Write
            // STag of the read data, the initiator invalidating the other itself.
            invalidate = h.read.or(h.write).map(|r| r.stag);
        }
        let mut msg = Vec::with_capacity(HEADER_LEN + BHS_LEN + data.len());
        msg.extend_from_slice(&Header::target());
        msg.extend_from_slice(&b.0);
        msg.extend_from_slice(data);
        tracing::trace!("iser tx {:?} inv={invalidate:?}", view);
        self.out.push_back(Transmit::Send { msg, invalidate });
    }

    fn put_data(&mut self, put: PutData, _sns: Sns) -> PutDone {
        let done = PutDone {
            next_data_sn: DataSn(0),
            status_sent: false,
        };
        let PutData { itt, data, len, .. } = put;
        if len == 0 {
            return done;
        }
        let Some(w) = self.stags.get(&itt).and_then(|h| h.read) else {
            self.broken = Some(MoveError::NoReadStag(itt));
            return done;
        };
        let sg = match data {
            ReadData::Sg(Some(sg), _) => sg,
            ReadData::Sg(None, Some(shared)) => Arc::try_unwrap(shared).unwrap_or_else(|s| {
                // Never the case (the session layer hands one owner), but
                // a shared list is copied rather than lost.
                let mut sg = SgList::new();
                sg.push(IoBuf::from_slice(&s.to_vec()));
                sg
            }),
            ReadData::Sg(None, None) => return done,
            ReadData::Pipe(..) => {
                self.broken = Some(MoveError::Pipe(itt));
                return done;
            }
        };
        let len = len.min(sg.len()) as u32;
        self.out.push_back(Transmit::Write {
            itt,
            data: sg,
            remote: Self::remote(w, 0, len),
        });
        done
    }

    fn get_data(&mut self, s: Solicit, _sns: Sns) {
        let Some(r) = self.stags.get(&s.itt).and_then(|h| h.write) else {
            self.broken = Some(MoveError::NoWriteStag(s.itt));
            return;
        };
        // RFC 7145 §9.2: the Write Base Offset addresses the first byte
        // the target solicits, past the immediate and unsolicited data the
        // initiator sent with the command (as the Linux initiator sets it
        // and LIO's isert reads it); later solicitations of the command
        // are at their distance from that one.
        let from = *self.solicited_from.entry(s.itt).or_insert(s.offset);
        self.out.push_back(Transmit::Read {
            itt: s.itt,
            ttt: s.ttt,
            offset: s.offset,
            remote: Self::remote(r, u64::from(s.offset.wrapping_sub(from)), s.len),
        });
    }

    fn is_rdma(&self) -> bool {
        true
    }

    fn max_unexpected_pdus(&self) -> u32 {
        self.recv_count
    }

    /// RDMA WRITE needs registered memory: pipes are read into a buffer
    /// first.
    fn can_splice(&self) -> bool {
        false
    }

    fn is_flushed(&self) -> bool {
        self.out.is_empty()
    }

    fn discard_tx(&mut self) {
        self.out.clear();
    }
}
