//! iSER connections end to end over the soft RDMA provider, in one
//! process: a test initiator (its own queue pair, memory registrations and
//! Sends) against [`IserQp`] and [`IserConn`], with a stand-in for the
//! core that answers commands at once (or holds them).

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use ferrite_core::{Action, CmdId, Response, TaskTag, TmfId, TmfResponse};
use ferrite_iscsi::chap::ChapAuth;
use ferrite_iscsi::conn::ConnEvent;
use ferrite_iscsi::keys::{encode_text, parse_text};
use ferrite_iscsi::pdu::{BHS_LEN, BhsBuf, Opcode, RESERVED_TAG, flags, tmf_fn};
use ferrite_iscsi::{CloseReason, Conn, IscsiConfig, IscsiTarget};
use ferrite_rdma::soft::{
    QpAttrs, SoftAddr, SoftCq, SoftDevice, SoftListener, SoftMr, SoftPd, SoftQp, connect_qp,
};
use ferrite_rdma::{
    Access, CompletionQueue, MemoryRegion, QueuePair, RecvWr, SendOp, SendWr, WcOpcode, WcStatus,
    WorkCompletion,
};
use ferrite_reactor::buf::SgList;

use crate::cm::{CmReply, CmRequest};
use crate::conn::IserConn;
use crate::datamover::IserDatamover;
use crate::header::{HEADER_LEN, Header, Remote, recv_size};
use crate::qp::{IserQp, QpBuffers};

const TARGET: &str = "iqn.2026-12.test:iser";
/// Receive buffers each side posts.
const RECVS: u32 = 16;
const WAIT: Duration = Duration::from_secs(10);

