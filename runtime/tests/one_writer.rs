//! One writer per job directory: every run gets a fresh job id, two runs at once on one root
//! never change each other's results, a second run with the same job id is refused while the
//! first holds its directory, and `restore_from(<root>)` picks the latest checkpoint of the
//! same job across its runs, refusing a root that holds several jobs.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "support/bounded.rs"]
mod bounded;
use bounded::Bounded;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;
use weir_checkpoint::OpendalCheckpointStorage;
use weir_checkpoint::storage::faults::{FaultInjectingStorage, OpKind};
use weir_core::ids::JobId;
use weir_runtime::{JobError, JobResult, StorageConfig, StreamEnvironment};

const KEYS: u64 = 20;

/// What one run does.
#[derive(Clone)]
struct Run {
    root: PathBuf,
    records: u64,
    seed: u64,
    /// Panic once in the map after this many records (a failure the job restarts from).
    fail_after: Option<u64>,
    /// A pause every 256 records, so checkpoints happen during the run.
    pause: Duration,
    job_id: Option<JobId>,
    from: Option<PathBuf>,
    /// Fail for good at the injected failure (no restart strategy).
    no_restart: bool,
}

impl Run {
    fn new(root: &Path, seed: u64) -> Run {
        Run {
            root: root.to_path_buf(),
            records: 40_000,
            seed,
            fail_after: None,
            pause: Duration::from_micros(500),
            job_id: None,
            from: None,
            no_restart: false,
        }
    }

    async fn execute(self) -> Result<(JobResult, BTreeMap<u64, i64>), JobError> {
        let env = StreamEnvironment::new();
        env.set_job_name("one-writer")
            .set_parallelism(2)
            .enable_checkpointing(Duration::from_millis(10))
            .set_checkpoint_dir(&self.root)
            .set_source_config("records", self.records)
            .set_source_config("seed", self.seed);
        env.config_mut().job_id = self.job_id;
        // Short leases: a second run judges a held directory within half a second.
        env.config_mut().job_lock_lease = Duration::from_millis(300);
        env.config_mut().checkpoint.num_retained = 2;
        if self.no_restart {
            env.set_restart_strategy(weir_runtime::RestartStrategy::NoRestart);
        }
        if let Some(from) = &self.from {
            env.restore_from(from);
        }
        let seed = self.seed;
        let seen = AtomicU64::new(0);
        let failed = Arc::new(AtomicBool::new(false));
        let (fail_after, pause) = (self.fail_after, self.pause);
        let totals = env
            .from_generator(Some(self.records), move |i| {
                (i.wrapping_mul(seed | 1)) % KEYS
            })
            .uid("source")
            .map(move |k: u64| {
                let n = seen.fetch_add(1, Ordering::Relaxed);
                if fail_after.is_some_and(|f| n >= f) && !failed.swap(true, Ordering::SeqCst) {
                    panic!("injected failure after {n} records");
                }
                if n.is_multiple_of(256) {
                    std::thread::sleep(pause);
                }
                (k, 1i64)
            })
            .uid("pairs")
            .key_by(|t: &(u64, i64)| &t.0)
            .sum()
            .uid("sum")
            .latest_per_key();
        let result = tokio::time::timeout(Duration::from_secs(120), env.execute())
            .await
            .expect("the job did not end within 120 s")?;
        Ok((result, totals.get().into_iter().collect()))
    }
}

/// The totals of a failure-free run, computed without the engine.
fn expected(records: u64, seed: u64) -> BTreeMap<u64, i64> {
    let mut t = BTreeMap::new();
    for i in 0..records {
        *t.entry(i.wrapping_mul(seed | 1) % KEYS).or_insert(0) += 1;
    }
    t
}

/// The job directories under a root.
fn job_dirs(root: &Path) -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(root)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.is_dir())
        .collect();
    dirs.sort();
    dirs
}

