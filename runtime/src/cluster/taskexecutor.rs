//! A task manager's main loop (Flink's `TaskExecutor`): it registers with the job manager, runs
//! the subtasks it is deployed on its own copy of the job, forwards their reports in order, and
//! stops them when told or when the job manager is lost, after which it registers again (or
//! exits, if the job manager stays unreachable).

use super::TaskManagerOptions;
use super::membership::{PastJob, TaskManagerInfo};
use super::protocol::{Deploy, FromTaskManager, ToTaskManager, decode, encode};
use super::rpc::RpcError;
use super::taskmanager::TaskManagerSession;
use super::transport::{ClusterTransport, Placement};
use crate::config::StorageConfig;
use crate::config::build_storage;
use crate::error::{JobError, TaskError};
use crate::gateway::{ProcessTasks, Running, TEARDOWN_WAIT, TaskRuntime};
use crate::spec::{JobResult, JobSpec, JobStatus};
use crate::task::{JobMetrics, Targets, TaskEvent, TaskMessage, TaskReport};
use std::collections::{BTreeMap, HashMap};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tracing::{Instrument, debug, info, info_span, warn};
use weir_checkpoint::storage::CheckpointLocation;
use weir_checkpoint::{CheckpointStorage, OpendalCheckpointStorage};
use weir_core::ids::JobId;
use weir_network::{ChannelConfig, Transport};

/// How long a stop waits for uploads still running.
const UPLOAD_WAIT: Duration = Duration::from_secs(10);
/// How often source counts go to the job manager when nothing else does.
const METRICS_EVERY: Duration = Duration::from_millis(20);
/// Reports sent in one call, at most.
const REPORT_BATCH: usize = 512;

/// A hash of a JobGraph, to check that every process built the same job.
pub(crate) fn graph_fingerprint(job: &weir_core::graph::JobGraph) -> u128 {
    match postcard::to_stdvec(job) {
        Ok(bytes) => weir_core::ids::stable_hash128(&bytes),
        Err(_) => 0,
    }
}

/// Now, ms since the Unix epoch.
fn wall_ms() -> u64 {
    weir_core::sim::wall_clock().as_millis() as u64
}

/// This host's address on the route to `peer` (no packet is sent).
fn address_towards(peer: SocketAddr) -> IpAddr {
    let unspecified: SocketAddr = if peer.is_ipv4() {
        (std::net::Ipv4Addr::UNSPECIFIED, 0).into()
    } else {
        (std::net::Ipv6Addr::UNSPECIFIED, 0).into()
    };
    std::net::UdpSocket::bind(unspecified)
        .and_then(|s| {
            s.connect(peer)?;
            s.local_addr()
        })
        .map(|a| a.ip())
        .unwrap_or(unspecified.ip())
}

/// What a task manager keeps across deployments and sessions.
struct Executor {
    /// The subtasks' own runtime: a busy subtask never delays a heartbeat or a fetch, which
    /// run on the runtime the task manager was started on.
    runtime: TaskRuntime,
    spec: JobSpec,
    fingerprint: u128,
    /// The TCP transport (placement and byte counts).
    transport: Arc<ClusterTransport>,
    /// What the subtasks open channels on: the TCP transport, through the job's
    /// [`TransportLayer`](crate::config::TransportLayer) if it has one.
    data: Arc<dyn Transport>,
    started: Instant,
    metrics: Arc<JobMetrics>,
    targets: Arc<Targets>,
    chain_epoch: Arc<AtomicU64>,
    storages: HashMap<String, Arc<dyn CheckpointStorage>>,
    running: BTreeMap<u64, Running>,
    reports: mpsc::UnboundedSender<TaskReport>,
    /// The job, once it was deployed here: for the list of the cluster's jobs.
    job: Option<PastJob>,
}

/// How a session with the job manager ended.
enum SessionEnd {
    /// The job is over, in this state.
    Shutdown(String),
    /// The job manager was lost (or forgot this task manager).
    Lost(String),
}

/// Runs a task manager for `spec`'s job until the job manager shuts it down.
pub(crate) async fn run_task_manager(
    spec: JobSpec,
    options: TaskManagerOptions,
) -> Result<JobResult, JobError> {
    serve_job(spec, &options, Vec::new(), true).await.0
}

