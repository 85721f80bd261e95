//! The `weir checkpoints` command-line tool against real checkpoints: a small keyed job runs
//! in-process once, then the built binary lists, inspects and verifies its checkpoints, intact
//! and after damage (a flipped byte in a state file or in `_metadata`, a deleted `_metadata`).
//! A second job takes unaligned checkpoints under backpressure, so that they hold in-flight
//! data (channel-state files); a version-1 `_metadata` is made by re-sealing a real one. A third
//! keeps its keyed state on the disk backend with incremental checkpoints, so that they hold
//! native snapshots (manifests, and run files shared in the job's `shared/` directory).
#![cfg(feature = "cli")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "support/bounded.rs"]
mod bounded;
use bounded::{Bounded, BoundedCommand};

#[path = "support/checkpointed.rs"]
mod checkpointed;

use checkpointed::{KeyedJob, complete_ids};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};
use weir_checkpoint::metadata::METADATA_VERSION;
use weir_checkpoint::{CheckpointMetadata, OpendalCheckpointStorage};
use weir_runtime::testing::{Gate, GateDriver};
use weir_runtime::{JobClient, StorageConfig, StreamEnvironment};

/// Distinct keys: enough that each subtask's keyed state is far above the 20 KiB inline threshold.
const KEYS: u64 = 50_000;
/// Records the job reads.
const RECORDS: u64 = 300_000;
/// Records after which every key has state; from there on the job slows down until
/// [`WANTED`] checkpoints have completed.
const WARM_UP: u64 = 2 * KEYS;
/// Complete checkpoints wanted after the warm-up.
const WANTED: u64 = 3;
const JOB_NAME: &str = "cli-test";

/// Runs generator → map → key_by → sum → latest_per_key with parallelism 2, checkpointing into
/// `root` every 20 ms and keeping 3 checkpoints; the map slows the job down after the warm-up
/// until three checkpoints taken after it (so with every key in state) are complete.
async fn run_job(root: &Path) {
    let env = StreamEnvironment::new();
    env.set_job_name(JOB_NAME)
        .set_parallelism(2)
        .enable_checkpointing(Duration::from_millis(20))
        .set_checkpoint_dir(root);
    env.checkpoint_config().num_retained = 3;
    KeyedJob {
        keys: KEYS,
        records: RECORDS,
        warm_up: WARM_UP,
        wanted: WANTED,
        give_up: Duration::from_secs(20),
    }
    .run(env, root.to_path_buf())
    .await;
}

/// A pristine checkpoint root made by running the job once per test process.
fn fixture() -> &'static Path {
    static ROOT: OnceLock<PathBuf> = OnceLock::new();
    ROOT.get_or_init(|| {
        let root = fresh_fixture_dir("weir-cli-fixture-");
        runtime().block_on(run_job(&root));
        let ids = complete_ids(&root);
        assert!(
            ids.len() >= 2,
            "expected retained checkpoints, found {ids:?}"
        );
        root
    })
}

