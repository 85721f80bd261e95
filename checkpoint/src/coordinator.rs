//! The CheckpointCoordinator as a pure state machine (reference: "Job manager side").
//!
//! The runtime feeds it facts (the job turned RUNNING, time passed, a subtask acknowledged or
//! declined, `_metadata` was written) and carries out the [`CoordinatorAction`]s it returns:
//! trigger the sources, finalize, notify complete or aborted, fail the job. Time comes in as
//! `now` (monotonic, since the coordinator was built), so every decision is testable without a
//! clock, a thread or storage.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::fmt;
use std::time::Duration;
use weir_core::config::CheckpointConfig;
use weir_core::element::{AlignmentType, CheckpointOptions, SnapshotKind};
use weir_core::handle::{TaskStateSnapshot, saturating_sum};
use weir_core::ids::{CheckpointId, SubtaskIndex, VertexId};

/// One subtask, as the coordinator tracks it (attempts are the runtime's business).
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
pub struct TaskKey {
    /// The vertex.
    pub vertex: VertexId,
    /// The subtask.
    pub subtask: SubtaskIndex,
}

impl fmt::Display for TaskKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "v{}[{}]", self.vertex.0, self.subtask)
    }
}

/// Why a checkpoint failed, in Flink's categories.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum CheckpointFailureReason {
    /// Not complete within the checkpoint timeout (`CHECKPOINT_EXPIRED`).
    Expired,
    /// A subtask declined in its synchronous phase or because it was closing.
    Declined {
        /// The subtask.
        task: TaskKey,
        /// Its reason.
        reason: String,
    },
    /// A subtask's asynchronous phase (the upload) failed (`CHECKPOINT_ASYNC_EXCEPTION`).
    AsyncPhaseFailed {
        /// The subtask.
        task: TaskKey,
        /// The error.
        reason: String,
    },
    /// The storage location could not be prepared (`TRIGGER_CHECKPOINT_FAILURE`/`IO_EXCEPTION`).
    StorageFailure(String),
    /// `_metadata` could not be written (`FINALIZE_CHECKPOINT_FAILURE`).
    FinalizeFailed(String),
    /// A newer checkpoint completed first (`CHECKPOINT_SUBSUMED`).
    Subsumed,
    /// A barrier handler aborted it (a newer barrier or a cancel marker).
    AbortedInAlignment(String),
    /// A subtask it waited for finished before acknowledging.
    TaskFinished(TaskKey),
    /// The job stopped running (failure, cancellation, restart).
    JobNotRunning,
}

impl CheckpointFailureReason {
    /// Whether it counts toward `tolerable_failed_checkpoints`, as in Flink's
    /// `CheckpointFailureManager`: timeouts, asynchronous-phase and storage failures do.
    pub fn counts_as_failure(&self) -> bool {
        matches!(
            self,
            CheckpointFailureReason::Expired
                | CheckpointFailureReason::AsyncPhaseFailed { .. }
                | CheckpointFailureReason::StorageFailure(_)
                | CheckpointFailureReason::FinalizeFailed(_)
        )
    }
}

impl fmt::Display for CheckpointFailureReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CheckpointFailureReason::Expired => write!(f, "expired before completing"),
            CheckpointFailureReason::Declined { task, reason } => {
                write!(f, "declined by {task}: {reason}")
            }
            CheckpointFailureReason::AsyncPhaseFailed { task, reason } => {
                write!(f, "asynchronous phase failed in {task}: {reason}")
            }
            CheckpointFailureReason::StorageFailure(r) => write!(f, "storage failure: {r}"),
            CheckpointFailureReason::FinalizeFailed(r) => write!(f, "finalizing failed: {r}"),
            CheckpointFailureReason::Subsumed => write!(f, "subsumed by a newer checkpoint"),
            CheckpointFailureReason::AbortedInAlignment(r) => {
                write!(f, "aborted in alignment: {r}")
            }
            CheckpointFailureReason::TaskFinished(t) => {
                write!(f, "{t} finished before acknowledging")
            }
            CheckpointFailureReason::JobNotRunning => write!(f, "the job is not running"),
        }
    }
}

/// Why a trigger request did not start a checkpoint.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TriggerRefusal {
    /// The job is not running (or checkpointing is not active).
    NotRunning,
    /// A task to trigger or wait for is not running (`NOT_ALL_REQUIRED_TASKS_RUNNING`).
    NotAllTasksRunning(TaskKey),
    /// Every subtask finished: the job is ending.
    AllTasksFinished,
    /// The job is stopping with this savepoint.
    Stopping(CheckpointId),
    /// `max_concurrent_checkpoints` are pending.
    TooManyConcurrent(usize),
    /// The min pause since the last completion has not passed; the next trigger is due at `.0`.
    MinPause(Duration),
}

impl fmt::Display for TriggerRefusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TriggerRefusal::NotRunning => write!(f, "the job is not running"),
            TriggerRefusal::NotAllTasksRunning(t) => write!(f, "task {t} is not running"),
            TriggerRefusal::AllTasksFinished => write!(f, "every task finished"),
            TriggerRefusal::Stopping(id) => write!(f, "the job is stopping with savepoint {id}"),
            TriggerRefusal::TooManyConcurrent(n) => {
                write!(f, "{n} checkpoints are already in progress")
            }
            TriggerRefusal::MinPause(_) => {
                write!(f, "the min pause between checkpoints has not passed")
            }
        }
    }
}

/// What a subtask reports with its acknowledgement (Flink's `CheckpointMetrics`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SubtaskCheckpointMetrics {
    /// Time from the trigger to the barrier reaching the subtask.
    pub start_delay: Duration,
    /// Time spent aligning barriers.
    pub alignment: Duration,
    /// Synchronous part of the snapshot.
    pub sync_duration: Duration,
    /// Asynchronous part (serialize and upload).
    pub async_duration: Duration,
    /// Bytes of state.
    pub state_size: u64,
    /// Bytes of records the subtask processed while it aligned this checkpoint's barriers
    /// (Flink's processed data; their encoded size).
    pub processed_data: u64,
}

/// A checkpoint's status in the statistics.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CheckpointStatus {
    /// Triggered, not yet complete.
    InProgress,
    /// Complete: `_metadata` written.
    Completed,
    /// Failed, with the reason.
    Failed(CheckpointFailureReason),
}

/// The bytes an acknowledgement's checkpoint wrote: its state less the shared files it
/// references that earlier checkpoints wrote.
pub fn checkpointed_size(state: &TaskStateSnapshot) -> u64 {
    let reused = state
        .operators
        .values()
        .flat_map(|s| s.streams())
        .filter(|h| {
            crate::storage::is_shared(h)
                && h.path()
                    .is_some_and(|p| !state.new_shared.iter().any(|n| n == p))
        })
        .map(|h| h.size());
    state.state_size().saturating_sub(saturating_sum(reused))
}

