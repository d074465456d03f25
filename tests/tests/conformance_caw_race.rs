//! COMPARE AND WRITE raced from several sessions (several initiator names,
//! spread over ferrited's cores) against the same block: in every round all
//! sessions read the block, then all send COMPARE AND WRITE expecting what
//! they read and writing their own stamped block at once. Exactly one wins
//! (GOOD), every other one gets MISCOMPARE, and the block then holds the
//! winner's data whole: no torn block, no lost or double update (SBC-4
//! §5.3).

use std::net::TcpStream;
use std::sync::{Arc, Barrier, Mutex};

use ferrite_iscsi::initiator::{Command, Initiator};
use ferrite_tests::{Ferrited, Login};

const TARGET: &str = "iqn.2026-11.org.ferrite:default";
const SESSIONS: usize = 4;
const ROUNDS: u32 = 40;
const BS: usize = 512;

fn session(f: &Ferrited, n: usize) -> Initiator<TcpStream> {
    Login::new(format!("iqn.2026-11.org.ferrite:caw-race-{n}"), TARGET)
        .isid([0x80, 0, 0, 0, 0x10, n as u8])
        .connect(f.addr)
}

fn run(
    i: &mut Initiator<TcpStream>,
    cdb: &[u8],
    write: &[u8],
    read_len: u32,
) -> (u8, Vec<u8>, Vec<u8>) {
    let r = i
        .command(&Command {
            lun: 0,
            cdb,
            read_len,
            write,
            attr: 1,
            immediate: false,
        })
        .expect("command");
    (r.status, r.sense, r.data)
}

/// Reads block 0, clearing unit attentions first.
fn read0(i: &mut Initiator<TcpStream>) -> Vec<u8> {
    let cdb = [0x28, 0, 0, 0, 0, 0, 0, 0, 1, 0];
    for _ in 0..4 {
        let (st, _, data) = run(i, &cdb, &[], BS as u32);
        if st == 0 {
            return data;
        }
    }
    panic!("READ (10) keeps failing");
}

fn stamped(round: u32, who: usize) -> Vec<u8> {
    let mut b = vec![0u8; BS];
    for (k, x) in b.iter_mut().enumerate() {
        *x = (k as u32 ^ round.wrapping_mul(2654435761) ^ (who as u32 * 977)) as u8;
    }
    b[..4].copy_from_slice(&round.to_be_bytes());
    b[4] = who as u8;
    b
}

#[test]
fn compare_and_write_has_one_winner_per_round_and_no_torn_data() {
    let dir = tempfile::tempdir().expect("tempdir");
    let f = Ferrited::start_default(dir.path());
    let barrier = Arc::new(Barrier::new(SESSIONS));
    // (round, who, status, sense key)
    let results = Arc::new(Mutex::new(Vec::new()));
    // Checks never panic inside a round: a panicking thread would leave the
    // others waiting at the barrier.
    let errors = Arc::new(Mutex::new(Vec::<String>::new()));
    let mut threads = Vec::new();
    for who in 0..SESSIONS {
        let mut i = session(&f, who);
        let barrier = barrier.clone();
        let results = results.clone();
        let errors = errors.clone();
        threads.push(std::thread::spawn(move || {
            for round in 0..ROUNDS {
                let cur = read0(&mut i);
                barrier.wait();
                let mut data = cur.clone();
                data.extend(stamped(round, who));
                let cdb = [0x89, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0];
                let (st, sense, _) = run(&mut i, &cdb, &data, 0);
                let key = sense.get(2).map_or(0, |k| k & 0x0f);
                results.lock().expect("results").push((round, who, st, key));
                barrier.wait();
                // Everyone has answered: the block is the winner's.
                let now = read0(&mut i);
                if who == 0 {
                    let r = results.lock().expect("results");
                    let winners: Vec<usize> = r
                        .iter()
                        .filter(|x| x.0 == round && x.2 == 0)
                        .map(|x| x.1)
                        .collect();
                    let mut e = errors.lock().expect("errors");
                    if winners.len() != 1 {
                        e.push(format!("round {round}: winners {winners:?}"));
                    } else if now != stamped(round, winners[0]) {
                        e.push(format!("round {round}: block is not the winner's whole"));
                    }
                }
                barrier.wait();
            }
        }));
    }
    for t in threads {
        t.join().expect("a session thread failed");
    }
    let e = errors.lock().expect("errors");
    assert!(e.is_empty(), "{}", e.join("\n"));
    let r = results.lock().expect("results");
    assert_eq!(r.len(), SESSIONS * ROUNDS as usize);
    for &(round, who, st, key) in r.iter() {
        // Losers: CHECK CONDITION, MISCOMPARE.
        if st != 0 {
            assert_eq!((st, key), (2, 0x0e), "round {round} session {who}");
        }
    }
}
