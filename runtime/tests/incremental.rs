//! Incremental checkpoints end to end: chains of deltas through failures give exact totals, the shared directory holds exactly the files retained checkpoints reference, and a restore after subsumed checkpoints were deleted finds every file it needs.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;
use support::Bounded;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use support::{Failures, assert_resumed, inject, test_seed};
use weir_checkpoint::storage::{CheckpointStorage, is_shared};
use weir_checkpoint::{CheckpointMetadata, OpendalCheckpointStorage};
use weir_core::ids::JobId;
use weir_runtime::source::splitmix64;
use weir_runtime::{
    JobResult, JobStatus, LatestHandle, RestartStrategy, StorageConfig, StreamEnvironment,
};

/// Keys of the job: enough that a full snapshot is far larger than the changes between two
/// checkpoints.
const KEYS: u64 = 20_000;

fn key_of(i: u64) -> u64 {
    splitmix64(i ^ 0x1ec) % KEYS
}

/// The totals of records `0..n`, computed without the engine.
fn expected(n: u64) -> BTreeMap<u64, i64> {
    let mut out = BTreeMap::new();
    for i in 0..n {
        *out.entry(key_of(i)).or_insert(0) += 1;
    }
    out
}

/// A storage on `root` that writes every state as a file (no inlining), so that every link of
/// every chain is a shared file.
fn storage(root: &Path) -> Arc<OpendalCheckpointStorage> {
    Arc::new(
        OpendalCheckpointStorage::fs(root)
            .unwrap()
            .with_inline_threshold(0),
    )
}

/// generator (paced) → failures → (key, 1) → key_by → sum, with incremental checkpoints.
fn job(
    root: &Path,
    parallelism: u32,
    records: u64,
    failures: &Arc<Failures>,
    retain: u32,
) -> (StreamEnvironment, LatestHandle<u64, i64>) {
    let env = StreamEnvironment::new();
    env.set_job_name("incremental")
        .set_parallelism(parallelism)
        .set_max_parallelism(128)
        .enable_checkpointing(Duration::from_millis(10))
        .set_checkpoint_storage(StorageConfig::Custom(storage(root)))
        .set_restart_strategy(RestartStrategy::FixedDelay {
            attempts: 20,
            delay: Duration::from_millis(10),
        });
    {
        let mut config = env.config_mut();
        config.incremental = true;
        config.incremental_max_chain = 3;
        config.checkpoint.num_retained = retain;
    }
    let source = env.from_generator(Some(records), |i| i).uid("source");
    let totals = inject(source, failures)
        .uid("inject")
        .map(|i: u64| (key_of(i), 1i64))
        .uid("pairs")
        .key_by(|t: &(u64, i64)| &t.0)
        .sum()
        .uid("sum")
        .latest_per_key();
    (env, totals)
}

/// The retained checkpoints of `job` in `root`, oldest first, with their `_metadata`.
async fn retained(root: &Path, job: JobId) -> Vec<CheckpointMetadata> {
    let s = storage(root);
    let mut out = Vec::new();
    for listing in s.list_checkpoints(job).await.unwrap() {
        if listing.complete {
            out.push(s.read_metadata(&listing.location).await.unwrap());
        }
    }
    out
}

/// The shared file paths a checkpoint references (as `../shared/<name>`).
fn shared_files(m: &CheckpointMetadata) -> BTreeSet<String> {
    m.operators
        .iter()
        .flat_map(|o| o.subtasks.values())
        .flat_map(|s| s.keyed.iter().map(|k| &k.stream))
        .filter(|h| is_shared(h))
        .filter_map(|h| h.path().map(str::to_string))
        .collect()
}

/// The longest keyed chain (a full snapshot and its deltas) of any subtask in `m`.
fn longest_chain(m: &CheckpointMetadata) -> usize {
    m.operators
        .iter()
        .flat_map(|o| o.subtasks.values())
        .map(|s| s.keyed.len())
        .max()
        .unwrap_or(0)
}

/// The files in `<root>/<job>/shared/`, as `../shared/<name>`.
fn files_in_shared(root: &Path, job: JobId) -> BTreeSet<String> {
    std::fs::read_dir(root.join(job.to_string()).join("shared"))
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| format!("../shared/{}", e.file_name().to_string_lossy()))
        .collect()
}

fn summary(r: &JobResult) -> String {
    format!(
        "status={:?} restarts={} checkpoints completed={} failed={} latest={:?}",
        r.status, r.restarts, r.checkpoints_completed, r.checkpoints_failed, r.latest_checkpoint
    )
}

