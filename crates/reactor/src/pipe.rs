//! Pipes that carry read data from the page cache to a socket without a copy.
//!
//! A [`Pipe`] holds references to file pages: [`Pipe::splice_from_file`]
//! moves pages of a file into it (the kernel takes a reference, it copies
//! nothing), and the reactor's send path splices them on into a TCP socket
//! (`TxSeg::Pipe`), where the socket's buffers reference the same pages. The
//! bytes are copied once, by the reader on the other end of the connection.
//!
//! Pipes come from a per-core [`PipePool`]; a pipe goes back to the pool when
//! it is dropped empty, and is closed when it still holds bytes (a response
//! that was never sent whole), so no stale byte can reach the next user.

use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use crossbeam_queue::ArrayQueue;

/// Bytes a pool asks the kernel to give each pipe (`F_SETPIPE_SZ`): 256 page
/// slots hold a 1 MiB read that starts on a page boundary.
const PIPE_BYTES: usize = 1 << 20;
/// Size of a page slot in a pipe.
const PAGE: u64 = 4096;

struct PoolShared {
    free: ArrayQueue<(OwnedFd, OwnedFd)>,
    /// Capacity in bytes of every pipe of the pool, as the kernel granted it.
    cap: usize,
    /// Pipes out of the pool now, and the most there may be: each costs
    /// two descriptors, which must not crowd out connections.
    live: AtomicUsize,
    max_live: usize,
}

/// A pool of pipes of one capacity. Cloning shares the pool.
#[derive(Clone)]
pub struct PipePool {
    shared: Arc<PoolShared>,
}

impl std::fmt::Debug for PipePool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PipePool")
            .field("cap", &self.shared.cap)
            .field("idle", &self.shared.free.len())
            .finish()
    }
}

fn cvt(r: libc::c_int) -> io::Result<libc::c_int> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

/// A new non-blocking pipe of `want` bytes; returns its ends and the
/// capacity the kernel granted.
fn new_pipe(want: usize) -> io::Result<(OwnedFd, OwnedFd, usize)> {
    let mut fds = [0 as libc::c_int; 2];
    // SAFETY: `fds` is a writable array of two ints, as pipe2 requires.
    cvt(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC | libc::O_NONBLOCK) })?;
    // SAFETY: pipe2 succeeded, so both descriptors are new and ours.
    let (rd, wr) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    let want = libc::c_int::try_from(want).unwrap_or(libc::c_int::MAX);
    // SAFETY: fcntl on a descriptor we own, with an integer argument.
    let cap = cvt(unsafe { libc::fcntl(wr.as_raw_fd(), libc::F_SETPIPE_SZ, want) })?;
    Ok((rd, wr, cap as usize))
}

impl PipePool {
    /// A pool keeping up to `max_idle` idle pipes and handing out at most
    /// `max_live` at a time. `None` when the kernel refuses pipes of
    /// [`PIPE_BYTES`] (`fs.pipe-max-size` below it for an unprivileged
    /// process): reads then take the copying path.
    pub fn new(max_idle: usize, max_live: usize) -> Option<PipePool> {
        let (rd, wr, cap) = match new_pipe(PIPE_BYTES) {
            Ok(p) => p,
            Err(e) => {
                tracing::debug!(error = %e, "no pipes for zero-copy reads");
                return None;
            }
        };
        let free = ArrayQueue::new(max_idle.max(1));
        let _ = free.push((rd, wr));
        Some(PipePool {
            shared: Arc::new(PoolShared {
                free,
                cap,
                live: AtomicUsize::new(0),
                max_live,
            }),
        })
    }

    /// Whether `[offset, offset+len)` of a file fits one pipe of this pool:
    /// every page it touches takes one slot.
    pub fn fits(&self, offset: u64, len: usize) -> bool {
        let Some(end) = offset.checked_add(len as u64) else {
            return false;
        };
        let pages = end.div_ceil(PAGE) - offset / PAGE;
        pages.saturating_mul(PAGE) <= self.shared.cap as u64
    }

