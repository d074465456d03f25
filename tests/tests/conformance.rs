//! SCSI conformance: libiscsi's `iscsi-test-cu -d -S` against three
//! logical units of one ferrited: a thin-provisioned fileio LUN with
//! 512-byte blocks and a removable medium (INQUIRY RMB = 1, so the NoMedia,
//! StartStopUnit and PreventAllow families run for real), a fileio LUN with
//! 4096-byte blocks on tmpfs where there is one (so its large reads travel
//! as page-cache pages spliced into the socket), and nullio's `mem` mode. Each LU gets the whole suite
//! (every family, one process, the URL given once, as a full run is
//! normally made), then the MultipathIO suite with the URL given twice, so
//! it runs over two sessions with the two initiator names. The three LUs'
//! runs go side by side.
//!
//! A run fails on any failed test and on any skipped test that
//! `tests/conformance/known-skips.txt` does not list for that LUN (each
//! entry gives the libiscsi condition or the SPC/SBC clause). Known
//! failures are listed there too, each with its cause; a listed failure
//! that passes is reported so the list can shrink.
//!
//! Needs `iscsi-test-cu` (libiscsi-bin 1.19) and a built `ferrited`
//! (`cargo build --release --bin ferrited`, or `FERRITED=path`); skips with a
//! message when the tool is missing.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use ferrite_tests::{
    CU_INITIATORS, Config, Device, Ferrited, Options, Target, free_port, parse_cu, run_with_timeout,
};

const IQN: &str = "iqn.2026-11.org.ferrite:conformance";

/// (label, target suffix, device); the 4 KiB fileio LUN lives in `shm`.
fn luns(dir: &Path, shm: &Path) -> Vec<(&'static str, Device)> {
    vec![
        (
            "fileio",
            Device::fileio("thin512", &dir.join("thin512.img"), 268435456)
                .set("thin_provisioned", true)
                .set("removable", true),
        ),
        (
            "fileio4k",
            Device::fileio("thin4k", &shm.join("thin4k.img"), 268435456)
                .set("blocksize", 4096)
                .set("thin_provisioned", true),
        ),
        ("mem", Device::mem("mem", 268435456)),
    ]
}

fn config(dir: &Path, shm: &Path, port: u16) -> std::path::PathBuf {
    // libiscsi's Sanitize.Reset polls TEST UNIT READY with sleep(60) in
    // between and reads nothing meanwhile: a NOP-In ping sent after 30 s
    // of silence must be allowed more than the other 30 s of that sleep,
    // or the keepalive drops the session just before the test wakes.
    let mut c = Config::new()
        .iscsi("nop_in_interval_s", 30)
        .iscsi("nop_in_timeout_s", 60);
    for (label, dev) in luns(dir, shm) {
        c = c
            .target(
                Target::new(&format!("{IQN}-{label}"))
                    .portal(format!("127.0.0.1:{port}"))
                    .lun(0, &dev.name()),
            )
            .device(dev);
    }
    c.write(dir.join("ferrite.json"))
}

/// `label -> (test -> reason)` for skips and for failures.
struct Known {
    skips: BTreeMap<String, String>,
    fails: BTreeMap<String, String>,
}

fn known(label: &str) -> Known {
    let text = include_str!("../conformance/known-skips.txt");
    let mut k = Known {
        skips: BTreeMap::new(),
        fails: BTreeMap::new(),
    };
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        // KIND LABELS TEST REASON...
        let mut it = line.splitn(4, char::is_whitespace);
        let (Some(kind), Some(labels), Some(test)) = (it.next(), it.next(), it.next()) else {
            panic!("malformed known-skips line: {line}");
        };
        let reason = it.next().unwrap_or("").trim().to_string();
        assert!(
            !reason.is_empty(),
            "known-skips entry without a reason: {line}"
        );
        if labels != "*" && !labels.split(',').any(|l| l == label) {
            continue;
        }
        match kind {
            "skip" => k.skips.insert(test.to_string(), reason),
            "fail" => k.fails.insert(test.to_string(), reason),
            _ => panic!("unknown kind {kind} in: {line}"),
        };
    }
    k
}

