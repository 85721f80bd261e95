//! Process-level tests of the `word_count` binary: SIGKILL mid-run then restore from disk gives
//! exact totals; SIGINT cancels promptly whatever an operator costs per record and exits 130;
//! `--output` is written whole, and only by a finished run; the `summary:` line parses.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../../runtime/tests/support/bounded.rs"]
mod bounded;
use bounded::BoundedCommand;

#[path = "support/processes.rs"]
mod processes;

use processes::{StderrLines, assert_restored, assert_running_sums, interrupt, wait_output};
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};
use weir_examples::expected_totals;

/// The binary, with the environment that would change its output removed.
fn word_count() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_word_count"));
    cmd.env_remove("RUST_LOG")
        .env_remove("RUST_BACKTRACE")
        .env_remove("RUST_LIB_BACKTRACE");
    cmd
}

/// The ids of the complete checkpoints (`<job>/chk-<n>/_metadata`) under a root.
fn complete_checkpoint_ids(root: &Path) -> BTreeSet<u64> {
    let mut ids = BTreeSet::new();
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
                ids.insert(id);
            }
        }
    }
    ids
}

/// Polls until `n` distinct checkpoints have been seen complete under `root` (the binary retains
/// one, so they are seen one after another). Fails if the child exits first or after a minute.
fn wait_for_checkpoints(child: &mut Child, root: &Path, n: usize) -> BTreeSet<u64> {
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut seen = BTreeSet::new();
    loop {
        seen.extend(complete_checkpoint_ids(root));
        if seen.len() >= n {
            return seen;
        }
        if let Some(status) = child.try_wait().unwrap() {
            panic!("word_count exited ({status}) after only {seen:?} complete checkpoints");
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("no {n} complete checkpoints within a minute (saw {seen:?})");
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Waits for a child with a timeout, killing it if it does not end. Its pipes are drained while
/// it runs, so a child that writes more than a pipe holds (a large totals line) never blocks.
fn wait_with_timeout(mut child: Child, timeout: Duration) -> (ExitStatus, String, String) {
    use std::io::Read;
    let drain = |pipe: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut out = Vec::new();
            if let Some(mut p) = pipe {
                let _ = p.read_to_end(&mut out);
            }
            String::from_utf8_lossy(&out).into_owned()
        })
    };
    let stdout = drain(
        child
            .stdout
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
    );
    let stderr = drain(
        child
            .stderr
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
    );
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return (status, stdout.join().unwrap(), stderr.join().unwrap());
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "word_count did not end within {timeout:?}; stderr:\n{}",
                stderr.join().unwrap()
            );
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Parses `key,total` lines.
fn parse_totals(text: &str) -> BTreeMap<String, i64> {
    text.lines()
        .map(|l| {
            let (k, v) = l
                .split_once(',')
                .unwrap_or_else(|| panic!("bad line {l:?}"));
            (k.to_string(), v.parse().unwrap())
        })
        .collect()
}

/// The fields of the `summary:` line.
#[derive(Debug)]
struct Summary {
    records: u64,
    emitted: u64,
    since_restore: u64,
    seconds: f64,
    records_per_s: f64,
    checkpoints: u64,
    restarts: u32,
}

fn parse_summary(stdout: &str) -> Summary {
    let line = stdout
        .lines()
        .find(|l| l.starts_with("summary: "))
        .unwrap_or_else(|| panic!("no summary line in:\n{stdout}"));
    let fields: BTreeMap<&str, &str> = line["summary: ".len()..]
        .split_whitespace()
        .map(|kv| {
            kv.split_once('=')
                .unwrap_or_else(|| panic!("bad field {kv:?}"))
        })
        .collect();
    let get = |k: &str| {
        *fields
            .get(k)
            .unwrap_or_else(|| panic!("no {k}= in {line:?}"))
    };
    Summary {
        records: get("records").parse().unwrap(),
        emitted: get("emitted").parse().unwrap(),
        since_restore: get("since_restore").parse().unwrap(),
        seconds: get("seconds").parse().unwrap(),
        records_per_s: get("records_per_s").parse().unwrap(),
        checkpoints: get("checkpoints").parse().unwrap(),
        restarts: get("restarts").parse().unwrap(),
    }
}

#[test]
fn sigkill_mid_run_then_restore_from_disk_gives_exact_totals() {
    sigkill_then_restore(&[]);
}

/// The same with incremental checkpoints: the restore reads chains of deltas written by the
/// killed process.
#[test]
fn sigkill_mid_run_then_restore_from_incremental_checkpoints_gives_exact_totals() {
    sigkill_then_restore(&["--incremental"]);
}

