//! Reading what the lab's side-by-side scenarios (`compare-*.sh`) saved:
//! libiscsi's verdicts per target, fio's terse results per job and target,
//! and the markdown tables that put them next to each other.
//!
//! The scenarios run every target in one guest on one kernel; the figures
//! that mean something are the ratios between targets, not the absolute
//! numbers (qemu runs TCG). Nothing here runs a guest: [`crate::lab::run`]
//! does, and this reads its output folder.
//!
//! Layout of an output folder (see `tests/lab/guest/compare-iscsi.sh`):
//! `cu/<target>/<suite>.log` (iscsi-test-cu's output), `cu/<target>/runs.tsv`
//! (`suite rc seconds`), `cu/<target>/crashed.tsv` (`suite-or-test rc` of
//! each iscsi-test-cu run that died of a signal), `cu/<target>/retries.tsv`
//! (runs made again after libiscsi's iSER code crashed or failed its login), `cu/<target>/seconds`, `fio/<target>-<job>-<rep>.terse`
//! (fio `--output-format=terse --terse-version=3`), `kernel.txt`,
//! `versions.txt`.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::fs;
use std::path::Path;

use crate::parse_cu;

/// The fio jobs of `compare-iscsi.sh`, in the order it runs them.
pub const FIO_JOBS: [&str; 6] = [
    "rand4k-read-qd1",
    "rand4k-read-qd32",
    "rand4k-write-qd1",
    "rand4k-write-qd32",
    "seq1m-read-qd8",
    "seq1m-write-qd8",
];

/// One libiscsi suite's outcome on one target.
#[derive(Debug, Default, Clone)]
pub struct SuiteOutcome {
    /// `ALL.Read10`, ...
    pub suite: String,
    pub passed: usize,
    pub skipped: usize,
    pub failed: usize,
    /// iscsi-test-cu's exit status (124: killed by `timeout`).
    pub rc: i32,
    pub seconds: u64,
}

/// libiscsi's run against one target.
#[derive(Debug, Default, Clone)]
pub struct CuTarget {
    pub label: String,
    pub suites: Vec<SuiteOutcome>,
    pub passed: Vec<String>,
    pub skipped: Vec<String>,
    /// Failed tests (`Suite.Test`), tests without a verdict, suites killed
    /// by their time limit and suites in which no test ran.
    pub failed: Vec<String>,
    /// Wall time of the whole run on this target, as the guest measured it.
    pub seconds: u64,
    /// Set when the target process died (the suite it died in).
    pub died: Option<String>,
    /// iscsi-test-cu runs that died of a signal (`ALL.Read10.Async: signal
    /// 11`): a crashed suite was run again test by test, so these are the
    /// crashed suites followed by the single tests that crashed again. Not
    /// verdicts on the target.
    pub crashed: Vec<String>,
    /// Runs made again because libiscsi's iSER code crashed or failed its
    /// login in its own event loop (`retries.tsv`).
    pub retries: usize,
}

impl CuTarget {
    /// Whether anything was run at all.
    pub fn ran(&self) -> bool {
        !(self.passed.is_empty() && self.skipped.is_empty() && self.failed.is_empty())
    }
    pub fn total(&self) -> usize {
        self.passed.len() + self.skipped.len() + self.failed.len()
    }
}

/// Reads `dir` = `<out>/cu/<label>`; an absent folder reads as an empty run.
pub fn read_cu(dir: &Path, label: &str) -> CuTarget {
    let mut t = CuTarget {
        label: label.to_string(),
        ..CuTarget::default()
    };
    let runs = fs::read_to_string(dir.join("runs.tsv")).unwrap_or_default();
    for line in runs.lines() {
        let f: Vec<&str> = line.split('\t').collect();
        if f.len() < 3 {
            continue;
        }
        let suite = f[0].to_string();
        let rc = f[1].parse().unwrap_or(-1);
        let seconds = f[2].parse().unwrap_or(0);
        let text = fs::read_to_string(dir.join(format!("{suite}.log"))).unwrap_or_default();
        let r = parse_cu(&text);
        if rc == 124 || rc == 137 {
            t.failed.push(format!(
                "{suite}: killed by its time limit after {seconds} s"
            ));
        } else if r.passed.is_empty() && r.skipped.is_empty() && r.failed.is_empty() {
            t.failed.push(format!("{suite}: no test ran (rc {rc})"));
        }
        t.suites.push(SuiteOutcome {
            suite,
            passed: r.passed.len(),
            skipped: r.skipped.len(),
            failed: r.failed.len(),
            rc,
            seconds,
        });
        t.passed.extend(r.passed);
        t.skipped.extend(r.skipped);
        t.failed.extend(r.failed);
    }
    t.seconds = fs::read_to_string(dir.join("seconds"))
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0);
    t.died = fs::read_to_string(dir.join("died"))
        .ok()
        .map(|s| s.trim().to_string());
    t.retries = fs::read_to_string(dir.join("retries.tsv"))
        .unwrap_or_default()
        .lines()
        .count();
    let crashed = fs::read_to_string(dir.join("crashed.tsv")).unwrap_or_default();
    for line in crashed.lines() {
        if let Some((what, rc)) = line.split_once('\t') {
            let rc: i32 = rc.trim().parse().unwrap_or(0);
            t.crashed.push(format!("{what}: signal {}", rc - 128));
        }
    }
    t
}

