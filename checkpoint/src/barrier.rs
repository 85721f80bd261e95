//! Barrier handlers as pure state machines: events from the input channels in, actions out.
//!
//! [`BarrierAligner`] is the EXACTLY_ONCE handler, Flink's `SingleCheckpointBarrierHandler`. It
//! acts on each checkpoint as its barrier's [`AlignmentType`] says:
//! - *Aligned*: when barrier *n* arrives on a channel, that channel is blocked; when it has
//!   arrived on every channel still open, the checkpoint triggers and all channels resume.
//! - *Unaligned* (the unaligner): the first barrier triggers at once. From then on, what each
//!   other channel delivers before its barrier is in-flight data to persist; the task never stops
//!   reading. A priority barrier overtook queued elements inside its channel: those, too, are
//!   persisted.
//! - *Aligned with timeout* (the alternating handler): starts aligned; once `timeout` has passed
//!   since the checkpoint was triggered (the barrier's timestamp: Flink's checkpoint start delay
//!   counts toward it), or an upstream task's barrier arrives already switched, it switches to
//!   unaligned: channels resume, the checkpoint triggers, and the channels still owing their
//!   barrier are persisted. A barrier that reaches the task after the timeout switches at once.
//!
//! In every mode, channels that ended count as having delivered the barrier, older barriers are
//! ignored (reference step 0), a newer barrier aborts the checkpoint in progress, and a
//! `CancelCheckpointMarker` releases it.
//!
//! Time is passed in (`now`: wall-clock time since the Unix epoch, the clock barrier timestamps
//! are taken with), so alignment durations and timeouts are decided without a clock here; [`BarrierAligner::next_deadline`] tells the task when to call
//! [`BarrierAligner::on_timer`].

use std::time::Duration;
use weir_core::element::{AlignmentType, CheckpointBarrier};
use weir_core::ids::CheckpointId;

/// What the task must do after a handler saw an event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HandlerAction {
    /// Stop reading this channel.
    Block(usize),
    /// Resume reading every channel.
    UnblockAll,
    /// Take the checkpoint (steps 0–4), then go on. When `barrier` is unaligned
    /// ([`weir_core::element::CheckpointOptions::is_unaligned`]), the task emits it as a priority
    /// event and its snapshot is complete only with the in-flight data (see
    /// [`HandlerAction::InFlightComplete`]).
    Trigger {
        /// The barrier to emit; switched to unaligned when the alignment timed out.
        barrier: CheckpointBarrier,
        /// Time from the first barrier to the trigger.
        alignment: Duration,
    },
    /// Persist what this channel delivers from now on, until its barrier's position.
    PersistInFlight(usize),
    /// The channel's barrier of the unaligned checkpoint arrived: persist the elements it
    /// overtook inside the channel (none for an in-order barrier or end of input), then stop.
    BarrierReached(usize),
    /// Every channel's barrier arrived: once the overtaken elements are read, the in-flight data
    /// of this checkpoint is complete.
    InFlightComplete(CheckpointId),
    /// Give up on checkpoint `id` here: tell the coordinator and send a cancel marker downstream.
    /// Any in-flight data persisted for it is dropped.
    Abort {
        /// The checkpoint.
        id: CheckpointId,
        /// Why.
        reason: AbortReason,
    },
}

/// Why a handler aborted a checkpoint.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AbortReason {
    /// A cancel marker arrived for it.
    CancelMarker,
    /// A barrier of a newer checkpoint arrived before alignment finished (Flink's
    /// `CHECKPOINT_DECLINED_SUBSUMED`).
    Subsumed,
    /// The coordinator aborted it.
    AbortedByCoordinator,
}

impl std::fmt::Display for AbortReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            AbortReason::CancelMarker => "a cancel marker arrived",
            AbortReason::Subsumed => "a newer barrier arrived during alignment",
            AbortReason::AbortedByCoordinator => "the coordinator aborted it",
        })
    }
}

/// The checkpoint a [`BarrierAligner`] is working on.
#[derive(Clone, Copy, Debug)]
struct Current {
    barrier: CheckpointBarrier,
    /// When its first barrier arrived.
    started: Duration,
    /// Triggered unaligned: collecting in-flight data, nothing blocked.
    unaligned: bool,
}

/// The EXACTLY_ONCE barrier handler: aligner, unaligner and alternating handler in one state
/// machine, switching per checkpoint on its barrier's alignment (see the module docs).
#[derive(Clone, Debug)]
pub struct BarrierAligner {
    /// Barrier received on each channel for the current checkpoint.
    received: Vec<bool>,
    /// Channels that ended.
    ended: Vec<bool>,
    /// The checkpoint in progress.
    current: Option<Current>,
    /// The newest checkpoint id triggered, aborted or in progress; older barriers are stale.
    latest: Option<CheckpointId>,
}

impl BarrierAligner {
    /// A handler over `num_channels` channels.
    pub fn new(num_channels: usize) -> BarrierAligner {
        BarrierAligner {
            received: vec![false; num_channels],
            ended: vec![false; num_channels],
            current: None,
            latest: None,
        }
    }

    /// The checkpoint in progress (aligning, or collecting in-flight data), if any.
    pub fn aligning(&self) -> Option<CheckpointId> {
        self.current.map(|c| c.barrier.id)
    }

    /// Whether channel `i` is blocked by the alignment in progress.
    pub fn is_blocked(&self, i: usize) -> bool {
        self.current.is_some_and(|c| !c.unaligned) && self.received[i]
    }

    /// When [`on_timer`](Self::on_timer) must be called: the aligned checkpoint timeout of the
    /// alignment in progress.
    pub fn next_deadline(&self) -> Option<Duration> {
        match self.current {
            Some(Current {
                barrier,
                unaligned: false,
                ..
            }) => match barrier.options.alignment {
                AlignmentType::AlignedWithTimeout { timeout } => {
                    Some(Duration::from_millis(barrier.timestamp_ms) + timeout)
                }
                _ => None,
            },
            _ => None,
        }
    }

