//! libiscsi's iSCSI family with header digests really on. libiscsi 1.19
//! offers `HeaderDigest=None,CRC32C` (with or without `?header_digest=crc32c`
//! in the URL), so against a target that accepts None (the default) it runs
//! without digests (`iscsi_conformance.rs`). Here ferrited accepts only
//! CRC32C for headers (`iscsi.header_digests`, RFC 7143 §13.1), so every
//! session of the run carries a CRC32C on every PDU header, and the family
//! passes with zero failures.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed step is a failed test

use std::path::{Path, PathBuf};

use ferrite_tests::{
    Config, Device, Ferrited, Options, Target, free_port, require_tool, run_cu_suites,
};

const T: &str = "iqn.2026-11.org.ferrite:header-digests";

fn config(dir: &Path, port: u16) -> PathBuf {
    Config::new()
        .device(Device::fileio("disk0", &dir.join("disk0.img"), 67108864))
        .iscsi("header_digests", ["crc32c"])
        .target(
            Target::new(T)
                .set("enabled", true)
                .portal(format!("127.0.0.1:{port}"))
                .lun(0, "disk0"),
        )
        .write_private(dir.join("header-digests.json"))
}

#[test]
fn iscsi_family_passes_with_header_digests_enforced() {
    require_tool("iscsi-test-cu", "libiscsi-bin");
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let mut f = Ferrited::start(
        dir.path(),
        port,
        Options {
            config: Some(config(dir.path(), port)),
            args: Vec::new(),
        },
    );
    let url = f.url(T, 0);

    let run = run_cu_suites(
        &mut f,
        &format!("{url}?header_digest=crc32c"),
        &["iSCSI"],
        "header digests on: ",
    );
    assert!(
        run.failures.is_empty(),
        "failures:\n{}\n--- ferrited log ---\n{}",
        run.failures.join("\n"),
        f.log_text()
    );
    assert!(run.passed >= 10, "only {} tests ran", run.passed);
}
