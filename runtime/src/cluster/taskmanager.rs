//! The task manager's side of the control plane: registration with the job manager (retried
//! until it is up) and the heartbeat loop, which ends when the job manager is lost.

use super::membership::{TaskManagerId, TaskManagerInfo};
use super::rpc::{JobManagerServiceClient, Registration};
use std::net::SocketAddr;
use std::time::{Duration, Instant};
use tarpc::client;
use tarpc::context;
use tarpc::tokio_serde::formats::Bincode;
use tracing::{debug, info, warn};

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
        let give_up = Instant::now() + connect_timeout;
        let mut delay = Duration::from_millis(20);
        let transport = loop {
            let mut connect = tarpc::serde_transport::tcp::connect(jobmanager, Bincode::default);
            connect.config_mut().max_frame_length(16 << 20);
            match connect.await {
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
        let client = JobManagerServiceClient::new(client::Config::default(), transport).spawn();
        let mut ctx = context::current();
        ctx.deadline = Instant::now() + connect_timeout.max(Duration::from_secs(1));
        let registration = client
            .register(ctx, info.clone())
            .await
            .map_err(|e| lost(format!("registration failed: {e}")))?
            .map_err(|e| lost(format!("registration refused: {e}")))?;
        info!(task_manager = %registration.id, %jobmanager, slots = info.slots, "registered with the job manager");
        Ok(TaskManagerSession {
            jobmanager,
            client,
            registration,
        })
    }

    /// This task manager's id.
    pub fn id(&self) -> TaskManagerId {
        self.registration.id
    }

    /// What the job manager answered at registration.
    pub fn registration(&self) -> &Registration {
        &self.registration
    }

    /// Sends heartbeats every interval until the job manager is lost, and says why: no
    /// heartbeat answered for the timeout, or an answer that it no longer knows this task
    /// manager.
    pub async fn heartbeats(&self) -> JobManagerLost {
        let Registration {
            id,
            heartbeat_interval: interval,
            heartbeat_timeout: timeout,
        } = self.registration;
        let mut last_answered = Instant::now();
        let mut ticker = tokio::time::interval(interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticker.tick().await;
            let mut ctx = context::current();
            ctx.deadline = Instant::now() + interval;
            match self.client.heartbeat(ctx, id).await {
                Ok(Ok(())) => last_answered = Instant::now(),
                Ok(Err(refused)) => {
                    warn!(task_manager = %id, reason = %refused, "the job manager refused a heartbeat");
                    return JobManagerLost {
                        addr: self.jobmanager,
                        reason: format!("it refused a heartbeat: {refused}"),
                    };
                }
                Err(e) => {
                    let silent = last_answered.elapsed();
                    debug!(task_manager = %id, error = %e, ?silent, "heartbeat unanswered");
                    if silent > timeout {
                        warn!(task_manager = %id, ?silent, "job manager lost: no heartbeat answered within the timeout");
                        return JobManagerLost {
                            addr: self.jobmanager,
                            reason: format!(
                                "no heartbeat answered for {silent:?} (timeout {timeout:?}); last error: {e}"
                            ),
                        };
                    }
                }
            }
        }
    }

    /// Leaves the cluster cleanly.
    pub async fn leave(self) -> Result<(), JobManagerLost> {
        let mut ctx = context::current();
        ctx.deadline = Instant::now() + self.registration.heartbeat_timeout;
        let addr = self.jobmanager;
        self.client
            .unregister(ctx, self.registration.id)
            .await
            .map_err(|e| JobManagerLost {
                addr,
                reason: e.to_string(),
            })?
            .map_err(|reason| JobManagerLost { addr, reason })
    }
}
