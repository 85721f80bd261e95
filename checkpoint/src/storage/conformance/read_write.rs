//! Conformance of writing and reading back: state, `_metadata` and what completes a
//! checkpoint, missing metadata, and ranged reads.

use super::FILE_STATE_LEN;
use super::helpers::{
    err, expect_not_found, fail, fresh_job, listing_of, must, ok, pattern, read_all,
    sample_metadata, write_complete, write_file,
};
use crate::storage::{CheckpointLocation, CheckpointStorage};
use weir_core::handle::StreamStateHandle;
use weir_core::ids::CheckpointId;

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
