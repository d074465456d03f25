//! SRP end to end over the soft RDMA provider: the project's initiator
//! against a target channel driven by `TargetConn`, with an in-memory core
//! stand-in (a RAM disk that knows READ(10), WRITE(10), TEST UNIT READY and
//! a vendor opcode that parks a command until task management aborts it).
#![allow(clippy::unwrap_used)] // test helpers outside #[test] functions

use std::collections::{HashMap, VecDeque};
use std::sync::mpsc;
use std::thread;
use std::time::Duration;

use ferrite_core::{
    Abort, Action, CmdId, CmdRequest, Residual, Response, TmfFunction, TmfId, TmfRequest,
    TmfResponse,
};
use ferrite_rdma::CompletionQueue;
use ferrite_rdma::soft::{QpAttrs, SoftAddr, SoftCq, SoftDevice, SoftListener, SoftQp};
use ferrite_reactor::buf::{BufPool, SgList};
use ferrite_scsi::{Lun, Sense, SenseKey};
use ferrite_srp::channel::{self, ChannelConfig, Event, Login};
use ferrite_srp::initiator::{self, InitError, InitiatorConfig, Layout};
use ferrite_srp::iu::{self, RspCode, TskFunc};
use ferrite_srp::target::{RecvRing, TargetConn};

const BS: usize = 512;
const BLOCKS: usize = 256;
const HOLD: u8 = 0xc0;
const PORT: [u8; 16] = *b"ferrite-srp-port";

/// The core stand-in.
struct MemCore {
    disk: Vec<u8>,
    pool: BufPool,
    next: u32,
    cmds: HashMap<CmdId, CmdRequest>,
    held: Vec<CmdId>,
    actions: VecDeque<Action>,
    submitted: u32,
}

impl MemCore {
    fn new() -> MemCore {
        MemCore {
            disk: vec![0; BS * BLOCKS],
            pool: BufPool::new(4096, 64),
            next: 1,
            cmds: HashMap::new(),
            held: Vec::new(),
            actions: VecDeque::new(),
            submitted: 0,
        }
    }

    fn lba_len(cdb: &[u8]) -> (usize, usize) {
        let lba = u32::from_be_bytes([cdb[2], cdb[3], cdb[4], cdb[5]]) as usize;
        let n = u16::from_be_bytes([cdb[7], cdb[8]]) as usize;
        (lba, n)
    }

    fn respond(&mut self, id: CmdId, rsp: Response) {
        let tag = self.cmds[&id].tag;
        self.actions.push_back(Action::Respond { id, tag, rsp });
    }

    fn submit(&mut self, req: CmdRequest) {
        self.submitted += 1;
        let id = CmdId(self.next);
        self.next += 1;
        let cdb = req.cdb.clone();
        let expected = req.expected_len as usize;
        let tag = req.tag;
        self.cmds.insert(id, req);
        match cdb[0] {
            0x00 => self.respond(id, Response::good()),
            0x28 | 0x2a => {
                let (lba, n) = Self::lba_len(&cdb);
                if lba + n > BLOCKS {
                    return self.respond(id, Response::check(Sense::LBA_OUT_OF_RANGE));
                }
                let len = n * BS;
                let xfer = len.min(expected);
                let residual = if expected > len {
                    Residual::Underflow((expected - len) as u32)
                } else if expected < len {
                    Residual::Overflow((len - expected) as u32)
                } else {
                    Residual::None
                };
                if cdb[0] == 0x28 {
                    let mut sg = self.pool.sg(xfer);
                    sg.copy_in(0, &self.disk[lba * BS..lba * BS + xfer]);
                    self.respond(
                        id,
                        Response {
                            data: Some(sg),
                            data_len: xfer as u32,
                            residual,
                            ..Response::good()
                        },
                    );
                } else {
                    self.actions.push_back(Action::FetchData {
                        id,
                        tag,
                        buf: self.pool.sg(xfer),
                        offset: 0,
                        len: xfer as u32,
                    });
                }
            }
            HOLD => self.held.push(id),
            _ => self.respond(id, Response::check(Sense::INVALID_COMMAND_OPERATION_CODE)),
        }
    }

