//! ferrite-tests: end-to-end tests that start `ferrited` and drive it with real
//! initiators (libiscsi's tools, qemu-img) and the project's own initiator.
//!
//! This library is the harness: it finds the `ferrited` binary, starts it on a
//! free loopback port with a private state directory, waits until it listens,
//! and stops it when dropped. Tests need the external tools installed
//! (`tools/test-all` installs them); a missing tool fails the test with a
//! message naming the package.
//!
//! One of each thing the end-to-end tests share: [`Ferrited`] starts the
//! daemon, [`config`] writes its configuration, [`login`] opens sessions of
//! the project's initiator, [`rng`] makes reproducible data.
//!
//! [`lab`] runs scenarios inside a Linux guest under qemu, where the kernel's
//! own initiators and targets are; [`compare`] reads what its side-by-side
//! scenarios (ferrited beside LIO and tgtd in one guest) saved.
#![forbid(unsafe_code)]

pub mod compare;
pub mod config;
pub mod lab;
pub mod login;
pub mod rng;

pub use config::{Config, Device, Group, SrpTarget, Target};
pub use login::Login;
pub use rng::Rng;

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Path of the `ferrited` binary: `$FERRITED`, else next to the test binary's
/// profile directory (`target/<profile>/ferrited`).
pub fn ferrited_path() -> PathBuf {
    if let Some(p) = std::env::var_os("FERRITED") {
        return PathBuf::from(p);
    }
    let exe = std::env::current_exe().expect("current_exe");
    // target/<profile>/deps/<test> -> target/<profile>/ferrited
    let profile_dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("test binary lives in target/<profile>/deps");
    let p = profile_dir.join("ferrited");
    assert!(
        p.exists(),
        "{} not found: build it first (cargo build --bin ferrited, same profile) or set FERRITED",
        p.display()
    );
    p
}

/// The RDMA device and its IPv4 address a verbs test runs on, from the
/// environment variable `var` (`DEVICE,ADDRESS`, for instance
/// `rxe0,10.99.0.1` in the kernel lab); `None` when it is not set.
pub fn rdma_device(var: &str) -> Option<(String, String)> {
    let v = std::env::var(var).ok()?;
    let (dev, addr) = v.split_once(',')?;
    Some((dev.to_string(), addr.to_string()))
}

/// A free TCP port on 127.0.0.1.
pub fn free_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind ephemeral port");
    l.local_addr().expect("local_addr").port()
}

/// Fails with a clear message if a command-line tool is missing.
pub fn require_tool(tool: &str, package: &str) {
    let found = std::env::var_os("PATH")
        .map(|paths| std::env::split_paths(&paths).any(|d| d.join(tool).is_file()))
        .unwrap_or(false);
    assert!(
        found,
        "`{tool}` is not installed: install the Debian package `{package}` (tools/test-all does)"
    );
}

/// The command line every ferrited of the tests starts from: the binary
/// ([`ferrited_path`]) with `--state-dir state_dir`, without
/// `FERRITE_SOCKET` in its environment and with `RUST_LOG` from
/// `FERRITE_TEST_LOG` (default `info`). Callers add their arguments.
pub fn ferrited_command(state_dir: &Path) -> Command {
    let mut cmd = Command::new(ferrited_path());
    cmd.arg("--state-dir")
        .arg(state_dir)
        .env_remove("FERRITE_SOCKET")
        .env(
            "RUST_LOG",
            std::env::var("FERRITE_TEST_LOG").unwrap_or_else(|_| "info".into()),
        );
    cmd
}

/// A running ferrited, stopped (SIGTERM, then SIGKILL) when dropped.
pub struct Ferrited {
    child: Option<Child>,
    pub addr: SocketAddr,
    pub state_dir: PathBuf,
    log: Arc<Mutex<Vec<String>>>,
}

/// How to start ferrited.
#[derive(Clone, Debug, Default)]
pub struct Options {
    /// A JSON configuration file; None = the embedded default.
    pub config: Option<PathBuf>,
    /// Extra arguments.
    pub args: Vec<String>,
}

impl Ferrited {
    /// Starts the embedded default on a free port with `state_dir`.
    pub fn start_default(state_dir: &Path) -> Ferrited {
        Ferrited::start(state_dir, free_port(), Options::default())
    }

