//! Two soft endpoints in one process.

use super::*;
use crate::{QpState, QueuePair, RecvWr, SendOp, SendWr, WcOpcode};
use smallvec::smallvec;

struct Side {
    _dev: SoftDevice,
    pd: SoftPd,
    cq: SoftCq,
}

fn side(name: &str) -> Side {
    let dev = SoftDevice::new(name);
    let pd = dev.alloc_pd();
    Side {
        _dev: dev,
        pd,
        cq: SoftCq::new().unwrap(),
    }
}

fn unix_addr(tag: &str) -> SoftAddr {
    // Short and unique: socket paths are limited to about 100 bytes.
    static N: AtomicU32 = AtomicU32::new(0);
    let p = std::env::temp_dir().join(format!(
        "fsoft-{}-{}-{tag}.sock",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_file(&p);
    SoftAddr::Unix(p)
}

fn tcp_addr() -> SoftAddr {
    SoftAddr::Tcp("127.0.0.1:0".parse().unwrap())
}

/// Waits for `n` completions on `cq`.
fn wait_wcs(cq: &SoftCq, n: usize) -> Vec<WorkCompletion> {
    let mut out = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    while out.len() < n && Instant::now() < deadline {
        cq.wait(Duration::from_millis(50));
        cq.poll_cq(&mut out);
    }
    assert_eq!(out.len(), n, "completions: {out:?}");
    out
}

/// A connected pair: (initiator side, its QP, target side, its QP).
fn pair(
    addr: SoftAddr,
    attrs: QpAttrs,
    target_recvs: usize,
) -> (Side, SoftQp, Side, SoftQp, Vec<SoftMr>) {
    let t = side("t");
    let i = side("i");
    let listener = SoftListener::bind(&addr).unwrap();
    let addr = listener.addr().clone();
    let ipd = i.pd.clone();
    let icq = i.cq.clone();
    let h = thread::spawn(move || {
        let qp = SoftQp::create(&ipd, &icq, &icq, None, attrs);
        let rep = qp.connect(&addr, b"login", Duration::from_secs(5)).unwrap();
        (qp, rep)
    });
    let req = listener.wait_request(Duration::from_secs(5)).unwrap();
    assert_eq!(req.private_data(), b"login");
    let tqp = SoftQp::create(&t.pd, &t.cq, &t.cq, None, attrs);
    let mut bufs = Vec::new();
    for k in 0..target_recvs {
        let mr = t.pd.reg_zeroed(256, Access::LOCAL_WRITE).unwrap();
        tqp.post_recv(&RecvWr {
            wr_id: 100 + k as u64,
            sges: mr.sges(0, 256).unwrap(),
        })
        .unwrap();
        bufs.push(mr);
    }
    tqp.accept(req, b"welcome").unwrap();
    let (iqp, rep) = h.join().unwrap();
    assert_eq!(rep, b"welcome");
    (i, iqp, t, tqp, bufs)
}

fn send_wr(wr_id: u64, mr: &SoftMr, len: u64) -> SendWr {
    SendWr {
        wr_id,
        op: SendOp::Send,
        sges: mr.sges(0, len).unwrap(),
        signaled: true,
    }
}

#[test]
fn send_recv_with_private_data_unix() {
    let (i, iqp, t, tqp, bufs) = pair(unix_addr("sr"), QpAttrs::default(), 2);
    assert_eq!(iqp.state(), QpState::Rts);
    let mut msg = i.pd.reg_zeroed(64, Access::LOCAL_WRITE).unwrap();
    msg.write_at(0, b"hello target");
    iqp.post_send(&send_wr(1, &msg, 12)).unwrap();
    let wc = wait_wcs(&t.cq, 1);
    assert_eq!(wc[0].wr_id, 100);
    assert_eq!(wc[0].status, WcStatus::Success);
    assert_eq!(wc[0].opcode, WcOpcode::Recv);
    assert_eq!(wc[0].byte_len, 12);
    assert_eq!(wc[0].qp_num, tqp.qp_num());
    let mut got = [0u8; 12];
    bufs[0].read_at(0, &mut got);
    assert_eq!(&got, b"hello target");
    let wc = wait_wcs(&i.cq, 1);
    assert_eq!(
        (wc[0].wr_id, wc[0].status, wc[0].opcode),
        (1, WcStatus::Success, WcOpcode::Send)
    );
}

#[test]
fn send_gathers_several_sges_over_tcp() {
    let (i, iqp, t, _tqp, bufs) = pair(tcp_addr(), QpAttrs::default(), 1);
    let mut a = i.pd.reg_zeroed(8, Access::LOCAL_WRITE).unwrap();
    let mut b = i.pd.reg_zeroed(8, Access::LOCAL_WRITE).unwrap();
    a.write_at(0, b"abcd");
    b.write_at(0, b"efgh");
    let mut sges = a.sges(0, 4).unwrap();
    sges.extend(b.sges(0, 4).unwrap());
    iqp.post_send(&SendWr {
        wr_id: 9,
        op: SendOp::Send,
        sges,
        signaled: true,
    })
    .unwrap();
    let wc = wait_wcs(&t.cq, 1);
    assert_eq!(wc[0].byte_len, 8);
    let mut got = [0u8; 8];
    bufs[0].read_at(0, &mut got);
    assert_eq!(&got, b"abcdefgh");
}

#[test]
fn rdma_write_then_read_back() {
    let (i, iqp, t, tqp, _bufs) = pair(unix_addr("wr"), QpAttrs::default(), 0);
    // The initiator exposes a two-segment buffer; the target writes then reads it.
    let pool = ferrite_reactor::buf::BufPool::new(4096, 4);
    let remote =
        i.pd.reg_sg(
            pool.sg(6000),
            Access::LOCAL_WRITE | Access::REMOTE_READ | Access::REMOTE_WRITE,
        )
        .unwrap();
    assert_eq!(remote.segs().len(), 2);
    let mut src = t.pd.reg_zeroed(6000, Access::LOCAL_WRITE).unwrap();
    let pattern: Vec<u8> = (0..6000u32).map(|x| (x * 7) as u8).collect();
    src.write_at(0, &pattern);
    // One WRITE per remote segment, as SRP does for indirect descriptors.
    let mut off = 0u64;
    for (k, seg) in remote.segs().iter().enumerate() {
        tqp.post_send(&SendWr {
            wr_id: k as u64,
            op: SendOp::RdmaWrite {
                remote_addr: seg.addr,
                rkey: seg.rkey,
            },
            sges: src.sges(off, seg.len as u64).unwrap(),
            signaled: true,
        })
        .unwrap();
        off += seg.len as u64;
    }
    let wcs = wait_wcs(&t.cq, 2);
    assert!(
        wcs.iter()
            .all(|w| w.status == WcStatus::Success && w.opcode == WcOpcode::RdmaWrite)
    );
    let mut got = vec![0u8; 6000];
    remote.read_at(0, &mut got);
    assert_eq!(got, pattern);
    // Read it back into a fresh sink, from an offset inside the first segment.
    let sink = t.pd.reg_zeroed(1000, Access::LOCAL_WRITE).unwrap();
    let seg = remote.segs()[0];
    tqp.post_send(&SendWr {
        wr_id: 7,
        op: SendOp::RdmaRead {
            remote_addr: seg.addr + 3000,
            rkey: seg.rkey,
        },
        sges: sink.sges(0, 1000).unwrap(),
        signaled: true,
    })
    .unwrap();
    let wc = wait_wcs(&t.cq, 1);
    assert_eq!(
        (wc[0].status, wc[0].opcode, wc[0].byte_len),
        (WcStatus::Success, WcOpcode::RdmaRead, 1000)
    );
    let mut back = vec![0u8; 1000];
    sink.read_at(0, &mut back);
    assert_eq!(back, pattern[3000..4000]);
    drop(iqp);
    let sg = remote.into_sg();
    assert_eq!(sg.to_vec(), pattern);
}

#[test]
fn bad_rkey_is_remote_access_error_and_qp_error() {
    let (i, iqp, t, tqp, _bufs) = pair(unix_addr("rk"), QpAttrs::default(), 0);
    let remote =
        i.pd.reg_zeroed(512, Access::LOCAL_WRITE | Access::REMOTE_READ)
            .unwrap();
    let src = t.pd.reg_zeroed(512, Access::LOCAL_WRITE).unwrap();
    let seg = remote.segs()[0];
    // Wrong key, then a request queued behind it that must be flushed.
    tqp.post_send(&SendWr {
        wr_id: 1,
        op: SendOp::RdmaWrite {
            remote_addr: seg.addr,
            rkey: seg.rkey ^ 0x55,
        },
        sges: src.sges(0, 16).unwrap(),
        signaled: true,
    })
    .unwrap();
    let wc = wait_wcs(&t.cq, 1);
    assert_eq!((wc[0].wr_id, wc[0].status), (1, WcStatus::RemAccessErr));
    assert_eq!(tqp.state(), QpState::Error);
    // Posting on an error QP completes with a flush error.
    tqp.post_send(&send_wr(2, &src, 8)).unwrap();
    let wc = wait_wcs(&t.cq, 1);
    assert_eq!((wc[0].wr_id, wc[0].status), (2, WcStatus::WrFlushErr));
    // The peer sees the connection go away.
    let deadline = Instant::now() + Duration::from_secs(5);
    while iqp.poll_event().is_none() {
        assert!(Instant::now() < deadline, "no disconnect event");
        thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(iqp.state(), QpState::Error);
    // A WRITE with the right key but no REMOTE_WRITE right also fails.
}

#[test]
fn write_without_rights_or_out_of_bounds_fails() {
    for case in 0..3 {
        let (i, _iqp, t, tqp, _bufs) = pair(unix_addr(&format!("ob{case}")), QpAttrs::default(), 0);
        let remote =
            i.pd.reg_zeroed(512, Access::LOCAL_WRITE | Access::REMOTE_READ)
                .unwrap();
        let src = t.pd.reg_zeroed(1024, Access::LOCAL_WRITE).unwrap();
        let seg = remote.segs()[0];
        let (op, len) = match case {
            // Region has no REMOTE_WRITE right.
            0 => (
                SendOp::RdmaWrite {
                    remote_addr: seg.addr,
                    rkey: seg.rkey,
                },
                16,
            ),
            // READ running one byte past the end.
            1 => (
                SendOp::RdmaRead {
                    remote_addr: seg.addr + 1,
                    rkey: seg.rkey,
                },
                512,
            ),
            // READ starting before the region.
            _ => (
                SendOp::RdmaRead {
                    remote_addr: seg.addr - 8,
                    rkey: seg.rkey,
                },
                16,
            ),
        };
        tqp.post_send(&SendWr {
            wr_id: 5,
            op,
            sges: src.sges(0, len).unwrap(),
            signaled: true,
        })
        .unwrap();
        let wc = wait_wcs(&t.cq, 1);
        assert_eq!(wc[0].status, WcStatus::RemAccessErr, "case {case}");
        assert_eq!(tqp.state(), QpState::Error);
    }
}

#[test]
fn local_protection_error_on_bad_lkey() {
    let (i, iqp, _t, _tqp, _bufs) = pair(unix_addr("lk"), QpAttrs::default(), 1);
    let msg = i.pd.reg_zeroed(64, Access::LOCAL_WRITE).unwrap();
    let mut wr = send_wr(3, &msg, 8);
    wr.sges[0].lkey = 0xdead;
    iqp.post_send(&wr).unwrap();
    let wc = wait_wcs(&i.cq, 1);
    assert_eq!(wc[0].status, WcStatus::LocProtErr);
    assert_eq!(iqp.state(), QpState::Error);
}

#[test]
fn rnr_retries_then_succeeds_when_a_receive_arrives() {
    let attrs = QpAttrs {
        // Up to two seconds of retries: far longer than the pause below.
        rnr_retry: 200,
        rnr_delay: Duration::from_millis(10),
        ..QpAttrs::default()
    };
    let (i, iqp, t, tqp, _bufs) = pair(unix_addr("rnr1"), attrs, 0);
    let msg = i.pd.reg_zeroed(64, Access::LOCAL_WRITE).unwrap();
    iqp.post_send(&send_wr(1, &msg, 10)).unwrap();
    thread::sleep(Duration::from_millis(30));
    let mut out = Vec::new();
    assert_eq!(
        i.cq.poll_cq(&mut out),
        0,
        "SEND completed with no receive posted"
    );
    let buf = t.pd.reg_zeroed(64, Access::LOCAL_WRITE).unwrap();
    tqp.post_recv(&RecvWr {
        wr_id: 44,
        sges: buf.sges(0, 64).unwrap(),
    })
    .unwrap();
    assert_eq!(wait_wcs(&i.cq, 1)[0].status, WcStatus::Success);
    assert_eq!(wait_wcs(&t.cq, 1)[0].wr_id, 44);
}

#[test]
fn rnr_retry_exceeded() {
    let attrs = QpAttrs {
        rnr_retry: 3,
        rnr_delay: Duration::from_millis(1),
        ..QpAttrs::default()
    };
    let (i, iqp, _t, _tqp, _bufs) = pair(unix_addr("rnr2"), attrs, 0);
    let msg = i.pd.reg_zeroed(64, Access::LOCAL_WRITE).unwrap();
    iqp.post_send(&send_wr(1, &msg, 10)).unwrap();
    iqp.post_send(&send_wr(2, &msg, 10)).unwrap();
    let wc = wait_wcs(&i.cq, 2);
    assert_eq!((wc[0].wr_id, wc[0].status), (1, WcStatus::RnrRetryExcErr));
    assert_eq!((wc[1].wr_id, wc[1].status), (2, WcStatus::WrFlushErr));
    assert_eq!(iqp.state(), QpState::Error);
}

#[test]
fn receive_too_small_is_length_error() {
    let (i, iqp, t, _tqp, _bufs) = pair(unix_addr("len"), QpAttrs::default(), 1);
    let msg = i.pd.reg_zeroed(1024, Access::LOCAL_WRITE).unwrap();
    iqp.post_send(&send_wr(1, &msg, 1024)).unwrap();
    assert_eq!(wait_wcs(&i.cq, 1)[0].status, WcStatus::RemInvReqErr);
    assert_eq!(wait_wcs(&t.cq, 1)[0].status, WcStatus::LocLenErr);
    let deadline = Instant::now() + Duration::from_secs(5);
    while _tqp.state() != QpState::Error {
        assert!(Instant::now() < deadline, "responder QP stayed up");
        thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn disconnect_flushes_outstanding_requests_on_both_sides() {
    let (i, iqp, t, tqp, _bufs) = pair(unix_addr("dc"), QpAttrs::default(), 3);
    // The initiator has receives posted too; they must be flushed.
    let rb = i.pd.reg_zeroed(64, Access::LOCAL_WRITE).unwrap();
    for k in 0..2 {
        iqp.post_recv(&RecvWr {
            wr_id: 200 + k,
            sges: rb.sges(0, 64).unwrap(),
        })
        .unwrap();
    }
    iqp.disconnect();
    assert_eq!(iqp.state(), QpState::Error);
    let wc = wait_wcs(&i.cq, 2);
    assert!(
        wc.iter()
            .all(|w| w.status == WcStatus::WrFlushErr && w.opcode == WcOpcode::Recv)
    );
    // The target's three posted receives are flushed when it sees the disconnect.
    let wc = wait_wcs(&t.cq, 3);
    assert!(wc.iter().all(|w| w.status == WcStatus::WrFlushErr));
    assert_eq!(tqp.poll_event(), Some(crate::ConnEvent::Disconnected));
    assert_eq!(tqp.state(), QpState::Error);
    // A post after the disconnect flushes at once.
    let msg = t.pd.reg_zeroed(8, Access::LOCAL_WRITE).unwrap();
    tqp.post_send(&send_wr(5, &msg, 8)).unwrap();
    assert_eq!(wait_wcs(&t.cq, 1)[0].status, WcStatus::WrFlushErr);
}

#[test]
fn reject_carries_private_data() {
    let addr = unix_addr("rej");
    let listener = SoftListener::bind(&addr).unwrap();
    let i = side("i");
    let a = listener.addr().clone();
    let h = thread::spawn(move || {
        let qp = SoftQp::create(&i.pd, &i.cq, &i.cq, None, QpAttrs::default());
        let r = qp.connect(&a, b"let me in", Duration::from_secs(5));
        (r, qp.state())
    });
    let req = listener.wait_request(Duration::from_secs(5)).unwrap();
    assert_eq!(req.private_data(), b"let me in");
    req.reject(b"no").unwrap();
    let (r, st) = h.join().unwrap();
    match r {
        Err(RdmaError::Rejected { private_data }) => assert_eq!(private_data, b"no"),
        other => panic!("expected a reject, got {other:?}"),
    }
    assert_eq!(st, QpState::Init);
}

#[test]
fn srq_feeds_several_queue_pairs() {
    let t = side("t");
    let i = side("i");
    let srq = SoftSrq::new(8);
    let listener = SoftListener::bind(&unix_addr("srq")).unwrap();
    let buf = t.pd.reg_zeroed(4 * 64, Access::LOCAL_WRITE).unwrap();
    for k in 0..4 {
        srq.post_recv(&RecvWr {
            wr_id: k,
            sges: buf.sges(k * 64, 64).unwrap(),
        })
        .unwrap();
    }
    let mut tqps = Vec::new();
    let mut iqps = Vec::new();
    for _ in 0..2 {
        let a = listener.addr().clone();
        let (ipd, icq) = (i.pd.clone(), i.cq.clone());
        let h = thread::spawn(move || {
            connect_qp(&ipd, &icq, QpAttrs::default(), &a, b"", &[]).unwrap()
        });
        let req = listener.wait_request(Duration::from_secs(5)).unwrap();
        let q = SoftQp::create(&t.pd, &t.cq, &t.cq, Some(&srq), QpAttrs::default());
        assert_eq!(
            q.post_recv(&RecvWr {
                wr_id: 0,
                sges: smallvec![]
            }),
            Err(PostError::UsesSrq)
        );
        q.accept(req, b"").unwrap();
        tqps.push(q);
        iqps.push(h.join().unwrap().0);
    }
    let msg = i.pd.reg_zeroed(8, Access::LOCAL_WRITE).unwrap();
    iqps[0].post_send(&send_wr(1, &msg, 8)).unwrap();
    iqps[1].post_send(&send_wr(2, &msg, 8)).unwrap();
    let wc = wait_wcs(&t.cq, 2);
    let qpns: Vec<u32> = wc.iter().map(|w| w.qp_num).collect();
    assert!(qpns.contains(&tqps[0].qp_num()) && qpns.contains(&tqps[1].qp_num()));
    assert_eq!(srq.posted(), 2);
    // Disconnecting a QP leaves the SRQ's receives alone.
    iqps[0].disconnect();
    thread::sleep(Duration::from_millis(50));
    assert_eq!(srq.posted(), 2);
}

#[test]
fn cq_fd_becomes_readable() {
    let cq = SoftCq::new().unwrap();
    let fd = cq.fd();
    assert!(fd >= 0);
    cq.push(WorkCompletion::new(
        1,
        WcStatus::Success,
        WcOpcode::Send,
        0,
        1,
    ));
    let mut b = [0u8; 8];
    assert_eq!((&cq.shared.wake_rx).read(&mut b).unwrap(), 1);
    let mut out = Vec::new();
    assert_eq!(cq.poll_cq(&mut out), 1);
    assert!((&cq.shared.wake_rx).read(&mut b).is_err(), "pipe drained");
}

#[test]
fn deregistered_memory_is_unreachable() {
    let (i, _iqp, t, tqp, _bufs) = pair(unix_addr("dereg"), QpAttrs::default(), 0);
    let remote = i.pd.reg_zeroed(64, Access::ALL).unwrap();
    let seg = remote.segs()[0];
    let _sg = remote.into_sg();
    let sink = t.pd.reg_zeroed(64, Access::LOCAL_WRITE).unwrap();
    tqp.post_send(&SendWr {
        wr_id: 1,
        op: SendOp::RdmaRead {
            remote_addr: seg.addr,
            rkey: seg.rkey,
        },
        sges: sink.sges(0, 64).unwrap(),
        signaled: true,
    })
    .unwrap();
    assert_eq!(wait_wcs(&t.cq, 1)[0].status, WcStatus::RemAccessErr);
}

#[test]
fn write_is_visible_before_the_send_behind_it_and_unsignaled_is_silent() {
    let (i, iqp, t, tqp, bufs) = pair(unix_addr("ord"), QpAttrs::default(), 1);
    let remote =
        i.pd.reg_zeroed(4096, Access::LOCAL_WRITE | Access::REMOTE_WRITE)
            .unwrap();
    let mut src = t.pd.reg_zeroed(4096, Access::LOCAL_WRITE).unwrap();
    src.write_at(0, &[0x5a; 4096]);
    let seg = remote.segs()[0];
    // An unsignaled WRITE, then a signaled SEND: one completion on the
    // sender, and the data is in place when the peer sees the SEND.
    let mut w = SendWr {
        wr_id: 1,
        op: SendOp::RdmaWrite {
            remote_addr: seg.addr,
            rkey: seg.rkey,
        },
        sges: src.sges(0, 4096).unwrap(),
        signaled: false,
    };
    tqp.post_send(&w).unwrap();
    w.wr_id = 2;
    w.op = SendOp::Send;
    w.sges = src.sges(0, 16).unwrap();
    w.signaled = true;
    // The initiator is the receiver here: give it a receive.
    let rb = i.pd.reg_zeroed(64, Access::LOCAL_WRITE).unwrap();
    iqp.post_recv(&RecvWr {
        wr_id: 77,
        sges: rb.sges(0, 64).unwrap(),
    })
    .unwrap();
    tqp.post_send(&w).unwrap();
    let rwc = wait_wcs(&i.cq, 1);
    assert_eq!((rwc[0].wr_id, rwc[0].status), (77, WcStatus::Success));
    let mut got = vec![0u8; 4096];
    remote.read_at(0, &mut got);
    assert!(
        got.iter().all(|&b| b == 0x5a),
        "WRITE not visible at the SEND"
    );
    let swc = wait_wcs(&t.cq, 1);
    assert_eq!(swc[0].wr_id, 2, "unsignaled WRITE produced a completion");
    drop(bufs);
}

fn readable(fd: RawFd, ms: i32) -> bool {
    let mut pfd = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: a valid pollfd on the stack, count 1.
    unsafe { libc::poll(&mut pfd, 1, ms) > 0 }
}

#[test]
fn listener_fd_is_readable_exactly_while_requests_wait() {
    let listener = SoftListener::bind(&unix_addr("lfd")).unwrap();
    assert!(!readable(listener.fd(), 0), "no request yet");
    let addr = listener.addr().clone();
    let h = thread::spawn(move || {
        let mut v = Vec::new();
        for k in 0..2u8 {
            let s = side("i");
            let qp = SoftQp::create(&s.pd, &s.cq, &s.cq, None, QpAttrs::default());
            // Each connect is refused below; what matters is the request.
            v.push(qp.connect(&addr, &[k], Duration::from_secs(5)).is_err());
        }
        v
    });
    let mut got = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    while got.len() < 2 && Instant::now() < deadline {
        if !readable(listener.fd(), 100) {
            continue;
        }
        while let Some(req) = listener.poll_request() {
            got.push(req.private_data().to_vec());
            req.reject(b"no").unwrap();
        }
        assert!(!readable(listener.fd(), 0), "drained: not readable");
    }
    assert_eq!(got, vec![vec![0u8], vec![1u8]]);
    assert_eq!(h.join().unwrap(), vec![true, true]);
}

#[test]
fn a_dropped_listener_leaves_a_newer_socket_at_its_path_alone() {
    let addr = unix_addr("rebind");
    let SoftAddr::Unix(path) = addr.clone() else {
        unreachable!()
    };
    let old = SoftListener::bind(&addr).unwrap();
    // The path is taken over (as ferrited does when a port is re-added)
    // while the old listener still lives.
    std::fs::remove_file(&path).unwrap();
    let new = SoftListener::bind(&addr).unwrap();
    drop(old);
    assert!(path.exists(), "the new listener's socket survives");
    let h = thread::spawn(move || {
        let s = side("i");
        let qp = SoftQp::create(&s.pd, &s.cq, &s.cq, None, QpAttrs::default());
        qp.connect(&addr, b"x", Duration::from_secs(5)).is_err()
    });
    let req = new.wait_request(Duration::from_secs(5)).unwrap();
    req.reject(b"no").unwrap();
    assert!(h.join().unwrap());
    drop(new);
    assert!(!path.exists(), "its own socket goes with it");
}

#[test]
fn dropping_a_listener_does_not_wait_for_a_silent_peer() {
    let addr = unix_addr("silent");
    let SoftAddr::Unix(path) = addr.clone() else {
        unreachable!()
    };
    let l = SoftListener::bind(&addr).unwrap();
    // Connected, never sends its connect request.
    let _peer = std::os::unix::net::UnixStream::connect(&path).unwrap();
    thread::sleep(Duration::from_millis(20));
    // The accept thread sits in a read the peer never answers, which ends
    // only after CONN_REQ_TIMEOUT; the drop must not wait for that.
    let t0 = Instant::now();
    drop(l);
    assert!(
        t0.elapsed() < CONN_REQ_TIMEOUT,
        "drop waited {:?}, for the silent peer's connect request",
        t0.elapsed()
    );
    assert!(!path.exists());
}

#[test]
fn send_with_invalidate_delivers_and_names_the_rkey() {
    let (i, iqp, t, tqp, _bufs) = pair(unix_addr("inv"), QpAttrs::default(), 0);
    // The initiator's receive for the response, and the buffer it exposes.
    let rsp = i.pd.reg_zeroed(64, Access::LOCAL_WRITE).unwrap();
    iqp.post_recv(&RecvWr {
        wr_id: 50,
        sges: rsp.sges(0, 64).unwrap(),
    })
    .unwrap();
    let data =
        i.pd.reg_zeroed(
            128,
            Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ,
        )
        .unwrap();
    let seg = data.segs()[0];
    let mut src = t.pd.reg_zeroed(128, Access::LOCAL_WRITE).unwrap();
    src.write_at(0, b"payload");
    src.write_at(64, b"SCSI response");
    tqp.post_send(&SendWr {
        wr_id: 1,
        op: SendOp::RdmaWrite {
            remote_addr: seg.addr,
            rkey: seg.rkey,
        },
        sges: src.sges(0, 7).unwrap(),
        signaled: true,
    })
    .unwrap();
    tqp.post_send(&SendWr {
        wr_id: 2,
        op: SendOp::SendInvalidate { rkey: seg.rkey },
        sges: src.sges(64, 13).unwrap(),
        signaled: true,
    })
    .unwrap();
    let wc = wait_wcs(&t.cq, 2);
    assert_eq!(
        (wc[0].wr_id, wc[0].status, wc[0].opcode),
        (1, WcStatus::Success, WcOpcode::RdmaWrite)
    );
    assert_eq!(
        (wc[1].wr_id, wc[1].status, wc[1].opcode, wc[1].byte_len),
        (2, WcStatus::Success, WcOpcode::Send, 13)
    );
    assert_eq!(wc[1].invalidated_rkey, None);
    let wc = wait_wcs(&i.cq, 1);
    assert_eq!(
        (wc[0].wr_id, wc[0].status, wc[0].opcode, wc[0].byte_len),
        (50, WcStatus::Success, WcOpcode::Recv, 13)
    );
    assert_eq!(wc[0].invalidated_rkey, Some(seg.rkey));
    let mut got = [0u8; 13];
    rsp.read_at(0, &mut got);
    assert_eq!(&got, b"SCSI response");
    let mut got = [0u8; 7];
    data.read_at(0, &mut got);
    assert_eq!(&got, b"payload");
    // A plain SEND invalidates nothing.
    iqp.post_recv(&RecvWr {
        wr_id: 51,
        sges: rsp.sges(0, 64).unwrap(),
    })
    .unwrap();
    tqp.post_send(&send_wr(3, &src, 4)).unwrap();
    assert_eq!(wait_wcs(&t.cq, 1)[0].status, WcStatus::Success);
    let wc = wait_wcs(&i.cq, 1);
    assert_eq!((wc[0].wr_id, wc[0].invalidated_rkey), (51, None));
}

#[test]
fn invalidated_rkey_refuses_later_rdma() {
    for (case, read) in [("read", true), ("write", false)] {
        let (i, iqp, t, tqp, _bufs) = pair(unix_addr("inv2"), QpAttrs::default(), 0);
        let rsp = i.pd.reg_zeroed(64, Access::LOCAL_WRITE).unwrap();
        iqp.post_recv(&RecvWr {
            wr_id: 50,
            sges: rsp.sges(0, 64).unwrap(),
        })
        .unwrap();
        let mut data = i.pd.reg_zeroed(64, Access::ALL).unwrap();
        data.write_at(0, b"initiator bytes");
        let seg = data.segs()[0];
        let sink = t.pd.reg_zeroed(64, Access::LOCAL_WRITE).unwrap();
        tqp.post_send(&SendWr {
            wr_id: 1,
            op: SendOp::SendInvalidate { rkey: seg.rkey },
            sges: sink.sges(0, 8).unwrap(),
            signaled: true,
        })
        .unwrap();
        assert_eq!(wait_wcs(&t.cq, 1)[0].status, WcStatus::Success);
        assert_eq!(wait_wcs(&i.cq, 1)[0].invalidated_rkey, Some(seg.rkey));
        let op = if read {
            SendOp::RdmaRead {
                remote_addr: seg.addr,
                rkey: seg.rkey,
            }
        } else {
            SendOp::RdmaWrite {
                remote_addr: seg.addr,
                rkey: seg.rkey,
            }
        };
        tqp.post_send(&SendWr {
            wr_id: 2,
            op,
            sges: sink.sges(0, 16).unwrap(),
            signaled: true,
        })
        .unwrap();
        let wc = wait_wcs(&t.cq, 1);
        assert_eq!(
            (wc[0].wr_id, wc[0].status),
            (2, WcStatus::RemAccessErr),
            "case {case}"
        );
        assert_eq!(tqp.state(), QpState::Error, "case {case}");
        // The memory is untouched and still usable locally under its lkey.
        let mut got = [0u8; 15];
        data.read_at(0, &mut got);
        assert_eq!(&got, b"initiator bytes", "case {case}");
        assert!(data.sges(0, 64).is_some());
    }
}

#[test]
fn invalidating_a_key_that_is_not_valid_here_fails_the_receive() {
    // Unknown key, an lkey, a key of another protection domain, and a key
    // invalidated already.
    for case in 0..4 {
        let (i, iqp, t, tqp, _bufs) = pair(unix_addr("inv3"), QpAttrs::default(), 0);
        let rsp = i.pd.reg_zeroed(64, Access::LOCAL_WRITE).unwrap();
        for wr_id in [50, 51] {
            iqp.post_recv(&RecvWr {
                wr_id,
                sges: rsp.sges(0, 64).unwrap(),
            })
            .unwrap();
        }
        let data = i.pd.reg_zeroed(64, Access::ALL).unwrap();
        let other_pd = i._dev.alloc_pd();
        let other = other_pd.reg_zeroed(64, Access::ALL).unwrap();
        let seg = data.segs()[0];
        let src = t.pd.reg_zeroed(64, Access::LOCAL_WRITE).unwrap();
        let rkey = match case {
            0 => seg.rkey ^ 0x55,
            1 => seg.lkey,
            2 => other.segs()[0].rkey,
            _ => {
                tqp.post_send(&SendWr {
                    wr_id: 9,
                    op: SendOp::SendInvalidate { rkey: seg.rkey },
                    sges: src.sges(0, 8).unwrap(),
                    signaled: true,
                })
                .unwrap();
                assert_eq!(wait_wcs(&t.cq, 1)[0].status, WcStatus::Success);
                let wc = wait_wcs(&i.cq, 1);
                assert_eq!((wc[0].wr_id, wc[0].status), (50, WcStatus::Success));
                seg.rkey
            }
        };
        tqp.post_send(&SendWr {
            wr_id: 1,
            op: SendOp::SendInvalidate { rkey },
            sges: src.sges(0, 8).unwrap(),
            signaled: true,
        })
        .unwrap();
        let wc = wait_wcs(&t.cq, 1);
        assert_eq!(
            (wc[0].wr_id, wc[0].status),
            (1, WcStatus::RemInvReqErr),
            "case {case}"
        );
        // The receive completes in error, naming nothing; the responder's QP
        // fails and flushes what else it had posted.
        let wc = wait_wcs(&i.cq, if case == 3 { 1 } else { 2 });
        assert_eq!(
            (wc[0].status, wc[0].opcode, wc[0].invalidated_rkey),
            (WcStatus::RemInvReqErr, WcOpcode::Recv, None),
            "case {case}"
        );
        if case != 3 {
            assert_eq!((wc[1].wr_id, wc[1].status), (51, WcStatus::WrFlushErr));
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        while iqp.state() != QpState::Error || tqp.state() != QpState::Error {
            assert!(Instant::now() < deadline, "case {case}: a QP stayed up");
            thread::sleep(Duration::from_millis(5));
        }
    }
}
