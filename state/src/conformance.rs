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
//! - [`check_restore_from_files`]: a restore handed its sections in local files gives what a
//!   restore from memory gives (written back unregistered, and registered), and names damage.
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

use crate::keyed::{KeyedStateBackend, StateKey};
use std::fmt::Debug;
use weir_core::keygroup::KeyGroupRange;

#[cfg(doc)]
use crate::StateError;
#[cfg(doc)]
use crate::format::{EMPTY_SECTION_LEN, MAX_STATES};

mod basics;
mod files;
mod helpers;
mod incremental;
mod kind_checks;
mod kind_model;
mod kind_semantics;
mod model;
mod restore;

pub use basics::{
    check_for_each_entry, check_registration, check_round_trip, check_snapshot_isolation,
    check_snapshot_layout, check_value_semantics,
};
pub use files::check_restore_from_files;
pub use incremental::{
    INCREMENTAL_CASES, check_incremental_model, check_incremental_restore_rules,
    run_incremental_checks,
};
pub use kind_checks::{
    check_kind_mismatch_after_restore, check_kind_registration, check_kind_snapshot_isolation,
    check_kinds_round_trip,
};
pub use kind_model::{
    KIND_MODEL_CASES, KIND_MODEL_KEYS, KIND_MODEL_SEED, KIND_MODEL_USER_KEYS, KindOp,
    check_kinds_against_model, check_random_kind_models,
};
pub use kind_semantics::check_kind_semantics;
pub use model::{ModelOp, check_against_model, check_random_models};
pub use restore::{
    check_corruption, check_deterministic_bytes, check_incompatible_key_type, check_rescale,
    check_restore_refusals, check_restore_twice, check_too_many_states,
    check_type_mismatch_after_restore, check_unregistered_states_survive,
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
            restore_from_files => check_restore_from_files,
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
