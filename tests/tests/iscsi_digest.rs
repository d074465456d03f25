//! Header and data digests (CRC32C) end to end with the project's
//! initiator: I/O with both digests on, then a write whose immediate data
//! arrives with a corrupted data digest is handled as RFC 7143 §7.8 says at
//! ERL 0 (Reject with reason Data Digest Error, the command fails, its data
//! never reaches the disk) while the session keeps working.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed step is a failed test

use std::net::TcpStream;
use std::time::Duration;

use ferrite_iscsi::initiator::{Command, Initiator};
use ferrite_iscsi::pdu::Opcode;
use ferrite_tests::{Ferrited, Login};

const IQN: &str = "iqn.2026-11.org.ferrite:default";

fn login(f: &Ferrited) -> Initiator<TcpStream> {
    Login::new("iqn.2026-11.org.ferrite.test:digests", IQN)
        .digests()
        .read_timeout(Duration::from_secs(30))
        .connect(f.addr)
}

fn rw10(op: u8, lba: u32, blocks: u16) -> [u8; 10] {
    let mut c = [0u8; 10];
    c[0] = op;
    c[2..6].copy_from_slice(&lba.to_be_bytes());
    c[7..9].copy_from_slice(&blocks.to_be_bytes());
    c
}

fn read(i: &mut Initiator<TcpStream>, lba: u32, blocks: u16) -> Vec<u8> {
    let cdb = rw10(0x28, lba, blocks);
    for _ in 0..3 {
        let r = i
            .command(&Command {
                cdb: &cdb,
                read_len: u32::from(blocks) * 512,
                attr: 1,
                ..Command::default()
            })
            .expect("READ(10)");
        if r.status == 0 {
            return r.data;
        }
        // A unit attention of the new nexus: retried as initiators do.
        assert_eq!(r.status, 2, "{r:?}");
    }
    panic!("READ(10) kept failing");
}

fn write(i: &mut Initiator<TcpStream>, lba: u32, data: &[u8]) -> u8 {
    let cdb = rw10(0x2a, lba, (data.len() / 512) as u16);
    i.command(&Command {
        cdb: &cdb,
        write: data,
        attr: 1,
        ..Command::default()
    })
    .expect("WRITE(10)")
    .status
}

#[test]
fn digests_on_and_a_corrupted_data_digest_fails_only_its_command() {
    let dir = tempfile::tempdir().unwrap();
    let f = Ferrited::start_default(dir.path());
    let mut i = login(&f);
    let key = |k: &str| {
        i.login_keys
            .iter()
            .find(|(n, _)| n == k)
            .map(|(_, v)| v.clone())
    };
    assert_eq!(key("HeaderDigest").as_deref(), Some("CRC32C"));
    assert_eq!(key("DataDigest").as_deref(), Some("CRC32C"));
    assert!(i.hd && i.dd);

    // Good I/O with both digests: 200 KiB (several Data-In and R2T
    // sequences) written and read back.
    let _ = read(&mut i, 0, 1);
    let good: Vec<u8> = (0..200 * 1024).map(|n| (n % 251) as u8).collect();
    assert_eq!(write(&mut i, 0, &good), 0);
    assert_eq!(read(&mut i, 0, 400), good);

    // A WRITE whose immediate data has a bad data digest.
    let bad = vec![0xa5u8; 4096];
    let cdb = rw10(0x2a, 1000, 8);
    let itt = i.new_itt();
    let (p, imm) = i.command_pdu(
        itt,
        &Command {
            cdb: &cdb,
            write: &bad,
            attr: 1,
            ..Command::default()
        },
    );
    assert_eq!(imm, bad.len(), "the write fits in immediate data");
    let mut bytes = i.encode(&p);
    let last = bytes.len() - 1;
    bytes[last] ^= 0xff; // the data digest's last byte
    i.send_raw(&bytes).unwrap();
    let mut rejected = false;
    let status = loop {
        let p = i.recv_pdu().expect("target answers the corrupted PDU");
        let b = p.bhs();
        if b.opcode() == Opcode::REJECT {
            // RFC 7143 §11.17.1: reason 0x02, Data (payload) Digest Error.
            assert_eq!(b.0[2], 0x02, "reject reason");
            rejected = true;
        } else if b.opcode() == Opcode::SCSI_RSP && b.itt() == itt {
            break b.0[3];
        } else if b.opcode() == Opcode::R2T && b.itt() == itt {
            panic!("the target asked again for data whose digest failed");
        }
    };
    assert!(rejected, "no Reject for the data digest error");
    assert_eq!(status, 2, "the command with corrupted data must fail");
    // Its data never reached the disk, and the session goes on.
    assert_eq!(read(&mut i, 1000, 8), vec![0u8; 4096]);
    assert_eq!(write(&mut i, 1000, &good[..4096]), 0);
    assert_eq!(read(&mut i, 1000, 8), good[..4096].to_vec());
}
