//! A conformance suite for [`CheckpointStorage`]: every implementation, over every service,
//! must pass it. Each check panics with a message naming the violated rule.
//!
//! [`run_all`] needs only the trait. [`run_all_with_raw`] adds the checks that damage or inspect
//! files behind the storage's back, through an `opendal::Operator` over the same root. Each check
//! works in a job of its own (ids derived from `weir-conformance/<check>`) and clears it first,
//! so the checks can share one storage and be run again on it.

pub mod lease;
pub mod streamed;

use crate::storage::{CheckpointListing, CheckpointLocation, CheckpointStorage};
use crate::{CheckpointError, CheckpointMetadata, OperatorState};
use bytes::Bytes;
use opendal::{ErrorKind, Operator};
use std::collections::BTreeMap;
use std::fmt::Debug;
use weir_core::element::SnapshotKind;
use weir_core::handle::{
    KeyedStateHandle, OperatorStateHandle, OperatorStateMode, OperatorSubtaskState,
    StreamStateHandle,
};
use weir_core::identity::Digest;
use weir_core::ids::{CheckpointId, JobId, OperatorId};
use weir_core::keygroup::KeyGroupRange;

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

// ---------------------------------------------------------------------------------------------
// Helpers.

/// A job of the check's own, cleared of earlier runs.
async fn fresh_job(storage: &dyn CheckpointStorage, check: &str) -> JobId {
    let job = JobId::from_name(&format!("weir-conformance/{check}"));
    let old = ok(
        storage,
        check,
        "list_checkpoints",
        storage.list_checkpoints(job).await,
    );
    for listing in old {
        ok(
            storage,
            check,
            "discard (clearing an earlier run)",
            storage.discard(&listing.location).await,
        );
    }
    job
}

/// Deterministic bytes that differ by seed and position.
fn pattern(len: usize, seed: u8) -> Bytes {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ ((i >> 8) as u8))
        .collect::<Vec<u8>>()
        .into()
}

fn ok<T, E: Debug>(storage: &dyn CheckpointStorage, check: &str, op: &str, r: Result<T, E>) -> T {
    match r {
        Ok(v) => v,
        Err(e) => panic!(
            "conformance [{check}] on {}: {op} failed unexpectedly: {e:?}",
            storage.describe()
        ),
    }
}

fn fail(storage: &dyn CheckpointStorage, check: &str, msg: String) -> ! {
    panic!("conformance [{check}] on {}: {msg}", storage.describe())
}

fn must(storage: &dyn CheckpointStorage, check: &str, cond: bool, msg: impl FnOnce() -> String) {
    if !cond {
        fail(storage, check, msg());
    }
}

fn err<T: Debug>(
    storage: &dyn CheckpointStorage,
    check: &str,
    op: &str,
    r: Result<T, CheckpointError>,
) -> CheckpointError {
    match r {
        Ok(v) => fail(
            storage,
            check,
            format!("{op} should have failed, but returned {v:?}"),
        ),
        Err(e) => e,
    }
}

/// Asserts a `Corrupt` error whose path and message name `names`.
fn expect_corrupt<T: Debug>(
    storage: &dyn CheckpointStorage,
    check: &str,
    op: &str,
    r: Result<T, CheckpointError>,
    names: &str,
) {
    let e = err(storage, check, op, r);
    match &e {
        CheckpointError::Corrupt { path, .. } if path.contains(names) => {
            must(storage, check, e.to_string().contains(names), || {
                format!("{op}: the error message should name '{names}': {e}")
            });
        }
        other => fail(
            storage,
            check,
            format!("{op} should be Corrupt naming '{names}', got {other:?}"),
        ),
    }
}

/// Asserts a `Storage` error of kind `NotFound`.
fn expect_not_found<T: Debug>(
    storage: &dyn CheckpointStorage,
    check: &str,
    op: &str,
    r: Result<T, CheckpointError>,
) {
    let e = err(storage, check, op, r);
    must(
        storage,
        check,
        e.storage_kind() == Some(ErrorKind::NotFound),
        || format!("{op} should be a Storage error of kind NotFound, got {e:?}"),
    );
}

/// Writes state that must become a file.
async fn write_file(
    storage: &dyn CheckpointStorage,
    check: &str,
    location: &CheckpointLocation,
    name: &str,
    data: &Bytes,
) -> StreamStateHandle {
    let handle = ok(
        storage,
        check,
        "write_state",
        storage.write_state(location, name, data.clone()).await,
    );
    match &handle {
        StreamStateHandle::LegacyFile { .. } => fail(
            storage,
            check,
            format!("write_state returned a legacy handle (CRC-32, no digest): {handle:?}"),
        ),
        StreamStateHandle::File { path, size, digest } => {
            must(storage, check, path == name, || {
                format!(
                    "a file handle's path must be the name relative to the location: {path:?} != {name:?}"
                )
            });
            must(storage, check, *size == data.len() as u64, || {
                format!("file handle size {size} != {} bytes written", data.len())
            });
            must(storage, check, *digest == Digest::of(data), || {
                "file handle digest does not match the bytes written".to_string()
            });
        }
        StreamStateHandle::Inline(_) => fail(
            storage,
            check,
            format!(
                "{} bytes of state were inlined; the conformance suite needs state this large \
                 written as a file (is the inline threshold too high?)",
                data.len()
            ),
        ),
    }
    handle
}

