//! Registration, value semantics, snapshot layout and isolation, round trip, `for_each_entry`.

use super::SuiteKey;
use super::helpers::{
    Cx, Subject, check_written, content, expect_incompatible, finish, fresh, full, keys, restored,
};
#[cfg(doc)]
use crate::StateError;
use crate::format::EMPTY_SECTION_LEN;
use crate::keyed::{KeyedStateBackend, ValueState, ValueStateDescriptor};
use std::any::type_name;
use std::cell::Cell;
use std::collections::{HashMap, HashSet};
use weir_core::keygroup::{KeyGroup, KeyGroupRange, assign_to_key_group};
use weir_core::panic::panic_message;

/// Registering a state twice with the same name and type returns the same handle; distinct
/// states get distinct handles; another type is [`StateError::Incompatible`] naming the state and
/// both types, and leaves the registered state working.
pub fn check_registration<K: SuiteKey, B: KeyedStateBackend<K>>(
    make: impl Fn(u32, KeyGroupRange) -> B,
) {
    let cx = Cx::new::<B>("registration");
    let mut b = fresh(&cx, &make, 128, full(128));
    let count = b.register::<u64>("count");
    let again = b.register::<u64>("count");
    cx.eq(
        "registering a state again with the same name and type returns the same handle",
        &again.id,
        &count.id,
    );
    let other = b.register::<u64>("other");
    cx.must(other.id != count.id, || {
        format!("two states got the same handle {}", other.id)
    });
    let e = cx.err(
        "registering 'count' again with another value type must fail",
        || {
            b.b.value_state(&ValueStateDescriptor::<String>::new("count"))
        },
    );
    expect_incompatible(
        &cx,
        "registering 'count' again with another value type",
        &e,
        "count",
        &[type_name::<u64>(), type_name::<String>()],
    );
    let key = K::nth(1);
    b.put(count, &key, 5);
    b.put(other, &key, 6);
    cx.eq(
        "a state still works after a refused registration",
        &b.get(count, &key),
        &Some(5),
    );
    cx.eq(
        "two states of the same key are independent",
        &b.get(other, &key),
        &Some(6),
    );
}

/// `value`, `update`, `clear` and `value_mut_or_insert` behave as a map per state: insert once,
/// `init` only when absent, overwrite, remove, and nothing else in the snapshot.
pub fn check_value_semantics<K: SuiteKey, B: KeyedStateBackend<K>>(
    make: impl Fn(u32, KeyGroupRange) -> B,
) {
    let cx = Cx::new::<B>("value semantics");
    let mut b = fresh(&cx, &make, 128, full(128));
    let sum = b.register::<u64>("sum");
    let tag = b.register::<String>("tag");
    let (a, bee, never) = (K::nth(1), K::nth(2), K::nth(3));
    cx.eq(
        "a key never written has no value",
        &b.get(sum, &never),
        &None,
    );

    let inits = Cell::new(0);
    for key in [&a, &bee, &a, &a] {
        let g = b.kg(key);
        *b.b.value_mut_or_insert(sum, key, g, || {
            inits.set(inits.get() + 1);
            0
        }) += 1;
    }
    cx.eq(
        "value_mut_or_insert calls init only for an absent key",
        &inits.get(),
        &2,
    );
    cx.eq(
        "value_mut_or_insert inserts once, then returns the stored value",
        &b.get(sum, &a),
        &Some(3),
    );
    cx.eq("value_mut_or_insert counts", &b.get(sum, &bee), &Some(1));

    b.put(tag, &a, "first".to_string());
    b.put(tag, &a, "ünïcödé".to_string());
    cx.eq(
        "update overwrites",
        &b.get(tag, &a),
        &Some("ünïcödé".to_string()),
    );

    b.clear(sum, &a);
    cx.eq("clear removes the value", &b.get(sum, &a), &None);
    cx.eq(
        "clearing a key in one state leaves the other states alone",
        &b.get(tag, &a),
        &Some("ünïcödé".to_string()),
    );
    b.clear(sum, &never);
    cx.eq(
        "clearing an absent key is a no-op",
        &b.get(sum, &bee),
        &Some(1),
    );
    let g = b.kg(&a);
    *b.b.value_mut_or_insert(sum, &a, g, || 40) += 2;
    cx.eq(
        "value_mut_or_insert after clear starts from init",
        &b.get(sum, &a),
        &Some(42),
    );
    b.clear(sum, &a);

    let w = b.write();
    cx.same_map(
        "after the clears, the snapshot holds only the remaining entry",
        &content::<K, u64>(&cx, &w, "sum"),
        &HashMap::from([(bee.clone(), 1)]),
    );
    cx.same_map(
        "the snapshot holds the other state's entry",
        &content::<K, String>(&cx, &w, "tag"),
        &HashMap::from([(a.clone(), "ünïcödé".to_string())]),
    );
}

