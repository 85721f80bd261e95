//! The errors of `weir-runtime`: task failures (which go to the restart strategy) and job errors
//! (which reach the user).

use thiserror::Error;
use weir_checkpoint::CheckpointError;
use weir_core::CoreError;
use weir_network::NetworkError;
use weir_state::StateError;

/// Why a task failed. Every task failure goes through the restart strategy.
#[derive(Debug, Error)]
pub enum TaskError {
    /// A user function or operator reported an error.
    #[error("operator '{operator}' failed: {message}")]
    Operator {
        /// The operator's name.
        operator: String,
        /// Its message.
        message: String,
    },
    /// A user function panicked.
    #[error("task {task} panicked: {message}")]
    Panic {
        /// The subtask.
        task: String,
        /// The panic message.
        message: String,
    },
    /// State access or restore failed.
    #[error(transparent)]
    State(#[from] StateError),
    /// A channel failed.
    #[error(transparent)]
    Network(#[from] NetworkError),
    /// Checkpoint storage failed.
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    /// In-flight data of an unaligned checkpoint did not encode or decode.
    #[error("in-flight data: {0}")]
    InFlight(#[from] weir_core::CoreError),
    /// An upstream task went away without ending its input.
    #[error("input channel {0} closed before its end of input: the upstream task failed")]
    UpstreamGone(usize),
    /// The job master went away.
    #[error("lost the job master")]
    MasterGone,
    /// The subtask was cancelled ([`Cancellation`](super::operator::Cancellation)): the job is being cancelled
    /// or an attempt torn down. Not a failure: it is never reported.
    #[error("the task was cancelled")]
    Canceled,
    /// A subtask on a task manager failed: its error as that process reported it.
    #[error("{message}")]
    Remote {
        /// The error, as the task manager rendered it.
        message: String,
        /// Whether it only echoes another task's failure ([`TaskError::is_echo`]).
        echo: bool,
    },
    /// A file of the checkpoint being restored is damaged, foreign or missing, as the subtask
    /// found when it fetched it: the job master restores from an earlier checkpoint instead.
    #[error("checkpoint {location} is unusable: {file}: {reason}")]
    UnusableCheckpoint {
        /// The checkpoint's directory (`<job>/chk-<n>/`).
        location: String,
        /// The file, relative to the storage root.
        file: String,
        /// What is wrong with it.
        reason: String,
    },
    /// After the job finished, the subtask ended other than by returning (killed or unwound)
    /// before its sinks' final commit was done.
    #[error("task {task} ended before its final commit")]
    EndedBeforeFinalCommit {
        /// The subtask.
        task: String,
    },
    /// The task manager running the subtask was lost (killed, cut off or stuck).
    #[error("task manager {task_manager} was lost: {reason}")]
    TaskManagerLost {
        /// Its id and name.
        task_manager: String,
        /// How the loss showed.
        reason: String,
    },
}

/// How a task failure crosses from a task manager to the job manager: its message and whether it
/// is an echo; it arrives as [`TaskError::Remote`].
#[derive(serde::Serialize, serde::Deserialize)]
struct RemoteTaskError {
    message: String,
    echo: bool,
    /// A [`TaskError::UnusableCheckpoint`]'s fields, which the job master acts on.
    unusable: Option<(String, String, String)>,
}

impl serde::Serialize for TaskError {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        RemoteTaskError {
            message: self.to_string(),
            echo: self.is_echo(),
            unusable: match self {
                TaskError::UnusableCheckpoint {
                    location,
                    file,
                    reason,
                } => Some((location.clone(), file.clone(), reason.clone())),
                _ => None,
            },
        }
        .serialize(s)
    }
}

impl<'de> serde::Deserialize<'de> for TaskError {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let RemoteTaskError {
            message,
            echo,
            unusable,
        } = RemoteTaskError::deserialize(d)?;
        Ok(match unusable {
            Some((location, file, reason)) => TaskError::UnusableCheckpoint {
                location,
                file,
                reason,
            },
            None => TaskError::Remote { message, echo },
        })
    }
}

impl TaskError {
    /// Whether this failure is only the consequence of another task's failure (its upstream or
    /// downstream went away), so that the other task's report names the root cause.
    pub fn is_echo(&self) -> bool {
        matches!(
            self,
            TaskError::UpstreamGone(_)
                | TaskError::Network(NetworkError::Disconnected(_))
                | TaskError::Remote { echo: true, .. }
        )
    }
}

/// An error that ends a job.
#[derive(Debug, Error)]
pub enum JobError {
    /// The job's configuration or graph is invalid.
    #[error("invalid job: {0}")]
    Invalid(String),
    /// The graph model rejected the job.
    #[error("invalid job: {0}")]
    Graph(#[from] CoreError),
    /// Checkpoint storage is unusable (for example, it cannot be written).
    #[error("checkpoint storage: {0}")]
    Storage(#[from] CheckpointError),
    /// Restoring from a checkpoint failed.
    #[error("cannot restore from {path}: {reason}")]
    Restore {
        /// The checkpoint.
        path: String,
        /// Why.
        reason: String,
    },
    /// A requested checkpoint or savepoint was refused or failed.
    #[error("snapshot failed: {0}")]
    Snapshot(String),
    /// A cluster's task managers do not offer the slots the job needs.
    #[error("not enough resources: {0}")]
    NoResources(String),
    /// The job manager of a cluster was lost (seen from a task manager).
    #[error("{0}")]
    JobManagerLost(String),
    /// The restart strategy gave up.
    #[error(
        "job failed after {restarts} restarts; the restart strategy ({strategy}) gave up. Last failure: {cause}"
    )]
    Failed {
        /// Restarts made.
        restarts: u32,
        /// The strategy's description.
        strategy: String,
        /// The last task failure.
        cause: String,
    },
}

/// The reason of a storage error, without the path (the caller names the file).
pub(crate) fn reason_of(e: &CheckpointError) -> String {
    match e {
        CheckpointError::Corrupt { reason, .. } => reason.clone(),
        CheckpointError::Storage { source, .. }
            if source.kind() == opendal::ErrorKind::NotFound =>
        {
            "missing: the file does not exist".to_string()
        }
        CheckpointError::Storage { source, .. } => source.to_string(),
        other => other.to_string(),
    }
}
