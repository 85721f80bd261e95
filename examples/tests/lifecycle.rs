//! The checkpoint lifecycle end to end: savepoints (moved, then restored), stop-with-savepoint
//! with and without drain, checkpoints every N records, retention, on-demand snapshots, retention
//! on cancellation and non-restored state.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../../runtime/tests/support/bounded.rs"]
mod bounded;
use bounded::{Bounded, BoundedCommand};

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;
use weir_examples::{WordCountOptions, build, expected_totals};
use weir_runtime::{ExternalizedRetention, JobClient, JobError, JobStatus, StreamEnvironment};

#[path = "support/processes.rs"]
mod processes;

const RECORDS: u64 = 4_000_000;
const SEED: u64 = 42;

struct Run {
    stdout: String,
    stderr: String,
    success: bool,
}

fn word_count(dir: &Path, args: &[&str]) -> Run {
    let out = Command::new(env!("CARGO_BIN_EXE_word_count"))
        .current_dir(dir)
        .args(args)
        .output_bounded()
        .unwrap();
    Run {
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        success: out.status.success(),
    }
}

fn totals_file(path: &Path) -> BTreeMap<String, i64> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|l| {
            let (k, v) = l.split_once(',').unwrap();
            (k.to_string(), v.parse().unwrap())
        })
        .collect()
}

fn savepoint_of(run: &Run) -> PathBuf {
    let line = run
        .stdout
        .lines()
        .find_map(|l| l.strip_prefix("stopped with savepoint: "))
        .unwrap_or_else(|| panic!("no savepoint printed:\n{}\n{}", run.stdout, run.stderr));
    PathBuf::from(line.strip_prefix("file://").unwrap_or(line))
}

fn summary_field(run: &Run, key: &str) -> u64 {
    let line = run
        .stdout
        .lines()
        .find(|l| l.starts_with("summary:"))
        .unwrap();
    line.split_whitespace()
        .find_map(|t| t.strip_prefix(&format!("{key}=")))
        .unwrap_or_else(|| panic!("no {key} in {line}"))
        .parse()
        .unwrap()
}

fn complete_checkpoints(root: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    for job in std::fs::read_dir(root).unwrap().flatten() {
        if !job.path().is_dir() {
            continue;
        }
        for chk in std::fs::read_dir(job.path()).unwrap().flatten() {
            if chk.path().join("_metadata").is_file() {
                found.push(chk.path());
            }
        }
    }
    found.sort();
    found
}

/// Stop with a savepoint, move the savepoint directory elsewhere, resume from the moved copy: the
/// final totals are the failure-free ones. With `drain`, the same.
#[test]
fn stop_with_savepoint_move_it_and_resume_gives_exact_totals() {
    for drain in [false, true] {
        let tmp = tempfile::tempdir().unwrap();
        let records = RECORDS.to_string();
        let mut args = vec![
            "--records",
            &records,
            "--parallelism",
            "2",
            "--checkpoint-interval",
            "50ms",
            "--stop-with-savepoint-after",
            "1000000",
        ];
        if drain {
            args.push("--drain");
        }
        let stopped = word_count(tmp.path(), &args);
        assert!(stopped.success, "{}", stopped.stderr);
        let savepoint = savepoint_of(&stopped);
        assert!(savepoint.join("_metadata").is_file(), "{savepoint:?}");
        let emitted = summary_field(&stopped, "records");
        assert!(
            emitted < RECORDS,
            "the job stopped early: {emitted} records"
        );

        let moved = tmp.path().join("elsewhere").join("my-savepoint");
        std::fs::create_dir_all(moved.parent().unwrap()).unwrap();
        std::fs::rename(&savepoint, &moved).unwrap();
        let out = tmp.path().join("totals.csv");
        let resumed = word_count(
            tmp.path(),
            &[
                "--records",
                &records,
                "--parallelism",
                "2",
                "--from",
                moved.to_str().unwrap(),
                "--checkpoint-dir",
                "cp2",
                "--output",
                out.to_str().unwrap(),
            ],
        );
        assert!(resumed.success, "drain={drain}: {}", resumed.stderr);
        assert_eq!(
            totals_file(&out),
            expected_totals(RECORDS, SEED),
            "drain={drain}"
        );
        processes::assert_restored(&resumed.stdout, RECORDS, &[&moved]);
    }
}

