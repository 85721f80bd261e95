//! The stream task: one subtask's mailbox loop (reference: "Task manager side").
//!
//! The loop serves, in turn, the mailbox (checkpoint triggers for sources, completion and abort
//! notifications), the queued output (sent as credits allow), and the input: a source's next
//! batch, or the next element from the input gate, whose barriers go through the aligner. A
//! triggered checkpoint runs steps 0–4 on the chain; the snapshot's asynchronous part (serialize
//! and upload) runs as a separate tokio task while processing goes on, and ends with an
//! acknowledgement (or a decline) to the job master.

use crate::error::TaskError;
use crate::operator::{Lifecycle, OpResult, OperatorSnapshotParts, Output, RestoreContext};
use crate::source::{SourceDriver, SourceStatus, SplitAssignment};
use bytes::Bytes;
use std::collections::BTreeSet;
use std::future::poll_fn;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio::sync::mpsc;
use tracing::{Instrument, debug, warn};
use weir_checkpoint::CheckpointStorage;
use weir_checkpoint::barrier::{BarrierHandler, HandlerAction};
use weir_checkpoint::coordinator::{CheckpointFailureReason, SubtaskCheckpointMetrics, TaskKey};
use weir_checkpoint::storage::CheckpointLocation;
use weir_core::config::CheckpointingMode;
use weir_core::element::{CheckpointBarrier, Event, SnapshotKind, StreamElement, Watermark};
use weir_core::handle::{OperatorStateHandle, OperatorSubtaskState, TaskStateSnapshot};
use weir_core::ids::{CheckpointId, JobId};
use weir_network::gate::GateItem;
use weir_network::{Data, InputGate};

/// A message from the job master to a task, served by its mailbox.
#[derive(Debug)]
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
#[derive(Debug)]
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
#[derive(Debug)]
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
    pub storage: Arc<dyn CheckpointStorage>,
    pub reports: mpsc::Sender<TaskReport>,
    pub mailbox: mpsc::Receiver<TaskMessage>,
    pub started: Instant,
    pub metrics: Arc<JobMetrics>,
    pub is_source: bool,
    pub targets: Arc<Targets>,
}

impl TaskEnv {
    async fn report(&self, event: TaskEvent) -> Result<(), TaskError> {
        self.reports
            .send(TaskReport {
                generation: self.generation,
                task: self.task,
                event,
            })
            .await
            .map_err(|_| TaskError::MasterGone)
    }
}

/// What one step of input produced.
pub(crate) enum Step {
    /// Records were pushed into the chain.
    Records(usize),
    /// Events were handled; handler actions may have been appended.
    Events,
    /// All input ended.
    End,
    /// Nothing to do now (an idle source).
    Idle,
    /// A source needs splits from its enumerator.
    NeedSplits,
}

