//! A subtask's checkpoint steps as a pure state machine (the decisions of Flink's
//! `SubtaskCheckpointCoordinator`): events in (a trigger, a barrier reached, an abort in
//! alignment, a notification, the end of input, in-flight data complete), actions out (snapshot,
//! decline, cancel marker, hold or upload an unaligned snapshot, suspend or end the input). It
//! does no I/O and knows no operator; the mailbox loop carries the actions out. Tested by
//! scripts of events, as `checkpoint/src/barrier.rs` is.

use std::collections::BTreeSet;
use std::time::Duration;
use weir_checkpoint::coordinator::{CheckpointFailureReason, TaskKey};
use weir_core::element::{CheckpointBarrier, SnapshotKind};
use weir_core::ids::CheckpointId;

/// What happened to the subtask.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum StepEvent {
    /// The job master triggered a checkpoint: at a source, or at a task whose input ended.
    /// `drain`: a stop-with-savepoint that first advances event time to the end.
    Triggered {
        barrier: CheckpointBarrier,
        drain: bool,
    },
    /// The barrier handler: the barrier is complete (aligned, or an unaligned one overtook),
    /// after waiting `alignment`.
    BarrierReached {
        barrier: CheckpointBarrier,
        alignment: Duration,
    },
    /// The barrier handler gave up on `id` during alignment.
    AbortedInAlignment { id: CheckpointId, reason: String },
    /// Checkpoint `id` completed.
    NotifyComplete(CheckpointId),
    /// Checkpoint `id` was aborted.
    NotifyAborted(CheckpointId),
    /// The input ended (the task stays until the job ends, and snapshots its final state).
    InputEnded,
    /// The input channel state of unaligned checkpoint `id` is complete.
    InFlightComplete(CheckpointId),
}

/// What the mailbox loop must do, in order.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum StepAction {
    /// Report that this subtask declines `id`.
    Decline {
        id: CheckpointId,
        reason: CheckpointFailureReason,
    },
    /// Tell downstream that `id` is cancelled (Flink's `CancelCheckpointMarker`).
    EmitCancelMarker(CheckpointId),
    /// Advance event time to the end and flush, before the snapshot (a drained stop).
    AdvanceToEndOfTime,
    /// The keyed backends start new incremental chains (the job master refused a delta).
    StartNewChains,
    /// Steps 1–4: prepare, send `barrier` ahead of what comes after it (unless the input ended:
    /// its outputs are closed), freeze every operator's state. Then upload it, or, with
    /// `hold`, keep it until its in-flight data is complete ([`StepEvent::InFlightComplete`]).
    Snapshot {
        barrier: CheckpointBarrier,
        alignment: Duration,
        emit_barrier: bool,
        hold: bool,
    },
    /// Upload the held snapshot of `id` with its in-flight data.
    UploadHeld(CheckpointId),
    /// Forget the held snapshot of `id`.
    DropHeld(CheckpointId),
    /// The operators hear that `id` completed (commit), and the incremental chains older than it
    /// go.
    NotifyComplete(CheckpointId),
    /// The operators and the barrier handler hear that `id` was aborted.
    NotifyAborted(CheckpointId),
    /// Emit nothing until the synchronous savepoint completes or is aborted.
    Suspend,
    /// The synchronous savepoint was aborted: emit again.
    Resume,
    /// The synchronous savepoint completed: end the input now (the job finishes).
    EndInput,
    /// Fail the task with this message.
    Fail(String),
}

/// The subtask's checkpoint memory (reference step 0).
#[derive(Debug)]
pub(crate) struct CheckpointSteps {
    /// The latest checkpoint this subtask snapshotted, declined or cancelled.
    last: Option<CheckpointId>,
    /// Checkpoints aborted before their barrier came: a cancel marker instead of a snapshot.
    aborted: BTreeSet<CheckpointId>,
    /// Whether the input ended.
    finished: bool,
    /// A synchronous savepoint's barrier went out: its id and whether it drains.
    suspended: Option<(CheckpointId, bool)>,
    /// The unaligned snapshot held until its in-flight data is complete.
    held: Option<CheckpointId>,
    /// Whether this task is a source (its unaligned snapshots have no input channel state).
    is_source: bool,
    /// The job's chain epoch this subtask's keyed backends build on.
    chain_epoch: u64,
    /// This subtask, as its declines name it.
    task: TaskKey,
}