/// Every key group of the range has a section, right after the header, even an empty one, and
/// an empty section is [`EMPTY_SECTION_LEN`] bytes. (Every snapshot the suite writes is also
/// checked to be well formed: header, offsets, end, each section's key group and checksum.)
pub fn check_snapshot_layout<K: SuiteKey, B: KeyedStateBackend<K>>(
    make: impl Fn(u32, KeyGroupRange) -> B,
) {
    let cx = Cx::new::<B>("snapshot layout");
    let range = KeyGroupRange::new(10, 19);
    let mut b = fresh(&cx, &make, 128, range);
    let empty = b.write();
    cx.eq(
        "a backend without states writes a section per key group",
        &empty.handle.offsets.len(),
        &10,
    );
    let s = b.register::<u64>("count");
    let w = b.write();
    cx.eq(
        "a section per key group",
        &w.handle.offsets.len(),
        &(range.len() as usize),
    );
    cx.eq(
        "the first section follows the header",
        &w.handle.offsets.first().copied(),
        &Some(w.handle.header.1),
    );
    let mut ends = w.handle.offsets.iter().skip(1).copied().collect::<Vec<_>>();
    ends.push(w.handle.end);
    for (kg, (start, end)) in range.iter().zip(w.handle.offsets.iter().zip(ends)) {
        cx.eq(
            &format!("the empty section of key group {kg} is EMPTY_SECTION_LEN bytes"),
            &(end - start),
            &(EMPTY_SECTION_LEN as u64),
        );
    }

    // With entries, the sections holding them grow and the others stay empty.
    let keys: Vec<K> = (0..200)
        .map(K::nth)
        .filter(|k| range.contains(assign_to_key_group(k, 128)))
        .take(5)
        .collect();
    for (i, k) in keys.iter().enumerate() {
        b.put(s, k, i as u64);
    }
    let full_groups: HashSet<KeyGroup> = keys.iter().map(|k| b.kg(k)).collect();
    let w = b.write();
    let mut ends = w.handle.offsets.iter().skip(1).copied().collect::<Vec<_>>();
    ends.push(w.handle.end);
    for (kg, (start, end)) in range.iter().zip(w.handle.offsets.iter().zip(ends)) {
        let len = end - start;
        if full_groups.contains(&kg) {
            cx.must(len > EMPTY_SECTION_LEN as u64, || {
                format!("key group {kg} holds entries, and its section is only {len} bytes")
            });
        } else {
            cx.eq(
                &format!("the empty section of key group {kg} is EMPTY_SECTION_LEN bytes"),
                &len,
                &(EMPTY_SECTION_LEN as u64),
            );
        }
    }
}

