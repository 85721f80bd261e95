//! A conformance suite for [`CheckpointStorage`]: every implementation, over every service,
//! must pass it. Each check panics with a message naming the violated rule.
//!
//! [`run_all`] needs only the trait. [`run_all_with_raw`] adds the checks that damage or inspect
//! files behind the storage's back, through an `opendal::Operator` over the same root. Each check
//! works in a job of its own (ids derived from `weir-conformance/<check>`) and clears it first,
//! so the checks can share one storage and be run again on it.

mod helpers;
mod job_lock;
pub mod lease;
mod lifetime;
mod listing;
mod raw;
mod read_write;
mod state_files;
pub mod streamed;

pub use job_lock::{check_job_lock, check_job_lock_race};
pub use lifetime::{check_discard_idempotent, check_shared_state};
pub use listing::check_list_and_find;
pub use raw::{
    check_inprogress_alone_is_incomplete, check_metadata_corruption_detected,
    check_no_inprogress_left,
};
pub use read_write::{
    check_describe_and_writable, check_metadata_marks_complete, check_metadata_round_trip,
    check_missing_metadata_is_not_found, check_ranged_reads, check_read_after_write,
};
pub use state_files::{
    check_inline_is_monotonic, check_inline_threshold, check_name_validation,
    check_state_corruption_detected,
};

use crate::storage::CheckpointStorage;
use opendal::Operator;

/// The size of state the checks expect to be written as a file (far above any sensible inline
/// threshold).
pub const FILE_STATE_LEN: usize = 256 * 1024;

/// Expands to one test per check that needs only the trait, for a storage made by `$make`, an
/// async function (or closure returning a future) giving a fresh `impl CheckpointStorage`:
///
/// ```ignore
/// mod my_storage {
///     async fn make() -> MyStorage { MyStorage::new() }
///     weir_checkpoint::checkpoint_storage_conformance!(make);
/// }
/// ```
///
/// Each check is a `#[tokio::test]` of its own, named after it, so a failing run names the
/// rule broken. Needs the `conformance` feature of `weir-checkpoint`, and `tokio` (with its
/// `macros` and `rt-multi-thread` features) among the dev-dependencies.
#[macro_export]
macro_rules! checkpoint_storage_conformance {
    ($make:expr $(,)?) => {
        $crate::checkpoint_storage_conformance!(@each $make;
            describe_and_writable => check_describe_and_writable,
            read_after_write => check_read_after_write,
            metadata_round_trip => check_metadata_round_trip,
            metadata_marks_complete => check_metadata_marks_complete,
            missing_metadata_is_not_found => check_missing_metadata_is_not_found,
            ranged_reads => check_ranged_reads,
            inline_is_monotonic => check_inline_is_monotonic,
            state_corruption_detected => check_state_corruption_detected,
            discard_idempotent => check_discard_idempotent,
            shared_state => check_shared_state,
            shared_state_from_file => streamed::check_shared_state_from_file,
            list_and_find => check_list_and_find,
            name_validation => check_name_validation,
            job_lock => check_job_lock,
            job_lock_race => check_job_lock_race,
            lock_generations => lease::check_lock_generations,
            list_and_delete_files => lease::check_list_and_delete_files,
        );
    };
    (@each $make:expr; $($name:ident => $($check:ident)::+,)*) => {
        $(
            #[::tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() {
                let storage = ($make)().await;
                $crate::storage::conformance::$($check)::+(&storage).await;
            }
        )*
    };
}

/// Runs every check that needs only the trait.
pub async fn run_all(storage: &dyn CheckpointStorage) {
    check_describe_and_writable(storage).await;
    check_read_after_write(storage).await;
    check_metadata_round_trip(storage).await;
    check_metadata_marks_complete(storage).await;
    check_missing_metadata_is_not_found(storage).await;
    check_ranged_reads(storage).await;
    check_inline_is_monotonic(storage).await;
    check_state_corruption_detected(storage).await;
    check_discard_idempotent(storage).await;
    check_shared_state(storage).await;
    streamed::check_shared_state_from_file(storage).await;
    check_list_and_find(storage).await;
    check_name_validation(storage).await;
    check_job_lock(storage).await;
    lease::check_lock_generations(storage).await;
    lease::check_list_and_delete_files(storage).await;
}

/// Runs [`run_all`] and the checks that need raw access. `raw` must be an operator over the
/// same root as `storage` (for [`OpendalCheckpointStorage`](crate::OpendalCheckpointStorage),
/// its `operator()`).
pub async fn run_all_with_raw(storage: &dyn CheckpointStorage, raw: &Operator) {
    run_all(storage).await;
    check_no_inprogress_left(storage, raw).await;
    check_inprogress_alone_is_incomplete(storage, raw).await;
    check_metadata_corruption_detected(storage, raw).await;
}
