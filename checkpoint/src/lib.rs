//! Weir's checkpointing: where checkpoints go, what they record, and the pure decisions of the
//! protocol.
//!
//! - [`storage`]: the [`CheckpointStorage`] seam and its opendal implementation (fs, memory, s3),
//!   with Flink's layout `<root>/<job-id>/chk-<n>/_metadata`.
//! - [`metadata`]: the `_metadata` format: versioned, checksummed, self-describing.
//! - [`coordinator`]: the CheckpointCoordinator as a state machine: events in, actions out.
//! - [`barrier`]: barrier handlers (the aligner) as state machines.
//! - [`store`]: the completed-checkpoint store: retention and what is subsumed.
//! - [`shared`]: the shared-state registry: which checkpoints reference each file of an
//!   incremental chain, and when a file may go.
//!
//! Architecture invariant: no tokio runtime, no threads, no network here. Storage is async code
//! over opendal; the coordinator and handlers are pure and testable without any I/O. This crate
//! knows nothing of state backends or transports: it stores bytes and handles from `weir-core`.
#![warn(missing_docs)]

pub mod barrier;
pub mod coordinator;
pub mod error;
pub mod metadata;
pub mod shared;
pub mod storage;
pub mod store;

pub use error::CheckpointError;
pub use metadata::{CheckpointMetadata, OperatorState};
pub use storage::{CheckpointLocation, CheckpointStorage, OpendalCheckpointStorage};
