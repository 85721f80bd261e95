//! Runs the checkpoint-storage conformance suite against opendal's memory and fs services, and
//! tests what only a real filesystem shows: the on-disk layout, unwritable roots and damage done
//! to files behind the storage's back.

use bytes::Bytes;
use opendal::ErrorKind;
use weir_checkpoint::storage::conformance;
use weir_checkpoint::{
    CheckpointError, CheckpointLocation, CheckpointMetadata, CheckpointStorage,
    OpendalCheckpointStorage,
};
use weir_core::element::SnapshotKind;
use weir_core::handle::StreamStateHandle;
use weir_core::ids::{CheckpointId, JobId};

fn metadata(job: JobId, id: u64) -> CheckpointMetadata {
    CheckpointMetadata {
        job_id: job,
        job_name: "test".to_string(),
        checkpoint_id: CheckpointId(id),
        kind: SnapshotKind::Checkpoint,
        trigger_timestamp_ms: 1,
        completion_timestamp_ms: 2,
        weir_version: "test".to_string(),
        operators: Vec::new(),
        in_flight: Vec::new(),
        fingerprint: None,
        tuning: None,
        format_version: weir_checkpoint::metadata::METADATA_VERSION,
    }
}

fn assert_storage_error_naming(e: &CheckpointError, name: &str) {
    assert!(
        matches!(e, CheckpointError::Storage { path, .. } if path.contains(name)),
        "expected a Storage error naming {name}, got {e:?}"
    );
    assert!(
        e.to_string().contains(name),
        "message should name {name}: {e}"
    );
}

/// The memory service: one test per check.
mod memory {
    async fn make() -> weir_checkpoint::OpendalCheckpointStorage {
        weir_checkpoint::OpendalCheckpointStorage::memory().expect("a memory storage")
    }
    weir_checkpoint::checkpoint_storage_conformance!(make);
}

#[tokio::test]
async fn memory_passes_the_conformance_suite() {
    let storage = OpendalCheckpointStorage::memory().unwrap();
    assert_eq!(storage.describe(), "memory://");
    conformance::run_all_with_raw(&storage, storage.operator()).await;
    conformance::check_inline_threshold(&storage, storage.inline_threshold()).await;
    conformance::check_job_lock_race(&storage).await;
    // Running it again on the same storage works: each check clears its own job.
    conformance::run_all(&storage).await;
}

#[tokio::test]
async fn fs_passes_the_conformance_suite() {
    let dir = tempfile::tempdir().unwrap();
    let storage = OpendalCheckpointStorage::fs(dir.path()).unwrap();
    assert!(storage.operator().info().capability().rename);
    conformance::run_all_with_raw(&storage, storage.operator()).await;
    conformance::check_inline_threshold(&storage, storage.inline_threshold()).await;
    conformance::check_job_lock_race(&storage).await;
    conformance::run_all(&storage).await;
}

#[tokio::test]
async fn fs_below_a_missing_directory_passes_the_conformance_suite() {
    let dir = tempfile::tempdir().unwrap();
    let storage = OpendalCheckpointStorage::fs(dir.path().join("not/yet/there")).unwrap();
    conformance::run_all(&storage).await;
}

#[tokio::test]
async fn the_inline_threshold_is_configurable() {
    assert_eq!(
        OpendalCheckpointStorage::DEFAULT_INLINE_THRESHOLD,
        20 * 1024
    );
    for threshold in [0, 1, 100, 100 * 1024] {
        let storage = OpendalCheckpointStorage::memory()
            .unwrap()
            .with_inline_threshold(threshold);
        conformance::check_inline_threshold(&storage, threshold).await;
    }
    let dir = tempfile::tempdir().unwrap();
    let storage = OpendalCheckpointStorage::fs(dir.path())
        .unwrap()
        .with_inline_threshold(0);
    conformance::check_inline_threshold(&storage, 0).await;
    conformance::run_all(&storage).await;
}

