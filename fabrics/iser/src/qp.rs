//! The target-side driver of one iSER connection on a queue pair: posts
//! what its [`IserConn`] transmits and feeds the completions back.
//! Provider-neutral (only the `ferrite_rdma` traits) and thread-agnostic:
//! the reactor that owns the connection calls it from its poller.
//!
//! Buffers: the receive buffers (each of the largest Send the connection
//! may advertise) and the send buffers are one registered allocation
//! each ([`QpBuffers`]), registered once and kept for the next connection; read data is RDMA WRITTEN straight
//! from the core's buffers ([`ProtectionDomain::map_sg`], registered once
//! per pool buffer on the verbs provider); solicited write data is RDMA
//! READ into registered buffers kept for reuse and copied from there into
//! the buffer the core gave for it.

use std::collections::{HashMap, VecDeque};
use std::time::Instant;

use ferrite_rdma::{
    Access, ConnEvent, MemoryRegion, PostError, ProtectionDomain, QueuePair, RdmaError, RecvWr,
    RemoteSeg, SendOp, SendWr, SgeList, WcStatus, WorkCompletion,
};
use ferrite_reactor::buf::{IoBuf, SgList};

use crate::conn::IserConn;
use crate::datamover::{LOGIN_DATA_LEN, Transmit};
use crate::header::recv_size;

/// Marks receive work requests; the low bits are the buffer's slot.
const RECV_BIT: u64 = 1 << 63;

/// Read buffers kept registered for reuse.
const READ_BUFS_KEPT: usize = 8;

/// The smallest read buffer registered.
const READ_BUF_MIN: usize = 64 * 1024;

/// Driver errors (infrastructure, not protocol).
#[derive(Debug, thiserror::Error)]
pub enum DriverError {
    #[error("memory registration failed: {0}")]
    Reg(#[source] RdmaError),
    #[error("posting a work request failed: {0}")]
    Post(#[source] PostError),
}

/// Equal slots of one registered allocation.
struct Slots {
    mr: Box<dyn MemoryRegion>,
    count: usize,
    len: usize,
    stride: usize,
}

impl Slots {
    fn new(pd: &dyn ProtectionDomain, count: usize, len: usize) -> Result<Slots, DriverError> {
        let stride = len.max(1).next_multiple_of(64);
        let bytes = stride
            .checked_mul(count.max(1))
            .ok_or(DriverError::Reg(RdmaError::TooLarge))?;
        let mr = pd
            .reg_sg(SgList::from(IoBuf::new(bytes)), Access::LOCAL_WRITE)
            .map_err(DriverError::Reg)?;
        Ok(Slots {
            mr,
            count,
            len,
            stride,
        })
    }

    fn sges(&self, slot: usize, n: usize) -> SgeList {
        if slot >= self.count {
            return SgeList::new();
        }
        self.mr
            .sges((slot * self.stride) as u64, n.min(self.len) as u64)
            .unwrap_or_default()
    }

    fn read(&self, slot: usize, n: usize) -> Vec<u8> {
        let mut v = vec![0u8; n.min(self.len)];
        if slot < self.count {
            self.mr.read_at((slot * self.stride) as u64, &mut v);
        }
        v
    }

    fn write(&mut self, slot: usize, src: &[u8]) -> usize {
        if slot >= self.count || src.len() > self.len {
            return 0;
        }
        self.mr.write_at((slot * self.stride) as u64, src)
    }
}

/// The registered buffers of one connection: its receive buffers (posted
/// before it is accepted) and its send buffers. A connection that ends
/// gives them back ([`IserQp::into_buffers`]) so that the next one on the
/// same core and device takes them as they are: registering some tens of
/// MiB is most of an RDMA connection's setup time otherwise.
pub struct QpBuffers {
    recv: Slots,
    send: Slots,
}

impl std::fmt::Debug for QpBuffers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "QpBuffers(recv {} x {}, send {} x {})",
            self.recv.count, self.recv.len, self.send.count, self.send.len
        )
    }
}

impl QpBuffers {
    /// `count` receive buffers for Sends of up to `data_len` bytes of data
    /// segment (at least the login's 8192) with their headers, and a send
    /// buffer for a response to each of them and a few more.
    pub fn new(
        pd: &dyn ProtectionDomain,
        count: u32,
        data_len: u32,
    ) -> Result<QpBuffers, DriverError> {
        let count = count.max(1) as usize;
        Ok(QpBuffers {
            recv: Slots::new(pd, count, Self::recv_len(data_len))?,
            // A response to every unexpected PDU, NOP-In pings and async
            // messages besides.
            send: Slots::new(pd, count + 4, recv_size(LOGIN_DATA_LEN))?,
        })
    }

