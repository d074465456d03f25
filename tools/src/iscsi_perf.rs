//! Driving libiscsi's `iscsi-perf` (reads only: READ(16) at a fixed queue
//! depth, sequential or random) and parsing what it prints.
//!
//! With `-l` it prints one line per second,
//! `HH:MM:SS - lba N, iops current N (N MB/s), iops average N (N MB/s), in_flight N, busy N`,
//! and at the end `iops average N (N MB/s)` after a carriage return. Its
//! own MB/s counters are not used: throughput is IOPS times transfer size.

use std::io::Read;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use crate::procfs;

/// What one `iscsi-perf` run printed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PerfOutput {
    /// "iops current" of every per-second line, in order.
    pub per_second: Vec<u64>,
    /// The closing "iops average" (whole run).
    pub final_average: Option<u64>,
    /// It printed "finished." (a clean end, not ABORTED).
    pub finished: bool,
}

/// One per-second line's "iops current" value.
pub fn parse_sample_line(line: &str) -> Option<u64> {
    let i = line.find("iops current ")?;
    let rest = &line[i + "iops current ".len()..];
    rest.split_whitespace().next()?.parse().ok()
}

/// The closing line: "iops average N (...)" with no "iops current" before it.
pub fn parse_final_line(line: &str) -> Option<u64> {
    let l = line.trim_start();
    let rest = l.strip_prefix("iops average ")?;
    rest.split_whitespace().next()?.parse().ok()
}

/// Parses a whole output (lines split on `\r` and `\n`).
pub fn parse_output(text: &str) -> PerfOutput {
    let mut out = PerfOutput::default();
    for line in text.split(['\r', '\n']) {
        feed_line(&mut out, line);
    }
    out
}

fn feed_line(out: &mut PerfOutput, line: &str) {
    if let Some(v) = parse_sample_line(line) {
        out.per_second.push(v);
    } else if let Some(v) = parse_final_line(line) {
        out.final_average = Some(v);
    } else if line.trim() == "finished." {
        out.finished = true;
    }
}

/// One run's request.
#[derive(Clone, Debug)]
pub struct PerfRun<'a> {
    pub url: &'a str,
    pub blocks: u32,
    pub qd: u32,
    pub random: bool,
    pub seconds: u32,
    /// The target process whose CPU time and RSS are sampled.
    pub target_pid: u32,
}

/// What a run measured.
#[derive(Clone, Debug, Default)]
pub struct PerfResult {
    pub iops: f64,
    /// Target CPU seconds over the measured window, and I/Os in it.
    pub target_cpu_s: f64,
    pub ios: f64,
    /// Target RSS (KiB) sampled at every per-second line.
    pub rss_kib: Vec<u64>,
    pub output: PerfOutput,
    /// Everything iscsi-perf printed (for the raw log).
    pub raw: String,
}

