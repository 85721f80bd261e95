//! The keyed-state seam: [`KeyedStateBackend`], descriptors, and typed state handles.
//!
//! A backend owns the keyed state of one operator in one subtask: the key groups of its
//! [`KeyGroupRange`]. Operators reach state through small handles ([`ValueState`], [`ListState`],
//! [`MapState`], [`ReducingState`], [`AggregatingState`]) and pass the current key with its key
//! group, computed once per record by the caller; [`KeyedAccess`] binds the two for Flink-style
//! calls. Every kind is stored as one value per key (the list, the map, the accumulator), so a
//! backend implements one primitive and the kinds' semantics live here, once.

use crate::StateError;
use serde::{Deserialize, Serialize, de::DeserializeOwned};
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

pub use crate::format::{RestoreFilePart, RestorePart, StateKind};

/// When a state's entries expire (Flink's `StateTtlConfig`), on processing time: an entry not
/// written (or, with [`TtlUpdateType::OnReadAndWrite`], read) for `ttl` is expired. For list
/// and map states each element or entry expires on its own.
///
/// Expired entries are never handed out (unless [`TtlVisibility::ReturnExpiredIfNotCleanedUp`])
/// and are cleaned up on access, from full snapshots ([`cleanup_full_snapshot`]), and
/// incrementally: each access of the state checks [`incremental_cleanup_size`] more entries,
/// key group by key group.
///
/// [`cleanup_full_snapshot`]: Self::cleanup_full_snapshot
/// [`incremental_cleanup_size`]: Self::incremental_cleanup_size
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StateTtlConfig {
    /// How long an entry lives after its last update.
    pub ttl: std::time::Duration,
    /// What renews an entry's time.
    pub update_type: TtlUpdateType,
    /// Whether expired entries that are still stored may be returned.
    pub visibility: TtlVisibility,
    /// Leave expired entries out of snapshots (Flink's `cleanupFullSnapshot`; default on).
    pub cleanup_full_snapshot: bool,
    /// Entries checked for expiry per state access (Flink's `cleanupIncrementally`, default 5;
    /// 0 turns it off).
    pub incremental_cleanup_size: usize,
}

impl StateTtlConfig {
    /// Entries live `ttl` after their last write; expired entries are never returned.
    pub fn new(ttl: std::time::Duration) -> Self {
        StateTtlConfig {
            ttl,
            update_type: TtlUpdateType::OnCreateAndWrite,
            visibility: TtlVisibility::NeverReturnExpired,
            cleanup_full_snapshot: true,
            incremental_cleanup_size: 5,
        }
    }

    /// The same, renewing the time on `update_type`.
    pub fn update_type(mut self, update_type: TtlUpdateType) -> Self {
        self.update_type = update_type;
        self
    }

    /// The same, with `visibility`.
    pub fn visibility(mut self, visibility: TtlVisibility) -> Self {
        self.visibility = visibility;
        self
    }

    /// The same, checking `entries` per access (0: no incremental cleanup).
    pub fn incremental_cleanup(mut self, entries: usize) -> Self {
        self.incremental_cleanup_size = entries;
        self
    }

    /// The same, keeping expired entries in snapshots.
    pub fn without_full_snapshot_cleanup(mut self) -> Self {
        self.cleanup_full_snapshot = false;
        self
    }

    fn ttl_ms(&self) -> i64 {
        i64::try_from(self.ttl.as_millis()).unwrap_or(i64::MAX)
    }

    /// Whether an entry last renewed at `last_access_ms` has expired at `now_ms`.
    pub fn is_expired(&self, last_access_ms: i64, now_ms: i64) -> bool {
        last_access_ms.saturating_add(self.ttl_ms()) <= now_ms
    }
}

/// What renews a TTL entry's time (Flink's `StateTtlConfig.UpdateType`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TtlUpdateType {
    /// Creating or writing it.
    OnCreateAndWrite,
    /// Reading it too.
    OnReadAndWrite,
}

/// Whether an expired entry that is still stored may be returned (Flink's
/// `StateTtlConfig.StateVisibility`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TtlVisibility {
    /// Never: an expired entry reads as absent (and is removed).
    NeverReturnExpired,
    /// Yes, until a cleanup removes it.
    ReturnExpiredIfNotCleanedUp,
}

/// A value with the time it was last renewed: how TTL states store each value, list element
/// and map entry.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TtlValue<V> {
    /// The value.
    pub value: V,
    /// When it was last renewed, in ms since the Unix epoch.
    pub last_access_ms: i64,
}

/// What a cleanup does with one stored value.
#[derive(Clone, Debug, PartialEq)]
pub enum Expiry<V> {
    /// Keep it as it is.
    Keep,
    /// Remove the key: everything in it expired.
    Drop,
    /// Keep this instead (some elements of a list or map expired).
    Replace(V),
}

/// A state's expiry check, registered with it: the backend applies it to stored values when it
/// cleans up (in snapshots and incrementally), without knowing what TTL is.
pub type ExpiryFn<V> = Arc<dyn Fn(&V, i64) -> Expiry<V> + Send + Sync>;

/// What a state is registered with besides its name and kind.
pub struct StateOptions<V> {
    /// What a key without a value reads as.
    pub default: Option<V>,
    /// The expiry check of a TTL state.
    pub expiry: Option<ExpiryFn<V>>,
    /// Whether snapshots leave expired values out.
    pub cleanup_full_snapshot: bool,
}

