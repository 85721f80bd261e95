//! Key groups: Flink's `KeyGroupRangeAssignment` and `MathUtils.murmurHash`, bit for bit.
//!
//! A key's [`KeyHash`] is its Java `hashCode()` for the types Java has (strings hash their UTF-16
//! code units, as `String.hashCode` does), so a key lands in the same key group as it would in
//! Flink. Then `keyGroup = murmurHash(hash) % maxParallelism`, and key groups map to subtasks in
//! contiguous ranges.

use crate::CoreError;
use serde::{Deserialize, Serialize};
use std::fmt;

/// The largest max parallelism (Flink's `UPPER_BOUND_MAX_PARALLELISM`, 2^15).
pub const UPPER_BOUND_MAX_PARALLELISM: u32 = 1 << 15;
/// The smallest default max parallelism (Flink's `DEFAULT_LOWER_BOUND_MAX_PARALLELISM`).
pub const DEFAULT_LOWER_BOUND_MAX_PARALLELISM: u32 = 1 << 7;

/// A key group: `0..max_parallelism`.
pub type KeyGroup = u32;

/// A key's 32-bit hash, equal to Java's `hashCode()` for the corresponding Java type.
pub trait KeyHash {
    /// The hash, as Java's `hashCode()` would compute it.
    fn key_hash(&self) -> i32;
}

impl KeyHash for str {
    #[inline]
    fn key_hash(&self) -> i32 {
        let mut h: i32 = 0;
        // ASCII bytes are their own UTF-16 code units: hash them directly (the common case).
        for &b in self.as_bytes() {
            if b >= 0x80 {
                return utf16_hash(self);
            }
            h = h.wrapping_mul(31).wrapping_add(i32::from(b));
        }
        h
    }
}

fn utf16_hash(s: &str) -> i32 {
    let mut h: i32 = 0;
    for unit in s.encode_utf16() {
        h = h.wrapping_mul(31).wrapping_add(i32::from(unit));
    }
    h
}

impl KeyHash for String {
    #[inline]
    fn key_hash(&self) -> i32 {
        self.as_str().key_hash()
    }
}

/// A short string kept inline (no allocation up to 24 bytes) hashes as the same text in a
/// `String` does, so either type puts a key in the same key group.
impl KeyHash for compact_str::CompactString {
    #[inline]
    fn key_hash(&self) -> i32 {
        self.as_str().key_hash()
    }
}

impl<T: KeyHash + ?Sized> KeyHash for &T {
    fn key_hash(&self) -> i32 {
        (**self).key_hash()
    }
}

impl KeyHash for i32 {
    fn key_hash(&self) -> i32 {
        *self
    }
}

impl KeyHash for u32 {
    fn key_hash(&self) -> i32 {
        *self as i32
    }
}

impl KeyHash for i64 {
    fn key_hash(&self) -> i32 {
        (*self ^ ((*self as u64) >> 32) as i64) as i32
    }
}

impl KeyHash for u64 {
    fn key_hash(&self) -> i32 {
        (*self as i64).key_hash()
    }
}

impl KeyHash for bool {
    fn key_hash(&self) -> i32 {
        if *self { 1231 } else { 1237 }
    }
}

impl<A: KeyHash, B: KeyHash> KeyHash for (A, B) {
    /// As Flink's `Tuple2.hashCode`: `31 * hash(f0) + hash(f1)`.
    fn key_hash(&self) -> i32 {
        self.0
            .key_hash()
            .wrapping_mul(31)
            .wrapping_add(self.1.key_hash())
    }
}

/// Flink's `MathUtils.murmurHash(int)`: one murmur3 round plus its finalizer, made non-negative.
#[inline]
pub fn murmur_hash(code: i32) -> i32 {
    let mut code = code;
    code = code.wrapping_mul(0xcc9e_2d51_u32 as i32);
    code = code.rotate_left(15);
    code = code.wrapping_mul(0x1b87_3593);
    code = code.rotate_left(13);
    code = code.wrapping_mul(5).wrapping_add(0xe654_6b64_u32 as i32);
    code ^= 4;
    code = bit_mix(code);
    if code >= 0 {
        code
    } else if code != i32::MIN {
        -code
    } else {
        0
    }
}