    fn data_out_done(&mut self, id: CmdId, r: Result<SgList, Abort>) {
        let Some(req) = self.cmds.get(&id) else {
            return;
        };
        match r {
            Ok(sg) => {
                let (lba, _) = Self::lba_len(&req.cdb);
                let n = sg.len();
                sg.copy_out(0, &mut self.disk[lba * BS..lba * BS + n]);
                self.respond(id, Response::good());
            }
            Err(_) => {
                self.cmds.remove(&id);
            }
        }
    }

    fn task_mgmt(&mut self, id: TmfId, t: TmfRequest) {
        let rsp = match t.func {
            TmfFunction::AbortTask { tag } => {
                match self.held.iter().position(|c| self.cmds[c].tag == tag) {
                    Some(k) => {
                        let c = self.held.remove(k);
                        self.cmds.remove(&c);
                        TmfResponse::Complete
                    }
                    None => TmfResponse::TaskNotFound,
                }
            }
            TmfFunction::LogicalUnitReset => {
                for c in self.held.drain(..) {
                    self.cmds.remove(&c);
                }
                TmfResponse::Complete
            }
            _ => TmfResponse::Rejected,
        };
        self.actions.push_back(Action::TmfDone {
            id,
            tag: t.tag,
            rsp,
        });
    }
}

/// What the target thread reports when its channel ends: counts of what
/// its core was left with (the core itself, holding responses bound to
/// that thread, stays there).
struct TargetReport {
    cmds_left: usize,
    submitted: u32,
    held: usize,
    logins_rejected: u32,
}

enum Ctl {
    Aen(Lun, Sense),
    Close,
}

fn addr(name: &str) -> SoftAddr {
    let p = std::env::temp_dir().join(format!("ferrite-srp-{}-{name}.sock", std::process::id()));
    let _ = std::fs::remove_file(&p);
    SoftAddr::Unix(p)
}

fn target_cfg() -> ChannelConfig {
    ChannelConfig {
        credits: 8,
        target_port_id: PORT,
        ..ChannelConfig::default()
    }
}

/// Serves logins on `listener` until one channel has run and closed.
fn serve(listener: SoftListener, cfg: ChannelConfig, ctl: mpsc::Receiver<Ctl>) -> TargetReport {
    let dev = SoftDevice::new("soft-t");
    let pd = dev.alloc_pd();
    let cq = SoftCq::new().unwrap();
    let mut core = MemCore::new();
    let mut logins_rejected = 0;
    let attrs = QpAttrs::default();
    let mut conn = loop {
        let req = listener
            .wait_request(Duration::from_secs(10))
            .expect("no login");
        match channel::login(cfg.clone(), req.private_data()) {
            Login::Reject { rej, .. } => {
                logins_rejected += 1;
                req.reject(&rej.encode()).unwrap();
            }
            Login::Accept { channel, rsp, .. } => {
                let qp = SoftQp::create(&pd, &cq, &cq, None, attrs);
                let ring = RecvRing::for_config(&pd, channel.config()).unwrap();
                ring.post_all(&qp).unwrap();
                qp.accept(req, &rsp.encode()).unwrap();
                break TargetConn::new(
                    channel,
                    Box::new(qp),
                    Box::new(pd.clone()),
                    ring,
                    attrs.max_sge,
                )
                .unwrap();
            }
        }
    };
    let mut closed = false;
    let mut tmf_ids = 0;
    let mut wcs = Vec::new();
    loop {
        cq.wait(Duration::from_millis(10));
        wcs.clear();
        cq.poll_cq(&mut wcs);
        for wc in &wcs {
            conn.handle_completion(wc);
        }
        conn.poll_conn_events();
        while let Ok(c) = ctl.try_recv() {
            core.actions.push_back(match c {
                Ctl::Aen(lun, sense) => Action::Aen { lun, sense },
                Ctl::Close => Action::Close,
            });
        }
        loop {
            let mut busy = false;
            while let Some(ev) = conn.poll_event() {
                busy = true;
                match ev {
                    Event::Submit(r) => core.submit(r),
                    Event::TaskMgmt(t) => {
                        tmf_ids += 1;
                        core.task_mgmt(TmfId(tmf_ids), t)
                    }
                    Event::DataOut { id, result } => core.data_out_done(id, result),
                    Event::ResponseSent(id) => {
                        core.cmds.remove(&id);
                    }
                    Event::Closed => closed = true,
                }
            }
            while let Some(a) = core.actions.pop_front() {
                busy = true;
                conn.handle_action(a);
            }
            conn.pump();
            if !busy {
                break;
            }
        }
        if closed && conn.finished() {
            break;
        }
    }
    TargetReport {
        cmds_left: core.cmds.len(),
        submitted: core.submitted,
        held: core.held.len(),
        logins_rejected,
    }
}

