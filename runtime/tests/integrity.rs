//! Files that cannot be mistaken: a state file or `_metadata` swapped in from another
//! checkpoint, job, subtask or operator passes its own checksums, and both `weir checkpoints
//! verify` and a restore must detect it, name it, and agree; the restore then falls back to the
//! previous complete checkpoint and the results stay exact. Also: a restore with other source
//! settings is refused, naming them.
#![cfg(feature = "cli")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "support/bounded.rs"]
mod bounded;
use bounded::BoundedCommand;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use weir_checkpoint::OpendalCheckpointStorage;
use weir_runtime::{JobError, JobResult, StorageConfig, StreamEnvironment};

const RECORDS: u64 = 120_000;
const KEYS: u64 = 50;
/// What `verify` says of a file replaced by another: its size or its digest differs.
const SUBSTITUTED: &[&str] = &["digest mismatch", "length mismatch"];

/// Runs generator → map → key_by → sum → latest_per_key at parallelism 2, checkpointing every
/// 10 ms into `root` (nothing inlined, all retained: the newest are taken after the sources
/// ended, the final one included, and hold no source state, and however fast the sources then
/// end, the checkpoints taken while they ran are still there), optionally restoring from `from`.
/// The map slows down until five checkpoints are complete, so there are checkpoints to swap.
async fn run(
    root: &Path,
    name: &str,
    seed: u64,
    incremental: bool,
    from: Option<&Path>,
) -> Result<(JobResult, BTreeMap<u64, i64>), JobError> {
    let storage = OpendalCheckpointStorage::fs(root)
        .unwrap()
        .with_inline_threshold(0);
    let env = StreamEnvironment::new();
    env.set_job_name(name)
        .set_parallelism(2)
        .enable_checkpointing(Duration::from_millis(10))
        .set_checkpoint_storage(StorageConfig::Custom(std::sync::Arc::new(storage)))
        .set_source_config("records", RECORDS)
        .set_source_config("seed", seed);
    env.config_mut().checkpoint.num_retained = 1000;
    env.config_mut().incremental = incremental;
    if let Some(from) = from {
        env.restore_from(from);
    }
    let seen = AtomicU64::new(0);
    let root_seen = root.to_path_buf();
    let totals = env
        .from_generator(Some(RECORDS), move |i| (i ^ seed) % KEYS)
        .uid("source")
        .map(move |k: u64| {
            let n = seen.fetch_add(1, Ordering::Relaxed);
            if n.is_multiple_of(500) && complete(&root_seen).len() < 5 {
                std::thread::sleep(Duration::from_millis(2));
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

/// The totals a failure-free run gives, computed without the engine.
fn expected(seed: u64) -> BTreeMap<u64, i64> {
    let mut t = BTreeMap::new();
    for i in 0..RECORDS {
        *t.entry((i ^ seed) % KEYS).or_insert(0) += 1;
    }
    t
}

/// The complete `chk-<n>` directories under a root, oldest first.
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

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// A finished job's checkpoint root, copied for one damage case.
struct Fixture {
    root: tempfile::TempDir,
}

impl Fixture {
    fn new(name: &str, seed: u64, incremental: bool) -> Fixture {
        let root = tempfile::tempdir().unwrap();
        let (_, totals) = runtime()
            .block_on(run(root.path(), name, seed, incremental, None))
            .unwrap();
        assert_eq!(
            totals,
            expected(seed),
            "the fixture run itself must be exact"
        );
        assert!(
            complete(root.path()).len() >= 2,
            "{:?}",
            complete(root.path())
        );
        Fixture { root }
    }

    fn copy(&self) -> tempfile::TempDir {
        let to = tempfile::tempdir().unwrap();
        copy_dir(self.root.path(), to.path());
        to
    }
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap().flatten() {
        let target = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &target);
        } else {
            std::fs::copy(e.path(), &target).unwrap();
        }
    }
}

/// The file in `dir` whose name starts with `v<vertex>-<subtask>-` and ends with `suffix`.
fn file(dir: &Path, vertex_subtask: &str, suffix: &str) -> PathBuf {
    let mut found: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            let n = p.file_name().unwrap().to_string_lossy().to_string();
            n.starts_with(&format!("v{vertex_subtask}-")) && n.ends_with(suffix)
        })
        .collect();
    found.sort();
    found
        .pop()
        .unwrap_or_else(|| panic!("no v{vertex_subtask}-*{suffix} in {}", dir.display()))
}

