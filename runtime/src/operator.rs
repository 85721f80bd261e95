//! The operator chain: push-based operators called directly, one after another, inside a task.
//!
//! A chain is a tree of [`Output`]s. Each chained operator owns its downstream as a
//! `Box<dyn Output<Out>>`; a network writer or a sink ends a branch. Records go down by direct
//! calls (`push`), and lifecycle events ([`Lifecycle`]: open, prepare-snapshot, barrier, snapshot,
//! notifications, end of input) visit every operator in chain order.

use crate::error::TaskError;
use std::any::Any;
use std::collections::HashMap;
use std::task::{Context, Poll};
use weir_core::channel_state::{ChannelDirection, ChannelInfo, ChannelSection};
use weir_core::element::{CheckpointBarrier, SnapshotKind, Watermark, WatermarkStatus};
use weir_core::handle::KeyedStateHandle;
use weir_core::ids::{CheckpointId, OperatorId, SubtaskIndex};
use weir_core::keygroup::{KeyGroupRange, compute_key_group_range_for_operator_index};
use weir_state::{KeyedSnapshot, OperatorSnapshot, OperatorStateBackend};

/// The result of an operator call.
pub type OpResult = Result<(), TaskError>;

/// A consumer of records inside a chain: a chained operator with its downstream, a network
/// writer, or a sink.
pub trait Output<T>: Send {
    /// One record.
    fn push(&mut self, record: T) -> OpResult;

    /// A batch of records, in order.
    fn push_batch(&mut self, batch: Vec<T>) -> OpResult {
        for r in batch {
            self.push(r)?;
        }
        Ok(())
    }

    /// Event time advanced.
    fn watermark(&mut self, watermark: Watermark) -> OpResult;

    /// The stream went idle or became active again (Flink's `WatermarkStatus`): operators
    /// pass it on unchanged, writers send it on every channel. A sink ignores it (the default).
    fn watermark_status(&mut self, status: WatermarkStatus) -> OpResult {
        let _ = status;
        Ok(())
    }

    /// A lifecycle event: handled here, then passed on downstream.
    fn lifecycle(&mut self, event: &mut Lifecycle<'_>) -> OpResult;

    /// Sends what writers have queued; ready when nothing is queued any more.
    fn poll_flush(&mut self, cx: &mut Context<'_>) -> Poll<OpResult>;
}

/// The state one operator restores from, fetched by the job master before deployment.
#[derive(Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct RestoredOperatorState {
    /// Keyed state: each handle that overlaps this subtask's key groups, with the bytes of its
    /// header and of the sections this subtask owns.
    pub keyed: Vec<RestoredKeyed>,
    /// Operator state blobs assigned to this subtask.
    pub operator: Vec<Vec<u8>>,
    /// Native keyed snapshots that overlap this subtask's key groups.
    pub native: Vec<RestoredNative>,
}

/// One native keyed snapshot to restore: its manifest, read and checked by the job master, and
/// where each file this subtask needs is. The subtask fetches the files itself before it opens
/// (`task/fetch.rs`): from its local-recovery copy when one is present and sound, else from
/// checkpoint storage, in ranges, each checked (digest and identity frame).
#[derive(serde::Serialize, serde::Deserialize)]
pub struct RestoredNative {
    /// The handle.
    pub handle: weir_core::handle::NativeKeyedHandle,
    /// The manifest the backend wrote.
    pub manifest: bytes::Bytes,
    /// Per file of the handle, in order: where it is; `None` for a file whose key groups this
    /// subtask does not own.
    pub files: Vec<Option<NativeSource>>,
    /// The checkpoint directory the files' handles are relative to (`<job>/chk-<n>/`).
    pub location_dir: String,
    /// The checkpoint restored: a file found damaged makes it unusable.
    pub checkpoint: CheckpointId,
    /// The storage the files are in when it is not the job's own checkpoint storage (a restore
    /// from another storage, in this process). Never sent to a task manager: the job master
    /// reads such files itself ([`NativeSource::Fetched`]).
    #[serde(skip)]
    pub storage: Option<std::sync::Arc<dyn weir_checkpoint::CheckpointStorage>>,
}

impl std::fmt::Debug for RestoredNative {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RestoredNative")
            .field("handle", &self.handle)
            .field("files", &self.files)
            .field("location_dir", &self.location_dir)
            .field("checkpoint", &self.checkpoint)
            .field("storage", &self.storage.as_ref().map(|s| s.describe()))
            .finish()
    }
}

