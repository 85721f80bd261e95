//! The task manager's side of the control plane: registration with the job manager (retried
//! until it is up) and the heartbeat loop, which ends when the job manager is lost.

use super::HeartbeatConfig;
use super::membership::{TaskManagerId, TaskManagerInfo};
use super::rpc::{
    FETCH_WAIT, JobArguments, JobManagerServiceClient, MAX_FRAME, Registration, RpcError,
};
use std::net::SocketAddr;
use std::time::{Duration, Instant};
use tarpc::client;
use tarpc::context;
use tarpc::tokio_serde::formats::Bincode;
use tracing::{debug, info, warn};

/// `d` from now, or a year from now if that overflows.
fn deadline_after(d: Duration) -> Instant {
    let now = Instant::now();
    now.checked_add(d)
        .unwrap_or_else(|| now + Duration::from_secs(365 * 24 * 3600))
}

/// The job manager is gone: no heartbeat was answered within the timeout, it refused this task
/// manager, or it could not be reached at all.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("the job manager at {addr} is lost: {reason}")]
pub struct JobManagerLost {
    /// Its address.
    pub addr: SocketAddr,
    /// Why.
    pub reason: String,
}

/// A task manager registered with a job manager.
pub struct TaskManagerSession {
    jobmanager: SocketAddr,
    client: JobManagerServiceClient,
    registration: Registration,
    /// When the job manager last answered (the registration, to begin with).
    registered_at: Instant,
}

impl TaskManagerSession {
    /// Connects to the job manager at `jobmanager`, retrying for up to `connect_timeout` (it may
    /// not be up yet), and registers with `info`.
    pub async fn join(
        jobmanager: SocketAddr,
        info: TaskManagerInfo,
        connect_timeout: Duration,
    ) -> Result<TaskManagerSession, JobManagerLost> {
        let lost = |reason: String| JobManagerLost {
            addr: jobmanager,
            reason,
        };
        let (client, ctx) = connect_for_call(jobmanager, connect_timeout).await?;
        let registration = client
            .register(ctx, info.clone())
            .await
            .map_err(|e| lost(format!("registration failed: {e}")))?
            .map_err(|e| lost(format!("registration refused: {e}")))?;
        // The settings come from the other process: checked before they are used.
        HeartbeatConfig {
            interval: registration.heartbeat_interval,
            timeout: registration.heartbeat_timeout,
        }
        .validate()
        .map_err(|e| lost(format!("unusable heartbeat settings: {e}")))?;
        let registered_at = Instant::now();
        info!(task_manager = %registration.id, %jobmanager, slots = info.slots, "registered with the job manager");
        Ok(TaskManagerSession {
            jobmanager,
            client,
            registration,
            registered_at,
        })
    }

    /// The job the job manager at `jobmanager` runs, for a standing task manager to build
    /// (trying to reach it for up to `connect_timeout`).
    pub async fn job_arguments(
        jobmanager: SocketAddr,
        connect_timeout: Duration,
    ) -> Result<JobArguments, JobManagerLost> {
        let (client, ctx) = connect_for_call(jobmanager, connect_timeout).await?;
        let lost = |reason: String| JobManagerLost {
            addr: jobmanager,
            reason,
        };
        client
            .job(ctx)
            .await
            .map_err(|e| lost(format!("asking for its job failed: {e}")))?
            .map_err(lost)
    }
}

/// A client of the job manager at `jobmanager` ([`connect`]) and the context of one call to it,
/// whose answer may take as long as the connection may.
async fn connect_for_call(
    jobmanager: SocketAddr,
    connect_timeout: Duration,
) -> Result<(JobManagerServiceClient, context::Context), JobManagerLost> {
    let client = connect(jobmanager, connect_timeout).await?;
    let mut ctx = context::current();
    ctx.deadline = deadline_after(connect_timeout.max(Duration::from_secs(1)));
    Ok((client, ctx))
}

/// A client of the job manager at `jobmanager`, connecting for up to `connect_timeout` (it may
/// not be up yet).
async fn connect(
    jobmanager: SocketAddr,
    connect_timeout: Duration,
) -> Result<JobManagerServiceClient, JobManagerLost> {
    let lost = |reason: String| JobManagerLost {
        addr: jobmanager,
        reason,
    };
    let give_up = deadline_after(connect_timeout);
    let mut delay = Duration::from_millis(20);
    let transport = loop {
        let mut connect = tarpc::serde_transport::tcp::connect(jobmanager, Bincode::default);
        connect.config_mut().max_frame_length(MAX_FRAME);
        // An address that drops packets would otherwise hold one attempt for minutes.
        let attempt = tokio::time::timeout_at(give_up.into(), connect)
            .await
            .unwrap_or_else(|_| {
                Err(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    "connecting timed out",
                ))
            });
        match attempt {
            Ok(t) => break t,
            Err(e) if Instant::now() < give_up => {
                debug!(%jobmanager, error = %e, "job manager not reachable yet; retrying");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_millis(500));
            }
            Err(e) => {
                return Err(lost(format!(
                    "not reachable within {connect_timeout:?}: {e}"
                )));
            }
        }
    };
    Ok(JobManagerServiceClient::new(client::Config::default(), transport).spawn())
}

