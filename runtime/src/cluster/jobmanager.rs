//! The job manager's side of the control plane: the RPC server task managers register with and
//! send heartbeats to, and the membership events (registered, lost, left) it produces for the
//! job master.

use super::HeartbeatConfig;
use super::membership::{
    Membership, MembershipEvent, TaskManagerId, TaskManagerInfo, UnknownTaskManager,
};
use super::rpc::{FETCH_WAIT, JobArguments, JobManagerService, MAX_FRAME, Registration, RpcError};
use futures::prelude::*;
use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use tarpc::context::Context;
use tarpc::server::{BaseChannel, Channel};
use tarpc::tokio_serde::formats::Bincode;
use tokio::sync::{Notify, mpsc};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tracing::{info, warn};

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
    outboxes: Outboxes,
    inbound: mpsc::UnboundedSender<(TaskManagerId, Vec<u8>)>,
    /// The fingerprint of the job graph task managers must have built, if any.
    job: Option<u128>,
    /// The job's id and arguments, for standing task managers to build the job from.
    job_args: Option<(String, Vec<String>)>,
}

/// The messages for each registered task manager, numbered from 1, kept until its fetch
/// acknowledges them: an answer lost on the way (a late reply tarpc drops, a cut connection) is
/// sent again by the next fetch, so nothing queued is lost while the task manager stays
/// registered.
#[derive(Clone, Default)]
pub struct Outboxes {
    boxes: Arc<Mutex<HashMap<TaskManagerId, Outbox>>>,
}

#[derive(Default)]
struct Outbox {
    /// Unacknowledged messages, by number.
    queue: VecDeque<(u64, Vec<u8>)>,
    /// The number of the last message posted.
    last: u64,
    ready: Arc<Notify>,
}

/// The most messages one fetch answers with.
const FETCH_BATCH: usize = 256;

impl Outboxes {
    fn open(&self, id: TaskManagerId) {
        if let Ok(mut b) = self.boxes.lock() {
            b.insert(id, Outbox::default());
        }
    }

    fn close(&self, id: TaskManagerId) {
        if let Ok(mut b) = self.boxes.lock() {
            b.remove(&id);
        }
    }

    /// Queues `message` for task manager `id`; false if it is not registered.
    pub fn post(&self, id: TaskManagerId, message: Vec<u8>) -> bool {
        let Ok(mut b) = self.boxes.lock() else {
            return false;
        };
        match b.get_mut(&id) {
            Some(outbox) => {
                outbox.last += 1;
                let n = outbox.last;
                outbox.queue.push_back((n, message));
                outbox.ready.notify_one();
                true
            }
            None => false,
        }
    }

    /// Whether `id` has acknowledged every message posted to it (true if it is gone).
    pub fn drained(&self, id: TaskManagerId) -> bool {
        self.boxes
            .lock()
            .map(|b| b.get(&id).is_none_or(|o| o.queue.is_empty()))
            .unwrap_or(true)
    }

    /// Drops what `id` acknowledged (every message up to `acked`), then answers the messages
    /// after it, waiting until `deadline` for one.
    pub async fn take(
        &self,
        id: TaskManagerId,
        acked: u64,
        deadline: Instant,
    ) -> Result<Vec<(u64, Vec<u8>)>, RpcError> {
        loop {
            let ready = {
                let mut b = self.boxes.lock().map_err(|_| {
                    RpcError::Unavailable("the job manager's outbox lock is poisoned".into())
                })?;
                let outbox = b.get_mut(&id).ok_or(RpcError::NotRegistered(id))?;
                while outbox.queue.front().is_some_and(|(n, _)| *n <= acked) {
                    outbox.queue.pop_front();
                }
                if !outbox.queue.is_empty() {
                    return Ok(outbox.queue.iter().take(FETCH_BATCH).cloned().collect());
                }
                outbox.ready.clone()
            };
            // `notify_one` keeps a permit when nobody waits, so a post between the check and
            // here is not missed.
            if tokio::time::timeout_at(deadline, ready.notified())
                .await
                .is_err()
            {
                return Ok(Vec::new());
            }
        }
    }
}

impl Service {
    fn with_membership<T>(&self, f: impl FnOnce(&mut Membership) -> T) -> Result<T, RpcError> {
        let mut m = self.membership.lock().map_err(|_| {
            RpcError::Unavailable("the job manager's membership lock is poisoned".into())
        })?;
        Ok(f(&mut m))
    }
}

