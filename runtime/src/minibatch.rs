//! A batch's latest record per key, found without a state lookup, so that keyed operators touch
//! their state once per key and batch rather than once per record (Flink SQL's mini-batch
//! aggregation, within one batch of the exchange).
//!
//! [`LatestInBatch`] is a small cache, direct-mapped by key group: each slot holds the index of
//! the latest record of one key in the current batch, and whether the state still lacks that
//! record's value. A record whose key is in its slot is combined with the slot's record; any
//! other record evicts the slot (writing its pending value to the state first) and reads the
//! state. At the batch's end every pending value is written. Per key, the state's reads and
//! writes keep the records' order, so the state after a batch, and every value emitted, are
//! those of one state access per record; barriers and snapshots come between batches.
//!
//! A hot key (the nine digits of the word count) costs one comparison per record instead of a
//! hash-table lookup. Keys that rarely repeat within a batch gain nothing, and the comparison
//! and bookkeeping cost 25 % more CPU with 10M keys (2026-12-04: the loop's extra work leaves
//! fewer of the state's cache misses in flight at once), so a batch where fewer than a quarter of
//! the records found their key in the cache makes the next [`PLAIN_AFTER_MISSES`] batches access
//! the state once per record, as without the cache; then the cache is tried again.

use std::ops::Add;
use weir_core::keygroup::{KeyGroup, KeyGroupAssigner, KeyGroupRange};
use weir_state::{StateKey, StateValue, ValueAccess};

/// Batches that access the state once per record after a batch that mostly missed the cache.
const PLAIN_AFTER_MISSES: u32 = 15;

/// Slots of the cache (a power of two): a subtask's key groups map to distinct slots up to
/// this many (max parallelism 128, Flink's default, at any parallelism).
const SLOTS: usize = 128;

#[derive(Clone, Copy, Debug, Default)]
struct Slot {
    /// The batch the slot belongs to (0: never used).
    batch: u32,
    /// Index of its key's latest record in the batch.
    index: usize,
    /// That key's key group.
    key_group: KeyGroup,
    /// Whether the state lacks the value of the record at `index`.
    dirty: bool,
}

/// The cache of a keyed operator: one per operator, begun again for each batch.
#[derive(Debug)]
pub(crate) struct LatestInBatch {
    batch: u32,
    slots: Box<[Slot; SLOTS]>,
    /// Batches still to take without the cache.
    plain: u32,
}

impl Default for LatestInBatch {
    fn default() -> Self {
        LatestInBatch {
            batch: 0,
            slots: Box::new([Slot::default(); SLOTS]),
            plain: 0,
        }
    }
}

impl LatestInBatch {
    /// Whether this batch goes without the cache (counting it off).
    #[inline]
    fn take_plain(&mut self) -> bool {
        if self.plain == 0 {
            return false;
        }
        self.plain -= 1;
        true
    }

    /// After a batch of `len` records of which `hits` found their key in the cache.
    #[inline]
    fn judge(&mut self, hits: usize, len: usize) {
        if hits * 4 < len {
            self.plain = PLAIN_AFTER_MISSES;
        }
    }

    /// Starts a batch: every slot is empty (by a new batch number; cleared only on wrap-around).
    fn begin(&mut self) -> u32 {
        self.batch = self.batch.wrapping_add(1);
        if self.batch == 0 {
            self.slots.fill(Slot::default());
            self.batch = 1;
        }
        self.batch
    }

    #[inline]
    fn slot(&mut self, key_group: KeyGroup) -> &mut Slot {
        &mut self.slots[key_group as usize & (SLOTS - 1)]
    }

    /// The slots of batch `batch` whose value the state lacks.
    fn dirty(&self, batch: u32) -> impl Iterator<Item = &Slot> {
        self.slots
            .iter()
            .filter(move |s| s.batch == batch && s.dirty)
    }

    /// Adds each record's second field to its key's running sum in `sums`, replacing the field
    /// with the new sum (the running `sum` of a `Tuple2`).
    pub(crate) fn sum<K, A, N>(
        &mut self,
        batch: &mut [(A, N)],
        key: impl Fn(&(A, N)) -> &K,
        assigner: KeyGroupAssigner,
        sums: &mut ValueAccess<'_, K, N>,
    ) where
        K: StateKey,
        N: StateValue + Copy + Default + Add<Output = N>,
    {
        if self.take_plain() {
            for record in batch.iter_mut() {
                let k = key(record);
                let value = sums.value_mut_or_insert(k, assigner.key_group(k), N::default);
                *value = *value + record.1;
                record.1 = *value;
            }
            return;
        }
        let current = self.begin();
        let mut hits = 0;
        for i in 0..batch.len() {
            let k = key(&batch[i]);
            let key_group = assigner.key_group(k);
            let slot = self.slot(key_group);
            let total = if slot.batch == current && key(&batch[slot.index]) == k {
                slot.dirty = true;
                hits += 1;
                batch[slot.index].1 + batch[i].1
            } else {
                if slot.batch == current && slot.dirty {
                    let pending = &batch[slot.index];
                    sums.update(key(pending), slot.key_group, pending.1);
                }
                let value = sums.value_mut_or_insert(k, key_group, N::default);
                *value = *value + batch[i].1;
                *slot = Slot {
                    batch: current,
                    index: i,
                    key_group,
                    dirty: false,
                };
                *value
            };
            slot.index = i;
            batch[i].1 = total;
        }
        for slot in self.dirty(current) {
            let pending = &batch[slot.index];
            sums.update(key(pending), slot.key_group, pending.1);
        }
        self.judge(hits, batch.len());
    }