async fn read_all(
    storage: &dyn CheckpointStorage,
    check: &str,
    location: &CheckpointLocation,
    handle: &StreamStateHandle,
) -> Bytes {
    ok(
        storage,
        check,
        "read_state",
        storage.read_state(location, handle, None).await,
    )
}

async fn listing_of(
    storage: &dyn CheckpointStorage,
    check: &str,
    job: JobId,
    id: u64,
) -> Option<CheckpointListing> {
    ok(
        storage,
        check,
        "list_checkpoints",
        storage.list_checkpoints(job).await,
    )
    .into_iter()
    .find(|l| l.id == CheckpointId(id))
}

/// A metadata value with both kinds of handle.
fn sample_metadata(
    job: JobId,
    id: u64,
    keyed: StreamStateHandle,
    operator: StreamStateHandle,
) -> CheckpointMetadata {
    let keyed_len = keyed.size();
    let mut subtasks = BTreeMap::new();
    subtasks.insert(
        0,
        OperatorSubtaskState {
            keyed: vec![KeyedStateHandle {
                key_group_range: KeyGroupRange::new(0, 1),
                header: (0, 8),
                offsets: vec![8, keyed_len / 2],
                end: keyed_len,
                stream: keyed,
            }],
            operator: vec![OperatorStateHandle {
                states: vec![("offsets".to_string(), OperatorStateMode::Union)],
                stream: operator,
            }],
            native: Vec::new(),
        },
    );
    CheckpointMetadata {
        job_id: job,
        job_name: "conformance".to_string(),
        checkpoint_id: CheckpointId(id),
        kind: SnapshotKind::Checkpoint,
        trigger_timestamp_ms: 1_700_000_000_000 + id,
        completion_timestamp_ms: 1_700_000_000_100 + id,
        weir_version: "conformance".to_string(),
        fingerprint: None,
        tuning: None,
        format_version: crate::metadata::METADATA_VERSION,
        operators: vec![
            OperatorState {
                operator_id: OperatorId::from_uid("sum"),
                uid: Some("sum".to_string()),
                name: "Sum".to_string(),
                parallelism: 1,
                max_parallelism: 2,
                subtasks,
                coordinator_state: Some(vec![1, 2, 3]),
            },
            OperatorState {
                operator_id: OperatorId::from_uid("sink"),
                uid: None,
                name: "Sink".to_string(),
                parallelism: 1,
                max_parallelism: 2,
                subtasks: BTreeMap::new(),
                coordinator_state: None,
            },
        ],
        in_flight: Vec::new(),
    }
}

/// Writes a complete checkpoint `id` of `job` (one file, one inline state, `_metadata`).
async fn write_complete(
    storage: &dyn CheckpointStorage,
    check: &str,
    job: JobId,
    id: u64,
) -> (CheckpointLocation, CheckpointMetadata) {
    let loc = ok(
        storage,
        check,
        "init_location",
        storage.init_location(job, CheckpointId(id)).await,
    );
    let file = write_file(
        storage,
        check,
        &loc,
        "keyed-0",
        &pattern(FILE_STATE_LEN, id as u8),
    )
    .await;
    let inline = ok(
        storage,
        check,
        "write_state",
        storage.write_state(&loc, "operator-0", pattern(0, 0)).await,
    );
    let md = sample_metadata(job, id, file, inline);
    ok(
        storage,
        check,
        "write_metadata",
        storage.write_metadata(&loc, &md).await,
    );
    (loc, md)
}

// ---------------------------------------------------------------------------------------------
// Checks that need only the trait.

/// `describe` says something, and `check_writable` succeeds (twice: it must be repeatable).
pub async fn check_describe_and_writable(storage: &dyn CheckpointStorage) {
    let check = "describe_and_writable";
    must(storage, check, !storage.describe().is_empty(), || {
        "describe() is empty".to_string()
    });
    ok(
        storage,
        check,
        "check_writable",
        storage.check_writable().await,
    );
    ok(
        storage,
        check,
        "check_writable (again)",
        storage.check_writable().await,
    );
}

