//! Asynchronous messages (RFC 7143 §11.9): a LUN added live with
//! `ferritectl do` reaches a logged-in session as an Async Message carrying
//! REPORTED LUNS DATA HAS CHANGED sense data (AsyncEvent 0), without the
//! initiator sending a command; disabling the target asks for a logout
//! (AsyncEvent 1) and drops a session that does not log out in time, and
//! stopping ferrited announces the dropped connections (AsyncEvent 3)
//! before closing them.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed step is a failed test

use std::time::{Duration, Instant};

use ferrite_iscsi::initiator::Command;
use ferrite_iscsi::pdu::Opcode;
use ferrite_tests::{Ferrited, Login};

const IQN: &str = "iqn.2026-11.org.ferrite:default";

#[test]
fn lun_added_live_is_announced_by_an_async_message() {
    let dir = tempfile::tempdir().unwrap();
    let f = Ferrited::start_default(dir.path());
    let mut i = Login::new("iqn.2026-11.org.ferrite.test:aen", IQN)
        .read_timeout(Duration::from_secs(10))
        .connect(f.addr);
    let tur = [0u8; 6];
    // The first command takes the nexus' POWER ON unit attention.
    let _ = i.command(&Command {
        cdb: &tur,
        attr: 1,
        ..Command::default()
    });
    assert!(i.async_msgs.is_empty());

    f.ctl(&[
        "do",
        "/handlers/vdisk_nullio/mgmt",
        "add_device n1 size=16M",
    ]);
    f.ctl(&["do", &format!("/targets/iscsi/{IQN}/luns/mgmt"), "add n1 1"]);

    // NOP-Out pings let the initiator read what the target sent meanwhile.
    let deadline = Instant::now() + Duration::from_secs(10);
    while i.async_msgs.is_empty() {
        assert!(
            Instant::now() < deadline,
            "no Async Message within 10 s of adding LUN 1:\n{}",
            f.log_text()
        );
        i.nop(b"ping", false).expect("NOP-Out");
        std::thread::sleep(Duration::from_millis(100));
    }
    let m = &i.async_msgs[0];
    let b = m.bhs();
    assert_eq!(b.opcode(), Opcode::ASYNC_MSG);
    assert_eq!(b.0[36], 0, "AsyncEvent 0: SCSI asynchronous event");
    // Data segment: SenseLength, then fixed-format sense data.
    let sense = &m.data[2..];
    assert_eq!(sense[0] & 0x7f, 0x70, "fixed sense: {sense:02x?}");
    assert_eq!(sense[2] & 0x0f, 0x06, "UNIT ATTENTION: {sense:02x?}");
    assert_eq!(
        (sense[12], sense[13]),
        (0x3f, 0x0e),
        "REPORTED LUNS DATA HAS CHANGED: {sense:02x?}"
    );
}

/// Reads until the target closes; returns the AsyncEvent codes seen.
fn async_events_until_close(
    i: &mut ferrite_iscsi::initiator::Initiator<std::net::TcpStream>,
) -> Vec<u8> {
    let mut events: Vec<u8> = i.async_msgs.iter().map(|m| m.bhs().0[36]).collect();
    while let Ok(p) = i.recv_pdu() {
        if p.bhs().opcode() == Opcode::ASYNC_MSG {
            events.push(p.bhs().0[36]);
        }
    }
    events
}

fn logged_in(f: &Ferrited, name: &str) -> ferrite_iscsi::initiator::Initiator<std::net::TcpStream> {
    Login::new(format!("iqn.2026-11.org.ferrite.test:{name}"), IQN)
        .read_timeout(Duration::from_secs(10))
        .connect(f.addr)
}