    /// Starts ferrited listening on 127.0.0.1:`port`; ready when the portal
    /// accepts connections and the control socket answers (the two come up
    /// one after the other).
    pub fn start(state_dir: &Path, port: u16, opts: Options) -> Ferrited {
        let addr: SocketAddr = SocketAddr::from(([127, 0, 0, 1], port));
        let mut cmd = ferrited_command(state_dir);
        cmd.arg("--listen").arg(addr.to_string());
        if let Some(c) = &opts.config {
            cmd.arg("--config").arg(c);
        }
        cmd.args(&opts.args);
        let mut f = Ferrited::spawn(cmd, state_dir, addr);
        f.wait_listening();
        f.wait_control();
        f
    }

    /// Starts ferrited from `config` alone (no `--listen`: the configuration
    /// may have no portal at all) with `extra` arguments; ready when the
    /// control socket answers. `addr` is then a placeholder.
    pub fn start_config(state_dir: &Path, config: &Path, extra: &[&str]) -> Ferrited {
        let _ = std::fs::remove_file(state_dir.join("ferrited.sock"));
        let mut cmd = ferrited_command(state_dir);
        cmd.arg("--config").arg(config).args(extra);
        let mut f = Ferrited::spawn(cmd, state_dir, SocketAddr::from(([127, 0, 0, 1], 0)));
        f.wait_control();
        f
    }

