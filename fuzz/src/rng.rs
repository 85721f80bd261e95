//! The fuzzer's random numbers: SplitMix64, seeded per input, so an input replays from its seed.

/// A SplitMix64 generator: small, fast, and good enough to choose mutations.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// A generator starting from `seed`.
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(weir_core::splitmix::GOLDEN_GAMMA);
        mix(self.0)
    }

    /// A number in `0..n`; 0 when `n` is 0.
    pub fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            return 0;
        }
        // The bias of a plain modulo is negligible for the small ranges used here.
        (self.next_u64() % n as u64) as usize
    }

    /// True with probability `percent / 100`.
    pub fn percent(&mut self, percent: u32) -> bool {
        self.next_u64() % 100 < u64::from(percent)
    }

    /// A random byte.
    pub fn byte(&mut self) -> u8 {
        self.next_u64() as u8
    }

    /// One of `items`, or `None` when there are none.
    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> Option<&'a T> {
        items.get(self.below(items.len()))
    }
}

/// SplitMix64's finalizer: a bijective mix of 64 bits.
pub fn mix(z: u64) -> u64 {
    weir_core::splitmix::mix64(z)
}

/// The seed of input `index` of the target `name` in a run seeded with `base`: distinct per
/// target, so targets do not share their sequences.
pub fn input_seed(base: u64, name: &str, index: u64) -> u64 {
    let name_hash = name.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    mix(mix(base ^ name_hash).wrapping_add(index))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sequences_replay_from_their_seed_and_differ_between_seeds() {
        let a: Vec<u64> = (0..4)
            .map(|_| 0)
            .scan(Rng::new(7), |r, _: u64| Some(r.next_u64()))
            .collect();
        let b: Vec<u64> = (0..4)
            .map(|_| 0)
            .scan(Rng::new(7), |r, _: u64| Some(r.next_u64()))
            .collect();
        let c: Vec<u64> = (0..4)
            .map(|_| 0)
            .scan(Rng::new(8), |r, _: u64| Some(r.next_u64()))
            .collect();
        assert_eq!(a, b);
        assert_ne!(a, c);
        assert_ne!(input_seed(1, "keyed", 0), input_seed(1, "tcp", 0));
        assert_ne!(input_seed(1, "keyed", 0), input_seed(1, "keyed", 1));
        assert_eq!(input_seed(1, "keyed", 5), input_seed(1, "keyed", 5));
        let mut r = Rng::new(3);
        assert!((0..1000).all(|_| r.below(7) < 7));
        assert_eq!(r.below(0), 0);
        assert!(r.pick::<u8>(&[]).is_none());
    }
}
