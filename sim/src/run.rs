//! One seed's run: the job built from its scenario, run on a single-threaded runtime with a
//! paused clock and the seeded simulator installed, then judged by the invariants.

use crate::check;
use crate::external::{self, External, Record};
use crate::savepoints;
use crate::scenario::{Barriers, Scenario};
use crate::simulator::SeededSimulator;
use std::rc::Rc;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;
use weir_checkpoint::CheckpointStorage;
use weir_checkpoint::storage::CheckpointLocation;
use weir_checkpoint::storage::OpendalCheckpointStorage;
use weir_checkpoint::storage::faults::{FaultInjectingStorage, OpKind, SleepFn};
use weir_core::element::SnapshotKind;
use weir_core::ids::JobId;
use weir_core::sim::{Mutation, Observed, Simulator};
use weir_core::splitmix::SplitMix;
use weir_runtime::{
    CheckpointingMode, JobClient, MemoryStoreStateBackend, RestartStrategy, StorageConfig,
    StreamEnvironment,
};

/// The root of a run's checkpoint storage, as paths name it.
pub const ROOT: &str = "memory://weir-sim";

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
    /// Task managers lost: how many crashed and how many were cut off.
    pub task_managers_lost: (u32, u32),
    /// Deployments that found too few slots within the slot timeout.
    pub no_resources: u32,
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
    let sim = Rc::new(SeededSimulator::new(scenario.clone(), mutation));
    let _installed = weir_core::sim::install(sim.clone());
    sim.note(scenario.describe());
    if let Some(m) = mutation {
        sim.note(format_args!("acting out the deliberate bug {}", m.name()));
    }
    let mut violations = Vec::new();
    let mut totals = (0, 0);
    match simulate(&sim, &scenario, &mut totals) {
        Ok(v) => violations.extend(v),
        Err(e) => violations.push(e),
    }
    for v in &violations {
        sim.note(format_args!("VIOLATION: {v}"));
    }
    let (mut task_managers_lost, mut no_resources) = ((0, 0), 0);
    for (_, event) in sim.observed() {
        match event {
            Observed::TaskManagerLost { crash: true, .. } => task_managers_lost.0 += 1,
            Observed::TaskManagerLost { crash: false, .. } => task_managers_lost.1 += 1,
            Observed::NoResources => no_resources += 1,
            _ => {}
        }
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
        restarts: totals.0,
        checkpoints: totals.1,
        task_managers_lost,
        no_resources,
    }
}

/// How one process's run of the job ended.
enum Ended {
    /// The job finished.
    Finished,
    /// It was stopped with a savepoint, at this path.
    Stopped(String),
    /// Its process was killed.
    Killed,
}

/// The runtime of one process of the run: one thread, a paused clock.
fn process_runtime() -> Result<tokio::runtime::Runtime, String> {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .map_err(|e| format!("cannot start the simulation's runtime: {e}"))
}

