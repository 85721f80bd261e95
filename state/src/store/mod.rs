//! Keyed state over a store of bytes: the [`KeyedStore`] seam a custom keyed backend implements
//! (Flink's RocksDB shape), and [`StoreKeyedStateBackend`], which gives any store the whole
//! typed [`KeyedStateBackend`] contract.
//!
//! A store keeps, per state and key group, serialized keys mapped to serialized values, and
//! freezes a view of them for a snapshot. Everything else is done here, once:
//! - keys and values are postcard-encoded exactly as the [`crate::format`] writes them, so a
//!   store's snapshot is byte for byte the heap backend's for the same state (canonical
//!   savepoints restore into either backend);
//! - registration, type checks, defaults, TTL (its expiry on read, incremental cleanup and
//!   full-snapshot cleanup), and states restored but not registered yet;
//! - the snapshot format and restore by key group.
//!
//! Each state keeps one decoded entry, the one last accessed, so that
//! [`KeyedStateBackend::value_mut_or_insert`] can lend a `&mut V`: a change is written back to
//! the store when another key of the state is accessed, and before every snapshot, scan and
//! cleanup. A store's failure inside an access that cannot return an error (a read or write of
//! a record's state) panics with the store's error, which fails the task; the job then restarts
//! from its latest checkpoint, as a RocksDB exception fails a Flink task. So does a key or value
//! type that does not round-trip through the codec (postcard: for example a value whose
//! `Serialize` skips fields): the panic names the type. The heap meets such a type only in its
//! snapshots.
//!
//! A restored state is handed to the store when it is registered, decoded in windows of key
//! groups (each window's key groups in parallel): a registration holds one window's decoded
//! entries in memory at a time, besides the restored bytes. A store with a
//! [`KeyedStore::bulk_load`] (the disk store) takes them in key order and writes them as one
//! sorted file; another gets one `put` per entry.

use crate::StateError;
use crate::format::{
    Compression, MAX_STATES, SERIALIZER_VERSION, SnapshotHeader, StateKind, StateMeta,
};
use crate::keyed::{
    Expiry, ExpiryFn, KeyedSnapshot, KeyedStateBackend, NativeFiles, NativeRestorePart,
    RestoreFilePart, RestorePart, StateKey, StateOptions, StateValue, TtlClock, ValueState,
    wall_clock_ms,
};
use crate::restored::{self, PendingState, Restored, incompatible};
use rustc_hash::FxHashMap;
use std::any::{Any, type_name};
use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;
use weir_core::CoreError;
use weir_core::codec;
use weir_core::keygroup::{KeyGroup, KeyGroupRange};

mod memory;
mod native;
mod snapshot;
pub use memory::MemoryKeyedStore;
pub use native::NATIVE_MANIFEST_MAGIC;
use snapshot::{Part, StoreSnapshot};

/// A state's number in a store: the order of its registration in the backend, from 0.
pub type StoreStateId = u16;

/// Visits entries: a serialized key and its serialized value.
pub type EntryVisitor<'a> = dyn FnMut(&[u8], &[u8]) -> Result<(), StateError> + 'a;

