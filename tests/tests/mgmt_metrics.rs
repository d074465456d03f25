//! The Prometheus listener of a running ferrited (`--metrics ADDR:PORT`):
//! after real I/O, `GET /metrics` (fetched with curl) is well-formed text
//! exposition, carries the device's counters and its latency histograms, and
//! other paths get 404.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed step is a failed test

mod mgmt_util;

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;
use std::time::Duration;

use ferrite_tests::{free_port, require_tool, run_with_timeout};
use mgmt_util::{Daemon, empty_config, login, portal, scsi};

const T: &str = "iqn.2026-11.org.ferrite.test:metrics";

/// One sample: name, labels, value.
type Sample = (String, BTreeMap<String, String>, f64);

/// Parses the text exposition format: `# HELP name text`, `# TYPE name
/// kind` (once per family, before its samples), and sample lines
/// `name{label="value",...} value`. Returns the samples and the declared
/// types, or what is wrong with which line.
fn parse(text: &str) -> Result<(Vec<Sample>, BTreeMap<String, String>), String> {
    let mut types: BTreeMap<String, String> = BTreeMap::new();
    let mut helps: BTreeSet<String> = BTreeSet::new();
    let mut samples = Vec::new();
    let name_ok = |n: &str| {
        !n.is_empty()
            && n.chars().enumerate().all(|(i, c)| {
                c.is_ascii_alphabetic() || c == '_' || c == ':' || (i > 0 && c.is_ascii_digit())
            })
    };
    for (no, line) in text.lines().enumerate() {
        let no = no + 1;
        if line.is_empty() {
            continue;
        }
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let name = rest.split(' ').next().unwrap_or("");
            if !name_ok(name) || !helps.insert(name.to_string()) {
                return Err(format!("line {no}: bad or repeated HELP: {line}"));
            }
            continue;
        }
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let mut w = rest.split(' ');
            let (name, kind) = (w.next().unwrap_or(""), w.next().unwrap_or(""));
            if !name_ok(name)
                || !["counter", "gauge", "histogram", "summary", "untyped"].contains(&kind)
                || w.next().is_some()
            {
                return Err(format!("line {no}: bad TYPE: {line}"));
            }
            if types.insert(name.to_string(), kind.to_string()).is_some() {
                return Err(format!("line {no}: TYPE repeated: {line}"));
            }
            continue;
        }
        if line.starts_with('#') {
            continue;
        }
        let (name, rest) = match line.find(['{', ' ']) {
            Some(i) => (&line[..i], &line[i..]),
            None => return Err(format!("line {no}: no value: {line}")),
        };
        if !name_ok(name) {
            return Err(format!("line {no}: bad metric name {name:?}"));
        }
        let mut labels = BTreeMap::new();
        let value_text = if let Some(body) = rest.strip_prefix('{') {
            let mut chars = body.char_indices().peekable();
            let end: usize;
            loop {
                // label name
                let start = chars.peek().map(|(i, _)| *i).unwrap_or(body.len());
                let mut key_end = start;
                while let Some((i, c)) = chars.peek().copied() {
                    if c == '=' || c == '}' {
                        key_end = i;
                        break;
                    }
                    chars.next();
                }
                match chars.next() {
                    Some((i, '}')) if i == start => {
                        end = i;
                        break;
                    }
                    Some((_, '=')) => {}
                    _ => return Err(format!("line {no}: bad label list: {line}")),
                }
                let key = &body[start..key_end];
                if !name_ok(key) {
                    return Err(format!("line {no}: bad label name {key:?}"));
                }
                if chars.next().map(|(_, c)| c) != Some('"') {
                    return Err(format!("line {no}: label value not quoted: {line}"));
                }
                let mut val = String::new();
                loop {
                    match chars.next() {
                        Some((_, '\\')) => match chars.next() {
                            Some((_, 'n')) => val.push('\n'),
                            Some((_, c @ ('\\' | '"'))) => val.push(c),
                            _ => return Err(format!("line {no}: bad escape: {line}")),
                        },
                        Some((_, '"')) => break,
                        Some((_, c)) => val.push(c),
                        None => return Err(format!("line {no}: unterminated value: {line}")),
                    }
                }
                if labels.insert(key.to_string(), val).is_some() {
                    return Err(format!("line {no}: label {key} repeated"));
                }
                match chars.next() {
                    Some((_, ',')) => {}
                    Some((i, '}')) => {
                        end = i;
                        break;
                    }
                    _ => return Err(format!("line {no}: bad label list: {line}")),
                }
            }
            &body[end + 1..]
        } else {
            rest
        };
        let value_text = value_text
            .strip_prefix(' ')
            .ok_or_else(|| format!("line {no}: no space before the value: {line}"))?;
        let value: f64 = match value_text {
            "+Inf" => f64::INFINITY,
            "-Inf" => f64::NEG_INFINITY,
            "NaN" => f64::NAN,
            v => v
                .parse()
                .map_err(|_| format!("line {no}: value {v:?} is not a number"))?,
        };
        // The family a sample belongs to must be declared before it.
        let family = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|s| {
                name.strip_suffix(s)
                    .filter(|f| types.get(*f).map(String::as_str) == Some("histogram"))
            })
            .unwrap_or(name);
        let Some(kind) = types.get(family) else {
            return Err(format!("line {no}: sample of {family} before its TYPE"));
        };
        if kind == "histogram" && name == family {
            return Err(format!("line {no}: bare sample of histogram {family}"));
        }
        if kind == "histogram" && name.ends_with("_bucket") && !labels.contains_key("le") {
            return Err(format!("line {no}: bucket without le"));
        }
        samples.push((name.to_string(), labels, value));
    }
    for t in types.keys() {
        if !helps.contains(t) {
            return Err(format!("{t} has a TYPE but no HELP"));
        }
    }
    Ok((samples, types))
}

