//! The mailbox loop of one subtask: messages from the job master, timers, output flushes and
//! input steps, in turn, and the barrier handler's actions carried out.

use super::checkpoint;
use super::checkpoint::*;
use super::guard::*;
use super::input::*;
use super::steps::{CheckpointSteps, StepEvent};
use super::*;
use crate::error::TaskError;
use crate::operator::{Lifecycle, OpResult, RestoreContext};
use std::future::poll_fn;
use std::sync::atomic::Ordering;
use std::task::Poll;
use std::time::Duration;
use tokio::time::Instant;
use tracing::{Instrument, debug};
use weir_checkpoint::barrier::HandlerAction;
use weir_core::sim::{Delivery, FaultPoint, Message};

pub(super) enum Wake {
    Message(Option<TaskMessage>),
    Timer,
    ProcessingTime,
    Flushed(OpResult),
    Step(Result<Step, TaskError>),
    /// The input has nothing now: partly filled batches leave before the task waits.
    InputDry,
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

/// Opens the chain on what it restores: the keyed files it reads from local disk fetched first.
async fn open(
    input: &mut dyn TaskInput,
    env: &mut TaskEnv,
    mut restore: RestoreContext,
) -> Result<(), TaskError> {
    if restore.checkpoint.is_some() {
        simulated_failure(FaultPoint::Restore, env)?;
    }
    let mut downloads = super::fetch::fetch_native(&mut restore, env).await?;
    super::fetch::fetch_keyed(&mut restore, env, &mut downloads).await?;
    input.lifecycle(&mut Lifecycle::Open(&mut restore))?;
    drop((restore, downloads));
    Ok(())
}

pub(super) async fn run(
    input: &mut dyn TaskInput,
    env: &mut TaskEnv,
    restore: RestoreContext,
) -> Result<(), TaskError> {
    let mut cps = SubtaskCheckpoints {
        steps: CheckpointSteps::new(
            restore.checkpoint,
            env.task,
            env.is_source,
            env.chain_epoch.load(Ordering::Acquire),
        ),
        end_now: false,
        awaiting_splits: false,
        pending_unaligned: None,
    };
    open(input, env, restore).await?;
    env.report(TaskEvent::Running).await?;
    let mut actions: Vec<HandlerAction> = Vec::new();
    let _waits = EndWaitOnDrop::of(env);
    // A restored writer may hold in-flight data to send first.
    let mut output_pending = true;
    let mut pace = Pace::new();
    // Whether writers may hold partly filled batches.
    let mut partial_pending = false;
    let mut processing_timer: Option<(i64, std::pin::Pin<Box<tokio::time::Sleep>>)> = None;
    loop {
        // One relaxed load per step (a batch): a task that never waits still stops here.
        env.cancellation.check()?;
        // A simulation's lever on the schedule (one thread-local read otherwise).
        if let Some(pause) = weir_core::sim::pause(&env.name) {
            tokio::time::sleep(pause).await;
        }
        let now = wall_clock();
        let suspended = cps.steps.is_suspended() || cps.awaiting_splits;
        let end_now = std::mem::take(&mut cps.end_now);
        let mut timer = input
            .next_deadline()
            .map(|d| Box::pin(tokio::time::sleep(d.saturating_sub(now))));
        // Processing-time timers: one sleep, kept while the earliest timer stays the same. A
        // timer for `at` is due once the clock reads `at + 1` (see `Lifecycle::ProcessingTime`).
        let next_pt = env.processing_time.next();
        if processing_timer.as_ref().map(|(at, _)| *at) != next_pt {
            processing_timer = next_pt.map(|at| {
                let wait = at.saturating_add(1).saturating_sub(now.as_millis() as i64);
                let wait = Duration::from_millis(wait.max(0) as u64);
                (at, Box::pin(tokio::time::sleep(wait)))
            });
        }
        // Whether the wait below found the output blocked on credits (back pressure).
        let mut blocked = false;
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
                    let flushed = input.poll_flush(cx);
                    if flushed.is_pending() && !blocked {
                        blocked = true;
                        backpressure_began(env, now);
                    }
                    flushed.map(Wake::Flushed)
                } else if suspended {
                    if partial_pending {
                        Poll::Ready(Wake::InputDry)
                    } else {
                        Poll::Pending
                    }
                } else {
                    match input.poll_step(cx, now, &mut actions) {
                        Poll::Pending if partial_pending => Poll::Ready(Wake::InputDry),
                        step => step.map(Wake::Step),
                    }
                }
            })
            .await
        };
        if blocked {
            backpressure_ended(env);
        }
        // Anything but a flush may have emitted records into partly filled batches.
        if !matches!(wake, Wake::Flushed(_) | Wake::InputDry) {
            partial_pending = true;
        }
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
                // The last millisecond the clock has passed: timers up to it are due.
                let passed = crate::operator::ProcessingTimeService::now_ms() - 1;
                input.lifecycle(&mut Lifecycle::ProcessingTime(passed))?;
                output_pending = true;
            }
            Wake::Flushed(r) => {
                r?;
                output_pending = false;
            }
            Wake::InputDry => {
                input.lifecycle(&mut Lifecycle::FlushPartial)?;
                partial_pending = false;
                pace.last_partial_flush = Instant::now();
                output_pending = true;
            }
            Wake::Step(step) => match step? {
                Step::Records(n) => {
                    after_records(n, input, env, &mut cps, &mut pace).await?;
                    output_pending = true;
                }
                Step::Events => {
                    run_actions(input, env, &mut cps, &mut actions).await?;
                    output_pending = true;
                }
                Step::End => return end_of_input(input, env, &mut cps, &mut actions).await,
                Step::NeedSplits => {
                    cps.awaiting_splits = true;
                    env.report(TaskEvent::SplitRequest).await?;
                }
                Step::Idle => {
                    idle_step(input, env, &mut cps, &mut actions).await?;
                    output_pending = true;
                }
            },
        }
    }
}