/// The storage of one keyed operator's state in one subtask, as bytes: for each state and key
/// group, a sorted map from a serialized key to its serialized value.
///
/// Contract (checked by [`crate::conformance`] through [`StoreKeyedStateBackend`]):
/// - [`put`](Self::put) replaces, [`delete`](Self::delete) removes (a missing key is not an
///   error), and [`get`](Self::get) reads what the latest of them left;
/// - [`scan`](Self::scan) visits one state's entries in one key group in ascending order of
///   the key bytes, each once;
/// - [`freeze`](Self::freeze) is a snapshot's synchronous part: the view it returns keeps the
///   content of that moment, whatever is written after. Its cost should not grow with the
///   amount of state (freeze a memtable, clone shared pointers);
/// - errors are returned, never panicked: the backend turns them into a task failure.
pub trait KeyedStore: Send + 'static {
    /// Reads the value of `key` into `value` (cleared first); false when there is none.
    fn get(
        &mut self,
        state: StoreStateId,
        key_group: KeyGroup,
        key: &[u8],
        value: &mut Vec<u8>,
    ) -> Result<bool, StateError>;

    /// Sets the value of `key`.
    fn put(
        &mut self,
        state: StoreStateId,
        key_group: KeyGroup,
        key: &[u8],
        value: &[u8],
    ) -> Result<(), StateError>;

    /// Removes `key`.
    fn delete(
        &mut self,
        state: StoreStateId,
        key_group: KeyGroup,
        key: &[u8],
    ) -> Result<(), StateError>;

    /// Visits every entry of `state` in `key_group`, in ascending order of the key bytes.
    fn scan(
        &mut self,
        state: StoreStateId,
        key_group: KeyGroup,
        visit: &mut EntryVisitor<'_>,
    ) -> Result<(), StateError>;

    /// The synchronous part of a snapshot: a view of the content now.
    fn freeze(&mut self) -> Result<Box<dyn FrozenStore>, StateError>;

    /// The synchronous part of a native snapshot (optional): the content now, as the store's own
    /// immutable files once [`FrozenFiles::files`] returns. `None` (the default): the store has
    /// no native snapshots, and its backend writes the canonical format.
    fn freeze_files(&mut self) -> Result<Option<Box<dyn FrozenFiles>>, StateError> {
        Ok(None)
    }

    /// Loads the files of native snapshots, before anything is written, answering only for the
    /// key groups of `range` (the files may hold others after a rescale). The files are in
    /// each snapshot's order; snapshots of different subtasks hold different key groups. The
    /// store takes its own copy or link: the paths may go away after the call. A store without
    /// native snapshots (the default) refuses.
    fn restore_files(
        &mut self,
        snapshots: &[&NativeFiles],
        range: KeyGroupRange,
    ) -> Result<(), StateError> {
        let _ = range;
        Err(StateError::Restore(format!(
            "this store has no native snapshots, and is handed {} of them",
            snapshots.len()
        )))
    }

    /// Bulk load (optional; Flink's RocksDB ingests a canonical savepoint's entries the same
    /// way): a writer for the `entries` restored entries of `state`, handed over in order, at
    /// the state's registration, before anything else is written to it (`entries` is an upper
    /// bound: a restored chain's later blocks may replace or remove entries). A store writes
    /// them as one immutable sorted file instead of through its write path. `None` (the default): the
    /// backend puts each entry.
    fn bulk_load(
        &mut self,
        state: StoreStateId,
        entries: u64,
    ) -> Result<Option<Box<dyn BulkLoad + '_>>, StateError> {
        let _ = (state, entries);
        Ok(None)
    }
}

/// A bulk load into a store (see [`KeyedStore::bulk_load`]): entries of one state in ascending
/// order of key group, then key bytes, visible once [`finish`](Self::finish) returns.
pub trait BulkLoad {
    /// Adds an entry after every entry added so far (a key out of order is an error).
    fn add(&mut self, key_group: KeyGroup, key: &[u8], value: &[u8]) -> Result<(), StateError>;

    /// Makes the entries visible at once. Dropped before this, the load leaves nothing behind.
    fn finish(self: Box<Self>) -> Result<(), StateError>;
}

/// A store's native snapshot after its synchronous part.
pub trait FrozenFiles: Send + 'static {
    /// Waits until every file of the snapshot is written, and lists them; they stay on disk
    /// until this is dropped.
    fn files(&mut self) -> Result<NativeFiles, StateError>;
}

/// A store's content at the moment of a snapshot, written out later on another thread.
pub trait FrozenStore: Send + 'static {
    /// Visits every entry of `state` in `key_group`, in ascending order of the key bytes.
    fn scan(
        &self,
        state: StoreStateId,
        key_group: KeyGroup,
        visit: &mut EntryVisitor<'_>,
    ) -> Result<(), StateError>;
}

/// What a full snapshot does with a stored value: keep its bytes, leave it out, or write these
/// instead (TTL's full-snapshot cleanup).
type SnapshotFilter = Arc<dyn Fn(&[u8]) -> Result<Expiry<Vec<u8>>, StateError> + Send + Sync>;