/// Runs a task manager for `spec`'s job until the job manager shuts it down (or stays lost),
/// telling it at registration of the `past_jobs` it ran; also the job as this task manager
/// saw it, if it was deployed its subtasks. With `rejoin`, a lost job manager is registered
/// with again, for `options.connect_timeout`; without (a standing task manager, which asks
/// whoever answers at the address for its job first), losing it ends the call.
pub(crate) async fn serve_job(
    spec: JobSpec,
    options: &TaskManagerOptions,
    past_jobs: Vec<PastJob>,
    rejoin: bool,
) -> (Result<JobResult, JobError>, Option<PastJob>) {
    if options.slots == 0 {
        let refused = JobError::Invalid("a task manager needs at least one slot".into());
        return (Err(refused), None);
    }
    let ip = options
        .bind
        .unwrap_or_else(|| address_towards(options.jobmanager));
    let mut executor = match Executor::new(spec, ip) {
        Ok(e) => e,
        Err(e) => return (Err(e), None),
    };
    let data_addr = executor.transport.local_addr();
    let span = info_span!("taskmanager", data = %data_addr);
    let info = TaskManagerInfo {
        name: format!("taskmanager-{}@{ip}", std::process::id()),
        slots: options.slots,
        data_addr,
        pid: std::process::id(),
        job: Some(executor.fingerprint),
        protocol: super::TASK_PROTOCOL_VERSION,
        past_jobs,
    };
    let result = async {
        loop {
            let session =
                TaskManagerSession::join(options.jobmanager, info.clone(), options.connect_timeout)
                    .await
                    .map_err(|e| JobError::JobManagerLost(e.to_string()))?;
            // Each session has its own report channel: what a subtask or an upload of an
            // earlier session reports goes nowhere, never to another job manager.
            let (reports_tx, mut reports_rx) = mpsc::unbounded_channel();
            executor.reports = reports_tx;
            let end = serve(&session, &mut executor, &mut reports_rx).await;
            // Whatever runs belongs to a job master that is gone or done.
            for (_, mut r) in std::mem::take(&mut executor.running) {
                r.stop(false, TEARDOWN_WAIT).await;
            }
            executor.end_session();
            match end {
                SessionEnd::Shutdown(state) => {
                    let _ = session.leave().await;
                    info!(%state, "the job is over");
                    executor.job_ended(&state);
                    return Ok(executor.result());
                }
                SessionEnd::Lost(reason) if !rejoin => {
                    warn!(%reason, "lost the job manager; subtasks stopped");
                    return Err(JobError::JobManagerLost(reason));
                }
                SessionEnd::Lost(reason) => {
                    warn!(%reason, "lost the job manager; subtasks stopped, registering again");
                }
            }
        }
    }
    .instrument(span)
    .await;
    if result.is_err() {
        executor.job_ended("SUSPENDED");
    }
    let job = executor.job.take();
    // The transport goes first; the runtime's threads end on their own.
    let Executor {
        runtime,
        transport,
        data,
        ..
    } = executor;
    drop(data);
    drop(transport);
    drop(runtime);
    (result, job)
}

/// One session with the job manager: heartbeats, fetching what it sends, forwarding reports.
async fn serve(
    session: &TaskManagerSession,
    executor: &mut Executor,
    reports: &mut mpsc::UnboundedReceiver<TaskReport>,
) -> SessionEnd {
    let (control_tx, mut control_rx) = mpsc::unbounded_channel();
    let metrics = executor.metrics.clone();
    tokio::select! {
        lost = session.heartbeats() => SessionEnd::Lost(lost.to_string()),
        end = fetch_loop(session, executor, control_tx) => end,
        end = forward(session, reports, &mut control_rx, &metrics) => end,
    }
}

