//! Hidden entry points for the fuzzer (`weir-fuzz`): the task protocol's decoder, and messages of
//! every kind encoded as the job manager and task managers send them, for its seed corpus.
//!
//! Nothing here is a supported API. The protocol's types are the runtime's own, so its seeds
//! are built here, with the production encoder ([`protocol::encode`]).

use super::protocol::{self, Deploy, FromTaskManager, ToTaskManager};
use crate::error::TaskError;
use crate::operator::{KeyedSections, RestoreContext, RestoredKeyed, RestoredOperatorState};
use crate::source::SplitAssignment;
use crate::spec::{TaskDeployment, TaskSettings};
use crate::task::{TaskEvent, TaskMessage, TaskReport};
use std::collections::HashMap;
use std::time::Duration;
use weir_checkpoint::coordinator::{CheckpointFailureReason, SubtaskCheckpointMetrics, TaskKey};
use weir_core::channel_state::{ChannelDirection, ChannelInfo, ChannelSection};
use weir_core::config::CheckpointingMode;
use weir_core::element::{AlignmentType, CheckpointBarrier, CheckpointOptions, SnapshotKind};
use weir_core::handle::{KeyedStateHandle, OperatorSubtaskState, StreamStateHandle};
use weir_core::handle::{OperatorStateHandle, OperatorStateMode, TaskStateSnapshot};
use weir_core::ids::{CheckpointId, JobId, OperatorId, VertexId};
use weir_core::keygroup::KeyGroupRange;

/// Which way a message goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    /// From the job manager to a task manager ([`ToTaskManager`] messages).
    ToTaskManager,
    /// From a task manager to the job manager ([`FromTaskManager`] messages).
    FromTaskManager,
}

/// Decodes `bytes` as the receiver of `direction` does; the number of messages.
pub fn decode(direction: Direction, bytes: &[u8]) -> Result<usize, String> {
    match direction {
        Direction::ToTaskManager => {
            protocol::decode::<ToTaskManager>(bytes, "fuzz").map(|m| m.len())
        }
        Direction::FromTaskManager => {
            protocol::decode::<FromTaskManager>(bytes, "fuzz").map(|m| m.len())
        }
    }
}

/// Encoded batches of messages, each way: every message kind, some batches of several.
pub fn seeds() -> Result<Vec<(Direction, Vec<u8>)>, String> {
    let to: Vec<Vec<ToTaskManager>> = vec![
        vec![ToTaskManager::Deploy(Box::new(deploy()))],
        vec![
            task_message(TaskMessage::Trigger(barrier(), false)),
            task_message(TaskMessage::NotifyComplete(CheckpointId(4))),
            task_message(TaskMessage::NotifyAborted(CheckpointId(5))),
            task_message(TaskMessage::Splits(SplitAssignment::Splits(vec![
                vec![1, 2],
                vec![],
            ]))),
            task_message(TaskMessage::Splits(SplitAssignment::NoMoreSplits)),
            task_message(TaskMessage::JobFinished),
        ],
        vec![
            ToTaskManager::SavepointTarget {
                id: CheckpointId(9),
                root: "s3://bucket/prefix".to_string(),
                dir: "savepoint-1".to_string(),
            },
            ToTaskManager::ClearTarget(CheckpointId(9)),
            ToTaskManager::ChainEpoch(2),
            ToTaskManager::Stop {
                generation: 3,
                finished: true,
            },
            ToTaskManager::Shutdown {
                state: "FINISHED".to_string(),
            },
        ],
        Vec::new(),
    ];
    let from: Vec<Vec<FromTaskManager>> = vec![
        vec![
            report(TaskEvent::Running),
            report(TaskEvent::Acknowledge {
                id: CheckpointId(4),
                state: task_state(),
                metrics: SubtaskCheckpointMetrics {
                    start_delay: Duration::from_millis(3),
                    alignment: Duration::from_micros(250),
                    sync_duration: Duration::from_micros(40),
                    async_duration: Duration::from_millis(12),
                    state_size: 96,
                    processed_data: 4096,
                },
            }),
        ],
        vec![
            report(TaskEvent::Decline {
                id: CheckpointId(5),
                reason: CheckpointFailureReason::Declined {
                    task: task(),
                    reason: "closing".to_string(),
                },
            }),
            report(TaskEvent::Decline {
                id: CheckpointId(6),
                reason: CheckpointFailureReason::Expired,
            }),
            report(TaskEvent::Finished),
            report(TaskEvent::Failed(TaskError::UpstreamGone(2))),
            report(TaskEvent::SplitRequest),
        ],
        vec![
            FromTaskManager::SourceRecords(1 << 40),
            FromTaskManager::VertexCounts(vec![(0, 1 << 40, vec![3, 0]), (1, 7, vec![])]),
            FromTaskManager::FirstRecord { generation: 3 },
            FromTaskManager::TargetSet(CheckpointId(9)),
            FromTaskManager::Results(vec![vec![7; 12], Vec::new()]),
            FromTaskManager::Stopped { generation: 3 },
        ],
    ];
    let mut out = Vec::new();
    for batch in &to {
        out.push((Direction::ToTaskManager, protocol::encode(batch)?));
    }
    for batch in &from {
        out.push((Direction::FromTaskManager, protocol::encode(batch)?));
    }
    Ok(out)
}

