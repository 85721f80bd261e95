//! The master's event loop within a generation: [`JobMaster::next_event`] waits on everything
//! at once and only returns what happened; the `handle_*` methods decide what it means.

use super::snapshots::{
    Finalized, Outcome, ROOT_CAUSE_WAIT, Target, discard_shared, discard_shared_now,
    savepoint_target,
};
use super::{Generation, JobMaster, decide};
use crate::error::TaskError;
use crate::job::Command;
use crate::source::SplitAssignment;
use crate::task::{TaskEvent, TaskMessage, TaskReport};
use std::sync::atomic::Ordering;
use tokio::time::Instant;
use tracing::{debug, info, warn};
use weir_checkpoint::CheckpointError;
use weir_checkpoint::coordinator::{CheckpointFailureReason, TaskKey, TriggerRefusal};
use weir_checkpoint::storage::CheckpointLocation;
use weir_core::element::SnapshotKind;
use weir_core::graph::ExecutionState;

/// What the master waits for.
pub(super) enum MasterEvent {
    /// A subtask reported (`None`: every task's sender is gone).
    Report(Option<TaskReport>),
    /// A failure that only echoed another waited long enough for its root cause.
    EchoTimedOut,
    /// Time to send a completed stop-with-savepoint's notification again.
    StopNotifyAgain,
    /// A `_metadata` write finished.
    Finalized(Finalized),
    /// The coordinator's next timer (periodic trigger, timeout) is due.
    CoordinatorTimer,
    /// A client's request (`None`: every client is gone).
    Command(Option<Command>),
    /// Time to look at the sources' progress (the record-count trigger).
    RecordsPoll,
    /// A discard beside the job finished.
    DiscardDone,
    /// The client cancelled the job.
    Canceled,
    /// Another run took the job directory over.
    LeaseLost(CheckpointError),
}

/// How long after a completed stop-with-savepoint its notification goes again to the subtasks
/// that have not finished.
/// How many times an aborted stop-with-savepoint's notification goes again.
pub(super) const STOP_ABORT_AGAIN: u32 = 3;

pub(super) const STOP_NOTIFY_AGAIN: std::time::Duration = std::time::Duration::from_millis(500);

/// Final checkpoints tried before a job whose storage keeps failing ends without one.
const FINAL_ATTEMPTS: u32 = 3;

/// What the loop does after an event.
pub(super) enum Step {
    /// Carry out the coordinator's actions, then wait for the next event.
    Act,
    /// Nothing to carry out: wait for the next event.
    Skip,
    /// The generation ended.
    End(Outcome),
}

