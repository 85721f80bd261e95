//! The serializable reports of `weir checkpoints list | inspect | verify`: what each command
//! found, printed as JSON with `--json` or rendered as text by `render.rs`.

use serde::Serialize;
use weir_core::keygroup::KeyGroupRange;

/// A checkpoint's status in a listing.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum ListStatus {
    /// `_metadata` is present and passes its checks.
    Completed,
    /// No `_metadata`: the checkpoint was never completed (or is being written).
    Incomplete,
    /// `_metadata` fails its checks.
    Corrupt,
    /// `_metadata` could not be read (a storage error other than corruption).
    Unreadable,
}

impl ListStatus {
    /// The status as printed.
    pub fn as_str(self) -> &'static str {
        match self {
            ListStatus::Completed => "COMPLETED",
            ListStatus::Incomplete => "INCOMPLETE",
            ListStatus::Corrupt => "CORRUPT",
            ListStatus::Unreadable => "UNREADABLE",
        }
    }
}

/// One checkpoint in a listing.
#[derive(Clone, Debug, Serialize)]
pub struct ListEntry {
    /// Its status.
    pub status: ListStatus,
    /// Its id (from `chk-<n>`, or from `_metadata` for a directory named otherwise).
    pub id: Option<u64>,
    /// Its directory.
    pub path: String,
    /// The job's name (from `_metadata`).
    pub job_name: Option<String>,
    /// The job's id (from `_metadata`, or from the job directory's name).
    pub job_id: Option<String>,
    /// When it completed, UTC, ISO-8601.
    pub completed_at: Option<String>,
    /// When it completed, in ms since the Unix epoch.
    pub completion_timestamp_ms: Option<u64>,
    /// `checkpoint`, `savepoint` or `synchronous savepoint`.
    pub kind: Option<String>,
    /// Total bytes of state it references, in-flight data included.
    pub state_size: Option<u64>,
    /// Bytes of in-flight data (channel state) it references.
    pub in_flight_size: Option<u64>,
    /// Whether it is an unaligned checkpoint that persisted in-flight data.
    pub unaligned: Option<bool>,
    /// Why it is corrupt or unreadable.
    pub reason: Option<String>,
}

/// A problem found by verification.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Problem {
    /// The file concerned (`_metadata` for inline state and for the metadata itself).
    pub file: String,
    /// What check failed.
    pub reason: String,
}

/// The result of verifying one stream of state.
#[derive(Clone, Debug, Serialize)]
pub struct Verification {
    /// Whether every check passed.
    pub ok: bool,
    /// What was checked, or what failed.
    pub detail: String,
}

/// Where a stream of state is.
#[derive(Clone, Debug, Serialize)]
pub struct StreamReport {
    /// Whether it is inlined in `_metadata`.
    pub inline: bool,
    /// The file, when it is not inline.
    pub file: Option<String>,
    /// The file's checksum recorded in `_metadata`, when it is not inline: `xxh3-128 <hex>`
    /// (a digest), or `crc32 <hex>` for a file of a version 1 or 2 `_metadata`.
    pub checksum: Option<String>,
}

/// A key-group range (inclusive).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct KeyGroups {
    /// First key group.
    pub start: u32,
    /// Last key group, inclusive.
    pub end: u32,
    /// How many key groups (0 when `end < start`).
    pub count: u32,
}

impl From<KeyGroupRange> for KeyGroups {
    fn from(r: KeyGroupRange) -> Self {
        KeyGroups {
            start: r.start,
            end: r.end,
            count: r.len(),
        }
    }
}

/// One keyed state, from a keyed snapshot's header.
#[derive(Clone, Debug, Serialize)]
pub struct KeyedStateReport {
    /// Its id in the header.
    pub id: i16,
    /// Its name.
    pub name: String,
    /// Its kind (`value`, …).
    pub kind: String,
    /// The key type's name.
    pub key_type: String,
    /// The value type's name.
    pub value_type: String,
    /// The serializer version.
    pub serializer_version: u32,
}

