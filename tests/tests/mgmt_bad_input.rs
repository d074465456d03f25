//! Bad input over the control socket of a running ferrited: every request
//! gets a clear error naming what is valid, and the running configuration is
//! unchanged afterwards. A user other than root cannot use the socket.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed step is a failed test

mod mgmt_util;

use std::process::Command;
use std::time::Duration;

use ferrite_tests::run_with_timeout;
use mgmt_util::{Daemon, ctl_path, empty_config, portal, raw};

const T: &str = "iqn.2026-11.org.ferrite.test:bad";

fn setup(dir: &std::path::Path) -> Daemon {
    let f = Daemon::start(dir, &empty_config(dir), &[]);
    let p = portal().to_string();
    f.ok(&[
        "do",
        "/handlers/vdisk_nullio/mgmt",
        "add_device n0 size=32M",
    ]);
    f.ok(&[
        "do",
        "/handlers/vdisk_nullio/mgmt",
        "add_device n1 size=32M",
    ]);
    f.ok(&[
        "do",
        "/targets/iscsi/mgmt",
        &format!("add_target {T} portals={p}"),
    ]);
    f.ok(&["do", &format!("/targets/iscsi/{T}/luns/mgmt"), "add n0 0"]);
    f.ok(&["set", &format!("/targets/iscsi/{T}/enabled"), "1"]);
    f
}

