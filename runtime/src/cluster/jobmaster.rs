//! The job manager's side of running a job on task managers: waiting for slots, placing each
//! generation's subtasks, delivering the master's messages in order, and routing what task
//! managers report (subtask reports, source counts, published results) back to the master. A
//! task manager that is lost while it runs subtasks fails them, which the restart strategy
//! handles like any task failure.

use super::jobmanager::{Incoming, JobManagerServer, Outboxes};
use super::membership::{MembershipEvent, TaskManagerId, TaskManagerInfo};
use super::protocol::{Deploy, FromTaskManager, ToTaskManager, decode, encode};
use super::{HeartbeatConfig, JobManagerOptions};
use crate::error::{JobError, TaskError};
use crate::host::TaskHost;
use crate::placement::{place_on_slots, slots_needed};
use crate::sink::SharedResult;
use crate::spec::{TaskDeployment, TaskSettings};
use crate::task::{JobMetrics, TaskEvent, TaskMessage, TaskReport};
use async_trait::async_trait;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio::sync::{Notify, mpsc};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tracing::{debug, info, info_span, warn};
use weir_checkpoint::CheckpointStorage;
use weir_checkpoint::coordinator::TaskKey;
use weir_checkpoint::storage::CheckpointLocation;
use weir_core::graph::JobGraph;
use weir_core::ids::{CheckpointId, JobId};

/// How long a stop waits for task managers to report their subtasks and uploads stopped, at
/// least: past the heartbeat timeout, so that a dead one is declared lost first.
const STOP_WAIT: Duration = Duration::from_secs(25);
/// How long a savepoint's target may take to reach every task manager.
const TARGET_WAIT: Duration = Duration::from_secs(10);
/// How long the job manager waits, at the end, for task managers to take their shutdown.
const SHUTDOWN_WAIT: Duration = Duration::from_secs(3);

/// What a deployment tells every task manager, besides its own subtasks.
pub(crate) struct DeployCommon {
    pub job_id: JobId,
    pub graph_fingerprint: u128,
    pub settings: TaskSettings,
    pub storage: Option<String>,
    pub chain_epoch: u64,
}

/// Subtasks on task managers, as the job master's [`TaskHost`].
pub(crate) struct RemoteHost<'s> {
    pub gateway: RemoteGateway,
    pub job: &'s JobGraph,
    pub job_id: JobId,
    pub settings: TaskSettings,
    /// Where task managers find the checkpoint storage.
    pub storage_root: Option<String>,
    pub chain_epoch: Arc<AtomicU64>,
}

#[async_trait]
impl TaskHost for RemoteHost<'_> {
    async fn deploy(
        &mut self,
        generation: u64,
        mut tasks: Vec<TaskDeployment>,
        reports: mpsc::UnboundedSender<TaskReport>,
    ) -> Result<(), JobError> {
        crate::restore::fetch_foreign_native(&mut tasks).await?;
        let common = DeployCommon {
            job_id: self.job_id,
            graph_fingerprint: super::taskexecutor::graph_fingerprint(self.job),
            settings: self.settings.clone(),
            storage: self.storage_root.clone(),
            chain_epoch: self.chain_epoch.load(Ordering::Acquire),
        };
        self.gateway
            .deploy(generation, self.job, common, tasks, reports)
            .await
    }

    fn send(&self, task: TaskKey, message: TaskMessage) -> bool {
        self.gateway.send(task, message)
    }

    async fn announce_target(
        &self,
        id: CheckpointId,
        storage: &dyn CheckpointStorage,
        root: Option<String>,
        location: &CheckpointLocation,
    ) -> Result<(), String> {
        let root = root.ok_or_else(|| {
            format!(
                "the snapshot goes to {}, which task managers cannot reach: use a directory \
                 path or s3://",
                storage.describe()
            )
        })?;
        self.gateway.set_target(id, root, location.clone()).await
    }

    fn clear_target(&self, id: CheckpointId) {
        self.gateway.clear_target(id);
    }

    fn chain_epoch_raised(&self, epoch: u64) {
        self.gateway.set_chain_epoch(epoch);
    }

    async fn stop(&mut self, finished: bool, _wait: Duration) -> Vec<String> {
        // Task managers report their killed subtasks and their own loss as task failures.
        self.gateway.stop(finished).await;
        Vec::new()
    }

    fn uploads_idle(&self) -> bool {
        // `stop` waited for the task managers' uploads.
        true
    }

    async fn shutdown(&self, state: &'static str) {
        self.gateway.shutdown(state).await;
    }
}