/// Where one file of a native snapshot is, for a restore.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub enum NativeSource {
    /// In checkpoint storage: the subtask fetches it, or takes its local-recovery copy.
    Stored {
        /// The file.
        stream: weir_core::handle::StreamStateHandle,
        /// What its identity frame must say (a file an earlier checkpoint uploaded may carry
        /// that checkpoint's id).
        expected: weir_core::identity::ExpectedIdentity,
    },
    /// Its payload, read and checked by the job master: a restore point the task managers
    /// may not reach.
    Fetched(bytes::Bytes),
    /// On this machine's disk, ready for the backend: set by the subtask before it opens.
    #[serde(skip)]
    Local {
        /// The file.
        path: std::path::PathBuf,
        /// Its length.
        size: u64,
    },
}

/// Keyed-state bytes for one handle.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub struct RestoredKeyed {
    /// The handle.
    pub handle: KeyedStateHandle,
    /// Its header bytes, read and checked by the job master.
    pub header: Vec<u8>,
    /// The sections of the key groups this subtask owns.
    pub sections: KeyedSections,
    /// Offset of the sections' first byte in the original stream.
    pub sections_offset: u64,
}

/// Where the sections of a [`RestoredKeyed`] are.
#[derive(serde::Serialize, serde::Deserialize)]
pub enum KeyedSections {
    /// Read and checked by the job master (shared: the backend keeps slices of them without
    /// copying).
    Read(bytes::Bytes),
    /// In checkpoint storage, for a subtask whose state backend keeps files (the disk backend):
    /// the subtask downloads them into the backend's directory before it opens
    /// (`task/fetch.rs`), in ranges, and the backend reads them from there as it needs them, so
    /// that a canonical restore (a savepoint) larger than memory is never held in memory.
    Stored {
        /// The file.
        stream: weir_core::handle::StreamStateHandle,
        /// The end of the sections this subtask owns (they start at `sections_offset`).
        end: u64,
        /// Whether this subtask owns every key group of the file: it then reads the whole file,
        /// checking the digest of its recorded size; else each section's checksum is checked.
        whole: bool,
        /// The key groups this subtask owns.
        range: weir_core::keygroup::KeyGroupRange,
        /// The checkpoint directory the stream's path is relative to.
        location_dir: String,
        /// The storage the file is in when it is not the job's own checkpoint storage (a
        /// restore from another storage, in this process; a task manager opens it from
        /// `storage_location`).
        #[serde(skip)]
        storage: Option<std::sync::Arc<dyn weir_checkpoint::CheckpointStorage>>,
        /// That storage's root as a location a task manager opens it from
        /// (`StorageConfig::from_location`); the job master reads the sections itself for task
        /// managers when there is none.
        storage_location: Option<String>,
    },
    /// Downloaded to this machine's disk, ready for the backend: set by the subtask before it
    /// opens.
    #[serde(skip)]
    Local {
        /// The file: from byte `at`, the stream's `len` bytes from `sections_offset` (the
        /// sections of one operator's snapshots are in one file, one after the other).
        path: std::path::PathBuf,
        /// Where in the file the sections begin.
        at: u64,
        /// Their length.
        len: u64,
        /// Whether the download checked the file's digest: a section found damaged later was
        /// damaged on local disk, not in checkpoint storage.
        digest_checked: bool,
        /// The checkpoint directory the file came from, and its name there: a section found
        /// damaged makes that checkpoint unusable.
        location_dir: String,
        /// The file's name in checkpoint storage, relative to its root.
        file: String,
    },
}

impl std::fmt::Debug for KeyedSections {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            KeyedSections::Read(bytes) => write!(f, "Read({} bytes)", bytes.len()),
            KeyedSections::Stored {
                stream,
                end,
                whole,
                range,
                location_dir,
                storage,
                storage_location,
            } => f
                .debug_struct("Stored")
                .field("stream", stream)
                .field("end", end)
                .field("whole", whole)
                .field("range", range)
                .field("location_dir", location_dir)
                .field("storage", &storage.as_ref().map(|s| s.describe()))
                .field("storage_location", storage_location)
                .finish(),
            KeyedSections::Local { path, file, .. } => f
                .debug_struct("Local")
                .field("path", path)
                .field("file", file)
                .finish(),
        }
    }
}

/// Where a subtask stands, and what it restores from.
#[derive(Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct RestoreContext {
    /// Per operator.
    pub operators: HashMap<OperatorId, RestoredOperatorState>,
    /// The checkpoint restored from, if any.
    pub checkpoint: Option<CheckpointId>,
    /// The subtask's in-flight data from an unaligned checkpoint: the input gate replays its
    /// input sections and writers queue their output sections, before anything else.
    pub in_flight: Vec<ChannelSection>,
}

