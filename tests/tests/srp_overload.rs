//! Write data that never comes, over SRP: initiators that ask for far more
//! write data than ferrited may hold and never let an RDMA READ complete,
//! against an SRP port over the soft provider with a 256 MiB data memory
//! budget (`--data-memory-mb`, `ferrite_core::budget`).
//!
//! 24 hostile channels, each its own I_T nexus, speak the soft provider's
//! wire directly (`ferrite_rdma::soft::wire`): they log in, spend every
//! credit on WRITE (16) of 8 MiB whose data is described in many segments
//! (half of them 128 descriptors of 64 KiB inline in the SRP_CMD, half a
//! table of 2,048 descriptors of 4 KiB that the target must fetch), and
//! never answer an RDMA READ. The target's transport gives up on a read
//! after its timeout (10 s on the soft provider) and the channel fails;
//! the hostile initiator then logs in again and does it all over, until
//! the test ends. Throughout, ferrited's RSS stays under the budget plus
//! 256 MiB, the metrics show commands waiting for memory and never more
//! memory used than the budget, and another channel writing 4 KiB at
//! queue depth 1 keeps completing its writes. When the hostile channels
//! disconnect, every command they held is released (the metrics show no
//! memory used and nobody waiting) and RSS comes back to within 64 MiB of
//! where it started.
//!
//! Bounded: 24 channels, 128 commands per login, a 25 s flood, deadlines
//! of a minute for the release.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed step is a failed test

mod srp_util;

use std::net::{Shutdown, SocketAddr};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ferrite_rdma::RemoteSeg;
use ferrite_rdma::soft::wire::Frame;
use ferrite_scsi::Lun;
use ferrite_srp::initiator::{InitiatorConfig, Layout};
use ferrite_srp::iu::{self, CmdBuilder, IuType, LoginReq, LoginRsp};
use ferrite_tests::{
    Config, Device, Ferrited, Options, Release, RssWatch, SrpTarget, Target, free_port, metric,
    vm_rss_kib, wait_for_release,
};
use srp_util::{Srp, clear_ua, login_soft, port_id_of, rw};

const IQN: &str = "iqn.2026-12.org.ferrite:srp-overload";
const PORT_ID: &str = "0x66657272697465207372702070307430";
const BUDGET_MB: u64 = 256;
const CHANNELS: usize = 24;
const CMD_LEN: u32 = 8 << 20;
const FLOOD: Duration = Duration::from_secs(25);

/// What the hostile channels saw.
#[derive(Default)]
struct Seen {
    logins: AtomicU64,
    commands: AtomicU64,
    rdma_reads: AtomicU64,
}

/// The descriptors of one 8 MiB write: `n` segments of the initiator's
/// (never served) memory.
fn segments(n: usize) -> Vec<RemoteSeg> {
    let len = CMD_LEN / n as u32;
    (0..n)
        .map(|k| RemoteSeg {
            addr: 0x7000_0000_0000 + k as u64 * len as u64,
            rkey: 0x8000_0007,
            len,
        })
        .collect()
}

