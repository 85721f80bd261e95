//! The heap keyed-state backend: one hash table per state and key group behind an `Arc`,
//! copy-on-write snapshots, and restore by key group.
//!
//! Each registered state keeps, for every key group of the backend's range, a `HashMap<K, V>`
//! (hashbrown with the Fx hasher, the map inside `rustc_hash::FxHashMap`) in a `CowGroup`: owned
//! while no snapshot holds it, so a write costs no atomic operation, and behind an `Arc` from a
//! snapshot on, so a key group's table is copied only when it is written while a snapshot still
//! holds it. [`KeyedStateBackend::snapshot`] moves each table behind an `Arc` and clones it (cost
//! O(key groups × states), whatever the number of entries); the returned [`KeyedSnapshot`] owns
//! that frozen view and encodes it later, on another thread, in the [`crate::format`].
//!
//! [`KeyedStateBackend::restore`] keeps the raw bytes of each state in each key group until the
//! state is registered, then decodes them with the registered types after checking the type
//! names the snapshot recorded. Restored states that are never registered are carried, as bytes,
//! into later snapshots, so a state registered lazily is not lost by a checkpoint taken first.

use crate::StateError;
use crate::cow_group::CowGroup;
use crate::format::{
    Compression, EntryEncoder, MAX_STATES, SERIALIZER_VERSION, SectionWriter, SnapshotHeader,
    StateKind, StateMeta,
};
pub use crate::keyed::TtlClock;
use crate::keyed::{
    KeyedSnapshot, KeyedSnapshotLayout, KeyedStateBackend, RestorePart, SnapshotScope, StateKey,
    StateOptions, StateValue, ValueState, wall_clock_ms,
};
use crate::restored::{self, Restored, incompatible};
use rustc_hash::FxHashMap;
use std::any::{Any, type_name};
use std::fmt;
use std::sync::Arc;
use weir_core::keygroup::{KeyGroup, KeyGroupRange};

mod tables;
use tables::{ErasedTable, FrozenPending, FrozenTable, FrozenUnchanged, ValueTable};

/// A registered state.
struct Registered<K> {
    name: String,
    kind: StateKind,
    value_type: &'static str,
    table: Box<dyn ErasedTable<K>>,
}

/// One value state's table of a [`HeapKeyedStateBackend`], from
/// [`value_access`](HeapKeyedStateBackend::value_access).
pub struct HeapValueAccess<'a, K, V> {
    table: &'a mut ValueTable<K, V>,
    range: KeyGroupRange,
}

impl<K: StateKey, V: StateValue> HeapValueAccess<'_, K, V> {
    /// The index of `key_group`'s table.
    #[inline]
    fn index(&self, key_group: KeyGroup) -> usize {
        let index = key_group.wrapping_sub(self.range.start) as usize;
        if !self.range.contains(key_group) || index >= self.table.groups.len() {
            misuse(format!(
                "key group {key_group} is not in this backend's range {}",
                self.range
            ));
        }
        index
    }

    /// As [`KeyedStateBackend::value_mut_or_insert`].
    #[inline]
    pub fn value_mut_or_insert(
        &mut self,
        key: &K,
        key_group: KeyGroup,
        init: impl FnOnce() -> V,
    ) -> &mut V {
        let index = self.index(key_group);
        self.table.value_mut_or_insert(index, key, init)
    }

    /// As [`KeyedStateBackend::update`].
    #[inline]
    pub fn update(&mut self, key: &K, key_group: KeyGroup, value: V) {
        let index = self.index(key_group);
        self.table.update(index, key, value)
    }
}

/// The heap keyed-state backend. See the [module docs](self).
pub struct HeapKeyedStateBackend<K> {
    max_parallelism: u32,
    range: KeyGroupRange,
    /// Registered states; a handle's id is the index.
    states: Vec<Registered<K>>,
    by_name: FxHashMap<String, u16>,
    /// Restored states not registered yet, and the key groups restored.
    restored: Restored,
    /// How snapshots compress their key-group sections.
    compression: Compression,
    /// Processing time (ms since the Unix epoch), for TTL's full-snapshot cleanup.
    clock: TtlClock,
    /// Incremental checkpoints, when enabled.
    incremental: Option<Incremental>,
}