/// `weir checkpoints verify <chk>`: its exit code and output.
fn verify(chk: &Path) -> (Option<i32>, String) {
    let o = Command::new(env!("CARGO_BIN_EXE_weir"))
        .args(["checkpoints", "verify"])
        .arg(chk)
        .output_bounded()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    (o.status.code(), text)
}

/// Both verifiers on a damaged newest checkpoint: `verify` fails naming `victim` and one of
/// `why` (a file of another size fails its length check first, one of the same size its
/// digest), and a restore from the root falls back to the checkpoint before it, with exact
/// totals.
fn assert_detected(
    root: &Path,
    name: &str,
    seed: u64,
    incremental: bool,
    victim: &Path,
    why: &[&str],
) {
    let chks = complete(root);
    let (newest, previous) = (&chks[chks.len() - 1], &chks[chks.len() - 2]);
    let (code, out) = verify(newest);
    assert_eq!(
        code,
        Some(1),
        "verify must fail on the damaged checkpoint:\n{out}"
    );
    let victim_name = victim.file_name().unwrap().to_string_lossy().to_string();
    assert!(
        out.contains(&victim_name),
        "verify must name {victim_name}:\n{out}"
    );
    assert!(
        why.iter().any(|w| out.contains(w)),
        "verify must say one of {why:?}:\n{out}"
    );

    let (result, totals) = runtime()
        .block_on(run(root, name, seed, incremental, Some(root)))
        .unwrap();
    let restored = result.restored_from.expect("the run must restore");
    let prev_name = previous.file_name().unwrap().to_string_lossy().to_string();
    assert!(
        restored.ends_with(&prev_name),
        "the restore must fall back past {} to {prev_name}, got {restored}",
        newest.display()
    );
    assert!(
        result.source_records < RECORDS,
        "the restored run must resume, not start over: it emitted {}",
        result.source_records
    );
    assert_eq!(
        totals,
        expected(seed),
        "the restored run's totals must be exact"
    );
}

/// Copies `from` over `to` (a substitution that passes the file's own checksums).
fn substitute(from: &Path, to: &Path) {
    std::fs::copy(from, to).unwrap();
}

#[test]
fn a_keyed_file_from_the_previous_checkpoint_of_the_same_subtask_is_detected() {
    let fx = Fixture::new("integrity-same-job", 1, false);
    let root = fx.copy();
    let chks = complete(root.path());
    let (newest, previous) = (&chks[chks.len() - 1], &chks[chks.len() - 2]);
    // Vertex 1 is the keyed sum; its subtask 1's keyed file of the checkpoint before.
    let victim = file(newest, "1-1", "-keyed");
    substitute(&file(previous, "1-1", "-keyed"), &victim);
    assert_detected(
        root.path(),
        "integrity-same-job",
        1,
        false,
        &victim,
        SUBSTITUTED,
    );
}

#[test]
fn a_keyed_file_of_another_subtask_is_detected() {
    let fx = Fixture::new("integrity-subtask", 2, false);
    let root = fx.copy();
    let newest = complete(root.path()).pop().unwrap();
    let victim = file(&newest, "1-1", "-keyed");
    substitute(&file(&newest, "1-0", "-keyed"), &victim);
    assert_detected(
        root.path(),
        "integrity-subtask",
        2,
        false,
        &victim,
        SUBSTITUTED,
    );
}

