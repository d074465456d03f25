//! libiscsi's persistent reservation suites across an HA pair: two ferrited
//! nodes with their cluster state in an etcd on loopback, one device from
//! one backing file, and `iscsi-test-cu` given a URL through each node (its
//! multipath mode: the second initiator's session goes to the other node).
//! Every reservation a node answers for is one the other node enforces at
//! once, so the suites pass as they do against one target.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use ferrite_tests::{CU_INITIATORS, Ferrited, free_port, parse_cu, require_tool, run_with_timeout};

/// An etcd on loopback with its data in a temporary folder; killed on drop.
struct Etcd {
    child: Child,
    url: String,
}

impl Etcd {
    fn start(dir: &Path) -> Etcd {
        require_tool("etcd", "etcd-server");
        let (client, peer) = (free_port(), free_port());
        let url = format!("http://127.0.0.1:{client}");
        let peer_url = format!("http://127.0.0.1:{peer}");
        let child = Command::new("etcd")
            .args(["--name", "t", "--data-dir"])
            .arg(dir.join("etcd"))
            .args([
                "--listen-client-urls",
                &url,
                "--advertise-client-urls",
                &url,
            ])
            .args(["--listen-peer-urls", &peer_url])
            .args(["--initial-advertise-peer-urls", &peer_url])
            .args(["--initial-cluster", &format!("t={peer_url}")])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start etcd");
        let deadline = Instant::now() + Duration::from_secs(30);
        while std::net::TcpStream::connect(("127.0.0.1", client)).is_err() {
            assert!(Instant::now() < deadline, "etcd did not listen within 30 s");
            std::thread::sleep(Duration::from_millis(50));
        }
        Etcd { child, url }
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

const TA: &str = "iqn.2026-12.org.ferrite.test:pair-a";
const TB: &str = "iqn.2026-12.org.ferrite.test:pair-b";

/// Node `me`'s configuration: its own target on `port`, the other node's
/// port by relative id.
fn node_config(me: &str, port: u16, image: &Path, etcd: &str) -> String {
    let (target, rel, tga, tgb) = if me == "a" {
        (
            TA,
            1,
            format!(r#""targets": ["{TA}"]"#),
            r#""rel_tgt_ids": [2]"#.to_string(),
        )
    } else {
        (
            TB,
            2,
            r#""rel_tgt_ids": [1]"#.to_string(),
            format!(r#""targets": ["{TB}"]"#),
        )
    };
    format!(
        r#"{{ "devices": [ {{ "name": "d0", "handler": "vdisk_fileio", "filename": "{}", "serial": "pair0" }} ],
  "targets": {{ "iscsi": [ {{ "name": "{target}", "portals": ["127.0.0.1:{port}"], "rel_tgt_id": {rel},
      "luns": [ {{ "lun": 0, "device": "d0" }} ] }} ] }},
  "device_groups": [ {{ "name": "dg0", "devices": ["d0"], "target_groups": [
      {{ "name": "tga", "group_id": 1, "node": "a", {tga} }},
      {{ "name": "tgb", "group_id": 2, "node": "b", {tgb} }} ] }} ],
  "cluster": {{ "node": "{me}", "etcd": ["{etcd}"], "prefix": "/ferrite/test", "lease_ttl_s": 3 }} }}"#,
        image.display()
    )
}

/// Waits until `f` reports target group `tg` in `state`.
fn wait_state(f: &Ferrited, tg: &str, state: &str) {
    let path = format!("/device_groups/dg0/target_groups/{tg}/state");
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let now = f.ctl(&["get", &path]);
        if now.lines().next() == Some(state) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{tg} is {now:?}, not {state}, after 60 s:\n{}",
            f.log_text()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn reservation_suites_pass_with_each_initiator_on_another_node() {
    require_tool("iscsi-test-cu", "libiscsi-bin");
    let dir = tempfile::tempdir().expect("tempdir");
    let etcd = Etcd::start(dir.path());
    let image = dir.path().join("d0.img");
    std::fs::File::create(&image)
        .and_then(|f| f.set_len(64 << 20))
        .expect("backing file");
    let (pa, pb) = (free_port(), free_port());
    let mut nodes = Vec::new();
    for (me, port) in [("a", pa), ("b", pb)] {
        let cfg = dir.path().join(format!("{me}.json"));
        std::fs::write(&cfg, node_config(me, port, &image, &etcd.url)).expect("config");
        let state = dir.path().join(format!("state-{me}"));
        std::fs::create_dir_all(&state).expect("state dir");
        nodes.push(Ferrited::start_config(&state, &cfg, &[]));
        // Node a starts first and owns the device group.
        wait_state(&nodes[nodes.len() - 1], "tga", "active");
    }
    wait_state(&nodes[1], "tgb", "nonoptimized");
    let urls = [
        format!("iscsi://127.0.0.1:{pa}/{TA}/0"),
        format!("iscsi://127.0.0.1:{pb}/{TB}/0"),
    ];
    let mut failures = Vec::new();
    for (suite, at_least) in [
        ("SCSI.ProutRegister", 1),
        ("SCSI.ProutReserve", 13),
        ("SCSI.ProutClear", 1),
        ("SCSI.ProutPreempt", 1),
        ("SCSI.PrinReadKeys", 2),
        ("SCSI.PrinServiceactionRange", 1),
        ("SCSI.PrinReportCapabilities", 1),
    ] {
        let out = run_with_timeout(
            Command::new("iscsi-test-cu")
                .args([
                    "-d",
                    "-i",
                    CU_INITIATORS[0],
                    "-I",
                    CU_INITIATORS[1],
                    "-t",
                    suite,
                ])
                .args(&urls),
            Duration::from_secs(300),
        );
        let text = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
        assert!(
            text.contains("found matching LU device identifier for all (2) paths"),
            "{suite}: libiscsi did not take the two nodes as paths of one LU:\n{text}"
        );
        let r = parse_cu(&text);
        eprintln!(
            "{suite}: {} passed, {} skipped, {} failed",
            r.passed.len(),
            r.skipped.len(),
            r.failed.len()
        );
        assert!(
            r.passed.len() >= at_least,
            "{suite}: {} passed, expected at least {at_least}:\n{text}",
            r.passed.len()
        );
        failures.extend(r.failed.iter().map(|t| format!("{suite}: {t}")));
        for n in &mut nodes {
            assert!(n.alive(), "a node died during {suite}:\n{}", n.log_text());
        }
    }
    assert!(failures.is_empty(), "failed across the pair: {failures:#?}");
}
