//! Choosing a keyed-state backend: the [`StateBackend`] a job is configured with (Flink's
//! `StateBackend#createKeyedStateBackend`), and [`KeyedBackend`], what each keyed operator runs
//! on.
//!
//! A [`StateBackend`] is object-safe, so a job can hold any: it creates, for one keyed operator
//! in one subtask, either the heap tables ([`KeyedBackendKind::Heap`]) or a [`KeyedStore`] of
//! bytes. [`KeyedBackend`] is the typed backend either way; it dispatches by a `match`, so the
//! heap's hot path stays statically dispatched and inlined.

use crate::StateError;
use crate::disk::{DiskKeyedStore, DiskOptions, DiskStats};
use crate::format::{Compression, StateKind};
use crate::heap::{HeapKeyedStateBackend, HeapValueAccess};
use crate::keyed::{
    KeyedSnapshot, KeyedStateBackend, NativeRestorePart, RestoreFilePart, RestorePart, StateKey,
    StateOptions, StateValue, ValueState,
};
use crate::keyed::{NativeFile, TtlClock};
use crate::store::{KeyedStore, MemoryKeyedStore, StoreKeyedStateBackend};
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use weir_core::ids::OperatorId;
use weir_core::keygroup::{KeyGroup, KeyGroupRange};

/// What a [`StateBackend`] knows of the keyed operator and subtask it creates a backend for.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct KeyedBackendParameters {
    /// The operator (stable across runs: derived from its uid or its place in the graph).
    pub operator_id: OperatorId,
    /// The operator's name.
    pub operator_name: String,
    /// The subtask's index.
    pub subtask_index: u32,
    /// The attempt of the subtask (0 at first, then one more per restart).
    pub attempt: u32,
    /// Whether the subtask restores from a checkpoint or savepoint (a restore follows the
    /// creation, before any state is registered), at the job's start or after a failure.
    pub restored: bool,
    /// The number of key groups keys are hashed into.
    pub max_parallelism: u32,
    /// The key groups this subtask owns.
    pub key_group_range: KeyGroupRange,
    /// How snapshots compress each key group.
    pub compression: Compression,
    /// Incremental checkpoints: the most snapshots in a chain, or `None` for full ones.
    pub incremental: Option<u32>,
}

impl KeyedBackendParameters {
    /// The parameters of subtask `subtask_index` owning `key_group_range` of `max_parallelism`,
    /// with the other fields at their defaults (first attempt, no compression, full snapshots).
    pub fn new(
        operator_id: OperatorId,
        operator_name: impl Into<String>,
        subtask_index: u32,
        max_parallelism: u32,
        key_group_range: KeyGroupRange,
    ) -> Self {
        KeyedBackendParameters {
            operator_id,
            operator_name: operator_name.into(),
            subtask_index,
            attempt: 0,
            restored: false,
            max_parallelism,
            key_group_range,
            compression: Compression::None,
            incremental: None,
        }
    }

    /// These parameters, for attempt `attempt` (restored or not), with `compression` and
    /// `incremental`.
    pub fn with(
        mut self,
        attempt: u32,
        restored: bool,
        compression: Compression,
        incremental: Option<u32>,
    ) -> Self {
        self.attempt = attempt;
        self.restored = restored;
        self.compression = compression;
        self.incremental = incremental;
        self
    }
}

/// What a [`StateBackend`] creates for one keyed operator in one subtask.
pub enum KeyedBackendKind {
    /// The heap backend's typed tables.
    Heap,
    /// A store of bytes, behind [`StoreKeyedStateBackend`].
    Store(Box<dyn KeyedStore>),
}

impl fmt::Debug for KeyedBackendKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            KeyedBackendKind::Heap => "Heap",
            KeyedBackendKind::Store(_) => "Store",
        })
    }
}

