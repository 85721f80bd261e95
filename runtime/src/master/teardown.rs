//! The end of a generation: its subtasks stopped, the `_metadata` writes in flight finished,
//! late uploads cleaned up, its coordinator's counts kept; then the job's result, or a restart.

use super::snapshots::{FINALIZE_WAIT, Outcome};
use super::{Generation, JobMaster, decide};
use crate::error::JobError;
use crate::gateway::TEARDOWN_WAIT;
use crate::spec::{JobResult, JobStatus};
use crate::task::TaskEvent;
use std::sync::atomic::Ordering;
use std::time::Duration;
use tokio::time::Instant;
use tracing::{info, warn};
use weir_checkpoint::coordinator::{CheckpointStatus, CoordinatorAction};
use weir_checkpoint::storage::CheckpointLocation;
use weir_core::config::ExternalizedRetention;
use weir_core::element::SnapshotKind;
use weir_core::graph::ExecutionState;

impl JobMaster<'_> {
    /// Tears generation `g` down. Checkpoints whose `_metadata` is being written finish first:
    /// they are complete (every subtask acknowledged) and may be the restore point. After a
    /// finished job, every task commits what it held back (now, and only now); otherwise each
    /// is aborted. An abort takes effect at a task's next await: wait until every task has
    /// stopped, so nothing of this generation runs on (or counts) once the next one starts or
    /// the result is read. A cancelled job waits for its tasks only for the cancellation
    /// timeout; what is still running then is abandoned.
    ///
    /// Returns how the generation ended: a finished job whose end was covered by a final
    /// checkpoint (or a stop's savepoint) but one of whose subtasks did not get through its
    /// final commit (it failed, was killed, or its task manager was lost) has failed, as Flink
    /// finishes a job only once every task has: the restart strategy restores that checkpoint
    /// and the commit happens after all (found by the deterministic simulation, seeds 427 and
    /// 1961: a task manager lost as the final checkpoint completed). After a stop with a
    /// savepoint, the failure ends the job naming the savepoint to resume from (see
    /// `end_generation`). A subtask merely still busy after the wait (a slow commit) is
    /// abandoned with a warning, as before: it commits on its own thread, and failing over
    /// would only start the same slow commit again.
    pub(super) async fn teardown(&mut self, g: &mut Generation, outcome: Outcome) -> Outcome {
        let wait = match outcome {
            Outcome::Canceled => self.config.task_cancellation_timeout,
            Outcome::Finished | Outcome::Failed(_) | Outcome::Fatal(_) => TEARDOWN_WAIT,
        };
        let finished = matches!(outcome, Outcome::Finished);
        // Only an end a restore point covers can be done again: without one, a failover
        // would start over from an older checkpoint whose successors were committed.
        let covered = finished
            && (self.stopped_with.is_some()
                || g.final_checkpoint
                    .flatten()
                    .is_some_and(|id| g.coordinator.latest_completed() >= Some(id)));
        let killed = self.host.stop(finished, wait).await;
        let mut failed_at_end = killed
            .first()
            .map(|task| format!("task {task} ended before its final commit"));
        self.finish_finalizing(g).await;
        let mut ignored = Vec::new();
        let now = self.started.elapsed();
        g.coordinator.job_status_changed(false, now, &mut ignored);
        for action in ignored {
            if let CoordinatorAction::NotifyAborted { id, .. } = action
                && !g.finalizing.contains(&id)
            {
                let location = CheckpointLocation::for_checkpoint(self.job_id, id);
                self.discard_checkpoint(id, location, false);
            }
        }
        // Uploads of this generation still running finish (or are given up on): what they
        // acknowledge now belongs to no checkpoint, and their shared files go.
        let give_up = Instant::now() + FINALIZE_WAIT;
        loop {
            let idle = self.host.uploads_idle();
            while let Ok(report) = g.reports.try_recv() {
                if let TaskEvent::Failed(e) = &report.event
                    && finished
                    && report.generation == self.generation
                    && failed_at_end.is_none()
                {
                    failed_at_end =
                        Some(format!("task {} failed at the job's end: {e}", report.task));
                }
                if let TaskEvent::Acknowledge { state, .. } = &report.event {
                    let files = self.registry.unreferenced_in(state);
                    super::snapshots::discard_shared(
                        &mut self.discards,
                        &self.storage,
                        self.job_id,
                        files,
                    );
                }
            }
            if idle || Instant::now() >= give_up {
                break;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        judge_end(outcome, covered, failed_at_end)
    }

    /// Waits (at most [`FINALIZE_WAIT`]) for the `_metadata` writes in flight, answering the
    /// clients that asked for them and retaining the checkpoints that completed.
    async fn finish_finalizing(&mut self, g: &mut Generation) {
        let give_up = Instant::now() + FINALIZE_WAIT;
        while !g.finalizing.is_empty() {
            let Ok(Some(f)) = tokio::time::timeout_at(give_up, self.finalize_rx.recv()).await
            else {
                break;
            };
            if f.generation != self.generation || !g.finalizing.remove(&f.id) {
                continue;
            }
            let mut ignored = Vec::new();
            let target = g.requested.remove(&f.id);
            let kind = target.as_ref().map_or(SnapshotKind::Checkpoint, |t| t.kind);
            let is_checkpoint = kind == SnapshotKind::Checkpoint;
            if let Some(mut t) = target {
                let path = t.storage.location_path(&t.location);
                if f.result.is_ok() && kind == SnapshotKind::SynchronousSavepoint {
                    // The stop completed as the generation failed: the job ends on it rather
                    // than fail over (see `end_generation`).
                    self.stopped_with = Some(path.clone());
                }
                if let Some(reply) = t.reply.take() {
                    let _ = reply.send(match &f.result {
                        Ok(_) => Ok(path),
                        Err(e) => Err(format!("snapshot {} failed: {e}", f.id)),
                    });
                }
            }
            let now = self.started.elapsed();
            if f.result.is_ok() {
                weir_core::sim::observe(weir_core::sim::Observed::Completed(f.id.0, kind));
            }
            match f.result {
                Ok(_) if !is_checkpoint => {
                    g.coordinator.finalized(f.id, Ok(()), now, &mut ignored);
                }
                Ok(cp) => {
                    g.coordinator.finalized(f.id, Ok(()), now, &mut ignored);
                    for old in self.store.add(cp) {
                        self.discard_checkpoint(old.id, old.location, false);
                    }
                }
                Err(e) => g.coordinator.finalized(f.id, Err(e), now, &mut ignored),
            }
        }
    }

    /// Keeps generation `g`'s counts, then ends the job (`Some`: its result) or, after a
    /// failure the restart strategy allows, prepares the next generation (`None`).
    pub(super) async fn end_generation(
        &mut self,
        g: Generation,
        outcome: Outcome,
    ) -> Result<Option<JobResult>, JobError> {
        let (completed, failed) = g.coordinator.counts();
        let totals = &mut self.totals;
        totals.completed += completed;
        totals.failed += failed;
        totals.durations.extend(g.coordinator.completed_durations());
        totals.in_flight.extend(g.coordinator.completed_in_flight());
        totals.history.extend(g.coordinator.history().cloned());
        totals.refused += g.coordinator.refused_count();
        self.next_checkpoint_id = g.coordinator.next_checkpoint_id();
        let mut requested = g.requested;
        let cause = match outcome {
            Outcome::Finished => return self.ended(JobStatus::Finished, requested).await.map(Some),
            Outcome::Canceled => return self.ended(JobStatus::Canceled, requested).await.map(Some),
            Outcome::Fatal(e) => return Err(e),
            Outcome::Failed(cause) => cause,
        };
        for (_, mut t) in std::mem::take(&mut requested) {
            if let Some(reply) = t.reply.take() {
                let _ = reply.send(Err(format!("the job failed: {cause}")));
            }
        }
        if let Some(path) = &self.stopped_with {
            // The stop's savepoint completed and the sinks committed on it: a failover to an
            // older checkpoint would commit that output again. The job ends, and its savepoint
            // is where to resume (Flink's FLINK-26783; found by the deterministic simulation,
            // seed 10009).
            return Err(JobError::Failed {
                restarts: self.restart.restarts(),
                strategy: "none once a stop-with-savepoint completed".into(),
                cause: format!(
                    "{cause}, after the stop-with-savepoint {path} completed: resume from it"
                ),
            });
        }
        let failed_at = self.started.elapsed();
        let delay = if std::mem::take(&mut self.fell_back) {
            warn!(%cause, "a subtask found the restored checkpoint unusable; restoring an older one (not counted against the restart strategy)");
            Duration::ZERO
        } else {
            let delay = decide::restart_or_give_up(
                &mut self.restart,
                &self.config.restart_strategy(),
                failed_at,
                cause.clone(),
            )?;
            warn!(%cause, restart = self.restart.restarts(), ?delay, "restarting the job");
            delay
        };
        weir_core::sim::record(format_args!("failover after {cause}"));
        self.failures.push((self.generation + 1, failed_at));
        self.execution.restart_all();
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        if let Some(locations) = decide::failover_candidates(&self.store) {
            self.restore = Some((self.storage.clone(), None, locations));
        }
        if let Some((_, _, locations)) = &mut self.restore {
            locations.retain(|l| !self.unusable.contains(&l.dir));
        }
        Ok(None)
    }

    /// The job ended with `status`: retention on cancellation, unanswered clients, discards
    /// awaited, and the result.
    async fn ended(
        &mut self,
        status: JobStatus,
        mut requested: std::collections::BTreeMap<weir_core::ids::CheckpointId, super::Target>,
    ) -> Result<JobResult, JobError> {
        if let Some(path) = &self.stopped_with {
            info!(savepoint = %path, "job stopped with a savepoint");
        }
        if status == JobStatus::Canceled
            && self.config.checkpoint.externalized_retention
                == ExternalizedRetention::DeleteOnCancellation
        {
            let retained: Vec<_> = self.store.retained().cloned().collect();
            for c in retained {
                // The checkpoint first: its shared files go only once its `_metadata` is gone.
                if let Err(e) = self.storage.discard(&c.location).await {
                    warn!(checkpoint = c.id.0, error = %e, "cannot delete the checkpoint on cancellation");
                    continue;
                }
                let files = self.registry.release(c.id);
                super::snapshots::discard_shared(
                    &mut self.discards,
                    &self.storage,
                    self.job_id,
                    files,
                );
            }
        }
        for (_, mut t) in std::mem::take(&mut requested) {
            if let Some(reply) = t.reply.take() {
                let _ = reply.send(Err("the job ended before the snapshot completed".into()));
            }
        }
        self.execution.set_all(match status {
            JobStatus::Finished => ExecutionState::Finished,
            JobStatus::Canceled => ExecutionState::Canceled,
        });
        let firsts = self
            .metrics
            .first_record_us
            .lock()
            .map(|v| v.clone())
            .unwrap_or_default();
        let recovery_times = decide::recovery_times(&self.failures, &firsts);
        if tokio::time::timeout(FINALIZE_WAIT, async {
            while self.discards.join_next().await.is_some() {}
        })
        .await
        .is_err()
        {
            warn!("discarding old checkpoints did not finish within {FINALIZE_WAIT:?}");
        }
        let totals = std::mem::take(&mut self.totals);
        let mut history = totals.history;
        let keep = history
            .len()
            .saturating_sub(weir_checkpoint::coordinator::STATS_HISTORY);
        history.drain(..keep);
        info!(
            ?status,
            restarts = self.restart.restarts(),
            completed = totals.completed,
            failed = totals.failed,
            "job ended"
        );
        let source_records = self.metrics.source_records.load(Ordering::Relaxed);
        Ok(JobResult {
            job_id: self.job_id,
            status,
            duration: self.started.elapsed(),
            running_duration: self
                .first_running
                .map(|at| self.started.elapsed().saturating_sub(at)),
            bytes_sent: 0,
            source_records,
            checkpoints_completed: totals.completed,
            checkpoints_failed: totals.failed,
            restarts: self.restart.restarts(),
            checkpoint_durations: totals.durations,
            checkpoint_in_flight: totals.in_flight,
            checkpoint_history: history
                .into_iter()
                .filter(|s| s.status != CheckpointStatus::InProgress)
                .collect(),
            recovery_times,
            savepoint: self.stopped_with.take(),
            trigger_refusals: totals.refused,
            latest_checkpoint: self
                .store
                .latest()
                .map(|c| self.storage.location_path(&c.location)),
            restored_from: self.restored_from.clone(),
            source_records_since_restore: source_records.saturating_sub(self.since_restore_base),
            restore_files: self.metrics.restore_files.read(),
        })
    }
}

/// How a generation ended, given whether its end is covered by a final checkpoint or a stop's
/// savepoint and what, if anything, did not confirm the end: a finished job whose end is
/// covered and not confirmed has failed (the restart strategy restores that checkpoint and the
/// final commits happen after all); one whose end is not covered stays finished, with a
/// warning (a failover would go back to an older checkpoint and commit its successors again).
fn judge_end(outcome: Outcome, covered: bool, unconfirmed: Option<String>) -> Outcome {
    match (outcome, unconfirmed) {
        (Outcome::Finished, Some(cause)) if covered => {
            warn!(%cause, "the job's end is not confirmed; failing over to its final checkpoint");
            Outcome::Failed(cause)
        }
        (Outcome::Finished, Some(cause)) => {
            warn!(%cause, "the job's end is not confirmed, and no final checkpoint covers it");
            Outcome::Finished
        }
        (outcome, _) => outcome,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unconfirmed_end_fails_over_only_when_a_final_checkpoint_covers_it() {
        let cause = || Some("task x did not confirm the job's end".to_string());
        assert!(matches!(
            judge_end(Outcome::Finished, true, cause()),
            Outcome::Failed(c) if c.contains("task x")
        ));
        assert!(matches!(
            judge_end(Outcome::Finished, false, cause()),
            Outcome::Finished
        ));
        assert!(matches!(
            judge_end(Outcome::Finished, true, None),
            Outcome::Finished
        ));
        // Other ends are what they were.
        assert!(matches!(
            judge_end(Outcome::Canceled, true, cause()),
            Outcome::Canceled
        ));
        assert!(matches!(
            judge_end(Outcome::Failed("f".into()), true, cause()),
            Outcome::Failed(c) if c == "f"
        ));
    }
}
