use super::*;
use crate::config::GroupConfig;
use crate::runtime::FakeRuntime;

const T: &str = "iqn.2026-11.org.ferrite:default";

fn sample() -> Config {
    let mut cfg = Config::embedded_default(Path::new("/srv"), "127.0.0.1:3260".parse().unwrap());
    let mut null = DeviceConfig::new("null0", Handler::VdiskNullio);
    null.size = Some(1 << 20);
    cfg.devices.push(null);
    let mut spare = DeviceConfig::new("spare", Handler::VdiskNullio);
    spare.size = Some(1 << 20);
    cfg.devices.push(spare);
    let t = &mut cfg.targets.iscsi[0];
    t.luns.push(LunConfig {
        lun: 1,
        device: "null0".into(),
        read_only: false,
    });
    t.ini_groups.push(GroupConfig {
        name: "hosts".into(),
        initiators: vec!["iqn.1994-05.com.redhat:a".into()],
        luns: vec![LunConfig {
            lun: 0,
            device: "null0".into(),
            read_only: true,
        }],
    });
    t.ini_groups.push(GroupConfig {
        name: "other".into(),
        initiators: vec![],
        luns: vec![],
    });
    cfg.validate().unwrap();
    cfg
}

fn tree() -> (Tree, Arc<FakeRuntime>) {
    let rt = Arc::new(FakeRuntime::new());
    (Tree::new(sample(), rt.clone(), None), rt)
}

#[test]
fn bad_commands_change_nothing() {
    let tl = format!("/targets/iscsi/{T}/luns/mgmt");
    let gl = format!("/targets/iscsi/{T}/ini_groups/hosts/luns/mgmt");
    let gm = format!("/targets/iscsi/{T}/ini_groups/mgmt");
    let im = format!("/targets/iscsi/{T}/ini_groups/hosts/initiators/mgmt");
    let h = "/handlers/vdisk_nullio/mgmt";
    let hf = "/handlers/vdisk_fileio/mgmt";
    let tm = "/targets/iscsi/mgmt";
    let nosuch = format!("/targets/iscsi/{T}/ini_groups/nosuch/luns/mgmt");
    let cases: Vec<(&str, String, &str)> = vec![
        // handler mgmt
        (h, "".into(), "empty command"),
        (h, "frobnicate x".into(), "unknown command \"frobnicate\""),
        (h, "add_device".into(), "missing argument"),
        (
            h,
            "add_device n1 extra size=4096".into(),
            "unexpected argument",
        ),
        (
            h,
            "add_device n1 size=4096; colour=red".into(),
            "unknown parameter \"colour\"",
        ),
        (
            h,
            "add_device n1 size=4096; size=8192".into(),
            "given twice",
        ),
        (h, "add_device n1 size=lots".into(), "not a size"),
        (
            h,
            "add_device n1 size=4096; blocksize=1000".into(),
            "512, 4096",
        ),
        (
            h,
            "add_device n1 size=4096; read_only=maybe".into(),
            "not a boolean",
        ),
        (h, "add_device n1".into(), "needs a size"),
        (
            h,
            "add_device n1 size=4096; filename=/x".into(),
            "remove filename",
        ),
        (
            h,
            "add_device bad/name size=4096".into(),
            "valid characters",
        ),
        (h, "add_device null0 size=4096".into(), "already exists"),
        (h, "add_device n1 size=4096 =3".into(), "has no name"),
        (
            h,
            "add_device n1 size=4096 trailing".into(),
            "parameters come last",
        ),
        (hf, "add_device f1 size=4096".into(), "needs a filename"),
        (hf, "add_device f1 filename=rel.img".into(), "absolute"),
        (h, "del_device".into(), "missing argument"),
        (h, "del_device nosuch".into(), "no device \"nosuch\""),
        (
            h,
            "del_device disk0".into(),
            "belongs to handler vdisk_fileio",
        ),
        (h, "del_device null0".into(), "in use by"),
        (h, "del_device spare now".into(), "unexpected argument"),
        // target mgmt
        (tm, "add_target".into(), "missing argument"),
        (tm, "add_target iqn.bad".into(), "yyyy-mm"),
        (tm, format!("add_target {T}"), "already exists"),
        (
            tm,
            "add_target iqn.2026-11.org.x:y portals=nowhere".into(),
            "not ADDR:PORT",
        ),
        (
            tm,
            "add_target iqn.2026-11.org.x:y tpgt=70000".into(),
            "0..65535",
        ),
        (
            tm,
            "add_target iqn.2026-11.org.x:y colour=red".into(),
            "unknown parameter",
        ),
        (tm, "del_target iqn.2026-11.org.x:none".into(), "no target"),
        (tm, "launch".into(), "unknown command"),
        // LUN mgmt, default map and group map
        (&tl, "add".into(), "missing argument"),
        (&tl, "add spare".into(), "missing argument"),
        (
            &tl,
            "add spare 0".into(),
            "LUN 0 is in use by device \"disk0\"",
        ),
        (&tl, "add spare 16384".into(), "0..16383"),
        (&tl, "add spare -1".into(), "not a LUN"),
        (&tl, "add spare x".into(), "not a LUN"),
        (&tl, "add nosuch 5".into(), "no device \"nosuch\""),
        (&tl, "add spare 5 read_only=2".into(), "not a boolean"),
        (&tl, "add spare 5 readonly=1".into(), "unknown parameter"),
        (&tl, "add spare 5 6".into(), "unexpected argument"),
        (&tl, "del 9".into(), "LUN 9 does not exist"),
        (&tl, "del".into(), "missing argument"),
        (&tl, "replace spare 9".into(), "does not exist; use add"),
        (&tl, "clear now".into(), "unexpected argument"),
        (&tl, "wipe".into(), "unknown command"),
        (&gl, "add spare 0".into(), "in use by device \"null0\""),
        (&gl, "del 3".into(), "does not exist"),
        // groups
        (&gm, "create".into(), "missing argument"),
        (&gm, "create hosts".into(), "already exists"),
        (&gm, "create a/b".into(), "valid characters"),
        (&gm, "create mgmt".into(), "reserved"),
        (&gm, "del nosuch".into(), "no group"),
        (&gm, "rename a b".into(), "unknown command"),
        // initiators
        (&im, "add".into(), "missing argument"),
        (
            &im,
            "add iqn.1994-05.com.redhat:a".into(),
            "already in group \"hosts\"",
        ),
        (&im, "del iqn.x".into(), "not in group"),
        (
            &im,
            "move iqn.1994-05.com.redhat:a".into(),
            "missing argument",
        ),
        (
            &im,
            "move iqn.1994-05.com.redhat:a nosuch".into(),
            "no group \"nosuch\"",
        ),
        (
            &im,
            "move iqn.1994-05.com.redhat:a hosts".into(),
            "already in group",
        ),
        (&im, "move iqn.x other".into(), "not in group"),
        (&im, "clear all".into(), "unexpected argument"),
        // paths
        (
            "/handlers/vdisk_foo/mgmt",
            "add_device x".into(),
            "valid handlers: vdisk_fileio",
        ),
        (
            "/targets/iscsi/iqn.2026-11.org.x:none/luns/mgmt",
            "clear".into(),
            "no such object",
        ),
        (&nosuch, "clear".into(), "valid entries: mgmt, hosts, other"),
        (
            "/devices/disk0/read_only",
            "add x 0".into(),
            "not a mgmt leaf",
        ),
        // CHAP
        (
            tm,
            format!("add_target_attribute {T} IncomingUser joe"),
            "missing argument",
        ),
        (
            tm,
            format!("add_target_attribute {T} IncomingUser joe short"),
            "12 to 255",
        ),
        (
            tm,
            format!("add_target_attribute {T} Password joe 0123456789abc"),
            "valid: IncomingUser, OutgoingUser",
        ),
        (
            tm,
            "add_target_attribute iqn.2026-11.org.x:none IncomingUser joe 0123456789abc".into(),
            "no target",
        ),
        (
            tm,
            format!("add_target_attribute {T} IncomingUser joe 0123456789abc extra"),
            "unexpected argument",
        ),
        (
            tm,
            format!("del_target_attribute {T} IncomingUser nobody"),
            "no CHAP user",
        ),
        (
            tm,
            format!("del_target_attribute {T} OutgoingUser nobody"),
            "no outgoing CHAP user",
        ),
        (
            tm,
            "add_attribute IncomingUser joe tiny".into(),
            "12 to 255",
        ),
        (tm, "del_attribute IncomingUser joe".into(), "no CHAP user"),
    ];
    for (path, cmd, want) in cases {
        let (mut t, rt) = tree();
        let before = t.config().clone();
        let e = t
            .run(path, &cmd)
            .expect_err(&format!("{path} {cmd:?} should fail"));
        let s = e.to_string();
        assert!(s.contains(want), "{path} {cmd:?}: {s:?} lacks {want:?}");
        assert_eq!(t.config(), &before, "{path} {cmd:?} changed the model");
        assert!(
            rt.calls().is_empty(),
            "{path} {cmd:?} reached the runtime: {:?}",
            rt.calls()
        );
    }
}

