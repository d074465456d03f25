//! An SRP initiator over the `ferrite_rdma` surface: logs in (with the
//! 64-byte SRP_LOGIN_REQ IU or the 56-byte layout Linux sends over RDMA
//! CM), runs SCSI commands with direct, indirect and table-fetched data
//! descriptors or SRP-2 immediate write data, sends task management
//! functions, answers SRP_CRED_REQ and SRP_AER_REQ, logs out. It is the project's own initiator for end-to-end tests and tools
//! (what `ib_srp` is to a real target); it blocks on its completion queue
//! and keeps to the request limit the target grants.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use ferrite_rdma::{
    Access, CompletionQueue, MemoryRegion, PostError, ProtectionDomain, QueuePair, RdmaError,
    RecvWr, RemoteSeg, SendOp, SendWr, WcStatus, WorkCompletion,
};
use ferrite_reactor::buf::{IoBuf, SgList};
use ferrite_scsi::Lun;

use crate::iu::{self, IuType, TLogoutReason};

const RECV_BIT: u64 = 1 << 63;

/// Initiator errors.
#[derive(Debug, thiserror::Error)]
pub enum InitError {
    #[error("rdma: {0}")]
    Rdma(#[from] RdmaError),
    #[error("post: {0}")]
    Post(#[from] PostError),
    #[error("login rejected: reason {0:#x}")]
    LoginRejected(u32),
    #[error("bad IU from the target: {0}")]
    Iu(#[from] iu::IuError),
    #[error("timed out")]
    Timeout,
    #[error("the channel is closed (target logout reason {0:?})")]
    Closed(Option<u32>),
    #[error("work request failed: {0:?}")]
    Completion(WcStatus),
}

/// Initiator parameters.
#[derive(Clone, Debug)]
pub struct InitiatorConfig {
    pub initiator_port_id: [u8; 16],
    pub target_port_id: [u8; 16],
    /// Largest IU this initiator sends (SRP_LOGIN_REQ REQUESTED MAXIMUM
    /// INITIATOR TO TARGET IU LENGTH).
    pub max_it_iu_len: u32,
    /// Receive buffers posted, and their size.
    pub recv_count: u32,
    pub recv_len: u32,
    /// How long to wait for any one completion.
    pub timeout: Duration,
    /// SRP r16a §6.2 MULTI-CHANNEL ACTION: false (0) asks the target to
    /// end this initiator port's other channels to the target port, true
    /// (1) to add this one to them (ib_srp's second and later channels).
    pub multi_channel: bool,
    /// The first tag this channel uses. Tags name tasks in the I_T nexus,
    /// so the channels of one nexus take disjoint ranges (ib_srp puts the
    /// channel index in the tag's upper bits).
    pub first_tag: u64,
    /// How the SRP_LOGIN_REQ is laid out in the connect request's private
    /// data. [`connect_verbs`] always sends [`iu::LoginLayout::RdmaCm`]:
    /// RDMA CM on InfiniBand and RoCE carries 56 bytes, too few for the IU.
    pub login_layout: iu::LoginLayout,
    /// Ask for SRP-2 immediate data (IMMEDIATE DATA REQUESTED, with
    /// `imm_data_offset`); when the target grants it, writes that fit in
    /// `max_it_iu_len` after the offset carry their data in the SRP_CMD.
    pub immediate_data: bool,
    /// Where immediate data starts in an SRP_CMD (Linux: 68, room for a
    /// 32-byte CDB).
    pub imm_data_offset: u16,
}

impl Default for InitiatorConfig {
    fn default() -> InitiatorConfig {
        InitiatorConfig {
            initiator_port_id: [0; 16],
            target_port_id: [0; 16],
            max_it_iu_len: 4096,
            recv_count: 72,
            recv_len: 4096,
            timeout: Duration::from_secs(10),
            multi_channel: false,
            first_tag: 0x1000,
            login_layout: iu::LoginLayout::Iu,
            immediate_data: false,
            imm_data_offset: 68,
        }
    }
}

impl InitiatorConfig {
    /// The SRP_LOGIN_REQ to send as the connection's private data.
    pub fn login_req(&self) -> iu::LoginReq {
        iu::LoginReq {
            tag: 1,
            req_it_iu_len: self.max_it_iu_len,
            req_buf_fmt: iu::BUF_FORMAT_DIRECT | iu::BUF_FORMAT_INDIRECT,
            req_flags: if self.multi_channel {
                iu::MULTICHAN_MULTI
            } else {
                iu::MULTICHAN_SINGLE
            } | if self.immediate_data {
                iu::LOGIN_REQ_IMMED_REQUESTED
            } else {
                0
            },
            imm_data_offset: if self.immediate_data {
                self.imm_data_offset
            } else {
                0
            },
            initiator_port_id: self.initiator_port_id,
            target_port_id: self.target_port_id,
        }
    }

    /// The private data of the connect request: the SRP_LOGIN_REQ in
    /// [`InitiatorConfig::login_layout`].
    pub fn login_private_data(&self) -> Vec<u8> {
        self.login_req().encode_as(self.login_layout)
    }
}

/// How a command's data buffer is laid out in initiator memory.
#[derive(Clone, Copy, Debug)]
pub struct Layout {
    /// Number of memory segments (1: a direct descriptor; more: indirect).
    pub segments: usize,
    /// Descriptors copied into the SRP_CMD; the rest are fetched by the
    /// target from the table.
    pub inline_max: usize,
}

impl Default for Layout {
    fn default() -> Layout {
        Layout {
            segments: 1,
            inline_max: 16,
        }
    }
}

/// A finished command.
#[derive(Debug)]
pub struct Completed {
    pub rsp: iu::Rsp,
    /// The data-in buffer's contents (its full length).
    pub data: Vec<u8>,
}

/// A descriptor table registered in initiator memory, and where it lies.
type TableMr = (RemoteSeg, Box<dyn MemoryRegion>);

struct Outstanding {
    data_in: Option<Box<dyn MemoryRegion>>,
    _data_out: Option<Box<dyn MemoryRegion>>,
    _tables: Vec<Box<dyn MemoryRegion>>,
}

/// A logged-in SRP initiator channel.
pub struct Initiator {
    qp: Box<dyn QueuePair>,
    cq: Box<dyn CompletionQueue>,
    pd: Box<dyn ProtectionDomain>,
    cfg: InitiatorConfig,
    recv: Vec<Box<dyn MemoryRegion>>,
    send: Vec<Box<dyn MemoryRegion>>,
    free_send: Vec<usize>,
    send_pending: HashMap<u64, usize>,
    next_wr: u64,
    credits: u32,
    next_tag: u64,
    outstanding: HashMap<u64, Outstanding>,
    done: HashMap<u64, iu::Rsp>,
    /// Asynchronous events the target reported (SRP_AER_REQ), oldest first.
    pub aens: Vec<iu::AerReq>,
    /// SRP_CRED_REQs received.
    pub cred_reqs: u32,
    closed: Option<Option<u32>>,
    pub login_rsp: iu::LoginRsp,
    /// Immediate data as granted: its offset in an SRP_CMD and the most
    /// one command carries.
    imm: Option<(u16, usize)>,
    /// Writes sent with immediate data.
    pub immediate_writes: u64,
}

impl std::fmt::Debug for Initiator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Initiator(credits {}, outstanding {})",
            self.credits,
            self.outstanding.len()
        )
    }
}

