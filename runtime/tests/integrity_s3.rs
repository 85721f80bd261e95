//! Files that cannot be mistaken, on S3: against a real `s3s-fs` server on loopback, a keyed
//! file swapped in from the previous checkpoint is named by `weir checkpoints verify s3://…` and
//! fallen back past by a restore from `s3://…` with exact totals; and two runs at once on one
//! `s3://` root, each failing once at a random offset, never change each other's results (20
//! trials). Both read the AWS variables, as a job does; this binary sets them for its one test
//! (nextest runs each test in a process of its own). Needs `WEIR_S3FS_BIN` (`cargo xtask test`).
#![cfg(feature = "cli")]
#![allow(clippy::unwrap_used, clippy::expect_used)]
// Setting the AWS variables for the in-process restore: one test per process, set before any
// thread reads them.
#![allow(unsafe_code)]

#[path = "support/bounded.rs"]
mod bounded;
use bounded::{Bounded, BoundedCommand};

#[path = "../../checkpoint/tests/support/s3_server.rs"]
mod s3_server;

use s3_server::S3Server;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;
use weir_checkpoint::OpendalCheckpointStorage;
use weir_runtime::{JobError, JobResult, StorageConfig, StreamEnvironment};

const BUCKET: &str = "weir-integrity";
const KEYS: u64 = 20;

/// One run: a generator of `records` keyed by `seed`, checkpointing every 10 ms to `root` (an
/// `s3://` URL) with nothing inlined, optionally failing once and restoring.
#[derive(Clone)]
struct Run {
    root: String,
    records: u64,
    seed: u64,
    fail_after: Option<u64>,
    from: Option<String>,
    /// Slow down until this many complete checkpoints are on disk (under `watch`).
    wanted: usize,
    watch: PathBuf,
}

