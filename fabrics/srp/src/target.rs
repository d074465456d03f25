//! The target-side driver of one channel: carries a [`Channel`]'s transmits
//! out on a queue pair and feeds its completions back. Provider-neutral (it
//! sees only the `ferrite_rdma` traits) and thread-agnostic: the reactor
//! that owns the connection calls it from its poller.
//!
//! Buffers: the receive ring (a slot of `max_it_iu_len` per receive) and
//! the ring of send buffers are each one allocation registered once, one
//! memory region per ring; data buffers (`SgList`s from the core's pools)
//! are mapped with [`ProtectionDomain::map_sg`], which on the verbs
//! provider registers a pool buffer's memory once for its life and only
//! reads its keys on later transfers, and are handed back to the channel,
//! which hands them back to the core. Write data a channel received as
//! SRP-2 immediate data needs no transfer at all.

use std::collections::{HashMap, VecDeque};

use ferrite_core::Action;
use ferrite_rdma::{
    Access, ConnEvent, MemoryRegion, PostError, ProtectionDomain, QueuePair, RdmaError, RecvWr,
    SendOp, SendWr, WcStatus, WorkCompletion,
};
use ferrite_reactor::buf::{IoBuf, SgList};

use crate::channel::{Channel, ChannelConfig, Event, OpId, Transmit, Xfer};

/// Marks receive work requests; the low bits are the ring slot.
const RECV_BIT: u64 = 1 << 63;

/// Driver errors (infrastructure, not protocol).
#[derive(Debug, thiserror::Error)]
pub enum DriverError {
    #[error("memory registration failed: {0}")]
    Reg(#[source] RdmaError),
    #[error("posting a work request failed: {0}")]
    Post(#[source] PostError),
}

/// Equal slots of one registered allocation: a ring's buffers, one memory
/// region for all of them.
struct Slots {
    mr: Box<dyn MemoryRegion>,
    count: usize,
    /// Slot size, and the distance between slots (64-byte aligned).
    len: u32,
    stride: u64,
}

impl Slots {
    fn new(pd: &dyn ProtectionDomain, count: usize, len: u32) -> Result<Slots, DriverError> {
        let stride = (len as u64).max(1).next_multiple_of(64);
        let bytes = usize::try_from(stride * count.max(1) as u64)
            .map_err(|_| DriverError::Reg(ferrite_rdma::RdmaError::TooLarge))?;
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

    fn at(&self, slot: usize) -> u64 {
        slot as u64 * self.stride
    }

    /// The sges of `n` bytes of `slot`.
    fn sges(&self, slot: usize, n: u64) -> ferrite_rdma::SgeList {
        if slot >= self.count {
            return ferrite_rdma::SgeList::new();
        }
        self.mr
            .sges(self.at(slot), n.min(self.len as u64))
            .unwrap_or_default()
    }

    fn read(&self, slot: usize, dst: &mut [u8]) {
        if slot < self.count {
            let n = dst.len().min(self.len as usize);
            self.mr.read_at(self.at(slot), &mut dst[..n]);
        }
    }

    fn write(&mut self, slot: usize, src: &[u8]) -> usize {
        if slot >= self.count {
            return 0;
        }
        let n = src.len().min(self.len as usize);
        self.mr.write_at(self.at(slot), &src[..n])
    }
}

/// Registered receive buffers, posted before the connection is accepted.
pub struct RecvRing {
    slots: Slots,
}

impl std::fmt::Debug for RecvRing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "RecvRing({} x {})", self.slots.count, self.slots.len)
    }
}

impl RecvRing {
    /// Registers `count` receive buffers of `len` bytes: one allocation,
    /// one memory region.
    pub fn new(pd: &dyn ProtectionDomain, count: u32, len: u32) -> Result<RecvRing, DriverError> {
        Ok(RecvRing {
            slots: Slots::new(pd, count as usize, len)?,
        })
    }

    /// Receive buffers posted.
    pub fn count(&self) -> usize {
        self.slots.count
    }

    /// Bytes each receive buffer holds.
    pub fn buf_len(&self) -> u32 {
        self.slots.len
    }

