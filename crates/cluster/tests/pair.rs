//! Two nodes of an HA pair against a real etcd: the campaign, a crash, a
//! clean stop, etcd stalled and restarted, reservation state. TTLs are short
//! (2 s) and every wait is bounded by several TTLs, so a slow machine makes
//! the tests slower, not red.

mod common;

use std::time::{Duration, Instant};

use common::{EtcdProc, Recorder, owner_me};
use ferrite_cluster::{Error, Event, Node, NodeConfig};

const TTL: Duration = Duration::from_secs(2);
const POLL: Duration = Duration::from_millis(400);
/// The bound on anything that should take about one TTL.
const SLACK: Duration = Duration::from_secs(10);
const DG: &str = "dg0";

fn config(etcd: &EtcdProc, id: &str) -> NodeConfig {
    let mut c = NodeConfig::new(vec![etcd.endpoint()], id, "/ferrite/test").with_lease_ttl(TTL);
    c.request_timeout = Duration::from_millis(1500);
    c
}

fn start(etcd: &EtcdProc, rec: &Recorder, id: &str) -> Node {
    Node::start(config(etcd, id), vec![DG.to_string()], rec.sink(id)).expect("start node")
}

/// The owner of DG as `node` last reported it, from `from` on.
/// Waits from `mark` until both nodes are live again and one owns the
/// group; checks both name the same owner and exactly one is it. Returns
/// (a owns, b owns).
fn converged(rec: &mut Recorder, mark: usize) -> (bool, bool) {
    rec.wait(mark, 3 * TTL + SLACK, "a live", |n, e| {
        n == "a" && *e == Event::Live
    });
    rec.wait(mark, 3 * TTL + SLACK, "b live", |n, e| {
        n == "b" && *e == Event::Live
    });
    rec.wait(mark, 3 * TTL + SLACK, "an owner", |_, e| {
        matches!(e, Event::Owner { me: true, .. })
    });
    rec.drain(3 * POLL);
    let (oa, ma) = last_owner(rec, "a").expect("a owner");
    let (ob, mb) = last_owner(rec, "b").expect("b owner");
    assert_eq!(oa, ob);
    assert!(ma ^ mb, "exactly one owner: a {ma}, b {mb}");
    (ma, mb)
}

fn last_owner(rec: &Recorder, node: &str) -> Option<(Option<String>, bool)> {
    rec.log.iter().rev().find_map(|(n, _, e)| match e {
        Event::Owner { group, owner, me } if n == node && group == DG => Some((owner.clone(), *me)),
        Event::Fenced { .. } if n == node => Some((None, false)),
        _ => None,
    })
}

/// Starts A, waits until it owns DG, then starts B and waits until B sees A.
fn pair(etcd: &EtcdProc, rec: &mut Recorder) -> (Node, Node) {
    let a = start(etcd, rec, "a");
    rec.wait(0, SLACK, "a owner", owner_me("a", DG));
    let b = start(etcd, rec, "b");
    rec.wait(0, SLACK, "b sees a", |n, e| {
        n == "b" && matches!(e, Event::Owner { owner: Some(o), me: false, .. } if o == "a")
    });
    (a, b)
}

#[test]
fn two_nodes_one_owner() {
    let Some(etcd) = EtcdProc::start("two_nodes_one_owner") else {
        return;
    };
    let mut rec = Recorder::new();
    // Started together: whichever creates the key first owns the group.
    let a = start(&etcd, &rec, "a");
    let b = start(&etcd, &rec, "b");
    rec.wait(0, SLACK, "a live", |n, e| n == "a" && *e == Event::Live);
    rec.wait(0, SLACK, "b live", |n, e| n == "b" && *e == Event::Live);
    rec.wait(0, SLACK, "an owner", |_, e| {
        matches!(e, Event::Owner { me: true, .. })
    });
    rec.drain(3 * POLL);
    let (oa, ma) = last_owner(&rec, "a").expect("a reported the owner");
    let (ob, mb) = last_owner(&rec, "b").expect("b reported the owner");
    assert_eq!(oa, ob, "both see the same owner");
    assert!(ma ^ mb, "exactly one owner: a {ma}, b {mb}");
    let owner = oa.expect("an owner");
    assert_eq!(a.owns(DG), owner == "a");
    assert_eq!(b.owns(DG), owner == "b");
    assert!(a.is_live() && b.is_live());
    let kv = etcd
        .client()
        .get("/ferrite/test/dg/dg0/owner")
        .expect("get")
        .expect("owner key");
    assert_eq!(String::from_utf8_lossy(&kv.value), owner);
    rec.assert_never_two_owners(DG, Instant::now());
}

