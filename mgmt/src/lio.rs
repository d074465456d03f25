//! Import of LIO's targetcli `saveconfig.json` (rtslib-fb's format, as
//! `/etc/rtslib-fb-target/saveconfig.json` or `/etc/target/saveconfig.json`
//! holds it) and of LIO's APTPL reservation files into a [`Config`].
//!
//! Understood: `fileio` and `block` storage objects with their attributes
//! and the identity LIO derives from their unit serial (`wwn`), iSCSI
//! targets with their first TPG (tag, enable, portals, LUNs, node ACLs with
//! mapped LUNs and CHAP, demo mode, parameters), discovery authentication,
//! and `pr/aptpl_<serial>` files. Everything else is named in a warning
//! with its JSON path; a file that is not rtslib's format is an error naming
//! where it stops being one.
//!
//! Owns only the translation; the result is validated like any
//! configuration.

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::{Map, Value};

use crate::config::{
    ChapUser, Config, DeviceConfig, GroupConfig, Handler, IscsiTargetConfig, LunConfig, hex_id,
};
use crate::scst::{Import, ImportError};

/// The IEEE company id LIO puts in the NAA designators it derives
/// (target_core_device.c: OpenFabrics, 00-14-05).
pub const LIO_COMPANY_ID: u32 = 0x00_14_05;

/// LIO's T10 vendor identification.
pub const LIO_VENDOR: &str = "LIO-ORG";

/// LIO's product revision for fileio and block backstores.
pub const LIO_REVISION: &str = "4.0";

/// LIO's NAA 6 designator of a device with unit serial `serial`
/// (target_core_spc.c `spc_gen_naa_6h_vendor_specific`): NAA 6, the
/// company id, then the serial's hex digits (others skipped), 25 at most.
pub fn lio_naa(serial: &str, company_id: u32) -> [u8; 16] {
    let mut b = [0u8; 16];
    let c = company_id & 0xff_ffff;
    b[0] = 0x60 | (c >> 20) as u8;
    b[1] = (c >> 12) as u8;
    b[2] = (c >> 4) as u8;
    b[3] = ((c & 0xf) << 4) as u8;
    let digits = serial.chars().filter_map(|ch| ch.to_digit(16));
    for (nibble, v) in (7..32).zip(digits) {
        let v = v as u8;
        b[nibble / 2] |= if nibble % 2 == 0 { v << 4 } else { v };
    }
    b
}

fn err(at: &str, msg: impl Into<String>) -> ImportError {
    ImportError::Json {
        at: at.to_string(),
        msg: msg.into(),
    }
}

fn obj<'a>(v: &'a Value, at: &str) -> Result<&'a Map<String, Value>, ImportError> {
    v.as_object()
        .ok_or_else(|| err(at, format!("expected an object, found {}", kind(v))))
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

fn list<'a>(o: &'a Map<String, Value>, key: &str, at: &str) -> Result<&'a [Value], ImportError> {
    match o.get(key) {
        None => Ok(&[]),
        Some(Value::Array(a)) => Ok(a),
        Some(v) => Err(err(
            &format!("{at}.{key}"),
            format!("expected an array, found {}", kind(v)),
        )),
    }
}

fn string<'a>(o: &'a Map<String, Value>, key: &str, at: &str) -> Result<&'a str, ImportError> {
    match o.get(key) {
        Some(Value::String(s)) => Ok(s),
        Some(v) => Err(err(
            &format!("{at}.{key}"),
            format!("expected a string, found {}", kind(v)),
        )),
        None => Err(err(&format!("{at}.{key}"), "missing")),
    }
}

fn opt_string<'a>(
    o: &'a Map<String, Value>,
    key: &str,
    at: &str,
) -> Result<Option<&'a str>, ImportError> {
    match o.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(_) => string(o, key, at).map(|s| Some(s).filter(|s| !s.is_empty())),
    }
}

/// An integer, or rtslib's booleans (`true`/`false`) as 1/0.
fn int(o: &Map<String, Value>, key: &str, at: &str) -> Result<Option<u64>, ImportError> {
    match o.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(u64::from(*b))),
        Some(Value::Number(n)) => n.as_u64().map(Some).ok_or_else(|| {
            err(
                &format!("{at}.{key}"),
                format!("{n} is not a non-negative integer"),
            )
        }),
        Some(v) => Err(err(
            &format!("{at}.{key}"),
            format!("expected a number, found {}", kind(v)),
        )),
    }
}

fn flag(o: &Map<String, Value>, key: &str, at: &str) -> Result<Option<bool>, ImportError> {
    Ok(int(o, key, at)?.map(|v| v != 0))
}

/// A backstore as LIO exports it: its ferrite device and what VPD 83h
/// needs of its LUNs.
struct Backstore {
    /// `/backstores/<plugin>/<name>`.
    path: String,
    device: DeviceConfig,
    /// ALUA target port groups by name (`alua_tpgs`): their ids.
    port_groups: BTreeMap<String, u16>,
    /// LUNs that export it so far (LIO gives each export the next RTPI).
    exports: u16,
}

