//! Bad input gets a clear error that names the problem, never a panic: bad flags, unusable
//! checkpoint directories, missing, corrupt or mismatched checkpoints, and storage that fails
//! mid-run.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "support/processes.rs"]
mod processes;
mod support;
use support::{Bounded, BoundedCommand};

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};
use weir_examples::{WordCountOptions, build, expected_totals};
use weir_runtime::{JobError, JobResult, JobStatus, LatestHandle, StreamEnvironment};

/// The binary's exit status, stdout and stderr for `args`.
struct Run {
    success: bool,
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

fn word_count<I, S>(args: I) -> Run
where
    I: IntoIterator<Item = S>,
    S: AsRef<std::ffi::OsStr>,
{
    let out = Command::new(env!("CARGO_BIN_EXE_word_count"))
        .args(args)
        .env_remove("RUST_LOG")
        .env_remove("RUST_BACKTRACE")
        .env_remove("RUST_LIB_BACKTRACE")
        .output_bounded()
        .unwrap();
    Run {
        success: out.status.success(),
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// A failed run whose stderr names the problem (every one of `needles`) and shows no panic.
fn assert_clear_error(run: &Run, needles: &[&str]) {
    assert!(!run.success, "expected a failure; stdout:\n{}", run.stdout);
    assert_ne!(run.code, Some(0));
    // A panic exits with 101 and an allocation abort with 134; a failed job with 1 and bad
    // flags with 2.
    assert_ne!(run.code, Some(101), "stderr:\n{}", run.stderr);
    assert_ne!(run.code, Some(134), "stderr:\n{}", run.stderr);
    assert!(
        !run.stderr.contains("panicked"),
        "a panic instead of an error:\n{}",
        run.stderr
    );
    for n in needles {
        assert!(
            run.stderr.contains(n),
            "stderr does not mention {n:?}:\n{}",
            run.stderr
        );
    }
}

fn path_arg(p: &Path) -> String {
    p.to_str().unwrap().to_string()
}

/// The complete checkpoint directories under a root, oldest first.
fn complete_checkpoints(root: &Path) -> Vec<PathBuf> {
    let mut found: Vec<(u64, PathBuf)> = Vec::new();
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
    found.sort();
    found.into_iter().map(|(_, p)| p).collect()
}

/// The id in a `…/chk-<n>` path, as `JobResult.latest_checkpoint` and the binary's
/// `latest checkpoint:` line give it.
fn chk_id(path: &str) -> u64 {
    path.rsplit("chk-")
        .next()
        .and_then(|n| n.trim_end_matches('/').parse().ok())
        .unwrap_or_else(|| panic!("no chk-<n> in {path:?}"))
}

/// Every `chk-<n>` directory under a root (complete or not), with its id.
fn chk_dirs(root: &Path) -> Vec<(u64, PathBuf)> {
    let mut found = Vec::new();
    for job in std::fs::read_dir(root).into_iter().flatten().flatten() {
        for chk in std::fs::read_dir(job.path())
            .into_iter()
            .flatten()
            .flatten()
        {
            let name = chk.file_name().to_string_lossy().into_owned();
            if let Some(id) = name.strip_prefix("chk-").and_then(|n| n.parse().ok()) {
                found.push((id, chk.path()));
            }
        }
    }
    found
}

/// Removes the checkpoint directories after the job's latest completed checkpoint. A checkpoint
/// whose `_metadata` write was still in flight when the job ended was aborted and its directory
/// discarded while the write went on, which can leave a `_metadata` without its state files;
/// the tests start from what the job recorded as complete.
fn prune_after(root: &Path, latest: u64) {
    for (id, dir) in chk_dirs(root) {
        if id > latest {
            remove(&dir);
        }
    }
}

/// Removes a directory that may be going away already.
fn remove(dir: &Path) {
    match std::fs::remove_dir_all(dir) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            panic!("cannot remove {}: {e}", dir.display())
        }
        _ => {}
    }
}

/// Keeps only checkpoint `keep` under `root`; returns its directory.
fn keep_only(root: &Path, keep: u64) -> PathBuf {
    let mut kept = None;
    for (id, dir) in chk_dirs(root) {
        if id == keep {
            kept = Some(dir);
        } else {
            remove(&dir);
        }
    }
    kept.unwrap_or_else(|| panic!("no chk-{keep} under {}", root.display()))
}

/// The `latest checkpoint:` id the binary printed.
fn latest_printed(stdout: &str) -> u64 {
    chk_id(
        stdout
            .lines()
            .find_map(|l| l.strip_prefix("latest checkpoint: "))
            .unwrap_or_else(|| panic!("no latest checkpoint line in:\n{stdout}")),
    )
}

/// Flips one byte in the middle of a file.
fn flip_a_byte(file: &Path) {
    let mut bytes = std::fs::read(file).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x5a;
    std::fs::write(file, bytes).unwrap();
}

/// Cuts a file to half its length.
fn truncate_half(file: &Path) {
    let len = std::fs::metadata(file).unwrap().len();
    let f = std::fs::OpenOptions::new().write(true).open(file).unwrap();
    f.set_len(len / 2).unwrap();
}

fn parse_totals(text: &str) -> BTreeMap<String, i64> {
    text.lines()
        .map(|l| {
            let (k, v) = l.split_once(',').unwrap();
            (k.to_string(), v.parse().unwrap())
        })
        .collect()
}

// ---------------------------------------------------------------------------------------------
// Flags.
// ---------------------------------------------------------------------------------------------

#[test]
fn zero_checkpoint_interval_is_rejected() {
    let tmp = tempfile::tempdir().unwrap();
    let run = word_count([
        "--records",
        "1000",
        "--checkpoint-interval",
        "0s",
        "--checkpoint-dir",
        &path_arg(tmp.path()),
    ]);
    assert_clear_error(&run, &["--checkpoint-interval", "greater than zero"]);
}

/// Every numeric flag refuses a value outside its range (too big, or zero where zero means
/// nothing) with a usage error (exit code 2) that names the flag and the range: never a panic
/// (101) or an allocation abort (134). `--help` shows the same ranges.
#[test]
fn numeric_flags_out_of_range_are_refused_naming_the_flag_and_the_range() {
    let tmp = tempfile::tempdir().unwrap();
    const U64_MAX: &str = "18446744073709551615";
    const U32_MAX: &str = "4294967295";
    let cases: &[(&str, &str, &str)] = &[
        ("--batch-size", U64_MAX, "is not in 1..=1048576"),
        ("--batch-size", "4294967296", "is not in 1..=1048576"),
        ("--batch-size", "1048577", "is not in 1..=1048576"),
        ("--batch-size", "0", "is not in 1..=1048576"),
        ("--buffers-per-channel", U64_MAX, "is not in 1..=65536"),
        ("--buffers-per-channel", "0", "is not in 1..=65536"),
        ("--parallelism", U32_MAX, "is not in 1..=32768"),
        ("--parallelism", "0", "is not in 1..=32768"),
        ("--max-parallelism", "32769", "is not in 1..=32768"),
        ("--max-parallelism", "0", "is not in 1..=32768"),
        ("--retain", U32_MAX, "is not in 1..=10000"),
        ("--retain", "0", "is not in 1..=10000"),
        ("--slots", U32_MAX, "is not in 1..=32768"),
        ("--slots", "0", "is not in 1..=32768"),
        ("--checkpoint-every-records", "0", "0 is not in 1..="),
        ("--checkpoint-interval", "0s", "greater than zero"),
        (
            "--checkpoint-interval",
            "500000000000years",
            "longer than 1day",
        ),
        ("--sink-delay", "25h", "longer than 1day"),
        ("--aligned-checkpoint-timeout", "2days", "longer than 1day"),
        ("--heartbeat-interval", "0s", "greater than zero"),
        ("--heartbeat-timeout", "100000h", "longer than 1day"),
        ("--slot-timeout", "0s", "greater than zero"),
        ("--slot-timeout", "48h", "longer than 1day"),
        ("--task-cancellation-timeout", "2days", "longer than 1day"),
    ];
    for (flag, value, range) in cases {
        let run = word_count([
            "--records",
            "1000",
            flag,
            value,
            "--checkpoint-dir",
            &path_arg(tmp.path()),
        ]);
        assert_eq!(run.code, Some(2), "{flag} {value}: stderr:\n{}", run.stderr);
        assert_clear_error(&run, &[&format!("'{value}' for '{flag} "), range]);
    }
    let help = word_count(["--help"]);
    assert!(help.success, "{}", help.stderr);
    for shown in [
        "Records per batch (1..=1048576)",
        "between two subtasks (1..=65536)",
        "Parallelism of every operator (1..=32768",
        "key groups (1..=32768",
        "Completed checkpoints to keep (1..=10000)",
        "slots offered, each running one subtask of every operator (1..=32768)",
        "to create backpressure (at most 1day)",
        "(above 0, at most 1day); absent: checkpoints off",
    ] {
        assert!(
            help.stdout.contains(shown),
            "--help does not show {shown:?}:\n{}",
            help.stdout
        );
    }
}

/// The bounds themselves are accepted, and the job still counts exactly.
#[test]
fn numeric_flags_at_their_bounds_run() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("totals.csv");
    let run = word_count([
        "--records",
        "200000",
        "--batch-size",
        "1048576",
        "--buffers-per-channel",
        "65536",
        "--retain",
        "10000",
        "--max-parallelism",
        "32768",
        "--sink-delay",
        "0s",
        "--checkpoint-dir",
        &path_arg(tmp.path()),
        "--output",
        &path_arg(&out),
    ]);
    assert!(run.success, "{}", run.stderr);
    let totals = parse_totals(&std::fs::read_to_string(&out).unwrap());
    assert_eq!(totals, expected_totals(200_000, 42));
}

