//! Tests of the heap keyed-state backend through its seam: snapshot and restore, rescaling,
//! isolation of snapshots, corruption, type checks and determinism.

// Tests may unwrap; clippy's `allow-unwrap-in-tests` covers `#[test]` functions, not the helpers
// of an integration test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use proptest::prelude::*;
use std::collections::HashMap;
use weir_core::CoreError;
use weir_core::handle::{KeyedStateHandle, StreamStateHandle};
use weir_core::keygroup::{
    KeyGroupRange, assign_to_key_group, compute_key_group_range_for_operator_index,
};
use weir_state::format::{self, EMPTY_SECTION_LEN};
use weir_state::{
    HeapKeyedStateBackend, KeyedStateBackend, RestorePart, StateError, StateKey, ValueState,
    ValueStateDescriptor,
};

/// A written snapshot: its handle (inline stream left empty) and its bytes.
struct Written {
    handle: KeyedStateHandle,
    bytes: Vec<u8>,
}

fn write<K: StateKey>(backend: &mut HeapKeyedStateBackend<K>) -> Written {
    let snapshot = backend.snapshot().unwrap();
    let mut bytes = Vec::new();
    let layout = snapshot.write_to(&mut bytes).unwrap();
    assert_eq!(layout.end, bytes.len() as u64);
    assert_eq!(layout.header.0, 0);
    assert_eq!(layout.offsets.len(), layout.key_group_range.len() as usize);
    Written {
        handle: layout.into_handle(StreamStateHandle::Inline(Vec::new())),
        bytes,
    }
}

/// The part a checkpoint would hand a backend owning `range`: the header, and only the sections
/// of the overlapping key groups.
fn part_for<'a>(w: &'a Written, range: &KeyGroupRange) -> Option<RestorePart<'a>> {
    let (start, end) = w.handle.byte_range_for(range)?;
    let (hs, he) = w.handle.header;
    Some(RestorePart {
        handle: &w.handle,
        header: &w.bytes[hs as usize..he as usize],
        sections: &w.bytes[start as usize..end as usize],
        sections_offset: start,
    })
}

fn restored<K: StateKey>(
    max_p: u32,
    range: KeyGroupRange,
    snapshots: &[&Written],
) -> Result<HeapKeyedStateBackend<K>, StateError> {
    let mut b = HeapKeyedStateBackend::new(max_p, range);
    let parts: Vec<_> = snapshots
        .iter()
        .filter_map(|w| part_for(w, &range))
        .collect();
    b.restore(&parts)?;
    Ok(b)
}

fn kg<K: StateKey>(b: &HeapKeyedStateBackend<K>, key: &K) -> u32 {
    assign_to_key_group(key, b.max_parallelism())
}

fn put(b: &mut HeapKeyedStateBackend<String>, s: ValueState<u64>, key: &str, v: u64) {
    let key = key.to_string();
    let g = kg(b, &key);
    b.update(s, &key, g, v);
}

fn get(b: &HeapKeyedStateBackend<String>, s: ValueState<u64>, key: &str) -> Option<u64> {
    let key = key.to_string();
    b.value(s, &key, kg(b, &key)).copied()
}

fn full(max_p: u32) -> KeyGroupRange {
    KeyGroupRange::new(0, max_p - 1)
}

fn as_map<V: Clone + weir_state::StateValue>(
    b: &HeapKeyedStateBackend<String>,
    s: ValueState<V>,
) -> HashMap<String, V> {
    b.entries(s).map(|(k, v)| (k.clone(), v.clone())).collect()
}

fn words(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("word-{i}")).collect()
}

#[test]
fn registration_returns_the_same_handle_and_rejects_other_types() {
    let mut b = HeapKeyedStateBackend::<String>::new(128, full(128));
    let a = b
        .value_state(&ValueStateDescriptor::<u64>::new("count"))
        .unwrap();
    let again = b
        .value_state(&ValueStateDescriptor::<u64>::new("count"))
        .unwrap();
    assert_eq!(a.id, again.id);
    let e = b
        .value_state(&ValueStateDescriptor::<String>::new("count"))
        .unwrap_err();
    assert!(matches!(e, StateError::Incompatible { ref name, .. } if name == "count"));
    let msg = e.to_string();
    assert!(
        msg.contains("u64") && msg.contains("alloc::string::String"),
        "{msg}"
    );
}

