//! Separate HeaderDigest and DataDigest lists (RFC 7143 §13.1: each key is
//! negotiated on its own; the target takes the first value of the
//! initiator's list it accepts). ferrited configured with
//! `iscsi.header_digests = ["crc32c"]` and `iscsi.data_digests = ["none"]`:
//! headers carry CRC32C and data does not, whatever order the initiator
//! offers; I/O runs in that mixed mode; an initiator that offers only None
//! for headers is refused (0200) instead of running without them; and
//! libiscsi, which offers `None,CRC32C`, ends up with header digests on (a
//! target that also accepts None would pick None).

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed step is a failed test

use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::Command as Proc;
use std::time::Duration;

use ferrite_iscsi::initiator::{Command, Initiator, InitiatorError};
use ferrite_iscsi::pdu::LoginStatus;
use ferrite_tests::{
    Config, Device, Ferrited, Login, Options, Target, free_port, require_tool, run_with_timeout,
};

const T: &str = "iqn.2026-11.org.ferrite:digest-lists";

fn config(dir: &Path, port: u16) -> PathBuf {
    Config::new()
        .device(Device::mem("m0", 16777216))
        .iscsi("header_digests", ["crc32c"])
        .iscsi("data_digests", ["none"])
        .target(
            Target::new(T)
                .set("enabled", true)
                .portal(format!("127.0.0.1:{port}"))
                .lun(0, "m0"),
        )
        .write_private(dir.join("digest-lists.json"))
}

fn login(f: &Ferrited, isid: u8, extra: &[(&str, &str)]) -> Initiator<TcpStream> {
    let mut login = Login::new("iqn.2026-11.org.ferrite.test:digest-lists", T)
        .isid([0x80, 0, 0, 0x44, 0, isid])
        .digests()
        .read_timeout(Duration::from_secs(30));
    for (k, v) in extra {
        login = login.key(k, v);
    }
    login.connect(f.addr)
}

fn key(i: &Initiator<TcpStream>, k: &str) -> String {
    i.login_keys
        .iter()
        .find(|(n, _)| n == k)
        .map(|(_, v)| v.clone())
        .unwrap_or_else(|| panic!("no {k} in {:?}", i.login_keys))
}

fn rw10(op: u8, lba: u32, blocks: u16) -> [u8; 10] {
    let mut c = [0u8; 10];
    c[0] = op;
    c[2..6].copy_from_slice(&lba.to_be_bytes());
    c[7..9].copy_from_slice(&blocks.to_be_bytes());
    c
}

/// Writes 64 KiB (immediate data, unsolicited Data-Out and R2T'd data) and
/// reads it back.
fn write_read(i: &mut Initiator<TcpStream>, seed: u8) {
    let _ = i.command(&Command {
        cdb: &[0; 6],
        attr: 1,
        ..Command::default()
    });
    let data: Vec<u8> = (0..256 * 1024usize)
        .map(|k| (k % 253) as u8 ^ seed)
        .collect();
    let r = i
        .command(&Command {
            cdb: &rw10(0x2a, 8, 512),
            write: &data,
            attr: 1,
            ..Command::default()
        })
        .expect("WRITE(10)");
    assert_eq!(r.status, 0, "{r:?}");
    let r = i
        .command(&Command {
            cdb: &rw10(0x28, 8, 512),
            read_len: data.len() as u32,
            attr: 1,
            ..Command::default()
        })
        .expect("READ(10)");
    assert_eq!(r.status, 0, "{r:?}");
    assert!(r.data == data, "read back differs");
}

#[test]
fn header_and_data_digests_follow_their_own_lists() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let f = Ferrited::start(
        dir.path(),
        port,
        Options {
            config: Some(config(dir.path(), port)),
            args: Vec::new(),
        },
    );

    // The initiator prefers digests on both: headers get CRC32C, data not.
    let mut i = login(&f, 1, &[]);
    assert_eq!(key(&i, "HeaderDigest"), "CRC32C");
    assert_eq!(key(&i, "DataDigest"), "None");
    assert!(i.hd && !i.dd);
    write_read(&mut i, 1);
    i.logout(0).expect("logout");

    // The initiator prefers no digests: headers still get CRC32C (the only
    // value the target accepts for them), data the initiator's first pick.
    let mut i = login(
        &f,
        2,
        &[
            ("HeaderDigest", "None,CRC32C"),
            ("DataDigest", "None,CRC32C"),
        ],
    );
    assert_eq!(key(&i, "HeaderDigest"), "CRC32C");
    assert_eq!(key(&i, "DataDigest"), "None");
    write_read(&mut i, 2);
    i.logout(0).expect("logout");

    // An initiator that offers only None for headers: the key has no
    // common value, and the target will not run without the digest it
    // requires (0200, initiator error).
    let r = Login::new("iqn.2026-11.org.ferrite.test:digest-lists", T)
        .isid([0x80, 0, 0, 0x44, 0, 3])
        .try_connect(f.addr);
    match r {
        Err(InitiatorError::Login(s)) => assert_eq!(s, LoginStatus::INITIATOR_ERROR),
        Err(e) => panic!("expected login status 0200, got {e}"),
        Ok(i) => panic!("logged in without header digests: {:?}", i.login_keys),
    }

    // libiscsi offers HeaderDigest=None,CRC32C (with or without
    // ?header_digest=crc32c): it gets CRC32C.
    require_tool("iscsi-inq", "libiscsi-bin");
    let o = run_with_timeout(
        Proc::new("iscsi-inq")
            .arg("-i")
            .arg("iqn.2026-11.org.ferrite.test:libiscsi-digests")
            .arg(format!("iscsi://{}/{T}/0?header_digest=crc32c", f.addr)),
        Duration::from_secs(60),
    );
    let t = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(
        o.status.success() && t.contains("DIRECT_ACCESS"),
        "libiscsi with header digests: {t}\n{}",
        f.log_text()
    );
}
