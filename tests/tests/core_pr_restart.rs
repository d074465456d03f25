//! Persistent reservations with APTPL survive a restart of ferrited (SPC-4
//! §5.13.5): registrations and the reservation are written to the state
//! directory and restored at start.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed step is a failed test

use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use ferrite_iscsi::initiator::{Command, Initiator, ScsiResult};
use ferrite_tests::{Ferrited, Login, Options, free_port};

const IQN: &str = "iqn.2026-11.org.ferrite:default";
const KEY: u64 = 0x1122_3344_5566_7788;

fn session(addr: SocketAddr) -> Initiator<TcpStream> {
    let mut i = Login::new("iqn.2026-11.org.ferrite.test:pr", IQN)
        .read_timeout(Duration::from_secs(20))
        .connect(addr);
    // Take the POWER ON unit attention.
    let _ = run(&mut i, &[0u8; 6], 0, &[]);
    i
}

fn run(i: &mut Initiator<TcpStream>, cdb: &[u8], read_len: u32, write: &[u8]) -> ScsiResult {
    i.command(&Command {
        cdb,
        read_len,
        write,
        attr: 1,
        ..Command::default()
    })
    .expect("command")
}

/// PERSISTENT RESERVE OUT with a 24-byte parameter list.
fn prout(i: &mut Initiator<TcpStream>, sa: u8, kind: u8, key: u64, sa_key: u64, aptpl: bool) {
    let mut cdb = [0u8; 10];
    cdb[0] = 0x5f;
    cdb[1] = sa;
    cdb[2] = kind;
    cdb[8] = 24;
    let mut p = [0u8; 24];
    p[0..8].copy_from_slice(&key.to_be_bytes());
    p[8..16].copy_from_slice(&sa_key.to_be_bytes());
    p[20] = u8::from(aptpl);
    let r = run(i, &cdb, 0, &p);
    assert_eq!(r.status, 0, "PROUT {sa:#x}: {r:?}");
}

/// PERSISTENT RESERVE IN.
fn prin(i: &mut Initiator<TcpStream>, sa: u8) -> Vec<u8> {
    let mut cdb = [0u8; 10];
    cdb[0] = 0x5e;
    cdb[1] = sa;
    cdb[7..9].copy_from_slice(&256u16.to_be_bytes());
    let r = run(i, &cdb, 256, &[]);
    assert_eq!(r.status, 0, "PRIN {sa:#x}: {r:?}");
    r.data
}

fn keys_and_reservation(i: &mut Initiator<TcpStream>) -> (Vec<u64>, Option<(u64, u8)>) {
    let k = prin(i, 0x00);
    let n = u32::from_be_bytes([k[4], k[5], k[6], k[7]]) as usize;
    let keys = k[8..8 + n]
        .chunks(8)
        .map(|c| u64::from_be_bytes(c.try_into().unwrap()))
        .collect();
    let r = prin(i, 0x01);
    let len = u32::from_be_bytes([r[4], r[5], r[6], r[7]]);
    let res = (len >= 16).then(|| {
        (
            u64::from_be_bytes(r[8..16].try_into().unwrap()),
            r[21] & 0x0f,
        )
    });
    (keys, res)
}

#[test]
fn aptpl_registrations_and_reservation_survive_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    {
        let f = Ferrited::start(dir.path(), port, Options::default());
        let mut i = session(f.addr);
        // REGISTER with APTPL, then RESERVE (type 1: WRITE EXCLUSIVE).
        prout(&mut i, 0x00, 0, 0, KEY, true);
        prout(&mut i, 0x01, 0x01, KEY, 0, false);
        assert_eq!(keys_and_reservation(&mut i), (vec![KEY], Some((KEY, 1))));
        let _ = i.logout(0);
    }
    assert!(
        dir.path().join("devices/disk0/pr_state").exists(),
        "no saved state under the state directory"
    );
    let f = Ferrited::start(dir.path(), port, Options::default());
    let mut i = session(f.addr);
    assert_eq!(
        keys_and_reservation(&mut i),
        (vec![KEY], Some((KEY, 1))),
        "reservations lost across the restart:\n{}",
        f.log_text()
    );
    // Clean up as an initiator would: CLEAR with our key.
    prout(&mut i, 0x03, 0, KEY, 0, false);
    assert_eq!(keys_and_reservation(&mut i), (vec![], None));
}
