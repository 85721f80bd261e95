//! One seed's run: the job built from its scenario, run on a single-threaded runtime with a
//! paused clock and the seeded simulator installed, then judged by the invariants.

use crate::check;
use crate::scenario::{Barriers, Scenario};
use crate::simulator::SeededSimulator;
use std::rc::Rc;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;
use weir_checkpoint::CheckpointStorage;
use weir_checkpoint::storage::OpendalCheckpointStorage;
use weir_checkpoint::storage::faults::{FaultInjectingStorage, OpKind, SleepFn};
use weir_core::sim::Mutation;
use weir_core::splitmix::SplitMix;
use weir_runtime::{
    CheckpointingMode, JobClient, RestartStrategy, StorageConfig, StreamEnvironment,
};

/// Once faults stop, the job must finish within this much virtual time.
pub const LIVENESS_BOUND: Duration = Duration::from_secs(60);

/// What one seed's run came to.
#[derive(Debug)]
pub struct Outcome {
    /// The scenario the seed drew.
    pub scenario: Scenario,
    /// The deliberate bug it acted out, if any.
    pub mutation: Option<Mutation>,
    /// Every invariant the run broke, in words.
    pub violations: Vec<String>,
    /// The readable trace of its schedule.
    pub trace: Vec<String>,
    /// The digest of its decisions (equal across replays of the seed).
    pub digest: u64,
    /// Decisions the simulator took.
    pub decisions: u64,
    /// Virtual time the job ran.
    pub virtual_time: Duration,
    /// Task failures injected.
    pub failures: u32,
    /// Restarts the job reported.
    pub restarts: u32,
    /// Checkpoints completed.
    pub checkpoints: u64,
}

impl Outcome {
    /// Whether every invariant held.
    pub fn passed(&self) -> bool {
        self.violations.is_empty()
    }

    /// The command that replays this run.
    pub fn replay_command(&self) -> String {
        let mutation = self
            .mutation
            .map(|m| format!(" --mutation {}", m.name()))
            .unwrap_or_default();
        format!(
            "cargo xtask chaos sim --seeds 1 --first-seed {}{mutation} --trace",
            self.scenario.seed
        )
    }
}

/// Runs seed `seed`, acting out `mutation` if given.
pub fn run_seed(seed: u64, mutation: Option<Mutation>) -> Outcome {
    let scenario = Scenario::from_seed(seed);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build();
    let runtime = match runtime {
        Ok(r) => r,
        Err(e) => {
            return Outcome {
                scenario,
                mutation,
                violations: vec![format!("cannot start the simulation's runtime: {e}")],
                trace: Vec::new(),
                digest: 0,
                decisions: 0,
                virtual_time: Duration::ZERO,
                failures: 0,
                restarts: 0,
                checkpoints: 0,
            };
        }
    };
    runtime.block_on(simulate(scenario, mutation))
}

async fn simulate(scenario: Scenario, mutation: Option<Mutation>) -> Outcome {
    let sim = Rc::new(SeededSimulator::new(scenario.clone(), mutation));
    let _installed = weir_core::sim::install(sim.clone());
    sim.note(scenario.describe());
    if let Some(m) = mutation {
        sim.note(format_args!("acting out the deliberate bug {}", m.name()));
    }
    let mut violations = Vec::new();
    let (inner, faulty) = match storage(&scenario) {
        Ok(s) => s,
        Err(e) => {
            violations.push(format!("cannot build the storage: {e}"));
            return outcome(&sim, scenario, mutation, violations, 0, 0);
        }
    };
    let env = StreamEnvironment::new();
    configure(&env, &scenario, faulty.clone());
    let keys = scenario.keys;
    let committed = env
        .from_generator(Some(scenario.records), move |i| (i % keys, 1i64))
        .key_by(|t: &(u64, i64)| &t.0)
        .sum()
        .collect();
    let client = JobClient::default();
    // Faults stop at their deadline: the storage's too.
    let calm = {
        let faulty = faulty.clone();
        let until = scenario.faults_until;
        tokio::spawn(async move {
            tokio::time::sleep(until).await;
            let _ = faulty.set_fault_rate(OpKind::Write, 0.0);
            let _ = faulty.set_fault_rate(OpKind::Read, 0.0);
        })
    };
    let deadline = scenario.faults_until + LIVENESS_BOUND;
    let result = tokio::time::timeout(deadline, env.execute_with(client.clone())).await;
    calm.abort();
    let (restarts, checkpoints) = match &result {
        Ok(Ok(r)) => (r.restarts, r.checkpoints_completed),
        _ => (0, 0),
    };
    match result {
        Err(_) => {
            client.cancel();
            violations.push(format!(
                "liveness: the job did not finish within {LIVENESS_BOUND:?} of virtual time \
                 after faults stopped (at {:?})",
                scenario.faults_until
            ));
        }
        Ok(Err(e)) => violations.push(format!("the job failed: {e}")),
        Ok(Ok(r)) => {
            sim.note(format_args!(
                "job {:?}: {} restarts, {} checkpoints completed, {} failed",
                r.status, r.restarts, r.checkpoints_completed, r.checkpoints_failed
            ));
            let exactly_once = scenario.barriers != Barriers::AtLeastOnce;
            violations.extend(check::output(
                &committed.records(),
                scenario.records,
                scenario.keys,
                exactly_once,
            ));
        }
    }
    violations.extend(check::restores(&sim.observed()));
    violations.extend(check::retained_checkpoints(&*inner, &sim).await);
    outcome(&sim, scenario, mutation, violations, restarts, checkpoints)
}

