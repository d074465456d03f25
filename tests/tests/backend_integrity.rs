//! Data integrity through the whole target, per backend: several sessions
//! (one thread each, each with 32 commands in flight) write random-size,
//! random-offset, multi-block patterns, some with FUA; then every block of
//! the LUN is read back at queue depth 32 from a fresh session and compared
//! with a model that knows which write last stored each block (never-written
//! blocks read as zeroes). Each backend is run with 512- and 4096-byte
//! logical blocks (two LUNs of one ferrited).
//!
//! Sessions write disjoint regions (the order of overlapping writes from
//! different sessions is not defined); within a session the writes in flight
//! never overlap, so every block's last writer is known.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed step is a failed test

mod backend_util;

use std::path::Path;

use backend_util::*;

const SESSIONS: u64 = 4;
const WRITES_PER_SESSION: u64 = 300;
const MAX_BLOCKS_512: u64 = 256;
const MAX_BLOCKS_4096: u64 = 64;

/// One session's share of the work: `WRITES_PER_SESSION` writes into
/// `[first, first+blocks)`. Returns, per block of the region, the stamp of
/// the last write (0: never written).
fn write_region(
    addr: std::net::SocketAddr,
    l: u64,
    bs: u32,
    first: u64,
    blocks: u64,
    seed: u64,
) -> Vec<u64> {
    let mut i = login(addr, &format!("writer{seed}"), seed as u16);
    clear_ua(&mut i, l);
    let max = if bs == 512 {
        MAX_BLOCKS_512
    } else {
        MAX_BLOCKS_4096
    }
    .min(blocks);
    let mut rng = Rng::new(seed);
    let mut model = vec![0u64; blocks as usize];
    // Ranges in flight, by id (= stamp).
    let mut busy: Vec<(u64, u64, u64)> = Vec::new();
    let mut pipe = Pipe::new(&mut i, l, 32);
    let mut issued = 0u64;
    let mut fua = 0u64;
    while issued < WRITES_PER_SESSION || pipe.in_flight() > 0 {
        while issued < WRITES_PER_SESSION && pipe.has_room() {
            let n = rng.range(1, max);
            let at = rng.range(0, blocks - n);
            if busy.iter().any(|&(_, s, e)| at < e && s < at + n) {
                // Overlaps a write in flight: pick again later.
                break;
            }
            let stamp = (seed << 32) | (issued + 1);
            let lba = first + at;
            let with_fua = rng.range(0, 7) == 0;
            fua += with_fua as u64;
            pipe.send(
                stamp,
                PipeCmd {
                    cdb: rw16(true, lba, n as u32, with_fua).to_vec(),
                    write: pattern(lba, n, bs, stamp),
                    read_len: 0,
                },
            );
            busy.push((stamp, at, at + n));
            issued += 1;
        }
        let (stamp, r) = pipe.next_done();
        assert_eq!(r.status, 0, "WRITE (16) {stamp:#x}: {r:?}");
        let k = busy.iter().position(|b| b.0 == stamp).expect("known write");
        let (_, s, e) = busy.swap_remove(k);
        model[s as usize..e as usize].fill(stamp);
    }
    assert!(fua > 0, "no FUA write was issued");
    drop(pipe);
    i.logout(0).expect("logout");
    model
}

