//! Command statistics kept by each [`Shard`](crate::Shard), per device and
//! per session: commands and bytes by direction, errors, commands active now,
//! and latency histograms per direction and transfer size class.
//!
//! Everything here is plain data with fixed-size arrays: recording a command
//! allocates nothing and takes no lock (a shard is owned by one core). A
//! reader asks each core for [`Shard::stats`](crate::Shard::stats), a cheap
//! clone, and adds them up with [`ShardStats::merge`].
//!
//! Latency runs from the `now` a command was submitted with to the `now` of
//! the call during which its response (or its CHECK CONDITION) was queued.
//! The core reads no clock: the times are the ones fabrics and the reactor
//! pass in (`submit`, `poll`, `task_mgmt`, `data_out_done_at`, ...).
//!
//! Does not own: rendering (management exports these as it likes) or any
//! counter of the transport (PDUs, digests, connections).

use std::collections::BTreeMap;
use std::time::Duration;

use crate::device::DeviceId;
use crate::shard::SessionId;

/// Number of bounded latency buckets: bucket `i` counts latencies of at most
/// `2^i` microseconds (and more than `2^(i-1)`), for `i` in `0..=24`.
pub const LATENCY_BOUNDED: usize = 25;
/// Buckets of a histogram: the bounded ones, then one for everything above
/// `2^24` us (about 16.8 s).
pub const LATENCY_BUCKETS: usize = LATENCY_BOUNDED + 1;

/// The upper bound of bucket `i` in microseconds; `None` for the last,
/// unbounded bucket.
pub const fn bucket_bound_us(i: usize) -> Option<u64> {
    if i < LATENCY_BOUNDED {
        Some(1u64 << i)
    } else {
        None
    }
}

/// The bucket a latency of `us` microseconds falls in.
pub fn bucket_of(us: u64) -> usize {
    if us <= 1 {
        return 0;
    }
    // Smallest i with 2^i >= us.
    let i = (64 - (us - 1).leading_zeros()) as usize;
    i.min(LATENCY_BOUNDED)
}

/// Transfer size classes of the latency histograms.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum SizeClass {
    /// At most 4 KiB (and commands without data).
    UpTo4K = 0,
    /// More than 4 KiB, at most 64 KiB.
    UpTo64K = 1,
    /// More than 64 KiB, at most 1 MiB.
    UpTo1M = 2,
    /// More than 1 MiB.
    Larger = 3,
}

impl SizeClass {
    /// Every class, in index order.
    pub const ALL: [SizeClass; 4] = [
        SizeClass::UpTo4K,
        SizeClass::UpTo64K,
        SizeClass::UpTo1M,
        SizeClass::Larger,
    ];

    /// The class of a transfer of `bytes` bytes.
    pub fn of(bytes: u64) -> SizeClass {
        match bytes {
            0..=4096 => SizeClass::UpTo4K,
            4097..=65536 => SizeClass::UpTo64K,
            65537..=1_048_576 => SizeClass::UpTo1M,
            _ => SizeClass::Larger,
        }
    }

    /// The largest transfer of the class in bytes; `None` for [`SizeClass::Larger`].
    pub fn max_bytes(self) -> Option<u64> {
        match self {
            SizeClass::UpTo4K => Some(4096),
            SizeClass::UpTo64K => Some(65536),
            SizeClass::UpTo1M => Some(1_048_576),
            SizeClass::Larger => None,
        }
    }

    /// A short label: "4k", "64k", "1m", "large".
    pub fn label(self) -> &'static str {
        match self {
            SizeClass::UpTo4K => "4k",
            SizeClass::UpTo64K => "64k",
            SizeClass::UpTo1M => "1m",
            SizeClass::Larger => "large",
        }
    }
}

/// The direction a command is counted in.
///
/// Read: the commands that read the medium to the initiator (READ 6/10/12/16).
/// Write: the commands that write Data-Out to the medium (WRITE 6/10/12/16,
/// WRITE AND VERIFY, WRITE SAME, COMPARE AND WRITE, ORWRITE). Other:
/// everything else (INQUIRY, TEST UNIT READY, VERIFY, UNMAP, SYNCHRONIZE
/// CACHE, ...), including commands that fail before they could run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum IoDir {
    Read = 0,
    Write = 1,
    Other = 2,
}

impl IoDir {
    /// Every direction, in index order.
    pub const ALL: [IoDir; 3] = [IoDir::Read, IoDir::Write, IoDir::Other];

