//! Claim modes across SIGKILL/resume cycles of the `word_count` binary, judged on the files left
//! under the checkpoint root (read directly, not through the engine) and on exact totals: with
//! `--claim-mode claim` the root holds at most `--retain` complete checkpoints, no incomplete
//! directory older than the newest complete one and no unreferenced shared file; with
//! `no-claim` every checkpoint a run restored from is left whole.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../../runtime/tests/support/bounded.rs"]
mod bounded;
use bounded::BoundedCommand;

#[path = "support/processes.rs"]
mod processes;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use weir_examples::expected_totals;
use weir_runtime::checkpoint::CheckpointMetadata;
use weir_runtime::checkpoint::storage::is_shared;

const RECORDS: u64 = 4_000_000;
const RETAIN: usize = 2;
const CYCLES: usize = 10;

fn word_count() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_word_count"));
    cmd.env_remove("RUST_LOG")
        .args(["--records", &RECORDS.to_string(), "--parallelism", "2"])
        .args(["--incremental", "--retain", &RETAIN.to_string()])
        .args(["--checkpoint-interval", "40ms", "--job-lock-lease", "300ms"]);
    cmd
}

/// What a root holds, read off the file system: per job directory, its checkpoints (id →
/// complete) and its shared files.
#[derive(Debug, Default)]
struct Root {
    checkpoints: BTreeMap<(String, u64), bool>,
    shared: BTreeSet<(String, String)>,
}

fn scan(root: &Path) -> Root {
    let mut out = Root::default();
    for job in std::fs::read_dir(root).into_iter().flatten().flatten() {
        let job_name = job.file_name().to_string_lossy().into_owned();
        for entry in std::fs::read_dir(job.path())
            .into_iter()
            .flatten()
            .flatten()
        {
            let name = entry.file_name().to_string_lossy().into_owned();
            if let Some(id) = name.strip_prefix("chk-").and_then(|n| n.parse().ok()) {
                out.checkpoints.insert(
                    (job_name.clone(), id),
                    entry.path().join("_metadata").is_file(),
                );
            } else if name == "shared" {
                for f in std::fs::read_dir(entry.path()).unwrap().flatten() {
                    out.shared.insert((
                        job_name.clone(),
                        f.file_name().to_string_lossy().into_owned(),
                    ));
                }
            }
        }
    }
    out
}

/// The shared files the complete checkpoints reference, from their `_metadata`.
fn referenced(root: &Path, scanned: &Root) -> BTreeSet<(String, String)> {
    let mut out = BTreeSet::new();
    for ((job, id), complete) in &scanned.checkpoints {
        if !complete {
            continue;
        }
        let path = root.join(job).join(format!("chk-{id}/_metadata"));
        let bytes = std::fs::read(&path).unwrap();
        let meta = CheckpointMetadata::from_bytes(&path.display().to_string(), &bytes).unwrap();
        for h in meta.handles().filter(|h| is_shared(h)) {
            let name = h
                .path()
                .unwrap()
                .trim_start_matches("../shared/")
                .to_string();
            out.insert((job.clone(), name));
        }
    }
    out
}

fn newest_complete(scanned: &Root) -> Option<u64> {
    scanned
        .checkpoints
        .iter()
        .filter(|(_, c)| **c)
        .map(|((_, id), _)| *id)
        .max()
}

