//! The keyed-state conformance suite: the [`KeyedStateBackend`] contract as executable checks,
//! Weir's counterpart of Flink's `StateBackendTestBase`. Every keyed backend must pass [`run_all`].
//!
//! # Using it for a new backend
//!
//! Add an integration test to the backend's crate that hands [`run_all`] a factory for each key
//! type the suite uses, `String` and `u64`:
//!
//! ```no_run
//! use weir_state::{HeapKeyedStateBackend, conformance};
//!
//! // For another backend: `|max_parallelism, range| MyBackend::new(max_parallelism, range)`.
//! conformance::run_all(HeapKeyedStateBackend::new, HeapKeyedStateBackend::new);
//! ```
//!
//! A factory `make(max_parallelism, range)` must return a fresh, empty backend owning the key
//! groups `range` of `max_parallelism` (a backend on disk: in a directory of its own, each call).
//! The suite calls it many times. A backend for one key type only can call [`run_key_checks`]
//! with it, and each check is public, so one that fails can be run alone. The backend must write
//! snapshots in the [`crate::format`]: the suite reads them with that format's own functions, to
//! see every entry a snapshot holds without any inspection method beyond the trait.
//!
//! Every check is synchronous and works in memory: it writes snapshots into a `Vec<u8>` and
//! restores them as the checkpoint layer would, handing each backend the header and only the
//! sections of the key groups it owns. A violation panics with
//! `keyed-state conformance [<check>] on <backend type>: <the rule broken>`.
//!
//! # The checks
//!
//! Per key type ([`run_key_checks`]):
//! - [`check_registration`]: the same name and type give the same handle; another type is
//!   [`StateError::Incompatible`] naming the state and both types.
//! - [`check_value_semantics`]: `value`, `update`, `clear`, `value_mut_or_insert`.
//! - [`check_snapshot_layout`]: one section per key group, empty ones
//!   [`EMPTY_SECTION_LEN`] long, right after the header.
//! - [`check_snapshot_isolation`]: updates after `snapshot()` are absent from what it writes, even
//!   when it is written on another thread meanwhile or after the backend is dropped.
//! - [`check_round_trip`]: snapshot and restore give back every entry, over several value types.
//! - [`check_for_each_entry`]: `for_each_entry` visits every entry of a state once, with its
//!   value, before and after a restore, and none of a cleared key.
//! - [`check_rescale`]: 1 → 2 → 1 subtasks: each key ends only in the backend owning its key
//!   group, and merging gives back the original state and bytes.
//! - [`check_restore_twice`]: a key group handed over twice is an error naming it.
//! - [`check_restore_refusals`]: another max parallelism, or a restore after registration, is an
//!   error.
//! - [`check_corruption`]: a flipped byte anywhere, a truncation, misplaced offsets: errors that
//!   name the header or key group, never panics.
//! - [`check_type_mismatch_after_restore`]: another value type than the snapshot's is
//!   [`StateError::Incompatible`].
//! - [`check_unregistered_states_survive`]: restored states not registered (yet) are carried into
//!   the next snapshot unchanged.
//! - [`check_deterministic_bytes`]: equal state gives identical bytes, whatever the history.
//! - [`check_random_models`] / [`check_against_model`]: random operations against a `HashMap`
//!   model, snapshots taken midway restored whole and split across a parallelism.
//! - [`check_kind_semantics`]: list, map, reducing and aggregating states and value defaults
//!   against Flink's semantics and edge cases (an empty list update clears, a map goes with its
//!   last entry, a first reduced value is stored as is, no aggregate before an input, ...).
//! - [`check_kind_registration`] / [`check_kind_mismatch_after_restore`]: a state registered, or
//!   restored, as another kind or element type is [`StateError::Incompatible`] naming the state
//!   and both kinds or types.
//! - [`check_kind_snapshot_isolation`]: changes to lists and maps after `snapshot()` are absent
//!   from what it writes.
//! - [`check_kinds_round_trip`]: all five kinds through snapshot and restore, whole and rescaled
//!   1 → 2 → 3 → 1, each state under its kind in the header.
//! - [`check_random_kind_models`] / [`check_kinds_against_model`]: random operations of every
//!   kind against a model, snapshots restored whole and split.
//!
//! Incremental snapshots ([`run_incremental_checks`], for a backend made in incremental mode):
//! - [`check_incremental_model`]: random changes over a run of checkpoints, each confirmed,
//!   aborted or left pending at random, with savepoints between: each delta is on the latest
//!   confirmed checkpoint and holds every key changed since it (and no key left untouched);
//!   each chain restored, whole and split over two backends, gives the same state as a full
//!   snapshot taken at the same moment.
//! - [`check_incremental_restore_rules`]: a delta without its base is an error naming the key
//!   group; a restored chain's states that are not registered are carried into the next full
//!   snapshot (with their overlays) and into later deltas unchanged.
//!
//! Across key types and limits ([`run_all`]):
//! - [`check_incompatible_key_type`]: a snapshot of another key type is
//!   [`StateError::Incompatible`].
//! - [`check_too_many_states`]: more than [`MAX_STATES`] is [`StateError::TooManyStates`], counting
//!   restored states.

use crate::StateError;
use crate::format::{self, EMPTY_SECTION_LEN, MAX_STATES, SnapshotHeader, StateKind};
use crate::keyed::{
    AggregateFunction, AggregatingState, AggregatingStateDescriptor, KeyedAccess, KeyedSnapshot,
    KeyedSnapshotLayout, KeyedStateBackend, ListState, ListStateDescriptor, MapState,
    MapStateDescriptor, ReducingState, ReducingStateDescriptor, RestorePart, SnapshotScope,
    StateKey, StateValue, ValueState, ValueStateDescriptor,
};
use std::any::type_name;
use std::cell::Cell;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt::{Debug, Display};
use std::marker::PhantomData;
use std::panic::{AssertUnwindSafe, catch_unwind};
use weir_core::CoreError;
use weir_core::handle::{KeyedStateHandle, StreamStateHandle};
use weir_core::keygroup::{
    KeyGroup, KeyGroupRange, assign_to_key_group, compute_key_group_range_for_operator_index,
};

/// The seed [`run_key_checks`] drives [`check_random_models`] with.
pub const MODEL_SEED: u64 = 0x5745_4952_5354_4154;

/// How many random cases [`run_key_checks`] runs per key type.
pub const MODEL_CASES: u32 = 24;

/// Keys of the model check are `K::nth(0..MODEL_KEYS)`.
pub const MODEL_KEYS: u16 = 300;

/// Expands to one `#[test]` per check of the suite, for a backend made by `$make_string`
/// (`String` keys) and `$make_u64` (`u64` keys), each `Fn(u32, KeyGroupRange) -> B`:
///
/// ```ignore
/// mod my_backend {
///     weir_state::keyed_backend_conformance!(super::make::<String>, super::make::<u64>);
/// }
/// ```
///
/// Each check is a test of its own, named after it (`registration`, `round_trip`, ...), so a
/// failing run names the rule broken, and `cargo test round_trip` runs one. Needs the
/// `conformance` feature of `weir-state` (a dev-dependency with `features = ["conformance"]`).
#[macro_export]
macro_rules! keyed_backend_conformance {
    ($make_string:expr, $make_u64:expr $(,)?) => {
        $crate::keyed_backend_conformance!(@each $make_string, $make_u64;
            registration => check_registration,
            value_semantics => check_value_semantics,
            snapshot_layout => check_snapshot_layout,
            snapshot_isolation => check_snapshot_isolation,
            round_trip => check_round_trip,
            for_each_entry => check_for_each_entry,
            rescale => check_rescale,
            restore_twice => check_restore_twice,
            restore_refusals => check_restore_refusals,
            corruption => check_corruption,
            type_mismatch_after_restore => check_type_mismatch_after_restore,
            unregistered_states_survive => check_unregistered_states_survive,
            deterministic_bytes => check_deterministic_bytes,
            kind_semantics => check_kind_semantics,
            kind_registration => check_kind_registration,
            kind_mismatch_after_restore => check_kind_mismatch_after_restore,
            kind_snapshot_isolation => check_kind_snapshot_isolation,
            kinds_round_trip => check_kinds_round_trip,
        );

        #[test]
        fn random_models() {
            use $crate::conformance as c;
            c::check_random_models(&$make_string, c::MODEL_SEED, c::MODEL_CASES);
            c::check_random_models(&$make_u64, c::MODEL_SEED, c::MODEL_CASES);
        }

        #[test]
        fn random_kind_models() {
            use $crate::conformance as c;
            c::check_random_kind_models(&$make_string, c::KIND_MODEL_SEED, c::KIND_MODEL_CASES);
            c::check_random_kind_models(&$make_u64, c::KIND_MODEL_SEED, c::KIND_MODEL_CASES);
        }

        #[test]
        fn incompatible_key_type() {
            $crate::conformance::check_incompatible_key_type(&$make_string, &$make_u64);
            $crate::conformance::check_incompatible_key_type(&$make_u64, &$make_string);
        }

        #[test]
        fn too_many_states() {
            $crate::conformance::check_too_many_states(&$make_u64);
        }
    };
    (@each $make_string:expr, $make_u64:expr; $($name:ident => $check:ident,)*) => {
        $(
            #[test]
            fn $name() {
                $crate::conformance::$check(&$make_string);
                $crate::conformance::$check(&$make_u64);
            }
        )*
    };
}

/// Expands to one `#[test]` per incremental check ([`run_incremental_checks`]), for a backend
/// made in incremental mode by `$make_string` and `$make_u64`; see
/// [`keyed_backend_conformance!`](crate::keyed_backend_conformance).
#[macro_export]
macro_rules! keyed_backend_incremental_conformance {
    ($make_string:expr, $make_u64:expr $(,)?) => {
        #[test]
        fn incremental_model() {
            use $crate::conformance as c;
            c::check_incremental_model(&$make_string, c::MODEL_SEED, c::INCREMENTAL_CASES);
            c::check_incremental_model(&$make_u64, c::MODEL_SEED, c::INCREMENTAL_CASES);
        }

        #[test]
        fn incremental_restore_rules() {
            $crate::conformance::check_incremental_restore_rules(&$make_string);
            $crate::conformance::check_incremental_restore_rules(&$make_u64);
        }
    };
}

/// Runs every check, with `String` keys from `make_string` and `u64` keys from `make_u64`.
///
/// Each call `make(max_parallelism, range)` must return a fresh, empty backend owning the key
/// groups `range` of `max_parallelism`.
pub fn run_all<S, U>(
    make_string: impl Fn(u32, KeyGroupRange) -> S,
    make_u64: impl Fn(u32, KeyGroupRange) -> U,
) where
    S: KeyedStateBackend<String>,
    U: KeyedStateBackend<u64>,
{
    run_key_checks(&make_string);
    run_key_checks(&make_u64);
    check_incompatible_key_type(&make_string, &make_u64);
    check_incompatible_key_type(&make_u64, &make_string);
    check_too_many_states(&make_u64);
}

/// Runs every check that needs one key type.
pub fn run_key_checks<K: SuiteKey, B: KeyedStateBackend<K>>(
    make: impl Fn(u32, KeyGroupRange) -> B,
) {
    check_registration(&make);
    check_value_semantics(&make);
    check_snapshot_layout(&make);
    check_snapshot_isolation(&make);
    check_round_trip(&make);
    check_for_each_entry(&make);
    check_rescale(&make);
    check_restore_twice(&make);
    check_restore_refusals(&make);
    check_corruption(&make);
    check_type_mismatch_after_restore(&make);
    check_unregistered_states_survive(&make);
    check_deterministic_bytes(&make);
    check_random_models(&make, MODEL_SEED, MODEL_CASES);
    check_kind_semantics(&make);
    check_kind_registration(&make);
    check_kind_mismatch_after_restore(&make);
    check_kind_snapshot_isolation(&make);
    check_kinds_round_trip(&make);
    check_random_kind_models(&make, KIND_MODEL_SEED, KIND_MODEL_CASES);
}

/// A key type the suite can run with: it makes as many distinct keys as a check needs.
pub trait SuiteKey: StateKey + Debug {
    /// The `i`-th key; distinct `i` give distinct keys.
    fn nth(i: u64) -> Self;
}

/// The empty string, then words in several scripts (ASCII, Latin with diacritics, Cyrillic,
/// Japanese, an emoji, a combining accent), each with its number.
impl SuiteKey for String {
    fn nth(i: u64) -> String {
        const STEMS: [&str; 6] = ["word", "wört", "слово", "単語", "🦀", "e\u{301}"];
        if i == 0 {
            return String::new();
        }
        format!("{}-{i}", STEMS[(i % STEMS.len() as u64) as usize])
    }
}

/// `i` times an odd constant: 0, then numbers spread over the whole range (a bijection).
impl SuiteKey for u64 {
    fn nth(i: u64) -> u64 {
        i.wrapping_mul(0x9E37_79B9_7F4A_7C15)
    }
}

