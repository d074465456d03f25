//! The foundation end to end: libiscsi's tools and qemu-img against a
//! ferrited started on a free loopback port.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed step is a failed test

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use ferrite_tests::{
    Config, Device, Ferrited, Options, Target, free_port, require_tool, run_cu_suites,
    run_with_timeout,
};

const DEFAULT_IQN: &str = "iqn.2026-11.org.ferrite:default";

fn stdout(cmd: &mut Command) -> String {
    let out = run_with_timeout(cmd, Duration::from_secs(120));
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}):\n{text}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    text
}

fn sha256(path: &Path) -> String {
    let out = stdout(Command::new("sha256sum").arg(path));
    out.split_whitespace()
        .next()
        .unwrap_or_default()
        .to_string()
}

fn random_file(path: &Path, mib: usize) {
    let status = Command::new("dd")
        .arg("if=/dev/urandom")
        .arg(format!("of={}", path.display()))
        .arg("bs=1M")
        .arg(format!("count={mib}"))
        .arg("status=none")
        .status()
        .expect("dd");
    assert!(status.success());
}

#[test]
fn default_target_is_discovered_with_its_lun_and_size() {
    require_tool("iscsi-ls", "libiscsi-bin");
    let dir = tempfile::tempdir().unwrap();
    let f = Ferrited::start_default(dir.path());
    let out = stdout(
        Command::new("iscsi-ls")
            .arg("-s")
            .arg(format!("iscsi://{}", f.addr)),
    );
    assert!(
        out.contains(&format!("Target:{DEFAULT_IQN} Portal:{},1", f.addr)),
        "target or portal missing:\n{out}"
    );
    // 1 GiB image, 512-byte blocks: libiscsi prints the size from the last LBA.
    assert!(
        out.contains("Lun:0") && out.contains("Type:DIRECT_ACCESS (Size:1023M)"),
        "LUN 0 with its size missing:\n{out}"
    );
    // the image was created sparse under the state directory
    let img = dir.path().join("disk0.img");
    let meta = std::fs::metadata(&img).expect("default image created");
    assert_eq!(meta.len(), 1 << 30);
}

#[test]
fn inquiry_and_capacity_of_lun0() {
    require_tool("iscsi-inq", "libiscsi-bin");
    let dir = tempfile::tempdir().unwrap();
    let f = Ferrited::start_default(dir.path());
    let url = f.url(DEFAULT_IQN, 0);
    let inq = stdout(Command::new("iscsi-inq").arg(&url));
    assert!(
        inq.contains("Peripheral Device Type:DIRECT_ACCESS"),
        "{inq}"
    );
    assert!(inq.contains("Vendor:FERRITE"), "vendor:\n{inq}");
    assert!(inq.contains("CmdQue:1"), "{inq}");
    let serial = stdout(
        Command::new("iscsi-inq")
            .arg("-e")
            .arg("1")
            .arg("-c")
            .arg("0x80")
            .arg(&url),
    );
    assert!(serial.to_lowercase().contains("serial"), "{serial}");
    let rc = stdout(Command::new("iscsi-readcapacity16").arg(&url));
    assert!(
        rc.contains("RETURNED LOGICAL BLOCK ADDRESS:2097151"),
        "{rc}"
    );
    assert!(rc.contains("LOGICAL BLOCK LENGTH IN BYTES:512"), "{rc}");
    assert!(rc.contains("Total size:1073741824"), "{rc}");
}

/// The suites the foundation must pass with zero failures.
const SUITES: &[&str] = &[
    "SCSI.TestUnitReady",
    "SCSI.Inquiry",
    "SCSI.ReadCapacity10",
    "SCSI.ReadCapacity16",
    "SCSI.Read6",
    "SCSI.Read10",
    "SCSI.Read12",
    "SCSI.Read16",
    "SCSI.Write10",
    "SCSI.Write12",
    "SCSI.Write16",
    "SCSI.Mandatory",
    "iSCSI.iSCSIcmdsn",
    "iSCSI.iSCSIdatasn",
    "iSCSI.iSCSIResiduals",
];

#[test]
fn libiscsi_foundation_suites_pass() {
    let dir = tempfile::tempdir().unwrap();
    let mut f = Ferrited::start_default(dir.path());
    let url = f.url(DEFAULT_IQN, 0);
    let run = run_cu_suites(&mut f, &url, SUITES, "");
    assert!(
        run.failures.is_empty(),
        "{} failures:\n{}",
        run.failures.len(),
        run.failures.join("\n")
    );
    assert!(run.passed > 50, "only {} tests passed", run.passed);
}

fn config_with_fileio(dir: &Path, port: u16, mib: u64) -> std::path::PathBuf {
    Config::new()
        .device(
            Device::fileio("disk0", &dir.join("disk0.img"), mib << 20)
                .set("thin_provisioned", true),
        )
        .target(
            Target::new(DEFAULT_IQN)
                .portal(format!("127.0.0.1:{port}"))
                .lun(0, "disk0"),
        )
        .write(dir.join("ferrite.json"))
}

#[test]
fn qemu_img_round_trip_64mib() {
    require_tool("qemu-img", "qemu-utils");
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let cfg = config_with_fileio(dir.path(), port, 64);
    let f = Ferrited::start(
        dir.path(),
        port,
        Options {
            config: Some(cfg),
            ..Options::default()
        },
    );
    let src = dir.path().join("src.bin");
    let back = dir.path().join("back.bin");
    random_file(&src, 64);
    let url = f.url(DEFAULT_IQN, 0);
    stdout(
        Command::new("qemu-img")
            .args(["convert", "-n", "-f", "raw", "-O", "raw"])
            .arg(&src)
            .arg(&url),
    );
    stdout(
        Command::new("qemu-img")
            .args(["convert", "-f", "raw", "-O", "raw"])
            .arg(&url)
            .arg(&back),
    );
    assert_eq!(std::fs::metadata(&back).unwrap().len(), 64 << 20);
    assert_eq!(sha256(&src), sha256(&back), "data read back differs");
}

#[test]
fn writes_survive_a_restart() {
    require_tool("qemu-img", "qemu-utils");
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let src = dir.path().join("src.bin");
    let back = dir.path().join("back.bin");
    random_file(&src, 8);
    {
        let mut f = Ferrited::start(dir.path(), port, Options::default());
        stdout(
            Command::new("qemu-img")
                .args(["convert", "-n", "-f", "raw", "-O", "raw"])
                .arg(&src)
                .arg(f.url(DEFAULT_IQN, 0)),
        );
        assert!(
            f.stop(),
            "ferrited did not stop on SIGTERM:\n{}",
            f.log_text()
        );
        let log = f.wait_log("stopped", 1);
        assert!(log.contains("stopped"), "no clean shutdown:\n{log}");
    }
    let f = Ferrited::start(dir.path(), port, Options::default());
    stdout(
        Command::new("qemu-img")
            .args(["dd", "-f", "raw", "-O", "raw", "bs=1M", "count=8"])
            .arg(format!("if={}", f.url(DEFAULT_IQN, 0)))
            .arg(format!("of={}", back.display())),
    );
    assert_eq!(sha256(&src), sha256(&back), "data lost across restart");
}
