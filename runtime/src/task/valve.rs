//! The watermark of a task with several input channels (Flink's `StatusWatermarkValve`): the
//! minimum over the channels that are neither idle nor ended, never going back; the task is idle
//! when every channel still open is.

use weir_core::element::WatermarkStatus;

/// What one input event makes the task emit downstream: a task that becomes active says so
/// before its watermark, one that goes idle after its last watermark (a watermark downstream
/// of an idle status would be ignored there: it comes from an idle channel).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct ValveOutput {
    /// The task's status changed.
    pub status: Option<WatermarkStatus>,
    /// The task's watermark advanced to this.
    pub watermark: Option<i64>,
}

impl ValveOutput {
    /// Whether the status goes out after the watermark (going idle) rather than before.
    pub fn status_last(&self) -> bool {
        self.status == Some(WatermarkStatus::Idle)
    }
}

/// The channels' watermarks and statuses, and what the task last emitted.
#[derive(Debug)]
pub(crate) struct WatermarkValve {
    watermarks: Vec<i64>,
    idle: Vec<bool>,
    ended: Vec<bool>,
    /// The task's watermark: the last it emitted.
    current: i64,
    /// The task told its downstream it is idle.
    idle_out: bool,
}

impl WatermarkValve {
    /// `channels` channels, all active, with no watermark yet.
    pub fn new(channels: usize) -> Self {
        WatermarkValve {
            watermarks: vec![i64::MIN; channels],
            idle: vec![false; channels],
            ended: vec![false; channels],
            current: i64::MIN,
            idle_out: false,
        }
    }

    /// The task's watermark.
    #[cfg(test)]
    pub fn current(&self) -> i64 {
        self.current
    }

    /// Channel `ch` sent watermark `w`. One from an idle channel is ignored (Flink's valve
    /// does the same): a channel says it is active before it sends watermarks again.
    pub fn watermark(&mut self, ch: usize, w: i64) -> ValveOutput {
        if self.idle[ch] {
            return ValveOutput::default();
        }
        self.watermarks[ch] = self.watermarks[ch].max(w);
        self.settle(true)
    }

    /// Channel `ch` went idle or became active again.
    pub fn status(&mut self, ch: usize, status: WatermarkStatus) -> ValveOutput {
        self.idle[ch] = status == WatermarkStatus::Idle;
        self.settle(true)
    }

    /// Channel `ch` ended: it never holds the watermark back again. Its end advances no
    /// watermark by itself (a stop without drain ends every channel, and must fire nothing; a
    /// drained or finished source sent the end of event time before its end); the next
    /// watermark of another channel does.
    pub fn end(&mut self, ch: usize) -> ValveOutput {
        self.ended[ch] = true;
        self.idle[ch] = false;
        self.watermarks[ch] = i64::MAX;
        self.settle(false)
    }

