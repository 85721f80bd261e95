//! The shared-state registry: which checkpoints reference each shared state file, so that a
//! file is deleted exactly when no pending or retained checkpoint needs it any more (Flink's
//! `SharedStateRegistry`). Pure bookkeeping: the runtime deletes what it returns.
//!
//! Incremental snapshots write their files into the job's `shared/` directory, and a checkpoint's
//! acknowledgement carries every file of its chain: the full snapshot it starts from and each
//! delta since. The job manager registers a checkpoint's files when a subtask acknowledges
//! (so a file is protected while a pending checkpoint may still complete with it), and releases
//! them when the checkpoint is aborted or subsumed. A file that the release leaves unreferenced is
//! returned, to be deleted.

use crate::storage::is_shared;
use std::collections::{BTreeMap, BTreeSet};
use weir_core::handle::{StreamStateHandle, TaskStateSnapshot};
use weir_core::ids::CheckpointId;

/// One shared file and the checkpoints referencing it.
#[derive(Clone, Debug)]
struct Entry {
    handle: StreamStateHandle,
    checkpoints: BTreeSet<CheckpointId>,
}

/// Reference counts of the shared state files of one job.
#[derive(Clone, Debug, Default)]
pub struct SharedStateRegistry {
    /// By the file's path (relative to a checkpoint location of the job).
    files: BTreeMap<String, Entry>,
    /// By checkpoint: the paths it references.
    by_checkpoint: BTreeMap<CheckpointId, BTreeSet<String>>,
}

/// The path of a shared file handle, if it is one.
fn shared_path(handle: &StreamStateHandle) -> Option<&str> {
    handle.path().filter(|_| is_shared(handle))
}

/// Every shared file handle an acknowledgement carries.
pub fn shared_handles(state: &TaskStateSnapshot) -> impl Iterator<Item = &StreamStateHandle> {
    state
        .operators
        .values()
        .flat_map(|s| s.streams())
        .filter(|h| is_shared(h))
}

impl SharedStateRegistry {
    /// An empty registry.
    pub fn new() -> SharedStateRegistry {
        SharedStateRegistry::default()
    }

    /// Records that `checkpoint` references every shared file of `state` (one subtask's
    /// acknowledgement). Registering a file twice for one checkpoint counts it once.
    ///
    /// A file the acknowledgement did not write (`state.new_shared`) must be registered
    /// already: one that is not may have been deleted (a delta on a checkpoint subsumed
    /// meanwhile). Those are returned as `Err`, and the checkpoint must not complete; the files
    /// that are registered or new are recorded anyway, so that releasing the checkpoint deletes
    /// the new ones.
    pub fn register(
        &mut self,
        checkpoint: CheckpointId,
        state: &TaskStateSnapshot,
    ) -> Result<(), Vec<String>> {
        let mut unknown = Vec::new();
        for handle in shared_handles(state) {
            let Some(path) = shared_path(handle) else {
                continue;
            };
            if !self.files.contains_key(path) && !state.new_shared.iter().any(|n| n == path) {
                if !unknown.iter().any(|u| u == path) {
                    unknown.push(path.to_string());
                }
                continue;
            }
            self.files
                .entry(path.to_string())
                .or_insert_with(|| Entry {
                    handle: handle.clone(),
                    checkpoints: BTreeSet::new(),
                })
                .checkpoints
                .insert(checkpoint);
            self.by_checkpoint
                .entry(checkpoint)
                .or_default()
                .insert(path.to_string());
        }
        if unknown.is_empty() {
            Ok(())
        } else {
            Err(unknown)
        }
    }

    /// `checkpoint` was aborted or subsumed: it references nothing any more. Returns the files
    /// no other checkpoint references, to be deleted. Releasing twice returns nothing.
    pub fn release(&mut self, checkpoint: CheckpointId) -> Vec<StreamStateHandle> {
        let mut unreferenced = Vec::new();
        for path in self.by_checkpoint.remove(&checkpoint).unwrap_or_default() {
            let Some(entry) = self.files.get_mut(&path) else {
                continue;
            };
            entry.checkpoints.remove(&checkpoint);
            if entry.checkpoints.is_empty()
                && let Some(entry) = self.files.remove(&path)
            {
                unreferenced.push(entry.handle);
            }
        }
        unreferenced
    }

    /// The shared files of `state` that no checkpoint references: what an acknowledgement that
    /// came too late (for an aborted checkpoint, or from a failed attempt) left behind.
    pub fn unreferenced_in(&self, state: &TaskStateSnapshot) -> Vec<StreamStateHandle> {
        let mut seen = BTreeSet::new();
        shared_handles(state)
            .filter(|h| {
                shared_path(h).is_some_and(|p| !self.files.contains_key(p) && seen.insert(p))
            })
            .cloned()
            .collect()
    }

    /// How many shared files are referenced.
    pub fn len(&self) -> usize {
        self.files.len()
    }

    /// Whether no shared file is referenced.
    pub fn is_empty(&self) -> bool {
        self.files.is_empty()
    }

    /// How many checkpoints reference the file at `path`.
    pub fn references(&self, path: &str) -> usize {
        self.files.get(path).map_or(0, |e| e.checkpoints.len())
    }

    /// The checkpoints that reference at least one shared file.
    pub fn checkpoints(&self) -> impl Iterator<Item = CheckpointId> + '_ {
        self.by_checkpoint.keys().copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use weir_core::handle::{KeyedStateHandle, OperatorSubtaskState};
    use weir_core::ids::OperatorId;
    use weir_core::keygroup::KeyGroupRange;

    fn file(path: &str) -> StreamStateHandle {
        StreamStateHandle::File {
            path: path.to_string(),
            size: 100,
            digest: weir_core::identity::Digest([7; 16]),
        }
    }

