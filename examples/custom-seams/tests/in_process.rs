//! The word count in one process on all three custom seams (a `BTreeMapStore` per keyed
//! subtask, `counting://` checkpoint storage, a counting transport): exactly once through three
//! injected failures, and through a restore at another parallelism in a new environment. The
//! results are checked against counts computed here without the engine, and each seam's
//! counters show the engine went through it on every path.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;
use support::{assert_exactly_once, bounded, expected_totals, read_committed};

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use weir_example_custom_seams::job::WORDS;
use weir_example_custom_seams::{
    JobOptions, StorageCounters, configure, register_scheme, running_counts,
};
use weir_runtime::testing::Injector;
use weir_runtime::{JobStatus, StreamEnvironment};

const SEED: u64 = 7;

/// Fails the job at each threshold of records seen (over all subtasks and attempts), but only
/// once a checkpoint completed since the previous failure (so that every restart restores
/// state) and at most once per attempt. Sleeps 1 ms every `pace_every` records, so that
/// checkpoints complete between the failures.
struct FailAfterCheckpoints {
    thresholds: Vec<u64>,
    pace_every: u64,
    storage: Arc<StorageCounters>,
    seen: AtomicU64,
    /// Failures injected, the checkpoints completed at the last one, and the attempt it failed.
    state: Mutex<(usize, u64, Option<u32>)>,
}

impl FailAfterCheckpoints {
    fn new(thresholds: Vec<u64>, pace_every: u64, storage: &Arc<StorageCounters>) -> Arc<Self> {
        Arc::new(FailAfterCheckpoints {
            thresholds,
            pace_every,
            storage: storage.clone(),
            seen: AtomicU64::new(0),
            state: Mutex::new((0, 0, None)),
        })
    }

    fn injected(&self) -> usize {
        self.state.lock().unwrap().0
    }
}

impl Injector for FailAfterCheckpoints {
    fn record(&self, attempt: u32) {
        let n = self.seen.fetch_add(1, Ordering::Relaxed) + 1;
        if self.pace_every != 0 && n.is_multiple_of(self.pace_every) {
            std::thread::sleep(Duration::from_millis(1));
        }
        let mut state = self.state.lock().unwrap();
        let (injected, completed_then, failed_attempt) = *state;
        let completed = self.storage.get().metadata_writes;
        if self.thresholds.get(injected).is_some_and(|&t| n >= t)
            && completed > completed_then
            && failed_attempt.is_none_or(|a| attempt > a)
        {
            *state = (injected + 1, completed, Some(attempt));
            drop(state);
            panic!("injected failure {} in attempt {attempt}", injected + 1);
        }
    }
}