struct Rig {
    ini: initiator::Initiator,
    target: thread::JoinHandle<TargetReport>,
    ctl: mpsc::Sender<Ctl>,
    _dev: SoftDevice,
}

fn rig(name: &str, cfg: ChannelConfig) -> Rig {
    let icfg = InitiatorConfig {
        initiator_port_id: [7; 16],
        target_port_id: PORT,
        ..InitiatorConfig::default()
    };
    rig_with(name, cfg, icfg)
}

fn rig_with(name: &str, cfg: ChannelConfig, icfg: InitiatorConfig) -> Rig {
    let listener = SoftListener::bind(&addr(name)).unwrap();
    let a = listener.addr().clone();
    let (ctl, rx) = mpsc::channel();
    let target = thread::spawn(move || serve(listener, cfg, rx));
    let dev = SoftDevice::new("soft-i");
    let pd = dev.alloc_pd();
    let cq = SoftCq::new().unwrap();
    let ini = initiator::connect_soft(&pd, &cq, &a, icfg).unwrap();
    Rig {
        ini,
        target,
        ctl,
        _dev: dev,
    }
}

fn rw10(op: u8, lba: u32, blocks: u16) -> [u8; 10] {
    let mut c = [0u8; 10];
    c[0] = op;
    c[2..6].copy_from_slice(&lba.to_be_bytes());
    c[7..9].copy_from_slice(&blocks.to_be_bytes());
    c
}

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

#[test]
fn write_then_read_back_with_every_descriptor_layout() {
    let mut r = rig("rw", target_cfg());
    assert_eq!(r.ini.login_rsp.req_lim_delta, 8);
    let layouts = [
        Layout {
            segments: 1,
            inline_max: 16,
        }, // direct
        Layout {
            segments: 4,
            inline_max: 16,
        }, // indirect, all inline
        Layout {
            segments: 6,
            inline_max: 2,
        }, // indirect, table fetched by RDMA READ
        Layout {
            segments: 3,
            inline_max: 0,
        }, // indirect, nothing inline
    ];
    for (k, w) in layouts.iter().enumerate() {
        let lba = (k * 16) as u32;
        let data = pattern(k as u8, 8 * BS);
        let done = r
            .ini
            .command(Lun(0), &rw10(0x2a, lba, 8), Some(&data), 0, *w)
            .unwrap();
        assert_eq!(done.rsp.status, 0, "write with {w:?}");
        // Read back with a different layout than the write used.
        let rl = layouts[(k + 1) % layouts.len()];
        let back = r
            .ini
            .command(Lun(0), &rw10(0x28, lba, 8), None, (8 * BS) as u32, rl)
            .unwrap();
        assert_eq!(back.rsp.status, 0);
        assert_eq!(back.rsp.flags, 0);
        assert_eq!(
            back.data, data,
            "read back with {rl:?} after write with {w:?}"
        );
    }
    r.ini.logout().unwrap();
    let rep = r.target.join().unwrap();
    assert_eq!(rep.cmds_left, 0, "commands left in the core");
    assert_eq!(rep.submitted, 8);
}

