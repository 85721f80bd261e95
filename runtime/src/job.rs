//! The job master: deploys every subtask, runs the checkpoint coordinator's decisions (trigger,
//! finalize, notify, discard), and handles failures through the restart strategy, redeploying
//! all tasks from the latest completed checkpoint.

use crate::claim::Claim;
use crate::cluster::ClusterRole;
use crate::cluster::jobmaster::{DeployCommon, RemoteGateway};
use crate::cluster::taskexecutor::graph_fingerprint;
use crate::config::ClaimMode;
use crate::config::{JobConfig, StorageConfig, build_storage};
use crate::error::JobError;
use crate::gateway::{ProcessTasks, TEARDOWN_WAIT, TaskDeployment, TaskRuntime, TaskSettings};
use crate::host::Gateway;
use crate::lease::{LeaseKeeper, LockContent};
use crate::restart::RestartTracker;
use crate::restore::{RestoreChecks, candidates_at, load_first_good, one_jobs_candidates};
use crate::source::{SplitAssignment, SplitEnumerator};
use crate::spec::{JobResult, JobSpec, JobStatus};
use crate::task::{JobMetrics, Targets, TaskEvent, TaskMessage, TaskReport};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio::sync::{Notify, mpsc, oneshot};
use tracing::{Instrument, debug, info, info_span, warn};
use weir_checkpoint::coordinator::{
    CheckpointCoordinator, CheckpointFailureReason, CheckpointStats, CheckpointStatus,
    CoordinatorAction, CoordinatorSetup, TaskKey,
};
use weir_checkpoint::metadata::SubtaskInFlight;
use weir_checkpoint::shared::SharedStateRegistry;
use weir_checkpoint::storage::CheckpointLocation;
use weir_checkpoint::store::{CompletedCheckpoint, CompletedCheckpointStore};
use weir_checkpoint::{
    CheckpointMetadata, CheckpointStorage, OpendalCheckpointStorage, OperatorState,
};
use weir_core::config::ExternalizedRetention;
use weir_core::element::{CheckpointBarrier, SnapshotKind};
use weir_core::fingerprint::JobFingerprint;
use weir_core::graph::{ExecutionGraph, ExecutionState, JobGraph};
use weir_core::handle::{StreamStateHandle, TaskStateSnapshot};
use weir_core::ids::{CheckpointId, JobId, OperatorId, VertexId};
use weir_network::{ChannelConfig, LocalTransport, Transport};

/// Talks to a running job: cancel it, trigger a checkpoint or a savepoint, stop it with a
/// savepoint. Make one before `execute_with`, and use clones of it from other tasks.
#[derive(Clone)]
pub struct JobClient {
    inner: Arc<ClientInner>,
}

/// The earlier name of [`JobClient`], for code that only cancels.
pub type JobCanceller = JobClient;

struct ClientInner {
    cancelled: AtomicBool,
    notify: Notify,
    commands: mpsc::Sender<Command>,
    receiver: std::sync::Mutex<Option<mpsc::Receiver<Command>>>,
    source_records: Arc<AtomicU64>,
    /// The statistics of the last checkpoints, as the master last published them.
    stats: std::sync::Mutex<Vec<CheckpointStats>>,
    /// The last refused trigger requests: time since the job started, and the reason.
    refusals: std::sync::Mutex<Vec<(Duration, String)>>,
}

impl std::fmt::Debug for JobClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JobClient")
            .field("cancelled", &self.inner.cancelled.load(Ordering::SeqCst))
            .finish()
    }
}

impl Default for JobClient {
    fn default() -> Self {
        let (commands, receiver) = mpsc::channel(16);
        JobClient {
            inner: Arc::new(ClientInner {
                cancelled: AtomicBool::new(false),
                notify: Notify::new(),
                commands,
                receiver: std::sync::Mutex::new(Some(receiver)),
                source_records: Arc::new(AtomicU64::new(0)),
                stats: std::sync::Mutex::new(Vec::new()),
                refusals: std::sync::Mutex::new(Vec::new()),
            }),
        }
    }
}

/// A request from a [`JobClient`] to the job master.
pub(crate) enum Command {
    Snapshot {
        kind: SnapshotKind,
        dir: Option<PathBuf>,
        drain: bool,
        reply: oneshot::Sender<Result<String, String>>,
    },
}

impl JobClient {
    /// Requests cancellation.
    pub fn cancel(&self) {
        self.inner.cancelled.store(true, Ordering::SeqCst);
        self.inner.notify.notify_waiters();
    }

    async fn cancelled(&self) {
        loop {
            let notified = self.inner.notify.notified();
            if self.inner.cancelled.load(Ordering::SeqCst) {
                return;
            }
            notified.await;
        }
    }

    /// Records the sources emitted since this job started (replays after a failover included;
    /// records covered by a checkpoint the job was restored from are not).
    pub fn source_records(&self) -> u64 {
        self.inner.source_records.load(Ordering::Relaxed)
    }

    async fn snapshot(
        &self,
        kind: SnapshotKind,
        dir: Option<PathBuf>,
        drain: bool,
    ) -> Result<String, JobError> {
        let (reply, answer) = oneshot::channel();
        self.inner
            .commands
            .send(Command::Snapshot {
                kind,
                dir,
                drain,
                reply,
            })
            .await
            .map_err(|_| JobError::Snapshot("the job is not running".into()))?;
        answer
            .await
            .map_err(|_| JobError::Snapshot("the job ended before the snapshot completed".into()))?
            .map_err(JobError::Snapshot)
    }

    /// Triggers a checkpoint now; returns its path once complete.
    pub async fn trigger_checkpoint(&self) -> Result<String, JobError> {
        self.snapshot(SnapshotKind::Checkpoint, None, false).await
    }

    /// Takes a savepoint (aligned, self-contained) into a new directory under `dir` (or the
    /// configured savepoint directory); returns its path once complete.
    pub async fn trigger_savepoint(&self, dir: Option<PathBuf>) -> Result<String, JobError> {
        self.snapshot(SnapshotKind::Savepoint, dir, false).await
    }