fn unix_addr() -> SoftAddr {
    static N: AtomicU32 = AtomicU32::new(0);
    let p = std::env::temp_dir().join(format!(
        "fiser-{}-{}.sock",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_file(&p);
    SoftAddr::Unix(p)
}

fn config(max_recv: u32) -> Arc<IscsiConfig> {
    Arc::new(IscsiConfig {
        targets: vec![IscsiTarget {
            name: TARGET.into(),
            alias: None,
            tpgt: 1,
            portals: vec![],
            auth: ChapAuth::default(),
        }],
        max_recv_data_segment_length: max_recv,
        nop_in_interval: None,
        ..IscsiConfig::default()
    })
}

/// What the stand-in core saw.
#[derive(Debug, Default)]
struct Core {
    /// Leave commands unanswered.
    hold: bool,
    /// Commands held, in arrival order.
    held: Vec<ferrite_core::CmdRequest>,
    /// Write data the core received, by tag.
    written: Vec<(u64, Vec<u8>)>,
    closed: Option<CloseReason>,
}

/// The read data of a READ with tag `tag`.
fn pattern(tag: u64, len: usize) -> Vec<u8> {
    (0..len).map(|i| (i as u64 * 7 + tag) as u8).collect()
}

/// What the core does with a command: fetch a WRITE's data, answer a
/// READ with [`pattern`], anything else with GOOD.
fn answer(req: ferrite_core::CmdRequest) -> Action {
    let id = CmdId(req.tag.0 as u32);
    let len = req.expected_len as usize;
    match req.cdb.as_slice().first() {
        Some(0x2a) => Action::FetchData {
            id,
            tag: req.tag,
            buf: SgList::zeroed(len),
            offset: 0,
            len: len as u32,
        },
        Some(0x28) => Action::Respond {
            id,
            tag: req.tag,
            rsp: Response {
                data: Some(SgList::from(ferrite_reactor::buf::IoBuf::from_slice(
                    &pattern(req.tag.0, len),
                ))),
                data_len: len as u32,
                ..Response::good()
            },
        },
        _ => Action::Respond {
            id,
            tag: req.tag,
            rsp: Response::good(),
        },
    }
}

impl Core {
    /// Answers the held commands.
    fn release(&mut self, c: &mut Conn<IserDatamover>, now: Instant) {
        self.hold = false;
        for req in std::mem::take(&mut self.held) {
            c.handle_action(now, answer(req));
        }
        self.run(c, now);
    }

    /// Answers every event of `c` until it is quiet.
    fn run(&mut self, c: &mut Conn<IserDatamover>, now: Instant) {
        while let Some(ev) = c.poll_event() {
            let action = match ev {
                ConnEvent::SessionRequest { .. } => {
                    c.accept_session(0x1234);
                    None
                }
                ConnEvent::Command(req) if self.hold => {
                    self.held.push(req);
                    None
                }
                ConnEvent::Command(req) => Some(answer(req)),
                ConnEvent::DataOutDone { id, data } => {
                    if let Ok(sg) = data {
                        self.written.push((u64::from(id.0), sg.to_vec()));
                    }
                    Some(Action::Respond {
                        id,
                        tag: TaskTag(u64::from(id.0)),
                        rsp: Response::good(),
                    })
                }
                ConnEvent::TaskMgmt(req) => Some(Action::TmfDone {
                    id: TmfId(1),
                    tag: req.tag,
                    rsp: TmfResponse::Complete,
                }),
                ConnEvent::Closed { reason } => {
                    self.closed = Some(reason);
                    None
                }
                _ => None,
            };
            if let Some(a) = action {
                c.handle_action(now, a);
            }
        }
    }
}

/// The target end of one connection.
struct Target {
    qp: IserQp,
    cq: SoftCq,
    core: Core,
}

impl Target {
    /// One turn of the driver: completions, connection events, the core,
    /// posting.
    fn turn(&mut self) {
        let now = Instant::now();
        let mut wcs = Vec::new();
        self.cq.poll_cq(&mut wcs);
        for wc in &wcs {
            self.qp.handle_completion(now, wc);
        }
        self.qp.poll_conn_events(now);
        self.core.run(self.qp.conn_mut().conn_mut(), now);
        self.qp.pump();
    }

    fn closed(&self) -> Option<CloseReason> {
        self.core.closed
    }

    /// Turns until the connection is closed.
    fn wait_closed(&mut self) -> CloseReason {
        let deadline = Instant::now() + WAIT;
        while Instant::now() < deadline {
            self.turn();
            if let Some(r) = self.closed() {
                return r;
            }
            self.cq.wait(Duration::from_millis(5));
        }
        panic!("the connection did not close");
    }
}

/// One received Send at the initiator.
#[derive(Debug)]
struct Msg {
    bytes: Vec<u8>,
    invalidated: Option<u32>,
}

impl Msg {
    fn opcode(&self) -> u8 {
        self.bytes[HEADER_LEN] & 0x3f
    }
    fn bhs(&self) -> &[u8] {
        &self.bytes[HEADER_LEN..HEADER_LEN + BHS_LEN]
    }
    fn itt(&self) -> u32 {
        let b = self.bhs();
        u32::from_be_bytes([b[16], b[17], b[18], b[19]])
    }
    fn data(&self) -> &[u8] {
        &self.bytes[HEADER_LEN + BHS_LEN..]
    }
}

/// The test initiator of one connection.
struct Ini {
    _dev: SoftDevice,
    pd: SoftPd,
    cq: SoftCq,
    qp: SoftQp,
    recv: Vec<SoftMr>,
    send: SoftMr,
    next_wr: u64,
    got: VecDeque<Msg>,
    cmd_sn: u32,
}

const INI_RECV_LEN: usize = 64 * 1024;
const SEND_SLOTS: u64 = 16;
const SEND_SLOT: u64 = 16 * 1024;

impl Ini {
    /// Sends one raw message (iSER header and PDU).
    fn send_raw(&mut self, msg: &[u8]) {
        // A ring of send buffers: a Send not yet carried out keeps its own.
        self.next_wr += 1;
        let at = (self.next_wr % SEND_SLOTS) * SEND_SLOT;
        self.send.write_at(at, msg);
        let wr = SendWr {
            wr_id: self.next_wr,
            op: SendOp::Send,
            sges: self.send.sges(at, msg.len() as u64).expect("send buffer"),
            signaled: true,
        };
        self.qp.post_send(&wr).expect("post send");
    }

    /// Sends a PDU behind iSER header `h`.
    fn send(&mut self, h: Header, bhs: &BhsBuf, data: &[u8]) {
        let mut b = *bhs;
        b.set_data_len(data.len() as u32);
        let mut msg = h.encode().to_vec();
        msg.extend_from_slice(&b.0);
        msg.extend_from_slice(data);
        self.send_raw(&msg);
    }

    fn next_cmd_sn(&mut self) -> u32 {
        let sn = self.cmd_sn;
        self.cmd_sn += 1;
        sn
    }

    fn poll(&mut self) -> Vec<WorkCompletion> {
        let mut wcs = Vec::new();
        self.cq.poll_cq(&mut wcs);
        for wc in &wcs {
            if wc.opcode == WcOpcode::Recv && wc.status == WcStatus::Success {
                let slot = wc.wr_id as usize;
                let mut bytes = vec![0u8; wc.byte_len as usize];
                self.recv[slot].read_at(0, &mut bytes);
                self.got.push_back(Msg {
                    bytes,
                    invalidated: wc.invalidated_rkey,
                });
                let wr = RecvWr {
                    wr_id: slot as u64,
                    sges: self.recv[slot].sges(0, INI_RECV_LEN as u64).expect("recv"),
                };
                self.qp.post_recv(&wr).expect("repost");
            }
        }
        wcs
    }

    /// The next message from the target, turning `t` meanwhile.
    fn wait_msg(&mut self, t: &mut Target) -> Msg {
        let deadline = Instant::now() + WAIT;
        while Instant::now() < deadline {
            t.turn();
            self.poll();
            if let Some(m) = self.got.pop_front() {
                return m;
            }
            self.cq.wait(Duration::from_millis(2));
        }
        panic!("no message from the target (closed: {:?})", t.closed());
    }

    /// Registers `len` bytes holding `fill` with `access`: the STag and
    /// base offset of a command's buffer.
    fn buffer(&self, fill: &[u8], access: Access) -> (SoftMr, Remote) {
        let mut mr = self
            .pd
            .reg_sg(SgList::zeroed(fill.len()), access | Access::LOCAL_WRITE)
            .expect("register");
        mr.write_at(0, fill);
        let s = mr.segs()[0];
        (
            mr,
            Remote {
                stag: s.rkey,
                base: s.addr,
            },
        )
    }
}

/// A listener with the target side of each connection made on it.
struct Portal {
    listener: SoftListener,
    _dev: SoftDevice,
    /// One protection domain for every connection, as the driver has per
    /// core and device (buffers given back are registered in it).
    pd: SoftPd,
    cfg: Arc<IscsiConfig>,
}

impl Portal {
    fn new(max_recv: u32) -> Portal {
        let dev = SoftDevice::new("target");
        Portal {
            listener: SoftListener::bind(&unix_addr()).expect("bind"),
            pd: dev.alloc_pd(),
            _dev: dev,
            cfg: config(max_recv),
        }
    }

    /// Connects an initiator whose CM request is `req`; returns both ends
    /// and the target's CM reply.
    fn connect(&self, req: CmRequest) -> (Ini, Target, CmReply) {
        self.connect_with(req, None)
    }

    /// [`Portal::connect`], the target's buffers `bufs` when given (those
    /// of an ended connection), new ones otherwise.
    fn connect_with(&self, req: CmRequest, bufs: Option<QpBuffers>) -> (Ini, Target, CmReply) {
        let idev = SoftDevice::new("ini");
        let ipd = idev.alloc_pd();
        let icq = SoftCq::new().expect("cq");
        let recv: Vec<SoftMr> = (0..RECVS)
            .map(|_| {
                ipd.reg_zeroed(INI_RECV_LEN, Access::LOCAL_WRITE)
                    .expect("recv mr")
            })
            .collect();
        let wrs: Vec<RecvWr> = recv
            .iter()
            .enumerate()
            .map(|(i, m)| RecvWr {
                wr_id: i as u64,
                sges: m.sges(0, INI_RECV_LEN as u64).expect("sges"),
            })
            .collect();
        let addr = self.listener.addr().clone();
        let (pd2, cq2) = (ipd.clone(), icq.clone());
        let h = thread::spawn(move || {
            connect_qp(&pd2, &cq2, QpAttrs::default(), &addr, &req.encode(), &wrs)
        });
        let creq = self
            .listener
            .wait_request(WAIT)
            .expect("connection request");
        let cm = CmRequest::parse(creq.private_data()).expect("iSER CM REQ");
        assert_eq!(cm, req);
        let reply = CmReply::to(&cm, true);
        let pd = self.pd.clone();
        let cq = SoftCq::new().expect("cq");
        let qp = SoftQp::create(&pd, &cq, &cq, None, QpAttrs::default());
        let bufs = bufs.unwrap_or_else(|| {
            QpBuffers::new(&pd, RECVS, self.cfg.rdma_recv_data_segment_length()).expect("buffers")
        });
        bufs.post_all(&qp).expect("post recvs");
        qp.accept(creq, &reply.encode()).expect("accept");
        let (iqp, rep) = h.join().expect("connect thread").expect("connect");
        assert_eq!(CmReply::parse(&rep), Ok(reply));
        let addr: SocketAddr = "192.0.2.1:3260".parse().expect("addr");
        let conn = IserConn::new(Instant::now(), self.cfg.clone(), addr, addr, 7, &cm, RECVS);
        let tqp = IserQp::new(conn, Box::new(qp), Box::new(pd), bufs, 16);
        let send = ipd
            .reg_zeroed((SEND_SLOTS * SEND_SLOT) as usize, Access::LOCAL_WRITE)
            .expect("send mr");
        let ini = Ini {
            _dev: idev,
            pd: ipd,
            cq: icq,
            qp: iqp,
            recv,
            send,
            next_wr: 0,
            got: VecDeque::new(),
            cmd_sn: 10,
        };
        let t = Target {
            qp: tqp,
            cq,
            core: Core::default(),
        };
        (ini, t, reply)
    }
}

/// Logs in with `extra` keys besides the names and RDMAExtensions=Yes;
/// returns the keys of the Login Response.
fn login(i: &mut Ini, t: &mut Target, extra: &[(&str, &str)]) -> Vec<(String, String)> {
    let mut b = BhsBuf::new(Opcode::LOGIN_REQ, flags::T | (1 << 2) | 3);
    b.set_immediate();
    b.0[8..14].copy_from_slice(&[0x80, 0, 0, 0, 0, 1]);
    b.set_itt(1).set_u32(24, i.cmd_sn);
    let mut keys = vec![
        ("InitiatorName", "iqn.2026-12.test:ini"),
        ("TargetName", TARGET),
        ("SessionType", "Normal"),
        ("RDMAExtensions", "Yes"),
    ];
    keys.extend_from_slice(extra);
    i.send(Header::default(), &b, &encode_text(&keys));
    let rsp = i.wait_msg(t);
    assert_eq!(rsp.opcode(), Opcode::LOGIN_RSP.0, "{rsp:?}");
    assert_eq!(&rsp.bhs()[36..38], &[0, 0], "login status");
    assert_eq!(rsp.bhs()[1] & 0x83, 0x83, "T set, full feature phase next");
    assert!(t.qp.conn().conn().is_full_feature());
    parse_text(rsp.data())
        .expect("login keys")
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn key<'a>(keys: &'a [(String, String)], k: &str) -> Option<&'a str> {
    keys.iter().find(|(kk, _)| kk == k).map(|(_, v)| v.as_str())
}

fn logged_in(p: &Portal, req: CmRequest) -> (Ini, Target) {
    let (mut i, mut t, _) = p.connect(req);
    login(
        &mut i,
        &mut t,
        &[
            ("TargetRecvDataSegmentLength", "8192"),
            ("InitiatorRecvDataSegmentLength", "8192"),
        ],
    );
    (i, t)
}

const VA: CmRequest = CmRequest {
    zero_based: false,
    send_invalidate: true,
};
const NO_INV: CmRequest = CmRequest {
    zero_based: false,
    send_invalidate: false,
};

/// A SCSI command header: `cdb0` (WRITE(10) 0x2a, READ(10) 0x28, TEST UNIT
/// READY 0), `edtl` bytes, R or W by the opcode.
fn scsi_cmd(i: &mut Ini, itt: u32, cdb0: u8, edtl: u32) -> BhsBuf {
    let dir = match cdb0 {
        0x2a => flags::W,
        0x28 => flags::R,
        _ => 0,
    };
    let mut b = BhsBuf::new(Opcode::SCSI_CMD, flags::F | dir | 1);
    let sn = i.next_cmd_sn();
    b.set_itt(itt).set_u32(20, edtl).set_u32(24, sn);
    b.0[32] = cdb0;
    b
}

/// The SCSI Response's status byte, after checking it answers `itt`.
fn status_of(m: &Msg, itt: u32) -> u8 {
    assert_eq!(m.opcode(), Opcode::SCSI_RSP.0, "{m:?}");
    assert_eq!(m.itt(), itt);
    m.bhs()[3]
}

fn nop(i: &mut Ini, t: &mut Target, itt: u32, data: &[u8]) {
    let mut b = BhsBuf::new(Opcode::NOP_OUT, flags::F);
    b.set_immediate()
        .set_itt(itt)
        .set_word20(RESERVED_TAG)
        .set_u32(24, i.cmd_sn);
    i.send(Header::default(), &b, data);
    let m = i.wait_msg(t);
    assert_eq!(m.opcode(), Opcode::NOP_IN.0, "{m:?}");
    assert_eq!(m.itt(), itt);
    assert_eq!(m.data(), data, "the NOP-In echoes the ping data");
}

#[test]
fn login_over_sends_negotiates_rdma_extensions() {
    let p = Portal::new(8192);
    let (mut i, mut t, reply) = p.connect(VA);
    assert!(reply.send_invalidate && !reply.zero_based);
    let keys = login(
        &mut i,
        &mut t,
        &[
            ("TargetRecvDataSegmentLength", "8192"),
            ("InitiatorRecvDataSegmentLength", "16384"),
            ("MaxOutstandingUnexpectedPDUs", "64"),
            ("HeaderDigest", "None"),
        ],
    );
    assert_eq!(key(&keys, "RDMAExtensions"), Some("Yes"));
    assert_eq!(key(&keys, "HeaderDigest"), Some("None"));
    assert_eq!(key(&keys, "TargetRecvDataSegmentLength"), Some("8192"));
    // The target takes no more unexpected PDUs than it posts receives.
    assert_eq!(
        key(&keys, "MaxOutstandingUnexpectedPDUs"),
        Some(RECVS.to_string().as_str())
    );
    let c = t.qp.conn().conn();
    assert!(c.params().rdma_extensions);
    assert_eq!(c.params().max_xmit_data_segment_length, 16384);
    let dm = c.datamover();
    assert_eq!(dm.recv_limit(), recv_size(8192));
    assert_eq!(dm.unexpected_limit(), RECVS as usize);
    assert!(dm.sends_with_invalidate());
    nop(&mut i, &mut t, 0x77, b"ping");
}

#[test]
fn a_write_with_immediate_data() {
    let p = Portal::new(8192);
    let (mut i, mut t) = logged_in(&p, VA);
    let data = pattern(3, 4096);
    let b = scsi_cmd(&mut i, 0x10, 0x2a, 4096);
    i.send(Header::default(), &b, &data);
    let m = i.wait_msg(&mut t);
    assert_eq!(status_of(&m, 0x10), 0);
    // No STag was advertised: a plain Send.
    assert_eq!(m.invalidated, None);
    assert_eq!(t.core.written, vec![(0x10, data)]);
}

#[test]
fn a_write_solicited_by_rdma_read_and_status_with_invalidate() {
    let p = Portal::new(8192);
    let (mut i, mut t) = logged_in(&p, VA);
    // 4 KiB immediate, the other 12 KiB read from the initiator's buffer
    // from offset 4096 on, where the Write Base Offset points.
    let data = pattern(5, 16384);
    let (_mr, read) = i.buffer(&data, Access::REMOTE_READ);
    let b = scsi_cmd(&mut i, 0x11, 0x2a, 16384);
    let h = Header {
        write: Some(Remote {
            base: read.base + 4096,
            ..read
        }),
        read: None,
    };
    i.send(h, &b, &data[..4096]);
    let m = i.wait_msg(&mut t);
    assert_eq!(status_of(&m, 0x11), 0);
    assert_eq!(m.invalidated, Some(read.stag));
    assert_eq!(t.core.written, vec![(0x11, data)]);
    // Nothing else came: no R2T on the wire.
    i.poll();
    assert!(i.got.is_empty(), "{:?}", i.got);
}

#[test]
fn a_read_by_rdma_write_and_status_in_a_send() {
    let p = Portal::new(8192);
    for (req, inv) in [(VA, true), (NO_INV, false)] {
        let (mut i, mut t) = logged_in(&p, req);
        let (mr, write) = i.buffer(&[0u8; 12288], Access::REMOTE_WRITE);
        let b = scsi_cmd(&mut i, 0x20, 0x28, 12288);
        let h = Header {
            write: None,
            read: Some(write),
        };
        i.send(h, &b, &[]);
        let m = i.wait_msg(&mut t);
        assert_eq!(status_of(&m, 0x20), 0);
        // The data is in the initiator's buffer before the status.
        let mut got = vec![0u8; 12288];
        mr.read_at(0, &mut got);
        assert_eq!(got, pattern(0x20, 12288));
        let want = inv.then_some(write.stag);
        assert_eq!(m.invalidated, want, "send with invalidate: {inv}");
        i.poll();
        assert!(i.got.is_empty(), "no Data-In PDU: {:?}", i.got);
    }
}

#[test]
fn task_management_and_nop() {
    let p = Portal::new(8192);
    let (mut i, mut t) = logged_in(&p, VA);
    let mut b = BhsBuf::new(Opcode::TMF_REQ, flags::F | tmf_fn::LUN_RESET);
    b.set_immediate()
        .set_itt(0x40)
        .set_word20(RESERVED_TAG)
        .set_u32(24, i.cmd_sn);
    i.send(Header::default(), &b, &[]);
    let m = i.wait_msg(&mut t);
    assert_eq!(m.opcode(), Opcode::TMF_RSP.0);
    assert_eq!((m.itt(), m.bhs()[2]), (0x40, 0), "function complete");
    nop(&mut i, &mut t, 0x41, &[]);
    nop(&mut i, &mut t, 0x42, &[9; 100]);
    assert_eq!(
        t.qp.conn().conn().datamover().unexpected_outstanding(),
        0,
        "every unexpected PDU was answered"
    );
}

/// Bad input on one connection closes it, and only it: the other
/// connection of the portal answers a NOP after each.
#[test]
fn bad_input_closes_that_connection_only() {
    // Receive buffers for 16 KiB of data segment, TargetRecvDataSegmentLength
    // 8192: a Send between the two fits the buffer but not the limit.
    let p = Portal::new(16384);
    let (mut good, mut gt) = logged_in(&p, VA);
    type Bad = fn(&mut Ini);
    let cases: [(&str, Bad); 5] = [
        ("oversized Send", |i| {
            let mut b = BhsBuf::new(Opcode::NOP_OUT, flags::F);
            b.set_immediate().set_itt(1).set_word20(RESERVED_TAG);
            i.send(Header::default(), &b, &[0u8; 12000]);
        }),
        ("bad iSER opcode", |i| {
            let mut msg = vec![0u8; HEADER_LEN + BHS_LEN];
            msg[0] = 0x40;
            i.send_raw(&msg);
        }),
        ("Hello", |i| {
            let mut msg = vec![0u8; HEADER_LEN + BHS_LEN];
            msg[0] = 0x20;
            msg[1] = 0x10;
            i.send_raw(&msg);
        }),
        ("truncated PDU", |i| {
            let mut b = BhsBuf::new(Opcode::NOP_OUT, flags::F);
            b.set_immediate().set_itt(1).set_word20(RESERVED_TAG);
            b.set_data_len(100);
            let mut msg = Header::default().encode().to_vec();
            msg.extend_from_slice(&b.0);
            msg.extend_from_slice(&[0; 10]);
            i.send_raw(&msg);
        }),
        ("solicited Data-Out", |i| {
            let mut b = BhsBuf::new(Opcode::DATA_OUT, flags::F);
            b.set_itt(1).set_word20(5);
            i.send(Header::default(), &b, &[0; 512]);
        }),
    ];
    for (name, bad) in cases {
        let (mut i, mut t) = logged_in(&p, VA);
        bad(&mut i);
        assert_eq!(t.wait_closed(), CloseReason::ProtocolError, "{name}");
        nop(&mut good, &mut gt, 0x50, name.as_bytes());
        assert!(gt.closed().is_none());
    }

    // RDMA READ of solicited data under an STag the initiator does not
    // have: the READ completes in error.
    let (mut i, mut t) = logged_in(&p, VA);
    let b = scsi_cmd(&mut i, 0x30, 0x2a, 8192);
    let bogus = Remote {
        stag: 0x8000_7777,
        base: 0x1000,
    };
    i.send(
        Header {
            write: Some(bogus),
            read: None,
        },
        &b,
        &[],
    );
    assert_eq!(t.wait_closed(), CloseReason::ProtocolError, "RDMA READ");
    assert!(t.core.written.is_empty());
    nop(&mut good, &mut gt, 0x51, b"read");

    // RDMA WRITE of read data to a bad STag.
    let (mut i, mut t) = logged_in(&p, VA);
    let b = scsi_cmd(&mut i, 0x31, 0x28, 8192);
    i.send(
        Header {
            write: None,
            read: Some(bogus),
        },
        &b,
        &[],
    );
    assert_eq!(t.wait_closed(), CloseReason::ProtocolError, "RDMA WRITE");
    nop(&mut good, &mut gt, 0x52, b"write");

    // A read command without a Read STag: nowhere to put the data.
    let (mut i, mut t) = logged_in(&p, VA);
    let b = scsi_cmd(&mut i, 0x32, 0x28, 4096);
    i.send(Header::default(), &b, &[]);
    assert_eq!(t.wait_closed(), CloseReason::ProtocolError, "no STag");
    nop(&mut good, &mut gt, 0x53, b"stag");
}

#[test]
fn more_unexpected_pdus_than_allowed_close_the_connection() {
    let p = Portal::new(8192);
    let (mut i, mut t, _) = p.connect(VA);
    login(
        &mut i,
        &mut t,
        &[
            ("TargetRecvDataSegmentLength", "8192"),
            ("MaxOutstandingUnexpectedPDUs", "2"),
        ],
    );
    assert_eq!(t.qp.conn().conn().datamover().unexpected_limit(), 2);
    // The core holds the commands: each stays outstanding.
    t.core.hold = true;
    for itt in [1, 2] {
        let b = scsi_cmd(&mut i, itt, 0, 0);
        i.send(Header::default(), &b, &[]);
    }
    let deadline = Instant::now() + WAIT;
    while t.qp.conn().conn().datamover().unexpected_outstanding() < 2 {
        assert!(Instant::now() < deadline, "commands did not arrive");
        t.turn();
        t.cq.wait(Duration::from_millis(2));
    }
    assert!(t.closed().is_none(), "two are allowed");
    let b = scsi_cmd(&mut i, 3, 0, 0);
    i.send(Header::default(), &b, &[]);
    assert_eq!(t.wait_closed(), CloseReason::ProtocolError);
}

/// Commands ended by task management get no SCSI Response; they stop
/// counting as outstanding unexpected PDUs, and a later command is not
/// refused for them.
#[test]
fn aborted_commands_stop_counting_as_outstanding() {
    let p = Portal::new(8192);
    let (mut i, mut t, _) = p.connect(VA);
    login(&mut i, &mut t, &[("MaxOutstandingUnexpectedPDUs", "2")]);
    t.core.hold = true;
    let b = scsi_cmd(&mut i, 1, 0, 0);
    i.send(Header::default(), &b, &[]);
    // LUN RESET: the core completes it, and the held command with it.
    let mut r = BhsBuf::new(Opcode::TMF_REQ, flags::F | tmf_fn::LUN_RESET);
    r.set_immediate()
        .set_itt(0x40)
        .set_word20(RESERVED_TAG)
        .set_u32(24, i.cmd_sn);
    i.send(Header::default(), &r, &[]);
    let m = i.wait_msg(&mut t);
    assert_eq!(m.opcode(), Opcode::TMF_RSP.0);
    // Two more held commands: the aborted one no longer counts.
    for itt in [2, 3] {
        let b = scsi_cmd(&mut i, itt, 0, 0);
        i.send(Header::default(), &b, &[]);
    }
    let deadline = Instant::now() + WAIT;
    while t.qp.conn().conn().session_seq().task_owner(3).is_none() {
        assert!(Instant::now() < deadline, "commands did not arrive");
        assert!(t.closed().is_none(), "refused for an aborted command");
        t.turn();
        t.cq.wait(Duration::from_millis(2));
    }
    assert!(t.closed().is_none());
    assert_eq!(t.qp.conn().conn().datamover().unexpected_outstanding(), 2);
}

/// A logout: the Logout Response goes out as a Send, then the target
/// disconnects and the connection is finished.
#[test]
fn logout_then_disconnect() {
    let p = Portal::new(8192);
    let (mut i, mut t) = logged_in(&p, VA);
    let mut b = BhsBuf::new(Opcode::LOGOUT_REQ, flags::F);
    b.set_immediate().set_itt(0x60).set_u32(24, i.cmd_sn);
    i.send(Header::default(), &b, &[]);
    let m = i.wait_msg(&mut t);
    assert_eq!(m.opcode(), Opcode::LOGOUT_RSP.0);
    assert_eq!((m.itt(), m.bhs()[2]), (0x60, 0), "closed successfully");
    assert_eq!(t.wait_closed(), CloseReason::Logout);
    let deadline = Instant::now() + WAIT;
    while !t.qp.finished() || i.qp.state() != ferrite_rdma::QpState::Error {
        assert!(Instant::now() < deadline, "no disconnect after the logout");
        t.turn();
        i.poll();
        t.cq.wait(Duration::from_millis(2));
    }
}

/// The buffers of a connection that logged out serve the next one: its
/// receives and sends work and carry that connection's data, not the
/// last one's.
#[test]
fn an_ended_connections_buffers_serve_the_next_one() {
    let p = Portal::new(8192);
    let (mut i, mut t) = logged_in(&p, VA);
    let first = pattern(5, 4096);
    let b = scsi_cmd(&mut i, 0x10, 0x2a, 4096);
    i.send(Header::default(), &b, &first);
    assert_eq!(status_of(&i.wait_msg(&mut t), 0x10), 0);
    let mut b = BhsBuf::new(Opcode::LOGOUT_REQ, flags::F);
    b.set_immediate().set_itt(0x60).set_u32(24, i.cmd_sn);
    i.send(Header::default(), &b, &[]);
    assert_eq!(i.wait_msg(&mut t).opcode(), Opcode::LOGOUT_RSP.0);
    assert_eq!(t.wait_closed(), CloseReason::Logout);
    let deadline = Instant::now() + WAIT;
    while !t.qp.finished() {
        assert!(Instant::now() < deadline, "the connection never finished");
        t.turn();
        i.poll();
        t.cq.wait(Duration::from_millis(2));
    }
    let bufs = t.qp.into_buffers();
    let len = p.cfg.rdma_recv_data_segment_length();
    assert!(bufs.fits(RECVS, len));
    assert!(!bufs.fits(RECVS + 1, len));
    drop(i);

    let (mut i, mut t, _) = p.connect_with(NO_INV, Some(bufs));
    login(
        &mut i,
        &mut t,
        &[
            ("TargetRecvDataSegmentLength", "8192"),
            ("InitiatorRecvDataSegmentLength", "8192"),
        ],
    );
    // More commands than receive buffers: every buffer is reposted and
    // used again on this connection.
    for n in 0..(RECVS + 8) {
        let data = pattern(100 + u64::from(n), 2048);
        let itt = 0x100 + n;
        let b = scsi_cmd(&mut i, itt, 0x2a, 2048);
        i.send(Header::default(), &b, &data);
        assert_eq!(status_of(&i.wait_msg(&mut t), itt), 0);
        assert_eq!(t.core.written.last(), Some(&(u64::from(itt), data)));
    }
    nop(&mut i, &mut t, 0x500, b"ping");
}

/// A SendTargets text request over iSER: the answer is one Send naming
/// the target.
#[test]
fn send_targets_over_sends() {
    let p = Portal::new(8192);
    let (mut i, mut t) = logged_in(&p, VA);
    let mut b = BhsBuf::new(Opcode::TEXT_REQ, flags::F);
    let sn = i.next_cmd_sn();
    b.set_itt(0x70).set_word20(RESERVED_TAG).set_u32(24, sn);
    i.send(
        Header::default(),
        &b,
        &encode_text(&[("SendTargets", "All")]),
    );
    let m = i.wait_msg(&mut t);
    assert_eq!(m.opcode(), Opcode::TEXT_RSP.0, "{m:?}");
    assert_eq!(m.itt(), 0x70);
    let keys = parse_text(m.data()).expect("text keys");
    assert!(keys.contains(&("TargetName", TARGET)), "{keys:?}");
    assert_eq!(t.qp.conn().conn().datamover().unexpected_outstanding(), 0);
}

/// The receive buffers a connection posts cover the command window and
/// the immediate PDUs beside it: an initiator using its whole window is
/// never over the limit.
#[test]
fn receives_cover_the_command_window() {
    let cfg = config(8192);
    let n = crate::conn::recv_count_for(&cfg);
    assert_eq!(n, cfg.queue_depth + crate::conn::IMMEDIATE_RESERVE);
    let addr: SocketAddr = "192.0.2.1:3260".parse().expect("addr");
    let mut c = IserConn::new(Instant::now(), cfg.clone(), addr, addr, 1, &VA, n);
    let mut b = BhsBuf::new(Opcode::LOGIN_REQ, flags::T | (1 << 2) | 3);
    b.set_immediate().set_u32(24, 10);
    let keys = encode_text(&[
        ("InitiatorName", "iqn.i"),
        ("TargetName", TARGET),
        ("RDMAExtensions", "Yes"),
    ]);
    b.set_data_len(keys.len() as u32);
    let mut msg = Header::default().encode().to_vec();
    msg.extend_from_slice(&b.0);
    msg.extend_from_slice(&keys);
    let now = Instant::now();
    c.recv(now, &msg);
    let mut core = Core {
        hold: true,
        ..Core::default()
    };
    core.run(c.conn_mut(), now);
    assert!(c.conn().is_full_feature());
    // The whole window of commands, held by the core, and a ping besides.
    for k in 0..cfg.queue_depth {
        let mut b = BhsBuf::new(Opcode::SCSI_CMD, flags::F | 1);
        b.set_itt(k).set_u32(24, 10 + k);
        let mut m = Header::default().encode().to_vec();
        m.extend_from_slice(&b.0);
        c.recv(now, &m);
        core.run(c.conn_mut(), now);
    }
    let mut p = BhsBuf::new(Opcode::NOP_OUT, flags::F);
    p.set_immediate().set_itt(0xaaaa).set_word20(RESERVED_TAG);
    let mut m = Header::default().encode().to_vec();
    m.extend_from_slice(&p.0);
    c.recv(now, &m);
    core.run(c.conn_mut(), now);
    assert!(core.closed.is_none());
    assert_eq!(
        c.conn().datamover().unexpected_outstanding(),
        cfg.queue_depth as usize,
        "the ping was answered, the commands are outstanding"
    );
}

/// A command reusing a live task's ITT is rejected, and its STags do not
/// replace the live task's: the read data goes where the first command
/// said.
#[test]
fn a_duplicate_itt_does_not_redirect_the_live_tasks_data() {
    let p = Portal::new(8192);
    let (mut i, mut t) = logged_in(&p, VA);
    let (first, w1) = i.buffer(&[0u8; 4096], Access::REMOTE_WRITE);
    let (second, w2) = i.buffer(&[0u8; 4096], Access::REMOTE_WRITE);
    t.core.hold = true;
    let b = scsi_cmd(&mut i, 0x21, 0x28, 4096);
    i.send(
        Header {
            write: None,
            read: Some(w1),
        },
        &b,
        &[],
    );
    let b = scsi_cmd(&mut i, 0x21, 0x28, 4096);
    i.send(
        Header {
            write: None,
            read: Some(w2),
        },
        &b,
        &[],
    );
    let m = i.wait_msg(&mut t);
    assert_eq!(m.opcode(), Opcode::REJECT.0, "{m:?}");
    t.core.release(t.qp.conn_mut().conn_mut(), Instant::now());
    let m = i.wait_msg(&mut t);
    assert_eq!(status_of(&m, 0x21), 0);
    assert_eq!(m.invalidated, Some(w1.stag));
    let mut got = vec![0u8; 4096];
    first.read_at(0, &mut got);
    assert_eq!(got, pattern(0x21, 4096));
    second.read_at(0, &mut got);
    assert!(
        got.iter().all(|&b| b == 0),
        "the duplicate's buffer was written"
    );
}
