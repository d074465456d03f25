//! `/devices/<name>` and `/handlers/<h>/mgmt`: the device attribute table
//! and the `add_device` and `del_device` commands.
//!
//! [`DEVICE_ATTRS`] has one row per device attribute: its name in the tree
//! and in `add_device`, its name in scst.conf, its description, the
//! handlers that have it, how it is read, parsed, saved and changed in the
//! running device. The tree's `ls`, `get` and `set`, `add_device`, the
//! changes between two configurations ([`crate::change`]) and the scst.conf
//! importer ([`crate::scst`]) all look attributes up here.

use super::*;
use crate::config::hex_id;
use crate::runtime::DeviceAttr;
use ferrite_core::device::{Identity, Vpd83};

/// The words of a VPD 83h layout (the default one when it is empty).
fn vpd83_words(layout: &[Vpd83]) -> String {
    let l: &[Vpd83] = if layout.is_empty() {
        &Vpd83::DEFAULT
    } else {
        layout
    };
    l.iter().map(|d| d.word()).collect::<Vec<_>>().join(",")
}

/// How a device attribute is read.
pub(crate) enum Read {
    /// From the device's configuration; the runtime (when there is one)
    /// supplies sizes the configuration does not hold, and counters.
    Value(fn(&DeviceConfig, Option<&dyn Runtime>) -> String),
    /// The LUNs that map the device.
    Exported,
    /// Not readable; `get` answers with this.
    WriteOnly(&'static str),
}

/// How `set` treats a device attribute.
pub(crate) enum Write {
    /// Fixed when the device is created; `set` answers with this.
    No(&'static str),
    /// Writing 1 re-reads the backing size.
    Resync,
    /// Changes the running device.
    Live(Live),
}

/// A device attribute the running device takes without being recreated.
pub(crate) struct Live {
    /// What the runtime changes for the device's new configuration; `None`:
    /// nothing (a fileio size no longer configured leaves the file as it is).
    pub change: fn(&DeviceConfig) -> Option<DeviceAttr>,
    /// Copies the attribute's configuration from the second device into the
    /// first.
    pub copy: fn(&mut DeviceConfig, &DeviceConfig),
    /// A handler for which the attribute is read-only, and what `set` says.
    pub fixed_for: Option<(Handler, &'static str)>,
}

/// Parses a value into a device's configuration.
pub(crate) type Parse = fn(&mut DeviceConfig, &str) -> Result<(), String>;

/// One device attribute.
pub(crate) struct DeviceAttrDef {
    /// The name in the tree, in `add_device` and in the JSON configuration.
    pub name: &'static str,
    /// The name in scst.conf, which `add_device` also accepts; `None`: not
    /// in scst.conf.
    pub scst: Option<&'static str>,
    pub desc: &'static str,
    /// Whether a device of this handler has the attribute.
    pub applies: fn(Handler) -> bool,
    pub read: Read,
    /// The `add_device` value a saved configuration carries; `None` when
    /// the attribute has its default (and for attributes that are not
    /// saved).
    pub saved: fn(&DeviceConfig) -> Option<String>,
    /// Parses an `add_device` parameter or an scst.conf value into the
    /// device; `None`: not a parameter.
    pub parse: Option<Parse>,
    /// What `set` with an empty value does: restore the default. `None`:
    /// an empty value is parsed like any other.
    pub clear: Option<fn(&mut DeviceConfig)>,
    pub write: Write,
}

impl DeviceAttrDef {
    /// Whether `set` writes the attribute of a device of handler `h`.
    pub(crate) fn writable(&self, h: Handler) -> bool {
        match &self.write {
            Write::No(_) => false,
            Write::Resync => true,
            Write::Live(l) => l.fixed_for.is_none_or(|(f, _)| f != h),
        }
    }
}

impl PartialEq for DeviceAttrDef {
    fn eq(&self, o: &DeviceAttrDef) -> bool {
        self.name == o.name
    }
}
impl Eq for DeviceAttrDef {}
impl std::fmt::Debug for DeviceAttrDef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name)
    }
}

const FIXED: &str = "read-only: del_device and add_device with the new value";

fn all(_: Handler) -> bool {
    true
}

fn unsaved(_: &DeviceConfig) -> Option<String> {
    None
}

