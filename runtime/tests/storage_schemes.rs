//! A custom checkpoint storage reached by URL (`register_storage_scheme`) and as an object
//! (`StorageConfig::Custom`) is used on every path: checkpoints, failover restores, a restore of
//! another run (`restore_from` with its URL, or a location under the object's root), and
//! savepoints. Its counters prove each use; the totals are exact against values computed
//! without the engine. Uses only the public API.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;
use support::{Bounded, Failures, assert_restored};

use async_trait::async_trait;
use bytes::Bytes;
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use weir_checkpoint::storage::{CheckpointListing, CheckpointLocation, JobLock};
use weir_checkpoint::{
    CheckpointError, CheckpointMetadata, CheckpointStorage, OpendalCheckpointStorage,
};
use weir_core::handle::StreamStateHandle;
use weir_core::ids::{CheckpointId, JobId};
use weir_runtime::{
    JobClient, JobStatus, RestartStrategy, StorageConfig, StreamEnvironment,
    register_storage_scheme,
};

const RECORDS: u64 = 400_000;
const KEYS: u64 = 11;

/// Reads and writes through every [`Counting`] storage of a counter set.
#[derive(Debug, Default)]
struct Counters {
    reads: AtomicU64,
    writes: AtomicU64,
}

impl Counters {
    fn get(&self) -> (u64, u64) {
        (
            self.reads.load(Ordering::SeqCst),
            self.writes.load(Ordering::SeqCst),
        )
    }
}

/// A local directory shown as `<scheme>://<dir>`, counting its reads and writes.
struct Counting {
    inner: OpendalCheckpointStorage,
    url: String,
    counters: Arc<Counters>,
}

impl Counting {
    fn new(scheme: &str, dir: &Path, counters: &Arc<Counters>) -> Arc<Self> {
        Arc::new(Counting {
            inner: OpendalCheckpointStorage::fs(dir).unwrap(),
            url: format!("{scheme}://{}", dir.display()),
            counters: counters.clone(),
        })
    }

    fn read(&self) {
        self.counters.reads.fetch_add(1, Ordering::SeqCst);
    }

    fn write(&self) {
        self.counters.writes.fetch_add(1, Ordering::SeqCst);
    }
}

#[async_trait]
impl CheckpointStorage for Counting {
    fn describe(&self) -> String {
        self.url.clone()
    }
    async fn check_writable(&self) -> Result<(), CheckpointError> {
        self.inner.check_writable().await
    }
    async fn init_location(
        &self,
        job: JobId,
        id: CheckpointId,
    ) -> Result<CheckpointLocation, CheckpointError> {
        self.write();
        self.inner.init_location(job, id).await
    }
    async fn write_state(
        &self,
        location: &CheckpointLocation,
        name: &str,
        bytes: Bytes,
    ) -> Result<StreamStateHandle, CheckpointError> {
        self.write();
        self.inner.write_state(location, name, bytes).await
    }
    async fn write_shared_state(
        &self,
        location: &CheckpointLocation,
        name: &str,
        bytes: Bytes,
    ) -> Result<StreamStateHandle, CheckpointError> {
        self.write();
        self.inner.write_shared_state(location, name, bytes).await
    }
    async fn discard_state(
        &self,
        location: &CheckpointLocation,
        handle: &StreamStateHandle,
    ) -> Result<(), CheckpointError> {
        self.inner.discard_state(location, handle).await
    }
    async fn read_state(
        &self,
        location: &CheckpointLocation,
        handle: &StreamStateHandle,
        range: Option<(u64, u64)>,
    ) -> Result<Bytes, CheckpointError> {
        self.read();
        self.inner.read_state(location, handle, range).await
    }
    async fn write_metadata(
        &self,
        location: &CheckpointLocation,
        metadata: &CheckpointMetadata,
    ) -> Result<(), CheckpointError> {
        self.write();
        self.inner.write_metadata(location, metadata).await
    }
    async fn read_metadata(
        &self,
        location: &CheckpointLocation,
    ) -> Result<CheckpointMetadata, CheckpointError> {
        self.read();
        self.inner.read_metadata(location).await
    }
    async fn discard(&self, location: &CheckpointLocation) -> Result<(), CheckpointError> {
        self.inner.discard(location).await
    }
    async fn list_checkpoints(
        &self,
        job: JobId,
    ) -> Result<Vec<CheckpointListing>, CheckpointError> {
        self.read();
        self.inner.list_checkpoints(job).await
    }
    async fn find_checkpoints(
        &self,
        path: &str,
    ) -> Result<Vec<CheckpointListing>, CheckpointError> {
        self.read();
        self.inner.find_checkpoints(path).await
    }
    async fn read_lock(&self, job: JobId) -> Result<Option<JobLock>, CheckpointError> {
        self.inner.read_lock(job).await
    }
    async fn take_lock(
        &self,
        job: JobId,
        generation: u64,
        content: &str,
    ) -> Result<(), CheckpointError> {
        self.inner.take_lock(job, generation, content).await
    }
    async fn renew_lock(
        &self,
        job: JobId,
        generation: u64,
        content: &str,
    ) -> Result<(), CheckpointError> {
        self.inner.renew_lock(job, generation, content).await
    }
    async fn release_lock(&self, job: JobId, generation: u64) -> Result<(), CheckpointError> {
        self.inner.release_lock(job, generation).await
    }
    async fn list_files(&self, dir: &str) -> Result<Vec<String>, CheckpointError> {
        self.inner.list_files(dir).await
    }
    async fn delete_file(&self, path: &str) -> Result<(), CheckpointError> {
        self.inner.delete_file(path).await
    }
}