    fn is_stale(&self, id: CheckpointId) -> bool {
        self.latest.is_some_and(|l| id <= l) && self.aligning() != Some(id)
    }

    fn release(&mut self, out: &mut Vec<HandlerAction>) {
        if let Some(c) = self.current.take() {
            self.received.iter_mut().for_each(|r| *r = false);
            if !c.unaligned {
                out.push(HandlerAction::UnblockAll);
            }
        }
    }

    fn all_reached(&self) -> bool {
        self.received.iter().zip(&self.ended).all(|(r, e)| *r || *e)
    }

    fn maybe_complete(&mut self, now: Duration, out: &mut Vec<HandlerAction>) {
        let Some(c) = self.current else {
            return;
        };
        if !self.all_reached() {
            return;
        }
        if c.unaligned {
            self.current = None;
            self.received.iter_mut().for_each(|r| *r = false);
            out.push(HandlerAction::InFlightComplete(c.barrier.id));
        } else {
            self.release(out);
            out.push(HandlerAction::Trigger {
                barrier: c.barrier,
                alignment: now.saturating_sub(c.started),
            });
        }
    }

    /// Switches the checkpoint in progress to unaligned: resume every channel, trigger, and
    /// persist the channels that still owe their barrier.
    fn switch_to_unaligned(&mut self, now: Duration, out: &mut Vec<HandlerAction>) {
        let Some(c) = self.current.as_mut() else {
            return;
        };
        if c.unaligned {
            return;
        }
        let had_blocked = self.received.iter().any(|r| *r);
        c.unaligned = true;
        c.barrier.options = c.barrier.options.as_unaligned();
        if had_blocked {
            out.push(HandlerAction::UnblockAll);
        }
        out.push(HandlerAction::Trigger {
            barrier: c.barrier,
            alignment: now.saturating_sub(c.started),
        });
        for (i, (r, e)) in self.received.iter().zip(&self.ended).enumerate() {
            if !*r && !*e {
                out.push(HandlerAction::PersistInFlight(i));
            }
        }
    }

    /// Time passed: an alignment past its aligned checkpoint timeout switches to unaligned.
    pub fn on_timer(&mut self, now: Duration, out: &mut Vec<HandlerAction>) {
        if self.next_deadline().is_some_and(|d| now >= d) {
            self.switch_to_unaligned(now, out);
        }
    }

    /// Barrier `barrier` arrived on `channel`.
    pub fn on_barrier(
        &mut self,
        channel: usize,
        barrier: CheckpointBarrier,
        now: Duration,
        out: &mut Vec<HandlerAction>,
    ) {
        if self.is_stale(barrier.id) {
            return;
        }
        if let Some(cur) = self.current
            && barrier.id > cur.barrier.id
        {
            self.release(out);
            out.push(HandlerAction::Abort {
                id: cur.barrier.id,
                reason: AbortReason::Subsumed,
            });
        }
        if self.current.is_none() {
            self.current = Some(Current {
                barrier,
                started: now,
                unaligned: false,
            });
            self.latest = Some(barrier.id);
        }
        self.on_timer(now, out);
        if barrier.options.is_unaligned() {
            self.switch_to_unaligned(now, out);
        }
        let unaligned = self.current.is_some_and(|c| c.unaligned);
        if !self.received[channel] {
            self.received[channel] = true;
            if unaligned {
                out.push(HandlerAction::BarrierReached(channel));
            } else if !weir_core::sim::mutated(weir_core::sim::Mutation::UnblockBeforeAligned) {
                out.push(HandlerAction::Block(channel));
            }
        }
        self.maybe_complete(now, out);
    }

    /// A cancel marker for checkpoint `id` arrived on `channel`.
    pub fn on_cancel_marker(
        &mut self,
        _channel: usize,
        id: CheckpointId,
        out: &mut Vec<HandlerAction>,
    ) {
        if self.is_stale(id) {
            return;
        }
        if self.aligning().is_some_and(|cur| cur < id) {
            let cur = self.aligning();
            self.release(out);
            if let Some(cur) = cur {
                out.push(HandlerAction::Abort {
                    id: cur,
                    reason: AbortReason::Subsumed,
                });
            }
        }
        self.release(out);
        self.latest = Some(id);
        out.push(HandlerAction::Abort {
            id,
            reason: AbortReason::CancelMarker,
        });
    }

    /// The coordinator aborted checkpoint `id` (notification from outside the channels).
    pub fn on_abort_notified(&mut self, id: CheckpointId, out: &mut Vec<HandlerAction>) {
        if self.aligning() == Some(id) {
            self.release(out);
        }
        if self.latest.is_none_or(|l| l < id) {
            self.latest = Some(id);
        }
    }

    /// Channel `channel` ended. During a checkpoint it counts as having delivered the barrier.
    pub fn on_end_of_input(&mut self, channel: usize, now: Duration, out: &mut Vec<HandlerAction>) {
        self.ended[channel] = true;
        if self.current.is_some_and(|c| c.unaligned) && !self.received[channel] {
            out.push(HandlerAction::BarrierReached(channel));
        }
        self.maybe_complete(now, out);
    }
}