impl CuTarget {
    /// Whether `suite` (`ALL.Read10`) ran, whole or test by test after a
    /// crash.
    pub fn ran_suite(&self, suite: &str) -> bool {
        let tests = format!("{suite}.");
        self.suites
            .iter()
            .any(|o| o.suite == suite || o.suite.starts_with(&tests))
    }

    /// Whether `suite` ran ([`CuTarget::ran_suite`]) or libiscsi was run on
    /// it and died of a signal every time, test by test too: attempted
    /// against the target, with no verdict on it.
    pub fn attempted_suite(&self, suite: &str) -> bool {
        let (whole, tests) = (format!("{suite}:"), format!("{suite}."));
        self.ran_suite(suite)
            || self
                .crashed
                .iter()
                .any(|c| c.starts_with(&whole) || c.starts_with(&tests))
    }

    /// The single tests (`Suite.Test`) whose iscsi-test-cu died of a signal
    /// when run alone.
    pub fn crashed_tests(&self) -> Vec<&str> {
        self.crashed
            .iter()
            .filter_map(|c| c.split_once(':').map(|(w, _)| w))
            .filter(|w| w.matches('.').count() >= 2)
            .collect()
    }
}

/// One direction of a fio job (terse v3).
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub struct FioDir {
    /// KiB moved.
    pub kib: f64,
    /// KiB/s.
    pub bw_kib_s: f64,
    pub iops: f64,
    /// Mean completion latency, µs.
    pub clat_mean_us: f64,
    /// Mean total latency (submission and completion), µs.
    pub lat_mean_us: f64,
}

/// One fio job's terse v3 line.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct FioTerse {
    pub job: String,
    /// fio's error code (0: none).
    pub error: i32,
    pub read: FioDir,
    pub write: FioDir,
}

/// Parses the first terse v3 line of `text` (fields separated by `;`,
/// the first being `3`): field 5 is the error, 6-8 read KiB, KiB/s and
/// IOPS, 16 the read completion latency's mean and 40 the total latency's
/// (µs); the write side starts 41 fields later (47-49, 57, 81).
pub fn parse_terse(text: &str) -> Option<FioTerse> {
    let line = text.lines().find(|l| l.starts_with("3;"))?;
    let f: Vec<&str> = line.split(';').collect();
    if f.len() < 90 {
        return None;
    }
    let num = |i: usize| f[i - 1].trim().parse::<f64>().ok();
    let dir = |base: usize| -> Option<FioDir> {
        Some(FioDir {
            kib: num(base)?,
            bw_kib_s: num(base + 1)?,
            iops: num(base + 2)?,
            clat_mean_us: num(base + 10)?,
            lat_mean_us: num(base + 34)?,
        })
    };
    Some(FioTerse {
        job: f[2].to_string(),
        error: f[4].trim().parse().ok()?,
        read: dir(6)?,
        write: dir(47)?,
    })
}

/// A fio job's results on one target, over the scenario's rounds.
#[derive(Debug, Default, Clone)]
pub struct FioRuns {
    /// `(round, result)` of each round that produced one, in round order.
    pub rounds: Vec<(u32, FioTerse)>,
    /// Rounds whose file had no terse line, or an error: `round: reason`.
    pub errors: Vec<String>,
}

