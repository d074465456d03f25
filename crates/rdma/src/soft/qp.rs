//! Soft reliable-connected queue pairs: one socket, three threads.

use std::collections::VecDeque;
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex};
use std::thread;
use std::time::Duration;

use super::wire::{Frame, Nak};
use super::{
    ConnRequest, DevShared, RecvQueue, SoftAddr, SoftCq, SoftPd, SoftSrq, Stream, connect_stream,
    lock,
};
use crate::{
    ConnEvent, PostError, QpState, QueuePair, RdmaError, RecvWr, SendOp, SendWr, WcOpcode,
    WcStatus, WorkCompletion,
};

/// Queue pair attributes.
#[derive(Clone, Copy, Debug)]
pub struct QpAttrs {
    /// Send queue depth.
    pub max_send_wr: usize,
    /// Receive queue depth (ignored with an SRQ).
    pub max_recv_wr: usize,
    /// Scatter-gather entries per request.
    pub max_sge: usize,
    /// How many times a SEND NAKed RNR is retried before it completes with
    /// [`WcStatus::RnrRetryExcErr`].
    pub rnr_retry: u8,
    /// Pause between RNR retries (the RNR NAK timer).
    pub rnr_delay: Duration,
    /// How long a request may go unanswered (transport timeout x retries).
    pub timeout: Duration,
}

impl Default for QpAttrs {
    fn default() -> QpAttrs {
        QpAttrs {
            max_send_wr: 256,
            max_recv_wr: 256,
            max_sge: 16,
            rnr_retry: 7,
            rnr_delay: Duration::from_millis(2),
            timeout: Duration::from_secs(10),
        }
    }
}

struct QpInner {
    state: QpState,
    send_q: VecDeque<SendWr>,
    events: VecDeque<ConnEvent>,
    to_wire: Option<mpsc::Sender<Frame>>,
    stream: Option<Stream>,
}

struct QpShared {
    qpn: u32,
    dev: Arc<DevShared>,
    pd: u32,
    send_cq: SoftCq,
    recv_cq: SoftCq,
    rq: Arc<RecvQueue>,
    srq: bool,
    attrs: QpAttrs,
    st: Mutex<QpInner>,
    cv: Condvar,
}

/// A soft RC queue pair. Dropping it disconnects.
pub struct SoftQp {
    shared: Arc<QpShared>,
}

impl std::fmt::Debug for SoftQp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SoftQp({:#x}, {:?})", self.shared.qpn, self.state())
    }
}

impl SoftQp {
    /// Creates an unconnected QP (state [`QpState::Init`]); receives may be
    /// posted before [`SoftQp::connect`] or [`SoftQp::accept`].
    pub fn create(
        pd: &SoftPd,
        send_cq: &SoftCq,
        recv_cq: &SoftCq,
        srq: Option<&SoftSrq>,
        attrs: QpAttrs,
    ) -> SoftQp {
        SoftQp {
            shared: Arc::new(QpShared {
                qpn: pd.dev.next_qpn(),
                dev: pd.dev.clone(),
                pd: pd.id,
                send_cq: send_cq.clone(),
                recv_cq: recv_cq.clone(),
                rq: srq.map_or_else(Arc::default, |s| s.rq.clone()),
                srq: srq.is_some(),
                attrs,
                st: Mutex::new(QpInner {
                    state: QpState::Init,
                    send_q: VecDeque::new(),
                    events: VecDeque::new(),
                    to_wire: None,
                    stream: None,
                }),
                cv: Condvar::new(),
            }),
        }
    }

    /// Connects to a listener, sending `private_data`; returns the peer's
    /// private data from its accept, or [`RdmaError::Rejected`] with the
    /// reject's private data.
    pub fn connect(
        &self,
        addr: &SoftAddr,
        private_data: &[u8],
        timeout: Duration,
    ) -> Result<Vec<u8>, RdmaError> {
        if lock(&self.shared.st).state != QpState::Init {
            return Err(RdmaError::BadState);
        }
        let (stream, reply) = connect_stream(addr, private_data, timeout)?;
        self.start(stream)?;
        Ok(reply)
    }

    /// Accepts a connection request on this QP, answering `private_data`.
    pub fn accept(&self, req: ConnRequest, private_data: &[u8]) -> Result<(), RdmaError> {
        if lock(&self.shared.st).state != QpState::Init {
            return Err(RdmaError::BadState);
        }
        let mut stream = req.stream;
        Frame::ConnRep(private_data.to_vec()).write_to(&mut stream)?;
        self.start(stream)
    }

