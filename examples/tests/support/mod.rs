//! Helpers the examples' integration tests share: a seeded generator, failure injection that
//! knows its attempt, the keyed record model, Flink's VerifyingSink check, and stopping a job
//! with a savepoint.
// Each test binary uses its own subset of these.
#![allow(dead_code)]

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};
use std::time::{SystemTime, UNIX_EPOCH};
use weir_core::element::SnapshotKind;
use weir_runtime::DataStream;
use weir_runtime::source::splitmix64;
use weir_runtime::testing::{Gate, GateDriver};
use weir_runtime::{
    CheckpointStats, CheckpointStatus, JobClient, JobError, JobResult, JobStatus, StreamEnvironment,
};

/// SplitMix64 as a generator: the seeded source of failure points and intervals.
pub struct SplitMix(pub u64);

impl SplitMix {
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(weir_core::splitmix::GOLDEN_GAMMA);
        weir_core::splitmix::mix64(self.0)
    }

    /// Uniform in `lo..hi`.
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi - lo)
    }

    /// `n` failure points in `1..=records`, sorted.
    pub fn thresholds(&mut self, n: usize, records: u64) -> Vec<u64> {
        let mut t: Vec<u64> = (0..n).map(|_| self.range(1, records + 1)).collect();
        t.sort_unstable();
        t
    }

    /// `n` failure points for `FailureInjector`, one in the middle half of each of `n` equal
    /// slices of `1..=records`, so consecutive points are at least a quarter of `records / n`
    /// apart. `FailureInjector` counts records over all subtasks, and the other subtasks go on
    /// until the failed attempt is torn down; points closer than that could fail twice in one
    /// attempt, which is one restart.
    pub fn spaced_thresholds(&mut self, n: usize, records: u64) -> Vec<u64> {
        let slice = records / n.max(1) as u64;
        (0..n as u64)
            .map(|k| k * slice + self.range(slice / 4, slice * 3 / 4) + 1)
            .collect()
    }
}

#[allow(unused_imports)]
pub use weir_runtime::testing::{Failures, Injector};

/// `failures` injected behind `stream` (`DataStream::inject_failures`), with the uid `inject`.
pub fn inject(stream: DataStream<u64>, failures: &Arc<Failures>) -> DataStream<u64> {
    stream.inject_failures(failures).uid("inject")
}

/// The test's seed: `WEIR_TEST_SEED` to reproduce a failure, else a fresh one per run.
pub fn test_seed() -> u64 {
    let seed = std::env::var("WEIR_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(42)
        });
    eprintln!("seed={seed} (rerun with WEIR_TEST_SEED={seed})");
    seed
}

pub const KEYS: u64 = 97;

/// The key of record `i`: a hash, so keys interleave in no particular order.
pub fn key_of(i: u64) -> u64 {
    splitmix64(i ^ 0x5eed) % KEYS
}

/// Each key's record count over `0..n`, computed without the engine.
pub fn counts_per_key(n: u64) -> BTreeMap<u64, i64> {
    let mut m = BTreeMap::new();
    for i in 0..n {
        *m.entry(key_of(i)).or_insert(0) += 1;
    }
    m
}

/// Flink's VerifyingSink check: within each subtask's committed output, each key's running sums
/// go `1, 2, 3, …` with no gap, duplicate or reordering, and each key lives in one subtask.
/// Returns each key's last running sum.
pub fn verify_running_sums(
    by_subtask: &BTreeMap<u32, Vec<(u64, i64)>>,
    ctx: &str,
) -> BTreeMap<u64, i64> {
    let mut owner: HashMap<u64, u32> = HashMap::new();
    let mut last: BTreeMap<u64, i64> = BTreeMap::new();
    for (subtask, records) in by_subtask {
        for (pos, (key, sum)) in records.iter().enumerate() {
            let o = *owner.entry(*key).or_insert(*subtask);
            assert_eq!(
                o, *subtask,
                "{ctx}: key {key} in subtasks {o} and {subtask}"
            );
            let prev = last.entry(*key).or_insert(0);
            assert_eq!(
                *sum,
                *prev + 1,
                "{ctx}: subtask {subtask}, position {pos}: key {key} went from running sum {prev} \
                 to {sum} (a gap, duplicate or reordering)"
            );
            *prev = *sum;
        }
    }
    last
}

