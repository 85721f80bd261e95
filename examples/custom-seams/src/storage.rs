//! A user's checkpoint storage: [`CountingStorage`], a `CheckpointStorage` over a local
//! directory (opendal's fs service) that counts its reads and writes and names its locations
//! `counting:///abs/dir/...`, and [`register_counting_scheme`], which makes such URLs work
//! wherever Weir takes a checkpoint location.

use async_trait::async_trait;
use bytes::Bytes;
use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use weir_checkpoint::storage::{CheckpointListing, JobLock};
use weir_checkpoint::{
    CheckpointError, CheckpointLocation, CheckpointMetadata, CheckpointStorage,
    OpendalCheckpointStorage,
};
use weir_core::handle::StreamStateHandle;
use weir_core::ids::{CheckpointId, JobId};

/// The URL scheme [`register_counting_scheme`] registers: `counting:///abs/dir`.
pub const SCHEME: &str = "counting";

/// Called with a snapshot's location (as `--from` takes it) once its `_metadata` is written.
type CompletedListener = Box<dyn Fn(&str) + Send + Sync>;

/// What every [`CountingStorage`] sharing these counters has done (relaxed atomics).
#[derive(Default)]
pub struct StorageCounters {
    /// `read_metadata` calls.
    pub metadata_reads: AtomicU64,
    /// `read_state` calls (whole files, ranges and inline handles alike).
    pub state_reads: AtomicU64,
    /// Listings: `list_checkpoints`, `find_checkpoints`, `list_files`, `read_lock`.
    pub listings: AtomicU64,
    /// `write_metadata` calls that succeeded: completed checkpoints and savepoints.
    pub metadata_writes: AtomicU64,
    /// `write_state` and `write_shared_state` calls.
    pub state_writes: AtomicU64,
    /// Other writes: `init_location` and the lock file's `take_lock` and `renew_lock`.
    pub other_writes: AtomicU64,
    /// Deletions: `discard`, `discard_state`, `delete_file`, `release_lock`.
    pub deletes: AtomicU64,
    completed: Mutex<Vec<String>>,
    listener: Mutex<Option<CompletedListener>>,
}

impl fmt::Debug for StorageCounters {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StorageCounters")
            .field("counts", &self.get())
            .finish()
    }
}

/// A plain copy of [`StorageCounters`] at one moment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StorageCounts {
    /// See [`StorageCounters::metadata_reads`].
    pub metadata_reads: u64,
    /// See [`StorageCounters::state_reads`].
    pub state_reads: u64,
    /// See [`StorageCounters::listings`].
    pub listings: u64,
    /// See [`StorageCounters::metadata_writes`].
    pub metadata_writes: u64,
    /// See [`StorageCounters::state_writes`].
    pub state_writes: u64,
    /// See [`StorageCounters::other_writes`].
    pub other_writes: u64,
    /// See [`StorageCounters::deletes`].
    pub deletes: u64,
}

impl StorageCounts {
    /// Every read: `_metadata`, state and listings.
    pub fn reads(&self) -> u64 {
        self.metadata_reads + self.state_reads + self.listings
    }

    /// Every write: `_metadata`, state, locations and lock files.
    pub fn writes(&self) -> u64 {
        self.metadata_writes + self.state_writes + self.other_writes
    }
}

impl fmt::Display for StorageCounts {
    /// `storage_reads=… storage_writes=… …`, as the job's summary line prints it.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "storage_reads={} storage_writes={} storage_metadata_reads={} storage_state_reads={} \
             storage_listings={} storage_metadata_writes={} storage_state_writes={} \
             storage_deletes={}",
            self.reads(),
            self.writes(),
            self.metadata_reads,
            self.state_reads,
            self.listings,
            self.metadata_writes,
            self.state_writes,
            self.deletes
        )
    }
}

fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

impl StorageCounters {
    /// The counts now.
    pub fn get(&self) -> StorageCounts {
        let load = |c: &AtomicU64| c.load(Ordering::SeqCst);
        StorageCounts {
            metadata_reads: load(&self.metadata_reads),
            state_reads: load(&self.state_reads),
            listings: load(&self.listings),
            metadata_writes: load(&self.metadata_writes),
            state_writes: load(&self.state_writes),
            other_writes: load(&self.other_writes),
            deletes: load(&self.deletes),
        }
    }

    /// The locations whose `_metadata` was written, oldest first, as `--from` and
    /// `restore_from` take them (`counting:///abs/dir/<job>/chk-<n>`). A checkpoint is complete
    /// exactly when its `_metadata` exists; a later one may have subsumed (deleted) it since.
    pub fn completed(&self) -> Vec<String> {
        self.completed
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Calls `listener` with each location whose `_metadata` is written from now on, before
    /// the write returns to the job (so before the job can delete an older checkpoint this one
    /// subsumes, or commit what it covers). Replaces an earlier listener.
    pub fn on_completed(&self, listener: impl Fn(&str) + Send + Sync + 'static) {
        *self.listener.lock().unwrap_or_else(PoisonError::into_inner) = Some(Box::new(listener));
    }

    fn complete(&self, location: String) {
        bump(&self.metadata_writes);
        if let Some(listener) = &*self.listener.lock().unwrap_or_else(PoisonError::into_inner) {
            listener(&location);
        }
        self.completed
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(location);
    }
}

/// A local directory as checkpoint storage, shown as `<scheme>:///abs/dir`, counting every
/// call into [`StorageCounters`] and forwarding it to [`OpendalCheckpointStorage::fs`].
pub struct CountingStorage {
    inner: OpendalCheckpointStorage,
    url: String,
    counters: Arc<StorageCounters>,
    /// Kept as long as the storage (a temporary directory, in tests).
    _guard: Option<Box<dyn Send + Sync>>,
}

impl fmt::Debug for CountingStorage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CountingStorage")
            .field("url", &self.url)
            .finish()
    }
}

