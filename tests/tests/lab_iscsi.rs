//! The Linux iSCSI initiator (open-iscsi: iscsid and `iscsi_tcp`) against
//! ferrited, each scenario in its own guest of the kernel lab
//! (`tests/lab/`, [`ferrite_tests::lab`]).

use ferrite_tests::lab::{self, LabOptions};

#[test]
fn discovery_login_digests_and_chap() {
    lab::run_passing("iscsi-login", &LabOptions::default());
}

#[test]
fn ext4_and_xfs_survive_a_remount_with_checksums_and_fsck() {
    lab::run_passing(
        "iscsi-fs",
        &LabOptions {
            mem_mb: 3072,
            ..LabOptions::default()
        },
    );
}

#[test]
fn fio_verify_matrix() {
    lab::run_passing("iscsi-fio", &LabOptions::default());
}

#[test]
fn fstrim_shrinks_a_thin_image() {
    lab::run_passing("iscsi-trim", &LabOptions::default());
}

#[test]
fn lun_added_and_resized_live_are_seen_by_the_kernel() {
    lab::run_passing("iscsi-live", &LabOptions::default());
}
