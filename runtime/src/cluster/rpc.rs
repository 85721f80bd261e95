//! The job manager's RPC service: what task managers call. tarpc generates the client
//! (`JobManagerServiceClient`) and the server trait from this definition.

use super::membership::{TaskManagerId, TaskManagerInfo};
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// How long a [`fetch`](JobManagerService::fetch) waits for a message before it answers with
/// none.
pub const FETCH_WAIT: Duration = Duration::from_secs(1);

/// The largest RPC frame either side accepts: deployments carry the state they restore.
pub const MAX_FRAME: usize = 1 << 30;

/// What a task manager learns when it registers.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Registration {
    /// Its id for later calls.
    pub id: TaskManagerId,
    /// How often it must send a heartbeat.
    pub heartbeat_interval: Duration,
    /// How long the job manager waits for one before declaring it lost.
    pub heartbeat_timeout: Duration,
}

/// Why a call to the job manager did not do what it asked, typed so that a task manager acts
/// on the kind, never on the text.
/// (A registration's refusal is text: see [`JobManagerService::register`].)
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum RpcError {
    /// The job manager does not know the task manager: never registered, or declared lost
    /// after its heartbeat timeout. The task manager stops its subtasks and registers again.
    #[error(
        "task manager {0} is not registered (never, or declared lost after its heartbeat timeout)"
    )]
    NotRegistered(TaskManagerId),
    /// The job manager cannot serve the call (it is shutting down, or broken).
    #[error("{0}")]
    Unavailable(String),
    /// The call did not reach the job manager or its answer did not come back (the task
    /// manager's side; heartbeats decide whether the job manager is gone).
    #[error("{0}")]
    Transport(String),
}

/// The job manager's service.
#[tarpc::service]
pub trait JobManagerService {
    /// A task manager joins the cluster. Its refusal stays text, the same in every build, so
    /// that a task manager of another build still reads why it was refused (another task
    /// protocol version, another job graph, no slots).
    async fn register(info: TaskManagerInfo) -> Result<Registration, String>;
    /// A task manager is alive. `Err`: the job manager does not know it (it was declared lost):
    /// it must stop its subtasks and register again.
    async fn heartbeat(id: TaskManagerId) -> Result<(), RpcError>;
    /// A task manager leaves on its own.
    async fn unregister(id: TaskManagerId) -> Result<(), RpcError>;
    /// Messages from a task manager about its subtasks, in order (the task protocol, encoded).
    /// `Err`: the job manager does not know it.
    async fn report(id: TaskManagerId, messages: Vec<u8>) -> Result<(), RpcError>;
    /// The messages queued for a task manager after number `acked` (which it has taken:
    /// they are dropped), numbered, waiting up to [`FETCH_WAIT`] for one. A long poll: the job
    /// manager reaches task managers without connecting to them, and a lost answer is sent
    /// again. `Err`: the job manager does not know it.
    async fn fetch(id: TaskManagerId, acked: u64) -> Result<Vec<(u64, Vec<u8>)>, RpcError>;
    /// The job this job manager runs, for a standing task manager to build before it
    /// registers (Flink's session cluster: task managers are started without a job). `Err`
    /// (text): the job manager's program gave no job arguments.
    async fn job() -> Result<JobArguments, String>;
}

/// The job a job manager runs, as a standing task manager builds it: the same program, given
/// these arguments, must build the graph whose fingerprint this is.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobArguments {
    /// The job's arguments (the job manager's command line without the program's name).
    pub args: Vec<String>,
    /// The fingerprint of the job manager's job graph.
    pub fingerprint: u128,
    /// The job's id: a task manager that saw this job end does not join it again.
    pub job_id: String,
    /// The task protocol the job manager speaks.
    pub protocol: u8,
}