impl<V> Default for StateOptions<V> {
    fn default() -> Self {
        StateOptions {
            default: None,
            expiry: None,
            cleanup_full_snapshot: false,
        }
    }
}

fn ttl_options<V: 'static>(
    ttl: &StateTtlConfig,
    expiry: impl Fn(&V, i64) -> Expiry<V> + Send + Sync + 'static,
) -> StateOptions<V> {
    StateOptions {
        default: None,
        expiry: Some(Arc::new(expiry)),
        cleanup_full_snapshot: ttl.cleanup_full_snapshot,
    }
}

fn value_expiry<V: Clone>(
    ttl: StateTtlConfig,
) -> impl Fn(&TtlValue<V>, i64) -> Expiry<TtlValue<V>> {
    move |v, now| {
        if ttl.is_expired(v.last_access_ms, now) {
            Expiry::Drop
        } else {
            Expiry::Keep
        }
    }
}

fn list_expiry<V: Clone>(
    ttl: StateTtlConfig,
) -> impl Fn(&Vec<TtlValue<V>>, i64) -> Expiry<Vec<TtlValue<V>>> {
    move |list, now| {
        let live = list
            .iter()
            .filter(|e| !ttl.is_expired(e.last_access_ms, now))
            .count();
        if live == list.len() {
            Expiry::Keep
        } else if live == 0 {
            Expiry::Drop
        } else {
            Expiry::Replace(
                list.iter()
                    .filter(|e| !ttl.is_expired(e.last_access_ms, now))
                    .cloned()
                    .collect(),
            )
        }
    }
}

/// How a TTL map state stores each key's map.
type TtlMap<UK, UV> = BTreeMap<UK, TtlValue<UV>>;

fn map_expiry<UK: MapKey, UV: Clone>(
    ttl: StateTtlConfig,
) -> impl Fn(&TtlMap<UK, UV>, i64) -> Expiry<TtlMap<UK, UV>> {
    move |map, now| {
        let live = map
            .values()
            .filter(|e| !ttl.is_expired(e.last_access_ms, now))
            .count();
        if live == map.len() {
            Expiry::Keep
        } else if live == 0 {
            Expiry::Drop
        } else {
            Expiry::Replace(
                map.iter()
                    .filter(|(_, e)| !ttl.is_expired(e.last_access_ms, now))
                    .map(|(k, e)| (k.clone(), e.clone()))
                    .collect(),
            )
        }
    }
}

/// Describes a value state: its name (unique within the operator), value type and default.
#[derive(Debug, Clone)]
pub struct ValueStateDescriptor<V> {
    /// The state's name.
    pub name: String,
    /// What [`KeyedStateBackend::value`] returns for a key without a value (Flink's default
    /// value); `None` by default. Not used by TTL states.
    pub default: Option<V>,
    /// Time-to-live of the values.
    pub ttl: Option<StateTtlConfig>,
}

impl<V: StateValue> ValueStateDescriptor<V> {
    /// A descriptor for a value state called `name`.
    pub fn new(name: impl Into<String>) -> Self {
        ValueStateDescriptor {
            name: name.into(),
            default: None,
            ttl: None,
        }
    }

    /// The same, with a time-to-live.
    pub fn enable_ttl(mut self, ttl: StateTtlConfig) -> Self {
        self.ttl = Some(ttl);
        self
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
    /// Time-to-live of each element.
    pub ttl: Option<StateTtlConfig>,
    _value: PhantomData<fn() -> V>,
}

impl<V: StateValue> ListStateDescriptor<V> {
    /// A descriptor for a list state called `name`.
    pub fn new(name: impl Into<String>) -> Self {
        ListStateDescriptor {
            name: name.into(),
            ttl: None,
            _value: PhantomData,
        }
    }

    /// The same, with a time-to-live per element.
    pub fn enable_ttl(mut self, ttl: StateTtlConfig) -> Self {
        self.ttl = Some(ttl);
        self
    }
}

/// Describes a map state (Flink's `MapStateDescriptor`): a map from `UK` to `UV` per key.
#[derive(Debug, Clone)]
pub struct MapStateDescriptor<UK, UV> {
    /// The state's name.
    pub name: String,
    /// Time-to-live of each entry.
    pub ttl: Option<StateTtlConfig>,
    _types: PhantomData<fn() -> (UK, UV)>,
}

impl<UK: MapKey, UV: StateValue> MapStateDescriptor<UK, UV> {
    /// A descriptor for a map state called `name`.
    pub fn new(name: impl Into<String>) -> Self {
        MapStateDescriptor {
            name: name.into(),
            ttl: None,
            _types: PhantomData,
        }
    }

    /// The same, with a time-to-live per entry.
    pub fn enable_ttl(mut self, ttl: StateTtlConfig) -> Self {
        self.ttl = Some(ttl);
        self
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
    /// Time-to-live of the reduced value.
    pub ttl: Option<StateTtlConfig>,
}

impl<V: StateValue> ReducingStateDescriptor<V> {
    /// The same, with a time-to-live.
    pub fn enable_ttl(mut self, ttl: StateTtlConfig) -> Self {
        self.ttl = Some(ttl);
        self
    }

