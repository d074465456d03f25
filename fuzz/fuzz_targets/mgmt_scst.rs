//! The scst.conf importer (mgmt/src/scst.rs): arbitrary text through
//! `import_scst`.
//!
//! Invariants: no panic; what imports is a configuration that validates
//! and survives a JSON round trip unchanged.
#![no_main]

use ferrite_mgmt::{Config, import_scst};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(import) = import_scst(text) else {
        return;
    };
    if let Err(e) = import.config.validate() {
        panic!("imported an invalid configuration: {e}");
    }
    let back = Config::from_json(&import.config.to_json(), "imported.json").expect("parses");
    assert_eq!(back, import.config);
});