    /// Stops the job with a savepoint (Flink's stop-with-savepoint): the sources stop right after
    /// the barrier, so nothing is processed after the snapshot, and the job ends FINISHED with
    /// the savepoint's path. With `drain`, event time first advances to the end and the operators
    /// flush, as at the end of input. If the savepoint fails, the job goes on.
    pub async fn stop_with_savepoint(
        &self,
        dir: Option<PathBuf>,
        drain: bool,
    ) -> Result<String, JobError> {
        self.snapshot(SnapshotKind::SynchronousSavepoint, dir, drain)
            .await
    }

    /// The statistics of the job's last checkpoints and savepoints (in progress, completed and
    /// failed, with reasons), oldest first, as of the last change.
    pub fn checkpoint_stats(&self) -> Vec<CheckpointStats> {
        self.inner
            .stats
            .lock()
            .map(|s| s.clone())
            .unwrap_or_default()
    }

    /// The last trigger requests that were refused (periodic, by record count or on demand),
    /// with when (since the job started) and why: too many in progress, the min pause, tasks not
    /// running.
    pub fn trigger_refusals(&self) -> Vec<(Duration, String)> {
        self.inner
            .refusals
            .lock()
            .map(|s| s.clone())
            .unwrap_or_default()
    }

    fn publish_stats(&self, coordinator: &CheckpointCoordinator) {
        if let Ok(mut s) = self.inner.stats.lock() {
            *s = coordinator.history().cloned().collect();
        }
        if let Ok(mut r) = self.inner.refusals.lock() {
            *r = coordinator
                .refusals()
                .map(|(t, why)| (*t, why.to_string()))
                .collect();
        }
    }

    fn take_commands(&self) -> Option<mpsc::Receiver<Command>> {
        self.inner.receiver.lock().ok().and_then(|mut r| r.take())
    }
}

/// Where a snapshot the client asked for goes, and whom to answer.
struct Target {
    kind: SnapshotKind,
    drain: bool,
    storage: Arc<dyn CheckpointStorage>,
    /// Where other processes find `storage` (see [`StorageConfig::location`]).
    root: Option<String>,
    location: CheckpointLocation,
    reply: Option<oneshot::Sender<Result<String, String>>>,
}

/// How often the record-count trigger looks at the sources' progress.
const RECORDS_POLL: Duration = Duration::from_millis(2);

/// A savepoint's storage, where other processes find it, and its directory.
type SavepointTarget = (
    Arc<dyn CheckpointStorage>,
    Option<String>,
    CheckpointLocation,
);

