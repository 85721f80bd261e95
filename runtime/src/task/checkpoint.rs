//! A subtask's checkpoint steps: the subtask coordinator's memory, the synchronous snapshot of
//! the chain (steps 0-4), and the asynchronous part handed to an upload task.

use super::input::*;
use super::steps::{CheckpointSteps, StepAction, StepEvent};
use super::*;
use crate::error::TaskError;
use crate::operator::{Lifecycle, OperatorSnapshotParts};
use std::sync::atomic::Ordering;
use std::time::Duration;
use tokio::time::Instant;
use tracing::{debug, warn};
use weir_checkpoint::barrier::HandlerAction;
use weir_checkpoint::coordinator::{CheckpointFailureReason, SubtaskCheckpointMetrics};
use weir_checkpoint::storage::CheckpointLocation;
use weir_core::channel_state::ChannelSection;
use weir_core::element::{CheckpointBarrier, SnapshotKind};
use weir_core::handle::KeyedStateHandle;
use weir_core::ids::CheckpointId;
use weir_state::SnapshotScope;

/// A subtask's checkpoint state: the pure steps' memory, and what only the loop can hold.
pub(super) struct SubtaskCheckpoints {
    /// The decisions (see [`CheckpointSteps`]).
    pub(super) steps: CheckpointSteps,
    /// The synchronous savepoint completed: end the input now.
    pub(super) end_now: bool,
    /// A split request is out: read nothing until the enumerator answers.
    pub(super) awaiting_splits: bool,
    /// An unaligned checkpoint whose snapshot is taken, waiting for its input channel state.
    pub(super) pending_unaligned: Option<PendingSnapshot>,
}

/// A snapshot taken (synchronous part done) but not yet uploaded.
pub(super) struct PendingSnapshot {
    pub(super) id: CheckpointId,
    pub(super) parts: FrozenParts,
    pub(super) output: Vec<ChannelSection>,
    pub(super) metrics: SubtaskCheckpointMetrics,
}

/// Hands `event` to the checkpoint steps and carries out what they decide, in order.
pub(super) async fn step(
    event: StepEvent,
    input: &mut dyn TaskInput,
    env: &TaskEnv,
    cps: &mut SubtaskCheckpoints,
    handler_actions: &mut Vec<HandlerAction>,
) -> Result<(), TaskError> {
    let mut actions = Vec::new();
    let epoch = env.chain_epoch.load(Ordering::Acquire);
    cps.steps.on(event, epoch, &mut actions);
    for action in actions {
        carry_out(action, input, env, cps, handler_actions).await?;
    }
    Ok(())
}

/// Carries out one of the checkpoint steps' actions.
async fn carry_out(
    action: StepAction,
    input: &mut dyn TaskInput,
    env: &TaskEnv,
    cps: &mut SubtaskCheckpoints,
    handler_actions: &mut Vec<HandlerAction>,
) -> Result<(), TaskError> {
    match action {
        StepAction::Decline { id, reason } => {
            weir_core::sim::record(format_args!("{} declines {}: {reason}", env.name, id.0));
            env.report(TaskEvent::Decline { id, reason }).await?
        }
        StepAction::EmitCancelMarker(id) => {
            input.lifecycle(&mut Lifecycle::EmitCancelMarker(id))?
        }
        StepAction::AdvanceToEndOfTime => input.advance_to_end_of_time()?,
        StepAction::StartNewChains => {
            input.lifecycle(&mut Lifecycle::StartNewChains)?;
            // The job manager refused a reference to a file it no longer holds: upload anew.
            if let Ok(mut chains) = env.chains.lock() {
                chains.native.clear();
            }
        }
        StepAction::Snapshot {
            barrier,
            alignment,
            emit_barrier,
            hold,
        } => {
            weir_core::sim::record(format_args!(
                "{} snapshots {:?} {}{}",
                env.name,
                barrier.options.kind,
                barrier.id.0,
                if emit_barrier {
                    ""
                } else {
                    " (its input ended)"
                }
            ));
            snapshot(input, env, cps, barrier, alignment, emit_barrier, hold).await?
        }
        // Carried out where the in-flight data is taken (`finish_unaligned`).
        StepAction::UploadHeld(_) => {}
        StepAction::DropHeld(id) => {
            if cps.pending_unaligned.as_ref().is_some_and(|p| p.id == id) {
                cps.pending_unaligned = None;
            }
        }
        StepAction::NotifyComplete(id) => {
            input.lifecycle(&mut Lifecycle::NotifyComplete(id))?;
            // Later deltas extend this checkpoint's chains: the older ones are not needed.
            if let Ok(mut chains) = env.chains.lock() {
                for by_checkpoint in chains.links.values_mut() {
                    if by_checkpoint.contains_key(&id) {
                        by_checkpoint.retain(|c, _| *c >= id);
                    }
                }
                // Native files it holds are referenced again, not uploaded again.
                chains.native.complete(id);
            }
        }
        StepAction::NotifyAborted(id) => {
            input.on_abort_notified(id, handler_actions);
            input.lifecycle(&mut Lifecycle::NotifyAborted(id))?;
        }
        StepAction::Suspend => {}
        StepAction::Resume => debug!("synchronous savepoint aborted; resuming"),
        StepAction::EndInput => cps.end_now = true,
        StepAction::Fail(message) => {
            return Err(TaskError::Operator {
                operator: env.name.clone(),
                message,
            });
        }
    }
    Ok(())
}