impl JobManagerService for Service {
    async fn register(self, _: Context, info: TaskManagerInfo) -> Result<Registration, String> {
        if info.slots == 0 {
            return Err(format!("task manager {} offers no slots", info.name));
        }
        if info.protocol != super::TASK_PROTOCOL_VERSION {
            warn!(name = %info.name, theirs = info.protocol, ours = super::TASK_PROTOCOL_VERSION, "refused a task manager of another task protocol version");
            return Err(format!(
                "task manager {} speaks task protocol version {}, this job manager {}: run the same build everywhere",
                info.name,
                info.protocol,
                super::TASK_PROTOCOL_VERSION
            ));
        }
        if let Some(expected) = self.job
            && info.job != Some(expected)
        {
            warn!(name = %info.name, "refused a task manager that built another job graph");
            return Err(format!(
                "task manager {} built another job graph than the job manager: start every process with the same program and the same job arguments",
                info.name
            ));
        }
        let now = self.started.elapsed();
        let event = self
            .with_membership(|m| m.register(info, now))
            .map_err(|e| e.to_string())?;
        let MembershipEvent::Registered { id, info } = &event else {
            return Err("registration produced no member".to_string());
        };
        info!(task_manager = %id, name = %info.name, slots = info.slots, data = %info.data_addr, pid = info.pid, "task manager registered");
        let registration = Registration {
            id: *id,
            heartbeat_interval: self.config.interval,
            heartbeat_timeout: self.config.timeout,
        };
        self.outboxes.open(*id);
        let _ = self.events.send(event);
        self.joined.notify_one();
        Ok(registration)
    }

    async fn heartbeat(self, _: Context, id: TaskManagerId) -> Result<(), RpcError> {
        let now = self.started.elapsed();
        self.with_membership(|m| m.heartbeat(id, now))?
            .map_err(|UnknownTaskManager(id)| RpcError::NotRegistered(id))
    }

    async fn unregister(self, _: Context, id: TaskManagerId) -> Result<(), RpcError> {
        let event = self
            .with_membership(|m| m.leave(id))?
            .map_err(|UnknownTaskManager(id)| RpcError::NotRegistered(id))?;
        info!(task_manager = %id, "task manager left");
        self.outboxes.close(id);
        let _ = self.events.send(event);
        Ok(())
    }

    async fn report(
        self,
        _: Context,
        id: TaskManagerId,
        messages: Vec<u8>,
    ) -> Result<(), RpcError> {
        if !self.with_membership(|m| m.contains(id))? {
            return Err(RpcError::NotRegistered(id));
        }
        self.inbound
            .send((id, messages))
            .map_err(|_| RpcError::Unavailable("the job manager is shutting down".to_string()))
    }

    async fn fetch(
        self,
        _: Context,
        id: TaskManagerId,
        acked: u64,
    ) -> Result<Vec<(u64, Vec<u8>)>, RpcError> {
        self.outboxes
            .take(id, acked, Instant::now() + FETCH_WAIT)
            .await
    }

    async fn job(self, _: Context) -> Result<JobArguments, String> {
        match (&self.job_args, self.job) {
            (Some((job_id, args)), Some(fingerprint)) => Ok(JobArguments {
                args: args.clone(),
                fingerprint,
                job_id: job_id.clone(),
                protocol: super::TASK_PROTOCOL_VERSION,
            }),
            _ => Err(
                "this job manager's program gave no job arguments: start its task \
                      managers with the job's own arguments"
                    .to_string(),
            ),
        }
    }
}

/// What reaches the job manager from task managers.
#[derive(Debug)]
pub enum Incoming {
    /// A change of membership.
    Membership(MembershipEvent),
    /// Messages a task manager reported (the task protocol, encoded).
    Report(TaskManagerId, Vec<u8>),
}

/// A running job manager control plane. Dropping it stops the server: task managers then lose
/// it within their heartbeat timeout.
pub struct JobManagerServer {
    addr: SocketAddr,
    membership: Arc<Mutex<Membership>>,
    events: mpsc::UnboundedReceiver<MembershipEvent>,
    inbound: mpsc::UnboundedReceiver<(TaskManagerId, Vec<u8>)>,
    outboxes: Outboxes,
    tasks: Vec<JoinHandle<()>>,
}

impl JobManagerServer {
    /// Listens on `listen` (port 0 picks a free one) and starts detecting lost task managers.
    pub async fn start(
        listen: SocketAddr,
        config: HeartbeatConfig,
    ) -> Result<JobManagerServer, String> {
        Self::start_for_job(listen, config, None).await
    }