/// The input side of a task: a source, or an input gate with its barrier handler.
pub(crate) trait TaskInput: Send {
    fn lifecycle(&mut self, event: &mut Lifecycle<'_>) -> OpResult;
    fn poll_flush(&mut self, cx: &mut Context<'_>) -> Poll<OpResult>;
    fn poll_step(
        &mut self,
        cx: &mut Context<'_>,
        now: Duration,
        actions: &mut Vec<HandlerAction>,
    ) -> Poll<Result<Step, TaskError>>;
    fn on_abort_notified(&mut self, _id: CheckpointId, _actions: &mut Vec<HandlerAction>) {}
    /// A source advances event time to the end (stop-with-savepoint `--drain`).
    fn advance_to_end_of_time(&mut self) -> OpResult {
        Ok(())
    }
    /// A source gets its enumerator's answer.
    fn assigned(&mut self, _assignment: SplitAssignment) -> OpResult {
        Ok(())
    }
}

/// A source at the head of the chain.
pub(crate) struct SourceInput<T> {
    pub driver: SourceDriver<T>,
    /// The source reported its end together with a last batch; `End` comes on the next step.
    pub ended: bool,
}

impl<T: Send + 'static> TaskInput for SourceInput<T> {
    fn lifecycle(&mut self, event: &mut Lifecycle<'_>) -> OpResult {
        self.driver.lifecycle(event)
    }

    fn poll_flush(&mut self, cx: &mut Context<'_>) -> Poll<OpResult> {
        self.driver.poll_flush(cx)
    }

    fn advance_to_end_of_time(&mut self) -> OpResult {
        self.driver.watermark(Watermark::MAX)
    }

    fn assigned(&mut self, assignment: SplitAssignment) -> OpResult {
        self.driver.assigned(assignment)
    }

    fn poll_step(
        &mut self,
        _cx: &mut Context<'_>,
        _now: Duration,
        _actions: &mut Vec<HandlerAction>,
    ) -> Poll<Result<Step, TaskError>> {
        if self.ended {
            return Poll::Ready(Ok(Step::End));
        }
        Poll::Ready(self.driver.emit_batch().map(|(n, status)| match status {
            SourceStatus::End if n == 0 => Step::End,
            SourceStatus::End => {
                self.ended = true;
                Step::Records(n)
            }
            SourceStatus::Idle if n == 0 => Step::Idle,
            SourceStatus::NeedSplits if n == 0 => Step::NeedSplits,
            _ => Step::Records(n),
        }))
    }
}

/// An input gate, its aligner and the chain it feeds.
pub(crate) struct NetworkInput<T> {
    pub gate: InputGate<T>,
    pub head: Box<dyn Output<T>>,
    pub handler: BarrierHandler,
    pub ended: Vec<bool>,
    pub watermarks: Vec<i64>,
    pub current_watermark: i64,
}

impl<T: Data> NetworkInput<T> {
    pub fn new(gate: InputGate<T>, head: Box<dyn Output<T>>, mode: CheckpointingMode) -> Self {
        let n = gate.num_channels();
        NetworkInput {
            gate,
            head,
            handler: BarrierHandler::for_mode(mode, n),
            ended: vec![false; n],
            watermarks: vec![i64::MIN; n],
            current_watermark: i64::MIN,
        }
    }

    fn apply_blocking(&mut self, actions: &mut Vec<HandlerAction>) {
        actions.retain(|a| match a {
            HandlerAction::Block(c) => {
                self.gate.block(*c);
                false
            }
            HandlerAction::UnblockAll => {
                self.gate.unblock_all();
                false
            }
            _ => true,
        });
    }
}

impl<T: Data> TaskInput for NetworkInput<T> {
    fn lifecycle(&mut self, event: &mut Lifecycle<'_>) -> OpResult {
        self.head.lifecycle(event)
    }

    fn poll_flush(&mut self, cx: &mut Context<'_>) -> Poll<OpResult> {
        self.head.poll_flush(cx)
    }

    fn poll_step(
        &mut self,
        cx: &mut Context<'_>,
        now: Duration,
        actions: &mut Vec<HandlerAction>,
    ) -> Poll<Result<Step, TaskError>> {
        let item = match self.gate.poll_next(cx) {
            Poll::Pending => return Poll::Pending,
            Poll::Ready(None) => return Poll::Ready(Ok(Step::End)),
            Poll::Ready(Some(Err(e))) => return Poll::Ready(Err(e.into())),
            Poll::Ready(Some(Ok(item))) => item,
        };
        let step = match item {
            GateItem::Element(_, StreamElement::Batch(batch)) => {
                let n = batch.len();
                self.head.push_batch(batch).map(|_| Step::Records(n))
            }
            GateItem::Element(i, StreamElement::Event(event)) => match event {
                Event::Watermark(Watermark(w)) => {
                    self.watermarks[i] = self.watermarks[i].max(w);
                    let min = self.watermarks.iter().copied().min().unwrap_or(i64::MIN);
                    if min > self.current_watermark {
                        self.current_watermark = min;
                        self.head.watermark(Watermark(min)).map(|_| Step::Events)
                    } else {
                        Ok(Step::Events)
                    }
                }
                Event::Barrier(b) => {
                    self.handler.on_barrier(i, b, now, actions);
                    Ok(Step::Events)
                }
                Event::CancelCheckpoint(id) => {
                    self.handler.on_cancel_marker(i, id, actions);
                    Ok(Step::Events)
                }
                Event::EndOfInput => {
                    self.ended[i] = true;
                    self.watermarks[i] = i64::MAX;
                    self.handler.on_end_of_input(i, now, actions);
                    if self.ended.iter().all(|e| *e) {
                        Ok(Step::End)
                    } else {
                        Ok(Step::Events)
                    }
                }
            },
            GateItem::Closed(i) => {
                if self.ended[i] {
                    Ok(Step::Events)
                } else {
                    Err(TaskError::UpstreamGone(i))
                }
            }
        };
        self.apply_blocking(actions);
        Poll::Ready(step)
    }

