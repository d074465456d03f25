//! Several connections per session (MC/S, RFC 7143 §6.3.1, MaxConnections
//! §13.2) against a real ferrited with two cores, through the project's
//! initiator: four connections of one session carrying verified reads and
//! writes at once; a TSIH that names no session (020Ah); a fifth connection
//! over MaxConnections=4 (0206h); a connection lost at ERL 0 ending the whole
//! session; a logout of one connection leaving the others working.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed step is a failed test

use std::io::Read;
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::Command as Proc;
use std::time::{Duration, Instant};

use ferrite_iscsi::initiator::{Command, Initiator, InitiatorError};
use ferrite_iscsi::pdu::LoginStatus;
use ferrite_tests::{
    Config, Device, Ferrited, Login, Options, Target, ferrited_path, free_port, run_with_timeout,
};

const IQN: &str = "iqn.2026-11.org.ferrite:mcs";
const BS: usize = 512;
const BLOCKS: u16 = 8;

fn config(dir: &Path, port: u16) -> PathBuf {
    Config::new()
        .device(Device::mem("m0", 16777216))
        .iscsi("max_connections", 4)
        .target(
            Target::new(IQN)
                .set("enabled", true)
                .portal(format!("127.0.0.1:{port}"))
                .lun(0, "m0"),
        )
        .write(dir.join("mcs.json"))
}

/// ferrited with MaxConnections=4 on two cores (so that later connections
/// usually land on another core than their session and must move).
fn start(dir: &Path) -> Ferrited {
    let port = free_port();
    let cfg = config(dir, port);
    Ferrited::start(
        dir,
        port,
        Options {
            config: Some(cfg),
            args: vec!["--cores".into(), "2".into()],
        },
    )
}