/// The bookkeeping of incremental checkpoints.
#[derive(Clone, Debug)]
struct Incremental {
    /// The most snapshots in a chain: a full one and its deltas.
    max_chain: u32,
    /// The latest confirmed checkpoint, the base of the next delta, and its chain's length.
    confirmed: Option<(u64, u32)>,
    /// Incremental snapshots taken and not confirmed yet, with the length their chain has.
    taken: Vec<(u64, u32)>,
    /// Whether changes are tracked: from the first incremental snapshot on, so that a backend
    /// that never takes one (checkpointing off, savepoints only) keeps no change sets.
    tracking: bool,
}

impl<K> fmt::Debug for HeapKeyedStateBackend<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HeapKeyedStateBackend")
            .field("max_parallelism", &self.max_parallelism)
            .field("key_group_range", &self.range)
            .field(
                "states",
                &self.states.iter().map(|s| &s.name).collect::<Vec<_>>(),
            )
            .field("pending", &self.restored.pending.keys().collect::<Vec<_>>())
            .field("compression", &self.compression)
            .finish()
    }
}

#[cold]
#[inline(never)]
#[track_caller]
fn misuse(what: String) -> ! {
    panic!("{what}")
}

impl<K: StateKey> HeapKeyedStateBackend<K> {
    /// An empty backend for the key groups `key_group_range` of `max_parallelism`.
    pub fn new(max_parallelism: u32, key_group_range: KeyGroupRange) -> Self {
        HeapKeyedStateBackend {
            max_parallelism,
            range: key_group_range,
            states: Vec::new(),
            by_name: FxHashMap::default(),
            restored: Restored::new(),
            compression: Compression::None,
            clock: Arc::new(wall_clock_ms),
            incremental: None,
        }
    }

    /// This backend, with incremental checkpoints: from the first
    /// [`KeyedStateBackend::snapshot_incremental`] (a full snapshot) on, it tracks the keys each
    /// write or removal changes, and each later one writes a delta of those since the latest
    /// confirmed checkpoint, or a full snapshot when there is none or its chain already holds
    /// `max_chain` snapshots (a full one and its deltas; 1 makes every snapshot full).
    /// [`KeyedStateBackend::snapshot`] (savepoints) stays full and self-contained.
    pub fn with_incremental(mut self, max_chain: u32) -> Self {
        self.incremental = Some(Incremental {
            max_chain: max_chain.max(1),
            confirmed: None,
            taken: Vec::new(),
            tracking: false,
        });
        self
    }

    /// Whether incremental checkpoints are enabled.
    pub fn is_incremental(&self) -> bool {
        self.incremental.is_some()
    }

    /// This backend, with `clock` as the processing time of TTL's full-snapshot cleanup (tests
    /// use a controllable clock; the default is the wall clock).
    pub fn with_clock(mut self, clock: TtlClock) -> Self {
        self.clock = clock;
        self
    }

    /// This backend, writing its snapshots with `compression` (Flink's
    /// `execution.checkpointing.snapshot-compression`): each key group's section is compressed
    /// with the codec, and the snapshot is written in format version 2. With
    /// [`Compression::None`], the default, snapshots are written uncompressed in version 1.
    /// Restore reads snapshots of any codec, whatever this setting.
    pub fn with_compression(mut self, compression: Compression) -> Self {
        self.compression = compression;
        self
    }

    /// Sets how later snapshots compress their sections (see
    /// [`with_compression`](Self::with_compression)); a snapshot already taken keeps its codec.
    pub fn set_compression(&mut self, compression: Compression) {
        self.compression = compression;
    }

    /// How snapshots compress their key-group sections.
    pub fn compression(&self) -> Compression {
        self.compression
    }

