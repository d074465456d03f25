//! CHAP and the initiator ACL end to end with libiscsi (RFC 7143 §12.1.3,
//! §11.13.5): one-way and mutual CHAP logins succeed, a wrong secret is
//! refused with 0201, an initiator outside the target's ACL with 0202, and
//! discovery sessions authenticate too.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed step is a failed test

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use ferrite_tests::{
    Config, Device, Ferrited, Group, Options, Target, free_port, require_tool, run_with_timeout,
};

const CHAP_T: &str = "iqn.2026-11.org.ferrite:chap";
const ACL_T: &str = "iqn.2026-11.org.ferrite:acl";
const ALLOWED: &str = "iqn.2026-11.org.ferrite:allowed-host";
const OTHER: &str = "iqn.2026-11.org.ferrite:intruder";
const USER: &str = "alice";
const SECRET: &str = "alice-secret-12";
const TUSER: &str = "ferrite-target";
const TSECRET: &str = "target-secret-34";
const DUSER: &str = "disco";
const DSECRET: &str = "discovery-secret-56";

/// A configuration with a CHAP target, an ACL target (groups, empty default
/// map) and CHAP on discovery; written mode 0600 as secrets must be.
fn config(dir: &Path, port: u16) -> PathBuf {
    let p = format!("127.0.0.1:{port}");
    Config::new()
        .device(Device::nullio("n0", 16777216))
        .device(Device::nullio("n1", 16777216))
        .discovery_user(DUSER, DSECRET)
        .target(
            Target::new(CHAP_T)
                .set("enabled", true)
                .portal(&p)
                .lun(0, "n0")
                .incoming_user(USER, SECRET)
                .outgoing_user(TUSER, TSECRET),
        )
        .target(
            Target::new(ACL_T).set("enabled", true).portal(&p).group(
                Group::new("allowed")
                    .initiator("iqn.2026-11.org.ferrite:allowed*")
                    .lun(0, "n1"),
            ),
        )
        .write_private(dir.join("chap.json"))
}

fn start(dir: &Path) -> Ferrited {
    let port = free_port();
    let cfg = config(dir, port);
    // No --listen: the configuration's portals are used as written.
    Ferrited::start(
        dir,
        port,
        Options {
            config: Some(cfg),
            args: Vec::new(),
        },
    )
}

fn inq(initiator: &str, url: &str) -> Output {
    run_with_timeout(
        Command::new("iscsi-inq").arg("-i").arg(initiator).arg(url),
        Duration::from_secs(60),
    )
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn assert_ok(o: &Output, what: &str, f: &Ferrited) {
    assert!(
        o.status.success() && text(o).contains("DIRECT_ACCESS"),
        "{what} failed: {}\n--- ferrited log ---\n{}",
        text(o),
        f.log_text()
    );
}

fn assert_refused(o: &Output, status: &str, code: u16, what: &str) {
    let t = text(o);
    assert!(!o.status.success(), "{what} logged in:\n{t}");
    assert!(
        t.contains(status) && t.contains(&format!("({code})")),
        "{what}: expected {status} ({code:#06x}), got:\n{t}"
    );
}

#[test]
fn one_way_and_mutual_chap_log_in() {
    require_tool("iscsi-inq", "libiscsi-bin");
    let dir = tempfile::tempdir().unwrap();
    let f = start(dir.path());
    let a = f.addr;
    let one_way = format!("iscsi://{USER}%{SECRET}@{a}/{CHAP_T}/0");
    assert_ok(&inq(ALLOWED, &one_way), "one-way CHAP", &f);
    let mutual = format!(
        "iscsi://{USER}%{SECRET}@{a}/{CHAP_T}/0?target_user={TUSER}&target_password={TSECRET}"
    );
    assert_ok(&inq(ALLOWED, &mutual), "mutual CHAP", &f);
    // libiscsi checks the target's answer: a wrong target secret on the
    // initiator's side must make the login fail.
    let wrong_target = format!(
        "iscsi://{USER}%{SECRET}@{a}/{CHAP_T}/0?target_user={TUSER}&target_password=not-the-target-secret"
    );
    let o = inq(ALLOWED, &wrong_target);
    assert!(
        !o.status.success(),
        "mutual CHAP accepted a target that proved the wrong secret:\n{}",
        text(&o)
    );
}

#[test]
fn wrong_secret_is_0201_and_no_chap_is_refused() {
    require_tool("iscsi-inq", "libiscsi-bin");
    let dir = tempfile::tempdir().unwrap();
    let f = start(dir.path());
    let a = f.addr;
    let wrong = format!("iscsi://{USER}%wrong-secret-0000@{a}/{CHAP_T}/0");
    assert_refused(
        &inq(ALLOWED, &wrong),
        "Authentication failure",
        0x0201,
        "wrong secret",
    );
    let unknown = format!("iscsi://mallory%{SECRET}@{a}/{CHAP_T}/0");
    assert_refused(
        &inq(ALLOWED, &unknown),
        "Authentication failure",
        0x0201,
        "unknown user",
    );
    let none = format!("iscsi://{a}/{CHAP_T}/0");
    assert_refused(
        &inq(ALLOWED, &none),
        "Authentication failure",
        0x0201,
        "no CHAP",
    );
    let log = f.wait_log("login failed", 1);
    assert!(
        log.contains("login failed") && log.contains(ALLOWED) && log.contains("127.0.0.1"),
        "failed logins must be logged with initiator name and address:\n{log}"
    );
    // Repeated failures from one address are slowed down.
    assert!(
        log.contains("backoff"),
        "the third failure in a row was not delayed:\n{log}"
    );
    // And a good login still works afterwards.
    let good = format!("iscsi://{USER}%{SECRET}@{a}/{CHAP_T}/0");
    assert_ok(&inq(ALLOWED, &good), "CHAP after failures", &f);
}

#[test]
fn initiator_outside_the_acl_is_0202() {
    require_tool("iscsi-inq", "libiscsi-bin");
    let dir = tempfile::tempdir().unwrap();
    let f = start(dir.path());
    let url = format!("iscsi://{}/{ACL_T}/0", f.addr);
    assert_ok(&inq(ALLOWED, &url), "initiator in the ACL", &f);
    assert_refused(
        &inq(OTHER, &url),
        "Authorization failure",
        0x0202,
        "initiator outside the ACL",
    );
    let log = f.wait_log("ACL", 1);
    assert!(
        log.contains(OTHER) && log.contains("ACL"),
        "the refusal must be logged with the initiator name:\n{log}"
    );
}

#[test]
fn discovery_sessions_authenticate() {
    require_tool("iscsi-ls", "libiscsi-bin");
    let dir = tempfile::tempdir().unwrap();
    let f = start(dir.path());
    let ls = |url: String| {
        run_with_timeout(
            Command::new("iscsi-ls").arg("-i").arg(ALLOWED).arg(url),
            Duration::from_secs(60),
        )
    };
    let o = ls(format!("iscsi://{DUSER}%{DSECRET}@{}", f.addr));
    let t = text(&o);
    assert!(
        o.status.success() && t.contains(CHAP_T) && t.contains(ACL_T),
        "discovery with CHAP:\n{t}\n{}",
        f.log_text()
    );
    let o = ls(format!("iscsi://{}", f.addr));
    assert!(
        !o.status.success() || !text(&o).contains(CHAP_T),
        "discovery without CHAP listed targets:\n{}",
        text(&o)
    );
}
