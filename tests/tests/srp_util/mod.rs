//! Shared by the SRP end-to-end tests (`srp_e2e`, `srp_linux_login`,
//! `srp_mgmt`, `srp_overload`, `srp_verbs`): the login of the project's
//! initiator over the soft RDMA provider, target port ids from their hex
//! form, READ/WRITE (16) CDBs, data patterns, and with the project's
//! initiator clearing a new nexus's unit attentions, reading REPORT LUNS,
//! verified READ/WRITE (16) and a channel lost mid-transfer beside another
//! channel of its nexus.
#![allow(dead_code)] // each test binary uses a part

use std::path::Path;
use std::time::{Duration, Instant};

use ferrite_rdma::soft::{SoftAddr, SoftCq, SoftDevice};
use ferrite_scsi::Lun;
use ferrite_srp::initiator::{self, InitError, Initiator, InitiatorConfig, Layout};
use ferrite_srp::iu;
use ferrite_tests::Ferrited;

/// An SRP channel of the project's initiator and the soft RDMA device it
/// runs on (which must live as long as the channel).
pub struct Srp {
    pub ini: Initiator,
    _dev: SoftDevice,
}

/// One login over the soft provider's Unix socket `sock` with `cfg`.
pub fn try_login_soft(sock: &Path, cfg: InitiatorConfig) -> Result<Srp, InitError> {
    let dev = SoftDevice::new("ini");
    let pd = dev.alloc_pd();
    let cq = SoftCq::new().expect("completion queue");
    initiator::connect_soft(&pd, &cq, &SoftAddr::Unix(sock.into()), cfg)
        .map(|ini| Srp { ini, _dev: dev })
}

/// [`try_login_soft`], retried for 20 s while ferrited brings its port up.
pub fn login_soft(sock: &Path, cfg: InitiatorConfig) -> Srp {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match try_login_soft(sock, cfg.clone()) {
            Ok(s) => return s,
            Err(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(100)),
            Err(e) => panic!("SRP login to {}: {e}", sock.display()),
        }
    }
}

/// The block size of the test disks.
pub const BS: usize = 512;

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

/// WRITE (16) of `data` at `lba` on LUN 0, which must be GOOD.
pub fn write16(ini: &mut Initiator, lba: u64, data: &[u8]) {
    let c = ini
        .command(
            Lun(0),
            &rw(0x8a, lba, (data.len() / BS) as u32),
            Some(data),
            0,
            Layout::default(),
        )
        .expect("WRITE (16)");
    assert_eq!(c.rsp.status, 0, "WRITE(16) at {lba}: {:?}", c.rsp);
}

/// READ (16) of `len` bytes at `lba` on LUN 0, which must be GOOD.
pub fn read16(ini: &mut Initiator, lba: u64, len: usize) -> Vec<u8> {
    let c = ini
        .command(
            Lun(0),
            &rw(0x88, lba, (len / BS) as u32),
            None,
            len as u32,
            Layout::default(),
        )
        .expect("READ (16)");
    assert_eq!(c.rsp.status, 0, "READ(16) at {lba}: {:?}", c.rsp);
    c.data
}

/// Channel A (`a`, whose initiator `ini_of` gives) and channel B of one
/// nexus write concurrently: A 1 MiB writes (RDMA READ) and 8 KiB ones
/// (immediate data) at LBAs 0.., B 8 KiB writes at 65536... Then A's
/// initiator vanishes (`a` dropped with its queue pair: no logout) with
/// writes in flight. B's writes complete and new ones too, the nexus lives
/// on with one channel, every write A had seen acknowledged is there whole,
/// and each block of A's others holds its old data (zeros) or its new.
pub fn lose_channel_mid_transfer<A>(
    f: &Ferrited,
    mut a: A,
    ini_of: fn(&mut A) -> &mut Initiator,
    b: &mut Initiator,
) {
    let big = Layout {
        segments: 8,
        inline_max: 2,
    };
    let a_len = |k: u64| {
        if k.is_multiple_of(2) {
            1usize << 20
        } else {
            8192
        }
    };
    let a_write = |a: &mut Initiator, k: u64| {
        let data = pattern(k as u32 + 1000, a_len(k));
        a.submit(
            Lun(0),
            &rw(0x8a, k * 2048, (a_len(k) / BS) as u32),
            Some(&data),
            0,
            big,
            iu::TASK_ATTR_SIMPLE,
        )
        .expect("A's write sent")
    };
    let mut a_tags: Vec<u64> = (0..12u64).map(|k| a_write(ini_of(&mut a), k)).collect();
    let mut b_tags = Vec::new();
    for k in 0..32u64 {
        let data = pattern(k as u32 + 2000, 8192);
        b_tags.push(
            b.submit(
                Lun(0),
                &rw(0x8a, 65536 + k * 16, 16),
                Some(&data),
                0,
                Layout::default(),
                iu::TASK_ATTR_SIMPLE,
            )
            .expect("B's write sent"),
        );
    }
    // Transfers are under way once A's first write is answered; eight more
    // sent just then are certainly in flight when A goes.
    let first = a_tags[0];
    let rsp = ini_of(&mut a).wait(first).expect("A's first write");
    assert_eq!(rsp.rsp.status, 0);
    a_tags.extend((12..20u64).map(|k| a_write(ini_of(&mut a), k)));
    // What A's initiator has seen answered, without reading any more.
    let mut acked = vec![a_tags[0]];
    acked.extend(
        a_tags[1..]
            .iter()
            .copied()
            .filter(|t| ini_of(&mut a).answered(*t)),
    );
    assert!(acked.len() < a_tags.len(), "A finished before the drop");
    eprintln!(
        "channel A lost with {} of its {} writes acknowledged",
        acked.len(),
        a_tags.len()
    );
    drop(a);
    for t in b_tags {
        assert_eq!(
            b.wait(t).expect("B's write").rsp.status,
            0,
            "B's write failed"
        );
    }
    let log = f.wait_log("SRP channel closed", 1);
    assert!(log.contains("SRP channel closed"), "{log}");
    for k in 32..64u64 {
        write16(b, 65536 + k * 16, &pattern(k as u32 + 2000, 8192));
    }
    assert!(b.closed().is_none(), "B was closed with A");
    let s = f.ctl(&["sessions"]);
    let line = s.lines().find(|l| l.starts_with("srp ")).unwrap_or("");
    assert!(
        line.contains("channels=1"),
        "the nexus lives on with B: {s}"
    );
    for k in 0..64u64 {
        assert_eq!(
            read16(b, 65536 + k * 16, 8192),
            pattern(k as u32 + 2000, 8192),
            "B's write {k}"
        );
    }
    for (k, tag) in a_tags.iter().enumerate() {
        let k = k as u64;
        let new = pattern(k as u32 + 1000, a_len(k));
        let got = read16(b, k * 2048, a_len(k));
        if acked.contains(tag) {
            assert!(got == new, "acknowledged write {k} of A lost");
            continue;
        }
        for (blk, chunk) in got.chunks(BS).enumerate() {
            let want = &new[blk * BS..(blk + 1) * BS];
            assert!(
                chunk == want || chunk.iter().all(|x| *x == 0),
                "block {blk} of A's write {k} is neither old nor new"
            );
        }
    }
}
