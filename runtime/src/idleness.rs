//! Idleness for any source (Flink's `WatermarkStrategy.withIdleness`): [`WithIdleness`] wraps a
//! source and reports it idle once it has emitted no record for a while, so that a source (or a
//! source subtask) with nothing to read does not hold back event time downstream; its next
//! record makes it active again.

use crate::error::TaskError;
use crate::operator::SubtaskInfo;
use crate::source::{SourceFunction, SourceStatus};
use std::time::{Duration, Instant};
use weir_state::OperatorStateBackend;

/// A source that is idle after `timeout` without a record.
pub struct WithIdleness<T> {
    inner: Box<dyn SourceFunction<T>>,
    timeout: Duration,
    /// When it last emitted a record (or opened).
    last_record: Instant,
}

impl<T> WithIdleness<T> {
    /// `inner`, idle after `timeout` of processing time without a record.
    pub fn new(inner: Box<dyn SourceFunction<T>>, timeout: Duration) -> Self {
        WithIdleness {
            inner,
            timeout,
            last_record: Instant::now(),
        }
    }
}

impl<T: Send + 'static> SourceFunction<T> for WithIdleness<T> {
    fn open(
        &mut self,
        info: &SubtaskInfo,
        state: &mut OperatorStateBackend,
    ) -> Result<(), TaskError> {
        self.last_record = Instant::now();
        self.inner.open(info, state)
    }

    fn next_batch(&mut self, out: &mut Vec<T>, max: usize) -> Result<SourceStatus, TaskError> {
        let before = out.len();
        let status = self.inner.next_batch(out, max)?;
        if out.len() > before {
            self.last_record = Instant::now();
        }
        Ok(status)
    }

    fn snapshot_state(&mut self, state: &mut OperatorStateBackend) -> Result<(), TaskError> {
        self.inner.snapshot_state(state)
    }

    fn snapshot_checkpoint(
        &mut self,
        checkpoint: weir_core::ids::CheckpointId,
        state: &mut OperatorStateBackend,
    ) -> Result<(), TaskError> {
        self.inner.snapshot_checkpoint(checkpoint, state)
    }

    fn notify_checkpoint_complete(
        &mut self,
        checkpoint: weir_core::ids::CheckpointId,
    ) -> Result<(), TaskError> {
        self.inner.notify_checkpoint_complete(checkpoint)
    }

    fn add_splits(&mut self, splits: Vec<Vec<u8>>) -> Result<(), TaskError> {
        self.inner.add_splits(splits)
    }

    fn no_more_splits(&mut self) {
        self.inner.no_more_splits()
    }

    fn current_watermark(&self) -> Option<i64> {
        self.inner.current_watermark()
    }

    fn is_idle(&self) -> bool {
        self.inner.is_idle() || self.last_record.elapsed() >= self.timeout
    }
}
