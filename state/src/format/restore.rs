//! Slicing the bytes handed to a restore into the header and each key group's section.

use crate::StateError;
use weir_core::handle::KeyedStateHandle;
use weir_core::keygroup::{KeyGroup, KeyGroupRange};

/// The sections of the key groups in `range` (intersected with the part's own range), sliced out
/// of a restore part with its handle's offsets, in key-group order. The sections are not checked
/// yet; see [`parse_section`](super::parse_section).
pub fn part_sections<'p>(
    part: &'p RestorePart<'_>,
    range: &KeyGroupRange,
) -> Result<Vec<(KeyGroup, &'p [u8])>, StateError> {
    let spans = section_spans(
        part.handle,
        part.sections_offset,
        part.sections.len() as u64,
        range,
    )?;
    let mut out = Vec::with_capacity(spans.len());
    for (kg, span) in spans {
        let bytes = usize::try_from(span.start)
            .ok()
            .zip(usize::try_from(span.end).ok())
            .and_then(|(start, end)| part.sections.get(start..end));
        match bytes {
            Some(bytes) => out.push((kg, bytes)),
            None => {
                return Err(StateError::Restore(format!(
                    "key group {kg}'s section is out of the part's bytes"
                )));
            }
        }
    }
    Ok(out)
}

/// Where the sections of the key groups in `range` (intersected with the handle's own) are in a
/// run of `available` bytes of the stream that starts at `sections_offset`: each as a range
/// within that run, in key-group order, checked against the handle's offsets and the run's
/// bounds. The sections themselves are not checked yet.
pub(crate) fn section_spans(
    handle: &KeyedStateHandle,
    sections_offset: u64,
    available: u64,
    range: &KeyGroupRange,
) -> Result<Vec<(KeyGroup, std::ops::Range<u64>)>, StateError> {
    let own = handle.key_group_range;
    if handle.offsets.len() != own.len() as usize {
        return Err(StateError::Restore(format!(
            "the handle for key groups {own} has {} section offsets, expected {}",
            handle.offsets.len(),
            own.len()
        )));
    }
    let overlap = own.intersection(range);
    let mut out = Vec::with_capacity(overlap.len() as usize);
    let part_end = sections_offset.saturating_add(available);
    for kg in overlap.iter() {
        let i = (kg - own.start) as usize;
        let (Some(&start), end) = (handle.offsets.get(i), handle.offsets.get(i + 1)) else {
            return Err(StateError::Restore(format!(
                "no section offset for key group {kg}"
            )));
        };
        let end = end.copied().unwrap_or(handle.end);
        if end < start || start < sections_offset || end > part_end {
            return Err(StateError::Restore(format!(
                "key group {kg}'s section [{start}, {end}) is not inside the bytes handed to the \
                 restore [{sections_offset}, {part_end})"
            )));
        }
        out.push((kg, start - sections_offset..end - sections_offset));
    }
    Ok(out)
}

/// A restore part for a whole snapshot stream held in memory (an inline handle, a file read
/// whole): slices the header and the sections out of `stream` with the handle's offsets. The
/// sections are copied; [`whole_shared_stream_part`] shares them.
pub fn whole_stream_part<'a>(
    handle: &'a KeyedStateHandle,
    stream: &'a [u8],
) -> Result<RestorePart<'a>, StateError> {
    let (header, sections) = split_stream(handle, stream)?;
    Ok(RestorePart {
        handle,
        header: &stream[header],
        sections: bytes::Bytes::copy_from_slice(&stream[sections]),
        sections_offset: handle.header.1,
    })
}

/// [`whole_stream_part`] for a stream in shared bytes: the part's sections are a slice of
/// `stream`, not a copy.
pub fn whole_shared_stream_part<'a>(
    handle: &'a KeyedStateHandle,
    stream: &'a bytes::Bytes,
) -> Result<RestorePart<'a>, StateError> {
    let (header, sections) = split_stream(handle, stream)?;
    Ok(RestorePart {
        handle,
        header: &stream[header],
        sections: stream.slice(sections),
        sections_offset: handle.header.1,
    })
}

