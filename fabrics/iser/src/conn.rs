//! One iSER connection, sans-IO: the iSCSI session layer
//! (`ferrite_iscsi::Conn`) over the [`IserDatamover`], and iSER's receive
//! path under it.
//!
//! The driver hands in each received Send ([`IserConn::recv`]) and each
//! completed RDMA READ ([`IserConn::read_done`]) or failed RDMA WRITE or
//! Send ([`IserConn::transfer_failed`]), carries out what
//! [`IserConn::poll_transmit`] returns, and runs the session layer through
//! [`IserConn::conn_mut`] as iSCSI/TCP's driver does (events, core actions,
//! timers).
//!
//! Receive rules (RFC 7145), each broken one a protocol error that ends
//! this connection alone with a log line:
//!
//! - a Send is an iSER header with the iSCSI control opcode and a whole
//!   PDU, no longer than the receive size advertised (8192 bytes of data
//!   segment during login, TargetRecvDataSegmentLength after);
//! - the initiator has at most MaxOutstandingUnexpectedPDUs unexpected PDUs
//!   (commands, task management, text, logout, NOP-Out pings) outstanding,
//!   and never more than the receive buffers posted;
//! - Data-Out PDUs carry unsolicited data only: solicited data moves by RDMA
//!   READ;
//! - a transfer the target needs has the STag for it in the command's iSER
//!   header, and every RDMA READ and WRITE completes.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use ferrite_iscsi::conn::DataOutPlace;
use ferrite_iscsi::pdu::{BHS_LEN, Bhs, Opcode, RESERVED_TAG};
use ferrite_iscsi::{Conn, IscsiConfig};

use crate::cm::CmRequest;
use crate::datamover::{IserDatamover, Transmit};
use crate::header::{HeaderError, split_send};

/// Why a connection ended on the transport's account.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RecvError {
    #[error("bad Send: {0}")]
    Header(#[from] HeaderError),
    #[error("Send of {len} bytes holds a PDU of {need} bytes")]
    Truncated { len: usize, need: usize },
    #[error("more than {limit} unexpected PDUs outstanding")]
    TooManyUnexpected { limit: usize },
    #[error("solicited Data-Out PDU (TTT {0:#x}): iSER solicits data by RDMA READ")]
    SolicitedDataOut(u32),
}

/// Unexpected PDUs a target session takes beyond its command window:
/// task management, NOP-Out pings, text and logout, which may be
/// immediate (outside the CmdSN window).
pub const IMMEDIATE_RESERVE: u32 = 8;

/// The receive buffers a connection under `cfg` posts: one per command
/// the CmdSN window admits (`queue_depth`, which bounds the initiator's
/// outstanding commands whether or not it declares
/// MaxOutstandingUnexpectedPDUs) and [`IMMEDIATE_RESERVE`] more. Fewer
/// would make an initiator within its window exceed the unexpected-PDU
/// limit, which ends the connection.
pub fn recv_count_for(cfg: &IscsiConfig) -> u32 {
    cfg.queue_depth.max(1).saturating_add(IMMEDIATE_RESERVE)
}

/// The session layer of one iSER connection over its datamover.
#[derive(Debug)]
pub struct IserConn {
    conn: Conn<IserDatamover>,
}

impl IserConn {
    /// A connection whose RDMA CM request was `cm`, on a queue pair with
    /// `recv_count` receive buffers posted; `seed` seeds everything random
    /// on it. `local` and `peer` name the ends (RDMA CM's IP addresses).
    /// `recv_count` is normally [`recv_count_for`] the configuration.
    pub fn new(
        now: Instant,
        cfg: Arc<IscsiConfig>,
        local: SocketAddr,
        peer: SocketAddr,
        seed: u64,
        cm: &CmRequest,
        recv_count: u32,
    ) -> IserConn {
        let dm = IserDatamover::new(cm.send_invalidate, recv_count);
        IserConn {
            conn: Conn::with_datamover(now, cfg, local, peer, seed, dm),
        }
    }

    /// The session layer.
    pub fn conn(&self) -> &Conn<IserDatamover> {
        &self.conn
    }

    /// The session layer, for events, core actions and timers.
    pub fn conn_mut(&mut self) -> &mut Conn<IserDatamover> {
        &mut self.conn
    }

    fn closing(&self) -> bool {
        self.conn.close_reason().is_some()
    }

    fn fail(&mut self, why: &dyn std::fmt::Display) {
        tracing::warn!(peer = %self.conn.peer_addr(), "iSER: {why}; closing the connection");
        self.conn.transport_error();
    }

    /// One received Send (its bytes as the receive completion gave them).
    pub fn recv(&mut self, now: Instant, msg: &[u8]) {
        if self.closing() {
            return;
        }
        if let Err(e) = self.recv_pdu(now, msg) {
            self.fail(&e);
        }
    }

