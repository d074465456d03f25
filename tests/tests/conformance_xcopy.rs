//! EXTENDED COPY between two logical units on two different devices (a
//! fileio file and nullio's `mem` mode) of one ferrited: 64 MiB of random
//! data copied inside the target, checked by the sha256 of both ranges read
//! back over iSCSI.
//!
//! - QEMU's iscsi block driver: `qemu-img convert -C` (copy offloading,
//!   which fails rather than fall back when the target cannot offload)
//!   between the two LUNs' iscsi:// URLs; the source device's statistics
//!   show the data never crossed the fabric. Skipped with a message when
//!   qemu-img or its iscsi driver is missing.
//! - The project's initiator: one EXTENDED COPY (LID1) of four segments,
//!   then RECEIVE COPY RESULTS (COPY STATUS) for its held status.
//! - Bad parameter lists get the sense SPC-4 §6.4 prescribes.
//!
//! Needs a built `ferrited` and `ferritectl` (`cargo build --release`).

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed step is a failed test

use std::io::Write;
use std::net::TcpStream;
use std::process::{Command as Process, Stdio};
use std::time::Duration;

use ferrite_iscsi::initiator::{Command, Initiator};
use ferrite_tests::{
    Config, Device, Ferrited, Login, Options, Rng, Target, free_port, run_with_timeout,
};

const IQN: &str = "iqn.2026-11.org.ferrite:xcopy";
const SIZE: usize = 64 << 20;
const BS: usize = 512;
const CHUNK: usize = 1 << 20;

fn sha256(data: &[u8]) -> String {
    let mut child = Process::new("sha256sum")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("sha256sum");
    child.stdin.take().unwrap().write_all(data).unwrap();
    let out = child.wait_with_output().unwrap();
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .unwrap_or_default()
        .to_string()
}

/// A counter of `ferritectl get /devices/<dev>/stats`.
fn stat(f: &Ferrited, dev: &str, name: &str) -> u64 {
    let text = f.ctl(&["get", &format!("/devices/{dev}/stats")]);
    text.lines()
        .find_map(|l| {
            let mut w = l.split_whitespace();
            (w.next() == Some(name)).then(|| w.next().and_then(|v| v.parse().ok()))?
        })
        .unwrap_or_else(|| panic!("no {name} in {text}"))
}

fn session(f: &Ferrited) -> Initiator<TcpStream> {
    let mut i = Login::new("iqn.2026-11.org.ferrite:xcopy-initiator", IQN)
        .isid([0x80, 0, 0, 0, 0x33, 1])
        .connect(f.addr);
    // Clear the power-on unit attentions of both LUNs.
    for lun in 0..2 {
        for _ in 0..4 {
            if run(&mut i, lun, &[0; 6], &[], 0).0 == 0 {
                break;
            }
        }
    }
    i
}

fn run(
    i: &mut Initiator<TcpStream>,
    lun: u64,
    cdb: &[u8],
    write: &[u8],
    read: u32,
) -> (u8, Vec<u8>, Vec<u8>) {
    // SAM-5 §4.7.7 peripheral device addressing of a single-level LUN.
    let r = i
        .command(&Command {
            lun: lun << 48,
            cdb,
            read_len: read,
            write,
            attr: 1,
            immediate: false,
        })
        .expect("command");
    (r.status, r.sense, r.data)
}

fn rw16(op: u8, lba: u64, blocks: u32) -> [u8; 16] {
    let mut c = [0u8; 16];
    c[0] = op;
    c[2..10].copy_from_slice(&lba.to_be_bytes());
    c[10..14].copy_from_slice(&blocks.to_be_bytes());
    c
}

fn read_all(i: &mut Initiator<TcpStream>, lun: u64) -> Vec<u8> {
    let mut v = Vec::with_capacity(SIZE);
    for at in (0..SIZE).step_by(CHUNK) {
        let (st, sense, data) = run(
            i,
            lun,
            &rw16(0x88, (at / BS) as u64, (CHUNK / BS) as u32),
            &[],
            CHUNK as u32,
        );
        assert_eq!(st, 0, "READ (16) of LUN {lun} at {at}: {sense:02x?}");
        v.extend(data);
    }
    v
}

fn zero_all(i: &mut Initiator<TcpStream>, lun: u64) {
    let zero = vec![0u8; CHUNK];
    for at in (0..SIZE).step_by(CHUNK) {
        let (st, sense, _) = run(
            i,
            lun,
            &rw16(0x8a, (at / BS) as u64, (CHUNK / BS) as u32),
            &zero,
            0,
        );
        assert_eq!(st, 0, "WRITE (16): {sense:02x?}");
    }
}

