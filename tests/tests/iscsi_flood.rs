//! A flood of connections that never log in, against the embedded default
//! target: 3,000 idle sockets that never send, 1,000 that send a Login
//! Request announcing a 16 MiB data segment and stop, and 1,000 that send
//! random bytes. Throughout, ferrited's resident memory stays under 128 MiB
//! and the default target keeps answering `iscsi-inq`; the idle sockets are
//! closed by ferrited once the login timeout (lowered through the tree) has
//! passed, the oversized logins are answered with an initiator-error Login
//! Response and closed, and every random-byte socket is closed too.
//!
//! Only protocol facts and the memory bound are asserted; every deadline is
//! generous, so a slow machine makes the test slower, never failed.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed step is a failed test

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::Command;
use std::time::{Duration, Instant};

use ferrite_iscsi::pdu::{BhsBuf, Opcode};
use ferrite_tests::{Ferrited, Rng, RssWatch, require_tool, run_with_timeout, vm_rss_kib};
use nix::sys::resource::{Resource, getrlimit, setrlimit};

const IQN: &str = "iqn.2026-11.org.ferrite:default";
const IDLE: usize = 3_000;
const BIG_LOGINS: usize = 1_000;
const RANDOM: usize = 1_000;
/// The login timeout the test sets (the default is 15 s); the flood opens
/// in a few seconds.
const LOGIN_TIMEOUT_S: u64 = 10;
/// Resident memory ferrited must stay under.
const RSS_BOUND_KIB: u64 = 128 * 1024;
/// Bytes of random data each random socket sends.
const RANDOM_BYTES: usize = 4096;
/// Descriptors the test needs beyond its sockets (ferrited's pipes, the
/// harness, iscsi-inq's children).
const SPARE_FDS: u64 = 256;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Idle,
    BigLogin,
    Random,
}

/// One flood socket and what it has seen.
struct Probe {
    s: TcpStream,
    kind: Kind,
    opened: Instant,
    /// When the end of the connection (EOF or reset) was seen.
    closed: Option<Instant>,
    /// What ferrited sent (bounded: more than this is a failure).
    rx: Vec<u8>,
    reset: bool,
}

const RX_CAP: usize = 64 * 1024;

impl Probe {
    fn new(addr: SocketAddr, kind: Kind) -> Probe {
        let s = TcpStream::connect_timeout(&addr, Duration::from_secs(60))
            .unwrap_or_else(|e| panic!("connecting a {kind:?} socket: {e}"));
        // Nonblocking: a fresh socket's send buffer takes the few bytes
        // sent, and reads only look.
        s.set_nonblocking(true).unwrap();
        Probe {
            s,
            kind,
            opened: Instant::now(),
            closed: None,
            rx: Vec::new(),
            reset: false,
        }
    }

    /// Sends `bytes` (at most a few KiB); a connection ferrited already
    /// closed is closed, not a failure (it may drop junk at once).
    fn send(&mut self, bytes: &[u8]) {
        if let Err(e) = self.s.write_all(bytes) {
            assert!(
                matches!(e.kind(), ErrorKind::BrokenPipe | ErrorKind::ConnectionReset),
                "{:?} socket: write: {e}",
                self.kind
            );
            self.closed = Some(Instant::now());
            self.reset = true;
        }
    }

    /// Reads what is there without blocking; notes the end of the
    /// connection.
    fn poll(&mut self, now: Instant) {
        if self.closed.is_some() {
            return;
        }
        let mut buf = [0u8; 4096];
        loop {
            match self.s.read(&mut buf) {
                Ok(0) => {
                    self.closed = Some(now);
                    return;
                }
                Ok(n) => {
                    assert!(
                        self.rx.len() + n <= RX_CAP,
                        "ferrited sent a {:?} socket more than {RX_CAP} bytes",
                        self.kind
                    );
                    self.rx.extend_from_slice(&buf[..n]);
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) if e.kind() == ErrorKind::ConnectionReset => {
                    self.closed = Some(now);
                    self.reset = true;
                    return;
                }
                Err(e) => panic!("{:?} socket: read: {e}", self.kind),
            }
        }
    }
}

/// Every 100 sockets opened, reads what the open ones got, so that a close
/// during the opening is seen when it happens.
fn poll_some(probes: &mut [Probe], n: usize) {
    if n % 100 == 99 {
        let now = Instant::now();
        for p in probes.iter_mut() {
            p.poll(now);
        }
    }
}

/// A Login Request (operational stage, transit to full feature) whose
/// header announces a 16 MiB data segment (the largest the 24-bit field
/// holds); nothing of the segment follows.
fn big_login_header(n: usize) -> [u8; 48] {
    let mut b = BhsBuf::new(Opcode::LOGIN_REQ, 0x80 | (1 << 2) | 3);
    b.set_immediate();
    b.0[8..14].copy_from_slice(&[0x80, 0, 0, 0, (n >> 8) as u8, n as u8]);
    b.set_itt(n as u32);
    b.0[5..8].copy_from_slice(&[0xff, 0xff, 0xff]);
    b.0
}

