//! ferritectl against a control socket served over a recording runtime.

use std::path::Path;
use std::process::Command;
use std::sync::Arc;

use ferrite_mgmt::{Config, FakeRuntime, serve};

const T: &str = "iqn.2026-11.org.ferrite:default";

fn ctl(sock: &Path, args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_ferritectl"))
        .arg("--socket")
        .arg(sock)
        .args(args)
        .output()
        .expect("ferritectl runs");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn ferritectl_round_trips() {
    let dir = tempfile::tempdir().unwrap();
    let rt = Arc::new(FakeRuntime::new());
    let cfg = Config::embedded_default(dir.path(), "127.0.0.1:3260".parse().unwrap());
    let save = dir.path().join("ferrite.json");
    let sock = dir.path().join("ctl.sock");
    let _srv = serve(rt.clone(), cfg, Some(save.clone()), &sock).unwrap();

    let (ok, out, _) = ctl(&sock, &["ls"]);
    assert!(ok);
    assert_eq!(
        out,
        "handlers/\ndevices/\ntargets/\ndevice_groups/\ndata_memory_mb\ndata_memory\n"
    );
    let (ok, out, _) = ctl(&sock, &["ls", "-l", "/devices/disk0"]);
    assert!(ok);
    assert!(out.contains("attr rw read_only"), "{out}");
    let (ok, out, _) = ctl(&sock, &["get", "/devices/disk0/thin_provisioned"]);
    assert!(ok);
    assert_eq!(out, "1\n[key]\n");
    let (ok, out, _) = ctl(&sock, &["get", "/handlers/vdisk_nullio/mgmt"]);
    assert!(ok && out.contains("add_device NAME"), "{out}");

    let (ok, _, err) = ctl(
        &sock,
        &[
            "do",
            "/handlers/vdisk_nullio/mgmt",
            "add_device",
            "n0",
            "size=1M;",
            "mem=1",
        ],
    );
    assert!(ok, "{err}");
    let lm = format!("/targets/iscsi/{T}/luns/mgmt");
    let (ok, _, err) = ctl(&sock, &["do", &lm, "add", "n0", "1", "read_only=1"]);
    assert!(ok, "{err}");
    let (ok, _, err) = ctl(&sock, &["do", &lm, "add", "n0", "1"]);
    assert!(!ok);
    assert!(err.contains("LUN 1 is in use"), "{err}");
    let (ok, _, err) = ctl(&sock, &["set", "/devices/n0/rotational", "sometimes"]);
    assert!(!ok);
    assert!(err.contains("not a boolean"), "{err}");
    let alias = format!("/targets/iscsi/{T}/alias");
    let (ok, _, err) = ctl(&sock, &["set", &alias, "-dash-"]);
    assert!(ok, "{err}");
    let (_, out, _) = ctl(&sock, &["get", &alias]);
    assert_eq!(out, "-dash-\n[key]\n");
    let (ok, out, _) = ctl(&sock, &["--json", "get", "/devices/n0/mem"]);
    assert!(ok);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["value"]["value"], "1");

    // save, then diff/apply of the saved file: no changes, twice.
    let (ok, out, err) = ctl(&sock, &["save"]);
    assert!(ok, "{err}");
    assert!(out.contains("saved to"), "{out}");
    let f = save.to_str().unwrap();
    for _ in 0..2 {
        let (ok, out, err) = ctl(&sock, &["apply", f]);
        assert!(ok, "{err}");
        assert_eq!(out, "no changes\n");
    }
    // A file without n0: diff shows the unmapping and the deletion in order.
    let mut c = Config::load(&save).unwrap();
    c.devices.retain(|d| d.name != "n0");
    c.targets.iscsi[0].luns.retain(|l| l.device != "n0");
    let f2 = dir.path().join("next.json");
    c.save_atomic(&f2).unwrap();
    let (ok, out, _) = ctl(&sock, &["diff", f2.to_str().unwrap()]);
    assert!(ok);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 2, "{out}");
    assert!(
        lines[0].starts_with("map of") && lines[1].contains("del_device n0"),
        "{out}"
    );
    let before = rt.calls().len();
    let (ok, _, _) = ctl(&sock, &["apply", f2.to_str().unwrap()]);
    assert!(ok);
    assert_eq!(rt.calls().len(), before + 2);

    let (ok, out, _) = ctl(&sock, &["sessions"]);
    assert!(ok);
    assert_eq!(out, "no sessions\n");
    let (ok, _, _) = ctl(&sock, &["stats"]);
    assert!(ok);
    let (ok, out, _) = ctl(&sock, &["config"]);
    assert!(ok);
    assert_eq!(Config::from_json(&out, "out").unwrap(), c);

    // Errors name what was wrong and exit non-zero.
    let (ok, _, err) = ctl(&sock, &["get", "/devices/nosuch/size"]);
    assert!(!ok);
    assert!(err.contains("valid devices: disk0"), "{err}");
    let (ok, _, err) = ctl(&sock, &["apply", "/nonexistent.json"]);
    assert!(!ok);
    assert!(err.contains("/nonexistent.json"), "{err}");
    let (ok, _, err) = ctl(&dir.path().join("none.sock"), &["ls"]);
    assert!(!ok);
    assert!(err.contains("cannot talk to ferrited"), "{err}");
}