    fn on_abort_notified(&mut self, id: CheckpointId, actions: &mut Vec<HandlerAction>) {
        self.handler.on_abort_notified(id, actions);
        self.apply_blocking(actions);
    }
}

/// The text of a panic payload.
pub(crate) fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".into())
}

/// Runs a synchronous call into the chain, turning a panic in user code into a task error while
/// the chain is still alive (so the failure is reported before its channels close).
fn guarded<R>(task: &str, call: impl FnOnce() -> R) -> Result<R, TaskError> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(call)).map_err(|p| TaskError::Panic {
        task: task.to_string(),
        message: panic_message(p.as_ref()),
    })
}

/// A [`TaskInput`] whose every call into the chain is [`guarded`].
struct Guarded<'a> {
    input: &'a mut dyn TaskInput,
    name: &'a str,
}

impl TaskInput for Guarded<'_> {
    fn lifecycle(&mut self, event: &mut Lifecycle<'_>) -> OpResult {
        guarded(self.name, || self.input.lifecycle(event))?
    }

    fn poll_flush(&mut self, cx: &mut Context<'_>) -> Poll<OpResult> {
        match guarded(self.name, || self.input.poll_flush(cx)) {
            Ok(p) => p,
            Err(e) => Poll::Ready(Err(e)),
        }
    }

    fn poll_step(
        &mut self,
        cx: &mut Context<'_>,
        now: Duration,
        actions: &mut Vec<HandlerAction>,
    ) -> Poll<Result<Step, TaskError>> {
        match guarded(self.name, || self.input.poll_step(cx, now, actions)) {
            Ok(p) => p,
            Err(e) => Poll::Ready(Err(e)),
        }
    }

    fn on_abort_notified(&mut self, id: CheckpointId, actions: &mut Vec<HandlerAction>) {
        self.input.on_abort_notified(id, actions)
    }

    fn advance_to_end_of_time(&mut self) -> OpResult {
        guarded(self.name, || self.input.advance_to_end_of_time())?
    }

    fn assigned(&mut self, assignment: SplitAssignment) -> OpResult {
        guarded(self.name, || self.input.assigned(assignment))?
    }
}

/// The subtask checkpoint coordinator's memory (reference step 0).
struct SubtaskCheckpoints {
    last: Option<CheckpointId>,
    aborted: BTreeSet<CheckpointId>,
    finished: bool,
    /// A source stopped after a synchronous savepoint's barrier: it emits nothing until the
    /// savepoint completes (then ends, with `drain`, or is stopped) or is aborted (then resumes).
    suspended: Option<(CheckpointId, bool)>,
    /// The drained savepoint completed: end the input now.
    end_now: bool,
    /// A split request is out: read nothing until the enumerator answers.
    awaiting_splits: bool,
}

enum Wake {
    Message(Option<TaskMessage>),
    Flushed(OpResult),
    Step(Result<Step, TaskError>),
}

/// Runs a task to its end and reports how it ended.
///
/// The chain is dropped only after the report is sent: dropping it closes the task's output
/// channels, and downstream tasks must not see them close (and report that) before the master
/// has this task's report, which names the root cause.
pub(crate) async fn run_task(
    mut input: Box<dyn TaskInput>,
    mut env: TaskEnv,
    restore: RestoreContext,
) {
    let span = tracing::debug_span!("task", name = %env.name);
    let name = env.name.clone();
    let mut guarded = Guarded {
        input: &mut *input,
        name: &name,
    };
    let result = run(&mut guarded, &mut env, restore).instrument(span).await;
    let event = match result {
        // A finished task reported it before waiting for the job's end.
        Ok(()) | Err(TaskError::MasterGone) => return,
        Err(e) => TaskEvent::Failed(e),
    };
    let _ = env.report(event).await;
    drop(input);
}

