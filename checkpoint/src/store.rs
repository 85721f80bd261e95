//! The completed-checkpoint store: keeps the newest `num_retained` completed checkpoints and says
//! which ones a new completion subsumes (Flink's `CompletedCheckpointStore`). Pure bookkeeping:
//! the runtime discards what it returns.

use crate::storage::CheckpointLocation;
use std::collections::VecDeque;
use weir_core::ids::CheckpointId;

/// A completed checkpoint the store retains.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CompletedCheckpoint {
    /// Its id.
    pub id: CheckpointId,
    /// Where its `_metadata` is.
    pub location: CheckpointLocation,
    /// Bytes of state it references.
    pub state_size: u64,
    /// When it completed, ms since the Unix epoch.
    pub completion_timestamp_ms: u64,
}

/// The retained completed checkpoints, oldest first.
#[derive(Clone, Debug)]
pub struct CompletedCheckpointStore {
    num_retained: usize,
    retained: VecDeque<CompletedCheckpoint>,
}

impl CompletedCheckpointStore {
    /// A store that keeps `num_retained` (at least 1) checkpoints.
    pub fn new(num_retained: u32) -> CompletedCheckpointStore {
        CompletedCheckpointStore {
            num_retained: num_retained.max(1) as usize,
            retained: VecDeque::new(),
        }
    }

    /// Adds a completed checkpoint and returns those it subsumed, to be discarded. A checkpoint
    /// older than the newest retained one is still added in id order.
    pub fn add(&mut self, checkpoint: CompletedCheckpoint) -> Vec<CompletedCheckpoint> {
        let pos = self
            .retained
            .iter()
            .position(|c| c.id > checkpoint.id)
            .unwrap_or(self.retained.len());
        self.retained.insert(pos, checkpoint);
        let mut subsumed = Vec::new();
        while self.retained.len() > self.num_retained {
            if let Some(c) = self.retained.pop_front() {
                subsumed.push(c);
            }
        }
        subsumed
    }

    /// The newest retained checkpoint.
    pub fn latest(&self) -> Option<&CompletedCheckpoint> {
        self.retained.back()
    }

    /// All retained checkpoints, oldest first.
    pub fn retained(&self) -> impl DoubleEndedIterator<Item = &CompletedCheckpoint> {
        self.retained.iter()
    }

    /// Forgets a retained checkpoint (for example one found corrupt), returning it.
    pub fn remove(&mut self, id: CheckpointId) -> Option<CompletedCheckpoint> {
        let pos = self.retained.iter().position(|c| c.id == id)?;
        self.retained.remove(pos)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use weir_core::ids::JobId;

    fn cp(id: u64) -> CompletedCheckpoint {
        CompletedCheckpoint {
            id: CheckpointId(id),
            location: CheckpointLocation::for_checkpoint(JobId(1), CheckpointId(id)),
            state_size: 0,
            completion_timestamp_ms: id,
        }
    }

    #[test]
    fn keeps_the_newest_n() {
        let mut s = CompletedCheckpointStore::new(2);
        assert!(s.add(cp(1)).is_empty());
        assert!(s.add(cp(2)).is_empty());
        assert_eq!(s.add(cp(3)), vec![cp(1)]);
        assert_eq!(s.latest(), Some(&cp(3)));
        // An older one arriving late is the one subsumed.
        assert_eq!(s.add(cp(0)), vec![cp(0)]);
        let ids: Vec<u64> = s.retained().map(|c| c.id.0).collect();
        assert_eq!(ids, [2, 3]);
        assert_eq!(s.remove(CheckpointId(3)), Some(cp(3)));
        assert_eq!(s.latest(), Some(&cp(2)));
    }
}
