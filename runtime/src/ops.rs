//! Stateless chained operators: map, flat_map, filter.

use crate::operator::{OneInputOperator, OpResult, Output};
use std::sync::Arc;

/// Applies a function to each record.
pub struct MapOperator<F>(pub Arc<F>);

impl<T, U, F> OneInputOperator<T> for MapOperator<F>
where
    T: Send + 'static,
    U: Send + 'static,
    F: Fn(T) -> U + Send + Sync + 'static,
{
    type Out = U;

    #[inline]
    fn process(&mut self, record: T, out: &mut dyn Output<U>) -> OpResult {
        out.push((self.0)(record))
    }

    fn process_batch(&mut self, batch: Vec<T>, out: &mut dyn Output<U>) -> OpResult {
        let f = &*self.0;
        out.push_batch(batch.into_iter().map(f).collect())
    }
}

/// Turns each record into zero or more records.
pub struct FlatMapOperator<F>(pub Arc<F>);

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
        for r in (self.0)(record) {
            out.push(r)?;
        }
        Ok(())
    }

    fn process_batch(&mut self, batch: Vec<T>, out: &mut dyn Output<I::Item>) -> OpResult {
        let mut next = Vec::with_capacity(batch.len());
        for record in batch {
            next.extend((self.0)(record));
        }
        out.push_batch(next)
    }
}

/// Keeps the records a predicate accepts.
pub struct FilterOperator<F>(pub Arc<F>);

impl<T, F> OneInputOperator<T> for FilterOperator<F>
where
    T: Send + 'static,
    F: Fn(&T) -> bool + Send + Sync + 'static,
{
    type Out = T;

    #[inline]
    fn process(&mut self, record: T, out: &mut dyn Output<T>) -> OpResult {
        if (self.0)(&record) {
            out.push(record)
        } else {
            Ok(())
        }
    }

    fn process_batch(&mut self, mut batch: Vec<T>, out: &mut dyn Output<T>) -> OpResult {
        let f = &*self.0;
        batch.retain(|r| f(r));
        out.push_batch(batch)
    }
}
