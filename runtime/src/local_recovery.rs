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

    /// Removes every copy whose name `keep` does not hold.
    pub(crate) fn retain(&self, keep: &std::collections::HashSet<String>) {
        let Some(dir) = &self.dir else {
            return;
        };
        for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if !keep.contains(&name) {
                let _ = std::fs::remove_file(entry.path());
            }
        }
    }
}
