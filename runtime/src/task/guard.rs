//! The panic guard: a panic in user code (an operator, a source) becomes the task's failure,
//! naming the task, instead of unwinding through the runtime.

use super::input::*;
use crate::error::TaskError;
use crate::operator::{Lifecycle, OpResult};
use crate::source::SplitAssignment;
use std::task::{Context, Poll};
use std::time::Duration;
use weir_checkpoint::barrier::HandlerAction;
use weir_core::channel_state::ChannelSection;
use weir_core::ids::CheckpointId;

pub(crate) use weir_core::panic::panic_message;

/// Runs a synchronous call into the chain, turning a panic in user code into a task error while
/// the chain is still alive (so the failure is reported before its channels close).
pub(super) fn guarded<R>(task: &str, call: impl FnOnce() -> R) -> Result<R, TaskError> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(call)).map_err(|p| TaskError::Panic {
        task: task.to_string(),
        message: panic_message(p.as_ref()),
    })
}

/// A [`TaskInput`] whose every call into the chain is [`guarded`].
pub(super) struct Guarded<'a> {
    pub(super) input: &'a mut dyn TaskInput,
    pub(super) name: &'a str,
}

impl TaskInput for Guarded<'_> {
    fn lifecycle(&mut self, event: &mut Lifecycle<'_>) -> OpResult {
        guarded(self.name, || self.input.lifecycle(event))?
    }

    fn poll_flush(&mut self, cx: &mut Context<'_>) -> Poll<OpResult> {
        match guarded(self.name, || self.input.poll_flush(cx)) {
            Ok(p) => p,
            Err(e) => Poll::Ready(Err(e)),
        }
    }

    fn poll_step(
        &mut self,
        cx: &mut Context<'_>,
        now: Duration,
        actions: &mut Vec<HandlerAction>,
    ) -> Poll<Result<Step, TaskError>> {
        match guarded(self.name, || self.input.poll_step(cx, now, actions)) {
            Ok(p) => p,
            Err(e) => Poll::Ready(Err(e)),
        }
    }

    fn on_abort_notified(&mut self, id: CheckpointId, actions: &mut Vec<HandlerAction>) {
        self.input.on_abort_notified(id, actions)
    }

    fn advance_to_end_of_time(&mut self) -> OpResult {
        guarded(self.name, || self.input.advance_to_end_of_time())?
    }

    fn assigned(&mut self, assignment: SplitAssignment) -> OpResult {
        guarded(self.name, || self.input.assigned(assignment))?
    }

    fn next_deadline(&self) -> Option<Duration> {
        self.input.next_deadline()
    }

    fn on_timer(&mut self, now: Duration, actions: &mut Vec<HandlerAction>) {
        self.input.on_timer(now, actions)
    }

    fn take_in_flight(&mut self) -> Option<(CheckpointId, Vec<ChannelSection>)> {
        self.input.take_in_flight()
    }

    fn processed_data(&mut self, id: CheckpointId) -> u64 {
        self.input.processed_data(id)
    }
}