    fn recv_len(data_len: u32) -> usize {
        recv_size((data_len as usize).max(LOGIN_DATA_LEN))
    }

    /// Whether these are the buffers [`QpBuffers::new`] would make for
    /// `count` and `data_len`.
    pub fn fits(&self, count: u32, data_len: u32) -> bool {
        self.recv.count == count.max(1) as usize && self.recv.len == Self::recv_len(data_len)
    }

    /// Receive buffers.
    pub fn count(&self) -> u32 {
        self.recv.count as u32
    }

    fn post(&self, qp: &dyn QueuePair, slot: usize) -> Result<(), DriverError> {
        qp.post_recv(&RecvWr {
            wr_id: RECV_BIT | slot as u64,
            sges: self.recv.sges(slot, self.recv.len),
        })
        .map_err(DriverError::Post)
    }

    /// Posts every receive buffer (before accepting the connection).
    pub fn post_all(&self, qp: &dyn QueuePair) -> Result<(), DriverError> {
        (0..self.recv.count).try_for_each(|s| self.post(qp, s))
    }
}

enum Pending {
    Send {
        slot: Option<usize>,
        /// A message too long for a send buffer, registered for itself.
        _own: Option<Box<dyn MemoryRegion>>,
    },
    Write {
        itt: u32,
        /// The read data, back to its pool once written.
        _mr: Box<dyn MemoryRegion>,
        left: usize,
        ok: bool,
    },
    Read {
        itt: u32,
        ttt: u32,
        offset: u32,
        len: usize,
        mr: Box<dyn MemoryRegion>,
        left: usize,
        ok: bool,
    },
}

/// One iSER connection on one queue pair.
pub struct IserQp {
    conn: IserConn,
    qp: Box<dyn QueuePair>,
    pd: Box<dyn ProtectionDomain>,
    bufs: QpBuffers,
    free_send: Vec<usize>,
    max_sge: usize,
    next_wr: u64,
    pending: HashMap<u64, Pending>,
    /// Work requests built and not yet posted (the send queue was full),
    /// in order: posted before anything after them.
    backlog: VecDeque<SendWr>,
    /// A transmit waiting for a send buffer.
    waiting: Option<Transmit>,
    read_bufs: Vec<Box<dyn MemoryRegion>>,
    disconnected: bool,
}

impl std::fmt::Debug for IserQp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "IserQp(qp {:#x})", self.qp.qp_num())
    }
}

impl IserQp {
    /// Wraps an accepted connection. The receive buffers of `bufs` must
    /// already be posted on `qp`, and `conn` built for their count;
    /// `max_sge` is the QP's scatter-gather limit.
    pub fn new(
        conn: IserConn,
        qp: Box<dyn QueuePair>,
        pd: Box<dyn ProtectionDomain>,
        bufs: QpBuffers,
        max_sge: usize,
    ) -> IserQp {
        let n = bufs.send.count;
        IserQp {
            conn,
            qp,
            pd,
            bufs,
            free_send: (0..n).rev().collect(),
            max_sge: max_sge.max(1),
            next_wr: 1,
            pending: HashMap::new(),
            backlog: VecDeque::new(),
            waiting: None,
            read_bufs: Vec::new(),
            disconnected: false,
        }
    }

    /// Ends the connection's queue pair and gives its buffers back for
    /// another connection: nothing the device does touches them once the
    /// queue pair is gone.
    pub fn into_buffers(self) -> QpBuffers {
        let IserQp { qp, bufs, .. } = self;
        drop(qp);
        bufs
    }

    /// The connection.
    pub fn conn(&self) -> &IserConn {
        &self.conn
    }

    /// The connection, for the session layer's events and actions (then
    /// call [`IserQp::pump`]).
    pub fn conn_mut(&mut self) -> &mut IserConn {
        &mut self.conn
    }

    /// The queue pair.
    pub fn qp(&self) -> &dyn QueuePair {
        &*self.qp
    }

    /// Looks at connection events (disconnects).
    pub fn poll_conn_events(&mut self, now: Instant) {
        while let Some(ev) = self.qp.poll_event() {
            match ev {
                ConnEvent::Disconnected => self.conn.conn_mut().handle_peer_closed(now),
            }
        }
    }

    fn wr_id(&mut self) -> u64 {
        let id = self.next_wr;
        self.next_wr = (self.next_wr + 1) & !RECV_BIT;
        id
    }

