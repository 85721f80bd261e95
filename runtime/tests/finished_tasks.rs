//! Checkpoints after tasks finished (Flink's FLIP-147) end to end: checkpoints and savepoints keep completing once a bounded source or a sink subtask has finished, and restores from them are exactly once (two-phase-commit final transactions and unaligned in-flight data included).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;
use support::Bounded;

use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::marker::PhantomData;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use support::{Injector, Rule, apply_rule, color, inject};
use weir_core::element::SnapshotKind;
use weir_core::handle::OperatorStateMode;
use weir_runtime::broadcast::KeyedBroadcastProcessFunction;
use weir_runtime::keyed::{Collector, KeyedContext, KeyedStateRegistry, TimeDomain};
use weir_runtime::operator::{Chained, Lifecycle, OneInputOperator, OpResult, Output, SubtaskInfo};
use weir_runtime::sink::{Committer, FINAL_TRANSACTION, TwoPhaseCommitSink};
use weir_runtime::source::{SourceFunction, SourceStatus, splitmix64};
use weir_runtime::{
    CheckpointStats, CheckpointStatus, CollectHandle, DataStream, JobClient, JobResult, JobStatus,
    RestartStrategy, StreamEnvironment, TaskError,
};
use weir_state::{OperatorListState, OperatorStateBackend, ValueState, ValueStateDescriptor};

/// Wall-clock ms since the Unix epoch (the clock of checkpoint trigger timestamps).
fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

// ---------------------------------------------------------------------------------------------
// Test data: readings `(index, color, value)` on the main stream, rules `(color, multiplier)`
// on the broadcast stream.
// ---------------------------------------------------------------------------------------------

/// Rule `i` is for color `i % RULE_COLORS`; even, so that with two rule lanes (rule `i` in lane
/// `i % 2`) a color's rules all come from one lane, in order.
const RULE_COLORS: u64 = 12;
/// Rules: colors below `RULES - RULE_COLORS` get a second rule that overwrites (or, with
/// multiplier 0, removes) the first.
const RULES: u64 = 30;
/// Readings have this many colors; the last two never have a rule.
const MAIN_COLORS: u64 = 14;
/// The event-time timer each reading registers: it fires once both inputs ended.
const FAR: i64 = i64::MAX / 2;

type Reading = (u64, String, u64);

fn rule(i: u64) -> Rule {
    support::rule(i, RULE_COLORS)
}

fn reading(i: u64) -> Reading {
    (
        i,
        color(splitmix64(i ^ 0x636f_6c6f) % MAIN_COLORS),
        splitmix64(i.wrapping_mul(7) ^ 0x7661_6c75) % 1000,
    )
}

/// What the broadcast job emits: each reading scored with its color's final rule, and at the end
/// of event time each color's totals.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
enum Out {
    Scored {
        index: u64,
        color: String,
        score: u64,
    },
    Total {
        color: String,
        count: u64,
        sum: u64,
        rules: usize,
    },
}

/// The broadcast job's output over `readings` readings, computed without the engine; sorted.
fn expected_output(readings: u64) -> Vec<Out> {
    let mut rules = BTreeMap::new();
    for i in 0..RULES {
        apply_rule(&mut rules, rule(i));
    }
    let mut out = Vec::new();
    let mut totals: BTreeMap<String, (u64, u64)> = BTreeMap::new();
    for i in 0..readings {
        let (index, color, value) = reading(i);
        let t = totals.entry(color.clone()).or_default();
        t.0 += 1;
        t.1 += value;
        let score = value * rules.get(&color).copied().unwrap_or(1);
        out.push(Out::Scored {
            index,
            color,
            score,
        });
    }
    for (color, (count, sum)) in totals {
        out.push(Out::Total {
            color,
            count,
            sum,
            rules: rules.len(),
        });
    }
    out.sort();
    out
}

// ---------------------------------------------------------------------------------------------
// A paced, gated source with its position in operator state.
// ---------------------------------------------------------------------------------------------

type Gate = Arc<dyn Fn() -> bool + Send + Sync>;

/// Subtask `j` of `p` emits `make(j), make(j + p), …` below `count`, at most `per_batch` per
/// batch and one batch per `pause`; with a `gate`, nothing until it opens (in a fresh start:
/// a restored source does not wait, what it waited for is in the restored state). Its position is
/// operator state (the parallelism must not change across restores).
struct Lanes<T> {
    make: fn(u64) -> T,
    count: u64,
    per_batch: usize,
    pause: Duration,
    gate: Option<Gate>,
    lanes: u64,
    next: u64,
    not_before: Instant,
    state: Option<OperatorListState<u64>>,
}

impl<T> Lanes<T> {
    fn new(make: fn(u64) -> T, count: u64, per_batch: usize, pause: Duration) -> Self {
        Lanes {
            make,
            count,
            per_batch,
            pause,
            gate: None,
            lanes: 1,
            next: 0,
            not_before: Instant::now(),
            state: None,
        }
    }
}

