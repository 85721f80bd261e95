//! Barrier handlers as pure state machines: events from the input channels in, actions out.
//!
//! [`BarrierAligner`] is Flink's `CheckpointBarrierAligner` for EXACTLY_ONCE aligned checkpoints:
//! when barrier *n* arrives on a channel, that channel is blocked; when it has arrived on every
//! channel still open, the checkpoint triggers and all channels resume. Channels that ended count
//! as having delivered the barrier. Older barriers are ignored (reference step 0), a newer barrier
//! aborts an alignment in progress, and a `CancelCheckpointMarker` releases it.
//!
//! Time is passed in (`now`, monotonic), so alignment durations are measured without a clock here.

use std::time::Duration;
use weir_core::element::CheckpointBarrier;
use weir_core::ids::CheckpointId;

/// What the task must do after a handler saw an event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HandlerAction {
    /// Stop reading this channel.
    Block(usize),
    /// Resume reading every channel.
    UnblockAll,
    /// Barriers arrived on every channel: take the checkpoint (steps 0–4), then go on.
    Trigger {
        /// The barrier, as received.
        barrier: CheckpointBarrier,
        /// Time from the first barrier to the last.
        alignment: Duration,
    },
    /// Give up on checkpoint `id` here: tell the coordinator and send a cancel marker downstream.
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

/// Flink's aligned barrier handler.
#[derive(Clone, Debug)]
pub struct BarrierAligner {
    /// Barrier received on each channel for the current alignment.
    received: Vec<bool>,
    /// Channels that ended.
    ended: Vec<bool>,
    /// The alignment in progress.
    current: Option<(CheckpointBarrier, Duration)>,
    /// The newest checkpoint id triggered, aborted or being aligned; older barriers are stale.
    latest: Option<CheckpointId>,
}

impl BarrierAligner {
    /// An aligner over `num_channels` channels.
    pub fn new(num_channels: usize) -> BarrierAligner {
        BarrierAligner {
            received: vec![false; num_channels],
            ended: vec![false; num_channels],
            current: None,
            latest: None,
        }
    }

    /// The checkpoint being aligned, if any.
    pub fn aligning(&self) -> Option<CheckpointId> {
        self.current.map(|(b, _)| b.id)
    }

    /// Whether channel `i` is blocked by the alignment in progress.
    pub fn is_blocked(&self, i: usize) -> bool {
        self.current.is_some() && self.received[i]
    }

    fn is_stale(&self, id: CheckpointId) -> bool {
        self.latest.is_some_and(|l| id <= l) && self.aligning() != Some(id)
    }

    fn release(&mut self, out: &mut Vec<HandlerAction>) {
        if self.current.take().is_some() {
            self.received.iter_mut().for_each(|r| *r = false);
            out.push(HandlerAction::UnblockAll);
        }
    }

    fn maybe_complete(&mut self, now: Duration, out: &mut Vec<HandlerAction>) {
        let Some((barrier, started)) = self.current else {
            return;
        };
        let all = self.received.iter().zip(&self.ended).all(|(r, e)| *r || *e);
        if all {
            self.release(out);
            out.push(HandlerAction::Trigger {
                barrier,
                alignment: now.saturating_sub(started),
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
        if self.is_stale(barrier.id) {
            return;
        }
        if let Some((cur, _)) = self.current
            && barrier.id > cur.id
        {
            self.release(out);
            out.push(HandlerAction::Abort {
                id: cur.id,
                reason: AbortReason::Subsumed,
            });
        }
        if self.current.is_none() {
            self.current = Some((barrier, now));
            self.latest = Some(barrier.id);
        }
        if !self.received[channel] {
            self.received[channel] = true;
            out.push(HandlerAction::Block(channel));
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

    /// Channel `channel` ended. During an alignment it counts as having delivered the barrier.
    pub fn on_end_of_input(&mut self, channel: usize, now: Duration, out: &mut Vec<HandlerAction>) {
        self.ended[channel] = true;
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
    /// Events: `b<n>` barrier, `c<n>` cancel marker, `end`, `abort<n>` coordinator abort.
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
            } else if ev == "end" {
                h.on_end_of_input(ch, now, &mut out);
            }
            let rendered: Vec<String> = out
                .iter()
                .map(|a| match a {
                    HandlerAction::Block(c) => format!("block {c}"),
                    HandlerAction::UnblockAll => "unblock".into(),
                    HandlerAction::Trigger { barrier, alignment } if timing => {
                        format!("trigger {} after {}ms", barrier.id, alignment.as_millis())
                    }
                    HandlerAction::Trigger { barrier, .. } => format!("trigger {}", barrier.id),
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
                        HandlerAction::Abort { .. } => {}
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