/// A new savepoint directory `savepoint-<job-id prefix>-<random>/` under `dir` (or the configured
/// savepoint directory).
fn savepoint_target(
    config: &JobConfig,
    dir: Option<PathBuf>,
    job_id: JobId,
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
    let nonce = std::time::SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    let name = format!(
        "savepoint-{}-{:012x}",
        &job_id.to_string()[..6],
        weir_core::ids::stable_hash128(&nonce.to_le_bytes()) as u64 & 0xffff_ffff_ffff
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
const ROOT_CAUSE_WAIT: Duration = Duration::from_millis(50);
/// How long teardown waits for `_metadata` writes in flight.
const FINALIZE_WAIT: Duration = Duration::from_secs(10);

enum Outcome {
    Finished,
    Canceled,
    Failed(String),
    /// Ends the job without a restart (its job directory was taken over).
    Fatal(JobError),
}

struct Finalized {
    generation: u64,
    id: CheckpointId,
    result: Result<CompletedCheckpoint, String>,
}

/// Deletes shared state files no checkpoint references any more, beside the job (awaited
/// before the job returns, with the other discards).
fn discard_shared(
    discards: &mut tokio::task::JoinSet<()>,
    storage: &Arc<dyn CheckpointStorage>,
    job_id: JobId,
    files: Vec<StreamStateHandle>,
) {
    if files.is_empty() {
        return;
    }
    let storage = storage.clone();
    // Shared paths are relative to any checkpoint location of the job (`../shared/<name>`).
    let location = CheckpointLocation::for_checkpoint(job_id, CheckpointId(0));
    discards.spawn(async move {
        for file in files {
            match storage.discard_state(&location, &file).await {
                Ok(()) => debug!(?file, "deleted an unreferenced shared state file"),
                Err(e) => warn!(error = %e, "cannot delete an unreferenced shared state file"),
            }
        }
    });
}

fn wall_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

fn build_metadata(
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
        format_version: weir_checkpoint::metadata::METADATA_VERSION,
    }
}

/// Runs a job to its end.
pub(crate) async fn run_job(spec: JobSpec, canceller: JobClient) -> Result<JobResult, JobError> {
    let started = Instant::now();
    let epoch_wall_ms = wall_ms();
    let job_id = spec
        .config
        .job_id
        .unwrap_or_else(|| fresh_job_id(&spec.config.job_name));
    let span = info_span!("job", name = %spec.config.job_name, id = %job_id);
    async move {
        let config = &spec.config;
        let job = &spec.job;
        let fingerprint = JobFingerprint::of(&job.stream_graph, &config.source_config);
        config.validate()?;
        // Without checkpointing nothing is written: do not create the checkpoint directory.
        let storage = if config.checkpoint.is_enabled() {
            build_storage(&config.storage)?
        } else {
            Arc::new(OpendalCheckpointStorage::memory()?) as Arc<dyn CheckpointStorage>
        };
        let lock_content = LockContent {
            holder: lock_holder(),
            lease: config.job_lock_lease,
            renewal: 0,
        };
        // The lease on the job directory (and on those a claim takes over), renewed beside the job.
        let mut keeper: Option<LeaseKeeper> = None;
        // The generation of the lock this run holds on its own job directory.
        let mut own_generation = 0u64;
        if config.checkpoint.is_enabled() {
            storage.check_writable().await?;
            // One writer per job directory: a second run with this job id is refused while the
            // first holds it (renews its lease); a killed run's directory is taken over.
            let generation = crate::lease::take_job_directory(&*storage, job_id, &lock_content).await?;
            own_generation = generation;
            let k = LeaseKeeper::start(lock_content.clone());
            k.hold(storage.clone(), job_id, generation).await;
            keeper = Some(k);
        }
        let mut claim: Option<Claim> = None;
        // A custom storage object is reached by locations under its root.
        let custom = match &config.storage {
            StorageConfig::Custom(s) => Some(s),
            _ => None,
        };
        let mut restore: Option<(Arc<dyn CheckpointStorage>, Vec<CheckpointLocation>)> =
            match &config.restore_from {
                Some(path) => {
                    let (s, listings) = candidates_at(path, custom).await?;
                    let locations = one_jobs_candidates(&*s, path, listings).await?;
                    if config.claim_mode == ClaimMode::Claim
                        && let Some(k) = &keeper
                    {
                        let (c, taken) = Claim::start(s.clone(), &locations, job_id, &lock_content).await?;
                        for (job, generation) in taken {
                            k.hold(s.clone(), job, generation).await;
                        }
                        claim = Some(c);
                        // Watching the leases took a while: a running job's retention may have
                        // deleted what was listed, and new checkpoints may exist. List again.
                        let (s, listings) = candidates_at(path, custom).await?;
                        let locations = one_jobs_candidates(&*s, path, listings).await?;
                        Some((s, locations))
                    } else {
                        Some((s, locations))
                    }
                }
                None => None,
            };
        let own: Arc<dyn Transport> = Arc::new(LocalTransport::new(ChannelConfig {
            buffers_per_channel: config.buffers_per_channel,
        }));
        let transport = match &config.transport {
            Some(layer) => layer.apply(own),
            None => own,
        };
        let metrics = Arc::new(JobMetrics {
            source_records: canceller.inner.source_records.clone(),
            ..JobMetrics::default()
        });
        let settings = TaskSettings {
            batch_size: config.batch_size,
            mode: config.checkpoint.mode,
            snapshot_compression: config.snapshot_compression,
            incremental: config.incremental.then_some(config.incremental_max_chain),
            state_backend: config.state_backend.name(),
        };
        // Where task managers find the checkpoint storage.
        let storage_root = if config.checkpoint.is_enabled() { config.storage.location() } else { None };
        let mut gateway = match &config.cluster {
            Some(ClusterRole::JobManager(options)) => {
                if config.checkpoint.is_enabled() && storage_root.is_none() {
                    return Err(JobError::Invalid(format!(
                        "cluster mode needs checkpoint storage every process reaches (a directory or s3://bucket/prefix), not {:?}",
                        config.storage
                    )));
                }
                let remote = RemoteGateway::start(options, graph_fingerprint(job), metrics.clone(), started, spec.results.clone()).await?;
                info!(addr = %remote.local_addr(), "job manager listening");
                Gateway::Remote(Box::new(remote))
            }
            _ => Gateway::Local(None),
        };
        // Subtasks in this process run on their own runtime, so that a stuck one cannot keep
        // the master from giving up on it when the job is cancelled.
        let task_runtime = match &gateway {
            Gateway::Local(_) => Some(TaskRuntime::new()?),
            Gateway::Remote(_) => None,
        };
        // The job runs in here, so that task managers hear of its end however it ends.
        let result: Result<JobResult, JobError> = async {
        let mut commands = canceller.take_commands();
        let targets: Arc<Targets> = Arc::new(Targets::default());
        let mut stopped_with: Option<String> = None;
        let mut refused = 0u64;
        let mut store = CompletedCheckpointStore::new(config.checkpoint.num_retained);
        // Which pending and retained checkpoints reference each shared (incremental) file.
        let mut registry = SharedStateRegistry::new();
        // Raised when a delta on deleted files is refused: the tasks start new chains.
        let chain_epoch = Arc::new(AtomicU64::new(0));
        let mut restart = RestartTracker::new(config.restart_strategy());
        let mut execution = ExecutionGraph::new(job);
        // Ids continue past every checkpoint already in this job's directory (a rerun of the same
        // job, or a restore that fell back past newer, corrupt ones), so no chk-<n> is reused.
        let mut next_checkpoint_id = 1u64;
        if config.checkpoint.is_enabled() {
            // Unknown ids could overwrite an earlier run's checkpoints: the listing is retried,
            // and if it keeps failing the start fails, as for an unwritable storage.
            let mut attempt = 0;
            let existing = loop {
                match storage.list_checkpoints(job_id).await {
                    Ok(existing) => break existing,
                    Err(e) if attempt < 3 => {
                        attempt += 1;
                        warn!(error = %e, attempt, "cannot list earlier checkpoints; retrying");
                        tokio::time::sleep(Duration::from_millis(10 << attempt)).await;
                    }
                    Err(e) => return Err(e.into()),
                }
            };
            if let Some(last) = existing.last() {
                next_checkpoint_id = last.id.0 + 1;
            }
        }
        let mut generation = 0u64;
        let mut first_running: Option<Duration> = None;
        let mut restored_from = None;
        // The sources' count when the latest restore was deployed.
        let mut since_restore_base = 0u64;
        let mut completed = 0u64;
        let mut failed = 0u64;
        let mut durations = Vec::new();
        let mut in_flight = Vec::new();
        let mut history: Vec<CheckpointStats> = Vec::new();
        let mut failures: Vec<(u64, Duration)> = Vec::new();
        let sources: Vec<TaskKey> = job
            .vertices
            .iter()
            .filter(|v| v.is_source)
            .flat_map(|v| (0..v.parallelism).map(move |i| TaskKey { vertex: v.id, subtask: i }))
            .collect();
        let all: Vec<TaskKey> = job
            .vertices
            .iter()
            .flat_map(|v| (0..v.parallelism).map(move |i| TaskKey { vertex: v.id, subtask: i }))
            .collect();
        let (finalize_tx, mut finalize_rx) = mpsc::channel::<Finalized>(64);
        // Discards of subsumed or aborted checkpoints run beside the job; they are awaited
        // before it returns, so a process that exits right after leaves nothing behind.
        let mut discards: tokio::task::JoinSet<()> = tokio::task::JoinSet::new();

        loop {
            generation += 1;
            transport.release_before(generation);
            let mut restored_meta: Option<CheckpointMetadata> = None;
            let mut contexts = match &restore {
                Some((s, locations)) => {
                    let checks = RestoreChecks {
                        fingerprint: &fingerprint,
                        allow_non_restored_state: config.allow_non_restored_state,
                        allow_changed_sources: config.allow_changed_sources,
                    };
                    let loaded = load_first_good(s.clone(), locations, job, &checks).await;
                    let (point, contexts) = match loaded {
                        Ok(found) => found,
                        // During a failover, a restore that fails (a transient storage error) is one
                        // more failure for the restart strategy; at job start it is the user's.
                        Err(e) if generation > 1 && !matches!(e, JobError::Restore { .. }) => {
                            let Some(delay) = restart.on_failure(started.elapsed()) else {
                                return Err(JobError::Failed {
                                    restarts: restart.restarts(),
                                    strategy: config.restart_strategy().describe(),
                                    cause: format!("restoring failed: {e}"),
                                });
                            };
                            warn!(error = %e, ?delay, "restoring failed; restarting again");
                            tokio::time::sleep(delay).await;
                            continue;
                        }
                        Err(e) => return Err(e),
                    };
                    next_checkpoint_id = next_checkpoint_id.max(point.metadata.checkpoint_id.0 + 1);
                    restored_meta = Some(point.metadata.clone());
                    // `cargo xtask mutants`: a restore that loads nothing, to show the tests fail.
                    #[cfg(weir_mutant = "restore_noop")]
                    let contexts: HashMap<_, _> = {
                        let mut contexts = contexts;
                        contexts.clear();
                        restored_meta = None;
                        contexts
                    };
                    info!(checkpoint = %point.describe(), "restoring");
                    since_restore_base = metrics.source_records.load(Ordering::Relaxed);
                    if restored_from.is_none() {
                        restored_from = Some(point.describe());
                        if let (Some(c), Some(k)) = (claim.as_mut(), keeper.as_ref()) {
                            c.restored(&point.location, k).await;
                        }
                    }
                    contexts
                }
                None => HashMap::new(),
            };
            let mut coordinator = CheckpointCoordinator::new(CoordinatorSetup {
                config: config.checkpoint.clone(),
                tasks_to_trigger: sources.clone(),
                tasks_to_wait_for: all.clone(),
                next_checkpoint_id,
                epoch_wall_ms,
            });
            // The operator coordinators: each source's split enumerator, fresh or restored.
            let mut enumerators: HashMap<VertexId, (OperatorId, Box<dyn SplitEnumerator>)> = HashMap::new();
            for (node, factory) in &spec.enumerators {
                let n = job.stream_graph.node(*node);
                let mut e = factory(n.parallelism);
                if let Some(meta) = &restored_meta
                    && let Some(op) = meta.operators.iter().find(|o| o.operator_id == n.operator_id)
                {
                    e.restore(op.coordinator_state.as_deref())
                        .map_err(|err| JobError::Restore { path: format!("checkpoint {}", meta.checkpoint_id), reason: format!("the split enumerator of '{}': {err}", n.name) })?;
                }
                enumerators.insert(job.vertex_of[node.0 as usize], (n.operator_id, e));
            }
            let mut coordinator_states: HashMap<CheckpointId, BTreeMap<OperatorId, Vec<u8>>> = HashMap::new();
            // Deploy every subtask of this generation.
            let (report_tx, mut report_rx) = mpsc::unbounded_channel::<TaskReport>();
            let mut deployments = Vec::new();
            for v in &job.vertices {
                for i in 0..v.parallelism {
                    let ev = execution.get_mut(v.id, i);
                    ev.state = ExecutionState::Deploying;
                    deployments.push(TaskDeployment {
                        task: TaskKey { vertex: v.id, subtask: i },
                        attempt: ev.attempt.0,
                        restore: contexts.remove(&(v.id, i)).unwrap_or_default(),
                    });
                }
            }
            match &mut gateway {
                Gateway::Local(running) => {
                    let tasks = ProcessTasks {
                        spec: &spec,
                        settings: &settings,
                        transport: transport.as_ref(),
                        job_id,
                        storage: storage.clone(),
                        started,
                        metrics: metrics.clone(),
                        targets: targets.clone(),
                        chain_epoch: chain_epoch.clone(),
                        runtime: match &task_runtime {
                            Some(r) => r.handle().clone(),
                            None => tokio::runtime::Handle::current(),
                        },
                    };
                    *running = Some(tasks.spawn(generation, deployments, &report_tx)?);
                }
                Gateway::Remote(remote) => {
                    let common = DeployCommon {
                        job_id,
                        graph_fingerprint: graph_fingerprint(job),
                        settings: settings.clone(),
                        storage: storage_root.clone(),
                        chain_epoch: chain_epoch.load(Ordering::Acquire),
                    };
                    match remote.deploy(generation, job, common, deployments, report_tx.clone()).await {
                        Ok(()) => {}
                        // Too few slots within the slot timeout (a task manager lost with no
                        // replacement): like Flink's NoResourceAvailableException, a failure for
                        // the restart strategy, which deploys again once its delay passed.
                        Err(JobError::NoResources(why)) => {
                            let Some(delay) = restart.on_failure(started.elapsed()) else {
                                return Err(JobError::Failed {
                                    restarts: restart.restarts(),
                                    strategy: config.restart_strategy().describe(),
                                    cause: format!("not enough resources: {why} (the slot timeout)"),
                                });
                            };
                            warn!(%why, ?delay, restart = restart.restarts(), "not enough slots; deploying again");
                            execution.restart_all();
                            if !delay.is_zero() {
                                tokio::time::sleep(delay).await;
                            }
                            continue;
                        }
                        Err(e) => return Err(e),
                    }
                }
            }
            drop(report_tx);
            // One span per checkpoint, from trigger to completion or abort.
            let mut spans: HashMap<CheckpointId, tracing::Span> = HashMap::new();
            // Checkpoints whose `_metadata` write is in flight: never discarded under it.
            let mut finalizing: BTreeSet<CheckpointId> = BTreeSet::new();
            // A failure that is only the echo of another (an upstream gone, a consumer gone):
            // wait briefly for the root cause before failing with it.
            let mut echo: Option<(String, Instant)> = None;
            let mut requested: HashMap<CheckpointId, Target> = HashMap::new();
            let records_base = metrics.source_records.load(Ordering::Relaxed);
            let mut records_poll = config
                .checkpoint
                .every_records
                .map(|_| tokio::time::interval(RECORDS_POLL));
            let mut running = BTreeSet::new();
            let mut finished = BTreeSet::new();
            let mut actions = Vec::new();
            let outcome = loop {
                let now = started.elapsed();
                let wake = coordinator.next_wakeup();
                tokio::select! {
                    report = report_rx.recv() => {
                        let Some(report) = report else {
                            break Outcome::Failed("every task ended without reporting".into());
                        };
                        if report.generation != generation {
                            // An earlier attempt's upload finished after its failure: the
                            // shared files it wrote are referenced by no checkpoint.
                            if let TaskEvent::Acknowledge { state, .. } = &report.event {
                                discard_shared(&mut discards, &storage, job_id, registry.unreferenced_in(state));
                            }
                            continue;
                        }
                        let task = report.task;
                        match report.event {
                            TaskEvent::Running => {
                                execution.get_mut(task.vertex, task.subtask).state = ExecutionState::Running;
                                coordinator.task_running(task);
                                running.insert(task);
                                if running.len() == all.len() {
                                    info!(generation, "job RUNNING");
                                    first_running.get_or_insert(started.elapsed());
                                    coordinator.job_status_changed(true, now, &mut actions);
                                }
                            }
                            TaskEvent::Acknowledge { id, state, metrics } => {
                                // `cargo xtask mutants`: subtask 0's keyed state handles are
                                // dropped from every acknowledgement, to show the tests fail.
                                #[cfg(weir_mutant = "drop_handle")]
                                let state = {
                                    let mut state = state;
                                    if task.subtask == 0 {
                                        state.operators.values_mut().for_each(|o| o.keyed.clear());
                                    }
                                    state
                                };
                                if let Some(span) = spans.get(&id) {
                                    span.in_scope(|| debug!(%task, sync = ?metrics.sync_duration, async_ = ?metrics.async_duration, alignment = ?metrics.alignment, size = metrics.state_size, "acknowledged"));
                                }
                                // Registered before the coordinator takes it: the checkpoint's
                                // shared files stay while it is pending or retained.
                                let live = coordinator.pending_ids().contains(&id);
                                if let Err(unknown) = registry.register(id, &state) {
                                    // A delta on a checkpoint whose files are gone (subsumed while
                                    // the task still built on it): it must not complete. The abort
                                    // makes the tasks start new chains.
                                    let reason = format!(
                                        "it references shared state files no checkpoint holds any more: {}",
                                        unknown.join(", ")
                                    );
                                    if let Some(span) = spans.get(&id) {
                                        span.in_scope(|| warn!(%task, %reason, "acknowledgement refused"));
                                    }
                                    gateway.raise_chain_epoch(&chain_epoch);
                                    coordinator.decline(task, id, CheckpointFailureReason::Declined { task, reason }, now, &mut actions);
                                } else {
                                    coordinator.acknowledge(task, id, state, metrics, now, &mut actions);
                                }
                                if !live {
                                    // A late acknowledgement of an aborted checkpoint.
                                    discard_shared(&mut discards, &storage, job_id, registry.release(id));
                                }
                            }
                            TaskEvent::Decline { id, reason } => {
                                if let Some(span) = spans.get(&id) {
                                    span.in_scope(|| info!(%task, %reason, "declined"));
                                }
                                coordinator.decline(task, id, reason, now, &mut actions);
                            }
                            TaskEvent::SplitRequest => {
                                let assignment = match enumerators.get_mut(&task.vertex) {
                                    Some((_, e)) => e.assign(task.subtask),
                                    None => SplitAssignment::NoMoreSplits,
                                };
                                debug!(%task, ?assignment, "split request");
                                // An assigned split is in no enumerator snapshot any more: if it
                                // cannot be delivered, fail (and restore) rather than lose it.
                                if !gateway.send(task, TaskMessage::Splits(assignment)) {
                                    break Outcome::Failed(format!("cannot deliver a split assignment to {task}: its mailbox is full or closed"));
                                }
                            }
                            TaskEvent::Finished => {
                                execution.get_mut(task.vertex, task.subtask).state = ExecutionState::Finished;
                                finished.insert(task);
                                coordinator.task_finished(task, now, &mut actions);
                                if finished.len() == all.len() {
                                    break Outcome::Finished;
                                }
                            }
                            TaskEvent::Failed(e) => {
                                execution.get_mut(task.vertex, task.subtask).state = ExecutionState::Failed;
                                let cause = format!("task {task} failed: {e}");
                                if e.is_echo() {
                                    debug!(%task, error = %e, "task failed as a consequence; waiting for the root cause");
                                    echo.get_or_insert((cause, Instant::now() + ROOT_CAUSE_WAIT));
                                    continue;
                                }
                                warn!(%task, error = %e, "task failed");
                                break Outcome::Failed(cause);
                            }
                        }
                    }
                    _ = async {
                        match &echo {
                            Some((_, at)) => tokio::time::sleep_until((*at).into()).await,
                            None => std::future::pending().await,
                        }
                    } => {
                        let cause = echo.take().map(|(c, _)| c).unwrap_or_default();
                        warn!(%cause, "task failed");
                        break Outcome::Failed(cause);
                    }
                    f = finalize_rx.recv() => {
                        let Some(f) = f else { continue };
                        if f.generation != generation {
                            continue;
                        }
                        finalizing.remove(&f.id);
                        let is_checkpoint = requested.get(&f.id).is_none_or(|t| t.kind == SnapshotKind::Checkpoint);
                        match f.result {
                            Ok(cp) if !is_checkpoint => {
                                // Savepoints belong to the user: not retained, never discarded.
                                coordinator.finalized(f.id, Ok(()), now, &mut actions);
                                let _ = cp;
                            }
                            Ok(cp) => {
                                coordinator.finalized(f.id, Ok(()), now, &mut actions);
                                let subsumed = store.add(cp);
                                // Claim mode: the restored checkpoint goes once this run retains
                                // as many of its own as it may.
                                if store.retained().count() >= config.checkpoint.num_retained as usize
                                    && let (Some(c), Some(k)) = (claim.as_mut(), keeper.as_ref())
                                {
                                    c.subsume(k).await;
                                }
                                for old in subsumed {
                                    discard_shared(&mut discards, &storage, job_id, registry.release(old.id));
                                    let s = storage.clone();
                                    discards.spawn(async move {
                                        if let Err(e) = s.discard(&old.location).await {
                                            warn!(checkpoint = old.id.0, error = %e, "cannot discard subsumed checkpoint");
                                        }
                                    });
                                }
                            }
                            Err(e) => coordinator.finalized(f.id, Err(e), now, &mut actions),
                        }
                    }
                    _ = async {
                        match wake {
                            Some(w) => tokio::time::sleep_until((started + w).into()).await,
                            None => std::future::pending().await,
                        }
                    } => {
                        coordinator.tick(now.max(started.elapsed()), &mut actions);
                    }
                    cmd = async {
                        match commands.as_mut() {
                            Some(c) => c.recv().await,
                            None => std::future::pending().await,
                        }
                    } => {
                        let Some(Command::Snapshot { kind, dir, drain, reply }) = cmd else {
                            commands = None;
                            continue;
                        };
                        let target = match kind {
                            // Without checkpointing there is no checkpoint storage to write to
                            // (Flink has no checkpoint coordinator then): savepoints only.
                            SnapshotKind::Checkpoint if !config.checkpoint.is_enabled() => {
                                let _ = reply.send(Err(
                                    "checkpointing is not enabled for this job: set a checkpoint interval \
                                     to take checkpoints, or take a savepoint"
                                        .to_string(),
                                ));
                                continue;
                            }
                            SnapshotKind::Checkpoint => None,
                            _ => match savepoint_target(config, dir, job_id) {
                                Ok(t) => Some(t),
                                Err(e) => {
                                    let _ = reply.send(Err(e));
                                    continue;
                                }
                            },
                        };
                        match coordinator.trigger(kind, now, &mut actions) {
                            Ok(id) => {
                                let (storage, root, location) = target.unwrap_or_else(|| {
                                    (storage.clone(), storage_root.clone(), CheckpointLocation::for_checkpoint(job_id, id))
                                });
                                requested.insert(id, Target { kind, drain, storage, root, location, reply: Some(reply) });
                            }
                            Err(refusal) => {
                                let _ = reply.send(Err(format!("not triggered: {refusal}")));
                            }
                        }
                    }
                    _ = async {
                        match records_poll.as_mut() {
                            Some(i) => { i.tick().await; }
                            None => std::future::pending().await,
                        }
                    } => {
                        let emitted = metrics.source_records.load(Ordering::Relaxed) - records_base;
                        coordinator.records_emitted(emitted, now, &mut actions);
                    }
                    Some(_) = discards.join_next(), if !discards.is_empty() => {}
                    _ = canceller.cancelled() => break Outcome::Canceled,
                    lost = async {
                        match keeper.as_mut() {
                            Some(k) => k.lost().await,
                            None => std::future::pending().await,
                        }
                    } => {
                        warn!(error = %lost, "the job directory was taken over: stopping");
                        break Outcome::Fatal(JobError::Storage(lost));
                    }
                }
                // Carry out the coordinator's decisions.
                let mut fail = None;
                while !actions.is_empty() {
                for action in std::mem::take(&mut actions) {
                    match action {
                        CoordinatorAction::Trigger { id, timestamp_ms, options, tasks } => {
                            let span = info_span!("checkpoint", id = id.0, kind = ?options.kind);
                            span.in_scope(|| debug!("triggered"));
                            spans.insert(id, span);
                            let (target_storage, location, drain, root) = match requested.get(&id) {
                                Some(t) => (t.storage.clone(), t.location.clone(), t.drain, t.root.clone()),
                                None => (storage.clone(), CheckpointLocation::for_checkpoint(job_id, id), false, storage_root.clone()),
                            };
                            let prepared = if options.kind == SnapshotKind::Checkpoint {
                                target_storage.init_location(job_id, id).await.map(|_| ()).map_err(|e| e.to_string())
                            } else {
                                Ok(())
                            };
                            // The operator coordinators are checkpointed before any barrier is
                            // injected; assignments after this reach readers after the barrier.
                            let prepared = prepared.and_then(|()| {
                                let mut states = BTreeMap::new();
                                for (op, e) in enumerators.values() {
                                    states.insert(*op, e.snapshot().map_err(|e| e.to_string())?);
                                }
                                coordinator_states.insert(id, states);
                                Ok(())
                            });
                            // A savepoint's directory reaches every subtask before its barriers.
                            let prepared = match prepared {
                                Ok(()) if options.kind != SnapshotKind::Checkpoint => {
                                    gateway.set_target(&targets, id, target_storage, root, location).await
                                }
                                other => other,
                            };
                            match prepared {
                                Err(e) => coordinator.trigger_failed(id, e, started.elapsed(), &mut actions),
                                Ok(()) => {
                                    let barrier = CheckpointBarrier { id, timestamp_ms, options };
                                    for t in tasks {
                                        if !gateway.send(t, TaskMessage::Trigger(barrier, drain)) {
                                            debug!(task = %t, "trigger not delivered: the task has ended");
                                        }
                                    }
                                }
                            }
                        }
                        CoordinatorAction::TriggerFinished { id, timestamp_ms, options, tasks } => {
                            let barrier = CheckpointBarrier { id, timestamp_ms, options };
                            for t in tasks {
                                if !gateway.send(t, TaskMessage::Trigger(barrier, false)) {
                                    debug!(task = %t, "trigger not delivered: the task has ended");
                                }
                            }
                        }
                        CoordinatorAction::Finalize { id, kind, timestamp_ms, acks } => {
                            finalizing.insert(id);
                            let coordinators = coordinator_states.remove(&id).unwrap_or_default();
                            let metadata = build_metadata((job, &fingerprint), job_id, id, kind, timestamp_ms, &acks, &coordinators);
                            let (s, location) = targets
                                .lock()
                                .ok()
                                .and_then(|t| t.get(&id).cloned())
                                .unwrap_or_else(|| (storage.clone(), CheckpointLocation::for_checkpoint(job_id, id)));
                            let tx = finalize_tx.clone();
                            tokio::spawn(async move {
                                let result = s
                                    .write_metadata(&location, &metadata)
                                    .await
                                    .map(|_| CompletedCheckpoint {
                                        id,
                                        location,
                                        state_size: metadata.state_size(),
                                        completion_timestamp_ms: metadata.completion_timestamp_ms,
                                    })
                                    .map_err(|e| e.to_string());
                                let _ = tx.send(Finalized { generation, id, result }).await;
                            });
                        }
                        CoordinatorAction::NotifyComplete { id, tasks } => {
                            let span = spans.remove(&id).unwrap_or_else(tracing::Span::none);
                            if let Some(s) = coordinator.stats(id) {
                                span.in_scope(|| info!("{s}"));
                            }
                            for t in tasks {
                                gateway.send(t, TaskMessage::NotifyComplete(id));
                            }
                            gateway.clear_target(&targets, id);
                            if let Some(mut t) = requested.remove(&id) {
                                // Statistics first, so a client answered next sees them.
                                canceller.publish_stats(&coordinator);
                                let path = t.storage.location_path(&t.location);
                                info!(checkpoint = id.0, kind = ?t.kind, %path, "snapshot complete");
                                if let Some(reply) = t.reply.take() {
                                    let _ = reply.send(Ok(path.clone()));
                                }
                                if t.kind == SnapshotKind::SynchronousSavepoint {
                                    // The sources now end their input; the job finishes normally.
                                    stopped_with = Some(path);
                                }
                            }
                        }
                        CoordinatorAction::NotifyAborted { id, reason, tasks } => {
                            let span = spans.remove(&id).unwrap_or_else(tracing::Span::none);
                            span.in_scope(|| info!(%reason, "checkpoint aborted"));
                            coordinator_states.remove(&id);
                            gateway.clear_target(&targets, id);
                            if let Some(mut t) = requested.remove(&id)
                                && let Some(reply) = t.reply.take()
                            {
                                canceller.publish_stats(&coordinator);
                                let _ = reply.send(Err(format!("snapshot {id} failed: {reason}")));
                            }
                            for t in tasks {
                                gateway.send(t, TaskMessage::NotifyAborted(id));
                            }
                            discard_shared(&mut discards, &storage, job_id, registry.release(id));
                            let s = storage.clone();
                            discards.spawn(async move {
                                let _ = s.discard(&CheckpointLocation::for_checkpoint(job_id, id)).await;
                            });
                        }
                        CoordinatorAction::FailJob { reason } => fail = Some(reason),
                    }
                }
                }
                canceller.publish_stats(&coordinator);
                if let Some(reason) = fail {
                    break Outcome::Failed(reason);
                }
            };
            // Tear this generation down. Checkpoints whose `_metadata` is being written finish
            // first: they are complete (every subtask acknowledged) and may be the restore point.
            // After a finished job, every task commits what it held back (now, and only now);
            // otherwise each is aborted. An abort takes effect at a task's next await: wait until
            // every task has stopped, so nothing of this generation runs on (or counts) once the
            // next one starts or the result is read. A cancelled job waits for its tasks only
            // for the cancellation timeout; what is still running then is abandoned.
            let wait = match outcome {
                Outcome::Canceled => config.task_cancellation_timeout,
                Outcome::Finished | Outcome::Failed(_) | Outcome::Fatal(_) => TEARDOWN_WAIT,
            };
            gateway.stop(matches!(outcome, Outcome::Finished), wait).await;
            let give_up = Instant::now() + FINALIZE_WAIT;
            while !finalizing.is_empty() {
                let Ok(Some(f)) = tokio::time::timeout_at(give_up.into(), finalize_rx.recv()).await else {
                    break;
                };
                if f.generation != generation || !finalizing.remove(&f.id) {
                    continue;
                }
                let mut ignored = Vec::new();
                let target = requested.remove(&f.id);
                let is_checkpoint = target.as_ref().is_none_or(|t| t.kind == SnapshotKind::Checkpoint);
                if let Some(mut t) = target
                    && let Some(reply) = t.reply.take()
                {
                    let _ = reply.send(match &f.result {
                        Ok(_) => Ok(t.storage.location_path(&t.location)),
                        Err(e) => Err(format!("snapshot {} failed: {e}", f.id)),
                    });
                }
                match f.result {
                    Ok(_) if !is_checkpoint => {
                        coordinator.finalized(f.id, Ok(()), started.elapsed(), &mut ignored);
                    }
                    Ok(cp) => {
                        coordinator.finalized(f.id, Ok(()), started.elapsed(), &mut ignored);
                        for old in store.add(cp) {
                            discard_shared(&mut discards, &storage, job_id, registry.release(old.id));
                            let s = storage.clone();
                            discards.spawn(async move {
                                let _ = s.discard(&old.location).await;
                            });
                        }
                    }
                    Err(e) => coordinator.finalized(f.id, Err(e), started.elapsed(), &mut ignored),
                }
            }
            let mut ignored = Vec::new();
            coordinator.job_status_changed(false, started.elapsed(), &mut ignored);
            for a in ignored {
                if let CoordinatorAction::NotifyAborted { id, .. } = a
                    && !finalizing.contains(&id)
                {
                    discard_shared(&mut discards, &storage, job_id, registry.release(id));
                    let s = storage.clone();
                    discards.spawn(async move {
                        let _ = s.discard(&CheckpointLocation::for_checkpoint(job_id, id)).await;
                    });
                }
            }
            // Uploads of this generation still running finish (or are given up on): what they
            // acknowledge now belongs to no checkpoint, and their shared files go.
            let give_up = Instant::now() + FINALIZE_WAIT;
            loop {
                let idle = gateway.uploads_idle();
                while let Ok(report) = report_rx.try_recv() {
                    if let TaskEvent::Acknowledge { state, .. } = &report.event {
                        discard_shared(&mut discards, &storage, job_id, registry.unreferenced_in(state));
                    }
                }
                if idle || Instant::now() >= give_up {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            let (c, f) = coordinator.counts();
            completed += c;
            failed += f;
            durations.extend(coordinator.completed_durations());
            in_flight.extend(coordinator.completed_in_flight());
            history.extend(coordinator.history().cloned());
            next_checkpoint_id = coordinator.next_checkpoint_id();
            refused += coordinator.refused_count();
            let cause = match outcome {
                Outcome::Finished | Outcome::Canceled => {
                    if let Some(path) = &stopped_with {
                        info!(savepoint = %path, "job stopped with a savepoint");
                    }
                    let status = if matches!(outcome, Outcome::Canceled) {
                        JobStatus::Canceled
                    } else {
                        JobStatus::Finished
                    };
                    if status == JobStatus::Canceled
                        && config.checkpoint.externalized_retention == ExternalizedRetention::DeleteOnCancellation
                    {
                        for c in store.retained() {
                            if let Err(e) = storage.discard(&c.location).await {
                                warn!(checkpoint = c.id.0, error = %e, "cannot delete the checkpoint on cancellation");
                            }
                            discard_shared(&mut discards, &storage, job_id, registry.release(c.id));
                        }
                    }
                    for (_, mut t) in requested.drain() {
                        if let Some(reply) = t.reply.take() {
                            let _ = reply.send(Err("the job ended before the snapshot completed".into()));
                        }
                    }
                    execution.set_all(match status {
                        JobStatus::Finished => ExecutionState::Finished,
                        JobStatus::Canceled => ExecutionState::Canceled,
                    });
                    let firsts = metrics.first_record_us.lock().map(|v| v.clone()).unwrap_or_default();
                    let recovery_times = failures
                        .iter()
                        .filter_map(|(gen_after, at)| {
                            firsts
                                .iter()
                                .filter(|(g, _)| g == gen_after)
                                .map(|(_, us)| Duration::from_micros(*us))
                                .min()
                                .map(|first| first.saturating_sub(*at))
                        })
                        .collect();
                    let keep = history.len().saturating_sub(weir_checkpoint::coordinator::STATS_HISTORY);
                    history.drain(..keep);
                    if tokio::time::timeout(FINALIZE_WAIT, async {
                        while discards.join_next().await.is_some() {}
                    })
                    .await
                    .is_err()
                    {
                        warn!("discarding old checkpoints did not finish within {FINALIZE_WAIT:?}");
                    }
                    info!(?status, restarts = restart.restarts(), completed, failed, "job ended");
                    return Ok(JobResult {
                        job_id,
                        status,
                        duration: started.elapsed(),
                        running_duration: first_running.map(|at| started.elapsed().saturating_sub(at)),
                        bytes_sent: 0,
                        source_records: metrics.source_records.load(Ordering::Relaxed),
                        checkpoints_completed: completed,
                        checkpoints_failed: failed,
                        restarts: restart.restarts(),
                        checkpoint_durations: durations,
                        checkpoint_in_flight: in_flight,
                        checkpoint_history: history
                            .into_iter()
                            .filter(|s| s.status != CheckpointStatus::InProgress)
                            .collect(),
                        recovery_times,
                        savepoint: stopped_with,
                        trigger_refusals: refused,
                        latest_checkpoint: store
                            .latest()
                            .map(|c| storage.location_path(&c.location)),
                        restored_from,
                        source_records_since_restore: metrics
                            .source_records
                            .load(Ordering::Relaxed)
                            .saturating_sub(since_restore_base),
                    });
                }
                Outcome::Fatal(e) => return Err(e),
                Outcome::Failed(cause) => {
                    for (_, mut t) in requested.drain() {
                        if let Some(reply) = t.reply.take() {
                            let _ = reply.send(Err(format!("the job failed: {cause}")));
                        }
                    }
                    cause
                }
            };
            let failed_at = started.elapsed();
            let Some(delay) = restart.on_failure(failed_at) else {
                return Err(JobError::Failed {
                    restarts: restart.restarts(),
                    strategy: config.restart_strategy().describe(),
                    cause,
                });
            };
            warn!(%cause, restart = restart.restarts(), ?delay, "restarting the job");
            failures.push((generation + 1, failed_at));
            execution.restart_all();
            if !delay.is_zero() {
                tokio::time::sleep(delay).await;
            }
            let retained: Vec<CheckpointLocation> =
                store.retained().rev().map(|c| c.location.clone()).collect();
            if !retained.is_empty() {
                restore = Some((storage.clone(), retained));
            }
        }
        }
        .await;
        if let Gateway::Remote(remote) = &gateway {
            remote.shutdown().await;
        }
        if let Some(k) = keeper {
            // A run taken over leaves the directory to its new holder.
            if !matches!(&result, Err(JobError::Storage(weir_checkpoint::CheckpointError::LockLost { .. }))) {
                crate::claim::leave_if_empty(&*storage, job_id, own_generation, &k).await;
            }
            k.release().await;
        }
        result
    }
    .instrument(span)
    .await
}

/// A fresh id for one run of a job, as every Flink submission gets a new `JobID`: its name, the
/// wall clock, the process and a counter, hashed.
fn fresh_job_id(name: &str) -> JobId {
    static RUNS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let run = RUNS.fetch_add(1, Ordering::Relaxed);
    let seed = format!("{name}\0{nanos}\0{}\0{run}", std::process::id());
    JobId(weir_core::ids::stable_hash128(seed.as_bytes()))
}

/// What a job directory's lock says of its holder.
fn lock_holder() -> String {
    let host = std::env::var("HOSTNAME").unwrap_or_else(|_| "this host".to_string());
    format!(
        "process {} on {host}, since {} ms after the Unix epoch",
        std::process::id(),
        wall_ms()
    )
}
