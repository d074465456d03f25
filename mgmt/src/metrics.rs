//! The optional Prometheus listener: `GET /metrics` in the Prometheus text
//! exposition format (version 0.0.4), rendered from [`Runtime::stats`] and
//! [`Runtime::sessions`] at each request.
//!
//! A std-only HTTP/1.1 server: one accepting thread, one short-lived thread
//! per connection (at most [`MAX_CONNECTIONS`] at once; more get 503), one
//! request per connection (`Connection: close`), a request head of at most
//! [`MAX_REQUEST`] bytes read within [`READ_TIMEOUT`]. `GET`/`HEAD` of
//! `/metrics` answer 200; any other path 404, another method 405, a
//! malformed or oversized head 400/431.
//!
//! This module owns the rendering and the listener; it does not own the
//! counters (the cores keep them, the daemon gathers them in
//! [`Runtime::stats`]). Off by default: ferrited starts it with
//! `--metrics ADDR:PORT`.

use std::fmt::Write as _;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::runtime::{IoStats, LatencyHistogram, Runtime, SessionInfo, Stats};

/// Largest request head (request line and headers) accepted, in bytes.
pub const MAX_REQUEST: usize = 8192;
/// Connections served at once; more are answered 503 at once.
pub const MAX_CONNECTIONS: usize = 8;
/// Time a client has to send its request head.
pub const READ_TIMEOUT: Duration = Duration::from_secs(2);
/// The quantiles exported as gauges next to each histogram.
pub const QUANTILES: [f64; 4] = [0.5, 0.9, 0.99, 0.999];

/// A running metrics listener; stopped by [`MetricsServer::shutdown`] or drop.
pub struct MetricsServer {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl MetricsServer {
    /// Binds `addr` and serves `/metrics` from `runtime` on a thread of its
    /// own.
    pub fn start(addr: SocketAddr, runtime: Arc<dyn Runtime>) -> std::io::Result<MetricsServer> {
        let listener = TcpListener::bind(addr)?;
        let addr = listener.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = stop.clone();
        let thread = std::thread::Builder::new()
            .name("metrics".into())
            .spawn(move || accept_loop(listener, runtime, stop2))?;
        tracing::info!(%addr, "metrics listener ready (GET /metrics)");
        Ok(MetricsServer {
            addr,
            stop,
            thread: Some(thread),
        })
    }

    /// The address it listens on (the bound port when started on port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops accepting and waits for the accepting thread.
    pub fn shutdown(mut self) {
        self.stop_now();
    }

