//! SplitMix64 (Steele, Lea and Flood), written once: the finalizer every seeded generator and
//! fault decision in Weir hashes with, and a small generator over it for tests and the fuzzer.

/// The increment of SplitMix64: 2^64 divided by the golden ratio.
pub const GOLDEN_GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;

/// SplitMix64's output function (the finalizer of MurmurHash3's variant 13).
#[inline]
pub fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// One SplitMix64 step from state `x`: `mix64(x + GOLDEN_GAMMA)`, a fast, well-mixed 64-bit hash.
#[inline]
pub fn splitmix64(x: u64) -> u64 {
    mix64(x.wrapping_add(GOLDEN_GAMMA))
}

/// A SplitMix64 generator: the `n`-th output of seed `s` is `mix64(s + (n + 1) * GOLDEN_GAMMA)`.
#[derive(Clone, Debug)]
pub struct SplitMix(pub u64);

impl SplitMix {
    /// The next 64 bits.
    #[inline]
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(GOLDEN_GAMMA);
        mix64(self.0)
    }

    /// A number in `0..n`; 0 when `n` is 0 (a plain modulo: its bias is negligible for the
    /// small ranges of tests).
    #[inline]
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 { 0 } else { self.next_u64() % n }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_the_reference_sequence() {
        // The first outputs of Vigna's splitmix64.c seeded with 0.
        let mut g = SplitMix(0);
        assert_eq!(g.next_u64(), 0xE220_A839_7B1D_CDAF);
        assert_eq!(g.next_u64(), 0x6E78_9E6A_A1B9_65F4);
        assert_eq!(splitmix64(0), 0xE220_A839_7B1D_CDAF);
        assert_eq!(g.below(0), 0);
    }
}