fn have_cu() -> bool {
    let ok = Command::new("iscsi-test-cu").arg("-l").output().is_ok();
    if !ok {
        eprintln!("SKIPPED: iscsi-test-cu not installed (apt install libiscsi-bin)");
    }
    ok
}

/// Runs `iscsi-test-cu -t tests` on `urls` and records in `problems` every
/// failure and every skip `known-skips.txt` does not list for `label`;
/// skips of the suite `covered` (e.g. `MultipathIO.`) are expected because
/// another run covers them. Returns the number of tests that passed.
fn run_cu(
    label: &str,
    tests: &str,
    urls: &[&str],
    covered: Option<&str>,
    problems: &mut Vec<String>,
) -> usize {
    let t = Instant::now();
    let out = run_with_timeout(
        Command::new("iscsi-test-cu")
            .args(["-d", "-S", "-i", CU_INITIATORS[0], "-I", CU_INITIATORS[1]])
            .args(["-t", tests])
            .args(urls),
        Duration::from_secs(900),
    );
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    let r = parse_cu(&text);
    let k = known(label);
    eprintln!(
        "{label}: {} passed, {} skipped, {} failed in {:.0?}",
        r.passed.len(),
        r.skipped.len(),
        r.failed.len(),
        t.elapsed()
    );
    if r.passed.is_empty() {
        problems.push(format!("{label}: no test passed\n{text}"));
    }
    for s in &r.skipped {
        if !k.skips.contains_key(s) && !covered.is_some_and(|c| s.starts_with(c)) {
            problems.push(format!("{label}: unexpected skip {s}"));
        }
    }
    for fl in &r.failed {
        match k.fails.get(fl) {
            Some(why) => eprintln!("{label}: known failure {fl}: {why}"),
            None => problems.push(format!("{label}: FAILED {fl}")),
        }
    }
    for t in k.fails.keys() {
        if r.passed.contains(t) {
            eprintln!("{label}: {t} passes now; drop it from known-skips.txt");
        }
    }
    r.passed.len()
}

#[test]
fn iscsi_test_cu_whole_suite_on_fileio_4k_and_mem() {
    if !have_cu() {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let shm = match Path::new("/dev/shm").is_dir() {
        true => tempfile::tempdir_in("/dev/shm").expect("tempdir in /dev/shm"),
        false => tempfile::tempdir().expect("tempdir"),
    };
    let port = free_port();
    let cfg = config(dir.path(), shm.path(), port);
    let mut f = Ferrited::start(
        dir.path(),
        port,
        Options {
            config: Some(cfg),
            args: vec![],
        },
    );
    let t0 = Instant::now();
    // The three LUs are three targets and three devices: their runs share
    // nothing but ferrited, so they run side by side (most of a run is
    // libiscsi sleeping: SANITIZE and reset tests wait in seconds).
    let runs: Vec<_> = luns(dir.path(), shm.path())
        .into_iter()
        .map(|(label, _)| {
            let url = f.url(&format!("{IQN}-{label}"), 0);
            std::thread::spawn(move || {
                let mut problems = Vec::new();
                let passed = run_cu(label, "ALL", &[&url], Some("MultipathIO."), &mut problems);
                if label == "fileio" && passed < 215 {
                    problems.push(format!("{label}: only {passed} passed"));
                }
                // Two sessions, two initiator names: every MultipathIO test
                // runs.
                let passed = run_cu(label, "ALL.MultipathIO", &[&url, &url], None, &mut problems);
                if passed != 4 {
                    problems.push(format!(
                        "{label}: {passed} of the 4 MultipathIO tests passed with two sessions"
                    ));
                }
                problems
            })
        })
        .collect();
    let mut problems = Vec::new();
    for r in runs {
        problems.extend(r.join().expect("a conformance run panicked"));
    }
    assert!(
        f.alive(),
        "ferrited died during the runs:\n{}",
        f.log_text()
    );
    eprintln!("whole conformance run: {:.0?}", t0.elapsed());
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}