#[tokio::test]
async fn fs_uses_flinks_layout_on_disk() {
    let dir = tempfile::tempdir().unwrap();
    let storage = OpendalCheckpointStorage::fs(dir.path())
        .unwrap()
        .with_inline_threshold(4);
    assert!(storage.describe().starts_with("file://"));
    assert!(storage.describe().ends_with(dir.path().to_str().unwrap()));
    let job = JobId::from_name("layout");
    let loc = storage.init_location(job, CheckpointId(7)).await.unwrap();
    let chk = dir.path().join(job.to_string()).join("chk-7");
    assert!(chk.is_dir(), "init_location creates the directory");

    let h = storage
        .write_state(&loc, "op-0", Bytes::from_static(b"0123456789"))
        .await
        .unwrap();
    assert_eq!(
        h,
        StreamStateHandle::File {
            path: "op-0".to_string(),
            size: 10,
            digest: weir_core::identity::Digest::of(b"0123456789")
        }
    );
    assert_eq!(std::fs::read(chk.join("op-0")).unwrap(), b"0123456789");
    let inline = storage
        .write_state(&loc, "op-1", Bytes::from_static(b"abc"))
        .await
        .unwrap();
    assert_eq!(inline, StreamStateHandle::Inline(b"abc".to_vec()));
    assert!(!chk.join("op-1").exists(), "inline state touches no file");

    storage
        .write_metadata(&loc, &metadata(job, 7))
        .await
        .unwrap();
    let mut names: Vec<String> = std::fs::read_dir(&chk)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(names, ["_metadata", "op-0"]);
    // The probe of check_writable leaves nothing behind.
    storage.check_writable().await.unwrap();
    let top: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
    assert_eq!(top.len(), 1, "only the job directory is at the root");
    // A root removed after construction is created again by check_writable.
    std::fs::remove_dir_all(dir.path()).unwrap();
    storage.check_writable().await.unwrap();
    assert!(dir.path().is_dir());
}

#[tokio::test]
async fn fs_root_below_a_regular_file_is_refused_naming_the_path() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("plain-file");
    std::fs::write(&file, b"not a directory").unwrap();
    let root = file.join("checkpoints");
    let e = OpendalCheckpointStorage::fs(&root).unwrap_err();
    assert_storage_error_naming(&e, root.to_str().unwrap());
}

#[tokio::test]
async fn fs_root_that_became_unwritable_fails_check_writable_init_and_write() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("parent").join("root");
    let storage = OpendalCheckpointStorage::fs(&root).unwrap();
    storage.check_writable().await.unwrap();
    // Now the root's parent becomes a regular file: the root is below a regular file.
    std::fs::remove_dir_all(dir.path().join("parent")).unwrap();
    std::fs::write(dir.path().join("parent"), b"in the way").unwrap();
    let root_name = root.to_str().unwrap();

    let e = storage.check_writable().await.unwrap_err();
    assert_storage_error_naming(&e, root_name);

    let job = JobId::from_name("unwritable");
    let e = storage
        .init_location(job, CheckpointId(1))
        .await
        .unwrap_err();
    assert_storage_error_naming(&e, root_name);
    assert_storage_error_naming(&e, &format!("{job}/chk-1"));

    let loc = CheckpointLocation::for_checkpoint(job, CheckpointId(1));
    let e = storage
        .write_state(&loc, "big", Bytes::from(vec![7u8; 64 * 1024]))
        .await
        .unwrap_err();
    assert_storage_error_naming(&e, &format!("{job}/chk-1/big"));

    let e = storage
        .write_metadata(&loc, &metadata(job, 1))
        .await
        .unwrap_err();
    assert_storage_error_naming(&e, root_name);
}