/// Where a job keeps its keyed state: a factory of one backend per keyed operator and subtask
/// (Flink's `StateBackend`). Set with `env.set_state_backend(..)`; the default is
/// [`HeapStateBackend`].
///
/// In cluster mode every process builds the job, and so its backend, from the same program;
/// the job manager and each task manager compare the backends' [`name`](Self::name)s.
pub trait StateBackend: Send + Sync + fmt::Debug + 'static {
    /// A short name, printed by the job and compared across the processes of a cluster.
    fn name(&self) -> String;

    /// Creates the keyed backend of one keyed operator in one subtask, before its restore.
    fn create_keyed_backend(
        &self,
        parameters: &KeyedBackendParameters,
    ) -> Result<KeyedBackendKind, StateError>;

    /// The local directory of a backend that keeps files (where the runtime puts a native
    /// snapshot's files for a restore); `None` (the default) for one that does not.
    fn local_dir(&self) -> Option<PathBuf> {
        None
    }

    /// Checks, cheaply, that `file` (its `path` set) is a sound copy of a file of a native
    /// snapshot of `format` this backend wrote: how the runtime decides whether a local copy
    /// (local recovery) may stand in for a download. The default refuses, naming the backend:
    /// a backend without native snapshots has no file to check.
    fn check_native_file(&self, format: &str, file: &NativeFile) -> Result<(), StateError> {
        Err(StateError::Restore(format!(
            "the state backend '{}' cannot check file {} of a native snapshot of format {format:?}",
            self.name(),
            file.name
        )))
    }
}

/// A shared backend is the backend it shares.
impl<T: StateBackend + ?Sized> StateBackend for std::sync::Arc<T> {
    fn name(&self) -> String {
        (**self).name()
    }

    fn create_keyed_backend(
        &self,
        parameters: &KeyedBackendParameters,
    ) -> Result<KeyedBackendKind, StateError> {
        (**self).create_keyed_backend(parameters)
    }

    fn local_dir(&self) -> Option<PathBuf> {
        (**self).local_dir()
    }

    fn check_native_file(&self, format: &str, file: &NativeFile) -> Result<(), StateError> {
        (**self).check_native_file(format, file)
    }
}

/// Keyed state in typed hash tables on the heap (Flink's `HashMapStateBackend`): the default.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HeapStateBackend;

impl StateBackend for HeapStateBackend {
    fn name(&self) -> String {
        "heap".to_string()
    }

    fn create_keyed_backend(
        &self,
        _parameters: &KeyedBackendParameters,
    ) -> Result<KeyedBackendKind, StateError> {
        Ok(KeyedBackendKind::Heap)
    }
}

/// Keyed state as bytes in a [`MemoryKeyedStore`] per operator and subtask: the reference
/// store backend, which runs every keyed operator through the [`KeyedStore`] seam.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemoryStoreStateBackend;

impl StateBackend for MemoryStoreStateBackend {
    fn name(&self) -> String {
        "memory-store".to_string()
    }

    fn create_keyed_backend(
        &self,
        _parameters: &KeyedBackendParameters,
    ) -> Result<KeyedBackendKind, StateError> {
        Ok(KeyedBackendKind::Store(Box::new(MemoryKeyedStore::new())))
    }
}

/// The default local directory of the `disk` backend: `weir-state` in the system's temporary
/// directory (Flink's `io.tmp.dirs`).
pub fn default_disk_dir() -> PathBuf {
    std::env::temp_dir().join("weir-state")
}

/// Keyed state on local disk (Flink's `EmbeddedRocksDBStateBackend`): each keyed operator's
/// subtask gets a [`DiskKeyedStore`] in a directory of its own under [`dir`](Self::dir).
#[derive(Clone, Debug)]
pub struct DiskStateBackend {
    dir: PathBuf,
    options: DiskOptions,
    stats: Arc<DiskStats>,
    /// Whether the directories of dead processes were removed (before the first store).
    cleaned: Arc<std::sync::atomic::AtomicBool>,
}

/// Stores created by this process, to give each a directory of its own.
static STORES: AtomicU64 = AtomicU64::new(0);

