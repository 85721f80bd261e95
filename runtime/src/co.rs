//! Two streams connected into one keyed operator (Flink's `ConnectedStreams` keyed by a key of
//! each side, with a `KeyedCoProcessFunction`): both sides' records of a key meet in one subtask,
//! with that key's state and timers.
//!
//! Built on the public API: each side is mapped into a [`Side`] (chained to it, at its
//! parallelism), the two are `union`ed and keyed by the side's own key, and a keyed process
//! function dispatches each record to `process_element1` or `process_element2`. So the state,
//! timers, checkpoints, rescaling and watermarks (the minimum over both sides) are exactly
//! those of a keyed process function.

use crate::env::{DataStream, KeyedStream};
use crate::error::TaskError;
use crate::keyed::{Collector, KeyedContext, KeyedProcessFunction, KeyedStateRegistry, TimeDomain};
use serde::{Deserialize, Serialize};
use std::marker::PhantomData;
use weir_network::Data;
use weir_state::StateKey;

/// A record of either side of a connected stream.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Side<A, B> {
    /// From the first stream (the one `connect` was called on).
    First(A),
    /// From the second stream.
    Second(B),
}

/// Two streams, before they are keyed (Flink's `ConnectedStreams`).
pub struct ConnectedStreams<A, B> {
    first: DataStream<A>,
    second: DataStream<B>,
}

impl<A: Data> DataStream<A> {
    /// Connects `second` to this stream, for a function that sees both (Flink's `connect`).
    pub fn connect<B: Data>(self, second: DataStream<B>) -> ConnectedStreams<A, B> {
        ConnectedStreams {
            first: self,
            second,
        }
    }
}

/// Helps a closure that returns a reference into its argument be typed for every lifetime.
fn key_fn<T, K, F>(f: F) -> F
where
    F: for<'a> Fn(&'a T) -> &'a K,
{
    f
}

impl<A: Data, B: Data> ConnectedStreams<A, B> {
    /// Keys both sides, each by its own key of the same type (Flink's `keyBy(key1, key2)`): a
    /// key's records from both meet in one subtask.
    pub fn key_by<K: StateKey>(
        self,
        first_key: impl for<'a> Fn(&'a A) -> &'a K + Send + Sync + 'static,
        second_key: impl for<'a> Fn(&'a B) -> &'a K + Send + Sync + 'static,
    ) -> KeyedConnectedStreams<K, A, B> {
        KeyedConnectedStreams {
            keyed: keyed_sides(self.first, self.second, first_key, second_key),
        }
    }
}

/// Both streams as one stream of [`Side`]s keyed by each side's key.
pub(crate) fn keyed_sides<K: StateKey, A: Data, B: Data>(
    first: DataStream<A>,
    second: DataStream<B>,
    first_key: impl for<'a> Fn(&'a A) -> &'a K + Send + Sync + 'static,
    second_key: impl for<'a> Fn(&'a B) -> &'a K + Send + Sync + 'static,
) -> KeyedStream<K, Side<A, B>> {
    // Each wrapping map runs at its side's parallelism, so it chains to it.
    let p1 = first.parallelism();
    let first = first.map(Side::<A, B>::First).set_parallelism(p1);
    let p2 = second.parallelism();
    let second = second.map(Side::<A, B>::Second).set_parallelism(p2);
    first
        .union(vec![second])
        .key_by(key_fn(move |s: &Side<A, B>| -> &K {
            match s {
                Side::First(a) => first_key(a),
                Side::Second(b) => second_key(b),
            }
        }))
}

/// Two keyed streams, connected (Flink's keyed `ConnectedStreams`).
pub struct KeyedConnectedStreams<K, A, B> {
    keyed: KeyedStream<K, Side<A, B>>,
}

/// A function over two keyed streams, with keyed state and timers shared by both sides (Flink's
/// `KeyedCoProcessFunction`).
pub trait KeyedCoProcessFunction<K: StateKey, A, B, O>: Send + 'static {
    /// Registers the states it uses. Called once per attempt, after restore.
    fn open(&mut self, states: &mut KeyedStateRegistry<'_, K>) -> Result<(), TaskError>;

    /// A record of the first stream, with its key's state.
    fn process_element1(
        &mut self,
        record: A,
        ctx: &mut KeyedContext<'_, K>,
        out: &mut Collector<'_, O>,
    ) -> Result<(), TaskError>;

    /// A record of the second stream, with its key's state.
    fn process_element2(
        &mut self,
        record: B,
        ctx: &mut KeyedContext<'_, K>,
        out: &mut Collector<'_, O>,
    ) -> Result<(), TaskError>;

    /// A timer of the current key fired (see [`KeyedProcessFunction::on_timer`]).
    fn on_timer(
        &mut self,
        _timestamp: i64,
        _domain: TimeDomain,
        _ctx: &mut KeyedContext<'_, K>,
        _out: &mut Collector<'_, O>,
    ) -> Result<(), TaskError> {
        Ok(())
    }
}

/// A co-process function as the keyed process function over [`Side`]s that runs it.
struct CoProcess<P, A, B> {
    function: P,
    _sides: PhantomData<fn(A, B)>,
}

impl<K, A, B, O, P> KeyedProcessFunction<K, Side<A, B>, O> for CoProcess<P, A, B>
where
    K: StateKey,
    A: 'static,
    B: 'static,
    P: KeyedCoProcessFunction<K, A, B, O>,
{
    fn open(&mut self, states: &mut KeyedStateRegistry<'_, K>) -> Result<(), TaskError> {
        self.function.open(states)
    }

    fn process_element(
        &mut self,
        record: Side<A, B>,
        ctx: &mut KeyedContext<'_, K>,
        out: &mut Collector<'_, O>,
    ) -> Result<(), TaskError> {
        match record {
            Side::First(a) => self.function.process_element1(a, ctx, out),
            Side::Second(b) => self.function.process_element2(b, ctx, out),
        }
    }

    fn on_timer(
        &mut self,
        timestamp: i64,
        domain: TimeDomain,
        ctx: &mut KeyedContext<'_, K>,
        out: &mut Collector<'_, O>,
    ) -> Result<(), TaskError> {
        self.function.on_timer(timestamp, domain, ctx, out)
    }
}

impl<K: StateKey, A: Data, B: Data> KeyedConnectedStreams<K, A, B> {
    /// Runs a [`KeyedCoProcessFunction`] made per subtask by `make`. Name its state with
    /// `.uid(..)` on the result, as for any keyed operator.
    pub fn process<O: Data, P>(
        self,
        name: &str,
        make: impl Fn() -> P + Send + Sync + 'static,
    ) -> DataStream<O>
    where
        P: KeyedCoProcessFunction<K, A, B, O>,
    {
        self.keyed.process(name, move || CoProcess {
            function: make(),
            _sides: PhantomData,
        })
    }
}
