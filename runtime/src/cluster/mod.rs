//! Cluster mode: a job manager and task managers, each a process running the same job binary
//! (as timely and Bytewax clusters do), so a task manager builds the job's operators itself and
//! is only told which subtasks to run. Task managers register with the job manager over RPC,
//! and heartbeats in both directions tell each side when the other is gone.
//!
//! - [`membership`]: the registered task managers and their heartbeat timeouts, as a pure state
//!   machine.
//! - [`rpc`]: the job manager's RPC service ([`rpc::JobManagerService`]), on tarpc: serde types,
//!   no code generation, bincode frames over TCP.
//! - [`jobmanager`]: the job manager's side: the RPC server, and membership events
//!   (registered, lost, left) for the job master to act on.
//! - [`taskmanager`]: the task manager's side: registration (retried until the job manager is
//!   up) and the heartbeat loop, which ends when the job manager is lost.
//! - `protocol`: the task protocol inside the RPC calls: deployments, messages to subtasks, and
//!   their reports (postcard, versioned).
//! - `jobmaster`: the job master's gateway to subtasks on task managers: slots, placement,
//!   ordered delivery, and a lost task manager turned into a task failure.
//! - `taskexecutor`: a task manager's main loop: it runs what it is deployed, and rejoins (or
//!   exits) when the job manager is lost.
//! - `transport`: a task manager's data transport: in process between its own subtasks, TCP to
//!   other task managers.
//!
//! The job manager reaches task managers without connecting to them: each task manager long-polls
//! ([`rpc::JobManagerService::fetch`]) for what is queued for it, numbered and kept until
//! acknowledged, and sends its reports in order on the same connection.
//!
//! Heartbeats: every `heartbeat_interval` a task manager calls `heartbeat`. The job manager
//! declares a task manager lost when none arrived for `heartbeat_timeout`; a task manager
//! declares the job manager lost when no heartbeat was answered for `heartbeat_timeout`, or
//! when the job manager answers that it does not know it (it was declared lost). Both sides
//! learn of the other's death within the timeout, whatever the cause: a killed process, a cut
//! link, a stuck machine.

#[doc(hidden)]
pub mod fuzzing;
pub mod jobmanager;
pub(crate) mod jobmaster;
pub mod membership;
pub(crate) mod protocol;
pub mod rpc;
pub(crate) mod taskexecutor;
pub mod taskmanager;
pub(crate) mod transport;

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

pub use jobmanager::JobManagerServer;

/// The version of the task protocol this build speaks; a task manager of another version is
/// refused at registration.
pub const TASK_PROTOCOL_VERSION: u8 = protocol::PROTOCOL_VERSION;
pub use membership::{MembershipEvent, TaskManagerId, TaskManagerInfo};
pub use taskmanager::{JobManagerLost, TaskManagerSession};

/// Heartbeat settings (Flink's `heartbeat.interval` and `heartbeat.timeout`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HeartbeatConfig {
    /// How often a task manager sends a heartbeat.
    pub interval: Duration,
    /// How long without a heartbeat (or an answer to one) before the other side is lost.
    pub timeout: Duration,
}

impl Default for HeartbeatConfig {
    /// Flink's defaults: every 10 s, lost after 50 s.
    fn default() -> Self {
        HeartbeatConfig {
            interval: Duration::from_secs(10),
            timeout: Duration::from_secs(50),
        }
    }
}

/// The longest heartbeat timeout accepted (a day): deadlines stay far from overflowing.
pub const MAX_HEARTBEAT_TIMEOUT: Duration = crate::config::limits::MAX_DURATION;

impl HeartbeatConfig {
    /// Checks that heartbeats can work: a non-zero interval, shorter than the timeout, which is
    /// at most [`MAX_HEARTBEAT_TIMEOUT`].
    pub fn validate(&self) -> Result<(), String> {
        if self.interval.is_zero() {
            return Err("the heartbeat interval must be above zero".to_string());
        }
        if self.timeout > MAX_HEARTBEAT_TIMEOUT {
            return Err(format!(
                "the heartbeat timeout ({:?}) is longer than {MAX_HEARTBEAT_TIMEOUT:?}",
                self.timeout
            ));
        }
        if self.timeout <= self.interval {
            return Err(format!(
                "the heartbeat timeout ({:?}) must be longer than the interval ({:?})",
                self.timeout, self.interval
            ));
        }
        Ok(())
    }
}

/// Which part of a cluster this process plays; absent from a [`crate::JobConfig`], the whole job
/// runs in this process.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ClusterRole {
    /// The job manager: runs the job master and the checkpoint coordinator, and deploys the
    /// subtasks to task managers.
    JobManager(JobManagerOptions),
    /// A task manager: offers slots to the job manager and runs the subtasks it is given.
    TaskManager(TaskManagerOptions),
}

/// How a job manager runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JobManagerOptions {
    /// Where task managers register (port 0 picks a free one).
    pub listen: SocketAddr,
    /// Heartbeat interval and timeout.
    pub heartbeat: HeartbeatConfig,
    /// How long a deployment waits for task managers to offer enough slots (Flink's
    /// `slot.request.timeout`) before the job fails.
    pub slot_timeout: Duration,
}

impl JobManagerOptions {
    /// Listening on `listen`, with the default heartbeats and a 5-minute slot timeout.
    pub fn new(listen: SocketAddr) -> JobManagerOptions {
        JobManagerOptions {
            listen,
            heartbeat: HeartbeatConfig::default(),
            slot_timeout: Duration::from_secs(300),
        }
    }
}

/// How a task manager runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TaskManagerOptions {
    /// The job manager's address.
    pub jobmanager: SocketAddr,
    /// Slots offered: each runs one subtask of every vertex.
    pub slots: u32,
    /// The address its data transport listens on; `None`: this host's address on the route
    /// to the job manager.
    pub bind: Option<IpAddr>,
    /// How long it tries to reach the job manager, at start and after losing it, before it
    /// gives up.
    pub connect_timeout: Duration,
}

impl TaskManagerOptions {
    /// `slots` slots for the job manager at `jobmanager`, trying to reach it for a minute.
    pub fn new(jobmanager: SocketAddr, slots: u32) -> TaskManagerOptions {
        TaskManagerOptions {
            jobmanager,
            slots,
            bind: None,
            connect_timeout: Duration::from_secs(60),
        }
    }
}