/// What the router shares with the gateway.
#[derive(Default)]
struct RouterState {
    members: BTreeMap<TaskManagerId, TaskManagerInfo>,
    generation: u64,
    placement: HashMap<TaskKey, TaskManagerId>,
    /// Task managers running subtasks of the current generation.
    hosting: BTreeSet<TaskManagerId>,
    /// Of those, the ones whose subtasks have stopped (or that are gone).
    stopped: BTreeSet<TaskManagerId>,
    target_acks: HashMap<CheckpointId, BTreeSet<TaskManagerId>>,
    /// Where the current generation's reports go, while it runs.
    reports: Option<mpsc::UnboundedSender<TaskReport>>,
    /// Each task manager's latest count of records its sources emitted.
    source_counts: HashMap<TaskManagerId, u64>,
    /// What each task manager (session) last reported of the vertices' counters; the job's
    /// are their sums, kept after a task manager is lost.
    vertex_counts: BTreeMap<TaskManagerId, crate::job::VertexCounts>,
}

/// What the router needs from the job.
struct RouterContext {
    metrics: Arc<JobMetrics>,
    started: Instant,
    results: Vec<Arc<dyn SharedResult>>,
    /// The job's client: the jobs registering task managers ran before are listed in its view.
    client: crate::job::JobClient,
}

/// The master's way to subtasks running on task managers.
pub(crate) struct RemoteGateway {
    addr: SocketAddr,
    state: Arc<Mutex<RouterState>>,
    changed: Arc<Notify>,
    outboxes: Outboxes,
    router: JoinHandle<()>,
    slot_timeout: Duration,
    stop_wait: Duration,
}

fn lock(state: &Mutex<RouterState>) -> MutexGuard<'_, RouterState> {
    state.lock().unwrap_or_else(|p| p.into_inner())
}

impl Drop for RemoteGateway {
    fn drop(&mut self) {
        self.router.abort();
    }
}

impl RemoteGateway {
    /// Starts the job manager's control plane on `options.listen`.
    pub async fn start(
        options: &JobManagerOptions,
        fingerprint: u128,
        metrics: Arc<JobMetrics>,
        started: Instant,
        results: Vec<Arc<dyn SharedResult>>,
        client: crate::job::JobClient,
    ) -> Result<RemoteGateway, JobError> {
        let heartbeat: HeartbeatConfig = options.heartbeat;
        let job_id = client.view().job_id;
        let server = JobManagerServer::start_with_arguments(
            options.listen,
            heartbeat,
            Some(fingerprint),
            options.job_args.clone().map(|args| (job_id, args)),
        )
        .await
        .map_err(JobError::Invalid)?;
        let addr = server.local_addr();
        let state = Arc::new(Mutex::new(RouterState::default()));
        let changed = Arc::new(Notify::new());
        let outboxes = server.outboxes();
        let router = tokio::spawn(route(
            server,
            state.clone(),
            changed.clone(),
            RouterContext {
                metrics,
                started,
                results,
                client,
            },
        ));
        Ok(RemoteGateway {
            addr,
            state,
            changed,
            outboxes,
            router,
            slot_timeout: options.slot_timeout,
            stop_wait: STOP_WAIT.max(heartbeat.timeout + Duration::from_secs(5)),
        })
    }

