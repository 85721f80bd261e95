//! Known-value tables pinning `weir_core::keygroup` to Flink's key-group arithmetic, bit for bit.
//!
//! The tables below were printed by a small Java 17 program (kept outside the repository) that
//! transcribes Flink's own code: `org.apache.flink.util.MathUtils` (`murmurHash`, `bitMix`,
//! `roundUpToPowerOfTwo`), `org.apache.flink.runtime.state.KeyGroupRangeAssignment`
//! (`assignToKeyGroup`, `assignKeyToParallelOperator`, `computeKeyGroupForKeyHash`,
//! `computeKeyGroupRangeForOperatorIndex`, `computeOperatorIndexForKeyGroup`,
//! `computeDefaultMaxParallelism`) and `org.apache.flink.api.java.tuple.Tuple2.hashCode`, and that
//! hashes keys with the JDK's real `String`/`Integer`/`Long`/`Boolean.hashCode()` (so strings hash
//! their UTF-16 code units, surrogate pairs included). Java `int` arithmetic throughout, exactly as
//! Flink does it. The values were pasted here verbatim; nothing below is computed by Rust code
//! under test.
//!
//! `FLINK_TEST_DEFAULT_MAX_PARALLELISM` holds the literal expectations found in Flink's own tests.

use weir_core::keygroup::{
    KeyGroupRange, KeyHash, assign_to_key_group, bit_mix, compute_default_max_parallelism,
    compute_key_group_for_key_hash, compute_key_group_range_for_operator_index,
    compute_operator_index_for_key_group, murmur_hash,
};

// (input, murmurHash(input), bitMix(input))
const MURMUR: &[(i32, i32, i32)] = &[
    (0, 593689054, 0),
    (1, 68075478, 1364076727),
    (-1, 1982413648, -2114883783),
    (2, 1085422463, 821347078),
    (3, 847579505, -2047822809),
    (7, 1343918321, 415870660),
    (42, 1134849565, 142593372),
    (-42, 189366624, 192929823),
    (100, 616682048, -36807446),
    (127, 1931274395, -414068057),
    (128, 132521001, -2004194697),
    (1000, 3506311, 1718167128),
    (65535, 1986290322, -1573147033),
    (65536, 82754377, 245581154),
    (123456789, 1088346449, -1168058214),
    (-123456789, 1470798557, 2059234239),
    (2147483646, 1247003650, 1427853558),
    (1073741824, 1278750292, 1869769532),
    (-559038737, 1047277220, 233162409),
    (-889275714, 2003420054, 2046756072),
    (i32::MIN, 1718298732, 1832674720),
    (i32::MAX, 1653689534, -104067416),
];

// (key, String.hashCode(), keyGroup @128, keyGroup @32768, operator @ (128, p=2), operator @ (32768, p=5))
const STRING_KEYS: &[(&str, i32, u32, u32, u32, u32)] = &[
    ("1", 49, 54, 16054, 0, 2),
    ("2", 50, 27, 10139, 0, 1),
    ("3", 51, 33, 14753, 0, 2),
    ("4", 52, 4, 388, 0, 0),
    ("5", 53, 79, 21839, 1, 3),
    ("6", 54, 19, 23955, 0, 3),
    ("7", 55, 115, 24691, 1, 3),
    ("8", 56, 68, 23236, 1, 3),
    ("9", 57, 96, 4448, 1, 0),
    ("hello", 99162322, 35, 31395, 0, 4),
    ("flink", 97520992, 98, 16610, 1, 2),
    ("", 0, 94, 31198, 1, 4),
    ("a", 97, 81, 19409, 1, 2),
    ("A", 65, 104, 5352, 1, 0),
    ("stra\u{df}e", -891990090, 66, 834, 1, 0),
    ("\u{e9}t\u{e9}", 227742, 5, 23685, 0, 3),
    ("\u{65e5}\u{672c}\u{8a9e}", 25921943, 27, 6683, 0, 1),
    ("\u{1f600}", 1772899, 54, 7350, 0, 1),
    ("key-\u{1f980}-42", -1912825285, 33, 161, 0, 0),
    ("word_count", 1808305050, 9, 13705, 0, 2),
];

// (key, Integer.hashCode(), keyGroup @128, keyGroup @32768)
const INT_KEYS: &[(i32, i32, u32, u32)] = &[
    (0, 0, 94, 31198),
    (1, 1, 86, 16342),
    (-1, -1, 80, 15184),
    (2, 2, 127, 15231),
    (3, 3, 113, 2417),
    (7, 7, 113, 4337),
    (42, 42, 29, 28189),
    (-42, -42, 96, 352),
    (100, 100, 64, 21056),
    (127, 127, 27, 26779),
    (128, 128, 41, 7209),
    (1000, 1000, 7, 135),
    (65535, 65535, 18, 25234),
    (65536, 65536, 73, 15177),
    (123456789, 123456789, 81, 22865),
    (-123456789, -123456789, 93, 6877),
    (2147483646, 2147483646, 2, 17410),
    (1073741824, 1073741824, 84, 11860),
    (-559038737, -559038737, 36, 11940),
    (-889275714, -889275714, 22, 17302),
    (i32::MIN, -2147483648, 108, 10348),
    (i32::MAX, 2147483647, 62, 19646),
];

