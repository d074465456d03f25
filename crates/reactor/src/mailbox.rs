//! Mailboxes: how cores talk to each other. A message is pushed on a
//! lock-free channel; the receiving reactor is woken through an eventfd only
//! when it is asleep, so a busy reactor pays no syscall per message.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use crossbeam_channel::{Receiver, Sender};

struct Wake {
    fd: OwnedFd,
    sleeping: AtomicBool,
}

impl Wake {
    fn new() -> std::io::Result<Wake> {
        // SAFETY: eventfd has no memory-safety preconditions; we check the result.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(Wake {
            // SAFETY: fd is a freshly created descriptor that nothing else owns.
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
            sleeping: AtomicBool::new(false),
        })
    }

    fn ring(&self) {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a live u64 to an eventfd we own.
        let _ = unsafe { libc::write(self.fd.as_raw_fd(), (&one as *const u64).cast(), 8) };
    }

    fn drain(&self) {
        let mut v: u64 = 0;
        // SAFETY: reads at most 8 bytes into a live u64; the fd is non-blocking.
        let _ = unsafe { libc::read(self.fd.as_raw_fd(), (&mut v as *mut u64).cast(), 8) };
    }
}

/// The sending side of a mailbox; cheap to clone, usable from any thread.
pub struct MailboxTx<M> {
    tx: Sender<M>,
    wake: Arc<Wake>,
}

impl<M> Clone for MailboxTx<M> {
    fn clone(&self) -> Self {
        MailboxTx {
            tx: self.tx.clone(),
            wake: self.wake.clone(),
        }
    }
}

impl<M> std::fmt::Debug for MailboxTx<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("MailboxTx")
    }
}

/// The receiving side, owned by one reactor.
pub struct MailboxRx<M> {
    rx: Receiver<M>,
    wake: Arc<Wake>,
}

/// A new mailbox.
pub fn mailbox<M>() -> std::io::Result<(MailboxTx<M>, MailboxRx<M>)> {
    let (tx, rx) = crossbeam_channel::unbounded();
    let wake = Arc::new(Wake::new()?);
    Ok((
        MailboxTx {
            tx,
            wake: wake.clone(),
        },
        MailboxRx { rx, wake },
    ))
}

/// The receiving reactor is gone.
#[derive(Debug, thiserror::Error)]
#[error("mailbox closed")]
pub struct Closed;

impl<M> MailboxTx<M> {
    /// Sends a message and wakes the receiver if it sleeps.
    pub fn send(&self, msg: M) -> Result<(), Closed> {
        self.tx.send(msg).map_err(|_| Closed)?;
        if self.wake.sleeping.load(Ordering::SeqCst) {
            self.wake.ring();
        }
        Ok(())
    }
}

impl<M> MailboxRx<M> {
    /// Next message, if any.
    pub fn try_recv(&self) -> Option<M> {
        self.rx.try_recv().ok()
    }

    /// True when messages wait.
    pub fn has_pending(&self) -> bool {
        !self.rx.is_empty()
    }

    /// The eventfd that becomes readable when a sleeping reactor is sent a message.
    pub fn fd(&self) -> RawFd {
        self.wake.fd.as_raw_fd()
    }

    /// Marks the reactor asleep (true) or awake. Returns whether messages
    /// arrived meanwhile, in which case the reactor must not sleep.
    pub(crate) fn set_sleeping(&self, sleeping: bool) -> bool {
        self.wake.sleeping.store(sleeping, Ordering::SeqCst);
        sleeping && self.has_pending()
    }

    pub(crate) fn drain_wake(&self) {
        self.wake.drain();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn send_recv_across_threads() {
        let (tx, rx) = mailbox::<u32>().unwrap();
        let t = std::thread::spawn(move || {
            for i in 0..100 {
                tx.send(i).unwrap();
            }
        });
        t.join().unwrap();
        let got: Vec<u32> = std::iter::from_fn(|| rx.try_recv()).collect();
        assert_eq!(got, (0..100).collect::<Vec<_>>());
    }
}