    /// Where task managers register.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    fn post(&self, tm: TaskManagerId, message: &ToTaskManager) -> bool {
        match encode(std::slice::from_ref(message)) {
            Ok(bytes) => self.outboxes.post(tm, bytes),
            Err(e) => {
                warn!(task_manager = %tm, error = %e, "cannot send to a task manager");
                false
            }
        }
    }

    /// Waits until `until` holds of the router's state, or `deadline`.
    async fn wait_for(
        &self,
        deadline: Instant,
        mut until: impl FnMut(&RouterState) -> bool,
    ) -> bool {
        loop {
            let notified = self.changed.notified();
            if until(&lock(&self.state)) {
                return true;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return until(&lock(&self.state));
            }
        }
    }

    /// Deploys `tasks` of `generation` on the registered task managers, once they offer enough
    /// slots (one slot runs one subtask of every vertex, as with Flink's slot sharing); their
    /// reports go to `reports`.
    pub async fn deploy(
        &mut self,
        generation: u64,
        job: &JobGraph,
        common: DeployCommon,
        mut tasks: Vec<TaskDeployment>,
        reports: mpsc::UnboundedSender<TaskReport>,
    ) -> Result<(), JobError> {
        let needed = slots_needed(job);
        let enough =
            |s: &RouterState| s.members.values().map(|i| i.slots as usize).sum::<usize>() >= needed;
        if !enough(&lock(&self.state)) {
            info!(needed, "waiting for task managers to offer slots");
        }
        let give_up = Instant::now() + self.slot_timeout;
        let (by_tm, placement) = loop {
            if !self.wait_for(give_up, enough).await {
                let st = lock(&self.state);
                return Err(JobError::NoResources(format!(
                    "the job needs {needed} slots, and within {:?} the registered task managers offer {} ({} task managers)",
                    self.slot_timeout,
                    st.members.values().map(|i| i.slots).sum::<u32>(),
                    st.members.len()
                )));
            }
            let mut st = lock(&self.state);
            // Slot i runs subtask i of every vertex.
            let slots: Vec<(TaskManagerId, SocketAddr)> = st
                .members
                .iter()
                .flat_map(|(id, info)| (0..info.slots).map(move |_| (*id, info.data_addr)))
                .collect();
            // A task manager was lost since the wait: wait again.
            if slots.len() < needed {
                continue;
            }
            let mut placement = Vec::new();
            st.placement.clear();
            for (task, (tm, addr)) in place_on_slots(job, &slots) {
                placement.push((task.vertex, task.subtask, addr));
                st.placement.insert(task, tm);
            }
            let mut by_tm: BTreeMap<TaskManagerId, Vec<TaskDeployment>> = BTreeMap::new();
            for t in std::mem::take(&mut tasks) {
                let Some(tm) = st.placement.get(&t.task).copied() else {
                    return Err(JobError::Invalid(format!(
                        "subtask {} is not in the job graph",
                        t.task
                    )));
                };
                by_tm.entry(tm).or_default().push(t);
            }
            st.generation = generation;
            st.hosting = by_tm.keys().copied().collect();
            st.stopped.clear();
            st.target_acks.clear();
            st.reports = Some(reports.clone());
            break (by_tm, placement);
        };
        for (tm, tasks) in by_tm {
            let names: Vec<String> = tasks.iter().map(|t| t.task.to_string()).collect();
            info_span!("deploy", generation, task_manager = %tm)
                .in_scope(|| info!(subtasks = %names.join(" "), "deploying"));
            let deploy = ToTaskManager::Deploy(Box::new(Deploy {
                generation,
                job_id: common.job_id,
                graph_fingerprint: common.graph_fingerprint,
                settings: common.settings.clone(),
                storage: common.storage.clone(),
                chain_epoch: common.chain_epoch,
                placement: placement.clone(),
                tasks,
            }));
            if !self.post(tm, &deploy) {
                // Lost between the count and now: its subtasks fail, and the job restarts.
                let (first, reports) = {
                    let st = lock(&self.state);
                    let first = st
                        .placement
                        .iter()
                        .find(|(_, t)| **t == tm)
                        .map(|(k, _)| *k);
                    (first, st.reports.clone())
                };
                if let (Some(task), Some(reports)) = (first, reports) {
                    let _ = reports.send(TaskReport {
                        generation,
                        task,
                        event: TaskEvent::Failed(TaskError::TaskManagerLost {
                            task_manager: tm.to_string(),
                            reason: "it left before its deployment was delivered".into(),
                        }),
                    });
                }
            }
        }
        Ok(())
    }

    /// Queues `message` for `task` of the current generation; false if its task manager is
    /// gone.
    pub fn send(&self, task: TaskKey, message: TaskMessage) -> bool {
        let (tm, generation) = {
            let st = lock(&self.state);
            match st.placement.get(&task) {
                Some(tm) => (*tm, st.generation),
                None => return false,
            }
        };
        self.post(
            tm,
            &ToTaskManager::Task {
                generation,
                task,
                message,
            },
        )
    }

    fn hosting(&self) -> Vec<TaskManagerId> {
        lock(&self.state).hosting.iter().copied().collect()
    }

    /// Tells every task manager of the generation where savepoint `id` goes, and waits until
    /// each has taken it.
    pub async fn set_target(
        &self,
        id: CheckpointId,
        root: String,
        location: CheckpointLocation,
    ) -> Result<(), String> {
        let hosting = self.hosting();
        for tm in &hosting {
            self.post(
                *tm,
                &ToTaskManager::SavepointTarget {
                    id,
                    root: root.clone(),
                    dir: location.dir.clone(),
                },
            );
        }
        let all = |s: &RouterState| {
            hosting.iter().all(|tm| {
                !s.members.contains_key(tm)
                    || s.target_acks.get(&id).is_some_and(|a| a.contains(tm))
            })
        };
        if self.wait_for(Instant::now() + TARGET_WAIT, all).await {
            Ok(())
        } else {
            Err(format!(
                "the task managers did not take the savepoint's target within {TARGET_WAIT:?}"
            ))
        }
    }

    /// Tells the task managers that snapshot `id` is over.
    pub fn clear_target(&self, id: CheckpointId) {
        lock(&self.state).target_acks.remove(&id);
        for tm in self.hosting() {
            self.post(tm, &ToTaskManager::ClearTarget(id));
        }
    }

    /// Tells the task managers the job's new chain epoch.
    pub fn set_chain_epoch(&self, epoch: u64) {
        for tm in self.hosting() {
            self.post(tm, &ToTaskManager::ChainEpoch(epoch));
        }
    }

    /// Stops the current generation on every task manager running it, and waits until each
    /// reports its subtasks and uploads stopped (or is gone).
    pub async fn stop(&mut self, finished: bool) {
        let generation = lock(&self.state).generation;
        for tm in self.hosting() {
            self.post(
                tm,
                &ToTaskManager::Stop {
                    generation,
                    finished,
                },
            );
        }
        let all = |s: &RouterState| {
            s.hosting
                .iter()
                .all(|tm| s.stopped.contains(tm) || !s.members.contains_key(tm))
        };
        if !self.wait_for(Instant::now() + self.stop_wait, all).await {
            warn!(generation, wait = ?self.stop_wait, "some task managers did not report their subtasks stopped");
        }
        lock(&self.state).reports = None;
    }

    /// Tells every task manager the job is over and how it ended, and waits briefly until each
    /// has left.
    pub async fn shutdown(&self, state: &'static str) {
        let members: Vec<TaskManagerId> = lock(&self.state).members.keys().copied().collect();
        for tm in &members {
            self.post(
                *tm,
                &ToTaskManager::Shutdown {
                    state: state.to_string(),
                },
            );
        }
        let gone = |s: &RouterState| members.iter().all(|tm| !s.members.contains_key(tm));
        if !self.wait_for(Instant::now() + SHUTDOWN_WAIT, gone).await {
            warn!("some task managers did not leave after the job ended");
        }
    }
}