// (key, Long.hashCode(), keyGroup @128, keyGroup @32768)
const LONG_KEYS: &[(i64, i32, u32, u32)] = &[
    (0, 0, 94, 31198),
    (1, 1, 86, 16342),
    (-1, 0, 94, 31198),
    (42, 42, 29, 28189),
    (-42, 41, 62, 6334),
    (4294967296, 1, 86, 16342),
    (4294967297, 0, 94, 31198),
    (-4294967296, -1, 80, 15184),
    (9876543210, 1286608616, 123, 6779),
    (-9876543210, 1286608619, 33, 2337),
    (81985529216486895, -2004318072, 17, 32145),
    (i64::MIN, -2147483648, 108, 10348),
    (i64::MAX, -2147483648, 108, 10348),
    (2147483648, -2147483648, 108, 10348),
];

// (key, Boolean.hashCode(), keyGroup @128, keyGroup @32768)
const BOOL_KEYS: &[(bool, i32, u32, u32)] = &[(true, 1231, 77, 11725), (false, 1237, 3, 32003)];

// Tuple2<String, Integer>: (f0, f1, Tuple2.hashCode(), keyGroup @128, keyGroup @32768)
const TUPLE_STR_INT_KEYS: &[(&str, i32, i32, u32, u32)] = &[
    ("hello", 1, -1220935313, 41, 2729),
    ("flink", 42, -1271816502, 74, 16842),
    ("", 0, 0, 94, 31198),
    ("stra\u{df}e", -1, -1881889015, 127, 19583),
    ("\u{1f600}", i32::MIN, -2092523779, 25, 4377),
];

// Tuple2<Long, Boolean>: (f0, f1, Tuple2.hashCode(), keyGroup @128, keyGroup @32768)
const TUPLE_LONG_BOOL_KEYS: &[(i64, bool, i32, u32, u32)] = &[
    (7, true, 1448, 105, 7401),
    (-1, false, 1237, 3, 32003),
    (i64::MAX, true, -2147482417, 88, 19288),
    (9876543210, false, 1230162669, 3, 1539),
];