#[tokio::test]
async fn fs_corrupt_metadata_is_reported_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let storage = OpendalCheckpointStorage::fs(dir.path()).unwrap();
    let job = JobId::from_name("corrupt");
    let loc = storage.init_location(job, CheckpointId(3)).await.unwrap();
    storage
        .write_metadata(&loc, &metadata(job, 3))
        .await
        .unwrap();
    let file = dir
        .path()
        .join(job.to_string())
        .join("chk-3")
        .join("_metadata");
    let good = std::fs::read(&file).unwrap();
    assert_eq!(storage.read_metadata(&loc).await.unwrap(), metadata(job, 3));

    let mut flipped = good.clone();
    flipped[good.len() / 2] ^= 0x10;
    std::fs::write(&file, &flipped).unwrap();
    let e = storage.read_metadata(&loc).await.unwrap_err();
    match &e {
        CheckpointError::Corrupt { path, reason } => {
            assert!(path.contains(file.to_str().unwrap()), "{path}");
            assert!(reason.contains("checksum mismatch"), "{reason}");
        }
        other => panic!("expected Corrupt, got {other:?}"),
    }
    assert!(e.to_string().contains(file.to_str().unwrap()), "{e}");

    std::fs::write(&file, &good[..good.len() - 1]).unwrap();
    let e = storage.read_metadata(&loc).await.unwrap_err();
    assert!(
        matches!(&e, CheckpointError::Corrupt { path, reason }
            if path.contains(file.to_str().unwrap()) && reason.contains("length mismatch")),
        "{e:?}"
    );

    std::fs::write(&file, &good[..3]).unwrap();
    let e = storage.read_metadata(&loc).await.unwrap_err();
    assert!(
        matches!(&e, CheckpointError::Corrupt { reason, .. } if reason.contains("truncated")),
        "{e:?}"
    );

    std::fs::remove_file(&file).unwrap();
    let e = storage.read_metadata(&loc).await.unwrap_err();
    assert_eq!(e.storage_kind(), Some(ErrorKind::NotFound), "{e:?}");
    assert_storage_error_naming(&e, file.to_str().unwrap());
}

#[tokio::test]
async fn fs_corrupt_state_file_is_reported_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let storage = OpendalCheckpointStorage::fs(dir.path()).unwrap();
    let job = JobId::from_name("corrupt-state");
    let loc = storage.init_location(job, CheckpointId(1)).await.unwrap();
    let data = Bytes::from(vec![5u8; 100 * 1024]);
    let h = storage.write_state(&loc, "s", data.clone()).await.unwrap();
    let file = dir.path().join(job.to_string()).join("chk-1").join("s");
    let mut bytes = std::fs::read(&file).unwrap();
    bytes[10] = 6;
    std::fs::write(&file, &bytes).unwrap();
    let e = storage.read_state(&loc, &h, None).await.unwrap_err();
    assert!(
        matches!(&e, CheckpointError::Corrupt { path, reason }
            if path.contains(file.to_str().unwrap()) && reason.contains("digest mismatch")),
        "{e:?}"
    );
    // A ranged read skips the whole-file checksum (the caller's format covers it).
    let part = storage.read_state(&loc, &h, Some((0, 20))).await.unwrap();
    assert_eq!(part[10], 6);
    std::fs::write(&file, &bytes[..50]).unwrap();
    let e = storage.read_state(&loc, &h, None).await.unwrap_err();
    assert!(
        matches!(&e, CheckpointError::Corrupt { reason, .. } if reason.contains("truncated")),
        "{e:?}"
    );
    let e = storage
        .read_state(&loc, &h, Some((40, 60)))
        .await
        .unwrap_err();
    assert!(matches!(&e, CheckpointError::Corrupt { .. }), "{e:?}");
}

