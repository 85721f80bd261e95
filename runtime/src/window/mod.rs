//! Windows over a keyed stream (Flink's `WindowedStream`): `key_by(..).window(assigner)`, then
//! `reduce`, `aggregate` or `process`, with allowed lateness and a side output for late records.
//!
//! Records carry no timestamp of their own in Weir: an event-time window reads each record's
//! time with the function given to [`WindowedStream::timestamps`] (the same function the
//! stream's watermark strategy uses, typically). Windows fire on the watermarks that reach the
//! operator (the minimum over its input channels), and a bounded source's end (the end of event
//! time) fires every event-time window. Processing-time windows that are still open when the
//! input ends do not fire, as in Flink.

pub mod assigner;
pub mod function;
mod operator;

pub use assigner::{
    EventTimeSessionWindows, GlobalWindows, ProcessingTimeSessionWindows, SlidingEventTimeWindows,
    SlidingProcessingTimeWindows, TimeWindow, Trigger, TumblingEventTimeWindows,
    TumblingProcessingTimeWindows, WindowAssigner, WindowTime,
};
pub use function::{ProcessWindowFunction, WindowContents, WindowFunction, WindowInfo};
pub use operator::{TimestampFn, WindowOutput, WindowSpec};

use crate::env::{DataStream, KeyedStream};
use crate::operator::{Chained, Lifecycle, OpResult, Output};
use function::{AggregateWindow, ProcessWindow, ReduceWindow};
use operator::WindowOperator;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use weir_core::element::Watermark;
use weir_network::Data;
use weir_state::{AggregateFunction, StateKey, StateValue};

/// A keyed stream cut into windows, before its window function is chosen. `L` says what
/// happens to late records: dropped ([`DropLate`], the default) or sent to a side output
/// ([`SideOutputLate`], after [`side_output_late_data`](WindowedStream::side_output_late_data)).
pub struct WindowedStream<K, T, L = DropLate> {
    keyed: KeyedStream<K, T>,
    spec: WindowSpec<T>,
    uid: Option<String>,
    _late: std::marker::PhantomData<L>,
}

impl<K: StateKey, T: Data> KeyedStream<K, T> {
    /// Cuts the stream into the windows `assigner` gives (Flink's `window`). An event-time
    /// assigner needs [`WindowedStream::timestamps`].
    pub fn window(self, assigner: WindowAssigner) -> WindowedStream<K, T> {
        WindowedStream {
            keyed: self,
            spec: WindowSpec {
                assigner,
                trigger: Trigger::Default,
                lateness: 0,
                timestamp: None,
            },
            uid: None,
            _late: std::marker::PhantomData,
        }
    }

    /// Windows of `n` records per key (Flink's `countWindow`): the global window with a
    /// purging count trigger.
    pub fn count_window(self, n: u64) -> WindowedStream<K, T> {
        self.window(GlobalWindows::create())
            .trigger(Trigger::Count(n))
    }
}

/// What late records become: [`DropLate`] or [`SideOutputLate`].
pub trait LateData: Send + 'static {
    /// What a window function call returns.
    type Out<O: Data, T: Data>;
    /// Adds the window operator running `make()`'s function after `keyed`.
    fn attach<K, T, O, F, M>(
        keyed: KeyedStream<K, T>,
        name: &str,
        uid: Option<&str>,
        spec: WindowSpec<T>,
        make: M,
    ) -> Self::Out<O, T>
    where
        K: StateKey,
        T: Data,
        O: Data,
        F: WindowFunction<K, T, O>,
        M: Fn() -> F + Send + Sync + 'static;
}

/// Late records are dropped: a window function returns the results' stream, which is the
/// window operator's own output (so `.uid(..)` on it names the window operator).
pub struct DropLate;

/// Late records go to a side output: a window function returns the results' stream and the late
/// records' (Flink's `sideOutputLateData` and `getSideOutput`). Name the window operator with
/// [`WindowedStream::uid`].
pub struct SideOutputLate;