/// Registers the receive ring an initiator posts before connecting.
pub fn recv_ring(
    pd: &dyn ProtectionDomain,
    cfg: &InitiatorConfig,
) -> Result<Vec<Box<dyn MemoryRegion>>, InitError> {
    (0..cfg.recv_count)
        .map(|_| {
            pd.reg_sg(
                SgList::from(IoBuf::new(cfg.recv_len as usize)),
                Access::LOCAL_WRITE,
            )
            .map_err(InitError::from)
        })
        .collect()
}

/// Posts receive `slot` of `ring`.
pub fn post_recv(
    qp: &dyn QueuePair,
    ring: &[Box<dyn MemoryRegion>],
    slot: usize,
) -> Result<(), InitError> {
    let Some(mr) = ring.get(slot) else {
        return Ok(());
    };
    qp.post_recv(&RecvWr {
        wr_id: RECV_BIT | slot as u64,
        sges: mr.sges(0, mr.len()).unwrap_or_default(),
    })?;
    Ok(())
}

impl Initiator {
    /// Wraps a connected QP whose login was answered with `login_rsp`
    /// (the accept's private data); `recv` is the ring posted before
    /// connecting.
    pub fn new(
        qp: Box<dyn QueuePair>,
        cq: Box<dyn CompletionQueue>,
        pd: Box<dyn ProtectionDomain>,
        cfg: InitiatorConfig,
        recv: Vec<Box<dyn MemoryRegion>>,
        login_rsp: &[u8],
    ) -> Result<Initiator, InitError> {
        let rsp = iu::LoginRsp::parse(login_rsp)?;
        if rsp.max_ti_iu_len > cfg.recv_len {
            qp.disconnect();
            return Err(InitError::Closed(None));
        }
        let mut send = Vec::new();
        for _ in 0..8 {
            send.push(pd.reg_sg(
                SgList::from(IoBuf::new(cfg.max_it_iu_len as usize)),
                Access::LOCAL_WRITE,
            )?);
        }
        // Never use more credits than receives for their responses (one is
        // kept for the target's own requests).
        let credits = rsp.req_lim_delta.min(cfg.recv_count.saturating_sub(1));
        // SRP-2: immediate data only where asked for and granted, up to
        // the IU length the target accepted.
        let imm = (cfg.immediate_data && rsp.rsp_flags & iu::LOGIN_RSP_IMMED_SUPP != 0)
            .then(|| {
                let iu_len = cfg.max_it_iu_len.min(rsp.max_it_iu_len) as usize;
                let off = cfg.imm_data_offset;
                (off, iu_len.saturating_sub(off as usize))
            })
            .filter(|(_, max)| *max > 0);
        Ok(Initiator {
            qp,
            cq,
            pd,
            recv,
            free_send: (0..send.len()).collect(),
            send,
            send_pending: HashMap::new(),
            next_wr: 1,
            credits,
            next_tag: cfg.first_tag,
            outstanding: HashMap::new(),
            done: HashMap::new(),
            aens: Vec::new(),
            cred_reqs: 0,
            closed: None,
            login_rsp: rsp,
            imm,
            immediate_writes: 0,
            cfg,
        })
    }

