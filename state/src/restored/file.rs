//! Restored blocks that stay in the local file a restore was handed: where each one is, and
//! reading it back (its section read and checked again) when its state is registered or
//! written into a snapshot.

use super::{RawBlock, RawEntries, RawGroup, ReadSection};
use crate::StateError;
use crate::format::{self, SnapshotHeader};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use weir_core::CoreError;
use weir_core::keygroup::KeyGroup;

/// A local file of restored sections, open for the restore's lifetime: the blocks of states
/// not registered yet are read from it. It may be unlinked once the restore returns; the open
/// file keeps its bytes until the last block is taken.
#[derive(Debug)]
pub(crate) struct RestoreFile {
    file: File,
    path: PathBuf,
    len: u64,
}

impl RestoreFile {
    /// Opens `path`.
    pub(crate) fn open(path: &Path) -> Result<RestoreFile, StateError> {
        let failed = |e: std::io::Error| StateError::Disk {
            path: path.to_path_buf(),
            reason: format!("cannot open the restored sections: {e}"),
        };
        let file = File::open(path).map_err(failed)?;
        let len = file.metadata().map_err(failed)?.len();
        Ok(RestoreFile {
            file,
            path: path.to_path_buf(),
            len,
        })
    }

    /// The file's path.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// The file's length when it was opened.
    pub(crate) fn len(&self) -> u64 {
        self.len
    }

    /// The bytes at `span`.
    fn read(&self, span: std::ops::Range<u64>) -> Result<Vec<u8>, StateError> {
        let failed = |reason: String| StateError::Disk {
            path: self.path.clone(),
            reason,
        };
        let len = usize::try_from(span.end.saturating_sub(span.start))
            .map_err(|_| failed(format!("the section at {span:?} does not fit in memory")))?;
        let mut bytes = vec![0; len];
        self.file
            .read_exact_at(&mut bytes, span.start)
            .map_err(|e| {
                failed(format!(
                    "cannot read bytes {span:?} of the restored sections: {e}"
                ))
            })?;
        Ok(bytes)
    }
}

/// A restored block in a section of a [`RestoreFile`].
#[derive(Clone, Debug)]
pub(crate) struct FileBlock {
    file: Arc<RestoreFile>,
    /// The section's bytes in the file.
    section: std::ops::Range<u64>,
    key_group: KeyGroup,
    /// Whether the section may hold overlay blocks (format version 3).
    overlays: bool,
    /// The block's place among the section's blocks.
    index: usize,
    /// Its entries' length, decompressed.
    len: usize,
    /// Its entry count.
    entry_count: u32,
}

impl FileBlock {
    /// The entries' length, decompressed.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Reads the block's section back and checks it again (checksum, key group, framing; the
    /// block's place, length and count as the restore found them): the entries.
    pub(crate) fn load(&self) -> Result<bytes::Bytes, StateError> {
        let stored = bytes::Bytes::from(self.file.read(self.section.clone())?);
        let section = format::parse_section_with(self.key_group, &stored, self.overlays)?;
        let block = section
            .get(self.index)
            .filter(|b| b.entries.len() == self.len && b.entry_count == self.entry_count);
        match block {
            Some(block) => Ok(section.shared_entries(&block, &stored)),
            None => Err(StateError::Core(CoreError::Corrupt {
                what: format!(
                    "restored sections at {}, key group {}",
                    self.file.path.display(),
                    self.key_group
                ),
                reason: format!(
                    "block {} ({} entries in {} bytes) is not where the restore found it: the \
                     file changed since",
                    self.index, self.entry_count, self.len
                ),
            })),
        }
    }
}

/// Reads and checks the section of `kg` at `span` of `file`, keeping each block as its place.
pub(super) fn read_section(
    file: &Arc<RestoreFile>,
    header: &SnapshotHeader,
    kg: KeyGroup,
    span: std::ops::Range<u64>,
) -> Result<ReadSection, StateError> {
    let stored = file.read(span.clone())?;
    let section = header.parse_section(kg, &stored)?;
    let overlays = header.version() == format::FORMAT_VERSION_V3;
    Ok(ReadSection {
        compression: section.compression(),
        blocks: section
            .iter()
            .enumerate()
            .map(|(index, block)| {
                let raw = RawGroup {
                    entry_count: block.entry_count,
                    entries: RawEntries::File(FileBlock {
                        file: Arc::clone(file),
                        section: span.clone(),
                        key_group: kg,
                        overlays,
                        index,
                        len: block.entries.len(),
                        entry_count: block.entry_count,
                    }),
                };
                (
                    block.state_id,
                    RawBlock {
                        kind: block.kind,
                        raw,
                    },
                )
            })
            .collect(),
    })
}