/// Bytes written are read back unchanged, from files and inline handles, and the location is
/// listed (incomplete) once it holds a file.
pub async fn check_read_after_write(storage: &dyn CheckpointStorage) {
    let check = "read_after_write";
    let job = fresh_job(storage, check).await;
    let loc = ok(
        storage,
        check,
        "init_location",
        storage.init_location(job, CheckpointId(1)).await,
    );
    must(
        storage,
        check,
        loc == CheckpointLocation::for_checkpoint(job, CheckpointId(1)),
        || format!("init_location returned {loc:?}, not the layout's <job>/chk-1/"),
    );
    let big = pattern(FILE_STATE_LEN, 1);
    let h = write_file(storage, check, &loc, "big", &big).await;
    must(
        storage,
        check,
        read_all(storage, check, &loc, &h).await == big,
        || "a file read back differs from what was written".to_string(),
    );
    let small = pattern(10, 2);
    let hs = ok(
        storage,
        check,
        "write_state",
        storage.write_state(&loc, "small", small.clone()).await,
    );
    must(storage, check, hs.size() == 10, || {
        format!("handle of 10 bytes reports {} bytes", hs.size())
    });
    must(
        storage,
        check,
        read_all(storage, check, &loc, &hs).await == small,
        || "small state read back differs from what was written".to_string(),
    );
    // A second file in the same location leaves the first alone.
    let other = pattern(FILE_STATE_LEN + 1, 3);
    let h2 = write_file(storage, check, &loc, "big-2", &other).await;
    must(
        storage,
        check,
        read_all(storage, check, &loc, &h).await == big
            && read_all(storage, check, &loc, &h2).await == other,
        || "two files in one location interfere".to_string(),
    );
    match listing_of(storage, check, job, 1).await {
        Some(l) => must(storage, check, !l.complete && l.location == loc, || {
            format!(
                "a checkpoint without _metadata must be listed incomplete at its location: {l:?}"
            )
        }),
        None => fail(
            storage,
            check,
            "a location holding a state file is not listed".to_string(),
        ),
    }
}

/// `_metadata` reads back equal to what was written, and the handles in it read back their
/// state.
pub async fn check_metadata_round_trip(storage: &dyn CheckpointStorage) {
    let check = "metadata_round_trip";
    let job = fresh_job(storage, check).await;
    let (loc, md) = write_complete(storage, check, job, 4).await;
    let back = ok(
        storage,
        check,
        "read_metadata",
        storage.read_metadata(&loc).await,
    );
    must(storage, check, back == md, || {
        format!("metadata read back differs:\n wrote {md:?}\n read  {back:?}")
    });
    let handle = &back.operators[0].subtasks[&0].keyed[0].stream;
    must(
        storage,
        check,
        read_all(storage, check, &loc, handle).await == pattern(FILE_STATE_LEN, 4),
        || "state read through a handle from _metadata differs".to_string(),
    );
    let inline = &back.operators[0].subtasks[&0].operator[0].stream;
    must(
        storage,
        check,
        read_all(storage, check, &loc, inline).await.is_empty(),
        || "empty state read through a handle from _metadata is not empty".to_string(),
    );
}

/// A checkpoint is incomplete until `_metadata` is written and complete right after; writing
/// `_metadata` again replaces it whole.
pub async fn check_metadata_marks_complete(storage: &dyn CheckpointStorage) {
    let check = "metadata_marks_complete";
    let job = fresh_job(storage, check).await;
    let loc = ok(
        storage,
        check,
        "init_location",
        storage.init_location(job, CheckpointId(2)).await,
    );
    let file = write_file(storage, check, &loc, "s", &pattern(FILE_STATE_LEN, 9)).await;
    let listed = listing_of(storage, check, job, 2).await;
    must(
        storage,
        check,
        matches!(&listed, Some(l) if !l.complete),
        || format!("before _metadata the checkpoint must be listed incomplete: {listed:?}"),
    );
    expect_not_found(
        storage,
        check,
        "read_metadata before write_metadata",
        storage.read_metadata(&loc).await,
    );
    let md = sample_metadata(job, 2, file.clone(), StreamStateHandle::Inline(vec![1, 2]));
    ok(
        storage,
        check,
        "write_metadata",
        storage.write_metadata(&loc, &md).await,
    );
    let listed = listing_of(storage, check, job, 2).await;
    must(
        storage,
        check,
        matches!(&listed, Some(l) if l.complete),
        || format!("after write_metadata the checkpoint must be listed complete: {listed:?}"),
    );
    let mut md2 = sample_metadata(job, 2, file, StreamStateHandle::Inline(vec![3; 100]));
    md2.job_name = "rewritten".to_string();
    ok(
        storage,
        check,
        "write_metadata (again)",
        storage.write_metadata(&loc, &md2).await,
    );
    let back = ok(
        storage,
        check,
        "read_metadata",
        storage.read_metadata(&loc).await,
    );
    must(storage, check, back == md2, || {
        "a second write_metadata must replace the first whole".to_string()
    });
}

/// Reading `_metadata` where there is none is a `Storage` error of kind `NotFound`.
pub async fn check_missing_metadata_is_not_found(storage: &dyn CheckpointStorage) {
    let check = "missing_metadata";
    let job = fresh_job(storage, check).await;
    let loc = CheckpointLocation::for_checkpoint(job, CheckpointId(77));
    expect_not_found(
        storage,
        check,
        "read_metadata of a location never written",
        storage.read_metadata(&loc).await,
    );
}

