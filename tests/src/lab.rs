//! The kernel lab: scenarios that run inside a Debian kernel booted under
//! qemu, where the Linux initiators (open-iscsi's `iscsi_tcp`, `ib_srp`,
//! `ib_iser`, dm-multipath), soft-RoCE `rdma_rxe` and the kernel's own
//! target LIO exist. The kernel of the machine running the tests has none of
//! them.
//!
//! `tests/lab/boot.sh` boots the installed kernel on this machine's own root
//! filesystem (read-only over 9p, a tmpfs overlay on top), so the `ferrited`
//! and `ferritectl` built here run in the guest unchanged, and runs one
//! scenario script from `tests/lab/guest/`. The scenario's logs come back in
//! its output folder, `target/lab/<scenario>/`: `console.log`,
//! `ferrited.log`, `dmesg.log` and whatever else it saves. One guest runs at
//! a time (a file lock), whichever test process asks.
//!
//! A scenario that cannot boot fails its test with the reason; it never
//! passes silently. `tools/install-test-deps` installs what the lab needs.

use std::fs::{self, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use crate::ferrited_path;

/// The outcome of one scenario.
#[derive(Debug)]
pub struct LabRun {
    /// The scenario's name (its script is `tests/lab/guest/<name>.sh`),
    /// with its variant after a dot (`iscsi-login.iser`).
    pub scenario: String,
    /// The guest script's exit status; 90 when the guest never finished,
    /// 2 when the lab could not start.
    pub status: i32,
    /// Where its logs are.
    pub out: PathBuf,
    /// The console: the scenario's own output.
    pub console: String,
    /// Wall time of the whole run, boot included.
    pub seconds: f64,
}

impl LabRun {
    /// The `lab: ...` lines the scenario printed: its steps and findings.
    pub fn steps(&self) -> Vec<&str> {
        self.console
            .lines()
            .filter(|l| l.starts_with("lab: "))
            .collect()
    }

    /// A file the scenario left in its output folder, empty if none.
    pub fn file(&self, name: &str) -> String {
        fs::read_to_string(self.out.join(name)).unwrap_or_default()
    }

    /// Panics with the scenario's reason and logs unless it passed.
    pub fn assert_passed(&self) {
        if self.status == 0 {
            return;
        }
        let why = self
            .console
            .lines()
            .rev()
            .find(|l| l.starts_with("lab: FAIL") || l.starts_with("lab-init:"))
            .map(str::to_string)
            .unwrap_or_else(|| match self.status {
                90 => "the guest never finished the scenario (kernel panic, hang or time limit)"
                    .to_string(),
                2 => "the lab could not start".to_string(),
                s => format!("the scenario exited with status {s}"),
            });
        let tail = |s: &str, n: usize| {
            let v: Vec<&str> = s.lines().collect();
            v[v.len().saturating_sub(n)..].join("\n")
        };
        panic!(
            "lab scenario {} failed: {why}\n--- console (tail)\n{}\n--- ferrited.log (tail)\n{}\n(all logs in {})",
            self.scenario,
            tail(&self.console, 80),
            tail(&self.file("ferrited.log"), 40),
            self.out.display()
        );
    }
}

/// How to run a scenario.
#[derive(Clone, Debug)]
pub struct LabOptions {
    /// Guest memory in MiB.
    pub mem_mb: u32,
    /// Time limit for the whole guest run, in seconds.
    pub timeout_s: u32,
    /// Extra variables exported in the guest.
    pub env: Vec<(String, String)>,
    /// For a scenario run in more than one way: a name for this way, which
    /// names its output folder and its line of the summary
    /// (`target/lab/<scenario>.<variant>/`).
    pub variant: Option<String>,
}

impl LabOptions {
    /// An iSCSI scenario over iSER: ib_iser over `rdma_rxe` instead of
    /// iscsi_tcp on loopback (the guest's `iscsi_transport`, lib.sh).
    pub fn iser() -> LabOptions {
        LabOptions {
            env: vec![("LAB_ISCSI_TRANSPORT".into(), "iser".into())],
            variant: Some("iser".into()),
            ..LabOptions::default()
        }
    }
}

impl Default for LabOptions {
    fn default() -> LabOptions {
        LabOptions {
            mem_mb: 2048,
            timeout_s: 900,
            env: Vec::new(),
            variant: None,
        }
    }
}

/// The lab's folder in the repository.
pub fn lab_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("lab")
}

/// The target directory the binaries live in (`target/<profile>`).
fn profile_dir() -> PathBuf {
    ferrited_path()
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."))
}