#[test]
fn value_mut_or_insert_inserts_once_and_counts() {
    let mut b = HeapKeyedStateBackend::<String>::new(128, full(128));
    let s = b
        .value_state(&ValueStateDescriptor::<u64>::new("sum"))
        .unwrap();
    for w in ["a", "b", "a", "a"] {
        let key = w.to_string();
        let g = kg(&b, &key);
        *b.value_mut_or_insert(s, &key, g, || 0) += 1;
    }
    assert_eq!(get(&b, s, "a"), Some(3));
    assert_eq!(get(&b, s, "b"), Some(1));
    let key = "a".to_string();
    let g = kg(&b, &key);
    b.clear(s, &key, g);
    assert_eq!(get(&b, s, "a"), None);
    assert_eq!(b.num_entries(), 1);
}

#[test]
fn snapshot_is_isolated_from_later_updates() {
    let mut b = HeapKeyedStateBackend::<String>::new(16, full(16));
    let s = b
        .value_state(&ValueStateDescriptor::<u64>::new("count"))
        .unwrap();
    for (i, w) in words(50).iter().enumerate() {
        put(&mut b, s, w, i as u64);
    }
    let before = as_map(&b, s);
    let snapshot = b.snapshot().unwrap();

    // Change, add and remove after the synchronous part, before the write.
    for w in words(50).iter().take(10) {
        put(&mut b, s, w, 999);
    }
    put(&mut b, s, "late", 7);
    for w in words(50).iter().skip(40) {
        let g = kg(&b, w);
        b.clear(s, w, g);
    }

    let mut bytes = Vec::new();
    let layout = snapshot.write_to(&mut bytes).unwrap();
    let w = Written {
        handle: layout.into_handle(StreamStateHandle::Inline(Vec::new())),
        bytes,
    };
    let mut r = restored::<String>(16, full(16), &[&w]).unwrap();
    let rs = r
        .value_state(&ValueStateDescriptor::<u64>::new("count"))
        .unwrap();
    assert_eq!(as_map(&r, rs), before);
    assert_eq!(get(&r, rs, "late"), None);
    // And the live backend has the new state.
    assert_eq!(get(&b, s, "late"), Some(7));
    assert_eq!(get(&b, s, "word-0"), Some(999));
    assert_eq!(get(&b, s, "word-45"), None);
}

#[test]
fn every_key_group_has_a_section_and_empty_ones_are_tiny() {
    let mut b = HeapKeyedStateBackend::<String>::new(128, KeyGroupRange::new(10, 19));
    let s = b
        .value_state(&ValueStateDescriptor::<u64>::new("count"))
        .unwrap();
    let w = write(&mut b);
    assert_eq!(w.handle.offsets.len(), 10);
    for pair in w.handle.offsets.windows(2) {
        assert_eq!(pair[1] - pair[0], EMPTY_SECTION_LEN as u64);
    }
    assert_eq!(w.handle.offsets[0], w.handle.header.1);
    let _ = s;
}

#[test]
fn rescale_one_to_two_and_back() {
    let max_p = 128;
    let mut one = HeapKeyedStateBackend::<String>::new(max_p, full(max_p));
    let count = one
        .value_state(&ValueStateDescriptor::<u64>::new("count"))
        .unwrap();
    let last = one
        .value_state(&ValueStateDescriptor::<String>::new("last"))
        .unwrap();
    for (i, w) in words(500).iter().enumerate() {
        put(&mut one, count, w, i as u64);
        if i % 3 == 0 {
            let g = kg(&one, w);
            one.update(last, w, g, format!("v{i}"));
        }
    }
    let original = write(&mut one);

    let mut halves = Vec::new();
    for i in 0..2 {
        let range = compute_key_group_range_for_operator_index(max_p, 2, i);
        let mut b = restored::<String>(max_p, range, &[&original]).unwrap();
        let c = b
            .value_state(&ValueStateDescriptor::<u64>::new("count"))
            .unwrap();
        let l = b
            .value_state(&ValueStateDescriptor::<String>::new("last"))
            .unwrap();
        for (k, _) in b.entries(c) {
            assert!(range.contains(kg(&b, k)), "{k} is in the wrong half");
        }
        halves.push((b, c, l, range));
    }
    // Each key is in exactly the backend owning its key group, with its value.
    for (i, w) in words(500).iter().enumerate() {
        let g = assign_to_key_group(w, max_p);
        for (b, c, l, range) in &halves {
            if range.contains(g) {
                assert_eq!(get(b, *c, w), Some(i as u64));
                let expected = (i % 3 == 0).then(|| format!("v{i}"));
                assert_eq!(b.value(*l, w, g).cloned(), expected);
            } else {
                assert!(b.entries(*c).all(|(k, _)| k != w));
            }
        }
    }
    let total: usize = halves.iter().map(|(b, ..)| b.num_entries()).sum();
    assert_eq!(total, one.num_entries());

    // Merge back into parallelism 1: the same state, and the same bytes.
    let written: Vec<Written> = halves.iter_mut().map(|(b, ..)| write(b)).collect();
    let refs: Vec<&Written> = written.iter().collect();
    let mut merged = restored::<String>(max_p, full(max_p), &refs).unwrap();
    let c = merged
        .value_state(&ValueStateDescriptor::<u64>::new("count"))
        .unwrap();
    let l = merged
        .value_state(&ValueStateDescriptor::<String>::new("last"))
        .unwrap();
    assert_eq!(as_map(&merged, c), as_map(&one, count));
    assert_eq!(as_map(&merged, l), as_map(&one, last));
    assert_eq!(write(&mut merged).bytes, original.bytes);
}

