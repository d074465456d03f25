//! The etcd client against a real etcd: KV, transactions, leases.

mod common;

use std::time::Duration;

use common::EtcdProc;
use ferrite_cluster::{Error, Etcd};

#[test]
fn kv_txn_and_lease_round_trips() {
    let Some(etcd) = EtcdProc::start("kv_txn_and_lease_round_trips") else {
        return;
    };
    let c = etcd.client();

    assert_eq!(c.get("/t/a").expect("get"), None);
    let r1 = c.put("/t/a", b"one", None).expect("put");
    let kv = c.get("/t/a").expect("get").expect("present");
    assert_eq!(kv.value, b"one");
    assert_eq!(kv.mod_revision, r1);
    assert_eq!(kv.create_revision, r1);
    assert_eq!(kv.lease, None);

    // create: only when absent.
    assert_eq!(c.create("/t/a", b"two", None).expect("create"), None);
    let r2 = c.create("/t/b", b"\x00\xffbin", None).expect("create");
    assert!(r2.is_some_and(|r| r > r1));
    assert_eq!(
        c.get("/t/b").expect("get").expect("present").value,
        b"\x00\xffbin"
    );

    // compare_and_put: only at the expected mod revision; 0 means absent.
    assert_eq!(
        c.compare_and_put("/t/a", r1 - 1, b"x", None).expect("cas"),
        None
    );
    let r3 = c
        .compare_and_put("/t/a", r1, b"three", None)
        .expect("cas")
        .expect("written");
    assert_eq!(
        c.get("/t/a").expect("get").expect("present").mod_revision,
        r3
    );
    assert_eq!(
        c.compare_and_put("/t/a", r1, b"four", None).expect("cas"),
        None
    );
    assert!(
        c.compare_and_put("/t/c", 0, b"new", None)
            .expect("cas")
            .is_some()
    );

    // get_prefix: in key order, nothing outside the prefix.
    c.put("/t0", b"outside", None).expect("put");
    let keys: Vec<String> = c
        .get_prefix("/t/")
        .expect("prefix")
        .into_iter()
        .map(|kv| kv.key)
        .collect();
    assert_eq!(keys, ["/t/a", "/t/b", "/t/c"]);

    assert!(c.delete("/t/b").expect("delete"));
    assert!(!c.delete("/t/b").expect("delete"));
    assert_eq!(c.get("/t/b").expect("get"), None);

    // Leases: keys attached to a lease go when it is revoked.
    let lease = c.grant(Duration::from_secs(30)).expect("grant");
    assert_eq!(lease.ttl, Duration::from_secs(30));
    c.put("/t/leased", b"v", Some(lease.id)).expect("put");
    assert_eq!(
        c.get("/t/leased").expect("get").expect("present").lease,
        Some(lease.id)
    );
    let ttl = c.keepalive(lease.id).expect("keepalive");
    assert!(
        ttl > Duration::from_secs(25) && ttl <= Duration::from_secs(30),
        "{ttl:?}"
    );
    c.revoke(lease.id).expect("revoke");
    assert_eq!(c.get("/t/leased").expect("get"), None);
    assert!(matches!(c.keepalive(lease.id), Err(Error::LeaseNotFound)));
    c.revoke(lease.id).expect("revoking a gone lease is fine");
    assert!(matches!(
        c.put("/t/x", b"v", Some(lease.id)),
        Err(Error::LeaseNotFound)
    ));

    // A lease that is not renewed expires, and its keys with it.
    let short = c.grant(Duration::from_secs(2)).expect("grant");
    c.put("/t/short", b"v", Some(short.id)).expect("put");
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    while c.get("/t/short").expect("get").is_some() {
        assert!(std::time::Instant::now() < deadline, "lease did not expire");
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(matches!(c.keepalive(short.id), Err(Error::LeaseNotFound)));
}

#[test]
fn endpoints_are_tried_in_turn_and_calls_are_bounded() {
    let Some(etcd) = EtcdProc::start("endpoints_are_tried_in_turn_and_calls_are_bounded") else {
        return;
    };
    // A closed port first: the client moves on to the live endpoint.
    let dead = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let dead_addr = format!("http://{}", dead.local_addr().expect("addr"));
    drop(dead);
    let c = Etcd::new(
        &[dead_addr.clone(), etcd.endpoint()],
        Duration::from_secs(3),
    )
    .expect("client");
    c.put("/e/k", b"v", None)
        .expect("put through the second endpoint");
    assert_eq!(c.get("/e/k").expect("get").expect("present").value, b"v");

    // A peer that accepts and never answers: the call fails by its timeout.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let c = Etcd::new(
        &[format!("http://{}", silent.local_addr().expect("addr"))],
        Duration::from_millis(500),
    )
    .expect("client");
    let t = std::time::Instant::now();
    let r = c.get("/e/k");
    assert!(matches!(r, Err(Error::Unavailable { .. })), "{r:?}");
    assert!(
        t.elapsed() < Duration::from_secs(3),
        "took {:?}",
        t.elapsed()
    );
}
