//! The one verifier of a checkpoint's files: every check a restore makes before any state
//! reaches an operator, and that `weir checkpoints verify` reports, written once.
//!
//! - `_metadata` against where it lies (its `chk-<n>` and job directory) and against itself
//!   (subtask indices, key-group ranges and section offsets, in-flight entries).
//! - Each state file: size and digest when read whole (storage checks them), then its identity
//!   frame against what `_metadata` implies: job, checkpoint, operator, subtask, key groups and
//!   kind. An incremental chain is walked from its newest link back: each link is of the
//!   checkpoint the next one names as its base, the newest is `_metadata`'s own, and the first
//!   starts the chain. A native keyed snapshot's manifest is of `_metadata`'s checkpoint; each
//!   of its files (shared, uploaded once) of that checkpoint or an older one.
//! - Each payload: a keyed snapshot's header against the handle and every section it serves;
//!   operator state decoded, with the states `_metadata` records; channel state decoded, every
//!   batch checked, and its sections against `_metadata`'s summaries.
//!
//! Files recorded by `_metadata` versions 1 and 2 have no identity frame; their other checks
//! still run.

use weir_checkpoint::storage::CheckpointLocation;
use weir_checkpoint::{CheckpointMetadata, CheckpointStorage, OperatorState};
use weir_core::channel_state::{ChannelDirection, ChannelSection, ChannelSectionSummary};
use weir_core::handle::{
    KeyedStateHandle, NativeKeyedHandle, OperatorStateHandle, OperatorStateMode,
};
use weir_core::identity::{ExpectedIdentity, FileIdentity, StateFileKind};
use weir_core::ids::{OperatorId, SubtaskIndex};
use weir_core::keygroup::KeyGroupRange;
use weir_state::format::{SnapshotHeader, part_sections};
use weir_state::{OperatorStateBackend, RestorePart};

/// Problems of `_metadata` against where it lies and against itself; empty when it is sound.
pub(crate) fn metadata_problems(
    location: &CheckpointLocation,
    m: &CheckpointMetadata,
) -> Vec<String> {
    let mut problems = Vec::new();
    if let Err(e) = m.check_location(location) {
        problems.push(e);
    }
    problems.extend(metadata_self_problems(m));
    problems
}

/// What a file of `operator`'s subtask `subtask` must say it is.
pub(crate) fn expected(
    m: &CheckpointMetadata,
    operator_id: OperatorId,
    subtask: SubtaskIndex,
    key_groups: Option<KeyGroupRange>,
    kind: StateFileKind,
) -> ExpectedIdentity {
    ExpectedIdentity {
        job_id: m.job_id,
        checkpoint_id: m.checkpoint_id,
        operator_id,
        subtask,
        key_groups,
        kind,
    }
}

/// Opens the identity frame of a file read whole and checks it; returns the offset of the
/// payload (0 for a legacy file, which has no frame).
pub(crate) fn open_file(
    m: &CheckpointMetadata,
    bytes: &[u8],
    expected: &ExpectedIdentity,
) -> Result<usize, String> {
    if !m.has_identity_frames() {
        return Ok(0);
    }
    let (identity, offset) = weir_core::identity::open_frame(bytes).map_err(|e| e.to_string())?;
    identity.check(expected)?;
    Ok(offset)
}

/// Opens the identity frame of a native keyed snapshot's manifest or file, read whole, and
/// checks it: this job, operator and subtask, the kind and key groups the handle records, and
/// the checkpoint that wrote it: `_metadata`'s own for a manifest; for a file, that one or an
/// older one (a file is uploaded once, by the first checkpoint that lists it, and shared by the
/// later ones). Returns the identity and the offset of the payload.
pub(crate) fn check_native_frame(
    m: &CheckpointMetadata,
    operator_id: OperatorId,
    subtask: SubtaskIndex,
    key_groups: KeyGroupRange,
    kind: StateFileKind,
    bytes: &[u8],
) -> Result<(FileIdentity, usize), String> {
    let (identity, offset) = weir_core::identity::open_frame(bytes).map_err(|e| e.to_string())?;
    check_native_identity(
        &identity,
        &expected(m, operator_id, subtask, Some(key_groups), kind),
    )?;
    Ok((identity, offset))
}

