//! Conformance of `list_checkpoints` and `find_checkpoints`: every `chk-<n>` found, sorted, with
//! its completeness, and nothing where there are none.

use super::FILE_STATE_LEN;
use super::helpers::{fresh_job, must, ok, pattern, write_complete, write_file};
use crate::storage::{CheckpointListing, CheckpointLocation, CheckpointStorage};
use weir_core::ids::{CheckpointId, JobId};

/// `list_checkpoints` and `find_checkpoints` report every `chk-<n>` sorted by numeric id,
/// partial ones as incomplete, and nothing for paths without checkpoints.
pub async fn check_list_and_find(storage: &dyn CheckpointStorage) {
    let check = "list_and_find";
    let job = fresh_job(storage, check).await;
    write_listed_checkpoints(storage, check, job).await;
    let listed = list_and_check(storage, check, job).await;
    find_and_check(storage, check, job, &listed).await;
    find_nothing(storage, check, job).await;
}

/// Writes complete checkpoints 10 and 1, a partial 2 (one file, no `_metadata`) and an
/// initialised, empty 3.
async fn write_listed_checkpoints(storage: &dyn CheckpointStorage, check: &str, job: JobId) {
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
}

/// `list_checkpoints` of the job written by [`write_listed_checkpoints`]: 1, 2 (incomplete), 3
/// (incomplete, optional) and 10, each at its canonical location. Returns the listing.
async fn list_and_check(
    storage: &dyn CheckpointStorage,
    check: &str,
    job: JobId,
) -> Vec<CheckpointListing> {
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
    listed
}

/// `find_checkpoints` of the job's directory, of single `chk-<n>` directories and of the
/// storage root agrees with `listed` (the job's `list_checkpoints`).
async fn find_and_check(
    storage: &dyn CheckpointStorage,
    check: &str,
    job: JobId,
    listed: &[CheckpointListing],
) {
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
}

/// `find_checkpoints` of paths without checkpoints, and `list_checkpoints` of a job never run,
/// are empty.
async fn find_nothing(storage: &dyn CheckpointStorage, check: &str, job: JobId) {
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
