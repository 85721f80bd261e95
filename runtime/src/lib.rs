//! Weir's runtime: everything that runs a dataflow job, wired from the seams of `weir-state`,
//! `weir-checkpoint` and `weir-network`.
//!
//! - [`mod@env`]: the DataStream API ([`StreamEnvironment`], [`DataStream`], [`KeyedStream`]).
//! - [`operator`], [`ops`], [`keyed`], [`source`], [`sink`]: operators and the push-based chain
//!   they form inside a task (direct calls, no channel between chained operators).
//! - [`writer`]: the record writer at a chain's network edge (batching, partitioning, credits).
//! - `task`: the stream task's mailbox loop and the subtask side of checkpoints (steps 0–4).
//! - `deploy`: turning a JobGraph vertex into a running chain from typed node factories.
//! - `job`: the job master: deployment, the coordinator's actions, failover.
//! - `gateway`: how the job master reaches its subtasks: in this process, or on task managers.
//! - `restore`: choosing a checkpoint and assigning its state to subtasks.
//! - [`restart`]: restart strategies. [`config`]: job configuration.
//! - [`cli`]: the `weir` command-line tool (`weir checkpoints list | inspect | verify`).
//! - [`cluster`]: cluster mode's control plane: task managers register with the job manager over
//!   RPC, and heartbeats detect a lost process on either side.
//! - [`schemes`]: checkpoint storage by URL scheme, for custom storage reached by location.
//! - [`testing`]: for tests of one's own job: a gate that holds records (backpressure a test
//!   controls) and a driver that holds each checkpoint's barrier at it.
//!
//! Architecture invariant: this is the only crate that knows all seams and the only one that
//! owns tokio tasks. It talks to storage only through `CheckpointStorage`, to channels only
//! through `Transport`, to state only through the backends' APIs.
#![warn(missing_docs)]

pub mod broadcast;
mod claim;
#[cfg(feature = "cli")]
pub mod cli;
pub mod cluster;
pub mod co;
pub mod config;
pub(crate) mod deploy;
pub mod env;
pub mod error;
mod file_sink;
pub mod file_source;
pub(crate) mod gateway;
pub mod gc;
pub(crate) mod host;
pub mod idleness;
pub(crate) mod job;
pub mod join;
pub mod keyed;
mod lease;
pub(crate) mod local_recovery;
pub(crate) mod master;
pub(crate) mod minibatch;
pub mod operator;
pub mod ops;
pub(crate) mod placement;
pub mod rest;
pub mod restart;
pub(crate) mod restore;
mod roles;
pub mod schemes;
pub mod settings;
pub(crate) mod simulated_cluster;
pub mod sink;
pub mod source;
pub(crate) mod spec;
pub mod split_watermarks;
pub(crate) mod task;
pub mod testing;
pub(crate) mod upload;
pub(crate) mod verify;
pub mod window;
pub mod writer;

pub use config::{ClaimMode, JobConfig, StorageConfig};
pub use deploy::OperatorContext;
pub use env::{DataStream, KeyedStream, StreamEnvironment};
pub use error::{JobError, TaskError};
pub use file_source::{FileSource, ParseErrorPolicy};
pub use job::{JobCanceller, JobClient, JobView, RestoreView, VertexSample};
pub use local_recovery::RestoreFiles;
pub use restart::RestartStrategy;
pub use schemes::register_storage_scheme;
pub use sink::{CollectHandle, LatestHandle};
pub use spec::{JobResult, JobStatus};
/// The checkpoint crate (`_metadata` and its handles), for tools that read checkpoints.
pub use weir_checkpoint as checkpoint;
pub use weir_checkpoint::coordinator::{
    CheckpointFailureReason, CheckpointStats, CheckpointStatus, SubtaskCheckpointMetrics,
};
pub use weir_checkpoint::storage::S3Config;
pub use weir_core::config::{CheckpointConfig, CheckpointingMode, ExternalizedRetention};
/// A string kept inline up to 24 bytes, for keys that should cost no allocation per record
/// (word_count's words); it hashes, and so partitions, like the same text in a `String`.
pub use weir_core::{CompactString, ToCompactString};
/// What a stream's records must be (`Clone + Send + 'static` and serializable across the
/// network), so that a user's generic function over `DataStream<T>` needs no other crate.
pub use weir_network::Data;
/// The state crate, for the types user functions take (operator state backends, state handles
/// and descriptors), so a job depends on `weir-runtime` alone.
pub use weir_state as state;
pub use weir_state::Compression;
pub use weir_state::{DiskStateBackend, HeapStateBackend, MemoryStoreStateBackend, StateBackend};
pub use weir_state::{StateKey, StateValue, ValueState, ValueStateDescriptor};