#[test]
fn bad_requests_get_clear_errors_and_change_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let f = setup(dir.path());
    let luns = format!("/targets/iscsi/{T}/luns/mgmt");
    let nullio = "/handlers/vdisk_nullio/mgmt";
    let req = |op: &str, path: &str, field: &str, v: &str| {
        format!(r#"{{"op":"{op}","path":"{path}","{field}":"{v}"}}"#)
    };
    // (what, request line, words the error must contain)
    let cases: Vec<(&str, String, Vec<&str>)> = vec![
        (
            "missing field",
            format!(r#"{{"op":"do","path":"{nullio}"}}"#),
            vec!["command", "op"],
        ),
        (
            "unknown op",
            r#"{"op":"frobnicate"}"#.into(),
            vec!["frobnicate", "ls", "apply"],
        ),
        (
            "missing argument",
            req("do", nullio, "command", "add_device"),
            vec!["missing argument", "usage", "add_device NAME"],
        ),
        (
            "unknown command",
            req("do", nullio, "command", "frob x"),
            vec!["frob", "usage", "del_device"],
        ),
        (
            "unknown parameter",
            req("do", nullio, "command", "add_device x size=1G colour=red"),
            vec!["colour", "valid", "size"],
        ),
        (
            "malformed size",
            req("do", nullio, "command", "add_device x size=abc"),
            vec!["abc", "valid"],
        ),
        (
            "LUN out of range",
            req("do", &luns, "command", "add n1 99999"),
            vec!["99999", "valid", "16383"],
        ),
        (
            "malformed boolean",
            format!(r#"{{"op":"set","path":"/targets/iscsi/{T}/enabled","value":"maybe"}}"#),
            vec!["maybe", "valid"],
        ),
        (
            "non-existent path",
            r#"{"op":"get","path":"/devices/nope/size"}"#.into(),
            vec!["/devices/nope", "valid", "n0"],
        ),
        (
            "non-existent mgmt path",
            req(
                "do",
                "/targets/iscsi/iqn.2026-11.org.ferrite.test:none/luns/mgmt",
                "command",
                "add n1 1",
            ),
            vec!["no such object", "valid"],
        ),
        (
            "non-existent device in a map",
            req("do", &luns, "command", "add nodev 1"),
            vec!["nodev"],
        ),
        (
            "duplicate device",
            req("do", nullio, "command", "add_device n0 size=1G"),
            vec!["n0", "already exists"],
        ),
        (
            "duplicate target",
            req(
                "do",
                "/targets/iscsi/mgmt",
                "command",
                &format!("add_target {T}"),
            ),
            vec![T, "already exists"],
        ),
        (
            "LUN in use",
            req("do", &luns, "command", "add n1 0"),
            vec!["LUN 0", "in use", "n0"],
        ),
        (
            "device in use",
            req("do", nullio, "command", "del_device n0"),
            vec!["n0", "in use"],
        ),
        (
            "backing file does not exist",
            req(
                "do",
                "/handlers/vdisk_fileio/mgmt",
                "command",
                "add_device fx filename=/nonexistent/fx.img",
            ),
            vec!["/nonexistent/fx.img"],
        ),
        (
            "truncated request",
            r#"{"op":"do","path":"#.into(),
            vec!["bad request", "op"],
        ),
        ("not JSON", "hello".into(), vec!["bad request", "JSON"]),
        (
            "invalid configuration in apply",
            r#"{"op":"apply","config":{"devices":[{"name":"q"}]}}"#.into(),
            vec!["handler"],
        ),
    ];
    let before = raw(&f.socket, r#"{"op":"config"}"#).unwrap();
    assert!(before.contains(r#""ok":true"#), "{before}");
    let mut failures = Vec::new();
    for (what, line, want) in &cases {
        let answer = raw(&f.socket, line).unwrap();
        let ok_false = answer.contains(r#""ok":false"#) && answer.contains(r#""error":""#);
        let missing: Vec<&&str> = want.iter().filter(|w| !answer.contains(**w)).collect();
        if !ok_false || !missing.is_empty() {
            failures.push(format!(
                "{what}: {line}\n  -> {answer}  missing {missing:?}"
            ));
        }
        let after = raw(&f.socket, r#"{"op":"config"}"#).unwrap();
        if after != before {
            failures.push(format!("{what}: the configuration changed"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));

    // The same through ferritectl: a failure exits non-zero with the error
    // on standard error, and nothing changes.
    let cfg = f.config();
    for (args, want) in [
        (
            vec!["do", nullio, "add_device", "n0", "size=1G"],
            "already exists",
        ),
        (vec!["get", "/nope"], "valid"),
        (vec!["set", "/devices/n0/size"], "VALUE"),
        (vec!["frob"], "valid commands: ls, tree, get"),
        (vec!["apply", "/nonexistent.json"], "/nonexistent.json"),
    ] {
        let o = f.ctl(&args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "ferritectl {args:?} succeeded");
        assert!(err.contains(want), "ferritectl {args:?}: {err}");
    }
    assert_eq!(f.config(), cfg);
}

#[test]
fn a_user_other_than_root_cannot_open_the_control_socket() {
    // SAFETY-free uid check: /proc/self belongs to the effective user.
    let uid = std::os::unix::fs::MetadataExt::uid(&std::fs::metadata("/proc/self").unwrap());
    if uid != 0 {
        eprintln!("skipped: runs only as root (it runs the client as uid 65534)");
        return;
    }
    ferrite_tests::require_tool("setpriv", "util-linux");
    let dir = tempfile::tempdir().unwrap();
    let f = setup(dir.path());
    let as_nobody = |extra: &[&str]| {
        let mut c = Command::new("setpriv");
        c.args(["--reuid", "65534", "--regid", "65534", "--clear-groups"])
            .arg(ctl_path())
            .arg("--socket")
            .arg(&f.socket)
            .args(extra);
        run_with_timeout(&mut c, Duration::from_secs(30))
    };
    let o = as_nobody(&["config"]);
    assert!(!o.status.success(), "uid 65534 read the configuration");
    // Even with the file permissions opened up, the peer credential check
    // refuses the connection.
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(&f.socket, std::fs::Permissions::from_mode(0o666)).unwrap();
    let cfg = f.config();
    let o = as_nobody(&[
        "do",
        "/handlers/vdisk_nullio/mgmt",
        "add_device",
        "evil",
        "size=1M",
    ]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "uid 65534 ran a command: {err}");
    assert!(
        err.contains("root") || err.contains("refused") || err.contains("denied"),
        "the refusal says why: {err}"
    );
    assert_eq!(f.config(), cfg, "a refused peer changed something");
}
