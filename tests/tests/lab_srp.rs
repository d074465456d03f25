//! The Linux SRP initiator (`ib_srp` over RDMA/CM) against ferrited's SRP
//! port on soft-RoCE (`rdma_rxe`) through the `verbs` provider, each
//! scenario in its own guest of the kernel lab ([`ferrite_tests::lab`]).

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

#[test]
fn the_verbs_tests_pass_on_soft_roce() {
    let bin = lab::test_binary("srp_verbs");
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