    /// Writes each key's latest value in `batch` to `latest` (a latest-per-key sink). `Err`
    /// names the key group of the first record outside `range` (a stream that is not
    /// partitioned by this key: the task fails, and the state written so far with it).
    pub(crate) fn keep_latest<K, A, V>(
        &mut self,
        batch: &[(A, V)],
        key: impl Fn(&(A, V)) -> &K,
        assigner: KeyGroupAssigner,
        range: KeyGroupRange,
        latest: &mut ValueAccess<'_, K, V>,
    ) -> Result<(), KeyGroup>
    where
        K: StateKey,
        V: StateValue,
    {
        if self.take_plain() {
            for record in batch {
                let k = key(record);
                let key_group = assigner.key_group(k);
                if !range.contains(key_group) {
                    return Err(key_group);
                }
                latest.update(k, key_group, record.1.clone());
            }
            return Ok(());
        }
        let current = self.begin();
        let mut hits = 0;
        for (i, record) in batch.iter().enumerate() {
            let k = key(record);
            let key_group = assigner.key_group(k);
            if !range.contains(key_group) {
                return Err(key_group);
            }
            let slot = self.slot(key_group);
            if slot.batch == current && key(&batch[slot.index]) == k {
                slot.index = i;
                hits += 1;
                continue;
            }
            if slot.batch == current {
                let pending = &batch[slot.index];
                latest.update(key(pending), slot.key_group, pending.1.clone());
            }
            *slot = Slot {
                batch: current,
                index: i,
                key_group,
                dirty: true,
            };
        }
        for slot in self.dirty(current) {
            let pending = &batch[slot.index];
            latest.update(key(pending), slot.key_group, pending.1.clone());
        }
        self.judge(hits, batch.len());
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;
    use weir_state::store::{MemoryKeyedStore, StoreKeyedStateBackend};
    use weir_state::{KeyedBackend, KeyedStateBackend, ValueState, ValueStateDescriptor};

    /// Max parallelism 4096: key groups `g` and `g + 128` share a slot.
    const MAX_P: u32 = 4096;

    fn backends(range: KeyGroupRange) -> Vec<(&'static str, KeyedBackend<String>)> {
        vec![
            ("heap", KeyedBackend::heap(MAX_P, range)),
            (
                "store",
                KeyedBackend::Store(StoreKeyedStateBackend::new(
                    Box::new(MemoryKeyedStore::new()),
                    MAX_P,
                    range,
                )),
            ),
        ]
    }

    /// xorshift: batches of 0..300 records over `keys` keys.
    fn batches(seed: u64, keys: u64) -> Vec<Vec<(String, u64)>> {
        let mut x = seed | 1;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        (0..60)
            .map(|_| {
                let len = next() % 300;
                (0..len)
                    .map(|_| (format!("k{}", next() % keys), next() % 1000))
                    .collect()
            })
            .collect()
    }

    /// Keys `n` apart from one another by a multiple of 128 key groups, so they collide in slots.
    fn colliding(assigner: KeyGroupAssigner) -> Vec<String> {
        let mut by_slot: HashMap<usize, Vec<String>> = HashMap::new();
        for i in 0..5000 {
            let k = format!("k{i}");
            let slot = assigner.key_group(&k) as usize & (SLOTS - 1);
            by_slot.entry(slot).or_default().push(k);
        }
        let mut out: Vec<String> = by_slot
            .into_values()
            .filter(|v| v.len() >= 3)
            .flatten()
            .collect();
        out.truncate(40);
        out
    }

    #[test]
    fn running_sums_equal_one_state_access_per_record_on_either_backend() {
        let range = KeyGroupRange::new(0, MAX_P - 1);
        let assigner = KeyGroupAssigner::new(MAX_P, 1);
        let hot = colliding(assigner);
        assert!(hot.len() >= 30, "{hot:?}");
        for keys in [3, 40, 100_000] {
            for (name, mut backend) in backends(range) {
                let state: ValueState<u64> = backend
                    .value_state(&ValueStateDescriptor::new("sum"))
                    .unwrap();
                let mut recent = LatestInBatch::default();
                let mut model: HashMap<String, u64> = HashMap::new();
                for (b, mut batch) in batches(keys, keys).into_iter().enumerate() {
                    // Every other batch also draws from keys that share slots.
                    if b % 2 == 1 {
                        for (i, r) in batch.iter_mut().enumerate() {
                            r.0 = hot[(i * 7 + b) % hot.len()].clone();
                        }
                    }
                    let want: Vec<(String, u64)> = batch
                        .iter()
                        .map(|(k, n)| {
                            let t = model.entry(k.clone()).or_default();
                            *t += n;
                            (k.clone(), *t)
                        })
                        .collect();
                    let mut sums = backend.value_access(state);
                    recent.sum(&mut batch, |r| &r.0, assigner, &mut sums);
                    assert_eq!(batch, want, "{name}, {keys} keys, batch {b}");
                    for (k, v) in &model {
                        let got = backend.value(state, k, assigner.key_group(k)).copied();
                        assert_eq!(got, Some(*v), "{name}, {keys} keys, after batch {b}: {k}");
                    }
                }
            }
        }
    }

    #[test]
    fn latest_values_equal_one_write_per_record_and_a_foreign_key_group_is_named() {
        let assigner = KeyGroupAssigner::new(MAX_P, 1);
        let hot = colliding(assigner);
        for (name, mut backend) in backends(KeyGroupRange::new(0, MAX_P - 1)) {
            let state: ValueState<u64> = backend
                .value_state(&ValueStateDescriptor::new("latest"))
                .unwrap();
            let mut recent = LatestInBatch::default();
            let mut model: HashMap<String, u64> = HashMap::new();
            for (b, mut batch) in batches(9, 50).into_iter().enumerate() {
                if b % 2 == 1 {
                    for (i, r) in batch.iter_mut().enumerate() {
                        r.0 = hot[(i * 5 + b) % hot.len()].clone();
                    }
                }
                for (k, v) in &batch {
                    model.insert(k.clone(), *v);
                }
                let range = KeyGroupRange::new(0, MAX_P - 1);
                let mut latest = backend.value_access(state);
                recent
                    .keep_latest(&batch, |r| &r.0, assigner, range, &mut latest)
                    .unwrap();
                for (k, v) in &model {
                    let got = backend.value(state, k, assigner.key_group(k)).copied();
                    assert_eq!(got, Some(*v), "{name}, after batch {b}: {k}");
                }
            }
        }
        // A subtask that owns half the key groups meets a key of the other half.
        let half = KeyGroupRange::new(0, MAX_P / 2 - 1);
        let (mine, foreign) = {
            let mut keys = (0..).map(|i| format!("k{i}"));
            let mine = keys.find(|k| half.contains(assigner.key_group(k))).unwrap();
            let foreign = keys
                .find(|k| !half.contains(assigner.key_group(k)))
                .unwrap();
            (mine, foreign)
        };
        let mut backend = KeyedBackend::heap(MAX_P, half);
        let state: ValueState<u64> = backend
            .value_state(&ValueStateDescriptor::new("latest"))
            .unwrap();
        let batch = vec![(mine, 1), (foreign.clone(), 2)];
        let mut latest = backend.value_access(state);
        let e = LatestInBatch::default().keep_latest(&batch, |r| &r.0, assigner, half, &mut latest);
        assert_eq!(e, Err(assigner.key_group(&foreign)));
    }

    #[test]
    fn a_batch_that_mostly_misses_makes_the_next_ones_plain_then_the_cache_is_tried_again() {
        let assigner = KeyGroupAssigner::new(MAX_P, 1);
        let mut backend = KeyedBackend::heap(MAX_P, KeyGroupRange::new(0, MAX_P - 1));
        let state: ValueState<u64> = backend
            .value_state(&ValueStateDescriptor::new("sum"))
            .unwrap();
        let mut recent = LatestInBatch::default();
        let mut sum = |batch: &mut Vec<(String, u64)>| {
            let mut sums = backend.value_access(state);
            recent.sum(batch, |r| &r.0, assigner, &mut sums);
            recent.plain
        };
        let distinct = |from: usize| -> Vec<(String, u64)> {
            (from..from + 100).map(|i| (format!("d{i}"), 1)).collect()
        };
        let hot =
            || -> Vec<(String, u64)> { (0..100).map(|i| (format!("h{}", i % 3), 1)).collect() };
        assert_eq!(sum(&mut hot()), 0, "hits: the cache stays on");
        assert_eq!(
            sum(&mut distinct(0)),
            PLAIN_AFTER_MISSES,
            "misses: plain from now"
        );
        for left in (0..PLAIN_AFTER_MISSES).rev() {
            let mut batch = hot();
            assert_eq!(sum(&mut batch), left);
            // Plain or cached, the running sums are right: h0 ends this batch at 34 more.
            assert_eq!(batch[99].1, 34 * (PLAIN_AFTER_MISSES - left + 1) as u64);
        }
        assert_eq!(sum(&mut hot()), 0, "tried again, and hits");
    }

    #[test]
    fn batch_numbers_wrap_around_to_empty_slots() {
        let mut recent = LatestInBatch {
            batch: u32::MAX - 1,
            ..Default::default()
        };
        assert_eq!(recent.begin(), u32::MAX);
        recent.slot(3).batch = u32::MAX;
        recent.slot(3).dirty = true;
        assert_eq!(recent.begin(), 1, "0 means never used");
        assert!(recent.slots.iter().all(|s| s.batch == 0 && !s.dirty));
    }
}
