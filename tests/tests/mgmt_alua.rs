//! ALUA device groups end to end: a device group built with `ferritectl`
//! on a running ferrited; a state written in the tree is saved under the
//! state directory at once, `save` writes it, and after a restart from a
//! file that still says `active` the saved state wins.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed step is a failed test

mod mgmt_util;

use mgmt_util::{Daemon, empty_config, portal};

const TA: &str = "iqn.2026-11.org.ferrite.test:alua-a";
const TB: &str = "iqn.2026-11.org.ferrite.test:alua-b";

#[test]
fn device_group_states_are_live_saved_and_win_at_restart() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let ps = portal().to_string();
    let mut f = Daemon::start(d, &empty_config(d), &[]);
    let tg = "/device_groups/dg1/target_groups";
    let steps: Vec<(String, String)> = vec![
        (
            "/handlers/vdisk_nullio/mgmt".into(),
            "add_device n0 size=16M".into(),
        ),
        (
            "/targets/iscsi/mgmt".into(),
            format!("add_target {TA} portals={ps}"),
        ),
        (
            "/targets/iscsi/mgmt".into(),
            format!("add_target {TB} portals={ps} tpgt=2"),
        ),
        (format!("/targets/iscsi/{TA}/luns/mgmt"), "add n0 0".into()),
        ("/device_groups/mgmt".into(), "create dg1".into()),
        ("/device_groups/dg1/devices/mgmt".into(), "add n0".into()),
        (format!("{tg}/mgmt"), "create tg_a".into()),
        (format!("{tg}/mgmt"), "create tg_b".into()),
        (format!("{tg}/tg_a/mgmt"), format!("add {TA}")),
        (format!("{tg}/tg_b/mgmt"), format!("add {TB}")),
    ];
    for (path, cmd) in &steps {
        f.ok(&["do", path, cmd]);
    }
    let first = d.join("first.json");
    f.ok(&["save", first.to_str().unwrap()]);
    assert!(
        std::fs::read_to_string(&first)
            .unwrap()
            .contains("\"tg_b\"")
    );

    f.ok(&["set", &format!("{tg}/tg_b/state"), "standby"]);
    f.ok(&["set", &format!("{tg}/tg_b/preferred"), "1"]);
    assert_eq!(
        f.ok(&["get", &format!("{tg}/tg_b/state")]).lines().next(),
        Some("standby")
    );
    let state_file = d.join("alua").join("dg1");
    let saved_states = std::fs::read_to_string(&state_file).unwrap();
    assert!(saved_states.contains("tg_b standby 1"), "{saved_states}");
    let out = f.ctl(&["set", &format!("{tg}/tg_b/state"), "sleepy"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("not an access state"));
    let second = d.join("second.json");
    f.ok(&["save", second.to_str().unwrap()]);
    let text = std::fs::read_to_string(&second).unwrap();
    assert!(text.contains("\"standby\""), "{text}");
    f.stop();

    // The first file says active; the saved state wins.
    let f2 = Daemon::start(d, &first, &[]);
    assert_eq!(
        f2.ok(&["get", &format!("{tg}/tg_b/state")]).lines().next(),
        Some("standby")
    );
    assert_eq!(
        f2.ok(&["get", &format!("{tg}/tg_b/preferred")])
            .lines()
            .next(),
        Some("1")
    );
    assert_eq!(
        f2.ok(&["get", &format!("{tg}/tg_a/state")]).lines().next(),
        Some("active")
    );
    // Deleting the group forgets its saved states.
    f2.ok(&["do", "/device_groups/mgmt", "del dg1"]);
    assert!(!state_file.exists());
}