/// Runs the job, in one process or, after a kill or a stop with a savepoint, two (the second
/// resumes the first), and checks the invariants. `Err`: the run could not be set up.
fn simulate(
    sim: &Rc<SeededSimulator>,
    scenario: &Scenario,
    totals: &mut (u32, u64),
) -> Result<Vec<String>, String> {
    let (inner, faulty) = storage(scenario)?;
    savepoints::serve(faulty.clone());
    let mut violations = Vec::new();
    let committed = External::new();
    let mut resume: Option<Option<String>> = None;
    for process in 0..2u32 {
        let runtime = process_runtime()?;
        let env = StreamEnvironment::new();
        let job_id = scenario.job_id_of(process);
        configure(&env, scenario, faulty.clone(), job_id);
        if let Some(Some(path)) = &resume {
            env.restore_from(path);
        }
        let keys = scenario.keys;
        // Per key: a running count and a running sum of the record indices (what tells a lost
        // record from a duplicated one of the same key).
        let sums = env
            .from_generator(Some(scenario.records), move |i| (i % keys, 1i64, i as i64))
            .key_by(|t: &Record| &t.0)
            .reduce(|a, b| (a.0, a.1 + b.1, a.2 + b.2));
        external::sink(sums, &committed);
        let first = process == 0;
        let ended = runtime.block_on(async {
            sim.enter();
            let ended = drive(sim, scenario, env, first, &faulty, totals).await;
            sim.leave();
            ended
        });
        // Dropping the runtime drops every task of the process, as a kill would.
        drop(runtime);
        match ended {
            Ok(Ended::Finished) => break,
            Ok(Ended::Stopped(path)) => {
                sim.note(format_args!("resuming from the savepoint {path}"));
                resume = Some(Some(path));
            }
            Ok(Ended::Killed) => {
                // A user resumes from the newest restore point the killed job left: a complete
                // checkpoint in its directory or a savepoint it took, whichever is newer. What
                // it completed is complete, observed or not: its `_metadata` was written.
                let points =
                    process_runtime()?.block_on(restore_points(&*inner, scenario.job_id()))?;
                for (id, kind, _) in &points {
                    sim.observe(Observed::Completed(*id, *kind));
                }
                resume = Some(
                    points
                        .into_iter()
                        .max_by_key(|(id, _, _)| *id)
                        .map(|(_, _, path)| path),
                );
                sim.note(format_args!("resuming from {:?}", resume.clone().flatten()));
            }
            Err(v) => {
                violations.push(v);
                break;
            }
        }
    }
    let exactly_once = scenario.barriers != Barriers::AtLeastOnce;
    if violations.is_empty() {
        violations.extend(committed.conflicts());
        violations.extend(check::output(
            &committed.records(),
            scenario.records,
            scenario.keys,
            exactly_once,
        ));
    }
    violations.extend(check::restores(&sim.observed()));
    let retained = process_runtime()?.block_on(check::retained_checkpoints(&*inner, scenario));
    violations.extend(retained);
    Ok(violations)
}

/// Runs one process's job until it ends, is stopped with a savepoint or killed, with the
/// scenario's savepoints and storage faults on its clock. `Err`: a violation.
async fn drive(
    sim: &SeededSimulator,
    scenario: &Scenario,
    env: StreamEnvironment,
    first: bool,
    faulty: &Arc<FaultInjectingStorage>,
    totals: &mut (u32, u64),
) -> Result<Ended, String> {
    let client = JobClient::default();
    let until = |at: Duration| at.saturating_sub(sim.now());
    // Faults stop at their deadline: the storage's too.
    let calm = {
        let faulty = faulty.clone();
        let wait = until(scenario.faults_until);
        tokio::spawn(async move {
            tokio::time::sleep(wait).await;
            let _ = faulty.set_fault_rate(OpKind::Write, 0.0);
            let _ = faulty.set_fault_rate(OpKind::Read, 0.0);
        })
    };
    let mut plans = Vec::new();
    // The savepoint a stop completed with, as its caller learns it.
    let stopped: Arc<Mutex<Option<String>>> = Arc::default();
    if first {
        if let Some(at) = scenario.savepoint_at {
            let (client, wait) = (client.clone(), until(at));
            plans.push(tokio::spawn(async move {
                tokio::time::sleep(wait).await;
                let _ = client.trigger_savepoint(Some(savepoints::DIR.into())).await;
            }));
        }
        if let Some(at) = scenario.stop_at {
            let (client, wait, stopped) = (client.clone(), until(at), stopped.clone());
            plans.push(tokio::spawn(async move {
                tokio::time::sleep(wait).await;
                if let Ok(path) = client
                    .stop_with_savepoint(Some(savepoints::DIR.into()), false)
                    .await
                {
                    *stopped.lock().unwrap_or_else(PoisonError::into_inner) = Some(path);
                }
            }));
        }
    }
    let deadline = until(scenario.faults_until) + LIVENESS_BOUND;
    let kill = scenario.kill_at.filter(|_| first).map(until);
    let job = tokio::time::timeout(deadline, env.execute_with(client.clone()));
    let result = tokio::select! {
        biased;
        r = job => Some(r),
        _ = async {
            match kill {
                Some(k) => tokio::time::sleep(k).await,
                None => std::future::pending().await,
            }
        } => None,
    };
    calm.abort();
    plans.iter().for_each(|p| p.abort());
    let Some(result) = result else {
        sim.note("the process is killed");
        return Ok(Ended::Killed);
    };
    match result {
        Err(_) => {
            client.cancel();
            Err(format!(
                "liveness: the job did not finish within {LIVENESS_BOUND:?} of virtual time \
                 after faults stopped (at {:?})",
                scenario.faults_until
            ))
        }
        Ok(Err(e)) => {
            let stopped = stopped
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .clone();
            match stopped {
                // The job failed after its stop completed: as the error says, the user
                // resumes from the stop's savepoint.
                Some(path) if e.to_string().contains(&path) => {
                    sim.note(format_args!("the job failed after its stop: {e}"));
                    Ok(Ended::Stopped(path))
                }
                _ => Err(format!("the job failed: {e}")),
            }
        }
        Ok(Ok(r)) => {
            sim.note(format_args!(
                "job {:?}: {} restarts, {} checkpoints completed, {} failed",
                r.status, r.restarts, r.checkpoints_completed, r.checkpoints_failed
            ));
            totals.0 += r.restarts;
            totals.1 += r.checkpoints_completed;
            Ok(match r.savepoint {
                Some(path) => Ended::Stopped(path),
                None => Ended::Finished,
            })
        }
    }
}

