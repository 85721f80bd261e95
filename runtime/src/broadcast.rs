//! The broadcast state pattern (Flink's `connect(broadcastStream).process(..)`): a stream,
//! plain or keyed, connected to a broadcast stream whose elements update a map that every
//! subtask holds in full, and that the main stream's elements read.
//!
//! A connected stream is one input of [`Connected`] records: the main stream's producers wrap
//! each record as [`Connected::Element`] (chained, no copy) and send it by their partitioner
//! (hash for a keyed stream); the broadcast side wraps as [`Connected::Broadcast`] and goes to
//! every subtask. Both sides meet in one input gate, so checkpoint barriers align over the two
//! like over any channels. The broadcast state is operator state in the `Broadcast` mode:
//! each subtask snapshots its copy, and a restore at any parallelism gives every subtask one.

use crate::error::TaskError;
use crate::keyed::{
    Collector, KeyFn, KeyedBase, KeyedContext, KeyedStateRegistry, TimeDomain, TimerService,
};
use crate::operator::{Lifecycle, OneInputOperator, OpResult, OperatorSnapshotParts, Output};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use weir_core::element::Watermark;
use weir_core::handle::OperatorStateMode;
use weir_core::ids::OperatorId;
use weir_state::{MapKey, OperatorListState, OperatorStateBackend, StateKey, StateValue};

/// A record of a connected stream: from the main input, or from the broadcast side.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Connected<T, B> {
    /// From the main stream.
    Element(T),
    /// From the broadcast stream.
    Broadcast(B),
}

/// The name of the operator state that holds the broadcast state.
pub const BROADCAST_STATE: &str = "broadcast-state";

/// A function over a plain stream connected to a broadcast stream (Flink's
/// `BroadcastProcessFunction`). The broadcast state is a map from `Self::Key` to `Self::Value`.
pub trait BroadcastProcessFunction<I, B, O>: Send + 'static {
    /// The broadcast state's keys.
    type Key: MapKey;
    /// The broadcast state's values.
    type Value: StateValue;

    /// A main-stream record, with read-only access to the broadcast state.
    fn process_element(
        &mut self,
        record: I,
        broadcast: &BTreeMap<Self::Key, Self::Value>,
        out: &mut Collector<'_, O>,
    ) -> Result<(), TaskError>;

    /// A broadcast record, which may update the broadcast state. Every subtask receives every
    /// broadcast record and must update its state the same way, so all copies stay equal.
    fn process_broadcast_element(
        &mut self,
        record: B,
        broadcast: &mut BTreeMap<Self::Key, Self::Value>,
        out: &mut Collector<'_, O>,
    ) -> Result<(), TaskError>;
}

/// A function over a keyed stream connected to a broadcast stream (Flink's
/// `KeyedBroadcastProcessFunction`): main-stream records also have their key's state and timers.
pub trait KeyedBroadcastProcessFunction<K: StateKey, I, B, O>: Send + 'static {
    /// The broadcast state's keys.
    type Key: MapKey;
    /// The broadcast state's values.
    type Value: StateValue;

    /// Registers the keyed states it uses. Called once per attempt, after restore.
    fn open(&mut self, _states: &mut KeyedStateRegistry<'_, K>) -> Result<(), TaskError> {
        Ok(())
    }

    /// A main-stream record, with its key's state and read-only broadcast state.
    fn process_element(
        &mut self,
        record: I,
        broadcast: &BTreeMap<Self::Key, Self::Value>,
        ctx: &mut KeyedContext<'_, K>,
        out: &mut Collector<'_, O>,
    ) -> Result<(), TaskError>;

    /// A broadcast record, which may update the broadcast state (the same way in every subtask).
    fn process_broadcast_element(
        &mut self,
        record: B,
        broadcast: &mut BTreeMap<Self::Key, Self::Value>,
        out: &mut Collector<'_, O>,
    ) -> Result<(), TaskError>;

    /// A timer of the current key fired.
    fn on_timer(
        &mut self,
        _timestamp: i64,
        _domain: TimeDomain,
        _broadcast: &BTreeMap<Self::Key, Self::Value>,
        _ctx: &mut KeyedContext<'_, K>,
        _out: &mut Collector<'_, O>,
    ) -> Result<(), TaskError> {
        Ok(())
    }
}