const TOP_KEYS: [&str; 3] = ["storage_objects", "targets", "fabric_modules"];

/// Converts `saveconfig.json` text.
pub fn import_lio(text: &str) -> Result<Import, ImportError> {
    let root: Value = serde_json::from_str(text).map_err(|e| {
        err(
            &format!("line {} column {}", e.line(), e.column()),
            format!("not JSON: {e}"),
        )
    })?;
    let top = obj(&root, "$")?;
    if let Some(k) = top.keys().find(|k| !TOP_KEYS.contains(&k.as_str())) {
        return Err(err(
            &format!("$.{k}"),
            "unknown key: this is not the saveconfig.json of rtslib-fb 2.1 \
             (storage_objects, targets, fabric_modules)",
        ));
    }
    if !top.contains_key("storage_objects") && !top.contains_key("targets") {
        return Err(err(
            "$",
            "neither storage_objects nor targets: not a targetcli saveconfig.json",
        ));
    }
    let mut warn = Vec::new();
    let mut cfg = Config::default();
    let mut stores: Vec<Backstore> = Vec::new();
    for (i, so) in list(top, "storage_objects", "$")?.iter().enumerate() {
        let at = format!("$.storage_objects[{i}]");
        if let Some(b) = import_backstore(so, &at, &mut warn)? {
            stores.push(b);
        }
    }
    for (i, t) in list(top, "targets", "$")?.iter().enumerate() {
        let at = format!("$.targets[{i}]");
        if let Some(t) = import_target(t, &at, &mut stores, &mut cfg, &mut warn)? {
            cfg.targets.iscsi.push(t);
        }
    }
    for (i, f) in list(top, "fabric_modules", "$")?.iter().enumerate() {
        let at = format!("$.fabric_modules[{i}]");
        import_fabric(f, &at, &mut cfg, &mut warn)?;
    }
    cfg.devices = stores.into_iter().map(|b| b.device).collect();
    cfg.validate()?;
    Ok(Import {
        config: cfg,
        warnings: warn,
    })
}

/// LIO storage-object attributes this import carries or knows to be
/// LIO's own emulation choices, which ferrite makes by itself.
const SO_ATTRS_KNOWN: [&str; 31] = [
    "block_size",
    "emulate_tpu",
    "emulate_tpws",
    "emulate_write_cache",
    "is_nonrot",
    "emulate_model_alias",
    "alua_support",
    "emulate_3pc",
    "emulate_caw",
    "emulate_dpo",
    "emulate_fua_read",
    "emulate_fua_write",
    "emulate_pr",
    "emulate_rest_reord",
    "emulate_tas",
    "emulate_ua_intlck_ctrl",
    "enforce_pr_isids",
    "force_pr_aptpl",
    "max_unmap_block_desc_count",
    "max_unmap_lba_count",
    "max_write_same_len",
    "optimal_sectors",
    "pgr_support",
    "pi_prot_format",
    "pi_prot_type",
    "pi_prot_verify",
    "queue_depth",
    "unmap_granularity",
    "unmap_granularity_alignment",
    "unmap_zeroes_data",
    "emulate_rsoc",
];