/// The same with keyed state on disk and native incremental checkpoints, over 20,000 keys: the
/// restore downloads the killed process's runs and links them into new stores.
#[test]
fn sigkill_mid_run_then_restore_from_native_disk_checkpoints_gives_exact_totals() {
    let local = tempfile::tempdir().unwrap();
    let dir = local.path().to_string_lossy().into_owned();
    let args = [
        "--incremental",
        "--state-backend",
        "disk",
        "--state-dir",
        &dir,
        "--key-space",
        "20000",
    ];
    sigkill_then_restore_records(&args, 600_000, 20_000);
}

fn sigkill_then_restore(extra: &[&str]) {
    sigkill_then_restore_records(extra, 3_000_000, weir_examples::DIGITS);
}

fn sigkill_then_restore_records(extra: &[&str], records: u64, key_space: u64) {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("checkpoints");
    let sums = tmp.path().join("running-sums");
    let n = records.to_string();
    let mut child = word_count()
        .args(["--records", &n, "--parallelism", "2"])
        .args(extra)
        .args(["--checkpoint-interval", "50ms", "--checkpoint-dir"])
        .arg(&root)
        .arg("--running-sums")
        .arg(&sums)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let seen = wait_for_checkpoints(&mut child, &root, 2);
    assert!(
        child.try_wait().unwrap().is_none(),
        "the run ended before it could be killed; raise --records"
    );
    child.kill().unwrap(); // SIGKILL
    let status = child.wait().unwrap();
    #[cfg(unix)]
    {
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(status.signal(), Some(9), "{status}");
    }
    assert!(!status.success());
    let left = complete_checkpoint_ids(&root);
    assert!(
        !left.is_empty(),
        "no complete checkpoint left (saw {seen:?})"
    );

    let out = tmp.path().join("totals.csv");
    let restored = word_count()
        .args(["--records", &n, "--parallelism", "2"])
        .args(extra)
        .args(["--checkpoint-interval", "50ms", "--checkpoint-dir"])
        .arg(tmp.path().join("checkpoints-2"))
        .arg("--from")
        .arg(&root)
        .arg("--output")
        .arg(&out)
        .arg("--running-sums")
        .arg(&sums)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (status, stdout, stderr) = wait_with_timeout(restored, Duration::from_secs(300));
    assert!(status.success(), "{status}\n{stderr}");
    let totals = parse_totals(&std::fs::read_to_string(&out).unwrap());
    assert_eq!(
        totals,
        weir_examples::expected_totals_in(records, 42, key_space),
        "restored from {left:?}"
    );
    assert_eq!(totals.values().sum::<i64>(), records as i64);
    assert_eq!(parse_summary(&stdout).restarts, 0);
    assert_restored(&stdout, records, &[&root]);
    // Each running count was committed once, by the killed run or by the restored one.
    assert_running_sums(&sums, &totals);
}

#[test]
fn sigint_cancels_an_unbounded_run_cleanly() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("checkpoints");
    let out = tmp.path().join("totals.csv");
    let mut child = word_count()
        .args(["--records", "0", "--parallelism", "2"])
        .args(["--checkpoint-interval", "50ms", "--checkpoint-dir"])
        .arg(&root)
        .arg("--output")
        .arg(&out)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // A complete checkpoint means the job is running, so the Ctrl-C handler is installed.
    wait_for_checkpoints(&mut child, &root, 1);
    interrupt(&child);
    let (status, stdout, stderr) = wait_with_timeout(child, Duration::from_secs(60));
    assert_eq!(status.code(), Some(130), "{status}\nstderr:\n{stderr}");
    assert!(!out.exists(), "a cancelled run wrote {}", out.display());
    assert!(stdout.contains("job cancelled"), "stdout:\n{stdout}");
    assert!(stderr.contains("cancelling (Ctrl-C)"), "stderr:\n{stderr}");
    assert!(!stderr.contains("panicked at"), "stderr:\n{stderr}");
    let summary = parse_summary(&stdout);
    assert!(summary.seconds > 0.0, "{summary:?}");
    // Not `checkpoints >= 1`: the `_metadata` we waited for may be on disk before the job master
    // has counted its checkpoint complete.
    assert_eq!(summary.restarts, 0, "{summary:?}");
}

/// A clean cancel logs no panic. It sometimes does: the snapshot's `spawn_blocking` is cancelled
/// at shutdown, and the `JoinError` is reported as a panic. A race, so this runs the scenario
/// several times.
#[test]
fn sigint_logs_no_panic() {
    for _ in 0..10 {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("checkpoints");
        let mut child = word_count()
            .args(["--records", "0", "--parallelism", "2"])
            .args(["--checkpoint-interval", "10ms", "--checkpoint-dir"])
            .arg(&root)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        wait_for_checkpoints(&mut child, &root, 1);
        interrupt(&child);
        let (status, _, stderr) = wait_with_timeout(child, Duration::from_secs(60));
        assert_eq!(status.code(), Some(130), "{status}");
        assert!(!stderr.contains("panicked"), "stderr:\n{stderr}");
    }
}