/// A 0|1 attribute held in the `bool` field of the same name.
macro_rules! flag {
    ($f:ident, $scst:expr, $desc:expr, $applies:expr, $write:expr) => {
        DeviceAttrDef {
            name: stringify!($f),
            scst: $scst,
            desc: $desc,
            applies: $applies,
            read: Read::Value(|d, _| b01(d.$f)),
            saved: |d| d.$f.then(|| "1".to_string()),
            parse: Some(|d, v| {
                d.$f = parse_bool(v)?;
                Ok(())
            }),
            clear: None,
            write: $write,
        }
    };
}

/// A 0|1 attribute the running device takes, as runtime attribute `$attr`.
macro_rules! live_flag {
    ($f:ident, $desc:expr, $attr:path) => {
        flag!(
            $f,
            Some(stringify!($f)),
            $desc,
            all,
            Write::Live(Live {
                change: |d| Some($attr(d.$f)),
                copy: |c, n| c.$f = n.$f,
                fixed_for: None,
            })
        )
    };
}

/// An identity string held in the `Option<String>` field of the same name;
/// absent, [`DeviceConfig::identity`] derives it. `$read` picks it from the
/// identity, `$attr` makes the runtime attribute from the identity.
macro_rules! ident {
    ($f:ident, $scst:literal, $desc:expr, $read:expr, $attr:expr) => {
        DeviceAttrDef {
            name: stringify!($f),
            scst: Some($scst),
            desc: $desc,
            applies: all,
            read: Read::Value(|d, _| $read(d.identity())),
            saved: |d| d.$f.clone(),
            parse: Some(|d, v| {
                d.$f = Some(v.to_string());
                Ok(())
            }),
            clear: Some(|d| d.$f = None),
            write: Write::Live(Live {
                change: |d| Some($attr(d)),
                copy: |c, n| c.$f = n.$f.clone(),
                fixed_for: None,
            }),
        }
    };
}