fn import_backstore(
    so: &Value,
    at: &str,
    warn: &mut Vec<String>,
) -> Result<Option<Backstore>, ImportError> {
    let o = obj(so, at)?;
    let name = string(o, "name", at)?;
    let plugin = string(o, "plugin", at)?;
    let (handler, model) = match plugin {
        "fileio" => (Handler::VdiskFileio, "FILEIO"),
        "block" => (Handler::VdiskBlockio, "IBLOCK"),
        other => {
            warn.push(format!(
                "{at}: storage object {name}: plugin {other} is not supported (fileio and \
                 block are); it and its LUNs are skipped"
            ));
            return Ok(None);
        }
    };
    let mut d = DeviceConfig::new(name, handler);
    d.filename = Some(string(o, "dev", at)?.into());
    if handler == Handler::VdiskFileio {
        d.size = int(o, "size", at)?;
    }
    let attrs = match o.get("attributes") {
        Some(a) => obj(a, &format!("{at}.attributes"))?.clone(),
        None => Map::new(),
    };
    let aat = format!("{at}.attributes");
    if let Some(bs) = int(&attrs, "block_size", &aat)? {
        d.blocksize = u32::try_from(bs)
            .ok()
            .filter(|b| *b == 512 || *b == 4096)
            .ok_or_else(|| {
                err(
                    &format!("{aat}.block_size"),
                    format!("{bs}: ferrite serves 512 or 4096"),
                )
            })?;
    }
    d.thin_provisioned = flag(&attrs, "emulate_tpu", &aat)?.unwrap_or(false)
        || flag(&attrs, "emulate_tpws", &aat)?.unwrap_or(false);
    let write_back = match flag(o, "write_back", at)? {
        Some(w) => w,
        None => flag(&attrs, "emulate_write_cache", &aat)?.unwrap_or(false),
    };
    d.write_through = !write_back;
    d.rotational = !flag(&attrs, "is_nonrot", &aat)?.unwrap_or(false);
    if flag(o, "readonly", at)? == Some(true) {
        d.read_only = true;
    }
    for (k, _) in attrs
        .iter()
        .filter(|(k, _)| !SO_ATTRS_KNOWN.contains(&k.as_str()))
    {
        warn.push(format!("{aat}.{k}: not carried"));
    }
    if flag(&attrs, "emulate_pr", &aat)? == Some(false) {
        warn.push(format!(
            "{aat}.emulate_pr: 0 in LIO; ferrite always serves persistent reservations"
        ));
    }
    // The identity LIO reports (target_core_spc.c): vendor LIO-ORG, the
    // backstore's model (or its name with emulate_model_alias), revision
    // 4.0, the unit serial, the NAA 6 derived from it, and VPD 83h's
    // designators in LIO's order.
    let model: String = if flag(&attrs, "emulate_model_alias", &aat)? == Some(true) {
        name.chars().take(16).collect()
    } else {
        model.to_string()
    };
    d.t10_vendor = Some(LIO_VENDOR.into());
    d.t10_product = Some(model.clone());
    d.t10_revision = Some(LIO_REVISION.into());
    match opt_string(o, "wwn", at)? {
        Some(serial) => {
            d.serial = Some(serial.to_string());
            d.t10_id = Some(format!("{model}:{serial}"));
            d.naa = Some(hex_id(&lio_naa(serial, LIO_COMPANY_ID)));
        }
        None => warn.push(format!(
            "{at}.wwn: storage object {name} has no unit serial; ferrite derives its ids"
        )),
    }
    let mut port_groups = BTreeMap::new();
    for (j, g) in list(o, "alua_tpgs", at)?.iter().enumerate() {
        let gat = format!("{at}.alua_tpgs[{j}]");
        let g = obj(g, &gat)?;
        let gname = string(g, "name", &gat)?;
        let id = int(g, "tg_pt_gp_id", &gat)?.unwrap_or(0);
        let id = u16::try_from(id).map_err(|_| {
            err(
                &format!("{gat}.tg_pt_gp_id"),
                format!("{id} is not 0..65535"),
            )
        })?;
        if gname != "default_tg_pt_gp" {
            warn.push(format!(
                "{gat}: ALUA group {gname}: its id is reported, its access states are not \
                 carried (ferrite reports no ALUA)"
            ));
        }
        port_groups.insert(gname.to_string(), id);
    }
    Ok(Some(Backstore {
        path: format!("/backstores/{plugin}/{name}"),
        device: d,
        port_groups,
        exports: 0,
    }))
}

/// The VPD 83h layout LIO reports for a LUN in port group `group`.
fn lio_layout(d: &DeviceConfig, group: u16) -> String {
    let naa = if d.naa.is_some() { "naa," } else { "" };
    format!("{naa}t10_nul,rel_port,port_group={group},lu_group=0,port_name,target_name")
}

/// LIO TPG parameters (RFC 7143 keys) with the defaults LIO offers; one
/// that differs and that ferrite does not carry is named.
const PARAM_DEFAULTS: [(&str, &str); 14] = [
    ("AuthMethod", "CHAP,None"),
    ("DataPDUInOrder", "Yes"),
    ("DataSequenceInOrder", "Yes"),
    ("DefaultTime2Retain", "20"),
    ("DefaultTime2Wait", "2"),
    ("ErrorRecoveryLevel", "0"),
    ("IFMarkInt", "Reject"),
    ("IFMarker", "No"),
    ("OFMarkInt", "Reject"),
    ("OFMarker", "No"),
    ("MaxConnections", "1"),
    ("MaxXmitDataSegmentLength", "262144"),
    ("TargetAlias", "LIO Target"),
    ("MaxOutstandingR2T", "1"),
];

