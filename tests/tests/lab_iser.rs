//! The Linux iSER initiator (open-iscsi with the `iser` transport,
//! `ib_iser`) against ferrited's iSER portal on soft-RoCE (`rdma_rxe`), in
//! guests of the kernel lab ([`ferrite_tests::lab`]): the iSCSI scenarios
//! of `lab_iscsi` and `lab_iscsi_recovery` run over iSER
//! ([`LabOptions::iser`]), each with the same checks as over TCP.

use ferrite_tests::lab::{self, LabOptions};

#[test]
fn iser_discovery_login_and_chap() {
    lab::run_passing("iscsi-login", &LabOptions::iser());
}

/// The jobs of the TCP matrix on smaller regions (16 MiB at 4 KiB, 64 MiB
/// at 1 MiB): rxe in a TCG guest moves a few MiB/s.
#[test]
fn iser_fio_verify_matrix() {
    let mut opts = LabOptions::iser();
    opts.env.push(("FIO_4K_MB".into(), "16".into()));
    opts.env.push(("FIO_SEQ_MB".into(), "64".into()));
    lab::run_passing("iscsi-fio", &opts);
}

/// ext4 alone, with 128 MiB of files: xfs and the larger set run over TCP.
#[test]
fn iser_ext4_survives_a_remount_with_checksums_and_fsck() {
    let mut opts = LabOptions::iser();
    opts.mem_mb = 3072;
    opts.env.push(("FS_TYPES".into(), "ext4".into()));
    opts.env.push(("FS_FILES".into(), "8".into()));
    lab::run_passing("iscsi-fs", &opts);
}

#[test]
fn iser_sigkill_and_restart_under_a_verified_write_job() {
    lab::run_passing("iscsi-restart", &LabOptions::iser());
}

#[test]
fn iser_error_handler_abort_then_lun_reset_on_a_stalled_lun() {
    lab::run_passing("iscsi-eh", &LabOptions::iser());
}

#[test]
fn iser_lun_added_and_resized_live_are_seen_by_the_kernel() {
    lab::run_passing("iscsi-live", &LabOptions::iser());
}

/// The project's iSER-over-verbs tests (`tests/tests/iser_verbs.rs`: RDMA
/// CM connection requests that never log in, beyond what a core takes) on
/// the guest's soft-RoCE device.
#[test]
fn iser_verbs_tests_pass_on_soft_roce() {
    let bin = lab::test_binary("iser_verbs");
    lab::run_passing(
        "iser-verbs",
        &LabOptions {
            env: vec![("ISER_VERBS_TEST".into(), bin.display().to_string())],
            ..LabOptions::default()
        },
    );
}
