//! Keyed operators: `sum`, `reduce` and the keyed process function, over a keyed-state backend
//! that owns this subtask's key groups.
//!
//! Each record's key is read by reference from the record ([`KeyFn`]); its key group is computed
//! once per record and passed to the backend, which never hashes it again for routing.

use crate::error::TaskError;
use crate::operator::ProcessingTimeService;
use crate::operator::{
    Lifecycle, OneInputOperator, OpResult, OperatorSnapshotParts, Output, SubtaskInfo,
};
use std::collections::{BTreeMap, BTreeSet};
use std::ops::Add;
use std::sync::Arc;
use weir_core::element::{SnapshotKind, Watermark};
use weir_core::ids::OperatorId;
use weir_core::keygroup::{KeyGroup, KeyGroupAssigner, assign_to_key_group};
use weir_state::{
    AggregatingState, AggregatingStateDescriptor, KeyedAccess, KeyedBackend,
    KeyedBackendParameters, KeyedStateBackend, ListState, ListStateDescriptor, MapKey, MapState,
    MapStateDescriptor, ReducingState, ReducingStateDescriptor, RestorePart, StateError, StateKey,
    StateValue, ValueState, ValueStateDescriptor,
};

/// Reads a record's key by reference (Flink's `KeySelector`).
pub type KeyFn<T, K> = Arc<dyn for<'a> Fn(&'a T) -> &'a K + Send + Sync>;

/// The keyed-state part every keyed operator shares: its backend and how it opens, restores and
/// snapshots.
pub struct KeyedBase<K: StateKey> {
    pub(crate) operator_id: OperatorId,
    pub(crate) info: SubtaskInfo,
    pub(crate) backend: KeyedBackend<K>,
    /// Key groups by the subtask's max parallelism, without a division per key.
    assigner: KeyGroupAssigner,
    /// Why the job's state backend could not create this operator's: reported at open, before
    /// any record (the heap stands in until then).
    creation_failed: Option<StateError>,
}

impl<K: StateKey> KeyedBase<K> {
    /// For subtask `info`: the backend the job's state backend creates, owning the subtask's
    /// key-group range.
    pub fn new(operator_id: OperatorId, info: SubtaskInfo) -> Self {
        let range = info.key_group_range();
        let parameters = KeyedBackendParameters::new(
            operator_id,
            &info.task_name,
            info.index,
            info.max_parallelism,
            range,
        )
        .with(
            info.attempt,
            info.restored,
            info.snapshot_compression,
            info.incremental,
        );
        let (backend, creation_failed) =
            match KeyedBackend::create(info.state_backend.as_ref(), &parameters) {
                Ok(backend) => (backend, None),
                Err(e) => (KeyedBackend::heap(info.max_parallelism, range), Some(e)),
            };
        KeyedBase {
            operator_id,
            assigner: KeyGroupAssigner::new(info.max_parallelism.max(1), 1),
            info,
            backend,
            creation_failed,
        }
    }

    /// The backend.
    pub fn backend(&mut self) -> &mut KeyedBackend<K> {
        &mut self.backend
    }

    /// The synchronous part of the keyed snapshot.
    pub(crate) fn backend_snapshot(
        &mut self,
    ) -> Result<Box<dyn weir_state::KeyedSnapshot>, TaskError> {
        Ok(self.backend.snapshot()?)
    }

    /// The key groups this subtask owns.
    pub fn key_group_range(&self) -> weir_core::keygroup::KeyGroupRange {
        self.info.key_group_range()
    }

    /// The key group of `key`.
    #[inline]
    pub fn key_group(&self, key: &K) -> KeyGroup {
        self.assigner.key_group(key)
    }

    /// What [`key_group`](Self::key_group) computes with, to hold while the backend is
    /// borrowed (a batch's [`ValueAccess`](weir_state::ValueAccess)).
    #[inline]
    pub fn assigner(&self) -> KeyGroupAssigner {
        self.assigner
    }

