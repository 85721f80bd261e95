//! The heap backend's typed tables: a state's copy-on-write maps per key group, their changed
//! keys for incremental snapshots, and the frozen views a snapshot writes.

use crate::StateError;
use crate::cow_group::CowGroup;
use crate::format::{EntryEncoder, SectionWriter};
use crate::keyed::{Expiry, ExpiryFn, StateKey, StateValue};
use crate::restored::{Group, PendingState};
use hashbrown::hash_map::EntryRef;
use rustc_hash::FxBuildHasher;
use std::any::Any;
use std::sync::Arc;

/// The keys of one state written or removed in one key group since a snapshot took the set
/// (incremental checkpoints).
type Changed<K> = hashbrown::HashSet<K, FxBuildHasher>;

/// The changed keys one incremental snapshot took, per key group.
type ChangeSet<K> = Arc<Vec<Changed<K>>>;

/// A value state's table: one copy-on-write map per key group, indexed by `kg - range.start`.
pub(super) struct ValueTable<K, V> {
    pub(super) groups: Vec<CowGroup<Group<K, V>>>,
    /// What a key without a value reads as.
    pub(super) default: Option<V>,
    /// The expiry check of a TTL state.
    pub(super) expiry: Option<ExpiryFn<V>>,
    /// Whether snapshots leave expired values out.
    pub(super) cleanup_full_snapshot: bool,
    /// Incremental cleanup: the next key group to check, and the entries owed so far.
    pub(super) cleanup_cursor: usize,
    pub(super) cleanup_budget: usize,
    /// Incremental checkpoints: the keys written or removed per key group since the last
    /// incremental snapshot took them; `None` when changes are not tracked.
    pub(super) changed: Option<Vec<Changed<K>>>,
    /// The changed keys of each incremental snapshot taken since the confirmed base, oldest
    /// first, by checkpoint id.
    pub(super) history: Vec<(u64, ChangeSet<K>)>,
}

impl<K: StateKey, V: StateValue> ValueTable<K, V> {
    pub(super) fn empty(groups: usize) -> Self {
        ValueTable {
            groups: (0..groups)
                .map(|_| CowGroup::new(Group::default()))
                .collect(),
            default: None,
            expiry: None,
            cleanup_full_snapshot: false,
            cleanup_cursor: 0,
            cleanup_budget: 0,
            changed: None,
            history: Vec::new(),
        }
    }

    /// Records that `key` in the key group at `index` was written or removed.
    #[inline]
    fn touch(&mut self, index: usize, key: &K) {
        if let Some(set) = self.changed.as_mut().and_then(|c| c.get_mut(index)) {
            set.get_or_insert_with(key, K::clone);
        }
    }

    /// The value of `key` in the key group at `index`, inserted with `init` if absent.
    #[inline]
    pub(super) fn value_mut_or_insert(
        &mut self,
        index: usize,
        key: &K,
        init: impl FnOnce() -> V,
    ) -> &mut V {
        self.touch(index, key);
        match self.groups[index].get_mut().entry_ref(key) {
            EntryRef::Occupied(e) => e.into_mut(),
            EntryRef::Vacant(e) => e.insert_with_key(key.clone(), init()),
        }
    }

    /// Sets the value of `key` in the key group at `index`.
    #[inline]
    pub(super) fn update(&mut self, index: usize, key: &K, value: V) {
        self.touch(index, key);
        match self.groups[index].get_mut().entry_ref(key) {
            EntryRef::Occupied(mut e) => {
                e.insert(value);
            }
            EntryRef::Vacant(e) => {
                e.insert_with_key(key.clone(), value);
            }
        }
    }

    /// TTL's incremental cleanup: `budget` more entries are owed; whole key groups are checked
    /// (in turn) while the owed entries cover them, so the cost per call is `budget` amortized.
    pub(super) fn cleanup(&mut self, budget: usize, now_ms: i64) {
        let Some(expiry) = self.expiry.clone() else {
            return;
        };
        if self.groups.is_empty() {
            return;
        }
        self.cleanup_budget = self.cleanup_budget.saturating_add(budget);
        for _ in 0..self.groups.len() {
            let index = self.cleanup_cursor % self.groups.len();
            let cost = self.groups[index].get().len().max(1);
            if self.cleanup_budget < cost {
                return;
            }
            self.cleanup_budget -= cost;
            self.cleanup_cursor = (index + 1) % self.groups.len();
            let group = &mut self.groups[index];
            let stale = group
                .get()
                .values()
                .any(|v| !matches!(expiry(v, now_ms), Expiry::Keep));
            if stale {
                let mut changed = self.changed.as_mut().and_then(|c| c.get_mut(index));
                group.get_mut().retain(|k, v| match expiry(v, now_ms) {
                    Expiry::Keep => true,
                    Expiry::Drop => {
                        if let Some(set) = changed.as_deref_mut() {
                            set.get_or_insert_with(k, K::clone);
                        }
                        false
                    }
                    Expiry::Replace(new) => {
                        *v = new;
                        if let Some(set) = changed.as_deref_mut() {
                            set.get_or_insert_with(k, K::clone);
                        }
                        true
                    }
                });
            }
        }
    }
}