    /// A ring sized for `cfg` ([`ChannelConfig::recv_count`] buffers of
    /// `max_it_iu_len`).
    pub fn for_config(
        pd: &dyn ProtectionDomain,
        cfg: &ChannelConfig,
    ) -> Result<RecvRing, DriverError> {
        RecvRing::new(pd, cfg.recv_count(), cfg.max_it_iu_len)
    }

    fn post(&self, qp: &dyn QueuePair, slot: usize) -> Result<(), DriverError> {
        if slot >= self.slots.count {
            return Ok(());
        }
        let sges = self.slots.sges(slot, self.slots.len as u64);
        qp.post_recv(&RecvWr {
            wr_id: RECV_BIT | slot as u64,
            sges,
        })
        .map_err(DriverError::Post)
    }

    /// Posts every buffer (call before accepting the connection).
    pub fn post_all(&self, qp: &dyn QueuePair) -> Result<(), DriverError> {
        (0..self.slots.count).try_for_each(|s| self.post(qp, s))
    }
}

enum Pending {
    Send {
        op: OpId,
        slot: usize,
    },
    Rdma {
        op: OpId,
        mr: Box<dyn MemoryRegion>,
        left: usize,
        ok: bool,
    },
}

/// One SRP channel on one queue pair.
pub struct TargetConn {
    channel: Box<Channel>,
    qp: Box<dyn QueuePair>,
    pd: Box<dyn ProtectionDomain>,
    recv: RecvRing,
    send_slots: Slots,
    free_send: Vec<usize>,
    max_sge: usize,
    next_wr: u64,
    pending: HashMap<u64, Pending>,
    /// Transmits waiting for a send buffer or room in the send queue
    /// (back-pressure, not an error).
    waiting: VecDeque<Transmit>,
    /// RDMA transfers whose work requests did not all fit in the send
    /// queue, in order (by `wr_id` of their [`Pending::Rdma`]): the rest
    /// is posted as completions make room, before anything after them.
    stalled: VecDeque<(u64, VecDeque<SendWr>)>,
    failed: bool,
    /// Disconnect once every SEND has completed.
    linger: bool,
}

impl std::fmt::Debug for TargetConn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "TargetConn(qp {:#x}, {:?})",
            self.qp.qp_num(),
            self.channel.state()
        )
    }
}

impl TargetConn {
    /// Wraps an accepted channel. `recv` must already be posted on `qp`;
    /// `max_sge` is the QP's scatter-gather limit.
    pub fn new(
        channel: Box<Channel>,
        qp: Box<dyn QueuePair>,
        pd: Box<dyn ProtectionDomain>,
        recv: RecvRing,
        max_sge: usize,
    ) -> Result<TargetConn, DriverError> {
        let cfg = channel.config();
        // One SRP_RSP per credit, plus target requests and a logout.
        let n = (cfg.credits + cfg.reserve + 2) as usize;
        let send_slots = Slots::new(&*pd, n, cfg.max_ti_iu_len)?;
        Ok(TargetConn {
            channel,
            qp,
            pd,
            recv,
            free_send: (0..n).rev().collect(),
            send_slots,
            max_sge: max_sge.max(1),
            next_wr: 1,
            pending: HashMap::new(),
            waiting: VecDeque::new(),
            stalled: VecDeque::new(),
            failed: false,
            linger: false,
        })
    }

    /// The protocol state machine.
    pub fn channel(&self) -> &Channel {
        &self.channel
    }

    /// The queue pair.
    pub fn qp(&self) -> &dyn QueuePair {
        &*self.qp
    }

    /// The next event for the core.
    pub fn poll_event(&mut self) -> Option<Event> {
        self.channel.poll_event()
    }

    /// Carries out a core action (then call [`TargetConn::pump`]).
    pub fn handle_action(&mut self, a: Action) {
        self.channel.handle_action(a);
    }

    /// Holds or releases the channel's credits while its session waits
    /// for data memory ([`Channel::hold_credits`]; then call
    /// [`TargetConn::pump`]).
    pub fn hold_credits(&mut self, held: bool) {
        self.channel.hold_credits(held);
    }

    /// A task management function of another channel of this nexus
    /// completed ([`Channel::tmf_done_elsewhere`]; then call
    /// [`TargetConn::pump`]).
    pub fn tmf_done_elsewhere(&mut self, func: ferrite_core::TmfFunction, lun: [u8; 8]) {
        self.channel.tmf_done_elsewhere(func, lun);
    }

