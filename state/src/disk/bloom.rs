//! The bloom filter of a sorted run: answers "certainly absent" for most keys a run does not
//! hold, so a point lookup reads a block only from runs that may have the key.

/// A bloom filter over the keys of one run: `bits` bits, `k` probes by double hashing of the
/// key's xxh3-64 hash (Kirsch–Mitzenmacher).
#[derive(Clone, Debug)]
pub(crate) struct Bloom {
    bits: Vec<u8>,
    k: u32,
}

/// The most probes a filter may use; more is damage.
pub(crate) const MAX_PROBES: u32 = 30;

impl Bloom {
    /// An empty filter sized for `entries` keys at `bits_per_key` bits each.
    pub(crate) fn new(entries: u64, bits_per_key: u32) -> Bloom {
        let bits = (entries.max(1))
            .saturating_mul(u64::from(bits_per_key))
            .max(64);
        let bytes = usize::try_from(bits.div_ceil(8)).unwrap_or(usize::MAX >> 4);
        // ln 2 · bits per key probes minimise the false-positive rate.
        let k = ((f64::from(bits_per_key) * 0.69).round() as u32).clamp(1, MAX_PROBES);
        Bloom {
            bits: vec![0; bytes],
            k,
        }
    }

    /// A filter read back from a run file.
    pub(crate) fn from_parts(bits: Vec<u8>, k: u32) -> Bloom {
        Bloom { bits, k }
    }

    /// The number of probes.
    pub(crate) fn probes(&self) -> u32 {
        self.k
    }

    /// The filter's bytes.
    pub(crate) fn bytes(&self) -> &[u8] {
        &self.bits
    }

    fn positions(&self, hash: u64) -> impl Iterator<Item = usize> + use<> {
        let n = (self.bits.len() as u64) * 8;
        let h2 = hash.rotate_left(32) | 1;
        (0..u64::from(self.k)).map(move |i| (hash.wrapping_add(i.wrapping_mul(h2)) % n) as usize)
    }

    /// Adds a key by its hash.
    pub(crate) fn insert(&mut self, hash: u64) {
        for p in self.positions(hash) {
            self.bits[p / 8] |= 1 << (p % 8);
        }
    }

    /// Whether a key with this hash may be present (false: certainly absent).
    pub(crate) fn may_contain(&self, hash: u64) -> bool {
        self.positions(hash)
            .all(|p| self.bits[p / 8] & (1 << (p % 8)) != 0)
    }
}

/// The hash a filter takes for `key`.
pub(crate) fn key_hash(key: &[u8]) -> u64 {
    xxhash_rust::xxh3::xxh3_64(key)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inserted_keys_are_found_and_most_others_are_not() {
        let mut bloom = Bloom::new(10_000, 10);
        for i in 0..10_000u32 {
            bloom.insert(key_hash(&i.to_be_bytes()));
        }
        for i in 0..10_000u32 {
            assert!(bloom.may_contain(key_hash(&i.to_be_bytes())));
        }
        let false_positives = (10_000..110_000u32)
            .filter(|i| bloom.may_contain(key_hash(&i.to_be_bytes())))
            .count();
        // 10 bits per key: about 1%.
        assert!(false_positives < 2_000, "{false_positives} of 100000");
    }
}
