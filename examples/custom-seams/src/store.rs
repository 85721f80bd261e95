//! A user's keyed-state store: [`BTreeMapStore`] (sorted maps, copy-on-write freezes) and
//! [`BTreeMapStateBackend`], the `StateBackend` that gives each keyed operator subtask one,
//! counting every use in shared [`StoreCounters`].

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use weir_core::keygroup::KeyGroup;
use weir_state::store::{EntryVisitor, FrozenStore, KeyedStore, StoreStateId};
use weir_state::{KeyedBackendKind, KeyedBackendParameters, StateBackend, StateError};

/// One state's entries in one key group, shared with the frozen views taken of it.
type Table = Arc<BTreeMap<Vec<u8>, Vec<u8>>>;

/// Every table of a store, by state and key group.
type Tables = BTreeMap<(StoreStateId, KeyGroup), Table>;

/// What every store a [`BTreeMapStateBackend`] made has done, summed (all relaxed atomics: read
/// them once the job has ended, or as a lower bound while it runs).
#[derive(Debug, Default)]
pub struct StoreCounters {
    /// Stores created, one per keyed operator per subtask per attempt.
    pub created: AtomicU64,
    /// Of those, stores created for an attempt after a restart (`attempt > 0`).
    pub created_for_restarts: AtomicU64,
    /// Of those, stores created for a subtask that restores state (`parameters.restored`: a
    /// restart from a checkpoint, or a run started from one).
    pub created_restoring: AtomicU64,
    /// `get` calls.
    pub gets: AtomicU64,
    /// `put` calls.
    pub puts: AtomicU64,
    /// `put` calls on stores created for an attempt after a restart.
    pub puts_in_restarts: AtomicU64,
    /// `put` calls a store received before any `get`, `scan`, `delete` or `freeze`: the bulk
    /// load of restored entries, which `StoreKeyedStateBackend` puts into the store when a
    /// state is registered after a restore, before any record reaches the operator. (Exact for
    /// operators that read a key before writing it, as `sum` does; `created_restoring` says
    /// which stores were created to be restored.)
    pub load_puts: AtomicU64,
    /// `delete` calls.
    pub deletes: AtomicU64,
    /// `scan` calls on live stores.
    pub scans: AtomicU64,
    /// `freeze` calls: the synchronous part of a snapshot.
    pub freezes: AtomicU64,
    /// `scan` calls on frozen views: a snapshot written out.
    pub frozen_scans: AtomicU64,
}

/// A plain copy of [`StoreCounters`] at one moment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StoreCounts {
    /// See [`StoreCounters::created`].
    pub created: u64,
    /// See [`StoreCounters::created_for_restarts`].
    pub created_for_restarts: u64,
    /// See [`StoreCounters::created_restoring`].
    pub created_restoring: u64,
    /// See [`StoreCounters::gets`].
    pub gets: u64,
    /// See [`StoreCounters::puts`].
    pub puts: u64,
    /// See [`StoreCounters::puts_in_restarts`].
    pub puts_in_restarts: u64,
    /// See [`StoreCounters::load_puts`].
    pub load_puts: u64,
    /// See [`StoreCounters::deletes`].
    pub deletes: u64,
    /// See [`StoreCounters::scans`].
    pub scans: u64,
    /// See [`StoreCounters::freezes`].
    pub freezes: u64,
    /// See [`StoreCounters::frozen_scans`].
    pub frozen_scans: u64,
}

impl StoreCounters {
    /// The counts now.
    pub fn get(&self) -> StoreCounts {
        let load = |c: &AtomicU64| c.load(Ordering::SeqCst);
        StoreCounts {
            created: load(&self.created),
            created_for_restarts: load(&self.created_for_restarts),
            created_restoring: load(&self.created_restoring),
            gets: load(&self.gets),
            puts: load(&self.puts),
            puts_in_restarts: load(&self.puts_in_restarts),
            load_puts: load(&self.load_puts),
            deletes: load(&self.deletes),
            scans: load(&self.scans),
            freezes: load(&self.freezes),
            frozen_scans: load(&self.frozen_scans),
        }
    }
}

