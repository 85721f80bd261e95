//! Where the job master's subtasks run: the [`TaskHost`] seam, implemented in this process by
//! [`LocalHost`] and on task managers by `cluster::jobmaster::RemoteHost`. The master deploys,
//! messages, and stops subtasks only through it.

use crate::error::JobError;
use crate::gateway::{ProcessTasks, Running, TaskRuntime};
use crate::simulated_cluster::SimulatedTaskManagers;
use crate::spec::JobSpec;
use crate::spec::{TaskDeployment, TaskSettings};
use crate::task::{JobMetrics, Targets, TaskMessage, TaskReport};
use async_trait::async_trait;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::time::Instant;
use weir_checkpoint::CheckpointStorage;
use weir_checkpoint::coordinator::TaskKey;
use weir_checkpoint::storage::CheckpointLocation;
use weir_core::ids::{CheckpointId, JobId};
use weir_network::Transport;

/// Where a job's subtasks run, as the job master sees it.
///
/// The master keeps what a snapshot's target and the incremental chains' epoch are in shared
/// [`Targets`] and an `AtomicU64`, which subtasks in this process read directly; a host whose
/// subtasks run elsewhere passes every change on ([`announce_target`](Self::announce_target),
/// [`chain_epoch_raised`](Self::chain_epoch_raised)).
#[async_trait]
pub(crate) trait TaskHost: Send + Sync {
    /// Deploys `tasks` of `generation`; they report to `reports`. Too few slots within the slot
    /// timeout is [`JobError::NoResources`], a failure the restart strategy retries.
    async fn deploy(
        &mut self,
        generation: u64,
        tasks: Vec<TaskDeployment>,
        reports: mpsc::UnboundedSender<TaskReport>,
    ) -> Result<(), JobError>;

    /// Queues `message` for `task` of the current generation; false if it cannot be delivered.
    fn send(&self, task: TaskKey, message: TaskMessage) -> bool;

    /// Makes snapshot `id` go to `location` in `storage` (found by other processes at `root`)
    /// in every subtask, before any of its barriers is injected.
    async fn announce_target(
        &self,
        id: CheckpointId,
        storage: &dyn CheckpointStorage,
        root: Option<String>,
        location: &CheckpointLocation,
    ) -> Result<(), String>;

    /// Snapshot `id` completed or was aborted: its target is forgotten.
    fn clear_target(&self, id: CheckpointId);

    /// The job's chain epoch is now `epoch`: every keyed backend starts a new incremental chain
    /// before its next snapshot.
    fn chain_epoch_raised(&self, epoch: u64);

    /// Stops the current generation's subtasks (committing what they held back if `finished`),
    /// waiting at most `wait` for those in this process; a remote host also waits for its
    /// uploads, whose late acknowledgements arrive as reports first. After a finished job,
    /// returns the subtasks in this process that ended other than by returning (killed before
    /// their final commit); a subtask that failed, or a lost task manager, reports it, as
    /// ever, and one still busy after the wait is abandoned.
    async fn stop(&mut self, finished: bool, wait: Duration) -> Vec<String>;

    /// Whether no upload of the current generation is still running.
    fn uploads_idle(&self) -> bool;

    /// The job is over (`state`: Flink's final job status): processes that ran its subtasks
    /// hear of it.
    async fn shutdown(&self, state: &'static str);
}

/// The subtasks of a job run in this process, on a runtime of their own, so that a stuck one
/// cannot keep the master from giving up on it when the job is cancelled.
pub(crate) struct LocalHost<'s> {
    pub spec: &'s JobSpec,
    pub settings: TaskSettings,
    pub transport: Arc<dyn Transport>,
    pub job_id: JobId,
    pub storage: Arc<dyn CheckpointStorage>,
    pub started: Instant,
    pub metrics: Arc<JobMetrics>,
    pub targets: Arc<Targets>,
    pub chain_epoch: Arc<AtomicU64>,
    pub runtime: TaskRuntime,
    /// The current generation's subtasks.
    pub running: Option<Running>,
    /// Under a simulation that places subtasks on task managers: those task managers.
    pub simulated: Option<SimulatedTaskManagers>,
}

#[async_trait]
impl TaskHost for LocalHost<'_> {
    async fn deploy(
        &mut self,
        generation: u64,
        tasks: Vec<TaskDeployment>,
        reports: mpsc::UnboundedSender<TaskReport>,
    ) -> Result<(), JobError> {
        let process = ProcessTasks {
            spec: self.spec,
            settings: &self.settings,
            transport: self.transport.as_ref(),
            job_id: self.job_id,
            storage: self.storage.clone(),
            started: self.started,
            metrics: self.metrics.clone(),
            targets: self.targets.clone(),
            chain_epoch: self.chain_epoch.clone(),
            runtime: self.runtime.handle().clone(),
        };
        if let Some(tms) = self.simulated.as_mut() {
            let placed = tms.place(&self.spec.job).await?;
            let running = process.spawn(generation, tasks, &reports)?;
            tms.arm(generation, &running, &placed, &reports);
            self.running = Some(running);
            return Ok(());
        }
        self.running = Some(process.spawn(generation, tasks, &reports)?);
        Ok(())
    }

    fn send(&self, task: TaskKey, message: TaskMessage) -> bool {
        self.running.as_ref().is_some_and(|r| r.send(task, message))
    }

    async fn announce_target(
        &self,
        _id: CheckpointId,
        _storage: &dyn CheckpointStorage,
        _root: Option<String>,
        _location: &CheckpointLocation,
    ) -> Result<(), String> {
        // The subtasks read the master's targets.
        Ok(())
    }

    fn clear_target(&self, _id: CheckpointId) {}

    fn chain_epoch_raised(&self, _epoch: u64) {}

    async fn stop(&mut self, finished: bool, wait: Duration) -> Vec<String> {
        if let Some(tms) = self.simulated.as_mut() {
            tms.disarm();
        }
        match self.running.as_mut() {
            Some(r) => r
                .stop(finished, wait)
                .await
                .into_iter()
                .map(|(_, name)| name)
                .collect(),
            None => Vec::new(),
        }
    }

    fn uploads_idle(&self) -> bool {
        self.running.as_ref().is_none_or(Running::uploads_idle)
    }

    async fn shutdown(&self, _: &'static str) {}
}
