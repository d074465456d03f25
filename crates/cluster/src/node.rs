//! A node of the pair: its lease and fencing deadline, its campaign for
//! each device group, and the reservation state it saves and watches. One
//! background thread does the lease, the campaign and the polling; `save`
//! and `load` run on the caller's thread with their own bounded client.

use std::collections::HashMap;
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::Error;
use crate::etcd::{Etcd, KeyValue, Lease, LeaseId, Revision};
use crate::fence::{Change, Fence};

/// How a node finds etcd and the pair's keys.
#[derive(Debug, Clone)]
pub struct NodeConfig {
    /// etcd client URLs (`http://host:port`), tried in turn.
    pub endpoints: Vec<String>,
    /// This node's name, unique in the pair; the value of the owner keys it
    /// holds.
    pub node_id: String,
    /// The pair's key prefix, e.g. `/ferrite/<cluster>`.
    pub prefix: String,
    /// The lease TTL (whole seconds; etcd may grant more).
    pub lease_ttl: Duration,
    /// How often the owners and the reservation keys are read.
    pub poll_interval: Duration,
    /// The bound on one `save` or `load`.
    pub request_timeout: Duration,
}

impl NodeConfig {
    /// A configuration with the defaults: a 5 s lease, polling every
    /// TTL / 5, `save` and `load` bounded by 1 s.
    pub fn new(endpoints: Vec<String>, node_id: &str, prefix: &str) -> NodeConfig {
        let lease_ttl = Duration::from_secs(5);
        NodeConfig {
            endpoints,
            node_id: node_id.to_string(),
            prefix: prefix.trim_end_matches('/').to_string(),
            lease_ttl,
            poll_interval: lease_ttl / 5,
            request_timeout: Duration::from_secs(1),
        }
    }

    /// The same configuration with `ttl` as the lease TTL and TTL / 5 as the
    /// poll interval.
    pub fn with_lease_ttl(mut self, ttl: Duration) -> NodeConfig {
        self.lease_ttl = ttl;
        self.poll_interval = ttl / 5;
        self
    }

    /// A live node's presence, on its lease.
    fn node_key(&self, node: &str) -> String {
        format!("{}/nodes/{node}", self.prefix)
    }

    fn nodes_prefix(&self) -> String {
        format!("{}/nodes/", self.prefix)
    }

    /// The revision of `device`'s reservation state `node` applied, on its
    /// lease.
    fn applied_key(&self, device: &str, node: &str) -> String {
        format!("{}/applied/{device}/{node}", self.prefix)
    }

    fn applied_prefix(&self, device: &str) -> String {
        format!("{}/applied/{device}/", self.prefix)
    }

    fn owner_key(&self, group: &str) -> String {
        format!("{}/dg/{group}/owner", self.prefix)
    }

    fn pr_prefix(&self) -> String {
        format!("{}/pr/", self.prefix)
    }
}

/// What the node's thread reports, in order, on that thread.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// The node holds a lease that etcd renewed: it may act as owner of the
    /// groups it owns. Every group's owner is reported again right after.
    Live,
    /// The fencing deadline `since` passed without a renewal: etcd may have
    /// expired the lease, so the node owns nothing (every earlier
    /// `Owner { me: true }` is void) until `Live` and a new `Owner` event.
    Fenced { since: Instant },
    /// The owner of `group` as etcd says, reported on every change and the
    /// first time. `me` is true only while the node is live and the key is
    /// held by its current lease.
    Owner {
        group: String,
        owner: Option<String>,
        me: bool,
    },
    /// Another node wrote `device`'s reservation state (also reported once
    /// for every device found at start).
    Reservations { device: String, bytes: Vec<u8> },
}

/// State the handle and the thread share. Not on a data path.
#[derive(Debug, Default)]
struct State {
    /// The fencing deadline: `t_sent + ttl` of the last keepalive (or grant)
    /// that succeeded.
    fence: Fence,
    /// Per group: (owner, me) as last reported.
    owners: HashMap<String, (Option<String>, bool)>,
}

#[derive(Debug, Default)]
struct Shared {
    state: Mutex<State>,
    /// Per device: what this node knows of its reservation key.
    pr: Mutex<HashMap<String, PrKnown>>,
}

