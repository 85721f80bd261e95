//! Which windows a record belongs to (Flink's `WindowAssigner`s), and when a window fires by
//! default (its trigger): tumbling, sliding and session windows in event or processing time,
//! and the global window with a count trigger.

use serde::{Deserialize, Serialize};
use std::time::Duration;

/// A window of time `[start, end)`, in ms (Flink's `TimeWindow`); the global window, which
/// spans all of time, is the one [`TimeWindow::GLOBAL`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct TimeWindow {
    /// The first millisecond in the window.
    pub start: i64,
    /// The first millisecond after it.
    pub end: i64,
}

impl TimeWindow {
    /// The one window of [`GlobalWindows`] (Flink's `GlobalWindow`). It stands for all of
    /// time, but is written `[i64::MIN, i64::MIN)`, a window no assigner of time makes (every
    /// one ends after it starts, or at the end of time): a session that grows to span
    /// `[i64::MIN, i64::MAX)` stays a window of time, with a timer that fires.
    pub const GLOBAL: TimeWindow = TimeWindow {
        start: i64::MIN,
        end: i64::MIN,
    };

    /// `[start, end)`.
    pub fn new(start: i64, end: i64) -> Self {
        TimeWindow { start, end }
    }

    /// The largest timestamp in the window: its timers fire when time reaches it (`i64::MAX`
    /// for the global window, which time never passes).
    pub fn max_timestamp(&self) -> i64 {
        if *self == TimeWindow::GLOBAL {
            i64::MAX
        } else {
            self.end.saturating_sub(1)
        }
    }

    /// Whether the two windows overlap or touch (session windows that do are merged).
    pub fn intersects(&self, other: &TimeWindow) -> bool {
        self.start <= other.end && self.end >= other.start
    }

    /// The smallest window covering both.
    pub fn cover(&self, other: &TimeWindow) -> TimeWindow {
        TimeWindow {
            start: self.start.min(other.start),
            end: self.end.max(other.end),
        }
    }
}

/// Whose clock assigns and fires windows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WindowTime {
    /// The record's timestamp; windows fire on watermarks.
    EventTime,
    /// The wall clock when the record arrives; windows fire on processing-time timers.
    ProcessingTime,
}

/// How records are grouped into windows. Build one with the Flink-named constructors:
/// [`TumblingEventTimeWindows::of`], [`SlidingEventTimeWindows::of`],
/// [`EventTimeSessionWindows::with_gap`], their processing-time twins, or
/// [`GlobalWindows::create`] with a [`Trigger::Count`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WindowAssigner {
    /// Fixed-size, non-overlapping windows.
    Tumbling {
        /// Window length, ms.
        size: i64,
        /// Shift of the window starts from the epoch, ms.
        offset: i64,
        /// Event or processing time.
        time: WindowTime,
    },
    /// Fixed-size windows starting every `slide` (a record is in `size / slide` of them).
    Sliding {
        /// Window length, ms.
        size: i64,
        /// Distance between window starts, ms.
        slide: i64,
        /// Shift of the window starts from the epoch, ms.
        offset: i64,
        /// Event or processing time.
        time: WindowTime,
    },
    /// Windows that grow while records come closer than `gap` to each other, and merge.
    Session {
        /// The inactivity that closes a session, ms.
        gap: i64,
        /// Event or processing time.
        time: WindowTime,
    },
    /// One window for all of time per key; it fires only by a [`Trigger::Count`].
    Global,
}

fn ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// Tumbling windows of event time (Flink's `TumblingEventTimeWindows`).
pub struct TumblingEventTimeWindows;
impl TumblingEventTimeWindows {
    /// Windows of `size`.
    pub fn of(size: Duration) -> WindowAssigner {
        WindowAssigner::Tumbling {
            size: ms(size),
            offset: 0,
            time: WindowTime::EventTime,
        }
    }
}