#[test]
fn restoring_a_key_group_twice_is_an_error_naming_it() {
    let mut b = HeapKeyedStateBackend::<String>::new(8, full(8));
    let s = b
        .value_state(&ValueStateDescriptor::<u64>::new("count"))
        .unwrap();
    put(&mut b, s, "x", 1);
    let w = write(&mut b);
    let range = KeyGroupRange::new(2, 3);
    let e = restored::<String>(8, range, &[&w, &w])
        .unwrap_err()
        .to_string();
    assert!(e.contains("key group 2") && e.contains("twice"), "{e}");

    // Also across two restore calls.
    let mut r = HeapKeyedStateBackend::<String>::new(8, range);
    r.restore(&[part_for(&w, &range).unwrap()]).unwrap();
    let e = r.restore(&[part_for(&w, &range).unwrap()]).unwrap_err();
    assert!(e.to_string().contains("key group 2"), "{e}");
}

#[test]
fn restore_rejects_another_max_parallelism_and_late_restores() {
    let mut b = HeapKeyedStateBackend::<String>::new(8, full(8));
    let s = b
        .value_state(&ValueStateDescriptor::<u64>::new("count"))
        .unwrap();
    put(&mut b, s, "x", 1);
    let w = write(&mut b);
    let mut other = HeapKeyedStateBackend::<String>::new(16, full(16));
    let part = format::whole_stream_part(&w.handle, &w.bytes).unwrap();
    let e = other.restore(&[part]).unwrap_err().to_string();
    assert!(e.contains("max parallelism 8"), "{e}");

    let part = format::whole_stream_part(&w.handle, &w.bytes).unwrap();
    let e = b.restore(&[part]).unwrap_err().to_string();
    assert!(e.contains("before any state is registered"), "{e}");
}

#[test]
fn flipped_bytes_are_detected_and_named() {
    let mut b = HeapKeyedStateBackend::<String>::new(4, full(4));
    let s = b
        .value_state(&ValueStateDescriptor::<u64>::new("count"))
        .unwrap();
    for (i, w) in words(20).iter().enumerate() {
        put(&mut b, s, w, i as u64);
    }
    let w = write(&mut b);
    let header_end = w.handle.header.1 as usize;
    for i in 0..w.bytes.len() {
        let mut bad = Written {
            handle: w.handle.clone(),
            bytes: w.bytes.clone(),
        };
        bad.bytes[i] ^= 0x04;
        let e = restored::<String>(4, full(4), &[&bad])
            .and_then(|mut r| {
                r.value_state(&ValueStateDescriptor::<u64>::new("count"))
                    .map(|_| ())
            })
            .expect_err("a flipped byte went unnoticed");
        let StateError::Core(CoreError::Corrupt { what, .. }) = &e else {
            panic!("byte {i}: expected Corrupt, got {e}");
        };
        if i < header_end {
            assert_eq!(what, "keyed snapshot header", "byte {i}");
        } else {
            let kg = w
                .handle
                .offsets
                .iter()
                .rposition(|&o| o as usize <= i)
                .unwrap();
            assert_eq!(
                what,
                &format!("keyed snapshot section of key group {kg}"),
                "byte {i}"
            );
        }
    }
}

