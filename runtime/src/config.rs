//! A job's configuration: parallelism, checkpointing, storage, restarts and buffers, and the
//! ranges its numeric settings must be in.

use crate::error::JobError;
use crate::restart::RestartStrategy;
use std::collections::BTreeMap;
use std::fmt::Display;
use std::ops::RangeInclusive;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use weir_checkpoint::storage::{S3Config, is_s3_url};
use weir_checkpoint::{CheckpointError, CheckpointStorage, OpendalCheckpointStorage};
use weir_core::config::CheckpointConfig;
use weir_network::Transport;

/// Where checkpoints go.
#[derive(Clone)]
pub enum StorageConfig {
    /// A local directory through opendal's fs service (the default: `./weir-checkpoints`).
    Filesystem(PathBuf),
    /// An S3 bucket and prefix through opendal's s3 service.
    S3(S3Config),
    /// opendal's memory service: gone with the process, for tests.
    Memory,
    /// Any other implementation of the storage seam, as an object: this process only (a
    /// restore finds it when `restore_from` names a location under its root).
    Custom(Arc<dyn CheckpointStorage>),
    /// A storage of a scheme registered with [`crate::register_storage_scheme`], by URL: every
    /// process that registered the scheme reaches it (task managers included).
    Registered(String),
}

impl StorageConfig {
    /// The storage a user's `--checkpoint-dir` names: `s3://bucket/prefix` is S3, configured
    /// from the AWS environment variables ([`S3Config::from_url_and_env`]); `file:///dir` and
    /// any path without a scheme is a local directory; a URL of a scheme registered with
    /// [`crate::register_storage_scheme`] is that storage. A bad `s3://` URL, missing
    /// credentials or an unregistered scheme is a [`CheckpointError::Config`] naming the
    /// problem.
    pub fn from_location(location: &str) -> Result<StorageConfig, CheckpointError> {
        if is_s3_url(location) {
            return Ok(StorageConfig::S3(S3Config::from_url_and_env(location)?));
        }
        if let Some(path) = location.strip_prefix("file://") {
            // `file://localhost/dir` names the same directory as `file:///dir` (RFC 8089).
            let path = path.strip_prefix("localhost").unwrap_or(path);
            return Ok(StorageConfig::Filesystem(PathBuf::from(path)));
        }
        match crate::schemes::scheme_of(location) {
            Some(_) if crate::schemes::is_registered(location) => {
                Ok(StorageConfig::Registered(location.to_string()))
            }
            Some(scheme) if matches!(scheme.as_str(), "s3" | "file") => {
                Err(CheckpointError::Config(format!(
                    "{location:?}: write Weir's schemes in lower case ({scheme}://)"
                )))
            }
            Some(scheme) => Err(crate::schemes::unregistered(&scheme)),
            None => Ok(StorageConfig::Filesystem(PathBuf::from(location))),
        }
    }
}

impl std::fmt::Debug for StorageConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StorageConfig::Filesystem(p) => write!(f, "Filesystem({})", p.display()),
            StorageConfig::S3(c) => write!(f, "S3({})", c.describe()),
            StorageConfig::Memory => write!(f, "Memory"),
            StorageConfig::Custom(s) => write!(f, "Custom({})", s.describe()),
            StorageConfig::Registered(url) => write!(f, "Registered({url})"),
        }
    }
}

/// Wraps or replaces the transport a job's subtasks exchange records through: given the
/// engine's own (in one process, `weir_network::LocalTransport`; on a task manager, the TCP
/// transport), it returns the one to use. Returning the argument wrapped adds a layer (a
/// counter, a fault injector); returning another replaces it in one process. Set with
/// [`crate::StreamEnvironment::set_transport`]; on a cluster, every process that builds the
/// job sets it, and each task manager applies it to its own TCP transport, which a layer there
/// must wrap, not replace (the TCP transport also places channels on task managers). A layer
/// must pass [`Transport::release_before`] on: the runtime releases a failed generation's
/// channels through it.
#[derive(Clone)]
pub struct TransportLayer(pub TransportLayerFn);

/// The function of a [`TransportLayer`].
pub type TransportLayerFn = Arc<dyn Fn(Arc<dyn Transport>) -> Arc<dyn Transport> + Send + Sync>;