impl LateData for DropLate {
    type Out<O: Data, T: Data> = DataStream<O>;
    fn attach<K, T, O, F, M>(
        keyed: KeyedStream<K, T>,
        name: &str,
        uid: Option<&str>,
        spec: WindowSpec<T>,
        make: M,
    ) -> DataStream<O>
    where
        K: StateKey,
        T: Data,
        O: Data,
        F: WindowFunction<K, T, O>,
        M: Fn() -> F + Send + Sync + 'static,
    {
        let out = keyed.keyed::<O>(name, move |_, base, key, next| {
            let next: Box<dyn Output<WindowOutput<O, T>>> = Box::new(DropLateOutput { next });
            Box::new(Chained::new(
                WindowOperator::new(base, key, spec.clone(), make()),
                next,
            ))
        });
        match uid {
            Some(uid) => out.uid(uid),
            None => out,
        }
    }
}

impl LateData for SideOutputLate {
    type Out<O: Data, T: Data> = (DataStream<O>, DataStream<T>);
    fn attach<K, T, O, F, M>(
        keyed: KeyedStream<K, T>,
        name: &str,
        uid: Option<&str>,
        spec: WindowSpec<T>,
        make: M,
    ) -> (DataStream<O>, DataStream<T>)
    where
        K: StateKey,
        T: Data,
        O: Data,
        F: WindowFunction<K, T, O>,
        M: Fn() -> F + Send + Sync + 'static,
    {
        let out = keyed.keyed::<WindowOutput<O, T>>(name, move |_, base, key, next| {
            Box::new(Chained::new(
                WindowOperator::new(base, key, spec.clone(), make()),
                next,
            ))
        });
        let out = match uid {
            Some(uid) => out.uid(uid),
            None => out,
        };
        let results = out
            .clone()
            .flat_map(|o| match o {
                WindowOutput::Result(r) => Some(r),
                WindowOutput::Late(_) => None,
            })
            .name("Window Results");
        let late = out
            .flat_map(|o| match o {
                WindowOutput::Late(t) => Some(t),
                WindowOutput::Result(_) => None,
            })
            .name("Late Records");
        (results, late)
    }
}

/// The results of a window that drops late records, in its operator's own output.
struct DropLateOutput<O> {
    next: Box<dyn Output<O>>,
}

impl<O: Send + 'static, T: Send + 'static> Output<WindowOutput<O, T>> for DropLateOutput<O> {
    fn push(&mut self, record: WindowOutput<O, T>) -> OpResult {
        match record {
            WindowOutput::Result(r) => self.next.push(r),
            WindowOutput::Late(_) => Ok(()),
        }
    }

    fn watermark(&mut self, watermark: Watermark) -> OpResult {
        self.next.watermark(watermark)
    }

    fn watermark_status(&mut self, status: weir_core::element::WatermarkStatus) -> OpResult {
        self.next.watermark_status(status)
    }

    fn lifecycle(&mut self, event: &mut Lifecycle<'_>) -> OpResult {
        self.next.lifecycle(event)
    }

    fn poll_flush(&mut self, cx: &mut Context<'_>) -> Poll<OpResult> {
        self.next.poll_flush(cx)
    }
}

impl<K: StateKey, T: Data, L: LateData> WindowedStream<K, T, L> {
    /// Reads each record's event time (ms) for event-time windows.
    pub fn timestamps(mut self, timestamp: impl Fn(&T) -> i64 + Send + Sync + 'static) -> Self {
        self.spec.timestamp = Some(Arc::new(timestamp));
        self
    }

    /// Keeps event-time windows this long after their end: a record that arrives late but
    /// within it fires its window again with the record added (Flink's `allowedLateness`).
    pub fn allowed_lateness(mut self, lateness: Duration) -> Self {
        self.spec.lateness = i64::try_from(lateness.as_millis()).unwrap_or(i64::MAX);
        self
    }

    /// Replaces the assigner's trigger (Flink's `trigger`).
    pub fn trigger(mut self, trigger: Trigger) -> Self {
        self.spec.trigger = trigger;
        self
    }

    /// Sends records that arrive after all their windows were cleaned up to a side output
    /// instead of dropping them: the window function then returns `(results, late records)`.
    pub fn side_output_late_data(self) -> WindowedStream<K, T, SideOutputLate> {
        WindowedStream {
            keyed: self.keyed,
            spec: self.spec,
            uid: self.uid,
            _late: std::marker::PhantomData,
        }
    }

