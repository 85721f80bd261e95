//! Conformance of what discarding removes: whole checkpoints, and shared state that outlives
//! the location it was written from.

use super::FILE_STATE_LEN;
use super::helpers::{
    expect_not_found, fail, fresh_job, listing_of, must, ok, pattern, write_complete,
};
use crate::storage::{CheckpointLocation, CheckpointStorage};
use bytes::Bytes;
use weir_core::handle::StreamStateHandle;
use weir_core::identity::Digest;
use weir_core::ids::CheckpointId;

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
    must(storage, check, crate::storage::is_shared(&handle), || {
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
            StreamStateHandle::Inline(b) => b == b"tiny" && !crate::storage::is_shared(&small),
            StreamStateHandle::File { .. } | StreamStateHandle::LegacyFile { .. } => {
                crate::storage::is_shared(&small)
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
