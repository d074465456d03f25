//! The Linux iSCSI initiator (open-iscsi: iscsid and `iscsi_tcp`) against
//! ferrited, each scenario in its own guest of the kernel lab
//! (`tests/lab/`, [`ferrite_tests::lab`]).

use ferrite_tests::lab::{self, LabOptions};

#[test]
fn discovery_login_digests_and_chap() {
    lab::run_passing("iscsi-login", &LabOptions::default());
}
