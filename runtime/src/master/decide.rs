//! The job master's decisions, as pure functions of what it knows: restart or give up, where a
//! failover restores from, whether an acknowledgement may join its checkpoint, whether a failed
//! restore is retried, and how long each recovery took. No I/O and no clock: the event loop
//! passes the time in.

use crate::error::JobError;
use crate::restart::{RestartStrategy, RestartTracker};
use std::time::Duration;
use weir_checkpoint::shared::SharedStateRegistry;
use weir_checkpoint::storage::CheckpointLocation;
use weir_checkpoint::store::CompletedCheckpointStore;
use weir_core::handle::TaskStateSnapshot;
use weir_core::ids::CheckpointId;

/// After a failure at `at` (since the job started) caused by `cause`: the delay before the job
/// restarts, or the error that ends it when the restart strategy gives up.
pub(crate) fn restart_or_give_up(
    restart: &mut RestartTracker,
    strategy: &RestartStrategy,
    at: Duration,
    cause: String,
) -> Result<Duration, JobError> {
    match restart.on_failure(at) {
        Some(delay) => Ok(delay),
        None => Err(JobError::Failed {
            restarts: restart.restarts(),
            strategy: strategy.describe(),
            cause,
        }),
    }
}

/// Where a failover restores from: every retained completed checkpoint, newest first, so that a
/// damaged newest one falls back to the one before. `None` when none completed (the job starts
/// over from its first restore point, or from nothing).
pub(crate) fn failover_candidates(
    store: &CompletedCheckpointStore,
) -> Option<Vec<CheckpointLocation>> {
    let retained: Vec<CheckpointLocation> =
        store.retained().rev().map(|c| c.location.clone()).collect();
    (!retained.is_empty()).then_some(retained)
}

/// Whether a task's acknowledgement of checkpoint `id` may join it, registering its shared
/// files: refused, with the reason, when it references shared files no checkpoint holds any
/// more (a delta built on a checkpoint subsumed meanwhile). The checkpoint must then not
/// complete, and the tasks start new chains.
pub(crate) fn admit_acknowledgement(
    registry: &mut SharedStateRegistry,
    id: CheckpointId,
    state: &TaskStateSnapshot,
) -> Result<(), String> {
    registry.register(id, state).map_err(|unknown| {
        format!(
            "it references shared state files no checkpoint holds any more: {}",
            unknown.join(", ")
        )
    })
}

/// Whether a restore that failed with `error` while deploying generation `generation` is one
/// more failure for the restart strategy (a failover's transient storage error), rather than
/// the end of the job (at job start the restore point is the user's; a damaged or incompatible
/// checkpoint is a [`JobError::Restore`] whatever the generation). A storage error the storage
/// calls temporary is retried even at job start: a resume after a crash must not fail for good
/// on one throttled read (found by the simulation, seed 20).
pub(crate) fn restore_failure_is_retried(generation: u64, error: &JobError) -> bool {
    match error {
        JobError::Restore { .. } => false,
        JobError::Storage(e) if e.is_temporary() => true,
        _ => generation > 1,
    }
}