/// Flink's `MathUtils.bitMix`: the murmur3 finalizer.
#[inline]
pub fn bit_mix(input: i32) -> i32 {
    let mut h = input as u32;
    h ^= h >> 16;
    h = h.wrapping_mul(0x85eb_ca6b);
    h ^= h >> 13;
    h = h.wrapping_mul(0xc2b2_ae35);
    h ^= h >> 16;
    h as i32
}

/// The key group of a key (Flink's `assignToKeyGroup`).
pub fn assign_to_key_group<K: KeyHash + ?Sized>(key: &K, max_parallelism: u32) -> KeyGroup {
    compute_key_group_for_key_hash(key.key_hash(), max_parallelism)
}

/// The key group of a key hash (Flink's `computeKeyGroupForKeyHash`).
#[inline]
pub fn compute_key_group_for_key_hash(key_hash: i32, max_parallelism: u32) -> KeyGroup {
    (murmur_hash(key_hash) as u32) % max_parallelism
}

/// Division and remainder by a divisor fixed at run time, without a division instruction per
/// call (Lemire, Kaser and Kurz, "Faster remainder by direct computation", 2019): a key's key
/// group and its subtask are computed for every record that crosses a hash exchange or reaches
/// a keyed operator, and a 32-bit `div` there was most of a keyed operator's own time.
/// Exact for every `u32` dividend and divisor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FastDivisor {
    divisor: u32,
    /// `ceil(2^64 / divisor)`; 0 for a divisor of 1 (it wraps), which is handled apart.
    magic: u64,
}

impl FastDivisor {
    /// Dividing by `divisor`, which must not be 0.
    pub fn new(divisor: u32) -> FastDivisor {
        assert!(divisor > 0, "a divisor of 0");
        FastDivisor {
            divisor,
            magic: (u64::MAX / u64::from(divisor)).wrapping_add(1),
        }
    }

    /// The divisor.
    #[inline]
    pub fn divisor(&self) -> u32 {
        self.divisor
    }

    /// `a % divisor`.
    #[inline]
    pub fn rem(&self, a: u32) -> u32 {
        let low = self.magic.wrapping_mul(u64::from(a));
        ((u128::from(low) * u128::from(self.divisor)) >> 64) as u32
    }

    /// `a / divisor`.
    #[inline]
    pub fn div(&self, a: u32) -> u32 {
        if self.magic == 0 {
            return a;
        }
        ((u128::from(self.magic) * u128::from(a)) >> 64) as u32
    }
}

/// Key groups and their subtasks for one max parallelism and parallelism, as
/// [`compute_key_group_for_key_hash`] and [`compute_operator_index_for_key_group`] compute
/// them, with the divisions precomputed ([`FastDivisor`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KeyGroupAssigner {
    max_parallelism: FastDivisor,
    parallelism: u32,
}

impl KeyGroupAssigner {
    /// For `max_parallelism` key groups over `parallelism` subtasks (both at least 1, the
    /// parallelism at most the max parallelism).
    pub fn new(max_parallelism: u32, parallelism: u32) -> KeyGroupAssigner {
        KeyGroupAssigner {
            max_parallelism: FastDivisor::new(max_parallelism),
            parallelism,
        }
    }

    /// The max parallelism.
    #[inline]
    pub fn max_parallelism(&self) -> u32 {
        self.max_parallelism.divisor()
    }

    /// The key group of a key hash.
    #[inline]
    pub fn key_group_for_hash(&self, key_hash: i32) -> KeyGroup {
        self.max_parallelism.rem(murmur_hash(key_hash) as u32)
    }

    /// The key group of a key.
    #[inline]
    pub fn key_group<K: KeyHash + ?Sized>(&self, key: &K) -> KeyGroup {
        self.key_group_for_hash(key.key_hash())
    }

    /// The subtask that owns `key_group`: `key_group * parallelism / max_parallelism`, whose
    /// product stays below 2^30 (both at most 2^15).
    #[inline]
    pub fn operator_index(&self, key_group: KeyGroup) -> u32 {
        self.max_parallelism
            .div(key_group.wrapping_mul(self.parallelism))
    }
}

