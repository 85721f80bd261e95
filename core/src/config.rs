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

/// The longest any duration setting may be (a day): deadlines computed from a setting (a trigger
/// time, a timeout, a restart delay) stay far from overflowing.
pub const MAX_DURATION: Duration = Duration::from_secs(24 * 3600);

/// The most completed checkpoints a job may retain ([`CheckpointConfig::num_retained`]).
pub const MAX_RETAINED_CHECKPOINTS: u32 = 10_000;

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
    /// Unaligned checkpoints (Flink's `execution.checkpointing.unaligned.enabled`, default off):
    /// barriers overtake in-flight data, which is persisted as channel state. Exactly-once only,
    /// one checkpoint at a time. Savepoints stay aligned.
    pub unaligned: bool,
    /// With `unaligned`, how long after its trigger a checkpoint may still be aligning before
    /// it switches to unaligned (Flink's `execution.checkpointing.aligned-checkpoint-timeout`, default 0: start
    /// unaligned).
    pub aligned_checkpoint_timeout: Duration,
}

/// A change of a running job's checkpointing (live tuning, through the REST API's
/// `PATCH /jobs/:jobid/checkpoints/config`): each field that is set replaces the job's value.
/// A completed checkpoint records the job's tuning in its `_metadata`, and a run restored from
/// it applies it again over its own configuration.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckpointTuning {
    /// Time between periodic checkpoints (above 0).
    pub interval: Option<Duration>,
    /// How long a checkpoint may take before it is aborted (above 0).
    pub timeout: Option<Duration>,
    /// The least time between one checkpoint's end and the next trigger.
    pub min_pause: Option<Duration>,
    /// Consecutive failed checkpoints tolerated.
    pub tolerable_failed_checkpoints: Option<u32>,
}

impl CheckpointTuning {
    /// Whether it changes nothing.
    pub fn is_empty(&self) -> bool {
        *self == CheckpointTuning::default()
    }

    /// `config` with this tuning applied, checked; an error names the value that cannot be.
    pub fn applied_to(&self, config: &CheckpointConfig) -> Result<CheckpointConfig, CoreError> {
        if config.interval.is_none() {
            return Err(CoreError::InvalidGraph(
                "checkpointing is off for this job: it cannot be tuned (start it with a \
                 checkpoint interval)"
                    .into(),
            ));
        }
        let mut c = config.clone();
        if let Some(i) = self.interval {
            c.interval = Some(i);
        }
        if let Some(t) = self.timeout {
            c.timeout = t;
        }
        if let Some(p) = self.min_pause {
            c.min_pause = p;
        }
        if let Some(n) = self.tolerable_failed_checkpoints {
            c.tolerable_failed_checkpoints = Some(n);
        }
        c.validate()?;
        Ok(c)
    }