/// Files in `dir` whose names start with a dot: what an interrupted atomic write would leave.
fn temporary_files(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with('.'))
        .collect()
}

/// Ctrl-C on a running job exits 130 within a bound generous for a loaded machine (the runtime
/// aims at well under a second), whatever the sink delay costs per record: 10 ms makes one
/// batch of 1024 records take 10 s, and 1 h never ends a record. A second Ctrl-C right after
/// the first exits the same way. The `--output` file of an earlier run is left as it was.
#[test]
fn ctrl_c_exits_130_promptly_whatever_an_operator_costs_per_record() {
    const BOUND: Duration = Duration::from_secs(5);
    for (delay, signals) in [("10ms", 1), ("1h", 1), ("1h", 2)] {
        let tmp = tempfile::tempdir().unwrap();
        let out = tmp.path().join("totals.csv");
        std::fs::write(&out, "earlier run\n").unwrap();
        let mut child = word_count()
            .args([
                "--records",
                "0",
                "--parallelism",
                "2",
                "--sink-delay",
                delay,
            ])
            .arg("--checkpoint-dir")
            .arg(tmp.path().join("checkpoints"))
            .arg("--output")
            .arg(&out)
            .env("RUST_LOG", "weir_runtime::master=info")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut stderr = StderrLines::read(child.stderr.take().unwrap());
        stderr.wait_for("job RUNNING", Duration::from_secs(60));
        // Records reach the sink delay within milliseconds; give them time to.
        std::thread::sleep(Duration::from_millis(300));
        let asked = Instant::now();
        for _ in 0..signals {
            interrupt(&child);
        }
        let output = wait_output(child, Duration::from_secs(60));
        let took = asked.elapsed();
        let stderr = stderr.all(Duration::from_secs(10));
        let stdout = String::from_utf8_lossy(&output.stdout);
        eprintln!("--sink-delay {delay}, {signals} Ctrl-C: exited in {took:?}");
        let ctx = format!("--sink-delay {delay}, {signals} Ctrl-C");
        assert_eq!(
            output.status.code(),
            Some(130),
            "{ctx}: {}\nstderr:\n{stderr}",
            output.status
        );
        assert!(took < BOUND, "{ctx}: exited {took:?} after Ctrl-C");
        assert!(stderr.contains("cancelling (Ctrl-C)"), "{ctx}: {stderr}");
        assert!(!stderr.contains("panicked"), "{ctx}: {stderr}");
        if signals == 1 {
            assert!(stdout.contains("job cancelled"), "{ctx}: {stdout}");
        }
        assert_eq!(
            std::fs::read_to_string(&out).unwrap(),
            "earlier run\n",
            "{ctx}"
        );
        assert_eq!(temporary_files(tmp.path()), Vec::<String>::new(), "{ctx}");
    }
}

/// A finished run replaces an earlier `--output` file with the whole of its totals, leaving no
/// temporary file.
#[test]
fn a_finished_run_replaces_the_output_file_whole() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("totals.csv");
    std::fs::write(&out, "earlier run\n").unwrap();
    let records: u64 = 100_000;
    let run = word_count()
        .args(["--records", &records.to_string(), "--parallelism", "2"])
        .arg("--checkpoint-dir")
        .arg(tmp.path().join("checkpoints"))
        .arg("--output")
        .arg(&out)
        .output_bounded()
        .unwrap();
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert_eq!(run.status.code(), Some(0), "{}\n{stderr}", run.status);
    let totals = parse_totals(&std::fs::read_to_string(&out).unwrap());
    assert_eq!(totals, expected_totals(records, 42));
    assert_eq!(temporary_files(tmp.path()), Vec::<String>::new());
}

/// A failed run (an injected failure, no checkpoints, so no restart) exits 1, naming the
/// failure, and writes no `--output`: an earlier file stays as it was, and none is created.
#[test]
fn a_failed_run_exits_1_and_writes_no_output() {
    for earlier in [Some("earlier run\n"), None] {
        let tmp = tempfile::tempdir().unwrap();
        let out = tmp.path().join("totals.csv");
        if let Some(text) = earlier {
            std::fs::write(&out, text).unwrap();
        }
        let run = word_count()
            .args(["--records", "100000", "--fail-after", "50000"])
            .arg("--checkpoint-dir")
            .arg(tmp.path().join("checkpoints"))
            .arg("--output")
            .arg(&out)
            .output_bounded()
            .unwrap();
        let stderr = String::from_utf8_lossy(&run.stderr);
        assert_eq!(run.status.code(), Some(1), "{}\n{stderr}", run.status);
        assert!(stderr.contains("injected failure"), "{stderr}");
        match earlier {
            Some(text) => assert_eq!(std::fs::read_to_string(&out).unwrap(), text),
            None => assert!(!out.exists(), "a failed run wrote {}", out.display()),
        }
        assert_eq!(temporary_files(tmp.path()), Vec::<String>::new());
    }
}

