//! The window operator (Flink's `WindowOperator`): assigns each record to its windows, keeps
//! each window's accumulator in keyed state, and fires windows on the key's timers.
//!
//! Per key, one value state maps each open window to its contents, so windows are in every
//! checkpoint and savepoint, rescale by key group, and live in whichever state backend the job
//! chose. Each window registers a timer at its end (`max_timestamp`) and, in event time, one at
//! its cleanup time (end plus the allowed lateness); both are ordinary keyed timers. A timer
//! looks the key's windows up when it fires: one left behind by a merged session finds nothing.

use crate::error::TaskError;
use crate::keyed::{Collector, KeyFn, KeyedBase, TimerService};
use crate::operator::{Lifecycle, OneInputOperator, OpResult, Output, ProcessingTimeService};
use crate::window::assigner::{TimeWindow, Trigger, WindowAssigner, WindowTime};
use crate::window::function::{WindowContents, WindowFunction, WindowInfo};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::task::{Context, Poll};
use weir_core::element::Watermark;
use weir_core::keygroup::KeyGroup;
use weir_state::{KeyedStateBackend, StateKey, ValueState, ValueStateDescriptor};

use crate::keyed::TimeDomain;

/// What a window operator emits: a window's result, or a record too late for any window
/// (Flink's late-data side output).
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub enum WindowOutput<O, T> {
    /// A fired window's result.
    Result(O),
    /// A record whose windows had all been cleaned up when it arrived.
    Late(T),
}

/// A record's event time, in ms.
pub type TimestampFn<T> = Arc<dyn Fn(&T) -> i64 + Send + Sync>;

/// The state name of the windows' contents.
const CONTENTS_STATE: &str = "window-contents";

type Contents<A> = BTreeMap<TimeWindow, WindowContents<A>>;

/// The window settings of one operator, as a [`WindowedStream`](super::WindowedStream)
/// collects them.
pub struct WindowSpec<T> {
    pub(crate) assigner: WindowAssigner,
    pub(crate) trigger: Trigger,
    /// Allowed lateness, ms.
    pub(crate) lateness: i64,
    /// Event time of a record (for event-time assigners).
    pub(crate) timestamp: Option<TimestampFn<T>>,
}

impl<T> Clone for WindowSpec<T> {
    fn clone(&self) -> Self {
        WindowSpec {
            assigner: self.assigner,
            trigger: self.trigger,
            lateness: self.lateness,
            timestamp: self.timestamp.clone(),
        }
    }
}

/// Runs a [`WindowFunction`] over the windows of a keyed stream.
pub(crate) struct WindowOperator<K: StateKey, T, O, F: WindowFunction<K, T, O>> {
    base: KeyedBase<K>,
    key: KeyFn<T, K>,
    spec: WindowSpec<T>,
    function: F,
    state: Option<ValueState<Contents<F::Acc>>>,
    timers: Option<TimerService<K>>,
    /// The windows of the record being placed (reused).
    assigned: Vec<TimeWindow>,
    _out: std::marker::PhantomData<fn() -> O>,
}

fn not_open() -> TaskError {
    TaskError::Operator {
        operator: "Window".into(),
        message: "a record arrived before the operator was opened".into(),
    }
}

/// Window results into the operator's output.
struct Results<'a, O, T> {
    out: &'a mut dyn Output<WindowOutput<O, T>>,
}

impl<O: Send, T: Send> Output<O> for Results<'_, O, T> {
    fn push(&mut self, record: O) -> OpResult {
        self.out.push(WindowOutput::Result(record))
    }

    fn watermark(&mut self, watermark: Watermark) -> OpResult {
        self.out.watermark(watermark)
    }

    fn watermark_status(&mut self, status: weir_core::element::WatermarkStatus) -> OpResult {
        self.out.watermark_status(status)
    }

    fn lifecycle(&mut self, event: &mut Lifecycle<'_>) -> OpResult {
        self.out.lifecycle(event)
    }

    fn poll_flush(&mut self, cx: &mut Context<'_>) -> Poll<OpResult> {
        self.out.poll_flush(cx)
    }
}