/// `--checkpoint-every-records` triggers checkpoints without an interval; `--retain` keeps that
/// many.
#[test]
fn checkpoint_every_records_and_retain() {
    let tmp = tempfile::tempdir().unwrap();
    let run = word_count(
        tmp.path(),
        &[
            "--records",
            "3000000",
            "--parallelism",
            "2",
            "--checkpoint-every-records",
            "250000",
            "--retain",
            "3",
        ],
    );
    assert!(run.success, "{}", run.stderr);
    let completed = summary_field(&run, "checkpoints");
    assert!(
        completed >= 3,
        "only {completed} checkpoints:\n{}",
        run.stdout
    );
    let kept = complete_checkpoints(&tmp.path().join("weir-checkpoints"));
    assert_eq!(kept.len(), 3, "{kept:?}");
}

fn opts(dir: &Path) -> WordCountOptions {
    WordCountOptions {
        records: None,
        parallelism: 2,
        checkpoint_interval: Some(Duration::from_millis(20)),
        checkpoint_dir: dir.join("checkpoints"),
        ..WordCountOptions::default()
    }
}

/// A savepoint into `target`, asked for until the job runs (requests before are refused).
async fn savepoint_once_running(c: &JobClient, target: &Path) -> String {
    loop {
        match c.trigger_savepoint(Some(target.to_path_buf())).await {
            Ok(path) => return path,
            Err(e) if e.to_string().contains("not triggered") => {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            Err(e) => panic!("{e}"),
        }
    }
}

/// On-demand snapshots through the client: a checkpoint lands in `chk-<n>`, a savepoint in its
/// own directory; a savepoint without a directory is refused with a reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_demand_checkpoint_and_savepoint() {
    let tmp = tempfile::tempdir().unwrap();
    let (env, _totals, _) = build(&WordCountOptions {
        savepoint_dir: None,
        ..opts(tmp.path())
    });
    let client = JobClient::default();
    let c = client.clone();
    let job = tokio::spawn(env.execute_with(client).bounded());
    // The job needs to be running first; requests before that are refused.
    let checkpoint = loop {
        match c.trigger_checkpoint().await {
            Ok(path) => break path,
            Err(e) => {
                assert!(e.to_string().contains("not triggered"), "{e}");
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
    };
    assert!(checkpoint.contains("/chk-"), "{checkpoint}");
    // The live statistics show it, completed, with per-subtask figures.
    let id: u64 = checkpoint.rsplit("chk-").next().unwrap().parse().unwrap();
    let stats = c.checkpoint_stats();
    let s = stats
        .iter()
        .find(|s| s.id.0 == id)
        .unwrap_or_else(|| panic!("no stats for {id}: {stats:?}"));
    assert_eq!(s.status, weir_checkpoint_status_completed());
    assert_eq!(s.num_acknowledged, s.num_subtasks);
    assert_eq!(s.subtasks.len(), s.num_subtasks);
    assert!(s.end_to_end.is_some());
    // Requests made before every task ran were refused, and the statistics say why.
    let refusals = c.trigger_refusals();
    assert!(
        refusals
            .iter()
            .all(|(_, why)| why.contains("not running") || why.contains("in progress")),
        "{refusals:?}"
    );
    let refused = c.trigger_savepoint(None).await.unwrap_err();
    assert!(
        refused.to_string().contains("savepoint directory"),
        "{refused}"
    );
    let target = tmp.path().join("savepoints");
    let savepoint = savepoint_once_running(&c, &target).await;
    assert!(savepoint.contains("/savepoint-"), "{savepoint}");
    let dir = PathBuf::from(savepoint.strip_prefix("file://").unwrap());
    assert!(dir.join("_metadata").is_file());
    c.cancel();
    let result = job.await.unwrap().unwrap();
    assert_eq!(result.status, JobStatus::Canceled);
    // The savepoint belongs to the user: cancelling does not touch it.
    assert!(dir.join("_metadata").is_file());
}

/// Without a checkpoint interval there is no checkpointing: an on-demand checkpoint is refused
/// with the reason (it used to land in memory), a savepoint still works, and nothing is written
/// to the checkpoint directory.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_demand_checkpoint_without_checkpointing_is_refused_and_savepoints_work() {
    let tmp = tempfile::tempdir().unwrap();
    let o = WordCountOptions {
        checkpoint_interval: None,
        ..opts(tmp.path())
    };
    let (env, _totals, _) = build(&o);
    let client = JobClient::default();
    let c = client.clone();
    let job = tokio::spawn(env.execute_with(client).bounded());
    let refused = c.trigger_checkpoint().await.unwrap_err();
    assert!(
        refused.to_string().contains("checkpointing is not enabled"),
        "{refused}"
    );
    let target = tmp.path().join("savepoints");
    let savepoint = savepoint_once_running(&c, &target).await;
    let dir = PathBuf::from(savepoint.strip_prefix("file://").unwrap());
    assert!(dir.join("_metadata").is_file(), "{savepoint}");
    c.cancel();
    assert_eq!(job.await.unwrap().unwrap().status, JobStatus::Canceled);
    assert!(
        !o.checkpoint_dir.exists(),
        "the checkpoint directory was created without checkpointing"
    );
}

/// Cancelling deletes the retained checkpoints with `DeleteOnCancellation` and keeps them with
/// the default.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_on_cancellation() {
    for retention in [
        ExternalizedRetention::RetainOnCancellation,
        ExternalizedRetention::DeleteOnCancellation,
    ] {
        let tmp = tempfile::tempdir().unwrap();
        let o = opts(tmp.path());
        let (env, _totals, _) = build(&o);
        env.checkpoint_config().externalized_retention = retention;
        let client = JobClient::default();
        let c = client.clone();
        let job = tokio::spawn(env.execute_with(client).bounded());
        let root = o.checkpoint_dir.clone();
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while !root.is_dir() || complete_checkpoints(&root).is_empty() {
            assert!(
                std::time::Instant::now() < deadline,
                "no checkpoint completed"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        c.cancel();
        let result = job.await.unwrap().unwrap();
        assert_eq!(result.status, JobStatus::Canceled);
        let left = complete_checkpoints(&root);
        match retention {
            ExternalizedRetention::RetainOnCancellation => assert!(!left.is_empty()),
            ExternalizedRetention::DeleteOnCancellation => assert!(left.is_empty(), "{left:?}"),
        }
    }
}

/// State of an operator the new job does not have: an error naming it, unless
/// `allow_non_restored_state`, which drops it and restores the rest exactly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn non_restored_state_is_an_error_unless_allowed() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("checkpoints");
    let records = 300_000u64;
    let job = |extra: bool, from: Option<&Path>, allow: bool| {
        let env = StreamEnvironment::new();
        env.set_parallelism(2)
            .enable_checkpointing(Duration::from_millis(10))
            .set_checkpoint_dir(&root)
            .set_allow_non_restored_state(allow);
        env.checkpoint_config().num_retained = 1;
        if let Some(f) = from {
            env.restore_from(f);
        }
        let keyed = env
            .from_generator(Some(records), |i| (i % 10, 1i64))
            .uid("source");
        if extra {
            keyed
                .clone()
                .map(|(k, v): (u64, i64)| (k + 100, v))
                .uid("extra-map")
                .key_by(|t: &(u64, i64)| &t.0)
                .sum()
                .uid("extra-sum");
        }
        let totals = keyed
            .key_by(|t: &(u64, i64)| &t.0)
            .sum()
            .uid("sum")
            .reinterpret_as_keyed(|t: &(u64, i64)| &t.0)
            .latest_per_key();
        (env, totals)
    };
    let (env, _) = job(true, None, false);
    let first = env.execute().bounded().await.unwrap();
    assert!(first.checkpoints_completed > 0);
    let (env, _) = job(false, Some(&root), false);
    match env.execute().bounded().await {
        Err(JobError::Restore { reason, .. }) => {
            assert!(reason.contains("extra-sum"), "{reason}");
            assert!(reason.contains("allow_non_restored_state"), "{reason}");
        }
        other => panic!("expected a restore error, got {other:?}"),
    }
    let (env, totals) = job(false, Some(&root), true);
    let resumed = env.execute().bounded().await.unwrap();
    let expected: BTreeMap<u64, i64> = (0..10).map(|k| (k, (records / 10) as i64)).collect();
    assert_eq!(totals.get(), expected);
    // Exact only because the sum's state was restored: the sources resumed, they did not start
    // over.
    assert!(resumed.restored_from.is_some(), "the run must restore");
    assert!(
        resumed.source_records < records,
        "the restored run emitted {} of {records} records: it started over",
        resumed.source_records
    );
}

fn weir_checkpoint_status_completed() -> weir_runtime::CheckpointStatus {
    weir_runtime::CheckpointStatus::Completed
}

/// A two-phase-commit sink subtask whose input ended holds its last transactions until the whole
/// job finished: when another subtask fails after it ended, everything is restored and replayed,
/// and each record is still committed exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_finished_sink_subtask_does_not_commit_twice_after_a_failover() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    let tmp = tempfile::tempdir().unwrap();
    let n: u64 = 20_000;
    let failed = Arc::new(AtomicBool::new(false));
    let f = failed.clone();
    let env = StreamEnvironment::new();
    env.set_checkpoint_dir(tmp.path().join("cp"))
        .set_parallelism(2)
        .enable_checkpointing(Duration::from_millis(30));
    let handle = env
        .from_collection((0..n).collect::<Vec<u64>>())
        .map(move |v: u64| {
            if v % 2 == 1 {
                std::thread::sleep(Duration::from_micros(100));
                // The odd subtask fails once, long after the even one ended its input.
                if v >= 15_001 && !f.swap(true, Ordering::SeqCst) {
                    panic!("failing on purpose at {v}");
                }
            }
            v
        })
        .collect();
    let r = env.execute().bounded().await.unwrap();
    assert_eq!(r.restarts, 1);
    let mut got = handle.records();
    got.sort_unstable();
    assert_eq!(
        got,
        (0..n).collect::<Vec<_>>(),
        "lost or duplicated records"
    );
}