/// An API user who configures a value outside its range gets an error from `execute()` that
/// names the setting and the range, not a panic or an allocation abort.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn out_of_range_settings_are_errors_from_execute() {
    type Tweak = fn(&StreamEnvironment);
    let cases: &[(Tweak, &[&str])] = &[
        (
            |env| env.config_mut().batch_size = usize::MAX,
            &["batch size 18446744073709551615", "between 1 and 1048576"],
        ),
        (
            |env| env.config_mut().batch_size = 1 << 32,
            &["batch size 4294967296", "between 1 and 1048576"],
        ),
        (
            |env| env.config_mut().buffers_per_channel = usize::MAX,
            &["buffers per channel", "between 1 and 65536"],
        ),
        (
            |env| {
                env.set_max_parallelism(u32::MAX);
            },
            &["max parallelism 4294967295", "32768"],
        ),
        (
            |env| env.checkpoint_config().num_retained = u32::MAX,
            &["retained checkpoints (4294967295)", "between 1 and 10000"],
        ),
        (
            |env| {
                env.enable_checkpointing(Duration::MAX);
            },
            &["checkpoint interval", "at most 86400s"],
        ),
        (
            |env| env.checkpoint_config().timeout = Duration::MAX,
            &["checkpoint timeout", "at most 86400s"],
        ),
        (
            |env| {
                env.set_restart_strategy(weir_runtime::RestartStrategy::ExponentialDelay {
                    initial: Duration::MAX,
                    max: Duration::MAX,
                    reset_after: Duration::from_secs(1),
                    attempts: 3,
                });
            },
            &["initial restart delay", "at most 86400s"],
        ),
        (
            |env| env.config_mut().task_cancellation_timeout = Duration::MAX,
            &["task cancellation timeout", "at most 86400s"],
        ),
    ];
    let tmp = tempfile::tempdir().unwrap();
    for (i, (tweak, needles)) in cases.iter().enumerate() {
        let opts = WordCountOptions {
            records: Some(1000),
            checkpoint_dir: tmp.path().join(i.to_string()),
            ..WordCountOptions::default()
        };
        let (env, _, _) = build(&opts);
        tweak(&env);
        let err = env
            .execute()
            .bounded()
            .await
            .expect_err("a job configured out of range ran");
        assert!(matches!(err, JobError::Invalid(_)), "case {i}: {err:?}");
        let message = err.to_string();
        for n in *needles {
            assert!(
                message.contains(n),
                "case {i}: {message:?} does not mention {n:?}"
            );
        }
    }
    // A parallelism above every possible max parallelism is the graph's error.
    let (env, _, _) = build(&WordCountOptions {
        records: Some(1000),
        parallelism: u32::MAX,
        checkpoint_dir: tmp.path().join("p"),
        ..WordCountOptions::default()
    });
    let message = env.execute().bounded().await.unwrap_err().to_string();
    assert!(
        message.contains("invalid parallelism 4294967295") && message.contains("32768"),
        "{message}"
    );
}