/// `(max_parallelism, parallelism, [(start, end) per operator index])`.
type RangeRow = (u32, u32, &'static [(u32, u32)]);

const RANGES: &[RangeRow] = &[
    (128, 1, &[(0, 127)]),
    (128, 2, &[(0, 63), (64, 127)]),
    (128, 3, &[(0, 42), (43, 85), (86, 127)]),
    (128, 4, &[(0, 31), (32, 63), (64, 95), (96, 127)]),
    (
        128,
        7,
        &[
            (0, 18),
            (19, 36),
            (37, 54),
            (55, 73),
            (74, 91),
            (92, 109),
            (110, 127),
        ],
    ),
    (
        32768,
        5,
        &[
            (0, 6553),
            (6554, 13107),
            (13108, 19660),
            (19661, 26214),
            (26215, 32767),
        ],
    ),
    (100, 3, &[(0, 33), (34, 66), (67, 99)]),
];

// (max_parallelism, parallelism, key_group, operator index)
const OPERATOR_INDEX: &[(u32, u32, u32, u32)] = &[
    (128, 1, 0, 0),
    (128, 1, 127, 0),
    (128, 2, 63, 0),
    (128, 2, 64, 1),
    (128, 2, 127, 1),
    (128, 3, 42, 0),
    (128, 3, 43, 1),
    (128, 3, 85, 1),
    (128, 3, 86, 2),
    (128, 7, 18, 0),
    (128, 7, 19, 1),
    (128, 7, 127, 6),
    (100, 3, 33, 0),
    (100, 3, 34, 1),
    (100, 3, 66, 1),
    (100, 3, 67, 2),
    (100, 3, 99, 2),
    (32768, 5, 6553, 0),
    (32768, 5, 6554, 1),
    (32768, 5, 32767, 4),
    (32768, 32768, 12345, 12345),
    (32768, 7, 32767, 6),
    (256, 171, 255, 170),
    (1, 1, 0, 0),
];

// (parallelism, computeDefaultMaxParallelism(parallelism))
const DEFAULT_MAX_PARALLELISM: &[(u32, u32)] = &[
    (1, 128),
    (2, 128),
    (3, 128),
    (85, 128),
    (86, 256),
    (100, 256),
    (171, 256),
    (172, 512),
    (1000, 2048),
    (21845, 32768),
    (21846, 32768),
    (30000, 32768),
    (32768, 32768),
];

/// Literal expectations from Flink's own test suite (apache/flink):
/// `flink-runtime/src/test/java/org/apache/flink/runtime/scheduler/SchedulerBaseComputeVertexParallelismTest.java`
/// ("default minimum" 1 → 128, "test round up part 1" 171 → 256, "test round up part 2"
/// 172 → 512, "test round up limit" 2^15 → 2^15) and the same four cases in the older
/// `flink-runtime/src/test/java/org/apache/flink/runtime/executiongraph/ExecutionJobVertexTest.java`
/// (`testMaxParallelismDefaulting`). Flink's tests hold no literal murmur or key-group values
/// for `KeyGroupRangeAssignment`; those are covered by the Java-printed tables above.
const FLINK_TEST_DEFAULT_MAX_PARALLELISM: &[(u32, u32)] =
    &[(1, 128), (171, 256), (172, 512), (1 << 15, 1 << 15)];

#[test]
fn murmur_hash_and_bit_mix_match_flink() {
    for &(input, murmur, mix) in MURMUR {
        assert_eq!(murmur_hash(input), murmur, "murmurHash({input})");
        assert_eq!(bit_mix(input), mix, "bitMix({input})");
    }
}

fn check_key<K: KeyHash + ?Sized + std::fmt::Debug>(key: &K, hash: i32, kg128: u32, kg32768: u32) {
    assert_eq!(key.key_hash(), hash, "hashCode of {key:?}");
    assert_eq!(
        assign_to_key_group(key, 128),
        kg128,
        "key group of {key:?} @128"
    );
    assert_eq!(
        assign_to_key_group(key, 32768),
        kg32768,
        "key group of {key:?} @32768"
    );
    assert_eq!(
        compute_key_group_for_key_hash(hash, 128),
        kg128,
        "computeKeyGroupForKeyHash({hash}, 128)"
    );
    assert_eq!(
        compute_key_group_for_key_hash(hash, 32768),
        kg32768,
        "computeKeyGroupForKeyHash({hash}, 32768)"
    );
}

#[test]
fn string_keys_match_flink() {
    for &(key, hash, kg128, kg32768, op_128_2, op_32768_5) in STRING_KEYS {
        check_key(key, hash, kg128, kg32768);
        check_key(&key.to_string(), hash, kg128, kg32768);
        // assignKeyToParallelOperator = computeOperatorIndexForKeyGroup(assignToKeyGroup(..)).
        assert_eq!(
            compute_operator_index_for_key_group(128, 2, assign_to_key_group(key, 128)),
            op_128_2,
            "{key:?}"
        );
        assert_eq!(
            compute_operator_index_for_key_group(32768, 5, assign_to_key_group(key, 32768)),
            op_32768_5,
            "{key:?}"
        );
    }
}

#[test]
fn surrogate_pairs_hash_as_two_utf16_units() {
    // U+1F600 is the surrogate pair D83D DE00: 31 * 0xD83D + 0xDE00, as Java computes it.
    assert_eq!("\u{1f600}".key_hash(), 31 * 0xD83D + 0xDE00);
}

#[test]
fn int_keys_match_flink() {
    for &(key, hash, kg128, kg32768) in INT_KEYS {
        check_key(&key, hash, kg128, kg32768);
        check_key(&(key as u32), hash, kg128, kg32768);
    }
}

#[test]
fn long_keys_match_flink() {
    for &(key, hash, kg128, kg32768) in LONG_KEYS {
        check_key(&key, hash, kg128, kg32768);
        check_key(&(key as u64), hash, kg128, kg32768);
    }
}

#[test]
fn bool_keys_match_flink() {
    for &(key, hash, kg128, kg32768) in BOOL_KEYS {
        check_key(&key, hash, kg128, kg32768);
    }
}

#[test]
fn tuple2_keys_match_flink() {
    for &(f0, f1, hash, kg128, kg32768) in TUPLE_STR_INT_KEYS {
        check_key(&(f0, f1), hash, kg128, kg32768);
        check_key(&(f0.to_string(), f1), hash, kg128, kg32768);
    }
    for &(f0, f1, hash, kg128, kg32768) in TUPLE_LONG_BOOL_KEYS {
        check_key(&(f0, f1), hash, kg128, kg32768);
    }
}

#[test]
fn key_group_ranges_match_flink() {
    for &(max_p, p, ranges) in RANGES {
        assert_eq!(ranges.len(), p as usize);
        for (i, &(start, end)) in ranges.iter().enumerate() {
            let got = compute_key_group_range_for_operator_index(max_p, p, i as u32);
            assert_eq!(
                got,
                KeyGroupRange::new(start, end),
                "maxP={max_p} p={p} index={i}"
            );
        }
    }
}

#[test]
fn operator_index_matches_flink() {
    for &(max_p, p, kg, index) in OPERATOR_INDEX {
        assert_eq!(
            compute_operator_index_for_key_group(max_p, p, kg),
            index,
            "maxP={max_p} p={p} kg={kg}"
        );
    }
}

#[test]
fn default_max_parallelism_matches_flink() {
    for &(p, max_p) in DEFAULT_MAX_PARALLELISM
        .iter()
        .chain(FLINK_TEST_DEFAULT_MAX_PARALLELISM)
    {
        assert_eq!(
            compute_default_max_parallelism(p),
            max_p,
            "computeDefaultMaxParallelism({p})"
        );
    }
}