#[test]
fn rdma_cm_login_layout_and_immediate_data_through_the_driver() {
    // The login as Linux sends it over RDMA CM: 56 bytes, immediate data at
    // offset 68, an IU of 8260 bytes.
    let icfg = InitiatorConfig {
        initiator_port_id: [7; 16],
        target_port_id: PORT,
        max_it_iu_len: 68 + 8192,
        login_layout: iu::LoginLayout::RdmaCm,
        immediate_data: true,
        ..InitiatorConfig::default()
    };
    assert_eq!(icfg.login_private_data().len(), iu::LOGIN_REQ_RDMA_LEN);
    let mut r = rig_with("imm", target_cfg(), icfg);
    assert_eq!(r.ini.login_rsp.max_it_iu_len, 68 + 8192);
    assert_eq!(r.ini.immediate_data(), Some((68, 8192)));
    for (k, blocks) in [1u16, 8, 16, 17, 32].into_iter().enumerate() {
        let lba = (k * 40) as u32;
        let data = pattern(k as u8 + 40, blocks as usize * BS);
        let before = r.ini.immediate_writes;
        let done = r
            .ini
            .command(
                Lun(0),
                &rw10(0x2a, lba, blocks),
                Some(&data),
                0,
                Layout::default(),
            )
            .unwrap();
        assert_eq!(done.rsp.status, 0, "{blocks} blocks at {lba}");
        // Up to 8 KiB in the SRP_CMD; beyond, by RDMA READ.
        assert_eq!(r.ini.immediate_writes - before, u64::from(blocks <= 16));
        let back = r
            .ini
            .command(
                Lun(0),
                &rw10(0x28, lba, blocks),
                None,
                data.len() as u32,
                Layout::default(),
            )
            .unwrap();
        assert_eq!(back.data, data, "{blocks} blocks");
    }
    r.ini.logout().unwrap();
    let rep = r.target.join().unwrap();
    assert_eq!(rep.cmds_left, 0);
    assert_eq!(rep.submitted, 10);
}

#[test]
fn residuals_and_check_condition() {
    let mut r = rig("res", target_cfg());
    // READ of 1 block into a 2-block buffer: underflow of one block.
    let d = r
        .ini
        .command(
            Lun(0),
            &rw10(0x28, 0, 1),
            None,
            (2 * BS) as u32,
            Layout::default(),
        )
        .unwrap();
    assert_eq!(d.rsp.flags & iu::RSP_FLAG_DIUNDER, iu::RSP_FLAG_DIUNDER);
    assert_eq!(d.rsp.data_in_res_cnt, BS as u32);
    // Unknown opcode: CHECK CONDITION, ILLEGAL REQUEST / 20h.
    let d = r
        .ini
        .command(Lun(0), &[0xee, 0, 0, 0, 0, 0], None, 0, Layout::default())
        .unwrap();
    assert_eq!(d.rsp.status, 0x02);
    assert_eq!(d.rsp.flags & iu::RSP_FLAG_SNSVALID, iu::RSP_FLAG_SNSVALID);
    assert_eq!(
        (d.rsp.sense[2] & 0xf, d.rsp.sense[12]),
        (SenseKey::ILLEGAL_REQUEST.0, 0x20)
    );
    // Out-of-range LBA.
    let d = r
        .ini
        .command(
            Lun(0),
            &rw10(0x28, BLOCKS as u32, 1),
            None,
            BS as u32,
            Layout::default(),
        )
        .unwrap();
    assert_eq!((d.rsp.status, d.rsp.sense[12]), (0x02, 0x21));
    r.ini.logout().unwrap();
    r.target.join().unwrap();
}

