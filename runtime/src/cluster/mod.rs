//! Cluster mode (weir-runtime's `cluster` feature; without it only the roles and membership
//! are here, and a job asked to run as either role fails at once saying so): a job manager and
//! task managers, each a process running the same job binary
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
//! - [`standing`]: a standing task manager (Flink's session cluster), started without a job: it
//!   builds each job from the arguments its job manager hands out, job after job.
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

#[cfg(feature = "cluster")]
#[doc(hidden)]
pub mod fuzzing;
#[cfg(feature = "cluster")]
pub mod jobmanager;
#[cfg(feature = "cluster")]
pub(crate) mod jobmaster;
pub mod membership;
#[cfg(feature = "cluster")]
pub(crate) mod protocol;
#[cfg(feature = "cluster")]
pub mod rpc;
#[cfg(feature = "cluster")]
pub mod standing;
#[cfg(feature = "cluster")]
pub(crate) mod taskexecutor;
#[cfg(feature = "cluster")]
pub mod taskmanager;
#[cfg(feature = "cluster")]
pub(crate) mod transport;

#[cfg(feature = "cluster")]
pub use jobmanager::JobManagerServer;
#[cfg(feature = "cluster")]
pub use standing::run_standing_task_manager;

/// Builds a job from its arguments: the program's own job-building code, given the arguments
/// its job manager was started with ([`JobManagerOptions::job_args`]).
pub type JobBuilder = std::sync::Arc<
    dyn Fn(&[String]) -> Result<crate::StreamEnvironment, crate::JobError> + Send + Sync + 'static,
>;

/// A standing task manager needs the `cluster` feature: without it, this fails at once.
#[cfg(not(feature = "cluster"))]
pub async fn run_standing_task_manager(
    _options: TaskManagerOptions,
    _build: JobBuilder,
) -> Result<(), crate::JobError> {
    Err(crate::JobError::Invalid(MISSING.to_string()))
}

/// The version of the task protocol this build speaks; a task manager of another version is
/// refused at registration.
#[cfg(feature = "cluster")]
pub const TASK_PROTOCOL_VERSION: u8 = protocol::PROTOCOL_VERSION;
pub use membership::{MembershipEvent, PastJob, TaskManagerId, TaskManagerInfo};
#[cfg(feature = "cluster")]
pub use taskmanager::{JobManagerLost, TaskManagerSession};

pub use crate::roles::{
    ClusterRole, HeartbeatConfig, JobManagerOptions, MAX_HEARTBEAT_TIMEOUT, TaskManagerOptions,
};

/// Why a job manager or task manager cannot start in a build without the `cluster` feature.
#[cfg_attr(feature = "cluster", allow(dead_code))]
pub(crate) const MISSING: &str = "cluster mode is not in this build: build with weir-runtime's \
     `cluster` feature (weir-examples' `cluster` turns it on)";