/// One state's decoded entry, the one last accessed.
struct Cell<V> {
    default: Option<V>,
    expiry: Option<ExpiryFn<V>>,
    cleanup_full_snapshot: bool,
    /// TTL's incremental cleanup: the next key group (by index), the entries owed, and each
    /// key group's number of entries at its last check.
    cleanup_cursor: usize,
    cleanup_budget: usize,
    group_sizes: Vec<Option<usize>>,
    /// Whether `key`, `key_group` and `value` hold an entry.
    cached: bool,
    key: Vec<u8>,
    key_group: KeyGroup,
    value: Option<V>,
    /// Whether `value` differs from the store's.
    dirty: bool,
}

impl<V: StateValue> Cell<V> {
    /// The empty cell of a state registered with `options`.
    fn new(options: StateOptions<V>) -> Cell<V> {
        Cell {
            default: options.default,
            expiry: options.expiry,
            cleanup_full_snapshot: options.cleanup_full_snapshot,
            cleanup_cursor: 0,
            cleanup_budget: 0,
            group_sizes: Vec::new(),
            cached: false,
            key: Vec::new(),
            key_group: 0,
            value: None,
            dirty: false,
        }
    }
}

/// A [`Cell`] with its value type erased.
trait ErasedCell: Send {
    fn as_any_mut(&mut self) -> &mut dyn Any;
    /// Writes a changed entry back to the store.
    fn flush(&mut self, store: &mut dyn KeyedStore, id: StoreStateId) -> Result<(), StateError>;
    /// Forgets the entry (after the store was changed under it); flush first.
    fn forget(&mut self);
    /// The full-snapshot cleanup of a TTL state, as of `now_ms`.
    fn snapshot_filter(&self, now_ms: i64) -> Option<SnapshotFilter>;
}

impl<V: StateValue> ErasedCell for Cell<V> {
    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }

    fn flush(&mut self, store: &mut dyn KeyedStore, id: StoreStateId) -> Result<(), StateError> {
        if !self.dirty {
            return Ok(());
        }
        match &self.value {
            Some(v) => {
                let mut bytes = Vec::new();
                codec::encode_into(
                    &format!("state value of type `{}`", type_name::<V>()),
                    v,
                    &mut bytes,
                )?;
                store.put(id, self.key_group, &self.key, &bytes)?;
            }
            None => store.delete(id, self.key_group, &self.key)?,
        }
        self.dirty = false;
        Ok(())
    }

    fn forget(&mut self) {
        self.cached = false;
        self.value = None;
    }

    fn snapshot_filter(&self, now_ms: i64) -> Option<SnapshotFilter> {
        if !self.cleanup_full_snapshot {
            return None;
        }
        let expiry = self.expiry.clone()?;
        Some(Arc::new(move |bytes| {
            let value: V = codec::decode("state value", bytes)?;
            Ok(match expiry(&value, now_ms) {
                Expiry::Keep => Expiry::Keep,
                Expiry::Drop => Expiry::Drop,
                Expiry::Replace(new) => {
                    let mut out = Vec::new();
                    codec::encode_into("state value", &new, &mut out)?;
                    Expiry::Replace(out)
                }
            })
        }))
    }
}

/// A registered state, or one restored from a native snapshot and not registered yet (its
/// cell a [`native::Reserved`]).
struct Registered {
    name: String,
    kind: StateKind,
    value_type: std::borrow::Cow<'static, str>,
    cell: Box<dyn ErasedCell>,
}

/// The typed keyed-state backend over a [`KeyedStore`]. See the [module docs](self).
pub struct StoreKeyedStateBackend<K> {
    store: Box<dyn KeyedStore>,
    max_parallelism: u32,
    range: KeyGroupRange,
    states: Vec<Registered>,
    by_name: FxHashMap<String, StoreStateId>,
    restored: Restored,
    compression: Compression,
    clock: TtlClock,
    /// Whether checkpoints are native snapshots of the store's files (when it has them).
    native: bool,
    /// How many restored bytes of a state a registration decodes at once.
    load_window: usize,
    /// The encoded key of the latest access, and a buffer for values read.
    key_buf: Vec<u8>,
    value_buf: Vec<u8>,
    _key: PhantomData<fn() -> K>,
}

