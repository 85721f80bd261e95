//! The `_metadata` file: what a complete checkpoint or savepoint contains, versioned and
//! checksummed (magic `WCKM`, format version 4; versions 1 to 3 still read), enough to explain
//! itself to `weir checkpoints inspect` and to restore every operator by its id.
//!
//! Version 3 records the job's fingerprint, an xxh3-128 digest per state file, and means every
//! state file it references begins with an identity frame (`weir_core::identity`). Version 4
//! adds each subtask's native keyed snapshots (`OperatorSubtaskState::native`). A reader
//! refuses a file over [`MAX_METADATA_SIZE`] without reading it.

use crate::CheckpointError;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use weir_core::CoreError;
use weir_core::channel_state::ChannelStateHandle;
use weir_core::element::SnapshotKind;
use weir_core::fingerprint::JobFingerprint;
use weir_core::handle::{OperatorSubtaskState, StreamStateHandle, saturating_sum};
use weir_core::ids::{CheckpointId, JobId, OperatorId, SubtaskIndex};

/// Magic bytes of a `_metadata` file.
pub const METADATA_MAGIC: [u8; 4] = *b"WCKM";
/// The format version this build writes.
pub const METADATA_VERSION: u16 = 5;
/// Every format version this build reads. Version 1 had no in-flight data; versions 1 and 2
/// have no fingerprint, CRC-32s instead of digests, and state files without identity frames;
/// versions 1 to 3 have no native keyed snapshots.
pub const METADATA_READ_VERSIONS: [u16; 5] = [1, 2, 3, 4, 5];
/// The largest `_metadata` a reader accepts: 256 MiB. Handles are small (inline state is at
/// most 20 KiB per handle), so a larger file is damage or not Weir's, refused before it is read.
pub const MAX_METADATA_SIZE: u64 = 256 << 20;

/// The state of one operator over all its subtasks.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OperatorState {
    /// The operator's stable id.
    pub operator_id: OperatorId,
    /// The operator's `uid`, when the user set one.
    pub uid: Option<String>,
    /// Its display name.
    pub name: String,
    /// Its parallelism when the checkpoint was taken.
    pub parallelism: u32,
    /// Its max parallelism (number of key groups).
    pub max_parallelism: u32,
    /// The state of each subtask that had any.
    pub subtasks: BTreeMap<SubtaskIndex, OperatorSubtaskState>,
    /// The operator coordinator's state (a source's split enumerator: the splits not yet
    /// assigned), taken before the checkpoint's barriers were injected.
    pub coordinator_state: Option<Vec<u8>>,
}

impl OperatorState {
    /// Total bytes referenced.
    pub fn state_size(&self) -> u64 {
        saturating_sum(self.subtasks.values().map(|s| s.state_size()))
    }
}

/// The content of `_metadata`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckpointMetadata {
    /// The job.
    pub job_id: JobId,
    /// The job's name.
    pub job_name: String,
    /// The checkpoint's id.
    pub checkpoint_id: CheckpointId,
    /// Checkpoint or savepoint.
    pub kind: SnapshotKind,
    /// When it was triggered (ms since the Unix epoch).
    pub trigger_timestamp_ms: u64,
    /// When it completed (ms since the Unix epoch).
    pub completion_timestamp_ms: u64,
    /// The Weir version that wrote it.
    pub weir_version: String,
    /// Every operator of the job, with or without state.
    pub operators: Vec<OperatorState>,
    /// The in-flight data of unaligned checkpoints, per subtask (since version 2).
    pub in_flight: Vec<SubtaskInFlight>,
    /// The job's fingerprint (since version 3; `None` when read from an older file).
    pub fingerprint: Option<JobFingerprint>,
    /// The job's live tuning of its checkpointing when this checkpoint was triggered, which a
    /// run restored from it applies again (since version 5; `None`: none, or an older file).
    pub tuning: Option<weir_core::config::CheckpointTuning>,
    /// The format version the file was read from ([`METADATA_VERSION`] for one built in
    /// memory). Not part of the payload: the envelope carries it.
    #[serde(skip)]
    pub format_version: u16,
}

