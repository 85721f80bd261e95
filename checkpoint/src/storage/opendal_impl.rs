//! [`CheckpointStorage`](super::CheckpointStorage) over an opendal `Operator`: Flink's layout on
//! any opendal service (fs, memory and s3 here; others through [`OpendalCheckpointStorage::from_operator`]).

use super::{
    CheckpointListing, CheckpointLocation, CheckpointStorage, JobLock, S3Config,
    SHARED_DIR_FROM_LOCATION, join_path, local_file_error,
};
use crate::metadata::MAX_METADATA_SIZE;
use crate::{CheckpointError, CheckpointMetadata};
use async_trait::async_trait;
use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use opendal::{ErrorKind, Operator, services};
use tracing::debug;
use weir_core::handle::StreamStateHandle;
use weir_core::identity::Digest;
use weir_core::ids::{CheckpointId, JobId};

/// The name of the file whose presence marks a checkpoint complete.
const METADATA_FILE: &str = "_metadata";
/// Where `_metadata` is written before it is renamed into place, on services that can rename.
const METADATA_INPROGRESS_FILE: &str = "_metadata.inprogress";
/// How many `_metadata` stats a listing runs at once.
const LIST_CONCURRENCY: usize = 16;
/// The part size of multipart uploads, on services that have them (S3's minimum is 5 MiB).
const MULTIPART_CHUNK: usize = 8 * 1024 * 1024;
/// How many parts of one file are uploaded at once.
const MULTIPART_CONCURRENCY: usize = 4;
/// How much of a local file a streamed upload reads at a time. The writer gathers pieces into
/// parts where the service has them; on a file system each piece goes straight to the file.
const UPLOAD_PIECE: u64 = 1 << 20;

/// Checkpoint storage over any opendal service.
///
/// State at or below the inline threshold is returned as [`StreamStateHandle::Inline`] and ends up
/// inside `_metadata`; larger state becomes a file `<location>/<name>`. `_metadata` is written to
/// `_metadata.inprogress` and renamed into place where the service can rename (fs); elsewhere it
/// is one write, which object stores and the memory service make atomic. On services that
/// upload in parts (S3), a file larger than one part is a multipart upload of 8 MiB parts, four
/// at a time.
#[derive(Clone, Debug)]
pub struct OpendalCheckpointStorage {
    op: Operator,
    /// What [`describe`](CheckpointStorage::describe) says.
    description: String,
    /// What paths in errors and logs start with (the description without any remarks).
    path_base: String,
    inline_threshold: usize,
    /// Whether `init_location` creates the location's directory. Not on S3: it has no
    /// directories, and opendal would write an empty marker object per checkpoint (one more
    /// request, and an object in every listing); a location appears with its first object.
    create_dirs: bool,
}

impl OpendalCheckpointStorage {
    /// The default inline threshold: 20 KiB, Flink's `state.storage.fs.memory-threshold`.
    pub const DEFAULT_INLINE_THRESHOLD: usize = 20 * 1024;

    /// Storage in a local directory (opendal's fs service). The directory is created if needed;
    /// a root that cannot be created (for example one below a regular file) is a
    /// [`CheckpointError::Storage`] error naming it.
    pub fn fs(root: impl AsRef<std::path::Path>) -> Result<Self, CheckpointError> {
        let root = root.as_ref();
        let absolute = std::path::absolute(root).map_err(|e| {
            CheckpointError::Config(format!(
                "cannot make checkpoint directory '{}' absolute: {e}",
                root.display()
            ))
        })?;
        let Some(root_str) = absolute.to_str() else {
            return Err(CheckpointError::Config(format!(
                "checkpoint directory '{}' is not valid UTF-8",
                absolute.display()
            )));
        };
        let description = format!("file://{root_str}");
        let op = Operator::new(services::Fs::default().root(root_str)).map_err(|source| {
            CheckpointError::Storage {
                path: description.clone(),
                source,
            }
        })?;
        Ok(Self::from_operator(op, description))
    }