impl CheckpointSteps {
    /// A subtask restored from `restored` (or fresh), at `chain_epoch`.
    pub(crate) fn new(
        restored: Option<CheckpointId>,
        task: TaskKey,
        is_source: bool,
        chain_epoch: u64,
    ) -> Self {
        CheckpointSteps {
            task,
            last: restored,
            aborted: BTreeSet::new(),
            finished: false,
            suspended: None,
            held: None,
            is_source,
            chain_epoch,
        }
    }

    /// Whether emitting is suspended by a synchronous savepoint.
    pub(crate) fn is_suspended(&self) -> bool {
        self.suspended.is_some()
    }

    /// Whether an unaligned snapshot waits for its in-flight data.
    #[cfg(test)]
    pub(crate) fn is_holding(&self) -> bool {
        self.held.is_some()
    }

    /// Decides what `event` means; `chain_epoch` is the job's epoch now.
    pub(crate) fn on(&mut self, event: StepEvent, chain_epoch: u64, out: &mut Vec<StepAction>) {
        match event {
            StepEvent::Triggered { barrier, .. } if self.finished => {
                // Input ended: no barrier will come; snapshot the final state (FLIP-147), once.
                if self.last.is_some_and(|l| l >= barrier.id) {
                    return;
                }
                self.last = Some(barrier.id);
                // An abort of this or a newer checkpoint came before the end: the barrier
                // handler then passed this one's barriers by, so the final state holds what
                // followed them and is no snapshot of this checkpoint (found by the
                // deterministic simulation, seed 25095).
                if self.aborted.last().is_some_and(|&a| a >= barrier.id) {
                    self.aborted.retain(|&a| a > barrier.id);
                    out.push(StepAction::Decline {
                        id: barrier.id,
                        reason: CheckpointFailureReason::Declined {
                            task: self.task,
                            reason: "a newer checkpoint was aborted before the input ended".into(),
                        },
                    });
                    return;
                }
                self.chains(chain_epoch, out);
                out.push(StepAction::Snapshot {
                    barrier,
                    alignment: Duration::ZERO,
                    emit_barrier: false,
                    hold: false,
                });
            }
            // The coordinator triggers nothing while a stop is in progress: a newer trigger
            // means the stop was aborted and its notification lost (found by the simulation,
            // seed 2446). Resume (as on the abort), then take the new checkpoint.
            StepEvent::Triggered { barrier, drain }
                if self.suspended.is_some_and(|(sid, _)| barrier.id > sid) =>
            {
                if let Some((sid, _)) = self.suspended {
                    self.aborted(sid, out);
                }
                if self.suspended.is_none() {
                    self.on(StepEvent::Triggered { barrier, drain }, chain_epoch, out);
                }
            }
            StepEvent::Triggered { barrier, .. } if self.suspended.is_some() => {
                out.push(StepAction::Decline {
                    id: barrier.id,
                    reason: CheckpointFailureReason::Declined {
                        task: self.task,
                        reason: "the task is closing".into(),
                    },
                });
            }
            StepEvent::Triggered { barrier, drain } => {
                let synchronous = barrier.options.kind == SnapshotKind::SynchronousSavepoint;
                if synchronous && drain {
                    out.push(StepAction::AdvanceToEndOfTime);
                }
                self.barrier(barrier, Duration::ZERO, chain_epoch, out);
                if synchronous {
                    // Nothing is emitted after a synchronous savepoint's barrier.
                    self.suspended = Some((barrier.id, drain));
                    out.push(StepAction::Suspend);
                }
            }
            StepEvent::BarrierReached { barrier, alignment } => {
                self.barrier(barrier, alignment, chain_epoch, out);
            }
            StepEvent::AbortedInAlignment { id, reason } => {
                let reason = CheckpointFailureReason::AbortedInAlignment(reason);
                if self.held == Some(id) {
                    self.held = None;
                    out.push(StepAction::DropHeld(id));
                    out.push(StepAction::Decline { id, reason });
                } else if self.last.is_none_or(|l| l < id) {
                    self.last = Some(id);
                    out.push(StepAction::EmitCancelMarker(id));
                    out.push(StepAction::Decline { id, reason });
                }
            }
            StepEvent::NotifyComplete(id) => {
                out.push(StepAction::NotifyComplete(id));
                // After a synchronous savepoint the sources end their input (with or without
                // drain: they emitted nothing after its barrier), and the job finishes.
                if self.suspended.is_some_and(|(sid, _)| sid == id) {
                    self.suspended = None;
                    out.push(StepAction::EndInput);
                }
            }
            StepEvent::NotifyAborted(id) => self.aborted(id, out),
            StepEvent::InputEnded => self.finished = true,
            StepEvent::InFlightComplete(id) => {
                if self.held == Some(id) {
                    self.held = None;
                    out.push(StepAction::UploadHeld(id));
                }
            }
        }
    }

