//! The `_metadata` target: `CheckpointMetadata::from_bytes` on mutated files of every version
//! still read, then what `weir checkpoints inspect` and a restore compute from what it decoded.

use crate::harness::{Target, hex};
use crate::mutate;
use crate::rng::Rng;
use std::collections::BTreeMap;
use weir_checkpoint::CheckpointMetadata;
use weir_checkpoint::metadata::{METADATA_READ_VERSIONS, OperatorState, SubtaskInFlight};
use weir_core::channel_state::{
    ChannelDirection, ChannelInfo, ChannelSectionSummary, ChannelStateHandle,
};
use weir_core::element::SnapshotKind;
use weir_core::fingerprint::JobFingerprint;
use weir_core::handle::{
    KeyedStateHandle, OperatorStateHandle, OperatorStateMode, OperatorSubtaskState,
    StreamStateHandle,
};
use weir_core::identity::Digest;
use weir_core::ids::{CheckpointId, JobId, OperatorId};
use weir_core::keygroup::KeyGroupRange;

/// `CheckpointMetadata::from_bytes`.
pub struct Metadata;

/// The seed files: the current version of several shapes, and versions 2 and 1.
///
/// Built from constructed values through `CheckpointMetadata::to_bytes`, so a new format
/// version changes the seeds by itself; versions 2 and 1 through `to_legacy_bytes`, with
/// legacy (CRC-32) handles.
pub fn seed_files() -> Vec<Vec<u8>> {
    let values = [
        metadata(SnapshotKind::Checkpoint, Vec::new(), Vec::new()),
        metadata(SnapshotKind::Savepoint, operators(false), Vec::new()),
        metadata(
            SnapshotKind::Checkpoint,
            operators(false),
            vec![in_flight(false)],
        ),
    ];
    let mut files: Vec<Vec<u8>> = values.iter().filter_map(|m| m.to_bytes().ok()).collect();
    let legacy = |in_flight: Vec<SubtaskInFlight>, version: u16| {
        let mut m = metadata(
            SnapshotKind::SynchronousSavepoint,
            operators(true),
            in_flight,
        );
        m.fingerprint = None;
        m.to_legacy_bytes(version).ok()
    };
    files.extend(legacy(vec![in_flight(true)], 2));
    files.extend(legacy(Vec::new(), 1));
    files
}

fn metadata(
    kind: SnapshotKind,
    operators: Vec<OperatorState>,
    in_flight: Vec<SubtaskInFlight>,
) -> CheckpointMetadata {
    CheckpointMetadata {
        job_id: JobId::from_name("fuzz"),
        job_name: "word count".to_string(),
        checkpoint_id: CheckpointId(7),
        kind,
        trigger_timestamp_ms: 1_700_000_000_000,
        completion_timestamp_ms: 1_700_000_000_250,
        weir_version: "0.1.0".to_string(),
        operators,
        in_flight,
        fingerprint: Some(JobFingerprint {
            job_name: "word count".to_string(),
            sources: [("seed".to_string(), "42".to_string())].into(),
            ..JobFingerprint::default()
        }),
        tuning: None,
        format_version: weir_checkpoint::metadata::METADATA_VERSION,
    }
}

/// A file handle as version 3 (digest) or versions 1 and 2 (CRC-32) record it.
fn file(legacy: bool, path: &str, size: u64) -> StreamStateHandle {
    if legacy {
        StreamStateHandle::LegacyFile {
            path: path.to_string(),
            size,
            crc32: 0xdead_beef,
        }
    } else {
        StreamStateHandle::File {
            path: path.to_string(),
            size,
            digest: Digest([0xab; 16]),
        }
    }
}

fn keyed(range: KeyGroupRange, stream: StreamStateHandle) -> KeyedStateHandle {
    let offsets = (0..u64::from(range.len())).map(|i| 60 + 10 * i).collect();
    KeyedStateHandle {
        key_group_range: range,
        header: (0, 60),
        end: 60 + 10 * u64::from(range.len()),
        offsets,
        stream,
    }
}

