//! The helpers the conformance checks share: a fresh job per check, deterministic bytes,
//! assertions that name the check and the storage, and writing a complete checkpoint.

use super::FILE_STATE_LEN;
use crate::storage::{CheckpointListing, CheckpointLocation, CheckpointStorage};
use crate::{CheckpointError, CheckpointMetadata, OperatorState};
use bytes::Bytes;
use opendal::ErrorKind;
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

/// A job of the check's own, cleared of earlier runs.
pub(super) async fn fresh_job(storage: &dyn CheckpointStorage, check: &str) -> JobId {
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
pub(super) fn pattern(len: usize, seed: u8) -> Bytes {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ ((i >> 8) as u8))
        .collect::<Vec<u8>>()
        .into()
}

pub(super) fn ok<T, E: Debug>(
    storage: &dyn CheckpointStorage,
    check: &str,
    op: &str,
    r: Result<T, E>,
) -> T {
    match r {
        Ok(v) => v,
        Err(e) => panic!(
            "conformance [{check}] on {}: {op} failed unexpectedly: {e:?}",
            storage.describe()
        ),
    }
}

pub(super) fn fail(storage: &dyn CheckpointStorage, check: &str, msg: String) -> ! {
    panic!("conformance [{check}] on {}: {msg}", storage.describe())
}

pub(super) fn must(
    storage: &dyn CheckpointStorage,
    check: &str,
    cond: bool,
    msg: impl FnOnce() -> String,
) {
    if !cond {
        fail(storage, check, msg());
    }
}

pub(super) fn err<T: Debug>(
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
pub(super) fn expect_corrupt<T: Debug>(
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
pub(super) fn expect_not_found<T: Debug>(
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
pub(super) async fn write_file(
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

pub(super) async fn read_all(
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

pub(super) async fn listing_of(
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
pub(super) fn sample_metadata(
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
pub(super) async fn write_complete(
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
