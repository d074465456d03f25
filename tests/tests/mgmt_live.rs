//! Live changes under I/O: while the project's initiator writes and reads
//! back on LUN 0, another LUN of the same target is added, resized and
//! removed 20 times (its device created and deleted each time). The running
//! I/O sees no error other than the REPORTED LUNS DATA HAS CHANGED unit
//! attention the changes raise on its nexus (retried, as an initiator does),
//! never stops for a whole second, and an observer session on the target
//! sees REPORTED LUNS DATA HAS CHANGED and CAPACITY DATA HAS CHANGED.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed step is a failed test

mod mgmt_util;

use std::net::TcpStream;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use ferrite_iscsi::initiator::Initiator;
use mgmt_util::{Daemon, asc, empty_config, is_ua, login, portal, report_luns, scsi};

const T: &str = "iqn.2026-11.org.ferrite.test:live";
/// SPC-4 Annex D: REPORTED LUNS DATA HAS CHANGED.
const REPORTED_LUNS_CHANGED: (u8, u8) = (0x3f, 0x0e);
/// SPC-4 Annex D: CAPACITY DATA HAS CHANGED.
const CAPACITY_CHANGED: (u8, u8) = (0x2a, 0x09);
const ROUNDS: u64 = 20;

#[derive(Default)]
struct IoReport {
    /// Completion times of the commands that succeeded.
    done: Vec<Instant>,
    /// Unit attentions retried.
    uas: Vec<(u8, u8)>,
    /// Anything else: a failure.
    errors: Vec<String>,
}

/// A command, retried while it reports a unit attention (at most 8 times in
/// a row). Returns the final result and records the unit attentions.
fn with_ua_retry(
    i: &mut Initiator<TcpStream>,
    lun: u64,
    cdb: &[u8],
    read_len: u32,
    write: &[u8],
    uas: &mut Vec<(u8, u8)>,
) -> ferrite_iscsi::initiator::ScsiResult {
    let mut r = scsi(i, lun, cdb, read_len, write);
    for _ in 0..8 {
        if !is_ua(&r) {
            break;
        }
        uas.push(asc(&r));
        r = scsi(i, lun, cdb, read_len, write);
    }
    r
}

fn io_loop(mut i: Initiator<TcpStream>, stop: Arc<AtomicBool>) -> IoReport {
    let mut rep = IoReport::default();
    let mut n: u32 = 0;
    while !stop.load(Ordering::Relaxed) && rep.errors.len() < 10 {
        let lba = (n % 4096) * 8;
        let fill = (n % 251) as u8;
        let data = vec![fill; 4096];
        let mut cdb = [0u8; 10];
        cdb[0] = 0x2a; // WRITE(10)
        cdb[2..6].copy_from_slice(&lba.to_be_bytes());
        cdb[7..9].copy_from_slice(&8u16.to_be_bytes());
        let w = with_ua_retry(&mut i, 0, &cdb, 0, &data, &mut rep.uas);
        if w.status != 0 {
            rep.errors.push(format!("WRITE lba {lba}: {w:?}"));
            continue;
        }
        rep.done.push(Instant::now());
        cdb[0] = 0x28; // READ(10)
        let r = with_ua_retry(&mut i, 0, &cdb, 4096, &[], &mut rep.uas);
        if r.status != 0 {
            rep.errors.push(format!("READ lba {lba}: {r:?}"));
            continue;
        }
        if r.data != data {
            rep.errors.push(format!("READ lba {lba}: wrong data"));
        }
        rep.done.push(Instant::now());
        n += 1;
    }
    let _ = i.logout(0);
    rep
}

/// READ CAPACITY(10) of `lun` in bytes, unit attentions retried.
fn capacity(i: &mut Initiator<TcpStream>, lun: u64, uas: &mut Vec<(u8, u8)>) -> u64 {
    let r = with_ua_retry(i, lun, &[0x25, 0, 0, 0, 0, 0, 0, 0, 0, 0], 8, &[], uas);
    assert_eq!(r.status, 0, "READ CAPACITY of LUN {lun}: {r:?}");
    let last = u64::from(u32::from_be_bytes(r.data[0..4].try_into().unwrap()));
    let bs = u64::from(u32::from_be_bytes(r.data[4..8].try_into().unwrap()));
    (last + 1) * bs
}

