//! In-memory scenarios: the crate's own [`Initiator`] against a [`Conn`],
//! with a virtual clock and a fake core (a RAM disk that answers READ(10),
//! WRITE(10) and TEST UNIT READY), bytes fed both ways without a socket.

use std::collections::{HashMap, VecDeque};
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ferrite_core::{
    Abort, Action, CmdId, CmdRequest, DataDir, DeliveryHold, PipeData, Response, TaskTag,
    TmfFunction, TmfId, TmfResponse,
};
use ferrite_reactor::buf::BufPool;
use ferrite_reactor::pipe::PipePool;
use ferrite_scsi::{Lun, Sense};
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::conn::{CloseReason, Conn, ConnEvent, IscsiConfig, IscsiTarget, TxQueue};
use crate::initiator::{Command, Initiator, InitiatorConfig, InitiatorError, Transport};
use crate::keys::encode_text;
use crate::pdu::{BhsBuf, CmdSn, LoginStatus, Opcode, Pdu, RESERVED_TAG, flags, tmf_fn, tmf_rsp};

const TARGET: &str = "iqn.2026-01.dev.ferrite:disk0";
const BS: usize = 512;

/// The core, reduced to what a connection needs to see.
struct FakeCore {
    disk: Vec<u8>,
    pool: BufPool,
    next_id: u32,
    writes: HashMap<CmdId, (TaskTag, usize)>,
    actions: VecDeque<Action>,
    events: Vec<String>,
    closed: Option<CloseReason>,
    reject_login: Option<LoginStatus>,
    commands: Vec<CmdRequest>,
    tmfs: Vec<TmfFunction>,
    data_errors: Vec<Abort>,
    /// Hold TMF answers (to test ordering with pending data).
    responses_sent: u32,
    /// Reads answered as pages in a pipe, with a range hold whose release
    /// is counted in `holds_released`.
    pipes: Option<PipePool>,
    holds_released: Arc<AtomicUsize>,
}

impl FakeCore {
    fn new() -> FakeCore {
        FakeCore {
            disk: vec![0; 4 << 20],
            pool: BufPool::new(64 * 1024, 64),
            next_id: 1,
            writes: HashMap::new(),
            actions: VecDeque::new(),
            events: Vec::new(),
            closed: None,
            reject_login: None,
            commands: Vec::new(),
            tmfs: Vec::new(),
            data_errors: Vec::new(),
            responses_sent: 0,
            pipes: None,
            holds_released: Arc::new(AtomicUsize::new(0)),
        }
    }

    fn event(&mut self, conn: &mut Conn, ev: ConnEvent) {
        match ev {
            ConnEvent::SessionRequest { .. } => match self.reject_login {
                Some(st) => conn.reject_session(st),
                None => conn.accept_session(0x0102),
            },
            ConnEvent::LoggedIn => self.events.push("logged-in".into()),
            ConnEvent::LoginFailed { status, .. } => self
                .events
                .push(format!("login-failed {}/{}", status.class, status.detail)),
            ConnEvent::Command(req) => self.command(req),
            ConnEvent::DataOutDone { id, data } => {
                let Some((tag, at)) = self.writes.remove(&id) else {
                    return;
                };
                let rsp = match data {
                    Ok(sg) => {
                        let v = sg.to_vec();
                        self.disk[at..at + v.len()].copy_from_slice(&v);
                        Response::good()
                    }
                    Err(e) => {
                        self.data_errors.push(e);
                        Response::check(Sense::PROTOCOL_SERVICE_CRC_ERROR)
                    }
                };
                self.actions.push_back(Action::Respond { id, tag, rsp });
            }
            ConnEvent::ResponseSent { .. } => self.responses_sent += 1,
            ConnEvent::TaskMgmt(req) => {
                self.tmfs.push(req.func);
                self.actions.push_back(Action::TmfDone {
                    id: TmfId(1),
                    tag: req.tag,
                    rsp: TmfResponse::Complete,
                });
            }
            ConnEvent::Closed { reason } => self.closed = Some(reason),
        }
    }

    fn command(&mut self, req: CmdRequest) {
        let id = CmdId(self.next_id);
        self.next_id += 1;
        let tag = req.tag;
        let cdb = req.cdb.clone();
        self.commands.push(req.clone());
        let lba = u32::from_be_bytes([cdb[2], cdb[3], cdb[4], cdb[5]]) as usize;
        let blocks = u16::from_be_bytes([cdb[7], cdb[8]]) as usize;
        let at = lba * BS;
        let len = blocks * BS;
        let rsp = match cdb[0] {
            0x00 => Response::good(),
            0x28 if at + len <= self.disk.len() && self.pipes.is_some() => {
                let Some(mut pipe) = self.pipes.as_ref().and_then(PipePool::get) else {
                    panic!("no pipe");
                };
                assert_eq!(pipe.fill(&self.disk[at..at + len]).unwrap(), len);
                let released = self.holds_released.clone();
                let hold = DeliveryHold::on_drop(move || {
                    released.fetch_add(1, Ordering::SeqCst);
                });
                Response {
                    data_len: len as u32,
                    pipe: Some(PipeData { pipe, hold }),
                    ..Response::good()
                }
            }
            0x28 if at + len <= self.disk.len() => {
                let mut sg = self.pool.sg(len);
                sg.copy_in(0, &self.disk[at..at + len]);
                let sent = len.min(req.expected_len as usize);
                Response {
                    data: Some(sg),
                    data_len: sent as u32,
                    residual: if (req.expected_len as usize) > len {
                        ferrite_core::Residual::Underflow(req.expected_len - len as u32)
                    } else {
                        ferrite_core::Residual::None
                    },
                    ..Response::good()
                }
            }
            0x2a if at + len <= self.disk.len() => {
                self.writes.insert(id, (tag, at));
                self.actions.push_back(Action::FetchData {
                    id,
                    tag,
                    buf: self.pool.sg(len),
                    offset: 0,
                    len: len as u32,
                });
                return;
            }
            0x28 | 0x2a => Response::check(Sense::LBA_OUT_OF_RANGE),
            _ => Response::check(Sense::INVALID_COMMAND_OPERATION_CODE),
        };
        self.actions.push_back(Action::Respond { id, tag, rsp });
    }
}

/// Both ends in memory.
struct Mem {
    conn: Conn,
    core: FakeCore,
    now: Instant,
    input: Vec<u8>,
    output: VecDeque<u8>,
    /// Every chunk `handle_input` was given is consumed at most whole.
    max_consumed_ok: bool,
}

impl Mem {
    fn new(cfg: IscsiConfig) -> Mem {
        Mem::with_seed(cfg, 42)
    }

    fn with_seed(cfg: IscsiConfig, seed: u64) -> Mem {
        let now = Instant::now();
        let local: SocketAddr = "192.0.2.1:3260".parse().unwrap();
        let peer: SocketAddr = "192.0.2.2:50000".parse().unwrap();
        Mem {
            conn: Conn::new(now, Arc::new(cfg), local, peer, seed),
            core: FakeCore::new(),
            now,
            input: Vec::new(),
            output: VecDeque::new(),
            max_consumed_ok: true,
        }
    }

    fn pump(&mut self) {
        loop {
            let mut progress = false;
            while let Some(ev) = self.conn.poll_event() {
                progress = true;
                self.core.event(&mut self.conn, ev);
            }
            while let Some(a) = self.core.actions.pop_front() {
                progress = true;
                self.conn.handle_action(self.now, a);
            }
            let mut tx = TxQueue::new();
            self.conn.poll_transmit(&mut tx);
            if !tx.is_empty() {
                progress = true;
                self.output.extend(tx.drain_to_vec());
            }
            if !progress {
                return;
            }
        }
    }

    fn feed(&mut self) {
        loop {
            let n = self.conn.handle_input(self.now, &self.input);
            if n > self.input.len() {
                self.max_consumed_ok = false;
            }
            self.input.drain(..n.min(self.input.len()));
            self.pump();
            if n == 0 || self.input.is_empty() {
                return;
            }
        }
    }

    fn advance(&mut self, d: Duration) {
        self.now += d;
        if self.conn.poll_timeout().is_some_and(|t| t <= self.now) {
            self.conn.handle_timeout(self.now);
        }
        self.pump();
    }
}

impl Transport for Mem {
    fn send(&mut self, data: &[u8]) -> io::Result<()> {
        if self.conn.is_closed() {
            return Err(io::ErrorKind::BrokenPipe.into());
        }
        // Deliver in odd-sized pieces to exercise partial consumption.
        for piece in data.chunks(1000) {
            self.input.extend_from_slice(piece);
            self.feed();
        }
        Ok(())
    }

