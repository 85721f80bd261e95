//! `inspect` and `verify`: the checkpoint a path names chosen, its `_metadata` and every file it
//! references checked as a restore checks them, and the findings reported.

use super::format::{format_time, kind_name};
use super::open::{MetadataRead, Opened, find, no_checkpoint, open, read_metadata};
use super::report::{
    ChannelSectionReport, InFlightReport, KeyedHandleReport, KeyedStateReport,
    OperatorHandleReport, OperatorStateEntry, Problem, StreamReport, Verification, VerifyReport,
};
use super::{CliError, InspectReport, OperatorReport, SubtaskReport};
use crate::error::reason_of;
use crate::verify;
use std::collections::BTreeMap;
use std::path::Path;
use weir_checkpoint::metadata::SubtaskInFlight;
use weir_checkpoint::storage::CheckpointLocation;
use weir_checkpoint::{CheckpointMetadata, CheckpointStorage, OperatorState};
use weir_core::handle::{KeyedStateHandle, OperatorStateHandle, StreamStateHandle, saturating_sum};
use weir_core::identity::{FileIdentity, StateFileKind};
use weir_core::ids::OperatorId;
use weir_state::format::{SnapshotHeader, whole_stream_part};

/// The most section failures reported per keyed-state stream (the rest are counted).
const MAX_SECTION_PROBLEMS: usize = 5;

/// The outcome of checking a checkpoint.
enum Checked {
    Report(Box<InspectReport>),
    /// `_metadata` is corrupt, so nothing else can be checked.
    MetadataCorrupt {
        checkpoint_dir: String,
        selected_from: Option<String>,
        id: Option<u64>,
        /// `_metadata`'s size in bytes.
        size: u64,
        problem: Problem,
    },
}

/// Inspects one checkpoint: the `chk-<n>` directory `path`, or the latest complete checkpoint
/// under a root or job directory. Every file is verified; failed checks are in
/// [`InspectReport::problems`] and in each handle's verification. A corrupt `_metadata` is a
/// [`CliError::Failed`].
pub async fn inspect(path: &Path) -> Result<InspectReport, CliError> {
    match check(path).await? {
        Checked::Report(report) => Ok(*report),
        Checked::MetadataCorrupt { problem, .. } => Err(CliError::Failed(format!(
            "corrupt checkpoint metadata '{}': {}",
            problem.file, problem.reason
        ))),
    }
}

/// Verifies one checkpoint (chosen as by [`inspect`]): `_metadata` and every file it references.
pub async fn verify(path: &Path) -> Result<VerifyReport, CliError> {
    Ok(match check(path).await? {
        Checked::Report(r) => VerifyReport {
            checkpoint_dir: r.checkpoint_dir,
            selected_from: r.selected_from,
            checkpoint_id: Some(r.checkpoint_id),
            job_name: Some(r.job_name),
            files_verified: r.files_verified,
            bytes_verified: r.bytes_verified,
            problems: r.problems,
        },
        Checked::MetadataCorrupt {
            checkpoint_dir,
            selected_from,
            id,
            size,
            problem,
        } => VerifyReport {
            checkpoint_dir,
            selected_from,
            checkpoint_id: id,
            job_name: None,
            files_verified: 1,
            bytes_verified: size,
            problems: vec![problem],
        },
    })
}