/// What a node knows of one device's reservation key.
#[derive(Debug, Default, Clone, Copy)]
struct PrKnown {
    /// The mod revision this node last wrote, read or reported (0: known
    /// absent).
    rev: Revision,
    /// Saves in flight: the poll leaves the device alone meanwhile, so it
    /// never reports the node's own write back. No lock is held across I/O.
    saving: u32,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic elsewhere leaves plain data behind; keep using it.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

enum Stop {
    /// Revoke the lease, so the other node takes over at once.
    Clean,
    /// Just stop, as if the process died.
    Crash,
}

/// A running node: its background thread and its `save` / `load` client.
pub struct Node {
    cfg: NodeConfig,
    shared: Arc<Shared>,
    etcd: Etcd,
    stop: Mutex<Option<mpsc::Sender<Stop>>>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl std::fmt::Debug for Node {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Node")
            .field("node_id", &self.cfg.node_id)
            .field("prefix", &self.cfg.prefix)
            .finish_non_exhaustive()
    }
}

impl Node {
    /// Starts the node's thread: it gets a lease, campaigns for each of
    /// `device_groups` and reports to `events`. etcd need not be reachable
    /// yet; the thread keeps trying.
    pub fn start(
        cfg: NodeConfig,
        device_groups: Vec<String>,
        events: impl Fn(Event) + Send + 'static,
    ) -> Result<Node, Error> {
        if cfg.node_id.is_empty() || cfg.node_id.contains('/') {
            return Err(Error::Config(format!("bad node id {:?}", cfg.node_id)));
        }
        if cfg.lease_ttl < Duration::from_secs(1) {
            return Err(Error::Config("lease TTL under one second".into()));
        }
        if cfg.poll_interval.is_zero() || cfg.poll_interval >= cfg.lease_ttl {
            return Err(Error::Config(
                "poll interval must be above zero and below the lease TTL".into(),
            ));
        }
        if let Some(g) = device_groups
            .iter()
            .find(|g| g.is_empty() || g.contains('/'))
        {
            return Err(Error::Config(format!("bad device group name {g:?}")));
        }
        let etcd = Etcd::new(&cfg.endpoints, cfg.request_timeout)?;
        let shared = Arc::new(Shared::default());
        let (tx, rx) = mpsc::channel();
        let worker = Worker {
            // The thread's calls are bounded by the poll interval, so a
            // stalled etcd delays neither the fencing report nor a stop.
            etcd: etcd.with_timeout(cfg.poll_interval),
            cfg: cfg.clone(),
            groups: device_groups,
            shared: shared.clone(),
            events: Box::new(events),
            rx,
            lease: None,
            next_keepalive: Instant::now(),
            present: false,
        };
        let thread = std::thread::Builder::new()
            .name(format!("cluster-{}", cfg.node_id))
            .spawn(move || worker.run())
            .map_err(|e| Error::Config(format!("cannot start the cluster thread: {e}")))?;
        Ok(Node {
            cfg,
            shared,
            etcd,
            stop: Mutex::new(Some(tx)),
            thread: Mutex::new(Some(thread)),
        })
    }

    /// This node's id.
    pub fn node_id(&self) -> &str {
        &self.cfg.node_id
    }

    /// Whether the fencing deadline is still ahead.
    pub fn is_live(&self) -> bool {
        lock(&self.shared.state).fence.is_live(Instant::now())
    }

    /// The fencing deadline: the node is live until then unless a keepalive
    /// moves it.
    pub fn live_until(&self) -> Option<Instant> {
        lock(&self.shared.state).fence.until()
    }

    /// Whether the node owns `group` now: live, and its lease holds the
    /// group's owner key as last read.
    pub fn owns(&self, group: &str) -> bool {
        let st = lock(&self.shared.state);
        st.fence.is_live(Instant::now()) && st.owners.get(group).is_some_and(|(_, me)| *me)
    }

