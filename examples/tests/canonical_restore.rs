//! Canonical keyed snapshots (heap checkpoints, savepoints) restored into the disk backend: each
//! subtask downloads the sections it owns into the backend's directory, checked, and the backend
//! reads them from there (so a savepoint larger than memory restores), at the same parallelism
//! and at another; a section damaged in storage makes its checkpoint unusable and the job
//! restores from the previous one; the heap backend still gets the sections from the job
//! master. Every run is compared with totals computed without the engine.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;
use support::*;
#[path = "support/count_max.rs"]
mod count_max;
use count_max::{RECORDS, assert_exact, disk, job};

use std::path::{Path, PathBuf};
use weir_runtime::{HeapStateBackend, JobResult, RestartStrategy};

const NAME: &str = "canonical-restore-test";

/// A heap job at parallelism 2 that fails for good after three checkpoints: its retained
/// checkpoints are canonical (an incremental chain of heap snapshots) and in files.
async fn heap_checkpoints(dir: &Path) -> PathBuf {
    let (env, _) = job(NAME, dir, HeapStateBackend, 2, Some(Box::new(|| {})));
    env.set_restart_strategy(RestartStrategy::NoRestart);
    let e = env.execute().bounded().await.unwrap_err();
    assert!(e.to_string().contains("injected failure"), "{e}");
    dir.join("checkpoints")
}

/// Resumes from `root` with `backend` at `parallelism`, to the end, exactly.
async fn resume(
    dir: &Path,
    backend: impl weir_runtime::state::StateBackend,
    parallelism: u32,
    root: &Path,
) -> JobResult {
    let (env, handle) = job(NAME, dir, backend, parallelism, None);
    // No restart: a checkpoint a subtask finds unusable is fallen back from without one.
    env.set_restart_strategy(RestartStrategy::NoRestart);
    env.restore_from(root);
    let r = env.execute().bounded().await.unwrap();
    assert_exact(&handle.get());
    assert!(
        r.source_records_since_restore < RECORDS,
        "the job restored from a checkpoint, not from scratch: {r:?}"
    );
    r
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heap_checkpoints_restore_into_disk_from_downloaded_sections_at_any_parallelism() {
    let dir = tempfile::tempdir().unwrap();
    let root = heap_checkpoints(dir.path()).await;
    for parallelism in [2, 3] {
        let run = dir.path().join(format!("disk-{parallelism}"));
        let r = resume(&run, disk(&run), parallelism, &root).await;
        let f = r.restore_files;
        // Each subtask downloaded the sections it owns (at 3, parts of files), for the backend
        // to read from disk; nothing native.
        assert!(f.canonical_files > 0 && f.canonical_bytes > 0, "{f:?}");
        assert_eq!(f.downloaded_files + f.local_files, 0, "{f:?}");
        // The job is over: the downloads are gone with the stores.
        let left: Vec<_> = std::fs::read_dir(run.join("state"))
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        assert!(left.is_empty(), "left under the state directory: {left:?}");
    }
    // The heap backend has no directory: the job master reads the sections.
    let run = dir.path().join("heap");
    let r = resume(&run, HeapStateBackend, 3, &root).await;
    assert_eq!(r.restore_files.canonical_files, 0, "{:?}", r.restore_files);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_section_damaged_in_storage_makes_the_disk_restore_fall_back() {
    let dir = tempfile::tempdir().unwrap();
    let root = heap_checkpoints(dir.path()).await;
    let mut ids: Vec<(u64, PathBuf)> = complete_checkpoints(&root);
    ids.sort();
    let (newest, chk) = ids.last().cloned().unwrap();
    // Every keyed file the newest checkpoint uploaded itself (a link of the heap's incremental
    // chain, in the job's `shared/`), flipped in one byte near its end (in its last key
    // group's section), the size unchanged.
    let shared = chk.parent().unwrap().join("shared");
    let keyed: Vec<PathBuf> = std::fs::read_dir(&shared)
        .unwrap()
        .flatten()
        .map(|f| f.path())
        .filter(|p| {
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            name.ends_with(&format!("-c{newest}-keyed"))
        })
        .collect();
    assert!(
        !keyed.is_empty(),
        "no keyed file of checkpoint {newest} in {}",
        shared.display()
    );
    for f in &keyed {
        let mut bytes = std::fs::read(f).unwrap();
        let at = bytes.len() - 6;
        bytes[at] ^= 0x40;
        std::fs::write(f, bytes).unwrap();
    }
    // At parallelism 3 (sections read by range, each checked by its checksum) and 2 (whole
    // files, checked by their digest).
    for parallelism in [3, 2] {
        let run = dir.path().join(format!("disk-{parallelism}"));
        let r = resume(&run, disk(&run), parallelism, &root).await;
        let from = r.restored_from.clone().unwrap();
        let from_id: u64 = from.rsplit("chk-").next().unwrap().parse().unwrap();
        assert!(
            from_id < newest,
            "restored from {from}, at or after the damaged {newest}: {r:?}"
        );
        // The fallback is not a restart (the job runs with none allowed).
        assert_eq!(r.restarts, 0, "{r:?}");
        // The subtasks found the damage, in the sections they downloaded.
        assert!(r.restore_files.canonical_files > 0, "{r:?}");
    }
}