#[test]
fn bad_sets_change_nothing() {
    let ta = format!("/targets/iscsi/{T}");
    let cases: Vec<(String, &str, &str)> = vec![
        ("/devices/disk0/read_only".into(), "2", "not a boolean"),
        (
            "/devices/disk0/blocksize".into(),
            "4096",
            "del_device and add_device",
        ),
        ("/devices/disk0/filename".into(), "/y", "read-only"),
        ("/devices/disk0/handler".into(), "vdisk_nullio", "read-only"),
        (
            "/devices/disk0/t10_vendor".into(),
            "WAYTOOLONGVENDOR",
            "1 to 8",
        ),
        ("/devices/disk0/naa".into(), "0x1234", "16 hex"),
        ("/devices/disk0/size".into(), "12x", "not a size"),
        ("/devices/disk0/size".into(), "1000", "multiple"),
        ("/devices/disk0/resync_size".into(), "0", "write 1"),
        ("/devices/disk0/nosuch".into(), "1", "valid attributes"),
        (
            "/devices/nosuch/read_only".into(),
            "1",
            "valid devices: disk0, null0, spare",
        ),
        ("/devices/null0/mem".into(), "1", "read-only"),
        ("/devices/null0/filename".into(), "/x", "valid attributes"),
        (format!("{ta}/enabled"), "yes please", "not a boolean"),
        (format!("{ta}/portals"), "localhost", "address:port"),
        (format!("{ta}/tpgt"), "-1", "not a tag"),
        (format!("{ta}/luns/mgmt"), "add spare 3", "use do"),
        (format!("{ta}/luns/0/device"), "spare", "read-only"),
        ("/targets/iscsi/max_burst_length".into(), "100", "512.."),
        (
            "/targets/iscsi/first_burst_length".into(),
            "16777215",
            "exceeds",
        ),
        (
            "/targets/iscsi/max_connections".into(),
            "70000",
            "out of range",
        ),
        (
            "/targets/iscsi/immediate_data".into(),
            "perhaps",
            "not a boolean",
        ),
        (
            "/targets/iscsi/max_burst_length".into(),
            "big",
            "not a number",
        ),
        ("/devices".into(), "x", "read-only"),
        ("/data_memory_mb".into(), "63", "63 MiB is out of range"),
        (
            "/data_memory_mb".into(),
            "1073741825",
            "valid: 64..1073741824",
        ),
        (
            "/data_memory_mb".into(),
            "99999999999999999999",
            "out of range",
        ),
        ("/data_memory_mb".into(), "1G", "\"1G\" is not a number"),
        ("/data_memory_mb".into(), "-1", "not a number"),
        ("/data_memory".into(), "1", "read-only"),
    ];
    for (path, value, want) in cases {
        let (mut t, rt) = tree();
        let before = t.config().clone();
        let e = t
            .set(&path, value)
            .expect_err(&format!("{path}={value} should fail"));
        let s = e.to_string();
        assert!(s.contains(want), "{path}={value}: {s:?} lacks {want:?}");
        assert_eq!(t.config(), &before);
        assert!(rt.calls().is_empty(), "{path}: {:?}", rt.calls());
    }
}

#[test]
fn commands_change_model_and_runtime() {
    let (mut t, rt) = tree();
    t.run(
        "/handlers/vdisk_nullio/mgmt",
        "add_device n1 size=4M; blocksize=4096; nv_cache=1",
    )
    .unwrap();
    let d = t.config().device("n1").unwrap();
    assert_eq!(
        (d.size, d.blocksize, d.nv_cache),
        (Some(4 << 20), 4096, true)
    );
    t.run(
        &format!("/targets/iscsi/{T}/luns/mgmt"),
        "add n1 7 read_only=1",
    )
    .unwrap();
    t.run(&format!("/targets/iscsi/{T}/luns/mgmt"), "replace spare 7")
        .unwrap();
    t.run(&format!("/targets/iscsi/{T}/luns/mgmt"), "del 1")
        .unwrap();
    let luns = &t.config().iscsi_target(T).unwrap().luns;
    assert_eq!(luns.len(), 2);
    assert_eq!(
        luns[1],
        LunConfig {
            lun: 7,
            device: "spare".into(),
            read_only: false
        }
    );
    t.run(
        &format!("/targets/iscsi/{T}/ini_groups/hosts/initiators/mgmt"),
        "move iqn.1994-05.com.redhat:a other",
    )
    .unwrap();
    t.run(
        "/targets/iscsi/mgmt",
        "add_target iqn.2026-11.org.x:two portals=[::1]:3260,127.0.0.1:3261; alias=Two",
    )
    .unwrap();
    let t2 = t.config().iscsi_target("iqn.2026-11.org.x:two").unwrap();
    assert!(!t2.enabled);
    assert_eq!(t2.portals.len(), 2);
    t.set("/targets/iscsi/iqn.2026-11.org.x:two/enabled", "1")
        .unwrap();
    t.set("/devices/disk0/write_through", "yes").unwrap();
    t.set("/devices/disk0/serial", "ABC").unwrap();
    t.set("/targets/iscsi/max_burst_length", "524288").unwrap();
    t.set("/devices/disk0/resync_size", "1").unwrap();
    assert_eq!(t.config().device("disk0").unwrap().size, Some(2 << 30));
    assert_eq!(
        rt.calls(),
        vec![
            "add_device n1 vdisk_nullio".to_string(),
            format!("set_lun_map {T} - 0=disk0,1=null0,7=n1"),
            format!("set_lun_map {T} - 0=disk0,1=null0,7=spare"),
            format!("set_lun_map {T} - 0=disk0,7=spare"),
            format!("set_group_initiators {T} hosts "),
            format!("set_group_initiators {T} other iqn.1994-05.com.redhat:a"),
            "add_target iqn.2026-11.org.x:two".to_string(),
            "set_target_enabled iqn.2026-11.org.x:two true".to_string(),
            "set_device_attr disk0 WriteThrough(true)".to_string(),
            "set_device_attr disk0 Serial(\"ABC\")".to_string(),
            "set_iscsi_params".to_string(),
            "resync_size disk0".to_string(),
        ]
    );
    t.run("/handlers/vdisk_nullio/mgmt", "del_device null0")
        .unwrap_err();
    t.run(&format!("/targets/iscsi/{T}/ini_groups/mgmt"), "del hosts")
        .unwrap();
    t.run("/handlers/vdisk_nullio/mgmt", "del_device null0")
        .unwrap();
    assert!(t.config().device("null0").is_none());
    t.config().validate().unwrap();
}

