//! The daemon-wide budget for command data buffers: write data fetched from
//! initiators and read data on its way to them. Every shard draws on one
//! [`DataBudget`]; a command whose buffer does not fit waits in a state of
//! its own (`BufWait` in the shard) until memory comes back, and is never
//! failed for it.
//!
//! The rule is SCST's `scst_max_cmd_mem` with a fair share on top:
//!
//! - seven eighths of the limit are shared: a session may hold at most
//!   that part divided by the sessions holding buffers (itself included),
//!   and never less than one [`WRITE_CHUNK`];
//! - the last eighth is kept for sessions that hold nothing: a session with
//!   no buffer may always take one if the whole limit has room, so a
//!   session that is well-behaved gets served while others hold their
//!   shares and trickle their data.
//!
//! Writes are fetched a chunk at a time (at most [`WRITE_CHUNK`] bytes
//! in memory per command), so a command holds one chunk however large its
//! transfer. The figures are in bytes; [`DataBudget::stats`] gives what
//! the metrics and the management tree show.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

/// The most write data one command holds in memory at a time: larger
/// writes are fetched and written a chunk after another.
pub const WRITE_CHUNK: u32 = 1 << 20;

/// The smallest limit a budget takes: enough for the largest transfer a
/// command may ask for (`MAXIMUM TRANSFER LENGTH` of the Block Limits
/// page) several times over.
pub const MIN_LIMIT: u64 = 64 << 20;

/// Memory for command data, shared by every shard of the daemon.
#[derive(Debug)]
pub struct DataBudget {
    limit: AtomicU64,
    used: AtomicU64,
    peak: AtomicU64,
    /// Sessions holding any of it.
    holders: AtomicU32,
    /// Commands waiting for it now.
    waiting: AtomicU64,
    /// Commands that ever had to wait.
    waits: AtomicU64,
}

/// What a budget shows: its limit, use, high-water mark and waiters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BudgetStats {
    pub limit: u64,
    pub used: u64,
    pub peak: u64,
    pub holders: u32,
    pub waiting: u64,
    pub waits: u64,
}

impl DataBudget {
    /// A budget of `limit` bytes (at least [`MIN_LIMIT`]).
    pub fn new(limit: u64) -> DataBudget {
        DataBudget {
            limit: AtomicU64::new(limit.max(MIN_LIMIT)),
            used: AtomicU64::new(0),
            peak: AtomicU64::new(0),
            holders: AtomicU32::new(0),
            waiting: AtomicU64::new(0),
            waits: AtomicU64::new(0),
        }
    }

    /// A budget no load reaches (tests, tools).
    pub fn unlimited() -> DataBudget {
        DataBudget::new(u64::MAX / 4)
    }

    /// The default for a machine with `mem_total` bytes of memory: an
    /// eighth of it, between 256 MiB and 4 GiB, in whole MiB.
    pub fn default_limit(mem_total: u64) -> u64 {
        (mem_total / 8).clamp(256 << 20, 4 << 30) & !((1 << 20) - 1)
    }

    /// Changes the limit (at least [`MIN_LIMIT`]); buffers already held
    /// stay, new ones follow the new limit.
    pub fn set_limit(&self, limit: u64) {
        self.limit.store(limit.max(MIN_LIMIT), Ordering::Relaxed);
    }

    pub fn limit(&self) -> u64 {
        self.limit.load(Ordering::Relaxed)
    }

    pub fn stats(&self) -> BudgetStats {
        BudgetStats {
            limit: self.limit(),
            used: self.used.load(Ordering::Relaxed),
            peak: self.peak.load(Ordering::Relaxed),
            holders: self.holders.load(Ordering::Relaxed),
            waiting: self.waiting.load(Ordering::Relaxed),
            waits: self.waits.load(Ordering::Relaxed),
        }
    }

