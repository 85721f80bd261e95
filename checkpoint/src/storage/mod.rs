//! The checkpoint-storage seam: [`CheckpointStorage`], and [`OpendalCheckpointStorage`], which
//! runs it over any opendal service (fs, memory and s3 here, the last configured by
//! [`S3Config`]; others plug in the same way).
//! [`faults::FaultInjectingStorage`] wraps any storage and injects seeded faults, for tests.
//!
//! Layout, as Flink's, relative to the storage root:
//! ```text
//! <job-id>/chk-<n>/_metadata      written last; its presence means the checkpoint is complete
//! <job-id>/chk-<n>/<state files>  one per subtask snapshot that was too big to inline
//! <job-id>/shared/                files several checkpoints reference (incremental state)
//! <job-id>/taskowned/
//! ```

use crate::{CheckpointError, CheckpointMetadata};
use async_trait::async_trait;
use bytes::Bytes;
use weir_core::handle::StreamStateHandle;
use weir_core::ids::{CheckpointId, JobId};

/// A directory that holds one checkpoint's `_metadata` and state files, relative to the storage
/// root, with a trailing `/` (for example `"<job-id>/chk-7/"`).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CheckpointLocation {
    /// The directory, relative to the storage root, ending in `/`. Empty for the root itself.
    pub dir: String,
}

impl CheckpointLocation {
    /// The location of `chk-<id>` of `job`.
    pub fn for_checkpoint(job: JobId, id: CheckpointId) -> CheckpointLocation {
        CheckpointLocation {
            dir: format!("{job}/chk-{}/", id.0),
        }
    }

    /// The path of `_metadata` in this location.
    pub fn metadata_path(&self) -> String {
        format!("{}_metadata", self.dir)
    }

    /// The id in the location's name when it is a `chk-<n>` directory.
    pub fn checkpoint_id(&self) -> Option<CheckpointId> {
        let mut segments = self.dir.trim_end_matches('/').rsplit('/');
        parse_checkpoint_dir(segments.next()?)
    }

    /// The job id in the name of the directory holding a `chk-<n>` location, when it is one
    /// (the layout `<job-id>/chk-<n>/`).
    pub fn job_id(&self) -> Option<JobId> {
        self.checkpoint_id()?;
        let mut segments = self.dir.trim_end_matches('/').rsplit('/');
        segments.next();
        JobId::parse(segments.next()?)
    }
}

/// The id of a directory named `chk-<n>` (canonical decimal, as [`CheckpointLocation`] writes
/// it): the one parser of these names.
pub fn parse_checkpoint_dir(name: &str) -> Option<CheckpointId> {
    let digits = name.strip_prefix("chk-")?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let n: u64 = digits.parse().ok()?;
    (format!("chk-{n}") == name).then_some(CheckpointId(n))
}

/// A job directory's lock as found in storage: the newest generation and what its holder wrote.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JobLock {
    /// 0 for the run that created the directory; one more for each run that took it over.
    pub generation: u64,
    /// What the holder wrote (its first line names the holder; the rest is the runtime's lease).
    pub content: String,
}

/// A completed or partial checkpoint found in storage.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CheckpointListing {
    /// Its id (from the `chk-<n>` name).
    pub id: CheckpointId,
    /// Where it is.
    pub location: CheckpointLocation,
    /// Whether `_metadata` exists (it may still be corrupt).
    pub complete: bool,
}

/// `base` (a root as a URL) followed by the directory `dir`, without a trailing `/` after `dir`.
pub fn join_path(base: &str, dir: &str) -> String {
    let dir = dir.trim_end_matches('/');
    if dir.is_empty() || base.ends_with('/') {
        format!("{base}{dir}")
    } else {
        format!("{base}/{dir}")
    }
}

