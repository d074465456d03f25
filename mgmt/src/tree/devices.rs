//! `/devices/<name>` and `/handlers/<h>/mgmt`: device attributes and the
//! `add_device` and `del_device` commands.

use super::*;

pub(super) const DEVICE_ATTRS: &[AttrDef] = &[
    AttrDef {
        name: "handler",
        desc: "device handler (read-only)",
    },
    AttrDef {
        name: "filename",
        desc: "backing file or block device (read-only; del_device and add_device to change)",
    },
    AttrDef {
        name: "size",
        desc: "size in bytes; writing resizes (fileio, nullio)",
    },
    AttrDef {
        name: "blocksize",
        desc: "logical block size: 512 or 4096 (read-only)",
    },
    AttrDef {
        name: "read_only",
        desc: "0|1: refuse writes",
    },
    AttrDef {
        name: "write_through",
        desc: "0|1: complete writes only once stable",
    },
    AttrDef {
        name: "thin_provisioned",
        desc: "0|1: UNMAP and WRITE SAME unmap (read-only)",
    },
    AttrDef {
        name: "rotational",
        desc: "0|1: report a rotating medium (VPD B1h)",
    },
    AttrDef {
        name: "nv_cache",
        desc: "0|1: ignore SYNCHRONIZE CACHE (battery-backed cache)",
    },
    AttrDef {
        name: "removable",
        desc: "0|1: removable medium, INQUIRY RMB; START STOP UNIT ejects and loads it (read-only)",
    },
    AttrDef {
        name: "mem",
        desc: "0|1: keep written data in RAM (nullio; read-only)",
    },
    AttrDef {
        name: "serial",
        desc: "unit serial number (VPD 80h); empty restores the derived one",
    },
    AttrDef {
        name: "t10_vendor",
        desc: "INQUIRY vendor, at most 8 characters",
    },
    AttrDef {
        name: "t10_product",
        desc: "INQUIRY product, at most 16 characters",
    },
    AttrDef {
        name: "t10_revision",
        desc: "INQUIRY revision, at most 4 characters",
    },
    AttrDef {
        name: "naa",
        desc: "NAA IEEE Registered id, 16 hex digits starting with 5",
    },
    AttrDef {
        name: "eui64",
        desc: "EUI-64 id, 16 hex digits",
    },
    AttrDef {
        name: "resync_size",
        desc: "write 1 to re-read the backing size (write-only)",
    },
    AttrDef {
        name: "stats",
        desc: "I/O counters (read-only)",
    },
    AttrDef {
        name: "exported",
        desc: "where the device is mapped: target/LUN (read-only)",
    },
];

/// Usage of `/handlers/<h>/mgmt`.
pub const HANDLER_USAGE: &str = "\
add_device NAME [filename=PATH;] [size=BYTES[K|M|G|T];] [blocksize=512|4096;] [read_only=0|1;]
           [write_through=0|1;] [thin_provisioned=0|1;] [rotational=0|1;] [nv_cache=0|1;]
           [removable=0|1;] [mem=0|1 (nullio);] [serial=S;] [t10_vendor=S;] [t10_product=S;] [t10_revision=S;]
           [naa=16HEX;] [eui64=16HEX]
del_device NAME";

/// Which device attributes a handler has.
pub(super) fn device_attr_applies(h: Handler, name: &str) -> bool {
    match name {
        "filename" => h.needs_filename(),
        "mem" => h == Handler::VdiskNullio,
        "resync_size" => h != Handler::VdiskNullio,
        _ => true,
    }
}

pub(super) fn device_attr_writable(h: Handler, name: &str) -> bool {
    match name {
        "size" => h != Handler::VdiskBlockio,
        "read_only" | "write_through" | "rotational" | "nv_cache" | "serial" | "t10_vendor"
        | "t10_product" | "t10_revision" | "naa" | "eui64" | "resync_size" => true,
        _ => false,
    }
}