    /// Credits currently held.
    pub fn credits(&self) -> u32 {
        self.credits
    }

    /// The immediate data the target granted: its offset in an SRP_CMD
    /// and the most bytes one command carries.
    pub fn immediate_data(&self) -> Option<(u16, usize)> {
        self.imm
    }

    /// Commands and TMFs awaiting a response.
    pub fn outstanding(&self) -> usize {
        self.outstanding.len()
    }

    /// Commands and TMFs sent whose response has not arrived yet: never
    /// more than the request limit.
    pub fn in_flight(&self) -> usize {
        self.outstanding
            .keys()
            .filter(|t| !self.done.contains_key(t))
            .count()
    }

    /// The target's logout reason, once the channel is closed.
    pub fn closed(&self) -> Option<Option<u32>> {
        self.closed
    }

    fn check_open(&self) -> Result<(), InitError> {
        match self.closed {
            Some(r) => Err(InitError::Closed(r)),
            None => Ok(()),
        }
    }

    fn send_iu(&mut self, bytes: &[u8]) -> Result<(), InitError> {
        let deadline = Instant::now() + self.cfg.timeout;
        let slot = loop {
            self.check_open()?;
            if let Some(s) = self.free_send.pop() {
                break s;
            }
            self.progress(deadline)?;
        };
        let mr = &mut self.send[slot];
        let n = mr.write_at(0, bytes);
        let sges = mr.sges(0, n as u64).unwrap_or_default();
        let wr_id = self.next_wr;
        self.next_wr += 1;
        self.send_pending.insert(wr_id, slot);
        self.qp.post_send(&SendWr {
            wr_id,
            op: SendOp::Send,
            sges,
            signaled: true,
        })?;
        Ok(())
    }

    fn take_credit(&mut self) -> Result<(), InitError> {
        let deadline = Instant::now() + self.cfg.timeout;
        // SRP r16a §5.5: never more requests than the request limit.
        while self.credits == 0 {
            self.check_open()?;
            self.progress(deadline)?;
        }
        self.credits -= 1;
        Ok(())
    }

    fn register(
        &self,
        data: &[u8],
        len: usize,
        segments: usize,
        access: Access,
    ) -> Result<Box<dyn MemoryRegion>, InitError> {
        let n = segments.clamp(1, len.max(1));
        let mut sg = SgList::new();
        let mut left = len;
        for k in 0..n {
            let part = if k + 1 == n { left } else { len / n };
            sg.push(IoBuf::new(part));
            left -= part;
        }
        sg.copy_in(0, data);
        Ok(self.pd.reg_sg(sg, access)?)
    }

