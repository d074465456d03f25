//! ferrited beside the kernel's own target LIO and tgtd, in one guest of the
//! kernel lab on one kernel: libiscsi's whole suite against each, and the
//! same fio jobs over open-iscsi against ferrited and LIO, printed as
//! markdown tables with the ratio ferrited / LIO.
//!
//! With `srp`, ferrited's SRP port and LIO's ib_srpt instead, on the same
//! soft-RoCE device with the Linux SRP initiator logged in to both, each job
//! run on one and right after on the other: the same fio jobs, and the
//! latency model (QD 1 reads and writes of 512 B to 32 KiB,
//! with the least-squares fit time = setup + bytes / bandwidth per target).
//!
//! With `iser`, over iSER on the same soft-RoCE device: alone, the iSCSI
//! comparison with ferrited's `iser:` portal and LIO's isert (libiscsi with
//! `iser://` URLs, open-iscsi's iser iface); with `srp`, the SRP run with
//! both iSER targets beside the SRP ones, so that the latency model puts
//! ferrited's iSER, ferrited's SRP, LIO's isert and LIO's ib_srpt side by
//! side (`compare-srp.sh` with `COMPARE_ISER=1`).
//!
//! ```sh
//! cargo build --release --bins
//! cargo run --release -p ferrite-tests --example lab_compare
//! cargo run --release -p ferrite-tests --example lab_compare -- srp
//! cargo run --release -p ferrite-tests --example lab_compare -- iser
//! cargo run --release -p ferrite-tests --example lab_compare -- srp iser
//! cargo run --release -p ferrite-tests --example lab_compare -- --from target/release/lab/compare-iscsi
//! cargo run --release -p ferrite-tests --example lab_compare -- srp --from target/release/lab/compare-srp
//! ```
//!
//! Without `--from` it boots the guest (`tests/lab/guest/compare-iscsi.sh`,
//! 19 to 25 minutes on a 2-core machine, most of it libiscsi under TCG;
//! `compare-srp.sh`, about 9); with it, it prints the tables of a run
//! already made. The scenarios' knobs pass through from the environment:
//! `CU_SUITES`, `CU_SUITE_TIMEOUT_S`, `CU_TARGETS`, `FIO_RUNTIME_S`,
//! `FIO_LAT_RUNTIME_S`, `FIO_SIZE_MB`, `FIO_REPS`, `SKIP_FIO`, `SKIP_CU`,
//! `SKIP_FIO_JOBS`, `SRP_OPTS`.
//!
//! qemu runs TCG here: absolute figures mean nothing; the ratios between
//! targets measured in one run do.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a report driver: a failed step ends the run

use std::path::{Path, PathBuf};
use std::process::Command;

use ferrite_tests::compare::{self, FIO_JOBS};
use ferrite_tests::lab::{self, LabOptions};

const PASS_THROUGH: [&str; 11] = [
    "CU_SUITES",
    "CU_SUITE_TIMEOUT_S",
    "CU_TARGETS",
    "FIO_RUNTIME_S",
    "FIO_LAT_RUNTIME_S",
    "FIO_SIZE_MB",
    "FIO_REPS",
    "SKIP_FIO",
    "SKIP_CU",
    "SKIP_FIO_JOBS",
    "SRP_OPTS",
];

fn git(repo: &Path, args: &[&str]) -> String {
    Command::new("git")
        .arg("-C")
        .arg(repo)
        .args(args)
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default()
}

/// The commit of the tree the ferrited under test was built in (the git
/// checkout around its `target/` folder), and whether that tree had
/// uncommitted changes to tracked files.
fn ferrited_commit() -> String {
    let bin = ferrite_tests::ferrited_path();
    let Some(repo) = bin.ancestors().find(|d| d.join(".git").exists()) else {
        return format!("{} (not in a git checkout)", bin.display());
    };
    let head = git(repo, &["rev-parse", "--short", "HEAD"]);
    if git(repo, &["status", "--porcelain", "--untracked-files=no"]).is_empty() {
        head
    } else {
        format!("{head} with uncommitted changes")
    }
}

