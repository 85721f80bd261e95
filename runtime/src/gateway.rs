//! One deployment generation's subtasks in this process ([`ProcessTasks::spawn`], [`Running`]),
//! and the task runtime they run on. The job master runs them here in a job of one process; a
//! task manager runs what it is deployed the same way.

use crate::deploy::{BuildContext, build_task};
use crate::error::{JobError, TaskError};
use crate::operator::{Cancellation, ProcessingTimeService};
use crate::spec::{JobSpec, TaskDeployment, TaskSettings};
use crate::task::{
    IncrementalChains, JobMetrics, Targets, TaskEnv, TaskEvent, TaskMessage, TaskReport,
    panic_message, run_task,
};
use futures::FutureExt;
use std::collections::BTreeMap;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tracing::warn;
use weir_checkpoint::CheckpointStorage;
use weir_checkpoint::coordinator::TaskKey;
use weir_core::ids::JobId;
use weir_network::Transport;

/// How long a stop waits for aborted tasks to end, but for a cancelled job (which waits
/// [`crate::JobConfig::task_cancellation_timeout`]).
pub(crate) const TEARDOWN_WAIT: Duration = Duration::from_secs(10);

/// The runtime subtasks run on, apart from the one their job master (or task manager session)
/// runs on: a subtask that does not yield (an operator stuck in one record) delays neither the
/// master nor a heartbeat, so the master can give up on it. Dropping it shuts it down without
/// waiting: the thread of an abandoned subtask runs on until its operator returns.
pub(crate) struct TaskRuntime {
    runtime: Option<tokio::runtime::Runtime>,
    handle: tokio::runtime::Handle,
}

impl TaskRuntime {
    /// A multi-threaded runtime with a worker per core, its threads named `weir-runtime`: it
    /// runs what subtasks spawn (uploads), their timers and I/O; each subtask's loop has a
    /// thread of its own ([`SubtaskHandle`]).
    /// Under a simulation (`weir_core::sim`), the subtasks run on the simulation's own
    /// single-threaded runtime, the caller's, so that one seed gives one schedule.
    pub fn new() -> Result<TaskRuntime, JobError> {
        if weir_core::sim::active()
            && let Ok(handle) = tokio::runtime::Handle::try_current()
        {
            return Ok(TaskRuntime {
                runtime: None,
                handle,
            });
        }
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .thread_name("weir-runtime")
            .enable_all()
            .build()
            .map_err(|e| JobError::Invalid(format!("cannot start the task runtime: {e}")))?;
        Ok(TaskRuntime {
            handle: runtime.handle().clone(),
            runtime: Some(runtime),
        })
    }

    /// Its handle, to spawn on.
    pub fn handle(&self) -> &tokio::runtime::Handle {
        &self.handle
    }
}

impl Drop for TaskRuntime {
    fn drop(&mut self) {
        // A runtime cannot be dropped in async code; this does not wait for its threads.
        if let Some(r) = self.runtime.take() {
            r.shutdown_background();
        }
    }
}

/// What every subtask a process runs for one job shares.
pub(crate) struct ProcessTasks<'a> {
    pub spec: &'a JobSpec,
    pub settings: &'a TaskSettings,
    pub transport: &'a dyn Transport,
    pub job_id: JobId,
    pub storage: Arc<dyn CheckpointStorage>,
    pub started: Instant,
    pub metrics: Arc<JobMetrics>,
    pub targets: Arc<Targets>,
    pub chain_epoch: Arc<AtomicU64>,
    /// The runtime the subtasks run on.
    pub runtime: tokio::runtime::Handle,
}

/// One generation's subtasks running in this process.
pub(crate) struct Running {
    mailboxes: BTreeMap<TaskKey, mpsc::Sender<TaskMessage>>,
    /// Each subtask's key, name and handle.
    handles: Vec<(TaskKey, String, SubtaskHandle)>,
    uploads: Arc<AtomicUsize>,
    /// The generation's cancellation signal, raised when it is stopped other than finished.
    cancellation: Cancellation,
}

