//! All five keyed state kinds at once in a keyed process function are exactly-once in real jobs,
//! under failures and across a rescale.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;
use support::Bounded;

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use support::{Failures, assert_resumed, inject};
use weir_runtime::keyed::{Collector, KeyedContext, KeyedProcessFunction, KeyedStateRegistry};
use weir_runtime::source::splitmix64;
use weir_runtime::{
    CollectHandle, DataStream, JobError, RestartStrategy, StreamEnvironment, TaskError,
};
use weir_state::{
    AggregateFunction, AggregatingState, AggregatingStateDescriptor, HeapStateBackend, ListState,
    ListStateDescriptor, MapState, MapStateDescriptor, MemoryStoreStateBackend, ReducingState,
    ReducingStateDescriptor, ValueState, ValueStateDescriptor,
};

/// The failure injector sleeps 1 ms every this many records: slow enough for checkpoints to
/// complete between failures.
const PACE_EVERY: u64 = 4096;

/// The number of keys: record `i` has key `i % KEYS`. A multiple of the generator's split count
/// at source parallelism 1, 2 and 3 (4 splits per reader, split `s` of `n` holding the indices
/// `s, s + n, …`), so all the records of a key lie in one split and reach the key's subtask in
/// ascending index, whatever the interleaving of splits and subtasks: each key's state evolves
/// deterministically, and the test can compute it without the engine.
const KEYS: u64 = 48;

/// Record `i`'s value.
fn value_of(i: u64) -> u64 {
    splitmix64(i ^ 0x6b69_6e64) % 1000
}

/// What the function emits per record: the key's state after the record, all five kinds.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
struct Summary {
    key: u64,
    /// Value state with default 0: records seen.
    count: u64,
    /// List state: the last values, at most 4, emptied (`list_update(vec![])`) every 10th record.
    recent: Vec<u64>,
    /// Map state: records per bucket `value % 5`, the smallest bucket removed every 7th record,
    /// in bucket order.
    buckets: Vec<(u8, u32)>,
    /// Reducing state: the largest value since the last reset (every 25th record clears it).
    max: u64,
    /// Aggregating state: `count/sum` of every value, through an accumulator.
    mean: String,
}

/// Count and sum, read as `"count/sum"`.
struct Mean;

impl AggregateFunction<u64, (u64, u64), String> for Mean {
    fn create_accumulator(&self) -> (u64, u64) {
        (0, 0)
    }

    fn add(&self, value: u64, acc: &mut (u64, u64)) {
        acc.0 += 1;
        acc.1 += value;
    }

    fn get_result(&self, acc: &(u64, u64)) -> String {
        format!("{}/{}", acc.0, acc.1)
    }

    fn merge(&self, a: (u64, u64), b: (u64, u64)) -> (u64, u64) {
        (a.0 + b.0, a.1 + b.1)
    }
}

/// The keyed process function under test.
#[derive(Default)]
struct AllKinds {
    count: Option<ValueState<u64>>,
    recent: Option<ListState<u64>>,
    buckets: Option<MapState<u8, u32>>,
    max: Option<ReducingState<u64>>,
    mean: Option<AggregatingState<u64, (u64, u64), String>>,
}

impl KeyedProcessFunction<u64, (u64, u64), Summary> for AllKinds {
    fn open(&mut self, states: &mut KeyedStateRegistry<'_, u64>) -> Result<(), TaskError> {
        self.count = Some(states.value_state(&ValueStateDescriptor::new("count").with_default(0))?);
        self.recent = Some(states.list_state(&ListStateDescriptor::new("recent"))?);
        self.buckets = Some(states.map_state(&MapStateDescriptor::new("buckets"))?);
        self.max = Some(
            states.reducing_state(&ReducingStateDescriptor::new("max", |a: &u64, b: &u64| {
                *a.max(b)
            }))?,
        );
        self.mean = Some(states.aggregating_state(&AggregatingStateDescriptor::new("mean", Mean))?);
        Ok(())
    }

