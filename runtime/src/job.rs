//! [`JobClient`]: how a program talks to its running job (cancel, trigger a checkpoint or a
//! savepoint, stop with a savepoint, read the checkpoint statistics). The job master it talks to
//! is the `master` module.

use crate::error::JobError;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;
use tokio::sync::{Notify, mpsc, oneshot};
use weir_checkpoint::coordinator::{CheckpointCoordinator, CheckpointStats};
use weir_core::element::SnapshotKind;

/// Talks to a running job: cancel it, trigger a checkpoint or a savepoint, stop it with a
/// savepoint. Make one before `execute_with`, and use clones of it from other tasks.
#[derive(Clone)]
pub struct JobClient {
    inner: Arc<ClientInner>,
}

/// The earlier name of [`JobClient`], for code that only cancels.
pub type JobCanceller = JobClient;

struct ClientInner {
    cancelled: AtomicBool,
    notify: Notify,
    commands: mpsc::Sender<Command>,
    receiver: std::sync::Mutex<Option<mpsc::Receiver<Command>>>,
    source_records: Arc<AtomicU64>,
    /// The statistics of the last checkpoints, as the master last published them.
    stats: std::sync::Mutex<Vec<CheckpointStats>>,
    /// The last refused trigger requests: time since the job started, and the reason.
    refusals: std::sync::Mutex<Vec<(Duration, String)>>,
}

impl std::fmt::Debug for JobClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JobClient")
            .field("cancelled", &self.inner.cancelled.load(Ordering::SeqCst))
            .finish()
    }
}

impl Default for JobClient {
    fn default() -> Self {
        let (commands, receiver) = mpsc::channel(16);
        JobClient {
            inner: Arc::new(ClientInner {
                cancelled: AtomicBool::new(false),
                notify: Notify::new(),
                commands,
                receiver: std::sync::Mutex::new(Some(receiver)),
                source_records: Arc::new(AtomicU64::new(0)),
                stats: std::sync::Mutex::new(Vec::new()),
                refusals: std::sync::Mutex::new(Vec::new()),
            }),
        }
    }
}

/// A request from a [`JobClient`] to the job master.
pub(crate) enum Command {
    Snapshot {
        kind: SnapshotKind,
        dir: Option<PathBuf>,
        drain: bool,
        reply: oneshot::Sender<Result<String, String>>,
    },
}

impl JobClient {
    /// Requests cancellation.
    pub fn cancel(&self) {
        self.inner.cancelled.store(true, Ordering::SeqCst);
        self.inner.notify.notify_waiters();
    }

    pub(crate) async fn cancelled(&self) {
        loop {
            let notified = self.inner.notify.notified();
            if self.inner.cancelled.load(Ordering::SeqCst) {
                return;
            }
            notified.await;
        }
    }

    /// Records the sources emitted since this job started (replays after a failover included;
    /// records covered by a checkpoint the job was restored from are not).
    pub fn source_records(&self) -> u64 {
        self.inner.source_records.load(Ordering::Relaxed)
    }

    async fn snapshot(
        &self,
        kind: SnapshotKind,
        dir: Option<PathBuf>,
        drain: bool,
    ) -> Result<String, JobError> {
        let (reply, answer) = oneshot::channel();
        self.inner
            .commands
            .send(Command::Snapshot {
                kind,
                dir,
                drain,
                reply,
            })
            .await
            .map_err(|_| JobError::Snapshot("the job is not running".into()))?;
        answer
            .await
            .map_err(|_| JobError::Snapshot("the job ended before the snapshot completed".into()))?
            .map_err(JobError::Snapshot)
    }

    /// Triggers a checkpoint now; returns its path once complete.
    pub async fn trigger_checkpoint(&self) -> Result<String, JobError> {
        self.snapshot(SnapshotKind::Checkpoint, None, false).await
    }

    /// Takes a savepoint (aligned, self-contained) into a new directory under `dir` (or the
    /// configured savepoint directory); returns its path once complete.
    pub async fn trigger_savepoint(&self, dir: Option<PathBuf>) -> Result<String, JobError> {
        self.snapshot(SnapshotKind::Savepoint, dir, false).await
    }

    /// Stops the job with a savepoint (Flink's stop-with-savepoint): the sources stop right after
    /// the barrier, so nothing is processed after the snapshot, and the job ends FINISHED with
    /// the savepoint's path. With `drain`, event time first advances to the end and the operators
    /// flush, as at the end of input. If the savepoint fails, the job goes on.
    pub async fn stop_with_savepoint(
        &self,
        dir: Option<PathBuf>,
        drain: bool,
    ) -> Result<String, JobError> {
        self.snapshot(SnapshotKind::SynchronousSavepoint, dir, drain)
            .await
    }

    /// The statistics of the job's last checkpoints and savepoints (in progress, completed and
    /// failed, with reasons), oldest first, as of the last change.
    pub fn checkpoint_stats(&self) -> Vec<CheckpointStats> {
        self.inner
            .stats
            .lock()
            .map(|s| s.clone())
            .unwrap_or_default()
    }

    /// The last trigger requests that were refused (periodic, by record count or on demand),
    /// with when (since the job started) and why: too many in progress, the min pause, tasks not
    /// running.
    pub fn trigger_refusals(&self) -> Vec<(Duration, String)> {
        self.inner
            .refusals
            .lock()
            .map(|s| s.clone())
            .unwrap_or_default()
    }

    pub(crate) fn publish_stats(&self, coordinator: &CheckpointCoordinator) {
        if let Ok(mut s) = self.inner.stats.lock() {
            *s = coordinator.history().cloned().collect();
        }
        if let Ok(mut r) = self.inner.refusals.lock() {
            *r = coordinator
                .refusals()
                .map(|(t, why)| (*t, why.to_string()))
                .collect();
        }
    }

    pub(crate) fn take_commands(&self) -> Option<mpsc::Receiver<Command>> {
        self.inner.receiver.lock().ok().and_then(|mut r| r.take())
    }

    /// The counter of source records the job's metrics share with this client.
    pub(crate) fn source_records_counter(&self) -> Arc<AtomicU64> {
        self.inner.source_records.clone()
    }
}