    fn recv_pdu(&mut self, now: Instant, msg: &[u8]) -> Result<(), RecvError> {
        self.conn.input_seen(now);
        let limit = self.conn.datamover().recv_limit();
        let (h, pdu) = split_send(msg, limit)?;
        let mut hdr = [0u8; BHS_LEN];
        hdr.copy_from_slice(&pdu[..BHS_LEN]);
        let bhs = Bhs(&hdr);
        let ahs_len = usize::from(bhs.total_ahs_len()) * 4;
        let dlen = bhs.data_segment_len();
        // No digests; padding after the data segment is allowed.
        let need = BHS_LEN + ahs_len + dlen as usize;
        if pdu.len() < need {
            return Err(RecvError::Truncated {
                len: msg.len(),
                need: need + msg.len() - pdu.len(),
            });
        }
        let ahs = &pdu[BHS_LEN..BHS_LEN + ahs_len];
        let data = &pdu[BHS_LEN + ahs_len..need];
        let op = bhs.opcode();
        let itt = bhs.itt();
        tracing::trace!(peer = %self.conn.peer_addr(), "iser rx {bhs:?}");
        if !self.conn.is_full_feature() {
            self.conn.pdu_received(&hdr, ahs, data.to_vec(), true);
            return Ok(());
        }
        if op == Opcode::DATA_OUT {
            let ttt = bhs.ttt();
            if ttt != RESERVED_TAG {
                return Err(RecvError::SolicitedDataOut(ttt));
            }
            let mut place = self.conn.data_out_header(&hdr, dlen);
            self.conn.data_out_bytes(&mut place, data);
            if let DataOutPlace::Unsolicited { itt } = place {
                self.conn
                    .unsolicited_data_received(itt, bhs.buffer_offset(), dlen, true);
            }
            return Ok(());
        }
        let unexpected = match op {
            Opcode::SCSI_CMD | Opcode::TMF_REQ | Opcode::TEXT_REQ | Opcode::LOGOUT_REQ => true,
            // A NOP-Out answering the target's ping has the reserved ITT.
            Opcode::NOP_OUT => itt != RESERVED_TAG,
            _ => false,
        };
        if unexpected {
            let scsi = op == Opcode::SCSI_CMD;
            if !self.conn.datamover_mut().note_unexpected(itt, scsi) {
                // Commands ended by task management got no response: they
                // are not outstanding any more.
                self.forget_ended();
                if !self.conn.datamover_mut().note_unexpected(itt, scsi) {
                    let limit = self.conn.datamover().unexpected_limit();
                    return Err(RecvError::TooManyUnexpected { limit });
                }
            }
            // A command reusing the ITT of a live task is refused by the
            // session layer; it must not replace that task's STags.
            if scsi && self.conn.session_seq().task_owner(itt).is_none() {
                let dm = self.conn.datamover_mut();
                dm.note_command(itt, h);
                // STags of commands ended without a response are dropped
                // before they pile up.
                if dm.stags_kept() > 2 * dm.unexpected_limit() + 16 {
                    self.forget_ended();
                }
            }
        }
        self.conn.pdu_received(&hdr, ahs, data.to_vec(), true);
        Ok(())
    }

    fn forget_ended(&mut self) {
        let seq = self.conn.session_seq().clone();
        self.conn
            .datamover_mut()
            .forget_ended(|itt| seq.task_owner(itt).is_some());
    }

    /// An RDMA READ that [`Transmit::Read`] asked for completed: `data`
    /// holds the bytes read, `None` if it failed (a protocol error: the
    /// initiator's STag or buffer was not what its header said).
    pub fn read_done(&mut self, itt: u32, ttt: u32, offset: u32, data: Option<&[u8]>) {
        if self.closing() {
            return;
        }
        let Some(data) = data else {
            self.fail(&format_args!(
                "RDMA READ of solicited data for ITT {itt:#x} failed"
            ));
            return;
        };
        let mut place = DataOutPlace::Solicited {
            itt,
            ttt,
            pos: offset,
        };
        self.conn.data_out_bytes(&mut place, data);
        self.conn
            .solicited_data_received(itt, ttt, data.len() as u32, true);
    }

    /// An RDMA WRITE or Send of this connection failed (`what` says which);
    /// the connection ends.
    pub fn transfer_failed(&mut self, what: &str) {
        if self.closing() {
            return;
        }
        self.fail(&format_args!("{what} failed"));
    }

    /// The next RDMA operation to post. A transfer the initiator gave no
    /// STag for ends the connection instead.
    pub fn poll_transmit(&mut self) -> Option<Transmit> {
        if let Some(e) = self.conn.datamover_mut().take_error() {
            self.fail(&e);
        }
        self.conn.datamover_mut().poll_transmit()
    }
}