    fn recv(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.pump();
        if self.output.is_empty() {
            if self.conn.is_closed() {
                return Ok(0);
            }
            return Err(io::ErrorKind::TimedOut.into());
        }
        let n = buf.len().min(self.output.len());
        for (i, b) in self.output.drain(..n).enumerate() {
            buf[i] = b;
        }
        Ok(n)
    }
}

fn cfg() -> IscsiConfig {
    IscsiConfig {
        targets: vec![IscsiTarget {
            name: TARGET.into(),
            alias: Some("disk zero".into()),
            tpgt: 1,
            portals: vec![],
            auth: Default::default(),
        }],
        max_recv_data_segment_length: 16 * 1024,
        max_burst_length: 64 * 1024,
        first_burst_length: 32 * 1024,
        nop_in_interval: None,
        queue_depth: 8,
        ..IscsiConfig::default()
    }
}

fn ini_cfg() -> InitiatorConfig {
    InitiatorConfig {
        target_name: Some(TARGET.into()),
        max_recv_data_segment_length: 8192,
        initial_r2t: true,
        ..InitiatorConfig::default()
    }
}

fn logged_in(cfg: IscsiConfig, ic: InitiatorConfig) -> Initiator<Mem> {
    let mut i = Initiator::new(Mem::new(cfg), ic);
    i.login().expect("login");
    assert!(i.t.conn.is_full_feature());
    i
}

fn read10(lba: u32, blocks: u16) -> [u8; 10] {
    let l = lba.to_be_bytes();
    let b = blocks.to_be_bytes();
    [0x28, 0, l[0], l[1], l[2], l[3], 0, b[0], b[1], 0]
}

fn write10(lba: u32, blocks: u16) -> [u8; 10] {
    let mut c = read10(lba, blocks);
    c[0] = 0x2a;
    c
}

fn pattern(n: usize, seed: u8) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

fn write_then_read(
    i: &mut Initiator<Mem>,
    lba: u32,
    data: &[u8],
) -> (crate::initiator::ScsiResult, crate::initiator::ScsiResult) {
    let blocks = (data.len() / BS) as u16;
    let w = i
        .command(&Command {
            cdb: &write10(lba, blocks),
            write: data,
            attr: 1,
            ..Command::default()
        })
        .expect("write");
    let r = i
        .command(&Command {
            cdb: &read10(lba, blocks),
            read_len: data.len() as u32,
            attr: 1,
            ..Command::default()
        })
        .expect("read");
    (w, r)
}

#[test]
fn login_write_read_nop_logout() {
    let mut i = logged_in(cfg(), ini_cfg());
    assert_eq!(i.t.core.events, vec!["logged-in".to_string()]);
    assert_eq!(i.tsih, 0x0102);
    assert_eq!(i.target_mrdsl, 16 * 1024);
    assert!(
        i.login_keys
            .contains(&("TargetPortalGroupTag".into(), "1".into()))
    );
    // 200 KiB: 16 KiB immediate (the target's MRDSL), then R2Ts of at most
    // 64 KiB (MaxBurstLength) for the rest, one outstanding at a time.
    let data = pattern(200 * 1024, 7);
    let (w, r) = write_then_read(&mut i, 100, &data);
    assert_eq!(w.status, 0);
    assert_eq!(w.r2ts, 3); // 184 KiB = 64 + 64 + 56
    assert_eq!(w.exp_data_sn, 3);
    assert_eq!(&i.t.core.disk[100 * BS..100 * BS + data.len()], &data[..]);
    let cmd = &i.t.core.commands[0];
    assert_eq!(cmd.dir, DataDir::Write);
    assert_eq!(cmd.expected_len, data.len() as u32);
    assert_eq!(cmd.lun, Lun(0));
    // Read: Data-In in pieces of the initiator's 8 KiB MRDSL, status in the
    // last one.
    assert_eq!(r.status, 0);
    assert_eq!(r.data, data);
    assert_eq!(r.data_in_pdus, 25);
    assert!(r.status_in_data_in);
    assert_eq!(i.nop(b"ping!", true).unwrap(), b"ping!");
    // A non-immediate NOP-Out takes a CmdSN and is answered too.
    assert_eq!(i.nop(b"abc", false).unwrap(), b"abc");
    assert_eq!(i.logout(0).unwrap(), 0);
    assert!(i.t.conn.is_closed());
    assert_eq!(i.t.core.closed, Some(CloseReason::Logout));
    assert!(i.t.max_consumed_ok);
}

#[test]
fn digests_and_unsolicited_data() {
    let ic = InitiatorConfig {
        header_digest: true,
        data_digest: true,
        initial_r2t: false,
        ..ini_cfg()
    };
    let mut c = cfg();
    c.initial_r2t = false;
    let mut i = logged_in(c, ic);
    assert!(i.hd && i.dd);
    assert!(!i.initial_r2t);
    let data = pattern(100 * 1024, 3);
    let (w, r) = write_then_read(&mut i, 8, &data);
    assert_eq!(w.status, 0);
    // 32 KiB unsolicited (FirstBurstLength), 68 KiB solicited: 64 + 4.
    assert_eq!(w.r2ts, 2);
    assert_eq!(r.data, data);
    assert_eq!(&i.t.core.disk[8 * BS..8 * BS + data.len()], &data[..]);
    // Pages in a pipe need their bytes for the data digest: the connection
    // copies them out, the digest checks, and nothing stays held.
    if let Some(pool) = PipePool::new(2, 2) {
        i.t.core.pipes = Some(pool);
        let r = i
            .command(&Command {
                cdb: &read10(8, (data.len() / BS) as u16),
                read_len: data.len() as u32,
                attr: 1,
                ..Command::default()
            })
            .expect("read");
        assert_eq!(r.status, 0);
        assert_eq!(r.data, data);
        assert_eq!(i.t.core.holds_released.load(Ordering::SeqCst), 1);
    }
}

#[test]
fn check_condition_carries_sense_in_scsi_response() {
    let mut i = logged_in(cfg(), ini_cfg());
    let r = i
        .command(&Command {
            cdb: &[0xff, 0, 0, 0, 0, 0],
            read_len: 512,
            attr: 1,
            ..Command::default()
        })
        .unwrap();
    assert_eq!(r.status, 2);
    assert!(!r.status_in_data_in);
    assert_eq!(r.sense[2] & 0xf, 5);
    assert_eq!(r.sense[12], 0x20);
    // Residual underflow is reported in the final Data-In.
    let r = i
        .command(&Command {
            cdb: &read10(0, 1),
            read_len: 4096,
            attr: 1,
            ..Command::default()
        })
        .unwrap();
    assert_eq!(r.status, 0);
    assert_eq!(r.flags & (flags::U | flags::S), flags::U | flags::S);
    assert_eq!(r.residual, 4096 - 512);
}

#[test]
fn discovery_send_targets() {
    let ic = InitiatorConfig {
        target_name: None,
        ..ini_cfg()
    };
    let mut c = cfg();
    c.targets.push(IscsiTarget {
        name: "iqn.2026-01.dev.ferrite:disk1".into(),
        alias: None,
        tpgt: 2,
        portals: vec![
            "0.0.0.0:3261".parse().unwrap(),
            "[2001:db8::1]:3260".parse().unwrap(),
        ],
        auth: Default::default(),
    });
    let mut i = logged_in(c, ic);
    // Discovery sessions do not open a core session.
    assert!(i.t.core.events.is_empty());
    let keys = i.text(&[("SendTargets", "All")]).unwrap();
    let expect: Vec<(String, String)> = [
        ("TargetName", TARGET),
        ("TargetAddress", "192.0.2.1:3260,1"),
        ("TargetName", "iqn.2026-01.dev.ferrite:disk1"),
        ("TargetAddress", "192.0.2.1:3261,2"),
        ("TargetAddress", "[2001:db8::1]:3260,2"),
    ]
    .iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    assert_eq!(keys, expect);
    // SCSI commands are refused on a discovery session.
    let e = i.command(&Command {
        cdb: &[0; 6],
        attr: 1,
        ..Command::default()
    });
    assert!(matches!(e, Err(InitiatorError::Rejected(0x04))), "{e:?}");
    assert_eq!(i.logout(0).unwrap(), 0);
}

#[test]
fn long_text_response_continues() {
    let ic = InitiatorConfig {
        target_name: None,
        max_recv_data_segment_length: 512,
        ..ini_cfg()
    };
    let mut c = cfg();
    for n in 0..40 {
        c.targets.push(IscsiTarget {
            name: format!("iqn.2026-01.dev.ferrite:many-{n:03}"),
            alias: None,
            tpgt: 1,
            portals: vec![],
            auth: Default::default(),
        });
    }
    let mut i = logged_in(c, ic);
    let keys = i.text(&[("SendTargets", "All")]).unwrap();
    assert_eq!(keys.iter().filter(|(k, _)| k == "TargetName").count(), 41);
}

