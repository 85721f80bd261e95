//! [`FaultInjectingStorage`]: a [`CheckpointStorage`] that wraps another and makes some of its
//! operations fail, deterministically from a seed, to test how the rest of the system copes.
//!
//! It is the "layer" pattern of opendal's `ChaosLayer`, but over Weir's storage seam rather than
//! over an opendal operator, so it works with every [`CheckpointStorage`] (opendal-backed or
//! not) and fails whole checkpoint operations (`write_state`, `write_metadata`, …) rather than
//! single service calls.
//!
//! - **Writes** ([`init_location`](CheckpointStorage::init_location),
//!   [`write_state`](CheckpointStorage::write_state),
//!   [`write_metadata`](CheckpointStorage::write_metadata)) fail at the write fault rate.
//! - **Reads** ([`read_state`](CheckpointStorage::read_state),
//!   [`read_metadata`](CheckpointStorage::read_metadata),
//!   [`list_checkpoints`](CheckpointStorage::list_checkpoints),
//!   [`find_checkpoints`](CheckpointStorage::find_checkpoints),
//!   [`list_files`](CheckpointStorage::list_files)) fail at the read fault rate (0 unless set).
//! - [`check_writable`](CheckpointStorage::check_writable), the lock's calls
//!   ([`read_lock`](CheckpointStorage::read_lock), [`take_lock`](CheckpointStorage::take_lock),
//!   [`renew_lock`](CheckpointStorage::renew_lock),
//!   [`release_lock`](CheckpointStorage::release_lock)),
//!   [`discard`](CheckpointStorage::discard) and [`delete_file`](CheckpointStorage::delete_file)
//!   are never failed (a job that cannot start, or a
//!   leftover directory, tests nothing of the checkpoint protocol); they are counted and delayed.
//!
//! An injected fault is a [`CheckpointError::Storage`] whose opendal error has kind
//! [`ErrorKind::Unexpected`], is marked temporary and whose message starts with
//! [`INJECTED_FAULT`] (`"injected fault"`); [`is_injected_fault`] recognises one. A failed
//! operation never reaches the wrapped storage, so it has no effect there.
//!
//! Determinism: the `n`-th write (counting from 0) fails exactly when the `n`-th output of a
//! SplitMix64 stream seeded from the seed, as a number in `[0, 1)`, is below the write rate; reads
//! have a stream of their own. So the same seed and the same sequence of operations give the same
//! faults, a rate of 0 never fails, a rate of 1 always fails, and for one seed the faults at a
//! lower rate are a subset of those at a higher one. Concurrent callers draw in the order they
//! call, which a multi-threaded job does not fix: there, the seed fixes the fault pattern over
//! operation indices, not which task's operation gets which index.
//!
//! Delays: this crate runs on no particular async runtime (an architecture invariant), so a delay
//! needs the caller's sleep function, for example with tokio:
//! ```
//! # use std::{sync::Arc, time::Duration};
//! # use weir_checkpoint::OpendalCheckpointStorage;
//! # use weir_checkpoint::storage::faults::{FaultInjectingStorage, SleepFn};
//! # let inner = Arc::new(OpendalCheckpointStorage::memory().unwrap());
//! let sleep: SleepFn = Arc::new(|d| Box::pin(tokio::time::sleep(d)));
//! let storage = FaultInjectingStorage::new(inner, 7).with_delay(Duration::from_millis(5), sleep);
//! ```

use super::{CheckpointListing, CheckpointLocation, CheckpointStorage, JobLock};
use crate::{CheckpointError, CheckpointMetadata};
use async_trait::async_trait;
use bytes::Bytes;
use futures::future::BoxFuture;
use opendal::ErrorKind;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;
use weir_core::handle::StreamStateHandle;
use weir_core::ids::{CheckpointId, JobId};

/// The start of the message of every injected fault.
pub const INJECTED_FAULT: &str = "injected fault";

/// An asynchronous sleep supplied by the caller (this crate depends on no async runtime), for
/// [`FaultInjectingStorage::with_delay`]. With tokio: `Arc::new(|d| Box::pin(tokio::time::sleep(d)))`.
pub type SleepFn = Arc<dyn Fn(Duration) -> BoxFuture<'static, ()> + Send + Sync>;