/// Checks the identity of a native snapshot's file against what its `_metadata` implies: a
/// file (not a manifest) may come from an earlier checkpoint, which uploaded it first.
pub(crate) fn check_native_identity(
    identity: &FileIdentity,
    expected: &ExpectedIdentity,
) -> Result<(), String> {
    let mut e = expected.clone();
    if e.kind == StateFileKind::NativeFile && identity.checkpoint_id < e.checkpoint_id {
        e.checkpoint_id = identity.checkpoint_id;
    }
    identity.check(&e)
}

/// Reads the identity frame of a keyed file by range (the bytes before its header).
pub(crate) async fn read_keyed_frame(
    storage: &dyn CheckpointStorage,
    location: &CheckpointLocation,
    h: &KeyedStateHandle,
) -> Result<FileIdentity, FrameError> {
    let len = h.header.0;
    if len > weir_core::identity::MAX_IDENTITY_FRAME_LEN {
        return Err(FrameError::Damaged(format!(
            "the handle puts the header at byte {len}, after more room than an identity frame \
             may take"
        )));
    }
    let bytes = match storage
        .read_state(location, &h.stream, Some((0, len)))
        .await
    {
        Ok(bytes) => bytes,
        // A read the storage may retry says nothing of the file.
        Err(e) if e.is_temporary() => return Err(FrameError::Temporary(e)),
        Err(e) => return Err(FrameError::Damaged(crate::error::reason_of(&e))),
    };
    let (identity, offset) =
        weir_core::identity::open_frame(&bytes).map_err(|e| FrameError::Damaged(e.to_string()))?;
    if offset as u64 != len {
        return Err(FrameError::Damaged(format!(
            "the identity frame ends at byte {offset}, but the handle puts the header at {len}"
        )));
    }
    Ok(identity)
}

/// Why a keyed file's identity frame could not be read.
#[derive(Debug)]
pub(crate) enum FrameError {
    /// The storage failed in a way it calls temporary: nothing is known of the file.
    Temporary(weir_checkpoint::CheckpointError),
    /// The file is missing or damaged.
    Damaged(String),
}

/// Checks the identity frames of one subtask's keyed handles: a self-contained snapshot of
/// this checkpoint, or an incremental chain whose links name each other, newest last.
/// `frames[i]` is the frame of `handles[i]`.
pub(crate) fn check_keyed_frames(
    m: &CheckpointMetadata,
    operator_id: OperatorId,
    subtask: SubtaskIndex,
    handles: &[KeyedStateHandle],
    frames: &[FileIdentity],
) -> Result<(), String> {
    let Some(newest) = frames.last() else {
        return Ok(());
    };
    let chain = newest.kind == StateFileKind::KeyedLink;
    let kind = if chain {
        StateFileKind::KeyedLink
    } else {
        StateFileKind::Keyed
    };
    if !chain && handles.len() > 1 {
        return Err(format!(
            "{} keyed files are recorded, but the newest is not a link of an incremental chain",
            handles.len()
        ));
    }
    let mut expected_id = m.checkpoint_id;
    for (i, (h, frame)) in handles.iter().zip(frames).enumerate().rev() {
        let mut e = expected(m, operator_id, subtask, Some(h.key_group_range), kind);
        e.checkpoint_id = expected_id;
        frame
            .check(&e)
            .map_err(|reason| format!("link {} of {}: {reason}", i + 1, handles.len()))?;
        match (i, frame.base) {
            (0, None) => {}
            (0, Some(b)) => {
                return Err(format!(
                    "the chain's first link is a delta on checkpoint {}, whose link is not \
                     recorded",
                    b.0
                ));
            }
            (_, Some(b)) => expected_id = b,
            (_, None) => {
                return Err(format!(
                    "link {} of {} starts a chain, but {} older link{} are recorded before it",
                    i + 1,
                    handles.len(),
                    i,
                    if i == 1 { "" } else { "s" }
                ));
            }
        }
    }
    Ok(())
}