/// Chooses the checkpoint under `path` and checks it.
async fn check(path: &Path) -> Result<Checked, CliError> {
    let opened = open(path)?;
    let found = find(&opened).await?;
    if found.is_empty() {
        return Err(no_checkpoint(&opened));
    }
    // The path itself is a checkpoint directory: that one, complete or not.
    let chosen = if let Some(f) = found.iter().find(|f| f.location.dir == opened.rel) {
        if !f.complete {
            return Err(CliError::Usage(format!(
                "'{}' is an incomplete checkpoint: it has no _metadata",
                opened.shown
            )));
        }
        f
    } else {
        // A root or job directory: the checkpoint a restore from it would try first.
        match found.iter().rev().find(|f| f.complete) {
            Some(f) => f,
            None => {
                return Err(CliError::Usage(format!(
                    "no complete checkpoint under '{}': {} checkpoint director{} without _metadata",
                    opened.shown,
                    found.len(),
                    if found.len() == 1 { "y" } else { "ies" }
                )));
            }
        }
    };
    let checkpoint_dir = opened.display(&chosen.location.dir);
    let selected_from = (chosen.location.dir != opened.rel).then(|| opened.shown.clone());
    let metadata_file = opened.display(&chosen.location.metadata_path());
    let loaded = match read_metadata(&opened, chosen).await {
        MetadataRead::Ok(loaded) => loaded,
        MetadataRead::Corrupt(reason, size) => {
            return Ok(Checked::MetadataCorrupt {
                checkpoint_dir,
                selected_from,
                id: chosen.id,
                size,
                problem: Problem {
                    file: metadata_file,
                    reason,
                },
            });
        }
        MetadataRead::Unreadable(reason) => {
            return Err(CliError::Failed(format!(
                "cannot read the checkpoint metadata '{metadata_file}': {reason}"
            )));
        }
    };
    let mut checker = Checker {
        opened: &opened,
        location: &chosen.location,
        metadata_file: metadata_file.clone(),
        problems: Vec::new(),
        files: BTreeMap::new(),
    };
    let m = &loaded.metadata;
    for reason in verify::metadata_self_problems(m) {
        checker.problems.push(Problem {
            file: checker.metadata_file.clone(),
            reason,
        });
    }
    let mut operators = Vec::with_capacity(m.operators.len());
    for op in &m.operators {
        operators.push(checker.operator(m, op).await);
    }
    let mut in_flight = Vec::with_capacity(m.in_flight.len());
    for entry in &m.in_flight {
        in_flight.push(checker.in_flight(m, entry).await);
    }
    let files_verified = 1 + checker.files.len() as u64;
    let bytes_verified =
        saturating_sum(checker.files.values().copied()).saturating_add(loaded.size);
    Ok(Checked::Report(Box::new(InspectReport {
        checkpoint_dir,
        selected_from,
        metadata_file,
        metadata_size: loaded.size,
        format_version: loaded.format_version,
        job_name: m.job_name.clone(),
        job_id: m.job_id.to_string(),
        checkpoint_id: m.checkpoint_id.0,
        kind: kind_name(m.kind).to_string(),
        trigger_time: format_time(m.trigger_timestamp_ms),
        trigger_timestamp_ms: m.trigger_timestamp_ms,
        completion_time: format_time(m.completion_timestamp_ms),
        completion_timestamp_ms: m.completion_timestamp_ms,
        weir_version: m.weir_version.clone(),
        state_size: m.state_size(),
        in_flight_size: m.in_flight_size(),
        unaligned: !m.in_flight.is_empty(),
        operators,
        in_flight,
        files_verified,
        bytes_verified,
        problems: checker.problems,
    })))
}

/// Checks the state of one checkpoint, collecting problems and the files seen.
pub(super) struct Checker<'a> {
    opened: &'a Opened,
    location: &'a CheckpointLocation,
    metadata_file: String,
    problems: Vec<Problem>,
    /// Every distinct state file (relative to the storage root) and its size.
    files: BTreeMap<String, u64>,
}

/// What a stream's problems are about: which file, and, for inline state, which part of
/// `_metadata`.
pub(super) struct Subject {
    file: String,
    prefix: String,
}