/// Ranged reads return exactly the range, for files and inline handles; a range outside the
/// data is an error.
pub async fn check_ranged_reads(storage: &dyn CheckpointStorage) {
    let check = "ranged_reads";
    let job = fresh_job(storage, check).await;
    let loc = ok(
        storage,
        check,
        "init_location",
        storage.init_location(job, CheckpointId(1)).await,
    );
    let big = pattern(FILE_STATE_LEN, 5);
    let file = write_file(storage, check, &loc, "ranged", &big).await;
    let small = pattern(100, 6);
    let inline = ok(
        storage,
        check,
        "write_state",
        storage
            .write_state(&loc, "ranged-small", small.clone())
            .await,
    );
    for (handle, data) in [(&file, &big), (&inline, &small)] {
        let n = data.len() as u64;
        for (a, b) in [
            (0, 0),
            (0, 1),
            (0, n),
            (10, 20),
            (n / 3, n / 2),
            (n - 1, n),
            (n, n),
        ] {
            let got = ok(
                storage,
                check,
                &format!("read_state range {a}..{b} of {n} bytes"),
                storage.read_state(&loc, handle, Some((a, b))).await,
            );
            must(
                storage,
                check,
                got[..] == data[a as usize..b as usize],
                || format!("range {a}..{b} of {n} bytes returned the wrong bytes ({handle:?})"),
            );
        }
        for (a, b) in [(0, n + 1), (n + 1, n + 2), (20, 10)] {
            let _ = err(
                storage,
                check,
                &format!("read_state range {a}..{b} outside {n} bytes"),
                storage.read_state(&loc, handle, Some((a, b))).await,
            );
        }
    }
}

/// Whether state is inlined depends only on its size, and monotonically: once a size is written
/// as a file, every larger size is too. [`FILE_STATE_LEN`] bytes must be a file. Every handle
/// reads back its bytes.
pub async fn check_inline_is_monotonic(storage: &dyn CheckpointStorage) {
    let check = "inline_is_monotonic";
    let job = fresh_job(storage, check).await;
    let loc = ok(
        storage,
        check,
        "init_location",
        storage.init_location(job, CheckpointId(1)).await,
    );
    let mut seen_file_at: Option<usize> = None;
    for len in [
        0,
        1,
        100,
        4096,
        20 * 1024,
        20 * 1024 + 1,
        64 * 1024,
        FILE_STATE_LEN,
    ] {
        let data = pattern(len, 7);
        let name = format!("s{len}");
        let handle = ok(
            storage,
            check,
            "write_state",
            storage.write_state(&loc, &name, data.clone()).await,
        );
        must(storage, check, handle.size() == len as u64, || {
            format!("handle for {len} bytes reports {} bytes", handle.size())
        });
        match &handle {
            StreamStateHandle::Inline(bytes) => {
                must(storage, check, bytes[..] == data[..], || {
                    format!("inline handle for {len} bytes holds other bytes")
                });
                if let Some(at) = seen_file_at {
                    fail(
                        storage,
                        check,
                        format!("{len} bytes were inlined although {at} bytes became a file"),
                    );
                }
            }
            StreamStateHandle::LegacyFile { .. } => fail(
                storage,
                check,
                format!("write_state returned a legacy handle: {handle:?}"),
            ),
            StreamStateHandle::File { path, digest, .. } => {
                must(
                    storage,
                    check,
                    *path == name && *digest == Digest::of(&data),
                    || format!("file handle for {len} bytes is wrong: {handle:?}"),
                );
                seen_file_at.get_or_insert(len);
            }
        }
        must(
            storage,
            check,
            read_all(storage, check, &loc, &handle).await == data,
            || format!("state of {len} bytes read back differs"),
        );
    }
    must(
        storage,
        check,
        seen_file_at.is_some_and(|at| at <= FILE_STATE_LEN),
        || format!("{FILE_STATE_LEN} bytes of state must be written as a file"),
    );
}

/// State of exactly `threshold` bytes is inlined; one byte more becomes a file. Not part of
/// [`run_all`], which cannot know the threshold a storage was configured with.
pub async fn check_inline_threshold(storage: &dyn CheckpointStorage, threshold: usize) {
    let check = "inline_threshold";
    let job = fresh_job(storage, check).await;
    let loc = ok(
        storage,
        check,
        "init_location",
        storage.init_location(job, CheckpointId(1)).await,
    );
    let at = pattern(threshold, 8);
    let handle = ok(
        storage,
        check,
        "write_state",
        storage.write_state(&loc, "at", at.clone()).await,
    );
    must(
        storage,
        check,
        matches!(&handle, StreamStateHandle::Inline(b) if b[..] == at[..]),
        || format!("{threshold} bytes (the threshold) must be inlined, got {handle:?}"),
    );
    let above = pattern(threshold + 1, 8);
    let handle = write_file(storage, check, &loc, "above", &above).await;
    must(
        storage,
        check,
        read_all(storage, check, &loc, &handle).await == above,
        || "state just above the threshold read back differs".to_string(),
    );
}