/// Routes membership changes and what task managers report.
async fn route(
    mut server: JobManagerServer,
    state: Arc<Mutex<RouterState>>,
    changed: Arc<Notify>,
    ctx: RouterContext,
) {
    loop {
        match server.next_incoming().await {
            None => return,
            Some(Incoming::Membership(event)) => on_membership(&state, &ctx, event).await,
            Some(Incoming::Report(tm, bytes)) => {
                match decode::<FromTaskManager>(&bytes, &tm.to_string()) {
                    Ok(messages) => {
                        for m in messages {
                            on_message(&state, &ctx, tm, m).await;
                        }
                    }
                    Err(e) => warn!(task_manager = %tm, error = %e, "dropped a report"),
                }
            }
        }
        changed.notify_waiters();
    }
}

/// The job's vertex counters: the sums of what every task manager reported (an entry for a
/// vertex or subtask the job does not have is ignored).
fn sum_vertex_counts(
    reported: &BTreeMap<TaskManagerId, crate::job::VertexCounts>,
    job: &crate::job::VertexRecords,
) {
    for (vertex, counters) in job {
        let mut records = 0u64;
        let mut ns = vec![0u64; counters.backpressured_ns.len()];
        for (v, r, per_subtask) in reported.values().flatten() {
            if v != vertex {
                continue;
            }
            records = records.saturating_add(*r);
            for (total, n) in ns.iter_mut().zip(per_subtask) {
                *total = total.saturating_add(*n);
            }
        }
        counters.records.store(records, Ordering::Relaxed);
        for (c, n) in counters.backpressured_ns.iter().zip(ns) {
            c.store(n, Ordering::Relaxed);
        }
    }
}