impl CountingStorage {
    /// The directory `dir` (absolute, so that its URL is `<scheme>:///…`) as storage named by
    /// `scheme`, counting into `counters`.
    pub fn fs(
        scheme: &str,
        dir: &Path,
        counters: Arc<StorageCounters>,
    ) -> Result<CountingStorage, CheckpointError> {
        if !dir.is_absolute() {
            return Err(CheckpointError::Config(format!(
                "{scheme}:// storage needs an absolute directory, not {}",
                dir.display()
            )));
        }
        Ok(CountingStorage {
            inner: OpendalCheckpointStorage::fs(dir)?,
            url: format!("{scheme}://{}", dir.display()),
            counters,
            _guard: None,
        })
    }

    /// This storage, keeping `guard` (a temporary directory, say) alive as long as it lives.
    pub fn with_guard(mut self, guard: impl Send + Sync + 'static) -> CountingStorage {
        self._guard = Some(Box::new(guard));
        self
    }

    /// What it counts into.
    pub fn counters(&self) -> &Arc<StorageCounters> {
        &self.counters
    }
}

#[async_trait]
impl CheckpointStorage for CountingStorage {
    fn describe(&self) -> String {
        self.url.clone()
    }

    fn location_path(&self, location: &CheckpointLocation) -> String {
        // Our URL, not the inner storage's `file://` one, so that a printed path comes back here.
        weir_checkpoint::storage::join_path(&self.url, &location.dir)
    }

    async fn check_writable(&self) -> Result<(), CheckpointError> {
        self.inner.check_writable().await
    }

    async fn init_location(
        &self,
        job: JobId,
        id: CheckpointId,
    ) -> Result<CheckpointLocation, CheckpointError> {
        bump(&self.counters.other_writes);
        self.inner.init_location(job, id).await
    }

    async fn write_state(
        &self,
        location: &CheckpointLocation,
        name: &str,
        bytes: Bytes,
    ) -> Result<StreamStateHandle, CheckpointError> {
        bump(&self.counters.state_writes);
        self.inner.write_state(location, name, bytes).await
    }

    async fn write_shared_state(
        &self,
        location: &CheckpointLocation,
        name: &str,
        bytes: Bytes,
    ) -> Result<StreamStateHandle, CheckpointError> {
        bump(&self.counters.state_writes);
        self.inner.write_shared_state(location, name, bytes).await
    }

    async fn discard_state(
        &self,
        location: &CheckpointLocation,
        handle: &StreamStateHandle,
    ) -> Result<(), CheckpointError> {
        bump(&self.counters.deletes);
        self.inner.discard_state(location, handle).await
    }

    async fn read_state(
        &self,
        location: &CheckpointLocation,
        handle: &StreamStateHandle,
        range: Option<(u64, u64)>,
    ) -> Result<Bytes, CheckpointError> {
        bump(&self.counters.state_reads);
        self.inner.read_state(location, handle, range).await
    }

    async fn write_metadata(
        &self,
        location: &CheckpointLocation,
        metadata: &CheckpointMetadata,
    ) -> Result<(), CheckpointError> {
        self.inner.write_metadata(location, metadata).await?;
        self.counters.complete(self.location_path(location));
        Ok(())
    }

    async fn read_metadata(
        &self,
        location: &CheckpointLocation,
    ) -> Result<CheckpointMetadata, CheckpointError> {
        bump(&self.counters.metadata_reads);
        self.inner.read_metadata(location).await
    }

    async fn discard(&self, location: &CheckpointLocation) -> Result<(), CheckpointError> {
        bump(&self.counters.deletes);
        self.inner.discard(location).await
    }

    async fn list_checkpoints(
        &self,
        job: JobId,
    ) -> Result<Vec<CheckpointListing>, CheckpointError> {
        bump(&self.counters.listings);
        self.inner.list_checkpoints(job).await
    }

    async fn lock_job(&self, job: JobId, holder: &str) -> Result<(), CheckpointError> {
        bump(&self.counters.other_writes);
        self.inner.lock_job(job, holder).await
    }

    async fn unlock_job(&self, job: JobId) -> Result<(), CheckpointError> {
        bump(&self.counters.deletes);
        self.inner.unlock_job(job).await
    }

    async fn read_lock(&self, job: JobId) -> Result<Option<JobLock>, CheckpointError> {
        bump(&self.counters.listings);
        self.inner.read_lock(job).await
    }