impl TaskManagerSession {
    /// This task manager's id.
    pub fn id(&self) -> TaskManagerId {
        self.registration.id
    }

    /// What the job manager answered at registration.
    pub fn registration(&self) -> &Registration {
        &self.registration
    }

    /// Sends heartbeats every interval until the job manager is lost, and says why: no
    /// heartbeat answered for the timeout less one interval (so a task manager gives up, and
    /// stops its subtasks, before the job manager declares it lost and redeploys them), or an
    /// answer that it no longer knows this task manager.
    pub async fn heartbeats(&self) -> JobManagerLost {
        let Registration {
            id,
            heartbeat_interval: interval,
            heartbeat_timeout,
        } = self.registration;
        let timeout = heartbeat_timeout.saturating_sub(interval);
        let mut last_answered = self.registered_at;
        let mut last_error = String::from("none");
        let mut ticker = tokio::time::interval(interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            // The give-up time does not wait for a tick or an answer: a task manager stops its
            // subtasks `timeout` after the last answer, one interval before the job manager
            // would declare it lost.
            let give_up = last_answered + timeout;
            let lost = |last_error: &str| {
                let silent = last_answered.elapsed();
                warn!(task_manager = %id, ?silent, "job manager lost: no heartbeat answered within the timeout");
                JobManagerLost {
                    addr: self.jobmanager,
                    reason: format!(
                        "no heartbeat answered for {silent:?} (timeout {timeout:?}); last error: {last_error}"
                    ),
                }
            };
            tokio::select! {
                _ = ticker.tick() => {}
                _ = tokio::time::sleep_until(give_up.into()) => return lost(&last_error),
            }
            let mut ctx = context::current();
            // An answer counts until the give-up time: a slow answer is not a lost one.
            ctx.deadline = give_up.max(Instant::now() + interval);
            let answer = tokio::select! {
                a = self.client.heartbeat(ctx, id) => a,
                _ = tokio::time::sleep_until(give_up.into()) => return lost(&last_error),
            };
            match answer {
                Ok(Ok(())) => last_answered = Instant::now(),
                Ok(Err(refused)) => {
                    warn!(task_manager = %id, reason = %refused, "the job manager refused a heartbeat");
                    return JobManagerLost {
                        addr: self.jobmanager,
                        reason: format!("it refused a heartbeat: {refused}"),
                    };
                }
                Err(e) => {
                    debug!(task_manager = %id, error = %e, silent = ?last_answered.elapsed(), "heartbeat unanswered");
                    last_error = e.to_string();
                }
            }
        }
    }

    /// Sends messages about this task manager's subtasks (the task protocol, encoded), within
    /// `within`.
    pub async fn report(&self, messages: Vec<u8>, within: Duration) -> Result<(), RpcError> {
        let mut ctx = context::current();
        ctx.deadline = deadline_after(within);
        self.client
            .report(ctx, self.registration.id, messages)
            .await
            .map_err(|e| RpcError::Transport(format!("reporting to the job manager failed: {e}")))?
    }

    /// The messages the job manager queued for this task manager after number `acked`, in
    /// order, waiting up to [`FETCH_WAIT`] for one. Pass the number of the last message taken:
    /// an answer lost on the way comes again.
    pub async fn fetch(&self, acked: u64) -> Result<Vec<(u64, Vec<u8>)>, RpcError> {
        let mut ctx = context::current();
        ctx.deadline = deadline_after(FETCH_WAIT + self.registration.heartbeat_timeout);
        self.client
            .fetch(ctx, self.registration.id, acked)
            .await
            .map_err(|e| {
                RpcError::Transport(format!("fetching from the job manager failed: {e}"))
            })?
    }

    /// Leaves the cluster cleanly.
    pub async fn leave(self) -> Result<(), JobManagerLost> {
        let mut ctx = context::current();
        ctx.deadline = Instant::now() + self.registration.heartbeat_interval;
        let addr = self.jobmanager;
        self.client
            .unregister(ctx, self.registration.id)
            .await
            .map_err(|e| JobManagerLost {
                addr,
                reason: e.to_string(),
            })?
            .map_err(|e| JobManagerLost {
                addr,
                reason: e.to_string(),
            })
    }
}