    /// An empty pipe; `None` when `max_live` are out or a new one cannot be
    /// made (descriptor or pipe-buffer limits), in which case the caller
    /// copies instead.
    pub fn get(&self) -> Option<Pipe> {
        if self.shared.live.load(Ordering::Relaxed) >= self.shared.max_live {
            return None;
        }
        let (rd, wr) = match self.shared.free.pop() {
            Some(p) => p,
            None => match new_pipe(self.shared.cap) {
                Ok((rd, wr, cap)) if cap >= self.shared.cap => (rd, wr),
                Ok(_) => return None,
                Err(e) => {
                    tracing::debug!(error = %e, "pipe for a zero-copy read");
                    return None;
                }
            },
        };
        self.shared.live.fetch_add(1, Ordering::Relaxed);
        Some(Pipe {
            rd: Some(rd),
            wr: Some(wr),
            held: 0,
            pool: Some(self.shared.clone()),
        })
    }
}

/// A pipe holding up to its capacity of file pages on their way to a
/// socket. `held` counts the bytes put in and not yet taken out.
pub struct Pipe {
    rd: Option<OwnedFd>,
    wr: Option<OwnedFd>,
    held: usize,
    pool: Option<Arc<PoolShared>>,
}

impl std::fmt::Debug for Pipe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pipe").field("held", &self.held).finish()
    }
}

impl Pipe {
    /// Moves `len` bytes at `offset` of `file` into the pipe without copying
    /// them; returns how many moved (fewer at end of file, or when the pipe
    /// is full). Never waits for the pipe; it may wait for the file's pages
    /// to be read, so it suits files whose pages are in memory (tmpfs).
    pub fn splice_from_file(&mut self, file: &File, offset: u64, len: usize) -> io::Result<usize> {
        let Some(wr) = self.wr.as_ref() else {
            return Err(io::Error::from_raw_os_error(libc::EBADF));
        };
        let mut done = 0;
        while done < len {
            let mut off = libc::loff_t::try_from(offset + done as u64)
                .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
            // SAFETY: both descriptors are open for the call; `off` is a
            // valid loff_t the kernel may update; no user memory is passed.
            let n = unsafe {
                libc::splice(
                    file.as_raw_fd(),
                    &mut off,
                    wr.as_raw_fd(),
                    std::ptr::null_mut(),
                    len - done,
                    libc::SPLICE_F_NONBLOCK,
                )
            };
            match n {
                n if n > 0 => {
                    done += n as usize;
                    self.held += n as usize;
                }
                0 => break,
                _ => {
                    let e = io::Error::last_os_error();
                    match e.raw_os_error() {
                        Some(libc::EINTR) => continue,
                        // The pipe is full: report what moved.
                        Some(libc::EAGAIN) if done > 0 => break,
                        _ => return Err(e),
                    }
                }
            }
        }
        Ok(done)
    }

    /// Copies `bytes` into the pipe (backends without a file, and tests);
    /// returns how many fit.
    pub fn fill(&mut self, bytes: &[u8]) -> io::Result<usize> {
        let Some(wr) = self.wr.as_ref() else {
            return Err(io::Error::from_raw_os_error(libc::EBADF));
        };
        let mut done = 0;
        while done < bytes.len() {
            // SAFETY: the source is `bytes.len() - done` readable bytes of
            // `bytes`, which outlives the call.
            let n = unsafe {
                libc::write(
                    wr.as_raw_fd(),
                    bytes[done..].as_ptr().cast(),
                    bytes.len() - done,
                )
            };
            if n > 0 {
                done += n as usize;
                self.held += n as usize;
                continue;
            }
            let e = io::Error::last_os_error();
            match e.raw_os_error() {
                Some(libc::EINTR) => continue,
                Some(libc::EAGAIN) => break,
                _ => return Err(e),
            }
        }
        Ok(done)
    }

    /// Bytes in the pipe.
    pub fn held(&self) -> usize {
        self.held
    }