impl Checker<'_> {
    /// The file of a handle relative to the storage root, resolved lexically; `None` when it
    /// leaves the root.
    fn resolve(&self, path: &str) -> Option<String> {
        let mut parts: Vec<&str> = self
            .location
            .dir
            .split('/')
            .filter(|s| !s.is_empty())
            .collect();
        if path.is_empty() || path.starts_with('/') {
            return None;
        }
        for seg in path.split('/') {
            match seg {
                "" | "." => {}
                ".." => {
                    parts.pop()?;
                }
                s => parts.push(s),
            }
        }
        Some(parts.join("/"))
    }

    pub(super) fn stream_report(&self, stream: &StreamStateHandle) -> StreamReport {
        match stream {
            StreamStateHandle::Inline(_) => StreamReport {
                inline: true,
                file: None,
                checksum: None,
            },
            StreamStateHandle::File { path, .. } | StreamStateHandle::LegacyFile { path, .. } => {
                StreamReport {
                    inline: false,
                    file: Some(match self.resolve(path) {
                        Some(rel) => self.opened.display(&rel),
                        None => path.clone(),
                    }),
                    checksum: stream.checksum_text(),
                }
            }
        }
    }

    pub(super) fn subject(&self, stream: &StreamStateHandle, what: &str) -> Subject {
        match stream {
            StreamStateHandle::Inline(_) => Subject {
                file: self.metadata_file.clone(),
                prefix: format!("inline {what}: "),
            },
            StreamStateHandle::File { path, .. } | StreamStateHandle::LegacyFile { path, .. } => {
                Subject {
                    file: match self.resolve(path) {
                        Some(rel) => self.opened.display(&rel),
                        None => path.clone(),
                    },
                    prefix: String::new(),
                }
            }
        }
    }

    pub(super) fn note_file(&mut self, stream: &StreamStateHandle) {
        if let Some(path) = stream.path()
            && let Some(rel) = self.resolve(path)
        {
            self.files.insert(rel, stream.size());
        }
    }

    /// Reads a whole stream (verifying a file's size and CRC-32).
    pub(super) async fn read_whole(
        &self,
        stream: &StreamStateHandle,
    ) -> Result<bytes::Bytes, String> {
        self.opened
            .storage
            .read_state(self.location, stream, None)
            .await
            .map_err(|e| reason_of(&e))
    }

    /// The raw bytes of a file whose verified read failed, to locate the damage; `None` when
    /// they cannot be read either.
    async fn read_raw(&self, stream: &StreamStateHandle) -> Option<Vec<u8>> {
        let rel = self.resolve(stream.path()?)?;
        self.opened
            .storage
            .operator()
            .read(&rel)
            .await
            .ok()
            .map(|b| b.to_vec())
    }

    async fn operator(&mut self, m: &CheckpointMetadata, op: &OperatorState) -> OperatorReport {
        let mut subtasks = Vec::with_capacity(op.subtasks.len());
        for (&index, state) in &op.subtasks {
            let who = verify::who(op, index);
            let mut keyed = Vec::with_capacity(state.keyed.len());
            let mut frames = Vec::with_capacity(state.keyed.len());
            for h in &state.keyed {
                let (report, frame) = self.keyed(m, op, h, &who).await;
                keyed.push(report);
                frames.extend(frame);
            }
            // The frames of a subtask's keyed files, its incremental chain as a whole.
            if m.has_identity_frames()
                && frames.len() == state.keyed.len()
                && let Err(reason) =
                    verify::check_keyed_frames(m, op.operator_id, index, &state.keyed, &frames)
                && let Some(last) = state.keyed.last()
            {
                let subject = self.subject(&last.stream, &format!("keyed state of {who}"));
                self.problems.push(Problem {
                    file: subject.file,
                    reason: format!("{}{reason}", subject.prefix),
                });
                if let Some(r) = keyed.last_mut() {
                    r.verification.ok = false;
                    r.verification.detail = reason;
                }
            }
            let mut operator = Vec::with_capacity(state.operator.len());
            for h in &state.operator {
                operator.push(self.operator_state(m, op, index, h, &who).await);
            }
            let mut native = Vec::with_capacity(state.native.len());
            for h in &state.native {
                native.push(self.native(m, op.operator_id, index, h, &who).await);
            }
            subtasks.push(SubtaskReport {
                subtask: index,
                keyed,
                operator,
                native,
            });
        }
        OperatorReport {
            operator_id: op.operator_id.to_string(),
            uid: op.uid.clone(),
            name: op.name.clone(),
            parallelism: op.parallelism,
            max_parallelism: op.max_parallelism,
            state_size: op.state_size(),
            subtasks,
        }
    }

    /// Checks one keyed handle as a restore reads it (the header by its range), then the
    /// whole file: size, digest, identity frame (returned, for the chain check) and every
    /// key-group section.
    async fn keyed(
        &mut self,
        m: &CheckpointMetadata,
        op: &OperatorState,
        h: &KeyedStateHandle,
        who: &str,
    ) -> (KeyedHandleReport, Option<FileIdentity>) {
        self.note_file(&h.stream);
        let subject = self.subject(&h.stream, &format!("keyed state of {who}"));
        let mut errors: Vec<String> = Vec::new();
        let range = h.key_group_range;

        // The header, read by its range as a restore reads it.
        let mut states = Vec::new();
        let mut header_max_parallelism = None;
        match self
            .opened
            .storage
            .read_state(self.location, &h.stream, Some(h.header))
            .await
        {
            Ok(bytes) => match verify::check_keyed_header(op, h, &bytes) {
                Ok(header) => {
                    header_max_parallelism = Some(header.max_parallelism);
                    states = header
                        .states
                        .iter()
                        .map(|s| KeyedStateReport {
                            id: s.id,
                            name: s.name.clone(),
                            kind: s.kind.to_string(),
                            key_type: s.key_type.clone(),
                            value_type: s.value_type.clone(),
                            serializer_version: s.serializer_version,
                        })
                        .collect();
                }
                Err(e) => errors.extend(e),
            },
            Err(e) => errors.push(format!("header: {}", reason_of(&e))),
        }

        // The whole stream (size and digest of a file), its frame, then every section.
        let mut sections_checked = None;
        let mut frame = None;
        match self.read_whole(&h.stream).await {
            Ok(bytes) => {
                if h.end != bytes.len() as u64 {
                    errors.push(format!(
                        "the handle says the stream ends at byte {}, it has {} bytes",
                        h.end,
                        bytes.len()
                    ));
                }
                if m.has_identity_frames() {
                    match weir_core::identity::open_frame(&bytes) {
                        Ok((identity, _)) => frame = Some(identity),
                        Err(e) => errors.push(e.to_string()),
                    }
                }
                match check_sections(h, &bytes) {
                    Ok(n) => sections_checked = Some(n),
                    Err(section_errors) => errors.extend(section_errors),
                }
            }
            Err(reason) => {
                errors.push(reason);
                // Locate the damage: the key groups whose sections fail their own checksums.
                if let Some(raw) = self.read_raw(&h.stream).await
                    && let Err(section_errors) = check_sections(h, &raw)
                {
                    errors.extend(section_errors);
                }
            }
        }

        let verification = self.conclude(
            &subject,
            errors,
            match (&h.stream, sections_checked) {
                (StreamStateHandle::Inline(_), Some(n)) => format!(
                    "inline (covered by _metadata's checksum); header and {n} key-group sections \
                     checked"
                ),
                (_, Some(n)) => format!(
                    "size and {} match; header and {n} key-group sections checked",
                    checksum_name(&h.stream)
                ),
                (_, None) => String::new(),
            },
        );
        let report = KeyedHandleReport {
            key_groups: range.into(),
            max_parallelism: header_max_parallelism,
            states,
            size: h.stream.size(),
            stream: self.stream_report(&h.stream),
            verification,
        };
        (report, frame)
    }

    async fn operator_state(
        &mut self,
        m: &CheckpointMetadata,
        op: &OperatorState,
        subtask: u32,
        h: &OperatorStateHandle,
        who: &str,
    ) -> OperatorHandleReport {
        self.note_file(&h.stream);
        let subject = self.subject(&h.stream, &format!("operator state of {who}"));
        let mut errors = Vec::new();
        match self.read_whole(&h.stream).await {
            Ok(bytes) => {
                let expected =
                    verify::expected(m, op.operator_id, subtask, None, StateFileKind::Operator);
                if let Err(e) = verify::open_file(m, &bytes, &expected)
                    .and_then(|at| verify::check_operator_payload(h, &bytes[at..]))
                {
                    errors.push(e);
                }
            }
            Err(reason) => errors.push(reason),
        }
        let verification = self.conclude(
            &subject,
            errors,
            if matches!(h.stream, StreamStateHandle::Inline(_)) {
                "inline (covered by _metadata's checksum); content decoded".to_string()
            } else {
                format!(
                    "size and {} match; content decoded",
                    checksum_name(&h.stream)
                )
            },
        );
        OperatorHandleReport {
            states: h
                .states
                .iter()
                .map(|(name, mode)| OperatorStateEntry {
                    name: name.clone(),
                    mode: verify::mode_name(*mode).to_string(),
                })
                .collect(),
            size: h.stream.size(),
            stream: self.stream_report(&h.stream),
            verification,
        }
    }

    /// Verifies the channel-state file of one subtask's in-flight data: its size and digest, its
    /// identity frame and envelope, every section's batch framing and record count, and the
    /// sections against the summaries `_metadata` records for them.
    async fn in_flight(
        &mut self,
        m: &CheckpointMetadata,
        entry: &SubtaskInFlight,
    ) -> InFlightReport {
        let h = &entry.handle;
        let op = operator_by_id(m, entry.operator_id);
        let who = match op {
            Some(op) => verify::who(op, entry.subtask),
            None => format!("operator {}, subtask {}", entry.operator_id, entry.subtask),
        };
        self.note_file(&h.stream);
        let subject = self.subject(&h.stream, &format!("in-flight data of {who}"));
        let mut errors = Vec::new();
        let mut checked = None;
        match self.read_whole(&h.stream).await {
            Ok(bytes) => {
                let expected = verify::expected(
                    m,
                    entry.operator_id,
                    entry.subtask,
                    None,
                    StateFileKind::ChannelState,
                );
                match verify::open_file(m, &bytes, &expected) {
                    Ok(at) => match verify::check_channel_payload(
                        &h.sections,
                        &bytes[at..],
                        MAX_SECTION_PROBLEMS,
                    ) {
                        Ok(sections) => checked = Some(sections.len()),
                        Err(e) => errors.extend(e),
                    },
                    Err(e) => errors.push(e),
                }
            }
            Err(reason) => errors.push(reason),
        }
        let verification = self.conclude(
            &subject,
            errors,
            match (&h.stream, checked) {
                (StreamStateHandle::Inline(_), Some(n)) => format!(
                    "inline (covered by _metadata's checksum); {n} section{} decoded and checked \
                     against _metadata",
                    if n == 1 { "" } else { "s" }
                ),
                (_, Some(n)) => format!(
                    "size and {} match; {n} section{} decoded and checked against _metadata",
                    checksum_name(&h.stream),
                    if n == 1 { "" } else { "s" }
                ),
                (_, None) => String::new(),
            },
        );
        let name_of = |id: OperatorId| operator_by_id(m, id).map(|o| o.name.clone());
        InFlightReport {
            operator_id: entry.operator_id.to_string(),
            operator: op.map(|o| o.name.clone()),
            uid: op.and_then(|o| o.uid.clone()),
            subtask: entry.subtask,
            size: h.size(),
            records: saturating_sum(h.sections.iter().map(|s| s.records)),
            stream: self.stream_report(&h.stream),
            sections: h
                .sections
                .iter()
                .map(|s| ChannelSectionReport {
                    direction: verify::direction_name(s.direction).to_string(),
                    channel: s.channel.to_string(),
                    from_operator_id: s.channel.from.to_string(),
                    from_operator: name_of(s.channel.from),
                    producer: s.channel.producer,
                    to_operator_id: s.channel.to.to_string(),
                    to_operator: name_of(s.channel.to),
                    consumer: s.channel.consumer,
                    records: s.records,
                    bytes: s.bytes,
                })
                .collect(),
            verification,
        }
    }

    /// Records a stream's errors as problems and returns its verification.
    pub(super) fn conclude(
        &mut self,
        subject: &Subject,
        errors: Vec<String>,
        ok: String,
    ) -> Verification {
        if errors.is_empty() {
            return Verification {
                ok: true,
                detail: ok,
            };
        }
        let detail = errors.join("; ");
        for e in errors {
            self.problems.push(Problem {
                file: subject.file.clone(),
                reason: format!("{}{e}", subject.prefix),
            });
        }
        Verification { ok: false, detail }
    }
}

/// Checks every key-group section of a whole keyed-state stream; returns how many were checked,
/// or what failed (at most [`MAX_SECTION_PROBLEMS`] section failures, then a count).
fn check_sections(h: &KeyedStateHandle, stream: &[u8]) -> Result<usize, Vec<String>> {
    let part = whole_stream_part(h, stream).map_err(|e| vec![e.to_string()])?;
    let header = SnapshotHeader::decode(part.header).map_err(|e| vec![e.to_string()])?;
    verify::check_keyed_sections(&header, &part, &h.key_group_range, MAX_SECTION_PROBLEMS)
}

/// How a file handle's bytes are checked, for verdicts.
pub(super) fn checksum_name(stream: &StreamStateHandle) -> &'static str {
    match stream {
        StreamStateHandle::LegacyFile { .. } => "CRC-32",
        _ => "xxh3-128 digest",
    }
}

fn operator_by_id(m: &CheckpointMetadata, id: OperatorId) -> Option<&OperatorState> {
    m.operators.iter().find(|o| o.operator_id == id)
}
