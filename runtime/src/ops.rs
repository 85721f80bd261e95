//! Stateless chained operators: map, flat_map, filter, and the timestamp and watermark assigner.

use crate::operator::{Cancellation, OneInputOperator, OpResult, Output};
use std::sync::Arc;
use weir_core::element::Watermark;

/// Applies a function to each record, checking the cancellation signal before each.
pub struct MapOperator<F>(pub Arc<F>, pub Cancellation);

impl<T, U, F> OneInputOperator<T> for MapOperator<F>
where
    T: Send + 'static,
    U: Send + 'static,
    F: Fn(T) -> U + Send + Sync + 'static,
{
    type Out = U;

    #[inline]
    fn process(&mut self, record: T, out: &mut dyn Output<U>) -> OpResult {
        self.1.check()?;
        out.push((self.0)(record))
    }

    fn process_batch(&mut self, batch: Vec<T>, out: &mut dyn Output<U>) -> OpResult {
        // A plain loop: collecting `Result`s through an adapter cost twice the user function
        // (measured in word_count's profile).
        let (f, cancellation) = (&*self.0, &self.1);
        let mut mapped = Vec::with_capacity(batch.len());
        for record in batch {
            cancellation.check()?;
            mapped.push(f(record));
        }
        out.push_batch(mapped)
    }
}

/// Turns each record into zero or more records, checking the cancellation signal before each.
pub struct FlatMapOperator<F>(pub Arc<F>, pub Cancellation);

impl<T, I, F> OneInputOperator<T> for FlatMapOperator<F>
where
    T: Send + 'static,
    I: IntoIterator,
    I::Item: Send + 'static,
    F: Fn(T) -> I + Send + Sync + 'static,
{
    type Out = I::Item;

    #[inline]
    fn process(&mut self, record: T, out: &mut dyn Output<I::Item>) -> OpResult {
        self.1.check()?;
        for r in (self.0)(record) {
            out.push(r)?;
        }
        Ok(())
    }

    fn process_batch(&mut self, batch: Vec<T>, out: &mut dyn Output<I::Item>) -> OpResult {
        let mut next = Vec::with_capacity(batch.len());
        for record in batch {
            self.1.check()?;
            next.extend((self.0)(record));
        }
        out.push_batch(next)
    }
}

/// Keeps the records a predicate accepts, checking the cancellation signal before each.
pub struct FilterOperator<F>(pub Arc<F>, pub Cancellation);

impl<T, F> OneInputOperator<T> for FilterOperator<F>
where
    T: Send + 'static,
    F: Fn(&T) -> bool + Send + Sync + 'static,
{
    type Out = T;

    #[inline]
    fn process(&mut self, record: T, out: &mut dyn Output<T>) -> OpResult {
        self.1.check()?;
        if (self.0)(&record) {
            out.push(record)
        } else {
            Ok(())
        }
    }

    fn process_batch(&mut self, mut batch: Vec<T>, out: &mut dyn Output<T>) -> OpResult {
        let (f, cancellation) = (&*self.0, &self.1);
        let mut cancelled = false;
        batch.retain(|r| {
            cancelled = cancelled || cancellation.is_cancelled();
            !cancelled && f(r)
        });
        if cancelled {
            return Err(crate::error::TaskError::Canceled);
        }
        out.push_batch(batch)
    }
}

/// Assigns event time and generates watermarks with a bounded out-of-orderness (Flink's
/// `WatermarkStrategy.forBoundedOutOfOrderness` with `assignTimestampsAndWatermarks`).
///
/// Event time is read from each record by `timestamp` (records carry their own time). After each
/// batch, the watermark `max timestamp seen - bound - 1` goes downstream if it advanced: no
/// record later than that is expected any more. Watermarks from upstream are not forwarded,
/// except the end of event time (`Watermark::MAX`), as in Flink.
pub struct BoundedOutOfOrderness<F> {
    timestamp: Arc<F>,
    bound_ms: i64,
    max_timestamp: i64,
    emitted: i64,
}

impl<F> BoundedOutOfOrderness<F> {
    /// Watermarks trail the largest timestamp by `bound_ms` (plus 1 ms, as in Flink).
    pub fn new(timestamp: Arc<F>, bound_ms: i64) -> Self {
        BoundedOutOfOrderness {
            timestamp,
            bound_ms,
            max_timestamp: i64::MIN,
            emitted: i64::MIN,
        }
    }

    fn emit<T>(&mut self, out: &mut dyn Output<T>) -> OpResult {
        if self.max_timestamp == i64::MIN {
            return Ok(());
        }
        let wm = self
            .max_timestamp
            .saturating_sub(self.bound_ms)
            .saturating_sub(1);
        if wm > self.emitted {
            self.emitted = wm;
            out.watermark(Watermark(wm))?;
        }
        Ok(())
    }
}

impl<T, F> OneInputOperator<T> for BoundedOutOfOrderness<F>
where
    T: Send + 'static,
    F: Fn(&T) -> i64 + Send + Sync + 'static,
{
    type Out = T;

    fn process(&mut self, record: T, out: &mut dyn Output<T>) -> OpResult {
        self.max_timestamp = self.max_timestamp.max((self.timestamp)(&record));
        out.push(record)?;
        self.emit(out)
    }

    fn process_batch(&mut self, batch: Vec<T>, out: &mut dyn Output<T>) -> OpResult {
        let f = &*self.timestamp;
        if let Some(max) = batch.iter().map(f).max() {
            self.max_timestamp = self.max_timestamp.max(max);
        }
        out.push_batch(batch)?;
        self.emit(out)
    }

    fn watermark(&mut self, watermark: Watermark, out: &mut dyn Output<T>) -> OpResult {
        if watermark == Watermark::MAX && self.emitted != i64::MAX {
            self.emitted = i64::MAX;
            out.watermark(watermark)?;
        }
        Ok(())
    }
}
