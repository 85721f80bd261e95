//! The job master: deploys every subtask, carries out the checkpoint coordinator's decisions
//! (trigger, finalize, notify, discard), and handles failures through the restart strategy,
//! redeploying all tasks from the latest completed checkpoint.
//!
//! It is an event loop, as rust-analyzer's `main_loop.rs` is: [`JobMaster::next_event`] is the
//! one `select!`, and only produces a [`MasterEvent`](event_loop::MasterEvent); each event goes
//! to a `handle_*` method; the coordinator's actions are carried out after each event
//! ([`actions`]). What the master decides is pure and tested alone ([`decide`]).
//!
//! - [`run_job`]: setup (storage, the job directory's lease, claim, restore candidates, the
//!   transport and where subtasks run), then [`JobMaster::run`], then cleanup;
//! - a generation: one deployment of every subtask, from [`JobMaster::start_generation`] to
//!   [`JobMaster::teardown`]; a failure ends it, and the restart strategy starts the next.

mod actions;
pub(crate) mod decide;
mod event_loop;
pub(crate) mod snapshots;
mod teardown;
mod view;

use crate::claim::Claim;
use crate::cluster::ClusterRole;
#[cfg(feature = "cluster")]
use crate::cluster::jobmaster::{RemoteGateway, RemoteHost};
#[cfg(feature = "cluster")]
use crate::cluster::taskexecutor::graph_fingerprint;
use crate::config::{ClaimMode, JobConfig, StorageConfig, build_storage};
use crate::error::JobError;
use crate::gateway::TaskRuntime;
use crate::host::{LocalHost, TaskHost};
use crate::job::{Command, JobClient};
use crate::lease::{LeaseKeeper, LockContent};
use crate::operator::KeyedSections;
use crate::restart::RestartTracker;
use crate::restore::{
    RestoreChecks, RestorePoint, assign, candidates_at, load_first_good, one_jobs_candidates,
};
use crate::source::SplitEnumerator;
use crate::spec::{JobResult, JobSpec};
use crate::spec::{TaskDeployment, TaskSettings};
use crate::task::{JobMetrics, Targets, TaskReport};
use snapshots::{Finalized, Target, fresh_job_id, lock_holder, wall_ms};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tracing::{Instrument, info, info_span, warn};
use weir_checkpoint::coordinator::{
    CheckpointCoordinator, CheckpointStats, CoordinatorAction, CoordinatorSetup, TaskKey,
};
use weir_checkpoint::shared::SharedStateRegistry;
use weir_checkpoint::storage::CheckpointLocation;
use weir_checkpoint::store::CompletedCheckpointStore;
use weir_checkpoint::{CheckpointMetadata, CheckpointStorage, OpendalCheckpointStorage};
use weir_core::fingerprint::JobFingerprint;
use weir_core::graph::{ExecutionGraph, ExecutionState, JobGraph};
use weir_core::ids::{CheckpointId, JobId, OperatorId, VertexId};
use weir_network::{ChannelConfig, LocalTransport, Transport};

/// Each source's split enumerator (an operator coordinator), by the vertex of its readers.
type Enumerators = HashMap<VertexId, (OperatorId, Box<dyn SplitEnumerator>)>;

/// Each subtask's share of a restore point.
type RestoreContexts = HashMap<(VertexId, u32), crate::operator::RestoreContext>;

/// Where a restore reads: a storage and the checkpoints to try, newest first.
/// Where the next restore looks: a storage, its root as a location task managers open it from
/// (`None` for the job's own or a configured storage object), and the candidates, newest first.
type RestorePoints = (
    Arc<dyn CheckpointStorage>,
    Option<String>,
    Vec<CheckpointLocation>,
);

