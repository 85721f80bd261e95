//! The broadcast state pattern end to end: every subtask of a (keyed or plain) stream connected to a broadcast stream sees every broadcast record and ends with the same map, exactly once through failures, rescales and restores.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;
use support::{Bounded, BoundedCommand};
use weir_state::{HeapStateBackend, MemoryStoreStateBackend, StateBackend};

use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use support::{Failures, Rule, apply_rule, assert_resumed, color, inject, test_seed};
use weir_core::handle::OperatorStateMode;
use weir_core::keygroup::{assign_to_key_group, compute_key_group_range_for_operator_index};
use weir_runtime::broadcast::{
    BROADCAST_STATE, BroadcastProcessFunction, KeyedBroadcastProcessFunction,
};
use weir_runtime::keyed::{Collector, KeyedContext, KeyedStateRegistry, TimeDomain};
use weir_runtime::operator::{Chained, SubtaskInfo};
use weir_runtime::sink::{Committer, FINAL_TRANSACTION, TwoPhaseCommitSink};
use weir_runtime::source::{SourceFunction, SourceStatus, splitmix64};
use weir_runtime::{
    DataStream, JobClient, JobError, JobStatus, RestartStrategy, StreamEnvironment, TaskError,
};
use weir_state::{OperatorListState, OperatorStateBackend, ValueState, ValueStateDescriptor};

// ---------------------------------------------------------------------------------------------
// Test data: readings `(color, value)` on the main stream, rules `(color, multiplier)` on the
// broadcast stream.
// ---------------------------------------------------------------------------------------------

/// Max parallelism of every job here (fixed, so restores at any parallelism agree).
const MAX_PARALLELISM: u32 = 128;
/// Rule `i` is for color `i % RULE_COLORS`. Even, so that with one or two broadcast lanes (rule
/// `i` in lane `i % lanes`) all the rules of a color come from one lane, in index order: each
/// subtask then applies a color's rules in the same order, and the final map is deterministic
/// (Flink gives no order between broadcast producers).
const RULE_COLORS: u64 = 24;
/// Readings have these many colors; the last two have no rule ever.
const MAIN_COLORS: u64 = 26;
/// Rules in the broadcast stream: colors below `RULES - RULE_COLORS` get a second rule that
/// overwrites (or, with multiplier 0, removes) the first.
const RULES: u64 = 40;
/// Readings in the main stream.
const READINGS: u64 = 20_000;
/// The event-time timer every reading registers: only the end of event time (both sides'
/// `Watermark::MAX`) reaches it, so it fires once both inputs ended, with the final map.
const FAR: i64 = i64::MAX / 2;

type Reading = (String, u64);

/// Rule `i`: its color and multiplier, 1 to 9; every fifth of the second rules is a 0, which
/// removes the color's rule.
fn rule(i: u64) -> Rule {
    support::rule(i, RULE_COLORS)
}

/// Reading `i`: its color and value.
fn reading(i: u64) -> Reading {
    (
        color(splitmix64(i ^ 0x636f_6c6f) % MAIN_COLORS),
        splitmix64(i.wrapping_mul(7) ^ 0x7661_6c75) % 1000,
    )
}

/// The broadcast map after rules `0..n`, computed without the engine.
fn rules_after(n: u64) -> BTreeMap<String, u64> {
    let mut map = BTreeMap::new();
    for i in 0..n {
        apply_rule(&mut map, rule(i));
    }
    map
}

/// A digest of a broadcast map, to compare whole maps through the output.
fn digest(map: &BTreeMap<String, u64>) -> u64 {
    map.iter().fold(0x006d_6170_u64, |h, (k, v)| {
        let k = k
            .bytes()
            .fold(h, |h, b| splitmix64(h ^ u64::from(b)).rotate_left(5));
        splitmix64(k ^ v.wrapping_mul(0x9e37_79b9))
    })
}

// ---------------------------------------------------------------------------------------------
// Sources: lanes in index order, with a position in operator state.
// ---------------------------------------------------------------------------------------------

/// Which lanes of a source have reached their end (in any attempt), and how many records it
/// emitted (over attempts).
struct Ended {
    lanes: Vec<AtomicBool>,
    emitted: AtomicU64,
}

impl Ended {
    fn new(lanes: u32) -> Arc<Self> {
        Arc::new(Ended {
            lanes: (0..lanes).map(|_| AtomicBool::new(false)).collect(),
            emitted: AtomicU64::new(0),
        })
    }

    fn all(&self) -> bool {
        self.lanes.iter().all(|l| l.load(Ordering::SeqCst))
    }
}

