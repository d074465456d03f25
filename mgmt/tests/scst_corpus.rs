//! import-scst on a corpus of scst.conf files as appliances and
//! distributions write them (`tests/scst-corpus/`): every identity attribute
//! a file sets comes out as the identity the device reports, every one it
//! leaves out as SCST's own derivation, `rel_tgt_id` as the target's
//! relative port, and all of it survives the JSON round trip.

use std::collections::BTreeMap;

use ferrite_mgmt::Config;
use ferrite_mgmt::config::hex_id;
use ferrite_mgmt::scst::{SCST_DEFAULT_REV, import_scst, scst_derived};

/// `DEVICE name { key value }` and `setup_id`, read naively: what the file
/// says, to hold the importer to.
fn attrs(text: &str) -> (u32, BTreeMap<String, BTreeMap<String, String>>) {
    let mut out: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
    let mut dev: Option<String> = None;
    let mut setup = 0;
    for l in text.lines().map(str::trim) {
        if l.starts_with('#') || l.is_empty() {
            continue;
        }
        if let Some(v) = l.strip_prefix("setup_id ") {
            setup = u32::from_str_radix(v.trim_start_matches("0x"), 16)
                .unwrap_or_else(|_| panic!("setup_id {v:?}"));
        } else if let Some(rest) = l.strip_prefix("DEVICE ") {
            let name = rest.trim_end_matches('{').trim().to_string();
            out.entry(name.clone()).or_default();
            dev = Some(name);
        } else if l == "}" {
            dev = None;
        } else if let (Some(d), Some((k, v))) = (&dev, l.split_once(char::is_whitespace))
            && let Some(m) = out.get_mut(d)
        {
            m.insert(k.to_string(), v.trim().trim_matches('"').to_string());
        }
    }
    (setup, out)
}

#[test]
fn identity_round_trips_through_import() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/scst-corpus");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    assert!(files.len() >= 3, "{files:?}");
    for f in files {
        let text = std::fs::read_to_string(&f).unwrap();
        let imp = import_scst(&text).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
        let (setup, want) = attrs(&text);
        let back = Config::from_json(&imp.config.to_json(), "back").unwrap();
        assert_eq!(back, imp.config, "{}", f.display());
        for (name, a) in &want {
            let d = imp
                .config
                .device(name)
                .unwrap_or_else(|| panic!("{}: {name}", f.display()));
            let id = d.identity();
            let der = scst_derived(name, d.handler, setup);
            let get = |k: &str| a.get(k).cloned();
            let at = format!("{}: {name}", f.display());
            assert_eq!(
                id.vendor,
                get("t10_vend_id").unwrap_or(der.vendor.into()),
                "{at}"
            );
            assert_eq!(
                id.product,
                get("prod_id").unwrap_or(der.product.clone()),
                "{at}"
            );
            assert_eq!(
                id.revision,
                get("prod_rev_lvl").unwrap_or(SCST_DEFAULT_REV.into()),
                "{at}"
            );
            assert_eq!(id.serial, get("usn").unwrap_or(der.usn.clone()), "{at}");
            // vend_specific_id is the T10 designator's identifier; it stays
            // the derived t10_dev_id when only t10_dev_id is set.
            assert_eq!(
                id.t10_id,
                get("vend_specific_id").unwrap_or(der.t10_dev_id.clone()),
                "{at}"
            );
            assert_eq!(
                id.vendor_specific,
                get("inq_vend_specific").unwrap_or_default(),
                "{at}"
            );
            if let Some(n) = get("naa_id") {
                assert_eq!(hex_id(&id.naa), n.to_ascii_lowercase(), "{at}");
                assert!(d.vpd83.as_deref().unwrap().contains("naa"), "{at}");
            } else {
                assert!(!d.vpd83.as_deref().unwrap().contains("naa"), "{at}");
            }
            match get("eui64_id") {
                Some(e) => assert_eq!(hex_id(&id.eui64), e.to_ascii_lowercase(), "{at}"),
                // SCST's EUI-64 without NAA: the first 8 bytes of t10_dev_id.
                None if get("naa_id").is_none() => {
                    let t10 = get("t10_dev_id").unwrap_or(der.t10_dev_id.clone());
                    let mut b = [0u8; 8];
                    for (x, c) in b.iter_mut().zip(t10.bytes()) {
                        *x = c;
                    }
                    assert_eq!(id.eui64, b, "{at}");
                }
                None => assert!(!d.vpd83.as_deref().unwrap().contains("eui64"), "{at}"),
            }
        }
        for t in &imp.config.targets.iscsi {
            let line = text
                .lines()
                .skip_while(|l| !l.contains(&format!("TARGET {}", t.name)))
                .take_while(|l| l.trim() != "}")
                .find_map(|l| l.trim().strip_prefix("rel_tgt_id ").map(str::to_string));
            assert_eq!(t.rel_tgt_id, line.map(|v| v.parse().unwrap()), "{}", t.name);
        }
    }
}