impl<T: Send + 'static> SourceFunction<T> for Lanes<T> {
    fn open(
        &mut self,
        info: &SubtaskInfo,
        state: &mut OperatorStateBackend,
    ) -> Result<(), TaskError> {
        let list = state.list_state::<u64>("lane-position", OperatorStateMode::SplitDistribute)?;
        let restored = state.get(&list)?;
        self.lanes = u64::from(info.parallelism);
        self.next = match (info.restored, restored.as_slice()) {
            (false, []) => u64::from(info.index),
            (true, [next]) => *next,
            (restored, got) => {
                return Err(TaskError::Operator {
                    operator: "Lanes".into(),
                    message: format!("restored={restored} but lane positions {got:?}"),
                });
            }
        };
        if info.restored {
            self.gate = None;
        }
        self.state = Some(list);
        Ok(())
    }

    fn next_batch(&mut self, out: &mut Vec<T>, max: usize) -> Result<SourceStatus, TaskError> {
        if self.next >= self.count {
            return Ok(SourceStatus::End);
        }
        if self.gate.as_ref().is_some_and(|g| !g()) || Instant::now() < self.not_before {
            return Ok(SourceStatus::Idle);
        }
        while out.len() < max.min(self.per_batch) && self.next < self.count {
            out.push((self.make)(self.next));
            self.next += self.lanes;
        }
        self.not_before = Instant::now() + self.pause;
        Ok(SourceStatus::More)
    }

    fn snapshot_state(&mut self, state: &mut OperatorStateBackend) -> Result<(), TaskError> {
        if let Some(list) = &self.state {
            state.update(list, &[self.next])?;
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------------
// Watching a chain: when its input ended, which checkpoints it took after that, its records.
// ---------------------------------------------------------------------------------------------

/// What the [`WatchOp`]s of one operator saw, per `(attempt, subtask)`.
#[derive(Default)]
struct Watch {
    parallelism: u32,
    /// When the input ended (wall ms).
    ended: Mutex<BTreeMap<(u32, u32), u64>>,
    /// The checkpoints snapshotted after the input ended.
    after_end: Mutex<BTreeMap<(u32, u32), BTreeSet<u64>>>,
    /// Records passed on.
    records: Mutex<BTreeMap<(u32, u32), u64>>,
}

impl Watch {
    fn new(parallelism: u32) -> Arc<Self> {
        Arc::new(Watch {
            parallelism,
            ..Watch::default()
        })
    }

    /// When the last subtask's input ended in `attempt`, if all did.
    fn all_ended(&self, attempt: u32) -> Option<u64> {
        let ended = self.ended.lock().unwrap();
        let times: Vec<u64> = (0..self.parallelism)
            .filter_map(|s| ended.get(&(attempt, s)).copied())
            .collect();
        (times.len() == self.parallelism as usize).then(|| times.into_iter().max().unwrap_or(0))
    }

    /// The checkpoints every subtask snapshotted after its input ended, in `attempt`.
    fn after_end_in_all(&self, attempt: u32) -> BTreeSet<u64> {
        let after = self.after_end.lock().unwrap();
        let mut all: Option<BTreeSet<u64>> = None;
        for s in 0..self.parallelism {
            let ids = after.get(&(attempt, s)).cloned().unwrap_or_default();
            all = Some(match all {
                None => ids,
                Some(a) => a.intersection(&ids).copied().collect(),
            });
        }
        all.unwrap_or_default()
    }

    /// Records passed on in `attempt`, over subtasks.
    fn records_in(&self, attempt: u32) -> u64 {
        self.records
            .lock()
            .unwrap()
            .iter()
            .filter(|((a, _), _)| *a == attempt)
            .map(|(_, n)| n)
            .sum()
    }
}

/// The identity, reporting to a [`Watch`].
struct WatchOp<T> {
    watch: Arc<Watch>,
    at: (u32, u32),
    ended: bool,
    _t: PhantomData<fn(T)>,
}

impl<T: Send + 'static> OneInputOperator<T> for WatchOp<T> {
    type Out = T;

    fn process(&mut self, record: T, out: &mut dyn Output<T>) -> OpResult {
        *self
            .watch
            .records
            .lock()
            .unwrap()
            .entry(self.at)
            .or_default() += 1;
        out.push(record)
    }

    fn lifecycle(&mut self, event: &mut Lifecycle<'_>, _out: &mut dyn Output<T>) -> OpResult {
        match event {
            Lifecycle::EndInput => {
                self.ended = true;
                self.watch
                    .ended
                    .lock()
                    .unwrap()
                    .entry(self.at)
                    .or_insert_with(now_ms);
            }
            Lifecycle::Snapshot(id, _, _) if self.ended => {
                self.watch
                    .after_end
                    .lock()
                    .unwrap()
                    .entry(self.at)
                    .or_default()
                    .insert(id.0);
            }
            _ => {}
        }
        Ok(())
    }
}

fn watch<T: weir_network::Data>(stream: DataStream<T>, w: &Arc<Watch>) -> DataStream<T> {
    let w = w.clone();
    stream.transform::<T>("Watch", move |ctx, next| {
        Box::new(Chained::new(
            WatchOp {
                watch: w.clone(),
                at: (ctx.info.attempt, ctx.info.index),
                ended: false,
                _t: PhantomData,
            },
            next,
        ))
    })
}

// ---------------------------------------------------------------------------------------------
// Failure injection: once, in the first attempt, some records after the test armed it.
// ---------------------------------------------------------------------------------------------

#[derive(Default)]
struct Trip {
    armed: AtomicBool,
    /// Records seen after arming before it fails.
    after: u64,
    seen: AtomicU64,
    fired: AtomicBool,
}

impl Trip {
    fn new(after: u64) -> Arc<Self> {
        Arc::new(Trip {
            after,
            ..Trip::default()
        })
    }

    fn record(&self, attempt: u32) {
        if attempt > 0 || !self.armed.load(Ordering::SeqCst) {
            return;
        }
        let n = self.seen.fetch_add(1, Ordering::SeqCst) + 1;
        if n >= self.after && !self.fired.swap(true, Ordering::SeqCst) {
            panic!("injected failure {n} records after arming");
        }
    }
}

impl Injector for Trip {
    fn record(&self, attempt: u32) {
        Trip::record(self, attempt);
    }
}

// ---------------------------------------------------------------------------------------------
// A committer that logs every commit call, with its time.
// ---------------------------------------------------------------------------------------------

struct Commit<T> {
    subtask: u32,
    txn: u64,
    records: Vec<T>,
    at_ms: u64,
}

struct Ledger<T> {
    log: Mutex<Vec<Commit<T>>>,
}

impl<T: Clone + Ord + std::fmt::Debug + Send + 'static> Ledger<T> {
    fn new() -> Arc<Self> {
        Arc::new(Ledger {
            log: Mutex::new(Vec::new()),
        })
    }

    /// What an idempotent committer ends with: the first commit of each `(subtask, txn)`.
    fn effective(&self) -> BTreeMap<(u32, u64), Vec<T>> {
        let mut out = BTreeMap::new();
        for c in self.log.lock().unwrap().iter() {
            out.entry((c.subtask, c.txn))
                .or_insert_with(|| c.records.clone());
        }
        out
    }

    fn sorted_records(&self) -> Vec<T> {
        let mut v: Vec<T> = self.effective().into_values().flatten().collect();
        v.sort();
        v
    }

    /// Commits that repeat a `(subtask, txn)` with other, non-empty records: replayed data that
    /// an idempotent committer silently drops (or a non-idempotent one duplicates).
    fn conflicting_repeats(&self) -> Vec<String> {
        let log = self.log.lock().unwrap();
        let mut first: BTreeMap<(u32, u64), &Vec<T>> = BTreeMap::new();
        let mut bad = Vec::new();
        for c in log.iter() {
            match first.get(&(c.subtask, c.txn)) {
                None => {
                    first.insert((c.subtask, c.txn), &c.records);
                }
                Some(f) if !c.records.is_empty() && **f != c.records => bad.push(format!(
                    "subtask {} txn {}: {} records, then {} others",
                    c.subtask,
                    c.txn,
                    f.len(),
                    c.records.len()
                )),
                Some(_) => {}
            }
        }
        bad
    }

    /// Non-empty commit calls of `(subtask, txn)`, with their times.
    fn non_empty_commits(&self, subtask: u32, txn: u64) -> Vec<u64> {
        self.log
            .lock()
            .unwrap()
            .iter()
            .filter(|c| c.subtask == subtask && c.txn == txn && !c.records.is_empty())
            .map(|c| c.at_ms)
            .collect()
    }

    /// Commit calls of `(subtask, txn)`, empty ones included.
    fn commit_calls(&self, subtask: u32, txn: u64) -> usize {
        self.log
            .lock()
            .unwrap()
            .iter()
            .filter(|c| c.subtask == subtask && c.txn == txn)
            .count()
    }

    /// Records of checkpoint transactions (not the final one) committed within `from..to` ms.
    fn checkpoint_records_committed_within(&self, from: u64, to: u64) -> usize {
        self.log
            .lock()
            .unwrap()
            .iter()
            .filter(|c| c.txn != FINAL_TRANSACTION && c.at_ms > from && c.at_ms < to)
            .map(|c| c.records.len())
            .sum()
    }
}

