//! The fencing rule, with no I/O and no clock: time is an argument.
//!
//! A node is live only until `t_sent + ttl` of the last lease renewal (or
//! grant) that succeeded, where `t_sent` is when the request was sent and
//! `ttl` is what etcd answered. etcd restarts the TTL no earlier than it
//! receives the request, so it cannot expire the lease before this deadline.

use std::time::{Duration, Instant};

/// A change of liveness to report.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Change {
    Live,
    /// Not live since `since`.
    Fenced {
        since: Instant,
    },
}

/// A node's fencing deadline and what it last reported of it.
#[derive(Debug, Default, Clone)]
pub(crate) struct Fence {
    until: Option<Instant>,
    /// Whether `Live` is the last change reported.
    reported_live: bool,
}

impl Fence {
    /// A renewal sent at `t_sent` succeeded with `ttl`. The deadline only
    /// moves forward: a late answer to an earlier request never shortens it.
    /// False (and no change) if the deadline is out of the clock's range.
    pub(crate) fn renewed(&mut self, t_sent: Instant, ttl: Duration) -> bool {
        let Some(until) = t_sent.checked_add(ttl) else {
            return false;
        };
        self.until = Some(self.until.map_or(until, |u| u.max(until)));
        true
    }

    /// The lease is gone (etcd said so, or the node revoked it): not live
    /// from `now`, whatever the deadline said.
    pub(crate) fn lost(&mut self, now: Instant) {
        self.until = self.until.map(|u| u.min(now));
    }

    pub(crate) fn until(&self) -> Option<Instant> {
        self.until
    }

    pub(crate) fn is_live(&self, now: Instant) -> bool {
        self.until.is_some_and(|u| now < u)
    }

    /// The change since the last one reported, if any.
    pub(crate) fn poll(&mut self, now: Instant) -> Option<Change> {
        let live = self.is_live(now);
        if live == self.reported_live {
            return None;
        }
        self.reported_live = live;
        match self.until {
            Some(since) if !live => Some(Change::Fenced { since }),
            _ if live => Some(Change::Live),
            // Never live, so never reported live: unreachable by the check
            // above, but say it plainly rather than invent a deadline.
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    #[test]
    fn live_until_t_sent_plus_ttl_then_fenced() {
        let t0 = Instant::now();
        let mut f = Fence::default();
        assert!(!f.is_live(t0));
        assert_eq!(f.poll(t0), None);
        assert!(f.renewed(t0, 2 * S));
        assert_eq!(f.poll(t0 + S / 2), Some(Change::Live));
        assert_eq!(f.poll(t0 + S), None);
        assert!(f.is_live(t0 + 2 * S - Duration::from_nanos(1)));
        assert!(!f.is_live(t0 + 2 * S));
        assert_eq!(
            f.poll(t0 + 3 * S),
            Some(Change::Fenced { since: t0 + 2 * S })
        );
        assert_eq!(f.poll(t0 + 4 * S), None);
        // Renewed again (the same lease, or a new one): live again.
        assert!(f.renewed(t0 + 4 * S, 2 * S));
        assert_eq!(f.poll(t0 + 4 * S), Some(Change::Live));
    }

    #[test]
    fn a_late_answer_never_shortens_the_deadline() {
        let t0 = Instant::now();
        let mut f = Fence::default();
        assert!(f.renewed(t0 + S, 2 * S));
        // The answer to a request sent earlier arrives after.
        assert!(f.renewed(t0, 2 * S));
        assert_eq!(f.until(), Some(t0 + 3 * S));
    }

    #[test]
    fn a_lost_lease_fences_at_once() {
        let t0 = Instant::now();
        let mut f = Fence::default();
        assert!(f.renewed(t0, 5 * S));
        assert_eq!(f.poll(t0), Some(Change::Live));
        f.lost(t0 + S);
        assert!(!f.is_live(t0 + S));
        assert_eq!(f.poll(t0 + S), Some(Change::Fenced { since: t0 + S }));
        // A deadline already past stays where it was.
        f.lost(t0 + 2 * S);
        assert_eq!(f.until(), Some(t0 + S));
    }

    #[test]
    fn a_ttl_out_of_range_changes_nothing() {
        let t0 = Instant::now();
        let mut f = Fence::default();
        assert!(f.renewed(t0, S));
        assert!(!f.renewed(t0, Duration::MAX));
        assert_eq!(f.until(), Some(t0 + S));
    }
}
