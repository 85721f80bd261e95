//! Runs the keyed-state conformance suite against the heap backend, and the suite's model check
//! on operations generated (and shrunk) by proptest.
//!
//! The heap's own internals (copy-on-write sharing, its inspection methods, its error wording)
//! are tested in `src/heap.rs`.

use proptest::prelude::*;
use weir_state::HeapKeyedStateBackend;
use weir_state::conformance::{self, MODEL_KEYS, ModelOp};

#[test]
fn heap_passes_the_keyed_conformance_suite() {
    conformance::run_all(HeapKeyedStateBackend::new, HeapKeyedStateBackend::new);
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