impl CheckpointMetadata {
    /// Whether the state files this `_metadata` references begin with identity frames: every
    /// file written since version 3.
    pub fn has_identity_frames(&self) -> bool {
        self.format_version >= 3
    }
}

/// One subtask's persisted in-flight data, filed under the first operator of its chain.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SubtaskInFlight {
    /// The chain's head operator.
    pub operator_id: OperatorId,
    /// The subtask.
    pub subtask: SubtaskIndex,
    /// Its channel state.
    pub handle: ChannelStateHandle,
}

/// Version 1 of the payload: the same, without in-flight data.
#[derive(Deserialize)]
struct CheckpointMetadataV1 {
    job_id: JobId,
    job_name: String,
    checkpoint_id: CheckpointId,
    kind: SnapshotKind,
    trigger_timestamp_ms: u64,
    completion_timestamp_ms: u64,
    weir_version: String,
    operators: Vec<OperatorStateV3>,
}

impl From<CheckpointMetadataV1> for CheckpointMetadata {
    fn from(v: CheckpointMetadataV1) -> Self {
        CheckpointMetadata {
            job_id: v.job_id,
            job_name: v.job_name,
            checkpoint_id: v.checkpoint_id,
            kind: v.kind,
            trigger_timestamp_ms: v.trigger_timestamp_ms,
            completion_timestamp_ms: v.completion_timestamp_ms,
            weir_version: v.weir_version,
            operators: v.operators.into_iter().map(Into::into).collect(),
            in_flight: Vec::new(),
            fingerprint: None,
            tuning: None,
            format_version: 1,
        }
    }
}

/// Version 2 of the payload: version 3 without the fingerprint.
#[derive(Deserialize)]
struct CheckpointMetadataV2 {
    job_id: JobId,
    job_name: String,
    checkpoint_id: CheckpointId,
    kind: SnapshotKind,
    trigger_timestamp_ms: u64,
    completion_timestamp_ms: u64,
    weir_version: String,
    operators: Vec<OperatorStateV3>,
    in_flight: Vec<SubtaskInFlight>,
}

impl From<CheckpointMetadataV2> for CheckpointMetadata {
    fn from(v: CheckpointMetadataV2) -> Self {
        CheckpointMetadata {
            job_id: v.job_id,
            job_name: v.job_name,
            checkpoint_id: v.checkpoint_id,
            kind: v.kind,
            trigger_timestamp_ms: v.trigger_timestamp_ms,
            completion_timestamp_ms: v.completion_timestamp_ms,
            weir_version: v.weir_version,
            operators: v.operators.into_iter().map(Into::into).collect(),
            in_flight: v.in_flight,
            fingerprint: None,
            tuning: None,
            format_version: 2,
        }
    }
}

/// Version 3 of the payload: version 4 without native keyed snapshots.
#[derive(Deserialize)]
struct CheckpointMetadataV3 {
    job_id: JobId,
    job_name: String,
    checkpoint_id: CheckpointId,
    kind: SnapshotKind,
    trigger_timestamp_ms: u64,
    completion_timestamp_ms: u64,
    weir_version: String,
    operators: Vec<OperatorStateV3>,
    in_flight: Vec<SubtaskInFlight>,
    fingerprint: Option<JobFingerprint>,
}

impl From<CheckpointMetadataV3> for CheckpointMetadata {
    fn from(v: CheckpointMetadataV3) -> Self {
        CheckpointMetadata {
            job_id: v.job_id,
            job_name: v.job_name,
            checkpoint_id: v.checkpoint_id,
            kind: v.kind,
            trigger_timestamp_ms: v.trigger_timestamp_ms,
            completion_timestamp_ms: v.completion_timestamp_ms,
            weir_version: v.weir_version,
            operators: v.operators.into_iter().map(Into::into).collect(),
            in_flight: v.in_flight,
            fingerprint: v.fingerprint,
            tuning: None,
            format_version: 3,
        }
    }
}

