//! Channel scenarios without a queue pair.

use super::*;
use crate::iu::{CmdBuilder, LoginReq, Rsp};
use ferrite_reactor::buf::IoBuf;

const PORT: [u8; 16] = [0xfe; 16];

fn cfg() -> ChannelConfig {
    ChannelConfig {
        credits: 4,
        target_port_id: PORT,
        ..ChannelConfig::default()
    }
}

fn login_req() -> LoginReq {
    LoginReq {
        tag: 1,
        req_it_iu_len: 1024,
        req_buf_fmt: iu::BUF_FORMAT_DIRECT | iu::BUF_FORMAT_INDIRECT,
        req_flags: 0,
        imm_data_offset: 0,
        initiator_port_id: [1; 16],
        target_port_id: PORT,
    }
}

fn channel() -> Channel {
    match login(cfg(), &login_req().encode()) {
        Login::Accept { channel, rsp, .. } => {
            assert_eq!(rsp.req_lim_delta, 4);
            assert_eq!(rsp.max_it_iu_len, 1024);
            *channel
        }
        Login::Reject { rej, why } => panic!("rejected: {rej:?} ({why})"),
    }
}

fn seg(addr: u64, len: u32) -> RemoteSeg {
    RemoteSeg {
        addr,
        rkey: 0x8000_0042,
        len,
    }
}

fn read10(lba: u32, blocks: u16) -> [u8; 10] {
    let mut c = [0u8; 10];
    c[0] = 0x28;
    c[2..6].copy_from_slice(&lba.to_be_bytes());
    c[7..9].copy_from_slice(&blocks.to_be_bytes());
    c
}

fn cmd(tag: u64, cdb: &[u8], out: &[RemoteSeg], din: &[RemoteSeg]) -> Vec<u8> {
    CmdBuilder {
        tag,
        lun: Lun(0).encode(),
        task_attr: 0,
        cdb,
        data_out: out,
        data_in: din,
        out_table: None,
        in_table: None,
        inline_max: 16,
    }
    .encode()
}

/// Feeds an IU and reposts its buffer, as a driver does.
fn recv(ch: &mut Channel, b: &[u8]) {
    ch.handle_recv(b);
    ch.recv_reposted();
}

fn events(ch: &mut Channel) -> Vec<Event> {
    std::iter::from_fn(|| ch.poll_event()).collect()
}

fn transmits(ch: &mut Channel) -> Vec<Transmit> {
    std::iter::from_fn(|| ch.poll_transmit()).collect()
}

fn sent_iu(t: &Transmit) -> (OpId, &[u8]) {
    match t {
        Transmit::Send { op, iu } => (*op, iu),
        other => panic!("expected a SEND, got {other:?}"),
    }
}

#[test]
fn login_rejections() {
    let rej = |r: LoginReq| match login(cfg(), &r.encode()) {
        Login::Reject { rej, .. } => rej.reason,
        Login::Accept { .. } => panic!("accepted"),
    };
    let mut r = login_req();
    r.req_it_iu_len = 1 << 20;
    assert_eq!(rej(r), iu::LoginRejReason::IT_IU_LENGTH_TOO_LARGE);
    let mut r = login_req();
    r.req_buf_fmt = 1 << 5;
    assert_eq!(rej(r), iu::LoginRejReason::UNSUPPORTED_DESCRIPTOR_FORMAT);
    let mut r = login_req();
    r.target_port_id = [0; 16];
    assert_eq!(rej(r), iu::LoginRejReason::UNABLE_TO_ASSOCIATE);
    match login(cfg(), &[0u8; 10]) {
        Login::Reject { rej, .. } => {
            assert_eq!(rej.reason, iu::LoginRejReason::UNABLE_TO_ESTABLISH)
        }
        Login::Accept { .. } => panic!("accepted garbage"),
    }
}

/// What the channel answers `private_data` with: the reason and why, or
/// the accepted response, request and layout.
fn answer(
    c: ChannelConfig,
    private_data: &[u8],
) -> Result<(iu::LoginRsp, Channel), (iu::LoginRej, LoginRefusal)> {
    match login(c, private_data) {
        Login::Accept { channel, rsp, .. } => Ok((rsp, *channel)),
        Login::Reject { rej, why } => Err((rej, why)),
    }
}

/// A login as Linux's ib_srp sends it over RDMA CM: 56 bytes, immediate
/// data asked for at offset 68, an IU of 8260 bytes.
fn linux_login(flags: u8) -> LoginReq {
    LoginReq {
        tag: 0,
        req_it_iu_len: 8260,
        req_buf_fmt: iu::BUF_FORMAT_DIRECT | iu::BUF_FORMAT_INDIRECT,
        req_flags: flags | iu::LOGIN_REQ_IMMED_REQUESTED,
        imm_data_offset: 68,
        initiator_port_id: [2; 16],
        target_port_id: PORT,
    }
}

#[test]
fn login_in_either_layout_is_one_request() {
    for layout in [iu::LoginLayout::RdmaCm, iu::LoginLayout::Iu] {
        let req = linux_login(iu::MULTICHAN_SINGLE);
        let b = req.encode_as(layout);
        let Login::Accept {
            channel,
            rsp,
            req: got,
            layout: seen,
        } = login(cfg(), &b)
        else {
            panic!("{layout:?} rejected")
        };
        assert_eq!((got, seen), (req.clone(), layout));
        // The response: the tag echoed, the credits, the IU length asked
        // for (the channel's receive buffers are that size), the formats,
        // and SRP-2 immediate data supported.
        assert_eq!(rsp.tag, 0);
        assert_eq!(rsp.req_lim_delta, 4);
        assert_eq!(rsp.max_it_iu_len, 8260);
        assert_eq!(rsp.buf_fmt, iu::BUF_FORMAT_DIRECT | iu::BUF_FORMAT_INDIRECT);
        assert_eq!(rsp.rsp_flags, iu::LOGIN_RSP_IMMED_SUPP);
        assert_eq!(channel.config().max_it_iu_len, 8260);
        assert_eq!(channel.immediate_data_offset(), Some(68));
        // The response parses as the initiator reads it (52 bytes).
        assert_eq!(iu::LoginRsp::parse(&rsp.encode()), Ok(rsp));
    }
}