#[test]
fn chap_commands() {
    let (mut t, rt) = tree();
    let tm = "/targets/iscsi/mgmt";
    t.run(
        tm,
        &format!("add_target_attribute {T} IncomingUser joe s3cret=with;semi"),
    )
    .unwrap();
    t.run(
        tm,
        &format!("add_target_attribute {T} IncomingUser ann 0123456789abcdef"),
    )
    .unwrap();
    let e = t
        .run(
            tm,
            &format!("add_target_attribute {T} IncomingUser joe 0123456789abcdef"),
        )
        .unwrap_err();
    assert!(e.to_string().contains("already exists"), "{e}");
    // Mutual CHAP with an initiator's secret is refused.
    let e = t
        .run(
            tm,
            &format!("add_target_attribute {T} OutgoingUser tgt 0123456789abcdef"),
        )
        .unwrap_err();
    assert!(e.to_string().contains("different secrets"), "{e}");
    t.run(
        tm,
        &format!("add_target_attribute {T} OutgoingUser tgt target-secret-1"),
    )
    .unwrap();
    let tc = t.config().iscsi_target(T).unwrap();
    assert_eq!(tc.incoming_users[0].secret, "s3cret=with;semi");
    assert_eq!(tc.outgoing_user.as_ref().unwrap().user, "tgt");
    assert_eq!(
        t.get(&format!("/targets/iscsi/{T}/incoming_users"))
            .unwrap()
            .value,
        "joe\nann"
    );
    let e = t
        .set(&format!("/targets/iscsi/{T}/incoming_users"), "x")
        .unwrap_err();
    assert!(e.to_string().contains("add_target_attribute"), "{e}");
    t.run(tm, &format!("del_target_attribute {T} IncomingUser joe"))
        .unwrap();
    t.run(tm, "add_attribute IncomingUser disc discovery-secret")
        .unwrap();
    assert_eq!(
        t.get("/targets/iscsi/discovery_incoming_users")
            .unwrap()
            .value,
        "disc"
    );
    t.set("/targets/iscsi/digests", "none").unwrap();
    assert_eq!(t.config().iscsi.digests, vec![crate::config::Digest::Off]);
    assert_eq!(
        t.get("/targets/iscsi/digests").unwrap().to_text(),
        "none\n[key]"
    );
    assert!(t.set("/targets/iscsi/digests", "md5").is_err());
    t.set("/targets/iscsi/queue_depth", "64").unwrap();
    assert!(t.set("/targets/iscsi/queue_depth", "0").is_err());
    // Secrets never reach the recorded calls or change descriptions.
    let calls = rt.calls().join("\n");
    assert!(
        !calls.contains("s3cret") && !calls.contains("discovery-secret"),
        "{calls}"
    );
    let saved = t.config().clone();
    let (mut t2, _rt2) = tree();
    let plan = t2.diff(&saved).unwrap();
    let shown: String = plan.iter().map(ToString::to_string).collect();
    assert!(
        !shown.contains("target-secret-1") && !shown.contains("discovery-secret"),
        "{shown}"
    );
    t2.apply(&saved).unwrap();
    assert_eq!(t2.config(), &saved);
    assert!(t2.diff(&saved).unwrap().is_empty());
}

#[test]
fn runtime_failure_leaves_model() {
    let (mut t, rt) = tree();
    rt.fail_on(Some("add_device"));
    let before = t.config().clone();
    let e = t
        .run("/handlers/vdisk_nullio/mgmt", "add_device n1 size=4096")
        .unwrap_err();
    assert!(matches!(e, MgmtError::Runtime { .. }), "{e}");
    assert!(e.to_string().contains("injected"), "{e}");
    assert_eq!(t.config(), &before);
}

#[test]
fn removable_is_set_at_creation_and_read_only_after() {
    let (mut t, _rt) = tree();
    assert_eq!(t.get("/devices/disk0/removable").unwrap().value, "0");
    t.run(
        "/handlers/vdisk_nullio/mgmt",
        "add_device cd0 size=4M; removable=1",
    )
    .unwrap();
    assert!(t.config().device("cd0").unwrap().removable);
    assert!(t.config().device("cd0").unwrap().flags().removable);
    let v = t.get("/devices/cd0/removable").unwrap();
    assert_eq!((v.value.as_str(), v.key, v.writable), ("1", true, false));
    assert!(t.set("/devices/cd0/removable", "0").is_err());
    assert!(t.config().device("cd0").unwrap().removable);
    assert!(
        t.run(
            "/handlers/vdisk_nullio/mgmt",
            "add_device cd1 removable=maybe"
        )
        .is_err()
    );
}