/// An empty directory `<prefix><pid>` for a fixture of this test process.
fn fresh_fixture_dir(prefix: &str) -> PathBuf {
    let tmp = Path::new(env!("CARGO_TARGET_TMPDIR"));
    // A static is never dropped, so the fixture outlives the process; remove those of earlier
    // runs (older than ten minutes: a test process uses its fixture for seconds).
    for entry in std::fs::read_dir(tmp).into_iter().flatten().flatten() {
        let name = entry.file_name().to_string_lossy().to_string();
        let old = entry
            .metadata()
            .and_then(|m| m.modified())
            .is_ok_and(|t| t.elapsed().is_ok_and(|age| age > Duration::from_secs(600)));
        if old && name.starts_with(prefix) {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
    let root = tmp.join(format!("{prefix}{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    root
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .unwrap()
}

// ---------------------------------------------------------------------------------------------
// An unaligned checkpoint with in-flight data.

const UNALIGNED_JOB: &str = "cli-unaligned-test";
/// Distinct keys of the unaligned job.
const UNALIGNED_KEYS: u64 = 1_000;
/// Records the unaligned job reads.
const UNALIGNED_RECORDS: u64 = 200_000;

/// The complete checkpoints (with `_metadata`) under `root` that hold a channel-state file.
fn with_channel_state(root: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    for job in std::fs::read_dir(root).into_iter().flatten().flatten() {
        for chk in std::fs::read_dir(job.path())
            .into_iter()
            .flatten()
            .flatten()
        {
            let dir = chk.path();
            if dir.join("_metadata").is_file() && !channel_files(&dir).is_empty() {
                found.push(dir);
            }
        }
    }
    found.sort();
    found
}

/// The channel-state files of a checkpoint directory.
fn channel_files(chk: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(chk)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.to_string_lossy().ends_with("-channels"))
        .collect();
    files.sort();
    files
}

/// Runs generator → map → key_by → sum → gate → latest_per_key with parallelism 2, one buffer
/// per channel and unaligned checkpoints every 10 ms into `root`. The gate (closed, chained to
/// the sum, and driven by a `GateDriver`) backs the keyed exchange up, so barriers overtake
/// queued buffers and the checkpoints persist them; it opens for good once a checkpoint holds a
/// channel-state file.
/// The storage inlines nothing, so that the few hundred bytes in flight get a file.
async fn run_unaligned_job(root: &Path) {
    let storage = OpendalCheckpointStorage::fs(root)
        .unwrap()
        .with_inline_threshold(0);
    let env = StreamEnvironment::new();
    env.set_job_name(UNALIGNED_JOB)
        .set_parallelism(2)
        .enable_checkpointing(Duration::from_millis(10))
        .set_checkpoint_storage(StorageConfig::Custom(Arc::new(storage)));
    {
        let mut config = env.config_mut();
        config.checkpoint.unaligned = true;
        // Keep every checkpoint: the tests look for one with in-flight data, not the latest.
        config.checkpoint.num_retained = 10_000;
        config.buffers_per_channel = 1;
        config.batch_size = 64;
    }

    let gate = Gate::closed();
    let totals = env
        .from_generator(Some(UNALIGNED_RECORDS), |i| i)
        .uid("source")
        .map(|i: u64| (i % UNALIGNED_KEYS, 1i64))
        .uid("to-pairs")
        .key_by(|t: &(u64, i64)| &t.0)
        .sum()
        .uid("sum")
        .through_gate(&gate)
        .uid("slow")
        .latest_per_key();
    let client = JobClient::default();
    let job = tokio::spawn(env.execute_with(client.clone()).bounded());
    let driver = GateDriver::start(client, gate, 2, 2_000);
    let give_up = Instant::now() + Duration::from_secs(60);
    while with_channel_state(root).is_empty() && !job.is_finished() {
        assert!(Instant::now() < give_up, "no channel-state file in 60 s");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    driver.stop().await;
    job.await
        .expect("the job panicked")
        .expect("the unaligned job failed");
    // Exactly once despite the overtaken data.
    let totals = totals.get();
    assert_eq!(totals.len() as u64, UNALIGNED_KEYS);
    let per_key = (UNALIGNED_RECORDS / UNALIGNED_KEYS) as i64;
    assert!(totals.values().all(|&n| n == per_key), "{totals:?}");
}

/// A checkpoint root made by running the unaligned job once per test process, and a complete
/// checkpoint in it that holds in-flight data.
fn unaligned_fixture() -> &'static (PathBuf, PathBuf) {
    static FIXTURE: OnceLock<(PathBuf, PathBuf)> = OnceLock::new();
    FIXTURE.get_or_init(|| {
        let root = fresh_fixture_dir("weir-cli-unaligned-");
        let t0 = Instant::now();
        runtime().block_on(run_unaligned_job(&root));
        eprintln!("the unaligned job ran for {:?}", t0.elapsed());
        let found = with_channel_state(&root);
        let chk = found.first().cloned().unwrap_or_else(|| {
            panic!(
                "no complete checkpoint holds in-flight data; checkpoints: {:?}",
                complete_ids(&root)
            )
        });
        (root, chk)
    })
}

/// The checkpoint id of a `chk-<n>` directory.
fn chk_id(chk: &Path) -> u64 {
    chk.file_name()
        .unwrap()
        .to_str()
        .unwrap()
        .strip_prefix("chk-")
        .unwrap()
        .parse()
        .unwrap()
}

/// A private copy of the unaligned fixture, and the checkpoint with in-flight data in it.
fn copy_of_unaligned() -> (tempfile::TempDir, PathBuf) {
    let (root, chk) = unaligned_fixture();
    let tmp = copy_of(root);
    let chk = tmp.path().join(chk.strip_prefix(root).unwrap());
    (tmp, chk)
}

/// A private copy of the fixture, for a test to damage.
fn copy_of_fixture() -> tempfile::TempDir {
    copy_of(fixture())
}

/// A private copy of a checkpoint root.
fn copy_of(root: &Path) -> tempfile::TempDir {
    fn copy(from: &Path, to: &Path) {
        std::fs::create_dir_all(to).unwrap();
        for entry in std::fs::read_dir(from).unwrap() {
            let entry = entry.unwrap();
            let target = to.join(entry.file_name());
            if entry.file_type().unwrap().is_dir() {
                copy(&entry.path(), &target);
            } else {
                std::fs::copy(entry.path(), &target).unwrap();
            }
        }
    }
    let tmp = tempfile::tempdir().unwrap();
    copy(root, tmp.path());
    tmp
}

/// The job directory of the fixture's (or a copy's) only job.
fn job_dir(root: &Path) -> PathBuf {
    let jobs: Vec<PathBuf> = std::fs::read_dir(root)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.is_dir())
        .collect();
    assert_eq!(jobs.len(), 1, "{jobs:?}");
    jobs.into_iter().next().unwrap()
}

/// The directory of the latest complete checkpoint.
fn latest(root: &Path) -> (u64, PathBuf) {
    let id = *complete_ids(root).last().unwrap();
    (id, job_dir(root).join(format!("chk-{id}")))
}

/// The newest checkpoint taken while the sources still read: the newest of all is the final one
/// (FLIP-147), taken once every task finished, when the sources hold no split any more; so may
/// be the ones just before it.
fn latest_running(root: &Path) -> (u64, PathBuf) {
    for id in complete_ids(root).into_iter().rev() {
        let chk = job_dir(root).join(format!("chk-{id}"));
        let o = weir_at(&["checkpoints", "inspect", "--json"], &chk);
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap_or_default();
        let reading =
            v["operators"].as_array().into_iter().flatten().any(|op| {
                op["uid"] == "source" && op["subtasks"][0]["operator"].as_array().is_some()
            });
        if reading {
            return (id, chk);
        }
    }
    panic!(
        "no checkpoint taken while the sources read: {:?}",
        complete_ids(root)
    );
}

fn weir(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_weir"))
        .args(args)
        .output_bounded()
        .expect("cannot run the weir binary")
}

fn weir_at(args: &[&str], path: &Path) -> Output {
    let mut all: Vec<&str> = args.to_vec();
    let p = path.to_str().unwrap();
    all.push(p);
    weir(&all)
}

fn stdout(o: &Output) -> String {
    String::from_utf8(o.stdout.clone()).unwrap()
}

fn stderr(o: &Output) -> String {
    String::from_utf8(o.stderr.clone()).unwrap()
}

fn show(o: &Output) -> String {
    format!(
        "exit {:?}\n--- stdout\n{}--- stderr\n{}",
        o.status.code(),
        stdout(o),
        stderr(o)
    )
}

/// Flips one bit of the byte at `offset` (from the end when negative).
fn flip_byte(file: &Path, offset: i64) {
    let mut bytes = std::fs::read(file).unwrap();
    let i = if offset < 0 {
        bytes.len() - offset.unsigned_abs() as usize
    } else {
        offset as usize
    };
    bytes[i] ^= 0x40;
    std::fs::write(file, bytes).unwrap();
}

/// The state files of a checkpoint directory (everything but `_metadata`).
fn state_files(chk: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(chk)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.file_name().unwrap() != "_metadata")
        .collect();
    files.sort();
    files
}

/// A location as a job prints it (`file:///…`) is accepted as well as a plain path.
#[test]
fn a_file_url_lists_like_its_path() {
    let root = fixture();
    let plain = weir_at(&["checkpoints", "list"], root);
    let url = format!("file://{}", root.display());
    let o = weir(&["checkpoints", "list", &url]);
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    assert_eq!(stdout(&o), stdout(&plain));
}

#[test]
fn list_shows_every_completed_checkpoint_sorted() {
    let root = fixture();
    let ids = complete_ids(root);
    let o = weir_at(&["checkpoints", "list"], root);
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    let out = stdout(&o);
    let lines: Vec<&str> = out.lines().collect();
    assert!(lines[0].starts_with("STATUS"), "{out}");
    // A checkpoint still in flight when the job ended may have left a directory without
    // `_metadata`: listed, as incomplete.
    let (rows, others): (Vec<&str>, Vec<&str>) =
        lines[1..].iter().partition(|l| l.starts_with("COMPLETED "));
    assert!(others.iter().all(|l| l.starts_with("INCOMPLETE ")), "{out}");
    assert_eq!(rows.len(), ids.len(), "{out}");
    let job_id = job_dir(root)
        .file_name()
        .unwrap()
        .to_str()
        .unwrap()
        .to_string();
    for (row, id) in rows.iter().zip(&ids) {
        let cells: Vec<&str> = row.split_whitespace().collect();
        assert_eq!(cells[0], "COMPLETED", "{row}");
        assert_eq!(cells[1], id.to_string(), "{row}");
        assert_eq!(cells[2], JOB_NAME, "{row}");
        assert_eq!(cells[3], job_id, "{row}");
        assert!(cells[4].ends_with('Z') && cells[4].contains('T'), "{row}");
        assert_eq!(cells[5], "checkpoint", "{row}");
        assert!(cells[6].parse::<u64>().unwrap() > 40 * 1024, "{row}");
        assert!(row.contains("KiB"), "{row}");
        assert!(row.ends_with(&format!("chk-{id}")), "{row}");
    }

    // A job directory and a single checkpoint directory list the same way.
    let o = weir_at(&["checkpoints", "list"], &job_dir(root));
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    assert_eq!(stdout(&o), out, "a job directory lists as its root");
    let (id, chk) = latest(root);
    let o = weir_at(&["checkpoints", "list"], &chk);
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    let out = stdout(&o);
    assert_eq!(out.lines().count(), 2, "{out}");
    let cells: Vec<&str> = out.lines().nth(1).unwrap().split_whitespace().collect();
    assert_eq!(
        cells[..3],
        ["COMPLETED", &id.to_string(), JOB_NAME],
        "{out}"
    );

    // --json carries the same.
    let o = weir_at(&["checkpoints", "list", "--json"], root);
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let listed: Vec<u64> = v
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| {
            assert!(["COMPLETED", "INCOMPLETE"].contains(&e["status"].as_str().unwrap()));
            e["status"] == "COMPLETED"
        })
        .map(|e| {
            assert_eq!(e["job_name"], JOB_NAME);
            e["id"].as_u64().unwrap()
        })
        .collect();
    assert_eq!(listed, ids);
}