    /// "read", "write", "other".
    pub fn label(self) -> &'static str {
        match self {
            IoDir::Read => "read",
            IoDir::Write => "write",
            IoDir::Other => "other",
        }
    }
}

/// A latency histogram with fixed log2 bounds (see [`bucket_bound_us`]).
/// Counts are per bucket, not cumulative.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LatencyHistogram {
    /// `buckets[i]` counts commands whose latency was at most
    /// `bucket_bound_us(i)` and more than the previous bound.
    pub buckets: [u64; LATENCY_BUCKETS],
    /// Commands recorded (the sum of `buckets`).
    pub count: u64,
    /// Sum of the recorded latencies, microseconds.
    pub sum_us: u64,
}

impl Default for LatencyHistogram {
    fn default() -> Self {
        LatencyHistogram {
            buckets: [0; LATENCY_BUCKETS],
            count: 0,
            sum_us: 0,
        }
    }
}

impl LatencyHistogram {
    /// Records one latency.
    pub fn record(&mut self, latency: Duration) {
        let us = u64::try_from(latency.as_micros()).unwrap_or(u64::MAX);
        self.buckets[bucket_of(us)] += 1;
        self.count += 1;
        self.sum_us = self.sum_us.saturating_add(us);
    }

    /// Adds `other`'s counts to this one.
    pub fn merge(&mut self, other: &LatencyHistogram) {
        for (a, b) in self.buckets.iter_mut().zip(other.buckets.iter()) {
            *a += b;
        }
        self.count += other.count;
        self.sum_us = self.sum_us.saturating_add(other.sum_us);
    }

    /// The upper bound (us) of the bucket holding quantile `q` (0..=1), an
    /// upper estimate; `None` when empty or when it falls in the unbounded
    /// bucket.
    pub fn quantile_bound_us(&self, q: f64) -> Option<u64> {
        if self.count == 0 {
            return None;
        }
        let rank = ((q.clamp(0.0, 1.0) * self.count as f64).ceil() as u64).max(1);
        let mut seen = 0;
        for (i, n) in self.buckets.iter().enumerate() {
            seen += n;
            if seen >= rank {
                return bucket_bound_us(i);
            }
        }
        None
    }
}

/// Counters of one device or one session.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IoStats {
    /// Commands completed, by [`IoDir`] index.
    pub cmds: [u64; 3],
    /// Bytes moved, by [`IoDir`] index: Data-In sent for reads, Data-Out
    /// received for writes, both for other commands.
    pub bytes: [u64; 3],
    /// Commands that ended with CHECK CONDITION or were aborted.
    pub errors: u64,
    /// Commands submitted whose response is not queued yet.
    pub active: u64,
    /// Latency per direction and size class: `latency[dir][class]`.
    pub latency: [[LatencyHistogram; 4]; 3],
}

impl IoStats {
    /// Commands completed in `dir`.
    pub fn cmds(&self, dir: IoDir) -> u64 {
        self.cmds[dir as usize]
    }

    /// Bytes moved in `dir`.
    pub fn bytes(&self, dir: IoDir) -> u64 {
        self.bytes[dir as usize]
    }

    /// The histogram of `dir` and `class`.
    pub fn latency(&self, dir: IoDir, class: SizeClass) -> &LatencyHistogram {
        &self.latency[dir as usize][class as usize]
    }

    /// Adds `other` to this one.
    pub fn merge(&mut self, other: &IoStats) {
        for i in 0..3 {
            self.cmds[i] += other.cmds[i];
            self.bytes[i] += other.bytes[i];
            for c in 0..4 {
                self.latency[i][c].merge(&other.latency[i][c]);
            }
        }
        self.errors += other.errors;
        self.active += other.active;
    }

    pub(crate) fn started(&mut self) {
        self.active += 1;
    }

    /// A command left the active set: its response was queued (`latency`
    /// is `Some`) or it was aborted without one.
    pub(crate) fn finished(&mut self, c: &Completion) {
        self.active = self.active.saturating_sub(1);
        let d = c.dir as usize;
        self.cmds[d] += 1;
        self.bytes[d] += c.bytes;
        if c.error {
            self.errors += 1;
        }
        if let Some(l) = c.latency {
            self.latency[d][SizeClass::of(c.bytes) as usize].record(l);
        }
    }
}

/// What one finished command adds to the counters.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Completion {
    pub dir: IoDir,
    pub bytes: u64,
    pub error: bool,
    pub latency: Option<Duration>,
}

/// Statistics of one device (as seen from one shard, or merged).
pub type DeviceStats = IoStats;
/// Statistics of one session (I_T nexus).
pub type SessionStats = IoStats;

