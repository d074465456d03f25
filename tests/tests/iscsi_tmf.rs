//! ABORT TASK SET with 64 writes in flight (RFC 7143 §11.5, SAM-5 §7.3):
//! the response comes only after every affected task is drained, no aborted
//! task is answered afterwards, and nothing changes on disk once the
//! response is in: no aborted write lands after it. A write the backend had
//! already accepted cannot be recalled: its region holds either the old or
//! the new data, whole (SAM-5 leaves an aborted write's effect undefined);
//! a write answered GOOD before the response is on disk.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed step is a failed test

use std::collections::HashMap;
use std::net::TcpStream;
use std::time::Duration;

use ferrite_iscsi::initiator::{Command, Initiator};
use ferrite_iscsi::pdu::{BhsBuf, Opcode, Pdu, flags};
use ferrite_tests::{Config, Device, Ferrited, Login, Options, Target, free_port};
use serde_json::json;

const IQN: &str = "iqn.2026-11.org.ferrite:tmf";
const N: u32 = 64;
/// Blocks per write (4 KiB).
const BLOCKS: u16 = 8;
/// Every write waits this long in the backend, so the abort meets them in
/// flight.
const DELAY_MS: u64 = 300;

fn rw10(op: u8, lba: u32, blocks: u16) -> [u8; 10] {
    let mut c = [0u8; 10];
    c[0] = op;
    c[2..6].copy_from_slice(&lba.to_be_bytes());
    c[7..9].copy_from_slice(&blocks.to_be_bytes());
    c
}

fn read_all(i: &mut Initiator<TcpStream>) -> Vec<u8> {
    let cdb = rw10(0x28, 0, (N as u16) * BLOCKS);
    for _ in 0..3 {
        let r = i
            .command(&Command {
                cdb: &cdb,
                read_len: N * u32::from(BLOCKS) * 512,
                attr: 1,
                ..Command::default()
            })
            .expect("READ(10)");
        if r.status == 0 {
            return r.data;
        }
        assert_eq!(r.status, 2, "{r:?}");
    }
    panic!("READ kept failing");
}

/// ferrited with one 16 MiB RAM LU whose `op` operations (`read` or
/// `write`) each wait [`DELAY_MS`], `iscsi` the configuration's `iscsi`
/// section (or none), and the project's initiator logged in as `initiator`.
fn start_delayed(
    dir: &std::path::Path,
    op: &str,
    iscsi: &[(&str, u64)],
    initiator: &str,
) -> (Ferrited, Initiator<TcpStream>) {
    let port = free_port();
    let mut config = Config::new()
        .device(Device::mem("m0", 16777216).set(
            "fault",
            json!({ "rules": [ { "op": op, "delay_ms": DELAY_MS } ] }),
        ))
        .target(
            Target::new(IQN)
                .set("enabled", true)
                .portal(format!("127.0.0.1:{port}"))
                .lun(0, "m0"),
        );
    for (key, value) in iscsi {
        config = config.iscsi(key, *value);
    }
    let cfg = config.write(dir.join("tmf.json"));
    let f = Ferrited::start(
        dir,
        port,
        Options {
            config: Some(cfg),
            args: Vec::new(),
        },
    );
    let i = Login::new(initiator, IQN)
        .read_timeout(Duration::from_secs(30))
        .connect(f.addr);
    (f, i)
}

#[test]
fn abort_task_set_with_64_writes_in_flight() {
    let dir = tempfile::tempdir().unwrap();
    let (f, mut i) = start_delayed(dir.path(), "write", &[], "iqn.2026-11.org.ferrite.test:tmf");
    let before = read_all(&mut i);
    assert!(before.iter().all(|b| *b == 0));

    // 64 writes, pipelined, each with its own pattern.
    let mut itts = HashMap::new();
    for k in 0..N {
        let data = vec![k as u8 + 1; usize::from(BLOCKS) * 512];
        let cdb = rw10(0x2a, k * u32::from(BLOCKS), BLOCKS);
        let itt = i.new_itt();
        let (p, imm) = i.command_pdu(
            itt,
            &Command {
                cdb: &cdb,
                write: &data,
                attr: 1,
                ..Command::default()
            },
        );
        assert_eq!(imm, data.len(), "each write travels as immediate data");
        i.send_pdu(&p).unwrap();
        itts.insert(itt, k);
    }
    // ABORT TASK SET (function 2), immediate.
    let tmf_itt = i.new_itt();
    let mut b = BhsBuf::new(Opcode::TMF_REQ, flags::F | 2);
    b.set_immediate()
        .set_lun(0u64.to_be_bytes())
        .set_itt(tmf_itt)
        .set_word20(0xffff_ffff)
        .set_u32(24, i.cmd_sn.0)
        .set_u32(28, i.exp_stat_sn.0);
    let sent = std::time::Instant::now();
    i.send_pdu(&Pdu::new(b)).unwrap();

    let mut done: HashMap<u32, u8> = HashMap::new();
    let tmf_response = loop {
        let p = i.recv_pdu().expect("TMF response");
        let b = p.bhs();
        match b.opcode() {
            Opcode::SCSI_RSP => {
                if let Some(k) = itts.get(&b.itt()) {
                    done.insert(*k, b.0[3]);
                }
            }
            Opcode::TMF_RSP if b.itt() == tmf_itt => break b.0[2],
            _ => {}
        }
    };
    let waited = sent.elapsed();
    assert_eq!(tmf_response, 0, "ABORT TASK SET: Function complete");
    // The request and its answer are in the log, for whoever looks into
    // an initiator's error recovery.
    let answer = "task management response to ABORT TASK SET: function complete";
    let log = f.wait_log(answer, 1);
    assert!(
        log.contains("task management request: ABORT TASK SET") && log.contains(answer),
        "ABORT TASK SET and its answer not logged:\n{log}"
    );
    if done.len() < N as usize {
        // Writes sat in the backend for DELAY_MS: the response waited for
        // them to drain.
        assert!(
            waited >= Duration::from_millis(DELAY_MS / 2),
            "TMF answered after {waited:?}, before the in-flight writes drained"
        );
    }
    // Nothing for the aborted tasks after the TMF response.
    i.t.set_read_timeout(Some(Duration::from_millis(DELAY_MS * 3)))
        .unwrap();
    while let Ok(p) = i.recv_pdu() {
        let b = p.bhs();
        assert!(
            !(b.opcode() == Opcode::SCSI_RSP && itts.contains_key(&b.itt())),
            "a task answered after the ABORT TASK SET response: {:?}",
            itts.get(&b.itt())
        );
    }
    i.t.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    eprintln!(
        "{} of {N} writes completed before the abort, {} aborted",
        done.len(),
        N as usize - done.len()
    );

    let first = read_all(&mut i);
    std::thread::sleep(Duration::from_millis(DELAY_MS * 3));
    let later = read_all(&mut i);
    let len = usize::from(BLOCKS) * 512;
    for k in 0..N {
        let at = k as usize * len;
        let region = &later[at..at + len];
        assert_eq!(
            &first[at..at + len],
            region,
            "write {k} changed the disk after the ABORT TASK SET response"
        );
        match done.get(&k) {
            Some(0) => assert!(
                region.iter().all(|b| *b == k as u8 + 1),
                "write {k} answered GOOD but its data is missing"
            ),
            Some(_) => {}
            None => assert!(
                region.iter().all(|b| *b == 0) || region.iter().all(|b| *b == k as u8 + 1),
                "aborted write {k} left a torn region"
            ),
        }
    }
}