    /// This tuning with `newer`'s settings over it.
    pub fn then(&self, newer: &CheckpointTuning) -> CheckpointTuning {
        CheckpointTuning {
            interval: newer.interval.or(self.interval),
            timeout: newer.timeout.or(self.timeout),
            min_pause: newer.min_pause.or(self.min_pause),
            tolerable_failed_checkpoints: newer
                .tolerable_failed_checkpoints
                .or(self.tolerable_failed_checkpoints),
        }
    }
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
            unaligned: false,
            aligned_checkpoint_timeout: Duration::ZERO,
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
        if self.num_retained == 0 || self.num_retained > MAX_RETAINED_CHECKPOINTS {
            return Err(CoreError::InvalidGraph(format!(
                "the number of retained checkpoints ({}) must be between 1 and {MAX_RETAINED_CHECKPOINTS}",
                self.num_retained
            )));
        }
        let durations = [
            ("checkpoint interval", self.interval.unwrap_or_default()),
            ("checkpoint timeout", self.timeout),
            ("min pause between checkpoints", self.min_pause),
            (
                "aligned checkpoint timeout",
                self.aligned_checkpoint_timeout,
            ),
        ];
        if let Some((what, d)) = durations.into_iter().find(|(_, d)| *d > MAX_DURATION) {
            return Err(CoreError::InvalidGraph(format!(
                "the {what} ({d:?}) must be at most {MAX_DURATION:?} (a day)"
            )));
        }
        if self.unaligned && self.mode == CheckpointingMode::AtLeastOnce {
            return bad(
                "unaligned checkpoints conflict with the at-least-once mode: unaligned checkpoints are exactly-once only (disable one of them)",
            );
        }
        if self.unaligned && self.max_concurrent > 1 {
            return Err(CoreError::InvalidGraph(format!(
                "unaligned checkpoints conflict with max concurrent checkpoints = {}: unaligned checkpoints run one at a time (set it to 1)",
                self.max_concurrent
            )));
        }
        if !self.unaligned && !self.aligned_checkpoint_timeout.is_zero() {
            return bad(
                "an aligned checkpoint timeout needs unaligned checkpoints enabled: it is the time before an aligned checkpoint switches to unaligned",
            );
        }
        Ok(())
    }

    /// The alignment of the checkpoints (not savepoints) this configuration takes.
    pub fn checkpoint_alignment(&self) -> crate::element::AlignmentType {
        use crate::element::AlignmentType;
        match (self.mode, self.unaligned) {
            (CheckpointingMode::AtLeastOnce, _) => AlignmentType::AtLeastOnce,
            (CheckpointingMode::ExactlyOnce, false) => AlignmentType::Aligned,
            (CheckpointingMode::ExactlyOnce, true) if self.aligned_checkpoint_timeout.is_zero() => {
                AlignmentType::Unaligned
            }
            (CheckpointingMode::ExactlyOnce, true) => AlignmentType::AlignedWithTimeout {
                timeout: self.aligned_checkpoint_timeout,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn out_of_range_values_are_named() {
        let e = |c: CheckpointConfig| c.validate().unwrap_err().to_string();
        for retained in [0, MAX_RETAINED_CHECKPOINTS + 1, u32::MAX] {
            let msg = e(CheckpointConfig {
                num_retained: retained,
                ..CheckpointConfig::default()
            });
            assert!(
                msg.contains(&format!("retained checkpoints ({retained})"))
                    && msg.contains("between 1 and 10000"),
                "{msg}"
            );
        }
        let huge = Duration::MAX;
        let msg = e(CheckpointConfig {
            interval: Some(huge),
            ..CheckpointConfig::default()
        });
        assert!(
            msg.contains("checkpoint interval") && msg.contains("86400s"),
            "{msg}"
        );
        let msg = e(CheckpointConfig {
            timeout: MAX_DURATION + Duration::from_nanos(1),
            ..CheckpointConfig::default()
        });
        assert!(msg.contains("checkpoint timeout"), "{msg}");
        let msg = e(CheckpointConfig {
            min_pause: huge,
            ..CheckpointConfig::default()
        });
        assert!(msg.contains("min pause"), "{msg}");
        let at_the_bounds = CheckpointConfig {
            interval: Some(MAX_DURATION),
            timeout: MAX_DURATION,
            min_pause: MAX_DURATION,
            num_retained: MAX_RETAINED_CHECKPOINTS,
            ..CheckpointConfig::default()
        };
        assert_eq!(at_the_bounds.validate(), Ok(()));
    }

    #[test]
    fn unaligned_conflicts_are_named() {
        let unaligned = CheckpointConfig {
            unaligned: true,
            ..CheckpointConfig::default()
        };
        assert_eq!(unaligned.validate(), Ok(()));
        let e = CheckpointConfig {
            mode: CheckpointingMode::AtLeastOnce,
            ..unaligned.clone()
        }
        .validate()
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("unaligned") && e.contains("at-least-once"),
            "{e}"
        );
        let e = CheckpointConfig {
            max_concurrent: 2,
            ..unaligned.clone()
        }
        .validate()
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("unaligned") && e.contains("max concurrent checkpoints = 2"),
            "{e}"
        );
        let e = CheckpointConfig {
            aligned_checkpoint_timeout: Duration::from_millis(5),
            ..CheckpointConfig::default()
        }
        .validate()
        .unwrap_err()
        .to_string();
        assert!(e.contains("aligned checkpoint timeout"), "{e}");
    }
}
