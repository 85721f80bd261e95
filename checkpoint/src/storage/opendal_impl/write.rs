//! Writing: state files (in one request, as multipart uploads, or streamed from a local
//! file), shared state, and `_metadata` (renamed into place where the service can rename).

use super::OpendalCheckpointStorage;
use super::names::{METADATA_FILE, METADATA_INPROGRESS_FILE, dir_of, resolve, validate_state_name};
use crate::storage::{
    CheckpointLocation, CheckpointStorage, SHARED_DIR_FROM_LOCATION, local_file_error,
};
use crate::{CheckpointError, CheckpointMetadata};
use bytes::Bytes;
use tracing::debug;
use weir_core::handle::StreamStateHandle;
use weir_core::identity::Digest;

/// The part size of multipart uploads, on services that have them (S3's minimum is 5 MiB).
const MULTIPART_CHUNK: usize = 8 * 1024 * 1024;
/// How many parts of one file are uploaded at once.
const MULTIPART_CONCURRENCY: usize = 4;
/// How much of a local file a streamed upload reads at a time. The writer gathers pieces into
/// parts where the service has them; on a file system each piece goes straight to the file.
const UPLOAD_PIECE: u64 = 1 << 20;

/// How a streamed write failed: reading the local file, or writing to the storage.
enum Streamed {
    Local(CheckpointError),
    Storage(opendal::Error),
}

impl From<opendal::Error> for Streamed {
    fn from(e: opendal::Error) -> Streamed {
        Streamed::Storage(e)
    }
}

impl OpendalCheckpointStorage {
    /// Writes a state file: in one request, or as a multipart upload when the service has them
    /// and the file is larger than one part.
    pub(super) async fn write_file(&self, path: &str, bytes: Bytes) -> Result<(), CheckpointError> {
        let result = if self.op.info().capability().write_can_multi && bytes.len() > MULTIPART_CHUNK
        {
            self.op
                .write_with(path, bytes)
                .chunk(MULTIPART_CHUNK)
                .concurrent(MULTIPART_CONCURRENCY)
                .await
        } else {
            self.op.write(path, bytes).await
        };
        result.map(|_| ()).map_err(self.storage_err(path))
    }

    /// `CheckpointStorage::write_state` for this storage.
    pub(super) async fn write_location_state(
        &self,
        location: &CheckpointLocation,
        name: &str,
        bytes: Bytes,
    ) -> Result<StreamStateHandle, CheckpointError> {
        validate_state_name(name)?;
        let dir = dir_of(location);
        if bytes.len() <= self.inline_threshold {
            debug!(location = %self.full_path(&dir), name, size = bytes.len(), "inlined state");
            return Ok(StreamStateHandle::Inline(bytes.to_vec()));
        }
        let path = format!("{dir}{name}");
        let size = bytes.len() as u64;
        let digest = Digest::of(&bytes);
        self.write_file(&path, bytes).await?;
        debug!(path = %self.full_path(&path), size, %digest, "wrote state file");
        Ok(StreamStateHandle::File {
            path: name.to_string(),
            size,
            digest,
        })
    }

    /// `CheckpointStorage::write_shared_state` for this storage.
    pub(super) async fn write_shared_bytes(
        &self,
        location: &CheckpointLocation,
        name: &str,
        bytes: Bytes,
    ) -> Result<StreamStateHandle, CheckpointError> {
        validate_state_name(name)?;
        let dir = dir_of(location);
        let shared = resolve(&dir, &format!("{SHARED_DIR_FROM_LOCATION}{name}"))?;
        if bytes.len() <= self.inline_threshold {
            debug!(path = %self.full_path(&shared), size = bytes.len(), "inlined shared state");
            return Ok(StreamStateHandle::Inline(bytes.to_vec()));
        }
        let size = bytes.len() as u64;
        let digest = Digest::of(&bytes);
        self.write_file(&shared, bytes).await?;
        debug!(path = %self.full_path(&shared), size, %digest, "wrote shared state file");
        Ok(StreamStateHandle::File {
            path: format!("{SHARED_DIR_FROM_LOCATION}{name}"),
            size,
            digest,
        })
    }

