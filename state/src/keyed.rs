//! The keyed-state seam: [`KeyedStateBackend`], descriptors, and typed state handles.
//!
//! A backend owns the keyed state of one operator in one subtask: the key groups of its
//! [`KeyGroupRange`]. Operators reach state through small handles ([`ValueState`], [`ListState`],
//! [`MapState`], [`ReducingState`], [`AggregatingState`]) and pass the current key with its key
//! group, computed once per record by the caller; [`KeyedAccess`] binds the two for Flink-style
//! calls. Every kind is stored as one value per key (the list, the map, the accumulator), so a
//! backend implements one primitive and the kinds' semantics live here, once.

use crate::StateError;
use serde::{Serialize, de::DeserializeOwned};
use std::collections::BTreeMap;
use std::hash::Hash;
use std::marker::PhantomData;
use std::sync::Arc;
use weir_core::handle::{KeyedStateHandle, StreamStateHandle};
use weir_core::keygroup::{KeyGroup, KeyGroupRange, KeyHash};

/// A type that can key state: hashable to a key group, comparable, serializable.
pub trait StateKey:
    KeyHash + Eq + Hash + Clone + Serialize + DeserializeOwned + Send + Sync + 'static
{
}
impl<T> StateKey for T where
    T: KeyHash + Eq + Hash + Clone + Serialize + DeserializeOwned + Send + Sync + 'static
{
}

/// A type that can be a state value.
pub trait StateValue: Clone + Serialize + DeserializeOwned + Send + Sync + 'static {}
impl<T> StateValue for T where T: Clone + Serialize + DeserializeOwned + Send + Sync + 'static {}

pub use crate::format::StateKind;

/// Describes a value state: its name (unique within the operator), value type and default.
#[derive(Debug, Clone)]
pub struct ValueStateDescriptor<V> {
    /// The state's name.
    pub name: String,
    /// What [`KeyedStateBackend::value`] returns for a key without a value (Flink's default
    /// value); `None` by default.
    pub default: Option<V>,
}

impl<V: StateValue> ValueStateDescriptor<V> {
    /// A descriptor for a value state called `name`.
    pub fn new(name: impl Into<String>) -> Self {
        ValueStateDescriptor {
            name: name.into(),
            default: None,
        }
    }

    /// The same, with a default value for keys without one.
    pub fn with_default(mut self, default: V) -> Self {
        self.default = Some(default);
        self
    }

    /// The value type's name, recorded in snapshots to detect incompatible restores.
    pub fn type_name(&self) -> &'static str {
        std::any::type_name::<V>()
    }
}

/// Describes a list state (Flink's `ListStateDescriptor`): a list of `V` per key.
#[derive(Debug, Clone)]
pub struct ListStateDescriptor<V> {
    /// The state's name.
    pub name: String,
    _value: PhantomData<fn() -> V>,
}

impl<V: StateValue> ListStateDescriptor<V> {
    /// A descriptor for a list state called `name`.
    pub fn new(name: impl Into<String>) -> Self {
        ListStateDescriptor {
            name: name.into(),
            _value: PhantomData,
        }
    }
}

/// Describes a map state (Flink's `MapStateDescriptor`): a map from `UK` to `UV` per key.
#[derive(Debug, Clone)]
pub struct MapStateDescriptor<UK, UV> {
    /// The state's name.
    pub name: String,
    _types: PhantomData<fn() -> (UK, UV)>,
}

impl<UK: MapKey, UV: StateValue> MapStateDescriptor<UK, UV> {
    /// A descriptor for a map state called `name`.
    pub fn new(name: impl Into<String>) -> Self {
        MapStateDescriptor {
            name: name.into(),
            _types: PhantomData,
        }
    }
}

/// A reduce function: combines two values into one of the same type.
pub type ReduceFn<V> = Arc<dyn Fn(&V, &V) -> V + Send + Sync>;

/// Describes a reducing state (Flink's `ReducingStateDescriptor`): one value per key, to which
/// each added value is folded with the reduce function.
#[derive(Clone)]
pub struct ReducingStateDescriptor<V> {
    /// The state's name.
    pub name: String,
    /// The reduce function.
    pub reduce: ReduceFn<V>,
}

impl<V: StateValue> ReducingStateDescriptor<V> {
    /// A descriptor for a reducing state called `name`.
    pub fn new(
        name: impl Into<String>,
        reduce: impl Fn(&V, &V) -> V + Send + Sync + 'static,
    ) -> Self {
        ReducingStateDescriptor {
            name: name.into(),
            reduce: Arc::new(reduce),
        }
    }
}

