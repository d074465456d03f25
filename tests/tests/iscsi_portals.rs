//! Several portals per target, IPv4 and IPv6 (RFC 7143 §4.2.7, §13.9):
//! a target listening on 127.0.0.1 and [::1] is reachable on both, and
//! SendTargets reports every portal with the target's portal group tag.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed step is a failed test

use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use ferrite_iscsi::initiator::{InitiatorConfig, connect};
use ferrite_tests::{ferrited_path, free_port};

/// ferrited started with the configuration's own portals (the harness's
/// `Ferrited` passes `--listen`, which replaces them with one address);
/// killed when dropped.
struct Daemon(Child);

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

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
    let json = format!(
        r#"{{
  "devices": [ {{ "name": "n0", "handler": "vdisk_nullio", "size": 16777216 }} ],
  "targets": {{ "iscsi": [
    {{ "name": "{IQN}", "enabled": true, "tpgt": {TPGT},
       "portals": ["127.0.0.1:{port}", "[::1]:{port}"],
       "luns": [ {{ "lun": 0, "device": "n0" }} ] }}
  ] }}
}}
"#
    );
    let cfg = dir.path().join("portals.json");
    std::fs::write(&cfg, json).unwrap();
    let child = Command::new(ferrited_path())
        .arg("--state-dir")
        .arg(dir.path())
        .arg("--control")
        .arg(dir.path().join("ferrited.sock"))
        .arg("--config")
        .arg(&cfg)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn ferrited");
    let _d = Daemon(child);
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
        let mut d = connect(
            addr,
            InitiatorConfig {
                initiator_name: "iqn.2026-11.org.ferrite.test:portals".into(),
                target_name: None,
                ..InitiatorConfig::default()
            },
        )
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
        let n = connect(
            addr,
            InitiatorConfig {
                initiator_name: "iqn.2026-11.org.ferrite.test:portals".into(),
                target_name: Some(IQN.into()),
                ..InitiatorConfig::default()
            },
        )
        .unwrap_or_else(|e| panic!("normal login on {addr}: {e}"));
        assert!(
            n.login_keys
                .contains(&("TargetPortalGroupTag".to_string(), TPGT.to_string())),
            "{:?}",
            n.login_keys
        );
    }
}
