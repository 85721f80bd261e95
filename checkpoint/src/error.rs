//! The errors of `weir-checkpoint`.

use thiserror::Error;
use weir_core::CoreError;

/// An error from checkpoint storage or metadata. Storage errors keep opendal's kind, so callers
/// can branch on `NotFound`, `PermissionDenied` and the like.
#[derive(Debug, Error)]
pub enum CheckpointError {
    /// The storage service failed; `path` is the object concerned.
    #[error("checkpoint storage failed on '{path}': {source}")]
    Storage {
        /// The object or directory.
        path: String,
        /// opendal's error, with its `ErrorKind`.
        #[source]
        source: opendal::Error,
    },
    /// A file is corrupt or truncated (failed its checksum, length or format checks).
    #[error("corrupt checkpoint file '{path}': {reason}")]
    Corrupt {
        /// The file.
        path: String,
        /// What check failed.
        reason: String,
    },
    /// No complete checkpoint where one was expected.
    #[error(
        "no complete checkpoint at '{0}': no _metadata found in it, in its chk-* directories, or in its <job-id>/chk-* directories"
    )]
    NoCompleteCheckpoint(String),
    /// Another run holds the job directory (its `_lock` exists): two writers on one job
    /// directory would write the same `chk-<n>` names over each other.
    #[error(
        "the job directory '{path}' is held by another run ({holder}); two runs writing one job directory would corrupt each other's checkpoints. If that run is gone (killed), delete '{path}/_lock'"
    )]
    Locked {
        /// The job directory.
        path: String,
        /// What the lock says of its holder (process, host, since when).
        holder: String,
    },
    /// A run's job directory was taken over by another run (claim mode, after the lease
    /// expired unrenewed): this run must stop writing there.
    #[error(
        "the job directory '{path}' was taken over by another run ({by}): this run's lease on it expired unrenewed, so it stops rather than write beside the new holder"
    )]
    LockLost {
        /// The job directory.
        path: String,
        /// Who holds it now.
        by: String,
    },
    /// A local file to upload could not be read, or does not have the length expected.
    #[error("cannot upload the local file '{path}': {reason}")]
    LocalFile {
        /// The local file.
        path: String,
        /// What went wrong.
        reason: String,
    },
    /// The storage was configured wrongly.
    #[error("invalid checkpoint storage configuration: {0}")]
    Config(String),
    /// A value failed to encode or decode.
    #[error(transparent)]
    Core(#[from] CoreError),
}

impl CheckpointError {
    /// opendal's error kind, when this is a storage error.
    pub fn storage_kind(&self) -> Option<opendal::ErrorKind> {
        match self {
            CheckpointError::Storage { source, .. } => Some(source.kind()),
            _ => None,
        }
    }

    /// Whether the storage said the error is temporary (a retry may succeed): a timeout, a
    /// throttled or interrupted request, an injected fault.
    pub fn is_temporary(&self) -> bool {
        matches!(self, CheckpointError::Storage { source, .. } if source.is_temporary())
    }
}