/// The job master of one run: what lasts across generations.
pub(crate) struct JobMaster<'s> {
    spec: &'s JobSpec,
    config: &'s JobConfig,
    job: &'s JobGraph,
    job_id: JobId,
    started: Instant,
    epoch_wall_ms: u64,
    fingerprint: JobFingerprint,
    storage: Arc<dyn CheckpointStorage>,
    /// Where task managers find `storage` (see [`StorageConfig::location`]).
    storage_root: Option<String>,
    /// The lease on the job directory (and on those a claim takes over), renewed beside the job.
    keeper: Option<LeaseKeeper>,
    /// The generation of the lock this run holds on its own job directory.
    own_generation: u64,
    claim: Option<Claim>,
    /// What the next generation restores from.
    restore: Option<RestorePoints>,
    /// Checkpoints (their directories) a subtask found a damaged file in while it restored:
    /// never restored again.
    unusable: BTreeSet<String>,
    /// Whether a subtask found a checkpoint unusable in the current generation: the failover
    /// that follows falls back to an older checkpoint, as the job master's own checks of a
    /// restore point do before deploying, and is not counted against the restart strategy (a
    /// checkpoint is found unusable once, so this is bounded by the retained checkpoints).
    fell_back: bool,
    transport: Arc<dyn Transport>,
    metrics: Arc<JobMetrics>,
    /// Where the subtasks run: in this process, or on task managers.
    host: Box<dyn TaskHost + 's>,
    client: JobClient,
    commands: Option<mpsc::Receiver<Command>>,
    targets: Arc<Targets>,
    stopped_with: Option<String>,
    store: CompletedCheckpointStore,
    /// Which pending and retained checkpoints reference each shared (incremental) file.
    registry: SharedStateRegistry,
    /// Raised when a delta on deleted files is refused: the tasks start new chains.
    chain_epoch: Arc<AtomicU64>,
    restart: RestartTracker,
    execution: ExecutionGraph,
    /// Ids continue past every checkpoint already in this job's directory, so no chk-<n> is
    /// reused.
    next_checkpoint_id: u64,
    generation: u64,
    first_running: Option<Duration>,
    restored_from: Option<String>,
    /// The sources' count when the latest restore was deployed.
    since_restore_base: u64,
    totals: Totals,
    /// The live tuning of checkpointing (through the REST API), over the configured values:
    /// every generation's coordinator starts with it, and each `_metadata` records it.
    tuning: weir_core::config::CheckpointTuning,
    /// Per restart: the generation deployed after the failure, and when it was detected.
    failures: Vec<(u64, Duration)>,
    sources: Vec<TaskKey>,
    all: Vec<TaskKey>,
    finalize_tx: mpsc::Sender<Finalized>,
    finalize_rx: mpsc::Receiver<Finalized>,
    /// Discards of subsumed or aborted checkpoints run beside the job; they are awaited before
    /// it returns, so a process that exits right after leaves nothing behind.
    discards: tokio::task::JoinSet<()>,
    /// Under a simulation acting out `Mutation::RestoreWithoutMetadata` only: the `_metadata`
    /// last built, whether written or not.
    unwritten: Option<(
        Arc<dyn CheckpointStorage>,
        CheckpointLocation,
        CheckpointMetadata,
    )>,
}

/// What the generations' coordinators counted, summed.
#[derive(Default)]
struct Totals {
    completed: u64,
    failed: u64,
    refused: u64,
    durations: Vec<Duration>,
    in_flight: Vec<u64>,
    history: Vec<CheckpointStats>,
}

/// A stop-with-savepoint's outcome, sent again until it cannot have been missed.
#[derive(Clone, Copy, Debug)]
pub(super) struct StopNotice {
    /// The synchronous savepoint.
    pub id: CheckpointId,
    /// Aborted (sent to every task, a few times) or completed (sent to every task that has not
    /// finished, until all have).
    pub aborted: bool,
    /// When it goes next.
    pub at: Instant,
    /// Times an abort goes again.
    pub left: u32,
}

/// One deployment of every subtask: its coordinator and what it tracks.
pub(crate) struct Generation {
    coordinator: CheckpointCoordinator,
    /// The operator coordinators: each source's split enumerator, fresh or restored.
    enumerators: Enumerators,
    coordinator_states: HashMap<CheckpointId, BTreeMap<OperatorId, Vec<u8>>>,
    reports: mpsc::UnboundedReceiver<TaskReport>,
    /// One span per checkpoint, from trigger to completion or abort.
    spans: HashMap<CheckpointId, tracing::Span>,
    /// Checkpoints whose `_metadata` write is in flight: never discarded under it.
    finalizing: BTreeSet<CheckpointId>,
    /// A failure that is only the echo of another (an upstream gone, a consumer gone): wait
    /// briefly for the root cause before failing with it.
    echo: Option<(String, Instant)>,
    /// A stop-with-savepoint completed or was aborted: its notification goes again (a
    /// notification lost in a full mailbox must not leave a source suspended for ever).
    stop_notified: Option<StopNotice>,
    /// Snapshots a client asked for.
    requested: BTreeMap<CheckpointId, Target>,
    /// The sources' count when this generation started (the record-count trigger's base).
    records_base: u64,
    records_poll: Option<tokio::time::Interval>,
    running: BTreeSet<TaskKey>,
    finished: BTreeSet<TaskKey>,
    /// Once every subtask finished (with checkpointing on): the final checkpoint, `None` until
    /// it is triggered. The job ends when it completes.
    final_checkpoint: Option<Option<CheckpointId>>,
    /// Final checkpoints triggered: after [`FINAL_ATTEMPTS`] that failed the job ends without
    /// one (its storage is down), as it did before FLIP-147.
    final_attempts: u32,
    /// The coordinator's decisions not carried out yet.
    actions: Vec<CoordinatorAction>,
}