/// A file that no longer matches its handle (changed bytes, truncated, grown) is `Corrupt`
/// naming the file; a missing one is `NotFound`. The damage is done by overwriting the file
/// through `write_state`, so no raw access is needed.
pub async fn check_state_corruption_detected(storage: &dyn CheckpointStorage) {
    let check = "state_corruption";
    let job = fresh_job(storage, check).await;
    let loc = ok(
        storage,
        check,
        "init_location",
        storage.init_location(job, CheckpointId(3)).await,
    );
    let names = format!("{}victim", loc.dir);
    let original = pattern(FILE_STATE_LEN, 10);
    let handle = write_file(storage, check, &loc, "victim", &original).await;

    let mut flipped = original.to_vec();
    flipped[FILE_STATE_LEN / 2] ^= 0x40;
    write_file(storage, check, &loc, "victim", &Bytes::from(flipped)).await;
    expect_corrupt(
        storage,
        check,
        "full read of a file with a flipped byte",
        storage.read_state(&loc, &handle, None).await,
        &names,
    );

    let truncated = original.slice(..FILE_STATE_LEN - 100);
    write_file(storage, check, &loc, "victim", &truncated).await;
    expect_corrupt(
        storage,
        check,
        "full read of a truncated file",
        storage.read_state(&loc, &handle, None).await,
        &names,
    );
    let n = FILE_STATE_LEN as u64;
    let _ = err(
        storage,
        check,
        "ranged read past the end of a truncated file",
        storage.read_state(&loc, &handle, Some((n - 10, n))).await,
    );

    let mut grown = original.to_vec();
    grown.extend_from_slice(b"tail");
    write_file(storage, check, &loc, "victim", &Bytes::from(grown)).await;
    expect_corrupt(
        storage,
        check,
        "full read of a file longer than its handle",
        storage.read_state(&loc, &handle, None).await,
        &names,
    );

    let missing = StreamStateHandle::File {
        path: "never-written".to_string(),
        size: 5,
        digest: Digest([0; 16]),
    };
    expect_not_found(
        storage,
        check,
        "read of a missing file",
        storage.read_state(&loc, &missing, None).await,
    );
}

/// Shared state: a file written beside one checkpoint's location is read through the handle from
/// another's, outlives the discard of the location it was written from, and goes only with
/// [`CheckpointStorage::discard_state`], which is idempotent.
pub async fn check_shared_state(storage: &dyn CheckpointStorage) {
    let check = "shared_state";
    let job = fresh_job(storage, check).await;
    let first = ok(
        storage,
        check,
        "init_location",
        storage.init_location(job, CheckpointId(5)).await,
    );
    let second = ok(
        storage,
        check,
        "init_location",
        storage.init_location(job, CheckpointId(6)).await,
    );
    let data = pattern(FILE_STATE_LEN, 41);
    let handle = ok(
        storage,
        check,
        "write_shared_state",
        storage
            .write_shared_state(&first, "base-keyed", data.clone())
            .await,
    );
    match &handle {
        StreamStateHandle::LegacyFile { .. } => fail(
            storage,
            check,
            format!("write_shared_state returned a legacy handle: {handle:?}"),
        ),
        StreamStateHandle::File { path, size, digest } => {
            must(storage, check, path == "../shared/base-keyed", || {
                format!("a shared file's path must be ../shared/<name>, got {path:?}")
            });
            must(
                storage,
                check,
                *size == data.len() as u64 && *digest == Digest::of(&data),
                || "the shared file's handle has the wrong size or digest".to_string(),
            );
        }
        StreamStateHandle::Inline(_) => fail(
            storage,
            check,
            "state this large must be written as a shared file, not inlined".to_string(),
        ),
    }
    must(storage, check, super::is_shared(&handle), || {
        format!("is_shared should recognise {handle:?}")
    });
    let read = ok(
        storage,
        check,
        "read_state of a shared file from another checkpoint's location",
        storage.read_state(&second, &handle, None).await,
    );
    must(storage, check, read == data, || {
        "a shared file read back other bytes".to_string()
    });
    ok(storage, check, "discard", storage.discard(&first).await);
    let read = ok(
        storage,
        check,
        "read_state of a shared file after the location it was written from was discarded",
        storage.read_state(&second, &handle, None).await,
    );
    must(storage, check, read == data, || {
        "a shared file changed when a checkpoint location was discarded".to_string()
    });
    ok(
        storage,
        check,
        "discard_state",
        storage.discard_state(&second, &handle).await,
    );
    expect_not_found(
        storage,
        check,
        "read_state after discard_state",
        storage.read_state(&second, &handle, None).await,
    );
    ok(
        storage,
        check,
        "discard_state (again)",
        storage.discard_state(&second, &handle).await,
    );
    let small = ok(
        storage,
        check,
        "write_shared_state (small)",
        storage
            .write_shared_state(&second, "tiny-keyed", Bytes::from_static(b"tiny"))
            .await,
    );
    // Inlined below the storage's threshold, or a shared file: either way it reads back.
    must(
        storage,
        check,
        match &small {
            StreamStateHandle::Inline(b) => b == b"tiny" && !super::is_shared(&small),
            StreamStateHandle::File { .. } | StreamStateHandle::LegacyFile { .. } => {
                super::is_shared(&small)
            }
        },
        || format!("four bytes of shared state: unexpected handle {small:?}"),
    );
    let read = ok(
        storage,
        check,
        "read_state of small shared state",
        storage.read_state(&second, &small, None).await,
    );
    must(storage, check, read.as_ref() == b"tiny", || {
        "small shared state read back other bytes".to_string()
    });
    ok(
        storage,
        check,
        "discard_state of small shared state",
        storage.discard_state(&second, &small).await,
    );
    ok(storage, check, "discard", storage.discard(&second).await);
}

