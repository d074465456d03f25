//! The crate layout ARCHITECTURE.md promises, checked from the Cargo.toml
//! files: backends are peers, so no backend crate (`backends/*`) depends
//! on another (their shared io_uring data plane is `crates/blockq`). A
//! backend may name another under `[dev-dependencies]`, for tests and
//! examples only.

use std::path::{Path, PathBuf};

/// The repository's root (this crate is `tests/`).
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ has a parent")
        .to_path_buf()
}

/// The keys of table `[table]` of a Cargo.toml text.
fn table_keys(toml: &str, table: &str) -> Vec<String> {
    let header = format!("[{table}]");
    let mut inside = false;
    let mut keys = Vec::new();
    for line in toml.lines() {
        let l = line.trim();
        if l.starts_with('[') {
            inside = l == header;
            continue;
        }
        if inside
            && !l.starts_with('#')
            && let Some((k, _)) = l.split_once('=')
        {
            keys.push(k.trim().to_string());
        }
    }
    keys
}

/// `name = "..."` of the `[package]` table.
fn package_name(toml: &str) -> Option<String> {
    let mut inside = false;
    for line in toml.lines() {
        let l = line.trim();
        if l.starts_with('[') {
            inside = l == "[package]";
            continue;
        }
        if inside && let Some(v) = l.strip_prefix("name") {
            return Some(
                v.trim_start()
                    .trim_start_matches('=')
                    .trim()
                    .trim_matches('"')
                    .to_string(),
            );
        }
    }
    None
}

#[test]
fn no_backend_crate_depends_on_another() {
    let dir = root().join("backends");
    let mut backends = Vec::new();
    for e in std::fs::read_dir(&dir).expect("backends/") {
        let p = e.expect("entry").path().join("Cargo.toml");
        if let Ok(text) = std::fs::read_to_string(&p) {
            let name =
                package_name(&text).unwrap_or_else(|| panic!("{}: no package name", p.display()));
            backends.push((name, p, text));
        }
    }
    assert!(
        backends.len() >= 3,
        "found only {} backends in {}",
        backends.len(),
        dir.display()
    );
    for (name, path, text) in &backends {
        for dep in table_keys(text, "dependencies") {
            let dep = dep.split('.').next().unwrap_or_default().to_string();
            assert!(
                !backends
                    .iter()
                    .any(|(other, _, _)| *other == dep && other != name),
                "{}: backend {name} depends on backend {dep}",
                path.display()
            );
        }
    }
}

#[test]
fn the_parser_reads_what_cargo_reads() {
    let t = "[package]\nname = \"x\"\n\n[dependencies]\na.workspace = true\nb = \"1\"\n# c = 1\n\n[dev-dependencies]\nd = \"1\"\n";
    assert_eq!(package_name(t).as_deref(), Some("x"));
    assert_eq!(table_keys(t, "dependencies"), ["a.workspace", "b"]);
    assert_eq!(table_keys(t, "dev-dependencies"), ["d"]);
}