    /// Writes `device`'s reservation state before returning, within the
    /// request timeout. The write succeeds only if the key is as this node
    /// last saw it (read, reported or written; absent if it never saw it);
    /// otherwise it is
    /// [`Error::Conflict`] and the other node's state arrives as an
    /// [`Event::Reservations`]. Any error means the state is not known to be
    /// saved: the command that changed it must fail. The outcome of a write
    /// that timed out is unknown: a stalled etcd may still apply it when it
    /// resumes. If it does, this node is told by an
    /// [`Event::Reservations`] like of any write it did not see succeed, and
    /// its next `save` before that is a [`Error::Conflict`].
    pub fn save(&self, device: &str, bytes: &[u8]) -> Result<(), Error> {
        let key = self.pr_key(device)?;
        // A device this node has not seen is expected absent: if another
        // node wrote it, the save is a conflict and the poll reports it.
        let expected = {
            let mut pr = lock(&self.shared.pr);
            let known = pr.entry(device.to_string()).or_default();
            known.saving += 1;
            known.rev
        };
        let result = self.etcd.compare_and_put(&key, expected, bytes, None);
        let mut pr = lock(&self.shared.pr);
        let known = pr.entry(device.to_string()).or_default();
        known.saving = known.saving.saturating_sub(1);
        let rev = match result? {
            Some(rev) => {
                known.rev = known.rev.max(rev);
                rev
            }
            None => {
                return Err(Error::Conflict {
                    device: device.to_string(),
                });
            }
        };
        drop(pr);
        self.wait_applied(device, rev)
    }

    /// Waits until every other live node (its presence key on its lease)
    /// applied `device`'s state at revision `rev` or later, so that once a
    /// reservation's command answers, no node serves as if it were not
    /// there. A node that stops renewing loses its presence with its lease
    /// (and fences itself by then), so the wait is bounded by a lease TTL
    /// and two polls.
    fn wait_applied(&self, device: &str, rev: Revision) -> Result<(), Error> {
        let deadline = Instant::now() + self.cfg.lease_ttl + 2 * self.cfg.poll_interval;
        let step = (self.cfg.poll_interval / 8).max(Duration::from_millis(10));
        loop {
            let nodes = self.etcd.get_prefix(&self.cfg.nodes_prefix())?;
            let applied = self.etcd.get_prefix(&self.cfg.applied_prefix(device))?;
            let pending: Vec<String> = nodes
                .iter()
                .map(|kv| String::from_utf8_lossy(&kv.value).into_owned())
                .filter(|n| *n != self.cfg.node_id)
                .filter(|n| {
                    !applied.iter().any(|kv| {
                        kv.key == self.cfg.applied_key(device, n)
                            && std::str::from_utf8(&kv.value)
                                .ok()
                                .and_then(|v| v.parse::<Revision>().ok())
                                .is_some_and(|r| r >= rev)
                    })
                })
                .collect();
            if pending.is_empty() {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(Error::NotApplied {
                    device: device.to_string(),
                    nodes: pending,
                });
            }
            std::thread::sleep(step);
        }
    }

    /// Reads `device`'s reservation state, within the request timeout.
    /// What it returns counts as seen: the poll does not report it again.
    pub fn load(&self, device: &str) -> Result<Option<Vec<u8>>, Error> {
        let key = self.pr_key(device)?;
        let kv = self.etcd.get(&key)?;
        let rev = kv.as_ref().map_or(0, |kv| kv.mod_revision);
        let mut pr = lock(&self.shared.pr);
        let known = pr.entry(device.to_string()).or_default();
        known.rev = known.rev.max(rev);
        Ok(kv.map(|kv| kv.value))
    }

    fn pr_key(&self, device: &str) -> Result<String, Error> {
        if device.is_empty() || device.contains('/') {
            return Err(Error::Config(format!("bad device name {device:?}")));
        }
        Ok(format!("{}{device}", self.cfg.pr_prefix()))
    }

    /// Stops cleanly: the thread revokes the lease (deleting the owner keys
    /// it held, so the other node takes over at its next poll) and ends.
    /// Shared handles (a reservation store per device) may do it through
    /// `&self`; calls after the first do nothing.
    pub fn stop(&self) {
        self.finish(Stop::Clean);
    }