#[test]
fn offline_commands() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("unused.sock");
    let conf = dir.path().join("scst.conf");
    std::fs::write(
        &conf,
        "HANDLER vdisk_nullio {\n DEVICE n {\n size_mb 16\n }\n}\nTARGET_DRIVER iscsi {\n TARGET iqn.2026-01.org.x:t {\n enabled 1\n LUN 0 n\n bogus 1\n }\n}\n",
    )
    .unwrap();
    let (ok, out, err) = ctl(&sock, &["import-scst", conf.to_str().unwrap()]);
    assert!(ok, "{err}");
    assert!(err.contains("bogus ignored"), "{err}");
    let c = Config::from_json(&out, "out").unwrap();
    assert_eq!(c.targets.iscsi[0].luns[0].device, "n");
    let json = dir.path().join("out.json");
    let (ok, _, err) = ctl(
        &sock,
        &[
            "import-scst",
            conf.to_str().unwrap(),
            "-o",
            json.to_str().unwrap(),
        ],
    );
    assert!(ok, "{err}");
    let (ok, out, _) = ctl(&sock, &["check", json.to_str().unwrap()]);
    assert!(ok && out.contains("valid"), "{out}");
    std::fs::write(
        &json,
        "{\"devices\":[{\"name\":\"x\",\"handler\":\"vdisk_nullio\"}]}",
    )
    .unwrap();
    let (ok, _, err) = ctl(&sock, &["check", json.to_str().unwrap()]);
    assert!(!ok);
    assert!(err.contains("devices[0].size"), "{err}");
    let (ok, out, _) = ctl(&sock, &["completions", "bash"]);
    assert!(ok && out.contains("ferritectl"), "{out}");
    let (ok, _, _) = ctl(&sock, &["completions", "tcsh"]);
    assert!(!ok);
}