impl FioRuns {
    /// The direction a job measures: reads for `*-read-*`, else writes.
    pub fn side(job: &str, t: &FioTerse) -> FioDir {
        if job.contains("read") {
            t.read
        } else {
            t.write
        }
    }
    /// Median IOPS of the measured direction over the rounds.
    pub fn iops(&self, job: &str) -> f64 {
        median(self.rounds.iter().map(|(_, t)| Self::side(job, t).iops))
    }
    /// Median bandwidth, MiB/s.
    pub fn mib_s(&self, job: &str) -> f64 {
        median(
            self.rounds
                .iter()
                .map(|(_, t)| Self::side(job, t).bw_kib_s / 1024.0),
        )
    }
    /// Median of the mean completion latencies, µs.
    pub fn clat_us(&self, job: &str) -> f64 {
        median(
            self.rounds
                .iter()
                .map(|(_, t)| Self::side(job, t).clat_mean_us),
        )
    }
    /// Median of the mean total latencies, µs.
    pub fn lat_us(&self, job: &str) -> f64 {
        median(
            self.rounds
                .iter()
                .map(|(_, t)| Self::side(job, t).lat_mean_us),
        )
    }
    /// IOPS of round `r`, if it produced a result.
    fn round_iops(&self, job: &str, r: u32) -> Option<f64> {
        self.rounds
            .iter()
            .find(|(n, _)| *n == r)
            .map(|(_, t)| Self::side(job, t).iops)
    }
}

/// The ratios `a / b` of the rounds both ran: the two runs of one round
/// were made one right after the other, so they share the guest's
/// conditions of the moment.
pub fn paired_ratios(a: &FioRuns, b: &FioRuns, job: &str) -> Vec<f64> {
    a.rounds
        .iter()
        .filter_map(|(r, _)| {
            let (x, y) = (a.round_iops(job, *r)?, b.round_iops(job, *r)?);
            (y > 0.0).then(|| x / y)
        })
        .collect()
}

/// The median; 0 for no values.
pub fn median(v: impl Iterator<Item = f64>) -> f64 {
    let mut v: Vec<f64> = v.collect();
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// Reads `<out>/fio`: `job -> target -> runs`. A file named
/// `<target>-<job>-<round>.terse`; targets are the ones given (their names
/// hold no `-`).
pub fn read_fio(dir: &Path, targets: &[&str]) -> BTreeMap<String, BTreeMap<String, FioRuns>> {
    let mut files: Vec<(String, String, u32, String)> = Vec::new();
    for e in fs::read_dir(dir).into_iter().flatten().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(stem) = name.strip_suffix(".terse") else {
            continue;
        };
        // `<target>-<job>-<round>`, target names may hold dashes
        // (ferrited-iser): the longest one that fits.
        let Some((target, rest)) = targets
            .iter()
            .filter_map(|t| Some((*t, stem.strip_prefix(t)?.strip_prefix('-')?)))
            .max_by_key(|(t, _)| t.len())
        else {
            continue;
        };
        let Some((job, round)) = rest.rsplit_once('-') else {
            continue;
        };
        let Ok(round) = round.parse() else { continue };
        let text = fs::read_to_string(e.path()).unwrap_or_default();
        files.push((job.to_string(), target.to_string(), round, text));
    }
    files.sort_by(|a, b| (&a.0, &a.1, a.2).cmp(&(&b.0, &b.1, b.2)));
    let mut out: BTreeMap<String, BTreeMap<String, FioRuns>> = BTreeMap::new();
    for (job, target, round, text) in files {
        let runs = out.entry(job).or_default().entry(target).or_default();
        match parse_terse(&text) {
            Some(t) if t.error == 0 => runs.rounds.push((round, t)),
            Some(t) => runs
                .errors
                .push(format!("round {round}: fio error {}", t.error)),
            None => {
                let first = text.lines().next().unwrap_or("(empty)");
                runs.errors
                    .push(format!("round {round}: no terse result ({first})"));
            }
        }
    }
    out
}