    /// A descriptor for a reducing state called `name`.
    pub fn new(
        name: impl Into<String>,
        reduce: impl Fn(&V, &V) -> V + Send + Sync + 'static,
    ) -> Self {
        ReducingStateDescriptor {
            name: name.into(),
            reduce: Arc::new(reduce),
            ttl: None,
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
    /// Time-to-live of the accumulator.
    pub ttl: Option<StateTtlConfig>,
}

impl<IN, ACC, OUT> Clone for AggregatingStateDescriptor<IN, ACC, OUT> {
    fn clone(&self) -> Self {
        AggregatingStateDescriptor {
            name: self.name.clone(),
            function: self.function.clone(),
            ttl: self.ttl,
        }
    }
}

impl<IN: 'static, ACC: StateValue, OUT: 'static> AggregatingStateDescriptor<IN, ACC, OUT> {
    /// A descriptor for an aggregating state called `name`.
    pub fn new(name: impl Into<String>, function: impl AggregateFunction<IN, ACC, OUT>) -> Self {
        AggregatingStateDescriptor {
            name: name.into(),
            function: Arc::new(function),
            ttl: None,
        }
    }

    /// The same, with a time-to-live.
    pub fn enable_ttl(mut self, ttl: StateTtlConfig) -> Self {
        self.ttl = Some(ttl);
        self
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
    /// Its time-to-live. A TTL state stores [`TtlValue`]s: reach it through [`KeyedAccess`],
    /// not the backend's primitive calls.
    pub ttl: Option<StateTtlConfig>,
    _value: PhantomData<fn() -> V>,
}

impl<V> ValueState<V> {
    /// A handle for state number `id`; for backend implementations.
    pub fn from_id(id: u16) -> Self {
        ValueState {
            id,
            ttl: None,
            _value: PhantomData,
        }
    }

    /// The same state as stored: for a TTL state, its values wrapped with their times.
    fn stored<S>(self) -> ValueState<S> {
        ValueState::from_id(self.id)
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
/// like Flink's (`list.add(v)` for the current key). It also applies time-to-live: TTL states
/// are stored as [`TtlValue`]s, and every call here wraps, checks and renews them, and gives the
/// backend its incremental cleanup budget.
pub struct KeyedAccess<'a, K, B: ?Sized> {
    backend: &'a mut B,
    key: &'a K,
    key_group: KeyGroup,
    now_ms: i64,
}

/// The elements of a list state, as [`KeyedAccess::list`] returns them.
#[derive(Debug, Clone)]
pub enum ListIter<'a, V> {
    /// Of a plain list.
    Plain(std::slice::Iter<'a, V>),
    /// Of a TTL list.
    Ttl(std::slice::Iter<'a, TtlValue<V>>),
}

impl<V: Clone> ListIter<'_, V> {
    /// The elements, copied out.
    pub fn to_vec(self) -> Vec<V> {
        self.cloned().collect()
    }
}

impl<'a, V> Iterator for ListIter<'a, V> {
    type Item = &'a V;

    fn next(&mut self) -> Option<&'a V> {
        match self {
            ListIter::Plain(i) => i.next(),
            ListIter::Ttl(i) => i.next().map(|e| &e.value),
        }
    }
}

/// The entries of a map state, in key order, as [`KeyedAccess::map_entries`] returns them.
#[derive(Debug, Clone)]
pub enum MapIter<'a, UK, UV> {
    /// Of a plain map.
    Plain(std::collections::btree_map::Iter<'a, UK, UV>),
    /// Of a TTL map.
    Ttl(std::collections::btree_map::Iter<'a, UK, TtlValue<UV>>),
    /// No map.
    Empty,
}

impl<'a, UK, UV> Iterator for MapIter<'a, UK, UV> {
    type Item = (&'a UK, &'a UV);

    fn next(&mut self) -> Option<(&'a UK, &'a UV)> {
        match self {
            MapIter::Plain(i) => i.next(),
            MapIter::Ttl(i) => i.next().map(|(k, e)| (k, &e.value)),
            MapIter::Empty => None,
        }
    }
}

impl<'a, K: StateKey, B: KeyedStateBackend<K>> KeyedAccess<'a, K, B> {
    /// The states of `key`, whose key group is `key_group`, at the wall clock's time.
    pub fn new(backend: &'a mut B, key: &'a K, key_group: KeyGroup) -> Self {
        let now_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as i64);
        KeyedAccess {
            backend,
            key,
            key_group,
            now_ms,
        }
    }

    /// The same, with TTL decided at `now_ms` (ms since the Unix epoch): a controllable clock.
    pub fn at(mut self, now_ms: i64) -> Self {
        self.now_ms = now_ms;
        self
    }

    /// The key.
    pub fn key(&self) -> &K {
        self.key
    }

    fn cleanup<S: StateValue>(&mut self, raw: ValueState<S>, ttl: &StateTtlConfig) {
        if ttl.incremental_cleanup_size > 0 {
            self.backend
                .cleanup_expired(raw, ttl.incremental_cleanup_size, self.now_ms);
        }
    }

    /// Reads one TTL value: `None` if absent, or expired and not visible (then removed);
    /// renewed on read if so configured.
    fn ttl_read<V: StateValue>(
        &mut self,
        raw: ValueState<TtlValue<V>>,
        ttl: StateTtlConfig,
    ) -> bool {
        let (key, kg, now) = (self.key, self.key_group, self.now_ms);
        let Some(stored) = self.backend.value(raw, key, kg) else {
            return false;
        };
        if ttl.is_expired(stored.last_access_ms, now) {
            return match ttl.visibility {
                TtlVisibility::NeverReturnExpired => {
                    self.backend.clear(raw, key, kg);
                    false
                }
                TtlVisibility::ReturnExpiredIfNotCleanedUp => true,
            };
        }
        if ttl.update_type == TtlUpdateType::OnReadAndWrite {
            let e = self
                .backend
                .value_mut_or_insert(raw, key, kg, unreachable_ttl);
            e.last_access_ms = now;
        }
        true
    }

    /// A value state's value (or its descriptor's default).
    pub fn value<V: StateValue>(&mut self, state: ValueState<V>) -> Option<&V> {
        let Some(ttl) = state.ttl else {
            return self.backend.value(state, self.key, self.key_group);
        };
        let raw = state.stored::<TtlValue<V>>();
        self.cleanup(raw, &ttl);
        if !self.ttl_read(raw, ttl) {
            return None;
        }
        self.backend
            .value(raw, self.key, self.key_group)
            .map(|e| &e.value)
    }

    /// Like [`value`](Self::value), consuming the access so the value can outlive it.
    pub fn into_value<V: StateValue>(mut self, state: ValueState<V>) -> Option<&'a V> {
        let (key, kg) = (self.key, self.key_group);
        let Some(ttl) = state.ttl else {
            let backend: &'a mut B = self.backend;
            return backend.value(state, key, kg);
        };
        let raw = state.stored::<TtlValue<V>>();
        self.cleanup(raw, &ttl);
        if !self.ttl_read(raw, ttl) {
            return None;
        }
        let backend: &'a mut B = self.backend;
        backend.value(raw, key, kg).map(|e| &e.value)
    }

    /// Sets a value state's value.
    pub fn update<V: StateValue>(&mut self, state: ValueState<V>, value: V) {
        match state.ttl {
            None => self.backend.update(state, self.key, self.key_group, value),
            Some(ttl) => {
                let raw = state.stored::<TtlValue<V>>();
                self.backend.update(
                    raw,
                    self.key,
                    self.key_group,
                    TtlValue {
                        value,
                        last_access_ms: self.now_ms,
                    },
                );
                self.cleanup(raw, &ttl);
            }
        }
    }

    /// Clears a value state.
    pub fn clear<V: StateValue>(&mut self, state: ValueState<V>) {
        self.backend.clear(state, self.key, self.key_group)
    }

    /// Clears a list, map, reducing or aggregating state (through its handle's `raw`).
    pub fn clear_raw<V: StateValue>(&mut self, raw: ValueState<V>) {
        self.backend.clear(raw, self.key, self.key_group)
    }

    /// A list state's elements; none when there is no list.
    pub fn list<V: StateValue>(&mut self, state: ListState<V>) -> ListIter<'_, V> {
        let (key, kg, now) = (self.key, self.key_group, self.now_ms);
        let Some(ttl) = state.raw.ttl else {
            return ListIter::Plain(
                self.backend
                    .value(state.raw, key, kg)
                    .map_or(&[][..], Vec::as_slice)
                    .iter(),
            );
        };
        let raw = state.raw.stored::<Vec<TtlValue<V>>>();
        self.cleanup(raw, &ttl);
        let never = ttl.visibility == TtlVisibility::NeverReturnExpired;
        let renew = ttl.update_type == TtlUpdateType::OnReadAndWrite;
        let needs_write = self.backend.value(raw, key, kg).is_some_and(|l| {
            renew || (never && l.iter().any(|e| ttl.is_expired(e.last_access_ms, now)))
        });
        if needs_write {
            let list = self.backend.value_mut_or_insert(raw, key, kg, Vec::new);
            if never {
                list.retain(|e| !ttl.is_expired(e.last_access_ms, now));
            }
            if renew {
                list.iter_mut().for_each(|e| e.last_access_ms = now);
            }
            if list.is_empty() {
                self.backend.clear(raw, key, kg);
            }
        }
        ListIter::Ttl(
            self.backend
                .value(raw, key, kg)
                .map_or(&[][..], Vec::as_slice)
                .iter(),
        )
    }

    /// Appends to a list state's list.
    pub fn list_add<V: StateValue>(&mut self, state: ListState<V>, value: V) {
        self.list_add_all(state, std::iter::once(value))
    }

    /// Appends every value to a list state's list.
    pub fn list_add_all<V: StateValue>(
        &mut self,
        state: ListState<V>,
        values: impl IntoIterator<Item = V>,
    ) {
        let mut values = values.into_iter().peekable();
        if values.peek().is_none() {
            return;
        }
        let (key, kg, now) = (self.key, self.key_group, self.now_ms);
        match state.raw.ttl {
            None => self
                .backend
                .value_mut_or_insert(state.raw, key, kg, Vec::new)
                .extend(values),
            Some(ttl) => {
                let raw = state.raw.stored::<Vec<TtlValue<V>>>();
                self.backend
                    .value_mut_or_insert(raw, key, kg, Vec::new)
                    .extend(values.map(|value| TtlValue {
                        value,
                        last_access_ms: now,
                    }));
                self.cleanup(raw, &ttl);
            }
        }
    }

    /// Replaces a list state's list; an empty list clears it (as in Flink).
    pub fn list_update<V: StateValue>(&mut self, state: ListState<V>, values: Vec<V>) {
        if values.is_empty() {
            return self.backend.clear(state.raw, self.key, self.key_group);
        }
        match state.raw.ttl {
            None => self
                .backend
                .update(state.raw, self.key, self.key_group, values),
            Some(ttl) => {
                let raw = state.raw.stored::<Vec<TtlValue<V>>>();
                let now = self.now_ms;
                let wrapped = values
                    .into_iter()
                    .map(|value| TtlValue {
                        value,
                        last_access_ms: now,
                    })
                    .collect();
                self.backend.update(raw, self.key, self.key_group, wrapped);
                self.cleanup(raw, &ttl);
            }
        }
    }

    /// The value a map state maps `user_key` to.
    pub fn map_get<UK: MapKey, UV: StateValue>(
        &mut self,
        state: MapState<UK, UV>,
        user_key: &UK,
    ) -> Option<&UV> {
        let (key, kg, now) = (self.key, self.key_group, self.now_ms);
        let Some(ttl) = state.raw.ttl else {
            return self
                .backend
                .value(state.raw, key, kg)
                .and_then(|m| m.get(user_key));
        };
        let raw = state.raw.stored::<BTreeMap<UK, TtlValue<UV>>>();
        self.cleanup(raw, &ttl);
        let last = self
            .backend
            .value(raw, key, kg)
            .and_then(|m| m.get(user_key))
            .map(|e| e.last_access_ms)?;
        if ttl.is_expired(last, now) {
            match ttl.visibility {
                TtlVisibility::NeverReturnExpired => {
                    self.ttl_map_remove(raw, user_key);
                    return None;
                }
                TtlVisibility::ReturnExpiredIfNotCleanedUp => {}
            }
        } else if ttl.update_type == TtlUpdateType::OnReadAndWrite
            && let Some(e) = self
                .backend
                .value_mut_or_insert(raw, key, kg, BTreeMap::new)
                .get_mut(user_key)
        {
            e.last_access_ms = now;
        }
        self.backend
            .value(raw, key, kg)
            .and_then(|m| m.get(user_key))
            .map(|e| &e.value)
    }

    fn ttl_map_remove<UK: MapKey, UV: StateValue>(
        &mut self,
        raw: ValueState<BTreeMap<UK, TtlValue<UV>>>,
        user_key: &UK,
    ) -> Option<UV> {
        let (key, kg) = (self.key, self.key_group);
        let map = self
            .backend
            .value_mut_or_insert(raw, key, kg, BTreeMap::new);
        let removed = map.remove(user_key).map(|e| e.value);
        if map.is_empty() {
            self.backend.clear(raw, key, kg);
        }
        removed
    }

    /// Whether a map state has `user_key`.
    pub fn map_contains<UK: MapKey, UV: StateValue>(
        &mut self,
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
        let (key, kg, now) = (self.key, self.key_group, self.now_ms);
        match state.raw.ttl {
            None => {
                self.backend
                    .value_mut_or_insert(state.raw, key, kg, BTreeMap::new)
                    .insert(user_key, value);
            }
            Some(ttl) => {
                let raw = state.raw.stored::<BTreeMap<UK, TtlValue<UV>>>();
                self.backend
                    .value_mut_or_insert(raw, key, kg, BTreeMap::new)
                    .insert(
                        user_key,
                        TtlValue {
                            value,
                            last_access_ms: now,
                        },
                    );
                self.cleanup(raw, &ttl);
            }
        }
    }

    /// Removes `user_key` from a map state; the map goes when its last entry does.
    pub fn map_remove<UK: MapKey, UV: StateValue>(
        &mut self,
        state: MapState<UK, UV>,
        user_key: &UK,
    ) -> Option<UV> {
        let (key, kg) = (self.key, self.key_group);
        if state.raw.ttl.is_some() {
            let raw = state.raw.stored::<BTreeMap<UK, TtlValue<UV>>>();
            if !self
                .backend
                .value(raw, key, kg)
                .is_some_and(|m| m.contains_key(user_key))
            {
                return None;
            }
            return self.ttl_map_remove(raw, user_key);
        }
        if !self
            .backend
            .value(state.raw, key, kg)
            .is_some_and(|m| m.contains_key(user_key))
        {
            return None;
        }
        let map = self
            .backend
            .value_mut_or_insert(state.raw, key, kg, BTreeMap::new);
        let removed = map.remove(user_key);
        if map.is_empty() {
            self.backend.clear(state.raw, key, kg);
        }
        removed
    }

    /// A map state's entries, in key order.
    pub fn map_entries<UK: MapKey, UV: StateValue>(
        &mut self,
        state: MapState<UK, UV>,
    ) -> MapIter<'_, UK, UV> {
        let (key, kg, now) = (self.key, self.key_group, self.now_ms);
        let Some(ttl) = state.raw.ttl else {
            return match self.backend.value(state.raw, key, kg) {
                Some(m) => MapIter::Plain(m.iter()),
                None => MapIter::Empty,
            };
        };
        let raw = state.raw.stored::<BTreeMap<UK, TtlValue<UV>>>();
        self.cleanup(raw, &ttl);
        let never = ttl.visibility == TtlVisibility::NeverReturnExpired;
        let renew = ttl.update_type == TtlUpdateType::OnReadAndWrite;
        let needs_write = self.backend.value(raw, key, kg).is_some_and(|m| {
            renew || (never && m.values().any(|e| ttl.is_expired(e.last_access_ms, now)))
        });
        if needs_write {
            let map = self
                .backend
                .value_mut_or_insert(raw, key, kg, BTreeMap::new);
            if never {
                map.retain(|_, e| !ttl.is_expired(e.last_access_ms, now));
            }
            if renew {
                map.values_mut().for_each(|e| e.last_access_ms = now);
            }
            if map.is_empty() {
                self.backend.clear(raw, key, kg);
            }
        }
        match self.backend.value(raw, key, kg) {
            Some(m) => MapIter::Ttl(m.iter()),
            None => MapIter::Empty,
        }
    }

