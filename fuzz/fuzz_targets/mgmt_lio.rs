//! The saveconfig.json and APTPL importers (mgmt/src/lio.rs): arbitrary
//! text through `import_lio` and `import_lio_aptpl`.
//!
//! Invariants: no panic; what imports is a configuration that validates
//! and survives a JSON round trip unchanged; imported reservations are
//! state the core reads back.
#![no_main]

use ferrite_mgmt::lio::import_lio_aptpl;
use ferrite_mgmt::{Config, import_lio};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(b) = import_lio_aptpl(text, std::path::Path::new("aptpl")) {
        assert!(b.is_empty() || ferrite_core::pr::PrState::decode(&b).is_some());
    }
    let Ok(import) = import_lio(text) else {
        return;
    };
    if let Err(e) = import.config.validate() {
        panic!("imported an invalid configuration: {e}");
    }
    let back = Config::from_json(&import.config.to_json(), "imported.json").expect("parses");
    assert_eq!(back, import.config);
});
