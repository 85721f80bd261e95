//! The errors of `weir-state`.

use thiserror::Error;
use weir_core::CoreError;

/// An error from a state backend. Each variant names the state or file concerned.
#[derive(Debug, Error)]
pub enum StateError {
    /// More states than the format can number (`i16::MAX`).
    #[error(
        "too many registered states: at most {max} states per operator, and '{name}' would be number {count}"
    )]
    TooManyStates {
        /// The state that did not fit.
        name: String,
        /// How many there would be.
        count: usize,
        /// The limit.
        max: usize,
    },
    /// A state was registered again, or restored, with another kind or type (Flink's
    /// `StateMigrationException`).
    #[error("state '{name}' is incompatible: {reason}")]
    Incompatible {
        /// The state's name.
        name: String,
        /// What differs.
        reason: String,
    },
    /// A snapshot did not decode or failed its checks.
    #[error(transparent)]
    Core(#[from] CoreError),
    /// Writing a snapshot failed.
    #[error("cannot write the snapshot: {0}")]
    Io(#[from] std::io::Error),
    /// A restore was handed data that does not fit this backend.
    #[error("cannot restore: {0}")]
    Restore(String),
    /// A file or directory of the on-disk backend failed: damaged, foreign, or an I/O error.
    #[error("on-disk state at {}: {reason}", path.display())]
    Disk {
        /// The file or directory.
        path: std::path::PathBuf,
        /// What went wrong.
        reason: String,
    },
    /// A backend was configured wrongly (an unknown name, a store that cannot open).
    #[error("state backend configuration: {0}")]
    Config(String),
}