// ---------------------------------------------------------------------------------------------
// Stopping a job with a savepoint.
// ---------------------------------------------------------------------------------------------

/// Runs `env` until its sources emitted `stop_after` records, then stops it with a savepoint
/// under `dir`; returns the result and the savepoint's directory.
pub async fn run_and_stop(
    env: StreamEnvironment,
    stop_after: u64,
    dir: &Path,
    ctx: &str,
) -> (JobResult, PathBuf) {
    let client = JobClient::default();
    let job = tokio::spawn(env.execute_with(client.clone()).bounded());
    let deadline = Instant::now() + Duration::from_secs(120);
    while client.source_records() < stop_after {
        assert!(
            !job.is_finished(),
            "{ctx}: the job ended before {stop_after} records: {:?}",
            job.await.unwrap()
        );
        assert!(
            Instant::now() < deadline,
            "{ctx}: no {stop_after} records in 2 minutes"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let path = loop {
        match client
            .stop_with_savepoint(Some(dir.to_path_buf()), false)
            .await
        {
            Ok(path) => break path,
            // Refused while a checkpoint is in progress.
            Err(e) if e.to_string().contains("not triggered") => {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            Err(e) => panic!(
                "{ctx}: stop with savepoint after {} records: {e}",
                client.source_records()
            ),
        }
    };
    let r = job.await.unwrap().unwrap();
    assert_eq!(r.status, JobStatus::Finished, "{ctx}");
    assert_eq!(r.savepoint.as_deref(), Some(path.as_str()), "{ctx}");
    let dir = PathBuf::from(path.strip_prefix("file://").unwrap_or(&path));
    assert!(dir.join("_metadata").is_file(), "{dir:?}");
    (r, dir)
}

/// A gate in the job, with the subtasks it blocks and the records it lets through per round.
pub struct Gated {
    pub gate: Arc<Gate>,
    pub subtasks: usize,
    pub per_round: u64,
}

/// Runs `env` to its end with a [`GateDriver`] driving its gate, while watching the live
/// checkpoint statistics (the job result keeps only the last few). Returns the result, the
/// persisted in-flight bytes of every completed checkpoint seen, by id (ids are not reused
/// across restarts), and the checkpoints whose barriers the gate held.
pub async fn execute_gated(
    env: StreamEnvironment,
    gated: Gated,
) -> Result<(JobResult, BTreeMap<u64, u64>, Vec<u64>), JobError> {
    let client = JobClient::default();
    let c = client.clone();
    let job = tokio::spawn(env.execute_with(client).bounded());
    let driver = GateDriver::start(c.clone(), gated.gate, gated.subtasks, gated.per_round);
    let mut in_flight = BTreeMap::new();
    let mut note = |stats: &[CheckpointStats]| {
        for s in stats {
            if s.status == CheckpointStatus::Completed && s.kind == SnapshotKind::Checkpoint {
                in_flight.insert(s.id.0, s.in_flight_size);
            }
        }
    };
    while !job.is_finished() {
        note(&c.checkpoint_stats());
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let held = driver.stop().await;
    let r = job.await.unwrap()?;
    note(&r.checkpoint_history);
    Ok((r, in_flight, held))
}

#[path = "../../../runtime/tests/support/bounded.rs"]
mod bounded;
#[allow(unused_imports)]
pub use bounded::{Bounded, BoundedCommand, JOB_LIMIT};
#[path = "../../../runtime/tests/support/restored.rs"]
mod restored;
// Each test binary uses one or both.
#[allow(unused_imports)]
pub use restored::{assert_restored, assert_resumed};

/// The complete checkpoints (`<job>/chk-<n>/_metadata`) under a checkpoint root: each id and
/// directory, in no particular order.
pub fn complete_checkpoints(root: &Path) -> Vec<(u64, PathBuf)> {
    let mut found = Vec::new();
    for job in std::fs::read_dir(root).into_iter().flatten().flatten() {
        for chk in std::fs::read_dir(job.path())
            .into_iter()
            .flatten()
            .flatten()
        {
            let name = chk.file_name().to_string_lossy().into_owned();
            if let Some(id) = name
                .strip_prefix("chk-")
                .and_then(|n| n.parse::<u64>().ok())
                && chk.path().join("_metadata").is_file()
            {
                found.push((id, chk.path()));
            }
        }
    }
    found
}
