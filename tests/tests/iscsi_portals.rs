//! Several portals per target, IPv4 and IPv6 (RFC 7143 §4.2.7, §13.9):
//! a target listening on 127.0.0.1 and [::1] is reachable on both, and
//! SendTargets reports every portal with the target's portal group tag. A
//! target is reached only through its own portals: one taken from it live
//! ends its sessions there and refuses its logins there until it is back.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed step is a failed test

use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use ferrite_tests::{Config, Device, Ferrited, Login, Target, free_port};

const IQN: &str = "iqn.2026-11.org.ferrite:twoportals";
const TPGT: u16 = 5;

#[test]
fn ipv4_and_ipv6_portals_are_reported_with_their_tpgt() {
    if TcpStream::connect("[::1]:1").is_err_and(|e| {
        e.kind() == std::io::ErrorKind::AddrNotAvailable
            || e.raw_os_error() == Some(97) // EAFNOSUPPORT
            || e.raw_os_error() == Some(101) // ENETUNREACH
    }) {
        eprintln!("SKIPPED: no IPv6 loopback here");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let cfg = Config::new()
        .device(Device::nullio("n0", 16777216))
        .target(
            Target::new(IQN)
                .set("enabled", true)
                .set("tpgt", TPGT)
                .portal(format!("127.0.0.1:{port}"))
                .portal(format!("[::1]:{port}"))
                .lun(0, "n0"),
        )
        .write(dir.path().join("portals.json"));
    // Started from the configuration alone: `--listen` would replace its
    // two portals with one address.
    let _f = Ferrited::start_config(dir.path(), &cfg, &[]);
    let v4: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let v6: SocketAddr = format!("[::1]:{port}").parse().unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    for a in [v4, v6] {
        while TcpStream::connect_timeout(&a, Duration::from_millis(200)).is_err() {
            assert!(Instant::now() < deadline, "ferrited not listening on {a}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    for addr in [v4, v6] {
        // Discovery on this portal.
        let mut d = Login::discovery("iqn.2026-11.org.ferrite.test:portals")
            .try_connect(addr)
            .unwrap_or_else(|e| panic!("discovery login on {addr}: {e}"));
        let keys = d.text(&[("SendTargets", "All")]).expect("SendTargets");
        let addrs: Vec<&str> = keys
            .iter()
            .filter(|(k, _)| k == "TargetAddress")
            .map(|(_, v)| v.as_str())
            .collect();
        assert!(
            keys.contains(&("TargetName".to_string(), IQN.to_string())),
            "{keys:?}"
        );
        for want in [
            format!("127.0.0.1:{port},{TPGT}"),
            format!("[::1]:{port},{TPGT}"),
        ] {
            assert!(
                addrs.contains(&want.as_str()),
                "SendTargets on {addr} lacks {want}: {addrs:?}"
            );
        }
        // A normal session on this portal, answered with the same TPGT.
        let n = Login::new("iqn.2026-11.org.ferrite.test:portals", IQN)
            .try_connect(addr)
            .unwrap_or_else(|e| panic!("normal login on {addr}: {e}"));
        assert!(
            n.login_keys
                .contains(&("TargetPortalGroupTag".to_string(), TPGT.to_string())),
            "{:?}",
            n.login_keys
        );
    }
}

/// A normal session of `initiator` to `target` through `addr`.
fn login(
    addr: SocketAddr,
    target: &str,
    initiator: &str,
) -> Result<ferrite_iscsi::initiator::Initiator<TcpStream>, ferrite_iscsi::initiator::InitiatorError>
{
    Login::new(format!("iqn.2026-11.org.ferrite.test:{initiator}"), target)
        .read_timeout(Duration::from_secs(10))
        .try_connect(addr)
}

/// A portal taken from a target live (`ferritectl set .../portals`) ends
/// the target's sessions that came in through it (AsyncEvent 3, then the
/// close), leaves its sessions on its other portals alone, and from then on
/// a login to the target through that address gets 0301 (service
/// unavailable: the initiator may retry) even though another target still
/// listens there; given back, the portal takes logins again.
#[test]
fn a_portal_taken_from_a_target_ends_its_sessions_there() {
    use ferrite_iscsi::initiator::InitiatorError;
    use ferrite_iscsi::pdu::{LoginStatus, Opcode};

    const A: &str = "iqn.2026-11.org.ferrite:portal-a";
    const B: &str = "iqn.2026-11.org.ferrite:portal-b";
    let dir = tempfile::tempdir().unwrap();
    let (p1, p2) = (free_port(), free_port());
    let a1: SocketAddr = format!("127.0.0.1:{p1}").parse().unwrap();
    let a2: SocketAddr = format!("127.0.0.1:{p2}").parse().unwrap();
    let cfg = Config::new()
        .device(Device::nullio("n0", 16777216))
        .device(Device::nullio("n1", 16777216))
        .target(Target::new(A).portal(a1).portal(a2).lun(0, "n0"))
        .target(Target::new(B).portal(a2).lun(0, "n1"))
        .write(dir.path().join("portals.json"));
    let f = Ferrited::start_config(dir.path(), &cfg, &[]);
    let tur = [0u8; 6];
    let tur_ok = |i: &mut ferrite_iscsi::initiator::Initiator<TcpStream>| {
        // The first command of a nexus may take its POWER ON unit attention.
        (0..2).any(|_| {
            i.command(&ferrite_iscsi::initiator::Command {
                cdb: &tur,
                attr: 1,
                ..Default::default()
            })
            .is_ok_and(|r| r.status == 0)
        })
    };

    let mut stays = login(a1, A, "stays").expect("login to A through its first portal");
    let mut goes = login(a2, A, "goes").expect("login to A through its second portal");
    assert!(tur_ok(&mut stays) && tur_ok(&mut goes));

    f.ctl(&[
        "set",
        &format!("/targets/iscsi/{A}/portals"),
        &a1.to_string(),
    ]);
    // The session through the removed portal is told, then closed.
    goes.t
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let mut events = Vec::new();
    loop {
        match goes.recv_pdu() {
            Ok(p) if p.bhs().opcode() == Opcode::ASYNC_MSG => events.push(p.bhs().0[36]),
            Ok(_) => {}
            Err(InitiatorError::Closed) => break,
            Err(InitiatorError::Io(e))
                if e.kind() != std::io::ErrorKind::WouldBlock
                    && e.kind() != std::io::ErrorKind::TimedOut =>
            {
                break;
            }
            Err(e) => panic!(
                "the session through the removed portal was not closed: {e}\n{}",
                f.log_text()
            ),
        }
    }
    assert_eq!(
        events,
        [3],
        "AsyncEvent 3 (the target drops the connection) before the close"
    );
    // The session through the portal that stays goes on.
    assert!(
        tur_ok(&mut stays),
        "the session through the remaining portal stopped"
    );
    // A's logins through the removed portal are refused (B still listens
    // there), B's go on; A's first portal still takes logins.
    match login(a2, A, "again") {
        Err(InitiatorError::Login(s)) => assert_eq!(s, LoginStatus::SERVICE_UNAVAILABLE),
        other => panic!(
            "login to A through its removed portal: {:?}",
            other.map(|_| ())
        ),
    }
    let mut b = login(a2, B, "b").expect("login to B through its portal");
    assert!(tur_ok(&mut b));
    login(a1, A, "first").expect("login to A through its remaining portal");
    let log = f.wait_log("portal removed from the target", 1);
    assert!(log.contains("portal removed from the target"), "{log}");

    // Given back, the portal takes A's logins again.
    f.ctl(&[
        "set",
        &format!("/targets/iscsi/{A}/portals"),
        &format!("{a1} {a2}"),
    ]);
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut back = loop {
        match login(a2, A, "back") {
            Ok(i) => break i,
            Err(e) => {
                assert!(
                    Instant::now() < deadline,
                    "the portal given back takes no login: {e}"
                );
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    };
    assert!(tur_ok(&mut back));
}