#[test]
fn summary_line_of_a_normal_run_parses() {
    let tmp = tempfile::tempdir().unwrap();
    let records: u64 = 300_000;
    let out = word_count()
        .args(["--records", &records.to_string(), "--parallelism", "2"])
        .args(["--checkpoint-interval", "20ms", "--fail-after", "150000"])
        .arg("--checkpoint-dir")
        .arg(tmp.path())
        .output_bounded()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{}\n{stderr}", out.status);
    let s = parse_summary(&stdout);
    assert_eq!(s.records, records, "{s:?}");
    // The sources rewound to the checkpoint at the failure and emitted what followed it again:
    // over both attempts at least every record, since the restore fewer than all of them.
    assert!(s.emitted >= records, "{s:?}");
    if stdout.contains("restored from: ") {
        assert!(s.since_restore < records, "{s:?}");
        assert!(s.since_restore < s.emitted, "{s:?}");
    }
    assert!(s.seconds > 0.0, "{s:?}");
    // records_per_s is records / seconds, rounded; seconds is printed to the millisecond.
    let lo = records as f64 / (s.seconds + 0.0005);
    let hi = records as f64 / (s.seconds - 0.0005).max(1e-9);
    assert!(
        s.records_per_s >= lo.floor() && s.records_per_s <= hi.ceil(),
        "{s:?}"
    );
    assert_eq!(s.restarts, 1, "{s:?}");
    assert!(s.checkpoints <= 10_000, "{s:?}");
    // The totals line agrees with the expected totals.
    let totals = stdout
        .lines()
        .find_map(|l| l.strip_prefix("totals: "))
        .unwrap_or_else(|| panic!("no totals line in:\n{stdout}"));
    let parsed: BTreeMap<String, i64> = totals
        .split_whitespace()
        .map(|kv| {
            let (k, v) = kv.split_once('=').unwrap();
            (k.to_string(), v.parse().unwrap())
        })
        .collect();
    assert_eq!(parsed, expected_totals(records, 42));
}

/// Heavy variant for `cargo xtask chaos`: a chain of runs, each SIGKILLed after a few
/// checkpoints and restored by the next, then one run to the end: the totals are exact.
#[test]
#[ignore = "heavy: run by cargo xtask chaos"]
fn repeated_sigkill_and_restore_chaos() {
    repeated_sigkill_and_restore(&[]);
}

/// The same with incremental checkpoints: each run restores the chains the killed one wrote.
#[test]
#[ignore = "heavy: run by cargo xtask chaos"]
fn repeated_sigkill_and_restore_incremental_chaos() {
    repeated_sigkill_and_restore(&["--incremental"]);
}

fn repeated_sigkill_and_restore(extra: &[&str]) {
    let tmp = tempfile::tempdir().unwrap();
    let records: u64 = 100_000_000;
    let n = records.to_string();
    let mut previous: Option<std::path::PathBuf> = None;
    for round in 0..6u64 {
        let root = tmp.path().join(format!("round-{round}"));
        let mut cmd = word_count();
        cmd.args(["--records", &n, "--parallelism", "3"])
            .args(extra)
            .args(["--checkpoint-interval", "30ms", "--checkpoint-dir"])
            .arg(&root)
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        if let Some(p) = &previous {
            cmd.arg("--from").arg(p);
        }
        let mut child = cmd.spawn().unwrap();
        wait_for_checkpoints(&mut child, &root, 1 + (round % 4) as usize);
        child.kill().unwrap();
        child.wait().unwrap();
        previous = Some(root);
    }
    let out = tmp.path().join("totals.csv");
    let last = word_count()
        .args(["--records", &n, "--parallelism", "3"])
        .args(extra)
        .arg("--checkpoint-dir")
        .arg(tmp.path().join("final"))
        .arg("--from")
        .arg(previous.unwrap())
        .arg("--output")
        .arg(&out)
        .output_within(Duration::from_secs(1200))
        .unwrap();
    assert!(
        last.status.success(),
        "{}",
        String::from_utf8_lossy(&last.stderr)
    );
    let totals = parse_totals(&std::fs::read_to_string(&out).unwrap());
    assert_eq!(totals, expected_totals(records, 42));
    assert_restored(&String::from_utf8_lossy(&last.stdout), records, &[]);
}