    /// Restores native keyed snapshots from the files the subtask fetched before it opened
    /// (local-recovery copies or downloads, see [`crate::task`]): the backend keeps links or
    /// copies of its own.
    fn restore_native(
        &mut self,
        restored: &crate::operator::RestoredOperatorState,
    ) -> Result<(), TaskError> {
        let fail = |message: String| TaskError::Operator {
            operator: self.info.task_name.clone(),
            message,
        };
        let formats: Vec<&str> = restored
            .native
            .iter()
            .map(|r| r.handle.format.as_str())
            .collect();
        if !restored.keyed.is_empty() {
            return Err(fail(format!(
                "the checkpoint holds both canonical and native ({formats:?}) keyed snapshots for \
                 this subtask: restore from a savepoint"
            )));
        }
        if self.info.state_backend.local_dir().is_none() {
            return Err(fail(format!(
                "the checkpoint holds native keyed snapshots ({formats:?}), which the state \
                 backend '{}' cannot restore: restore with the backend that took them (disk), or \
                 from a savepoint",
                self.info.state_backend.name()
            )));
        }
        let mut lists = Vec::with_capacity(restored.native.len());
        for r in &restored.native {
            let mut files = Vec::with_capacity(r.handle.files.len());
            for (f, source) in r.handle.files.iter().zip(&r.files) {
                let (path, size) = match source {
                    Some(crate::operator::NativeSource::Local { path, size }) => {
                        (path.clone(), *size)
                    }
                    Some(_) => {
                        return Err(fail(format!(
                            "file {} of the native snapshot was not fetched before the open",
                            f.name
                        )));
                    }
                    None => (std::path::PathBuf::new(), 0),
                };
                files.push(weir_state::NativeFile {
                    name: f.name.clone(),
                    key_groups: f.key_groups,
                    size,
                    path,
                });
            }
            lists.push(weir_state::NativeFiles {
                format: r.handle.format.clone(),
                files,
            });
        }
        let parts: Vec<weir_state::NativeRestorePart<'_>> = restored
            .native
            .iter()
            .zip(&lists)
            .map(|(r, files)| weir_state::NativeRestorePart {
                manifest: &r.manifest,
                files,
            })
            .collect();
        self.backend.restore_native(&parts)?;
        Ok(())
    }