/// The broadcast state of one subtask and its operator-state snapshot.
struct BroadcastState<BK, BV> {
    operator_id: OperatorId,
    map: BTreeMap<BK, BV>,
    backend: OperatorStateBackend,
    list: Option<OperatorListState<(BK, BV)>>,
}

impl<BK: MapKey, BV: StateValue> BroadcastState<BK, BV> {
    fn new(operator_id: OperatorId) -> Self {
        BroadcastState {
            operator_id,
            map: BTreeMap::new(),
            backend: OperatorStateBackend::new(),
            list: None,
        }
    }

    /// Restores the broadcast copy handed to this subtask. Takes only the operator-state blobs,
    /// leaving keyed state for the keyed base.
    fn open(&mut self, ctx: &mut crate::operator::RestoreContext) -> OpResult {
        if let Some(restored) = ctx.operators.get_mut(&self.operator_id) {
            let blobs = std::mem::take(&mut restored.operator);
            let blobs: Vec<&[u8]> = blobs.iter().map(|b| b.as_slice()).collect();
            self.backend.restore(&blobs)?;
        }
        let list = self
            .backend
            .list_state::<(BK, BV)>(BROADCAST_STATE, OperatorStateMode::Broadcast)?;
        self.map = self.backend.get(&list)?.into_iter().collect();
        self.list = Some(list);
        Ok(())
    }

    /// Freezes the map into operator state.
    fn snapshot(&mut self) -> Result<weir_state::OperatorSnapshot, TaskError> {
        if let Some(list) = &self.list {
            let entries: Vec<(BK, BV)> = self
                .map
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            self.backend.update(list, &entries)?;
        }
        Ok(self.backend.snapshot())
    }
}

/// Runs a [`BroadcastProcessFunction`].
pub struct BroadcastProcessOperator<I, B, O, F: BroadcastProcessFunction<I, B, O>> {
    state: BroadcastState<F::Key, F::Value>,
    function: F,
    _types: std::marker::PhantomData<fn(I, B) -> O>,
}

impl<I, B, O, F: BroadcastProcessFunction<I, B, O>> BroadcastProcessOperator<I, B, O, F> {
    /// Runs `function` as operator `operator_id`.
    pub fn new(operator_id: OperatorId, function: F) -> Self {
        BroadcastProcessOperator {
            state: BroadcastState::new(operator_id),
            function,
            _types: std::marker::PhantomData,
        }
    }
}

impl<I, B, O, F> OneInputOperator<Connected<I, B>> for BroadcastProcessOperator<I, B, O, F>
where
    I: Send + 'static,
    B: Send + 'static,
    O: Send + 'static,
    F: BroadcastProcessFunction<I, B, O>,
{
    type Out = O;

    fn process(&mut self, record: Connected<I, B>, out: &mut dyn Output<O>) -> OpResult {
        let mut out = Collector::new(out);
        match record {
            Connected::Element(r) => self.function.process_element(r, &self.state.map, &mut out),
            Connected::Broadcast(b) => {
                self.function
                    .process_broadcast_element(b, &mut self.state.map, &mut out)
            }
        }
    }

    fn lifecycle(&mut self, event: &mut Lifecycle<'_>, _out: &mut dyn Output<O>) -> OpResult {
        match event {
            Lifecycle::Open(ctx) => self.state.open(ctx)?,
            Lifecycle::Snapshot(_, _, parts) => parts.push(OperatorSnapshotParts {
                operator_id: self.state.operator_id,
                keyed: None,
                operator: Some(self.state.snapshot()?),
            }),
            _ => {}
        }
        Ok(())
    }
}

/// Runs a [`KeyedBroadcastProcessFunction`] with keyed state and timers.
pub struct KeyedBroadcastProcessOperator<K: StateKey, I, B, O, F>
where
    F: KeyedBroadcastProcessFunction<K, I, B, O>,
{
    base: KeyedBase<K>,
    key: KeyFn<I, K>,
    state: BroadcastState<F::Key, F::Value>,
    timers: Option<TimerService<K>>,
    function: F,
    _types: std::marker::PhantomData<fn(I, B) -> O>,
}

