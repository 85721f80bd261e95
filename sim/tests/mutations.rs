//! The simulation can fail: each deliberate protocol bug (`weir_core::sim::Mutation`, acted out
//! only in debug builds) breaks an invariant on some seed within the CI budget of 300 seeds.
//! A release build has no mutations, so these tests exist in debug builds only.
#![cfg(debug_assertions)]

use weir_core::sim::{MUTATIONS_BUILT_IN, Mutation};
use weir_sim::run_seed;

/// The first seed below 300 whose schedule breaks an invariant under `mutation`.
fn first_failing(mutation: Mutation) -> Option<(u64, Vec<String>)> {
    (0..300).find_map(|seed| {
        let o = run_seed(seed, Some(mutation));
        (!o.passed()).then_some((seed, o.violations))
    })
}

fn found(mutation: Mutation) {
    const {
        assert!(
            MUTATIONS_BUILT_IN,
            "weir-sim enables weir-core's `mutations`"
        )
    };
    match first_failing(mutation) {
        Some((seed, violations)) => {
            println!("{} found by seed {seed}: {violations:?}", mutation.name());
        }
        None => panic!("no seed below 300 finds {}", mutation.name()),
    }
}

#[test]
fn acknowledging_before_the_snapshot_is_durable_is_found() {
    found(Mutation::AckBeforeDurable);
}

#[test]
fn unblocking_a_channel_before_alignment_completes_is_found() {
    found(Mutation::UnblockBeforeAligned);
}

#[test]
fn notifying_complete_before_metadata_is_written_is_found() {
    found(Mutation::NotifyBeforeMetadata);
}

#[test]
fn restoring_from_a_checkpoint_without_metadata_is_found() {
    found(Mutation::RestoreWithoutMetadata);
}

#[test]
fn dropping_one_channels_in_flight_data_is_found() {
    found(Mutation::DropInFlight);
}