    /// Takes `n` more bytes for a session that holds `held` now; false if
    /// the rule in the module documentation says it must wait.
    pub fn try_take(&self, n: u64, held: u64) -> bool {
        let limit = self.limit();
        let shared = limit - limit / 8;
        let holders = u64::from(self.holders.load(Ordering::Relaxed)) + u64::from(held == 0);
        let share = (shared / holders.max(1)).max(u64::from(WRITE_CHUNK));
        let mut used = self.used.load(Ordering::Relaxed);
        loop {
            let after = used.saturating_add(n);
            let fits = (after <= shared && held.saturating_add(n) <= share)
                || (held == 0 && after <= limit)
                // A request larger than the whole limit goes alone.
                || (n > limit && used == 0);
            if !fits {
                return false;
            }
            match self
                .used
                .compare_exchange_weak(used, after, Ordering::AcqRel, Ordering::Relaxed)
            {
                Ok(_) => {
                    self.peak.fetch_max(after, Ordering::Relaxed);
                    if held == 0 {
                        self.holders.fetch_add(1, Ordering::Relaxed);
                    }
                    return true;
                }
                Err(now) => used = now,
            }
        }
    }

    /// Gives back `n` bytes of a session that then holds `left`.
    pub fn give(&self, n: u64, left: u64) {
        if n == 0 {
            return;
        }
        let _ = self
            .used
            .fetch_update(Ordering::AcqRel, Ordering::Relaxed, |u| {
                Some(u.saturating_sub(n))
            });
        if left == 0 {
            let _ = self
                .holders
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |h| {
                    Some(h.saturating_sub(1))
                });
        }
    }

    /// A command started waiting (`true`) or stopped (`false`).
    pub(crate) fn note_wait(&self, start: bool) {
        if start {
            self.waiting.fetch_add(1, Ordering::Relaxed);
            self.waits.fetch_add(1, Ordering::Relaxed);
        } else {
            let _ = self
                .waiting
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |w| {
                    Some(w.saturating_sub(1))
                });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const M: u64 = 1 << 20;

    #[test]
    fn shares_and_reserve() {
        let b = DataBudget::new(128 * M);
        // One session alone may take the shared part (112 MiB).
        let mut held = 0;
        while b.try_take(M, held) {
            held += M;
        }
        assert_eq!(held, 112 * M);
        assert_eq!(b.stats().holders, 1);
        // A session holding nothing gets one buffer from the reserve, then
        // waits like the first.
        assert!(b.try_take(4096, 0));
        assert!(!b.try_take(4096, 4096));
        b.give(4096, 0);
        b.give(held, 0);
        let s = b.stats();
        assert_eq!((s.used, s.holders, s.peak), (0, 0, 112 * M + 4096));
    }

    #[test]
    fn two_holders_split_the_shared_part() {
        let b = DataBudget::new(128 * M);
        assert!(b.try_take(M, 0));
        let (mut a, mut c) = (M, 0);
        assert!(b.try_take(M, 0));
        c += M;
        while b.try_take(M, a) {
            a += M;
        }
        // Two holders: 56 MiB each.
        assert_eq!(a, 56 * M);
        while b.try_take(M, c) {
            c += M;
        }
        assert_eq!(c, 56 * M);
    }

    #[test]
    fn default_is_an_eighth_in_whole_mib() {
        assert_eq!(DataBudget::default_limit(24 << 30), 3 << 30);
        assert_eq!(DataBudget::default_limit((24 << 30) + 12345), 3 << 30);
        assert_eq!(DataBudget::default_limit(1 << 30), 256 << 20);
        assert_eq!(DataBudget::default_limit(1 << 40), 4 << 30);
    }

    #[test]
    fn oversized_request_runs_alone() {
        let b = DataBudget::new(MIN_LIMIT);
        assert!(b.try_take(2 * MIN_LIMIT, 0));
        assert!(!b.try_take(4096, 0));
        b.give(2 * MIN_LIMIT, 0);
        assert!(b.try_take(4096, 0));
    }
}