    /// Every entry of a value state, in no particular order.
    ///
    /// # Panics
    /// If `state` was not made by this backend for values of type `V`.
    pub fn entries<V: StateValue>(
        &self,
        state: ValueState<V>,
    ) -> impl Iterator<Item = (&K, &V)> + '_ {
        self.table(state).groups.iter().flat_map(|g| g.get().iter())
    }

    /// Number of entries over all registered states and key groups.
    pub fn num_entries(&self) -> usize {
        self.states.iter().map(|s| s.table.len()).sum()
    }

    /// Names of the registered states, by id.
    pub fn state_names(&self) -> Vec<&str> {
        self.states.iter().map(|s| s.name.as_str()).collect()
    }

    /// Names of the states restored from a snapshot and not registered yet.
    pub fn pending_state_names(&self) -> Vec<&str> {
        self.restored.pending.keys().map(String::as_str).collect()
    }

    fn table<V: StateValue>(&self, state: ValueState<V>) -> &ValueTable<K, V> {
        match self
            .states
            .get(usize::from(state.id))
            .and_then(|s| (s.table.as_ref() as &dyn Any).downcast_ref::<ValueTable<K, V>>())
        {
            Some(t) => t,
            None => misuse(format!(
                "value state handle {} of `{}` was not made by this backend",
                state.id,
                type_name::<V>()
            )),
        }
    }

    #[inline]
    fn index(&self, key_group: KeyGroup) -> usize {
        if !self.range.contains(key_group) {
            misuse(format!(
                "key group {key_group} is not in this backend's range {}",
                self.range
            ));
        }
        (key_group - self.range.start) as usize
    }

    /// The table of `state` and the index of `key_group` in it.
    #[inline]
    fn table_mut<V: StateValue>(
        &mut self,
        state: ValueState<V>,
        key_group: KeyGroup,
    ) -> (&mut ValueTable<K, V>, usize) {
        let index = self.index(key_group);
        let table = self.typed_table_mut(state);
        if index >= table.groups.len() {
            misuse(format!("key group {key_group} has no table"));
        }
        (table, index)
    }

    /// `state`'s table, for values of type `V`.
    #[inline]
    fn typed_table_mut<V: StateValue>(&mut self, state: ValueState<V>) -> &mut ValueTable<K, V> {
        match self
            .states
            .get_mut(usize::from(state.id))
            .and_then(|s| (s.table.as_mut() as &mut dyn Any).downcast_mut::<ValueTable<K, V>>())
        {
            Some(t) => t,
            None => misuse(format!(
                "value state handle {} of `{}` was not made by this backend",
                state.id,
                type_name::<V>()
            )),
        }
    }

    /// `state`'s table, found once for a run of accesses (a batch of records): each access
    /// then costs the key group's index and the hash lookup only. The typed lookup of a table
    /// (`Any`'s `type_id`, a virtual call returning 16 bytes through memory) was a fifth of a
    /// latest-per-key sink's time per record when it ran per access.
    ///
    /// # Panics
    /// If `state` was not made by this backend for values of type `V`.
    pub fn value_access<V: StateValue>(
        &mut self,
        state: ValueState<V>,
    ) -> HeapValueAccess<'_, K, V> {
        let range = self.range;
        HeapValueAccess {
            table: self.typed_table_mut(state),
            range,
        }
    }
}

/// The frozen view [`HeapKeyedStateBackend::snapshot`] returns.
struct HeapSnapshot {
    header: SnapshotHeader,
    tables: Vec<Box<dyn FrozenTable>>,
    scope: SnapshotScope,
}

impl KeyedSnapshot for HeapSnapshot {
    fn write_to(
        self: Box<Self>,
        out: &mut dyn std::io::Write,
    ) -> Result<KeyedSnapshotLayout, StateError> {
        let header = self.header.encode()?;
        out.write_all(&header)?;
        let mut pos = header.len() as u64;
        let range = self.header.key_group_range;
        let mut offsets = Vec::with_capacity(range.len() as usize);
        let mut section = SectionWriter::for_header(&self.header);
        let mut encoder = EntryEncoder::new();
        for (index, kg) in range.iter().enumerate() {
            offsets.push(pos);
            section.begin(kg);
            for (meta, table) in self.header.states.iter().zip(&self.tables) {
                table.write_group(index, meta.id, &mut encoder, &mut section)?;
            }
            let bytes = section.finish()?;
            out.write_all(bytes)?;
            pos += bytes.len() as u64;
        }
        Ok(KeyedSnapshotLayout {
            key_group_range: range,
            header: (0, header.len() as u64),
            offsets,
            end: pos,
        })
    }

    fn scope(&self) -> SnapshotScope {
        self.scope
    }
}