fn import_target(
    t: &Value,
    at: &str,
    stores: &mut [Backstore],
    cfg: &mut Config,
    warn: &mut Vec<String>,
) -> Result<Option<IscsiTargetConfig>, ImportError> {
    let o = obj(t, at)?;
    let fabric = string(o, "fabric", at)?;
    let wwn = string(o, "wwn", at)?;
    if fabric != "iscsi" {
        warn.push(format!(
            "{at}: {fabric} target {wwn} is not supported (iscsi is); skipped"
        ));
        return Ok(None);
    }
    let tpgs = list(o, "tpgs", at)?;
    let Some(tpg) = tpgs.first() else {
        warn.push(format!("{at}: target {wwn} has no TPG; skipped"));
        return Ok(None);
    };
    for j in 1..tpgs.len() {
        warn.push(format!(
            "{at}.tpgs[{j}]: a ferrite iSCSI target has one portal group; only tpgs[0] is carried"
        ));
    }
    let at = format!("{at}.tpgs[0]");
    let g = obj(tpg, &at)?;
    let mut tc = IscsiTargetConfig::new(wwn);
    let tag = int(g, "tag", &at)?.unwrap_or(1);
    tc.tpgt = u16::try_from(tag)
        .map_err(|_| err(&format!("{at}.tag"), format!("{tag} is not 0..65535")))?;
    tc.enabled = flag(g, "enable", &at)?.unwrap_or(true);
    for (j, p) in list(g, "portals", &at)?.iter().enumerate() {
        let pat = format!("{at}.portals[{j}]");
        let p = obj(p, &pat)?;
        let ip = string(p, "ip_address", &pat)?;
        let port = int(p, "port", &pat)?.unwrap_or(3260);
        let host = if ip.contains(':') && !ip.starts_with('[') {
            format!("[{ip}]")
        } else {
            ip.to_string()
        };
        let addr = format!("{host}:{port}");
        if flag(p, "offload", &pat)? == Some(true) {
            warn.push(format!(
                "{pat}.offload: hardware offload not carried; a TCP portal is used"
            ));
        }
        let addr = if flag(p, "iser", &pat)? == Some(true) {
            format!("iser:{addr}")
        } else {
            addr
        };
        tc.portals.push(addr);
    }
    let attrs = match g.get("attributes") {
        Some(a) => obj(a, &format!("{at}.attributes"))?.clone(),
        None => Map::new(),
    };
    let aat = format!("{at}.attributes");
    let auth = flag(&attrs, "authentication", &aat)?.unwrap_or(false);
    let demo = flag(&attrs, "generate_node_acls", &aat)?.unwrap_or(false);
    let demo_ro = flag(&attrs, "demo_mode_write_protect", &aat)?.unwrap_or(true);
    // TPG LUNs: index -> (device, port group).
    let mut luns: BTreeMap<u64, (String, u16)> = BTreeMap::new();
    for (j, l) in list(g, "luns", &at)?.iter().enumerate() {
        let lat = format!("{at}.luns[{j}]");
        let l = obj(l, &lat)?;
        let index =
            int(l, "index", &lat)?.ok_or_else(|| err(&format!("{lat}.index"), "missing"))?;
        let so = string(l, "storage_object", &lat)?;
        let Some(b) = stores.iter_mut().find(|b| b.path == so) else {
            warn.push(format!(
                "{lat}: LUN {index} of unknown or skipped storage object {so} dropped"
            ));
            continue;
        };
        let group_name = opt_string(l, "alua_tg_pt_gp_name", &lat)?.unwrap_or("default_tg_pt_gp");
        let group = b.port_groups.get(group_name).copied().unwrap_or(0);
        b.exports += 1;
        if b.exports > 1 {
            warn.push(format!(
                "{lat}: {so} is exported more than once; LIO gives this export relative port \
                 {}, ferrite the target's",
                b.exports
            ));
        }
        let layout = lio_layout(&b.device, group);
        match &b.device.vpd83 {
            Some(l) if *l != layout => warn.push(format!(
                "{lat}: {so} is in another ALUA group here; VPD 83h reports the first one"
            )),
            _ => b.device.vpd83 = Some(layout),
        }
        luns.insert(index, (b.device.name.clone(), group));
    }
    let lun = |index: u64, read_only: bool, at: &str| -> Result<LunConfig, ImportError> {
        let n = u16::try_from(index)
            .ok()
            .filter(|n| *n < crate::config::MAX_LUNS)
            .ok_or_else(|| {
                err(
                    at,
                    format!(
                        "LUN {index} is beyond ferrite's {}",
                        crate::config::MAX_LUNS
                    ),
                )
            })?;
        Ok(LunConfig {
            lun: n,
            device: String::new(),
            read_only,
        })
    };
    if demo {
        for (index, (dev, _)) in &luns {
            let mut l = lun(*index, demo_ro, &format!("{at}.luns"))?;
            l.device = dev.clone();
            tc.luns.push(l);
        }
    }
    let mut mutual: Option<(ChapUser, String)> = None;
    for (j, a) in list(g, "node_acls", &at)?.iter().enumerate() {
        let nat = format!("{at}.node_acls[{j}]");
        let a = obj(a, &nat)?;
        let node = string(a, "node_wwn", &nat)?;
        let group = format!("acl{j}");
        let mut gc = GroupConfig {
            name: group.clone(),
            initiators: vec![node.to_string()],
            luns: Vec::new(),
        };
        for (k, m) in list(a, "mapped_luns", &nat)?.iter().enumerate() {
            let mat = format!("{nat}.mapped_luns[{k}]");
            let m = obj(m, &mat)?;
            let index =
                int(m, "index", &mat)?.ok_or_else(|| err(&format!("{mat}.index"), "missing"))?;
            let tpg_lun = int(m, "tpg_lun", &mat)?
                .ok_or_else(|| err(&format!("{mat}.tpg_lun"), "missing"))?;
            let Some((dev, _)) = luns.get(&tpg_lun) else {
                warn.push(format!(
                    "{mat}: TPG LUN {tpg_lun} is not carried; mapped LUN {index} dropped"
                ));
                continue;
            };
            let ro = flag(m, "write_protect", &mat)?.unwrap_or(false);
            let mut l = lun(index, ro, &mat)?;
            l.device = dev.clone();
            gc.luns.push(l);
        }
        let user = opt_string(a, "chap_userid", &nat)?;
        let secret = opt_string(a, "chap_password", &nat)?;
        match (user, secret, auth) {
            (Some(u), Some(s), true) => {
                tc.group_incoming_users.insert(
                    group.clone(),
                    vec![ChapUser {
                        user: u.into(),
                        secret: s.into(),
                    }],
                );
            }
            (Some(_), Some(_), false) => warn.push(format!(
                "{nat}: CHAP credentials not carried: the TPG's authentication is 0, so LIO \
                 does not require them"
            )),
            (None, None, _) => {}
            _ => {
                return Err(err(&nat, "chap_userid and chap_password come together"));
            }
        }
        let mu = opt_string(a, "chap_mutual_userid", &nat)?;
        let ms = opt_string(a, "chap_mutual_password", &nat)?;
        if let (Some(u), Some(s), true) = (mu, ms, auth) {
            let c = ChapUser {
                user: u.into(),
                secret: s.into(),
            };
            match &mutual {
                Some((prev, from)) if *prev != c => warn.push(format!(
                    "{nat}: mutual CHAP differs from {from}'s; ferrite answers every \
                     initiator of a target with one, {from}'s"
                )),
                Some(_) => {}
                None => mutual = Some((c, nat.clone())),
            }
        }
        for k in a.keys() {
            if !matches!(
                k.as_str(),
                "node_wwn"
                    | "mapped_luns"
                    | "attributes"
                    | "tag"
                    | "chap_userid"
                    | "chap_password"
                    | "chap_mutual_userid"
                    | "chap_mutual_password"
            ) {
                warn.push(format!("{nat}.{k}: not carried"));
            }
        }
        tc.ini_groups.push(gc);
    }
    tc.outgoing_user = mutual.map(|(c, _)| c);
    // TPG-wide CHAP (tpg/auth), used with demo mode.
    if auth
        && let (Some(u), Some(s)) = (
            opt_string(g, "chap_userid", &at)?,
            opt_string(g, "chap_password", &at)?,
        )
    {
        tc.incoming_users.push(ChapUser {
            user: u.into(),
            secret: s.into(),
        });
    }
    if auth && tc.group_incoming_users.is_empty() && tc.incoming_users.is_empty() {
        warn.push(format!(
            "{aat}.authentication: 1 without credentials; LIO refuses every login, ferrite \
             requires no CHAP"
        ));
    }
    if !demo && tc.ini_groups.is_empty() {
        warn.push(format!(
            "{at}: no node ACL and no demo mode: LIO admits nobody; ferrite admits every \
             initiator to an empty LUN map"
        ));
    }
    if let Some(p) = g.get("parameters") {
        let pat = format!("{at}.parameters");
        let p = obj(p, &pat)?;
        for (k, v) in p {
            let Some(v) = v.as_str() else {
                return Err(err(
                    &format!("{pat}.{k}"),
                    format!("expected a string, found {}", kind(v)),
                ));
            };
            import_param(cfg, k, v, &format!("{pat}.{k}"), warn)?;
        }
    }
    Ok(Some(tc))
}

