//! The Linux iSER initiator (open-iscsi with the `iser` transport,
//! `ib_iser`) against ferrited's iSER portal on soft-RoCE (`rdma_rxe`),
//! in a guest of the kernel lab ([`ferrite_tests::lab`]).

use ferrite_tests::lab::{self, LabOptions};

#[test]
fn linux_iser_login_dd_round_trip_fio_verify_and_relogin() {
    lab::run_passing("iser-io", &LabOptions::default());
}