    /// Restores canonical keyed snapshots: sections the job master read, or sections the
    /// subtask downloaded (a backend that keeps files), which the backend reads from the files.
    /// A downloaded section found damaged makes its checkpoint unusable, as a damaged file the
    /// master reads does.
    fn restore_canonical(
        &mut self,
        keyed: &[crate::operator::RestoredKeyed],
    ) -> Result<(), TaskError> {
        use crate::operator::KeyedSections;
        let mut read = Vec::new();
        let mut files = Vec::new();
        let mut names = Vec::new();
        for r in keyed {
            match &r.sections {
                KeyedSections::Read(sections) => read.push(RestorePart {
                    handle: &r.handle,
                    header: &r.header,
                    sections: sections.clone(),
                    sections_offset: r.sections_offset,
                }),
                KeyedSections::Local {
                    path,
                    at,
                    len,
                    digest_checked,
                    location_dir,
                    file,
                } => {
                    files.push(weir_state::RestoreFilePart {
                        handle: &r.handle,
                        header: &r.header,
                        path,
                        at: *at,
                        len: *len,
                        sections_offset: r.sections_offset,
                    });
                    names.push((location_dir, file, *digest_checked));
                }
                KeyedSections::Stored { stream, .. } => {
                    return Err(TaskError::Operator {
                        operator: self.info.task_name.clone(),
                        message: format!(
                            "the keyed snapshot {stream:?} was not fetched before the open"
                        ),
                    });
                }
            }
        }
        if !read.is_empty() {
            self.backend.restore(&read)?;
        }
        // One part at a time, in the chain's order, so that a damaged section names its file.
        for (part, (location, file, digest_checked)) in files.iter().zip(names) {
            match self.backend.restore_file_parts(std::slice::from_ref(part)) {
                Ok(()) => {}
                // A file whose digest the download checked was damaged on local disk since: a
                // plain failure, and the restart downloads it again.
                Err(weir_state::StateError::Core(e @ weir_core::CoreError::Corrupt { .. }))
                    if !digest_checked =>
                {
                    return Err(TaskError::UnusableCheckpoint {
                        location: location.clone(),
                        file: file.clone(),
                        reason: e.to_string(),
                    });
                }
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }

    /// Handles the lifecycle events that concern keyed state: restore at open, freeze at snapshot.
    /// Returns true for `Open`, after which the operator registers its states.
    pub fn lifecycle(&mut self, event: &mut Lifecycle<'_>) -> Result<bool, TaskError> {
        match event {
            Lifecycle::Open(ctx) => {
                if let Some(e) = self.creation_failed.take() {
                    return Err(TaskError::Operator {
                        operator: self.info.task_name.clone(),
                        message: format!(
                            "the state backend '{}' could not create its keyed backend: {e}",
                            self.info.state_backend.name()
                        ),
                    });
                }
                if let Some(restored) = ctx.operators.remove(&self.operator_id) {
                    if !restored.native.is_empty() {
                        self.restore_native(&restored)?;
                        return Ok(true);
                    }
                    self.restore_canonical(&restored.keyed)?;
                }
                Ok(true)
            }
            Lifecycle::Snapshot(id, kind, parts) => {
                // A savepoint is full and self-contained; a checkpoint is a link of the
                // incremental chain when the backend is in incremental mode.
                let snapshot = match kind {
                    SnapshotKind::Checkpoint => self.backend.snapshot_incremental(id.0)?,
                    SnapshotKind::Savepoint | SnapshotKind::SynchronousSavepoint => {
                        self.backend.snapshot()?
                    }
                };
                parts.push(OperatorSnapshotParts {
                    operator_id: self.operator_id,
                    keyed: Some(snapshot),
                    operator: None,
                });
                Ok(false)
            }
            Lifecycle::NotifyComplete(id) => {
                self.backend.notify_checkpoint_complete(id.0);
                Ok(false)
            }
            Lifecycle::NotifyAborted(id) => {
                self.backend.notify_checkpoint_aborted(id.0);
                Ok(false)
            }
            Lifecycle::StartNewChains => {
                self.backend.start_new_chain();
                Ok(false)
            }
            _ => Ok(false),
        }
    }
}

/// A running sum of the second field per key, emitting `(first field, new sum)` per record (Flink's
/// `sum(1)` on a `Tuple2`).
pub struct SumOperator<K: StateKey, A, N> {
    base: KeyedBase<K>,
    key: KeyFn<(A, N), K>,
    state: Option<ValueState<N>>,
    /// A batch's running sums of the keys it already met.
    /// (Made at the first batch, where `N`'s bounds are known.)
    recent: Option<crate::minibatch::LatestInBatch<N>>,
}

impl<K: StateKey, A, N> SumOperator<K, A, N> {
    /// A sum keyed by `key`.
    pub fn new(base: KeyedBase<K>, key: KeyFn<(A, N), K>) -> Self {
        SumOperator {
            base,
            key,
            state: None,
            recent: None,
        }
    }
}

fn not_open(op: &str) -> TaskError {
    TaskError::Operator {
        operator: op.to_string(),
        message: "a record arrived before the operator was opened".into(),
    }
}

impl<K, A, N> OneInputOperator<(A, N)> for SumOperator<K, A, N>
where
    K: StateKey,
    A: Send + 'static,
    N: StateValue + Copy + Default + Add<Output = N>,
{
    type Out = (A, N);

    #[inline]
    fn process(&mut self, record: (A, N), out: &mut dyn Output<(A, N)>) -> OpResult {
        let state = self.state.ok_or_else(|| not_open("Sum"))?;
        let total = {
            let key = (self.key)(&record);
            let kg = self.base.key_group(key);
            let slot = self
                .base
                .backend
                .value_mut_or_insert(state, key, kg, N::default);
            *slot = *slot + record.1;
            *slot
        };
        out.push((record.0, total))
    }

    /// A batch, summed in place: each record's second field becomes its key's new total, and
    /// the batch goes downstream whole (one call for the chained sink, not one per record).
    /// The state is read and written once per key and batch
    /// ([`LatestInBatch`](crate::minibatch::LatestInBatch)).
    fn process_batch(&mut self, mut batch: Vec<(A, N)>, out: &mut dyn Output<(A, N)>) -> OpResult {
        let state = self.state.ok_or_else(|| not_open("Sum"))?;
        let assigner = self.base.assigner();
        let mut sums = self.base.backend.value_access(state);
        let key = &self.key;
        self.recent.get_or_insert_with(Default::default).sum(
            &mut batch,
            |r| key(r),
            assigner,
            &mut sums,
        );
        out.push_batch(batch)
    }

    fn lifecycle(&mut self, event: &mut Lifecycle<'_>, _out: &mut dyn Output<(A, N)>) -> OpResult {
        if self.base.lifecycle(event)? {
            self.state = Some(
                self.base
                    .backend
                    .value_state(&ValueStateDescriptor::<N>::new("sum"))?,
            );
        }
        Ok(())
    }
}

/// A running reduce per key: emits the new reduced value per record (Flink's `reduce`).
pub struct ReduceOperator<K: StateKey, T, F> {
    base: KeyedBase<K>,
    key: KeyFn<T, K>,
    f: F,
    state: Option<ValueState<T>>,
}

impl<K: StateKey, T, F> ReduceOperator<K, T, F> {
    /// A reduce keyed by `key` with `f`.
    pub fn new(base: KeyedBase<K>, key: KeyFn<T, K>, f: F) -> Self {
        ReduceOperator {
            base,
            key,
            f,
            state: None,
        }
    }
}

impl<K, T, F> OneInputOperator<T> for ReduceOperator<K, T, F>
where
    K: StateKey,
    T: StateValue,
    F: Fn(&T, &T) -> T + Send + 'static,
{
    type Out = T;

    fn process(&mut self, record: T, out: &mut dyn Output<T>) -> OpResult {
        let state = self.state.ok_or_else(|| not_open("Reduce"))?;
        let reduced = {
            let key = (self.key)(&record);
            let kg = self.base.key_group(key);
            let backend = &mut self.base.backend;
            let new = match backend.value(state, key, kg) {
                Some(old) => (self.f)(old, &record),
                None => record.clone(),
            };
            backend.update(state, key, kg, new.clone());
            new
        };
        out.push(reduced)
    }

    fn lifecycle(&mut self, event: &mut Lifecycle<'_>, _out: &mut dyn Output<T>) -> OpResult {
        if self.base.lifecycle(event)? {
            self.state = Some(
                self.base
                    .backend
                    .value_state(&ValueStateDescriptor::<T>::new("reduce"))?,
            );
        }
        Ok(())
    }
}

/// Where a keyed process function registers its states at open time.
pub struct KeyedStateRegistry<'a, K: StateKey> {
    backend: &'a mut KeyedBackend<K>,
}

impl<'a, K: StateKey> KeyedStateRegistry<'a, K> {
    /// The registry of `backend`.
    pub(crate) fn new(backend: &'a mut KeyedBackend<K>) -> Self {
        KeyedStateRegistry { backend }
    }
}

impl<K: StateKey> KeyedStateRegistry<'_, K> {
    /// Registers (or finds, after a restore) a value state.
    pub fn value_state<V: StateValue>(
        &mut self,
        descriptor: &ValueStateDescriptor<V>,
    ) -> Result<ValueState<V>, TaskError> {
        Ok(self.backend.value_state(descriptor)?)
    }