/// Where checkpoints are written and read.
///
/// Contract:
/// - Read-after-write: an object whose write returned `Ok` is visible to every later read and
///   list, with the same bytes.
/// - [`write_metadata`](Self::write_metadata) is atomic: a reader sees either no `_metadata` or
///   the whole file, never part of it. It is called after every state file of the checkpoint
///   was written, so `_metadata`'s presence means the checkpoint is complete.
/// - Every read verifies what can be verified: a full read of a file handle checks its length
///   and CRC-32; `_metadata` checks its envelope. A failure is [`CheckpointError::Corrupt`] and
///   names the file.
/// - [`discard`](Self::discard) is idempotent: discarding what is already gone is `Ok`.
/// - Errors from the service keep opendal's `ErrorKind` ([`CheckpointError::storage_kind`]).
#[async_trait]
pub trait CheckpointStorage: Send + Sync + 'static {
    /// A human-readable description of where the root is (`file:///tmp/x`, `memory://`, …).
    fn describe(&self) -> String;

    /// Where `location` is, as a user passes it back (`--from`): `file:///tmp/x/<job>/chk-3`,
    /// `s3://bucket/prefix/<job>/chk-3`, without the remarks `describe` may add (an S3
    /// storage's endpoint and region).
    fn location_path(&self, location: &CheckpointLocation) -> String {
        join_path(&self.describe(), &location.dir)
    }

    /// Checks that the root can be written (creates it if needed), so that a misconfigured
    /// storage is reported at job start rather than at the first checkpoint.
    async fn check_writable(&self) -> Result<(), CheckpointError>;

    /// Prepares the location of checkpoint `id` of `job`.
    async fn init_location(
        &self,
        job: JobId,
        id: CheckpointId,
    ) -> Result<CheckpointLocation, CheckpointError>;

    /// Writes one state file called `name` into `location` and returns its handle (a path relative
    /// to the location, the size and the xxh3-128 digest of the bytes).
    async fn write_state(
        &self,
        location: &CheckpointLocation,
        name: &str,
        bytes: Bytes,
    ) -> Result<StreamStateHandle, CheckpointError>;

    /// Writes one state file called `name` into the `shared/` directory beside `location`
    /// (`<job-id>/shared/` for `<job-id>/chk-<n>/`): state that later checkpoints may reference
    /// too (incremental snapshots). The handle's path is relative to `location`
    /// (`../shared/<name>`), so `_metadata` refers to it as to any other file. Small state is
    /// inlined, as by [`write_state`](Self::write_state).
    async fn write_shared_state(
        &self,
        location: &CheckpointLocation,
        name: &str,
        bytes: Bytes,
    ) -> Result<StreamStateHandle, CheckpointError>;

    /// Writes a shared state file whose bytes are `head` followed by the `len` bytes of the
    /// local file at `path` (a native keyed snapshot's run, behind its identity frame): the same
    /// file and handle as [`write_shared_state`](Self::write_shared_state) over the
    /// concatenation. A storage that streams the file holds a bounded part of it in memory,
    /// whatever its size; the default reads it whole and calls `write_shared_state`. A local
    /// file that cannot be read or has another length is [`CheckpointError::LocalFile`].
    async fn write_shared_state_from_file(
        &self,
        location: &CheckpointLocation,
        name: &str,
        head: Bytes,
        path: &std::path::Path,
        len: u64,
    ) -> Result<StreamStateHandle, CheckpointError> {
        let bytes = concat_local(head, path, len).await?;
        self.write_shared_state(location, name, bytes).await
    }

    /// Deletes the one file a handle in `location`'s `_metadata` refers to: a shared file that no
    /// retained checkpoint needs any more. An inline handle has nothing to delete. Idempotent.
    async fn discard_state(
        &self,
        location: &CheckpointLocation,
        handle: &StreamStateHandle,
    ) -> Result<(), CheckpointError>;

    /// Reads the bytes of a handle found in `location`'s `_metadata`. `range` reads part of a
    /// file (and skips the whole-file digest, which the caller's format must cover); `None`
    /// reads all of it and verifies its size and digest ([`check_file_checksum`]). Inline handles are served from memory.
    async fn read_state(
        &self,
        location: &CheckpointLocation,
        handle: &StreamStateHandle,
        range: Option<(u64, u64)>,
    ) -> Result<Bytes, CheckpointError>;

    /// Writes `_metadata` atomically, last.
    async fn write_metadata(
        &self,
        location: &CheckpointLocation,
        metadata: &CheckpointMetadata,
    ) -> Result<(), CheckpointError>;

    /// Reads and verifies `_metadata`.
    async fn read_metadata(
        &self,
        location: &CheckpointLocation,
    ) -> Result<CheckpointMetadata, CheckpointError>;

    /// Deletes a location and everything in it, its `_metadata` first: a discard cut short (a
    /// killed process) must never leave a complete checkpoint whose files are gone.
    async fn discard(&self, location: &CheckpointLocation) -> Result<(), CheckpointError>;

    /// Every `chk-<n>` of `job`, complete or not, sorted by id.
    async fn list_checkpoints(&self, job: JobId)
    -> Result<Vec<CheckpointListing>, CheckpointError>;

    /// Takes the job directory `<job>/` for one run: [`take_lock`](Self::take_lock) of
    /// generation 0 with `holder` as the content.
    async fn lock_job(&self, job: JobId, holder: &str) -> Result<(), CheckpointError> {
        self.take_lock(job, 0, holder).await
    }

    /// Gives the job directory up: [`release_lock`](Self::release_lock) of generation 0, so a
    /// run that was taken over never deletes its successor's lock. Idempotent.
    async fn unlock_job(&self, job: JobId) -> Result<(), CheckpointError> {
        self.release_lock(job, 0).await
    }

    /// The lock of the job directory `<job>/`: the newest generation's lock file and its content
    /// (at most 1,000 characters), or `None` when the directory is not held.
    async fn read_lock(&self, job: JobId) -> Result<Option<JobLock>, CheckpointError>;

    /// Creates the lock file of `generation` in `<job>/` (`_lock` for 0, `_lock.<n>` after), holding
    /// `content`, only if it does not exist: a conditional create (`O_EXCL` on a local file
    /// system, `If-None-Match: *` on S3), so of two runs taking the same generation only one
    /// succeeds; the other is refused with [`CheckpointError::Locked`] naming the holder (the
    /// content's first line). A run that was killed leaves its lock; one that takes its directory
    /// over (claim mode) takes the next generation once it has seen the lease expire.
    async fn take_lock(
        &self,
        job: JobId,
        generation: u64,
        content: &str,
    ) -> Result<(), CheckpointError>;

    /// Rewrites the lock file of `generation` with `content` (a lease renewal). Refused with
    /// [`CheckpointError::LockLost`] when a newer generation exists, before or after the write, or
    /// the lock file is gone: the directory was taken over, and its old holder must stop writing.
    async fn renew_lock(
        &self,
        job: JobId,
        generation: u64,
        content: &str,
    ) -> Result<(), CheckpointError>;

    /// Deletes the lock files of `<job>/` up to and including `generation`, unless a newer
    /// generation exists (the directory was taken over: its older lock files stay, so that no
    /// run takes generation 0 beside the new holder). Idempotent.
    async fn release_lock(&self, job: JobId, generation: u64) -> Result<(), CheckpointError>;

    /// Every file under the directory `dir` (relative to the root, `""` for the root itself),
    /// recursively, as paths relative to the root, sorted. A missing directory has none.
    async fn list_files(&self, dir: &str) -> Result<Vec<String>, CheckpointError>;

    /// Deletes one file, by its path relative to the root. Idempotent.
    async fn delete_file(&self, path: &str) -> Result<(), CheckpointError>;

    /// Finds checkpoints under a path a user gave (relative to the root; `""` is the root):
    /// the path itself if it holds `_metadata`; else its `chk-<n>` children; else the `chk-<n>`
    /// of its `<job-id>` children. Sorted by id, newest last, complete or not.
    async fn find_checkpoints(&self, path: &str)
    -> Result<Vec<CheckpointListing>, CheckpointError>;
}