impl<V> std::fmt::Debug for ReducingStateDescriptor<V> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReducingStateDescriptor")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

/// Flink's `AggregateFunction`: folds inputs of type `IN` into an accumulator `ACC`, from which
/// a result `OUT` is read.
pub trait AggregateFunction<IN: 'static, ACC, OUT: 'static>: Send + Sync + 'static {
    /// A new, empty accumulator.
    fn create_accumulator(&self) -> ACC;
    /// Adds one input to the accumulator.
    fn add(&self, value: IN, accumulator: &mut ACC);
    /// The result of an accumulator.
    fn get_result(&self, accumulator: &ACC) -> OUT;
    /// Merges two accumulators (for merging windows).
    fn merge(&self, a: ACC, b: ACC) -> ACC;
}

/// Describes an aggregating state (Flink's `AggregatingStateDescriptor`): one accumulator per
/// key.
pub struct AggregatingStateDescriptor<IN, ACC, OUT> {
    /// The state's name.
    pub name: String,
    /// The aggregate function.
    pub function: Arc<dyn AggregateFunction<IN, ACC, OUT>>,
}

impl<IN, ACC, OUT> Clone for AggregatingStateDescriptor<IN, ACC, OUT> {
    fn clone(&self) -> Self {
        AggregatingStateDescriptor {
            name: self.name.clone(),
            function: self.function.clone(),
        }
    }
}

impl<IN: 'static, ACC: StateValue, OUT: 'static> AggregatingStateDescriptor<IN, ACC, OUT> {
    /// A descriptor for an aggregating state called `name`.
    pub fn new(name: impl Into<String>, function: impl AggregateFunction<IN, ACC, OUT>) -> Self {
        AggregatingStateDescriptor {
            name: name.into(),
            function: Arc::new(function),
        }
    }
}

impl<IN, ACC, OUT> std::fmt::Debug for AggregatingStateDescriptor<IN, ACC, OUT> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AggregatingStateDescriptor")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

/// A map state's key: ordered, so a snapshot of equal state gives identical bytes.
pub trait MapKey: Ord + Clone + Serialize + DeserializeOwned + Send + Sync + 'static {}
impl<T> MapKey for T where T: Ord + Clone + Serialize + DeserializeOwned + Send + Sync + 'static {}

/// A handle to a registered state whose per-key value is `V`: the value of a value state, the
/// list of a list state, the map of a map state, the accumulator of a reducing or aggregating
/// state. Cheap to copy; valid only with the backend that made it.
#[derive(Debug)]
pub struct ValueState<V> {
    /// The state's index in its backend.
    pub id: u16,
    _value: PhantomData<fn() -> V>,
}

impl<V> ValueState<V> {
    /// A handle for state number `id`; for backend implementations.
    pub fn from_id(id: u16) -> Self {
        ValueState {
            id,
            _value: PhantomData,
        }
    }
}

impl<V> Clone for ValueState<V> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<V> Copy for ValueState<V> {}

/// A registered list state.
#[derive(Debug)]
pub struct ListState<V> {
    /// The per-key lists.
    pub raw: ValueState<Vec<V>>,
}

impl<V> Clone for ListState<V> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<V> Copy for ListState<V> {}

/// A registered map state.
#[derive(Debug)]
pub struct MapState<UK, UV> {
    /// The per-key maps.
    pub raw: ValueState<BTreeMap<UK, UV>>,
}

impl<UK, UV> Clone for MapState<UK, UV> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<UK, UV> Copy for MapState<UK, UV> {}

/// A registered reducing state.
pub struct ReducingState<V> {
    /// The per-key reduced values.
    pub raw: ValueState<V>,
    /// The reduce function.
    pub reduce: ReduceFn<V>,
}

impl<V> Clone for ReducingState<V> {
    fn clone(&self) -> Self {
        ReducingState {
            raw: self.raw,
            reduce: self.reduce.clone(),
        }
    }
}

/// A registered aggregating state.
pub struct AggregatingState<IN, ACC, OUT> {
    /// The per-key accumulators.
    pub raw: ValueState<ACC>,
    /// The aggregate function.
    pub function: Arc<dyn AggregateFunction<IN, ACC, OUT>>,
}

impl<IN, ACC, OUT> Clone for AggregatingState<IN, ACC, OUT> {
    fn clone(&self) -> Self {
        AggregatingState {
            raw: self.raw,
            function: self.function.clone(),
        }
    }
}