#[test]
fn normal_session_send_targets_shows_current_target() {
    let mut c = cfg();
    c.targets.push(IscsiTarget {
        name: "iqn.2026-01.dev.ferrite:other".into(),
        alias: None,
        tpgt: 1,
        portals: vec![],
        auth: Default::default(),
    });
    let mut i = logged_in(c, ini_cfg());
    let keys = i.text(&[("SendTargets", "All")]).unwrap();
    assert_eq!(keys[0], ("TargetName".to_string(), TARGET.to_string()));
    assert_eq!(keys.len(), 2);
}

#[test]
fn login_rejects() {
    // Unknown target: 0203.
    let mut i = Initiator::new(
        Mem::new(cfg()),
        InitiatorConfig {
            target_name: Some("iqn.nope".into()),
            ..ini_cfg()
        },
    );
    assert!(matches!(
        i.login(),
        Err(InitiatorError::Login(LoginStatus::NOT_FOUND))
    ));
    assert!(i.t.conn.is_closed());
    assert_eq!(i.t.core.closed, Some(CloseReason::LoginFailed));
    // The driver refuses the session: its status goes out.
    let mut m = Mem::new(cfg());
    m.core.reject_login = Some(LoginStatus::AUTHORIZATION_FAILURE);
    let mut i = Initiator::new(m, ini_cfg());
    assert!(matches!(
        i.login(),
        Err(InitiatorError::Login(LoginStatus::AUTHORIZATION_FAILURE))
    ));
    // Garbage keys: 0200.
    let mut i = Initiator::new(Mem::new(cfg()), ini_cfg());
    let mut b = BhsBuf::new(Opcode::LOGIN_REQ, flags::T | 1);
    b.set_immediate();
    i.send_pdu(&Pdu::with_data(
        b,
        b"InitiatorName=iqn.x\0\x01\x02garbage-without-equals\0".to_vec(),
    ))
    .unwrap();
    let r = i.recv_pdu().unwrap();
    assert_eq!(r.bhs().opcode(), Opcode::LOGIN_RSP);
    assert_eq!(r.bhs().login_status(), LoginStatus::INITIATOR_ERROR);
    assert!(i.t.conn.is_closed());
    // Unsupported version: 0205.
    let mut i = Initiator::new(Mem::new(cfg()), ini_cfg());
    let mut p = i.login_pdu(true, 0, 1, &[("InitiatorName".into(), "iqn.x".into())]);
    p.bhs.set_u8(2, 2).set_u8(3, 1);
    i.send_pdu(&p).unwrap();
    assert_eq!(
        i.recv_pdu().unwrap().bhs().login_status(),
        LoginStatus::UNSUPPORTED_VERSION
    );
    // A non-login PDU during login ends the connection.
    let mut i = Initiator::new(Mem::new(cfg()), ini_cfg());
    i.send_pdu(&Pdu::new(BhsBuf::new(Opcode::NOP_OUT, flags::F)))
        .unwrap();
    assert!(matches!(i.recv_pdu(), Err(InitiatorError::Closed)));
    assert_eq!(i.t.core.closed, Some(CloseReason::ProtocolError));
}

#[test]
fn login_timeout() {
    let mut m = Mem::new(cfg());
    m.advance(Duration::from_secs(14));
    assert!(!m.conn.is_closed());
    m.advance(Duration::from_secs(2));
    assert!(m.conn.is_closed());
    assert_eq!(m.core.closed, Some(CloseReason::LoginTimeout));
}

#[test]
fn truncated_bhs_is_waited_for() {
    let mut i = logged_in(cfg(), ini_cfg());
    let itt = 77;
    let mut b = BhsBuf::new(Opcode::NOP_OUT, flags::F);
    b.set_immediate().set_itt(itt).set_word20(RESERVED_TAG);
    let wire = i.encode(&Pdu::with_data(b, b"xyz".to_vec()));
    let now = i.t.now;
    assert_eq!(i.t.conn.handle_input(now, &wire[..47]), 0);
    assert_eq!(i.t.conn.handle_input(now, &wire[..48]), 48);
    // The data segment may come a byte at a time.
    for k in 48..wire.len() {
        assert_eq!(i.t.conn.handle_input(now, &wire[k..k + 1]), 1);
    }
    i.t.pump();
    let r = i.wait_for(Opcode::NOP_IN, itt).unwrap();
    assert_eq!(r.data, b"xyz");
}

#[test]
fn unknown_opcode_is_rejected_and_connection_continues() {
    let mut i = logged_in(cfg(), ini_cfg());
    let mut b = BhsBuf::new(Opcode(0x1c), flags::F);
    b.set_itt(5);
    let p = Pdu::with_data(b, vec![1, 2, 3, 4, 5]);
    i.send_pdu(&p).unwrap();
    let r = i.recv_pdu().unwrap();
    assert_eq!(r.bhs().opcode(), Opcode::REJECT);
    // RFC 7143 §11.17.1: 05h Command not supported, the header as data.
    assert_eq!(r.bhs().0[2], 0x05);
    assert_eq!(r.data.len(), 48);
    assert_eq!(r.data[..8], p.encode(false, false)[..8]);
    assert_eq!(i.nop(b"still here", true).unwrap(), b"still here");
    // SNACK at ERL 0: protocol error.
    i.send_pdu(&Pdu::new(BhsBuf::new(Opcode::SNACK, flags::F)))
        .unwrap();
    assert_eq!(i.recv_pdu().unwrap().bhs().0[2], 0x04);
}

#[test]
fn oversized_data_segment_is_rejected_without_storing_it() {
    let mut i = logged_in(cfg(), ini_cfg());
    let mut b = BhsBuf::new(Opcode::NOP_OUT, flags::F);
    b.set_immediate().set_itt(9).set_word20(RESERVED_TAG);
    // 16 KiB + 4 > our MaxRecvDataSegmentLength.
    let p = Pdu::with_data(b, vec![0xab; 16 * 1024 + 4]);
    i.send_pdu(&p).unwrap();
    let r = i.recv_pdu().unwrap();
    assert_eq!(r.bhs().opcode(), Opcode::REJECT);
    assert_eq!(r.bhs().0[2], 0x04);
    assert_eq!(r.data[..], p.encode(false, false)[..48]);
    // The segment was skipped: the stream is still in step.
    assert_eq!(i.nop(b"ok", true).unwrap(), b"ok");
}

#[test]
fn header_digest_error_drops_the_connection() {
    let ic = InitiatorConfig {
        header_digest: true,
        ..ini_cfg()
    };
    let mut i = logged_in(cfg(), ic);
    let mut b = BhsBuf::new(Opcode::NOP_OUT, flags::F);
    b.set_immediate().set_itt(3).set_word20(RESERVED_TAG);
    let mut wire = i.encode(&Pdu::new(b));
    wire[49] ^= 0xff;
    i.send_raw(&wire).unwrap();
    assert!(matches!(i.recv_pdu(), Err(InitiatorError::Closed)));
    assert_eq!(i.t.core.closed, Some(CloseReason::HeaderDigest));
}

#[test]
fn data_digest_error_on_data_out_rejects_and_fails_the_command() {
    let ic = InitiatorConfig {
        data_digest: true,
        immediate_data: false,
        ..ini_cfg()
    };
    let mut i = logged_in(cfg(), ic);
    let data = pattern(4096, 1);
    let c = Command {
        cdb: &write10(0, 8),
        write: &data,
        attr: 1,
        ..Command::default()
    };
    let itt = i.new_itt();
    let (p, imm) = i.command_pdu(itt, &c);
    assert_eq!(imm, 0);
    i.send_pdu(&p).unwrap();
    let r2t = i.wait_for(Opcode::R2T, itt).unwrap();
    let d = &i.data_out_pdus(0, itt, r2t.bhs().ttt(), &data, 0, 4096)[0];
    let mut wire = i.encode(d);
    let n = wire.len();
    wire[n - 1] ^= 0x55; // corrupt the data digest
    i.send_raw(&wire).unwrap();
    let rej = i.recv_pdu().unwrap();
    assert_eq!(rej.bhs().opcode(), Opcode::REJECT);
    assert_eq!(rej.bhs().0[2], 0x02);
    assert_eq!(rej.data[..], wire[..48]);
    let rsp = i.wait_for(Opcode::SCSI_RSP, itt).unwrap();
    assert_eq!(rsp.bhs().0[3], 2);
    assert_eq!(i.t.core.data_errors, vec![Abort::TransportError]);
    // Nothing was written.
    assert!(i.t.core.disk[..4096].iter().all(|&b| b == 0));
}