    /// Storage in memory (opendal's memory service): for tests and for jobs that need no recovery
    /// across processes. Each call gets its own, empty store.
    pub fn memory() -> Result<Self, CheckpointError> {
        let description = "memory://".to_string();
        let op = Operator::new(services::Memory::default()).map_err(|source| {
            CheckpointError::Storage {
                path: description.clone(),
                source,
            }
        })?;
        Ok(Self::from_operator(op, description))
    }

    /// Storage in an S3 bucket (opendal's s3 service), under the configured prefix: objects
    /// `<prefix>/<job-id>/chk-<n>/_metadata` and so on. Only `config` is read (no credential
    /// files, profiles or instance metadata). A configuration that cannot work is a
    /// [`CheckpointError::Config`] naming the problem; nothing is sent until the first
    /// operation ([`check_writable`](CheckpointStorage::check_writable) at job start). The
    /// bucket must exist. [`describe`](CheckpointStorage::describe) gives
    /// `s3://bucket/prefix (endpoint …, region …)`.
    pub fn s3(config: S3Config) -> Result<Self, CheckpointError> {
        let op = config.operator()?;
        let mut storage = Self::from_operator(op, config.describe());
        storage.path_base = config.url();
        storage.create_dirs = false;
        Ok(storage)
    }

    /// Storage over an operator built elsewhere (gcs, azblob, …). `description` says where its
    /// root is (`gs://bucket/prefix`); it is shown to users and prefixes every path in errors.
    pub fn from_operator(op: Operator, description: String) -> Self {
        OpendalCheckpointStorage {
            create_dirs: op.info().capability().create_dir,
            op,
            path_base: description.clone(),
            description,
            inline_threshold: Self::DEFAULT_INLINE_THRESHOLD,
        }
    }

    /// Sets the inline threshold: state of at most `bytes` bytes is kept inside `_metadata`
    /// instead of in a file of its own.
    pub fn with_inline_threshold(mut self, bytes: usize) -> Self {
        self.inline_threshold = bytes;
        self
    }

    /// The inline threshold in bytes.
    pub fn inline_threshold(&self) -> usize {
        self.inline_threshold
    }

    /// The underlying operator, for raw access (inspection tools and tests).
    pub fn operator(&self) -> &Operator {
        &self.op
    }

    /// The user-facing name of `rel` (a path relative to the root): the root's URL followed by
    /// the path, for example `file:///tmp/ckpt/<job>/chk-3/_metadata`.
    fn full_path(&self, rel: &str) -> String {
        if rel.is_empty() || self.path_base.ends_with('/') {
            format!("{}{rel}", self.path_base)
        } else {
            format!("{}/{rel}", self.path_base)
        }
    }

