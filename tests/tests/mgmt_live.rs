//! Live changes under I/O: while the project's initiator writes and reads
//! back on LUN 0, another LUN of the same target is added, resized and
//! removed 20 times (its fileio device created and deleted each time). The running
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

/// Like [`with_ua_retry`] but a transport failure is an error value.
fn try_with_ua_retry(
    i: &mut Initiator<TcpStream>,
    cdb: &[u8],
    read_len: u32,
    write: &[u8],
    uas: &mut Vec<(u8, u8)>,
) -> Result<ferrite_iscsi::initiator::ScsiResult, String> {
    let c = ferrite_iscsi::initiator::Command {
        lun: 0,
        cdb,
        read_len,
        write,
        attr: 1,
        ..ferrite_iscsi::initiator::Command::default()
    };
    let mut r = i.command(&c).map_err(|e| format!("{e:?}"))?;
    for _ in 0..8 {
        if !is_ua(&r) {
            break;
        }
        uas.push(asc(&r));
        r = i.command(&c).map_err(|e| format!("{e:?}"))?;
    }
    Ok(r)
}

/// How long a unit attention may take to show before the test calls it
/// missing: a bound for a hang, far above what a slow machine needs (the
/// delays seen are reported, not asserted).
const UA_WAIT: Duration = Duration::from_secs(30);

/// A pause of the running I/O this long means a hung nexus, not a slow
/// machine.
const IO_HANG: Duration = Duration::from_secs(10);