#[test]
fn data_sn_errors_fail_the_write() {
    let ic = InitiatorConfig {
        immediate_data: false,
        ..ini_cfg()
    };
    let mut i = logged_in(cfg(), ic);
    let data = pattern(2 * BS, 9);
    for bad in [0u32, 27, u32::MAX] {
        let c = Command {
            cdb: &write10(0, 2),
            write: &data,
            attr: 1,
            ..Command::default()
        };
        let itt = i.new_itt();
        let (p, _) = i.command_pdu(itt, &c);
        i.send_pdu(&p).unwrap();
        let r2t = i.wait_for(Opcode::R2T, itt).unwrap();
        i.target_mrdsl = BS as u32;
        let mut pdus = i.data_out_pdus(0, itt, r2t.bhs().ttt(), &data, 0, 2 * BS);
        pdus[1].bhs.set_u32(36, bad);
        for d in &pdus {
            i.send_pdu(d).unwrap();
        }
        let rej = i.recv_pdu().unwrap();
        assert_eq!(rej.bhs().opcode(), Opcode::REJECT, "DataSN {bad}");
        let rsp = i.wait_for(Opcode::SCSI_RSP, itt).unwrap();
        assert_eq!(rsp.bhs().0[3], 2, "DataSN {bad}");
    }
    assert!(i.t.core.disk[..2 * BS].iter().all(|&b| b == 0));
    assert_eq!(i.nop(b"x", true).unwrap(), b"x");
}

#[test]
fn cmd_sn_window() {
    let mut i = logged_in(cfg(), ini_cfg());
    let c = Command {
        cdb: &[0; 6],
        attr: 1,
        ..Command::default()
    };
    // CmdSN = MaxCmdSN + 1: silently ignored (RFC 7143 §4.2.2.1).
    let good = i.cmd_sn;
    i.cmd_sn = i.max_cmd_sn.next();
    let itt = i.new_itt();
    let (p, _) = i.command_pdu(itt, &c);
    i.send_pdu(&p).unwrap();
    assert!(matches!(i.recv_pdu(), Err(InitiatorError::Io(_))));
    // CmdSN below ExpCmdSN: ignored too.
    i.cmd_sn = CmdSn(good.0.wrapping_sub(1));
    let itt = i.new_itt();
    let (p, _) = i.command_pdu(itt, &c);
    i.send_pdu(&p).unwrap();
    assert!(matches!(i.recv_pdu(), Err(InitiatorError::Io(_))));
    assert!(i.t.core.commands.is_empty());
    // The dropped command left nothing behind: its ITT is free again.
    i.cmd_sn = good;
    let (p, _) = i.command_pdu(itt, &c);
    i.send_pdu(&p).unwrap();
    i.wait_for(Opcode::SCSI_RSP, itt).unwrap();
    i.t.core.commands.clear();
    let good = good.next();
    // Out of order within the window: held until the gap fills.
    i.cmd_sn = good.next();
    let itt2 = i.new_itt();
    let (p2, _) = i.command_pdu(itt2, &c);
    i.send_pdu(&p2).unwrap();
    assert!(i.t.core.commands.is_empty());
    i.cmd_sn = good;
    let itt1 = i.new_itt();
    let (p1, _) = i.command_pdu(itt1, &c);
    i.send_pdu(&p1).unwrap();
    let tags: Vec<u64> = i.t.core.commands.iter().map(|c| c.tag.0).collect();
    assert_eq!(tags, vec![itt1 as u64, itt2 as u64]);
    i.wait_for(Opcode::SCSI_RSP, itt1).unwrap();
    i.wait_for(Opcode::SCSI_RSP, itt2).unwrap();
    i.cmd_sn = good.next().next();
    assert!(i.command(&c).is_ok());
}

#[test]
fn max_cmd_sn_tracks_queue_depth() {
    let mut i = logged_in(cfg(), ini_cfg());
    let start = i.max_cmd_sn;
    assert_eq!(start.diff(i.cmd_sn), 7); // queue depth 8
    // A write waiting for data holds a slot: MaxCmdSN does not move.
    let data = pattern(BS, 1);
    let c = Command {
        cdb: &write10(0, 1),
        write: &data,
        attr: 1,
        ..Command::default()
    };
    let itt = i.new_itt();
    let (p, imm) = i.command_pdu(itt, &c);
    assert_eq!(imm, BS);
    i.send_pdu(&p).unwrap();
    let rsp = i.wait_for(Opcode::SCSI_RSP, itt).unwrap();
    // After the response the slot is free again: the window moved by one.
    assert_eq!(rsp.bhs().max_cmd_sn(), start.next());
}

/// Read data sent as pages from a pipe arrives whole, split over Data-In
/// PDUs; each read's delivery hold lasts until the initiator's ExpStatSN
/// shows it has the response, and when the core asks (ConfirmDelivery) a
/// ping makes a quiet initiator say so.
#[test]
fn pipe_reads_are_held_until_the_initiator_has_them() {
    let mut i = logged_in(cfg(), ini_cfg());
    let Some(pool) = PipePool::new(4, 4) else {
        return;
    };
    let data = pattern(200 * 1024, 5);
    let blocks = (data.len() / BS) as u16;
    i.t.core.disk[..data.len()].copy_from_slice(&data);
    i.t.core.pipes = Some(pool);
    let released = i.t.core.holds_released.clone();
    let read = |i: &mut Initiator<Mem>| {
        i.command(&Command {
            cdb: &read10(0, blocks),
            read_len: data.len() as u32,
            attr: 1,
            ..Command::default()
        })
        .expect("read")
    };
    let r = read(&mut i);
    assert_eq!(r.status, 0);
    assert_eq!(r.data, data);
    assert_eq!(r.data_in_pdus, 25);
    assert!(r.status_in_data_in);
    // Nothing came from the initiator since: still held.
    assert_eq!(released.load(Ordering::SeqCst), 0);
    // Its next PDU carries an ExpStatSN past the read's status.
    assert_eq!(i.nop(b"x", true).unwrap(), b"x");
    assert_eq!(released.load(Ordering::SeqCst), 1);

    let r = read(&mut i);
    assert_eq!(r.data, data);
    // Time alone sends nothing (no keepalive configured here)...
    i.t.advance(Duration::from_secs(1));
    assert!(i.t.output.is_empty());
    assert_eq!(released.load(Ordering::SeqCst), 1);
    // ...the core's request does: one ping, however often it asks.
    i.t.core.actions.push_back(Action::ConfirmDelivery);
    i.t.core.actions.push_back(Action::ConfirmDelivery);
    i.t.pump();
    let ping = i.recv_pdu().unwrap();
    assert_eq!(ping.bhs().opcode(), Opcode::NOP_IN);
    assert_eq!(ping.bhs().itt(), RESERVED_TAG);
    assert_ne!(ping.bhs().ttt(), RESERVED_TAG);
    assert!(i.t.output.is_empty());
    // Any answer releases the hold.
    assert_eq!(i.nop(b"y", true).unwrap(), b"y");
    assert_eq!(released.load(Ordering::SeqCst), 2);
    // With nothing held, a request sends nothing.
    i.t.core.actions.push_back(Action::ConfirmDelivery);
    i.t.pump();
    assert!(i.t.output.is_empty());
    // The logout's ExpStatSN (or the end of the connection) releases the
    // last one.
    let _ = read(&mut i);
    assert_eq!(i.logout(0).unwrap(), 0);
    drop(i);
    assert_eq!(released.load(Ordering::SeqCst), 3);
}

#[test]
fn nop_in_keepalive_and_timeout() {
    let mut c = cfg();
    c.nop_in_interval = Some(Duration::from_secs(5));
    c.nop_in_timeout = Duration::from_secs(10);
    let mut i = logged_in(c, ini_cfg());
    i.t.advance(Duration::from_secs(6));
    // The ping is answered by the initiator while it waits for something else.
    assert_eq!(i.nop(b"a", true).unwrap(), b"a");
    assert_eq!(i.pings_answered, 1);
    // Unanswered ping: the connection drops after nop_in_timeout.
    i.t.advance(Duration::from_secs(6));
    let ping = i.recv_pdu().unwrap();
    assert_eq!(ping.bhs().opcode(), Opcode::NOP_IN);
    assert_eq!(ping.bhs().itt(), RESERVED_TAG);
    assert_ne!(ping.bhs().ttt(), RESERVED_TAG);
    i.t.advance(Duration::from_secs(9));
    assert!(!i.t.conn.is_closed());
    i.t.advance(Duration::from_secs(2));
    assert_eq!(i.t.core.closed, Some(CloseReason::NopTimeout));
}