/// A job on all three custom seams, checkpointing into a fresh directory under `scheme`.
fn options(scheme: &str, dir: &std::path::Path, records: u64, parallelism: u32) -> JobOptions {
    JobOptions {
        name: "custom-seams-in-process".to_string(),
        records,
        seed: SEED,
        parallelism,
        checkpoint_interval: Duration::from_millis(10),
        checkpoint_root: format!("{scheme}://{}", dir.display()),
        ..JobOptions::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_failures_restore_through_every_custom_seam_exactly_once() {
    const RECORDS: u64 = 200_000;
    const P: u32 = 2;
    let storage = register_scheme("counting-failover").unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let mut opts = options("counting-failover", tmp.path(), RECORDS, P);
    opts.restart_attempts = 3;
    let env = StreamEnvironment::new();
    let seams = configure(&env, &opts).unwrap();
    let failures = FailAfterCheckpoints::new(vec![40_000, 90_000, 140_000], 500, &storage);
    let committed = running_counts(&env, &opts, &failures).collect();

    let r = bounded("the job", env.execute()).await.unwrap();

    assert_eq!(r.status, JobStatus::Finished);
    assert_eq!(failures.injected(), 3);
    assert_eq!(r.restarts, 3);
    assert!(
        r.restored_from
            .as_deref()
            .is_some_and(|f| f.starts_with("counting-failover:///")),
        "restored from {:?}",
        r.restored_from
    );
    assert_exactly_once(&committed.records(), &expected_totals(RECORDS, SEED));

    // The store: one per sum subtask per attempt; processed, frozen for every checkpoint, and
    // loaded with the restored entries in each restarted attempt.
    let store = seams.state.counters().get();
    assert_eq!(store.created, u64::from(P) * 4, "{store:?}");
    assert_eq!(store.created_for_restarts, u64::from(P) * 3, "{store:?}");
    assert_eq!(
        store.created_restoring,
        u64::from(P) * 3,
        "every restart restores a checkpoint: {store:?}"
    );
    assert!(store.gets > 0 && store.puts > 0, "{store:?}");
    assert!(
        store.freezes >= r.checkpoints_completed * u64::from(P),
        "{store:?}"
    );
    assert!(
        store.frozen_scans > 0,
        "no snapshot was written out: {store:?}"
    );
    assert!(store.puts_in_restarts > 0, "{store:?}");
    // Each of the 3 restores puts the words of the checkpoint it restored (at least one, at
    // most all 16) into the new stores before any read: each word once, in the store of the
    // subtask that owns it.
    assert!(
        (3..=3 * WORDS.len() as u64).contains(&store.load_puts),
        "{store:?}"
    );

    // The storage: every checkpoint written through it, and read back at each restore.
    let counts = storage.get();
    assert_eq!(
        counts.metadata_writes, r.checkpoints_completed,
        "{counts:?}"
    );
    assert!(counts.state_writes > 0, "{counts:?}");
    assert!(counts.metadata_reads >= 3, "{counts:?}");
    assert!(counts.state_reads > 0, "{counts:?}");

    // The transport: every attempt (a deployment generation) opened both ends of the keyed
    // exchange's P × P channels through it.
    let opened = seams.transport.opened();
    assert_eq!(opened.len(), 4, "{opened:?}");
    for o in opened.values() {
        assert_eq!((o.outputs, o.inputs), (u64::from(P * P), u64::from(P * P)));
    }
    assert!(seams.transport.elements_sent.load(Ordering::SeqCst) > 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_job_restores_at_another_parallelism_from_its_counting_url() {
    const RECORDS: u64 = 120_000;
    let storage = register_scheme("counting-rescale").unwrap();
    let tmp = tempfile::tempdir().unwrap();
    // Both runs commit into one directory through the exactly-once file sink: a transaction
    // the first run committed and the checkpoint still lists as pending is committed again by
    // the second, and the sink's commits are idempotent per `part-<subtask>-<transaction>`.
    let output = tmp.path().join("output");

    // Parallelism 2, failing (without restart) once a checkpoint completed past half the input.
    let first_opts = options("counting-rescale", tmp.path(), RECORDS, 2);
    let env = StreamEnvironment::new();
    let first = configure(&env, &first_opts).unwrap();
    let fail = FailAfterCheckpoints::new(vec![RECORDS / 2], 250, &storage);
    running_counts(&env, &first_opts, &fail)
        .write_to_files(&output)
        .uid("sink");
    let failed = bounded("the first run", env.execute()).await;
    assert!(failed.is_err(), "the first run did not fail: {failed:?}");
    assert_eq!(fail.injected(), 1);
    let before = storage.get();
    assert_eq!(
        (before.metadata_reads, before.state_reads),
        (0, 0),
        "a fresh run read state"
    );
    let latest = storage.completed().last().cloned().expect("a checkpoint");
    assert!(latest.starts_with("counting-rescale:///"), "{latest}");

    // Parallelism 3, in a new environment, from that checkpoint's URL.
    let mut second_opts = options("counting-rescale", tmp.path(), RECORDS, 3);
    second_opts.from = Some(latest.clone());
    let env = StreamEnvironment::new();
    let second = configure(&env, &second_opts).unwrap();
    let none = FailAfterCheckpoints::new(Vec::new(), 0, &storage);
    running_counts(&env, &second_opts, &none)
        .write_to_files(&output)
        .uid("sink");
    let r = bounded("the restored run", env.execute()).await.unwrap();

    assert_eq!(r.status, JobStatus::Finished);
    assert_eq!(r.restarts, 0);
    assert_eq!(r.restored_from.as_deref(), Some(latest.as_str()));
    assert!(
        r.source_records_since_restore < RECORDS,
        "the sources started over: {} of {RECORDS}",
        r.source_records_since_restore
    );
    // What the first run committed, then what the second did: each update exactly once.
    assert_exactly_once(&read_committed(&output), &expected_totals(RECORDS, SEED));

    // The restore read through the counting storage and loaded the store of each new subtask.
    let after = storage.get();
    assert!(after.metadata_reads > 0, "{after:?}");
    assert!(after.state_reads > 0, "{after:?}");
    let store = second.state.counters().get();
    assert_eq!(
        (
            store.created,
            store.created_for_restarts,
            store.created_restoring
        ),
        (3, 0, 3),
        "{store:?}"
    );
    assert!(
        (1..=WORDS.len() as u64).contains(&store.load_puts),
        "each restored word is put once, into the store of the subtask owning it: {store:?}"
    );
    assert!(store.freezes > 0 && store.gets > 0, "{store:?}");
    let opened = second.transport.opened();
    assert_eq!(opened.len(), 1, "{opened:?}");
    assert!(
        opened.values().all(|o| o.outputs == 9 && o.inputs == 9),
        "{opened:?}"
    );
    // The first run's stores were its own.
    assert_eq!(first.state.counters().get().created, 2);
}
