//! Joins of two streams on a key (Flink's `join(..).where(..).equalTo(..).window(..)` and
//! `intervalJoin`).
//!
//! A window join pairs each record of the first stream with each record of the second that has
//! the same key and falls in the same window: the two streams as one keyed stream of
//! [`Side`]s, cut into windows by the window operator, and a process window function that
//! emits the cross product of the window's two sides. An interval join pairs a first-stream
//! record at time `t` with each second-stream record of the same key in `[t + lower, t +
//! upper]`: both sides are buffered per key in keyed state by timestamp, and each buffered
//! record goes when the watermark passes the last time a partner could still arrive.

use crate::co::{Side, keyed_sides};
use crate::env::{DataStream, KeyedStream};
use crate::error::TaskError;
use crate::keyed::{Collector, KeyedContext, KeyedProcessFunction, KeyedStateRegistry, TimeDomain};
use crate::window::{WindowAssigner, WindowInfo};
use std::collections::BTreeMap;
use std::sync::Arc;
use weir_network::Data;
use weir_state::{StateKey, StateValue, ValueState, ValueStateDescriptor};

/// Two streams to join (Flink's `JoinedStreams`).
pub struct JoinedStreams<A, B> {
    first: DataStream<A>,
    second: DataStream<B>,
}

impl<A: Data> DataStream<A> {
    /// Joins `second` to this stream in windows (Flink's `join`).
    pub fn join<B: Data>(self, second: DataStream<B>) -> JoinedStreams<A, B> {
        JoinedStreams {
            first: self,
            second,
        }
    }
}

/// A record's event time, in ms.
type Timestamp<T> = Arc<dyn Fn(&T) -> i64 + Send + Sync>;

/// What a pair of joined records becomes.
type JoinFn<A, B, O> = Arc<dyn Fn(&A, &B) -> O + Send + Sync>;

impl<A: Data, B: Data> JoinedStreams<A, B> {
    /// The keys records are joined on, one per side (Flink's `where(..).equalTo(..)`).
    pub fn on<K: StateKey>(
        self,
        first_key: impl for<'a> Fn(&'a A) -> &'a K + Send + Sync + 'static,
        second_key: impl for<'a> Fn(&'a B) -> &'a K + Send + Sync + 'static,
    ) -> KeyedJoin<K, A, B> {
        KeyedJoin {
            keyed: keyed_sides(self.first, self.second, first_key, second_key),
        }
    }
}

/// Two streams keyed for a join.
pub struct KeyedJoin<K, A, B> {
    keyed: KeyedStream<K, Side<A, B>>,
}

impl<K: StateKey, A: Data, B: Data> KeyedJoin<K, A, B> {
    /// Joins in the windows `assigner` gives (Flink's `window`); event-time windows read each
    /// side's time with `timestamps`.
    pub fn window(self, assigner: WindowAssigner) -> WindowJoin<K, A, B> {
        WindowJoin {
            keyed: self.keyed,
            assigner,
            timestamps: None,
            uid: None,
        }
    }

    /// Joins each first-stream record at `t` with the second-stream records of its key at
    /// `t + lower ..= t + upper` in event time (Flink's `intervalJoin(..).between(lower,
    /// upper)`; bounds in ms, either may be negative). Records behind the watermark when they
    /// arrive are dropped, as in Flink.
    pub fn between(self, lower: i64, upper: i64) -> IntervalJoin<K, A, B> {
        IntervalJoin {
            keyed: self.keyed,
            lower,
            upper,
            timestamps: None,
        }
    }
}

/// A window join being set up.
pub struct WindowJoin<K, A, B> {
    keyed: KeyedStream<K, Side<A, B>>,
    assigner: WindowAssigner,
    timestamps: Option<(Timestamp<A>, Timestamp<B>)>,
    uid: Option<String>,
}

impl<K: StateKey, A: StateValue + Data, B: StateValue + Data> WindowJoin<K, A, B> {
    /// Each side's event time, in ms.
    pub fn timestamps(
        mut self,
        first: impl Fn(&A) -> i64 + Send + Sync + 'static,
        second: impl Fn(&B) -> i64 + Send + Sync + 'static,
    ) -> Self {
        self.timestamps = Some((Arc::new(first), Arc::new(second)));
        self
    }

