//! The task protocol: what the job manager and task managers tell each other about a job's
//! subtasks, carried inside the control plane's RPC calls as postcard with a version byte, so that
//! its types stay the runtime's own and a mismatched peer is named rather than misread.

use crate::spec::{TaskDeployment, TaskSettings};
use crate::task::{TaskMessage, TaskReport};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use std::net::SocketAddr;
use weir_checkpoint::coordinator::TaskKey;
use weir_core::ids::{CheckpointId, JobId, SubtaskIndex, VertexId};

/// The version of these messages and of the RPC service's answers; a peer with another one is
/// refused with both numbers. 2: the service's errors are a typed `RpcError`, not text. 3: a
/// deployment's settings name the job's state backend. 4: standing task managers: the job's
/// arguments (`job`), the job's final state at shutdown, past jobs at registration. 5: vertex
/// counts, and the data processed during alignment in an acknowledgement's metrics.
pub(crate) const PROTOCOL_VERSION: u8 = 5;

/// From the job manager to a task manager, delivered in order.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) enum ToTaskManager {
    /// Run these subtasks of a new generation.
    Deploy(Box<Deploy>),
    /// A message for one running subtask.
    Task {
        generation: u64,
        task: TaskKey,
        message: TaskMessage,
    },
    /// Snapshot `id` goes to directory `dir` of the storage at `root` (a savepoint); answered
    /// with [`FromTaskManager::TargetSet`] before any of its barriers is injected.
    SavepointTarget {
        id: CheckpointId,
        root: String,
        dir: String,
    },
    /// Snapshot `id` completed or was aborted.
    ClearTarget(CheckpointId),
    /// Keyed backends start new incremental chains before their next snapshot.
    ChainEpoch(u64),
    /// Stop the subtasks of `generation`: after the job finished (they commit what they held
    /// for the end), or aborted. Answered with [`FromTaskManager::Stopped`] once they and their
    /// uploads have ended.
    Stop { generation: u64, finished: bool },
    /// The job is over (`state`: `FINISHED`, `CANCELED` or `FAILED`): leave, and exit or (a
    /// standing task manager) wait for the next job.
    Shutdown { state: String },
}

/// One generation's subtasks for one task manager.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct Deploy {
    pub generation: u64,
    pub job_id: JobId,
    /// A hash of the job manager's JobGraph: a task manager running another program (or the
    /// same one with other job arguments) refuses the deployment.
    pub graph_fingerprint: u128,
    pub settings: TaskSettings,
    /// Where checkpoints go (a directory path or `s3://bucket/prefix`); `None` when
    /// checkpointing is off.
    pub storage: Option<String>,
    pub chain_epoch: u64,
    /// The data address of the task manager running each subtask of the generation.
    pub placement: Vec<(VertexId, SubtaskIndex, SocketAddr)>,
    pub tasks: Vec<TaskDeployment>,
}

/// From a task manager to the job manager, delivered in order.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) enum FromTaskManager {
    /// A subtask's report.
    Report(TaskReport),
    /// Records its sources emitted in this session (since it registered).
    SourceRecords(u64),
    /// Per vertex, in this session: the records its subtasks here counted, and per subtask
    /// the ns they were back-pressured.
    VertexCounts(crate::job::VertexCounts),
    /// A subtask of `generation` processed its first record.
    FirstRecord { generation: u64 },
    /// Took the target of a savepoint.
    TargetSet(CheckpointId),
    /// What its sinks published for the job's result handles, in their order, after the job
    /// finished.
    Results(Vec<Vec<u8>>),
    /// Every subtask of `generation` here has stopped, and its uploads ended.
    Stopped { generation: u64 },
}

/// Encodes messages for the wire.
pub(crate) fn encode<T: Serialize>(messages: &[T]) -> Result<Vec<u8>, String> {
    let mut out = vec![PROTOCOL_VERSION];
    postcard::to_io(messages, &mut out)
        .map_err(|e| format!("cannot encode a task protocol message: {e}"))?;
    Ok(out)
}