    /// Whether a map state has no entry.
    pub fn map_is_empty<UK: MapKey, UV: StateValue>(&mut self, state: MapState<UK, UV>) -> bool {
        self.map_entries(state).next().is_none()
    }

    /// A reducing state's value.
    pub fn reduced<V: StateValue>(&mut self, state: &ReducingState<V>) -> Option<&V> {
        self.value(state.raw)
    }

    /// Folds `value` into a reducing state.
    pub fn reduce<V: StateValue>(&mut self, state: &ReducingState<V>, value: V) {
        let current = self.value(state.raw).cloned();
        let new = match current {
            Some(current) => (state.reduce)(&current, &value),
            None => value,
        };
        self.update(state.raw, new);
    }

    /// Adds `value` to an aggregating state's accumulator.
    pub fn aggregate<IN: 'static, ACC: StateValue, OUT: 'static>(
        &mut self,
        state: &AggregatingState<IN, ACC, OUT>,
        value: IN,
    ) {
        let function = &state.function;
        if state.raw.ttl.is_none() {
            let acc = self
                .backend
                .value_mut_or_insert(state.raw, self.key, self.key_group, || {
                    function.create_accumulator()
                });
            return function.add(value, acc);
        }
        let mut acc = self
            .value(state.raw)
            .cloned()
            .unwrap_or_else(|| function.create_accumulator());
        function.add(value, &mut acc);
        self.update(state.raw, acc);
    }

