//! The REST API a running job serves (Flink's REST API, its paths and JSON field names for what
//! Weir has), with Prometheus metrics at `/metrics`: a person or a tool outside the process sees
//! the job's checkpoints and triggers checkpoints, savepoints, a stop or a cancel. Built on
//! [`JobClient`]; started by the job master when [`crate::JobConfig::rest`] asks for it.

#[cfg(feature = "rest")]
mod metrics;
#[cfg(feature = "rest")]
mod operations;
#[cfg(feature = "rest")]
mod rates;
#[cfg(feature = "rest")]
mod routes;
#[cfg(feature = "rest")]
mod views;
#[cfg(feature = "rest")]
mod web;

use crate::error::JobError;
use crate::job::JobClient;
use crate::spec::JobSpec;

pub use crate::config::RestOptions;

/// How long a job's end waits for its REST server to stop.
#[cfg(feature = "rest")]
const STOP_DEADLINE: std::time::Duration = std::time::Duration::from_secs(6);

/// The REST server of a running job; stopped when the job ends.
pub(crate) struct RestServer {
    #[cfg(feature = "rest")]
    shutdown: tokio::sync::oneshot::Sender<()>,
    #[cfg(feature = "rest")]
    task: tokio::task::JoinHandle<()>,
}

impl RestServer {
    /// Stops serving: requests in progress finish, and the server lingers while an ended
    /// operation's result is unread, both for at most [`STOP_DEADLINE`]; then it is aborted
    /// (a client that holds a connection open keeps neither the job nor the process).
    pub async fn stop(self) {
        #[cfg(feature = "rest")]
        {
            let mut task = self.task;
            let _ = self.shutdown.send(());
            if tokio::time::timeout(STOP_DEADLINE, &mut task)
                .await
                .is_err()
            {
                task.abort();
            }
        }
    }
}

/// Starts the job's REST server if its configuration asks for one.
pub(crate) async fn start(
    spec: &JobSpec,
    client: &JobClient,
) -> Result<Option<RestServer>, JobError> {
    let Some(options) = &spec.config.rest else {
        return Ok(None);
    };
    if !options.allow_remote && !options.address.ip().is_loopback() {
        return Err(JobError::Invalid(format!(
            "the REST API would listen on {}, which is not a loopback address: allow it \
             explicitly (RestOptions::allow_remote, --rest-allow-remote)",
            options.address
        )));
    }
    #[cfg(feature = "rest")]
    {
        routes::serve(options, client.clone()).await.map(Some)
    }
    #[cfg(not(feature = "rest"))]
    {
        let _ = client;
        Err(JobError::Invalid(
            "the REST API needs weir-runtime's `rest` feature (weir-examples: `rest`, in \
             `full`)"
                .into(),
        ))
    }
}
