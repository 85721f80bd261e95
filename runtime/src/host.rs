//! Where the job master's subtasks run ([`Gateway`]): in this process (`gateway::Running`) or
//! on task managers over RPC (`cluster::jobmaster::RemoteGateway`). The master talks to either
//! through this one type.

use crate::cluster::jobmaster::RemoteGateway;
use crate::gateway::Running;
use crate::task::{Targets, TaskMessage};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use weir_checkpoint::CheckpointStorage;
use weir_checkpoint::coordinator::TaskKey;
use weir_checkpoint::storage::CheckpointLocation;
use weir_core::ids::CheckpointId;

/// Where the master's subtasks run.
pub(crate) enum Gateway {
    /// In this process.
    Local(Option<Running>),
    /// On task managers.
    Remote(Box<RemoteGateway>),
}

impl Gateway {
    /// Queues `message` for `task` of the current generation; false if it cannot be delivered.
    pub fn send(&self, task: TaskKey, message: TaskMessage) -> bool {
        match self {
            Gateway::Local(running) => running.as_ref().is_some_and(|r| r.send(task, message)),
            Gateway::Remote(remote) => remote.send(task, message),
        }
    }

    /// Makes snapshot `id` go to `location` in `storage` (a savepoint's own directory) in
    /// every subtask, before any of its barriers is injected.
    pub async fn set_target(
        &self,
        targets: &Targets,
        id: CheckpointId,
        storage: Arc<dyn CheckpointStorage>,
        root: Option<String>,
        location: CheckpointLocation,
    ) -> Result<(), String> {
        if let Gateway::Remote(remote) = self {
            let root = root.ok_or_else(|| {
                format!(
                    "the snapshot goes to {}, which task managers cannot reach: use a directory path or s3://",
                    storage.describe()
                )
            })?;
            remote.set_target(id, root, location.clone()).await?;
        }
        if let Ok(mut t) = targets.lock() {
            t.insert(id, (storage, location));
        }
        Ok(())
    }

    /// Forgets where snapshot `id` goes (it completed or was aborted).
    pub fn clear_target(&self, targets: &Targets, id: CheckpointId) {
        if let Ok(mut t) = targets.lock() {
            t.remove(&id);
        }
        if let Gateway::Remote(remote) = self {
            remote.clear_target(id);
        }
    }

    /// Makes every subtask's keyed backends start new incremental chains before their next
    /// snapshot.
    pub fn raise_chain_epoch(&self, chain_epoch: &AtomicU64) {
        let epoch = chain_epoch.fetch_add(1, Ordering::AcqRel) + 1;
        if let Gateway::Remote(remote) = self {
            remote.set_chain_epoch(epoch);
        }
    }

    /// Stops the current generation's subtasks, waiting at most `wait` for those in this
    /// process (see [`Running::stop`]); on task managers, also waits for their uploads, whose
    /// late acknowledgements arrive as reports first.
    pub async fn stop(&mut self, finished: bool, wait: Duration) {
        match self {
            Gateway::Local(running) => {
                if let Some(r) = running.as_mut() {
                    r.stop(finished, wait).await;
                }
            }
            Gateway::Remote(remote) => remote.stop(finished).await,
        }
    }

    /// Whether no upload of the current generation is still running.
    pub fn uploads_idle(&self) -> bool {
        match self {
            Gateway::Local(running) => running.as_ref().is_none_or(Running::uploads_idle),
            Gateway::Remote(_) => true,
        }
    }
}
