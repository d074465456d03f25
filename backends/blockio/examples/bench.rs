//! 4 KiB random reads at a fixed queue depth through one backend queue, on
//! one thread, either busy-polling or sleeping on the queue eventfd when idle
//! (the two ends of a reactor's poll window). Prints IOPS for the
//! blockio (O_DIRECT) and fileio (page cache) backends on the same file.
//!
//! Usage: `cargo run --release -p ferrite-blockio --example bench --
//! [PATH] [SIZE_MIB] [SECONDS] [QD]` (defaults: /dev/shm/ferrite-bench, 256,
//! 5, 32). The file is created and filled if it is missing or too small.
//! Compare with:
//! `fio --name=r --filename=PATH --ioengine=io_uring --direct=1 --rw=randread
//! --bs=4k --iodepth=32 --runtime=5 --time_based --size=256M`.

use std::error::Error;
use std::fs::OpenOptions;
use std::io::{Seek, SeekFrom};
use std::os::unix::fs::{FileExt, FileTypeExt};
use std::time::{Duration, Instant};

use ferrite_blockio::{BlockBackend, BlockOptions};
use ferrite_core::backend::{Backend, BackendQueue, BlockDone, BlockOp};
use ferrite_fileio::{FileBackend, FileOptions};
use ferrite_nullio::integrity::Rng;
use ferrite_reactor::blockring;
use ferrite_reactor::buf::BufPool;

/// Runs one measurement. With `sleep`, a poll that finds nothing blocks on
/// the queue's eventfd (a reactor with no poll window); otherwise it spins.
fn bench(name: &str, q: &mut dyn BackendQueue, blocks: u64, secs: u64, qd: usize, sleep: bool) {
    let pool = BufPool::new(4096, qd * 2);
    let mut rng = Rng::new(42);
    let mut done: Vec<BlockDone> = Vec::with_capacity(qd);
    let mut completed = 0u64;
    let mut errors = 0u64;
    let mut tag = 0u64;
    let start = Instant::now();
    let end = start + Duration::from_secs(secs);
    let mut polls = 0u64;
    let mut stop = false;
    loop {
        if polls.is_multiple_of(64) && Instant::now() >= end {
            stop = true;
        }
        while !stop && q.in_flight() < qd {
            let off = rng.range(0, blocks - 1) * 4096;
            tag += 1;
            if q.submit(
                tag,
                BlockOp::Read {
                    offset: off,
                    buf: pool.sg(4096),
                },
            )
            .is_err()
            {
                break;
            }
        }
        if stop && q.in_flight() == 0 {
            break;
        }
        done.clear();
        q.poll(&mut done);
        polls += 1;
        if sleep
            && done.is_empty()
            && let Some(fd) = q.notify_fd()
        {
            let _ = blockring::wait_readable(fd, Duration::from_millis(100));
        }
        for d in &done {
            if d.result.is_ok() {
                completed += 1;
            } else {
                errors += 1;
            }
        }
    }
    let el = start.elapsed().as_secs_f64();
    println!(
        "{name:22} 4KiB randread QD{qd}: {:>9.0} IOPS  ({completed} reads in {el:.2}s, {errors} errors)",
        completed as f64 / el
    );
}

fn main() -> Result<(), Box<dyn Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let path = args
        .first()
        .cloned()
        .unwrap_or("/dev/shm/ferrite-bench".into());
    let mib: u64 = args.get(1).map_or(Ok(256), |s| s.parse())?;
    let secs: u64 = args.get(2).map_or(Ok(5), |s| s.parse())?;
    let qd: usize = args.get(3).map_or(Ok(32), |s| s.parse())?;
    let size = mib << 20;

    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)?;
    // The end of a block device is its size (its metadata says 0).
    let is_device = f.metadata()?.file_type().is_block_device();
    let have = (&f).seek(SeekFrom::End(0))?;
    if have < size {
        let chunk = vec![0x5au8; 1 << 20];
        for i in 0..mib {
            f.write_all_at(&chunk, i << 20)?;
        }
        f.sync_all()?;
    }
    drop(f);

    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    println!(
        "file {path} ({mib} MiB), {secs}s per run, one thread; kernel {}, {cpus} CPUs",
        kernel.trim()
    );

    let b = BlockBackend::open(
        &path,
        BlockOptions {
            block_size: Some(4096),
            ..BlockOptions::default()
        },
    )?;
    let blocks = b.geometry().num_blocks;
    for (batch, sleep) in [(true, false), (true, true), (false, false)] {
        let mode = match (batch, sleep) {
            (true, false) => "batched spin",
            (true, true) => "batched sleep",
            _ => "eager spin",
        };
        let mut q = b.open_uring_queue(qd as u32)?;
        q.set_batch_submit(batch);
        bench(&format!("blockio {mode}"), &mut q, blocks, secs, qd, sleep);
    }

    if is_device {
        println!("fileio skipped: {path} is a block device");
        return Ok(());
    }
    let f = FileBackend::open(
        &path,
        FileOptions {
            block_size: 4096,
            ..FileOptions::default()
        },
    )?;
    for (batch, sleep) in [(true, false), (true, true), (false, false)] {
        let mode = match (batch, sleep) {
            (true, false) => "batched spin",
            (true, true) => "batched sleep",
            _ => "eager spin",
        };
        let mut q = f.open_uring_queue(qd as u32)?;
        q.set_batch_submit(batch);
        bench(&format!("fileio {mode}"), &mut q, blocks, secs, qd, sleep);
    }
    Ok(())
}
