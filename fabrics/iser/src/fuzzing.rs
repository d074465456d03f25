//! Entry points for fuzz targets (the cargo-fuzz targets live in `fuzz/`):
//! arbitrary Sends and RDMA completions through an [`IserConn`], with a
//! stand-in core answering what reaches it. They panic only when an
//! invariant breaks, which is the bug a fuzzer is looking for.

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ferrite_core::{Action, CmdId, DataDir, Response, TaskTag, TmfId, TmfResponse};
use ferrite_iscsi::conn::{ConnEvent, IscsiConfig, IscsiTarget};
use ferrite_iscsi::keys::encode_text;
use ferrite_iscsi::pdu::{BHS_LEN, BhsBuf, Opcode, flags};
use ferrite_reactor::buf::{IoBuf, SgList};

use crate::cm::CmRequest;
use crate::conn::IserConn;
use crate::datamover::Transmit;
use crate::header::{HEADER_LEN, Header};

const TARGET: &str = "iqn.2026-01.dev.ferrite:fuzz";
/// Receive buffers the connection is told it has.
const RECVS: u32 = 8;
/// The most read data the stand-in core returns for one command.
const MAX_READ: usize = 64 * 1024;

fn conn(now: Instant, send_invalidate: bool) -> IserConn {
    let cfg = IscsiConfig {
        targets: vec![IscsiTarget {
            name: TARGET.into(),
            alias: None,
            tpgt: 1,
            portals: vec![],
            auth: Default::default(),
        }],
        max_recv_data_segment_length: 8192,
        nop_in_interval: Some(Duration::from_secs(1)),
        ..IscsiConfig::default()
    };
    let a = SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 3260));
    let cm = CmRequest {
        zero_based: false,
        send_invalidate,
    };
    IserConn::new(now, Arc::new(cfg), a, a, 7, &cm, RECVS)
}

/// Answers the connection's events as a core would, at once.
fn run_core(c: &mut IserConn, now: Instant) {
    while let Some(ev) = c.conn_mut().poll_event() {
        let a = match ev {
            ConnEvent::SessionRequest { .. } => {
                c.conn_mut().accept_session(1);
                continue;
            }
            ConnEvent::Command(req) => {
                let id = CmdId(req.tag.0 as u32);
                let len = req.expected_len as usize;
                match req.dir {
                    DataDir::Write | DataDir::Bidi => Action::FetchData {
                        id,
                        tag: req.tag,
                        buf: SgList::zeroed(len.min(1 << 20)),
                        offset: 0,
                        len: len.min(1 << 20) as u32,
                    },
                    DataDir::Read => {
                        let n = len.min(MAX_READ);
                        Action::Respond {
                            id,
                            tag: req.tag,
                            rsp: Response {
                                data: Some(SgList::from(IoBuf::new(n))),
                                data_len: n as u32,
                                ..Response::good()
                            },
                        }
                    }
                    DataDir::None => Action::Respond {
                        id,
                        tag: req.tag,
                        rsp: Response::good(),
                    },
                }
            }
            ConnEvent::DataOutDone { id, .. } => Action::Respond {
                id,
                tag: TaskTag(u64::from(id.0)),
                rsp: Response::good(),
            },
            ConnEvent::TaskMgmt(req) => Action::TmfDone {
                id: TmfId(1),
                tag: req.tag,
                rsp: TmfResponse::Complete,
            },
            _ => continue,
        };
        c.conn_mut().handle_action(now, a);
    }
}

/// Drains the transmits, checking each; returns the RDMA READs asked for.
fn drain(c: &mut IserConn, reads: &mut Vec<(u32, u32, u32, usize)>) {
    while let Some(t) = c.poll_transmit() {
        match t {
            Transmit::Send { msg, .. } => {
                assert!(msg.len() >= HEADER_LEN + BHS_LEN, "short Send");
                assert_eq!(msg[..HEADER_LEN], Header::target(), "target iSER header");
            }
            Transmit::Write { data, remote, .. } => {
                assert!(remote.len as usize <= data.len(), "WRITE past its data");
            }
            Transmit::Read {
                itt,
                ttt,
                offset,
                remote,
            } => reads.push((itt, ttt, offset, remote.len as usize)),
        }
    }
    let dm = c.conn().datamover();
    assert!(
        dm.unexpected_outstanding() <= dm.unexpected_limit(),
        "{} unexpected PDUs outstanding, limit {}",
        dm.unexpected_outstanding(),
        dm.unexpected_limit()
    );
}