fn import_param(
    cfg: &mut Config,
    k: &str,
    v: &str,
    at: &str,
    warn: &mut Vec<String>,
) -> Result<(), ImportError> {
    let n = || {
        v.parse::<u32>()
            .map_err(|_| err(at, format!("{v:?} is not a number")))
    };
    let b = || crate::tree::parse_bool(v).map_err(|m| err(at, m));
    let p = &mut cfg.iscsi;
    match k {
        "MaxRecvDataSegmentLength" => p.max_recv_data_segment_length = n()?,
        "MaxBurstLength" => p.max_burst_length = n()?,
        "FirstBurstLength" => p.first_burst_length = n()?,
        "ImmediateData" => p.immediate_data = b()?,
        "InitialR2T" => p.initial_r2t = b()?,
        "HeaderDigest" | "DataDigest" => {
            let mut list = Vec::new();
            for d in v.split(',') {
                list.push(match d.trim() {
                    "CRC32C" => crate::config::Digest::Crc32c,
                    "None" => crate::config::Digest::Off,
                    other => return Err(err(at, format!("{other:?} is not a digest"))),
                });
            }
            if k == "HeaderDigest" {
                p.header_digests = list;
            } else {
                p.data_digests = list;
            }
        }
        _ => {
            let default = PARAM_DEFAULTS
                .iter()
                .find(|(d, _)| *d == k)
                .map(|(_, v)| *v);
            if default != Some(v) {
                warn.push(format!("{at}: {v:?} not carried"));
            }
        }
    }
    Ok(())
}