/// When a task last did what it does only now and then while it processes records.
struct Pace {
    first_record: bool,
    steps_since_yield: u32,
    last_yield: Instant,
    /// When writers last handed over their partly filled batches.
    last_partial_flush: Instant,
}

impl Pace {
    fn new() -> Self {
        Pace {
            first_record: true,
            steps_since_yield: 0,
            last_yield: Instant::now(),
            last_partial_flush: Instant::now(),
        }
    }
}

/// After a step that processed `n` records: counters, an unaligned checkpoint's in-flight data,
/// the buffer timeout's hand-over and a yield now and then.
async fn after_records(
    n: usize,
    input: &mut dyn TaskInput,
    env: &mut TaskEnv,
    cps: &mut SubtaskCheckpoints,
    pace: &mut Pace,
) -> Result<(), TaskError> {
    if pace.first_record && n > 0 {
        pace.first_record = false;
        note_first_record(env);
    }
    count_records(env, n);
    simulated_failure(FaultPoint::Records, env)?;
    if cps.pending_unaligned.is_some() {
        finish_unaligned(input, env, cps);
    }
    // Partly filled batches wait for more records (full batches cost less per record
    // downstream), until the input runs dry or the buffer timeout.
    if pace.last_partial_flush.elapsed() >= BUFFER_TIMEOUT {
        input.lifecycle(&mut Lifecycle::FlushPartial)?;
        pace.last_partial_flush = Instant::now();
    }
    // Under a simulation tasks share one thread: a task that processes slowly (a busy sink)
    // yields by time too, so sources, uploads and the job master are not starved. On a thread
    // of its own a yield costs one poll.
    pace.steps_since_yield += 1;
    if pace.steps_since_yield >= 32 || pace.last_yield.elapsed() >= YIELD_AFTER {
        pace.steps_since_yield = 0;
        pace.last_yield = Instant::now();
        tokio::task::yield_now().await;
    }
    Ok(())
}