/// The states of one key: typed views that carry the key and its key group, so each call reads
/// like Flink's (`list.add(v)` for the current key).
pub struct KeyedAccess<'a, K, B: ?Sized> {
    backend: &'a mut B,
    key: &'a K,
    key_group: KeyGroup,
}

impl<'a, K: StateKey, B: KeyedStateBackend<K>> KeyedAccess<'a, K, B> {
    /// The states of `key`, whose key group is `key_group`.
    pub fn new(backend: &'a mut B, key: &'a K, key_group: KeyGroup) -> Self {
        KeyedAccess {
            backend,
            key,
            key_group,
        }
    }

    /// The key.
    pub fn key(&self) -> &K {
        self.key
    }

    /// A value state's value (or its descriptor's default).
    pub fn value<V: StateValue>(&self, state: ValueState<V>) -> Option<&V> {
        self.backend.value(state, self.key, self.key_group)
    }

    /// Sets a value state's value.
    pub fn update<V: StateValue>(&mut self, state: ValueState<V>, value: V) {
        self.backend.update(state, self.key, self.key_group, value)
    }

    /// Clears a value state.
    pub fn clear<V: StateValue>(&mut self, state: ValueState<V>) {
        self.backend.clear(state, self.key, self.key_group)
    }

    /// A list state's list; empty when there is none.
    pub fn list<V: StateValue>(&self, state: ListState<V>) -> &[V] {
        self.backend
            .value(state.raw, self.key, self.key_group)
            .map_or(&[], Vec::as_slice)
    }

    /// Appends to a list state's list.
    pub fn list_add<V: StateValue>(&mut self, state: ListState<V>, value: V) {
        self.backend
            .value_mut_or_insert(state.raw, self.key, self.key_group, Vec::new)
            .push(value)
    }

    /// Appends every value to a list state's list.
    pub fn list_add_all<V: StateValue>(
        &mut self,
        state: ListState<V>,
        values: impl IntoIterator<Item = V>,
    ) {
        let mut values = values.into_iter().peekable();
        if values.peek().is_some() {
            self.backend
                .value_mut_or_insert(state.raw, self.key, self.key_group, Vec::new)
                .extend(values)
        }
    }

    /// Replaces a list state's list; an empty list clears it (as in Flink).
    pub fn list_update<V: StateValue>(&mut self, state: ListState<V>, values: Vec<V>) {
        if values.is_empty() {
            self.backend.clear(state.raw, self.key, self.key_group)
        } else {
            self.backend
                .update(state.raw, self.key, self.key_group, values)
        }
    }

    /// The value a map state maps `user_key` to.
    pub fn map_get<UK: MapKey, UV: StateValue>(
        &self,
        state: MapState<UK, UV>,
        user_key: &UK,
    ) -> Option<&UV> {
        self.backend
            .value(state.raw, self.key, self.key_group)
            .and_then(|m| m.get(user_key))
    }

    /// Whether a map state has `user_key`.
    pub fn map_contains<UK: MapKey, UV: StateValue>(
        &self,
        state: MapState<UK, UV>,
        user_key: &UK,
    ) -> bool {
        self.map_get(state, user_key).is_some()
    }

    /// Maps `user_key` to `value` in a map state.
    pub fn map_put<UK: MapKey, UV: StateValue>(
        &mut self,
        state: MapState<UK, UV>,
        user_key: UK,
        value: UV,
    ) {
        self.backend
            .value_mut_or_insert(state.raw, self.key, self.key_group, BTreeMap::new)
            .insert(user_key, value);
    }

    /// Removes `user_key` from a map state; the map goes when its last entry does.
    pub fn map_remove<UK: MapKey, UV: StateValue>(
        &mut self,
        state: MapState<UK, UV>,
        user_key: &UK,
    ) -> Option<UV> {
        if !self.map_contains(state, user_key) {
            return None;
        }
        let map =
            self.backend
                .value_mut_or_insert(state.raw, self.key, self.key_group, BTreeMap::new);
        let removed = map.remove(user_key);
        if map.is_empty() {
            self.backend.clear(state.raw, self.key, self.key_group);
        }
        removed
    }

    /// A map state's entries, in key order.
    pub fn map_entries<UK: MapKey, UV: StateValue>(
        &self,
        state: MapState<UK, UV>,
    ) -> impl Iterator<Item = (&UK, &UV)> {
        self.backend
            .value(state.raw, self.key, self.key_group)
            .into_iter()
            .flat_map(|m| m.iter())
    }

