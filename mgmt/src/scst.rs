//! Import of SCST's `scst.conf` (as scstadmin writes it) into a [`Config`].
//!
//! Understood: `HANDLER vdisk_fileio|vdisk_blockio|vdisk_nullio { DEVICE ... }`
//! with their attributes, `TARGET_DRIVER iscsi { TARGET ... }` with
//! `enabled`, `allowed_portal`, the session parameters (which become the
//! global `iscsi` settings), `LUN` and `GROUP { LUN, INITIATOR }`;
//! `DEVICE_GROUP { DEVICE, TARGET_GROUP { group_id, state, preferred,
//! TARGET [{ rel_tgt_id }] } }` (ALUA). Everything
//! else is reported as a warning naming its line, never silently dropped.
//!
//! Owns only the translation; the result is validated like any
//! configuration.

use std::net::{IpAddr, SocketAddr};

use crate::config::{
    Config, DeviceConfig, DeviceGroupConfig, GroupConfig, Handler, IscsiTargetConfig, LunConfig,
    TargetGroupConfig, check_eui64, check_naa,
};
use crate::tree::{device_attr_by_scst_name, parse_bool, parse_size_mb};

/// Why a file could not be imported.
#[derive(Debug, thiserror::Error)]
pub enum ImportError {
    #[error("line {line}: {msg}")]
    Syntax { line: usize, msg: String },
    /// Where a JSON file (or a line of a reservation file) stops being
    /// what it should be: a JSON path such as `$.targets[0].tpgs[0]`.
    #[error("{at}: {msg}")]
    Json { at: String, msg: String },
    #[error("the imported configuration is invalid: {0}")]
    Invalid(#[from] crate::config::ConfigError),
}

/// The outcome: the configuration and what was not carried over.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Import {
    pub config: Config,
    pub warnings: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Stmt {
    line: usize,
    words: Vec<String>,
    block: Option<Vec<Stmt>>,
}

fn tokenize_line(s: &str, line: usize) -> Result<Vec<String>, ImportError> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut in_word = false;
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        match c {
            '"' => {
                in_word = true;
                loop {
                    match chars.next() {
                        Some('"') => break,
                        Some('\\') => {
                            if let Some(n) = chars.next() {
                                cur.push(n);
                            }
                        }
                        Some(x) => cur.push(x),
                        None => {
                            return Err(ImportError::Syntax {
                                line,
                                msg: "unterminated quote".into(),
                            });
                        }
                    }
                }
            }
            '#' if !in_word => break,
            '{' | '}' => {
                if in_word {
                    out.push(std::mem::take(&mut cur));
                    in_word = false;
                }
                out.push(c.to_string());
            }
            c if c.is_whitespace() => {
                if in_word {
                    out.push(std::mem::take(&mut cur));
                    in_word = false;
                }
            }
            c => {
                in_word = true;
                cur.push(c);
            }
        }
    }
    if in_word {
        out.push(cur);
    }
    Ok(out)
}

/// Parses the block structure: statements, `{ ... }` attached to the
/// statement before them.
fn parse_blocks(text: &str) -> Result<Vec<Stmt>, ImportError> {
    // Stack of open blocks; the bottom one is the file.
    let mut stack: Vec<(usize, Vec<Stmt>)> = vec![(0, Vec::new())];
    for (i, raw) in text.lines().enumerate() {
        let line = i + 1;
        let mut words: Vec<String> = Vec::new();
        for tok in tokenize_line(raw, line)? {
            match tok.as_str() {
                "{" => {
                    if words.is_empty() {
                        // `{` on its own line opens the previous statement.
                        let top = &mut stack
                            .last_mut()
                            .ok_or_else(|| ImportError::Syntax {
                                line,
                                msg: "unbalanced braces".into(),
                            })?
                            .1;
                        match top.pop() {
                            Some(prev) if prev.block.is_none() => {
                                stack.push((prev.line, vec![prev]))
                            }
                            _ => {
                                return Err(ImportError::Syntax {
                                    line,
                                    msg: "'{' without a statement before it".into(),
                                });
                            }
                        }
                        // Marker: the head statement sits first in the new frame.
                        continue;
                    }
                    let head = Stmt {
                        line,
                        words: std::mem::take(&mut words),
                        block: None,
                    };
                    stack.push((line, vec![head]));
                }
                "}" => {
                    if !words.is_empty() {
                        let s = Stmt {
                            line,
                            words: std::mem::take(&mut words),
                            block: None,
                        };
                        if let Some(top) = stack.last_mut() {
                            top.1.push(s);
                        }
                    }
                    if stack.len() < 2 {
                        return Err(ImportError::Syntax {
                            line,
                            msg: "'}' closes nothing".into(),
                        });
                    }
                    let Some((_, mut frame)) = stack.pop() else {
                        return Err(ImportError::Syntax {
                            line,
                            msg: "'}' closes nothing".into(),
                        });
                    };
                    let mut head = frame.remove(0);
                    head.block = Some(frame);
                    if let Some(top) = stack.last_mut() {
                        top.1.push(head);
                    }
                }
                _ => words.push(tok),
            }
        }
        if !words.is_empty()
            && let Some(top) = stack.last_mut()
        {
            top.1.push(Stmt {
                line,
                words,
                block: None,
            });
        }
    }
    if stack.len() != 1 {
        let open = stack.last().map_or(0, |f| f.0);
        return Err(ImportError::Syntax {
            line: open,
            msg: "block opened here is never closed".into(),
        });
    }
    Ok(stack.pop().map(|f| f.1).unwrap_or_default())
}

fn syntax(line: usize, msg: impl Into<String>) -> ImportError {
    ImportError::Syntax {
        line,
        msg: msg.into(),
    }
}

fn arg<'a>(s: &'a Stmt, i: usize, what: &str) -> Result<&'a str, ImportError> {
    s.words
        .get(i)
        .map(String::as_str)
        .ok_or_else(|| syntax(s.line, format!("{} needs {what}", s.words[0])))
}

fn bool_attr(s: &Stmt) -> Result<bool, ImportError> {
    parse_bool(arg(s, 1, "a value")?).map_err(|m| syntax(s.line, format!("{}: {m}", s.words[0])))
}

/// SCST writes identifiers with or without `0x` and sometimes with `-`.
fn hex_digits(v: &str) -> String {
    let d = v
        .strip_prefix("0x")
        .or_else(|| v.strip_prefix("0X"))
        .unwrap_or(v);
    d.chars()
        .filter(|c| *c != '-' && *c != ':')
        .collect::<String>()
        .to_ascii_lowercase()
}

