//! Channel state that cannot be mistaken: in an unaligned checkpoint's in-flight data, a
//! channel-state file swapped in from an earlier checkpoint, and a `_metadata` whose section
//! summaries disagree with the file, are named by `weir checkpoints verify`, and a restore falls
//! back past them to the previous complete checkpoint with exact totals: both verifiers agree.
#![cfg(feature = "cli")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "support/bounded.rs"]
mod bounded;
use bounded::{Bounded, BoundedCommand};

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};
use weir_checkpoint::{CheckpointMetadata, OpendalCheckpointStorage};
use weir_runtime::testing::{Gate, GateDriver};
use weir_runtime::{JobClient, JobError, JobResult, StorageConfig, StreamEnvironment};

const KEYS: u64 = 500;
const RECORDS: u64 = 200_000;

/// The complete checkpoints under `root` holding a channel-state file, oldest first.
fn with_channels(root: &Path) -> Vec<(u64, PathBuf)> {
    let mut out = Vec::new();
    for (id, dir) in complete(root) {
        if !channel_files(&dir).is_empty() {
            out.push((id, dir));
        }
    }
    out
}

/// The complete `chk-<n>` directories under a root, oldest first.
fn complete(root: &Path) -> Vec<(u64, PathBuf)> {
    let mut out = Vec::new();
    for job in std::fs::read_dir(root).into_iter().flatten().flatten() {
        for chk in std::fs::read_dir(job.path())
            .into_iter()
            .flatten()
            .flatten()
        {
            let name = chk.file_name().to_string_lossy().to_string();
            if let Some(id) = name
                .strip_prefix("chk-")
                .and_then(|n| n.parse::<u64>().ok())
                && chk.path().join("_metadata").is_file()
            {
                out.push((id, chk.path()));
            }
        }
    }
    out.sort();
    out
}

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