#[test]
fn parallelism_above_max_parallelism_is_rejected() {
    let tmp = tempfile::tempdir().unwrap();
    let run = word_count([
        "--records",
        "1000",
        "--parallelism",
        "300",
        "--max-parallelism",
        "128",
        "--checkpoint-dir",
        &path_arg(tmp.path()),
    ]);
    assert_clear_error(&run, &["parallelism 300", "max parallelism 128"]);
}

// ---------------------------------------------------------------------------------------------
// Checkpoint directories and `--from`.
// ---------------------------------------------------------------------------------------------

#[test]
fn checkpoint_dir_below_a_regular_file_is_rejected() {
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("a-file");
    std::fs::write(&file, b"not a directory").unwrap();
    let dir = file.join("checkpoints");
    let run = word_count([
        "--records",
        "1000",
        "--checkpoint-interval",
        "50ms",
        "--checkpoint-dir",
        &path_arg(&dir),
    ]);
    assert_clear_error(&run, &["checkpoint storage", &path_arg(&dir)]);
}

#[test]
fn from_a_missing_path_is_rejected() {
    let tmp = tempfile::tempdir().unwrap();
    let missing = tmp.path().join("no-such-checkpoint");
    let run = word_count([
        "--records",
        "1000",
        "--from",
        &path_arg(&missing),
        "--checkpoint-dir",
        &path_arg(&tmp.path().join("cp")),
    ]);
    assert_clear_error(&run, &[&path_arg(&missing), "no such directory"]);
}