#[test]
fn task_management() {
    let mut i = logged_in(cfg(), ini_cfg());
    assert_eq!(
        i.tmf(tmf_fn::ABORT_TASK, 0, 0x1234).unwrap(),
        tmf_rsp::COMPLETE
    );
    assert_eq!(
        i.tmf(tmf_fn::LUN_RESET, 0, RESERVED_TAG).unwrap(),
        tmf_rsp::COMPLETE
    );
    assert_eq!(
        i.tmf(tmf_fn::TASK_REASSIGN, 0, 1).unwrap(),
        tmf_rsp::REASSIGN_NOT_SUPPORTED
    );
    assert_eq!(i.tmf(0x55, 0, 1).unwrap(), tmf_rsp::REJECTED);
    assert_eq!(
        i.t.core.tmfs,
        vec![
            TmfFunction::AbortTask {
                tag: TaskTag(0x1234)
            },
            TmfFunction::LogicalUnitReset
        ]
    );
    // A write waiting for R2T data is aborted: the core's fetch ends.
    let ic_data = pattern(BS * 4, 2);
    let c = Command {
        cdb: &write10(0, 4),
        write: &ic_data,
        attr: 1,
        ..Command::default()
    };
    i.immediate_data = false;
    let itt = i.new_itt();
    let (p, _) = i.command_pdu(itt, &c);
    i.send_pdu(&p).unwrap();
    i.wait_for(Opcode::R2T, itt).unwrap();
    assert_eq!(
        i.tmf(tmf_fn::ABORT_TASK, 0, itt).unwrap(),
        tmf_rsp::COMPLETE
    );
    assert_eq!(i.t.core.data_errors, vec![Abort::Aborted]);
    // Cold reset: response, then the connection closes.
    assert_eq!(
        i.tmf(tmf_fn::TARGET_COLD_RESET, 0, RESERVED_TAG).unwrap(),
        tmf_rsp::COMPLETE
    );
    assert_eq!(i.t.core.closed, Some(CloseReason::TargetReset));
}

#[test]
fn aen_and_target_requested_logout() {
    let mut i = logged_in(cfg(), ini_cfg());
    let now = i.t.now;
    i.t.conn.handle_action(
        now,
        Action::Aen {
            lun: Lun(3),
            sense: Sense::REPORTED_LUNS_DATA_HAS_CHANGED,
        },
    );
    let a = i.recv_pdu().unwrap();
    assert_eq!(a.bhs().opcode(), Opcode::ASYNC_MSG);
    assert_eq!(a.bhs().0[36], 0);
    assert_eq!(a.bhs().lun(), Lun(3).encode());
    let sl = u16::from_be_bytes([a.data[0], a.data[1]]) as usize;
    assert_eq!(sl, 18);
    assert_eq!((a.data[2 + 12], a.data[2 + 13]), (0x3f, 0x0e));
    i.t.conn.handle_action(now, Action::Close);
    let a = i.recv_pdu().unwrap();
    assert_eq!(a.bhs().0[36], 1);
    i.t.advance(Duration::from_secs(16));
    assert_eq!(i.t.core.closed, Some(CloseReason::CoreRequest));
}

#[test]
fn extended_cdb_and_bidi_ahs_reach_the_core() {
    let mut i = logged_in(cfg(), ini_cfg());
    let cdb32: Vec<u8> = (0..32).map(|b| if b == 0 { 0x7f } else { b }).collect();
    let r = i
        .command(&Command {
            cdb: &cdb32,
            attr: 2,
            lun: Lun(300).to_u64(),
            ..Command::default()
        })
        .unwrap();
    assert_eq!(r.status, 2);
    let c = &i.t.core.commands[0];
    assert_eq!(c.cdb.as_slice(), &cdb32[..]);
    assert_eq!(c.attr, ferrite_core::TaskAttr::Ordered);
    assert_eq!(c.lun, Lun(300));
    // An undecodable LUN still reaches the core, raw.
    let raw = 0xc000_0000_0000_0001u64;
    i.command(&Command {
        cdb: &[0; 6],
        attr: 1,
        lun: raw,
        ..Command::default()
    })
    .unwrap();
    assert_eq!(i.t.core.commands[1].lun_raw, raw.to_be_bytes());
}

/// Deterministic pseudo-random bytes for the fuzz-style tests.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

#[test]
fn random_bytes_never_panic_and_never_overconsume() {
    let mut rng = Rng(0x1234_5678_9abc_def1);
    for round in 0..300 {
        let mut c = cfg();
        c.nop_in_interval = Some(Duration::from_secs(1));
        // Half the rounds start from a logged-in connection, with digests.
        let mut m = if round % 2 == 0 {
            Mem::new(c)
        } else {
            let ic = InitiatorConfig {
                header_digest: round % 4 == 1,
                data_digest: round % 4 == 1,
                ..ini_cfg()
            };
            let mut i = Initiator::new(Mem::new(c), ic);
            i.login().unwrap();
            i.t
        };
        let mut buf = Vec::new();
        for _ in 0..20 {
            let len = (rng.next() % 300) as usize;
            let mut chunk: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
            // Often start with a plausible header so deeper paths are reached.
            if len >= 48 && rng.next().is_multiple_of(2) {
                chunk[0] =
                    [0x01, 0x05, 0x00, 0x04, 0x06, 0x02, 0x03, 0x10][(rng.next() % 8) as usize];
                chunk[4] = (rng.next() % 3) as u8;
                chunk[5] = 0;
                chunk[6] = (rng.next() % 2) as u8;
            }
            buf.extend_from_slice(&chunk);
            let n = m.conn.handle_input(m.now, &buf);
            assert!(n <= buf.len(), "consumed {n} of {}", buf.len());
            buf.drain(..n);
            m.pump();
            m.advance(Duration::from_millis(300));
        }
        assert!(m.max_consumed_ok);
    }
}

#[test]
fn mutated_valid_streams_never_panic() {
    // A valid session transcript (login, write, read, nop, logout) with one
    // byte flipped at a time, fed in random-sized pieces.
    let mut rec = Initiator::new(Recorder::default(), ini_cfg());
    let login1 = rec.login_pdu(
        true,
        0,
        1,
        &[
            ("InitiatorName".into(), "iqn.x".into()),
            ("TargetName".into(), TARGET.into()),
            ("AuthMethod".into(), "None".into()),
        ],
    );
    let login2 = rec.login_pdu(
        true,
        1,
        3,
        &[("MaxRecvDataSegmentLength".into(), "8192".into())],
    );
    let mut stream = login1.encode(false, false);
    stream.extend(login2.encode(false, false));
    let data = pattern(2048, 5);
    let (p, _) = rec.command_pdu(
        0x10,
        &Command {
            cdb: &write10(0, 4),
            write: &data,
            attr: 1,
            ..Command::default()
        },
    );
    stream.extend(p.encode(false, false));
    let mut nop = BhsBuf::new(Opcode::NOP_OUT, flags::F);
    nop.set_immediate().set_itt(0x20).set_word20(RESERVED_TAG);
    stream.extend(Pdu::with_data(nop, b"zz".to_vec()).encode(false, false));
    let mut lo = BhsBuf::new(Opcode::LOGOUT_REQ, flags::F);
    lo.set_immediate().set_itt(0x21);
    stream.extend(Pdu::new(lo).encode(false, false));
    let mut rng = Rng(99);
    for k in 0..stream.len() {
        let mut s = stream.clone();
        s[k] ^= 1 << (rng.next() % 8);
        let mut m = Mem::new(cfg());
        let mut buf = Vec::new();
        let mut at = 0;
        while at < s.len() {
            let n = ((rng.next() % 97) as usize + 1).min(s.len() - at);
            buf.extend_from_slice(&s[at..at + n]);
            at += n;
            let used = m.conn.handle_input(m.now, &buf);
            assert!(used <= buf.len());
            buf.drain(..used);
            m.pump();
        }
    }
}

/// A transport that records what is sent (for building transcripts).
#[derive(Default)]
struct Recorder(Vec<u8>);
impl Transport for Recorder {
    fn send(&mut self, data: &[u8]) -> io::Result<()> {
        self.0.extend_from_slice(data);
        Ok(())
    }
    fn recv(&mut self, _buf: &mut [u8]) -> io::Result<usize> {
        Ok(0)
    }
}

