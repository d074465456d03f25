//! blockio on a real block device (a loop device over a file in the temp
//! directory) against libiscsi's conformance suites, with 512- and
//! 4096-byte logical blocks: every test of the chosen SCSI suites passes
//! (libiscsi's own skips are listed, never counted as passes).
//!
//! Needs root and loop devices (`losetup`); skipped with a message
//! otherwise. The loop device is detached when the test ends, pass or fail.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed step is a failed test

mod backend_util;

use std::path::{Path, PathBuf};
use std::process::Command;

use backend_util::*;
use ferrite_tests::{require_tool, run_cu_suites};

/// The SCSI suites a block backend is held to.
const SUITES: &[&str] = &[
    "SCSI.TestUnitReady",
    "SCSI.Inquiry",
    "SCSI.ReadCapacity10",
    "SCSI.ReadCapacity16",
    "SCSI.Mandatory",
    "SCSI.Read6",
    "SCSI.Read10",
    "SCSI.Read12",
    "SCSI.Read16",
    "SCSI.Write10",
    "SCSI.Write12",
    "SCSI.Write16",
    "SCSI.WriteVerify10",
    "SCSI.WriteVerify12",
    "SCSI.WriteVerify16",
    "SCSI.Verify10",
    "SCSI.Verify12",
    "SCSI.Verify16",
    "SCSI.WriteSame10",
    "SCSI.WriteSame16",
    "SCSI.Unmap",
    "SCSI.GetLBAStatus",
    "SCSI.Prefetch10",
    "SCSI.Prefetch16",
    "SCSI.CompareAndWrite",
    "SCSI.OrWrite",
];

/// A loop device, detached on drop.
struct Loop(PathBuf);

impl Loop {
    /// Attaches `file` with `bs`-byte logical blocks; None if this machine
    /// cannot (not root, no loop support).
    fn attach(file: &Path, bs: u32) -> Option<Loop> {
        let out = Command::new("losetup")
            .args(["-f", "--show", "-b", &bs.to_string()])
            .arg(file)
            .output()
            .ok()?;
        if !out.status.success() {
            eprintln!(
                "losetup refused: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            );
            return None;
        }
        let dev = String::from_utf8_lossy(&out.stdout).trim().to_string();
        (!dev.is_empty()).then(|| Loop(PathBuf::from(dev)))
    }
}

impl Drop for Loop {
    fn drop(&mut self) {
        let _ = Command::new("losetup").arg("-d").arg(&self.0).status();
    }
}

fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .map(|l| l.split_whitespace().nth(2) == Some("0"))
        })
        .unwrap_or(false)
}

fn suites_pass_on_loop(bs: u32) {
    require_tool("iscsi-test-cu", "libiscsi-bin");
    if !is_root() {
        eprintln!("skipping: attaching a loop device needs root");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join(format!("loop{bs}.img"));
    std::fs::File::create(&img)
        .unwrap()
        .set_len(128 << 20)
        .unwrap();
    let Some(lo) = Loop::attach(&img, bs) else {
        eprintln!("skipping: no loop device could be attached");
        return;
    };
    let dev = Device::blockio("loop", &lo.0)
        .set("blocksize", bs)
        .set("thin_provisioned", true);
    let mut f = start(dir.path(), &[dev]);
    let url = format!("iscsi://{}/{IQN}/0", f.addr);
    let run = run_cu_suites(&mut f, &url, SUITES, &format!("bs {bs} "));
    drop(f);
    drop(lo);
    assert!(
        run.failures.is_empty(),
        "bs {bs}: {} failures:\n{}",
        run.failures.len(),
        run.failures.join("\n")
    );
    let passed = run.passed;
    assert!(passed > 80, "only {passed} tests passed");
}

#[test]
fn blockio_on_a_loop_device_passes_the_scsi_suites_512() {
    suites_pass_on_loop(512);
}

#[test]
fn blockio_on_a_loop_device_passes_the_scsi_suites_4096() {
    suites_pass_on_loop(4096);
}