/// generator → pairs → key_by → sum → gate → latest_per_key, parallelism 2, one buffer per
/// channel, unaligned checkpoints every 10 ms into `root`, every one retained, nothing inlined.
/// The gate (closed, and driven) backs the exchange up until three checkpoints wrote in-flight
/// data.
async fn run(
    root: &Path,
    from: Option<&Path>,
) -> Result<(JobResult, BTreeMap<u64, i64>), JobError> {
    let storage = OpendalCheckpointStorage::fs(root)
        .unwrap()
        .with_inline_threshold(0);
    let env = StreamEnvironment::new();
    env.set_job_name("integrity-channels")
        .set_parallelism(2)
        .enable_checkpointing(Duration::from_millis(10))
        .set_checkpoint_storage(StorageConfig::Custom(Arc::new(storage)));
    {
        let mut config = env.config_mut();
        config.checkpoint.unaligned = true;
        config.checkpoint.num_retained = 10_000;
        config.buffers_per_channel = 1;
        config.batch_size = 64;
    }
    if let Some(from) = from {
        env.restore_from(from);
    }
    let gate = Gate::closed();
    if from.is_some() {
        gate.open();
    }
    let totals = env
        .from_generator(Some(RECORDS), |i| i)
        .uid("source")
        .map(|i: u64| (i % KEYS, 1i64))
        .uid("to-pairs")
        .key_by(|t: &(u64, i64)| &t.0)
        .sum()
        .uid("sum")
        .through_gate(&gate)
        .uid("slow")
        .latest_per_key();
    let client = JobClient::default();
    let job = tokio::spawn(env.execute_with(client.clone()).bounded());
    if from.is_none() {
        // Each checkpoint's barrier overtakes the records queued at the closed gate, until
        // three checkpoints wrote channel state.
        let driver = GateDriver::start(client, gate, 2, 2_000);
        let give_up = Instant::now() + Duration::from_secs(60);
        while with_channels(root).len() < 3 && !job.is_finished() {
            assert!(
                Instant::now() < give_up,
                "no three channel-state files in 60 s"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        driver.stop().await;
    }
    let result = job.await.expect("the job panicked")?;
    Ok((result, totals.get().into_iter().collect()))
}

fn expected() -> BTreeMap<u64, i64> {
    (0..KEYS).map(|k| (k, (RECORDS / KEYS) as i64)).collect()
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// A root whose newest complete checkpoint holds in-flight data and has an older complete
/// checkpoint with in-flight data before it: later checkpoints are removed.
fn fixture() -> (tempfile::TempDir, PathBuf, PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let (_, totals) = runtime().block_on(run(tmp.path(), None)).unwrap();
    assert_eq!(totals, expected(), "the fixture run itself must be exact");
    let found = with_channels(tmp.path());
    assert!(
        found.len() >= 2,
        "two checkpoints with in-flight data are needed, got {found:?}"
    );
    let (newest_id, newest) = found[found.len() - 1].clone();
    let (_, older) = found[found.len() - 2].clone();
    for (id, dir) in complete(tmp.path()) {
        if id > newest_id {
            std::fs::remove_dir_all(dir).unwrap();
        }
    }
    (tmp, newest, older)
}

/// `weir checkpoints verify <chk>` fails naming `file` and one of `why`; a restore from the
/// root falls back to the complete checkpoint before `newest`, resumes, and is exact.
fn assert_both_detect(root: &Path, newest: &Path, file: &str, why: &[&str]) {
    let o = Command::new(env!("CARGO_BIN_EXE_weir"))
        .args(["checkpoints", "verify"])
        .arg(newest)
        .output_bounded()
        .unwrap();
    let out = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    assert_eq!(o.status.code(), Some(1), "verify must fail:\n{out}");
    assert!(out.contains(file), "verify must name {file}:\n{out}");
    assert!(
        why.iter().any(|w| out.contains(w)),
        "verify must say one of {why:?}:\n{out}"
    );

    let before = complete(root);
    let previous = &before[before.len() - 2].1;
    let (result, totals) = runtime().block_on(run(root, Some(root))).unwrap();
    let restored = result.restored_from.expect("the run must restore");
    let prev_name = previous.file_name().unwrap().to_string_lossy().to_string();
    assert!(
        restored.ends_with(&prev_name),
        "the restore must fall back to {prev_name}, got {restored}"
    );
    assert!(
        result.source_records < RECORDS,
        "the restore must resume: it emitted {}",
        result.source_records
    );
    assert_eq!(
        totals,
        expected(),
        "the restored run's totals must be exact"
    );
}

#[test]
fn a_channel_state_file_from_an_earlier_checkpoint_is_detected() {
    let (tmp, newest, older) = fixture();
    let victim = channel_files(&newest)[0].clone();
    let name = victim.file_name().unwrap().to_string_lossy().to_string();
    // The same subtask's in-flight data, one checkpoint earlier (the name up to the generation).
    let prefix: String = name.splitn(3, '-').take(2).collect::<Vec<_>>().join("-");
    let donor = channel_files(&older)
        .into_iter()
        .find(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with(&format!("{prefix}-"))
        })
        .unwrap_or_else(|| channel_files(&older)[0].clone());
    std::fs::copy(&donor, &victim).unwrap();
    assert_both_detect(
        tmp.path(),
        &newest,
        &name,
        &["digest mismatch", "length mismatch"],
    );
}

#[test]
fn channel_section_summaries_that_disagree_with_the_file_are_detected() {
    let (tmp, newest, _) = fixture();
    // A _metadata that is itself intact (its checksum resealed) but records one record more in
    // a section than the file holds: the file's size, digest and frame all match.
    let path = newest.join("_metadata");
    let mut meta =
        CheckpointMetadata::from_bytes("_metadata", &std::fs::read(&path).unwrap()).unwrap();
    let flight = meta
        .in_flight
        .iter_mut()
        .find(|f| !f.handle.sections.is_empty())
        .expect("in-flight data");
    flight.handle.sections[0].records += 1;
    let file = flight.handle.stream.path().unwrap().to_string();
    std::fs::write(&path, meta.to_bytes().unwrap()).unwrap();
    assert_both_detect(tmp.path(), &newest, &file, &["section", "records"]);
}