impl<K> fmt::Debug for StoreKeyedStateBackend<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StoreKeyedStateBackend")
            .field("max_parallelism", &self.max_parallelism)
            .field("key_group_range", &self.range)
            .field(
                "states",
                &self.states.iter().map(|s| &s.name).collect::<Vec<_>>(),
            )
            .field("pending", &self.restored.pending.keys().collect::<Vec<_>>())
            .finish()
    }
}

#[cold]
#[inline(never)]
#[track_caller]
fn misuse(what: String) -> ! {
    panic!("{what}")
}

#[cold]
#[inline(never)]
#[track_caller]
fn store_failed(e: StateError) -> ! {
    panic!("keyed state in the store failed: {e}")
}

/// A key or value whose type does not go through the state codec (postcard) both ways. The heap
/// keeps values as they are and encodes them only in snapshots; a store encodes them on every
/// access, so such a type fails here first.
#[cold]
#[inline(never)]
#[track_caller]
fn codec_failed<T>(what: &str, e: CoreError) -> ! {
    panic!(
        "a state {what} of type `{}` does not round-trip through the state codec (postcard): {e}",
        type_name::<T>()
    )
}

/// Decodes a stored value, naming its type on failure.
fn decode_value<V: StateValue>(bytes: &[u8]) -> Result<V, StateError> {
    codec::decode(
        &format!("state value of type `{}`", type_name::<V>()),
        bytes,
    )
    .map_err(StateError::from)
}

impl<K: StateKey> StoreKeyedStateBackend<K> {
    /// A backend over `store` (empty) for the key groups `key_group_range` of
    /// `max_parallelism`.
    pub fn new(
        store: Box<dyn KeyedStore>,
        max_parallelism: u32,
        key_group_range: KeyGroupRange,
    ) -> Self {
        StoreKeyedStateBackend {
            store,
            max_parallelism,
            range: key_group_range,
            states: Vec::new(),
            by_name: FxHashMap::default(),
            restored: Restored::new(),
            compression: Compression::None,
            clock: Arc::new(wall_clock_ms),
            native: false,
            load_window: LOAD_WINDOW_BYTES,
            key_buf: Vec::new(),
            value_buf: Vec::new(),
            _key: PhantomData,
        }
    }

    /// This backend, writing its snapshots with `compression` (see
    /// [`HeapKeyedStateBackend::with_compression`](crate::HeapKeyedStateBackend::with_compression)).
    pub fn with_compression(mut self, compression: Compression) -> Self {
        self.compression = compression;
        self
    }

    /// This backend, decoding a restored state at its registration in windows of key groups of
    /// at most `bytes` restored bytes each (default 4 MiB; a key group larger than that is a
    /// window of its own): the memory a canonical restore's registration needs beyond the
    /// restored bytes.
    pub fn with_restore_window(mut self, bytes: usize) -> Self {
        self.load_window = bytes.max(1);
        self
    }

    /// This backend, with `clock` as the processing time of TTL's full-snapshot cleanup.
    pub fn with_clock(mut self, clock: TtlClock) -> Self {
        self.clock = clock;
        self
    }

    /// A restore comes before any state is registered.
    fn check_nothing_registered(&self) -> Result<(), StateError> {
        if self.states.is_empty() {
            return Ok(());
        }
        Err(StateError::Restore(format!(
            "restore must come before any state is registered, and {:?} already are",
            self.state_names()
        )))
    }

    /// Names of the registered states, by id.
    pub fn state_names(&self) -> Vec<&str> {
        self.states.iter().map(|s| s.name.as_str()).collect()
    }

    /// Names of the states restored from a snapshot and not registered yet.
    pub fn pending_state_names(&self) -> Vec<&str> {
        self.restored.pending.keys().map(String::as_str).collect()
    }

    fn check_key_group(&self, key_group: KeyGroup) {
        if !self.range.contains(key_group) {
            misuse(format!(
                "key group {key_group} is not in this backend's range {}",
                self.range
            ));
        }
    }

