//! The plain data of a job: what to run ([`JobSpec`]: graph, configuration, typed factories),
//! what a process is told to run ([`TaskSettings`], [`TaskDeployment`]), and how it ended
//! ([`JobResult`], [`JobStatus`]). The job master, the task hosts and cluster mode all use it;
//! it uses none of them.

use crate::config::JobConfig;
use crate::deploy::{EnumeratorFactory, NodeFactory};
use crate::operator::RestoreContext;
use serde::{Deserialize, Serialize};
use std::any::Any;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use weir_checkpoint::coordinator::CheckpointStats;
use weir_checkpoint::coordinator::TaskKey;
use weir_core::config::CheckpointingMode;
use weir_core::graph::JobGraph;
use weir_core::ids::{JobId, NodeId};

/// How a job ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum JobStatus {
    /// Every task's input ended.
    Finished,
    /// Cancelled by the user.
    Canceled,
}

/// What a finished job reports.
#[derive(Clone, Debug)]
pub struct JobResult {
    /// The job's id.
    pub job_id: JobId,
    /// How it ended.
    pub status: JobStatus,
    /// Wall time from start to end.
    pub duration: Duration,
    /// Wall time from the moment every subtask first ran (the job's first RUNNING) to the end:
    /// without deployment, and in cluster mode without waiting for task managers.
    pub running_duration: Option<Duration>,
    /// Bytes this process sent to other processes over the data transport (a task manager's;
    /// zero for a job in one process).
    pub bytes_sent: u64,
    /// Records the sources emitted, over all attempts (replays included).
    pub source_records: u64,
    /// Checkpoints completed.
    pub checkpoints_completed: u64,
    /// Checkpoints failed or aborted.
    pub checkpoints_failed: u64,
    /// Restarts after failures.
    pub restarts: u32,
    /// End-to-end durations of completed checkpoints, in completion order.
    pub checkpoint_durations: Vec<Duration>,
    /// Persisted in-flight bytes of the same checkpoints (non-zero only for unaligned ones).
    pub checkpoint_in_flight: Vec<u64>,
    /// Statistics of the last checkpoints.
    pub checkpoint_history: Vec<CheckpointStats>,
    /// For each restart: time from detecting the failure to the first record processed after the
    /// restore.
    pub recovery_times: Vec<Duration>,
    /// The latest completed checkpoint, as `storage/path`.
    pub latest_checkpoint: Option<String>,
    /// The checkpoint the job started from, if any.
    pub restored_from: Option<String>,
    /// Records the sources emitted since the latest restore, at the start or after a failure
    /// (all of them when nothing was restored). Below the job's total when that restore resumed
    /// the sources, which is how a test tells a restore from a start over.
    pub source_records_since_restore: u64,
    /// Where the files of native keyed snapshots came from in this process's restores: the
    /// subtasks' local-recovery copies, or downloads from checkpoint storage.
    pub restore_files: crate::local_recovery::RestoreFiles,
    /// The savepoint a stop-with-savepoint ended the job with.
    pub savepoint: Option<String>,
    /// Trigger requests refused (too many in progress, min pause, not all tasks running).
    pub trigger_refusals: u64,
}

/// A job ready to run: its graph, configuration and typed node factories.
pub(crate) struct JobSpec {
    pub config: JobConfig,
    pub job: JobGraph,
    pub factories: Vec<Arc<dyn NodeFactory>>,
    pub key_hashes: HashMap<(NodeId, NodeId), Arc<dyn Any + Send + Sync>>,
    pub enumerators: HashMap<NodeId, EnumeratorFactory>,
    /// Handles whose published values the job manager gathers in cluster mode.
    #[cfg_attr(not(feature = "cluster"), allow(dead_code))]
    pub results: Vec<Arc<dyn crate::sink::SharedResult>>,
}

/// The settings every subtask of a job runs with, whichever process it is in.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct TaskSettings {
    pub batch_size: usize,
    pub mode: CheckpointingMode,
    pub snapshot_compression: weir_state::Compression,
    /// Incremental keyed snapshots: the chain limit, or `None` for full snapshots.
    pub incremental: Option<u32>,
    /// The [`name`](weir_state::StateBackend::name) of the job's state backend: every process
    /// builds its own from the same program, and a task manager whose job has another refuses
    /// the deployment.
    pub state_backend: String,
}

/// One subtask to run: which, its attempt, and the state it restores.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct TaskDeployment {
    pub task: TaskKey,
    pub attempt: u32,
    pub restore: RestoreContext,
}
