//! Shared by the SRP end-to-end tests (`srp_e2e`, `srp_linux_login`,
//! `srp_verbs`): target port ids from their hex form, READ/WRITE (16) CDBs,
//! data patterns, and with the project's initiator clearing a new nexus's
//! unit attentions and reading REPORT LUNS.
#![allow(dead_code)] // each test binary uses a part

use ferrite_scsi::Lun;
use ferrite_srp::initiator::{Initiator, Layout};

/// A port id written as `0x` and 32 hex digits, as bytes.
pub fn port_id_of(hex: &str) -> [u8; 16] {
    let h = hex.trim_start_matches("0x");
    let mut out = [0u8; 16];
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(&h[2 * i..2 * i + 2], 16).expect("32 hex digits");
    }
    out
}

/// READ (16) (`0x88`) or WRITE (16) (`0x8a`) of `blocks` at `lba`.
pub fn rw(op: u8, lba: u64, blocks: u32) -> Vec<u8> {
    let mut c = vec![0u8; 16];
    c[0] = op;
    c[2..10].copy_from_slice(&lba.to_be_bytes());
    c[10..14].copy_from_slice(&blocks.to_be_bytes());
    c
}

/// `len` bytes that differ with `seed`.
pub fn pattern(seed: u32, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| ((i as u32).wrapping_mul(2_654_435_761).wrapping_add(seed) >> 13) as u8)
        .collect()
}

/// TEST UNIT READY on LUN 0 until it is GOOD: a new nexus first gets its
/// unit attentions.
pub fn clear_ua(ini: &mut Initiator) {
    for _ in 0..8 {
        let c = ini
            .command(Lun(0), &[0u8; 6], None, 0, Layout::default())
            .expect("TEST UNIT READY");
        if c.rsp.status == 0 {
            return;
        }
    }
    panic!("unit attentions never cleared");
}

/// TEST UNIT READY on `lun` until it is GOOD (each LUN of a new nexus
/// reports its own unit attentions).
pub fn clear_ua_on(ini: &mut Initiator, lun: u16) {
    for _ in 0..8 {
        let c = ini
            .command(Lun(lun), &[0u8; 6], None, 0, Layout::default())
            .expect("TEST UNIT READY");
        if c.rsp.status == 0 {
            return;
        }
    }
    panic!("unit attentions of LUN {lun} never cleared");
}

/// The LUNs REPORT LUNS (sent to LUN 0) lists.
pub fn report_luns(ini: &mut Initiator) -> Vec<u16> {
    let mut cdb = [0u8; 12];
    cdb[0] = 0xa0;
    cdb[6..10].copy_from_slice(&1024u32.to_be_bytes());
    for _ in 0..8 {
        let c = ini
            .command(Lun(0), &cdb, None, 1024, Layout::default())
            .expect("REPORT LUNS");
        if c.rsp.status != 0 {
            continue;
        }
        let n = u32::from_be_bytes([c.data[0], c.data[1], c.data[2], c.data[3]]) as usize / 8;
        return (0..n)
            .map(|i| u16::from_be_bytes([c.data[8 + 8 * i] & 0x3f, c.data[9 + 8 * i]]))
            .collect();
    }
    panic!("REPORT LUNS kept failing");
}