/// The statistics of one checkpoint, in Flink's terms.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CheckpointStats {
    /// Its id.
    pub id: CheckpointId,
    /// Checkpoint or savepoint.
    pub kind: SnapshotKind,
    /// Status.
    pub status: CheckpointStatus,
    /// Wall-clock trigger time, ms since the Unix epoch.
    pub trigger_timestamp_ms: u64,
    /// Trigger to completion (or to failure).
    pub end_to_end: Option<Duration>,
    /// Bytes of state over all subtasks (in-flight data included): Flink's full checkpoint
    /// data size.
    pub state_size: u64,
    /// Bytes this checkpoint wrote: its state less the shared files earlier checkpoints wrote
    /// and it references again (Flink's checkpointed data size; the same as `state_size`
    /// without incremental checkpoints).
    pub checkpointed_size: u64,
    /// Bytes of persisted in-flight data (unaligned checkpoints) over all subtasks.
    pub in_flight_size: u64,
    /// Bytes of records processed during alignment over all subtasks (Flink's processed
    /// data).
    pub processed_size: u64,
    /// Subtasks that acknowledged, of `num_subtasks`.
    pub num_acknowledged: usize,
    /// Subtasks it waits for.
    pub num_subtasks: usize,
    /// Per subtask.
    pub subtasks: BTreeMap<TaskKey, SubtaskCheckpointMetrics>,
}

impl fmt::Display for CheckpointStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let dur = self
            .end_to_end
            .map(|d| format!("{:.1}ms", d.as_secs_f64() * 1e3))
            .unwrap_or_else(|| "-".into());
        let max_align = self
            .subtasks
            .values()
            .map(|m| m.alignment)
            .max()
            .unwrap_or_default();
        let max_sync = self
            .subtasks
            .values()
            .map(|m| m.sync_duration)
            .max()
            .unwrap_or_default();
        let max_async = self
            .subtasks
            .values()
            .map(|m| m.async_duration)
            .max()
            .unwrap_or_default();
        let status = match &self.status {
            CheckpointStatus::InProgress => "IN_PROGRESS".to_string(),
            CheckpointStatus::Completed => "COMPLETED".to_string(),
            CheckpointStatus::Failed(r) => format!("FAILED ({r})"),
        };
        write!(
            f,
            "checkpoint {} {:?} {status}: duration {dur}, state {} B, in-flight {} B, acked {}/{}, max alignment {:.1}ms, max sync {:.1}ms, max async {:.1}ms",
            self.id,
            self.kind,
            self.state_size,
            self.in_flight_size,
            self.num_acknowledged,
            self.num_subtasks,
            max_align.as_secs_f64() * 1e3,
            max_sync.as_secs_f64() * 1e3,
            max_async.as_secs_f64() * 1e3,
        )?;
        if self.checkpointed_size != self.state_size {
            write!(f, ", checkpointed {} B", self.checkpointed_size)?;
        }
        Ok(())
    }
}

/// What the runtime must carry out.
#[derive(Clone, Debug, PartialEq)]
pub enum CoordinatorAction {
    /// Prepare the storage location of `id`, then trigger every source subtask in `tasks`
    /// (the reference's `triggerCheckpointAsync`). If the location fails, report
    /// [`CheckpointCoordinator::trigger_failed`].
    Trigger {
        /// The checkpoint.
        id: CheckpointId,
        /// Barrier timestamp, ms since the Unix epoch.
        timestamp_ms: u64,
        /// How it is taken.
        options: CheckpointOptions,
        /// The source subtasks.
        tasks: Vec<TaskKey>,
    },
    /// Trigger checkpoint `id`, already started, in these subtasks through their mailboxes:
    /// they finished (their input ended) before its barrier could reach them, and snapshot
    /// their final state instead (Flink's checkpoints after tasks finished, FLIP-147). The
    /// storage location and the operator coordinators' state were prepared by the `Trigger`.
    TriggerFinished {
        /// The checkpoint.
        id: CheckpointId,
        /// Barrier timestamp, ms since the Unix epoch.
        timestamp_ms: u64,
        /// How it is taken.
        options: CheckpointOptions,
        /// The finished subtasks.
        tasks: Vec<TaskKey>,
    },
    /// Every subtask acknowledged: write `_metadata` from these acknowledgements, then report
    /// [`CheckpointCoordinator::finalized`].
    Finalize {
        /// The checkpoint.
        id: CheckpointId,
        /// Checkpoint or savepoint.
        kind: SnapshotKind,
        /// Trigger time, ms since the Unix epoch.
        timestamp_ms: u64,
        /// Each subtask's state handles.
        acks: BTreeMap<TaskKey, TaskStateSnapshot>,
    },
    /// The checkpoint is complete: call `notify_checkpoint_complete` on these subtasks.
    NotifyComplete {
        /// The checkpoint.
        id: CheckpointId,
        /// The subtasks to commit to.
        tasks: Vec<TaskKey>,
    },
    /// The checkpoint was aborted: call `notify_checkpoint_aborted` on these subtasks, and
    /// discard its partial location.
    NotifyAborted {
        /// The checkpoint.
        id: CheckpointId,
        /// Why.
        reason: CheckpointFailureReason,
        /// The subtasks.
        tasks: Vec<TaskKey>,
    },
    /// More consecutive failures than tolerated: fail the job.
    FailJob {
        /// The message.
        reason: String,
    },
}

#[derive(Clone, Debug)]
struct Pending {
    kind: SnapshotKind,
    options: CheckpointOptions,
    timestamp_ms: u64,
    triggered_at: Duration,
    deadline: Duration,
    not_yet_acked: BTreeSet<TaskKey>,
    acks: BTreeMap<TaskKey, TaskStateSnapshot>,
    metrics: BTreeMap<TaskKey, SubtaskCheckpointMetrics>,
    /// Persisted in-flight bytes acknowledged so far.
    in_flight_size: u64,
    finalizing: bool,
}

/// The fixed facts the coordinator is built from (reference step 1).
#[derive(Clone, Debug)]
pub struct CoordinatorSetup {
    /// Checkpointing options.
    pub config: CheckpointConfig,
    /// The source subtasks, which receive triggers.
    pub tasks_to_trigger: Vec<TaskKey>,
    /// Every subtask, which must acknowledge.
    pub tasks_to_wait_for: Vec<TaskKey>,
    /// The next checkpoint id (1, or one past the restored checkpoint's).
    pub next_checkpoint_id: u64,
    /// Wall-clock ms since the Unix epoch at `now == 0`.
    pub epoch_wall_ms: u64,
}

/// How many checkpoints' statistics are kept (Flink's `web.checkpoints.history`).
pub const STATS_HISTORY: usize = 10;
/// How many end-to-end durations are kept for percentiles.
const DURATION_HISTORY: usize = 10_000;

/// The checkpoint coordinator of one job.
#[derive(Debug)]
pub struct CheckpointCoordinator {
    setup: CoordinatorSetup,
    active: bool,
    /// A stop-with-savepoint is in progress: no other checkpoint starts (Flink stops its
    /// scheduler), so nothing is taken, or committed, after the state the job stops with.
    stopping: Option<CheckpointId>,
    running: BTreeSet<TaskKey>,
    finished: BTreeSet<TaskKey>,
    next_id: u64,
    pending: BTreeMap<CheckpointId, Pending>,
    next_periodic: Option<Duration>,
    last_completion: Option<Duration>,
    consecutive_failures: u32,
    history: VecDeque<CheckpointStats>,
    /// End-to-end duration and persisted in-flight bytes of completed checkpoints.
    durations: VecDeque<(Duration, u64)>,
    completed: u64,
    failed: u64,
    latest_completed: Option<CheckpointId>,
    records_at_last_trigger: u64,
    refusals: VecDeque<(Duration, TriggerRefusal)>,
    refused: u64,
    /// Set while [`trigger_final`](Self::trigger_final) checks its trigger.
    final_requested: bool,
}