pub use opendal_impl::{OpendalCheckpointStorage, check_file_checksum};
pub use s3::{S3Config, is_s3_url};

/// The directory shared files are written to, relative to a checkpoint's location.
pub const SHARED_DIR_FROM_LOCATION: &str = "../shared/";

/// `head` followed by the `len` bytes of the local file at `path`, read whole (off the
/// runtime's threads).
pub(crate) async fn concat_local(
    head: Bytes,
    path: &std::path::Path,
    len: u64,
) -> Result<Bytes, CheckpointError> {
    let local = path.to_path_buf();
    // Read behind the head, in one buffer: no second copy of the file.
    let bytes = tokio::task::spawn_blocking(move || {
        use std::io::Read;
        let hint = usize::try_from(len.min(64 << 20)).unwrap_or(0);
        let mut bytes = Vec::with_capacity(head.len() + hint + 1);
        bytes.extend_from_slice(&head);
        std::fs::File::open(&local)?.read_to_end(&mut bytes)?;
        Ok::<_, std::io::Error>((bytes, head.len()))
    })
    .await
    .map_err(|e| local_file_error(path, e.to_string()))?
    .map_err(|e| local_file_error(path, e.to_string()))?;
    let read = (bytes.0.len() - bytes.1) as u64;
    if read != len {
        return Err(local_file_error(
            path,
            format!("{read} bytes, and {len} were expected"),
        ));
    }
    Ok(Bytes::from(bytes.0))
}

/// The error for a local file that cannot be uploaded.
pub fn local_file_error(path: &std::path::Path, reason: String) -> CheckpointError {
    CheckpointError::LocalFile {
        path: path.display().to_string(),
        reason,
    }
}

/// Whether `handle` is a file in the job's `shared/` directory, as
/// [`CheckpointStorage::write_shared_state`] writes them: owned by no single checkpoint, and
/// deleted only when no retained checkpoint refers to it.
pub fn is_shared(handle: &StreamStateHandle) -> bool {
    handle.path().is_some_and(|path| {
        path.strip_prefix(SHARED_DIR_FROM_LOCATION)
            .is_some_and(|name| !name.is_empty() && !name.contains(['/', '\\']) && name != "..")
    })
}

#[cfg(any(test, feature = "conformance"))]
pub mod conformance;
pub mod faults;

mod opendal_impl;
mod s3;
