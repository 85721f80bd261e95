//! Reading a checkpoint's files for a restore, checked: keyed headers and sections, native
//! manifests, operator state, and the files a task manager cannot reach itself.

use super::RestorePoint;
use crate::error::JobError;
use crate::operator::{KeyedSections, NativeSource, RestoredKeyed, RestoredNative};
use crate::verify;
use weir_checkpoint::OperatorState;
use weir_checkpoint::storage::CheckpointLocation;
use weir_checkpoint::{CheckpointError, CheckpointStorage};
use weir_core::handle::{KeyedStateHandle, NativeKeyedHandle, StreamStateHandle};
use weir_core::identity::StateFileKind;
use weir_core::ids::SubtaskIndex;
use weir_core::keygroup::KeyGroupRange;
use weir_state::RestorePart;

/// A corrupt-checkpoint error naming `file` (relative to the storage root).
pub(super) fn corrupt(file: String, reason: String) -> JobError {
    JobError::Storage(CheckpointError::Corrupt { path: file, reason })
}

/// The file a stream is in, relative to the storage root, for errors: `_metadata` for inline
/// state.
pub(super) fn file_of(point: &RestorePoint, stream: &StreamStateHandle) -> String {
    verify::stream_file(&point.location, stream)
}

/// Checks the identity frame of every keyed file, each subtask's chain as a whole, before any
/// section is read.
pub(super) async fn verify_keyed_frames(point: &RestorePoint) -> Result<(), JobError> {
    let meta = &point.metadata;
    if !meta.has_identity_frames() {
        return Ok(());
    }
    for op in &meta.operators {
        for (&subtask, state) in &op.subtasks {
            let mut frames = Vec::with_capacity(state.keyed.len());
            for h in &state.keyed {
                let frame = verify::read_keyed_frame(&*point.storage, &point.location, h)
                    .await
                    .map_err(|e| match e {
                        verify::FrameError::Temporary(e) => JobError::Storage(e),
                        verify::FrameError::Damaged(reason) => {
                            corrupt(file_of(point, &h.stream), reason)
                        }
                    })?;
                frames.push(frame);
            }
            verify::check_keyed_frames(meta, op.operator_id, subtask, &state.keyed, &frames)
                .map_err(|reason| {
                    let file = state.keyed.last().map_or_else(
                        || point.location.metadata_path(),
                        |h| file_of(point, &h.stream),
                    );
                    corrupt(
                        file,
                        format!("keyed state of {}: {reason}", verify::who(op, subtask)),
                    )
                })?;
        }
    }
    Ok(())
}

/// Reads and checks each old subtask's operator-state blobs (their payloads, without frames).
pub(super) async fn read_operator_state(
    point: &RestorePoint,
    op: &OperatorState,
) -> Result<Vec<Vec<Vec<u8>>>, JobError> {
    let meta = &point.metadata;
    let mut old_blobs = Vec::with_capacity(op.subtasks.len());
    for (&subtask, state) in &op.subtasks {
        let mut blobs = Vec::new();
        for h in &state.operator {
            let bytes = point
                .storage
                .read_state(&point.location, &h.stream, None)
                .await?;
            let expected =
                verify::expected(meta, op.operator_id, subtask, None, StateFileKind::Operator);
            let payload = verify::open_file(meta, &bytes, &expected)
                .and_then(|at| {
                    let payload = &bytes[at..];
                    verify::check_operator_payload(h, payload).map(|()| payload)
                })
                .map_err(|reason| corrupt(file_of(point, &h.stream), reason))?;
            blobs.push(payload.to_vec());
        }
        old_blobs.push(blobs);
    }
    Ok(old_blobs)
}

/// Reads the part of a keyed handle a subtask owning `range` restores, checked: the header,
/// and, unless the subtask fetches them itself (`fetch_sections`: its state backend keeps
/// files), the sections it owns. `None` when they do not overlap.
pub(super) async fn read_keyed(
    point: &RestorePoint,
    op: &OperatorState,
    h: &KeyedStateHandle,
    range: &KeyGroupRange,
    checks: &super::RestoreChecks<'_>,
) -> Result<Option<RestoredKeyed>, JobError> {
    let fetch_sections = checks.subtasks_fetch_sections;
    let Some((start, end)) = h.byte_range_for(range) else {
        return Ok(None);
    };
    let file = || file_of(point, &h.stream);
    let whole = range.intersection(&h.key_group_range) == h.key_group_range;
    if !fetch_sections {
        let r = read_keyed_sections(&*point.storage, &point.location, h, range, op).await?;
        return Ok(Some(r));
    }
    let header = point
        .storage
        .read_state(&point.location, &h.stream, Some(h.header))
        .await?
        .to_vec();
    verify::check_keyed_header(op, h, &header).map_err(|e| corrupt(file(), e.join("; ")))?;
    Ok(Some(RestoredKeyed {
        handle: h.clone(),
        header,
        sections: KeyedSections::Stored {
            stream: h.stream.clone(),
            end,
            whole,
            range: *range,
            location_dir: point.location.dir.clone(),
            storage: Some(point.storage.clone()),
            storage_location: checks.storage_location.clone(),
        },
        sections_offset: start,
    }))
}