/// A step that found nothing to do: what it emitted (a watermark, an idle status) leaves now,
/// then the task waits for a message, or a millisecond.
async fn idle_step(
    input: &mut dyn TaskInput,
    env: &mut TaskEnv,
    cps: &mut SubtaskCheckpoints,
    actions: &mut Vec<HandlerAction>,
) -> Result<(), TaskError> {
    input.lifecycle(&mut Lifecycle::FlushPartial)?;
    tokio::select! {
        biased;
        m = env.mailbox.recv() => match m {
            None => Err(TaskError::MasterGone),
            Some(msg) => handle_message(msg, input, env, cps, actions).await,
        },
        _ = tokio::time::sleep(Duration::from_millis(1)) => Ok(()),
    }
}

/// Wall-clock time since the Unix epoch (a simulation's virtual time under one): the clock of
/// barrier timestamps, which the barrier handlers compare with.
pub(super) fn wall_clock() -> Duration {
    weir_core::sim::wall_clock()
}

/// The longest a record waits in a partly filled batch while its task keeps processing (Flink's
/// `execution.buffer-timeout`; Flink's default is 100 ms). A task also hands over its partly
/// filled batches whenever its input runs dry, before it waits, and before every event.
pub(super) const BUFFER_TIMEOUT: Duration = Duration::from_millis(1);

/// The longest a task runs records before it yields (to the tasks sharing its thread, if any).
pub(super) const YIELD_AFTER: Duration = Duration::from_micros(500);

