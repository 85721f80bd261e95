//! Restart strategies (Flink's `RestartStrategies`): whether and when a failed job restarts.

use std::time::Duration;

/// What to do after a task failure.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RestartStrategy {
    /// Fail the job on the first failure.
    NoRestart,
    /// Restart up to `attempts` times, waiting `delay` before each.
    FixedDelay {
        /// Restarts allowed.
        attempts: u32,
        /// Wait before each restart.
        delay: Duration,
    },
    /// Restart with a delay that doubles after each failure, from `initial` up to `max`; the
    /// delay resets after `reset_after` without failures (Flink's `exponential-delay`).
    ExponentialDelay {
        /// First delay.
        initial: Duration,
        /// Largest delay.
        max: Duration,
        /// Quiet time after which the delay starts over.
        reset_after: Duration,
        /// Restarts allowed.
        attempts: u32,
    },
}

impl RestartStrategy {
    /// Flink's default when checkpointing is on and no strategy is set: fixed delay, practically
    /// unlimited attempts.
    pub fn default_with_checkpointing() -> RestartStrategy {
        RestartStrategy::FixedDelay {
            attempts: u32::MAX,
            delay: Duration::ZERO,
        }
    }

    /// Checks that every delay is at most [`weir_core::config::MAX_DURATION`], naming the
    /// first that is not.
    pub fn validate(&self) -> Result<(), String> {
        let delays: &[(&str, Duration)] = match self {
            RestartStrategy::NoRestart => &[],
            RestartStrategy::FixedDelay { delay, .. } => &[("restart delay", *delay)],
            RestartStrategy::ExponentialDelay {
                initial,
                max,
                reset_after,
                ..
            } => &[
                ("initial restart delay", *initial),
                ("largest restart delay", *max),
                ("restart delay reset time", *reset_after),
            ],
        };
        let limit = weir_core::config::MAX_DURATION;
        match delays.iter().find(|(_, d)| *d > limit) {
            Some((what, d)) => Err(format!(
                "the {what} ({d:?}) must be at most {limit:?} (a day)"
            )),
            None => Ok(()),
        }
    }

    /// A description for messages.
    pub fn describe(&self) -> String {
        match self {
            RestartStrategy::NoRestart => "no restart".into(),
            RestartStrategy::FixedDelay { attempts, delay } => {
                format!("fixed delay: {attempts} attempts, {delay:?} apart")
            }
            RestartStrategy::ExponentialDelay {
                initial,
                max,
                attempts,
                ..
            } => format!("exponential delay: {attempts} attempts, {initial:?} doubling to {max:?}"),
        }
    }
}

/// The restart strategy's memory over a job's life: a pure decision per failure.
#[derive(Clone, Debug)]
pub struct RestartTracker {
    strategy: RestartStrategy,
    restarts: u32,
    current_delay: Duration,
    last_failure: Option<Duration>,
}

impl RestartTracker {
    /// Tracks `strategy`.
    pub fn new(strategy: RestartStrategy) -> Self {
        RestartTracker {
            strategy,
            restarts: 0,
            current_delay: Duration::ZERO,
            last_failure: None,
        }
    }

    /// Restarts so far.
    pub fn restarts(&self) -> u32 {
        self.restarts
    }

    /// A failure at `now` (monotonic): the delay before restarting, or `None` to fail the job.
    pub fn on_failure(&mut self, now: Duration) -> Option<Duration> {
        let decision = match &self.strategy {
            RestartStrategy::NoRestart => None,
            RestartStrategy::FixedDelay { attempts, delay } => {
                (self.restarts < *attempts).then_some(*delay)
            }
            RestartStrategy::ExponentialDelay {
                initial,
                max,
                reset_after,
                attempts,
            } => {
                if self.restarts >= *attempts {
                    None
                } else {
                    let quiet = self
                        .last_failure
                        .is_some_and(|l| now.saturating_sub(l) >= *reset_after);
                    self.current_delay = if self.current_delay.is_zero() || quiet {
                        *initial
                    } else {
                        (self.current_delay * 2).min(*max)
                    };
                    Some(self.current_delay)
                }
            }
        };
        self.last_failure = Some(now);
        if decision.is_some() {
            self.restarts += 1;
        }
        decision
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fixed_delay_counts_attempts() {
        let mut t = RestartTracker::new(RestartStrategy::FixedDelay {
            attempts: 2,
            delay: Duration::from_millis(5),
        });
        assert_eq!(t.on_failure(Duration::ZERO), Some(Duration::from_millis(5)));
        assert_eq!(t.on_failure(Duration::ZERO), Some(Duration::from_millis(5)));
        assert_eq!(t.on_failure(Duration::ZERO), None);
        assert_eq!(t.restarts(), 2);
        assert_eq!(
            RestartTracker::new(RestartStrategy::NoRestart).on_failure(Duration::ZERO),
            None
        );
    }

    #[test]
    fn exponential_delay_doubles_and_resets() {
        let ms = Duration::from_millis;
        let mut t = RestartTracker::new(RestartStrategy::ExponentialDelay {
            initial: ms(10),
            max: ms(35),
            reset_after: ms(1000),
            attempts: 10,
        });
        assert_eq!(t.on_failure(ms(0)), Some(ms(10)));
        assert_eq!(t.on_failure(ms(1)), Some(ms(20)));
        assert_eq!(t.on_failure(ms(2)), Some(ms(35)));
        assert_eq!(t.on_failure(ms(5000)), Some(ms(10)));
    }
}