/// Polls until a complete checkpoint newer than `after` exists under `root`.
fn wait_for_checkpoint_after(child: &mut Child, root: &Path, after: u64) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        if let Some(n) = newest_complete(&scan(root)).filter(|n| *n > after) {
            return n;
        }
        if let Some(status) = child.try_wait().unwrap() {
            panic!("word_count exited ({status}) before a checkpoint after {after}");
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("no checkpoint after {after} within two minutes");
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Runs `CYCLES` runs, each killed with SIGKILL after two checkpoints of its own, each resuming
/// from the root in `mode`, then a last run to the end. Returns the root, the checkpoint each
/// run resumed from, and the last run's totals.
fn cycles(mode: &str, root: &Path) -> (Vec<u64>, BTreeMap<String, i64>) {
    let mut resumed = Vec::new();
    let mut last = 0;
    for cycle in 0..CYCLES {
        let mut cmd = word_count();
        cmd.arg("--checkpoint-dir")
            .arg(root)
            .args(["--sink-delay", "20us"]);
        if cycle > 0 {
            cmd.arg("--from").arg(root).args(["--claim-mode", mode]);
            resumed.push(last);
        }
        let mut child = cmd
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let first = wait_for_checkpoint_after(&mut child, root, last);
        if mode == "claim" && cycle > 0 {
            // The claim was carried out before the run's first checkpoint: outside the run's own
            // directory only the checkpoint it restored from is left (if not yet subsumed).
            let s = scan(root);
            let own: BTreeSet<&String> = s
                .checkpoints
                .keys()
                .filter(|(_, id)| *id > last)
                .map(|(j, _)| j)
                .collect();
            let others: Vec<_> = s
                .checkpoints
                .iter()
                .filter(|((j, _), _)| !own.contains(j))
                .collect();
            assert!(
                others
                    .iter()
                    .all(|((_, id), complete)| **complete && *id == last)
                    && others.len() <= 1,
                "cycle {cycle}: after the claim, earlier runs keep only the restored chk-{last}: {others:?}"
            );
        }
        last = wait_for_checkpoint_after(&mut child, root, first);
        child.kill().unwrap();
        child.wait().unwrap();
    }
    let out = root.with_extension("totals.csv");
    let done = word_count()
        .arg("--checkpoint-dir")
        .arg(root)
        .arg("--from")
        .arg(root)
        .args(["--claim-mode", mode])
        // The same graph as the killed runs' (the delay is an operator), at no cost.
        .args(["--sink-delay", "1ns"])
        .arg("--output")
        .arg(&out)
        .output_bounded()
        .unwrap();
    assert!(
        done.status.success(),
        "{}",
        String::from_utf8_lossy(&done.stderr)
    );
    // The last run resumed (its sources emitted fewer than all records): exact totals below are
    // only possible with the restored state.
    processes::assert_restored(&String::from_utf8_lossy(&done.stdout), RECORDS, &[root]);
    resumed.push(last);
    let totals = std::fs::read_to_string(&out)
        .unwrap()
        .lines()
        .map(|l| {
            let (k, v) = l.split_once(',').unwrap();
            (k.to_string(), v.parse().unwrap())
        })
        .collect();
    (resumed, totals)
}

#[test]
fn claim_mode_keeps_the_root_to_the_retained_checkpoints_across_kills() {
    let tmp = tempfile::tempdir().unwrap();
    let root: PathBuf = tmp.path().join("ck");
    let (_, totals) = cycles("claim", &root);
    assert_eq!(totals, expected_totals(RECORDS, 42));
    let s = scan(&root);
    let complete: Vec<_> = s.checkpoints.iter().filter(|(_, c)| **c).collect();
    assert!(
        complete.len() <= RETAIN,
        "at most {RETAIN} complete checkpoints remain: {complete:?}"
    );
    let newest = newest_complete(&s).unwrap_or(0);
    let stale: Vec<_> = s
        .checkpoints
        .iter()
        .filter(|((_, id), c)| !**c && *id < newest)
        .collect();
    assert!(
        stale.is_empty(),
        "no incomplete directory older than chk-{newest}: {stale:?}"
    );
    let refs = referenced(&root, &s);
    let unreferenced: Vec<_> = s.shared.difference(&refs).collect();
    assert!(
        unreferenced.is_empty(),
        "shared files no checkpoint references: {unreferenced:?}"
    );
    let dirs = std::fs::read_dir(&root).unwrap().count();
    assert!(
        dirs <= 1 + RETAIN,
        "the killed runs' job directories are gone: {dirs} left"
    );
}

#[test]
fn no_claim_mode_leaves_every_restored_checkpoint_whole() {
    let tmp = tempfile::tempdir().unwrap();
    let root: PathBuf = tmp.path().join("ck");
    let (resumed, totals) = cycles("no-claim", &root);
    assert_eq!(totals, expected_totals(RECORDS, 42));
    let s = scan(&root);
    for id in &resumed {
        assert!(
            s.checkpoints
                .iter()
                .any(|((_, c), complete)| c == id && *complete),
            "chk-{id}, restored from, must still be complete: {:?}",
            s.checkpoints
        );
    }
    // Each is still a whole checkpoint: every shared file it references is there.
    let missing: Vec<_> = referenced(&root, &s)
        .difference(&s.shared)
        .cloned()
        .collect();
    assert!(
        missing.is_empty(),
        "shared files referenced but gone: {missing:?}"
    );
    // Every run kept its own directory: CYCLES killed runs and the last.
    assert!(std::fs::read_dir(&root).unwrap().count() > CYCLES);
}