    /// Registers (or finds) a list state.
    pub fn list_state<V: StateValue>(
        &mut self,
        descriptor: &ListStateDescriptor<V>,
    ) -> Result<ListState<V>, TaskError> {
        Ok(self.backend.list_state(descriptor)?)
    }

    /// Registers (or finds) a map state.
    pub fn map_state<UK: MapKey, UV: StateValue>(
        &mut self,
        descriptor: &MapStateDescriptor<UK, UV>,
    ) -> Result<MapState<UK, UV>, TaskError> {
        Ok(self.backend.map_state(descriptor)?)
    }

    /// Registers (or finds) a reducing state.
    pub fn reducing_state<V: StateValue>(
        &mut self,
        descriptor: &ReducingStateDescriptor<V>,
    ) -> Result<ReducingState<V>, TaskError> {
        Ok(self.backend.reducing_state(descriptor)?)
    }

    /// Registers (or finds) an aggregating state.
    pub fn aggregating_state<IN: 'static, ACC: StateValue, OUT: 'static>(
        &mut self,
        descriptor: &AggregatingStateDescriptor<IN, ACC, OUT>,
    ) -> Result<AggregatingState<IN, ACC, OUT>, TaskError> {
        Ok(self.backend.aggregating_state(descriptor)?)
    }
}