/// The text and JSON reports of `inspect` name the operators by uid, show key-group ranges that
/// partition 0..max_parallelism, the "sum" state and its kind, files and verification.
#[test]
fn inspect_describes_operators_state_and_files() {
    let root = fixture();
    let (id, chk) = latest_running(root);

    let o = weir_at(&["checkpoints", "inspect", "--json"], &chk);
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["checkpoint_id"], id);
    assert_eq!(v["job_name"], JOB_NAME);
    assert_eq!(v["kind"], "checkpoint");
    assert_eq!(v["format_version"], METADATA_VERSION);
    assert_eq!(v["unaligned"], false);
    assert_eq!(v["in_flight_size"], 0);
    assert_eq!(v["in_flight"].as_array().unwrap().len(), 0);
    assert_eq!(v["weir_version"], env!("CARGO_PKG_VERSION"));
    assert!(v["selected_from"].is_null());
    assert_eq!(v["problems"].as_array().unwrap().len(), 0, "{v:#}");
    let files = state_files(&chk);
    assert_eq!(v["files_verified"], 1 + files.len() as u64);
    let bytes: u64 = std::fs::read_dir(&chk)
        .unwrap()
        .flatten()
        .map(|e| e.metadata().unwrap().len())
        .sum();
    assert_eq!(v["bytes_verified"], bytes);

    let ops = v["operators"].as_array().unwrap();
    let by_uid = |uid: &str| {
        ops.iter()
            .find(|op| op["uid"] == uid)
            .unwrap_or_else(|| panic!("no operator with uid {uid}: {v:#}"))
    };
    for uid in ["source", "to-pairs", "sum"] {
        by_uid(uid);
    }
    // The sum: keyed state in files, ranges partitioning 0..max_parallelism.
    let sum = by_uid("sum");
    let max_p = sum["max_parallelism"].as_u64().unwrap();
    assert_eq!(sum["parallelism"], 2);
    let subtasks = sum["subtasks"].as_array().unwrap();
    assert_eq!(subtasks.len(), 2);
    let mut next = 0;
    for (i, sub) in subtasks.iter().enumerate() {
        assert_eq!(sub["subtask"], i as u64);
        let keyed = sub["keyed"].as_array().unwrap();
        assert_eq!(keyed.len(), 1);
        let k = &keyed[0];
        assert_eq!(k["key_groups"]["start"], next);
        next = k["key_groups"]["end"].as_u64().unwrap() + 1;
        assert_eq!(
            k["key_groups"]["count"].as_u64().unwrap(),
            next - k["key_groups"]["start"].as_u64().unwrap()
        );
        assert_eq!(k["max_parallelism"], max_p);
        let states = k["states"].as_array().unwrap();
        assert_eq!(states.len(), 1);
        assert_eq!(states[0]["name"], "sum");
        assert_eq!(states[0]["kind"], "value");
        assert_eq!(states[0]["key_type"], "u64");
        assert_eq!(states[0]["value_type"], "i64");
        assert_eq!(k["stream"]["inline"], false);
        let file = PathBuf::from(k["stream"]["file"].as_str().unwrap());
        assert!(file.is_file(), "{file:?}");
        assert!(k["size"].as_u64().unwrap() > 20 * 1024);
        assert_eq!(k["size"].as_u64().unwrap(), file.metadata().unwrap().len());
        assert_eq!(k["verification"]["ok"], true, "{k:#}");
    }
    assert_eq!(next, max_p, "the ranges do not cover 0..{max_p}");

    // The source keeps its split positions as operator state; the sink is a stateful operator
    // without a uid.
    let source = by_uid("source");
    let op_states = source["subtasks"][0]["operator"].as_array().unwrap();
    assert_eq!(op_states.len(), 1, "{source:#}");
    assert!(!op_states[0]["states"].as_array().unwrap().is_empty());
    assert_eq!(op_states[0]["verification"]["ok"], true);
    let sink = ops
        .iter()
        .find(|op| op["uid"].is_null() && !op["subtasks"].as_array().unwrap().is_empty())
        .unwrap_or_else(|| panic!("no stateful operator without uid: {v:#}"));
    // The latest-per-key sink keeps its values in keyed state, so a rescale moves them by key.
    assert_eq!(
        sink["subtasks"][0]["keyed"][0]["states"][0]["name"],
        "latest"
    );

    // The text report says the same.
    let o = weir_at(&["checkpoints", "inspect"], &chk);
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    let text = stdout(&o);
    assert!(
        text.contains(&format!("checkpoint:     {id} (checkpoint)")),
        "{text}"
    );
    assert!(
        text.contains(&format!("job:            {JOB_NAME} (")),
        "{text}"
    );
    assert!(
        text.contains(&format!("format version: {METADATA_VERSION}\n")),
        "{text}"
    );
    assert!(text.contains("in-flight data: none\n"), "{text}");
    assert!(!text.contains("In-flight data of"), "{text}");
    for uid in ["source", "to-pairs", "sum"] {
        assert!(text.contains(&format!("Operator uid \"{uid}\"")), "{text}");
    }
    assert!(text.contains("Operator (no uid), id "), "{text}");
    for sub in subtasks {
        let kg = &sub["keyed"][0]["key_groups"];
        assert!(
            text.contains(&format!(
                "keyed state: key groups [{}, {}] ({})",
                kg["start"], kg["end"], kg["count"]
            )),
            "{text}"
        );
        assert!(text.contains(sub["keyed"][0]["stream"]["file"].as_str().unwrap()));
    }
    assert!(
        text.contains("state \"sum\": value, key u64, value i64"),
        "{text}"
    );
    assert!(text.contains("split-distribute"), "{text}");
    assert!(text.contains("Verification: OK: "), "{text}");
    assert!(!text.contains("FAILED"), "{text}");

    // Given the root, inspect takes the latest complete checkpoint and says so.
    let o = weir_at(&["checkpoints", "inspect", "--json"], root);
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["checkpoint_id"], latest(root).0);
    assert_eq!(v["selected_from"], root.to_str().unwrap());
    let o = weir_at(&["checkpoints", "inspect"], root);
    assert!(
        stdout(&o).contains("(the latest complete checkpoint under"),
        "{}",
        show(&o)
    );
}