impl<T: Send + 'static> Committer<T> for Ledger<T> {
    fn commit(&self, subtask: u32, transaction: u64, records: Vec<T>) -> Result<(), String> {
        self.log.lock().unwrap().push(Commit {
            subtask,
            txn: transaction,
            records,
            at_ms: now_ms(),
        });
        Ok(())
    }
}

fn sink<T>(stream: DataStream<T>, ledger: &Arc<Ledger<T>>, uid: &str)
where
    T: weir_network::Data + Sync,
{
    let l = ledger.clone();
    stream
        .transform::<()>("Sink", move |ctx, next| {
            Box::new(Chained::new(
                TwoPhaseCommitSink::new(ctx.operator_id, &ctx.info, l.clone()),
                next,
            ))
        })
        .uid(uid);
}

// ---------------------------------------------------------------------------------------------
// Running a job while watching its checkpoints.
// ---------------------------------------------------------------------------------------------

/// Every checkpoint seen, by id, with its last known statistics.
type Seen = BTreeMap<u64, CheckpointStats>;

fn completed(seen: &Seen) -> BTreeSet<u64> {
    seen.values()
        .filter(|s| s.status == CheckpointStatus::Completed)
        .map(|s| s.id.0)
        .collect()
}

/// Runs `env`, polling its checkpoint statistics every 2 ms (`on_tick` sees them so far);
/// returns the result, every checkpoint seen, and when the job ended (wall ms).
async fn run_watched(
    env: StreamEnvironment,
    ctx: &str,
    mut on_tick: impl FnMut(&Seen),
) -> (JobResult, Seen, u64) {
    let client = JobClient::default();
    let job = tokio::spawn(env.execute_with(client.clone()).bounded());
    let mut seen = Seen::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        for s in client.checkpoint_stats() {
            seen.insert(s.id.0, s);
        }
        on_tick(&seen);
        if job.is_finished() {
            break;
        }
        assert!(Instant::now() < deadline, "{ctx}: the job did not end");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let ended = now_ms();
    let r = job
        .await
        .unwrap()
        .unwrap_or_else(|e| panic!("{ctx}: the job failed: {e}"));
    for s in &r.checkpoint_history {
        seen.insert(s.id.0, s.clone());
    }
    (r, seen, ended)
}

/// The test's seed: `WEIR_TEST_SEED` to reproduce, else a fresh one per run.
fn test_seed() -> u64 {
    let seed = std::env::var("WEIR_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| now_ms() ^ u64::from(std::process::id()));
    eprintln!("seed={seed} (rerun with WEIR_TEST_SEED={seed})");
    seed
}

// ---------------------------------------------------------------------------------------------
// The broadcast job: a bounded rules source that finishes early, a slow main stream.
// ---------------------------------------------------------------------------------------------

/// Per color: each reading scored with the color's rule; at the end of event time, the totals.
struct Score {
    /// Broadcast records applied, over subtasks and attempts: the readings wait for all.
    applied: Arc<AtomicU64>,
    totals: Option<ValueState<(u64, u64)>>,
}

impl KeyedBroadcastProcessFunction<String, Reading, Rule, Out> for Score {
    type Key = String;
    type Value = u64;

    fn open(&mut self, states: &mut KeyedStateRegistry<'_, String>) -> Result<(), TaskError> {
        self.totals = Some(states.value_state(&ValueStateDescriptor::new("totals"))?);
        Ok(())
    }

    fn process_element(
        &mut self,
        (index, color, value): Reading,
        broadcast: &BTreeMap<String, u64>,
        ctx: &mut KeyedContext<'_, String>,
        out: &mut Collector<'_, Out>,
    ) -> Result<(), TaskError> {
        let totals = self.totals.unwrap();
        let (count, sum) = ctx.value(totals).copied().unwrap_or((0, 0));
        ctx.update(totals, (count + 1, sum + value));
        ctx.register_event_time_timer(FAR);
        let score = value * broadcast.get(&color).copied().unwrap_or(1);
        out.collect(Out::Scored {
            index,
            color,
            score,
        })
    }

    fn process_broadcast_element(
        &mut self,
        record: Rule,
        broadcast: &mut BTreeMap<String, u64>,
        _out: &mut Collector<'_, Out>,
    ) -> Result<(), TaskError> {
        apply_rule(broadcast, record);
        self.applied.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }

    fn on_timer(
        &mut self,
        timestamp: i64,
        domain: TimeDomain,
        broadcast: &BTreeMap<String, u64>,
        ctx: &mut KeyedContext<'_, String>,
        out: &mut Collector<'_, Out>,
    ) -> Result<(), TaskError> {
        if domain != TimeDomain::EventTime || timestamp != FAR {
            return Err(TaskError::Operator {
                operator: "Score".into(),
                message: format!("a {domain:?} timer fired at {timestamp}"),
            });
        }
        let (count, sum) = ctx.value(self.totals.unwrap()).copied().unwrap_or((0, 0));
        out.collect(Out::Total {
            color: ctx.current_key().clone(),
            count,
            sum,
            rules: broadcast.len(),
        })
    }
}

struct BroadcastJob<'a> {
    dir: &'a Path,
    interval: Duration,
    readings: u64,
    /// Readings per batch of a lane, and the pause between batches.
    per_batch: usize,
    pause: Duration,
    main_parallelism: u32,
    rule_parallelism: u32,
    apply_parallelism: u32,
    /// Rules per batch of a lane, and the pause between batches: the rules take a few
    /// checkpoint intervals, so that some checkpoints are pending while they finish.
    rules_per_batch: usize,
    rules_pause: Duration,
    unaligned: bool,
    trip: Option<Arc<Trip>>,
}

impl<'a> BroadcastJob<'a> {
    fn new(dir: &'a Path) -> Self {
        BroadcastJob {
            dir,
            interval: Duration::from_millis(10),
            readings: 3_000,
            per_batch: 16,
            pause: Duration::from_millis(4),
            main_parallelism: 2,
            rule_parallelism: 2,
            apply_parallelism: 2,
            rules_per_batch: 2,
            rules_pause: Duration::from_millis(5),
            unaligned: false,
            trip: None,
        }
    }
}

struct BroadcastHandles {
    ledger: Arc<Ledger<Out>>,
    /// Behind the rules source (chained to it).
    rules: Arc<Watch>,
    /// Behind the readings source (chained to it).
    readings: Arc<Watch>,
}