impl ProcessTasks<'_> {
    /// Builds and starts `tasks` of `generation`; they report to `reports`.
    pub fn spawn(
        &self,
        generation: u64,
        tasks: Vec<TaskDeployment>,
        reports: &mpsc::UnboundedSender<TaskReport>,
    ) -> Result<Running, JobError> {
        let mut running = Running {
            mailboxes: BTreeMap::new(),
            handles: Vec::new(),
            uploads: Arc::new(AtomicUsize::new(0)),
            cancellation: Cancellation::default(),
        };
        for deployment in tasks {
            match self.start(generation, deployment, reports, &running) {
                Ok((key, mailbox, name, handle)) => {
                    running.mailboxes.insert(key, mailbox);
                    running.handles.push((key, name, handle));
                }
                Err(e) => {
                    // None of this generation may run on: the subtasks started so far would
                    // wait for peers that never come (or, worse, emit and commit alone).
                    running.cancellation.cancel();
                    for (_, _, h) in &running.handles {
                        h.abort();
                    }
                    return Err(e);
                }
            }
        }
        Ok(running)
    }

    /// Builds and starts one subtask of `generation`, sharing `running`'s upload counter and
    /// cancellation signal: its key, mailbox, name and handle.
    fn start(
        &self,
        generation: u64,
        deployment: TaskDeployment,
        reports: &mpsc::UnboundedSender<TaskReport>,
        running: &Running,
    ) -> Result<StartedSubtask, JobError> {
        let job = &self.spec.job;
        let (uploads, cancellation) = (&running.uploads, &running.cancellation);
        let TaskDeployment {
            task: key,
            attempt,
            restore,
        } = deployment;
        {
            let v = job
                .vertices
                .iter()
                .find(|v| v.id == key.vertex && key.subtask < v.parallelism)
                .ok_or_else(|| JobError::Invalid(format!("no subtask {key} in this job")))?;
            let ours = self.spec.config.state_backend.name();
            if ours != self.settings.state_backend {
                return Err(JobError::Invalid(format!(
                    "the job manager runs the job with state backend '{}', and this process's \
                     job is built with '{ours}': every process must set the same state backend",
                    self.settings.state_backend
                )));
            }
            let processing_time = ProcessingTimeService::default();
            let ctx = BuildContext {
                transport: self.transport,
                generation,
                job,
                vertex: v,
                subtask: key.subtask,
                attempt,
                restored: restore.checkpoint.is_some(),
                batch_size: self.settings.batch_size,
                mode: self.settings.mode,
                key_hashes: &self.spec.key_hashes,
                processing_time: processing_time.clone(),
                snapshot_compression: self.settings.snapshot_compression,
                incremental: self.settings.incremental,
                state_backend: &self.spec.config.state_backend,
                cancellation: cancellation.clone(),
            };
            let input = build_task(&ctx, &self.spec.factories)
                .map_err(|e| JobError::Invalid(e.to_string()))?;
            let (mtx, mrx) = mpsc::channel(256);
            let name = format!(
                "{} ({}/{})#{attempt}",
                v.name,
                key.subtask + 1,
                v.parallelism
            );
            let env = TaskEnv {
                task: key,
                name: name.clone(),
                generation,
                job_id: self.job_id,
                head_operator: job.stream_graph.node(v.head()).operator_id,
                storage: self.storage.clone(),
                state_backend: Arc::clone(&self.spec.config.state_backend),
                reports: reports.clone(),
                mailbox: mrx,
                started: self.started,
                metrics: self.metrics.clone(),
                is_source: v.is_source,
                targets: self.targets.clone(),
                processing_time,
                chains: Arc::new(std::sync::Mutex::new(
                    IncrementalChains::with_local_recovery(
                        self.spec.config.state_backend.local_dir().map(|d| {
                            crate::local_recovery::local_recovery_dir(&d, self.job_id, key)
                        }),
                    ),
                )),
                uploads: uploads.clone(),
                chain_epoch: self.chain_epoch.clone(),
                cancellation: cancellation.clone(),
            };
            let reports = reports.clone();
            let task_name = name.clone();
            let run = async move {
                // Panics in user code are caught at each call into the chain (see
                // `task::guarded`); this catches any other panic in the task.
                let run = AssertUnwindSafe(run_task(input, env, restore)).catch_unwind();
                if let Err(panic) = run.await {
                    let message = panic_message(panic.as_ref());
                    let _ = reports.send(TaskReport {
                        generation,
                        task: key,
                        event: TaskEvent::Failed(TaskError::Panic {
                            task: name,
                            message,
                        }),
                    });
                }
            };
            let handle = SubtaskHandle::start(&self.runtime, &task_name, run)?;
            Ok((key, mtx, task_name, handle))
        }
    }
}