/// Discarding removes the checkpoint and everything in it; discarding again, or discarding a
/// location never written, is `Ok`.
pub async fn check_discard_idempotent(storage: &dyn CheckpointStorage) {
    let check = "discard_idempotent";
    let job = fresh_job(storage, check).await;
    let (loc, md) = write_complete(storage, check, job, 5).await;
    let (keep, _) = write_complete(storage, check, job, 6).await;
    ok(storage, check, "discard", storage.discard(&loc).await);
    must(
        storage,
        check,
        listing_of(storage, check, job, 5).await.is_none(),
        || "a discarded checkpoint is still listed".to_string(),
    );
    expect_not_found(
        storage,
        check,
        "read_metadata after discard",
        storage.read_metadata(&loc).await,
    );
    let file = &md.operators[0].subtasks[&0].keyed[0].stream;
    expect_not_found(
        storage,
        check,
        "read_state after discard",
        storage.read_state(&loc, file, None).await,
    );
    ok(
        storage,
        check,
        "discard (again)",
        storage.discard(&loc).await,
    );
    let never = CheckpointLocation::for_checkpoint(job, CheckpointId(999));
    ok(
        storage,
        check,
        "discard of a location never written",
        storage.discard(&never).await,
    );
    must(
        storage,
        check,
        matches!(listing_of(storage, check, job, 6).await, Some(l) if l.complete),
        || "discarding chk-5 disturbed chk-6".to_string(),
    );
    ok(
        storage,
        check,
        "read_metadata of the neighbour",
        storage.read_metadata(&keep).await,
    );
}

/// `lock_job` is a conditional create: of two lockers of one job directory only the first
/// succeeds, the second is refused as `Locked` naming the holder; other jobs are not affected;
/// `unlock_job` frees the directory, and is idempotent. (Racing lockers:
/// [`check_job_lock_race`].)
pub async fn check_job_lock(storage: &dyn CheckpointStorage) {
    let check = "job_lock";
    let job = fresh_job(storage, check).await;
    let other = JobId::from_name("weir-conformance/job_lock/other");
    // A lock left by an earlier run of the suite on the same storage.
    ok(
        storage,
        check,
        "unlock before",
        storage.unlock_job(job).await,
    );
    ok(
        storage,
        check,
        "unlock before",
        storage.unlock_job(other).await,
    );
    ok(storage, check, "lock", storage.lock_job(job, "run a").await);
    let winner = "run a";
    match storage.lock_job(job, "run c").await {
        Err(CheckpointError::Locked { holder, .. }) => {
            must(storage, check, holder.contains(winner), || {
                format!("the refusal must name the holder {winner:?}, it says {holder:?}")
            });
        }
        other => fail(
            storage,
            check,
            format!("a third locker must be refused as Locked, got {other:?}"),
        ),
    }
    ok(
        storage,
        check,
        "lock of another job",
        storage.lock_job(other, "x").await,
    );
    ok(storage, check, "unlock", storage.unlock_job(job).await);
    ok(
        storage,
        check,
        "unlock (again)",
        storage.unlock_job(job).await,
    );
    ok(
        storage,
        check,
        "lock after unlock",
        storage.lock_job(job, "run d").await,
    );
    ok(storage, check, "unlock", storage.unlock_job(job).await);
    ok(
        storage,
        check,
        "unlock other",
        storage.unlock_job(other).await,
    );
}

/// Lockers racing for one job directory: exactly one wins, every round. Needs a service whose
/// conditional create is atomic (a local file system's `O_EXCL`, AWS S3's `If-None-Match`);
/// the `s3s-fs` test server checks for the object before it writes, so it is not run there.
pub async fn check_job_lock_race(storage: &dyn CheckpointStorage) {
    let check = "job_lock_race";
    let job = fresh_job(storage, check).await;
    for round in 0..20 {
        ok(
            storage,
            check,
            "unlock before",
            storage.unlock_job(job).await,
        );
        let (a, b) = futures::join!(
            storage.lock_job(job, "run a"),
            storage.lock_job(job, "run b")
        );
        must(storage, check, a.is_ok() != b.is_ok(), || {
            format!("round {round}: two racing lockers must give one success: {a:?}, {b:?}")
        });
    }
    ok(storage, check, "unlock", storage.unlock_job(job).await);
}