async fn run(
    input: &mut dyn TaskInput,
    env: &mut TaskEnv,
    mut restore: RestoreContext,
) -> Result<(), TaskError> {
    let mut cps = SubtaskCheckpoints {
        last: restore.checkpoint,
        aborted: BTreeSet::new(),
        finished: false,
        suspended: None,
        end_now: false,
        awaiting_splits: false,
    };
    input.lifecycle(&mut Lifecycle::Open(&mut restore))?;
    drop(restore);
    env.report(TaskEvent::Running).await?;
    let mut actions: Vec<HandlerAction> = Vec::new();
    let mut output_pending = false;
    let mut first_record = true;
    let mut steps_since_yield = 0u32;
    loop {
        let now = env.started.elapsed();
        let suspended = cps.suspended.is_some() || cps.awaiting_splits;
        let end_now = std::mem::take(&mut cps.end_now);
        let wake = if end_now {
            Wake::Step(Ok(Step::End))
        } else {
            poll_fn(|cx| {
                if let Poll::Ready(m) = env.mailbox.poll_recv(cx) {
                    return Poll::Ready(Wake::Message(m));
                }
                if output_pending {
                    input.poll_flush(cx).map(Wake::Flushed)
                } else if suspended {
                    Poll::Pending
                } else {
                    input.poll_step(cx, now, &mut actions).map(Wake::Step)
                }
            })
            .await
        };
        match wake {
            Wake::Message(None) => return Err(TaskError::MasterGone),
            Wake::Message(Some(msg)) => {
                handle_message(msg, input, env, &mut cps, &mut actions).await?;
                output_pending = true;
            }
            Wake::Flushed(r) => {
                r?;
                output_pending = false;
            }
            Wake::Step(step) => match step? {
                Step::Records(n) => {
                    if first_record && n > 0 {
                        first_record = false;
                        let us = env.started.elapsed().as_micros() as u64;
                        if let Ok(mut v) = env.metrics.first_record_us.lock() {
                            v.push((env.generation, us));
                        }
                    }
                    count_records(env, n);
                    input.lifecycle(&mut Lifecycle::FlushPartial)?;
                    output_pending = true;
                    steps_since_yield += 1;
                    if steps_since_yield >= 32 {
                        steps_since_yield = 0;
                        tokio::task::yield_now().await;
                    }
                }
                Step::Events => {
                    run_actions(input, env, &mut cps, &mut actions).await?;
                    output_pending = true;
                }
                Step::End => {
                    // End of input may complete an alignment first.
                    run_actions(input, env, &mut cps, &mut actions).await?;
                    cps.finished = true;
                    input.lifecycle(&mut Lifecycle::EndInput)?;
                    poll_fn(|cx| input.poll_flush(cx)).await?;
                    debug!("input ended; task finished");
                    env.report(TaskEvent::Finished).await?;
                    return wait_for_job_end(input, env, &mut cps, &mut actions).await;
                }
                Step::NeedSplits => {
                    cps.awaiting_splits = true;
                    env.report(TaskEvent::SplitRequest).await?;
                }
                Step::Idle => {
                    tokio::select! {
                        m = env.mailbox.recv() => {
                            match m {
                                None => return Err(TaskError::MasterGone),
                                Some(msg) => handle_message(msg, input, env, &mut cps, &mut actions).await?,
                            }
                            output_pending = true;
                        }
                        _ = tokio::time::sleep(Duration::from_millis(1)) => {}
                    }
                }
            },
        }
    }
}

/// One relaxed add per batch (not per record) to the job's shared counters.
/// After its input ended, a task stays until the whole job has finished: notifications still
/// reach its operators, and the job's end lets sinks commit what they held back.
async fn wait_for_job_end(
    input: &mut dyn TaskInput,
    env: &mut TaskEnv,
    cps: &mut SubtaskCheckpoints,
    actions: &mut Vec<HandlerAction>,
) -> Result<(), TaskError> {
    loop {
        match env.mailbox.recv().await {
            None => return Err(TaskError::MasterGone),
            Some(TaskMessage::JobFinished) => {
                return input.lifecycle(&mut Lifecycle::JobFinished);
            }
            Some(msg) => handle_message(msg, input, env, cps, actions).await?,
        }
    }
}

fn count_records(env: &TaskEnv, n: usize) {
    let counter = if env.is_source {
        &env.metrics.source_records
    } else {
        &env.metrics.processed_records
    };
    counter.fetch_add(n as u64, Ordering::Relaxed);
}

