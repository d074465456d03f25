//! Management end to end: a configuration built from nothing with
//! `ferritectl` only survives save and restart; `apply` is idempotent and
//! changes exactly what differs; an scst.conf imports into a running
//! equivalent configuration.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed step is a failed test

mod mgmt_util;

use std::net::SocketAddr;

use ferrite_tests::{Config, Device, Group, Target};
use mgmt_util::{Daemon, empty_config, iscsi_ls_luns, login, portal, report_luns};

const TA: &str = "iqn.2026-11.org.ferrite.test:mgmt-a";
const TB: &str = "iqn.2026-11.org.ferrite.test:mgmt-b";
const INI_A: &str = "iqn.2026-11.org.ferrite.test:host-a";
const INI_B: &str = "iqn.2026-11.org.ferrite.test:host-b";
const INI_C: &str = "iqn.2026-11.org.ferrite.test:host-c";

fn check_masking(addr: SocketAddr) {
    // iscsi-ls -s logs in to every target it discovers and reports its LUNs.
    assert_eq!(
        iscsi_ls_luns(addr, INI_A, TA),
        [0, 1],
        "initiator A on {TA}"
    );
    assert_eq!(iscsi_ls_luns(addr, INI_B, TA), [0], "initiator B on {TA}");
    assert_eq!(
        iscsi_ls_luns(addr, INI_C, TA),
        [0],
        "an initiator in no group"
    );
    assert_eq!(
        iscsi_ls_luns(addr, INI_A, TB),
        [0, 3],
        "initiator A on {TB}"
    );
    assert_eq!(
        iscsi_ls_luns(addr, INI_B, TB),
        [0, 3],
        "initiator B on {TB}"
    );
    let mut a = login(addr, INI_A, TA, 1);
    assert_eq!(report_luns(&mut a), [0, 1], "REPORT LUNS of A");
    let mut b = login(addr, INI_B, TA, 2);
    assert_eq!(report_luns(&mut b), [0], "REPORT LUNS of B");
    let _ = a.logout(0);
    let _ = b.logout(0);
}

#[test]
fn configuration_built_with_ferritectl_survives_save_and_restart() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let p = portal();
    let ps = p.to_string();
    let img = d.join("f0.img");
    std::fs::File::create(&img)
        .unwrap()
        .set_len(64 << 20)
        .unwrap();
    let mut f = Daemon::start(d, &empty_config(d), &[]);
    assert!(f.config().contains("\"devices\": []"), "not empty at start");

    let fileio = format!("filename={}", img.display());
    let ta = format!("/targets/iscsi/{TA}");
    let tb = format!("/targets/iscsi/{TB}");
    let steps: Vec<Vec<String>> = vec![
        vec![
            "/handlers/vdisk_fileio/mgmt".into(),
            "add_device".into(),
            "f0".into(),
            fileio,
        ],
        vec![
            "/handlers/vdisk_nullio/mgmt".into(),
            "add_device n0 size=32M".into(),
        ],
        vec![
            "/handlers/vdisk_nullio/mgmt".into(),
            "add_device n1 size=16M".into(),
        ],
        vec![
            "/targets/iscsi/mgmt".into(),
            format!("add_target {TA} portals={ps}"),
        ],
        vec![
            "/targets/iscsi/mgmt".into(),
            format!("add_target {TB} portals={ps}"),
        ],
        // Default map of A: LUN 0 only.
        vec![format!("{ta}/luns/mgmt"), "add n0 0".into()],
        vec![format!("{ta}/ini_groups/mgmt"), "create full".into()],
        vec![format!("{ta}/ini_groups/mgmt"), "create limited".into()],
        vec![
            format!("{ta}/ini_groups/full/initiators/mgmt"),
            format!("add {INI_A}"),
        ],
        vec![
            format!("{ta}/ini_groups/limited/initiators/mgmt"),
            format!("add {INI_B}"),
        ],
        vec![format!("{ta}/ini_groups/full/luns/mgmt"), "add f0 0".into()],
        vec![format!("{ta}/ini_groups/full/luns/mgmt"), "add n0 1".into()],
        vec![
            format!("{ta}/ini_groups/limited/luns/mgmt"),
            "add f0 0".into(),
        ],
        vec![format!("{tb}/luns/mgmt"), "add n1 0".into()],
        vec![format!("{tb}/luns/mgmt"), "add n0 3 read_only=1".into()],
    ];
    for s in &steps {
        let mut args: Vec<&str> = vec!["do"];
        args.extend(s.iter().map(String::as_str));
        f.ok(&args);
    }
    f.ok(&["set", &format!("{ta}/enabled"), "1"]);
    f.ok(&["set", &format!("{tb}/enabled"), "1"]);
    check_masking(p);

    let saved = d.join("saved.json");
    f.ok(&["save", saved.to_str().unwrap()]);
    let before = f.config();
    f.ok(&["check", saved.to_str().unwrap()]);
    f.stop();

    let f2 = Daemon::start(d, &saved, &[]);
    assert_eq!(
        f2.ok(&["diff", saved.to_str().unwrap()]).trim(),
        "no changes"
    );
    assert_eq!(f2.config(), before, "restarted tree differs");
    check_masking(p);
}

fn config_json(p: SocketAddr, extra_lun: bool) -> String {
    let mut t = Target::new(TA).set("enabled", true).portal(p).lun(0, "n0");
    if extra_lun {
        t = t.lun(2, "n1");
    }
    Config::new()
        .device(Device::nullio("n0", 33554432))
        .device(Device::nullio("n1", 16777216))
        .target(t.group(Group::new("g").initiator(INI_B).lun(0, "n1")))
        .json()
}