/// One login of a hostile channel: every credit spent on an 8 MiB write
/// (inline descriptors, or a table to fetch when `fetched`), every SEND
/// of the target acknowledged, no RDMA READ ever answered. Returns when
/// the target ends the channel or `stop` is set (then it disconnects).
fn hostile_login(sock: &Path, n: usize, fetched: bool, stop: &AtomicBool, seen: &Seen) {
    let Ok(mut s) = UnixStream::connect(sock) else {
        std::thread::sleep(Duration::from_millis(100));
        return;
    };
    let mut ini_id = [0x40u8; 16];
    ini_id[15] = n as u8;
    let login = LoginReq {
        tag: n as u64,
        req_it_iu_len: 4096,
        req_buf_fmt: iu::BUF_FORMAT_DIRECT | iu::BUF_FORMAT_INDIRECT,
        req_flags: iu::MULTICHAN_SINGLE,
        imm_data_offset: 0,
        initiator_port_id: ini_id,
        target_port_id: port_id_of(PORT_ID),
    };
    if Frame::ConnReq(login.encode().to_vec())
        .write_to(&mut s)
        .is_err()
    {
        return;
    }
    let credits = match Frame::read_from(&mut s) {
        Ok(Some(Frame::ConnRep(p))) => match LoginRsp::parse(&p) {
            Ok(r) => r.req_lim_delta,
            Err(_) => return,
        },
        _ => return,
    };
    seen.logins.fetch_add(1, Ordering::Relaxed);
    let tx = Arc::new(Mutex::new(s.try_clone().expect("clone")));
    // The receiving side: acknowledge what the target SENDs (its
    // responses), count its RDMA READ requests and answer none of them.
    let rx = {
        let tx = tx.clone();
        let mut rd = s.try_clone().expect("clone");
        std::thread::spawn(move || {
            let mut reads = 0u64;
            loop {
                match Frame::read_from(&mut rd) {
                    Ok(Some(Frame::Send(_))) => {
                        if Frame::Ack.write_to(&mut *tx.lock().unwrap()).is_err() {
                            break;
                        }
                    }
                    Ok(Some(Frame::ReadReq { .. })) => reads += 1,
                    Ok(Some(Frame::Disconnect)) | Ok(None) => break,
                    Ok(Some(_)) => {}
                    Err(_) => break,
                }
            }
            reads
        })
    };
    let (segs, table) = if fetched {
        let segs = segments(2048);
        let table = RemoteSeg {
            addr: 0x6000_0000_0000,
            rkey: 0x8000_0009,
            len: (segs.len() * iu::DIRECT_DESC_LEN) as u32,
        };
        (segs, Some(table))
    } else {
        (segments(128), None)
    };
    let blocks = CMD_LEN / 512;
    for k in 0..credits as u64 {
        let cdb = rw(0x8a, k * blocks as u64, blocks);
        let cmd = CmdBuilder {
            tag: 0x10_0000 + k,
            lun: Lun(0).encode(),
            task_attr: iu::TASK_ATTR_SIMPLE,
            cdb: &cdb,
            data_out: &segs,
            data_in: &[],
            out_table: table,
            in_table: None,
            inline_max: if fetched { 0 } else { segs.len() },
        }
        .encode();
        assert_eq!(
            iu::iu_type(&cmd),
            Some(IuType::CMD),
            "the SRP_CMD is malformed"
        );
        if Frame::Send(cmd).write_to(&mut *tx.lock().unwrap()).is_err() {
            break;
        }
        seen.commands.fetch_add(1, Ordering::Relaxed);
    }
    // Wait for the target to give up on its reads, or for the end.
    while !stop.load(Ordering::Relaxed) && !rx.is_finished() {
        std::thread::sleep(Duration::from_millis(100));
    }
    let _ = s.shutdown(Shutdown::Both);
    seen.rdma_reads
        .fetch_add(rx.join().unwrap_or(0), Ordering::Relaxed);
}

/// ferrited with a nullio LU behind an iSCSI target and an SRP soft port.
fn start(dir: &Path, metrics: SocketAddr) -> (Ferrited, PathBuf) {
    let sock = dir.join("srp.sock");
    let port = free_port();
    let cfg_path = Config::new()
        .device(Device::nullio("disk0", 64u64 << 30))
        .target(
            Target::new(IQN)
                .portal(format!("127.0.0.1:{port}"))
                .lun(0, "disk0"),
        )
        .srp_target(SrpTarget::soft("srp0", PORT_ID, &sock).lun(0, "disk0"))
        .write(dir.join("ferrite.json"));
    let f = Ferrited::start(
        dir,
        port,
        Options {
            config: Some(cfg_path),
            args: vec![
                "--cores".into(),
                "2".into(),
                "--data-memory-mb".into(),
                BUDGET_MB.to_string(),
                "--metrics".into(),
                metrics.to_string(),
            ],
        },
    );
    (f, sock)
}

/// The well-behaved channel, logged in through the project's initiator.
fn good_login(sock: &Path) -> Srp {
    login_soft(
        sock,
        InitiatorConfig {
            initiator_port_id: [0x11; 16],
            target_port_id: port_id_of(PORT_ID),
            timeout: Duration::from_secs(30),
            ..InitiatorConfig::default()
        },
    )
}