    /// An aggregating state's result, if anything was added.
    pub fn aggregated<IN: 'static, ACC: StateValue, OUT: 'static>(
        &mut self,
        state: &AggregatingState<IN, ACC, OUT>,
    ) -> Option<OUT> {
        let function = state.function.clone();
        self.value(state.raw).map(|acc| function.get_result(acc))
    }
}

#[cold]
fn unreachable_ttl<V>() -> V {
    panic!("a TTL value read a moment ago is gone")
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

/// How a keyed snapshot relates to the snapshots before it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SnapshotScope {
    /// Self-contained and owned by one checkpoint or savepoint: a full snapshot taken by
    /// [`KeyedStateBackend::snapshot`].
    SelfContained,
    /// A link of an incremental chain, taken by [`KeyedStateBackend::snapshot_incremental`]:
    /// later checkpoints may reference it, so it is stored as shared state.
    Incremental {
        /// `None`: a full snapshot that starts a chain. `Some(b)`: a delta holding only what
        /// changed since checkpoint `b`; a restore applies it after every snapshot of `b`'s
        /// chain, in order.
        base: Option<u64>,
    },
}

/// The frozen view a snapshot's synchronous part returns. Writing it happens later, on another
/// thread, while processing goes on and changes the live state.
pub trait KeyedSnapshot: Send + 'static {
    /// Writes the snapshot in the [`crate::format`] and returns where each key group landed.
    fn write_to(
        self: Box<Self>,
        out: &mut dyn std::io::Write,
    ) -> Result<KeyedSnapshotLayout, StateError>;