    fn table(&self, segs: &[RemoteSeg], layout: Layout) -> Result<Option<TableMr>, InitError> {
        if segs.len() < 2 || segs.len() <= layout.inline_max {
            // A single descriptor is direct; a fully inline list needs no
            // table in memory, but the header still names its size.
            return Ok(None);
        }
        let bytes = iu::encode_table(segs);
        let mr = self.register(&bytes, bytes.len(), 1, Access::REMOTE_READ)?;
        let remote = mr.segs()[0].remote();
        Ok(Some((remote, mr)))
    }

    /// Sends an SRP_CMD; returns its tag. `data_out` is written to the
    /// target; `read_len` bytes are expected back.
    pub fn submit(
        &mut self,
        lun: Lun,
        cdb: &[u8],
        data_out: Option<&[u8]>,
        read_len: u32,
        layout: Layout,
        task_attr: u8,
    ) -> Result<u64, InitError> {
        self.check_open()?;
        self.take_credit()?;
        let tag = self.next_tag;
        self.next_tag += 1;
        // SRP-2: a write that fits goes inside the SRP_CMD (as ib_srp sends
        // it: no memory registered, no RDMA READ by the target).
        if let (Some((off, max)), Some(d), 0) = (self.imm, data_out, read_len)
            && !d.is_empty()
            && d.len() <= max
        {
            let built = iu::CmdBuilder {
                tag,
                lun: lun.encode(),
                task_attr,
                cdb,
                data_out: &[],
                data_in: &[],
                out_table: None,
                in_table: None,
                inline_max: layout.inline_max,
            }
            .encode_immediate(off, d);
            if let Some(bytes) = built {
                self.outstanding.insert(
                    tag,
                    Outstanding {
                        data_in: None,
                        _data_out: None,
                        _tables: Vec::new(),
                    },
                );
                self.immediate_writes += 1;
                self.send_iu(&bytes)?;
                return Ok(tag);
            }
        }
        let out_mr = match data_out {
            Some(d) if !d.is_empty() => {
                Some(self.register(d, d.len(), layout.segments, Access::REMOTE_READ)?)
            }
            _ => None,
        };
        let in_mr = if read_len > 0 {
            Some(self.register(
                &[],
                read_len as usize,
                layout.segments,
                Access::LOCAL_WRITE | Access::REMOTE_WRITE,
            )?)
        } else {
            None
        };
        let remote = |m: &Option<Box<dyn MemoryRegion>>| -> Vec<RemoteSeg> {
            m.as_ref()
                .map(|m| m.segs().iter().map(|s| s.remote()).collect())
                .unwrap_or_default()
        };
        let (out_segs, in_segs) = (remote(&out_mr), remote(&in_mr));
        let mut tables = Vec::new();
        let out_table = match self.table(&out_segs, layout)? {
            Some((r, mr)) => {
                tables.push(mr);
                Some(r)
            }
            None if out_segs.len() > 1 => Some(RemoteSeg {
                addr: 0,
                rkey: 0,
                len: (out_segs.len() * iu::DIRECT_DESC_LEN) as u32,
            }),
            None => None,
        };
        let in_table = match self.table(&in_segs, layout)? {
            Some((r, mr)) => {
                tables.push(mr);
                Some(r)
            }
            None if in_segs.len() > 1 => Some(RemoteSeg {
                addr: 0,
                rkey: 0,
                len: (in_segs.len() * iu::DIRECT_DESC_LEN) as u32,
            }),
            None => None,
        };
        let bytes = iu::CmdBuilder {
            tag,
            lun: lun.encode(),
            task_attr,
            cdb,
            data_out: &out_segs,
            data_in: &in_segs,
            out_table,
            in_table,
            inline_max: layout.inline_max,
        }
        .encode();
        self.outstanding.insert(
            tag,
            Outstanding {
                data_in: in_mr,
                _data_out: out_mr,
                _tables: tables,
            },
        );
        self.send_iu(&bytes)?;
        Ok(tag)
    }

    /// Sends an SRP_CMD the caller encodes itself (fault tests: a
    /// descriptor with a bad rkey, a forged table). `build` gets the tag to
    /// use; a credit is taken as for [`Initiator::submit`]. No memory is
    /// registered for it: the descriptors name whatever the caller chose.
    pub fn submit_raw(&mut self, build: impl FnOnce(u64) -> Vec<u8>) -> Result<u64, InitError> {
        self.check_open()?;
        self.take_credit()?;
        let tag = self.next_tag;
        self.next_tag += 1;
        let bytes = build(tag);
        self.outstanding.insert(
            tag,
            Outstanding {
                data_in: None,
                _data_out: None,
                _tables: Vec::new(),
            },
        );
        self.send_iu(&bytes)?;
        Ok(tag)
    }

