//! Cluster mode's control plane: task managers register with the job manager over RPC, and
//! heartbeats in both directions tell each side when the other is gone.
//!
//! - [`membership`]: the registered task managers and their heartbeat timeouts, as a pure state
//!   machine.
//! - [`rpc`]: the job manager's RPC service ([`rpc::JobManagerService`]), on tarpc: serde types,
//!   no code generation, bincode frames over TCP.
//! - [`jobmanager`]: the job manager's side: the RPC server, and membership events
//!   (registered, lost, left) for the job master to act on.
//! - [`taskmanager`]: the task manager's side: registration (retried until the job manager is
//!   up) and the heartbeat loop, which ends when the job manager is lost.
//!
//! Heartbeats: every `heartbeat_interval` a task manager calls `heartbeat`. The job manager
//! declares a task manager lost when none arrived for `heartbeat_timeout`; a task manager
//! declares the job manager lost when no heartbeat was answered for `heartbeat_timeout`, or
//! when the job manager answers that it does not know it (it was declared lost). Both sides
//! learn of the other's death within the timeout, whatever the cause: a killed process, a cut
//! link, a stuck machine.

pub mod jobmanager;
pub mod membership;
pub mod rpc;
pub mod taskmanager;

use std::time::Duration;

pub use jobmanager::JobManagerServer;
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
pub const MAX_HEARTBEAT_TIMEOUT: Duration = Duration::from_secs(24 * 3600);

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