/// Takes what the job manager sends, in order, and carries it out.
async fn fetch_loop(
    session: &TaskManagerSession,
    executor: &mut Executor,
    control: mpsc::UnboundedSender<FromTaskManager>,
) -> SessionEnd {
    let from = "the job manager";
    // The number of the last message taken.
    let mut taken = 0u64;
    loop {
        let batches = match session.fetch(taken).await {
            Ok(b) => b,
            Err(e @ RpcError::NotRegistered(_)) => return SessionEnd::Lost(e.to_string()),
            Err(e) => {
                // The heartbeats decide whether the job manager is gone.
                debug!(error = %e, "fetch failed; retrying");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        for (n, bytes) in batches {
            // Sent again after an answer that did not arrive, but already taken.
            if n <= taken {
                continue;
            }
            taken = n;
            let messages = match decode::<ToTaskManager>(&bytes, from) {
                Ok(m) => m,
                Err(e) => return SessionEnd::Lost(e),
            };
            for m in messages {
                if let Some(end) = executor.handle(m, &control).await {
                    return end;
                }
            }
        }
    }
}

impl Executor {
    /// An executor of `spec`'s job, its data transport bound on `ip`.
    fn new(spec: JobSpec, ip: IpAddr) -> Result<Executor, JobError> {
        let runtime = TaskRuntime::new()?;
        let placement = Arc::new(Placement::new(&spec.job));
        // The transport's connections run on the subtasks' runtime.
        let entered = runtime.handle().enter();
        let transport = ClusterTransport::bind(
            (ip, 0).into(),
            ChannelConfig {
                buffers_per_channel: spec.config.buffers_per_channel,
            },
            placement,
        )
        .map_err(|e| JobError::Invalid(format!("the task manager's data transport: {e}")))?;
        drop(entered);
        let transport = Arc::new(transport);
        let data: Arc<dyn Transport> = match &spec.config.transport {
            Some(layer) => layer.apply(transport.clone()),
            None => transport.clone(),
        };
        let spec_vertices: Vec<(u32, u32)> = spec
            .job
            .vertices
            .iter()
            .map(|v| (v.id.0, v.parallelism))
            .collect();
        Ok(Executor {
            runtime,
            fingerprint: graph_fingerprint(&spec.job),
            spec,
            transport,
            data,
            started: Instant::now(),
            metrics: Arc::new(JobMetrics {
                vertex_records: crate::job::new_vertex_counters(spec_vertices.into_iter()),
                ..JobMetrics::default()
            }),
            targets: Arc::new(Targets::default()),
            chain_epoch: Arc::new(AtomicU64::new(0)),
            storages: HashMap::new(),
            running: BTreeMap::new(),
            reports: mpsc::unbounded_channel().0,
            job: None,
        })
    }

    /// Subtasks of job `id` were deployed here: remembered from the first deployment on.
    fn job_deployed(&mut self, id: JobId) {
        let id = id.to_string();
        if self.job.as_ref().is_none_or(|j| j.id != id) {
            self.job = Some(PastJob {
                id,
                name: self.spec.config.job_name.clone(),
                state: "RUNNING".into(),
                start_time_ms: wall_ms(),
                end_time_ms: 0,
            });
        }
    }

    /// The job is over (or its job manager lost for good), in `state`.
    fn job_ended(&mut self, state: &str) {
        if let Some(j) = self.job.as_mut().filter(|j| j.end_time_ms == 0) {
            j.state = state.to_string();
            j.end_time_ms = wall_ms();
        }
    }

    /// What a task manager reports of its job: the records and bytes it sent.
    fn result(&self) -> JobResult {
        JobResult {
            job_id: JobId::from_name(&self.spec.config.job_name),
            status: JobStatus::Finished,
            duration: self.started.elapsed(),
            running_duration: None,
            bytes_sent: self.transport.bytes_sent(),
            source_records: self.metrics.source_records.load(Ordering::Relaxed),
            checkpoints_completed: 0,
            checkpoints_failed: 0,
            restarts: 0,
            checkpoint_durations: Vec::new(),
            checkpoint_in_flight: Vec::new(),
            checkpoint_history: Vec::new(),
            recovery_times: Vec::new(),
            latest_checkpoint: None,
            restored_from: None,
            restore_files: self.metrics.restore_files.read(),
            source_records_since_restore: self.metrics.source_records.load(Ordering::Relaxed),
            savepoint: None,
            trigger_refusals: 0,
        }
    }

    /// Forgets what belonged to the session that ended: a job manager started again numbers
    /// its generations and snapshots from 1 and its chain epochs from 0, so no channel, target
    /// or epoch of the last session may linger under the same numbers.
    fn end_session(&mut self) {
        self.data.release_before(u64::MAX);
        if let Ok(mut t) = self.targets.lock() {
            t.clear();
        }
        self.chain_epoch.store(0, Ordering::Release);
        if let Ok(mut f) = self.metrics.first_record_us.lock() {
            f.clear();
        }
    }

    fn storage(&mut self, root: Option<&str>) -> Result<Arc<dyn CheckpointStorage>, String> {
        let Some(root) = root else {
            return OpendalCheckpointStorage::memory()
                .map(|s| Arc::new(s) as Arc<dyn CheckpointStorage>)
                .map_err(|e| e.to_string());
        };
        if let Some(s) = self.storages.get(root) {
            return Ok(s.clone());
        }
        let config = StorageConfig::from_location(root).map_err(|e| e.to_string())?;
        let storage = build_storage(&config).map_err(|e| e.to_string())?;
        self.storages.insert(root.to_string(), storage.clone());
        Ok(storage)
    }

    async fn handle(
        &mut self,
        message: ToTaskManager,
        control: &mpsc::UnboundedSender<FromTaskManager>,
    ) -> Option<SessionEnd> {
        match message {
            ToTaskManager::Deploy(deploy) => self.deploy(*deploy).await,

            ToTaskManager::Task {
                generation,
                task,
                message,
            } => {
                // An assigned split is in no enumerator snapshot any more: if it cannot be
                // delivered, the subtask fails (and the job restores) rather than lose it, as
                // in one process.
                let is_split = matches!(message, TaskMessage::Splits(_));
                let delivered = self
                    .running
                    .get(&generation)
                    .is_some_and(|r| r.send(task, message));
                if !delivered && is_split {
                    let _ = self.reports.send(TaskReport {
                        generation,
                        task,
                        event: TaskEvent::Failed(TaskError::Operator {
                            operator: "split assignment".into(),
                            message: format!(
                                "cannot deliver a split assignment to {task}: its mailbox is full or closed"
                            ),
                        }),
                    });
                } else if !delivered {
                    debug!(%task, generation, "a message for a subtask that is not running here");
                }
            }
            ToTaskManager::SavepointTarget { id, root, dir } => match self.storage(Some(&root)) {
                Ok(storage) => {
                    info_span!("checkpoint", id = id.0)
                        .in_scope(|| info!(%root, %dir, "savepoint target taken"));
                    if let Ok(mut t) = self.targets.lock() {
                        t.insert(id, (storage, CheckpointLocation { dir }));
                    }
                    let _ = control.send(FromTaskManager::TargetSet(id));
                }
                Err(e) => warn!(checkpoint = id.0, error = %e, "cannot open a savepoint's storage"),
            },
            ToTaskManager::ClearTarget(id) => {
                if let Ok(mut t) = self.targets.lock() {
                    t.remove(&id);
                }
            }
            ToTaskManager::ChainEpoch(epoch) => {
                self.chain_epoch.fetch_max(epoch, Ordering::AcqRel);
            }
            ToTaskManager::Stop {
                generation,
                finished,
            } => {
                if let Some(mut r) = self.running.remove(&generation) {
                    // After a finished job, a subtask killed before its final commit fails, so
                    // that the job master fails over rather than declare the job finished.
                    for (task, name) in r.stop(finished, TEARDOWN_WAIT).await {
                        let _ = control.send(FromTaskManager::Report(TaskReport {
                            generation,
                            task,
                            event: TaskEvent::Failed(TaskError::EndedBeforeFinalCommit {
                                task: name,
                            }),
                        }));
                    }
                    let give_up = Instant::now() + UPLOAD_WAIT;
                    while !r.uploads_idle() && Instant::now() < give_up {
                        tokio::time::sleep(Duration::from_millis(2)).await;
                    }
                    if finished {
                        let results = self
                            .spec
                            .results
                            .iter()
                            .map(|h| {
                                h.encode().unwrap_or_else(|e| {
                                    warn!(error = %e, "cannot send published results");
                                    Vec::new()
                                })
                            })
                            .collect();
                        let _ = control.send(FromTaskManager::Results(results));
                    }
                }
                info!(generation, finished, "subtasks stopped");
                let _ = control.send(FromTaskManager::Stopped { generation });
            }
            ToTaskManager::Shutdown { state } => return Some(SessionEnd::Shutdown(state)),
        }
        None
    }

    async fn deploy(&mut self, deploy: Deploy) {
        let generation = deploy.generation;
        if deploy.graph_fingerprint == self.fingerprint {
            self.job_deployed(deploy.job_id);
        }
        let span = info_span!("deploy", generation);
        // A newer generation replaces any older one still here.
        let older: Vec<u64> = self.running.range(..generation).map(|(g, _)| *g).collect();
        for g in older {
            if let Some(mut r) = self.running.remove(&g) {
                r.stop(false, TEARDOWN_WAIT).await;
            }
        }
        self.data.release_before(generation);
        let keys: Vec<_> = deploy.tasks.iter().map(|t| t.task).collect();
        let failures = self.reports.clone();
        let fail_all = |reason: String| {
            let reports = failures.clone();
            let tasks = keys.clone();
            async move {
                for task in tasks {
                    let _ = reports.send(TaskReport {
                        generation,
                        task,
                        event: TaskEvent::Failed(TaskError::Operator {
                            operator: "deployment".into(),
                            message: reason.clone(),
                        }),
                    });
                }
            }
        };
        if deploy.graph_fingerprint != self.fingerprint {
            let reason = "this task manager built another job graph than the job manager: start every process with the same program and job arguments".to_string();
            span.in_scope(|| warn!(%reason, "deployment refused"));
            fail_all(reason).await;
            return;
        }
        let storage = match self.storage(deploy.storage.as_deref()) {
            Ok(s) => s,
            Err(e) => {
                fail_all(format!("cannot open the checkpoint storage: {e}")).await;
                return;
            }
        };
        // A restore point outside the job's storage (a savepoint elsewhere): opened here from
        // its location, so that the subtasks download their keyed sections from it themselves.
        let mut deploy = deploy;
        for t in &mut deploy.tasks {
            for state in t.restore.operators.values_mut() {
                for r in &mut state.keyed {
                    let crate::operator::KeyedSections::Stored {
                        storage_location: Some(location),
                        storage,
                        ..
                    } = &mut r.sections
                    else {
                        continue;
                    };
                    match self.storage(Some(location)) {
                        Ok(s) => *storage = Some(s),
                        Err(e) => {
                            fail_all(format!(
                                "cannot open the storage of the restore point {location}: {e}"
                            ))
                            .await;
                            return;
                        }
                    }
                }
            }
        }
        self.chain_epoch
            .fetch_max(deploy.chain_epoch, Ordering::AcqRel);
        self.transport.place(generation, &deploy.placement);
        let names: Vec<String> = keys.iter().map(|t| t.to_string()).collect();
        let tasks = ProcessTasks {
            spec: &self.spec,
            settings: &deploy.settings,
            transport: self.data.as_ref(),
            job_id: deploy.job_id,
            storage,
            started: self.started,
            metrics: self.metrics.clone(),
            targets: self.targets.clone(),
            chain_epoch: self.chain_epoch.clone(),
            runtime: self.runtime.handle().clone(),
        };
        match tasks.spawn(generation, deploy.tasks, &self.reports) {
            Ok(running) => {
                span.in_scope(|| info!(subtasks = %names.join(" "), "deployed"));
                self.running.insert(generation, running);
            }
            Err(e) => {
                span.in_scope(|| warn!(error = %e, "deployment failed"));
                fail_all(format!("cannot build the subtasks: {e}")).await;
            }
        }
    }
}

/// How often the vertices' counters go to the job manager, at most.
const VERTEX_COUNTS_EVERY: Duration = Duration::from_millis(250);

/// The vertices' counters as this session sends them: since the session began.
struct VertexCountsSent {
    base: crate::job::VertexCounts,
    last: crate::job::VertexCounts,
    at: Instant,
}

impl VertexCountsSent {
    fn new(metrics: &JobMetrics) -> VertexCountsSent {
        let base = crate::job::read_vertex_counters(&metrics.vertex_records);
        VertexCountsSent {
            last: base
                .iter()
                .map(|(v, _, ns)| (*v, 0, vec![0; ns.len()]))
                .collect(),
            base,
            at: Instant::now(),
        }
    }

    /// The counts since the session began, if they changed and the last were sent a while
    /// ago.
    fn changed(&mut self, metrics: &JobMetrics) -> Option<crate::job::VertexCounts> {
        if self.at.elapsed() < VERTEX_COUNTS_EVERY {
            return None;
        }
        let now = crate::job::read_vertex_counters(&metrics.vertex_records);
        let counts: crate::job::VertexCounts = now
            .into_iter()
            .zip(&self.base)
            .map(|((v, records, ns), (_, base_records, base_ns))| {
                let ns = ns
                    .iter()
                    .zip(base_ns)
                    .map(|(n, b)| n.saturating_sub(*b))
                    .collect();
                (v, records.saturating_sub(*base_records), ns)
            })
            .collect();
        if counts == self.last {
            return None;
        }
        self.at = Instant::now();
        self.last = counts.clone();
        Some(counts)
    }
}

/// Sends the subtasks' reports and the executor's own messages to the job manager, in order,
/// with the source count and first-record times.
async fn forward(
    session: &TaskManagerSession,
    reports: &mut mpsc::UnboundedReceiver<TaskReport>,
    control: &mut mpsc::UnboundedReceiver<FromTaskManager>,
    metrics: &JobMetrics,
) -> SessionEnd {
    let mut tick = tokio::time::interval(METRICS_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // Counts are per session: the job manager knows this task manager under a new id each time.
    let base_records = metrics.source_records.load(Ordering::Relaxed);
    let mut sent_records = 0u64;
    let mut vertices = VertexCountsSent::new(metrics);
    let mut sent_firsts = 0usize;
    let within = session.registration().heartbeat_timeout;
    loop {
        let mut batch = Vec::new();
        tokio::select! {
            biased;
            Some(r) = reports.recv() => batch.push(FromTaskManager::Report(r)),
            Some(c) = control.recv() => {
                // What the subtasks reported before this message goes first (the late
                // acknowledgements before a stop's answer).
                while let Ok(r) = reports.try_recv() {
                    batch.push(FromTaskManager::Report(r));
                }
                batch.push(c);
            }
            _ = tick.tick() => {}
        }
        while batch.len() < REPORT_BATCH {
            match reports.try_recv() {
                Ok(r) => batch.push(FromTaskManager::Report(r)),
                Err(_) => break,
            }
        }
        for m in &batch {
            if let FromTaskManager::Report(TaskReport {
                task,
                event: TaskEvent::Acknowledge { id, metrics, .. },
                ..
            }) = m
            {
                info_span!("checkpoint", id = id.0).in_scope(|| {
                    debug!(%task, size = metrics.state_size, sync = ?metrics.sync_duration, async_ = ?metrics.async_duration, "acknowledging");
                });
            }
        }
        let records = metrics
            .source_records
            .load(Ordering::Relaxed)
            .saturating_sub(base_records);
        if records != sent_records {
            sent_records = records;
            batch.push(FromTaskManager::SourceRecords(records));
        }
        if let Some(counts) = vertices.changed(metrics) {
            batch.push(FromTaskManager::VertexCounts(counts));
        }
        if let Ok(firsts) = metrics.first_record_us.lock()
            && firsts.len() > sent_firsts
        {
            for (generation, _) in &firsts[sent_firsts..] {
                batch.push(FromTaskManager::FirstRecord {
                    generation: *generation,
                });
            }
            sent_firsts = firsts.len();
        }
        if batch.is_empty() {
            continue;
        }
        let bytes = match encode(&batch) {
            Ok(b) => b,
            Err(e) => {
                warn!(error = %e, "dropped reports that cannot be encoded");
                continue;
            }
        };
        // Retried until it goes through or the heartbeats give the job manager up.
        loop {
            match session.report(bytes.clone(), within).await {
                Ok(()) => break,
                Err(e @ RpcError::NotRegistered(_)) => return SessionEnd::Lost(e.to_string()),
                Err(e) => {
                    debug!(error = %e, "report failed; retrying");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
    }
}