/// A subtask [`ProcessTasks::start`] started: its key, mailbox, name and handle.
type StartedSubtask = (TaskKey, mpsc::Sender<TaskMessage>, String, SubtaskHandle);

impl Running {
    /// Queues `message` for `task`; false if it is not here, has ended or its mailbox is full.
    pub fn send(&self, task: TaskKey, message: TaskMessage) -> bool {
        self.mailboxes
            .get(&task)
            .is_some_and(|m| m.try_send(message).is_ok())
    }

    /// Stops every subtask: after a finished job, each commits what it held for the end and
    /// exits; otherwise the generation's cancellation signal is raised (operators see it between
    /// records) and each subtask is aborted at its next await. Returns once all have stopped, so
    /// nothing of this generation runs on, or after `wait`: a subtask still running then is
    /// abandoned, like Flink's task cancellation watchdog gives up on a task (the runtime
    /// drops it at its next await; its thread is busy until its operator returns).
    ///
    /// After a finished job, returns the subtasks that ended other than by returning (killed
    /// before their final commit); those abandoned are only warned of.
    pub async fn stop(&mut self, finished: bool, wait: Duration) -> Vec<(TaskKey, String)> {
        if finished {
            for m in self.mailboxes.values() {
                if m.try_send(TaskMessage::JobFinished).is_err() {
                    warn!("a finished task did not take the job's end");
                }
            }
        } else {
            self.cancellation.cancel();
            for (_, _, h) in &self.handles {
                h.abort();
            }
        }
        let give_up = tokio::time::Instant::now() + wait;
        let (mut abandoned, mut killed) = (Vec::new(), Vec::new());
        for (key, name, mut handle) in std::mem::take(&mut self.handles) {
            // A handle that is done counts even past the deadline: it is polled first.
            match tokio::time::timeout_at(give_up, handle.ended()).await {
                Ok(true) => {}
                Ok(false) => killed.push((key, name)),
                Err(_) => {
                    // A finished job's straggler is cancelled too: it must not commit or emit
                    // after the job was declared done.
                    handle.abort();
                    abandoned.push((key, name));
                }
            }
        }
        if !abandoned.is_empty() {
            self.cancellation.cancel();
            warn!(
                tasks = ?abandoned.iter().map(|(_, n)| n).collect::<Vec<_>>(),
                ?wait,
                "tasks did not stop in time and were abandoned; their threads run on until their operators return"
            );
        }
        if finished { killed } else { Vec::new() }
    }

    /// Whether no asynchronous snapshot upload of these subtasks is running.
    pub fn uploads_idle(&self) -> bool {
        self.uploads.load(Ordering::Acquire) == 0
    }