/// A state's table with its value type erased, so the backend can hold states of any types.
/// Typed access is a downcast through `Any` (a supertrait, so reaching `dyn Any` is a vtable
/// lookup, not a call): one virtual call per state access, where `as_any_mut` cost two.
pub(super) trait ErasedTable<K>: Any + Send + Sync {
    /// The synchronous part of a snapshot: shares every key group's table (behind an `Arc`).
    fn freeze(&mut self, now_ms: i64) -> Box<dyn FrozenTable>;
    /// Number of entries over all key groups.
    fn len(&self) -> usize;
    /// Removes `key` from the key group at `index`; a group shared with a snapshot is copied
    /// only if the key is there.
    fn remove(&mut self, index: usize, key: &K);
    /// Starts tracking changed keys, for incremental snapshots.
    fn track_changes(&mut self);
    /// The synchronous part of incremental checkpoint `checkpoint`: takes the changed keys into
    /// the history, and freezes a delta (every key changed since the confirmed base) or, when
    /// `delta` is false, the whole table.
    fn freeze_incremental(
        &mut self,
        checkpoint: u64,
        now_ms: i64,
        delta: bool,
    ) -> Box<dyn FrozenTable>;
    /// Checkpoint `checkpoint` is the new base: the history up to it is no longer needed.
    fn confirm(&mut self, checkpoint: u64);
    /// Checkpoint `checkpoint` was aborted: its changed keys go back to the current set (the
    /// next snapshot takes them again), so the history holds no aborted snapshot.
    fn abort(&mut self, checkpoint: u64);
}

impl<K: StateKey, V: StateValue> ErasedTable<K> for ValueTable<K, V> {
    fn freeze(&mut self, now_ms: i64) -> Box<dyn FrozenTable> {
        let expiry = match &self.expiry {
            Some(e) if self.cleanup_full_snapshot => Some((e.clone(), now_ms)),
            _ => None,
        };
        Box::new(FrozenValueTable {
            groups: self.groups.iter_mut().map(CowGroup::share).collect(),
            expiry,
        })
    }

    fn len(&self) -> usize {
        self.groups.iter().map(|g| g.get().len()).sum()
    }

    fn remove(&mut self, index: usize, key: &K) {
        let Some(group) = self.groups.get_mut(index) else {
            return;
        };
        // A shared table is taken back (copied, if a snapshot holds it) only if the key is there.
        let removed = group.get().contains_key(key) && group.get_mut().remove(key).is_some();
        if removed {
            self.touch(index, key);
        }
    }

    fn track_changes(&mut self) {
        if self.changed.is_none() {
            self.changed = Some((0..self.groups.len()).map(|_| Changed::default()).collect());
        }
    }

    fn freeze_incremental(
        &mut self,
        checkpoint: u64,
        now_ms: i64,
        delta: bool,
    ) -> Box<dyn FrozenTable> {
        let fresh = || (0..self.groups.len()).map(|_| Changed::default()).collect();
        let taken = match &mut self.changed {
            Some(changed) => std::mem::replace(changed, fresh()),
            None => {
                self.changed = Some(fresh());
                fresh()
            }
        };
        self.history.push((checkpoint, Arc::new(taken)));
        if !delta {
            return self.freeze(now_ms);
        }
        let expiry = match &self.expiry {
            Some(e) if self.cleanup_full_snapshot => Some((e.clone(), now_ms)),
            _ => None,
        };
        Box::new(FrozenDelta {
            groups: self.groups.iter_mut().map(CowGroup::share).collect(),
            changes: self.history.iter().map(|(_, c)| Arc::clone(c)).collect(),
            expiry,
        })
    }

    fn confirm(&mut self, checkpoint: u64) {
        self.history.retain(|(id, _)| *id > checkpoint);
    }

    fn abort(&mut self, checkpoint: u64) {
        let Some(pos) = self.history.iter().position(|(id, _)| *id == checkpoint) else {
            return;
        };
        let (_, sets) = self.history.remove(pos);
        if let Some(changed) = &mut self.changed {
            for (current, aborted) in changed.iter_mut().zip(sets.iter()) {
                for key in aborted {
                    current.get_or_insert_with(key, K::clone);
                }
            }
        }
    }
}

/// A table as a snapshot froze it, able to write one key group's block.
pub(super) trait FrozenTable: Send {
    /// Appends this state's block for the key group at `index` in the range, if it has entries.
    fn write_group(
        &self,
        index: usize,
        state_id: i16,
        encoder: &mut EntryEncoder,
        section: &mut SectionWriter,
    ) -> Result<(), StateError>;
}

