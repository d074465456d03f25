//! The crate layout ARCHITECTURE.md promises, checked from the Cargo.toml
//! files and the sources: backends are peers, so no backend crate
//! (`backends/*`) depends on another (their shared io_uring data plane is
//! `crates/blockq`; a backend may name another under `[dev-dependencies]`,
//! for tests and examples only); and `crates/daemon` composes fabrics
//! without speaking their protocols, so it names no module of iSCSI PDUs
//! (`ferrite_iscsi::pdu`) or SRP information units (`ferrite_srp::iu`).

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

/// The wire-format modules the daemon must not name: a fabric's PDUs or
/// IUs stay inside the fabric crate.
const WIRE_MODULES: [(&str, &str); 2] = [("ferrite_iscsi", "pdu"), ("ferrite_srp", "iu")];

/// Where `text` names `krate::module`, directly (`krate::module::X`) or in
/// a use group (`krate::{a, module::X}`): the line numbers (from 1).
fn names_module(text: &str, krate: &str, module: &str) -> Vec<usize> {
    let prefix = format!("{krate}::");
    let mut hits = Vec::new();
    let is_ident = |c: char| c.is_ascii_alphanumeric() || c == '_';
    let mut at = 0;
    while let Some(i) = text[at..].find(&prefix) {
        let start = at + i + prefix.len();
        at = start;
        let rest = &text[start..];
        let names = if let Some(group) = rest.strip_prefix('{') {
            // Top-level entries of the group: `module`, `module::..`,
            // `module as x`.
            let end = group.find('}').unwrap_or(group.len());
            group[..end].split(',').any(|e| {
                let e = e.trim();
                e.strip_prefix(module)
                    .is_some_and(|r| r.is_empty() || r.starts_with("::") || r.starts_with(' '))
            })
        } else {
            rest.strip_prefix(module)
                .is_some_and(|r| !r.starts_with(is_ident))
        };
        if names {
            hits.push(text[..start].matches('\n').count() + 1);
        }
    }
    hits
}

/// Every `.rs` file under `dir`.
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let p = e.expect("entry").path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

#[test]
fn the_daemon_names_no_pdu_or_iu_type() {
    let mut files = Vec::new();
    rust_files(&root().join("crates/daemon/src"), &mut files);
    assert!(
        files.len() >= 5,
        "found only {} daemon sources",
        files.len()
    );
    let mut found = Vec::new();
    for f in &files {
        let text = std::fs::read_to_string(f).expect("source");
        for (krate, module) in WIRE_MODULES {
            for line in names_module(&text, krate, module) {
                found.push(format!("{}:{line}: {krate}::{module}", f.display()));
            }
        }
    }
    assert!(
        found.is_empty(),
        "crates/daemon names protocol types of a fabric:\n{}",
        found.join("\n")
    );
}

#[test]
fn the_scanner_finds_a_module_named_any_way() {
    let m = |t: &str| names_module(t, "ferrite_srp", "iu");
    assert_eq!(m("use ferrite_srp::iu;"), [1]);
    assert_eq!(m("x\nuse ferrite_srp::iu::LoginReq;"), [2]);
    assert_eq!(m("use ferrite_srp::{channel, iu::{self, Rsp}};"), [1]);
    assert_eq!(m("use ferrite_srp::{iu as wire};"), [1]);
    assert_eq!(m("let r = ferrite_srp::iu::Rsp::parse(b);"), [1]);
    assert!(m("use ferrite_srp::initiator;").is_empty());
    assert!(m("use ferrite_srp::{driver, target::TargetConn};").is_empty());
    assert!(m("use ferrite_srp::iuxyz;").is_empty());
}
