//! The data memory budget as an attribute of a running ferrited's tree:
//! `ferritectl set /data_memory_mb` changes the running limit at once (the
//! `ferrite_data_memory_limit_bytes` metric follows), `get` reads it back
//! with `[key]` while it is set, `/data_memory` shows its use, bad values
//! are refused with the valid range and change nothing, an empty value goes
//! back to the default, `save` writes it and `diff`/`apply` of a file with
//! another value change it. A bad `--data-memory-mb` stops ferrited with a
//! message naming the range.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed step is a failed test

mod mgmt_util;

use std::net::SocketAddr;
use std::time::Duration;

use ferrite_tests::{ferrited_command, free_port, run_with_timeout};
use mgmt_util::{Daemon, empty_config};

const MIB: u64 = 1 << 20;

/// The value of the unlabelled metric `name` at `addr`.
fn metric(addr: SocketAddr, name: &str) -> u64 {
    ferrite_tests::metric(addr, name).unwrap_or_else(|| panic!("no {name} at {addr}"))
}

const LIMIT: &str = "ferrite_data_memory_limit_bytes";

#[test]
fn data_memory_limit_is_read_set_saved_and_applied_through_the_tree() {
    let dir = tempfile::tempdir().unwrap();
    let m = SocketAddr::from(([127, 0, 0, 1], free_port()));
    let f = Daemon::start(
        dir.path(),
        &empty_config(dir.path()),
        &["--data-memory-mb", "256", "--metrics", &m.to_string()],
    );

    // As started: the command line's value, which belongs in a saved file.
    assert_eq!(f.ok(&["get", "/data_memory_mb"]), "256\n[key]\n");
    assert_eq!(metric(m, LIMIT), 256 * MIB);
    let ls = f.ok(&["ls", "-l", "/"]);
    assert!(
        ls.lines()
            .any(|l| l.contains("data_memory_mb") && l.contains("rw")),
        "{ls}"
    );

    // Set: the running limit changes at once.
    f.ok(&["set", "/data_memory_mb", "1024"]);
    assert_eq!(f.ok(&["get", "/data_memory_mb"]), "1024\n[key]\n");
    assert_eq!(metric(m, LIMIT), 1024 * MIB);
    let usage = f.ok(&["get", "/data_memory"]);
    assert!(
        usage.starts_with(&format!("limit {}\nused ", 1024 * MIB)),
        "{usage}"
    );
    for k in ["peak", "holders", "waiting", "waits"] {
        assert!(usage.contains(&format!("\n{k} ")), "{k} in {usage}");
    }

    // Bad values: refused, saying what is valid; nothing changes.
    for (v, want) in [
        ("10", "10 MiB is out of range"),
        ("1073741825", "out of range"),
        ("lots", "\"lots\" is not a number"),
        ("2G", "not a number"),
    ] {
        let o = f.ctl(&["set", "/data_memory_mb", v]);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "set {v}: {err}");
        assert!(err.contains(want), "set {v}: {err:?} lacks {want:?}");
        assert!(err.contains("valid: 64..1073741824"), "set {v}: {err}");
    }
    let o = f.ctl(&["set", "/data_memory", "1"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("read-only"));
    assert_eq!(f.ok(&["get", "/data_memory_mb"]), "1024\n[key]\n");
    assert_eq!(metric(m, LIMIT), 1024 * MIB);

    // Empty: the default, which a saved file leaves out.
    f.ok(&["set", "/data_memory_mb", ""]);
    let default = f.ok(&["get", "/data_memory_mb"]);
    assert!(!default.contains("[key]"), "{default}");
    let default_mb: u64 = default.trim().parse().unwrap();
    assert!((256..=4096).contains(&default_mb), "{default_mb}");
    // The default is an eighth of the memory, not always whole MiB.
    assert_eq!(metric(m, LIMIT) / MIB, default_mb);
    let file = dir.path().join("saved.json");
    f.ok(&["save", file.to_str().unwrap()]);
    assert!(
        !std::fs::read_to_string(&file)
            .unwrap()
            .contains("data_memory_mb")
    );

    // Saved with a value, then a file with another value: diff shows the
    // change, apply makes it, and the same file again changes nothing.
    f.ok(&["set", "/data_memory_mb", "512"]);
    f.ok(&["save", file.to_str().unwrap()]);
    let saved = std::fs::read_to_string(&file).unwrap();
    assert!(saved.contains("\"data_memory_mb\": 512"), "{saved}");
    let other = dir.path().join("other.json");
    std::fs::write(
        &other,
        saved.replace("\"data_memory_mb\": 512", "\"data_memory_mb\": 2048"),
    )
    .unwrap();
    let diff = f.ok(&["diff", other.to_str().unwrap()]);
    assert!(diff.contains("set /data_memory_mb 2048"), "{diff}");
    assert_eq!(diff.lines().count(), 1, "{diff}");
    assert_eq!(metric(m, LIMIT), 512 * MIB, "diff changes nothing");
    f.ok(&["apply", other.to_str().unwrap()]);
    assert_eq!(f.ok(&["get", "/data_memory_mb"]), "2048\n[key]\n");
    assert_eq!(metric(m, LIMIT), 2048 * MIB);
    assert!(
        f.ok(&["diff", other.to_str().unwrap()])
            .contains("no changes")
    );
    assert!(f.log_text().contains("data memory budget changed"));
}

#[test]
fn a_bad_data_memory_option_stops_ferrited_naming_the_range() {
    let dir = tempfile::tempdir().unwrap();
    let o = run_with_timeout(
        ferrited_command(dir.path())
            .arg("--config")
            .arg(empty_config(dir.path()))
            .arg("--control")
            .arg(dir.path().join("ferrited.sock"))
            .args(["--data-memory-mb", "10"]),
        Duration::from_secs(30),
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "{err}");
    assert!(err.contains("data_memory_mb"), "{err}");
    assert!(err.contains("valid: 64..1073741824"), "{err}");
}
