//! Carrying out the checkpoint coordinator's decisions: trigger (preparing the location, the
//! operator coordinators' state and a savepoint's directory first), finalize (the `_metadata`
//! write, beside the loop), notify complete or aborted, and fail the job.

use super::snapshots::{Finalized, Outcome, build_metadata};
use super::{Generation, JobMaster};
use crate::task::TaskMessage;
use std::collections::BTreeMap;
use tracing::{debug, info, info_span};
use weir_checkpoint::coordinator::{CoordinatorAction, TaskKey};
use weir_checkpoint::storage::CheckpointLocation;
use weir_checkpoint::store::CompletedCheckpoint;
use weir_core::element::{CheckpointBarrier, CheckpointOptions, SnapshotKind};
use weir_core::handle::TaskStateSnapshot;
use weir_core::ids::CheckpointId;

impl JobMaster<'_> {
    /// Carries out every action the coordinator decided, and those that decides in turn.
    /// `Some` when one of them fails the job.
    pub(super) async fn carry_out_actions(&mut self, g: &mut Generation) -> Option<Outcome> {
        let mut fail = None;
        while !g.actions.is_empty() {
            for action in std::mem::take(&mut g.actions) {
                match action {
                    CoordinatorAction::Trigger {
                        id,
                        timestamp_ms,
                        options,
                        tasks,
                    } => {
                        weir_core::sim::record(format_args!(
                            "trigger {:?} {id} on {} tasks",
                            options.kind,
                            tasks.len()
                        ));
                        self.trigger(g, id, timestamp_ms, options, tasks).await
                    }
                    CoordinatorAction::TriggerFinished {
                        id,
                        timestamp_ms,
                        options,
                        tasks,
                    } => {
                        let barrier = CheckpointBarrier {
                            id,
                            timestamp_ms,
                            options,
                        };
                        for t in tasks {
                            if !self.host.send(t, TaskMessage::Trigger(barrier, false)) {
                                debug!(task = %t, "trigger not delivered: the task has ended");
                            }
                        }
                    }
                    CoordinatorAction::Finalize {
                        id,
                        kind,
                        timestamp_ms,
                        acks,
                    } => self.finalize(g, id, kind, timestamp_ms, &acks),
                    CoordinatorAction::NotifyComplete { id, tasks } => {
                        self.notify_complete(g, id, tasks)
                    }
                    CoordinatorAction::NotifyAborted { id, reason, tasks } => {
                        let span = g.spans.remove(&id).unwrap_or_else(tracing::Span::none);
                        span.in_scope(|| info!(%reason, "checkpoint aborted"));
                        weir_core::sim::record(format_args!("checkpoint {id} aborted: {reason}"));
                        g.coordinator_states.remove(&id);
                        self.clear_target(id);
                        if let Some(mut t) = g.requested.remove(&id) {
                            if t.kind == SnapshotKind::SynchronousSavepoint {
                                // The suspended sources must hear it: it goes again.
                                g.stop_notified = Some(super::StopNotice {
                                    id,
                                    aborted: true,
                                    at: tokio::time::Instant::now()
                                        + super::event_loop::STOP_NOTIFY_AGAIN,
                                    left: super::event_loop::STOP_ABORT_AGAIN,
                                });
                            }
                            if let Some(reply) = t.reply.take() {
                                self.client.publish_stats(
                                    &g.coordinator,
                                    (self.totals.completed, self.totals.failed),
                                );
                                let _ = reply.send(Err(format!("snapshot {id} failed: {reason}")));
                            }
                        }
                        for t in tasks {
                            self.host.send(t, TaskMessage::NotifyAborted(id));
                        }
                        let location = CheckpointLocation::for_checkpoint(self.job_id, id);
                        self.discard_checkpoint(id, location, false);
                    }
                    CoordinatorAction::FailJob { reason } => fail = Some(reason),
                }
            }
        }
        fail.map(Outcome::Failed)
    }

    /// Prepares checkpoint `id` (its directory, the operator coordinators' state, a savepoint's
    /// target in every subtask) and injects its barrier at `tasks`, or fails the trigger.
    async fn trigger(
        &mut self,
        g: &mut Generation,
        id: CheckpointId,
        timestamp_ms: u64,
        options: CheckpointOptions,
        tasks: Vec<TaskKey>,
    ) {
        let span = info_span!("checkpoint", id = id.0, kind = ?options.kind);
        span.in_scope(|| debug!("triggered"));
        g.spans.insert(id, span);
        let (storage, location, drain, root) = match g.requested.get(&id) {
            Some(t) => (
                t.storage.clone(),
                t.location.clone(),
                t.drain,
                t.root.clone(),
            ),
            None => (
                self.storage.clone(),
                CheckpointLocation::for_checkpoint(self.job_id, id),
                false,
                self.storage_root.clone(),
            ),
        };
        let prepared = if options.kind == SnapshotKind::Checkpoint {
            storage
                .init_location(self.job_id, id)
                .await
                .map(|_| ())
                .map_err(|e| e.to_string())
        } else {
            Ok(())
        };
        // The operator coordinators are checkpointed before any barrier is injected;
        // assignments after this reach readers after the barrier.
        let prepared = prepared.and_then(|()| {
            let mut states = BTreeMap::new();
            for (op, e) in g.enumerators.values() {
                states.insert(*op, e.snapshot().map_err(|e| e.to_string())?);
            }
            g.coordinator_states.insert(id, states);
            Ok(())
        });
        // A savepoint's directory reaches every subtask before its barriers.
        let prepared = match prepared {
            Ok(()) if options.kind != SnapshotKind::Checkpoint => {
                self.set_target(id, storage, root, location).await
            }
            other => other,
        };
        match prepared {
            Err(e) => {
                let now = self.started.elapsed();
                g.coordinator.trigger_failed(id, e, now, &mut g.actions)
            }
            Ok(()) => {
                let barrier = CheckpointBarrier {
                    id,
                    timestamp_ms,
                    options,
                };
                for t in tasks {
                    if !self.host.send(t, TaskMessage::Trigger(barrier, drain)) {
                        debug!(task = %t, "trigger not delivered: the task has ended");
                    }
                }
            }
        }
    }

    /// Writes checkpoint `id`'s `_metadata`, beside the loop; the result comes back as a
    /// [`Finalized`] event.
    fn finalize(
        &mut self,
        g: &mut Generation,
        id: CheckpointId,
        kind: SnapshotKind,
        timestamp_ms: u64,
        acks: &BTreeMap<TaskKey, TaskStateSnapshot>,
    ) {
        g.finalizing.insert(id);
        let coordinators = g.coordinator_states.remove(&id).unwrap_or_default();
        let mut metadata = build_metadata(
            (self.job, &self.fingerprint),
            self.job_id,
            id,
            kind,
            timestamp_ms,
            acks,
            &coordinators,
        );
        metadata.tuning = (!self.tuning.is_empty()).then(|| self.tuning.clone());
        let (storage, location) = self
            .targets
            .lock()
            .ok()
            .and_then(|t| t.get(&id).cloned())
            .unwrap_or_else(|| {
                (
                    self.storage.clone(),
                    CheckpointLocation::for_checkpoint(self.job_id, id),
                )
            });
        if weir_core::sim::mutated(weir_core::sim::Mutation::NotifyBeforeMetadata) {
            // The deliberate bug: the tasks commit before the checkpoint is complete.
            for t in acks.keys() {
                self.host.send(*t, TaskMessage::NotifyComplete(id));
            }
        }
        if weir_core::sim::mutated(weir_core::sim::Mutation::RestoreWithoutMetadata) {
            // The deliberate bug's first half: the master keeps what it would write, to restore
            // from it whether or not `_metadata` is ever written.
            self.unwritten = Some((storage.clone(), location.clone(), metadata.clone()));
        }
        let tx = self.finalize_tx.clone();
        let generation = self.generation;
        tokio::spawn(async move {
            let result = storage
                .write_metadata(&location, &metadata)
                .await
                .map(|_| CompletedCheckpoint {
                    id,
                    location,
                    state_size: metadata.state_size(),
                    completion_timestamp_ms: metadata.completion_timestamp_ms,
                })
                .map_err(|e| e.to_string());
            let _ = tx
                .send(Finalized {
                    generation,
                    id,
                    result,
                })
                .await;
        });
    }

    /// Checkpoint `id` completed: the tasks commit, and a client waiting for it is answered.
    fn notify_complete(&mut self, g: &mut Generation, id: CheckpointId, tasks: Vec<TaskKey>) {
        let span = g.spans.remove(&id).unwrap_or_else(tracing::Span::none);
        if let Some(s) = g.coordinator.stats(id) {
            span.in_scope(|| info!("{s}"));
        }
        for t in tasks {
            self.host.send(t, TaskMessage::NotifyComplete(id));
        }
        self.clear_target(id);
        if let Some(mut t) = g.requested.remove(&id) {
            // Statistics first, so a client answered next sees them.
            self.client
                .publish_stats(&g.coordinator, (self.totals.completed, self.totals.failed));
            let path = t.storage.location_path(&t.location);
            info!(checkpoint = id.0, kind = ?t.kind, %path, "snapshot complete");
            if let Some(reply) = t.reply.take() {
                let _ = reply.send(Ok(path.clone()));
            }
            if t.kind == SnapshotKind::SynchronousSavepoint {
                // The sources now end their input; the job finishes normally.
                self.stopped_with = Some(path);
                g.stop_notified = Some(super::StopNotice {
                    id,
                    aborted: false,
                    at: tokio::time::Instant::now() + super::event_loop::STOP_NOTIFY_AGAIN,
                    left: u32::MAX,
                });
            }
        }
    }
}