/// Whether `error` is a fault injected by a [`FaultInjectingStorage`]: a
/// [`CheckpointError::Storage`] of kind [`ErrorKind::Unexpected`] whose message starts with
/// [`INJECTED_FAULT`]. (Errors that reach the runtime's reports as strings contain
/// `"injected fault"`.)
pub fn is_injected_fault(error: &CheckpointError) -> bool {
    matches!(error, CheckpointError::Storage { source, .. }
        if source.kind() == ErrorKind::Unexpected && source.message().starts_with(INJECTED_FAULT))
}

/// The two classes of operations that faults are injected into, each with its own rate, limit,
/// random stream and counters.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum OpKind {
    /// `init_location`, `write_state`, `write_metadata`.
    Write,
    /// `read_state`, `read_metadata`, `list_checkpoints`, `find_checkpoints`.
    Read,
}

impl fmt::Display for OpKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            OpKind::Write => "write",
            OpKind::Read => "read",
        })
    }
}

/// A snapshot of a [`FaultInjectingStorage`]'s counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FaultStats {
    /// Every operation called (all but `describe`), failed or not.
    pub operations: u64,
    /// Write operations called (the faults among them included).
    pub writes: u64,
    /// Read operations called (the faults among them included).
    pub reads: u64,
    /// Faults injected into writes.
    pub write_faults: u64,
    /// Faults injected into reads.
    pub read_faults: u64,
}

impl FaultStats {
    /// Faults injected in all.
    pub fn injected_faults(&self) -> u64 {
        self.write_faults + self.read_faults
    }
}

use weir_core::splitmix::{GOLDEN_GAMMA, mix64};

/// The `index`-th output (from 0) of the SplitMix64 generator seeded with `seed`. SplitMix64's
/// state only advances by a constant, so any output can be computed directly.
fn splitmix64(seed: u64, index: u64) -> u64 {
    mix64(seed.wrapping_add(index.wrapping_add(1).wrapping_mul(GOLDEN_GAMMA)))
}

/// `x`'s top 53 bits as a number in `[0, 1)`.
fn unit_interval(x: u64) -> f64 {
    (x >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
}

/// Checks that `rate` is a probability.
fn validate_rate(kind: OpKind, rate: f64) -> Result<(), CheckpointError> {
    if (0.0..=1.0).contains(&rate) {
        Ok(())
    } else {
        Err(CheckpointError::Config(format!(
            "the {kind} fault rate must be between 0.0 and 1.0, got {rate}"
        )))
    }
}

/// One class of operations: its rate, limit, random stream and counters.
#[derive(Debug)]
struct FaultSwitch {
    /// The seed of this class's random stream.
    stream_seed: u64,
    /// The rate, as `f64` bits.
    rate_bits: AtomicU64,
    /// No more faults once this many were injected (`u64::MAX`: no limit).
    limit: AtomicU64,
    /// Operations called.
    operations: AtomicU64,
    /// Faults injected.
    faults: AtomicU64,
}

/// A fault decided for an operation.
struct Fault {
    /// The operation's index in its class (from 0).
    index: u64,
    /// The fault's number in its class (from 1).
    number: u64,
}

impl FaultSwitch {
    fn new(seed: u64, kind: OpKind) -> Self {
        // Each class's stream is seeded differently, so reads and writes draw independently.
        let tag: u64 = match kind {
            OpKind::Write => u64::from_be_bytes(*b"\0\0WRITES"),
            OpKind::Read => u64::from_be_bytes(*b"\0\0\0READS"),
        };
        FaultSwitch {
            stream_seed: mix64(seed ^ tag),
            rate_bits: AtomicU64::new(0f64.to_bits()),
            limit: AtomicU64::new(u64::MAX),
            operations: AtomicU64::new(0),
            faults: AtomicU64::new(0),
        }
    }

    fn rate(&self) -> f64 {
        f64::from_bits(self.rate_bits.load(Ordering::SeqCst))
    }

    /// Counts one operation and decides whether it fails.
    fn decide(&self) -> Option<Fault> {
        let index = self.operations.fetch_add(1, Ordering::SeqCst);
        let draw = unit_interval(splitmix64(self.stream_seed, index));
        if draw >= self.rate() {
            return None;
        }
        let limit = self.limit.load(Ordering::SeqCst);
        let previous = self
            .faults
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |f| {
                (f < limit).then_some(f + 1)
            })
            .ok()?;
        Some(Fault {
            index,
            number: previous + 1,
        })
    }
}