// ---------------------------------------------------------------------------------------------
// Checks.

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

/// One step of the model check.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ModelOp {
    /// Sets key `K::nth(k)`'s `count` through `value_mut_or_insert`.
    Set(u16, u64),
    /// Adds (wrapping) to key `K::nth(k)`'s `count` through `value_mut_or_insert`, from 0.
    Add(u16, u64),
    /// Sets key `K::nth(k)`'s `name` through `update`.
    Name(u16, String),
    /// Clears key `K::nth(k)` in both states.
    Clear(u16),
    /// Takes a snapshot; it is written after the last operation.
    Snapshot,
}

/// Runs `ops` against a fresh backend of the whole range of `max_parallelism` and a `HashMap`
/// model. The live backend must agree with the model, and every snapshot (one per
/// [`ModelOp::Snapshot`], and one at the end) must hold the model as it was then, restored whole
/// and split across `parallelism` backends (clamped to `1..=max_parallelism`).
pub fn check_against_model<K: SuiteKey, B: KeyedStateBackend<K>>(
    make: impl Fn(u32, KeyGroupRange) -> B,
    max_parallelism: u32,
    parallelism: u32,
    ops: &[ModelOp],
) {
    let cx = Cx::new::<B>(format!(
        "model (max parallelism {max_parallelism}, parallelism {parallelism}, {} ops)",
        ops.len()
    ));
    model_case(&cx, &make, max_parallelism, parallelism, ops);
}

/// Runs `cases` random model checks from `seed`: max parallelism 1, 7 or 128, parallelism 1 to 4,
/// up to 400 operations over [`MODEL_KEYS`] keys, names of mixed scripts. A failure names the seed
/// and case.
pub fn check_random_models<K: SuiteKey, B: KeyedStateBackend<K>>(
    make: impl Fn(u32, KeyGroupRange) -> B,
    seed: u64,
    cases: u32,
) {
    const CHARS: [char; 10] = ['a', 'q', 'z', ' ', 'é', 'ß', 'я', '語', '🦀', '\0'];
    let mut rng = SplitMix64(seed);
    for case in 0..cases {
        let max_p = [1, 7, 128][rng.below(3) as usize];
        let parallelism = (1 + rng.below(4) as u32).min(max_p);
        let len = rng.below(400) as usize;
        let ops: Vec<ModelOp> = (0..len)
            .map(|_| {
                let key = rng.below(u64::from(MODEL_KEYS)) as u16;
                match rng.below(8) {
                    0..=2 => ModelOp::Set(key, rng.next_u64()),
                    3 => ModelOp::Add(key, rng.next_u64() >> rng.below(64)),
                    4 | 5 => {
                        let n = rng.below(9) as usize;
                        let name = (0..n)
                            .map(|_| CHARS[rng.below(CHARS.len() as u64) as usize])
                            .collect();
                        ModelOp::Name(key, name)
                    }
                    6 => ModelOp::Clear(key),
                    _ => ModelOp::Snapshot,
                }
            })
            .collect();
        let cx = Cx::new::<B>(format!(
            "model (seed {seed:#x}, case {case}: max parallelism {max_p}, parallelism \
             {parallelism}, {len} ops)"
        ));
        model_case(&cx, &make, max_p, parallelism, &ops);
    }
}

fn model_case<K: SuiteKey, B: KeyedStateBackend<K>>(
    cx: &Cx,
    make: &impl Fn(u32, KeyGroupRange) -> B,
    max_p: u32,
    parallelism: u32,
    ops: &[ModelOp],
) {
    let parallelism = parallelism.clamp(1, max_p);
    let mut b = fresh(cx, make, max_p, full(max_p));
    let count = b.register::<u64>("count");
    let name = b.register::<String>("name");
    let mut counts: HashMap<K, u64> = HashMap::new();
    let mut names: HashMap<K, String> = HashMap::new();
    let mut touched: Vec<K> = Vec::new();
    let mut seen = HashSet::new();
    let mut pending = Vec::new();
    for op in ops {
        let key = match op {
            ModelOp::Set(k, _) | ModelOp::Add(k, _) | ModelOp::Name(k, _) | ModelOp::Clear(k) => {
                let key = K::nth(u64::from(*k));
                if seen.insert(*k) {
                    touched.push(key.clone());
                }
                key
            }
            ModelOp::Snapshot => {
                pending.push((
                    cx.ok("snapshot", b.b.snapshot()),
                    counts.clone(),
                    names.clone(),
                ));
                continue;
            }
        };
        let g = b.kg(&key);
        match op {
            ModelOp::Set(_, v) => {
                *b.b.value_mut_or_insert(count, &key, g, || 0) = *v;
                counts.insert(key, *v);
            }
            ModelOp::Add(_, d) => {
                let v = b.b.value_mut_or_insert(count, &key, g, || 0);
                *v = v.wrapping_add(*d);
                let m = counts.entry(key).or_insert(0);
                *m = m.wrapping_add(*d);
            }
            ModelOp::Name(_, v) => {
                b.b.update(name, &key, g, v.clone());
                names.insert(key, v.clone());
            }
            ModelOp::Clear(_) => {
                b.b.clear(count, &key, g);
                b.b.clear(name, &key, g);
                counts.remove(&key);
                names.remove(&key);
            }
            ModelOp::Snapshot => {}
        }
    }
    b.read_back(
        "the live backend agrees with the model",
        count,
        &counts,
        &touched,
    );
    b.read_back(
        "the live backend agrees with the model",
        name,
        &names,
        &touched,
    );
    pending.push((cx.ok("snapshot", b.b.snapshot()), counts, names));

    for (i, (snapshot, counts, names)) in pending.into_iter().enumerate() {
        let w = finish::<K>(cx, snapshot, max_p, full(max_p));
        let rule = format!("snapshot {i} holds the model as it was at its snapshot()");
        cx.same_map(&rule, &content::<K, u64>(cx, &w, "count"), &counts);
        cx.same_map(&rule, &content::<K, String>(cx, &w, "name"), &names);

        let mut whole = cx.ok(
            "restoring the whole snapshot",
            restored(cx, make, max_p, full(max_p), &[&w]),
        );
        let c = whole.register::<u64>("count");
        let n = whole.register::<String>("name");
        let rule = format!("snapshot {i}, restored whole, reads back as the model");
        whole.read_back(&rule, c, &counts, &touched);
        whole.read_back(&rule, n, &names, &touched);

        let mut seen_counts = HashMap::new();
        let mut seen_names = HashMap::new();
        for p in 0..parallelism {
            let range = compute_key_group_range_for_operator_index(max_p, parallelism, p);
            let mut part = cx.ok(
                &format!("restoring key groups {range}"),
                restored(cx, make, max_p, range, &[&w]),
            );
            let c = part.register::<u64>("count");
            let n = part.register::<String>("name");
            let own = |k: &&K| range.contains(assign_to_key_group(*k, max_p));
            let own_keys: Vec<&K> = touched.iter().filter(own).collect();
            let own_counts: HashMap<K, u64> = counts
                .iter()
                .filter(|(k, _)| own(k))
                .map(|(k, v)| (k.clone(), *v))
                .collect();
            let own_names: HashMap<K, String> = names
                .iter()
                .filter(|(k, _)| own(k))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            let rule = format!(
                "snapshot {i}, restored into key groups {range} of {parallelism}, reads back as \
                 the model"
            );
            part.read_back(&rule, c, &own_counts, own_keys.iter().copied());
            part.read_back(&rule, n, &own_names, own_keys.iter().copied());
            let pw = part.write();
            let rule = format!(
                "snapshot {i}, restored into key groups {range}, holds only its key groups"
            );
            for (k, v) in content::<K, u64>(cx, &pw, "count") {
                cx.must(seen_counts.insert(k.clone(), v).is_none(), || {
                    format!("{rule}: {k:?} is in two parts")
                });
            }
            for (k, v) in content::<K, String>(cx, &pw, "name") {
                cx.must(seen_names.insert(k.clone(), v).is_none(), || {
                    format!("{rule}: {k:?} is in two parts")
                });
            }
        }
        let rule = format!("snapshot {i}, split across {parallelism}, holds the model");
        cx.same_map(&rule, &seen_counts, &counts);
        cx.same_map(&rule, &seen_names, &names);
    }
}

// ---------------------------------------------------------------------------------------------
// State kinds: list, map, reducing and aggregating states, and value states with a default.

/// The seed [`run_key_checks`] drives [`check_random_kind_models`] with.
pub const KIND_MODEL_SEED: u64 = 0x4B49_4E44_5354_4154;

/// How many random cases of [`check_random_kind_models`] [`run_key_checks`] runs per key type.
pub const KIND_MODEL_CASES: u32 = 16;

/// Keys of the kind model check are `K::nth(0..KIND_MODEL_KEYS)`: few, so operations pile up on
/// the same keys.
pub const KIND_MODEL_KEYS: u16 = 60;

/// User keys of the map state in the kind model check are `0..KIND_MODEL_USER_KEYS`.
pub const KIND_MODEL_USER_KEYS: u16 = 6;

/// The default of the kind checks' value state.
const KIND_DEFAULT: u64 = 0xDEFA;

const K_VALUE: &str = "k-value";
const K_LIST: &str = "k-list";
const K_MAP: &str = "k-map";
const K_REDUCING: &str = "k-reducing";
const K_AGGREGATING: &str = "k-aggregating";

/// The reduce function of the kind checks: not commutative, and `fold(0, v) != v`, so a first
/// value folded into something instead of stored as is shows, and so does a wrong order.
fn fold(a: &u64, b: &u64) -> u64 {
    a.wrapping_mul(31).wrapping_add(*b).wrapping_add(1)
}

/// The accumulator of [`CountMinMax`]: count, min, max.
type Acc = (u64, u32, u32);

/// The aggregate function of the kind checks: the count, min and max of `u32` inputs, read as a
/// string. Its accumulator does not start at `Default` (the min starts at `u32::MAX`), so an
/// accumulator not made by `create_accumulator` shows.
struct CountMinMax;

impl AggregateFunction<u32, Acc, String> for CountMinMax {
    fn create_accumulator(&self) -> Acc {
        (0, u32::MAX, 0)
    }

    fn add(&self, value: u32, acc: &mut Acc) {
        acc.0 += 1;
        acc.1 = acc.1.min(value);
        acc.2 = acc.2.max(value);
    }

    fn get_result(&self, acc: &Acc) -> String {
        format!("{} in {}..={}", acc.0, acc.1, acc.2)
    }

    fn merge(&self, a: Acc, b: Acc) -> Acc {
        (a.0 + b.0, a.1.min(b.1), a.2.max(b.2))
    }
}

/// What the model expects `get_result` to give for an accumulator.
fn expected_result(acc: &Acc) -> String {
    format!("{} in {}..={}", acc.0, acc.1, acc.2)
}

/// A sum, to register a `u64` accumulator under another kind.
struct SumU64;

impl AggregateFunction<u64, u64, u64> for SumU64 {
    fn create_accumulator(&self) -> u64 {
        0
    }

    fn add(&self, value: u64, acc: &mut u64) {
        *acc = acc.wrapping_add(value);
    }

    fn get_result(&self, acc: &u64) -> u64 {
        *acc
    }

    fn merge(&self, a: u64, b: u64) -> u64 {
        a.wrapping_add(b)
    }
}

/// The five states of the kind checks, one of each kind.
struct Kinds {
    value: ValueState<u64>,
    list: ListState<String>,
    map: MapState<u16, String>,
    reducing: ReducingState<u64>,
    aggregating: AggregatingState<u32, Acc, String>,
}

/// One step of the state-kind model check, on key `K::nth(k)` (the first field).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KindOp {
    /// `update` of the value state (which has a default).
    Update(u16, u64),
    /// `clear` of the value state.
    ClearValue(u16),
    /// `list_add`.
    ListAdd(u16, String),
    /// `list_add_all`, possibly of nothing.
    ListAddAll(u16, Vec<String>),
    /// `list_update`; an empty list clears.
    ListUpdate(u16, Vec<String>),
    /// `clear_raw` of the list state.
    ClearList(u16),
    /// `map_put` of a user key and value.
    MapPut(u16, u16, String),
    /// `map_remove` of a user key, present or not.
    MapRemove(u16, u16),
    /// `clear_raw` of the map state.
    ClearMap(u16),
    /// `reduce` of a value.
    Reduce(u16, u64),
    /// `clear_raw` of the reducing state.
    ClearReducing(u16),
    /// `aggregate` of an input.
    Aggregate(u16, u32),
    /// `clear_raw` of the aggregating state.
    ClearAggregating(u16),
    /// Takes a snapshot; it is written after the last operation.
    Snapshot,
}