#[test]
fn task_management_aborts_a_parked_command() {
    let mut r = rig("tmf", target_cfg());
    let parked = r
        .ini
        .submit(
            Lun(0),
            &[HOLD, 0, 0, 0, 0, 0],
            None,
            0,
            Layout::default(),
            0,
        )
        .unwrap();
    // Another command still runs past it.
    let d = r
        .ini
        .command(Lun(0), &[0, 0, 0, 0, 0, 0], None, 0, Layout::default())
        .unwrap();
    assert_eq!(d.rsp.status, 0);
    assert!(!r.ini.has_response(parked));
    let rsp = r
        .ini
        .task_mgmt(Lun(0), TskFunc::ABORT_TASK, parked)
        .unwrap();
    assert_eq!(rsp.rsp_code(), Some(RspCode::COMPLETE));
    // Aborting a task that does not exist completes too (SAM-5 §7.2).
    let rsp = r
        .ini
        .task_mgmt(Lun(0), TskFunc::ABORT_TASK, 0xdead)
        .unwrap();
    assert_eq!(rsp.rsp_code(), Some(RspCode::COMPLETE));
    // LUN RESET clears two more parked commands.
    for _ in 0..2 {
        r.ini
            .submit(
                Lun(0),
                &[HOLD, 0, 0, 0, 0, 0],
                None,
                0,
                Layout::default(),
                0,
            )
            .unwrap();
    }
    let rsp = r.ini.task_mgmt(Lun(0), TskFunc::LUN_RESET, 0).unwrap();
    assert_eq!(rsp.rsp_code(), Some(RspCode::COMPLETE));
    // A function SRP does not define is refused by the channel itself.
    let rsp = r.ini.task_mgmt(Lun(0), TskFunc(0x20), 0).unwrap();
    assert_eq!(rsp.rsp_code(), Some(RspCode::NOT_SUPPORTED));
    assert!(!r.ini.has_response(parked), "aborted command answered");
    r.ini.logout().unwrap();
    let rep = r.target.join().unwrap();
    assert_eq!(rep.held, 0);
}

#[test]
fn credits_bound_outstanding_commands_and_are_returned() {
    let cfg = ChannelConfig {
        credits: 3,
        ..target_cfg()
    };
    let mut r = rig("cred", cfg);
    assert_eq!(r.ini.credits(), 3);
    let mut tags = Vec::new();
    let mut max_in_flight = 0;
    for k in 0..20u32 {
        let data = pattern(k as u8, BS);
        // submit() waits for a credit when none is left.
        tags.push((
            k,
            r.ini
                .submit(
                    Lun(0),
                    &rw10(0x2a, k, 1),
                    Some(&data),
                    0,
                    Layout::default(),
                    0,
                )
                .unwrap(),
        ));
        assert!(r.ini.in_flight() <= 3);
        max_in_flight = max_in_flight.max(r.ini.in_flight());
    }
    assert!(max_in_flight >= 2, "commands never overlapped");
    for (_, t) in tags {
        let d = r.ini.wait(t).unwrap();
        assert_eq!(
            d.rsp.status, 0,
            "a command was refused (BUSY means the limit was overrun)"
        );
    }
    for k in 0..20u32 {
        let d = r
            .ini
            .command(
                Lun(0),
                &rw10(0x28, k, 1),
                None,
                BS as u32,
                Layout::default(),
            )
            .unwrap();
        assert_eq!(d.data, pattern(k as u8, BS));
    }
    assert_eq!(r.ini.credits(), 3);
    r.ini.logout().unwrap();
    r.target.join().unwrap();
}