#[test]
fn crashed_owner_is_replaced_after_its_lease_and_not_before_its_fencing_deadline() {
    let Some(etcd) = EtcdProc::start("crashed_owner") else {
        return;
    };
    let mut rec = Recorder::new();
    let (a, b) = pair(&etcd, &mut rec);
    let mark = rec.mark();
    let crashed = Instant::now();
    let deadline = a.crash().expect("a was live");
    // A dead node believed itself owner until its fencing deadline at most.
    rec.mark();
    rec.log
        .push(("a".into(), deadline, Event::Fenced { since: deadline }));
    let (_, took_over, _) = rec.wait(mark, TTL + SLACK, "b owner", owner_me("b", DG));
    assert!(
        took_over >= deadline,
        "b took over {:?} before a's fencing deadline",
        deadline - took_over
    );
    // etcd expires the lease about one TTL after the last keepalive.
    assert!(
        took_over - crashed < 2 * TTL + 4 * POLL + Duration::from_secs(3),
        "took {:?}",
        took_over - crashed
    );
    assert!(b.owns(DG));
    // A restarted `a` finds b the owner and stays non-owner.
    let mark = rec.mark();
    let a = start(&etcd, &rec, "a");
    rec.wait(mark, SLACK, "a sees b", |n, e| {
        n == "a" && matches!(e, Event::Owner { owner: Some(o), me: false, .. } if o == "b")
    });
    rec.drain(3 * POLL);
    assert!(!a.owns(DG) && b.owns(DG));
    rec.assert_never_two_owners(DG, Instant::now());
}

#[test]
fn clean_stop_hands_over_at_once() {
    let Some(etcd) = EtcdProc::start("clean_stop") else {
        return;
    };
    let mut rec = Recorder::new();
    let (a, b) = pair(&etcd, &mut rec);
    let mark = rec.mark();
    let stopped = Instant::now();
    a.stop();
    rec.mark();
    rec.log.push((
        "a".into(),
        Instant::now(),
        Event::Fenced {
            since: Instant::now(),
        },
    ));
    let (_, took_over, _) = rec.wait(mark, SLACK, "b owner", owner_me("b", DG));
    // The revoke deletes the key: b wins at its next poll, well inside a TTL.
    assert!(took_over - stopped < TTL, "took {:?}", took_over - stopped);
    assert!(b.owns(DG));
    rec.assert_never_two_owners(DG, Instant::now());
}