/// The device attributes, in the order `ls` lists them.
pub(crate) static DEVICE_ATTRS: &[DeviceAttrDef] = &[
    DeviceAttrDef {
        name: "handler",
        scst: None,
        desc: "device handler (read-only)",
        applies: all,
        read: Read::Value(|d, _| d.handler.name().into()),
        saved: unsaved,
        parse: None,
        clear: None,
        write: Write::No("read-only"),
    },
    DeviceAttrDef {
        name: "filename",
        scst: Some("filename"),
        desc: "backing file or block device (read-only; del_device and add_device to change)",
        applies: Handler::needs_filename,
        read: Read::Value(|d, _| {
            d.filename
                .as_ref()
                .map(|f| f.display().to_string())
                .unwrap_or_default()
        }),
        saved: |d| d.filename.as_ref().map(|f| f.display().to_string()),
        parse: Some(|d, v| {
            d.filename = Some(PathBuf::from(v));
            Ok(())
        }),
        clear: None,
        write: Write::No(FIXED),
    },
    DeviceAttrDef {
        name: "size",
        scst: Some("size"),
        desc: "size in bytes; writing resizes (fileio, nullio)",
        applies: all,
        read: Read::Value(|d, rt| match (d.size, rt) {
            (Some(s), _) => s.to_string(),
            (None, Some(rt)) => rt
                .device_size(&d.name)
                .map(|s| s.to_string())
                .unwrap_or_else(|e| format!("unknown ({e})")),
            (None, None) => String::new(),
        }),
        saved: |d| d.size.map(|s| s.to_string()),
        parse: Some(|d, v| {
            d.size = Some(parse_size(v)?);
            Ok(())
        }),
        clear: None,
        write: Write::Live(Live {
            change: |d| d.size.map(DeviceAttr::Size),
            copy: |c, n| c.size = n.size,
            fixed_for: Some((
                Handler::VdiskBlockio,
                "read-only for vdisk_blockio: the size is the device's; write resync_size",
            )),
        }),
    },
    DeviceAttrDef {
        name: "blocksize",
        scst: Some("blocksize"),
        desc: "logical block size: 512 or 4096 (read-only)",
        applies: all,
        read: Read::Value(|d, _| d.blocksize.to_string()),
        saved: |d| (d.blocksize != 512).then(|| d.blocksize.to_string()),
        parse: Some(|d, v| {
            d.blocksize = v.parse().map_err(|_| format!("{v:?}; valid: 512, 4096"))?;
            Ok(())
        }),
        clear: None,
        write: Write::No(FIXED),
    },
    live_flag!(read_only, "0|1: refuse writes", DeviceAttr::ReadOnly),
    live_flag!(
        write_through,
        "0|1: complete writes only once stable",
        DeviceAttr::WriteThrough
    ),
    flag!(
        thin_provisioned,
        Some("thin_provisioned"),
        "0|1: UNMAP and WRITE SAME unmap (read-only)",
        all,
        Write::No(FIXED)
    ),
    live_flag!(
        rotational,
        "0|1: report a rotating medium (VPD B1h)",
        DeviceAttr::Rotational
    ),
    live_flag!(
        nv_cache,
        "0|1: ignore SYNCHRONIZE CACHE (battery-backed cache)",
        DeviceAttr::NvCache
    ),
    flag!(
        removable,
        Some("removable"),
        "0|1: removable medium, INQUIRY RMB; START STOP UNIT ejects and loads it (read-only)",
        all,
        Write::No(FIXED)
    ),
    flag!(
        mem,
        None,
        "0|1: keep written data in RAM (nullio; read-only)",
        |h| h == Handler::VdiskNullio,
        Write::No(FIXED)
    ),
    ident!(
        serial,
        "usn",
        "unit serial number (VPD 80h); empty restores the derived one",
        |id: Identity| id.serial,
        |d: &DeviceConfig| DeviceAttr::Serial(d.effective_serial())
    ),
    ident!(
        t10_vendor,
        "t10_vend_id",
        "INQUIRY vendor, at most 8 characters",
        |id: Identity| id.vendor,
        |d: &DeviceConfig| DeviceAttr::T10Vendor(d.identity().vendor)
    ),
    ident!(
        t10_product,
        "prod_id",
        "INQUIRY product, at most 16 characters",
        |id: Identity| id.product,
        |d: &DeviceConfig| DeviceAttr::T10Product(d.identity().product)
    ),
    ident!(
        t10_revision,
        "prod_rev_lvl",
        "INQUIRY revision, at most 4 characters",
        |id: Identity| id.revision,
        |d: &DeviceConfig| DeviceAttr::T10Revision(d.identity().revision)
    ),
    ident!(
        naa,
        "naa_id",
        "NAA designator: 16 hex digits of NAA 2, 3 or 5, or 32 of NAA 6",
        |id: Identity| hex_id(&id.naa),
        |d: &DeviceConfig| DeviceAttr::Naa(hex_id(&d.identity().naa))
    ),
    ident!(
        eui64,
        "eui64_id",
        "EUI-64 designator: 16, 24 or 32 hex digits",
        |id: Identity| hex_id(&id.eui64),
        |d: &DeviceConfig| DeviceAttr::Eui64(hex_id(&d.identity().eui64))
    ),
    ident!(
        t10_id,
        "vend_specific_id",
        "T10 vendor ID designator after the vendor; empty uses the serial",
        |id: Identity| id.t10_id,
        |d: &DeviceConfig| DeviceAttr::T10Id(d.identity().t10_id)
    ),
    ident!(
        vendor_specific,
        "inq_vend_specific",
        "INQUIRY vendor specific bytes 36..55, at most 20 characters",
        |id: Identity| id.vendor_specific,
        |d: &DeviceConfig| DeviceAttr::VendorSpecific(d.identity().vendor_specific)
    ),
    ident!(
        lu_name,
        "lu_name",
        "SCSI name string designator of the logical unit",
        |id: Identity| id.lu_name,
        |d: &DeviceConfig| DeviceAttr::LuName(d.identity().lu_name)
    ),
    ident!(
        vpd83,
        "vpd83",
        "VPD 83h designators in order: naa,t10,eui64,lu_name,rel_port,port_group=N,lu_group=N,port_name,target_name",
        |id: Identity| vpd83_words(&id.layout),
        |d: &DeviceConfig| DeviceAttr::Vpd83(d.vpd83.clone().unwrap_or_default())
    ),
    DeviceAttrDef {
        name: "resync_size",
        scst: None,
        desc: "write 1 to re-read the backing size (write-only)",
        applies: |h| h != Handler::VdiskNullio,
        read: Read::WriteOnly("write-only: set it to 1 to re-read the backing size"),
        saved: unsaved,
        parse: None,
        clear: None,
        write: Write::Resync,
    },
    DeviceAttrDef {
        name: "stats",
        scst: None,
        desc: "I/O counters (read-only)",
        applies: all,
        read: Read::Value(|d, rt| {
            let s = rt.map(|rt| rt.stats()).unwrap_or_default();
            fmt_stats(&s.devices.get(&d.name).copied().unwrap_or_default())
        }),
        saved: unsaved,
        parse: None,
        clear: None,
        write: Write::No("read-only"),
    },
    DeviceAttrDef {
        name: "exported",
        scst: None,
        desc: "where the device is mapped: target/LUN (read-only)",
        applies: all,
        read: Read::Exported,
        saved: unsaved,
        parse: None,
        clear: None,
        write: Write::No("read-only"),
    },
];