    /// Stops the thread without revoking, as if the process died: the
    /// lease lives until etcd expires it. Returns the fencing deadline the
    /// node held, after which the other node may take over.
    pub fn crash(&self) -> Option<Instant> {
        let until = self.live_until();
        self.finish(Stop::Crash);
        until
    }

    fn finish(&self, how: Stop) {
        if let Some(tx) = lock(&self.stop).take() {
            let _ = tx.send(how);
        }
        let thread = lock(&self.thread).take();
        if let Some(t) = thread {
            let _ = t.join();
        }
    }
}

impl Drop for Node {
    /// Dropping a node is a crash: no revoke.
    fn drop(&mut self) {
        self.finish(Stop::Crash);
    }
}

struct Worker {
    cfg: NodeConfig,
    etcd: Etcd,
    groups: Vec<String>,
    shared: Arc<Shared>,
    events: Box<dyn Fn(Event) + Send>,
    rx: mpsc::Receiver<Stop>,
    lease: Option<LeaseId>,
    next_keepalive: Instant,
    /// Whether this lease carries the node's presence key yet.
    present: bool,
}

impl Worker {
    fn run(mut self) {
        let mut next_poll = Instant::now();
        loop {
            self.tend_lease();
            self.check_fence();
            let now = Instant::now();
            if now >= next_poll {
                next_poll = now + self.cfg.poll_interval;
                if self.live_now() {
                    self.announce();
                    self.campaign();
                    self.check_fence();
                }
                self.poll_reservations();
                self.check_fence();
            }
            let mut wake = next_poll.min(self.next_keepalive);
            if let Some(t) = self.live_until().filter(|_| self.live_now()) {
                wake = wake.min(t);
            }
            let wait = wake.saturating_duration_since(Instant::now());
            match self.rx.recv_timeout(wait) {
                Err(RecvTimeoutError::Timeout) => {}
                Ok(Stop::Clean) => {
                    if let Some(l) = self.lease.take()
                        && let Err(e) = self.etcd.revoke(l)
                    {
                        tracing::warn!(node = %self.cfg.node_id, error = %e,
                                "cannot revoke the lease; the other node takes over when it expires");
                    }
                    self.fence_now();
                    return;
                }
                Ok(Stop::Crash) | Err(RecvTimeoutError::Disconnected) => return,
            }
        }
    }

    fn live_until(&self) -> Option<Instant> {
        lock(&self.shared.state).fence.until()
    }

    /// Whether the fencing deadline is still ahead.
    fn live_now(&self) -> bool {
        lock(&self.shared.state).fence.is_live(Instant::now())
    }

    fn renewed(&mut self, t_sent: Instant, lease: Lease) {
        if !lock(&self.shared.state).fence.renewed(t_sent, lease.ttl) {
            tracing::warn!(node = %self.cfg.node_id, ttl = ?lease.ttl, "lease TTL out of range; not renewed");
            return;
        }
        self.next_keepalive = t_sent + lease.ttl / 3;
    }

    fn fence_now(&self) {
        lock(&self.shared.state).fence.lost(Instant::now());
    }

    /// Grants a lease when the node has none; renews it when due.
    fn tend_lease(&mut self) {
        let now = Instant::now();
        if now < self.next_keepalive {
            return;
        }
        let t_sent = Instant::now();
        match self.lease {
            None => match self.etcd.grant(self.cfg.lease_ttl) {
                Ok(lease) => {
                    tracing::info!(node = %self.cfg.node_id, lease = lease.id.0, ttl = ?lease.ttl, "lease granted");
                    self.lease = Some(lease.id);
                    // A new lease: whatever the old one held is gone.
                    self.fence_now();
                    self.renewed(t_sent, lease);
                    self.present = false;
                }
                Err(e) => {
                    tracing::debug!(node = %self.cfg.node_id, error = %e, "lease grant failed");
                    self.next_keepalive = now + self.cfg.poll_interval;
                }
            },
            Some(id) => match self.etcd.keepalive(id) {
                Ok(ttl) => self.renewed(t_sent, Lease { id, ttl }),
                Err(Error::LeaseNotFound) => {
                    tracing::warn!(node = %self.cfg.node_id, lease = id.0, "lease expired");
                    self.lease = None;
                    self.fence_now();
                    self.next_keepalive = now;
                }
                Err(e) => {
                    tracing::debug!(node = %self.cfg.node_id, error = %e, "keepalive failed");
                    self.next_keepalive = now + self.cfg.poll_interval;
                }
            },
        }
    }

