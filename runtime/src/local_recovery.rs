//! Local recovery (Flink's `execution.state-recovery.from-local`): each subtask keeps hard
//! links of the native files its checkpoints uploaded under the state backend's directory, so
//! that a restore at the same parallelism finds them on local disk instead of downloading them.

use std::path::{Path, PathBuf};
use tracing::warn;
use weir_checkpoint::coordinator::TaskKey;
use weir_core::handle::StreamStateHandle;

/// Where restored native keyed-state files came from, over all restores of a job in one process
/// (local recovery, Flink's `execution.state-recovery.from-local`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RestoreFiles {
    /// Files taken from a subtask's local-recovery copy.
    pub local_files: u64,
    /// Their bytes.
    pub local_bytes: u64,
    /// Files downloaded from checkpoint storage.
    pub downloaded_files: u64,
    /// Their bytes (without identity frames).
    pub downloaded_bytes: u64,
    /// Local copies the state backend's check refused (each then downloaded).
    pub local_refused: u64,
    /// Small files kept inline in `_metadata`, which came with it.
    pub inline_files: u64,
    /// Canonical keyed snapshots (savepoints) whose sections a subtask downloaded to local
    /// disk for its state backend to read from there.
    pub canonical_files: u64,
    /// Bytes of those sections.
    pub canonical_bytes: u64,
}

/// The directory where a subtask of a job keeps hard links of the native files its checkpoints
/// uploaded, under the state backend's directory. The process id is in the name, so a later
/// process removes what a killed one left ([`weir_state::disk::remove_dead_stores`]).
pub(crate) fn local_recovery_dir(
    state_dir: &Path,
    job: weir_core::ids::JobId,
    task: TaskKey,
) -> PathBuf {
    state_dir
        .join(format!("local-p{}-{job}", std::process::id()))
        .join(format!("v{}-{}", task.vertex.0, task.subtask))
}

/// Removes this process's local-recovery copies of `job` (when the job has ended).
pub(crate) fn remove_job(state_dir: &Path, job: weir_core::ids::JobId) {
    let dir = state_dir.join(format!("local-p{}-{job}", std::process::id()));
    if let Err(e) = std::fs::remove_dir_all(&dir)
        && e.kind() != std::io::ErrorKind::NotFound
    {
        warn!(dir = %dir.display(), error = %e, "cannot remove the job's local-recovery copies");
    }
}

/// The name of a local-recovery copy: the last part of the uploaded file's path, which is
/// unique per upload. `None` for a file kept inline in `_metadata`.
pub(crate) fn local_name(stream: &StreamStateHandle) -> Option<&str> {
    match stream {
        StreamStateHandle::File { path, .. } => path.rsplit('/').next(),
        _ => None,
    }
}

/// Keeps hard links of the native files a subtask's checkpoints reference, so that a restore
/// at the same parallelism finds them on local disk.
#[derive(Debug, Default)]
pub(crate) struct LocalRecovery {
    /// The subtask's directory; `None` when the backend keeps no files.
    pub dir: Option<PathBuf>,
}

impl LocalRecovery {
    /// Links the local file `from` as the copy of the uploaded `stream`; best effort (a file
    /// not linked is downloaded by a restore).
    pub(crate) fn keep(&self, from: &Path, stream: &StreamStateHandle) {
        let (Some(dir), Some(name)) = (&self.dir, local_name(stream)) else {
            return;
        };
        let to = dir.join(name);
        if to.exists() {
            return;
        }
        if let Err(e) = std::fs::create_dir_all(dir).and_then(|_| std::fs::hard_link(from, &to)) {
            warn!(file = %from.display(), error = %e, "cannot keep a local-recovery copy");
        }
    }

    /// Checkpoint `completed` completed: removes every copy whose name `keep` does not hold,
    /// but those a later checkpoint uploaded (its upload may still be under way, not yet
    /// recorded).
    pub(crate) fn retain(
        &self,
        keep: &std::collections::HashSet<String>,
        completed: weir_core::ids::CheckpointId,
    ) {
        let Some(dir) = &self.dir else {
            return;
        };
        for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let later = uploaded_by(&name).is_some_and(|c| c > completed.0);
            if !keep.contains(&name) && !later {
                let _ = std::fs::remove_file(entry.path());
            }
        }
    }
}

/// The checkpoint that uploaded a file, from its upload name
/// (`v<vertex>-<subtask>-g<generation>-<operator, 8 hex digits>-c<id>-…`, see `upload.rs`).
fn uploaded_by(name: &str) -> Option<u64> {
    name.split('-').nth(4)?.strip_prefix('c')?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_uploading_checkpoint_is_read_from_the_name() {
        assert_eq!(
            uploaded_by("v1-0-g2-0badf00d-c17-op-s0-a0-p9-3-ab.0000000004@0-63"),
            Some(17)
        );
        // An operator id that looks like a checkpoint number is not taken for one.
        assert_eq!(
            uploaded_by("v1-0-g2-c0123456-c5-op-s0-a0-p9-3-ab.0000000004@0-63"),
            Some(5)
        );
        assert_eq!(uploaded_by("v1-0-g2-0badf00d-keyed"), None);
    }
}
