//! Restores and their limits: rescaling, refusals, corruption, mismatches, bytes, state count.

use super::SuiteKey;
use super::helpers::{
    Cx, Written, content, expect_incompatible, fresh, full, header_of, keys, part_for, restored,
    whole_part,
};
use crate::StateError;
use crate::format;
use crate::format::MAX_STATES;
use crate::keyed::{KeyedStateBackend, RestorePart, ValueStateDescriptor};
use std::any::type_name;
use std::collections::HashMap;
use weir_core::CoreError;
use weir_core::keygroup::{
    KeyGroupRange, assign_to_key_group, compute_key_group_range_for_operator_index,
};

/// Rescaling 1 → 2 → 1: each key ends only in the backend owning its key group, with its
/// values; a restore handed the whole stream keeps only its own key groups; merging the two
/// halves back gives the original state and the original bytes.
pub fn check_rescale<K: SuiteKey, B: KeyedStateBackend<K>>(make: impl Fn(u32, KeyGroupRange) -> B) {
    let cx = Cx::new::<B>("rescale 1 → 2 → 1");
    let max_p = 128;
    let mut one = fresh(&cx, &make, max_p, full(max_p));
    let count = one.register::<u64>("count");
    let last = one.register::<String>("last");
    let keys = keys::<K>(500);
    let mut counts = HashMap::new();
    let mut lasts = HashMap::new();
    for (i, k) in keys.iter().enumerate() {
        one.put(count, k, i as u64);
        counts.insert(k.clone(), i as u64);
        if i % 3 == 0 {
            let v = format!("v{i}-ü");
            one.put(last, k, v.clone());
            lasts.insert(k.clone(), v);
        }
    }
    let original = one.write();

    let mut halves = Vec::new();
    let mut total = 0;
    for i in 0..2 {
        let range = compute_key_group_range_for_operator_index(max_p, 2, i);
        let mut half = cx.ok(
            &format!("restoring key groups {range}"),
            restored(&cx, &make, max_p, range, &[&original]),
        );
        let c = half.register::<u64>("count");
        let l = half.register::<String>("last");
        let own = |k: &K| range.contains(assign_to_key_group(k, max_p));
        let own_counts: HashMap<K, u64> = counts
            .iter()
            .filter(|(k, _)| own(k))
            .map(|(k, v)| (k.clone(), *v))
            .collect();
        let own_lasts: HashMap<K, String> = lasts
            .iter()
            .filter(|(k, _)| own(k))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let rule = format!("the backend of key groups {range} has each key of its key groups");
        let own_keys: Vec<&K> = keys.iter().filter(|k| own(k)).collect();
        half.read_back(&rule, c, &own_counts, own_keys.iter().copied());
        half.read_back(&rule, l, &own_lasts, own_keys.iter().copied());

        let w = half.write();
        let rule =
            format!("the backend of key groups {range} holds the keys of its key groups only");
        let held = content::<K, u64>(&cx, &w, "count");
        cx.same_map(&rule, &held, &own_counts);
        cx.same_map(&rule, &content::<K, String>(&cx, &w, "last"), &own_lasts);
        total += held.len();

        // Handed the whole stream instead of its sections, a restore keeps only its key groups.
        let mut from_whole = fresh(&cx, &make, max_p, range);
        cx.ok(
            "restoring from the whole stream",
            from_whole.b.restore(&[whole_part(&cx, &original)]),
        );
        from_whole.register::<u64>("count");
        from_whole.register::<String>("last");
        cx.eq(
            &format!(
                "a restore of key groups {range} handed the whole stream keeps only its key groups"
            ),
            &from_whole.write().bytes,
            &w.bytes,
        );
        halves.push(w);
    }
    cx.eq(
        "the halves hold every entry exactly once",
        &total,
        &counts.len(),
    );

    let refs: Vec<&Written> = halves.iter().collect();
    let mut merged = cx.ok(
        "merging the halves",
        restored(&cx, &make, max_p, full(max_p), &refs),
    );
    let c = merged.register::<u64>("count");
    let l = merged.register::<String>("last");
    let rule = "merging the halves back gives the original state";
    merged.read_back(rule, c, &counts, &keys);
    merged.read_back(rule, l, &lasts, &keys);
    let w = merged.write();
    cx.same_map(rule, &content::<K, u64>(&cx, &w, "count"), &counts);
    cx.same_map(rule, &content::<K, String>(&cx, &w, "last"), &lasts);
    cx.eq(
        "merging the halves back gives the original bytes",
        &w.bytes,
        &original.bytes,
    );
}