#[test]
fn from_an_empty_directory_is_rejected() {
    let tmp = tempfile::tempdir().unwrap();
    let empty = tmp.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    let run = word_count([
        "--records",
        "1000",
        "--from",
        &path_arg(&empty),
        "--checkpoint-dir",
        &path_arg(&tmp.path().join("cp")),
    ]);
    assert_clear_error(&run, &[&path_arg(&empty), "no complete checkpoint"]);
}

/// Runs the binary with checkpoints until it completes one; returns the root and the latest
/// checkpoint's id.
fn binary_run_with_a_checkpoint(tmp: &Path, extra: &[&str]) -> (PathBuf, u64) {
    let mut records = 400_000u64;
    for _ in 0..4 {
        let root = tmp.join(format!("checkpoints-{records}"));
        let mut args = vec![
            "--records".to_string(),
            records.to_string(),
            "--checkpoint-interval".into(),
            "20ms".into(),
            "--checkpoint-dir".into(),
            path_arg(&root),
        ];
        args.extend(extra.iter().map(|s| s.to_string()));
        let run = word_count(&args);
        assert!(run.success, "{}", run.stderr);
        if run.stdout.contains("latest checkpoint: ") {
            let latest = latest_printed(&run.stdout);
            prune_after(&root, latest);
            return (root, latest);
        }
        records *= 4;
    }
    panic!("no run completed a checkpoint");
}

#[test]
fn corrupt_metadata_of_the_only_checkpoint_is_a_clear_error() {
    let tmp = tempfile::tempdir().unwrap();
    let (root, latest) = binary_run_with_a_checkpoint(tmp.path(), &[]);
    let chk = keep_only(&root, latest);
    flip_a_byte(&chk.join("_metadata"));
    let run = word_count([
        "--records",
        "400000",
        "--from",
        &path_arg(&root),
        "--checkpoint-dir",
        &path_arg(&tmp.path().join("cp2")),
    ]);
    assert_clear_error(&run, &["_metadata"]);
}

