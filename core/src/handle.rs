//! State handles: what a snapshot leaves behind, what an acknowledgement carries and what
//! `_metadata` records. The state backends produce them, checkpoint storage persists them, and
//! neither knows the other.

use crate::identity::Digest;
use crate::ids::{OperatorId, SubtaskIndex};
use crate::keygroup::{KeyGroup, KeyGroupRange};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The sum of `sizes`, saturating at `u64::MAX`: sizes decoded from a file or a message may be
/// damaged, and adding them must not overflow.
pub fn saturating_sum(sizes: impl IntoIterator<Item = u64>) -> u64 {
    sizes.into_iter().fold(0, u64::saturating_add)
}

/// Where a snapshot's bytes are.
///
/// The variants' order is part of `_metadata`'s encoding: `LegacyFile` is what `_metadata`
/// versions 1 and 2 recorded, and is only read.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum StreamStateHandle {
    /// Small state kept inside `_metadata` itself (Flink's `ByteStreamStateHandle`, used below
    /// the memory threshold).
    Inline(Vec<u8>),
    /// A file recorded by `_metadata` version 1 or 2, with a CRC-32 of the whole file (which,
    /// for a file that ends in its own CRC, is the same for every file: it is checked, but
    /// proves little). Such files carry no identity frame.
    LegacyFile {
        /// Path relative to the directory of the `_metadata` referring to it.
        path: String,
        /// Its length in bytes.
        size: u64,
        /// CRC-32 of the whole file.
        crc32: u32,
    },
    /// A file written through checkpoint storage.
    File {
        /// Path relative to the directory that holds the `_metadata` referring to it, so a
        /// checkpoint or savepoint directory can be moved whole.
        path: String,
        /// Its length in bytes.
        size: u64,
        /// The xxh3-128 digest of the whole file.
        digest: Digest,
    },
}

impl StreamStateHandle {
    /// The number of bytes the handle stands for.
    pub fn size(&self) -> u64 {
        match self {
            StreamStateHandle::Inline(b) => b.len() as u64,
            StreamStateHandle::LegacyFile { size, .. } | StreamStateHandle::File { size, .. } => {
                *size
            }
        }
    }

    /// The file's path (relative to its `_metadata`), `None` for inline state.
    pub fn path(&self) -> Option<&str> {
        match self {
            StreamStateHandle::Inline(_) => None,
            StreamStateHandle::LegacyFile { path, .. } | StreamStateHandle::File { path, .. } => {
                Some(path)
            }
        }
    }

    /// Whether it is a file recorded by a `_metadata` of version 1 or 2 (no identity frame, a
    /// CRC-32 instead of a digest).
    pub fn is_legacy(&self) -> bool {
        matches!(self, StreamStateHandle::LegacyFile { .. })
    }

    /// How the handle's bytes are checked, for reports: `xxh3-128 <hex>`, `crc32 <hex>`, or
    /// `None` for inline state (covered by `_metadata`'s checksum).
    pub fn checksum_text(&self) -> Option<String> {
        match self {
            StreamStateHandle::Inline(_) => None,
            StreamStateHandle::LegacyFile { crc32, .. } => Some(format!("crc32 {crc32:08x}")),
            StreamStateHandle::File { digest, .. } => Some(format!("xxh3-128 {digest}")),
        }
    }
}

/// One keyed-state snapshot of one subtask: a range of key groups in one stream, with the offset
/// of each key group's section so that a restore can read only the groups it owns.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyedStateHandle {
    /// The key groups the snapshot covers.
    pub key_group_range: KeyGroupRange,
    /// Byte range of the snapshot's header (state metadata) within the stream.
    pub header: (u64, u64),
    /// Start offset of each key group's section; `offsets[i]` is key group `range.start + i`.
    /// The section of the last key group ends at `end`.
    pub offsets: Vec<u64>,
    /// End of the last section.
    pub end: u64,
    /// The bytes.
    pub stream: StreamStateHandle,
}