    /// `CheckpointStorage::write_shared_state_from_file` for this storage.
    pub(super) async fn stream_shared_file(
        &self,
        location: &CheckpointLocation,
        name: &str,
        head: Bytes,
        path: &std::path::Path,
        len: u64,
    ) -> Result<StreamStateHandle, CheckpointError> {
        validate_state_name(name)?;
        let total = head.len() as u64 + len;
        if total <= self.inline_threshold as u64 {
            // Inline in `_metadata`, as `write_shared_state` keeps it.
            let bytes = crate::storage::concat_local(head, path, len).await?;
            return self.write_shared_state(location, name, bytes).await;
        }
        let dir = dir_of(location);
        let shared = resolve(&dir, &format!("{SHARED_DIR_FROM_LOCATION}{name}"))?;
        let err = self.storage_err(&shared);
        // On a local file system (which opendal also gives concurrent positioned writes) the
        // pieces go to the file one after another, so an upload holds one piece: 8 MiB parts,
        // 4 at once, held ~78 MB over a 20M-key disk-backend run's two uploading subtasks
        // (heaptrack, 2026-12-03). Object stores keep their multipart parts (a file smaller
        // than one is one request when it closes). Every file above the inline threshold comes
        // this way: reading a run below 8 MiB whole, and copying it behind its frame, held
        // ~33 MB of a 50M-key run's heap.
        let multipart =
            self.op.info().capability().write_can_multi && self.op.info().scheme() != "fs";
        let mut writer = if multipart {
            self.op
                .writer_with(&shared)
                .chunk(MULTIPART_CHUNK)
                .concurrent(MULTIPART_CONCURRENCY)
                .await
        } else {
            self.op.writer(&shared).await
        }
        .map_err(err)?;
        let mut hasher = weir_core::identity::DigestHasher::new();
        hasher.update(&head);
        let streamed = async {
            writer.write(head).await?;
            // One piece of the file in memory at a time, read off the runtime's threads.
            let mut file = Some(
                std::fs::File::open(path)
                    .map_err(|e| local_file_error(path, e.to_string()))
                    .map_err(Streamed::Local)?,
            );
            let mut left = len;
            while left > 0 {
                let want = left.min(UPLOAD_PIECE) as usize;
                let mut f = file.take().ok_or_else(|| {
                    Streamed::Local(local_file_error(path, "lost the file".into()))
                })?;
                let (f, part) = tokio::task::spawn_blocking(move || {
                    use std::io::Read;
                    let mut part = vec![0u8; want];
                    let read = f.read_exact(&mut part);
                    (f, read.map(|_| part))
                })
                .await
                .map_err(|e| Streamed::Local(local_file_error(path, e.to_string())))?;
                let part = part.map_err(|e| {
                    Streamed::Local(local_file_error(
                        path,
                        format!("{e} after {} of {len} bytes", len - left),
                    ))
                })?;
                file = Some(f);
                hasher.update(&part);
                writer.write(part).await?;
                left -= want as u64;
            }
            // A longer file than expected is another file.
            let longer = file.as_mut().is_some_and(|f| {
                use std::io::Read;
                f.read(&mut [0u8; 1]).is_ok_and(|n| n > 0)
            });
            if longer {
                return Err(Streamed::Local(local_file_error(
                    path,
                    format!("longer than the {len} bytes expected"),
                )));
            }
            writer.close().await?;
            Ok::<_, Streamed>(())
        }
        .await;
        if let Err(e) = streamed {
            let _ = writer.abort().await;
            return Err(match e {
                Streamed::Local(e) => e,
                Streamed::Storage(e) => self.storage_err(&shared)(e),
            });
        }
        let digest = hasher.finish();
        debug!(path = %self.full_path(&shared), size = total, %digest, "streamed shared state file");
        Ok(StreamStateHandle::File {
            path: format!("{SHARED_DIR_FROM_LOCATION}{name}"),
            size: total,
            digest,
        })
    }

    /// `CheckpointStorage::write_metadata` for this storage.
    pub(super) async fn write_metadata_file(
        &self,
        location: &CheckpointLocation,
        metadata: &CheckpointMetadata,
    ) -> Result<(), CheckpointError> {
        let dir = dir_of(location);
        let bytes = metadata.to_bytes()?;
        let size = bytes.len();
        let target = format!("{dir}{METADATA_FILE}");
        if self.can_rename() {
            let temp = format!("{dir}{METADATA_INPROGRESS_FILE}");
            self.op
                .write(&temp, bytes)
                .await
                .map_err(self.storage_err(&temp))?;
            if let Err(e) = self.op.rename(&temp, &target).await {
                // Best effort: leave no half-done metadata behind; the rename error is the one
                // that matters.
                if let Err(cleanup) = self.op.delete(&temp).await {
                    debug!(path = %self.full_path(&temp), error = %cleanup, "could not remove in-progress metadata");
                }
                return Err(self.storage_err(&target)(e));
            }
        } else {
            self.op
                .write(&target, bytes)
                .await
                .map_err(self.storage_err(&target))?;
        }
        debug!(
            path = %self.full_path(&target),
            size,
            checkpoint = metadata.checkpoint_id.0,
            "wrote checkpoint metadata"
        );
        Ok(())
    }
}