/// A snapshot of one shard's counters, or of several merged.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ShardStats {
    pub devices: BTreeMap<DeviceId, DeviceStats>,
    /// Open sessions (a session's counters go when it is closed).
    pub sessions: BTreeMap<SessionId, SessionStats>,
}

impl ShardStats {
    /// Adds `other` (e.g. another core's snapshot) to this one. Session ids
    /// are per shard: merge snapshots of different shards only for their
    /// device totals, or keep sessions apart by core.
    pub fn merge(&mut self, other: &ShardStats) {
        for (k, v) in &other.devices {
            self.devices.entry(*k).or_default().merge(v);
        }
        for (k, v) in &other.sessions {
            self.sessions.entry(*k).or_default().merge(v);
        }
    }

    /// The sum over every device.
    pub fn total(&self) -> IoStats {
        let mut t = IoStats::default();
        for v in self.devices.values() {
            t.merge(v);
        }
        t
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_log2() {
        assert_eq!(bucket_of(0), 0);
        assert_eq!(bucket_of(1), 0);
        assert_eq!(bucket_of(2), 1);
        assert_eq!(bucket_of(3), 2);
        assert_eq!(bucket_of(4), 2);
        assert_eq!(bucket_of(5), 3);
        assert_eq!(bucket_of(1 << 24), 24);
        assert_eq!(bucket_of((1 << 24) + 1), 25);
        assert_eq!(bucket_of(u64::MAX), 25);
        for us in [1u64, 7, 100, 1000, 65_536, 10_000_000] {
            let b = bucket_of(us);
            assert!(us <= bucket_bound_us(b).unwrap());
            if b > 0 {
                assert!(us > bucket_bound_us(b - 1).unwrap());
            }
        }
        assert_eq!(bucket_bound_us(25), None);
    }

    #[test]
    fn size_classes() {
        assert_eq!(SizeClass::of(0), SizeClass::UpTo4K);
        assert_eq!(SizeClass::of(4096), SizeClass::UpTo4K);
        assert_eq!(SizeClass::of(4097), SizeClass::UpTo64K);
        assert_eq!(SizeClass::of(65536), SizeClass::UpTo64K);
        assert_eq!(SizeClass::of(1 << 20), SizeClass::UpTo1M);
        assert_eq!(SizeClass::of((1 << 20) + 1), SizeClass::Larger);
    }

    #[test]
    fn histogram_records_and_merges() {
        let mut h = LatencyHistogram::default();
        h.record(Duration::from_micros(3));
        h.record(Duration::from_micros(100));
        h.record(Duration::from_secs(100));
        assert_eq!(h.count, 3);
        assert_eq!(h.sum_us, 3 + 100 + 100_000_000);
        assert_eq!(h.buckets[2], 1);
        assert_eq!(h.buckets[7], 1);
        assert_eq!(h.buckets[25], 1);
        assert_eq!(h.quantile_bound_us(0.5), Some(128));
        assert_eq!(h.quantile_bound_us(0.1), Some(4));
        assert_eq!(h.quantile_bound_us(1.0), None);
        let mut g = h;
        g.merge(&h);
        assert_eq!(g.count, 6);
        assert_eq!(g.buckets[7], 2);
    }

    #[test]
    fn io_stats_finish_and_merge() {
        let mut s = IoStats::default();
        s.started();
        s.started();
        assert_eq!(s.active, 2);
        s.finished(&Completion {
            dir: IoDir::Read,
            bytes: 8192,
            error: false,
            latency: Some(Duration::from_micros(50)),
        });
        s.finished(&Completion {
            dir: IoDir::Other,
            bytes: 0,
            error: true,
            latency: None,
        });
        assert_eq!(s.active, 0);
        assert_eq!(s.cmds(IoDir::Read), 1);
        assert_eq!(s.bytes(IoDir::Read), 8192);
        assert_eq!(s.errors, 1);
        assert_eq!(s.latency(IoDir::Read, SizeClass::UpTo64K).count, 1);
        assert_eq!(s.latency(IoDir::Other, SizeClass::UpTo4K).count, 0);
        let mut a = ShardStats::default();
        a.devices.insert(DeviceId(1), s);
        let mut b = a.clone();
        b.sessions.insert(SessionId(3), s);
        a.merge(&b);
        assert_eq!(a.devices[&DeviceId(1)].cmds(IoDir::Read), 2);
        assert_eq!(a.sessions[&SessionId(3)].errors, 1);
        assert_eq!(a.total().bytes(IoDir::Read), 16384);
    }
}