#[test]
fn text_keys_in_full_feature_phase() {
    let mut i = logged_in(cfg(), ini_cfg());
    let keys = i.text(&[("X-Vendor", "1")]).unwrap();
    assert_eq!(
        keys,
        vec![("X-Vendor".to_string(), "NotUnderstood".to_string())]
    );
    let keys = i.text(&[("MaxBurstLength", "4096")]).unwrap();
    assert_eq!(
        keys,
        vec![("MaxBurstLength".to_string(), "Reject".to_string())]
    );
    // A text request split with the C bit.
    let itt = i.new_itt();
    let full = encode_text(&[("SendTargets", "All")]);
    let mut b = BhsBuf::new(Opcode::TEXT_REQ, 0x40);
    b.set_immediate().set_itt(itt).set_word20(RESERVED_TAG);
    i.send_pdu(&Pdu::with_data(b, full[..5].to_vec())).unwrap();
    let r = i.wait_for(Opcode::TEXT_RSP, itt).unwrap();
    assert!(!r.bhs().final_bit() && r.data.is_empty());
    let mut b = BhsBuf::new(Opcode::TEXT_REQ, flags::F);
    b.set_immediate().set_itt(itt).set_word20(r.bhs().ttt());
    i.send_pdu(&Pdu::with_data(b, full[5..].to_vec())).unwrap();
    let r = i.wait_for(Opcode::TEXT_RSP, itt).unwrap();
    assert!(r.bhs().final_bit());
    assert!(r.data.starts_with(b"TargetName="));
}

#[test]
fn digest_of_zero_pad_matches_sender() {
    // The target's zero-copy Data-In digest (over SgList pieces plus padding)
    // equals the one-buffer digest the initiator checks.
    let ic = InitiatorConfig {
        data_digest: true,
        ..ini_cfg()
    };
    let mut i = logged_in(cfg(), ic);
    let data = pattern(BS * 3, 11);
    let (_, r) = write_then_read(&mut i, 1, &data);
    assert_eq!(r.data, data);
}

#[test]
fn oversized_data_out_fails_the_write() {
    let ic = InitiatorConfig {
        immediate_data: false,
        ..ini_cfg()
    };
    let mut i = logged_in(cfg(), ic);
    let data = pattern(32 * 1024, 4);
    let c = Command {
        cdb: &write10(0, 64),
        write: &data,
        attr: 1,
        ..Command::default()
    };
    let itt = i.new_itt();
    let (p, _) = i.command_pdu(itt, &c);
    i.send_pdu(&p).unwrap();
    let r2t = i.wait_for(Opcode::R2T, itt).unwrap();
    assert_eq!(r2t.bhs().word(44), 32 * 1024);
    // One Data-Out of 32 KiB: twice our 16 KiB MaxRecvDataSegmentLength.
    i.target_mrdsl = 32 * 1024;
    let d = &i.data_out_pdus(0, itt, r2t.bhs().ttt(), &data, 0, data.len())[0];
    i.send_pdu(d).unwrap();
    let rej = i.recv_pdu().unwrap();
    assert_eq!((rej.bhs().opcode(), rej.bhs().0[2]), (Opcode::REJECT, 0x04));
    let rsp = i.wait_for(Opcode::SCSI_RSP, itt).unwrap();
    assert_eq!(rsp.bhs().0[3], 2);
    assert_eq!(i.t.core.data_errors, vec![Abort::TransportError]);
    assert_eq!(i.nop(b"after", true).unwrap(), b"after");
}

#[test]
fn unsolicited_burst_may_end_early() {
    let mut c = cfg();
    c.initial_r2t = false;
    let ic = InitiatorConfig {
        initial_r2t: false,
        ..ini_cfg()
    };
    let mut i = logged_in(c, ic);
    assert!(!i.initial_r2t);
    // F on the command: only the immediate data is unsolicited, R2Ts ask for
    // the rest from its end.
    i.initial_r2t = true;
    let data = pattern(48 * 1024, 6);
    let (w, _) = write_then_read(&mut i, 0, &data);
    assert_eq!((w.status, w.r2ts), (0, 1));
    assert_eq!(&i.t.core.disk[..data.len()], &data[..]);
    // An unsolicited Data-Out with F before FirstBurstLength (32 KiB) ends
    // the unsolicited burst there.
    let data = pattern(40 * 1024, 8);
    let c = Command {
        cdb: &write10(200, 80),
        write: &data,
        attr: 1,
        ..Command::default()
    };
    let itt = i.new_itt();
    let (mut p, imm) = i.command_pdu(itt, &c);
    assert_eq!(imm, 16 * 1024);
    p.bhs.0[1] &= !flags::F;
    i.send_pdu(&p).unwrap();
    for d in i.data_out_pdus(0, itt, RESERVED_TAG, &data, imm, 4096) {
        i.send_pdu(&d).unwrap();
    }
    let r2t = i.wait_for(Opcode::R2T, itt).unwrap();
    assert_eq!(r2t.bhs().buffer_offset(), 20 * 1024);
    assert_eq!(r2t.bhs().word(44), 20 * 1024);
    for d in i.data_out_pdus(0, itt, r2t.bhs().ttt(), &data, 20 * 1024, 20 * 1024) {
        i.send_pdu(&d).unwrap();
    }
    let rsp = i.wait_for(Opcode::SCSI_RSP, itt).unwrap();
    assert_eq!(rsp.bhs().0[3], 0);
    assert_eq!(&i.t.core.disk[200 * BS..200 * BS + data.len()], &data[..]);
}

/// The initiator over a real socket against a running target: set
/// `FERRITE_ISCSI_PORTAL=127.0.0.1:3260` (and `FERRITE_ISCSI_TARGET`, default
/// the embedded default target) to run it; skipped otherwise.
#[test]
fn tcp_initiator_against_a_running_target() {
    let Ok(portal) = std::env::var("FERRITE_ISCSI_PORTAL") else {
        eprintln!("skipped: FERRITE_ISCSI_PORTAL is not set");
        return;
    };
    let addr: SocketAddr = portal.parse().expect("FERRITE_ISCSI_PORTAL is ADDR:PORT");
    let target = std::env::var("FERRITE_ISCSI_TARGET")
        .unwrap_or_else(|_| "iqn.2026-11.org.ferrite:default".into());
    // Discovery.
    let mut d = crate::initiator::connect(
        addr,
        InitiatorConfig {
            target_name: None,
            ..InitiatorConfig::default()
        },
    )
    .expect("discovery login");
    let keys = d.text(&[("SendTargets", "All")]).expect("SendTargets");
    assert!(
        keys.contains(&("TargetName".to_string(), target.clone())),
        "{keys:?}"
    );
    assert_eq!(d.logout(0).unwrap(), 0);
    // Normal session with digests: write, read back, ping, log out.
    for (hd, dd, r2t) in [(false, false, true), (true, true, false)] {
        let mut s = crate::initiator::connect(
            addr,
            InitiatorConfig {
                target_name: Some(target.clone()),
                header_digest: hd,
                data_digest: dd,
                initial_r2t: r2t,
                ..InitiatorConfig::default()
            },
        )
        .expect("login");
        assert_eq!((s.hd, s.dd), (hd, dd));
        // A new nexus starts with a unit attention (SAM-5 §5.14): clear it.
        let tur = Command {
            cdb: &[0; 6],
            attr: 1,
            ..Command::default()
        };
        let mut st = s.command(&tur).expect("TEST UNIT READY");
        for _ in 0..4 {
            if st.status == 0 {
                break;
            }
            assert_eq!(st.sense.get(2).map(|k| k & 0xf), Some(6), "{st:?}");
            st = s.command(&tur).expect("TEST UNIT READY");
        }
        assert_eq!(st.status, 0);
        let data = pattern(300 * 1024, 13);
        let lba = 4096;
        let w = s
            .command(&Command {
                cdb: &write10(lba, (data.len() / BS) as u16),
                write: &data,
                attr: 1,
                ..Command::default()
            })
            .expect("write");
        assert_eq!(w.status, 0, "{w:?}");
        let r = s
            .command(&Command {
                cdb: &read10(lba, (data.len() / BS) as u16),
                read_len: data.len() as u32,
                attr: 1,
                ..Command::default()
            })
            .expect("read");
        assert_eq!(r.status, 0);
        assert!(r.data == data, "read back differs");
        assert_eq!(s.nop(b"over tcp", true).unwrap(), b"over tcp");
        assert_eq!(s.logout(0).unwrap(), 0);
    }
}