/// The NAA designator VPD page 83h reports for `lun`, as an
/// identification target descriptor (E4h) names it.
fn ident_descriptor(i: &mut Initiator<TcpStream>, lun: u64) -> [u8; 32] {
    let (st, _, page) = run(i, lun, &[0x12, 1, 0x83, 0, 255, 0], &[], 255);
    assert_eq!(st, 0);
    let mut at = 4;
    while at + 4 <= page.len() {
        let len = page[at + 3] as usize;
        if page[at + 1] & 0x3f == 0x03 {
            let mut d = [0u8; 32];
            d[0] = 0xe4;
            d[4] = page[at] & 0x0f;
            d[5] = page[at + 1] & 0x3f;
            d[7] = len as u8;
            d[8..8 + len].copy_from_slice(&page[at + 4..at + 4 + len]);
            d[29..32].copy_from_slice(&(BS as u32).to_be_bytes()[1..]);
            return d;
        }
        at += 4 + len;
    }
    panic!("LUN {lun} reports no NAA designator: {page:02x?}");
}

/// An EXTENDED COPY (LID1) parameter list: `targets`, then block to block
/// segments `(src index, dst index, blocks, src lba, dst lba)`.
fn param_list(list_id: u8, targets: &[[u8; 32]], segs: &[(u16, u16, u16, u64, u64)]) -> Vec<u8> {
    let mut v = vec![0u8; 16];
    v[0] = list_id;
    v[2..4].copy_from_slice(&((targets.len() * 32) as u16).to_be_bytes());
    v[8..12].copy_from_slice(&((segs.len() * 28) as u32).to_be_bytes());
    for t in targets {
        v.extend_from_slice(t);
    }
    for &(s, d, n, sl, dl) in segs {
        let mut b = [0u8; 28];
        b[0] = 0x02;
        b[3] = 0x18;
        b[4..6].copy_from_slice(&s.to_be_bytes());
        b[6..8].copy_from_slice(&d.to_be_bytes());
        b[10..12].copy_from_slice(&n.to_be_bytes());
        b[12..20].copy_from_slice(&sl.to_be_bytes());
        b[20..28].copy_from_slice(&dl.to_be_bytes());
        v.extend_from_slice(&b);
    }
    v
}

fn xcopy(i: &mut Initiator<TcpStream>, lun: u64, params: &[u8]) -> (u8, Vec<u8>) {
    let mut cdb = [0u8; 16];
    cdb[0] = 0x83;
    cdb[10..14].copy_from_slice(&(params.len() as u32).to_be_bytes());
    let (st, sense, _) = run(i, lun, &cdb, params, 0);
    (st, sense)
}

/// (sense key, ASC, ASCQ) of fixed-format sense data.
fn key_asc(sense: &[u8]) -> (u8, u8, u8) {
    assert!(sense.len() >= 14, "sense {sense:02x?}");
    (sense[2] & 0x0f, sense[12], sense[13])
}

fn config(dir: &std::path::Path, port: u16) -> std::path::PathBuf {
    let src = dir.join("src.img");
    std::fs::write(&src, Rng::from_state(0x5eed_c0de_1234_5678).bytes(SIZE)).unwrap();
    Config::new()
        .device(Device::fileio("src", &src, SIZE as u64))
        .device(Device::mem("dst", SIZE as u64))
        .target(
            Target::new(IQN)
                .portal(format!("127.0.0.1:{port}"))
                .lun(0, "src")
                .lun(1, "dst"),
        )
        .write(dir.join("ferrite.json"))
}

fn has_qemu_iscsi() -> bool {
    Process::new("qemu-img")
        .arg("--help")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("iscsi"))
}