/// The value of a device attribute; `rt` supplies sizes the model does not
/// hold and counters. `None` for attributes that cannot be read.
pub(crate) fn device_attr_value(
    d: &DeviceConfig,
    attr: &str,
    rt: Option<&dyn Runtime>,
) -> Option<String> {
    let id = d.identity();
    Some(match attr {
        "handler" => d.handler.name().into(),
        "filename" => d
            .filename
            .as_ref()
            .map(|f| f.display().to_string())
            .unwrap_or_default(),
        "size" => match (d.size, rt) {
            (Some(s), _) => s.to_string(),
            (None, Some(rt)) => rt
                .device_size(&d.name)
                .map(|s| s.to_string())
                .unwrap_or_else(|e| format!("unknown ({e})")),
            (None, None) => String::new(),
        },
        "blocksize" => d.blocksize.to_string(),
        "read_only" => b01(d.read_only),
        "write_through" => b01(d.write_through),
        "thin_provisioned" => b01(d.thin_provisioned),
        "rotational" => b01(d.rotational),
        "nv_cache" => b01(d.nv_cache),
        "removable" => b01(d.removable),
        "mem" => b01(d.mem),
        "serial" => id.serial,
        "t10_vendor" => id.vendor,
        "t10_product" => id.product,
        "t10_revision" => id.revision,
        "naa" => format!("0x{:016x}", id.naa),
        "eui64" => format!("0x{:016x}", id.eui64),
        "stats" => {
            let s = rt.map(|rt| rt.stats()).unwrap_or_default();
            fmt_stats(&s.devices.get(&d.name).copied().unwrap_or_default())
        }
        _ => return None,
    })
}

pub(super) fn device_attr_key(d: &DeviceConfig, attr: &str) -> bool {
    match attr {
        "filename" => d.filename.is_some(),
        "size" => d.size.is_some(),
        "blocksize" => d.blocksize != 512,
        "read_only" => d.read_only,
        "write_through" => d.write_through,
        "thin_provisioned" => d.thin_provisioned,
        "rotational" => d.rotational,
        "nv_cache" => d.nv_cache,
        "removable" => d.removable,
        "mem" => d.mem,
        "serial" => d.serial.is_some(),
        "t10_vendor" => d.t10_vendor.is_some(),
        "t10_product" => d.t10_product.is_some(),
        "t10_revision" => d.t10_revision.is_some(),
        "naa" => d.naa.is_some(),
        "eui64" => d.eui64.is_some(),
        _ => false,
    }
}

impl Tree {
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
                const ALLOWED: &[&str] = &[
                    "filename",
                    "size",
                    "size_mb",
                    "blocksize",
                    "read_only",
                    "write_through",
                    "thin_provisioned",
                    "rotational",
                    "nv_cache",
                    "removable",
                    "mem",
                    "serial",
                    "usn",
                    "t10_vendor",
                    "t10_vendor_id",
                    "t10_product",
                    "prod_id",
                    "t10_revision",
                    "prod_rev_lvl",
                    "naa",
                    "naa_id",
                    "eui64",
                    "eui64_id",
                ];
                cmd.arity(2, ALLOWED, u)?;
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
                    let opt = || Some(v.clone());
                    match k.as_str() {
                        "filename" => d.filename = Some(PathBuf::from(v)),
                        "size" => d.size = Some(parse_size(v).map_err(pe)?),
                        "size_mb" => {
                            let mb: u64 = v
                                .parse()
                                .map_err(|_| pe(format!("{v:?} is not a number")))?;
                            d.size = Some(
                                mb.checked_mul(1 << 20)
                                    .ok_or_else(|| pe("too large".into()))?,
                            );
                        }
                        "blocksize" => {
                            d.blocksize = v
                                .parse()
                                .map_err(|_| pe(format!("{v:?}; valid: 512, 4096")))?
                        }
                        "read_only" => d.read_only = parse_bool(v).map_err(pe)?,
                        "write_through" => d.write_through = parse_bool(v).map_err(pe)?,
                        "thin_provisioned" => d.thin_provisioned = parse_bool(v).map_err(pe)?,
                        "rotational" => d.rotational = parse_bool(v).map_err(pe)?,
                        "nv_cache" => d.nv_cache = parse_bool(v).map_err(pe)?,
                        "removable" => d.removable = parse_bool(v).map_err(pe)?,
                        "mem" => d.mem = parse_bool(v).map_err(pe)?,
                        "serial" | "usn" => d.serial = opt(),
                        "t10_vendor" | "t10_vendor_id" => d.t10_vendor = opt(),
                        "t10_product" | "prod_id" => d.t10_product = opt(),
                        "t10_revision" | "prod_rev_lvl" => d.t10_revision = opt(),
                        "naa" | "naa_id" => d.naa = opt(),
                        _ => d.eui64 = opt(),
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