impl KeyedStateHandle {
    /// The byte range of the sections for the key groups in `range ∩ self.key_group_range`,
    /// or `None` when they do not overlap.
    pub fn byte_range_for(&self, range: &KeyGroupRange) -> Option<(u64, u64)> {
        let overlap = self.key_group_range.intersection(range);
        if overlap.is_empty() {
            return None;
        }
        let first = (overlap.start - self.key_group_range.start) as usize;
        let last = (overlap.end - self.key_group_range.start) as usize;
        let start = *self.offsets.get(first)?;
        let end = match self.offsets.get(last + 1) {
            Some(o) => *o,
            None => self.end,
        };
        Some((start, end))
    }

    /// The offset of key group `kg`'s section, if the handle covers it.
    pub fn offset_of(&self, kg: KeyGroup) -> Option<u64> {
        if !self.key_group_range.contains(kg) {
            return None;
        }
        self.offsets
            .get((kg - self.key_group_range.start) as usize)
            .copied()
    }
}

/// How operator list state is redistributed when parallelism changes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum OperatorStateMode {
    /// The elements of all subtasks are split evenly among the new subtasks.
    SplitDistribute,
    /// Every new subtask gets the elements of all subtasks.
    Union,
    /// Every subtask holds the same state; any one copy is given to each new subtask.
    Broadcast,
}

/// One operator-state snapshot of one subtask.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OperatorStateHandle {
    /// Each registered state's name and redistribution mode.
    pub states: Vec<(String, OperatorStateMode)>,
    /// The bytes.
    pub stream: StreamStateHandle,
}

/// All state of one operator in one subtask.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct OperatorSubtaskState {
    /// Keyed state; several handles after a rescale merged ranges.
    pub keyed: Vec<KeyedStateHandle>,
    /// Operator state; several handles after a rescale merged subtasks.
    pub operator: Vec<OperatorStateHandle>,
    /// Keyed state as a backend's native snapshot (since `_metadata` version 4).
    pub native: Vec<NativeKeyedHandle>,
}

impl OperatorSubtaskState {
    /// Whether there is no state at all.
    pub fn is_empty(&self) -> bool {
        self.keyed.is_empty() && self.operator.is_empty() && self.native.is_empty()
    }

    /// Every stream handle: keyed, operator, and native manifests and files.
    pub fn streams(&self) -> impl Iterator<Item = &StreamStateHandle> {
        let keyed = self.keyed.iter().map(|h| &h.stream);
        let operator = self.operator.iter().map(|h| &h.stream);
        let native = self
            .native
            .iter()
            .flat_map(|n| std::iter::once(&n.manifest).chain(n.files.iter().map(|f| &f.stream)));
        keyed.chain(operator).chain(native)
    }

    /// Total bytes referenced (saturating: the sizes come from files and messages, and a
    /// damaged one must not overflow).
    pub fn state_size(&self) -> u64 {
        saturating_sum(self.streams().map(StreamStateHandle::size))
    }
}

/// One subtask's keyed state as its backend's native snapshot (Flink's native incremental
/// checkpoints): the backend's own immutable files, each uploaded once and shared by the
/// checkpoints that list it, and a manifest of what the backend needs besides them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NativeKeyedHandle {
    /// The key groups of the subtask that took it.
    pub key_group_range: KeyGroupRange,
    /// The backend's file format (`weir-disk-runs/2`).
    pub format: String,
    /// The manifest the backend wrote.
    pub manifest: StreamStateHandle,
    /// The files, in the backend's order.
    pub files: Vec<NativeFileHandle>,
}

/// One file of a [`NativeKeyedHandle`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NativeFileHandle {
    /// The backend's name for it, the same in every checkpoint that lists it.
    pub name: String,
    /// The key groups it answers for.
    pub key_groups: KeyGroupRange,
    /// The uploaded file (an identity frame, then the backend's bytes), shared.
    pub stream: StreamStateHandle,
}