/// Flink's `CheckpointBarrierTracker` for AT_LEAST_ONCE: it never blocks a channel. It counts
/// each checkpoint's barriers and triggers once every open channel delivered one; records that
/// overtake a barrier on a fast channel are in the snapshot *and* replayed after a restore, so a
/// restore may count them twice, but never loses one. Several checkpoints can be tracked at once;
/// when one triggers, older incomplete ones are aborted.
#[derive(Clone, Debug)]
pub struct BarrierTracker {
    ended: Vec<bool>,
    /// Pending checkpoints, oldest first: the barrier, which channels delivered it, and when the
    /// first one arrived.
    pending: Vec<(CheckpointBarrier, Vec<bool>, Duration)>,
    /// The newest checkpoint triggered or aborted; older barriers are stale.
    latest: Option<CheckpointId>,
}

impl BarrierTracker {
    /// A tracker over `num_channels` channels.
    pub fn new(num_channels: usize) -> BarrierTracker {
        BarrierTracker {
            ended: vec![false; num_channels],
            pending: Vec::new(),
            latest: None,
        }
    }

    fn complete_ready(&mut self, now: Duration, out: &mut Vec<HandlerAction>) {
        let ended = &self.ended;
        let ready = self
            .pending
            .iter()
            .rposition(|(_, seen, _)| seen.iter().zip(ended).all(|(s, e)| *s || *e));
        if let Some(i) = ready {
            let rest = self.pending.split_off(i + 1);
            let done: Vec<_> = std::mem::replace(&mut self.pending, rest);
            for (older, _, _) in &done[..i] {
                out.push(HandlerAction::Abort {
                    id: older.id,
                    reason: AbortReason::Subsumed,
                });
            }
            let (barrier, _, first) = done[i];
            self.latest = Some(barrier.id);
            out.push(HandlerAction::Trigger {
                barrier,
                alignment: now.saturating_sub(first),
            });
        }
    }

    /// Barrier `barrier` arrived on `channel`.
    pub fn on_barrier(
        &mut self,
        channel: usize,
        barrier: CheckpointBarrier,
        now: Duration,
        out: &mut Vec<HandlerAction>,
    ) {
        if self.latest.is_some_and(|l| barrier.id <= l) {
            return;
        }
        let pos = match self.pending.iter().position(|(b, _, _)| b.id == barrier.id) {
            Some(p) => p,
            None => {
                let at = self.pending.partition_point(|(b, _, _)| b.id < barrier.id);
                self.pending
                    .insert(at, (barrier, vec![false; self.ended.len()], now));
                at
            }
        };
        self.pending[pos].1[channel] = true;
        self.complete_ready(now, out);
    }

    /// A cancel marker for checkpoint `id`: it, and every older pending one, is aborted.
    pub fn on_cancel_marker(&mut self, id: CheckpointId, out: &mut Vec<HandlerAction>) {
        if self.latest.is_some_and(|l| id <= l) {
            return;
        }
        let keep = self.pending.partition_point(|(b, _, _)| b.id <= id);
        for (b, _, _) in self.pending.drain(..keep) {
            if b.id != id {
                out.push(HandlerAction::Abort {
                    id: b.id,
                    reason: AbortReason::Subsumed,
                });
            }
        }
        self.latest = Some(id);
        out.push(HandlerAction::Abort {
            id,
            reason: AbortReason::CancelMarker,
        });
    }

    /// The coordinator aborted checkpoint `id`.
    pub fn on_abort_notified(&mut self, id: CheckpointId) {
        self.pending.retain(|(b, _, _)| b.id != id);
    }

    /// Channel `channel` ended: it no longer has to deliver barriers.
    pub fn on_end_of_input(&mut self, channel: usize, now: Duration, out: &mut Vec<HandlerAction>) {
        self.ended[channel] = true;
        self.complete_ready(now, out);
    }
}

/// The barrier handler of a task with inputs, chosen by the checkpointing mode (a closed set).
#[derive(Clone, Debug)]
pub enum BarrierHandler {
    /// EXACTLY_ONCE, aligned.
    Aligner(BarrierAligner),
    /// AT_LEAST_ONCE.
    Tracker(BarrierTracker),
}

impl BarrierHandler {
    /// The handler for `mode` over `num_channels` channels.
    pub fn for_mode(mode: weir_core::config::CheckpointingMode, num_channels: usize) -> Self {
        match mode {
            weir_core::config::CheckpointingMode::ExactlyOnce => {
                BarrierHandler::Aligner(BarrierAligner::new(num_channels))
            }
            weir_core::config::CheckpointingMode::AtLeastOnce => {
                BarrierHandler::Tracker(BarrierTracker::new(num_channels))
            }
        }
    }

    /// Barrier `barrier` arrived on `channel`.
    pub fn on_barrier(
        &mut self,
        channel: usize,
        barrier: CheckpointBarrier,
        now: Duration,
        out: &mut Vec<HandlerAction>,
    ) {
        match self {
            BarrierHandler::Aligner(a) => a.on_barrier(channel, barrier, now, out),
            BarrierHandler::Tracker(t) => t.on_barrier(channel, barrier, now, out),
        }
    }

    /// A cancel marker for `id` arrived on `channel`.
    pub fn on_cancel_marker(
        &mut self,
        channel: usize,
        id: CheckpointId,
        out: &mut Vec<HandlerAction>,
    ) {
        match self {
            BarrierHandler::Aligner(a) => a.on_cancel_marker(channel, id, out),
            BarrierHandler::Tracker(t) => t.on_cancel_marker(id, out),
        }
    }

    /// The coordinator aborted `id`.
    pub fn on_abort_notified(&mut self, id: CheckpointId, out: &mut Vec<HandlerAction>) {
        match self {
            BarrierHandler::Aligner(a) => a.on_abort_notified(id, out),
            BarrierHandler::Tracker(t) => t.on_abort_notified(id),
        }
    }

    /// Channel `channel` ended.
    pub fn on_end_of_input(&mut self, channel: usize, now: Duration, out: &mut Vec<HandlerAction>) {
        match self {
            BarrierHandler::Aligner(a) => a.on_end_of_input(channel, now, out),
            BarrierHandler::Tracker(t) => t.on_end_of_input(channel, now, out),
        }
    }

