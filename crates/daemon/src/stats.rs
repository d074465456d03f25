//! Statistics across cores: each reactor publishes its shard's counters here
//! about once a second (control path: one short mutex hold per core per
//! second), and the management thread reads them for `ferritectl stats`,
//! `ferritectl sessions` and the Prometheus endpoint. Before it reads, the
//! management thread asks every core for its counters of that moment
//! ([`StatsBoard::ask`], [`StatsBoard::wait`]), so what it reports includes
//! every command answered before the question.
//!
//! Per-device counters come straight from the shards. Per-target counters are
//! the sum of the target's sessions: the live ones, plus what sessions that
//! ended had counted when they were last published (a session's last second
//! before it closes is not counted).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use ferrite_core::device::DeviceId;
use ferrite_core::stats::{
    IoDir as CoreDir, IoStats as CoreIo, LATENCY_BUCKETS, LatencyHistogram as CoreHist, SizeClass,
    bucket_bound_us,
};
use ferrite_mgmt::runtime::{IoDir, IoStats, LatencyHistogram};

/// What one core published.
#[derive(Clone, Debug, Default)]
pub struct CoreStats {
    pub devices: BTreeMap<DeviceId, CoreIo>,
    /// Live sessions by TSIH: (target name, counters).
    pub sessions: BTreeMap<u16, (String, CoreIo)>,
    /// Counters of sessions that ended, by target.
    pub ended: BTreeMap<String, CoreIo>,
    /// The newest question ([`StatsBoard::ask`]) these counters answer.
    pub answered: u64,
}

/// The board every core publishes to.
#[derive(Debug, Default)]
pub struct StatsBoard {
    cores: Mutex<BTreeMap<usize, CoreStats>>,
    /// Signalled on every publication.
    published: Condvar,
    /// The newest question asked.
    asked: AtomicU64,
}

impl StatsBoard {
    /// Replaces `core`'s devices and sessions; sessions it published before
    /// and no longer has are added to their target's ended counters.
    /// `answered` is the newest question the core saw before it took these
    /// counters (0: none).
    pub fn publish(
        &self,
        core: usize,
        devices: BTreeMap<DeviceId, CoreIo>,
        sessions: BTreeMap<u16, (String, CoreIo)>,
        answered: u64,
    ) {
        let Ok(mut cores) = self.cores.lock() else {
            return;
        };
        let c = cores.entry(core).or_default();
        c.answered = c.answered.max(answered);
        let gone: Vec<u16> = c
            .sessions
            .keys()
            .filter(|t| !sessions.contains_key(t))
            .copied()
            .collect();
        for tsih in gone {
            if let Some((target, io)) = c.sessions.remove(&tsih) {
                c.ended.entry(target).or_default().merge(&io);
            }
        }
        c.devices = devices;
        c.sessions = sessions;
        drop(cores);
        self.published.notify_all();
    }

    /// A new question: the number each core echoes in its next
    /// [`StatsBoard::publish`] once it was asked (`Msg::PublishStats`).
    pub fn ask(&self) -> u64 {
        self.asked.fetch_add(1, Ordering::Relaxed) + 1
    }

