//! Keyed state larger than memory: `word_count` on the disk backend, inside a memory cgroup the
//! test sets up itself, through a SIGKILL, a restore and an injected failure, commits every
//! key's running counts exactly once (checked against counts computed without the engine), and
//! its keyed state is several times its peak RSS. The 50M-key run is behind `cargo xtask chaos`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// A memory cgroup made for one test (v1 `memory.limit_in_bytes` or v2 `memory.max`, under
/// the test's own cgroup), removed when dropped, with whatever still runs in it killed.
struct MemoryCgroup {
    dir: PathBuf,
    v2: bool,
}

impl MemoryCgroup {
    /// A cgroup whose processes may use at most `limit` bytes, swap included.
    fn new(limit: u64) -> MemoryCgroup {
        let own = std::fs::read_to_string("/proc/self/cgroup").unwrap();
        let name = format!("weir-test-{}-{}", std::process::id(), limit);
        let v1 = own
            .lines()
            .find_map(|l| l.split_once(":memory:").map(|(_, p)| p.to_string()));
        let (dir, v2) = match v1 {
            Some(path) => (
                PathBuf::from(format!("/sys/fs/cgroup/memory{path}")).join(&name),
                false,
            ),
            None => {
                let path = own.lines().find_map(|l| l.strip_prefix("0::")).expect(
                    "no memory cgroup (v1) and no unified hierarchy (v2) in /proc/self/cgroup",
                );
                let parent = PathBuf::from(format!("/sys/fs/cgroup{path}"));
                // Children get the memory controller only if the parent hands it down.
                let _ = std::fs::write(parent.join("cgroup.subtree_control"), "+memory");
                (parent.join(&name), true)
            }
        };
        std::fs::create_dir(&dir).unwrap_or_else(|e| {
            panic!(
                "cannot create the memory cgroup {} (the test needs to write the cgroup \
                 hierarchy, as root): {e}",
                dir.display()
            )
        });
        let cg = MemoryCgroup { dir, v2 };
        let (limit_file, swap_file) = if v2 {
            ("memory.max", "memory.swap.max")
        } else {
            ("memory.limit_in_bytes", "memory.memsw.limit_in_bytes")
        };
        std::fs::write(cg.dir.join(limit_file), limit.to_string())
            .unwrap_or_else(|e| panic!("cannot set {} of {}: {e}", limit_file, cg.dir.display()));
        // No swap: a process over the limit is killed, not slowed down.
        if cg.dir.join(swap_file).exists() {
            let swap = if v2 { 0 } else { limit };
            std::fs::write(cg.dir.join(swap_file), swap.to_string()).unwrap();
        }
        cg
    }