/// Tumbling windows of processing time (Flink's `TumblingProcessingTimeWindows`).
pub struct TumblingProcessingTimeWindows;
impl TumblingProcessingTimeWindows {
    /// Windows of `size`.
    pub fn of(size: Duration) -> WindowAssigner {
        WindowAssigner::Tumbling {
            size: ms(size),
            offset: 0,
            time: WindowTime::ProcessingTime,
        }
    }
}

/// Sliding windows of event time (Flink's `SlidingEventTimeWindows`).
pub struct SlidingEventTimeWindows;
impl SlidingEventTimeWindows {
    /// Windows of `size` starting every `slide`.
    pub fn of(size: Duration, slide: Duration) -> WindowAssigner {
        WindowAssigner::Sliding {
            size: ms(size),
            slide: ms(slide),
            offset: 0,
            time: WindowTime::EventTime,
        }
    }
}

/// Sliding windows of processing time (Flink's `SlidingProcessingTimeWindows`).
pub struct SlidingProcessingTimeWindows;
impl SlidingProcessingTimeWindows {
    /// Windows of `size` starting every `slide`.
    pub fn of(size: Duration, slide: Duration) -> WindowAssigner {
        WindowAssigner::Sliding {
            size: ms(size),
            slide: ms(slide),
            offset: 0,
            time: WindowTime::ProcessingTime,
        }
    }
}

/// Session windows of event time (Flink's `EventTimeSessionWindows`).
pub struct EventTimeSessionWindows;
impl EventTimeSessionWindows {
    /// Sessions closed by `gap` without records.
    pub fn with_gap(gap: Duration) -> WindowAssigner {
        WindowAssigner::Session {
            gap: ms(gap),
            time: WindowTime::EventTime,
        }
    }
}

/// Session windows of processing time (Flink's `ProcessingTimeSessionWindows`).
pub struct ProcessingTimeSessionWindows;
impl ProcessingTimeSessionWindows {
    /// Sessions closed by `gap` without records.
    pub fn with_gap(gap: Duration) -> WindowAssigner {
        WindowAssigner::Session {
            gap: ms(gap),
            time: WindowTime::ProcessingTime,
        }
    }
}

/// The global window (Flink's `GlobalWindows`): give it a [`Trigger::Count`].
pub struct GlobalWindows;
impl GlobalWindows {
    /// The assigner.
    pub fn create() -> WindowAssigner {
        WindowAssigner::Global
    }
}

impl WindowAssigner {
    /// Shifts the window starts by `offset` from the epoch (Flink's `withOffset`, e.g. for time
    /// zones); `offset` must be smaller than the size (or slide). No effect on sessions and the
    /// global window.
    pub fn with_offset(self, offset: Duration) -> WindowAssigner {
        match self {
            WindowAssigner::Tumbling { size, time, .. } => WindowAssigner::Tumbling {
                size,
                offset: ms(offset),
                time,
            },
            WindowAssigner::Sliding {
                size, slide, time, ..
            } => WindowAssigner::Sliding {
                size,
                slide,
                offset: ms(offset),
                time,
            },
            other => other,
        }
    }

    /// Whose clock the windows follow (the global window: event time's end never comes).
    pub fn time(&self) -> WindowTime {
        match self {
            WindowAssigner::Tumbling { time, .. }
            | WindowAssigner::Sliding { time, .. }
            | WindowAssigner::Session { time, .. } => *time,
            WindowAssigner::Global => WindowTime::EventTime,
        }
    }

    /// Whether windows merge (sessions).
    pub fn is_merging(&self) -> bool {
        matches!(self, WindowAssigner::Session { .. })
    }