    /// Whether this is a self-contained snapshot or a link of an incremental chain.
    fn scope(&self) -> SnapshotScope {
        SnapshotScope::SelfContained
    }

    /// For a native snapshot (the backend's own immutable files, Flink's native incremental
    /// checkpoints): waits until its files exist and lists them, and they stay on disk until
    /// the snapshot is dropped; [`write_to`](Self::write_to) then writes its manifest, which
    /// [`KeyedStateBackend::restore_native`] takes back with the files. `None` (the default):
    /// a snapshot in the canonical format. Called on the asynchronous part's thread.
    fn native_files(&mut self) -> Result<Option<NativeFiles>, StateError> {
        Ok(None)
    }
}

/// The files of a native snapshot: a backend's own immutable files (the disk backend's runs),
/// shipped as they are.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NativeFiles {
    /// The backend's file format (`weir-disk-runs/2`): a restore refuses one it does not know.
    pub format: String,
    /// The files, in the backend's order.
    pub files: Vec<NativeFile>,
}

/// One file of a [`NativeFiles`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NativeFile {
    /// Its name, unique and stable across the snapshots that share the file: a later snapshot
    /// that lists the same name lists the same bytes, so it is uploaded once.
    pub name: String,
    /// The key groups it answers for: a restore at another parallelism takes it where these
    /// overlap the new subtask's.
    pub key_groups: KeyGroupRange,
    /// Its length in bytes.
    pub size: u64,
    /// Where it is on local disk: the backend's file for a snapshot, where the runtime put it for
    /// a restore. Not part of a manifest.
    #[serde(skip)]
    pub path: std::path::PathBuf,
}