impl DiskStateBackend {
    /// The backend with its stores under `dir` (Flink's `state.backend.rocksdb.localdir`).
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        DiskStateBackend {
            dir: dir.into(),
            options: DiskOptions::default(),
            stats: Arc::default(),
            cleaned: Arc::default(),
        }
    }

    /// The backend with these options.
    pub fn with_options(mut self, options: DiskOptions) -> Self {
        self.options = options;
        self
    }

    /// Where the stores go.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The work of every store this backend created.
    pub fn stats(&self) -> Arc<DiskStats> {
        Arc::clone(&self.stats)
    }
}

impl StateBackend for DiskStateBackend {
    fn name(&self) -> String {
        "disk".to_string()
    }

    fn local_dir(&self) -> Option<PathBuf> {
        Some(self.dir.clone())
    }

    fn check_native_file(&self, format: &str, file: &NativeFile) -> Result<(), StateError> {
        if !crate::disk::NATIVE_FORMATS_READ.contains(&format) {
            return Err(StateError::Restore(format!(
                "a native snapshot of format {format:?}: the disk backend reads {}",
                crate::disk::NATIVE_FORMATS_READ.join(" and ")
            )));
        }
        crate::disk::check_run_file(&file.path, &file.name, file.size)
    }

    fn create_keyed_backend(
        &self,
        p: &KeyedBackendParameters,
    ) -> Result<KeyedBackendKind, StateError> {
        if p.max_parallelism > 1 << 16 {
            return Err(StateError::Config(format!(
                "the disk backend stores key groups in 16 bits, and max parallelism {} has more",
                p.max_parallelism
            )));
        }
        // Unique across processes and restarts (a restarted container may reuse the pid): run
        // names, and so checkpoints' references to runs, never stand for two stores' runs.
        if !self.cleaned.swap(true, Ordering::AcqRel) {
            let removed = crate::disk::remove_dead_stores(&self.dir);
            self.stats
                .dead_stores_removed
                .fetch_add(removed as u64, Ordering::Relaxed);
        }
        let n = STORES.fetch_add(1, Ordering::Relaxed);
        let nonce = {
            use std::hash::{BuildHasher, Hasher};
            let mut h = std::collections::hash_map::RandomState::new().build_hasher();
            h.write_u64(n);
            h.write_u128(
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_nanos()),
            );
            h.finish()
        };
        let name = format!(
            "{}-s{}-a{}-p{}-{n}-{nonce:016x}",
            p.operator_id,
            p.subtask_index,
            p.attempt,
            std::process::id()
        );
        let store = DiskKeyedStore::open(
            self.dir.join(&name),
            name,
            p.key_group_range,
            self.options.clone(),
            Arc::clone(&self.stats),
        )?;
        self.stats.stores.fetch_add(1, Ordering::Relaxed);
        Ok(KeyedBackendKind::Store(Box::new(store)))
    }
}

/// The names of the backends [`built_in`] knows.
pub const BUILT_IN_BACKENDS: [&str; 3] = ["heap", "disk", "memory-store"];

/// The built-in state backend called `name` (Flink's `state.backend.type`): `heap`, `disk`
/// (under [`default_disk_dir`]) or `memory-store`; anything else is a
/// [`StateError::Config`] naming it and the known ones.
pub fn built_in(name: &str) -> Result<std::sync::Arc<dyn StateBackend>, StateError> {
    match name {
        "heap" => Ok(std::sync::Arc::new(HeapStateBackend)),
        "disk" => Ok(std::sync::Arc::new(DiskStateBackend::new(
            default_disk_dir(),
        ))),
        "memory-store" => Ok(std::sync::Arc::new(MemoryStoreStateBackend)),
        _ => Err(StateError::Config(format!(
            "unknown state backend {name:?}; the built-in ones are {}",
            BUILT_IN_BACKENDS.join(", ")
        ))),
    }
}

/// The keyed-state backend of one keyed operator in one subtask, whichever its
/// [`StateBackend`] created.
pub enum KeyedBackend<K> {
    /// The heap backend.
    Heap(HeapKeyedStateBackend<K>),
    /// A store of bytes.
    Store(StoreKeyedStateBackend<K>),
}

