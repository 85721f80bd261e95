//! What a window keeps and emits: an incremental reduce or aggregate (one accumulator per
//! window), or the window's records for a process function (Flink's `ProcessWindowFunction`).

use crate::error::TaskError;
use crate::keyed::Collector;
use crate::window::assigner::TimeWindow;
use std::sync::Arc;
use weir_state::{AggregateFunction, StateKey, StateValue};

/// A window's state: what the function accumulated, and how many records went in (for the
/// count trigger).
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct WindowContents<A> {
    /// The accumulator.
    pub acc: A,
    /// Records added since the window was created or last purged.
    pub count: u64,
}

/// How a window operator folds records and emits a window (the operator's strategy).
pub trait WindowFunction<K, T, O>: Send + 'static {
    /// The per-window accumulator, kept in keyed state.
    type Acc: StateValue;
    /// An accumulator holding `record` alone.
    fn first(&self, record: T) -> Self::Acc;
    /// Adds `record`.
    fn add(&self, acc: &mut Self::Acc, record: T);
    /// Merges two windows' accumulators (session windows).
    fn merge(&self, a: Self::Acc, b: Self::Acc) -> Self::Acc;
    /// Emits the window.
    fn emit(
        &mut self,
        key: &K,
        window: &WindowInfo,
        acc: &Self::Acc,
        out: &mut Collector<'_, O>,
    ) -> Result<(), TaskError>;
}

/// What a window function learns about the window it emits (Flink's
/// `ProcessWindowFunction.Context`).
#[derive(Clone, Copy, Debug)]
pub struct WindowInfo {
    /// The window.
    pub window: TimeWindow,
    /// The operator's watermark when the window fires.
    pub current_watermark: i64,
    /// The wall clock when the window fires, ms since the epoch.
    pub current_processing_time: i64,
}

/// Maps a window's incremental result, with its key and window, to what is emitted.
pub type WindowMapper<K, R, O> = Arc<dyn Fn(&K, &TimeWindow, R) -> O + Send + Sync>;

/// Combines two values into one (a reduce function).
pub type ReduceFn<T> = Arc<dyn Fn(&T, &T) -> T + Send + Sync>;

/// An incremental reduce (Flink's `reduce(ReduceFunction[, ProcessWindowFunction])`).
pub struct ReduceWindow<K, T, O> {
    pub(crate) reduce: ReduceFn<T>,
    pub(crate) mapper: WindowMapper<K, T, O>,
}

impl<K, T, O> WindowFunction<K, T, O> for ReduceWindow<K, T, O>
where
    K: StateKey,
    T: StateValue,
    O: Send + 'static,
{
    type Acc = T;

    fn first(&self, record: T) -> T {
        record
    }

    fn add(&self, acc: &mut T, record: T) {
        *acc = (self.reduce)(acc, &record);
    }

    fn merge(&self, a: T, b: T) -> T {
        (self.reduce)(&a, &b)
    }

    fn emit(
        &mut self,
        key: &K,
        window: &WindowInfo,
        acc: &T,
        out: &mut Collector<'_, O>,
    ) -> Result<(), TaskError> {
        out.collect((self.mapper)(key, &window.window, acc.clone()))
    }
}

/// An incremental aggregate (Flink's `aggregate(AggregateFunction[, ProcessWindowFunction])`).
pub struct AggregateWindow<K, T, ACC, R, O> {
    pub(crate) function: Arc<dyn AggregateFunction<T, ACC, R>>,
    pub(crate) mapper: WindowMapper<K, R, O>,
}

impl<K, T, ACC, R, O> WindowFunction<K, T, O> for AggregateWindow<K, T, ACC, R, O>
where
    K: StateKey,
    T: Send + 'static,
    ACC: StateValue,
    R: 'static,
    O: Send + 'static,
{
    type Acc = ACC;

    fn first(&self, record: T) -> ACC {
        let mut acc = self.function.create_accumulator();
        self.function.add(record, &mut acc);
        acc
    }

    fn add(&self, acc: &mut ACC, record: T) {
        self.function.add(record, acc);
    }

    fn merge(&self, a: ACC, b: ACC) -> ACC {
        self.function.merge(a, b)
    }

    fn emit(
        &mut self,
        key: &K,
        window: &WindowInfo,
        acc: &ACC,
        out: &mut Collector<'_, O>,
    ) -> Result<(), TaskError> {
        let result = self.function.get_result(acc);
        out.collect((self.mapper)(key, &window.window, result))
    }
}

/// A function over all of a window's records at once (Flink's `ProcessWindowFunction`). The
/// window keeps every record in keyed state until it is purged.
pub trait ProcessWindowFunction<K, T, O>: Send + 'static {
    /// Emits what the window's `records` (in arrival order) give.
    fn process(
        &mut self,
        key: &K,
        window: &WindowInfo,
        records: &[T],
        out: &mut Collector<'_, O>,
    ) -> Result<(), TaskError>;
}

impl<K, T, O, F> ProcessWindowFunction<K, T, O> for F
where
    F: FnMut(&K, &WindowInfo, &[T], &mut Collector<'_, O>) -> Result<(), TaskError>
        + Send
        + 'static,
{
    fn process(
        &mut self,
        key: &K,
        window: &WindowInfo,
        records: &[T],
        out: &mut Collector<'_, O>,
    ) -> Result<(), TaskError> {
        self(key, window, records, out)
    }
}

/// A process window function over the window's records.
pub struct ProcessWindow<P> {
    pub(crate) function: P,
}

impl<K, T, O, P> WindowFunction<K, T, O> for ProcessWindow<P>
where
    K: StateKey,
    T: StateValue,
    O: Send + 'static,
    P: ProcessWindowFunction<K, T, O>,
{
    type Acc = Vec<T>;

    fn first(&self, record: T) -> Vec<T> {
        vec![record]
    }

    fn add(&self, acc: &mut Vec<T>, record: T) {
        acc.push(record);
    }

    fn merge(&self, mut a: Vec<T>, b: Vec<T>) -> Vec<T> {
        a.extend(b);
        a
    }

    fn emit(
        &mut self,
        key: &K,
        window: &WindowInfo,
        acc: &Vec<T>,
        out: &mut Collector<'_, O>,
    ) -> Result<(), TaskError> {
        self.function.process(key, window, acc, out)
    }
}