/// Which clock a timer is on (Flink's `TimeDomain`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TimeDomain {
    /// Fires when the watermark reaches the timer's timestamp.
    EventTime,
    /// Fires when the wall clock reaches it.
    ProcessingTime,
}

/// The name of the keyed state that holds event-time timers (Flink's name).
pub const EVENT_TIMERS_STATE: &str = "_timer_state/event_user-timers";
/// The name of the keyed state that holds processing-time timers (Flink's name).
pub const PROCESSING_TIMERS_STATE: &str = "_timer_state/processing_user-timers";

/// A keyed operator's timers (Flink's `InternalTimerService`).
///
/// The timers themselves are keyed state: per key, the set of timestamps, in two states named
/// as Flink names them. They are snapshotted, restored and rescaled with the key groups like
/// any other keyed state. Beside them, two queues ordered by timestamp say which keys to look
/// at when time advances. The queues are rebuilt from the state after a restore. An entry whose
/// timer was deleted is skipped when it comes up.
pub struct TimerService<K: StateKey> {
    event_state: ValueState<BTreeSet<i64>>,
    processing_state: ValueState<BTreeSet<i64>>,
    event_queue: BTreeMap<i64, Vec<K>>,
    processing_queue: BTreeMap<i64, Vec<K>>,
    watermark: i64,
    processing_time: ProcessingTimeService,
}

impl<K: StateKey> TimerService<K> {
    /// Registers the timer states in `backend` (after its restore) and queues every restored
    /// timer.
    pub fn open(
        backend: &mut KeyedBackend<K>,
        processing_time: ProcessingTimeService,
    ) -> Result<Self, TaskError> {
        let event_state = backend.value_state(&ValueStateDescriptor::<BTreeSet<i64>>::new(
            EVENT_TIMERS_STATE,
        ))?;
        let processing_state = backend.value_state(&ValueStateDescriptor::<BTreeSet<i64>>::new(
            PROCESSING_TIMERS_STATE,
        ))?;
        let mut timers = TimerService {
            event_state,
            processing_state,
            event_queue: BTreeMap::new(),
            processing_queue: BTreeMap::new(),
            watermark: i64::MIN,
            processing_time,
        };
        let TimerService {
            event_queue,
            processing_queue,
            ..
        } = &mut timers;
        backend.for_each_entry(event_state, &mut |key, set| {
            for ts in set {
                event_queue.entry(*ts).or_default().push(key.clone());
            }
        });
        backend.for_each_entry(processing_state, &mut |key, set| {
            for ts in set {
                processing_queue.entry(*ts).or_default().push(key.clone());
            }
        });
        timers.publish_processing_time();
        Ok(timers)
    }