/// The libiscsi table: one row per target, with its failing tests.
pub fn cu_table(targets: &[CuTarget]) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "| target | tests | passed | failed | skipped | wall |\n|---|---:|---:|---:|---:|---:|"
    );
    for t in targets {
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} | {} s |",
            t.label,
            t.total(),
            t.passed.len(),
            t.failed.len(),
            t.skipped.len(),
            t.seconds
        );
    }
    for t in targets {
        if let Some(d) = &t.died {
            let _ = writeln!(s, "\n{}: the target process {d}.", t.label);
        }
        if t.retries > 0 {
            let _ = writeln!(
                s,
                "\n{}: {} runs made again after libiscsi's iSER code crashed or failed its login.",
                t.label, t.retries
            );
        }
        if !t.crashed.is_empty() {
            let _ = writeln!(s, "\n{}: iscsi-test-cu died of a signal in:", t.label);
            for c in &t.crashed {
                let _ = writeln!(s, "- {c}");
            }
        }
        if t.failed.is_empty() {
            let _ = writeln!(s, "\n{}: no failures.", t.label);
        } else {
            let _ = writeln!(s, "\n{} failed:", t.label);
            for f in &t.failed {
                let _ = writeln!(s, "- {f}");
            }
        }
    }
    s
}

/// The per-suite table: `passed / failed / skipped` for each target.
pub fn cu_suite_table(targets: &[CuTarget]) -> String {
    let mut order: Vec<String> = Vec::new();
    for t in targets {
        for o in &t.suites {
            if !order.contains(&o.suite) {
                order.push(o.suite.clone());
            }
        }
    }
    let mut s = String::from("| suite |");
    for t in targets {
        let _ = write!(s, " {} |", t.label);
    }
    s.push_str("\n|---|");
    for _ in targets {
        s.push_str("---|");
    }
    s.push('\n');
    for suite in &order {
        let _ = write!(s, "| {} |", suite.trim_start_matches("ALL."));
        for t in targets {
            match t.suites.iter().find(|o| &o.suite == suite) {
                Some(o) => {
                    let _ = write!(s, " {} / {} / {} |", o.passed, o.failed, o.skipped);
                }
                None => s.push_str(" - |"),
            }
        }
        s.push('\n');
    }
    s
}

/// The fio table: median IOPS and MiB/s per job on `a` and `b`, and the
/// median and range of the ratios `a / b` of the rounds (each round runs a
/// job on one target right after the other), over the jobs both ran, in
/// `jobs` order.
pub fn fio_table(
    fio: &BTreeMap<String, BTreeMap<String, FioRuns>>,
    jobs: &[&str],
    a: &str,
    b: &str,
) -> String {
    let mut s = format!(
        "| job | {a} IOPS | {a} MiB/s | {b} IOPS | {b} MiB/s | {a} / {b} | range over rounds |\n|---|---:|---:|---:|---:|---:|---|\n"
    );
    for job in jobs {
        let Some(per) = fio.get(*job) else { continue };
        let (Some(ra), Some(rb)) = (per.get(a), per.get(b)) else {
            continue;
        };
        let ratios = paired_ratios(ra, rb, job);
        let (ratio, range) = if ratios.is_empty() {
            ("-".to_string(), "-".to_string())
        } else {
            let lo = ratios.iter().copied().fold(f64::INFINITY, f64::min);
            let hi = ratios.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            (
                format!("{:.2}", median(ratios.iter().copied())),
                format!("{lo:.2}-{hi:.2} ({})", ratios.len()),
            )
        };
        let _ = writeln!(
            s,
            "| {job} | {:.0} | {:.1} | {:.0} | {:.1} | {ratio} | {range} |",
            ra.iops(job),
            ra.mib_s(job),
            rb.iops(job),
            rb.mib_s(job)
        );
    }
    s
}

/// The latency model's jobs (`lat-<read|write>-<bytes>`) found in `fio`:
/// `(direction, bytes, job)`, in size order.
pub fn latency_jobs(
    fio: &BTreeMap<String, BTreeMap<String, FioRuns>>,
) -> Vec<(String, u64, String)> {
    let mut v: Vec<(String, u64, String)> = fio
        .keys()
        .filter_map(|job| {
            let rest = job.strip_prefix("lat-")?;
            let (dir, bytes) = rest.split_once('-')?;
            Some((dir.to_string(), bytes.parse().ok()?, job.clone()))
        })
        .collect();
    v.sort();
    v
}