    /// Step 0 (ordering, checkpoints aborted before their barrier), then the snapshot.
    fn barrier(
        &mut self,
        barrier: CheckpointBarrier,
        alignment: Duration,
        chain_epoch: u64,
        out: &mut Vec<StepAction>,
    ) {
        let id = barrier.id;
        if self.last.is_some_and(|l| l >= id) {
            // Out of order, or already declined: ignored.
            return;
        }
        self.last = Some(id);
        if self.aborted.remove(&id) {
            out.push(StepAction::EmitCancelMarker(id));
            return;
        }
        self.chains(chain_epoch, out);
        // The input channel state is complete once every channel's barrier has been read.
        let hold = barrier.options.is_unaligned() && !self.is_source;
        if hold {
            self.held = Some(id);
        }
        out.push(StepAction::Snapshot {
            barrier,
            alignment,
            emit_barrier: true,
            hold,
        });
    }

    /// If the job master refused a delta since this subtask's last snapshot, its keyed backends
    /// start new chains before the next one.
    fn chains(&mut self, chain_epoch: u64, out: &mut Vec<StepAction>) {
        if chain_epoch != self.chain_epoch {
            self.chain_epoch = chain_epoch;
            out.push(StepAction::StartNewChains);
        }
    }

    fn aborted(&mut self, id: CheckpointId, out: &mut Vec<StepAction>) {
        if let Some((sid, drain)) = self.suspended
            && sid == id
        {
            if drain {
                // Event time already went to the end: resuming would make every later record
                // late. Fail, and restart from the latest checkpoint (as Flink does).
                out.push(StepAction::Fail(format!(
                    "the drained stop-with-savepoint {id} failed after event time was advanced \
                     to the end"
                )));
                return;
            }
            self.suspended = None;
            out.push(StepAction::Resume);
        }
        if self.held == Some(id) {
            self.held = None;
            out.push(StepAction::DropHeld(id));
        }
        if self.last.is_none_or(|l| l < id) {
            self.aborted.insert(id);
        }
        out.push(StepAction::NotifyAborted(id));
    }
}

#[cfg(test)]
mod tests {
    use super::StepAction::*;
    use super::*;
    use weir_core::element::{AlignmentType, CheckpointOptions};

    const TASK: TaskKey = TaskKey {
        vertex: weir_core::ids::VertexId(0),
        subtask: 0,
    };

    fn barrier(id: u64, kind: SnapshotKind, alignment: AlignmentType) -> CheckpointBarrier {
        CheckpointBarrier {
            id: CheckpointId(id),
            timestamp_ms: 1,
            options: CheckpointOptions { kind, alignment },
        }
    }

    fn aligned(id: u64) -> CheckpointBarrier {
        barrier(id, SnapshotKind::Checkpoint, AlignmentType::Aligned)
    }

    fn unaligned(id: u64) -> CheckpointBarrier {
        barrier(id, SnapshotKind::Checkpoint, AlignmentType::Unaligned)
    }

    fn snapshot(b: CheckpointBarrier, hold: bool) -> StepAction {
        Snapshot {
            barrier: b,
            alignment: Duration::ZERO,
            emit_barrier: true,
            hold,
        }
    }

    /// Runs `script` (events with the chain epoch at each) and returns every action, in order.
    fn run(steps: &mut CheckpointSteps, script: Vec<StepEvent>) -> Vec<StepAction> {
        let mut out = Vec::new();
        for event in script {
            steps.on(event, 0, &mut out);
        }
        out
    }

    fn reached(b: CheckpointBarrier) -> StepEvent {
        StepEvent::BarrierReached {
            barrier: b,
            alignment: Duration::ZERO,
        }
    }

    #[test]
    fn barriers_snapshot_in_order_and_an_older_or_repeated_one_is_ignored() {
        let mut s = CheckpointSteps::new(Some(CheckpointId(2)), TASK, false, 0);
        let out = run(
            &mut s,
            vec![
                reached(aligned(2)), // restored from 2: already in the state
                reached(aligned(3)),
                reached(aligned(3)),
                reached(aligned(1)),
                reached(aligned(5)),
            ],
        );
        assert_eq!(
            out,
            vec![snapshot(aligned(3), false), snapshot(aligned(5), false)]
        );
    }