/// Decodes messages from the wire; `from` names the peer in errors.
pub(crate) fn decode<T: DeserializeOwned>(bytes: &[u8], from: &str) -> Result<Vec<T>, String> {
    match bytes.split_first() {
        Some((&PROTOCOL_VERSION, rest)) => postcard::from_bytes(rest)
            .map_err(|e| format!("a corrupt task protocol message from {from}: {e}")),
        Some((v, _)) => Err(format!(
            "{from} speaks task protocol version {v}, this process {PROTOCOL_VERSION}: run the same build everywhere"
        )),
        None => Err(format!("an empty task protocol message from {from}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::TaskError;
    use crate::task::TaskEvent;

    #[test]
    fn messages_round_trip_and_failures_arrive_as_remote_errors() {
        let task = TaskKey {
            vertex: VertexId(2),
            subtask: 1,
        };
        let sent = vec![
            FromTaskManager::Report(TaskReport {
                generation: 3,
                task,
                event: TaskEvent::Failed(TaskError::UpstreamGone(4)),
            }),
            FromTaskManager::SourceRecords(17),
            FromTaskManager::Stopped { generation: 3 },
        ];
        let bytes = encode(&sent).expect("encode");
        let got: Vec<FromTaskManager> = decode(&bytes, "tm-1").expect("decode");
        assert_eq!(got.len(), 3);
        match &got[0] {
            FromTaskManager::Report(TaskReport {
                generation: 3,
                task: t,
                event: TaskEvent::Failed(e),
            }) => {
                assert_eq!(*t, task);
                assert!(e.is_echo(), "an upstream gone stays an echo: {e}");
                assert_eq!(e.to_string(), TaskError::UpstreamGone(4).to_string());
            }
            other => panic!("unexpected {other:?}"),
        }
        assert!(matches!(got[1], FromTaskManager::SourceRecords(17)));
        assert!(matches!(got[2], FromTaskManager::Stopped { generation: 3 }));
    }

    #[test]
    fn acknowledgements_keep_their_state_handles_and_a_lost_task_manager_its_cause() {
        use weir_checkpoint::coordinator::SubtaskCheckpointMetrics;
        use weir_core::handle::{OperatorSubtaskState, StreamStateHandle, TaskStateSnapshot};
        use weir_core::ids::OperatorId;
        let task = TaskKey {
            vertex: VertexId(0),
            subtask: 0,
        };
        let mut state = TaskStateSnapshot::default();
        state.operators.insert(
            OperatorId(7),
            OperatorSubtaskState {
                operator: vec![weir_core::handle::OperatorStateHandle {
                    states: vec![(
                        "offsets".into(),
                        weir_core::handle::OperatorStateMode::Union,
                    )],
                    stream: StreamStateHandle::Inline(vec![1, 2, 3]),
                }],
                keyed: Vec::new(),
                native: Vec::new(),
            },
        );
        let sent = vec![
            FromTaskManager::Report(TaskReport {
                generation: 1,
                task,
                event: TaskEvent::Acknowledge {
                    id: CheckpointId(4),
                    state: state.clone(),
                    metrics: SubtaskCheckpointMetrics {
                        state_size: 3,
                        ..Default::default()
                    },
                },
            }),
            FromTaskManager::Report(TaskReport {
                generation: 1,
                task,
                event: TaskEvent::Failed(TaskError::TaskManagerLost {
                    task_manager: "tm-2".into(),
                    reason: "no heartbeat for 2s".into(),
                }),
            }),
        ];
        let got: Vec<FromTaskManager> =
            decode(&encode(&sent).expect("encode"), "jm").expect("decode");
        match &got[0] {
            FromTaskManager::Report(TaskReport {
                event:
                    TaskEvent::Acknowledge {
                        id,
                        state: s,
                        metrics,
                    },
                ..
            }) => {
                assert_eq!(*id, CheckpointId(4));
                assert_eq!(*s, state);
                assert_eq!(metrics.state_size, 3);
            }
            other => panic!("unexpected {other:?}"),
        }
        match &got[1] {
            FromTaskManager::Report(TaskReport {
                event: TaskEvent::Failed(e),
                ..
            }) => {
                assert!(!e.is_echo());
                assert!(
                    e.to_string().contains("tm-2") && e.to_string().contains("no heartbeat"),
                    "{e}"
                );
            }
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn another_version_or_garbage_is_named() {
        let mut bytes = encode(&[FromTaskManager::SourceRecords(1)]).expect("encode");
        bytes[0] = PROTOCOL_VERSION + 1;
        let err = decode::<FromTaskManager>(&bytes, "tm-7").expect_err("version");
        assert!(err.contains("tm-7") && err.contains("version"), "{err}");
        let err = decode::<FromTaskManager>(&[PROTOCOL_VERSION, 0xff, 0xff, 0xff], "tm-7")
            .expect_err("garbage");
        assert!(err.contains("corrupt") && err.contains("tm-7"), "{err}");
        assert!(decode::<FromTaskManager>(&[], "tm-7").is_err());
    }
}