impl<K> fmt::Debug for KeyedBackend<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KeyedBackend::Heap(b) => b.fmt(f),
            KeyedBackend::Store(b) => b.fmt(f),
        }
    }
}

impl<K: StateKey> KeyedBackend<K> {
    /// The backend `backend` creates for `parameters`, set up with their compression and
    /// incremental mode (a store backend takes full snapshots).
    pub fn create(
        backend: &dyn StateBackend,
        parameters: &KeyedBackendParameters,
    ) -> Result<Self, StateError> {
        let (max_p, range) = (parameters.max_parallelism, parameters.key_group_range);
        Ok(match backend.create_keyed_backend(parameters)? {
            KeyedBackendKind::Heap => {
                let mut heap = HeapKeyedStateBackend::new(max_p, range)
                    .with_compression(parameters.compression);
                if let Some(max_chain) = parameters.incremental {
                    heap = heap.with_incremental(max_chain);
                }
                KeyedBackend::Heap(heap)
            }
            // In incremental mode a store with native snapshots checkpoints its own files.
            KeyedBackendKind::Store(store) => KeyedBackend::Store(
                StoreKeyedStateBackend::new(store, max_p, range)
                    .with_compression(parameters.compression)
                    .with_native_snapshots(parameters.incremental.is_some()),
            ),
        })
    }

    /// One value state, found once for a run of accesses (a batch of records). On the heap,
    /// each access then skips finding the state's typed table; a store backend is called per
    /// access as through [`KeyedStateBackend`].
    ///
    /// # Panics
    /// If `state` was not made by this backend for values of type `V`.
    #[inline]
    pub fn value_access<V: StateValue>(&mut self, state: ValueState<V>) -> ValueAccess<'_, K, V> {
        ValueAccess(match self {
            KeyedBackend::Heap(b) => Access::Heap(b.value_access(state)),
            KeyedBackend::Store(b) => Access::Store(b, state),
        })
    }

    /// A heap backend for the key groups `range` of `max_parallelism`.
    pub fn heap(max_parallelism: u32, range: KeyGroupRange) -> Self {
        KeyedBackend::Heap(HeapKeyedStateBackend::new(max_parallelism, range))
    }

    /// This backend, with `clock` as the processing time of TTL's full-snapshot cleanup.
    pub fn with_clock(self, clock: TtlClock) -> Self {
        match self {
            KeyedBackend::Heap(b) => KeyedBackend::Heap(b.with_clock(clock)),
            KeyedBackend::Store(b) => KeyedBackend::Store(b.with_clock(clock)),
        }
    }

    /// Number of entries over all registered states and key groups (a store's are counted by
    /// scanning it).
    pub fn num_entries(&mut self) -> Result<usize, StateError> {
        match self {
            KeyedBackend::Heap(b) => Ok(b.num_entries()),
            KeyedBackend::Store(b) => b.num_entries(),
        }
    }

    /// Names of the registered states, by id.
    pub fn state_names(&self) -> Vec<&str> {
        match self {
            KeyedBackend::Heap(b) => b.state_names(),
            KeyedBackend::Store(b) => b.state_names(),
        }
    }
}

/// One value state of a [`KeyedBackend`], from [`KeyedBackend::value_access`].
pub struct ValueAccess<'a, K, V>(Access<'a, K, V>);

enum Access<'a, K, V> {
    Heap(HeapValueAccess<'a, K, V>),
    Store(&'a mut StoreKeyedStateBackend<K>, ValueState<V>),
}

impl<K: StateKey, V: StateValue> ValueAccess<'_, K, V> {
    /// As [`KeyedStateBackend::value_mut_or_insert`].
    #[inline]
    pub fn value_mut_or_insert(
        &mut self,
        key: &K,
        key_group: KeyGroup,
        init: impl FnOnce() -> V,
    ) -> &mut V {
        match &mut self.0 {
            Access::Heap(a) => a.value_mut_or_insert(key, key_group, init),
            Access::Store(b, state) => b.value_mut_or_insert(*state, key, key_group, init),
        }
    }

    /// As [`KeyedStateBackend::update`].
    #[inline]
    pub fn update(&mut self, key: &K, key_group: KeyGroup, value: V) {
        match &mut self.0 {
            Access::Heap(a) => a.update(key, key_group, value),
            Access::Store(b, state) => b.update(*state, key, key_group, value),
        }
    }
}

