//! Sources: the [`SourceFunction`] contract, the seeded generator (Flink's `DataGeneratorSource`
//! with `RandomGenerator`) and the collection source, and the driver that runs a source as the
//! head of a chain.
//!
//! Both built-in sources are *replayable*: their position is operator state. Their input is a set
//! of splits (split `s` of `n` covers record indices `s, s+n, s+2n, …`); each split's next index
//! is checkpointed, so a restore resumes exactly after the last checkpointed record. Record `i`
//! depends only on `i` (and the seed), never on the parallelism.

use crate::error::TaskError;
use crate::operator::{Lifecycle, OpResult, OperatorSnapshotParts, Output, SubtaskInfo};
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use weir_core::handle::OperatorStateMode;
use weir_core::ids::OperatorId;
use weir_state::{ListState, OperatorStateBackend};

/// What a source reports after filling a batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SourceStatus {
    /// There may be more.
    More,
    /// Nothing now; try again later (an unbounded source waiting for input).
    Idle,
    /// The input is exhausted.
    End,
}

/// A source of records, run in the mailbox loop of its task: `next_batch` and checkpoints never
/// run at the same time, so the position a snapshot records is exactly after the last record
/// emitted.
pub trait SourceFunction<T>: Send + 'static {
    /// Restores the position from operator state, or starts fresh when there is none.
    fn open(
        &mut self,
        info: &SubtaskInfo,
        state: &mut OperatorStateBackend,
    ) -> Result<(), TaskError>;

    /// Appends up to `max` records to `out`.
    fn next_batch(&mut self, out: &mut Vec<T>, max: usize) -> Result<SourceStatus, TaskError>;

    /// Records the position in operator state (the synchronous part of a snapshot).
    fn snapshot_state(&mut self, state: &mut OperatorStateBackend) -> Result<(), TaskError>;
}

/// One split of an indexed source: indices `first, first+stride, …` below the end.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct IndexSplit {
    /// The split's number.
    pub split: u32,
    /// Distance between its indices (the number of splits).
    pub stride: u64,
    /// The next index to emit.
    pub next: u64,
}

/// A source over record indices `0..count` (`count = None`: unbounded), turning index `i` into
/// a record with a function of `i` alone. The generator and the collection source are this.
pub struct IndexedSource<T> {
    make: Arc<dyn Fn(u64) -> T + Send + Sync>,
    count: Option<u64>,
    splits: Vec<IndexSplit>,
    state: Option<ListState<IndexSplit>>,
    current: usize,
}

impl<T: Send + 'static> IndexedSource<T> {
    /// A source of `count` records (`None`: unbounded) where record `i` is `make(i)`.
    pub fn new(count: Option<u64>, make: Arc<dyn Fn(u64) -> T + Send + Sync>) -> Self {
        IndexedSource {
            make,
            count,
            splits: Vec::new(),
            state: None,
            current: 0,
        }
    }
}

const SPLITS_STATE: &str = "source-splits";

impl<T: Send + 'static> SourceFunction<T> for IndexedSource<T> {
    fn open(
        &mut self,
        info: &SubtaskInfo,
        state: &mut OperatorStateBackend,
    ) -> Result<(), TaskError> {
        let list =
            state.list_state::<IndexSplit>(SPLITS_STATE, OperatorStateMode::SplitDistribute)?;
        let restored = state.get(&list)?;
        // A restored subtask with no splits has nothing left to read (more subtasks than splits);
        // only a fresh start takes split `index` of `parallelism`.
        self.splits = if restored.is_empty() && !info.restored {
            vec![IndexSplit {
                split: info.index,
                stride: u64::from(info.parallelism),
                next: u64::from(info.index),
            }]
        } else {
            restored
        };
        self.state = Some(list);
        Ok(())
    }

    fn next_batch(&mut self, out: &mut Vec<T>, max: usize) -> Result<SourceStatus, TaskError> {
        let end = self.count.unwrap_or(u64::MAX);
        let n = self.splits.len();
        let mut exhausted = 0;
        while out.len() < max && exhausted < n {
            let s = &mut self.splits[self.current];
            if s.next >= end {
                exhausted += 1;
                self.current = (self.current + 1) % n;
                continue;
            }
            exhausted = 0;
            let room = (max - out.len()) as u64;
            let left = (end - s.next).div_ceil(s.stride);
            let take = room.min(left);
            let (mut i, stride) = (s.next, s.stride);
            for _ in 0..take {
                out.push((self.make)(i));
                i += stride;
            }
            s.next = i;
            self.current = (self.current + 1) % n;
        }
        if n == 0 || self.splits.iter().all(|s| s.next >= end) {
            Ok(SourceStatus::End)
        } else {
            Ok(SourceStatus::More)
        }
    }

    fn snapshot_state(&mut self, state: &mut OperatorStateBackend) -> Result<(), TaskError> {
        if let Some(list) = &self.state {
            state.update(list, &self.splits)?;
        }
        Ok(())
    }
}

/// Flink's `RandomGenerator.intGenerator(min, max)` made deterministic: the value of record `i`
/// is a hash of `(seed, i)` mapped into `min..=max`.
#[derive(Clone, Copy, Debug)]
pub struct RandomIntGenerator {
    seed: u64,
    min: i64,
    span: u64,
}

impl RandomIntGenerator {
    /// Values in `min..=max`.
    pub fn new(seed: u64, min: i64, max: i64) -> Self {
        RandomIntGenerator {
            seed,
            min,
            span: (max - min) as u64 + 1,
        }
    }