/// A small deterministic generator for the trials' offsets.
fn next(state: &mut u64) -> u64 {
    *state = state
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    *state >> 33
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_runs_at_once_on_one_root_never_change_each_others_results() {
    let mut rng = 0x5eed_u64;
    for trial in 0..20 {
        let root = tempfile::tempdir().unwrap();
        let (seed_a, seed_b) = (2 * trial + 1, 2 * trial + 2);
        let mut a = Run::new(root.path(), seed_a);
        let mut b = Run::new(root.path(), seed_b);
        a.fail_after = Some(5_000 + next(&mut rng) % 30_000);
        b.fail_after = Some(5_000 + next(&mut rng) % 30_000);
        let delay = Duration::from_millis(next(&mut rng) % 40);
        let (ra, rb) = tokio::join!(a.clone().execute().bounded(), async {
            tokio::time::sleep(delay).await;
            b.clone().execute().bounded().await
        });
        let ((res_a, tot_a), (res_b, tot_b)) = (ra.unwrap(), rb.unwrap());
        let seeds = format!("trial {trial}: seeds {seed_a}/{seed_b}, delay {delay:?}");
        assert_eq!(tot_a, expected(a.records, seed_a), "{seeds}");
        assert_eq!(tot_b, expected(b.records, seed_b), "{seeds}");
        assert!(res_a.restarts >= 1 && res_b.restarts >= 1, "{seeds}");
        assert_ne!(res_a.job_id, res_b.job_id, "{seeds}");
        assert_eq!(
            job_dirs(root.path()).len(),
            2,
            "{seeds}: one job directory per run"
        );
        // Each job directory holds its own run's checkpoints only, and is given up at the end.
        for (res, seed) in [(&res_a, seed_a), (&res_b, seed_b)] {
            let dir = root.path().join(res.job_id.to_string());
            assert!(dir.is_dir(), "{seeds}: {} is missing", dir.display());
            assert!(
                !dir.join("_lock").exists(),
                "{seeds}: the lock outlived the run"
            );
            let latest = res.latest_checkpoint.clone().unwrap();
            assert!(
                latest.contains(&res.job_id.to_string()),
                "{seeds}: {latest}"
            );
            // Resuming the finished run from its own latest checkpoint replays nothing new
            // and gives the same totals.
            let mut again = Run::new(root.path(), seed);
            again.from = Some(PathBuf::from(latest.trim_start_matches("file://")));
            let (r, t) = again.execute().bounded().await.unwrap();
            assert_eq!(
                t,
                expected(a.records, seed),
                "{seeds}: resumed from {latest}"
            );
            assert!(
                r.source_records < a.records,
                "{seeds}: it must resume, not start over"
            );
        }
        // The root now holds two different jobs (other seeds): a restore from it is refused.
        let mut from_root = Run::new(root.path(), seed_a);
        from_root.from = Some(root.path().to_path_buf());
        let err = from_root.execute().bounded().await.unwrap_err().to_string();
        assert!(err.contains("2 different jobs"), "{seeds}: {err}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_run_with_the_same_job_id_is_refused_while_the_first_holds_it() {
    let root = tempfile::tempdir().unwrap();
    let id = JobId(0xfeed_face);
    let mut first = Run::new(root.path(), 1);
    first.job_id = Some(id);
    first.records = 400_000;
    first.pause = Duration::from_millis(2);
    let lock = root.path().join(id.to_string()).join("_lock");
    let mut second = Run::new(root.path(), 1);
    second.job_id = Some(id);
    let refused = async {
        // Wait until the first run holds its directory (bounded).
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while !lock.exists() {
            assert!(
                std::time::Instant::now() < deadline,
                "the first run never took its lock"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        second
            .clone()
            .execute()
            .bounded()
            .await
            .unwrap_err()
            .to_string()
    };
    let (first_run, err) = tokio::join!(first.execute().bounded(), refused);
    assert!(err.contains("is held by another run"), "{err}");
    assert!(
        err.contains(&format!("process {}", std::process::id())),
        "{err}"
    );
    let (result, totals) = first_run.unwrap();
    assert_eq!(totals, expected(400_000, 1), "the first run is unaffected");
    assert_eq!(result.job_id, id);
    // Given up at the end: now the same id may run.
    assert!(!lock.exists());
    let (_, totals) = second.execute().bounded().await.unwrap();
    assert_eq!(totals, expected(40_000, 1));
}

/// A run whose setup fails after it took its job directory (here: a restore point that does not
/// exist) gives the directory up as a run that ended would: no lock is left, none is renewed
/// behind it, and the same id runs at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_whose_setup_fails_gives_its_directory_up() {
    let root = tempfile::tempdir().unwrap();
    let id = JobId(0xbad_5e7);
    let dir = root.path().join(id.to_string());
    let mut failing = Run::new(root.path(), 3);
    failing.job_id = Some(id);
    failing.from = Some(root.path().join("no-such-checkpoint"));
    let err = failing.execute().bounded().await.unwrap_err().to_string();
    assert!(err.contains("no-such-checkpoint"), "{err}");
    // Twice the lease: a renewal left running would have rewritten the lock by now.
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert!(
        !dir.join("_lock").exists(),
        "the failed run left its lock: {:?}",
        std::fs::read_dir(&dir).map(|d| d.flatten().map(|e| e.file_name()).collect::<Vec<_>>())
    );
    assert!(!dir.exists(), "the failed run left an empty job directory");
    let mut again = Run::new(root.path(), 3);
    again.job_id = Some(id);
    let (result, totals) = again.execute().bounded().await.unwrap();
    assert_eq!(result.job_id, id);
    assert_eq!(totals, expected(40_000, 3));
}

/// A run with a fixed job id whose earlier run was killed (its lock left, no longer renewed)
/// takes the directory over after one lease, runs exactly, and gives it up at the end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fixed_job_id_takes_over_the_directory_of_a_killed_run() {
    let root = tempfile::tempdir().unwrap();
    let id = JobId(0xdead_beef);
    let dir = root.path().join(id.to_string());
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("_lock"),
        "process 1 on a host gone\nlease_ms 200\nrenewal 7\n",
    )
    .unwrap();
    let mut run = Run::new(root.path(), 3);
    run.job_id = Some(id);
    let started = std::time::Instant::now();
    let (result, totals) = run.execute().bounded().await.unwrap();
    assert!(
        started.elapsed() >= Duration::from_millis(240),
        "it watched the lease first"
    );
    assert_eq!(totals, expected(40_000, 3));
    assert_eq!(result.job_id, id);
    let left: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().to_string())
        .filter(|n| n.starts_with("_lock"))
        .collect();
    assert!(
        left.is_empty(),
        "every lock generation is given up: {left:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_root_resumes_the_latest_checkpoint_of_the_same_job_across_its_runs() {
    let root = tempfile::tempdir().unwrap();
    // The first run fails for good half way, after some checkpoints.
    let mut first = Run::new(root.path(), 3);
    first.fail_after = Some(20_000);
    first.no_restart = true;
    first
        .execute()
        .bounded()
        .await
        .expect_err("the first run fails");
    let first_dir = job_dirs(root.path());
    assert_eq!(first_dir.len(), 1);
    let first_id = first_dir[0]
        .file_name()
        .unwrap()
        .to_string_lossy()
        .to_string();
    let mut second = Run::new(root.path(), 3);
    second.from = Some(root.path().to_path_buf());
    let (second, totals) = second.execute().bounded().await.unwrap();
    assert_eq!(totals, expected(40_000, 3));
    let restored = second.restored_from.unwrap();
    assert!(
        restored.contains(&first_id),
        "the second run restores the first's checkpoint: {restored}"
    );
    assert!(second.source_records < 40_000, "the second run resumes");
    assert_ne!(second.job_id.to_string(), first_id);
    assert!(
        second.checkpoints_completed >= 1,
        "the second run checkpoints"
    );
    // A third run picks the second's (newer ids continue past the restored checkpoint).
    let mut third = Run::new(root.path(), 3);
    third.from = Some(root.path().to_path_buf());
    let (third, totals) = third.execute().bounded().await.unwrap();
    assert_eq!(totals, expected(40_000, 3));
    let restored = third.restored_from.unwrap();
    assert!(
        restored.contains(&second.job_id.to_string()),
        "the third run restores the second's newest checkpoint: {restored}"
    );
}

/// A run that retained no checkpoint (every one it tried, the final ones included, failed to
/// write) leaves no job directory behind, not even an empty one or its lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_without_checkpoints_leaves_no_job_directory() {
    let root = tempfile::tempdir().unwrap();
    let storage = FaultInjectingStorage::new(
        Arc::new(OpendalCheckpointStorage::fs(root.path()).unwrap()),
        3,
    );
    storage.set_fault_rate(OpKind::Write, 1.0).unwrap();
    let env = StreamEnvironment::new();
    env.set_parallelism(2)
        .enable_checkpointing(Duration::from_secs(3600))
        .set_checkpoint_storage(StorageConfig::Custom(Arc::new(storage)));
    let totals = env
        .from_generator(Some(1_000), |i| i % KEYS)
        .map(|k: u64| (k, 1i64))
        .key_by(|t: &(u64, i64)| &t.0)
        .sum()
        .latest_per_key();
    let r = tokio::time::timeout(Duration::from_secs(60), env.execute())
        .await
        .expect("bounded")
        .unwrap();
    assert_eq!(r.checkpoints_completed, 0);
    assert!(
        r.checkpoints_failed >= 3,
        "the final checkpoint was tried: {r:?}"
    );
    assert_eq!(totals.get().values().sum::<i64>(), 1_000);
    assert_eq!(job_dirs(root.path()), Vec::<PathBuf>::new());
}