    /// The checkpoint whose barriers are being aligned (or whose in-flight data is being
    /// collected), if any; never for at-least-once, which does not align.
    pub fn aligning(&self) -> Option<CheckpointId> {
        match self {
            BarrierHandler::Aligner(a) => a.aligning(),
            BarrierHandler::Tracker(_) => None,
        }
    }

    /// When [`on_timer`](Self::on_timer) must be called next, if ever.
    pub fn next_deadline(&self) -> Option<Duration> {
        match self {
            BarrierHandler::Aligner(a) => a.next_deadline(),
            BarrierHandler::Tracker(_) => None,
        }
    }

    /// Time passed (an aligned checkpoint timeout may have expired).
    pub fn on_timer(&mut self, now: Duration, out: &mut Vec<HandlerAction>) {
        if let BarrierHandler::Aligner(a) = self {
            a.on_timer(now, out);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use weir_core::element::CheckpointOptions;

    fn b(id: u64) -> CheckpointBarrier {
        CheckpointBarrier {
            id: CheckpointId(id),
            timestamp_ms: 0,
            options: CheckpointOptions::ALIGNED_CHECKPOINT,
        }
    }

    /// Runs a script of `(channel, event)` lines through a handler and renders the actions, one
    /// line per event (the event padded to `width`; alignment times shown when `timing`).
    /// Events: `b<n>` aligned barrier, `u<n>` unaligned barrier, `t<n>` aligned barrier with a
    /// 2 ms aligned checkpoint timeout, `c<n>` cancel marker, `end`, `tick` (timer), `abort<n>`
    /// coordinator abort. Each line is one millisecond after the previous one.
    fn script(mut h: BarrierHandler, width: usize, timing: bool, script: &str) -> String {
        let mut lines = Vec::new();
        for (t, line) in script
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .enumerate()
        {
            let (ch, ev) = line.split_once(' ').unwrap();
            let ch: usize = ch.parse().unwrap();
            let now = Duration::from_millis(t as u64);
            let mut out = Vec::new();
            if let Some(n) = ev.strip_prefix("abort") {
                h.on_abort_notified(CheckpointId(n.parse().unwrap()), &mut out);
            } else if let Some(n) = ev.strip_prefix('b') {
                h.on_barrier(ch, b(n.parse().unwrap()), now, &mut out);
            } else if let Some(n) = ev.strip_prefix('c') {
                h.on_cancel_marker(ch, CheckpointId(n.parse().unwrap()), &mut out);
            } else if let Some(n) = ev.strip_prefix('u') {
                let mut barrier = b(n.parse().unwrap());
                barrier.options = barrier.options.as_unaligned();
                h.on_barrier(ch, barrier, now, &mut out);
            } else if ev == "tick" {
                h.on_timer(now, &mut out);
            } else if let Some(n) = ev.strip_prefix('t') {
                let mut barrier = b(n.parse().unwrap());
                barrier.options.alignment = AlignmentType::AlignedWithTimeout {
                    timeout: Duration::from_millis(2),
                };
                h.on_barrier(ch, barrier, now, &mut out);
            } else if ev == "end" {
                h.on_end_of_input(ch, now, &mut out);
            }
            let rendered: Vec<String> = out
                .iter()
                .map(|a| match a {
                    HandlerAction::Block(c) => format!("block {c}"),
                    HandlerAction::UnblockAll => "unblock".into(),
                    HandlerAction::Trigger { barrier, alignment } if timing => {
                        let u = if barrier.options.is_unaligned() {
                            " unaligned"
                        } else {
                            ""
                        };
                        format!(
                            "trigger {}{u} after {}ms",
                            barrier.id,
                            alignment.as_millis()
                        )
                    }
                    HandlerAction::Trigger { barrier, .. } => format!("trigger {}", barrier.id),
                    HandlerAction::PersistInFlight(c) => format!("persist {c}"),
                    HandlerAction::BarrierReached(c) => format!("reached {c}"),
                    HandlerAction::InFlightComplete(id) => format!("complete {id}"),
                    HandlerAction::Abort { id, reason } => format!("abort {id} ({reason:?})"),
                })
                .collect();
            lines.push(format!("{line:width$} => {}", rendered.join(", ")));
        }
        lines.join("\n")
    }

    fn run(channels: usize, s: &str) -> String {
        script(
            BarrierHandler::Aligner(BarrierAligner::new(channels)),
            10,
            true,
            s,
        )
    }

    fn run_tracker(channels: usize, s: &str) -> String {
        script(
            BarrierHandler::Tracker(BarrierTracker::new(channels)),
            8,
            false,
            s,
        )
    }

    #[test]
    fn aligns_blocks_and_triggers() {
        assert_eq!(
            run(3, "0 b1\n2 b1\n1 b1"),
            "0 b1       => block 0\n\
             2 b1       => block 2\n\
             1 b1       => block 1, unblock, trigger 1 after 2ms"
        );
    }

    #[test]
    fn single_channel_triggers_at_once() {
        assert_eq!(
            run(1, "0 b1\n0 b2"),
            "0 b1       => block 0, unblock, trigger 1 after 0ms\n\
             0 b2       => block 0, unblock, trigger 2 after 0ms"
        );
    }

    #[test]
    fn stale_barriers_are_ignored() {
        assert_eq!(
            run(2, "0 b2\n1 b2\n0 b1\n1 b2"),
            "0 b2       => block 0\n\
             1 b2       => block 1, unblock, trigger 2 after 1ms\n\
             0 b1       => \n\
             1 b2       => "
        );
    }

    #[test]
    fn newer_barrier_aborts_the_older_alignment() {
        assert_eq!(
            run(2, "0 b1\n0 b2\n1 b1\n1 b2"),
            "0 b1       => block 0\n\
             0 b2       => unblock, abort 1 (Subsumed), block 0\n\
             1 b1       => \n\
             1 b2       => block 1, unblock, trigger 2 after 2ms"
        );
    }

    #[test]
    fn cancel_marker_releases_alignment() {
        assert_eq!(
            run(2, "0 b1\n1 c1\n1 b1\n0 b2\n1 b2"),
            "0 b1       => block 0\n\
             1 c1       => unblock, abort 1 (CancelMarker)\n\
             1 b1       => \n\
             0 b2       => block 0\n\
             1 b2       => block 1, unblock, trigger 2 after 1ms"
        );
    }

    #[test]
    fn end_of_input_counts_as_the_barrier() {
        assert_eq!(
            run(3, "0 b1\n1 end\n2 b1\n0 b2\n2 b2"),
            "0 b1       => block 0\n\
             1 end      => \n\
             2 b1       => block 2, unblock, trigger 1 after 2ms\n\
             0 b2       => block 0\n\
             2 b2       => block 2, unblock, trigger 2 after 1ms"
        );
        assert_eq!(
            run(2, "0 b1\n1 end"),
            "0 b1       => block 0\n\
             1 end      => unblock, trigger 1 after 1ms"
        );
    }

    #[test]
    fn coordinator_abort_releases_and_makes_the_id_stale() {
        assert_eq!(
            run(2, "0 b1\n0 abort1\n1 b1\n0 b2"),
            "0 b1       => block 0\n\
             0 abort1   => unblock\n\
             1 b1       => \n\
             0 b2       => block 0"
        );
    }

    /// Random interleavings in the style of Flink's `AlignedCheckpointsMassiveRandomTest`: every
    /// channel delivers barriers in increasing order, some checkpoints are cancelled. Invariants:
    /// triggers are strictly increasing; a blocked channel delivers nothing until released; a
    /// checkpoint every channel delivered in full without cancel is triggered.
    #[test]
    fn random_interleavings_keep_the_invariants() {
        let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
        let mut rnd = move |n: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % n
        };
        for _round in 0..300 {
            let channels = 1 + rnd(5) as usize;
            let checkpoints = 1 + rnd(6);
            let cancelled: Vec<bool> = (0..=checkpoints).map(|_| rnd(5) == 0).collect();
            // Per channel, the queue of events: for each checkpoint, a barrier or (if cancelled,
            // on a random subset of channels) a cancel marker.
            let mut queues: Vec<Vec<(bool, u64)>> = vec![Vec::new(); channels];
            for id in 1..=checkpoints {
                for q in queues.iter_mut() {
                    let cancel = cancelled[id as usize] && rnd(2) == 0;
                    q.push((cancel, id));
                }
            }
            let mut pos = vec![0usize; channels];
            let mut a = BarrierAligner::new(channels);
            let mut blocked = vec![false; channels];
            let mut triggered = Vec::new();
            let mut t = 0u64;
            loop {
                let ready: Vec<usize> = (0..channels)
                    .filter(|&c| !blocked[c] && pos[c] < queues[c].len())
                    .collect();
                if ready.is_empty() {
                    break;
                }
                let c = ready[rnd(ready.len() as u64) as usize];
                let (cancel, id) = queues[c][pos[c]];
                pos[c] += 1;
                t += 1;
                let mut out = Vec::new();
                if cancel {
                    a.on_cancel_marker(c, CheckpointId(id), &mut out);
                } else {
                    a.on_barrier(c, b(id), Duration::from_millis(t), &mut out);
                }
                for act in out {
                    match act {
                        HandlerAction::Block(c) => blocked[c] = true,
                        HandlerAction::UnblockAll => blocked.iter_mut().for_each(|b| *b = false),
                        HandlerAction::Trigger { barrier, .. } => triggered.push(barrier.id.0),
                        HandlerAction::Abort { .. }
                        | HandlerAction::PersistInFlight(_)
                        | HandlerAction::BarrierReached(_)
                        | HandlerAction::InFlightComplete(_) => {}
                    }
                }
            }
            assert!(
                pos.iter().zip(&queues).all(|(p, q)| *p == q.len()),
                "no deadlock"
            );
            assert!(triggered.windows(2).all(|w| w[0] < w[1]), "{triggered:?}");
            for id in 1..=checkpoints {
                let clean = queues.iter().all(|q| !q[(id - 1) as usize].0);
                if clean {
                    // Blocked channels cannot deliver a newer barrier early, so nothing can
                    // subsume a checkpoint that no channel cancelled.
                    assert!(
                        triggered.contains(&id),
                        "clean checkpoint {id} did not trigger"
                    );
                }
                if !clean {
                    assert!(!triggered.contains(&id), "cancelled {id} triggered");
                }
            }
        }
    }

    /// One item of a channel in the model of the randomized unaligned/alternating test.
    #[derive(Clone, Copy, Debug)]
    enum Item {
        /// Record `n` of its channel; each channel numbers its records from 0.
        Data(u64),
        Barrier(CheckpointBarrier),
        Cancel(u64),
        End,
    }

    /// The unaligned checkpoint whose in-flight data the task is collecting.
    struct Collecting {
        id: u64,
        /// Per channel: records processed before the trigger (records `0..before[c]`).
        before: Vec<u64>,
        /// Per channel: between `PersistInFlight` and `BarrierReached`.
        persisting: Vec<bool>,
        /// Per channel: `BarrierReached` seen.
        reached: Vec<bool>,
        /// Per channel: the records persisted as in-flight data.
        persisted: Vec<Vec<u64>>,
    }

    /// The randomized test of unaligned and alternating checkpoints, in the style of Flink's
    /// `AlignedCheckpointsMassiveRandomTest`: channels carry numbered records, barriers (in
    /// increasing order, in order with the records: nothing is overtaken), cancel markers and end
    /// of input; the timer fires at random times, the coordinator aborts now and then. The task is
    /// simulated exactly: blocked channels deliver nothing, an unaligned trigger starts collecting
    /// in-flight data, `PersistInFlight`/`BarrierReached` say which records are persisted.
    ///
    /// Invariants: triggers strictly increase; no deadlock (every queue drains); the task's view of
    /// blocked channels is the handler's; an alignment past its timeout has switched once the timer
    /// or a barrier was handled; nothing is blocked or triggered while an unaligned checkpoint
    /// collects; `InFlightComplete` follows the trigger of the same id, with every
    /// channel's barrier reached; a completed checkpoint is never aborted afterwards; a checkpoint
    /// some channel cancelled never completes; one no channel cancelled (and the coordinator did
    /// not abort first) triggers; and exactly-once: for every completed checkpoint and channel, the
    /// records processed before the trigger plus those persisted are exactly, without duplicates,
    /// the records before that checkpoint's barrier (or the end) on the channel.
    #[test]
    fn random_unaligned_and_alternating_checkpoints_are_exactly_once() {
        let mut seed = 0x2545_f491_4f6c_dd1d_u64;
        let mut rnd = move |n: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % n
        };
        for round in 0..400 {
            let channels = 1 + rnd(4) as usize;
            let checkpoints = 1 + rnd(6);
            // 0: unaligned, 1: alternating, 2: aligned, unaligned and alternating mixed.
            let style = rnd(3);
            let cancelled: Vec<bool> = (0..=checkpoints).map(|_| rnd(5) == 0).collect();
            let barriers: Vec<CheckpointBarrier> = (0..=checkpoints)
                .map(|id| {
                    let mut barrier = b(id);
                    barrier.options.alignment = match (style, rnd(3)) {
                        (0, _) | (2, 0) => AlignmentType::Unaligned,
                        (1, _) | (2, 1) => AlignmentType::AlignedWithTimeout {
                            timeout: Duration::from_millis(rnd(8)),
                        },
                        _ => AlignmentType::Aligned,
                    };
                    barrier
                })
                .collect();
            let mut queues: Vec<Vec<Item>> = Vec::new();
            for _ in 0..channels {
                let ends_after = if rnd(4) == 0 {
                    rnd(checkpoints + 1)
                } else {
                    checkpoints
                };
                let mut q = Vec::new();
                let mut n = 0;
                for id in 1..=ends_after {
                    for _ in 0..rnd(4) {
                        q.push(Item::Data(n));
                        n += 1;
                    }
                    let mut barrier = barriers[id as usize];
                    if matches!(
                        barrier.options.alignment,
                        AlignmentType::AlignedWithTimeout { .. }
                    ) && rnd(6) == 0
                    {
                        // The upstream task's alignment timed out: its barrier comes switched.
                        barrier.options = barrier.options.as_unaligned();
                    }
                    q.push(if cancelled[id as usize] && rnd(2) == 0 {
                        Item::Cancel(id)
                    } else {
                        Item::Barrier(barrier)
                    });
                }
                for _ in 0..rnd(4) {
                    q.push(Item::Data(n));
                    n += 1;
                }
                q.push(Item::End);
                queues.push(q);
            }

            let mut a = BarrierAligner::new(channels);
            let mut pos = vec![0usize; channels];
            let mut processed = vec![0u64; channels];
            let mut blocked = vec![false; channels];
            let mut triggered: Vec<u64> = Vec::new();
            let mut collecting: Option<Collecting> = None;
            // (id, records processed before the trigger, records persisted) per channel.
            let mut completed: Vec<(u64, Vec<u64>, Vec<Vec<u64>>)> = Vec::new();
            // The coordinator aborted a newer or equal id before this one triggered.
            let mut excused = vec![false; checkpoints as usize + 1];
            let mut now = Duration::ZERO;
            let mut trace = String::new();
            for step in 0.. {
                assert!(
                    step < 10_000,
                    "round {round}: the handler livelocks\n{trace}"
                );
                now += Duration::from_millis(rnd(3));
                let ready: Vec<usize> = (0..channels)
                    .filter(|&c| !blocked[c] && pos[c] < queues[c].len())
                    .collect();
                let mut out = Vec::new();
                let event;
                let (mut timed, mut barrier_arrived) = (false, false);
                let dice = rnd(40);
                if dice < 4 {
                    event = "tick".to_string();
                    timed = true;
                    a.on_timer(now, &mut out);
                } else if dice == 4 {
                    let id = 1 + rnd(checkpoints);
                    event = format!("abort{id}");
                    for older in 1..=id {
                        if !triggered.contains(&older) {
                            excused[older as usize] = true;
                        }
                    }
                    a.on_abort_notified(CheckpointId(id), &mut out);
                    // The task drops the in-flight data of a checkpoint the coordinator aborted.
                    if collecting.as_ref().is_some_and(|k| k.id == id) {
                        collecting = None;
                    }
                } else if ready.is_empty() {
                    // Nothing to read: the task waits for the timer, if any.
                    let Some(deadline) = a.next_deadline() else {
                        break;
                    };
                    now = now.max(deadline);
                    event = "timer".to_string();
                    timed = true;
                    a.on_timer(now, &mut out);
                } else {
                    let c = ready[rnd(ready.len() as u64) as usize];
                    let item = queues[c][pos[c]];
                    pos[c] += 1;
                    match item {
                        Item::Data(n) => {
                            event = format!("{c} d{n}");
                            assert_eq!(n, processed[c], "round {round}: the model lost a record");
                            processed[c] += 1;
                            if let Some(k) = collecting.as_mut()
                                && k.persisting[c]
                            {
                                k.persisted[c].push(n);
                            }
                        }
                        Item::Barrier(barrier) => {
                            let kind = match barrier.options.alignment {
                                AlignmentType::Unaligned => "u".to_string(),
                                AlignmentType::AlignedWithTimeout { timeout } => {
                                    format!("t({}ms)", timeout.as_millis())
                                }
                                _ => "b".to_string(),
                            };
                            event = format!("{c} {kind}{}", barrier.id);
                            barrier_arrived = true;
                            a.on_barrier(c, barrier, now, &mut out);
                        }
                        Item::Cancel(id) => {
                            event = format!("{c} c{id}");
                            a.on_cancel_marker(c, CheckpointId(id), &mut out);
                        }
                        Item::End => {
                            event = format!("{c} end");
                            a.on_end_of_input(c, now, &mut out);
                        }
                    }
                }
                trace += &format!("{:>4}ms {event:12} => {out:?}\n", now.as_millis());
                if timed || (barrier_arrived && !out.is_empty()) {
                    // The timeout is checked on the timer and when a barrier is handled.
                    assert!(
                        a.next_deadline().is_none_or(|d| d > now),
                        "round {round}: an alignment past its timeout did not switch\n{trace}"
                    );
                }
                for act in out {
                    match act {
                        HandlerAction::Block(c) => {
                            assert!(
                                collecting.is_none(),
                                "round {round}: channel {c} blocked while an unaligned \
                                 checkpoint collects in-flight data\n{trace}"
                            );
                            assert!(
                                !blocked[c],
                                "round {round}: channel {c} blocked twice\n{trace}"
                            );
                            blocked[c] = true;
                        }
                        HandlerAction::UnblockAll => blocked.iter_mut().for_each(|b| *b = false),
                        HandlerAction::Trigger { barrier, .. } => {
                            let id = barrier.id.0;
                            assert!(
                                triggered.last().is_none_or(|l| *l < id),
                                "round {round}: trigger {id} after {triggered:?}\n{trace}"
                            );
                            assert!(
                                collecting.is_none(),
                                "round {round}: trigger {id} while an unaligned checkpoint \
                                 collects in-flight data\n{trace}"
                            );
                            assert!(
                                !blocked.iter().any(|b| *b),
                                "round {round}: trigger {id} with channels still blocked\n{trace}"
                            );
                            triggered.push(id);
                            if barrier.options.is_unaligned() {
                                collecting = Some(Collecting {
                                    id,
                                    before: processed.clone(),
                                    persisting: vec![false; channels],
                                    reached: vec![false; channels],
                                    persisted: vec![Vec::new(); channels],
                                });
                            } else {
                                completed.push((id, processed.clone(), vec![Vec::new(); channels]));
                            }
                        }
                        HandlerAction::PersistInFlight(c) => {
                            let Some(k) = collecting.as_mut() else {
                                panic!(
                                    "round {round}: persist {c} with no unaligned checkpoint\n\
                                     {trace}"
                                );
                            };
                            assert!(
                                !k.persisting[c] && !k.reached[c],
                                "round {round}: persist {c} twice or after its barrier\n{trace}"
                            );
                            k.persisting[c] = true;
                        }
                        HandlerAction::BarrierReached(c) => {
                            let Some(k) = collecting.as_mut() else {
                                panic!(
                                    "round {round}: reached {c} with no unaligned checkpoint\n\
                                     {trace}"
                                );
                            };
                            assert!(!k.reached[c], "round {round}: reached {c} twice\n{trace}");
                            // In this model barriers overtake nothing: persisting stops here.
                            k.reached[c] = true;
                            k.persisting[c] = false;
                        }
                        HandlerAction::InFlightComplete(id) => {
                            let Some(k) = collecting.take() else {
                                panic!(
                                    "round {round}: complete {id} with no unaligned checkpoint\n\
                                     {trace}"
                                );
                            };
                            assert_eq!(
                                k.id, id.0,
                                "round {round}: complete {id} while collecting for {}\n{trace}",
                                k.id
                            );
                            assert!(
                                !k.persisting.iter().any(|p| *p),
                                "round {round}: complete {id} while channels still owe their \
                                 barrier: {:?}\n{trace}",
                                k.persisting
                            );
                            completed.push((k.id, k.before, k.persisted));
                        }
                        HandlerAction::Abort { id, .. } => {
                            assert!(
                                !completed.iter().any(|(done, _, _)| *done == id.0),
                                "round {round}: abort {id} after it completed\n{trace}"
                            );
                            if collecting.as_ref().is_some_and(|k| k.id == id.0) {
                                collecting = None;
                            }
                        }
                    }
                }
                for (c, blocked) in blocked.iter().enumerate() {
                    assert_eq!(
                        *blocked,
                        a.is_blocked(c),
                        "round {round}: the task and the handler disagree on channel {c}\n{trace}"
                    );
                }
            }

            for (c, q) in queues.iter().enumerate() {
                assert_eq!(
                    pos[c],
                    q.len(),
                    "round {round}: deadlock, channel {c} stuck (blocked: {blocked:?})\n{trace}"
                );
            }
            assert!(
                collecting.is_none() && a.aligning().is_none(),
                "round {round}: a checkpoint is still in progress after every channel \
                 ended\n{trace}"
            );
            for id in 1..=checkpoints {
                let has = |f: &dyn Fn(&Item) -> bool| queues.iter().any(|q| q.iter().any(f));
                let cancelled = has(&|i| matches!(i, Item::Cancel(x) if *x == id));
                let barrier = has(&|i| matches!(i, Item::Barrier(x) if x.id.0 == id));
                let done = completed.iter().any(|(d, _, _)| *d == id);
                if cancelled {
                    assert!(!done, "round {round}: cancelled {id} completed\n{trace}");
                } else if barrier && !excused[id as usize] {
                    assert!(
                        triggered.contains(&id),
                        "round {round}: clean checkpoint {id} did not trigger\n{trace}"
                    );
                }
            }
            for (id, before, persisted) in &completed {
                for (c, q) in queues.iter().enumerate() {
                    let cut = q
                        .iter()
                        .position(|i| match i {
                            Item::Barrier(x) => x.id.0 == *id,
                            Item::Cancel(x) => x == id,
                            Item::End => true,
                            Item::Data(_) => false,
                        })
                        .expect("every queue ends");
                    assert!(
                        !matches!(q[cut], Item::Cancel(_)),
                        "round {round}: checkpoint {id} completed though channel {c} \
                         cancelled it\n{trace}"
                    );
                    let expected: Vec<u64> = q[..cut]
                        .iter()
                        .filter_map(|i| match i {
                            Item::Data(n) => Some(*n),
                            _ => None,
                        })
                        .collect();
                    let mut got: Vec<u64> =
                        (0..before[c]).chain(persisted[c].iter().copied()).collect();
                    got.sort_unstable();
                    assert_eq!(
                        got, expected,
                        "round {round}: checkpoint {id}, channel {c}: records processed before \
                         the trigger ({}) plus persisted ({:?}) must be exactly those before the \
                         barrier, once each\n{trace}",
                        before[c], persisted[c]
                    );
                }
            }
        }
    }