    fn start(&self, stream: Stream) -> Result<(), RdmaError> {
        let rd = stream.try_clone()?;
        let wr = stream.try_clone()?;
        let (wire_tx, wire_rx) = mpsc::channel::<Frame>();
        let (resp_tx, resp_rx) = mpsc::channel::<Frame>();
        {
            let mut st = lock(&self.shared.st);
            st.state = QpState::Rts;
            st.to_wire = Some(wire_tx.clone());
            st.stream = Some(stream);
        }
        let name = format!("soft-qp-{:x}", self.shared.qpn);
        let sh = self.shared.clone();
        thread::Builder::new()
            .name(format!("{name}-w"))
            .spawn(move || writer(wr, wire_rx))?;
        let reader_wire = wire_tx.clone();
        thread::Builder::new()
            .name(format!("{name}-r"))
            .spawn(move || reader(sh, rd, reader_wire, resp_tx))?;
        let sh = self.shared.clone();
        thread::Builder::new()
            .name(format!("{name}-s"))
            .spawn(move || requester(sh, wire_tx, resp_rx))?;
        Ok(())
    }

    /// Receives currently posted on this QP's own receive queue.
    pub fn recv_posted(&self) -> usize {
        lock(&self.shared.rq.q).len()
    }
}

impl QueuePair for SoftQp {
    fn qp_num(&self) -> u32 {
        self.shared.qpn
    }

    fn state(&self) -> QpState {
        lock(&self.shared.st).state
    }

    fn post_send(&self, wr: &SendWr) -> Result<(), PostError> {
        if wr.sges.len() > self.shared.attrs.max_sge {
            return Err(PostError::TooManySges(wr.sges.len()));
        }
        let mut st = lock(&self.shared.st);
        match st.state {
            QpState::Init => Err(PostError::NotConnected),
            QpState::Error => {
                drop(st);
                self.shared.send_cq.push(self.shared.wc(
                    wr.wr_id,
                    WcStatus::WrFlushErr,
                    opcode_of(wr.op),
                    0,
                ));
                Ok(())
            }
            QpState::Rts => {
                if st.send_q.len() >= self.shared.attrs.max_send_wr {
                    return Err(PostError::QueueFull);
                }
                st.send_q.push_back(wr.clone());
                drop(st);
                self.shared.cv.notify_all();
                Ok(())
            }
        }
    }

    fn post_recv(&self, wr: &RecvWr) -> Result<(), PostError> {
        if self.shared.srq {
            return Err(PostError::UsesSrq);
        }
        if wr.sges.len() > self.shared.attrs.max_sge {
            return Err(PostError::TooManySges(wr.sges.len()));
        }
        let st = lock(&self.shared.st);
        if st.state == QpState::Error {
            drop(st);
            self.shared.recv_cq.push(self.shared.wc(
                wr.wr_id,
                WcStatus::WrFlushErr,
                WcOpcode::Recv,
                0,
            ));
            return Ok(());
        }
        let mut q = lock(&self.shared.rq.q);
        if q.len() >= self.shared.attrs.max_recv_wr {
            return Err(PostError::QueueFull);
        }
        q.push_back(wr.clone());
        Ok(())
    }

    fn disconnect(&self) {
        self.shared.enter_error();
    }

    fn poll_event(&self) -> Option<ConnEvent> {
        lock(&self.shared.st).events.pop_front()
    }
}

impl Drop for SoftQp {
    fn drop(&mut self) {
        self.shared.enter_error();
    }
}

fn opcode_of(op: SendOp) -> WcOpcode {
    match op {
        SendOp::Send | SendOp::SendInvalidate { .. } => WcOpcode::Send,
        SendOp::RdmaWrite { .. } => WcOpcode::RdmaWrite,
        SendOp::RdmaRead { .. } => WcOpcode::RdmaRead,
    }
}

impl QpShared {
    fn wc(&self, wr_id: u64, status: WcStatus, opcode: WcOpcode, byte_len: u32) -> WorkCompletion {
        WorkCompletion::new(wr_id, status, opcode, byte_len, self.qpn)
    }

    /// Moves the QP to the error state (once): flushes the send queue and
    /// the QP's own receives, and tears the connection down so the peer
    /// sees a disconnect.
    fn enter_error(&self) {
        self.enter_error_after(None);
    }

    /// [`QpShared::enter_error`], delivering `first` (the completion that
    /// caused the error) before the flushes, and after the state changed.
    fn enter_error_after(&self, first: Option<WorkCompletion>) {
        let mut st = lock(&self.st);
        if st.state == QpState::Error {
            drop(st);
            if let Some(wc) = first {
                self.send_cq.push(wc);
            }
            return;
        }
        st.state = QpState::Error;
        let queued: Vec<SendWr> = st.send_q.drain(..).collect();
        if let Some(tx) = st.to_wire.take() {
            // The writer sends it, then shuts the socket down.
            let _ = tx.send(Frame::Disconnect);
        } else if let Some(s) = &st.stream {
            s.shutdown();
        }
        drop(st);
        self.cv.notify_all();
        if let Some(wc) = first {
            self.send_cq.push(wc);
        }
        for wr in queued {
            self.send_cq
                .push(self.wc(wr.wr_id, WcStatus::WrFlushErr, opcode_of(wr.op), 0));
        }
        if !self.srq {
            let recvs: Vec<RecvWr> = lock(&self.rq.q).drain(..).collect();
            for wr in recvs {
                self.recv_cq
                    .push(self.wc(wr.wr_id, WcStatus::WrFlushErr, WcOpcode::Recv, 0));
            }
        }
    }
}