/// For each restart, from the failure (`failures`: the generation deployed after it, and when
/// it was detected) to the first record processed after it (`firsts`: a generation and the
/// time of a first record in it, in µs since the job started). A restart whose generation
/// processed no record has none.
pub(crate) fn recovery_times(failures: &[(u64, Duration)], firsts: &[(u64, u64)]) -> Vec<Duration> {
    failures
        .iter()
        .filter_map(|(generation, at)| {
            firsts
                .iter()
                .filter(|(g, _)| g == generation)
                .map(|(_, us)| Duration::from_micros(*us))
                .min()
                .map(|first| first.saturating_sub(*at))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use weir_checkpoint::store::CompletedCheckpoint;
    use weir_core::handle::{KeyedStateHandle, OperatorSubtaskState, StreamStateHandle};
    use weir_core::ids::{JobId, OperatorId};
    use weir_core::keygroup::KeyGroupRange;

    #[test]
    fn the_restart_strategy_decides_until_it_gives_up_with_the_cause() {
        let strategy = RestartStrategy::FixedDelay {
            attempts: 2,
            delay: Duration::from_millis(7),
        };
        let mut restart = RestartTracker::new(strategy.clone());
        for i in 0..2u64 {
            let at = Duration::from_secs(i);
            let delay = restart_or_give_up(&mut restart, &strategy, at, "boom".into());
            assert_eq!(delay.unwrap(), Duration::from_millis(7));
        }
        match restart_or_give_up(
            &mut restart,
            &strategy,
            Duration::from_secs(3),
            "boom".into(),
        ) {
            Err(JobError::Failed {
                restarts,
                strategy: s,
                cause,
            }) => {
                assert_eq!(restarts, 2);
                assert_eq!(cause, "boom");
                assert_eq!(s, strategy.describe());
            }
            other => panic!("expected the job to give up, got {other:?}"),
        }
        let mut none = RestartTracker::new(RestartStrategy::NoRestart);
        let e = restart_or_give_up(
            &mut none,
            &RestartStrategy::NoRestart,
            Duration::ZERO,
            "x".into(),
        );
        assert!(
            matches!(e, Err(JobError::Failed { restarts: 0, .. })),
            "{e:?}"
        );
    }

    fn completed(id: u64) -> CompletedCheckpoint {
        CompletedCheckpoint {
            id: CheckpointId(id),
            location: CheckpointLocation::for_checkpoint(JobId(1), CheckpointId(id)),
            state_size: 0,
            completion_timestamp_ms: id,
        }
    }

    #[test]
    fn a_failover_restores_from_the_newest_retained_checkpoint_first() {
        let mut store = CompletedCheckpointStore::new(2);
        assert_eq!(failover_candidates(&store), None, "nothing completed yet");
        for id in [3, 4, 5] {
            store.add(completed(id));
        }
        let expected: Vec<CheckpointLocation> = [5, 4]
            .iter()
            .map(|&id| CheckpointLocation::for_checkpoint(JobId(1), CheckpointId(id)))
            .collect();
        assert_eq!(failover_candidates(&store), Some(expected));
    }

    fn referencing(path: &str, new: bool) -> TaskStateSnapshot {
        let mut state = TaskStateSnapshot::default();
        state.operators.insert(
            OperatorId::from_uid("sum"),
            OperatorSubtaskState {
                keyed: vec![KeyedStateHandle {
                    key_group_range: KeyGroupRange::new(0, 3),
                    header: (0, 10),
                    offsets: vec![10, 20, 30, 40],
                    end: 50,
                    stream: StreamStateHandle::File {
                        path: path.to_string(),
                        size: 100,
                        digest: weir_core::identity::Digest([7; 16]),
                    },
                }],
                operator: Vec::new(),
                native: Vec::new(),
            },
        );
        if new {
            state.new_shared = vec![path.to_string()];
        }
        state
    }

    #[test]
    fn a_delta_on_deleted_shared_files_is_refused_naming_them() {
        let mut registry = SharedStateRegistry::new();
        // Checkpoint 1 writes a shared file; checkpoint 2 builds on it.
        admit_acknowledgement(
            &mut registry,
            CheckpointId(1),
            &referencing("../shared/a", true),
        )
        .unwrap();
        admit_acknowledgement(
            &mut registry,
            CheckpointId(2),
            &referencing("../shared/a", false),
        )
        .unwrap();
        // Both subsumed: the file is gone, and a delta still building on it is refused.
        registry.release(CheckpointId(1));
        registry.release(CheckpointId(2));
        let refused = admit_acknowledgement(
            &mut registry,
            CheckpointId(3),
            &referencing("../shared/a", false),
        )
        .unwrap_err();
        assert!(refused.contains("../shared/a"), "{refused}");
        assert!(refused.contains("no checkpoint holds"), "{refused}");
    }

    #[test]
    fn only_a_failovers_transient_restore_failure_is_retried() {
        let storage = JobError::Invalid("storage unreachable".into());
        let damaged = JobError::Restore {
            path: "chk-3".into(),
            reason: "digest mismatch".into(),
        };
        assert!(
            !restore_failure_is_retried(1, &storage),
            "at job start: the user's"
        );
        assert!(restore_failure_is_retried(2, &storage));
        assert!(!restore_failure_is_retried(2, &damaged));
        let temporary = JobError::Storage(weir_checkpoint::CheckpointError::Storage {
            path: "chk-3/_metadata".into(),
            source: opendal::Error::new(opendal::ErrorKind::Unexpected, "throttled")
                .set_temporary(),
        });
        assert!(
            restore_failure_is_retried(1, &temporary),
            "a temporary error, even at start"
        );
    }

    #[test]
    fn recovery_runs_from_the_failure_to_the_first_record_of_the_next_generation() {
        let failures = [
            (2, Duration::from_millis(100)),
            (3, Duration::from_millis(500)),
        ];
        // Generation 2's first records at 130 and 120 ms; generation 3 processed nothing.
        let firsts = [(1, 5_000), (2, 130_000), (2, 120_000)];
        assert_eq!(
            recovery_times(&failures, &firsts),
            vec![Duration::from_millis(20)]
        );
    }
}
