//! open-iscsi's error recovery against ferrited, each scenario in its own
//! guest of the kernel lab (`tests/lab/`, [`ferrite_tests::lab`]): a target
//! killed and restarted under a verified write job, the kernel's SCSI error
//! handler (ABORT TASK, LOGICAL UNIT RESET) on a stalled LUN, and
//! dm-multipath over two portals of which one goes away and comes back.

use ferrite_tests::lab::{self, LabOptions};

#[test]
fn sigkill_and_restart_under_a_verified_write_job() {
    lab::run_passing("iscsi-restart", &LabOptions::default());
}

#[test]
fn error_handler_abort_then_lun_reset_on_a_stalled_lun() {
    lab::run_passing("iscsi-eh", &LabOptions::default());
}

#[test]
fn multipath_path_fails_with_its_portal_and_returns() {
    lab::run_passing("iscsi-multipath", &LabOptions::default());
}