    /// Feeds one completion of this QP (then call [`IserQp::pump`]).
    pub fn handle_completion(&mut self, now: Instant, wc: &WorkCompletion) {
        let ok = wc.status == WcStatus::Success;
        if wc.wr_id & RECV_BIT != 0 {
            let slot = (wc.wr_id & !RECV_BIT) as usize;
            if !ok {
                if wc.status == WcStatus::WrFlushErr {
                    self.conn.conn_mut().handle_peer_closed(now);
                } else {
                    // A Send longer than the receive buffer, or the like.
                    self.conn
                        .transfer_failed(&format!("receive ({:?})", wc.status));
                }
                return;
            }
            let msg = self.bufs.recv.read(slot, wc.byte_len as usize);
            // Copied out: the buffer goes straight back.
            if let Err(e) = self.bufs.post(&*self.qp, slot) {
                self.conn
                    .transfer_failed(&format!("reposting a receive: {e}"));
                return;
            }
            self.conn.recv(now, &msg);
            return;
        }
        let flushed = wc.status == WcStatus::WrFlushErr;
        match self.pending.remove(&wc.wr_id) {
            Some(Pending::Send { slot, .. }) => {
                if let Some(s) = slot {
                    self.free_send.push(s);
                }
                if !ok && !flushed {
                    self.conn
                        .transfer_failed(&format!("Send ({:?})", wc.status));
                }
            }
            Some(Pending::Write {
                itt,
                _mr,
                left,
                ok: all,
            }) => {
                let all = all && ok;
                if left > 1 {
                    let p = Pending::Write {
                        itt,
                        _mr,
                        left: left - 1,
                        ok: all,
                    };
                    self.pending.insert(wc.wr_id, p);
                } else if !all && !flushed {
                    self.conn.transfer_failed(&format!(
                        "RDMA WRITE of read data for ITT {itt:#x} ({:?})",
                        wc.status
                    ));
                }
            }
            Some(Pending::Read {
                itt,
                ttt,
                offset,
                len,
                mr,
                left,
                ok: all,
            }) => {
                let all = all && ok;
                if left > 1 {
                    let p = Pending::Read {
                        itt,
                        ttt,
                        offset,
                        len,
                        mr,
                        left: left - 1,
                        ok: all,
                    };
                    self.pending.insert(wc.wr_id, p);
                    return;
                }
                if all {
                    let mut data = vec![0u8; len];
                    mr.read_at(0, &mut data);
                    self.conn.read_done(itt, ttt, offset, Some(&data));
                } else {
                    self.conn.read_done(itt, ttt, offset, None);
                }
                if self.read_bufs.len() < READ_BUFS_KEPT {
                    self.read_bufs.push(mr);
                }
            }
            None => {
                tracing::debug!(wr_id = wc.wr_id, opcode = ?wc.opcode, "iSER completion for no request");
            }
        }
    }

    /// Posts what the connection transmits, as far as the send queue and
    /// the send buffers have room (a full queue waits for completions);
    /// disconnects once a closed connection's last Send completed.
    pub fn pump(&mut self) {
        loop {
            if !self.post_backlog() {
                return;
            }
            let t = match self.waiting.take() {
                Some(t) => t,
                None => match self.conn.poll_transmit() {
                    Some(t) => t,
                    None => break,
                },
            };
            if self.disconnected {
                continue;
            }
            if let Err(t) = self.build(t) {
                self.waiting = Some(t);
                return;
            }
        }
        let sending = self
            .pending
            .values()
            .any(|p| matches!(p, Pending::Send { .. }));
        if self.conn.conn().is_closed() && !sending && !self.disconnected {
            self.disconnected = true;
            self.backlog.clear();
            self.qp.disconnect();
        }
    }

    /// True once the connection is closed and nothing is in flight.
    pub fn finished(&self) -> bool {
        self.conn.conn().is_closed() && self.pending.is_empty()
    }

    /// Posts the backlog while the send queue has room; true once empty.
    fn post_backlog(&mut self) -> bool {
        while let Some(wr) = self.backlog.front() {
            match self.qp.post_send(wr) {
                Ok(()) => {
                    self.backlog.pop_front();
                }
                Err(PostError::QueueFull) => return false,
                Err(e) => {
                    self.backlog.clear();
                    self.conn
                        .transfer_failed(&format!("posting a work request: {e}"));
                    return true;
                }
            }
        }
        true
    }