/// Polls with TEST UNIT READY on LUN 0 until a unit attention `want`
/// arrives (an initiator learns of LUN changes this way); returns the
/// unit attentions seen, or None after `limit`.
fn wait_for_ua(
    i: &mut Initiator<TcpStream>,
    want: (u8, u8),
    limit: Duration,
) -> (Option<Duration>, Vec<(u8, u8)>) {
    let t0 = Instant::now();
    let mut seen = Vec::new();
    while t0.elapsed() < limit {
        let r = scsi(i, 0, &[0u8; 6], 0, &[]);
        if is_ua(&r) {
            seen.push(asc(&r));
            if asc(&r) == want {
                return (Some(t0.elapsed()), seen);
            }
            continue;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    (None, seen)
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
        let w = match try_with_ua_retry(&mut i, &cdb, 0, &data, &mut rep.uas) {
            Ok(w) => w,
            Err(e) => {
                rep.errors.push(format!("WRITE lba {lba}: {e}"));
                break;
            }
        };
        if w.status != 0 {
            rep.errors.push(format!("WRITE lba {lba}: {w:?}"));
            continue;
        }
        rep.done.push(Instant::now());
        cdb[0] = 0x28; // READ(10)
        let r = match try_with_ua_retry(&mut i, &cdb, 4096, &[], &mut rep.uas) {
            Ok(r) => r,
            Err(e) => {
                rep.errors.push(format!("READ lba {lba}: {e}"));
                break;
            }
        };
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
    // Time from ferritectl's return to the unit attention reaching the
    // observer: the change is carried out asynchronously by the cores.
    let mut ua_delays: Vec<Duration> = Vec::new();
    for round in 0..ROUNDS {
        let size0: u64 = (16 + round) << 20;
        let size1: u64 = size0 + (4 << 20);
        // A fileio device: ferrited resizes its file (`size`) or re-reads a
        // file grown behind its back (`resync_size`), on alternate rounds.
        let c1 = d.join(format!("c1-{round}.img"));
        std::fs::File::create(&c1).unwrap().set_len(size0).unwrap();
        f.ok(&[
            "do",
            "/handlers/vdisk_fileio/mgmt",
            "add_device",
            "c1",
            &format!("filename={}", c1.display()),
        ]);
        f.ok(&["do", &luns, "add c1 1"]);
        // The observer learns of the new LUN from the unit attention.
        let (after, uas) = wait_for_ua(&mut obs, REPORTED_LUNS_CHANGED, UA_WAIT);
        obs_uas.extend(&uas);
        match after {
            Some(t) => ua_delays.push(t),
            None => problems.push(format!(
                "round {round}: no REPORTED LUNS DATA HAS CHANGED within {UA_WAIT:?} of adding LUN 1 (saw {uas:02x?})"
            )),
        }
        assert_eq!(
            report_luns(&mut obs),
            [0, 1],
            "round {round}: LUN 1 not reported"
        );
        let mut uas = Vec::new();
        let got = capacity(&mut obs, 1, &mut uas);
        obs_uas.extend(&uas);
        if got != size0 {
            problems.push(format!("round {round}: LUN 1 has {got} bytes, not {size0}"));
        }

        if round % 2 == 0 {
            f.ok(&["set", "/devices/c1/size", &size1.to_string()]);
        } else {
            std::fs::OpenOptions::new()
                .write(true)
                .open(&c1)
                .unwrap()
                .set_len(size1)
                .unwrap();
            f.ok(&["set", "/devices/c1/resync_size", "1"]);
        }
        // CAPACITY DATA HAS CHANGED is a unit attention of LUN 1 (SBC-4
        // §4.6): poll READ CAPACITY there until it is reported.
        let t0 = Instant::now();
        let mut seen_cap_ua = false;
        let mut got = 0;
        while t0.elapsed() < UA_WAIT {
            let r = scsi(&mut obs, 1, &[0x25, 0, 0, 0, 0, 0, 0, 0, 0, 0], 8, &[]);
            if is_ua(&r) {
                obs_uas.push(asc(&r));
                if asc(&r) == CAPACITY_CHANGED {
                    seen_cap_ua = true;
                    ua_delays.push(t0.elapsed());
                }
                continue;
            }
            assert_eq!(r.status, 0, "round {round}: READ CAPACITY of LUN 1: {r:?}");
            let last = u64::from(u32::from_be_bytes(r.data[0..4].try_into().unwrap()));
            let bs = u64::from(u32::from_be_bytes(r.data[4..8].try_into().unwrap()));
            got = (last + 1) * bs;
            if seen_cap_ua && got == size1 {
                break;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        if !seen_cap_ua {
            problems.push(format!(
                "round {round}: no CAPACITY DATA HAS CHANGED within {UA_WAIT:?} of the resize"
            ));
        }
        if got != size1 {
            problems.push(format!(
                "round {round}: after the resize LUN 1 has {got} bytes, not {size1}"
            ));
        }

        f.ok(&["do", &luns, "del 1"]);
        let (after, uas) = wait_for_ua(&mut obs, REPORTED_LUNS_CHANGED, UA_WAIT);
        obs_uas.extend(&uas);
        match after {
            Some(t) => ua_delays.push(t),
            None => problems.push(format!(
                "round {round}: no REPORTED LUNS DATA HAS CHANGED within {UA_WAIT:?} of removing LUN 1"
            )),
        }
        assert_eq!(
            report_luns(&mut obs),
            [0],
            "round {round}: LUN 1 still reported"
        );
        f.ok(&["do", "/handlers/vdisk_fileio/mgmt", "del_device c1"]);
        let _ = std::fs::remove_file(&c1);
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
        "{} completions in {elapsed:?}, per second: {per_sec:?}; observer unit attentions: {}, longest delay from change to unit attention: {:?}",
        rep.done.len(),
        obs_uas.len(),
        ua_delays.iter().max()
    );
    // The changes never stop the I/O. The longest gap between completions
    // is reported above; only a gap no slow machine explains, one of a hung
    // nexus, fails the test.
    let mut gap = Duration::ZERO;
    let mut last = started;
    for t in rep.done.iter().copied().chain([started + elapsed]) {
        gap = gap.max(t.saturating_duration_since(last));
        last = t;
    }
    eprintln!("longest gap between completions: {gap:?}");
    assert!(
        gap < IO_HANG,
        "I/O stopped for {gap:?} during the changes: completions per second {per_sec:?}"
    );
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}