#[test]
fn srp_writes_whose_data_never_comes_stay_in_budget_and_others_are_served() {
    let dir = tempfile::Builder::new()
        .prefix("fsrpo")
        .tempdir_in("/tmp")
        .unwrap();
    let metrics_addr: SocketAddr = ([127, 0, 0, 1], free_port()).into();
    let (f, sock) = start(dir.path(), metrics_addr);
    let pid = f.pid();

    let mut good = good_login(&sock);
    clear_ua(&mut good.ini);
    let block = vec![0xa5u8; 4096];
    let write = |good: &mut Srp, lba: u64| {
        good.ini
            .command(
                Lun(0),
                &rw(0x8a, lba, 8),
                Some(&block),
                0,
                Layout::default(),
            )
            .expect("good write")
            .rsp
            .status
    };
    for i in 0..64 {
        assert_eq!(write(&mut good, i * 8), 0);
    }
    let rss = || vm_rss_kib(pid).unwrap_or(0);
    let start_rss = rss();
    let watch = RssWatch::start(pid);

    let seen = Arc::new(Seen::default());
    let stop = Arc::new(AtomicBool::new(false));
    let hostile: Vec<_> = (0..CHANNELS)
        .map(|n| {
            let (sock, stop, seen) = (sock.clone(), stop.clone(), seen.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    hostile_login(&sock, n, n % 2 == 1, &stop, &seen);
                }
            })
        })
        .collect();

    // The good channel writes at QD 1 while the flood holds its memory.
    let t0 = Instant::now();
    let mut lat = Vec::new();
    let (mut waiting_seen, mut used_max) = (0, 0);
    let mut lba = 0u64;
    while t0.elapsed() < FLOOD {
        let t = Instant::now();
        let status = write(&mut good, 1024 + lba % 4096 * 8);
        lat.push(t.elapsed());
        assert_eq!(status, 0, "the good channel's write failed");
        lba += 1;
        if lba.is_multiple_of(32) {
            waiting_seen = waiting_seen
                .max(metric(metrics_addr, "ferrite_data_memory_waiting_commands").unwrap_or(0));
            used_max =
                used_max.max(metric(metrics_addr, "ferrite_data_memory_used_bytes").unwrap_or(0));
        }
    }
    lat.sort();
    let p99 = lat[lat.len() * 99 / 100];
    let max = *lat.last().expect("latencies");
    let flood_peak = watch.peak();
    let budget_used_peak = metric(metrics_addr, "ferrite_data_memory_peak_bytes").unwrap_or(0);
    let waits = metric(metrics_addr, "ferrite_data_memory_waits_total").unwrap_or(0);

    stop.store(true, Ordering::Relaxed);
    for h in hostile {
        h.join().unwrap();
    }
    // The hostile channels are disconnected: everything they held goes back.
    let Release {
        used,
        waiting,
        end_rss,
    } = wait_for_release(metrics_addr, pid, start_rss);
    let _ = watch.finish();
    eprintln!(
        "used {used} waiting {waiting} at the end; RSS {start_rss} KiB before, peak {flood_peak} KiB, {end_rss} KiB after; \
         budget used at most {} MiB (peak metric {} MiB); up to {waiting_seen} commands waited, {waits} waits in all; \
         hostile: {} logins, {} commands, {} RDMA READs asked for; good channel: {} writes, p99 {p99:?}, max {max:?}",
        used_max >> 20,
        budget_used_peak >> 20,
        seen.logins.load(Ordering::Relaxed),
        seen.commands.load(Ordering::Relaxed),
        seen.rdma_reads.load(Ordering::Relaxed),
        lat.len()
    );
    // The good channel is still served after the flood.
    assert_eq!(write(&mut good, 0), 0);
    let limit_kib = (BUDGET_MB + 256) * 1024;
    assert!(
        flood_peak < limit_kib,
        "RSS peaked at {flood_peak} KiB, over the budget plus 256 MiB ({limit_kib} KiB)\n{}",
        f.log_text()
    );
    assert!(
        budget_used_peak <= BUDGET_MB << 20,
        "the budget's peak use {budget_used_peak} is over its limit"
    );
    assert!(
        waiting_seen > 0,
        "no command waited for memory: the flood never reached the budget"
    );
    assert!(
        seen.rdma_reads.load(Ordering::Relaxed) > 0,
        "the target never asked the hostile channels for data"
    );
    assert_eq!(
        (used, waiting),
        (0, 0),
        "the hostile channels' commands were not all released"
    );
    assert!(
        end_rss <= start_rss + 64 * 1024,
        "RSS {end_rss} KiB after the flood, more than 64 MiB over {start_rss} KiB"
    );
    // Liveness, not speed: no write of the good channel took anywhere near
    // the initiator's own timeout.
    assert!(max < Duration::from_secs(10), "a write took {max:?}");
}
