//! PERSISTENT RESERVE OUT REGISTER AND MOVE and SPEC_I_PT end to end (SPC-4
//! §5.14.7, §5.14.8), with two initiators: A registers itself and B (not
//! yet logged in) through SPEC_I_PT, B finds itself registered when it
//! logs in, A reserves and moves the reservation to B; B then holds it, A's
//! writes meet RESERVATION CONFLICT, and all of it survives a restart of
//! ferrited with APTPL.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed step is a failed test

use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use ferrite_iscsi::initiator::{Command, Initiator, ScsiResult};
use ferrite_tests::{Ferrited, Login, Options, free_port};

const IQN: &str = "iqn.2026-11.org.ferrite:default";
const NAME_A: &str = "iqn.2026-11.org.ferrite.test:move-a";
const NAME_B: &str = "iqn.2026-11.org.ferrite.test:move-b";
const ISID_B: [u8; 6] = [0x80, 0x12, 0x34, 0x56, 0x00, 0x01];
const KEY_A: u64 = 0xaaaa_0000_0000_0001;
const KEY_B: u64 = 0xbbbb_0000_0000_0002;
const RESERVATION_CONFLICT: u8 = 0x18;

fn session(addr: SocketAddr, name: &str, isid: Option<[u8; 6]>) -> Initiator<TcpStream> {
    let mut login = Login::new(name, IQN).read_timeout(Duration::from_secs(20));
    if let Some(isid) = isid {
        login = login.isid(isid);
    }
    let mut i = login.connect(addr);
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

/// An iSCSI TransportID (SPC-4 §7.6.4.6): format 01b with an ISID, 00b
/// with the initiator name only.
fn tid(name: &str, isid: Option<[u8; 6]>) -> Vec<u8> {
    let (format, text) = match isid {
        Some(isid) => {
            let hex: String = isid.iter().map(|b| format!("{b:02x}")).collect();
            (0x40u8, format!("{name},i,0x{hex}"))
        }
        None => (0, name.to_string()),
    };
    let mut field = text.into_bytes();
    field.push(0);
    while !field.len().is_multiple_of(4) {
        field.push(0);
    }
    let mut v = vec![format | 0x05, 0];
    v.extend((field.len() as u16).to_be_bytes());
    v.extend(field);
    v
}

/// PERSISTENT RESERVE OUT with `params`; returns the status.
fn prout(i: &mut Initiator<TcpStream>, sa: u8, kind: u8, params: &[u8]) -> ScsiResult {
    let mut cdb = [0u8; 10];
    cdb[0] = 0x5f;
    cdb[1] = sa;
    cdb[2] = kind;
    cdb[5..9].copy_from_slice(&(params.len() as u32).to_be_bytes());
    run(i, &cdb, 0, params)
}

fn basic(key: u64, sa_key: u64, flags: u8) -> Vec<u8> {
    let mut p = vec![0u8; 24];
    p[0..8].copy_from_slice(&key.to_be_bytes());
    p[8..16].copy_from_slice(&sa_key.to_be_bytes());
    p[20] = flags;
    p
}

fn prin(i: &mut Initiator<TcpStream>, sa: u8) -> Vec<u8> {
    let mut cdb = [0u8; 10];
    cdb[0] = 0x5e;
    cdb[1] = sa;
    cdb[7..9].copy_from_slice(&1024u16.to_be_bytes());
    let r = run(i, &cdb, 1024, &[]);
    assert_eq!(r.status, 0, "PRIN {sa:#x}: {r:?}");
    r.data
}

/// READ RESERVATION: (key, type) of the reservation, if any.
fn reservation(i: &mut Initiator<TcpStream>) -> Option<(u64, u8)> {
    let r = prin(i, 0x01);
    let len = u32::from_be_bytes([r[4], r[5], r[6], r[7]]);
    (len >= 16).then(|| {
        (
            u64::from_be_bytes(r[8..16].try_into().unwrap()),
            r[21] & 0x0f,
        )
    })
}

/// READ FULL STATUS: (key, holder, relative target port, TransportID) per
/// registration.
fn full_status(i: &mut Initiator<TcpStream>) -> Vec<(u64, bool, u16, Vec<u8>)> {
    let d = prin(i, 0x03);
    let end = 8 + u32::from_be_bytes([d[4], d[5], d[6], d[7]]) as usize;
    let mut out = Vec::new();
    let mut at = 8;
    while at < end {
        let key = u64::from_be_bytes(d[at..at + 8].try_into().unwrap());
        let holder = d[at + 12] & 0x01 != 0;
        let rel = u16::from_be_bytes([d[at + 18], d[at + 19]]);
        let len = u32::from_be_bytes(d[at + 20..at + 24].try_into().unwrap()) as usize;
        out.push((key, holder, rel, d[at + 24..at + 24 + len].to_vec()));
        at += 24 + len;
    }
    out
}

fn write_block(i: &mut Initiator<TcpStream>, block: usize) -> u8 {
    let cdb = [0x2a, 0, 0, 0, 0, 0, 0, 0, 1, 0];
    run(i, &cdb, 0, &vec![0x5a; block]).status
}

fn block_size(i: &mut Initiator<TcpStream>) -> usize {
    let r = run(i, &[0x25, 0, 0, 0, 0, 0, 0, 0, 0, 0], 8, &[]);
    assert_eq!(r.status, 0, "READ CAPACITY (10): {r:?}");
    u32::from_be_bytes(r.data[4..8].try_into().unwrap()) as usize
}

#[test]
fn spec_i_pt_then_register_and_move_survive_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    {
        let f = Ferrited::start(dir.path(), port, Options::default());
        let mut a = session(f.addr, NAME_A, None);
        let bs = block_size(&mut a);
        // A registers itself and B (every port of B: a name without ISID)
        // with SPEC_I_PT and APTPL, before B ever logged in.
        let mut p = basic(0, KEY_A, 0x08 | 0x01);
        let list = tid(NAME_B, None);
        p.extend((list.len() as u32).to_be_bytes());
        p.extend(&list);
        let r = prout(&mut a, 0x00, 0, &p);
        assert_eq!(r.status, 0, "REGISTER with SPEC_I_PT: {r:?}");
        let st = full_status(&mut a);
        assert_eq!(st.len(), 2, "{st:?}");
        assert!(st.iter().all(|(k, h, _, _)| *k == KEY_A && !h));
        assert_eq!(st[1].3, tid(NAME_B, None));
        let rel = st[0].2;

        // B logs in and is registered already: REGISTER with the key A
        // gave it (an unregistered nexus giving a key would conflict)
        // changes its key.
        let mut b = session(f.addr, NAME_B, Some(ISID_B));
        let r = prout(&mut b, 0x00, 0, &basic(KEY_A, KEY_B, 0x01));
        assert_eq!(r.status, 0, "B re-registers: {r:?}");

        // A reserves (WRITE EXCLUSIVE) and moves the reservation to B's
        // nexus (TransportID with B's ISID), keeping its registration.
        let r = prout(&mut a, 0x01, 0x01, &basic(KEY_A, 0, 0));
        assert_eq!(r.status, 0, "RESERVE: {r:?}");
        assert_eq!(reservation(&mut b), Some((KEY_A, 1)));
        let mut m = basic(KEY_A, KEY_B, 0);
        m[17] = 0x01; // APTPL
        m[18..20].copy_from_slice(&rel.to_be_bytes());
        let t = tid(NAME_B, Some(ISID_B));
        m[20..24].copy_from_slice(&(t.len() as u32).to_be_bytes());
        m.extend(&t);
        // B does not hold the reservation: it cannot move it.
        let r = prout(&mut b, 0x07, 0x01, &{
            let mut x = m.clone();
            x[0..8].copy_from_slice(&KEY_B.to_be_bytes());
            x
        });
        assert_eq!(
            r.status, RESERVATION_CONFLICT,
            "move by a non-holder: {r:?}"
        );
        let r = prout(&mut a, 0x07, 0x01, &m);
        assert_eq!(r.status, 0, "REGISTER AND MOVE: {r:?}");

        assert_eq!(reservation(&mut a), Some((KEY_B, 1)));
        assert_eq!(
            write_block(&mut a, bs),
            RESERVATION_CONFLICT,
            "A still writes"
        );
        assert_eq!(write_block(&mut b, bs), 0, "B cannot write");
        let _ = a.logout(0);
        let _ = b.logout(0);
    }
    assert!(
        dir.path().join("devices/disk0/pr_state").exists(),
        "no saved state under the state directory"
    );

    // Restart: the same keys, the reservation still B's.
    let f = Ferrited::start(dir.path(), port, Options::default());
    let mut a = session(f.addr, NAME_A, None);
    let mut b = session(f.addr, NAME_B, Some(ISID_B));
    let bs = block_size(&mut a);
    assert_eq!(
        reservation(&mut a),
        Some((KEY_B, 1)),
        "reservation lost across the restart:\n{}",
        f.log_text()
    );
    let st = full_status(&mut b);
    let holders: Vec<u64> = st.iter().filter(|s| s.1).map(|s| s.0).collect();
    assert_eq!(holders, vec![KEY_B], "{st:?}");
    assert_eq!(write_block(&mut a, bs), RESERVATION_CONFLICT);
    assert_eq!(write_block(&mut b, bs), 0);
    // A parameter list longer than any the target takes is refused before
    // it is fetched: PARAMETER LIST LENGTH ERROR.
    let mut cdb = [0x5f, 0x00, 0, 0, 0, 0, 0x10, 0, 0, 0];
    cdb[5..9].copy_from_slice(&(1u32 << 20).to_be_bytes());
    let r = run(&mut a, &cdb, 0, &basic(0, 1, 0));
    assert_eq!(
        (r.status, r.sense.get(2).map(|k| k & 0x0f), r.sense.get(12)),
        (2, Some(0x05), Some(&0x1a)),
        "{r:?}"
    );
    // Clean up as an initiator would: CLEAR with B's key.
    let r = prout(&mut b, 0x03, 0, &basic(KEY_B, 0, 0));
    assert_eq!(r.status, 0, "CLEAR: {r:?}");
    assert_eq!(reservation(&mut b), None);
    // SPC-4 §5.14.11.2.6: A hears that its registration went.
    let r = run(&mut a, &[0u8; 6], 0, &[]);
    assert_eq!(
        (r.status, r.sense.get(12), r.sense.get(13)),
        (2, Some(&0x2a), Some(&0x03))
    );
}
