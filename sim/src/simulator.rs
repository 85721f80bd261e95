//! The seeded simulator: every decision a run's hooks ask for (failures, lost and late
//! messages, pauses) drawn from one generator in the order they are asked, the virtual wall
//! clock, the trace, and a digest of every decision that tells two schedules apart.

use crate::scenario::Scenario;
use std::cell::{Cell, RefCell};
use std::time::Duration;
use tokio::time::Instant;
use weir_core::sim::{
    Delivery, FaultPoint, Message, Mutation, Observed, SimulatedCluster, Simulator, TaskManagerLoss,
};
use weir_core::splitmix::{SplitMix, mix64, splitmix64};

/// The virtual wall clock starts here (2026-09-21, a fixed instant: a replay sees the same
/// barrier timestamps).
const EPOCH_START: Duration = Duration::from_secs(1_790_000_000);

/// A run's simulator.
pub struct SeededSimulator {
    scenario: Scenario,
    rng: RefCell<SplitMix>,
    /// When the current runtime's clock started, while one runs.
    start: Cell<Option<Instant>>,
    /// Virtual time of the runtimes before the current one (a killed process's).
    offset: Cell<Duration>,
    mutation: Option<Mutation>,
    failures: Cell<u32>,
    /// Task manager losses decided so far (a loss armed for a deployment that is stopped
    /// first does not happen, but counts towards the scenario's most).
    losses: Cell<u32>,
    trace: RefCell<Vec<String>>,
    digest: Cell<u64>,
    decisions: Cell<u64>,
    observed: RefCell<Vec<(Duration, Observed)>>,
    /// Whether every decision goes into the trace (`WEIR_SIM_DECISIONS=1`), to find where two
    /// replays part.
    verbose: bool,
}

impl SeededSimulator {
    /// A simulator for `scenario`; its clock runs while a runtime is entered.
    pub fn new(scenario: Scenario, mutation: Option<Mutation>) -> SeededSimulator {
        SeededSimulator {
            rng: RefCell::new(SplitMix(splitmix64(scenario.seed))),
            scenario,
            start: Cell::new(None),
            offset: Cell::new(Duration::ZERO),
            mutation,
            failures: Cell::new(0),
            losses: Cell::new(0),
            trace: RefCell::new(Vec::new()),
            digest: Cell::new(0),
            decisions: Cell::new(0),
            observed: RefCell::new(Vec::new()),
            verbose: std::env::var_os("WEIR_SIM_DECISIONS").is_some_and(|v| v == "1"),
        }
    }

    /// The run's seed.
    pub fn seed(&self) -> u64 {
        self.scenario.seed
    }

    /// Virtual time since the run started, over every runtime (process) it used.
    pub fn now(&self) -> Duration {
        let current = self.start.get().map_or(Duration::ZERO, |s| {
            Instant::now().saturating_duration_since(s)
        });
        self.offset.get() + current
    }

    /// A runtime (a process of the run) starts: its paused clock goes on from the last one's
    /// end. Call it inside the runtime.
    pub fn enter(&self) {
        self.start.set(Some(Instant::now()));
    }

    /// The runtime ends (or its process is killed). Call it inside the runtime.
    pub fn leave(&self) {
        self.offset.set(self.now());
        self.start.set(None);
    }

    /// Whether faults may still be injected.
    pub fn faulty(&self) -> bool {
        self.now() < self.scenario.faults_until
    }

    /// The trace so far.
    pub fn trace(&self) -> Vec<String> {
        self.trace.borrow().clone()
    }

    /// The digest of every decision so far, with its virtual time and its task: equal for two
    /// runs exactly when they made the same decisions at the same moments.
    pub fn digest(&self) -> u64 {
        self.digest.get()
    }

    /// Decisions taken so far.
    pub fn decisions(&self) -> u64 {
        self.decisions.get()
    }

    /// Task failures injected so far.
    pub fn failures(&self) -> u32 {
        self.failures.get()
    }

    /// What the job master reported, with when.
    pub fn observed(&self) -> Vec<(Duration, Observed)> {
        self.observed.borrow().clone()
    }

    /// Adds a line to the trace, stamped with the virtual time.
    pub fn note(&self, line: impl std::fmt::Display) {
        let now = self.now();
        self.trace
            .borrow_mut()
            .push(format!("{:>9.3} ms  {line}", now.as_secs_f64() * 1e3));
    }