fn writer(mut stream: Stream, rx: mpsc::Receiver<Frame>) {
    while let Ok(f) = rx.recv() {
        let last = f == Frame::Disconnect;
        if f.write_to(&mut stream).is_err() || last {
            break;
        }
    }
    stream.shutdown();
}

/// Serves the peer's requests and routes its answers to the requester.
fn reader(
    sh: Arc<QpShared>,
    mut stream: Stream,
    wire: mpsc::Sender<Frame>,
    resp: mpsc::Sender<Frame>,
) {
    while let Ok(Some(f)) = Frame::read_from(&mut stream) {
        let answer = match f {
            Frame::Send(data) => match serve_send(&sh, &data, None) {
                (a, false) => Some(a),
                (a, true) => {
                    // The responder's QP goes to the error state after the NAK.
                    let _ = wire.send(a);
                    break;
                }
            },
            Frame::SendInv { rkey, data } => match serve_send(&sh, &data, Some(rkey)) {
                (a, false) => Some(a),
                (a, true) => {
                    let _ = wire.send(a);
                    break;
                }
            },
            Frame::Write { addr, rkey, data } => {
                Some(if sh.dev.remote_write(sh.pd, addr, rkey, &data) {
                    Frame::Ack
                } else {
                    Frame::Nak(Nak::RemoteAccess)
                })
            }
            Frame::ReadReq { addr, rkey, len } => {
                Some(match sh.dev.remote_read(sh.pd, addr, rkey, len) {
                    Some(d) => Frame::ReadResp(d),
                    None => Frame::Nak(Nak::RemoteAccess),
                })
            }
            Frame::Ack | Frame::ReadResp(_) | Frame::Nak(_) => {
                if resp.send(f).is_err() {
                    break;
                }
                None
            }
            Frame::Disconnect => break,
            Frame::ConnReq(_) | Frame::ConnRep(_) | Frame::ConnRej(_) => break,
        };
        if let Some(a) = answer
            && wire.send(a).is_err()
        {
            break;
        }
    }
    drop(resp);
    // The event is queued before the flushes become visible.
    lock(&sh.st).events.push_back(ConnEvent::Disconnected);
    sh.enter_error();
    // The event is not a completion; wake a reactor sleeping on the CQ so it
    // looks at the QP.
    sh.recv_cq.nudge();
}

/// Places an incoming SEND into the next posted receive and, for a SEND
/// with Invalidate, invalidates `invalidate` in this QP's protection
/// domain. Returns the answer and whether the responder's QP fails.
///
/// An rkey that is not a valid remote key of this protection domain (never
/// registered, another domain's, deregistered or already invalidated)
/// completes the receive with [`WcStatus::RemInvReqErr`] and moves the
/// responder's QP to the error state; the requester sees an invalid
/// request ([`WcStatus::RemInvReqErr`]). The receive's status and the
/// responder's error state are those soft-RoCE (`rdma_rxe`) gives an
/// invalidation of a bad R_Key.
fn serve_send(sh: &QpShared, data: &[u8], invalidate: Option<u32>) -> (Frame, bool) {
    let Some(wr) = lock(&sh.rq.q).pop_front() else {
        return (Frame::Nak(Nak::Rnr), false);
    };
    match sh.dev.scatter(sh.pd, &wr.sges, data) {
        Ok(()) => {
            if let Some(rkey) = invalidate
                && !sh.dev.invalidate(sh.pd, rkey)
            {
                sh.recv_cq
                    .push(sh.wc(wr.wr_id, WcStatus::RemInvReqErr, WcOpcode::Recv, 0));
                return (Frame::Nak(Nak::InvalidRequest), true);
            }
            let mut wc = sh.wc(
                wr.wr_id,
                WcStatus::Success,
                WcOpcode::Recv,
                data.len() as u32,
            );
            wc.invalidated_rkey = invalidate;
            sh.recv_cq.push(wc);
            (Frame::Ack, false)
        }
        Err(status) => {
            sh.recv_cq.push(sh.wc(wr.wr_id, status, WcOpcode::Recv, 0));
            // A local length or protection error moves the responder's QP
            // to the error state; the requester sees an invalid request.
            let nak = if status == WcStatus::LocLenErr {
                Nak::InvalidRequest
            } else {
                Nak::RemoteOp
            };
            (Frame::Nak(nak), true)
        }
    }
}