fn nofile_soft(pid: u32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/limits"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Max open files"))
                .map(str::to_string)
        })
        .unwrap_or_default()
}

/// Runs `iscsi-inq` on LUN 0 of the default target; true when it printed
/// the disk's standard INQUIRY data.
fn inq_answers(f: &Ferrited, when: &str) -> bool {
    let t = Instant::now();
    let out = run_with_timeout(
        Command::new("iscsi-inq").arg(f.url(IQN, 0)),
        Duration::from_secs(120),
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let ok = out.status.success() && text.contains("Peripheral Device Type:DIRECT_ACCESS");
    eprintln!(
        "iscsi-inq {when}: {} in {:.2} s",
        if ok { "answered" } else { "FAILED" },
        t.elapsed().as_secs_f64()
    );
    if !ok {
        eprintln!("{text}{}", String::from_utf8_lossy(&out.stderr));
    }
    ok
}

/// (min, median, max) of the seconds from connect to close of `kind`.
fn close_times(probes: &[Probe], kind: Kind) -> (f64, f64, f64) {
    let mut v: Vec<f64> = probes
        .iter()
        .filter(|p| p.kind == kind)
        .filter_map(|p| p.closed.map(|c| (c - p.opened).as_secs_f64()))
        .collect();
    v.sort_by(f64::total_cmp);
    if v.is_empty() {
        return (0.0, 0.0, 0.0);
    }
    (v[0], v[v.len() / 2], v[v.len() - 1])
}

#[test]
fn connection_flood_leaves_memory_bounded_and_the_target_serving() {
    require_tool("iscsi-inq", "libiscsi-bin");
    let total = (IDLE + BIG_LOGINS + RANDOM) as u64;
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).unwrap();
    assert!(
        hard >= total + SPARE_FDS,
        "the hard open-file limit ({hard}) is below the {} descriptors this test \
         and ferrited each need: raise it (limits.conf, LimitNOFILE=)",
        total + SPARE_FDS
    );
    // ferrited starts with the usual soft limit and must raise its own;
    // the test raises its own once ferrited runs.
    setrlimit(Resource::RLIMIT_NOFILE, soft.min(1024), hard).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let f = Ferrited::start_default(dir.path());
    setrlimit(Resource::RLIMIT_NOFILE, hard, hard).unwrap();
    let limits = nofile_soft(f.pid());
    eprintln!("ferrited {limits}");
    let fields: Vec<&str> = limits.split_whitespace().collect();
    assert_eq!(
        fields.get(3),
        Some(&hard.to_string().as_str()),
        "ferrited did not raise its soft open-file limit to the hard limit: {limits}\n{}",
        f.log_text()
    );

    f.ctl(&[
        "set",
        "/targets/iscsi/login_timeout_s",
        &LOGIN_TIMEOUT_S.to_string(),
    ]);
    let timeout = Duration::from_secs(LOGIN_TIMEOUT_S);
    let mut inq_asked = 0;
    let mut inq_answered = 0;
    let mut inq = |f: &Ferrited, when: &str| {
        inq_asked += 1;
        if inq_answers(f, when) {
            inq_answered += 1;
        }
    };
    // Also makes sure every core has the new login timeout before the
    // first flood socket arrives: the setting travels by message, and a
    // login crosses each core's loop many times.
    inq(&f, "before the flood");
    let start_rss = vm_rss_kib(f.pid()).expect("ferrited's VmRSS");
    let rss = RssWatch::start(f.pid());
    let flood_start = Instant::now();

    let mut probes: Vec<Probe> = Vec::with_capacity(total as usize);
    for n in 0..IDLE {
        probes.push(Probe::new(f.addr, Kind::Idle));
        poll_some(&mut probes, n);
    }
    let idle_opened = flood_start.elapsed();
    inq(&f, "with the idle sockets open");
    for n in 0..BIG_LOGINS {
        let mut p = Probe::new(f.addr, Kind::BigLogin);
        p.send(&big_login_header(n));
        probes.push(p);
        poll_some(&mut probes, n);
    }
    inq(&f, "after the 16 MiB logins");
    // Deterministic junk: the same bytes every run.
    let mut rng = Rng::from_state(0x9e37_79b9_7f4a_7c15);
    let mut bytes = vec![0u8; RANDOM_BYTES];
    for n in 0..RANDOM {
        let mut p = Probe::new(f.addr, Kind::Random);
        rng.fill(&mut bytes);
        p.send(&bytes);
        probes.push(p);
        poll_some(&mut probes, n);
    }
    let opened = flood_start.elapsed();
    eprintln!(
        "flood open: {IDLE} idle sockets in {:.2} s, all {total} in {:.2} s",
        idle_opened.as_secs_f64(),
        opened.as_secs_f64()
    );
    inq(&f, "with the whole flood open");

    // Wait for ferrited to close every socket; ask iscsi-inq every few
    // seconds while idle sockets remain.
    let deadline = Instant::now() + timeout + Duration::from_secs(180);
    let mut next_inq = Instant::now() + Duration::from_secs(4);
    let mut open_idle_at_inq = Vec::new();
    loop {
        let now = Instant::now();
        for p in probes.iter_mut() {
            p.poll(now);
        }
        let open = probes.iter().filter(|p| p.closed.is_none()).count();
        if open == 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{open} flood sockets still open {} s after the flood began \
             (login timeout {LOGIN_TIMEOUT_S} s)",
            flood_start.elapsed().as_secs()
        );
        assert!(
            vm_rss_kib(f.pid()).is_some(),
            "ferrited is gone:\n{}",
            f.log_text()
        );
        let idle_open = probes
            .iter()
            .filter(|p| p.kind == Kind::Idle && p.closed.is_none())
            .count();
        if idle_open > 0 && Instant::now() >= next_inq {
            open_idle_at_inq.push(idle_open);
            inq(&f, &format!("with {idle_open} idle sockets still open"));
            next_inq = Instant::now() + Duration::from_secs(4);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let all_closed = flood_start.elapsed();
    inq(&f, "after the flood");
    let peak = rss.finish();
    let end_rss = vm_rss_kib(f.pid()).unwrap_or(0);

    let (imin, imed, imax) = close_times(&probes, Kind::Idle);
    let (bmin, bmed, bmax) = close_times(&probes, Kind::BigLogin);
    let (rmin, rmed, rmax) = close_times(&probes, Kind::Random);
    let resets = |k: Kind| probes.iter().filter(|p| p.kind == k && p.reset).count();
    eprintln!(
        "ferrited VmRSS: {} KiB before the flood, peak {} KiB, {} KiB after",
        start_rss, peak, end_rss
    );
    eprintln!(
        "iscsi-inq: {inq_answered} of {inq_asked} answered \
         (idle sockets open at the in-flood checks: {open_idle_at_inq:?})"
    );
    eprintln!(
        "closed after connect (min / median / max s): idle {imin:.1} / {imed:.1} / {imax:.1}; \
         16 MiB logins {bmin:.2} / {bmed:.2} / {bmax:.2}; random {rmin:.2} / {rmed:.2} / {rmax:.2} \
         ({} reset); all closed {:.1} s after the flood began",
        resets(Kind::Random),
        all_closed.as_secs_f64()
    );

    assert!(
        peak < RSS_BOUND_KIB,
        "ferrited's RSS peaked at {peak} KiB, over the {RSS_BOUND_KIB} KiB bound"
    );
    assert_eq!(
        inq_answered,
        inq_asked,
        "iscsi-inq failed during the flood:\n{}",
        f.log_text()
    );
    for p in &probes {
        match p.kind {
            // A target never speaks first (RFC 7143 §6.1: the initiator
            // opens the login), and it waits out the login timeout.
            Kind::Idle => {
                assert!(
                    p.rx.is_empty(),
                    "ferrited sent {} bytes to an idle socket",
                    p.rx.len()
                );
                let held = p.closed.unwrap() - p.opened;
                assert!(
                    held + Duration::from_secs(1) >= timeout,
                    "an idle socket was closed after {held:?}, before the {LOGIN_TIMEOUT_S} s login timeout"
                );
            }
            // RFC 7143 §13.12: during login a data segment may be at most
            // 8192 bytes; the login fails with an initiator error (0200h) and
            // the connection closes.
            Kind::BigLogin => {
                assert!(
                    p.rx.len() >= 48,
                    "no Login Response to a login announcing a 16 MiB segment ({} bytes, reset {})",
                    p.rx.len(),
                    p.reset
                );
                assert_eq!(
                    Opcode(p.rx[0] & 0x3f),
                    Opcode::LOGIN_RSP,
                    "{:02x?}",
                    &p.rx[..48]
                );
                assert_eq!(
                    (p.rx[36], p.rx[37]),
                    (2, 0),
                    "login status (0200h, initiator error): {:02x?}",
                    &p.rx[..48]
                );
            }
            Kind::Random => {}
        }
    }
    let log = f.log_text();
    assert!(!log.contains("panicked"), "a panic:\n{log}");
    assert!(
        log.matches("login timed out").count() >= IDLE,
        "fewer than {IDLE} 'login timed out' lines"
    );
}