/// The file `stream` of checkpoint `location` is in, relative to the storage root, for errors:
/// `_metadata` for inline state.
pub(crate) fn stream_file(
    location: &weir_checkpoint::CheckpointLocation,
    stream: &weir_core::handle::StreamStateHandle,
) -> String {
    match stream.path() {
        Some(path) => format!("{}{path}", location.dir),
        None => location.metadata_path(),
    }
}

/// Problems of a keyed handle as `_metadata` records it.
pub(crate) fn keyed_handle_problems(op: &OperatorState, h: &KeyedStateHandle) -> Vec<String> {
    let mut errors = Vec::new();
    let range = h.key_group_range;
    if !range.is_empty() && range.end >= op.max_parallelism {
        errors.push(format!(
            "the key groups {range} do not fit the operator's max parallelism {}",
            op.max_parallelism
        ));
    }
    if h.offsets.len() != range.len() as usize {
        errors.push(format!(
            "the handle has {} section offsets for the {} key groups {range}",
            h.offsets.len(),
            range.len()
        ));
    }
    errors.extend(keyed_layout_problems(h));
    errors
}

/// Problems of a keyed handle's layout: the header, then the sections in key-group order,
/// inside the stream. A subtask that downloads its sections by range relies on it (the master
/// does not read every section to find out).
fn keyed_layout_problems(h: &KeyedStateHandle) -> Vec<String> {
    let mut errors = Vec::new();
    let range = h.key_group_range;
    let (header_start, header_end) = h.header;
    let mut at = header_end;
    if header_start > header_end {
        errors.push(format!(
            "the header's range [{header_start}, {header_end}) is reversed"
        ));
    }
    for (i, &offset) in h.offsets.iter().enumerate() {
        if offset < at {
            errors.push(format!(
                "the section of key group {} starts at byte {offset}, before byte {at} where \
                 the {} ends",
                u64::from(range.start) + i as u64,
                if i == 0 { "header" } else { "previous section" }
            ));
            break;
        }
        at = offset;
    }
    if h.end < at {
        errors.push(format!(
            "the sections end at byte {}, before the last one starts (byte {at})",
            h.end
        ));
    }
    let size = h.stream.size();
    if h.end > size {
        errors.push(format!(
            "the sections end at byte {}, past the end of the {size}-byte stream",
            h.end
        ));
    }
    errors
}

/// Problems of a native keyed handle as `_metadata` records it: key groups of the handle and of
/// its files that fit the operator's max parallelism.
pub(crate) fn native_handle_problems(op: &OperatorState, h: &NativeKeyedHandle) -> Vec<String> {
    let fits = |r: &KeyGroupRange| r.is_empty() || r.end < op.max_parallelism;
    let mut errors = Vec::new();
    if !fits(&h.key_group_range) {
        errors.push(format!(
            "the key groups {} do not fit the operator's max parallelism {}",
            h.key_group_range, op.max_parallelism
        ));
    }
    for f in h.files.iter().filter(|f| !fits(&f.key_groups)) {
        errors.push(format!(
            "file {:?}: the key groups {} do not fit the operator's max parallelism {}",
            f.name, f.key_groups, op.max_parallelism
        ));
    }
    errors
}