    /// Writes every changed entry back to the store.
    fn flush_all(&mut self) -> Result<(), StateError> {
        for (id, s) in (0..).zip(&mut self.states) {
            s.cell.flush(self.store.as_mut(), id)?;
        }
        Ok(())
    }

    /// The cell of `state`, holding the entry of `key` (read from the store if another entry
    /// was cached; `read` false when the caller overwrites it anyway).
    fn cell<V: StateValue>(
        &mut self,
        state: ValueState<V>,
        key: &K,
        key_group: KeyGroup,
        read: bool,
    ) -> &mut Cell<V> {
        self.check_key_group(key_group);
        self.key_buf.clear();
        if let Err(e) = codec::encode_into("state key", key, &mut self.key_buf) {
            codec_failed::<K>("key", e);
        }
        let id = state.id;
        let Some(registered) = self.states.get_mut(usize::from(id)) else {
            misuse(format!("state handle {id} was not made by this backend"));
        };
        let store = self.store.as_mut();
        let cell = match registered.cell.as_any_mut().downcast_mut::<Cell<V>>() {
            Some(cell) => cell,
            None => misuse(format!(
                "value state handle {id} of `{}` was not made by this backend",
                type_name::<V>()
            )),
        };
        if cell.cached && cell.key_group == key_group && cell.key == self.key_buf {
            return cell;
        }
        if let Err(e) = cell.flush(store, id) {
            store_failed(e);
        }
        cell.value = None;
        if read {
            match store.get(id, key_group, &self.key_buf, &mut self.value_buf) {
                Ok(true) => match codec::decode::<V>("state value", &self.value_buf) {
                    Ok(v) => cell.value = Some(v),
                    Err(e) => codec_failed::<V>("value", e),
                },
                Ok(false) => {}
                Err(e) => store_failed(e),
            }
        }
        cell.key.clear();
        cell.key.extend_from_slice(&self.key_buf);
        cell.key_group = key_group;
        cell.cached = true;
        cell.dirty = false;
        cell
    }

    /// Takes a restored state into the store as `V`, once its registration is checked: in
    /// windows of key groups of at most `load_window` restored bytes, each decoded,
    /// sorted and written before the next is decoded, so that a state larger than memory is
    /// never decoded whole. A failure in any window fails the registration, and a bulk load
    /// dropped unfinished leaves nothing behind.
    fn load_pending<V: StateValue>(
        &mut self,
        id: StoreStateId,
        name: &str,
        pending: &PendingState,
    ) -> Result<(), StateError> {
        let (range, max_parallelism) = (self.range, self.max_parallelism);
        let decode = |window: std::ops::Range<usize>| {
            let first = range.start + window.start as u32;
            restored::decode_pending_window::<K, V>(name, pending, range, max_parallelism, window)
                .map(|groups| (first, groups))
        };
        let windows = restored::pending_windows(pending, self.load_window);
        let most = pending.entries_at_most();
        let mut entries: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
        if let Some(mut bulk) = self.store.bulk_load(id, most)? {
            for window in windows {
                let (first, groups) = decode(window)?;
                for (kg, group) in (first..).zip(&groups) {
                    encode_sorted(group, &mut entries)?;
                    for (key, value) in &entries {
                        bulk.add(kg, key, value)?;
                    }
                }
            }
            return bulk.finish();
        }
        for window in windows {
            let (first, groups) = decode(window)?;
            for (kg, group) in (first..).zip(&groups) {
                encode_sorted(group, &mut entries)?;
                for (key, value) in &entries {
                    self.store.put(id, kg, key, value)?;
                }
            }
        }
        Ok(())
    }

    /// Number of entries over all registered states and key groups.
    pub fn num_entries(&mut self) -> Result<usize, StateError> {
        self.flush_all()?;
        let mut count = 0;
        for id in 0..self.states.len() {
            let id = StoreStateId::try_from(id).unwrap_or(StoreStateId::MAX);
            for kg in self.range.iter() {
                self.store.scan(id, kg, &mut |_, _| {
                    count += 1;
                    Ok(())
                })?;
            }
        }
        Ok(count)
    }