#[test]
fn a_keyed_file_of_another_operator_is_detected() {
    let fx = Fixture::new("integrity-operator", 3, false);
    let root = fx.copy();
    let newest = complete(root.path()).pop().unwrap();
    // The sum (vertex 1) and the latest_per_key sink after its own key_by (vertex 2) both
    // keep keyed state: the sink's file of subtask 0 replaced by the sum's.
    let victim = file(&newest, "2-0", "-keyed");
    substitute(&file(&newest, "1-0", "-keyed"), &victim);
    assert_detected(
        root.path(),
        "integrity-operator",
        3,
        false,
        &victim,
        SUBSTITUTED,
    );
}

#[test]
fn a_keyed_file_of_another_job_is_detected() {
    let ours = Fixture::new("integrity-other-job", 4, false);
    let theirs = Fixture::new("integrity-other-job-b", 5, false);
    let root = ours.copy();
    let newest = complete(root.path()).pop().unwrap();
    let victim = file(&newest, "1-0", "-keyed");
    let foreign = complete(theirs.root.path()).pop().unwrap();
    substitute(&file(&foreign, "1-0", "-keyed"), &victim);
    assert_detected(
        root.path(),
        "integrity-other-job",
        4,
        false,
        &victim,
        SUBSTITUTED,
    );
}

#[test]
fn a_metadata_from_another_checkpoint_is_detected() {
    let fx = Fixture::new("integrity-metadata", 6, false);
    let root = fx.copy();
    let chks = complete(root.path());
    let (newest, previous) = (&chks[chks.len() - 1], &chks[chks.len() - 2]);
    let victim = newest.join("_metadata");
    substitute(&previous.join("_metadata"), &victim);
    assert_detected(
        root.path(),
        "integrity-metadata",
        6,
        false,
        &victim,
        &["but its directory is"],
    );
}

#[test]
fn an_operator_state_file_of_another_subtask_is_detected() {
    let fx = Fixture::new("integrity-op-state", 7, false);
    let root = fx.copy();
    // A checkpoint taken after a source subtask ended may hold no operator state for it: the
    // newest one with both subtasks' files becomes the newest (the later ones are removed).
    let chks = complete(root.path());
    let has_op = |chk: &Path, who: &str| {
        std::fs::read_dir(chk).unwrap().flatten().any(|e| {
            let n = e.file_name().to_string_lossy().to_string();
            n.starts_with(&format!("v{who}-")) && n.ends_with("-op")
        })
    };
    let at = (1..chks.len())
        .rev()
        .find(|&i| has_op(&chks[i], "0-0") && has_op(&chks[i], "0-1"))
        .expect("a checkpoint after the first with both sources' operator state");
    for later in &chks[at + 1..] {
        std::fs::remove_dir_all(later).unwrap();
    }
    let newest = chks[at].clone();
    // Vertex 0 is the source: its split offsets are operator state.
    let victim = file(&newest, "0-1", "-op");
    substitute(&file(&newest, "0-0", "-op"), &victim);
    assert_detected(
        root.path(),
        "integrity-op-state",
        7,
        false,
        &victim,
        SUBSTITUTED,
    );
}