    /// A number in `0..n` from the run's generator.
    fn draw(&self, n: u64) -> u64 {
        self.rng.borrow_mut().below(n)
    }

    /// Folds one decision into the digest.
    fn decided(&self, what: u64, task: &str, answer: u64) {
        let mut h = self.digest.get() ^ what;
        h = mix64(h ^ self.now().as_nanos() as u64);
        for b in task.bytes() {
            h = (h ^ u64::from(b)).wrapping_mul(0x100_0000_01B3);
        }
        self.digest.set(mix64(h ^ answer));
        self.decisions.set(self.decisions.get() + 1);
        if self.verbose {
            self.note(format_args!("decision {what} for {task}: {answer}"));
        }
    }
}

impl Simulator for SeededSimulator {
    fn wall_clock(&self) -> Duration {
        EPOCH_START + self.now()
    }

    fn fail_at(&self, point: FaultPoint, task: &str) -> bool {
        let s = &self.scenario;
        let (chance, out_of) = match point {
            FaultPoint::Records => (s.record_failure, 100_000),
            _ => (s.step_failure, 1_000),
        };
        let fails =
            self.faulty() && self.failures.get() < s.max_failures && self.draw(out_of) < chance;
        if fails {
            self.failures.set(self.failures.get() + 1);
        }
        self.decided(1 + point as u64, task, u64::from(fails));
        fails
    }

    fn deliver(&self, message: Message, task: &str) -> Delivery {
        let s = &self.scenario;
        let delivery = if !self.faulty() {
            Delivery::Now
        } else {
            let roll = self.draw(1_000);
            if roll < s.message_loss {
                Delivery::Lost
            } else if roll < s.message_loss + s.message_delay {
                Delivery::Late(Duration::from_micros(
                    1 + self.draw(s.timeout.as_micros() as u64),
                ))
            } else {
                Delivery::Now
            }
        };
        let answer = match delivery {
            Delivery::Now => 0,
            Delivery::Lost => 1,
            Delivery::Late(by) => 2 + by.as_micros() as u64,
        };
        self.decided(16 + message as u64, task, answer);
        match delivery {
            Delivery::Now => {}
            Delivery::Lost => self.note(format_args!("{message:?} for {task} lost")),
            Delivery::Late(by) => self.note(format_args!("{message:?} for {task} late by {by:?}")),
        }
        delivery
    }

    fn pause(&self, task: &str) -> Option<Duration> {
        let s = &self.scenario;
        let pause = (self.draw(1_000) < s.pause)
            .then(|| Duration::from_micros(1 + self.draw(s.max_pause.as_micros() as u64)));
        self.decided(32, task, pause.map_or(0, |p| p.as_micros() as u64));
        pause
    }

    fn mutation(&self) -> Option<Mutation> {
        self.mutation
    }

    fn record(&self, event: std::fmt::Arguments<'_>) {
        self.note(event);
    }

    fn cluster(&self) -> Option<SimulatedCluster> {
        let s = &self.scenario;
        (!s.task_managers.is_empty()).then(|| SimulatedCluster {
            slots: s.task_managers.clone(),
            slot_timeout: s.slot_timeout,
        })
    }

    fn task_manager_loss(&self, task_manager: usize) -> Option<TaskManagerLoss> {
        let s = &self.scenario;
        let remaining = s.faults_until.saturating_sub(self.now());
        let loss = (self.faulty()
            && self.losses.get() < s.max_task_manager_losses
            && self.draw(1_000) < s.task_manager_loss)
            .then(|| TaskManagerLoss {
                // Before faults stop: after them, the job must finish.
                after: Duration::from_micros(self.draw(remaining.as_micros() as u64)),
                crash: self.draw(2) == 0,
                detected_after: Duration::from_micros(
                    1 + self.draw(s.heartbeat_timeout.as_micros() as u64),
                ),
                replaced_after: Duration::from_micros(
                    self.draw(s.max_replacement.as_micros() as u64),
                ),
            });
        let task = format!("task manager {task_manager}");
        self.decided(
            48,
            &task,
            loss.map_or(0, |l| {
                1 + l.after.as_micros() as u64 * 2 + u64::from(l.crash)
            }),
        );
        if loss.is_some() {
            self.losses.set(self.losses.get() + 1);
        }
        loss
    }

    fn observe(&self, event: Observed) {
        self.note(format_args!("{event:?}"));
        self.observed.borrow_mut().push((self.now(), event));
    }
}
