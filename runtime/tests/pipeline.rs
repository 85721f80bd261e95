//! API-level tests of the DataStream API: chaining, the basic operators, partitioning, fan-out,
//! uids, validation, checkpointing defaults, memory storage and keyed process functions.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;
use support::Bounded;

use support::{assert_restored, assert_resumed};

use async_trait::async_trait;
use bytes::Bytes;
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;
use weir_checkpoint::storage::{CheckpointListing, JobLock};
use weir_checkpoint::{
    CheckpointError, CheckpointLocation, CheckpointMetadata, CheckpointStorage,
    OpendalCheckpointStorage,
};
use weir_core::CoreError;
use weir_core::handle::StreamStateHandle;
use weir_core::ids::OperatorId;
use weir_core::ids::{CheckpointId, JobId};
use weir_core::partition::Partitioner;
use weir_runtime::keyed::{Collector, KeyedContext, KeyedProcessFunction, KeyedStateRegistry};
use weir_runtime::operator::{Chained, OneInputOperator, OpResult, Output};
use weir_runtime::testing::Failures;
use weir_runtime::{
    DataStream, JobCanceller, JobError, JobResult, JobStatus, RestartStrategy, StorageConfig,
    StreamEnvironment, TaskError,
};
use weir_state::{ValueState, ValueStateDescriptor};

/// `failures` injected behind `stream` (`DataStream::inject_failures`).
fn inject(stream: DataStream<u64>, failures: &Arc<Failures>) -> DataStream<u64> {
    stream.inject_failures(failures)
}