    /// Writes a state file: in one request, or as a multipart upload when the service has them
    /// and the file is larger than one part.
    async fn write_file(&self, path: &str, bytes: Bytes) -> Result<(), CheckpointError> {
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

    /// Wraps an opendal error on `rel` with the full path.
    fn storage_err(&self, rel: &str) -> impl FnOnce(opendal::Error) -> CheckpointError + use<> {
        let path = self.full_path(rel);
        move |source| CheckpointError::Storage { path, source }
    }

    fn can_rename(&self) -> bool {
        self.op.info().capability().rename
    }

    /// The immediate children of directory `dir` (`""` or ending in `/`): each child's name
    /// without a trailing `/`, and whether it is a directory.
    async fn list_children(&self, dir: &str) -> Result<Vec<(String, bool)>, CheckpointError> {
        let entries = self
            .op
            .list_with(dir)
            .recursive(false)
            .await
            .map_err(self.storage_err(dir))?;
        let mut children = Vec::with_capacity(entries.len());
        for entry in entries {
            let path = entry.path();
            let Some(rest) = path.strip_prefix(dir) else {
                continue;
            };
            let rest = rest.strip_prefix('/').unwrap_or(rest);
            let is_dir = rest.ends_with('/') || entry.metadata().mode().is_dir();
            let name = rest.trim_end_matches('/');
            if name.is_empty() || name.contains('/') {
                // The directory itself, or something deeper that a service returned anyway.
                continue;
            }
            children.push((name.to_string(), is_dir));
        }
        children.sort();
        children.dedup();
        Ok(children)
    }

    /// The `chk-<n>` directories directly under `dir`, with their completeness, sorted by id.
    async fn checkpoints_in(&self, dir: &str) -> Result<Vec<CheckpointListing>, CheckpointError> {
        let children = self.list_children(dir).await?;
        let candidates: Vec<(CheckpointId, CheckpointLocation)> = children
            .into_iter()
            .filter(|(_, is_dir)| *is_dir)
            .filter_map(|(name, _)| {
                parse_chk(&name).map(|id| {
                    (
                        id,
                        CheckpointLocation {
                            dir: format!("{dir}{name}/"),
                        },
                    )
                })
            })
            .collect();
        let mut listings: Vec<CheckpointListing> = futures::stream::iter(candidates)
            .map(|(id, location)| async move {
                let complete = self.has_metadata(&location).await?;
                Ok::<_, CheckpointError>(CheckpointListing {
                    id,
                    location,
                    complete,
                })
            })
            .buffered(LIST_CONCURRENCY)
            .try_collect()
            .await?;
        listings.sort_by(|a, b| (a.id, &a.location).cmp(&(b.id, &b.location)));
        Ok(listings)
    }

    /// Whether `location` holds a `_metadata` file.
    async fn has_metadata(&self, location: &CheckpointLocation) -> Result<bool, CheckpointError> {
        let path = location.metadata_path();
        match self.op.stat(&path).await {
            Ok(meta) => Ok(meta.mode().is_file()),
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(false),
            Err(e) => Err(self.storage_err(&path)(e)),
        }
    }
}

use super::parse_checkpoint_dir as parse_chk;

/// The file a run holds its job directory with, for a generation: `_lock` for the first holder,
/// `_lock.<n>` for the n-th that took the directory over.
fn lock_file(generation: u64) -> String {
    match generation {
        0 => "_lock".to_string(),
        n => format!("_lock.{n}"),
    }
}

/// The generation of a lock file's name (the inverse of [`lock_file`]).
fn parse_lock_file(name: &str) -> Option<u64> {
    match name.strip_prefix("_lock")? {
        "" => Some(0),
        rest => {
            let digits = rest.strip_prefix('.')?;
            let n: u64 = digits.parse().ok()?;
            (n > 0 && format!(".{n}") == rest).then_some(n)
        }
    }
}

/// At most this many characters of a lock file are read back.
const MAX_LOCK_CONTENT: usize = 1000;

/// The first line of a lock's content (who holds it), shortened for messages.
fn lock_holder_line(content: &str) -> String {
    content
        .lines()
        .next()
        .unwrap_or("")
        .chars()
        .take(200)
        .collect()
}

/// Checks that `name` is a plain file name that may hold state.
fn validate_state_name(name: &str) -> Result<(), CheckpointError> {
    let bad = |why: &str| {
        Err(CheckpointError::Config(format!(
            "invalid state file name {name:?}: {why}"
        )))
    };
    if name.is_empty() {
        return bad("it is empty");
    }
    if name == "." || name == ".." {
        return bad("it must be a plain file name");
    }
    if name.contains(['/', '\\']) {
        return bad("it must be a plain file name, without '/' or '\\'");
    }
    if name.contains('\0') || name.chars().any(char::is_control) {
        return bad("it contains control characters");
    }
    if name == METADATA_FILE || name == METADATA_INPROGRESS_FILE {
        return bad("the name is reserved for the checkpoint's metadata");
    }
    Ok(())
}

/// A location's directory as a prefix: empty, or ending in `/`.
fn dir_of(location: &CheckpointLocation) -> String {
    let dir = location.dir.trim_start_matches('/');
    if dir.is_empty() || dir.ends_with('/') {
        dir.to_string()
    } else {
        format!("{dir}/")
    }
}

/// Resolves `rel` (a handle's path) against `dir`, lexically, refusing to leave the root.
fn resolve(dir: &str, rel: &str) -> Result<String, CheckpointError> {
    if rel.is_empty() || rel.starts_with('/') || rel.ends_with('/') || rel.contains('\\') {
        return Err(CheckpointError::Config(format!(
            "invalid state file path {rel:?} in location '{dir}': it must be a relative file path"
        )));
    }
    let mut parts: Vec<&str> = dir.split('/').filter(|s| !s.is_empty()).collect();
    for seg in rel.split('/') {
        match seg {
            "" | "." => {}
            ".." => {
                if parts.pop().is_none() {
                    return Err(CheckpointError::Config(format!(
                        "state file path {rel:?} in location '{dir}' leaves the storage root"
                    )));
                }
            }
            s => parts.push(s),
        }
    }
    Ok(parts.join("/"))
}

/// Normalises a user-given directory path (relative to the root) to `""` or `a/b/`.
fn normalize_dir(path: &str) -> Result<String, CheckpointError> {
    let trimmed = path.trim_matches('/');
    if trimmed.is_empty() {
        return Ok(String::new());
    }
    let mut out = String::with_capacity(trimmed.len() + 1);
    for seg in trimmed.split('/') {
        match seg {
            "" | "." => {}
            ".." => {
                return Err(CheckpointError::Config(format!(
                    "checkpoint path {path:?} must not contain '..'"
                )));
            }
            s => {
                out.push_str(s);
                out.push('/');
            }
        }
    }
    Ok(out)
}

/// The last segment of a directory prefix (`"a/chk-3/"` → `"chk-3"`).
fn last_segment(dir: &str) -> &str {
    dir.trim_end_matches('/').rsplit('/').next().unwrap_or("")
}

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

#[async_trait]
impl CheckpointStorage for OpendalCheckpointStorage {
    fn describe(&self) -> String {
        self.description.clone()
    }