/// Usage of `/handlers/<h>/mgmt`.
pub const HANDLER_USAGE: &str = "\
add_device NAME [filename=PATH;] [size=BYTES[K|M|G|T];] [blocksize=512|4096;] [read_only=0|1;]
           [write_through=0|1;] [thin_provisioned=0|1;] [rotational=0|1;] [nv_cache=0|1;]
           [removable=0|1;] [mem=0|1 (nullio);] [serial=S;] [t10_vendor=S;] [t10_product=S;] [t10_revision=S;]
           [naa=16HEX;] [eui64=16HEX]
del_device NAME";

/// The attribute named `name` in the tree.
pub(crate) fn device_attr(name: &str) -> Option<&'static DeviceAttrDef> {
    DEVICE_ATTRS.iter().find(|a| a.name == name)
}

/// The attribute an scst.conf device attribute sets.
pub(crate) fn device_attr_by_scst_name(name: &str) -> Option<&'static DeviceAttrDef> {
    DEVICE_ATTRS.iter().find(|a| a.scst == Some(name))
}

/// `add_device` parameters: every attribute that parses, by its name and
/// its scst.conf name, and `size_mb` (the size in MiB).
fn add_device_params() -> Vec<&'static str> {
    let mut out = Vec::new();
    for a in DEVICE_ATTRS.iter().filter(|a| a.parse.is_some()) {
        out.push(a.name);
        if let Some(s) = a.scst.filter(|s| *s != a.name) {
            out.push(s);
        }
        if a.name == "size" {
            out.push("size_mb");
        }
    }
    out
}

/// Parses a size in MiB (`size_mb` in `add_device` and scst.conf) into bytes.
pub(crate) fn parse_size_mb(v: &str) -> Result<u64, String> {
    let mb: u64 = v.parse().map_err(|_| format!("{v:?} is not a number"))?;
    mb.checked_mul(1 << 20)
        .ok_or_else(|| "too large".to_string())
}

/// The value of a device attribute; `rt` supplies sizes the model does not
/// hold and counters. `None` for attributes that cannot be read from the
/// device alone.
pub(crate) fn device_attr_value(
    d: &DeviceConfig,
    attr: &str,
    rt: Option<&dyn Runtime>,
) -> Option<String> {
    match device_attr(attr)?.read {
        Read::Value(f) => Some(f(d, rt)),
        Read::Exported | Read::WriteOnly(_) => None,
    }
}

impl Tree {
    /// Reads attribute `a` of device `name` (at `path`).
    pub(super) fn get_device_attr(
        &self,
        name: &str,
        a: &DeviceAttrDef,
        path: &str,
    ) -> Result<AttrValue, MgmtError> {
        let d = self
            .cfg
            .device(name)
            .ok_or_else(|| MgmtError::Refused(format!("no device {name:?}")))?;
        let value = match a.read {
            Read::Value(f) => f(d, Some(&*self.rt)),
            Read::Exported => self.exported(name).join("\n"),
            Read::WriteOnly(msg) => {
                return Err(MgmtError::NotWritable {
                    path: path.into(),
                    msg: msg.into(),
                });
            }
        };
        Ok(AttrValue {
            value,
            key: (a.saved)(d).is_some(),
            writable: a.writable(d.handler),
            description: a.desc.into(),
        })
    }

    /// The change writing `value` to attribute `a` of device `name` (at
    /// `path`) makes; `None` if the value is the one the device has.
    pub(super) fn device_attr_change(
        &self,
        name: &str,
        a: &DeviceAttrDef,
        value: &str,
        path: &str,
    ) -> Result<Option<Change>, MgmtError> {
        let bad = |msg: String| MgmtError::Refused(format!("{path}: {msg}"));
        let not_writable = |msg: &str| MgmtError::NotWritable {
            path: path.into(),
            msg: msg.into(),
        };
        let old = self
            .cfg
            .device(name)
            .cloned()
            .ok_or_else(|| bad("no such device".into()))?;
        match &a.write {
            Write::No(msg) => return Err(not_writable(msg)),
            Write::Live(Live {
                fixed_for: Some((h, msg)),
                ..
            }) if *h == old.handler => return Err(not_writable(msg)),
            Write::Resync => {
                if parse_bool(value).map_err(bad)? {
                    return Ok(Some(Change::ResyncSize { name: name.into() }));
                }
                return Err(bad("write 1 to re-read the size".into()));
            }
            Write::Live(_) => {}
        }
        let mut new = old.clone();
        match (a.clear, a.parse) {
            (Some(clear), _) if value.is_empty() => clear(&mut new),
            (_, Some(parse)) => parse(&mut new, value).map_err(bad)?,
            (_, None) => return Err(not_writable("read-only")),
        }
        new.validate("").map_err(|e| match e {
            ConfigError::Invalid { msg, .. } => bad(msg),
            other => MgmtError::Config(other),
        })?;
        Ok(device_attr_changes(&old, &new).into_iter().next())
    }