    /// Ends the channel with an SRP_T_LOGOUT carrying `reason` (then call
    /// [`TargetConn::pump`]).
    pub fn terminate(&mut self, reason: crate::iu::TLogoutReason) {
        self.channel.terminate(reason);
    }

    /// Looks at connection events (disconnects).
    pub fn poll_conn_events(&mut self) {
        while let Some(ev) = self.qp.poll_event() {
            match ev {
                ConnEvent::Disconnected => self.channel.connection_lost(),
            }
        }
    }

    /// Feeds one completion of this QP.
    pub fn handle_completion(&mut self, wc: &WorkCompletion) {
        if wc.wr_id & RECV_BIT != 0 {
            let slot = (wc.wr_id & !RECV_BIT) as usize;
            if wc.status != WcStatus::Success {
                self.channel.connection_lost();
                return;
            }
            let n = (wc.byte_len as usize).min(self.recv.slots.len as usize);
            let mut iu = vec![0u8; n];
            self.recv.slots.read(slot, &mut iu);
            // The IU moves in: immediate write data stays in it.
            self.channel.handle_recv_owned(iu);
            // The IU is copied out: the buffer goes straight back.
            match self.recv.post(&*self.qp, slot) {
                Ok(()) => self.channel.recv_reposted(),
                Err(_) => self.channel.connection_lost(),
            }
            return;
        }
        let ok = wc.status == WcStatus::Success;
        match self.pending.remove(&wc.wr_id) {
            Some(Pending::Send { op, slot }) => {
                self.free_send.push(slot);
                self.channel.send_done(op, ok);
                self.disconnect_when_sent();
            }
            Some(Pending::Rdma {
                op,
                mr,
                left,
                ok: all_ok,
            }) => {
                let all_ok = all_ok && ok;
                if left > 1 {
                    self.pending.insert(
                        wc.wr_id,
                        Pending::Rdma {
                            op,
                            mr,
                            left: left - 1,
                            ok: all_ok,
                        },
                    );
                } else {
                    self.channel.rdma_done(op, mr.into_sg(), all_ok);
                }
            }
            None => {
                tracing::debug!(wr_id = wc.wr_id, opcode = ?wc.opcode, "completion for no request");
            }
        }
    }

    /// Puts everything the channel wants on the queue pair, as far as its
    /// send queue has room (a full queue waits for completions: the next
    /// pump after them goes on).
    pub fn pump(&mut self) {
        loop {
            if !self.post_stalled() {
                return;
            }
            let t = match self.waiting.pop_front() {
                Some(t) => t,
                None => match self.channel.poll_transmit() {
                    Some(t) => t,
                    None => return,
                },
            };
            if self.failed {
                self.fail(t);
                continue;
            }
            if let Err(t) = self.transmit(t) {
                // Out of send buffers: wait for a send completion.
                self.waiting.push_front(*t);
                return;
            }
        }
    }

    /// Completes a transmit that cannot go out (the QP failed).
    fn fail(&mut self, t: Transmit) {
        match t {
            Transmit::Send { op, .. } => self.channel.send_done(op, false),
            Transmit::RdmaRead { op, buf, .. } | Transmit::RdmaWrite { op, buf, .. } => {
                self.channel.rdma_done(op, buf, false)
            }
            Transmit::Disconnect => {}
        }
    }

    fn disconnect_when_sent(&mut self) {
        let sending = self
            .pending
            .values()
            .any(|p| matches!(p, Pending::Send { .. }));
        if self.linger && !sending {
            self.linger = false;
            self.qp.disconnect();
        }
    }

    fn wr_id(&mut self) -> u64 {
        let id = self.next_wr;
        self.next_wr = (self.next_wr + 1) & !RECV_BIT;
        id
    }