    /// The read end, for the reactor's splice into a socket.
    pub(crate) fn read_fd(&self) -> RawFd {
        self.rd.as_ref().map_or(-1, |fd| fd.as_raw_fd())
    }

    /// Records that `n` bytes left through the read end.
    pub(crate) fn taken(&mut self, n: usize) {
        self.held = self.held.saturating_sub(n);
    }

    /// Reads up to `len` bytes out of the pipe into `out` (tests and the
    /// in-memory transports, which have no socket to splice into).
    pub fn read_to(&mut self, out: &mut Vec<u8>, len: usize) -> io::Result<usize> {
        let fd = self.read_fd();
        let start = out.len();
        out.resize(start + len, 0);
        let mut got = 0;
        while got < len {
            // SAFETY: the destination is `len - got` writable bytes inside
            // `out`, which outlives the call.
            let n = unsafe { libc::read(fd, out[start + got..].as_mut_ptr().cast(), len - got) };
            if n > 0 {
                got += n as usize;
            } else if n == 0 {
                break;
            } else {
                let e = io::Error::last_os_error();
                if e.raw_os_error() == Some(libc::EINTR) {
                    continue;
                }
                out.truncate(start + got);
                self.taken(got);
                return Err(e);
            }
        }
        out.truncate(start + got);
        self.taken(got);
        Ok(got)
    }
}

impl Drop for Pipe {
    fn drop(&mut self) {
        let Some(pool) = self.pool.take() else {
            return;
        };
        pool.live.fetch_sub(1, Ordering::Relaxed);
        // Only an empty pipe goes back: one holding bytes is closed, and its
        // page references with it.
        if self.held == 0
            && let (Some(rd), Some(wr)) = (self.rd.take(), self.wr.take())
        {
            let _ = pool.free.push((rd, wr));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file_with(bytes: &[u8]) -> File {
        let path = std::env::temp_dir().join(format!(
            "ferrite-pipe-{}-{}",
            std::process::id(),
            bytes.len()
        ));
        std::fs::write(&path, bytes).expect("write");
        let f = File::open(&path).expect("open");
        let _ = std::fs::remove_file(&path);
        f
    }

    #[test]
    fn file_pages_travel_through_a_pipe_and_it_is_reused_when_empty() {
        let Some(pool) = PipePool::new(4, 2) else {
            return;
        };
        let data: Vec<u8> = (0..300_000u32).map(|i| (i * 7) as u8).collect();
        let f = file_with(&data);
        let mut p = pool.get().expect("pipe");
        assert_eq!(p.splice_from_file(&f, 4096, 65536).expect("splice"), 65536);
        assert_eq!(p.held(), 65536);
        let mut out = Vec::new();
        assert_eq!(p.read_to(&mut out, 65536).expect("read"), 65536);
        assert_eq!(&out[..], &data[4096..4096 + 65536]);
        drop(p);
        assert_eq!(pool.shared.free.len(), 1, "an empty pipe goes back");
        // At end of file the splice is short.
        let mut p = pool.get().expect("pipe");
        assert_eq!(
            p.splice_from_file(&f, 290_000, 65536).expect("splice"),
            10_000
        );
        drop(p);
        assert_eq!(
            pool.shared.free.len(),
            0,
            "a pipe still holding bytes is closed"
        );
        // At most max_live out at once.
        let a = pool.get().expect("first");
        let b = pool.get().expect("second");
        assert!(pool.get().is_none());
        drop(a);
        assert!(pool.get().is_some());
        drop(b);
    }

    #[test]
    fn fits_counts_the_pages_a_range_touches() {
        let Some(pool) = PipePool::new(1, 1) else {
            return;
        };
        let cap = pool.shared.cap;
        assert!(pool.fits(0, cap));
        assert!(!pool.fits(512, cap));
        assert!(pool.fits(512, cap - 4096));
        assert!(!pool.fits(u64::MAX - 10, 4096));
    }
}
