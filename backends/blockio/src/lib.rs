//! ferrite-blockio: a backend on a block device or a regular file opened with
//! `O_DIRECT`, driven by io_uring; the page cache is bypassed.
//!
//! Owns: [`BlockBackend`]: opening, geometry (`BLKGETSIZE64`, `BLKSSZGET`,
//! `BLKPBSZGET` on devices; the file size otherwise), capabilities, the
//! `O_DIRECT` alignment rule, thin provisioning. Does not own: the data plane,
//! which is `ferrite_blockq::queue::UringQueue` configured for direct I/O
//! (every offset and segment length a multiple of the device's logical block
//! size; `IoBuf`s are page-aligned, so buffer addresses always are), nor the
//! ring's unsafe plumbing (`ferrite_reactor::blockring`).
//!
//! On block devices, `Unmap` is `BLKDISCARD`, a blocking ioctl issued from
//! the submitting core (io_uring has no discard opcode before Linux 6.12's
//! block uring_cmd): discards are rare and usually fast, but a slow device
//! stalls that core for the duration. Discarded blocks are not promised to
//! read back as zeroes (`unmap_zeroes` false). `WriteZeroes` is
//! `fallocate(ZERO_RANGE)` through the ring, which the kernel turns into
//! the device's WRITE ZEROES (or writes zeroes itself), without blocking.
//! On regular files both behave as in fileio (hole punching, `ZERO_RANGE`).

#![forbid(unsafe_code)]

use std::fs::OpenOptions;
use std::io;
use std::os::fd::AsFd;
use std::os::unix::fs::{FileExt, FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering;

use ferrite_blockq::queue::{QueueConfig, Shared, UnmapVia, UringQueue, ZeroesVia};
use ferrite_blockq::{check_block_size, phys_exp, probe_punch_hole, seek_mapping};
use ferrite_core::backend::{Backend, BackendError, BackendQueue, Caps, Geometry};
use ferrite_reactor::blockring;
use ferrite_reactor::buf::IoBuf;

/// How to open a block backend.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BlockOptions {
    /// Logical block size exported; `None`: the device's logical block size
    /// (512 for a regular file). Must be a multiple of the device's.
    pub block_size: Option<u32>,
    pub read_only: bool,
    /// Create a sparse regular file of this many bytes if `path` does not
    /// exist (never applies to devices).
    pub create_size: Option<u64>,
}

/// A backend on a block device or file with `O_DIRECT`.
#[derive(Debug)]
pub struct BlockBackend {
    path: PathBuf,
    opts: BlockOptions,
    shared: Arc<Shared>,
    block_size: u32,
    /// Alignment `O_DIRECT` needs for offsets and lengths.
    align: u32,
    phys_exp: u8,
    is_device: bool,
    /// The store has a volatile cache (files: the page cache is bypassed,
    /// but the disk under the filesystem may have one).
    volatile_cache: bool,
    unmap: UnmapVia,
    zeroes: ZeroesVia,
}

fn io_err(what: impl Into<String>) -> impl FnOnce(io::Error) -> BackendError {
    let what = what.into();
    move |source| BackendError::Io { what, source }
}

/// Whether the device at `rdev` accepts discards (sysfs `discard_max_bytes`).
fn device_discards(rdev: u64) -> bool {
    let p = format!(
        "/sys/dev/block/{}:{}/queue/discard_max_bytes",
        libc::major(rdev),
        libc::minor(rdev)
    );
    std::fs::read_to_string(p)
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok())
        .is_some_and(|n| n > 0)
}

/// Whether the device at `rdev` has a volatile write cache (sysfs
/// `queue/write_cache` says "write back"); true when unknown.
fn device_write_cache(rdev: u64) -> bool {
    let p = format!(
        "/sys/dev/block/{}:{}/queue/write_cache",
        libc::major(rdev),
        libc::minor(rdev)
    );
    std::fs::read_to_string(p).map_or(true, |s| s.trim() != "write through")
}