    /// Every entry of a value state, decoded, key group by key group.
    pub fn for_each<V: StateValue>(
        &mut self,
        state: ValueState<V>,
        f: &mut dyn FnMut(&K, &V),
    ) -> Result<(), StateError> {
        self.flush_all()?;
        for kg in self.range.iter() {
            self.store.scan(state.id, kg, &mut |k, v| {
                let key: K =
                    codec::decode(&format!("state key of type `{}`", type_name::<K>()), k)?;
                let value: V = decode_value(v)?;
                f(&key, &value);
                Ok(())
            })?;
        }
        Ok(())
    }
}

impl<K: StateKey> KeyedStateBackend<K> for StoreKeyedStateBackend<K> {
    fn key_group_range(&self) -> KeyGroupRange {
        self.range
    }

    fn max_parallelism(&self) -> u32 {
        self.max_parallelism
    }

    fn register_state<V: StateValue>(
        &mut self,
        name: &str,
        kind: StateKind,
        options: StateOptions<V>,
    ) -> Result<ValueState<V>, StateError> {
        let value_type = type_name::<V>();
        if let Some(&id) = self.by_name.get(name) {
            let Some(registered) = self.states.get_mut(usize::from(id)) else {
                return Err(StateError::Restore(format!(
                    "state '{name}' has a lost id {id}"
                )));
            };
            if registered.cell.as_any_mut().is::<native::Reserved>() {
                // Restored from a native snapshot: its entries are in the store already.
                native::check_reserved(name, registered, kind, value_type)?;
                registered.cell = Box::new(Cell::new(options));
                registered.value_type = value_type.into();
                return Ok(ValueState::from_id(id));
            }
            if registered.kind != kind || !registered.cell.as_any_mut().is::<Cell<V>>() {
                return Err(incompatible(
                    name,
                    format!(
                        "it is registered as a {} state of `{}`, and is now asked for as a {kind} \
                         state of `{value_type}`",
                        registered.kind, registered.value_type
                    ),
                ));
            }
            return Ok(ValueState::from_id(id));
        }
        let pending = self.restored.pending.get(name).cloned();
        let count =
            self.states.len() + self.restored.pending.len() + usize::from(pending.is_none());
        let too_many = || StateError::TooManyStates {
            name: name.to_string(),
            count,
            max: MAX_STATES,
        };
        if count > MAX_STATES {
            return Err(too_many());
        }
        let id = StoreStateId::try_from(self.states.len()).map_err(|_| too_many())?;
        if let Some(p) = &pending {
            restored::check_registration(name, p, kind, value_type)?;
            self.load_pending::<V>(id, name, p)?;
        }
        self.restored.pending.remove(name);
        self.states.push(Registered {
            name: name.to_string(),
            kind,
            value_type: value_type.into(),
            cell: Box::new(Cell::new(options)),
        });
        self.by_name.insert(name.to_string(), id);
        Ok(ValueState::from_id(id))
    }

    fn cleanup_expired<V: StateValue>(&mut self, state: ValueState<V>, budget: usize, now_ms: i64) {
        if let Err(e) = self.cleanup(state, budget, now_ms) {
            store_failed(e);
        }
    }

    fn value<V: StateValue>(
        &mut self,
        state: ValueState<V>,
        key: &K,
        key_group: KeyGroup,
    ) -> Option<&V> {
        let cell = self.cell(state, key, key_group, true);
        cell.value.as_ref().or(cell.default.as_ref())
    }

    fn value_mut_or_insert<V: StateValue>(
        &mut self,
        state: ValueState<V>,
        key: &K,
        key_group: KeyGroup,
        init: impl FnOnce() -> V,
    ) -> &mut V {
        let cell = self.cell(state, key, key_group, true);
        cell.dirty = true;
        cell.value.get_or_insert_with(init)
    }

    fn update<V: StateValue>(
        &mut self,
        state: ValueState<V>,
        key: &K,
        key_group: KeyGroup,
        value: V,
    ) {
        let cell = self.cell(state, key, key_group, false);
        cell.value = Some(value);
        cell.dirty = true;
    }