    #[test]
    fn a_checkpoint_aborted_before_its_barrier_gets_a_cancel_marker_not_a_snapshot() {
        let mut s = CheckpointSteps::new(None, TASK, false, 0);
        let id = CheckpointId(4);
        let out = run(
            &mut s,
            vec![StepEvent::NotifyAborted(id), reached(aligned(4))],
        );
        assert_eq!(out, vec![NotifyAborted(id), EmitCancelMarker(id)]);
        // An abort of a checkpoint already snapshotted is only passed on.
        let out = run(
            &mut s,
            vec![StepEvent::NotifyAborted(id), reached(aligned(5))],
        );
        assert_eq!(out, vec![NotifyAborted(id), snapshot(aligned(5), false)]);
    }

    #[test]
    fn an_unaligned_snapshot_is_held_until_its_in_flight_data_is_complete() {
        let mut s = CheckpointSteps::new(None, TASK, false, 0);
        let out = run(&mut s, vec![reached(unaligned(1))]);
        assert_eq!(out, vec![snapshot(unaligned(1), true)]);
        assert!(s.is_holding());
        // In-flight data of another checkpoint does not release it.
        assert!(run(&mut s, vec![StepEvent::InFlightComplete(CheckpointId(7))]).is_empty());
        let out = run(&mut s, vec![StepEvent::InFlightComplete(CheckpointId(1))]);
        assert_eq!(out, vec![UploadHeld(CheckpointId(1))]);
        assert!(!s.is_holding());
        // A source has no input channel state: it uploads at once.
        let mut source = CheckpointSteps::new(None, TASK, true, 0);
        let out = run(&mut source, vec![reached(unaligned(1))]);
        assert_eq!(out, vec![snapshot(unaligned(1), false)]);
    }

    #[test]
    fn a_held_snapshot_aborted_in_alignment_or_by_the_master_is_dropped() {
        let mut s = CheckpointSteps::new(None, TASK, false, 0);
        let id = CheckpointId(1);
        let abort = StepEvent::AbortedInAlignment {
            id,
            reason: "timeout".into(),
        };
        let out = run(&mut s, vec![reached(unaligned(1)), abort]);
        assert_eq!(
            out,
            vec![
                snapshot(unaligned(1), true),
                DropHeld(id),
                Decline {
                    id,
                    reason: CheckpointFailureReason::AbortedInAlignment("timeout".into())
                }
            ]
        );
        let out = run(
            &mut s,
            vec![
                reached(unaligned(2)),
                StepEvent::NotifyAborted(CheckpointId(2)),
            ],
        );
        assert_eq!(
            out,
            vec![
                snapshot(unaligned(2), true),
                DropHeld(CheckpointId(2)),
                NotifyAborted(CheckpointId(2))
            ]
        );
        assert!(!s.is_holding());
    }

    #[test]
    fn an_abort_in_alignment_of_a_newer_checkpoint_cancels_it_downstream_once() {
        let mut s = CheckpointSteps::new(None, TASK, false, 0);
        let id = CheckpointId(3);
        let abort = || StepEvent::AbortedInAlignment {
            id,
            reason: "overtaken".into(),
        };
        let out = run(&mut s, vec![abort(), abort(), reached(aligned(3))]);
        let decline = Decline {
            id,
            reason: CheckpointFailureReason::AbortedInAlignment("overtaken".into()),
        };
        assert_eq!(out, vec![EmitCancelMarker(id), decline]);
    }

    #[test]
    fn a_synchronous_savepoint_suspends_until_it_completes_then_the_input_ends() {
        let sp = barrier(
            6,
            SnapshotKind::SynchronousSavepoint,
            AlignmentType::Aligned,
        );
        let mut s = CheckpointSteps::new(None, TASK, true, 0);
        let out = run(
            &mut s,
            vec![
                StepEvent::Triggered {
                    barrier: sp,
                    drain: false,
                },
                // A trigger while suspended (one triggered before the stop: the coordinator
                // triggers nothing newer while it stops) is declined: the task is closing.
                StepEvent::Triggered {
                    barrier: aligned(5),
                    drain: false,
                },
                StepEvent::NotifyComplete(CheckpointId(6)),
            ],
        );
        assert_eq!(out[0], snapshot(sp, false));
        assert_eq!(out[1], Suspend);
        assert!(
            matches!(&out[2], Decline { id, reason: CheckpointFailureReason::Declined { reason, .. } } if *id == CheckpointId(5) && reason.contains("closing"))
        );
        assert_eq!(out[3..], [NotifyComplete(CheckpointId(6)), EndInput]);
        assert!(!s.is_suspended());
    }