/// One earlier native snapshot handed to [`KeyedStateBackend::restore_native`]: the manifest it
/// wrote and its files on local disk (each file's `path` set).
#[derive(Clone, Copy, Debug)]
pub struct NativeRestorePart<'a> {
    /// What [`KeyedSnapshot::write_to`] wrote for it.
    pub manifest: &'a [u8],
    /// Its files, downloaded.
    pub files: &'a NativeFiles,
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
///   overlaps this backend's key groups; it keeps only the key groups in range. An incremental
///   chain comes as its snapshots in order: the full one, then each delta, which applies on
///   top (a delta for a key group not restored before it is an error naming the key group).
/// - Incremental checkpoints ([`snapshot_incremental`](Self::snapshot_incremental)), for a
///   backend that supports them: a snapshot is a delta on the chain of the latest checkpoint
///   confirmed by [`notify_checkpoint_complete`](Self::notify_checkpoint_complete), holding
///   every key changed (written or removed) since that checkpoint's snapshot, including the
///   changes of snapshots taken since but never confirmed (aborted, or still pending). With no
///   confirmed checkpoint, when the chain is at its length limit, or after
///   [`start_new_chain`](Self::start_new_chain), it is a full snapshot that starts a new chain.
///   Restoring a chain gives the same state as a full snapshot taken at the same moment.
/// - A restore refuses, with an error and never a panic: a snapshot of another max parallelism
///   or key type, corrupt bytes (naming the header or the key group), a key group handed over
///   twice (naming it), and any call after a state is registered.
/// - A restored state registered with another type is [`StateError::Incompatible`]. Restored
///   states not registered yet are carried unchanged into later snapshots, and count toward the
///   [`MAX_STATES`](crate::format::MAX_STATES) limit, beyond which registration is
///   [`StateError::TooManyStates`].
/// - Snapshots are written in the [`crate::format`], and equal state gives identical bytes.
///
/// [`conformance`](super::conformance) checks all of this: every implementation must pass its `run_all`.
pub trait KeyedStateBackend<K: StateKey>: Send + 'static {
    /// The key groups this backend owns.
    fn key_group_range(&self) -> KeyGroupRange;

    /// The max parallelism (number of key groups) keys are hashed with.
    fn max_parallelism(&self) -> u32;

    /// Registers (or finds) a state of `kind` called `name` whose per-key value is `V` (the
    /// list of a list state, the map of a map state, a [`TtlValue`] of a TTL state, ...), with
    /// its default and expiry check. The typed constructors below call it; a backend with
    /// native list or map support may override them.
    fn register_state<V: StateValue>(
        &mut self,
        name: &str,
        kind: StateKind,
        options: StateOptions<V>,
    ) -> Result<ValueState<V>, StateError>;

    /// Checks up to `budget` more stored values of `state` (a handle as registered, see
    /// [`register_state`](Self::register_state)) with its expiry check at `now_ms`, removing
    /// or trimming what expired: TTL's incremental cleanup. A state without an expiry check is
    /// left alone.
    fn cleanup_expired<V: StateValue>(&mut self, state: ValueState<V>, budget: usize, now_ms: i64);

    /// Registers (or finds) a value state.
    fn value_state<V: StateValue>(
        &mut self,
        descriptor: &ValueStateDescriptor<V>,
    ) -> Result<ValueState<V>, StateError> {
        let name = &descriptor.name;
        match descriptor.ttl {
            None => self.register_state(
                name,
                StateKind::Value,
                StateOptions {
                    default: descriptor.default.clone(),
                    ..StateOptions::default()
                },
            ),
            Some(ttl) => {
                let raw: ValueState<TtlValue<V>> = self.register_state(
                    name,
                    StateKind::Value,
                    ttl_options(&ttl, value_expiry(ttl)),
                )?;
                Ok(ValueState {
                    ttl: Some(ttl),
                    ..raw.stored()
                })
            }
        }
    }

    /// Registers (or finds) a list state.
    fn list_state<V: StateValue>(
        &mut self,
        descriptor: &ListStateDescriptor<V>,
    ) -> Result<ListState<V>, StateError> {
        let name = &descriptor.name;
        let raw = match descriptor.ttl {
            None => self.register_state(name, StateKind::List, StateOptions::default())?,
            Some(ttl) => {
                let raw: ValueState<Vec<TtlValue<V>>> = self.register_state(
                    name,
                    StateKind::List,
                    ttl_options(&ttl, list_expiry(ttl)),
                )?;
                ValueState {
                    ttl: Some(ttl),
                    ..raw.stored()
                }
            }
        };
        Ok(ListState { raw })
    }

    /// Registers (or finds) a map state.
    fn map_state<UK: MapKey, UV: StateValue>(
        &mut self,
        descriptor: &MapStateDescriptor<UK, UV>,
    ) -> Result<MapState<UK, UV>, StateError> {
        let name = &descriptor.name;
        let raw = match descriptor.ttl {
            None => self.register_state(name, StateKind::Map, StateOptions::default())?,
            Some(ttl) => {
                let raw: ValueState<BTreeMap<UK, TtlValue<UV>>> =
                    self.register_state(name, StateKind::Map, ttl_options(&ttl, map_expiry(ttl)))?;
                ValueState {
                    ttl: Some(ttl),
                    ..raw.stored()
                }
            }
        };
        Ok(MapState { raw })
    }

    /// Registers (or finds) a reducing state.
    fn reducing_state<V: StateValue>(
        &mut self,
        descriptor: &ReducingStateDescriptor<V>,
    ) -> Result<ReducingState<V>, StateError> {
        let raw =
            self.register_ttl_or_plain::<V>(&descriptor.name, StateKind::Reducing, descriptor.ttl)?;
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
        let raw = self.register_ttl_or_plain::<ACC>(
            &descriptor.name,
            StateKind::Aggregating,
            descriptor.ttl,
        )?;
        Ok(AggregatingState {
            raw,
            function: descriptor.function.clone(),
        })
    }

    /// Registers one value per key, wrapped in [`TtlValue`] when `ttl` is set.
    #[doc(hidden)]
    fn register_ttl_or_plain<V: StateValue>(
        &mut self,
        name: &str,
        kind: StateKind,
        ttl: Option<StateTtlConfig>,
    ) -> Result<ValueState<V>, StateError> {
        match ttl {
            None => self.register_state(name, kind, StateOptions::default()),
            Some(ttl) => {
                let raw: ValueState<TtlValue<V>> =
                    self.register_state(name, kind, ttl_options(&ttl, value_expiry(ttl)))?;
                Ok(ValueState {
                    ttl: Some(ttl),
                    ..raw.stored()
                })
            }
        }
    }

    /// The value for `key`: its own, else the state's default, else `None`. (`&mut self`: a
    /// backend that stores bytes decodes the value into a buffer of its own.)
    fn value<V: StateValue>(
        &mut self,
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

    /// Visits every entry of a value state (`state` as registered, see
    /// [`register_state`](Self::register_state)), in no particular order: how timers are found
    /// again after a restore.
    fn for_each_entry<V: StateValue>(&mut self, state: ValueState<V>, f: &mut dyn FnMut(&K, &V));

    /// The synchronous part of a snapshot: freezes the current state.
    fn snapshot(&mut self) -> Result<Box<dyn KeyedSnapshot>, StateError>;

    /// Loads state from snapshots, keeping the key groups in this backend's range.
    fn restore(&mut self, parts: &[RestorePart<'_>]) -> Result<(), StateError>;

    /// [`restore`](Self::restore) from snapshots whose sections are in local files (a canonical
    /// snapshot the runtime downloaded for a backend with a [local
    /// directory](crate::StateBackend::local_dir)), before any state is registered. A backend
    /// that keeps its state on disk reads the sections from the files as it needs them, so that
    /// the restore is not bounded by memory; the default reads each part whole and calls
    /// [`restore`](Self::restore).
    fn restore_file_parts(&mut self, parts: &[RestoreFilePart<'_>]) -> Result<(), StateError> {
        let mut read = Vec::with_capacity(parts.len());
        for part in parts {
            read.push(bytes::Bytes::from(crate::format::read_file_part(part)?));
        }
        let parts: Vec<RestorePart<'_>> = parts
            .iter()
            .zip(read)
            .map(|(part, sections)| RestorePart {
                handle: part.handle,
                header: part.header,
                sections,
                sections_offset: part.sections_offset,
            })
            .collect();
        self.restore(&parts)
    }

    /// The synchronous part of checkpoint `checkpoint_id`'s snapshot in incremental mode: a
    /// delta on the latest confirmed checkpoint's chain, or a full snapshot that starts a chain
    /// (see [`SnapshotScope`]). A backend without incremental snapshots (the default) takes a
    /// full, self-contained one.
    fn snapshot_incremental(
        &mut self,
        checkpoint_id: u64,
    ) -> Result<Box<dyn KeyedSnapshot>, StateError> {
        let _ = checkpoint_id;
        self.snapshot()
    }

    /// Loads native snapshots (see [`KeyedSnapshot::native_files`]) instead of
    /// [`restore`](Self::restore), before any state is registered, keeping the key groups in
    /// range. A backend without native snapshots (the default) refuses, naming itself.
    fn restore_native(&mut self, parts: &[NativeRestorePart<'_>]) -> Result<(), StateError> {
        let formats: Vec<&str> = parts.iter().map(|p| p.files.format.as_str()).collect();
        Err(StateError::Restore(format!(
            "this backend cannot restore native snapshots (format {formats:?}): restore from a \
             savepoint, whose format every backend reads, or with the backend that took them"
        )))
    }

    /// Checkpoint `checkpoint_id` completed: its snapshot becomes the base of later deltas.
    fn notify_checkpoint_complete(&mut self, checkpoint_id: u64) {
        let _ = checkpoint_id;
    }

    /// Checkpoint `checkpoint_id` was aborted: its snapshot never becomes a base, and what it
    /// held goes into the next delta.
    fn notify_checkpoint_aborted(&mut self, checkpoint_id: u64) {
        let _ = checkpoint_id;
    }

    /// The next incremental snapshot is full, whatever was confirmed: the files of the current
    /// chain may be gone (the job manager refused a delta built on a checkpoint it had already
    /// subsumed).
    fn start_new_chain(&mut self) {}
}

/// A processing-time clock in ms since the Unix epoch (TTL's time provider).
pub type TtlClock = Arc<dyn Fn() -> i64 + Send + Sync>;

/// Wall-clock time in ms since the Unix epoch: the default [`TtlClock`].
pub(crate) fn wall_clock_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}
