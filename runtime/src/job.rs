//! [`JobClient`]: how a program talks to its running job (cancel, trigger a checkpoint or a
//! savepoint, stop with a savepoint, read the checkpoint statistics). The job master it talks to
//! is the `master` module.

use crate::error::JobError;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;
use tokio::sync::{Notify, mpsc, oneshot};
use weir_checkpoint::coordinator::{CheckpointCoordinator, CheckpointStats};
use weir_core::element::SnapshotKind;

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
    /// The job as the master last described it (for the REST API and metrics).
    view: std::sync::Mutex<JobView>,
    /// Records and backpressure per vertex over every attempt in this process. Made by the
    /// master at the job's start.
    vertex_records: std::sync::Mutex<Arc<VertexRecords>>,
}

/// What the tasks of one vertex count, over every attempt in this process.
#[derive(Debug, Default)]
pub(crate) struct VertexCounters {
    /// What a source vertex emitted, what another processed.
    pub records: AtomicU64,
    /// Per subtask: ns its task waited for credits with output queued (Flink's back-pressured
    /// time), over the waits that ended. One add per wait, not per record.
    pub backpressured_ns: Box<[AtomicU64]>,
    /// Per subtask: when its current wait for credits began (ns since the Unix epoch, on the
    /// job's clock), 0 when it is not waiting: a wait that lasts is counted as it goes.
    pub backpressured_since_ns: Box<[AtomicU64]>,
}

/// Each vertex's counters read at one moment: its id, its records, and per subtask the
/// back-pressured ns.
pub(crate) type VertexCounts = Vec<(u32, u64, Vec<u64>)>;

/// Fresh counters for `vertices` (id, parallelism).
pub(crate) fn new_vertex_counters(
    vertices: impl Iterator<Item = (u32, u32)>,
) -> Arc<VertexRecords> {
    Arc::new(
        vertices
            .map(|(v, parallelism)| {
                let counters = VertexCounters {
                    records: AtomicU64::new(0),
                    backpressured_ns: (0..parallelism).map(|_| AtomicU64::new(0)).collect(),
                    backpressured_since_ns: (0..parallelism).map(|_| AtomicU64::new(0)).collect(),
                };
                (v, counters)
            })
            .collect(),
    )
}

/// Every vertex's counters now: records, and per subtask the back-pressured ns (a current wait
/// included).
pub(crate) fn read_vertex_counters(counters: &VertexRecords) -> VertexCounts {
    let now_ns = weir_core::sim::wall_clock().as_nanos() as u64;
    counters
        .iter()
        .map(|(v, c)| {
            let ns = (0..c.backpressured_ns.len())
                .map(|i| c.backpressured_at(i, now_ns))
                .collect();
            (*v, c.records.load(Ordering::Relaxed), ns)
        })
        .collect()
}

impl VertexCounters {
    /// Subtask `i`'s back-pressured ns at `now_ns`, the current wait included.
    fn backpressured_at(&self, i: usize, now_ns: u64) -> u64 {
        let ended = self.backpressured_ns[i].load(Ordering::Relaxed);
        let since = self.backpressured_since_ns[i].load(Ordering::Relaxed);
        ended
            + if since == 0 {
                0
            } else {
                now_ns.saturating_sub(since)
            }
    }
}

/// Counters per vertex id.
pub(crate) type VertexRecords = std::collections::BTreeMap<u32, VertexCounters>;

/// One vertex's counters read at one moment (see [`JobClient::vertex_metrics`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct VertexSample {
    /// Records so far: a source vertex's emitted records, another vertex's processed ones.
    pub records: u64,
    /// Per subtask: ms its task waited for credits so far (back-pressured time).
    pub backpressured_ms: Vec<u64>,
}

/// A running job as its master describes it to the outside: what the REST API and the
/// metrics report besides the checkpoint statistics.
#[derive(Clone, Debug, Default)]
pub struct JobView {
    /// The job's id (32 hex digits, as Flink's `JobID`).
    pub job_id: String,
    /// Its name.
    pub name: String,
    /// `CREATED`, `RUNNING`, `FINISHED`, `CANCELED` or `FAILED` (Flink's job statuses).
    pub state: &'static str,
    /// When it started, ms since the Unix epoch.
    pub start_time_ms: u64,
    /// When it ended, if it has.
    pub end_time_ms: Option<u64>,
    /// Restarts so far (Flink's `numRestarts`).
    pub restarts: u32,
    /// Its vertices (chains): id, name, parallelism.
    pub vertices: Vec<(u32, String, u32)>,
    /// The ids of the vertices that are sources.
    pub source_vertices: Vec<u32>,
    /// Its exchanges: producer vertex, consumer vertex, how records pick a channel (Flink's
    /// ship strategy: `FORWARD`, `REBALANCE`, `HASH`, `BROADCAST`).
    pub edges: Vec<(u32, u32, &'static str)>,
    /// The checkpoint configuration it runs with.
    pub checkpoint_config: Option<weir_core::config::CheckpointConfig>,
    /// The state backend's and checkpoint storage's names.
    pub state_backend: String,
    /// Where checkpoints go (credentials never appear: a location, not a configuration).
    pub checkpoint_storage: String,
    /// Checkpoints completed and failed in all (the history keeps the last few).
    pub completed: u64,
    /// Failed in all.
    pub failed: u64,
    /// The checkpoint or savepoint this run was restored from, if any.
    pub restored_from: Option<String>,
    /// Where its REST API listens, if it serves one.
    pub rest_address: Option<String>,
    /// The last restore of this run, if it restored (after a failure, or at its start).
    pub last_restore: Option<RestoreView>,
    /// Restores in this run (Flink's `counts.restored`).
    pub restores: u64,
    /// In cluster mode, the jobs that ran on the cluster before this one, as its standing task
    /// managers remember them.
    pub past_jobs: Vec<PastJob>,
}

/// A job that ran on the cluster, as a task manager remembers it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PastJob {
    /// Its id (32 hex digits).
    pub id: String,
    /// Its name.
    pub name: String,
    /// How it ended: `FINISHED`, `CANCELED`, `FAILED`, or `SUSPENDED` when its job manager was
    /// lost before it said.
    pub state: String,
    /// When this task manager was first deployed its subtasks, ms since the Unix epoch.
    pub start_time_ms: u64,
    /// When it heard the job was over (or lost its job manager).
    pub end_time_ms: u64,
}