/// Registers `scheme` (`<scheme>:///abs/dir`) over local directories, counting into `counters`.
fn register(scheme: &'static str, counters: &Arc<Counters>) {
    let counters = counters.clone();
    register_storage_scheme(scheme, move |url: &str| {
        let dir = url
            .strip_prefix(&format!("{scheme}://"))
            .ok_or_else(|| CheckpointError::Config(format!("not a {scheme}:// URL: {url}")))?;
        Ok(Counting::new(scheme, Path::new(dir), &counters) as Arc<dyn CheckpointStorage>)
    })
    .unwrap();
}

fn expected(records: u64) -> BTreeMap<u64, i64> {
    let mut m = BTreeMap::new();
    for i in 0..records {
        *m.entry(i % KEYS).or_insert(0) += 1;
    }
    m
}

/// The keyed count over `RECORDS` records at parallelism 2, checkpointing every 10 ms, with the
/// failures of `failures`; returns its environment and its totals.
fn job(failures: &Arc<Failures>) -> (StreamEnvironment, weir_runtime::LatestHandle<u64, i64>) {
    let env = StreamEnvironment::new();
    env.set_job_name("storage-schemes")
        .set_parallelism(2)
        .enable_checkpointing(Duration::from_millis(10))
        .set_restart_strategy(RestartStrategy::FixedDelay {
            attempts: 3,
            delay: Duration::ZERO,
        });
    let totals = env
        .from_generator(Some(RECORDS), |i| i)
        .uid("source")
        .inject_failures(failures)
        .uid("inject")
        .map(|i: u64| (i % KEYS, 1i64))
        .uid("pairs")
        .key_by(|t: &(u64, i64)| &t.0)
        .sum()
        .uid("sum")
        .reinterpret_as_keyed(|t: &(u64, i64)| &t.0)
        .latest_per_key();
    (env, totals)
}

