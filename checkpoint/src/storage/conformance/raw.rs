//! Conformance checks that inspect or damage files behind the storage's back, through a raw
//! `opendal::Operator` over the same root: temporaries left, and damaged `_metadata`.

use super::helpers::{
    expect_corrupt, expect_not_found, fresh_job, listing_of, must, ok, sample_metadata,
    write_complete,
};
use crate::storage::CheckpointStorage;
use opendal::Operator;
use weir_core::handle::StreamStateHandle;
use weir_core::ids::CheckpointId;

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