#[tokio::test]
async fn find_checkpoints_without_checkpoints_is_empty() {
    let dir = tempfile::tempdir().unwrap();
    let storage = OpendalCheckpointStorage::fs(dir.path()).unwrap();
    assert!(storage.find_checkpoints("").await.unwrap().is_empty());
    assert!(
        storage
            .find_checkpoints("nothing/here")
            .await
            .unwrap()
            .is_empty()
    );
    std::fs::create_dir_all(dir.path().join("other/stuff")).unwrap();
    std::fs::write(dir.path().join("other/file"), b"x").unwrap();
    assert!(storage.find_checkpoints("").await.unwrap().is_empty());
    assert!(storage.find_checkpoints("other").await.unwrap().is_empty());
    let memory = OpendalCheckpointStorage::memory().unwrap();
    assert!(memory.find_checkpoints("").await.unwrap().is_empty());
    assert!(
        memory
            .list_checkpoints(JobId::from_name("none"))
            .await
            .unwrap()
            .is_empty()
    );
}

#[tokio::test]
async fn listing_ignores_what_is_not_a_checkpoint_directory() {
    let dir = tempfile::tempdir().unwrap();
    let storage = OpendalCheckpointStorage::fs(dir.path()).unwrap();
    let job = JobId::from_name("ignore");
    let loc = storage.init_location(job, CheckpointId(2)).await.unwrap();
    storage
        .write_metadata(&loc, &metadata(job, 2))
        .await
        .unwrap();
    let jobdir = dir.path().join(job.to_string());
    for d in [
        "shared",
        "taskowned",
        "chk-abc",
        "chk-007",
        "chk-",
        "savepoint-x",
    ] {
        std::fs::create_dir_all(jobdir.join(d)).unwrap();
        std::fs::write(jobdir.join(d).join("_metadata"), b"x").unwrap();
    }
    std::fs::write(jobdir.join("chk-9"), b"a file, not a directory").unwrap();
    // A directory at the root that is not a job id is not searched.
    std::fs::create_dir_all(dir.path().join("not-a-job/chk-5")).unwrap();
    std::fs::write(dir.path().join("not-a-job/chk-5/_metadata"), b"x").unwrap();

    let listed = storage.list_checkpoints(job).await.unwrap();
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!((listed[0].id, listed[0].complete), (CheckpointId(2), true));
    assert_eq!(storage.find_checkpoints("").await.unwrap(), listed);
    // A directory holding _metadata directly is found as itself, its id read from the file.
    let sp = storage
        .find_checkpoints(&format!("{job}/savepoint-x"))
        .await;
    assert!(
        matches!(&sp, Err(CheckpointError::Corrupt { path, .. }) if path.contains("savepoint-x/_metadata")),
        "{sp:?}"
    );
}

#[tokio::test]
async fn a_savepoint_directory_is_found_as_itself() {
    let storage = OpendalCheckpointStorage::memory().unwrap();
    let job = JobId::from_name("sp");
    let loc = CheckpointLocation {
        dir: "savepoints/savepoint-abc-123/".to_string(),
    };
    let h = storage
        .write_state(&loc, "state", Bytes::from(vec![1u8; 30 * 1024]))
        .await
        .unwrap();
    assert!(matches!(h, StreamStateHandle::File { .. }));
    let mut md = metadata(job, 12);
    md.kind = SnapshotKind::Savepoint;
    md.operators = Vec::new();
    storage.write_metadata(&loc, &md).await.unwrap();
    let found = storage
        .find_checkpoints("savepoints/savepoint-abc-123")
        .await
        .unwrap();
    assert_eq!(found.len(), 1);
    assert_eq!(found[0].id, CheckpointId(12));
    assert_eq!(found[0].location, loc);
    assert!(found[0].complete);
    assert_eq!(
        storage.read_state(&loc, &h, None).await.unwrap().len(),
        30 * 1024
    );
    // Paths outside the root are refused.
    assert!(matches!(
        storage.find_checkpoints("../elsewhere").await,
        Err(CheckpointError::Config(_))
    ));
    // The root itself is never discarded.
    assert!(matches!(
        storage
            .discard(&CheckpointLocation { dir: String::new() })
            .await,
        Err(CheckpointError::Config(_))
    ));
}