/// The byte ranges of a whole stream's header and sections, checked against its length.
fn split_stream(
    handle: &KeyedStateHandle,
    stream: &[u8],
) -> Result<(std::ops::Range<usize>, std::ops::Range<usize>), StateError> {
    let (h_start, h_end) = handle.header;
    let bad = || {
        StateError::Restore(format!(
            "the handle's header range [{h_start}, {h_end}) and end {} do not fit a stream of {} \
             bytes",
            handle.end,
            stream.len()
        ))
    };
    let h_start = usize::try_from(h_start).map_err(|_| bad())?;
    let h_end = usize::try_from(h_end).map_err(|_| bad())?;
    let end = usize::try_from(handle.end).map_err(|_| bad())?;
    if h_start > h_end || h_end > end {
        return Err(bad());
    }
    if end > stream.len() {
        return Err(bad());
    }
    Ok((h_start..h_end, h_end..end))
}

/// Bytes of one snapshot handed to a restore: the header, and a contiguous run of key-group
/// sections that starts at `sections_offset` within the original stream.
#[derive(Debug)]
pub struct RestorePart<'a> {
    /// The handle the bytes belong to.
    pub handle: &'a KeyedStateHandle,
    /// The bytes of `handle.header`.
    pub header: &'a [u8],
    /// Bytes of the sections, starting at `sections_offset`. Shared: a backend may keep slices
    /// of them (the blocks of states not registered yet) without copying.
    pub sections: bytes::Bytes,
    /// Offset of `sections[0]` within the stream.
    pub sections_offset: u64,
}

/// One snapshot handed to a restore in a local file instead of in memory: the header's bytes,
/// and `len` bytes of a file, from byte `at`, holding a contiguous run of key-group sections
/// that starts at `sections_offset` within the original stream. Several parts may share a file
/// (a subtask's downloads of one operator's snapshots, one after the other), which a backend
/// then opens once. A backend that keeps files reads the sections from it as it needs them, so
/// that a restore larger than memory is never held in memory whole; another reads the part
/// whole (see
/// [`KeyedStateBackend::restore_file_parts`](crate::KeyedStateBackend::restore_file_parts)).
#[derive(Debug)]
pub struct RestoreFilePart<'a> {
    /// The handle the bytes belong to.
    pub handle: &'a KeyedStateHandle,
    /// The bytes of `handle.header`.
    pub header: &'a [u8],
    /// The file. The backend opens it during the restore and may keep it open (it may be
    /// unlinked after the restore returns).
    pub path: &'a std::path::Path,
    /// Where in the file the part's bytes begin.
    pub at: u64,
    /// How many bytes of the file, from `at`, are the part's.
    pub len: u64,
    /// Offset of the part's first byte within the stream.
    pub sections_offset: u64,
}

/// The bytes of a file part, read whole.
pub(crate) fn read_file_part(part: &RestoreFilePart<'_>) -> Result<Vec<u8>, StateError> {
    use std::os::unix::fs::FileExt;
    let failed = |reason: String| StateError::Disk {
        path: part.path.to_path_buf(),
        reason,
    };
    let len = usize::try_from(part.len).map_err(|_| {
        failed(format!(
            "a part of {} bytes does not fit in memory",
            part.len
        ))
    })?;
    let file = std::fs::File::open(part.path)
        .map_err(|e| failed(format!("cannot open the restored sections: {e}")))?;
    let mut bytes = vec![0; len];
    file.read_exact_at(&mut bytes, part.at).map_err(|e| {
        failed(format!(
            "cannot read bytes [{}, {}) of the restored sections: {e}",
            part.at,
            part.at.saturating_add(part.len)
        ))
    })?;
    Ok(bytes)
}
