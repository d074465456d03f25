//! ferrited beside LIO in one guest of the kernel lab
//! (`tests/lab/guest/compare-iscsi.sh`, [`ferrite_tests::compare`]), on a
//! subset of libiscsi's suites and with short fio rounds, so that it fits
//! in CI (3 minutes here on a quiet host, up to 8 on a busy one); the whole
//! suite against ferrited, LIO and tgtd, with longer fio rounds, runs in the
//! `lab_compare` example (about 20 minutes), whose tables
//! docs/conformance.md keeps.
//!
//! The same runs over iSER (ferrited's `iser:` portal beside LIO's isert,
//! libiscsi with `iser://` URLs, open-iscsi's iser iface) on rdma_rxe.
//!
//! What must hold for ferrited in that run: no libiscsi failure on its LU
//! (no failed test, no test without a verdict, no suite killed by its time
//! limit), and every fio job done without error on ferrited and on LIO.
//! LIO's libiscsi run must have produced verdicts, so that the comparison
//! is real; its failures are LIO's and only reported. Over iSER, a test in
//! which libiscsi's own iSER code crashes (iscsi-test-cu killed by a signal
//! when the test runs alone) is reported, not counted; it may not crash on
//! ferrited alone.

use ferrite_tests::compare::{self, FIO_JOBS};
use ferrite_tests::lab::{self, LabOptions};

/// Suites that cover the command set (reads, writes, thin provisioning,
/// COMPARE AND WRITE, reservations, task management, iSCSI sequencing)
/// without the long waits of SANITIZE or the reset suites. Unmap is left to
/// the full run: its Simple test sends UNMAPs of up to 256 one-block
/// descriptors, which ferrited punches one after the other, each a trip
/// through io_uring's worker threads; in a TCG guest on a busy host that
/// took 80 to 100 s (LIO: 1 s).
const CI_SUITES: &str = "ALL.Inquiry ALL.ReadCapacity16 ALL.Read10 ALL.Write16 \
    ALL.GetLBAStatus ALL.CompareAndWrite \
    ALL.ProutReserve ALL.Reserve6 ALL.ReportSupportedOpcodes \
    ALL.iSCSIResiduals ALL.iSCSIcmdsn ALL.iSCSITMF";

#[test]
fn ferrited_beside_lio_in_one_guest() {
    compare_with_lio(LabOptions::default(), 60);
}

#[test]
fn ferrited_beside_lio_isert_over_iser() {
    compare_with_lio(LabOptions::iser(), 50);
}

/// One compare-iscsi run of ferrited and LIO on `CI_SUITES` with short fio
/// rounds over the transport of `opts`; at least `min_passed` libiscsi
/// tests must pass on ferrited.
fn compare_with_lio(opts: LabOptions, min_passed: usize) {
    let mut env: Vec<(String, String)> = [
        ("CU_SUITES", CI_SUITES),
        ("CU_TARGETS", "ferrited lio"),
        ("CU_SUITE_TIMEOUT_S", "300"),
        ("FIO_RUNTIME_S", "3"),
        ("FIO_REPS", "1"),
        ("FIO_SIZE_MB", "128"),
    ]
    .iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    env.extend(opts.env.iter().cloned());
    let run = lab::run_passing(
        "compare-iscsi",
        &LabOptions {
            mem_mb: 4096,
            timeout_s: 1800,
            env,
            ..opts
        },
    );
    let cu: Vec<compare::CuTarget> = ["ferrited", "lio"]
        .iter()
        .map(|t| compare::read_cu(&run.out.join("cu").join(t), t))
        .collect();
    eprintln!("{}", compare::cu_table(&cu));
    let fio = compare::read_fio(&run.out.join("fio"), &["ferrited", "lio"]);
    eprintln!("{}", compare::fio_table(&fio, &FIO_JOBS, "ferrited", "lio"));

    let suites: Vec<&str> = std::iter::once("ALL.MultipathIO")
        .chain(CI_SUITES.split_whitespace())
        .collect();
    let missing = |t: &compare::CuTarget| -> Vec<&str> {
        suites.iter().copied().filter(|s| !t.ran_suite(s)).collect()
    };
    let f = &cu[0];
    assert!(
        missing(f).is_empty(),
        "ferrited: suites that did not run: {:?}",
        missing(f)
    );
    assert!(f.died.is_none(), "ferrited died: {:?}", f.died);
    assert!(
        f.failed.is_empty(),
        "libiscsi failures on ferrited in the guest:\n{}\n(logs in {})",
        f.failed.join("\n"),
        run.out.join("cu/ferrited").display()
    );
    assert!(
        f.passed.len() >= min_passed,
        "only {} libiscsi tests passed on ferrited",
        f.passed.len()
    );
    let lio_crashed = cu[1].crashed_tests();
    let own: Vec<&str> = f
        .crashed_tests()
        .into_iter()
        .filter(|t| !lio_crashed.contains(t))
        .collect();
    assert!(
        own.is_empty(),
        "iscsi-test-cu crashed on ferrited alone in: {own:?} (logs in {})",
        run.out.join("cu/ferrited").display()
    );
    let lio = &cu[1];
    assert!(
        missing(lio).is_empty(),
        "LIO: suites that did not run: {:?}",
        missing(lio)
    );
    assert!(
        lio.passed.len() >= 20,
        "LIO: {} passed; its run produced no real results:\n{}",
        lio.passed.len(),
        lio.failed.join("\n")
    );
    let problems = compare::fio_problems(&fio, &FIO_JOBS, &["ferrited", "lio"]);
    assert!(
        problems.is_empty(),
        "fio problems:\n{}\n(outputs in {})",
        problems.join("\n"),
        run.out.join("fio").display()
    );
}