impl TransportLayer {
    /// The transport to use instead of `own`.
    pub fn apply(&self, own: Arc<dyn Transport>) -> Arc<dyn Transport> {
        (self.0)(own)
    }
}

impl std::fmt::Debug for TransportLayer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TransportLayer")
    }
}

/// Everything about a job that is not its graph.
#[derive(Clone, Debug)]
pub struct JobConfig {
    /// The job's name.
    pub job_name: String,
    /// The job's id; `None` (the default): a fresh id for every run, as Flink gives every
    /// submission a new `JobID`. Its checkpoints go to `<root>/<job-id>/chk-<n>`, and a run holds
    /// that directory for itself (a second run with the same id is refused).
    pub job_id: Option<weir_core::ids::JobId>,
    /// Default parallelism of operators.
    pub parallelism: u32,
    /// Max parallelism (key groups); `None`: Flink's default for the parallelism.
    pub max_parallelism: Option<u32>,
    /// Checkpointing.
    pub checkpoint: CheckpointConfig,
    /// Checkpoint storage.
    pub storage: StorageConfig,
    /// Restart strategy; `None`: fixed delay when checkpointing is on, no restart otherwise.
    pub restart: Option<RestartStrategy>,
    /// A checkpoint (or a checkpoint root) to start from, like `flink run -s`: a local path or
    /// `s3://bucket/prefix`.
    pub restore_from: Option<PathBuf>,
    /// Records per batch that sources emit and writers send.
    pub batch_size: usize,
    /// Credits per channel: full batches in flight between two subtasks (Flink's
    /// `taskmanager.network.memory.buffers-per-channel`, whose default is also 2). With 4, a
    /// busy `word_count` used the same CPU, and an aligned checkpoint under backpressure waited
    /// behind twice the records.
    pub buffers_per_channel: usize,
    /// How long the job master waits for its tasks to stop when the job is cancelled (Flink's
    /// `task.cancellation.timeout`, here without the fatal error): a task still running then
    /// (stuck in an operator that does not check [`crate::operator::Cancellation`]) is
    /// abandoned, and the job ends CANCELED all the same. Its thread may go on until the
    /// operator returns. `0`: do not wait. Default [`DEFAULT_TASK_CANCELLATION_TIMEOUT`].
    pub task_cancellation_timeout: Duration,
    /// Where savepoints go when a request names no directory.
    pub savepoint_dir: Option<PathBuf>,
    /// Restore even if the checkpoint has state for operators this job no longer has (that
    /// state is dropped, with a warning). Off: such a restore is an error.
    pub allow_non_restored_state: bool,
    /// The source settings that decide what a replay reads (for `word_count`: its record count
    /// and seed), recorded in every checkpoint's fingerprint. A restore into a job whose
    /// settings differ is refused, naming the difference, unless `allow_changed_sources`.
    pub source_config: BTreeMap<String, String>,
    /// Restore even though the source settings differ from the checkpoint's.
    pub allow_changed_sources: bool,
    /// How keyed-state snapshots compress each key group (Flink's
    /// `execution.checkpointing.snapshot-compression`; default none).
    pub snapshot_compression: weir_state::Compression,
    /// Incremental checkpoints of keyed state (Flink's `state.backend.incremental`): each
    /// checkpoint writes only what changed since the latest completed one, into shared files
    /// that later checkpoints reference. Savepoints stay full. Off by default.
    pub incremental: bool,
    /// With `incremental`, the most snapshots a chain holds (a full one and its deltas) before
    /// a checkpoint is full again, which bounds what a restore reads.
    pub incremental_max_chain: u32,
    /// Where keyed state lives (Flink's `state.backend.type`): the factory of each keyed
    /// operator's backend. Default: [`weir_state::HeapStateBackend`].
    pub state_backend: Arc<dyn weir_state::StateBackend>,
    /// Cluster mode: this process is the job manager or a task manager. `None`: the whole job
    /// runs in this process.
    pub cluster: Option<crate::roles::ClusterRole>,
    /// The REST API and `/metrics` the job serves while it runs (`None`, the default: none).
    /// Needs the `rest` feature.
    pub rest: Option<RestOptions>,
    /// Who owns the checkpoint a run restores from (Flink's
    /// `execution.state-recovery.claim-mode`); default [`ClaimMode::NoClaim`].
    pub claim_mode: ClaimMode,
    /// How long a run's hold on its job directory lasts unrenewed: the run rewrites its lock a
    /// third of this apart, and a run claiming the directory (claim mode, or
    /// `weir checkpoints gc`) takes it as abandoned after seeing the lock unchanged this long.
    /// Default [`DEFAULT_JOB_LOCK_LEASE`], range [`limits::JOB_LOCK_LEASE`].
    pub job_lock_lease: Duration,
    /// Wraps or replaces the subtasks' data transport; `None`: the engine's own.
    pub transport: Option<TransportLayer>,
}

