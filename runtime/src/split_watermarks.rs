//! Watermarks generated inside a source, one per split (Flink's `fromSource(source,
//! WatermarkStrategy)` with per-split watermarks): each split's watermark trails the largest
//! timestamp it emitted by the bound, and the source's watermark is the minimum over the splits
//! it reads. A reader that reads several splits a batch at a time (or is handed another split
//! later) interleaves records far more out of order than any one split: a watermark computed
//! after the source would call many of them late; per split it does not.
//!
//! Each split's largest timestamp is checkpointed (union list state
//! `source-split-watermarks`), so a split restored or reassigned after a rescale resumes its
//! watermark where the checkpoint left it.

use crate::error::TaskError;
use std::collections::BTreeMap;
use std::sync::Arc;
use weir_core::handle::OperatorStateMode;
use weir_state::{OperatorListState, OperatorStateBackend};

/// A record's event time, in ms.
pub type TimestampFn<T> = Arc<dyn Fn(&T) -> i64 + Send + Sync>;

const STATE: &str = "source-split-watermarks";

/// The per-split watermark state of one source reader.
pub struct SplitWatermarks<T> {
    timestamp: TimestampFn<T>,
    bound_ms: i64,
    /// The largest timestamp each split emitted (a split absent has emitted nothing).
    max_timestamp: BTreeMap<u32, i64>,
    /// Every split's largest timestamp in the restored checkpoint (union state: all readers').
    restored: BTreeMap<u32, i64>,
    state: Option<OperatorListState<(u32, i64)>>,
}

impl<T> SplitWatermarks<T> {
    /// Watermarks `bound_ms` behind each split's largest `timestamp` (minus 1 ms, as Flink's
    /// bounded out-of-orderness).
    pub fn new(timestamp: TimestampFn<T>, bound_ms: i64) -> Self {
        SplitWatermarks {
            timestamp,
            bound_ms,
            max_timestamp: BTreeMap::new(),
            restored: BTreeMap::new(),
            state: None,
        }
    }

    /// Registers the state and reads every split's restored largest timestamp.
    pub fn open(&mut self, state: &mut OperatorStateBackend) -> Result<(), TaskError> {
        let list = state.list_state::<(u32, i64)>(STATE, OperatorStateMode::Union)?;
        self.restored = state.get(&list)?.into_iter().collect();
        self.state = Some(list);
        Ok(())
    }

    /// A split this reader now reads: it resumes its restored watermark, if it has one.
    pub fn add_split(&mut self, split: u32) {
        if let Some(&ts) = self.restored.get(&split) {
            let e = self.max_timestamp.entry(split).or_insert(ts);
            *e = (*e).max(ts);
        }
    }

    /// `records` were just emitted from `split`.
    pub fn emitted(&mut self, split: u32, records: &[T]) {
        if let Some(max) = records.iter().map(|r| (self.timestamp)(r)).max() {
            let e = self.max_timestamp.entry(split).or_insert(i64::MIN);
            *e = (*e).max(max);
        }
    }

    /// The reader no longer reads `split` (it is exhausted).
    pub fn remove_split(&mut self, split: u32) {
        self.max_timestamp.remove(&split);
    }

    /// The reader's watermark over `splits` (the ones it reads now): the minimum of theirs;
    /// `None` until each has emitted a record (or when it reads none).
    pub fn current(&self, splits: impl Iterator<Item = u32>) -> Option<i64> {
        let mut min: Option<i64> = None;
        for s in splits {
            let ts = *self.max_timestamp.get(&s)?;
            min = Some(min.map_or(ts, |m| m.min(ts)));
        }
        min.map(|ts| ts.saturating_sub(self.bound_ms).saturating_sub(1))
    }

    /// Records each split's largest timestamp (the synchronous part of a snapshot).
    pub fn snapshot(&self, state: &mut OperatorStateBackend) -> Result<(), TaskError> {
        if let Some(list) = &self.state {
            let entries: Vec<(u32, i64)> =
                self.max_timestamp.iter().map(|(s, t)| (*s, *t)).collect();
            state.update(list, &entries)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_watermark_is_the_slowest_split_s_and_waits_for_every_split() {
        let mut w = SplitWatermarks::<i64>::new(Arc::new(|t: &i64| *t), 10);
        w.emitted(0, &[100, 105, 103]);
        assert_eq!(
            w.current([0, 1].into_iter()),
            None,
            "split 1 emitted nothing"
        );
        w.emitted(1, &[40, 42]);
        assert_eq!(w.current([0, 1].into_iter()), Some(42 - 10 - 1));
        w.remove_split(1);
        assert_eq!(w.current([0].into_iter()), Some(105 - 10 - 1));
        w.emitted(0, &[]);
        assert_eq!(w.current(std::iter::empty()), None);
    }

    #[test]
    fn a_restored_split_resumes_its_watermark() {
        let mut w = SplitWatermarks::<i64>::new(Arc::new(|t: &i64| *t), 0);
        w.restored = [(3, 500), (4, 600)].into_iter().collect();
        w.add_split(4);
        assert_eq!(w.current([4].into_iter()), Some(599));
        w.emitted(4, &[550]);
        assert_eq!(w.current([4].into_iter()), Some(599), "never backwards");
        w.add_split(9);
        assert_eq!(
            w.current([4, 9].into_iter()),
            None,
            "a new split holds it back"
        );
    }
}