/// Forwards a call to whichever backend this is.
macro_rules! each {
    ($self:ident, $b:ident => $call:expr) => {
        match $self {
            KeyedBackend::Heap($b) => $call,
            KeyedBackend::Store($b) => $call,
        }
    };
}

impl<K: StateKey> KeyedStateBackend<K> for KeyedBackend<K> {
    fn key_group_range(&self) -> KeyGroupRange {
        each!(self, b => b.key_group_range())
    }

    fn max_parallelism(&self) -> u32 {
        each!(self, b => b.max_parallelism())
    }

    fn register_state<V: StateValue>(
        &mut self,
        name: &str,
        kind: StateKind,
        options: StateOptions<V>,
    ) -> Result<ValueState<V>, StateError> {
        each!(self, b => b.register_state(name, kind, options))
    }

    fn cleanup_expired<V: StateValue>(&mut self, state: ValueState<V>, budget: usize, now_ms: i64) {
        each!(self, b => b.cleanup_expired(state, budget, now_ms))
    }

    #[inline]
    fn value<V: StateValue>(
        &mut self,
        state: ValueState<V>,
        key: &K,
        key_group: KeyGroup,
    ) -> Option<&V> {
        each!(self, b => b.value(state, key, key_group))
    }

    #[inline]
    fn value_mut_or_insert<V: StateValue>(
        &mut self,
        state: ValueState<V>,
        key: &K,
        key_group: KeyGroup,
        init: impl FnOnce() -> V,
    ) -> &mut V {
        each!(self, b => b.value_mut_or_insert(state, key, key_group, init))
    }

    #[inline]
    fn update<V: StateValue>(
        &mut self,
        state: ValueState<V>,
        key: &K,
        key_group: KeyGroup,
        value: V,
    ) {
        each!(self, b => b.update(state, key, key_group, value))
    }

    #[inline]
    fn clear<V: StateValue>(&mut self, state: ValueState<V>, key: &K, key_group: KeyGroup) {
        each!(self, b => b.clear(state, key, key_group))
    }

    fn for_each_entry<V: StateValue>(&mut self, state: ValueState<V>, f: &mut dyn FnMut(&K, &V)) {
        each!(self, b => b.for_each_entry(state, f))
    }

    fn snapshot(&mut self) -> Result<Box<dyn KeyedSnapshot>, StateError> {
        each!(self, b => b.snapshot())
    }

    fn restore(&mut self, parts: &[RestorePart<'_>]) -> Result<(), StateError> {
        each!(self, b => b.restore(parts))
    }

    fn restore_native(&mut self, parts: &[NativeRestorePart<'_>]) -> Result<(), StateError> {
        each!(self, b => b.restore_native(parts))
    }

    fn restore_file_parts(&mut self, parts: &[RestoreFilePart<'_>]) -> Result<(), StateError> {
        each!(self, b => b.restore_file_parts(parts))
    }

    fn snapshot_incremental(
        &mut self,
        checkpoint_id: u64,
    ) -> Result<Box<dyn KeyedSnapshot>, StateError> {
        each!(self, b => b.snapshot_incremental(checkpoint_id))
    }

    fn notify_checkpoint_complete(&mut self, checkpoint_id: u64) {
        each!(self, b => b.notify_checkpoint_complete(checkpoint_id))
    }

    fn notify_checkpoint_aborted(&mut self, checkpoint_id: u64) {
        each!(self, b => b.notify_checkpoint_aborted(checkpoint_id))
    }

    fn start_new_chain(&mut self) {
        each!(self, b => b.start_new_chain())
    }
}