#[test]
fn reads_and_keys() {
    let (t, _rt) = tree();
    let v = t.get("/devices/disk0/thin_provisioned").unwrap();
    assert_eq!((v.value.as_str(), v.key, v.writable), ("1", true, false));
    assert_eq!(v.to_text(), "1\n[key]");
    let v = t.get("/devices/disk0/rotational").unwrap();
    assert_eq!((v.value.as_str(), v.key, v.writable), ("0", false, true));
    assert_eq!(v.to_text(), "0");
    assert_eq!(t.get("/devices/disk0/blocksize").unwrap().value, "512");
    assert_eq!(
        t.get("/devices/spare/size").unwrap().value,
        (1u64 << 20).to_string()
    );
    let naa = t.get("/devices/disk0/naa").unwrap().value;
    assert!(naa.starts_with("0x3") && naa.len() == 18, "{naa}");
    assert_eq!(
        t.get("/handlers/vdisk_fileio/mgmt").unwrap().value,
        HANDLER_USAGE
    );
    assert_eq!(
        t.get(&format!("/targets/iscsi/{T}/luns/mgmt"))
            .unwrap()
            .value,
        LUNS_USAGE
    );
    assert_eq!(
        t.get(&format!(
            "/targets/iscsi/{T}/ini_groups/hosts/luns/0/read_only"
        ))
        .unwrap()
        .to_text(),
        "1\n[key]"
    );
    assert_eq!(
        t.get(&format!("/targets/iscsi/{T}/portals")).unwrap().value,
        "127.0.0.1:3260"
    );
    assert_eq!(
        t.get("/devices/null0/exported").unwrap().value,
        format!("{T}/luns/1\n{T}/ini_groups/hosts/luns/0")
    );
    let v = t.get("/targets/iscsi/immediate_data").unwrap();
    assert_eq!((v.value.as_str(), v.key), ("1", false));
    assert!(t.get("/devices/disk0/resync_size").is_err());
    assert!(t.get("/devices").is_err());
    // Paths are forgiving about slashes.
    assert_eq!(t.get("devices//disk0/blocksize/").unwrap().value, "512");
    let names = |p: &str| {
        t.ls(p)
            .unwrap()
            .into_iter()
            .map(|e| e.name)
            .collect::<Vec<_>>()
    };
    assert_eq!(
        names("/"),
        [
            "handlers",
            "devices",
            "targets",
            "device_groups",
            "data_memory_mb",
            "data_memory"
        ]
    );
    assert_eq!(names("/handlers/vdisk_nullio"), ["mgmt", "null0", "spare"]);
    assert_eq!(
        names(&format!("/targets/iscsi/{T}/luns")),
        ["mgmt", "0", "1"]
    );
    assert_eq!(
        names(&format!("/targets/iscsi/{T}/ini_groups")),
        ["mgmt", "hosts", "other"]
    );
    assert!(names("/devices/null0").contains(&"mem".to_string()));
    assert!(!names("/devices/disk0").contains(&"mem".to_string()));
    let e = t.ls("/nope").unwrap_err().to_string();
    assert!(
        e.contains(
            "valid entries: handlers, devices, targets, device_groups, data_memory_mb, data_memory"
        ),
        "{e}"
    );
}

#[test]
fn sessions_in_tree() {
    let (mut t, rt) = tree();
    let s = |isid| SessionInfo {
        target: T.into(),
        initiator: "iqn.1994-05.com.redhat:a".into(),
        isid,
        tsih: 1,
        group: Some("hosts".into()),
        connections: vec!["127.0.0.1:50000".into()],
        ..SessionInfo::default()
    };
    rt.set_sessions(vec![s(2), s(1)]);
    let names: Vec<String> = t
        .ls(&format!("/targets/iscsi/{T}/sessions"))
        .unwrap()
        .into_iter()
        .map(|e| e.name)
        .collect();
    assert_eq!(
        names,
        ["iqn.1994-05.com.redhat:a", "iqn.1994-05.com.redhat:a_1"]
    );
    let p = format!("/targets/iscsi/{T}/sessions/iqn.1994-05.com.redhat:a_1");
    assert_eq!(t.get(&format!("{p}/isid")).unwrap().value, "0x000000000002");
    assert_eq!(t.get(&format!("{p}/group")).unwrap().value, "hosts");
    t.set(&format!("{p}/force_close"), "1").unwrap();
    assert_eq!(
        rt.calls(),
        vec![format!("close_session {T} iqn.1994-05.com.redhat:a 0x2")]
    );
    assert!(t.set(&format!("{p}/tsih"), "3").is_err());
}

fn target_new() -> Config {
    let mut new = sample();
    // Device changes: one attribute, one recreated (blocksize), one gone, one new.
    new.devices[0].rotational = true;
    new.devices[1].blocksize = 4096;
    new.devices.retain(|d| d.name != "spare");
    let mut d2 = DeviceConfig::new("fresh", Handler::VdiskNullio);
    d2.size = Some(1 << 20);
    d2.mem = true;
    new.devices.push(d2);
    let t = &mut new.targets.iscsi[0];
    t.luns.push(LunConfig {
        lun: 2,
        device: "fresh".into(),
        read_only: false,
    });
    t.ini_groups.retain(|g| g.name != "other");
    t.ini_groups[0].initiators = vec!["iqn.1994-05.com.redhat:b".into()];
    t.ini_groups.push(GroupConfig {
        name: "newg".into(),
        initiators: vec!["iqn.1994-05.com.redhat:a".into()],
        luns: vec![LunConfig {
            lun: 3,
            device: "fresh".into(),
            read_only: false,
        }],
    });
    let mut t2 = IscsiTargetConfig::new("iqn.2026-11.org.x:two");
    t2.portals = vec!["[::1]:3260".into()];
    t2.luns = vec![LunConfig {
        lun: 0,
        device: "null0".into(),
        read_only: false,
    }];
    new.targets.iscsi.push(t2);
    new.iscsi.initial_r2t = true;
    new.validate().unwrap();
    new
}

#[test]
fn apply_is_ordered_and_idempotent() {
    let (mut t, rt) = tree();
    let new = target_new();
    let plan = t.diff(&new).unwrap();
    assert!(!plan.is_empty());
    assert!(rt.calls().is_empty(), "diff must not touch the runtime");
    t.apply(&new).unwrap();
    assert_eq!(t.config(), &new);
    let calls = rt.calls();
    let pos = |p: &str| {
        calls
            .iter()
            .position(|c| c.starts_with(p))
            .unwrap_or_else(|| panic!("no {p} in {calls:#?}"))
    };
    // Unmap before deleting, delete before re-adding, enable last.
    assert!(pos(&format!("set_lun_map {T} hosts")) < pos("del_device null0"));
    assert!(pos("del_device null0") < pos("add_device null0"));
    assert!(pos("del_group") < pos("add_device"));
    assert!(pos("add_device fresh") < pos("add_target iqn.2026-11.org.x:two"));
    assert!(pos("add_group") < pos("set_device_attr disk0 Rotational(true)"));
    assert!(
        pos(&format!(
            "set_group_initiators {T} hosts iqn.1994-05.com.redhat:b"
        )) < pos(&format!("set_group_initiators {T} newg"))
    );
    assert_eq!(
        calls.last().unwrap(),
        "set_target_enabled iqn.2026-11.org.x:two true"
    );
    // Twice: nothing.
    rt.clear_calls();
    assert!(t.diff(&new).unwrap().is_empty());
    assert!(t.apply(&new).unwrap().is_empty());
    assert!(rt.calls().is_empty());
    // And back to where it started.
    t.apply(&sample()).unwrap();
    assert_eq!(t.config(), &sample());
    assert!(t.diff(&sample()).unwrap().is_empty());
}

#[test]
fn apply_of_reordered_file_is_empty() {
    let (t, _rt) = tree();
    let mut same = sample();
    same.devices.reverse();
    same.targets.iscsi[0].luns.reverse();
    assert!(t.diff(&same).unwrap().is_empty());
}