impl RestoreContext {
    /// Takes the in-flight sections of `direction` on `channel`, in the order they were written.
    pub fn take_in_flight(
        &mut self,
        direction: ChannelDirection,
        channel: &ChannelInfo,
    ) -> Vec<ChannelSection> {
        let (mine, rest) = std::mem::take(&mut self.in_flight)
            .into_iter()
            .partition(|s| s.direction == direction && s.channel == *channel);
        self.in_flight = rest;
        mine
    }
}

impl RestoreContext {
    /// Restores `operator`'s operator state into `backend`; returns whether the checkpoint had
    /// state for it.
    pub fn restore_operator_state(
        &mut self,
        operator: OperatorId,
        backend: &mut OperatorStateBackend,
    ) -> Result<bool, TaskError> {
        let Some(restored) = self.operators.remove(&operator) else {
            return Ok(false);
        };
        let blobs: Vec<&[u8]> = restored.operator.iter().map(|b| b.as_slice()).collect();
        backend.restore(&blobs)?;
        Ok(true)
    }
}

/// The facts an operator needs at open time.
#[derive(Clone, Debug)]
pub struct SubtaskInfo {
    /// Subtask index.
    pub index: SubtaskIndex,
    /// Parallelism of the operator.
    pub parallelism: u32,
    /// Max parallelism (key groups).
    pub max_parallelism: u32,
    /// Attempt number.
    pub attempt: u32,
    /// Task name, e.g. `Sum -> Sink (2/4)#0`.
    pub task_name: String,
    /// Whether the subtask was restored from a checkpoint (so empty state means "nothing left
    /// to do", not "fresh start").
    pub restored: bool,
    /// The task's processing-time clock: operators publish their earliest processing-time
    /// timer here, and the task wakes them with [`Lifecycle::ProcessingTime`].
    pub processing_time: ProcessingTimeService,
    /// How keyed-state snapshots compress each key group.
    pub snapshot_compression: weir_state::Compression,
    /// Incremental keyed snapshots: the most snapshots in a chain, or `None` for full ones.
    pub incremental: Option<u32>,
    /// The job's state backend, which creates each keyed operator's backend.
    pub state_backend: std::sync::Arc<dyn weir_state::StateBackend>,
    /// Set when the subtask is cancelled: an operator whose work per record is long checks it
    /// between records (and inside a long record) and returns [`TaskError::Canceled`].
    pub cancellation: Cancellation,
}