/// A key group handed over twice, in one restore or across two, is an error naming it.
pub fn check_restore_twice<K: SuiteKey, B: KeyedStateBackend<K>>(
    make: impl Fn(u32, KeyGroupRange) -> B,
) {
    let cx = Cx::new::<B>("restore a key group twice");
    let mut b = fresh(&cx, &make, 8, full(8));
    let s = b.register::<u64>("count");
    b.put(s, &K::nth(1), 1);
    let w = b.write();
    let range = KeyGroupRange::new(2, 3);
    let e = cx.err(
        "two parts holding the same key groups must be refused",
        || restored(&cx, &make, 8, range, &[&w, &w]),
    );
    let msg = e.to_string();
    cx.must(msg.contains("key group 2"), || {
        format!("restoring key group 2 twice in one call: the error must name key group 2: {msg}")
    });

    let mut r = fresh(&cx, &make, 8, range);
    cx.ok(
        "the first restore",
        r.b.restore(&[part_for(&cx, &w, &range)]),
    );
    let e = cx.err(
        "a second restore of the same key groups must be refused",
        || r.b.restore(&[part_for(&cx, &w, &range)]),
    );
    let msg = e.to_string();
    cx.must(msg.contains("key group 2"), || {
        format!("restoring key group 2 in two calls: the error must name key group 2: {msg}")
    });
}

/// A snapshot of another max parallelism is refused (its key groups mean other keys), naming
/// both; a restore after a state is registered is refused and leaves the state as it was.
pub fn check_restore_refusals<K: SuiteKey, B: KeyedStateBackend<K>>(
    make: impl Fn(u32, KeyGroupRange) -> B,
) {
    let cx = Cx::new::<B>("restore refusals");
    let mut b = fresh(&cx, &make, 12, full(12));
    let s = b.register::<u64>("count");
    let key = K::nth(1);
    b.put(s, &key, 1);
    let w = b.write();

    let mut other = fresh(&cx, &make, 20, full(20));
    let e = cx.err(
        "a snapshot taken with max parallelism 12 must not restore into max parallelism 20",
        || other.b.restore(&[whole_part(&cx, &w)]),
    );
    let msg = e.to_string();
    cx.must(msg.contains("12") && msg.contains("20"), || {
        format!("the max-parallelism error must name both max parallelisms (12, 20): {msg}")
    });

    cx.err(
        "restore comes before any state is registered; a later one must be refused",
        || b.b.restore(&[whole_part(&cx, &w)]),
    );
    cx.eq(
        "a refused restore leaves the registered state as it was",
        &b.get(s, &key),
        &Some(1),
    );
}