    /// Names the join's window operator (the stable name its windows are stored under).
    pub fn uid(mut self, uid: &str) -> Self {
        self.uid = Some(uid.to_string());
        self
    }

    /// Emits `f(a, b)` for each pair of a window's records from the two sides (Flink's
    /// `apply(JoinFunction)`), when the window fires.
    pub fn apply<O: Data>(self, f: impl Fn(&A, &B) -> O + Send + Sync + 'static) -> DataStream<O> {
        let f = Arc::new(f);
        let mut windowed = self.keyed.window(self.assigner);
        if let Some((ta, tb)) = self.timestamps {
            windowed = windowed.timestamps(move |s: &Side<A, B>| match s {
                Side::First(a) => ta(a),
                Side::Second(b) => tb(b),
            });
        }
        if let Some(uid) = &self.uid {
            windowed = windowed.uid(uid);
        }
        windowed.process(move || {
            let f = f.clone();
            move |_: &K,
                  _: &WindowInfo,
                  records: &[Side<A, B>],
                  out: &mut Collector<'_, O>|
                  -> Result<(), TaskError> {
                for a in records.iter().filter_map(|s| match s {
                    Side::First(a) => Some(a),
                    Side::Second(_) => None,
                }) {
                    for b in records.iter().filter_map(|s| match s {
                        Side::Second(b) => Some(b),
                        Side::First(_) => None,
                    }) {
                        out.collect(f(a, b))?;
                    }
                }
                Ok(())
            }
        })
    }
}

/// An interval join being set up.
pub struct IntervalJoin<K, A, B> {
    keyed: KeyedStream<K, Side<A, B>>,
    lower: i64,
    upper: i64,
    timestamps: Option<(Timestamp<A>, Timestamp<B>)>,
}

impl<K: StateKey, A: StateValue + Data, B: StateValue + Data> IntervalJoin<K, A, B> {
    /// Each side's event time, in ms (required).
    pub fn timestamps(
        mut self,
        first: impl Fn(&A) -> i64 + Send + Sync + 'static,
        second: impl Fn(&B) -> i64 + Send + Sync + 'static,
    ) -> Self {
        self.timestamps = Some((Arc::new(first), Arc::new(second)));
        self
    }

    /// Emits `f(a, b)` for each pair within the interval (Flink's `process(ProcessJoinFunction)`).
    /// Name its state with `.uid(..)` on the result.
    pub fn process<O: Data>(
        self,
        f: impl Fn(&A, &B) -> O + Send + Sync + 'static,
    ) -> DataStream<O> {
        if self.lower > self.upper {
            self.keyed.record_build_error(format!(
                "interval join: the lower bound ({} ms) is above the upper bound ({} ms), so \
                 the interval is empty",
                self.lower, self.upper
            ));
        }
        let Some((ta, tb)) = self.timestamps else {
            self.keyed.record_build_error(
                "interval join: it needs each side's timestamp: call .timestamps(..)".into(),
            );
            return self.keyed.process("Interval Join", || NeverJoin);
        };
        let (lower, upper) = (self.lower, self.upper);
        let f: JoinFn<A, B, O> = Arc::new(f);
        self.keyed
            .process("Interval Join", move || IntervalJoinFunction {
                lower,
                upper,
                first_time: ta.clone(),
                second_time: tb.clone(),
                f: f.clone(),
                first: None,
                second: None,
            })
    }
}

/// Stands in for a join whose settings are refused at build time (the job never runs).
struct NeverJoin;

impl<K: StateKey, I, O> KeyedProcessFunction<K, I, O> for NeverJoin {
    fn open(&mut self, _: &mut KeyedStateRegistry<'_, K>) -> Result<(), TaskError> {
        Ok(())
    }
    fn process_element(
        &mut self,
        _: I,
        _: &mut KeyedContext<'_, K>,
        _: &mut Collector<'_, O>,
    ) -> Result<(), TaskError> {
        Ok(())
    }
}

/// One side's buffered records of a key, by timestamp.
type Buffer<T> = BTreeMap<i64, Vec<T>>;