/// A subtask's cancellation signal (Flink's interrupt of a cancelled task's thread): raised by
/// the job master when it cancels the job or tears a failed attempt down, never lowered.
///
/// The runtime checks it where it loops over records calling user functions (`map`,
/// `flat_map`, `filter`) and between the steps of a task's loop; an operator that spends long
/// on one record checks [`is_cancelled`](Self::is_cancelled) itself. A task that does not
/// stop within [`crate::JobConfig::task_cancellation_timeout`] is abandoned.
#[derive(Clone, Debug, Default)]
pub struct Cancellation {
    raised: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl Cancellation {
    /// Whether the subtask was cancelled. One relaxed load: cheap enough for every record.
    #[inline]
    pub fn is_cancelled(&self) -> bool {
        self.raised.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// `Err(TaskError::Canceled)` once the subtask was cancelled.
    #[inline]
    pub fn check(&self) -> OpResult {
        if self.is_cancelled() {
            Err(TaskError::Canceled)
        } else {
            Ok(())
        }
    }

    /// Raises the signal.
    pub(crate) fn cancel(&self) {
        self.raised
            .store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

/// A task's processing-time service: the earliest processing-time timer (ms since the Unix
/// epoch) any operator of the chain has registered, shared by the operators and the task loop.
#[derive(Clone, Debug)]
pub struct ProcessingTimeService {
    next: std::sync::Arc<std::sync::atomic::AtomicI64>,
}

impl Default for ProcessingTimeService {
    fn default() -> Self {
        ProcessingTimeService {
            next: std::sync::Arc::new(std::sync::atomic::AtomicI64::new(i64::MAX)),
        }
    }
}

impl ProcessingTimeService {
    /// Wall-clock time now, in ms since the Unix epoch (virtual under a simulation).
    pub fn now_ms() -> i64 {
        weir_core::sim::wall_clock().as_millis() as i64
    }

    /// Asks to be woken at `at_ms` (or earlier, if another timer is due first).
    pub fn request(&self, at_ms: i64) {
        self.next
            .fetch_min(at_ms, std::sync::atomic::Ordering::Relaxed);
    }

    /// The earliest wake-up requested, if any.
    pub fn next(&self) -> Option<i64> {
        let n = self.next.load(std::sync::atomic::Ordering::Relaxed);
        (n != i64::MAX).then_some(n)
    }

    /// Forgets every request: the task is about to wake the chain, whose operators request
    /// their next timers again.
    pub fn reset(&self) {
        self.next
            .store(i64::MAX, std::sync::atomic::Ordering::Relaxed);
    }
}

impl SubtaskInfo {
    /// The key groups this subtask owns.
    pub fn key_group_range(&self) -> KeyGroupRange {
        compute_key_group_range_for_operator_index(
            self.max_parallelism,
            self.parallelism,
            self.index,
        )
    }
}

/// The synchronous part of one operator's snapshot.
pub struct OperatorSnapshotParts {
    /// The operator.
    pub operator_id: OperatorId,
    /// Frozen keyed state.
    pub keyed: Option<Box<dyn KeyedSnapshot>>,
    /// Frozen operator state.
    pub operator: Option<OperatorSnapshot>,
}

impl OperatorSnapshotParts {
    /// The frozen operator state of `operator`.
    pub fn operator_state(operator: OperatorId, backend: &OperatorStateBackend) -> Self {
        OperatorSnapshotParts {
            operator_id: operator,
            keyed: None,
            operator: Some(backend.snapshot()),
        }
    }
}

impl std::fmt::Debug for OperatorSnapshotParts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OperatorSnapshotParts")
            .field("operator_id", &self.operator_id)
            .field("keyed", &self.keyed.is_some())
            .field("operator", &self.operator.is_some())
            .finish()
    }
}

/// A lifecycle event that visits every operator of a chain in order.
pub enum Lifecycle<'a> {
    /// Restore state (each operator takes its own from the context) and open.
    Open(&'a mut RestoreContext),
    /// Step 1: flush anything buffered before the barrier goes out.
    PrepareSnapshotPreBarrier(CheckpointId),
    /// Step 2: writers broadcast the barrier on every channel.
    EmitBarrier(CheckpointBarrier),
    /// Step 2 of an unaligned checkpoint: writers send the barrier as a priority event ahead of
    /// their queued buffers, and add those buffers to the list as output channel state.
    EmitPriorityBarrier(CheckpointBarrier, &'a mut Vec<ChannelSection>),
    /// Writers broadcast a cancel marker for an aborted checkpoint.
    EmitCancelMarker(CheckpointId),
    /// Step 4, synchronous part: each stateful operator freezes its state into the list. A
    /// savepoint's snapshot is full and self-contained; a checkpoint's may be incremental.
    Snapshot(
        CheckpointId,
        SnapshotKind,
        &'a mut Vec<OperatorSnapshotParts>,
    ),
    /// The checkpoint completed.
    NotifyComplete(CheckpointId),
    /// The checkpoint was aborted.
    NotifyAborted(CheckpointId),
    /// Keyed backends start new incremental chains: the job manager refused a delta whose base
    /// files were gone (see [`weir_state::KeyedStateBackend::start_new_chain`]). Sent before a
    /// snapshot.
    StartNewChains,
    /// All input ended: operators emit what they hold; writers send end of input.
    EndInput,
    /// Processing time passed this many ms since the Unix epoch (the clock reads a later
    /// millisecond): processing-time timers up to it fire. As in Flink (FLINK-9857), a timer
    /// for `t` fires only once the clock is past `t`, so every record processed at `t` came
    /// first: a processing-time window ending at `t + 1` never takes a record after it fired.
    ProcessingTime(i64),
    /// Writers hand partly filled batches to their channels' queues.
    FlushPartial,
    /// Every task of the job finished: what was held back for the end (a two-phase-commit sink's
    /// last transactions) is committed now. Never sent to a job that may still restart.
    JobFinished,
}

/// A one-input operator, chained in front of its downstream by [`Chained`].
pub trait OneInputOperator<I>: Send + 'static {
    /// The output record type.
    type Out: Send + 'static;

    /// One record.
    fn process(&mut self, record: I, out: &mut dyn Output<Self::Out>) -> OpResult;

    /// A batch; override to amortise per-batch work.
    fn process_batch(&mut self, batch: Vec<I>, out: &mut dyn Output<Self::Out>) -> OpResult {
        for r in batch {
            self.process(r, out)?;
        }
        Ok(())
    }

    /// Event time advanced; by default forwarded.
    fn watermark(&mut self, watermark: Watermark, out: &mut dyn Output<Self::Out>) -> OpResult {
        out.watermark(watermark)
    }

    /// A lifecycle event for this operator, before it goes downstream.
    fn lifecycle(
        &mut self,
        _event: &mut Lifecycle<'_>,
        _out: &mut dyn Output<Self::Out>,
    ) -> OpResult {
        Ok(())
    }
}

/// An operator and its downstream: the unit of chaining.
pub struct Chained<Op: OneInputOperator<I>, I> {
    op: Op,
    next: Box<dyn Output<Op::Out>>,
    _in: std::marker::PhantomData<fn(I)>,
}

impl<Op: OneInputOperator<I>, I> Chained<Op, I> {
    /// Chains `op` in front of `next`.
    pub fn new(op: Op, next: Box<dyn Output<Op::Out>>) -> Self {
        Chained {
            op,
            next,
            _in: std::marker::PhantomData,
        }
    }
}

impl<Op: OneInputOperator<I>, I: Send + 'static> Output<I> for Chained<Op, I> {
    #[inline]
    fn push(&mut self, record: I) -> OpResult {
        self.op.process(record, &mut *self.next)
    }

    fn push_batch(&mut self, batch: Vec<I>) -> OpResult {
        self.op.process_batch(batch, &mut *self.next)
    }

    fn watermark(&mut self, watermark: Watermark) -> OpResult {
        self.op.watermark(watermark, &mut *self.next)
    }

    fn watermark_status(&mut self, status: WatermarkStatus) -> OpResult {
        self.next.watermark_status(status)
    }

    fn lifecycle(&mut self, event: &mut Lifecycle<'_>) -> OpResult {
        self.op.lifecycle(event, &mut *self.next)?;
        self.next.lifecycle(event)
    }

    fn poll_flush(&mut self, cx: &mut Context<'_>) -> Poll<OpResult> {
        self.next.poll_flush(cx)
    }
}

/// Several downstreams of one operator (a stream consumed more than once): each gets a copy.
pub struct Fanout<T> {
    outs: Vec<Box<dyn Output<T>>>,
}

impl<T> Fanout<T> {
    /// Over `outs`.
    pub fn new(outs: Vec<Box<dyn Output<T>>>) -> Self {
        Fanout { outs }
    }
}

impl<T: Clone + Send + 'static> Output<T> for Fanout<T> {
    fn push(&mut self, record: T) -> OpResult {
        if let Some((last, rest)) = self.outs.split_last_mut() {
            for o in rest {
                o.push(record.clone())?;
            }
            last.push(record)?;
        }
        Ok(())
    }

