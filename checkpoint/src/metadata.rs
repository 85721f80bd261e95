//! The `_metadata` file: what a complete checkpoint or savepoint contains, versioned and
//! checksummed (magic `WCKM`, format version 1), enough to explain itself to `weir checkpoints
//! inspect` and to restore every operator by its id.

use crate::CheckpointError;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use weir_core::CoreError;
use weir_core::element::SnapshotKind;
use weir_core::handle::OperatorSubtaskState;
use weir_core::ids::{CheckpointId, JobId, OperatorId, SubtaskIndex};

/// Magic bytes of a `_metadata` file.
pub const METADATA_MAGIC: [u8; 4] = *b"WCKM";
/// The format version this build writes.
pub const METADATA_VERSION: u16 = 1;

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
        self.subtasks.values().map(|s| s.state_size()).sum()
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
}

impl CheckpointMetadata {
    /// Total bytes referenced by all operators.
    pub fn state_size(&self) -> u64 {
        self.operators.iter().map(|o| o.state_size()).sum()
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
        let (_, payload) = weir_core::codec::open(path, METADATA_MAGIC, &[METADATA_VERSION], bytes)
            .map_err(corrupt)?;
        weir_core::codec::decode(path, payload).map_err(corrupt)
    }
}