impl Run {
    async fn execute(self) -> Result<(JobResult, BTreeMap<u64, i64>), JobError> {
        let storage = match StorageConfig::from_location(&self.root).unwrap() {
            StorageConfig::S3(c) => OpendalCheckpointStorage::s3(c)
                .unwrap()
                .with_inline_threshold(0),
            other => panic!("not an S3 root: {other:?}"),
        };
        let env = StreamEnvironment::new();
        env.set_job_name("integrity-s3")
            .set_parallelism(2)
            .enable_checkpointing(Duration::from_millis(10))
            .set_checkpoint_storage(StorageConfig::Custom(Arc::new(storage)))
            .set_source_config("records", self.records)
            .set_source_config("seed", self.seed);
        env.config_mut().checkpoint.num_retained = 3;
        if let Some(from) = &self.from {
            env.restore_from(from);
        }
        let (seed, fail_after, wanted, watch) =
            (self.seed, self.fail_after, self.wanted, self.watch.clone());
        let seen = AtomicU64::new(0);
        let failed = AtomicBool::new(false);
        let totals = env
            .from_generator(Some(self.records), move |i| i.wrapping_mul(seed | 1) % KEYS)
            .uid("source")
            .map(move |k: u64| {
                let n = seen.fetch_add(1, Ordering::Relaxed);
                if fail_after.is_some_and(|f| n >= f) && !failed.swap(true, Ordering::SeqCst) {
                    panic!("injected failure after {n} records");
                }
                if n.is_multiple_of(256) {
                    if complete(&watch).len() < wanted {
                        std::thread::sleep(Duration::from_millis(2));
                    } else {
                        std::thread::sleep(Duration::from_micros(300));
                    }
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

fn expected(records: u64, seed: u64) -> BTreeMap<u64, i64> {
    let mut t = BTreeMap::new();
    for i in 0..records {
        *t.entry(i.wrapping_mul(seed | 1) % KEYS).or_insert(0) += 1;
    }
    t
}

/// The complete `chk-<n>` directories under a root as the server keeps it on disk, oldest first.
fn complete(root: &Path) -> Vec<PathBuf> {
    let mut out: Vec<(u64, PathBuf)> = Vec::new();
    for job in std::fs::read_dir(root).into_iter().flatten().flatten() {
        for chk in std::fs::read_dir(job.path())
            .into_iter()
            .flatten()
            .flatten()
        {
            let name = chk.file_name().to_string_lossy().to_string();
            if let Some(id) = name.strip_prefix("chk-").and_then(|n| n.parse().ok())
                && chk.path().join("_metadata").is_file()
            {
                out.push((id, chk.path()));
            }
        }
    }
    out.sort();
    out.into_iter().map(|(_, p)| p).collect()
}

/// The keyed file of vertex-subtask `vs` in a checkpoint directory.
fn keyed_file(chk: &Path, vs: &str) -> PathBuf {
    std::fs::read_dir(chk)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| {
            let n = p.file_name().unwrap().to_string_lossy().to_string();
            n.starts_with(&format!("v{vs}-")) && n.ends_with("-keyed")
        })
        .unwrap_or_else(|| panic!("no v{vs}-*-keyed in {}", chk.display()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn substitution_and_two_writers_on_s3() {
    let server = S3Server::start(BUCKET);
    for (k, v) in server.env() {
        // SAFETY: this binary's only test, before it starts any thread that reads the
        // environment (nextest runs it in a process of its own).
        unsafe { std::env::set_var(k, v) };
    }

    // A keyed file swapped in from the previous checkpoint of the same subtask.
    let root = format!("s3://{BUCKET}/substitution");
    let on_disk = server.bucket_dir().join("substitution");
    let first = Run {
        root: root.clone(),
        records: 60_000,
        seed: 7,
        fail_after: None,
        from: None,
        wanted: 4,
        watch: on_disk.clone(),
    };
    let (_, totals) = first.clone().execute().bounded().await.unwrap();
    assert_eq!(totals, expected(60_000, 7), "the fixture run must be exact");
    let chks = complete(&on_disk);
    assert!(chks.len() >= 2, "{chks:?}");
    let (newest, previous) = (&chks[chks.len() - 1], &chks[chks.len() - 2]);
    // The sum is the second vertex; its subtask 0.
    let victim = keyed_file(newest, "1-0");
    std::fs::copy(keyed_file(previous, "1-0"), &victim).unwrap();
    let rel = newest
        .strip_prefix(server.bucket_dir())
        .unwrap()
        .display()
        .to_string();
    let out = Command::new(env!("CARGO_BIN_EXE_weir"))
        .args(["checkpoints", "verify", &format!("s3://{BUCKET}/{rel}")])
        .envs(server.env())
        .output_bounded()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let victim_name = victim.file_name().unwrap().to_string_lossy().to_string();
    assert_eq!(out.status.code(), Some(1), "verify must fail:\n{text}");
    assert!(
        text.contains(&victim_name) && text.contains("s3://"),
        "verify must name the file as s3://…:\n{text}"
    );
    assert!(
        ["digest mismatch", "length mismatch"]
            .iter()
            .any(|w| text.contains(w)),
        "{text}"
    );
    let again = Run {
        from: Some(root.clone()),
        wanted: 0,
        ..first
    };
    let (result, totals) = again.execute().bounded().await.unwrap();
    let restored = result.restored_from.expect("the run must restore");
    let prev_name = previous.file_name().unwrap().to_string_lossy().to_string();
    assert!(
        restored.starts_with("s3://") && restored.ends_with(&prev_name),
        "the restore must fall back to {prev_name}: {restored}"
    );
    assert!(
        result.source_records < 60_000,
        "the restore must resume: it emitted {}",
        result.source_records
    );
    assert_eq!(
        totals,
        expected(60_000, 7),
        "the restored run must be exact"
    );

    // Two runs at once on one root, 20 trials with random failure offsets and start delays.
    let mut rng = 0x5eed_u64;
    let mut next = || {
        rng = rng
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        rng >> 33
    };
    for trial in 0..20u64 {
        let root = format!("s3://{BUCKET}/two-writers-{trial}");
        let on_disk = server.bucket_dir().join(format!("two-writers-{trial}"));
        let (seed_a, seed_b) = (2 * trial + 1, 2 * trial + 2);
        let run = |seed, fail| Run {
            root: root.clone(),
            records: 30_000,
            seed,
            fail_after: Some(fail),
            from: None,
            wanted: 0,
            watch: on_disk.clone(),
        };
        let (a, b) = (
            run(seed_a, 3_000 + next() % 25_000),
            run(seed_b, 3_000 + next() % 25_000),
        );
        let delay = Duration::from_millis(next() % 40);
        let (ra, rb) = tokio::join!(a.execute().bounded(), async {
            tokio::time::sleep(delay).await;
            b.execute().bounded().await
        });
        let ((res_a, tot_a), (res_b, tot_b)) = (ra.unwrap(), rb.unwrap());
        let what = format!("trial {trial}: seeds {seed_a}/{seed_b}, delay {delay:?}");
        assert_eq!(tot_a, expected(30_000, seed_a), "{what}");
        assert_eq!(tot_b, expected(30_000, seed_b), "{what}");
        assert!(res_a.restarts >= 1 && res_b.restarts >= 1, "{what}");
        assert_ne!(res_a.job_id, res_b.job_id, "{what}");
        for res in [&res_a, &res_b] {
            let dir = on_disk.join(res.job_id.to_string());
            assert!(
                !dir.join("_lock").exists(),
                "{what}: the lock outlived the run"
            );
            // A run's checkpoints are in its own directory (a run may have completed none
            // before its end on a loaded machine: its exact totals are then from the replay).
            if let Some(latest) = &res.latest_checkpoint {
                assert!(
                    latest.starts_with("s3://") && latest.contains(&res.job_id.to_string()),
                    "{what}: {latest}"
                );
            }
        }
    }
}