/// Runs a job to its end.
pub(crate) async fn run_job(spec: JobSpec, client: JobClient) -> Result<JobResult, JobError> {
    let job_id = spec
        .config
        .job_id
        .unwrap_or_else(|| fresh_job_id(&spec.config.job_name));
    let span = info_span!("job", name = %spec.config.job_name, id = %job_id);
    async move {
        // Taken first: a failed setup drops it, so that a client's request fails at once
        // instead of waiting for an answer.
        let commands = client.take_commands();
        client.update_view(|v| view::describe(v, &spec, job_id));
        let rest = crate::rest::start(&spec, &client).await?;
        let mut master = JobMaster::start(&spec, job_id, client.clone(), commands).await?;
        // The job runs in here, so that task managers hear of its end however it ends.
        let result = master.run().await;
        master.close(&result).await;
        client.update_view(|v| {
            v.end_time_ms = Some(wall_ms());
            v.state = final_state(&result);
            if let Ok(r) = &result
                && r.status != crate::spec::JobStatus::Canceled
            {
                v.restored_from = r.restored_from.clone();
                v.restarts = r.restarts;
            }
        });
        if let Some(server) = rest {
            server.stop().await;
        }
        // However it ended, the job needs its local-recovery copies no more.
        if let Some(dir) = spec.config.state_backend.local_dir() {
            crate::local_recovery::remove_job(&dir, job_id);
        }
        result
    }
    .instrument(span)
    .await
}