/// `list_checkpoints` and `find_checkpoints` report every `chk-<n>` sorted by numeric id,
/// partial ones as incomplete, and nothing for paths without checkpoints.
pub async fn check_list_and_find(storage: &dyn CheckpointStorage) {
    let check = "list_and_find";
    let job = fresh_job(storage, check).await;
    write_complete(storage, check, job, 10).await;
    write_complete(storage, check, job, 1).await;
    let partial = ok(
        storage,
        check,
        "init_location",
        storage.init_location(job, CheckpointId(2)).await,
    );
    write_file(storage, check, &partial, "s", &pattern(FILE_STATE_LEN, 2)).await;
    // Initialised but empty: services without directories may not list it at all.
    ok(
        storage,
        check,
        "init_location",
        storage.init_location(job, CheckpointId(3)).await,
    );

    let listed = ok(
        storage,
        check,
        "list_checkpoints",
        storage.list_checkpoints(job).await,
    );
    let summary: Vec<(u64, bool)> = listed.iter().map(|l| (l.id.0, l.complete)).collect();
    let with_empty = vec![(1, true), (2, false), (3, false), (10, true)];
    let without_empty = vec![(1, true), (2, false), (10, true)];
    must(
        storage,
        check,
        summary == with_empty || summary == without_empty,
        || format!("list_checkpoints should be {with_empty:?} (chk-3 optional), got {summary:?}"),
    );
    for l in &listed {
        must(
            storage,
            check,
            l.location == CheckpointLocation::for_checkpoint(job, l.id),
            || format!("listing of chk-{} has location {:?}", l.id, l.location),
        );
    }

    let found = ok(
        storage,
        check,
        "find_checkpoints(<job>)",
        storage.find_checkpoints(&job.to_string()).await,
    );
    must(storage, check, found == listed, || {
        format!("find_checkpoints(<job>) differs from list_checkpoints: {found:?}")
    });
    let found = ok(
        storage,
        check,
        "find_checkpoints(<job>/)",
        storage.find_checkpoints(&format!("{job}/")).await,
    );
    must(storage, check, found == listed, || {
        format!("find_checkpoints(<job>/) differs from list_checkpoints: {found:?}")
    });

    let found = ok(
        storage,
        check,
        "find_checkpoints(<job>/chk-10)",
        storage.find_checkpoints(&format!("{job}/chk-10")).await,
    );
    let expected = vec![CheckpointListing {
        id: CheckpointId(10),
        location: CheckpointLocation::for_checkpoint(job, CheckpointId(10)),
        complete: true,
    }];
    must(storage, check, found == expected, || {
        format!("find_checkpoints(<job>/chk-10) should be {expected:?}, got {found:?}")
    });

    let found = ok(
        storage,
        check,
        "find_checkpoints(<job>/chk-2/)",
        storage.find_checkpoints(&format!("{job}/chk-2/")).await,
    );
    must(
        storage,
        check,
        found.len() == 1 && found[0].id == CheckpointId(2) && !found[0].complete,
        || format!("find_checkpoints(<job>/chk-2/) should be chk-2, incomplete: {found:?}"),
    );

    let found = ok(
        storage,
        check,
        "find_checkpoints(<job>/chk-3)",
        storage.find_checkpoints(&format!("{job}/chk-3")).await,
    );
    let chk3: Vec<CheckpointListing> = listed
        .iter()
        .filter(|l| l.id == CheckpointId(3))
        .cloned()
        .collect();
    must(storage, check, found == chk3, || {
        format!(
            "find_checkpoints(<job>/chk-3) (initialised, empty) should agree with list_checkpoints: {chk3:?}, got {found:?}"
        )
    });

    let found = ok(
        storage,
        check,
        "find_checkpoints(\"\")",
        storage.find_checkpoints("").await,
    );
    let ours: Vec<CheckpointListing> = found
        .iter()
        .filter(|l| l.location.dir.starts_with(&format!("{job}/")))
        .cloned()
        .collect();
    must(storage, check, ours == listed, || {
        format!(
            "find_checkpoints(\"\") should include this job's checkpoints {listed:?}, got {ours:?}"
        )
    });
    must(
        storage,
        check,
        found.windows(2).all(|w| w[0].id <= w[1].id),
        || format!("find_checkpoints(\"\") is not sorted by id: {found:?}"),
    );

    for path in [
        "weir-conformance-no-such-dir".to_string(),
        format!("{job}/chk-404"),
        format!("{job}/chk-10/no-such-subdir"),
    ] {
        let found = ok(
            storage,
            check,
            "find_checkpoints",
            storage.find_checkpoints(&path).await,
        );
        must(storage, check, found.is_empty(), || {
            format!("find_checkpoints({path:?}) should be empty, got {found:?}")
        });
    }
    let other = JobId::from_name("weir-conformance/never-ran");
    let none = ok(
        storage,
        check,
        "list_checkpoints",
        storage.list_checkpoints(other).await,
    );
    must(storage, check, none.is_empty(), || {
        format!("list_checkpoints of a job never run should be empty, got {none:?}")
    });
}