/// Damaged bytes are errors, never panics: a flipped byte anywhere is
/// [`CoreError::Corrupt`] naming the header or the key group of its section; a truncated stream
/// is an error; offsets shifted by one section are caught by the key group each section records.
pub fn check_corruption<K: SuiteKey, B: KeyedStateBackend<K>>(
    make: impl Fn(u32, KeyGroupRange) -> B,
) {
    let cx = Cx::new::<B>("corrupt snapshots");
    let mut first = None;
    for (max_p, range) in [(4, full(4)), (8, KeyGroupRange::new(3, 6))] {
        let mut b = fresh(&cx, &make, max_p, range);
        let s = b.register::<u64>("count");
        let keys: Vec<K> = (0..200)
            .map(K::nth)
            .filter(|k| range.contains(assign_to_key_group(k, max_p)))
            .take(20)
            .collect();
        for (i, k) in keys.iter().enumerate() {
            b.put(s, k, i as u64);
        }
        let w = b.write();
        let header_end = w.handle.header.1 as usize;
        for i in 0..w.bytes.len() {
            let mut bytes = w.bytes.clone();
            if let Some(byte) = bytes.get_mut(i) {
                *byte ^= 0x04;
            }
            let bad = Written {
                handle: w.handle.clone(),
                bytes,
            };
            let op = format!("restoring key groups {range} with byte {i} flipped, and registering");
            let e = cx.err(&format!("{op}: a flipped byte must be noticed"), || {
                restored(&cx, &make, max_p, range, &[&bad]).and_then(|mut r| {
                    r.b.value_state(&ValueStateDescriptor::<u64>::new("count"))
                        .map(|_| ())
                })
            });
            let expected = if i < header_end {
                "keyed snapshot header".to_string()
            } else {
                let index = w
                    .handle
                    .offsets
                    .iter()
                    .rposition(|&o| o as usize <= i)
                    .unwrap_or(0);
                format!(
                    "keyed snapshot section of key group {}",
                    range.start + index as u32
                )
            };
            match &e {
                StateError::Core(CoreError::Corrupt { what, .. }) if *what == expected => {}
                other => cx.fail(format!(
                    "{op}: expected CoreError::Corrupt naming \"{expected}\", got {other:?}"
                )),
            }
        }
        if first.is_none() {
            first = Some(w);
        }
    }
    let Some(w) = first else {
        cx.fail("no snapshot was written")
    };

    // Every truncation, header included.
    let header_end = w.handle.header.1 as usize;
    for cut in 0..w.bytes.len() {
        let split = header_end.min(cut);
        let part = RestorePart {
            handle: &w.handle,
            header: w.bytes.get(..split).unwrap_or_default(),
            sections: bytes::Bytes::copy_from_slice(w.bytes.get(split..cut).unwrap_or_default()),
            sections_offset: split as u64,
        };
        let mut r = fresh(&cx, &make, 4, full(4));
        let op = format!(
            "restoring a snapshot cut at byte {cut} of {}",
            w.bytes.len()
        );
        cx.err(
            &format!("{op}: a truncated snapshot must be refused"),
            || r.b.restore(&[part]),
        );
    }

    // Offsets shifted by one section: the key group recorded in each section catches it.
    let mut shifted = w.handle.clone();
    shifted.offsets.rotate_left(1);
    if let Some(last) = shifted.offsets.last_mut() {
        *last = w.handle.end;
    }
    let mut r = fresh(&cx, &make, 4, full(4));
    let op = "restoring with offsets shifted by one section";
    let msg = cx
        .err(&format!("{op} must fail"), || {
            format::whole_stream_part(&shifted, &w.bytes).and_then(|part| r.b.restore(&[part]))
        })
        .to_string();
    cx.must(msg.contains("key group 0"), || {
        format!("{op}: the error must name key group 0: {msg}")
    });
}

/// Registering a restored state with another value type than the snapshot's is
/// [`StateError::Incompatible`] naming the state and both types; the right type still works.
pub fn check_type_mismatch_after_restore<K: SuiteKey, B: KeyedStateBackend<K>>(
    make: impl Fn(u32, KeyGroupRange) -> B,
) {
    let cx = Cx::new::<B>("type mismatch after restore");
    let mut b = fresh(&cx, &make, 8, full(8));
    let s = b.register::<u64>("count");
    let key = K::nth(1);
    b.put(s, &key, 1);
    let w = b.write();
    let mut r = cx.ok("restoring", restored(&cx, &make, 8, full(8), &[&w]));
    let e = cx.err("registering a restored u64 state as u32 must fail", || {
        r.b.value_state(&ValueStateDescriptor::<u32>::new("count"))
    });
    expect_incompatible(
        &cx,
        "registering a restored u64 state as u32",
        &e,
        "count",
        &[type_name::<u64>(), type_name::<u32>()],
    );
    let ok = r.register::<u64>("count");
    cx.eq(
        "after a refused registration, the right type still restores the value",
        &r.get(ok, &key),
        &Some(1),
    );
}