    /// Why these window settings cannot run, if they cannot.
    fn problem(&self) -> Option<String> {
        if let Err(e) = self.spec.assigner.validate() {
            return Some(e);
        }
        if self.spec.assigner.time() == WindowTime::EventTime
            && self.spec.assigner != WindowAssigner::Global
            && self.spec.timestamp.is_none()
        {
            return Some(
                "an event-time window needs each record's timestamp: call .timestamps(..) on \
                 the windowed stream"
                    .into(),
            );
        }
        if self.spec.trigger == Trigger::Count(0) {
            return Some("a count trigger must count at least 1 record".into());
        }
        if self.spec.assigner == WindowAssigner::Global && self.spec.trigger == Trigger::Default {
            return Some(
                "the global window never fires by itself: give it a trigger (Trigger::Count) or \
                 use count_window"
                    .into(),
            );
        }
        None
    }

    fn build<O: Data, F>(
        self,
        name: &str,
        make: impl Fn() -> F + Send + Sync + 'static,
    ) -> L::Out<O, T>
    where
        F: WindowFunction<K, T, O>,
    {
        if let Some(problem) = self.problem() {
            self.keyed.record_build_error(format!("{name}: {problem}"));
        }
        L::attach(self.keyed, name, self.uid.as_deref(), self.spec, make)
    }

    /// Sets the window operator's `uid` (the stable name its windows are stored under).
    pub fn uid(mut self, uid: &str) -> Self {
        self.uid = Some(uid.to_string());
        self
    }

    /// Reduces each window's records incrementally with `f` and emits the result when the
    /// window fires (Flink's `reduce`).
    pub fn reduce(self, f: impl Fn(&T, &T) -> T + Send + Sync + 'static) -> L::Out<T, T>
    where
        T: StateValue,
    {
        self.reduce_with(f, |_: &K, _: &TimeWindow, r: T| r)
    }

    /// Reduces incrementally with `f`, and emits what `window_fn` makes of the result with its
    /// key and window (Flink's `reduce(ReduceFunction, ProcessWindowFunction)`).
    pub fn reduce_with<O: Data>(
        self,
        f: impl Fn(&T, &T) -> T + Send + Sync + 'static,
        window_fn: impl Fn(&K, &TimeWindow, T) -> O + Send + Sync + 'static,
    ) -> L::Out<O, T>
    where
        T: StateValue,
    {
        let reduce: function::ReduceFn<T> = Arc::new(f);
        let mapper: function::WindowMapper<K, T, O> = Arc::new(window_fn);
        self.build("Window(Reduce)", move || ReduceWindow {
            reduce: reduce.clone(),
            mapper: mapper.clone(),
        })
    }

    /// Aggregates each window's records incrementally and emits the aggregate's result
    /// (Flink's `aggregate`).
    pub fn aggregate<ACC: StateValue, R: Data>(
        self,
        function: impl AggregateFunction<T, ACC, R>,
    ) -> L::Out<R, T> {
        self.aggregate_with(function, |_: &K, _: &TimeWindow, r: R| r)
    }

    /// Aggregates incrementally, and emits what `window_fn` makes of the result with its key
    /// and window (Flink's `aggregate(AggregateFunction, ProcessWindowFunction)`).
    pub fn aggregate_with<ACC: StateValue, R: 'static, O: Data>(
        self,
        function: impl AggregateFunction<T, ACC, R>,
        window_fn: impl Fn(&K, &TimeWindow, R) -> O + Send + Sync + 'static,
    ) -> L::Out<O, T> {
        let function: Arc<dyn AggregateFunction<T, ACC, R>> = Arc::new(function);
        let mapper: function::WindowMapper<K, R, O> = Arc::new(window_fn);
        self.build("Window(Aggregate)", move || AggregateWindow {
            function: function.clone(),
            mapper: mapper.clone(),
        })
    }

    /// Runs a function over all of each window's records when it fires (Flink's `process`
    /// with a `ProcessWindowFunction`); `make` builds one per subtask. The window keeps its
    /// records in keyed state until it is purged.
    pub fn process<O: Data, P>(self, make: impl Fn() -> P + Send + Sync + 'static) -> L::Out<O, T>
    where
        T: StateValue,
        P: ProcessWindowFunction<K, T, O>,
    {
        self.build("Window(Process)", move || ProcessWindow {
            function: make(),
        })
    }
}