impl fmt::Display for StoreCounts {
    /// `store_created=… store_created_for_restarts=… …`, as the job's summary line prints it.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "store_created={} store_created_for_restarts={} store_created_restoring={} \
             store_gets={} store_puts={} \
             store_puts_in_restarts={} store_load_puts={} store_deletes={} store_scans={} \
             store_freezes={} store_frozen_scans={}",
            self.created,
            self.created_for_restarts,
            self.created_restoring,
            self.gets,
            self.puts,
            self.puts_in_restarts,
            self.load_puts,
            self.deletes,
            self.scans,
            self.freezes,
            self.frozen_scans
        )
    }
}

fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

/// A [`KeyedStore`] over one `BTreeMap` per state and key group. Each map sits behind an `Arc`:
/// [`freeze`](KeyedStore::freeze) clones the `Arc`s (no entry is copied), and a later write to
/// a map a frozen view still shares copies that one map first (`Arc::make_mut`).
pub struct BTreeMapStore {
    tables: Tables,
    counters: Arc<StoreCounters>,
    /// Made for an attempt after a restart.
    restarted: bool,
    /// Whether a `get`, `scan`, `delete` or `freeze` came yet (see [`StoreCounters::load_puts`]).
    read: bool,
}

impl Default for BTreeMapStore {
    fn default() -> Self {
        BTreeMapStore::new()
    }
}

impl fmt::Debug for BTreeMapStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BTreeMapStore")
            .field("tables", &self.tables.len())
            .field("entries", &self.len())
            .finish()
    }
}

impl BTreeMapStore {
    /// An empty store counting into counters of its own.
    pub fn new() -> BTreeMapStore {
        BTreeMapStore::counting(Arc::default(), false)
    }

    /// An empty store counting into `counters`; `restarted` for an attempt after a restart.
    pub fn counting(counters: Arc<StoreCounters>, restarted: bool) -> BTreeMapStore {
        BTreeMapStore {
            tables: Tables::new(),
            counters,
            restarted,
            read: false,
        }
    }

    /// Entries over every state and key group.
    pub fn len(&self) -> usize {
        self.tables.values().map(|t| t.len()).sum()
    }

    /// Whether the store holds no entry.
    pub fn is_empty(&self) -> bool {
        self.tables.values().all(|t| t.is_empty())
    }

    /// What this store counts into.
    pub fn counters(&self) -> &Arc<StoreCounters> {
        &self.counters
    }

    fn mark_read(&mut self) {
        self.read = true;
    }
}

/// Visits a table's entries in key order (none for a table never written).
fn scan_table(table: Option<&Table>, visit: &mut EntryVisitor<'_>) -> Result<(), StateError> {
    for (key, value) in table.into_iter().flat_map(|t| t.iter()) {
        visit(key, value)?;
    }
    Ok(())
}