impl KindOp {
    /// The key index the operation is on.
    fn key(&self) -> Option<u16> {
        use KindOp::*;
        match self {
            Update(k, _)
            | ClearValue(k)
            | ListAdd(k, _)
            | ListAddAll(k, _)
            | ListUpdate(k, _)
            | ClearList(k)
            | MapPut(k, _, _)
            | MapRemove(k, _)
            | ClearMap(k)
            | Reduce(k, _)
            | ClearReducing(k)
            | Aggregate(k, _)
            | ClearAggregating(k) => Some(*k),
            Snapshot => None,
        }
    }
}

/// The kind checks' model: per key, the value, the list, the map, the reduced value and the
/// accumulator, with Flink's semantics written out on plain collections.
#[derive(Clone, Debug)]
struct KindsModel<K> {
    values: HashMap<K, u64>,
    lists: HashMap<K, Vec<String>>,
    maps: HashMap<K, BTreeMap<u16, String>>,
    reduced: HashMap<K, u64>,
    accs: HashMap<K, Acc>,
}

impl<K: SuiteKey> KindsModel<K> {
    fn new() -> Self {
        KindsModel {
            values: HashMap::new(),
            lists: HashMap::new(),
            maps: HashMap::new(),
            reduced: HashMap::new(),
            accs: HashMap::new(),
        }
    }

    /// Every key with something in some state.
    fn keys(&self) -> HashSet<K> {
        let mut keys = HashSet::new();
        keys.extend(self.values.keys().cloned());
        keys.extend(self.lists.keys().cloned());
        keys.extend(self.maps.keys().cloned());
        keys.extend(self.reduced.keys().cloned());
        keys.extend(self.accs.keys().cloned());
        keys
    }

    /// The part of the model whose keys satisfy `own`.
    fn only(&self, own: impl Fn(&K) -> bool) -> Self {
        fn part<K: SuiteKey, V: Clone>(
            m: &HashMap<K, V>,
            own: &impl Fn(&K) -> bool,
        ) -> HashMap<K, V> {
            m.iter()
                .filter(|(k, _)| own(k))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect()
        }
        KindsModel {
            values: part(&self.values, &own),
            lists: part(&self.lists, &own),
            maps: part(&self.maps, &own),
            reduced: part(&self.reduced, &own),
            accs: part(&self.accs, &own),
        }
    }

    /// Applies `op` to `key`; returns what a `map_remove` removes.
    fn apply(&mut self, key: &K, op: &KindOp) -> Option<String> {
        let key = key.clone();
        match op {
            KindOp::Update(_, v) => {
                self.values.insert(key, *v);
            }
            KindOp::ClearValue(_) => {
                self.values.remove(&key);
            }
            KindOp::ListAdd(_, v) => self.lists.entry(key).or_default().push(v.clone()),
            KindOp::ListAddAll(_, vs) => {
                if !vs.is_empty() {
                    self.lists
                        .entry(key)
                        .or_default()
                        .extend(vs.iter().cloned());
                }
            }
            KindOp::ListUpdate(_, vs) => {
                if vs.is_empty() {
                    self.lists.remove(&key);
                } else {
                    self.lists.insert(key, vs.clone());
                }
            }
            KindOp::ClearList(_) => {
                self.lists.remove(&key);
            }
            KindOp::MapPut(_, uk, v) => {
                self.maps.entry(key).or_default().insert(*uk, v.clone());
            }
            KindOp::MapRemove(_, uk) => {
                let map = self.maps.get_mut(&key)?;
                let removed = map.remove(uk);
                if map.is_empty() {
                    self.maps.remove(&key);
                }
                return removed;
            }
            KindOp::ClearMap(_) => {
                self.maps.remove(&key);
            }
            KindOp::Reduce(_, v) => {
                let new = match self.reduced.get(&key) {
                    Some(old) => fold(old, v),
                    None => *v,
                };
                self.reduced.insert(key, new);
            }
            KindOp::ClearReducing(_) => {
                self.reduced.remove(&key);
            }
            KindOp::Aggregate(_, v) => {
                let acc = self.accs.entry(key).or_insert((0, u32::MAX, 0));
                acc.0 += 1;
                acc.1 = acc.1.min(*v);
                acc.2 = acc.2.max(*v);
            }
            KindOp::ClearAggregating(_) => {
                self.accs.remove(&key);
            }
            KindOp::Snapshot => {}
        }
        None
    }
}

impl<'c, K: SuiteKey, B: KeyedStateBackend<K>> Subject<'c, K, B> {
    /// The states of `key`.
    fn at<'s>(&'s mut self, key: &'s K) -> KeyedAccess<'s, K, B> {
        let g = self.kg(key);
        KeyedAccess::new(&mut self.b, key, g)
    }

    /// Registers the five states of the kind checks, the value state with its default.
    #[track_caller]
    fn kinds(&mut self) -> Kinds {
        let cx: &'c Cx = self.cx;
        let registered = |what: &str, r| cx.ok(&format!("registering {what}"), r);
        Kinds {
            value: registered(
                "a value state with a default",
                self.b
                    .value_state(&ValueStateDescriptor::new(K_VALUE).with_default(KIND_DEFAULT)),
            ),
            list: cx.ok(
                "registering a list state",
                self.b.list_state(&ListStateDescriptor::new(K_LIST)),
            ),
            map: cx.ok(
                "registering a map state",
                self.b.map_state(&MapStateDescriptor::new(K_MAP)),
            ),
            reducing: cx.ok(
                "registering a reducing state",
                self.b
                    .reducing_state(&ReducingStateDescriptor::new(K_REDUCING, fold)),
            ),
            aggregating: cx.ok(
                "registering an aggregating state",
                self.b.aggregating_state(&AggregatingStateDescriptor::new(
                    K_AGGREGATING,
                    CountMinMax,
                )),
            ),
        }
    }

    /// Applies `op` to the backend and the model; a `map_remove` must return what the model
    /// removes.
    #[track_caller]
    fn step(&mut self, k: &Kinds, model: &mut KindsModel<K>, op: &KindOp) {
        let Some(i) = op.key() else { return };
        let cx = self.cx;
        let key = K::nth(u64::from(i));
        let removed = model.apply(&key, op);
        let mut a = self.at(&key);
        match op {
            KindOp::Update(_, v) => a.update(k.value, *v),
            KindOp::ClearValue(_) => a.clear(k.value),
            KindOp::ListAdd(_, v) => a.list_add(k.list, v.clone()),
            KindOp::ListAddAll(_, vs) => a.list_add_all(k.list, vs.iter().cloned()),
            KindOp::ListUpdate(_, vs) => a.list_update(k.list, vs.clone()),
            KindOp::ClearList(_) => a.clear_raw(k.list.raw),
            KindOp::MapPut(_, uk, v) => a.map_put(k.map, *uk, v.clone()),
            KindOp::MapRemove(_, uk) => {
                let got = a.map_remove(k.map, uk);
                if got != removed {
                    cx.fail(format!(
                        "map_remove({uk}) of {key:?} returned {got:?}, expected {removed:?}"
                    ))
                }
            }
            KindOp::ClearMap(_) => a.clear_raw(k.map.raw),
            KindOp::Reduce(_, v) => a.reduce(&k.reducing, *v),
            KindOp::ClearReducing(_) => a.clear_raw(k.reducing.raw),
            KindOp::Aggregate(_, v) => a.aggregate(&k.aggregating, *v),
            KindOp::ClearAggregating(_) => a.clear_raw(k.aggregating.raw),
            KindOp::Snapshot => {}
        }
    }

    /// Reads every state of every key of `model` and of `also` through [`KeyedAccess`],
    /// expecting the model: the value (or the default), the list (empty when none), the map's
    /// entries in key order, the reduced value, the aggregate. An empty list or map must not be
    /// stored.
    #[track_caller]
    fn read_kinds(&mut self, rule: &str, k: &Kinds, model: &KindsModel<K>, also: &[K]) {
        let cx = self.cx;
        let mut keys = model.keys();
        keys.extend(also.iter().cloned());
        for key in &keys {
            let g = self.kg(key);
            let stored_list = self.b.value(k.list.raw, key, g).is_some();
            if stored_list != model.lists.contains_key(key) {
                cx.fail(format!(
                    "{rule}: '{K_LIST}' of {key:?} has a stored list: {stored_list}, expected \
                     {} (an empty list is no list)",
                    !stored_list
                ))
            }
            let stored_map = self.b.value(k.map.raw, key, g).is_some();
            if stored_map != model.maps.contains_key(key) {
                cx.fail(format!(
                    "{rule}: '{K_MAP}' of {key:?} has a stored map: {stored_map}, expected {} \
                     (a map goes with its last entry)",
                    !stored_map
                ))
            }
            let mut a = self.at(key);
            let check = |state: &str, got: &dyn Debug, want: &dyn Debug, same: bool| {
                if !same {
                    cx.fail(format!(
                        "{rule}: '{state}' of {key:?} reads {got:?}, expected {want:?}"
                    ))
                }
            };
            let value = a.value(k.value).copied();
            let want = Some(model.values.get(key).copied().unwrap_or(KIND_DEFAULT));
            check(K_VALUE, &value, &want, value == want);

            let list = a.list(k.list).to_vec();
            let list = &list[..];
            let want = model.lists.get(key).map_or(&[][..], Vec::as_slice);
            check(K_LIST, &list, &want, list == want);

            let entries: Vec<(u16, &String)> = a.map_entries(k.map).map(|(u, v)| (*u, v)).collect();
            let want: Vec<(u16, &String)> = model
                .maps
                .get(key)
                .into_iter()
                .flat_map(|m| m.iter().map(|(u, v)| (*u, v)))
                .collect();
            check(K_MAP, &entries, &want, entries == want);
            check(
                K_MAP,
                &a.map_is_empty(k.map),
                &want.is_empty(),
                a.map_is_empty(k.map) == want.is_empty(),
            );
            for (uk, v) in &want {
                let got = a.map_get(k.map, uk).cloned();
                let contains = a.map_contains(k.map, uk);
                check(
                    K_MAP,
                    &got.as_ref(),
                    &Some(v),
                    got.as_ref() == Some(*v) && contains,
                );
            }

            let reduced = a.reduced(&k.reducing).copied();
            let want = model.reduced.get(key).copied();
            check(K_REDUCING, &reduced, &want, reduced == want);

            let aggregated = a.aggregated(&k.aggregating);
            let want = model.accs.get(key).map(expected_result);
            check(K_AGGREGATING, &aggregated, &want, aggregated == want);
        }
    }
}

/// Checks that a written snapshot holds exactly the model, each state under its kind.
#[track_caller]
fn check_kinds_written<K: SuiteKey>(cx: &Cx, w: &Written, model: &KindsModel<K>, rule: &str) {
    let rule_for = |state: &str| format!("{rule} ('{state}')");
    cx.same_map(
        &rule_for(K_VALUE),
        &content_of::<K, u64>(cx, w, K_VALUE, StateKind::Value),
        &model.values,
    );
    cx.same_map(
        &rule_for(K_LIST),
        &content_of::<K, Vec<String>>(cx, w, K_LIST, StateKind::List),
        &model.lists,
    );
    cx.same_map(
        &rule_for(K_MAP),
        &content_of::<K, BTreeMap<u16, String>>(cx, w, K_MAP, StateKind::Map),
        &model.maps,
    );
    cx.same_map(
        &rule_for(K_REDUCING),
        &content_of::<K, u64>(cx, w, K_REDUCING, StateKind::Reducing),
        &model.reduced,
    );
    cx.same_map(
        &rule_for(K_AGGREGATING),
        &content_of::<K, Acc>(cx, w, K_AGGREGATING, StateKind::Aggregating),
        &model.accs,
    );
}

/// Whether `msg` has `word` as a word of its own (not inside an identifier or a path such as
/// `btree::map::BTreeMap`).
fn names_word(msg: &str, word: &str) -> bool {
    let boundary =
        |c: Option<char>| c.is_none_or(|c| !(c.is_alphanumeric() || c == '_' || c == ':'));
    msg.match_indices(word).any(|(i, _)| {
        boundary(msg[..i].chars().next_back()) && boundary(msg[i + word.len()..].chars().next())
    })
}

/// Like `expect_incompatible`, and the error must also name each of `kinds`.
#[track_caller]
fn expect_incompatible_kinds(
    cx: &Cx,
    op: &str,
    e: &StateError,
    name: &str,
    kinds: &[StateKind],
    types: &[&str],
) {
    expect_incompatible(cx, op, e, name, types);
    let msg = e.to_string();
    for kind in kinds {
        cx.must(names_word(&msg, kind.as_str()), || {
            format!("{op}: the error must name the kind `{kind}`: {msg}")
        });
    }
}