/// Converts `scst.conf` text.
pub fn import_scst(text: &str) -> Result<Import, ImportError> {
    let stmts = parse_blocks(text)?;
    let mut cfg = Config::default();
    let mut warn: Vec<String> = Vec::new();
    // SCST derives device ids from setup_id; it must be known before the
    // devices, wherever the file sets it.
    let mut setup_id = 0u32;
    for s in stmts.iter().filter(|s| s.words[0] == "setup_id") {
        let v = arg(s, 1, "a value")?;
        let d = v.strip_prefix("0x").or_else(|| v.strip_prefix("0X"));
        let n = match d {
            Some(h) => u32::from_str_radix(h, 16),
            None => v.parse::<u32>(),
        };
        setup_id =
            n.map_err(|_| syntax(s.line, format!("setup_id {v:?} is not a 32-bit number")))?;
    }
    let mut iscsi_params_from: Option<String> = None;
    for s in &stmts {
        let kw = s.words[0].as_str();
        match (kw, &s.block) {
            ("HANDLER", block) => {
                let hname = arg(s, 1, "a handler name")?;
                let Some(h) = Handler::from_name(hname) else {
                    warn.push(format!(
                        "line {}: handler {hname} is not supported; its devices are skipped",
                        s.line
                    ));
                    continue;
                };
                for d in block.iter().flatten() {
                    if d.words[0] != "DEVICE" {
                        warn.push(format!(
                            "line {}: handler attribute {} ignored",
                            d.line, d.words[0]
                        ));
                        continue;
                    }
                    cfg.devices.push(import_device(h, d, setup_id, &mut warn)?);
                }
            }
            ("TARGET_DRIVER", block) => {
                let drv = arg(s, 1, "a driver name")?;
                if drv != "iscsi" {
                    warn.push(format!(
                        "line {}: target driver {drv} is not supported; skipped",
                        s.line
                    ));
                    continue;
                }
                for t in block.iter().flatten() {
                    match t.words[0].as_str() {
                        "TARGET" => {
                            let (tc, params) = import_target(t, &mut warn)?;
                            if !params.is_empty() {
                                if let Some(prev) = &iscsi_params_from {
                                    warn.push(format!(
                                        "line {}: iSCSI parameters of {} replace those of {prev}: ferrite's are global",
                                        t.line, tc.name
                                    ));
                                }
                                iscsi_params_from = Some(tc.name.clone());
                                for (k, v, line) in params {
                                    set_iscsi_param(&mut cfg, &k, &v, line, &mut warn)?;
                                }
                            }
                            cfg.targets.iscsi.push(tc);
                        }
                        "enabled" => {}
                        "IncomingUser" => cfg.iscsi.discovery_incoming_users.push(chap_user(t)?),
                        "OutgoingUser" => cfg.iscsi.discovery_outgoing_user = Some(chap_user(t)?),
                        other => warn.push(format!(
                            "line {}: iscsi driver attribute {other} ignored",
                            t.line
                        )),
                    }
                }
            }
            ("DEVICE_GROUP", _) => {}
            ("setup_id", None) => {}
            (other, _) => warn.push(format!("line {}: {other} ignored", s.line)),
        }
    }
    // LUNs of devices that were skipped.
    let known: std::collections::BTreeSet<String> =
        cfg.devices.iter().map(|d| d.name.clone()).collect();
    for t in &mut cfg.targets.iscsi {
        let tn = t.name.clone();
        let prune = |luns: &mut Vec<LunConfig>, warn: &mut Vec<String>| {
            luns.retain(|l| {
                let ok = known.contains(&l.device);
                if !ok {
                    warn.push(format!(
                        "{tn}: LUN {} of unknown or skipped device {} dropped",
                        l.lun, l.device
                    ));
                }
                ok
            })
        };
        prune(&mut t.luns, &mut warn);
        for g in &mut t.ini_groups {
            prune(&mut g.luns, &mut warn);
        }
    }
    // Device groups name devices and targets: after both.
    for s in stmts.iter().filter(|s| s.words[0] == "DEVICE_GROUP") {
        let g = import_device_group(s, &mut cfg, &mut warn)?;
        cfg.device_groups.push(g);
    }
    // SCST gives an enabled target without rel_tgt_id a free one; ports of
    // target groups need theirs told apart (REPORT TARGET PORT GROUPS),
    // so each gets one here.
    let grouped: std::collections::BTreeSet<String> = cfg
        .device_groups
        .iter()
        .flat_map(|g| g.target_groups.iter())
        .flat_map(|t| t.targets.iter().cloned())
        .collect();
    let mut used: std::collections::BTreeSet<u16> = cfg
        .targets
        .iscsi
        .iter()
        .filter(|t| t.rel_tgt_id.is_some() || !grouped.contains(&t.name))
        .map(|t| t.rel_port_id())
        .collect();
    for t in cfg.targets.iscsi.iter_mut() {
        if t.rel_tgt_id.is_none() && grouped.contains(&t.name) {
            let id = (1..=u16::MAX)
                .find(|n| !used.contains(n))
                .unwrap_or(u16::MAX);
            used.insert(id);
            t.rel_tgt_id = Some(id);
            warn.push(format!(
                "{}: rel_tgt_id {id} given (the file sets none; SCST assigns one when the target is enabled)",
                t.name
            ));
        }
    }
    cfg.validate()?;
    Ok(Import {
        config: cfg,
        warnings: warn,
    })
}

/// `DEVICE_GROUP NAME { DEVICE d; TARGET_GROUP tg { group_id N; state S;
/// preferred B; TARGET t [{ rel_tgt_id N }] } }`. Devices and targets this
/// file does not define (SCST lets a target group name a peer node's
/// ports) are named in `warn` and left out; a TARGET's `rel_tgt_id`
/// becomes the target's own when it has none.
fn import_device_group(
    s: &Stmt,
    cfg: &mut Config,
    warn: &mut Vec<String>,
) -> Result<DeviceGroupConfig, ImportError> {
    let mut g = DeviceGroupConfig::new(arg(s, 1, "a device group name")?);
    for a in s.block.iter().flatten() {
        match a.words[0].as_str() {
            "DEVICE" => {
                let d = arg(a, 1, "a device name")?;
                if cfg.device(d).is_some() {
                    g.devices.push(d.to_string());
                } else {
                    warn.push(format!(
                        "line {}: device {d} of device group {} is not imported; left out",
                        a.line, g.name
                    ));
                }
            }
            "TARGET_GROUP" => {
                let tg = import_target_group(a, &g, cfg, warn)?;
                g.target_groups.push(tg);
            }
            other => warn.push(format!(
                "line {}: device group attribute {other} not carried",
                a.line
            )),
        }
    }
    Ok(g)
}