impl CheckpointCoordinator {
    /// Builds the coordinator (inactive until the job turns RUNNING).
    pub fn new(setup: CoordinatorSetup) -> CheckpointCoordinator {
        let next_id = setup.next_checkpoint_id.max(1);
        CheckpointCoordinator {
            setup,
            active: false,
            stopping: None,
            running: BTreeSet::new(),
            finished: BTreeSet::new(),
            next_id,
            pending: BTreeMap::new(),
            next_periodic: None,
            last_completion: None,
            consecutive_failures: 0,
            history: VecDeque::new(),
            durations: VecDeque::new(),
            completed: 0,
            failed: 0,
            latest_completed: None,
            records_at_last_trigger: 0,
            refusals: VecDeque::new(),
            refused: 0,
            final_requested: false,
        }
    }

    /// The sources have emitted `total` records so far in this deployment: with
    /// `every_records = N`, a checkpoint is triggered once `N` more were emitted since the last
    /// trigger. A refused trigger (too many in progress, min pause) is retried on the next report,
    /// so the request waits rather than being lost.
    pub fn records_emitted(&mut self, total: u64, now: Duration, out: &mut Vec<CoordinatorAction>) {
        let Some(every) = self.setup.config.every_records else {
            return;
        };
        if total.saturating_sub(self.records_at_last_trigger) >= every
            && self.try_trigger(SnapshotKind::Checkpoint, now, out).is_ok()
        {
            self.records_at_last_trigger = total;
        }
    }

    /// Trigger requests refused (periodic, by record count or on demand), newest last, with the
    /// time and reason; at most [`STATS_HISTORY`] are kept.
    pub fn refusals(&self) -> impl Iterator<Item = &(Duration, TriggerRefusal)> {
        self.refusals.iter()
    }

    /// How many trigger requests were refused in all.
    pub fn refused_count(&self) -> u64 {
        self.refused
    }

    fn note_refusal(&mut self, now: Duration, refusal: &TriggerRefusal) {
        self.refused += 1;
        if self.refusals.len() == STATS_HISTORY {
            self.refusals.pop_front();
        }
        self.refusals.push_back((now, refusal.clone()));
    }

    fn wall_ms(&self, now: Duration) -> u64 {
        self.setup.epoch_wall_ms + now.as_millis() as u64
    }

    /// The job-status listener (reference step 3): RUNNING starts the periodic scheduler, any
    /// other status stops it and aborts what is pending.
    pub fn job_status_changed(
        &mut self,
        running: bool,
        now: Duration,
        out: &mut Vec<CoordinatorAction>,
    ) {
        if running {
            self.active = true;
            self.next_periodic = self.setup.config.interval.map(|i| now + i);
        } else {
            self.active = false;
            self.next_periodic = None;
            self.running.clear();
            let ids: Vec<CheckpointId> = self.pending.keys().copied().collect();
            for id in ids {
                self.abort(id, CheckpointFailureReason::JobNotRunning, now, out);
            }
        }
    }

    /// A subtask's current attempt is running.
    pub fn task_running(&mut self, task: TaskKey) {
        self.finished.remove(&task);
        self.running.insert(task);
    }

    /// A subtask finished (its input ended). It stays until the job ends and still takes
    /// checkpoints (Flink's FLIP-147): later checkpoints trigger it through its mailbox, and
    /// pending ones still waiting for it trigger it now, since their barrier may never reach it.
    /// A subtask that already took the checkpoint ignores the second trigger.
    pub fn task_finished(
        &mut self,
        task: TaskKey,
        _now: Duration,
        out: &mut Vec<CoordinatorAction>,
    ) {
        self.running.remove(&task);
        self.finished.insert(task);
        for (id, p) in &self.pending {
            if p.not_yet_acked.contains(&task) && !p.finalizing {
                out.push(CoordinatorAction::TriggerFinished {
                    id: *id,
                    timestamp_ms: p.timestamp_ms,
                    options: p.options,
                    tasks: vec![task],
                });
            }
        }
    }

