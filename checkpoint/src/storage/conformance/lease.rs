//! Conformance checks of a job directory's lock generations (take over, renew, release) and of
//! the file listing and deletion that garbage collection uses.

use super::helpers::{err, fail, fresh_job, must, ok, pattern, write_complete};
use crate::CheckpointError;
use crate::storage::CheckpointStorage;
use weir_core::ids::JobId;

/// Lock generations: `take_lock` of a generation is a conditional create; the newest
/// generation is what `read_lock` reports; a holder whose directory was taken over (a newer
/// generation exists) or whose lock is gone is refused a renewal as `LockLost`, naming the new
/// holder; a renewal rewrites the content; `release_lock(g)` deletes generations up to `g` only,
/// and nothing while a newer generation exists.
pub async fn check_lock_generations(storage: &dyn CheckpointStorage) {
    let check = "lock_generations";
    let job = fresh_job(storage, check).await;
    ok(
        storage,
        check,
        "release before",
        storage.release_lock(job, u64::MAX).await,
    );
    let none = ok(
        storage,
        check,
        "read_lock (free)",
        storage.read_lock(job).await,
    );
    must(storage, check, none.is_none(), || {
        format!("a free directory has no lock, got {none:?}")
    });
    ok(
        storage,
        check,
        "take 0",
        storage.take_lock(job, 0, "run a\nrenewal 0").await,
    );
    let a = ok(storage, check, "read_lock", storage.read_lock(job).await);
    must(
        storage,
        check,
        a.as_ref()
            .is_some_and(|l| l.generation == 0 && l.content == "run a\nrenewal 0"),
        || format!("read_lock must return generation 0 as written, got {a:?}"),
    );
    match storage.take_lock(job, 0, "run x").await {
        Err(CheckpointError::Locked { holder, .. }) => {
            must(storage, check, holder == "run a", || {
                format!("the refusal must name the holder by its first line, got {holder:?}")
            })
        }
        other => fail(
            storage,
            check,
            format!("taking a held generation must be refused as Locked, got {other:?}"),
        ),
    }
    ok(
        storage,
        check,
        "renew 0",
        storage.renew_lock(job, 0, "run a\nrenewal 1").await,
    );
    let renewed = ok(storage, check, "read_lock", storage.read_lock(job).await);
    must(
        storage,
        check,
        renewed
            .as_ref()
            .is_some_and(|l| l.content == "run a\nrenewal 1"),
        || format!("a renewal must rewrite the content, got {renewed:?}"),
    );
    check_takeover(storage, check, job).await;
}

/// The second half of [`check_lock_generations`]: run b takes over the directory that run a
/// holds (generation 0), and run a loses it.
async fn check_takeover(storage: &dyn CheckpointStorage, check: &str, job: JobId) {
    // Run b takes the directory over.
    ok(
        storage,
        check,
        "take 1",
        storage.take_lock(job, 1, "run b\nrenewal 0").await,
    );
    let b = ok(storage, check, "read_lock", storage.read_lock(job).await);
    must(
        storage,
        check,
        b.as_ref()
            .is_some_and(|l| l.generation == 1 && l.content.starts_with("run b")),
        || format!("the newest generation is the lock, got {b:?}"),
    );
    match storage.renew_lock(job, 0, "run a\nrenewal 2").await {
        Err(CheckpointError::LockLost { by, .. }) => must(storage, check, by == "run b", || {
            format!("LockLost must name the new holder, got {by:?}")
        }),
        other => fail(
            storage,
            check,
            format!("the old holder's renewal must be refused as LockLost, got {other:?}"),
        ),
    }
    let e = err(
        storage,
        check,
        "take 1 again",
        storage.take_lock(job, 1, "run c").await,
    );
    must(
        storage,
        check,
        matches!(e, CheckpointError::Locked { .. }),
        || format!("a second taker of generation 1 must be refused as Locked, got {e:?}"),
    );
    ok(
        storage,
        check,
        "renew 1",
        storage.renew_lock(job, 1, "run b\nrenewal 1").await,
    );
    // The old holder giving up (its own generation) leaves the new holder's lock.
    ok(
        storage,
        check,
        "release 0",
        storage.release_lock(job, 0).await,
    );
    let still = ok(storage, check, "read_lock", storage.read_lock(job).await);
    must(
        storage,
        check,
        still.as_ref().is_some_and(|l| l.generation == 1),
        || format!("releasing generation 0 must leave generation 1, got {still:?}"),
    );
    // ... and generation 0's file too: a new run taking generation 0 now would write beside the
    // holder of generation 1 without watching its lease.
    let e = err(
        storage,
        check,
        "take 0 after takeover",
        storage.take_lock(job, 0, "run d").await,
    );
    must(
        storage,
        check,
        matches!(e, CheckpointError::Locked { .. }),
        || format!("generation 0 must still be taken after a takeover, got {e:?}"),
    );
    ok(
        storage,
        check,
        "release 1",
        storage.release_lock(job, 1).await,
    );
    ok(
        storage,
        check,
        "release 1 (again)",
        storage.release_lock(job, 1).await,
    );
    let gone = ok(storage, check, "read_lock", storage.read_lock(job).await);
    must(storage, check, gone.is_none(), || {
        format!("after release the directory is free, got {gone:?}")
    });
    let e = err(
        storage,
        check,
        "renew released",
        storage.renew_lock(job, 1, "run b").await,
    );
    must(
        storage,
        check,
        matches!(e, CheckpointError::LockLost { .. }),
        || format!("renewing a released lock must be refused as LockLost, got {e:?}"),
    );
}