/// Subtask `j` of `p` emits records `j, j + p, j + 2p, …` below `count`, in that order, at most
/// `per_batch` per batch with an idle turn (about 1 ms) between batches. Its position is
/// operator state (the parallelism must not change across restores).
///
/// - `pause_at`: emits no index from there on, and idles until stopped;
/// - `hold`: once done, idles until every lane of that other source has ended. The rule source
///   holds until the readings ended, so that it keeps running (and the job keeps checkpointing:
///   no checkpoint starts once a task has finished) while the readings flow;
/// - `pace`: with `hold`, emits its `k`-th record of this attempt only once the other source
///   emitted `k * pace` (or ended), so that the rules spread over the readings, and failures and
///   checkpoints fall between rules;
/// - `ended`: where it reports its end and counts its records;
/// - `first_allowed`: emitting a lower index is an error (a restored source must not replay).
struct LaneSource<T> {
    make: fn(u64) -> T,
    count: u64,
    per_batch: usize,
    pause_at: Option<u64>,
    hold: Option<Arc<Ended>>,
    pace: Option<u64>,
    ended: Option<Arc<Ended>>,
    first_allowed: u64,
    lanes: u64,
    start: u64,
    index: usize,
    next: u64,
    idle_turn: bool,
    state: Option<OperatorListState<u64>>,
}

impl<T> LaneSource<T> {
    fn new(make: fn(u64) -> T, count: u64, per_batch: usize) -> Self {
        LaneSource {
            make,
            count,
            per_batch,
            pause_at: None,
            hold: None,
            pace: None,
            ended: None,
            first_allowed: 0,
            lanes: 1,
            start: 0,
            index: 0,
            next: 0,
            idle_turn: false,
            state: None,
        }
    }
}

impl<T: Send + 'static> SourceFunction<T> for LaneSource<T> {
    fn open(
        &mut self,
        info: &SubtaskInfo,
        state: &mut OperatorStateBackend,
    ) -> Result<(), TaskError> {
        let list = state.list_state::<u64>("lane-position", OperatorStateMode::SplitDistribute)?;
        let restored = state.get(&list)?;
        self.lanes = u64::from(info.parallelism);
        self.index = info.index as usize;
        self.next = match (info.restored, restored.as_slice()) {
            (false, []) => u64::from(info.index),
            (true, [next]) => *next,
            (restored, got) => {
                return Err(TaskError::Operator {
                    operator: "LaneSource".into(),
                    message: format!("restored={restored} but lane positions {got:?}"),
                });
            }
        };
        self.start = self.next;
        self.state = Some(list);
        Ok(())
    }

    fn next_batch(&mut self, out: &mut Vec<T>, max: usize) -> Result<SourceStatus, TaskError> {
        if self.next >= self.count {
            if self.hold.as_ref().is_some_and(|h| !h.all()) {
                return Ok(SourceStatus::Idle);
            }
            if let Some(ended) = &self.ended {
                ended.lanes[self.index].store(true, Ordering::SeqCst);
            }
            return Ok(SourceStatus::End);
        }
        if std::mem::take(&mut self.idle_turn) {
            return Ok(SourceStatus::Idle);
        }
        if self.next < self.first_allowed {
            return Err(TaskError::Operator {
                operator: "LaneSource".into(),
                message: format!(
                    "replays record {} (the first allowed is {})",
                    self.next, self.first_allowed
                ),
            });
        }
        if let (Some(step), Some(hold)) = (self.pace, &self.hold) {
            let k = (self.next - self.start) / self.lanes;
            if hold.emitted.load(Ordering::SeqCst) < k * step && !hold.all() {
                return Ok(SourceStatus::Idle);
            }
        }
        let limit = self.pause_at.map_or(self.count, |p| p.min(self.count));
        while out.len() < max.min(self.per_batch) && self.next < limit {
            out.push((self.make)(self.next));
            self.next += self.lanes;
        }
        if let Some(ended) = &self.ended {
            ended.emitted.fetch_add(out.len() as u64, Ordering::SeqCst);
        }
        self.idle_turn = true;
        Ok(if out.is_empty() {
            SourceStatus::Idle
        } else {
            SourceStatus::More
        })
    }

    fn snapshot_state(&mut self, state: &mut OperatorStateBackend) -> Result<(), TaskError> {
        if let Some(list) = &self.state {
            state.update(list, &[self.next])?;
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------------
// The exactly-once sink, with a uid so that restores at another parallelism find it.
// ---------------------------------------------------------------------------------------------

/// Committed records by `(subtask, transaction)`; a repeated commit is a no-op.
struct Collected<T> {
    committed: Mutex<BTreeMap<(u32, u64), Vec<T>>>,
}

impl<T: Clone + Send + 'static> Collected<T> {
    fn new() -> Arc<Self> {
        Arc::new(Collected {
            committed: Mutex::new(BTreeMap::new()),
        })
    }

    fn by_subtask(&self) -> BTreeMap<u32, Vec<T>> {
        let mut out: BTreeMap<u32, Vec<T>> = BTreeMap::new();
        for ((s, _), v) in self.committed.lock().unwrap().iter() {
            out.entry(*s).or_default().extend(v.iter().cloned());
        }
        out
    }

    fn transactions(&self) -> Vec<(u32, u64, usize)> {
        self.committed
            .lock()
            .unwrap()
            .iter()
            .map(|((s, t), v)| (*s, *t, v.len()))
            .collect()
    }
}

impl<T: Send + 'static> Committer<T> for Collected<T> {
    fn commit(&self, subtask: u32, transaction: u64, records: Vec<T>) -> Result<(), String> {
        self.committed
            .lock()
            .unwrap()
            .entry((subtask, transaction))
            .or_insert(records);
        Ok(())
    }
}