#[test]
fn verify_accepts_every_intact_checkpoint() {
    let root = fixture();
    for id in complete_ids(root) {
        let chk = job_dir(root).join(format!("chk-{id}"));
        let o = weir_at(&["checkpoints", "verify"], &chk);
        assert_eq!(o.status.code(), Some(0), "{}", show(&o));
        let files = 1 + state_files(&chk).len();
        let out = stdout(&o);
        assert!(
            out.starts_with(&format!(
                "OK: checkpoint {id} of job {JOB_NAME}: {files} files, "
            )),
            "{out}"
        );
        assert!(out.trim_end().ends_with("bytes verified"), "{out}");
    }
    let o = weir_at(&["checkpoints", "verify"], root);
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    assert!(stdout(&o).contains(&format!("OK: checkpoint {} of job", latest(root).0)));
}

#[test]
fn verify_names_a_state_file_with_a_flipped_byte() {
    let tmp = copy_of_fixture();
    let (_, chk) = latest(tmp.path());
    let keyed: Vec<PathBuf> = state_files(&chk)
        .into_iter()
        .filter(|p| p.to_str().unwrap().ends_with("-keyed"))
        .collect();
    assert!(!keyed.is_empty());
    // A byte in the middle of the sections: the file's CRC and one key group's section fail.
    let victim = &keyed[0];
    let len = victim.metadata().unwrap().len();
    flip_byte(victim, (len / 2) as i64);

    let o = weir_at(&["checkpoints", "verify"], &chk);
    assert_eq!(o.status.code(), Some(1), "{}", show(&o));
    let out = stdout(&o);
    let victim_shown = victim.canonicalize().unwrap();
    let victim_shown = victim_shown.to_str().unwrap();
    let lines: Vec<&str> = out.lines().collect();
    assert!(!lines.is_empty());
    for line in &lines {
        assert!(
            line.starts_with(&format!("CORRUPT: {victim_shown}: ")),
            "{out}"
        );
    }
    assert!(out.contains("checksum mismatch"), "{out}");
    assert!(
        out.contains("key group"),
        "the damaged key group is not located: {out}"
    );

    // Inspect shows the failed check on that handle and still reports the rest, and exits 1
    // as verify does.
    let o = weir_at(&["checkpoints", "inspect", "--json"], &chk);
    assert_eq!(o.status.code(), Some(1), "{}", show(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let problems = v["problems"].as_array().unwrap();
    assert!(!problems.is_empty());
    assert!(problems.iter().all(|p| p["file"] == victim_shown), "{v:#}");

    // The other checkpoints are untouched.
    let older = *complete_ids(tmp.path()).first().unwrap();
    let o = weir_at(
        &["checkpoints", "verify"],
        &job_dir(tmp.path()).join(format!("chk-{older}")),
    );
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
}

#[test]
fn a_truncated_or_missing_state_file_is_named() {
    let tmp = copy_of_fixture();
    let (_, chk) = latest(tmp.path());
    let files = state_files(&chk);
    let truncated = &files[0];
    let bytes = std::fs::read(truncated).unwrap();
    std::fs::write(truncated, &bytes[..bytes.len() - 7]).unwrap();
    let missing = &files[1];
    std::fs::remove_file(missing).unwrap();

    let o = weir_at(&["checkpoints", "verify"], &chk);
    assert_eq!(o.status.code(), Some(1), "{}", show(&o));
    let out = stdout(&o);
    let name = |p: &Path| p.file_name().unwrap().to_str().unwrap().to_string();
    assert!(
        out.lines().any(|l| l.starts_with("CORRUPT: ")
            && l.contains(&name(truncated))
            && l.contains("truncated")),
        "{out}"
    );
    assert!(
        out.lines().any(|l| l.starts_with("CORRUPT: ")
            && l.contains(&name(missing))
            && l.contains("does not exist")),
        "{out}"
    );
    // Inspect still reports the whole checkpoint, lists the problems, and exits 1.
    let o = weir_at(&["checkpoints", "inspect"], &chk);
    assert_eq!(o.status.code(), Some(1), "{}", show(&o));
    let out = stdout(&o);
    assert!(
        out.lines()
            .any(|l| l.starts_with("Verification: ") && l.contains(" problems in ")),
        "{out}"
    );
    assert!(
        out.contains(&name(truncated)) && out.contains(&name(missing)),
        "{out}"
    );
}

#[test]
fn a_flipped_byte_in_metadata_is_corrupt() {
    let tmp = copy_of_fixture();
    let (id, chk) = latest(tmp.path());
    let metadata = chk.join("_metadata");
    flip_byte(&metadata, 40);

    let o = weir_at(&["checkpoints", "verify"], &chk);
    assert_eq!(o.status.code(), Some(1), "{}", show(&o));
    let out = stdout(&o);
    let shown = metadata.canonicalize().unwrap();
    assert!(
        out.starts_with(&format!("CORRUPT: {}: ", shown.display())),
        "{out}"
    );
    assert!(out.contains("checksum mismatch"), "{out}");

    let o = weir_at(&["checkpoints", "list"], tmp.path());
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    let out = stdout(&o);
    let row = out
        .lines()
        .find(|l| l.split_whitespace().nth(1) == Some(&id.to_string()))
        .unwrap_or_else(|| panic!("checkpoint {id} is not listed: {out}"));
    assert!(row.starts_with("CORRUPT "), "{out}");
    assert!(row.contains("_metadata: checksum mismatch"), "{out}");
    // The others are still listed as completed.
    assert_eq!(
        out.lines().filter(|l| l.starts_with("COMPLETED ")).count(),
        complete_ids(tmp.path()).len() - 1,
        "{out}"
    );

    // Inspect cannot report on it: exit 1, naming the file.
    let o = weir_at(&["checkpoints", "inspect"], &chk);
    assert_eq!(o.status.code(), Some(1), "{}", show(&o));
    assert!(stderr(&o).contains(shown.to_str().unwrap()), "{}", show(&o));
}

#[test]
fn a_checkpoint_without_metadata_is_incomplete() {
    let tmp = copy_of_fixture();
    let (id, chk) = latest(tmp.path());
    std::fs::remove_file(chk.join("_metadata")).unwrap();

    let o = weir_at(&["checkpoints", "list"], tmp.path());
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    let out = stdout(&o);
    let row = out
        .lines()
        .find(|l| l.split_whitespace().nth(1) == Some(&id.to_string()))
        .unwrap_or_else(|| panic!("checkpoint {id} is not listed: {out}"));
    assert!(row.starts_with("INCOMPLETE "), "{out}");

    // Verifying it is a usage error; verifying the root takes the latest complete one instead.
    let o = weir_at(&["checkpoints", "verify"], &chk);
    assert_eq!(o.status.code(), Some(2), "{}", show(&o));
    assert!(stderr(&o).contains("incomplete"), "{}", show(&o));
    let o = weir_at(&["checkpoints", "verify"], tmp.path());
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    let previous = complete_ids(tmp.path()).last().copied().unwrap();
    assert!(previous < id);
    assert!(
        stdout(&o).contains(&format!("OK: checkpoint {previous} of job {JOB_NAME}")),
        "{}",
        show(&o)
    );
}

#[test]
fn bad_paths_are_usage_errors() {
    let tmp = tempfile::tempdir().unwrap();
    let nowhere = tmp.path().join("does-not-exist");
    for cmd in ["list", "inspect", "verify"] {
        let o = weir_at(&["checkpoints", cmd], &nowhere);
        assert_eq!(o.status.code(), Some(2), "{cmd}: {}", show(&o));
        let err = stderr(&o);
        assert!(
            err.contains(nowhere.to_str().unwrap()) && err.contains("does not exist"),
            "{cmd}: {err}"
        );
        assert!(!err.contains("panicked"), "{err}");
    }
    // An empty directory holds no checkpoint.
    for cmd in ["list", "inspect", "verify"] {
        let o = weir_at(&["checkpoints", cmd], tmp.path());
        assert_eq!(o.status.code(), Some(2), "{cmd}: {}", show(&o));
        assert!(
            stderr(&o).contains("no checkpoint under"),
            "{cmd}: {}",
            show(&o)
        );
        assert!(!tmp.path().join("does-not-exist").exists());
    }
    // A file is not a directory.
    let file = tmp.path().join("file");
    std::fs::write(&file, b"x").unwrap();
    let o = weir_at(&["checkpoints", "list"], &file);
    assert_eq!(o.status.code(), Some(2), "{}", show(&o));
    assert!(stderr(&o).contains("is not a directory"), "{}", show(&o));
    // opendal's fs lister panics on a symbolic link to a directory: an error naming the path.
    #[cfg(unix)]
    {
        let root = tmp.path().join("with-link");
        std::fs::create_dir(&root).unwrap();
        std::os::unix::fs::symlink(tmp.path(), root.join("link")).unwrap();
        let o = weir_at(&["checkpoints", "list"], &root);
        assert_eq!(o.status.code(), Some(1), "{}", show(&o));
        let err = stderr(&o);
        assert!(err.contains(root.to_str().unwrap()), "{err}");
        assert!(err.contains("symbolic link"), "{err}");
        assert!(!err.contains("panicked"), "{err}");
    }
    // Clap's own usage errors exit 2 as well.
    let o = weir(&["checkpoints", "verify"]);
    assert_eq!(o.status.code(), Some(2), "{}", show(&o));
}

/// Inspect shows an unaligned checkpoint's in-flight data: its total, and per subtask the
/// channel-state file and its sections; list marks the checkpoint as unaligned.
#[test]
fn inspect_shows_the_in_flight_data_of_an_unaligned_checkpoint() {
    let (root, chk) = unaligned_fixture();
    let id = chk_id(chk);

    let o = weir_at(&["checkpoints", "inspect", "--json"], chk);
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["checkpoint_id"], id);
    assert_eq!(v["job_name"], UNALIGNED_JOB);
    assert_eq!(v["format_version"], METADATA_VERSION);
    assert_eq!(v["unaligned"], true, "{v:#}");
    assert_eq!(v["problems"].as_array().unwrap().len(), 0, "{v:#}");
    // Every file, channel-state files included, is verified.
    let files = state_files(chk);
    assert_eq!(v["files_verified"], 1 + files.len() as u64, "{v:#}");

    let in_flight = v["in_flight"].as_array().unwrap();
    assert!(!in_flight.is_empty(), "{v:#}");
    let total: u64 = in_flight.iter().map(|f| f["size"].as_u64().unwrap()).sum();
    assert!(total > 0);
    assert_eq!(v["in_flight_size"], total, "{v:#}");
    let operator_state: u64 = v["operators"]
        .as_array()
        .unwrap()
        .iter()
        .map(|op| op["state_size"].as_u64().unwrap())
        .sum();
    assert_eq!(v["state_size"], operator_state + total, "{v:#}");
    let channels = channel_files(chk);
    let mut shown_files = Vec::new();
    let mut records = 0;
    for f in in_flight {
        assert!(f["subtask"].as_u64().unwrap() < 2, "{f:#}");
        // Filed under the head of the subtask's chain, which the checkpoint knows by name.
        assert!(f["operator"].is_string(), "{f:#}");
        assert_eq!(f["verification"]["ok"], true, "{f:#}");
        let sections = f["sections"].as_array().unwrap();
        assert!(!sections.is_empty(), "{f:#}");
        for c in sections {
            assert!(["input", "output"].contains(&c["direction"].as_str().unwrap()));
            let (producer, consumer) = (&c["producer"], &c["consumer"]);
            let end = if c["direction"] == "input" {
                consumer
            } else {
                producer
            };
            assert_eq!(*end, f["subtask"], "{f:#}");
            let (from, to) = (
                c["from_operator_id"].as_str().unwrap(),
                c["to_operator_id"].as_str().unwrap(),
            );
            assert_eq!(
                c["channel"],
                format!("{}[{producer}] -> {}[{consumer}]", &from[..8], &to[..8]),
                "{c:#}"
            );
            assert!(c["from_operator"].is_string() && c["to_operator"].is_string());
        }
        let section_records: u64 = sections
            .iter()
            .map(|c| c["records"].as_u64().unwrap())
            .sum();
        assert_eq!(f["records"], section_records);
        records += section_records;
        if f["stream"]["inline"] == false {
            let file = PathBuf::from(f["stream"]["file"].as_str().unwrap());
            assert_eq!(f["size"].as_u64().unwrap(), file.metadata().unwrap().len());
            shown_files.push(file);
        }
    }
    assert!(records > 0, "no in-flight records: {v:#}");
    let mut expected: Vec<PathBuf> = channels.iter().map(|p| p.canonicalize().unwrap()).collect();
    expected.sort();
    shown_files.sort();
    assert_eq!(shown_files, expected, "every channel-state file is shown");

    // The text report says the same.
    let o = weir_at(&["checkpoints", "inspect"], chk);
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    let text = stdout(&o);
    assert!(
        text.contains(&format!("in-flight data: {total} bytes",))
            && text.contains(&format!(
                "in {} subtask{} (unaligned checkpoint)\n",
                in_flight.len(),
                if in_flight.len() == 1 { "" } else { "s" }
            )),
        "{text}"
    );
    for f in in_flight {
        let header = format!(
            "In-flight data of operator {:?} ",
            f["operator"].as_str().unwrap()
        );
        assert!(text.contains(&header), "{text}");
        assert!(
            text.contains(&format!(", subtask {}: ", f["subtask"])),
            "{text}"
        );
        for c in f["sections"].as_array().unwrap() {
            let line = format!(
                "  {:<6} channel {} ({:?} -> {:?}): {} records, {} bytes",
                c["direction"].as_str().unwrap(),
                c["channel"].as_str().unwrap(),
                c["from_operator"].as_str().unwrap(),
                c["to_operator"].as_str().unwrap(),
                c["records"],
                c["bytes"]
            );
            assert!(text.contains(&line), "{line}\n{text}");
        }
    }
    for file in &shown_files {
        assert!(text.contains(file.to_str().unwrap()), "{text}");
    }
    assert!(
        text.contains("decoded and checked against _metadata"),
        "{text}"
    );
    assert!(text.contains("Verification: OK: "), "{text}");
    assert!(!text.contains("FAILED"), "{text}");

    // list marks it, with the in-flight bytes.
    let o = weir_at(&["checkpoints", "list"], root);
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    let out = stdout(&o);
    let row = out
        .lines()
        .find(|l| l.split_whitespace().nth(1) == Some(&id.to_string()))
        .unwrap_or_else(|| panic!("checkpoint {id} is not listed: {out}"));
    assert!(row.starts_with("COMPLETED "), "{out}");
    assert!(
        row.ends_with(&format!("chk-{id}  (unaligned: {total} bytes in flight)"))
            || row.contains(&format!("chk-{id}  (unaligned: {total} bytes (")),
        "{out}"
    );
    let o = weir_at(&["checkpoints", "list", "--json"], root);
    let listed: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let entry = listed
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["id"] == id)
        .unwrap();
    assert_eq!(entry["unaligned"], true, "{entry:#}");
    assert_eq!(entry["in_flight_size"], total, "{entry:#}");
    assert_eq!(entry["state_size"], v["state_size"], "{entry:#}");
}