    /// The work requests of one transmit, onto the backlog; the transmit
    /// back when no send buffer is free.
    fn build(&mut self, t: Transmit) -> Result<(), Transmit> {
        match t {
            Transmit::Send { msg, invalidate } => {
                let op = invalidate.map_or(SendOp::Send, |rkey| SendOp::SendInvalidate { rkey });
                let (slot, own, sges) = if msg.len() <= self.bufs.send.len {
                    let Some(slot) = self.free_send.pop() else {
                        return Err(Transmit::Send { msg, invalidate });
                    };
                    self.bufs.send.write(slot, &msg);
                    (Some(slot), None, self.bufs.send.sges(slot, msg.len()))
                } else {
                    let len = msg.len() as u64;
                    match self
                        .pd
                        .reg_sg(SgList::from(IoBuf::from_slice(&msg)), Access::LOCAL_WRITE)
                    {
                        Ok(mr) => {
                            let sges = mr.sges(0, len).unwrap_or_default();
                            (None, Some(mr), sges)
                        }
                        Err(e) => {
                            self.conn
                                .transfer_failed(&format!("registering a Send: {e}"));
                            return Ok(());
                        }
                    }
                };
                let wr_id = self.wr_id();
                self.pending
                    .insert(wr_id, Pending::Send { slot, _own: own });
                self.backlog.push_back(SendWr {
                    wr_id,
                    op,
                    sges,
                    signaled: true,
                });
            }
            Transmit::Write { itt, data, remote } => {
                let mr = match self.pd.map_sg(data, Access::LOCAL_WRITE) {
                    Ok(mr) => mr,
                    Err(e) => {
                        self.conn
                            .transfer_failed(&format!("registering read data: {e}"));
                        return Ok(());
                    }
                };
                let Some(wrs) = self.rdma_wrs(&*mr, remote, true) else {
                    self.conn.transfer_failed("mapping read data");
                    return Ok(());
                };
                self.post_rdma(wrs, |left| Pending::Write {
                    itt,
                    _mr: mr,
                    left,
                    ok: true,
                });
            }
            Transmit::Read {
                itt,
                ttt,
                offset,
                remote,
            } => {
                let len = remote.len as usize;
                let mr = match self.read_buf(len) {
                    Ok(mr) => mr,
                    Err(e) => {
                        self.conn
                            .transfer_failed(&format!("registering a read buffer: {e}"));
                        return Ok(());
                    }
                };
                let Some(wrs) = self.rdma_wrs(&*mr, remote, false) else {
                    self.conn.transfer_failed("mapping a read buffer");
                    return Ok(());
                };
                self.post_rdma(wrs, |left| Pending::Read {
                    itt,
                    ttt,
                    offset,
                    len,
                    mr,
                    left,
                    ok: true,
                });
            }
        }
        Ok(())
    }

    /// A registered buffer of at least `len` bytes for an RDMA READ.
    fn read_buf(&mut self, len: usize) -> Result<Box<dyn MemoryRegion>, RdmaError> {
        if let Some(i) = self.read_bufs.iter().position(|m| m.len() >= len as u64) {
            return Ok(self.read_bufs.swap_remove(i));
        }
        self.pd
            .reg_sg(SgList::zeroed(len.max(READ_BUF_MIN)), Access::LOCAL_WRITE)
    }

    /// RDMA READ or WRITE requests moving `remote.len` bytes between the
    /// start of `mr` and `remote`, at most `max_sge` local sges each.
    fn rdma_wrs(
        &self,
        mr: &dyn MemoryRegion,
        remote: RemoteSeg,
        write: bool,
    ) -> Option<Vec<SendWr>> {
        let sges = mr.sges(0, u64::from(remote.len))?;
        let mut at = remote.addr;
        let mut wrs = Vec::new();
        for chunk in sges.chunks(self.max_sge) {
            let n: u64 = chunk.iter().map(|s| u64::from(s.len)).sum();
            let op = if write {
                SendOp::RdmaWrite {
                    remote_addr: at,
                    rkey: remote.rkey,
                }
            } else {
                SendOp::RdmaRead {
                    remote_addr: at,
                    rkey: remote.rkey,
                }
            };
            wrs.push(SendWr {
                wr_id: 0,
                op,
                sges: chunk.iter().copied().collect(),
                signaled: true,
            });
            at = at.wrapping_add(n);
        }
        Some(wrs)
    }

    fn post_rdma(&mut self, mut wrs: Vec<SendWr>, pending: impl FnOnce(usize) -> Pending) {
        if wrs.is_empty() {
            return;
        }
        let wr_id = self.wr_id();
        for w in &mut wrs {
            w.wr_id = wr_id;
        }
        self.pending.insert(wr_id, pending(wrs.len()));
        self.backlog.extend(wrs);
    }
}