    /// Reports `Fenced` when the deadline passed, `Live` when a lease is
    /// renewed again.
    fn check_fence(&mut self) {
        let change = {
            let mut st = lock(&self.shared.state);
            let change = st.fence.poll(Instant::now());
            if matches!(change, Some(Change::Fenced { .. })) {
                // Every group's owner is reported afresh once live again.
                st.owners.clear();
            }
            change
        };
        match change {
            Some(Change::Fenced { since }) => {
                tracing::warn!(node = %self.cfg.node_id, "fenced: lease not renewed in time");
                (self.events)(Event::Fenced { since });
            }
            Some(Change::Live) => {
                tracing::info!(node = %self.cfg.node_id, "live");
                (self.events)(Event::Live);
                self.campaign();
            }
            None => {}
        }
    }

    /// For each group: create the owner key with this node's lease if it is
    /// absent, then report its owner if it changed.
    fn campaign(&mut self) {
        let Some(lease) = self.lease else { return };
        for group in self.groups.clone() {
            if !self.live_now() {
                // Past the deadline: report Fenced first, not after every
                // group's requests timed out.
                break;
            }
            let key = self.cfg.owner_key(&group);
            let mut seen = None;
            for _ in 0..2 {
                match self.etcd.get(&key) {
                    Ok(None) => {
                        match self
                            .etcd
                            .create(&key, self.cfg.node_id.as_bytes(), Some(lease))
                        {
                            Ok(Some(_)) => {
                                tracing::info!(node = %self.cfg.node_id, group, "won the device group");
                                seen = Some((Some(self.cfg.node_id.clone()), true));
                                break;
                            }
                            // Someone else was first: read who.
                            Ok(None) => continue,
                            Err(e) => {
                                tracing::debug!(node = %self.cfg.node_id, group, error = %e, "campaign failed");
                                break;
                            }
                        }
                    }
                    Ok(Some(kv)) => {
                        let owner = String::from_utf8_lossy(&kv.value).into_owned();
                        let mine = owner == self.cfg.node_id;
                        let mut me = mine && kv.lease == Some(lease);
                        if mine && !me {
                            // This node's name under another lease: a claim
                            // left by an earlier run of this node. Move it
                            // to the current lease, unless it changed.
                            me = matches!(
                                self.etcd.compare_and_put(
                                    &key,
                                    kv.mod_revision,
                                    owner.as_bytes(),
                                    Some(lease)
                                ),
                                Ok(Some(_))
                            );
                        }
                        seen = Some((Some(owner), me));
                        break;
                    }
                    Err(e) => {
                        tracing::debug!(node = %self.cfg.node_id, group, error = %e, "owner read failed");
                        break;
                    }
                }
            }
            let Some((owner, me)) = seen else { continue };
            // `me` means nothing past the fencing deadline.
            let me = me && self.live_now();
            let mut st = lock(&self.shared.state);
            if st.owners.get(&group) == Some(&(owner.clone(), me)) {
                continue;
            }
            st.owners.insert(group.clone(), (owner.clone(), me));
            drop(st);
            (self.events)(Event::Owner { group, owner, me });
        }
    }

    /// Puts the node's presence key on its lease (once per lease): the
    /// nodes whose applying a reservation change waits for.
    fn announce(&mut self) {
        let Some(lease) = self.lease.filter(|_| !self.present) else {
            return;
        };
        let key = self.cfg.node_key(&self.cfg.node_id);
        match self
            .etcd
            .put(&key, self.cfg.node_id.as_bytes(), Some(lease))
        {
            Ok(_) => self.present = true,
            Err(e) => tracing::debug!(node = %self.cfg.node_id, error = %e, "presence not written"),
        }
    }