fn sink<T>(stream: DataStream<T>, collected: &Arc<Collected<T>>)
where
    T: weir_network::Data + Sync,
{
    let c = collected.clone();
    stream
        .transform::<()>("Sink", move |ctx, next| {
            Box::new(Chained::new(
                TwoPhaseCommitSink::new(ctx.operator_id, &ctx.info, c.clone()),
                next,
            ))
        })
        .uid("sink");
}

// ---------------------------------------------------------------------------------------------
// The keyed broadcast function: per color, the sum of its readings times its rule.
// ---------------------------------------------------------------------------------------------

/// What [`ApplyRules`] emits per color, once, when event time ends.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
struct Total {
    color: String,
    count: u64,
    sum: u64,
    /// The color's multiplier in the broadcast state (`None`: no rule, counted as 1).
    multiplier: Option<u64>,
    total: u64,
    /// The size and digest of the whole broadcast map of the subtask when the timer fired.
    rules: usize,
    digest: u64,
    /// The operator's watermark when the timer fired.
    watermark: i64,
}

/// Keyed state `(count, sum)` per color; each reading registers the timer at [`FAR`], which
/// emits the color's [`Total`] with the (by then final) broadcast map.
#[derive(Default)]
struct ApplyRules {
    totals: Option<ValueState<(u64, u64)>>,
}

impl KeyedBroadcastProcessFunction<String, Reading, Rule, Total> for ApplyRules {
    type Key = String;
    type Value = u64;

    fn open(&mut self, states: &mut KeyedStateRegistry<'_, String>) -> Result<(), TaskError> {
        self.totals = Some(states.value_state(&ValueStateDescriptor::new("totals"))?);
        Ok(())
    }

    fn process_element(
        &mut self,
        (_, value): Reading,
        _broadcast: &BTreeMap<String, u64>,
        ctx: &mut KeyedContext<'_, String>,
        _out: &mut Collector<'_, Total>,
    ) -> Result<(), TaskError> {
        let totals = self.totals.unwrap();
        let (count, sum) = ctx.value(totals).copied().unwrap_or((0, 0));
        ctx.update(totals, (count + 1, sum + value));
        ctx.register_event_time_timer(FAR);
        Ok(())
    }

    fn process_broadcast_element(
        &mut self,
        record: Rule,
        broadcast: &mut BTreeMap<String, u64>,
        _out: &mut Collector<'_, Total>,
    ) -> Result<(), TaskError> {
        apply_rule(broadcast, record);
        Ok(())
    }

    fn on_timer(
        &mut self,
        timestamp: i64,
        domain: TimeDomain,
        broadcast: &BTreeMap<String, u64>,
        ctx: &mut KeyedContext<'_, String>,
        out: &mut Collector<'_, Total>,
    ) -> Result<(), TaskError> {
        if domain != TimeDomain::EventTime || timestamp != FAR {
            return Err(TaskError::Operator {
                operator: "ApplyRules".into(),
                message: format!("a {domain:?} timer fired at {timestamp}"),
            });
        }
        let (count, sum) = ctx.value(self.totals.unwrap()).copied().unwrap_or((0, 0));
        let color = ctx.current_key().clone();
        let multiplier = broadcast.get(&color).copied();
        out.collect(Total {
            color,
            count,
            sum,
            multiplier,
            total: sum * multiplier.unwrap_or(1),
            rules: broadcast.len(),
            digest: digest(broadcast),
            watermark: ctx.current_watermark(),
        })
    }
}