    /// Tells the task when the earliest processing-time timer is due.
    pub(crate) fn publish_processing_time(&self) {
        if let Some((&ts, _)) = self.processing_queue.first_key_value() {
            self.processing_time.request(ts);
        }
    }

    /// The latest watermark this operator saw.
    pub fn current_watermark(&self) -> i64 {
        self.watermark
    }

    /// The operator saw watermark `w`.
    pub(crate) fn advance_watermark(&mut self, w: i64) {
        self.watermark = self.watermark.max(w);
    }

    /// Number of timers queued (a deleted timer counts until its time comes).
    pub fn queued(&self) -> usize {
        self.event_queue.values().map(Vec::len).sum::<usize>()
            + self.processing_queue.values().map(Vec::len).sum::<usize>()
    }

    pub(crate) fn register(
        &mut self,
        backend: &mut KeyedBackend<K>,
        domain: TimeDomain,
        key: &K,
        key_group: KeyGroup,
        ts: i64,
    ) {
        let (state, queue) = match domain {
            TimeDomain::EventTime => (self.event_state, &mut self.event_queue),
            TimeDomain::ProcessingTime => (self.processing_state, &mut self.processing_queue),
        };
        if backend
            .value_mut_or_insert(state, key, key_group, BTreeSet::new)
            .insert(ts)
        {
            queue.entry(ts).or_default().push(key.clone());
            if domain == TimeDomain::ProcessingTime {
                self.processing_time.request(ts);
            }
        }
    }

    pub(crate) fn delete(
        &mut self,
        backend: &mut KeyedBackend<K>,
        domain: TimeDomain,
        key: &K,
        key_group: KeyGroup,
        ts: i64,
    ) {
        let state = match domain {
            TimeDomain::EventTime => self.event_state,
            TimeDomain::ProcessingTime => self.processing_state,
        };
        if backend
            .value(state, key, key_group)
            .is_some_and(|set| set.contains(&ts))
        {
            let set = backend.value_mut_or_insert(state, key, key_group, BTreeSet::new);
            set.remove(&ts);
            if set.is_empty() {
                backend.clear(state, key, key_group);
            }
        }
    }

    /// Takes the next timer of `domain` due at `until`: its timestamp and key, removed from the
    /// state. Deleted timers are skipped.
    pub(crate) fn pop_due(
        &mut self,
        backend: &mut KeyedBackend<K>,
        domain: TimeDomain,
        until: i64,
        max_parallelism: u32,
    ) -> Option<(i64, K, KeyGroup)> {
        let (state, queue) = match domain {
            TimeDomain::EventTime => (self.event_state, &mut self.event_queue),
            TimeDomain::ProcessingTime => (self.processing_state, &mut self.processing_queue),
        };
        loop {
            let mut entry = queue.first_entry()?;
            let ts = *entry.key();
            if ts > until {
                return None;
            }
            let key = match entry.get_mut().pop() {
                Some(k) => k,
                None => {
                    entry.remove();
                    continue;
                }
            };
            if entry.get().is_empty() {
                entry.remove();
            }
            let kg = assign_to_key_group(&key, max_parallelism);
            if backend
                .value(state, &key, kg)
                .is_some_and(|set| set.contains(&ts))
            {
                self.delete(backend, domain, &key, kg, ts);
                return Some((ts, key, kg));
            }
        }
    }
}

/// The current key and its state, during `process_element` and `on_timer`.
pub struct KeyedContext<'a, K: StateKey> {
    key: &'a K,
    key_group: KeyGroup,
    backend: &'a mut KeyedBackend<K>,
    timers: &'a mut TimerService<K>,
}