/// Version 4 of the payload: version 5 without the tuning.
#[derive(Deserialize)]
struct CheckpointMetadataV4 {
    job_id: JobId,
    job_name: String,
    checkpoint_id: CheckpointId,
    kind: SnapshotKind,
    trigger_timestamp_ms: u64,
    completion_timestamp_ms: u64,
    weir_version: String,
    operators: Vec<OperatorState>,
    in_flight: Vec<SubtaskInFlight>,
    fingerprint: Option<JobFingerprint>,
}

impl From<CheckpointMetadataV4> for CheckpointMetadata {
    fn from(v: CheckpointMetadataV4) -> Self {
        CheckpointMetadata {
            job_id: v.job_id,
            job_name: v.job_name,
            checkpoint_id: v.checkpoint_id,
            kind: v.kind,
            trigger_timestamp_ms: v.trigger_timestamp_ms,
            completion_timestamp_ms: v.completion_timestamp_ms,
            weir_version: v.weir_version,
            operators: v.operators,
            in_flight: v.in_flight,
            fingerprint: v.fingerprint,
            tuning: None,
            format_version: 4,
        }
    }
}

/// An operator's state as versions 1 to 3 record it: subtasks without native snapshots.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct OperatorStateV3 {
    operator_id: OperatorId,
    uid: Option<String>,
    name: String,
    parallelism: u32,
    max_parallelism: u32,
    subtasks: BTreeMap<SubtaskIndex, OperatorSubtaskStateV3>,
    coordinator_state: Option<Vec<u8>>,
}

/// A subtask's state as versions 1 to 3 record it.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct OperatorSubtaskStateV3 {
    keyed: Vec<weir_core::handle::KeyedStateHandle>,
    operator: Vec<weir_core::handle::OperatorStateHandle>,
}

impl From<OperatorStateV3> for OperatorState {
    fn from(v: OperatorStateV3) -> Self {
        OperatorState {
            operator_id: v.operator_id,
            uid: v.uid,
            name: v.name,
            parallelism: v.parallelism,
            max_parallelism: v.max_parallelism,
            subtasks: v
                .subtasks
                .into_iter()
                .map(|(i, s)| {
                    let state = OperatorSubtaskState {
                        keyed: s.keyed,
                        operator: s.operator,
                        native: Vec::new(),
                    };
                    (i, state)
                })
                .collect(),
            coordinator_state: v.coordinator_state,
        }
    }
}

impl From<&OperatorState> for OperatorStateV3 {
    /// What an older build wrote (native snapshots left out): for tests of old files.
    fn from(v: &OperatorState) -> Self {
        OperatorStateV3 {
            operator_id: v.operator_id,
            uid: v.uid.clone(),
            name: v.name.clone(),
            parallelism: v.parallelism,
            max_parallelism: v.max_parallelism,
            subtasks: v
                .subtasks
                .iter()
                .map(|(i, s)| {
                    let state = OperatorSubtaskStateV3 {
                        keyed: s.keyed.clone(),
                        operator: s.operator.clone(),
                    };
                    (*i, state)
                })
                .collect(),
            coordinator_state: v.coordinator_state.clone(),
        }
    }
}

impl CheckpointMetadata {
    /// Total bytes referenced by all operators (saturating: a damaged file's sizes must not
    /// overflow).
    pub fn state_size(&self) -> u64 {
        saturating_sum(self.operators.iter().map(|o| o.state_size()))
            .saturating_add(self.in_flight_size())
    }

    /// Bytes of persisted in-flight data.
    pub fn in_flight_size(&self) -> u64 {
        saturating_sum(self.in_flight.iter().map(|s| s.handle.size()))
    }

    /// Encodes the file: an envelope around the postcard payload.
    pub fn to_bytes(&self) -> Result<Vec<u8>, CheckpointError> {
        let payload = weir_core::codec::encode("checkpoint metadata", self)?;
        Ok(weir_core::codec::seal(
            METADATA_MAGIC,
            METADATA_VERSION,
            &payload,
        ))
    }