/// A [`CheckpointStorage`] that delegates to another and injects faults into its writes (and,
/// if asked, its reads) at configurable rates, from a seeded deterministic random stream, with an
/// optional delay per operation. See the [module documentation](self) for what is failed, how
/// faults look and what is deterministic.
///
/// Rates and limits can be changed while the storage is in use (through `&self`), so a test can
/// for example turn read faults on just before it makes a job fail over.
///
/// ```
/// # use std::sync::Arc;
/// # use weir_checkpoint::OpendalCheckpointStorage;
/// # use weir_checkpoint::storage::faults::{FaultInjectingStorage, OpKind};
/// # fn main() -> Result<(), weir_checkpoint::CheckpointError> {
/// let inner = Arc::new(OpendalCheckpointStorage::memory()?);
/// // One write in ten fails; reads never do.
/// let storage = FaultInjectingStorage::new(inner, 42).with_write_faults(0.1)?;
/// assert_eq!(storage.fault_rate(OpKind::Write), 0.1);
/// assert_eq!(storage.stats().injected_faults(), 0);
/// # Ok(())
/// # }
/// ```
pub struct FaultInjectingStorage {
    inner: Arc<dyn CheckpointStorage>,
    seed: u64,
    writes: FaultSwitch,
    reads: FaultSwitch,
    operations: AtomicU64,
    delay: Option<(Duration, SleepFn)>,
    /// Every fault injected so far, in order.
    injected: Mutex<Vec<InjectedFault>>,
}

/// One injected fault: which operation failed and on which path, so a test can check what a
/// recovery did next (for example, that it fell back past the checkpoint whose read failed).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InjectedFault {
    /// Read or write.
    pub kind: OpKind,
    /// The operation, for example `"read_metadata"`.
    pub operation: &'static str,
    /// The path the operation was for, as in the fault's error.
    pub path: String,
}

impl fmt::Debug for FaultInjectingStorage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FaultInjectingStorage")
            .field("inner", &self.inner.describe())
            .field("seed", &self.seed)
            .field("write_rate", &self.writes.rate())
            .field("read_rate", &self.reads.rate())
            .field("delay", &self.delay.as_ref().map(|(d, _)| *d))
            .field("stats", &self.stats())
            .finish()
    }
}

impl FaultInjectingStorage {
    /// Wraps `inner`, with fault decisions drawn from `seed`. No faults and no delay until set.
    pub fn new(inner: Arc<dyn CheckpointStorage>, seed: u64) -> Self {
        FaultInjectingStorage {
            inner,
            seed,
            writes: FaultSwitch::new(seed, OpKind::Write),
            reads: FaultSwitch::new(seed, OpKind::Read),
            operations: AtomicU64::new(0),
            delay: None,
            injected: Mutex::new(Vec::new()),
        }
    }

    /// Fails writes at `rate` (a probability in `[0, 1]`; anything else, NaN included, is a
    /// [`CheckpointError::Config`] error).
    pub fn with_write_faults(self, rate: f64) -> Result<Self, CheckpointError> {
        self.set_fault_rate(OpKind::Write, rate)?;
        Ok(self)
    }

    /// Fails reads at `rate` (a probability in `[0, 1]`; anything else, NaN included, is a
    /// [`CheckpointError::Config`] error).
    pub fn with_read_faults(self, rate: f64) -> Result<Self, CheckpointError> {
        self.set_fault_rate(OpKind::Read, rate)?;
        Ok(self)
    }

    /// Stops injecting faults of `kind` once `limit` of them were injected in all (`None`: no
    /// limit, the default).
    pub fn with_fault_limit(self, kind: OpKind, limit: Option<u64>) -> Self {
        self.set_fault_limit(kind, limit);
        self
    }

    /// Waits `delay` at the start of every operation (failed ones included), with `sleep`.
    pub fn with_delay(mut self, delay: Duration, sleep: SleepFn) -> Self {
        self.delay = Some((delay, sleep));
        self
    }

    /// Sets the fault rate of `kind` (a probability in `[0, 1]`; anything else, NaN included, is
    /// a [`CheckpointError::Config`] error and changes nothing). Takes effect for the next
    /// operation.
    pub fn set_fault_rate(&self, kind: OpKind, rate: f64) -> Result<(), CheckpointError> {
        validate_rate(kind, rate)?;
        self.switch(kind)
            .rate_bits
            .store(rate.to_bits(), Ordering::SeqCst);
        Ok(())
    }

    /// The fault rate of `kind`.
    pub fn fault_rate(&self, kind: OpKind) -> f64 {
        self.switch(kind).rate()
    }