#[test]
fn immediate_data_is_granted_only_when_asked_for_and_usable() {
    let granted = |c: ChannelConfig, r: LoginReq| {
        let (rsp, ch) = answer(c, &r.encode_rdma_cm()).unwrap();
        assert_eq!(
            rsp.rsp_flags & iu::LOGIN_RSP_IMMED_SUPP != 0,
            ch.immediate_data_offset().is_some()
        );
        ch.immediate_data_offset()
    };
    assert_eq!(granted(cfg(), linux_login(0)), Some(68));
    let mut r = linux_login(0);
    r.req_flags &= !iu::LOGIN_REQ_IMMED_REQUESTED;
    assert_eq!(granted(cfg(), r), None, "not asked for");
    let mut r = linux_login(0);
    r.imm_data_offset = 50;
    assert_eq!(granted(cfg(), r), None, "no room for the descriptor");
    let mut r = linux_login(0);
    r.imm_data_offset = 52;
    assert_eq!(granted(cfg(), r), Some(52), "the smallest usable offset");
    let mut r = linux_login(0);
    r.req_it_iu_len = 68;
    assert_eq!(granted(cfg(), r), None, "no room for data in the IU");
    let off = ChannelConfig {
        immediate_data: false,
        ..cfg()
    };
    assert_eq!(granted(off, linux_login(0)), None, "target policy");
}

#[test]
fn every_refusal_has_its_srp_reason() {
    use iu::LoginRejReason as R;
    let refused = |b: &[u8]| answer(cfg(), b).map(|_| ()).unwrap_err();
    let mut r = linux_login(0);
    r.tag = 0x0102_0304_0506_0708;
    // Short private data: no reason of its own, no tag to echo.
    let (rej, why) = refused(&r.encode_rdma_cm()[..40]);
    assert_eq!(
        (rej.reason, rej.tag, why),
        (R::UNABLE_TO_ESTABLISH, 0, LoginRefusal::Short { got: 40 })
    );
    // Another IU type, in either layout; the tag is echoed from where the
    // layout keeps it.
    let mut b = r.encode_rdma_cm();
    b[11] = iu::IuType::CMD.0;
    let (rej, why) = refused(&b);
    assert_eq!(
        (rej.reason, rej.tag, why),
        (R::UNABLE_TO_ESTABLISH, r.tag, LoginRefusal::NotLoginReq(2))
    );
    let mut b = r.encode();
    b[0] = 0x41;
    let (rej, why) = refused(&b);
    assert_eq!(
        (rej.reason, rej.tag, why),
        (
            R::UNABLE_TO_ESTABLISH,
            r.tag,
            LoginRefusal::NotLoginReq(0x41)
        )
    );
    // A target port id naming another port.
    let mut x = r.clone();
    x.target_port_id = [0x11; 16];
    let (rej, why) = refused(&x.encode_rdma_cm());
    assert_eq!((rej.reason, rej.tag), (R::UNABLE_TO_ASSOCIATE, r.tag));
    assert_eq!(why, LoginRefusal::ForeignTargetPort([0x11; 16]));
    assert!(
        why.to_string()
            .contains("0x11111111111111111111111111111111"),
        "{why}"
    );
    // IU length too large, and too small to hold an SRP_CMD.
    let mut x = r.clone();
    x.req_it_iu_len = DEFAULT_MAX_IT_IU_LEN + 1;
    let (rej, why) = refused(&x.encode_rdma_cm());
    assert_eq!(rej.reason, R::IT_IU_LENGTH_TOO_LARGE);
    assert_eq!(
        why,
        LoginRefusal::IuTooLarge {
            asked: DEFAULT_MAX_IT_IU_LEN + 1,
            max: DEFAULT_MAX_IT_IU_LEN
        }
    );
    x.req_it_iu_len = 47;
    let (rej, why) = refused(&x.encode_rdma_cm());
    assert_eq!(
        (rej.reason, why),
        (R::UNABLE_TO_ESTABLISH, LoginRefusal::IuTooSmall(47))
    );
    // Required buffer formats the target lacks.
    let mut x = r.clone();
    x.req_buf_fmt |= 1 << 3;
    let (rej, why) = refused(&x.encode_rdma_cm());
    assert_eq!(
        (rej.reason, why),
        (
            R::UNSUPPORTED_DESCRIPTOR_FORMAT,
            LoginRefusal::UnsupportedFormats(0x000e)
        )
    );
    // Reserved MULTI-CHANNEL ACTION.
    let mut x = r.clone();
    x.req_flags |= 0x02;
    let (rej, why) = refused(&x.encode_rdma_cm());
    assert_eq!(
        (rej.reason, why),
        (
            R::UNABLE_TO_ESTABLISH,
            LoginRefusal::ReservedMultiChannel(2)
        )
    );
    // Every reject names the formats the target has, and is 32 bytes with
    // SRP_LOGIN_REJ's type first (what the Linux initiator checks before it
    // reads the reason).
    let b = rej.encode();
    assert_eq!((b.len(), b[0]), (32, iu::IuType::LOGIN_REJ.0));
    assert_eq!(rej.buf_fmt, SUPPORTED_BUF_FMT);
    // The driver's refusals.
    assert_eq!(LoginRefusal::PortDisabled.reason(), R::UNABLE_TO_ESTABLISH);
    assert_eq!(LoginRefusal::PortRemoved.reason(), R::UNABLE_TO_ESTABLISH);
    assert_eq!(LoginRefusal::NotAdmitted.reason(), R::UNABLE_TO_ESTABLISH);
    assert_eq!(
        LoginRefusal::Resources("qp").reason(),
        R::INSUFFICIENT_RESOURCES
    );
    assert_eq!(
        LoginRefusal::ChannelLimit(64).reason(),
        R::CHANNEL_LIMIT_REACHED
    );
    assert_eq!(LoginRefusal::ChannelLimit(64).reject(9).tag, 9);
}

