//! ferrite-fileio: a backend on a regular file through the page cache, driven
//! by io_uring. Write-back by default (flush = fdatasync, FUA = RWF_DSYNC),
//! write-through when configured.
//!
//! Owns: [`FileBackend`] (open, geometry, capabilities, thin-provisioning
//! probe, resync). Does not own: the per-core io_uring data plane and the
//! file probes it shares with `ferrite-blockio` (`ferrite-blockq`), the
//! ring's unsafe plumbing (`ferrite_reactor::blockring`), nor anything SCSI.
//!
//! Thin provisioning: `Unmap` punches holes (`FALLOC_FL_PUNCH_HOLE |
//! FALLOC_FL_KEEP_SIZE`), probed at open beyond the end of the file so no data
//! is touched; `WriteZeroes` uses `FALLOC_FL_ZERO_RANGE`, or punches a hole on
//! filesystems without it (tmpfs). Both read back as zeroes.

#![forbid(unsafe_code)]

use std::fs::{File, OpenOptions};
use std::os::fd::AsFd;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering;

use ferrite_core::backend::{Backend, BackendError, BackendQueue, Caps, Geometry};
use ferrite_reactor::blockring;

use ferrite_blockq::queue::{QueueConfig, Shared, UnmapVia, UringQueue, ZeroesVia};
use ferrite_blockq::{check_block_size, probe_punch_hole, seek_mapping};

/// How to open a file backend.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FileOptions {
    /// Logical block size: a power of two, 512 to 65536.
    pub block_size: u32,
    /// Create a sparse file of this many bytes if the file does not exist.
    pub create_size: Option<u64>,
    /// Open read-only; writes, unmaps and write-zeroes fail with EROFS.
    pub read_only: bool,
}

impl Default for FileOptions {
    fn default() -> FileOptions {
        FileOptions {
            block_size: 512,
            create_size: None,
            read_only: false,
        }
    }
}

/// A backend on a regular file.
#[derive(Debug)]
pub struct FileBackend {
    path: PathBuf,
    opts: FileOptions,
    shared: Arc<Shared>,
    phys_exp: u8,
    /// Holes can be punched (probed at open).
    punch_hole: bool,
    /// The file lives in memory (tmpfs): reads can hand over its pages in
    /// a pipe without waiting for a device (`BlockOp::ReadPipe`).
    in_memory: bool,
}