/// Who owns the checkpoint a run restores from (Flink's `execution.state-recovery.claim-mode`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ClaimMode {
    /// The restored checkpoint stays its old run's: this run never deletes it, and its first
    /// checkpoint is self-contained (full, even with incremental checkpoints).
    #[default]
    NoClaim,
    /// This run owns the restored checkpoint and the job directories of the runs it descends
    /// from (this job's checkpoints under the restore root whose holders are gone): it deletes
    /// their older checkpoints, incomplete directories and unreferenced shared files at once,
    /// and the restored checkpoint itself once its own retained checkpoints subsume it.
    Claim,
}

/// The default [`JobConfig::job_lock_lease`] (Kubernetes' leader-election lease is 15 s too).
pub const DEFAULT_JOB_LOCK_LEASE: Duration = crate::lease::DEFAULT_JOB_LOCK_LEASE;

/// The default [`JobConfig::incremental_max_chain`].
pub const DEFAULT_INCREMENTAL_MAX_CHAIN: u32 = 10;

/// The default [`JobConfig::task_cancellation_timeout`]: short enough that a cancelled job ends
/// within a second whatever its operators do.
pub const DEFAULT_TASK_CANCELLATION_TIMEOUT: Duration = Duration::from_millis(300);

/// The ranges of a job's numeric settings, written once: [`JobConfig::validate`] checks them
/// when the job starts, and the `word_count` flags take the same.
pub mod limits {
    use std::ops::RangeInclusive;
    use std::time::Duration;

    /// Records per batch ([`JobConfig::batch_size`](super::JobConfig::batch_size)).
    pub const BATCH_SIZE: RangeInclusive<usize> = 1..=1 << 20;
    /// Credits per channel
    /// ([`JobConfig::buffers_per_channel`](super::JobConfig::buffers_per_channel)).
    pub const BUFFERS_PER_CHANNEL: RangeInclusive<usize> = 1..=1 << 16;
    /// Max parallelism, the number of key groups (Flink's bounds). A parallelism is at least 1
    /// and at most the operator's max parallelism.
    pub const MAX_PARALLELISM: RangeInclusive<u32> =
        1..=weir_core::keygroup::UPPER_BOUND_MAX_PARALLELISM;
    /// Completed checkpoints retained
    /// ([`CheckpointConfig::num_retained`](weir_core::config::CheckpointConfig::num_retained)).
    pub const RETAINED_CHECKPOINTS: RangeInclusive<u32> =
        1..=weir_core::config::MAX_RETAINED_CHECKPOINTS;
    /// The longest any duration setting may be: checkpoint interval, timeout and min pause,
    /// aligned checkpoint timeout, restart delays, the task cancellation timeout, heartbeats.
    pub const MAX_DURATION: Duration = weir_core::config::MAX_DURATION;
    /// The job directory lock's lease ([`JobConfig::job_lock_lease`](super::JobConfig::job_lock_lease)):
    /// from 100 ms (renewed every 33 ms) to an hour.
    pub const JOB_LOCK_LEASE: RangeInclusive<Duration> =
        Duration::from_millis(100)..=crate::lease::MAX_JOB_LOCK_LEASE;
}

/// `Ok` when `value` is in `range`, else an error naming the setting and the range.
fn in_range<T: PartialOrd + Display>(
    what: &str,
    value: T,
    range: RangeInclusive<T>,
) -> Result<(), JobError> {
    if range.contains(&value) {
        Ok(())
    } else {
        Err(JobError::Invalid(format!(
            "{what} {value} is out of range: it must be between {} and {}",
            range.start(),
            range.end()
        )))
    }
}