    /// What the channels now give: a status change first, then the new watermark (if
    /// `advance`).
    fn settle(&mut self, advance: bool) -> ValveOutput {
        let open = || (0..self.watermarks.len()).filter(|&c| !self.ended[c]);
        let active: Vec<usize> = open().filter(|&c| !self.idle[c]).collect();
        let all_idle = active.is_empty() && open().next().is_some();
        let mut out = ValveOutput::default();
        let candidate = if all_idle {
            // Every open channel is idle: event time goes as far as the furthest of them
            // (Flink emits the maximum over its channels then), and the task is idle.
            open().map(|c| self.watermarks[c]).max()
        } else if active.is_empty() {
            // Every channel ended.
            Some(i64::MAX)
        } else {
            // A channel that became active behind the task's watermark holds it until it
            // catches up; its records meanwhile are not late.
            active.iter().map(|&c| self.watermarks[c]).min()
        };
        if all_idle != self.idle_out {
            self.idle_out = all_idle;
            out.status = Some(if all_idle {
                WatermarkStatus::Idle
            } else {
                WatermarkStatus::Active
            });
        }
        if let Some(w) = candidate
            && advance
            && w > self.current
        {
            self.current = w;
            out.watermark = Some(w);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use WatermarkStatus::{Active, Idle};

    /// Passes what `up` emitted into channel `ch` of `down`, in the order a task emits it.
    fn forward(out: ValveOutput, down: &mut WatermarkValve, ch: usize) -> ValveOutput {
        let mut last = ValveOutput::default();
        let mut apply = |o: ValveOutput| {
            if o != ValveOutput::default() {
                last = o;
            }
        };
        if !out.status_last()
            && let Some(s) = out.status
        {
            apply(down.status(ch, s));
        }
        if let Some(w) = out.watermark {
            apply(down.watermark(ch, w));
        }
        if out.status_last()
            && let Some(s) = out.status
        {
            apply(down.status(ch, s));
        }
        last
    }

    /// Idleness crosses any number of hops: a task that goes idle at a higher watermark sends
    /// the watermark first, so the next task does not take it for activity.
    #[test]
    fn idleness_crosses_a_second_hop() {
        let mut up = WatermarkValve::new(2);
        up.watermark(0, 100);
        up.watermark(1, 50);
        up.status(0, Idle);
        let out = up.status(1, Idle);
        assert_eq!(
            out,
            ValveOutput {
                status: Some(Idle),
                watermark: Some(100)
            }
        );
        assert!(out.status_last());
        // Downstream: channel 0 from `up`, channel 1 a live stream.
        let mut down = WatermarkValve::new(2);
        forward(out, &mut down, 0);
        assert_eq!(down.watermark(1, 10_000).watermark, Some(10_000));
    }

    fn wm(w: i64) -> ValveOutput {
        ValveOutput {
            status: None,
            watermark: Some(w),
        }
    }

    #[test]
    fn the_minimum_over_active_channels_never_goes_back() {
        let mut v = WatermarkValve::new(2);
        assert_eq!(
            v.watermark(0, 10),
            ValveOutput::default(),
            "channel 1 has none"
        );
        assert_eq!(v.watermark(1, 5), wm(5));
        assert_eq!(v.watermark(1, 3), ValveOutput::default());
        assert_eq!(v.watermark(1, 20), wm(10));
    }

    #[test]
    fn an_idle_channel_stops_holding_the_watermark_back() {
        let mut v = WatermarkValve::new(2);
        v.watermark(0, 100);
        assert_eq!(v.watermark(1, 7), wm(7));
        assert_eq!(v.status(1, Idle), wm(100));
        assert_eq!(v.watermark(0, 150), wm(150));
        // Back, behind the task's watermark: it holds it until it catches up.
        assert_eq!(v.status(1, Active), ValveOutput::default());
        assert_eq!(v.watermark(0, 200), ValveOutput::default());
        assert_eq!(v.watermark(1, 180), wm(180));
    }

    #[test]
    fn the_task_is_idle_when_every_open_channel_is() {
        let mut v = WatermarkValve::new(3);
        v.watermark(0, 50);
        v.watermark(1, 80);
        assert_eq!(v.end(2), ValveOutput::default());
        assert_eq!(v.status(0, Idle), wm(80));
        // The last open channel goes idle: the task is idle, at the furthest idle watermark,
        // and the ended channel does not take event time to its end.
        assert_eq!(
            v.status(1, Idle),
            ValveOutput {
                status: Some(Idle),
                watermark: None
            }
        );
        assert_eq!(v.current(), 80);
        assert_eq!(v.watermark(0, 90), ValveOutput::default(), "idle: ignored");
        assert_eq!(
            v.status(0, Active),
            ValveOutput {
                status: Some(Active),
                watermark: None
            }
        );
        assert_eq!(v.watermark(0, 90), wm(90));
        v.end(0);
        assert_eq!(
            v.end(1).watermark,
            None,
            "an end advances nothing by itself"
        );
    }
}