/// rules (bounded, quick) → watch → broadcast ──────────────────┐
/// readings (slow, waits for the rules) → watch → [inject] → key_by color ─┴→ Score → sink.
fn broadcast_job(o: &BroadcastJob<'_>) -> (StreamEnvironment, BroadcastHandles) {
    let env = StreamEnvironment::new();
    env.set_job_name("finished-tasks-broadcast")
        .set_max_parallelism(128)
        .set_checkpoint_dir(o.dir)
        .enable_checkpointing(o.interval)
        .set_restart_strategy(RestartStrategy::FixedDelay {
            attempts: 3,
            delay: Duration::from_millis(5),
        });
    if o.unaligned {
        let mut config = env.config_mut();
        config.checkpoint.unaligned = true;
        // Little buffering, so that barriers overtake data.
        config.buffers_per_channel = 1;
        config.batch_size = 8;
    }
    let applied = Arc::new(AtomicU64::new(0));
    let rules_watch = Watch::new(o.rule_parallelism);
    let readings_watch = Watch::new(o.main_parallelism);

    env.set_parallelism(o.main_parallelism);
    let need = RULES * u64::from(o.apply_parallelism);
    let (a, readings, per_batch, pause) = (applied.clone(), o.readings, o.per_batch, o.pause);
    let mut main = watch(
        env.add_source("Readings", move |_| {
            let mut s = Lanes::new(reading, readings, per_batch, pause);
            let a = a.clone();
            s.gate = Some(Arc::new(move || a.load(Ordering::SeqCst) >= need));
            Box::new(s) as Box<dyn SourceFunction<Reading>>
        })
        .uid("readings"),
        &readings_watch,
    );
    if let Some(t) = &o.trip {
        main = inject(main, t);
    }

    env.set_parallelism(o.rule_parallelism);
    let (per_batch, pause) = (o.rules_per_batch, o.rules_pause);
    let rules = watch(
        env.add_source("Rules", move |_| {
            Box::new(Lanes::new(rule, RULES, per_batch, pause)) as Box<dyn SourceFunction<Rule>>
        })
        .uid("rules"),
        &rules_watch,
    );

    let a = applied.clone();
    let scored = main
        .key_by(|r: &Reading| &r.1)
        .connect_broadcast(rules)
        .process("Score", move || Score {
            applied: a.clone(),
            totals: None,
        })
        .uid("score")
        .set_parallelism(o.apply_parallelism);
    env.set_parallelism(o.apply_parallelism);
    let ledger = Ledger::new();
    sink(scored, &ledger, "sink");
    (
        env,
        BroadcastHandles {
            ledger,
            rules: rules_watch,
            readings: readings_watch,
        },
    )
}

/// Checks a run of the broadcast job that saw checkpoints `seen`: at least `min` checkpoints
/// completed that every rules subtask took after its input ended, every subtask acknowledged
/// them; returns them.
fn completed_after_rules_finished(
    h: &BroadcastHandles,
    seen: &Seen,
    min: usize,
    ctx: &str,
) -> BTreeSet<u64> {
    let rules_end = h
        .rules
        .all_ended(0)
        .unwrap_or_else(|| panic!("{ctx}: the rules source never finished"));
    let after: BTreeSet<u64> = h
        .rules
        .after_end_in_all(0)
        .intersection(&completed(seen))
        .copied()
        .collect();
    let summary: Vec<String> = seen.values().map(|s| s.to_string()).collect();
    assert!(
        after.len() >= min,
        "{ctx}: {} checkpoints completed after the rules source finished (at {rules_end}), \
         expected at least {min}: {summary:#?}",
        after.len()
    );
    // (A checkpoint pending when a rules subtask finished is among them: triggered before, it
    // was snapshotted after.)
    for id in &after {
        let s = &seen[id];
        assert_eq!(s.num_acknowledged, s.num_subtasks, "{ctx}: {s}");
    }
    after
}

// ---------------------------------------------------------------------------------------------
// 1. Checkpoints keep completing after a source finished, and commit the sink's output.
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checkpoints_complete_and_commit_after_the_rules_source_finished() {
    let tmp = tempfile::tempdir().unwrap();
    let o = BroadcastJob::new(tmp.path());
    let (env, h) = broadcast_job(&o);
    let ctx = "aligned, no failure";
    let (r, seen, job_end) = run_watched(env, ctx, |_| {}).await;
    assert_eq!(r.status, JobStatus::Finished, "{ctx}");
    assert_eq!(r.restarts, 0, "{ctx}");

    let after = completed_after_rules_finished(&h, &seen, 3, ctx);
    let rules_end = h.rules.all_ended(0).unwrap();
    let readings_end = h
        .readings
        .all_ended(0)
        .unwrap_or_else(|| panic!("{ctx}: the readings never ended"));
    assert!(
        readings_end > rules_end + 100,
        "{ctx}: the readings ended at {readings_end}, right after the rules ({rules_end})"
    );
    // Those checkpoints committed output while the job ran: after the rules finished, before
    // the readings (and so the job) ended.
    let early = h
        .ledger
        .checkpoint_records_committed_within(rules_end, readings_end);
    assert!(
        early > 0,
        "{ctx}: nothing committed between the rules' end and the readings' end (checkpoints \
         {after:?})"
    );
    assert!(readings_end <= job_end);
    assert!(h.ledger.conflicting_repeats().is_empty(), "{ctx}");
    assert!(
        h.ledger.sorted_records() == expected_output(o.readings),
        "{ctx}: the output differs from the expected one"
    );
    eprintln!(
        "{ctx}: {} checkpoints completed, {} after the rules finished, {} before; {early} \
         records committed before the readings ended",
        r.checkpoints_completed,
        after.len(),
        completed(&seen).difference(&after).count()
    );
}

// ---------------------------------------------------------------------------------------------
// 2. Exactly once through a restore from a checkpoint taken after the rules source finished.
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restore_from_a_checkpoint_taken_after_the_rules_finished_is_exactly_once() {
    let seed = test_seed();
    let tmp = tempfile::tempdir().unwrap();
    let expected = expected_output(3_000);
    for round in 0..3u64 {
        let mut rng = splitmix64(seed.wrapping_add(round));
        let mut next = || {
            rng = splitmix64(rng);
            rng
        };
        let dir = tmp.path().join(format!("round-{round}"));
        let mut o = BroadcastJob::new(&dir);
        o.interval = Duration::from_millis(5 + next() % 11);
        o.apply_parallelism = 2 + (next() % 2) as u32;
        o.main_parallelism = 1 + (next() % 2) as u32;
        let after = 1 + next() % 300;
        let trip = Trip::new(after);
        o.trip = Some(trip.clone());
        let ctx = format!(
            "seed={seed} round={round} interval={:?} apply_parallelism={} \
             main_parallelism={} fail {after} records after arming",
            o.interval, o.apply_parallelism, o.main_parallelism
        );
        let (env, h) = broadcast_job(&o);
        // Armed once a checkpoint completed that every rules subtask took after finishing.
        let rules = h.rules.clone();
        let mut armed_by = None;
        let (r, seen, _) = run_watched(env, &ctx, |seen| {
            if armed_by.is_none()
                && let Some(id) = rules
                    .after_end_in_all(0)
                    .intersection(&completed(seen))
                    .next()
            {
                armed_by = Some(*id);
                trip.armed.store(true, Ordering::SeqCst);
            }
        })
        .await;
        let ctx = format!(
            "{ctx} armed by checkpoint {armed_by:?}, checkpoints={}",
            r.checkpoints_completed
        );
        assert_eq!(r.status, JobStatus::Finished, "{ctx}");
        assert!(trip.fired.load(Ordering::SeqCst), "{ctx}: no failure");
        assert_eq!(r.restarts, 1, "{ctx}");
        let armed = &seen[&armed_by.unwrap()];
        assert_eq!(armed.num_acknowledged, armed.num_subtasks, "{ctx}: {armed}");
        // Restored from a checkpoint where the rules source had finished: it emits nothing again,
        // and the restored broadcast state scores the rest of the readings.
        assert_eq!(h.rules.records_in(1), 0, "{ctx}: the rules were replayed");
        assert_eq!(
            h.ledger.conflicting_repeats(),
            Vec::<String>::new(),
            "{ctx}"
        );
        let got = h.ledger.sorted_records();
        if got != expected {
            let g: BTreeSet<_> = got.iter().collect();
            let e: BTreeSet<_> = expected.iter().collect();
            let missing: Vec<_> = e.difference(&g).take(3).collect();
            let extra: Vec<_> = g.difference(&e).take(3).collect();
            panic!(
                "{ctx}: {} records, expected {}; missing (first 3) {missing:?}, unexpected \
                 {extra:?}",
                got.len(),
                expected.len()
            );
        }
        eprintln!("{ctx}: ok");
    }
}