#[test]
fn stalled_etcd_fences_the_owner_and_fails_saves_then_converges() {
    let Some(etcd) = EtcdProc::start("stalled_etcd") else {
        return;
    };
    let mut rec = Recorder::new();
    let (a, b) = pair(&etcd, &mut rec);
    a.save("lun0", b"before").expect("save");

    let mark = rec.mark();
    let stalled = Instant::now();
    etcd.pause();
    let (_, seen, ev) = rec.wait(mark, TTL + SLACK, "a fenced", |n, e| {
        n == "a" && matches!(e, Event::Fenced { .. })
    });
    let Event::Fenced { since } = ev else {
        unreachable!()
    };
    // The rule: live until t_sent + ttl of the last renewal, sent before the stall.
    assert!(
        since <= stalled + TTL,
        "deadline {:?} after stall + ttl",
        since - (stalled + TTL)
    );
    assert!(
        seen - stalled < TTL + POLL + Duration::from_secs(2),
        "fenced after {:?}",
        seen - stalled
    );
    assert!(!a.owns(DG) && !a.is_live());
    rec.wait(mark, TTL + SLACK, "b fenced", |n, e| {
        n == "b" && matches!(e, Event::Fenced { .. })
    });

    // save fails within its timeout instead of hanging.
    let t = Instant::now();
    let r = a.save("lun0", b"during");
    assert!(matches!(r, Err(Error::Unavailable { .. })), "{r:?}");
    assert!(
        t.elapsed() < Duration::from_millis(1500) + Duration::from_secs(2),
        "save took {:?}",
        t.elapsed()
    );
    assert!(a.load("lun0").is_err());

    // Stalled for longer than the TTL, then back: both live again and one
    // owner, without an operator.
    std::thread::sleep(TTL);
    let mark = rec.mark();
    etcd.resume();
    let (ma, mb) = converged(&mut rec, mark);
    assert_eq!(a.owns(DG), ma);
    assert_eq!(b.owns(DG), mb);
    rec.assert_never_two_owners(DG, Instant::now());
    // A failed save's outcome is unknown: the stalled etcd may still apply
    // it once resumed (its compare on the revision keeps it from clobbering
    // a later write). If it did, a is told like of any write it did not see
    // succeed, and then saves on top of it.
    let now = b.load("lun0").expect("load").expect("present");
    if now == b"during" {
        rec.wait(mark, SLACK, "a told of its late write", |n, e| {
            n == "a" && matches!(e, Event::Reservations { bytes, .. } if bytes == b"during")
        });
    } else {
        assert_eq!(now, b"before");
    }
    a.save("lun0", b"after").expect("save after resume");
    assert_eq!(b.load("lun0").expect("load"), Some(b"after".to_vec()));
}

#[test]
fn etcd_restarted_on_its_data_dir_converges() {
    let Some(mut etcd) = EtcdProc::start("etcd_restarted") else {
        return;
    };
    let mut rec = Recorder::new();
    let (a, b) = pair(&etcd, &mut rec);
    let mark = rec.mark();
    etcd.kill();
    rec.wait(mark, TTL + SLACK, "a fenced", |n, e| {
        n == "a" && matches!(e, Event::Fenced { .. })
    });
    let t = Instant::now();
    assert!(a.save("lun0", b"x").is_err());
    assert!(
        t.elapsed() < Duration::from_secs(4),
        "save took {:?}",
        t.elapsed()
    );
    let mark = rec.mark();
    etcd.restart();
    converged(&mut rec, mark);
    rec.assert_never_two_owners(DG, Instant::now());
    drop(b);
}

#[test]
fn reservations_saved_on_one_node_reach_the_other() {
    let Some(etcd) = EtcdProc::start("reservations") else {
        return;
    };
    let mut rec = Recorder::new();
    let (a, b) = pair(&etcd, &mut rec);
    assert_eq!(b.load("lun0").expect("load"), None);

    let mark = rec.mark();
    a.save("lun0", b"registrations v1").expect("save");
    let saved = Instant::now();
    let (_, told, ev) = rec.wait(mark, SLACK, "b told", |n, e| {
        n == "b" && matches!(e, Event::Reservations { .. })
    });
    // The save returned only once b had applied it.
    assert!(
        told <= saved,
        "b told {:?} after the save returned",
        told - saved
    );
    assert_eq!(
        ev,
        Event::Reservations {
            device: "lun0".into(),
            bytes: b"registrations v1".to_vec()
        }
    );
    assert_eq!(
        b.load("lun0").expect("load"),
        Some(b"registrations v1".to_vec())
    );

    // b writes on top of what it was told; a hears of it, not of its own write.
    b.save("lun0", b"registrations v2").expect("save on top");
    let (_, _, ev) = rec.wait(mark, SLACK, "a told", |n, e| {
        n == "a" && matches!(e, Event::Reservations { .. })
    });
    assert_eq!(
        ev,
        Event::Reservations {
            device: "lun0".into(),
            bytes: b"registrations v2".to_vec()
        }
    );
    rec.drain(3 * POLL);
    let own: Vec<_> = rec.log[mark..]
        .iter()
        .filter(|(n, _, e)| {
            matches!(e, Event::Reservations { bytes, .. }
                if (n == "a" && bytes == b"registrations v1") || (n == "b" && bytes == b"registrations v2"))
        })
        .collect();
    assert!(own.is_empty(), "own writes reported back: {own:?}");

    // A write a has not seen yet: a's save is refused, not lost over it.
    let mark = rec.mark();
    etcd.client()
        .put("/ferrite/test/pr/lun0", b"from elsewhere", None)
        .expect("put");
    match a.save("lun0", b"stale") {
        Err(Error::Conflict { device }) => assert_eq!(device, "lun0"),
        // a's poll got there first: then it was told before saving.
        Ok(()) => assert!(
            rec.log[mark..].iter().any(|(n, _, e)| n == "a"
                && matches!(e, Event::Reservations { bytes, .. } if bytes == b"from elsewhere"))
                || {
                    rec.drain(Duration::ZERO);
                    rec.log[mark..].iter().any(|(n, _, e)| n == "a"
            && matches!(e, Event::Reservations { bytes, .. } if bytes == b"from elsewhere"))
                }
        ),
        Err(e) => panic!("save: {e}"),
    }
    rec.wait(mark, SLACK, "a told of the other write", |n, e| {
        n == "a" && matches!(e, Event::Reservations { bytes, .. } if bytes == b"from elsewhere")
    });
    a.save("lun0", b"merged").expect("save after being told");
    assert_eq!(b.load("lun0").expect("load"), Some(b"merged".to_vec()));
    drop(b);
}