/// Decodes a keyed snapshot's header and checks it against the handle and its operator.
pub(crate) fn check_keyed_header(
    op: &OperatorState,
    h: &KeyedStateHandle,
    header: &[u8],
) -> Result<SnapshotHeader, Vec<String>> {
    let decoded = SnapshotHeader::decode(header).map_err(|e| vec![e.to_string()])?;
    let mut errors = Vec::new();
    if decoded.key_group_range != h.key_group_range {
        errors.push(format!(
            "the header covers key groups {}, the handle {}",
            decoded.key_group_range, h.key_group_range
        ));
    }
    if decoded.max_parallelism != op.max_parallelism {
        errors.push(format!(
            "the header's max parallelism is {}, the operator's {}",
            decoded.max_parallelism, op.max_parallelism
        ));
    }
    if errors.is_empty() {
        Ok(decoded)
    } else {
        Err(errors)
    }
}

/// Checks every section of `part` that `range` selects; returns how many were checked, or what
/// failed (at most `max_problems` section failures, then a count).
pub(crate) fn check_keyed_sections(
    header: &SnapshotHeader,
    part: &RestorePart<'_>,
    range: &KeyGroupRange,
    max_problems: usize,
) -> Result<usize, Vec<String>> {
    let sections = part_sections(part, range).map_err(|e| vec![e.to_string()])?;
    let mut errors = Vec::new();
    let mut failed = 0usize;
    for (kg, bytes) in &sections {
        if let Err(e) = header.parse_section(*kg, bytes) {
            failed += 1;
            if errors.len() < max_problems {
                errors.push(e.to_string());
            }
        }
    }
    if failed > errors.len() {
        errors.push(format!(
            "and {} more key-group sections fail their checks",
            failed - errors.len()
        ));
    }
    if errors.is_empty() {
        Ok(sections.len())
    } else {
        Err(errors)
    }
}

/// Decodes an operator-state payload and checks it holds the states `_metadata` records.
pub(crate) fn check_operator_payload(
    h: &OperatorStateHandle,
    payload: &[u8],
) -> Result<(), String> {
    let mut backend = OperatorStateBackend::new();
    backend.restore(&[payload]).map_err(|e| e.to_string())?;
    let mut found = backend.snapshot().states();
    let mut recorded = h.states.clone();
    found.sort_by(|a, b| a.0.cmp(&b.0));
    recorded.sort_by(|a, b| a.0.cmp(&b.0));
    if found != recorded {
        return Err(format!(
            "the blob holds the states {}, _metadata records {}",
            state_list(&found),
            state_list(&recorded)
        ));
    }
    Ok(())
}

/// Decodes a channel-state payload, checks every batch and the sections against the summaries
/// `_metadata` records (at most `max_problems` failures, then a count).
pub(crate) fn check_channel_payload(
    recorded: &[ChannelSectionSummary],
    payload: &[u8],
    max_problems: usize,
) -> Result<Vec<ChannelSection>, Vec<String>> {
    let sections =
        weir_core::channel_state::decode_file("channel-state file", payload).map_err(|e| {
            vec![match e {
                weir_core::CoreError::Corrupt { reason, .. } => reason,
                weir_core::CoreError::Decode { reason, .. } => {
                    format!("cannot decode the sections: {reason}")
                }
                other => other.to_string(),
            }]
        })?;
    let mut errors = Vec::new();
    let mut failed = 0usize;
    let mut note = |errors: &mut Vec<String>, e: String| {
        failed += 1;
        if errors.len() < max_problems {
            errors.push(e);
        }
    };
    for section in &sections {
        if let Err(e) = section.verify() {
            note(&mut errors, e.to_string());
        }
    }
    if sections.len() != recorded.len() {
        note(
            &mut errors,
            format!(
                "the file holds {} sections, _metadata records {}",
                sections.len(),
                recorded.len()
            ),
        );
    }
    for (i, (found, recorded)) in sections.iter().zip(recorded).enumerate() {
        for e in section_mismatches(i, &found.summary(), recorded) {
            note(&mut errors, e);
        }
    }
    if failed > errors.len() {
        errors.push(format!(
            "and {} more section checks fail",
            failed - errors.len()
        ));
    }
    if errors.is_empty() {
        Ok(sections)
    } else {
        Err(errors)
    }
}

