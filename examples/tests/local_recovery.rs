//! Local recovery of the disk backend's native checkpoints: a restore at the same parallelism
//! takes the files from the subtasks' local copies; a damaged local copy is downloaded instead;
//! a file damaged in checkpoint storage makes its checkpoint unusable and the job restores from
//! the previous one. Every run is compared with totals computed without the engine.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;
use support::*;
#[path = "support/count_max.rs"]
mod count_max;
use count_max::{RECORDS, assert_exact, disk as backend, job};

use std::path::{Path, PathBuf};
use std::sync::Arc;
use weir_runtime::{DiskStateBackend, JobResult, RestartStrategy};

const NAME: &str = "local-recovery-test";

/// The shared job ([`count_max::job`]) at parallelism 2 on the disk backend, failing once after
/// `before_failure`: exact, and restored from a checkpoint.
async fn run(
    dir: &Path,
    backend: DiskStateBackend,
    before_failure: impl Fn() + Send + Sync + 'static,
) -> JobResult {
    let (env, handle) = job(NAME, dir, backend, 2, Some(Box::new(before_failure)));
    let r = env.execute().bounded().await.unwrap();
    assert_exact(&handle.get());
    assert!(
        r.source_records_since_restore < RECORDS,
        "the job restored from a checkpoint, not from scratch: {r:?}"
    );
    r
}

/// The local-recovery copies under a backend's directory.
fn local_copies(state_dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    for process in std::fs::read_dir(state_dir).into_iter().flatten().flatten() {
        if !process.file_name().to_string_lossy().starts_with("local-p") {
            continue;
        }
        for task in std::fs::read_dir(process.path())
            .into_iter()
            .flatten()
            .flatten()
        {
            for f in std::fs::read_dir(task.path())
                .into_iter()
                .flatten()
                .flatten()
            {
                found.push(f.path());
            }
        }
    }
    found
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restore_at_the_same_parallelism_takes_the_local_copies() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let r = run(dir.path(), backend(dir.path()), || {}).await;
    assert_eq!(r.restarts, 1);
    let f = r.restore_files;
    assert!(f.local_files > 0 && f.local_bytes > 0, "{f:?}");
    assert_eq!(f.local_refused, 0, "{f:?}");
    // Files a pending checkpoint uploaded are linked as well: nothing was downloaded.
    assert_eq!(f.downloaded_files, 0, "{f:?}");
    assert_eq!(f.inline_files, 0, "{f:?}");
    // The job is over: its stores, downloads and local-recovery copies are gone.
    let left: Vec<_> = std::fs::read_dir(&state)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert!(left.is_empty(), "left under the state directory: {left:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_local_copy_is_downloaded_instead() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let damaged = Arc::new(std::sync::Mutex::new(0usize));
    let count = damaged.clone();
    let r = run(dir.path(), backend(dir.path()), move || {
        // Every local copy loses its last byte (the run's end magic): each fails the check.
        for path in local_copies(&state) {
            let len = std::fs::metadata(&path).unwrap().len();
            let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
            f.set_len(len - 1).unwrap();
            *count.lock().unwrap() += 1;
        }
    })
    .await;
    let damaged = *damaged.lock().unwrap();
    assert!(damaged > 0, "no local copy to damage");
    let f = r.restore_files;
    // Every damaged copy the restore needed was refused and downloaded instead (a checkpoint
    // that completed after the damage may have linked sound copies, which are taken).
    assert!(f.local_refused > 0, "{f:?}");
    assert!(f.downloaded_files >= f.local_refused, "{f:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_damaged_in_storage_falls_back_to_the_previous_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("checkpoints");
    // A job that fails for good (no restarts), leaving three retained checkpoints.
    let (env, _) = job(
        NAME,
        dir.path(),
        backend(dir.path()),
        2,
        Some(Box::new(|| {})),
    );
    env.set_restart_strategy(RestartStrategy::NoRestart);
    let e = env.execute().bounded().await.unwrap_err();
    assert!(e.to_string().contains("injected failure"), "{e}");
    // The newest retained checkpoint but the oldest that uploaded run files of its own: each
    // is flipped in one byte, the size unchanged. Files a checkpoint uploads are referenced by
    // it and later ones only, so the oldest retained checkpoint stays whole.
    let mut ids: Vec<u64> = complete_checkpoints(&root)
        .into_iter()
        .map(|(id, _)| id)
        .collect();
    ids.sort_unstable();
    let shared = std::fs::read_dir(&root)
        .unwrap()
        .flatten()
        .map(|job| job.path().join("shared"))
        .find(|p| p.is_dir())
        .unwrap();
    let files: Vec<PathBuf> = std::fs::read_dir(shared)
        .unwrap()
        .flatten()
        .map(|f| f.path())
        .collect();
    let own = |id: u64, f: &PathBuf| {
        let name = f.file_name().unwrap().to_string_lossy().into_owned();
        name.contains(&format!("-c{id}-")) && name.contains('@')
    };
    let damaged = *ids
        .iter()
        .skip(1)
        .rev()
        .find(|&&id| files.iter().any(|f| own(id, f)))
        .expect("a retained checkpoint but the oldest uploaded a run file");
    for f in files.iter().filter(|f| own(damaged, f)) {
        let mut bytes = std::fs::read(f).unwrap();
        let at = bytes.len() / 2;
        bytes[at] ^= 0x40;
        std::fs::write(f, bytes).unwrap();
    }
    // Resumed from the failed job's checkpoints: the restores that find a damaged file fail,
    // and the job goes on from an older checkpoint, with exact totals: without a restart (none
    // is allowed), as when the job master finds the damage itself.
    let (env, handle) = job(NAME, dir.path(), backend(dir.path()), 2, None);
    env.set_restart_strategy(RestartStrategy::NoRestart);
    env.restore_from(&root);
    let r = env.execute().bounded().await.unwrap();
    assert_exact(&handle.get());
    let from = r.restored_from.clone().unwrap();
    let from_id: u64 = from.rsplit("chk-").next().unwrap().parse().unwrap();
    assert!(
        from_id < damaged,
        "restored from {from}, at or after the damaged {damaged}: restarts {}, {:?}",
        r.restarts,
        r.restore_files
    );
    assert_eq!(r.restarts, 0, "{r:?}");
    assert!(
        r.restore_files.downloaded_files > 0,
        "{:?}",
        r.restore_files
    );
}