/// Reads the header and the sections of `h` a subtask owning `range` restores into memory,
/// checked: the whole file (size, digest) when the subtask owns all its key groups, else the
/// header and the sections by range; then the header (against `op`'s record in `_metadata`)
/// and every section.
async fn read_keyed_sections(
    storage: &dyn CheckpointStorage,
    location: &CheckpointLocation,
    h: &KeyedStateHandle,
    range: &KeyGroupRange,
    op: &OperatorState,
) -> Result<RestoredKeyed, JobError> {
    let file = || verify::stream_file(location, &h.stream);
    let (start, end) = h.byte_range_for(range).ok_or_else(|| {
        corrupt(
            file(),
            format!(
                "the handle of key groups {} has no bytes for {range}",
                h.key_group_range
            ),
        )
    })?;
    let whole = range.intersection(&h.key_group_range) == h.key_group_range;
    let r = if whole {
        // One read of the whole file, so its size and digest are checked too (the frame was
        // checked with its chain).
        let bytes = storage.read_state(location, &h.stream, None).await?;
        let part = weir_state::format::whole_shared_stream_part(h, &bytes)
            .map_err(|e| corrupt(file(), e.to_string()))?;
        RestoredKeyed {
            handle: h.clone(),
            header: part.header.to_vec(),
            sections: KeyedSections::Read(part.sections.clone()),
            sections_offset: part.sections_offset,
        }
    } else {
        let header = storage
            .read_state(location, &h.stream, Some(h.header))
            .await?
            .to_vec();
        let sections = storage
            .read_state(location, &h.stream, Some((start, end)))
            .await?;
        RestoredKeyed {
            handle: h.clone(),
            header,
            sections: KeyedSections::Read(sections),
            sections_offset: start,
        }
    };
    let KeyedSections::Read(sections) = &r.sections else {
        return Err(corrupt(file(), "the sections were not read".into()));
    };
    let header =
        verify::check_keyed_header(op, h, &r.header).map_err(|e| corrupt(file(), e.join("; ")))?;
    let part = RestorePart {
        handle: &r.handle,
        header: &r.header,
        sections: sections.clone(),
        sections_offset: r.sections_offset,
    };
    verify::check_keyed_sections(&header, &part, range, 1)
        .map_err(|e| corrupt(file(), e.join("; ")))?;
    Ok(r)
}

/// Reads the manifest of a native keyed snapshot, checked (size and digest, then its identity
/// frame: this job, operator and subtask, the manifest's kind and key groups), and lists the
/// files a subtask owning `range` needs, with what each one's identity frame must say. The
/// subtask fetches and checks the files itself: a restore's time does not grow with the state
/// it restores when the files are on its disk already (local recovery). `None` when the
/// snapshot's key groups do not overlap `range`.
pub(super) async fn read_native(
    point: &RestorePoint,
    op: &OperatorState,
    subtask: SubtaskIndex,
    h: &NativeKeyedHandle,
    range: &KeyGroupRange,
) -> Result<Option<RestoredNative>, JobError> {
    if h.key_group_range.intersection(range).is_empty() {
        return Ok(None);
    }
    let meta = &point.metadata;
    let kind = StateFileKind::NativeManifest;
    let bytes = point
        .storage
        .read_state(&point.location, &h.manifest, None)
        .await?;
    let (_, len) = verify::check_native_frame(
        meta,
        op.operator_id,
        subtask,
        h.key_group_range,
        kind,
        &bytes,
    )
    .map_err(|reason| {
        corrupt(
            file_of(point, &h.manifest),
            format!("{kind} of {}: {reason}", verify::who(op, subtask)),
        )
    })?;
    let files = h
        .files
        .iter()
        .map(|f| {
            (!f.key_groups.intersection(range).is_empty()).then(|| NativeSource::Stored {
                stream: f.stream.clone(),
                expected: verify::expected(
                    meta,
                    op.operator_id,
                    subtask,
                    Some(f.key_groups),
                    StateFileKind::NativeFile,
                ),
            })
        })
        .collect();
    Ok(Some(RestoredNative {
        handle: h.clone(),
        manifest: bytes.slice(len..),
        files,
        location_dir: point.location.dir.clone(),
        checkpoint: meta.checkpoint_id,
        storage: Some(point.storage.clone()),
    }))
}

/// Reads, for subtasks on task managers, the native files of a restore point in a storage other
/// than the job's (which task managers may not reach): each read whole and checked (size,
/// digest, identity frame) and sent with the deployment.
#[cfg(feature = "cluster")]
pub(crate) async fn fetch_foreign_native(
    tasks: &mut [crate::spec::TaskDeployment],
) -> Result<(), JobError> {
    for t in tasks {
        for state in t.restore.operators.values_mut() {
            for r in &mut state.native {
                let Some(storage) = r.storage.take() else {
                    continue;
                };
                let location = CheckpointLocation {
                    dir: r.location_dir.clone(),
                };
                for source in r.files.iter_mut() {
                    let Some(NativeSource::Stored { stream, expected }) = source else {
                        continue;
                    };
                    let file = verify::stream_file(&location, stream);
                    let bytes = storage.read_state(&location, stream, None).await?;
                    let (identity, len) = weir_core::identity::open_frame(&bytes)
                        .map_err(|e| corrupt(file.clone(), e.to_string()))?;
                    verify::check_native_identity(&identity, expected)
                        .map_err(|e| corrupt(file, e))?;
                    *source = Some(NativeSource::Fetched(bytes.slice(len..)));
                }
            }
        }
    }
    Ok(())
}