/// `input` or `output`.
pub(crate) fn direction_name(direction: ChannelDirection) -> &'static str {
    match direction {
        ChannelDirection::Input => "input",
        ChannelDirection::Output => "output",
    }
}

/// `input channel 1a2b3c4d[0] -> 5e6f7a8b[1]`.
pub(crate) fn section_label(s: &ChannelSectionSummary) -> String {
    format!("{} channel {}", direction_name(s.direction), s.channel)
}

/// How section `i` of a channel-state file differs from what `_metadata` records of it.
fn section_mismatches(
    i: usize,
    found: &ChannelSectionSummary,
    recorded: &ChannelSectionSummary,
) -> Vec<String> {
    let n = i + 1;
    let mut out = Vec::new();
    if found.direction != recorded.direction || found.channel != recorded.channel {
        out.push(format!(
            "section {n} holds the {}, _metadata records the {}",
            section_label(found),
            section_label(recorded)
        ));
        return out;
    }
    if found.records != recorded.records {
        out.push(format!(
            "section {n} ({}) holds {} records, _metadata records {}",
            section_label(found),
            found.records,
            recorded.records
        ));
    }
    if found.bytes != recorded.bytes {
        out.push(format!(
            "section {n} ({}) holds {} bytes, _metadata records {}",
            section_label(found),
            found.bytes,
            recorded.bytes
        ));
    }
    out
}

/// A redistribution mode as users write it.
pub(crate) fn mode_name(mode: OperatorStateMode) -> &'static str {
    match mode {
        OperatorStateMode::SplitDistribute => "split-distribute",
        OperatorStateMode::Union => "union",
        OperatorStateMode::Broadcast => "broadcast",
    }
}

fn state_list(states: &[(String, OperatorStateMode)]) -> String {
    let names: Vec<String> = states
        .iter()
        .map(|(n, m)| format!("'{n}' ({})", mode_name(*m)))
        .collect();
    if names.is_empty() {
        "none".to_string()
    } else {
        names.join(", ")
    }
}

/// How `_metadata` names an operator's subtask in a problem.
pub(crate) fn who(op: &OperatorState, subtask: SubtaskIndex) -> String {
    match &op.uid {
        Some(uid) => format!("operator '{}' (uid {uid}), subtask {subtask}", op.name),
        None => format!(
            "operator '{}' (id {}), subtask {subtask}",
            op.name, op.operator_id
        ),
    }
}

