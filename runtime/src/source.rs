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
use weir_state::{OperatorListState, OperatorStateBackend};

/// What a source reports after filling a batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SourceStatus {
    /// There may be more.
    More,
    /// Nothing now; try again later (an unbounded source waiting for input).
    Idle,
    /// No split to read: ask the source's enumerator for one.
    NeedSplits,
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

    /// [`snapshot_state`](Self::snapshot_state) for checkpoint `checkpoint`, for a source that
    /// remembers which position each checkpoint recorded (to report it when the checkpoint
    /// completes). The driver calls this one.
    fn snapshot_checkpoint(
        &mut self,
        _checkpoint: weir_core::ids::CheckpointId,
        state: &mut OperatorStateBackend,
    ) -> Result<(), TaskError> {
        self.snapshot_state(state)
    }

    /// A checkpoint this source took part in completed (Flink's `notifyCheckpointComplete`):
    /// a source may now tell its system the position that checkpoint recorded (a Kafka source
    /// commits its offsets, for monitoring). Never needed for exactly-once.
    fn notify_checkpoint_complete(
        &mut self,
        _checkpoint: weir_core::ids::CheckpointId,
    ) -> Result<(), TaskError> {
        Ok(())
    }

    /// Splits the source's enumerator assigned to this subtask, as the enumerator encoded them.
    fn add_splits(&mut self, _splits: Vec<Vec<u8>>) -> Result<(), TaskError> {
        Ok(())
    }

    /// The enumerator has no more splits for this subtask: once its splits are read, it ends.
    fn no_more_splits(&mut self) {}

    /// The source's own watermark, for a source that generates watermarks per split; the driver
    /// emits it after a batch when it advanced. `None`: none (yet).
    fn current_watermark(&self) -> Option<i64> {
        None
    }

    /// Whether the source is idle (Flink's idleness): it emits nothing for now, so it must not
    /// hold back the watermark downstream. The driver tells the downstream when this changes;
    /// emitting a record makes the source active again. `WithIdleness` (in the `idleness`
    /// module) makes any source idle after a while without records.
    fn is_idle(&self) -> bool {
        false
    }
}

/// What an enumerator answers a reader that asks for work.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum SplitAssignment {
    /// These splits, encoded for the reader.
    Splits(Vec<Vec<u8>>),
    /// There will be no more.
    NoMoreSplits,
}

/// A source's split enumerator: the operator coordinator that runs in the job master, owns the
/// splits not yet assigned and hands them to readers that ask (Flink's `SplitEnumerator`).
///
/// Contract: its state is checkpointed before the checkpoint's barriers are injected into the
/// sources, and assignments travel to readers through the same ordered mailbox as triggers, so a
/// split is, in every checkpoint, either in the enumerator's state or in exactly one reader's.
pub trait SplitEnumerator: Send + 'static {
    /// Answers reader `subtask`, which has nothing left to read.
    fn assign(&mut self, subtask: u32) -> SplitAssignment;

    /// The unassigned splits, encoded: the coordinator's part of a checkpoint.
    fn snapshot(&self) -> Result<Vec<u8>, TaskError>;

    /// Replaces the unassigned splits with a checkpoint's; `None` when the checkpoint had this
    /// source but no enumerator state (nothing left to assign).
    fn restore(&mut self, state: Option<&[u8]>) -> Result<(), TaskError>;
}

/// The enumerator of an indexed source: `splits` splits over `0..count`, split `s` covering
/// indices `s, s + splits, …`.
#[derive(Debug)]
pub struct IndexSplitEnumerator {
    unassigned: std::collections::VecDeque<IndexSplit>,
    /// `Some(p)`: split `s` only ever goes to reader `s % p`, all of them at its first request
    /// (a source with watermarks: a split handed out later could start behind the watermark its
    /// reader already emitted, making its records late).
    owners: Option<u32>,
}

impl IndexSplitEnumerator {
    /// All `splits` splits unassigned (a fresh start).
    pub fn new(splits: u32) -> Self {
        let n = u64::from(splits.max(1));
        IndexSplitEnumerator {
            unassigned: (0..splits.max(1))
                .map(|s| IndexSplit {
                    split: s,
                    stride: n,
                    next: u64::from(s),
                })
                .collect(),
            owners: None,
        }
    }