/// A snapshot of one key type restored into a backend of another is
/// [`StateError::Incompatible`] naming a state and both key types.
pub fn check_incompatible_key_type<K1, B1, K2, B2>(
    make_first: impl Fn(u32, KeyGroupRange) -> B1,
    make_second: impl Fn(u32, KeyGroupRange) -> B2,
) where
    K1: SuiteKey,
    B1: KeyedStateBackend<K1>,
    K2: SuiteKey,
    B2: KeyedStateBackend<K2>,
{
    let cx = Cx::new::<B2>("another key type");
    cx.must(type_name::<K1>() != type_name::<K2>(), || {
        format!(
            "the check needs two key types, got `{}` twice",
            type_name::<K1>()
        )
    });
    let first_cx = Cx::new::<B1>("another key type");
    let mut b = fresh(&first_cx, &make_first, 8, full(8));
    let s = b.register::<u64>("count");
    b.put(s, &K1::nth(1), 1);
    let w = b.write();
    let mut other = fresh(&cx, &make_second, 8, full(8));
    let op = format!(
        "restoring a snapshot keyed by `{}` into a backend keyed by `{}`",
        type_name::<K1>(),
        type_name::<K2>()
    );
    let e = cx.err(&format!("{op} must fail"), || {
        other.b.restore(&[whole_part(&cx, &w)]).and_then(|()| {
            other
                .b
                .value_state(&ValueStateDescriptor::<u64>::new("count"))
                .map(|_| ())
        })
    });
    expect_incompatible(
        &cx,
        &op,
        &e,
        "count",
        &[type_name::<K1>(), type_name::<K2>()],
    );
}

/// Restored states not registered yet are carried unchanged into the next snapshot (byte for
/// byte when none is registered), so a state registered lazily is not lost by a checkpoint taken
/// first.
pub fn check_unregistered_states_survive<K: SuiteKey, B: KeyedStateBackend<K>>(
    make: impl Fn(u32, KeyGroupRange) -> B,
) {
    let cx = Cx::new::<B>("unregistered restored states survive");
    let key = K::nth(1);
    let mut b = fresh(&cx, &make, 8, full(8));
    let s = b.register::<u64>("lazy");
    b.put(s, &key, 42);
    let first = b.write();
    let mut r = cx.ok("restoring", restored(&cx, &make, 8, full(8), &[&first]));
    let second = r.write();
    cx.eq(
        "a snapshot of a restored backend with nothing registered has the original bytes",
        &second.bytes,
        &first.bytes,
    );
    let mut r2 = cx.ok(
        "restoring again",
        restored(&cx, &make, 8, full(8), &[&second]),
    );
    let s2 = r2.register::<u64>("lazy");
    cx.eq(
        "a state registered after two checkpoints has its value",
        &r2.get(s2, &key),
        &Some(42),
    );

    // With one of two states registered and changed, the other is carried as it was.
    let keys = keys::<K>(40);
    let mut b = fresh(&cx, &make, 8, full(8));
    let old = b.register::<u64>("untouched");
    let new = b.register::<String>("changed");
    let mut olds = HashMap::new();
    let mut news = HashMap::new();
    for (i, k) in keys.iter().enumerate() {
        b.put(old, k, i as u64);
        olds.insert(k.clone(), i as u64);
        b.put(new, k, format!("before {i}"));
    }
    let w = b.write();
    let mut r = cx.ok("restoring", restored(&cx, &make, 8, full(8), &[&w]));
    let changed = r.register::<String>("changed");
    for (i, k) in keys.iter().enumerate() {
        let v = format!("après {i}");
        r.put(changed, k, v.clone());
        news.insert(k.clone(), v);
    }
    let w2 = r.write();
    cx.same_map(
        "a restored state left unregistered is in the next snapshot",
        &content::<K, u64>(&cx, &w2, "untouched"),
        &olds,
    );
    let mut r3 = cx.ok("restoring again", restored(&cx, &make, 8, full(8), &[&w2]));
    let u = r3.register::<u64>("untouched");
    let c = r3.register::<String>("changed");
    r3.read_back(
        "a state left unregistered for a checkpoint keeps its values",
        u,
        &olds,
        &keys,
    );
    r3.read_back(
        "the registered state has the values written after the restore",
        c,
        &news,
        &keys,
    );
}