    /// Waits for the response to `tag`.
    pub fn wait(&mut self, tag: u64) -> Result<Completed, InitError> {
        let deadline = Instant::now() + self.cfg.timeout;
        loop {
            if let Some(rsp) = self.done.remove(&tag) {
                let o = self.outstanding.remove(&tag);
                let data = match o.and_then(|o| o.data_in) {
                    Some(mr) => mr.into_sg().to_vec(),
                    None => Vec::new(),
                };
                return Ok(Completed { rsp, data });
            }
            self.check_open()?;
            self.progress(deadline)?;
        }
    }

    /// Runs one command to completion.
    pub fn command(
        &mut self,
        lun: Lun,
        cdb: &[u8],
        data_out: Option<&[u8]>,
        read_len: u32,
        layout: Layout,
    ) -> Result<Completed, InitError> {
        let tag = self.submit(lun, cdb, data_out, read_len, layout, iu::TASK_ATTR_SIMPLE)?;
        self.wait(tag)
    }

    /// Sends an SRP_TSK_MGMT and waits for its SRP_RSP.
    pub fn task_mgmt(
        &mut self,
        lun: Lun,
        func: iu::TskFunc,
        task_tag: u64,
    ) -> Result<iu::Rsp, InitError> {
        self.check_open()?;
        self.take_credit()?;
        let tag = self.next_tag;
        self.next_tag += 1;
        let b = iu::TskMgmt {
            tag,
            lun: lun.encode(),
            func,
            task_tag,
        }
        .encode();
        self.outstanding.insert(
            tag,
            Outstanding {
                data_in: None,
                _data_out: None,
                _tables: Vec::new(),
            },
        );
        self.send_iu(&b)?;
        Ok(self.wait(tag)?.rsp)
    }

    /// Whether the response to `tag` is among those already taken from
    /// the completion queue (nothing more is read).
    pub fn answered(&self, tag: u64) -> bool {
        self.done.contains_key(&tag)
    }

    /// Whether a response for `tag` has arrived (without waiting).
    pub fn has_response(&mut self, tag: u64) -> bool {
        let _ = self.progress(Instant::now());
        self.done.contains_key(&tag)
    }

    /// Sends SRP_I_LOGOUT and disconnects.
    pub fn logout(mut self) -> Result<(), InitError> {
        if self.closed.is_none() {
            let tag = self.next_tag;
            self.send_iu(&iu::i_logout(tag))?;
            // Let the SEND complete before the disconnect.
            let deadline = Instant::now() + self.cfg.timeout;
            while !self.send_pending.is_empty() && self.closed.is_none() {
                if self.progress(deadline).is_err() {
                    break;
                }
            }
        }
        self.qp.disconnect();
        Ok(())
    }

    /// Waits (until `deadline`) for completions and handles them.
    pub fn progress(&mut self, deadline: Instant) -> Result<(), InitError> {
        let mut wcs = Vec::new();
        if self.cq.poll_cq(&mut wcs) == 0 {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(InitError::Timeout);
            }
            self.cq.wait(left.min(Duration::from_millis(20)));
            self.cq.poll_cq(&mut wcs);
        }
        if wcs.is_empty() && self.qp.poll_event().is_some() {
            self.closed.get_or_insert(None);
        }
        for wc in wcs {
            self.completion(&wc)?;
        }
        Ok(())
    }

    fn completion(&mut self, wc: &WorkCompletion) -> Result<(), InitError> {
        if wc.wr_id & RECV_BIT == 0 {
            if let Some(slot) = self.send_pending.remove(&wc.wr_id) {
                self.free_send.push(slot);
            }
            if wc.status != WcStatus::Success {
                self.closed.get_or_insert(None);
                return Err(InitError::Completion(wc.status));
            }
            return Ok(());
        }
        if wc.status != WcStatus::Success {
            self.closed.get_or_insert(None);
            return Ok(());
        }
        let slot = (wc.wr_id & !RECV_BIT) as usize;
        let mut b = vec![0u8; wc.byte_len as usize];
        if let Some(mr) = self.recv.get(slot) {
            mr.read_at(0, &mut b);
        }
        post_recv(&*self.qp, &self.recv, slot)?;
        match iu::iu_type(&b) {
            Some(IuType::RSP) => {
                let rsp = iu::Rsp::parse(&b)?;
                self.credits += rsp.req_lim_delta;
                self.done.insert(rsp.tag, rsp);
            }
            Some(IuType::CRED_REQ) => {
                let c = iu::CredReq::parse(&b)?;
                self.credits += c.req_lim_delta;
                self.cred_reqs += 1;
                self.send_iu(&iu::simple_rsp(IuType::CRED_RSP, c.tag))?;
            }
            Some(IuType::AER_REQ) => {
                let a = iu::AerReq::parse(&b)?;
                self.credits += a.req_lim_delta;
                let tag = a.tag;
                self.aens.push(a);
                self.send_iu(&iu::simple_rsp(IuType::AER_RSP, tag))?;
            }
            Some(IuType::T_LOGOUT) => {
                let r = iu::t_logout_reason(&b).unwrap_or(TLogoutReason::NO_REASON);
                self.closed = Some(Some(r.0));
            }
            _ => {
                return Err(InitError::Iu(iu::IuError::WrongType(
                    b.first().copied().unwrap_or(0),
                )));
            }
        }
        Ok(())
    }
}