    fn clear<V: StateValue>(&mut self, state: ValueState<V>, key: &K, key_group: KeyGroup) {
        // By id, whatever the stored value type: a TTL state's handle names the user's type.
        self.check_key_group(key_group);
        let id = state.id;
        let Some(registered) = self.states.get_mut(usize::from(id)) else {
            misuse(format!("state handle {id} was not made by this backend"));
        };
        let result = registered
            .cell
            .flush(self.store.as_mut(), id)
            .and_then(|()| {
                registered.cell.forget();
                self.key_buf.clear();
                codec::encode_into("state key", key, &mut self.key_buf)?;
                self.store.delete(id, key_group, &self.key_buf)
            });
        if let Err(e) = result {
            store_failed(e);
        }
    }

    fn for_each_entry<V: StateValue>(&mut self, state: ValueState<V>, f: &mut dyn FnMut(&K, &V)) {
        if let Err(e) = self.for_each(state, f) {
            store_failed(e);
        }
    }

    fn snapshot(&mut self) -> Result<Box<dyn KeyedSnapshot>, StateError> {
        self.flush_all()?;
        self.restored.own_pending_bytes();
        let now_ms = (self.clock)();
        let total = self.states.len() + self.restored.pending.len();
        if total > MAX_STATES {
            return Err(StateError::TooManyStates {
                name: self
                    .restored
                    .pending
                    .keys()
                    .next_back()
                    .cloned()
                    .unwrap_or_default(),
                count: total,
                max: MAX_STATES,
            });
        }
        let key_type = type_name::<K>();
        let mut states = Vec::with_capacity(total);
        let mut parts = Vec::with_capacity(total);
        // `total <= MAX_STATES == i16::MAX`, so every index fits an i16.
        let mut ids = 0..i16::MAX;
        for (registered, id) in self.states.iter().zip(&mut ids) {
            states.push(StateMeta {
                id,
                name: registered.name.clone(),
                kind: registered.kind,
                key_type: key_type.to_string(),
                value_type: registered.value_type.to_string(),
                serializer_version: SERIALIZER_VERSION,
            });
            parts.push(Part::Stored(registered.cell.snapshot_filter(now_ms)));
        }
        let mut overlays = false;
        for ((name, pending), id) in self.restored.pending.iter().zip(&mut ids) {
            states.push(pending.meta(id, name));
            overlays |= pending.has_overlays();
            parts.push(Part::Pending(Arc::clone(pending)));
        }
        let header = SnapshotHeader {
            flags: 0,
            compression: self.compression,
            overlays,
            delta: false,
            key_group_range: self.range,
            max_parallelism: self.max_parallelism,
            states,
        };
        Ok(Box::new(StoreSnapshot {
            header: SnapshotHeader {
                flags: header.expected_flags(),
                ..header
            },
            frozen: self.store.freeze()?,
            parts,
        }))
    }

    fn snapshot_incremental(
        &mut self,
        checkpoint_id: u64,
    ) -> Result<Box<dyn KeyedSnapshot>, StateError> {
        let _ = checkpoint_id;
        match self.snapshot_native()? {
            Some(snapshot) => Ok(snapshot),
            None => self.snapshot(),
        }
    }

