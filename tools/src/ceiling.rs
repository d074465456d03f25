//! The loopback ceiling: single-stream TCP bandwidth (iperf3 when it is
//! installed, else a built-in sender/receiver pair) and the round trip of a
//! 48-byte message (one iSCSI basic header segment) between two threads.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::stats;

/// Bandwidth in MB/s (10^6 bytes) and the tool that measured it.
#[derive(Clone, Debug)]
pub struct Bandwidth {
    pub mb_s: f64,
    pub tool: String,
}

/// Round trip statistics in microseconds.
#[derive(Clone, Debug)]
pub struct PingPong {
    pub iters: u64,
    pub mean_us: f64,
    pub p50_us: f64,
    pub p99_us: f64,
}

/// Bits per second received, from `iperf3 -J` output
/// (`end.sum_received.bits_per_second`).
pub fn parse_iperf3_json(text: &str) -> Option<f64> {
    let v: serde_json::Value = serde_json::from_str(text).ok()?;
    v.get("end")?
        .get("sum_received")?
        .get("bits_per_second")?
        .as_f64()
}

/// iperf3 on 127.0.0.1:`port` for `secs` seconds; `None` if iperf3 is
/// missing or fails. The one-shot server is stopped by PID.
pub fn iperf3(port: u16, secs: u32) -> Option<Bandwidth> {
    let mut server = Command::new("iperf3")
        .args(["-s", "-1", "-B", "127.0.0.1", "-p", &port.to_string()])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .process_group(0)
        .spawn()
        .ok()?;
    let until = Instant::now() + Duration::from_secs(5);
    // iperf3 -1 serves one client: a probe connection would use it up, so
    // wait for the listening socket in /proc/net/tcp instead.
    while !listening(port) && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = Command::new("iperf3")
        .args([
            "-c",
            "127.0.0.1",
            "-p",
            &port.to_string(),
            "-J",
            "-t",
            &secs.to_string(),
        ])
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .process_group(0)
        .output();
    let _ = server.kill();
    let _ = server.wait();
    let out = out.ok()?;
    let bps = parse_iperf3_json(&String::from_utf8_lossy(&out.stdout))?;
    Some(Bandwidth {
        mb_s: bps / 8.0 / 1e6,
        tool: "iperf3, one stream".into(),
    })
}

/// Whether `/proc/net/tcp` text shows a socket listening (state 0A) on
/// 127.0.0.1 or 0.0.0.0 at `port`.
pub fn parse_proc_net_tcp_listening(text: &str, port: u16) -> bool {
    let want = [
        format!("0100007F:{port:04X}"),
        format!("00000000:{port:04X}"),
    ];
    text.lines().skip(1).any(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        f.len() > 3 && want.iter().any(|w| w == f[1]) && f[3] == "0A"
    })
}

fn listening(port: u16) -> bool {
    std::fs::read_to_string("/proc/net/tcp").is_ok_and(|t| parse_proc_net_tcp_listening(&t, port))
}

/// Built-in single-stream bandwidth: one thread writes 1 MiB chunks for
/// `dur`, the other reads them; MB/s as received.
pub fn builtin_bandwidth(dur: Duration) -> std::io::Result<Bandwidth> {
    let l = TcpListener::bind("127.0.0.1:0")?;
    let addr = l.local_addr()?;
    let rx = std::thread::spawn(move || -> std::io::Result<(u64, Duration)> {
        let (mut s, _) = l.accept()?;
        let mut buf = vec![0u8; 1 << 20];
        let mut n = 0u64;
        let t = Instant::now();
        loop {
            match s.read(&mut buf)? {
                0 => break,
                k => n += k as u64,
            }
        }
        Ok((n, t.elapsed()))
    });
    let mut s = TcpStream::connect(addr)?;
    let chunk = vec![0x33u8; 1 << 20];
    let t = Instant::now();
    while t.elapsed() < dur {
        s.write_all(&chunk)?;
    }
    drop(s);
    let (n, el) = rx
        .join()
        .map_err(|_| std::io::Error::other("receiver thread panicked"))??;
    Ok(Bandwidth {
        mb_s: n as f64 / el.as_secs_f64() / 1e6,
        tool: "built-in, one stream, 1 MiB writes".into(),
    })
}

/// 48-byte ping-pong between two threads over loopback TCP (TCP_NODELAY),
/// at most `iters` round trips and at most `dur`.
pub fn ping_pong(iters: u64, dur: Duration) -> std::io::Result<PingPong> {
    const SIZE: usize = 48;
    let l = TcpListener::bind("127.0.0.1:0")?;
    let addr = l.local_addr()?;
    let echo = std::thread::spawn(move || -> std::io::Result<()> {
        let (mut s, _) = l.accept()?;
        s.set_nodelay(true)?;
        let mut b = [0u8; SIZE];
        loop {
            match s.read_exact(&mut b) {
                Ok(()) => s.write_all(&b)?,
                Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(()),
                Err(e) => return Err(e),
            }
        }
    });
    let mut s = TcpStream::connect(addr)?;
    s.set_nodelay(true)?;
    let msg = [0x42u8; SIZE];
    let mut b = [0u8; SIZE];
    for _ in 0..1000 {
        s.write_all(&msg)?;
        s.read_exact(&mut b)?;
    }
    let mut lat = Vec::with_capacity(iters.min(1 << 20) as usize);
    let t = Instant::now();
    while (lat.len() as u64) < iters && t.elapsed() < dur {
        let a = Instant::now();
        s.write_all(&msg)?;
        s.read_exact(&mut b)?;
        lat.push(a.elapsed().as_nanos() as u64);
    }
    drop(s);
    let _ = echo.join();
    lat.sort_unstable();
    let us = |v: Option<u64>| v.map_or(f64::NAN, |n| n as f64 / 1e3);
    Ok(PingPong {
        iters: lat.len() as u64,
        mean_us: stats::mean_u64(&lat).map_or(f64::NAN, |m| m / 1e3),
        p50_us: us(stats::percentile_sorted(&lat, 50.0)),
        p99_us: us(stats::percentile_sorted(&lat, 99.0)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn iperf3_json_received_rate() {
        let j = r#"{"start":{},"intervals":[],"end":{"sum_sent":{"bits_per_second":3.1e10},
            "sum_received":{"bits_per_second":30123456789.5},"cpu_utilization_percent":{"host_total":99.0}}}"#;
        assert_eq!(parse_iperf3_json(j), Some(30123456789.5));
        assert_eq!(parse_iperf3_json(r#"{"error":"unable to connect"}"#), None);
        assert_eq!(parse_iperf3_json("not json"), None);
    }

    #[test]
    fn proc_net_tcp_listeners() {
        let t = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n   0: 0100007F:14B3 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1\n   1: 0100007F:14B4 0100007F:9C40 01 00000000:00000000 00:00000000 00000000     0        0 2\n";
        assert!(parse_proc_net_tcp_listening(t, 5299));
        assert!(!parse_proc_net_tcp_listening(t, 5300)); // established, not listening
        assert!(!parse_proc_net_tcp_listening(t, 80));
    }

    #[test]
    fn builtin_pair_moves_bytes() {
        let b = builtin_bandwidth(Duration::from_millis(50)).unwrap();
        assert!(b.mb_s > 0.0);
        let p = ping_pong(200, Duration::from_secs(5)).unwrap();
        assert!(p.iters > 0 && p.iters <= 200);
        assert!(p.p50_us <= p.p99_us);
    }
}
