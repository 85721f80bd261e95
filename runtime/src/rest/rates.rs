//! Per-second rates of the vertices' counters (records/s, back-pressured ms/s), from samples the
//! REST server takes once a second and keeps for a few seconds (Flink's `MeterView` over a
//! window): what the web UI's job graph, the backpressure endpoint and `/metrics` report.

use crate::job::{JobClient, VertexSample};
use std::collections::{BTreeMap, VecDeque};
use std::sync::Mutex;

/// How often the server samples the counters.
pub(super) const SAMPLE_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

/// The window a rate is measured over, in samples.
const WINDOW: usize = 5;

/// A vertex's rates over the window.
#[derive(Clone, Debug, Default, PartialEq)]
pub(super) struct VertexRate {
    /// Records a second (emitted by a source vertex, processed by another).
    pub records_per_second: f64,
    /// Per subtask: ms a second its task waited for credits (0..=1000).
    pub backpressured_ms_per_second: Vec<f64>,
}

/// The last samples, oldest first: (ms since the Unix epoch, the counters then).
#[derive(Default)]
pub(super) struct Rates {
    samples: Mutex<VecDeque<(u64, BTreeMap<u32, VertexSample>)>>,
}

impl Rates {
    /// Takes a sample of `client`'s counters at `now_ms`.
    pub fn sample(&self, client: &JobClient, now_ms: u64) {
        let counters = client.vertex_metrics();
        if let Ok(mut s) = self.samples.lock() {
            s.push_back((now_ms, counters));
            while s.len() > WINDOW + 1 {
                s.pop_front();
            }
        }
    }

    /// Each vertex's rates from the oldest kept sample to `now` (the counters at `now_ms`);
    /// zero before the first sample.
    pub fn rates(
        &self,
        now: &BTreeMap<u32, VertexSample>,
        now_ms: u64,
    ) -> BTreeMap<u32, VertexRate> {
        let oldest = self.samples.lock().ok().and_then(|s| s.front().cloned());
        now.iter()
            .map(|(vertex, current)| {
                let rate = match &oldest {
                    Some((at, then)) if now_ms > *at => {
                        let seconds = (now_ms - at) as f64 / 1000.0;
                        let before = then.get(vertex).cloned().unwrap_or_default();
                        rate_between(&before, current, seconds)
                    }
                    _ => VertexRate {
                        records_per_second: 0.0,
                        backpressured_ms_per_second: vec![0.0; current.backpressured_ms.len()],
                    },
                };
                (*vertex, rate)
            })
            .collect()
    }
}

/// The rates between two samples `seconds` apart (counters that went down, as after a
/// restart of the counting, count as zero).
fn rate_between(before: &VertexSample, after: &VertexSample, seconds: f64) -> VertexRate {
    let per_second = |then: u64, now: u64| now.saturating_sub(then) as f64 / seconds;
    VertexRate {
        records_per_second: per_second(before.records, after.records),
        backpressured_ms_per_second: after
            .backpressured_ms
            .iter()
            .enumerate()
            .map(|(i, now)| {
                let then = before.backpressured_ms.get(i).copied().unwrap_or(0);
                per_second(then, *now).min(1000.0)
            })
            .collect(),
    }
}

/// Flink's back-pressure level of a ratio of time back-pressured: `ok` up to 10 %, `low` up
/// to 50 %, `high` above.
pub(super) fn level(ratio: f64) -> &'static str {
    if ratio <= 0.10 {
        "ok"
    } else if ratio <= 0.5 {
        "low"
    } else {
        "high"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(records: u64, backpressured_ms: &[u64]) -> VertexSample {
        VertexSample {
            records,
            backpressured_ms: backpressured_ms.to_vec(),
        }
    }

    #[test]
    fn rates_are_the_change_over_the_window() {
        let r = rate_between(
            &sample(1_000, &[0, 100]),
            &sample(5_000, &[200, 2_100]),
            2.0,
        );
        assert_eq!(r.records_per_second, 2_000.0);
        assert_eq!(r.backpressured_ms_per_second, vec![100.0, 1000.0]);
        // A counter that went down (a new count) is no negative rate.
        let r = rate_between(&sample(5_000, &[300]), &sample(10, &[0]), 1.0);
        assert_eq!(r.records_per_second, 0.0);
        assert_eq!(r.backpressured_ms_per_second, vec![0.0]);
    }

    #[test]
    fn levels_are_flink_s() {
        assert_eq!(level(0.0), "ok");
        assert_eq!(level(0.10), "ok");
        assert_eq!(level(0.11), "low");
        assert_eq!(level(0.5), "low");
        assert_eq!(level(0.9), "high");
    }
}
