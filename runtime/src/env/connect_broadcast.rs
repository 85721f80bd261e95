//! The broadcast state pattern's part of the DataStream API: a stream, keyed or not, connected
//! to a broadcast stream ([`DataStream::connect_broadcast`]) and the operator that reads both.

use super::{DataStream, KeyedStream, StreamEnvironment};
use crate::broadcast::{
    BroadcastProcessFunction, BroadcastProcessOperator, Connected, KeyedBroadcastProcessFunction,
    KeyedBroadcastProcessOperator,
};
use crate::keyed::{KeyFn, KeyedBase};
use crate::operator::Chained;
use crate::writer::KeyHashFn;
use std::any::Any;
use std::sync::Arc;
use weir_core::ids::NodeId;
use weir_core::partition::Partitioner;
use weir_network::Data;
use weir_state::StateKey;

/// A stream connected to a broadcast stream ([`DataStream::connect_broadcast`]).
pub struct BroadcastConnectedStream<T, B> {
    main: DataStream<Connected<T, B>>,
    broadcast: DataStream<Connected<T, B>>,
}

/// A keyed stream connected to a broadcast stream ([`KeyedStream::connect_broadcast`]).
pub struct KeyedBroadcastConnectedStream<K, T, B> {
    main: DataStream<Connected<T, B>>,
    broadcast: DataStream<Connected<T, B>>,
    key: KeyFn<T, K>,
}

/// Wraps both sides of a connection into one record type; the broadcast side goes to every
/// subtask of the operator that reads them.
fn connect_sides<T: Data, B: Data>(
    mut main: DataStream<T>,
    broadcast: DataStream<B>,
) -> BroadcastConnectedStream<T, B> {
    // Each wrapping map runs at its input's parallelism, so it chains to it (a direct call, the
    // records' order kept) whatever the environment's default parallelism is.
    let parallelism_of =
        |env: &StreamEnvironment, node: NodeId| env.inner.borrow().graph.node(node).parallelism;
    let partitioner = main.partitioner.take();
    let main_parallelism = parallelism_of(&main.env, main.node);
    let mut main = main
        .map(Connected::Element)
        .set_parallelism(main_parallelism);
    main.partitioner = partitioner;
    let broadcast_parallelism = parallelism_of(&broadcast.env, broadcast.node);
    let broadcast = broadcast
        .map(Connected::Broadcast)
        .set_parallelism(broadcast_parallelism)
        .partition_by(Partitioner::Broadcast);
    BroadcastConnectedStream { main, broadcast }
}

impl<T: Data> DataStream<T> {
    /// Connects a broadcast stream: every subtask of the next operator sees all of its records
    /// and keeps broadcast state from them, which this stream's records read (Flink's broadcast
    /// state pattern).
    pub fn connect_broadcast<B: Data>(
        self,
        broadcast: DataStream<B>,
    ) -> BroadcastConnectedStream<T, B> {
        connect_sides(self, broadcast)
    }
}

impl<K: StateKey, T: Data> KeyedStream<K, T> {
    /// Connects a broadcast stream to this keyed stream (Flink's broadcast state pattern with a
    /// `KeyedBroadcastProcessFunction`).
    pub fn connect_broadcast<B: Data>(
        self,
        broadcast: DataStream<B>,
    ) -> KeyedBroadcastConnectedStream<K, T, B> {
        let partitioner = if self.reinterpreted {
            Partitioner::Forward
        } else {
            Partitioner::Hash
        };
        let BroadcastConnectedStream { main, broadcast } =
            connect_sides(self.stream.partition_by(partitioner), broadcast);
        KeyedBroadcastConnectedStream {
            main,
            broadcast,
            key: self.key,
        }
    }
}

impl<T: Data, B: Data> BroadcastConnectedStream<T, B> {
    /// Runs a [`BroadcastProcessFunction`] made per subtask by `make`.
    pub fn process<O: Data, F>(
        self,
        name: &str,
        make: impl Fn() -> F + Send + Sync + 'static,
    ) -> DataStream<O>
    where
        F: BroadcastProcessFunction<T, B, O>,
    {
        let env = self.main.env.clone();
        let broadcast_node = self.broadcast.node;
        let out = self.main.transform(name, move |ctx, next| {
            Box::new(Chained::new(
                BroadcastProcessOperator::new(ctx.operator_id, make()),
                next,
            ))
        });
        env.inner
            .borrow_mut()
            .graph
            .add_edge(broadcast_node, out.node, Partitioner::Broadcast);
        out
    }
}

impl<K: StateKey, T: Data, B: Data> KeyedBroadcastConnectedStream<K, T, B> {
    /// Runs a [`KeyedBroadcastProcessFunction`] made per subtask by `make`.
    pub fn process<O: Data, F>(
        self,
        name: &str,
        make: impl Fn() -> F + Send + Sync + 'static,
    ) -> DataStream<O>
    where
        F: KeyedBroadcastProcessFunction<K, T, B, O>,
    {
        let env = self.main.env.clone();
        let from = self.main.node;
        let broadcast_node = self.broadcast.node;
        let hashed = self.main.partitioner == Some(Partitioner::Hash);
        let key = self.key.clone();
        let out = self.main.transform(name, move |ctx, next| {
            let base = KeyedBase::new(ctx.operator_id, ctx.info.clone());
            Box::new(Chained::new(
                KeyedBroadcastProcessOperator::new(base, key.clone(), make()),
                next,
            ))
        });
        let mut inner = env.inner.borrow_mut();
        inner
            .graph
            .add_edge(broadcast_node, out.node, Partitioner::Broadcast);
        if hashed {
            let hash_key = self.key;
            let key_hash: KeyHashFn<Connected<T, B>> =
                Arc::new(move |c: &Connected<T, B>| match c {
                    Connected::Element(t) => hash_key(t).key_hash(),
                    // Broadcast records never take the hashed edge.
                    Connected::Broadcast(_) => 0,
                });
            inner.key_hashes.insert(
                (from, out.node),
                Arc::new(key_hash) as Arc<dyn Any + Send + Sync>,
            );
        }
        drop(inner);
        out
    }
}
