//! Operator (non-keyed) list state, Flink's operator state: named lists redistributed by mode
//! when the parallelism changes. Sources keep their offsets here.
//!
//! A state is a list of postcard-encoded elements with an [`OperatorStateMode`]:
//! - [`SplitDistribute`](OperatorStateMode::SplitDistribute): on rescale, the elements of all old
//!   subtasks are concatenated and split into contiguous, even chunks (Flink's
//!   `RoundRobinOperatorStateRepartitioner`: the first `total % n` chunks get one element more,
//!   and the subtask that gets the first chunk rotates from one state to the next);
//! - [`Union`](OperatorStateMode::Union): every new subtask gets the elements of all old ones;
//! - [`Broadcast`](OperatorStateMode::Broadcast): every subtask holds the same list; each new
//!   subtask gets one old copy.
//!
//! # Blob format (version 1)
//!
//! ```text
//! blob    := envelope(magic "WOPS", version 1, payload)                (weir_core::codec::seal)
//! payload := postcard(states: [State])            -- sorted by name, names unique
//! State   := name string | mode OperatorStateMode | value_type string | elements: [bytes]
//! ```
//!
//! Each element is the postcard encoding of one `T`; `value_type` is `std::any::type_name::<T>()`,
//! checked when the state is registered again.

use crate::StateError;
use crate::keyed::StateValue;
use serde::{Deserialize, Serialize};
use std::any::type_name;
use std::collections::BTreeMap;
use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;
use weir_core::CoreError;
use weir_core::codec;
use weir_core::handle::OperatorStateMode;

/// The blob's magic bytes.
pub const MAGIC: [u8; 4] = *b"WOPS";
/// The blob format version this build writes.
pub const FORMAT_VERSION: u16 = 1;
/// The blob format versions this build reads.
pub const READABLE_VERSIONS: &[u16] = &[1];

const BLOB_WHAT: &str = "operator state snapshot";

/// A handle to a registered operator list state. Cheap to copy; valid only with the backend that
/// made it.
pub struct ListState<T> {
    id: u32,
    _value: PhantomData<fn() -> T>,
}

impl<T> ListState<T> {
    /// The state's index in its backend.
    pub fn id(&self) -> u32 {
        self.id
    }
}

impl<T> Clone for ListState<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for ListState<T> {}

impl<T> fmt::Debug for ListState<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ListState")
            .field("id", &self.id)
            .field("type", &type_name::<T>())
            .finish()
    }
}

/// One state: its redistribution mode, element type and encoded elements.
#[derive(Clone, Debug)]
struct OpState {
    name: String,
    mode: OperatorStateMode,
    value_type: String,
    /// Shared with snapshots; written through `Arc::make_mut`.
    elements: Arc<Vec<Vec<u8>>>,
}

impl OpState {
    fn as_ref(&self) -> StateRef<'_> {
        StateRef {
            name: &self.name,
            mode: self.mode,
            value_type: &self.value_type,
            elements: &self.elements,
        }
    }
}

/// The operator state of one operator in one subtask.
#[derive(Debug, Default)]
pub struct OperatorStateBackend {
    /// By handle id.
    states: Vec<OpState>,
    /// Name to handle id; ordered, so snapshots list states by name.
    by_name: BTreeMap<String, u32>,
}

#[derive(Serialize)]
struct StateRef<'a> {
    name: &'a str,
    mode: OperatorStateMode,
    value_type: &'a str,
    elements: &'a [Vec<u8>],
}

#[derive(Deserialize)]
struct StateWire {
    name: String,
    mode: OperatorStateMode,
    value_type: String,
    elements: Vec<Vec<u8>>,
}

fn incompatible(name: &str, reason: String) -> StateError {
    StateError::Incompatible {
        name: name.to_string(),
        reason,
    }
}