    /// Whether a map state has no entry.
    pub fn map_is_empty<UK: MapKey, UV: StateValue>(&self, state: MapState<UK, UV>) -> bool {
        self.map_entries(state).next().is_none()
    }

    /// Clears a list, map, reducing or aggregating state (through its handle's `raw`).
    pub fn clear_raw<V: StateValue>(&mut self, raw: ValueState<V>) {
        self.backend.clear(raw, self.key, self.key_group)
    }

    /// A reducing state's value.
    pub fn reduced<V: StateValue>(&self, state: &ReducingState<V>) -> Option<&V> {
        self.backend.value(state.raw, self.key, self.key_group)
    }

    /// Folds `value` into a reducing state.
    pub fn reduce<V: StateValue>(&mut self, state: &ReducingState<V>, value: V) {
        let mut value = Some(value);
        let current = self
            .backend
            .value_mut_or_insert(state.raw, self.key, self.key_group, || {
                value.take().expect("taken once")
            });
        if let Some(value) = value {
            *current = (state.reduce)(current, &value);
        }
    }

    /// Adds `value` to an aggregating state's accumulator.
    pub fn aggregate<IN: 'static, ACC: StateValue, OUT: 'static>(
        &mut self,
        state: &AggregatingState<IN, ACC, OUT>,
        value: IN,
    ) {
        let function = &state.function;
        let acc = self
            .backend
            .value_mut_or_insert(state.raw, self.key, self.key_group, || {
                function.create_accumulator()
            });
        function.add(value, acc);
    }

    /// An aggregating state's result, if anything was added.
    pub fn aggregated<IN: 'static, ACC: StateValue, OUT: 'static>(
        &self,
        state: &AggregatingState<IN, ACC, OUT>,
    ) -> Option<OUT> {
        self.backend
            .value(state.raw, self.key, self.key_group)
            .map(|acc| state.function.get_result(acc))
    }
}

/// Where each key group's section landed in a written snapshot.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyedSnapshotLayout {
    /// The key groups written.
    pub key_group_range: KeyGroupRange,
    /// Byte range of the header.
    pub header: (u64, u64),
    /// Start of each key group's section.
    pub offsets: Vec<u64>,
    /// End of the last section (the total length).
    pub end: u64,
}

impl KeyedSnapshotLayout {
    /// The handle for this snapshot, once its bytes are stored at `stream`.
    pub fn into_handle(self, stream: StreamStateHandle) -> KeyedStateHandle {
        KeyedStateHandle {
            key_group_range: self.key_group_range,
            header: self.header,
            offsets: self.offsets,
            end: self.end,
            stream,
        }
    }
}

/// The frozen view a snapshot's synchronous part returns. Writing it happens later, on another
/// thread, while processing goes on and changes the live state.
pub trait KeyedSnapshot: Send + 'static {
    /// Writes the snapshot in the [`crate::format`] and returns where each key group landed.
    fn write_to(
        self: Box<Self>,
        out: &mut dyn std::io::Write,
    ) -> Result<KeyedSnapshotLayout, StateError>;
}

/// Bytes of one snapshot handed to a restore: the header, and a contiguous run of key-group
/// sections that starts at `sections_offset` within the original stream.
#[derive(Debug)]
pub struct RestorePart<'a> {
    /// The handle the bytes belong to.
    pub handle: &'a KeyedStateHandle,
    /// The bytes of `handle.header`.
    pub header: &'a [u8],
    /// Bytes of the sections, starting at `sections_offset`.
    pub sections: &'a [u8],
    /// Offset of `sections[0]` within the stream.
    pub sections_offset: u64,
}