impl Default for JobConfig {
    fn default() -> Self {
        JobConfig {
            job_name: "weir-job".into(),
            job_id: None,
            parallelism: 1,
            max_parallelism: None,
            checkpoint: CheckpointConfig::default(),
            storage: StorageConfig::Filesystem(PathBuf::from("weir-checkpoints")),
            restart: None,
            restore_from: None,
            batch_size: 1024,
            buffers_per_channel: 2,
            task_cancellation_timeout: DEFAULT_TASK_CANCELLATION_TIMEOUT,
            savepoint_dir: None,
            allow_non_restored_state: false,
            source_config: BTreeMap::new(),
            allow_changed_sources: false,
            snapshot_compression: weir_state::Compression::None,
            incremental: false,
            incremental_max_chain: DEFAULT_INCREMENTAL_MAX_CHAIN,
            state_backend: Arc::new(weir_state::HeapStateBackend),
            cluster: None,
            rest: None,
            claim_mode: ClaimMode::NoClaim,
            job_lock_lease: DEFAULT_JOB_LOCK_LEASE,
            transport: None,
        }
    }
}

impl StorageConfig {
    /// Where another process finds this storage: an absolute directory path, an `s3://` URL
    /// (its credentials come from that process's environment) or a registered scheme's URL
    /// (that process must register the scheme too); `None` for storage only this process
    /// reaches.
    pub fn location(&self) -> Option<String> {
        match self {
            StorageConfig::Filesystem(p) => std::path::absolute(p)
                .ok()
                .and_then(|p| p.to_str().map(str::to_string)),
            StorageConfig::S3(c) => Some(c.url()),
            StorageConfig::Registered(url) => Some(url.clone()),
            StorageConfig::Memory | StorageConfig::Custom(_) => None,
        }
    }
}

impl JobConfig {
    /// Checks every numeric setting against [`limits`] and the checkpoint options' rules,
    /// naming the first that is wrong. (Each operator's parallelism is checked against its max
    /// parallelism when the job graph is built.)
    pub fn validate(&self) -> Result<(), JobError> {
        in_range("batch size", self.batch_size, limits::BATCH_SIZE)?;
        in_range(
            "buffers per channel",
            self.buffers_per_channel,
            limits::BUFFERS_PER_CHANNEL,
        )?;
        if let Some(m) = self.max_parallelism {
            in_range("max parallelism", m, limits::MAX_PARALLELISM)?;
        }
        self.checkpoint
            .validate()
            .map_err(|e| JobError::Invalid(e.to_string()))?;
        if let Some(r) = &self.restart {
            r.validate().map_err(JobError::Invalid)?;
        }
        if self.task_cancellation_timeout > limits::MAX_DURATION {
            return Err(JobError::Invalid(format!(
                "the task cancellation timeout ({:?}) must be at most {:?} (a day)",
                self.task_cancellation_timeout,
                limits::MAX_DURATION
            )));
        }
        if !limits::JOB_LOCK_LEASE.contains(&self.job_lock_lease) {
            return Err(JobError::Invalid(format!(
                "the job lock lease ({:?}) must be between {:?} and {:?}",
                self.job_lock_lease,
                limits::JOB_LOCK_LEASE.start(),
                limits::JOB_LOCK_LEASE.end()
            )));
        }
        Ok(())
    }

    /// The restart strategy in force.
    pub fn restart_strategy(&self) -> RestartStrategy {
        match &self.restart {
            Some(r) => r.clone(),
            None if self.checkpoint.is_enabled() => RestartStrategy::default_with_checkpointing(),
            None => RestartStrategy::NoRestart,
        }
    }
}

/// The storage a [`StorageConfig`] names, opened.
pub(crate) fn build_storage(
    config: &StorageConfig,
) -> Result<Arc<dyn CheckpointStorage>, JobError> {
    Ok(match config {
        StorageConfig::Filesystem(p) => Arc::new(OpendalCheckpointStorage::fs(p)?),
        StorageConfig::S3(c) => Arc::new(OpendalCheckpointStorage::s3(c.clone())?),
        StorageConfig::Memory => Arc::new(OpendalCheckpointStorage::memory()?),
        StorageConfig::Custom(s) => s.clone(),
        StorageConfig::Registered(url) => crate::schemes::open(url)?,
    })
}