    #[test]
    fn unaligned_triggers_on_the_first_barrier_and_persists_the_other_channels() {
        assert_eq!(
            run(3, "1 u1\n0 u1\n2 end"),
            "1 u1       => trigger 1 unaligned after 0ms, persist 0, persist 1, persist 2, reached 1\n\
             0 u1       => reached 0\n\
             2 end      => reached 2, complete 1"
        );
    }

    #[test]
    fn unaligned_checkpoints_abort_on_newer_barriers_and_cancel_markers() {
        assert_eq!(
            run(2, "0 u1\n0 u2\n1 u1\n1 c3\n1 u2\n0 u4\n1 u4"),
            "0 u1       => trigger 1 unaligned after 0ms, persist 0, persist 1, reached 0\n\
             0 u2       => abort 1 (Subsumed), trigger 2 unaligned after 0ms, persist 0, persist 1, reached 0\n\
             1 u1       => \n\
             1 c3       => abort 2 (Subsumed), abort 3 (CancelMarker)\n\
             1 u2       => \n\
             0 u4       => trigger 4 unaligned after 0ms, persist 0, persist 1, reached 0\n\
             1 u4       => reached 1, complete 4"
        );
    }

    #[test]
    fn alternating_switches_to_unaligned_after_the_timeout() {
        // Aligned within the timeout: an ordinary aligned checkpoint.
        assert_eq!(
            run(2, "0 t1\n1 t1"),
            "0 t1       => block 0\n\
             1 t1       => block 1, unblock, trigger 1 after 1ms"
        );
        // Channel 1's barrier is late: at 2 ms the timer switches, channel 0 resumes and only
        // channel 1 is persisted.
        assert_eq!(
            run(3, "0 t1\n2 t1\n0 tick\n1 t1"),
            "0 t1       => block 0\n\
             2 t1       => block 2\n\
             0 tick     => unblock, trigger 1 unaligned after 2ms, persist 1\n\
             1 t1       => reached 1, complete 1"
        );
        // A barrier that an upstream task already switched makes this task switch too.
        assert_eq!(
            run(2, "0 t1\n1 u1"),
            "0 t1       => block 0\n\
             1 u1       => unblock, trigger 1 unaligned after 1ms, persist 1, reached 1, complete 1"
        );
        // The timeout is checked when a barrier arrives too.
        assert_eq!(
            run(3, "0 t1\n1 end\n0 tick\n2 t1"),
            "0 t1       => block 0\n\
             1 end      => \n\
             0 tick     => unblock, trigger 1 unaligned after 2ms, persist 2\n\
             2 t1       => reached 2, complete 1"
        );
    }

