//! [`MemoryKeyedStore`], the in-memory [`KeyedStore`], and its frozen view.

use super::{EntryVisitor, FrozenStore, KeyedStore, StoreStateId};
use crate::StateError;
use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use weir_core::keygroup::KeyGroup;

/// One state's entries in one key group.
type Table = Arc<BTreeMap<Vec<u8>, Vec<u8>>>;

/// The in-memory [`KeyedStore`]: a `BTreeMap` per state and key group behind an `Arc`, frozen
/// by cloning the `Arc`s (copy on write, as the heap backend does).
#[derive(Default)]
pub struct MemoryKeyedStore {
    tables: BTreeMap<(StoreStateId, KeyGroup), Table>,
}

impl MemoryKeyedStore {
    /// An empty store.
    pub fn new() -> MemoryKeyedStore {
        MemoryKeyedStore::default()
    }

    /// Number of entries over every state and key group.
    pub fn len(&self) -> usize {
        self.tables.values().map(|t| t.len()).sum()
    }

    /// Whether the store holds no entry.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl fmt::Debug for MemoryKeyedStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryKeyedStore")
            .field("entries", &self.len())
            .finish()
    }
}

fn scan_table(table: Option<&Table>, visit: &mut EntryVisitor<'_>) -> Result<(), StateError> {
    for (k, v) in table.into_iter().flat_map(|t| t.iter()) {
        visit(k, v)?;
    }
    Ok(())
}

impl KeyedStore for MemoryKeyedStore {
    fn get(
        &mut self,
        state: StoreStateId,
        key_group: KeyGroup,
        key: &[u8],
        value: &mut Vec<u8>,
    ) -> Result<bool, StateError> {
        value.clear();
        match self
            .tables
            .get(&(state, key_group))
            .and_then(|t| t.get(key))
        {
            Some(v) => {
                value.extend_from_slice(v);
                Ok(true)
            }
            None => Ok(false),
        }
    }

    fn put(
        &mut self,
        state: StoreStateId,
        key_group: KeyGroup,
        key: &[u8],
        value: &[u8],
    ) -> Result<(), StateError> {
        let table = Arc::make_mut(self.tables.entry((state, key_group)).or_default());
        match table.get_mut(key) {
            Some(v) => {
                v.clear();
                v.extend_from_slice(value);
            }
            None => {
                table.insert(key.to_vec(), value.to_vec());
            }
        }
        Ok(())
    }

    fn delete(
        &mut self,
        state: StoreStateId,
        key_group: KeyGroup,
        key: &[u8],
    ) -> Result<(), StateError> {
        if let Some(table) = self.tables.get_mut(&(state, key_group))
            && table.contains_key(key)
        {
            Arc::make_mut(table).remove(key);
        }
        Ok(())
    }

    fn scan(
        &mut self,
        state: StoreStateId,
        key_group: KeyGroup,
        visit: &mut EntryVisitor<'_>,
    ) -> Result<(), StateError> {
        scan_table(self.tables.get(&(state, key_group)), visit)
    }

    fn freeze(&mut self) -> Result<Box<dyn FrozenStore>, StateError> {
        Ok(Box::new(FrozenMemory(self.tables.clone())))
    }
}

/// [`MemoryKeyedStore`]'s frozen view: the `Arc`s of its tables.
struct FrozenMemory(BTreeMap<(StoreStateId, KeyGroup), Table>);

impl FrozenStore for FrozenMemory {
    fn scan(
        &self,
        state: StoreStateId,
        key_group: KeyGroup,
        visit: &mut EntryVisitor<'_>,
    ) -> Result<(), StateError> {
        scan_table(self.0.get(&(state, key_group)), visit)
    }
}