#[test]
fn verify_accepts_an_unaligned_checkpoint_and_names_a_corrupt_channel_state_file() {
    let (_, chk) = unaligned_fixture();
    let id = chk_id(chk);
    let o = weir_at(&["checkpoints", "verify"], chk);
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    let files = 1 + state_files(chk).len();
    assert!(
        stdout(&o).starts_with(&format!(
            "OK: checkpoint {id} of job {UNALIGNED_JOB}: {files} files, "
        )),
        "{}",
        show(&o)
    );

    // One flipped byte in the middle of a channel-state file.
    let (tmp, chk) = copy_of_unaligned();
    let victim = channel_files(&chk).into_iter().next().unwrap();
    let len = victim.metadata().unwrap().len();
    flip_byte(&victim, (len / 2) as i64);
    let o = weir_at(&["checkpoints", "verify"], &chk);
    assert_eq!(o.status.code(), Some(1), "{}", show(&o));
    let out = stdout(&o);
    let victim_shown = victim.canonicalize().unwrap();
    let victim_shown = victim_shown.to_str().unwrap();
    assert!(!out.is_empty());
    for line in out.lines() {
        assert!(
            line.starts_with(&format!("CORRUPT: {victim_shown}: ")),
            "{out}"
        );
    }
    assert!(out.contains("digest mismatch"), "{out}");

    // Inspect shows the failed check on that subtask's in-flight data, and exits 1.
    let o = weir_at(&["checkpoints", "inspect", "--json"], &chk);
    assert_eq!(o.status.code(), Some(1), "{}", show(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let problems = v["problems"].as_array().unwrap();
    assert!(!problems.is_empty());
    assert!(problems.iter().all(|p| p["file"] == victim_shown), "{v:#}");
    let failed: Vec<&serde_json::Value> = v["in_flight"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["verification"]["ok"] == false)
        .collect();
    assert_eq!(failed.len(), 1, "{v:#}");
    assert_eq!(failed[0]["stream"]["file"], victim_shown);
    drop(tmp);
}

/// The sections `_metadata` records for a channel-state file must be the file's: a record count
/// that disagrees is reported on the file.
#[test]
fn verify_compares_channel_state_sections_with_metadata() {
    let (_tmp, chk) = copy_of_unaligned();
    let metadata_file = chk.join("_metadata");
    let mut m =
        CheckpointMetadata::from_bytes("_metadata", &std::fs::read(&metadata_file).unwrap())
            .unwrap();
    let entry = m
        .in_flight
        .iter_mut()
        .find(|e| {
            matches!(
                e.handle.stream,
                weir_core::handle::StreamStateHandle::File { .. }
            )
        })
        .expect("no in-flight data in a file");
    let weir_core::handle::StreamStateHandle::File { path, .. } = &entry.handle.stream else {
        unreachable!()
    };
    let file = chk
        .join(Path::new(path).file_name().unwrap())
        .canonicalize()
        .unwrap();
    let section = &mut entry.handle.sections[0];
    let recorded = section.records;
    section.records += 1;
    std::fs::write(&metadata_file, m.to_bytes().unwrap()).unwrap();

    let o = weir_at(&["checkpoints", "verify"], &chk);
    assert_eq!(o.status.code(), Some(1), "{}", show(&o));
    let out = stdout(&o);
    assert_eq!(out.lines().count(), 1, "{out}");
    assert!(
        out.starts_with(&format!("CORRUPT: {}: section 1 (", file.display())),
        "{out}"
    );
    assert!(
        out.contains(&format!(
            "holds {recorded} records, _metadata records {}",
            recorded + 1
        )),
        "{out}"
    );
}

/// Rewrites a checkpoint's files as builds before `_metadata` version 3 wrote them: no
/// identity frame, and handles with a CRC-32 of the file instead of a digest.
fn to_legacy_files(chk: &Path, mut m: CheckpointMetadata) -> CheckpointMetadata {
    use weir_core::handle::StreamStateHandle;
    let strip = |stream: &mut StreamStateHandle| -> u64 {
        match stream {
            StreamStateHandle::Inline(bytes) => {
                let (_, at) = weir_core::identity::open_frame(bytes).unwrap();
                bytes.drain(..at);
                at as u64
            }
            StreamStateHandle::File { path, .. } => {
                let file = chk.join(&*path);
                let bytes = std::fs::read(&file).unwrap();
                let (_, at) = weir_core::identity::open_frame(&bytes).unwrap();
                std::fs::write(&file, &bytes[at..]).unwrap();
                *stream = StreamStateHandle::LegacyFile {
                    path: path.clone(),
                    size: (bytes.len() - at) as u64,
                    crc32: crc32fast::hash(&bytes[at..]),
                };
                at as u64
            }
            StreamStateHandle::LegacyFile { .. } => panic!("already legacy"),
        }
    };
    for op in &mut m.operators {
        for state in op.subtasks.values_mut() {
            for h in &mut state.keyed {
                let by = strip(&mut h.stream);
                h.header = (h.header.0 - by, h.header.1 - by);
                h.offsets.iter_mut().for_each(|o| *o -= by);
                h.end -= by;
            }
            for h in &mut state.operator {
                strip(&mut h.stream);
            }
        }
    }
    m
}

/// A checkpoint written before unaligned checkpoints (format version 1) is still listed,
/// inspected and verified.
#[test]
fn a_version_1_metadata_is_still_inspected() {
    let tmp = copy_of_fixture();
    let (id, chk) = latest(tmp.path());
    let metadata_file = chk.join("_metadata");
    let m = CheckpointMetadata::from_bytes("_metadata", &std::fs::read(&metadata_file).unwrap())
        .unwrap();
    assert!(
        m.in_flight.is_empty(),
        "the fixture's checkpoints are aligned"
    );
    let m = to_legacy_files(&chk, m);
    let sealed = m.to_legacy_bytes(1).unwrap();
    std::fs::write(&metadata_file, &sealed).unwrap();

    let o = weir_at(&["checkpoints", "inspect", "--json"], &chk);
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["format_version"], 1);
    assert_eq!(v["checkpoint_id"], id);
    assert_eq!(v["metadata_size"], sealed.len() as u64);
    assert_eq!(v["state_size"], m.state_size());
    assert_eq!(v["unaligned"], false);
    assert_eq!(v["in_flight"].as_array().unwrap().len(), 0);
    assert_eq!(v["problems"].as_array().unwrap().len(), 0, "{v:#}");
    assert_eq!(
        v["operators"].as_array().unwrap().len(),
        m.operators.len(),
        "{v:#}"
    );
    let o = weir_at(&["checkpoints", "inspect"], &chk);
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    assert!(stdout(&o).contains("format version: 1\n"), "{}", show(&o));

    let o = weir_at(&["checkpoints", "verify"], &chk);
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    assert!(
        stdout(&o).starts_with(&format!("OK: checkpoint {id} of job {JOB_NAME}: ")),
        "{}",
        show(&o)
    );
    let o = weir_at(&["checkpoints", "list"], &chk);
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    assert!(
        stdout(&o).lines().nth(1).unwrap().starts_with("COMPLETED "),
        "{}",
        show(&o)
    );
}

// ---------------------------------------------------------------------------------------------
// Native keyed snapshots: the disk backend's runs, shared between checkpoints.

const NATIVE_JOB: &str = "cli-native-test";
/// Distinct keys of the native job: its runs are shared files whatever their size, so fewer
/// keys than [`KEYS`] do (and the disk backend is slow in a debug build).
const NATIVE_KEYS: u64 = 10_000;
/// Records the native job reads: the warm-up, then as many again.
const NATIVE_RECORDS: u64 = 4 * NATIVE_KEYS;

/// Runs the keyed job of [`run_job`] with its keyed state on the disk backend (stores under
/// `local`) and incremental checkpoints, so that each checkpoint records native snapshots: a
/// manifest, and the stores' runs in the job's `shared/` directory, each uploaded once.
async fn run_native_job(root: &Path, local: &Path) {
    let env = StreamEnvironment::new();
    env.set_job_name(NATIVE_JOB)
        .set_parallelism(2)
        .enable_checkpointing(Duration::from_millis(20))
        .set_checkpoint_dir(root)
        .set_state_backend(weir_runtime::DiskStateBackend::new(local));
    env.checkpoint_config().num_retained = 3;
    env.config_mut().incremental = true;
    KeyedJob {
        keys: NATIVE_KEYS,
        records: NATIVE_RECORDS,
        warm_up: 2 * NATIVE_KEYS,
        wanted: WANTED,
        give_up: Duration::from_secs(20),
    }
    .run(env, root.to_path_buf())
    .await;
}

/// A checkpoint root of the native job, made once per test process.
fn native_fixture() -> &'static Path {
    static ROOT: OnceLock<PathBuf> = OnceLock::new();
    ROOT.get_or_init(|| {
        let root = fresh_fixture_dir("weir-cli-native-");
        let local = tempfile::tempdir().unwrap();
        runtime().block_on(run_native_job(&root, local.path()));
        root
    })
}