/// A file whose handle in `_metadata` was rewritten to match it (size and digest): only the
/// identity frame can tell it apart. Both verifiers must still refuse it, by its identity.
#[test]
fn a_substitution_with_a_matching_handle_is_caught_by_the_identity_frame() {
    use weir_checkpoint::CheckpointMetadata;
    use weir_core::handle::StreamStateHandle;
    use weir_core::identity::Digest;
    let fx = Fixture::new("integrity-frame", 8, false);
    let root = fx.copy();
    let newest = complete(root.path()).pop().unwrap();
    let victim = file(&newest, "1-1", "-keyed");
    let donor = file(&newest, "1-0", "-keyed");
    let donor_bytes = std::fs::read(&donor).unwrap();
    std::fs::write(&victim, &donor_bytes).unwrap();
    // Rewrite the victim's handle as a forger would: same size and digest as the new bytes.
    let meta_path = newest.join("_metadata");
    let mut m =
        CheckpointMetadata::from_bytes("_metadata", &std::fs::read(&meta_path).unwrap()).unwrap();
    let victim_name = victim.file_name().unwrap().to_string_lossy().to_string();
    let mut rewritten = 0;
    let donor_name = donor.file_name().unwrap().to_string_lossy().to_string();
    let mut donor_layout = None;
    for op in &m.operators {
        for state in op.subtasks.values() {
            for h in &state.keyed {
                if h.stream.path() == Some(donor_name.as_str()) {
                    donor_layout = Some(h.clone());
                }
            }
        }
    }
    let donor_layout = donor_layout.expect("the donor's handle");
    for op in &mut m.operators {
        for state in op.subtasks.values_mut() {
            for h in &mut state.keyed {
                if h.stream.path() == Some(victim_name.as_str()) {
                    // The donor's layout, so its header and sections parse at their offsets.
                    h.header = donor_layout.header;
                    h.offsets = donor_layout.offsets.clone();
                    h.end = donor_layout.end;
                    h.stream = StreamStateHandle::File {
                        path: victim_name.clone(),
                        size: donor_bytes.len() as u64,
                        digest: Digest::of(&donor_bytes),
                    };
                    rewritten += 1;
                }
            }
        }
    }
    assert_eq!(rewritten, 1);
    std::fs::write(&meta_path, m.to_bytes().unwrap()).unwrap();
    assert_detected(
        root.path(),
        "integrity-frame",
        8,
        false,
        &victim,
        &["the file belongs elsewhere"],
    );
}

#[test]
fn an_incremental_delta_swapped_for_an_older_one_is_detected() {
    let fx = Fixture::new("integrity-incremental", 9, true);
    let root = fx.copy();
    let chks = complete(root.path());
    let newest = chks.last().unwrap();
    let shared = newest.parent().unwrap().join("shared");
    let id: u64 = newest
        .file_name()
        .unwrap()
        .to_string_lossy()
        .trim_start_matches("chk-")
        .parse()
        .unwrap();
    // The newest link of subtask 0 of the sum, and an older link of the same subtask.
    let mut links: Vec<(u64, PathBuf)> = std::fs::read_dir(&shared)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter_map(|p| {
            let n = p.file_name().unwrap().to_string_lossy().to_string();
            if !n.starts_with("v1-0-") || !n.ends_with("-keyed") {
                return None;
            }
            let c = n
                .rsplit_once("-c")?
                .1
                .trim_end_matches("-keyed")
                .parse()
                .ok()?;
            Some((c, p))
        })
        .collect();
    links.sort();
    let victim = links
        .iter()
        .find(|(c, _)| *c == id)
        .map(|(_, p)| p.clone())
        .expect("a link of the newest checkpoint");
    let older = links
        .iter()
        .filter(|(c, p)| *c < id && same_operator(p, &victim))
        .map(|(_, p)| p.clone())
        .next_back()
        .expect("an older link of the same operator and subtask");
    substitute(&older, &victim);
    assert_detected(
        root.path(),
        "integrity-incremental",
        9,
        true,
        &victim,
        SUBSTITUTED,
    );
}

/// Whether two shared link files are of the same operator and subtask
/// (`v<vertex>-<subtask>-g<generation>-<operator prefix>-c<id>-keyed`).
fn same_operator(a: &Path, b: &Path) -> bool {
    let key = |p: &Path| {
        let n = p.file_name().unwrap().to_string_lossy().to_string();
        let parts: Vec<String> = n.split('-').map(str::to_string).collect();
        (parts[0].clone(), parts[1].clone(), parts[3].clone())
    };
    key(a) == key(b)
}

#[test]
fn a_restore_with_other_source_settings_is_refused_naming_them() {
    let fx = Fixture::new("integrity-sources", 10, false);
    let root = fx.copy();
    let err = runtime()
        .block_on(run(
            root.path(),
            "integrity-sources",
            11,
            false,
            Some(root.path()),
        ))
        .expect_err("a restore with another seed must be refused");
    let text = err.to_string();
    assert!(
        text.contains("source setting 'seed' is 10 in the checkpoint and 11 in the job"),
        "{text}"
    );
    assert!(text.contains("--allow-changed-sources"), "{text}");
}