    /// `target/LUN` and `target/group/LUN` entries mapping `device`.
    pub fn exported(&self, device: &str) -> Vec<String> {
        let mut out = Vec::new();
        for t in &self.cfg.targets.iscsi {
            for l in t.luns.iter().filter(|l| l.device == device) {
                out.push(format!("{}/luns/{}", t.name, l.lun));
            }
            for g in &t.ini_groups {
                for l in g.luns.iter().filter(|l| l.device == device) {
                    out.push(format!("{}/ini_groups/{}/luns/{}", t.name, g.name, l.lun));
                }
            }
        }
        for t in &self.cfg.targets.srp {
            for l in t.luns.iter().filter(|l| l.device == device) {
                out.push(format!("srp/{}/luns/{}", t.name, l.lun));
            }
            for g in &t.ini_groups {
                for l in g.luns.iter().filter(|l| l.device == device) {
                    out.push(format!(
                        "srp/{}/ini_groups/{}/luns/{}",
                        t.name, g.name, l.lun
                    ));
                }
            }
        }
        out
    }
}

impl Tree {
    pub(super) fn handler_cmd(&self, h: Handler, command: &str) -> Result<Change, MgmtError> {
        let u = HANDLER_USAGE;
        let cmd = parse_cmd(command, u)?;
        match cmd.words[0].as_str() {
            "add_device" => {
                cmd.arity(2, &add_device_params(), u)?;
                let name = &cmd.words[1];
                validate_object_name(name).map_err(|m| usage_err(m, u))?;
                if let Some(d) = self.cfg.device(name) {
                    return Err(MgmtError::Refused(format!(
                        "device {name:?} already exists (handler {})",
                        d.handler
                    )));
                }
                let mut d = DeviceConfig::new(name.clone(), h);
                for (k, v) in &cmd.params {
                    let pe = |m: String| usage_err(format!("parameter {k}: {m}"), u);
                    if k == "size_mb" {
                        d.size = Some(parse_size_mb(v).map_err(pe)?);
                        continue;
                    }
                    let parse = DEVICE_ATTRS
                        .iter()
                        .find(|a| a.name == k || a.scst == Some(k.as_str()))
                        .and_then(|a| a.parse);
                    if let Some(parse) = parse {
                        parse(&mut d, v).map_err(pe)?;
                    }
                }
                d.validate("").map_err(|e| match e {
                    ConfigError::Invalid { at, msg } => usage_err(
                        format!("parameter {}: {msg}", at.trim_start_matches('.')),
                        u,
                    ),
                    other => MgmtError::Config(other),
                })?;
                Ok(Change::AddDevice(Box::new(d)))
            }
            "del_device" => {
                cmd.arity(2, &[], u)?;
                let name = &cmd.words[1];
                match self.cfg.device(name) {
                    None => Err(MgmtError::Refused(format!(
                        "no device {name:?}; {}",
                        names_hint(
                            "devices",
                            self.cfg
                                .devices
                                .iter()
                                .filter(|d| d.handler == h)
                                .map(|d| &d.name)
                        )
                    ))),
                    Some(d) if d.handler != h => Err(MgmtError::Refused(format!(
                        "device {name:?} belongs to handler {}",
                        d.handler
                    ))),
                    Some(_) => {
                        let used = self.exported(name);
                        if !used.is_empty() {
                            return Err(MgmtError::Refused(format!(
                                "device {name:?} is in use by {}; remove those LUNs first",
                                used.join(", ")
                            )));
                        }
                        Ok(Change::DelDevice {
                            handler: h,
                            name: name.clone(),
                        })
                    }
                }
            }
            other => Err(usage_err(format!("unknown command {other:?}"), u)),
        }
    }
}
