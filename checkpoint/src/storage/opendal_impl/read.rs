//! Reading: state (whole files checked against their handle's size and digest, and ranges),
//! and `_metadata` (refused unread when too large).

use super::OpendalCheckpointStorage;
use super::names::{METADATA_FILE, dir_of, resolve};
use crate::metadata::MAX_METADATA_SIZE;
use crate::storage::CheckpointLocation;
use crate::{CheckpointError, CheckpointMetadata};
use bytes::Bytes;
use opendal::ErrorKind;
use tracing::debug;
use weir_core::handle::StreamStateHandle;
use weir_core::identity::Digest;

/// The error for a range outside the data.
fn range_error(path: String, range: (u64, u64), len: u64) -> CheckpointError {
    CheckpointError::Storage {
        source: opendal::Error::new(
            ErrorKind::RangeNotSatisfied,
            format!(
                "range {}..{} is outside the {len} bytes of the state",
                range.0, range.1
            ),
        ),
        path,
    }
}

impl OpendalCheckpointStorage {
    /// `CheckpointStorage::read_state` for this storage.
    pub(super) async fn read_state_bytes(
        &self,
        location: &CheckpointLocation,
        handle: &StreamStateHandle,
        range: Option<(u64, u64)>,
    ) -> Result<Bytes, CheckpointError> {
        let dir = dir_of(location);
        match handle {
            StreamStateHandle::Inline(data) => match range {
                None => Ok(Bytes::copy_from_slice(data)),
                Some((start, end)) => {
                    let len = data.len() as u64;
                    if start > end || end > len {
                        return Err(range_error(
                            self.full_path(&format!("{dir}<inline state>")),
                            (start, end),
                            len,
                        ));
                    }
                    // Both bounds are at most `data.len()`, so they fit in usize.
                    Ok(Bytes::copy_from_slice(&data[start as usize..end as usize]))
                }
            },
            StreamStateHandle::File { path, size, .. }
            | StreamStateHandle::LegacyFile { path, size, .. } => {
                let rel = resolve(&dir, path)?;
                let full = self.full_path(&rel);
                match range {
                    None => {
                        let data = self
                            .op
                            .read(&rel)
                            .await
                            .map_err(self.storage_err(&rel))?
                            .to_bytes();
                        if data.len() as u64 != *size {
                            return Err(CheckpointError::Corrupt {
                                path: full,
                                reason: format!(
                                    "length mismatch: the handle says {size} bytes, the file has {}{}",
                                    data.len(),
                                    if (data.len() as u64) < *size {
                                        " (truncated)"
                                    } else {
                                        ""
                                    }
                                ),
                            });
                        }
                        if let Err(reason) = check_file_checksum(handle, &data) {
                            return Err(CheckpointError::Corrupt { path: full, reason });
                        }
                        debug!(path = %full, size, "read state file");
                        Ok(data)
                    }
                    Some((start, end)) => {
                        if start > end || end > *size {
                            return Err(range_error(full, (start, end), *size));
                        }
                        if start == end {
                            return Ok(Bytes::new());
                        }
                        let data = match self.op.read_with(&rel).range(start..end).await {
                            Ok(buffer) => buffer.to_bytes(),
                            // The range is inside the handle's size, so the file is shorter
                            // than the handle says.
                            Err(e) if e.kind() == ErrorKind::RangeNotSatisfied => {
                                return Err(CheckpointError::Corrupt {
                                    path: full,
                                    reason: format!(
                                        "truncated: reading {start}..{end} of a {size}-byte file failed: {e}"
                                    ),
                                });
                            }
                            Err(e) => return Err(self.storage_err(&rel)(e)),
                        };
                        if data.len() as u64 != end - start {
                            return Err(CheckpointError::Corrupt {
                                path: full,
                                reason: format!(
                                    "truncated: reading {start}..{end} of a {size}-byte file returned {} bytes",
                                    data.len()
                                ),
                            });
                        }
                        debug!(path = %full, start, end, "read state file range");
                        Ok(data)
                    }
                }
            }
        }
    }

    /// `CheckpointStorage::read_metadata` for this storage.
    pub(super) async fn read_metadata_file(
        &self,
        location: &CheckpointLocation,
    ) -> Result<CheckpointMetadata, CheckpointError> {
        let path = format!("{}{METADATA_FILE}", dir_of(location));
        let full = self.full_path(&path);
        // Refused before it is read: a huge `_metadata` is damage, and reading it whole could
        // exhaust memory instead of falling back to the previous checkpoint.
        let size = self
            .op
            .stat(&path)
            .await
            .map_err(self.storage_err(&path))?
            .content_length();
        let too_big = |size: u64| CheckpointError::Corrupt {
            path: full.clone(),
            reason: format!(
                "the file has {size} bytes, more than the {MAX_METADATA_SIZE} bytes a _metadata may have"
            ),
        };
        if size > MAX_METADATA_SIZE {
            return Err(too_big(size));
        }
        let data = self
            .op
            .read(&path)
            .await
            .map_err(self.storage_err(&path))?
            .to_vec();
        if data.len() as u64 > MAX_METADATA_SIZE {
            return Err(too_big(data.len() as u64));
        }
        let metadata = CheckpointMetadata::from_bytes(&full, &data)?;
        debug!(path = %full, size = data.len(), "read checkpoint metadata");
        Ok(metadata)
    }
}

/// Checks a whole file's bytes against its handle's digest (or a legacy handle's CRC-32).
pub fn check_file_checksum(handle: &StreamStateHandle, data: &[u8]) -> Result<(), String> {
    match handle {
        StreamStateHandle::File { digest, .. } => {
            let actual = Digest::of(data);
            if actual != *digest {
                return Err(format!(
                    "digest mismatch: the handle records xxh3-128 {digest}, the file has {actual}: \
                     the file was changed or replaced"
                ));
            }
        }
        StreamStateHandle::LegacyFile { crc32, .. } => {
            let actual = crc32fast::hash(data);
            if actual != *crc32 {
                return Err(format!(
                    "checksum mismatch: the handle says {crc32:08x}, the file has {actual:08x}"
                ));
            }
        }
        StreamStateHandle::Inline(_) => {}
    }
    Ok(())
}
