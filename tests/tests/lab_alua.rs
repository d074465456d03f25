//! ALUA with the Linux multipath stack, in the kernel lab (`tests/lab/`,
//! [`ferrite_tests::lab`]): one ferrited with a device group seen through
//! two target port groups on two portals; `multipath -ll` with `prio alua`
//! shows an active/optimized and an active/non-optimized path group,
//! `sg_rtpg` and VPD 83h report the groups, `sg_stpg` moves the optimized
//! group under verified I/O and multipath follows, a standby port refuses
//! reads, and the states survive a restart.

use ferrite_tests::lab::{self, LabOptions};

#[test]
fn multipath_follows_alua_states_and_explicit_transitions() {
    lab::run_passing("iscsi-alua", &LabOptions::default());
}
