//! Data transfer in every negotiated combination (RFC 7143 §13.10-§13.19),
//! with the project's initiator against ferrited's default target:
//! InitialR2T Yes/No × ImmediateData Yes/No × FirstBurstLength /
//! MaxBurstLength at 512, 8192 and 65536 (and a FirstBurstLength above
//! MaxBurstLength, which the target clamps, §13.14) × MaxOutstandingR2T 1
//! and 4, each session writing lengths below, at and above its bursts.
//!
//! Every write is read back; the number of R2Ts the target sent is the one
//! the negotiated values call for (the unsolicited part first, then
//! MaxBurstLength per R2T); a write whose expected data transfer length
//! differs from the CDB's reports the residual exactly (U or O, count) and
//! changes exactly the whole blocks it should. DataPDUInOrder and
//! DataSequenceInOrder offered as No come back Yes (§13.18, §13.19: OR; the
//! target only supports in-order data).

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed step is a failed test

use std::net::TcpStream;
use std::time::Duration;

use ferrite_iscsi::initiator::{Command, Initiator, ScsiResult};
use ferrite_tests::{Ferrited, Login};

const IQN: &str = "iqn.2026-11.org.ferrite:default";
const BS: usize = 512;
/// SCSI Response flags (RFC 7143 §11.4.1): residual overflow, underflow.
const O: u8 = 0x04;
const U: u8 = 0x02;

/// One negotiated combination.
#[derive(Clone, Copy, Debug)]
struct Case {
    initial_r2t: bool,
    immediate: bool,
    first: u32,
    max: u32,
    outstanding: u32,
}

impl Case {
    /// FirstBurstLength as the target must answer it (§13.14: at most
    /// MaxBurstLength).
    fn first_eff(&self) -> u32 {
        self.first.min(self.max)
    }

    /// Bytes the initiator may send without an R2T for a write of
    /// `edtl` bytes (§13.10, §13.11): immediate data up to FirstBurstLength
    /// (and the target's MaxRecvDataSegmentLength, 256 KiB here), then,
    /// with InitialR2T=No, unsolicited Data-Out up to FirstBurstLength.
    fn unsolicited(&self, edtl: usize) -> usize {
        let f = self.first_eff() as usize;
        let imm = if self.immediate { edtl.min(f) } else { 0 };
        if self.initial_r2t { imm } else { edtl.min(f) }
    }
}

fn cases() -> Vec<Case> {
    let bursts = [
        (512, 512),
        (512, 8192),
        (8192, 8192),
        (8192, 65536),
        (65536, 65536),
        (65536, 8192), // First > Max: clamped to Max.
    ];
    let mut v = Vec::new();
    for initial_r2t in [true, false] {
        for immediate in [true, false] {
            for (first, max) in bursts {
                for outstanding in [1, 4] {
                    v.push(Case {
                        initial_r2t,
                        immediate,
                        first,
                        max,
                        outstanding,
                    });
                }
            }
        }
    }
    v
}

fn yn(b: bool) -> String {
    if b { "Yes" } else { "No" }.into()
}

fn key<'a>(i: &'a Initiator<TcpStream>, k: &str) -> &'a str {
    i.login_keys
        .iter()
        .find(|(n, _)| n == k)
        .map(|(_, v)| v.as_str())
        .unwrap_or_else(|| panic!("target did not answer {k}: {:?}", i.login_keys))
}

fn login(f: &Ferrited, n: usize, c: &Case) -> Initiator<TcpStream> {
    let mut login = Login::new("iqn.2026-11.org.ferrite.test:matrix", IQN)
        .isid([0x80, 0, 0, 0x4d, (n >> 8) as u8, n as u8])
        .with(|cfg| {
            cfg.immediate_data = c.immediate;
            cfg.initial_r2t = c.initial_r2t;
            cfg.first_burst_length = c.first;
            cfg.max_burst_length = c.max;
        })
        .key("MaxOutstandingR2T", &c.outstanding.to_string())
        .read_timeout(Duration::from_secs(30));
    if c.outstanding > 1 {
        login = login
            .key("DataPDUInOrder", "No")
            .key("DataSequenceInOrder", "No");
    }
    login
        .try_connect(f.addr)
        .unwrap_or_else(|e| panic!("login {c:?}: {e}"))
}

fn rw16(write: bool, lba: u64, blocks: u32) -> [u8; 16] {
    let mut c = [0u8; 16];
    c[0] = if write { 0x8a } else { 0x88 };
    c[2..10].copy_from_slice(&lba.to_be_bytes());
    c[10..14].copy_from_slice(&blocks.to_be_bytes());
    c
}

fn pattern(len: usize, seed: usize) -> Vec<u8> {
    (0..len)
        .map(|k| (k / 7 + seed * 31 + k % 251) as u8)
        .collect()
}

fn write(i: &mut Initiator<TcpStream>, lba: u64, blocks: u32, data: &[u8]) -> ScsiResult {
    i.command(&Command {
        cdb: &rw16(true, lba, blocks),
        write: data,
        attr: 1,
        ..Command::default()
    })
    .expect("WRITE (16)")
}