fn sessions(f: &Ferrited) -> String {
    let out = run_with_timeout(
        Proc::new(ferrited_path().with_file_name("ferritectl"))
            .arg("--socket")
            .arg(f.control())
            .arg("sessions"),
        Duration::from_secs(30),
    );
    assert!(
        out.status.success(),
        "ferritectl sessions: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn login(name: &str) -> Login {
    // RFC 7143 §13.2: the session's limit is the lower of both offers.
    Login::new(name, IQN).key("MaxConnections", "4")
}

fn leading(f: &Ferrited, name: &str) -> Initiator<TcpStream> {
    login(name)
        .read_timeout(Duration::from_secs(20))
        .connect(f.addr)
}

fn more(f: &Ferrited, lead: &mut Initiator<TcpStream>, cid: u16) -> Initiator<TcpStream> {
    let c = lead
        .add_connection(f.addr, cid)
        .unwrap_or_else(|e| panic!("connection {cid}: {e}\n{}", f.log_text()));
    c.t.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    c
}

fn rw10(op: u8, lba: u32, blocks: u16) -> [u8; 10] {
    let mut c = [0u8; 10];
    c[0] = op;
    c[2..6].copy_from_slice(&lba.to_be_bytes());
    c[7..9].copy_from_slice(&blocks.to_be_bytes());
    c
}

/// Data unique to (`lba`, `round`).
fn pattern(lba: u32, round: u32) -> Vec<u8> {
    (0..BLOCKS as usize * BS)
        .map(|i| (i as u32 ^ lba.wrapping_mul(31) ^ round.wrapping_mul(7)) as u8)
        .collect()
}

fn write(i: &mut Initiator<TcpStream>, lba: u32, data: &[u8]) {
    let cdb = rw10(0x2a, lba, BLOCKS);
    let r = i
        .command(&Command {
            cdb: &cdb,
            write: data,
            attr: 1,
            ..Command::default()
        })
        .expect("WRITE(10)");
    assert_eq!(r.status, 0, "WRITE(10) at {lba}: sense {:02x?}", r.sense);
}

fn read(i: &mut Initiator<TcpStream>, lba: u32) -> Vec<u8> {
    let cdb = rw10(0x28, lba, BLOCKS);
    let r = i
        .command(&Command {
            cdb: &cdb,
            read_len: BLOCKS as u32 * BS as u32,
            attr: 1,
            ..Command::default()
        })
        .expect("READ(10)");
    assert_eq!(r.status, 0, "READ(10) at {lba}: sense {:02x?}", r.sense);
    r.data
}

/// The first command of a session takes its POWER ON unit attention.
fn clear_ua(i: &mut Initiator<TcpStream>) {
    let tur = [0u8; 6];
    let _ = i.command(&Command {
        cdb: &tur,
        attr: 1,
        ..Command::default()
    });
}

#[test]
fn four_connections_carry_verified_io_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let f = start(dir.path());
    let name = "iqn.2026-11.org.ferrite.test:mcs-io";
    let mut lead = leading(&f, name);
    clear_ua(&mut lead);
    let mut conns = vec![];
    for cid in 1..4 {
        conns.push(more(&f, &mut lead, cid));
    }
    conns.insert(0, lead);
    let listed = sessions(&f);
    assert_eq!(listed.matches(name).count(), 1, "one session:\n{listed}");

    // 160 commands (80 writes, each read back), command k on connection
    // k % 4: each connection runs its share from its own thread, so the
    // four interleave and CmdSNs reach the target out of order across
    // connections.
    const ROUNDS: u32 = 20;
    let started = Instant::now();
    let handles: Vec<_> = conns
        .into_iter()
        .enumerate()
        .map(|(n, mut c)| {
            std::thread::spawn(move || {
                for round in 0..ROUNDS {
                    let lba = (round * 4 + n as u32) * BLOCKS as u32;
                    let data = pattern(lba, round);
                    write(&mut c, lba, &data);
                    assert_eq!(read(&mut c, lba), data, "connection {n}, LBA {lba}");
                }
                c
            })
        })
        .collect();
    let mut conns: Vec<Initiator<TcpStream>> = handles
        .into_iter()
        .map(|h| {
            h.join()
                .unwrap_or_else(|_| panic!("a connection failed:\n{}", f.log_text()))
        })
        .collect();
    eprintln!("MC/S I/O of {ROUNDS} rounds took {:?}", started.elapsed());
    // Everything written on any connection reads back on every other one.
    for round in 0..ROUNDS {
        for n in 0..4u32 {
            let lba = (round * 4 + n) * BLOCKS as u32;
            let via = ((n + 1) % 4) as usize;
            assert_eq!(
                read(&mut conns[via], lba),
                pattern(lba, round),
                "LBA {lba} via connection {via}"
            );
        }
    }
    assert_eq!(conns[0].logout(0).expect("logout"), 0);
}

#[test]
fn unknown_tsih_is_refused_with_session_does_not_exist() {
    let dir = tempfile::tempdir().unwrap();
    let f = start(dir.path());
    let name = "iqn.2026-11.org.ferrite.test:mcs-tsih";
    let r = login(name)
        .with(|c| {
            c.tsih = 0x7777;
            c.cid = 1;
            c.extra_keys = Vec::new();
        })
        .try_connect(f.addr);
    assert!(
        matches!(
            r,
            Err(InitiatorError::Login(LoginStatus::SESSION_DOES_NOT_EXIST))
        ),
        "{r:?}"
    );
    // A live session's TSIH with another ISID is not that session either.
    let lead = leading(&f, name);
    let r = login(name)
        .isid([0x80, 0, 0, 0, 0, 0x42])
        .with(|c| {
            c.tsih = lead.tsih;
            c.cid = 1;
            c.extra_keys = Vec::new();
        })
        .try_connect(f.addr);
    assert!(
        matches!(
            r,
            Err(InitiatorError::Login(LoginStatus::SESSION_DOES_NOT_EXIST))
        ),
        "{r:?}"
    );
}

#[test]
fn fifth_connection_is_refused_with_too_many_connections() {
    let dir = tempfile::tempdir().unwrap();
    let f = start(dir.path());
    let mut lead = leading(&f, "iqn.2026-11.org.ferrite.test:mcs-max");
    clear_ua(&mut lead);
    let mut conns: Vec<_> = (1..4).map(|cid| more(&f, &mut lead, cid)).collect();
    let r = lead.add_connection(f.addr, 4);
    assert!(
        matches!(
            r,
            Err(InitiatorError::Login(LoginStatus::TOO_MANY_CONNECTIONS))
        ),
        "{r:?}"
    );
    // The four still work.
    let data = pattern(0, 1);
    write(&mut conns[2], 0, &data);
    assert_eq!(read(&mut lead, 0), data);
    for c in &mut conns {
        assert_eq!(read(c, 0), data);
    }
}

