//! What flows on a channel: batches of records, and events between them in order.

use crate::ids::CheckpointId;
use serde::{Deserialize, Serialize};

/// One item on a channel: a batch of records or an event. Records always move in batches.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum StreamElement<T> {
    /// Records, in order.
    Batch(Vec<T>),
    /// An event, ordered with the batches around it.
    Event(Event),
}

/// A control event that travels in-band with the records.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Event {
    /// Event time has advanced to this watermark.
    Watermark(Watermark),
    /// Checkpoint barrier: everything before it belongs to the checkpoint, nothing after it.
    Barrier(CheckpointBarrier),
    /// Checkpoint `n` was aborted: stop aligning for it (Flink's `CancelCheckpointMarker`).
    CancelCheckpoint(CheckpointId),
    /// The producer of this channel will send nothing more.
    EndOfInput,
    /// The producer of this channel went idle or became active again (Flink's
    /// `WatermarkStatus`): an idle channel does not hold back the watermark downstream.
    WatermarkStatus(WatermarkStatus),
}

/// Whether a channel's producer emits records and watermarks (Flink's `WatermarkStatus`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum WatermarkStatus {
    /// It emits nothing for now: the minimum over input channels leaves it out.
    Idle,
    /// It emits again: it counts in the minimum once more.
    Active,
}

/// An event-time watermark, in milliseconds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Watermark(pub i64);

impl Watermark {
    /// The watermark that ends event time (Flink's `Watermark.MAX_WATERMARK`).
    pub const MAX: Watermark = Watermark(i64::MAX);
}

/// A checkpoint barrier (Flink's `CheckpointBarrier`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct CheckpointBarrier {
    /// The checkpoint it belongs to.
    pub id: CheckpointId,
    /// When the coordinator triggered it, in ms since the Unix epoch.
    pub timestamp_ms: u64,
    /// How the checkpoint is taken.
    pub options: CheckpointOptions,
}

/// How a checkpoint is taken (Flink's `CheckpointOptions`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct CheckpointOptions {
    /// Checkpoint or savepoint.
    pub kind: SnapshotKind,
    /// Barrier alignment.
    pub alignment: AlignmentType,
}

impl CheckpointOptions {
    /// An aligned, exactly-once checkpoint.
    pub const ALIGNED_CHECKPOINT: CheckpointOptions = CheckpointOptions {
        kind: SnapshotKind::Checkpoint,
        alignment: AlignmentType::Aligned,
    };
}

/// The kind of snapshot.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum SnapshotKind {
    /// A periodic or on-demand checkpoint, owned by Weir.
    Checkpoint,
    /// A savepoint, owned by the user, self-contained.
    Savepoint,
    /// A savepoint after which the sources stop (stop-with-savepoint).
    SynchronousSavepoint,
}

/// How barriers are aligned at tasks with several inputs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum AlignmentType {
    /// Block each channel at its barrier until all barriers arrived (exactly-once).
    Aligned,
    /// Never block; trigger when all barriers arrived (at-least-once).
    AtLeastOnce,
    /// Trigger on the first barrier and persist in-flight data (exactly-once, unaligned). On the
    /// output side such a barrier is a priority event: it overtakes queued buffers.
    Unaligned,
    /// Start aligned; a task still aligning `timeout` after the checkpoint was triggered (or
    /// receiving its first barrier later than that) switches to unaligned (Flink's aligned
    /// checkpoint timeout, handled by its `AlternatingCheckpointBarrierHandler`).
    AlignedWithTimeout {
        /// How long a task may align before it switches.
        timeout: std::time::Duration,
    },
}

impl CheckpointOptions {
    /// Whether the barrier is a priority event that overtakes queued data.
    pub fn is_unaligned(&self) -> bool {
        self.alignment == AlignmentType::Unaligned
    }

    /// The same checkpoint, switched to unaligned (after an alignment timeout).
    pub fn as_unaligned(self) -> CheckpointOptions {
        CheckpointOptions {
            alignment: AlignmentType::Unaligned,
            ..self
        }
    }
}
