//! The one pseudo-random generator of the end-to-end tests: xorshift64*
//! (Vigna, "An experimental exploration of Marsaglia's xorshift
//! generators", 2016), seeded, so a failing run replays with its seed and
//! data patterns stay the same from run to run.

/// xorshift64*: a 64-bit state, shifts 12/25/27, output multiplier
/// 0x2545f4914f6cdd1d. The state must not be zero.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// A generator whose state is `seed` spread over all 64 bits (odd, so
    /// never zero): seeds 1, 2, 3 give unrelated streams.
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1)
    }

    /// A generator whose state is `state` as given (not zero).
    pub fn from_state(state: u64) -> Rng {
        Rng(state)
    }

    /// The current state.
    pub fn state(&self) -> u64 {
        self.0
    }

    /// The next 64-bit output.
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform (up to modulo bias) in `[lo, hi]`.
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next_u64() % (hi - lo + 1)
    }

    /// Fills `out` 8 bytes at a time, each output little-endian (a shorter
    /// last chunk takes the output's first bytes).
    pub fn fill(&mut self, out: &mut [u8]) {
        for chunk in out.chunks_mut(8) {
            let v = self.next_u64().to_le_bytes();
            chunk.copy_from_slice(&v[..chunk.len()]);
        }
    }

    /// `len` bytes of [`Rng::fill`].
    pub fn bytes(&mut self, len: usize) -> Vec<u8> {
        let mut v = vec![0u8; len];
        self.fill(&mut v);
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_the_reference_sequence() {
        // xorshift64* from state 1: 1 ^ 1 << 25 = 0x2000001, times the
        // multiplier.
        let mut r = Rng::from_state(1);
        assert_eq!(r.next_u64(), 0x47e4_ce4b_896c_dd1d);
        assert_eq!(r.state(), 0x0200_0001);
    }

    #[test]
    fn fill_is_next_u64_little_endian() {
        let mut a = Rng::new(7);
        let mut b = a.clone();
        let v = a.bytes(12);
        assert_eq!(v[..8], b.next_u64().to_le_bytes());
        assert_eq!(v[8..], b.next_u64().to_le_bytes()[..4]);
    }
}