impl<'a, K: StateKey> KeyedContext<'a, K> {
    /// The context of `key` (in `key_group`).
    pub(crate) fn new(
        key: &'a K,
        key_group: KeyGroup,
        backend: &'a mut KeyedBackend<K>,
        timers: &'a mut TimerService<K>,
    ) -> Self {
        KeyedContext {
            key,
            key_group,
            backend,
            timers,
        }
    }

    /// The key of the record being processed.
    pub fn current_key(&self) -> &K {
        self.key
    }

    /// The latest watermark the operator saw (`i64::MIN` before the first).
    pub fn current_watermark(&self) -> i64 {
        self.timers.current_watermark()
    }

    /// Wall-clock time now, in ms since the Unix epoch.
    pub fn current_processing_time(&self) -> i64 {
        ProcessingTimeService::now_ms()
    }

    /// Fires `on_timer` for the current key once the watermark reaches `timestamp`. Registering
    /// the same timestamp twice for a key keeps one timer.
    pub fn register_event_time_timer(&mut self, timestamp: i64) {
        self.timers.register(
            self.backend,
            TimeDomain::EventTime,
            self.key,
            self.key_group,
            timestamp,
        )
    }

    /// Fires `on_timer` for the current key once the wall clock reaches `timestamp` (ms since
    /// the Unix epoch).
    pub fn register_processing_time_timer(&mut self, timestamp: i64) {
        self.timers.register(
            self.backend,
            TimeDomain::ProcessingTime,
            self.key,
            self.key_group,
            timestamp,
        )
    }

    /// Deletes the current key's event-time timer at `timestamp`, if any.
    pub fn delete_event_time_timer(&mut self, timestamp: i64) {
        self.timers.delete(
            self.backend,
            TimeDomain::EventTime,
            self.key,
            self.key_group,
            timestamp,
        )
    }

    /// Deletes the current key's processing-time timer at `timestamp`, if any.
    pub fn delete_processing_time_timer(&mut self, timestamp: i64) {
        self.timers.delete(
            self.backend,
            TimeDomain::ProcessingTime,
            self.key,
            self.key_group,
            timestamp,
        )
    }

    /// Every state of the current key: list, map, reducing and aggregating states as well as
    /// value states (`ctx.state().list_add(items, x)`).
    pub fn state(&mut self) -> KeyedAccess<'_, K, KeyedBackend<K>> {
        KeyedAccess::new(self.backend, self.key, self.key_group)
    }

    /// The current key's value of `state` (with its time-to-live applied, if it has one).
    pub fn value<V: StateValue>(&mut self, state: ValueState<V>) -> Option<&V> {
        if state.ttl.is_some() {
            return KeyedAccess::new(&mut *self.backend, self.key, self.key_group)
                .into_value(state);
        }
        self.backend.value(state, self.key, self.key_group)
    }

    /// Sets the current key's value of `state`.
    pub fn update<V: StateValue>(&mut self, state: ValueState<V>, value: V) {
        KeyedAccess::new(&mut *self.backend, self.key, self.key_group).update(state, value)
    }

    /// Clears the current key's value of `state`.
    pub fn clear<V: StateValue>(&mut self, state: ValueState<V>) {
        self.backend.clear(state, self.key, self.key_group)
    }
}

/// Emits records from a process function.
pub struct Collector<'a, O> {
    out: &'a mut dyn Output<O>,
}

impl<'a, O> Collector<'a, O> {
    /// Emits into `out`.
    pub(crate) fn new(out: &'a mut dyn Output<O>) -> Self {
        Collector { out }
    }
}

impl<O> Collector<'_, O> {
    /// Emits one record downstream.
    pub fn collect(&mut self, record: O) -> OpResult {
        self.out.push(record)
    }
}