    #[test]
    fn savepoint_barriers_stay_aligned_beside_unaligned_checkpoints() {
        assert_eq!(
            run(2, "0 u1\n1 u1\n0 b2\n1 b2"),
            "0 u1       => trigger 1 unaligned after 0ms, persist 0, persist 1, reached 0\n\
             1 u1       => reached 1, complete 1\n\
             0 b2       => block 0\n\
             1 b2       => block 1, unblock, trigger 2 after 1ms"
        );
    }

    #[test]
    fn tracker_never_blocks_and_triggers_when_all_channels_delivered() {
        assert_eq!(
            run_tracker(2, "0 b1\n0 b2\n1 b1\n1 b2"),
            "0 b1     => \n\
             0 b2     => \n\
             1 b1     => trigger 1\n\
             1 b2     => trigger 2"
        );
    }

    #[test]
    fn tracker_aborts_older_incomplete_checkpoints_and_ignores_stale_barriers() {
        assert_eq!(
            run_tracker(2, "0 b1\n0 b2\n1 b2\n1 b1"),
            "0 b1     => \n\
             0 b2     => \n\
             1 b2     => abort 1 (Subsumed), trigger 2\n\
             1 b1     => "
        );
    }

    #[test]
    fn tracker_cancel_and_end_of_input() {
        assert_eq!(
            run_tracker(3, "0 b1\n1 c1\n2 b1\n0 b2\n1 end\n2 b2"),
            "0 b1     => \n\
             1 c1     => abort 1 (CancelMarker)\n\
             2 b1     => \n\
             0 b2     => \n\
             1 end    => \n\
             2 b2     => trigger 2"
        );
    }
}