struct FrozenValueTable<K, V> {
    groups: Vec<Arc<Group<K, V>>>,
    /// TTL's full-snapshot cleanup: expired values are left out, as of the snapshot's time.
    expiry: Option<(ExpiryFn<V>, i64)>,
}

impl<K: StateKey, V: StateValue> FrozenTable for FrozenValueTable<K, V> {
    fn write_group(
        &self,
        index: usize,
        state_id: i16,
        encoder: &mut EntryEncoder,
        section: &mut SectionWriter,
    ) -> Result<(), StateError> {
        let Some(group) = self.groups.get(index).filter(|g| !g.is_empty()) else {
            return Ok(());
        };
        let (count, bytes) = match &self.expiry {
            None => encoder.encode(group.iter())?,
            Some((expiry, now)) => {
                let live: Vec<(&K, std::borrow::Cow<'_, V>)> = group
                    .iter()
                    .filter_map(|(k, v)| match expiry(v, *now) {
                        Expiry::Keep => Some((k, std::borrow::Cow::Borrowed(v))),
                        Expiry::Drop => None,
                        Expiry::Replace(new) => Some((k, std::borrow::Cow::Owned(new))),
                    })
                    .collect();
                if live.is_empty() {
                    return Ok(());
                }
                encoder.encode(live.iter().map(|(k, v)| (*k, v.as_ref())))?
            }
        };
        section.block(state_id, count, bytes)
    }
}

/// A table as an incremental snapshot froze it: the values of the keys changed since the base.
struct FrozenDelta<K, V> {
    groups: Vec<Arc<Group<K, V>>>,
    /// The changed keys of every snapshot since the base (this one's last).
    changes: Vec<ChangeSet<K>>,
    /// TTL's full-snapshot cleanup, applied to the changed values: an expired one is written as
    /// a tombstone.
    expiry: Option<(ExpiryFn<V>, i64)>,
}

impl<K: StateKey, V: StateValue> FrozenTable for FrozenDelta<K, V> {
    fn write_group(
        &self,
        index: usize,
        state_id: i16,
        encoder: &mut EntryEncoder,
        section: &mut SectionWriter,
    ) -> Result<(), StateError> {
        let Some(group) = self.groups.get(index) else {
            return Ok(());
        };
        let sets: Vec<&Changed<K>> = self
            .changes
            .iter()
            .filter_map(|c| c.get(index))
            .filter(|set| !set.is_empty())
            .collect();
        if sets.is_empty() {
            return Ok(());
        }
        let mut seen: hashbrown::HashSet<&K, FxBuildHasher> = hashbrown::HashSet::default();
        let mut upserts: Vec<(&K, std::borrow::Cow<'_, V>)> = Vec::new();
        let mut removed: Vec<&K> = Vec::new();
        for key in sets.iter().flat_map(|set| set.iter()) {
            if sets.len() > 1 && !seen.insert(key) {
                continue;
            }
            match (group.get(key), &self.expiry) {
                (None, _) => removed.push(key),
                (Some(v), None) => upserts.push((key, std::borrow::Cow::Borrowed(v))),
                (Some(v), Some((expiry, now))) => match expiry(v, *now) {
                    Expiry::Keep => upserts.push((key, std::borrow::Cow::Borrowed(v))),
                    Expiry::Drop => removed.push(key),
                    Expiry::Replace(new) => upserts.push((key, std::borrow::Cow::Owned(new))),
                },
            }
        }
        if !upserts.is_empty() {
            let (count, bytes) = encoder.encode(upserts.iter().map(|(k, v)| (*k, v.as_ref())))?;
            section.block(state_id, count, bytes)?;
        }
        if !removed.is_empty() {
            let (count, bytes) = encoder.encode_keys(removed.iter().copied())?;
            section.tombstones(state_id, count, bytes)?;
        }
        Ok(())
    }
}

/// A table with nothing to write: a restored state not registered yet, in a delta (it has not
/// changed since it was restored).
pub(super) struct FrozenUnchanged;

impl FrozenTable for FrozenUnchanged {
    fn write_group(
        &self,
        _index: usize,
        _state_id: i16,
        _encoder: &mut EntryEncoder,
        _section: &mut SectionWriter,
    ) -> Result<(), StateError> {
        Ok(())
    }
}

/// A pending state as a snapshot froze it: its bytes are written back as they were read.
pub(super) struct FrozenPending(pub(super) Arc<PendingState>);

impl FrozenTable for FrozenPending {
    fn write_group(
        &self,
        index: usize,
        state_id: i16,
        _encoder: &mut EntryEncoder,
        section: &mut SectionWriter,
    ) -> Result<(), StateError> {
        self.0.write_group(index, state_id, section)
    }
}