    #[test]
    fn an_aborted_synchronous_savepoint_resumes_unless_it_drained() {
        let sp = barrier(
            2,
            SnapshotKind::SynchronousSavepoint,
            AlignmentType::Aligned,
        );
        let id = CheckpointId(2);
        let mut s = CheckpointSteps::new(None, TASK, true, 0);
        let trigger = |drain| StepEvent::Triggered { barrier: sp, drain };
        let out = run(&mut s, vec![trigger(false), StepEvent::NotifyAborted(id)]);
        assert_eq!(
            out,
            vec![snapshot(sp, false), Suspend, Resume, NotifyAborted(id)]
        );

        let mut s = CheckpointSteps::new(None, TASK, true, 0);
        let out = run(&mut s, vec![trigger(true), StepEvent::NotifyAborted(id)]);
        assert_eq!(out[..3], [AdvanceToEndOfTime, snapshot(sp, false), Suspend]);
        assert!(
            matches!(&out[3], Fail(m) if m.contains("drained")),
            "{out:?}"
        );
        assert_eq!(out.len(), 4, "nothing after the failure: {out:?}");
    }

    #[test]
    fn a_finished_task_declines_a_checkpoint_older_than_an_abort_it_saw() {
        // Checkpoint 3 was aborted before checkpoint 2's barriers came (the handler then passed
        // them by); after the input ended, 2's trigger must not snapshot the final state.
        let mut s = CheckpointSteps::new(Some(CheckpointId(1)), TASK, false, 0);
        let trigger = |b| StepEvent::Triggered {
            barrier: b,
            drain: false,
        };
        let out = run(
            &mut s,
            vec![
                StepEvent::NotifyAborted(CheckpointId(3)),
                StepEvent::InputEnded,
                trigger(aligned(2)),
                trigger(aligned(4)),
            ],
        );
        assert_eq!(out[0], NotifyAborted(CheckpointId(3)));
        assert!(
            matches!(&out[1], Decline { id, .. } if *id == CheckpointId(2)),
            "{out:?}"
        );
        assert_eq!(
            out[2..],
            [Snapshot {
                barrier: aligned(4),
                alignment: Duration::ZERO,
                emit_barrier: false,
                hold: false,
            }]
        );
    }

    #[test]
    fn a_newer_trigger_resumes_a_stop_whose_abort_was_lost() {
        let sp = barrier(
            2,
            SnapshotKind::SynchronousSavepoint,
            AlignmentType::Aligned,
        );
        let mut s = CheckpointSteps::new(None, TASK, true, 0);
        let trigger = |barrier| StepEvent::Triggered {
            barrier,
            drain: false,
        };
        // The abort of savepoint 2 never came; checkpoint 3's trigger did.
        let out = run(&mut s, vec![trigger(sp), trigger(aligned(3))]);
        assert_eq!(
            out,
            vec![
                snapshot(sp, false),
                Suspend,
                Resume,
                NotifyAborted(CheckpointId(2)),
                snapshot(aligned(3), false),
            ]
        );
        assert!(!s.is_suspended());
        // An older or repeated trigger while suspended is still declined.
        let mut s = CheckpointSteps::new(None, TASK, true, 0);
        let out = run(&mut s, vec![trigger(sp), trigger(aligned(1))]);
        assert!(matches!(&out[2], Decline { .. }), "{out:?}");
    }

    #[test]
    fn a_finished_task_snapshots_its_final_state_once_without_a_barrier() {
        let mut s = CheckpointSteps::new(None, TASK, false, 0);
        let trigger = |b| StepEvent::Triggered {
            barrier: b,
            drain: false,
        };
        let out = run(
            &mut s,
            vec![
                reached(aligned(1)),
                StepEvent::InputEnded,
                trigger(aligned(1)), // taken before the input ended
                trigger(aligned(2)),
                trigger(aligned(2)),
            ],
        );
        assert_eq!(
            out,
            vec![
                snapshot(aligned(1), false),
                Snapshot {
                    barrier: aligned(2),
                    alignment: Duration::ZERO,
                    emit_barrier: false,
                    hold: false
                }
            ]
        );
    }

    #[test]
    fn new_chains_start_before_the_first_snapshot_after_the_epoch_rises() {
        let mut s = CheckpointSteps::new(None, TASK, false, 0);
        let mut out = Vec::new();
        s.on(reached(aligned(1)), 0, &mut out);
        s.on(reached(aligned(2)), 1, &mut out);
        s.on(reached(aligned(3)), 1, &mut out);
        assert_eq!(
            out,
            vec![
                snapshot(aligned(1), false),
                StartNewChains,
                snapshot(aligned(2), false),
                snapshot(aligned(3), false)
            ]
        );
    }
}