impl<K: StateKey> KeyedStateBackend<K> for HeapKeyedStateBackend<K> {
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
            let Some(registered) = self.states.get(usize::from(id)) else {
                return Err(StateError::Restore(format!(
                    "state '{name}' has a lost id {id}"
                )));
            };
            if registered.kind != kind
                || !(registered.table.as_ref() as &dyn Any).is::<ValueTable<K, V>>()
            {
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
        if count > MAX_STATES {
            return Err(StateError::TooManyStates {
                name: name.to_string(),
                count,
                max: MAX_STATES,
            });
        }
        let table = match &pending {
            None => ValueTable::<K, V>::empty(self.range.len() as usize),
            Some(p) => {
                restored::check_registration(name, p, kind, value_type)?;
                ValueTable {
                    groups: restored::decode_pending::<K, V>(
                        name,
                        p,
                        self.range,
                        self.max_parallelism,
                    )?
                    .into_iter()
                    .map(CowGroup::from_shared)
                    .collect(),
                    ..ValueTable::empty(0)
                }
            }
        };
        let mut table = ValueTable {
            default: options.default,
            expiry: options.expiry,
            cleanup_full_snapshot: options.cleanup_full_snapshot,
            ..table
        };
        if self.incremental.as_ref().is_some_and(|i| i.tracking) {
            table.track_changes();
        }
        let id = u16::try_from(self.states.len()).map_err(|_| StateError::TooManyStates {
            name: name.to_string(),
            count,
            max: MAX_STATES,
        })?;
        self.restored.pending.remove(name);
        self.states.push(Registered {
            name: name.to_string(),
            kind,
            value_type,
            table: Box::new(table),
        });
        self.by_name.insert(name.to_string(), id);
        Ok(ValueState::from_id(id))
    }

    #[inline]
    fn value<V: StateValue>(
        &mut self,
        state: ValueState<V>,
        key: &K,
        key_group: KeyGroup,
    ) -> Option<&V> {
        let table = self.table(state);
        match table.groups.get(self.index(key_group)) {
            Some(g) => g.get().get(key).or(table.default.as_ref()),
            None => misuse(format!("key group {key_group} has no table")),
        }
    }

    #[inline]
    fn value_mut_or_insert<V: StateValue>(
        &mut self,
        state: ValueState<V>,
        key: &K,
        key_group: KeyGroup,
        init: impl FnOnce() -> V,
    ) -> &mut V {
        let (table, index) = self.table_mut(state, key_group);
        table.value_mut_or_insert(index, key, init)
    }

    #[inline]
    fn update<V: StateValue>(
        &mut self,
        state: ValueState<V>,
        key: &K,
        key_group: KeyGroup,
        value: V,
    ) {
        let (table, index) = self.table_mut(state, key_group);
        table.update(index, key, value)
    }

    #[inline]
    fn clear<V: StateValue>(&mut self, state: ValueState<V>, key: &K, key_group: KeyGroup) {
        // By id, whatever the stored value type: a TTL state's handle names the user's type.
        let index = self.index(key_group);
        match self.states.get_mut(usize::from(state.id)) {
            Some(s) => s.table.remove(index, key),
            None => misuse(format!(
                "state handle {} was not made by this backend",
                state.id
            )),
        }
    }

    fn cleanup_expired<V: StateValue>(&mut self, state: ValueState<V>, budget: usize, now_ms: i64) {
        if let Some(table) = self
            .states
            .get_mut(usize::from(state.id))
            .and_then(|s| (s.table.as_mut() as &mut dyn Any).downcast_mut::<ValueTable<K, V>>())
        {
            table.cleanup(budget, now_ms);
        }
    }

    fn for_each_entry<V: StateValue>(&mut self, state: ValueState<V>, f: &mut dyn FnMut(&K, &V)) {
        for (k, v) in self.entries(state) {
            f(k, v);
        }
    }

    fn snapshot(&mut self) -> Result<Box<dyn KeyedSnapshot>, StateError> {
        self.freeze(Freeze::Full)
    }

    fn snapshot_incremental(
        &mut self,
        checkpoint_id: u64,
    ) -> Result<Box<dyn KeyedSnapshot>, StateError> {
        let Some(inc) = &mut self.incremental else {
            return self.freeze(Freeze::Full);
        };
        // Tables not tracked yet start now; this snapshot is full for them (no base yet).
        inc.tracking = true;
        let base = inc.confirmed.filter(|&(_, len)| len < inc.max_chain);
        let chain = base.map_or(1, |(_, len)| len + 1);
        inc.taken.push((checkpoint_id, chain));
        self.freeze(Freeze::Incremental {
            checkpoint: checkpoint_id,
            base: base.map(|(id, _)| id),
        })
    }

    fn notify_checkpoint_complete(&mut self, checkpoint_id: u64) {
        let Some(inc) = &mut self.incremental else {
            return;
        };
        let Some(&(id, chain)) = inc.taken.iter().find(|(id, _)| *id == checkpoint_id) else {
            // A savepoint, or a checkpoint this backend took no incremental snapshot for.
            return;
        };
        inc.confirmed = Some((id, chain));
        inc.taken.retain(|(taken, _)| *taken > id);
        for s in &mut self.states {
            s.table.confirm(id);
        }
    }