/// Each kind against Flink's semantics, edge cases included: a value state's default for a key
/// without a value and after `clear`; a list of a missing key is empty, adding nothing stores
/// nothing, `list_update(vec![])` clears; a map's entries come in key order, removing an absent
/// user key is a no-op, removing the last entry leaves no map; a reducing state stores its first
/// value as is and folds the next ones in order; an aggregating state has no result until
/// something is added, and starts from `create_accumulator`; `clear_raw` clears each kind. The
/// snapshot holds exactly the result, each state under its kind, and restores to it.
pub fn check_kind_semantics<K: SuiteKey, B: KeyedStateBackend<K>>(
    make: impl Fn(u32, KeyGroupRange) -> B,
) {
    let cx = Cx::new::<B>("state kind semantics");
    let mut b = fresh(&cx, &make, 128, full(128));
    let k = b.kinds();
    let plain = b.register::<u64>("no-default");
    let (one, two, never) = (K::nth(1), K::nth(2), K::nth(3));
    let mut model = KindsModel::<K>::new();

    // Value states.
    kind_semantics_values(&cx, &mut b, &k, plain, &one, &never, &mut model);

    // Lists.
    kind_semantics_lists(&cx, &mut b, &k, &one, &two, &never, &mut model);

    // Maps.
    kind_semantics_maps(&cx, &mut b, &k, &one, &two, &never, &mut model);

    // Reducing states.
    kind_semantics_reducing(&cx, &mut b, &k, &one, &two, &mut model);

    // Aggregating states.
    kind_semantics_aggregating(&cx, &mut b, &k, &one, &two, &mut model);

    let also = [one.clone(), two.clone(), never.clone()];
    b.read_kinds("after the operations", &k, &model, &also);
    let w = b.write();
    check_kinds_written(
        &cx,
        &w,
        &model,
        "the snapshot holds exactly what the operations left, each state under its kind",
    );
    cx.same_map(
        "the snapshot holds the value state without a default",
        &content::<K, u64>(&cx, &w, "no-default"),
        &HashMap::from([(one.clone(), 1)]),
    );
    let mut r = cx.ok("restoring", restored(&cx, &make, 128, full(128), &[&w]));
    let rk = r.kinds();
    r.read_kinds(
        "restored, every kind reads as before (the default from the descriptor registered)",
        &rk,
        &model,
        &also,
    );
}

/// [`check_kind_semantics`] of the value states, recording in `model` what they should hold.
fn kind_semantics_values<K: SuiteKey, B: KeyedStateBackend<K>>(
    cx: &Cx,
    b: &mut Subject<'_, K, B>,
    k: &Kinds,
    plain: ValueState<u64>,
    one: &K,
    never: &K,
    model: &mut KindsModel<K>,
) {
    let mut a = b.at(never);
    cx.eq(
        "a value state with a default reads the default for a key never written",
        &a.value(k.value).copied(),
        &Some(KIND_DEFAULT),
    );
    cx.eq(
        "a value state without a default reads nothing for a key never written",
        &a.value(plain).copied(),
        &None,
    );
    let mut a = b.at(one);
    a.update(k.value, 5);
    cx.eq(
        "update sets the value",
        &a.value(k.value).copied(),
        &Some(5),
    );
    a.clear(k.value);
    cx.eq(
        "a value state with a default reads the default after clear",
        &a.value(k.value).copied(),
        &Some(KIND_DEFAULT),
    );
    a.update(k.value, 9);
    a.update(plain, 1);
    model.values.insert(one.clone(), 9);
}

/// [`check_kind_semantics`] of the lists, recording in `model` what they should hold.
fn kind_semantics_lists<K: SuiteKey, B: KeyedStateBackend<K>>(
    cx: &Cx,
    b: &mut Subject<'_, K, B>,
    k: &Kinds,
    one: &K,
    two: &K,
    never: &K,
    model: &mut KindsModel<K>,
) {
    let mut a = b.at(never);
    cx.eq(
        "the list of a key never written is empty",
        &a.list(k.list).to_vec()[..],
        &[][..],
    );
    a.list_add_all(k.list, Vec::new());
    a.list_update(k.list, Vec::new());
    cx.eq(
        "adding nothing to a missing list, or updating it to nothing, stores no list",
        &b.b.value(k.list.raw, never, b.kg(never)).is_some(),
        &false,
    );
    let s = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let mut a = b.at(one);
    a.list_add(k.list, "x".into());
    a.list_add(k.list, "y".into());
    a.list_add_all(k.list, s(&["z", "x"]));
    cx.eq(
        "list_add and list_add_all append in order, duplicates kept",
        &a.list(k.list).to_vec()[..],
        &s(&["x", "y", "z", "x"])[..],
    );
    a.list_add_all(k.list, Vec::new());
    cx.eq(
        "list_add_all of nothing leaves the list",
        &a.list(k.list).count(),
        &4,
    );
    a.list_update(k.list, s(&["q", "ü"]));
    cx.eq(
        "list_update replaces the list",
        &a.list(k.list).to_vec()[..],
        &s(&["q", "ü"])[..],
    );
    a.list_update(k.list, Vec::new());
    cx.eq(
        "list_update(vec![]) clears the list",
        &a.list(k.list).to_vec()[..],
        &[][..],
    );
    cx.eq(
        "after list_update(vec![]) the key has no list",
        &b.b.value(k.list.raw, one, b.kg(one)).is_some(),
        &false,
    );
    let mut a = b.at(one);
    a.list_add(k.list, "r".into());
    cx.eq(
        "list_add after a clear starts a new list",
        &a.list(k.list).to_vec()[..],
        &s(&["r"])[..],
    );
    model.lists.insert(one.clone(), s(&["r"]));
    let mut a = b.at(two);
    a.list_add_all(k.list, s(&["c1", "c2"]));
    a.clear_raw(k.list.raw);
    cx.eq(
        "clear_raw clears a list",
        &a.list(k.list).to_vec()[..],
        &[][..],
    );
}

/// [`check_kind_semantics`] of the maps, recording in `model` what they should hold.
fn kind_semantics_maps<K: SuiteKey, B: KeyedStateBackend<K>>(
    cx: &Cx,
    b: &mut Subject<'_, K, B>,
    k: &Kinds,
    one: &K,
    two: &K,
    never: &K,
    model: &mut KindsModel<K>,
) {
    let mut a = b.at(never);
    cx.eq(
        "map_get on a key never written is None",
        &a.map_get(k.map, &1),
        &None,
    );
    cx.eq(
        "map_contains on a key never written is false",
        &a.map_contains(k.map, &1),
        &false,
    );
    cx.eq(
        "the map of a key never written is empty",
        &a.map_is_empty(k.map),
        &true,
    );
    cx.eq(
        "map_remove on a key never written removes nothing",
        &a.map_remove(k.map, &1),
        &None,
    );
    cx.eq(
        "map_remove on a key never written stores no map",
        &b.b.value(k.map.raw, never, b.kg(never)).is_some(),
        &false,
    );
    let mut a = b.at(one);
    a.map_put(k.map, 5, "five".into());
    a.map_put(k.map, 1, "one".into());
    a.map_put(k.map, 3, "three".into());
    a.map_put(k.map, 3, "THREE".into());
    let entries = |a: &mut KeyedAccess<'_, K, B>| {
        a.map_entries(k.map)
            .map(|(u, v)| (*u, v.clone()))
            .collect::<Vec<_>>()
    };
    cx.eq(
        "map_put inserts and overwrites; map_entries come in user-key order",
        &entries(&mut a),
        &vec![(1, "one".into()), (3, "THREE".into()), (5, "five".into())],
    );
    cx.eq(
        "map_get reads an entry",
        &a.map_get(k.map, &3).cloned(),
        &Some("THREE".into()),
    );
    cx.eq(
        "map_contains of an absent user key is false",
        &a.map_contains(k.map, &2),
        &false,
    );
    cx.eq(
        "map_remove of an absent user key removes nothing",
        &a.map_remove(k.map, &2),
        &None,
    );
    cx.eq(
        "map_remove returns the removed value",
        &a.map_remove(k.map, &1),
        &Some("one".into()),
    );
    a.map_remove(k.map, &5);
    cx.eq(
        "map_remove removes only its entry",
        &entries(&mut a),
        &vec![(3, "THREE".into())],
    );
    cx.eq(
        "map_remove of the last entry returns it",
        &a.map_remove(k.map, &3),
        &Some("THREE".into()),
    );
    cx.eq(
        "after removing the last entry the map is empty",
        &a.map_is_empty(k.map),
        &true,
    );
    cx.eq(
        "after removing the last entry the key has no map",
        &b.b.value(k.map.raw, one, b.kg(one)).is_some(),
        &false,
    );
    let mut a = b.at(one);
    a.map_put(k.map, 4, "four".into());
    a.clear_raw(k.map.raw);
    cx.eq("clear_raw clears a map", &a.map_is_empty(k.map), &true);
    let mut a = b.at(two);
    a.map_put(k.map, 7, "seven".into());
    a.map_put(k.map, 2, "two".into());
    model.maps.insert(
        two.clone(),
        BTreeMap::from([(2, "two".into()), (7, "seven".into())]),
    );
}

/// [`check_kind_semantics`] of the reducing states, recording in `model` what they should hold.
fn kind_semantics_reducing<K: SuiteKey, B: KeyedStateBackend<K>>(
    cx: &Cx,
    b: &mut Subject<'_, K, B>,
    k: &Kinds,
    one: &K,
    two: &K,
    model: &mut KindsModel<K>,
) {
    let mut a = b.at(one);
    cx.eq(
        "a reducing state of a key never written has no value",
        &a.reduced(&k.reducing),
        &None,
    );
    a.reduce(&k.reducing, 10);
    cx.eq(
        "the first value reduced is stored as is",
        &a.reduced(&k.reducing).copied(),
        &Some(10),
    );
    a.reduce(&k.reducing, 20);
    a.reduce(&k.reducing, 3);
    let folded = fold(&fold(&10, &20), &3);
    cx.eq(
        "later values are folded in with the reduce function, in order",
        &a.reduced(&k.reducing).copied(),
        &Some(folded),
    );
    model.reduced.insert(one.clone(), folded);
    let mut a = b.at(two);
    a.reduce(&k.reducing, 7);
    a.clear_raw(k.reducing.raw);
    cx.eq(
        "clear_raw clears a reducing state",
        &a.reduced(&k.reducing),
        &None,
    );
    a.reduce(&k.reducing, 8);
    cx.eq(
        "after a clear, the first value reduced is stored as is",
        &a.reduced(&k.reducing).copied(),
        &Some(8),
    );
    model.reduced.insert(two.clone(), 8);
}

/// [`check_kind_semantics`] of the aggregating states, recording in `model` what they should hold.
fn kind_semantics_aggregating<K: SuiteKey, B: KeyedStateBackend<K>>(
    cx: &Cx,
    b: &mut Subject<'_, K, B>,
    k: &Kinds,
    one: &K,
    two: &K,
    model: &mut KindsModel<K>,
) {
    let mut a = b.at(one);
    cx.eq(
        "aggregated() is None until something is added",
        &a.aggregated(&k.aggregating),
        &None,
    );
    a.aggregate(&k.aggregating, 5);
    cx.eq(
        "the first input is added to create_accumulator()",
        &a.aggregated(&k.aggregating),
        &Some(expected_result(&(1, 5, 5))),
    );
    a.aggregate(&k.aggregating, 2);
    a.aggregate(&k.aggregating, 9);
    cx.eq(
        "inputs are added to the accumulator",
        &a.aggregated(&k.aggregating),
        &Some(expected_result(&(3, 2, 9))),
    );
    model.accs.insert(one.clone(), (3, 2, 9));
    let mut a = b.at(two);
    a.aggregate(&k.aggregating, 4);
    a.clear_raw(k.aggregating.raw);
    cx.eq(
        "after clear_raw, aggregated() is None",
        &a.aggregated(&k.aggregating),
        &None,
    );
}

/// Registering each kind twice with the same name and types returns the same handle; another
/// kind under a registered name, even with the same per-key value type, or another element
/// type, is [`StateError::Incompatible`] naming the state and both kinds or types; the
/// registered states still work after a refusal.
pub fn check_kind_registration<K: SuiteKey, B: KeyedStateBackend<K>>(
    make: impl Fn(u32, KeyGroupRange) -> B,
) {
    let cx = Cx::new::<B>("state kind registration");
    let mut b = fresh(&cx, &make, 8, full(8));
    let k = b.kinds();
    let again = b.kinds();
    let ids = [
        k.value.id,
        k.list.raw.id,
        k.map.raw.id,
        k.reducing.raw.id,
        k.aggregating.raw.id,
    ];
    cx.eq(
        "registering each kind again with the same name and types returns the same handle",
        &[
            again.value.id,
            again.list.raw.id,
            again.map.raw.id,
            again.reducing.raw.id,
            again.aggregating.raw.id,
        ],
        &ids,
    );
    cx.eq(
        "five states get five handles",
        &ids.iter().collect::<HashSet<_>>().len(),
        &5,
    );
    refuse_other_kinds(&cx, &mut b, "registered");
    let key = K::nth(1);
    let mut model = KindsModel::new();
    for op in [
        KindOp::Update(1, 3),
        KindOp::ListAdd(1, "l".into()),
        KindOp::MapPut(1, 2, "m".into()),
        KindOp::Reduce(1, 4),
        KindOp::Aggregate(1, 5),
    ] {
        b.step(&k, &mut model, &op);
    }
    b.read_kinds(
        "the registered states work after refused registrations",
        &k,
        &model,
        &[key],
    );
}