fn seal_states(states: &[StateRef<'_>]) -> Result<Vec<u8>, StateError> {
    let payload = codec::encode(BLOB_WHAT, states)?;
    Ok(codec::seal(MAGIC, FORMAT_VERSION, &payload))
}

/// Opens and checks a blob; its states, sorted by name, names unique.
fn open_blob(blob: &[u8]) -> Result<Vec<StateWire>, StateError> {
    let (_version, payload) = codec::open(BLOB_WHAT, MAGIC, READABLE_VERSIONS, blob)?;
    let states: Vec<StateWire> = codec::decode(BLOB_WHAT, payload)?;
    for pair in states.windows(2) {
        if pair[0].name >= pair[1].name {
            return Err(StateError::Core(CoreError::Corrupt {
                what: BLOB_WHAT.to_string(),
                reason: format!(
                    "states '{}' and '{}' are duplicated or out of order",
                    pair[0].name, pair[1].name
                ),
            }));
        }
    }
    Ok(states)
}

impl OperatorStateBackend {
    /// An empty backend.
    pub fn new() -> Self {
        OperatorStateBackend::default()
    }

    /// Registers (or finds) the list state `name` of elements `T`. Another mode or element type
    /// than the one registered or restored is [`StateError::Incompatible`].
    pub fn list_state<T: StateValue>(
        &mut self,
        name: &str,
        mode: OperatorStateMode,
    ) -> Result<ListState<T>, StateError> {
        let value_type = type_name::<T>();
        if let Some(&id) = self.by_name.get(name) {
            let state = self.state(id, name)?;
            if state.mode != mode {
                return Err(incompatible(
                    name,
                    format!(
                        "it has mode {:?}, and is now asked for with mode {mode:?}",
                        state.mode
                    ),
                ));
            }
            if state.value_type != value_type {
                return Err(incompatible(
                    name,
                    format!(
                        "it holds elements of type `{}`, and is now asked for with `{value_type}`",
                        state.value_type
                    ),
                ));
            }
            return Ok(ListState {
                id,
                _value: PhantomData,
            });
        }
        let id = self.push(name.to_string(), mode, value_type.to_string(), Vec::new())?;
        Ok(ListState {
            id,
            _value: PhantomData,
        })
    }

    fn push(
        &mut self,
        name: String,
        mode: OperatorStateMode,
        value_type: String,
        elements: Vec<Vec<u8>>,
    ) -> Result<u32, StateError> {
        let id = u32::try_from(self.states.len()).map_err(|_| StateError::TooManyStates {
            name: name.clone(),
            count: self.states.len() + 1,
            max: u32::MAX as usize,
        })?;
        self.by_name.insert(name.clone(), id);
        self.states.push(OpState {
            name,
            mode,
            value_type,
            elements: Arc::new(elements),
        });
        Ok(id)
    }

    fn state(&self, id: u32, name: &str) -> Result<&OpState, StateError> {
        self.states
            .get(id as usize)
            .ok_or_else(|| StateError::Restore(format!("operator state '{name}' lost its id {id}")))
    }

    /// The state a handle names, checked against the handle's element type.
    fn checked<T: StateValue>(&self, state: &ListState<T>) -> Result<&OpState, StateError> {
        match self.states.get(state.id as usize) {
            Some(s) if s.value_type == type_name::<T>() => Ok(s),
            Some(s) => Err(incompatible(
                &s.name,
                format!(
                    "it holds elements of type `{}`, and the handle is for `{}`",
                    s.value_type,
                    type_name::<T>()
                ),
            )),
            None => Err(StateError::Restore(format!(
                "list state handle {} of `{}` was not made by this backend",
                state.id,
                type_name::<T>()
            ))),
        }
    }

    fn checked_mut<T: StateValue>(
        &mut self,
        state: &ListState<T>,
    ) -> Result<&mut OpState, StateError> {
        self.checked(state)?;
        self.states
            .get_mut(state.id as usize)
            .ok_or_else(|| StateError::Restore(format!("list state handle {} is gone", state.id)))
    }

    /// The elements of a list state, in order.
    pub fn get<T: StateValue>(&self, state: &ListState<T>) -> Result<Vec<T>, StateError> {
        let s = self.checked(state)?;
        s.elements
            .iter()
            .enumerate()
            .map(|(i, bytes)| {
                codec::decode(&format!("operator state '{}' element {i}", s.name), bytes)
                    .map_err(StateError::from)
            })
            .collect()
    }

    /// Replaces the elements of a list state.
    pub fn update<T: StateValue>(
        &mut self,
        state: &ListState<T>,
        values: &[T],
    ) -> Result<(), StateError> {
        let s = self.checked_mut(state)?;
        let encoded = values
            .iter()
            .map(|v| codec::encode(&format!("operator state '{}' element", s.name), v))
            .collect::<Result<Vec<_>, _>>()?;
        s.elements = Arc::new(encoded);
        Ok(())
    }

    /// Appends one element to a list state.
    pub fn add<T: StateValue>(
        &mut self,
        state: &ListState<T>,
        value: &T,
    ) -> Result<(), StateError> {
        let s = self.checked_mut(state)?;
        let encoded = codec::encode(&format!("operator state '{}' element", s.name), value)?;
        Arc::make_mut(&mut s.elements).push(encoded);
        Ok(())
    }

    /// Whether no state holds any element.
    pub fn is_empty(&self) -> bool {
        self.states.iter().all(|s| s.elements.is_empty())
    }

    /// The synchronous part of a snapshot: a frozen copy that shares the element lists (no element
    /// is copied; later writes copy the list they change).
    pub fn snapshot(&self) -> OperatorSnapshot {
        OperatorSnapshot {
            states: self
                .by_name
                .values()
                .filter_map(|&id| self.states.get(id as usize))
                .cloned()
                .collect(),
        }
    }

    /// Loads snapshots (blobs written by [`OperatorSnapshot::write_to`] or made by
    /// [`redistribute`]), merging their lists: split-distribute and union lists are
    /// concatenated in the order of `blobs`; of broadcast lists, the first non-empty copy is kept.
    /// A state already registered or restored with another mode or type is
    /// [`StateError::Incompatible`]. On error the backend is unchanged.
    pub fn restore(&mut self, blobs: &[&[u8]]) -> Result<(), StateError> {
        let opened = blobs
            .iter()
            .map(|b| open_blob(b))
            .collect::<Result<Vec<_>, _>>()?;
        let saved_states = self.states.clone();
        let saved_names = self.by_name.clone();
        let result = self.merge(opened);
        if result.is_err() {
            self.states = saved_states;
            self.by_name = saved_names;
        }
        result
    }

    fn merge(&mut self, opened: Vec<Vec<StateWire>>) -> Result<(), StateError> {
        for wire in opened.into_iter().flatten() {
            let Some(&id) = self.by_name.get(&wire.name) else {
                self.push(wire.name, wire.mode, wire.value_type, wire.elements)?;
                continue;
            };
            let Some(state) = self.states.get_mut(id as usize) else {
                return Err(StateError::Restore(format!(
                    "operator state '{}' lost its id {id}",
                    wire.name
                )));
            };
            if state.mode != wire.mode || state.value_type != wire.value_type {
                return Err(incompatible(
                    &wire.name,
                    format!(
                        "it is {:?} of `{}` here, and {:?} of `{}` in the snapshot",
                        state.mode, state.value_type, wire.mode, wire.value_type
                    ),
                ));
            }
            match wire.mode {
                OperatorStateMode::Broadcast => {
                    if state.elements.is_empty() {
                        state.elements = Arc::new(wire.elements);
                    }
                }
                OperatorStateMode::SplitDistribute | OperatorStateMode::Union => {
                    Arc::make_mut(&mut state.elements).extend(wire.elements);
                }
            }
        }
        Ok(())
    }
}

/// A frozen copy of an operator state backend, written later by [`write_to`](Self::write_to).
#[derive(Clone, Debug)]
pub struct OperatorSnapshot {
    /// Sorted by name.
    states: Vec<OpState>,
}

impl OperatorSnapshot {
    /// Each state's name and mode, for the [`weir_core::handle::OperatorStateHandle`].
    pub fn states(&self) -> Vec<(String, OperatorStateMode)> {
        self.states
            .iter()
            .map(|s| (s.name.clone(), s.mode))
            .collect()
    }

    /// Whether no state holds any element.
    pub fn is_empty(&self) -> bool {
        self.states.iter().all(|s| s.elements.is_empty())
    }

    /// Writes the blob and returns its length.
    pub fn write_to(self, out: &mut dyn std::io::Write) -> Result<u64, StateError> {
        let refs: Vec<StateRef<'_>> = self.states.iter().map(OpState::as_ref).collect();
        let blob = seal_states(&refs)?;
        out.write_all(&blob)?;
        Ok(blob.len() as u64)
    }
}

/// One state gathered from all old subtasks.
struct Gathered {
    mode: OperatorStateMode,
    value_type: String,
    /// By old subtask; `None` where that subtask did not have the state.
    per_old: Vec<Option<Vec<Vec<u8>>>>,
}

/// Redistributes operator state for a new parallelism: `old[i]` is old subtask `i`'s blob, and
/// the result holds one blob per new subtask.
///
/// - `SplitDistribute` concatenates the elements of all old subtasks (in subtask order) and
///   splits them into `new_parallelism` contiguous chunks of `total / n` elements, the first
///   `total % n` chunks one more. As in Flink's `RoundRobinOperatorStateRepartitioner`, the
///   chunks go to subtasks `start, start + 1, ...` (mod n), and `start` moves, from one state to
///   the next (in name order), to the first subtask that got no extra element. When the
///   parallelism does not change, each subtask keeps its own elements.
/// - `Union` gives every new subtask all elements, in old subtask order.
/// - `Broadcast` gives new subtask `i` the copy of old subtask `i % old.len()` (or the first old
///   copy, if that subtask did not have the state).
///
/// A state whose mode or element type differs between old subtasks is
/// [`StateError::Incompatible`].
pub fn redistribute(old: &[&[u8]], new_parallelism: u32) -> Result<Vec<Vec<u8>>, StateError> {
    if new_parallelism == 0 {
        return Err(StateError::Restore(
            "cannot redistribute operator state to parallelism 0".to_string(),
        ));
    }
    let new_p = new_parallelism as usize;
    let old_p = old.len();
    let mut gathered: BTreeMap<String, Gathered> = BTreeMap::new();
    for (i, blob) in old.iter().enumerate() {
        for wire in open_blob(blob)? {
            let g = gathered
                .entry(wire.name.clone())
                .or_insert_with(|| Gathered {
                    mode: wire.mode,
                    value_type: wire.value_type.clone(),
                    per_old: vec![None; old_p],
                });
            if g.mode != wire.mode || g.value_type != wire.value_type {
                return Err(incompatible(
                    &wire.name,
                    format!(
                        "old subtasks disagree: {:?} of `{}`, and {:?} of `{}` in subtask {i}",
                        g.mode, g.value_type, wire.mode, wire.value_type
                    ),
                ));
            }
            if let Some(slot) = g.per_old.get_mut(i) {
                *slot = Some(wire.elements);
            }
        }
    }

    // new_states[j] is new subtask j's states, in name order.
    let mut new_states: Vec<Vec<OpState>> = (0..new_p).map(|_| Vec::new()).collect();
    let mut start = 0usize;
    for (name, g) in gathered {
        let mut lists: Vec<Vec<Vec<u8>>> = vec![Vec::new(); new_p];
        match g.mode {
            OperatorStateMode::SplitDistribute if old_p == new_p => {
                for (list, old) in lists.iter_mut().zip(g.per_old) {
                    *list = old.unwrap_or_default();
                }
            }
            OperatorStateMode::SplitDistribute => {
                let all: Vec<Vec<u8>> = g.per_old.into_iter().flatten().flatten().collect();
                let base = all.len() / new_p;
                let mut remainder = all.len() % new_p;
                let mut next_start = start;
                let mut elements = all.into_iter();
                for i in 0..new_p {
                    let subtask = (i + start) % new_p;
                    let mut take = base;
                    if remainder > 0 {
                        take += 1;
                        remainder -= 1;
                        if remainder == 0 {
                            next_start = (subtask + 1) % new_p;
                        }
                    }
                    if let Some(list) = lists.get_mut(subtask) {
                        list.extend(elements.by_ref().take(take));
                    }
                }
                start = next_start;
            }
            OperatorStateMode::Union => {
                let all: Vec<Vec<u8>> = g.per_old.into_iter().flatten().flatten().collect();
                for list in &mut lists {
                    list.clone_from(&all);
                }
            }
            OperatorStateMode::Broadcast => {
                let first = g
                    .per_old
                    .iter()
                    .flatten()
                    .next()
                    .cloned()
                    .unwrap_or_default();
                for (j, list) in lists.iter_mut().enumerate() {
                    *list = match old_p {
                        0 => Vec::new(),
                        _ => g
                            .per_old
                            .get(j % old_p)
                            .cloned()
                            .flatten()
                            .unwrap_or_else(|| first.clone()),
                    };
                }
            }
        }
        for (subtask, list) in new_states.iter_mut().zip(lists) {
            subtask.push(OpState {
                name: name.clone(),
                mode: g.mode,
                value_type: g.value_type.clone(),
                elements: Arc::new(list),
            });
        }
    }

    new_states
        .iter()
        .map(|states| {
            let refs: Vec<StateRef<'_>> = states.iter().map(OpState::as_ref).collect();
            seal_states(&refs)
        })
        .collect()
}