impl<'s> JobMaster<'s> {
    /// Setup: the storage and the job directory's lease, the restore candidates (and a claim on
    /// them), the transport, and where the subtasks run.
    async fn start(
        spec: &'s JobSpec,
        job_id: JobId,
        client: JobClient,
        commands: Option<mpsc::Receiver<Command>>,
    ) -> Result<JobMaster<'s>, JobError> {
        let started = Instant::now();
        let epoch_wall_ms = wall_ms();
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
        let mut keeper = None;
        if config.checkpoint.is_enabled() {
            storage.check_writable().await?;
            // One writer per job directory: a second run with this job id is refused while the
            // first holds it (renews its lease); a killed run's directory is taken over.
            let generation =
                crate::lease::take_job_directory(&*storage, job_id, &lock_content).await?;
            let k = LeaseKeeper::start(lock_content.clone());
            k.hold(storage.clone(), job_id, generation).await;
            keeper = Some((k, generation));
        }
        let setup = Setup {
            spec,
            job_id,
            started,
            epoch_wall_ms,
            fingerprint,
            storage: storage.clone(),
            lock_content,
            client,
            commands,
        };
        match Self::assemble(setup, keeper.as_ref()).await {
            Ok(mut master) => {
                if let Some((k, generation)) = keeper {
                    master.own_generation = generation;
                    master.keeper = Some(k);
                }
                Ok(master)
            }
            Err(e) => {
                // The directory was taken: give it up as a run that ended would.
                if let Some((k, generation)) = keeper {
                    crate::claim::leave_if_empty(&*storage, job_id, generation, &k).await;
                    k.release().await;
                }
                Err(e)
            }
        }
    }

    /// The rest of the setup, once the job directory is held: the restore candidates (and a
    /// claim on them), the transport, where the subtasks run, and the first checkpoint id.
    async fn assemble(
        setup: Setup<'s>,
        keeper: Option<&(LeaseKeeper, u64)>,
    ) -> Result<JobMaster<'s>, JobError> {
        let Setup {
            spec,
            job_id,
            started,
            epoch_wall_ms,
            fingerprint,
            storage,
            lock_content,
            client,
            commands,
        } = setup;
        let (config, job) = (&spec.config, &spec.job);
        let (restore, claim) = restore_points(config, job_id, &lock_content, keeper).await?;
        let own: Arc<dyn Transport> = Arc::new(LocalTransport::new(ChannelConfig {
            buffers_per_channel: config.buffers_per_channel,
        }));
        let transport = match &config.transport {
            Some(layer) => layer.apply(own),
            None => own,
        };
        let metrics = Arc::new(JobMetrics {
            source_records: client.source_records_counter(),
            vertex_records: client
                .vertex_counters(job.vertices.iter().map(|v| (v.id.0, v.parallelism))),
            ..JobMetrics::default()
        });
        let settings = TaskSettings {
            batch_size: config.batch_size,
            mode: config.checkpoint.mode,
            snapshot_compression: config.snapshot_compression,
            incremental: config.incremental.then_some(config.incremental_max_chain),
            state_backend: config.state_backend.name(),
        };
        let storage_root = if config.checkpoint.is_enabled() {
            config.storage.location()
        } else {
            None
        };
        let targets = Arc::new(Targets::default());
        let chain_epoch = Arc::new(AtomicU64::new(0));
        let host = task_host(HostParts {
            spec,
            settings,
            transport: transport.clone(),
            job_id,
            storage: storage.clone(),
            storage_root: storage_root.clone(),
            started,
            metrics: metrics.clone(),
            targets: targets.clone(),
            chain_epoch: chain_epoch.clone(),
            client: client.clone(),
        })
        .await?;
        let next_checkpoint_id = if config.checkpoint.is_enabled() {
            first_checkpoint_id(&*storage, job_id).await?
        } else {
            1
        };
        let tasks = |only_sources: bool| -> Vec<TaskKey> {
            job.vertices
                .iter()
                .filter(|v| v.is_source || !only_sources)
                .flat_map(|v| {
                    (0..v.parallelism).map(move |i| TaskKey {
                        vertex: v.id,
                        subtask: i,
                    })
                })
                .collect()
        };
        let (finalize_tx, finalize_rx) = mpsc::channel::<Finalized>(64);
        Ok(JobMaster {
            spec,
            config,
            job,
            job_id,
            started,
            epoch_wall_ms,
            fingerprint,
            storage,
            storage_root,
            own_generation: 0,
            keeper: None,
            claim,
            restore,
            transport,
            metrics,
            host,
            commands,
            client,
            targets,
            stopped_with: None,
            store: CompletedCheckpointStore::new(config.checkpoint.num_retained),
            registry: SharedStateRegistry::new(),
            chain_epoch,
            restart: RestartTracker::new(config.restart_strategy()),
            execution: ExecutionGraph::new(job),
            next_checkpoint_id,
            generation: 0,
            first_running: None,
            restored_from: None,
            unwritten: None,
            unusable: BTreeSet::new(),
            fell_back: false,
            since_restore_base: 0,
            totals: Totals::default(),
            tuning: Default::default(),
            failures: Vec::new(),
            sources: tasks(true),
            all: tasks(false),
            finalize_tx,
            finalize_rx,
            discards: tokio::task::JoinSet::new(),
        })
    }

    /// Runs generation after generation until the job ends.
    async fn run(&mut self) -> Result<JobResult, JobError> {
        loop {
            self.generation += 1;
            self.transport.release_before(self.generation);
            let Some(mut generation) = self.start_generation().await? else {
                continue;
            };
            let restarts = self.restart.restarts();
            self.client.update_view(|v| v.restarts = restarts);
            let outcome = self.run_generation(&mut generation).await;
            let outcome = self.teardown(&mut generation, outcome).await;
            if let Some(result) = self.end_generation(generation, outcome).await? {
                return Ok(result);
            }
        }
    }

    /// The checkpoint configuration with the live tuning applied (the configured one if the
    /// tuning cannot apply).
    fn checkpoint_config(&self) -> weir_core::config::CheckpointConfig {
        self.tuning
            .applied_to(&self.config.checkpoint)
            .unwrap_or_else(|_| self.config.checkpoint.clone())
    }

    /// After the job ended, however: task managers hear of it, and the job directory's lease is
    /// released (the directory removed if the run left nothing in it).
    async fn close(&mut self, result: &Result<JobResult, JobError>) {
        self.host.shutdown(final_state(result)).await;
        if let Some(k) = self.keeper.take() {
            // A run taken over leaves the directory to its new holder.
            let lost = matches!(
                result,
                Err(JobError::Storage(
                    weir_checkpoint::CheckpointError::LockLost { .. }
                ))
            );
            if !lost {
                crate::claim::leave_if_empty(&*self.storage, self.job_id, self.own_generation, &k)
                    .await;
            }
            k.release().await;
        }
    }

    /// Restores (if there is something to restore from) and deploys every subtask of this
    /// generation. `None`: the attempt failed in a way the restart strategy retries (a
    /// failover's restore that failed on storage, too few slots), after its delay.
    async fn start_generation(&mut self) -> Result<Option<Generation>, JobError> {
        let Some((restored_meta, mut contexts)) = self.load_restore_point().await? else {
            return Ok(None);
        };
        // A tuning recorded in the checkpoint restored from applies again, under this run's
        // own (newer) tuning.
        if let Some(t) = restored_meta.as_ref().and_then(|m| m.tuning.as_ref()) {
            self.tuning = t.then(&self.tuning);
        }
        let config = self.checkpoint_config();
        self.client
            .update_view(|v| v.checkpoint_config = Some(config.clone()));
        let coordinator = CheckpointCoordinator::new(CoordinatorSetup {
            config,
            tasks_to_trigger: self.sources.clone(),
            tasks_to_wait_for: self.all.clone(),
            next_checkpoint_id: self.next_checkpoint_id,
            epoch_wall_ms: self.epoch_wall_ms,
        });
        let enumerators = self.enumerators(restored_meta.as_ref())?;
        let (report_tx, reports) = mpsc::unbounded_channel::<TaskReport>();
        let mut deployments = Vec::new();
        for v in &self.job.vertices {
            for i in 0..v.parallelism {
                let ev = self.execution.get_mut(v.id, i);
                ev.state = ExecutionState::Deploying;
                deployments.push(TaskDeployment {
                    task: TaskKey {
                        vertex: v.id,
                        subtask: i,
                    },
                    attempt: ev.attempt.0,
                    restore: contexts.remove(&(v.id, i)).unwrap_or_default(),
                });
            }
        }
        if !self.deploy(deployments, report_tx).await? {
            return Ok(None);
        }
        let records_base = self.metrics.source_records.load(Ordering::Relaxed);
        Ok(Some(Generation {
            coordinator,
            enumerators,
            coordinator_states: HashMap::new(),
            reports,
            spans: HashMap::new(),
            finalizing: BTreeSet::new(),
            echo: None,
            stop_notified: None,
            requested: BTreeMap::new(),
            records_base,
            records_poll: self
                .config
                .checkpoint
                .every_records
                .map(|_| tokio::time::interval(snapshots::RECORDS_POLL)),
            running: BTreeSet::new(),
            finished: BTreeSet::new(),
            final_checkpoint: None,
            final_attempts: 0,
            actions: Vec::new(),
        }))
    }

    /// The restore point of this generation, if any: its metadata and each subtask's restore
    /// context. `None` after a failover's restore failed and the restart strategy waited.
    async fn load_restore_point(
        &mut self,
    ) -> Result<Option<(Option<CheckpointMetadata>, RestoreContexts)>, JobError> {
        let newest = self.store.retained().last().map(|c| c.id);
        let unwritten = self
            .unwritten
            .take()
            .filter(|(_, _, m)| self.generation > 1 && newest.is_none_or(|n| m.checkpoint_id > n));
        if unwritten.is_none()
            && let None = &self.restore
        {
            weir_core::sim::observe(weir_core::sim::Observed::StartedEmpty);
            return Ok(Some((None, HashMap::new())));
        }
        // Subtasks download canonical sections themselves into a backend that keeps files,
        // from any storage in this process; on task managers, from the job's own storage only
        // (they may not reach another): else the master reads them.
        let (own, location) = match (&unwritten, &self.restore) {
            (Some((storage, _, _)), _) => (Arc::ptr_eq(storage, &self.storage), None),
            (None, Some((storage, location, _))) => {
                (Arc::ptr_eq(storage, &self.storage), location.clone())
            }
            (None, None) => (true, None),
        };
        let remote = matches!(self.config.cluster, Some(ClusterRole::JobManager(_)));
        let checks = RestoreChecks {
            fingerprint: &self.fingerprint,
            allow_non_restored_state: self.config.allow_non_restored_state,
            allow_changed_sources: self.config.allow_changed_sources,
            subtasks_fetch_sections: self.config.state_backend.local_dir().is_some()
                && (own || !remote || location.is_some()),
            storage_location: if own { None } else { location },
        };
        let found = match (unwritten, &self.restore) {
            // `Mutation::RestoreWithoutMetadata`: the deliberate bug's second half.
            (Some((storage, location, metadata)), _) => {
                weir_core::sim::observe(weir_core::sim::Observed::Restored(
                    metadata.checkpoint_id.0,
                ));
                let point = RestorePoint {
                    storage,
                    location,
                    metadata,
                };
                let contexts = assign(&point, self.job, &checks).await;
                contexts.map(|c| (point, c))
            }
            (None, Some((storage, _, locations))) => {
                load_first_good(storage.clone(), locations, self.job, &checks).await
            }
            (None, None) => return Ok(Some((None, HashMap::new()))),
        };
        let (point, contexts) = match found {
            Ok(found) => found,
            // During a failover, a restore that fails (a transient storage error) is one
            // more failure for the restart strategy; at job start it is the user's.
            Err(e) if decide::restore_failure_is_retried(self.generation, &e) => {
                let delay = decide::restart_or_give_up(
                    &mut self.restart,
                    &self.config.restart_strategy(),
                    self.started.elapsed(),
                    format!("restoring failed: {e}"),
                )?;
                warn!(error = %e, ?delay, "restoring failed; restarting again");
                tokio::time::sleep(delay).await;
                return Ok(None);
            }
            Err(e) => return Err(e),
        };
        // Subtasks fetch native snapshots' files from the job's own storage unless the restore
        // point is in another.
        let own = Arc::ptr_eq(&point.storage, &self.storage);
        let mut contexts = contexts;
        if own {
            for ctx in contexts.values_mut() {
                for state in ctx.operators.values_mut() {
                    for r in &mut state.native {
                        r.storage = None;
                    }
                    for r in &mut state.keyed {
                        if let KeyedSections::Stored { storage, .. } = &mut r.sections {
                            *storage = None;
                        }
                    }
                }
            }
        }
        self.next_checkpoint_id = self
            .next_checkpoint_id
            .max(point.metadata.checkpoint_id.0 + 1);
        #[allow(unused_mut)]
        let mut restored_meta = Some(point.metadata.clone());
        // `cargo xtask mutants`: a restore that loads nothing, to show the tests fail.
        #[cfg(weir_mutant = "restore_noop")]
        let contexts: HashMap<_, _> = {
            let mut contexts = contexts;
            contexts.clear();
            restored_meta = None;
            contexts
        };
        info!(checkpoint = %point.describe(), "restoring");
        weir_core::sim::observe(weir_core::sim::Observed::Restored(
            point.metadata.checkpoint_id.0,
        ));
        self.since_restore_base = self.metrics.source_records.load(Ordering::Relaxed);
        view::restoring(&self.client, &point);
        // The checkpoint the job started from: the first restore's, unless a subtask found
        // that one unusable and the job fell back.
        let fell_back = self.restored_from.as_ref().is_some_and(|from| {
            self.unusable
                .iter()
                .any(|dir| from.ends_with(dir.trim_end_matches('/')))
        });
        if self.restored_from.is_none() || fell_back {
            self.restored_from = Some(point.describe());
            let from = self.restored_from.clone();
            self.client.update_view(|v| v.restored_from = from);
            if let (Some(c), Some(k)) = (self.claim.as_mut(), self.keeper.as_ref()) {
                c.restored(&point.location, k).await;
            }
        }
        Ok(Some((restored_meta, contexts)))
    }

    /// Each source's split enumerator, restored from `restored` when there is one.
    fn enumerators(&self, restored: Option<&CheckpointMetadata>) -> Result<Enumerators, JobError> {
        let mut enumerators = HashMap::new();
        for (node, factory) in &self.spec.enumerators {
            let n = self.job.stream_graph.node(*node);
            let mut e = factory(n.parallelism);
            if let Some(meta) = restored
                && let Some(op) = meta
                    .operators
                    .iter()
                    .find(|o| o.operator_id == n.operator_id)
            {
                e.restore(op.coordinator_state.as_deref())
                    .map_err(|err| JobError::Restore {
                        path: format!("checkpoint {}", meta.checkpoint_id),
                        reason: format!("the split enumerator of '{}': {err}", n.name),
                    })?;
            }
            enumerators.insert(self.job.vertex_of[node.0 as usize], (n.operator_id, e));
        }
        Ok(enumerators)
    }

    /// Deploys `deployments` where the subtasks run. False when too few slots came within the
    /// slot timeout and the restart strategy waited to deploy again.
    async fn deploy(
        &mut self,
        deployments: Vec<TaskDeployment>,
        reports: mpsc::UnboundedSender<TaskReport>,
    ) -> Result<bool, JobError> {
        match self
            .host
            .deploy(self.generation, deployments, reports)
            .await
        {
            Ok(()) => Ok(true),
            // Too few slots within the slot timeout (a task manager lost with no replacement):
            // like Flink's NoResourceAvailableException, a failure for the restart strategy,
            // which deploys again once its delay passed.
            Err(JobError::NoResources(why)) => {
                let delay = decide::restart_or_give_up(
                    &mut self.restart,
                    &self.config.restart_strategy(),
                    self.started.elapsed(),
                    format!("not enough resources: {why} (the slot timeout)"),
                )?;
                warn!(%why, ?delay, restart = self.restart.restarts(), "not enough slots; deploying again");
                self.execution.restart_all();
                if !delay.is_zero() {
                    tokio::time::sleep(delay).await;
                }
                Ok(false)
            }
            Err(e) => Err(e),
        }
    }

    /// Makes snapshot `id` go to `location` in `storage` in every subtask, before any of its
    /// barriers is injected (a savepoint's own directory).
    async fn set_target(
        &self,
        id: CheckpointId,
        storage: Arc<dyn CheckpointStorage>,
        root: Option<String>,
        location: CheckpointLocation,
    ) -> Result<(), String> {
        self.host
            .announce_target(id, &*storage, root, &location)
            .await?;
        if let Ok(mut t) = self.targets.lock() {
            t.insert(id, (storage, location));
        }
        Ok(())
    }

    /// Forgets where snapshot `id` goes (it completed or was aborted).
    fn clear_target(&self, id: CheckpointId) {
        if let Ok(mut t) = self.targets.lock() {
            t.remove(&id);
        }
        self.host.clear_target(id);
    }

    /// Makes every subtask's keyed backends start new incremental chains before their next
    /// snapshot.
    fn raise_chain_epoch(&self) {
        let epoch = self.chain_epoch.fetch_add(1, Ordering::AcqRel) + 1;
        self.host.chain_epoch_raised(epoch);
    }
}