/// A function over a keyed stream with keyed state and timers (Flink's `KeyedProcessFunction`).
pub trait KeyedProcessFunction<K: StateKey, I, O>: Send + 'static {
    /// Registers the states it uses. Called once per attempt, after restore.
    fn open(&mut self, states: &mut KeyedStateRegistry<'_, K>) -> Result<(), TaskError>;

    /// Processes one record with its key's state.
    fn process_element(
        &mut self,
        record: I,
        ctx: &mut KeyedContext<'_, K>,
        out: &mut Collector<'_, O>,
    ) -> Result<(), TaskError>;

    /// A timer of the current key fired: an event-time timer when the watermark reached
    /// `timestamp`, a processing-time timer when the wall clock did. Timers survive failures:
    /// they are checkpointed with the keyed state.
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

/// Runs a [`KeyedProcessFunction`] with its timers.
pub struct ProcessOperator<K: StateKey, I, O, P> {
    base: KeyedBase<K>,
    key: KeyFn<I, K>,
    function: P,
    timers: Option<TimerService<K>>,
    _out: std::marker::PhantomData<fn() -> O>,
}

impl<K: StateKey, I, O, P> ProcessOperator<K, I, O, P> {
    /// Runs `function` keyed by `key`.
    pub fn new(base: KeyedBase<K>, key: KeyFn<I, K>, function: P) -> Self {
        ProcessOperator {
            base,
            key,
            function,
            timers: None,
            _out: std::marker::PhantomData,
        }
    }
}

impl<K: StateKey, I, O, P: KeyedProcessFunction<K, I, O>> ProcessOperator<K, I, O, P> {
    /// Fires every timer of `domain` due at `until`, in timestamp order (timers the function
    /// registers while firing included).
    fn fire(&mut self, domain: TimeDomain, until: i64, out: &mut dyn Output<O>) -> OpResult {
        let Some(timers) = self.timers.as_mut() else {
            return Err(not_open("Process"));
        };
        let max_parallelism = self.base.info.max_parallelism;
        while let Some((ts, key, key_group)) =
            timers.pop_due(&mut self.base.backend, domain, until, max_parallelism)
        {
            let mut ctx = KeyedContext {
                key: &key,
                key_group,
                backend: &mut self.base.backend,
                timers,
            };
            self.function
                .on_timer(ts, domain, &mut ctx, &mut Collector { out: &mut *out })?;
        }
        if domain == TimeDomain::ProcessingTime {
            timers.publish_processing_time();
        }
        Ok(())
    }
}

impl<K, I, O, P> OneInputOperator<I> for ProcessOperator<K, I, O, P>
where
    K: StateKey,
    I: Send + 'static,
    O: Send + 'static,
    P: KeyedProcessFunction<K, I, O>,
{
    type Out = O;

    fn process(&mut self, record: I, out: &mut dyn Output<O>) -> OpResult {
        let key = (self.key)(&record).clone();
        let key_group = self.base.key_group(&key);
        let timers = self.timers.as_mut().ok_or_else(|| not_open("Process"))?;
        let mut ctx = KeyedContext {
            key: &key,
            key_group,
            backend: &mut self.base.backend,
            timers,
        };
        self.function
            .process_element(record, &mut ctx, &mut Collector { out })
    }

    fn watermark(&mut self, watermark: Watermark, out: &mut dyn Output<O>) -> OpResult {
        if let Some(t) = self.timers.as_mut() {
            t.advance_watermark(watermark.0);
        }
        self.fire(TimeDomain::EventTime, watermark.0, out)?;
        out.watermark(watermark)
    }

    fn lifecycle(&mut self, event: &mut Lifecycle<'_>, out: &mut dyn Output<O>) -> OpResult {
        if self.base.lifecycle(event)? {
            self.timers = Some(TimerService::open(
                &mut self.base.backend,
                self.base.info.processing_time.clone(),
            )?);
            self.function.open(&mut KeyedStateRegistry {
                backend: &mut self.base.backend,
            })?;
        }
        if let Lifecycle::ProcessingTime(now) = event {
            self.fire(TimeDomain::ProcessingTime, *now, out)?;
        }
        Ok(())
    }
}