#[test]
fn apply_refuses_invalid_and_reports_partial() {
    let (mut t, rt) = tree();
    let mut bad = sample();
    bad.targets.iscsi[0].luns[0].device = "nosuch".into();
    let e = t.apply(&bad).unwrap_err();
    assert!(e.to_string().contains("no device"), "{e}");
    assert!(rt.calls().is_empty());
    rt.fail_on(Some("add_target"));
    let e = t.apply(&target_new()).unwrap_err();
    match &e {
        MgmtError::Apply { done, total, .. } => assert!(done < total),
        other => panic!("{other}"),
    }
    assert!(e.to_string().contains("add_target"), "{e}");
    t.config().validate().unwrap();
    // The rest goes through once the runtime recovers.
    rt.fail_on(None);
    t.apply(&target_new()).unwrap();
    assert_eq!(t.config(), &target_new());
}

#[test]
fn autosave() {
    let (mut t, _rt) = tree();
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("auto.json");
    t.save_path = Some(p.clone());
    t.set("/devices/disk0/nv_cache", "1").unwrap();
    assert!(!p.exists(), "no autosave unless asked");
    t.set_autosave(true);
    t.set("/devices/disk0/rotational", "1").unwrap();
    assert_eq!(&Config::load(&p).unwrap(), t.config());
    let mut next = t.config().clone();
    next.devices[0].rotational = false;
    t.apply(&next).unwrap();
    assert_eq!(Config::load(&p).unwrap(), next);
    // A refused change saves nothing new; a failed save is reported
    // with the change, which stays.
    t.save_path = Some(dir.path().join("missing/x.json"));
    let msg = t.set("/devices/disk0/rotational", "1").unwrap();
    assert!(msg.contains("not saved"), "{msg}");
    assert!(t.config().devices[0].rotational);
}

#[test]
fn data_memory_is_an_attribute_of_the_root() {
    let (mut t, rt) = tree();
    let default_mb = (t.config().reactor.data_memory_bytes() >> 20).to_string();
    // The default: its value, no [key].
    let v = t.get("/data_memory_mb").unwrap();
    assert_eq!(v.to_text(), default_mb);
    assert!(v.writable);
    assert!(
        v.description.contains("64..1073741824"),
        "{}",
        v.description
    );
    let e = t.ls("/").unwrap();
    let w: Vec<&str> = e
        .iter()
        .filter(|e| e.writable)
        .map(|e| e.name.as_str())
        .collect();
    assert_eq!(w, ["data_memory_mb"]);
    // A number: the model, the running limit (in bytes) and [key].
    let msg = t.set("/data_memory_mb", " 512 ").unwrap();
    assert_eq!(msg, "set /data_memory_mb 512");
    assert_eq!(t.config().reactor.data_memory_mb, Some(512));
    assert_eq!(rt.calls(), [format!("set_data_memory {}", 512u64 << 20)]);
    assert_eq!(t.get("/data_memory_mb").unwrap().to_text(), "512\n[key]");
    // The use, as the runtime reports it.
    assert_eq!(
        t.get("/data_memory").unwrap().value,
        format!(
            "limit {}\nused 0\npeak 0\nholders 0\nwaiting 0\nwaits 0",
            512u64 << 20
        )
    );
    // Saved, and a configuration file carries it.
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("f.json");
    t.save(Some(&p)).unwrap();
    let saved = Config::load(&p).unwrap();
    assert_eq!(saved.reactor.data_memory_mb, Some(512));
    // Empty and "default" go back to the default limit.
    for v in ["", "default"] {
        rt.clear_calls();
        t.set("/data_memory_mb", "64").unwrap();
        rt.clear_calls();
        t.set("/data_memory_mb", v).unwrap();
        assert_eq!(t.config().reactor.data_memory_mb, None);
        assert_eq!(
            rt.calls(),
            [format!(
                "set_data_memory {}",
                t.config().reactor.data_memory_bytes()
            )]
        );
        assert_eq!(t.get("/data_memory_mb").unwrap().to_text(), default_mb);
    }
    // diff and apply of a file with another value: one change, carried
    // out on the runtime; the same file again changes nothing.
    let mut other = t.config().clone();
    other.reactor.data_memory_mb = Some(2048);
    other.reactor.poll_us = 5;
    let plan = t.diff(&other).unwrap();
    assert_eq!(
        plan.iter().map(|c| c.to_string()).collect::<Vec<_>>(),
        [
            "set /data_memory_mb 2048".to_string(),
            format!(
                "reactor (at next start): {}",
                serde_json::to_string(&other.reactor).unwrap()
            )
        ]
    );
    rt.clear_calls();
    t.apply(&other).unwrap();
    assert_eq!(t.config(), &other);
    assert_eq!(rt.calls(), [format!("set_data_memory {}", 2048u64 << 20)]);
    assert!(t.diff(&other).unwrap().is_empty());
    // Back to a file without it: the default.
    rt.clear_calls();
    t.apply(&saved).unwrap();
    assert_eq!(rt.calls(), [format!("set_data_memory {}", 512u64 << 20)]);
    other.reactor.data_memory_mb = None;
    t.apply(&other).unwrap();
    assert_eq!(t.config().reactor.data_memory_mb, None);
    // A refusal of the running system leaves the model.
    rt.fail_on(Some("set_data_memory"));
    assert!(t.set("/data_memory_mb", "128").is_err());
    assert_eq!(t.config().reactor.data_memory_mb, None);
}

#[test]
fn save_writes_the_model() {
    let (mut t, _rt) = tree();
    t.set("/devices/disk0/nv_cache", "1").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("f.json");
    t.save(Some(&p)).unwrap();
    assert_eq!(&Config::load(&p).unwrap(), t.config());
    assert!(t.save(None).is_err());
}

#[test]
fn sizes_and_bools() {
    assert_eq!(parse_size("4096"), Ok(4096));
    assert_eq!(parse_size("4k"), Ok(4096));
    assert_eq!(parse_size("1G"), Ok(1 << 30));
    assert!(parse_size("1P").is_err());
    assert!(parse_size("").is_err());
    assert!(parse_size("99999999999T").is_err());
    assert_eq!(parse_bool("Yes"), Ok(true));
    assert_eq!(parse_bool("0"), Ok(false));
    assert!(parse_bool("2").is_err());
}