/// Every color's [`Total`] over all readings and rules, computed without the engine; sorted.
fn expected_totals() -> Vec<Total> {
    let rules = rules_after(RULES);
    let mut per_color: BTreeMap<String, (u64, u64)> = BTreeMap::new();
    for i in 0..READINGS {
        let (c, v) = reading(i);
        let e = per_color.entry(c).or_default();
        e.0 += 1;
        e.1 += v;
    }
    assert_eq!(per_color.len() as u64, MAIN_COLORS);
    per_color
        .into_iter()
        .map(|(color, (count, sum))| {
            let multiplier = rules.get(&color).copied();
            Total {
                color,
                count,
                sum,
                multiplier,
                total: sum * multiplier.unwrap_or(1),
                rules: rules.len(),
                digest: digest(&rules),
                watermark: i64::MAX,
            }
        })
        .collect()
}

// ---------------------------------------------------------------------------------------------
// The keyed job.
// ---------------------------------------------------------------------------------------------

struct JobOptions<'a> {
    /// Parallelism of the keyed broadcast function and the sink.
    parallelism: u32,
    /// Parallelism of the readings source.
    main_parallelism: u32,
    /// Parallelism of the rules source.
    rule_parallelism: u32,
    checkpoint_dir: &'a Path,
    checkpoint_interval: Option<Duration>,
    failures: Option<Arc<Failures>>,
    pause_readings: Option<u64>,
    pause_rules: Option<u64>,
    /// Rules below this index must not be emitted (they are in the restored state).
    rules_from: u64,
    restore_from: Option<&'a Path>,
    savepoint_dir: Option<&'a Path>,
    restart: RestartStrategy,
    /// Spread the rules over the readings (see [`LaneSource`]'s `pace`).
    pace_rules: bool,
    state_backend: Arc<dyn StateBackend>,
}

impl<'a> JobOptions<'a> {
    fn new(parallelism: u32, checkpoint_dir: &'a Path) -> Self {
        JobOptions {
            parallelism,
            main_parallelism: 2,
            rule_parallelism: 2,
            checkpoint_dir,
            checkpoint_interval: None,
            failures: None,
            pause_readings: None,
            pause_rules: None,
            rules_from: 0,
            restore_from: None,
            savepoint_dir: None,
            restart: RestartStrategy::FixedDelay {
                attempts: 10,
                delay: Duration::from_millis(5),
            },
            pace_rules: true,
            state_backend: Arc::new(HeapStateBackend),
        }
    }
}

/// readings (lanes) → [inject] → key_by color ─┐
/// rules (lanes) → [inject] → broadcast ───────┴→ ApplyRules → sink.
fn keyed_job(o: &JobOptions<'_>) -> (StreamEnvironment, Arc<Collected<Total>>) {
    let env = StreamEnvironment::new();
    env.set_state_backend(o.state_backend.clone());
    env.set_job_name("broadcast-test")
        .set_max_parallelism(MAX_PARALLELISM)
        .set_checkpoint_dir(o.checkpoint_dir)
        .set_restart_strategy(o.restart.clone());
    if let Some(i) = o.checkpoint_interval {
        env.enable_checkpointing(i);
    }
    if let Some(from) = o.restore_from {
        env.restore_from(from);
    }
    if let Some(dir) = o.savepoint_dir {
        env.set_savepoint_dir(dir);
    }
    let readings_ended = Ended::new(o.main_parallelism);

    env.set_parallelism(o.main_parallelism);
    let (ended, pause) = (readings_ended.clone(), o.pause_readings);
    let mut readings = env
        .add_source("Readings", move |_| {
            let mut s = LaneSource::new(reading, READINGS, 64);
            s.pause_at = pause;
            s.ended = Some(ended.clone());
            Box::new(s) as Box<dyn SourceFunction<Reading>>
        })
        .uid("readings");
    if let Some(f) = &o.failures {
        readings = inject(readings, f);
    }

    // The broadcast side's wrapping map is made at the environment's parallelism when
    // connecting: the rules' parallelism, so that it chains to them and keeps each lane's order.
    env.set_parallelism(o.rule_parallelism);
    let (hold, pause, first) = (readings_ended, o.pause_rules, o.rules_from);
    // Each lane's `k`-th rule after `k * step` readings: all rules by about half the readings.
    let pace = o
        .pace_rules
        .then_some(READINGS / 2 / RULES * u64::from(o.rule_parallelism));
    let mut rules = env
        .add_source("Rules", move |_| {
            let mut s = LaneSource::new(rule, RULES, 1);
            s.pause_at = pause;
            s.hold = Some(hold.clone());
            s.pace = pace;
            s.first_allowed = first;
            Box::new(s) as Box<dyn SourceFunction<Rule>>
        })
        .uid("rules");
    if let Some(f) = &o.failures {
        rules = inject(rules, f);
    }

    let totals = readings
        .key_by(|r: &Reading| &r.0)
        .connect_broadcast(rules)
        .process("ApplyRules", ApplyRules::default)
        .uid("apply-rules")
        .set_parallelism(o.parallelism);
    env.set_parallelism(o.parallelism);
    let collected = Collected::new();
    sink(totals, &collected);
    (env, collected)
}

