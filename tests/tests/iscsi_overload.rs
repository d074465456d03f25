//! Write data without data: initiators that ask for far more write data
//! than ferrited may hold, and then send it a few bytes a second, against
//! the embedded default with a 512 MiB data memory budget
//! (`--data-memory-mb`, `ferrite_core::budget`).
//!
//! 32 sessions log in with InitialR2T=Yes and ImmediateData=No and each
//! sends 128 WRITE (16) of 8 MiB (32 GiB asked for in all) with no data,
//! then answers the R2Ts it gets with 16 bytes a second. Throughout,
//! ferrited's RSS stays under the budget plus 256 MiB, the metrics show
//! commands waiting for memory and never more memory used than the
//! budget, and a 33rd session writing 4 KiB at queue depth 1 keeps
//! completing its writes. When the flood's connections close, every
//! command they held is released (the metrics show no memory used and
//! nobody waiting) and RSS comes back to within 64 MiB of where it
//! started.
//!
//! Bounded: 32 sessions, 4,096 commands, a 20 s trickle, deadlines of
//! a minute for the release.

use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use ferrite_iscsi::initiator::{Command, Initiator, InitiatorConfig};
use ferrite_iscsi::pdu::{BhsBuf, Opcode, Pdu};
use ferrite_tests::{
    Ferrited, Login, Options, Release, RssWatch, free_port, metric, vm_rss_kib, wait_for_release,
};

const TARGET: &str = "iqn.2026-11.org.ferrite:default";
const BUDGET_MB: u64 = 512;
const SESSIONS: usize = 32;
const COMMANDS: usize = 128;
const CMD_LEN: usize = 8 << 20;
const TRICKLE: Duration = Duration::from_secs(20);

fn write16(lba: u64, blocks: u32) -> [u8; 16] {
    let mut c = [0u8; 16];
    c[0] = 0x8a;
    c[2..10].copy_from_slice(&lba.to_be_bytes());
    c[10..14].copy_from_slice(&blocks.to_be_bytes());
    c
}

/// A Data-Out PDU of `data` at `offset` for R2T `ttt` of task `itt`.
fn data_out(itt: u32, ttt: u32, sn: u32, offset: u32, data: &[u8]) -> Pdu {
    let mut b = BhsBuf::new(Opcode::DATA_OUT, 0);
    b.set_itt(itt)
        .set_word20(ttt)
        .set_u32(36, sn)
        .set_u32(40, offset);
    Pdu::with_data(b, data.to_vec())
}

/// A hostile session: 128 writes of 8 MiB without data, then 16 bytes a
/// second against the R2Ts it got, until `stop`. Returns the R2Ts seen.
fn flood(addr: SocketAddr, n: usize, zeros: Arc<Vec<u8>>, stop: Arc<AtomicBool>) -> usize {
    let s = TcpStream::connect(addr).expect("connect");
    s.set_nodelay(true).ok();
    let cfg = Login::new(format!("iqn.2026-12.test:flood{n}"), TARGET)
        .with(|c| {
            c.initial_r2t = true;
            c.immediate_data = false;
        })
        .config();
    let mut tx = Initiator::new(s.try_clone().expect("clone"), cfg);
    tx.login().expect("flood login");
    s.set_read_timeout(Some(Duration::from_millis(200))).ok();
    let mut rx = Initiator::new(s.try_clone().expect("clone"), InitiatorConfig::default());
    let blocks = (CMD_LEN / 512) as u32;
    for k in 0..COMMANDS {
        let cdb = write16((k * CMD_LEN / 512) as u64, blocks);
        let itt = tx.new_itt();
        let (p, _) = tx.command_pdu(
            itt,
            &Command {
                lun: 0,
                cdb: &cdb,
                read_len: 0,
                write: &zeros[..],
                attr: 1,
                immediate: false,
            },
        );
        if tx.send_pdu(&p).is_err() {
            return 0;
        }
    }
    // (itt, ttt, next offset, end, DataSN)
    let mut r2ts: Vec<(u32, u32, u32, u32, u32)> = Vec::new();
    let mut seen = 0;
    let mut last = Instant::now();
    while !stop.load(Ordering::Relaxed) {
        match rx.recv_pdu() {
            Ok(p) if p.bhs().opcode() == Opcode::R2T => {
                let b = p.bhs();
                // R2T (RFC 7143 §11.8): Desired Data Transfer Length at byte 44.
                let (off, len) = (b.buffer_offset(), b.word(44));
                r2ts.push((b.itt(), b.ttt(), off, off + len, 0));
                seen += 1;
            }
            Ok(_) => {}
            Err(ferrite_iscsi::initiator::InitiatorError::Io(_)) => {}
            Err(_) => break,
        }
        if last.elapsed() >= Duration::from_secs(1)
            && let Some(r) = r2ts.iter_mut().find(|r| r.2 + 16 < r.3)
        {
            last = Instant::now();
            let p = data_out(r.0, r.1, r.4, r.2, &[0x5a; 16]);
            r.2 += 16;
            r.4 += 1;
            if tx.send_pdu(&p).is_err() {
                break;
            }
        }
    }
    seen
}