    /// When the runtime should call [`tick`](Self::tick) next, if ever.
    pub fn next_wakeup(&self) -> Option<Duration> {
        let deadline = self
            .pending
            .values()
            .filter(|p| !p.finalizing)
            .map(|p| p.deadline)
            .min();
        match (self.next_periodic, deadline) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Time passed: expire pending checkpoints past their timeout (the canceller) and trigger a
    /// periodic checkpoint when one is due.
    pub fn tick(&mut self, now: Duration, out: &mut Vec<CoordinatorAction>) {
        // A checkpoint whose `_metadata` is being written is past the point of no return: its
        // outcome is the write's.
        let expired: Vec<CheckpointId> = self
            .pending
            .iter()
            .filter(|(_, p)| p.deadline <= now && !p.finalizing)
            .map(|(id, _)| *id)
            .collect();
        for id in expired {
            self.abort(id, CheckpointFailureReason::Expired, now, out);
        }
        if let (Some(due), Some(interval)) = (self.next_periodic, self.setup.config.interval)
            && due <= now
        {
            match self.try_trigger(SnapshotKind::Checkpoint, now, out) {
                Err(TriggerRefusal::MinPause(at)) => self.next_periodic = Some(at),
                _ => self.next_periodic = Some(now + interval),
            }
        }
    }

    /// Live tuning: the configuration becomes `config` (interval, timeout, min pause,
    /// tolerable failures). The next periodic checkpoint is due one new interval from now at
    /// the latest; checkpoints in progress keep the timeout they started with.
    pub fn retune(&mut self, config: CheckpointConfig, now: Duration) {
        if self.active
            && let Some(interval) = config.interval
        {
            let due = now + interval;
            self.next_periodic = Some(self.next_periodic.map_or(due, |d| d.min(due)));
        }
        self.setup.config = config;
    }

    /// The configuration it runs with.
    pub fn config(&self) -> &CheckpointConfig {
        &self.setup.config
    }

    /// An on-demand checkpoint or savepoint (from the API).
    pub fn trigger(
        &mut self,
        kind: SnapshotKind,
        now: Duration,
        out: &mut Vec<CoordinatorAction>,
    ) -> Result<CheckpointId, TriggerRefusal> {
        self.try_trigger(kind, now, out)
    }

    /// The final checkpoint (Flink's FLIP-147): taken once every subtask finished, each
    /// snapshotting its final state, so that what sinks commit at the job's end is covered by
    /// a completed checkpoint (a run killed before the job ended resumes from it, not from an
    /// earlier one whose successors' output is committed). Not held back by the min pause;
    /// refused while `max_concurrent` checkpoints are pending or a stop is in progress.
    pub fn trigger_final(
        &mut self,
        now: Duration,
        out: &mut Vec<CoordinatorAction>,
    ) -> Result<CheckpointId, TriggerRefusal> {
        self.final_requested = true;
        let result = self.check_and_trigger(SnapshotKind::Checkpoint, now, out);
        self.final_requested = false;
        result
    }

    fn try_trigger(
        &mut self,
        kind: SnapshotKind,
        now: Duration,
        out: &mut Vec<CoordinatorAction>,
    ) -> Result<CheckpointId, TriggerRefusal> {
        let result = self.check_and_trigger(kind, now, out);
        if let Err(refusal) = &result
            && self.active
        {
            self.note_refusal(now, refusal);
        }
        result
    }

    fn check_and_trigger(
        &mut self,
        kind: SnapshotKind,
        now: Duration,
        out: &mut Vec<CoordinatorAction>,
    ) -> Result<CheckpointId, TriggerRefusal> {
        if !self.active {
            return Err(TriggerRefusal::NotRunning);
        }
        if let Some(id) = self.stopping {
            return Err(TriggerRefusal::Stopping(id));
        }
        for t in self
            .setup
            .tasks_to_trigger
            .iter()
            .chain(&self.setup.tasks_to_wait_for)
        {
            if !self.running.contains(t) && !self.finished.contains(t) {
                return Err(TriggerRefusal::NotAllTasksRunning(*t));
            }
        }
        if !self.final_requested
            && self
                .setup
                .tasks_to_wait_for
                .iter()
                .all(|t| self.finished.contains(t))
        {
            return Err(TriggerRefusal::AllTasksFinished);
        }
        // Savepoints are forced, as in Flink: neither the concurrency limit nor the minimum pause
        // holds them back behind periodic checkpoints.
        if kind == SnapshotKind::Checkpoint {
            let max = self.setup.config.max_concurrent as usize;
            if self.pending.len() >= max {
                return Err(TriggerRefusal::TooManyConcurrent(self.pending.len()));
            }
            if let Some(last) = self.last_completion
                && !self.final_requested
            {
                let earliest = last + self.setup.config.min_pause;
                if now < earliest {
                    return Err(TriggerRefusal::MinPause(earliest));
                }
            }
        }
        let id = CheckpointId(self.next_id);
        self.next_id += 1;
        if kind == SnapshotKind::SynchronousSavepoint {
            self.stopping = Some(id);
        }
        let timestamp_ms = self.wall_ms(now);
        let alignment = match (kind, self.setup.config.mode) {
            // Savepoints are always aligned.
            (SnapshotKind::Savepoint | SnapshotKind::SynchronousSavepoint, _) => {
                AlignmentType::Aligned
            }
            _ => self.setup.config.checkpoint_alignment(),
        };
        let wait: BTreeSet<TaskKey> = self.setup.tasks_to_wait_for.iter().copied().collect();
        self.pending.insert(
            id,
            Pending {
                kind,
                options: CheckpointOptions { kind, alignment },
                timestamp_ms,
                triggered_at: now,
                deadline: now + self.setup.config.timeout,
                not_yet_acked: wait,
                acks: BTreeMap::new(),
                metrics: BTreeMap::new(),
                in_flight_size: 0,
                finalizing: false,
            },
        );
        self.push_history(CheckpointStats {
            id,
            kind,
            status: CheckpointStatus::InProgress,
            trigger_timestamp_ms: timestamp_ms,
            end_to_end: None,
            state_size: 0,
            checkpointed_size: 0,
            in_flight_size: 0,
            processed_size: 0,
            num_acknowledged: 0,
            num_subtasks: self.setup.tasks_to_wait_for.len(),
            subtasks: BTreeMap::new(),
        });
        // Running sources get the trigger and inject barriers; finished subtasks get it too and
        // snapshot their final state, since no barrier will reach them.
        let mut tasks: Vec<TaskKey> = self
            .setup
            .tasks_to_trigger
            .iter()
            .filter(|t| self.running.contains(t))
            .copied()
            .collect();
        let finished: Vec<TaskKey> = self
            .setup
            .tasks_to_wait_for
            .iter()
            .filter(|t| self.finished.contains(t) && !tasks.contains(t))
            .copied()
            .collect();
        tasks.extend(finished);
        out.push(CoordinatorAction::Trigger {
            id,
            timestamp_ms,
            options: CheckpointOptions { kind, alignment },
            tasks,
        });
        Ok(id)
    }

    /// The storage location of `id` could not be prepared.
    pub fn trigger_failed(
        &mut self,
        id: CheckpointId,
        reason: String,
        now: Duration,
        out: &mut Vec<CoordinatorAction>,
    ) {
        self.abort(
            id,
            CheckpointFailureReason::StorageFailure(reason),
            now,
            out,
        );
    }

    /// A subtask acknowledged `id` with its state handles (reference step 5).
    pub fn acknowledge(
        &mut self,
        task: TaskKey,
        id: CheckpointId,
        state: TaskStateSnapshot,
        metrics: SubtaskCheckpointMetrics,
        _now: Duration,
        out: &mut Vec<CoordinatorAction>,
    ) {
        let Some(p) = self.pending.get_mut(&id) else {
            return; // late acknowledgement of an aborted checkpoint: its location is discarded
        };
        if !p.not_yet_acked.remove(&task) {
            return;
        }
        p.acks.insert(task, state);
        p.metrics.insert(task, metrics);
        let num_acked = p.acks.len();
        // Saturating: the sizes come from task managers' messages.
        let state_size = saturating_sum(p.acks.values().map(|s| s.state_size()));
        let checkpointed_size = saturating_sum(p.acks.values().map(checkpointed_size));
        let in_flight_size = saturating_sum(p.acks.values().map(|s| s.in_flight_size()));
        p.in_flight_size = in_flight_size;
        let processed_size = saturating_sum(p.metrics.values().map(|m| m.processed_data));
        let done = p.not_yet_acked.is_empty();
        if let Some(s) = self.history.iter_mut().find(|s| s.id == id) {
            s.num_acknowledged = num_acked;
            s.state_size = state_size;
            s.checkpointed_size = checkpointed_size;
            s.in_flight_size = in_flight_size;
            s.processed_size = processed_size;
            s.subtasks.insert(task, metrics);
        }
        let Some(p) = self.pending.get_mut(&id) else {
            return;
        };
        if done && !p.finalizing {
            p.finalizing = true;
            out.push(CoordinatorAction::Finalize {
                id,
                kind: p.kind,
                timestamp_ms: p.timestamp_ms,
                acks: std::mem::take(&mut p.acks),
            });
        }
    }

    /// A subtask declined `id`.
    pub fn decline(
        &mut self,
        task: TaskKey,
        id: CheckpointId,
        reason: CheckpointFailureReason,
        now: Duration,
        out: &mut Vec<CoordinatorAction>,
    ) {
        if self.pending.get(&id).is_some_and(|p| !p.finalizing) {
            let _ = task;
            self.abort(id, reason, now, out);
        }
    }

    /// `_metadata` of `id` was written (`Ok`) or could not be (`Err`).
    pub fn finalized(
        &mut self,
        id: CheckpointId,
        result: Result<(), String>,
        now: Duration,
        out: &mut Vec<CoordinatorAction>,
    ) {
        if let Err(e) = result {
            self.abort(id, CheckpointFailureReason::FinalizeFailed(e), now, out);
            return;
        }
        let Some(p) = self.pending.remove(&id) else {
            return;
        };
        let duration = now.saturating_sub(p.triggered_at);
        self.completed += 1;
        self.consecutive_failures = 0;
        self.last_completion = Some(now);
        self.latest_completed = Some(id);
        // Percentiles describe periodic checkpoints; savepoints are kept out of them.
        if p.kind == SnapshotKind::Checkpoint {
            if self.durations.len() == DURATION_HISTORY {
                self.durations.pop_front();
            }
            self.durations.push_back((duration, p.in_flight_size));
        }
        if let Some(s) = self.history.iter_mut().find(|s| s.id == id) {
            s.status = CheckpointStatus::Completed;
            s.end_to_end = Some(duration);
        }
        // An intermediate savepoint commits no side effects (Flink 1.15, FLINK-25191): a
        // failover restores from checkpoints only, so sinks that committed on a savepoint would
        // repeat that output after one (found by the simulation, seed 262). A stop-with-savepoint
        // does commit: the job ends on it.
        let tasks = if p.kind == SnapshotKind::Savepoint {
            Vec::new()
        } else {
            self.setup.tasks_to_wait_for.clone()
        };
        out.push(CoordinatorAction::NotifyComplete { id, tasks });
        // Older pending checkpoints are subsumed (savepoints are not).
        let older: Vec<CheckpointId> = self
            .pending
            .iter()
            .filter(|(pid, pp)| **pid < id && pp.kind == SnapshotKind::Checkpoint && !pp.finalizing)
            .map(|(pid, _)| *pid)
            .collect();
        for old in older {
            self.abort(old, CheckpointFailureReason::Subsumed, now, out);
        }
    }

    fn abort(
        &mut self,
        id: CheckpointId,
        reason: CheckpointFailureReason,
        now: Duration,
        out: &mut Vec<CoordinatorAction>,
    ) {
        let Some(p) = self.pending.remove(&id) else {
            return;
        };
        if self.stopping == Some(id) {
            // The stop failed: the job goes on, and so do its checkpoints.
            self.stopping = None;
        }
        self.failed += 1;
        if let Some(s) = self.history.iter_mut().find(|s| s.id == id) {
            s.status = CheckpointStatus::Failed(reason.clone());
            s.end_to_end = Some(now.saturating_sub(p.triggered_at));
        }
        let counts = reason.counts_as_failure();
        out.push(CoordinatorAction::NotifyAborted {
            id,
            reason: reason.clone(),
            tasks: self.setup.tasks_to_wait_for.clone(),
        });
        if counts {
            self.consecutive_failures += 1;
            if let Some(tolerable) = self.setup.config.tolerable_failed_checkpoints
                && self.consecutive_failures > tolerable
            {
                out.push(CoordinatorAction::FailJob {
                    reason: format!(
                        "exceeded the tolerable failed checkpoints ({tolerable}): {} consecutive failures, the last: checkpoint {id} {reason}",
                        self.consecutive_failures
                    ),
                });
                self.consecutive_failures = 0;
            }
        }
    }

    fn push_history(&mut self, s: CheckpointStats) {
        if self.history.len() == STATS_HISTORY {
            self.history.pop_front();
        }
        self.history.push_back(s);
    }

    /// The last [`STATS_HISTORY`] checkpoints, oldest first.
    pub fn history(&self) -> impl Iterator<Item = &CheckpointStats> {
        self.history.iter()
    }

    /// The statistics of checkpoint `id`, if still in the history.
    pub fn stats(&self, id: CheckpointId) -> Option<&CheckpointStats> {
        self.history.iter().find(|s| s.id == id)
    }

    /// Counts of completed and failed checkpoints.
    pub fn counts(&self) -> (u64, u64) {
        (self.completed, self.failed)
    }

    /// End-to-end durations of recent completed checkpoints, oldest first.
    pub fn completed_durations(&self) -> impl Iterator<Item = Duration> + '_ {
        self.durations.iter().map(|(d, _)| *d)
    }