    /// Like [`new`](Self::new), but split `s` belongs to reader `s % parallelism`, which gets
    /// every split it owns at its first request and nothing after: no reader is handed a split
    /// once its watermark has moved on.
    pub fn owned(splits: u32, parallelism: u32) -> Self {
        IndexSplitEnumerator {
            owners: Some(parallelism.max(1)),
            ..Self::new(splits)
        }
    }

    fn take(&mut self, subtask: u32) -> Vec<IndexSplit> {
        match self.owners {
            None => self.unassigned.pop_front().into_iter().collect(),
            Some(p) => {
                let (mine, rest): (Vec<_>, Vec<_>) = std::mem::take(&mut self.unassigned)
                    .into_iter()
                    .partition(|s| s.split % p == subtask);
                self.unassigned = rest.into();
                mine
            }
        }
    }
}

impl SplitEnumerator for IndexSplitEnumerator {
    fn assign(&mut self, subtask: u32) -> SplitAssignment {
        let splits = self.take(subtask);
        if splits.is_empty() {
            return SplitAssignment::NoMoreSplits;
        }
        let encoded: Result<Vec<_>, _> = splits
            .iter()
            .map(|split| weir_core::codec::encode("index split", split))
            .collect();
        match encoded {
            Ok(bytes) => SplitAssignment::Splits(bytes),
            // Encoding a plain struct does not fail; if it did, the splits go back unassigned.
            Err(_) => {
                self.unassigned.extend(splits);
                SplitAssignment::NoMoreSplits
            }
        }
    }

    fn snapshot(&self) -> Result<Vec<u8>, TaskError> {
        let splits: Vec<IndexSplit> = self.unassigned.iter().copied().collect();
        Ok(weir_core::codec::encode("index split enumerator", &splits)
            .map_err(weir_state::StateError::from)?)
    }

    fn restore(&mut self, state: Option<&[u8]>) -> Result<(), TaskError> {
        self.unassigned = match state {
            Some(bytes) => {
                weir_core::codec::decode::<Vec<IndexSplit>>("index split enumerator", bytes)
                    .map_err(weir_state::StateError::from)?
                    .into_iter()
                    .collect()
            }
            None => Default::default(),
        };
        Ok(())
    }
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
///
/// Its splits come from an [`IndexSplitEnumerator`]: a reader starts with none (or with those it
/// restored), asks for one when it has nothing left to read, and ends when the enumerator has no
/// more.
pub struct IndexedSource<T> {
    make: Arc<dyn Fn(u64) -> T + Send + Sync>,
    count: Option<u64>,
    splits: Vec<IndexSplit>,
    state: Option<OperatorListState<IndexSplit>>,
    current: usize,
    no_more_splits: bool,
    /// Whether this reader has asked the enumerator for splits yet.
    asked: bool,
    /// Per-split watermarks, when the source generates them.
    watermarks: Option<crate::split_watermarks::SplitWatermarks<T>>,
}

impl<T: Send + 'static> IndexedSource<T> {
    /// Generates watermarks per split: each `bound_ms` behind the largest `timestamp` its split
    /// emitted, the source's the minimum over its splits.
    pub fn with_watermarks(
        mut self,
        timestamp: crate::split_watermarks::TimestampFn<T>,
        bound_ms: i64,
    ) -> Self {
        self.watermarks = Some(crate::split_watermarks::SplitWatermarks::new(
            timestamp, bound_ms,
        ));
        self
    }