#[test]
fn several_outstanding_r2ts() {
    let mut c = cfg();
    c.max_outstanding_r2t = 4;
    let ic = InitiatorConfig {
        immediate_data: false,
        extra_keys: vec![("MaxOutstandingR2T".into(), "8".into())],
        ..ini_cfg()
    };
    let mut i = logged_in(c, ic);
    assert!(
        i.login_keys
            .contains(&("MaxOutstandingR2T".into(), "4".into()))
    );
    assert_eq!(i.t.conn.params().max_outstanding_r2t, 4);
    // 400 KiB in 64 KiB bursts: 7 R2Ts, 4 of them out at once.
    let data = pattern(400 * 1024, 21);
    let c = Command {
        cdb: &write10(16, 800),
        write: &data,
        attr: 1,
        ..Command::default()
    };
    let itt = i.new_itt();
    let (p, _) = i.command_pdu(itt, &c);
    i.send_pdu(&p).unwrap();
    let mut r2ts = Vec::new();
    for _ in 0..4 {
        r2ts.push(i.wait_for(Opcode::R2T, itt).unwrap());
    }
    let seen: Vec<(u32, u32)> = r2ts
        .iter()
        .map(|r| (r.bhs().word(36), r.bhs().buffer_offset()))
        .collect();
    assert_eq!(seen, vec![(0, 0), (1, 65536), (2, 131072), (3, 196608)]);
    // Nothing more until data arrives.
    assert!(matches!(i.recv_pdu(), Err(InitiatorError::Io(_))));
    // RFC 7143 §13.19 (DataSequenceInOrder=Yes): sequences in offset order.
    for r in &r2ts {
        let (off, len) = (r.bhs().buffer_offset() as usize, r.bhs().word(44) as usize);
        for d in i.data_out_pdus(0, itt, r.bhs().ttt(), &data, off, len) {
            i.send_pdu(&d).unwrap();
        }
    }
    let w = i.finish_command(itt, &c).unwrap();
    assert_eq!((w.status, w.r2ts), (0, 3));
    assert_eq!(&i.t.core.disk[16 * BS..16 * BS + data.len()], &data[..]);
}

#[test]
fn digests_over_padded_segments() {
    let ic = InitiatorConfig {
        header_digest: true,
        data_digest: true,
        ..ini_cfg()
    };
    let mut i = logged_in(cfg(), ic);
    assert_eq!(i.nop(b"ping!", true).unwrap(), b"ping!");
    i.t.core.disk[..512].copy_from_slice(&pattern(512, 77));
    // 511 bytes of Data-In from the response's buffer: one byte of padding
    // inside the zero-copy digest.
    let r = i
        .command(&Command {
            cdb: &read10(0, 1),
            read_len: 511,
            attr: 1,
            ..Command::default()
        })
        .unwrap();
    assert_eq!(r.status, 0);
    assert_eq!(r.data, pattern(512, 77)[..511].to_vec());
    let keys = i.text(&[("SendTargets", "")]).unwrap();
    assert_eq!(keys[0].1, TARGET);
}

#[test]
fn depth_peak_follows_the_initiators_queue() {
    let mut i = logged_in(cfg(), ini_cfg());
    let c = Command {
        cdb: &[0; 6],
        attr: 1,
        ..Command::default()
    };
    assert_eq!(i.t.conn.take_depth_peak(), 0);
    // One command at a time: each was the only one outstanding.
    for _ in 0..5 {
        i.command(&c).unwrap();
    }
    assert_eq!(i.t.conn.take_depth_peak(), 1);
    assert_eq!(i.t.conn.take_depth_peak(), 0);
    // Four sent before any response is read: the fourth went out with
    // three responses unseen.
    let mut itts = Vec::new();
    for _ in 0..4 {
        let itt = i.new_itt();
        let (p, _) = i.command_pdu(itt, &c);
        i.send_pdu(&p).unwrap();
        itts.push(itt);
    }
    for itt in itts {
        i.wait_for(Opcode::SCSI_RSP, itt).unwrap();
    }
    assert_eq!(i.t.conn.take_depth_peak(), 4);
}

/// libiscsi compares StatSN as a signed number: from a first StatSN of 2^31
/// or more its ExpStatSN would never move. The first one stays far below.
#[test]
fn first_stat_sn_stays_below_two_to_the_28() {
    let mut starts = std::collections::HashSet::new();
    for seed in 0..64 {
        let mut i = Initiator::new(Mem::with_seed(cfg(), seed), ini_cfg());
        i.login().expect("login");
        let first = i.exp_stat_sn.0.wrapping_sub(1);
        assert!(first < 1 << 28, "seed {seed}: first StatSN {first:#x}");
        starts.insert(first);
    }
    // Still drawn at random.
    assert!(starts.len() > 60, "{} distinct first StatSNs", starts.len());
}

#[test]
fn data_out_timeout_drops_a_connection_whose_burst_stalls() {
    let mut c = cfg();
    c.data_out_timeout = Some(Duration::from_secs(10));
    let mut i = logged_in(c, ini_cfg());
    i.immediate_data = false;
    let data = pattern(4096, 3);
    let c = Command {
        cdb: &write10(0, 8),
        write: &data,
        attr: 1,
        ..Command::default()
    };
    // A burst answered within a period, across a scan, is fine.
    let itt = i.new_itt();
    let (p, _) = i.command_pdu(itt, &c);
    i.send_pdu(&p).unwrap();
    let r2t = i.wait_for(Opcode::R2T, itt).unwrap();
    i.t.advance(Duration::from_secs(11));
    for d in i.data_out_pdus(0, itt, r2t.bhs().ttt(), &data, 0, 4096) {
        i.send_pdu(&d).unwrap();
    }
    let rsp = i.wait_for(Opcode::SCSI_RSP, itt).unwrap();
    assert_eq!(rsp.bhs().0[3], 0);
    i.t.advance(Duration::from_secs(10));
    assert!(!i.t.conn.is_closed());
    // A burst still unanswered one scan after another: the connection goes.
    let itt = i.new_itt();
    let (p, _) = i.command_pdu(itt, &c);
    i.send_pdu(&p).unwrap();
    i.wait_for(Opcode::R2T, itt).unwrap();
    i.t.advance(Duration::from_secs(10));
    assert_eq!(i.t.core.closed, None);
    i.t.advance(Duration::from_secs(10));
    assert_eq!(i.t.core.closed, Some(CloseReason::DataOutTimeout));
}

/// What a datamover was given during a login: each Send_Control's opcode,
/// status and data segment, and the parameters Enable_Datamover carried.
#[derive(Debug, Default)]
struct LoginLog {
    control: Vec<(Opcode, [u8; 2], Vec<u8>)>,
    enabled: Option<crate::keys::Params>,
}

/// A datamover that records a login, RDMA or not as built.
#[derive(Debug)]
struct LoginRecorder {
    rdma: bool,
    log: std::rc::Rc<std::cell::RefCell<LoginLog>>,
}

impl crate::datamover::Datamover for LoginRecorder {
    fn enable_datamover(&mut self, params: &crate::keys::Params) {
        self.log.borrow_mut().enabled = Some(params.clone());
    }
    fn send_control(&mut self, bhs: &BhsBuf, data: &[u8]) {
        let b = crate::pdu::Bhs(&bhs.0);
        self.log
            .borrow_mut()
            .control
            .push((b.opcode(), [bhs.0[36], bhs.0[37]], data.to_vec()));
    }
    fn put_data(
        &mut self,
        _put: crate::datamover::PutData,
        _sns: crate::pdu::Sns,
    ) -> crate::datamover::PutDone {
        crate::datamover::PutDone {
            next_data_sn: crate::pdu::DataSn(0),
            status_sent: false,
        }
    }
    fn get_data(&mut self, _solicit: crate::datamover::Solicit, _sns: crate::pdu::Sns) {}
    fn is_rdma(&self) -> bool {
        self.rdma
    }
    fn can_splice(&self) -> bool {
        false
    }
    fn is_flushed(&self) -> bool {
        true
    }
    fn discard_tx(&mut self) {}
}

/// The keys of the Linux iSER initiator's leading login (open-iscsi's
/// iscsid over ib_iser with iscsid.conf's defaults): the security stage
/// names the initiator and target; the operational stage sends no digests,
/// its session keys, and InitiatorRecvDataSegmentLength,
/// TargetRecvDataSegmentLength and RDMAExtensions=Yes in place of
/// MaxRecvDataSegmentLength; MaxOutstandingUnexpectedPDUs is not sent.
const ISER_SECURITY_KEYS: &[(&str, &str)] = &[
    ("InitiatorName", "iqn.2004-10.com.ubuntu:01:c0ffee"),
    ("TargetName", TARGET),
    ("SessionType", "Normal"),
    ("AuthMethod", "None"),
];
const ISER_OPERATIONAL_KEYS: &[(&str, &str)] = &[
    ("DefaultTime2Wait", "2"),
    ("DefaultTime2Retain", "0"),
    ("IFMarker", "No"),
    ("OFMarker", "No"),
    ("ErrorRecoveryLevel", "0"),
    ("InitialR2T", "No"),
    ("ImmediateData", "Yes"),
    ("MaxBurstLength", "16776192"),
    ("FirstBurstLength", "262144"),
    ("MaxConnections", "1"),
    ("DataPDUInOrder", "Yes"),
    ("DataSequenceInOrder", "Yes"),
    ("MaxOutstandingR2T", "1"),
    ("InitiatorRecvDataSegmentLength", "262144"),
    ("TargetRecvDataSegmentLength", "262144"),
    ("RDMAExtensions", "Yes"),
];