    fn watermark(&mut self, watermark: Watermark) -> OpResult {
        self.outs
            .iter_mut()
            .try_for_each(|o| o.watermark(watermark))
    }

    fn watermark_status(&mut self, status: WatermarkStatus) -> OpResult {
        self.outs
            .iter_mut()
            .try_for_each(|o| o.watermark_status(status))
    }

    fn lifecycle(&mut self, event: &mut Lifecycle<'_>) -> OpResult {
        self.outs.iter_mut().try_for_each(|o| o.lifecycle(event))
    }

    fn poll_flush(&mut self, cx: &mut Context<'_>) -> Poll<OpResult> {
        let mut pending = false;
        for o in &mut self.outs {
            match o.poll_flush(cx) {
                Poll::Ready(Ok(())) => {}
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => pending = true,
            }
        }
        if pending {
            Poll::Pending
        } else {
            Poll::Ready(Ok(()))
        }
    }
}

/// The end of a branch with no consumer: drops what it gets.
pub struct Discard;

impl<T: Send + 'static> Output<T> for Discard {
    fn push(&mut self, _record: T) -> OpResult {
        Ok(())
    }

    fn push_batch(&mut self, _batch: Vec<T>) -> OpResult {
        Ok(())
    }

    fn watermark(&mut self, _watermark: Watermark) -> OpResult {
        Ok(())
    }

    fn lifecycle(&mut self, _event: &mut Lifecycle<'_>) -> OpResult {
        Ok(())
    }

    fn poll_flush(&mut self, _cx: &mut Context<'_>) -> Poll<OpResult> {
        Poll::Ready(Ok(()))
    }
}

/// Erases an output for the type-erased chain builder.
pub(crate) fn erase<T: 'static>(out: Box<dyn Output<T>>) -> Box<dyn Any> {
    Box::new(out)
}

/// Recovers an erased output; the builder guarantees the type.
pub(crate) fn unerase<T: 'static>(
    out: Box<dyn Any>,
    what: &str,
) -> Result<Box<dyn Output<T>>, TaskError> {
    out.downcast::<Box<dyn Output<T>>>()
        .map(|b| *b)
        .map_err(|_| TaskError::Operator {
            operator: what.to_string(),
            message: format!(
                "internal error: chain output is not Output<{}>",
                std::any::type_name::<T>()
            ),
        })
}