/// What the setup has once the job directory is held (see [`JobMaster::assemble`]).
struct Setup<'s> {
    spec: &'s JobSpec,
    job_id: JobId,
    started: Instant,
    epoch_wall_ms: u64,
    fingerprint: JobFingerprint,
    storage: Arc<dyn CheckpointStorage>,
    lock_content: LockContent,
    client: JobClient,
    commands: Option<mpsc::Receiver<Command>>,
}

/// What [`task_host`] builds a host from.
struct HostParts<'s> {
    spec: &'s JobSpec,
    settings: TaskSettings,
    transport: Arc<dyn Transport>,
    job_id: JobId,
    storage: Arc<dyn CheckpointStorage>,
    storage_root: Option<String>,
    started: Instant,
    metrics: Arc<JobMetrics>,
    targets: Arc<Targets>,
    chain_epoch: Arc<AtomicU64>,
    client: JobClient,
}

/// How a job ended, as Flink's job status names it.
fn final_state(result: &Result<JobResult, JobError>) -> &'static str {
    match result {
        Ok(r) if r.status == crate::spec::JobStatus::Canceled => "CANCELED",
        Ok(_) => "FINISHED",
        Err(_) => "FAILED",
    }
}

/// Where the subtasks run: on task managers when this process is a job manager, else here.
async fn task_host(parts: HostParts<'_>) -> Result<Box<dyn TaskHost + '_>, JobError> {
    let HostParts {
        spec,
        settings,
        transport,
        job_id,
        storage,
        storage_root,
        started,
        metrics,
        targets,
        chain_epoch,
        client,
    } = parts;
    let (config, job) = (&spec.config, &spec.job);
    Ok(match &config.cluster {
        #[cfg(not(feature = "cluster"))]
        Some(ClusterRole::JobManager(_)) => {
            let _ = (storage_root, job, client);
            return Err(JobError::Invalid(crate::cluster::MISSING.to_string()));
        }
        #[cfg(feature = "cluster")]
        Some(ClusterRole::JobManager(options)) => {
            if config.checkpoint.is_enabled() && storage_root.is_none() {
                return Err(JobError::Invalid(format!(
                    "cluster mode needs checkpoint storage every process reaches (a directory \
                         or s3://bucket/prefix), not {:?}",
                    config.storage
                )));
            }
            let gateway = RemoteGateway::start(
                options,
                graph_fingerprint(job),
                metrics.clone(),
                started,
                spec.results.clone(),
                client,
            )
            .await?;
            info!(addr = %gateway.local_addr(), "job manager listening");
            Box::new(RemoteHost {
                gateway,
                job,
                job_id,
                settings,
                storage_root: storage_root.clone(),
                chain_epoch: chain_epoch.clone(),
            })
        }
        _ => Box::new(LocalHost {
            spec,
            settings,
            transport: transport.clone(),
            job_id,
            storage: storage.clone(),
            started,
            metrics: metrics.clone(),
            targets: targets.clone(),
            chain_epoch: chain_epoch.clone(),
            runtime: TaskRuntime::new()?,
            running: None,
            simulated: crate::simulated_cluster::SimulatedTaskManagers::of_simulation(),
        }),
    })
}

/// Where the job restores from at start (`restore_from`), and the claim on those checkpoints'
/// job directories in claim mode.
async fn restore_points(
    config: &JobConfig,
    job_id: JobId,
    lock_content: &LockContent,
    keeper: Option<&(LeaseKeeper, u64)>,
) -> Result<(Option<RestorePoints>, Option<Claim>), JobError> {
    let Some(path) = &config.restore_from else {
        return Ok((None, None));
    };
    // A custom storage object is reached by locations under its root.
    let custom = match &config.storage {
        StorageConfig::Custom(s) => Some(s),
        _ => None,
    };
    let (s, location, locations) = listed_candidates(path, custom).await?;
    let Some((k, _)) = keeper.filter(|_| config.claim_mode == ClaimMode::Claim) else {
        return Ok((Some((s, location, locations)), None));
    };
    let (claim, taken) = Claim::start(s.clone(), &locations, job_id, lock_content).await?;
    for (job, generation) in taken {
        k.hold(s.clone(), job, generation).await;
    }
    // Watching the leases took a while: a running job's retention may have deleted what was
    // listed, and new checkpoints may exist. List again.
    let points = listed_candidates(path, custom).await?;
    Ok((Some(points), Some(claim)))
}

/// The complete checkpoints at the user's restore path, newest first. A storage error the
/// storage calls temporary is retried (three times, backing off): a resume must not fail for
/// good on one throttled listing (found by the simulation, seed 2181).
async fn listed_candidates(
    path: &std::path::Path,
    custom: Option<&Arc<dyn CheckpointStorage>>,
) -> Result<RestorePoints, JobError> {
    let mut attempt = 0;
    loop {
        let listed = match candidates_at(path, custom).await {
            Ok(root) => one_jobs_candidates(&*root.storage, path, root.listings)
                .await
                .map(|locations| (root.storage, root.location, locations)),
            Err(e) => Err(e),
        };
        match listed {
            Err(JobError::Storage(e)) if e.is_temporary() && attempt < 3 => {
                attempt += 1;
                warn!(error = %e, attempt, "cannot list the restore path's checkpoints; retrying");
                tokio::time::sleep(Duration::from_millis(10 << attempt)).await;
            }
            other => return other,
        }
    }
}

/// The first checkpoint id of this run: past every checkpoint already in the job's directory (a
/// rerun of the same job, or a restore that fell back past newer, corrupt ones). Unknown ids
/// could overwrite an earlier run's checkpoints: the listing is retried, and if it keeps
/// failing the start fails, as for an unwritable storage.
async fn first_checkpoint_id(
    storage: &dyn CheckpointStorage,
    job_id: JobId,
) -> Result<u64, JobError> {
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
    Ok(existing.last().map_or(1, |last| last.id.0 + 1))
}