fn operators(legacy: bool) -> Vec<OperatorState> {
    let mut subtasks = BTreeMap::new();
    subtasks.insert(
        0,
        OperatorSubtaskState {
            keyed: vec![keyed(
                KeyGroupRange::new(0, 3),
                file(legacy, "chk-7/sum-0-keyed", 100),
            )],
            operator: Vec::new(),
            // Native snapshots exist from version 4 on.
            native: if legacy {
                Vec::new()
            } else {
                vec![weir_core::handle::NativeKeyedHandle {
                    key_group_range: KeyGroupRange::new(0, 3),
                    format: "weir-disk-runs/1".to_string(),
                    manifest: file(false, "chk-7/sum-0-manifest", 300),
                    files: vec![weir_core::handle::NativeFileHandle {
                        name: "store.0000000001".to_string(),
                        key_groups: KeyGroupRange::new(0, 3),
                        stream: file(false, "../shared/sum-0-store.0000000001", 4096),
                    }],
                }]
            },
        },
    );
    subtasks.insert(
        1,
        OperatorSubtaskState {
            keyed: vec![keyed(
                KeyGroupRange::new(4, 7),
                StreamStateHandle::Inline(vec![7; 100]),
            )],
            operator: vec![OperatorStateHandle {
                states: vec![
                    ("offsets".to_string(), OperatorStateMode::SplitDistribute),
                    ("splits".to_string(), OperatorStateMode::Union),
                ],
                stream: StreamStateHandle::Inline(vec![1, 2, 3]),
            }],
            native: Vec::new(),
        },
    );
    vec![
        OperatorState {
            operator_id: OperatorId::from_uid("source"),
            uid: Some("source".to_string()),
            name: "Source".to_string(),
            parallelism: 2,
            max_parallelism: 8,
            subtasks: BTreeMap::new(),
            coordinator_state: Some(vec![9, 8, 7]),
        },
        OperatorState {
            operator_id: OperatorId::from_uid("sum"),
            uid: None,
            name: "Sum".to_string(),
            parallelism: 2,
            max_parallelism: 8,
            subtasks,
            coordinator_state: None,
        },
    ]
}

fn in_flight(legacy: bool) -> SubtaskInFlight {
    let channel = ChannelInfo {
        from: OperatorId::from_uid("source"),
        to: OperatorId::from_uid("sum"),
        producer: 0,
        consumer: 1,
    };
    SubtaskInFlight {
        operator_id: OperatorId::from_uid("sum"),
        subtask: 1,
        handle: ChannelStateHandle {
            stream: file(legacy, "chk-7/sum-1-channels", 321),
            sections: vec![ChannelSectionSummary {
                direction: ChannelDirection::Input,
                channel,
                records: 10,
                bytes: 200,
            }],
        },
    }
}

/// What a reader computes from a decoded `_metadata`: sizes (`inspect`), and each keyed
/// handle's byte range for the subtasks of its operator (a restore).
pub fn use_metadata(m: &CheckpointMetadata) {
    let _ = (m.state_size(), m.in_flight_size());
    for op in &m.operators {
        let _ = op.state_size();
        // A restore computes the ranges from the job's own settings; any will do here.
        let parallelism = op.parallelism.clamp(1, 8);
        let max_parallelism = op.max_parallelism.clamp(1, 1 << 15);
        for handle in op.subtasks.values().flat_map(|s| &s.keyed) {
            for i in 0..parallelism {
                let range = weir_core::keygroup::compute_key_group_range_for_operator_index(
                    max_parallelism,
                    parallelism,
                    i,
                );
                let _ = handle.byte_range_for(&range);
            }
            let _ = handle.offset_of(handle.key_group_range.start);
        }
    }
}

impl Target for Metadata {
    type Input = Vec<u8>;

    fn name(&self) -> &'static str {
        "metadata"
    }

    fn seeds(&self) -> Vec<Vec<u8>> {
        seed_files()
    }

    fn mutate(&self, input: &mut Vec<u8>, corpus: &[Vec<u8>], rng: &mut Rng) {
        let donors: Vec<&[u8]> = corpus.iter().map(Vec::as_slice).collect();
        mutate::enveloped(rng, input, &donors, &METADATA_READ_VERSIONS);
    }

    fn run(&self, input: &Vec<u8>) -> Result<(), String> {
        let m =
            CheckpointMetadata::from_bytes("chk-7/_metadata", input).map_err(|e| e.to_string())?;
        use_metadata(&m);
        Ok(())
    }

    fn describe(&self, input: &Vec<u8>) -> String {
        hex(input)
    }
}