    fn post_failed(&mut self, e: DriverError) {
        tracing::warn!("srp channel: {e}; disconnecting");
        self.failed = true;
        self.qp.disconnect();
        // Work requests never posted never complete.
        while let Some((wr_id, wrs)) = self.stalled.pop_front() {
            if let Some(Pending::Rdma { op, mr, left, .. }) = self.pending.remove(&wr_id) {
                let left = left.saturating_sub(wrs.len());
                if left == 0 {
                    self.channel.rdma_done(op, mr.into_sg(), false);
                } else {
                    self.pending.insert(
                        wr_id,
                        Pending::Rdma {
                            op,
                            mr,
                            left,
                            ok: false,
                        },
                    );
                }
            }
        }
        self.channel.connection_lost();
    }

    /// Posts the stalled transfers' work requests while the send queue has
    /// room; true once none is left.
    fn post_stalled(&mut self) -> bool {
        while let Some((_, wrs)) = self.stalled.front_mut() {
            while let Some(wr) = wrs.front() {
                if self.failed {
                    return false;
                }
                match self.qp.post_send(wr) {
                    Ok(()) => {
                        wrs.pop_front();
                    }
                    // Room comes back with the next send completion.
                    Err(PostError::QueueFull) => return false,
                    Err(e) => {
                        self.post_failed(DriverError::Post(e));
                        return false;
                    }
                }
            }
            self.stalled.pop_front();
        }
        true
    }

    fn transmit(&mut self, t: Transmit) -> Result<(), Box<Transmit>> {
        match t {
            Transmit::Send { op, iu } => {
                let Some(slot) = self.free_send.pop() else {
                    return Err(Box::new(Transmit::Send { op, iu }));
                };
                let n = self.send_slots.write(slot, &iu);
                let sges = self.send_slots.sges(slot, n as u64);
                let wr_id = self.wr_id();
                self.pending.insert(wr_id, Pending::Send { op, slot });
                let wr = SendWr {
                    wr_id,
                    op: SendOp::Send,
                    sges,
                    signaled: true,
                };
                match self.qp.post_send(&wr) {
                    Ok(()) => {}
                    // The send queue is full of RDMA work: wait for room.
                    Err(PostError::QueueFull) => {
                        self.pending.remove(&wr_id);
                        self.free_send.push(slot);
                        return Err(Box::new(Transmit::Send { op, iu }));
                    }
                    Err(e) => {
                        self.pending.remove(&wr_id);
                        self.free_send.push(slot);
                        self.channel.send_done(op, false);
                        self.post_failed(DriverError::Post(e));
                    }
                }
            }
            Transmit::RdmaRead { op, buf, xfers } => self.rdma(op, buf, &xfers, false),
            Transmit::RdmaWrite { op, buf, xfers } => self.rdma(op, buf, &xfers, true),
            // A disconnect flushes what is not yet sent: let the SENDs before
            // it (SRP_T_LOGOUT) complete first.
            Transmit::Disconnect => {
                self.linger = true;
                self.disconnect_when_sent();
            }
        }
        Ok(())
    }

    /// Posts one RDMA work request per (xfer, max_sge local sges).
    fn rdma(&mut self, op: OpId, buf: SgList, xfers: &[Xfer], write: bool) {
        // Local rights only (the initiator never addresses target memory),
        // and the same for both directions so that a pool buffer's one
        // registration serves every later transfer.
        let mr = match self.pd.map_sg(buf, Access::LOCAL_WRITE) {
            Ok(mr) => mr,
            Err(e) => {
                // The list is gone with the failed registration; the channel
                // reports the command aborted.
                self.channel.rdma_done(op, SgList::new(), false);
                return self.post_failed(DriverError::Reg(e));
            }
        };
        let mut wrs = Vec::new();
        for x in xfers {
            let Some(sges) = mr.sges(x.offset as u64, x.remote.len as u64) else {
                self.channel.rdma_done(op, mr.into_sg(), false);
                return;
            };
            let mut remote = x.remote.addr;
            for chunk in sges.chunks(self.max_sge) {
                let len: u64 = chunk.iter().map(|s| s.len as u64).sum();
                let rop = if write {
                    SendOp::RdmaWrite {
                        remote_addr: remote,
                        rkey: x.remote.rkey,
                    }
                } else {
                    SendOp::RdmaRead {
                        remote_addr: remote,
                        rkey: x.remote.rkey,
                    }
                };
                wrs.push(SendWr {
                    wr_id: 0,
                    op: rop,
                    sges: chunk.iter().copied().collect(),
                    signaled: true,
                });
                remote += len;
            }
        }
        if wrs.is_empty() {
            self.channel.rdma_done(op, mr.into_sg(), true);
            return;
        }
        // Posted in order as the send queue has room (`post_stalled`);
        // the transfer is done when every one of them has completed.
        let wr_id = self.wr_id();
        for wr in &mut wrs {
            wr.wr_id = wr_id;
        }
        self.pending.insert(
            wr_id,
            Pending::Rdma {
                op,
                mr,
                left: wrs.len(),
                ok: true,
            },
        );
        self.stalled.push_back((wr_id, wrs.into()));
        self.post_stalled();
    }