/// Runs the check on LUN `n` of `f`.
fn check_lun(f: &ferrite_tests::Ferrited, n: u16) {
    let l = lun(n);
    let mut i = login(f.addr, "reader", 100 + n);
    let (bs, blocks) = geometry(&mut i, l);
    let per = blocks / SESSIONS;
    let handles: Vec<_> = (0..SESSIONS)
        .map(|s| {
            let addr = f.addr;
            std::thread::spawn(move || {
                write_region(addr, l, bs, s * per, per, s + 1 + 16 * n as u64)
            })
        })
        .collect();
    let mut model = Vec::with_capacity(blocks as usize);
    for h in handles {
        model.extend(h.join().expect("writer thread"));
    }
    model.resize(blocks as usize, 0);
    let written = model.iter().filter(|&&s| s != 0).count();
    assert!(
        written as u64 > blocks / 4,
        "only {written} of {blocks} blocks written"
    );
    let mut checked = 0u64;
    let zero = vec![0u8; bs as usize];
    let mut expect = vec![0u8; bs as usize];
    read_all(
        &mut i,
        l,
        bs,
        0,
        blocks,
        256 * 1024 / bs as u64,
        |at, data| {
            for (k, got) in data.chunks(bs as usize).enumerate() {
                let lba = at + k as u64;
                let stamp = model[lba as usize];
                let want: &[u8] = if stamp == 0 {
                    &zero
                } else {
                    fill_block(&mut expect, lba, stamp);
                    &expect
                };
                if got != want {
                    let head = |b: &[u8]| {
                        (
                            u64::from_le_bytes(b[..8].try_into().unwrap()),
                            u64::from_le_bytes(b[8..16].try_into().unwrap()),
                        )
                    };
                    panic!(
                        "LUN {n} (bs {bs}) LBA {lba}: want write {stamp:#x}, got a block headed (lba, stamp) = {:?}",
                        head(got)
                    );
                }
                checked += 1;
            }
        },
    );
    assert_eq!(checked, blocks);
    eprintln!("LUN {n}: bs {bs}, {blocks} blocks checked, {written} written");
    i.logout(0).expect("logout");
}

fn run_backend(dir: &Path, devices: &[Device]) {
    let f = start(dir, devices);
    for n in 0..devices.len() as u16 {
        check_lun(&f, n);
    }
    let log = f.log_text();
    assert!(!log.contains("panicked"), "a panic:\n{log}");
}

const SIZE: u64 = 32 << 20;

/// Two fileio LUNs in `dir` (512- and 4096-byte blocks), named `name512`
/// and `name4096`.
fn fileio_devices(dir: &Path, name: &str) -> Vec<Device> {
    [512u32, 4096]
        .iter()
        .map(|bs| {
            let img = dir.join(format!("{name}{bs}.img"));
            Device::fileio(&format!("{name}{bs}"), &img, SIZE).set("blocksize", *bs)
        })
        .collect()
}

#[test]
fn fileio_keeps_every_acknowledged_block() {
    let dir = tempfile::tempdir().unwrap();
    run_backend(dir.path(), &fileio_devices(dir.path(), "file"));
}

/// The same on tmpfs, where reads of 128 KiB and more travel as the file's
/// pages spliced into the socket: the read-back (256 KiB per command, split
/// over several Data-In PDUs) checks those bytes too.
#[test]
fn fileio_on_tmpfs_keeps_every_acknowledged_block() {
    let shm = Path::new("/dev/shm");
    if !shm.is_dir() {
        eprintln!("skipping: no /dev/shm");
        return;
    }
    let dir = tempfile::tempdir_in(shm).unwrap();
    run_backend(dir.path(), &fileio_devices(dir.path(), "shm"));
}

#[test]
fn blockio_on_a_file_keeps_every_acknowledged_block() {
    let Some(dir) = direct_io_dir() else {
        eprintln!("skipping: no directory here accepts O_DIRECT");
        return;
    };
    let devs: Vec<Device> = [512u32, 4096]
        .iter()
        .map(|bs| {
            let img = dir.path().join(format!("block{bs}.img"));
            std::fs::File::create(&img).unwrap().set_len(SIZE).unwrap();
            Device::blockio(&format!("block{bs}"), &img).set("blocksize", *bs)
        })
        .collect();
    run_backend(dir.path(), &devs);
}

#[test]
fn nullio_mem_keeps_every_acknowledged_block() {
    let dir = tempfile::tempdir().unwrap();
    let devs: Vec<Device> = [512u32, 4096]
        .iter()
        .map(|bs| {
            Device::nullio(&format!("mem{bs}"), SIZE)
                .set("blocksize", *bs)
                .set("mem", true)
        })
        .collect();
    run_backend(dir.path(), &devs);
}

/// The check can fail: nullio without `mem` acknowledges writes and forgets
/// them, and the read-back must say so.
#[test]
fn the_check_catches_a_device_that_forgets_writes() {
    let dir = tempfile::tempdir().unwrap();
    let dev = Device::nullio("forgetful", 4194304);
    let f = start(dir.path(), &[dev]);
    let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| check_lun(&f, 0)));
    let msg = caught.expect_err("a device that drops writes passed the check");
    let text = msg.downcast_ref::<String>().cloned().unwrap_or_default();
    assert!(
        text.contains("want write"),
        "failed for another reason: {text}"
    );
}