#[test]
fn a_node_restarted_under_its_own_name_takes_its_claim_back() {
    let Some(etcd) = EtcdProc::start("restarted_under_its_own_name") else {
        return;
    };
    let mut rec = Recorder::new();
    let (a, b) = pair(&etcd, &mut rec);
    let old_lease = etcd
        .client()
        .get("/ferrite/test/dg/dg0/owner")
        .expect("get")
        .expect("key")
        .lease;
    let deadline = a.crash().expect("a was live");
    rec.mark();
    rec.log
        .push(("a".into(), deadline, Event::Fenced { since: deadline }));
    // Back before its old lease expires: the key still names it, under the
    // dead run's lease; it moves the claim to its new lease.
    let mark = rec.mark();
    let a = start(&etcd, &rec, "a");
    rec.wait(mark, SLACK, "a owner again", owner_me("a", DG));
    let kv = etcd
        .client()
        .get("/ferrite/test/dg/dg0/owner")
        .expect("get")
        .expect("key");
    assert_eq!(kv.value, b"a");
    assert_ne!(kv.lease, old_lease, "the claim is on the new lease");
    // The old lease expiring later takes nothing away.
    rec.drain(TTL + 4 * POLL);
    assert!(a.owns(DG) && !b.owns(DG));
    rec.assert_never_two_owners(DG, Instant::now());
}

#[test]
fn a_node_started_before_etcd_goes_live_when_etcd_comes() {
    let Some(mut etcd) = EtcdProc::start("started_before_etcd") else {
        return;
    };
    etcd.kill();
    let mut rec = Recorder::new();
    let a = start(&etcd, &rec, "a");
    rec.drain(TTL);
    assert!(rec.log.is_empty(), "events without etcd: {:?}", rec.log);
    assert!(!a.is_live() && !a.owns(DG));
    etcd.restart();
    rec.wait(0, SLACK, "a live", |n, e| n == "a" && *e == Event::Live);
    rec.wait(0, SLACK, "a owner", owner_me("a", DG));
    assert!(a.is_live() && a.owns(DG));
}

#[test]
fn a_save_waits_for_a_live_node_to_apply_it_and_not_for_a_dead_one() {
    let Some(etcd) = EtcdProc::start("applied") else {
        return;
    };
    let mut rec = Recorder::new();
    let (a, b) = pair(&etcd, &mut rec);
    a.save("lun0", b"v1").expect("save with b live");
    let until = b.crash();
    // b's presence lives on its lease: the save waits until it expired,
    // never past a TTL and two polls.
    let t = Instant::now();
    a.save("lun0", b"v2").expect("save with b dead");
    assert!(
        t.elapsed() <= TTL + 2 * POLL + SLACK,
        "save took {:?}",
        t.elapsed()
    );
    if let Some(until) = until {
        assert!(
            Instant::now() >= until,
            "returned before b's fencing deadline"
        );
    }
}
