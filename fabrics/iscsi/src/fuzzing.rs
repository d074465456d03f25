//! Entry points for fuzz targets (the cargo-fuzz targets live in `fuzz/`): each
//! feeds arbitrary bytes to one wire parser of this crate and checks its
//! invariant. They panic only when an invariant breaks, which is the bug a
//! fuzzer is looking for.

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::conn::{Conn, ConnEvent, IscsiConfig, IscsiTarget, TxQueue};
use crate::keys::{encode_text, parse_text};
use crate::pdu::{BhsBuf, Opcode, Pdu, flags};

const TARGET: &str = "iqn.2026-01.dev.ferrite:fuzz";

/// `Pdu::parse` never claims more bytes than it was given, and what it
/// parses encodes back to the same bytes (digests off).
pub fn pdu_parse(data: &[u8]) {
    for (hd, dd) in [(false, false), (true, true)] {
        if let Ok(Some((p, n))) = Pdu::parse(data, hd, dd, 1 << 20) {
            assert!(n <= data.len(), "parse took {n} of {} bytes", data.len());
            if !hd && !dd {
                let mut again = p.encode(false, false);
                // Padding bytes are not kept; compare what is.
                again.truncate(n);
                assert_eq!(again[..48], data[..48]);
            }
        }
    }
}

/// Text that parses encodes back to text that parses to the same pairs.
pub fn text(data: &[u8]) {
    if let Ok(pairs) = parse_text(data) {
        let again = encode_text(&pairs);
        assert_eq!(parse_text(&again).ok(), Some(pairs));
    }
}

fn conn(now: Instant) -> Conn {
    let cfg = IscsiConfig {
        targets: vec![IscsiTarget {
            name: TARGET.into(),
            alias: None,
            tpgt: 1,
            portals: vec![],
            auth: Default::default(),
        }],
        nop_in_interval: Some(Duration::from_secs(1)),
        ..IscsiConfig::default()
    };
    let a = SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 3260));
    Conn::new(now, Arc::new(cfg), a, a, 7)
}

/// Feeds `data` in pieces, draining events and output; consumption never
/// exceeds what was offered.
fn feed(c: &mut Conn, mut now: Instant, data: &[u8]) {
    let mut buf: Vec<u8> = Vec::new();
    let mut tx = TxQueue::new();
    for piece in data.chunks(61) {
        buf.extend_from_slice(piece);
        let n = c.handle_input(now, &buf);
        assert!(n <= buf.len(), "consumed {n} of {}", buf.len());
        buf.drain(..n);
        while let Some(ev) = c.poll_event() {
            if let ConnEvent::SessionRequest { .. } = ev {
                c.accept_session(1);
            }
        }
        c.poll_transmit(&mut tx);
        tx.segs.clear();
        now += Duration::from_millis(400);
        if c.poll_timeout().is_some_and(|t| t <= now) {
            c.handle_timeout(now);
        }
    }
}

/// A connection fed arbitrary bytes from the start (login phase), and one
/// fed them after a completed login.
pub fn conn_input(data: &[u8]) {
    let now = Instant::now();
    let mut c = conn(now);
    feed(&mut c, now, data);

    let mut c = conn(now);
    let mut login = BhsBuf::new(Opcode::LOGIN_REQ, flags::T | (1 << 2) | 3);
    login.set_immediate();
    let keys = encode_text(&[
        ("InitiatorName", "iqn.2026-01.dev.ferrite:fuzzer"),
        ("TargetName", TARGET),
        ("MaxRecvDataSegmentLength", "8192"),
    ]);
    let mut stream = Pdu::with_data(login, keys).encode(false, false);
    stream.extend_from_slice(data);
    feed(&mut c, now, &stream);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entry_points_accept_anything() {
        let mut seed = 0x9e37_79b9_u64;
        for len in [0usize, 1, 47, 48, 49, 100, 300, 1000] {
            let data: Vec<u8> = (0..len)
                .map(|_| {
                    seed ^= seed << 13;
                    seed ^= seed >> 7;
                    seed ^= seed << 17;
                    seed as u8
                })
                .collect();
            pdu_parse(&data);
            text(&data);
            conn_input(&data);
        }
        text(b"A=1\0B=2\0");
        let p = Pdu::with_data(BhsBuf::new(Opcode::NOP_OUT, flags::F), b"abc".to_vec());
        pdu_parse(&p.encode(false, false));
    }

    /// A random run with structured prefixes: 5,000 inputs by default,
    /// `FERRITE_FUZZ_ROUNDS=200000` for a long run.
    #[test]
    fn long_random_run() {
        let rounds: usize = std::env::var("FERRITE_FUZZ_ROUNDS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(5_000);
        let mut seed = 0x2545_f491_4f6c_dd1d_u64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        let ops = [0x00u8, 0x01, 0x02, 0x04, 0x05, 0x06, 0x10, 0x43];
        for _ in 0..rounds {
            let n = (next() % 600) as usize;
            let mut d: Vec<u8> = (0..n).map(|_| next() as u8).collect();
            let mut at = 0;
            while at + 48 <= d.len() {
                d[at] = ops[(next() % ops.len() as u64) as usize];
                d[at + 4] = (next() % 2) as u8;
                d[at + 5] = 0;
                d[at + 6] = 0;
                d[at + 7] = (next() % 64) as u8;
                at += 48 + (d[at + 4] as usize) * 4 + d[at + 7] as usize + (next() % 8) as usize;
            }
            pdu_parse(&d);
            text(&d);
            conn_input(&d);
        }
    }
}
