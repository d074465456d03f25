//! Backend failures reach the initiator as the sense data SPC-4/SBC-4
//! prescribe, and harm no one else: injected faults (the `fault` section of
//! a device, `ferrite_nullio::fault`) and a backing file that really
//! vanishes under a fileio LUN. After each failure the same session keeps
//! working on the other LUNs and on the healthy LBAs of the same LUN.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed step is a failed test

mod backend_util;

use std::net::TcpStream;
use std::time::{Duration, Instant};

use backend_util::*;
use ferrite_iscsi::initiator::Initiator;
use serde_json::json;

// Sense keys (SPC-4 §4.5.6).
const NOT_READY: u8 = 0x2;
const MEDIUM_ERROR: u8 = 0x3;
const DATA_PROTECT: u8 = 0x7;

fn read(
    i: &mut Initiator<TcpStream>,
    l: u64,
    lba: u64,
    blocks: u32,
) -> ferrite_iscsi::initiator::ScsiResult {
    run(i, l, &rw16(false, lba, blocks, false), &[], blocks * 512)
}

fn write(
    i: &mut Initiator<TcpStream>,
    l: u64,
    lba: u64,
    blocks: u32,
    stamp: u64,
) -> ferrite_iscsi::initiator::ScsiResult {
    run(
        i,
        l,
        &rw16(true, lba, blocks, false),
        &pattern(lba, blocks as u64, 512, stamp),
        0,
    )
}

/// A write and a read-back of the healthy LUN `l` at `lba`.
fn witness(i: &mut Initiator<TcpStream>, l: u64, lba: u64, stamp: u64) {
    let r = write(i, l, lba, 8, stamp);
    assert_eq!(r.status, 0, "witness write on LUN {}: {r:?}", l >> 48);
    let r = read(i, l, lba, 8);
    assert_eq!(r.status, 0, "witness read on LUN {}: {r:?}", l >> 48);
    assert!(r.data == pattern(lba, 8, 512, stamp), "witness data wrong");
}