/// Equal state gives byte-identical snapshots, whatever the order of the updates and whatever
/// entries came and went.
pub fn check_deterministic_bytes<K: SuiteKey, B: KeyedStateBackend<K>>(
    make: impl Fn(u32, KeyGroupRange) -> B,
) {
    let cx = Cx::new::<B>("deterministic bytes");
    let max_p = 32;
    let keys = keys::<K>(200);
    let temp = K::nth(10_000);
    let mut a = fresh(&cx, &make, max_p, full(max_p));
    let mut b = fresh(&cx, &make, max_p, full(max_p));
    let sa = a.register::<u64>("c");
    let sb = b.register::<u64>("c");
    for (i, k) in keys.iter().enumerate() {
        a.put(sa, k, i as u64);
    }
    // Another insertion order, with detours.
    for (i, k) in keys.iter().enumerate().rev() {
        b.put(sb, k, 0);
        b.put(sb, &temp, 5);
        b.put(sb, k, i as u64);
        b.clear(sb, &temp);
    }
    cx.eq(
        "equal state gives identical snapshot bytes",
        &a.write().bytes,
        &b.write().bytes,
    );
}

/// More than [`MAX_STATES`] states is [`StateError::TooManyStates`]; registering an existing one
/// again is still fine; a full backend snapshots and restores; restored states count toward the
/// limit.
pub fn check_too_many_states<K: SuiteKey, B: KeyedStateBackend<K>>(
    make: impl Fn(u32, KeyGroupRange) -> B,
) {
    let cx = Cx::new::<B>("too many states");
    let expect_too_many = |e: StateError, when: &str| match e {
        StateError::TooManyStates { name, count, max } => {
            cx.eq(
                &format!("{when}: the error names the state"),
                &name.as_str(),
                &"one-too-many",
            );
            cx.eq(
                &format!("{when}: the error counts it"),
                &count,
                &(MAX_STATES + 1),
            );
            cx.eq(
                &format!("{when}: the error gives the limit"),
                &max,
                &MAX_STATES,
            );
        }
        other => cx.fail(format!("{when}: expected TooManyStates, got {other:?}")),
    };
    let mut b = fresh(&cx, &make, 1, full(1));
    for i in 0..MAX_STATES {
        b.register::<u8>(&format!("s{i}"));
    }
    b.register::<u8>("s0");
    let e = cx.err(
        "registering one state more than MAX_STATES must fail",
        || {
            b.b.value_state(&ValueStateDescriptor::<u8>::new("one-too-many"))
        },
    );
    expect_too_many(e, "one state too many");

    let w = b.write();
    cx.eq(
        "a full backend snapshots every state",
        &header_of(&cx, &w).states.len(),
        &MAX_STATES,
    );
    let mut r = cx.ok(
        "restoring a full backend",
        restored(&cx, &make, 1, full(1), &[&w]),
    );
    let again = r.write();
    cx.eq(
        "a restored full backend carries every state",
        &header_of(&cx, &again).states.len(),
        &MAX_STATES,
    );
    let e = cx.err(
        "restored states count toward MAX_STATES; one more must fail",
        || {
            r.b.value_state(&ValueStateDescriptor::<u8>::new("one-too-many"))
        },
    );
    expect_too_many(e, "one state too many after a restore");
    r.register::<u8>("s7");
}