/// A Login Response's status (class, detail) and keys.
type LoginAnswer = ([u8; 2], Vec<(String, String)>);

/// Runs a two-stage login (security, then operational to full feature)
/// with `security` and `operational` keys over a [`LoginRecorder`]: the
/// login responses' statuses and keys, and what Enable_Datamover got.
fn login_over(
    rdma: bool,
    security: &[(&str, &str)],
    operational: &[(&str, &str)],
) -> (Vec<LoginAnswer>, Option<crate::keys::Params>) {
    login_over_with(cfg(), rdma, security, operational)
}

/// [`login_over`] with the configuration `cfg`.
fn login_over_with(
    cfg: IscsiConfig,
    rdma: bool,
    security: &[(&str, &str)],
    operational: &[(&str, &str)],
) -> (Vec<LoginAnswer>, Option<crate::keys::Params>) {
    let log = std::rc::Rc::new(std::cell::RefCell::new(LoginLog::default()));
    let dm = LoginRecorder {
        rdma,
        log: log.clone(),
    };
    let addr: SocketAddr = "192.0.2.1:3260".parse().unwrap();
    let now = Instant::now();
    let mut c = Conn::with_datamover(now, Arc::new(cfg), addr, addr, 7, dm);
    for (i, (keys, csg, nsg)) in [(security, 0u8, 1u8), (operational, 1, 3)]
        .into_iter()
        .enumerate()
    {
        let mut b = BhsBuf::new(Opcode::LOGIN_REQ, flags::T | (csg << 2) | nsg);
        b.set_immediate();
        b.0[8..14].copy_from_slice(&[0x80, 0x12, 0x34, 0x56, 0x78, 0x9a]);
        b.set_itt(0x40 + i as u32);
        b.set_u32(24, 1);
        c.pdu_received(&b.0, &[], encode_text(keys), true);
        while let Some(ev) = c.poll_event() {
            if let ConnEvent::SessionRequest { .. } = ev {
                c.accept_session(0x0102);
            }
        }
        if c.is_closed() {
            break;
        }
    }
    let log = log.borrow();
    let rsps = log
        .control
        .iter()
        .filter(|(op, _, _)| *op == Opcode::LOGIN_RSP)
        .map(|(_, st, data)| {
            let keys = crate::keys::parse_text(data)
                .unwrap()
                .into_iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            (*st, keys)
        })
        .collect();
    (rsps, log.enabled.clone())
}

fn answer<'a>(keys: &'a [(String, String)], key: &str) -> Option<&'a str> {
    keys.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
}

#[test]
fn iser_initiator_login_on_an_rdma_connection() {
    let (rsps, params) = login_over(true, ISER_SECURITY_KEYS, ISER_OPERATIONAL_KEYS);
    assert_eq!(rsps.len(), 2);
    let (st, op) = &rsps[1];
    assert_eq!(*st, [0, 0]);
    assert_eq!(answer(op, "RDMAExtensions"), Some("Yes"));
    // The target takes Sends up to its MaxRecvDataSegmentLength (16 KiB
    // in `cfg`), and repeats what the initiator receives.
    assert_eq!(answer(op, "TargetRecvDataSegmentLength"), Some("16384"));
    assert_eq!(answer(op, "InitiatorRecvDataSegmentLength"), Some("262144"));
    assert_eq!(answer(op, "IFMarker"), Some("No"));
    assert_eq!(answer(op, "MaxBurstLength"), Some("65536"));
    assert_eq!(answer(op, "MaxOutstandingUnexpectedPDUs"), None);
    let p = params.expect("datamover enabled");
    assert!(p.rdma_extensions);
    assert_eq!(p.target_recv_data_segment_length, 16384);
    assert_eq!(p.initiator_recv_data_segment_length, 262_144);
    assert_eq!(p.max_outstanding_unexpected_pdus, 0);
    // The iSER lengths are the ones the session layer sizes PDUs by.
    assert_eq!(p.max_recv_data_segment_length, 16384);
    assert_eq!(p.max_xmit_data_segment_length, 262_144);
    assert_eq!(p.header_digest, crate::keys::Digest::None);
    assert_eq!(p.data_digest, crate::keys::Digest::None);
    assert_eq!(p.max_burst_length, 65536);
    assert_eq!(p.first_burst_length, 32768);
}

/// Only unsolicited data comes in Sends, so an RDMA connection receives
/// no more than the FirstBurstLength in one, whatever the
/// MaxRecvDataSegmentLength: its receive buffers are that large, and the
/// login agrees no more. TCP keeps the MaxRecvDataSegmentLength.
#[test]
fn an_rdma_connection_receives_at_most_the_first_burst_in_a_send() {
    let big = IscsiConfig {
        max_recv_data_segment_length: 262_144,
        first_burst_length: 65_536,
        ..cfg()
    };
    assert_eq!(big.rdma_recv_data_segment_length(), 65_536);
    let (rsps, params) =
        login_over_with(big.clone(), true, ISER_SECURITY_KEYS, ISER_OPERATIONAL_KEYS);
    let (st, op) = &rsps[1];
    assert_eq!(*st, [0, 0]);
    assert_eq!(answer(op, "TargetRecvDataSegmentLength"), Some("65536"));
    let p = params.expect("datamover enabled");
    assert_eq!(p.max_recv_data_segment_length, 65_536);
    let (rsps, _) = login_over_with(big, false, ISER_SECURITY_KEYS, &[]);
    let declared = rsps
        .iter()
        .find_map(|(_, keys)| answer(keys, "MaxRecvDataSegmentLength").map(str::to_string));
    assert_eq!(declared.as_deref(), Some("262144"));
}

#[test]
fn iser_keys_on_a_tcp_connection_get_rdma_extensions_no() {
    let (rsps, params) = login_over(false, ISER_SECURITY_KEYS, ISER_OPERATIONAL_KEYS);
    let (st, op) = &rsps[1];
    assert_eq!(*st, [0, 0]);
    assert_eq!(answer(op, "RDMAExtensions"), Some("No"));
    assert_eq!(
        answer(op, "TargetRecvDataSegmentLength"),
        Some("Irrelevant")
    );
    assert_eq!(
        answer(op, "InitiatorRecvDataSegmentLength"),
        Some("Irrelevant")
    );
    // TCP declares MaxRecvDataSegmentLength as always.
    assert_eq!(answer(op, "MaxRecvDataSegmentLength"), Some("16384"));
    let p = params.expect("datamover enabled");
    assert!(!p.rdma_extensions);
    assert_eq!(p.max_recv_data_segment_length, 16384);
    assert_eq!(p.max_xmit_data_segment_length, 8192);
    assert_eq!(p.target_recv_data_segment_length, 8192);
    assert_eq!(p.initiator_recv_data_segment_length, 8192);
}

#[test]
fn digests_offered_on_an_rdma_connection_are_answered_none() {
    let mut op = ISER_OPERATIONAL_KEYS.to_vec();
    op.push(("HeaderDigest", "CRC32C,None"));
    op.push(("DataDigest", "CRC32C"));
    let (rsps, params) = login_over(true, ISER_SECURITY_KEYS, &op);
    let (st, keys) = &rsps[1];
    assert_eq!(*st, [0, 0]);
    assert_eq!(answer(keys, "HeaderDigest"), Some("None"));
    assert_eq!(answer(keys, "DataDigest"), Some("None"));
    let p = params.expect("datamover enabled");
    assert_eq!(p.header_digest, crate::keys::Digest::None);
    assert_eq!(p.data_digest, crate::keys::Digest::None);
}

#[test]
fn an_rdma_connection_needs_rdma_extensions_yes() {
    // Refused by the initiator: the login fails before full feature.
    let mut op = ISER_OPERATIONAL_KEYS.to_vec();
    op.retain(|(k, _)| *k != "RDMAExtensions");
    op.push(("RDMAExtensions", "No"));
    let (rsps, params) = login_over(true, ISER_SECURITY_KEYS, &op);
    assert_eq!(rsps.last().map(|(st, _)| *st), Some([2, 0]));
    assert!(params.is_none());
    // Not offered: the target offers it and holds the transit until the
    // initiator answers; without TargetRecvDataSegmentLength the target
    // declares its own.
    let mut op = ISER_OPERATIONAL_KEYS.to_vec();
    op.retain(|(k, _)| *k != "RDMAExtensions" && *k != "TargetRecvDataSegmentLength");
    let (rsps, params) = login_over(true, ISER_SECURITY_KEYS, &op);
    let (st, keys) = &rsps[1];
    assert_eq!(*st, [0, 0]);
    assert_eq!(answer(keys, "RDMAExtensions"), Some("Yes"));
    assert_eq!(answer(keys, "TargetRecvDataSegmentLength"), Some("16384"));
    assert!(params.is_none());
}