/// The host's load averages (1, 5, 15 minutes).
fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let srp = args.iter().any(|a| a == "srp");
    let iser = args.iter().any(|a| a == "iser");
    let scenario = if srp { "compare-srp" } else { "compare-iscsi" };
    let (out, seconds) = match args.iter().position(|a| a == "--from") {
        Some(i) => {
            let dir = PathBuf::from(args.get(i + 1).expect("--from DIR"));
            assert!(
                dir.join("console.log").is_file(),
                "{}: no lab run there",
                dir.display()
            );
            (dir, None)
        }
        None => {
            let mut opts = if iser && !srp {
                LabOptions::iser()
            } else {
                LabOptions::default()
            };
            if iser && srp {
                opts.env.push(("COMPARE_ISER".into(), "1".into()));
                opts.variant = Some("iser".into());
            }
            opts.env.extend(
                PASS_THROUGH
                    .iter()
                    .filter_map(|k| std::env::var(k).ok().map(|v| (k.to_string(), v))),
            );
            opts.mem_mb = 4096;
            opts.timeout_s = 5400;
            let load_before = loadavg();
            let run = lab::run(scenario, &opts);
            run.assert_passed();
            std::fs::write(run.out.join("commit.txt"), ferrited_commit() + "\n")
                .expect("write commit.txt");
            std::fs::write(run.out.join("seconds.txt"), format!("{:.0}\n", run.seconds))
                .expect("write seconds.txt");
            std::fs::write(
                run.out.join("loadavg.txt"),
                format!("{load_before} -> {}\n", loadavg()),
            )
            .expect("write loadavg.txt");
            (run.out.clone(), Some(run.seconds))
        }
    };

    let kernel = std::fs::read_to_string(out.join("kernel.txt")).unwrap_or_default();
    let versions = std::fs::read_to_string(out.join("versions.txt")).unwrap_or_default();
    let read = |f: &str| std::fs::read_to_string(out.join(f)).ok();
    let commit = read("commit.txt")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|| "an unrecorded commit".to_string());
    let seconds = seconds.or_else(|| read("seconds.txt").and_then(|s| s.trim().parse().ok()));
    let date = Command::new("date")
        .args(["-u", "-r"])
        .arg(out.join("console.log"))
        .arg("+%F %H:%M UTC")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();

    match (srp, iser) {
        (true, true) => println!("# ferrited and LIO over SRP and iSER in one lab guest\n"),
        (true, false) => println!("# ferrited and LIO over SRP in one lab guest\n"),
        (false, true) => println!("# ferrited and LIO (isert) over iSER in one lab guest\n"),
        (false, false) => println!("# ferrited, LIO and tgtd in one lab guest\n"),
    }
    println!(
        "Run of {date}: kernel {} under qemu TCG (2 vCPUs), ferrited from {commit}.",
        kernel.trim()
    );
    if let Some(s) = seconds {
        println!("The scenario took {s:.0} s, boot included.");
    }
    if let Some(l) = read("loadavg.txt") {
        println!(
            "The host's 1/5/15-minute load averages, before and after: {} (the guest's 2 vCPUs share the host's cores with whatever else runs).",
            l.trim()
        );
    }
    println!(
        "qemu runs TCG: absolute figures in this guest mean nothing; the ratios between targets measured in this one run do.\n"
    );
    println!("```\n{}```\n", versions);

    let targets: Vec<compare::CuTarget> = ["ferrited", "lio", "tgtd"]
        .iter()
        .map(|t| compare::read_cu(&out.join("cu").join(t), t))
        .filter(compare::CuTarget::ran)
        .collect();
    if !targets.is_empty() {
        println!("## libiscsi (iscsi-test-cu -d -S, one process per suite)\n");
        println!("{}", compare::cu_table(&targets));
        println!("Per suite (passed / failed / skipped):\n");
        println!("{}", compare::cu_suite_table(&targets));
    }

    let names: &[&str] = if srp && iser {
        &["ferrited", "lio", "ferrited-iser", "lio-iser"]
    } else {
        &["ferrited", "lio"]
    };
    let fio = compare::read_fio(&out.join("fio"), names);
    if srp {
        if let Some(h) = read("srp-hosts.txt") {
            println!("What ib_srp negotiated with each:\n\n```\n{}```\n", h);
        }
        println!(
            "## fio over ib_srp on rxe0 (direct I/O, libaio; medians over the rounds, the ratio of each round's pair)\n"
        );
        println!("{}", compare::fio_table(&fio, &FIO_JOBS, "ferrited", "lio"));
        if iser {
            println!(
                "## fio over iSER on rxe0: ferrited's iser: portal and LIO's isert, open-iscsi's iser iface\n"
            );
            println!(
                "{}",
                compare::fio_table(&fio, &FIO_JOBS, "ferrited-iser", "lio-iser")
            );
        }
        println!("## The latency model: QD 1 random I/O (mean latency, median over the rounds)\n");
        println!("### SRP: ferrited and LIO's ib_srpt\n");
        println!("{}", compare::latency_table(&fio, "ferrited", "lio"));
        if iser {
            println!("### iSER: ferrited and LIO's isert\n");
            println!(
                "{}",
                compare::latency_table(&fio, "ferrited-iser", "lio-iser")
            );
            println!("### ferrited: iSER against SRP\n");
            println!(
                "{}",
                compare::latency_table(&fio, "ferrited-iser", "ferrited")
            );
        }
        let lat: Vec<String> = compare::latency_jobs(&fio)
            .into_iter()
            .map(|j| j.2)
            .collect();
        let jobs: Vec<&str> = FIO_JOBS
            .iter()
            .copied()
            .chain(lat.iter().map(String::as_str))
            .collect();
        for p in compare::fio_problems(&fio, &jobs, names) {
            println!("- fio problem: {p}");
        }
    } else if !fio.is_empty() {
        println!(
            "## fio over open-iscsi (direct I/O, libaio; medians over the rounds, the ratio of each round's pair)\n"
        );
        println!("{}", compare::fio_table(&fio, &FIO_JOBS, "ferrited", "lio"));
        let problems = compare::fio_problems(&fio, &FIO_JOBS, &["ferrited", "lio"]);
        for p in &problems {
            println!("- fio problem: {p}");
        }
    }
}
