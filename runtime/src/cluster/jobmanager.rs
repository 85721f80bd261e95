//! The job manager's side of the control plane: the RPC server task managers register with and
//! send heartbeats to, and the membership events (registered, lost, left) it produces for the
//! job master.

use super::HeartbeatConfig;
use super::membership::{Membership, MembershipEvent, TaskManagerId, TaskManagerInfo};
use super::rpc::{JobManagerService, Registration};
use futures::prelude::*;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Instant;
use tarpc::context::Context;
use tarpc::server::{BaseChannel, Channel};
use tarpc::tokio_serde::formats::Bincode;
use tokio::sync::{Notify, mpsc};
use tokio::task::JoinHandle;
use tracing::{info, warn};

/// The largest RPC message the job manager accepts.
const MAX_FRAME: usize = 16 << 20;
/// How long the job manager waits after failing to accept a connection.
const ACCEPT_BACKOFF: std::time::Duration = std::time::Duration::from_millis(100);

/// The shared state behind every connection's service.
#[derive(Clone)]
struct Service {
    membership: Arc<Mutex<Membership>>,
    started: Instant,
    config: HeartbeatConfig,
    events: mpsc::UnboundedSender<MembershipEvent>,
    /// Wakes the loss detector when a member joins (its deadline may be the earliest).
    joined: Arc<Notify>,
}

impl Service {
    fn with_membership<T>(&self, f: impl FnOnce(&mut Membership) -> T) -> Result<T, String> {
        let mut m = self
            .membership
            .lock()
            .map_err(|_| "the job manager's membership lock is poisoned".to_string())?;
        Ok(f(&mut m))
    }
}

impl JobManagerService for Service {
    async fn register(self, _: Context, info: TaskManagerInfo) -> Result<Registration, String> {
        if info.slots == 0 {
            return Err(format!("task manager {} offers no slots", info.name));
        }
        let now = self.started.elapsed();
        let event = self.with_membership(|m| m.register(info, now))?;
        let MembershipEvent::Registered { id, info } = &event else {
            return Err("registration produced no member".to_string());
        };
        info!(task_manager = %id, name = %info.name, slots = info.slots, data = %info.data_addr, pid = info.pid, "task manager registered");
        let registration = Registration {
            id: *id,
            heartbeat_interval: self.config.interval,
            heartbeat_timeout: self.config.timeout,
        };
        let _ = self.events.send(event);
        self.joined.notify_one();
        Ok(registration)
    }

    async fn heartbeat(self, _: Context, id: TaskManagerId) -> Result<(), String> {
        let now = self.started.elapsed();
        self.with_membership(|m| m.heartbeat(id, now))?
            .map_err(|e| e.to_string())
    }

    async fn unregister(self, _: Context, id: TaskManagerId) -> Result<(), String> {
        let event = self
            .with_membership(|m| m.leave(id))?
            .map_err(|e| e.to_string())?;
        info!(task_manager = %id, "task manager left");
        let _ = self.events.send(event);
        Ok(())
    }
}

/// A running job manager control plane. Dropping it stops the server: task managers then lose
/// it within their heartbeat timeout.
pub struct JobManagerServer {
    addr: SocketAddr,
    membership: Arc<Mutex<Membership>>,
    events: mpsc::UnboundedReceiver<MembershipEvent>,
    tasks: Vec<JoinHandle<()>>,
}

impl JobManagerServer {
    /// Listens on `listen` (port 0 picks a free one) and starts detecting lost task managers.
    pub async fn start(
        listen: SocketAddr,
        config: HeartbeatConfig,
    ) -> Result<JobManagerServer, String> {
        config.validate()?;
        let mut listener = tarpc::serde_transport::tcp::listen(listen, Bincode::default)
            .await
            .map_err(|e| format!("the job manager cannot listen on {listen}: {e}"))?;
        listener.config_mut().max_frame_length(MAX_FRAME);
        let addr = listener.local_addr();
        let membership = Arc::new(Mutex::new(Membership::new(config.timeout)));
        let (events_tx, events) = mpsc::unbounded_channel();
        let service = Service {
            membership: membership.clone(),
            started: Instant::now(),
            config,
            events: events_tx,
            joined: Arc::new(Notify::new()),
        };
        let serve = service.clone();
        let server = tokio::spawn(async move {
            // The connections live in this task's set, so stopping the server closes them all.
            let mut connections = tokio::task::JoinSet::new();
            let mut listener = std::pin::pin!(listener);
            while let Some(accepted) = listener.next().await {
                // Reap the connections that ended.
                while connections.try_join_next().is_some() {}
                match accepted {
                    Ok(transport) => {
                        let channel = BaseChannel::with_defaults(transport);
                        let serve = serve.clone();
                        connections
                            .spawn(channel.execute(serve.serve()).for_each(|response| response));
                    }
                    Err(e) => {
                        // Out of file descriptors, say: do not spin on it.
                        warn!(error = %e, "the job manager cannot accept a connection");
                        tokio::time::sleep(ACCEPT_BACKOFF).await;
                    }
                }
            }
        });
        let detector = tokio::spawn(detect_losses(service));
        info!(%addr, interval = ?config.interval, timeout = ?config.timeout, "job manager listening");
        Ok(JobManagerServer {
            addr,
            membership,
            events,
            tasks: vec![server, detector],
        })
    }

    /// The address task managers connect to.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// The next change of membership.
    pub async fn next_event(&mut self) -> Option<MembershipEvent> {
        self.events.recv().await
    }

    /// The registered task managers, by id.
    pub fn members(&self) -> Vec<(TaskManagerId, TaskManagerInfo)> {
        self.membership
            .lock()
            .map(|m| m.members().map(|(id, i)| (id, i.clone())).collect())
            .unwrap_or_default()
    }
}

impl Drop for JobManagerServer {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// Declares task managers lost when their heartbeat timeout passes.
async fn detect_losses(service: Service) {
    loop {
        let next = service
            .with_membership(|m| m.next_deadline())
            .ok()
            .flatten();
        let wake = async {
            match next {
                // A little past the deadline, so that the member is strictly over it.
                Some(d) => {
                    let at = service
                        .started
                        .checked_add(d.saturating_add(service.config.interval / 10));
                    match at {
                        Some(at) => tokio::time::sleep_until(at.into()).await,
                        None => std::future::pending().await,
                    }
                }
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = wake => {}
            _ = service.joined.notified() => continue,
        }
        let now = service.started.elapsed();
        let Ok(lost) = service.with_membership(|m| m.tick(now)) else {
            return;
        };
        for event in lost {
            if let MembershipEvent::Lost {
                id,
                info,
                silent_for,
            } = &event
            {
                warn!(task_manager = %id, name = %info.name, silent_for = ?silent_for, "task manager lost: no heartbeat within the timeout");
            }
            let _ = service.events.send(event);
        }
    }
}