#[test]
fn srp_ports_are_managed_like_iscsi_targets() {
    let mut cfg = sample();
    let mut p = crate::config::SrpTargetConfig::soft("srp0", "/run/ferrite/srp0.sock");
    p.luns.push(LunConfig {
        lun: 3,
        device: "spare".into(),
        read_only: true,
    });
    cfg.targets.srp.push(p);
    let rt = Arc::new(FakeRuntime::new());
    let mut t = Tree::new(cfg, rt.clone(), None);
    let names = |v: Vec<Entry>| v.into_iter().map(|e| e.name).collect::<Vec<_>>();
    assert_eq!(names(t.ls("/targets").unwrap()), ["iscsi", "srp"]);
    assert_eq!(names(t.ls("/targets/srp").unwrap()), ["mgmt", "srp0"]);
    let entries = t.ls("/targets/srp/srp0").unwrap();
    assert_eq!(entries.len(), SRP_ATTRS.len() + 3);
    let writable: Vec<String> = entries
        .iter()
        .filter(|e| e.writable)
        .map(|e| e.name.clone())
        .collect();
    assert_eq!(writable, ["enabled"]);
    let get = |t: &Tree, a: &str| t.get(&format!("/targets/srp/srp0/{a}")).unwrap().value;
    assert_eq!(get(&t, "enabled"), "1");
    assert_eq!(get(&t, "provider"), "soft");
    assert_eq!(get(&t, "listen"), "/run/ferrite/srp0.sock");
    assert_eq!(get(&t, "credits"), "128");
    assert_eq!(get(&t, "luns/3/device"), "spare");
    assert_eq!(get(&t, "luns/3/read_only"), "1");
    assert_eq!(get(&t, "port_id").len(), 34);
    assert!(t.exported("spare").contains(&"srp/srp0/luns/3".to_string()));
    assert!(t.get("/targets/srp/nosuch").is_err());
    assert!(t.get("/targets/srp/srp0/nosuch").is_err());
    // A device an SRP port maps cannot be deleted.
    assert!(
        t.run("/handlers/vdisk_nullio/mgmt", "del_device spare")
            .is_err()
    );

    // Maps, groups and initiators: the iSCSI commands, one runtime call
    // carrying the port's whole new configuration each.
    rt.clear_calls();
    t.run("/targets/srp/srp0/luns/mgmt", "add null0 0").unwrap();
    t.run("/targets/srp/srp0/ini_groups/mgmt", "create hosts")
        .unwrap();
    t.run(
        "/targets/srp/srp0/ini_groups/hosts/initiators/mgmt",
        "add 0xfe80*",
    )
    .unwrap();
    t.run(
        "/targets/srp/srp0/ini_groups/hosts/luns/mgmt",
        "add spare 0 read_only=1",
    )
    .unwrap();
    assert!(
        t.run("/targets/srp/srp0/luns/mgmt", "add nosuch 1")
            .is_err()
    );
    assert_eq!(
        rt.calls(),
        [
            "set_srp_target srp0 enabled=true luns=0=null0,3=spare groups=",
            "set_srp_target srp0 enabled=true luns=0=null0,3=spare groups=hosts[]()",
            "set_srp_target srp0 enabled=true luns=0=null0,3=spare groups=hosts[0xfe80*]()",
            "set_srp_target srp0 enabled=true luns=0=null0,3=spare groups=hosts[0xfe80*](0=spare)",
        ]
    );
    assert_eq!(
        names(
            t.ls("/targets/srp/srp0/ini_groups/hosts/initiators")
                .unwrap()
        ),
        ["mgmt", "0xfe80*"]
    );
    let p = &t.config().targets.srp[0];
    assert_eq!(p.ini_groups[0].luns[0].device, "spare");
    assert!(p.ini_groups[0].luns[0].read_only);
    // The iSCSI target's groups are untouched.
    assert_eq!(t.config().targets.iscsi[0].ini_groups.len(), 2);

    // enabled is writable; a refused change leaves the model alone.
    rt.clear_calls();
    t.set("/targets/srp/srp0/enabled", "0").unwrap();
    assert_eq!(get(&t, "enabled"), "0");
    rt.fail_on(Some("set_srp_target"));
    assert!(t.set("/targets/srp/srp0/enabled", "1").is_err());
    assert_eq!(get(&t, "enabled"), "0");
    rt.fail_on(None);

    // Ports come and go through /targets/srp/mgmt.
    rt.clear_calls();
    assert!(
        t.run("/targets/srp/mgmt", "add_target p1").is_err(),
        "listen is required"
    );
    assert!(
        t.run("/targets/srp/mgmt", "add_target p1 listen=rel.sock")
            .is_err(),
        "a relative path fails validation"
    );
    assert!(
        t.run("/targets/srp/mgmt", "add_target srp0 listen=/x.sock")
            .is_err()
    );
    t.run(
        "/targets/srp/mgmt",
        "add_target p1 listen=/run/p1.sock credits=64",
    )
    .unwrap();
    assert_eq!(get_p1(&t, "enabled"), "0", "created disabled");
    assert_eq!(get_p1(&t, "credits"), "64");
    t.run(
        "/targets/srp/mgmt",
        "add_target h1 provider=verbs listen=192.0.2.1:5000 device=mlx5_0 hca_port=2",
    )
    .unwrap();
    assert_eq!(
        t.get("/targets/srp/h1/provider").unwrap().value,
        "verbs mlx5_0 port 2"
    );
    t.run("/targets/srp/mgmt", "del_target h1").unwrap();
    assert!(t.run("/targets/srp/mgmt", "del_target h1").is_err());
    assert_eq!(
        rt.calls(),
        [
            "set_srp_target p1 enabled=false luns= groups=",
            "set_srp_target h1 enabled=false luns= groups=",
            "set_srp_target h1 -",
        ]
    );
    assert!(
        t.get("/targets/srp/mgmt")
            .unwrap()
            .value
            .contains("add_target")
    );

    // SRP sessions are listed under their port, not under an iSCSI
    // target of the same name.
    rt.set_sessions(vec![SessionInfo {
        fabric: Fabric::Srp,
        target: "srp0".into(),
        initiator: "0xfe800000000000000000000000000001".into(),
        connections: vec!["soft core 0 qpn 0x1".into(), "soft core 0 qpn 0x2".into()],
        lun_count: 2,
        active_commands: 5,
        ..SessionInfo::default()
    }]);
    let s = "/targets/srp/srp0/sessions/0xfe800000000000000000000000000001";
    assert_eq!(
        names(t.ls("/targets/srp/srp0/sessions").unwrap()),
        ["0xfe800000000000000000000000000001"]
    );
    assert_eq!(t.get(&format!("{s}/lun_count")).unwrap().value, "2");
    assert_eq!(t.get(&format!("{s}/active_commands")).unwrap().value, "5");
    assert_eq!(
        t.get(&format!("{s}/connections"))
            .unwrap()
            .value
            .lines()
            .count(),
        2
    );
    assert!(names(t.ls(&format!("/targets/iscsi/{T}/sessions")).unwrap()).is_empty());

    // Applying a configuration whose SRP port differs replaces the port
    // on the running system; the same section again changes nothing.
    let mut other = t.config().clone();
    other.targets.srp[0].credits = 64;
    let changes = t.apply(&other).unwrap();
    assert!(matches!(&changes[..], [Change::SetSrpTarget { .. }]));
    assert_eq!(t.config().targets.srp[0].credits, 64);
    let same = t.config().clone();
    assert!(t.apply(&same).unwrap().is_empty());
}

fn get_p1(t: &Tree, a: &str) -> String {
    t.get(&format!("/targets/srp/p1/{a}")).unwrap().value
}

