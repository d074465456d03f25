//! Malformed input from the network: each case gets the answer RFC 7143
//! prescribes (Reject, a login status, or a closed connection with a log
//! line), while a second session keeps reading and writing, and nothing panics.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed step is a failed test

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use ferrite_iscsi::initiator::{Command, Initiator};
use ferrite_iscsi::pdu::{BhsBuf, Opcode};
use ferrite_tests::{Ferrited, Login};

const IQN: &str = "iqn.2026-11.org.ferrite:default";

fn session(name: &str, isid_last: u8) -> Login {
    Login::new(format!("iqn.2026-11.org.ferrite.test:{name}"), IQN)
        .isid([0x80, 0, 0, 0, 0, isid_last])
}

fn login(addr: SocketAddr, name: &str, isid_last: u8) -> Initiator<TcpStream> {
    let mut i = session(name, isid_last)
        .read_timeout(Duration::from_secs(20))
        .connect(addr);
    // The first command of a new nexus reports POWER ON, RESET (SAM-5
    // §5.14); TEST UNIT READY takes it.
    let tur = [0u8; 6];
    let r = i
        .command(&Command {
            cdb: &tur,
            attr: 1,
            ..Command::default()
        })
        .expect("TEST UNIT READY");
    assert!(
        r.status == 0 || (r.status == 2 && r.sense.get(12) == Some(&0x29)),
        "{r:?}"
    );
    i
}

/// The witness: writes a pattern to `lba`, reads it back and checks it.
fn witness_io(w: &mut Initiator<TcpStream>, lba: u32, fill: u8) {
    let data = vec![fill; 4096];
    let mut cdb = [0u8; 10];
    cdb[0] = 0x2a;
    cdb[2..6].copy_from_slice(&lba.to_be_bytes());
    cdb[7..9].copy_from_slice(&8u16.to_be_bytes());
    let r = w
        .command(&Command {
            cdb: &cdb,
            write: &data,
            attr: 1,
            ..Command::default()
        })
        .expect("witness write");
    assert_eq!(r.status, 0, "witness write failed: {r:?}");
    cdb[0] = 0x28;
    let r = w
        .command(&Command {
            cdb: &cdb,
            read_len: 4096,
            attr: 1,
            ..Command::default()
        })
        .expect("witness read");
    assert_eq!(r.status, 0);
    assert_eq!(r.data, data, "witness read back wrong data");
}

fn nop_out(itt: u32, cmd_sn: u32, exp_stat_sn: u32) -> BhsBuf {
    let mut b = BhsBuf::new(Opcode::NOP_OUT, 0x80);
    b.set_immediate();
    b.set_u32(16, itt).set_u32(20, 0xffff_ffff);
    b.set_u32(24, cmd_sn).set_u32(28, exp_stat_sn);
    b
}

#[test]
fn malformed_input_gets_the_prescribed_answer_and_harms_no_one() {
    let dir = tempfile::tempdir().unwrap();
    let mut f = Ferrited::start_default(dir.path());
    let mut w = login(f.addr, "witness", 1);
    witness_io(&mut w, 100, 0x11);

    // 1. A truncated BHS is only incomplete: the target waits for the rest.
    //    If the peer then goes away mid-PDU, the connection closes with a log line.
    {
        let mut a = login(f.addr, "truncated", 2);
        let b = nop_out(0x77, a.cmd_sn.0, a.exp_stat_sn.0);
        a.t.write_all(&b.0[..20]).unwrap();
        witness_io(&mut w, 101, 0x22);
        // The rest of the header completes the PDU: the ping is answered.
        a.t.write_all(&b.0[20..]).unwrap();
        let p = a.recv_pdu().expect("NOP-In after the completed header");
        assert_eq!(p.bhs.view().opcode(), Opcode::NOP_IN);
        assert_eq!(p.bhs.view().itt(), 0x77);
        // Now a truncated header and a half-close.
        a.t.write_all(&b.0[..30]).unwrap();
        a.t.shutdown(std::net::Shutdown::Write).unwrap();
        let mut rest = Vec::new();
        let n = a.t.read_to_end(&mut rest).unwrap_or(0);
        assert_eq!(n, 0, "target sent something to a truncated header");
    }
    witness_io(&mut w, 102, 0x33);

    // 2. An unknown opcode: Reject, reason 05h (Command not supported); the
    //    connection goes on.
    {
        let mut a = login(f.addr, "unknown-opcode", 3);
        let mut b = BhsBuf::new(Opcode(0x15), 0x80);
        b.set_u32(16, 0x55);
        a.t.write_all(&b.0).unwrap();
        let p = a.recv_pdu().expect("Reject");
        assert_eq!(p.bhs.view().opcode(), Opcode::REJECT, "{p:?}");
        assert_eq!(p.bhs.0[2], 0x05, "reject reason");
        assert_eq!(
            &p.data[..48],
            &b.0[..],
            "Reject carries the offending header"
        );
        let echoed = a.nop(b"still here", true).expect("NOP after Reject");
        assert_eq!(echoed, b"still here");
        witness_io(&mut w, 103, 0x44);
        a.logout(0).expect("logout");
    }

    // 3. A data segment over the negotiated MaxRecvDataSegmentLength: Reject
    //    (protocol error); the segment is skipped and the connection goes on.
    {
        let mut a = login(f.addr, "oversized", 4);
        let mut b = nop_out(0x66, a.cmd_sn.0, a.exp_stat_sn.0);
        let len: u32 = 1 << 20;
        b.0[5..8].copy_from_slice(&len.to_be_bytes()[1..]);
        a.t.write_all(&b.0).unwrap();
        let p = a.recv_pdu().expect("Reject for the oversized segment");
        assert_eq!(p.bhs.view().opcode(), Opcode::REJECT, "{p:?}");
        assert_eq!(p.bhs.0[2], 0x04, "reject reason: protocol error");
        a.t.write_all(&vec![0u8; len as usize]).unwrap();
        witness_io(&mut w, 104, 0x55);
        let echoed = a
            .nop(b"after", true)
            .expect("NOP after the skipped segment");
        assert_eq!(echoed, b"after");
    }

    // 4. A login with garbage keys: a Login Response with an initiator-error
    //    status class, then the connection closes.
    {
        let s = TcpStream::connect(f.addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let mut a = Initiator::new(s, session("garbage", 5).config());
        let mut p = a.login_pdu(true, 1, 3, &[]);
        p.data = b"\xff\xfe=\x00===\x00InitiatorName\x00no-equals-sign\x00".to_vec();
        a.send_pdu(&p).unwrap();
        let r = a.recv_pdu().expect("login response");
        assert_eq!(r.bhs.view().opcode(), Opcode::LOGIN_RSP);
        assert_eq!(r.bhs.0[36], 2, "status class: initiator error");
        let mut rest = Vec::new();
        let _ = a.t.read_to_end(&mut rest);
    }
    witness_io(&mut w, 105, 0x66);

    assert!(f.alive(), "ferrited died:\n{}", f.log_text());
    let log = f.wait_log("middle of a PDU", 1);
    assert!(!log.contains("panicked"), "a panic:\n{log}");
    assert!(
        log.contains("data segment exceeds MaxRecvDataSegmentLength"),
        "no log line for the oversized segment:\n{log}"
    );
    assert!(
        log.contains("middle of a PDU"),
        "no log line for the truncated header:\n{log}"
    );
    w.logout(0).expect("witness logout");
}
