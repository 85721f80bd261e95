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
//! those of one state access per record; barriers and snapshots come between batches. A key may
//! depend on the field a sum replaces (`key_by(|t| &t.1).sum()`): a record's field is written
//! when it leaves its slot, so the keys compared are always read as the records came.
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
struct Slot<N> {
    /// The batch the slot belongs to (0: never used).
    batch: u32,
    /// Index of its key's latest record in the batch.
    index: usize,
    /// That key's key group.
    key_group: KeyGroup,
    /// Whether the state lacks the value of the record at `index`.
    dirty: bool,
    /// A sum's running total for the key, up to the record at `index` (whose field still holds
    /// its own value: a record's field is written when it leaves the slot, so that the keys of
    /// the records in slots, which may depend on the field, are read as they came).
    total: N,
}

/// The cache of a keyed operator (`N`: what a slot carries, a sum's running total, or `()`):
/// one per operator, begun again for each batch.
#[derive(Debug)]
pub(crate) struct LatestInBatch<N = ()> {
    batch: u32,
    slots: Box<[Slot<N>; SLOTS]>,
    /// Batches still to take without the cache.
    plain: u32,
}

impl<N: Copy + Default> Default for LatestInBatch<N> {
    fn default() -> Self {
        LatestInBatch {
            batch: 0,
            slots: Box::new([Slot::default(); SLOTS]),
            plain: 0,
        }
    }
}

impl<N: Copy + Default> LatestInBatch<N> {
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
    fn slot(&mut self, key_group: KeyGroup) -> &mut Slot<N> {
        &mut self.slots[key_group as usize & (SLOTS - 1)]
    }

    /// The slots of batch `batch`.
    fn live(&self, batch: u32) -> impl Iterator<Item = &Slot<N>> {
        self.slots.iter().filter(move |s| s.batch == batch)
    }
}

impl<N> LatestInBatch<N>
where
    N: StateValue + Copy + Default + Add<Output = N>,
{
    /// Adds each record's second field to its key's running sum in `sums`, replacing the field
    /// with the new sum (the running `sum` of a `Tuple2`). A key may depend on the summed field
    /// (`key_by(|t| &t.1)`, or the whole tuple): each record's key is read before its field
    /// changes, as in a per-record loop.
    pub(crate) fn sum<K, A>(
        &mut self,
        batch: &mut [(A, N)],
        key: impl Fn(&(A, N)) -> &K,
        assigner: KeyGroupAssigner,
        sums: &mut ValueAccess<'_, K, N>,
    ) where
        K: StateKey,
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
            if slot.batch == current && slot.key_group == key_group && key(&batch[slot.index]) == k
            {
                // The slot's record leaves it with its running total; this one takes its place.
                let total = slot.total + batch[i].1;
                batch[slot.index].1 = slot.total;
                slot.total = total;
                slot.index = i;
                slot.dirty = true;
                hits += 1;
                continue;
            }
            let total = {
                let value = sums.value_mut_or_insert(k, key_group, N::default);
                *value = *value + batch[i].1;
                *value
            };
            if slot.batch == current {
                // Evicted: the state gets the key's total, and the record its field.
                let j = slot.index;
                if slot.dirty {
                    sums.update(key(&batch[j]), slot.key_group, slot.total);
                }
                batch[j].1 = slot.total;
            }
            *slot = Slot {
                batch: current,
                index: i,
                key_group,
                dirty: false,
                total,
            };
        }
        for slot in self.live(current) {
            if slot.dirty {
                sums.update(key(&batch[slot.index]), slot.key_group, slot.total);
            }
            batch[slot.index].1 = slot.total;
        }
        self.judge(hits, batch.len());
    }
}

impl LatestInBatch {
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
            if slot.batch == current && slot.key_group == key_group && key(&batch[slot.index]) == k
            {
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
                total: (),
            };
        }
        for slot in self.live(current) {
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

    /// A heap and a store backend owning every key group of `max_p`.
    fn backends_of<K: StateKey>(max_p: u32) -> Vec<(&'static str, KeyedBackend<K>)> {
        let range = KeyGroupRange::new(0, max_p - 1);
        vec![
            ("heap", KeyedBackend::heap(max_p, range)),
            (
                "store",
                KeyedBackend::Store(StoreKeyedStateBackend::new(
                    Box::new(MemoryKeyedStore::new()),
                    max_p,
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
        let assigner = KeyGroupAssigner::new(MAX_P, 1);
        let hot = colliding(assigner);
        assert!(hot.len() >= 30, "{hot:?}");
        for keys in [3, 40, 100_000] {
            for (name, mut backend) in backends_of::<String>(MAX_P) {
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
        for (name, mut backend) in backends_of::<String>(MAX_P) {
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

    /// A sum keyed by the field it sums (`key_by(|t| &t.1).sum()`): each record's key is its
    /// value before the sum, as in the per-record loop (the cache once read the keys of earlier
    /// records after their field held the running total).
    #[test]
    fn a_sum_keyed_by_its_summed_field_reads_each_key_before_the_sum() {
        let max_p = 128;
        let assigner = KeyGroupAssigner::new(max_p, 1);
        // 34 and 68 share a key group (125) at max parallelism 128.
        assert_eq!(assigner.key_group(&34u64), assigner.key_group(&68u64));
        // (the summed fields, the totals emitted, the state after: key and total)
        type Case = (&'static [u64], &'static [u64], &'static [(u64, u64)]);
        let cases: [Case; 3] = [
            (&[5, 5], &[5, 10], &[(5, 10)]),
            (&[34, 34, 68], &[34, 68, 68], &[(34, 68), (68, 68)]),
            (&[5, 5, 5, 5, 5, 5], &[5, 10, 15, 20, 25, 30], &[(5, 30)]),
        ];
        for (input, emitted, state_after) in cases {
            for (name, mut backend) in backends_of::<u64>(max_p) {
                let state: ValueState<u64> = backend
                    .value_state(&ValueStateDescriptor::new("sum"))
                    .unwrap();
                let mut recent = LatestInBatch::default();
                let mut batch: Vec<(&str, u64)> = input.iter().map(|n| ("x", *n)).collect();
                let mut sums = backend.value_access(state);
                recent.sum(&mut batch, |r| &r.1, assigner, &mut sums);
                let got: Vec<u64> = batch.iter().map(|r| r.1).collect();
                assert_eq!(got, emitted, "{name}: {input:?}");
                for (k, v) in state_after {
                    let kg = assigner.key_group(k);
                    assert_eq!(
                        backend.value(state, k, kg).copied(),
                        Some(*v),
                        "{name}: {k}"
                    );
                }
                let total: usize = backend.num_entries().unwrap();
                assert_eq!(total, state_after.len(), "{name}: {input:?}");
            }
        }
    }

    #[test]
    fn batch_numbers_wrap_around_to_empty_slots() {
        let mut recent: LatestInBatch = LatestInBatch {
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
