//! Durability of acknowledged writes across a crash of ferrited: writes with
//! FUA, and separately writes followed by SYNCHRONIZE CACHE, then SIGKILL
//! right after the last status arrived; after a restart every acknowledged
//! block reads back intact. Run on fileio write-back, fileio write-through
//! and blockio.
//!
//! What this proves, honestly: no acknowledged write is lost in the
//! target's own buffers or queues (ferrited answers GOOD only after the
//! backend completed the write). It does not prove the data reached stable
//! storage: a killed process leaves the page cache behind, so the kernel
//! keeps even unsynced data. Power-loss durability (RWF_DSYNC for FUA,
//! fdatasync for SYNCHRONIZE CACHE) is checked at the backend level by the
//! fileio unit tests counting the syncs issued.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed step is a failed test

mod backend_util;

use std::net::TcpListener;
use std::path::Path;
use std::time::{Duration, Instant};

use backend_util::*;
use ferrite_tests::free_port;

const SIZE: u64 = 16 << 20;
const WRITES: u64 = 64;

/// Writes `WRITES` patterns on LUN 0 at queue depth 32 (with FUA, or
/// followed by SYNCHRONIZE CACHE), kills ferrited, restarts it and checks.
fn crash_and_check(dir: &Path, device: Device, fua: bool) {
    let port = free_port();
    let cfg = write_config(dir, port, &[device]);
    let l = lun(0);
    let mut written: Vec<(u64, u64, u64)> = Vec::new(); // (lba, blocks, stamp)
    let bs;
    {
        let mut f = start_with(dir, port, cfg.clone());
        let mut i = login(f.addr, "durable", 1);
        let (b, blocks) = geometry(&mut i, l);
        bs = b;
        let max = 128 * 512 / bs as u64;
        let mut rng = Rng::new(7 + fua as u64);
        {
            let mut pipe = Pipe::new(&mut i, l, 32);
            let mut next = 0u64;
            let mut sent = 0u64;
            while sent < WRITES || pipe.in_flight() > 0 {
                while sent < WRITES && pipe.has_room() {
                    // Disjoint, ascending ranges with gaps.
                    let n = rng.range(1, max);
                    let lba = next + rng.range(0, 16);
                    next = lba + n;
                    assert!(next <= blocks, "ran past the device");
                    let stamp = 0xd00d_0000 + sent;
                    pipe.send(
                        sent,
                        PipeCmd {
                            cdb: rw16(true, lba, n as u32, fua).to_vec(),
                            write: pattern(lba, n, bs, stamp),
                            read_len: 0,
                        },
                    );
                    written.push((lba, n, stamp));
                    sent += 1;
                }
                let (id, r) = pipe.next_done();
                assert_eq!(r.status, 0, "WRITE (16) #{id}: {r:?}");
            }
        }
        if !fua {
            let r = run(&mut i, l, &sync16(), &[], 0);
            assert_eq!(r.status, 0, "SYNCHRONIZE CACHE (16): {r:?}");
        }
        // Right after the last status: no logout, no clean shutdown.
        f.kill();
        assert!(!f.alive());
    }
    wait_port_free(port);
    let f = start_with(dir, port, cfg);
    let mut i = login(f.addr, "durable-after", 2);
    let (bs2, _) = geometry(&mut i, l);
    assert_eq!(bs2, bs);
    for &(lba, n, stamp) in &written {
        let r = run(
            &mut i,
            l,
            &rw16(false, lba, n as u32, false),
            &[],
            (n * bs as u64) as u32,
        );
        assert_eq!(r.status, 0, "READ (16) at {lba}: {r:?}");
        assert!(
            r.data == pattern(lba, n, bs, stamp),
            "acknowledged write {stamp:#x} at LBA {lba} ({n} blocks) lost or torn after SIGKILL"
        );
    }
    i.logout(0).expect("logout");
}

/// Waits (at most 30 s) until `port` can be bound again. The killed
/// process's listening socket can outlive it for a moment: io_uring tears a
/// dead process's ring down asynchronously, and the socket with it.
fn wait_port_free(port: u16) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while TcpListener::bind(("127.0.0.1", port)).is_err() {
        assert!(
            Instant::now() < deadline,
            "port {port} still taken 30 s after SIGKILL"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn fileio(dir: &Path, write_through: bool) -> Device {
    Device::fileio("disk0", &dir.join("disk0.img"), SIZE).set("write_through", write_through)
}

#[test]
fn fileio_write_back_fua_survives_sigkill() {
    let dir = tempfile::tempdir().unwrap();
    crash_and_check(dir.path(), fileio(dir.path(), false), true);
}

#[test]
fn fileio_write_back_sync_cache_survives_sigkill() {
    let dir = tempfile::tempdir().unwrap();
    crash_and_check(dir.path(), fileio(dir.path(), false), false);
}

#[test]
fn fileio_write_through_survives_sigkill() {
    let dir = tempfile::tempdir().unwrap();
    crash_and_check(dir.path(), fileio(dir.path(), true), false);
    let dir = tempfile::tempdir().unwrap();
    crash_and_check(dir.path(), fileio(dir.path(), true), true);
}

#[test]
fn blockio_fua_and_sync_cache_survive_sigkill() {
    for fua in [true, false] {
        let Some(dir) = direct_io_dir() else {
            eprintln!("skipping: no directory here accepts O_DIRECT");
            return;
        };
        let img = dir.path().join("disk0.img");
        std::fs::File::create(&img).unwrap().set_len(SIZE).unwrap();
        let dev = Device::blockio("disk0", &img).set("blocksize", 4096);
        crash_and_check(dir.path(), dev, fua);
    }
}
