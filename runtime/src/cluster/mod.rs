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

pub use jobmanager::JobManagerServer;

/// The version of the task protocol this build speaks; a task manager of another version is
/// refused at registration.
pub const TASK_PROTOCOL_VERSION: u8 = protocol::PROTOCOL_VERSION;
pub use membership::{MembershipEvent, TaskManagerId, TaskManagerInfo};
pub use taskmanager::{JobManagerLost, TaskManagerSession};

pub use crate::roles::{
    ClusterRole, HeartbeatConfig, JobManagerOptions, MAX_HEARTBEAT_TIMEOUT, TaskManagerOptions,
};
