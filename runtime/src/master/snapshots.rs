//! What the job master writes and names: where a snapshot goes (a client's savepoint
//! directory), the `_metadata` of a completed checkpoint, the discard of unreferenced shared
//! files, and the job's id and lock holder.

use crate::config::{JobConfig, StorageConfig, build_storage};
use crate::error::JobError;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;
use tokio::sync::oneshot;
use tracing::{debug, warn};
use weir_checkpoint::coordinator::TaskKey;
use weir_checkpoint::metadata::SubtaskInFlight;
use weir_checkpoint::storage::CheckpointLocation;
use weir_checkpoint::store::CompletedCheckpoint;
use weir_checkpoint::{CheckpointMetadata, CheckpointStorage, OperatorState};
use weir_core::element::SnapshotKind;
use weir_core::fingerprint::JobFingerprint;
use weir_core::graph::JobGraph;
use weir_core::handle::{StreamStateHandle, TaskStateSnapshot};
use weir_core::ids::{CheckpointId, JobId, OperatorId};

/// Where a snapshot the client asked for goes, and whom to answer.
pub(crate) struct Target {
    pub kind: SnapshotKind,
    pub drain: bool,
    pub storage: Arc<dyn CheckpointStorage>,
    /// Where other processes find `storage` (see [`StorageConfig::location`]).
    pub root: Option<String>,
    pub location: CheckpointLocation,
    pub reply: Option<oneshot::Sender<Result<String, String>>>,
}

/// How often the record-count trigger looks at the sources' progress.
pub(crate) const RECORDS_POLL: Duration = Duration::from_millis(2);

/// A savepoint's storage, where other processes find it, and its directory.
pub(crate) type SavepointTarget = (
    Arc<dyn CheckpointStorage>,
    Option<String>,
    CheckpointLocation,
);

/// A new savepoint directory `savepoint-<job-id prefix>-<random>/` under `dir` (or the configured
/// savepoint directory). The random part hashes the clock, the whole job id and `id`, the
/// checkpoint id the savepoint is about to get: two savepoints in the same clock tick (a
/// simulation's clock ticks in milliseconds) or of two jobs with one prefix never share a
/// directory (found by the deterministic simulation, seed 15611, where they overwrote each
/// other's files).
pub(crate) fn savepoint_target(
    config: &JobConfig,
    dir: Option<PathBuf>,
    job_id: JobId,
    id: u64,
) -> Result<SavepointTarget, String> {
    let dir = dir
        .or_else(|| config.savepoint_dir.clone())
        .ok_or("no savepoint directory: give one, or set the job's savepoint directory")?;
    // A directory, or `s3://bucket/prefix`.
    let target = match dir.to_str() {
        Some(location) => StorageConfig::from_location(location).map_err(|e| e.to_string())?,
        None => StorageConfig::Filesystem(dir.clone()),
    };
    let root = target.location();
    let storage = build_storage(&target).map_err(|e| e.to_string())?;
    let nonce = weir_core::sim::wall_clock().as_nanos() as u64;
    let mut seed = nonce.to_le_bytes().to_vec();
    seed.extend_from_slice(&job_id.0.to_le_bytes());
    seed.extend_from_slice(&id.to_le_bytes());
    let name = format!(
        "savepoint-{}-{:012x}",
        &job_id.to_string()[..6],
        weir_core::ids::stable_hash128(&seed) as u64 & 0xffff_ffff_ffff
    );
    Ok((
        storage,
        root,
        CheckpointLocation {
            dir: format!("{name}/"),
        },
    ))
}

/// How long a failure that only echoes another waits for the root cause to be reported.
pub(crate) const ROOT_CAUSE_WAIT: Duration = Duration::from_millis(50);
/// How long teardown waits for `_metadata` writes in flight.
pub(crate) const FINALIZE_WAIT: Duration = Duration::from_secs(10);

/// How one generation of the job ended.
pub(crate) enum Outcome {
    Finished,
    Canceled,
    Failed(String),
    /// Ends the job without a restart (its job directory was taken over).
    Fatal(JobError),
}

/// A `_metadata` write finished.
pub(crate) struct Finalized {
    pub generation: u64,
    pub id: CheckpointId,
    pub result: Result<CompletedCheckpoint, String>,
}