    fn process_element(
        &mut self,
        (key, i): (u64, u64),
        ctx: &mut KeyedContext<'_, u64>,
        out: &mut Collector<'_, Summary>,
    ) -> Result<(), TaskError> {
        let (count_state, recent, buckets) = (
            self.count.unwrap(),
            self.recent.unwrap(),
            self.buckets.unwrap(),
        );
        let (max, mean) = (self.max.as_ref().unwrap(), self.mean.as_ref().unwrap());
        let v = value_of(i);
        let mut s = ctx.state();

        let count = s.value(count_state).copied().expect("the default") + 1;
        s.update(count_state, count);

        if count.is_multiple_of(10) {
            s.list_update(recent, Vec::new());
        } else {
            s.list_add(recent, v);
            if s.list(recent).count() > 4 {
                let keep = s.list(recent).to_vec()[1..].to_vec();
                s.list_update(recent, keep);
            }
        }

        let bucket = (v % 5) as u8;
        let n = s.map_get(buckets, &bucket).copied().unwrap_or(0);
        s.map_put(buckets, bucket, n + 1);
        if count.is_multiple_of(7) {
            let first = s.map_entries(buckets).next().map(|(b, _)| *b);
            if let Some(first) = first {
                s.map_remove(buckets, &first);
            }
        }

        if count.is_multiple_of(25) {
            s.clear_raw(max.raw);
        }
        s.reduce(max, v);
        s.aggregate(mean, v);

        let summary = Summary {
            key,
            count,
            recent: s.list(recent).to_vec(),
            buckets: s.map_entries(buckets).map(|(b, n)| (*b, *n)).collect(),
            max: *s.reduced(max).expect("a value was just reduced"),
            mean: s.aggregated(mean).expect("a value was just added"),
        };
        out.collect(summary)
    }
}

/// Every key's summaries over records `0..records`, computed without the engine: `[key][c - 1]`
/// is the summary after the key's `c`-th record.
fn expected(records: u64) -> BTreeMap<u64, Vec<Summary>> {
    #[derive(Default)]
    struct Model {
        count: u64,
        recent: Vec<u64>,
        buckets: BTreeMap<u8, u32>,
        max: Option<u64>,
        sum: u64,
    }
    let mut models: BTreeMap<u64, Model> = BTreeMap::new();
    let mut out: BTreeMap<u64, Vec<Summary>> = BTreeMap::new();
    for i in 0..records {
        let (key, v) = (i % KEYS, value_of(i));
        let m = models.entry(key).or_default();
        m.count += 1;
        if m.count.is_multiple_of(10) {
            m.recent.clear();
        } else {
            m.recent.push(v);
            if m.recent.len() > 4 {
                m.recent.remove(0);
            }
        }
        *m.buckets.entry((v % 5) as u8).or_insert(0) += 1;
        if m.count.is_multiple_of(7) {
            m.buckets.pop_first();
        }
        if m.count.is_multiple_of(25) {
            m.max = None;
        }
        m.max = Some(m.max.map_or(v, |x| x.max(v)));
        m.sum += v;
        out.entry(key).or_default().push(Summary {
            key,
            count: m.count,
            recent: m.recent.clone(),
            buckets: m.buckets.iter().map(|(b, n)| (*b, *n)).collect(),
            max: m.max.unwrap_or_default(),
            mean: format!("{}/{}", m.count, m.sum),
        });
    }
    out
}

/// Checks a job's committed output against [`expected`]: every summary equals the expected one,
/// and each key's counts run `first, first + 1, …, last` with no gap or duplicate. With
/// `in_order` (a job not restored from another job's checkpoint), within each subtask each key's
/// summaries also come in order, and each key lives in one subtask (Flink's VerifyingSink
/// check); a restored job first commits the transactions its checkpoint left pending, whose
/// records came from the old subtasks, so this does not hold for it. Returns each key's
/// `(first, last)`.
fn verify(
    by_subtask: &BTreeMap<u32, Vec<Summary>>,
    expected: &BTreeMap<u64, Vec<Summary>>,
    in_order: bool,
    ctx: &str,
) -> BTreeMap<u64, (u64, u64)> {
    let mut counts: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
    let mut last: BTreeMap<u64, (u32, u64)> = BTreeMap::new();
    for (&subtask, records) in by_subtask {
        for s in records {
            let want = usize::try_from(s.count)
                .ok()
                .and_then(|c| expected.get(&s.key)?.get(c.checked_sub(1)?))
                .unwrap_or_else(|| panic!("{ctx}: unexpected output {s:?}"));
            assert_eq!(s, want, "{ctx}: key {} after record {}", s.key, s.count);
            counts.entry(s.key).or_default().push(s.count);
            if in_order {
                if let Some(&(o, l)) = last.get(&s.key) {
                    assert_eq!(
                        o, subtask,
                        "{ctx}: key {} in subtasks {o} and {subtask}",
                        s.key
                    );
                    assert_eq!(
                        s.count,
                        l + 1,
                        "{ctx}: key {} goes from count {l} to {} in subtask {subtask}",
                        s.key,
                        s.count
                    );
                }
                last.insert(s.key, (subtask, s.count));
            }
        }
    }
    counts
        .into_iter()
        .map(|(key, mut c)| {
            c.sort_unstable();
            if let Some(w) = c.windows(2).find(|w| w[1] != w[0] + 1) {
                panic!(
                    "{ctx}: key {key}'s committed counts go from {} to {} (a gap or a duplicate)",
                    w[0], w[1]
                );
            }
            (key, (c[0], c[c.len() - 1]))
        })
        .collect()
}