    /// The persisted in-flight bytes of the same checkpoints, in the same order.
    pub fn completed_in_flight(&self) -> impl Iterator<Item = u64> + '_ {
        self.durations.iter().map(|(_, b)| *b)
    }

    /// The newest completed checkpoint.
    pub fn latest_completed(&self) -> Option<CheckpointId> {
        self.latest_completed
    }

    /// The ids pending now.
    pub fn pending_ids(&self) -> Vec<CheckpointId> {
        self.pending.keys().copied().collect()
    }

    /// The id the next checkpoint will get.
    pub fn next_checkpoint_id(&self) -> u64 {
        self.next_id
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(v: u32, s: u32) -> TaskKey {
        TaskKey {
            vertex: VertexId(v),
            subtask: s,
        }
    }

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn coordinator(config: CheckpointConfig) -> CheckpointCoordinator {
        let mut c = CheckpointCoordinator::new(CoordinatorSetup {
            config,
            tasks_to_trigger: vec![key(0, 0)],
            tasks_to_wait_for: vec![key(0, 0), key(1, 0), key(1, 1)],
            next_checkpoint_id: 1,
            epoch_wall_ms: 1_000_000,
        });
        for t in [key(0, 0), key(1, 0), key(1, 1)] {
            c.task_running(t);
        }
        c
    }

    fn periodic(interval: u64) -> CheckpointConfig {
        CheckpointConfig {
            interval: Some(ms(interval)),
            ..CheckpointConfig::default()
        }
    }

    fn ack_all(c: &mut CheckpointCoordinator, id: u64, now: u64, out: &mut Vec<CoordinatorAction>) {
        for t in [key(0, 0), key(1, 0), key(1, 1)] {
            c.acknowledge(
                t,
                CheckpointId(id),
                TaskStateSnapshot::default(),
                SubtaskCheckpointMetrics::default(),
                ms(now),
                out,
            );
        }
    }

    /// Live tuning: a shorter interval brings the next checkpoint forward; a longer one does
    /// not delay one already due sooner; the new timeout applies to new checkpoints.
    #[test]
    fn retuning_the_interval_moves_the_next_periodic_checkpoint() {
        let mut c = coordinator(periodic(3_600_000));
        let mut out = vec![];
        c.job_status_changed(true, ms(0), &mut out);
        assert_eq!(c.next_wakeup(), Some(ms(3_600_000)));
        let tuned = CheckpointConfig {
            interval: Some(ms(20)),
            timeout: ms(5_000),
            ..periodic(3_600_000)
        };
        c.retune(tuned.clone(), ms(100));
        assert_eq!(c.next_wakeup(), Some(ms(120)));
        assert_eq!(c.config(), &tuned);
        c.tick(ms(120), &mut out);
        assert!(
            matches!(&out[..], [CoordinatorAction::Trigger { .. }]),
            "{out:?}"
        );
        c.retune(periodic(1_000_000), ms(130));
        assert_eq!(c.next_wakeup().map(|w| w <= ms(140 + 5_000)), Some(true));
    }

    #[test]
    fn inactive_until_running_then_periodic() {
        let mut c = coordinator(periodic(100));
        let mut out = vec![];
        c.tick(ms(500), &mut out);
        assert!(out.is_empty(), "not active before RUNNING");
        c.job_status_changed(true, ms(1000), &mut out);
        assert_eq!(c.next_wakeup(), Some(ms(1100)));
        c.tick(ms(1050), &mut out);
        assert!(out.is_empty());
        c.tick(ms(1100), &mut out);
        match &out[..] {
            [
                CoordinatorAction::Trigger {
                    id,
                    timestamp_ms,
                    tasks,
                    options,
                },
            ] => {
                assert_eq!(*id, CheckpointId(1));
                assert_eq!(*timestamp_ms, 1_001_100);
                assert_eq!(tasks, &vec![key(0, 0)]);
                assert_eq!(options.alignment, AlignmentType::Aligned);
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn unaligned_checkpoints_and_their_in_flight_bytes_are_recorded() {
        let mut c = coordinator(CheckpointConfig {
            unaligned: true,
            ..periodic(100)
        });
        let mut out = vec![];
        c.job_status_changed(true, ms(0), &mut out);
        c.tick(ms(100), &mut out);
        match &out[..] {
            [CoordinatorAction::Trigger { options, .. }] => {
                assert_eq!(options.alignment, AlignmentType::Unaligned)
            }
            other => panic!("{other:?}"),
        }
        out.clear();
        for (i, t) in [key(0, 0), key(1, 0), key(1, 1)].into_iter().enumerate() {
            let state = TaskStateSnapshot {
                in_flight: Some(weir_core::channel_state::ChannelStateHandle {
                    stream: weir_core::handle::StreamStateHandle::Inline(vec![0; 10 * i]),
                    sections: vec![],
                }),
                ..TaskStateSnapshot::default()
            };
            c.acknowledge(
                t,
                CheckpointId(1),
                state,
                SubtaskCheckpointMetrics::default(),
                ms(110),
                &mut out,
            );
        }
        assert_eq!(c.history().last().unwrap().in_flight_size, 30);
        c.finalized(CheckpointId(1), Ok(()), ms(120), &mut out);
        assert_eq!(c.completed_in_flight().collect::<Vec<_>>(), vec![30]);
        assert_eq!(c.completed_durations().collect::<Vec<_>>(), vec![ms(20)]);
        // A savepoint is aligned even so.
        let mut sp = vec![];
        let mut c2 = coordinator(CheckpointConfig {
            unaligned: true,
            aligned_checkpoint_timeout: ms(7),
            ..periodic(100)
        });
        c2.job_status_changed(true, ms(0), &mut sp);
        let id = c2.trigger(SnapshotKind::Savepoint, ms(5), &mut sp).unwrap();
        assert_eq!(id, CheckpointId(1));
        match sp.last() {
            Some(CoordinatorAction::Trigger { options, .. }) => {
                assert_eq!(
                    options.alignment,
                    AlignmentType::Aligned,
                    "savepoints stay aligned"
                )
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(
            CheckpointConfig {
                unaligned: true,
                aligned_checkpoint_timeout: ms(7),
                ..periodic(100)
            }
            .checkpoint_alignment(),
            AlignmentType::AlignedWithTimeout { timeout: ms(7) }
        );
    }

    #[test]
    fn savepoints_are_forced_past_the_concurrency_limit_and_the_min_pause() {
        let mut c = coordinator(CheckpointConfig {
            min_pause: ms(1_000),
            ..periodic(100)
        });
        let mut out = vec![];
        c.job_status_changed(true, ms(0), &mut out);
        c.tick(ms(100), &mut out);
        assert_eq!(
            c.trigger(SnapshotKind::Checkpoint, ms(101), &mut out),
            Err(TriggerRefusal::TooManyConcurrent(1))
        );
        let sp = c
            .trigger(SnapshotKind::Savepoint, ms(102), &mut out)
            .unwrap();
        assert_eq!(sp, CheckpointId(2));
        ack_all(&mut c, 1, 110, &mut out);
        c.finalized(CheckpointId(1), Ok(()), ms(111), &mut out);
        assert!(matches!(
            c.trigger(SnapshotKind::Checkpoint, ms(200), &mut out),
            Err(TriggerRefusal::MinPause(_) | TriggerRefusal::TooManyConcurrent(_))
        ));
        assert!(
            c.trigger(SnapshotKind::SynchronousSavepoint, ms(200), &mut out)
                .is_ok(),
            "a stop-with-savepoint is not held back by the min pause either"
        );
    }

    #[test]
    fn no_checkpoint_starts_while_the_job_stops_with_a_savepoint() {
        let mut c = coordinator(periodic(10));
        let mut out = vec![];
        c.job_status_changed(true, ms(0), &mut out);
        let sp = c
            .trigger(SnapshotKind::SynchronousSavepoint, ms(5), &mut out)
            .unwrap();
        out.clear();
        c.tick(ms(10), &mut out);
        assert!(
            !out.iter()
                .any(|a| matches!(a, CoordinatorAction::Trigger { .. })),
            "{out:?}"
        );
        assert_eq!(
            c.trigger(SnapshotKind::Savepoint, ms(11), &mut out),
            Err(TriggerRefusal::Stopping(sp))
        );
        // The stop fails: checkpoints go on.
        c.decline(
            key(1, 0),
            sp,
            CheckpointFailureReason::Declined {
                task: key(1, 0),
                reason: "test".into(),
            },
            ms(12),
            &mut out,
        );
        out.clear();
        c.tick(ms(30), &mut out);
        assert!(
            out.iter()
                .any(|a| matches!(a, CoordinatorAction::Trigger { .. })),
            "{out:?}"
        );
    }

    #[test]
    fn off_by_default_but_on_demand_works() {
        let mut c = coordinator(CheckpointConfig::default());
        let mut out = vec![];
        c.job_status_changed(true, ms(0), &mut out);
        assert_eq!(c.next_wakeup(), None);
        let id = c.trigger(SnapshotKind::Savepoint, ms(5), &mut out).unwrap();
        assert_eq!(id, CheckpointId(1));
    }

    #[test]
    fn completes_after_all_acks_and_notifies() {
        let mut c = coordinator(periodic(100));
        let mut out = vec![];
        c.job_status_changed(true, ms(0), &mut out);
        c.tick(ms(100), &mut out);
        out.clear();
        c.acknowledge(
            key(1, 0),
            CheckpointId(1),
            TaskStateSnapshot::default(),
            SubtaskCheckpointMetrics::default(),
            ms(101),
            &mut out,
        );
        assert!(out.is_empty());
        // A duplicate acknowledgement changes nothing.
        c.acknowledge(
            key(1, 0),
            CheckpointId(1),
            TaskStateSnapshot::default(),
            SubtaskCheckpointMetrics::default(),
            ms(101),
            &mut out,
        );
        ack_all(&mut c, 1, 102, &mut out);
        assert!(
            matches!(&out[..], [CoordinatorAction::Finalize { id: CheckpointId(1), acks, .. }] if acks.len() == 3)
        );
        out.clear();
        c.finalized(CheckpointId(1), Ok(()), ms(110), &mut out);
        assert!(
            matches!(&out[..], [CoordinatorAction::NotifyComplete { id: CheckpointId(1), tasks }] if tasks.len() == 3)
        );
        let s = c.stats(CheckpointId(1)).unwrap();
        assert_eq!(s.status, CheckpointStatus::Completed);
        assert_eq!(s.end_to_end, Some(ms(10)));
        assert_eq!(c.latest_completed(), Some(CheckpointId(1)));
    }

    #[test]
    fn timeout_aborts_and_notifies() {
        let mut c = coordinator(CheckpointConfig {
            timeout: ms(50),
            ..periodic(100)
        });
        let mut out = vec![];
        c.job_status_changed(true, ms(0), &mut out);
        c.tick(ms(100), &mut out);
        out.clear();
        assert_eq!(c.next_wakeup(), Some(ms(150)));
        c.tick(ms(150), &mut out);
        assert!(matches!(
            &out[0],
            CoordinatorAction::NotifyAborted {
                id: CheckpointId(1),
                reason: CheckpointFailureReason::Expired,
                ..
            }
        ));
        // A late acknowledgement is ignored.
        out.clear();
        ack_all(&mut c, 1, 160, &mut out);
        assert!(out.is_empty());
    }

    #[test]
    fn a_finalizing_checkpoint_neither_expires_nor_is_subsumed() {
        let mut c = coordinator(CheckpointConfig {
            timeout: ms(50),
            max_concurrent: 2,
            ..periodic(10)
        });
        let mut out = vec![];
        c.job_status_changed(true, ms(0), &mut out);
        c.tick(ms(10), &mut out);
        c.tick(ms(20), &mut out);
        ack_all(&mut c, 1, 21, &mut out);
        ack_all(&mut c, 2, 22, &mut out);
        out.clear();
        // 2 completes first; 1, whose _metadata is being written, is not subsumed.
        c.finalized(CheckpointId(2), Ok(()), ms(23), &mut out);
        assert!(
            !out.iter()
                .any(|a| matches!(a, CoordinatorAction::NotifyAborted { .. })),
            "{out:?}"
        );
        // Past its timeout it does not expire either; its write decides.
        c.tick(ms(200), &mut out);
        assert!(
            !out.iter().any(|a| matches!(
                a,
                CoordinatorAction::NotifyAborted {
                    id: CheckpointId(1),
                    ..
                }
            )),
            "{out:?}"
        );
        out.clear();
        c.finalized(CheckpointId(1), Ok(()), ms(201), &mut out);
        assert!(matches!(
            &out[0],
            CoordinatorAction::NotifyComplete {
                id: CheckpointId(1),
                ..
            }
        ));
    }

    #[test]
    fn concurrency_limit_and_min_pause() {
        let mut c = coordinator(CheckpointConfig {
            min_pause: ms(30),
            ..periodic(10)
        });
        let mut out = vec![];
        c.job_status_changed(true, ms(0), &mut out);
        c.tick(ms(10), &mut out);
        assert_eq!(c.pending_ids(), vec![CheckpointId(1)]);
        assert_eq!(
            c.trigger(SnapshotKind::Checkpoint, ms(12), &mut out),
            Err(TriggerRefusal::TooManyConcurrent(1))
        );
        c.tick(ms(20), &mut out);
        assert_eq!(
            c.pending_ids(),
            vec![CheckpointId(1)],
            "periodic trigger skipped at the limit"
        );
        ack_all(&mut c, 1, 25, &mut out);
        c.finalized(CheckpointId(1), Ok(()), ms(25), &mut out);
        assert_eq!(
            c.trigger(SnapshotKind::Checkpoint, ms(40), &mut out),
            Err(TriggerRefusal::MinPause(ms(55)))
        );
        out.clear();
        c.tick(ms(40), &mut out);
        assert!(out.is_empty());
        assert_eq!(
            c.next_wakeup(),
            Some(ms(55)),
            "periodic trigger moved to the end of the pause"
        );
        c.tick(ms(55), &mut out);
        assert!(matches!(
            &out[..],
            [CoordinatorAction::Trigger {
                id: CheckpointId(2),
                ..
            }]
        ));
    }

    #[test]
    fn every_n_records_triggers_and_a_refused_request_waits() {
        let mut c = coordinator(CheckpointConfig {
            every_records: Some(1000),
            ..CheckpointConfig::default()
        });
        let mut out = vec![];
        c.job_status_changed(true, ms(0), &mut out);
        c.records_emitted(999, ms(1), &mut out);
        assert!(out.is_empty());
        c.records_emitted(1000, ms(2), &mut out);
        assert!(matches!(
            &out[..],
            [CoordinatorAction::Trigger {
                id: CheckpointId(1),
                ..
            }]
        ));
        out.clear();
        // 1 is still pending: the next request is refused, noted, and retried later.
        c.records_emitted(2500, ms(3), &mut out);
        assert!(out.is_empty());
        assert_eq!(c.refused_count(), 1);
        assert!(matches!(
            c.refusals().last(),
            Some((_, TriggerRefusal::TooManyConcurrent(1)))
        ));
        ack_all(&mut c, 1, 4, &mut out);
        c.finalized(CheckpointId(1), Ok(()), ms(5), &mut out);
        out.clear();
        c.records_emitted(2600, ms(6), &mut out);
        assert!(matches!(
            &out[..],
            [CoordinatorAction::Trigger {
                id: CheckpointId(2),
                ..
            }]
        ));
        out.clear();
        // Counting restarts from the records at that trigger.
        c.records_emitted(3599, ms(7), &mut out);
        assert!(out.is_empty());
    }

    #[test]
    fn savepoints_are_aligned_and_never_subsumed() {
        let mut c = coordinator(CheckpointConfig {
            mode: weir_core::config::CheckpointingMode::AtLeastOnce,
            max_concurrent: 2,
            ..periodic(1000)
        });
        let mut out = vec![];
        c.job_status_changed(true, ms(0), &mut out);
        c.trigger(SnapshotKind::Savepoint, ms(1), &mut out).unwrap();
        c.trigger(SnapshotKind::Checkpoint, ms(2), &mut out)
            .unwrap();
        let alignments: Vec<AlignmentType> = out
            .iter()
            .filter_map(|a| match a {
                CoordinatorAction::Trigger { options, .. } => Some(options.alignment),
                _ => None,
            })
            .collect();
        assert_eq!(
            alignments,
            [AlignmentType::Aligned, AlignmentType::AtLeastOnce]
        );
        ack_all(&mut c, 2, 3, &mut out);
        out.clear();
        c.finalized(CheckpointId(2), Ok(()), ms(4), &mut out);
        assert!(
            !out.iter()
                .any(|a| matches!(a, CoordinatorAction::NotifyAborted { .. })),
            "the pending savepoint 1 must not be subsumed: {out:?}"
        );
    }

    #[test]
    fn an_intermediate_savepoint_notifies_no_task_and_a_stop_does() {
        // Sinks commit on a notification; a failover restores from checkpoints only, so what a
        // savepoint committed would be committed again after one (FLINK-25191).
        let mut c = coordinator(CheckpointConfig {
            max_concurrent: 2,
            ..periodic(1000)
        });
        let mut out = vec![];
        c.job_status_changed(true, ms(0), &mut out);
        c.trigger(SnapshotKind::Savepoint, ms(1), &mut out).unwrap();
        ack_all(&mut c, 1, 2, &mut out);
        out.clear();
        c.finalized(CheckpointId(1), Ok(()), ms(3), &mut out);
        assert!(
            matches!(&out[..], [CoordinatorAction::NotifyComplete { id: CheckpointId(1), tasks }] if tasks.is_empty()),
            "{out:?}"
        );
        c.trigger(SnapshotKind::SynchronousSavepoint, ms(4), &mut out)
            .unwrap();
        ack_all(&mut c, 2, 5, &mut out);
        out.clear();
        c.finalized(CheckpointId(2), Ok(()), ms(6), &mut out);
        assert!(
            matches!(&out[..], [CoordinatorAction::NotifyComplete { id: CheckpointId(2), tasks }] if tasks.len() == 3),
            "{out:?}"
        );
    }

    #[test]
    fn the_final_checkpoint_starts_once_every_task_finished() {
        let mut c = coordinator(CheckpointConfig {
            min_pause: ms(1000),
            ..periodic(10)
        });
        let mut out = vec![];
        c.job_status_changed(true, ms(0), &mut out);
        c.tick(ms(10), &mut out);
        ack_all(&mut c, 1, 11, &mut out);
        c.finalized(CheckpointId(1), Ok(()), ms(12), &mut out);
        for t in [key(0, 0), key(1, 0), key(1, 1)] {
            c.task_finished(t, ms(13), &mut out);
        }
        out.clear();
        assert_eq!(
            c.trigger(SnapshotKind::Checkpoint, ms(14), &mut out),
            Err(TriggerRefusal::AllTasksFinished)
        );
        // The final one is not held back by the min pause, and every finished task snapshots.
        let id = c.trigger_final(ms(14), &mut out).unwrap();
        assert_eq!(id, CheckpointId(2));
        assert!(
            matches!(&out[..], [CoordinatorAction::Trigger { id: CheckpointId(2), tasks, .. }] if tasks.len() == 3),
            "{out:?}"
        );
        // Ordinary triggers are still refused, and a second final one waits for the first.
        assert_eq!(
            c.trigger(SnapshotKind::Checkpoint, ms(15), &mut out),
            Err(TriggerRefusal::AllTasksFinished)
        );
        assert_eq!(
            c.trigger_final(ms(15), &mut out),
            Err(TriggerRefusal::TooManyConcurrent(1))
        );
    }

    #[test]
    fn notifications_follow_completion_and_name_every_task() {
        let mut c = coordinator(periodic(10));
        let mut out = vec![];
        c.job_status_changed(true, ms(0), &mut out);
        c.tick(ms(10), &mut out);
        ack_all(&mut c, 1, 11, &mut out);
        // Finalize comes first; completion is notified only after `_metadata` is written.
        assert!(matches!(
            out.last(),
            Some(CoordinatorAction::Finalize { .. })
        ));
        assert!(
            !out.iter()
                .any(|a| matches!(a, CoordinatorAction::NotifyComplete { .. }))
        );
        out.clear();
        c.finalized(CheckpointId(1), Ok(()), ms(12), &mut out);
        match &out[..] {
            [CoordinatorAction::NotifyComplete { id, tasks }] => {
                assert_eq!(*id, CheckpointId(1));
                assert_eq!(tasks, &vec![key(0, 0), key(1, 0), key(1, 1)]);
            }
            other => panic!("{other:?}"),
        }
        // A finalize failure aborts and notifies the abort to every task.
        c.tick(ms(20), &mut out);
        ack_all(&mut c, 2, 21, &mut out);
        out.clear();
        c.finalized(CheckpointId(2), Err("disk full".into()), ms(22), &mut out);
        assert!(
            matches!(&out[..], [CoordinatorAction::NotifyAborted { id: CheckpointId(2), reason: CheckpointFailureReason::FinalizeFailed(_), tasks }] if tasks.len() == 3)
        );
    }

    #[test]
    fn not_all_tasks_running_refuses() {
        let mut c = CheckpointCoordinator::new(CoordinatorSetup {
            config: periodic(10),
            tasks_to_trigger: vec![key(0, 0)],
            tasks_to_wait_for: vec![key(0, 0), key(1, 0)],
            next_checkpoint_id: 1,
            epoch_wall_ms: 0,
        });
        let mut out = vec![];
        c.task_running(key(0, 0));
        c.job_status_changed(true, ms(0), &mut out);
        assert_eq!(
            c.trigger(SnapshotKind::Checkpoint, ms(10), &mut out),
            Err(TriggerRefusal::NotAllTasksRunning(key(1, 0))),
            "a task still being deployed holds checkpoints back"
        );
        c.task_finished(key(0, 0), ms(11), &mut out);
        c.task_finished(key(1, 0), ms(11), &mut out);
        assert_eq!(
            c.trigger(SnapshotKind::Checkpoint, ms(12), &mut out),
            Err(TriggerRefusal::AllTasksFinished)
        );
    }

    /// Flink's FLIP-147: checkpoints go on after some tasks finished; those snapshot their
    /// final state when triggered through their mailbox.
    #[test]
    fn finished_tasks_are_triggered_through_their_mailboxes() {
        let mut c = coordinator(periodic(10));
        let mut out = vec![];
        c.job_status_changed(true, ms(0), &mut out);
        c.tick(ms(10), &mut out);
        out.clear();
        // A task finishes while checkpoint 1 waits for it: it is triggered directly.
        c.task_finished(key(1, 1), ms(11), &mut out);
        match &out[..] {
            [
                CoordinatorAction::TriggerFinished {
                    id, tasks, options, ..
                },
            ] => {
                assert_eq!(*id, CheckpointId(1));
                assert_eq!(tasks, &vec![key(1, 1)]);
                assert_eq!(options.kind, SnapshotKind::Checkpoint);
            }
            other => panic!("{other:?}"),
        }
        out.clear();
        ack_all(&mut c, 1, 12, &mut out);
        c.finalized(CheckpointId(1), Ok(()), ms(13), &mut out);
        // The next checkpoint triggers the running source and the finished task.
        out.clear();
        c.tick(ms(20), &mut out);
        match &out[..] {
            [CoordinatorAction::Trigger { id, tasks, .. }] => {
                assert_eq!(*id, CheckpointId(2));
                assert_eq!(tasks, &vec![key(0, 0), key(1, 1)]);
            }
            other => panic!("{other:?}"),
        }
        // A finished source is triggered once, not twice.
        c.task_finished(key(0, 0), ms(21), &mut out);
        out.clear();
        ack_all(&mut c, 2, 22, &mut out);
        c.finalized(CheckpointId(2), Ok(()), ms(23), &mut out);
        out.clear();
        c.tick(ms(30), &mut out);
        match &out[..] {
            [CoordinatorAction::Trigger { tasks, .. }] => {
                assert_eq!(tasks, &vec![key(0, 0), key(1, 1)])
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn tolerable_failures_count_consecutive_counted_kinds() {
        let mut c = coordinator(CheckpointConfig {
            tolerable_failed_checkpoints: Some(1),
            ..periodic(10)
        });
        let mut out = vec![];
        c.job_status_changed(true, ms(0), &mut out);
        let fail_job = |out: &Vec<CoordinatorAction>| {
            out.iter()
                .any(|a| matches!(a, CoordinatorAction::FailJob { .. }))
        };
        // A decline does not count.
        c.tick(ms(10), &mut out);
        c.decline(
            key(1, 0),
            CheckpointId(1),
            CheckpointFailureReason::Declined {
                task: key(1, 0),
                reason: "closing".into(),
            },
            ms(11),
            &mut out,
        );
        // One storage failure is tolerated...
        c.tick(ms(21), &mut out);
        c.trigger_failed(CheckpointId(2), "disk full".into(), ms(22), &mut out);
        assert!(!fail_job(&out));
        // ...a success resets the count...
        c.tick(ms(32), &mut out);
        ack_all(&mut c, 3, 33, &mut out);
        c.finalized(CheckpointId(3), Ok(()), ms(34), &mut out);
        c.tick(ms(44), &mut out);
        c.finalized(CheckpointId(4), Err("io".into()), ms(45), &mut out);
        assert!(!fail_job(&out));
        // ...and the second consecutive one fails the job.
        c.tick(ms(55), &mut out);
        c.tick(ms(55) + CheckpointConfig::default().timeout, &mut out);
        assert!(fail_job(&out), "{out:?}");
        let reasons: Vec<String> = c.history().map(|s| format!("{:?}", s.status)).collect();
        assert_eq!(
            reasons.len(),
            6,
            "five failed or completed, and the periodic trigger after the timeout"
        );
    }

    #[test]
    fn completion_subsumes_older_pending_and_job_stop_aborts_all() {
        let mut c = coordinator(CheckpointConfig {
            max_concurrent: 2,
            ..periodic(10)
        });
        let mut out = vec![];
        c.job_status_changed(true, ms(0), &mut out);
        c.tick(ms(10), &mut out);
        c.tick(ms(20), &mut out);
        assert_eq!(c.pending_ids().len(), 2);
        ack_all(&mut c, 2, 21, &mut out);
        out.clear();
        c.finalized(CheckpointId(2), Ok(()), ms(22), &mut out);
        assert!(matches!(
            &out[1],
            CoordinatorAction::NotifyAborted {
                id: CheckpointId(1),
                reason: CheckpointFailureReason::Subsumed,
                ..
            }
        ));
        c.tick(ms(32), &mut out);
        out.clear();
        c.job_status_changed(false, ms(33), &mut out);
        assert!(matches!(
            &out[..],
            [CoordinatorAction::NotifyAborted {
                id: CheckpointId(3),
                reason: CheckpointFailureReason::JobNotRunning,
                ..
            }]
        ));
        assert_eq!(c.next_wakeup(), None);
    }
}
