//! Runs the keyed-state conformance suite against the heap backend, and the suite's model checks
//! (value states, and every state kind) on operations generated (and shrunk) by proptest, in full
//! and in incremental mode.
//!
//! The heap's own internals (copy-on-write sharing, its inspection methods, its error wording)
//! are tested in `src/heap.rs`.

use proptest::prelude::*;
use weir_state::HeapKeyedStateBackend;
use weir_state::conformance::{
    self, KIND_MODEL_KEYS, KIND_MODEL_USER_KEYS, KindOp, MODEL_KEYS, ModelOp,
};

/// The heap backend: one test per check of the suite.
mod heap {
    use weir_state::HeapKeyedStateBackend;
    weir_state::keyed_backend_conformance!(
        HeapKeyedStateBackend::<String>::new,
        HeapKeyedStateBackend::<u64>::new
    );
}

fn incremental<K: weir_state::StateKey>(
    max_p: u32,
    range: weir_core::keygroup::KeyGroupRange,
) -> HeapKeyedStateBackend<K> {
    HeapKeyedStateBackend::new(max_p, range).with_incremental(4)
}

/// The same backend in incremental mode: the whole suite (whose snapshots are the full,
/// self-contained ones savepoints take), and the incremental checks.
mod heap_incremental {
    use super::incremental;
    weir_state::keyed_backend_conformance!(incremental::<String>, incremental::<u64>);
    weir_state::keyed_backend_incremental_conformance!(incremental::<String>, incremental::<u64>);
}

fn op() -> impl Strategy<Value = ModelOp> {
    prop_oneof![
        3 => (0..MODEL_KEYS, any::<u64>()).prop_map(|(k, v)| ModelOp::Set(k, v)),
        1 => (0..MODEL_KEYS, any::<u64>()).prop_map(|(k, v)| ModelOp::Add(k, v)),
        2 => (0..MODEL_KEYS, "\\PC{0,8}").prop_map(|(k, v)| ModelOp::Name(k, v)),
        1 => (0..MODEL_KEYS).prop_map(ModelOp::Clear),
        1 => Just(ModelOp::Snapshot),
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
        u64_keys in any::<bool>(),
    ) {
        if u64_keys {
            conformance::check_against_model(
                HeapKeyedStateBackend::<u64>::new, max_p, parallelism, &ops,
            );
        } else {
            conformance::check_against_model(
                HeapKeyedStateBackend::<String>::new, max_p, parallelism, &ops,
            );
        }
    }
}

fn kind_op() -> impl Strategy<Value = KindOp> {
    let key = || 0..KIND_MODEL_KEYS;
    let user_key = || 0..KIND_MODEL_USER_KEYS;
    let word = || "\\PC{0,6}";
    let words = move || proptest::collection::vec(word(), 0..4);
    prop_oneof![
        1 => (key(), any::<u64>()).prop_map(|(k, v)| KindOp::Update(k, v)),
        1 => key().prop_map(KindOp::ClearValue),
        2 => (key(), word()).prop_map(|(k, v)| KindOp::ListAdd(k, v)),
        1 => (key(), words()).prop_map(|(k, v)| KindOp::ListAddAll(k, v)),
        1 => (key(), words()).prop_map(|(k, v)| KindOp::ListUpdate(k, v)),
        1 => key().prop_map(KindOp::ClearList),
        2 => (key(), user_key(), word()).prop_map(|(k, u, v)| KindOp::MapPut(k, u, v)),
        2 => (key(), user_key()).prop_map(|(k, u)| KindOp::MapRemove(k, u)),
        1 => key().prop_map(KindOp::ClearMap),
        2 => (key(), any::<u64>()).prop_map(|(k, v)| KindOp::Reduce(k, v)),
        1 => key().prop_map(KindOp::ClearReducing),
        2 => (key(), any::<u32>()).prop_map(|(k, v)| KindOp::Aggregate(k, v)),
        1 => key().prop_map(KindOp::ClearAggregating),
        1 => Just(KindOp::Snapshot),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(32))]

    /// Random operations on a value (with a default), list, map, reducing and aggregating state
    /// against a model; snapshots taken midway must hold the model as it was then, restored
    /// whole or split across a random parallelism.
    #[test]
    fn every_state_kind_matches_a_model(
        ops in proptest::collection::vec(kind_op(), 0..300),
        max_p in prop_oneof![Just(1u32), Just(7), Just(128)],
        parallelism in 1u32..5,
        u64_keys in any::<bool>(),
    ) {
        if u64_keys {
            conformance::check_kinds_against_model(
                HeapKeyedStateBackend::<u64>::new, max_p, parallelism, &ops,
            );
        } else {
            conformance::check_kinds_against_model(
                HeapKeyedStateBackend::<String>::new, max_p, parallelism, &ops,
            );
        }
    }
}