// ---------------------------------------------------------------------------------------------
// 3. A sink that finished long before another branch fails: its final transaction is committed
//    exactly once.
// ---------------------------------------------------------------------------------------------

const SHORT: u64 = 400;
const LONG: u64 = 1_500;
const GENERATED: u64 = 300;

struct TwoBranches {
    short: Arc<Ledger<u64>>,
    long: Arc<Ledger<u64>>,
    /// In front of the short branch's sink (chained to it).
    short_sink: Arc<Watch>,
    /// Behind the short source.
    short_source: Arc<Watch>,
    /// The third branch: the built-in generator into the built-in collect sink.
    generated: CollectHandle<u64>,
}

/// short: source (2) → watch → rebalance → watch → sink (2);
/// long: source (1, slow) → inject → sink (1);
/// generated: generator (2) → rebalance → collect (2). Independent pipelines in one job.
fn two_branch_job(dir: &Path, trip: &Arc<Trip>) -> (StreamEnvironment, TwoBranches) {
    let env = StreamEnvironment::new();
    env.set_job_name("finished-tasks-two-branches")
        .set_checkpoint_dir(dir)
        .enable_checkpointing(Duration::from_millis(10))
        .set_restart_strategy(RestartStrategy::FixedDelay {
            attempts: 3,
            delay: Duration::from_millis(5),
        });
    let short_sink = Watch::new(2);
    let short_source = Watch::new(2);
    env.set_parallelism(2);
    let short = watch(
        env.add_source("Short", |_| {
            Box::new(Lanes::new(|i| i, SHORT, 10, Duration::from_millis(2)))
                as Box<dyn SourceFunction<u64>>
        })
        .uid("short-source"),
        &short_source,
    )
    .rebalance();
    let short = watch(short, &short_sink).uid("short-watch");
    let short_ledger = Ledger::new();
    sink(short, &short_ledger, "short-sink");

    env.set_parallelism(1);
    let long = inject(
        env.add_source("Long", |_| {
            Box::new(Lanes::new(|i| i, LONG, 8, Duration::from_millis(3)))
                as Box<dyn SourceFunction<u64>>
        })
        .uid("long-source"),
        trip,
    );
    env.set_parallelism(2);
    let generated = env
        .from_generator(Some(GENERATED), |i| i)
        .uid("generator")
        .rebalance()
        .collect();
    env.set_parallelism(1);
    let long_ledger = Ledger::new();
    sink(long, &long_ledger, "long-sink");
    (
        env,
        TwoBranches {
            short: short_ledger,
            long: long_ledger,
            short_sink,
            short_source,
            generated,
        },
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_finished_sinks_final_transaction_is_committed_once_after_a_restore() {
    let seed = test_seed();
    let tmp = tempfile::tempdir().unwrap();
    let mut checked = 0;
    for round in 0..6u64 {
        let after = 1 + splitmix64(seed.wrapping_add(round)) % 100;
        let trip = Trip::new(after);
        let dir = tmp.path().join(format!("round-{round}"));
        let (env, b) = two_branch_job(&dir, &trip);
        let ctx = format!("seed={seed} round={round}: fail {after} records after arming");
        // Armed once a checkpoint completed that every short sink subtask took after its input
        // ended.
        let watch = b.short_sink.clone();
        let mut armed_by = None;
        let (r, seen, job_end) = run_watched(env, &ctx, |seen| {
            if armed_by.is_none()
                && let Some(id) = watch
                    .after_end_in_all(0)
                    .intersection(&completed(seen))
                    .next()
            {
                armed_by = Some(*id);
                trip.armed.store(true, Ordering::SeqCst);
            }
        })
        .await;
        let ctx = format!(
            "{ctx}, armed by checkpoint {armed_by:?}, checkpoints={}",
            r.checkpoints_completed
        );
        assert_eq!(r.status, JobStatus::Finished, "{ctx}");
        assert!(trip.fired.load(Ordering::SeqCst), "{ctx}: no failure");
        assert_eq!(r.restarts, 1, "{ctx}");
        let armed_by = armed_by.unwrap();
        assert_eq!(
            seen[&armed_by].num_acknowledged, seen[&armed_by].num_subtasks,
            "{ctx}"
        );

        // No loss, no duplicate, in either branch.
        assert_eq!(b.short.conflicting_repeats(), Vec::<String>::new(), "{ctx}");
        assert_eq!(b.long.conflicting_repeats(), Vec::<String>::new(), "{ctx}");
        assert!(
            b.short.sorted_records() == (0..SHORT).collect::<Vec<u64>>(),
            "{ctx}: the short branch committed {} records, expected {SHORT}",
            b.short.sorted_records().len()
        );
        let mut generated = b.generated.records();
        generated.sort_unstable();
        assert!(
            generated == (0..GENERATED).collect::<Vec<u64>>(),
            "{ctx}: the generator branch committed {} records, expected {GENERATED}",
            generated.len()
        );
        assert!(
            b.long.sorted_records() == (0..LONG).collect::<Vec<u64>>(),
            "{ctx}: the long branch committed {} records, expected {LONG}",
            b.long.sorted_records().len()
        );
        // The short branch restored at its end: nothing replayed into it.
        assert_eq!(
            b.short_source.records_in(1),
            0,
            "{ctx}: short source replayed"
        );
        assert_eq!(
            b.short_sink.records_in(1),
            0,
            "{ctx}: short sink got records again"
        );

        // Each short sink subtask's final transaction: committed by the restore (it was in the
        // restored checkpoint), before the job ended, and only once with records.
        let finals: Vec<Vec<u64>> = (0..2)
            .map(|s| b.short.non_empty_commits(s, FINAL_TRANSACTION))
            .collect();
        let final_records: usize = b
            .short
            .effective()
            .iter()
            .filter(|((_, t), _)| *t == FINAL_TRANSACTION)
            .map(|(_, v)| v.len())
            .sum();
        for (s, times) in finals.iter().enumerate() {
            assert!(
                times.len() <= 1,
                "{ctx}: subtask {s}'s final transaction committed {} times with records",
                times.len()
            );
            if let Some(&at) = times.first() {
                assert!(
                    at < job_end,
                    "{ctx}: subtask {s}'s final transaction committed only at the job's end"
                );
                let restored_at = b.short_sink.all_ended(1).unwrap_or(u64::MAX);
                assert!(
                    at <= restored_at,
                    "{ctx}: subtask {s}'s final transaction committed at {at}, after the \
                     restored attempt's input ended ({restored_at}): not by the restore"
                );
            }
        }
        if final_records == 0 {
            eprintln!("{ctx}: the final transactions were empty; again");
            continue;
        }
        let final_calls: Vec<usize> = (0..2)
            .map(|s| b.short.commit_calls(s, FINAL_TRANSACTION))
            .collect();
        eprintln!(
            "{ctx}: ok, {final_records} records in the final transactions; final commit calls \
             per subtask {final_calls:?}"
        );
        checked += 1;
        if checked == 2 {
            return;
        }
    }
    assert!(
        checked > 0,
        "seed={seed}: no run had a non-empty final transaction"
    );
}

// ---------------------------------------------------------------------------------------------
// 4. Unaligned checkpoints with a finished subtask.
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unaligned_checkpoints_complete_after_the_rules_source_finished() {
    let tmp = tempfile::tempdir().unwrap();
    let mut o = BroadcastJob::new(tmp.path());
    o.unaligned = true;
    // Small, frequent batches: with one buffer per channel, barriers overtake queued data.
    o.per_batch = 4;
    o.pause = Duration::from_millis(1);
    o.readings = 2_000;
    let (env, h) = broadcast_job(&o);
    let ctx = "unaligned, no failure";
    let (r, seen, _) = run_watched(env, ctx, |_| {}).await;
    assert_eq!(r.status, JobStatus::Finished, "{ctx}");
    assert_eq!(r.restarts, 0, "{ctx}");
    let after = completed_after_rules_finished(&h, &seen, 3, ctx);
    let in_flight: u64 = after.iter().map(|id| seen[id].in_flight_size).sum();
    assert!(h.ledger.conflicting_repeats().is_empty(), "{ctx}");
    assert!(
        h.ledger.sorted_records() == expected_output(o.readings),
        "{ctx}: the output differs from the expected one"
    );
    eprintln!(
        "{ctx}: {} checkpoints completed, {} after the rules finished ({in_flight} bytes in \
         flight in those)",
        r.checkpoints_completed,
        after.len()
    );
}

// ---------------------------------------------------------------------------------------------
// 5. Unaligned: the data in flight from a source that finished is restored exactly once.
// ---------------------------------------------------------------------------------------------

/// Rules of the in-flight test.
const SLOW_RULES: u64 = 40;
/// Readings of the in-flight test.
const FAST_READINGS: u64 = 1_000;

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
enum Event {
    Rule(u64),
    Main(u64),
}

/// Emits every record it sees; each broadcast record takes `spin` (busy), so that the rules
/// queue up in their channels.
struct SlowRules {
    spin: Duration,
    /// Broadcast records processed, over subtasks and attempts.
    processed: Arc<AtomicU64>,
}

impl weir_runtime::broadcast::BroadcastProcessFunction<u64, u64, Event> for SlowRules {
    type Key = u64;
    type Value = u64;

    fn process_element(
        &mut self,
        record: u64,
        _broadcast: &BTreeMap<u64, u64>,
        out: &mut Collector<'_, Event>,
    ) -> Result<(), TaskError> {
        out.collect(Event::Main(record))
    }

    fn process_broadcast_element(
        &mut self,
        record: u64,
        broadcast: &mut BTreeMap<u64, u64>,
        out: &mut Collector<'_, Event>,
    ) -> Result<(), TaskError> {
        let t0 = Instant::now();
        while t0.elapsed() < self.spin {
            std::hint::spin_loop();
        }
        broadcast.insert(record, record);
        self.processed.fetch_add(1, Ordering::SeqCst);
        out.collect(Event::Rule(record))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unaligned_in_flight_data_of_a_finished_source_is_restored_exactly_once() {
    const P: u32 = 2;
    let seed = test_seed();
    let tmp = tempfile::tempdir().unwrap();
    for round in 0..5u64 {
        let dir = tmp.path().join(format!("round-{round}"));
        let env = StreamEnvironment::new();
        env.set_job_name("finished-tasks-in-flight")
            .set_checkpoint_dir(&dir)
            // Long enough that the failure comes before the checkpoint after the armed one.
            .enable_checkpointing(Duration::from_millis(15 + splitmix64(seed ^ round) % 10))
            .set_restart_strategy(RestartStrategy::FixedDelay {
                attempts: 3,
                delay: Duration::from_millis(5),
            });
        {
            let mut config = env.config_mut();
            config.checkpoint.unaligned = true;
            // Room for several batches of rules in flight after their source finished (it
            // finishes once its end of input is in the channel).
            config.buffers_per_channel = 8;
            config.batch_size = 4;
        }
        let rules_watch = Watch::new(1);
        let trip = Trip::new(1);
        env.set_parallelism(1);
        let rules = watch(
            env.add_source("Rules", |_| {
                Box::new(Lanes::new(|i| i, SLOW_RULES, 4, Duration::ZERO))
                    as Box<dyn SourceFunction<u64>>
            })
            .uid("rules"),
            &rules_watch,
        );
        let main = inject(
            env.add_source("Readings", |_| {
                Box::new(Lanes::new(
                    |i| 1_000 + i,
                    FAST_READINGS,
                    8,
                    Duration::from_millis(2),
                )) as Box<dyn SourceFunction<u64>>
            })
            .uid("readings"),
            &trip,
        );
        let processed = Arc::new(AtomicU64::new(0));
        let p = processed.clone();
        let events = main
            .connect_broadcast(rules)
            .process("SlowRules", move || SlowRules {
                spin: Duration::from_millis(3),
                processed: p.clone(),
            })
            .uid("slow-rules")
            .set_parallelism(P);
        env.set_parallelism(P);
        let ledger = Ledger::new();
        sink(events, &ledger, "sink");

        // Armed once a checkpoint with in-flight data completed that the rules source took after
        // it finished.
        let ctx = format!("seed={seed} round={round}");
        let w = rules_watch.clone();
        let mut armed_by = None;
        let (r, _, _) = run_watched(env, &ctx, |seen| {
            if armed_by.is_none()
                && let Some(id) = w
                    .after_end_in_all(0)
                    .intersection(&completed(seen))
                    .find(|id| seen[id].in_flight_size > 0)
            {
                armed_by = Some(*id);
                trip.armed.store(true, Ordering::SeqCst);
            }
        })
        .await;
        let ctx = format!(
            "{ctx}: armed by checkpoint {armed_by:?}, checkpoints={}",
            r.checkpoints_completed
        );
        assert_eq!(r.status, JobStatus::Finished, "{ctx}");
        assert_eq!(ledger.conflicting_repeats(), Vec::<String>::new(), "{ctx}");
        // Every subtask saw every rule exactly once; every reading once in all.
        let mut mains = Vec::new();
        for s in 0..P {
            let mut rules_seen = Vec::new();
            for ((sub, _), records) in ledger.effective() {
                if sub != s {
                    continue;
                }
                for e in records {
                    match e {
                        Event::Rule(k) => rules_seen.push(k),
                        Event::Main(i) => mains.push(i),
                    }
                }
            }
            rules_seen.sort_unstable();
            assert_eq!(
                rules_seen,
                (0..SLOW_RULES).collect::<Vec<u64>>(),
                "{ctx}: subtask {s}"
            );
        }
        mains.sort_unstable();
        assert!(
            mains == (1_000..1_000 + FAST_READINGS).collect::<Vec<u64>>(),
            "{ctx}: {} readings committed, expected {FAST_READINGS}",
            mains.len()
        );
        if armed_by.is_none() {
            assert!(!trip.fired.load(Ordering::SeqCst));
            eprintln!("{ctx}: no checkpoint with in-flight data after the rules finished; again");
            continue;
        }
        assert!(trip.fired.load(Ordering::SeqCst), "{ctx}: no failure");
        assert_eq!(r.restarts, 1, "{ctx}");
        assert_eq!(
            rules_watch.records_in(1),
            0,
            "{ctx}: the rules were replayed"
        );
        // Rules processed in the failed attempt after the checkpoint, then again from the
        // restored in-flight data.
        let again = processed.load(Ordering::SeqCst) - SLOW_RULES * u64::from(P);
        eprintln!("{ctx}: ok, {again} rules processed again from in-flight data");
        if again > 0 {
            return;
        }
    }
    panic!("seed={seed}: no round restored rules from in-flight data");
}

// ---------------------------------------------------------------------------------------------
// 6. A savepoint taken after the rules finished: the resumed job completes the output exactly.
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_savepoint_after_the_rules_finished_resumes_exactly_once() {
    let tmp = tempfile::tempdir().unwrap();
    let first_dir = tmp.path().join("first");
    let o = BroadcastJob::new(&first_dir);
    let (env, first) = broadcast_job(&o);
    env.set_savepoint_dir(tmp.path().join("savepoints"));
    let client = JobClient::default();
    let job = tokio::spawn(env.execute_with(client.clone()).bounded());
    // Once a checkpoint completed that every rules subtask took after finishing: stop.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let done: BTreeSet<u64> = client
            .checkpoint_stats()
            .iter()
            .filter(|s| s.status == CheckpointStatus::Completed)
            .map(|s| s.id.0)
            .collect();
        if first
            .rules
            .after_end_in_all(0)
            .intersection(&done)
            .next()
            .is_some()
        {
            break;
        }
        assert!(
            !job.is_finished(),
            "the job ended before a checkpoint after the rules"
        );
        assert!(
            Instant::now() < deadline,
            "no checkpoint after the rules finished"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let savepoint = loop {
        match client.stop_with_savepoint(None, false).await {
            Ok(path) => break path,
            Err(e) => {
                assert!(Instant::now() < deadline, "stop with savepoint: {e}");
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
    };
    let r = job.await.unwrap().unwrap();
    assert_eq!(r.status, JobStatus::Finished);
    let first_stats = r.checkpoint_history.clone();
    let emitted = first.readings.records_in(0);
    assert!(
        emitted < o.readings,
        "the readings ended before the savepoint"
    );
    // Nothing after the savepoint's barrier: the first job's final transactions are empty.
    let firsts = first.ledger.effective();
    assert!(
        firsts
            .iter()
            .all(|((_, txn), v)| *txn != FINAL_TRANSACTION || v.is_empty()),
        "records after a stop-with-savepoint"
    );

    // Resumed: the rules source is at its end, the broadcast state restored.
    let savepoint = savepoint
        .strip_prefix("file://")
        .unwrap_or(&savepoint)
        .to_string();
    let second_dir = tmp.path().join("second");
    let o2 = BroadcastJob::new(&second_dir);
    let (env, second) = broadcast_job(&o2);
    env.restore_from(&savepoint)
        .set_restart_strategy(RestartStrategy::NoRestart);
    let r = env
        .execute()
        .bounded()
        .await
        .unwrap_or_else(|e| panic!("resumed: {e}"));
    assert_eq!(r.status, JobStatus::Finished);
    assert!(
        r.restored_from.unwrap_or_default().contains("savepoint"),
        "not restored from the savepoint"
    );
    assert_eq!(second.rules.records_in(0), 0, "the rules were replayed");
    assert_eq!(second.readings.records_in(0), o.readings - emitted);

    // Both jobs' commits, as a committer for which an empty transaction writes nothing (the
    // file sink) keeps them: the resumed job commits the savepoint's transactions again, with
    // the same records. (An empty transaction of the first job may share its id with one of the
    // second: see the ignored test below.)
    let mut all = firsts;
    for (key, records) in second.ledger.effective() {
        match all.get(&key) {
            Some(v) if v.is_empty() => {
                all.insert(key, records);
            }
            Some(v) => assert!(
                *v == records,
                "transaction {key:?} committed by both jobs, differently: {} records {:?} by \
                 the first, {} records {:?} by the second (savepoint {savepoint}, first \
                 job's checkpoints {:?})",
                v.len(),
                v.iter().take(3).collect::<Vec<_>>(),
                records.len(),
                records.iter().take(3).collect::<Vec<_>>(),
                first_stats
                    .iter()
                    .map(|s| format!("{} {:?} {:?}", s.id, s.kind, s.status))
                    .collect::<Vec<_>>()
            ),
            None => {
                all.insert(key, records);
            }
        }
    }
    let mut got: Vec<Out> = all.into_values().flatten().collect();
    got.sort();
    assert!(
        got == expected_output(o.readings),
        "{} records, expected {}",
        got.len(),
        expected_output(o.readings).len()
    );
}

/// Delays the end of input of one subtask, so that the others finish first.
struct SlowEnd {
    delay: Option<Duration>,
}

impl OneInputOperator<u64> for SlowEnd {
    type Out = u64;

    fn process(&mut self, record: u64, out: &mut dyn Output<u64>) -> OpResult {
        out.push(record)
    }

    fn lifecycle(&mut self, event: &mut Lifecycle<'_>, _out: &mut dyn Output<u64>) -> OpResult {
        if let (Lifecycle::EndInput, Some(d)) = (event, self.delay) {
            std::thread::sleep(d);
        }
        Ok(())
    }
}

/// source (2) → rebalance → SlowEnd (subtask 1 ends 150 ms late) → sink (2), committing into
/// `ledger`.
fn slow_end_job(dir: &Path, savepoints: &Path, ledger: &Arc<Ledger<u64>>) -> StreamEnvironment {
    let env = StreamEnvironment::new();
    env.set_job_name("finished-tasks-savepoint-ids")
        .set_parallelism(2)
        .set_checkpoint_dir(dir)
        .set_savepoint_dir(savepoints)
        .enable_checkpointing(Duration::from_millis(10))
        .set_restart_strategy(RestartStrategy::NoRestart);
    let stream = env
        .add_source("Source", |_| {
            Box::new(Lanes::new(|i| i, 4_000, 8, Duration::from_millis(2)))
                as Box<dyn SourceFunction<u64>>
        })
        .uid("source")
        .rebalance()
        .transform::<u64>("SlowEnd", |ctx, next| {
            let delay = (ctx.info.index == 1).then_some(Duration::from_millis(150));
            Box::new(Chained::new(SlowEnd { delay }, next))
        })
        .uid("slow-end");
    sink(stream, ledger, "sink");
    env
}

/// A stop-with-savepoint `N`, then a job resumed from it, both committing to one idempotent
/// committer (as an external system outlives a job). The resumed job numbers its checkpoints,
/// and so its transactions, from `N + 1`; the stopped job must not have committed a
/// transaction under such an id.
///
/// A periodic checkpoint `N + 1` after the savepoint would be snapshotted by the subtasks that
/// finished (FLIP-147) and its transaction committed at the job's end; the coordinator starts no
/// checkpoint while the job stops with a savepoint, as Flink stops its scheduler.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_job_commits_no_transaction_id_that_the_resumed_job_reuses() {
    let tmp = tempfile::tempdir().unwrap();
    let savepoints = tmp.path().join("savepoints");
    let ledger = Ledger::new();
    let env = slow_end_job(&tmp.path().join("first"), &savepoints, &ledger);
    let client = JobClient::default();
    let job = tokio::spawn(env.execute_with(client.clone()).bounded());
    let deadline = Instant::now() + Duration::from_secs(30);
    while completed(
        &client
            .checkpoint_stats()
            .into_iter()
            .map(|s| (s.id.0, s))
            .collect(),
    )
    .len()
        < 2
    {
        assert!(!job.is_finished() && Instant::now() < deadline);
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let savepoint = loop {
        match client.stop_with_savepoint(None, false).await {
            Ok(path) => break path,
            Err(e) => {
                assert!(Instant::now() < deadline, "stop with savepoint: {e}");
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
    };
    let r = job.await.unwrap().unwrap();
    assert_eq!(r.status, JobStatus::Finished);
    let history: Vec<String> = r.checkpoint_history.iter().map(|s| s.to_string()).collect();
    let savepoint_id = r
        .checkpoint_history
        .iter()
        .find(|s| s.status == CheckpointStatus::Completed && s.kind != SnapshotKind::Checkpoint)
        .map(|s| s.id.0)
        .unwrap_or_else(|| panic!("no savepoint in {history:#?}"));
    let later: Vec<(u32, u64, usize)> = ledger
        .log
        .lock()
        .unwrap()
        .iter()
        .filter(|c| c.txn != FINAL_TRANSACTION && c.txn > savepoint_id)
        .map(|c| (c.subtask, c.txn, c.records.len()))
        .collect();

    let savepoint = savepoint
        .strip_prefix("file://")
        .unwrap_or(&savepoint)
        .to_string();
    let env = slow_end_job(&tmp.path().join("second"), &savepoints, &ledger);
    env.restore_from(&savepoint);
    let r = env
        .execute()
        .bounded()
        .await
        .unwrap_or_else(|e| panic!("resumed: {e}"));
    assert_eq!(r.status, JobStatus::Finished);

    // The resumed job's transactions the committer took for repeats (final ones aside).
    let dropped: Vec<String> = ledger
        .conflicting_repeats()
        .into_iter()
        .filter(|c| !c.contains(&format!("txn {FINAL_TRANSACTION}")))
        .collect();
    assert!(
        later.is_empty() && dropped.is_empty(),
        "the stopped job (savepoint {savepoint_id}) committed transactions (subtask, id, \
         records) {later:?}, ids the resumed job reuses; repeats with other records: \
         {dropped:?}; the first job's snapshots: {history:#?}"
    );
}

/// A bounded job with checkpointing ends with a final checkpoint of every task's final state,
/// and its two-phase-commit sink commits what it held for the end only after it: with an
/// interval of an hour, the one checkpoint of the run is the final one, and everything is
/// committed. (The deterministic simulation found that committing at the end without one let a
/// process killed before the job ended resume from an older checkpoint and commit the end twice,
/// seed 230.) Without checkpointing, the job ends as soon as its tasks finished.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bounded_job_ends_with_a_final_checkpoint_before_its_sinks_commit() {
    for checkpointing in [true, false] {
        let env = StreamEnvironment::new();
        env.set_parallelism(2)
            .set_checkpoint_storage(weir_runtime::StorageConfig::Memory);
        if checkpointing {
            env.enable_checkpointing(Duration::from_secs(3600));
        }
        let committed = env
            .from_generator(Some(1_000), |i| (i % 3, 1i64))
            .key_by(|t: &(u64, i64)| &t.0)
            .sum()
            .collect();
        let r = env.execute().bounded().await.unwrap();
        assert_eq!(r.status, JobStatus::Finished);
        assert_eq!(r.checkpoints_completed, u64::from(checkpointing), "{r:?}");
        let records = committed.records();
        assert_eq!(records.len(), 1_000);
        for k in 0..3u64 {
            let n = 1_000 / 3 + u64::from(k < 1_000 % 3);
            let sums: Vec<i64> = records.iter().filter(|r| r.0 == k).map(|r| r.1).collect();
            assert_eq!(sums, (1..=n as i64).collect::<Vec<_>>(), "key {k}");
        }
    }
}

/// Counts the job's ends it sees, and takes `delay` over its own (a sink whose final commit is
/// slow).
struct SlowFinalCommit {
    delay: Option<Duration>,
    ends: Arc<AtomicU64>,
}

impl OneInputOperator<u64> for SlowFinalCommit {
    type Out = u64;

    fn process(&mut self, record: u64, out: &mut dyn Output<u64>) -> OpResult {
        out.push(record)
    }

    fn lifecycle(&mut self, event: &mut Lifecycle<'_>, _out: &mut dyn Output<u64>) -> OpResult {
        if let Lifecycle::JobFinished = event {
            self.ends.fetch_add(1, Ordering::SeqCst);
            if let Some(d) = self.delay {
                std::thread::sleep(d);
            }
        }
        Ok(())
    }
}

/// A final commit slower than the job master's wait for the end is abandoned with a warning:
/// the job finishes, once. (Failing over to the final checkpoint would start the same slow
/// commit again, in a loop; only a subtask killed, failed or lost before its final commit
/// makes a finished job fail over.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_final_commit_slower_than_the_wait_finishes_the_job_once() {
    let tmp = tempfile::tempdir().unwrap();
    let ends = Arc::new(AtomicU64::new(0));
    let env = StreamEnvironment::new();
    env.set_job_name("slow-final-commit")
        .set_parallelism(2)
        .set_checkpoint_dir(tmp.path())
        .enable_checkpointing(Duration::from_millis(50))
        .set_restart_strategy(RestartStrategy::FixedDelay {
            attempts: 3,
            delay: Duration::ZERO,
        });
    let counted = ends.clone();
    env.from_collection((0..1_000u64).collect())
        .rebalance()
        .transform::<u64>("SlowFinalCommit", move |ctx, next| {
            // Longer than the teardown's 10 s wait, on one subtask.
            let delay = (ctx.info.index == 0).then_some(Duration::from_secs(11));
            Box::new(Chained::new(
                SlowFinalCommit {
                    delay,
                    ends: counted.clone(),
                },
                next,
            ))
        })
        .uid("slow-final-commit");
    let started = Instant::now();
    let r = env.execute().bounded().await.unwrap();
    assert_eq!(r.status, JobStatus::Finished);
    assert_eq!(r.restarts, 0, "the job failed over at its end");
    assert!(r.checkpoints_completed >= 1, "{r:?}");
    assert!(
        started.elapsed() >= Duration::from_secs(10),
        "the end was not waited for"
    );
    assert_eq!(
        ends.load(Ordering::SeqCst),
        2,
        "each subtask sees the job's end once"
    );
}
