//! Watermarks generated inside a source, one per split (Flink's `fromSource(source,
//! WatermarkStrategy)` with per-split watermarks): each split's watermark trails the largest
//! timestamp it emitted by the bound, and the source's watermark is the minimum over the splits
//! it reads. A reader that reads several splits a batch at a time (or is handed another split
//! later) interleaves records far more out of order than any one split: a watermark computed
//! after the source would call many of them late; per split it does not.
//!
//! With idleness ([`SplitWatermarks::with_idleness`]), a split that emitted nothing for a while
//! stops holding back the reader's watermark, and a reader whose every split is idle is idle
//! itself (`SourceFunction::is_idle`): a partition with no data does not stop event time.
//!
//! Each split's largest timestamp is checkpointed (union list state
//! `source-split-watermarks`), so a split restored or reassigned after a rescale resumes its
//! watermark where the checkpoint left it.

use crate::error::TaskError;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};
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
    /// A split idle this long does not hold the watermark back.
    idle_timeout: Option<Duration>,
    /// When each split was added or last emitted a record.
    last_active: BTreeMap<u32, Instant>,
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
            idle_timeout: None,
            last_active: BTreeMap::new(),
        }
    }

    /// A split that emitted nothing for `timeout` is idle: it does not hold the watermark back
    /// until it emits again.
    pub fn with_idleness(mut self, timeout: Duration) -> Self {
        self.idle_timeout = Some(timeout);
        self
    }

    fn is_split_idle(&self, split: u32, now: Instant) -> bool {
        match (self.idle_timeout, self.last_active.get(&split)) {
            (Some(timeout), Some(last)) => now.saturating_duration_since(*last) >= timeout,
            _ => false,
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
        self.last_active.insert(split, Instant::now());
        if let Some(&ts) = self.restored.get(&split) {
            let e = self.max_timestamp.entry(split).or_insert(ts);
            *e = (*e).max(ts);
        }
    }

    /// `records` were just emitted from `split`.
    pub fn emitted(&mut self, split: u32, records: &[T]) {
        if let Some(max) = records.iter().map(|r| (self.timestamp)(r)).max() {
            self.last_active.insert(split, Instant::now());
            let e = self.max_timestamp.entry(split).or_insert(i64::MIN);
            *e = (*e).max(max);
        }
    }

    /// The reader no longer reads `split` (it is exhausted).
    pub fn remove_split(&mut self, split: u32) {
        self.max_timestamp.remove(&split);
        self.last_active.remove(&split);
    }

    /// The reader's watermark over `splits` (the ones it reads now): the minimum of theirs;
    /// `None` until each has emitted a record (or when it reads none).
    /// Idle splits do not count; `None` when every split is idle.
    pub fn current(&self, splits: impl Iterator<Item = u32>) -> Option<i64> {
        self.current_at(splits, Instant::now())
    }

    /// [`current`](Self::current) as of `now`.
    pub fn current_at(&self, splits: impl Iterator<Item = u32>, now: Instant) -> Option<i64> {
        let mut min: Option<i64> = None;
        for s in splits.filter(|s| !self.is_split_idle(*s, now)) {
            let ts = *self.max_timestamp.get(&s)?;
            min = Some(min.map_or(ts, |m| m.min(ts)));
        }
        min.map(|ts| ts.saturating_sub(self.bound_ms).saturating_sub(1))
    }

    /// Whether every one of `splits` is idle (false for none: a reader without splits waits
    /// for the enumerator, or ends).
    pub fn all_idle(&self, splits: impl Iterator<Item = u32>) -> bool {
        let now = Instant::now();
        let mut any = false;
        for s in splits {
            if !self.is_split_idle(s, now) {
                return false;
            }
            any = true;
        }
        any
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
    fn an_idle_split_stops_holding_the_watermark_back_until_it_emits() {
        let mut w = SplitWatermarks::<i64>::new(Arc::new(|t: &i64| *t), 0)
            .with_idleness(Duration::from_millis(100));
        w.add_split(0);
        w.add_split(1);
        w.emitted(0, &[500]);
        w.emitted(1, &[40]);
        let now = Instant::now();
        assert_eq!(w.current_at([0, 1].into_iter(), now), Some(39));
        // Split 1 went quiet for the timeout; split 0 kept emitting.
        w.last_active.insert(1, now - Duration::from_millis(150));
        assert_eq!(w.current_at([0, 1].into_iter(), now), Some(499));
        assert!(!w.all_idle([0, 1].into_iter()));
        w.last_active.insert(0, now - Duration::from_millis(150));
        assert_eq!(w.current_at([0, 1].into_iter(), now), None, "all idle");
        assert!(w.all_idle([0, 1].into_iter()));
        assert!(!w.all_idle(std::iter::empty()));
        // Split 1 emits again: it counts again.
        w.emitted(1, &[60]);
        assert_eq!(w.current_at([0, 1].into_iter(), Instant::now()), Some(59));
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