/// Checks one run's output: exactly the expected totals; each color fired in the subtask that
/// owns its key group at `parallelism`, at the end of event time; every subtask fired, with the
/// full final broadcast map.
fn check_totals(by_subtask: &BTreeMap<u32, Vec<Total>>, parallelism: u32, ctx: &str) {
    let expected = expected_totals();
    let final_rules = rules_after(RULES);
    for (subtask, totals) in by_subtask {
        let range =
            compute_key_group_range_for_operator_index(MAX_PARALLELISM, parallelism, *subtask);
        for t in totals {
            let kg = assign_to_key_group(&t.color, MAX_PARALLELISM);
            assert!(
                range.contains(kg),
                "{ctx}: {} (key group {kg}) fired in subtask {subtask} of {parallelism}, which \
                 owns {range}",
                t.color
            );
            assert_eq!(
                (t.rules, t.digest, t.watermark),
                (final_rules.len(), digest(&final_rules), i64::MAX),
                "{ctx}: subtask {subtask} fired {t:?} before its broadcast state was final \
                 (expected {final_rules:?})"
            );
        }
    }
    let fired: BTreeSet<u32> = by_subtask
        .iter()
        .filter(|(_, v)| !v.is_empty())
        .map(|(s, _)| *s)
        .collect();
    assert_eq!(
        fired,
        (0..parallelism).collect::<BTreeSet<u32>>(),
        "{ctx}: not every subtask fired, so not every broadcast copy was checked"
    );
    let mut got: Vec<Total> = by_subtask.values().flatten().cloned().collect();
    got.sort();
    if got != expected {
        let g: BTreeSet<_> = got.iter().collect();
        let e: BTreeSet<_> = expected.iter().collect();
        let missing: Vec<_> = e.difference(&g).take(3).collect();
        let extra: Vec<_> = g.difference(&e).take(3).collect();
        panic!(
            "{ctx}: {} totals, expected {}; missing (first 3) {missing:?}, unexpected \
             {extra:?}",
            got.len(),
            expected.len()
        );
    }
}

/// Strips `file://` from a snapshot path a client returned.
fn local(path: &str) -> PathBuf {
    PathBuf::from(path.strip_prefix("file://").unwrap_or(path))
}

/// Waits until the job's sources emitted `n` records, then checks they stopped there.
async fn wait_for_sources(
    client: &JobClient,
    job: &tokio::task::JoinHandle<Result<weir_runtime::JobResult, JobError>>,
    n: u64,
) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while client.source_records() < n {
        assert!(
            !job.is_finished(),
            "the job ended before its sources paused"
        );
        assert!(Instant::now() < deadline, "the sources did not reach {n}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert_eq!(
        client.source_records(),
        n,
        "the sources went past the pause"
    );
}

/// The data makes every check meaningful: rules overwrite and remove earlier ones, some colors
/// never have one, and with the pause at `RULES / 2` some final rules come only from before it.
#[test]
fn the_test_data_covers_overwrites_removals_and_missing_rules() {
    let final_rules = rules_after(RULES);
    let firsts = rules_after(RULE_COLORS);
    let changed = firsts
        .iter()
        .filter(|(c, m)| final_rules.get(*c) != Some(m))
        .count();
    assert!(changed >= 3, "{firsts:?} -> {final_rules:?}");
    assert!(
        (0..RULES).any(|i| rule(i).1 == 0 && i >= RULE_COLORS),
        "no rule removes an earlier one"
    );
    assert!(final_rules.len() >= 10, "{final_rules:?}");
    assert!(!final_rules.contains_key(&color(MAIN_COLORS - 1)));
    // A color whose only rule is before the pause, and stays: only a restored copy has it.
    let only_before = (RULES - RULE_COLORS..RULES / 2)
        .filter(|&i| rule(i).1 != 0)
        .count();
    assert!(only_before > 0);
}

// ---------------------------------------------------------------------------------------------
// 1. Keyed: the final broadcast map in every subtask, applied to keyed state.
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keyed_broadcast_applies_the_final_rules_in_every_subtask() {
    let tmp = tempfile::tempdir().unwrap();
    for (parallelism, main_parallelism, rule_parallelism) in [(3, 2, 2), (2, 3, 1)] {
        let ctx = format!(
            "parallelism {parallelism}, readings {main_parallelism}, rules {rule_parallelism}"
        );
        let dir = tmp.path().join(format!("p{parallelism}"));
        let mut o = JobOptions::new(parallelism, &dir);
        o.main_parallelism = main_parallelism;
        o.rule_parallelism = rule_parallelism;
        let (env, collected) = keyed_job(&o);
        let r = env
            .execute()
            .bounded()
            .await
            .unwrap_or_else(|e| panic!("{ctx}: {e}"));
        assert_eq!(r.status, JobStatus::Finished, "{ctx}");
        assert_eq!(r.source_records, READINGS + RULES, "{ctx}");
        check_totals(&collected.by_subtask(), parallelism, &ctx);
    }
}

