//! The errors of `weir-core`: bad parallelism, bad graphs, undecodable or corrupt bytes.

use thiserror::Error;

/// An error from the vocabulary crate. Each variant names the problem a user must fix.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum CoreError {
    /// Parallelism must be in `1..=max_parallelism`.
    #[error(
        "invalid parallelism {parallelism} for {what}: it must be between 1 and the max parallelism {max_parallelism}"
    )]
    InvalidParallelism {
        /// What the parallelism was set on.
        what: String,
        /// The value given.
        parallelism: u32,
        /// The max parallelism in force.
        max_parallelism: u32,
    },
    /// Max parallelism must be in `1..=32768`.
    #[error("invalid max parallelism {0}: it must be between 1 and 32768")]
    InvalidMaxParallelism(u32),
    /// The graph is not a valid dataflow.
    #[error("invalid job graph: {0}")]
    InvalidGraph(String),
    /// Bytes did not decode.
    #[error("cannot decode {what}: {reason}")]
    Decode {
        /// What was being decoded.
        what: String,
        /// Why it failed.
        reason: String,
    },
    /// A value did not encode.
    #[error("cannot encode {what}: {reason}")]
    Encode {
        /// What was being encoded.
        what: String,
        /// Why it failed.
        reason: String,
    },
    /// A file failed its magic, version, length or checksum check.
    #[error("corrupt {what}: {reason}")]
    Corrupt {
        /// The file or section.
        what: String,
        /// What check failed.
        reason: String,
    },
}