/// The state of every operator of a chain in one subtask: what an acknowledgement carries.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskStateSnapshot {
    /// Per operator of the chain.
    pub operators: BTreeMap<OperatorId, OperatorSubtaskState>,
    /// The in-flight data an unaligned checkpoint persisted for the subtask.
    pub in_flight: Option<ChannelStateHandle>,
    /// The paths of the shared files (incremental state) this acknowledgement wrote for its
    /// checkpoint. Every other shared file it references belongs to an earlier checkpoint, and
    /// the job manager checks that it still holds it.
    #[serde(default)]
    pub new_shared: Vec<String>,
}

impl TaskStateSnapshot {
    /// Total bytes referenced (saturating, as [`OperatorSubtaskState::state_size`]).
    pub fn state_size(&self) -> u64 {
        saturating_sum(self.operators.values().map(|s| s.state_size()))
            .saturating_add(self.in_flight_size())
    }

    /// Bytes of persisted in-flight data.
    pub fn in_flight_size(&self) -> u64 {
        self.in_flight.as_ref().map_or(0, |h| h.size())
    }
}

// ---------------------------------------------------------------------------------------------
// Channel state: the handles of in-flight data (the file format is in `channel_state`).
// ---------------------------------------------------------------------------------------------

/// Names a channel by what survives a redeployment: the operators at its two ends (the edge's
/// producing and consuming operators) and the two subtask indices.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ChannelInfo {
    /// The operator that writes into the channel.
    pub from: OperatorId,
    /// The operator that reads from it.
    pub to: OperatorId,
    /// The producing subtask.
    pub producer: SubtaskIndex,
    /// The consuming subtask.
    pub consumer: SubtaskIndex,
}

impl std::fmt::Display for ChannelInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (from, to) = (self.from.to_string(), self.to.to_string());
        write!(
            f,
            "{}[{}] -> {}[{}]",
            &from[..8.min(from.len())],
            self.producer,
            &to[..8.min(to.len())],
            self.consumer
        )
    }
}

/// Which end of the channel persisted a section.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum ChannelDirection {
    /// The consumer: data read after its snapshot that precedes the channel's barrier.
    Input,
    /// The producer: queued buffers its barrier overtook.
    Output,
}

/// What `_metadata` records of one section, so `weir checkpoints inspect` can show it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChannelSectionSummary {
    /// Which end persisted it.
    pub direction: ChannelDirection,
    /// The channel.
    pub channel: ChannelInfo,
    /// Number of records.
    pub records: u64,
    /// Bytes of batch data.
    pub bytes: u64,
}

/// The in-flight data of one subtask in one checkpoint.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChannelStateHandle {
    /// The channel-state file.
    pub stream: StreamStateHandle,
    /// Its sections.
    pub sections: Vec<ChannelSectionSummary>,
}

impl ChannelStateHandle {
    /// Bytes referenced.
    pub fn size(&self) -> u64 {
        self.stream.size()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(size: u64) -> StreamStateHandle {
        StreamStateHandle::File {
            path: "chk-1/f".to_string(),
            size,
            digest: crate::identity::Digest([0; 16]),
        }
    }

    #[test]
    fn state_sizes_from_damaged_handles_saturate() {
        // Found by `weir-fuzz` (codec target): a decoded acknowledgement whose file sizes add
        // up past u64::MAX overflowed `state_size` (a panic with overflow checks).
        let subtask = OperatorSubtaskState {
            keyed: vec![KeyedStateHandle {
                key_group_range: KeyGroupRange::new(0, 0),
                header: (0, 1),
                offsets: vec![1],
                end: 2,
                stream: file(u64::MAX),
            }],
            operator: vec![OperatorStateHandle {
                states: Vec::new(),
                stream: file(3),
            }],
            native: Vec::new(),
        };
        assert_eq!(subtask.state_size(), u64::MAX);
        let mut task = TaskStateSnapshot::default();
        task.operators.insert(OperatorId(1), subtask.clone());
        task.operators.insert(OperatorId(2), subtask);
        assert_eq!(task.state_size(), u64::MAX);
        assert_eq!(
            saturating_sum([1, 2, 3]),
            6,
            "ordinary sizes add up exactly"
        );
    }
}