#[test]
fn import_lio_carries_config_and_reservations() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("unused.sock");
    let save = dir.path().join("saveconfig.json");
    std::fs::write(
        &save,
        r#"{"fabric_modules": [], "storage_objects": [{"dev": "/srv/d1.img", "name": "d1",
            "plugin": "fileio", "size": 16777216, "write_back": false,
            "wwn": "abcdef01-2345-6789-abcd-ef0123456789"}],
          "targets": [{"fabric": "iscsi", "wwn": "iqn.2003-01.org.linux-iscsi.x:sn.1",
            "tpgs": [{"tag": 1, "enable": true,
              "attributes": {"generate_node_acls": 1, "demo_mode_write_protect": 0},
              "luns": [{"index": 0, "storage_object": "/backstores/fileio/d1"}],
              "portals": [{"ip_address": "127.0.0.1", "port": 3260}]}]}]}"#,
    )
    .unwrap();
    let pr = dir.path().join("pr");
    std::fs::create_dir(&pr).unwrap();
    std::fs::write(
        pr.join("aptpl_abcdef01-2345-6789-abcd-ef0123456789"),
        "PR_REG_START: 0\ninitiator_fabric=iSCSI\ninitiator_node=iqn.i\n\
         initiator_sid=00023d000001\nsa_res_key=17\nres_holder=1\nres_type=01\n\
         res_scope=00\nres_all_tg_pt=0\nmapped_lun=0\ntarget_fabric=iSCSI\n\
         target_node=iqn.2003-01.org.linux-iscsi.x:sn.1\ntpgt=1\nport_rtpi=1\n\
         target_lun=0\nPR_REG_END: 0\n",
    )
    .unwrap();
    let state = dir.path().join("state");
    let args = [
        "import-lio",
        save.to_str().unwrap(),
        "--pr-dir",
        pr.to_str().unwrap(),
    ];
    // Without a state directory the reservations are named, not written.
    let (ok, out, err) = ctl(&sock, &args);
    assert!(ok, "{err}");
    assert!(err.contains("has saved reservations"), "{err}");
    let c = Config::from_json(&out, "out").unwrap();
    assert_eq!(c.devices[0].t10_vendor.as_deref(), Some("LIO-ORG"));
    assert_eq!(
        c.devices[0].naa.as_deref(),
        Some("0x6001405abcdef0123456789abcdef012")
    );
    assert_eq!(c.targets.iscsi[0].luns[0].device, "d1");
    let mut with_state = args.to_vec();
    with_state.extend(["--state-dir", state.to_str().unwrap()]);
    let (ok, _, err) = ctl(&sock, &with_state);
    assert!(ok, "{err}");
    let saved = std::fs::read_to_string(state.join("devices/d1/pr_state")).unwrap();
    assert!(
        saved.contains("reg 0000000000000011 0 1 iqn.i,i,0x00023d000001"),
        "{saved}"
    );
    // A truncated file: named with its line, nothing written.
    let text = std::fs::read_to_string(&save).unwrap();
    std::fs::write(&save, &text[..text.len() / 2]).unwrap();
    let out_json = dir.path().join("out.json");
    let mut to_file = with_state.clone();
    to_file.extend(["-o", out_json.to_str().unwrap()]);
    let (ok, _, err) = ctl(&sock, &to_file);
    assert!(!ok);
    assert!(
        err.contains("saveconfig.json") && err.contains("line ") && err.contains("not JSON"),
        "{err}"
    );
    assert!(!out_json.exists());
}

#[test]
fn import_scst_carries_saved_reservations() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("unused.sock");
    let conf = dir.path().join("scst.conf");
    std::fs::write(
        &conf,
        "HANDLER vdisk_nullio {\n DEVICE disk1 {\n size_mb 16\n }\n}\nTARGET_DRIVER iscsi {\n TARGET iqn.2026-01.org.x:t {\n enabled 1\n rel_tgt_id 4\n LUN 0 disk1\n }\n}\n",
    )
    .unwrap();
    // SCST's saved state: one registrant (key 9) through rel_tgt_id 4.
    let pr = dir.path().join("pr");
    std::fs::create_dir(&pr).unwrap();
    let mut f = Vec::new();
    f.extend(0xBBEE_EEAA_EEBB_DD77u64.to_le_bytes());
    f.extend(1u64.to_le_bytes());
    f.extend([1, 0, 0xff, 0, 0]);
    let mut tid = vec![0x45, 0, 0, 16];
    tid.extend(b"iqn.i,i,0x10000\0\0");
    tid.truncate(20);
    f.extend(&tid);
    f.extend(9u64.to_be_bytes());
    f.extend(4u16.to_le_bytes());
    std::fs::write(pr.join("disk1"), &f).unwrap();
    let state = dir.path().join("state");
    let (ok, _, err) = ctl(
        &sock,
        &[
            "import-scst",
            conf.to_str().unwrap(),
            "--pr-dir",
            pr.to_str().unwrap(),
            "--state-dir",
            state.to_str().unwrap(),
        ],
    );
    assert!(ok, "{err}");
    let saved = std::fs::read_to_string(state.join("devices/disk1/pr_state")).unwrap();
    assert!(
        saved.contains("reg 0000000000000009 0 4 iqn.i,i,0x000001000000 iqn.2026-01.org.x:t"),
        "{saved}"
    );
}

#[test]
fn non_root_peer_is_refused() {
    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::process::CommandExt;
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipped: needs root to run a client as another uid");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let rt = Arc::new(FakeRuntime::new());
    let sock = dir.path().join("ctl.sock");
    let _srv = serve(rt, Config::default(), None, &sock).unwrap();
    // Open the file-system gates so that only SO_PEERCRED stands in the way.
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(&sock, std::fs::Permissions::from_mode(0o666)).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_ferritectl"))
        .arg("--socket")
        .arg(&sock)
        .arg("ls")
        .uid(65534)
        .gid(65534)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    if err.contains("Permission denied (os error 13)") && err.contains("cannot talk") {
        eprintln!("skipped: uid 65534 cannot reach the test directory: {err}");
        return;
    }
    assert!(!out.status.success());
    assert!(err.contains("permission denied: uid 65534"), "{err}");
}

