//! ALUA with the Linux multipath stack, in the kernel lab (`tests/lab/`,
//! [`ferrite_tests::lab`]): one ferrited with a device group seen through
//! two target port groups on two portals; `multipath -ll` with `prio alua`
//! shows an active/optimized and an active/non-optimized path group,
//! `sg_rtpg` and VPD 83h report the groups, `sg_stpg` moves the optimized
//! group under verified I/O and multipath follows, a standby port refuses
//! reads, and the states survive a restart. And an HA pair of ferrited
//! nodes with their cluster state in etcd.

use ferrite_tests::lab::{self, LabOptions};

#[test]
fn multipath_follows_alua_states_and_explicit_transitions() {
    lab::run_passing("iscsi-alua", &LabOptions::default());
}

/// Two ferrited nodes with their cluster state in etcd (docs/cluster.md):
/// failover on SIGKILL and on a partition from etcd, no split brain,
/// reservations seen through both nodes and kept through both failovers.
#[test]
fn ha_pair_fails_over_with_etcd_and_keeps_reservations() {
    lab::run_passing("ha-pair", &LabOptions::default());
}