/// Names that are not plain file names (or that are reserved for `_metadata`) are rejected with
/// a `Config` error, whatever the size of the state.
pub async fn check_name_validation(storage: &dyn CheckpointStorage) {
    let check = "name_validation";
    let job = fresh_job(storage, check).await;
    let loc = ok(
        storage,
        check,
        "init_location",
        storage.init_location(job, CheckpointId(1)).await,
    );
    for name in [
        "",
        ".",
        "..",
        "a/b",
        "../escape",
        "/absolute",
        "trailing/",
        "_metadata",
        "_metadata.inprogress",
    ] {
        for len in [10, FILE_STATE_LEN] {
            let r = storage.write_state(&loc, name, pattern(len, 1)).await;
            must(
                storage,
                check,
                matches!(r, Err(CheckpointError::Config(_))),
                || {
                    format!(
                        "write_state with name {name:?} ({len} bytes) should be a Config error, got {r:?}"
                    )
                },
            );
        }
    }
    let listed = listing_of(storage, check, job, 1).await;
    must(
        storage,
        check,
        listed.as_ref().is_none_or(|l| !l.complete),
        || format!("a rejected name must not complete a checkpoint: {listed:?}"),
    );
}

// ---------------------------------------------------------------------------------------------
// Checks that need raw access.

/// Names of the entries directly in `dir`, through the raw operator.
async fn raw_names(
    storage: &dyn CheckpointStorage,
    check: &str,
    raw: &Operator,
    dir: &str,
) -> Vec<String> {
    ok(storage, check, "raw list", raw.list(dir).await)
        .iter()
        .filter_map(|e| {
            e.path()
                .strip_prefix(dir)
                .map(|n| n.trim_end_matches('/').to_string())
        })
        .filter(|n| !n.is_empty())
        .collect()
}

/// After `write_metadata` no `_metadata.inprogress` (or any other temporary) is left beside
/// `_metadata`.
pub async fn check_no_inprogress_left(storage: &dyn CheckpointStorage, raw: &Operator) {
    let check = "no_inprogress_left";
    let job = fresh_job(storage, check).await;
    let (loc, _) = write_complete(storage, check, job, 1).await;
    let mut names = raw_names(storage, check, raw, &loc.dir).await;
    names.sort();
    must(storage, check, names == ["_metadata", "keyed-0"], || {
        format!(
            "after write_metadata the location should hold exactly _metadata and the state file, got {names:?}"
        )
    });
}

/// A `_metadata.inprogress` alone (a crash before the rename) does not make a checkpoint
/// complete.
pub async fn check_inprogress_alone_is_incomplete(storage: &dyn CheckpointStorage, raw: &Operator) {
    let check = "inprogress_alone";
    let job = fresh_job(storage, check).await;
    let loc = ok(
        storage,
        check,
        "init_location",
        storage.init_location(job, CheckpointId(1)).await,
    );
    let md = sample_metadata(
        job,
        1,
        StreamStateHandle::Inline(vec![1]),
        StreamStateHandle::Inline(vec![]),
    );
    let bytes = ok(storage, check, "to_bytes", md.to_bytes());
    let path = format!("{}_metadata.inprogress", loc.dir);
    ok(storage, check, "raw write", raw.write(&path, bytes).await);
    let listed = listing_of(storage, check, job, 1).await;
    must(
        storage,
        check,
        matches!(&listed, Some(l) if !l.complete),
        || {
            format!(
                "a checkpoint with only _metadata.inprogress must be listed incomplete: {listed:?}"
            )
        },
    );
    expect_not_found(
        storage,
        check,
        "read_metadata with only _metadata.inprogress",
        storage.read_metadata(&loc).await,
    );
}

/// A damaged `_metadata` (a flipped byte, truncated, empty, garbage) is `Corrupt` naming the
/// file, while the checkpoint is still listed as complete (its presence is what completes it).
pub async fn check_metadata_corruption_detected(storage: &dyn CheckpointStorage, raw: &Operator) {
    let check = "metadata_corruption";
    let job = fresh_job(storage, check).await;
    let (loc, _) = write_complete(storage, check, job, 1).await;
    let path = loc.metadata_path();
    let good = ok(storage, check, "raw read", raw.read(&path).await).to_vec();
    let mut flipped = good.clone();
    let mid = flipped.len() / 2;
    flipped[mid] ^= 0x01;
    let damaged: [(&str, Vec<u8>); 4] = [
        ("a flipped byte", flipped),
        ("truncated", good[..good.len() - 5].to_vec()),
        ("empty", Vec::new()),
        ("garbage", b"this is not a checkpoint".to_vec()),
    ];
    for (what, bytes) in damaged {
        ok(storage, check, "raw write", raw.write(&path, bytes).await);
        expect_corrupt(
            storage,
            check,
            &format!("read_metadata of _metadata with {what}"),
            storage.read_metadata(&loc).await,
            &path,
        );
        must(
            storage,
            check,
            matches!(listing_of(storage, check, job, 1).await, Some(l) if l.complete),
            || {
                format!(
                    "a checkpoint whose _metadata is {what} should still be listed complete (presence completes it)"
                )
            },
        );
    }
}
