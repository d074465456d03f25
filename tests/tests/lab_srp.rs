//! The Linux SRP initiator (`ib_srp` over RDMA/CM) against ferrited's SRP
//! port on soft-RoCE (`rdma_rxe`) through the `verbs` provider, each
//! scenario in its own guest of the kernel lab ([`ferrite_tests::lab`]).

use std::path::PathBuf;

use ferrite_tests::lab::{self, LabOptions};

#[test]
fn linux_login_over_rdma_cm_with_immediate_data_and_two_channels() {
    lab::run_passing("srp-login", &LabOptions::default());
}

#[test]
fn fio_verify_matrix_ext4_and_lun_reset() {
    lab::run_passing("srp-io", &LabOptions::default());
}

#[test]
fn ib_srp_reconnects_after_a_restart_under_load() {
    lab::run_passing("srp-restart", &LabOptions::default());
}

/// The newest `srp_verbs` test binary beside this one (`cargo test` builds
/// every test binary of the package before it runs any).
fn srp_verbs_binary() -> PathBuf {
    let deps = std::env::current_exe()
        .ok()
        .and_then(|e| e.parent().map(PathBuf::from))
        .unwrap_or_default();
    let newest = std::fs::read_dir(&deps)
        .into_iter()
        .flatten()
        .filter_map(Result::ok)
        .filter(|e| {
            let n = e.file_name().to_string_lossy().into_owned();
            n.starts_with("srp_verbs-") && !n.contains('.')
        })
        .filter_map(|e| Some((e.metadata().ok()?.modified().ok()?, e.path())))
        .max();
    match newest {
        Some((_, p)) => p,
        None => panic!(
            "no srp_verbs test binary in {}: build it (cargo test -p ferrite-tests --no-run)",
            deps.display()
        ),
    }
}

#[test]
fn the_verbs_tests_pass_on_soft_roce() {
    let bin = srp_verbs_binary();
    lab::run_passing(
        "srp-verbs",
        &LabOptions {
            env: vec![("SRP_VERBS_TEST".into(), bin.display().to_string())],
            ..LabOptions::default()
        },
    );
}

#[test]
fn refused_logins_carry_their_srp_reason_to_the_linux_initiator() {
    lab::run_passing("srp-reject", &LabOptions::default());
}