    /// Under a simulation, what ends or freezes `task` from outside, as the loss of its task
    /// manager would; `None` for a subtask on a thread of its own (a real run).
    pub fn control(&self, task: TaskKey) -> Option<SubtaskControl> {
        self.handles.iter().find_map(|(k, _, h)| match h {
            SubtaskHandle::Task(handle, frozen) if *k == task => Some(SubtaskControl {
                abort: handle.abort_handle(),
                frozen: frozen.clone(),
            }),
            _ => None,
        })
    }
}

/// Ends or freezes one subtask of a simulation from outside ([`Running::control`]).
pub(crate) struct SubtaskControl {
    abort: tokio::task::AbortHandle,
    frozen: Arc<AtomicBool>,
}

impl SubtaskControl {
    /// The subtask ends at its next await, as if its process died: its channels close.
    pub fn kill(&self) {
        self.abort.abort();
    }

    /// The subtask is no longer polled, as if its process were stuck or cut off: it makes no
    /// progress and says nothing until it is aborted.
    pub fn freeze(&self) {
        self.frozen.store(true, Ordering::Relaxed);
    }
}

/// A running subtask. Each has a thread of its own (Flink's one thread per task), named after
/// the subtask, that drives its main loop with the task runtime's handle: records go from one
/// subtask to the next across threads, and a subtask never waits for a runtime worker that
/// another subtask occupies (on tokio's workers, a producer and the consumer it woke took
/// turns on one worker: the woken task waits in the waker's LIFO slot, which no idle worker
/// steals). What a subtask spawns (snapshot uploads) runs on the runtime's workers. Under a
/// simulation, subtasks are tasks of the simulation's runtime.
pub(crate) enum SubtaskHandle {
    /// A task of the runtime (simulation), and whether it is frozen (no longer polled).
    Task(tokio::task::JoinHandle<()>, Arc<AtomicBool>),
    /// A thread of its own.
    Thread {
        /// Ends the main loop at its next await.
        abort: futures::future::AbortHandle,
        /// Sent when the thread's main loop has returned; closed unsent when it was aborted
        /// or unwound.
        ended: tokio::sync::oneshot::Receiver<()>,
    },
}

impl SubtaskHandle {
    /// Starts `run` for the subtask `name`.
    fn start(
        runtime: &tokio::runtime::Handle,
        name: &str,
        run: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> Result<SubtaskHandle, JobError> {
        if weir_core::sim::active() {
            let frozen = Arc::new(AtomicBool::new(false));
            let flag = frozen.clone();
            let mut run = Box::pin(run);
            let run = std::future::poll_fn(move |cx| {
                if flag.load(Ordering::Relaxed) {
                    std::task::Poll::Pending
                } else {
                    run.as_mut().poll(cx)
                }
            });
            return Ok(SubtaskHandle::Task(runtime.spawn(run), frozen));
        }
        let (run, abort) = futures::future::abortable(run);
        let (done, ended) = tokio::sync::oneshot::channel::<()>();
        let handle = runtime.clone();
        std::thread::Builder::new()
            .name(name.to_string())
            .spawn(move || {
                // Sent when the loop returns; dropped unsent when it is aborted or unwinds: the
                // receiver sees which.
                if handle.block_on(run).is_ok() {
                    let _ = done.send(());
                }
            })
            .map_err(|e| JobError::Invalid(format!("cannot start a thread for {name}: {e}")))?;
        Ok(SubtaskHandle::Thread { abort, ended })
    }

    /// Ends the subtask at its next await.
    fn abort(&self) {
        match self {
            SubtaskHandle::Task(h, _) => h.abort(),
            SubtaskHandle::Thread { abort, .. } => abort.abort(),
        }
    }

    /// Resolves when the subtask has ended: true if its main loop returned (it was neither
    /// aborted nor unwound).
    async fn ended(&mut self) -> bool {
        match self {
            SubtaskHandle::Task(h, _) => h.await.is_ok(),
            SubtaskHandle::Thread { ended, .. } => ended.await.is_ok(),
        }
    }
}