/// One relaxed add per batch (not per record) to the job's shared counters.
/// After its input ended, a task stays until the whole job has finished: notifications still
/// reach its operators, and the job's end lets sinks commit what they held back.
pub(super) async fn wait_for_job_end(
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

/// The input ended: the alignment it may complete, the final flush, the report, then the wait
/// for the job's end (notifications still come, and the end lets sinks commit).
async fn end_of_input(
    input: &mut dyn TaskInput,
    env: &mut TaskEnv,
    cps: &mut SubtaskCheckpoints,
    actions: &mut Vec<HandlerAction>,
) -> Result<(), TaskError> {
    run_actions(input, env, cps, actions).await?;
    checkpoint::step(StepEvent::InputEnded, input, env, cps, actions).await?;
    weir_core::sim::record(format_args!("{}: input ended", env.name));
    input.lifecycle(&mut Lifecycle::EndInput)?;
    poll_fn(|cx| input.poll_flush(cx)).await?;
    debug!("input ended; task finished");
    env.report(TaskEvent::Finished).await?;
    wait_for_job_end(input, env, cps, actions).await
}

/// The generation's first record here: when (a recovery ends with it).
fn note_first_record(env: &TaskEnv) {
    let us = env.started.elapsed().as_micros() as u64;
    if let Ok(mut v) = env.metrics.first_record_us.lock() {
        v.push((env.generation, us));
    }
}

pub(super) fn count_records(env: &TaskEnv, n: usize) {
    let counter = if env.is_source {
        &env.metrics.source_records
    } else {
        &env.metrics.processed_records
    };
    counter.fetch_add(n as u64, Ordering::Relaxed);
    if let Some(c) = env.metrics.vertex_records.get(&env.task.vertex.0) {
        c.records.fetch_add(n as u64, Ordering::Relaxed);
    }
}

/// The task's back-pressure counters: the ns of its ended waits for credits, and when its
/// current wait began.
fn backpressure_counters(env: &TaskEnv) -> Option<(&AtomicU64, &AtomicU64)> {
    let c = env.metrics.vertex_records.get(&env.task.vertex.0)?;
    let i = env.task.subtask as usize;
    Some((c.backpressured_ns.get(i)?, c.backpressured_since_ns.get(i)?))
}

/// A wait for credits (output queued, the channels full) began at `since`: readers count it
/// as it goes.
fn backpressure_began(env: &TaskEnv, since: Duration) {
    if let Some((_, began)) = backpressure_counters(env) {
        began.store((since.as_nanos() as u64).max(1), Ordering::Relaxed);
    }
}

/// The task's wait for credits ended: it joins the task's back-pressured time.
fn backpressure_ended(env: &TaskEnv) {
    if let Some((ended, began)) = backpressure_counters(env) {
        end_wait(ended, began);
    }
}

/// Ends the wait `began` marks (if any), adding it to `ended`.
fn end_wait(ended: &AtomicU64, began: &AtomicU64) {
    let since = began.swap(0, Ordering::Relaxed);
    if since != 0 {
        let now = wall_clock().as_nanos() as u64;
        ended.fetch_add(now.saturating_sub(since), Ordering::Relaxed);
    }
}

/// Ends the task's wait for credits when its loop ends however it ends (an error, a cancel, the
/// task dropped mid-wait), so that no reader goes on counting a wait that is over.
struct EndWaitOnDrop {
    counters: Arc<crate::job::VertexRecords>,
    vertex: u32,
    subtask: usize,
}

impl EndWaitOnDrop {
    fn of(env: &TaskEnv) -> EndWaitOnDrop {
        EndWaitOnDrop {
            counters: env.metrics.vertex_records.clone(),
            vertex: env.task.vertex.0,
            subtask: env.task.subtask as usize,
        }
    }
}

impl Drop for EndWaitOnDrop {
    fn drop(&mut self) {
        if let Some(c) = self.counters.get(&self.vertex)
            && let (Some(ended), Some(began)) = (
                c.backpressured_ns.get(self.subtask),
                c.backpressured_since_ns.get(self.subtask),
            )
        {
            end_wait(ended, began);
        }
    }
}

pub(super) async fn handle_message(
    msg: TaskMessage,
    input: &mut dyn TaskInput,
    env: &TaskEnv,
    cps: &mut SubtaskCheckpoints,
    actions: &mut Vec<HandlerAction>,
) -> Result<(), TaskError> {
    let simulated = match &msg {
        TaskMessage::NotifyComplete(_) => Some(Message::NotifyComplete),
        TaskMessage::NotifyAborted(_) => Some(Message::NotifyAborted),
        _ => None,
    };
    if let Some(message) = simulated {
        match weir_core::sim::deliver(message, &env.name) {
            Delivery::Now => {}
            Delivery::Late(by) => tokio::time::sleep(by).await,
            Delivery::Lost => return Ok(()),
        }
    }
    let event = match msg {
        TaskMessage::Trigger(barrier, drain) => StepEvent::Triggered { barrier, drain },
        TaskMessage::NotifyComplete(id) => StepEvent::NotifyComplete(id),
        TaskMessage::NotifyAborted(id) => StepEvent::NotifyAborted(id),
        TaskMessage::Splits(assignment) => {
            cps.awaiting_splits = false;
            return input.assigned(assignment);
        }
        TaskMessage::JobFinished => return Ok(()),
    };
    step(event, input, env, cps, actions).await
}

/// Carries out the barrier handler's actions: a completed barrier or an abort in alignment
/// goes to the checkpoint steps.
pub(super) async fn run_actions(
    input: &mut dyn TaskInput,
    env: &TaskEnv,
    cps: &mut SubtaskCheckpoints,
    actions: &mut Vec<HandlerAction>,
) -> Result<(), TaskError> {
    for action in std::mem::take(actions) {
        let event = match action {
            HandlerAction::Trigger { barrier, alignment } => {
                StepEvent::BarrierReached { barrier, alignment }
            }
            HandlerAction::Abort { id, reason } => StepEvent::AbortedInAlignment {
                id,
                reason: reason.to_string(),
            },
            HandlerAction::Block(_) => {
                // A channel waits for the others' barriers: the task is aligning.
                simulated_failure(FaultPoint::Alignment, env)?;
                continue;
            }
            HandlerAction::UnblockAll
            | HandlerAction::PersistInFlight(_)
            | HandlerAction::BarrierReached(_)
            | HandlerAction::InFlightComplete(_) => continue,
        };
        step(event, input, env, cps, actions).await?;
    }
    if cps.pending_unaligned.is_some() {
        finish_unaligned(input, env, cps);
    }
    Ok(())
}

/// Fails the task at `point` when a simulation says so (never otherwise).
pub(super) fn simulated_failure(point: FaultPoint, env: &TaskEnv) -> Result<(), TaskError> {
    if weir_core::sim::fail_at(point, &env.name) {
        weir_core::sim::record(format_args!("{} fails at {point:?}", env.name));
        return Err(TaskError::Operator {
            operator: env.name.clone(),
            message: format!("simulated failure at {point:?}"),
        });
    }
    Ok(())
}