#[test]
fn truncated_or_misplaced_sections_are_errors_not_panics() {
    let mut b = HeapKeyedStateBackend::<String>::new(4, full(4));
    let s = b
        .value_state(&ValueStateDescriptor::<u64>::new("count"))
        .unwrap();
    put(&mut b, s, "a", 1);
    let w = write(&mut b);
    for cut in 0..w.bytes.len() {
        let part = RestorePart {
            handle: &w.handle,
            header: &w.bytes[..(w.handle.header.1 as usize).min(cut)],
            sections: &w.bytes[(w.handle.header.1 as usize).min(cut)..cut],
            sections_offset: w.handle.header.1.min(cut as u64),
        };
        let mut r = HeapKeyedStateBackend::<String>::new(4, full(4));
        assert!(r.restore(&[part]).is_err(), "cut at {cut}");
    }
    // Offsets shifted by one section: the key group recorded in the section catches it.
    let mut shifted = w.handle.clone();
    shifted.offsets.rotate_left(1);
    let last = shifted.offsets.len() - 1;
    shifted.offsets[last] = w.handle.end;
    let mut r = HeapKeyedStateBackend::<String>::new(4, full(4));
    let e = r
        .restore(&[format::whole_stream_part(&shifted, &w.bytes).unwrap()])
        .unwrap_err();
    assert!(e.to_string().contains("key group 0"), "{e}");
}

#[test]
fn type_mismatch_after_restore_is_incompatible() {
    let mut b = HeapKeyedStateBackend::<String>::new(8, full(8));
    let s = b
        .value_state(&ValueStateDescriptor::<u64>::new("count"))
        .unwrap();
    put(&mut b, s, "x", 1);
    let w = write(&mut b);
    let mut r = restored::<String>(8, full(8), &[&w]).unwrap();
    let e = r
        .value_state(&ValueStateDescriptor::<u32>::new("count"))
        .unwrap_err();
    match &e {
        StateError::Incompatible { name, reason } => {
            assert_eq!(name, "count");
            assert!(
                reason.contains("`u64`") && reason.contains("`u32`"),
                "{reason}"
            );
        }
        other => panic!("expected Incompatible, got {other}"),
    }
    // The right type still works afterwards.
    let ok = r
        .value_state(&ValueStateDescriptor::<u64>::new("count"))
        .unwrap();
    assert_eq!(get(&r, ok, "x"), Some(1));

    // Another key type is caught at restore.
    let mut other = HeapKeyedStateBackend::<i64>::new(8, full(8));
    let e = other
        .restore(&[format::whole_stream_part(&w.handle, &w.bytes).unwrap()])
        .unwrap_err();
    assert!(
        matches!(&e, StateError::Incompatible { reason, .. } if reason.contains("i64")),
        "{e}"
    );
}

#[test]
fn unregistered_restored_state_survives_the_next_snapshot() {
    let mut b = HeapKeyedStateBackend::<String>::new(8, full(8));
    let s = b
        .value_state(&ValueStateDescriptor::<u64>::new("lazy"))
        .unwrap();
    put(&mut b, s, "x", 42);
    let first = write(&mut b);
    let mut r = restored::<String>(8, full(8), &[&first]).unwrap();
    assert_eq!(r.pending_state_names(), vec!["lazy"]);
    let second = write(&mut r);
    assert_eq!(second.bytes, first.bytes);
    let mut r2 = restored::<String>(8, full(8), &[&second]).unwrap();
    let s2 = r2
        .value_state(&ValueStateDescriptor::<u64>::new("lazy"))
        .unwrap();
    assert_eq!(get(&r2, s2, "x"), Some(42));
    assert!(r2.pending_state_names().is_empty());
}

#[test]
fn too_many_states_is_a_clear_error() {
    let mut b = HeapKeyedStateBackend::<u32>::new(1, full(1));
    for i in 0..i16::MAX {
        b.value_state(&ValueStateDescriptor::<u8>::new(format!("s{i}")))
            .unwrap();
    }
    // Re-registering an existing one is still fine.
    b.value_state(&ValueStateDescriptor::<u8>::new("s0"))
        .unwrap();
    let e = b
        .value_state(&ValueStateDescriptor::<u8>::new("one-too-many"))
        .unwrap_err();
    match e {
        StateError::TooManyStates { name, count, max } => {
            assert_eq!(name, "one-too-many");
            assert_eq!(count, 32768);
            assert_eq!(max, 32767);
        }
        other => panic!("expected TooManyStates, got {other}"),
    }
    // The full backend still snapshots and restores.
    let w = write(&mut b);
    let r = restored::<u32>(1, full(1), &[&w]).unwrap();
    assert_eq!(r.pending_state_names().len(), 32767);
}