#[test]
fn injected_faults_give_the_exact_sense_and_harm_no_one_else() {
    let dir = tempfile::tempdir().unwrap();
    let faulty = Device::mem("faulty", 16777216).set(
        "fault",
        json!({ "rules": [
            { "op": "read", "lba": 100, "blocks": 8, "error": "eio" },
            { "op": "write", "lba": 200, "blocks": 8, "error": "eio" },
            { "op": "write", "lba": 300, "blocks": 8, "error": "enospc" },
            { "op": "write", "lba": 400, "blocks": 8, "delay_ms": 300 },
            { "op": "read", "lba": 500, "blocks": 1, "error": "eio", "after": 1, "count": 1 }
        ] }),
    );
    let gone =
        Device::mem("gone", 16777216).set("fault", json!({ "rules": [ { "error": "offline" } ] }));
    let healthy = Device::mem("healthy", 16777216);
    // The faulty device behind a fileio image too: injection wraps any backend.
    let file = Device::fileio("faultyfile", &dir.path().join("faultyfile.img"), 16777216).set(
        "fault",
        json!({ "rules": [ { "op": "write", "lba": 10, "blocks": 1, "error": "eio" } ] }),
    );
    let mut f = start(dir.path(), &[faulty, gone, healthy, file]);
    let (l0, l1, l2, l3) = (lun(0), lun(1), lun(2), lun(3));
    let mut i = login(f.addr, "faults", 1);
    for l in [l0, l1, l2, l3] {
        clear_ua(&mut i, l);
    }
    witness(&mut i, l2, 0, 1);

    // EIO on a read: MEDIUM ERROR, UNRECOVERED READ ERROR (11h/00h).
    assert_check(
        &read(&mut i, l0, 96, 8),
        MEDIUM_ERROR,
        0x11,
        0x00,
        "read over the EIO range",
    );
    assert_eq!(
        read(&mut i, l0, 92, 8).status,
        0,
        "read before the EIO range"
    );
    assert_eq!(
        write(&mut i, l0, 100, 8, 2).status,
        0,
        "writes pass the read-only rule"
    );
    witness(&mut i, l2, 8, 2);

    // EIO on a write: MEDIUM ERROR, WRITE ERROR (0Ch/00h).
    assert_check(
        &write(&mut i, l0, 200, 1, 3),
        MEDIUM_ERROR,
        0x0c,
        0x00,
        "write in the EIO range",
    );
    assert_eq!(
        read(&mut i, l0, 200, 8).status,
        0,
        "reads pass the write rule"
    );
    assert_check(
        &write(&mut i, l3, 10, 1, 3),
        MEDIUM_ERROR,
        0x0c,
        0x00,
        "write EIO on fileio",
    );
    assert_eq!(write(&mut i, l3, 11, 1, 3).status, 0);
    witness(&mut i, l2, 16, 3);

    // ENOSPC: DATA PROTECT, SPACE ALLOCATION FAILED WRITE PROTECT (27h/07h).
    assert_check(
        &write(&mut i, l0, 304, 8, 4),
        DATA_PROTECT,
        0x27,
        0x07,
        "write in the ENOSPC range",
    );
    assert_eq!(
        read(&mut i, l0, 300, 8).status,
        0,
        "reads pass the ENOSPC rule"
    );
    witness(&mut i, l2, 24, 4);

    // Vanished backing store: NOT READY (04h/00h) for every operation.
    assert_check(
        &read(&mut i, l1, 0, 1),
        NOT_READY,
        0x04,
        0x00,
        "read of an offline LUN",
    );
    assert_check(
        &write(&mut i, l1, 0, 1, 5),
        NOT_READY,
        0x04,
        0x00,
        "write to an offline LUN",
    );
    assert_check(
        &run(&mut i, l1, &sync16(), &[], 0),
        NOT_READY,
        0x04,
        0x00,
        "SYNCHRONIZE CACHE of an offline LUN",
    );
    witness(&mut i, l2, 32, 5);

    // A delay: the write completes, no sooner than asked, and sticks.
    let t = Instant::now();
    assert_eq!(write(&mut i, l0, 400, 8, 6).status, 0, "delayed write");
    assert!(
        t.elapsed() >= Duration::from_millis(300),
        "the delay was not applied"
    );
    let r = read(&mut i, l0, 400, 8);
    assert!(
        r.status == 0 && r.data == pattern(400, 8, 512, 6),
        "delayed write lost"
    );

    // after/count: the first read passes, the second fails, the third passes.
    assert_eq!(read(&mut i, l0, 500, 1).status, 0);
    assert_check(
        &read(&mut i, l0, 500, 1),
        MEDIUM_ERROR,
        0x11,
        0x00,
        "second read of LBA 500",
    );
    assert_eq!(read(&mut i, l0, 500, 1).status, 0);

    // The faulty LUN still works outside its ranges, and so does a second session.
    let r = write(&mut i, l0, 1000, 8, 7);
    assert_eq!(r.status, 0);
    let mut j = login(f.addr, "faults-2", 2);
    clear_ua(&mut j, l0);
    clear_ua(&mut j, l2);
    let r = read(&mut j, l0, 1000, 8);
    assert!(r.status == 0 && r.data == pattern(1000, 8, 512, 7));
    witness(&mut j, l2, 40, 8);
    j.logout(0).expect("logout");
    i.logout(0).expect("logout");
    assert!(f.alive());
    let log = f.wait_log("fault injection", 1);
    assert!(!log.contains("panicked"), "a panic:\n{log}");
    assert!(
        log.contains("fault injection"),
        "no log line for fault injection:\n{log}"
    );
}

#[test]
fn a_backing_file_that_vanishes_takes_its_lun_offline_only() {
    let dir = tempfile::tempdir().unwrap();
    let dev = |name: &str| Device::fileio(name, &dir.path().join(format!("{name}.img")), 8388608);
    let mut f = start(
        dir.path(),
        &[dev("deleted"), dev("truncated"), dev("healthy")],
    );
    let (l0, l1, l2) = (lun(0), lun(1), lun(2));
    let mut i = login(f.addr, "vanish", 1);
    for l in [l0, l1, l2] {
        clear_ua(&mut i, l);
        witness(&mut i, l, 16, 1);
    }

    // Deleted under the LUN: the open descriptor still reads the old inode,
    // but SYNCHRONIZE CACHE cannot make anything durable any more. The LUN
    // goes offline there, and stays offline.
    std::fs::remove_file(dir.path().join("deleted.img")).unwrap();
    assert_check(
        &run(&mut i, l0, &sync16(), &[], 0),
        NOT_READY,
        0x04,
        0x00,
        "SYNCHRONIZE CACHE of a deleted file",
    );
    assert_check(
        &read(&mut i, l0, 16, 8),
        NOT_READY,
        0x04,
        0x00,
        "read of a deleted file",
    );
    assert_check(
        &write(&mut i, l0, 16, 8, 2),
        NOT_READY,
        0x04,
        0x00,
        "write to a deleted file",
    );
    witness(&mut i, l2, 32, 2);

    // Truncated under the LUN: a read past the new end finds a short file
    // and takes the LUN offline instead of inventing zeroes.
    let t = std::fs::OpenOptions::new()
        .write(true)
        .open(dir.path().join("truncated.img"))
        .unwrap();
    t.set_len(4 << 20).unwrap();
    assert_check(
        &read(&mut i, l1, (6 << 20) / 512, 8),
        NOT_READY,
        0x04,
        0x00,
        "read past a truncation",
    );
    assert_check(
        &read(&mut i, l1, 16, 8),
        NOT_READY,
        0x04,
        0x00,
        "read of a truncated file",
    );
    witness(&mut i, l2, 48, 3);

    let log = f.wait_log("backing store vanished", 2);
    assert!(
        log.contains("backing store vanished") && log.contains("deleted"),
        "no log line for the deleted file:\n{log}"
    );
    assert!(
        log.contains("truncated to 4194304 bytes"),
        "no log line for the truncation:\n{log}"
    );
    assert_eq!(
        log.matches("backing store vanished").count(),
        2,
        "one log line per vanished device:\n{log}"
    );
    i.logout(0).expect("logout");
    assert!(f.alive());
}