/// The subtask that owns a key group (Flink's `computeOperatorIndexForKeyGroup`).
#[inline]
pub fn compute_operator_index_for_key_group(
    max_parallelism: u32,
    parallelism: u32,
    key_group: KeyGroup,
) -> u32 {
    (u64::from(key_group) * u64::from(parallelism) / u64::from(max_parallelism)) as u32
}

/// The key groups a subtask owns (Flink's `computeKeyGroupRangeForOperatorIndex`).
pub fn compute_key_group_range_for_operator_index(
    max_parallelism: u32,
    parallelism: u32,
    operator_index: u32,
) -> KeyGroupRange {
    let (max_p, p, i) = (
        u64::from(max_parallelism),
        u64::from(parallelism),
        u64::from(operator_index),
    );
    let start = (i * max_p).div_ceil(p);
    let end = ((i + 1) * max_p - 1) / p;
    KeyGroupRange::new(start as u32, end as u32)
}

/// The default max parallelism for an operator of parallelism `p` (Flink's
/// `computeDefaultMaxParallelism`): `min(max(roundUpToPowerOfTwo(p + p/2), 128), 32768)`.
pub fn compute_default_max_parallelism(parallelism: u32) -> u32 {
    let want = u64::from(parallelism) + u64::from(parallelism / 2);
    let rounded = want.max(1).next_power_of_two();
    rounded.clamp(
        u64::from(DEFAULT_LOWER_BOUND_MAX_PARALLELISM),
        u64::from(UPPER_BOUND_MAX_PARALLELISM),
    ) as u32
}

/// Checks a max parallelism and a parallelism against each other and Flink's bounds.
pub fn check_parallelism(
    what: &str,
    parallelism: u32,
    max_parallelism: u32,
) -> Result<(), CoreError> {
    if max_parallelism == 0 || max_parallelism > UPPER_BOUND_MAX_PARALLELISM {
        return Err(CoreError::InvalidMaxParallelism(max_parallelism));
    }
    if parallelism == 0 || parallelism > max_parallelism {
        return Err(CoreError::InvalidParallelism {
            what: what.to_string(),
            parallelism,
            max_parallelism,
        });
    }
    Ok(())
}

/// A contiguous, inclusive range of key groups. The empty range has `end < start`.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct KeyGroupRange {
    /// First key group.
    pub start: KeyGroup,
    /// Last key group, inclusive.
    pub end: KeyGroup,
}

impl KeyGroupRange {
    /// `start..=end`; empty when `end < start`.
    pub fn new(start: KeyGroup, end: KeyGroup) -> KeyGroupRange {
        KeyGroupRange { start, end }
    }

    /// The empty range.
    pub fn empty() -> KeyGroupRange {
        KeyGroupRange { start: 1, end: 0 }
    }

    /// Number of key groups in the range; saturates at `u32::MAX` for `0..=u32::MAX` (a range
    /// only a damaged file holds: key groups stop at [`UPPER_BOUND_MAX_PARALLELISM`]).
    pub fn len(&self) -> u32 {
        if self.end < self.start {
            0
        } else {
            (self.end - self.start).saturating_add(1)
        }
    }

    /// Whether the range holds no key group.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether `kg` is in the range.
    pub fn contains(&self, kg: KeyGroup) -> bool {
        kg >= self.start && kg <= self.end
    }

    /// The key groups in both ranges.
    pub fn intersection(&self, other: &KeyGroupRange) -> KeyGroupRange {
        let start = self.start.max(other.start);
        let end = self.end.min(other.end);
        if end < start {
            KeyGroupRange::empty()
        } else {
            KeyGroupRange { start, end }
        }
    }

    /// Iterates the key groups.
    pub fn iter(&self) -> impl Iterator<Item = KeyGroup> + use<> {
        let (s, e) = (self.start, self.end);
        (s..=e).take(self.len() as usize)
    }
}

impl fmt::Debug for KeyGroupRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_empty() {
            write!(f, "KeyGroupRange(empty)")
        } else {
            write!(f, "KeyGroupRange({}..={})", self.start, self.end)
        }
    }
}