    /// `word_count` with `args`, started inside the cgroup (the shell moves itself in, then
    /// becomes the binary).
    fn word_count(&self, args: &[String]) -> Command {
        let mut cmd = Command::new("sh");
        cmd.arg("-c")
            .arg(r#"echo $$ > "$0/cgroup.procs" && exec "$@""#)
            .arg(&self.dir)
            .arg(env!("CARGO_BIN_EXE_word_count"))
            .args(args)
            .env_remove("RUST_LOG")
            // As a job runs by default. With backtraces on, the restored run's injected panic
            // has std symbolize its backtrace, and std keeps the debug info it parsed for the
            // process's life: ~34 MB of heap (heaptrack, 2026-12-03), not state's memory.
            .env_remove("RUST_BACKTRACE")
            .env_remove("RUST_LIB_BACKTRACE");
        cmd
    }

    /// How many times the kernel's OOM killer acted in the cgroup.
    fn oom_kills(&self) -> u64 {
        let file = if self.v2 {
            "memory.events"
        } else {
            "memory.oom_control"
        };
        std::fs::read_to_string(self.dir.join(file))
            .unwrap_or_default()
            .lines()
            .find_map(|l| l.strip_prefix("oom_kill "))
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or(0)
    }
}

impl Drop for MemoryCgroup {
    fn drop(&mut self) {
        let procs = std::fs::read_to_string(self.dir.join("cgroup.procs")).unwrap_or_default();
        for pid in procs.lines() {
            let _ = Command::new("kill").args(["-9", pid]).status();
        }
        for _ in 0..100 {
            if std::fs::remove_dir(&self.dir).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// Samples a process's peak RSS (`VmHWM`) until it exits; the last sample is its peak.
fn watch_peak_rss(pid: u32, peak: Arc<AtomicU64>, done: Arc<AtomicBool>) {
    std::thread::spawn(move || {
        while !done.load(Ordering::Relaxed) {
            let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
            if let Some(kb) = status
                .lines()
                .find_map(|l| l.strip_prefix("VmHWM:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            {
                peak.fetch_max(kb * 1024, Ordering::Relaxed);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    });
}

/// A run of the binary in the cgroup, with its peak RSS watched and its output collected.
struct Run {
    child: Child,
    peak: Arc<AtomicU64>,
    done: Arc<AtomicBool>,
    stdout: std::thread::JoinHandle<String>,
}

impl Run {
    fn start(cg: &MemoryCgroup, args: &[String]) -> Run {
        let mut child = cg
            .word_count(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let pipe = child.stdout.take().unwrap();
        let stdout = std::thread::spawn(move || {
            let mut out = String::new();
            for line in std::io::BufReader::new(pipe).lines().map_while(Result::ok) {
                out.push_str(&line);
                out.push('\n');
            }
            out
        });
        let (peak, done) = (Arc::default(), Arc::default());
        watch_peak_rss(child.id(), Arc::clone(&peak), Arc::clone(&done));
        Run {
            child,
            peak,
            done,
            stdout,
        }
    }

    /// Waits up to `timeout` for the end: the status, stdout and peak RSS.
    fn wait(mut self, timeout: Duration) -> (ExitStatus, String, u64) {
        let deadline = Instant::now() + timeout;
        let status = loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                break status;
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                panic!("word_count did not end within {timeout:?}");
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        self.done.store(true, Ordering::Relaxed);
        let out = self.stdout.join().unwrap();
        (status, out, self.peak.load(Ordering::Relaxed))
    }
}

/// Checks the committed running sums (`(word,count)` lines in `part-*` files) against counts
/// computed from the generator alone: every word's counts are exactly 1..=n, each once, where
/// n is how often the generator drew it. Streams the files; memory is a few arrays per value.
fn assert_running_counts_exact(dir: &Path, records: u64, seed: u64, key_space: u64) {
    let g = weir_examples::generator(seed, key_space);
    let size = usize::try_from(key_space + 1).unwrap();
    let mut want = vec![0u32; size];
    for i in 0..records {
        want[usize::try_from(g.value(i)).unwrap()] += 1;
    }
    let (mut lines, mut max, mut sum) = (vec![0u32; size], vec![0u32; size], vec![0u64; size]);
    let mut files = 0;
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with('.') {
            continue; // in progress or pending: not committed
        }
        assert!(name.starts_with("part-"), "a foreign file {name}");
        files += 1;
        let file = std::fs::File::open(entry.path()).unwrap();
        for line in std::io::BufReader::new(file).lines() {
            let line = line.unwrap();
            let (word, count) = line
                .strip_prefix('(')
                .and_then(|l| l.strip_suffix(')'))
                .and_then(|p| p.split_once(','))
                .unwrap_or_else(|| panic!("{name}: not a (word,count) line: {line:?}"));
            let w: usize = word
                .parse()
                .unwrap_or_else(|_| panic!("{name}: word {word:?}"));
            let c: u32 = count
                .parse()
                .unwrap_or_else(|_| panic!("{name}: count {count:?}"));
            assert!(
                w < size && w > 0,
                "{name}: word {w} outside 1..={key_space}"
            );
            lines[w] += 1;
            max[w] = max[w].max(c);
            sum[w] += u64::from(c);
        }
    }
    assert!(files > 0, "no committed part file in {}", dir.display());
    let mut wrong = Vec::new();
    for w in 1..size {
        let n = want[w];
        let exact = lines[w] == n && max[w] == n && sum[w] == u64::from(n) * u64::from(n + 1) / 2;
        if !exact && wrong.len() < 5 {
            wrong.push(format!(
                "word {w}: drawn {n} times, {} counts committed (max {}, sum {})",
                lines[w], max[w], sum[w]
            ));
        }
    }
    assert!(
        wrong.is_empty(),
        "running counts not exactly once: {wrong:#?}"
    );
}

/// The full keyed state of the last completed checkpoint a run printed (`state N B`: Flink's
/// full checkpoint data size, the native runs of every subtask).
fn last_state_bytes(stdout: &str) -> u64 {
    stdout
        .lines()
        .filter(|l| l.starts_with("checkpoint ") && l.contains(" COMPLETED: "))
        .filter_map(|l| l.split_once(", state ")?.1.split_once(" B")?.0.parse().ok())
        .next_back()
        .unwrap_or_else(|| panic!("no completed checkpoint printed:\n{stdout}"))
}

/// The value of `key=` on a run's `summary:` line.
fn summary_field(stdout: &str, key: &str) -> Option<String> {
    stdout
        .lines()
        .find_map(|l| l.strip_prefix("summary: "))
        .and_then(|l| {
            l.split_whitespace()
                .find_map(|kv| kv.strip_prefix(&format!("{key}=")))
        })
        .map(str::to_string)
}

/// `word_count`'s arguments for a run on the disk backend with incremental checkpoints.
fn disk_args(records: u64, seed: u64, key_space: u64, interval: &str) -> Vec<String> {
    [
        "--records",
        &records.to_string(),
        "--seed",
        &seed.to_string(),
        "--key-space",
        &key_space.to_string(),
        "--parallelism",
        "2",
        "--state-backend",
        "disk",
        "--incremental",
        "--no-totals",
        "--no-rest",
        "--checkpoint-interval",
        interval,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

/// Runs the scenario: a run SIGKILLed once `kill_after` checkpoints were taken, then a restore
/// from its latest complete checkpoint that meets an injected failure (the job restarts in the
/// process, from its own latest checkpoint, with the state's files on local disk) and runs to
/// the end; both inside a cgroup of `limit` bytes. Returns the final keyed state's bytes and
/// the largest peak RSS of the two processes.
fn killed_and_restored_in_a_cgroup(
    records: u64,
    key_space: u64,
    limit: u64,
    kill_after: u64,
    interval: &str,
    extra: &[&str],
) -> (u64, u64) {
    let tmp = tempfile::tempdir().unwrap();
    let cg = MemoryCgroup::new(limit);
    let seed = 7u64;
    let mut base = disk_args(records, seed, key_space, interval);
    base.extend(extra.iter().map(|s| s.to_string()));
    let path = |p: &Path| p.to_string_lossy().into_owned();
    let sums = tmp.path().join("running-sums");
    let root = tmp.path().join("checkpoints");
    let mut first = base.clone();
    first.extend([
        "--state-dir".into(),
        path(&tmp.path().join("state-1")),
        "--checkpoint-dir".into(),
        path(&root),
        "--running-sums".into(),
        path(&sums),
    ]);
    let mut run = Run::start(&cg, &first);
    let deadline = Instant::now() + Duration::from_secs(3600);
    while checkpoints_seen(&root) < kill_after {
        if let Some(status) = run.child.try_wait().unwrap() {
            panic!(
                "word_count ended ({status}, OOM kills {}) before it could be killed; raise \
                 --records",
                cg.oom_kills()
            );
        }
        assert!(Instant::now() < deadline, "no checkpoints within an hour");
        std::thread::sleep(Duration::from_millis(50));
    }
    run.child.kill().unwrap(); // SIGKILL
    let (status, _, peak_first) = run.wait(Duration::from_secs(60));
    assert!(!status.success(), "{status}");
    assert_eq!(
        cg.oom_kills(),
        0,
        "the first run met the cgroup's OOM killer"
    );

    let mut second = base;
    second.extend([
        "--state-dir".into(),
        path(&tmp.path().join("state-2")),
        "--checkpoint-dir".into(),
        path(&tmp.path().join("checkpoints-2")),
        "--running-sums".into(),
        path(&sums),
        "--from".into(),
        path(&root),
        // Counted by this process's map: well within what is left after the kill.
        "--fail-after".into(),
        (records / 10).to_string(),
    ]);
    let (status, stdout, peak_second) =
        Run::start(&cg, &second).wait(Duration::from_secs(4 * 3600));
    assert!(
        status.success(),
        "the restored run failed ({status}, OOM kills {}):\n{stdout}",
        cg.oom_kills()
    );
    assert!(stdout.contains("restored from: "), "{stdout}");
    let field = |key: &str| summary_field(&stdout, key);
    assert_eq!(
        field("restarts").as_deref(),
        Some("1"),
        "the injected failure did not restart the restored run:\n{stdout}"
    );
    let recovery_ms = field("recovery_ms").unwrap_or_else(|| panic!("no recovery_ms:\n{stdout}"));
    assert_running_counts_exact(&sums, records, seed, key_space);
    let state = last_state_bytes(&stdout);
    let peak = peak_first.max(peak_second);
    println!(
        "{records} records over {key_space} keys in a {} MiB cgroup, killed after {kill_after} \
         checkpoints: keyed state {} MiB, peak RSS {} MiB (first run {} MiB, restored run {} \
         MiB): state / peak RSS = {:.2}; the restored run's failure to its first record \
         processed again (local recovery): {recovery_ms} ms",
        limit >> 20,
        state >> 20,
        peak >> 20,
        peak_first >> 20,
        peak_second >> 20,
        state as f64 / peak as f64
    );
    (state, peak)
}

/// The highest id of a complete checkpoint under `root` (a run retains one complete
/// checkpoint, so the ids climb: it is how many were taken; 0 before the first).
fn checkpoints_seen(root: &Path) -> u64 {
    let mut max = 0;
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
                max = max.max(id);
            }
        }
    }
    max
}

/// The CI-sized run: exact under a failure, a SIGKILL and a restore, inside a cgroup.
#[test]
fn disk_state_in_a_memory_cgroup_survives_failure_kill_and_restore_exactly() {
    // Checkpoints every 50k records, and a pause of 5 µs per record before the sink: the
    // third checkpoint (150k records) comes at least 0.4 s before the end (400k records over
    // two subtasks take at least 1 s), whatever the machine's speed. Without the pause an idle
    // machine ran the whole job in 0.13 s (2026-12-04), before the test's 50 ms poll.
    let pace = ["--checkpoint-every-records", "50000", "--sink-delay", "5us"];
    let (state, peak) =
        killed_and_restored_in_a_cgroup(400_000, 300_000, 512 << 20, 3, "100ms", &pace);
    assert!(state > 0 && peak > 0);
}

/// The issue's run: 50M keys on disk, the state at least 8× the process's peak RSS, in a
/// cgroup of 1 GiB. 150M records draw 47.5M of the 50M keys (60M drew 35M: 582 MiB of state,
/// 6.15× a peak RSS that does not grow with the state; with 150M, 931 MiB and 8.61×,
/// 2026-12-04), far less than the heap backend needs for these keys (~4 GiB). The cgroup
/// charges the page cache too, which serves as the runs' block cache: at 384 MiB the run was
/// bound by random reads from the device (~17k records/s, ~140 MB/s read from the device), at 1 GiB the state's
/// files stay cached. Release: `cargo xtask chaos`.
#[test]
#[ignore = "heavy: run by cargo xtask chaos"]
fn fifty_million_keys_on_disk_are_eight_times_peak_rss_and_exact() {
    let (state, peak) =
        killed_and_restored_in_a_cgroup(150_000_000, 50_000_000, 1 << 30, 60, "1s", &[]);
    assert!(
        state >= 8 * peak,
        "keyed state {state} B is less than 8 × the peak RSS {peak} B"
    );
}

/// The issue's recovery figure: a job with over 2 GB of keyed state on disk (a checkpoint of
/// it is what the job restores) meets a failure late in its run and restarts in the process
/// from its own latest checkpoint, with the state's files on local disk: from the failure to
/// the first record processed again takes at most 1 s, and every key's running counts are
/// exact. 300M records draw 124M of 140M keys (17-21 B each on disk: 931 MiB for 47.5M keys,
/// 2026-12-04). The cgroup (4 GiB) keeps the files cached; the process's RSS stays ~100 MiB.
/// Release: `cargo xtask chaos` (~25 min).
#[test]
#[ignore = "heavy: run by cargo xtask chaos"]
fn two_gigabytes_of_disk_state_recover_locally_within_a_second() {
    let (records, key_space, seed) = (300_000_000u64, 140_000_000u64, 11u64);
    let tmp = tempfile::tempdir().unwrap();
    let cg = MemoryCgroup::new(4 << 30);
    let path = |p: &Path| p.to_string_lossy().into_owned();
    let sums = tmp.path().join("running-sums");
    // Checkpoints every 5 s: the failure comes 3M records (~15 s) before the end, so the
    // restored checkpoint's statistics are still among the 10 the job reports.
    let mut args = disk_args(records, seed, key_space, "5s");
    args.extend([
        "--state-dir".into(),
        path(&tmp.path().join("state")),
        "--checkpoint-dir".into(),
        path(&tmp.path().join("checkpoints")),
        "--running-sums".into(),
        path(&sums),
        "--fail-after".into(),
        (records - 3_000_000).to_string(),
    ]);
    let started = Instant::now();
    let (status, stdout, peak) = Run::start(&cg, &args).wait(Duration::from_secs(4 * 3600));
    assert!(
        status.success(),
        "the run failed ({status}, OOM kills {}):\n{stdout}",
        cg.oom_kills()
    );
    assert_eq!(
        summary_field(&stdout, "restarts").as_deref(),
        Some("1"),
        "the injected failure did not restart the run:\n{stdout}"
    );
    let recovery_ms: f64 = summary_field(&stdout, "recovery_ms")
        .unwrap_or_else(|| panic!("no recovery_ms:\n{stdout}"))
        .parse()
        .unwrap();
    // The job started fresh, so the checkpoint it restored from is the restart's; its
    // statistics give the state the recovery brought back.
    let restored: u64 = stdout
        .lines()
        .find_map(|l| {
            l.strip_prefix("restored from: ")?
                .rsplit_once("/chk-")?
                .1
                .parse()
                .ok()
        })
        .unwrap_or_else(|| panic!("no restore printed:\n{stdout}"));
    let state: u64 = stdout
        .lines()
        .find_map(|l| {
            let rest = l.strip_prefix(&format!("checkpoint {restored} "))?;
            rest.contains(" COMPLETED: ").then(|| {
                rest.split_once(", state ")?
                    .1
                    .split_once(" B")?
                    .0
                    .parse()
                    .ok()
            })?
        })
        .unwrap_or_else(|| {
            panic!("no statistics of the restored checkpoint {restored}:\n{stdout}")
        });
    assert_running_counts_exact(&sums, records, seed, key_space);
    println!(
        "{records} records over {key_space} keys: the failure's restore brought back checkpoint \
         {restored} of {} MB keyed state; failure to first record processed again: \
         {recovery_ms} ms; peak RSS {} MiB; {:.0} s in all",
        state / 1_000_000,
        peak >> 20,
        started.elapsed().as_secs_f64()
    );
    assert!(
        state >= 2_000_000_000,
        "the restored checkpoint holds {state} B of keyed state, not 2 GB: draw more keys"
    );
    assert!(
        recovery_ms <= 1000.0,
        "local recovery of {state} B took {recovery_ms} ms, more than 1 s"
    );
}

/// A savepoint larger than memory: a run on the disk backend stops with a savepoint of ~60M
/// keys (canonical, ~560 MB), and a second run restores it into the disk backend inside a
/// cgroup of 256 MiB and runs to the end. Each subtask downloads the sections it owns to local
/// disk and the backend bulk-loads them from there a window of key groups at a time, so the
/// restore holds no more than a window in memory; when the savepoint's bytes were held in
/// memory (the master read them all) this restore could not fit. Every key's running counts,
/// over both runs, are checked against the generator. Release: `cargo xtask chaos` (~10 min).
#[test]
#[ignore = "heavy: run by cargo xtask chaos"]
fn a_savepoint_larger_than_memory_restores_into_disk_exactly() {
    let (records, key_space, seed) = (120_000_000u64, 80_000_000u64, 13u64);
    let limit: u64 = 256 << 20;
    let tmp = tempfile::tempdir().unwrap();
    let path = |p: &Path| p.to_string_lossy().into_owned();
    let sums = tmp.path().join("running-sums");
    let savepoints = tmp.path().join("savepoints");
    // The first run has room (4 GiB): only the restore is measured.
    let roomy = MemoryCgroup::new(4 << 30);
    let mut first = disk_args(records, seed, key_space, "5s");
    first.extend([
        "--state-dir".into(),
        path(&tmp.path().join("state-1")),
        "--checkpoint-dir".into(),
        path(&tmp.path().join("checkpoints-1")),
        "--savepoint-dir".into(),
        path(&savepoints),
        "--running-sums".into(),
        path(&sums),
        "--stop-with-savepoint-after".into(),
        (records - 1_000_000).to_string(),
    ]);
    let (status, stdout, _) = Run::start(&roomy, &first).wait(Duration::from_secs(2 * 3600));
    assert!(
        status.success(),
        "the first run failed ({status}):\n{stdout}"
    );
    drop(roomy);
    let savepoint = stdout
        .lines()
        .find_map(|l| l.strip_prefix("stopped with savepoint: "))
        .map(|p| PathBuf::from(p.trim_start_matches("file://")))
        .unwrap_or_else(|| panic!("no savepoint printed:\n{stdout}"));
    let size: u64 = std::fs::read_dir(&savepoint)
        .unwrap()
        .flatten()
        .map(|f| f.metadata().unwrap().len())
        .sum();

    let small = MemoryCgroup::new(limit);
    let mut second = disk_args(records, seed, key_space, "5s");
    second.extend([
        "--state-dir".into(),
        path(&tmp.path().join("state-2")),
        "--checkpoint-dir".into(),
        path(&tmp.path().join("checkpoints-2")),
        "--running-sums".into(),
        path(&sums),
        "--from".into(),
        path(&savepoint),
    ]);
    let started = Instant::now();
    let (status, stdout, peak) = Run::start(&small, &second).wait(Duration::from_secs(2 * 3600));
    let seconds = started.elapsed().as_secs_f64();
    assert!(
        status.success(),
        "the restored run failed ({status}, OOM kills {}):\n{stdout}",
        small.oom_kills()
    );
    assert_eq!(small.oom_kills(), 0, "the restored run met the OOM killer");
    assert!(stdout.contains("restored from: "), "{stdout}");
    assert_running_counts_exact(&sums, records, seed, key_space);
    println!(
        "a savepoint of {} MiB restored into the disk backend in a {} MiB cgroup: peak RSS {} MiB \
         (savepoint / peak RSS = {:.2}); the restored run took {seconds:.1} s",
        size >> 20,
        limit >> 20,
        peak >> 20,
        size as f64 / peak as f64
    );
    assert!(
        size > limit + limit / 2,
        "the savepoint ({size} B) is not larger than 1.5 × the cgroup's limit: draw more keys"
    );
    assert!(
        size >= 2 * peak,
        "the restore's peak RSS {peak} B is more than half the savepoint's {size} B"
    );
}