#[test]
fn group_chap_users_and_digest_lists() {
    let mut cfg = sample();
    cfg.targets.iscsi[0].group_incoming_users.insert(
        "hosts".into(),
        vec![crate::config::ChapUser {
            user: "grp".into(),
            secret: "group-secret-99".into(),
        }],
    );
    cfg.validate().unwrap();
    let rt = Arc::new(FakeRuntime::new());
    let mut t = Tree::new(cfg, rt, None);
    let hosts = format!("/targets/iscsi/{T}/ini_groups/hosts");
    let v = t.get(&format!("{hosts}/incoming_users")).unwrap();
    assert_eq!((v.value.as_str(), v.key, v.writable), ("grp", true, false));
    assert!(
        t.ls(&hosts)
            .unwrap()
            .iter()
            .any(|e| e.name == "incoming_users")
    );
    let v = t
        .get(&format!(
            "/targets/iscsi/{T}/ini_groups/other/incoming_users"
        ))
        .unwrap();
    assert_eq!(v.value, "");
    assert!(
        t.set(&format!("{hosts}/incoming_users"), "x").is_err(),
        "read-only"
    );

    // Header and data digests: lists of their own, empty = `digests`.
    assert_eq!(t.get("/targets/iscsi/data_digests").unwrap().value, "");
    t.set("/targets/iscsi/header_digests", "crc32c").unwrap();
    t.set("/targets/iscsi/data_digests", "none,crc32c").unwrap();
    let p = &t.config().iscsi;
    use crate::config::Digest;
    assert_eq!(p.header_digest_list(), [Digest::Crc32c]);
    assert_eq!(p.data_digest_list(), [Digest::Off, Digest::Crc32c]);
    assert_eq!(
        t.get("/targets/iscsi/data_digests").unwrap().to_text(),
        "none crc32c\n[key]"
    );
    assert!(t.set("/targets/iscsi/data_digests", "none none").is_err());
    t.set("/targets/iscsi/header_digests", "").unwrap();
    assert_eq!(
        t.config().iscsi.header_digest_list(),
        t.config().iscsi.digests.as_slice()
    );
}

/// Every saved device attribute survives `add_device` with the parameters
/// `diff` prints for the device, and reads back as it was set.
#[test]
fn device_attribute_table_round_trips() {
    let mut file = DeviceConfig::new("f1", Handler::VdiskFileio);
    file.filename = Some(PathBuf::from("/srv/f1.img"));
    file.size = Some(8 << 20);
    file.blocksize = 4096;
    (file.read_only, file.write_through, file.thin_provisioned) = (true, true, true);
    (file.rotational, file.nv_cache, file.removable) = (true, true, true);
    file.serial = Some("S1".into());
    file.t10_vendor = Some("VEND".into());
    file.t10_product = Some("PROD".into());
    file.t10_revision = Some("0001".into());
    file.naa = Some("0x5000000000000001".into());
    file.eui64 = Some("0x0000000000000002".into());
    let mut null = DeviceConfig::new("n1", Handler::VdiskNullio);
    null.size = Some(1 << 20);
    null.mem = true;
    for d in [file, null] {
        let (mut tree, _) = tree();
        let params = crate::change::device_params(&d);
        let saved = DEVICE_ATTRS
            .iter()
            .filter(|a| (a.applies)(d.handler) && a.parse.is_some())
            .filter(|a| (a.saved)(&d).is_some())
            .count();
        assert_eq!(params.split("; ").count(), saved, "{params}");
        tree.run(
            &format!("/handlers/{}/mgmt", d.handler),
            &format!("add_device {} {params}", d.name),
        )
        .unwrap();
        assert_eq!(tree.config().device(&d.name), Some(&d), "{params}");
        for a in DEVICE_ATTRS.iter().filter(|a| (a.applies)(d.handler)) {
            let path = format!("/devices/{}/{}", d.name, a.name);
            match (tree.get(&path), (a.saved)(&d)) {
                (Ok(v), Some(s)) => {
                    assert!(v.key, "{path}");
                    if let (Read::Value(_), Some(_)) = (&a.read, a.parse) {
                        let mut back = DeviceConfig::new(&d.name, d.handler);
                        (a.parse.unwrap())(&mut back, &s).unwrap();
                        assert_eq!((a.saved)(&back), Some(s), "{path}");
                    }
                }
                (Ok(v), None) => assert!(!v.key, "{path}"),
                (Err(e), _) => assert!(matches!(a.read, Read::WriteOnly(_)), "{path}: {e}"),
            }
        }
    }
}

/// The sample with a second target, a device group `dg1` holding null0
/// and two target groups, one per target.
fn alua_tree() -> (Tree, Arc<FakeRuntime>) {
    let rt = Arc::new(FakeRuntime::new());
    let mut t = Tree::new(sample(), rt.clone(), None);
    t.run(
        "/targets/iscsi/mgmt",
        "add_target iqn.2026-11.org.ferrite:b tpgt=2",
    )
    .unwrap();
    let dgs = "/device_groups/mgmt";
    t.run(dgs, "create dg1").unwrap();
    t.run("/device_groups/dg1/devices/mgmt", "add null0")
        .unwrap();
    t.run("/device_groups/dg1/target_groups/mgmt", "create tg_a")
        .unwrap();
    t.run("/device_groups/dg1/target_groups/mgmt", "create tg_b")
        .unwrap();
    t.run(
        "/device_groups/dg1/target_groups/tg_a/mgmt",
        &format!("add {T}"),
    )
    .unwrap();
    t.run(
        "/device_groups/dg1/target_groups/tg_b/mgmt",
        "add iqn.2026-11.org.ferrite:b",
    )
    .unwrap();
    (t, rt)
}

#[test]
fn device_groups_are_built_through_the_tree() {
    let (t, rt) = alua_tree();
    let dg = &t.config().device_groups[0];
    assert_eq!(dg.name, "dg1");
    assert_eq!(dg.devices, ["null0"]);
    assert_eq!(dg.target_groups[0].group_id, 1);
    assert_eq!(dg.target_groups[1].group_id, 2);
    assert_eq!(dg.target_groups[1].targets, ["iqn.2026-11.org.ferrite:b"]);
    let calls = rt.calls();
    assert_eq!(
        calls.last().map(String::as_str),
        Some(
            "set_device_groups dg1(null0;tg_a=1[iqn.2026-11.org.ferrite:default];tg_b=2[iqn.2026-11.org.ferrite:b])"
        )
    );
    let names = |p: &str| {
        t.ls(p)
            .unwrap()
            .into_iter()
            .map(|e| e.name)
            .collect::<Vec<_>>()
    };
    assert_eq!(names("/device_groups"), ["mgmt", "dg1"]);
    assert_eq!(names("/device_groups/dg1"), ["devices", "target_groups"]);
    assert_eq!(names("/device_groups/dg1/devices"), ["mgmt", "null0"]);
    assert_eq!(
        names("/device_groups/dg1/target_groups/tg_a"),
        ["mgmt", "group_id", "state", "preferred", T]
    );
    assert_eq!(
        t.get("/device_groups/dg1/target_groups/tg_a/state")
            .unwrap()
            .value,
        "active"
    );
    assert!(
        t.get("/device_groups/mgmt")
            .unwrap()
            .value
            .contains("create NAME")
    );
    assert!(
        t.get("/device_groups/dg1/target_groups/tg_a/mgmt")
            .unwrap()
            .value
            .contains("add TARGET")
    );
}

