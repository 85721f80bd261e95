//! The stream task: one subtask's mailbox loop (reference: "Task manager side").
//!
//! The loop serves, in turn, the mailbox (checkpoint triggers for sources, completion and abort
//! notifications), the queued output (sent as credits allow), and the input: a source's next
//! batch, or the next element from the input gate, whose barriers go through the aligner. A
//! triggered checkpoint runs steps 0–4 on the chain; the snapshot's asynchronous part (serialize
//! and upload) runs as a separate tokio task while processing goes on, and ends with an
//! acknowledgement (or a decline) to the job master.

use crate::error::TaskError;
use crate::source::SplitAssignment;
pub(crate) use crate::upload::IncrementalChains;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use tokio::sync::mpsc;
use tokio::time::Instant;
use weir_checkpoint::CheckpointStorage;
use weir_checkpoint::coordinator::{CheckpointFailureReason, SubtaskCheckpointMetrics, TaskKey};
use weir_checkpoint::storage::CheckpointLocation;
use weir_core::element::CheckpointBarrier;
use weir_core::handle::TaskStateSnapshot;
use weir_core::ids::{CheckpointId, JobId, OperatorId};

mod checkpoint;
pub(crate) mod fetch;
mod guard;
mod input;
mod mailbox;
mod steps;
mod valve;

pub(crate) use guard::panic_message;
pub(crate) use input::{NetworkInput, SourceInput, TaskInput};
pub(crate) use mailbox::run_task;

/// A message from the job master to a task, served by its mailbox.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub(crate) enum TaskMessage {
    /// Start checkpoint `barrier.id` (sources only; others get barriers in-band). For a
    /// synchronous savepoint, `drain` first advances event time to the end.
    Trigger(CheckpointBarrier, bool),
    /// Checkpoint complete.
    NotifyComplete(CheckpointId),
    /// Checkpoint aborted.
    NotifyAborted(CheckpointId),
    /// The source's enumerator answered a split request.
    Splits(SplitAssignment),
    /// Every task finished: commit what was held for the end, then exit.
    JobFinished,
}

/// What a task reports to the job master.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub(crate) enum TaskEvent {
    Running,
    Acknowledge {
        id: CheckpointId,
        state: TaskStateSnapshot,
        metrics: SubtaskCheckpointMetrics,
    },
    Decline {
        id: CheckpointId,
        reason: CheckpointFailureReason,
    },
    Finished,
    Failed(TaskError),
    /// A source has nothing left to read and asks its enumerator for splits.
    SplitRequest,
}

/// A report, tagged with the deployment generation it belongs to.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub(crate) struct TaskReport {
    pub generation: u64,
    pub task: TaskKey,
    pub event: TaskEvent,
}

/// Counters shared by all tasks of a job.
#[derive(Debug, Default)]
pub(crate) struct JobMetrics {
    /// Records emitted by sources, over all attempts (shared with the job's client).
    pub source_records: Arc<AtomicU64>,
    /// Records processed by non-source tasks, over all attempts.
    pub processed_records: AtomicU64,
    /// For each deployment generation, when its first record was processed (µs since start).
    pub first_record_us: std::sync::Mutex<Vec<(u64, u64)>>,
    /// Where restored native files came from.
    pub restore_files: fetch::RestoreFileCounts,
    /// Records per vertex (shared with the job's client).
    pub vertex_records: Arc<crate::job::VertexRecords>,
}

/// Where each in-flight checkpoint or savepoint is written, when not in the job's default
/// location (`<job-id>/chk-<n>`): savepoints go to their own directory and storage.
pub(crate) type Targets = std::sync::Mutex<
    std::collections::HashMap<CheckpointId, (Arc<dyn CheckpointStorage>, CheckpointLocation)>,
>;

/// What a task is handed besides its chain.
pub(crate) struct TaskEnv {
    pub task: TaskKey,
    pub name: String,
    pub generation: u64,
    pub job_id: JobId,
    /// The chain's head operator: channel-state files are filed under it.
    pub head_operator: OperatorId,
    pub storage: Arc<dyn CheckpointStorage>,
    /// The job's state backend: where a restore puts native files, and how it checks them.
    pub state_backend: Arc<dyn weir_state::StateBackend>,
    pub reports: mpsc::UnboundedSender<TaskReport>,
    pub mailbox: mpsc::Receiver<TaskMessage>,
    pub started: Instant,
    pub metrics: Arc<JobMetrics>,
    pub is_source: bool,
    pub targets: Arc<Targets>,
    /// The chain's processing-time timers.
    pub processing_time: crate::operator::ProcessingTimeService,
    /// Incremental keyed state: the chain of handles each checkpoint's snapshot completes, per
    /// operator, from the latest confirmed checkpoint on.
    pub chains: Arc<Mutex<IncrementalChains>>,
    /// Uploads of this generation still running, so that the job master can wait for their
    /// acknowledgements before it lets the generation go.
    pub uploads: Arc<std::sync::atomic::AtomicUsize>,
    /// Raised by the job master when it refuses a delta whose base files are gone: before its
    /// next snapshot, a task that saw an older value has its keyed backends start new chains.
    /// A counter, not a message, so that it cannot be lost in a full mailbox.
    pub chain_epoch: Arc<AtomicU64>,
    /// The generation's cancellation signal, checked before each step of the loop.
    pub cancellation: crate::operator::Cancellation,
}

/// Counts one running upload until dropped.
struct UploadGuard(Arc<std::sync::atomic::AtomicUsize>);

impl UploadGuard {
    fn new(count: &Arc<std::sync::atomic::AtomicUsize>) -> UploadGuard {
        count.fetch_add(1, Ordering::AcqRel);
        UploadGuard(count.clone())
    }
}

impl Drop for UploadGuard {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl TaskEnv {
    async fn report(&self, event: TaskEvent) -> Result<(), TaskError> {
        self.reports
            .send(TaskReport {
                generation: self.generation,
                task: self.task,
                event,
            })
            .map_err(|_| TaskError::MasterGone)
    }
}
