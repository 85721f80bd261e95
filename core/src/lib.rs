//! Weir's shared vocabulary: what `state`, `checkpoint`, `network` and `runtime` all speak.
//!
//! - [`ids`]: job, vertex, operator, subtask, attempt and checkpoint ids.
//! - [`element`]: what flows on a channel: record batches and events (watermark, barrier, cancel
//!   marker, end of input).
//! - [`config`]: checkpointing options with Flink's meanings and defaults.
//! - [`keygroup`]: Flink's `KeyGroupRangeAssignment`, bit for bit, and the [`keygroup::KeyHash`] of
//!   keys.
//! - [`graph`]: StreamGraph → JobGraph (operator chains) → ExecutionGraph (subtasks, attempts).
//! - [`partition`]: how a record picks its output channel.
//! - [`channel_state`]: in-flight data of unaligned checkpoints and its file format.
//! - [`handle`]: state handles, the facts a snapshot leaves behind and a checkpoint records.
//! - [`fingerprint`]: what a checkpoint records of its job (operators, source settings).
//! - [`identity`]: the identity frame at the head of every state file, and file digests.
//! - [`codec`]: postcard encoding and the versioned, checksummed file envelope.
//! - [`redact`]: URLs without their credentials, for what is shown.
//! - [`sim`]: the hooks through which a deterministic simulation steers a job.
//! - [`error`]: the errors of this crate.
//!
//! Architecture invariant: no tokio, no I/O, no threads. Everything here is data and arithmetic.
#![warn(missing_docs)]

pub mod channel_state;
pub mod codec;
pub mod config;
pub mod element;
pub mod error;
pub mod fingerprint;
pub mod graph;
pub mod handle;
pub mod identity;
pub mod ids;
pub mod keygroup;
pub mod panic;
pub mod partition;
pub mod redact;
pub mod sim;
pub mod splitmix;

/// A string kept inline up to 24 bytes: a key type that costs no allocation per record.
pub use compact_str::{CompactString, ToCompactString};
pub use error::CoreError;