    /// As [`start`](Self::start), refusing task managers whose job graph fingerprint
    /// ([`TaskManagerInfo::job`]) is not `job`.
    pub async fn start_for_job(
        listen: SocketAddr,
        config: HeartbeatConfig,
        job: Option<u128>,
    ) -> Result<JobManagerServer, String> {
        Self::start_with_arguments(listen, config, job, None).await
    }

    /// As [`start_for_job`](Self::start_for_job), answering standing task managers' `job`
    /// calls with `job_args`: the job's id, and the arguments from which the program builds the
    /// graph of fingerprint `job`.
    pub async fn start_with_arguments(
        listen: SocketAddr,
        config: HeartbeatConfig,
        job: Option<u128>,
        job_args: Option<(String, Vec<String>)>,
    ) -> Result<JobManagerServer, String> {
        config.validate()?;
        let mut listener = tarpc::serde_transport::tcp::listen(listen, Bincode::default)
            .await
            .map_err(|e| format!("the job manager cannot listen on {listen}: {e}"))?;
        listener.config_mut().max_frame_length(MAX_FRAME);
        let addr = listener.local_addr();
        let membership = Arc::new(Mutex::new(Membership::new(config.timeout)));
        let (events_tx, events) = mpsc::unbounded_channel();
        let (inbound_tx, inbound) = mpsc::unbounded_channel();
        let outboxes = Outboxes::default();
        let service = Service {
            membership: membership.clone(),
            started: Instant::now(),
            config,
            events: events_tx,
            joined: Arc::new(Notify::new()),
            outboxes: outboxes.clone(),
            inbound: inbound_tx,
            job,
            job_args,
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
                        // Requests on one connection run concurrently: a long-polling fetch
                        // must not hold up the heartbeats and reports behind it.
                        connections.spawn(
                            channel
                                .execute(serve.serve())
                                .for_each_concurrent(None, |response| response),
                        );
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
            inbound,
            outboxes,
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

    /// The next messages a task manager reported (the task protocol, encoded).
    pub async fn next_inbound(&mut self) -> Option<(TaskManagerId, Vec<u8>)> {
        self.inbound.recv().await
    }

    /// The next change of membership or the next report, whichever comes first.
    pub async fn next_incoming(&mut self) -> Option<Incoming> {
        tokio::select! {
            event = self.events.recv() => event.map(Incoming::Membership),
            inbound = self.inbound.recv() => inbound.map(|(id, bytes)| Incoming::Report(id, bytes)),
        }
    }

    /// Where messages to task managers are queued for their next fetch.
    pub fn outboxes(&self) -> Outboxes {
        self.outboxes.clone()
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
                        Some(at) => tokio::time::sleep_until(at).await,
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
                service.outboxes.close(*id);
            }
            let _ = service.events.send(event);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn soon() -> Instant {
        Instant::now() + Duration::from_millis(50)
    }

    #[tokio::test]
    async fn outbox_messages_stay_until_acknowledged_and_come_in_order() {
        let boxes = Outboxes::default();
        let tm = TaskManagerId(1);
        assert!(
            !boxes.post(tm, vec![0]),
            "posted to a task manager never registered"
        );
        boxes.open(tm);
        for b in 1..=3u8 {
            assert!(boxes.post(tm, vec![b]));
        }
        let first = boxes.take(tm, 0, soon()).await.expect("take");
        assert_eq!(first, vec![(1, vec![1]), (2, vec![2]), (3, vec![3])]);
        // The answer was lost: the same fetch again gets the same messages.
        assert_eq!(boxes.take(tm, 0, soon()).await.expect("again"), first);
        assert!(!boxes.drained(tm));
        // Two taken: only the third comes again.
        assert_eq!(
            boxes.take(tm, 2, soon()).await.expect("rest"),
            vec![(3, vec![3])]
        );
        // All taken: a fetch waits, and a post wakes it.
        let waiting = {
            let boxes = boxes.clone();
            tokio::spawn(async move {
                boxes
                    .take(tm, 3, Instant::now() + Duration::from_secs(10))
                    .await
            })
        };
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(boxes.post(tm, vec![4]));
        assert_eq!(
            waiting.await.expect("join").expect("take"),
            vec![(4, vec![4])]
        );
        assert!(boxes.take(tm, 4, soon()).await.expect("empty").is_empty());
        assert!(boxes.drained(tm));
        boxes.close(tm);
        let err = boxes.take(tm, 4, soon()).await.expect_err("closed");
        assert_eq!(err, RpcError::NotRegistered(tm));
    }
}