/// Without failures: deltas are taken (some retained checkpoint is a chain longer than one),
/// the shared directory holds exactly what the retained checkpoints reference, and the latest
/// one restores at another parallelism, with every file its chain needs, to exact totals.
/// `verify` checks every link; a damaged link is named, and a restore falls back past it.
#[cfg(feature = "cli")] // It verifies the chains with `weir checkpoints verify`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deltas_are_retained_exactly_and_restore_after_subsumed_ones_are_deleted() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    let records = 300_000;
    let (env, totals) = job(root, 2, records, &Failures::paced(Vec::new(), 1_000), 4);
    let r = env.execute().bounded().await.unwrap();
    let ctx = summary(&r);
    assert_eq!(r.status, JobStatus::Finished, "{ctx}");
    assert_eq!(totals.get(), expected(records), "{ctx}");
    assert!(r.checkpoints_completed >= 6, "{ctx}: too few checkpoints");
    let kept = retained(root, r.job_id).await;
    assert_eq!(kept.len(), 4, "{ctx}: retained checkpoints");
    let chains: Vec<usize> = kept.iter().map(longest_chain).collect();
    assert!(
        chains.iter().all(|&c| (1..=3).contains(&c)),
        "{ctx}: chains {chains:?}"
    );
    assert!(
        chains.iter().any(|&c| c > 1),
        "{ctx}: no delta among {chains:?}"
    );
    let referenced: BTreeSet<String> = kept.iter().flat_map(shared_files).collect();
    assert!(!referenced.is_empty(), "{ctx}");
    assert_eq!(
        files_in_shared(root, r.job_id),
        referenced,
        "{ctx}: the shared directory must hold exactly the retained checkpoints' files"
    );

    // Restore the latest at parallelism 3 and run to the end again: the same totals.
    let latest = r.latest_checkpoint.clone().expect("a latest checkpoint");
    let tmp2 = tempfile::tempdir().unwrap();
    let (env, totals) = job(tmp2.path(), 3, records, &Failures::at(Vec::new()), 1);
    env.restore_from(latest.trim_start_matches("file://"));
    let again = env.execute().bounded().await.unwrap();
    assert_eq!(again.status, JobStatus::Finished, "{}", summary(&again));
    assert_eq!(totals.get(), expected(records), "{}", summary(&again));
    // Exact only because the chains' state was used: the sources resumed.
    support::assert_restored(&again, records, &summary(&again));

    // `weir checkpoints verify` checks every link of every chain.
    let latest_dir = Path::new(latest.trim_start_matches("file://"));
    let report = weir_runtime::cli::verify(latest_dir).await.unwrap();
    assert!(report.problems.is_empty(), "{:?}", report.problems);
    let newest = kept.last().unwrap();
    assert!(
        report.files_verified > shared_files(newest).len() as u64,
        "{ctx}: {} files verified, the chains hold {}",
        report.files_verified,
        shared_files(newest).len()
    );

    // Damage the newest link of the latest checkpoint (a file only it references): verify names
    // it, and a restore from the job directory falls back to the checkpoint before.
    let last_link = newest
        .operators
        .iter()
        .flat_map(|o| o.subtasks.values())
        .filter_map(|s| s.keyed.last())
        .find_map(|k| k.stream.path().map(str::to_string))
        .unwrap();
    let name = last_link.trim_start_matches("../shared/");
    let file = root.join(r.job_id.to_string()).join("shared").join(name);
    let mut bytes = std::fs::read(&file).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0x5a;
    std::fs::write(&file, bytes).unwrap();
    let report = weir_runtime::cli::verify(latest_dir).await.unwrap();
    assert!(
        report.problems.iter().any(|p| p.file.contains(name)),
        "verify should name {name}: {:?}",
        report.problems
    );
    let tmp3 = tempfile::tempdir().unwrap();
    let (env, totals) = job(tmp3.path(), 2, records, &Failures::at(Vec::new()), 1);
    env.restore_from(root.join(r.job_id.to_string()));
    let fallback = env.execute().bounded().await.unwrap();
    let restored = fallback.restored_from.clone().unwrap_or_default();
    let previous = format!("chk-{}", kept[kept.len() - 2].checkpoint_id.0);
    assert!(
        restored.ends_with(&previous),
        "the restore should fall back to {previous}, it used {restored:?}"
    );
    assert_eq!(totals.get(), expected(records), "{}", summary(&fallback));
}

/// With failures between checkpoints: each restore reads a chain, the first checkpoint after it
/// is full, and the totals are exact; every file a retained checkpoint references exists.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn incremental_chains_with_failures_are_exact() {
    let seed = test_seed();
    let mut rng = splitmix64(seed);
    let records = 400_000u64;
    let mut thresholds = Vec::new();
    for k in 0..3u64 {
        rng = splitmix64(rng);
        thresholds.push(k * records / 3 + records / 12 + rng % (records / 6));
    }
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    let failures = Failures::paced(thresholds.clone(), 1_000);
    let (env, totals) = job(root, 2, records, &failures, 2);
    let r = env.execute().bounded().await.unwrap();
    let ctx = format!("seed={seed} failures at {thresholds:?}: {}", summary(&r));
    eprintln!("{ctx}");
    assert_eq!(r.status, JobStatus::Finished, "{ctx}");
    assert_eq!(failures.injected(), thresholds.len(), "{ctx}");
    assert!(r.restarts >= 1, "{ctx}");
    assert_resumed(&r, records, &ctx);
    assert_eq!(totals.get(), expected(records), "{ctx}");
    let kept = retained(root, r.job_id).await;
    assert!(!kept.is_empty(), "{ctx}");
    let present = files_in_shared(root, r.job_id);
    for m in &kept {
        let missing: Vec<String> = shared_files(m).difference(&present).cloned().collect();
        assert!(
            missing.is_empty(),
            "{ctx}: checkpoint {} references deleted shared files {missing:?}",
            m.checkpoint_id.0
        );
    }
}