/// The latency model: per size, the median mean latency of QD 1 reads and
/// writes on `a` and `b` and their ratio; then per target and direction the
/// least-squares fit `time = setup + bytes / bandwidth` through every
/// round's point.
pub fn latency_table(
    fio: &BTreeMap<String, BTreeMap<String, FioRuns>>,
    a: &str,
    b: &str,
) -> String {
    let jobs = latency_jobs(fio);
    let mut s = format!(
        "| size | {a} read µs | {b} read µs | {a} / {b} | {a} write µs | {b} write µs | {a} / {b} |\n|---:|---:|---:|---:|---:|---:|---:|\n"
    );
    let mut sizes: Vec<u64> = jobs.iter().map(|j| j.1).collect();
    sizes.sort_unstable();
    sizes.dedup();
    let lat = |t: &str, dir: &str, bytes: u64| -> Option<f64> {
        let job = format!("lat-{dir}-{bytes}");
        let r = fio.get(&job)?.get(t)?;
        (!r.rounds.is_empty()).then(|| r.lat_us(&job))
    };
    let cell = |v: Option<f64>| v.map_or("-".to_string(), |x| format!("{x:.0}"));
    let ratio = |x: Option<f64>, y: Option<f64>| match (x, y) {
        (Some(x), Some(y)) if y > 0.0 => format!("{:.2}", x / y),
        _ => "-".to_string(),
    };
    for bytes in &sizes {
        let size = if *bytes < 1024 {
            format!("{bytes} B")
        } else {
            format!("{} KiB", bytes / 1024)
        };
        let (ar, br) = (lat(a, "read", *bytes), lat(b, "read", *bytes));
        let (aw, bw) = (lat(a, "write", *bytes), lat(b, "write", *bytes));
        let _ = writeln!(
            s,
            "| {size} | {} | {} | {} | {} | {} | {} |",
            cell(ar),
            cell(br),
            ratio(ar, br),
            cell(aw),
            cell(bw),
            ratio(aw, bw)
        );
    }
    let _ = writeln!(
        s,
        "\nLeast-squares fit time = setup + bytes / bandwidth over every round's mean latency:\n\n| target | direction | setup µs | bandwidth MiB/s | r² |\n|---|---|---:|---:|---:|"
    );
    let mut fits = BTreeMap::new();
    for t in [a, b] {
        for dir in ["read", "write"] {
            let points: Vec<(f64, f64)> = jobs
                .iter()
                .filter(|j| j.0 == dir)
                .filter_map(|(_, bytes, job)| Some((*bytes, fio.get(job)?.get(t)?)))
                .flat_map(|(bytes, r)| {
                    r.rounds
                        .iter()
                        .map(move |(_, x)| (bytes as f64, FioRuns::side(dir, x).lat_mean_us))
                })
                .collect();
            match fit_latency(&points) {
                Some(f) => {
                    let _ = writeln!(
                        s,
                        "| {t} | {dir} | {:.0} | {:.1} | {:.3} |",
                        f.setup_us, f.mib_s, f.r2
                    );
                    fits.insert((t, dir), f);
                }
                None => {
                    let _ = writeln!(s, "| {t} | {dir} | - | - | - |");
                }
            }
        }
    }
    for dir in ["read", "write"] {
        if let (Some(fa), Some(fb)) = (fits.get(&(a, dir)), fits.get(&(b, dir))) {
            let _ = writeln!(
                s,
                "\n{dir}s: {a}'s setup time is {:.2}x {b}'s, its bandwidth {:.2}x.",
                fa.setup_us / fb.setup_us,
                fa.mib_s / fb.mib_s
            );
        }
    }
    s
}

/// Every fio problem: jobs without results on a target, rounds that
/// failed.
pub fn fio_problems(
    fio: &BTreeMap<String, BTreeMap<String, FioRuns>>,
    jobs: &[&str],
    targets: &[&str],
) -> Vec<String> {
    let mut p = Vec::new();
    for job in jobs {
        for t in targets {
            match fio.get(*job).and_then(|m| m.get(*t)) {
                None => p.push(format!("{t} {job}: no result")),
                Some(r) => {
                    p.extend(r.errors.iter().map(|e| format!("{t} {job} {e}")));
                    if r.rounds.is_empty() {
                        p.push(format!("{t} {job}: no round succeeded"));
                    } else if r.iops(job) <= 0.0 {
                        p.push(format!("{t} {job}: no I/O done"));
                    }
                }
            }
        }
    }
    p
}

/// A least-squares line `time = setup + bytes / bandwidth` through
/// `(bytes, seconds)` points.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LatencyFit {
    /// The intercept: time of a transfer of no bytes, µs.
    pub setup_us: f64,
    /// The inverse of the slope, MiB/s.
    pub mib_s: f64,
    /// Coefficient of determination of the fit.
    pub r2: f64,
}

