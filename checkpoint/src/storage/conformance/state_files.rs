//! Conformance of state files: which names may hold state, what is inlined and what becomes a
//! file, and damaged files detected.

use super::FILE_STATE_LEN;
use super::helpers::{
    err, expect_corrupt, expect_not_found, fail, fresh_job, listing_of, must, ok, pattern,
    read_all, write_file,
};
use crate::CheckpointError;
use crate::storage::CheckpointStorage;
use bytes::Bytes;
use weir_core::handle::StreamStateHandle;
use weir_core::identity::Digest;
use weir_core::ids::CheckpointId;

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
/// [`run_all`](super::run_all), which cannot know the threshold a storage was configured with.
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