/// Flink's `IntervalJoinOperator` as a keyed process function over both sides.
struct IntervalJoinFunction<A, B, O> {
    lower: i64,
    upper: i64,
    first_time: Timestamp<A>,
    second_time: Timestamp<B>,
    f: JoinFn<A, B, O>,
    first: Option<ValueState<Buffer<A>>>,
    second: Option<ValueState<Buffer<B>>>,
}

fn not_open() -> TaskError {
    TaskError::Operator {
        operator: "Interval Join".into(),
        message: "a record arrived before the operator was opened".into(),
    }
}

impl<K, A, B, O> KeyedProcessFunction<K, Side<A, B>, O> for IntervalJoinFunction<A, B, O>
where
    K: StateKey,
    A: StateValue,
    B: StateValue,
    O: Send + 'static,
{
    fn open(&mut self, states: &mut KeyedStateRegistry<'_, K>) -> Result<(), TaskError> {
        self.first = Some(states.value_state(&ValueStateDescriptor::new("interval-join-first"))?);
        self.second = Some(states.value_state(&ValueStateDescriptor::new("interval-join-second"))?);
        Ok(())
    }

    fn process_element(
        &mut self,
        record: Side<A, B>,
        ctx: &mut KeyedContext<'_, K>,
        out: &mut Collector<'_, O>,
    ) -> Result<(), TaskError> {
        let (first, second) = (
            self.first.ok_or_else(not_open)?,
            self.second.ok_or_else(not_open)?,
        );
        let watermark = ctx.current_watermark();
        match record {
            Side::First(a) => {
                let t = (self.first_time)(&a);
                if t < watermark {
                    return Ok(());
                }
                let (from, to) = (t.saturating_add(self.lower), t.saturating_add(self.upper));
                if let Some(buffer) = ctx.value(second).filter(|_| from <= to) {
                    for (_, bs) in buffer.range(from..=to) {
                        for b in bs {
                            out.collect((self.f)(&a, b))?;
                        }
                    }
                }
                // A later second-side record at up to `t + upper` may still pair with it.
                let cleanup = t.saturating_add(self.upper.max(0));
                let mut buffer = ctx.value(first).cloned().unwrap_or_default();
                buffer.entry(t).or_default().push(a);
                ctx.update(first, buffer);
                ctx.register_event_time_timer(cleanup);
            }
            Side::Second(b) => {
                let t = (self.second_time)(&b);
                if t < watermark {
                    return Ok(());
                }
                let (from, to) = (t.saturating_sub(self.upper), t.saturating_sub(self.lower));
                if let Some(buffer) = ctx.value(first).filter(|_| from <= to) {
                    for (_, as_) in buffer.range(from..=to) {
                        for a in as_ {
                            out.collect((self.f)(a, &b))?;
                        }
                    }
                }
                // A later first-side record at up to `t - lower` may still pair with it.
                let cleanup = t.saturating_sub(self.lower.min(0));
                let mut buffer = ctx.value(second).cloned().unwrap_or_default();
                buffer.entry(t).or_default().push(b);
                ctx.update(second, buffer);
                ctx.register_event_time_timer(cleanup);
            }
        }
        Ok(())
    }

    fn on_timer(
        &mut self,
        timestamp: i64,
        _domain: TimeDomain,
        ctx: &mut KeyedContext<'_, K>,
        _out: &mut Collector<'_, O>,
    ) -> Result<(), TaskError> {
        let (first, second) = (
            self.first.ok_or_else(not_open)?,
            self.second.ok_or_else(not_open)?,
        );
        // Drop what no future record can pair with any more.
        let first_done = timestamp.saturating_sub(self.upper.max(0));
        let second_done = timestamp.saturating_add(self.lower.min(0));
        if let Some(mut buffer) = ctx.value(first).cloned() {
            buffer.retain(|&t, _| t > first_done);
            if buffer.is_empty() {
                ctx.clear(first);
            } else {
                ctx.update(first, buffer);
            }
        }
        if let Some(mut buffer) = ctx.value(second).cloned() {
            buffer.retain(|&t, _| t > second_done);
            if buffer.is_empty() {
                ctx.clear(second);
            } else {
                ctx.update(second, buffer);
            }
        }
        Ok(())
    }
}