    fn location_path(&self, location: &CheckpointLocation) -> String {
        join_path(&self.path_base, &location.dir)
    }

    async fn check_writable(&self) -> Result<(), CheckpointError> {
        // Writing the probe creates the root where directories exist (fs creates parents).
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        let probe = format!("_weir-write-probe-{}-{nanos}", std::process::id());
        self.op
            .write(&probe, b"weir".to_vec())
            .await
            .map_err(self.storage_err(&probe))?;
        self.op
            .delete(&probe)
            .await
            .map_err(self.storage_err(&probe))?;
        debug!(root = %self.description, "checkpoint storage is writable");
        Ok(())
    }

    async fn init_location(
        &self,
        job: JobId,
        id: CheckpointId,
    ) -> Result<CheckpointLocation, CheckpointError> {
        let location = CheckpointLocation::for_checkpoint(job, id);
        if self.create_dirs {
            self.op
                .create_dir(&location.dir)
                .await
                .map_err(self.storage_err(&location.dir))?;
        }
        debug!(location = %self.full_path(&location.dir), "initialised checkpoint location");
        Ok(location)
    }

    async fn write_state(
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

    async fn write_shared_state(
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

    async fn write_shared_state_from_file(
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
            let bytes = super::concat_local(head, path, len).await?;
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

    async fn discard_state(
        &self,
        location: &CheckpointLocation,
        handle: &StreamStateHandle,
    ) -> Result<(), CheckpointError> {
        let Some(path) = handle.path() else {
            return Ok(());
        };
        let rel = resolve(&dir_of(location), path)?;
        match self.op.delete(&rel).await {
            Ok(()) => {}
            Err(e) if e.kind() == ErrorKind::NotFound => {}
            Err(e) => return Err(self.storage_err(&rel)(e)),
        }
        debug!(path = %self.full_path(&rel), "discarded state file");
        Ok(())
    }

    async fn read_state(
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

    async fn write_metadata(
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

    async fn read_metadata(
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

    async fn discard(&self, location: &CheckpointLocation) -> Result<(), CheckpointError> {
        let dir = dir_of(location);
        if dir.is_empty() {
            return Err(CheckpointError::Config(format!(
                "refusing to discard the storage root {}",
                self.description
            )));
        }
        // `_metadata` first: from then on the checkpoint is incomplete, so a discard cut short
        // (a killed process) never leaves a complete checkpoint whose files are gone (found by
        // the deterministic simulation, seed 12211).
        let metadata = format!("{dir}{METADATA_FILE}");
        match self.op.delete(&metadata).await {
            Ok(()) => {}
            Err(e) if e.kind() == ErrorKind::NotFound => {}
            Err(e) => return Err(self.storage_err(&metadata)(e)),
        }
        match self.op.delete_with(&dir).recursive(true).await {
            Ok(()) => {}
            Err(e) if e.kind() == ErrorKind::NotFound => {}
            Err(e) => return Err(self.storage_err(&dir)(e)),
        }
        debug!(location = %self.full_path(&dir), "discarded checkpoint location");
        Ok(())
    }

    async fn list_checkpoints(
        &self,
        job: JobId,
    ) -> Result<Vec<CheckpointListing>, CheckpointError> {
        self.checkpoints_in(&format!("{job}/")).await
    }

    async fn read_lock(&self, job: JobId) -> Result<Option<JobLock>, CheckpointError> {
        let dir = format!("{job}/");
        let newest = self
            .list_children(&dir)
            .await?
            .into_iter()
            .filter(|(_, is_dir)| !is_dir)
            .filter_map(|(name, _)| parse_lock_file(&name))
            .max();
        let Some(generation) = newest else {
            return Ok(None);
        };
        let path = format!("{dir}{}", lock_file(generation));
        match self.op.read(&path).await {
            Ok(b) => Ok(Some(JobLock {
                generation,
                content: String::from_utf8_lossy(&b.to_vec())
                    .chars()
                    .take(MAX_LOCK_CONTENT)
                    .collect(),
            })),
            // Released between the listing and the read.
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(None),
            Err(e) => Err(self.storage_err(&path)(e)),
        }
    }

    async fn take_lock(
        &self,
        job: JobId,
        generation: u64,
        content: &str,
    ) -> Result<(), CheckpointError> {
        let dir = format!("{job}/");
        let path = format!("{dir}{}", lock_file(generation));
        if self.create_dirs {
            self.op
                .create_dir(&dir)
                .await
                .map_err(self.storage_err(&dir))?;
        }
        match self
            .op
            .write_with(&path, content.as_bytes().to_vec())
            .if_not_exists(true)
            .await
        {
            Ok(_) => {
                debug!(path = %self.full_path(&path), generation, "took the job directory");
                Ok(())
            }
            Err(e)
                if matches!(
                    e.kind(),
                    ErrorKind::ConditionNotMatch | ErrorKind::AlreadyExists
                ) =>
            {
                let holder = match self.op.read(&path).await {
                    Ok(b) => lock_holder_line(&String::from_utf8_lossy(&b.to_vec())),
                    Err(_) => "unknown holder".to_string(),
                };
                Err(CheckpointError::Locked {
                    path: self.full_path(&dir).trim_end_matches('/').to_string(),
                    holder,
                })
            }
            Err(e) => Err(self.storage_err(&path)(e)),
        }
    }

    async fn renew_lock(
        &self,
        job: JobId,
        generation: u64,
        content: &str,
    ) -> Result<(), CheckpointError> {
        let dir = format!("{job}/");
        let lost = |by: String| CheckpointError::LockLost {
            path: self.full_path(&dir).trim_end_matches('/').to_string(),
            by,
        };
        // Taken over? The newest generation decides, before and after the write.
        match self.read_lock(job).await? {
            Some(l) if l.generation > generation => return Err(lost(lock_holder_line(&l.content))),
            Some(l) if l.generation == generation => {}
            _ => return Err(lost("nobody: the lock file is gone".into())),
        }
        let path = format!("{dir}{}", lock_file(generation));
        self.op
            .write(&path, content.as_bytes().to_vec())
            .await
            .map_err(self.storage_err(&path))?;
        match self.read_lock(job).await? {
            Some(l) if l.generation > generation => Err(lost(lock_holder_line(&l.content))),
            _ => Ok(()),
        }
    }

    async fn release_lock(&self, job: JobId, generation: u64) -> Result<(), CheckpointError> {
        let dir = format!("{job}/");
        let children = self.list_children(&dir).await?;
        // Taken over: the older lock files stay, so no later run takes generation 0 beside the
        // new holder without watching its lease first.
        let newest = children
            .iter()
            .filter(|(_, is_dir)| !is_dir)
            .filter_map(|(name, _)| parse_lock_file(name))
            .max();
        if newest.is_some_and(|n| n > generation) {
            return Ok(());
        }
        for (name, is_dir) in children {
            if is_dir || parse_lock_file(&name).is_none_or(|g| g > generation) {
                continue;
            }
            let path = format!("{dir}{name}");
            match self.op.delete(&path).await {
                Ok(()) => {}
                Err(e) if e.kind() == ErrorKind::NotFound => {}
                Err(e) => return Err(self.storage_err(&path)(e)),
            }
        }
        Ok(())
    }

    async fn list_files(&self, dir: &str) -> Result<Vec<String>, CheckpointError> {
        let dir = normalize_dir(dir)?;
        let entries = match self.op.list_with(&dir).recursive(true).await {
            Ok(entries) => entries,
            Err(e) if e.kind() == ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(self.storage_err(&dir)(e)),
        };
        let mut files: Vec<String> = entries
            .into_iter()
            .filter(|e| !e.path().ends_with('/') && !e.metadata().mode().is_dir())
            .map(|e| e.path().trim_start_matches('/').to_string())
            .filter(|p| p.starts_with(&dir))
            .collect();
        files.sort();
        files.dedup();
        Ok(files)
    }

    async fn delete_file(&self, path: &str) -> Result<(), CheckpointError> {
        if path.is_empty() || path.ends_with('/') || path.split('/').any(|s| s == "..") {
            return Err(CheckpointError::Config(format!(
                "cannot delete {path:?}: it is not a file path under the root"
            )));
        }
        match self.op.delete(path).await {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(()),
            Err(e) => Err(self.storage_err(path)(e)),
        }
    }

    async fn find_checkpoints(
        &self,
        path: &str,
    ) -> Result<Vec<CheckpointListing>, CheckpointError> {
        let dir = normalize_dir(path)?;
        let children = self.list_children(&dir).await?;
        let own_id = parse_chk(last_segment(&dir));

        // The path itself holds `_metadata` (a checkpoint or savepoint directory).
        if children.iter().any(|(n, d)| n == METADATA_FILE && !d) {
            let location = CheckpointLocation { dir };
            let id = match own_id {
                Some(id) => id,
                None => self.read_metadata(&location).await?.checkpoint_id,
            };
            return Ok(vec![CheckpointListing {
                id,
                location,
                complete: true,
            }]);
        }
        // The path is a `chk-<n>` directory without `_metadata`: a partial checkpoint (listed
        // even when empty, as `list_checkpoints` lists an initialised location).
        if let Some(id) = own_id
            && (!children.is_empty()
                || self.op.exists(&dir).await.map_err(self.storage_err(&dir))?)
        {
            return Ok(vec![CheckpointListing {
                id,
                location: CheckpointLocation { dir },
                complete: false,
            }]);
        }
        // Its `chk-<n>` children (a job directory).
        let here = self.checkpoints_in(&dir).await?;
        if !here.is_empty() {
            return Ok(here);
        }
        // The `chk-<n>` of its `<job-id>` children (a storage root).
        let mut all = Vec::new();
        for (name, is_dir) in &children {
            if *is_dir && JobId::parse(name).is_some() {
                all.extend(self.checkpoints_in(&format!("{dir}{name}/")).await?);
            }
        }
        all.sort_by(|a, b| (a.id, &a.location).cmp(&(b.id, &b.location)));
        Ok(all)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chk_names_parse_only_in_canonical_form() {
        assert_eq!(parse_chk("chk-7"), Some(CheckpointId(7)));
        assert_eq!(parse_chk("chk-0"), Some(CheckpointId(0)));
        for bad in [
            "chk-", "chk-007", "chk-+7", "chk-7a", "chk--1", "shared", "chk-7/",
        ] {
            assert_eq!(parse_chk(bad), None, "{bad}");
        }
    }

    #[test]
    fn state_names_must_be_plain() {
        assert!(validate_state_name("op-1-subtask-0.keyed").is_ok());
        for bad in [
            "",
            ".",
            "..",
            "a/b",
            "/a",
            "a\\b",
            "_metadata",
            "_metadata.inprogress",
            "a\nb",
        ] {
            assert!(
                matches!(validate_state_name(bad), Err(CheckpointError::Config(_))),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn handle_paths_resolve_inside_the_root() {
        assert_eq!(resolve("j/chk-1/", "s").unwrap(), "j/chk-1/s");
        assert_eq!(resolve("j/chk-1/", "../shared/x").unwrap(), "j/shared/x");
        assert_eq!(resolve("", "s").unwrap(), "s");
        assert!(resolve("j/chk-1/", "../../../etc/passwd").is_err());
        assert!(resolve("j/chk-1/", "/etc/passwd").is_err());
        assert!(resolve("j/chk-1/", "").is_err());
    }

    #[test]
    fn location_paths_are_what_a_user_passes_back() {
        let loc = CheckpointLocation {
            dir: "abc/chk-3/".into(),
        };
        let s3 = OpendalCheckpointStorage::s3(S3Config {
            endpoint: Some("http://127.0.0.1:9".into()),
            region: "us-east-1".into(),
            bucket: "bkt".into(),
            prefix: "p/q".into(),
            access_key_id: Some("A".into()),
            secret_access_key: Some("S".into()),
            session_token: None,
            path_style: true,
        })
        .expect("s3 storage");
        assert!(s3.describe().contains("endpoint"), "{}", s3.describe());
        assert_eq!(s3.location_path(&loc), "s3://bkt/p/q/abc/chk-3");
        let mem = OpendalCheckpointStorage::memory().expect("memory");
        assert_eq!(mem.location_path(&loc), "memory://abc/chk-3");
        assert_eq!(
            join_path("file:///tmp/x", "j/chk-1/"),
            "file:///tmp/x/j/chk-1"
        );
        assert_eq!(join_path("file:///tmp/x/", ""), "file:///tmp/x/");
    }

    #[test]
    fn user_paths_normalise() {
        assert_eq!(normalize_dir("").unwrap(), "");
        assert_eq!(normalize_dir("/").unwrap(), "");
        assert_eq!(normalize_dir("a/chk-3").unwrap(), "a/chk-3/");
        assert_eq!(normalize_dir("/a//chk-3/").unwrap(), "a/chk-3/");
        assert!(normalize_dir("a/../b").is_err());
        assert_eq!(last_segment("a/chk-3/"), "chk-3");
        assert_eq!(last_segment(""), "");
    }
}