fn read_metadata(chk: &Path) -> CheckpointMetadata {
    CheckpointMetadata::from_bytes("_metadata", &std::fs::read(chk.join("_metadata")).unwrap())
        .unwrap()
}

/// The files a `_metadata` references (resolved, each once), with their sizes.
fn referenced_files(chk: &Path, m: &CheckpointMetadata) -> BTreeMap<PathBuf, u64> {
    let subtasks = m.operators.iter().flat_map(|o| o.subtasks.values());
    let in_flight = m.in_flight.iter().map(|e| &e.handle.stream);
    subtasks
        .flat_map(|s| s.streams())
        .chain(in_flight)
        .filter_map(|h| Some((chk.join(h.path()?).canonicalize().unwrap(), h.size())))
        .collect()
}

/// The native files (in the job's `shared/` directory) a `_metadata` references.
fn native_files(chk: &Path, m: &CheckpointMetadata) -> Vec<PathBuf> {
    let subtasks = m.operators.iter().flat_map(|o| o.subtasks.values());
    let mut files: Vec<PathBuf> = subtasks
        .flat_map(|s| &s.native)
        .flat_map(|n| &n.files)
        .filter_map(|f| Some(chk.join(f.stream.path()?).canonicalize().unwrap()))
        .collect();
    files.sort();
    files.dedup();
    files
}