impl<K: StateKey, I, B, O, F> KeyedBroadcastProcessOperator<K, I, B, O, F>
where
    F: KeyedBroadcastProcessFunction<K, I, B, O>,
{
    /// Runs `function` keyed by `key`.
    pub fn new(base: KeyedBase<K>, key: KeyFn<I, K>, function: F) -> Self {
        let operator_id = base.operator_id;
        KeyedBroadcastProcessOperator {
            base,
            key,
            state: BroadcastState::new(operator_id),
            timers: None,
            function,
            _types: std::marker::PhantomData,
        }
    }

    fn fire(&mut self, domain: TimeDomain, until: i64, out: &mut dyn Output<O>) -> OpResult {
        let Some(timers) = self.timers.as_mut() else {
            return Ok(());
        };
        let max_parallelism = self.base.info.max_parallelism;
        while let Some((ts, key, key_group)) =
            timers.pop_due(&mut self.base.backend, domain, until, max_parallelism)
        {
            let mut ctx = KeyedContext::new(&key, key_group, &mut self.base.backend, timers);
            self.function.on_timer(
                ts,
                domain,
                &self.state.map,
                &mut ctx,
                &mut Collector::new(&mut *out),
            )?;
        }
        if domain == TimeDomain::ProcessingTime {
            timers.publish_processing_time();
        }
        Ok(())
    }
}

impl<K, I, B, O, F> OneInputOperator<Connected<I, B>>
    for KeyedBroadcastProcessOperator<K, I, B, O, F>
where
    K: StateKey,
    I: Send + 'static,
    B: Send + 'static,
    O: Send + 'static,
    F: KeyedBroadcastProcessFunction<K, I, B, O>,
{
    type Out = O;

    fn process(&mut self, record: Connected<I, B>, out: &mut dyn Output<O>) -> OpResult {
        let mut collector = Collector::new(out);
        match record {
            Connected::Element(r) => {
                let key = (self.key)(&r).clone();
                let key_group = self.base.key_group(&key);
                let timers = self.timers.as_mut().ok_or_else(|| TaskError::Operator {
                    operator: "KeyedBroadcastProcess".into(),
                    message: "a record arrived before the operator was opened".into(),
                })?;
                let mut ctx = KeyedContext::new(&key, key_group, &mut self.base.backend, timers);
                self.function
                    .process_element(r, &self.state.map, &mut ctx, &mut collector)
            }
            Connected::Broadcast(b) => {
                self.function
                    .process_broadcast_element(b, &mut self.state.map, &mut collector)
            }
        }
    }

    fn watermark(&mut self, watermark: Watermark, out: &mut dyn Output<O>) -> OpResult {
        if let Some(t) = self.timers.as_mut() {
            t.advance_watermark(watermark.0);
        }
        self.fire(TimeDomain::EventTime, watermark.0, out)?;
        out.watermark(watermark)
    }

    fn lifecycle(&mut self, event: &mut Lifecycle<'_>, out: &mut dyn Output<O>) -> OpResult {
        match event {
            Lifecycle::Open(ctx) => {
                // The broadcast copy first: the keyed base takes the rest of the entry.
                self.state.open(ctx)?;
                self.base.lifecycle(event)?;
                self.timers = Some(TimerService::open(
                    &mut self.base.backend,
                    self.base.info.processing_time.clone(),
                )?);
                self.function
                    .open(&mut KeyedStateRegistry::new(&mut self.base.backend))?;
            }
            Lifecycle::Snapshot(_, _, parts) => {
                let keyed = self.base.backend_snapshot()?;
                parts.push(OperatorSnapshotParts {
                    operator_id: self.state.operator_id,
                    keyed: Some(keyed),
                    operator: Some(self.state.snapshot()?),
                });
            }
            Lifecycle::ProcessingTime(now) => {
                let now = *now;
                self.fire(TimeDomain::ProcessingTime, now, out)?;
            }
            _ => {}
        }
        Ok(())
    }
}