/// The `fault` section is checked like the rest of a configuration: each
/// mistake is named with its JSON path; a good section is accepted.
#[test]
fn fault_sections_are_validated() {
    let bin = ferrite_tests::ferrited_path().with_file_name("ferritectl");
    assert!(
        bin.exists(),
        "{} not found: build ferritectl",
        bin.display()
    );
    let dir = tempfile::tempdir().unwrap();
    let check = |rules: &str| {
        let p = dir.path().join("c.json");
        std::fs::write(
            &p,
            format!(
                r#"{{ "devices": [ {{ "name": "d", "handler": "vdisk_nullio", "size": 1048576, "fault": {{ "rules": [ {rules} ] }} }} ] }}"#
            ),
        )
        .unwrap();
        let out = ferrite_tests::run_with_timeout(
            std::process::Command::new(&bin).arg("check").arg(&p),
            Duration::from_secs(30),
        );
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned()
                + &String::from_utf8_lossy(&out.stderr),
        )
    };
    for (rules, at) in [
        ("", "devices[0].fault.rules"),
        (r#"{ "op": "read" }"#, "devices[0].fault.rules[0]"),
        (r#"{ "op": "read", "error": "enospc" }"#, "rules[0].error"),
        (r#"{ "error": "eio", "blocks": 0 }"#, "rules[0].blocks"),
        (r#"{ "delay_ms": 60001 }"#, "rules[0].delay_ms"),
        (r#"{ "error": "eio", "count": 0 }"#, "rules[0].count"),
        (r#"{ "error": "eio", "lba": 1, "colour": "red" }"#, "colour"),
        (r#"{ "error": "ebusy" }"#, "ebusy"),
    ] {
        let (ok, text) = check(rules);
        assert!(!ok, "accepted {rules}: {text}");
        assert!(
            text.contains(at),
            "{rules}: error does not name {at}: {text}"
        );
    }
    let (ok, text) = check(
        r#"{ "op": "write", "lba": 8, "blocks": 8, "error": "enospc", "after": 2, "count": 1 },
           { "op": "flush", "error": "offline" }, { "op": "any", "delay_ms": 5 }"#,
    );
    assert!(ok, "a good fault section refused: {text}");
}

/// The same on blockio over a file (O_DIRECT): deleting the image takes the
/// LUN offline at the next SYNCHRONIZE CACHE, with its log line.
#[test]
fn a_deleted_blockio_image_takes_its_lun_offline_only() {
    let Some(dir) = direct_io_dir() else {
        eprintln!("skipping: no directory here accepts O_DIRECT");
        return;
    };
    let img = dir.path().join("direct.img");
    std::fs::File::create(&img)
        .unwrap()
        .set_len(8 << 20)
        .unwrap();
    let dev = Device::blockio("direct", &img);
    let healthy = Device::mem("healthy", 8388608);
    let mut f = start(dir.path(), &[dev, healthy]);
    let (l0, l1) = (lun(0), lun(1));
    let mut i = login(f.addr, "vanish-direct", 1);
    for l in [l0, l1] {
        clear_ua(&mut i, l);
        witness(&mut i, l, 16, 1);
    }
    std::fs::remove_file(&img).unwrap();
    assert_check(
        &run(&mut i, l0, &sync16(), &[], 0),
        NOT_READY,
        0x04,
        0x00,
        "SYNCHRONIZE CACHE of a deleted O_DIRECT image",
    );
    assert_check(
        &write(&mut i, l0, 16, 8, 2),
        NOT_READY,
        0x04,
        0x00,
        "write to a deleted O_DIRECT image",
    );
    witness(&mut i, l1, 32, 2);
    let log = f.wait_log("backing store vanished", 1);
    assert!(
        log.contains("backing store vanished") && log.contains("direct.img"),
        "no log line for the deleted image:\n{log}"
    );
    i.logout(0).expect("logout");
    assert!(f.alive());
}