/// Stop-with-savepoint without drain: every record the sources emitted is before the savepoint's
/// barrier, and the sink commits all of them before the job ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_with_savepoint_commits_everything_emitted() {
    for _ in 0..3 {
        let tmp = tempfile::tempdir().unwrap();
        let env = StreamEnvironment::new();
        env.set_savepoint_dir(tmp.path().join("sp"))
            .set_parallelism(2);
        let handle = env.from_generator(None, |i| i).map(|i: u64| i).collect();
        let client = JobClient::default();
        let c = client.clone();
        let job = tokio::spawn(env.execute_with(client).bounded());
        tokio::time::sleep(Duration::from_millis(50)).await;
        let path = loop {
            match c.stop_with_savepoint(None, false).await {
                Ok(p) => break p,
                Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
            }
        };
        let r = job.await.unwrap().unwrap();
        assert_eq!(r.status, JobStatus::Finished);
        assert_eq!(r.savepoint.as_deref(), Some(path.as_str()));
        let mut got = handle.records();
        got.sort_unstable();
        let committed = got.len();
        got.dedup();
        assert_eq!(got.len(), committed, "duplicates committed");
        // The unbounded generator's two splits emit the indices 0, 2, 4, … and 1, 3, 5, …, each
        // in order: what the sink committed is, per split, a prefix with no gap, whatever the
        // engine counted. And it is everything the sources emitted.
        for split in 0..2u64 {
            let emitted: Vec<u64> = got.iter().copied().filter(|i| i % 2 == split).collect();
            assert!(!emitted.is_empty(), "split {split} committed nothing");
            let prefix: Vec<u64> = (0..emitted.len() as u64).map(|k| split + 2 * k).collect();
            assert_eq!(emitted, prefix, "split {split} committed with a gap");
        }
        assert_eq!(committed as u64, r.source_records, "committed vs emitted");
    }
}
