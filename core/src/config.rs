//! Checkpointing options, with Flink's meanings and defaults.

use crate::CoreError;
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// The consistency guarantee of checkpoints (Flink's `CheckpointingMode`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum CheckpointingMode {
    /// Barriers are aligned: state reflects each record exactly once.
    #[default]
    ExactlyOnce,
    /// Barriers are tracked, never aligned: after recovery, records may be counted again.
    AtLeastOnce,
}

/// Checkpointing options of a job. `interval: None` means checkpointing is off, Flink's default.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CheckpointConfig {
    /// Time between periodic triggers; `None` disables periodic checkpoints.
    pub interval: Option<Duration>,
    /// Alignment guarantee.
    pub mode: CheckpointingMode,
    /// A pending checkpoint not complete after this long is aborted (Flink default 10 min).
    pub timeout: Duration,
    /// The least time between the end of one checkpoint and the trigger of the next (default 0).
    pub min_pause: Duration,
    /// How many checkpoints may be pending at once (default 1).
    pub max_concurrent: u32,
    /// How many completed checkpoints to keep (Flink's `state.checkpoints.num-retained`, default 1).
    pub num_retained: u32,
    /// Consecutive failed checkpoints tolerated before the job fails; `None` tolerates any number.
    pub tolerable_failed_checkpoints: Option<u32>,
    /// Also trigger a checkpoint each time the sources have emitted this many more records (the
    /// "task count trigger" of the notes); `None`: off.
    pub every_records: Option<u64>,
    /// What happens to retained checkpoints when the job is cancelled.
    pub externalized_retention: ExternalizedRetention,
}

/// What happens to a job's retained checkpoints when it is cancelled (Flink's
/// `ExternalizedCheckpointRetention`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum ExternalizedRetention {
    /// Keep them, so the job can be resumed with `--from` (Weir's default).
    #[default]
    RetainOnCancellation,
    /// Delete them; they are kept only when the job fails.
    DeleteOnCancellation,
}

impl Default for CheckpointConfig {
    fn default() -> Self {
        CheckpointConfig {
            interval: None,
            mode: CheckpointingMode::ExactlyOnce,
            timeout: Duration::from_secs(600),
            min_pause: Duration::ZERO,
            max_concurrent: 1,
            num_retained: 1,
            tolerable_failed_checkpoints: None,
            every_records: None,
            externalized_retention: ExternalizedRetention::RetainOnCancellation,
        }
    }
}

impl CheckpointConfig {
    /// Whether checkpoints are triggered on their own (periodically or by record count).
    pub fn is_enabled(&self) -> bool {
        self.interval.is_some() || self.every_records.is_some()
    }

    /// Checks every option, naming the first that is out of range.
    pub fn validate(&self) -> Result<(), CoreError> {
        let bad = |s: &str| Err(CoreError::InvalidGraph(s.to_string()));
        if self.interval == Some(Duration::ZERO) {
            return bad("checkpoint interval must be greater than zero");
        }
        if self.timeout.is_zero() {
            return bad("checkpoint timeout must be greater than zero");
        }
        if self.max_concurrent == 0 {
            return bad("max concurrent checkpoints must be at least 1");
        }
        if self.every_records == Some(0) {
            return bad("checkpoint every N records needs N greater than zero");
        }
        if self.num_retained == 0 {
            return bad("the number of retained checkpoints must be at least 1");
        }
        Ok(())
    }
}