    /// Spawns `cmd` (a [`ferrited_command`] for `state_dir` and more
    /// arguments) and waits for nothing: for a test of how ferrited comes
    /// up. `state_dir` also holds the control socket (`ferrited.sock`, as
    /// ferrited chooses it with `--state-dir` alone); `addr` is the portal
    /// the test expects. Standard error is collected into the log.
    pub fn spawn(mut cmd: Command, state_dir: &Path, addr: SocketAddr) -> Ferrited {
        cmd.stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().expect("spawn ferrited");
        let log = Arc::new(Mutex::new(Vec::new()));
        if let Some(err) = child.stderr.take() {
            let log = log.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(err).lines().map_while(Result::ok) {
                    if std::env::var_os("FERRITE_TEST_ECHO").is_some() {
                        eprintln!("[ferrited] {line}");
                    }
                    if let Ok(mut l) = log.lock() {
                        l.push(line);
                    }
                }
            });
        }
        Ferrited {
            child: Some(child),
            addr,
            state_dir: state_dir.to_path_buf(),
            log,
        }
    }

    /// Waits until `ready` holds, failing the test if ferrited exits first
    /// or 60 s pass.
    fn wait_until(&mut self, what: &str, mut ready: impl FnMut(&Ferrited) -> bool) {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if ready(self) {
                return;
            }
            if let Some(c) = self.child.as_mut()
                && let Ok(Some(st)) = c.try_wait()
            {
                panic!(
                    "ferrited exited with {st} before {what}:\n{}",
                    self.log_text()
                );
            }
            assert!(
                Instant::now() < deadline,
                "ferrited did not get to {what} within 60 s:\n{}",
                self.log_text()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn wait_control(&mut self) {
        self.wait_until("answering on its control socket", |f| {
            control_request(&f.control(), r#"{"op":"config"}"#).is_ok()
        });
    }

    fn wait_listening(&mut self) {
        let addr = self.addr;
        self.wait_until(&format!("listening on {addr}"), |_| {
            TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok()
        });
    }

    /// Waits up to 20 s until the log holds `n` lines containing `needle`
    /// (ferrited's stderr is read by another thread, so a line written just
    /// now may not be here yet); returns the log either way.
    pub fn wait_log(&self, needle: &str, n: usize) -> String {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let log = self.log_text();
            if log.matches(needle).count() >= n || Instant::now() > deadline {
                return log;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Runs `ferritectl ARGS` against this ferrited (found through its
    /// state directory, as `ferritectl --state-dir` finds it; bounded to
    /// 30 s) and returns its output, whatever its status.
    pub fn ctl_output(&self, args: &[&str]) -> Output {
        run_with_timeout(
            Command::new(ferrited_path().with_file_name("ferritectl"))
                .arg("--state-dir")
                .arg(&self.state_dir)
                .env_remove("FERRITE_SOCKET")
                .args(args),
            Duration::from_secs(30),
        )
    }

    /// Runs `ferritectl ARGS` and returns what it printed; fails the test
    /// with ferritectl's output if it fails.
    pub fn ctl(&self, args: &[&str]) -> String {
        let out = self.ctl_output(args);
        assert!(
            out.status.success(),
            "ferritectl {args:?}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Everything ferrited logged so far.
    pub fn log_text(&self) -> String {
        self.log.lock().map(|l| l.join("\n")).unwrap_or_default()
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, Child::id)
    }

    /// The control socket of this instance.
    pub fn control(&self) -> PathBuf {
        self.state_dir.join("ferrited.sock")
    }

    /// iscsi:// URL of `target`/`lun` on this instance.
    pub fn url(&self, target: &str, lun: u16) -> String {
        format!("iscsi://{}/{}/{}", self.addr, target, lun)
    }

    /// True while the process runs.
    pub fn alive(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    /// Sends SIGTERM and returns at once.
    pub fn terminate(&self) {
        if let Some(c) = &self.child {
            let _ = Command::new("kill")
                .arg("-TERM")
                .arg(c.id().to_string())
                .status();
        }
    }

    /// The exit status if the process has exited (then it is reaped:
    /// [`Ferrited::alive`] is false from then on).
    pub fn try_wait(&mut self) -> Option<ExitStatus> {
        let st = self
            .child
            .as_mut()
            .and_then(|c| c.try_wait().ok().flatten())?;
        self.child = None;
        Some(st)
    }

    /// Waits up to `limit` for the process to exit; its status, or None if
    /// it still runs (or was already reaped).
    pub fn wait_exit(&mut self, limit: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(st) = self.try_wait() {
                return Some(st);
            }
            if self.child.is_none() || Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// SIGTERM, wait up to 20 s (then SIGKILL); returns whether it exited by itself.
    pub fn stop(&mut self) -> bool {
        let Some(mut c) = self.child.take() else {
            return true;
        };
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(c.id().to_string())
            .status();
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = c.try_wait() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = c.kill();
        let _ = c.wait();
        false
    }

    /// SIGKILL at once (crash simulation).
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Ferrited {
    fn drop(&mut self) {
        self.stop();
    }
}

/// One request line on a control socket; returns the answer line.
pub fn control_request(socket: &Path, line: &str) -> std::io::Result<String> {
    let mut s = std::os::unix::net::UnixStream::connect(socket)?;
    s.set_read_timeout(Some(Duration::from_secs(30)))?;
    s.write_all(line.as_bytes())?;
    s.write_all(b"\n")?;
    s.shutdown(std::net::Shutdown::Write)?;
    let mut answer = String::new();
    BufReader::new(s).read_line(&mut answer)?;
    Ok(answer)
}

/// Runs a command with a time limit; returns its output.
pub fn run_with_timeout(cmd: &mut Command, limit: Duration) -> Output {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().unwrap_or_else(|e| panic!("spawn {cmd:?}: {e}"));
    let out_h = child.stdout.take().map(|mut s| {
        std::thread::spawn(move || {
            let mut v = Vec::new();
            let _ = std::io::Read::read_to_end(&mut s, &mut v);
            v
        })
    });
    let err_h = child.stderr.take().map(|mut s| {
        std::thread::spawn(move || {
            let mut v = Vec::new();
            let _ = std::io::Read::read_to_end(&mut s, &mut v);
            v
        })
    });
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Ok(Some(st)) = child.try_wait() {
            break st;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let st = child.wait().expect("wait");
            eprintln!("{cmd:?} killed after {limit:?}");
            break st;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    Output {
        status,
        stdout: out_h.and_then(|h| h.join().ok()).unwrap_or_default(),
        stderr: err_h.and_then(|h| h.join().ok()).unwrap_or_default(),
    }
}

/// The initiator names libiscsi's suites log in with (`-i` and `-I`).
pub const CU_INITIATORS: [&str; 2] = [
    "iqn.2007-10.com.github:sahlberg:libiscsi:iscsi-test",
    "iqn.2007-10.com.github:sahlberg:libiscsi:iscsi-test-2",
];

/// What running libiscsi suites one at a time found.
#[derive(Debug, Default)]
pub struct SuiteRun {
    pub passed: usize,
    pub skipped: Vec<String>,
    /// `SUITE: TEST` for every failure, and suites where no test ran.
    pub failures: Vec<String>,
}

/// Runs each of `suites` in its own `iscsi-test-cu -d` process against
/// `url` (each bounded in time), checks `f` survives each, and collects the
/// verdicts. `label` prefixes the progress lines.
pub fn run_cu_suites(f: &mut Ferrited, url: &str, suites: &[&str], label: &str) -> SuiteRun {
    require_tool("iscsi-test-cu", "libiscsi-bin");
    let mut run = SuiteRun::default();
    for suite in suites {
        let out = run_with_timeout(
            Command::new("iscsi-test-cu")
                .arg("-d")
                .arg("-i")
                .arg(CU_INITIATORS[0])
                .arg("-I")
                .arg(CU_INITIATORS[1])
                .arg("-t")
                .arg(suite)
                .arg(url),
            Duration::from_secs(300),
        );
        let text = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
        let r = parse_cu(&text);
        eprintln!(
            "{label}{suite}: {} passed, {} skipped, {} failed",
            r.passed.len(),
            r.skipped.len(),
            r.failed.len()
        );
        for s in &r.skipped {
            eprintln!("  skipped: {s}");
        }
        run.passed += r.passed.len();
        if r.passed.is_empty() && r.skipped.is_empty() && r.failed.is_empty() {
            run.failures.push(format!("{suite}: no test ran\n{text}"));
        }
        if !r.failed.is_empty() && std::env::var_os("FERRITE_TEST_ECHO").is_some() {
            eprintln!("{text}");
        }
        run.failures
            .extend(r.failed.iter().map(|t| format!("{suite}: {t}")));
        run.skipped.extend(r.skipped);
        assert!(f.alive(), "ferrited died during {suite}:\n{}", f.log_text());
    }
    run
}

/// Verdicts of one `iscsi-test-cu` run.
#[derive(Debug, Default)]
pub struct CuResult {
    pub passed: Vec<String>,
    pub failed: Vec<String>,
    /// Passed in CUnit's eyes but printed `[SKIPPED]`.
    pub skipped: Vec<String>,
    pub output: String,
}

/// Parses `iscsi-test-cu` output (CUnit basic mode): each test prints
/// `  Test: NAME ...` then `passed` or `FAILED`; libiscsi prints `[SKIPPED]`
/// inside a test it skips, which CUnit counts as passed.
pub fn parse_cu(output: &str) -> CuResult {
    let mut r = CuResult {
        output: output.to_string(),
        ..CuResult::default()
    };
    let mut suite = String::new();
    let mut cur: Option<(String, String)> = None; // (name, body)
    let finish = |cur: &mut Option<(String, String)>, r: &mut CuResult| {
        if let Some((name, body)) = cur.take() {
            // The verdict is CUnit's first `passed`/`FAILED` at the start of a
            // line or right after the test's `...`; whatever follows it on that
            // line belongs to the next test's or suite's set-up.
            let verdict = body.lines().enumerate().find_map(|(i, l)| {
                let l = if i == 0 { l } else { l.trim_start() };
                if l.starts_with("passed") {
                    Some((i, true))
                } else if l.starts_with("FAILED") {
                    Some((i, false))
                } else {
                    None
                }
            });
            match verdict {
                Some((i, true)) => {
                    let before: Vec<&str> = body.lines().take(i).collect();
                    if before.iter().any(|l| l.contains("[SKIPPED]")) {
                        r.skipped.push(name);
                    } else {
                        r.passed.push(name);
                    }
                }
                Some((_, false)) => r.failed.push(name),
                None => r.failed.push(format!("{name} (no verdict)")),
            }
        }
    };
    for line in output.lines() {
        if let Some(s) = line.strip_prefix("Suite: ") {
            finish(&mut cur, &mut r);
            suite = s.trim().to_string();
        } else if let Some(t) = line.strip_prefix("  Test: ") {
            finish(&mut cur, &mut r);
            let (name, rest) = t.split_once(" ...").unwrap_or((t, ""));
            // `rest` is what followed `...` on the test's line: a verdict, or
            // the start of the test's own output.
            let rest = rest.trim_start();
            let first = if rest.starts_with("passed") || rest.starts_with("FAILED") {
                rest.to_string()
            } else {
                format!("\n{rest}")
            };
            cur = Some((format!("{suite}.{name}"), first));
        } else if line.starts_with("Run Summary:") {
            finish(&mut cur, &mut r);
        } else if let Some((_, body)) = cur.as_mut() {
            body.push('\n');
            body.push_str(line);
        }
    }
    finish(&mut cur, &mut r);
    r
}

/// A process's resident set (VmRSS of /proc/PID/status) in KiB.
pub fn vm_rss_kib(pid: u32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = s.lines().find(|l| l.starts_with("VmRSS:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// Samples a process's VmRSS every 50 ms until finished; keeps the peak.
pub struct RssWatch {
    peak: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    h: Option<std::thread::JoinHandle<()>>,
}

impl RssWatch {
    pub fn start(pid: u32) -> RssWatch {
        let peak = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (p, s) = (peak.clone(), stop.clone());
        let h = std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                if let Some(kib) = vm_rss_kib(pid) {
                    p.fetch_max(kib, Ordering::Relaxed);
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        });
        RssWatch {
            peak,
            stop,
            h: Some(h),
        }
    }

    /// The highest VmRSS seen so far, in KiB.
    pub fn peak(&self) -> u64 {
        self.peak.load(Ordering::Relaxed)
    }

    /// Stops sampling; the peak.
    pub fn finish(mut self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.h.take() {
            let _ = h.join();
        }
        self.peak()
    }
}

/// One sample of Prometheus metric `name` (a family without labels) from
/// ferrited's `--metrics` listener at `addr`.
pub fn metric(addr: SocketAddr, name: &str) -> Option<u64> {
    let mut s = TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    s.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").ok()?;
    let mut body = String::new();
    std::io::Read::read_to_string(&mut s, &mut body).ok()?;
    body.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

/// What the data budget and a process's RSS came back to once a load
/// went away ([`wait_for_release`]).
#[derive(Debug, Clone, Copy)]
pub struct Release {
    /// `ferrite_data_memory_used_bytes` (u64::MAX if never read).
    pub used: u64,
    /// `ferrite_data_memory_waiting_commands` (u64::MAX if never read).
    pub waiting: u64,
    /// VmRSS in KiB.
    pub end_rss: u64,
}

/// Waits (a minute at most) until ferrited's metrics at `metrics` show no
/// data memory used and no command waiting, then until the RSS of `pid`
/// is back within 64 MiB of `start_rss` KiB; returns what it saw last.
pub fn wait_for_release(metrics: SocketAddr, pid: u32, start_rss: u64) -> Release {
    let deadline = Instant::now() + Duration::from_secs(60);
    let (mut used, mut waiting) = (u64::MAX, u64::MAX);
    while Instant::now() < deadline {
        used = metric(metrics, "ferrite_data_memory_used_bytes").unwrap_or(u64::MAX);
        waiting = metric(metrics, "ferrite_data_memory_waiting_commands").unwrap_or(u64::MAX);
        if used == 0 && waiting == 0 {
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let mut end_rss = vm_rss_kib(pid).unwrap_or(0);
    while Instant::now() < deadline && end_rss > start_rss + 64 * 1024 {
        std::thread::sleep(Duration::from_millis(500));
        end_rss = vm_rss_kib(pid).unwrap_or(0);
    }
    Release {
        used,
        waiting,
        end_rss,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_cunit_output() {
        let out = "Suite: Read10\n  Test: Simple ...passed    [SKIPPED] PERSISTENT RESERVE IN is not implemented.\n  Test: Beyond ...    [SKIPPED] no\npassed\n  Test: Bad ...    First block wrong\nFAILED\n    1. x.c:1  - CU_ASSERT\n  Test: Info ...    [FAILED] WRITE10 failed as expected\npassed\n\nRun Summary:    Type  Total\n";
        let r = parse_cu(out);
        assert_eq!(r.passed, vec!["Read10.Simple", "Read10.Info"]);
        assert_eq!(r.skipped, vec!["Read10.Beyond"]);
        assert_eq!(r.failed, vec!["Read10.Bad"]);
    }
}
