//! A job's configuration: parallelism, checkpointing, storage, restarts and buffers.

use crate::restart::RestartStrategy;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use weir_checkpoint::storage::{S3Config, is_s3_url};
use weir_checkpoint::{CheckpointError, CheckpointStorage};
use weir_core::config::CheckpointConfig;

/// Where checkpoints go.
#[derive(Clone)]
pub enum StorageConfig {
    /// A local directory through opendal's fs service (the default: `./weir-checkpoints`).
    Filesystem(PathBuf),
    /// An S3 bucket and prefix through opendal's s3 service.
    S3(S3Config),
    /// opendal's memory service: gone with the process, for tests.
    Memory,
    /// Any other implementation of the storage seam.
    Custom(Arc<dyn CheckpointStorage>),
}

impl StorageConfig {
    /// The storage a user's `--checkpoint-dir` names: `s3://bucket/prefix` is S3, configured
    /// from the AWS environment variables ([`S3Config::from_url_and_env`]); anything else is a
    /// local directory. A bad `s3://` URL or missing credentials is a
    /// [`CheckpointError::Config`] naming the problem.
    pub fn from_location(location: &str) -> Result<StorageConfig, CheckpointError> {
        if is_s3_url(location) {
            Ok(StorageConfig::S3(S3Config::from_url_and_env(location)?))
        } else {
            Ok(StorageConfig::Filesystem(PathBuf::from(location)))
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
        }
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
    /// Credits per channel.
    pub buffers_per_channel: usize,
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
    /// Cluster mode: this process is the job manager or a task manager. `None`: the whole job
    /// runs in this process.
    pub cluster: Option<crate::cluster::ClusterRole>,
}

/// The default [`JobConfig::incremental_max_chain`].
pub const DEFAULT_INCREMENTAL_MAX_CHAIN: u32 = 10;

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
            buffers_per_channel: 4,
            savepoint_dir: None,
            allow_non_restored_state: false,
            source_config: BTreeMap::new(),
            allow_changed_sources: false,
            snapshot_compression: weir_state::Compression::None,
            incremental: false,
            incremental_max_chain: DEFAULT_INCREMENTAL_MAX_CHAIN,
            cluster: None,
        }
    }
}

impl StorageConfig {
    /// Where another process finds this storage: an absolute directory path or an `s3://` URL
    /// (its credentials come from that process's environment); `None` for storage only this
    /// process reaches.
    pub fn location(&self) -> Option<String> {
        match self {
            StorageConfig::Filesystem(p) => std::path::absolute(p)
                .ok()
                .and_then(|p| p.to_str().map(str::to_string)),
            StorageConfig::S3(c) => Some(c.url()),
            StorageConfig::Memory | StorageConfig::Custom(_) => None,
        }
    }
}

impl JobConfig {
    /// The restart strategy in force.
    pub fn restart_strategy(&self) -> RestartStrategy {
        match &self.restart {
            Some(r) => r.clone(),
            None if self.checkpoint.is_enabled() => RestartStrategy::default_with_checkpointing(),
            None => RestartStrategy::NoRestart,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
    }
}