#[test]
fn max_parallelism_differing_from_the_checkpoint_is_rejected() {
    let tmp = tempfile::tempdir().unwrap();
    let (root, _) = binary_run_with_a_checkpoint(tmp.path(), &["--max-parallelism", "128"]);
    let run = word_count([
        "--records",
        "400000",
        "--max-parallelism",
        "256",
        "--from",
        &path_arg(&root),
        "--checkpoint-dir",
        &path_arg(&tmp.path().join("cp2")),
    ]);
    assert_clear_error(&run, &["max parallelism 128", "256"]);
}

/// With `num_retained = 3`, runs the word count in-process until at least two complete
/// checkpoints are retained; returns the options and the root.
async fn word_count_with_retained_checkpoints(tmp: &Path) -> WordCountOptions {
    let mut records = 1_000_000u64;
    for _ in 0..4 {
        let opts = WordCountOptions {
            records: Some(records),
            parallelism: 2,
            checkpoint_interval: Some(Duration::from_millis(20)),
            checkpoint_dir: tmp.join(format!("checkpoints-{records}")),
            ..WordCountOptions::default()
        };
        let (env, totals, _) = build(&opts);
        env.checkpoint_config().num_retained = 3;
        let result = env.execute().bounded().await.unwrap();
        assert_eq!(totals.get(), expected_totals(records, opts.seed));
        if let Some(latest) = &result.latest_checkpoint {
            prune_after(&opts.checkpoint_dir, chk_id(latest));
        }
        if complete_checkpoints(&opts.checkpoint_dir).len() >= 2 {
            return opts;
        }
        records *= 4;
    }
    panic!("no run retained two complete checkpoints");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corrupt_metadata_falls_back_to_the_previous_checkpoint() {
    let tmp = tempfile::tempdir().unwrap();
    let opts = word_count_with_retained_checkpoints(tmp.path()).await;
    let root = &opts.checkpoint_dir;
    let all = complete_checkpoints(root);
    let newest = all.last().unwrap();
    flip_a_byte(&newest.join("_metadata"));

    let out = tmp.path().join("totals.csv");
    let records = opts.records.unwrap().to_string();
    let run = word_count([
        "--records",
        &records,
        "--parallelism",
        "2",
        "--from",
        &path_arg(root),
        "--checkpoint-dir",
        &path_arg(&tmp.path().join("cp2")),
        "--output",
        &path_arg(&out),
    ]);
    assert!(run.success, "{}", run.stderr);
    processes::assert_restored(&run.stdout, opts.records.unwrap(), &[root]);
    assert!(
        run.stderr.contains("_metadata") && run.stderr.contains("falling back"),
        "the fallback is not reported:\n{}",
        run.stderr
    );
    let totals = parse_totals(&std::fs::read_to_string(&out).unwrap());
    assert_eq!(totals, expected_totals(opts.records.unwrap(), opts.seed));
}

// ---------------------------------------------------------------------------------------------
// Corrupt state files: a job with enough keys that its state leaves the 20 KiB inline threshold.
// ---------------------------------------------------------------------------------------------

const MANY_KEYS: u64 = 20_000;

fn many_keys_job(
    records: u64,
    root: &Path,
    retained: u32,
    from: Option<&Path>,
) -> (StreamEnvironment, LatestHandle<u64, i64>) {
    let env = StreamEnvironment::new();
    env.set_job_name("many-keys")
        .set_parallelism(2)
        .enable_checkpointing(Duration::from_millis(20))
        .set_checkpoint_dir(root);
    env.checkpoint_config().num_retained = retained;
    if let Some(from) = from {
        env.restore_from(from);
    }
    let keys = env
        .from_generator(Some(records), |i| i)
        .uid("source")
        .map(|i: u64| (i.wrapping_mul(0x9e37_79b9) % MANY_KEYS, 1i64))
        .uid("keys");
    // An exactly-once collect sink: its pre-committed transactions are large operator state, so
    // checkpoints hold `-op` files as well as `-keyed` ones.
    keys.clone().collect();
    let totals = keys
        .key_by(|t: &(u64, i64)| &t.0)
        .sum()
        .uid("sum")
        .latest_per_key();
    (env, totals)
}

fn many_keys_expected(records: u64) -> BTreeMap<u64, i64> {
    let mut m = BTreeMap::new();
    for i in 0..records {
        *m.entry(i.wrapping_mul(0x9e37_79b9) % MANY_KEYS)
            .or_insert(0) += 1;
    }
    m
}

/// Runs the many-keys job until `retained` complete checkpoints are left; returns the record
/// count, the checkpoint root and the latest checkpoint's id.
async fn many_keys_with_checkpoints(tmp: &Path, retained: u32) -> (u64, PathBuf, u64) {
    many_keys_with_checkpoints_where(tmp, retained, |_| true).await
}

/// The same, until the complete checkpoints left also pass `enough`.
async fn many_keys_with_checkpoints_where(
    tmp: &Path,
    retained: u32,
    enough: impl Fn(&[PathBuf]) -> bool,
) -> (u64, PathBuf, u64) {
    let mut records = 400_000u64;
    for _ in 0..4 {
        let root = tmp.join(format!("checkpoints-{records}"));
        let (env, totals) = many_keys_job(records, &root, retained, None);
        let result = env.execute().bounded().await.unwrap();
        assert_eq!(totals.get(), many_keys_expected(records));
        if let Some(latest) = &result.latest_checkpoint {
            let latest = chk_id(latest);
            prune_after(&root, latest);
            let complete = complete_checkpoints(&root);
            if complete.len() >= retained as usize && enough(&complete) {
                return (records, root, latest);
            }
        }
        records *= 4;
    }
    panic!("no run left {retained} complete checkpoints");
}

/// The state files of a checkpoint whose names end with `suffix` (`-keyed` or `-op`).
fn state_files(chk: &Path, suffix: &str) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(chk)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.to_string_lossy().ends_with(suffix))
        .collect();
    files.sort();
    assert!(
        !files.is_empty(),
        "no *{suffix} state file in {} (state inlined?): {:?}",
        chk.display(),
        std::fs::read_dir(chk)
            .unwrap()
            .flatten()
            .map(|e| (e.file_name(), e.metadata().map(|m| m.len()).unwrap_or(0)))
            .collect::<Vec<_>>()
    );
    files
}

