//! Conformance of `lock_job` and `unlock_job`: one holder of a job directory at a time, also
//! when lockers race.

use super::helpers::{fail, fresh_job, must, ok};
use crate::CheckpointError;
use crate::storage::CheckpointStorage;
use weir_core::ids::JobId;

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