/// A channel logged in with immediate data at offset 68.
fn imm_channel() -> Channel {
    let (_, ch) = answer(cfg(), &linux_login(0).encode_rdma_cm()).unwrap();
    ch
}

fn imm_cmd(tag: u64, data: &[u8]) -> Vec<u8> {
    CmdBuilder {
        tag,
        lun: Lun(0).encode(),
        task_attr: 0,
        cdb: &[0x2a, 0, 0, 0, 0, 0, 0, 0, 8, 0],
        data_out: &[],
        data_in: &[],
        out_table: None,
        in_table: None,
        inline_max: 16,
    }
    .encode_immediate(68, data)
    .unwrap()
}

#[test]
fn immediate_write_data_comes_from_the_iu_without_rdma() {
    let mut ch = imm_channel();
    let data: Vec<u8> = (0..4096u32).map(|i| (i * 13) as u8).collect();
    ch.handle_recv_owned(imm_cmd(5, &data));
    ch.recv_reposted();
    let ev = events(&mut ch);
    let Event::Submit(req) = &ev[0] else {
        panic!("{ev:?}")
    };
    assert_eq!((req.dir, req.expected_len), (DataDir::Write, 4096));
    // The core asks for the data in two pieces; both come from the IU.
    ch.handle_action(Action::FetchData {
        id: CmdId(1),
        tag: TaskTag(5),
        buf: SgList::zeroed(4096),
        offset: 0,
        len: 1000,
    });
    let buf = match &mut events(&mut ch)[..] {
        [
            Event::DataOut {
                id: CmdId(1),
                result,
            },
        ] => std::mem::replace(result, Err(Abort::Aborted)).unwrap(),
        other => panic!("{other:?}"),
    };
    ch.handle_action(Action::FetchData {
        id: CmdId(1),
        tag: TaskTag(5),
        buf,
        offset: 1000,
        len: 3096,
    });
    let ev = events(&mut ch);
    let [
        Event::DataOut {
            result: Ok(buf), ..
        },
    ] = &ev[..]
    else {
        panic!("{ev:?}")
    };
    assert_eq!(buf.to_vec(), data);
    assert!(
        !transmits(&mut ch)
            .iter()
            .any(|t| matches!(t, Transmit::RdmaRead { .. })),
        "no RDMA READ for immediate data"
    );
    // Bytes beyond what the command carried are a transport error.
    ch.handle_action(Action::FetchData {
        id: CmdId(1),
        tag: TaskTag(5),
        buf: SgList::zeroed(8192),
        offset: 4096,
        len: 4096,
    });
    assert!(matches!(
        events(&mut ch)[..],
        [Event::DataOut {
            result: Err(Abort::TransportError),
            ..
        }]
    ));
    // The response goes out as for any write; the task ends.
    ch.handle_action(Action::Respond {
        id: CmdId(1),
        tag: TaskTag(5),
        rsp: Response::good(),
    });
    let tx = transmits(&mut ch);
    let (op, b) = sent_iu(&tx[0]);
    assert_eq!(Rsp::parse(b).unwrap().status, 0);
    ch.send_done(op, true);
    assert!(matches!(
        events(&mut ch)[..],
        [Event::ResponseSent(CmdId(1))]
    ));
    assert_eq!(ch.tasks(), 0);
    // A borrowed IU works the same (it is copied once).
    recv(&mut ch, &imm_cmd(6, &data[..512]));
    let ev = events(&mut ch);
    assert!(
        matches!(&ev[..], [Event::Submit(r)] if r.expected_len == 512),
        "{ev:?}"
    );
}

#[test]
fn immediate_data_on_a_channel_without_it_logs_out() {
    let mut ch = channel();
    assert_eq!(ch.immediate_data_offset(), None);
    recv(&mut ch, &imm_cmd(5, &[1; 64]));
    let tx = transmits(&mut ch);
    let (_, b) = sent_iu(&tx[0]);
    // SRP r16a §6.6: UNSUPPORTED DATA-OUT BUFFER DESCRIPTOR FORMAT.
    assert_eq!(
        iu::t_logout_reason(b),
        Ok(TLogoutReason::UNSUPPORTED_DATA_OUT_FORMAT)
    );
    assert!(matches!(tx[1], Transmit::Disconnect));
}

#[test]
fn read_command_writes_data_then_response_with_credit() {
    let mut ch = channel();
    let din = [seg(0x10000, 1024)];
    recv(&mut ch, &cmd(7, &read10(0, 2), &[], &din));
    assert_eq!(ch.credits_granted(), 3);
    let ev = events(&mut ch);
    let Event::Submit(req) = &ev[0] else {
        panic!("{ev:?}")
    };
    assert_eq!(req.tag, TaskTag(7));
    assert_eq!(req.dir, DataDir::Read);
    assert_eq!(req.expected_len, 1024);
    assert_eq!(req.lun, Lun(0));
    assert_eq!(&req.cdb[..10], &read10(0, 2));
    let mut data = SgList::new();
    data.push(IoBuf::from_slice(&[0xaa; 512]));
    data.push(IoBuf::from_slice(&[0xbb; 512]));
    ch.handle_action(Action::Respond {
        id: CmdId(1),
        tag: TaskTag(7),
        rsp: Response {
            data: Some(data),
            data_len: 1024,
            ..Response::good()
        },
    });
    let tx = transmits(&mut ch);
    assert_eq!(tx.len(), 2);
    match &tx[0] {
        Transmit::RdmaWrite { xfers, buf, .. } => {
            assert_eq!(
                xfers.as_slice(),
                &[Xfer {
                    remote: din[0],
                    offset: 0
                }]
            );
            assert_eq!(buf.len(), 1024);
        }
        other => panic!("{other:?}"),
    }
    let (op, b) = sent_iu(&tx[1]);
    let rsp = Rsp::parse(b).unwrap();
    assert_eq!(rsp.tag, 7);
    assert_eq!(rsp.status, 0);
    assert_eq!(rsp.flags, 0);
    // The command's receive was reposted: its credit comes back.
    assert_eq!(rsp.req_lim_delta, 1);
    assert_eq!(ch.credits_granted(), 4);
    assert!(events(&mut ch).is_empty(), "response not sent yet");
    ch.send_done(op, true);
    assert!(matches!(
        events(&mut ch)[..],
        [Event::ResponseSent(CmdId(1))]
    ));
    assert_eq!(ch.tasks(), 0);
}