fn import_fabric(
    f: &Value,
    at: &str,
    cfg: &mut Config,
    warn: &mut Vec<String>,
) -> Result<(), ImportError> {
    let o = obj(f, at)?;
    let name = string(o, "name", at)?;
    if name != "iscsi" {
        warn.push(format!("{at}: fabric module {name} not carried"));
        return Ok(());
    }
    if flag(o, "discovery_enable_auth", at)? != Some(true) {
        return Ok(());
    }
    let user = opt_string(o, "discovery_userid", at)?;
    let secret = opt_string(o, "discovery_password", at)?;
    let (Some(u), Some(s)) = (user, secret) else {
        return Err(err(
            at,
            "discovery_enable_auth without discovery_userid and discovery_password",
        ));
    };
    cfg.iscsi.discovery_incoming_users.push(ChapUser {
        user: u.into(),
        secret: s.into(),
    });
    if let (Some(u), Some(s)) = (
        opt_string(o, "discovery_mutual_userid", at)?,
        opt_string(o, "discovery_mutual_password", at)?,
    ) {
        cfg.iscsi.discovery_outgoing_user = Some(ChapUser {
            user: u.into(),
            secret: s.into(),
        });
    }
    Ok(())
}

/// The reservations of LIO's APTPL file `text` (target_core_pr.c
/// `core_scsi3_update_aptpl_buf`: `PR_REG_START:` ... `PR_REG_END:`
/// blocks of `key=value` lines) as ferrite's saved state
/// ([`ferrite_core::pr::PrState::encode`]); `file` names it in errors.
pub fn import_lio_aptpl(text: &str, file: &Path) -> Result<Vec<u8>, ImportError> {
    use ferrite_core::pr::{PrNexus, PrState, Registration, Reservation};
    let text = text.trim_end_matches('\0');
    let mut st = PrState {
        aptpl: true,
        ..PrState::default()
    };
    if text.trim() == "No Registrations or Reservations" {
        return Ok(Vec::new());
    }
    let at = |line: usize| format!("{}: line {}", file.display(), line + 1);
    let mut block: Option<(usize, BTreeMap<String, String>)> = None;
    for (n, l) in text.lines().enumerate() {
        let l = l.trim();
        if l.is_empty() {
            continue;
        }
        if l.starts_with("PR_REG_START:") {
            if block.is_some() {
                return Err(err(&at(n), "PR_REG_START inside a registration"));
            }
            block = Some((n, BTreeMap::new()));
            continue;
        }
        let Some((start, kv)) = block.as_mut() else {
            return Err(err(
                &at(n),
                format!("{l:?} outside PR_REG_START/PR_REG_END"),
            ));
        };
        if l.starts_with("PR_REG_END:") {
            let get = |k: &str| {
                kv.get(k)
                    .cloned()
                    .ok_or_else(|| err(&at(*start), format!("registration without {k}")))
            };
            let node = get("initiator_node")?;
            let port = match kv.get("initiator_sid") {
                Some(sid) => format!("{node},i,0x{}", sid.to_ascii_lowercase()),
                None => node,
            };
            let key_text = get("sa_res_key")?;
            let key = key_text.parse::<u64>().map_err(|_| {
                err(
                    &at(*start),
                    format!("sa_res_key {key_text:?} is not a number"),
                )
            })?;
            let rtpi_text = kv.get("port_rtpi").cloned().unwrap_or_else(|| "1".into());
            let rel_port = rtpi_text.parse::<u16>().map_err(|_| {
                err(
                    &at(*start),
                    format!("port_rtpi {rtpi_text:?} is not a number"),
                )
            })?;
            let nexus = PrNexus {
                initiator_port: port,
                target: get("target_node")?,
                rel_port,
            };
            if kv.get("res_holder").map(String::as_str) == Some("1") {
                let t = get("res_type")?;
                let kind = u8::from_str_radix(&t, 16)
                    .ok()
                    .filter(|k| matches!(k, 1 | 3 | 5 | 6 | 7 | 8))
                    .ok_or_else(|| err(&at(*start), format!("res_type {t:?} is not a PR type")))?;
                let all = matches!(kind, 7 | 8);
                st.res = Some(Reservation {
                    holder: (!all).then(|| nexus.clone()),
                    kind,
                });
            }
            st.regs.push(Registration {
                nexus,
                all_tg_pt: kv.get("res_all_tg_pt").map(String::as_str) == Some("1"),
                key,
            });
            block = None;
            continue;
        }
        let Some((k, v)) = l.split_once('=') else {
            return Err(err(&at(n), format!("{l:?} is not key=value")));
        };
        kv.insert(k.to_string(), v.to_string());
    }
    if let Some((start, _)) = block {
        return Err(err(
            &at(start),
            "registration without PR_REG_END (truncated file)",
        ));
    }
    Ok(st.encode())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// As targetcli 2.1 writes it (keys sorted), shortened.
    const SAMPLE: &str = r#"{
  "fabric_modules": [
    {
      "discovery_enable_auth": true,
      "discovery_password": "discsecret12",
      "discovery_userid": "disc",
      "name": "iscsi"
    }
  ],
  "storage_objects": [
    {
      "aio": false,
      "alua_tpgs": [
        {
          "alua_access_state": 0,
          "name": "default_tg_pt_gp",
          "tg_pt_gp_id": 0
        }
      ],
      "attributes": {
        "block_size": 512,
        "emulate_model_alias": 1,
        "emulate_tpu": 1,
        "emulate_write_cache": 1,
        "is_nonrot": 0,
        "queue_depth": 128
      },
      "dev": "/var/lib/iscsi_disks/disk1.img",
      "name": "disk1",
      "plugin": "fileio",
      "size": 1073741824,
      "write_back": true,
      "wwn": "1b5c6b8e-2a4f-4c3d-9e0f-123456789abc"
    },
    {
      "attributes": { "block_size": 4096 },
      "dev": "/dev/vdb",
      "name": "blk",
      "plugin": "block",
      "readonly": false,
      "write_back": false,
      "wwn": "0123abcd-0000-1111-2222-333344445555"
    },
    {
      "name": "rd0",
      "plugin": "ramdisk",
      "size": 1048576,
      "wwn": "ffff"
    }
  ],
  "targets": [
    {
      "fabric": "iscsi",
      "tpgs": [
        {
          "attributes": {
            "authentication": 1,
            "demo_mode_write_protect": 1,
            "generate_node_acls": 0
          },
          "enable": true,
          "luns": [
            {
              "alias": "0e4f1c2d3b",
              "alua_tg_pt_gp_name": "default_tg_pt_gp",
              "index": 0,
              "storage_object": "/backstores/fileio/disk1"
            },
            { "index": 1, "storage_object": "/backstores/block/blk" },
            { "index": 2, "storage_object": "/backstores/ramdisk/rd0" }
          ],
          "node_acls": [
            {
              "chap_mutual_password": "tgtsecret1234",
              "chap_mutual_userid": "tgtuser",
              "chap_password": "initsecret12",
              "chap_userid": "inituser",
              "mapped_luns": [
                { "alias": "7a9b8c6d5e", "index": 0, "tpg_lun": 0, "write_protect": false },
                { "index": 5, "tpg_lun": 1, "write_protect": true },
                { "index": 6, "tpg_lun": 2, "write_protect": false }
              ],
              "node_wwn": "iqn.1994-05.com.redhat:client1"
            }
          ],
          "parameters": {
            "AuthMethod": "CHAP,None",
            "DataDigest": "CRC32C,None",
            "FirstBurstLength": "65536",
            "HeaderDigest": "None",
            "ImmediateData": "Yes",
            "InitialR2T": "Yes",
            "MaxBurstLength": "262144",
            "MaxRecvDataSegmentLength": "8192",
            "DefaultTime2Wait": "5"
          },
          "portals": [
            { "ip_address": "0.0.0.0", "iser": false, "offload": false, "port": 3260 },
            { "ip_address": "::1", "iser": true, "offload": false, "port": 3261 }
          ],
          "tag": 1
        }
      ],
      "wwn": "iqn.2003-01.org.linux-iscsi.host.x8664:sn.0123456789ab"
    }
  ]
}
"#;

    #[test]
    fn lio_naa_as_lio_derives_it() {
        let naa = lio_naa("1b5c6b8e-2a4f-4c3d-9e0f-123456789abc", LIO_COMPANY_ID);
        assert_eq!(hex_id(&naa), "0x60014051b5c6b8e2a4f4c3d9e0f12345");
        // A short serial leaves the rest zero; other characters are skipped.
        let naa = lio_naa("ab-C", LIO_COMPANY_ID);
        assert_eq!(hex_id(&naa), "0x6001405abc0000000000000000000000");
    }

    #[test]
    fn imports_sample() {
        let imp = import_lio(SAMPLE).unwrap();
        let c = &imp.config;
        let names: Vec<&str> = c.devices.iter().map(|d| d.name.as_str()).collect();
        assert_eq!(names, ["disk1", "blk"]);
        let d = c.device("disk1").unwrap();
        assert_eq!(d.handler, Handler::VdiskFileio);
        assert_eq!(d.size, Some(1 << 30));
        assert!(d.thin_provisioned && !d.write_through && d.rotational);
        let id = d.identity();
        assert_eq!(
            (&*id.vendor, &*id.product, &*id.revision),
            ("LIO-ORG", "disk1", "4.0")
        );
        assert_eq!(id.serial, "1b5c6b8e-2a4f-4c3d-9e0f-123456789abc");
        assert_eq!(id.t10_id, "disk1:1b5c6b8e-2a4f-4c3d-9e0f-123456789abc");
        assert_eq!(hex_id(&id.naa), "0x60014051b5c6b8e2a4f4c3d9e0f12345");
        assert_eq!(
            d.vpd83.as_deref(),
            Some("naa,t10_nul,rel_port,port_group=0,lu_group=0,port_name,target_name")
        );
        let b = c.device("blk").unwrap();
        assert_eq!(
            (b.handler, b.blocksize, b.write_through),
            (Handler::VdiskBlockio, 4096, true)
        );
        assert_eq!(b.t10_product.as_deref(), Some("IBLOCK"));
        let t = c
            .iscsi_target("iqn.2003-01.org.linux-iscsi.host.x8664:sn.0123456789ab")
            .unwrap();
        assert_eq!((t.tpgt, t.enabled), (1, true));
        assert_eq!(t.portals, ["0.0.0.0:3260", "iser:[::1]:3261"]);
        assert!(t.luns.is_empty(), "no demo mode: ACL'd initiators only");
        let g = &t.ini_groups[0];
        assert_eq!(g.initiators, ["iqn.1994-05.com.redhat:client1"]);
        let luns: Vec<(u16, &str, bool)> = g
            .luns
            .iter()
            .map(|l| (l.lun, l.device.as_str(), l.read_only))
            .collect();
        assert_eq!(luns, [(0, "disk1", false), (5, "blk", true)]);
        assert_eq!(t.group_incoming_users[&g.name][0].user, "inituser");
        assert_eq!(t.outgoing_user.as_ref().unwrap().user, "tgtuser");
        assert_eq!(c.iscsi.discovery_incoming_users[0].user, "disc");
        assert_eq!(c.iscsi.max_recv_data_segment_length, 8192);
        assert_eq!(c.iscsi.header_digests, [crate::config::Digest::Off]);
        let w = imp.warnings.join("\n");
        for want in [
            "$.storage_objects[2]: storage object rd0: plugin ramdisk is not supported",
            "$.targets[0].tpgs[0].luns[2]: LUN 2 of unknown or skipped storage object",
            "$.targets[0].tpgs[0].node_acls[0].mapped_luns[2]: TPG LUN 2 is not carried",
            "$.targets[0].tpgs[0].parameters.DefaultTime2Wait: \"5\" not carried",
        ] {
            assert!(w.contains(want), "warnings lack {want:?}:\n{w}");
        }
        assert!(!w.contains("AuthMethod"), "{w}");
        // A valid configuration that survives a JSON round trip.
        let back = Config::from_json(&c.to_json(), "saved").unwrap();
        assert_eq!(&back, c);
    }

    #[test]
    fn bad_files_name_where() {
        let cases: [(&str, &str, &str); 6] = [
            (&SAMPLE[..SAMPLE.len() / 2], "line ", "not JSON"),
            ("[]", "$", "expected an object"),
            (
                r#"{"version": 3, "targets": []}"#,
                "$.version",
                "unknown key",
            ),
            ("{}", "$", "neither storage_objects nor targets"),
            (
                r#"{"storage_objects": [{"name": "d", "plugin": "fileio", "dev": "/x",
                   "attributes": {"block_size": 520}}]}"#,
                "$.storage_objects[0].attributes.block_size",
                "512 or 4096",
            ),
            (
                r#"{"storage_objects": [{"name": "d", "plugin": "fileio"}]}"#,
                "$.storage_objects[0].dev",
                "missing",
            ),
        ];
        for (text, want_at, want) in cases {
            match import_lio(text) {
                Err(ImportError::Json { at, msg }) => {
                    assert!(at.starts_with(want_at), "{at} vs {want_at}: {msg}");
                    assert!(msg.contains(want), "{at}: {msg}");
                }
                other => panic!("{want_at}: {other:?}"),
            }
        }
    }

    #[test]
    fn aptpl_file_becomes_saved_reservations() {
        let text = "PR_REG_START: 0\ninitiator_fabric=iSCSI\n\
            initiator_node=iqn.1994-05.com.redhat:client1\ninitiator_sid=00023d000001\n\
            sa_res_key=1234605616436508552\nres_holder=1\nres_type=01\nres_scope=00\n\
            res_all_tg_pt=0\nmapped_lun=0\ntarget_fabric=iSCSI\n\
            target_node=iqn.2003-01.org.linux-iscsi.x:sn.1\ntpgt=1\nport_rtpi=1\n\
            target_lun=0\nPR_REG_END: 0\n\0";
        let b = import_lio_aptpl(text, Path::new("aptpl_x")).unwrap();
        let st = ferrite_core::pr::PrState::decode(&b).unwrap();
        assert_eq!(st.regs.len(), 1);
        assert_eq!(st.regs[0].key, 0x1122_3344_5566_7788);
        assert_eq!(
            st.regs[0].nexus.initiator_port,
            "iqn.1994-05.com.redhat:client1,i,0x00023d000001"
        );
        let res = st.res.unwrap();
        assert_eq!(res.kind, 1);
        assert_eq!(
            res.holder.unwrap().target,
            "iqn.2003-01.org.linux-iscsi.x:sn.1"
        );
        assert!(
            import_lio_aptpl("No Registrations or Reservations", Path::new("f"))
                .unwrap()
                .is_empty()
        );
        let cut = &text[..text.find("PR_REG_END").unwrap()];
        match import_lio_aptpl(cut, Path::new("aptpl_x")) {
            Err(ImportError::Json { at, msg }) => {
                assert_eq!(at, "aptpl_x: line 1");
                assert!(msg.contains("truncated"), "{msg}");
            }
            other => panic!("{other:?}"),
        }
    }
}