impl fmt::Display for KeyGroupRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_empty() {
            write!(f, "[]")
        } else {
            write!(f, "[{}, {}]", self.start, self.end)
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_fast_divisor_divides_exactly() {
        let edges = [
            0u32,
            1,
            2,
            3,
            127,
            128,
            32767,
            32768,
            1 << 30,
            i32::MAX as u32,
            u32::MAX,
        ];
        let mut x = 0x9E37_79B9u32;
        for d in (1..=UPPER_BOUND_MAX_PARALLELISM).chain([65_537, 1 << 31, u32::MAX]) {
            let f = FastDivisor::new(d);
            let near = [
                d - 1,
                d,
                d.wrapping_add(1),
                d.wrapping_mul(7).wrapping_add(3),
            ];
            for a in edges.iter().chain(&near).copied().chain((0..8).map(|_| {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                x
            })) {
                assert_eq!(f.rem(a), a % d, "{a} % {d}");
                assert_eq!(f.div(a), a / d, "{a} / {d}");
            }
        }
    }

    #[test]
    fn the_assigner_agrees_with_flinks_functions() {
        for (max_p, p) in [
            (1, 1),
            (128, 1),
            (128, 2),
            (128, 3),
            (100, 7),
            (32768, 32768),
            (32768, 5),
        ] {
            let a = KeyGroupAssigner::new(max_p, p);
            for h in [0, 1, -1, 42, i32::MIN, i32::MAX, 0x1234_5678, -987_654_321] {
                let kg = compute_key_group_for_key_hash(h, max_p);
                assert_eq!(a.key_group_for_hash(h), kg);
            }
            for kg in 0..max_p {
                assert_eq!(
                    a.operator_index(kg),
                    compute_operator_index_for_key_group(max_p, p, kg),
                    "key group {kg} of {max_p} over {p}"
                );
            }
            assert_eq!(a.key_group("hello"), assign_to_key_group("hello", max_p));
        }
    }

    use super::*;

    #[test]
    fn a_compact_string_hashes_and_serializes_as_the_same_string() {
        // Inline (short), at the inline limit, and on the heap (long); ASCII and not.
        for text in [
            "",
            "7",
            "hello",
            "ü€😀",
            "abcdefghijklmnopqrstuvwx",
            &"long ".repeat(20),
        ] {
            let compact = compact_str::CompactString::from(text);
            let string = text.to_string();
            assert_eq!(compact.key_hash(), string.key_hash(), "{text:?}");
            assert_eq!(
                assign_to_key_group(&compact, 128),
                assign_to_key_group(&string, 128)
            );
            assert_eq!(
                postcard::to_stdvec(&compact).unwrap(),
                postcard::to_stdvec(&string).unwrap(),
                "{text:?}"
            );
        }
        // Java's "hello".hashCode().
        assert_eq!(
            compact_str::CompactString::from("hello").key_hash(),
            99_162_322
        );
    }

    #[test]
    fn the_widest_range_decoded_from_a_damaged_file_has_a_length() {
        // Found by `weir-fuzz` (keyed target): a header whose range is 0..=u32::MAX overflowed
        // `len` (a panic with overflow checks), before the header was refused.
        let widest = KeyGroupRange::new(0, u32::MAX);
        assert_eq!(widest.len(), u32::MAX);
        assert!(!widest.is_empty());
        assert_eq!(format!("{widest:?}"), "KeyGroupRange(0..=4294967295)");
        assert_eq!(widest.iter().take(3).collect::<Vec<_>>(), vec![0, 1, 2]);
        assert_eq!(KeyGroupRange::new(1, u32::MAX).len(), u32::MAX);
    }

    #[test]
    fn ranges_partition_all_key_groups() {
        for max_p in [1u32, 2, 7, 128, 1000, 32768] {
            for p in [1u32, 2, 3, 5, 7, 16, 127, 128] {
                if p > max_p {
                    continue;
                }
                let mut next = 0;
                for i in 0..p {
                    let r = compute_key_group_range_for_operator_index(max_p, p, i);
                    assert_eq!(r.start, next, "max_p={max_p} p={p} i={i}");
                    for kg in r.iter() {
                        assert_eq!(compute_operator_index_for_key_group(max_p, p, kg), i);
                    }
                    next = r.end + 1;
                }
                assert_eq!(next, max_p);
            }
        }
    }

    #[test]
    fn string_hash_is_java_hash_code() {
        assert_eq!("".key_hash(), 0);
        assert_eq!("a".key_hash(), 97);
        // "hello".hashCode() in Java.
        assert_eq!("hello".key_hash(), 99162322);
    }
}