/// generator → failure injection → key_by → the five-kind function → collect.
fn job(env: &StreamEnvironment, records: u64, failures: &Arc<Failures>) -> CollectHandle<Summary> {
    let source: DataStream<u64> = env.from_generator(Some(records), |i| i).uid("source");
    inject(source, failures)
        .uid("inject")
        .map(|i: u64| (i % KEYS, i))
        .uid("pairs")
        .key_by(|t: &(u64, u64)| &t.0)
        .process("AllKinds", AllKinds::default)
        .uid("all-kinds")
        .collect()
}

/// Which keyed-state backend a job runs on.
#[derive(Clone, Copy, Debug)]
enum Backend {
    Heap,
    /// The memory store, through the `KeyedStore` seam.
    Store,
}

fn environment(
    root: &Path,
    parallelism: u32,
    restart: RestartStrategy,
    backend: Backend,
) -> StreamEnvironment {
    let env = StreamEnvironment::new();
    match backend {
        Backend::Heap => env.set_state_backend(HeapStateBackend),
        Backend::Store => env.set_state_backend(MemoryStoreStateBackend),
    };
    env.set_job_name("state-kinds")
        .set_parallelism(parallelism)
        .set_max_parallelism(128)
        .enable_checkpointing(Duration::from_millis(5))
        .set_checkpoint_dir(root)
        .set_restart_strategy(restart);
    env
}

fn fixed_delay() -> RestartStrategy {
    RestartStrategy::FixedDelay {
        attempts: 10,
        delay: Duration::from_millis(10),
    }
}

/// Whether a checkpoint root holds a complete checkpoint.
fn has_complete_checkpoint(root: &Path) -> bool {
    std::fs::read_dir(root)
        .into_iter()
        .flatten()
        .flatten()
        .any(|job| {
            std::fs::read_dir(job.path())
                .into_iter()
                .flatten()
                .flatten()
                .any(|chk| chk.path().join("_metadata").is_file())
        })
}

/// Three failures, restarted from checkpoints taken every 5 ms: every committed summary is the
/// one computed without the engine, once, in order per key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn all_five_kinds_are_exactly_once_under_failures() {
    exactly_once_under_failures(Backend::Heap).await;
}

/// The same on a store of bytes: every kind, its restores included, goes through `KeyedStore`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn all_five_kinds_are_exactly_once_under_failures_on_a_store_backend() {
    exactly_once_under_failures(Backend::Store).await;
}

async fn exactly_once_under_failures(backend: Backend) {
    let mut records = 200_000u64;
    for _ in 0..4 {
        let tmp = tempfile::tempdir().unwrap();
        let env = environment(tmp.path(), 2, fixed_delay(), backend);
        let failures = Failures::paced(vec![records / 4, records / 2, records * 3 / 4], PACE_EVERY);
        let out = job(&env, records, &failures);
        let r = env.execute().bounded().await.unwrap();
        let ctx = format!("{backend:?}, records={records}");
        assert_eq!(failures.injected(), 3, "{ctx}");
        assert_eq!(r.restarts, 3, "{ctx}");
        assert_resumed(&r, records, &ctx);
        let expected = expected(records);
        let ranges = verify(&out.records_by_subtask(), &expected, true, &ctx);
        let full: BTreeMap<u64, (u64, u64)> = expected
            .iter()
            .map(|(k, s)| (*k, (1, s.len() as u64)))
            .collect();
        assert_eq!(ranges, full, "{ctx}: each key's committed counts");
        if r.checkpoints_completed > 0 {
            return;
        }
        eprintln!("{ctx}: no checkpoint completed; rerunning with more records");
        records *= 4;
    }
    panic!("no run completed a checkpoint");
}