async fn on_membership(state: &Mutex<RouterState>, ctx: &RouterContext, event: MembershipEvent) {
    let (id, reason) = match event {
        MembershipEvent::Registered { id, info } => {
            ctx.client.update_view(|v| {
                for job in &info.past_jobs {
                    match v.past_jobs.iter_mut().find(|p| p.id == job.id) {
                        None => v.past_jobs.push(job.clone()),
                        // A task manager that saw the end knows better than one that lost
                        // its job manager first.
                        Some(known) if known.state == "SUSPENDED" && job.state != "SUSPENDED" => {
                            *known = job.clone();
                        }
                        Some(_) => {}
                    }
                }
                v.past_jobs.sort_by_key(|p| p.start_time_ms);
            });
            lock(state).members.insert(id, info);
            return;
        }
        MembershipEvent::Lost { id, silent_for, .. } => {
            (id, format!("no heartbeat for {silent_for:?}"))
        }
        MembershipEvent::Left { id, .. } => (id, "it left the cluster".to_string()),
    };
    let failure = {
        let mut st = lock(state);
        st.members.remove(&id);
        st.source_counts.remove(&id);
        if st.hosting.contains(&id) && st.stopped.insert(id) {
            let task = st
                .placement
                .iter()
                .find(|(_, t)| **t == id)
                .map(|(k, _)| *k);
            task.zip(st.reports.clone())
                .map(|(task, reports)| (task, reports, st.generation))
        } else {
            None
        }
    };
    if let Some((task, reports, generation)) = failure {
        warn!(task_manager = %id, %reason, generation, "a task manager running subtasks was lost");
        let _ = reports.send(TaskReport {
            generation,
            task,
            event: TaskEvent::Failed(TaskError::TaskManagerLost {
                task_manager: id.to_string(),
                reason,
            }),
        });
    }
}

async fn on_message(
    state: &Mutex<RouterState>,
    ctx: &RouterContext,
    tm: TaskManagerId,
    message: FromTaskManager,
) {
    match message {
        FromTaskManager::Report(report) => {
            let (reports, placed_there) = {
                let st = lock(state);
                let placed_there = st.placement.get(&report.task) == Some(&tm);
                (
                    st.reports.clone(),
                    placed_there || report.generation != st.generation,
                )
            };
            // The current generation's subtasks report only from where they were deployed.
            if !placed_there {
                warn!(task_manager = %tm, task = %report.task, "dropped a report for a subtask not deployed there");
                return;
            }
            if let TaskEvent::Acknowledge { id, .. } = &report.event {
                info_span!("checkpoint", id = id.0).in_scope(
                    || debug!(task_manager = %tm, task = %report.task, "acknowledgement received"),
                );
            }
            match reports {
                Some(r) => {
                    let _ = r.send(report);
                }
                None => {
                    debug!(task_manager = %tm, ?report.event, "a report after its generation stopped")
                }
            }
        }
        FromTaskManager::SourceRecords(total) => {
            let mut st = lock(state);
            let last = st.source_counts.entry(tm).or_insert(0);
            let delta = total.saturating_sub(*last);
            *last = (*last).max(total);
            ctx.metrics
                .source_records
                .fetch_add(delta, Ordering::Relaxed);
        }
        FromTaskManager::VertexCounts(counts) => {
            let mut st = lock(state);
            st.vertex_counts.insert(tm, counts);
            sum_vertex_counts(&st.vertex_counts, &ctx.metrics.vertex_records);
        }
        FromTaskManager::FirstRecord { generation } => {
            let us = ctx.started.elapsed().as_micros() as u64;
            if let Ok(mut v) = ctx.metrics.first_record_us.lock() {
                v.push((generation, us));
            }
        }
        FromTaskManager::TargetSet(id) => {
            lock(state).target_acks.entry(id).or_default().insert(tm);
        }
        FromTaskManager::Results(blobs) => {
            if blobs.len() != ctx.results.len() {
                warn!(task_manager = %tm, got = blobs.len(), expected = ctx.results.len(), "results for another set of result handles: is the task manager running the same job?");
            }
            for (handle, blob) in ctx.results.iter().zip(&blobs) {
                if let Err(e) = handle.merge(blob) {
                    warn!(task_manager = %tm, error = %e, "cannot merge published results");
                }
            }
        }
        FromTaskManager::Stopped { generation } => {
            let mut st = lock(state);
            if st.generation == generation {
                st.stopped.insert(tm);
            }
        }
    }
}