/// The newest complete checkpoint under `root` with native files in `shared/`.
fn latest_native(root: &Path) -> (u64, PathBuf) {
    for id in complete_ids(root).into_iter().rev() {
        let chk = job_dir(root).join(format!("chk-{id}"));
        if !native_files(&chk, &read_metadata(&chk)).is_empty() {
            return (id, chk);
        }
    }
    panic!(
        "no checkpoint with native files in shared/: {:?}",
        complete_ids(root)
    );
}

/// `inspect` lists each subtask's native snapshots (format, key groups, manifest, every file
/// with its key groups, place, digest and uploading checkpoint), as text and JSON; `verify`
/// reads every manifest and file, and counts them.
#[test]
fn inspect_and_verify_show_native_keyed_snapshots() {
    let root = native_fixture();
    let (id, chk) = latest_native(root);
    let m = read_metadata(&chk);
    let files = referenced_files(&chk, &m);
    let natives = native_files(&chk, &m);
    assert!(
        natives
            .iter()
            .all(|f| f.parent().unwrap().ends_with("shared"))
    );
    let metadata_size = chk.join("_metadata").metadata().unwrap().len();
    let bytes = metadata_size + files.values().sum::<u64>();

    let o = weir_at(&["checkpoints", "inspect", "--json"], &chk);
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["problems"].as_array().unwrap().len(), 0, "{v:#}");
    assert_eq!(v["files_verified"], 1 + files.len() as u64, "{v:#}");
    assert_eq!(v["bytes_verified"], bytes);
    let mut listed = 0;
    for (op, op_json) in m.operators.iter().zip(v["operators"].as_array().unwrap()) {
        let subtasks = op_json["subtasks"].as_array().unwrap();
        for ((&index, state), sub) in op.subtasks.iter().zip(subtasks) {
            assert_eq!(sub["subtask"], index);
            let native = sub["native"].as_array().unwrap();
            assert_eq!(native.len(), state.native.len(), "{sub:#}");
            for (h, n) in state.native.iter().zip(native) {
                assert_eq!(n["format"], "weir-disk-runs/2");
                assert_eq!(n["key_groups"]["start"], h.key_group_range.start);
                assert_eq!(n["key_groups"]["end"], h.key_group_range.end);
                assert_eq!(n["manifest"]["size"], h.manifest.size());
                assert_eq!(n["manifest"]["verification"]["ok"], true, "{n:#}");
                let nfiles = n["files"].as_array().unwrap();
                assert_eq!(nfiles.len(), h.files.len());
                for (f, fj) in h.files.iter().zip(nfiles) {
                    assert_eq!(fj["name"], f.name.as_str());
                    assert_eq!(fj["key_groups"]["start"], f.key_groups.start);
                    assert_eq!(fj["key_groups"]["end"], f.key_groups.end);
                    assert_eq!(fj["size"], f.stream.size());
                    assert_eq!(fj["verification"]["ok"], true, "{fj:#}");
                    assert!(fj["uploaded_by"].as_u64().unwrap() <= id, "{fj:#}");
                    if let Some(path) = f.stream.path() {
                        let shown = chk.join(path).canonicalize().unwrap();
                        assert_eq!(fj["stream"]["file"], shown.to_str().unwrap());
                        assert_eq!(fj["stream"]["inline"], false);
                        let sum = fj["stream"]["checksum"].as_str().unwrap();
                        assert!(sum.starts_with("xxh3-128 "), "{fj:#}");
                        listed += 1;
                    } else {
                        assert_eq!(fj["stream"]["inline"], true);
                    }
                }
            }
        }
    }
    assert!(listed >= natives.len(), "{v:#}");
    // The sum's keyed state is native, not a keyed snapshot.
    let sum = v["operators"]
        .as_array()
        .unwrap()
        .iter()
        .find(|op| op["uid"] == "sum")
        .unwrap();
    for sub in sum["subtasks"].as_array().unwrap() {
        assert_eq!(sub["keyed"].as_array().unwrap().len(), 0, "{sub:#}");
        assert_eq!(sub["native"].as_array().unwrap().len(), 1, "{sub:#}");
    }

    let o = weir_at(&["checkpoints", "inspect"], &chk);
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    let text = stdout(&o);
    assert!(
        text.contains("    native keyed state: key groups ["),
        "{text}"
    );
    assert!(text.contains(", format weir-disk-runs/2, "), "{text}");
    assert!(text.contains("      manifest: "), "{text}");
    for f in &natives {
        assert!(text.contains(f.to_str().unwrap()), "{f:?} not in {text}");
    }
    let name = &m
        .operators
        .iter()
        .flat_map(|o| o.subtasks.values())
        .flat_map(|s| &s.native)
        .next()
        .unwrap()
        .files[0]
        .name;
    assert!(
        text.contains(&format!("      file {name:?}: key groups [")),
        "{text}"
    );
    assert!(text.contains(", uploaded by checkpoint "), "{text}");
    assert!(!text.contains("FAILED"), "{text}");
    assert!(
        text.contains(&format!(
            "Verification: OK: {} files, {bytes} bytes verified",
            1 + files.len()
        )),
        "{text}"
    );

    let o = weir_at(&["checkpoints", "verify"], &chk);
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    assert_eq!(
        stdout(&o),
        format!(
            "OK: checkpoint {id} of job {NATIVE_JOB}: {} files, {bytes} bytes verified\n",
            1 + files.len()
        )
    );
    // The count holds every native file, each once however many subtasks list it.
    assert!(natives.iter().all(|f| files.contains_key(f)), "{files:?}");
}