    fn restore_native(&mut self, parts: &[NativeRestorePart<'_>]) -> Result<(), StateError> {
        self.restore_from_files(parts)
    }

    fn restore(&mut self, parts: &[RestorePart<'_>]) -> Result<(), StateError> {
        self.check_nothing_registered()?;
        self.restored
            .restore(parts, self.range, self.max_parallelism, type_name::<K>())
    }

    /// Keeps the restored blocks in the files, read back a window of key groups at a time at
    /// their states' registration: a canonical restore larger than memory.
    fn restore_file_parts(&mut self, parts: &[RestoreFilePart<'_>]) -> Result<(), StateError> {
        self.check_nothing_registered()?;
        self.restored
            .restore_files(parts, self.range, self.max_parallelism, type_name::<K>())
    }
}

/// How many restored bytes of a state a registration decodes at once by default (a window of
/// key groups; decoded, they take several times this). Restoring a 129 MB savepoint of 14M keys
/// into the disk backend (`word_count`, p=2, 2026-12-05) peaked at 162 MB RSS with 16 MiB
/// windows and at 68 MB with 4 MiB, in the same time (6.2 and 5.8–6.1 s).
const LOAD_WINDOW_BYTES: usize = 4 << 20;

/// Encodes one key group's restored entries into `entries`, sorted by key: the order a bulk
/// load takes, and an ordered run for a store that appends (an LSM's memtable).
fn encode_sorted<K: StateKey, V: StateValue>(
    group: &restored::Group<K, V>,
    entries: &mut Vec<(Vec<u8>, Vec<u8>)>,
) -> Result<(), StateError> {
    entries.clear();
    for (k, v) in group.iter() {
        let (mut key, mut value) = (Vec::new(), Vec::new());
        codec::encode_into("state key", k, &mut key)?;
        codec::encode_into("state value", v, &mut value)?;
        entries.push((key, value));
    }
    entries.sort_unstable_by(|a, b| a.0.cmp(&b.0));
    Ok(())
}

impl<K: StateKey> StoreKeyedStateBackend<K> {
    /// TTL's incremental cleanup: `budget` more entries are owed; whole key groups are checked
    /// in turn while the owed entries cover them.
    fn cleanup<V: StateValue>(
        &mut self,
        state: ValueState<V>,
        budget: usize,
        now_ms: i64,
    ) -> Result<(), StateError> {
        let id = state.id;
        let groups = self.range.len() as usize;
        let Some(cell) = self
            .states
            .get_mut(usize::from(id))
            .and_then(|r| r.cell.as_any_mut().downcast_mut::<Cell<V>>())
        else {
            return Ok(());
        };
        let Some(expiry) = cell.expiry.clone() else {
            return Ok(());
        };
        if groups == 0 {
            return Ok(());
        }
        if cell.group_sizes.len() != groups {
            cell.group_sizes = vec![None; groups];
        }
        cell.cleanup_budget = cell.cleanup_budget.saturating_add(budget);
        for _ in 0..groups {
            let index = cell.cleanup_cursor % groups;
            // As the heap does: a key group is checked once the owed entries cover it. Its size
            // is known from its last check, so the store is not scanned to find it out.
            if cell.group_sizes[index].is_some_and(|n| cell.cleanup_budget < n.max(1)) {
                return Ok(());
            }
            let kg = self.range.start + index as u32;
            // The scan must see the latest value of the entry the cell holds.
            ErasedCell::flush(cell, self.store.as_mut(), id)?;
            let mut count = 0usize;
            let mut changes: Vec<(Vec<u8>, Option<Vec<u8>>)> = Vec::new();
            self.store.scan(id, kg, &mut |k, v| {
                count += 1;
                let value: V = decode_value(v)?;
                match expiry(&value, now_ms) {
                    Expiry::Keep => {}
                    Expiry::Drop => changes.push((k.to_vec(), None)),
                    Expiry::Replace(new) => {
                        let mut bytes = Vec::new();
                        codec::encode_into("state value", &new, &mut bytes)?;
                        changes.push((k.to_vec(), Some(bytes)));
                    }
                }
                Ok(())
            })?;
            let cost = count.max(1);
            if cell.cleanup_budget < cost {
                cell.group_sizes[index] = Some(count);
                return Ok(());
            }
            cell.cleanup_budget -= cost;
            cell.cleanup_cursor = (index + 1) % groups;
            let dropped = changes.iter().filter(|(_, v)| v.is_none()).count();
            cell.group_sizes[index] = Some(count - dropped);
            if !changes.is_empty() {
                // The store changes under the cell's entry.
                ErasedCell::forget(cell);
            }
            for (key, value) in changes {
                match value {
                    Some(v) => self.store.put(id, kg, &key, &v)?,
                    None => self.store.delete(id, kg, &key)?,
                }
            }
        }
        Ok(())
    }
}