/// One logged-in connection (and one still logging in) fed arbitrary
/// input: each record is a control byte and a 2-byte length, then that
/// many bytes. Control byte bit 0: the bytes follow an iSER control
/// header (else they are the whole Send); bit 1: complete the oldest RDMA
/// READ asked for (bit 2: as failed); bit 3: an RDMA WRITE failed.
/// Invariants: no panic, every Send the target makes starts with its
/// iSER header, no RDMA WRITE runs past its data, and the unexpected PDUs
/// outstanding never exceed the limit.
pub fn conn_input(data: &[u8]) {
    let now = Instant::now();
    for (logged_in, inv) in [(false, true), (true, false), (true, true)] {
        let mut c = conn(now, inv);
        let mut reads = Vec::new();
        if logged_in {
            let mut b = BhsBuf::new(Opcode::LOGIN_REQ, flags::T | (1 << 2) | 3);
            b.set_immediate().set_u32(24, 10);
            let keys = encode_text(&[
                ("InitiatorName", "iqn.2026-01.dev.ferrite:fuzzer"),
                ("TargetName", TARGET),
                ("RDMAExtensions", "Yes"),
                ("MaxOutstandingUnexpectedPDUs", "4"),
            ]);
            b.set_data_len(keys.len() as u32);
            let mut msg = Header::default().encode().to_vec();
            msg.extend_from_slice(&b.0);
            msg.extend_from_slice(&keys);
            c.recv(now, &msg);
            run_core(&mut c, now);
            drain(&mut c, &mut reads);
            assert!(c.conn().is_full_feature(), "fuzz login failed");
        }
        let mut rest = data;
        let mut now = now;
        while rest.len() >= 3 {
            let ctl = rest[0];
            let len = usize::from(u16::from_be_bytes([rest[1], rest[2]]));
            let body = &rest[3..(3 + len).min(rest.len())];
            rest = &rest[(3 + len).min(rest.len())..];
            let mut msg = Vec::new();
            if ctl & 1 != 0 {
                msg.extend_from_slice(&Header::default().encode());
            }
            msg.extend_from_slice(body);
            c.recv(now, &msg);
            run_core(&mut c, now);
            drain(&mut c, &mut reads);
            if ctl & 2 != 0 && !reads.is_empty() {
                let (itt, ttt, off, n) = reads.remove(0);
                let bytes = vec![0xa5u8; n];
                let got = (ctl & 4 == 0).then_some(&bytes[..]);
                c.read_done(itt, ttt, off, got);
            }
            if ctl & 8 != 0 {
                c.transfer_failed("RDMA WRITE");
            }
            run_core(&mut c, now);
            drain(&mut c, &mut reads);
            now += Duration::from_millis(300);
            if c.conn().poll_timeout().is_some_and(|t| t <= now) {
                c.conn_mut().handle_timeout(now);
                run_core(&mut c, now);
                drain(&mut c, &mut reads);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(ctl: u8, body: &[u8]) -> Vec<u8> {
        let mut v = vec![ctl];
        v.extend_from_slice(&(body.len() as u16).to_be_bytes());
        v.extend_from_slice(body);
        v
    }

    /// A SCSI command PDU with the iSER header's STags set, `dir` R or W.
    fn cmd(itt: u32, sn: u32, dir: u8, edtl: u32, imm: usize) -> Vec<u8> {
        let h = Header {
            write: Some(crate::header::Remote { stag: 1, base: 0 }),
            read: Some(crate::header::Remote { stag: 2, base: 0 }),
        };
        let mut b = BhsBuf::new(Opcode::SCSI_CMD, flags::F | dir | 1);
        b.set_itt(itt)
            .set_u32(20, edtl)
            .set_u32(24, sn)
            .set_data_len(imm as u32);
        b.0[32] = if dir == flags::W { 0x2a } else { 0x28 };
        let mut v = h.encode().to_vec();
        v.extend_from_slice(&b.0);
        v.extend(std::iter::repeat_n(0x5a, imm));
        v
    }

    /// Random and structured inputs: 3,000 by default,
    /// `FERRITE_FUZZ_ROUNDS=100000` for a long run.
    #[test]
    fn random_input_never_breaks_the_invariants() {
        let rounds: usize = std::env::var("FERRITE_FUZZ_ROUNDS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(3_000);
        let mut seed = 0x2545_f491_4f6c_dd1d_u64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for round in 0..rounds {
            let mut input = Vec::new();
            for k in 0..(next() % 8) {
                let sn = 10 + k as u32;
                match next() % 6 {
                    0 => {
                        let n = (next() % 200) as usize;
                        let body: Vec<u8> = (0..n).map(|_| next() as u8).collect();
                        input.extend(record(next() as u8, &body));
                    }
                    1 => input.extend(record(2, &cmd(k as u32, sn, flags::W, 16384, 4096))),
                    2 => input.extend(record(0, &cmd(k as u32, sn, flags::R, 8192, 0))),
                    3 => {
                        // A valid command with random bytes over its BHS.
                        let mut c = cmd(k as u32, sn, flags::W, (next() % 70000) as u32, 512);
                        for _ in 0..4 {
                            let at = (next() as usize) % c.len();
                            c[at] = next() as u8;
                        }
                        input.extend(record(next() as u8 & 0xe, &c));
                    }
                    4 => input.extend(record(2 | (next() as u8 & 4), &[])),
                    _ => {
                        let mut b = BhsBuf::new(Opcode((next() % 0x40) as u8), flags::F);
                        b.set_itt(next() as u32).set_u32(24, sn);
                        let mut v = Header::default().encode().to_vec();
                        v.extend_from_slice(&b.0);
                        input.extend(record(0, &v));
                    }
                }
            }
            if round % 97 == 0 {
                input.truncate((next() as usize) % (input.len() + 1));
            }
            conn_input(&input);
        }
    }

    /// A solicited write goes through: the fuzz harness drives the real
    /// path, not just error exits.
    #[test]
    fn the_harness_reaches_rdma_reads() {
        let now = Instant::now();
        let mut c = conn(now, true);
        let mut b = BhsBuf::new(Opcode::LOGIN_REQ, flags::T | (1 << 2) | 3);
        b.set_immediate().set_u32(24, 10);
        let keys = encode_text(&[
            ("InitiatorName", "iqn.i"),
            ("TargetName", TARGET),
            ("RDMAExtensions", "Yes"),
        ]);
        b.set_data_len(keys.len() as u32);
        let mut msg = Header::default().encode().to_vec();
        msg.extend_from_slice(&b.0);
        msg.extend_from_slice(&keys);
        c.recv(now, &msg);
        run_core(&mut c, now);
        let mut reads = Vec::new();
        drain(&mut c, &mut reads);
        c.recv(now, &cmd(5, 10, flags::W, 16384, 4096));
        run_core(&mut c, now);
        drain(&mut c, &mut reads);
        assert_eq!(reads, vec![(5, reads[0].1, 4096, 12288)]);
    }
}