impl KeyedStore for BTreeMapStore {
    fn get(
        &mut self,
        state: StoreStateId,
        key_group: KeyGroup,
        key: &[u8],
        value: &mut Vec<u8>,
    ) -> Result<bool, StateError> {
        bump(&self.counters.gets);
        self.mark_read();
        value.clear();
        match self
            .tables
            .get(&(state, key_group))
            .and_then(|t| t.get(key))
        {
            Some(found) => {
                value.extend_from_slice(found);
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
        bump(&self.counters.puts);
        if self.restarted {
            bump(&self.counters.puts_in_restarts);
        }
        if !self.read {
            bump(&self.counters.load_puts);
        }
        // Copies this one map if a frozen view still shares it; otherwise writes in place.
        let table = Arc::make_mut(self.tables.entry((state, key_group)).or_default());
        match table.get_mut(key) {
            Some(old) => {
                old.clear();
                old.extend_from_slice(value);
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
        bump(&self.counters.deletes);
        self.mark_read();
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
        bump(&self.counters.scans);
        self.mark_read();
        scan_table(self.tables.get(&(state, key_group)), visit)
    }

    fn freeze(&mut self) -> Result<Box<dyn FrozenStore>, StateError> {
        bump(&self.counters.freezes);
        self.mark_read();
        // O(tables) `Arc` clones; no entry is copied.
        Ok(Box::new(FrozenBTreeMaps {
            tables: self.tables.clone(),
            counters: self.counters.clone(),
        }))
    }
}

/// A [`BTreeMapStore`]'s content at a freeze: the `Arc`s of its maps at that moment.
struct FrozenBTreeMaps {
    tables: Tables,
    counters: Arc<StoreCounters>,
}

impl FrozenStore for FrozenBTreeMaps {
    fn scan(
        &self,
        state: StoreStateId,
        key_group: KeyGroup,
        visit: &mut EntryVisitor<'_>,
    ) -> Result<(), StateError> {
        bump(&self.counters.frozen_scans);
        scan_table(self.tables.get(&(state, key_group)), visit)
    }
}

/// The [`StateBackend`] of a job whose keyed state lives in [`BTreeMapStore`]s: one per keyed
/// operator per subtask (per attempt), all counting into the same [`StoreCounters`].
///
/// Set it with `env.set_state_backend(backend.clone())` on an `Arc<BTreeMapStateBackend>` (an
/// `Arc` of a backend is a backend) to keep a handle on its counters.
#[derive(Debug, Default)]
pub struct BTreeMapStateBackend {
    counters: Arc<StoreCounters>,
}

impl BTreeMapStateBackend {
    /// The name it reports (compared across the processes of a cluster).
    pub const NAME: &'static str = "btreemap";

    /// A backend with fresh counters.
    pub fn new() -> Arc<BTreeMapStateBackend> {
        Arc::new(BTreeMapStateBackend::default())
    }

    /// What every store it created has done.
    pub fn counters(&self) -> &Arc<StoreCounters> {
        &self.counters
    }
}

impl StateBackend for BTreeMapStateBackend {
    fn name(&self) -> String {
        Self::NAME.to_string()
    }

    fn create_keyed_backend(
        &self,
        parameters: &KeyedBackendParameters,
    ) -> Result<KeyedBackendKind, StateError> {
        bump(&self.counters.created);
        let restarted = parameters.attempt > 0;
        if restarted {
            bump(&self.counters.created_for_restarts);
        }
        if parameters.restored {
            bump(&self.counters.created_restoring);
        }
        Ok(KeyedBackendKind::Store(Box::new(BTreeMapStore::counting(
            self.counters.clone(),
            restarted,
        ))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entries(frozen: &dyn FrozenStore, state: StoreStateId, kg: KeyGroup) -> Vec<(u8, u8)> {
        let mut out = Vec::new();
        frozen
            .scan(state, kg, &mut |k, v| {
                out.push((k[0], v[0]));
                Ok(())
            })
            .expect("a frozen scan");
        out
    }

    #[test]
    fn a_frozen_view_keeps_its_moment_and_shares_untouched_maps() {
        let mut store = BTreeMapStore::new();
        for kg in 0..3 {
            store.put(0, kg, &[2], &[20]).expect("put");
            store.put(0, kg, &[1], &[10]).expect("put");
        }
        let frozen = store.freeze().expect("freeze");
        store.put(0, 0, &[1], &[11]).expect("put");
        store.put(0, 0, &[3], &[30]).expect("put");
        store.delete(0, 1, &[2]).expect("delete");
        for kg in 0..3 {
            assert_eq!(entries(frozen.as_ref(), 0, kg), [(1, 10), (2, 20)], "{kg}");
        }
        // Written after the freeze: copied once; untouched: still the map the view holds.
        assert_eq!(Arc::strong_count(&store.tables[&(0, 0)]), 1);
        assert_eq!(Arc::strong_count(&store.tables[&(0, 1)]), 1);
        assert_eq!(Arc::strong_count(&store.tables[&(0, 2)]), 2);
        let counts = store.counters().get();
        assert_eq!((counts.puts, counts.load_puts, counts.freezes), (8, 6, 1));
        assert_eq!((counts.deletes, counts.frozen_scans), (1, 3));
    }
}
