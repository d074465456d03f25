//! The JSON configuration loader (mgmt/src/config.rs): arbitrary text
//! through `Config::from_json` and `Config::validate`, as `Config::load`
//! runs them on a file.
//!
//! Invariants: no panic; a configuration that parses saves (`to_json`) to
//! text that parses to the same configuration, and one that validates
//! still validates after that round trip.
#![no_main]

use ferrite_mgmt::Config;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(cfg) = Config::from_json(text, "fuzz.json") else {
        return;
    };
    let valid = cfg.validate().is_ok();
    let back = Config::from_json(&cfg.to_json(), "saved.json").expect("saved JSON parses");
    assert_eq!(back, cfg);
    assert_eq!(back.validate().is_ok(), valid);
});