    /// Reports reservation keys written since this node last saw them, and
    /// once each is reported (the daemon applied it on this thread), says
    /// so under `applied/` for the writer waiting on it.
    fn poll_reservations(&mut self) {
        let prefix = self.cfg.pr_prefix();
        let kvs = match self.etcd.get_prefix(&prefix) {
            Ok(kvs) => kvs,
            Err(e) => {
                tracing::debug!(node = %self.cfg.node_id, error = %e, "reservation poll failed");
                return;
            }
        };
        let revs: HashMap<String, Revision> = kvs
            .iter()
            .filter_map(|kv| Some((kv.key.strip_prefix(&prefix)?.to_string(), kv.mod_revision)))
            .collect();
        let changed = newer(&mut lock(&self.shared.pr), &prefix, kvs);
        for ev in changed {
            let applied = match &ev {
                Event::Reservations { device, .. } => {
                    revs.get(device).map(|r| (device.clone(), *r))
                }
                _ => None,
            };
            (self.events)(ev);
            if let (Some((device, rev)), Some(lease)) = (applied, self.lease) {
                let key = self.cfg.applied_key(&device, &self.cfg.node_id);
                if let Err(e) = self.etcd.put(&key, rev.to_string().as_bytes(), Some(lease)) {
                    tracing::debug!(node = %self.cfg.node_id, error = %e, "applied revision not written");
                }
            }
        }
    }
}

/// The reservation keys under `prefix` written since this node last saw
/// them (all of them the first time), as events; records what it reports.
/// A device with a save in flight is left for the next poll, so the node's
/// own write is never reported back.
fn newer(known: &mut HashMap<String, PrKnown>, prefix: &str, kvs: Vec<KeyValue>) -> Vec<Event> {
    let mut changed = Vec::new();
    for kv in kvs {
        let Some(device) = kv.key.strip_prefix(prefix) else {
            continue;
        };
        let k = known.get(device).copied();
        if k.is_some_and(|k| k.saving > 0) {
            continue;
        }
        if k.is_none_or(|k| kv.mod_revision > k.rev) {
            known.insert(
                device.to_string(),
                PrKnown {
                    rev: kv.mod_revision,
                    saving: 0,
                },
            );
            changed.push(Event::Reservations {
                device: device.to_string(),
                bytes: kv.value,
            });
        }
    }
    changed
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kv(device: &str, rev: Revision, value: &[u8]) -> KeyValue {
        KeyValue {
            key: format!("/p/pr/{device}"),
            value: value.to_vec(),
            create_revision: 1,
            mod_revision: rev,
            lease: None,
        }
    }

    fn reported(events: &[Event]) -> Vec<(&str, &[u8])> {
        events
            .iter()
            .filter_map(|e| match e {
                Event::Reservations { device, bytes } => Some((device.as_str(), bytes.as_slice())),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn reservations_reported_once_per_revision() {
        let mut known = HashMap::new();
        let ev = newer(
            &mut known,
            "/p/pr/",
            vec![kv("a", 5, b"x"), kv("b", 6, b"y")],
        );
        assert_eq!(reported(&ev), [("a", &b"x"[..]), ("b", &b"y"[..])]);
        let ev = newer(
            &mut known,
            "/p/pr/",
            vec![kv("a", 5, b"x"), kv("b", 9, b"z")],
        );
        assert_eq!(reported(&ev), [("b", &b"z"[..])]);
        // An older read (a slow poll) reports nothing.
        let ev = newer(&mut known, "/p/pr/", vec![kv("b", 6, b"y")]);
        assert!(ev.is_empty());
    }

    #[test]
    fn own_writes_and_loads_are_not_reported() {
        let mut known = HashMap::new();
        // A save in flight: its write may already show; leave it.
        known.insert("a".to_string(), PrKnown { rev: 3, saving: 1 });
        assert!(newer(&mut known, "/p/pr/", vec![kv("a", 7, b"mine")]).is_empty());
        // The save finished and recorded its revision.
        known.insert("a".to_string(), PrKnown { rev: 7, saving: 0 });
        assert!(newer(&mut known, "/p/pr/", vec![kv("a", 7, b"mine")]).is_empty());
        // Another node writes after it.
        let ev = newer(&mut known, "/p/pr/", vec![kv("a", 8, b"theirs")]);
        assert_eq!(reported(&ev), [("a", &b"theirs"[..])]);
    }
}