/// A snapshot holds the state at the moment of `snapshot()`: changes, insertions and removals
/// after it are absent from what it writes, even while it is written on another thread, and it
/// can be written after the backend is gone. The live backend has the new state.
pub fn check_snapshot_isolation<K: SuiteKey, B: KeyedStateBackend<K>>(
    make: impl Fn(u32, KeyGroupRange) -> B,
) {
    let cx = Cx::new::<B>("snapshot isolation");
    let max_p = 16;
    let mut b = fresh(&cx, &make, max_p, full(max_p));
    let s = b.register::<u64>("count");
    let keys = keys::<K>(50);
    let late = K::nth(1000);
    let mut live = HashMap::new();
    for (i, k) in keys.iter().enumerate() {
        b.put(s, k, i as u64);
        live.insert(k.clone(), i as u64);
    }
    let before = live.clone();
    let snapshot = cx.ok("snapshot", b.b.snapshot());

    // The asynchronous part runs on another thread while processing changes, adds and removes.
    let writer = std::thread::spawn(move || {
        let mut bytes = Vec::new();
        snapshot.write_to(&mut bytes).map(|layout| (layout, bytes))
    });
    for k in keys.iter().take(10) {
        b.put(s, k, 999);
        live.insert(k.clone(), 999);
    }
    b.put(s, &late, 7);
    live.insert(late.clone(), 7);
    for k in keys.iter().skip(40) {
        b.clear(s, k);
        live.remove(k);
    }
    let (layout, bytes) = match writer.join() {
        Ok(r) => cx.ok("writing the snapshot on another thread", r),
        Err(p) => cx.fail(format!(
            "writing the snapshot on another thread panicked: {}",
            panic_message(p.as_ref())
        )),
    };
    let w = check_written::<K>(&cx, layout, bytes, max_p, full(max_p));
    cx.same_map(
        "the snapshot holds the state as it was at snapshot(), not the later updates",
        &content::<K, u64>(&cx, &w, "count"),
        &before,
    );
    let mut r = cx.ok(
        "restoring the snapshot",
        restored(&cx, &make, max_p, full(max_p), &[&w]),
    );
    let rs = r.register::<u64>("count");
    r.read_back(
        "a restored snapshot holds the state at snapshot()",
        rs,
        &before,
        [&late],
    );

    b.read_back(
        "the live backend has the updates made after snapshot()",
        s,
        &live,
        [&keys[45]],
    );
    cx.eq(
        "the live backend has the late key",
        &b.get(s, &late),
        &Some(7),
    );
    cx.eq(
        "the live backend has the changed value",
        &b.get(s, &keys[0]),
        &Some(999),
    );
    cx.eq(
        "the live backend lost the cleared key",
        &b.get(s, &keys[45]),
        &None,
    );

    // A frozen view outlives its backend.
    let snapshot = cx.ok("snapshot", b.b.snapshot());
    drop(b);
    let w = finish::<K>(&cx, snapshot, max_p, full(max_p));
    cx.same_map(
        "a snapshot written after its backend was dropped holds the state at snapshot()",
        &content::<K, u64>(&cx, &w, "count"),
        &live,
    );
}

/// Snapshot then restore, into the whole range and into a part of it, gives back every entry of
/// states of several value types, registered back in any order, and again in the next snapshot.
pub fn check_round_trip<K: SuiteKey, B: KeyedStateBackend<K>>(
    make: impl Fn(u32, KeyGroupRange) -> B,
) {
    let cx = Cx::new::<B>("round trip");
    let max_p = 32;

    // A backend with nothing in it round-trips.
    let mut empty = fresh(&cx, &make, max_p, full(max_p));
    let w = empty.write();
    let mut r = cx.ok(
        "restoring an empty snapshot",
        restored(&cx, &make, max_p, full(max_p), &[&w]),
    );
    cx.eq(
        "an empty snapshot restores to an empty backend",
        &r.write().bytes,
        &w.bytes,
    );

    for range in [full(max_p), KeyGroupRange::new(5, 20)] {
        let mut b = fresh(&cx, &make, max_p, range);
        let counts = b.register::<u64>("count");
        let names = b.register::<String>("name");
        let blobs = b.register::<Vec<u8>>("blob");
        let pairs = b.register::<(i64, bool)>("pair");
        let seen = b.register::<()>("seen");
        let keys: Vec<K> = (0..400)
            .map(K::nth)
            .filter(|k| range.contains(assign_to_key_group(k, max_p)))
            .collect();
        let mut mc: HashMap<K, u64> = HashMap::new();
        let mut mn: HashMap<K, String> = HashMap::new();
        let mut mb: HashMap<K, Vec<u8>> = HashMap::new();
        let mut mp: HashMap<K, (i64, bool)> = HashMap::new();
        let mut ms: HashMap<K, ()> = HashMap::new();
        for (i, k) in keys.iter().enumerate() {
            let n = i as u64;
            let count = n.wrapping_mul(0x0123_4567_89AB_CDEF) ^ (n << 60);
            b.put(counts, k, count);
            mc.insert(k.clone(), count);
            if i % 2 == 0 {
                let name = format!("{}·{i}·ÿ", "ß".repeat(i % 5));
                b.put(names, k, name.clone());
                mn.insert(k.clone(), name);
            }
            if i % 3 == 0 {
                let blob: Vec<u8> = (0..(i % 7) as u8).map(|x| x.wrapping_mul(37)).collect();
                b.put(blobs, k, blob.clone());
                mb.insert(k.clone(), blob);
            }
            if i % 4 == 1 {
                let pair = (i64::MIN + i as i64, i % 8 == 1);
                b.put(pairs, k, pair);
                mp.insert(k.clone(), pair);
            }
            if i % 5 == 2 {
                b.put(seen, k, ());
                ms.insert(k.clone(), ());
            }
        }
        let w = b.write();
        let rule = format!("a snapshot of key groups {range} restores every entry");
        cx.same_map(&rule, &content::<K, u64>(&cx, &w, "count"), &mc);
        cx.same_map(&rule, &content::<K, String>(&cx, &w, "name"), &mn);
        cx.same_map(&rule, &content::<K, Vec<u8>>(&cx, &w, "blob"), &mb);
        cx.same_map(&rule, &content::<K, (i64, bool)>(&cx, &w, "pair"), &mp);
        cx.same_map(&rule, &content::<K, ()>(&cx, &w, "seen"), &ms);

        let mut r = cx.ok(
            "restoring the snapshot",
            restored(&cx, &make, max_p, range, &[&w]),
        );
        // Registered in another order than before.
        let rs = r.register::<()>("seen");
        let rp = r.register::<(i64, bool)>("pair");
        let rc = r.register::<u64>("count");
        let rb = r.register::<Vec<u8>>("blob");
        let rn = r.register::<String>("name");
        r.read_back(&rule, rc, &mc, &keys);
        r.read_back(&rule, rn, &mn, &keys);
        r.read_back(&rule, rb, &mb, &keys);
        r.read_back(&rule, rp, &mp, &keys);
        r.read_back(&rule, rs, &ms, &keys);
        // States registered in another order get other ids; the content must not change.
        let again = r.write();
        let rule =
            format!("a restored snapshot of key groups {range} survives a second round trip");
        cx.same_map(&rule, &content::<K, u64>(&cx, &again, "count"), &mc);
        cx.same_map(&rule, &content::<K, String>(&cx, &again, "name"), &mn);
        cx.same_map(&rule, &content::<K, Vec<u8>>(&cx, &again, "blob"), &mb);
        cx.same_map(&rule, &content::<K, (i64, bool)>(&cx, &again, "pair"), &mp);
        cx.same_map(&rule, &content::<K, ()>(&cx, &again, "seen"), &ms);
    }
}

