//! Online resize: the image of a fileio LUN grows under a running ferrited;
//! after `ferritectl set /devices/NAME/resync_size 1` the next command of a
//! session gets CAPACITY DATA HAS CHANGED (UNIT ATTENTION 2Ah/09h), READ
//! CAPACITY reports the new size, and the new blocks are usable.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed step is a failed test

mod backend_util;

use std::process::Command;
use std::time::Duration;

use backend_util::*;
use ferrite_tests::{ferrited_path, run_with_timeout};

const MIB: u64 = 1 << 20;

fn ferritectl(f: &ferrite_tests::Ferrited, args: &[&str]) -> String {
    let bin = ferrited_path().with_file_name("ferritectl");
    assert!(
        bin.exists(),
        "{} not found: build it (cargo build --bin ferritectl, same profile)",
        bin.display()
    );
    let out = run_with_timeout(
        Command::new(bin)
            .arg("--socket")
            .arg(f.control())
            .args(args),
        Duration::from_secs(30),
    );
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "ferritectl {args:?} failed: {text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    text
}

#[test]
fn a_grown_image_is_reported_after_resync_size() {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("grow.img");
    let dev = Device::fileio("grow", &img, 8 * MIB);
    let other = Device::mem("other", 8388608);
    let f = start(dir.path(), &[dev, other]);
    let (l, l1) = (lun(0), lun(1));
    let mut i = login(f.addr, "resize", 1);
    assert_eq!(geometry(&mut i, l), (512, 8 * MIB / 512));
    clear_ua(&mut i, l1);

    let ls = ferritectl(&f, &["ls", "/devices/grow"]);
    assert!(
        ls.lines().any(|e| e.trim() == "resync_size"),
        "no resync_size in:\n{ls}"
    );

    std::fs::OpenOptions::new()
        .write(true)
        .open(&img)
        .unwrap()
        .set_len(24 * MIB)
        .unwrap();
    // Not resynced yet: the old size, and a write past it is refused.
    let r = read_capacity(&mut i, l);
    assert_eq!(r.status, 0, "{r:?}");
    assert_eq!(capacity_of(&r.data).1, 8 * MIB / 512);
    let past = 16 * MIB / 512;
    let r = run(
        &mut i,
        l,
        &rw16(true, past, 8, false),
        &pattern(past, 8, 512, 1),
        0,
    );
    assert_check(&r, 0x5, 0x21, 0x00, "write past the old capacity");

    ferritectl(&f, &["set", "/devices/grow/resync_size", "1"]);

    // SBC-4 §4.9 / SPC-4 §5.14: the next command gets the unit attention.
    let r = read_capacity(&mut i, l);
    assert_check(&r, 0x6, 0x2a, 0x09, "first command after the resize");
    let r = read_capacity(&mut i, l);
    assert_eq!(r.status, 0, "{r:?}");
    assert_eq!(
        capacity_of(&r.data).1,
        24 * MIB / 512,
        "new capacity not reported"
    );
    // The other LUN saw no change.
    let r = read_capacity(&mut i, l1);
    assert_eq!(r.status, 0, "unit attention leaked to another LUN: {r:?}");

    let r = run(
        &mut i,
        l,
        &rw16(true, past, 8, false),
        &pattern(past, 8, 512, 1),
        0,
    );
    assert_eq!(r.status, 0, "write in the grown part: {r:?}");
    let r = run(&mut i, l, &rw16(false, past, 8, false), &[], 4096);
    assert!(
        r.status == 0 && r.data == pattern(past, 8, 512, 1),
        "read in the grown part"
    );

    // A second session logged in after the resize sees the new size at once.
    let mut j = login(f.addr, "resize-2", 2);
    assert_eq!(geometry(&mut j, l), (512, 24 * MIB / 512));
    j.logout(0).expect("logout");
    i.logout(0).expect("logout");
}
