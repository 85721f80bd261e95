//! Rescale round trips 2 → 4 → 1 through savepoints, in-process and through the `word_count` binary, give exact results.
//! It also covers backends: savepoints (canonical format) move between the heap and disk keyed-state
//! backends at changed parallelisms through the binary.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "support/processes.rs"]
mod processes;
mod support;
use support::{Bounded, BoundedCommand};

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;
use weir_core::keygroup::{assign_to_key_group, compute_key_group_range_for_operator_index};
use weir_examples::{WordCountOptions, build, expected_totals, expected_totals_in};
use weir_runtime::StreamEnvironment;

const RECORDS: u64 = 1_500_000;
/// Each stopped run stops once its sources emitted this many records.
const STOP_AFTER: u64 = 200_000;
const SEED: u64 = 42;
/// The parallelism of each run: the last one runs to the end.
const ROUND_TRIP: [u32; 3] = [2, 4, 1];

// ---------------------------------------------------------------------------------------------
// The word count in-process.
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn word_count_round_trip_2_4_1_in_process_gives_exact_totals() {
    let tmp = tempfile::tempdir().unwrap();
    let mut from: Option<PathBuf> = None;
    // Records emitted over all runs so far: each run's sources emit only what the savepoint it
    // resumed from did not cover.
    let mut emitted = 0u64;
    for (n, parallelism) in ROUND_TRIP.into_iter().enumerate() {
        let last = n + 1 == ROUND_TRIP.len();
        let ctx = format!("run {n} at parallelism {parallelism} from {from:?}");
        let opts = WordCountOptions {
            records: Some(RECORDS),
            parallelism,
            seed: SEED,
            checkpoint_interval: Some(Duration::from_millis(20)),
            checkpoint_dir: tmp.path().join(format!("checkpoints-{n}")),
            savepoint_dir: Some(tmp.path().join("savepoints")),
            from: from.clone(),
            ..WordCountOptions::default()
        };
        let (env, totals, _) = build(&opts);
        let r = if last {
            env.execute()
                .bounded()
                .await
                .unwrap_or_else(|e| panic!("{ctx}: {e}"))
        } else {
            let (r, savepoint) =
                support::run_and_stop(env, STOP_AFTER, &tmp.path().join("savepoints"), &ctx).await;
            from = Some(savepoint);
            r
        };
        assert_eq!(r.restarts, 0, "{ctx}");
        if n > 0 {
            let restored = r.restored_from.clone().unwrap_or_default();
            assert!(
                restored.contains("savepoint-"),
                "{ctx}: restored from {restored:?}"
            );
        }
        emitted += r.source_records;
        let totals = totals.get();
        // Every record emitted so far is counted once: the totals the sink publishes at the end
        // of each run include the restored counts.
        assert_eq!(
            totals.values().sum::<i64>() as u64,
            emitted,
            "{ctx}: totals {totals:?}"
        );
        if last {
            assert_eq!(totals, expected_totals(RECORDS, SEED), "{ctx}");
            assert_eq!(emitted, RECORDS, "{ctx}");
        } else {
            assert!(emitted < RECORDS, "{ctx}: the job stopped late");
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The word count binary.
// ---------------------------------------------------------------------------------------------

struct Run {
    stdout: String,
    stderr: String,
    success: bool,
}

fn word_count(dir: &Path, args: &[&str]) -> Run {
    let out = Command::new(env!("CARGO_BIN_EXE_word_count"))
        .current_dir(dir)
        .env_remove("RUST_LOG")
        .args(args)
        .output_bounded()
        .unwrap();
    Run {
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        success: out.status.success(),
    }
}

fn savepoint_of(run: &Run) -> PathBuf {
    let line = run
        .stdout
        .lines()
        .find_map(|l| l.strip_prefix("stopped with savepoint: "))
        .unwrap_or_else(|| panic!("no savepoint printed:\n{}\n{}", run.stdout, run.stderr));
    PathBuf::from(line.strip_prefix("file://").unwrap_or(line))
}

/// The `totals:` line: `word=count …`.
fn printed_totals(run: &Run) -> BTreeMap<String, i64> {
    let line = run
        .stdout
        .lines()
        .find_map(|l| l.strip_prefix("totals: "))
        .unwrap_or_else(|| panic!("no totals line:\n{}", run.stdout));
    line.split_whitespace()
        .map(|kv| {
            let (k, v) = kv.split_once('=').unwrap();
            (k.to_string(), v.parse().unwrap())
        })
        .collect()
}

/// `records=` of the `summary:` line (for a stopped run, the records its sources emitted).
fn summary_records(run: &Run) -> u64 {
    let line = run
        .stdout
        .lines()
        .find(|l| l.starts_with("summary:"))
        .unwrap_or_else(|| panic!("no summary line:\n{}", run.stdout));
    line.split_whitespace()
        .find_map(|t| t.strip_prefix("records="))
        .unwrap()
        .parse()
        .unwrap()
}

#[test]
fn word_count_binary_round_trip_2_4_1_gives_exact_totals() {
    let tmp = tempfile::tempdir().unwrap();
    let records = RECORDS.to_string();
    let stop = STOP_AFTER.to_string();
    let out = tmp.path().join("totals.csv");
    let mut from: Option<PathBuf> = None;
    let mut emitted = 0u64;
    for (n, parallelism) in ROUND_TRIP.into_iter().enumerate() {
        let last = n + 1 == ROUND_TRIP.len();
        let p = parallelism.to_string();
        let cp = format!("checkpoints-{n}");
        let mut args = vec![
            "--records",
            &records,
            "--parallelism",
            &p,
            "--checkpoint-interval",
            "20ms",
            "--checkpoint-dir",
            &cp,
            "--savepoint-dir",
            "savepoints",
            "--running-sums",
            "sums",
        ];
        let from_arg = from.as_ref().map(|f| f.to_str().unwrap().to_string());
        if let Some(f) = &from_arg {
            args.extend(["--from", f]);
        }
        let out_arg = out.to_str().unwrap().to_string();
        if last {
            args.extend(["--output", &out_arg]);
        } else {
            args.extend(["--stop-with-savepoint-after", &stop]);
        }
        let run = word_count(tmp.path(), &args);
        let ctx = format!("run {n}: word_count {}", args.join(" "));
        assert!(run.success, "{ctx}:\n{}", run.stderr);
        let totals = printed_totals(&run);
        if last {
            let written: BTreeMap<String, i64> = std::fs::read_to_string(&out)
                .unwrap()
                .lines()
                .map(|l| {
                    let (k, v) = l.split_once(',').unwrap();
                    (k.to_string(), v.parse().unwrap())
                })
                .collect();
            assert_eq!(written, expected_totals(RECORDS, SEED), "{ctx}");
            assert_eq!(totals, written, "{ctx}");
            // Exact only because the savepoint's state was used: this run resumed from it.
            let saved = from.as_ref().expect("the last run restores");
            processes::assert_restored(&run.stdout, RECORDS, &[saved]);
            // Each running count was committed once over the three runs.
            processes::assert_running_sums(&tmp.path().join("sums"), &written);
        } else {
            emitted += summary_records(&run);
            assert!(emitted < RECORDS, "{ctx}: stopped late");
            assert_eq!(
                totals.values().sum::<i64>() as u64,
                emitted,
                "{ctx}: {totals:?}"
            );
            from = Some(savepoint_of(&run));
        }
    }
}

/// The backend and parallelism of each run of the backend round trip: the last one runs to the
/// end, and each hop changes both.
const BACKEND_ROUND_TRIP: [(&str, u32); 4] = [("heap", 2), ("disk", 3), ("heap", 1), ("disk", 2)];

/// Flink's canonical savepoint portability: a savepoint one keyed-state backend took restores
/// into the other, at another parallelism. heap at 2 → disk at 3 → heap at 1 → disk at 2, over
/// 5000 keys (many per key group), each disk run in its own state directory.
///
/// Each resumed run must name the savepoint it was given in `restored from:` and resume the
/// sources (not start over); its totals must count every record emitted over the runs so far,
/// no key's count may go down from one run to the next, and the last run's totals must be the
/// ones computed without the engine. A backend that restored the sources' offsets but dropped
/// (or misplaced) the keyed state fails the sum, the per-key or the final check.
#[test]
fn savepoints_move_between_heap_and_disk_backends_at_any_parallelism() {
    let records_n: u64 = 600_000;
    let key_space: u64 = 5_000;
    let tmp = tempfile::tempdir().unwrap();
    let records = records_n.to_string();
    let seed = SEED.to_string();
    let keys = key_space.to_string();
    let stop = 150_000u64.to_string();
    let out = tmp.path().join("totals.csv");
    let out_arg = out.to_str().unwrap().to_string();
    let expected = expected_totals_in(records_n, SEED, key_space);
    assert_eq!(expected.len() as u64, key_space, "every key occurs");
    let mut from: Option<PathBuf> = None;
    let mut emitted = 0u64;
    let mut previous: BTreeMap<String, i64> = BTreeMap::new();
    for (n, (backend, parallelism)) in BACKEND_ROUND_TRIP.into_iter().enumerate() {
        let last = n + 1 == BACKEND_ROUND_TRIP.len();
        let p = parallelism.to_string();
        let cp = format!("checkpoints-{n}");
        let state_dir = format!("state-{n}");
        let mut args = vec![
            "--records",
            &records,
            "--seed",
            &seed,
            "--key-space",
            &keys,
            "--parallelism",
            &p,
            "--state-backend",
            backend,
            "--checkpoint-interval",
            "20ms",
            "--checkpoint-dir",
            &cp,
            "--savepoint-dir",
            "savepoints",
            "--no-rest",
        ];
        if backend == "disk" {
            args.extend(["--state-dir", &state_dir]);
        }
        let from_arg = from.as_ref().map(|f| f.to_str().unwrap().to_string());
        if let Some(f) = &from_arg {
            args.extend(["--from", f]);
        }
        if last {
            args.extend(["--output", &out_arg]);
        } else {
            args.extend(["--stop-with-savepoint-after", &stop]);
        }
        let run = word_count(tmp.path(), &args);
        let ctx = format!("run {n}: word_count {}", args.join(" "));
        assert!(run.success, "{ctx}:\n{}", run.stderr);
        if let Some(saved) = &from {
            // Resumed from the savepoint it was given, not started over.
            processes::assert_restored(&run.stdout, records_n, &[saved]);
        }
        emitted += processes::summary_field(&run.stdout, "emitted");
        let totals = printed_totals(&run);
        // Every record emitted so far is counted once: the totals include the restored counts.
        assert_eq!(
            totals.values().sum::<i64>() as u64,
            emitted,
            "{ctx}: the totals do not count the {emitted} records emitted so far"
        );
        for (k, v) in &totals {
            let before = previous.get(k).copied().unwrap_or(0);
            let at_end = expected.get(k).copied().unwrap_or(0);
            assert!(
                before <= *v && *v <= at_end,
                "{ctx}: {k}={v}, after {before} in the previous run, of {at_end} at the end"
            );
        }
        if last {
            assert_eq!(emitted, records_n, "{ctx}: the runs' records do not add up");
            let written = processes::parse_totals(&out);
            let wrong: Vec<_> = expected
                .iter()
                .filter(|(k, v)| written.get(*k) != Some(v))
                .map(|(k, v)| format!("{k}: {:?} instead of {v}", written.get(k)))
                .collect();
            assert!(
                wrong.is_empty() && written.len() == expected.len(),
                "{ctx}: {} of {} written totals are wrong, e.g. {:?}",
                wrong.len(),
                written.len(),
                &wrong[..wrong.len().min(5)]
            );
            assert!(
                totals == written,
                "{ctx}: the printed totals are not the written ones"
            );
        } else {
            assert!(emitted < records_n, "{ctx}: stopped late");
            from = Some(savepoint_of(&run));
            previous = totals;
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Operator state in a round trip: the file sink's pending transactions.
// ---------------------------------------------------------------------------------------------

const MAX_PARALLELISM: u32 = 128;

/// A key whose key group subtask 1 of 2 and subtask 2 or 3 of 4 own: every record goes to one
/// sink subtask, and the others' transactions are empty.
fn hot_key() -> u64 {
    (0..)
        .find(|k: &u64| {
            let kg = assign_to_key_group(k, MAX_PARALLELISM);
            compute_key_group_range_for_operator_index(MAX_PARALLELISM, 2, 1).contains(kg)
                && !compute_key_group_range_for_operator_index(MAX_PARALLELISM, 4, 0).contains(kg)
        })
        .unwrap()
}

/// The lines of the committed part files under `dir` (temporary ones excluded), with the file
/// each came from.
fn committed_lines(dir: &Path) -> Vec<(String, String)> {
    let mut lines = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with('.') {
            continue;
        }
        for line in std::fs::read_to_string(entry.path()).unwrap().lines() {
            lines.push((line.to_string(), name.clone()));
        }
    }
    lines
}

/// generator → map to `(hot key, 1)` → key_by → sum → file sink, through the 2 → 4 → 1 round trip
/// with periodic checkpoints: its operator state is the source's splits and the sink's pending
/// transactions (both split-distribute; no public operator uses union or broadcast state). The
/// committed lines must be the running counts `1..=records`, each once.
///
/// A two-phase-commit sink restored at another parallelism is handed other old subtasks'
/// pending transactions (split-distribute); it must commit them under the subtask that opened
/// them, or the file committer's `part-<subtask>-<transaction>` would write them a second time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn file_sink_round_trip_2_4_1_commits_each_line_once() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    let records: u64 = 300_000;
    let key = hot_key();
    let mut from: Option<PathBuf> = None;
    let mut emitted = 0u64;
    for (n, parallelism) in ROUND_TRIP.into_iter().enumerate() {
        let last = n + 1 == ROUND_TRIP.len();
        let ctx = format!("run {n} at parallelism {parallelism}");
        let env = StreamEnvironment::new();
        env.set_job_name("file-sink-rescale")
            .set_parallelism(parallelism)
            .set_max_parallelism(MAX_PARALLELISM)
            .enable_checkpointing(Duration::from_millis(50))
            .set_checkpoint_dir(tmp.path().join(format!("checkpoints-{n}")));
        if let Some(f) = &from {
            env.restore_from(f);
        }
        // The stopped runs are slowed down (1 ms per 100 records and subtask), so that they
        // are stopped long before their end.
        let seen = std::sync::atomic::AtomicU64::new(0);
        env.from_generator(Some(records), |i| i)
            .uid("source")
            .map(move |_: u64| {
                let n = seen.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if !last && n % 100 == 99 {
                    std::thread::sleep(Duration::from_millis(1));
                }
                (key, 1i64)
            })
            .uid("pair")
            .key_by(|t: &(u64, i64)| &t.0)
            .sum()
            .uid("count")
            .write_to_files(&out)
            .uid("files");
        let r = if last {
            env.execute()
                .bounded()
                .await
                .unwrap_or_else(|e| panic!("{ctx}: {e}"))
        } else {
            let (r, savepoint) =
                support::run_and_stop(env, records / 5, &tmp.path().join("savepoints"), &ctx).await;
            from = Some(savepoint);
            r
        };
        emitted += r.source_records;
        let lines = committed_lines(&out);
        let mut counts: BTreeMap<i64, Vec<&str>> = BTreeMap::new();
        for (line, file) in &lines {
            let count: i64 = line
                .strip_prefix(&format!("({key},"))
                .and_then(|l| l.strip_suffix(')'))
                .unwrap_or_else(|| panic!("{ctx}: bad line {line:?} in {file}"))
                .parse()
                .unwrap();
            counts.entry(count).or_default().push(file);
        }
        let duplicated: Vec<_> = counts.iter().filter(|(_, f)| f.len() > 1).take(3).collect();
        let files: std::collections::BTreeSet<&str> =
            lines.iter().map(|(_, f)| f.as_str()).collect();
        assert!(
            duplicated.is_empty(),
            "{ctx}: lines committed more than once, e.g. {duplicated:?}; part files {files:?}"
        );
        let expected: Vec<i64> = (1..=emitted as i64).collect();
        let got: Vec<i64> = counts.keys().copied().collect();
        assert!(
            got == expected,
            "{ctx}: committed {} lines, expected 1..={emitted}",
            got.len()
        );
    }
    assert_eq!(emitted, records);
}