impl BlockBackend {
    /// Opens `path` with `O_DIRECT`.
    pub fn open(path: impl AsRef<Path>, opts: BlockOptions) -> Result<BlockBackend, BackendError> {
        let path = path.as_ref().to_path_buf();
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
            .custom_flags(libc::O_DIRECT | libc::O_CLOEXEC)
            .open(&path)
            .map_err(io_err(format!("open {shown} with O_DIRECT")))?;
        let md = file.metadata().map_err(io_err(format!("stat {shown}")))?;
        let ft = md.file_type();
        let is_device = ft.is_block_device();
        if !is_device && !ft.is_file() {
            return Err(BackendError::Invalid(format!(
                "{shown} is neither a block device nor a regular file"
            )));
        }
        let (size, logical, physical) = if is_device {
            let fd = file.as_fd();
            (
                blockring::blk_size_bytes(fd).map_err(io_err(format!("BLKGETSIZE64 {shown}")))?,
                blockring::blk_logical_block_size(fd)
                    .map_err(io_err(format!("BLKSSZGET {shown}")))?,
                blockring::blk_physical_block_size(fd)
                    .map_err(io_err(format!("BLKPBSZGET {shown}")))?,
            )
        } else {
            (md.len(), 512, md.blksize() as u32)
        };
        let block_size = opts.block_size.unwrap_or(logical.max(512));
        check_block_size(block_size)?;
        if logical == 0 || !block_size.is_multiple_of(logical) {
            return Err(BackendError::Invalid(format!(
                "{shown}: block size {block_size} is not a multiple of the device's {logical}"
            )));
        }
        let capacity = size / block_size as u64 * block_size as u64;
        // O_DIRECT alignment: prove it with one block read, so a filesystem
        // that wants more (or refuses direct I/O) fails here, not on the
        // first command.
        if capacity > 0 {
            let mut probe = IoBuf::new(block_size as usize);
            file.read_at(&mut probe[..], 0)
                .map_err(|e| BackendError::Io {
                    what: format!("{shown}: O_DIRECT read of {block_size} bytes"),
                    source: e,
                })?;
        }
        let writable = !opts.read_only;
        let (unmap, zeroes) = if is_device {
            (
                if writable && device_discards(md.rdev()) {
                    UnmapVia::BlkDiscard
                } else {
                    UnmapVia::None
                },
                if writable {
                    ZeroesVia::ZeroRange {
                        punch_fallback: false,
                    }
                } else {
                    ZeroesVia::None
                },
            )
        } else {
            let punch = writable && probe_punch_hole(&file, md.len(), block_size);
            (
                if punch {
                    UnmapVia::PunchHole
                } else {
                    UnmapVia::None
                },
                if writable {
                    ZeroesVia::ZeroRange {
                        punch_fallback: punch,
                    }
                } else {
                    ZeroesVia::None
                },
            )
        };
        let shared = Arc::new(Shared::new(file, capacity, &path));
        Ok(BlockBackend {
            path,
            opts,
            shared,
            block_size,
            align: logical.max(512),
            phys_exp: phys_exp(physical as u64, block_size),
            is_device,
            volatile_cache: !is_device || device_write_cache(md.rdev()),
            unmap,
            zeroes,
        })
    }

    /// The device or file path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether the backing store is a block device.
    pub fn is_device(&self) -> bool {
        self.is_device
    }

    /// Opens a queue with its concrete type (for statistics).
    pub fn open_uring_queue(&self, depth: u32) -> Result<UringQueue, BackendError> {
        let cfg = QueueConfig {
            block_size: self.block_size,
            read_only: self.opts.read_only,
            direct_align: self.align,
            unmap: self.unmap,
            zeroes: self.zeroes,
        };
        UringQueue::new(self.shared.clone(), cfg, depth)
    }

    fn size_now(&self) -> io::Result<u64> {
        let f = &self.shared.file;
        if self.is_device {
            blockring::blk_size_bytes(f.as_fd())
        } else {
            f.metadata().map(|m| m.len())
        }
    }
}

impl Backend for BlockBackend {
    fn geometry(&self) -> Geometry {
        Geometry {
            block_size: self.block_size,
            num_blocks: self.shared.capacity.load(Ordering::Acquire) / self.block_size as u64,
            phys_exp: self.phys_exp,
        }
    }

    fn caps(&self) -> Caps {
        let file_thin = !self.is_device && self.unmap == UnmapVia::PunchHole;
        Caps {
            unmap: self.unmap != UnmapVia::None,
            write_zeroes: match self.zeroes {
                ZeroesVia::ZeroRange { punch_fallback } => self.is_device || punch_fallback,
                ZeroesVia::None => false,
            },
            fua: true,
            write_cache: self.volatile_cache,
            unmap_zeroes: file_thin,
            // O_DIRECT bypasses the page cache: there are no pages to hand.
            read_pipe: false,
        }
    }

    fn open_queue(&self, depth: u32) -> Result<Box<dyn BackendQueue>, BackendError> {
        Ok(Box::new(self.open_uring_queue(depth)?))
    }