    fn notify_checkpoint_aborted(&mut self, checkpoint_id: u64) {
        let Some(inc) = &mut self.incremental else {
            return;
        };
        if !inc.taken.iter().any(|(id, _)| *id == checkpoint_id) {
            return;
        }
        inc.taken.retain(|(id, _)| *id != checkpoint_id);
        for s in &mut self.states {
            s.table.abort(checkpoint_id);
        }
    }

    fn start_new_chain(&mut self) {
        let Some(inc) = &mut self.incremental else {
            return;
        };
        // The next snapshot is full, so no change taken before it is needed any more.
        inc.confirmed = None;
        inc.taken.clear();
        for s in &mut self.states {
            s.table.confirm(u64::MAX);
        }
    }

    fn restore(&mut self, parts: &[RestorePart<'_>]) -> Result<(), StateError> {
        if !self.states.is_empty() {
            return Err(StateError::Restore(format!(
                "restore must come before any state is registered, and {:?} already are",
                self.state_names()
            )));
        }
        self.restored
            .restore(parts, self.range, self.max_parallelism, type_name::<K>())
    }
}

/// What [`HeapKeyedStateBackend::freeze`] takes.
#[derive(Clone, Copy, Debug)]
enum Freeze {
    /// A full, self-contained snapshot (a savepoint, or a checkpoint without incremental mode).
    Full,
    /// A link of an incremental chain: a delta on `base`, or a full one when `base` is `None`.
    Incremental { checkpoint: u64, base: Option<u64> },
}

impl<K: StateKey> HeapKeyedStateBackend<K> {
    /// The synchronous part of every snapshot: the header and each table's frozen view.
    fn freeze(&mut self, how: Freeze) -> Result<Box<dyn KeyedSnapshot>, StateError> {
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
        let mut metas = Vec::with_capacity(total);
        let mut tables: Vec<Box<dyn FrozenTable>> = Vec::with_capacity(total);
        // `total <= MAX_STATES == i16::MAX`, so every index fits an i16.
        let mut ids = 0..i16::MAX;
        for (registered, id) in self.states.iter().zip(&mut ids) {
            metas.push(StateMeta {
                id,
                name: registered.name.clone(),
                kind: registered.kind,
                key_type: key_type.to_string(),
                value_type: registered.value_type.to_string(),
                serializer_version: SERIALIZER_VERSION,
            });
        }
        let delta = matches!(how, Freeze::Incremental { base: Some(_), .. });
        for registered in &mut self.states {
            tables.push(match how {
                Freeze::Full => registered.table.freeze(now_ms),
                Freeze::Incremental { checkpoint, .. } => registered
                    .table
                    .freeze_incremental(checkpoint, now_ms, delta),
            });
        }
        let mut overlays = delta;
        for ((name, pending), id) in self.restored.pending.iter().zip(&mut ids) {
            metas.push(pending.meta(id, name));
            if delta {
                tables.push(Box::new(FrozenUnchanged));
            } else {
                overlays |= pending.has_overlays();
                tables.push(Box::new(FrozenPending(Arc::clone(pending))));
            }
        }
        let header = SnapshotHeader {
            flags: 0,
            compression: self.compression,
            overlays,
            delta,
            key_group_range: self.range,
            max_parallelism: self.max_parallelism,
            states: metas,
        };
        let scope = match how {
            Freeze::Full => SnapshotScope::SelfContained,
            Freeze::Incremental { base, .. } => SnapshotScope::Incremental { base },
        };
        Ok(Box::new(HeapSnapshot {
            header: SnapshotHeader {
                flags: header.expected_flags(),
                ..header
            },
            tables,
            scope,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ValueStateDescriptor;
    use crate::format;
    use weir_core::CoreError;
    use weir_core::handle::{KeyedStateHandle, StreamStateHandle};
    use weir_core::keygroup::assign_to_key_group;

    /// Writes a snapshot of `b` into memory: its handle (inline stream left empty) and bytes.
    fn written<K: StateKey>(b: &mut HeapKeyedStateBackend<K>) -> (KeyedStateHandle, Vec<u8>) {
        let mut bytes = Vec::new();
        let layout = b.snapshot().unwrap().write_to(&mut bytes).unwrap();
        (
            layout.into_handle(StreamStateHandle::Inline(Vec::new())),
            bytes,
        )
    }

    fn restore_whole<K: StateKey>(
        b: &mut HeapKeyedStateBackend<K>,
        (handle, bytes): &(KeyedStateHandle, Vec<u8>),
    ) -> Result<(), StateError> {
        b.restore(&[format::whole_stream_part(handle, bytes)?])
    }

    fn put(b: &mut HeapKeyedStateBackend<String>, s: ValueState<u64>, key: &str, v: u64) {
        let key = key.to_string();
        let g = assign_to_key_group(&key, b.max_parallelism());
        b.update(s, &key, g, v);
    }

    /// A snapshot of one `ValueState<u64>` named "count" with `u64` keys, written by hand (so it
    /// may misplace or repeat keys): key group `kg` holds `entries(kg)`.
    fn forged(
        max_parallelism: u32,
        range: KeyGroupRange,
        entries: impl Fn(KeyGroup) -> Vec<(u64, u64)>,
    ) -> (KeyedStateHandle, Vec<u8>) {
        let header = SnapshotHeader {
            flags: 0,
            compression: Compression::None,
            overlays: false,
            delta: false,
            key_group_range: range,
            max_parallelism,
            states: vec![StateMeta {
                id: 0,
                name: "count".to_string(),
                kind: StateKind::Value,
                key_type: type_name::<u64>().to_string(),
                value_type: type_name::<u64>().to_string(),
                serializer_version: SERIALIZER_VERSION,
            }],
        };
        let mut bytes = header.encode().unwrap();
        let header_end = bytes.len() as u64;
        let mut offsets = Vec::new();
        let mut section = SectionWriter::new();
        let mut encoder = EntryEncoder::new();
        for kg in range.iter() {
            offsets.push(bytes.len() as u64);
            section.begin(kg);
            let entries = entries(kg);
            if !entries.is_empty() {
                let (count, block) = encoder.encode(entries.iter().map(|(k, v)| (k, v))).unwrap();
                section.block(0, count, block).unwrap();
            }
            bytes.extend_from_slice(section.finish().unwrap());
        }
        let layout = KeyedSnapshotLayout {
            key_group_range: range,
            header: (0, header_end),
            offsets,
            end: bytes.len() as u64,
        };
        (
            layout.into_handle(StreamStateHandle::Inline(Vec::new())),
            bytes,
        )
    }

    /// The keys `0..n` by key group of max parallelism 16, each with the value `key + 1`.
    fn keys_by_group(n: u64) -> Vec<Vec<(u64, u64)>> {
        let mut groups = vec![Vec::new(); 16];
        for k in 0..n {
            groups[assign_to_key_group(&k, 16) as usize].push((k, k + 1));
        }
        groups
    }

    fn register_count(b: &mut HeapKeyedStateBackend<u64>) -> Result<ValueState<u64>, StateError> {
        b.value_state(&ValueStateDescriptor::<u64>::new("count"))
    }

    /// A key in the wrong key group and a key twice are corruption naming the state and the key
    /// group, the first such key group in order, for a small state (decoded on the task's
    /// thread) and a large one (over 1 MB: decoded on several threads where there are cores).
    #[test]
    fn misplaced_and_repeated_keys_name_the_first_bad_key_group() {
        for n in [200, 300_000] {
            let groups = keys_by_group(n);
            let range = KeyGroupRange::new(0, 15);
            let stray = groups[3][0];
            let twice = groups[5][1];
            let cases: [(&[KeyGroup], &[KeyGroup], u32, &str); 4] = [
                (
                    &[11],
                    &[],
                    11,
                    "a key of key group 3 was found in key group 11",
                ),
                (&[], &[5], 5, "a key appears twice"),
                (&[11], &[5], 5, "a key appears twice"),
                (
                    &[2, 11],
                    &[5],
                    2,
                    "a key of key group 3 was found in key group 2",
                ),
            ];
            for (misplaced_in, repeated_in, first, reason) in cases {
                let w = forged(16, range, |kg| {
                    let mut entries = groups[kg as usize].clone();
                    if misplaced_in.contains(&kg) {
                        entries.push(stray);
                    }
                    if repeated_in.contains(&kg) {
                        entries.push(twice);
                    }
                    entries
                });
                let mut r = HeapKeyedStateBackend::<u64>::new(16, range);
                restore_whole(&mut r, &w).unwrap();
                match register_count(&mut r).unwrap_err() {
                    StateError::Core(CoreError::Corrupt { what, reason: why }) => {
                        assert_eq!(what, format!("state 'count' in key group {first}"), "{n}");
                        assert_eq!(why, reason, "{n}");
                    }
                    other => panic!("{n} keys: expected Corrupt, got {other}"),
                }
                // The failed registration leaves the state pending, and it fails again alike.
                assert_eq!(r.pending_state_names(), vec!["count"]);
                assert!(register_count(&mut r).is_err());
            }
            // Untouched, the same entries restore whole.
            let w = forged(16, range, |kg| groups[kg as usize].clone());
            let mut r = HeapKeyedStateBackend::<u64>::new(16, range);
            restore_whole(&mut r, &w).unwrap();
            let s = register_count(&mut r).unwrap();
            assert_eq!(r.num_entries() as u64, n);
            for k in [0, n / 2, n - 1] {
                assert_eq!(r.value(s, &k, assign_to_key_group(&k, 16)), Some(&(k + 1)));
            }
        }
    }

    /// A large restore reads its sections on several threads; a damaged section is still the
    /// error of the first damaged key group, and the backend is left as it was.
    #[test]
    fn a_large_restore_reports_the_first_damaged_section() {
        let groups = keys_by_group(300_000);
        let range = KeyGroupRange::new(0, 15);
        let (handle, bytes) = forged(16, range, |kg| groups[kg as usize].clone());
        let mut damaged = bytes.clone();
        for kg in [9, 4, 13] {
            let at = handle.offsets[kg] as usize + 100;
            damaged[at] ^= 0x10;
        }
        let mut r = HeapKeyedStateBackend::<u64>::new(16, range);
        match restore_whole(&mut r, &(handle.clone(), damaged)).unwrap_err() {
            StateError::Core(CoreError::Corrupt { what, .. }) => {
                assert_eq!(what, "keyed snapshot section of key group 4");
            }
            other => panic!("expected Corrupt, got {other}"),
        }
        assert!(r.pending_state_names().is_empty());
        restore_whole(&mut r, &(handle, bytes)).unwrap();
        register_count(&mut r).unwrap();
        assert_eq!(r.num_entries(), 300_000);
    }

    #[test]
    fn inspection_methods_follow_the_state() {
        let mut b = HeapKeyedStateBackend::<String>::new(128, KeyGroupRange::new(0, 127));
        let s = b
            .value_state(&ValueStateDescriptor::<u64>::new("sum"))
            .unwrap();
        let t = b
            .value_state(&ValueStateDescriptor::<String>::new("tag"))
            .unwrap();
        assert_eq!(b.state_names(), vec!["sum", "tag"]);
        for w in ["a", "b", "a", "a"] {
            let key = w.to_string();
            let g = assign_to_key_group(&key, 128);
            *b.value_mut_or_insert(s, &key, g, || 0) += 1;
        }
        assert_eq!(b.num_entries(), 2);
        let key = "a".to_string();
        let g = assign_to_key_group(&key, 128);
        b.clear(s, &key, g);
        assert_eq!(b.num_entries(), 1);
        let entries: Vec<(String, u64)> = b.entries(s).map(|(k, v)| (k.clone(), *v)).collect();
        assert_eq!(entries, vec![("b".to_string(), 1)]);
        b.update(t, &key, g, "x".to_string());
        assert_eq!(b.num_entries(), 2, "entries of every state count");
        assert_eq!(b.entries(t).count(), 1);
    }

    #[test]
    fn restored_states_are_pending_until_registered() {
        let mut b = HeapKeyedStateBackend::<String>::new(8, KeyGroupRange::new(0, 7));
        let s = b
            .value_state(&ValueStateDescriptor::<u64>::new("lazy"))
            .unwrap();
        put(&mut b, s, "x", 42);
        let first = written(&mut b);
        let mut r = HeapKeyedStateBackend::<String>::new(8, KeyGroupRange::new(0, 7));
        restore_whole(&mut r, &first).unwrap();
        assert_eq!(r.pending_state_names(), vec!["lazy"]);
        assert!(r.state_names().is_empty());
        let second = written(&mut r);
        let mut r2 = HeapKeyedStateBackend::<String>::new(8, KeyGroupRange::new(0, 7));
        restore_whole(&mut r2, &second).unwrap();
        assert_eq!(r2.pending_state_names(), vec!["lazy"]);
        r2.value_state(&ValueStateDescriptor::<u64>::new("lazy"))
            .unwrap();
        assert!(r2.pending_state_names().is_empty());
        assert_eq!(r2.state_names(), vec!["lazy"]);
        assert_eq!(r2.num_entries(), 1);
    }

    #[test]
    fn a_full_backend_restores_every_state_as_pending() {
        let mut b = HeapKeyedStateBackend::<u32>::new(1, KeyGroupRange::new(0, 0));
        for i in 0..MAX_STATES {
            b.value_state(&ValueStateDescriptor::<u8>::new(format!("s{i}")))
                .unwrap();
        }
        let w = written(&mut b);
        let mut r = HeapKeyedStateBackend::<u32>::new(1, KeyGroupRange::new(0, 0));
        restore_whole(&mut r, &w).unwrap();
        assert_eq!(r.pending_state_names().len(), 32767);
    }

    /// The wording of the heap's errors (the conformance suite checks only what they name).
    #[test]
    fn error_messages_say_what_went_wrong() {
        let mut b = HeapKeyedStateBackend::<String>::new(8, KeyGroupRange::new(0, 7));
        let s = b
            .value_state(&ValueStateDescriptor::<u64>::new("count"))
            .unwrap();
        put(&mut b, s, "x", 1);
        let w = written(&mut b);

        // Restoring a key group twice.
        let range = KeyGroupRange::new(2, 3);
        let mut r = HeapKeyedStateBackend::<String>::new(8, range);
        let part = format::whole_stream_part(&w.0, &w.1).unwrap();
        let again = format::whole_stream_part(&w.0, &w.1).unwrap();
        let e = r.restore(&[part, again]).unwrap_err().to_string();
        assert!(e.contains("key group 2") && e.contains("twice"), "{e}");

        // Another max parallelism, and a restore after registration.
        let mut other = HeapKeyedStateBackend::<String>::new(16, KeyGroupRange::new(0, 15));
        let e = restore_whole(&mut other, &w).unwrap_err().to_string();
        assert!(e.contains("max parallelism 8"), "{e}");
        let e = restore_whole(&mut b, &w).unwrap_err().to_string();
        assert!(e.contains("before any state is registered"), "{e}");

        // Another value type after a restore: both types, quoted.
        let mut r = HeapKeyedStateBackend::<String>::new(8, KeyGroupRange::new(0, 7));
        restore_whole(&mut r, &w).unwrap();
        match r
            .value_state(&ValueStateDescriptor::<u32>::new("count"))
            .unwrap_err()
        {
            StateError::Incompatible { name, reason } => {
                assert_eq!(name, "count");
                assert!(
                    reason.contains("`u64`") && reason.contains("`u32`"),
                    "{reason}"
                );
            }
            other => panic!("expected Incompatible, got {other}"),
        }

        // Another key type.
        let mut other = HeapKeyedStateBackend::<i64>::new(8, KeyGroupRange::new(0, 7));
        let e = restore_whole(&mut other, &w).unwrap_err();
        assert!(
            matches!(&e, StateError::Incompatible { reason, .. } if reason.contains("i64")),
            "{e}"
        );
    }

    #[test]
    fn snapshot_shares_key_groups_and_a_write_copies_only_its_group() {
        let mut b = HeapKeyedStateBackend::<String>::new(8, KeyGroupRange::new(0, 7));
        let s = b
            .value_state(&ValueStateDescriptor::<u64>::new("c"))
            .unwrap();
        for i in 0..100u64 {
            let k = format!("k{i}");
            let g = assign_to_key_group(&k, 8);
            b.update(s, &k, g, i);
        }
        let strong = |b: &HeapKeyedStateBackend<String>| -> Vec<usize> {
            b.table(s).groups.iter().map(CowGroup::holders).collect()
        };
        assert_eq!(strong(&b), vec![1; 8]);
        let snapshot = b.snapshot().unwrap();
        assert_eq!(strong(&b), vec![2; 8], "the snapshot holds every group");

        let k = "k1".to_string();
        let g = assign_to_key_group(&k, 8);
        *b.value_mut_or_insert(s, &k, g, || 0) += 1;
        // Clearing an absent key in a shared group copies nothing.
        let absent = "absent".to_string();
        let ag = assign_to_key_group(&absent, 8);
        b.clear(s, &absent, ag);
        let counts = strong(&b);
        for (kg, count) in counts.iter().enumerate() {
            let expected = if kg as u32 == g { 1 } else { 2 };
            assert_eq!(*count, expected, "key group {kg}");
        }
        drop(snapshot);
        assert_eq!(strong(&b), vec![1; 8]);
    }

    #[test]
    #[should_panic(expected = "key group 9 is not in this backend's range")]
    fn a_key_group_out_of_range_is_a_caller_bug() {
        let mut b = HeapKeyedStateBackend::<u32>::new(16, KeyGroupRange::new(0, 7));
        let s = b
            .value_state(&ValueStateDescriptor::<u64>::new("c"))
            .unwrap();
        b.update(s, &1, 9, 1);
    }
}