/// A job at parallelism 2 fails for good half-way; a job at parallelism 3 restores its latest
/// checkpoint (key groups split differently: a new subtask takes parts of both old ones) and
/// fails once more itself. Every summary the second job commits, from the first after the
/// restore, is the one computed without the engine: all five kinds came back exact for every
/// key. Together the two jobs commit every record's summary (the second recommits what the
/// first may have committed already: the transactions pending at the checkpoint).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn all_five_kinds_restore_exactly_at_another_parallelism() {
    restore_at_another_parallelism(Backend::Heap, Backend::Heap).await;
}

/// Snapshots are canonical: a heap checkpoint restores into a store backend at another
/// parallelism, and the other way round.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn all_five_kinds_restore_exactly_across_backends() {
    restore_at_another_parallelism(Backend::Heap, Backend::Store).await;
    restore_at_another_parallelism(Backend::Store, Backend::Heap).await;
}

async fn restore_at_another_parallelism(first_backend: Backend, second_backend: Backend) {
    let mut records = 200_000u64;
    for _ in 0..4 {
        let tmp = tempfile::tempdir().unwrap();
        let first = tmp.path().join("first");
        let ctx = format!("{first_backend:?} then {second_backend:?}, records={records}");
        let env = environment(&first, 2, RestartStrategy::NoRestart, first_backend);
        let failures = Failures::paced(vec![records / 2], PACE_EVERY);
        let before = job(&env, records, &failures);
        match env.execute().bounded().await {
            Err(JobError::Failed { restarts, .. }) => assert_eq!(restarts, 0, "{ctx}"),
            other => panic!("{ctx}: expected the job to fail, got {other:?}"),
        }
        if !has_complete_checkpoint(&first) {
            eprintln!("{ctx}: failed before any checkpoint completed; rerunning with more records");
            records *= 4;
            continue;
        }

        let env = environment(&tmp.path().join("second"), 3, fixed_delay(), second_backend);
        env.restore_from(&first);
        let failures = Failures::paced(vec![records / 4], PACE_EVERY);
        let after = job(&env, records, &failures);
        let r = env
            .execute()
            .bounded()
            .await
            .unwrap_or_else(|e| panic!("{ctx}: the restored job failed: {e}"));
        assert!(
            r.restored_from
                .as_deref()
                .is_some_and(|f| f.contains("/chk-")),
            "{ctx}: restored from {:?}",
            r.restored_from
        );
        assert_eq!(failures.injected(), 1, "{ctx}");
        assert_eq!(r.restarts, 1, "{ctx}");
        assert_resumed(&r, records, &ctx);

        let expected = expected(records);
        let before = verify(&before.records_by_subtask(), &expected, true, &ctx);
        let by_subtask = after.records_by_subtask();
        assert_eq!(by_subtask.len(), 3, "{ctx}: every new subtask commits");
        let after = verify(&by_subtask, &expected, false, &ctx);
        for (key, summaries) in &expected {
            let total = summaries.len() as u64;
            let committed_before = before.get(key).map_or(0, |&(first, last)| {
                assert_eq!(first, 1, "{ctx}: key {key} in the first job");
                last
            });
            match after.get(key) {
                Some(&(first, last)) => {
                    assert_eq!(last, total, "{ctx}: key {key} ends early");
                    assert!(
                        first <= committed_before + 1,
                        "{ctx}: key {key}: the first job committed up to {committed_before}, \
                         the second from {first}"
                    );
                }
                // Every record of the key came before the checkpoint.
                None => assert_eq!(committed_before, total, "{ctx}: key {key}"),
            }
        }
        assert!(
            after.values().any(|&(first, _)| first > 1),
            "{ctx}: no key had state to restore: {after:?}"
        );
        return;
    }
    panic!("no failing run completed a checkpoint first");
}