impl JobMaster<'_> {
    /// Runs a generation until it ends: event, handling, the coordinator's actions.
    pub(super) async fn run_generation(&mut self, g: &mut Generation) -> Outcome {
        loop {
            let event = self.next_event(g).await;
            match self.handle(event, g).await {
                Step::Skip => continue,
                Step::End(outcome) => return outcome,
                Step::Act => {}
            }
            let outcome = self.carry_out_actions(g).await;
            self.client
                .publish_stats(&g.coordinator, (self.totals.completed, self.totals.failed));
            if let Some(outcome) = outcome {
                return outcome;
            }
            if let Some(outcome) = self.settle_final(g).await {
                return outcome;
            }
        }
    }

    /// Once every task finished: ends the job when its final checkpoint completed (or a stop
    /// with a savepoint did: the savepoint is its end), triggers the final checkpoint when it
    /// may start, and again after it failed, up to [`FINAL_ATTEMPTS`].
    async fn settle_final(&mut self, g: &mut Generation) -> Option<Outcome> {
        loop {
            let state = g.final_checkpoint?;
            if self.stopped_with.is_some() {
                return Some(Outcome::Finished);
            }
            match state {
                Some(id) if g.coordinator.latest_completed() >= Some(id) => {
                    return Some(Outcome::Finished);
                }
                Some(id) if g.coordinator.pending_ids().contains(&id) => return None,
                Some(_) if g.final_attempts >= FINAL_ATTEMPTS => {
                    warn!(
                        attempts = g.final_attempts,
                        "the final checkpoint keeps failing; the job ends without one, so a \
                         process killed before it ended would resume from an older checkpoint"
                    );
                    return Some(Outcome::Finished);
                }
                Some(_) => g.final_checkpoint = Some(None),
                None => {}
            }
            match self.trigger_final(g) {
                Step::End(outcome) => return Some(outcome),
                Step::Skip => return None,
                Step::Act => {
                    if let Some(outcome) = self.carry_out_actions(g).await {
                        return Some(outcome);
                    }
                    // Refused for now (a checkpoint or a stop pending): the next event.
                    if g.final_checkpoint == Some(None) {
                        return None;
                    }
                }
            }
        }
    }

    /// The one `select!`: waits for whatever happens first.
    pub(super) async fn next_event(&mut self, g: &mut Generation) -> MasterEvent {
        let wake = g.coordinator.next_wakeup();
        let started = self.started;
        // In order, not at random: one seed of a simulation is one schedule. A cancellation or
        // a lost lease first (rare, and nothing may delay them), then reports.
        tokio::select! {
            biased;
            _ = self.client.cancelled() => MasterEvent::Canceled,
            lost = async {
                match self.keeper.as_mut() {
                    Some(k) => k.lost().await,
                    None => std::future::pending().await,
                }
            } => MasterEvent::LeaseLost(lost),
            report = g.reports.recv() => MasterEvent::Report(report),
            _ = async {
                match &g.echo {
                    Some((_, at)) => tokio::time::sleep_until(*at).await,
                    None => std::future::pending().await,
                }
            } => MasterEvent::EchoTimedOut,
            _ = async {
                match &g.stop_notified {
                    Some(n) => tokio::time::sleep_until(n.at).await,
                    None => std::future::pending().await,
                }
            } => MasterEvent::StopNotifyAgain,
            Some(f) = self.finalize_rx.recv() => MasterEvent::Finalized(f),
            _ = async {
                match wake {
                    Some(w) => tokio::time::sleep_until(started + w).await,
                    None => std::future::pending().await,
                }
            } => MasterEvent::CoordinatorTimer,
            cmd = async {
                match self.commands.as_mut() {
                    Some(c) => c.recv().await,
                    None => std::future::pending().await,
                }
            } => MasterEvent::Command(cmd),
            _ = async {
                match g.records_poll.as_mut() {
                    Some(i) => { i.tick().await; }
                    None => std::future::pending().await,
                }
            } => MasterEvent::RecordsPoll,
            Some(_) = self.discards.join_next(), if !self.discards.is_empty() => MasterEvent::DiscardDone,
        }
    }

    /// Decides what an event means.
    pub(super) async fn handle(&mut self, event: MasterEvent, g: &mut Generation) -> Step {
        match event {
            MasterEvent::Report(None) => {
                Step::End(Outcome::Failed("every task ended without reporting".into()))
            }
            MasterEvent::Report(Some(report)) => self.handle_report(report, g),
            MasterEvent::StopNotifyAgain => {
                if let Some(mut n) = g.stop_notified.take() {
                    for t in self.all.iter().filter(|t| !g.finished.contains(t)) {
                        self.host.send(
                            *t,
                            if n.aborted {
                                TaskMessage::NotifyAborted(n.id)
                            } else {
                                TaskMessage::NotifyComplete(n.id)
                            },
                        );
                    }
                    n.left = n.left.saturating_sub(1);
                    if n.left > 0 {
                        n.at = Instant::now() + STOP_NOTIFY_AGAIN;
                        g.stop_notified = Some(n);
                    }
                }
                Step::Skip
            }
            MasterEvent::EchoTimedOut => {
                let cause = g.echo.take().map(|(c, _)| c).unwrap_or_default();
                warn!(%cause, "task failed");
                Step::End(Outcome::Failed(cause))
            }
            MasterEvent::Finalized(f) => self.handle_finalized(f, g).await,
            MasterEvent::CoordinatorTimer => {
                let now = self.started.elapsed();
                g.coordinator.tick(now, &mut g.actions);
                Step::Act
            }
            MasterEvent::Command(None) => {
                self.commands = None;
                Step::Skip
            }
            MasterEvent::Command(Some(command)) => self.handle_command(command, g),
            MasterEvent::RecordsPoll => {
                let emitted = self.metrics.source_records.load(Ordering::Relaxed) - g.records_base;
                let now = self.started.elapsed();
                g.coordinator.records_emitted(emitted, now, &mut g.actions);
                Step::Act
            }
            MasterEvent::DiscardDone => Step::Act,
            MasterEvent::Canceled => Step::End(Outcome::Canceled),
            MasterEvent::LeaseLost(lost) => {
                warn!(error = %lost, "the job directory was taken over: stopping");
                Step::End(Outcome::Fatal(lost.into()))
            }
        }
    }

    /// A subtask's report: running, a checkpoint's acknowledgement or decline, a split request,
    /// finished, failed.
    fn handle_report(&mut self, report: TaskReport, g: &mut Generation) -> Step {
        if report.generation != self.generation {
            // An earlier attempt's upload finished after its failure: the shared files it wrote
            // are referenced by no checkpoint.
            if let TaskEvent::Acknowledge { state, .. } = &report.event {
                let files = self.registry.unreferenced_in(state);
                discard_shared(&mut self.discards, &self.storage, self.job_id, files);
            }
            return Step::Skip;
        }
        let task = report.task;
        let now = self.started.elapsed();
        match report.event {
            TaskEvent::Running => {
                self.execution.get_mut(task.vertex, task.subtask).state = ExecutionState::Running;
                g.coordinator.task_running(task);
                g.running.insert(task);
                if g.running.len() == self.all.len() {
                    info!(generation = self.generation, "job RUNNING");
                    self.first_running.get_or_insert(now);
                    g.coordinator.job_status_changed(true, now, &mut g.actions);
                }
            }
            TaskEvent::Acknowledge { id, state, metrics } => {
                // `cargo xtask mutants`: subtask 0's keyed state handles are dropped from every
                // acknowledgement, to show the tests fail.
                #[cfg(weir_mutant = "drop_handle")]
                let state = {
                    let mut state = state;
                    if task.subtask == 0 {
                        state.operators.values_mut().for_each(|o| o.keyed.clear());
                    }
                    state
                };
                if let Some(span) = g.spans.get(&id) {
                    span.in_scope(|| debug!(%task, sync = ?metrics.sync_duration, async_ = ?metrics.async_duration, alignment = ?metrics.alignment, size = metrics.state_size, "acknowledged"));
                }
                // Registered before the coordinator takes it: the checkpoint's shared files stay
                // while it is pending or retained.
                let live = g.coordinator.pending_ids().contains(&id);
                match decide::admit_acknowledgement(&mut self.registry, id, &state) {
                    Ok(()) => {
                        g.coordinator
                            .acknowledge(task, id, state, metrics, now, &mut g.actions)
                    }
                    Err(reason) => {
                        // It must not complete; the abort makes the tasks start new chains.
                        if let Some(span) = g.spans.get(&id) {
                            span.in_scope(|| warn!(%task, %reason, "acknowledgement refused"));
                        }
                        self.raise_chain_epoch();
                        let reason = CheckpointFailureReason::Declined { task, reason };
                        g.coordinator.decline(task, id, reason, now, &mut g.actions);
                    }
                }
                if !live {
                    // A late acknowledgement of an aborted checkpoint.
                    let files = self.registry.release(id);
                    discard_shared(&mut self.discards, &self.storage, self.job_id, files);
                }
            }
            TaskEvent::Decline { id, reason } => {
                if let Some(span) = g.spans.get(&id) {
                    span.in_scope(|| info!(%task, %reason, "declined"));
                }
                g.coordinator.decline(task, id, reason, now, &mut g.actions);
            }
            TaskEvent::SplitRequest => return self.assign_splits(task, g),
            TaskEvent::Finished => {
                self.execution.get_mut(task.vertex, task.subtask).state = ExecutionState::Finished;
                g.finished.insert(task);
                g.coordinator.task_finished(task, now, &mut g.actions);
                if g.finished.len() == self.all.len() {
                    if !self.config.checkpoint.is_enabled() {
                        return Step::End(Outcome::Finished);
                    }
                    // FLIP-147: the job ends with a checkpoint of every subtask's final state,
                    // before the sinks commit what they hold for the end.
                    g.final_checkpoint = Some(None);
                    return Step::Act;
                }
            }
            TaskEvent::Failed(e) => {
                self.execution.get_mut(task.vertex, task.subtask).state = ExecutionState::Failed;
                if let TaskError::UnusableCheckpoint { location, .. } = &e {
                    weir_core::sim::observe(weir_core::sim::Observed::Unusable {
                        checkpoint: location.clone(),
                        reason: e.to_string(),
                    });
                    self.fell_back |= self.unusable.insert(location.clone());
                }
                let cause = format!("task {task} failed: {e}");
                if e.is_echo() {
                    debug!(%task, error = %e, "task failed as a consequence; waiting for the root cause");
                    g.echo
                        .get_or_insert((cause, Instant::now() + ROOT_CAUSE_WAIT));
                    return Step::Skip;
                }
                warn!(%task, error = %e, "task failed");
                return Step::End(Outcome::Failed(cause));
            }
        }
        Step::Act
    }

    /// Triggers the final checkpoint if it may start now; a refusal that waits for a pending
    /// checkpoint is retried after the next event, any other ends the job without one.
    fn trigger_final(&mut self, g: &mut Generation) -> Step {
        let now = self.started.elapsed();
        match g.coordinator.trigger_final(now, &mut g.actions) {
            Ok(id) => {
                debug!(
                    checkpoint = id.0,
                    "every task finished: the final checkpoint"
                );
                g.final_checkpoint = Some(Some(id));
                g.final_attempts += 1;
                Step::Act
            }
            // A checkpoint (or a stop) still pending may be waiting for the finished tasks'
            // triggers queued with their end: carry them out, and try again after it.
            Err(TriggerRefusal::TooManyConcurrent(_) | TriggerRefusal::Stopping(_)) => Step::Act,
            Err(refusal) => {
                debug!(%refusal, "every task finished; no final checkpoint");
                Step::End(Outcome::Finished)
            }
        }
    }

    /// A source reader asks for splits: its enumerator's answer goes straight back.
    fn assign_splits(&mut self, task: TaskKey, g: &mut Generation) -> Step {
        let assignment = match g.enumerators.get_mut(&task.vertex) {
            Some((_, e)) => e.assign(task.subtask),
            None => SplitAssignment::NoMoreSplits,
        };
        debug!(%task, ?assignment, "split request");
        // An assigned split is in no enumerator snapshot any more: if it cannot be delivered,
        // fail (and restore) rather than lose it.
        if !self.host.send(task, TaskMessage::Splits(assignment)) {
            return Step::End(Outcome::Failed(format!(
                "cannot deliver a split assignment to {task}: its mailbox is full or closed"
            )));
        }
        Step::Act
    }

    /// A `_metadata` write finished: the checkpoint completed (and may subsume older ones), or
    /// failed.
    async fn handle_finalized(&mut self, f: Finalized, g: &mut Generation) -> Step {
        if f.generation != self.generation {
            return Step::Skip;
        }
        g.finalizing.remove(&f.id);
        let now = self.started.elapsed();
        let kind = g
            .requested
            .get(&f.id)
            .map_or(SnapshotKind::Checkpoint, |t| t.kind);
        let is_checkpoint = kind == SnapshotKind::Checkpoint;
        if f.result.is_ok() {
            weir_core::sim::observe(weir_core::sim::Observed::Completed(f.id.0, kind));
        }
        match f.result {
            // Savepoints belong to the user: not retained, never discarded.
            Ok(_) if !is_checkpoint => g.coordinator.finalized(f.id, Ok(()), now, &mut g.actions),
            Ok(cp) => {
                g.coordinator.finalized(f.id, Ok(()), now, &mut g.actions);
                let subsumed = self.store.add(cp);
                // Claim mode: the restored checkpoint goes once this run retains as many of its
                // own as it may.
                if self.store.retained().count() >= self.config.checkpoint.num_retained as usize
                    && let (Some(c), Some(k)) = (self.claim.as_mut(), self.keeper.as_ref())
                {
                    c.subsume(k).await;
                }
                for old in subsumed {
                    self.discard_checkpoint(old.id, old.location, true);
                }
            }
            Err(e) => g.coordinator.finalized(f.id, Err(e), now, &mut g.actions),
        }
        Step::Act
    }

    /// Releases checkpoint `id`'s shared files and deletes its directory, beside the job.
    pub(super) fn discard_checkpoint(
        &mut self,
        id: weir_core::ids::CheckpointId,
        location: CheckpointLocation,
        warn_on_error: bool,
    ) {
        let files = self.registry.release(id);
        let storage = self.storage.clone();
        let job_id = self.job_id;
        // The checkpoint first (its `_metadata` first of all), then the shared files only it
        // referenced: a discard cut short never leaves a complete checkpoint whose shared files
        // are gone (found by the deterministic simulation, seed 12211).
        self.discards.spawn(async move {
            match storage.discard(&location).await {
                Ok(()) => discard_shared_now(&storage, job_id, files).await,
                Err(e) => {
                    if warn_on_error {
                        warn!(checkpoint = id.0, error = %e, "cannot discard subsumed checkpoint");
                    }
                    // Its `_metadata` may remain: keep what it references.
                }
            }
        });
    }

    /// Live tuning: checked against the configuration, then applied to the coordinator, kept
    /// for the next generations and recorded by each `_metadata` from now on.
    fn retune(
        &mut self,
        tuning: weir_core::config::CheckpointTuning,
        reply: tokio::sync::oneshot::Sender<Result<weir_core::config::CheckpointConfig, String>>,
        g: &mut Generation,
    ) {
        let combined = self.tuning.then(&tuning);
        match combined.applied_to(&self.config.checkpoint) {
            Ok(config) => {
                info!(?tuning, "checkpointing retuned");
                self.tuning = combined;
                g.coordinator.retune(config.clone(), self.started.elapsed());
                self.client
                    .update_view(|v| v.checkpoint_config = Some(config.clone()));
                let _ = reply.send(Ok(config));
            }
            Err(e) => {
                let _ = reply.send(Err(e.to_string()));
            }
        }
    }

    /// A client asks for a checkpoint, a savepoint, or a stop with a savepoint.
    fn handle_command(&mut self, command: Command, g: &mut Generation) -> Step {
        let (kind, dir, drain, reply) = match command {
            Command::Snapshot {
                kind,
                dir,
                drain,
                reply,
            } => (kind, dir, drain, reply),
            Command::Retune { tuning, reply } => {
                self.retune(tuning, reply, g);
                return Step::Skip;
            }
        };
        let target = match kind {
            // Without checkpointing there is no checkpoint storage to write to (Flink has no
            // checkpoint coordinator then): savepoints only.
            SnapshotKind::Checkpoint if !self.config.checkpoint.is_enabled() => {
                let _ = reply.send(Err(
                    "checkpointing is not enabled for this job: set a checkpoint interval to \
                     take checkpoints, or take a savepoint"
                        .to_string(),
                ));
                return Step::Skip;
            }
            SnapshotKind::Checkpoint => None,
            _ => match savepoint_target(
                self.config,
                dir,
                self.job_id,
                g.coordinator.next_checkpoint_id(),
            ) {
                Ok(t) => Some(t),
                Err(e) => {
                    let _ = reply.send(Err(e));
                    return Step::Skip;
                }
            },
        };
        let now = self.started.elapsed();
        match g.coordinator.trigger(kind, now, &mut g.actions) {
            Ok(id) => {
                let (storage, root, location) = target.unwrap_or_else(|| {
                    (
                        self.storage.clone(),
                        self.storage_root.clone(),
                        CheckpointLocation::for_checkpoint(self.job_id, id),
                    )
                });
                g.requested.insert(
                    id,
                    Target {
                        kind,
                        drain,
                        storage,
                        root,
                        location,
                        reply: Some(reply),
                    },
                );
            }
            Err(refusal) => {
                let _ = reply.send(Err(format!("not triggered: {refusal}")));
            }
        }
        Step::Act
    }
}