fn task() -> TaskKey {
    TaskKey {
        vertex: VertexId(1),
        subtask: 0,
    }
}

fn barrier() -> CheckpointBarrier {
    CheckpointBarrier {
        id: CheckpointId(4),
        timestamp_ms: 1_700_000_000_000,
        options: CheckpointOptions {
            kind: SnapshotKind::Checkpoint,
            alignment: AlignmentType::Unaligned,
        },
    }
}

fn task_message(message: TaskMessage) -> ToTaskManager {
    ToTaskManager::Task {
        generation: 3,
        task: task(),
        message,
    }
}

fn report(event: TaskEvent) -> FromTaskManager {
    FromTaskManager::Report(TaskReport {
        generation: 3,
        task: task(),
        event,
    })
}

fn keyed_handle() -> KeyedStateHandle {
    KeyedStateHandle {
        key_group_range: KeyGroupRange::new(0, 3),
        header: (0, 60),
        offsets: vec![60, 70, 80, 90],
        end: 100,
        stream: StreamStateHandle::File {
            path: "chk-4/sum-0-keyed".to_string(),
            size: 100,
            digest: weir_core::identity::Digest([0x12; 16]),
        },
    }
}

fn task_state() -> TaskStateSnapshot {
    let mut state = TaskStateSnapshot::default();
    state.operators.insert(
        OperatorId::from_uid("sum"),
        OperatorSubtaskState {
            keyed: vec![keyed_handle()],
            operator: vec![OperatorStateHandle {
                states: vec![("offsets".to_string(), OperatorStateMode::SplitDistribute)],
                stream: StreamStateHandle::Inline(vec![1, 2, 3]),
            }],
            native: Vec::new(),
        },
    );
    state.new_shared = vec!["../shared/sum-0-4".to_string()];
    state
}

fn deploy() -> Deploy {
    let mut in_flight = ChannelSection::new(
        ChannelDirection::Input,
        ChannelInfo {
            from: OperatorId::from_uid("source"),
            to: OperatorId::from_uid("sum"),
            producer: 1,
            consumer: 0,
        },
    );
    // Encoding a batch of plain pairs cannot fail.
    let _ = in_flight.append_batch(&[("a".to_string(), 1i64), ("b".to_string(), 2)]);
    let mut operators = HashMap::new();
    operators.insert(
        OperatorId::from_uid("sum"),
        RestoredOperatorState {
            keyed: vec![RestoredKeyed {
                handle: keyed_handle(),
                header: vec![b'W'; 60],
                sections: KeyedSections::Read(bytes::Bytes::from(vec![0u8; 40])),
                sections_offset: 60,
            }],
            operator: vec![vec![9; 20]],
            native: Vec::new(),
        },
    );
    Deploy {
        generation: 3,
        job_id: JobId::from_name("fuzz"),
        graph_fingerprint: 0x0123_4567_89ab_cdef_0011_2233_4455_6677,
        settings: TaskSettings {
            batch_size: 1024,
            mode: CheckpointingMode::ExactlyOnce,
            snapshot_compression: weir_state::Compression::Lz4,
            incremental: Some(4),
            state_backend: "heap".to_string(),
        },
        storage: Some("/tmp/weir-checkpoints".to_string()),
        chain_epoch: 1,
        placement: vec![
            (
                VertexId(0),
                0,
                "127.0.0.1:6121".parse().expect("an address"),
            ),
            (VertexId(1), 0, "[::1]:6122".parse().expect("an address")),
        ],
        tasks: vec![TaskDeployment {
            task: task(),
            attempt: 2,
            restore: RestoreContext {
                operators,
                checkpoint: Some(CheckpointId(4)),
                in_flight: vec![in_flight],
            },
        }],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_seed_decodes_to_its_messages() {
        let seeds = seeds().unwrap();
        assert_eq!(seeds.len(), 7);
        let counts: Vec<usize> = seeds.iter().map(|(d, b)| decode(*d, b).unwrap()).collect();
        assert_eq!(counts, vec![1, 6, 5, 0, 2, 5, 6]);
        // The other direction's decoder refuses them, or reads something else: never panics.
        for (d, b) in &seeds {
            let other = match d {
                Direction::ToTaskManager => Direction::FromTaskManager,
                Direction::FromTaskManager => Direction::ToTaskManager,
            };
            let _ = decode(other, b);
        }
    }
}