/// Every complete checkpoint and savepoint of `job` in `storage`: its id, kind and path.
async fn restore_points(
    storage: &dyn CheckpointStorage,
    job: JobId,
) -> Result<Vec<(u64, SnapshotKind, String)>, String> {
    let failed = |e: weir_checkpoint::CheckpointError| format!("cannot list restore points: {e}");
    let mut points: Vec<(u64, SnapshotKind, String)> = storage
        .list_checkpoints(job)
        .await
        .map_err(failed)?
        .into_iter()
        .filter(|c| c.complete)
        .map(|c| {
            let path = storage.location_path(&c.location);
            (c.id.0, SnapshotKind::Checkpoint, path)
        })
        .collect();
    for file in storage.list_files("").await.map_err(failed)? {
        let Some(dir) = file.strip_suffix("_metadata") else {
            continue;
        };
        if !dir.starts_with("savepoint-") {
            continue;
        }
        let location = CheckpointLocation {
            dir: dir.to_string(),
        };
        let metadata = storage.read_metadata(&location).await.map_err(failed)?;
        if metadata.job_id == job {
            let path = storage.location_path(&location);
            points.push((metadata.checkpoint_id.0, metadata.kind, path));
        }
    }
    Ok(points)
}

/// The checkpoint storage: opendal's memory service, every state file a file (nothing inlined
/// into `_metadata`, so that files can go missing), under seeded write and read faults and
/// delays.
fn storage(
    scenario: &Scenario,
) -> Result<(Arc<dyn CheckpointStorage>, Arc<FaultInjectingStorage>), String> {
    let memory = OpendalCheckpointStorage::memory()
        .map_err(|e| e.to_string())?
        .operator()
        .clone();
    // A root with a name, so that a resume finds paths under it (`memory://` alone has none).
    let inner: Arc<dyn CheckpointStorage> = Arc::new(
        OpendalCheckpointStorage::from_operator(memory, ROOT.to_string()).with_inline_threshold(0),
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
fn configure(
    env: &StreamEnvironment,
    s: &Scenario,
    storage: Arc<FaultInjectingStorage>,
    job_id: JobId,
) {
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
    if s.state_backend == "memory-store" {
        env.set_state_backend(MemoryStoreStateBackend);
    }
    let mut c = env.config_mut();
    c.job_id = Some(job_id);
    c.incremental = s.incremental;
    c.checkpoint.num_retained = s.retained;
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
    /// Task managers lost over all runs: how many crashed and how many were cut off.
    pub task_managers_lost: (u64, u64),
    /// Deployments over all runs that found too few slots within the slot timeout.
    pub no_resources: u64,
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
                    r.task_managers_lost.0 += u64::from(o.task_managers_lost.0);
                    r.task_managers_lost.1 += u64::from(o.task_managers_lost.1);
                    r.no_resources += u64::from(o.no_resources);
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