async fn restore_many_keys(records: u64, tmp: &Path, root: &Path) -> Result<JobResult, JobError> {
    let (env, totals) = many_keys_job(records, &tmp.join("restored"), 1, Some(root));
    let result = env.execute().bounded().await;
    if result.is_ok() {
        assert_eq!(totals.get(), many_keys_expected(records));
    }
    result
}

/// Corrupts the newest checkpoint with `damage` on its `suffix` file; the restore must fall back
/// to the previous checkpoint and still give exact totals.
async fn state_damage_falls_back(suffix: &str, damage: fn(&Path)) {
    let tmp = tempfile::tempdir().unwrap();
    // The newest checkpoint with such a file, and one before it: checkpoints taken once the
    // sources finished hold no source state, so they may have no `-op` file. Later ones go.
    let with_file = |c: &PathBuf| {
        std::fs::read_dir(c)
            .unwrap()
            .flatten()
            .any(|e| e.file_name().to_string_lossy().ends_with(suffix))
    };
    let enough = |all: &[PathBuf]| (1..all.len()).any(|i| with_file(&all[i]));
    let (records, root, _) = many_keys_with_checkpoints_where(tmp.path(), 4, enough).await;
    let mut all = complete_checkpoints(&root);
    let at = (1..all.len())
        .rev()
        .find(|&i| with_file(&all[i]))
        .unwrap_or_else(|| panic!("no two checkpoints with a *{suffix} file: {all:?}"));
    prune_after(&root, chk_id(&all[at].to_string_lossy()));
    all.truncate(at + 1);
    let (older, newest) = (&all[at - 1], &all[at]);
    damage(&state_files(newest, suffix)[0]);
    let result = restore_many_keys(records, tmp.path(), &root)
        .await
        .unwrap_or_else(|e| panic!("the restore did not fall back: {e}"));
    let from = result.restored_from.clone().unwrap();
    let older_name = older.file_name().unwrap().to_string_lossy().into_owned();
    assert!(
        from.ends_with(&format!("/{older_name}")),
        "restored from {from}, expected {older_name}"
    );
    // Exact totals (checked by the restore) only because the older checkpoint's state was used.
    support::assert_restored(&result, records, "fell back past a damaged file");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corrupt_keyed_state_file_falls_back_to_the_previous_checkpoint() {
    state_damage_falls_back("-keyed", flip_a_byte).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn truncated_operator_state_file_falls_back_to_the_previous_checkpoint() {
    state_damage_falls_back("-op", truncate_half).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corrupt_state_file_of_the_only_checkpoint_is_an_error_naming_it() {
    let tmp = tempfile::tempdir().unwrap();
    let (records, root, latest) = many_keys_with_checkpoints(tmp.path(), 1).await;
    let chk = keep_only(&root, latest);
    let file = state_files(&chk, "-keyed")[0].clone();
    flip_a_byte(&file);
    let err = restore_many_keys(records, tmp.path(), &root)
        .await
        .expect_err("restored from a corrupt checkpoint");
    let message = err.to_string();
    let name = file.file_name().unwrap().to_string_lossy().into_owned();
    assert!(message.contains(&name), "{message}");
    assert!(message.contains("corrupt"), "{message}");
}

// ---------------------------------------------------------------------------------------------
// Storage that becomes unwritable mid-run.
// ---------------------------------------------------------------------------------------------

/// Once the first checkpoint is complete, the checkpoint root is replaced by a regular file, so
/// every later checkpoint fails. The job must not fail: it finishes with exact totals and
/// reports the failed checkpoints.
///
/// To be sure checkpoints are attempted after the switch, a map slows the job down (1 ms every
/// 64 records) until the switch has been in place for 300 ms.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn storage_unwritable_mid_run_fails_checkpoints_not_the_job() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("checkpoints");
    let records: u64 = 400_000;
    let released = Arc::new(AtomicBool::new(false));

    let env = StreamEnvironment::new();
    env.set_job_name("unwritable")
        .set_parallelism(2)
        .enable_checkpointing(Duration::from_millis(20))
        .set_checkpoint_dir(&root);
    let seen = Arc::new(AtomicU64::new(0));
    let brake = released.clone();
    let totals = env
        .from_generator(Some(records), |i| i)
        .uid("source")
        .map(move |i: u64| {
            let n = seen.fetch_add(1, Ordering::Relaxed);
            if n.is_multiple_of(64) && !brake.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(1));
            }
            (i % 7, 1i64)
        })
        .uid("brake")
        .key_by(|t: &(u64, i64)| &t.0)
        .sum()
        .uid("sum")
        .latest_per_key();

    let watcher = {
        let root = root.clone();
        let released = released.clone();
        std::thread::spawn(move || {
            let deadline = Instant::now() + Duration::from_secs(60);
            while complete_checkpoints(&root).is_empty() {
                assert!(Instant::now() < deadline, "no first checkpoint in a minute");
                std::thread::sleep(Duration::from_millis(2));
            }
            std::fs::rename(&root, root.with_extension("moved")).unwrap();
            std::fs::write(&root, b"no longer a directory").unwrap();
            std::thread::sleep(Duration::from_millis(300));
            released.store(true, Ordering::Relaxed);
        })
    };
    let result = env.execute().bounded().await;
    released.store(true, Ordering::Relaxed);
    watcher.join().unwrap();
    let result = result.unwrap_or_else(|e| panic!("the job failed: {e}"));
    assert_eq!(result.status, JobStatus::Finished);
    assert_eq!(result.restarts, 0);
    assert!(result.checkpoints_completed >= 1, "{result:?}");
    assert!(result.checkpoints_failed > 0, "{result:?}");
    let mut expected = BTreeMap::new();
    for i in 0..records {
        *expected.entry(i % 7).or_insert(0i64) += 1;
    }
    assert_eq!(totals.get(), expected);
}