fn read(i: &mut Initiator<TcpStream>, lba: u64, len: usize) -> Vec<u8> {
    let r = i
        .command(&Command {
            cdb: &rw16(false, lba, (len / BS) as u32),
            read_len: len as u32,
            attr: 1,
            ..Command::default()
        })
        .expect("READ (16)");
    assert_eq!(r.status, 0, "READ (16) of {len} bytes: {r:?}");
    r.data
}

/// Lengths below, at and above the bursts of `c`, whole blocks, at most
/// 256 KiB.
fn lengths(c: &Case) -> Vec<usize> {
    let (f, m) = (c.first_eff() as usize, c.max as usize);
    let mut v: Vec<usize> = [BS, f - BS, f, f + BS, m, m + BS, 2 * m + f]
        .into_iter()
        .filter(|l| (BS..=256 * 1024).contains(l))
        .collect();
    v.sort_unstable();
    v.dedup();
    v
}

#[test]
fn every_negotiated_combination_moves_the_data_and_reports_residuals() {
    let dir = tempfile::tempdir().unwrap();
    let f = Ferrited::start_default(dir.path());
    let all = cases();
    assert_eq!(all.len(), 48);
    for (n, c) in all.iter().enumerate() {
        let mut i = login(&f, n, c);
        // The negotiated values (§13.10 OR, §13.11 AND, §13.13/§13.14/§13.17
        // minimum, FirstBurstLength clamped to MaxBurstLength).
        assert_eq!(key(&i, "InitialR2T"), yn(c.initial_r2t), "{c:?}");
        assert_eq!(key(&i, "ImmediateData"), yn(c.immediate), "{c:?}");
        assert_eq!(key(&i, "MaxBurstLength"), c.max.to_string(), "{c:?}");
        assert_eq!(
            key(&i, "FirstBurstLength"),
            c.first_eff().to_string(),
            "{c:?}"
        );
        assert_eq!(
            key(&i, "MaxOutstandingR2T"),
            c.outstanding.to_string(),
            "{c:?}"
        );
        if c.outstanding > 1 {
            assert_eq!(key(&i, "DataPDUInOrder"), "Yes", "{c:?}");
            assert_eq!(key(&i, "DataSequenceInOrder"), "Yes", "{c:?}");
        }
        // The nexus' POWER ON unit attention.
        let _ = i.command(&Command {
            cdb: &[0; 6],
            attr: 1,
            ..Command::default()
        });
        // Each case owns 2 MiB of the image: 512 KiB per length slot is
        // more than the largest transfer.
        let base = (n as u64) * 4096;
        for (k, len) in lengths(c).into_iter().enumerate() {
            let lba = base + (k as u64 % 4) * 1024;
            let data = pattern(len, n * 16 + k);
            let r = write(&mut i, lba, (len / BS) as u32, &data);
            assert_eq!(r.status, 0, "{c:?} write of {len}: {r:?}");
            assert_eq!(r.flags & (O | U), 0, "{c:?} write of {len}: residual");
            let want = (len - c.unsolicited(len)).div_ceil(c.max as usize);
            assert_eq!(
                r.r2ts as usize, want,
                "{c:?} write of {len}: R2Ts sent by the target"
            );
            assert!(
                read(&mut i, lba, len) == data,
                "{c:?} write of {len}: read back differs"
            );
        }

        // Residuals (RFC 7143 §11.4.5, SAM-5 §5.4.1, FCP-4 §9.4.2 for
        // what reaches the medium): the CDB asks for `blocks`, the expected
        // data transfer length says otherwise.
        let lba = base + 3072;
        let blocks = (c.first_eff() as usize / BS).max(2);
        let spdtl = blocks * BS;
        let span = spdtl + c.first_eff() as usize + BS;
        for (edtl, flag) in [
            // Underflow: more data than the command transfers, by a whole
            // first burst (the unsolicited part runs past the CDB's length).
            (spdtl + c.first_eff() as usize, U),
            // Overflow by half a block: only the whole blocks within the
            // EDTL are written.
            (spdtl - BS / 2, O),
        ] {
            let fill = vec![b'a'; span];
            let r = write(&mut i, lba, (span / BS) as u32, &fill);
            assert_eq!(r.status, 0, "{c:?} fill: {r:?}");
            let r = write(&mut i, lba, blocks as u32, &vec![b'b'; edtl]);
            assert_eq!(r.status, 0, "{c:?} EDTL {edtl} for {spdtl}: {r:?}");
            assert_eq!(
                r.flags & (O | U),
                flag,
                "{c:?} EDTL {edtl} for {spdtl}: residual flags {:#04x}",
                r.flags
            );
            assert_eq!(
                r.residual as usize,
                edtl.abs_diff(spdtl),
                "{c:?} EDTL {edtl} for {spdtl}: residual count"
            );
            let got = read(&mut i, lba, span);
            let whole = edtl.min(spdtl) / BS * BS;
            assert!(
                got[..whole].iter().all(|&b| b == b'b'),
                "{c:?} EDTL {edtl} for {spdtl}: data missing"
            );
            assert!(
                got[whole..].iter().all(|&b| b == b'a'),
                "{c:?} EDTL {edtl} for {spdtl}: written past the command"
            );
        }
        i.logout(0).expect("logout");
    }
}