/// Problems of `_metadata` against itself: subtask indices below the parallelism, keyed and
/// native handles that fit their operator, key-group ranges of an operator's subtasks that do
/// not overlap, and in-flight entries that are recorded once, for a subtask that exists, with
/// sections filed under the right end.
pub(crate) fn metadata_self_problems(m: &CheckpointMetadata) -> Vec<String> {
    let mut problems = Vec::new();
    for op in &m.operators {
        let mut ranges: Vec<(KeyGroupRange, SubtaskIndex)> = Vec::new();
        for (&index, state) in &op.subtasks {
            let who = who(op, index);
            if index >= op.parallelism {
                problems.push(format!(
                    "{who}: the subtask index is not below the parallelism {}",
                    op.parallelism
                ));
            }
            for h in &state.keyed {
                for e in keyed_handle_problems(op, h) {
                    problems.push(format!("keyed state of {who}: {e}"));
                }
                // An incremental chain's links share one range.
                if !ranges.contains(&(h.key_group_range, index)) {
                    ranges.push((h.key_group_range, index));
                }
            }
            for h in &state.native {
                for e in native_handle_problems(op, h) {
                    problems.push(format!("native keyed state of {who}: {e}"));
                }
                if !ranges.contains(&(h.key_group_range, index)) {
                    ranges.push((h.key_group_range, index));
                }
            }
        }
        ranges.sort_by_key(|(r, _)| (r.start, r.end));
        for pair in ranges.windows(2) {
            if let [(a, sa), (b, sb)] = pair
                && !a.is_empty()
                && !b.is_empty()
                && b.start <= a.end
            {
                let name = match &op.uid {
                    Some(uid) => format!("operator '{}' (uid {uid})", op.name),
                    None => format!("operator '{}' (id {})", op.name, op.operator_id),
                };
                problems.push(format!(
                    "{name}: the key groups {a} of subtask {sa} and {b} of subtask {sb} overlap"
                ));
            }
        }
    }
    let mut seen = std::collections::BTreeMap::new();
    for (n, entry) in m.in_flight.iter().enumerate() {
        let op = m
            .operators
            .iter()
            .find(|o| o.operator_id == entry.operator_id);
        let who = match op {
            Some(op) => who(op, entry.subtask),
            None => format!("operator {}, subtask {}", entry.operator_id, entry.subtask),
        };
        if let Some(first) = seen.insert((entry.operator_id, entry.subtask), n) {
            problems.push(format!(
                "in-flight data of subtask {} of operator {} is recorded twice (entries {} and \
                 {})",
                entry.subtask,
                entry.operator_id,
                first + 1,
                n + 1
            ));
        }
        match op {
            None => problems.push(format!(
                "in-flight data of {who}: the operator is not one of the checkpoint's operators"
            )),
            Some(op) if entry.subtask >= op.parallelism => problems.push(format!(
                "in-flight data of {who}: the subtask index is not below the operator's \
                 parallelism {}",
                op.parallelism
            )),
            Some(_) => {}
        }
        for (i, s) in entry.handle.sections.iter().enumerate() {
            let (end, index) = match s.direction {
                ChannelDirection::Input => ("consumer", s.channel.consumer),
                ChannelDirection::Output => ("producer", s.channel.producer),
            };
            if index != entry.subtask {
                problems.push(format!(
                    "in-flight data of {who}: section {} ({}) is filed under subtask {}, but \
                     the channel's {end} is subtask {index}",
                    i + 1,
                    section_label(s),
                    entry.subtask
                ));
            }
        }
    }
    problems
}

#[cfg(test)]
mod tests {
    use super::*;
    use weir_core::handle::StreamStateHandle;

    fn handle(header: (u64, u64), offsets: Vec<u64>, end: u64, size: usize) -> KeyedStateHandle {
        KeyedStateHandle {
            key_group_range: KeyGroupRange::new(4, 4 + offsets.len() as u32 - 1),
            header,
            offsets,
            end,
            stream: StreamStateHandle::Inline(vec![0; size]),
        }
    }

    #[test]
    fn a_keyed_layout_out_of_order_or_out_of_its_stream_is_named() {
        assert!(keyed_layout_problems(&handle((0, 10), vec![10, 20, 20, 35], 50, 50)).is_empty());
        let named = |h: KeyedStateHandle, what: &str| {
            let problems = keyed_layout_problems(&h);
            assert!(
                problems.iter().any(|p| p.contains(what)),
                "{what:?} not in {problems:?}"
            );
        };
        named(
            handle((0, 10), vec![10, 30, 20, 35], 50, 50),
            "key group 6 starts at byte 20",
        );
        named(
            handle((0, 10), vec![5, 20, 30, 35], 50, 50),
            "before byte 10 where the header",
        );
        named(handle((12, 10), vec![12, 20, 30, 35], 50, 50), "reversed");
        named(
            handle((0, 10), vec![10, 20, 30, 35], 34, 50),
            "before the last one starts",
        );
        named(
            handle((0, 10), vec![10, 20, 30, 35], 60, 50),
            "past the end of the 50-byte",
        );
    }
}