#[test]
fn write_flood_without_data_stays_in_budget_and_others_are_served() {
    let dir = tempfile::tempdir().expect("tempdir");
    let metrics_addr: SocketAddr = ([127, 0, 0, 1], free_port()).into();
    let f = Ferrited::start(
        dir.path(),
        free_port(),
        Options {
            config: None,
            args: vec![
                "--data-memory-mb".into(),
                BUDGET_MB.to_string(),
                "--metrics".into(),
                metrics_addr.to_string(),
            ],
        },
    );
    let pid = f.pid();
    let addr = f.addr;

    // The well-behaved session, warmed up before the flood.
    let good_login = Login::new("iqn.2026-12.test:good", TARGET);
    let mut good = good_login.connect(addr);
    let block = vec![0xa5u8; 4096];
    let write = |good: &mut Initiator<TcpStream>, lba: u64| {
        good.command(&Command {
            lun: 0,
            cdb: &write16(lba, 8),
            read_len: 0,
            write: &block,
            attr: 1,
            immediate: false,
        })
        .expect("good write")
    };
    write(&mut good, 0); // the POWER ON unit attention
    for i in 0..64 {
        assert_eq!(write(&mut good, i * 8).status, 0);
    }
    let start_rss = vm_rss_kib(pid).unwrap_or(0);

    let rss = RssWatch::start(pid);

    let zeros = Arc::new(vec![0u8; CMD_LEN]);
    let stop = Arc::new(AtomicBool::new(false));
    let flooders: Vec<_> = (0..SESSIONS)
        .map(|n| {
            let (z, s) = (zeros.clone(), stop.clone());
            std::thread::spawn(move || flood(addr, n, z, s))
        })
        .collect();

    // The good session writes at QD 1 while the flood holds its memory.
    let t0 = Instant::now();
    let mut lat = Vec::new();
    let mut waiting_seen = 0;
    let mut used_max = 0;
    let mut lba = 0;
    while t0.elapsed() < TRICKLE {
        let t = Instant::now();
        let r = write(&mut good, 1024 + lba % 4096 * 8);
        lat.push(t.elapsed());
        assert_eq!(r.status, 0, "the good session's write failed");
        lba += 1;
        if lba % 64 == 0 {
            waiting_seen = waiting_seen
                .max(metric(metrics_addr, "ferrite_data_memory_waiting_commands").unwrap_or(0));
            used_max =
                used_max.max(metric(metrics_addr, "ferrite_data_memory_used_bytes").unwrap_or(0));
        }
    }
    lat.sort();
    let p99 = lat[lat.len() * 99 / 100];
    let max = *lat.last().expect("latencies");
    let flood_peak = rss.peak();
    let budget_used_peak = metric(metrics_addr, "ferrite_data_memory_peak_bytes").unwrap_or(0);

    stop.store(true, Ordering::Relaxed);
    let r2ts: usize = flooders.into_iter().map(|h| h.join().unwrap_or(0)).sum();
    // The flood's sockets are closed now: everything they held goes back.
    let Release {
        used,
        waiting,
        end_rss,
    } = wait_for_release(metrics_addr, pid, start_rss);
    rss.finish();
    eprintln!(
        "used {used} waiting {waiting} at the end; RSS {start_rss} KiB before, peak {flood_peak} KiB, {end_rss} KiB after; \
         budget used at most {} MiB (peak metric {} MiB); up to {waiting_seen} commands waited; \
         {r2ts} R2Ts to the flood; good session: {} writes, p99 {p99:?}, max {max:?}",
        used_max >> 20,
        budget_used_peak >> 20,
        lat.len()
    );
    // A new session is served (the good one may have been silent longer
    // than the keepalive allows).
    drop(good);
    let mut again = good_login.connect(addr);
    write(&mut again, 0);
    assert_eq!(write(&mut again, 0).status, 0);
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
    assert!(r2ts > 0, "the flood got no R2T");
    assert_eq!(
        (used, waiting),
        (0, 0),
        "the flood's commands were not all released"
    );
    assert!(
        end_rss <= start_rss + 64 * 1024,
        "RSS {end_rss} KiB after the flood, more than 64 MiB over {start_rss} KiB"
    );
    // Liveness, not speed: no write of the good session took anywhere near
    // the initiator's own timeouts.
    assert!(max < Duration::from_secs(10), "a write took {max:?}");
}