/// Where and how the REST API is served.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RestOptions {
    /// The address to bind. A non-loopback address needs `allow_remote`.
    pub address: std::net::SocketAddr,
    /// If the port is taken, try the next ones, this many (then any free port): a second job on
    /// the machine still gets an API. The address bound is logged and in `JobClient::view`.
    pub port_attempts: u16,
    /// Binding to an address other than loopback is allowed.
    pub allow_remote: bool,
    /// Every mutating endpoint (trigger, savepoint, stop, cancel) refuses (Flink's
    /// `web.cancel.enable: false` and more).
    pub read_only: bool,
}

impl RestOptions {
    /// Flink's default, on loopback: `127.0.0.1:8081`, the next ports up to 8099 if taken.
    pub fn loopback() -> Self {
        RestOptions {
            address: std::net::SocketAddr::from(([127, 0, 0, 1], 8081)),
            port_attempts: 18,
            allow_remote: false,
            read_only: false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn out_of_range_settings_are_named_with_their_range() {
        let err = |c: JobConfig| c.validate().unwrap_err().to_string();
        for (config, needles) in [
            (
                JobConfig {
                    batch_size: usize::MAX,
                    ..JobConfig::default()
                },
                vec!["batch size 18446744073709551615", "between 1 and 1048576"],
            ),
            (
                JobConfig {
                    batch_size: 0,
                    ..JobConfig::default()
                },
                vec!["batch size 0", "between 1 and 1048576"],
            ),
            (
                JobConfig {
                    buffers_per_channel: 65_537,
                    ..JobConfig::default()
                },
                vec!["buffers per channel 65537", "between 1 and 65536"],
            ),
            (
                JobConfig {
                    max_parallelism: Some(u32::MAX),
                    ..JobConfig::default()
                },
                vec!["max parallelism 4294967295", "between 1 and 32768"],
            ),
            (
                JobConfig {
                    restart: Some(RestartStrategy::FixedDelay {
                        attempts: 1,
                        delay: Duration::MAX,
                    }),
                    ..JobConfig::default()
                },
                vec!["restart delay", "86400s"],
            ),
            (
                JobConfig {
                    task_cancellation_timeout: Duration::MAX,
                    ..JobConfig::default()
                },
                vec!["task cancellation timeout", "86400s"],
            ),
        ] {
            let msg = err(config);
            for n in needles {
                assert!(msg.contains(n), "{msg:?} does not mention {n:?}");
            }
        }
        let mut at_the_bounds = JobConfig {
            batch_size: *limits::BATCH_SIZE.end(),
            buffers_per_channel: *limits::BUFFERS_PER_CHANNEL.end(),
            max_parallelism: Some(*limits::MAX_PARALLELISM.end()),
            task_cancellation_timeout: limits::MAX_DURATION,
            ..JobConfig::default()
        };
        at_the_bounds.checkpoint.num_retained = *limits::RETAINED_CHECKPOINTS.end();
        assert!(at_the_bounds.validate().is_ok());
    }

    #[test]
    fn a_location_is_a_directory_unless_it_is_an_s3_url() {
        assert!(matches!(
            StorageConfig::from_location("weir-checkpoints"),
            Ok(StorageConfig::Filesystem(p)) if p == std::path::Path::new("weir-checkpoints")
        ));
        assert!(matches!(
            StorageConfig::from_location("/tmp/s3:/x"),
            Ok(StorageConfig::Filesystem(_))
        ));
        match StorageConfig::from_location("s3:///prefix") {
            Err(CheckpointError::Config(msg)) => assert!(msg.contains("no bucket"), "{msg}"),
            other => panic!("expected a Config error, got {other:?}"),
        }
        // A job prints local locations as file:// URLs; localhost is the same machine.
        for url in ["file:///tmp/x", "file://localhost/tmp/x"] {
            match StorageConfig::from_location(url) {
                Ok(StorageConfig::Filesystem(p)) => assert_eq!(p, std::path::Path::new("/tmp/x")),
                other => panic!("{url}: {other:?}"),
            }
        }
        match StorageConfig::from_location("S3://bucket/x") {
            Err(CheckpointError::Config(msg)) => assert!(msg.contains("lower case"), "{msg}"),
            other => panic!("expected a Config error, got {other:?}"),
        }
        match StorageConfig::from_location("nowhere://bucket/x") {
            Err(CheckpointError::Config(msg)) => assert!(msg.contains("nowhere://"), "{msg}"),
            other => panic!("expected a Config error, got {other:?}"),
        }
    }
}