/// Uploads the pending unaligned snapshot once its input channel state is complete.
pub(super) fn finish_unaligned(
    input: &mut dyn TaskInput,
    env: &TaskEnv,
    cps: &mut SubtaskCheckpoints,
) {
    let Some((id, mut sections)) = input.take_in_flight() else {
        return;
    };
    let mut actions = Vec::new();
    let epoch = env.chain_epoch.load(Ordering::Acquire);
    cps.steps
        .on(StepEvent::InFlightComplete(id), epoch, &mut actions);
    if !actions.contains(&StepAction::UploadHeld(id)) {
        return;
    }
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

/// Steps 1–4 of the reference's `checkpointState` (step 0 was the steps' decision): prepare,
/// the barrier ahead of what follows it (unless the input ended), freeze every operator's
/// state, then upload, or hold it for its in-flight data.
async fn snapshot(
    input: &mut dyn TaskInput,
    env: &TaskEnv,
    cps: &mut SubtaskCheckpoints,
    barrier: CheckpointBarrier,
    alignment: Duration,
    emit_barrier: bool,
    hold: bool,
) -> Result<(), TaskError> {
    let id = barrier.id;
    super::mailbox::simulated_failure(weir_core::sim::FaultPoint::BeforeSnapshot, env)?;
    let mut output = Vec::new();
    let start_delay = if emit_barrier {
        let wall_ms = super::mailbox::wall_clock().as_millis() as u64;
        // Step 1: prepare; step 2: the barrier goes out ahead of anything emitted after it.
        // An unaligned barrier overtakes what is queued (step 3: that becomes output channel
        // state).
        input.lifecycle(&mut Lifecycle::PrepareSnapshotPreBarrier(id))?;
        if barrier.options.is_unaligned() {
            input.lifecycle(&mut Lifecycle::EmitPriorityBarrier(barrier, &mut output))?;
        } else {
            input.lifecycle(&mut Lifecycle::EmitBarrier(barrier))?;
        }
        Duration::from_millis(wall_ms.saturating_sub(barrier.timestamp_ms))
    } else {
        Duration::ZERO
    };
    // Step 4, synchronous part: freeze every operator's state.
    let sync_start = Instant::now();
    let mut parts = Vec::new();
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
        processed_data: input.processed_data(id),
    };
    super::mailbox::simulated_failure(weir_core::sim::FaultPoint::AfterSnapshot, env)?;
    let parts = FrozenParts::new(env, parts);
    if hold {
        cps.pending_unaligned = Some(PendingSnapshot {
            id,
            parts,
            output,
            metrics,
        });
        return Ok(());
    }
    spawn_upload(env, (id, barrier.options.kind), parts, output, metrics);
    if emit_barrier {
        // A task spawned from a busy task sits in this worker's LIFO slot, which other workers
        // cannot steal: yield once so the upload starts now, not after the next stretch of
        // records.
        tokio::task::yield_now().await;
    }
    Ok(())
}

/// Step 4, asynchronous part: serialize and upload off the processing path, then acknowledge.
/// The synchronous part's result: each operator's frozen state, with the chain each incremental
/// keyed delta extends, looked up when the snapshot was taken (a later completion prunes the
/// chains older than it, and an unaligned snapshot uploads only once its in-flight data is in).
pub(super) struct FrozenParts {
    pub(super) parts: Vec<OperatorSnapshotParts>,
    /// Per part: the chain its keyed delta extends (empty for anything else), or why it is
    /// unknown.
    pub(super) bases: Result<Vec<Vec<KeyedStateHandle>>, String>,
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
                    .and_then(|c| {
                        c.links
                            .get(&p.operator_id)?
                            .get(&CheckpointId(base))
                            .cloned()
                    })
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

pub(super) fn spawn_upload(
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
    let name = env.name.clone();
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
        let event = match simulated_upload(event, &name).await {
            Some(event) => event,
            None => return,
        };
        let _ = reports.send(TaskReport {
            generation,
            task,
            event,
        });
    });
}

/// What a simulation makes of an upload's report: the task fails during its upload, or its
/// acknowledgement is late or lost (`None`). Outside a simulation, the report as it is.
async fn simulated_upload(event: TaskEvent, task: &str) -> Option<TaskEvent> {
    use weir_core::sim::{Delivery, FaultPoint, Message};
    if !weir_core::sim::active() {
        return Some(event);
    }
    if weir_core::sim::fail_at(FaultPoint::Upload, task) {
        weir_core::sim::record(format_args!("{task} fails at Upload"));
        return Some(TaskEvent::Failed(TaskError::Operator {
            operator: task.to_string(),
            message: "simulated failure at Upload".into(),
        }));
    }
    if let TaskEvent::Acknowledge { id, .. } = &event {
        match weir_core::sim::deliver(Message::Acknowledge, task) {
            Delivery::Now => {}
            Delivery::Late(by) => tokio::time::sleep(by).await,
            Delivery::Lost => {
                weir_core::sim::record(format_args!("{task}: acknowledgement of {id:?} lost"));
                return None;
            }
        }
    }
    Some(event)
}