#[test]
fn short_read_reports_underflow_and_long_read_overflow() {
    let mut ch = channel();
    recv(&mut ch, &cmd(1, &read10(0, 1), &[], &[seg(0x1000, 512)]));
    events(&mut ch);
    ch.handle_action(Action::Respond {
        id: CmdId(1),
        tag: TaskTag(1),
        rsp: Response {
            data: Some(SgList::zeroed(1024)),
            data_len: 1024,
            ..Response::good()
        },
    });
    let tx = transmits(&mut ch);
    match &tx[0] {
        Transmit::RdmaWrite { xfers, .. } => assert_eq!(xfers[0].remote.len, 512),
        other => panic!("{other:?}"),
    }
    let rsp = Rsp::parse(sent_iu(&tx[1]).1).unwrap();
    assert_eq!(rsp.flags, iu::RSP_FLAG_DIOVER);
    assert_eq!(rsp.data_in_res_cnt, 512);

    recv(&mut ch, &cmd(2, &read10(0, 2), &[], &[seg(0x1000, 1024)]));
    events(&mut ch);
    ch.handle_action(Action::Respond {
        id: CmdId(2),
        tag: TaskTag(2),
        rsp: Response {
            data: Some(SgList::zeroed(512)),
            data_len: 512,
            residual: Residual::Underflow(512),
            ..Response::good()
        },
    });
    let tx = transmits(&mut ch);
    let rsp = Rsp::parse(sent_iu(&tx[1]).1).unwrap();
    assert_eq!(rsp.flags, iu::RSP_FLAG_DIUNDER);
    assert_eq!(rsp.data_in_res_cnt, 512);
}

#[test]
fn write_command_reads_data_across_indirect_descriptors() {
    let mut ch = channel();
    let out = [seg(0x1000, 100), seg(0x5000, 400)];
    let mut c = cmd(3, &[0x2a, 0, 0, 0, 0, 0, 0, 0, 1, 0], &out, &[]);
    c[29] = iu::TASK_ATTR_ORDERED;
    recv(&mut ch, &c);
    let ev = events(&mut ch);
    let Event::Submit(req) = &ev[0] else {
        panic!("{ev:?}")
    };
    assert_eq!(
        (req.dir, req.expected_len, req.attr),
        (DataDir::Write, 500, TaskAttr::Ordered)
    );
    // The core asks for bytes 50..450.
    ch.handle_action(Action::FetchData {
        id: CmdId(9),
        tag: TaskTag(3),
        buf: SgList::zeroed(500),
        offset: 50,
        len: 400,
    });
    let tx = transmits(&mut ch);
    let Transmit::RdmaRead { op, buf, xfers } = tx.into_iter().next().unwrap() else {
        panic!("expected a READ")
    };
    assert_eq!(
        xfers.as_slice(),
        &[
            Xfer {
                remote: seg(0x1000 + 50, 50),
                offset: 50
            },
            Xfer {
                remote: seg(0x5000, 350),
                offset: 100
            }
        ]
    );
    ch.rdma_done(op, buf, true);
    let ev = events(&mut ch);
    match &ev[..] {
        [
            Event::DataOut {
                id: CmdId(9),
                result: Ok(b),
            },
        ] => assert_eq!(b.len(), 500),
        other => panic!("{other:?}"),
    }
    // Asking past the initiator's buffer is a transport error, not a panic.
    ch.handle_action(Action::FetchData {
        id: CmdId(9),
        tag: TaskTag(3),
        buf: SgList::zeroed(1000),
        offset: 0,
        len: 1000,
    });
    assert!(matches!(
        events(&mut ch)[..],
        [Event::DataOut {
            result: Err(Abort::TransportError),
            ..
        }]
    ));
    // A write's residual is reported in the data-out fields.
    ch.handle_action(Action::Respond {
        id: CmdId(9),
        tag: TaskTag(3),
        rsp: Response {
            residual: Residual::Underflow(12),
            ..Response::good()
        },
    });
    let tx = transmits(&mut ch);
    let rsp = Rsp::parse(sent_iu(&tx[0]).1).unwrap();
    assert_eq!(
        (rsp.flags, rsp.data_out_res_cnt),
        (iu::RSP_FLAG_DOUNDER, 12)
    );
}

