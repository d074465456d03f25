//! `ferritectl tree` on the embedded default with a session logged in: the
//! target with its portal, its LUN with device and size, and the session,
//! in one view, and `--json` giving the same as JSON. And the control
//! socket found one way by both binaries: ferrited started with
//! `--state-dir` alone is reached by `ferritectl --state-dir`, by
//! `FERRITE_STATE_DIR`, by `--socket`, by its alias `--control` and by
//! `FERRITE_SOCKET`.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed step is a failed test

use std::process::Command;
use std::time::Duration;

use ferrite_iscsi::initiator::Command as IscsiCmd;
use ferrite_tests::{Ferrited, Login, ferrited_path, run_with_timeout};

const IQN: &str = "iqn.2026-11.org.ferrite:default";
const INITIATOR: &str = "iqn.2026-12.org.ferrite:tree-view";

#[test]
fn the_tree_view_shows_target_portal_lun_and_session() {
    let dir = tempfile::tempdir().unwrap();
    let f = Ferrited::start_default(dir.path());
    let mut ini = Login::new(INITIATOR, IQN)
        .read_timeout(Duration::from_secs(30))
        .connect(f.addr);
    ini.command(&IscsiCmd {
        cdb: &[0u8; 6],
        attr: 1,
        ..IscsiCmd::default()
    })
    .unwrap();

    let text = f.ctl(&["tree", "/targets"]);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines[0], "/targets", "{text}");
    let line = |needle: &str| {
        lines
            .iter()
            .find(|l| l.contains(needle))
            .unwrap_or_else(|| panic!("no line with {needle:?}:\n{text}"))
            .to_string()
    };
    let target = line(IQN);
    assert!(target.contains("enabled"), "{target}");
    assert!(target.contains(&format!("portals {}", f.addr)), "{target}");
    let lun = line("─ 0 [");
    assert!(lun.contains("[disk0, 1 GiB"), "{lun}");
    let session = line(INITIATOR);
    assert!(session.contains("connections 127.0.0.1:"), "{session}");
    assert!(session.contains("luns 1"), "{session}");
    // Nesting: the LUN and the session are drawn below the target.
    let depth = |l: &str| l.find(|c: char| c.is_alphanumeric()).unwrap();
    assert!(depth(&lun) > depth(&target) && depth(&session) > depth(&target));

    let json = f.ctl(&["--json", "tree", "/targets"]);
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(v["ok"], true, "{json}");
    let root = &v["tree"];
    assert_eq!(root["name"], "/targets");
    let iscsi = &root["children"][0];
    assert_eq!(iscsi["name"], "iscsi");
    let t = &iscsi["children"][0];
    assert_eq!(t["name"], IQN);
    assert_eq!(t["values"]["enabled"], "1");
    assert_eq!(t["values"]["portals"], f.addr.to_string());
    let child = |n: &serde_json::Value, name: &str| -> serde_json::Value {
        n["children"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["name"] == name)
            .unwrap_or_else(|| panic!("no {name} in {n}"))
            .clone()
    };
    let lun0 = child(&child(t, "luns"), "0");
    assert_eq!(lun0["values"]["device"], "disk0");
    assert_eq!(lun0["values"]["size"], (1u64 << 30).to_string());
    let s = child(&child(t, "sessions"), INITIATOR);
    assert_eq!(s["values"]["lun_count"], "1");

    // A path that is not there is an error that names it.
    let out = f.ctl_output(&["tree", "/targets/nosuch"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("/targets/nosuch"), "{err}");
}

#[test]
fn both_binaries_find_the_control_socket_the_same_way() {
    let dir = tempfile::tempdir().unwrap();
    // The harness starts ferrited with --state-dir alone: its socket is
    // the state directory's ferrited.sock.
    let f = Ferrited::start_default(dir.path());
    assert!(dir.path().join("ferrited.sock").exists());
    let ctl = || {
        let mut c = Command::new(ferrited_path().with_file_name("ferritectl"));
        c.env_remove("FERRITE_SOCKET")
            .env_remove("FERRITE_STATE_DIR");
        c
    };
    let sock = dir.path().join("ferrited.sock");
    let tries: [(&str, Command); 5] = [
        ("--state-dir", {
            let mut c = ctl();
            c.arg("--state-dir").arg(dir.path());
            c
        }),
        ("FERRITE_STATE_DIR", {
            let mut c = ctl();
            c.env("FERRITE_STATE_DIR", dir.path());
            c
        }),
        ("--socket", {
            let mut c = ctl();
            c.arg("--socket").arg(&sock);
            c
        }),
        ("--control", {
            let mut c = ctl();
            c.arg("--control").arg(&sock);
            c
        }),
        ("FERRITE_SOCKET", {
            let mut c = ctl();
            c.env("FERRITE_SOCKET", &sock);
            c
        }),
    ];
    for (how, mut c) in tries {
        let out = run_with_timeout(c.args(["ls", "/targets/iscsi"]), Duration::from_secs(30));
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && stdout.contains(IQN),
            "{how}: {stdout}{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    // A state directory with no daemon: the error names the socket looked
    // for.
    let empty = tempfile::tempdir().unwrap();
    let out = run_with_timeout(
        ctl().arg("--state-dir").arg(empty.path()).arg("ls"),
        Duration::from_secs(30),
    );
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&empty.path().join("ferrited.sock").display().to_string()),
        "{err}"
    );
    drop(f);
}