/// One restore of a running job.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RestoreView {
    /// The restored checkpoint's id.
    pub checkpoint_id: u64,
    /// Where it is.
    pub path: String,
    /// Whether it was a savepoint.
    pub is_savepoint: bool,
    /// When the restore began, ms since the Unix epoch.
    pub timestamp_ms: u64,
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
                view: std::sync::Mutex::new(JobView {
                    state: "CREATED",
                    ..JobView::default()
                }),
                vertex_records: std::sync::Mutex::new(Arc::new(VertexRecords::new())),
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
    /// Live tuning of checkpointing.
    Retune {
        tuning: weir_core::config::CheckpointTuning,
        reply: oneshot::Sender<Result<weir_core::config::CheckpointConfig, String>>,
    },
}

impl JobClient {
    /// Requests cancellation.
    pub fn cancel(&self) {
        self.inner.cancelled.store(true, Ordering::SeqCst);
        self.inner.notify.notify_waiters();
    }

    pub(crate) async fn cancelled(&self) {
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

    /// Changes the running job's checkpointing (interval, timeout, min pause, tolerable
    /// failures; Flink has no such thing, RisingWave's `ALTER SYSTEM SET barrier_interval_ms`
    /// does): the next periodic checkpoint is due one new interval from now at the latest, and
    /// every checkpoint from now on records the change, so a restore from it keeps it. Returns
    /// the configuration the job now runs with.
    pub async fn retune_checkpoints(
        &self,
        tuning: weir_core::config::CheckpointTuning,
    ) -> Result<weir_core::config::CheckpointConfig, JobError> {
        let (reply, answer) = oneshot::channel();
        self.inner
            .commands
            .send(Command::Retune { tuning, reply })
            .await
            .map_err(|_| JobError::Invalid("the job is not running".into()))?;
        answer
            .await
            .map_err(|_| JobError::Invalid("the job ended before the change applied".into()))?
            .map_err(JobError::Invalid)
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

    /// The job as its master last described it.
    pub fn view(&self) -> JobView {
        self.inner
            .view
            .lock()
            .map(|v| v.clone())
            .unwrap_or_default()
    }

    /// Records per vertex so far (in this process): a source vertex's emitted records, another
    /// vertex's processed ones (Flink's `numRecordsOut` and `numRecordsIn`).
    pub fn vertex_records(&self) -> std::collections::BTreeMap<u32, u64> {
        self.vertex_metrics()
            .into_iter()
            .map(|(v, s)| (v, s.records))
            .collect()
    }

    /// Each vertex's counters now (in this process): records, and per subtask the time it was
    /// back-pressured.
    pub fn vertex_metrics(&self) -> std::collections::BTreeMap<u32, VertexSample> {
        let counters = self
            .inner
            .vertex_records
            .lock()
            .map(|c| c.clone())
            .unwrap_or_default();
        read_vertex_counters(&counters)
            .into_iter()
            .map(|(v, records, ns)| {
                let sample = VertexSample {
                    records,
                    backpressured_ms: ns.iter().map(|n| n / 1_000_000).collect(),
                };
                (v, sample)
            })
            .collect()
    }

    /// Fresh counters for `vertices` (id, parallelism), shared with the job's tasks.
    pub(crate) fn vertex_counters(
        &self,
        vertices: impl Iterator<Item = (u32, u32)>,
    ) -> Arc<VertexRecords> {
        let counters = new_vertex_counters(vertices);
        if let Ok(mut c) = self.inner.vertex_records.lock() {
            *c = counters.clone();
        }
        counters
    }

    /// Whether cancellation was requested.
    pub fn is_cancelled(&self) -> bool {
        self.inner.cancelled.load(Ordering::SeqCst)
    }

    pub(crate) fn update_view(&self, f: impl FnOnce(&mut JobView)) {
        if let Ok(mut v) = self.inner.view.lock() {
            f(&mut v);
        }
    }

    /// Publishes `coordinator`'s statistics; `before` counts the checkpoints completed and
    /// failed in earlier attempts.
    pub(crate) fn publish_stats(&self, coordinator: &CheckpointCoordinator, before: (u64, u64)) {
        if let Ok(mut s) = self.inner.stats.lock() {
            *s = coordinator.history().cloned().collect();
        }
        let (completed, failed) = coordinator.counts();
        self.update_view(|v| {
            v.completed = before.0 + completed;
            v.failed = before.1 + failed;
        });
        if let Ok(mut r) = self.inner.refusals.lock() {
            *r = coordinator
                .refusals()
                .map(|(t, why)| (*t, why.to_string()))
                .collect();
        }
    }

    pub(crate) fn take_commands(&self) -> Option<mpsc::Receiver<Command>> {
        self.inner.receiver.lock().ok().and_then(|mut r| r.take())
    }

    /// The counter of source records the job's metrics share with this client.
    pub(crate) fn source_records_counter(&self) -> Arc<AtomicU64> {
        self.inner.source_records.clone()
    }
}