/// Runs scenario `name` (`tests/lab/guest/<name>.sh`) in a fresh guest with
/// `ferrited` and `ferritectl` of this build; returns once the guest is off.
pub fn run(name: &str, opts: &LabOptions) -> LabRun {
    let script = lab_dir().join("guest").join(format!("{name}.sh"));
    assert!(script.is_file(), "no lab scenario {}", script.display());
    let bins = profile_dir();
    let ferrited = ferrited_path();
    let ferritectl = bins.join("ferritectl");
    assert!(
        ferritectl.exists(),
        "{} not found: build it first (cargo build --bins, same profile)",
        ferritectl.display()
    );
    let root = bins.join("lab");
    let label = match &opts.variant {
        Some(v) => format!("{name}.{v}"),
        None => name.to_string(),
    };
    let out = root.join(&label);
    let _ = fs::remove_dir_all(&out);
    fs::create_dir_all(&out).unwrap_or_else(|e| panic!("create {}: {e}", out.display()));
    let mut env = format!(
        "export FERRITED={} FERRITECTL={}\n",
        ferrited.display(),
        ferritectl.display()
    );
    for (k, v) in &opts.env {
        env.push_str(&format!("export {k}='{v}'\n"));
    }
    fs::write(out.join("env"), env).expect("write the guest's env");

    // One guest at a time on this machine: qemu's TCG wants every core.
    let lock = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(root.join(".vm-lock"))
        .expect("open the lab lock");
    lock.lock().expect("take the lab lock");
    let start = Instant::now();
    let status = Command::new(lab_dir().join("boot.sh"))
        .arg(&script)
        .arg(&out)
        .env("LAB_MEM_MB", opts.mem_mb.to_string())
        .env("LAB_TIMEOUT_S", opts.timeout_s.to_string())
        .status()
        .unwrap_or_else(|e| panic!("cannot run tests/lab/boot.sh: {e}"));
    let seconds = start.elapsed().as_secs_f64();
    drop(lock);
    let status = status.code().unwrap_or(90);
    let console = fs::read_to_string(out.join("console.log")).unwrap_or_default();
    let run = LabRun {
        scenario: label,
        status,
        out,
        console,
        seconds,
    };
    record(&root, &run);
    run
}

/// Runs scenario `name` and fails the test unless it passes.
pub fn run_passing(name: &str, opts: &LabOptions) -> LabRun {
    let run = run(name, opts);
    run.assert_passed();
    run
}

/// Appends the outcome to `target/<profile>/lab/summary.txt`, which
/// `tools/test-all` prints at its end.
fn record(root: &Path, run: &LabRun) {
    let verdict = match run.status {
        0 => "PASS".to_string(),
        s => format!("FAIL ({s})"),
    };
    let last = run
        .steps()
        .into_iter()
        .rev()
        .find(|l| l.starts_with("lab: PASS") || l.starts_with("lab: FAIL"))
        .unwrap_or_default()
        .to_string();
    if let Ok(mut f) = OpenOptions::new()
        .create(true)
        .append(true)
        .open(root.join("summary.txt"))
    {
        let _ = writeln!(
            f,
            "{:<24} {verdict:<9} {:>6.1} s  {last}",
            run.scenario, run.seconds
        );
    }
    eprintln!(
        "lab {}: {verdict} in {:.1} s\n{}",
        run.scenario,
        run.seconds,
        run.steps().join("\n")
    );
}

/// The newest build of the test binary `name` (`srp_verbs`,
/// `iser_verbs`) beside the running one, for a scenario that runs it in
/// the guest (`cargo test` builds every test binary of the package before
/// it runs any; `tools/test-all` builds these with the lab's).
pub fn test_binary(name: &str) -> PathBuf {
    let deps = std::env::current_exe()
        .ok()
        .and_then(|e| e.parent().map(PathBuf::from))
        .unwrap_or_default();
    let prefix = format!("{name}-");
    let newest = fs::read_dir(&deps)
        .into_iter()
        .flatten()
        .filter_map(Result::ok)
        .filter(|e| {
            let n = e.file_name().to_string_lossy().into_owned();
            n.starts_with(&prefix) && !n.contains('.')
        })
        .filter_map(|e| Some((e.metadata().ok()?.modified().ok()?, e.path())))
        .max();
    match newest {
        Some((_, p)) => p,
        None => panic!(
            "no {name} test binary in {}: build it (cargo test -p ferrite-tests --test {name} --no-run)",
            deps.display()
        ),
    }
}