/// Fits `us = setup + bytes / bandwidth` to `(bytes, µs)` points by
/// ordinary least squares; None with fewer than two distinct sizes.
pub fn fit_latency(points: &[(f64, f64)]) -> Option<LatencyFit> {
    let n = points.len() as f64;
    if points.len() < 2 {
        return None;
    }
    let mx = points.iter().map(|p| p.0).sum::<f64>() / n;
    let my = points.iter().map(|p| p.1).sum::<f64>() / n;
    let sxx: f64 = points.iter().map(|p| (p.0 - mx).powi(2)).sum();
    let sxy: f64 = points.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum();
    if sxx == 0.0 {
        return None;
    }
    let slope = sxy / sxx; // µs per byte
    let setup = my - slope * mx;
    let ss_tot: f64 = points.iter().map(|p| (p.1 - my).powi(2)).sum();
    let ss_res: f64 = points
        .iter()
        .map(|p| (p.1 - (setup + slope * p.0)).powi(2))
        .sum();
    let r2 = if ss_tot > 0.0 {
        1.0 - ss_res / ss_tot
    } else {
        1.0
    };
    // bytes per µs = MB/s (10^6); in MiB/s:
    let mib_s = if slope > 0.0 {
        1e6 / slope / (1 << 20) as f64
    } else {
        f64::INFINITY
    };
    Some(LatencyFit {
        setup_us: setup,
        mib_s,
        r2,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn terse(job: &str, err: i32, r: [f64; 4], w: [f64; 4]) -> String {
        let mut f = vec!["0".to_string(); 130];
        f[0] = "3".into();
        f[1] = "fio-3.33".into();
        f[2] = job.into();
        f[4] = err.to_string();
        for (base, v) in [(6, r), (47, w)] {
            f[base - 1] = v[0].to_string();
            f[base] = v[1].to_string();
            f[base + 1] = v[2].to_string();
            f[base + 9] = v[3].to_string();
            f[base + 33] = (v[3] + 5.0).to_string();
        }
        f.join(";")
    }

    #[test]
    fn terse_fields() {
        let t = parse_terse(&terse(
            "j",
            0,
            [100.0, 50.0, 12.5, 80.0],
            [0.0, 0.0, 0.0, 0.0],
        ))
        .expect("parses");
        assert_eq!(t.job, "j");
        assert_eq!(t.read.kib, 100.0);
        assert_eq!(t.read.bw_kib_s, 50.0);
        assert_eq!(t.read.iops, 12.5);
        assert_eq!(t.read.clat_mean_us, 80.0);
        assert_eq!(t.read.lat_mean_us, 85.0);
        assert!(parse_terse("fio: something went wrong").is_none());
    }

    #[test]
    fn fio_folder_and_ratio() {
        let d = tempfile::tempdir().expect("tempdir");
        let w = |n: &str, s: String| fs::write(d.path().join(n), s).expect("write");
        w(
            "ferrited-rand4k-read-qd1-1.terse",
            terse("x", 0, [1.0, 400.0, 100.0, 1.0], [0.0; 4]),
        );
        w(
            "ferrited-rand4k-read-qd1-2.terse",
            terse("x", 0, [1.0, 400.0, 300.0, 1.0], [0.0; 4]),
        );
        w(
            "lio-rand4k-read-qd1-1.terse",
            terse("x", 0, [1.0, 400.0, 100.0, 1.0], [0.0; 4]),
        );
        w("lio-rand4k-read-qd1-2.terse", "fio: error".into());
        w(
            "lio-seq1m-write-qd8-1.terse",
            terse("x", 5, [0.0; 4], [1.0, 1.0, 1.0, 1.0]),
        );
        let fio = read_fio(d.path(), &["ferrited", "lio"]);
        let r = &fio["rand4k-read-qd1"];
        assert_eq!(r["ferrited"].iops("rand4k-read-qd1"), 200.0);
        assert_eq!(r["lio"].rounds.len(), 1);
        let table = fio_table(&fio, &["rand4k-read-qd1"], "ferrited", "lio");
        // ferrited's median of 100 and 300; only round 1 pairs with LIO's.
        assert!(
            table.contains("| rand4k-read-qd1 | 200 | 0.4 | 100 | 0.4 | 1.00 | 1.00-1.00 (1) |"),
            "{table}"
        );
        let p = fio_problems(
            &fio,
            &["rand4k-read-qd1", "seq1m-write-qd8"],
            &["ferrited", "lio"],
        );
        assert_eq!(p.len(), 4, "{p:?}");
    }

    #[test]
    fn latency_model_tables() {
        let d = tempfile::tempdir().expect("tempdir");
        let per_byte = 1e6 / (50.0 * (1u64 << 20) as f64); // 50 MiB/s
        for (t, setup) in [("ferrited", 100.0), ("lio", 200.0)] {
            for b in [512u64, 4096, 32768] {
                let us = setup + b as f64 * per_byte;
                fs::write(
                    d.path().join(format!("{t}-lat-read-{b}-1.terse")),
                    terse("x", 0, [1.0, 1.0, 1.0, us - 5.0], [0.0; 4]),
                )
                .expect("write");
            }
            fs::write(
                d.path().join(format!("{t}-rand4k-read-qd1-1.terse")),
                terse(
                    "x",
                    0,
                    [1.0, 1.0, if t == "lio" { 10.0 } else { 5.0 }, 1.0],
                    [0.0; 4],
                ),
            )
            .expect("write");
        }
        let fio = read_fio(d.path(), &["ferrited", "lio"]);
        assert_eq!(latency_jobs(&fio).len(), 3);
        let t = latency_table(&fio, "ferrited", "lio");
        assert!(t.contains("| 512 B | 110 | 210 | 0.52 |"), "{t}");
        assert!(
            t.contains("| ferrited | read | 100 | 50.0 | 1.000 |"),
            "{t}"
        );
        assert!(t.contains("| lio | read | 200 | 50.0 | 1.000 |"), "{t}");
        assert!(t.contains("| ferrited | write | - | - | - |"), "{t}");
        assert!(
            t.contains("reads: ferrited's setup time is 0.50x lio's, its bandwidth 1.00x."),
            "{t}"
        );
        let f = fio_table(&fio, &["rand4k-read-qd1"], "ferrited", "lio");
        assert!(f.contains("| 0.50 | 0.50-0.50 (1) |"), "{f}");
    }

    #[test]
    fn cu_folder() {
        let d = tempfile::tempdir().expect("tempdir");
        fs::write(
            d.path().join("runs.tsv"),
            "ALL.Read10\t1\t3\nALL.Sanitize\t124\t600\nALL.Unmap\t1\t0\n",
        )
        .expect("write");
        fs::write(
            d.path().join("ALL.Read10.log"),
            "Suite: Read10\n  Test: Simple ...passed\n  Test: Bad ...FAILED\n\nRun Summary:\n",
        )
        .expect("write");
        fs::write(
            d.path().join("ALL.Sanitize.log"),
            "Suite: Sanitize\n  Test: Overwrite ...passed\n  Test: Reset ...\n",
        )
        .expect("write");
        fs::write(d.path().join("ALL.Unmap.log"), "iscsi_connect failed\n").expect("write");
        fs::write(d.path().join("seconds"), "603\n").expect("write");
        let t = read_cu(d.path(), "x");
        assert_eq!(t.passed, vec!["Read10.Simple", "Sanitize.Overwrite"]);
        assert_eq!(t.seconds, 603);
        assert_eq!(t.failed.len(), 4, "{:?}", t.failed);
        assert!(t.failed.iter().any(|f| f.contains("killed")));
        assert!(t.failed.iter().any(|f| f.contains("no test ran")));
        assert!(
            t.failed
                .contains(&"Sanitize.Reset (no verdict)".to_string())
        );
    }

    #[test]
    fn least_squares_line() {
        // 10 µs setup, 100 MiB/s: 1 MiB takes 10000 µs + 10 µs... per byte
        // 1e6 / (100 * 2^20) µs.
        let per_byte = 1e6 / (100.0 * (1u64 << 20) as f64);
        let pts: Vec<(f64, f64)> = [512.0, 4096.0, 32768.0]
            .iter()
            .map(|&b| (b, 10.0 + b * per_byte))
            .collect();
        let f = fit_latency(&pts).expect("fit");
        assert!((f.setup_us - 10.0).abs() < 1e-6, "{f:?}");
        assert!((f.mib_s - 100.0).abs() < 1e-6, "{f:?}");
        assert!((f.r2 - 1.0).abs() < 1e-9);
        assert!(fit_latency(&[(1.0, 1.0)]).is_none());
    }
}