fn import_target_group(
    s: &Stmt,
    dg: &DeviceGroupConfig,
    cfg: &mut Config,
    warn: &mut Vec<String>,
) -> Result<TargetGroupConfig, ImportError> {
    let mut tg = TargetGroupConfig::new(arg(s, 1, "a target group name")?, 0);
    for a in s.block.iter().flatten() {
        match a.words[0].as_str() {
            "group_id" => {
                let v = arg(a, 1, "a number")?;
                tg.group_id = v
                    .parse::<u32>()
                    .ok()
                    .filter(|n| (1..=65535).contains(n))
                    .ok_or_else(|| {
                        syntax(a.line, format!("group_id {v:?}: valid is 1 to 65535"))
                    })?;
            }
            "state" => {
                let v = arg(a, 1, "a state")?;
                let st = ferrite_core::alua::AccessState::parse(v).ok_or_else(|| {
                    syntax(
                        a.line,
                        format!(
                            "state {v:?}: valid is {}",
                            ferrite_core::alua::AccessState::ALL
                                .map(|s| s.name())
                                .join(", ")
                        ),
                    )
                })?;
                tg.state = st.name().into();
            }
            "preferred" => tg.preferred = bool_attr(a)?,
            "TARGET" => {
                let t = arg(a, 1, "a target name")?.to_string();
                let mut rel = None;
                for x in a.block.iter().flatten() {
                    match x.words[0].as_str() {
                        "rel_tgt_id" => {
                            let v = arg(x, 1, "a number")?;
                            rel = Some(v.parse::<u16>().ok().filter(|n| *n > 0).ok_or_else(
                                || syntax(x.line, format!("rel_tgt_id {v:?}: valid is 1 to 65535")),
                            )?);
                        }
                        other => warn.push(format!(
                            "line {}: target group target attribute {other} not carried",
                            x.line
                        )),
                    }
                }
                let local = cfg.targets.iscsi.iter_mut().find(|x| x.name == t);
                let Some(local) = local else {
                    warn.push(format!(
                        "line {}: target {t} of target group {} is not a target here (a peer's port?); left out",
                        a.line, tg.name
                    ));
                    continue;
                };
                match (rel, local.rel_tgt_id) {
                    (Some(r), None) => local.rel_tgt_id = Some(r),
                    (Some(r), Some(own)) if r != own => warn.push(format!(
                        "line {}: rel_tgt_id {r} of {t} in target group {} differs from the target's {own}; the target's kept",
                        a.line,
                        tg.name
                    )),
                    _ => {}
                }
                tg.targets.push(t);
            }
            other => warn.push(format!(
                "line {}: target group attribute {other} not carried",
                a.line
            )),
        }
    }
    if tg.group_id == 0 {
        let id = (1..=65535u32)
            .find(|id| !dg.target_groups.iter().any(|t| t.group_id == *id))
            .unwrap_or(65535);
        warn.push(format!(
            "line {}: target group {} has no group_id; {id} given",
            s.line, tg.name
        ));
        tg.group_id = id;
    }
    Ok(tg)
}

/// SCST's `prod_rev_lvl` when a device sets none (SCST_FIO_REV of SCST
/// 3.11; earlier releases: `3100`, `390 `, `350 `).
pub const SCST_DEFAULT_REV: &str = "3110";

/// SCST's device id number (scst_vdisk.c `vdisk_gen_dev_id_num`): CRC32C
/// without pre- or post-inversion over the name and its NUL, below
/// `setup_id`.
pub fn scst_dev_id_num(name: &str, setup_id: u32) -> u64 {
    let mut b = name.as_bytes().to_vec();
    b.push(0);
    let raw = !crc32c::crc32c_append(u32::MAX, &b);
    u64::from(setup_id) << 32 | u64::from(raw)
}

/// What SCST reports for a vdisk device from its name alone.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScstDerived {
    /// `t10_dev_id`: `<id hex>-<name>`, at most 25 characters; also the
    /// default `vend_specific_id` (the T10 designator's identifier).
    pub t10_dev_id: String,
    /// `usn`: the id in hex.
    pub usn: String,
    /// `t10_vend_id`.
    pub vendor: &'static str,
    /// `prod_id`: the name, at most 16 characters.
    pub product: String,
}

/// SCST's derivations for device `name` of handler `h` (vdev_create_node).
pub fn scst_derived(name: &str, h: Handler, setup_id: u32) -> ScstDerived {
    let n = scst_dev_id_num(name, setup_id);
    ScstDerived {
        t10_dev_id: prefix_bytes(&format!("{n:x}-{name}"), 25).to_string(),
        usn: format!("{n:x}"),
        vendor: if h == Handler::VdiskBlockio {
            "SCST_BIO"
        } else {
            "SCST_FIO"
        },
        product: prefix_bytes(name, 16).to_string(),
    }
}