#[test]
fn a_lost_connection_ends_the_session() {
    let dir = tempfile::tempdir().unwrap();
    let f = start(dir.path());
    let name = "iqn.2026-11.org.ferrite.test:mcs-lost";
    let mut lead = leading(&f, name);
    clear_ua(&mut lead);
    let mut conns: Vec<_> = (1..4).map(|cid| more(&f, &mut lead, cid)).collect();
    write(&mut conns[0], 64, &pattern(64, 0));
    assert!(sessions(&f).contains(name));
    // Connection 2 dies without a logout.
    conns[1].t.shutdown(std::net::Shutdown::Both).unwrap();
    // RFC 7143 §6.3.6: at ERL 0 the session fails: the target closes every
    // other connection of it.
    for (n, c) in std::iter::once(&mut lead)
        .chain(conns.iter_mut())
        .enumerate()
        .filter(|(n, _)| *n != 2)
    {
        let mut buf = Vec::new();
        let r = c.t.read_to_end(&mut buf);
        assert!(
            r.is_ok(),
            "connection {n} not closed by the target: {r:?}\n{}",
            f.log_text()
        );
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while sessions(&f).contains(name) {
        assert!(
            Instant::now() < deadline,
            "session still listed:\n{}",
            sessions(&f)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // The initiator can log in again and finds its data.
    let mut again = leading(&f, name);
    clear_ua(&mut again);
    assert_eq!(read(&mut again, 64), pattern(64, 0));
}

#[test]
fn logout_of_one_connection_leaves_the_others_working() {
    let dir = tempfile::tempdir().unwrap();
    let f = start(dir.path());
    let name = "iqn.2026-11.org.ferrite.test:mcs-logout";
    let mut lead = leading(&f, name);
    clear_ua(&mut lead);
    let mut c1 = more(&f, &mut lead, 1);
    let mut c2 = more(&f, &mut lead, 2);
    // RFC 7143 §11.14.1 reason 1: close this connection only.
    assert_eq!(c1.logout(1).expect("logout of connection 1"), 0);
    let mut buf = Vec::new();
    assert!(
        c1.t.read_to_end(&mut buf).is_ok(),
        "connection 1 not closed"
    );
    for round in 0..4 {
        let lba = 128 + round * BLOCKS as u32;
        let data = pattern(lba, round);
        write(&mut c2, lba, &data);
        assert_eq!(read(&mut lead, lba), data);
    }
    assert!(sessions(&f).contains(name));
    // Its CID can join again.
    let mut c1 = more(&f, &mut lead, 1);
    assert_eq!(read(&mut c1, 128), pattern(128, 0));
    // Reason 1 may name another connection: connection 2 is logged out
    // from connection 1 and closed by the target; the others go on.
    assert_eq!(c1.logout_cid(1, 2).expect("logout of CID 2"), 0);
    let mut buf = Vec::new();
    assert!(
        c2.t.read_to_end(&mut buf).is_ok(),
        "connection 2 not closed"
    );
    let data = pattern(256, 9);
    write(&mut c1, 256, &data);
    assert_eq!(read(&mut lead, 256), data);
    // A CID the session does not have: "CID not found" (RFC 7143 §11.15.1).
    assert_eq!(lead.logout_cid(1, 9).expect("logout of CID 9"), 1);
    let mut c2 = more(&f, &mut lead, 2);
    // Reason 0 closes the session: every connection.
    assert_eq!(lead.logout(0).expect("session logout"), 0);
    for c in [&mut c1, &mut c2] {
        let mut buf = Vec::new();
        assert!(c.t.read_to_end(&mut buf).is_ok(), "connection not closed");
    }
}

#[test]
fn abort_task_set_on_one_connection_reaches_the_others() {
    let dir = tempfile::tempdir().unwrap();
    let f = start(dir.path());
    let mut lead = leading(&f, "iqn.2026-11.org.ferrite.test:mcs-tmf");
    clear_ua(&mut lead);
    let mut other = more(&f, &mut lead, 1);
    // A 256 KiB WRITE(10) on the second connection: its immediate data goes
    // with it, the rest is solicited by an R2T that is never answered.
    let data = vec![0xa5u8; 256 * 1024];
    let cdb = rw10(0x2a, 512, (data.len() / BS) as u16);
    let itt = other.new_itt();
    let (p, _) = other.command_pdu(
        itt,
        &Command {
            cdb: &cdb,
            write: &data,
            attr: 1,
            ..Command::default()
        },
    );
    other.send_pdu(&p).unwrap();
    let r2t = other
        .wait_for(ferrite_iscsi::pdu::Opcode::R2T, itt)
        .expect("R2T");
    assert_eq!(r2t.bhs().itt(), itt);
    // ABORT TASK SET on the leading connection aborts it (RFC 7143
    // §11.5.1): answered "function complete" without the missing data.
    let code = lead
        .tmf(ferrite_iscsi::pdu::tmf_fn::ABORT_TASK_SET, 0, u32::MAX)
        .unwrap_or_else(|e| panic!("ABORT TASK SET: {e}\n{}", f.log_text()));
    assert_eq!(code, 0);
    // Nothing of the aborted write reached the disk; both connections work.
    assert_eq!(read(&mut other, 512), vec![0u8; BLOCKS as usize * BS]);
    assert_eq!(read(&mut lead, 512), vec![0u8; BLOCKS as usize * BS]);
}

#[test]
fn a_login_with_a_cid_in_use_replaces_that_connection() {
    let dir = tempfile::tempdir().unwrap();
    let f = start(dir.path());
    let name = "iqn.2026-11.org.ferrite.test:mcs-cid";
    let mut lead = leading(&f, name);
    clear_ua(&mut lead);
    let mut old = more(&f, &mut lead, 1);
    write(&mut old, 32, &pattern(32, 3));
    // RFC 7143 §6.3.4: connection reinstatement. The old connection with
    // CID 1 is closed by the target; the session goes on with the new one.
    let mut new = more(&f, &mut lead, 1);
    let mut buf = Vec::new();
    assert!(
        old.t.read_to_end(&mut buf).is_ok(),
        "the replaced connection was not closed:\n{}",
        f.log_text()
    );
    assert_eq!(read(&mut new, 32), pattern(32, 3));
    assert_eq!(read(&mut lead, 32), pattern(32, 3));
    assert!(sessions(&f).contains(name));
}

#[test]
fn an_aen_goes_out_on_one_connection_of_the_session() {
    let dir = tempfile::tempdir().unwrap();
    let f = start(dir.path());
    let mut lead = leading(&f, "iqn.2026-11.org.ferrite.test:mcs-aen");
    clear_ua(&mut lead);
    let mut other = more(&f, &mut lead, 1);
    f.ctl(&[
        "do",
        "/handlers/vdisk_nullio/mgmt",
        "add_device n1 size=16M",
    ]);
    f.ctl(&["do", &format!("/targets/iscsi/{IQN}/luns/mgmt"), "add n1 1"]);
    // NOP-Out pings on both connections read what the target sent.
    let deadline = Instant::now() + Duration::from_secs(10);
    while lead.async_msgs.is_empty() && other.async_msgs.is_empty() {
        assert!(
            Instant::now() < deadline,
            "no Async Message within 10 s:\n{}",
            f.log_text()
        );
        lead.nop(b"ping", false).expect("NOP-Out");
        other.nop(b"ping", false).expect("NOP-Out");
        std::thread::sleep(Duration::from_millis(100));
    }
    for _ in 0..5 {
        lead.nop(b"ping", false).expect("NOP-Out");
        other.nop(b"ping", false).expect("NOP-Out");
        std::thread::sleep(Duration::from_millis(50));
    }
    // The session's oldest connection carries it, the other does not get
    // a copy.
    assert_eq!(
        (lead.async_msgs.len(), other.async_msgs.len()),
        (1, 0),
        "Async Messages per connection"
    );
}