/// One keyed-state handle of a subtask.
#[derive(Clone, Debug, Serialize)]
pub struct KeyedHandleReport {
    /// The key groups it covers.
    pub key_groups: KeyGroups,
    /// The max parallelism in its header (when the header could be read).
    pub max_parallelism: Option<u32>,
    /// Its states, from its header (empty when the header could not be read).
    pub states: Vec<KeyedStateReport>,
    /// Its size in bytes.
    pub size: u64,
    /// Where it is.
    pub stream: StreamReport,
    /// The verification of its bytes, header and sections.
    pub verification: Verification,
}

/// One operator state in an operator-state handle.
#[derive(Clone, Debug, Serialize)]
pub struct OperatorStateEntry {
    /// Its name.
    pub name: String,
    /// Its redistribution mode (`split-distribute`, `union`, `broadcast`).
    pub mode: String,
}

/// One operator-state handle of a subtask.
#[derive(Clone, Debug, Serialize)]
pub struct OperatorHandleReport {
    /// Its states with their redistribution modes.
    pub states: Vec<OperatorStateEntry>,
    /// Its size in bytes.
    pub size: u64,
    /// Where it is.
    pub stream: StreamReport,
    /// The verification of its bytes and content.
    pub verification: Verification,
}

/// One section of a channel-state file: one channel's in-flight data, as `_metadata` records it.
#[derive(Clone, Debug, Serialize)]
pub struct ChannelSectionReport {
    /// `input` (persisted by the consumer) or `output` (by the producer).
    pub direction: String,
    /// The channel: `<from>[<producer>] -> <to>[<consumer>]`, operator ids shortened.
    pub channel: String,
    /// The producing operator's id.
    pub from_operator_id: String,
    /// The producing operator's name, when it is in the checkpoint.
    pub from_operator: Option<String>,
    /// The producing subtask.
    pub producer: u32,
    /// The consuming operator's id.
    pub to_operator_id: String,
    /// The consuming operator's name, when it is in the checkpoint.
    pub to_operator: Option<String>,
    /// The consuming subtask.
    pub consumer: u32,
    /// Records.
    pub records: u64,
    /// Bytes of batch data.
    pub bytes: u64,
}

/// The in-flight data an unaligned checkpoint persisted for one subtask.
#[derive(Clone, Debug, Serialize)]
pub struct InFlightReport {
    /// The id of the first operator of the subtask's chain.
    pub operator_id: String,
    /// Its name, when it is in the checkpoint.
    pub operator: Option<String>,
    /// Its uid, when it has one.
    pub uid: Option<String>,
    /// The subtask index.
    pub subtask: u32,
    /// The channel-state file's size in bytes.
    pub size: u64,
    /// Records over all sections.
    pub records: u64,
    /// Where it is.
    pub stream: StreamReport,
    /// Its sections.
    pub sections: Vec<ChannelSectionReport>,
    /// The verification of its bytes, sections and their agreement with `_metadata`.
    pub verification: Verification,
}

/// What `verify` reports.
#[derive(Clone, Debug, Serialize)]
pub struct VerifyReport {
    /// The checkpoint's directory.
    pub checkpoint_dir: String,
    /// The root or job directory the user gave, when the checkpoint was chosen there.
    pub selected_from: Option<String>,
    /// The checkpoint's id (unknown when `_metadata` is corrupt and the directory is not
    /// named `chk-<n>`).
    pub checkpoint_id: Option<u64>,
    /// The job's name (unknown when `_metadata` is corrupt).
    pub job_name: Option<String>,
    /// Files verified.
    pub files_verified: u64,
    /// Their total size in bytes.
    pub bytes_verified: u64,
    /// Every problem found; empty when the checkpoint is intact.
    pub problems: Vec<Problem>,
}
