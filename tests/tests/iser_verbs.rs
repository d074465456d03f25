//! iSER over the `verbs` provider (libibverbs and RDMA CM on a real RDMA
//! device) against a real ferrited, as a hostile initiator uses it: RDMA
//! CM connection requests with the iSER CM REQ that never log in. Each
//! accepted one holds a window of registered receive buffers, so a core
//! takes only so many (`ferrite_iser::driver::MAX_CONNECTIONS_PER_CORE`):
//! the next request is rejected with a log line, and once connections
//! go away new ones are taken again.
//!
//! Needs an RDMA device with an IPv4 address (soft-RoCE `rdma_rxe` will do):
//! `FERRITE_ISER_VERBS=DEVICE,ADDRESS`, for instance `rxe0,10.99.0.1` in
//! the kernel lab (`tests/lab/guest/iser-verbs.sh`). Without it the tests
//! say so and pass: the machines this project builds on have no RDMA
//! device.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed step is a failed test

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ferrite_iser::cm::CmRequest;
use ferrite_iser::driver::MAX_CONNECTIONS_PER_CORE;
use ferrite_rdma::RdmaError;
use ferrite_rdma::verbs::{Context, VerbsCq, VerbsPd, VerbsQp, VerbsQpAttrs};
use ferrite_tests::{Config, Device, Ferrited, Target, free_port, rdma_device};

const IQN: &str = "iqn.2026-12.org.ferrite.test:iser-verbs";

/// A connection request the Linux iSER initiator would send.
fn cm_request() -> [u8; 4] {
    CmRequest {
        zero_based: false,
        send_invalidate: true,
    }
    .encode()
}

/// One RDMA CM connection attempt: accepted (the queue pair), or the error.
fn connect(addr: &SocketAddr, pd: &VerbsPd, cq: &VerbsCq) -> Result<VerbsQp, RdmaError> {
    let attrs = VerbsQpAttrs {
        max_send_wr: 4,
        max_recv_wr: 4,
        ..VerbsQpAttrs::default()
    };
    VerbsQp::connect(
        addr,
        pd,
        cq,
        cq,
        attrs,
        &[],
        &cm_request(),
        Duration::from_secs(10),
    )
    .map(|(qp, _)| qp)
}

#[test]
fn connection_requests_beyond_a_cores_cap_are_rejected_and_served_again_later() {
    let Some((dev, ip)) = rdma_device("FERRITE_ISER_VERBS") else {
        eprintln!("FERRITE_ISER_VERBS unset (no RDMA device): skipping iSER over verbs");
        return;
    };
    let dir = tempfile::Builder::new()
        .prefix("fiserv")
        .tempdir_in("/tmp")
        .unwrap();
    let addr: SocketAddr = format!("{ip}:{}", free_port()).parse().unwrap();
    // One core, so that one cap counts; a short window, so that each
    // connection's buffers are small (the guest has little memory).
    let cfg_path = Config::new()
        .iscsi("queue_depth", 4)
        .device(Device::mem("mem0", 16 << 20))
        .target(
            Target::new(IQN)
                .portal(format!("iser:{addr}"))
                .lun(0, "mem0"),
        )
        .write(dir.path().join("ferrite.json"));
    let f = Ferrited::start_config(dir.path(), &cfg_path, &["--cores", "1"]);
    f.wait_log("iSER portal listening", 1);
    let ctx: Arc<Context> = Context::cm_devices()
        .unwrap()
        .into_iter()
        .find(|c| c.name() == dev)
        .unwrap_or_else(|| panic!("RDMA CM has no device {dev}"));
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(1024).unwrap();

    // The first connection may race the listener coming up.
    let deadline = Instant::now() + Duration::from_secs(20);
    let first = loop {
        match connect(&addr, &pd, &cq) {
            Ok(qp) => break qp,
            Err(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(100)),
            Err(e) => panic!("iSER connect to {addr}: {e}\n{}", f.log_text()),
        }
    };
    let mut held = vec![first];
    while held.len() < MAX_CONNECTIONS_PER_CORE {
        match connect(&addr, &pd, &cq) {
            Ok(qp) => held.push(qp),
            Err(e) => panic!(
                "connection {} of {MAX_CONNECTIONS_PER_CORE} refused: {e}\n{}",
                held.len() + 1,
                f.log_text()
            ),
        }
    }
    for extra in 0..3 {
        match connect(&addr, &pd, &cq) {
            Err(RdmaError::Rejected { .. }) => {}
            Ok(_) => panic!(
                "connection {} accepted beyond the cap of {MAX_CONNECTIONS_PER_CORE}",
                MAX_CONNECTIONS_PER_CORE + extra + 1
            ),
            Err(e) => panic!("a connection beyond the cap failed otherwise: {e}"),
        }
    }
    let log = f.wait_log("this core runs as many connections as it takes", 3);
    assert!(
        log.matches("this core runs as many connections as it takes")
            .count()
            >= 3,
        "no log line for the rejected requests:\n{log}"
    );

    // Connections that go away make room: the next request is taken
    // (once ferrited has seen the disconnects).
    held.truncate(MAX_CONNECTIONS_PER_CORE - 4);
    let deadline = Instant::now() + Duration::from_secs(30);
    let again = loop {
        match connect(&addr, &pd, &cq) {
            Ok(qp) => break qp,
            Err(RdmaError::Rejected { .. }) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(200))
            }
            Err(e) => panic!(
                "no connection taken after four went away: {e}\n{}",
                f.log_text()
            ),
        }
    };
    held.push(again);
    drop(held);
    // And ferrited is still there to serve.
    let out = f.ctl_output(&["sessions"]);
    assert!(out.status.success(), "ferritectl sessions: {out:?}");
}