#[test]
fn partial_descriptor_table_is_fetched_before_submit() {
    let mut ch = channel();
    let segs = [seg(0x1000, 512), seg(0x3000, 512), seg(0x7000, 1024)];
    let table = seg(0xa000, 48);
    let b = CmdBuilder {
        tag: 5,
        lun: Lun(0).encode(),
        task_attr: 0,
        cdb: &read10(0, 4),
        data_out: &[],
        data_in: &segs,
        out_table: None,
        in_table: Some(table),
        inline_max: 1,
    }
    .encode();
    recv(&mut ch, &b);
    assert!(
        events(&mut ch).is_empty(),
        "submitted before the table arrived"
    );
    let tx = transmits(&mut ch);
    let Transmit::RdmaRead { op, mut buf, xfers } = tx.into_iter().next().unwrap() else {
        panic!("expected a table READ")
    };
    assert_eq!(
        xfers.as_slice(),
        &[Xfer {
            remote: table,
            offset: 0
        }]
    );
    assert_eq!(buf.len(), 48);
    buf.copy_in(0, &iu::encode_table(&segs));
    ch.rdma_done(op, buf, true);
    let ev = events(&mut ch);
    let Event::Submit(req) = &ev[0] else {
        panic!("{ev:?}")
    };
    assert_eq!(req.expected_len, 2048);
    ch.handle_action(Action::Respond {
        id: CmdId(1),
        tag: TaskTag(5),
        rsp: Response {
            data: Some(SgList::zeroed(2048)),
            data_len: 2048,
            ..Response::good()
        },
    });
    match &transmits(&mut ch)[0] {
        Transmit::RdmaWrite { xfers, .. } => {
            let r: Vec<RemoteSeg> = xfers.iter().map(|x| x.remote).collect();
            assert_eq!(r, segs);
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn table_that_disagrees_with_total_logs_out() {
    let mut ch = channel();
    let segs = [seg(0x1000, 512), seg(0x3000, 512)];
    let b = CmdBuilder {
        tag: 5,
        lun: Lun(0).encode(),
        task_attr: 0,
        cdb: &read10(0, 2),
        data_out: &[],
        data_in: &segs,
        out_table: None,
        in_table: Some(seg(0xa000, 32)),
        inline_max: 0,
    }
    .encode();
    recv(&mut ch, &b);
    let Some(Transmit::RdmaRead { op, mut buf, .. }) = ch.poll_transmit() else {
        panic!("no table read")
    };
    buf.copy_in(0, &iu::encode_table(&[seg(0x1000, 512), seg(0x3000, 999)]));
    ch.rdma_done(op, buf, true);
    let tx = transmits(&mut ch);
    assert_eq!(
        iu::t_logout_reason(sent_iu(&tx[0]).1),
        Ok(TLogoutReason::INVALID_DATA_IN_COUNT)
    );
    assert!(matches!(tx[1], Transmit::Disconnect));
    assert!(matches!(events(&mut ch)[..], [Event::Closed]));
    assert_eq!(ch.state(), ChannelState::Closed);
}

#[test]
fn credits_come_back_only_after_repost_and_overrun_is_busy() {
    let mut ch = channel();
    for tag in 0..4 {
        ch.handle_recv(&cmd(tag, &[0; 6], &[], &[]));
    }
    assert_eq!(ch.credits_granted(), 0);
    // A fifth command overruns the request limit.
    ch.handle_recv(&cmd(99, &[0; 6], &[], &[]));
    let tx = transmits(&mut ch);
    let busy = Rsp::parse(sent_iu(&tx[0]).1).unwrap();
    assert_eq!((busy.tag, busy.status), (99, Status::BUSY.0));
    assert_eq!(events(&mut ch).len(), 4);
    // Respond before any repost: no credit to return yet.
    ch.handle_action(Action::Respond {
        id: CmdId(0),
        tag: TaskTag(0),
        rsp: Response::good(),
    });
    let tx = transmits(&mut ch);
    let (op, b) = sent_iu(&tx[0]);
    assert_eq!(Rsp::parse(b).unwrap().req_lim_delta, 0);
    ch.send_done(op, true);
    // Two reposts; the next response carries both.
    ch.recv_reposted();
    ch.recv_reposted();
    ch.handle_action(Action::Respond {
        id: CmdId(1),
        tag: TaskTag(1),
        rsp: Response::good(),
    });
    let tx = transmits(&mut ch);
    let (op, b) = sent_iu(&tx[0]);
    assert_eq!(Rsp::parse(b).unwrap().req_lim_delta, 2);
    ch.send_done(op, true);
    assert_eq!(ch.credits_granted(), 2);
    for tag in 2..4 {
        ch.handle_action(Action::Respond {
            id: CmdId(tag as u32),
            tag: TaskTag(tag),
            rsp: Response::good(),
        });
        for t in transmits(&mut ch) {
            ch.send_done(sent_iu(&t).0, true);
        }
    }
    // Nothing in flight; the remaining reposts are returned by SRP_CRED_REQ.
    ch.recv_reposted();
    ch.recv_reposted();
    let tx = transmits(&mut ch);
    assert_eq!(tx.len(), 1);
    let cred = iu::CredReq::parse(sent_iu(&tx[0]).1).unwrap();
    assert_eq!(cred.req_lim_delta, 1);
    // Only one target request at a time: the second credit waits.
    ch.recv_reposted();
    assert!(transmits(&mut ch).is_empty());
    recv(&mut ch, &iu::simple_rsp(IuType::CRED_RSP, cred.tag));
    let tx = transmits(&mut ch);
    let cred2 = iu::CredReq::parse(sent_iu(&tx[0]).1).unwrap();
    assert_eq!(cred2.req_lim_delta, 1);
    assert_eq!(ch.credits_granted(), 4);
}

#[test]
fn overlapped_tag_is_rejected() {
    let mut ch = channel();
    recv(&mut ch, &cmd(1, &[0; 6], &[], &[]));
    recv(&mut ch, &cmd(1, &[0; 6], &[], &[]));
    assert_eq!(events(&mut ch).len(), 1);
    let tx = transmits(&mut ch);
    let r = Rsp::parse(sent_iu(&tx[0]).1).unwrap();
    assert_eq!(r.status, Status::CHECK_CONDITION.0);
    assert_eq!((r.sense[2] & 0x0f, r.sense[12]), (0x0b, 0x4e));
}

#[test]
fn task_management() {
    let mut ch = channel();
    recv(&mut ch, &cmd(1, &[0; 6], &[], &[]));
    let t = iu::TskMgmt {
        tag: 50,
        lun: Lun(0).encode(),
        func: iu::TskFunc::ABORT_TASK,
        task_tag: 1,
    };
    recv(&mut ch, &t.encode());
    let ev = events(&mut ch);
    match &ev[1] {
        Event::TaskMgmt(r) => {
            assert_eq!(r.func, TmfFunction::AbortTask { tag: TaskTag(1) });
            assert_eq!(r.tag, TaskTag(50));
        }
        other => panic!("{other:?}"),
    }
    ch.handle_action(Action::TmfDone {
        id: TmfId(1),
        tag: TaskTag(50),
        rsp: TmfResponse::Complete,
    });
    let tx = transmits(&mut ch);
    let (op, b) = sent_iu(&tx[0]);
    let r = Rsp::parse(b).unwrap();
    assert_eq!((r.tag, r.rsp_code()), (50, Some(iu::RspCode::COMPLETE)));
    ch.send_done(op, true);
    // The aborted command ends without a response; its tag is free again.
    assert_eq!(ch.tasks(), 0);
    ch.handle_action(Action::Respond {
        id: CmdId(1),
        tag: TaskTag(1),
        rsp: Response::good(),
    });
    assert!(ch.poll_transmit().is_none());
    assert!(matches!(
        events(&mut ch)[..],
        [Event::ResponseSent(CmdId(1))]
    ));
    // Unknown function: answered by the channel, never reaches the core.
    let mut bad = t;
    bad.tag = 51;
    bad.func = iu::TskFunc(0x20);
    recv(&mut ch, &bad.encode());
    assert!(events(&mut ch).is_empty());
    let r = Rsp::parse(sent_iu(&transmits(&mut ch)[0]).1).unwrap();
    assert_eq!(r.rsp_code(), Some(iu::RspCode::NOT_SUPPORTED));
    // LUN reset maps to LOGICAL UNIT RESET.
    let mut lr = t;
    lr.tag = 52;
    lr.func = iu::TskFunc::LUN_RESET;
    recv(&mut ch, &lr.encode());
    assert!(matches!(
        &events(&mut ch)[..],
        [Event::TaskMgmt(TmfRequest {
            func: TmfFunction::LogicalUnitReset,
            ..
        })]
    ));
}

use ferrite_core::TmfId;

#[test]
fn abort_of_a_task_the_core_no_longer_has_ends_it_here() {
    // A command the core dropped without a response (another nexus reset
    // the LU): the initiator times out and aborts it; the core does not
    // know it; the channel forgets it and its credit comes back.
    let mut ch = channel();
    recv(&mut ch, &cmd(9, &read10(0, 1), &[], &[seg(0x1000, 512)]));
    events(&mut ch);
    assert_eq!(ch.credits_granted(), 3);
    let t = iu::TskMgmt {
        tag: 60,
        lun: Lun(0).encode(),
        func: iu::TskFunc::ABORT_TASK,
        task_tag: 9,
    };
    recv(&mut ch, &t.encode());
    events(&mut ch);
    ch.handle_action(Action::TmfDone {
        id: TmfId(1),
        tag: TaskTag(60),
        rsp: TmfResponse::TaskNotFound,
    });
    let tx = transmits(&mut ch);
    let r = Rsp::parse(sent_iu(&tx[0]).1).unwrap();
    assert_eq!(r.rsp_code(), Some(iu::RspCode::COMPLETE));
    assert_eq!(r.req_lim_delta, 2, "the TMF's credit and the task's");
    assert_eq!(ch.tasks(), 1, "only the TMF's response is left");
    assert!(!ch.has_task(9));
}

#[test]
fn a_lun_reset_on_one_channel_ends_the_tasks_of_the_others() {
    // Two channels of one nexus (ib_srp sends LUN RESET on its first
    // channel, whichever channel the commands are on).
    let mut a = channel();
    let mut b = channel();
    recv(
        &mut b,
        &cmd(0x1_0001, &read10(0, 2), &[], &[seg(0x1000, 1024)]),
    );
    recv(
        &mut b,
        &cmd(0x1_0002, &read10(8, 2), &[], &[seg(0x2000, 1024)]),
    );
    assert_eq!(events(&mut b).len(), 2);
    assert_eq!(b.credits_granted(), 2);
    let lr = iu::TskMgmt {
        tag: 0x8000_0001,
        lun: Lun(0).encode(),
        func: iu::TskFunc::LUN_RESET,
        task_tag: u64::from(u32::MAX),
    };
    recv(&mut a, &lr.encode());
    events(&mut a);
    let (func, lun) = a.tmf_in_core(0x8000_0001).expect("the TMF is in the core");
    assert_eq!(
        (func, lun),
        (TmfFunction::LogicalUnitReset, Lun(0).encode())
    );
    assert_eq!(a.tmf_in_core(0x1_0001), None, "not a TMF of this channel");
    // The core completes it; the other channel forgets the two commands
    // (they get no response) and gives their credits back at once.
    a.handle_action(Action::TmfDone {
        id: TmfId(1),
        tag: TaskTag(0x8000_0001),
        rsp: TmfResponse::Complete,
    });
    b.tmf_done_elsewhere(func, lun);
    assert_eq!(b.tasks(), 0);
    let tx = transmits(&mut b);
    let (_, iu_b) = sent_iu(&tx[0]);
    let cred = iu::CredReq::parse(iu_b).expect("an SRP_CRED_REQ");
    assert_eq!(cred.req_lim_delta, 2);
    assert_eq!(b.credits_granted(), 4);
    // Another LUN's tasks, or a TMF that is not a task-set one, stay.
    recv(
        &mut b,
        &cmd(0x1_0003, &read10(0, 1), &[], &[seg(0x1000, 512)]),
    );
    b.tmf_done_elsewhere(TmfFunction::LogicalUnitReset, Lun(1).encode());
    b.tmf_done_elsewhere(TmfFunction::ClearAca, Lun(0).encode());
    assert_eq!(b.tasks(), 1);
}

#[test]
fn aen_goes_out_as_aer_req_one_at_a_time() {
    let mut ch = channel();
    let s = Sense::new(ferrite_scsi::SenseKey::UNIT_ATTENTION, 0x2a, 0x09);
    ch.handle_action(Action::Aen {
        lun: Lun(3),
        sense: s,
    });
    ch.handle_action(Action::Aen {
        lun: Lun(4),
        sense: s,
    });
    let tx = transmits(&mut ch);
    assert_eq!(tx.len(), 1);
    let aer = iu::AerReq::parse(sent_iu(&tx[0]).1).unwrap();
    assert_eq!(aer.lun, Lun(3).to_u64());
    assert_eq!(
        (aer.sense[2], aer.sense[12], aer.sense[13]),
        (6, 0x2a, 0x09)
    );
    recv(&mut ch, &iu::simple_rsp(IuType::AER_RSP, aer.tag));
    let aer2 = iu::AerReq::parse(sent_iu(&transmits(&mut ch)[0]).1).unwrap();
    assert_eq!(aer2.lun, Lun(4).to_u64());
    // A response to nothing is a protocol error.
    recv(&mut ch, &iu::simple_rsp(IuType::AER_RSP, 12345));
    let tx = transmits(&mut ch);
    assert_eq!(
        iu::t_logout_reason(sent_iu(&tx[0]).1),
        Ok(TLogoutReason::UNEXPECTED_RESPONSE)
    );
}

#[test]
fn bad_iu_type_and_bad_descriptor_format_log_out() {
    let mut ch = channel();
    recv(&mut ch, &[0x77; 16]);
    let tx = transmits(&mut ch);
    assert_eq!(
        iu::t_logout_reason(sent_iu(&tx[0]).1),
        Ok(TLogoutReason::INVALID_IU_TYPE)
    );
    assert!(matches!(tx[1], Transmit::Disconnect));
    assert!(matches!(events(&mut ch)[..], [Event::Closed]));
    // Nothing is accepted after that.
    recv(&mut ch, &cmd(1, &[0; 6], &[], &[]));
    assert!(events(&mut ch).is_empty() && transmits(&mut ch).is_empty());

    let mut ch = channel();
    let mut c = cmd(1, &[0; 6], &[seg(1, 8)], &[]);
    c[5] = 0x30;
    recv(&mut ch, &c);
    assert_eq!(
        iu::t_logout_reason(sent_iu(&transmits(&mut ch)[0]).1),
        Ok(TLogoutReason::UNSUPPORTED_DATA_OUT_FORMAT)
    );
    // Truncated IUs are handled, never indexed past their end.
    let mut ch = channel();
    recv(&mut ch, &c[..20]);
    assert_eq!(ch.state(), ChannelState::Closed);
}

#[test]
fn initiator_logout_and_connection_loss() {
    let mut ch = channel();
    recv(&mut ch, &cmd(1, &[0; 6], &[seg(1, 512)], &[]));
    events(&mut ch);
    ch.handle_action(Action::FetchData {
        id: CmdId(1),
        tag: TaskTag(1),
        buf: SgList::zeroed(512),
        offset: 0,
        len: 512,
    });
    let Some(Transmit::RdmaRead { op, buf, .. }) = ch.poll_transmit() else {
        panic!("no read")
    };
    recv(&mut ch, &iu::i_logout(9));
    assert!(matches!(ch.poll_transmit(), Some(Transmit::Disconnect)));
    assert!(matches!(events(&mut ch)[..], [Event::Closed]));
    // The flushed READ gives the buffer back to the core as an abort.
    ch.rdma_done(op, buf, false);
    assert!(matches!(
        events(&mut ch)[..],
        [Event::DataOut {
            id: CmdId(1),
            result: Err(Abort::ConnectionLost)
        }]
    ));
    // The core's response after that is completed without a SEND.
    ch.handle_action(Action::Respond {
        id: CmdId(1),
        tag: TaskTag(1),
        rsp: Response::good(),
    });
    assert!(ch.poll_transmit().is_none());
    assert!(matches!(
        events(&mut ch)[..],
        [Event::ResponseSent(CmdId(1))]
    ));
    assert_eq!(ch.tasks(), 0);
}

#[test]
fn map_range_edges() {
    let segs = [seg(100, 10), seg(500, 10)];
    assert_eq!(map_range(&segs, 0, 20).unwrap().len(), 2);
    assert_eq!(map_range(&segs, 10, 10).unwrap()[0].remote.addr, 500);
    assert!(map_range(&segs, 15, 6).is_none());
    assert!(map_range(&segs, u64::MAX, 2).is_none());
}

#[test]
fn oversized_descriptor_table_logs_out_without_allocating() {
    let mut ch = channel();
    let b = CmdBuilder {
        tag: 5,
        lun: Lun(0).encode(),
        task_attr: 0,
        cdb: &read10(0, 2),
        data_out: &[],
        data_in: &[seg(0x1000, 512), seg(0x3000, 512)],
        out_table: None,
        in_table: Some(seg(0xa000, 0xffff_fff0)),
        inline_max: 1,
    }
    .encode();
    recv(&mut ch, &b);
    let tx = transmits(&mut ch);
    assert_eq!(
        iu::t_logout_reason(sent_iu(&tx[0]).1),
        Ok(TLogoutReason::INVALID_DATA_IN_COUNT)
    );
}

/// Arbitrary bytes behind every IU type: the channel answers or logs out,
/// and never panics (the invariant a fuzz target would check).
#[test]
fn garbage_ius_never_panic() {
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let types = [0x00u8, 0x01, 0x02, 0x03, 0x41, 0x42, 0xc1, 0x77];
    for round in 0..3000 {
        let mut ch = channel();
        for _ in 0..4 {
            let len = (next() % 160) as usize;
            let mut b: Vec<u8> = (0..len).map(|_| next() as u8).collect();
            if let Some(first) = b.first_mut() {
                *first = types[(next() % types.len() as u64) as usize];
            }
            if round % 2 == 0 && b.len() > 7 {
                // Mostly-valid SRP_CMDs: plausible formats and counts.
                b[0] = 0x02;
                b[5] = (((next() % 3) << 4) | (next() % 3)) as u8;
                b[6] = (next() % 3) as u8;
                b[7] = (next() % 3) as u8;
            }
            recv(&mut ch, &b);
            while let Some(t) = ch.poll_transmit() {
                match t {
                    Transmit::Send { op, .. } => ch.send_done(op, true),
                    Transmit::RdmaRead { op, buf, .. } | Transmit::RdmaWrite { op, buf, .. } => {
                        ch.rdma_done(op, buf, next() % 4 != 0)
                    }
                    Transmit::Disconnect => {}
                }
            }
            while let Some(ev) = ch.poll_event() {
                if let Event::Submit(req) = ev {
                    ch.handle_action(Action::Respond {
                        id: CmdId(1),
                        tag: req.tag,
                        rsp: Response {
                            data: Some(SgList::zeroed(64)),
                            data_len: 64,
                            ..Response::good()
                        },
                    });
                }
            }
        }
    }
}

/// Responds GOOD to `tag` and completes the SRP_RSP's send; the delta it
/// carried.
fn respond_good(ch: &mut Channel, tag: u64) -> u32 {
    ch.handle_action(Action::Respond {
        id: CmdId(tag as u32),
        tag: TaskTag(tag),
        rsp: Response::good(),
    });
    let tx = transmits(ch);
    assert_eq!(tx.len(), 1, "{tx:?}");
    let (op, b) = sent_iu(&tx[0]);
    let delta = Rsp::parse(b).unwrap().req_lim_delta;
    ch.send_done(op, true);
    delta
}

#[test]
fn held_credits_are_returned_by_the_next_response_once_released() {
    let mut ch = channel();
    for tag in 0..4 {
        recv(&mut ch, &cmd(tag, &[0; 6], &[], &[]));
    }
    assert_eq!(events(&mut ch).len(), 4);
    assert_eq!(ch.credits_granted(), 0);
    // The session waits for data memory: responses carry no credit, and
    // no SRP_CRED_REQ goes out either.
    ch.hold_credits(true);
    assert_eq!(respond_good(&mut ch, 0), 0);
    assert_eq!(respond_good(&mut ch, 1), 0);
    assert_eq!(ch.credits_granted(), 0);
    assert!(transmits(&mut ch).is_empty());
    // Memory is back while responses are still coming: nothing is sent at
    // once, and the next response carries every credit withheld.
    ch.hold_credits(false);
    assert!(transmits(&mut ch).is_empty());
    assert_eq!(respond_good(&mut ch, 2), 3);
    assert_eq!(respond_good(&mut ch, 3), 1);
    assert_eq!(ch.credits_granted(), 4);
    assert!(transmits(&mut ch).is_empty());
}

#[test]
fn held_credits_go_back_in_a_cred_req_when_no_response_is_coming() {
    let mut ch = channel();
    for tag in 0..3 {
        recv(&mut ch, &cmd(tag, &[0; 6], &[], &[]));
    }
    assert_eq!(events(&mut ch).len(), 3);
    ch.hold_credits(true);
    for tag in 0..3 {
        assert_eq!(respond_good(&mut ch, tag), 0);
    }
    // Every task ended while held: the initiator has one credit left and
    // nothing would ever carry the others back but an SRP_CRED_REQ.
    assert_eq!(ch.credits_granted(), 1);
    assert!(transmits(&mut ch).is_empty(), "a CRED_REQ while held");
    // Holding again changes nothing.
    ch.hold_credits(true);
    assert!(transmits(&mut ch).is_empty());
    ch.hold_credits(false);
    let tx = transmits(&mut ch);
    assert_eq!(tx.len(), 1, "{tx:?}");
    let cred = iu::CredReq::parse(sent_iu(&tx[0]).1).unwrap();
    assert_eq!(cred.req_lim_delta, 3);
    assert_eq!(ch.credits_granted(), 4);
    ch.send_done(sent_iu(&tx[0]).0, true);
    recv(&mut ch, &iu::simple_rsp(IuType::CRED_RSP, cred.tag));
    assert!(transmits(&mut ch).is_empty());
}

#[test]
fn a_held_channel_stalls_an_initiator_that_keeps_to_its_limit_until_released() {
    let mut ch = channel();
    ch.hold_credits(true);
    // An initiator keeping to its request limit sends as long as it has
    // credits; with the limit not growing, it stops after four commands
    // whatever the target finished meanwhile.
    let mut limit = ch.credits_granted();
    let mut sent = 0u64;
    for round in 0..8u64 {
        while limit > 0 {
            recv(&mut ch, &cmd(sent, &[0; 6], &[], &[]));
            limit -= 1;
            sent += 1;
        }
        for ev in events(&mut ch) {
            match ev {
                Event::Submit(req) => limit += respond_good(&mut ch, req.tag.0),
                Event::ResponseSent(_) => {}
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(sent, 4, "round {round}: the limit grew while held");
    }
    assert_eq!(limit, 0);
    ch.hold_credits(false);
    let tx = transmits(&mut ch);
    let cred = iu::CredReq::parse(sent_iu(&tx[0]).1).unwrap();
    assert_eq!(cred.req_lim_delta, 4);
}

#[test]
fn descriptor_tables_are_fetched_a_few_at_a_time() {
    let mut ch = match login(
        ChannelConfig {
            credits: 32,
            ..cfg()
        },
        &login_req().encode(),
    ) {
        Login::Accept { channel, .. } => *channel,
        Login::Reject { why, .. } => panic!("rejected: {why}"),
    };
    let segs = [seg(0x1000, 512), seg(0x3000, 512), seg(0x7000, 1024)];
    let n = MAX_TABLE_FETCHES as u64 + 4;
    for tag in 0..n {
        let b = CmdBuilder {
            tag,
            lun: Lun(0).encode(),
            task_attr: 0,
            cdb: &read10(0, 4),
            data_out: &[],
            data_in: &segs,
            out_table: None,
            in_table: Some(seg(0xa000 + tag * 0x100, 48)),
            inline_max: 1,
        }
        .encode();
        recv(&mut ch, &b);
    }
    // An initiator that never lets these reads complete makes the channel
    // hold MAX_TABLE_FETCHES tables, not one per command.
    let reads = |tx: Vec<Transmit>| -> Vec<(OpId, SgList, u64)> {
        tx.into_iter()
            .map(|t| match t {
                Transmit::RdmaRead { op, buf, xfers } => (op, buf, xfers[0].remote.addr),
                other => panic!("{other:?}"),
            })
            .collect()
    };
    let first = reads(transmits(&mut ch));
    assert_eq!(first.len(), MAX_TABLE_FETCHES);
    assert!(events(&mut ch).is_empty());
    // Each table that arrives lets the next command's go out, in order.
    let mut submitted = 0;
    let mut wire: VecDeque<_> = first.into();
    let mut next_addr = 0xa000;
    while let Some((op, mut buf, addr)) = wire.pop_front() {
        assert_eq!(addr, next_addr, "tables asked for out of order");
        next_addr += 0x100;
        buf.copy_in(0, &iu::encode_table(&segs));
        ch.rdma_done(op, buf, true);
        submitted += events(&mut ch)
            .iter()
            .filter(|e| matches!(e, Event::Submit(_)))
            .count();
        wire.extend(reads(transmits(&mut ch)));
        assert!(wire.len() <= MAX_TABLE_FETCHES);
    }
    assert_eq!(submitted as u64, n);
}