/// An aborted command's ITT and CmdSN window slot are free once the ABORT
/// TASK is answered: the next command may carry the same ITT, as Linux's
/// does (it reuses a task slot's ITT at once), and aborts do not shrink the
/// window. More aborts than the queue depth, each reusing the ITT, then a
/// command with it that runs; nothing of an aborted read arrives after its
/// TMF response.
#[test]
fn an_aborted_commands_itt_and_window_slot_are_reused() {
    const QUEUE_DEPTH: u32 = 8;
    const ROUNDS: u32 = 12;
    const ITT: u32 = 0x4900;
    let dir = tempfile::tempdir().unwrap();
    let (_f, mut i) = start_delayed(
        dir.path(),
        "read",
        &[("queue_depth", QUEUE_DEPTH.into())],
        "iqn.2026-11.org.ferrite.test:tmf-reuse",
    );
    // The nexus's POWER ON unit attention goes to a first command.
    let tur = [0u8; 6];
    let _ = i.command(&Command {
        cdb: &tur,
        attr: 1,
        ..Command::default()
    });

    let read = rw10(0x28, 0, BLOCKS);
    let mut aborted = 0;
    for round in 0..ROUNDS {
        let (p, _) = i.command_pdu(
            ITT,
            &Command {
                cdb: &read,
                read_len: u32::from(BLOCKS) * 512,
                attr: 1,
                ..Command::default()
            },
        );
        i.send_pdu(&p).unwrap();
        let tmf_itt = i.new_itt();
        let mut b = BhsBuf::new(Opcode::TMF_REQ, flags::F | 1);
        b.set_immediate()
            .set_lun(0u64.to_be_bytes())
            .set_itt(tmf_itt)
            .set_word20(ITT)
            .set_u32(24, i.cmd_sn.0)
            .set_u32(28, i.exp_stat_sn.0);
        i.send_pdu(&Pdu::new(b)).unwrap();
        let mut answered = false;
        let code = loop {
            let p = i.recv_pdu().expect("ABORT TASK response");
            let b = p.bhs();
            match b.opcode() {
                Opcode::REJECT => panic!(
                    "round {round}: the command reusing ITT {ITT:#x} was rejected (reason {:#04x})",
                    b.0[2]
                ),
                Opcode::DATA_IN | Opcode::SCSI_RSP if b.itt() == ITT => answered = true,
                Opcode::TMF_RSP if b.itt() == tmf_itt => break b.0[2],
                _ => {}
            }
        };
        if !answered {
            assert_eq!(code, 0, "round {round}: ABORT TASK of a read in flight");
            aborted += 1;
        }
    }
    assert!(
        aborted > QUEUE_DEPTH,
        "only {aborted} of {ROUNDS} reads were caught in flight"
    );
    // The ITT runs a command again, and the window is whole.
    let (p, _) = i.command_pdu(
        ITT,
        &Command {
            cdb: &tur,
            attr: 1,
            ..Command::default()
        },
    );
    i.send_pdu(&p).unwrap();
    loop {
        let p = i.recv_pdu().expect("TEST UNIT READY response");
        let b = p.bhs();
        match b.opcode() {
            Opcode::REJECT => panic!("TEST UNIT READY with ITT {ITT:#x} rejected"),
            Opcode::DATA_IN if b.itt() == ITT => {
                panic!("Data-In of an aborted read after its ABORT TASK response")
            }
            Opcode::SCSI_RSP if b.itt() == ITT => {
                assert_eq!(b.0[3], 0, "TEST UNIT READY status");
                break;
            }
            _ => {}
        }
    }
    let window = i.max_cmd_sn.0.wrapping_sub(i.cmd_sn.0).wrapping_add(1);
    assert_eq!(
        window, QUEUE_DEPTH,
        "the CmdSN window after {aborted} aborts"
    );
}