/// `list_files` lists every file under a directory, recursively, as root-relative paths
/// (checkpoint files, shared files, locks), and nothing for a missing directory; `delete_file`
/// deletes one file, is idempotent, and refuses a path that leaves the root.
pub async fn check_list_and_delete_files(storage: &dyn CheckpointStorage) {
    let check = "list_and_delete_files";
    let job = fresh_job(storage, check).await;
    let dir = format!("{job}/");
    for f in ok(storage, check, "list_files", storage.list_files(&dir).await) {
        ok(
            storage,
            check,
            "delete_file (clearing)",
            storage.delete_file(&f).await,
        );
    }
    let (loc, _) = write_complete(storage, check, job, 1).await;
    let shared = ok(
        storage,
        check,
        "write_shared_state",
        storage
            .write_shared_state(&loc, "link-1", pattern(super::FILE_STATE_LEN, 9))
            .await,
    );
    ok(
        storage,
        check,
        "take_lock",
        storage.take_lock(job, 0, "run").await,
    );
    let files = ok(storage, check, "list_files", storage.list_files(&dir).await);
    let expect = [
        format!("{dir}_lock"),
        format!("{dir}chk-1/_metadata"),
        format!("{dir}chk-1/keyed-0"),
        format!("{dir}shared/link-1"),
    ];
    for e in &expect {
        must(storage, check, files.contains(e), || {
            format!("list_files must list {e}, got {files:?}")
        });
    }
    must(
        storage,
        check,
        files
            .iter()
            .all(|f| f.starts_with(&dir) && !f.ends_with('/')),
        || format!("list_files must list only files under {dir}, got {files:?}"),
    );
    let mut sorted = files.clone();
    sorted.sort();
    must(storage, check, sorted == files, || {
        format!("list_files must sort, got {files:?}")
    });
    let chk = ok(
        storage,
        check,
        "list_files chk-1",
        storage.list_files(&loc.dir).await,
    );
    must(storage, check, chk.len() == 2, || {
        format!("chk-1 holds _metadata and keyed-0, got {chk:?}")
    });
    let missing = ok(
        storage,
        check,
        "list_files missing",
        storage.list_files(&format!("{dir}nothing/")).await,
    );
    must(storage, check, missing.is_empty(), || {
        format!("a missing directory has no files, got {missing:?}")
    });
    let target = format!("{dir}shared/link-1");
    ok(
        storage,
        check,
        "delete_file",
        storage.delete_file(&target).await,
    );
    ok(
        storage,
        check,
        "delete_file (again)",
        storage.delete_file(&target).await,
    );
    let after = ok(storage, check, "list_files", storage.list_files(&dir).await);
    must(storage, check, !after.contains(&target), || {
        format!("{target} must be gone, got {after:?}")
    });
    let read = storage.read_state(&loc, &shared, None).await;
    must(storage, check, read.is_err(), || {
        "a deleted file must not read back".to_string()
    });
    let e = err(
        storage,
        check,
        "delete_file ../",
        storage.delete_file(&format!("{dir}../x")).await,
    );
    must(
        storage,
        check,
        matches!(e, CheckpointError::Config(_)),
        || format!("a path with '..' must be refused as Config, got {e:?}"),
    );
    ok(
        storage,
        check,
        "release_lock",
        storage.release_lock(job, 0).await,
    );
    ok(storage, check, "discard", storage.discard(&loc).await);
}