    /// What is wrong with the assigner, if anything: checked when the job is built.
    pub fn validate(&self) -> Result<(), String> {
        match *self {
            WindowAssigner::Tumbling { size, offset, .. } => {
                if size <= 0 {
                    return Err("a tumbling window's size must be at least 1 ms".into());
                }
                if offset.abs() >= size {
                    return Err(format!(
                        "a tumbling window's offset ({offset} ms) must be smaller than its size \
                         ({size} ms)"
                    ));
                }
            }
            WindowAssigner::Sliding {
                size,
                slide,
                offset,
                ..
            } => {
                if size <= 0 || slide <= 0 {
                    return Err(format!(
                        "a sliding window's size ({size} ms) and slide ({slide} ms) must be at \
                         least 1 ms"
                    ));
                }
                if slide > size {
                    return Err(format!(
                        "a sliding window's slide ({slide} ms) must not be larger than its size \
                         ({size} ms): records between windows would be in none"
                    ));
                }
                if offset.abs() >= slide {
                    return Err(format!(
                        "a sliding window's offset ({offset} ms) must be smaller than its slide \
                         ({slide} ms)"
                    ));
                }
            }
            WindowAssigner::Session { gap, .. } => {
                if gap <= 0 {
                    return Err("a session window's gap must be at least 1 ms".into());
                }
            }
            WindowAssigner::Global => {}
        }
        Ok(())
    }

    /// The windows a record at `timestamp` belongs to, into `out` (cleared first). A session
    /// record gets its own window, merged with the key's others by the operator.
    pub fn assign(&self, timestamp: i64, out: &mut Vec<TimeWindow>) {
        out.clear();
        match *self {
            WindowAssigner::Tumbling { size, offset, .. } => {
                let start = window_start(timestamp, offset, size);
                out.push(TimeWindow::new(start, start.saturating_add(size)));
            }
            WindowAssigner::Sliding {
                size,
                slide,
                offset,
                ..
            } => {
                let mut start = window_start(timestamp, offset, slide);
                // Every window of `size` starting at a multiple of `slide` that holds the
                // timestamp: from the latest start back while the window still reaches it.
                let earliest = i128::from(timestamp) - i128::from(size);
                loop {
                    out.push(TimeWindow::new(start, start.saturating_add(size)));
                    match start.checked_sub(slide) {
                        Some(s) if i128::from(s) > earliest => start = s,
                        _ => break,
                    }
                }
            }
            WindowAssigner::Session { gap, .. } => {
                out.push(TimeWindow::new(timestamp, timestamp.saturating_add(gap)));
            }
            WindowAssigner::Global => out.push(TimeWindow::GLOBAL),
        }
    }
}

/// The start of the window of `size` (shifted by `offset`) that holds `timestamp` (Flink's
/// `TimeWindow.getWindowStartWithOffset`, correct for negative timestamps too).
pub fn window_start(timestamp: i64, offset: i64, size: i64) -> i64 {
    let remainder = (i128::from(timestamp) - i128::from(offset)).rem_euclid(i128::from(size));
    // Near the start of time the window's start is clamped to it.
    (i128::from(timestamp) - remainder).max(i128::from(i64::MIN)) as i64
}

/// When a window's contents are emitted (Flink's `Trigger`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Trigger {
    /// The assigner's own: at the window's end in its time (Flink's `EventTimeTrigger` and
    /// `ProcessingTimeTrigger`); the global window's never fires.
    Default,
    /// Every `n` records, emitting and then clearing the window (Flink's
    /// `PurgingTrigger.of(CountTrigger.of(n))`, as `countWindow` uses).
    Count(u64),
}

#[cfg(test)]
mod tests {
    use super::*;

    fn windows(a: WindowAssigner, ts: i64) -> Vec<TimeWindow> {
        let mut out = Vec::new();
        a.assign(ts, &mut out);
        out.sort();
        out
    }

    #[test]
    fn tumbling_windows_hold_their_start_and_not_their_end() {
        let a = TumblingEventTimeWindows::of(Duration::from_millis(10));
        assert_eq!(windows(a, 0), vec![TimeWindow::new(0, 10)]);
        assert_eq!(windows(a, 9), vec![TimeWindow::new(0, 10)]);
        assert_eq!(windows(a, 10), vec![TimeWindow::new(10, 20)]);
        assert_eq!(windows(a, -1), vec![TimeWindow::new(-10, 0)]);
        let shifted = a.with_offset(Duration::from_millis(3));
        assert_eq!(windows(shifted, 2), vec![TimeWindow::new(-7, 3)]);
        assert_eq!(windows(shifted, 3), vec![TimeWindow::new(3, 13)]);
        assert_eq!(TimeWindow::new(0, 10).max_timestamp(), 9);
    }