async fn handle_message(
    msg: TaskMessage,
    input: &mut dyn TaskInput,
    env: &TaskEnv,
    cps: &mut SubtaskCheckpoints,
    actions: &mut Vec<HandlerAction>,
) -> Result<(), TaskError> {
    match msg {
        TaskMessage::Trigger(barrier, drain) => {
            if cps.finished || cps.suspended.is_some() {
                env.report(TaskEvent::Decline {
                    id: barrier.id,
                    reason: CheckpointFailureReason::Declined {
                        task: env.task,
                        reason: "the task is closing".into(),
                    },
                })
                .await?;
                return Ok(());
            }
            let synchronous = barrier.options.kind == SnapshotKind::SynchronousSavepoint;
            if synchronous && drain {
                input.advance_to_end_of_time()?;
            }
            checkpoint_state(input, env, cps, barrier, Duration::ZERO).await?;
            if synchronous {
                // Nothing is emitted after a synchronous savepoint's barrier.
                cps.suspended = Some((barrier.id, drain));
            }
            Ok(())
        }
        TaskMessage::NotifyComplete(id) => {
            input.lifecycle(&mut Lifecycle::NotifyComplete(id))?;
            // After a synchronous savepoint the sources end their input (with or without drain:
            // they emitted nothing after its barrier), and the job finishes normally.
            if cps.suspended.is_some_and(|(sid, _)| sid == id) {
                cps.suspended = None;
                cps.end_now = true;
            }
            Ok(())
        }
        TaskMessage::Splits(assignment) => {
            cps.awaiting_splits = false;
            input.assigned(assignment)
        }
        TaskMessage::JobFinished => Ok(()),
        TaskMessage::NotifyAborted(id) => {
            if let Some((sid, drain)) = cps.suspended
                && sid == id
            {
                if drain {
                    // Event time already went to the end: resuming would make every later record
                    // late. Fail, and restart from the latest checkpoint (as Flink does).
                    return Err(TaskError::Operator {
                        operator: env.name.clone(),
                        message: format!(
                            "the drained stop-with-savepoint {id} failed after event time was advanced to the end"
                        ),
                    });
                }
                debug!(checkpoint = id.0, "synchronous savepoint aborted; resuming");
                cps.suspended = None;
            }
            input.on_abort_notified(id, actions);
            if cps.last.is_none_or(|l| l < id) {
                cps.aborted.insert(id);
            }
            input.lifecycle(&mut Lifecycle::NotifyAborted(id))
        }
    }
}

async fn run_actions(
    input: &mut dyn TaskInput,
    env: &TaskEnv,
    cps: &mut SubtaskCheckpoints,
    actions: &mut Vec<HandlerAction>,
) -> Result<(), TaskError> {
    for action in std::mem::take(actions) {
        match action {
            HandlerAction::Trigger { barrier, alignment } => {
                checkpoint_state(input, env, cps, barrier, alignment).await?
            }
            HandlerAction::Abort { id, reason } => {
                if cps.last.is_none_or(|l| l < id) {
                    cps.last = Some(id);
                    input.lifecycle(&mut Lifecycle::EmitCancelMarker(id))?;
                    env.report(TaskEvent::Decline {
                        id,
                        reason: CheckpointFailureReason::AbortedInAlignment(reason.to_string()),
                    })
                    .await?;
                }
            }
            HandlerAction::Block(_) | HandlerAction::UnblockAll => {}
        }
    }
    Ok(())
}