fn io_err(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> BackendError {
    let what = what.into();
    move |source| BackendError::Io { what, source }
}

impl FileBackend {
    /// Opens (or with `create_size`, creates sparse) the file at `path`.
    pub fn open(path: impl AsRef<Path>, opts: FileOptions) -> Result<FileBackend, BackendError> {
        let path = path.as_ref().to_path_buf();
        check_block_size(opts.block_size)?;
        let shown = path.display().to_string();
        if let Some(size) = opts.create_size
            && !path.exists()
        {
            if opts.read_only {
                return Err(BackendError::Invalid(format!(
                    "{shown}: cannot create a read-only file"
                )));
            }
            let f = OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&path)
                .map_err(io_err(format!("create {shown}")))?;
            f.set_len(size)
                .map_err(io_err(format!("size {shown} to {size} bytes")))?;
        }
        let file = OpenOptions::new()
            .read(true)
            .write(!opts.read_only)
            .custom_flags(libc::O_CLOEXEC)
            .open(&path)
            .map_err(io_err(format!("open {shown}")))?;
        FileBackend::from_file(path, file, opts)
    }

    /// A backend over an already opened file (`opts.create_size` is ignored).
    pub fn from_file(
        path: PathBuf,
        file: File,
        opts: FileOptions,
    ) -> Result<FileBackend, BackendError> {
        check_block_size(opts.block_size)?;
        let shown = path.display().to_string();
        let md = file.metadata().map_err(io_err(format!("stat {shown}")))?;
        if !md.file_type().is_file() {
            let kind = if md.file_type().is_block_device() {
                "a block device (use blockio)"
            } else {
                "not a regular file"
            };
            return Err(BackendError::Invalid(format!("{shown} is {kind}")));
        }
        let size = md.len();
        let punch_hole = !opts.read_only && probe_punch_hole(&file, size, opts.block_size);
        let capacity = size / opts.block_size as u64 * opts.block_size as u64;
        let in_memory = blockring::on_tmpfs(file.as_fd());
        let shared = Arc::new(Shared::new(file, capacity, &path));
        Ok(FileBackend {
            // A file has no physical block of its own: the file system's
            // block is an allocation unit, not a sector the LU must be
            // aligned to, so one logical block per physical block is
            // reported (SBC-4 §6.2.3 LOGICAL BLOCKS PER PHYSICAL BLOCK
            // EXPONENT 0), as file-backed LUs of other Linux targets do.
            // Unmapping part of a file system block still reads back as
            // zeroes (a partial hole punch zeroes the range). blockio
            // reports the device's physical block.
            phys_exp: 0,
            path,
            opts,
            shared,
            punch_hole,
            in_memory,
        })
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Opens a queue with its concrete type (for statistics).
    pub fn open_uring_queue(&self, depth: u32) -> Result<UringQueue, BackendError> {
        UringQueue::new(self.shared.clone(), self.queue_config(), depth)
    }

    fn queue_config(&self) -> QueueConfig {
        QueueConfig {
            block_size: self.opts.block_size,
            read_only: self.opts.read_only,
            direct_align: 0,
            unmap: if self.punch_hole {
                UnmapVia::PunchHole
            } else {
                UnmapVia::None
            },
            zeroes: if self.opts.read_only {
                ZeroesVia::None
            } else {
                ZeroesVia::ZeroRange {
                    punch_fallback: self.punch_hole,
                }
            },
        }
    }
}

impl Backend for FileBackend {
    fn geometry(&self) -> Geometry {
        let bs = self.opts.block_size;
        Geometry {
            block_size: bs,
            num_blocks: self.shared.capacity.load(Ordering::Acquire) / bs as u64,
            phys_exp: self.phys_exp,
        }
    }

    fn caps(&self) -> Caps {
        let writable = !self.opts.read_only;
        Caps {
            unmap: writable && self.punch_hole,
            // Without ZERO_RANGE or hole punching a write-zeroes could fail
            // with Unsupported; only the punch probe is certain.
            write_zeroes: writable && self.punch_hole,
            fua: true,
            // The page cache: written data is volatile until a flush.
            write_cache: true,
            unmap_zeroes: self.punch_hole,
            read_pipe: self.in_memory,
        }
    }

    fn open_queue(&self, depth: u32) -> Result<Box<dyn BackendQueue>, BackendError> {
        Ok(Box::new(self.open_uring_queue(depth)?))
    }

    fn resync(&self) -> Result<Geometry, BackendError> {
        let md = self
            .shared
            .file
            .metadata()
            .map_err(io_err(format!("stat {}", self.path.display())))?;
        let bs = self.opts.block_size as u64;
        self.shared
            .capacity
            .store(md.len() / bs * bs, Ordering::Release);
        self.shared
            .recheck_after_resync()
            .map_err(|why| BackendError::Invalid(format!("{}: {why}", self.path.display())))?;
        Ok(self.geometry())
    }

    fn mapping(&self, offset: u64, len: u64) -> Option<(bool, u64)> {
        seek_mapping(
            &self.shared.file,
            self.shared.capacity.load(Ordering::Acquire),
            self.opts.block_size as u64,
            offset,
            len,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferrite_core::backend::{BlockDone, BlockError, BlockOp, Busy};
    use ferrite_nullio::integrity::{self, Options, Rng};
    use ferrite_reactor::buf::{BufPool, SgList};
    use std::os::unix::fs::MetadataExt;

    const MIB: u64 = 1 << 20;

    fn shm_dir() -> tempfile::TempDir {
        // tmpfs if there is one (no ZERO_RANGE there), else the temp dir.
        let base = Path::new("/dev/shm");
        if base.is_dir() {
            tempfile::tempdir_in(base).unwrap()
        } else {
            tempfile::tempdir().unwrap()
        }
    }

    fn create(dir: &tempfile::TempDir, size: u64, bs: u32) -> FileBackend {
        FileBackend::open(
            dir.path().join("lun"),
            FileOptions {
                block_size: bs,
                create_size: Some(size),
                ..FileOptions::default()
            },
        )
        .unwrap()
    }

    fn drain(q: &mut dyn BackendQueue) -> Vec<BlockDone> {
        let mut out = Vec::new();
        while q.in_flight() > 0 {
            let before = out.len();
            q.poll(&mut out);
            if out.len() == before {
                std::thread::yield_now();
            }
        }
        out
    }

    fn run(q: &mut dyn BackendQueue, op: BlockOp) -> BlockDone {
        q.submit(1, op).unwrap();
        let mut v = drain(q);
        assert_eq!(v.len(), 1);
        v.pop().unwrap()
    }

    fn pattern(len: usize, seed: u8) -> SgList {
        let pool = BufPool::new(4096, 64);
        let mut sg = pool.sg(len);
        let data: Vec<u8> = (0..len)
            .map(|i| (i as u8).wrapping_mul(31) ^ seed)
            .collect();
        sg.copy_in(0, &data);
        sg
    }

    #[test]
    fn creates_sparse_file_and_reports_geometry() {
        let dir = shm_dir();
        let b = create(&dir, 10 * MIB + 100, 4096);
        let g = b.geometry();
        assert_eq!(g.block_size, 4096);
        assert_eq!(g.num_blocks, (10 * MIB) / 4096);
        let md = std::fs::metadata(dir.path().join("lun")).unwrap();
        assert_eq!(md.len(), 10 * MIB + 100);
        assert!(md.blocks() * 512 < MIB, "file was not created sparse");
        assert_eq!(b.mapping(0, 10 * MIB), Some((false, 10 * MIB)));
    }

    #[test]
    fn open_missing_without_create_fails() {
        let dir = shm_dir();
        let e = FileBackend::open(dir.path().join("nope"), FileOptions::default()).unwrap_err();
        assert!(matches!(e, BackendError::Io { .. }), "{e}");
        assert!(FileBackend::open(dir.path(), FileOptions::default()).is_err());
        let e = FileBackend::open(
            dir.path().join("x"),
            FileOptions {
                block_size: 1000,
                create_size: Some(MIB),
                ..FileOptions::default()
            },
        )
        .unwrap_err();
        assert!(matches!(e, BackendError::Invalid(_)));
    }

    #[test]
    fn round_trip_multi_segment() {
        let dir = shm_dir();
        let b = create(&dir, 4 * MIB, 512);
        let mut q = b.open_queue(8).unwrap();
        let data = pattern(12288 + 1536, 9);
        let expect = data.to_vec();
        let d = run(
            &mut *q,
            BlockOp::Write {
                offset: 512 * 7,
                buf: data,
                fua: false,
            },
        );
        assert_eq!(d.result, Ok(()));
        assert_eq!(d.buf.map(|b| b.len()), Some(expect.len()));
        let d = run(
            &mut *q,
            BlockOp::Read {
                offset: 512 * 7,
                buf: BufPool::new(4096, 8).sg(expect.len()),
            },
        );
        assert_eq!(d.result, Ok(()));
        assert_eq!(d.buf.unwrap().to_vec(), expect);
    }

    #[test]
    fn integrity_qd32_tmpfs_and_disk() {
        for dir in [shm_dir(), tempfile::tempdir().unwrap()] {
            for bs in [512u32, 4096] {
                let b = create(&dir, 16 * MIB, bs);
                let mut q = b.open_queue(32).unwrap();
                let mut rng = Rng::new(bs as u64 + 17);
                let opts = Options::for_caps(600, b.caps());
                let r = integrity::run_with(
                    &mut *q,
                    &mut std::thread::yield_now,
                    b.geometry(),
                    &mut rng,
                    opts,
                )
                .unwrap_or_else(|e| panic!("{} bs {bs}: {e}", dir.path().display()));
                assert_eq!(r.blocks_checked, b.geometry().num_blocks);
                drop(q);
                std::fs::remove_file(dir.path().join("lun")).unwrap();
            }
        }
    }

    /// A reactor that sleeps on `notify_fd` whenever a poll found nothing:
    /// operations deferred by submission batching must still complete.
    #[test]
    fn sleeping_on_notify_fd_completes_batched_ops() {
        let dir = shm_dir();
        let b = create(&dir, 4 * MIB, 512);
        let mut q = b.open_uring_queue(16).unwrap();
        let fd = q.notify_fd().unwrap();
        for t in 0..16u64 {
            let op = BlockOp::Write {
                offset: t * 65536,
                buf: pattern(65536, t as u8),
                fua: t % 4 == 0,
            };
            q.submit(t, op).unwrap();
        }
        let mut done = Vec::new();
        while q.in_flight() > 0 {
            let before = done.len();
            q.poll(&mut done);
            if done.len() == before {
                let woke = blockring::wait_readable(fd, std::time::Duration::from_secs(5)).unwrap();
                assert!(
                    woke,
                    "slept 5 s with {} operations in flight",
                    q.in_flight()
                );
            }
        }
        assert_eq!(done.len(), 16);
        assert!(done.iter().all(|d| d.result.is_ok()));
        assert!(q.ring_stats().ops >= 16);
    }

    #[test]
    fn busy_at_full_depth() {
        let dir = shm_dir();
        let b = create(&dir, MIB, 512);
        let mut q = b.open_queue(4).unwrap();
        for t in 0..4 {
            q.submit(
                t,
                BlockOp::Read {
                    offset: 0,
                    buf: SgList::zeroed(4096),
                },
            )
            .unwrap();
        }
        match q.submit(
            9,
            BlockOp::Write {
                offset: 4096,
                buf: SgList::zeroed(512),
                fua: true,
            },
        ) {
            Err(Busy(BlockOp::Write {
                offset: 4096,
                buf,
                fua: true,
            })) => assert_eq!(buf.len(), 512),
            other => panic!("expected Busy with the write back, got {other:?}"),
        }
        let done = drain(&mut *q);
        assert_eq!(done.len(), 4);
        assert!(done.iter().all(|d| d.result.is_ok()));
        q.submit(9, BlockOp::Flush).unwrap();
        assert_eq!(drain(&mut *q).len(), 1);
    }

    #[test]
    fn fua_writes_are_dsync_and_flush_is_fdatasync() {
        let dir = shm_dir();
        let b = create(&dir, MIB, 512);
        let mut q = b.open_uring_queue(4).unwrap();
        run(
            &mut q,
            BlockOp::Write {
                offset: 0,
                buf: SgList::zeroed(512),
                fua: false,
            },
        );
        assert_eq!(q.ring_stats().dsync_writes, 0);
        run(
            &mut q,
            BlockOp::Write {
                offset: 0,
                buf: SgList::zeroed(512),
                fua: true,
            },
        );
        assert_eq!(q.ring_stats().dsync_writes, 1);
        assert_eq!(run(&mut q, BlockOp::Flush).result, Ok(()));
        assert_eq!(q.ring_stats().fsyncs, 1);
        // The page cache is a volatile write cache; whether a device uses
        // it write-through is the core's policy.
        assert!(b.caps().write_cache && b.caps().fua);
    }

    #[test]
    fn unmap_reads_zeroes_and_mapping_shows_hole() {
        for dir in [shm_dir(), tempfile::tempdir().unwrap()] {
            let b = create(&dir, 4 * MIB, 512);
            if !b.caps().unmap {
                eprintln!("skipping {}: no hole punching", dir.path().display());
                continue;
            }
            let mut q = b.open_queue(4).unwrap();
            let d = run(
                &mut *q,
                BlockOp::Write {
                    offset: 0,
                    buf: pattern(2 * MIB as usize, 3),
                    fua: false,
                },
            );
            assert_eq!(d.result, Ok(()));
            assert_eq!(b.mapping(0, 4 * MIB), Some((true, 2 * MIB)));
            assert_eq!(b.mapping(2 * MIB, 4 * MIB), Some((false, 2 * MIB)));
            let d = run(
                &mut *q,
                BlockOp::Unmap {
                    offset: MIB / 2,
                    len: MIB / 2,
                },
            );
            assert_eq!(d.result, Ok(()));
            assert_eq!(b.mapping(0, 4 * MIB), Some((true, MIB / 2)));
            assert_eq!(b.mapping(MIB / 2, 4 * MIB), Some((false, MIB / 2)));
            assert_eq!(b.mapping(MIB, 4 * MIB), Some((true, MIB)));
            let d = run(
                &mut *q,
                BlockOp::Read {
                    offset: 0,
                    buf: SgList::zeroed(2 * MIB as usize),
                },
            );
            let v = d.buf.unwrap().to_vec();
            let h = (MIB / 2) as usize;
            assert!(v[h..2 * h].iter().all(|&x| x == 0));
            assert!(v[..h].iter().any(|&x| x != 0));
            assert!(v[2 * h..].iter().any(|&x| x != 0));
        }
    }

    #[test]
    fn write_zeroes_on_tmpfs_and_disk() {
        for dir in [shm_dir(), tempfile::tempdir().unwrap()] {
            let b = create(&dir, MIB, 512);
            if !b.caps().write_zeroes {
                eprintln!("skipping {}: no write-zeroes", dir.path().display());
                continue;
            }
            let mut q = b.open_queue(4).unwrap();
            run(
                &mut *q,
                BlockOp::Write {
                    offset: 0,
                    buf: pattern(65536, 1),
                    fua: false,
                },
            );
            // Twice: the second one takes the remembered path on tmpfs.
            for _ in 0..2 {
                let d = run(
                    &mut *q,
                    BlockOp::WriteZeroes {
                        offset: 4096,
                        len: 8192,
                    },
                );
                assert_eq!(d.result, Ok(()), "{}", dir.path().display());
            }
            let d = run(
                &mut *q,
                BlockOp::Read {
                    offset: 0,
                    buf: SgList::zeroed(65536),
                },
            );
            let v = d.buf.unwrap().to_vec();
            assert!(v[4096..12288].iter().all(|&x| x == 0));
            assert!(v[..4096].iter().any(|&x| x != 0));
            assert!(v[12288..].iter().any(|&x| x != 0));
        }
    }

    #[test]
    fn read_only_backend_refuses_writes() {
        let dir = shm_dir();
        drop(create(&dir, MIB, 512));
        let b = FileBackend::open(
            dir.path().join("lun"),
            FileOptions {
                read_only: true,
                ..FileOptions::default()
            },
        )
        .unwrap();
        assert!(!b.caps().unmap && !b.caps().write_zeroes);
        let mut q = b.open_queue(4).unwrap();
        let d = run(
            &mut *q,
            BlockOp::Write {
                offset: 0,
                buf: SgList::zeroed(512),
                fua: false,
            },
        );
        assert_eq!(d.result, Err(BlockError::Os(libc::EROFS)));
        assert_eq!(d.buf.map(|b| b.len()), Some(512));
        assert_eq!(
            run(
                &mut *q,
                BlockOp::Read {
                    offset: 0,
                    buf: SgList::zeroed(512)
                }
            )
            .result,
            Ok(())
        );
    }

    #[test]
    fn kernel_error_is_mapped_and_buffer_returned() {
        // A descriptor opened read-only behind a backend told it is writable:
        // the kernel answers EBADF, which means the backing store is gone.
        let dir = shm_dir();
        drop(create(&dir, MIB, 512));
        let path = dir.path().join("lun");
        let ro = File::open(&path).unwrap();
        let b = FileBackend::from_file(path, ro, FileOptions::default()).unwrap();
        let mut q = b.open_queue(4).unwrap();
        let d = run(
            &mut *q,
            BlockOp::Write {
                offset: 0,
                buf: SgList::zeroed(1024),
                fua: false,
            },
        );
        assert_eq!(d.result, Err(BlockError::Offline));
        assert_eq!(d.buf.map(|b| b.len()), Some(1024));
    }

    /// ENOSPC from a full filesystem reaches the core as NoSpace. Needs
    /// root to mount a 1 MiB tmpfs; skipped otherwise.
    #[test]
    fn full_filesystem_is_no_space() {
        let dir = tempfile::tempdir().unwrap();
        let ok = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", "size=1m", "tmpfs"])
            .arg(dir.path())
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            eprintln!("skipping: cannot mount a small tmpfs (needs root)");
            return;
        }
        let result = std::panic::catch_unwind(|| {
            let b = FileBackend::open(
                dir.path().join("lun"),
                FileOptions {
                    create_size: Some(8 * MIB),
                    ..FileOptions::default()
                },
            )
            .unwrap();
            let mut q = b.open_queue(4).unwrap();
            let d = run(
                &mut *q,
                BlockOp::Write {
                    offset: 0,
                    buf: pattern(2 * MIB as usize, 1),
                    fua: false,
                },
            );
            assert_eq!(d.result, Err(BlockError::NoSpace));
            assert_eq!(d.buf.map(|b| b.len()), Some(2 * MIB as usize));
        });
        let _ = std::process::Command::new("umount")
            .arg(dir.path())
            .status();
        if let Err(p) = result {
            std::panic::resume_unwind(p);
        }
    }

    #[test]
    fn out_of_range_is_refused() {
        let dir = shm_dir();
        let b = create(&dir, MIB, 512);
        let mut q = b.open_queue(4).unwrap();
        let d = run(
            &mut *q,
            BlockOp::Read {
                offset: MIB - 512,
                buf: SgList::zeroed(1024),
            },
        );
        assert_eq!(d.result, Err(BlockError::Os(libc::EINVAL)));
        assert_eq!(d.buf.map(|b| b.len()), Some(1024));
    }

    #[test]
    fn truncation_takes_the_device_offline_until_resync() {
        let dir = shm_dir();
        let b = create(&dir, MIB, 512);
        let mut q = b.open_queue(4).unwrap();
        run(
            &mut *q,
            BlockOp::Write {
                offset: MIB - 8192,
                buf: pattern(8192, 5),
                fua: false,
            },
        );
        let f = OpenOptions::new()
            .write(true)
            .open(dir.path().join("lun"))
            .unwrap();
        f.set_len(MIB - 2048).unwrap();
        // Not resynced yet: the read is in range but hits end of file. The
        // device goes offline instead of inventing zeroes.
        let d = run(
            &mut *q,
            BlockOp::Read {
                offset: MIB - 4096,
                buf: SgList::zeroed(4096),
            },
        );
        assert_eq!(d.result, Err(BlockError::Offline));
        assert_eq!(d.buf.map(|b| b.len()), Some(4096));
        // Sticky: even a read the file still holds fails now.
        let d = run(
            &mut *q,
            BlockOp::Read {
                offset: 0,
                buf: SgList::zeroed(512),
            },
        );
        assert_eq!(d.result, Err(BlockError::Offline));
        // A resync adopts the smaller size and the device is whole again.
        assert_eq!(b.resync().unwrap().num_blocks, (MIB - 2048) / 512);
        let d = run(
            &mut *q,
            BlockOp::Read {
                offset: MIB - 8192,
                buf: SgList::zeroed(4096),
            },
        );
        assert_eq!(d.result, Ok(()));
        assert_eq!(d.buf.unwrap().to_vec(), pattern(8192, 5).to_vec()[..4096]);
        f.set_len(3 * MIB).unwrap();
        assert_eq!(b.resync().unwrap().num_blocks, 3 * MIB / 512);
        assert_eq!(b.geometry().num_blocks, 3 * MIB / 512);
    }

    #[test]
    fn deleted_file_goes_offline_at_the_next_flush() {
        let dir = shm_dir();
        let b = create(&dir, MIB, 512);
        let mut q = b.open_queue(4).unwrap();
        assert_eq!(run(&mut *q, BlockOp::Flush).result, Ok(()));
        std::fs::remove_file(dir.path().join("lun")).unwrap();
        // SYNCHRONIZE CACHE cannot make data durable in a deleted file.
        assert_eq!(
            run(&mut *q, BlockOp::Flush).result,
            Err(BlockError::Offline)
        );
        let d = run(
            &mut *q,
            BlockOp::Write {
                offset: 0,
                buf: pattern(512, 1),
                fua: false,
            },
        );
        assert_eq!(d.result, Err(BlockError::Offline));
        assert_eq!(d.buf.map(|b| b.len()), Some(512));
        // Other queues of the backend see it too.
        let mut q2 = b.open_queue(4).unwrap();
        let d = run(
            &mut *q2,
            BlockOp::Read {
                offset: 0,
                buf: SgList::zeroed(512),
            },
        );
        assert_eq!(d.result, Err(BlockError::Offline));
        let e = b.resync().unwrap_err();
        assert!(e.to_string().contains("deleted"), "{e}");
    }

    #[test]
    fn deleted_file_is_noticed_without_a_flush_within_a_bounded_count() {
        let dir = shm_dir();
        let b = create(&dir, MIB, 512);
        let mut q = b.open_queue(4).unwrap();
        std::fs::remove_file(dir.path().join("lun")).unwrap();
        let mut first_offline = None;
        for i in 0..2 * ferrite_blockq::queue::VANISH_CHECK_EVERY {
            let d = run(
                &mut *q,
                BlockOp::Read {
                    offset: 0,
                    buf: SgList::zeroed(512),
                },
            );
            if d.result == Err(BlockError::Offline) {
                first_offline = Some(i);
                break;
            }
            assert_eq!(d.result, Ok(()));
        }
        let i = first_offline.expect("a deleted file was never noticed");
        assert!(
            i < ferrite_blockq::queue::VANISH_CHECK_EVERY,
            "noticed after {i} reads"
        );
    }

    #[test]
    fn mapping_rounds_to_blocks_and_clips() {
        let dir = tempfile::tempdir().unwrap();
        let b = create(&dir, MIB, 512);
        let mut q = b.open_queue(4).unwrap();
        // One 512-byte write dirties a whole filesystem block (4 KiB on
        // ext4 and tmpfs): mapped from 0 to the end of that block.
        run(
            &mut *q,
            BlockOp::Write {
                offset: 0,
                buf: pattern(512, 1),
                fua: false,
            },
        );
        let (mapped, n) = b.mapping(512, MIB).unwrap();
        assert!(mapped);
        assert!(n >= 512 && n % 512 == 0, "{n}");
        let (mapped, n) = b.mapping(65536, 4096).unwrap();
        assert_eq!((mapped, n), (false, 4096), "clipped to the asked length");
        assert_eq!(b.mapping(MIB, 512), None, "past the end");
        assert_eq!(
            b.mapping(MIB - 512, 4096),
            Some((false, 512)),
            "clipped to the capacity"
        );
    }

    #[test]
    fn read_pipe_hands_over_the_file_pages_on_tmpfs_only() {
        let Some(pool) = ferrite_reactor::pipe::PipePool::new(2, 2) else {
            return;
        };
        let dir = shm_dir();
        let b = create(&dir, 4 * MIB, 512);
        if !b.caps().read_pipe {
            // Not tmpfs here: nothing more to see.
            return;
        }
        let mut q = b.open_queue(8).unwrap();
        let data = pattern(256 * 1024, 0x5a);
        let want = data.to_vec();
        assert!(
            run(
                q.as_mut(),
                BlockOp::Write {
                    offset: 512,
                    buf: data,
                    fua: false
                }
            )
            .result
            .is_ok()
        );
        let pipe = pool.get().unwrap();
        let d = run(
            q.as_mut(),
            BlockOp::ReadPipe {
                offset: 512,
                len: 256 * 1024,
                pipe,
            },
        );
        assert!(d.result.is_ok(), "{:?}", d.result);
        let mut pipe = d.pipe.expect("the pipe comes back");
        assert_eq!(pipe.held(), 256 * 1024);
        let mut got = Vec::new();
        pipe.read_to(&mut got, 256 * 1024).unwrap();
        assert_eq!(got, want);
        // Past the capacity: refused, and the pipe still comes back.
        let d = run(
            q.as_mut(),
            BlockOp::ReadPipe {
                offset: 4 * MIB - 512,
                len: 1024,
                pipe,
            },
        );
        assert_eq!(d.result, Err(BlockError::Os(libc::EINVAL)));
        assert_eq!(d.pipe.expect("pipe").held(), 0);

        // A file that is not in memory offers no pipes.
        let disk = tempfile::tempdir().unwrap();
        if !blockring::on_tmpfs(std::fs::File::open(disk.path()).unwrap().as_fd()) {
            let b = create(&disk, MIB, 512);
            assert!(!b.caps().read_pipe);
            let mut q = b.open_queue(8).unwrap();
            let d = run(
                q.as_mut(),
                BlockOp::ReadPipe {
                    offset: 0,
                    len: 4096,
                    pipe: pool.get().unwrap(),
                },
            );
            assert_eq!(d.result, Err(BlockError::Unsupported));
            assert!(d.pipe.is_some());
        }
    }
}
