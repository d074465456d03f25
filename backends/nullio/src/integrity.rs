//! A data-integrity check any backend queue can be put through (the file and
//! block backends use it from their tests).
//!
//! Random-size, random-offset writes of multi-segment buffers, kept up to the
//! queue's depth (in-flight writes never overlap, so the outcome is defined),
//! optionally mixed with unmap and write-zeroes; then every block of the
//! device is read back and compared with a model that remembers, per block,
//! which write last stored it. Each written block carries its LBA and write
//! number followed by bytes derived from both, so misplaced, stale or torn
//! data is caught, not only missing data.

use std::collections::HashMap;

use ferrite_core::backend::{BackendQueue, BlockDone, BlockOp, Busy, Geometry};
use ferrite_reactor::buf::{IoBuf, SgList};

/// A small seeded generator (xorshift64*), so failures replay.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// A generator from `seed` (0 is remapped).
    pub fn new(seed: u64) -> Rng {
        Rng(seed.max(1).wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform in `[lo, hi]`.
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next_u64() % (hi - lo + 1)
    }
}

/// What a run did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Report {
    pub writes: u64,
    pub zeroings: u64,
    pub blocks_checked: u64,
}

/// Options of a run.
#[derive(Clone, Copy, Debug)]
pub struct Options {
    /// Writes to issue.
    pub writes: u64,
    /// Largest write, in blocks.
    pub max_blocks: u64,
    /// Mix in unmaps (the backend must read them back as zeroes:
    /// `Caps::unmap_zeroes`).
    pub unmap: bool,
    /// Mix in write-zeroes (`Caps::write_zeroes`).
    pub write_zeroes: bool,
    /// Operations kept in flight.
    pub depth: usize,
}

impl Options {
    /// `writes` writes of up to 64 blocks at queue depth 32, with unmaps and
    /// write-zeroes.
    pub fn qd32(writes: u64) -> Options {
        Options {
            writes,
            max_blocks: 64,
            unmap: true,
            write_zeroes: true,
            depth: 32,
        }
    }

    /// [`Options::qd32`] with the zeroing operations `caps` allows.
    pub fn for_caps(writes: u64, caps: ferrite_core::backend::Caps) -> Options {
        Options {
            unmap: caps.unmap && caps.unmap_zeroes,
            write_zeroes: caps.write_zeroes,
            ..Options::qd32(writes)
        }
    }
}

/// Fills one block with the pattern of (`lba`, `stamp`).
fn fill_block(b: &mut [u8], lba: u64, stamp: u64) {
    let mut r = Rng::new(lba.rotate_left(32) ^ stamp);
    for (i, chunk) in b.chunks_mut(8).enumerate() {
        let v = match i {
            0 => lba,
            1 => stamp,
            _ => r.next_u64(),
        };
        let bytes = v.to_le_bytes();
        chunk.copy_from_slice(&bytes[..chunk.len()]);
    }
}

/// A multi-segment buffer of `blocks` blocks, segments of random whole-block
/// sizes (so it suits O_DIRECT too).
fn make_sg(rng: &mut Rng, blocks: u64, bs: u64) -> SgList {
    let mut sg = SgList::new();
    let mut left = blocks;
    while left > 0 {
        let n = rng.range(1, left.min(8));
        sg.push(IoBuf::new((n * bs) as usize));
        left -= n;
    }
    sg
}