#[test]
fn lun_changes_under_io_pause_nothing_and_raise_the_unit_attentions() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let p = portal();
    let img = d.join("io0.img");
    std::fs::File::create(&img)
        .unwrap()
        .set_len(64 << 20)
        .unwrap();
    let f = Daemon::start(d, &empty_config(d), &[]);
    let luns = format!("/targets/iscsi/{T}/luns/mgmt");
    f.ok(&[
        "do",
        "/handlers/vdisk_fileio/mgmt",
        "add_device",
        "io0",
        &format!("filename={}", img.display()),
    ]);
    f.ok(&[
        "do",
        "/targets/iscsi/mgmt",
        &format!("add_target {T} portals={p}"),
    ]);
    f.ok(&["do", &luns, "add io0 0"]);
    f.ok(&["set", &format!("/targets/iscsi/{T}/enabled"), "1"]);

    let io = login(p, "iqn.2026-11.org.ferrite.test:io", T, 1);
    let mut obs = login(p, "iqn.2026-11.org.ferrite.test:observer", T, 2);
    let stop = Arc::new(AtomicBool::new(false));
    let started = Instant::now();
    let h = {
        let stop = stop.clone();
        std::thread::spawn(move || io_loop(io, stop))
    };
    // Let the I/O run before the first change.
    std::thread::sleep(Duration::from_millis(1500));

    let mut obs_uas: Vec<(u8, u8)> = Vec::new();
    let mut problems: Vec<String> = Vec::new();
    for round in 0..ROUNDS {
        let size0: u64 = (16 + round) << 20;
        let size1: u64 = size0 + (4 << 20);
        f.ok(&[
            "do",
            "/handlers/vdisk_nullio/mgmt",
            &format!("add_device c1 size={size0}"),
        ]);
        f.ok(&["do", &luns, "add c1 1"]);
        let mut uas = Vec::new();
        let got = capacity(&mut obs, 1, &mut uas);
        if got != size0 {
            problems.push(format!("round {round}: LUN 1 has {got} bytes, not {size0}"));
        }
        if !uas.contains(&REPORTED_LUNS_CHANGED) {
            problems.push(format!(
                "round {round}: no REPORTED LUNS DATA HAS CHANGED after the LUN was added (saw {uas:02x?})"
            ));
        }
        obs_uas.extend(&uas);

        f.ok(&["set", "/devices/c1/size", &size1.to_string()]);
        let mut uas = Vec::new();
        let got = capacity(&mut obs, 1, &mut uas);
        if got != size1 {
            problems.push(format!(
                "round {round}: after the resize LUN 1 has {got} bytes, not {size1}"
            ));
        }
        if !uas.contains(&CAPACITY_CHANGED) {
            problems.push(format!(
                "round {round}: no CAPACITY DATA HAS CHANGED after the resize (saw {uas:02x?})"
            ));
        }
        obs_uas.extend(&uas);

        f.ok(&["do", &luns, "del 1"]);
        assert_eq!(
            report_luns(&mut obs),
            [0],
            "round {round}: LUN 1 still reported"
        );
        f.ok(&["do", "/handlers/vdisk_nullio/mgmt", "del_device c1"]);
    }
    // Keep the I/O going a little after the last change.
    std::thread::sleep(Duration::from_millis(1500));
    stop.store(true, Ordering::Relaxed);
    let rep = h.join().expect("I/O thread");
    let elapsed = started.elapsed();

    assert!(
        rep.errors.is_empty(),
        "the running I/O saw errors: {:#?}\n--- ferrited log ---\n{}",
        rep.errors,
        f.log_text()
    );
    let foreign: Vec<&(u8, u8)> = rep
        .uas
        .iter()
        .filter(|u| **u != REPORTED_LUNS_CHANGED)
        .collect();
    assert!(
        foreign.is_empty(),
        "the I/O nexus got unit attentions no change explains: {foreign:02x?}"
    );
    assert!(
        !rep.uas.is_empty(),
        "the I/O nexus never got REPORTED LUNS DATA HAS CHANGED"
    );
    // Completions per one-second interval from start to stop.
    let secs = elapsed.as_secs().max(1) as usize;
    let mut per_sec = vec![0u32; secs];
    for t in &rep.done {
        let s = t.duration_since(started).as_secs() as usize;
        if s < secs {
            per_sec[s] += 1;
        }
    }
    eprintln!(
        "{} completions in {elapsed:?}, per second: {per_sec:?}; observer unit attentions: {}",
        rep.done.len(),
        obs_uas.len()
    );
    assert!(
        per_sec.iter().all(|n| *n > 0),
        "I/O stalled for a whole second: completions per second {per_sec:?}"
    );
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}