    /// Waits until each of `cores` answered `question` or a newer one, for
    /// at most `limit`. False when one did not (a core stuck or gone; what
    /// it published last still counts).
    pub fn wait(&self, question: u64, cores: usize, limit: Duration) -> bool {
        let deadline = Instant::now() + limit;
        let Ok(mut guard) = self.cores.lock() else {
            return false;
        };
        loop {
            let done = (0..cores).all(|k| guard.get(&k).is_some_and(|c| c.answered >= question));
            if done {
                return true;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            guard = match self.published.wait_timeout(guard, left) {
                Ok((g, _)) => g,
                Err(_) => return false,
            };
        }
    }

    /// Every core's devices merged, and every target's sessions (live and
    /// ended) merged.
    pub fn totals(&self) -> (BTreeMap<DeviceId, CoreIo>, BTreeMap<String, CoreIo>) {
        let mut devices: BTreeMap<DeviceId, CoreIo> = BTreeMap::new();
        let mut targets: BTreeMap<String, CoreIo> = BTreeMap::new();
        if let Ok(cores) = self.cores.lock() {
            for c in cores.values() {
                for (id, io) in &c.devices {
                    devices.entry(*id).or_default().merge(io);
                }
                for (target, io) in c.sessions.values() {
                    targets.entry(target.clone()).or_default().merge(io);
                }
                for (target, io) in &c.ended {
                    targets.entry(target.clone()).or_default().merge(io);
                }
            }
        }
        (devices, targets)
    }

    /// The live counters of the session with this TSIH.
    pub fn session(&self, tsih: u16) -> Option<CoreIo> {
        let cores = self.cores.lock().ok()?;
        cores
            .values()
            .find_map(|c| c.sessions.get(&tsih).map(|(_, io)| *io))
    }
}

/// The management view of the core's counters.
pub fn to_mgmt(io: &CoreIo) -> IoStats {
    IoStats {
        read_cmds: io.cmds(CoreDir::Read),
        write_cmds: io.cmds(CoreDir::Write),
        other_cmds: io.cmds(CoreDir::Other),
        read_bytes: io.bytes(CoreDir::Read),
        write_bytes: io.bytes(CoreDir::Write),
        errors: io.errors,
    }
}

fn mgmt_dir(d: CoreDir) -> IoDir {
    match d {
        CoreDir::Read => IoDir::Read,
        CoreDir::Write => IoDir::Write,
        CoreDir::Other => IoDir::Other,
    }
}

fn mgmt_hist(dir: CoreDir, class: SizeClass, h: &CoreHist) -> LatencyHistogram {
    let bounds: Vec<u64> = (0..LATENCY_BUCKETS).filter_map(bucket_bound_us).collect();
    LatencyHistogram {
        dir: mgmt_dir(dir),
        size_class: class.label().to_string(),
        bounds_us: bounds,
        counts: h.buckets.to_vec(),
        sum_us: h.sum_us,
    }
}

/// The latency histograms of `io` that saw at least one command, with the
/// core's log2 bucket bounds.
pub fn histograms(io: &CoreIo) -> Vec<LatencyHistogram> {
    let mut v = Vec::new();
    for dir in CoreDir::ALL {
        for class in SizeClass::ALL {
            let h = io.latency(dir, class);
            if h.count > 0 {
                v.push(mgmt_hist(dir, class, h));
            }
        }
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ended_sessions_keep_counting_for_their_target() {
        let b = StatsBoard::default();
        let io = CoreIo {
            errors: 3,
            ..CoreIo::default()
        };
        let mut s = BTreeMap::new();
        s.insert(7u16, ("t1".to_string(), io));
        b.publish(0, BTreeMap::new(), s, 0);
        b.publish(1, BTreeMap::new(), BTreeMap::new(), 0);
        assert_eq!(b.totals().1["t1"].errors, 3);
        assert_eq!(b.session(7).map(|i| i.errors), Some(3));
        // The session ends: its counters move to the target's ended total.
        b.publish(0, BTreeMap::new(), BTreeMap::new(), 0);
        assert_eq!(b.totals().1["t1"].errors, 3);
        assert_eq!(b.session(7), None);
    }

    #[test]
    fn a_question_is_answered_once_every_core_published_after_it() {
        let b = std::sync::Arc::new(StatsBoard::default());
        b.publish(0, BTreeMap::new(), BTreeMap::new(), 0);
        let q = b.ask();
        // Nobody answers: the wait gives up after its limit.
        assert!(!b.wait(q, 2, Duration::from_millis(20)));
        b.publish(0, BTreeMap::new(), BTreeMap::new(), q);
        // Core 1 has not answered yet.
        assert!(!b.wait(q, 2, Duration::from_millis(20)));
        let b2 = b.clone();
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(30));
            b2.publish(1, BTreeMap::new(), BTreeMap::new(), q);
        });
        assert!(b.wait(q, 2, Duration::from_secs(10)));
        t.join().unwrap();
        // A timed publication later does not take the answer back.
        b.publish(1, BTreeMap::new(), BTreeMap::new(), 0);
        assert!(b.wait(q, 2, Duration::ZERO));
        // A newer question needs newer answers.
        let q2 = b.ask();
        assert!(q2 > q);
        assert!(!b.wait(q2, 2, Duration::from_millis(1)));
    }
}