/// Registrations of the kind checks' states under another kind or element type, each of which
/// must be refused; `when` says whether the states are registered or restored.
fn refuse_other_kinds<K: SuiteKey, B: KeyedStateBackend<K>>(
    cx: &Cx,
    b: &mut Subject<'_, K, B>,
    when: &str,
) {
    use StateKind::{Aggregating, List, Map, Reducing, Value};
    let list_type = type_name::<Vec<String>>();
    let map_type = type_name::<BTreeMap<u16, String>>();

    let op = format!("a {when} list state registered as a map state");
    let e = cx.err(&format!("{op} must fail"), || {
        b.b.map_state(&MapStateDescriptor::<u16, String>::new(K_LIST))
    });
    expect_incompatible_kinds(cx, &op, &e, K_LIST, &[List, Map], &[list_type, map_type]);

    let op = format!("a {when} list state registered as a value state of the same `Vec`");
    let e = cx.err(&format!("{op} must fail"), || {
        b.b.value_state(&ValueStateDescriptor::<Vec<String>>::new(K_LIST))
    });
    expect_incompatible_kinds(cx, &op, &e, K_LIST, &[List, Value], &[]);

    let op = format!("a {when} list of `String` registered as a list of `u32`");
    let e = cx.err(&format!("{op} must fail"), || {
        b.b.list_state(&ListStateDescriptor::<u32>::new(K_LIST))
    });
    expect_incompatible(cx, &op, &e, K_LIST, &[list_type, type_name::<Vec<u32>>()]);

    let op = format!("a {when} map of `u16` to `String` registered as a map of `u16` to `u64`");
    let e = cx.err(&format!("{op} must fail"), || {
        b.b.map_state(&MapStateDescriptor::<u16, u64>::new(K_MAP))
    });
    expect_incompatible(
        cx,
        &op,
        &e,
        K_MAP,
        &[map_type, type_name::<BTreeMap<u16, u64>>()],
    );

    let op = format!("a {when} map state registered as a list state");
    let e = cx.err(&format!("{op} must fail"), || {
        b.b.list_state(&ListStateDescriptor::<(u16, String)>::new(K_MAP))
    });
    expect_incompatible_kinds(cx, &op, &e, K_MAP, &[Map, List], &[]);

    let op = format!("a {when} value state of `u64` registered as a reducing state of `u64`");
    let e = cx.err(&format!("{op} must fail"), || {
        b.b.reducing_state(&ReducingStateDescriptor::<u64>::new(K_VALUE, fold))
    });
    expect_incompatible_kinds(cx, &op, &e, K_VALUE, &[Value, Reducing], &[]);

    let op = format!("a {when} reducing state of `u64` registered as a value state of `u64`");
    let e = cx.err(&format!("{op} must fail"), || {
        b.b.value_state(&ValueStateDescriptor::<u64>::new(K_REDUCING))
    });
    expect_incompatible_kinds(cx, &op, &e, K_REDUCING, &[Reducing, Value], &[]);

    let op = format!("a {when} reducing state of `u64` registered as an aggregating state");
    let e = cx.err(&format!("{op} must fail"), || {
        b.b.aggregating_state(&AggregatingStateDescriptor::new(K_REDUCING, SumU64))
    });
    expect_incompatible_kinds(cx, &op, &e, K_REDUCING, &[Reducing, Aggregating], &[]);

    let op =
        format!("a {when} aggregating state registered as a reducing state of its accumulator");
    let e = cx.err(&format!("{op} must fail"), || {
        b.b.reducing_state(&ReducingStateDescriptor::<Acc>::new(
            K_AGGREGATING,
            |a, _| *a,
        ))
    });
    expect_incompatible_kinds(cx, &op, &e, K_AGGREGATING, &[Aggregating, Reducing], &[]);

    let op = format!("a {when} aggregating state registered with another accumulator type");
    let e = cx.err(&format!("{op} must fail"), || {
        b.b.aggregating_state(&AggregatingStateDescriptor::new(K_AGGREGATING, SumU64))
    });
    expect_incompatible(
        cx,
        &op,
        &e,
        K_AGGREGATING,
        &[type_name::<Acc>(), type_name::<u64>()],
    );
}

/// After a restore, registering a state under another kind than the snapshot's (a list as a map
/// or a value, a value as a reducing state, ...) or with another element type is
/// [`StateError::Incompatible`] naming the state and both kinds or types, never a panic; the
/// right registrations then restore every kind.
pub fn check_kind_mismatch_after_restore<K: SuiteKey, B: KeyedStateBackend<K>>(
    make: impl Fn(u32, KeyGroupRange) -> B,
) {
    let cx = Cx::new::<B>("state kind mismatch after restore");
    let mut b = fresh(&cx, &make, 8, full(8));
    let k = b.kinds();
    let mut model = KindsModel::new();
    for i in 0..4 {
        for op in [
            KindOp::Update(i, u64::from(i)),
            KindOp::ListAdd(i, format!("l{i}")),
            KindOp::MapPut(i, i, format!("m{i}")),
            KindOp::Reduce(i, u64::from(i)),
            KindOp::Aggregate(i, u32::from(i)),
        ] {
            b.step(&k, &mut model, &op);
        }
    }
    let w = b.write();
    let mut r = cx.ok("restoring", restored(&cx, &make, 8, full(8), &[&w]));
    refuse_other_kinds(&cx, &mut r, "restored");
    let rk = r.kinds();
    r.read_kinds(
        "after refused registrations, the right ones restore every kind",
        &rk,
        &model,
        &[],
    );
}

/// A snapshot holds a list and a map state as they were at `snapshot()`: appends, in-place
/// changes of a key's list or map, replacements, removals of entries and of whole lists and maps
/// after it are absent from what it writes, even while it is written on another thread. The live
/// backend has the new content.
pub fn check_kind_snapshot_isolation<K: SuiteKey, B: KeyedStateBackend<K>>(
    make: impl Fn(u32, KeyGroupRange) -> B,
) {
    let cx = Cx::new::<B>("list and map snapshot isolation");
    let max_p = 16;
    let mut b = fresh(&cx, &make, max_p, full(max_p));
    let k = b.kinds();
    let mut model = KindsModel::new();
    for i in 0..40u16 {
        for j in 0..3u16 {
            b.step(&k, &mut model, &KindOp::ListAdd(i, format!("{i}.{j}")));
            b.step(&k, &mut model, &KindOp::MapPut(i, j, format!("{i}:{j}")));
        }
    }
    let before = model.clone();
    let snapshot = cx.ok("snapshot", b.b.snapshot());
    let writer = std::thread::spawn(move || {
        let mut bytes = Vec::new();
        snapshot.write_to(&mut bytes).map(|layout| (layout, bytes))
    });
    for i in 0..40u16 {
        let ops = match i / 8 {
            // In place: the same list and map grow and change.
            0 => vec![
                KindOp::ListAdd(i, "later".into()),
                KindOp::ListAddAll(i, vec!["a".into(), "b".into()]),
                KindOp::MapPut(i, 0, "changed".into()),
                KindOp::MapPut(i, 9, "new".into()),
            ],
            // Emptied: the list updated to nothing, the map's entries all removed.
            1 => vec![
                KindOp::ListUpdate(i, Vec::new()),
                KindOp::MapRemove(i, 0),
                KindOp::MapRemove(i, 1),
                KindOp::MapRemove(i, 2),
            ],
            // Replaced.
            2 => vec![
                KindOp::ListUpdate(i, vec!["replaced".into()]),
                KindOp::MapRemove(i, 1),
            ],
            // Cleared.
            3 => vec![KindOp::ClearList(i), KindOp::ClearMap(i)],
            _ => Vec::new(),
        };
        for op in ops {
            b.step(&k, &mut model, &op);
        }
    }
    b.step(&k, &mut model, &KindOp::ListAdd(1000, "late".into()));
    b.step(&k, &mut model, &KindOp::MapPut(1000, 1, "late".into()));
    let (layout, bytes) = match writer.join() {
        Ok(r) => cx.ok("writing the snapshot on another thread", r),
        Err(p) => cx.fail(format!(
            "writing the snapshot on another thread panicked: {}",
            panic_message(p.as_ref())
        )),
    };
    let w = check_written::<K>(&cx, layout, bytes, max_p, full(max_p));
    check_kinds_written(
        &cx,
        &w,
        &before,
        "the snapshot holds the lists and maps as they were at snapshot(), not the later changes",
    );
    let mut r = cx.ok(
        "restoring the snapshot",
        restored(&cx, &make, max_p, full(max_p), &[&w]),
    );
    let rk = r.kinds();
    let late = [K::nth(1000)];
    r.read_kinds(
        "a restored snapshot holds the lists and maps at snapshot()",
        &rk,
        &before,
        &late,
    );
    b.read_kinds(
        "the live backend has the changes made after snapshot()",
        &k,
        &model,
        &late,
    );
}

/// All five kinds at once, through snapshot and restore, whole and rescaled 1 → 2 → 3 → 1: every
/// key's value, list, map, reduced value and aggregate comes back in the backend owning its key
/// group, and nowhere else; restored states carry their kind into the next snapshot even before
/// they are registered; merging gives back the original bytes.
pub fn check_kinds_round_trip<K: SuiteKey, B: KeyedStateBackend<K>>(
    make: impl Fn(u32, KeyGroupRange) -> B,
) {
    let cx = Cx::new::<B>("state kinds round trip and rescale 1 → 2 → 3 → 1");
    let max_p = 64;
    let mut one = fresh(&cx, &make, max_p, full(max_p));
    let k = one.kinds();
    let mut model = KindsModel::new();
    let n = 240u16;
    for i in 0..n {
        let mut ops = Vec::new();
        if i % 3 != 0 {
            ops.push(KindOp::Update(i, u64::from(i) * 7));
        }
        // `i % 5 == 0`: adding nothing, so no list.
        ops.push(KindOp::ListAddAll(
            i,
            (0..i % 5).map(|j| format!("{i}-{j}-ß")).collect(),
        ));
        for j in 0..i % 6 {
            ops.push(KindOp::MapPut(i, j * 3, format!("m{i}.{j}")));
        }
        if i % 5 != 1 {
            ops.push(KindOp::Reduce(i, u64::from(i)));
            ops.push(KindOp::Reduce(i, 1000 - u64::from(i)));
        }
        if i % 7 != 2 {
            for j in 0..1 + u32::from(i % 3) {
                ops.push(KindOp::Aggregate(i, (u32::from(i) * 13 + j) % 97));
            }
        }
        if i % 11 == 0 {
            ops.push(KindOp::ClearList(i));
            ops.push(KindOp::MapRemove(i, 0));
        }
        for op in ops {
            one.step(&k, &mut model, &op);
        }
    }
    let all: Vec<K> = (0..u64::from(n)).map(K::nth).collect();
    let original = one.write();
    check_kinds_written(
        &cx,
        &original,
        &model,
        "the snapshot holds every kind of every key",
    );

    let mut whole = cx.ok(
        "restoring the snapshot whole",
        restored(&cx, &make, max_p, full(max_p), &[&original]),
    );
    let carried = whole.write();
    check_kinds_written(
        &cx,
        &carried,
        &model,
        "restored states not registered yet keep their kind and content in the next snapshot",
    );
    let wk = whole.kinds();
    whole.read_kinds("restored whole, every kind reads back", &wk, &model, &all);
    cx.eq(
        "restored and registered in the same order, the snapshot has the original bytes",
        &whole.write().bytes,
        &original.bytes,
    );

    let mut from = vec![original];
    for parallelism in [2, 3] {
        let sources: Vec<&Written> = from.iter().collect();
        let mut parts = Vec::new();
        for p in 0..parallelism {
            let range = compute_key_group_range_for_operator_index(max_p, parallelism, p);
            let mut part = cx.ok(
                &format!("restoring key groups {range} of {parallelism}"),
                restored(&cx, &make, max_p, range, &sources),
            );
            let pk = part.kinds();
            let own = |key: &K| range.contains(assign_to_key_group(key, max_p));
            let own_model = model.only(own);
            let own_keys: Vec<K> = all.iter().filter(|key| own(key)).cloned().collect();
            part.read_kinds(
                &format!(
                    "rescaled to {parallelism}, the backend of key groups {range} reads each key \
                     of its key groups"
                ),
                &pk,
                &own_model,
                &own_keys,
            );
            let w = part.write();
            check_kinds_written(
                &cx,
                &w,
                &own_model,
                &format!(
                    "rescaled to {parallelism}, the backend of key groups {range} holds the keys \
                     of its key groups only"
                ),
            );
            parts.push(w);
        }
        from = parts;
    }
    let sources: Vec<&Written> = from.iter().collect();
    let mut merged = cx.ok(
        "merging the 3 parts",
        restored(&cx, &make, max_p, full(max_p), &sources),
    );
    let mk = merged.kinds();
    merged.read_kinds(
        "merging the parts back gives every kind of every key",
        &mk,
        &model,
        &all,
    );
    let w = merged.write();
    check_kinds_written(
        &cx,
        &w,
        &model,
        "merging the parts back gives the original state",
    );
    cx.eq(
        "merging the parts back gives the original bytes",
        &w.bytes,
        &whole.write().bytes,
    );
}