#[test]
fn target_disable_and_shutdown_announce_the_drop() {
    let dir = tempfile::tempdir().unwrap();
    let mut f = Ferrited::start_default(dir.path());
    let mut i = logged_in(&f, "disable");
    // The logout window is the login timeout (15 s by default).
    i.t.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    f.ctl(&["set", &format!("/targets/iscsi/{IQN}/enabled"), "0"]);
    // This initiator ignores the request: the target drops it when the
    // window closes, and says so.
    let ev = async_events_until_close(&mut i);
    assert_eq!(
        ev.iter()
            .filter(|&&e| e == 1 || e == 3)
            .copied()
            .collect::<Vec<_>>(),
        [1, 3],
        "target disable: a logout request (AsyncEvent 1), then the drop (3): {ev:?}"
    );

    f.ctl(&["set", &format!("/targets/iscsi/{IQN}/enabled"), "1"]);
    let mut i = logged_in(&f, "shutdown");
    assert!(f.stop(), "ferrited did not stop");
    let ev = async_events_until_close(&mut i);
    assert!(
        ev.contains(&3),
        "no AsyncEvent 3 before the close on shutdown: {ev:?}"
    );
}

/// Sends NOP-Out pings until an Async Message arrives (the initiator reads
/// what the target sent meanwhile); panics after 10 s.
fn wait_async(f: &Ferrited, i: &mut ferrite_iscsi::initiator::Initiator<std::net::TcpStream>) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while i.async_msgs.is_empty() {
        assert!(
            Instant::now() < deadline,
            "no Async Message within 10 s:\n{}",
            f.log_text()
        );
        i.nop(b"ping", false).expect("NOP-Out");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn lun_resized_live_is_announced_by_an_async_message() {
    const MIB: u64 = 1 << 20;
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("grow.img");
    std::fs::File::create(&img)
        .unwrap()
        .set_len(8 * MIB)
        .unwrap();
    let f = Ferrited::start_default(dir.path());
    f.ctl(&[
        "do",
        "/handlers/vdisk_fileio/mgmt",
        &format!("add_device grow filename={}", img.display()),
    ]);
    f.ctl(&[
        "do",
        &format!("/targets/iscsi/{IQN}/luns/mgmt"),
        "add grow 1",
    ]);
    let mut i = logged_in(&f, "resize-aen");
    let tur = [0u8; 6];
    let lun1 = 1u64 << 48;
    // Each LUN's first command takes the nexus' POWER ON unit attention.
    for lun in [0, lun1] {
        let _ = i.command(&Command {
            cdb: &tur,
            lun,
            attr: 1,
            ..Command::default()
        });
    }
    i.nop(b"settle", false).expect("NOP-Out");
    assert!(i.async_msgs.is_empty(), "an event before the resize");

    f.ctl(&["set", "/devices/grow/size", &(24 * MIB).to_string()]);
    wait_async(&f, &mut i);
    let m = &i.async_msgs[0];
    let b = m.bhs();
    assert_eq!(b.opcode(), Opcode::ASYNC_MSG);
    assert_eq!(b.0[36], 0, "AsyncEvent 0: SCSI asynchronous event");
    assert_eq!(&b.0[8..16], &lun1.to_be_bytes(), "the resized LUN");
    let sense = &m.data[2..];
    assert_eq!(sense[2] & 0x0f, 0x06, "UNIT ATTENTION: {sense:02x?}");
    assert_eq!(
        (sense[12], sense[13]),
        (0x2a, 0x09),
        "CAPACITY DATA HAS CHANGED: {sense:02x?}"
    );
    assert_eq!(i.async_msgs.len(), 1, "one resize, one event");

    // READ CAPACITY (16) reports the new size (after the unit attention
    // that stays pending for initiators that ignore AEN).
    let rc16 = [0x9e, 0x10, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 32, 0, 0];
    let mut blocks = 0;
    for _ in 0..2 {
        let r = i
            .command(&Command {
                cdb: &rc16,
                lun: lun1,
                attr: 1,
                read_len: 32,
                ..Command::default()
            })
            .expect("READ CAPACITY (16)");
        if r.status == 0 {
            blocks = u64::from_be_bytes(r.data[..8].try_into().unwrap()) + 1;
            break;
        }
    }
    assert_eq!(blocks, 24 * MIB / 512);
    // LUN 0 was not resized: no unit attention there.
    let r = i
        .command(&Command {
            cdb: &tur,
            attr: 1,
            ..Command::default()
        })
        .expect("TEST UNIT READY");
    assert_eq!(r.status, 0, "LUN 0 saw the resize of LUN 1");
}