/// A registered scheme is the job's storage, by URL: its checkpoints, the failover restore, a
/// savepoint into another of its URLs, and a later run's restore from that savepoint's URL
/// all go through the registered factory's storage.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_registered_scheme_is_used_for_checkpoints_restores_and_savepoints() {
    let tmp = tempfile::tempdir().unwrap();
    let counters = Arc::new(Counters::default());
    register("counting", &counters);
    let root = format!("counting://{}", tmp.path().join("checkpoints").display());
    let savepoints = format!("counting://{}", tmp.path().join("savepoints").display());

    // The first run fails over once, then stops with a savepoint part way.
    let failures = Failures::paced(vec![RECORDS / 4], 2_000);
    let (env, _) = job(&failures);
    env.set_checkpoint_storage(StorageConfig::from_location(&root).unwrap());
    env.set_savepoint_dir(&savepoints);
    let client = JobClient::default();
    let run = tokio::spawn(env.execute_with(client.clone()).bounded());
    while failures.injected() == 0 || failures.seen() < RECORDS / 2 {
        assert!(
            !run.is_finished(),
            "the first run ended before it was stopped"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let before_stop = counters.get();
    let savepoint = client.stop_with_savepoint(None, false).await.unwrap();
    let first = run.await.unwrap().unwrap();
    assert_eq!(first.status, JobStatus::Finished);
    assert_eq!(first.restarts, 1);
    assert!(
        first
            .restored_from
            .as_deref()
            .is_some_and(|f| f.starts_with("counting://")),
        "the failover restored from {:?}",
        first.restored_from
    );
    assert!(savepoint.starts_with(&savepoints), "{savepoint}");
    assert!(before_stop.0 > 0 && before_stop.1 > 0, "{before_stop:?}");
    let after_stop = counters.get();
    assert!(
        after_stop.1 > before_stop.1,
        "the savepoint wrote nothing through the scheme"
    );

    // The second run restores the savepoint by its URL, and checkpoints through the scheme.
    let (env, totals) = job(&Failures::at(Vec::new()));
    env.set_checkpoint_storage(StorageConfig::from_location(&root).unwrap());
    env.restore_from(&savepoint);
    let second = env.execute().bounded().await.unwrap();
    assert_eq!(totals.get(), expected(RECORDS));
    assert_restored(&second, RECORDS, "restored from the savepoint's URL");
    assert_eq!(second.restored_from.as_deref(), Some(savepoint.as_str()));
    let end = counters.get();
    assert!(
        end.0 > after_stop.0,
        "the restore read nothing through the scheme"
    );
}

/// A custom storage given as an object is reached by `restore_from` with a location under its
/// root (as it prints them): the restore reads through the object, not a storage of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_custom_storage_object_serves_the_restore_of_its_locations() {
    let tmp = tempfile::tempdir().unwrap();
    let counters = Arc::new(Counters::default());
    let storage = Counting::new("object", &tmp.path().join("checkpoints"), &counters);
    let failures = Failures::paced(vec![RECORDS / 2], 2_000);
    let (env, _) = job(&failures);
    env.set_checkpoint_storage(StorageConfig::Custom(storage.clone()));
    env.set_restart_strategy(RestartStrategy::NoRestart);
    assert!(
        env.execute().bounded().await.is_err(),
        "the first run must fail"
    );
    let latest = std::fs::read_dir(tmp.path().join("checkpoints"))
        .unwrap()
        .flatten()
        .next()
        .map(|job| {
            format!(
                "{}/{}",
                storage.describe(),
                job.file_name().to_string_lossy()
            )
        })
        .expect("the failed run's job directory");

    let reads_before = counters.get().0;
    let (env, totals) = job(&Failures::at(Vec::new()));
    env.set_checkpoint_storage(StorageConfig::Custom(storage.clone()));
    env.restore_from(&latest);
    let r = env.execute().bounded().await.unwrap();
    assert_eq!(totals.get(), expected(RECORDS));
    assert_restored(
        &r,
        RECORDS,
        "restored from a location of the custom storage",
    );
    assert!(
        r.restored_from
            .as_deref()
            .is_some_and(|f| f.starts_with("object://")),
        "{:?}",
        r.restored_from
    );
    assert!(
        counters.get().0 > reads_before,
        "the restore did not read through the object"
    );
}

/// A URL whose scheme no one registered is refused at once, naming the scheme.
#[test]
fn an_unregistered_scheme_is_named() {
    let e = StorageConfig::from_location("nosuch://bucket/x").unwrap_err();
    assert!(e.to_string().contains("nosuch://"), "{e}");
}