/// The keyed state of one operator in one subtask.
///
/// Contract:
/// - Every access passes the key and its key group (`assign_to_key_group(key, max_parallelism)`);
///   the key group must be inside [`key_group_range`](Self::key_group_range). Passing another is
///   a caller bug and the backend may panic.
/// - Registering a state twice with the same name and type returns the same handle; another type
///   is [`StateError::Incompatible`].
/// - [`snapshot`](Self::snapshot) is the synchronous part: it returns a frozen view whose content
///   is the state at the moment of the call, unaffected by later updates. Its cost must not grow
///   with the amount of state.
/// - [`restore`](Self::restore) is called before any state is registered, with every part that
///   overlaps this backend's key groups; it keeps only the key groups in range.
/// - A restore refuses, with an error and never a panic: a snapshot of another max parallelism
///   or key type, corrupt bytes (naming the header or the key group), a key group handed over
///   twice (naming it), and any call after a state is registered.
/// - A restored state registered with another type is [`StateError::Incompatible`]. Restored
///   states not registered yet are carried unchanged into later snapshots, and count toward the
///   [`MAX_STATES`](crate::format::MAX_STATES) limit, beyond which registration is
///   [`StateError::TooManyStates`].
/// - Snapshots are written in the [`crate::format`], and equal state gives identical bytes.
///
/// [`crate::conformance`] checks all of this: every implementation must pass its `run_all`.
pub trait KeyedStateBackend<K: StateKey>: Send + 'static {
    /// The key groups this backend owns.
    fn key_group_range(&self) -> KeyGroupRange;

    /// The max parallelism (number of key groups) keys are hashed with.
    fn max_parallelism(&self) -> u32;

    /// Registers (or finds) a state of `kind` called `name` whose per-key value is `V` (the
    /// list of a list state, the map of a map state, ...). `default` is what
    /// [`value`](Self::value) returns for a key without a value. The typed constructors below
    /// call it; a backend with native list or map support may override them.
    fn register_state<V: StateValue>(
        &mut self,
        name: &str,
        kind: StateKind,
        default: Option<V>,
    ) -> Result<ValueState<V>, StateError>;

    /// Registers (or finds) a value state.
    fn value_state<V: StateValue>(
        &mut self,
        descriptor: &ValueStateDescriptor<V>,
    ) -> Result<ValueState<V>, StateError> {
        self.register_state(
            &descriptor.name,
            StateKind::Value,
            descriptor.default.clone(),
        )
    }

    /// Registers (or finds) a list state.
    fn list_state<V: StateValue>(
        &mut self,
        descriptor: &ListStateDescriptor<V>,
    ) -> Result<ListState<V>, StateError> {
        let raw = self.register_state(&descriptor.name, StateKind::List, None)?;
        Ok(ListState { raw })
    }

    /// Registers (or finds) a map state.
    fn map_state<UK: MapKey, UV: StateValue>(
        &mut self,
        descriptor: &MapStateDescriptor<UK, UV>,
    ) -> Result<MapState<UK, UV>, StateError> {
        let raw = self.register_state(&descriptor.name, StateKind::Map, None)?;
        Ok(MapState { raw })
    }

    /// Registers (or finds) a reducing state.
    fn reducing_state<V: StateValue>(
        &mut self,
        descriptor: &ReducingStateDescriptor<V>,
    ) -> Result<ReducingState<V>, StateError> {
        let raw = self.register_state(&descriptor.name, StateKind::Reducing, None)?;
        Ok(ReducingState {
            raw,
            reduce: descriptor.reduce.clone(),
        })
    }

    /// Registers (or finds) an aggregating state.
    fn aggregating_state<IN: 'static, ACC: StateValue, OUT: 'static>(
        &mut self,
        descriptor: &AggregatingStateDescriptor<IN, ACC, OUT>,
    ) -> Result<AggregatingState<IN, ACC, OUT>, StateError> {
        let raw = self.register_state(&descriptor.name, StateKind::Aggregating, None)?;
        Ok(AggregatingState {
            raw,
            function: descriptor.function.clone(),
        })
    }

    /// The value for `key`: its own, else the state's default, else `None`.
    fn value<V: StateValue>(
        &self,
        state: ValueState<V>,
        key: &K,
        key_group: KeyGroup,
    ) -> Option<&V>;

    /// A mutable reference to the value for `key`, inserting `init()` first if there is none.
    fn value_mut_or_insert<V: StateValue>(
        &mut self,
        state: ValueState<V>,
        key: &K,
        key_group: KeyGroup,
        init: impl FnOnce() -> V,
    ) -> &mut V;

    /// Sets the value for `key`.
    fn update<V: StateValue>(
        &mut self,
        state: ValueState<V>,
        key: &K,
        key_group: KeyGroup,
        value: V,
    );

    /// Removes the value for `key`.
    fn clear<V: StateValue>(&mut self, state: ValueState<V>, key: &K, key_group: KeyGroup);

    /// The synchronous part of a snapshot: freezes the current state.
    fn snapshot(&mut self) -> Result<Box<dyn KeyedSnapshot>, StateError>;

    /// Loads state from snapshots, keeping the key groups in this backend's range.
    fn restore(&mut self, parts: &[RestorePart<'_>]) -> Result<(), StateError>;
}