    /// True once the channel is closed and nothing is in flight.
    pub fn finished(&self) -> bool {
        self.channel.state() == crate::channel::ChannelState::Closed && self.pending.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::channel::{Login, login};
    use crate::iu;
    use ferrite_rdma::soft::SoftDevice;
    use ferrite_rdma::{ConnEvent, QpState, WcOpcode};
    use std::sync::{Arc, Mutex};

    /// Records what the driver does to its queue pair.
    #[derive(Clone, Default)]
    struct MockQp {
        log: Arc<Mutex<Vec<String>>>,
        sends: Arc<Mutex<Vec<SendWr>>>,
        /// Send queue slots left (None: no limit).
        room: Arc<Mutex<Option<usize>>>,
    }

    impl QueuePair for MockQp {
        fn qp_num(&self) -> u32 {
            7
        }
        fn state(&self) -> QpState {
            QpState::Rts
        }
        fn post_send(&self, wr: &SendWr) -> Result<(), PostError> {
            if let Some(n) = self.room.lock().unwrap().as_mut() {
                if *n == 0 {
                    return Err(PostError::QueueFull);
                }
                *n -= 1;
            }
            self.log.lock().unwrap().push(format!("send {:?}", wr.op));
            self.sends.lock().unwrap().push(wr.clone());
            Ok(())
        }
        fn post_recv(&self, _wr: &RecvWr) -> Result<(), PostError> {
            self.log.lock().unwrap().push("recv".into());
            Ok(())
        }
        fn disconnect(&self) {
            self.log.lock().unwrap().push("disconnect".into());
        }
        fn poll_event(&self) -> Option<ConnEvent> {
            None
        }
    }

    fn conn(qp: &MockQp, max_sge: usize) -> TargetConn {
        let dev = SoftDevice::new("t");
        let pd = dev.alloc_pd();
        let cfg = ChannelConfig::default();
        let req = iu::LoginReq {
            tag: 1,
            req_it_iu_len: 1024,
            req_buf_fmt: iu::BUF_FORMAT_DIRECT,
            req_flags: 0,
            imm_data_offset: 0,
            initiator_port_id: [1; 16],
            target_port_id: cfg.target_port_id,
        };
        let Login::Accept { channel, .. } = login(cfg.clone(), &req.encode()) else {
            panic!("login rejected")
        };
        let ring = RecvRing::for_config(&pd, &cfg).unwrap();
        ring.post_all(qp).unwrap();
        TargetConn::new(channel, Box::new(qp.clone()), Box::new(pd), ring, max_sge).unwrap()
    }

    fn wc(wr_id: u64, opcode: WcOpcode) -> WorkCompletion {
        WorkCompletion::new(wr_id, WcStatus::Success, opcode, 0, 7)
    }

    #[test]
    fn target_logout_is_sent_before_the_disconnect() {
        let qp = MockQp::default();
        let mut c = conn(&qp, 4);
        qp.log.lock().unwrap().clear();
        c.handle_action(Action::Close);
        c.pump();
        assert_eq!(
            qp.log.lock().unwrap().as_slice(),
            &["send Send".to_string()]
        );
        let wr_id = qp.sends.lock().unwrap()[0].wr_id;
        c.handle_completion(&wc(wr_id, WcOpcode::Send));
        assert_eq!(
            qp.log.lock().unwrap().last().map(String::as_str),
            Some("disconnect")
        );
        assert!(c.finished());
    }

    /// A READ (10) of 5 blocks into one remote segment at 0x10_0000,
    /// received and submitted; the request and 5 local 512-byte buffers to
    /// answer it with.
    fn five_block_read(c: &mut TargetConn) -> (ferrite_core::CmdRequest, SgList) {
        let cmd = iu::CmdBuilder {
            tag: 9,
            lun: [0; 8],
            task_attr: 0,
            cdb: &[0x28, 0, 0, 0, 0, 0, 0, 0, 5, 0],
            data_out: &[],
            data_in: &[ferrite_rdma::RemoteSeg {
                addr: 0x10_0000,
                rkey: 0x8000_0001,
                len: 5 * 512,
            }],
            out_table: None,
            in_table: None,
            inline_max: 4,
        }
        .encode();
        c.recv.slots.write(0, &cmd);
        let mut w = wc(RECV_BIT, WcOpcode::Recv);
        w.byte_len = cmd.len() as u32;
        c.handle_completion(&w);
        let Some(Event::Submit(req)) = c.poll_event() else {
            panic!("no submit")
        };
        let mut data = SgList::new();
        for _ in 0..5 {
            data.push(IoBuf::new(512));
        }
        (req, data)
    }

    #[test]
    fn rdma_transfers_are_split_to_the_sge_limit() {
        let qp = MockQp::default();
        let mut c = conn(&qp, 2);
        // A READ command whose data-in buffer is one remote segment while the
        // local list has five segments: three WRITEs of at most two sges.
        let (req, data) = five_block_read(&mut c);
        c.handle_action(Action::Respond {
            id: ferrite_core::CmdId(1),
            tag: req.tag,
            rsp: ferrite_core::Response {
                data: Some(data),
                data_len: 5 * 512,
                ..ferrite_core::Response::good()
            },
        });
        c.pump();
        let sends = qp.sends.lock().unwrap().clone();
        let writes: Vec<&SendWr> = sends
            .iter()
            .filter(|w| matches!(w.op, SendOp::RdmaWrite { .. }))
            .collect();
        assert_eq!(writes.len(), 3);
        assert!(writes.iter().all(|w| w.sges.len() <= 2));
        let addrs: Vec<u64> = writes
            .iter()
            .map(|w| match w.op {
                SendOp::RdmaWrite { remote_addr, .. } => remote_addr,
                _ => 0,
            })
            .collect();
        assert_eq!(addrs, vec![0x10_0000, 0x10_0000 + 1024, 0x10_0000 + 2048]);
        // The SRP_RSP follows the data on the same send queue.
        assert!(matches!(sends.last().map(|w| w.op), Some(SendOp::Send)));
    }

    #[test]
    fn a_full_send_queue_is_back_pressure_in_order_not_an_error() {
        let qp = MockQp::default();
        let mut c = conn(&qp, 1);
        let (req, data) = five_block_read(&mut c);
        // Five RDMA WRITEs and the SRP_RSP behind them, through a send
        // queue with room for two.
        *qp.room.lock().unwrap() = Some(2);
        c.handle_action(Action::Respond {
            id: ferrite_core::CmdId(1),
            tag: req.tag,
            rsp: ferrite_core::Response {
                data: Some(data),
                data_len: 5 * 512,
                ..ferrite_core::Response::good()
            },
        });
        c.pump();
        assert_eq!(qp.sends.lock().unwrap().len(), 2);
        let mut done = 0;
        while done < 6 {
            let wr = qp.sends.lock().unwrap()[done].clone();
            let op = match wr.op {
                SendOp::Send => WcOpcode::Send,
                _ => WcOpcode::RdmaWrite,
            };
            c.handle_completion(&wc(wr.wr_id, op));
            *qp.room.lock().unwrap() = Some(1);
            c.pump();
            done += 1;
            assert!(qp.sends.lock().unwrap().len() <= done + 2);
        }
        let sends = qp.sends.lock().unwrap().clone();
        let ops: Vec<bool> = sends
            .iter()
            .map(|w| matches!(w.op, SendOp::RdmaWrite { .. }))
            .collect();
        assert_eq!(ops, [true, true, true, true, true, false]);
        assert!(
            !qp.log.lock().unwrap().iter().any(|l| l == "disconnect"),
            "a full send queue ended the channel"
        );
        assert_eq!(c.channel().state(), crate::channel::ChannelState::Live);
        assert!(matches!(c.poll_event(), Some(Event::ResponseSent(_))));
    }
}
