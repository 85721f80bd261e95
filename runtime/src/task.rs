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
pub(crate) use crate::upload::IncrementalChains;
use std::collections::{BTreeSet, VecDeque};
use std::future::poll_fn;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio::sync::mpsc;
use tracing::{Instrument, debug, warn};
use weir_checkpoint::CheckpointStorage;
use weir_checkpoint::barrier::{BarrierHandler, HandlerAction};
use weir_checkpoint::coordinator::{CheckpointFailureReason, SubtaskCheckpointMetrics, TaskKey};
use weir_checkpoint::storage::CheckpointLocation;
use weir_core::channel_state::{ChannelDirection, ChannelInfo, ChannelSection};
use weir_core::config::CheckpointingMode;
use weir_core::element::{CheckpointBarrier, Event, SnapshotKind, StreamElement, Watermark};
use weir_core::handle::{KeyedStateHandle, TaskStateSnapshot};
use weir_core::ids::{CheckpointId, JobId, OperatorId};
use weir_network::gate::GateItem;
use weir_network::{Data, InputGate};
use weir_state::SnapshotScope;

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
    /// When [`on_timer`](Self::on_timer) must run: an aligned checkpoint timeout.
    fn next_deadline(&self) -> Option<Duration> {
        None
    }
    /// Time passed.
    fn on_timer(&mut self, _now: Duration, _actions: &mut Vec<HandlerAction>) {}
    /// The in-flight data of an unaligned checkpoint, once every channel's barrier and what it
    /// overtook have been read.
    fn take_in_flight(&mut self) -> Option<(CheckpointId, Vec<ChannelSection>)> {
        None
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
        let (n, status) = match self.driver.emit_batch() {
            Ok(r) => r,
            Err(e) => return Poll::Ready(Err(e)),
        };
        if status == SourceStatus::End {
            // A bounded source's end is the end of event time (Flink's MAX_WATERMARK): every
            // event-time timer downstream fires.
            if let Err(e) = self.driver.watermark(Watermark::MAX) {
                return Poll::Ready(Err(e));
            }
        }
        Poll::Ready(Ok(match status {
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

/// How much of one input channel an unaligned checkpoint still persists.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Persist {
    /// Nothing.
    Off,
    /// Everything, until the channel's barrier arrives.
    UntilBarrier,
    /// The next `n` elements: those the channel's priority barrier overtook.
    Remaining(usize),
}

/// The input channel state of the unaligned checkpoint in progress.
struct InFlightRecorder {
    id: CheckpointId,
    sections: Vec<ChannelSection>,
    persist: Vec<Persist>,
    /// Every channel's barrier arrived.
    all_reached: bool,
}

/// An input gate, its barrier handler and the chain it feeds.
pub(crate) struct NetworkInput<T> {
    pub gate: InputGate<T>,
    pub head: Box<dyn Output<T>>,
    pub handler: BarrierHandler,
    pub ended: Vec<bool>,
    pub watermarks: Vec<i64>,
    pub current_watermark: i64,
    /// Channel-state names of the gate's channels.
    infos: Vec<ChannelInfo>,
    /// Input channel state of a restored unaligned checkpoint, replayed before any new input.
    recovered: VecDeque<Vec<T>>,
    recorder: Option<InFlightRecorder>,
    completed: Option<(CheckpointId, Vec<ChannelSection>)>,
    /// How many queued elements the element being handled overtook (0 when in order).
    overtook: usize,
    /// Elements read ahead from a channel (those a priority barrier overtook, persisted the
    /// moment the barrier arrived), handled before anything else.
    stash: VecDeque<GateItem<T>>,
}

impl<T: Data> NetworkInput<T> {
    pub fn new(
        gate: InputGate<T>,
        infos: Vec<ChannelInfo>,
        head: Box<dyn Output<T>>,
        mode: CheckpointingMode,
    ) -> Self {
        let n = gate.num_channels();
        debug_assert_eq!(infos.len(), n);
        NetworkInput {
            gate,
            head,
            handler: BarrierHandler::for_mode(mode, n),
            ended: vec![false; n],
            watermarks: vec![i64::MIN; n],
            current_watermark: i64::MIN,
            infos,
            recovered: VecDeque::new(),
            recorder: None,
            completed: None,
            overtook: 0,
            stash: VecDeque::new(),
        }
    }

    /// Reads ahead the elements still owed to the recorder on channel `c` (the ones its priority
    /// barrier overtook), so the in-flight data completes now rather than after processing them.
    fn read_ahead(&mut self, c: usize) -> OpResult {
        let Some(Persist::Remaining(n)) = self.recorder.as_ref().map(|r| r.persist[c]) else {
            return Ok(());
        };
        for item in self.gate.take_ready(c, n)? {
            if let GateItem::Element(i, e) = &item {
                self.record(*i, e)?;
            }
            self.stash.push_back(item);
        }
        Ok(())
    }

    /// Persists an in-order element of channel `i` if the unaligned checkpoint in progress
    /// needs it.
    fn record(&mut self, i: usize, element: &StreamElement<T>) -> OpResult {
        let Some(r) = self.recorder.as_mut() else {
            return Ok(());
        };
        match r.persist[i] {
            Persist::Off => return Ok(()),
            Persist::UntilBarrier => {}
            Persist::Remaining(n) => {
                r.persist[i] = if n <= 1 {
                    Persist::Off
                } else {
                    Persist::Remaining(n - 1)
                };
            }
        }
        if let StreamElement::Batch(batch) = element {
            r.sections[i].append_batch(batch)?;
        }
        self.maybe_complete();
        Ok(())
    }

    fn maybe_complete(&mut self) {
        let done = self
            .recorder
            .as_ref()
            .is_some_and(|r| r.all_reached && r.persist.iter().all(|p| *p == Persist::Off));
        if done && let Some(r) = self.recorder.take() {
            let sections = r.sections.into_iter().filter(|s| s.records > 0).collect();
            self.completed = Some((r.id, sections));
        }
    }

    /// Carries out the handler actions that concern the gate and the in-flight data; the rest
    /// stay for the task.
    fn apply_local(&mut self, actions: &mut Vec<HandlerAction>) {
        let mut keep = Vec::with_capacity(actions.len());
        for action in actions.drain(..) {
            match action {
                HandlerAction::Block(c) => self.gate.block(c),
                HandlerAction::UnblockAll => self.gate.unblock_all(),
                HandlerAction::PersistInFlight(c) => {
                    if let Some(r) = self.recorder.as_mut() {
                        r.persist[c] = Persist::UntilBarrier;
                    }
                }
                HandlerAction::BarrierReached(c) => {
                    if let Some(r) = self.recorder.as_mut() {
                        r.persist[c] = match self.overtook {
                            0 => Persist::Off,
                            n => Persist::Remaining(n),
                        };
                    }
                }
                HandlerAction::InFlightComplete(id) => {
                    if let Some(r) = self.recorder.as_mut()
                        && r.id == id
                    {
                        r.all_reached = true;
                    }
                }
                HandlerAction::Trigger { barrier, alignment } => {
                    if barrier.options.is_unaligned() {
                        self.recorder = Some(InFlightRecorder {
                            id: barrier.id,
                            sections: self
                                .infos
                                .iter()
                                .map(|i| ChannelSection::new(ChannelDirection::Input, *i))
                                .collect(),
                            persist: vec![Persist::Off; self.infos.len()],
                            all_reached: false,
                        });
                    }
                    keep.push(HandlerAction::Trigger { barrier, alignment });
                }
                HandlerAction::Abort { id, reason } => {
                    self.drop_in_flight(id);
                    keep.push(HandlerAction::Abort { id, reason });
                }
            }
        }
        *actions = keep;
        self.maybe_complete();
    }

    fn drop_in_flight(&mut self, id: CheckpointId) {
        if self.recorder.as_ref().is_some_and(|r| r.id == id) {
            self.recorder = None;
        }
        if self.completed.as_ref().is_some_and(|(c, _)| *c == id) {
            self.completed = None;
        }
    }
}

impl<T: Data> TaskInput for NetworkInput<T> {
    fn lifecycle(&mut self, event: &mut Lifecycle<'_>) -> OpResult {
        if let Lifecycle::Open(ctx) = event {
            for info in &self.infos {
                for section in ctx.take_in_flight(ChannelDirection::Input, info) {
                    self.recovered.extend(section.batches::<T>()?);
                }
            }
        }
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
        if let Some(batch) = self.recovered.pop_front() {
            let n = batch.len();
            return Poll::Ready(self.head.push_batch(batch).map(|_| Step::Records(n)));
        }
        let item = match self.stash.pop_front() {
            Some(item) => item,
            None => match self.gate.poll_next(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(None) => return Poll::Ready(Ok(Step::End)),
                Poll::Ready(Some(Err(e))) => return Poll::Ready(Err(e.into())),
                Poll::Ready(Some(Ok(item))) => {
                    if let GateItem::Element(i, e) = &item
                        && let Err(e) = self.record(*i, e)
                    {
                        return Poll::Ready(Err(e));
                    }
                    item
                }
            },
        };
        let (i, element) = match item {
            GateItem::Element(i, e) => {
                self.overtook = 0;
                (i, e)
            }
            GateItem::Priority(i, e, overtook) => {
                self.overtook = overtook;
                (i, e)
            }
            GateItem::Closed(i) => {
                return Poll::Ready(if self.ended[i] {
                    Ok(Step::Events)
                } else {
                    Err(TaskError::UpstreamGone(i))
                });
            }
        };
        let step = match element {
            StreamElement::Batch(batch) => {
                let n = batch.len();
                self.head.push_batch(batch).map(|_| Step::Records(n))
            }
            StreamElement::Event(event) => match event {
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
        };
        self.apply_local(actions);
        if self.overtook > 0
            && let Err(e) = self.read_ahead(i)
        {
            return Poll::Ready(Err(e));
        }
        Poll::Ready(step)
    }

    fn on_abort_notified(&mut self, id: CheckpointId, actions: &mut Vec<HandlerAction>) {
        self.handler.on_abort_notified(id, actions);
        self.drop_in_flight(id);
        self.apply_local(actions);
    }

    fn next_deadline(&self) -> Option<Duration> {
        self.handler.next_deadline()
    }

    fn on_timer(&mut self, now: Duration, actions: &mut Vec<HandlerAction>) {
        self.handler.on_timer(now, actions);
        self.apply_local(actions);
    }

    fn take_in_flight(&mut self) -> Option<(CheckpointId, Vec<ChannelSection>)> {
        self.completed.take()
    }
}

pub(crate) use weir_core::panic::panic_message;

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

    fn next_deadline(&self) -> Option<Duration> {
        self.input.next_deadline()
    }

    fn on_timer(&mut self, now: Duration, actions: &mut Vec<HandlerAction>) {
        self.input.on_timer(now, actions)
    }

    fn take_in_flight(&mut self) -> Option<(CheckpointId, Vec<ChannelSection>)> {
        self.input.take_in_flight()
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
    /// An unaligned checkpoint whose snapshot is taken, waiting for its input channel state.
    pending_unaligned: Option<PendingSnapshot>,
    /// The job's chain epoch this task's keyed backends build on (see `TaskEnv::chain_epoch`).
    chain_epoch: u64,
}

/// A snapshot taken (synchronous part done) but not yet uploaded.
struct PendingSnapshot {
    id: CheckpointId,
    parts: FrozenParts,
    output: Vec<ChannelSection>,
    metrics: SubtaskCheckpointMetrics,
}

enum Wake {
    Message(Option<TaskMessage>),
    Timer,
    ProcessingTime,
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
        // A finished task reported it before waiting for the job's end; a cancelled one has
        // nobody to tell.
        Ok(()) | Err(TaskError::MasterGone) | Err(TaskError::Canceled) => return,
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
        pending_unaligned: None,
        chain_epoch: env.chain_epoch.load(Ordering::Acquire),
    };
    input.lifecycle(&mut Lifecycle::Open(&mut restore))?;
    drop(restore);
    env.report(TaskEvent::Running).await?;
    let mut actions: Vec<HandlerAction> = Vec::new();
    // A restored writer may hold in-flight data to send first.
    let mut output_pending = true;
    let mut first_record = true;
    let mut steps_since_yield = 0u32;
    let mut last_yield = Instant::now();
    let mut processing_timer: Option<(i64, std::pin::Pin<Box<tokio::time::Sleep>>)> = None;
    loop {
        // One relaxed load per step (a batch): a task that never waits still stops here.
        env.cancellation.check()?;
        let now = wall_clock();
        let suspended = cps.suspended.is_some() || cps.awaiting_splits;
        let end_now = std::mem::take(&mut cps.end_now);
        let mut timer = input
            .next_deadline()
            .map(|d| Box::pin(tokio::time::sleep(d.saturating_sub(now))));
        // Processing-time timers: one sleep, kept while the earliest timer stays the same.
        let next_pt = env.processing_time.next();
        if processing_timer.as_ref().map(|(at, _)| *at) != next_pt {
            processing_timer = next_pt.map(|at| {
                let wait =
                    Duration::from_millis(at.saturating_sub(now.as_millis() as i64).max(0) as u64);
                (at, Box::pin(tokio::time::sleep(wait)))
            });
        }
        let wake = if end_now {
            Wake::Step(Ok(Step::End))
        } else {
            poll_fn(|cx| {
                if let Poll::Ready(m) = env.mailbox.poll_recv(cx) {
                    return Poll::Ready(Wake::Message(m));
                }
                if let Some(t) = timer.as_mut()
                    && t.as_mut().poll(cx).is_ready()
                {
                    return Poll::Ready(Wake::Timer);
                }
                if let Some((_, t)) = processing_timer.as_mut()
                    && !suspended
                    && t.as_mut().poll(cx).is_ready()
                {
                    return Poll::Ready(Wake::ProcessingTime);
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
            Wake::Timer => {
                input.on_timer(wall_clock(), &mut actions);
                run_actions(input, env, &mut cps, &mut actions).await?;
                output_pending = true;
            }
            Wake::ProcessingTime => {
                processing_timer = None;
                env.processing_time.reset();
                let now_ms = crate::operator::ProcessingTimeService::now_ms();
                input.lifecycle(&mut Lifecycle::ProcessingTime(now_ms))?;
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
                    if cps.pending_unaligned.is_some() {
                        finish_unaligned(input, env, &mut cps);
                    }
                    input.lifecycle(&mut Lifecycle::FlushPartial)?;
                    output_pending = true;
                    // Tasks share the runtime's worker threads: a task that processes slowly
                    // (a busy sink) yields by time too, so sources, uploads and the job master
                    // are not starved.
                    steps_since_yield += 1;
                    if steps_since_yield >= 32 || last_yield.elapsed() >= YIELD_AFTER {
                        steps_since_yield = 0;
                        last_yield = Instant::now();
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

/// Wall-clock time since the Unix epoch: the clock of barrier timestamps, which the barrier
/// handlers compare with.
fn wall_clock() -> Duration {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
}

/// The longest a task runs records before it yields its worker thread.
const YIELD_AFTER: Duration = Duration::from_micros(500);

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
        TaskMessage::Trigger(barrier, _) if cps.finished => {
            // Input ended: no barrier will come; snapshot the final state (FLIP-147).
            snapshot_finished(input, env, cps, barrier)
        }
        TaskMessage::Trigger(barrier, drain) => {
            if cps.suspended.is_some() {
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
            // Later deltas extend this checkpoint's chains: the older ones are not needed.
            if let Ok(mut chains) = env.chains.lock() {
                for by_checkpoint in chains.values_mut() {
                    if by_checkpoint.contains_key(&id) {
                        by_checkpoint.retain(|c, _| *c >= id);
                    }
                }
            }
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
            if cps.pending_unaligned.as_ref().is_some_and(|p| p.id == id) {
                cps.pending_unaligned = None;
            }
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
                if cps.pending_unaligned.as_ref().is_some_and(|p| p.id == id) {
                    cps.pending_unaligned = None;
                    env.report(TaskEvent::Decline {
                        id,
                        reason: CheckpointFailureReason::AbortedInAlignment(reason.to_string()),
                    })
                    .await?;
                } else if cps.last.is_none_or(|l| l < id) {
                    cps.last = Some(id);
                    input.lifecycle(&mut Lifecycle::EmitCancelMarker(id))?;
                    env.report(TaskEvent::Decline {
                        id,
                        reason: CheckpointFailureReason::AbortedInAlignment(reason.to_string()),
                    })
                    .await?;
                }
            }
            HandlerAction::Block(_)
            | HandlerAction::UnblockAll
            | HandlerAction::PersistInFlight(_)
            | HandlerAction::BarrierReached(_)
            | HandlerAction::InFlightComplete(_) => {}
        }
    }
    if cps.pending_unaligned.is_some() {
        finish_unaligned(input, env, cps);
    }
    Ok(())
}

/// Uploads the pending unaligned snapshot once its input channel state is complete.
fn finish_unaligned(input: &mut dyn TaskInput, env: &TaskEnv, cps: &mut SubtaskCheckpoints) {
    let Some((id, mut sections)) = input.take_in_flight() else {
        return;
    };
    match cps.pending_unaligned.take() {
        Some(p) if p.id == id => {
            let mut all = p.output;
            all.append(&mut sections);
            // Unaligned snapshots are checkpoints: savepoints are always aligned.
            spawn_upload(env, (id, SnapshotKind::Checkpoint), p.parts, all, p.metrics);
        }
        other => cps.pending_unaligned = other,
    }
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
    // Step 1: prepare; step 2: the barrier goes out ahead of anything emitted after it. An
    // unaligned barrier overtakes what is queued (step 3: that becomes output channel state).
    input.lifecycle(&mut Lifecycle::PrepareSnapshotPreBarrier(id))?;
    let mut output = Vec::new();
    if barrier.options.is_unaligned() {
        input.lifecycle(&mut Lifecycle::EmitPriorityBarrier(barrier, &mut output))?;
    } else {
        input.lifecycle(&mut Lifecycle::EmitBarrier(barrier))?;
    }
    // Step 4, synchronous part: freeze every operator's state.
    let sync_start = Instant::now();
    let mut parts = Vec::new();
    start_new_chains_if_asked(input, env, cps)?;
    input.lifecycle(&mut Lifecycle::Snapshot(
        id,
        barrier.options.kind,
        &mut parts,
    ))?;
    let metrics = SubtaskCheckpointMetrics {
        start_delay,
        alignment,
        sync_duration: sync_start.elapsed(),
        async_duration: Duration::ZERO,
        state_size: 0,
    };
    let parts = FrozenParts::new(env, parts);
    if barrier.options.is_unaligned() && !env.is_source {
        // The input channel state is complete once every channel's barrier has been read.
        cps.pending_unaligned = Some(PendingSnapshot {
            id,
            parts,
            output,
            metrics,
        });
        return Ok(());
    }
    spawn_upload(env, (id, barrier.options.kind), parts, output, metrics);
    // A task spawned from a busy task sits in this worker's LIFO slot, which other workers cannot
    // steal: yield once so the upload starts now, not after the next stretch of records.
    tokio::task::yield_now().await;
    Ok(())
}

/// Before a snapshot: if the job master refused a delta since this task's last one, its keyed
/// backends start new chains.
fn start_new_chains_if_asked(
    input: &mut dyn TaskInput,
    env: &TaskEnv,
    cps: &mut SubtaskCheckpoints,
) -> Result<(), TaskError> {
    let epoch = env.chain_epoch.load(Ordering::Acquire);
    if epoch != cps.chain_epoch {
        cps.chain_epoch = epoch;
        input.lifecycle(&mut Lifecycle::StartNewChains)?;
    }
    Ok(())
}

/// The checkpoint of a task whose input ended (Flink's FLIP-147): its operators' final state,
/// with no barrier to emit (its outputs ended) and no in-flight data.
fn snapshot_finished(
    input: &mut dyn TaskInput,
    env: &TaskEnv,
    cps: &mut SubtaskCheckpoints,
    barrier: CheckpointBarrier,
) -> Result<(), TaskError> {
    let id = barrier.id;
    if cps.last.is_some_and(|l| l >= id) {
        // It took this checkpoint before its input ended.
        return Ok(());
    }
    cps.last = Some(id);
    let sync_start = Instant::now();
    let mut parts = Vec::new();
    start_new_chains_if_asked(input, env, cps)?;
    input.lifecycle(&mut Lifecycle::Snapshot(
        id,
        barrier.options.kind,
        &mut parts,
    ))?;
    let metrics = SubtaskCheckpointMetrics {
        start_delay: Duration::ZERO,
        alignment: Duration::ZERO,
        sync_duration: sync_start.elapsed(),
        async_duration: Duration::ZERO,
        state_size: 0,
    };
    let parts = FrozenParts::new(env, parts);
    spawn_upload(env, (id, barrier.options.kind), parts, Vec::new(), metrics);
    Ok(())
}

/// Step 4, asynchronous part: serialize and upload off the processing path, then acknowledge.
/// The synchronous part's result: each operator's frozen state, with the chain each incremental
/// keyed delta extends, looked up when the snapshot was taken (a later completion prunes the
/// chains older than it, and an unaligned snapshot uploads only once its in-flight data is in).
struct FrozenParts {
    parts: Vec<OperatorSnapshotParts>,
    /// Per part: the chain its keyed delta extends (empty for anything else), or why it is
    /// unknown.
    bases: Result<Vec<Vec<KeyedStateHandle>>, String>,
}

impl FrozenParts {
    fn new(env: &TaskEnv, parts: Vec<OperatorSnapshotParts>) -> FrozenParts {
        let bases = parts
            .iter()
            .map(|p| match p.keyed.as_ref().map(|k| k.scope()) {
                Some(SnapshotScope::Incremental { base: Some(base) }) => env
                    .chains
                    .lock()
                    .ok()
                    .and_then(|c| c.get(&p.operator_id)?.get(&CheckpointId(base)).cloned())
                    .ok_or_else(|| {
                        format!(
                            "operator {}: the incremental chain of checkpoint {base}, which this \
                             delta extends, is unknown",
                            p.operator_id
                        )
                    }),
                _ => Ok(Vec::new()),
            })
            .collect();
        FrozenParts { parts, bases }
    }
}

fn spawn_upload(
    env: &TaskEnv,
    (id, kind): (CheckpointId, SnapshotKind),
    frozen: FrozenParts,
    in_flight: Vec<ChannelSection>,
    metrics: SubtaskCheckpointMetrics,
) {
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
    // The chain each delta extends, looked up now, in the task: a later completion may prune
    // it before the upload ends.
    let FrozenParts { parts, bases } = frozen;
    let chains = env.chains.clone();
    let (job_id, head_operator) = (env.job_id, env.head_operator);
    let guard = UploadGuard::new(&env.uploads);
    tokio::spawn(async move {
        let _guard = guard;
        let async_start = Instant::now();
        let result = match bases {
            Ok(bases) => {
                let parts = crate::upload::Upload {
                    job_id,
                    kind,
                    head_operator,
                    id,
                    task,
                    generation,
                    parts,
                    bases,
                    in_flight,
                    chains,
                };
                crate::upload::upload(storage, location, parts).await
            }
            Err(reason) => Err(reason),
        };
        let event = match result {
            Ok(state) => TaskEvent::Acknowledge {
                id,
                metrics: SubtaskCheckpointMetrics {
                    async_duration: async_start.elapsed(),
                    state_size: state.state_size(),
                    ..metrics
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
        let _ = reports.send(TaskReport {
            generation,
            task,
            event,
        });
    });
}