/// Every complete checkpoint of the native job verifies, and later ones reference files an
/// earlier checkpoint uploaded (which their identity frames name).
#[test]
fn verify_accepts_native_files_uploaded_by_earlier_checkpoints() {
    let root = native_fixture();
    let mut shared_from_earlier = 0;
    for id in complete_ids(root) {
        let chk = job_dir(root).join(format!("chk-{id}"));
        let o = weir_at(&["checkpoints", "inspect", "--json"], &chk);
        assert_eq!(o.status.code(), Some(0), "{}", show(&o));
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        let uploaded: Vec<u64> = v["operators"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|op| op["subtasks"].as_array().unwrap())
            .flat_map(|s| s["native"].as_array().unwrap())
            .flat_map(|n| n["files"].as_array().unwrap())
            .map(|f| f["uploaded_by"].as_u64().unwrap())
            .collect();
        assert!(uploaded.iter().all(|&u| u <= id), "{v:#}");
        shared_from_earlier += uploaded.iter().filter(|&&u| u < id).count();
        let o = weir_at(&["checkpoints", "verify"], &chk);
        assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    }
    assert!(
        shared_from_earlier > 0,
        "no checkpoint references a file an earlier one uploaded: {:?}",
        complete_ids(root)
    );
}

/// A flipped byte in a shared native file fails its digest: `verify` and `inspect` name it.
#[test]
fn verify_names_a_damaged_native_file() {
    let tmp = copy_of(native_fixture());
    let (_, chk) = latest_native(tmp.path());
    let natives = native_files(&chk, &read_metadata(&chk));
    let victim = &natives[0];
    let len = victim.metadata().unwrap().len();
    flip_byte(victim, (len / 2) as i64);

    let o = weir_at(&["checkpoints", "verify"], &chk);
    assert_eq!(o.status.code(), Some(1), "{}", show(&o));
    let out = stdout(&o);
    let victim_shown = victim.to_str().unwrap();
    assert!(!out.is_empty());
    for line in out.lines() {
        assert!(
            line.starts_with(&format!("CORRUPT: {victim_shown}: ")),
            "{out}"
        );
    }
    assert!(out.contains("digest mismatch"), "{out}");

    let o = weir_at(&["checkpoints", "inspect", "--json"], &chk);
    assert_eq!(o.status.code(), Some(1), "{}", show(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let problems = v["problems"].as_array().unwrap();
    assert!(!problems.is_empty());
    assert!(problems.iter().all(|p| p["file"] == victim_shown), "{v:#}");
    let failed: Vec<&serde_json::Value> = v["operators"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|op| op["subtasks"].as_array().unwrap())
        .flat_map(|s| s["native"].as_array().unwrap())
        .flat_map(|n| n["files"].as_array().unwrap())
        .filter(|f| f["verification"]["ok"] == false)
        .collect();
    assert_eq!(failed.len(), 1, "{v:#}");
    assert_eq!(failed[0]["stream"]["file"], victim_shown);
    let o = weir_at(&["checkpoints", "inspect"], &chk);
    assert!(
        stdout(&o).contains("        verification: FAILED: digest mismatch"),
        "{}",
        show(&o)
    );
}

/// A native file of another subtask, recorded with its own size and digest, passes its digest
/// but not its identity frame: `verify` names it and what differs.
#[test]
fn verify_refuses_a_native_file_of_another_subtask() {
    let tmp = copy_of(native_fixture());
    let (_, chk) = latest_native(tmp.path());
    let mut m = read_metadata(&chk);
    // A run of subtask 1 in a file (small runs may be inline), recorded for subtask 0.
    let (op, other) = m
        .operators
        .iter()
        .enumerate()
        .find_map(|(i, op)| {
            let files = &op.subtasks.get(&1)?.native.first()?.files;
            let f = files.iter().find(|f| f.stream.path().is_some())?;
            Some((i, f.stream.clone()))
        })
        .expect("no native file of subtask 1 in a file");
    let foreign = chk.join(other.path().unwrap()).canonicalize().unwrap();
    let subtask_0 = m.operators[op].subtasks.get_mut(&0).unwrap();
    subtask_0.native[0].files[0].stream = other;
    std::fs::write(chk.join("_metadata"), m.to_bytes().unwrap()).unwrap();

    let o = weir_at(&["checkpoints", "verify"], &chk);
    assert_eq!(o.status.code(), Some(1), "{}", show(&o));
    let out = stdout(&o);
    assert_eq!(out.lines().count(), 1, "{out}");
    assert!(
        out.starts_with(&format!("CORRUPT: {}: ", foreign.display())),
        "{out}"
    );
    assert!(out.contains("the file belongs elsewhere"), "{out}");
    assert!(out.contains("subtask 1 (expected 0)"), "{out}");
    assert!(out.contains("key groups ["), "{out}");
}
