//! Moving from LIO to ferrited in the kernel lab (`tests/lab/`,
//! [`ferrite_tests::lab`]): LIO configured with targetcli, its
//! saveconfig.json and APTPL file imported with `ferritectl import-lio`, and
//! the Linux iSCSI initiator seeing the same identity (VPD 80h and 83h, wwid,
//! multipath WWID, /dev/disk/by-id) and the same reservation through
//! ferrited (`tests/lab/guest/lio-import.sh`); and a live cutover from LIO
//! to ferrited under a verified fio job on dm-multipath
//! (`tests/lab/guest/lio-cutover.sh`).

use ferrite_tests::lab::{self, LabOptions};

#[test]
fn lio_import_keeps_identity_data_and_reservations() {
    lab::run_passing("lio-import", &LabOptions::default());
}

#[test]
fn live_cutover_from_lio_under_verified_io_on_multipath() {
    lab::run_passing("lio-cutover", &LabOptions::default());
}