/// Deletes shared state files no checkpoint references any more, beside the job (awaited
/// before the job returns, with the other discards).
pub(crate) fn discard_shared(
    discards: &mut tokio::task::JoinSet<()>,
    storage: &Arc<dyn CheckpointStorage>,
    job_id: JobId,
    files: Vec<StreamStateHandle>,
) {
    if files.is_empty() {
        return;
    }
    let storage = storage.clone();
    discards.spawn(async move { discard_shared_now(&storage, job_id, files).await });
}

/// Deletes shared state files no checkpoint references any more, now.
pub(crate) async fn discard_shared_now(
    storage: &Arc<dyn CheckpointStorage>,
    job_id: JobId,
    files: Vec<StreamStateHandle>,
) {
    // Shared paths are relative to any checkpoint location of the job (`../shared/<name>`).
    let location = CheckpointLocation::for_checkpoint(job_id, CheckpointId(0));
    for file in files {
        match storage.discard_state(&location, &file).await {
            Ok(()) => debug!(?file, "deleted an unreferenced shared state file"),
            Err(e) => warn!(error = %e, "cannot delete an unreferenced shared state file"),
        }
    }
}

/// Wall-clock time in ms since the Unix epoch.
pub(crate) fn wall_ms() -> u64 {
    weir_core::sim::wall_clock().as_millis() as u64
}

/// The `_metadata` of checkpoint `id` from its acknowledgements.
pub(crate) fn build_metadata(
    (job, fingerprint): (&JobGraph, &JobFingerprint),
    job_id: JobId,
    id: CheckpointId,
    kind: SnapshotKind,
    trigger_timestamp_ms: u64,
    acks: &BTreeMap<TaskKey, TaskStateSnapshot>,
    coordinators: &BTreeMap<OperatorId, Vec<u8>>,
) -> CheckpointMetadata {
    let operators = job
        .stream_graph
        .nodes
        .iter()
        .map(|n| {
            let vertex = job.vertex_of[n.id.0 as usize];
            let subtasks = acks
                .iter()
                .filter(|(k, _)| k.vertex == vertex)
                .filter_map(|(k, s)| {
                    s.operators
                        .get(&n.operator_id)
                        .map(|st| (k.subtask, st.clone()))
                })
                .collect();
            OperatorState {
                operator_id: n.operator_id,
                uid: n.uid.clone(),
                name: n.name.clone(),
                parallelism: n.parallelism,
                max_parallelism: n.max_parallelism,
                subtasks,
                coordinator_state: coordinators.get(&n.operator_id).cloned(),
            }
        })
        .collect();
    CheckpointMetadata {
        job_id,
        job_name: job.job_name.clone(),
        checkpoint_id: id,
        kind,
        trigger_timestamp_ms,
        completion_timestamp_ms: wall_ms(),
        weir_version: env!("CARGO_PKG_VERSION").to_string(),
        operators,
        in_flight: acks
            .iter()
            .filter_map(|(k, s)| {
                let handle = s.in_flight.clone()?;
                let head = job.vertices.iter().find(|v| v.id == k.vertex)?.head();
                Some(SubtaskInFlight {
                    operator_id: job.stream_graph.node(head).operator_id,
                    subtask: k.subtask,
                    handle,
                })
            })
            .collect(),
        fingerprint: Some(fingerprint.clone()),
        // The master sets the job's tuning, if any.
        tuning: None,
        format_version: weir_checkpoint::metadata::METADATA_VERSION,
    }
}

/// A fresh id for one run of a job, as every Flink submission gets a new `JobID`: its name, the
/// wall clock, the process and a counter, hashed.
pub(crate) fn fresh_job_id(name: &str) -> JobId {
    static RUNS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let nanos = weir_core::sim::wall_clock().as_nanos();
    if weir_core::sim::active() {
        // A simulation replays bit for bit: its clock alone names the run.
        return JobId(weir_core::ids::stable_hash128(
            format!("{name}\0{nanos}").as_bytes(),
        ));
    }
    let run = RUNS.fetch_add(1, Ordering::Relaxed);
    let seed = format!("{name}\0{nanos}\0{}\0{run}", std::process::id());
    JobId(weir_core::ids::stable_hash128(seed.as_bytes()))
}

/// What a job directory's lock says of its holder.
pub(crate) fn lock_holder() -> String {
    let host = std::env::var("HOSTNAME").unwrap_or_else(|_| "this host".to_string());
    format!(
        "process {} on {host}, since {} ms after the Unix epoch",
        std::process::id(),
        wall_ms()
    )
}