    /// The value of record `i`.
    #[inline]
    pub fn value(&self, i: u64) -> i64 {
        self.min
            + (splitmix64(self.seed ^ i.wrapping_mul(0x9e37_79b9_7f4a_7c15)) % self.span) as i64
    }
}

/// SplitMix64's finalizer: a fast, well-mixed 64-bit hash.
#[inline]
pub fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Runs a source as the head of a chain: fills batches, pushes them down, and snapshots the
/// source's operator state.
pub struct SourceDriver<T> {
    operator_id: OperatorId,
    info: SubtaskInfo,
    source: Box<dyn SourceFunction<T>>,
    state: OperatorStateBackend,
    next: Box<dyn Output<T>>,
    batch_size: usize,
}

impl<T: Send + 'static> SourceDriver<T> {
    /// A driver for `source` feeding `next`.
    pub fn new(
        operator_id: OperatorId,
        info: SubtaskInfo,
        source: Box<dyn SourceFunction<T>>,
        next: Box<dyn Output<T>>,
        batch_size: usize,
    ) -> Self {
        SourceDriver {
            operator_id,
            info,
            source,
            state: OperatorStateBackend::new(),
            next,
            batch_size: batch_size.max(1),
        }
    }

    /// Emits one batch; returns how many records and the source's status.
    pub fn emit_batch(&mut self) -> Result<(usize, SourceStatus), TaskError> {
        let mut batch = Vec::with_capacity(self.batch_size);
        let status = self.source.next_batch(&mut batch, self.batch_size)?;
        let n = batch.len();
        if n > 0 {
            self.next.push_batch(batch)?;
        }
        Ok((n, status))
    }

    /// A lifecycle event for the source, then for the rest of the chain.
    pub fn lifecycle(&mut self, event: &mut Lifecycle<'_>) -> OpResult {
        match event {
            Lifecycle::Open(ctx) => {
                self.info.restored =
                    ctx.restore_operator_state(self.operator_id, &mut self.state)?;
                self.source.open(&self.info, &mut self.state)?;
            }
            Lifecycle::Snapshot(_, parts) => {
                self.source.snapshot_state(&mut self.state)?;
                parts.push(OperatorSnapshotParts::operator_state(
                    self.operator_id,
                    &self.state,
                ));
            }
            _ => {}
        }
        self.next.lifecycle(event)
    }

    /// Event time advanced (for a source: to the end, before a drained stop).
    pub fn watermark(&mut self, watermark: weir_core::element::Watermark) -> OpResult {
        self.next.watermark(watermark)
    }

    /// Sends what the chain's writers queued.
    pub fn poll_flush(&mut self, cx: &mut std::task::Context<'_>) -> std::task::Poll<OpResult> {
        self.next.poll_flush(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(index: u32, parallelism: u32, restored: bool) -> SubtaskInfo {
        SubtaskInfo {
            index,
            parallelism,
            max_parallelism: 128,
            attempt: 0,
            task_name: "src".into(),
            restored,
        }
    }

    fn drain(src: &mut IndexedSource<u64>, max: usize) -> Vec<u64> {
        let mut all = Vec::new();
        loop {
            let mut b = Vec::new();
            let st = src.next_batch(&mut b, max).unwrap();
            all.extend(b);
            if st == SourceStatus::End {
                return all;
            }
        }
    }

    #[test]
    fn splits_cover_every_index_once_at_any_parallelism() {
        for p in [1u32, 2, 3, 4] {
            let mut all = Vec::new();
            for i in 0..p {
                let mut s = IndexedSource::new(Some(103), Arc::new(|i| i));
                let mut st = OperatorStateBackend::new();
                s.open(&info(i, p, false), &mut st).unwrap();
                all.extend(drain(&mut s, 7));
            }
            all.sort();
            assert_eq!(all, (0..103).collect::<Vec<_>>(), "p={p}");
        }
    }

    #[test]
    fn snapshot_and_restore_resume_after_the_last_record() {
        let mut s = IndexedSource::new(Some(50), Arc::new(|i| i));
        let mut st = OperatorStateBackend::new();
        s.open(&info(0, 2, false), &mut st).unwrap();
        let mut first = Vec::new();
        s.next_batch(&mut first, 10).unwrap();
        s.snapshot_state(&mut st).unwrap();
        let mut blob = Vec::new();
        st.snapshot().write_to(&mut blob).unwrap();

        let mut restored_state = OperatorStateBackend::new();
        restored_state.restore(&[&blob]).unwrap();
        let mut r = IndexedSource::new(Some(50), Arc::new(|i| i));
        r.open(&info(0, 2, true), &mut restored_state).unwrap();
        let rest = drain(&mut r, 10);
        let mut all = first.clone();
        all.extend(rest);
        assert_eq!(all, (0..50).step_by(2).collect::<Vec<_>>());
    }

    #[test]
    fn generator_values_are_in_range_and_deterministic() {
        let g = RandomIntGenerator::new(7, 1, 9);
        let v: Vec<i64> = (0..1000).map(|i| g.value(i)).collect();
        assert!(v.iter().all(|x| (1..=9).contains(x)));
        assert_eq!(v, (0..1000).map(|i| g.value(i)).collect::<Vec<_>>());
        let distinct: std::collections::BTreeSet<_> = v.iter().collect();
        assert_eq!(distinct.len(), 9);
        assert_ne!(
            v[..20],
            (0..20)
                .map(|i| RandomIntGenerator::new(8, 1, 9).value(i))
                .collect::<Vec<_>>()[..]
        );
    }
}
