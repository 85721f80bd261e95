//! The job manager's RPC service: what task managers call. tarpc generates the client
//! (`JobManagerServiceClient`) and the server trait from this definition.

use super::membership::{TaskManagerId, TaskManagerInfo};
use serde::{Deserialize, Serialize};
use std::time::Duration;

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

/// The job manager's service.
#[tarpc::service]
pub trait JobManagerService {
    /// A task manager joins the cluster.
    async fn register(info: TaskManagerInfo) -> Result<Registration, String>;
    /// A task manager is alive. `Err`: the job manager does not know it (it was declared lost):
    /// it must stop its subtasks and register again.
    async fn heartbeat(id: TaskManagerId) -> Result<(), String>;
    /// A task manager leaves on its own.
    async fn unregister(id: TaskManagerId) -> Result<(), String>;
}