/// Runs `ops` against a fresh backend of the whole range of `max_parallelism` holding one state
/// of each kind and a model. The live backend must agree with the model, and every snapshot
/// (one per [`KindOp::Snapshot`], and one at the end) must hold the model as it was then,
/// restored whole and split across `parallelism` backends (clamped to `1..=max_parallelism`).
pub fn check_kinds_against_model<K: SuiteKey, B: KeyedStateBackend<K>>(
    make: impl Fn(u32, KeyGroupRange) -> B,
    max_parallelism: u32,
    parallelism: u32,
    ops: &[KindOp],
) {
    let cx = Cx::new::<B>(format!(
        "kinds model (max parallelism {max_parallelism}, parallelism {parallelism}, {} ops)",
        ops.len()
    ));
    kinds_model_case(&cx, &make, max_parallelism, parallelism, ops);
}

/// Runs `cases` random kind model checks from `seed`: max parallelism 1, 7 or 128, parallelism 1
/// to 4, up to 300 operations of every kind over [`KIND_MODEL_KEYS`] keys. A failure names the
/// seed and case.
pub fn check_random_kind_models<K: SuiteKey, B: KeyedStateBackend<K>>(
    make: impl Fn(u32, KeyGroupRange) -> B,
    seed: u64,
    cases: u32,
) {
    const WORDS: [&str; 6] = ["", "a", "ß", "слово", "🦀", "x y"];
    let mut rng = SplitMix64(seed);
    for case in 0..cases {
        let max_p = [1, 7, 128][rng.below(3) as usize];
        let parallelism = (1 + rng.below(4) as u32).min(max_p);
        let len = rng.below(300) as usize;
        let word = |rng: &mut SplitMix64| {
            format!(
                "{}{}",
                WORDS[rng.below(WORDS.len() as u64) as usize],
                rng.below(50)
            )
        };
        let ops: Vec<KindOp> = (0..len)
            .map(|_| {
                let key = rng.below(u64::from(KIND_MODEL_KEYS)) as u16;
                let user_key = rng.below(u64::from(KIND_MODEL_USER_KEYS)) as u16;
                match rng.below(20) {
                    0 => KindOp::Update(key, rng.next_u64()),
                    1 => KindOp::ClearValue(key),
                    2 | 3 => KindOp::ListAdd(key, word(&mut rng)),
                    4 => {
                        let n = rng.below(4);
                        KindOp::ListAddAll(key, (0..n).map(|_| word(&mut rng)).collect())
                    }
                    5 => {
                        let n = rng.below(3);
                        KindOp::ListUpdate(key, (0..n).map(|_| word(&mut rng)).collect())
                    }
                    6 => KindOp::ClearList(key),
                    7 | 8 => KindOp::MapPut(key, user_key, word(&mut rng)),
                    9 | 10 => KindOp::MapRemove(key, user_key),
                    11 => KindOp::ClearMap(key),
                    12 | 13 => KindOp::Reduce(key, rng.next_u64() >> rng.below(64)),
                    14 => KindOp::ClearReducing(key),
                    15 | 16 => KindOp::Aggregate(key, rng.next_u64() as u32),
                    17 => KindOp::ClearAggregating(key),
                    18 if rng.below(2) == 0 => KindOp::Snapshot,
                    _ => KindOp::MapPut(key, user_key, word(&mut rng)),
                }
            })
            .collect();
        let cx = Cx::new::<B>(format!(
            "kinds model (seed {seed:#x}, case {case}: max parallelism {max_p}, parallelism \
             {parallelism}, {len} ops)"
        ));
        kinds_model_case(&cx, &make, max_p, parallelism, &ops);
    }
}