/// The largest char boundary of `s` at or below `i`.
fn floor(s: &str, mut i: usize) -> usize {
    while !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

/// Deterministic xorshift: arbitrary bytes without a dependency.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn pick<'a>(&mut self, v: &[&'a str]) -> &'a str {
        v[(self.next() % v.len() as u64) as usize]
    }
}

/// Garbage and near-miss input on every entry point that reads from the
/// socket or a file: answers are errors, never panics.
#[test]
fn arbitrary_input_never_panics() {
    use std::sync::Mutex;
    let rt = Arc::new(FakeRuntime::new());
    let dir = tempfile::tempdir().unwrap();
    let cfg = Config::embedded_default(dir.path(), "127.0.0.1:3260".parse().unwrap());
    let tree = Mutex::new(ferrite_mgmt::Tree::new(cfg, rt, None));
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let words = [
        "add",
        "del",
        "replace",
        "clear",
        "create",
        "move",
        "add_device",
        "del_device",
        "add_target",
        "del_target",
        "add_target_attribute",
        "IncomingUser",
        "OutgoingUser",
        "disk0",
        T,
        "0",
        "16383",
        "16384",
        "-1",
        "size=1M",
        "filename=/x",
        "blocksize=4096",
        "read_only=1",
        ";",
        "=",
        "==",
        "\"",
        "{",
        "}",
        "*",
        "?",
        "\u{0}",
        "é",
        "",
        "/",
        "mgmt",
        "luns",
        "ini_groups",
        "g1",
        "iqn.1994-05.com.redhat:x",
        "0123456789abcdef",
    ];
    let paths = [
        "/",
        "/handlers/vdisk_nullio/mgmt",
        "/handlers/vdisk_fileio/mgmt",
        "/targets/iscsi/mgmt",
        "/devices/disk0",
        "/devices/disk0/size",
        "/devices/disk0/read_only",
        "/targets/iscsi",
        "/targets/iscsi/digests",
        "//",
        "/../..",
        "/devices/disk0/size/x",
    ];
    let tl = format!("/targets/iscsi/{T}/luns/mgmt");
    let gm = format!("/targets/iscsi/{T}/ini_groups/mgmt");
    for i in 0..3000 {
        let n = (rng.next() % 6) as usize;
        let cmd: Vec<&str> = (0..n).map(|_| rng.pick(&words)).collect();
        let cmd = cmd.join(if i % 2 == 0 { " " } else { ";" });
        let path = match i % 4 {
            0 => tl.as_str(),
            1 => gm.as_str(),
            _ => rng.pick(&paths),
        };
        let reqs = [
            serde_json::json!({"op": "do", "path": path, "command": cmd}).to_string(),
            serde_json::json!({"op": "set", "path": path, "value": cmd}).to_string(),
            serde_json::json!({"op": "get", "path": path}).to_string(),
            serde_json::json!({"op": "ls", "path": path}).to_string(),
        ];
        for r in &reqs {
            let _ = ferrite_mgmt::server::handle_line(&tree, r);
            // Truncations of valid requests.
            let cut = (rng.next() as usize) % (r.len() + 1);
            let rsp = ferrite_mgmt::server::handle_line(&tree, &r[..floor(r, cut)]);
            if cut < r.len() {
                assert!(!rsp.ok || r[..floor(r, cut)].ends_with('}'));
            }
        }
        // Raw bytes.
        let bytes: Vec<u8> = (0..(rng.next() % 64)).map(|_| rng.next() as u8).collect();
        let text = String::from_utf8_lossy(&bytes);
        assert!(
            !ferrite_mgmt::server::handle_line(&tree, &text).ok
                || text.trim_start().starts_with('{')
        );
        let _ = ferrite_mgmt::scst::import_scst(&text);
        let _ = ferrite_mgmt::scst::import_scst(&cmd.replace(';', "\n"));
    }
    // Whatever was accepted left a valid model.
    let t = tree.lock().unwrap();
    t.config().validate().unwrap();
}