#[test]
fn equal_state_gives_identical_bytes() {
    let max_p = 32;
    let ws = words(200);
    let mut a = HeapKeyedStateBackend::<String>::new(max_p, full(max_p));
    let mut b = HeapKeyedStateBackend::<String>::new(max_p, full(max_p));
    let sa = a
        .value_state(&ValueStateDescriptor::<u64>::new("c"))
        .unwrap();
    let sb = b
        .value_state(&ValueStateDescriptor::<u64>::new("c"))
        .unwrap();
    for (i, w) in ws.iter().enumerate() {
        put(&mut a, sa, w, i as u64);
    }
    // Other insertion order, with detours.
    for (i, w) in ws.iter().enumerate().rev() {
        put(&mut b, sb, w, 0);
        put(&mut b, sb, "temp", 5);
        put(&mut b, sb, w, i as u64);
        let t = "temp".to_string();
        let g = kg(&b, &t);
        b.clear(sb, &t, g);
    }
    assert_eq!(write(&mut a).bytes, write(&mut b).bytes);
}

#[derive(Clone, Debug)]
enum Op {
    Put(u16, u64),
    Name(u16, String),
    Clear(u16),
    Snapshot,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0u16..300, any::<u64>()).prop_map(|(k, v)| Op::Put(k, v)),
        2 => (0u16..300, "[a-z]{0,8}").prop_map(|(k, v)| Op::Name(k, v)),
        1 => (0u16..300).prop_map(Op::Clear),
        1 => Just(Op::Snapshot),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Random updates against a HashMap model; snapshots taken midway must hold the model as it
    /// was then, restored whole or split across a random parallelism.
    #[test]
    fn round_trip_matches_a_model(
        ops in proptest::collection::vec(op(), 0..400),
        max_p in prop_oneof![Just(1u32), Just(7), Just(128)],
        parallelism in 1u32..5,
    ) {
        let mut b = HeapKeyedStateBackend::<String>::new(max_p, full(max_p));
        let count = b.value_state(&ValueStateDescriptor::<u64>::new("count")).unwrap();
        let name = b.value_state(&ValueStateDescriptor::<String>::new("name")).unwrap();
        let mut counts: HashMap<String, u64> = HashMap::new();
        let mut names: HashMap<String, String> = HashMap::new();
        let mut pending = Vec::new();
        for op in ops {
            match op {
                Op::Put(k, v) => {
                    let key = format!("k{k}");
                    let g = kg(&b, &key);
                    *b.value_mut_or_insert(count, &key, g, || 0) = v;
                    counts.insert(key, v);
                }
                Op::Name(k, v) => {
                    let key = format!("k{k}");
                    let g = kg(&b, &key);
                    b.update(name, &key, g, v.clone());
                    names.insert(key, v);
                }
                Op::Clear(k) => {
                    let key = format!("k{k}");
                    let g = kg(&b, &key);
                    b.clear(count, &key, g);
                    b.clear(name, &key, g);
                    counts.remove(&key);
                    names.remove(&key);
                }
                Op::Snapshot => {
                    pending.push((b.snapshot().unwrap(), counts.clone(), names.clone()));
                }
            }
        }
        pending.push((b.snapshot().unwrap(), counts.clone(), names.clone()));
        let parallelism = parallelism.min(max_p);
        for (snapshot, counts, names) in pending {
            let mut bytes = Vec::new();
            let layout = snapshot.write_to(&mut bytes).unwrap();
            let w = Written { handle: layout.into_handle(StreamStateHandle::Inline(Vec::new())), bytes };

            let mut whole = restored::<String>(max_p, full(max_p), &[&w]).unwrap();
            let c = whole.value_state(&ValueStateDescriptor::<u64>::new("count")).unwrap();
            let n = whole.value_state(&ValueStateDescriptor::<String>::new("name")).unwrap();
            prop_assert_eq!(&as_map(&whole, c), &counts);
            prop_assert_eq!(&as_map(&whole, n), &names);
            for (k, v) in &counts {
                prop_assert_eq!(whole.value(c, k, kg(&whole, k)), Some(v));
            }

            let mut seen_counts = HashMap::new();
            let mut seen_names = HashMap::new();
            for i in 0..parallelism {
                let range = compute_key_group_range_for_operator_index(max_p, parallelism, i);
                let mut part = restored::<String>(max_p, range, &[&w]).unwrap();
                let c = part.value_state(&ValueStateDescriptor::<u64>::new("count")).unwrap();
                let n = part.value_state(&ValueStateDescriptor::<String>::new("name")).unwrap();
                for (k, v) in part.entries(c) {
                    prop_assert!(range.contains(kg(&part, k)));
                    prop_assert!(seen_counts.insert(k.clone(), *v).is_none());
                }
                for (k, v) in part.entries(n) {
                    prop_assert!(seen_names.insert(k.clone(), v.clone()).is_none());
                }
            }
            prop_assert_eq!(&seen_counts, &counts);
            prop_assert_eq!(&seen_names, &names);
        }
    }
}
