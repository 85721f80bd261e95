//! Which part of a cluster a process plays and how (plain settings, no behaviour): the job
//! configuration names a role, and `cluster` carries it out.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

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
pub const MAX_HEARTBEAT_TIMEOUT: Duration = weir_core::config::MAX_DURATION;

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
    /// The job's arguments, from which the same program builds the same job: handed to
    /// standing task managers (started without a job), which build the job from them. `None`:
    /// only task managers started with the job's own arguments can run it.
    pub job_args: Option<Vec<String>>,
}

impl JobManagerOptions {
    /// Listening on `listen`, with the default heartbeats and a 5-minute slot timeout.
    pub fn new(listen: SocketAddr) -> JobManagerOptions {
        JobManagerOptions {
            listen,
            heartbeat: HeartbeatConfig::default(),
            slot_timeout: Duration::from_secs(300),
            job_args: None,
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