fn curl(url: &str) -> (String, String) {
    let o = run_with_timeout(
        Command::new("curl").args(["-sS", "-o", "-", "-w", "\n%{http_code}", url]),
        Duration::from_secs(30),
    );
    assert!(
        o.status.success(),
        "curl {url}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    let (body, code) = out.rsplit_once('\n').unwrap();
    (body.to_string(), code.to_string())
}

#[test]
fn parser_rejects_what_prometheus_rejects() {
    assert!(parse("# HELP a x\n# TYPE a counter\na{b=\"c\"} 1\n").is_ok());
    assert!(parse("a 1\n").is_err(), "sample without TYPE");
    assert!(parse("# HELP a x\n# TYPE a counter\na{b=c} 1\n").is_err());
    assert!(parse("# HELP a x\n# TYPE a counter\na{b=\"c\"}1\n").is_err());
    assert!(parse("# HELP a x\n# TYPE a counter\n# TYPE a counter\n").is_err());
    assert!(parse("# HELP h x\n# TYPE h histogram\nh_bucket{x=\"1\"} 1\n").is_err());
    assert!(parse("# HELP a x\n# TYPE a gauge\na{b=\"c\\\"d\"} 1.5\n").is_ok());
}

#[test]
fn metrics_after_io_are_well_formed_with_per_device_histograms() {
    require_tool("curl", "curl");
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let p = portal();
    let m = format!("127.0.0.1:{}", free_port());
    let f = Daemon::start(d, &empty_config(d), &["--metrics", &m]);
    f.ok(&[
        "do",
        "/handlers/vdisk_nullio/mgmt",
        "add_device m0 size=64M",
    ]);
    f.ok(&[
        "do",
        "/targets/iscsi/mgmt",
        &format!("add_target {T} portals={p}"),
    ]);
    f.ok(&["do", &format!("/targets/iscsi/{T}/luns/mgmt"), "add m0 0"]);
    f.ok(&["set", &format!("/targets/iscsi/{T}/enabled"), "1"]);

    let mut i = login(p, "iqn.2026-11.org.ferrite.test:metrics-host", T, 1);
    let (reads, writes) = (50u64, 30u64);
    let data = vec![0x5au8; 4096];
    for n in 0..writes {
        let mut cdb = [0u8; 10];
        cdb[0] = 0x2a;
        cdb[2..6].copy_from_slice(&((n as u32) * 8).to_be_bytes());
        cdb[7..9].copy_from_slice(&8u16.to_be_bytes());
        assert_eq!(scsi(&mut i, 0, &cdb, 0, &data).status, 0);
    }
    for n in 0..reads {
        let mut cdb = [0u8; 10];
        cdb[0] = 0x28;
        cdb[2..6].copy_from_slice(&((n as u32) * 8).to_be_bytes());
        cdb[7..9].copy_from_slice(&8u16.to_be_bytes());
        assert_eq!(scsi(&mut i, 0, &cdb, 4096, &[]).status, 0);
    }

    // A scrape asks every core for its counters first: the reads just
    // answered show at once, with no waiting for the cores' once-a-second
    // publication.
    let want_reads = format!("ferrite_device_read_commands_total{{device=\"m0\"}} {reads}\n");
    let (body, code) = curl(&format!("http://{m}/metrics"));
    assert!(body.contains(&want_reads), "{want_reads} not in {body}");
    assert_eq!(code, "200", "{body}");
    let (samples, types) = parse(&body).unwrap_or_else(|e| panic!("{e}\n{body}"));
    assert_eq!(
        types
            .get("ferrite_device_latency_seconds")
            .map(String::as_str),
        Some("histogram")
    );
    let get = |name: &str, want: &[(&str, &str)]| -> Vec<f64> {
        samples
            .iter()
            .filter(|(n, l, _)| {
                n == name
                    && want
                        .iter()
                        .all(|(k, v)| l.get(*k).map(String::as_str) == Some(*v))
            })
            .map(|s| s.2)
            .collect()
    };
    let dev = [("device", "m0")];
    assert_eq!(
        get("ferrite_device_read_commands_total", &dev),
        [reads as f64],
        "READ count of m0 after {reads} reads\n{body}"
    );
    assert_eq!(
        get("ferrite_device_write_commands_total", &dev),
        [writes as f64]
    );
    assert_eq!(
        get("ferrite_device_read_bytes_total", &dev),
        [(reads * 4096) as f64]
    );
    assert_eq!(
        get("ferrite_device_written_bytes_total", &dev),
        [(writes * 4096) as f64]
    );
    // The 4 KiB reads are in one histogram with cumulative buckets ending at +Inf.
    let h = [("device", "m0"), ("dir", "read"), ("size", "4k")];
    let count = get("ferrite_device_latency_seconds_count", &h);
    assert_eq!(count, [reads as f64], "read latency count\n{body}");
    let buckets: Vec<(f64, f64)> = samples
        .iter()
        .filter(|(n, l, _)| {
            n == "ferrite_device_latency_seconds_bucket"
                && h.iter()
                    .all(|(k, v)| l.get(*k).map(String::as_str) == Some(*v))
        })
        .map(|(_, l, v)| {
            let le = &l["le"];
            (
                if le == "+Inf" {
                    f64::INFINITY
                } else {
                    le.parse().unwrap()
                },
                *v,
            )
        })
        .collect();
    assert!(buckets.len() > 2, "buckets: {buckets:?}");
    assert!(
        buckets
            .windows(2)
            .all(|w| w[0].0 < w[1].0 && w[0].1 <= w[1].1)
    );
    assert_eq!(buckets.last().unwrap(), &(f64::INFINITY, reads as f64));
    let sum = get("ferrite_device_latency_seconds_sum", &h);
    assert!(sum.len() == 1 && sum[0] > 0.0, "sum {sum:?}");
    let w = [("device", "m0"), ("dir", "write"), ("size", "4k")];
    assert_eq!(
        get("ferrite_device_latency_seconds_count", &w),
        [writes as f64]
    );
    // The session is visible with its counters.
    assert_eq!(get("ferrite_sessions", &[("target", T)]), [1.0]);

    let (_, code) = curl(&format!("http://{m}/nope"));
    assert_eq!(code, "404");
    let _ = i.logout(0);
}