fn kinds_model_case<K: SuiteKey, B: KeyedStateBackend<K>>(
    cx: &Cx,
    make: &impl Fn(u32, KeyGroupRange) -> B,
    max_p: u32,
    parallelism: u32,
    ops: &[KindOp],
) {
    let parallelism = parallelism.clamp(1, max_p);
    let mut b = fresh(cx, make, max_p, full(max_p));
    let k = b.kinds();
    let mut model = KindsModel::new();
    let mut touched: Vec<K> = Vec::new();
    let mut seen = HashSet::new();
    let mut pending = Vec::new();
    for op in ops {
        match op.key() {
            None => pending.push((cx.ok("snapshot", b.b.snapshot()), model.clone())),
            Some(i) => {
                if seen.insert(i) {
                    touched.push(K::nth(u64::from(i)));
                }
                b.step(&k, &mut model, op);
            }
        }
    }
    b.read_kinds(
        "the live backend agrees with the model",
        &k,
        &model,
        &touched,
    );
    pending.push((cx.ok("snapshot", b.b.snapshot()), model));

    for (i, (snapshot, model)) in pending.into_iter().enumerate() {
        let w = finish::<K>(cx, snapshot, max_p, full(max_p));
        check_kinds_written(
            cx,
            &w,
            &model,
            &format!("snapshot {i} holds the model as it was at its snapshot()"),
        );
        let mut whole = cx.ok(
            "restoring the whole snapshot",
            restored(cx, make, max_p, full(max_p), &[&w]),
        );
        let wk = whole.kinds();
        whole.read_kinds(
            &format!("snapshot {i}, restored whole, reads back as the model"),
            &wk,
            &model,
            &touched,
        );
        for p in 0..parallelism {
            let range = compute_key_group_range_for_operator_index(max_p, parallelism, p);
            let mut part = cx.ok(
                &format!("restoring key groups {range}"),
                restored(cx, make, max_p, range, &[&w]),
            );
            let pk = part.kinds();
            let own = |key: &K| range.contains(assign_to_key_group(key, max_p));
            let own_model = model.only(own);
            let own_keys: Vec<K> = touched.iter().filter(|key| own(key)).cloned().collect();
            part.read_kinds(
                &format!(
                    "snapshot {i}, restored into key groups {range} of {parallelism}, reads back \
                     as the model"
                ),
                &pk,
                &own_model,
                &own_keys,
            );
            let pw = part.write();
            check_kinds_written(
                cx,
                &pw,
                &own_model,
                &format!(
                    "snapshot {i}, restored into key groups {range}, holds only its key groups"
                ),
            );
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Helpers.

/// The check being run and the backend it runs on, for failure messages.
struct Cx {
    check: String,
    backend: &'static str,
}

impl Cx {
    fn new<B>(check: impl Into<String>) -> Cx {
        Cx {
            check: check.into(),
            backend: type_name::<B>(),
        }
    }

    #[track_caller]
    fn fail(&self, msg: impl Display) -> ! {
        panic!(
            "keyed-state conformance [{}] on {}: {msg}",
            self.check, self.backend
        )
    }

    #[track_caller]
    fn must(&self, cond: bool, msg: impl FnOnce() -> String) {
        if !cond {
            self.fail(msg())
        }
    }

    #[track_caller]
    fn eq<T: PartialEq + Debug + ?Sized>(&self, rule: &str, actual: &T, expected: &T) {
        if actual != expected {
            self.fail(format!("{rule}: got {actual:?}, expected {expected:?}"))
        }
    }

    #[track_caller]
    fn ok<T, E: Display>(&self, op: &str, r: Result<T, E>) -> T {
        match r {
            Ok(v) => v,
            Err(e) => self.fail(format!("{op} failed unexpectedly: {e}")),
        }
    }

    /// Runs `f`, which must return an error, and never panic.
    #[track_caller]
    fn err<T>(&self, rule: &str, f: impl FnOnce() -> Result<T, StateError>) -> StateError {
        match self.no_panic(rule, f) {
            Ok(_) => self.fail(format!("{rule}, but it succeeded")),
            Err(e) => e,
        }
    }

    /// Runs `f`, turning a panic into a failure of the rule that errors must not panic.
    #[track_caller]
    fn no_panic<T>(&self, op: &str, f: impl FnOnce() -> T) -> T {
        match catch_unwind(AssertUnwindSafe(f)) {
            Ok(v) => v,
            Err(p) => self.fail(format!(
                "{op} panicked ({}); bad input must be an error, never a panic",
                panic_message(p.as_ref())
            )),
        }
    }

    /// Compares two maps, naming a few of the keys that differ.
    #[track_caller]
    fn same_map<K: Debug + Eq + std::hash::Hash, V: Debug + PartialEq>(
        &self,
        rule: &str,
        actual: &HashMap<K, V>,
        expected: &HashMap<K, V>,
    ) {
        if actual == expected {
            return;
        }
        let mut diffs: Vec<String> = Vec::new();
        for (k, v) in expected {
            match actual.get(k) {
                None => diffs.push(format!("{k:?} is missing (expected {v:?})")),
                Some(a) if a != v => diffs.push(format!("{k:?} is {a:?}, expected {v:?}")),
                Some(_) => {}
            }
        }
        for (k, v) in actual {
            if !expected.contains_key(k) {
                diffs.push(format!("{k:?} = {v:?} should not be there"));
            }
        }
        let more = diffs.len().saturating_sub(5);
        diffs.truncate(5);
        self.fail(format!(
            "{rule}: {} entries, expected {}; {}{}",
            actual.len(),
            expected.len(),
            diffs.join("; "),
            if more > 0 {
                format!("; and {more} more")
            } else {
                String::new()
            }
        ))
    }
}

use weir_core::panic::panic_message;

fn expect_incompatible(cx: &Cx, op: &str, e: &StateError, name: &str, types: &[&str]) {
    match e {
        StateError::Incompatible { name: n, .. } if n == name => {}
        other => cx.fail(format!(
            "{op}: expected StateError::Incompatible naming '{name}', got {other:?}"
        )),
    }
    let msg = e.to_string();
    for t in types {
        cx.must(msg.contains(t), || {
            format!("{op}: the error must name the type `{t}`: {msg}")
        });
    }
}

/// The suite's deterministic generator.
use weir_core::splitmix::SplitMix as SplitMix64;

/// How many random cases [`run_incremental_checks`] runs per key type.
pub const INCREMENTAL_CASES: u32 = 9;

/// Runs the incremental checks. `make` must return a fresh, empty backend in incremental mode
/// whose chains may hold at least 4 snapshots.
pub fn run_incremental_checks<K: SuiteKey, B: KeyedStateBackend<K>>(
    make: impl Fn(u32, KeyGroupRange) -> B,
) {
    check_incremental_model(&make, MODEL_SEED, INCREMENTAL_CASES);
    check_incremental_restore_rules(&make);
}

/// Random changes over a run of checkpoints, each confirmed, aborted or left pending at random,
/// with savepoints between:
/// - every incremental snapshot is a delta on the latest confirmed checkpoint (none after
///   [`KeyedStateBackend::start_new_chain`]), or a full one;
/// - a delta holds every key whose value differs from the base's, with its current value (a
///   removed key as a tombstone), and no key untouched since the base's snapshot;
/// - a savepoint ([`KeyedStateBackend::snapshot`]) is self-contained and holds the whole state;
/// - every chain, restored whole and split over two backends, reads back the state of its
///   moment, and a full snapshot of the restored backend holds exactly that state.
pub fn check_incremental_model<K: SuiteKey, B: KeyedStateBackend<K>>(
    make: &impl Fn(u32, KeyGroupRange) -> B,
    seed: u64,
    cases: u32,
) {
    let cx = Cx::new::<B>("incremental_model");
    let mut rng = SplitMix64(seed ^ 0x696e_6372);
    for case in 0..cases {
        let max_p = [4u32, 16, 128][case as usize % 3];
        let mut b = fresh(&cx, make, max_p, full(max_p));
        let count = b.register::<u64>("count");
        let mut late: Option<ValueState<String>> = None;
        let mut counts: HashMap<K, u64> = HashMap::new();
        let mut names: HashMap<K, String> = HashMap::new();
        let mut store: Vec<Written> = Vec::new();
        let mut chains: BTreeMap<u64, Vec<usize>> = BTreeMap::new();
        let mut confirmed: Option<u64> = None;
        let mut pending: Vec<u64> = Vec::new();
        let mut touched_since: BTreeMap<u64, HashSet<K>> = BTreeMap::new();
        let mut counts_at: BTreeMap<u64, HashMap<K, u64>> = BTreeMap::new();
        for id in 1..=12u64 {
            incremental_model_changes(
                &mut b,
                &mut rng,
                count,
                late,
                &mut counts,
                &mut names,
                &mut touched_since,
            );
            if id == 4 {
                late = Some(b.register::<String>("late"));
            }
            if rng.below(4) == 0 {
                let snapshot = cx.ok("snapshot (a savepoint)", b.b.snapshot());
                cx.eq(
                    "a savepoint taken in incremental mode is self-contained",
                    &snapshot.scope(),
                    &SnapshotScope::SelfContained,
                );
                let w = finish::<K>(&cx, snapshot, max_p, full(max_p));
                cx.eq(
                    "a savepoint holds the whole state",
                    &content::<K, u64>(&cx, &w, "count"),
                    &counts,
                );
            }
            let snapshot = cx.ok("snapshot_incremental", b.b.snapshot_incremental(id));
            let base = match snapshot.scope() {
                SnapshotScope::Incremental { base } => base,
                SnapshotScope::SelfContained => cx.fail(format!(
                    "snapshot_incremental({id}) of a backend in incremental mode is \
                     self-contained"
                )),
            };
            let w = finish::<K>(&cx, snapshot, max_p, full(max_p));
            let header = header_of(&cx, &w);
            cx.eq(
                "a delta's header says it is one",
                &header.delta,
                &base.is_some(),
            );
            let mut chain = Vec::new();
            if let Some(base) = base {
                cx.eq(
                    &format!("checkpoint {id}'s delta is on the latest confirmed checkpoint"),
                    &Some(base),
                    &confirmed,
                );
                check_delta_content(&cx, &w, id, base, &counts, &touched_since, &counts_at);
                chain = chains[&base].clone();
            }
            store.push(w);
            chain.push(store.len() - 1);
            let links: Vec<&Written> = chain.iter().map(|&i| &store[i]).collect();
            verify_chain(&cx, make, max_p, &links, &counts, late.map(|_| &names));
            chains.insert(id, chain);
            touched_since.insert(id, HashSet::new());
            counts_at.insert(id, counts.clone());
            // Confirm this checkpoint or an earlier one still pending (so that snapshots taken
            // after it hold changes its confirmation must not drop), abort it, or leave it.
            pending.push(id);
            pending.retain(|&p| confirmed.is_none_or(|c| p > c));
            match rng.below(5) {
                0 => {
                    b.b.notify_checkpoint_aborted(id);
                    pending.retain(|&p| p != id);
                }
                1 => {}
                2 if rng.below(3) == 0 => {
                    // The base's files are gone: the next snapshot is full.
                    b.b.start_new_chain();
                    pending.clear();
                    confirmed = None;
                }
                2 => {
                    let oldest = pending[0];
                    b.b.notify_checkpoint_complete(oldest);
                    confirmed = Some(oldest);
                }
                _ => {
                    b.b.notify_checkpoint_complete(id);
                    confirmed = Some(id);
                }
            }
        }
    }
}

/// [`check_incremental_model`]'s changes before one checkpoint: random writes and clears of
/// "count" and of "late" (once registered), applied to the models `counts` and `names` too, and
/// every key touched added to each set of `touched_since`.
fn incremental_model_changes<K: SuiteKey, B: KeyedStateBackend<K>>(
    b: &mut Subject<'_, K, B>,
    rng: &mut SplitMix64,
    count: ValueState<u64>,
    late: Option<ValueState<String>>,
    counts: &mut HashMap<K, u64>,
    names: &mut HashMap<K, String>,
    touched_since: &mut BTreeMap<u64, HashSet<K>>,
) {
    for _ in 0..rng.below(60) {
        let k = K::nth(rng.below(u64::from(MODEL_KEYS)));
        let g = b.kg(&k);
        match (rng.below(6), late) {
            (0, _) => {
                b.clear(count, &k);
                counts.remove(&k);
            }
            (1, Some(late)) => {
                let v = format!("n{}", rng.below(1000));
                b.put(late, &k, v.clone());
                names.insert(k.clone(), v);
            }
            (2, Some(late)) => {
                b.clear(late, &k);
                names.remove(&k);
            }
            (3, _) => {
                let add = rng.below(10);
                *b.b.value_mut_or_insert(count, &k, g, || 0) += add;
                *counts.entry(k.clone()).or_insert(0) += add;
            }
            _ => {
                let v = rng.below(1 << 40);
                b.put(count, &k, v);
                counts.insert(k.clone(), v);
            }
        }
        for set in touched_since.values_mut() {
            set.insert(k.clone());
        }
    }
}

/// [`check_incremental_model`]'s check of checkpoint `id`'s delta `w` on checkpoint `base`: it
/// holds every key of "count" changed since `base` with its current value, a tombstone for every
/// key removed since, and no key untouched since.
fn check_delta_content<K: SuiteKey>(
    cx: &Cx,
    w: &Written,
    id: u64,
    base: u64,
    counts: &HashMap<K, u64>,
    touched_since: &BTreeMap<u64, HashSet<K>>,
    counts_at: &BTreeMap<u64, HashMap<K, u64>>,
) {
    let (upserts, tombstones) = delta_content::<K, u64>(cx, w, "count");
    let touched = &touched_since[&base];
    let before = &counts_at[&base];
    for (k, v) in counts {
        if before.get(k) != Some(v) {
            cx.eq(
                &format!("checkpoint {id}'s delta holds {k:?}, changed since {base}"),
                &upserts.get(k),
                &Some(v),
            );
        }
    }
    for k in before.keys().filter(|k| !counts.contains_key(*k)) {
        cx.must(tombstones.contains(k), || {
            format!("checkpoint {id}'s delta has no tombstone for {k:?}, removed since {base}")
        });
    }
    for k in upserts.keys().chain(&tombstones) {
        cx.must(touched.contains(k), || {
            format!("checkpoint {id}'s delta holds {k:?}, untouched since {base}")
        });
    }
    for (k, v) in &upserts {
        cx.eq(
            &format!("checkpoint {id}'s delta holds the current value of {k:?}"),
            &counts.get(k),
            &Some(v),
        );
    }
    for k in &tombstones {
        cx.must(!counts.contains_key(k), || {
            format!("checkpoint {id}'s delta removes {k:?}, which has a value")
        });
    }
}

/// Restores `links` (a chain, in order) whole and split over two backends, and checks that they
/// read back `counts` (state "count") and `names` (state "late", when registered), and that a
/// full snapshot of the whole restore holds exactly `counts`.
fn verify_chain<K: SuiteKey, B: KeyedStateBackend<K>>(
    cx: &Cx,
    make: &impl Fn(u32, KeyGroupRange) -> B,
    max_p: u32,
    links: &[&Written],
    counts: &HashMap<K, u64>,
    names: Option<&HashMap<K, String>>,
) {
    let all = keys::<K>(u64::from(MODEL_KEYS));
    let mid = max_p / 2;
    let halves = [
        KeyGroupRange::new(0, mid - 1),
        KeyGroupRange::new(mid, max_p - 1),
    ];
    for range in std::iter::once(full(max_p)).chain(halves) {
        let mut r = match restored(cx, make, max_p, range, links) {
            Ok(r) => r,
            Err(e) => cx.fail(format!(
                "restoring a chain of {} snapshots into key groups {range} failed: {e}",
                links.len()
            )),
        };
        let own = |k: &K| range.contains(assign_to_key_group(k, max_p));
        let count = r.register::<u64>("count");
        let expected: HashMap<K, u64> = counts
            .iter()
            .filter(|(k, _)| own(k))
            .map(|(k, v)| (k.clone(), *v))
            .collect();
        r.read_back(
            &format!("a chain of {} restored into {range}", links.len()),
            count,
            &expected,
            all.iter().filter(|k| own(k)),
        );
        if let Some(names) = names {
            let late = r.register::<String>("late");
            let expected: HashMap<K, String> = names
                .iter()
                .filter(|(k, _)| own(k))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            r.read_back(
                &format!("a chain of {} restored into {range}", links.len()),
                late,
                &expected,
                all.iter().filter(|k| own(k)),
            );
        }
        if range == full(max_p) {
            let w = r.write();
            cx.eq(
                "a full snapshot of a restored chain holds the state of the chain's moment",
                &content::<K, u64>(cx, &w, "count"),
                counts,
            );
        }
    }
}

/// The entries and tombstones of state `state` in a delta.
fn delta_content<K: SuiteKey, V: StateValue>(
    cx: &Cx,
    w: &Written,
    state: &str,
) -> (HashMap<K, V>, HashSet<K>) {
    let header = header_of(cx, w);
    let Some(meta) = header.states.iter().find(|m| m.name == state) else {
        cx.fail(format!(
            "state '{state}' is missing from the delta's header"
        ))
    };
    let part = whole_part(cx, w);
    let sections = cx.ok(
        "slicing the sections",
        format::part_sections(&part, &w.handle.key_group_range),
    );
    let (mut upserts, mut tombstones) = (HashMap::new(), HashSet::new());
    for (kg, section) in sections {
        let blocks = cx.ok(
            &format!("parsing the section of key group {kg}"),
            header.parse_section(kg, section),
        );
        for block in blocks.iter().filter(|b| b.state_id == meta.id) {
            let what = format!("delta of state '{state}' in key group {kg}");
            match block.kind {
                format::BlockKind::Entries => {
                    let decoded = format::decode_entries::<K, V>(
                        &what,
                        block.entry_count,
                        block.entries,
                        |k, v| {
                            cx.must(upserts.insert(k, v).is_none(), || {
                                format!("{what}: a key appears twice")
                            });
                            Ok(())
                        },
                    );
                    cx.ok(&format!("decoding {what}"), decoded);
                }
                format::BlockKind::Tombstones => {
                    let decoded = format::decode_entries::<K, ()>(
                        &what,
                        block.entry_count,
                        block.entries,
                        |k, ()| {
                            cx.must(tombstones.insert(k), || {
                                format!("{what}: a tombstone appears twice")
                            });
                            Ok(())
                        },
                    );
                    cx.ok(&format!("decoding the tombstones of {what}"), decoded);
                }
            }
        }
    }
    (upserts, tombstones)
}

/// The rules of restoring incremental chains:
/// - a delta without its base, or before it, is an error naming a key group;
/// - a restored chain's state that is not registered is carried into the next full snapshot
///   (with its overlays) and, unchanged, past later deltas; registered later, it reads the
///   chain's values;
/// - the first incremental snapshot after a restore is a full one.
pub fn check_incremental_restore_rules<K: SuiteKey, B: KeyedStateBackend<K>>(
    make: &impl Fn(u32, KeyGroupRange) -> B,
) {
    let cx = Cx::new::<B>("incremental_restore_rules");
    let max_p = 8;
    let mut b = fresh(&cx, make, max_p, full(max_p));
    let a = b.register::<u64>("a");
    let other = b.register::<u64>("b");
    let mut a_model = HashMap::new();
    let mut b_model = HashMap::new();
    for (i, k) in keys::<K>(60).into_iter().enumerate() {
        b.put(a, &k, i as u64);
        b.put(other, &k, 2 * i as u64);
        a_model.insert(k.clone(), i as u64);
        b_model.insert(k, 2 * i as u64);
    }
    let take = |b: &mut Subject<'_, K, B>, id: u64| {
        let snapshot = cx.ok("snapshot_incremental", b.b.snapshot_incremental(id));
        let scope = snapshot.scope();
        (finish::<K>(&cx, snapshot, max_p, full(max_p)), scope)
    };
    let (w1, scope) = take(&mut b, 1);
    cx.eq(
        "the first incremental snapshot is full",
        &scope,
        &SnapshotScope::Incremental { base: None },
    );
    b.b.notify_checkpoint_complete(1);
    for (i, k) in keys::<K>(10).into_iter().enumerate() {
        b.put(a, &k, 100 + i as u64);
        b.clear(other, &k);
        a_model.insert(k.clone(), 100 + i as u64);
        b_model.remove(&k);
    }
    let (w2, scope) = take(&mut b, 2);
    cx.eq(
        "a snapshot after a confirmed checkpoint is a delta on it",
        &scope,
        &SnapshotScope::Incremental { base: Some(1) },
    );
    for links in [vec![&w2], vec![&w2, &w1]] {
        match restored(&cx, make, max_p, full(max_p), &links) {
            Ok(_) => cx.fail(format!(
                "a delta restored without its base before it ({} snapshots) was accepted",
                links.len()
            )),
            Err(e) => cx.must(e.to_string().contains("key group"), || {
                format!("a delta without its base: the error should name a key group: {e}")
            }),
        }
    }
    // Restore the chain registering only "a": "b" stays pending, with overlays.
    let mut r = match restored(&cx, make, max_p, full(max_p), &[&w1, &w2]) {
        Ok(r) => r,
        Err(e) => cx.fail(format!("restoring a chain failed: {e}")),
    };
    let a2 = r.register::<u64>("a");
    r.read_back("the chain's 'a'", a2, &a_model, []);
    let (w7, scope) = take(&mut r, 7);
    cx.eq(
        "the first incremental snapshot after a restore is full",
        &scope,
        &SnapshotScope::Incremental { base: None },
    );
    r.b.notify_checkpoint_complete(7);
    let k0 = K::nth(0);
    r.put(a2, &k0, 7);
    a_model.insert(k0, 7);
    let (w8, scope) = take(&mut r, 8);
    cx.eq(
        "a snapshot after a confirmed checkpoint is a delta on it",
        &scope,
        &SnapshotScope::Incremental { base: Some(7) },
    );
    let savepoint = r.write();
    for links in [vec![&w7, &w8], vec![&savepoint]] {
        let mut again = match restored(&cx, make, max_p, full(max_p), &links) {
            Ok(r) => r,
            Err(e) => cx.fail(format!("restoring what a restored chain wrote failed: {e}")),
        };
        let b2 = again.register::<u64>("b");
        let a3 = again.register::<u64>("a");
        again.read_back(
            "a state never registered, carried through a restore and its snapshots",
            b2,
            &b_model,
            keys::<K>(10).iter(),
        );
        again.read_back("'a' through a restore and its snapshots", a3, &a_model, []);
    }
}

fn full(max_p: u32) -> KeyGroupRange {
    KeyGroupRange::new(0, max_p - 1)
}

fn keys<K: SuiteKey>(n: u64) -> Vec<K> {
    (0..n).map(K::nth).collect()
}

/// A backend under test, with its key type fixed and small conveniences.
struct Subject<'c, K, B> {
    b: B,
    cx: &'c Cx,
    _key: PhantomData<fn() -> K>,
}

/// A fresh backend from `make`, checked to report the range and max parallelism it was made with.
fn fresh<'c, K: SuiteKey, B: KeyedStateBackend<K>>(
    cx: &'c Cx,
    make: &impl Fn(u32, KeyGroupRange) -> B,
    max_p: u32,
    range: KeyGroupRange,
) -> Subject<'c, K, B> {
    let b = make(max_p, range);
    cx.eq(
        "key_group_range() is the range the backend was made for",
        &b.key_group_range(),
        &range,
    );
    cx.eq(
        "max_parallelism() is the one the backend was made with",
        &b.max_parallelism(),
        &max_p,
    );
    Subject {
        b,
        cx,
        _key: PhantomData,
    }
}