#[test]
fn bad_device_group_commands_change_nothing() {
    let (mut t, rt) = alua_tree();
    let before = t.config().clone();
    rt.clear_calls();
    let tg = "/device_groups/dg1/target_groups";
    let cases: Vec<(&str, &str, &str)> = vec![
        ("/device_groups/mgmt", "", "empty command"),
        ("/device_groups/mgmt", "add dg2", "unknown command \"add\""),
        ("/device_groups/mgmt", "create", "missing argument"),
        ("/device_groups/mgmt", "create a b", "unexpected argument"),
        ("/device_groups/mgmt", "create bad/name", "valid characters"),
        ("/device_groups/mgmt", "create dg1", "already exists"),
        (
            "/device_groups/mgmt",
            "del nope",
            "no device group \"nope\"",
        ),
        (
            "/device_groups/dg1/devices/mgmt",
            "add nope",
            "no device \"nope\"",
        ),
        (
            "/device_groups/dg1/devices/mgmt",
            "add null0",
            "already in device group",
        ),
        (
            "/device_groups/dg1/devices/mgmt",
            "del spare",
            "not in device group",
        ),
        (
            "/device_groups/dg1/devices/mgmt",
            "create x",
            "unknown command",
        ),
        (
            "/device_groups/dg1/target_groups/mgmt",
            "create tg_a",
            "already exists",
        ),
        (
            "/device_groups/dg1/target_groups/mgmt",
            "del tg_z",
            "no target group",
        ),
        (
            "/device_groups/dg1/target_groups/tg_a/mgmt",
            "add iqn.2026-11.org.ferrite:nope",
            "no iSCSI target or SRP port",
        ),
        (
            "/device_groups/dg1/target_groups/tg_a/mgmt",
            "add iqn.2026-11.org.ferrite:b",
            "already in target group \"tg_b\"",
        ),
        (
            "/device_groups/dg1/target_groups/tg_a/mgmt",
            "del iqn.2026-11.org.ferrite:b",
            "not in target group",
        ),
    ];
    for (path, cmd, want) in cases {
        let e = t.run(path, cmd).unwrap_err().to_string();
        assert!(e.contains(want), "{path} {cmd:?}: {e}");
    }
    for (attr, v, want) in [
        ("state", "sleepy", "not an access state"),
        ("preferred", "maybe", "not a boolean"),
        ("group_id", "0", "1 to 65535"),
        ("group_id", "2", "already the id"),
    ] {
        let e = t
            .set(&format!("{tg}/tg_a/{attr}"), v)
            .unwrap_err()
            .to_string();
        assert!(e.contains(want), "{attr}={v}: {e}");
    }
    assert!(t.set("/device_groups/mgmt", "x").is_err());
    // Objects in a group cannot go from under it.
    let e = t
        .run(
            "/targets/iscsi/mgmt",
            "del_target iqn.2026-11.org.ferrite:b",
        )
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("device_groups[0].target_groups[1].targets[0]"),
        "{e}"
    );
    assert_eq!(t.config(), &before);
    assert!(rt.calls().is_empty(), "{:?}", rt.calls());
}

#[test]
fn state_writes_are_live_and_saved_as_they_are() {
    let (mut t, rt) = alua_tree();
    let tg = "/device_groups/dg1/target_groups/tg_b";
    t.set(&format!("{tg}/state"), "standby").unwrap();
    t.set(&format!("{tg}/preferred"), "1").unwrap();
    assert!(
        rt.calls()
            .contains(&"set_alua_state dg1 tg_b standby 0".to_string())
    );
    assert!(
        rt.calls()
            .contains(&"set_alua_state dg1 tg_b standby 1".to_string())
    );
    assert_eq!(t.get(&format!("{tg}/state")).unwrap().value, "standby");
    assert_eq!(t.get(&format!("{tg}/preferred")).unwrap().value, "1");
    assert_eq!(
        t.set(&format!("{tg}/state"), "standby").unwrap(),
        format!("{tg}/state: unchanged")
    );
    // An initiator's SET TARGET PORT GROUPS: reads and saves show it.
    rt.set_live_alua(
        "dg1",
        "tg_a",
        ferrite_core::alua::AccessState::Unavailable,
        false,
    );
    assert_eq!(
        t.get("/device_groups/dg1/target_groups/tg_a/state")
            .unwrap()
            .value,
        "unavailable"
    );
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("saved.json");
    t.save(Some(&p)).unwrap();
    let saved = Config::load(&p).unwrap();
    let tgs = &saved.device_groups[0].target_groups;
    assert_eq!(
        (tgs[0].state.as_str(), tgs[0].preferred),
        ("unavailable", false)
    );
    assert_eq!((tgs[1].state.as_str(), tgs[1].preferred), ("standby", true));
    // Applying the saved file changes nothing; applying one with another
    // state sets just that state.
    assert!(t.diff(&saved).unwrap().is_empty());
    let mut other = saved.clone();
    other.device_groups[0].target_groups[0].state = "active".into();
    let plan = t.diff(&other).unwrap();
    assert_eq!(plan.len(), 1, "{plan:?}");
    assert!(
        plan[0].to_string().contains("tg_a/state active"),
        "{}",
        plan[0]
    );
    // group_id moves through the whole group.
    rt.clear_calls();
    t.set(&format!("{tg}/group_id"), "9").unwrap();
    assert_eq!(t.config().device_groups[0].target_groups[1].group_id, 9);
    assert!(rt.calls()[0].contains("tg_b=9"), "{:?}", rt.calls());
}

#[test]
fn apply_builds_and_tears_down_device_groups_around_their_objects() {
    let (t0, _) = alua_tree();
    let with_groups = t0.config().clone();
    let (mut t, rt) = tree();
    // From nothing: targets and devices first, then the groups.
    let changes = t.apply(&with_groups).unwrap();
    let texts: Vec<String> = changes.iter().map(|c| c.to_string()).collect();
    let add_target = texts.iter().position(|c| c.contains("add_target")).unwrap();
    let groups = texts
        .iter()
        .position(|c| c.starts_with("device groups"))
        .unwrap();
    assert!(add_target < groups, "{texts:?}");
    assert_eq!(t.config().device_groups, with_groups.device_groups);
    assert!(t.apply(&with_groups).unwrap().is_empty());
    // The second target goes: the group lets go of it first.
    rt.clear_calls();
    let mut fewer = with_groups.clone();
    fewer
        .targets
        .iscsi
        .retain(|x| x.name != "iqn.2026-11.org.ferrite:b");
    fewer.device_groups[0].target_groups[1].targets.clear();
    t.apply(&fewer).unwrap();
    let calls = rt.calls();
    let let_go = calls
        .iter()
        .position(|c| c.starts_with("set_device_groups"))
        .unwrap();
    let del = calls
        .iter()
        .position(|c| c.starts_with("del_target"))
        .unwrap();
    assert!(let_go < del, "{calls:?}");
    // No groups at all.
    let mut none = fewer.clone();
    none.device_groups.clear();
    t.apply(&none).unwrap();
    assert!(t.config().device_groups.is_empty());
    assert_eq!(
        rt.calls().last().map(String::as_str),
        Some("set_device_groups ")
    );
}