// ---------------------------------------------------------------------------------------------
// 2. Plain: every subtask sees every broadcast record; main records are processed once.
// ---------------------------------------------------------------------------------------------

/// Rules of the plain test: all distinct keys.
const PLAIN_RULES: u64 = 50;
const PLAIN_READINGS: u64 = 5_000;

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
enum Seen {
    /// A broadcast record, with the map's size after it.
    Rule(u64, usize),
    /// A main record, with the map's size when it was processed.
    Main(u64, usize),
}

/// Inserts each broadcast record into the map; emits every record it sees.
struct SeeAll;

impl BroadcastProcessFunction<u64, u64, Seen> for SeeAll {
    type Key = u64;
    type Value = u64;

    fn process_element(
        &mut self,
        record: u64,
        broadcast: &BTreeMap<u64, u64>,
        out: &mut Collector<'_, Seen>,
    ) -> Result<(), TaskError> {
        out.collect(Seen::Main(record, broadcast.len()))
    }

    fn process_broadcast_element(
        &mut self,
        record: u64,
        broadcast: &mut BTreeMap<u64, u64>,
        out: &mut Collector<'_, Seen>,
    ) -> Result<(), TaskError> {
        broadcast.insert(record, record * 10);
        out.collect(Seen::Rule(record, broadcast.len()))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_broadcast_reaches_every_subtask_and_main_records_once() {
    const P: u32 = 3;
    let tmp = tempfile::tempdir().unwrap();
    let env = StreamEnvironment::new();
    env.set_job_name("plain-broadcast")
        .set_checkpoint_dir(tmp.path())
        .set_parallelism(2);
    let ended = Ended::new(2);
    let e = ended.clone();
    let main = env
        .add_source("Main", move |_| {
            let mut s = LaneSource::new(|i| i, PLAIN_READINGS, 32);
            s.ended = Some(e.clone());
            Box::new(s) as Box<dyn SourceFunction<u64>>
        })
        .uid("main")
        .rebalance();
    env.set_parallelism(1);
    let rules = env
        .add_source("Rules", move |_| {
            let mut s = LaneSource::new(|i| 1000 + i, PLAIN_RULES, 1);
            s.hold = Some(ended.clone());
            Box::new(s) as Box<dyn SourceFunction<u64>>
        })
        .uid("rules");
    let seen = main
        .connect_broadcast(rules)
        .process("SeeAll", || SeeAll)
        .uid("see-all")
        .set_parallelism(P);
    env.set_parallelism(P);
    let collected = Collected::new();
    sink(seen, &collected);
    let r = env.execute().bounded().await.unwrap();
    assert_eq!(r.status, JobStatus::Finished);

    let by_subtask = collected.by_subtask();
    let mut mains: Vec<u64> = Vec::new();
    for s in 0..P {
        let records = by_subtask.get(&s).cloned().unwrap_or_default();
        let mut rules_seen = Vec::new();
        let mut main_here = 0;
        for r in &records {
            match *r {
                Seen::Rule(k, size) => {
                    rules_seen.push(k);
                    assert_eq!(size, rules_seen.len(), "subtask {s}: {r:?}");
                }
                Seen::Main(i, size) => {
                    // The map a main record reads holds exactly the rules before it.
                    assert_eq!(size, rules_seen.len(), "subtask {s}: {r:?}");
                    mains.push(i);
                    main_here += 1;
                }
            }
        }
        // Every broadcast record, once, in the (single) producer's order.
        assert_eq!(
            rules_seen,
            (1000..1000 + PLAIN_RULES).collect::<Vec<u64>>(),
            "subtask {s}"
        );
        assert!(main_here > 0, "subtask {s} got no main record");
    }
    assert_eq!(by_subtask.len() as u32, P);
    mains.sort_unstable();
    assert_eq!(mains, (0..PLAIN_READINGS).collect::<Vec<u64>>());
}

// ---------------------------------------------------------------------------------------------
// 3. Exactly once under failures: broadcast and keyed state restored from checkpoints.
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keyed_broadcast_is_exactly_once_under_failures() {
    keyed_broadcast_exactly_once(Arc::new(HeapStateBackend)).await;
}

/// The same with the keyed state in a store of bytes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keyed_broadcast_is_exactly_once_under_failures_on_a_store_backend() {
    keyed_broadcast_exactly_once(Arc::new(MemoryStoreStateBackend)).await;
}

async fn keyed_broadcast_exactly_once(backend: Arc<dyn StateBackend>) {
    let seed = test_seed();
    let tmp = tempfile::tempdir().unwrap();
    for round in 0..3u64 {
        let mut rng = seed.wrapping_add(round);
        let mut next = || {
            rng = splitmix64(rng);
            rng
        };
        // One failure in each third of the records (readings and rules, counted over attempts).
        let thresholds: Vec<u64> = (0..3)
            .map(|k| k * READINGS / 3 + READINGS / 12 + next() % (READINGS / 6))
            .collect();
        let interval = Duration::from_millis(5 + next() % 11);
        let ctx =
            format!("seed={seed} round={round} thresholds={thresholds:?} interval={interval:?}");
        let failures = Failures::at(thresholds);
        let dir = tmp.path().join(format!("faulty-{round}"));
        let mut o = JobOptions::new(3, &dir);
        o.checkpoint_interval = Some(interval);
        o.failures = Some(failures.clone());
        o.state_backend = backend.clone();
        let (env, collected) = keyed_job(&o);
        let r = env
            .execute()
            .bounded()
            .await
            .unwrap_or_else(|e| panic!("{ctx}: {e}"));
        let ctx = format!("{ctx} checkpoints={}", r.checkpoints_completed);
        assert_eq!(r.status, JobStatus::Finished, "{ctx}");
        assert_eq!(failures.injected(), 3, "{ctx}");
        assert_eq!(r.restarts, 3, "{ctx}");
        check_totals(&collected.by_subtask(), 3, &ctx);
        if r.checkpoints_completed > 0 {
            // Exact only because the restored state was used: the sources resumed.
            assert_resumed(&r, READINGS + RULES, &ctx);
            eprintln!("{ctx}: ok");
            return;
        }
        eprintln!("{ctx}: no checkpoint completed; again");
    }
    panic!("seed={seed}: no run completed a checkpoint");
}

// ---------------------------------------------------------------------------------------------
// 4. Rescale: a savepoint at parallelism 2, restored at 3 and at 1.
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keyed_broadcast_survives_a_savepoint_restore_at_another_parallelism() {
    let tmp = tempfile::tempdir().unwrap();
    let (pause_readings, pause_rules) = (READINGS / 2, RULES / 2);

    // Parallelism 2 until half the readings and half the rules are in, then stop with a
    // savepoint: nothing fires (event time has not ended), the state is in the savepoint.
    let sp_root = tmp.path().join("savepoints");
    let first_dir = tmp.path().join("cp-first");
    let mut o = JobOptions::new(2, &first_dir);
    o.checkpoint_interval = Some(Duration::from_millis(20));
    o.pause_readings = Some(pause_readings);
    o.pause_rules = Some(pause_rules);
    o.savepoint_dir = Some(&sp_root);
    let (env, first) = keyed_job(&o);
    let client = JobClient::default();
    let job = tokio::spawn(env.execute_with(client.clone()).bounded());
    wait_for_sources(&client, &job, pause_readings + pause_rules).await;
    let savepoint = loop {
        match client.stop_with_savepoint(None, false).await {
            Ok(path) => break path,
            Err(e) if e.to_string().contains("not triggered") => {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            Err(e) => panic!("stop with savepoint: {e}"),
        }
    };
    let r = job.await.unwrap().unwrap();
    assert_eq!(r.status, JobStatus::Finished);
    assert_eq!(r.source_records, pause_readings + pause_rules);
    let savepoint = local(&savepoint);
    assert!(savepoint.join("_metadata").is_file(), "{savepoint:?}");
    let fired_before: usize = first.by_subtask().values().map(Vec::len).sum();
    assert_eq!(fired_before, 0, "timers fired before the end of event time");

    for parallelism in [3, 1] {
        let ctx = format!("restored at parallelism {parallelism}");
        let dir = tmp.path().join(format!("cp-{parallelism}"));
        let mut o = JobOptions::new(parallelism, &dir);
        o.checkpoint_interval = Some(Duration::from_millis(20));
        o.restore_from = Some(&savepoint);
        o.rules_from = pause_rules;
        o.restart = RestartStrategy::NoRestart;
        let (env, collected) = keyed_job(&o);
        let r = env
            .execute()
            .bounded()
            .await
            .unwrap_or_else(|e| panic!("{ctx}: {e}"));
        assert_eq!(r.status, JobStatus::Finished, "{ctx}");
        assert_eq!(r.restarts, 0, "{ctx}");
        assert_eq!(
            r.source_records,
            (READINGS - pause_readings) + (RULES - pause_rules),
            "{ctx}"
        );
        check_totals(&collected.by_subtask(), parallelism, &ctx);
        // Everything fired at the end of input, after the last checkpoint.
        assert!(
            collected
                .transactions()
                .iter()
                .all(|&(_, txn, n)| txn == FINAL_TRANSACTION || n == 0),
            "{ctx}: {:?}",
            collected.transactions()
        );
    }
}

// ---------------------------------------------------------------------------------------------
// 5. A checkpoint holds the broadcast state as operator state, and a restore needs no replay.
// ---------------------------------------------------------------------------------------------

#[cfg(feature = "cli")] // It inspects the checkpoint with the `weir` binary.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checkpoint_holds_the_broadcast_state_and_a_restore_does_not_replay_rules() {
    let tmp = tempfile::tempdir().unwrap();
    let pause_readings = READINGS / 2;

    // Every rule and half the readings in, then a checkpoint, then cancel.
    let first_dir = tmp.path().join("cp-first");
    let mut o = JobOptions::new(2, &first_dir);
    o.pause_readings = Some(pause_readings);
    // Checkpointing on (else a triggered checkpoint goes to memory), no periodic one in time.
    o.checkpoint_interval = Some(Duration::from_secs(3600));
    o.pace_rules = false;
    let (env, _) = keyed_job(&o);
    let client = JobClient::default();
    let job = tokio::spawn(env.execute_with(client.clone()).bounded());
    wait_for_sources(&client, &job, pause_readings + RULES).await;
    let checkpoint = local(
        &client
            .trigger_checkpoint()
            .await
            .unwrap_or_else(|e| panic!("checkpoint: {e}")),
    );
    client.cancel();
    let r = job.await.unwrap().unwrap();
    assert_eq!(r.status, JobStatus::Canceled);
    assert!(checkpoint.join("_metadata").is_file(), "{checkpoint:?}");

    // The checkpoint, as `weir checkpoints inspect --json` reports it.
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_weir"))
        .args(["checkpoints", "inspect", "--json"])
        .arg(&checkpoint)
        .output_bounded()
        .expect("cannot run the weir binary");
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}\n{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["kind"], "checkpoint", "{v:#}");
    assert_eq!(v["problems"].as_array().unwrap().len(), 0, "{v:#}");
    let ops = v["operators"].as_array().unwrap();
    let by_uid = |uid: &str| {
        ops.iter()
            .find(|op| op["uid"] == uid)
            .unwrap_or_else(|| panic!("no operator with uid {uid}: {v:#}"))
    };
    let op = by_uid("apply-rules");
    assert_eq!(op["parallelism"], 2, "{op:#}");
    let subtasks = op["subtasks"].as_array().unwrap();
    assert_eq!(subtasks.len(), 2, "{op:#}");
    for sub in subtasks {
        // The broadcast map: operator state in broadcast mode, in every subtask.
        let handles = sub["operator"].as_array().unwrap();
        assert_eq!(handles.len(), 1, "{sub:#}");
        let states = handles[0]["states"].as_array().unwrap();
        assert!(
            states
                .iter()
                .any(|s| s["name"] == BROADCAST_STATE && s["mode"] == "broadcast"),
            "no broadcast state in {sub:#}"
        );
        assert_eq!(handles[0]["verification"]["ok"], true, "{sub:#}");
        // The keyed state next to it: the totals (and the timers).
        let keyed = sub["keyed"].as_array().unwrap();
        assert_eq!(keyed.len(), 1, "{sub:#}");
        let names: Vec<&str> = keyed[0]["states"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["name"].as_str().unwrap())
            .collect();
        assert!(names.contains(&"totals"), "{names:?}");
        assert_eq!(keyed[0]["verification"]["ok"], true, "{sub:#}");
    }
    // The rules source holds only its positions, as split-distribute operator state.
    let rules = by_uid("rules");
    let rules_states = rules["subtasks"][0]["operator"][0]["states"]
        .as_array()
        .unwrap();
    assert!(
        rules_states.iter().all(|s| s["mode"] == "split-distribute"),
        "{rules:#}"
    );

    // Restored (at parallelism 3) with the rules source at its end: no rule is emitted again,
    // yet every subtask applies all of them.
    let dir = tmp.path().join("cp-restored");
    let mut o = JobOptions::new(3, &dir);
    o.restore_from = Some(&checkpoint);
    o.rules_from = RULES;
    o.restart = RestartStrategy::NoRestart;
    let (env, collected) = keyed_job(&o);
    let r = env
        .execute()
        .bounded()
        .await
        .unwrap_or_else(|e| panic!("restored: {e}"));
    assert_eq!(r.status, JobStatus::Finished);
    assert_eq!(r.source_records, READINGS - pause_readings);
    assert!(
        r.restored_from.unwrap_or_default().contains("chk-"),
        "not restored from the checkpoint"
    );
    check_totals(&collected.by_subtask(), 3, "restored from the checkpoint");
}