#[test]
fn apply_twice_changes_nothing_and_one_extra_lun_changes_exactly_that() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let p = portal();
    let f = Daemon::start(d, &empty_config(d), &[]);
    let file = d.join("c.json");
    std::fs::write(&file, config_json(p, false)).unwrap();
    let first = f.ok(&["apply", file.to_str().unwrap()]);
    assert!(
        first.lines().count() >= 4 && !first.contains("no changes"),
        "first apply: {first}"
    );
    let cfg1 = f.config();
    assert_eq!(
        f.ok(&["apply", file.to_str().unwrap()]).trim(),
        "no changes"
    );
    assert_eq!(f.ok(&["diff", file.to_str().unwrap()]).trim(), "no changes");
    assert_eq!(f.config(), cfg1, "second apply changed the tree");

    let mut a = login(p, INI_A, TA, 3);
    assert_eq!(report_luns(&mut a), [0]);

    let file2 = d.join("c2.json");
    std::fs::write(&file2, config_json(p, true)).unwrap();
    let diff = f.ok(&["diff", file2.to_str().unwrap()]);
    let lines: Vec<&str> = diff.lines().collect();
    assert_eq!(lines.len(), 1, "diff with one extra LUN: {diff}");
    assert!(
        lines[0].contains(TA) && lines[0].contains("2=n1") && !lines[0].contains("ini_groups"),
        "the change names the target's map and the new LUN: {diff}"
    );
    let applied = f.ok(&["apply", file2.to_str().unwrap()]);
    assert_eq!(applied.trim(), diff.trim(), "apply did what diff announced");
    assert_eq!(
        f.ok(&["apply", file2.to_str().unwrap()]).trim(),
        "no changes"
    );
    assert_eq!(report_luns(&mut a), [0, 2], "the new LUN is reported");
    // Nothing else moved: the group's map is as before.
    let mut b = login(p, INI_B, TA, 4);
    assert_eq!(report_luns(&mut b), [0]);
    // The running configuration differs from the first only by that LUN.
    let cfg2 = f.config();
    assert_ne!(cfg1, cfg2);
    assert_eq!(
        f.ok(&["get", &format!("/targets/iscsi/{TA}/luns/2/device")])
            .trim(),
        "n1"
    );
}

#[test]
fn import_scst_converts_into_a_running_equivalent_configuration() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let p = portal();
    let img = d.join("disk02.img");
    std::fs::File::create(&img)
        .unwrap()
        .set_len(32 << 20)
        .unwrap();
    let scst = format!(
        r#"# written by the test
HANDLER vdisk_fileio {{
	DEVICE disk02 {{
		filename {img}
		blocksize 4096
		write_through 1
	}}
}}

HANDLER vdisk_nullio {{
	DEVICE null1 {{
		size_mb 64
	}}
	DEVICE null2 {{
		size_mb 8
	}}
}}

TARGET_DRIVER iscsi {{
	enabled 1

	TARGET {TA} {{
		enabled 1
		allowed_portal {p}

		LUN 0 disk02
		LUN 1 null1
		{{
			read_only 1
		}}

		GROUP hosts {{
			LUN 0 null2
			INITIATOR {INI_B}
		}}
	}}
}}
"#,
        img = img.display()
    );
    let conf = d.join("scst.conf");
    std::fs::write(&conf, scst).unwrap();
    let f = Daemon::start(d, &empty_config(d), &[]);
    let out = d.join("imported.json");
    let o = f.ctl(&[
        "import-scst",
        conf.to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
    ]);
    assert!(
        o.status.success(),
        "import-scst: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    f.ok(&["check", out.to_str().unwrap()]);
    let applied = f.ok(&["apply", out.to_str().unwrap()]);
    assert!(
        applied.contains("disk02") && applied.contains("null2"),
        "{applied}"
    );
    assert_eq!(f.ok(&["diff", out.to_str().unwrap()]).trim(), "no changes");

    assert_eq!(iscsi_ls_luns(p, INI_A, TA), [0, 1], "default map");
    assert_eq!(iscsi_ls_luns(p, INI_B, TA), [0], "group hosts");
    assert_eq!(
        f.ok(&["get", "/devices/disk02/blocksize"]).lines().next(),
        Some("4096")
    );
    assert_eq!(
        f.ok(&["get", "/devices/disk02/write_through"])
            .lines()
            .next(),
        Some("1")
    );
    assert_eq!(
        f.ok(&["get", &format!("/targets/iscsi/{TA}/luns/1/read_only")])
            .lines()
            .next(),
        Some("1")
    );
    let mut b = login(p, INI_B, TA, 5);
    assert_eq!(report_luns(&mut b), [0]);
    // READ CAPACITY(10) of the group's LUN 0: null2, 8 MiB of 512-byte blocks.
    let r = mgmt_util::scsi(&mut b, 0, &[0x25, 0, 0, 0, 0, 0, 0, 0, 0, 0], 8, &[]);
    assert_eq!(r.status, 0, "{r:?}");
    let last = u32::from_be_bytes(r.data[0..4].try_into().unwrap()) as u64;
    let bs = u32::from_be_bytes(r.data[4..8].try_into().unwrap()) as u64;
    assert_eq!((last + 1) * bs, 8 << 20, "group LUN 0 is null2");
}
