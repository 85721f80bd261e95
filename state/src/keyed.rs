//! The keyed-state seam: [`KeyedStateBackend`], descriptors, and typed state handles.
//!
//! A backend owns the keyed state of one operator in one subtask: the key groups of its
//! [`KeyGroupRange`]. Operators reach state through small `Copy` handles ([`ValueState`]) and pass
//! the current key with its key group, computed once per record by the caller.

use crate::StateError;
use serde::{Serialize, de::DeserializeOwned};
use std::hash::Hash;
use std::marker::PhantomData;
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

/// Describes a value state: its name (unique within the operator) and value type.
#[derive(Debug)]
pub struct ValueStateDescriptor<V> {
    /// The state's name.
    pub name: String,
    _value: PhantomData<fn() -> V>,
}

impl<V: StateValue> ValueStateDescriptor<V> {
    /// A descriptor for a value state called `name`.
    pub fn new(name: impl Into<String>) -> Self {
        ValueStateDescriptor {
            name: name.into(),
            _value: PhantomData,
        }
    }

    /// The value type's name, recorded in snapshots to detect incompatible restores.
    pub fn type_name(&self) -> &'static str {
        std::any::type_name::<V>()
    }
}

/// A handle to a registered value state. Cheap to copy; valid only with the backend that made it.
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

    /// Registers (or finds) a value state.
    fn value_state<V: StateValue>(
        &mut self,
        descriptor: &ValueStateDescriptor<V>,
    ) -> Result<ValueState<V>, StateError>;

    /// The value for `key`, if any.
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