#[test]
fn aen_arrives_as_aer_req() {
    let mut r = rig("aen", target_cfg());
    let sense = Sense::new(SenseKey::UNIT_ATTENTION, 0x3f, 0x0e);
    r.ctl.send(Ctl::Aen(Lun(0), sense)).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while r.ini.aens.is_empty() {
        assert!(std::time::Instant::now() < deadline, "no AER");
        let _ = r
            .ini
            .command(Lun(0), &[0, 0, 0, 0, 0, 0], None, 0, Layout::default())
            .unwrap();
    }
    let a = &r.ini.aens[0];
    assert_eq!((a.sense[2], a.sense[12], a.sense[13]), (6, 0x3f, 0x0e));
    // A second AEN goes out once the first was answered.
    r.ctl.send(Ctl::Aen(Lun(0), sense)).unwrap();
    while r.ini.aens.len() < 2 {
        assert!(std::time::Instant::now() < deadline, "no second AER");
        let _ = r
            .ini
            .command(Lun(0), &[0, 0, 0, 0, 0, 0], None, 0, Layout::default())
            .unwrap();
    }
    r.ini.logout().unwrap();
    r.target.join().unwrap();
}

#[test]
fn login_to_the_wrong_port_is_rejected_then_retried() {
    let listener = SoftListener::bind(&addr("rej")).unwrap();
    let a = listener.addr().clone();
    let (_ctl, rx) = mpsc::channel();
    let target = thread::spawn(move || serve(listener, target_cfg(), rx));
    let dev = SoftDevice::new("soft-i");
    let pd = dev.alloc_pd();
    let cq = SoftCq::new().unwrap();
    let bad = InitiatorConfig {
        target_port_id: [0; 16],
        ..InitiatorConfig::default()
    };
    match initiator::connect_soft(&pd, &cq, &a, bad) {
        Err(InitError::LoginRejected(reason)) => {
            assert_eq!(reason, iu::LoginRejReason::UNABLE_TO_ASSOCIATE.0)
        }
        other => panic!("expected a login reject, got {other:?}"),
    }
    let cq2 = SoftCq::new().unwrap();
    let good = InitiatorConfig {
        target_port_id: PORT,
        ..InitiatorConfig::default()
    };
    let ini = initiator::connect_soft(&pd, &cq2, &a, good).unwrap();
    ini.logout().unwrap();
    let rep = target.join().unwrap();
    assert_eq!(rep.logins_rejected, 1);
}

#[test]
fn initiator_disconnect_ends_the_target_channel() {
    let mut r = rig("dc", target_cfg());
    let _parked = r
        .ini
        .submit(
            Lun(0),
            &[HOLD, 0, 0, 0, 0, 0],
            None,
            0,
            Layout::default(),
            0,
        )
        .unwrap();
    // Wait until the target has it, then drop the connection without a logout.
    let d = r
        .ini
        .command(Lun(0), &[0, 0, 0, 0, 0, 0], None, 0, Layout::default())
        .unwrap();
    assert_eq!(d.rsp.status, 0);
    drop(r.ini);
    let rep = r.target.join().unwrap();
    // The parked command is still the core's to abort; the channel ended.
    assert_eq!(rep.held, 1);
}

#[test]
fn target_logout_reaches_the_initiator_before_the_disconnect() {
    let mut r = rig("tlo", target_cfg());
    let d = r
        .ini
        .command(Lun(0), &[0, 0, 0, 0, 0, 0], None, 0, Layout::default())
        .unwrap();
    assert_eq!(d.rsp.status, 0);
    r.ctl.send(Ctl::Close).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while r.ini.closed().is_none() {
        assert!(std::time::Instant::now() < deadline, "channel never closed");
        let _ = r
            .ini
            .progress(std::time::Instant::now() + Duration::from_millis(20));
    }
    // SRP_T_LOGOUT with NO REASON arrived (not just a dropped connection).
    assert_eq!(r.ini.closed(), Some(Some(iu::TLogoutReason::NO_REASON.0)));
    assert!(matches!(
        r.ini.command(Lun(0), &[0; 6], None, 0, Layout::default()),
        Err(InitError::Closed(_))
    ));
    r.target.join().unwrap();
}