/// The first `n` bytes of `s`, as SCST copies its C strings; a character
/// that does not fit whole is left out (a name in ASCII, as SCST's are,
/// keeps exactly `n` bytes).
fn prefix_bytes(s: &str, n: usize) -> &str {
    let mut end = n.min(s.len());
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// SCST's VPD 83h for a vdisk (scst_vdisk.c `vdisk_dev_id_vpd`): the
/// T10 designator, the relative port, then the EUI-64 (configured, or else
/// when no NAA is set the first 8 bytes of `t10_dev_id`) and the NAA when
/// configured, all without protocol identifiers.
fn scst_identity(d: &mut DeviceConfig, t10_dev_id: &str, setup_id: u32) {
    let der = scst_derived(&d.name, d.handler, setup_id);
    d.serial.get_or_insert(der.usn);
    d.t10_vendor.get_or_insert(der.vendor.to_string());
    d.t10_product.get_or_insert(der.product);
    d.t10_id.get_or_insert(der.t10_dev_id);
    let mut layout = vec!["t10", "rel_port"];
    if d.eui64.is_none() && d.naa.is_none() {
        let mut compat = [0u8; 8];
        for (c, b) in compat.iter_mut().zip(t10_dev_id.bytes()) {
            *c = b;
        }
        d.eui64 = Some(crate::config::hex_id(&compat));
    }
    if d.eui64.is_some() {
        layout.push("eui64");
    }
    if d.naa.is_some() {
        layout.push("naa");
    }
    if d.lu_name.is_some() {
        layout.insert(0, "lu_name");
    }
    layout.push("no_piv");
    d.vpd83 = Some(layout.join(","));
}

fn import_device(
    h: Handler,
    s: &Stmt,
    setup_id: u32,
    warn: &mut Vec<String>,
) -> Result<DeviceConfig, ImportError> {
    let mut d = DeviceConfig::new(arg(s, 1, "a device name")?, h);
    let mut t10_dev_id = scst_derived(&d.name, h, setup_id).t10_dev_id;
    for a in s.block.iter().flatten() {
        let v = || arg(a, 1, "a value");
        match a.words[0].as_str() {
            "t10_dev_id" => {
                let x = v()?;
                if x.len() > 25 {
                    return Err(syntax(
                        a.line,
                        format!("t10_dev_id {x:?}: valid is at most 25 characters"),
                    ));
                }
                t10_dev_id = x.to_string();
            }
            "scsi_device_name" => {
                d.lu_name = Some(v()?.to_string());
                warn.push(format!(
                    "line {}: scsi_device_name is reported as the logical unit's SCSI name \
                     string (SCST reports it as the target device's)",
                    a.line
                ));
            }
            "size_mb" => {
                d.size =
                    Some(parse_size_mb(v()?).map_err(|m| syntax(a.line, format!("size_mb: {m}")))?)
            }
            // SCST's naa_id and eui64_id: hex, the lengths SPC-4 allows.
            "naa_id" => {
                let x = hex_digits(v()?);
                check_naa(&x).map_err(|m| syntax(a.line, format!("naa_id: {m}")))?;
                d.naa = Some(format!("0x{x}"));
            }
            "eui64_id" => {
                let x = hex_digits(v()?);
                check_eui64(&x).map_err(|m| syntax(a.line, format!("eui64_id: {m}")))?;
                d.eui64 = Some(format!("0x{x}"));
            }
            "t10_vendor_id" => d.t10_vendor = Some(v()?.to_string()),
            "o_direct" if h == Handler::VdiskFileio => warn.push(format!(
                "line {}: o_direct ignored; use vdisk_blockio for O_DIRECT",
                a.line
            )),
            other => match device_attr_by_scst_name(other).and_then(|x| x.parse) {
                Some(parse) => {
                    parse(&mut d, v()?).map_err(|m| syntax(a.line, format!("{other}: {m}")))?
                }
                None => warn.push(format!("line {}: device attribute {other} ignored", a.line)),
            },
        }
    }
    if h == Handler::VdiskNullio && d.size.is_none() {
        d.size = Some(crate::config::DEFAULT_IMAGE_SIZE);
        warn.push(format!(
            "line {}: nullio device {} has no size; 1 GiB is used",
            s.line, d.name
        ));
    }
    if h == Handler::VdiskBlockio && d.size.take().is_some() {
        warn.push(format!(
            "line {}: size of blockio device {} ignored: it is the device's",
            s.line, d.name
        ));
    }
    if d.t10_revision.is_none() {
        d.t10_revision = Some(SCST_DEFAULT_REV.into());
        warn.push(format!(
            "line {}: device {} sets no prod_rev_lvl: SCST 3.11's {SCST_DEFAULT_REV} is used \
             (earlier SCST releases report 3100, 390 or 350; set prod_rev_lvl to the one \
             initiators saw)",
            s.line, d.name
        ));
    }
    scst_identity(&mut d, &t10_dev_id, setup_id);
    d.validate(&format!("DEVICE {}", d.name))
        .map_err(|e| syntax(s.line, e.to_string()))?;
    Ok(d)
}

type ParamList = Vec<(String, String, usize)>;

/// `IncomingUser "name secret"` or `IncomingUser name secret`.
fn chap_user(s: &Stmt) -> Result<crate::config::ChapUser, ImportError> {
    let joined = s.words[1..].join(" ");
    let mut it = joined.split_whitespace();
    match (it.next(), it.next(), it.next()) {
        (Some(user), Some(secret), None) => Ok(crate::config::ChapUser {
            user: user.into(),
            secret: secret.into(),
        }),
        _ => Err(syntax(
            s.line,
            format!("{} takes a name and a secret", s.words[0]),
        )),
    }
}

fn import_lun(s: &Stmt) -> Result<LunConfig, ImportError> {
    let lun: u16 = arg(s, 1, "a LUN number")?
        .parse()
        .map_err(|_| syntax(s.line, format!("LUN {:?} is not a number", s.words[1])))?;
    let device = arg(s, 2, "a device name")?.to_string();
    let mut read_only = false;
    for a in s.block.iter().flatten() {
        match a.words[0].as_str() {
            "read_only" => read_only = bool_attr(a)?,
            other => {
                return Err(syntax(
                    a.line,
                    format!("LUN attribute {other} is not supported"),
                ));
            }
        }
    }
    Ok(LunConfig {
        lun,
        device,
        read_only,
    })
}

fn import_target(
    s: &Stmt,
    warn: &mut Vec<String>,
) -> Result<(IscsiTargetConfig, ParamList), ImportError> {
    let mut t = IscsiTargetConfig::new(arg(s, 1, "a target name")?);
    // scstadmin writes targets disabled unless `enabled 1` says otherwise.
    t.enabled = false;
    let mut params = Vec::new();
    for a in s.block.iter().flatten() {
        match a.words[0].as_str() {
            "enabled" => t.enabled = bool_attr(a)?,
            "rel_tgt_id" => {
                let r = arg(a, 1, "a number")?;
                // SCST: 0 (the default) is assigned when the target is
                // enabled; so is an absent rel_tgt_id here.
                match r.parse::<u16>() {
                    Ok(0) => {}
                    Ok(n) => t.rel_tgt_id = Some(n),
                    Err(_) => {
                        return Err(syntax(
                            a.line,
                            format!("rel_tgt_id {r:?}: valid is 0 to 65535"),
                        ));
                    }
                }
            }
            "allowed_portal" => {
                for p in &a.words[1..] {
                    if let Ok(sa) = p.parse::<SocketAddr>() {
                        t.portals.push(sa.to_string());
                    } else if let Ok(ip) =
                        p.trim_matches(|c| c == '[' || c == ']').parse::<IpAddr>()
                    {
                        t.portals.push(SocketAddr::new(ip, 3260).to_string());
                    } else {
                        warn.push(format!(
                            "line {}: allowed_portal {p} is not an address; ferrite portals are addresses, not patterns",
                            a.line
                        ));
                    }
                }
            }
            "LUN" => t.luns.push(import_lun(a)?),
            "GROUP" => {
                let mut g = GroupConfig {
                    name: arg(a, 1, "a group name")?.to_string(),
                    initiators: Vec::new(),
                    luns: Vec::new(),
                };
                for x in a.block.iter().flatten() {
                    match x.words[0].as_str() {
                        "LUN" => g.luns.push(import_lun(x)?),
                        "INITIATOR" => g.initiators.push(arg(x, 1, "a name pattern")?.to_string()),
                        other => {
                            warn.push(format!("line {}: group attribute {other} ignored", x.line))
                        }
                    }
                }
                t.ini_groups.push(g);
            }
            k @ ("MaxRecvDataSegmentLength"
            | "MaxBurstLength"
            | "FirstBurstLength"
            | "ImmediateData"
            | "InitialR2T"
            | "MaxOutstandingR2T"
            | "NopInInterval"
            | "NopInTimeout") => {
                params.push((k.to_string(), arg(a, 1, "a value")?.to_string(), a.line));
            }
            k @ ("IncomingUser" | "OutgoingUser") => {
                let u = chap_user(a)?;
                if k == "IncomingUser" {
                    t.incoming_users.push(u);
                } else {
                    t.outgoing_user = Some(u);
                }
            }
            other => warn.push(format!("line {}: target attribute {other} ignored", a.line)),
        }
    }
    if t.portals.is_empty() {
        t.portals.push("0.0.0.0:3260".into());
    }
    Ok((t, params))
}

fn set_iscsi_param(
    cfg: &mut Config,
    k: &str,
    v: &str,
    line: usize,
    _warn: &mut Vec<String>,
) -> Result<(), ImportError> {
    let n = || {
        v.parse::<u32>()
            .map_err(|_| syntax(line, format!("{k}: {v:?} is not a number")))
    };
    let b = || parse_bool(v).map_err(|m| syntax(line, format!("{k}: {m}")));
    let p = &mut cfg.iscsi;
    match k {
        "MaxRecvDataSegmentLength" => p.max_recv_data_segment_length = n()?,
        "MaxBurstLength" => p.max_burst_length = n()?,
        "FirstBurstLength" => p.first_burst_length = n()?,
        "ImmediateData" => p.immediate_data = b()?,
        "InitialR2T" => p.initial_r2t = b()?,
        "MaxOutstandingR2T" => {
            p.max_outstanding_r2t = u16::try_from(n()?)
                .map_err(|_| syntax(line, format!("{k}: {v} is out of range")))?
        }
        "NopInInterval" => p.nop_in_interval_s = n()?,
        _ => p.nop_in_timeout_s = n()?,
    }
    Ok(())
}

/// SCST's saved reservation file signature and version (scst_pres.c).
const SCST_PR_SIGNATURE: u64 = 0xBBEE_EEAA_EEBB_DD77;
const SCST_PR_VERSION: u64 = 1;

/// The initiator port an SCST TransportID names, as ferrite names ports:
/// iSCSI `name,i,0x<ISID>` (iscsi-scst prints the ISID as the native
/// 64-bit value of its six bytes and a zero TSIH: on x86 byte-reversed,
/// 00023d000001 as 0x100003d0200), or a bare iSCSI name; SRP `0x<port id>`.
fn scst_tid_port(tid: &[u8]) -> Option<String> {
    match tid.first()? & 0x0f {
        5 => {
            let len = usize::from(u16::from_be_bytes([*tid.get(2)?, *tid.get(3)?]));
            let body = tid.get(4..4 + len)?;
            let text = std::str::from_utf8(body).ok()?.trim_end_matches('\0');
            match text.split_once(",i,0x") {
                Some((name, hex)) => {
                    let v = u64::from_str_radix(hex, 16).ok()?;
                    let isid: String = v.to_le_bytes()[..6]
                        .iter()
                        .map(|b| format!("{b:02x}"))
                        .collect();
                    Some(format!("{name},i,0x{isid}"))
                }
                None => Some(text.to_string()),
            }
        }
        4 => {
            let id = tid.get(8..24)?;
            Some(format!(
                "0x{}",
                id.iter().map(|b| format!("{b:02x}")).collect::<String>()
            ))
        }
        _ => None,
    }
}

/// The reservations of SCST's saved PR file `b` (`/var/lib/scst/pr/<device>`,
/// scst_pres.c `scst_pr_sync_device_file`) as ferrite's saved state
/// ([`ferrite_core::pr::PrState::encode`]); `target_of` names the target of
/// a relative target port id (the imported targets' `rel_tgt_id`). `file`
/// names the file in errors.
pub fn import_scst_pr(
    b: &[u8],
    file: &std::path::Path,
    target_of: impl Fn(u16) -> Option<String>,
) -> Result<Vec<u8>, ImportError> {
    use ferrite_core::pr::{PrNexus, PrState, Registration, Reservation};
    let bad = |off: usize, msg: String| ImportError::Json {
        at: format!("{}: byte {off}", file.display()),
        msg,
    };
    let u64_at = |off: usize| -> Option<u64> {
        Some(u64::from_le_bytes(b.get(off..off + 8)?.try_into().ok()?))
    };
    match (u64_at(0), u64_at(8)) {
        (Some(SCST_PR_SIGNATURE), Some(SCST_PR_VERSION)) => {}
        (Some(0), _) => {
            return Err(bad(
                0,
                "signature 0: SCST did not finish writing this file; try its .1 copy".into(),
            ));
        }
        (Some(SCST_PR_SIGNATURE), Some(v)) => {
            return Err(bad(8, format!("version {v}; this reads version 1")));
        }
        _ => {
            return Err(bad(
                0,
                "not an SCST persistent reservation file (signature)".into(),
            ));
        }
    }
    let hdr = b
        .get(16..20)
        .ok_or_else(|| bad(16, "truncated header".into()))?;
    let (aptpl, is_set, kind) = (hdr[0] != 0, hdr[1] != 0, hdr[2]);
    let mut st = PrState {
        aptpl,
        ..PrState::default()
    };
    let mut holder: Option<PrNexus> = None;
    let mut off = 20;
    while off < b.len() {
        let start = off;
        let is_holder = b[off] != 0;
        off += 1;
        let first = *b
            .get(off)
            .ok_or_else(|| bad(start, "truncated registrant".into()))?;
        let tlen = if first & 0x0f == 5 {
            let l = b
                .get(off + 2..off + 4)
                .ok_or_else(|| bad(off, "truncated TransportID".into()))?;
            usize::from(u16::from_be_bytes([l[0], l[1]])) + 4
        } else {
            24
        };
        let tid = b
            .get(off..off + tlen)
            .ok_or_else(|| bad(off, "truncated TransportID".into()))?;
        let port = scst_tid_port(tid).ok_or_else(|| {
            bad(
                off,
                format!(
                    "TransportID of protocol {:#x} is not iSCSI or SRP",
                    first & 0x0f
                ),
            )
        })?;
        off += tlen;
        let key = b
            .get(off..off + 8)
            .and_then(|k| k.try_into().ok())
            .map(u64::from_be_bytes)
            .ok_or_else(|| bad(off, "truncated key".into()))?;
        off += 8;
        let rel = b
            .get(off..off + 2)
            .map(|r| u16::from_le_bytes([r[0], r[1]]))
            .ok_or_else(|| bad(off, "truncated rel_tgt_id".into()))?;
        off += 2;
        let target = target_of(rel).ok_or_else(|| {
            bad(
                start,
                format!("registrant through rel_tgt_id {rel}, which no imported target has"),
            )
        })?;
        let nexus = PrNexus {
            initiator_port: port,
            target,
            rel_port: rel,
        };
        if is_holder {
            holder = Some(nexus.clone());
        }
        st.regs.push(Registration {
            nexus,
            all_tg_pt: false,
            key,
        });
    }
    if is_set {
        if !matches!(kind, 1 | 3 | 5 | 6 | 7 | 8) {
            return Err(bad(18, format!("reservation type {kind} is not a PR type")));
        }
        let all = matches!(kind, 7 | 8);
        if !all && holder.is_none() {
            return Err(bad(17, "a reservation without a holder".into()));
        }
        st.res = Some(Reservation {
            holder: if all { None } else { holder },
            kind,
        });
    }
    if !aptpl || st.regs.is_empty() {
        return Ok(Vec::new());
    }
    Ok(st.encode())
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = r#"# Automatically generated by SCST Configurator v3.7.0.

# Non-key attributes
# max_tasklet_cmd 10
setup_id 0x0

HANDLER vdisk_blockio {
	DEVICE disk01 {
		filename /dev/sdb
		nv_cache 1
		t10_vendor_id "SCST_BIO"
		usn 12ab34
	}
}

HANDLER vdisk_fileio {
	DEVICE disk02 {
		filename /vdisks/disk02.img
		blocksize 4096
		write_through 1
		thin_provisioned 1
		naa_id 0x6001405d0bc3e7a4fe0123456789abcd
		o_direct 1
	}
}

HANDLER vdisk_nullio {
	DEVICE null0
	DEVICE null1 {
		size_mb 64
	}
}

HANDLER vcdrom {
	DEVICE cd0
}

TARGET_DRIVER iscsi {
	enabled 1
	IncomingUser "disc discsecret1234"

	TARGET iqn.2006-10.net.vlnb:tgt {
		enabled 1
		rel_tgt_id 1
		allowed_portal 192.168.1.10
		MaxBurstLength 524288
		ImmediateData No
		HeaderDigest CRC32C
		IncomingUser "joe joesecret1234"
		OutgoingUser tgt tgtsecret12345

		LUN 0 disk01
		LUN 1 disk02
		{
			read_only 1
		}
		LUN 2 cd0

		GROUP hosts {
			LUN 0 null1
			INITIATOR iqn.1996-04.de.suse:01:abc
			INITIATOR "iqn.1991-05.com.microsoft:*"
		}
	}

	TARGET iqn.2006-10.net.vlnb:off {
		LUN 0 null0
	}
}

TARGET_DRIVER ib_srpt {
	TARGET fe80:0000:0000:0000:0002:c903:000e:9a2b {
		enabled 1
	}
}
"#;

    const ALUA_SAMPLE: &str = r#"
HANDLER vdisk_nullio {
	DEVICE disk0 {
		size_mb 64
	}
	DEVICE disk1 {
		size_mb 64
	}
}
TARGET_DRIVER iscsi {
	enabled 1
	TARGET iqn.2026-11.org.example:a {
		enabled 1
		rel_tgt_id 1
		LUN 0 disk0
	}
	TARGET iqn.2026-11.org.example:b {
		enabled 1
		LUN 0 disk0
	}
}
DEVICE_GROUP dg1 {
	DEVICE disk0
	DEVICE gone
	TARGET_GROUP tg_a {
		group_id 1
		state active
		preferred 1
		TARGET iqn.2026-11.org.example:a
	}
	TARGET_GROUP tg_b {
		group_id 2
		state nonoptimized
		comment remote
		TARGET iqn.2026-11.org.example:b {
			rel_tgt_id 5
			weight 3
		}
		TARGET iqn.2026-11.org.example:peer {
			rel_tgt_id 9
		}
	}
}
DEVICE_GROUP dg2 {
	DEVICE disk1
	TARGET_GROUP only {
		TARGET iqn.2026-11.org.example:a
	}
}
"#;

    #[test]
    fn imports_device_groups() {
        let imp = import_scst(ALUA_SAMPLE).unwrap();
        let c = &imp.config;
        let dg = c.device_group("dg1").unwrap();
        assert_eq!(dg.devices, ["disk0"]);
        let a = dg.target_group("tg_a").unwrap();
        assert_eq!(
            (a.group_id, a.state.as_str(), a.preferred),
            (1, "active", true)
        );
        assert_eq!(a.targets, ["iqn.2026-11.org.example:a"]);
        let b = dg.target_group("tg_b").unwrap();
        assert_eq!(
            (b.group_id, b.state.as_str(), b.preferred),
            (2, "nonoptimized", false)
        );
        assert_eq!(b.targets, ["iqn.2026-11.org.example:b"]);
        // The TARGET block's rel_tgt_id became the target's.
        assert_eq!(
            c.iscsi_target("iqn.2026-11.org.example:b")
                .unwrap()
                .rel_tgt_id,
            Some(5)
        );
        let only = c.device_group("dg2").unwrap().target_group("only").unwrap();
        assert_eq!(only.group_id, 1);
        let w = imp.warnings.join("\n");
        for want in [
            "device gone of device group dg1 is not imported",
            "target group attribute comment not carried",
            "target group target attribute weight not carried",
            "iqn.2026-11.org.example:peer of target group tg_b is not a target here",
            "target group only has no group_id; 1 given",
        ] {
            assert!(w.contains(want), "{want:?} missing from:\n{w}");
        }
        // Through JSON and back.
        let back = Config::from_json(&c.to_json(), "t").unwrap();
        assert_eq!(&back, c);
        // Two targets without ids in groups get distinct ones.
        let text = ALUA_SAMPLE
            .replace("\t\trel_tgt_id 1\n", "")
            .replace("rel_tgt_id 5", "");
        let imp = import_scst(&text).unwrap();
        let ids: Vec<Option<u16>> = imp
            .config
            .targets
            .iscsi
            .iter()
            .map(|t| t.rel_tgt_id)
            .collect();
        assert_eq!(ids, [Some(1), Some(2)]);
        // A bad state names its line.
        let e = import_scst(&ALUA_SAMPLE.replace("state nonoptimized", "state sleepy"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("line 33") && e.contains("standby"), "{e}");
    }

    #[test]
    fn imports_sample() {
        let imp = import_scst(SAMPLE).unwrap();
        let c = &imp.config;
        let names: Vec<&str> = c.devices.iter().map(|d| d.name.as_str()).collect();
        assert_eq!(names, ["disk01", "disk02", "null0", "null1"]);
        let d1 = c.device("disk01").unwrap();
        assert_eq!(d1.handler, Handler::VdiskBlockio);
        assert!(d1.nv_cache);
        assert_eq!(d1.t10_vendor.as_deref(), Some("SCST_BIO"));
        assert_eq!(d1.serial.as_deref(), Some("12ab34"));
        let d2 = c.device("disk02").unwrap();
        assert_eq!(
            (d2.blocksize, d2.write_through, d2.thin_provisioned),
            (4096, true, true)
        );
        assert_eq!(
            d2.naa.as_deref(),
            Some("0x6001405d0bc3e7a4fe0123456789abcd")
        );
        // SCST's derivations where the file sets nothing: disk02 has only
        // its NAA, so no EUI-64 is reported.
        assert_eq!(d2.vpd83.as_deref(), Some("t10,rel_port,naa,no_piv"));
        assert_eq!(d2.t10_vendor.as_deref(), Some("SCST_FIO"));
        assert_eq!(d2.t10_product.as_deref(), Some("disk02"));
        assert_eq!(d2.t10_revision.as_deref(), Some(SCST_DEFAULT_REV));
        let der = scst_derived("disk02", Handler::VdiskFileio, 0);
        assert_eq!(d2.serial.as_deref(), Some(der.usn.as_str()));
        assert_eq!(d2.t10_id.as_deref(), Some(der.t10_dev_id.as_str()));
        // disk01 sets usn, no NAA: the compat EUI-64 of its t10_dev_id.
        assert_eq!(d1.vpd83.as_deref(), Some("t10,rel_port,eui64,no_piv"));
        let t10 = scst_derived("disk01", Handler::VdiskBlockio, 0).t10_dev_id;
        assert_eq!(d1.eui64.as_deref(), Some("0x3237636464633731"));
        assert_eq!(t10, "27cddc71-disk01");
        assert_eq!(c.device("null1").unwrap().size, Some(64 << 20));
        assert_eq!(c.device("null0").unwrap().size, Some(1 << 30));
        let t = c.iscsi_target("iqn.2006-10.net.vlnb:tgt").unwrap();
        assert!(t.enabled);
        assert_eq!(t.portals, ["192.168.1.10:3260"]);
        assert_eq!(
            t.luns,
            [
                LunConfig {
                    lun: 0,
                    device: "disk01".into(),
                    read_only: false
                },
                LunConfig {
                    lun: 1,
                    device: "disk02".into(),
                    read_only: true
                },
            ]
        );
        assert_eq!(
            t.ini_groups[0].initiators,
            ["iqn.1996-04.de.suse:01:abc", "iqn.1991-05.com.microsoft:*"]
        );
        assert_eq!(t.ini_groups[0].luns[0].device, "null1");
        assert_eq!(t.incoming_users[0].user, "joe");
        assert_eq!(t.incoming_users[0].secret, "joesecret1234");
        assert_eq!(t.outgoing_user.as_ref().unwrap().secret, "tgtsecret12345");
        assert_eq!(c.iscsi.discovery_incoming_users[0].user, "disc");
        let off = c.iscsi_target("iqn.2006-10.net.vlnb:off").unwrap();
        assert!(!off.enabled);
        assert_eq!(off.portals, ["0.0.0.0:3260"]);
        assert_eq!(c.iscsi.max_burst_length, 524288);
        assert!(!c.iscsi.immediate_data);
        let w = imp.warnings.join("\n");
        for want in [
            "sets no prod_rev_lvl",
            "vcdrom is not supported",
            "o_direct",
            "HeaderDigest ignored",
            "ib_srpt",
            "LUN 2 of unknown or skipped device cd0",
            "null0 has no size",
        ] {
            assert!(w.contains(want), "warnings lack {want:?}:\n{w}");
        }
        // The result is a valid configuration that survives a JSON round trip.
        c.validate().unwrap();
        assert_eq!(&Config::from_json(&c.to_json(), "t").unwrap(), c);
    }

    #[test]
    fn syntax_errors_name_the_line() {
        for (text, line, want) in [
            (
                "HANDLER vdisk_fileio {\n DEVICE d {\n filename /x\n",
                2,
                "never closed",
            ),
            ("}\n", 1, "closes nothing"),
            (
                "HANDLER vdisk_fileio {\n DEVICE d {\n read_only maybe\n }\n}\n",
                3,
                "not a boolean",
            ),
            (
                "TARGET_DRIVER iscsi {\n TARGET iqn.2026-01.org.x:t {\n LUN x d\n }\n}\n",
                3,
                "not a number",
            ),
            (
                "TARGET_DRIVER iscsi {\n TARGET iqn.2026-01.org.x:t {\n LUN 0\n }\n}\n",
                3,
                "needs a device name",
            ),
            (
                "HANDLER vdisk_fileio {\n DEVICE d {\n t10_vendor_id \"abc\n }\n}\n",
                3,
                "unterminated",
            ),
            ("{\n", 1, "without a statement"),
        ] {
            match import_scst(text) {
                Err(ImportError::Syntax { line: l, msg }) => {
                    assert_eq!(l, line, "{text:?}: {msg}");
                    assert!(msg.contains(want), "{text:?}: {msg}");
                }
                other => panic!("{text:?}: {other:?}"),
            }
        }
        // Parses but is invalid: named as such.
        let e = import_scst(
            "HANDLER vdisk_fileio {\n DEVICE d {\n blocksize 1000\n filename /x\n }\n}\n",
        )
        .unwrap_err();
        assert!(e.to_string().contains("line 2: DEVICE d.blocksize"), "{e}");
    }

    /// Values computed with SCST's own code path (scst_vdisk.c
    /// `vdisk_gen_dev_id_num`, `vdev_create_node`), the first one the
    /// example of SCST's README (`sg_vpd -p di`: vendor specific
    /// 27cddc71-disk01, EUI-64 0x3237636464633731).
    #[test]
    fn scst_derivations() {
        assert_eq!(scst_dev_id_num("disk01", 0), 0x27cd_dc71);
        assert_eq!(scst_dev_id_num("disk1", 0), 0xb8fd_bd32);
        assert_eq!(scst_dev_id_num("disk2", 0), 0x8c1a_15ab);
        let d = scst_derived("disk1", Handler::VdiskFileio, 0x12);
        assert_eq!(d.t10_dev_id, "12b8fdbd32-disk1");
        assert_eq!(d.usn, "12b8fdbd32");
        let d = scst_derived("a-very-long-device-name", Handler::VdiskBlockio, 0);
        assert_eq!(d.t10_dev_id.len(), 25);
        assert_eq!(d.product, "a-very-long-devi");
        assert_eq!(d.vendor, "SCST_BIO");
        // A character cut by the byte limits is left out whole.
        let d = scst_derived(
            "d\u{489}\u{489}\u{489}\u{489}\u{489}\u{489}\u{489}\u{489}xyz",
            Handler::VdiskFileio,
            0,
        );
        assert!(d.t10_dev_id.len() <= 25 && d.product.len() <= 16);
        // setup_id comes before the devices, wherever the file sets it.
        let text = "HANDLER vdisk_nullio {\n DEVICE disk1 {\n size_mb 1\n }\n}\nsetup_id 0x12\n";
        let imp = import_scst(text).unwrap();
        let c = &imp.config.devices[0];
        assert_eq!(c.serial.as_deref(), Some("12b8fdbd32"));
        assert_eq!(c.t10_id.as_deref(), Some("12b8fdbd32-disk1"));
        // The compat EUI-64 is the first 8 bytes of t10_dev_id, also a
        // configured one; vend_specific_id keeps the derived one.
        let text = "HANDLER vdisk_nullio {\n DEVICE disk1 {\n size_mb 1\n t10_dev_id ab\n }\n}\n";
        let c = import_scst(text).unwrap().config.devices.remove(0);
        assert_eq!(c.eui64.as_deref(), Some("0x6162000000000000"));
        assert_eq!(c.t10_id.as_deref(), Some("b8fdbd32-disk1"));
        // Every identity attribute is carried.
        let text = "HANDLER vdisk_nullio {\n DEVICE d {\n size_mb 1\n t10_vend_id V\n \
                    prod_id P\n prod_rev_lvl R\n usn U\n vend_specific_id VS\n \
                    inq_vend_specific IQ\n naa_id 0x5000000000000001\n \
                    eui64_id 0x0011223344556677aabbccdd\n }\n}\n";
        let c = import_scst(text).unwrap().config.devices.remove(0);
        let id = c.identity();
        assert_eq!(
            (&*id.vendor, &*id.product, &*id.revision, &*id.serial),
            ("V", "P", "R", "U")
        );
        assert_eq!((&*id.t10_id, &*id.vendor_specific), ("VS", "IQ"));
        assert_eq!(id.naa, 0x5000_0000_0000_0001u64.to_be_bytes());
        assert_eq!(id.eui64.len(), 12);
        assert_eq!(c.vpd83.as_deref(), Some("t10,rel_port,eui64,naa,no_piv"));
    }

    #[test]
    fn bad_designators_name_their_line() {
        for (attr, want) in [
            ("naa_id 0x6001405d0bc3e7a4", "NAA 6 with 8 bytes"),
            ("naa_id 12", "32 hex digits of NAA 6"),
            ("eui64_id 0x00112233", "16, 24 or 32"),
            ("t10_dev_id 0123456789abcdef0123456789", "at most 25"),
            ("t10_vend_id TOOLONGVENDOR", "t10_vendor"),
        ] {
            let text =
                format!("HANDLER vdisk_nullio {{\n DEVICE d {{\n size_mb 1\n {attr}\n }}\n}}\n");
            match import_scst(&text) {
                Err(ImportError::Syntax { line, msg }) => {
                    assert!(line == 4 || line == 2, "{attr}: line {line}");
                    assert!(msg.contains(want), "{attr}: {msg}");
                }
                other => panic!("{attr}: {other:?}"),
            }
        }
    }

    #[test]
    fn scst_pr_file_becomes_saved_reservations() {
        // SCST's file for one iSCSI registrant holding WRITE EXCLUSIVE -
        // REGISTRANTS ONLY, ISID 00023d000001, key 0x1122334455667788,
        // rel_tgt_id 1 (as scst_pr_sync_device_file writes it on x86).
        let mut f = Vec::new();
        f.extend(SCST_PR_SIGNATURE.to_le_bytes());
        f.extend(1u64.to_le_bytes());
        f.extend([1, 1, 5, 0, 1]);
        let name = b"iqn.1994-05.com.redhat:abc,i,0x100003d0200\0";
        let mut tid = vec![0x45, 0, 0, 0];
        tid.extend(name);
        while tid.len() % 4 != 0 {
            tid.push(0);
        }
        let l = (tid.len() - 4) as u16;
        tid[2..4].copy_from_slice(&l.to_be_bytes());
        f.extend(&tid);
        f.extend(0x1122_3344_5566_7788u64.to_be_bytes());
        f.extend(1u16.to_le_bytes());
        assert_eq!(f.len(), 79, "the size of SCST's own file for this state");
        let path = std::path::Path::new("/var/lib/scst/pr/disk1");
        let target = |r: u16| (r == 1).then(|| "iqn.t".to_string());
        let b = import_scst_pr(&f, path, target).unwrap();
        let st = ferrite_core::pr::PrState::decode(&b).unwrap();
        assert_eq!(st.regs[0].key, 0x1122_3344_5566_7788);
        assert_eq!(
            st.regs[0].nexus.initiator_port,
            "iqn.1994-05.com.redhat:abc,i,0x00023d000001"
        );
        let res = st.res.unwrap();
        assert_eq!(
            (res.kind, res.holder.unwrap().target.as_str()),
            (5, "iqn.t")
        );
        // Truncated, unfinished, through an unknown port: named.
        for (bytes, want) in [
            (&f[..70], "truncated"),
            (&[0u8; 24][..], "did not finish"),
            (&f[..], "rel_tgt_id 1"),
        ] {
            let r = if want == "rel_tgt_id 1" {
                import_scst_pr(bytes, path, |_| None)
            } else {
                import_scst_pr(bytes, path, target)
            };
            match r {
                Err(ImportError::Json { at, msg }) => {
                    assert!(at.starts_with("/var/lib/scst/pr/disk1: byte"), "{at}");
                    assert!(msg.contains(want), "{msg}");
                }
                other => panic!("{want}: {other:?}"),
            }
        }
    }
}
