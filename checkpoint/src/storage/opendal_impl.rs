//! [`CheckpointStorage`](super::CheckpointStorage) over an opendal `Operator`: Flink's layout on
//! any opendal service (fs, memory and s3 here; others through [`OpendalCheckpointStorage::from_operator`]).

mod listing;
mod lock;
mod names;
mod read;
mod write;

pub use read::check_file_checksum;

use super::{
    CheckpointListing, CheckpointLocation, CheckpointStorage, JobLock, S3Config, join_path,
};
use crate::{CheckpointError, CheckpointMetadata};
use async_trait::async_trait;
use bytes::Bytes;
use opendal::{Operator, services};
use tracing::debug;
use weir_core::handle::StreamStateHandle;
use weir_core::ids::{CheckpointId, JobId};

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

    /// Wraps an opendal error on `rel` with the full path.
    fn storage_err(&self, rel: &str) -> impl FnOnce(opendal::Error) -> CheckpointError + use<> {
        let path = self.full_path(rel);
        move |source| CheckpointError::Storage { path, source }
    }

    fn can_rename(&self) -> bool {
        self.op.info().capability().rename
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
        self.write_location_state(location, name, bytes).await
    }

    async fn write_shared_state(
        &self,
        location: &CheckpointLocation,
        name: &str,
        bytes: Bytes,
    ) -> Result<StreamStateHandle, CheckpointError> {
        self.write_shared_bytes(location, name, bytes).await
    }

    async fn write_shared_state_from_file(
        &self,
        location: &CheckpointLocation,
        name: &str,
        head: Bytes,
        path: &std::path::Path,
        len: u64,
    ) -> Result<StreamStateHandle, CheckpointError> {
        self.stream_shared_file(location, name, head, path, len)
            .await
    }

    async fn discard_state(
        &self,
        location: &CheckpointLocation,
        handle: &StreamStateHandle,
    ) -> Result<(), CheckpointError> {
        self.discard_state_file(location, handle).await
    }

    async fn read_state(
        &self,
        location: &CheckpointLocation,
        handle: &StreamStateHandle,
        range: Option<(u64, u64)>,
    ) -> Result<Bytes, CheckpointError> {
        self.read_state_bytes(location, handle, range).await
    }

    async fn write_metadata(
        &self,
        location: &CheckpointLocation,
        metadata: &CheckpointMetadata,
    ) -> Result<(), CheckpointError> {
        self.write_metadata_file(location, metadata).await
    }

    async fn read_metadata(
        &self,
        location: &CheckpointLocation,
    ) -> Result<CheckpointMetadata, CheckpointError> {
        self.read_metadata_file(location).await
    }

    async fn discard(&self, location: &CheckpointLocation) -> Result<(), CheckpointError> {
        self.discard_location(location).await
    }

    async fn list_checkpoints(
        &self,
        job: JobId,
    ) -> Result<Vec<CheckpointListing>, CheckpointError> {
        self.checkpoints_in(&format!("{job}/")).await
    }

    async fn read_lock(&self, job: JobId) -> Result<Option<JobLock>, CheckpointError> {
        self.read_newest_lock(job).await
    }

    async fn take_lock(
        &self,
        job: JobId,
        generation: u64,
        content: &str,
    ) -> Result<(), CheckpointError> {
        self.take_lock_generation(job, generation, content).await
    }

    async fn renew_lock(
        &self,
        job: JobId,
        generation: u64,
        content: &str,
    ) -> Result<(), CheckpointError> {
        self.renew_lock_generation(job, generation, content).await
    }

    async fn release_lock(&self, job: JobId, generation: u64) -> Result<(), CheckpointError> {
        self.release_lock_generations(job, generation).await
    }

    async fn list_files(&self, dir: &str) -> Result<Vec<String>, CheckpointError> {
        self.list_files_under(dir).await
    }

    async fn delete_file(&self, path: &str) -> Result<(), CheckpointError> {
        self.delete_one_file(path).await
    }

    async fn find_checkpoints(
        &self,
        path: &str,
    ) -> Result<Vec<CheckpointListing>, CheckpointError> {
        self.find_checkpoints_at(path).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