    #[test]
    fn a_record_is_in_size_over_slide_sliding_windows() {
        let a = SlidingEventTimeWindows::of(Duration::from_millis(10), Duration::from_millis(5));
        assert_eq!(
            windows(a, 7),
            vec![TimeWindow::new(0, 10), TimeWindow::new(5, 15)]
        );
        assert_eq!(
            windows(a, 5),
            vec![TimeWindow::new(0, 10), TimeWindow::new(5, 15)]
        );
        assert_eq!(
            windows(a, -3),
            vec![TimeWindow::new(-10, 0), TimeWindow::new(-5, 5)]
        );
        let thirds =
            SlidingEventTimeWindows::of(Duration::from_millis(9), Duration::from_millis(3));
        assert_eq!(windows(thirds, 100).len(), 3);
    }

    #[test]
    fn extreme_timestamps_saturate_instead_of_overflowing() {
        let a = SlidingEventTimeWindows::of(Duration::from_millis(10), Duration::from_millis(5));
        for ts in [i64::MIN, i64::MIN + 1, i64::MAX - 1, i64::MAX] {
            let w = windows(a, ts);
            assert!(!w.is_empty(), "{ts}");
            assert!(w.iter().all(|w| w.start <= ts && ts <= w.end), "{ts} {w:?}");
        }
        let t = TumblingEventTimeWindows::of(Duration::from_millis(7));
        assert_eq!(windows(t, i64::MAX)[0].end, i64::MAX);
    }

    #[test]
    fn bad_assigners_are_named() {
        let zero = TumblingEventTimeWindows::of(Duration::ZERO).validate();
        assert!(zero.unwrap_err().contains("at least 1 ms"));
        let wide = SlidingEventTimeWindows::of(Duration::from_millis(5), Duration::from_millis(10))
            .validate();
        assert!(
            wide.unwrap_err()
                .contains("must not be larger than its size")
        );
        let gap = EventTimeSessionWindows::with_gap(Duration::ZERO).validate();
        assert!(gap.unwrap_err().contains("gap"));
        let offset = TumblingEventTimeWindows::of(Duration::from_millis(5))
            .with_offset(Duration::from_millis(5))
            .validate();
        assert!(offset.unwrap_err().contains("offset"));
        assert!(GlobalWindows::create().validate().is_ok());
    }

    #[test]
    fn touching_sessions_intersect_and_cover_each_other() {
        let a = TimeWindow::new(0, 10);
        assert!(a.intersects(&TimeWindow::new(10, 20)));
        assert!(!a.intersects(&TimeWindow::new(11, 20)));
        assert_eq!(a.cover(&TimeWindow::new(5, 30)), TimeWindow::new(0, 30));
        assert_eq!(TimeWindow::GLOBAL.max_timestamp(), i64::MAX);
        // A session spanning all of time is not the global window: its end timer fires.
        let all = TimeWindow::new(i64::MIN, 5).cover(&TimeWindow::new(0, i64::MAX));
        assert_ne!(all, TimeWindow::GLOBAL);
        assert_eq!(all.max_timestamp(), i64::MAX - 1);
        // No assigner of time makes the global window, at either end of time.
        let session = EventTimeSessionWindows::with_gap(Duration::from_millis(1));
        let tumbling = TumblingEventTimeWindows::of(Duration::from_millis(1));
        for ts in [i64::MIN, i64::MIN + 1, i64::MAX] {
            assert!(!windows(session, ts).contains(&TimeWindow::GLOBAL), "{ts}");
            assert!(!windows(tumbling, ts).contains(&TimeWindow::GLOBAL), "{ts}");
        }
    }
}