/// Errors of an iscsi-perf run.
#[derive(Debug, thiserror::Error)]
pub enum PerfError {
    #[error("cannot start iscsi-perf: {0} (install libiscsi-bin)")]
    Spawn(#[source] std::io::Error),
    #[error("iscsi-perf gave no result (exit {status}); output: {tail}")]
    NoResult { status: String, tail: String },
    #[error("interrupted")]
    Interrupted,
}

/// Runs iscsi-perf once. The run is bounded: iscsi-perf stops itself after
/// `seconds`; if it has not exited `seconds + 20` s after start it is killed
/// by PID. The steady window starts at the first per-second line (after
/// login and the first second), so login cost is not counted; runs too
/// short for two per-second lines fall back to the closing average and the
/// whole process lifetime.
pub fn run(r: &PerfRun<'_>, stop: &AtomicBool) -> Result<PerfResult, PerfError> {
    let mut cmd = Command::new("iscsi-perf");
    cmd.args(["-l", "-t", &r.seconds.to_string(), "-m", &r.qd.to_string()])
        .args(["-b", &r.blocks.to_string()]);
    if r.random {
        cmd.arg("-r");
    }
    cmd.arg(r.url)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
    let cpu0 = procfs::cpu_ticks(r.target_pid);
    let t0 = Instant::now();
    let mut child = cmd.spawn().map_err(PerfError::Spawn)?;
    let (tx, rx) = mpsc::channel::<Vec<u8>>();
    let mut pipes = Vec::new();
    if let Some(o) = child.stdout.take() {
        pipes.push(spawn_reader(o, tx.clone()));
    }
    if let Some(e) = child.stderr.take() {
        pipes.push(spawn_reader(e, tx.clone()));
    }
    drop(tx);
    let deadline = t0 + Duration::from_secs(r.seconds as u64 + 20);
    let mut out = PerfOutput::default();
    let mut raw = String::new();
    let mut pending = String::new();
    // (time, target cpu ticks) at every per-second line
    let mut marks: Vec<(Instant, Option<u64>)> = Vec::new();
    let mut rss = Vec::new();
    let mut interrupted = false;
    loop {
        if stop.load(Ordering::Relaxed) || Instant::now() > deadline {
            interrupted = stop.load(Ordering::Relaxed);
            let _ = child.kill();
            break;
        }
        match rx.recv_timeout(Duration::from_millis(200)) {
            Ok(chunk) => {
                let s = String::from_utf8_lossy(&chunk);
                raw.push_str(&s);
                pending.push_str(&s);
                while let Some(i) = pending.find(['\r', '\n']) {
                    let line: String = pending.drain(..=i).collect();
                    let before = out.per_second.len();
                    feed_line(&mut out, &line);
                    if out.per_second.len() > before {
                        marks.push((Instant::now(), procfs::cpu_ticks(r.target_pid)));
                        if let Some(k) = procfs::rss_kib(r.target_pid) {
                            rss.push(k);
                        }
                    }
                }
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
        }
    }
    feed_line(&mut out, &pending);
    let status = child.wait();
    let t_end = Instant::now();
    let cpu_end = procfs::cpu_ticks(r.target_pid);
    for p in pipes {
        let _ = p.join();
    }
    if interrupted {
        return Err(PerfError::Interrupted);
    }
    let tck = procfs::clk_tck() as f64;
    let mut res = PerfResult {
        rss_kib: rss,
        ..PerfResult::default()
    };
    if out.per_second.len() >= 3 {
        // Window: from the first per-second line to the last one; the
        // lines after the first each cover about one second of it.
        let iops: Vec<u64> = out.per_second[1..].to_vec();
        let mean = iops.iter().sum::<u64>() as f64 / iops.len() as f64;
        let (ta, ca) = marks[0];
        let (tb, cb) = marks[marks.len() - 1];
        let wall = tb.duration_since(ta).as_secs_f64();
        res.iops = mean;
        res.ios = mean * wall;
        res.target_cpu_s = match (ca, cb) {
            (Some(a), Some(b)) => b.saturating_sub(a) as f64 / tck,
            _ => f64::NAN,
        };
    } else if let Some(avg) = out.final_average.filter(|&a| a > 0) {
        res.iops = avg as f64;
        res.ios = avg as f64 * r.seconds as f64;
        res.target_cpu_s = match (cpu0, cpu_end) {
            (Some(a), Some(b)) => b.saturating_sub(a) as f64 / tck,
            _ => f64::NAN,
        };
        let _ = t_end;
    } else {
        let tail: String = raw
            .chars()
            .rev()
            .take(400)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect();
        return Err(PerfError::NoResult {
            status: status
                .map(|s| s.to_string())
                .unwrap_or_else(|e| e.to_string()),
            tail: tail.replace(['\r', '\n'], " | "),
        });
    }
    res.output = out;
    res.raw = raw;
    Ok(res)
}

fn spawn_reader<R: Read + Send + 'static>(
    mut r: R,
    tx: mpsc::Sender<Vec<u8>>,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        loop {
            match r.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if tx.send(buf[..n].to_vec()).is_err() {
                        break;
                    }
                }
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    // As iscsi-perf 1.19 prints it with -l -t 3 (trailing blanks kept).
    const OUT: &str = "iscsi-perf version 0.1 - (c) 2014-2015 by Peter Lieven <pl@\u{138}amp.de>\n\n\
connected to iscsi://127.0.0.1:3261/iqn.x:tgtd-null/1\n\
capacity is 2097152 blocks or 1073741824 byte (1024 MB)\n\
performing RANDOM READ with 32 parallel requests\n\
FIXED transfer size of 8 blocks (4096 byte)\n\
will run for 3 seconds.\n\n\
\r00:00:02 - lba 1234, iops current 51234 (200 MB/s), iops average 51234 (200 MB/s), in_flight 32, busy 0        \n\
\r00:00:01 - lba 99, iops current 52000 (203 MB/s), iops average 51617 (201 MB/s), in_flight 32, busy 0        \n\
\riops average 51500 (201 MB/s)                                                        \n\n\nfinished.\n";

    #[test]
    fn parses_per_second_and_final_lines() {
        let o = parse_output(OUT);
        assert_eq!(o.per_second, vec![51234, 52000]);
        assert_eq!(o.final_average, Some(51500));
        assert!(o.finished);
    }

    #[test]
    fn aborted_run_has_no_finish() {
        let o = parse_output(
            "connected to x\n\r00:00:04 - lba 1, iops current 7 (0 MB/s), iops average 7 (0 MB/s), in_flight 1, busy 0\n\nABORTED!\n",
        );
        assert_eq!(o.per_second, vec![7]);
        assert_eq!(o.final_average, None);
        assert!(!o.finished);
    }

    #[test]
    fn single_lines() {
        assert_eq!(
            parse_sample_line("00:00:01 - lba 5, iops current 0 (0 MB/s), iops average"),
            Some(0)
        );
        assert_eq!(parse_sample_line("iops current x"), None);
        assert_eq!(parse_final_line("   iops average 12 (0 MB/s)"), Some(12));
        // a per-second line is not a final line
        assert_eq!(
            parse_final_line("00:00:01 - lba 5, iops current 3 (0 MB/s), iops average 3 (0 MB/s)"),
            None
        );
        assert_eq!(parse_final_line("Login Failed."), None);
    }

    #[test]
    fn login_failure_output_parses_to_nothing() {
        let o = parse_output("Login Failed. iscsi_service failed with : Connection refused\n");
        assert_eq!(o, PerfOutput::default());
    }
}