    fn stop_now(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wake the blocking accept.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_millis(500));
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for MetricsServer {
    fn drop(&mut self) {
        if self.thread.is_some() {
            self.stop_now();
        }
    }
}

fn accept_loop(listener: TcpListener, runtime: Arc<dyn Runtime>, stop: Arc<AtomicBool>) {
    let active = Arc::new(AtomicUsize::new(0));
    for conn in listener.incoming() {
        if stop.load(Ordering::SeqCst) {
            return;
        }
        let Ok(mut conn) = conn else { continue };
        if active.fetch_add(1, Ordering::SeqCst) >= MAX_CONNECTIONS {
            active.fetch_sub(1, Ordering::SeqCst);
            let _ = conn.set_write_timeout(Some(READ_TIMEOUT));
            let _ = conn.write_all(&reply(503, "Service Unavailable", "busy\n", false));
            continue;
        }
        let (rt, active2) = (runtime.clone(), active.clone());
        let spawned = std::thread::Builder::new()
            .name("metrics-conn".into())
            .spawn(move || {
                serve_conn(conn, rt.as_ref());
                active2.fetch_sub(1, Ordering::SeqCst);
            });
        if spawned.is_err() {
            active.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

fn serve_conn(mut conn: TcpStream, runtime: &dyn Runtime) {
    let _ = conn.set_read_timeout(Some(READ_TIMEOUT));
    let _ = conn.set_write_timeout(Some(Duration::from_secs(10)));
    let answer = match read_head(&mut conn) {
        Ok(head) => answer(&head, runtime),
        Err(HeadError::TooLarge) => reply(431, "Request Header Fields Too Large", "", false),
        Err(HeadError::Incomplete) => reply(400, "Bad Request", "incomplete request\n", false),
    };
    let _ = conn.write_all(&answer);
    let _ = conn.flush();
}

enum HeadError {
    TooLarge,
    Incomplete,
}

/// Reads up to the blank line that ends the head (RFC 9112 §2.1).
fn read_head(conn: &mut TcpStream) -> Result<Vec<u8>, HeadError> {
    let mut buf = Vec::with_capacity(512);
    let mut chunk = [0u8; 1024];
    loop {
        if let Some(end) = find_end(&buf) {
            buf.truncate(end);
            return Ok(buf);
        }
        if buf.len() > MAX_REQUEST {
            return Err(HeadError::TooLarge);
        }
        match conn.read(&mut chunk) {
            Ok(0) | Err(_) => return Err(HeadError::Incomplete),
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

fn find_end(buf: &[u8]) -> Option<usize> {
    buf.windows(4)
        .position(|w| w == b"\r\n\r\n")
        .or_else(|| buf.windows(2).position(|w| w == b"\n\n"))
}

/// The whole answer to one request head.
fn answer(head: &[u8], runtime: &dyn Runtime) -> Vec<u8> {
    let Ok(text) = std::str::from_utf8(head) else {
        return reply(400, "Bad Request", "request is not UTF-8\n", false);
    };
    let line = text.lines().next().unwrap_or_default();
    // RFC 9112 §3: request-line = method SP request-target SP HTTP-version
    let mut parts = line.split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return reply(400, "Bad Request", "malformed request line\n", false);
    };
    if !version.starts_with("HTTP/1.") {
        return reply(505, "HTTP Version Not Supported", "HTTP/1.x only\n", false);
    }
    let path = target.split('?').next().unwrap_or_default();
    if path != "/metrics" {
        return reply(404, "Not Found", "only /metrics is served\n", false);
    }
    let head_only = match method {
        "GET" => false,
        "HEAD" => true,
        _ => {
            return reply(405, "Method Not Allowed", "GET or HEAD /metrics\n", true);
        }
    };
    let body = render(&runtime.stats(), &runtime.sessions());
    let mut out = format!(
        "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    )
    .into_bytes();
    if !head_only {
        out.extend_from_slice(body.as_bytes());
    }
    out
}

/// A plain-text answer; `allow` adds `Allow: GET, HEAD` (405).
fn reply(code: u16, reason: &str, body: &str, allow: bool) -> Vec<u8> {
    let allow = if allow { "Allow: GET, HEAD\r\n" } else { "" };
    format!(
        "HTTP/1.1 {code} {reason}\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: {}\r\n{allow}Connection: close\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// Escapes a label value: backslash, double quote and line feed.
fn esc(v: &str) -> String {
    let mut s = String::with_capacity(v.len());
    for c in v.chars() {
        match c {
            '\\' => s.push_str("\\\\"),
            '"' => s.push_str("\\\""),
            '\n' => s.push_str("\\n"),
            c => s.push(c),
        }
    }
    s
}

fn labels(pairs: &[(&str, &str)]) -> String {
    let inner: Vec<String> = pairs
        .iter()
        .map(|(k, v)| format!("{k}=\"{}\"", esc(v)))
        .collect();
    format!("{{{}}}", inner.join(","))
}

fn family(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

/// Seconds from microseconds, as Prometheus wants durations.
fn secs(us: u64) -> String {
    format!("{}", us as f64 / 1e6)
}

/// A counter family: name suffix, help text, the field it reads.
type IoCounter = (&'static str, &'static str, fn(&IoStats) -> u64);

const IO_COUNTERS: [IoCounter; 6] = [
    ("read_commands_total", "READ commands completed", |s| {
        s.read_cmds
    }),
    ("write_commands_total", "WRITE commands completed", |s| {
        s.write_cmds
    }),
    (
        "other_commands_total",
        "Commands other than READ and WRITE completed",
        |s| s.other_cmds,
    ),
    ("read_bytes_total", "Bytes read", |s| s.read_bytes),
    ("written_bytes_total", "Bytes written", |s| s.write_bytes),
    (
        "errors_total",
        "Commands that ended in CHECK CONDITION or were aborted",
        |s| s.errors,
    ),
];

fn histogram_samples(out: &mut String, name: &str, base: &[(&str, &str)], h: &LatencyHistogram) {
    let dir = h.dir.as_str();
    let mut l: Vec<(&str, &str)> = base.to_vec();
    l.push(("dir", dir));
    l.push(("size", &h.size_class));
    let mut cum = 0u64;
    for (i, c) in h.counts.iter().enumerate() {
        cum += c;
        let le = h
            .bounds_us
            .get(i)
            .map_or_else(|| "+Inf".to_string(), |b| secs(*b));
        let mut bl = l.clone();
        bl.push(("le", &le));
        let _ = writeln!(out, "{name}_bucket{} {cum}", labels(&bl));
    }
    if h.counts.len() <= h.bounds_us.len() {
        // A malformed histogram without the unbounded bucket still gets the
        // +Inf bucket Prometheus requires.
        let mut bl = l.clone();
        bl.push(("le", "+Inf"));
        let _ = writeln!(out, "{name}_bucket{} {cum}", labels(&bl));
    }
    let _ = writeln!(out, "{name}_sum{} {}", labels(&l), secs(h.sum_us));
    let _ = writeln!(out, "{name}_count{} {cum}", labels(&l));
}

fn quantile_samples(out: &mut String, name: &str, base: &[(&str, &str)], h: &LatencyHistogram) {
    for q in QUANTILES {
        if let Some(us) = h.percentile(q) {
            let qs = q.to_string();
            let mut l: Vec<(&str, &str)> = base.to_vec();
            l.push(("dir", h.dir.as_str()));
            l.push(("size", &h.size_class));
            l.push(("quantile", &qs));
            let _ = writeln!(out, "{name}{} {}", labels(&l), secs(us));
        }
    }
}

/// The Prometheus text exposition of `stats` and `sessions`.
pub fn render(stats: &Stats, sessions: &[SessionInfo]) -> String {
    let mut out = String::new();
    for (kind, map) in [("device", &stats.devices), ("target", &stats.targets)] {
        for (suffix, help, get) in IO_COUNTERS {
            let name = format!("ferrite_{kind}_{suffix}");
            family(&mut out, &name, "counter", &format!("{help}, per {kind}."));
            for (obj, s) in map {
                let _ = writeln!(out, "{name}{} {}", labels(&[(kind, obj)]), get(s));
            }
        }
    }

    let name = "ferrite_device_latency_seconds";
    family(
        &mut out,
        name,
        "histogram",
        "Command latency per device, direction and transfer size class.",
    );
    for (dev, hs) in &stats.latency {
        for h in hs {
            histogram_samples(&mut out, name, &[("device", dev)], h);
        }
    }
    let name = "ferrite_device_latency_quantile_seconds";
    family(
        &mut out,
        name,
        "gauge",
        "Upper bound of the latency bucket holding the quantile, per device, direction and size class.",
    );
    for (dev, hs) in &stats.latency {
        for h in hs {
            quantile_samples(&mut out, name, &[("device", dev)], h);
        }
    }

    let m = &stats.data_memory;
    for (name, kind, help, v) in [
        (
            "ferrite_data_memory_limit_bytes",
            "gauge",
            "Memory all commands' data buffers may hold at once.",
            m.limit,
        ),
        (
            "ferrite_data_memory_used_bytes",
            "gauge",
            "Memory commands' data buffers hold now.",
            m.used,
        ),
        (
            "ferrite_data_memory_peak_bytes",
            "gauge",
            "The most memory commands' data buffers held at once.",
            m.peak,
        ),
        (
            "ferrite_data_memory_waiting_commands",
            "gauge",
            "Commands waiting for data buffer memory now.",
            m.waiting,
        ),
        (
            "ferrite_data_memory_waits_total",
            "counter",
            "Commands that waited for data buffer memory.",
            m.waits,
        ),
    ] {
        family(&mut out, name, kind, help);
        let _ = writeln!(out, "{name} {v}");
    }

    let name = "ferrite_sessions";
    family(&mut out, name, "gauge", "Sessions logged in, per target.");
    let mut per_target = std::collections::BTreeMap::<&str, u64>::new();
    for s in sessions {
        *per_target.entry(&s.target).or_default() += 1;
    }
    for (t, n) in per_target {
        let _ = writeln!(out, "{name}{} {n}", labels(&[("target", t)]));
    }
    let isids: Vec<String> = sessions
        .iter()
        .map(|s| format!("{:012x}", s.isid))
        .collect();
    let session_labels = |i: usize| -> [(&str, &str); 3] {
        let s = &sessions[i];
        [
            ("target", s.target.as_str()),
            ("initiator", s.initiator.as_str()),
            ("isid", isids[i].as_str()),
        ]
    };
    let name = "ferrite_session_active_commands";
    family(
        &mut out,
        name,
        "gauge",
        "Commands in the session's task sets.",
    );
    for (i, s) in sessions.iter().enumerate() {
        let _ = writeln!(
            out,
            "{name}{} {}",
            labels(&session_labels(i)),
            s.active_commands
        );
    }
    for (suffix, help, get) in IO_COUNTERS {
        let name = format!("ferrite_session_{suffix}");
        family(&mut out, &name, "counter", &format!("{help}, per session."));
        for (i, s) in sessions.iter().enumerate() {
            let _ = writeln!(
                out,
                "{name}{} {}",
                labels(&session_labels(i)),
                get(&s.stats)
            );
        }
    }
    let name = "ferrite_session_latency_seconds";
    family(
        &mut out,
        name,
        "histogram",
        "Command latency per session, direction and transfer size class.",
    );
    for (i, s) in sessions.iter().enumerate() {
        for h in &s.latency {
            histogram_samples(&mut out, name, &session_labels(i), h);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::{FakeRuntime, IoDir};

    fn sample_stats() -> Stats {
        let mut s = Stats::default();
        s.devices.insert(
            "d\"0".into(),
            IoStats {
                read_cmds: 7,
                write_bytes: 4096,
                ..IoStats::default()
            },
        );
        let mut h = LatencyHistogram::new(IoDir::Read, "4k");
        h.record(40);
        h.record(400);
        h.record(5_000_000);
        s.latency.insert("d\"0".into(), vec![h]);
        s
    }

    fn http(addr: SocketAddr, req: &[u8]) -> String {
        let mut c = TcpStream::connect(addr).unwrap();
        c.write_all(req).unwrap();
        let mut out = String::new();
        c.read_to_string(&mut out).unwrap();
        out
    }

    #[test]
    fn histogram_is_cumulative_with_inf_sum_and_count() {
        let text = render(&sample_stats(), &[]);
        assert!(text.contains("ferrite_device_read_commands_total{device=\"d\\\"0\"} 7\n"));
        assert!(text.contains("ferrite_device_written_bytes_total{device=\"d\\\"0\"} 4096\n"));
        let l = "device=\"d\\\"0\",dir=\"read\",size=\"4k\"";
        assert!(text.contains(&format!(
            "ferrite_device_latency_seconds_bucket{{{l},le=\"0.00005\"}} 1\n"
        )));
        assert!(text.contains(&format!(
            "ferrite_device_latency_seconds_bucket{{{l},le=\"0.0005\"}} 2\n"
        )));
        assert!(text.contains(&format!(
            "ferrite_device_latency_seconds_bucket{{{l},le=\"1\"}} 2\n"
        )));
        assert!(text.contains(&format!(
            "ferrite_device_latency_seconds_bucket{{{l},le=\"+Inf\"}} 3\n"
        )));
        assert!(text.contains(&format!(
            "ferrite_device_latency_seconds_sum{{{l}}} 5.00044\n"
        )));
        assert!(text.contains(&format!("ferrite_device_latency_seconds_count{{{l}}} 3\n")));
        assert!(text.contains(&format!(
            "ferrite_device_latency_quantile_seconds{{{l},quantile=\"0.5\"}} 0.0005\n"
        )));
        // Every family is declared once.
        let types: Vec<&str> = text.lines().filter(|l| l.starts_with("# TYPE ")).collect();
        let mut sorted = types.clone();
        sorted.sort();
        sorted.dedup();
        assert_eq!(sorted.len(), types.len());
    }

    #[test]
    fn sessions_are_labelled_and_counted() {
        let s = SessionInfo {
            target: "iqn.t".into(),
            initiator: "iqn.i".into(),
            isid: 0x80_0000_0001,
            active_commands: 3,
            ..SessionInfo::default()
        };
        let text = render(&Stats::default(), &[s.clone(), s]);
        assert!(text.contains("ferrite_sessions{target=\"iqn.t\"} 2\n"));
        assert!(text.contains(
            "ferrite_session_active_commands{target=\"iqn.t\",initiator=\"iqn.i\",isid=\"008000000001\"} 3\n"
        ));
    }

    #[test]
    fn serves_metrics_404_405_and_bounds_the_request() {
        let rt = Arc::new(FakeRuntime::new());
        rt.set_stats(sample_stats());
        let srv = MetricsServer::start("127.0.0.1:0".parse().unwrap(), rt).unwrap();
        let a = srv.local_addr();
        let ok = http(a, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
        assert!(ok.starts_with("HTTP/1.1 200 OK\r\n"), "{ok}");
        assert!(ok.contains("ferrite_device_latency_seconds_bucket"));
        let head = http(a, b"HEAD /metrics HTTP/1.1\r\n\r\n");
        assert!(head.starts_with("HTTP/1.1 200 OK\r\n") && head.ends_with("\r\n\r\n"));
        let nf = http(a, b"GET / HTTP/1.1\r\n\r\n");
        assert!(nf.starts_with("HTTP/1.1 404 "), "{nf}");
        let post = http(a, b"POST /metrics HTTP/1.1\r\n\r\n");
        assert!(post.starts_with("HTTP/1.1 405 ") && post.contains("Allow: GET, HEAD"));
        let bad = http(a, b"garbage\r\n\r\n");
        assert!(bad.starts_with("HTTP/1.1 400 "), "{bad}");
        let mut big = b"GET /metrics HTTP/1.1\r\nX: ".to_vec();
        big.extend(std::iter::repeat_n(b'a', MAX_REQUEST * 2));
        let mut c = TcpStream::connect(a).unwrap();
        let _ = c.write_all(&big);
        let mut out = String::new();
        let _ = c.read_to_string(&mut out);
        assert!(out.starts_with("HTTP/1.1 431 "), "{out}");
        srv.shutdown();
        assert!(
            TcpStream::connect(a).is_err(),
            "still listening after shutdown"
        );
    }
}