/// Steps 0–4 of the reference's `checkpointState`.
async fn checkpoint_state(
    input: &mut dyn TaskInput,
    env: &TaskEnv,
    cps: &mut SubtaskCheckpoints,
    barrier: CheckpointBarrier,
    alignment: Duration,
) -> Result<(), TaskError> {
    let id = barrier.id;
    // Step 0: ordering, and checkpoints already aborted.
    if cps.last.is_some_and(|l| l >= id) {
        debug!(checkpoint = id.0, "out-of-order barrier ignored");
        return Ok(());
    }
    cps.last = Some(id);
    if cps.aborted.remove(&id) {
        input.lifecycle(&mut Lifecycle::EmitCancelMarker(id))?;
        return Ok(());
    }
    let wall_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0);
    let start_delay = Duration::from_millis(wall_ms.saturating_sub(barrier.timestamp_ms));
    // Step 1: prepare; step 2: the barrier goes out ahead of anything emitted after it.
    input.lifecycle(&mut Lifecycle::PrepareSnapshotPreBarrier(id))?;
    input.lifecycle(&mut Lifecycle::EmitBarrier(barrier))?;
    // Step 4, synchronous part: freeze every operator's state.
    let sync_start = Instant::now();
    let mut parts = Vec::new();
    input.lifecycle(&mut Lifecycle::Snapshot(id, &mut parts))?;
    let sync_duration = sync_start.elapsed();
    // Step 4, asynchronous part: serialize and upload off the processing path, then acknowledge.
    let (storage, location) = env
        .targets
        .lock()
        .ok()
        .and_then(|t| t.get(&id).cloned())
        .unwrap_or_else(|| {
            (
                env.storage.clone(),
                CheckpointLocation::for_checkpoint(env.job_id, id),
            )
        });
    let reports = env.reports.clone();
    let (generation, task) = (env.generation, env.task);
    tokio::spawn(async move {
        let async_start = Instant::now();
        let result = upload(storage, location, task, generation, parts).await;
        let event = match result {
            Ok(state) => TaskEvent::Acknowledge {
                id,
                metrics: SubtaskCheckpointMetrics {
                    start_delay,
                    alignment,
                    sync_duration,
                    async_duration: async_start.elapsed(),
                    state_size: state.state_size(),
                },
                state,
            },
            Err(reason) => {
                if !reports.is_closed() {
                    warn!(checkpoint = id.0, %task, %reason, "asynchronous snapshot failed");
                }
                TaskEvent::Decline {
                    id,
                    reason: CheckpointFailureReason::AsyncPhaseFailed { task, reason },
                }
            }
        };
        let _ = reports
            .send(TaskReport {
                generation,
                task,
                event,
            })
            .await;
    });
    // A task spawned from a busy task sits in this worker's LIFO slot, which other workers cannot
    // steal: yield once so the upload starts now, not after the next stretch of records.
    tokio::task::yield_now().await;
    Ok(())
}

/// The names and redistribution modes of an operator snapshot's states.
type StateNames = Vec<(String, weir_core::handle::OperatorStateMode)>;

/// Serializes the frozen parts and writes them to checkpoint storage.
async fn upload(
    storage: Arc<dyn CheckpointStorage>,
    location: CheckpointLocation,
    task: TaskKey,
    generation: u64,
    parts: Vec<OperatorSnapshotParts>,
) -> Result<TaskStateSnapshot, String> {
    struct Serialized {
        operator_id: weir_core::ids::OperatorId,
        keyed: Option<(weir_state::KeyedSnapshotLayout, Vec<u8>)>,
        operator: Option<(StateNames, Vec<u8>)>,
    }
    let serialized = tokio::task::spawn_blocking(move || -> Result<Vec<Serialized>, String> {
        let mut out = Vec::with_capacity(parts.len());
        for p in parts {
            let keyed = match p.keyed {
                Some(k) => {
                    let mut buf = Vec::new();
                    let layout = k.write_to(&mut buf).map_err(|e| e.to_string())?;
                    Some((layout, buf))
                }
                None => None,
            };
            let operator = match p.operator {
                Some(o) if !o.is_empty() => {
                    let states = o.states();
                    let mut buf = Vec::new();
                    o.write_to(&mut buf).map_err(|e| e.to_string())?;
                    Some((states, buf))
                }
                _ => None,
            };
            out.push(Serialized {
                operator_id: p.operator_id,
                keyed,
                operator,
            });
        }
        Ok(out)
    })
    .await
    .map_err(|e| {
        if e.is_cancelled() {
            "snapshot serialization was cancelled: the job is shutting down".to_string()
        } else {
            format!("snapshot serialization panicked: {e}")
        }
    })??;

    let mut snapshot = TaskStateSnapshot::default();
    for s in serialized {
        let short = format!("{}", s.operator_id);
        let short = &short[..8];
        let mut state = OperatorSubtaskState::default();
        if let Some((layout, buf)) = s.keyed {
            let name = format!(
                "v{}-{}-g{generation}-{short}-keyed",
                task.vertex.0, task.subtask
            );
            let stream = storage
                .write_state(&location, &name, Bytes::from(buf))
                .await
                .map_err(|e| e.to_string())?;
            state.keyed.push(layout.into_handle(stream));
        }
        if let Some((states, buf)) = s.operator {
            let name = format!(
                "v{}-{}-g{generation}-{short}-op",
                task.vertex.0, task.subtask
            );
            let stream = storage
                .write_state(&location, &name, Bytes::from(buf))
                .await
                .map_err(|e| e.to_string())?;
            state.operator.push(OperatorStateHandle { states, stream });
        }
        if !state.is_empty() {
            snapshot.operators.insert(s.operator_id, state);
        }
    }
    Ok(snapshot)
}