/// The count of each key `i % keys` over `0..n`.
fn counts_mod(n: u64, keys: u64) -> BTreeMap<u64, i64> {
    let mut m = BTreeMap::new();
    for i in 0..n {
        *m.entry(i % keys).or_insert(0) += 1;
    }
    m
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

// ---------------------------------------------------------------------------------------------
// Chaining.
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn source_map_flat_map_chain_and_key_by_breaks_the_chain() {
    let env = StreamEnvironment::new();
    env.set_parallelism(2);
    let source = env.from_generator(Some(10_000), |i| i);
    let map = source.clone().map(|i: u64| i * 2);
    let flat = map.clone().flat_map(|i: u64| [i, i + 1]);
    let keyed = flat
        .clone()
        .map(|i: u64| (i % 5, 1i64))
        .key_by(|t: &(u64, i64)| &t.0);
    let sum = keyed.sum();
    // The sum's output is partitioned by its key: the sink chains to it without a shuffle.
    let totals = sum
        .clone()
        .reinterpret_as_keyed(|t: &(u64, i64)| &t.0)
        .latest_per_key();

    let job = env.job_graph().unwrap();
    assert_eq!(job.vertices.len(), 2, "{:#?}", job.vertices);
    let head = &job.vertices[0];
    assert!(head.is_source);
    assert_eq!(
        &head.nodes[..3],
        &[source.node_id(), map.node_id(), flat.node_id()]
    );
    assert!(
        head.name
            .starts_with("Generator Source -> Map -> FlatMap -> Map"),
        "{}",
        head.name
    );
    let tail = &job.vertices[1];
    assert!(!tail.is_source);
    assert_eq!(tail.nodes[0], sum.node_id());
    assert!(tail.name.starts_with("Sum"), "{}", tail.name);
    assert_eq!(job.edges.len(), 1);
    assert_eq!(job.edges[0].partitioner, Partitioner::Hash);
    assert_eq!(job.edges[0].target_node, sum.node_id());
    assert!(
        job.chained_edges
            .contains(&(source.node_id(), map.node_id()))
    );
    assert!(job.chained_edges.contains(&(map.node_id(), flat.node_id())));

    let r = env.execute().bounded().await.unwrap();
    assert_eq!(r.status, JobStatus::Finished);
    let mut expected = BTreeMap::new();
    for i in 0..10_000u64 {
        for x in [i * 2, i * 2 + 1] {
            *expected.entry(x % 5).or_insert(0i64) += 1;
        }
    }
    assert_eq!(totals.get(), expected);
}

#[test]
fn a_change_of_parallelism_breaks_the_chain_with_a_rebalance() {
    let env = StreamEnvironment::new();
    let source = env.from_generator(Some(10), |i| i).set_parallelism(2);
    let narrow = source.clone().map(|i: u64| (i, 1i64));
    narrow.clone().latest_per_key();
    let job = env.job_graph().unwrap();
    // source (2) | rebalance | map (1) | hash by key | latest-per-key sink (1)
    assert_eq!(job.vertices.len(), 3);
    let into_narrow: Vec<_> = job
        .edges
        .iter()
        .filter(|e| e.target_node == narrow.node_id())
        .collect();
    assert_eq!(into_narrow.len(), 1);
    assert_eq!(into_narrow[0].partitioner, Partitioner::Rebalance);
    assert_eq!(job.vertex(into_narrow[0].target).parallelism, 1);
    assert!(
        job.edges
            .iter()
            .any(|e| e.source_node == narrow.node_id() && e.partitioner == Partitioner::Hash),
        "latest_per_key keys by the first field"
    );
}

// ---------------------------------------------------------------------------------------------
// Operators and sources.
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn filter_keeps_exactly_what_the_predicate_accepts() {
    let env = StreamEnvironment::new();
    env.set_parallelism(2);
    let input: Vec<u64> = (0..5_000).collect();
    let kept = env
        .from_collection(input.clone())
        .filter(|x: &u64| x.is_multiple_of(3))
        .map(|x: u64| (x, x * x))
        .latest_per_key();
    env.execute().bounded().await.unwrap();
    let expected: BTreeMap<u64, u64> = input
        .into_iter()
        .filter(|x| x.is_multiple_of(3))
        .map(|x| (x, x * x))
        .collect();
    assert_eq!(kept.get(), expected);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn from_collection_emits_every_element_once_at_any_parallelism() {
    let input: Vec<String> = (0..3_000).map(|i| format!("w{}", i % 37)).collect();
    let mut expected: BTreeMap<String, i64> = BTreeMap::new();
    for w in &input {
        *expected.entry(w.clone()).or_insert(0) += 1;
    }
    for parallelism in 1..=4 {
        let env = StreamEnvironment::new();
        env.set_parallelism(parallelism);
        let totals = env
            .from_collection(input.clone())
            .map(|w: String| (w, 1i64))
            .key_by(|t: &(String, i64)| &t.0)
            .sum()
            .latest_per_key();
        env.execute().bounded().await.unwrap();
        assert_eq!(totals.get(), expected, "parallelism {parallelism}");
    }
}

/// A sum keyed by the field it sums: each record's key is its value before the sum, as Flink's
/// `keyBy(1).sum(1)` reads it (the batch's running-sum cache once compared keys that records
/// already held the totals in).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sum_keyed_by_its_summed_field_keys_each_record_by_its_value_before_the_sum() {
    let input: Vec<(u64, u64)> = (0..3_000u64)
        .map(|i| (i, [5, 5, 34, 68, 5, 7][(i % 6) as usize]))
        .collect();
    // Per key (the value), the running totals it emits: key v's n-th record emits n * v.
    let mut expected: Vec<u64> = Vec::new();
    let mut seen: BTreeMap<u64, u64> = BTreeMap::new();
    for (_, v) in &input {
        let n = seen.entry(*v).or_insert(0);
        *n += 1;
        expected.push(*n * v);
    }
    expected.sort_unstable();
    for parallelism in [1, 2] {
        let env = StreamEnvironment::new();
        env.set_parallelism(parallelism);
        let out = env
            .from_collection(input.clone())
            .key_by(|t: &(u64, u64)| &t.1)
            .sum()
            .collect();
        env.execute().bounded().await.unwrap();
        let mut got: Vec<u64> = out.records().into_iter().map(|t| t.1).collect();
        got.sort_unstable();
        assert_eq!(got, expected, "parallelism {parallelism}");
    }
}

/// Replaces each record by `(its subtask's index, 1)`.
struct TagWithSubtask(u64);

impl<T: Send + 'static> OneInputOperator<T> for TagWithSubtask {
    type Out = (u64, i64);

    fn process(&mut self, _record: T, out: &mut dyn Output<(u64, i64)>) -> OpResult {
        out.push((self.0, 1))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rebalance_deals_records_round_robin_to_every_subtask() {
    let records = 30_001u64;
    let env = StreamEnvironment::new();
    env.set_parallelism(3);
    let source = env.from_generator(Some(records), |i| i).set_parallelism(1);
    let per_subtask = source
        .rebalance()
        .transform::<(u64, i64)>("Tag", |ctx, next| {
            Box::new(Chained::new(
                TagWithSubtask(u64::from(ctx.info.index)),
                next,
            ))
        })
        .key_by(|t: &(u64, i64)| &t.0)
        .sum()
        .latest_per_key();
    let job = env.job_graph().unwrap();
    assert_eq!(job.edges[0].partitioner, Partitioner::Rebalance);
    env.execute().bounded().await.unwrap();
    let counts = per_subtask.get();
    assert_eq!(
        counts.keys().copied().collect::<Vec<_>>(),
        vec![0, 1, 2],
        "{counts:?}"
    );
    assert_eq!(counts.values().sum::<i64>(), records as i64);
    let (min, max) = (
        counts.values().min().unwrap(),
        counts.values().max().unwrap(),
    );
    assert!(max - min <= 1, "not round robin: {counts:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_consumed_twice_feeds_both_sinks() {
    let env = StreamEnvironment::new();
    env.set_parallelism(2);
    let doubled = env.from_generator(Some(20_000), |i| i).map(|i: u64| i * 2);
    let by_key = doubled
        .clone()
        .map(|i: u64| (i % 11, 1i64))
        .key_by(|t: &(u64, i64)| &t.0)
        .sum()
        .latest_per_key();
    let identity = doubled.clone().map(|i: u64| (i, i)).latest_per_key();
    let job = env.job_graph().unwrap();
    let outputs = job
        .stream_graph
        .edges
        .iter()
        .filter(|e| e.source == doubled.node_id())
        .count();
    assert_eq!(outputs, 2);
    env.execute().bounded().await.unwrap();
    let mut expected = BTreeMap::new();
    for i in 0..20_000u64 {
        *expected.entry((i * 2) % 11).or_insert(0i64) += 1;
    }
    assert_eq!(by_key.get(), expected);
    let all = identity.get();
    assert_eq!(all.len(), 20_000);
    assert!(all.iter().all(|(k, v)| k == v && k % 2 == 0));
}

// ---------------------------------------------------------------------------------------------
// uids.
// ---------------------------------------------------------------------------------------------

/// How the uid test job ends.
#[derive(Clone, Copy)]
enum Ending {
    /// `latest_per_key()`: a stateful sink, which cannot be given a uid.
    LatestPerKey,
    /// No sink: a stateless map records the largest running sum per key on the side.
    Spy,
}

/// generator → map (slowed until a checkpoint exists) → [filter] → key_by → sum → ending, with
/// uids on the source and the sum or on nothing. Returns the final sum per key.
///
/// A first run (`from` is `None`) stays slow and is cancelled once it has a complete
/// checkpoint, so that the checkpoint lies mid-stream: one taken after the input ended (which
/// the coordinator may trigger before the job's end) would leave a restored run no record to
/// resume with, and a spy nothing to see.
async fn uid_job(
    root: &Path,
    from: Option<&Path>,
    extra_filter: bool,
    uids: bool,
    ending: Ending,
) -> Result<(BTreeMap<u64, i64>, JobResult), JobError> {
    let env = StreamEnvironment::new();
    env.set_job_name("uid-test")
        .set_parallelism(2)
        .enable_checkpointing(Duration::from_millis(20))
        .set_checkpoint_dir(root);
    if let Some(from) = from {
        env.restore_from(from);
    }
    let source = env.from_generator(Some(200_000), |i| i);
    let source = if uids { source.uid("source") } else { source };
    // Slow (1 ms every 64 records) until the first checkpoint is complete, so that one is.
    let seen = AtomicU64::new(0);
    let first_run = from.is_none();
    let done = AtomicBool::new(false);
    let dir = root.to_path_buf();
    let mut stream = source.map(move |i: u64| {
        if first_run && seen.fetch_add(1, Ordering::Relaxed).is_multiple_of(16) {
            // 200k records take at least 12 s: the cancel comes long before the end.
            std::thread::sleep(Duration::from_millis(1));
        } else if !done.load(Ordering::Relaxed)
            && seen.fetch_add(1, Ordering::Relaxed).is_multiple_of(64)
        {
            if has_complete_checkpoint(&dir) {
                done.store(true, Ordering::Relaxed);
            } else {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        i
    });
    if extra_filter {
        stream = stream.filter(|_| true);
    }
    let sum = stream
        .map(|i: u64| (i % 13, 1i64))
        .key_by(|t: &(u64, i64)| &t.0)
        .sum();
    let sum = if uids { sum.uid("sum") } else { sum };
    match ending {
        Ending::LatestPerKey => {
            let totals = sum.latest_per_key();
            let result = run_uid_job(env, root, first_run).await?;
            Ok((totals.get(), result))
        }
        Ending::Spy => {
            let spy = Arc::new(std::sync::Mutex::new(BTreeMap::new()));
            let s = spy.clone();
            sum.map(move |(k, v): (u64, i64)| {
                let mut m = s.lock().unwrap();
                let e = m.entry(k).or_insert(v);
                *e = (*e).max(v);
            });
            let result = run_uid_job(env, root, first_run).await?;
            let m = spy.lock().unwrap().clone();
            Ok((m, result))
        }
    }
}

/// Runs a [`uid_job`]; a first run is cancelled once `root` holds a complete checkpoint.
async fn run_uid_job(
    env: StreamEnvironment,
    root: &Path,
    first_run: bool,
) -> Result<JobResult, JobError> {
    if !first_run {
        return env.execute().bounded().await;
    }
    let client = JobCanceller::default();
    let job = tokio::spawn(env.execute_with(client.clone()).bounded());
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while !has_complete_checkpoint(root) {
        assert!(
            !job.is_finished(),
            "the first run ended without a checkpoint"
        );
        assert!(
            std::time::Instant::now() < deadline,
            "no checkpoint in a minute"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    client.cancel();
    let result = job.await.unwrap()?;
    assert_eq!(
        result.status,
        JobStatus::Canceled,
        "the first run ended first"
    );
    Ok(result)
}

#[test]
fn uid_fixes_the_operator_id_and_auto_ids_follow_position() {
    let ids = |extra: bool| {
        let env = StreamEnvironment::new();
        let s = env.from_generator(Some(1), |i| i).uid("source");
        let s = if extra { s.filter(|_| true) } else { s };
        let a = s.clone().map(|i: u64| i + 1).uid("plus-one");
        let b = s.map(|i: u64| i + 2);
        a.clone().map(|i| (i, i)).latest_per_key();
        b.clone().map(|i| (i, i)).latest_per_key();
        let g = env.stream_graph();
        (
            g.node(a.node_id()).operator_id,
            g.node(b.node_id()).operator_id,
        )
    };
    let (a1, b1) = ids(false);
    let (a1_again, b1_again) = ids(false);
    let (a2, b2) = ids(true);
    assert_eq!(a1, OperatorId::from_uid("plus-one"));
    assert_eq!((a1, b1), (a1_again, b1_again), "ids are not deterministic");
    assert_eq!(a1, a2, "a uid'd operator's id changed with the graph");
    assert_ne!(b1, b2, "an auto id should follow the operator's position");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uids_let_a_changed_graph_restore_its_keyed_state() {
    let tmp = tempfile::tempdir().unwrap();
    let first = tmp.path().join("first");
    uid_job(&first, None, false, true, Ending::Spy)
        .await
        .unwrap();
    assert!(has_complete_checkpoint(&first));
    // A filter is inserted before the sum: the uid'd operators keep their state, so the running
    // sums resume where the checkpoint left them and end at the exact totals.
    let second = tmp.path().join("second");
    let (totals, result) = uid_job(&second, Some(&first), true, true, Ending::Spy)
        .await
        .unwrap();
    assert_eq!(totals, counts_mod(200_000, 13));
    assert_restored(&result, 200_000, "a filter inserted before the sum");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_uids_a_changed_graph_cannot_restore() {
    let tmp = tempfile::tempdir().unwrap();
    let first = tmp.path().join("first");
    uid_job(&first, None, false, false, Ending::Spy)
        .await
        .unwrap();
    assert!(has_complete_checkpoint(&first));
    let second = tmp.path().join("second");
    match uid_job(&second, Some(&first), true, false, Ending::Spy).await {
        Err(JobError::Restore { reason, .. }) => {
            assert!(reason.contains("maps to no operator"), "{reason}");
        }
        other => panic!("expected a restore error, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uids_let_a_changed_graph_with_a_latest_per_key_sink_restore() {
    let tmp = tempfile::tempdir().unwrap();
    let first = tmp.path().join("first");
    uid_job(&first, None, false, true, Ending::LatestPerKey)
        .await
        .unwrap();
    let second = tmp.path().join("second");
    let (totals, result) = uid_job(&second, Some(&first), true, true, Ending::LatestPerKey)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(totals, counts_mod(200_000, 13));
    assert_restored(
        &result,
        200_000,
        "a filter inserted before the sum, latest_per_key sink",
    );
}

// ---------------------------------------------------------------------------------------------
// Validation and defaults.
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parallelism_above_max_parallelism_is_an_error() {
    let build = |parallelism: u32, max: Option<u32>| {
        let env = StreamEnvironment::new();
        env.set_parallelism(parallelism);
        if let Some(m) = max {
            env.set_max_parallelism(m);
        }
        env.from_generator(Some(10), |i| (i, i)).latest_per_key();
        env
    };
    let env = build(200, Some(128));
    match env.job_graph() {
        Err(JobError::Graph(CoreError::InvalidParallelism {
            parallelism,
            max_parallelism,
            ..
        })) => assert_eq!((parallelism, max_parallelism), (200, 128)),
        other => panic!("expected InvalidParallelism, got {other:?}"),
    }
    let err = env
        .execute()
        .bounded()
        .await
        .expect_err("ran with parallelism > max");
    assert!(err.to_string().contains("max parallelism 128"), "{err}");
    // The default max parallelism grows with the parallelism, so 200 alone is fine.
    assert!(build(200, None).job_graph().is_ok());
    // One operator above the max is enough.
    let env = StreamEnvironment::new();
    env.set_max_parallelism(4);
    env.from_generator(Some(10), |i| (i, i))
        .set_parallelism(5)
        .latest_per_key();
    assert!(env.job_graph().is_err());
    assert!(env.execute().bounded().await.is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checkpointing_is_off_by_default() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("checkpoints");
    let env = StreamEnvironment::new();
    assert_eq!(env.config_mut().checkpoint.interval, None);
    env.set_checkpoint_dir(&root).set_parallelism(2);
    let totals = env
        .from_generator(Some(200_000), |i| (i % 7, 1i64))
        .key_by(|t: &(u64, i64)| &t.0)
        .sum()
        .latest_per_key();
    let r = env.execute().bounded().await.unwrap();
    assert_eq!(r.checkpoints_completed, 0);
    assert_eq!(r.checkpoints_failed, 0);
    assert!(r.latest_checkpoint.is_none());
    assert!(r.checkpoint_history.is_empty());
    assert_eq!(totals.get(), counts_mod(200_000, 7));
    let written = std::fs::read_dir(&root).map(|d| d.count()).unwrap_or(0);
    assert_eq!(written, 0, "something was written under {}", root.display());

    // Without checkpoints, the default restart strategy is no restart.
    let env = StreamEnvironment::new();
    env.set_checkpoint_dir(&root);
    env.from_generator(Some(10), |i| i)
        .map(|i: u64| {
            assert!(i < 5, "failing on purpose");
            (i, i)
        })
        .latest_per_key();
    match env.execute().bounded().await {
        Err(JobError::Failed { restarts: 0, .. }) => {}
        other => panic!("expected the job to fail without restarting, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn source_records_counts_every_record() {
    for (records, parallelism) in [(1_000u64, 1u32), (300_000, 1), (300_000, 3)] {
        let env = StreamEnvironment::new();
        env.set_parallelism(parallelism);
        env.from_generator(Some(records), |i| (i % 3, 1i64))
            .key_by(|t: &(u64, i64)| &t.0)
            .sum()
            .latest_per_key();
        let r = env.execute().bounded().await.unwrap();
        assert_eq!(
            r.source_records, records,
            "records={records} parallelism={parallelism}"
        );
    }
}

/// Runs an unbounded job until its map has seen `records` records, then cancels it. Returns the
/// result and what the map (chained behind the source) saw in all.
async fn cancel_after(records: u64) -> (weir_runtime::JobResult, u64) {
    let env = StreamEnvironment::new();
    env.set_parallelism(2);
    let seen = Arc::new(AtomicU64::new(0));
    let s = seen.clone();
    env.from_generator(None, |i| i)
        .map(move |i: u64| {
            s.fetch_add(1, Ordering::Relaxed);
            (i % 3, 1i64)
        })
        .key_by(|t: &(u64, i64)| &t.0)
        .sum()
        .latest_per_key();
    let canceller = JobCanceller::default();
    let c = canceller.clone();
    let s = seen.clone();
    tokio::spawn(async move {
        while s.load(Ordering::Relaxed) < records {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        c.cancel();
    });
    let result = tokio::time::timeout(Duration::from_secs(60), env.execute_with(canceller))
        .await
        .expect("the cancelled job did not stop")
        .unwrap();
    (result, seen.load(Ordering::Relaxed))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_canceller_stops_an_unbounded_job() {
    let (r, seen) = cancel_after(10_000).await;
    assert_eq!(r.status, JobStatus::Canceled);
    assert_eq!(r.restarts, 0);
    assert!(seen >= 10_000);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn source_records_of_a_cancelled_job_counts_what_was_emitted() {
    let (r, seen) = cancel_after(10_000).await;
    assert!(
        r.source_records >= seen,
        "sources emitted {} by the count, the map saw {seen}",
        r.source_records
    );
}

// ---------------------------------------------------------------------------------------------
// Memory storage, and keyed process functions, under failures.
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_storage_with_checkpoints_and_a_failure_is_exact() {
    let mut records = 400_000u64;
    for _ in 0..4 {
        let env = StreamEnvironment::new();
        env.set_parallelism(2)
            .enable_checkpointing(Duration::from_millis(10))
            .set_checkpoint_storage(StorageConfig::Memory);
        let failures = Failures::at(vec![records / 2]);
        let totals = inject(
            env.from_generator(Some(records), |i| i).uid("source"),
            &failures,
        )
        .map(|i: u64| (i % 17, 1i64))
        .key_by(|t: &(u64, i64)| &t.0)
        .sum()
        .uid("sum")
        .latest_per_key();
        let r = env.execute().bounded().await.unwrap();
        assert_eq!(r.restarts, 1);
        assert_resumed(&r, records, "one failure half way");
        assert_eq!(totals.get(), counts_mod(records, 17));
        if r.checkpoints_completed > 0 {
            let latest = r.latest_checkpoint.unwrap();
            assert!(latest.starts_with("memory://"), "{latest}");
            return;
        }
        records *= 4;
    }
    panic!("no run completed a checkpoint");
}

/// Per key: the count of records and the largest value, in two value states.
#[derive(Default)]
struct CountAndMax {
    count: Option<ValueState<i64>>,
    max: Option<ValueState<i64>>,
}

impl KeyedProcessFunction<u64, (u64, i64), (u64, (i64, i64))> for CountAndMax {
    fn open(&mut self, states: &mut KeyedStateRegistry<'_, u64>) -> Result<(), TaskError> {
        self.count = Some(states.value_state(&ValueStateDescriptor::new("count"))?);
        self.max = Some(states.value_state(&ValueStateDescriptor::new("max"))?);
        Ok(())
    }

    fn process_element(
        &mut self,
        (_, value): (u64, i64),
        ctx: &mut KeyedContext<'_, u64>,
        out: &mut Collector<'_, (u64, (i64, i64))>,
    ) -> Result<(), TaskError> {
        let (count_state, max_state) = (self.count.unwrap(), self.max.unwrap());
        let count = ctx.value(count_state).copied().unwrap_or(0) + 1;
        let max = ctx
            .value(max_state)
            .copied()
            .map_or(value, |m| m.max(value));
        ctx.update(count_state, count);
        ctx.update(max_state, max);
        out.collect((*ctx.current_key(), (count, max)))
    }
}

fn value_of(i: u64) -> i64 {
    (weir_runtime::source::splitmix64(i) % 1_000_000) as i64
}

async fn count_and_max_run(
    root: &Path,
    records: u64,
    thresholds: Vec<u64>,
) -> BTreeMap<u64, (i64, i64)> {
    let env = StreamEnvironment::new();
    env.set_job_name("count-and-max")
        .set_parallelism(2)
        .enable_checkpointing(Duration::from_millis(25))
        .set_checkpoint_dir(root);
    let failures = Failures::at(thresholds.clone());
    let out = inject(
        env.from_generator(Some(records), |i| i).uid("source"),
        &failures,
    )
    .map(|i: u64| (i % 31, value_of(i)))
    .key_by(|t: &(u64, i64)| &t.0)
    .process("CountAndMax", CountAndMax::default)
    .uid("count-and-max")
    .latest_per_key();
    let r = env.execute().bounded().await.unwrap();
    assert_eq!(r.restarts as usize, thresholds.len());
    assert_resumed(&r, records, "failures at the thresholds");
    assert_eq!(r.status, JobStatus::Finished);
    out.get()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keyed_process_function_with_two_value_states_is_exact_under_failures() {
    let records = 300_000u64;
    let tmp = tempfile::tempdir().unwrap();
    let clean = count_and_max_run(&tmp.path().join("clean"), records, Vec::new()).await;
    let mut expected: BTreeMap<u64, (i64, i64)> = BTreeMap::new();
    for i in 0..records {
        let e = expected.entry(i % 31).or_insert((0, i64::MIN));
        e.0 += 1;
        e.1 = e.1.max(value_of(i));
    }
    assert_eq!(clean, expected, "failure-free run");
    let thresholds = vec![records / 5, records / 2, records * 4 / 5];
    let faulty = count_and_max_run(&tmp.path().join("faulty"), records, thresholds).await;
    assert_eq!(faulty, clean);
}

/// Sleeps when dropped, so that a failed task's report is sent well after its outputs closed.
struct SlowDrop;

impl Drop for SlowDrop {
    fn drop(&mut self) {
        std::thread::sleep(Duration::from_millis(200));
    }
}

impl OneInputOperator<u64> for SlowDrop {
    type Out = u64;

    fn process(&mut self, _record: u64, _out: &mut dyn Output<u64>) -> OpResult {
        Ok(())
    }
}

/// A job that fails reports the failure that caused it, not its consequence downstream. The
/// panicking task's chain is dropped before its failure is reported: its writer closes both
/// channels to the two sum subtasks, and a slow-to-drop second branch then holds the report back
/// while a sum subtask reports its input closed. (Without the slow drop the same race is lost now
/// and then under load: about 1 run in 100 of the word count with `NoRestart`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_job_reports_the_root_cause() {
    let env = StreamEnvironment::new();
    env.set_parallelism(2)
        .set_restart_strategy(RestartStrategy::NoRestart);
    let failures = Failures::at(vec![5_000]);
    let source = env.from_generator(Some(100_000), |i| i).set_parallelism(1);
    let numbers = inject(source, &failures).set_parallelism(1);
    numbers
        .clone()
        .map(|i: u64| (i % 3, 1i64))
        .set_parallelism(1)
        .key_by(|t: &(u64, i64)| &t.0)
        .sum()
        .latest_per_key();
    numbers
        .transform::<u64>("Slow Drop", |_, next| {
            Box::new(Chained::new(SlowDrop, next))
        })
        .set_parallelism(1);
    match env.execute().bounded().await {
        Err(JobError::Failed { cause, .. }) => {
            assert!(cause.contains("injected failure"), "cause: {cause}");
        }
        other => panic!("expected JobError::Failed, got {other:?}"),
    }
}

// ---------------------------------------------------------------------------------------------
// Custom checkpoint storage.
// ---------------------------------------------------------------------------------------------

/// Checkpoint storage in a local directory whose writes can start failing after a number of
/// `_metadata` writes, and whose `_metadata` writes can be slow.
struct TestStorage {
    inner: OpendalCheckpointStorage,
    /// Writes fail once this many `_metadata` writes succeeded.
    fail_after_metadata: Option<u64>,
    metadata_delay: Duration,
    metadata_written: AtomicU64,
    failed_writes: AtomicU64,
    /// Writes and discards started and not yet ended.
    in_flight: Arc<AtomicU64>,
}

/// Counts one storage operation in flight while it lives.
struct InFlight(Arc<AtomicU64>);

impl InFlight {
    fn start(count: &Arc<AtomicU64>) -> InFlight {
        count.fetch_add(1, Ordering::SeqCst);
        InFlight(count.clone())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl TestStorage {
    fn new(dir: &Path, fail_after_metadata: Option<u64>, metadata_delay: Duration) -> Arc<Self> {
        Arc::new(TestStorage {
            inner: OpendalCheckpointStorage::fs(dir)
                .unwrap()
                .with_inline_threshold(0),
            fail_after_metadata,
            metadata_delay,
            metadata_written: AtomicU64::new(0),
            failed_writes: AtomicU64::new(0),
            in_flight: Arc::new(AtomicU64::new(0)),
        })
    }

    fn check(&self, what: &str) -> Result<(), CheckpointError> {
        let broken = self
            .fail_after_metadata
            .is_some_and(|n| self.metadata_written.load(Ordering::SeqCst) >= n);
        if broken {
            self.failed_writes.fetch_add(1, Ordering::SeqCst);
            return Err(CheckpointError::Config(format!(
                "injected storage failure: {what}"
            )));
        }
        Ok(())
    }
}

#[async_trait]
impl CheckpointStorage for TestStorage {
    fn describe(&self) -> String {
        self.inner.describe()
    }

    async fn check_writable(&self) -> Result<(), CheckpointError> {
        self.inner.check_writable().await
    }

    async fn init_location(
        &self,
        job: JobId,
        id: CheckpointId,
    ) -> Result<CheckpointLocation, CheckpointError> {
        let _op = InFlight::start(&self.in_flight);
        self.check("init_location")?;
        self.inner.init_location(job, id).await
    }

    async fn write_state(
        &self,
        location: &CheckpointLocation,
        name: &str,
        bytes: Bytes,
    ) -> Result<StreamStateHandle, CheckpointError> {
        let _op = InFlight::start(&self.in_flight);
        self.check("write_state")?;
        self.inner.write_state(location, name, bytes).await
    }

    async fn read_state(
        &self,
        location: &CheckpointLocation,
        handle: &StreamStateHandle,
        range: Option<(u64, u64)>,
    ) -> Result<Bytes, CheckpointError> {
        self.inner.read_state(location, handle, range).await
    }

    async fn write_shared_state(
        &self,
        location: &CheckpointLocation,
        name: &str,
        bytes: Bytes,
    ) -> Result<StreamStateHandle, CheckpointError> {
        let _op = InFlight::start(&self.in_flight);
        self.check("write_state")?;
        self.inner.write_shared_state(location, name, bytes).await
    }

    async fn discard_state(
        &self,
        location: &CheckpointLocation,
        handle: &StreamStateHandle,
    ) -> Result<(), CheckpointError> {
        let _op = InFlight::start(&self.in_flight);
        self.inner.discard_state(location, handle).await
    }

    async fn write_metadata(
        &self,
        location: &CheckpointLocation,
        metadata: &CheckpointMetadata,
    ) -> Result<(), CheckpointError> {
        let _op = InFlight::start(&self.in_flight);
        self.check("write_metadata")?;
        tokio::time::sleep(self.metadata_delay).await;
        self.inner.write_metadata(location, metadata).await?;
        self.metadata_written.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }

    async fn read_metadata(
        &self,
        location: &CheckpointLocation,
    ) -> Result<CheckpointMetadata, CheckpointError> {
        self.inner.read_metadata(location).await
    }

    async fn discard(&self, location: &CheckpointLocation) -> Result<(), CheckpointError> {
        let _op = InFlight::start(&self.in_flight);
        self.inner.discard(location).await
    }

    async fn list_checkpoints(
        &self,
        job: JobId,
    ) -> Result<Vec<CheckpointListing>, CheckpointError> {
        self.inner.list_checkpoints(job).await
    }

    async fn find_checkpoints(
        &self,
        path: &str,
    ) -> Result<Vec<CheckpointListing>, CheckpointError> {
        self.inner.find_checkpoints(path).await
    }

    async fn read_lock(&self, job: JobId) -> Result<Option<JobLock>, CheckpointError> {
        self.inner.read_lock(job).await
    }

    async fn take_lock(
        &self,
        job: JobId,
        generation: u64,
        content: &str,
    ) -> Result<(), CheckpointError> {
        self.inner.take_lock(job, generation, content).await
    }

    async fn renew_lock(
        &self,
        job: JobId,
        generation: u64,
        content: &str,
    ) -> Result<(), CheckpointError> {
        self.inner.renew_lock(job, generation, content).await
    }

    async fn release_lock(&self, job: JobId, generation: u64) -> Result<(), CheckpointError> {
        self.inner.release_lock(job, generation).await
    }

    async fn list_files(&self, dir: &str) -> Result<Vec<String>, CheckpointError> {
        self.inner.list_files(dir).await
    }

    async fn delete_file(&self, path: &str) -> Result<(), CheckpointError> {
        self.inner.delete_file(path).await
    }
}

/// Storage whose writes start failing after the first complete checkpoint fails checkpoints,
/// not the job. The job is slowed until a write has failed, so failures are certain.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn storage_failing_mid_run_fails_checkpoints_not_the_job() {
    let tmp = tempfile::tempdir().unwrap();
    let storage = TestStorage::new(tmp.path(), Some(1), Duration::ZERO);
    let records = 300_000u64;
    let env = StreamEnvironment::new();
    env.set_parallelism(2)
        .enable_checkpointing(Duration::from_millis(20))
        .set_checkpoint_storage(StorageConfig::Custom(storage.clone()));
    let s = storage.clone();
    let seen = AtomicU64::new(0);
    let totals = env
        .from_generator(Some(records), |i| i)
        .map(move |i: u64| {
            if seen.fetch_add(1, Ordering::Relaxed).is_multiple_of(64)
                && s.failed_writes.load(Ordering::SeqCst) == 0
            {
                std::thread::sleep(Duration::from_millis(1));
            }
            (i % 7, 1i64)
        })
        .key_by(|t: &(u64, i64)| &t.0)
        .sum()
        .latest_per_key();
    let r = env
        .execute()
        .bounded()
        .await
        .unwrap_or_else(|e| panic!("the job failed: {e}"));
    assert_eq!(r.status, JobStatus::Finished);
    assert_eq!(r.restarts, 0);
    assert!(r.checkpoints_completed >= 1, "{r:?}");
    assert!(r.checkpoints_failed >= 1, "{r:?}");
    assert!(storage.failed_writes.load(Ordering::SeqCst) >= 1);
    assert_eq!(totals.get(), counts_mod(records, 7));
}

/// The `chk-<n>` directories holding a `_metadata`, with their ids.
fn dirs_with_metadata(root: &Path) -> Vec<(u64, std::path::PathBuf)> {
    let mut found = Vec::new();
    for job in std::fs::read_dir(root).into_iter().flatten().flatten() {
        for chk in std::fs::read_dir(job.path())
            .into_iter()
            .flatten()
            .flatten()
        {
            let name = chk.file_name().to_string_lossy().into_owned();
            if let Some(id) = name.strip_prefix("chk-").and_then(|n| n.parse().ok())
                && chk.path().join("_metadata").is_file()
            {
                found.push((id, chk.path()));
            }
        }
    }
    found
}

/// A `_metadata` on disk means a complete checkpoint. When a job ends (or fails over) while a
/// checkpoint's `_metadata` is being written, the job master aborts that checkpoint and discards
/// its directory while the write goes on, which can leave a `_metadata` whose state files were
/// deleted. Slow `_metadata` writes make that window wide.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checkpoint_aborted_while_finalizing_leaves_no_metadata() {
    for run in 0..5 {
        let tmp = tempfile::tempdir().unwrap();
        let storage = TestStorage::new(tmp.path(), None, Duration::from_millis(100));
        let env = StreamEnvironment::new();
        env.set_parallelism(2)
            .enable_checkpointing(Duration::from_millis(5))
            .set_checkpoint_storage(StorageConfig::Custom(storage.clone()));
        env.from_generator(Some(200_000), |i| (i % 1000, 1i64))
            .key_by(|t: &(u64, i64)| &t.0)
            .sum()
            .latest_per_key();
        let r = env.execute().bounded().await.unwrap();
        // The job's writes and discards ended with it: nothing can land after this look.
        assert_eq!(
            storage.in_flight.load(Ordering::SeqCst),
            0,
            "run {run}: storage operations outlived the job"
        );
        let latest = r
            .latest_checkpoint
            .as_deref()
            .and_then(|l| l.rsplit("chk-").next())
            .and_then(|n| n.parse::<u64>().ok())
            .unwrap_or(0);
        for (id, dir) in dirs_with_metadata(tmp.path()) {
            assert!(
                id <= latest,
                "run {run}: {} has a _metadata, but the job's latest checkpoint is chk-{latest}; \
                 files: {:?}",
                dir.display(),
                std::fs::read_dir(&dir)
                    .unwrap()
                    .flatten()
                    .map(|e| e.file_name())
                    .collect::<Vec<_>>()
            );
        }
    }
}

#[test]
fn restart_strategy_defaults_follow_checkpointing() {
    let env = StreamEnvironment::new();
    assert_eq!(
        env.config_mut().restart_strategy(),
        RestartStrategy::NoRestart
    );
    env.enable_checkpointing(Duration::from_secs(1));
    assert_eq!(
        env.config_mut().restart_strategy(),
        RestartStrategy::default_with_checkpointing()
    );
}

/// `reinterpret_as_keyed` on a stream that is not partitioned by the key is reported, not
/// silently wrong.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reinterpreting_an_unpartitioned_stream_as_keyed_is_a_clear_error() {
    let env = StreamEnvironment::new();
    env.set_parallelism(2)
        .set_restart_strategy(RestartStrategy::NoRestart);
    env.from_generator(Some(10_000), |i| (i, 1i64))
        .reinterpret_as_keyed(|t: &(u64, i64)| &t.0)
        .latest_per_key();
    match env.execute().bounded().await {
        Err(JobError::Failed { cause, .. }) => {
            assert!(cause.contains("not partitioned by that key"), "{cause}")
        }
        other => panic!("expected a clear failure, got {other:?}"),
    }
}

/// The generator's split enumerator is an operator coordinator: every checkpoint records its
/// unassigned splits (taken before the barriers were injected), and a restore at another
/// parallelism hands each split out exactly once (restored readers keep theirs, the enumerator
/// the rest).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn split_enumerator_state_is_checkpointed_and_splits_are_reassigned_on_restore() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("checkpoints");
    let records = 400_000u64;
    let job = |parallelism: u32, from: Option<&Path>, fail_at: Option<u64>| {
        let env = StreamEnvironment::new();
        env.set_parallelism(parallelism)
            .set_max_parallelism(128)
            .set_restart_strategy(RestartStrategy::NoRestart)
            .enable_checkpointing(Duration::from_millis(5))
            .set_checkpoint_dir(&root);
        env.checkpoint_config().num_retained = 3;
        if let Some(f) = from {
            env.restore_from(f);
        }
        let seen = Arc::new(AtomicU64::new(0));
        let totals = env
            .from_generator(Some(records), |i| i)
            .uid("source")
            .map(move |i: u64| {
                let n = seen.fetch_add(1, Ordering::Relaxed);
                if fail_at.is_some_and(|f| n == f) {
                    panic!("failing on purpose after {n} records");
                }
                // Slow enough for checkpoints to land while splits are still unassigned.
                if n.is_multiple_of(4096) {
                    std::thread::sleep(Duration::from_millis(1));
                }
                (i % 7, 1i64)
            })
            .uid("pairs")
            .key_by(|t: &(u64, i64)| &t.0)
            .sum()
            .uid("sum")
            .reinterpret_as_keyed(|t: &(u64, i64)| &t.0)
            .latest_per_key();
        (env, totals)
    };
    let (env, _) = job(2, None, Some(records / 3));
    assert!(matches!(
        env.execute().bounded().await,
        Err(JobError::Failed { .. })
    ));

    // Every complete checkpoint records the enumerator's state for the source.
    let storage = OpendalCheckpointStorage::fs(&root).unwrap();
    let job_dir = std::fs::read_dir(&root)
        .unwrap()
        .flatten()
        .find(|e| e.path().is_dir())
        .unwrap()
        .file_name();
    let job_id = JobId::parse(&job_dir.to_string_lossy()).unwrap();
    let complete: Vec<CheckpointListing> = storage
        .list_checkpoints(job_id)
        .await
        .unwrap()
        .into_iter()
        .filter(|l| l.complete)
        .collect();
    assert!(
        !complete.is_empty(),
        "no checkpoint completed before the failure"
    );
    let mut saw_unassigned = false;
    for l in &complete {
        let meta = storage.read_metadata(&l.location).await.unwrap();
        let source = meta
            .operators
            .iter()
            .find(|o| o.operator_id == OperatorId::from_uid("source"))
            .unwrap();
        let state = source
            .coordinator_state
            .as_ref()
            .unwrap_or_else(|| panic!("checkpoint {} has no enumerator state", l.id));
        // Encoded unassigned splits: more than an empty list means splits were still waiting.
        saw_unassigned |= state.len() > 1;
    }
    assert!(saw_unassigned, "no checkpoint caught unassigned splits");

    // Restore at a higher and at a lower parallelism: every record exactly once.
    let expected = counts_mod(records, 7);
    for p in [3, 1] {
        let (env, totals) = job(p, Some(&root), None);
        let r = env.execute().bounded().await.unwrap();
        assert_eq!(totals.get(), expected, "restored at parallelism {p}");
        assert_restored(&r, records, &format!("restored at parallelism {p}"));
    }
}

/// A busy task hands over a partly filled batch within the buffer timeout: the one record of an
/// unbounded job that goes to the other subtask (every other record has one key, on one
/// subtask) reaches its keyed operator although the sources never run dry and no checkpoint
/// or other event flushes the channel.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lone_record_leaves_a_busy_task_within_the_buffer_timeout() {
    use weir_core::keygroup::{
        assign_to_key_group, compute_default_max_parallelism, compute_operator_index_for_key_group,
    };
    let max_p = compute_default_max_parallelism(2);
    let subtask =
        |k: u64| compute_operator_index_for_key_group(max_p, 2, assign_to_key_group(&k, max_p));
    let common = 0u64;
    let rare = (1..).find(|&k| subtask(k) != subtask(common)).unwrap();
    let env = StreamEnvironment::new();
    env.set_parallelism(2);
    let (seen, emitted) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicU64::new(0)),
    );
    let (s, e) = (seen.clone(), emitted.clone());
    env.from_generator(None, |i| i)
        .map(move |i: u64| {
            e.fetch_add(1, Ordering::Relaxed);
            (if i == 1_000 { rare } else { common }, 1i64)
        })
        .key_by(|t: &(u64, i64)| &t.0)
        .sum()
        .map(move |t: (u64, i64)| {
            if t.0 == rare {
                s.store(true, Ordering::SeqCst);
            }
            t
        })
        .latest_per_key();
    let canceller = JobCanceller::default();
    let job = tokio::spawn(tokio::time::timeout(
        Duration::from_secs(60),
        env.execute_with(canceller.clone()),
    ));
    let start = std::time::Instant::now();
    while !seen.load(Ordering::SeqCst) && start.elapsed() < Duration::from_secs(20) {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let (arrived, after) = (seen.load(Ordering::SeqCst), start.elapsed());
    let records = emitted.load(Ordering::Relaxed);
    canceller.cancel();
    let result = job
        .await
        .unwrap()
        .expect("the cancelled job did not stop")
        .unwrap();
    assert_eq!(result.status, JobStatus::Canceled);
    assert!(
        arrived,
        "the lone record for subtask {} never arrived in {after:?} ({records} records emitted)",
        subtask(rare)
    );
}