    /// An acknowledgement referencing `paths`, all of which it wrote.
    fn ack(paths: &[&str]) -> TaskStateSnapshot {
        TaskStateSnapshot {
            new_shared: paths.iter().map(|p| p.to_string()).collect(),
            ..referencing(paths)
        }
    }

    /// An acknowledgement referencing `paths`, none of which it wrote.
    fn referencing(paths: &[&str]) -> TaskStateSnapshot {
        let keyed = paths
            .iter()
            .map(|p| KeyedStateHandle {
                key_group_range: KeyGroupRange::new(0, 3),
                header: (0, 10),
                offsets: vec![10, 20, 30, 40],
                end: 50,
                stream: file(p),
            })
            .collect();
        let mut state = TaskStateSnapshot::default();
        state.operators.insert(
            OperatorId::from_uid("sum"),
            OperatorSubtaskState {
                keyed,
                operator: Vec::new(),
                native: Vec::new(),
            },
        );
        state
    }

    fn paths(handles: Vec<StreamStateHandle>) -> Vec<String> {
        let mut out: Vec<String> = handles
            .into_iter()
            .filter_map(|h| h.path().map(str::to_string))
            .collect();
        out.sort();
        out
    }

    #[test]
    fn a_file_goes_when_the_last_checkpoint_referencing_it_goes() {
        let mut r = SharedStateRegistry::new();
        // Checkpoint 1: a full snapshot; 2 and 3: deltas on it; 4: a full one again.
        r.register(CheckpointId(1), &ack(&["../shared/full-1"]))
            .unwrap();
        r.register(
            CheckpointId(2),
            &ack(&["../shared/full-1", "../shared/delta-2"]),
        )
        .unwrap();
        r.register(
            CheckpointId(3),
            &ack(&["../shared/full-1", "../shared/delta-2", "../shared/delta-3"]),
        )
        .unwrap();
        assert_eq!(r.references("../shared/full-1"), 3);
        assert!(r.release(CheckpointId(1)).is_empty());
        assert!(r.release(CheckpointId(2)).is_empty());
        r.register(CheckpointId(4), &ack(&["../shared/full-4"]))
            .unwrap();
        assert_eq!(
            paths(r.release(CheckpointId(3))),
            ["../shared/delta-2", "../shared/delta-3", "../shared/full-1"]
        );
        assert!(r.release(CheckpointId(3)).is_empty(), "released twice");
        assert_eq!(r.len(), 1);
        assert_eq!(paths(r.release(CheckpointId(4))), ["../shared/full-4"]);
        assert!(r.is_empty());
    }

    #[test]
    fn a_pending_checkpoint_protects_the_files_it_will_reference() {
        let mut r = SharedStateRegistry::new();
        r.register(CheckpointId(1), &ack(&["../shared/full-1"]))
            .unwrap();
        // Checkpoint 3 (a delta on 1) acknowledged, still pending, when 2 (a full one)
        // completes and subsumes 1.
        r.register(
            CheckpointId(3),
            &ack(&["../shared/full-1", "../shared/delta-3"]),
        )
        .unwrap();
        r.register(CheckpointId(2), &ack(&["../shared/full-2"]))
            .unwrap();
        assert!(r.release(CheckpointId(1)).is_empty());
        assert_eq!(r.references("../shared/full-1"), 1);
    }

    #[test]
    fn a_file_neither_registered_nor_new_is_refused() {
        let mut r = SharedStateRegistry::new();
        r.register(CheckpointId(1), &ack(&["../shared/full-1"]))
            .unwrap();
        r.register(CheckpointId(2), &ack(&["../shared/full-2"]))
            .unwrap();
        // 1 is subsumed and its file deleted; then a delta on 1 arrives for checkpoint 3.
        assert_eq!(paths(r.release(CheckpointId(1))), ["../shared/full-1"]);
        let mut delta = referencing(&["../shared/full-1", "../shared/delta-3"]);
        delta.new_shared = vec!["../shared/delta-3".to_string()];
        assert_eq!(
            r.register(CheckpointId(3), &delta),
            Err(vec!["../shared/full-1".to_string()])
        );
        // The new file is recorded, so that releasing the refused checkpoint deletes it.
        assert_eq!(paths(r.release(CheckpointId(3))), ["../shared/delta-3"]);
        // A delta on a registered file is fine.
        let mut delta = referencing(&["../shared/full-2", "../shared/delta-4"]);
        delta.new_shared = vec!["../shared/delta-4".to_string()];
        assert_eq!(r.register(CheckpointId(4), &delta), Ok(()));
        assert!(is_shared(&file("../shared/x")));
        for bad in [
            "../shared/",
            "../shared/../chk-7/_metadata",
            "../shared/a/b",
            "shared/x",
        ] {
            assert!(!is_shared(&file(bad)), "{bad}");
        }
    }

    #[test]
    fn subtasks_of_one_checkpoint_count_once_and_non_shared_files_are_ignored() {
        let mut r = SharedStateRegistry::new();
        r.register(CheckpointId(5), &ack(&["../shared/a", "own-file"]))
            .unwrap();
        r.register(CheckpointId(5), &ack(&["../shared/a"])).unwrap();
        assert_eq!(r.references("../shared/a"), 1);
        assert_eq!(r.references("own-file"), 0);
        assert_eq!(r.checkpoints().collect::<Vec<_>>(), [CheckpointId(5)]);
        let late = ack(&["../shared/a", "../shared/late", "../shared/late"]);
        assert_eq!(paths(r.unreferenced_in(&late)), ["../shared/late"]);
        assert_eq!(paths(r.release(CheckpointId(5))), ["../shared/a"]);
    }
}