fn outcome(
    sim: &SeededSimulator,
    scenario: Scenario,
    mutation: Option<Mutation>,
    violations: Vec<String>,
    restarts: u32,
    checkpoints: u64,
) -> Outcome {
    for v in &violations {
        sim.note(format_args!("VIOLATION: {v}"));
    }
    Outcome {
        scenario,
        mutation,
        violations,
        trace: sim.trace(),
        digest: sim.digest(),
        decisions: sim.decisions(),
        virtual_time: sim.now(),
        failures: sim.failures(),
        restarts,
        checkpoints,
    }
}

/// The checkpoint storage: opendal's memory service, every state file a file (nothing inlined
/// into `_metadata`, so that files can go missing), under seeded write and read faults and
/// delays.
fn storage(
    scenario: &Scenario,
) -> Result<(Arc<dyn CheckpointStorage>, Arc<FaultInjectingStorage>), String> {
    let inner: Arc<dyn CheckpointStorage> = Arc::new(
        OpendalCheckpointStorage::memory()
            .map_err(|e| e.to_string())?
            .with_inline_threshold(0),
    );
    let delays = Arc::new(Mutex::new(SplitMix(scenario.seed ^ 0xD1A7_5EED)));
    let sleep: SleepFn = Arc::new(move |max: Duration| {
        let us = delays
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .below(max.as_micros() as u64 + 1);
        Box::pin(tokio::time::sleep(Duration::from_micros(us)))
    });
    let faulty = FaultInjectingStorage::new(inner.clone(), scenario.seed)
        .with_write_faults(scenario.storage_faults.0)
        .and_then(|s| s.with_read_faults(scenario.storage_faults.1))
        .map_err(|e| e.to_string())?
        .with_delay(scenario.storage_delay, sleep);
    Ok((inner, Arc::new(faulty)))
}

/// The job's settings from the scenario.
fn configure(env: &StreamEnvironment, s: &Scenario, storage: Arc<FaultInjectingStorage>) {
    env.set_job_name("weir-sim")
        .set_parallelism(2)
        .enable_checkpointing(s.interval)
        .set_checkpointing_mode(if s.barriers == Barriers::AtLeastOnce {
            CheckpointingMode::AtLeastOnce
        } else {
            CheckpointingMode::ExactlyOnce
        })
        .set_restart_strategy(RestartStrategy::FixedDelay {
            attempts: u32::MAX,
            delay: Duration::from_millis(5),
        });
    let mut c = env.config_mut();
    c.job_id = Some(s.job_id());
    c.batch_size = s.batch_size;
    c.storage = StorageConfig::Custom(storage);
    c.checkpoint.timeout = s.timeout;
    c.checkpoint.max_concurrent = s.max_concurrent;
    c.checkpoint.tolerable_failed_checkpoints = s.tolerable_failures;
    c.checkpoint.min_pause = Duration::ZERO;
    match s.barriers {
        // Unaligned checkpoints run one at a time.
        Barriers::Unaligned | Barriers::Alternating => c.checkpoint.max_concurrent = 1,
        Barriers::Aligned | Barriers::AtLeastOnce => {}
    }
    match s.barriers {
        Barriers::Unaligned => {
            c.checkpoint.unaligned = true;
            c.checkpoint.aligned_checkpoint_timeout = Duration::ZERO;
        }
        Barriers::Alternating => {
            c.checkpoint.unaligned = true;
            c.checkpoint.aligned_checkpoint_timeout = Duration::from_millis(1);
        }
        Barriers::Aligned | Barriers::AtLeastOnce => c.checkpoint.unaligned = false,
    }
}

/// What a batch of seeds came to.
#[derive(Debug, Default)]
pub struct Report {
    /// Schedules run.
    pub runs: u64,
    /// The runs that broke an invariant, by seed.
    pub failed: Vec<Outcome>,
    /// Task failures injected over all runs.
    pub failures: u64,
    /// Restarts over all runs.
    pub restarts: u64,
    /// Checkpoints completed over all runs.
    pub checkpoints: u64,
    /// Virtual time over all runs.
    pub virtual_time: Duration,
}

/// Runs seeds `first..first + count` on `threads` threads (each run on one).
pub fn run_seeds(first: u64, count: u64, mutation: Option<Mutation>, threads: usize) -> Report {
    let next = std::sync::atomic::AtomicU64::new(first);
    let end = first.saturating_add(count);
    let report = Mutex::new(Report::default());
    std::thread::scope(|scope| {
        for _ in 0..threads.max(1) {
            scope.spawn(|| {
                loop {
                    let seed = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    if seed >= end {
                        return;
                    }
                    let o = run_seed(seed, mutation);
                    let mut r = report.lock().unwrap_or_else(PoisonError::into_inner);
                    r.runs += 1;
                    r.failures += u64::from(o.failures);
                    r.restarts += u64::from(o.restarts);
                    r.checkpoints += o.checkpoints;
                    r.virtual_time += o.virtual_time;
                    if !o.passed() {
                        r.failed.push(o);
                    }
                }
            });
        }
    });
    let mut report = report.into_inner().unwrap_or_else(PoisonError::into_inner);
    report.failed.sort_by_key(|o| o.scenario.seed);
    report
}
