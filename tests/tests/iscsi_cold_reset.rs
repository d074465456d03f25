//! TARGET COLD RESET end to end with the project's initiator (RFC 7143
//! §11.5.1): with writes in flight, the response comes once they are
//! drained, nothing of the aborted tasks follows it, and then the target
//! closes the connection, and every other connection of the target too.
//! Logged in again, each initiator sees the reset as a unit attention
//! (SAM-5 §6.3: POWER ON, RESET, OR BUS DEVICE RESET OCCURRED).

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed step is a failed test

use std::net::TcpStream;
use std::time::Duration;

use ferrite_iscsi::initiator::{Command, Initiator, InitiatorError};
use ferrite_iscsi::pdu::{Opcode, RESERVED_TAG, tmf_fn, tmf_rsp};
use ferrite_tests::{Ferrited, Login};

const IQN: &str = "iqn.2026-11.org.ferrite:default";

fn login(f: &Ferrited, name: &str) -> Initiator<TcpStream> {
    Login::new(format!("iqn.2026-11.org.ferrite.test:{name}"), IQN)
        .read_timeout(Duration::from_secs(30))
        .connect(f.addr)
}

fn tur(i: &mut Initiator<TcpStream>) -> (u8, Vec<u8>) {
    let r = i
        .command(&Command {
            cdb: &[0; 6],
            attr: 1,
            ..Command::default()
        })
        .expect("TEST UNIT READY");
    (r.status, r.sense)
}

#[test]
fn cold_reset_answers_then_drops_the_connection() {
    let dir = tempfile::tempdir().unwrap();
    let f = Ferrited::start_default(dir.path());
    let mut a = login(&f, "cold-a");
    let mut b = login(&f, "cold-b");
    // Each nexus takes its POWER ON unit attention first.
    let _ = tur(&mut a);
    let _ = tur(&mut b);
    assert_eq!(tur(&mut b).0, 0);

    // 16 writes of 64 KiB in flight (immediate data only), then the reset.
    let data = vec![0x5au8; 64 * 1024];
    let mut itts = Vec::new();
    for k in 0..16u32 {
        let mut cdb = [0u8; 10];
        cdb[0] = 0x2a;
        cdb[2..6].copy_from_slice(&(k * 128).to_be_bytes());
        cdb[7..9].copy_from_slice(&128u16.to_be_bytes());
        let c = Command {
            cdb: &cdb,
            write: &data,
            attr: 1,
            ..Command::default()
        };
        let itt = a.new_itt();
        let (p, imm) = a.command_pdu(itt, &c);
        assert_eq!(imm, data.len(), "the write fits in immediate data");
        a.send_pdu(&p).expect("send WRITE");
        itts.push(itt);
    }
    assert_eq!(
        a.tmf(tmf_fn::TARGET_COLD_RESET, 0, RESERVED_TAG)
            .expect("TMF response"),
        tmf_rsp::COMPLETE
    );
    // RFC 7143 §11.5.1: after the response the target drops the
    // connection; an aborted task is never answered.
    let mut after = Vec::new();
    let end = loop {
        match a.recv_pdu() {
            Ok(p) => after.push(p),
            Err(e) => break e,
        }
    };
    assert!(
        matches!(&end, InitiatorError::Closed | InitiatorError::Io(_)),
        "the connection was not closed: {end:?}"
    );
    if let InitiatorError::Io(e) = &end {
        assert!(
            !matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ),
            "the target kept the connection open after the cold reset: {e}"
        );
    }
    for p in &after {
        let bh = p.bhs();
        assert!(
            !(bh.opcode() == Opcode::SCSI_RSP && itts.contains(&bh.itt())),
            "a response to an aborted write followed the TMF response"
        );
    }

    // The other session's connection is dropped as well.
    let end = loop {
        match b.recv_pdu() {
            Ok(_) => continue,
            Err(e) => break e,
        }
    };
    assert!(
        matches!(&end, InitiatorError::Closed | InitiatorError::Io(_)),
        "the other session's connection was not dropped: {end:?}"
    );
    if let InitiatorError::Io(e) = &end {
        assert!(
            !matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ),
            "the target kept the other session's connection open after the cold reset: {e}"
        );
    }
    // Back again: the reset as a unit attention, then business.
    let mut b = login(&f, "cold-b");
    let (st, sense) = tur(&mut b);
    assert_eq!(st, 2, "no unit attention after the cold reset");
    assert_eq!((sense[2] & 0x0f, sense[12]), (0x06, 0x29), "{sense:02x?}");
    assert_eq!(tur(&mut b).0, 0);
    // The reset initiator comes back.
    let mut a = login(&f, "cold-a");
    let _ = tur(&mut a);
    assert_eq!(tur(&mut a).0, 0);
    a.logout(0).expect("logout");
    b.logout(0).expect("logout");
}
