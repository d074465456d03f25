//! The management command language: the lines ferritectl and the control
//! socket send, against the object tree (mgmt/src/tree.rs) of the embedded
//! default configuration with a runtime that runs nothing. A line is either
//! a control-socket request (JSON, through `server::handle`) or
//! `do PATH COMMAND`, `set PATH VALUE`, `get PATH`, `ls PATH` as ferritectl
//! takes them. `save` requests are skipped (they write files).
//!
//! Invariants: no panic; after every line the tree's configuration
//! validates and survives a JSON round trip unchanged.
#![no_main]

use std::path::Path;
use std::sync::{Arc, Mutex};

use ferrite_mgmt::server::{self, Request};
use ferrite_mgmt::{Config, FakeRuntime, Tree};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let cfg = Config::embedded_default(
        Path::new("/var/lib/ferrite-fuzz"),
        "127.0.0.1:3260".parse().expect("address"),
    );
    let tree = Mutex::new(Tree::new(cfg, Arc::new(FakeRuntime::new()), None));
    for line in text.lines().take(64) {
        if line.starts_with('{') {
            match serde_json::from_str::<Request>(line) {
                Ok(Request::Save { .. }) | Err(_) => {}
                Ok(req) => drop(server::handle(&tree, req)),
            }
        } else {
            let (verb, rest) = line.split_once(' ').unwrap_or((line, ""));
            let (path, arg) = rest.split_once(' ').unwrap_or((rest, ""));
            let mut t = tree.lock().expect("tree");
            let _ = match verb {
                "do" => t.run(path, arg).map(drop),
                "set" => t.set(path, arg).map(drop),
                "get" => t.get(path).map(drop),
                "ls" => t.ls(path).map(drop),
                _ => Ok(()),
            };
        }
        let t = tree.lock().expect("tree");
        let cfg = t.config();
        if let Err(e) = cfg.validate() {
            panic!("the tree adopted an invalid configuration after {line:?}: {e}");
        }
        let back = Config::from_json(&cfg.to_json(), "tree").expect("the tree's JSON parses");
        assert_eq!(&back, cfg, "JSON round trip after {line:?}");
    }
});