/// Carries out the send queue, one request at a time, in order.
fn requester(sh: Arc<QpShared>, wire: mpsc::Sender<Frame>, resp: mpsc::Receiver<Frame>) {
    loop {
        let wr = {
            let mut st = lock(&sh.st);
            loop {
                if st.state == QpState::Error {
                    return;
                }
                if let Some(wr) = st.send_q.pop_front() {
                    break wr;
                }
                st = sh.cv.wait(st).unwrap_or_else(|e| e.into_inner());
            }
        };
        let opcode = opcode_of(wr.op);
        let (status, byte_len) = execute(&sh, &wire, &resp, &wr);
        let wc = sh.wc(wr.wr_id, status, opcode, byte_len);
        if status != WcStatus::Success {
            // The QP is in the error state by the time the error is visible.
            sh.enter_error_after(Some(wc));
            return;
        }
        if wr.signaled {
            sh.send_cq.push(wc);
        }
    }
}

fn execute(
    sh: &QpShared,
    wire: &mpsc::Sender<Frame>,
    resp: &mpsc::Receiver<Frame>,
    wr: &SendWr,
) -> (WcStatus, u32) {
    let total: u64 = wr.sges.iter().map(|s| s.len as u64).sum();
    let Ok(total) = u32::try_from(total) else {
        return (WcStatus::LocLenErr, 0);
    };
    let request = match wr.op {
        SendOp::Send => match sh.dev.gather(sh.pd, &wr.sges) {
            Ok(d) => Frame::Send(d),
            Err(s) => return (s, 0),
        },
        SendOp::SendInvalidate { rkey } => match sh.dev.gather(sh.pd, &wr.sges) {
            Ok(data) => Frame::SendInv { rkey, data },
            Err(s) => return (s, 0),
        },
        SendOp::RdmaWrite { remote_addr, rkey } => match sh.dev.gather(sh.pd, &wr.sges) {
            Ok(data) => Frame::Write {
                addr: remote_addr,
                rkey,
                data,
            },
            Err(s) => return (s, 0),
        },
        SendOp::RdmaRead { remote_addr, rkey } => Frame::ReadReq {
            addr: remote_addr,
            rkey,
            len: total,
        },
    };
    let mut rnr_left = sh.attrs.rnr_retry;
    loop {
        if lock(&sh.st).state == QpState::Error || wire.send(request.clone()).is_err() {
            return (WcStatus::WrFlushErr, 0);
        }
        let answer = match resp.recv_timeout(sh.attrs.timeout) {
            Ok(a) => a,
            Err(mpsc::RecvTimeoutError::Timeout) => return (WcStatus::RetryExcErr, 0),
            Err(mpsc::RecvTimeoutError::Disconnected) => return (WcStatus::WrFlushErr, 0),
        };
        return match (answer, wr.op) {
            (
                Frame::Ack,
                SendOp::Send | SendOp::SendInvalidate { .. } | SendOp::RdmaWrite { .. },
            ) => (WcStatus::Success, total),
            (Frame::ReadResp(data), SendOp::RdmaRead { .. }) => {
                if data.len() != total as usize {
                    return (WcStatus::GeneralErr, 0);
                }
                match sh.dev.scatter(sh.pd, &wr.sges, &data) {
                    Ok(()) => (WcStatus::Success, total),
                    Err(s) => (s, 0),
                }
            }
            (Frame::Nak(Nak::Rnr), SendOp::Send | SendOp::SendInvalidate { .. }) => {
                if rnr_left == 0 {
                    return (WcStatus::RnrRetryExcErr, 0);
                }
                rnr_left -= 1;
                thread::sleep(sh.attrs.rnr_delay);
                continue;
            }
            (Frame::Nak(Nak::RemoteAccess), _) => (WcStatus::RemAccessErr, 0),
            (Frame::Nak(Nak::InvalidRequest), _) => (WcStatus::RemInvReqErr, 0),
            _ => (WcStatus::GeneralErr, 0),
        };
    }
}

/// Connects a new QP in one call (for initiators): create, post `recvs`,
/// connect.
pub fn connect_qp(
    pd: &SoftPd,
    cq: &SoftCq,
    attrs: QpAttrs,
    addr: &SoftAddr,
    private_data: &[u8],
    recvs: &[RecvWr],
) -> Result<(SoftQp, Vec<u8>), RdmaError> {
    let qp = SoftQp::create(pd, cq, cq, None, attrs);
    for r in recvs {
        qp.post_recv(r).map_err(|_| RdmaError::BadState)?;
    }
    let rep = qp.connect(addr, private_data, attrs.timeout)?;
    Ok((qp, rep))
}