    async fn take_lock(
        &self,
        job: JobId,
        generation: u64,
        content: &str,
    ) -> Result<(), CheckpointError> {
        bump(&self.counters.other_writes);
        self.inner.take_lock(job, generation, content).await
    }

    async fn renew_lock(
        &self,
        job: JobId,
        generation: u64,
        content: &str,
    ) -> Result<(), CheckpointError> {
        bump(&self.counters.other_writes);
        self.inner.renew_lock(job, generation, content).await
    }

    async fn release_lock(&self, job: JobId, generation: u64) -> Result<(), CheckpointError> {
        bump(&self.counters.deletes);
        self.inner.release_lock(job, generation).await
    }

    async fn list_files(&self, dir: &str) -> Result<Vec<String>, CheckpointError> {
        bump(&self.counters.listings);
        self.inner.list_files(dir).await
    }

    async fn delete_file(&self, path: &str) -> Result<(), CheckpointError> {
        bump(&self.counters.deletes);
        self.inner.delete_file(path).await
    }

    async fn find_checkpoints(
        &self,
        path: &str,
    ) -> Result<Vec<CheckpointListing>, CheckpointError> {
        bump(&self.counters.listings);
        self.inner.find_checkpoints(path).await
    }
}

/// The counters of each scheme this process registered.
fn registered() -> &'static Mutex<BTreeMap<String, Arc<StorageCounters>>> {
    static REGISTERED: OnceLock<Mutex<BTreeMap<String, Arc<StorageCounters>>>> = OnceLock::new();
    REGISTERED.get_or_init(Mutex::default)
}

/// Registers [`SCHEME`] (`counting:///abs/dir`) with Weir in this process and returns the
/// counters every storage of the scheme counts into.
///
/// From then on a `counting:///abs/dir` URL is a [`CountingStorage`] over that directory
/// wherever Weir takes a location: `StorageConfig::from_location` (`--checkpoint-dir`),
/// `env.restore_from(..)` (`--from`, given a checkpoint's URL or the root's), savepoint
/// directories, and the task managers of a cluster (each process registers the scheme
/// itself before the job starts). Registering again returns the same counters (the factory
/// registered first stays), so every caller in a process sees one set.
pub fn register_counting_scheme() -> Arc<StorageCounters> {
    register_scheme(SCHEME).expect("`counting` is a valid URL scheme that Weir does not serve")
}

/// As [`register_counting_scheme`], for another scheme name (tests give each job its own, so
/// that its counters are its own). An invalid scheme, or one of Weir's own (`s3`, `file`,
/// `memory`), is a [`CheckpointError::Config`].
pub fn register_scheme(scheme: &str) -> Result<Arc<StorageCounters>, CheckpointError> {
    let mut schemes = registered().lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(counters) = schemes.get(scheme) {
        return Ok(counters.clone());
    }
    let counters = Arc::new(StorageCounters::default());
    let (name, shared) = (scheme.to_string(), counters.clone());
    weir_runtime::register_storage_scheme(scheme, move |url: &str| {
        let dir = dir_of(&name, url)?;
        Ok(Arc::new(CountingStorage::fs(&name, &dir, shared.clone())?)
            as Arc<dyn CheckpointStorage>)
    })?;
    schemes.insert(scheme.to_string(), counters.clone());
    Ok(counters)
}

/// The directory of a `<scheme>:///abs/dir` URL.
fn dir_of(scheme: &str, url: &str) -> Result<PathBuf, CheckpointError> {
    let rest = url
        .get(..scheme.len() + 3)
        .filter(|head| head.eq_ignore_ascii_case(&format!("{scheme}://")))
        .and_then(|_| url.get(scheme.len() + 3..))
        .ok_or_else(|| CheckpointError::Config(format!("{url:?} is not a {scheme}:// URL")))?;
    if !rest.starts_with('/') {
        return Err(CheckpointError::Config(format!(
            "{url:?}: a {scheme}:// URL names an absolute directory, {scheme}:///abs/dir"
        )));
    }
    Ok(PathBuf::from(rest))
}

/// `location` as a `counting://` URL: a URL is kept as it is; a path becomes
/// `counting:///<its absolute form>`.
pub fn counting_url(location: &str) -> std::io::Result<String> {
    if location.contains("://") {
        return Ok(location.to_string());
    }
    let dir = std::path::absolute(location)?;
    Ok(format!("{SCHEME}://{}", dir.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_name_absolute_directories() {
        assert_eq!(
            dir_of("counting", "counting:///tmp/x/y").ok(),
            Some(PathBuf::from("/tmp/x/y"))
        );
        assert!(dir_of("counting", "counting://tmp/x").is_err());
        assert!(dir_of("counting", "other:///tmp/x").is_err());
        assert_eq!(
            counting_url("counting:///a").ok().as_deref(),
            Some("counting:///a")
        );
        let url = counting_url("rel/dir").unwrap_or_default();
        assert!(
            url.starts_with("counting:///") && url.ends_with("/rel/dir"),
            "{url}"
        );
    }
}