/// Connects over the soft provider: registers and posts the receive ring,
/// connects with SRP_LOGIN_REQ as private data and wraps the result.
pub fn connect_soft(
    pd: &ferrite_rdma::soft::SoftPd,
    cq: &ferrite_rdma::soft::SoftCq,
    addr: &ferrite_rdma::soft::SoftAddr,
    cfg: InitiatorConfig,
) -> Result<Initiator, InitError> {
    use ferrite_rdma::soft::{QpAttrs, SoftQp};
    let qp = SoftQp::create(pd, cq, cq, None, QpAttrs::default());
    let ring = recv_ring(pd, &cfg)?;
    for slot in 0..ring.len() {
        post_recv(&qp, &ring, slot)?;
    }
    let rsp = match qp.connect(addr, &cfg.login_private_data(), cfg.timeout) {
        Ok(r) => r,
        Err(RdmaError::Rejected { private_data }) => {
            let reason = iu::LoginRej::parse(&private_data).map_or(0, |r| r.reason.0);
            return Err(InitError::LoginRejected(reason));
        }
        Err(e) => return Err(e.into()),
    };
    Initiator::new(
        Box::new(qp),
        Box::new(cq.clone()),
        Box::new(pd.clone()),
        cfg,
        ring,
        &rsp,
    )
}

/// Connects over the `verbs` provider (RDMA CM): like [`connect_soft`], with
/// the RDMA CM login layout whatever `cfg.login_layout` says. `pd`
/// and `cq` must come from the RDMA CM device context that routes to `addr`
/// (`ferrite_rdma::verbs::Context::cm_devices`).
#[cfg(feature = "verbs")]
pub fn connect_verbs(
    pd: &ferrite_rdma::verbs::VerbsPd,
    cq: &ferrite_rdma::verbs::VerbsCq,
    addr: &std::net::SocketAddr,
    cfg: InitiatorConfig,
) -> Result<Initiator, InitError> {
    use ferrite_rdma::verbs::{VerbsQp, VerbsQpAttrs};
    let ring = recv_ring(pd, &cfg)?;
    let recvs: Vec<RecvWr> = ring
        .iter()
        .enumerate()
        .map(|(slot, mr)| RecvWr {
            wr_id: RECV_BIT | slot as u64,
            sges: mr.sges(0, mr.len()).unwrap_or_default(),
        })
        .collect();
    let attrs = VerbsQpAttrs {
        max_recv_wr: cfg.recv_count.max(1),
        ..VerbsQpAttrs::default()
    };
    // RDMA CM on InfiniBand and RoCE carries 56 bytes of private data: the
    // layout Linux sends there.
    let login = cfg.login_req().encode_rdma_cm();
    let (qp, rsp) = match VerbsQp::connect(addr, pd, cq, cq, attrs, &recvs, &login, cfg.timeout) {
        Ok(r) => r,
        Err(RdmaError::Rejected { private_data }) => {
            let reason = iu::LoginRej::parse(&private_data).map_or(0, |r| r.reason.0);
            return Err(InitError::LoginRejected(reason));
        }
        Err(e) => return Err(e.into()),
    };
    Initiator::new(
        Box::new(qp),
        Box::new(cq.clone()),
        Box::new(pd.clone()),
        cfg,
        ring,
        &rsp,
    )
}