/// `for_each_entry` visits every entry of a state once, with its latest value (changes not yet
/// written anywhere included), and no cleared key or entry of another state; after a restore
/// of part of the key groups, exactly the entries of those.
pub fn check_for_each_entry<K: SuiteKey, B: KeyedStateBackend<K>>(
    make: impl Fn(u32, KeyGroupRange) -> B,
) {
    let cx = Cx::new::<B>("for each entry");
    let max_p = 16;
    let mut b = fresh(&cx, &make, max_p, full(max_p));
    let counts = b.register::<u64>("count");
    let other = b.register::<u64>("other");
    let mut model: HashMap<K, u64> = HashMap::new();
    for i in 0..300u64 {
        let k = K::nth(i);
        b.put(counts, &k, i);
        model.insert(k.clone(), i);
        if i % 3 == 0 {
            b.put(other, &k, i + 1);
        }
    }
    for i in (0..300u64).step_by(7) {
        let k = K::nth(i);
        b.clear(counts, &k);
        model.remove(&k);
    }
    // The latest change, made through a `&mut` and never read back.
    let last = K::nth(1);
    let g = b.kg(&last);
    *b.b.value_mut_or_insert(counts, &last, g, || 0) += 1000;
    model.insert(last.clone(), 1001);
    let seen = entries_of(&mut b, counts);
    cx.eq(
        "for_each_entry visits each entry once, with its latest value",
        &seen,
        &model,
    );
    let w = b.write();
    let half = KeyGroupRange::new(0, max_p / 2 - 1);
    let mut r = cx.ok(
        "restoring half of the key groups",
        restored(&cx, &make, max_p, half, &[&w]),
    );
    let counts = r.register::<u64>("count");
    let expected: HashMap<K, u64> = model
        .into_iter()
        .filter(|(k, _)| half.contains(assign_to_key_group(k, max_p)))
        .collect();
    cx.eq(
        "after a restore, for_each_entry visits exactly the entries of the restored key groups",
        &entries_of(&mut r, counts),
        &expected,
    );
}

/// Every entry of a state seen through `for_each_entry`, failing on a key seen twice.
fn entries_of<K: SuiteKey, B: KeyedStateBackend<K>>(
    s: &mut Subject<'_, K, B>,
    state: ValueState<u64>,
) -> HashMap<K, u64> {
    let mut seen = HashMap::new();
    let mut twice = None;
    s.b.for_each_entry(state, &mut |k, v| {
        if seen.insert(k.clone(), *v).is_some() {
            twice = Some(k.clone());
        }
    });
    if let Some(k) = twice {
        s.cx.fail(format!("for_each_entry visited {k:?} twice"));
    }
    seen
}
