//! Shared by the SRP end-to-end tests (`srp_e2e`, `srp_linux_login`,
//! `srp_verbs`): target port ids from their hex form, READ/WRITE (16) CDBs,
//! data patterns, and clearing a new nexus's unit attentions with the project's
//! initiator.
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