    /// The file a build of format `version` (1 to 4) would have written for this checkpoint,
    /// native snapshots left out (they did not exist), and a fingerprint only from version 3:
    /// for tests and fuzzing of old files.
    pub fn to_legacy_bytes(&self, version: u16) -> Result<Vec<u8>, CheckpointError> {
        #[derive(Serialize)]
        struct V1 {
            job_id: JobId,
            job_name: String,
            checkpoint_id: CheckpointId,
            kind: SnapshotKind,
            trigger_timestamp_ms: u64,
            completion_timestamp_ms: u64,
            weir_version: String,
            operators: Vec<OperatorStateV3>,
        }
        #[derive(Serialize)]
        struct V2 {
            v1: V1,
            in_flight: Vec<SubtaskInFlight>,
        }
        #[derive(Serialize)]
        struct V3 {
            v2: V2,
            fingerprint: Option<JobFingerprint>,
        }
        let v1 = V1 {
            job_id: self.job_id,
            job_name: self.job_name.clone(),
            checkpoint_id: self.checkpoint_id,
            kind: self.kind,
            trigger_timestamp_ms: self.trigger_timestamp_ms,
            completion_timestamp_ms: self.completion_timestamp_ms,
            weir_version: self.weir_version.clone(),
            operators: self.operators.iter().map(Into::into).collect(),
        };
        let v2 = V2 {
            v1,
            in_flight: self.in_flight.clone(),
        };
        let payload = match version {
            1 => weir_core::codec::encode("checkpoint metadata", &v2.v1)?,
            2 => weir_core::codec::encode("checkpoint metadata", &v2)?,
            3 => weir_core::codec::encode(
                "checkpoint metadata",
                &V3 {
                    v2,
                    fingerprint: self.fingerprint.clone(),
                },
            )?,
            4 => {
                // Version 4 is version 5 without the tuning.
                #[derive(Serialize)]
                struct V4<'a> {
                    job_id: JobId,
                    job_name: &'a str,
                    checkpoint_id: CheckpointId,
                    kind: SnapshotKind,
                    trigger_timestamp_ms: u64,
                    completion_timestamp_ms: u64,
                    weir_version: &'a str,
                    operators: &'a [OperatorState],
                    in_flight: &'a [SubtaskInFlight],
                    fingerprint: &'a Option<JobFingerprint>,
                }
                weir_core::codec::encode(
                    "checkpoint metadata",
                    &V4 {
                        job_id: self.job_id,
                        job_name: &self.job_name,
                        checkpoint_id: self.checkpoint_id,
                        kind: self.kind,
                        trigger_timestamp_ms: self.trigger_timestamp_ms,
                        completion_timestamp_ms: self.completion_timestamp_ms,
                        weir_version: &self.weir_version,
                        operators: &self.operators,
                        in_flight: &self.in_flight,
                        fingerprint: &self.fingerprint,
                    },
                )?
            }
            other => {
                return Err(CheckpointError::Corrupt {
                    path: "_metadata".to_string(),
                    reason: format!("format version {other} is not a legacy version"),
                });
            }
        };
        Ok(weir_core::codec::seal(METADATA_MAGIC, version, &payload))
    }

    /// Decodes and checks the file; `path` names it in errors.
    pub fn from_bytes(path: &str, bytes: &[u8]) -> Result<CheckpointMetadata, CheckpointError> {
        // The error names the file once; the reason says only what check failed.
        let corrupt = |e: CoreError| CheckpointError::Corrupt {
            path: path.to_string(),
            reason: match e {
                CoreError::Corrupt { reason, .. } | CoreError::Decode { reason, .. } => reason,
                other => other.to_string(),
            },
        };
        let (version, payload) =
            weir_core::codec::open(path, METADATA_MAGIC, &METADATA_READ_VERSIONS, bytes)
                .map_err(corrupt)?;
        let metadata: CheckpointMetadata = match version {
            1 => weir_core::codec::decode::<CheckpointMetadataV1>(path, payload)
                .map_err(corrupt)?
                .into(),
            2 => weir_core::codec::decode::<CheckpointMetadataV2>(path, payload)
                .map_err(corrupt)?
                .into(),
            3 => weir_core::codec::decode::<CheckpointMetadataV3>(path, payload)
                .map_err(corrupt)?
                .into(),
            4 => weir_core::codec::decode::<CheckpointMetadataV4>(path, payload)
                .map_err(corrupt)?
                .into(),
            _ => CheckpointMetadata {
                format_version: version,
                ..weir_core::codec::decode(path, payload).map_err(corrupt)?
            },
        };
        // Version 3 records digests: a legacy handle in it is damage.
        if version >= 3
            && let Some(h) = metadata.handles().find(|h| h.is_legacy())
        {
            return Err(CheckpointError::Corrupt {
                path: path.to_string(),
                reason: format!(
                    "a version {version} file records a handle without a digest: {}",
                    h.path().unwrap_or("<inline>")
                ),
            });
        }
        Ok(metadata)
    }

    /// Checks the file against where it lies: a `chk-<n>` directory must hold checkpoint `n`,
    /// and one under a job directory `<job-id>/` a checkpoint of that job. A `_metadata`
    /// copied in from another checkpoint or job is refused here.
    pub fn check_location(&self, location: &crate::CheckpointLocation) -> Result<(), String> {
        if let Some(id) = location.checkpoint_id()
            && id != self.checkpoint_id
        {
            return Err(format!(
                "it records checkpoint {}, but its directory is chk-{}",
                self.checkpoint_id.0, id.0
            ));
        }
        if let Some(job) = location.job_id()
            && job != self.job_id
        {
            return Err(format!(
                "it records job {}, but it lies in the directory of job {job}",
                self.job_id
            ));
        }
        Ok(())
    }

    /// Every stream handle the file records: keyed, operator and channel state.
    pub fn handles(&self) -> impl Iterator<Item = &StreamStateHandle> {
        self.operators
            .iter()
            .flat_map(|o| o.subtasks.values())
            .flat_map(|s| s.streams())
            .chain(self.in_flight.iter().map(|f| &f.handle.stream))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use weir_core::channel_state::{
        ChannelDirection, ChannelInfo, ChannelSectionSummary, ChannelStateHandle,
    };
    use weir_core::handle::{
        KeyedStateHandle, OperatorStateHandle, OperatorStateMode, StreamStateHandle,
    };
    use weir_core::keygroup::KeyGroupRange;

    /// Version 1 of the payload as a v1 build wrote it: the v1 fields, in their order.
    #[derive(Serialize)]
    struct WrittenV1 {
        job_id: JobId,
        job_name: String,
        checkpoint_id: CheckpointId,
        kind: SnapshotKind,
        trigger_timestamp_ms: u64,
        completion_timestamp_ms: u64,
        weir_version: String,
        operators: Vec<OperatorStateV3>,
    }

    /// A file handle as the given version records it.
    fn file(version: u16, path: &str, size: u64) -> StreamStateHandle {
        if version >= 3 {
            StreamStateHandle::File {
                path: path.to_string(),
                size,
                digest: weir_core::identity::Digest([0xab; 16]),
            }
        } else {
            StreamStateHandle::LegacyFile {
                path: path.to_string(),
                size,
                crc32: 0xdead_beef,
            }
        }
    }

    fn operators(version: u16) -> Vec<OperatorState> {
        let mut subtasks = BTreeMap::new();
        subtasks.insert(
            1,
            OperatorSubtaskState {
                keyed: vec![KeyedStateHandle {
                    key_group_range: KeyGroupRange::new(4, 7),
                    header: (0, 12),
                    offsets: vec![12, 40, 40, 77],
                    end: 90,
                    stream: file(version, "chk-7/sum-1-keyed", 90),
                }],
                operator: vec![OperatorStateHandle {
                    states: vec![("offsets".to_string(), OperatorStateMode::Union)],
                    stream: StreamStateHandle::Inline(vec![1, 2, 3]),
                }],
                native: Vec::new(),
            },
        );
        vec![
            OperatorState {
                operator_id: OperatorId::from_uid("sum"),
                uid: Some("sum".to_string()),
                name: "Sum".to_string(),
                parallelism: 2,
                max_parallelism: 8,
                subtasks,
                coordinator_state: Some(vec![9, 8]),
            },
            OperatorState {
                operator_id: OperatorId::from_uid("sink"),
                uid: None,
                name: "Sink".to_string(),
                parallelism: 2,
                max_parallelism: 8,
                subtasks: BTreeMap::new(),
                coordinator_state: None,
            },
        ]
    }

    fn metadata(version: u16, in_flight: Vec<SubtaskInFlight>) -> CheckpointMetadata {
        CheckpointMetadata {
            job_id: JobId::from_name("metadata-test"),
            job_name: "metadata-test".to_string(),
            checkpoint_id: CheckpointId(7),
            kind: SnapshotKind::Savepoint,
            trigger_timestamp_ms: 1_700_000_000_000,
            completion_timestamp_ms: 1_700_000_000_250,
            weir_version: "0.1.0".to_string(),
            operators: operators(version),
            in_flight,
            fingerprint: (version >= 3).then(|| JobFingerprint {
                job_name: "metadata-test".to_string(),
                sources: [("seed".to_string(), "42".to_string())].into(),
                ..JobFingerprint::default()
            }),
            tuning: (version >= 5).then(|| weir_core::config::CheckpointTuning {
                interval: Some(std::time::Duration::from_millis(250)),
                ..Default::default()
            }),
            format_version: version,
        }
    }

    fn in_flight(version: u16) -> SubtaskInFlight {
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
                stream: file(version, "chk-7/sum-1-channels", 321),
                sections: vec![
                    ChannelSectionSummary {
                        direction: ChannelDirection::Input,
                        channel,
                        records: 10,
                        bytes: 200,
                    },
                    ChannelSectionSummary {
                        direction: ChannelDirection::Output,
                        channel: ChannelInfo {
                            from: OperatorId::from_uid("sum"),
                            to: OperatorId::from_uid("sink"),
                            producer: 1,
                            consumer: 0,
                        },
                        records: 3,
                        bytes: 101,
                    },
                ],
            },
        }
    }

    fn sealed_v1(m: &CheckpointMetadata) -> Vec<u8> {
        let v1 = WrittenV1 {
            job_id: m.job_id,
            job_name: m.job_name.clone(),
            checkpoint_id: m.checkpoint_id,
            kind: m.kind,
            trigger_timestamp_ms: m.trigger_timestamp_ms,
            completion_timestamp_ms: m.completion_timestamp_ms,
            weir_version: m.weir_version.clone(),
            operators: m.operators.iter().map(Into::into).collect(),
        };
        let payload = weir_core::codec::encode("v1 metadata", &v1).unwrap();
        weir_core::codec::seal(METADATA_MAGIC, 1, &payload)
    }

    /// Version 2 of the payload as a v2 build wrote it.
    #[derive(Serialize)]
    struct WrittenV2 {
        job_id: JobId,
        job_name: String,
        checkpoint_id: CheckpointId,
        kind: SnapshotKind,
        trigger_timestamp_ms: u64,
        completion_timestamp_ms: u64,
        weir_version: String,
        operators: Vec<OperatorStateV3>,
        in_flight: Vec<SubtaskInFlight>,
    }

    /// Version 3 of the payload as a v3 build wrote it.
    #[derive(Serialize)]
    struct WrittenV3 {
        v2: WrittenV2,
        fingerprint: Option<JobFingerprint>,
    }

    fn written_v2(m: &CheckpointMetadata) -> WrittenV2 {
        WrittenV2 {
            job_id: m.job_id,
            job_name: m.job_name.clone(),
            checkpoint_id: m.checkpoint_id,
            kind: m.kind,
            trigger_timestamp_ms: m.trigger_timestamp_ms,
            completion_timestamp_ms: m.completion_timestamp_ms,
            weir_version: m.weir_version.clone(),
            operators: m.operators.iter().map(Into::into).collect(),
            in_flight: m.in_flight.clone(),
        }
    }

    fn sealed_v3(m: &CheckpointMetadata) -> Vec<u8> {
        let v3 = WrittenV3 {
            v2: written_v2(m),
            fingerprint: m.fingerprint.clone(),
        };
        let payload = weir_core::codec::encode("v3 metadata", &v3).unwrap();
        weir_core::codec::seal(METADATA_MAGIC, 3, &payload)
    }

    fn sealed_v2(m: &CheckpointMetadata) -> Vec<u8> {
        let v2 = written_v2(m);
        let payload = weir_core::codec::encode("v2 metadata", &v2).unwrap();
        weir_core::codec::seal(METADATA_MAGIC, 2, &payload)
    }

    #[test]
    fn version_3_reads_without_native_snapshots() {
        let m = metadata(3, vec![in_flight(3)]);
        let back = CheckpointMetadata::from_bytes("chk-7/_metadata", &sealed_v3(&m)).unwrap();
        assert_eq!(back, m, "a v3 file must decode to what was written");
        assert_eq!(back.format_version, 3);
        assert!(back.has_identity_frames());
    }

    #[test]
    fn version_5_round_trips_with_in_flight_data_fingerprint_native_snapshots_and_tuning() {
        let mut m = metadata(5, vec![in_flight(5)]);
        let subtask = m.operators[0].subtasks.get_mut(&1).unwrap();
        subtask.native.push(weir_core::handle::NativeKeyedHandle {
            key_group_range: KeyGroupRange::new(4, 7),
            format: "weir-disk-runs/1".to_string(),
            manifest: file(4, "chk-7/sum-1-manifest", 40),
            files: vec![weir_core::handle::NativeFileHandle {
                name: "store.0000000003".to_string(),
                key_groups: KeyGroupRange::new(4, 7),
                stream: file(4, "../shared/sum-1-store.0000000003", 1000),
            }],
        });
        let bytes = m.to_bytes().unwrap();
        assert_eq!(
            u16::from_le_bytes([bytes[4], bytes[5]]),
            METADATA_VERSION,
            "the envelope must carry the version this build writes"
        );
        assert_eq!(METADATA_VERSION, 5);
        let back = CheckpointMetadata::from_bytes("chk-7/_metadata", &bytes).unwrap();
        assert_eq!(back, m, "a v5 file must decode to what was written");
        assert!(back.tuning.is_some());
        // The same checkpoint as version 4 wrote it: everything but the tuning.
        let v4 = CheckpointMetadata::from_bytes("chk-7/_metadata", &m.to_legacy_bytes(4).unwrap())
            .unwrap();
        assert_eq!(v4.format_version, 4);
        assert_eq!(v4.tuning, None);
        assert_eq!(v4.operators, m.operators);
        assert_eq!(v4.fingerprint, m.fingerprint);
        assert!(back.has_identity_frames());
        assert_eq!(back.in_flight_size(), 321);
        assert_eq!(
            back.state_size(),
            90 + 3 + 321 + 40 + 1000,
            "the state size counts operator state, native files and in-flight data"
        );
        assert_eq!(back.handles().count(), 5);
    }

    #[test]
    fn version_1_files_read_without_in_flight_data() {
        let m = metadata(1, Vec::new());
        let back = CheckpointMetadata::from_bytes("chk-7/_metadata", &sealed_v1(&m))
            .expect("a version 1 file must still be read");
        assert!(back.in_flight.is_empty(), "v1 had no in-flight data");
        assert_eq!(back, m, "every v1 field must be read as written");
        assert!(!back.has_identity_frames());
    }

    #[test]
    fn version_2_files_read_with_legacy_handles() {
        let m = metadata(2, vec![in_flight(2)]);
        let back = CheckpointMetadata::from_bytes("chk-7/_metadata", &sealed_v2(&m))
            .expect("a version 2 file must still be read");
        assert_eq!(back, m, "every v2 field must be read as written");
        assert!(
            back.handles()
                .filter(|h| h.path().is_some())
                .all(|h| h.is_legacy())
        );
        assert!(back.fingerprint.is_none() && !back.has_identity_frames());
    }

    #[test]
    fn a_version_3_file_with_a_legacy_handle_is_refused() {
        let mut m = metadata(3, vec![in_flight(2)]);
        m.format_version = 3;
        let err = CheckpointMetadata::from_bytes("chk-7/_metadata", &m.to_bytes().unwrap())
            .unwrap_err()
            .to_string();
        assert!(err.contains("without a digest"), "{err}");
    }

    #[test]
    fn payload_must_match_the_envelope_version() {
        // A v2 payload labelled v1 leaves the in-flight list unread; a v1 payload labelled v2
        // ends before it. Either is corrupt, never silently misread.
        let v2_payload =
            weir_core::codec::encode("metadata", &metadata(3, vec![in_flight(3)])).unwrap();
        let err = CheckpointMetadata::from_bytes(
            "chk-7/_metadata",
            &weir_core::codec::seal(METADATA_MAGIC, 1, &v2_payload),
        )
        .unwrap_err();
        assert!(
            matches!(&err, CheckpointError::Corrupt { path, .. } if path == "chk-7/_metadata"),
            "{err}"
        );
        let mut v1_as_v2 = sealed_v1(&metadata(1, Vec::new()));
        v1_as_v2[4..6].copy_from_slice(&2u16.to_le_bytes());
        let body_end = v1_as_v2.len() - weir_core::codec::ENVELOPE_TRAILER_LEN;
        let crc = crc32fast::hash(&v1_as_v2[..body_end]);
        v1_as_v2[body_end..].copy_from_slice(&crc.to_le_bytes());
        let err = CheckpointMetadata::from_bytes("chk-7/_metadata", &v1_as_v2).unwrap_err();
        assert!(
            matches!(&err, CheckpointError::Corrupt { path, .. } if path == "chk-7/_metadata"),
            "{err}"
        );
    }

    #[test]
    fn sizes_of_a_damaged_file_saturate() {
        // The overflow `weir-fuzz` found in `TaskStateSnapshot::state_size`, here: a file whose
        // recorded sizes add up past u64::MAX decoded, and then `state_size` (what `weir
        // checkpoints inspect` shows) overflowed.
        let mut m = metadata(3, vec![in_flight(3), in_flight(3)]);
        for f in &mut m.in_flight {
            f.handle.stream = StreamStateHandle::File {
                path: "chk-7/x".to_string(),
                size: u64::MAX - 1,
                digest: weir_core::identity::Digest([0; 16]),
            };
        }
        let back =
            CheckpointMetadata::from_bytes("chk-7/_metadata", &m.to_bytes().unwrap()).unwrap();
        assert_eq!(back.in_flight_size(), u64::MAX);
        assert_eq!(back.state_size(), u64::MAX);
        assert_eq!(
            back.operators[0].state_size(),
            93,
            "ordinary sizes add up exactly"
        );
    }

    #[test]
    fn unknown_versions_are_rejected_naming_the_file() {
        let payload =
            weir_core::codec::encode("metadata", &metadata(5, vec![in_flight(5)])).unwrap();
        let bytes = weir_core::codec::seal(METADATA_MAGIC, 6, &payload);
        let err = CheckpointMetadata::from_bytes("jobs/abc/chk-7/_metadata", &bytes).unwrap_err();
        match &err {
            CheckpointError::Corrupt { path, reason } => {
                assert_eq!(path, "jobs/abc/chk-7/_metadata");
                assert!(reason.contains("format version 6"), "{reason}");
            }
            other => panic!("expected a corrupt-file error, got {other:?}"),
        }
        let shown = err.to_string();
        assert!(
            shown.contains("jobs/abc/chk-7/_metadata") && shown.contains("version 6"),
            "the error must name the file and the version: {shown}"
        );
    }
}