impl<K, T, O, F> WindowOperator<K, T, O, F>
where
    K: StateKey,
    T: Clone + Send + 'static,
    O: Send + 'static,
    F: WindowFunction<K, T, O>,
{
    pub(crate) fn new(
        base: KeyedBase<K>,
        key: KeyFn<T, K>,
        spec: WindowSpec<T>,
        function: F,
    ) -> Self {
        WindowOperator {
            base,
            key,
            spec,
            function,
            state: None,
            timers: None,
            assigned: Vec::new(),
            _out: std::marker::PhantomData,
        }
    }

    fn time(&self) -> WindowTime {
        self.spec.assigner.time()
    }

    /// When a window's contents go: in event time its end plus the allowed lateness; in
    /// processing time its end; the global window's never.
    fn cleanup_time(&self, window: &TimeWindow) -> i64 {
        if *window == TimeWindow::GLOBAL {
            return i64::MAX;
        }
        match self.time() {
            WindowTime::EventTime => window.max_timestamp().saturating_add(self.spec.lateness),
            WindowTime::ProcessingTime => window.max_timestamp(),
        }
    }

    fn is_window_late(&self, window: &TimeWindow, watermark: i64) -> bool {
        self.time() == WindowTime::EventTime && self.cleanup_time(window) <= watermark
    }

    fn domain(&self) -> TimeDomain {
        match self.time() {
            WindowTime::EventTime => TimeDomain::EventTime,
            WindowTime::ProcessingTime => TimeDomain::ProcessingTime,
        }
    }

    /// Emits `window` of `key` (its contents as they are now).
    fn emit(
        &mut self,
        key: &K,
        key_group: KeyGroup,
        window: TimeWindow,
        out: &mut dyn Output<WindowOutput<O, T>>,
    ) -> OpResult {
        let (Some(state), Some(timers)) = (self.state, self.timers.as_ref()) else {
            return Err(not_open());
        };
        let info = WindowInfo {
            window,
            current_watermark: timers.current_watermark(),
            current_processing_time: ProcessingTimeService::now_ms(),
        };
        let Some(contents) = self
            .base
            .backend
            .value(state, key, key_group)
            .and_then(|m| m.get(&window))
        else {
            return Ok(());
        };
        let mut results = Results { out };
        self.function
            .emit(key, &info, &contents.acc, &mut Collector::new(&mut results))
    }

    /// Removes `window` of `key`, and the key's entry with its last window.
    fn purge(&mut self, key: &K, key_group: KeyGroup, window: &TimeWindow) {
        let Some(state) = self.state else { return };
        let backend = &mut self.base.backend;
        if !backend
            .value(state, key, key_group)
            .is_some_and(|m| m.contains_key(window))
        {
            return;
        }
        let map = backend.value_mut_or_insert(state, key, key_group, BTreeMap::new);
        map.remove(window);
        if map.is_empty() {
            backend.clear(state, key, key_group);
        }
    }

    /// Registers the timers `window` still needs: its end, unless time has passed it (a late
    /// record fired it at once), and its cleanup when that is later.
    fn register_timers(&mut self, key: &K, key_group: KeyGroup, window: &TimeWindow) -> OpResult {
        if *window == TimeWindow::GLOBAL {
            return Ok(());
        }
        let domain = self.domain();
        let end = window.max_timestamp();
        let cleanup = self.cleanup_time(window);
        let timers = self.timers.as_mut().ok_or_else(not_open)?;
        let passed = domain == TimeDomain::EventTime && end <= timers.current_watermark();
        if !passed {
            timers.register(&mut self.base.backend, domain, key, key_group, end);
        }
        if cleanup != end {
            timers.register(&mut self.base.backend, domain, key, key_group, cleanup);
        }
        Ok(())
    }

    /// Deletes the timers of the sessions merged into `window` (Flink's `Trigger.clear` of a
    /// merged window); `window` registers its own after. A key's timers are one per time, not
    /// per window, so a time another of the key's windows still needs stays.
    fn delete_merged_timers(
        &mut self,
        key: &K,
        key_group: KeyGroup,
        window: TimeWindow,
        merged: &[TimeWindow],
    ) -> OpResult {
        if merged.iter().all(|w| *w == window) {
            return Ok(());
        }
        let state = self.state.ok_or_else(not_open)?;
        let kept: Vec<TimeWindow> = self
            .base
            .backend
            .value(state, key, key_group)
            .into_iter()
            .flat_map(|m| m.keys().copied())
            .chain([window])
            .collect();
        let needed: std::collections::BTreeSet<i64> = kept
            .iter()
            .flat_map(|w| [w.max_timestamp(), self.cleanup_time(w)])
            .collect();
        let domain = self.domain();
        for w in merged.iter().filter(|w| **w != window) {
            for ts in [w.max_timestamp(), self.cleanup_time(w)] {
                if !needed.contains(&ts) {
                    let timers = self.timers.as_mut().ok_or_else(not_open)?;
                    timers.delete(&mut self.base.backend, domain, key, key_group, ts);
                }
            }
        }
        Ok(())
    }

    /// Adds `record` to `window` (merging `merged` windows into it first), then applies the
    /// trigger to it.
    fn add(
        &mut self,
        key: &K,
        key_group: KeyGroup,
        window: TimeWindow,
        merged: &[TimeWindow],
        record: T,
        out: &mut dyn Output<WindowOutput<O, T>>,
    ) -> OpResult {
        let state = self.state.ok_or_else(not_open)?;
        let map = self
            .base
            .backend
            .value_mut_or_insert(state, key, key_group, BTreeMap::new);
        let mut acc: Option<WindowContents<F::Acc>> = None;
        for w in merged {
            if let Some(c) = map.remove(w) {
                acc = Some(match acc {
                    None => c,
                    Some(a) => WindowContents {
                        acc: self.function.merge(a.acc, c.acc),
                        count: a.count + c.count,
                    },
                });
            }
        }
        if let Some(a) = acc {
            // A merged session's contents go into the covering window, whose own (if any) is
            // in `merged` too.
            map.insert(window, a);
        }
        self.delete_merged_timers(key, key_group, window, merged)?;
        let map = self
            .base
            .backend
            .value_mut_or_insert(state, key, key_group, BTreeMap::new);
        let count = match map.get_mut(&window) {
            Some(c) => {
                self.function.add(&mut c.acc, record);
                c.count += 1;
                c.count
            }
            None => {
                map.insert(
                    window,
                    WindowContents {
                        acc: self.function.first(record),
                        count: 1,
                    },
                );
                1
            }
        };
        match self.spec.trigger {
            Trigger::Count(n) => {
                if count >= n {
                    self.emit(key, key_group, window, out)?;
                    self.purge(key, key_group, &window);
                }
                if window != TimeWindow::GLOBAL && (count == 1 || !merged.is_empty()) {
                    // Windows of time still go at their cleanup time.
                    let cleanup = self.cleanup_time(&window);
                    let domain = self.domain();
                    let timers = self.timers.as_mut().ok_or_else(not_open)?;
                    timers.register(&mut self.base.backend, domain, key, key_group, cleanup);
                }
            }
            Trigger::Default => {
                if window == TimeWindow::GLOBAL {
                    return Ok(());
                }
                let watermark = self
                    .timers
                    .as_ref()
                    .map_or(i64::MIN, |t| t.current_watermark());
                if self.time() == WindowTime::EventTime && window.max_timestamp() <= watermark {
                    // A late record within the allowed lateness fires its window again at once
                    // (Flink's `EventTimeTrigger.onElement`).
                    self.emit(key, key_group, window, out)?;
                }
                // Every record (re)registers its window's timers, as Flink's trigger does: a
                // window that fired before a checkpoint and gets a record within the allowed
                // lateness after the restore (when the watermark starts over) must fire again
                // when the watermark passes its end. Registering a queued timer is a no-op.
                let _ = count;
                self.register_timers(key, key_group, &window)?;
            }
        }
        Ok(())
    }

    /// Places one record.
    fn place(&mut self, record: T, out: &mut dyn Output<WindowOutput<O, T>>) -> OpResult {
        let key = (self.key)(&record).clone();
        let key_group = self.base.key_group(&key);
        let watermark = self
            .timers
            .as_ref()
            .ok_or_else(not_open)?
            .current_watermark();
        let timestamp = match (self.time(), &self.spec.timestamp) {
            // The global window holds every record, whatever its time.
            _ if self.spec.assigner == WindowAssigner::Global => i64::MIN,
            (WindowTime::ProcessingTime, _) => ProcessingTimeService::now_ms(),
            (WindowTime::EventTime, Some(f)) => f(&record),
            (WindowTime::EventTime, None) => {
                return Err(TaskError::Operator {
                    operator: "Window".into(),
                    message: "an event-time window has no timestamp function".into(),
                });
            }
        };
        let mut assigned = std::mem::take(&mut self.assigned);
        self.spec.assigner.assign(timestamp, &mut assigned);
        let result = if self.spec.assigner.is_merging() {
            self.place_merging(
                &key,
                key_group,
                assigned[0],
                watermark,
                timestamp,
                record,
                out,
            )
        } else {
            self.place_each(
                &key, key_group, &assigned, watermark, timestamp, record, out,
            )
        };
        self.assigned = assigned;
        result
    }

    #[allow(clippy::too_many_arguments)]
    fn place_each(
        &mut self,
        key: &K,
        key_group: KeyGroup,
        windows: &[TimeWindow],
        watermark: i64,
        timestamp: i64,
        record: T,
        out: &mut dyn Output<WindowOutput<O, T>>,
    ) -> OpResult {
        let open = windows
            .iter()
            .filter(|w| !self.is_window_late(w, watermark))
            .count();
        if open == 0 {
            return self.late(timestamp, watermark, record, out);
        }
        let mut placed = 0;
        for w in windows {
            if self.is_window_late(w, watermark) {
                continue;
            }
            placed += 1;
            if placed == open {
                // The last window takes the record itself; the others a copy.
                return self.add(key, key_group, *w, &[], record, out);
            }
            self.add(key, key_group, *w, &[], record.clone(), out)?;
        }
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    fn place_merging(
        &mut self,
        key: &K,
        key_group: KeyGroup,
        new: TimeWindow,
        watermark: i64,
        timestamp: i64,
        record: T,
        out: &mut dyn Output<WindowOutput<O, T>>,
    ) -> OpResult {
        let state = self.state.ok_or_else(not_open)?;
        let mut window = new;
        let mut merged = Vec::new();
        if let Some(existing) = self.base.backend.value(state, key, key_group) {
            // Sessions of one key never overlap: merge the new one with every session it
            // reaches, growing it until no other is reached.
            loop {
                let before = merged.len();
                for w in existing.keys() {
                    if !merged.contains(w) && w.intersects(&window) {
                        merged.push(*w);
                        window = window.cover(w);
                    }
                }
                if merged.len() == before {
                    break;
                }
            }
        }
        if self.is_window_late(&window, watermark) {
            return self.late(timestamp, watermark, record, out);
        }
        self.add(key, key_group, window, &merged, record, out)
    }

    /// A record none of whose windows is open: to the late output if it is late by the allowed
    /// lateness (otherwise it belongs to windows already purged by their trigger, and goes).
    fn late(
        &mut self,
        timestamp: i64,
        watermark: i64,
        record: T,
        out: &mut dyn Output<WindowOutput<O, T>>,
    ) -> OpResult {
        if self.time() == WindowTime::EventTime
            && timestamp.saturating_add(self.spec.lateness) <= watermark
        {
            return out.push(WindowOutput::Late(record));
        }
        Ok(())
    }

    /// Fires the timers of `domain` due at `until`: windows that end then fire, windows whose
    /// cleanup time it is go.
    fn fire(
        &mut self,
        domain: TimeDomain,
        until: i64,
        out: &mut dyn Output<WindowOutput<O, T>>,
    ) -> OpResult {
        let state = self.state.ok_or_else(not_open)?;
        let max_parallelism = self.base.info.max_parallelism;
        loop {
            let timers = self.timers.as_mut().ok_or_else(not_open)?;
            let Some((ts, key, key_group)) =
                timers.pop_due(&mut self.base.backend, domain, until, max_parallelism)
            else {
                break;
            };
            if domain != self.domain() {
                continue;
            }
            let windows: Vec<TimeWindow> = self
                .base
                .backend
                .value(state, &key, key_group)
                .map(|m| m.keys().copied().collect())
                .unwrap_or_default();
            for w in windows {
                if self.spec.trigger == Trigger::Default && w.max_timestamp() == ts {
                    self.emit(&key, key_group, w, out)?;
                }
                if self.cleanup_time(&w) == ts {
                    self.purge(&key, key_group, &w);
                }
            }
        }
        if domain == TimeDomain::ProcessingTime
            && let Some(t) = self.timers.as_ref()
        {
            t.publish_processing_time();
        }
        Ok(())
    }
}

impl<K, T, O, F> OneInputOperator<T> for WindowOperator<K, T, O, F>
where
    K: StateKey,
    T: Clone + Send + 'static,
    O: Send + 'static,
    F: WindowFunction<K, T, O>,
{
    type Out = WindowOutput<O, T>;

    fn process(&mut self, record: T, out: &mut dyn Output<WindowOutput<O, T>>) -> OpResult {
        self.place(record, out)
    }

    fn watermark(
        &mut self,
        watermark: Watermark,
        out: &mut dyn Output<WindowOutput<O, T>>,
    ) -> OpResult {
        if let Some(t) = self.timers.as_mut() {
            t.advance_watermark(watermark.0);
        }
        self.fire(TimeDomain::EventTime, watermark.0, out)?;
        out.watermark(watermark)
    }

    fn lifecycle(
        &mut self,
        event: &mut Lifecycle<'_>,
        out: &mut dyn Output<WindowOutput<O, T>>,
    ) -> OpResult {
        if self.base.lifecycle(event)? {
            self.timers = Some(TimerService::open(
                &mut self.base.backend,
                self.base.info.processing_time.clone(),
            )?);
            self.state = Some(self.base.backend.value_state(&ValueStateDescriptor::<
                Contents<F::Acc>,
            >::new(CONTENTS_STATE))?);
        }
        if let Lifecycle::ProcessingTime(now) = event {
            self.fire(TimeDomain::ProcessingTime, *now, out)?;
        }
        Ok(())
    }
}