    /// A source of `count` records (`None`: unbounded) where record `i` is `make(i)`.
    pub fn new(count: Option<u64>, make: Arc<dyn Fn(u64) -> T + Send + Sync>) -> Self {
        IndexedSource {
            make,
            count,
            splits: Vec::new(),
            state: None,
            current: 0,
            no_more_splits: false,
            asked: false,
            watermarks: None,
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
        // The splits this reader held at the checkpoint; the rest are the enumerator's.
        let _ = info;
        self.splits = state.get(&list)?;
        self.state = Some(list);
        if let Some(w) = &mut self.watermarks {
            w.open(state)?;
            for s in &self.splits {
                w.add_split(s.split);
            }
        }
        Ok(())
    }

    fn next_batch(&mut self, out: &mut Vec<T>, max: usize) -> Result<SourceStatus, TaskError> {
        // With watermarks a reader takes every split it will get before it emits anything (even
        // when it restored some): a split added after its watermark moved on would be late.
        if self.watermarks.is_some() && !self.asked && !self.no_more_splits {
            self.asked = true;
            return Ok(SourceStatus::NeedSplits);
        }
        let end = self.count.unwrap_or(u64::MAX);
        if let Some(w) = &mut self.watermarks {
            for s in self.splits.iter().filter(|s| s.next >= end) {
                w.remove_split(s.split);
            }
        }
        self.splits.retain(|s| s.next < end);
        if self.splits.is_empty() {
            self.current = 0;
            return Ok(if self.no_more_splits {
                SourceStatus::End
            } else {
                self.asked = true;
                SourceStatus::NeedSplits
            });
        }
        self.current %= self.splits.len();
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
            let first = out.len();
            for _ in 0..take {
                out.push((self.make)(i));
                i += stride;
            }
            s.next = i;
            if let Some(w) = &mut self.watermarks {
                w.emitted(s.split, &out[first..]);
            }
            self.current = (self.current + 1) % n;
        }
        Ok(SourceStatus::More)
    }

    fn add_splits(&mut self, splits: Vec<Vec<u8>>) -> Result<(), TaskError> {
        for bytes in splits {
            let split: IndexSplit = weir_core::codec::decode("index split", &bytes)
                .map_err(weir_state::StateError::from)?;
            if let Some(w) = &mut self.watermarks {
                w.add_split(split.split);
            }
            self.splits.push(split);
        }
        Ok(())
    }

    fn no_more_splits(&mut self) {
        self.no_more_splits = true;
    }

    fn snapshot_state(&mut self, state: &mut OperatorStateBackend) -> Result<(), TaskError> {
        if let Some(list) = &self.state {
            state.update(list, &self.splits)?;
        }
        if let Some(w) = &self.watermarks {
            w.snapshot(state)?;
        }
        Ok(())
    }

    fn current_watermark(&self) -> Option<i64> {
        let w = self.watermarks.as_ref()?;
        w.current(self.splits.iter().map(|s| s.split))
    }

    fn is_idle(&self) -> bool {
        self.watermarks
            .as_ref()
            .is_some_and(|w| w.all_idle(self.splits.iter().map(|s| s.split)))
    }
}

/// Flink's `RandomGenerator.intGenerator(min, max)` made deterministic: the value of record `i`
/// is a hash of `(seed, i)` mapped into `min..=max` (any range of `i64`, the full one included;
/// bounds given the wrong way round are swapped).
#[derive(Clone, Copy, Debug)]
pub struct RandomIntGenerator {
    seed: u64,
    min: i64,
    /// `max - min + 1`; 0 stands for the full 2^64 values.
    span: u64,
}

impl RandomIntGenerator {
    /// Values in `min..=max`.
    pub fn new(seed: u64, min: i64, max: i64) -> Self {
        let (min, max) = if min <= max { (min, max) } else { (max, min) };
        let span = (i128::from(max) - i128::from(min) + 1) as u128;
        RandomIntGenerator {
            seed,
            min,
            span: if span > u128::from(u64::MAX) {
                0
            } else {
                span as u64
            },
        }
    }

    /// The value of record `i`.
    #[inline]
    pub fn value(&self, i: u64) -> i64 {
        let h = splitmix64(self.seed ^ i.wrapping_mul(weir_core::splitmix::GOLDEN_GAMMA));
        let offset = if self.span == 0 { h } else { h % self.span };
        self.min.wrapping_add(offset as i64)
    }
}

/// SplitMix64's step and finalizer: a fast, well-mixed 64-bit hash (`weir_core::splitmix`).
pub use weir_core::splitmix::splitmix64;