/// A fresh backend of `range` restored from the parts of `snapshots` that overlap it (the header
/// and only the overlapping sections), as the checkpoint layer hands them over.
fn restored<'c, K: SuiteKey, B: KeyedStateBackend<K>>(
    cx: &'c Cx,
    make: &impl Fn(u32, KeyGroupRange) -> B,
    max_p: u32,
    range: KeyGroupRange,
    snapshots: &[&Written],
) -> Result<Subject<'c, K, B>, StateError> {
    let mut s = fresh(cx, make, max_p, range);
    let parts: Vec<RestorePart<'_>> = snapshots
        .iter()
        .filter(|w| !w.handle.key_group_range.intersection(&range).is_empty())
        .map(|w| part_for(cx, w, &range))
        .collect();
    s.b.restore(&parts)?;
    Ok(s)
}

impl<K: SuiteKey, B: KeyedStateBackend<K>> Subject<'_, K, B> {
    fn kg(&self, key: &K) -> KeyGroup {
        assign_to_key_group(key, self.b.max_parallelism())
    }

    #[track_caller]
    fn register<V: StateValue>(&mut self, name: &str) -> ValueState<V> {
        match self.b.value_state(&ValueStateDescriptor::<V>::new(name)) {
            Ok(s) => s,
            Err(e) => self.cx.fail(format!(
                "registering '{name}' as a value state of `{}` failed unexpectedly: {e}",
                type_name::<V>()
            )),
        }
    }

    fn put<V: StateValue>(&mut self, s: ValueState<V>, key: &K, value: V) {
        let g = self.kg(key);
        self.b.update(s, key, g, value);
    }

    fn get<V: StateValue>(&mut self, s: ValueState<V>, key: &K) -> Option<V> {
        let g = self.kg(key);
        self.b.value(s, key, g).cloned()
    }

    fn clear<V: StateValue>(&mut self, s: ValueState<V>, key: &K) {
        let g = self.kg(key);
        self.b.clear(s, key, g);
    }

    /// Reads every key of `expected` and of `also` through `value`, expecting `expected`'s
    /// values (and no value for a key not in it).
    #[track_caller]
    fn read_back<'k, V: StateValue + Debug + PartialEq>(
        &mut self,
        rule: &str,
        s: ValueState<V>,
        expected: &HashMap<K, V>,
        also: impl IntoIterator<Item = &'k K>,
    ) where
        K: 'k,
    {
        for (k, v) in expected {
            let g = self.kg(k);
            let got = self.b.value(s, k, g);
            if got != Some(v) {
                self.cx
                    .fail(format!("{rule}: {k:?} reads {got:?}, expected {v:?}"));
            }
        }
        for k in also {
            let g = self.kg(k);
            let got = self.b.value(s, k, g);
            let want = expected.get(k);
            if got != want {
                self.cx
                    .fail(format!("{rule}: {k:?} reads {got:?}, expected {want:?}"));
            }
        }
    }

    /// Snapshots and writes at once, checking the result is well formed.
    fn write(&mut self) -> Written {
        let snapshot = self.cx.ok("snapshot", self.b.snapshot());
        finish::<K>(
            self.cx,
            snapshot,
            self.b.max_parallelism(),
            self.b.key_group_range(),
        )
    }
}

/// A written snapshot: its handle (with an empty inline stream) and its bytes.
struct Written {
    handle: KeyedStateHandle,
    bytes: Vec<u8>,
}

/// Writes a frozen snapshot into memory and checks it is well formed.
fn finish<K: StateKey>(
    cx: &Cx,
    snapshot: Box<dyn KeyedSnapshot>,
    max_p: u32,
    range: KeyGroupRange,
) -> Written {
    let mut bytes = Vec::new();
    let layout = cx.ok("writing a snapshot", snapshot.write_to(&mut bytes));
    check_written::<K>(cx, layout, bytes, max_p, range)
}

/// Checks that `bytes` are a snapshot of `range` in the [`crate::format`] and that `layout`
/// describes them: header first, one section per key group in order, each with its key group
/// and a valid checksum, states of key type `K`.
fn check_written<K: StateKey>(
    cx: &Cx,
    layout: KeyedSnapshotLayout,
    bytes: Vec<u8>,
    max_p: u32,
    range: KeyGroupRange,
) -> Written {
    cx.eq(
        "a snapshot covers exactly the backend's key groups",
        &layout.key_group_range,
        &range,
    );
    cx.eq(
        "the layout's end is the number of bytes written",
        &layout.end,
        &(bytes.len() as u64),
    );
    cx.eq("the header starts the stream", &layout.header.0, &0);
    cx.eq(
        "the layout has one section offset per key group",
        &layout.offsets.len(),
        &(range.len() as usize),
    );
    let mut at = layout.header.1;
    for (kg, &start) in range.iter().zip(&layout.offsets) {
        cx.must(start >= at && start <= layout.end, || {
            format!(
                "the section of key group {kg} starts at {start}, before the previous one ends \
                 ({at}) or after the end ({})",
                layout.end
            )
        });
        at = start;
    }
    let w = Written {
        handle: layout.into_handle(StreamStateHandle::Inline(Vec::new())),
        bytes,
    };
    let header = header_of(cx, &w);
    cx.eq(
        "the header records the backend's key groups",
        &header.key_group_range,
        &range,
    );
    cx.eq(
        "the header records the backend's max parallelism",
        &header.max_parallelism,
        &max_p,
    );
    for meta in &header.states {
        cx.eq(
            &format!("the header records state '{}' with the key type", meta.name),
            &meta.key_type.as_str(),
            &type_name::<K>(),
        );
    }
    let part = whole_part(cx, &w);
    let sections = cx.ok(
        "slicing the sections with the layout's offsets",
        format::part_sections(&part, &range),
    );
    cx.eq(
        "every key group has a section",
        &sections.len(),
        &(range.len() as usize),
    );
    for (kg, section) in sections {
        cx.must(section.len() >= EMPTY_SECTION_LEN, || {
            format!(
                "the section of key group {kg} is {} bytes, shorter than an empty one",
                section.len()
            )
        });
        let blocks = cx.ok(
            &format!("parsing the section of key group {kg}"),
            header.parse_section(kg, section),
        );
        let mut last = None;
        for block in blocks.iter() {
            cx.must(
                usize::try_from(block.state_id).is_ok_and(|i| i < header.states.len()),
                || {
                    format!(
                        "key group {kg} has a block of unknown state {}",
                        block.state_id
                    )
                },
            );
            cx.must(
                last < Some(block.state_id) || (header.overlays && last == Some(block.state_id)),
                || format!("key group {kg}'s blocks are not in ascending state id"),
            );
            cx.must(block.entry_count > 0, || {
                format!(
                    "key group {kg} has an empty block for state {}",
                    block.state_id
                )
            });
            last = Some(block.state_id);
        }
    }
    w
}

fn header_of(cx: &Cx, w: &Written) -> SnapshotHeader {
    let (start, end) = w.handle.header;
    let Some(bytes) = w.bytes.get(start as usize..end as usize) else {
        cx.fail(format!(
            "the header range [{start}, {end}) is outside the {} bytes",
            w.bytes.len()
        ))
    };
    cx.ok(
        "decoding the snapshot header",
        SnapshotHeader::decode(bytes),
    )
}

fn whole_part<'a>(cx: &Cx, w: &'a Written) -> RestorePart<'a> {
    cx.ok(
        "slicing the snapshot",
        format::whole_stream_part(&w.handle, &w.bytes),
    )
}

/// The part a checkpoint hands a backend owning `range`: the header, and only the sections of the
/// overlapping key groups. `range` must overlap the snapshot's.
fn part_for<'a>(cx: &Cx, w: &'a Written, range: &KeyGroupRange) -> RestorePart<'a> {
    let Some((start, end)) = w.handle.byte_range_for(range) else {
        cx.fail(format!(
            "the snapshot of key groups {} has no bytes for {range}",
            w.handle.key_group_range
        ))
    };
    let (hs, he) = w.handle.header;
    let (Some(header), Some(sections)) = (
        w.bytes.get(hs as usize..he as usize),
        w.bytes.get(start as usize..end as usize),
    ) else {
        cx.fail("the handle's ranges are outside the snapshot's bytes")
    };
    RestorePart {
        handle: &w.handle,
        header,
        sections: bytes::Bytes::copy_from_slice(sections),
        sections_offset: start,
    }
}

/// Every entry of value state `state` in a written snapshot (see [`content_of`]).
fn content<K: SuiteKey, V: StateValue>(cx: &Cx, w: &Written, state: &str) -> HashMap<K, V> {
    content_of(cx, w, state, StateKind::Value)
}

/// Every entry of state `state`, recorded in the header as a `kind` state, in a written
/// snapshot, read with the [`crate::format`]'s own functions, checking that each key is in the
/// section of its key group, once.
fn content_of<K: SuiteKey, V: StateValue>(
    cx: &Cx,
    w: &Written,
    state: &str,
    kind: StateKind,
) -> HashMap<K, V> {
    let header = header_of(cx, w);
    let Some(meta) = header.states.iter().find(|m| m.name == state) else {
        cx.fail(format!(
            "a registered state '{state}' is missing from the snapshot's header"
        ))
    };
    cx.eq(
        &format!("the header records '{state}' as a {kind} state"),
        &meta.kind,
        &kind,
    );
    cx.eq(
        &format!("the header records '{state}' with its value type"),
        &meta.value_type.as_str(),
        &type_name::<V>(),
    );
    let part = whole_part(cx, w);
    let sections = cx.ok(
        "slicing the sections",
        format::part_sections(&part, &w.handle.key_group_range),
    );
    let mut out = HashMap::new();
    for (kg, section) in sections {
        let blocks = cx.ok(
            &format!("parsing the section of key group {kg}"),
            header.parse_section(kg, section),
        );
        cx.must(!header.delta, || {
            format!("content_of reads full snapshots, and the one of '{state}' is a delta")
        });
        for block in blocks.iter().filter(|b| b.state_id == meta.id) {
            cx.must(block.kind == format::BlockKind::Entries, || {
                format!("a full snapshot of '{state}' holds tombstones in key group {kg}")
            });
            let what = format!("state '{state}' in key group {kg}");
            let decoded =
                format::decode_entries::<K, V>(&what, block.entry_count, block.entries, |k, v| {
                    let actual = assign_to_key_group(&k, header.max_parallelism);
                    cx.must(actual == kg, || {
                        format!("{what}: {k:?} belongs to key group {actual}")
                    });
                    cx.must(!out.contains_key(&k), || {
                        format!("{what}: {k:?} appears twice")
                    });
                    out.insert(k, v);
                    Ok(())
                });
            cx.ok(&format!("decoding {what}"), decoded);
        }
    }
    out
}
