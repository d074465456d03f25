//! CHAP per initiator group, end to end with libiscsi (SCST-like
//! `IncomingUser` on a group; RFC 7143 §12.1.3): an initiator that matches
//! a group with CHAP users must authenticate as one of them, and the
//! target's own users no longer admit it; initiators of a group without
//! CHAP users, and initiators in no group, authenticate against the
//! target's users. A wrong pairing is refused with 0201. Mutual CHAP still
//! answers with the target's outgoing user. The tree shows the group's
//! users (names only).

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed step is a failed test

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use ferrite_tests::{
    Config, Device, Ferrited, Group, Options, Target, ferrited_path, free_port, require_tool,
    run_with_timeout,
};
use serde_json::json;

const T: &str = "iqn.2026-11.org.ferrite:chap-groups";
const ADMIN: &str = "iqn.2026-11.org.ferrite:admin-host";
const PLAIN: &str = "iqn.2026-11.org.ferrite:plain-host";
const NOGROUP: &str = "iqn.2026-11.org.ferrite:other-host";
const ALICE: (&str, &str) = ("alice", "alice-secret-12");
const BOB: (&str, &str) = ("bob", "bob-group-secret-34");
const TARGET_USER: (&str, &str) = ("ferrite-target", "target-secret-56");

fn config(dir: &Path, port: u16) -> PathBuf {
    Config::new()
        .device(Device::nullio("n0", 16777216))
        .target(
            Target::new(T)
                .set("enabled", true)
                .portal(format!("127.0.0.1:{port}"))
                .lun(0, "n0")
                .group(
                    Group::new("admins")
                        .initiator("iqn.2026-11.org.ferrite:admin*")
                        .lun(0, "n0"),
                )
                .group(
                    Group::new("plain")
                        .initiator("iqn.2026-11.org.ferrite:plain*")
                        .lun(0, "n0"),
                )
                .incoming_user(ALICE.0, ALICE.1)
                .outgoing_user(TARGET_USER.0, TARGET_USER.1)
                .set(
                    "group_incoming_users",
                    json!({ "admins": [ { "user": BOB.0, "secret": BOB.1 } ] }),
                ),
        )
        .write_private(dir.join("chap-groups.json"))
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

#[test]
fn a_group_with_chap_users_replaces_the_targets_users_for_its_initiators() {
    require_tool("iscsi-inq", "libiscsi-bin");
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let f = Ferrited::start(
        dir.path(),
        port,
        Options {
            config: Some(config(dir.path(), port)),
            args: Vec::new(),
        },
    );
    let a = f.addr;
    let url = |(u, s): (&str, &str)| format!("iscsi://{u}%{s}@{a}/{T}/0");
    let check = |initiator: &str, user: (&str, &str), ok: bool| {
        let o = inq(initiator, &url(user));
        let t = text(&o);
        if ok {
            assert!(
                o.status.success() && t.contains("DIRECT_ACCESS"),
                "{initiator} as {} refused: {t}\n--- ferrited log ---\n{}",
                user.0,
                f.log_text()
            );
        } else {
            assert!(
                !o.status.success()
                    && t.contains("Authentication failure")
                    && t.contains(&format!("({})", 0x0201)),
                "{initiator} as {}: expected 0201, got:\n{t}",
                user.0
            );
        }
    };
    // The admins group has its own user: only bob admits its initiators.
    check(ADMIN, BOB, true);
    check(ADMIN, ALICE, false);
    // A group without CHAP users, and no group at all: the target's users.
    check(PLAIN, ALICE, true);
    check(PLAIN, BOB, false);
    check(NOGROUP, ALICE, true);
    check(NOGROUP, BOB, false);
    // Mutual CHAP from a group initiator: the target's outgoing user answers.
    let mutual = format!(
        "{}?target_user={}&target_password={}",
        url(BOB),
        TARGET_USER.0,
        TARGET_USER.1
    );
    let o = inq(ADMIN, &mutual);
    assert!(
        o.status.success() && text(&o).contains("DIRECT_ACCESS"),
        "mutual CHAP from the group failed: {}",
        text(&o)
    );

    // The tree shows the group's users by name, never the secret.
    let out = run_with_timeout(
        Command::new(ferrited_path().with_file_name("ferritectl"))
            .arg("--socket")
            .arg(f.control())
            .args([
                "get",
                &format!("/targets/iscsi/{T}/ini_groups/admins/incoming_users"),
            ]),
        Duration::from_secs(30),
    );
    let shown = text(&out);
    assert!(out.status.success(), "ferritectl get: {shown}");
    assert!(shown.contains(BOB.0), "group users not shown: {shown}");
    assert!(!shown.contains(BOB.1), "the secret is shown: {shown}");
}