    /// Stops injecting faults of `kind` once `limit` of them were injected in all, counting those
    /// already injected (`None`: no limit).
    pub fn set_fault_limit(&self, kind: OpKind, limit: Option<u64>) {
        self.switch(kind)
            .limit
            .store(limit.unwrap_or(u64::MAX), Ordering::SeqCst);
    }

    /// The fault limit of `kind` (`None`: no limit).
    pub fn fault_limit(&self, kind: OpKind) -> Option<u64> {
        let limit = self.switch(kind).limit.load(Ordering::SeqCst);
        (limit != u64::MAX).then_some(limit)
    }

    /// The seed.
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// The wrapped storage.
    pub fn inner(&self) -> &Arc<dyn CheckpointStorage> {
        &self.inner
    }

    /// Every operation called so far (all but `describe`), failed or not.
    pub fn operations(&self) -> u64 {
        self.operations.load(Ordering::SeqCst)
    }

    /// Faults injected so far, writes and reads.
    pub fn injected_faults(&self) -> u64 {
        self.stats().injected_faults()
    }

    /// Every fault injected so far, in the order they were injected.
    pub fn injected(&self) -> Vec<InjectedFault> {
        self.injected
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// All counters.
    pub fn stats(&self) -> FaultStats {
        FaultStats {
            operations: self.operations.load(Ordering::SeqCst),
            writes: self.writes.operations.load(Ordering::SeqCst),
            reads: self.reads.operations.load(Ordering::SeqCst),
            write_faults: self.writes.faults.load(Ordering::SeqCst),
            read_faults: self.reads.faults.load(Ordering::SeqCst),
        }
    }

    fn switch(&self, kind: OpKind) -> &FaultSwitch {
        match kind {
            OpKind::Write => &self.writes,
            OpKind::Read => &self.reads,
        }
    }

    /// The user-facing name of `rel` (relative to the root): the inner storage's description
    /// followed by the path.
    fn full_path(&self, rel: &str) -> String {
        let root = self.inner.describe();
        if rel.is_empty() || root.ends_with('/') {
            format!("{root}{rel}")
        } else {
            format!("{root}/{rel}")
        }
    }

    /// The start of every operation: counts it, decides whether it fails (when it is of a class
    /// that can), waits the delay, and returns the fault, which names `rel()`.
    async fn enter(
        &self,
        kind: Option<OpKind>,
        operation: &'static str,
        rel: impl FnOnce() -> String,
    ) -> Result<(), CheckpointError> {
        self.operations.fetch_add(1, Ordering::SeqCst);
        let fault = kind.and_then(|k| self.switch(k).decide().map(|f| (k, f)));
        if let Some((delay, sleep)) = &self.delay
            && !delay.is_zero()
        {
            sleep(*delay).await;
        }
        match fault {
            None => Ok(()),
            Some((kind, fault)) => {
                let path = self.full_path(&rel());
                self.injected
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .push(InjectedFault {
                        kind,
                        operation,
                        path: path.clone(),
                    });
                Err(CheckpointError::Storage {
                path,
                source: opendal::Error::new(
                    ErrorKind::Unexpected,
                    format!(
                        "{INJECTED_FAULT} in {operation} ({kind} fault {}, at {kind} operation {} of seed {})",
                        fault.number, fault.index, self.seed
                    ),
                )
                .with_operation(operation)
                .set_temporary(),
            })
            }
        }
    }
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

#[async_trait]
impl CheckpointStorage for FaultInjectingStorage {
    fn describe(&self) -> String {
        self.inner.describe()
    }

    fn location_path(&self, location: &CheckpointLocation) -> String {
        self.inner.location_path(location)
    }

    async fn check_writable(&self) -> Result<(), CheckpointError> {
        self.enter(None, "check_writable", String::new).await?;
        self.inner.check_writable().await
    }

    async fn init_location(
        &self,
        job: JobId,
        id: CheckpointId,
    ) -> Result<CheckpointLocation, CheckpointError> {
        self.enter(Some(OpKind::Write), "init_location", || {
            CheckpointLocation::for_checkpoint(job, id).dir
        })
        .await?;
        self.inner.init_location(job, id).await
    }

    async fn write_state(
        &self,
        location: &CheckpointLocation,
        name: &str,
        bytes: Bytes,
    ) -> Result<StreamStateHandle, CheckpointError> {
        self.enter(Some(OpKind::Write), "write_state", || {
            format!("{}{name}", dir_of(location))
        })
        .await?;
        self.inner.write_state(location, name, bytes).await
    }

    async fn write_shared_state(
        &self,
        location: &CheckpointLocation,
        name: &str,
        bytes: Bytes,
    ) -> Result<StreamStateHandle, CheckpointError> {
        self.enter(Some(OpKind::Write), "write_shared_state", || {
            format!("{}../shared/{name}", dir_of(location))
        })
        .await?;
        self.inner.write_shared_state(location, name, bytes).await
    }

    async fn discard_state(
        &self,
        location: &CheckpointLocation,
        handle: &StreamStateHandle,
    ) -> Result<(), CheckpointError> {
        self.enter(None, "discard_state", || dir_of(location))
            .await?;
        self.inner.discard_state(location, handle).await
    }

    async fn read_state(
        &self,
        location: &CheckpointLocation,
        handle: &StreamStateHandle,
        range: Option<(u64, u64)>,
    ) -> Result<Bytes, CheckpointError> {
        self.enter(Some(OpKind::Read), "read_state", || match handle.path() {
            Some(path) => format!("{}{path}", dir_of(location)),
            None => format!("{}<inline state>", dir_of(location)),
        })
        .await?;
        self.inner.read_state(location, handle, range).await
    }

    async fn write_metadata(
        &self,
        location: &CheckpointLocation,
        metadata: &CheckpointMetadata,
    ) -> Result<(), CheckpointError> {
        self.enter(Some(OpKind::Write), "write_metadata", || {
            format!("{}_metadata", dir_of(location))
        })
        .await?;
        self.inner.write_metadata(location, metadata).await
    }

    async fn read_metadata(
        &self,
        location: &CheckpointLocation,
    ) -> Result<CheckpointMetadata, CheckpointError> {
        self.enter(Some(OpKind::Read), "read_metadata", || {
            format!("{}_metadata", dir_of(location))
        })
        .await?;
        self.inner.read_metadata(location).await
    }

    async fn discard(&self, location: &CheckpointLocation) -> Result<(), CheckpointError> {
        self.enter(None, "discard", || dir_of(location)).await?;
        self.inner.discard(location).await
    }

    async fn list_checkpoints(
        &self,
        job: JobId,
    ) -> Result<Vec<CheckpointListing>, CheckpointError> {
        self.enter(Some(OpKind::Read), "list_checkpoints", || format!("{job}/"))
            .await?;
        self.inner.list_checkpoints(job).await
    }

    async fn find_checkpoints(
        &self,
        path: &str,
    ) -> Result<Vec<CheckpointListing>, CheckpointError> {
        self.enter(Some(OpKind::Read), "find_checkpoints", || path.to_string())
            .await?;
        self.inner.find_checkpoints(path).await
    }

    async fn read_lock(&self, job: JobId) -> Result<Option<JobLock>, CheckpointError> {
        self.enter(None, "read_lock", || format!("{job}/_lock"))
            .await?;
        self.inner.read_lock(job).await
    }

    async fn take_lock(
        &self,
        job: JobId,
        generation: u64,
        content: &str,
    ) -> Result<(), CheckpointError> {
        self.enter(None, "take_lock", || format!("{job}/_lock"))
            .await?;
        self.inner.take_lock(job, generation, content).await
    }

    async fn renew_lock(
        &self,
        job: JobId,
        generation: u64,
        content: &str,
    ) -> Result<(), CheckpointError> {
        self.enter(None, "renew_lock", || format!("{job}/_lock"))
            .await?;
        self.inner.renew_lock(job, generation, content).await
    }

    async fn release_lock(&self, job: JobId, generation: u64) -> Result<(), CheckpointError> {
        self.enter(None, "release_lock", || format!("{job}/_lock"))
            .await?;
        self.inner.release_lock(job, generation).await
    }

    async fn list_files(&self, dir: &str) -> Result<Vec<String>, CheckpointError> {
        self.enter(Some(OpKind::Read), "list_files", || dir.to_string())
            .await?;
        self.inner.list_files(dir).await
    }

    async fn delete_file(&self, path: &str) -> Result<(), CheckpointError> {
        self.enter(None, "delete_file", || path.to_string()).await?;
        self.inner.delete_file(path).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::OpendalCheckpointStorage;
    use std::sync::Mutex;
    use weir_core::element::SnapshotKind;

    fn memory() -> Arc<dyn CheckpointStorage> {
        Arc::new(
            OpendalCheckpointStorage::memory()
                .unwrap()
                .with_inline_threshold(0),
        )
    }

    fn metadata(job: JobId, id: u64) -> CheckpointMetadata {
        CheckpointMetadata {
            job_id: job,
            job_name: "faults".to_string(),
            checkpoint_id: CheckpointId(id),
            kind: SnapshotKind::Checkpoint,
            trigger_timestamp_ms: 1,
            completion_timestamp_ms: 2,
            weir_version: "test".to_string(),
            operators: Vec::new(),
            in_flight: Vec::new(),
            fingerprint: None,
            tuning: None,
            format_version: crate::metadata::METADATA_VERSION,
        }
    }

    fn location(id: u64) -> CheckpointLocation {
        CheckpointLocation::for_checkpoint(JobId::from_name("faults"), CheckpointId(id))
    }

    /// Runs `n` write_state calls and returns which failed.
    async fn write_pattern(storage: &FaultInjectingStorage, n: usize) -> Vec<bool> {
        let loc = location(1);
        let mut failed = Vec::with_capacity(n);
        for i in 0..n {
            let r = storage
                .write_state(&loc, &format!("s{i}"), Bytes::from_static(b"x"))
                .await;
            if let Err(e) = &r {
                assert!(is_injected_fault(e), "{e:?}");
            }
            failed.push(r.is_err());
        }
        failed
    }

    #[test]
    fn splitmix64_matches_the_reference_sequence() {
        // The first outputs of the reference SplitMix64 (Vigna's splitmix64.c) seeded with 0.
        assert_eq!(splitmix64(0, 0), 0xE220_A839_7B1D_CDAF);
        assert_eq!(splitmix64(0, 1), 0x6E78_9E6A_A1B9_65F4);
        assert_eq!(splitmix64(0, 2), 0x06C4_5D18_8009_454F);
        assert_eq!(unit_interval(0), 0.0);
        assert!(unit_interval(u64::MAX) < 1.0);
    }

    #[tokio::test]
    async fn rate_zero_never_fails_and_passes_everything_through() {
        let storage = FaultInjectingStorage::new(memory(), 1);
        assert_eq!(storage.fault_rate(OpKind::Write), 0.0);
        assert_eq!(storage.fault_rate(OpKind::Read), 0.0);
        let job = JobId::from_name("faults");
        storage.check_writable().await.unwrap();
        for id in 1..=200 {
            let loc = storage.init_location(job, CheckpointId(id)).await.unwrap();
            let h = storage
                .write_state(&loc, "s", Bytes::from(vec![id as u8; 10]))
                .await
                .unwrap();
            storage
                .write_metadata(&loc, &metadata(job, id))
                .await
                .unwrap();
            assert_eq!(
                storage.read_metadata(&loc).await.unwrap(),
                metadata(job, id)
            );
            assert_eq!(
                storage.read_state(&loc, &h, None).await.unwrap(),
                vec![id as u8; 10]
            );
        }
        assert_eq!(storage.list_checkpoints(job).await.unwrap().len(), 200);
        assert_eq!(storage.find_checkpoints("").await.unwrap().len(), 200);
        storage.discard(&location(1)).await.unwrap();
        assert_eq!(
            storage.stats(),
            FaultStats {
                operations: 1 + 200 * 5 + 2 + 1,
                writes: 200 * 3,
                reads: 200 * 2 + 2,
                write_faults: 0,
                read_faults: 0,
            }
        );
        assert_eq!(storage.operations(), 1004);
        assert_eq!(storage.injected_faults(), 0);
    }

    #[tokio::test]
    async fn rate_one_fails_every_write_without_touching_the_inner_storage() {
        let inner = memory();
        let storage = FaultInjectingStorage::new(inner.clone(), 2)
            .with_write_faults(1.0)
            .unwrap();
        let job = JobId::from_name("faults");
        let loc = location(3);
        let e = storage
            .init_location(job, CheckpointId(3))
            .await
            .unwrap_err();
        assert!(is_injected_fault(&e), "{e:?}");
        assert_eq!(e.storage_kind(), Some(ErrorKind::Unexpected));
        let e = storage
            .write_state(&loc, "state", Bytes::from_static(b"abc"))
            .await
            .unwrap_err();
        assert!(is_injected_fault(&e));
        let message = e.to_string();
        assert!(message.contains("injected fault"), "{message}");
        assert!(message.contains("write_state"), "{message}");
        assert!(
            message.contains(&format!("memory://{job}/chk-3/state")),
            "{message}"
        );
        match &e {
            CheckpointError::Storage { source, .. } => assert!(source.is_temporary()),
            other => panic!("expected a Storage error, got {other:?}"),
        }
        let e = storage
            .write_metadata(&loc, &metadata(job, 3))
            .await
            .unwrap_err();
        assert!(is_injected_fault(&e));
        assert!(e.to_string().contains("_metadata"), "{e}");
        // Nothing reached the inner storage.
        assert!(inner.list_checkpoints(job).await.unwrap().is_empty());
        // Reads, check_writable and discard are not failed.
        storage.check_writable().await.unwrap();
        assert!(storage.list_checkpoints(job).await.unwrap().is_empty());
        let e = storage.read_metadata(&loc).await.unwrap_err();
        assert!(!is_injected_fault(&e), "{e:?}");
        assert_eq!(e.storage_kind(), Some(ErrorKind::NotFound));
        storage.discard(&loc).await.unwrap();
        let stats = storage.stats();
        assert_eq!((stats.writes, stats.write_faults), (3, 3));
        assert_eq!((stats.reads, stats.read_faults), (2, 0));
        assert_eq!(stats.operations, 7);
    }

    #[tokio::test]
    async fn read_faults_are_optional_and_separate() {
        let inner = memory();
        let job = JobId::from_name("faults");
        let loc = inner.init_location(job, CheckpointId(1)).await.unwrap();
        let h = inner
            .write_state(&loc, "s", Bytes::from_static(b"state"))
            .await
            .unwrap();
        inner.write_metadata(&loc, &metadata(job, 1)).await.unwrap();
        let storage = FaultInjectingStorage::new(inner, 3)
            .with_read_faults(1.0)
            .unwrap();
        for e in [
            storage.read_state(&loc, &h, None).await.unwrap_err(),
            storage
                .read_state(&loc, &h, Some((0, 2)))
                .await
                .unwrap_err(),
            storage.read_metadata(&loc).await.unwrap_err(),
            storage.list_checkpoints(job).await.unwrap_err(),
            storage.find_checkpoints("").await.unwrap_err(),
        ] {
            assert!(is_injected_fault(&e), "{e:?}");
        }
        let e = storage.read_state(&loc, &h, None).await.unwrap_err();
        assert!(e.to_string().contains(&format!("{job}/chk-1/s")), "{e}");
        let inline = StreamStateHandle::Inline(b"x".to_vec());
        let e = storage.read_state(&loc, &inline, None).await.unwrap_err();
        assert!(e.to_string().contains("<inline state>"), "{e}");
        // Writes still succeed.
        storage
            .write_state(&loc, "t", Bytes::from_static(b"more"))
            .await
            .unwrap();
        let stats = storage.stats();
        assert_eq!((stats.reads, stats.read_faults), (7, 7));
        assert_eq!((stats.writes, stats.write_faults), (1, 0));
        // Each fault is recorded with its operation and path.
        let injected = storage.injected();
        assert_eq!(injected.len(), 7);
        assert!(injected.iter().all(|f| f.kind == OpKind::Read));
        assert_eq!(injected[2].operation, "read_metadata");
        assert!(
            injected[2]
                .path
                .ends_with(&format!("{job}/chk-1/_metadata")),
            "{injected:?}"
        );
        assert_eq!(injected[3].operation, "list_checkpoints");
        // Turned off while in use.
        storage.set_fault_rate(OpKind::Read, 0.0).unwrap();
        assert_eq!(storage.read_metadata(&loc).await.unwrap(), metadata(job, 1));
    }

    #[tokio::test]
    async fn the_same_seed_gives_the_same_faults() {
        for rate in [0.1, 0.5, 0.9] {
            let a = FaultInjectingStorage::new(memory(), 77)
                .with_write_faults(rate)
                .unwrap();
            let b = FaultInjectingStorage::new(memory(), 77)
                .with_write_faults(rate)
                .unwrap();
            let c = FaultInjectingStorage::new(memory(), 78)
                .with_write_faults(rate)
                .unwrap();
            let pa = write_pattern(&a, 300).await;
            assert_eq!(pa, write_pattern(&b, 300).await, "rate {rate}");
            assert_ne!(pa, write_pattern(&c, 300).await, "rate {rate}");
            assert_eq!(a.stats(), b.stats());
        }
    }

    #[tokio::test]
    async fn reads_do_not_shift_the_write_faults() {
        let a = FaultInjectingStorage::new(memory(), 5)
            .with_write_faults(0.5)
            .unwrap()
            .with_read_faults(0.5)
            .unwrap();
        let b = FaultInjectingStorage::new(memory(), 5)
            .with_write_faults(0.5)
            .unwrap();
        let mut pa = Vec::new();
        for i in 0..100 {
            pa.extend(write_pattern(&a, 1).await);
            for _ in 0..i % 3 {
                let _ = a.read_metadata(&location(9)).await;
            }
        }
        assert_eq!(pa, write_pattern(&b, 100).await);
    }

    #[tokio::test]
    async fn the_fault_fraction_follows_the_rate_and_lower_rates_fail_a_subset() {
        let n = 4000;
        let mut previous: Option<Vec<bool>> = None;
        for rate in [0.0, 0.1, 0.3, 0.5, 0.9, 1.0] {
            let s = FaultInjectingStorage::new(memory(), 11)
                .with_write_faults(rate)
                .unwrap();
            let pattern = write_pattern(&s, n).await;
            let faults = pattern.iter().filter(|f| **f).count();
            assert_eq!(s.stats().write_faults, faults as u64);
            let fraction = faults as f64 / n as f64;
            assert!(
                (fraction - rate).abs() < 0.03,
                "rate {rate}: {faults} faults in {n}"
            );
            if let Some(prev) = &previous {
                assert!(
                    prev.iter().zip(&pattern).all(|(p, q)| !p || *q),
                    "the faults at a lower rate are a subset of those at {rate}"
                );
            }
            previous = Some(pattern);
        }
    }

    #[tokio::test]
    async fn the_limit_stops_faults() {
        let s = FaultInjectingStorage::new(memory(), 4)
            .with_write_faults(1.0)
            .unwrap()
            .with_fault_limit(OpKind::Write, Some(3));
        assert_eq!(s.fault_limit(OpKind::Write), Some(3));
        assert_eq!(s.fault_limit(OpKind::Read), None);
        let pattern = write_pattern(&s, 10).await;
        assert_eq!(pattern.iter().filter(|f| **f).count(), 3);
        assert!(pattern[..3].iter().all(|f| *f));
        // Raising the limit counts the faults already injected.
        s.set_fault_limit(OpKind::Write, Some(5));
        assert_eq!(write_pattern(&s, 4).await, [true, true, false, false]);
        s.set_fault_limit(OpKind::Write, None);
        assert_eq!(write_pattern(&s, 2).await, [true, true]);
        assert_eq!(s.stats().write_faults, 7);
        assert_eq!(s.stats().writes, 16);
    }

    #[test]
    fn invalid_rates_are_refused_and_change_nothing() {
        let s = FaultInjectingStorage::new(memory(), 0)
            .with_write_faults(0.25)
            .unwrap();
        for rate in [-0.1, 1.5, f64::NAN, f64::INFINITY] {
            let e = s.set_fault_rate(OpKind::Write, rate).unwrap_err();
            assert!(matches!(&e, CheckpointError::Config(m) if m.contains("write fault rate")));
            assert_eq!(s.fault_rate(OpKind::Write), 0.25);
        }
        assert!(
            FaultInjectingStorage::new(memory(), 0)
                .with_read_faults(2.0)
                .is_err()
        );
    }

    #[tokio::test]
    async fn every_operation_waits_the_delay_with_the_callers_sleep() {
        let slept: Arc<Mutex<Vec<Duration>>> = Arc::default();
        let record = slept.clone();
        let sleep: SleepFn = Arc::new(move |d| {
            record.lock().unwrap().push(d);
            Box::pin(async {})
        });
        let s = FaultInjectingStorage::new(memory(), 9)
            .with_write_faults(1.0)
            .unwrap()
            .with_delay(Duration::from_millis(3), sleep);
        let job = JobId::from_name("faults");
        s.check_writable().await.unwrap();
        assert!(s.init_location(job, CheckpointId(1)).await.is_err());
        assert!(s.read_metadata(&location(1)).await.is_err());
        s.discard(&location(1)).await.unwrap();
        assert_eq!(*slept.lock().unwrap(), vec![Duration::from_millis(3); 4]);
        assert!(format!("{s:?}").contains("3ms"), "{s:?}");
    }

    #[tokio::test]
    async fn a_real_sleep_delays() {
        let sleep: SleepFn = Arc::new(|d| Box::pin(tokio::time::sleep(d)));
        let s =
            FaultInjectingStorage::new(memory(), 9).with_delay(Duration::from_millis(20), sleep);
        let start = std::time::Instant::now();
        s.check_writable().await.unwrap();
        assert!(start.elapsed() >= Duration::from_millis(20));
    }
}