/// Runs the check on `q` (a queue of a device of geometry `geo` that starts
/// zero-filled). `idle` is called whenever a poll returned nothing (yield,
/// sleep, or wait on the queue's eventfd). Op errors and mismatches come back
/// as `Err` with a description.
pub fn run_with(
    q: &mut dyn BackendQueue,
    idle: &mut dyn FnMut(),
    geo: Geometry,
    rng: &mut Rng,
    opts: Options,
) -> Result<Report, String> {
    let bs = geo.block_size as u64;
    let nblocks = geo.num_blocks;
    if nblocks == 0 {
        return Err("device has no blocks".into());
    }
    // stamp per written block; absent = zeroes.
    let mut model: HashMap<u64, u64> = HashMap::new();
    // tag -> (lba, blocks, stamp; 0 for zeroing)
    let mut inflight: HashMap<u64, (u64, u64, u64)> = HashMap::new();
    let mut report = Report::default();
    let mut issued = 0u64;
    let mut next_tag = 1u64;
    let mut held: Option<(u64, BlockOp, (u64, u64, u64))> = None;
    let mut done: Vec<BlockDone> = Vec::new();

    while issued < opts.writes || !inflight.is_empty() || held.is_some() {
        // Fill the queue.
        while inflight.len() < opts.depth && (issued < opts.writes || held.is_some()) {
            let (tag, op, meta) = match held.take() {
                Some(h) => h,
                None => {
                    let blocks = rng.range(1, opts.max_blocks.min(nblocks));
                    let lba = rng.range(0, nblocks - blocks);
                    let overlaps = inflight
                        .values()
                        .any(|&(l, n, _)| lba < l + n && l < lba + blocks);
                    if overlaps {
                        break;
                    }
                    let tag = next_tag;
                    next_tag += 1;
                    issued += 1;
                    let offset = lba * bs;
                    let len = blocks * bs;
                    let zeroing = match rng.range(0, 19) {
                        0 if opts.unmap => Some(BlockOp::Unmap { offset, len }),
                        1 if opts.write_zeroes => Some(BlockOp::WriteZeroes { offset, len }),
                        _ => None,
                    };
                    if let Some(op) = zeroing {
                        (tag, op, (lba, blocks, 0))
                    } else {
                        let stamp = tag;
                        let mut sg = make_sg(rng, blocks, bs);
                        let mut blk = vec![0u8; bs as usize];
                        for i in 0..blocks {
                            fill_block(&mut blk, lba + i, stamp);
                            sg.copy_in((i * bs) as usize, &blk);
                        }
                        let fua = rng.range(0, 7) == 0;
                        (
                            tag,
                            BlockOp::Write {
                                offset,
                                buf: sg,
                                fua,
                            },
                            (lba, blocks, stamp),
                        )
                    }
                }
            };
            match q.submit(tag, op) {
                Ok(()) => {
                    inflight.insert(tag, meta);
                }
                Err(Busy(op)) => {
                    held = Some((tag, op, meta));
                    break;
                }
            }
        }
        done.clear();
        q.poll(&mut done);
        if done.is_empty() {
            idle();
        }
        for d in done.drain(..) {
            let Some((lba, blocks, stamp)) = inflight.remove(&d.tag) else {
                return Err(format!("completion for unknown tag {}", d.tag));
            };
            if let Err(e) = d.result {
                return Err(format!("op at lba {lba}+{blocks} failed: {e}"));
            }
            for i in 0..blocks {
                if stamp == 0 {
                    model.remove(&(lba + i));
                } else {
                    model.insert(lba + i, stamp);
                }
            }
            if stamp == 0 {
                report.zeroings += 1;
            } else {
                report.writes += 1;
                if d.buf.as_ref().map(|b| b.len() as u64) != Some(blocks * bs) {
                    return Err(format!("write tag {} did not return its buffer", d.tag));
                }
            }
        }
    }

    // Read everything back, `opts.depth` reads in flight.
    let per = opts.max_blocks.min(nblocks).max(1);
    let mut next_lba = 0u64;
    let mut reads: HashMap<u64, (u64, u64)> = HashMap::new();
    let mut held: Option<(u64, BlockOp, (u64, u64))> = None;
    let mut expect = vec![0u8; bs as usize];
    while next_lba < nblocks || !reads.is_empty() || held.is_some() {
        while reads.len() < opts.depth && (next_lba < nblocks || held.is_some()) {
            let (tag, op, meta) = match held.take() {
                Some(h) => h,
                None => {
                    let n = per.min(nblocks - next_lba);
                    let tag = next_tag;
                    next_tag += 1;
                    let sg = make_sg(rng, n, bs);
                    let op = BlockOp::Read {
                        offset: next_lba * bs,
                        buf: sg,
                    };
                    let meta = (next_lba, n);
                    next_lba += n;
                    (tag, op, meta)
                }
            };
            match q.submit(tag, op) {
                Ok(()) => {
                    reads.insert(tag, meta);
                }
                Err(Busy(op)) => {
                    held = Some((tag, op, meta));
                    break;
                }
            }
        }
        done.clear();
        q.poll(&mut done);
        if done.is_empty() {
            idle();
        }
        for d in done.drain(..) {
            let Some((lba, n)) = reads.remove(&d.tag) else {
                return Err(format!("completion for unknown tag {}", d.tag));
            };
            if let Err(e) = d.result {
                return Err(format!("read at lba {lba}+{n} failed: {e}"));
            }
            let Some(buf) = d.buf else {
                return Err(format!("read at lba {lba} returned no buffer"));
            };
            for i in 0..n {
                let l = lba + i;
                match model.get(&l) {
                    Some(&stamp) => fill_block(&mut expect, l, stamp),
                    None => expect.fill(0),
                }
                let got: Vec<u8> = buf
                    .slices((i * bs) as usize, bs as usize)
                    .flatten()
                    .copied()
                    .collect();
                if got != expect {
                    let got_stamp = u64::from_le_bytes(got[8..16].try_into().unwrap_or([0; 8]));
                    return Err(format!(
                        "lba {l}: expected stamp {:?}, found block with stamp {got_stamp}",
                        model.get(&l)
                    ));
                }
                report.blocks_checked += 1;
            }
        }
    }
    Ok(report)
}

/// [`run_with`] with [`Options::qd32`] and `writes` writes.
pub fn run(
    q: &mut dyn BackendQueue,
    idle: &mut dyn FnMut(),
    geo: Geometry,
    rng: &mut Rng,
    writes: u64,
) -> Result<Report, String> {
    run_with(q, idle, geo, rng, Options::qd32(writes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pattern_depends_on_lba_and_stamp() {
        let mut a = vec![0u8; 512];
        let mut b = vec![0u8; 512];
        fill_block(&mut a, 5, 1);
        fill_block(&mut b, 5, 2);
        assert_ne!(a, b);
        fill_block(&mut b, 6, 1);
        assert_ne!(a, b);
        fill_block(&mut b, 5, 1);
        assert_eq!(a, b);
    }

    #[test]
    fn rng_range_bounds() {
        let mut r = Rng::new(3);
        for _ in 0..1000 {
            let v = r.range(4, 9);
            assert!((4..=9).contains(&v));
        }
    }
}