/// Runs a source as the head of a chain: fills batches, pushes them down, and snapshots the
/// source's operator state.
pub struct SourceDriver<T> {
    operator_id: OperatorId,
    info: SubtaskInfo,
    source: Box<dyn SourceFunction<T>>,
    state: OperatorStateBackend,
    next: Box<dyn Output<T>>,
    batch_size: usize,
    /// The last watermark the source generated and the driver emitted.
    emitted_watermark: i64,
    /// The driver told the downstream that the source is idle.
    idle: bool,
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
            emitted_watermark: i64::MIN,
            idle: false,
        }
    }

    /// Emits one batch; returns how many records and the source's status.
    pub fn emit_batch(&mut self) -> Result<(usize, SourceStatus), TaskError> {
        let mut batch = Vec::with_capacity(self.batch_size);
        let status = self.source.next_batch(&mut batch, self.batch_size)?;
        let n = batch.len();
        if n > 0 && self.idle {
            self.idle = false;
            self.next
                .watermark_status(weir_core::element::WatermarkStatus::Active)?;
        }
        if n > 0 {
            match self.next.push_batch(batch) {
                // Cancelled part way through the chain: the batch was emitted all the same (and
                // counted, so no operator saw more records than the sources emitted). The task
                // stops at its next step.
                Err(TaskError::Canceled) => {}
                other => other?,
            }
        }
        if let Some(w) = self.source.current_watermark()
            && w > self.emitted_watermark
        {
            self.emitted_watermark = w;
            // A watermark is activity: say so first (downstream ignores an idle channel's).
            if self.idle {
                self.idle = false;
                self.next
                    .watermark_status(weir_core::element::WatermarkStatus::Active)?;
            }
            self.next.watermark(weir_core::element::Watermark(w))?;
        }
        if n == 0 && !self.idle && self.source.is_idle() {
            self.idle = true;
            self.next
                .watermark_status(weir_core::element::WatermarkStatus::Idle)?;
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
            Lifecycle::Snapshot(id, _, parts) => {
                self.source.snapshot_checkpoint(*id, &mut self.state)?;
                parts.push(OperatorSnapshotParts::operator_state(
                    self.operator_id,
                    &self.state,
                ));
            }
            Lifecycle::NotifyComplete(id) => self.source.notify_checkpoint_complete(*id)?,
            _ => {}
        }
        self.next.lifecycle(event)
    }

    /// Hands the enumerator's answer to the source.
    pub fn assigned(&mut self, assignment: SplitAssignment) -> OpResult {
        match assignment {
            SplitAssignment::Splits(splits) => self.source.add_splits(splits),
            SplitAssignment::NoMoreSplits => {
                self.source.no_more_splits();
                Ok(())
            }
        }
    }

    /// Event time advanced (for a source: to the end, at its end or before a drained stop).
    /// An idle source says it is active first: downstream ignores an idle channel's watermark.
    pub fn watermark(&mut self, watermark: weir_core::element::Watermark) -> OpResult {
        if self.idle {
            self.idle = false;
            self.next
                .watermark_status(weir_core::element::WatermarkStatus::Active)?;
        }
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
            processing_time: Default::default(),
            snapshot_compression: Default::default(),
            incremental: None,
            state_backend: std::sync::Arc::new(weir_state::HeapStateBackend),
            index,
            parallelism,
            max_parallelism: 128,
            attempt: 0,
            task_name: "src".into(),
            restored,
            cancellation: Default::default(),
        }
    }

    /// Reads everything, asking `e` for splits as a task would.
    fn drain(src: &mut IndexedSource<u64>, e: &mut IndexSplitEnumerator, max: usize) -> Vec<u64> {
        let mut all = Vec::new();
        loop {
            let mut b = Vec::new();
            let st = src.next_batch(&mut b, max).unwrap();
            all.extend(b);
            match st {
                SourceStatus::End => return all,
                SourceStatus::NeedSplits => match e.assign(0) {
                    SplitAssignment::Splits(s) => src.add_splits(s).unwrap(),
                    SplitAssignment::NoMoreSplits => src.no_more_splits(),
                },
                _ => {}
            }
        }
    }

    /// A reader of several splits, read a batch at a time: every record it emits after a
    /// watermark is above it (nothing is late), though the records interleave far out of order;
    /// and a restored reader resumes each split's watermark.
    #[test]
    fn per_split_watermarks_never_pass_a_record_still_to_come() {
        let mut src = IndexedSource::new(Some(3_000), Arc::new(|i| i))
            .with_watermarks(Arc::new(|t: &u64| *t as i64), 0);
        let mut state = OperatorStateBackend::new();
        src.open(&info(0, 1, false), &mut state).unwrap();
        // One reader owns all three splits and gets them at its first request.
        let mut e = IndexSplitEnumerator::owned(3, 1);
        let (mut watermark, mut emitted, mut disorder) = (i64::MIN, 0u64, 0i64);
        let mut max_seen = i64::MIN;
        loop {
            let mut b = Vec::new();
            let st = src.next_batch(&mut b, 50).unwrap();
            if st == SourceStatus::NeedSplits {
                match e.assign(0) {
                    SplitAssignment::Splits(s) => {
                        assert_eq!(s.len(), 3, "every owned split at once");
                        src.add_splits(s).unwrap()
                    }
                    SplitAssignment::NoMoreSplits => src.no_more_splits(),
                }
                continue;
            }
            for &r in &b {
                assert!(
                    r as i64 > watermark,
                    "record {r} behind watermark {watermark}"
                );
                disorder = disorder.max(max_seen - r as i64);
                max_seen = max_seen.max(r as i64);
            }
            emitted += b.len() as u64;
            if let Some(w) = src.current_watermark() {
                assert!(w >= watermark, "the watermark went back");
                watermark = w;
            }
            if emitted == 1_500 {
                src.snapshot_state(&mut state).unwrap();
                let mut restored = IndexedSource::new(Some(3_000), Arc::new(|i| i))
                    .with_watermarks(Arc::new(|t: &u64| *t as i64), 0);
                restored.open(&info(0, 1, true), &mut state).unwrap();
                assert_eq!(restored.current_watermark(), src.current_watermark());
            }
            if st == SourceStatus::End || b.is_empty() {
                break;
            }
        }
        assert_eq!(emitted, 3_000);
        assert!(disorder > 100, "the splits interleave: disorder {disorder}");
        assert!(watermark > 2_900, "{watermark}");
    }

    /// A watermarked reader that finishes its split early is not handed another reader's: the
    /// other's records would start behind the watermark it already emitted.
    #[test]
    fn owned_splits_go_to_their_reader_only_and_all_at_once() {
        let mut e = IndexSplitEnumerator::owned(4, 2);
        let decode = |a: SplitAssignment| match a {
            SplitAssignment::Splits(s) => s
                .iter()
                .map(|b| {
                    weir_core::codec::decode::<IndexSplit>("t", b)
                        .unwrap()
                        .split
                })
                .collect::<Vec<_>>(),
            SplitAssignment::NoMoreSplits => vec![],
        };
        assert_eq!(decode(e.assign(0)), vec![0, 2]);
        assert_eq!(e.assign(0), SplitAssignment::NoMoreSplits);
        // A checkpoint taken now holds reader 1's splits; restored at parallelism 3 they go by
        // the new count (split 1 to reader 1, split 3 to reader 0).
        let state = e.snapshot().unwrap();
        let mut r = IndexSplitEnumerator::owned(3, 3);
        r.restore(Some(&state)).unwrap();
        assert_eq!(decode(r.assign(2)), Vec::<u32>::new());
        assert_eq!(decode(r.assign(1)), vec![1]);
        assert_eq!(decode(r.assign(0)), vec![3]);
        assert_eq!(decode(e.assign(1)), vec![1, 3]);
    }

    /// A watermarked reader that restored splits still asks the enumerator before it emits a
    /// record, so a split it is given is never behind its watermark.
    #[test]
    fn a_restored_watermarked_reader_asks_before_emitting() {
        let mut state = OperatorStateBackend::new();
        let mut e = IndexSplitEnumerator::owned(2, 1);
        let mut src = IndexedSource::new(Some(100), Arc::new(|i| i))
            .with_watermarks(Arc::new(|t: &u64| *t as i64), 0);
        src.open(&info(0, 1, false), &mut state).unwrap();
        let mut b = Vec::new();
        assert_eq!(
            src.next_batch(&mut b, 10).unwrap(),
            SourceStatus::NeedSplits
        );
        match e.assign(0) {
            SplitAssignment::Splits(s) => src.add_splits(s.into_iter().take(1).collect()).unwrap(),
            other => panic!("{other:?}"),
        }
        assert_eq!(src.next_batch(&mut b, 10).unwrap(), SourceStatus::More);
        src.snapshot_state(&mut state).unwrap();
        let mut restored = IndexedSource::new(Some(100), Arc::new(|i| i))
            .with_watermarks(Arc::new(|t: &u64| *t as i64), 0);
        restored.open(&info(0, 1, true), &mut state).unwrap();
        let mut b = Vec::new();
        assert_eq!(
            restored.next_batch(&mut b, 10).unwrap(),
            SourceStatus::NeedSplits
        );
        assert!(b.is_empty());
        restored.no_more_splits();
        assert_eq!(restored.next_batch(&mut b, 10).unwrap(), SourceStatus::More);
        assert_eq!(b.first(), Some(&20));
    }

    #[test]
    fn readers_cover_every_index_once_whatever_the_split_count() {
        for splits in [1u32, 2, 3, 4] {
            for readers in [1usize, 2, 3] {
                let mut e = IndexSplitEnumerator::new(splits);
                let mut sources: Vec<IndexedSource<u64>> = (0..readers)
                    .map(|i| {
                        let mut s = IndexedSource::new(Some(103), Arc::new(|i| i));
                        s.open(
                            &info(i as u32, readers as u32, false),
                            &mut OperatorStateBackend::new(),
                        )
                        .unwrap();
                        s
                    })
                    .collect();
                let mut all = Vec::new();
                for s in &mut sources {
                    all.extend(drain(s, &mut e, 7));
                }
                all.sort();
                assert_eq!(
                    all,
                    (0..103).collect::<Vec<_>>(),
                    "splits={splits} readers={readers}"
                );
            }
        }
    }

    #[test]
    fn snapshot_and_restore_resume_after_the_last_record() {
        let mut e = IndexSplitEnumerator::new(2);
        let mut s = IndexedSource::new(Some(50), Arc::new(|i| i));
        let mut st = OperatorStateBackend::new();
        s.open(&info(0, 2, false), &mut st).unwrap();
        let mut first = Vec::new();
        assert_eq!(
            s.next_batch(&mut first, 10).unwrap(),
            SourceStatus::NeedSplits
        );
        match e.assign(0) {
            SplitAssignment::Splits(sp) => s.add_splits(sp).unwrap(),
            other => panic!("{other:?}"),
        }
        s.next_batch(&mut first, 10).unwrap();
        // The checkpoint: the enumerator first, then the reader.
        let enumerator_state = e.snapshot().unwrap();
        s.snapshot_state(&mut st).unwrap();
        let mut blob = Vec::new();
        st.snapshot().write_to(&mut blob).unwrap();

        let mut e2 = IndexSplitEnumerator::new(2);
        e2.restore(Some(&enumerator_state)).unwrap();
        let mut restored_state = OperatorStateBackend::new();
        restored_state.restore(&[&blob]).unwrap();
        let mut r = IndexedSource::new(Some(50), Arc::new(|i| i));
        r.open(&info(0, 2, true), &mut restored_state).unwrap();
        let mut all = first.clone();
        all.extend(drain(&mut r, &mut e2, 10));
        all.sort();
        assert_eq!(all, (0..50).collect::<Vec<_>>(), "each index once");
        // A restore with no enumerator state has nothing to assign.
        let mut e3 = IndexSplitEnumerator::new(2);
        e3.restore(None).unwrap();
        assert_eq!(e3.assign(0), SplitAssignment::NoMoreSplits);
    }

    #[test]
    fn generator_takes_any_range_without_panicking() {
        let full = RandomIntGenerator::new(1, i64::MIN, i64::MAX);
        let _ = (0..100).map(|i| full.value(i)).collect::<Vec<_>>();
        let one = RandomIntGenerator::new(1, 5, 5);
        assert!((0..100).all(|i| one.value(i) == 5));
        let swapped = RandomIntGenerator::new(1, 9, 1);
        assert!((0..1000).all(|i| (1..=9).contains(&swapped.value(i))));
        let top = RandomIntGenerator::new(1, i64::MAX - 2, i64::MAX);
        assert!((0..1000).all(|i| top.value(i) >= i64::MAX - 2));
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