#[test]
fn extended_copy_moves_64_mib_between_devices_inside_the_target() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let cfg = config(dir.path(), port);
    let f = Ferrited::start(
        dir.path(),
        port,
        Options {
            config: Some(cfg),
            args: Vec::new(),
        },
    );
    let mut i = session(&f);
    let src = read_all(&mut i, 0);
    let want = sha256(&src);
    assert_ne!(want, sha256(&vec![0u8; SIZE]));

    // 1. QEMU offloads the copy with EXTENDED COPY.
    if has_qemu_iscsi() {
        // The counters are those of this moment: the test's own read of
        // the whole source is in them already.
        let read_before = stat(&f, "src", "read_bytes");
        assert!(
            read_before >= SIZE as u64,
            "read_bytes {read_before} misses the {SIZE} bytes just read"
        );
        let out = run_with_timeout(
            Process::new("qemu-img").args([
                "convert",
                "-C",
                "-n",
                "-f",
                "raw",
                "-O",
                "raw",
                &f.url(IQN, 0),
                &f.url(IQN, 1),
            ]),
            Duration::from_secs(300),
        );
        assert!(
            out.status.success(),
            "qemu-img convert -C: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        // The source's data went device to device: what was read from it
        // through the fabric is QEMU's probing, far from 64 MiB.
        let read_after = stat(&f, "src", "read_bytes");
        eprintln!(
            "qemu-img convert -C: {} bytes of the source read over iSCSI",
            read_after - read_before
        );
        assert!(
            read_after - read_before < (SIZE / 8) as u64,
            "{} bytes of the source crossed the fabric",
            read_after - read_before
        );
        let copied = read_all(&mut i, 1);
        assert_eq!(
            sha256(&copied),
            want,
            "qemu-img convert -C copied wrong data"
        );
        zero_all(&mut i, 1);
        assert_eq!(sha256(&read_all(&mut i, 1)), sha256(&vec![0u8; SIZE]));
    } else {
        eprintln!("qemu-img with the iscsi driver not found: skipping the QEMU copy");
    }

    // 2. One EXTENDED COPY of four 16 MiB segments, sent to the destination
    // LUN, holding its status for RECEIVE COPY RESULTS.
    let s = ident_descriptor(&mut i, 0);
    let d = ident_descriptor(&mut i, 1);
    assert_ne!(s, d);
    let blocks = (16 << 20) / BS;
    let segs: Vec<(u16, u16, u16, u64, u64)> = (0..4)
        .rev()
        .map(|k| {
            let lba = (k * blocks) as u64;
            (0, 1, blocks as u16, lba, lba)
        })
        .collect();
    let read_before = stat(&f, "src", "read_bytes");
    let (st, sense) = xcopy(&mut i, 1, &param_list(5, &[s, d], &segs));
    assert_eq!(st, 0, "EXTENDED COPY: {sense:02x?}");
    assert_eq!(stat(&f, "src", "read_bytes"), read_before);
    let copied = read_all(&mut i, 1);
    assert_eq!(sha256(&copied), want, "EXTENDED COPY copied wrong data");
    let mut rcr = [0u8; 16];
    rcr[0] = 0x84;
    rcr[2] = 5;
    rcr[13] = 12;
    let (st, _, data) = run(&mut i, 1, &rcr, &[], 12);
    assert_eq!(st, 0);
    // COPY MANAGER STATUS 01h (completed), 4 segments, 64 MiB in KiB... or
    // bytes when it fits 32 bits.
    assert_eq!(data[4] & 0x7f, 1, "{data:02x?}");
    assert_eq!(u16::from_be_bytes([data[5], data[6]]), 4);
    assert_eq!(
        (
            data[7],
            u32::from_be_bytes([data[8], data[9], data[10], data[11]])
        ),
        (0, SIZE as u32)
    );

    // 3. Bad parameter lists.
    // A designator none of this nexus's LUs reports.
    let mut unknown = s;
    unknown[15] ^= 0xff;
    let (st, sense) = xcopy(&mut i, 0, &param_list(6, &[unknown, d], &[(0, 1, 8, 0, 0)]));
    assert_eq!((st, key_asc(&sense)), (2, (0x0a, 0x0d, 0x02)));
    // A segment descriptor type this copy manager does not support.
    let mut p = param_list(6, &[s, d], &[(0, 1, 8, 0, 0)]);
    p[16 + 64] = 0x03;
    let (st, sense) = xcopy(&mut i, 0, &p);
    assert_eq!((st, key_asc(&sense)), (2, (0x05, 0x26, 0x09)));
    // Beyond the destination's capacity.
    let last = (SIZE / BS) as u64 - 4;
    let (st, sense) = xcopy(&mut i, 0, &param_list(6, &[s, d], &[(0, 1, 8, 0, last)]));
    assert_eq!((st, key_asc(&sense).0), (2, 0x0a));
    // The parameter list cut short.
    let p = param_list(6, &[s, d], &[(0, 1, 8, 0, 0)]);
    let (st, sense) = xcopy(&mut i, 0, &p[..p.len() - 1]);
    assert_eq!((st, key_asc(&sense)), (2, (0x05, 0x1a, 0x00)));
    // Nothing of the refused copies reached the destination.
    assert_eq!(sha256(&read_all(&mut i, 1)), want);
}