    fn resync(&self) -> Result<Geometry, BackendError> {
        let size = self
            .size_now()
            .map_err(io_err(format!("size of {}", self.path.display())))?;
        let bs = self.block_size as u64;
        self.shared
            .capacity
            .store(size / bs * bs, Ordering::Release);
        self.shared
            .recheck_after_resync()
            .map_err(|why| BackendError::Invalid(format!("{}: {why}", self.path.display())))?;
        Ok(self.geometry())
    }

    fn mapping(&self, offset: u64, len: u64) -> Option<(bool, u64)> {
        if self.is_device {
            // A block device does not say what it has deallocated.
            return None;
        }
        seek_mapping(
            &self.shared.file,
            self.shared.capacity.load(Ordering::Acquire),
            self.block_size as u64,
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
    use std::fs::File;

    const MIB: u64 = 1 << 20;

    /// A sparse file in a directory that accepts O_DIRECT (the temp dir on
    /// disk; tmpfs too on recent kernels). None (skip) if neither does.
    fn direct_file(size: u64) -> Option<(tempfile::TempDir, PathBuf)> {
        for base in [std::env::temp_dir(), PathBuf::from("/dev/shm")] {
            let Ok(dir) = tempfile::tempdir_in(&base) else {
                continue;
            };
            let p = dir.path().join("lun");
            let f = File::create(&p).unwrap();
            f.set_len(size).unwrap();
            if BlockBackend::open(&p, BlockOptions::default()).is_ok() {
                return Some((dir, p));
            }
        }
        eprintln!("skipping: no directory accepts O_DIRECT");
        None
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

    #[test]
    fn integrity_qd32_on_file() {
        let Some((_dir, p)) = direct_file(16 * MIB) else {
            return;
        };
        for bs in [512u32, 4096] {
            let b = BlockBackend::open(
                &p,
                BlockOptions {
                    block_size: Some(bs),
                    ..BlockOptions::default()
                },
            )
            .unwrap();
            assert!(!b.is_device());
            let mut q = b.open_queue(32).unwrap();
            let mut rng = Rng::new(bs as u64);
            let r = integrity::run_with(
                &mut *q,
                &mut std::thread::yield_now,
                b.geometry(),
                &mut rng,
                Options::for_caps(500, b.caps()),
            );
            let r = r.unwrap_or_else(|e| panic!("bs {bs}: {e}"));
            assert_eq!(r.blocks_checked, b.geometry().num_blocks);
            // Start the next block size from zeroes.
            drop(q);
            let f = OpenOptions::new().write(true).open(&p).unwrap();
            f.set_len(0).unwrap();
            f.set_len(16 * MIB).unwrap();
        }
    }

    #[test]
    fn misaligned_segment_is_refused_with_buffer_back() {
        let Some((_dir, p)) = direct_file(MIB) else {
            return;
        };
        let b = BlockBackend::open(&p, BlockOptions::default()).unwrap();
        let mut q = b.open_queue(4).unwrap();
        let mut sg = SgList::new();
        sg.push(IoBuf::new(100));
        sg.push(IoBuf::new(412));
        let d = run(&mut *q, BlockOp::Read { offset: 0, buf: sg });
        assert_eq!(d.result, Err(BlockError::Os(libc::EINVAL)));
        assert_eq!(d.buf.map(|b| b.len()), Some(512));
    }

    #[test]
    fn busy_flush_fua_unmap_and_mapping() {
        let Some((_dir, p)) = direct_file(4 * MIB) else {
            return;
        };
        let b = BlockBackend::open(&p, BlockOptions::default()).unwrap();
        let mut q = b.open_uring_queue(2).unwrap();
        let pool = BufPool::new(4096, 16);
        let mut sg = pool.sg(MIB as usize);
        sg.copy_in(0, &vec![0x77; MIB as usize]);
        q.submit(
            1,
            BlockOp::Write {
                offset: 0,
                buf: sg,
                fua: true,
            },
        )
        .unwrap();
        q.submit(2, BlockOp::Flush).unwrap();
        assert!(matches!(
            q.submit(3, BlockOp::Flush),
            Err(Busy(BlockOp::Flush))
        ));
        let done = drain(&mut q);
        assert_eq!(done.len(), 2);
        assert!(done.iter().all(|d| d.result.is_ok()), "{done:?}");
        assert_eq!(q.ring_stats().dsync_writes, 1);
        assert_eq!(q.ring_stats().fsyncs, 1);
        if !b.caps().unmap {
            eprintln!("skipping unmap: no hole punching here");
            return;
        }
        assert_eq!(b.mapping(0, 4 * MIB), Some((true, MIB)));
        let d = run(
            &mut q,
            BlockOp::Unmap {
                offset: 256 << 10,
                len: 256 << 10,
            },
        );
        assert_eq!(d.result, Ok(()));
        assert_eq!(b.mapping(256 << 10, 4 * MIB), Some((false, 256 << 10)));
        let d = run(
            &mut q,
            BlockOp::Read {
                offset: 0,
                buf: pool.sg(MIB as usize),
            },
        );
        let v = d.buf.unwrap().to_vec();
        assert!(v[..256 << 10].iter().all(|&x| x == 0x77));
        assert!(v[256 << 10..512 << 10].iter().all(|&x| x == 0));
        assert!(v[512 << 10..].iter().all(|&x| x == 0x77));
    }

    #[test]
    fn block_size_must_cover_the_device_sector() {
        let Some((_dir, p)) = direct_file(MIB) else {
            return;
        };
        let e = BlockBackend::open(
            &p,
            BlockOptions {
                block_size: Some(256),
                ..BlockOptions::default()
            },
        )
        .unwrap_err();
        assert!(matches!(e, BackendError::Invalid(_)), "{e}");
    }

    #[test]
    fn creates_a_missing_file() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("new");
        let b = BlockBackend::open(
            &p,
            BlockOptions {
                create_size: Some(2 * MIB),
                ..BlockOptions::default()
            },
        );
        match b {
            Ok(b) => assert_eq!(b.geometry().bytes(), 2 * MIB),
            Err(e) => eprintln!("skipping: {e} (no O_DIRECT in the temp dir)"),
        }
        assert_eq!(std::fs::metadata(&p).unwrap().len(), 2 * MIB);
    }

    #[test]
    fn read_only_refuses_writes_and_has_no_thin_caps() {
        let Some((_dir, p)) = direct_file(MIB) else {
            return;
        };
        let b = BlockBackend::open(
            &p,
            BlockOptions {
                read_only: true,
                ..BlockOptions::default()
            },
        )
        .unwrap();
        let c = b.caps();
        assert!(!c.unmap && !c.write_zeroes);
        let mut q = b.open_queue(4).unwrap();
        let d = run(
            &mut *q,
            BlockOp::Write {
                offset: 0,
                buf: IoBuf::new(512).into(),
                fua: false,
            },
        );
        assert_eq!(d.result, Err(BlockError::Os(libc::EROFS)));
        assert_eq!(d.buf.map(|b| b.len()), Some(512));
        let d = run(
            &mut *q,
            BlockOp::Unmap {
                offset: 0,
                len: 512,
            },
        );
        assert_eq!(d.result, Err(BlockError::Os(libc::EROFS)));
        assert_eq!(
            run(
                &mut *q,
                BlockOp::Read {
                    offset: 0,
                    buf: IoBuf::new(512).into()
                }
            )
            .result,
            Ok(())
        );
    }

    #[test]
    fn not_a_file_or_device() {
        let dir = tempfile::tempdir().unwrap();
        assert!(BlockBackend::open(dir.path(), BlockOptions::default()).is_err());
        assert!(BlockBackend::open(dir.path().join("missing"), BlockOptions::default()).is_err());
    }

    /// On a loop device over a sparse file, when run as root with loop
    /// support; skipped otherwise.
    #[test]
    fn loop_device_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let img = dir.path().join("img");
        File::create(&img).unwrap().set_len(8 * MIB).unwrap();
        let out = std::process::Command::new("losetup")
            .args(["--find", "--show"])
            .arg(&img)
            .output();
        let dev = match out {
            Ok(o) if o.status.success() => String::from_utf8_lossy(&o.stdout).trim().to_string(),
            _ => {
                eprintln!("skipping: cannot attach a loop device (needs root and loop support)");
                return;
            }
        };
        let result = std::panic::catch_unwind(|| {
            let b = BlockBackend::open(&dev, BlockOptions::default()).unwrap();
            assert!(b.is_device());
            assert_eq!(b.geometry().bytes(), 8 * MIB);
            assert_eq!(b.mapping(0, MIB), None);
            let mut q = b.open_queue(32).unwrap();
            let mut rng = Rng::new(99);
            integrity::run_with(
                &mut *q,
                &mut std::thread::yield_now,
                b.geometry(),
                &mut rng,
                Options::for_caps(300, b.caps()),
            )
            .unwrap();
            if b.caps().unmap {
                let d = run(
                    &mut *q,
                    BlockOp::Unmap {
                        offset: 0,
                        len: MIB,
                    },
                );
                assert_eq!(d.result, Ok(()));
            }
        });
        let _ = std::process::Command::new("losetup")
            .args(["-d", &dev])
            .status();
        if let Err(p) = result {
            std::panic::resume_unwind(p);
        }
    }
}
