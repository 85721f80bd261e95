//! The `weir` command-line tool: `weir checkpoints list | inspect | verify` over a local checkpoint
//! directory or an `s3://bucket/prefix` (configured from the standard AWS variables, as a job's
//! `--checkpoint-dir s3://…` is), reading it only through [`CheckpointStorage`] and the state
//! formats. Paths are reported as absolute local paths, or as `s3://bucket/prefix/…` URLs.
//!
//! - `list <root>`: every checkpoint under a storage root (`<job-id>/chk-<n>`), a job directory
//!   or one `chk-<n>` directory, with its status: `COMPLETED`, `INCOMPLETE` (no `_metadata`),
//!   `CORRUPT` (`_metadata` fails its checks, with the reason) or `UNREADABLE` (storage error).
//! - `inspect <path> [--json]`: what one checkpoint holds (job, times, versions, every operator
//!   and subtask with its keyed and operator state and its native keyed snapshots, the in-flight
//!   data an unaligned checkpoint persisted per subtask and channel) and the verification of
//!   every file; exit code 1 when a check failed, as for `verify`.
//! - `verify <path>`: the checks of `inspect`, summarized; exit code 0 when everything is
//!   intact, 1 when something is corrupt, 2 for a usage error.
//!
//! When `inspect` or `verify` is given a root or a job directory, it takes the checkpoint a
//! restore from that path (`--from`) would take first: the last complete one in
//! `find_checkpoints` order (the highest id), and says which.
//!
//! Every check a restore makes is made here too, on every key group rather than only the ones a
//! subtask owns: `_metadata`'s envelope and checksum (every format version this build reads);
//! each state file's size and CRC-32 or digest, and its identity frame; each keyed snapshot's
//! header and every key-group section with its own CRC-32; each native keyed snapshot's
//! manifest and files, whose frames may name an older checkpoint (a file is shared, uploaded
//! once: `cli/native.rs`); each operator-state blob's envelope and content; each channel-state
//! file's envelope, batch framing and record counts; and the consistency of the handles with the
//! headers and of the channel-state handles with their files' sections.

use clap::{Parser, Subcommand};
use futures::FutureExt;
use serde::Serialize;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::Write;
use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};
use std::time::{Duration, UNIX_EPOCH};
use weir_checkpoint::metadata::{METADATA_MAGIC, METADATA_READ_VERSIONS, SubtaskInFlight};
use weir_checkpoint::storage::{CheckpointLocation, S3Config, is_s3_url};
use weir_checkpoint::{
    CheckpointError, CheckpointMetadata, CheckpointStorage, OpendalCheckpointStorage, OperatorState,
};
use weir_core::CoreError;
use weir_core::codec;
use weir_core::element::SnapshotKind;
use weir_core::handle::{KeyedStateHandle, OperatorStateHandle, StreamStateHandle, saturating_sum};
use weir_core::identity::{FileIdentity, StateFileKind};
use weir_core::ids::{JobId, OperatorId};
use weir_core::keygroup::KeyGroupRange;
use weir_state::format::{SnapshotHeader, whole_stream_part};

use crate::error::reason_of;
use crate::verify;

mod jobs;
mod native;
pub use native::{NativeFileReport, NativeHandleReport, NativeManifestReport};

/// The most section failures reported per keyed-state stream (the rest are counted).
const MAX_SECTION_PROBLEMS: usize = 5;
/// The name of the file whose presence marks a checkpoint complete.
const METADATA_FILE: &str = "_metadata";

// ---------------------------------------------------------------------------------------------
// Command line.

/// Weir's command-line tool.
#[derive(Debug, Parser)]
#[command(name = "weir", version, about = "Weir's command-line tool", long_about = None)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The command groups.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// List, inspect and verify checkpoints and savepoints in a local checkpoint directory or
    /// under an s3://bucket/prefix (configured from the AWS_* variables, as a job's).
    #[command(subcommand)]
    Checkpoints(CheckpointsCommand),
    /// List the jobs a REST API serves (Flink's `flink list`).
    List {
        /// The job's REST API.
        #[arg(long, default_value = DEFAULT_REST)]
        rest: String,
    },
    /// Cancel a job (Flink's `flink cancel`).
    Cancel {
        /// The job's id (`weir list`).
        job: String,
        /// The job's REST API.
        #[arg(long, default_value = DEFAULT_REST)]
        rest: String,
    },
    /// Take a savepoint of a running job and print its path (Flink's `flink savepoint`).
    Savepoint {
        /// The job's id.
        job: String,
        /// Where it goes (default: the job's savepoint directory).
        dir: Option<String>,
        /// The job's REST API.
        #[arg(long, default_value = DEFAULT_REST)]
        rest: String,
    },
    /// Stop a job with a savepoint and print its path (Flink's `flink stop`).
    Stop {
        /// The job's id.
        job: String,
        /// Where the savepoint goes (default: the job's savepoint directory).
        #[arg(long)]
        savepoint_path: Option<String>,
        /// Advance event time to the end first: every window fires before the savepoint.
        #[arg(long)]
        drain: bool,
        /// The job's REST API.
        #[arg(long, default_value = DEFAULT_REST)]
        rest: String,
    },
    /// Trigger a checkpoint of a running job now (Flink's `flink checkpoint`).
    Checkpoint {
        /// The job's id.
        job: String,
        /// The job's REST API.
        #[arg(long, default_value = DEFAULT_REST)]
        rest: String,
    },
}

/// Where the job verbs find a job's REST API unless told (Flink's default port, loopback).
const DEFAULT_REST: &str = "http://127.0.0.1:8081";

/// `weir checkpoints …`.
#[derive(Debug, Subcommand)]
pub enum CheckpointsCommand {
    /// List the checkpoints under a storage root, a job directory or a chk-N directory.
    ///
    /// One line each: status (COMPLETED; INCOMPLETE without _metadata; CORRUPT when _metadata
    /// fails its checks, with the reason; UNREADABLE), id, job, completion time (UTC), kind and
    /// state size (in-flight data included), then the path, marked when the checkpoint is
    /// unaligned (holds in-flight data); sorted by job, then id. Exits 0 even when some are
    /// corrupt; 2 when the path does not exist or holds no checkpoint.
    List {
        /// A storage root (holding JOB_ID/chk-N), a job directory or a chk-N directory; local,
        /// or s3://bucket/prefix[/JOB_ID[/chk-N]].
        root: PathBuf,
        /// Print one JSON document instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Show what a checkpoint holds and verify every file it references.
    ///
    /// The job, times and versions; then each operator (by uid), each subtask's keyed state (key
    /// groups, states from the snapshot header), operator state (states and redistribution
    /// modes) and native keyed snapshots (format, key groups, manifest, and each shared file
    /// with its key groups and the checkpoint that uploaded it), with sizes, files and the
    /// verification of each; then the in-flight data of an unaligned checkpoint, per subtask:
    /// its channel-state file and its sections (direction, channel, records, bytes). Given a
    /// root or job directory, inspects the latest complete checkpoint there and says so. Exits 0
    /// when every check passed, 1 when one failed (the report still shows everything, with the
    /// problems) or _metadata is corrupt or unreadable, 2 for a usage error.
    Inspect {
        /// A chk-N directory, or a root or job directory (the latest complete checkpoint);
        /// local, or s3://bucket/prefix[/JOB_ID[/chk-N]].
        path: PathBuf,
        /// Print one JSON document instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Verify _metadata and every file a checkpoint references.
    ///
    /// Checks _metadata's envelope and checksum, each state file's size and checksum and its
    /// identity frame, each keyed snapshot's header and every key-group section's checksum, each
    /// native keyed snapshot's manifest and files, each operator-state blob, and each
    /// channel-state file (in-flight data of an unaligned checkpoint): its envelope, every
    /// section's batches and record count, and the sections _metadata records for it.
    /// Prints `OK: checkpoint <id> of job <name>: <n> files, <bytes> bytes verified` and exits
    /// 0, or one `CORRUPT: <file>: <reason>` line per problem and exits 1; exits 2 for a usage
    /// error (a path that does not exist or holds no complete checkpoint).
    Verify {
        /// A chk-N directory, or a root or job directory (the latest complete checkpoint);
        /// local, or s3://bucket/prefix[/JOB_ID[/chk-N]].
        path: PathBuf,
    },
    /// List what no complete checkpoint under a root needs; delete it with --delete.
    ///
    /// In every job directory no running job holds: checkpoint directories without _metadata
    /// (INCOMPLETE), shared files no complete checkpoint's _metadata references (UNREFERENCED;
    /// none when a _metadata cannot be read), and job directories with no complete checkpoint
    /// at all (EMPTY-JOB, runs killed before their first). A complete checkpoint, and every file
    /// it references, is never deleted. A locked job directory is watched for its lock's lease
    /// first (15 s unless the run set --job-lock-lease): a renewed lock is a running job's, and
    /// its directory is skipped. With --delete, gc holds each directory while it deletes. Exits 0;
    /// 2 for a usage error.
    Gc {
        /// A checkpoint root (holding JOB_ID/chk-N): local, or s3://bucket/prefix.
        root: PathBuf,
        /// Delete what was found (default: only list it).
        #[arg(long)]
        delete: bool,
        /// Print one JSON document instead of text.
        #[arg(long)]
        json: bool,
    },
}

/// Why a command failed.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// The command was used wrongly: a path that does not exist, is not a directory, or holds no
    /// (complete) checkpoint; an `s3://` URL that cannot work (no bucket, an invalid name, missing
    /// credentials). Exit code 2.
    #[error("{0}")]
    Usage(String),
    /// A checkpoint could not be read: a corrupt `_metadata` where a report needs it, or a
    /// storage failure. Exit code 1.
    #[error("{0}")]
    Failed(String),
    /// Writing the output failed. Exit code 1.
    #[error("cannot write the output: {0}")]
    Output(#[from] std::io::Error),
}

impl CliError {
    /// The process exit code for this error.
    pub fn exit_code(&self) -> u8 {
        match self {
            CliError::Usage(_) => 2,
            CliError::Failed(_) | CliError::Output(_) => 1,
        }
    }
}

/// Runs a command, writing its output to `out`; returns the exit code (0, or 1 when `inspect`
/// or `verify` found corruption). Errors carry their own exit code ([`CliError::exit_code`]).
pub async fn run(cli: &Cli, out: &mut dyn Write) -> Result<u8, CliError> {
    match &cli.command {
        Command::List { rest } => jobs::list(rest, out),
        Command::Cancel { job, rest } => jobs::cancel(rest, job, out),
        Command::Savepoint { job, dir, rest } => jobs::savepoint(rest, job, dir.as_deref(), out),
        Command::Stop {
            job,
            savepoint_path,
            drain,
            rest,
        } => jobs::stop(rest, job, savepoint_path.as_deref(), *drain, out),
        Command::Checkpoint { job, rest } => jobs::checkpoint(rest, job, out),
        Command::Checkpoints(CheckpointsCommand::List { root, json }) => {
            let entries = list(root).await?;
            if *json {
                write_json(out, &entries)?;
            } else {
                out.write_all(render_list(&entries).as_bytes())?;
            }
            Ok(0)
        }
        Command::Checkpoints(CheckpointsCommand::Inspect { path, json }) => {
            let report = inspect(path).await?;
            if *json {
                write_json(out, &report)?;
            } else {
                out.write_all(render_inspect(&report).as_bytes())?;
            }
            // The report is complete, but a failed check is a problem, as for `verify`.
            Ok(if report.problems.is_empty() { 0 } else { 1 })
        }
        Command::Checkpoints(CheckpointsCommand::Verify { path }) => {
            let report = verify(path).await?;
            out.write_all(render_verify(&report).as_bytes())?;
            Ok(if report.problems.is_empty() { 0 } else { 1 })
        }
        Command::Checkpoints(CheckpointsCommand::Gc { root, delete, json }) => {
            let job_dir = root
                .file_name()
                .and_then(|n| n.to_str())
                .and_then(weir_core::ids::JobId::parse)
                .is_some();
            let opened = open(root)?;
            if job_dir {
                return Err(CliError::Usage(format!(
                    "'{}' is a job directory: gc takes the checkpoint root that holds it",
                    opened.shown
                )));
            }
            if !opened.rel.is_empty() {
                return Err(CliError::Usage(format!(
                    "'{}' is a checkpoint directory: gc takes a checkpoint root (holding <job-id>/chk-<n>)",
                    opened.shown
                )));
            }
            let storage: std::sync::Arc<dyn weir_checkpoint::CheckpointStorage> =
                std::sync::Arc::new(opened.storage.clone());
            let report = crate::gc::gc(storage, &|rel| opened.display(rel), *delete)
                .await
                .map_err(|e| CliError::Failed(format!("gc of '{}': {e}", opened.shown)))?;
            if *json {
                write_json(out, &report)?;
            } else {
                out.write_all(crate::gc::render_gc(&report).as_bytes())?;
            }
            Ok(0)
        }
    }
}

fn write_json<T: Serialize>(out: &mut dyn Write, value: &T) -> Result<(), CliError> {
    // serde_json keeps the kind of an I/O error (a broken pipe stays one).
    serde_json::to_writer_pretty(&mut *out, value)
        .map_err(|e| CliError::Output(std::io::Error::from(e)))?;
    out.write_all(b"\n")?;
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Reports.

/// A checkpoint's status in a listing.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum ListStatus {
    /// `_metadata` is present and passes its checks.
    Completed,
    /// No `_metadata`: the checkpoint was never completed (or is being written).
    Incomplete,
    /// `_metadata` fails its checks.
    Corrupt,
    /// `_metadata` could not be read (a storage error other than corruption).
    Unreadable,
}

impl ListStatus {
    /// The status as printed.
    pub fn as_str(self) -> &'static str {
        match self {
            ListStatus::Completed => "COMPLETED",
            ListStatus::Incomplete => "INCOMPLETE",
            ListStatus::Corrupt => "CORRUPT",
            ListStatus::Unreadable => "UNREADABLE",
        }
    }
}

/// One checkpoint in a listing.
#[derive(Clone, Debug, Serialize)]
pub struct ListEntry {
    /// Its status.
    pub status: ListStatus,
    /// Its id (from `chk-<n>`, or from `_metadata` for a directory named otherwise).
    pub id: Option<u64>,
    /// Its directory.
    pub path: String,
    /// The job's name (from `_metadata`).
    pub job_name: Option<String>,
    /// The job's id (from `_metadata`, or from the job directory's name).
    pub job_id: Option<String>,
    /// When it completed, UTC, ISO-8601.
    pub completed_at: Option<String>,
    /// When it completed, in ms since the Unix epoch.
    pub completion_timestamp_ms: Option<u64>,
    /// `checkpoint`, `savepoint` or `synchronous savepoint`.
    pub kind: Option<String>,
    /// Total bytes of state it references, in-flight data included.
    pub state_size: Option<u64>,
    /// Bytes of in-flight data (channel state) it references.
    pub in_flight_size: Option<u64>,
    /// Whether it is an unaligned checkpoint that persisted in-flight data.
    pub unaligned: Option<bool>,
    /// Why it is corrupt or unreadable.
    pub reason: Option<String>,
}

/// A problem found by verification.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Problem {
    /// The file concerned (`_metadata` for inline state and for the metadata itself).
    pub file: String,
    /// What check failed.
    pub reason: String,
}

/// The result of verifying one stream of state.
#[derive(Clone, Debug, Serialize)]
pub struct Verification {
    /// Whether every check passed.
    pub ok: bool,
    /// What was checked, or what failed.
    pub detail: String,
}

/// Where a stream of state is.
#[derive(Clone, Debug, Serialize)]
pub struct StreamReport {
    /// Whether it is inlined in `_metadata`.
    pub inline: bool,
    /// The file, when it is not inline.
    pub file: Option<String>,
    /// The file's checksum recorded in `_metadata`, when it is not inline: `xxh3-128 <hex>`
    /// (a digest), or `crc32 <hex>` for a file of a version 1 or 2 `_metadata`.
    pub checksum: Option<String>,
}

/// A key-group range (inclusive).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct KeyGroups {
    /// First key group.
    pub start: u32,
    /// Last key group, inclusive.
    pub end: u32,
    /// How many key groups (0 when `end < start`).
    pub count: u32,
}

impl From<KeyGroupRange> for KeyGroups {
    fn from(r: KeyGroupRange) -> Self {
        KeyGroups {
            start: r.start,
            end: r.end,
            count: r.len(),
        }
    }
}

/// One keyed state, from a keyed snapshot's header.
#[derive(Clone, Debug, Serialize)]
pub struct KeyedStateReport {
    /// Its id in the header.
    pub id: i16,
    /// Its name.
    pub name: String,
    /// Its kind (`value`, …).
    pub kind: String,
    /// The key type's name.
    pub key_type: String,
    /// The value type's name.
    pub value_type: String,
    /// The serializer version.
    pub serializer_version: u32,
}

/// One keyed-state handle of a subtask.
#[derive(Clone, Debug, Serialize)]
pub struct KeyedHandleReport {
    /// The key groups it covers.
    pub key_groups: KeyGroups,
    /// The max parallelism in its header (when the header could be read).
    pub max_parallelism: Option<u32>,
    /// Its states, from its header (empty when the header could not be read).
    pub states: Vec<KeyedStateReport>,
    /// Its size in bytes.
    pub size: u64,
    /// Where it is.
    pub stream: StreamReport,
    /// The verification of its bytes, header and sections.
    pub verification: Verification,
}

/// One operator state in an operator-state handle.
#[derive(Clone, Debug, Serialize)]
pub struct OperatorStateEntry {
    /// Its name.
    pub name: String,
    /// Its redistribution mode (`split-distribute`, `union`, `broadcast`).
    pub mode: String,
}

/// One operator-state handle of a subtask.
#[derive(Clone, Debug, Serialize)]
pub struct OperatorHandleReport {
    /// Its states with their redistribution modes.
    pub states: Vec<OperatorStateEntry>,
    /// Its size in bytes.
    pub size: u64,
    /// Where it is.
    pub stream: StreamReport,
    /// The verification of its bytes and content.
    pub verification: Verification,
}

/// The state of one subtask of an operator.
#[derive(Clone, Debug, Serialize)]
pub struct SubtaskReport {
    /// The subtask index.
    pub subtask: u32,
    /// Keyed-state handles.
    pub keyed: Vec<KeyedHandleReport>,
    /// Operator-state handles.
    pub operator: Vec<OperatorHandleReport>,
    /// Native keyed snapshots (a backend's own files and its manifest).
    pub native: Vec<NativeHandleReport>,
}

/// One operator of the checkpoint.
#[derive(Clone, Debug, Serialize)]
pub struct OperatorReport {
    /// Its operator id (32 hex digits).
    pub operator_id: String,
    /// Its uid, when the job set one.
    pub uid: Option<String>,
    /// Its name.
    pub name: String,
    /// Its parallelism.
    pub parallelism: u32,
    /// Its max parallelism (number of key groups).
    pub max_parallelism: u32,
    /// Total bytes of its state.
    pub state_size: u64,
    /// The subtasks that have state.
    pub subtasks: Vec<SubtaskReport>,
}

/// One section of a channel-state file: one channel's in-flight data, as `_metadata` records it.
#[derive(Clone, Debug, Serialize)]
pub struct ChannelSectionReport {
    /// `input` (persisted by the consumer) or `output` (by the producer).
    pub direction: String,
    /// The channel: `<from>[<producer>] -> <to>[<consumer>]`, operator ids shortened.
    pub channel: String,
    /// The producing operator's id.
    pub from_operator_id: String,
    /// The producing operator's name, when it is in the checkpoint.
    pub from_operator: Option<String>,
    /// The producing subtask.
    pub producer: u32,
    /// The consuming operator's id.
    pub to_operator_id: String,
    /// The consuming operator's name, when it is in the checkpoint.
    pub to_operator: Option<String>,
    /// The consuming subtask.
    pub consumer: u32,
    /// Records.
    pub records: u64,
    /// Bytes of batch data.
    pub bytes: u64,
}

/// The in-flight data an unaligned checkpoint persisted for one subtask.
#[derive(Clone, Debug, Serialize)]
pub struct InFlightReport {
    /// The id of the first operator of the subtask's chain.
    pub operator_id: String,
    /// Its name, when it is in the checkpoint.
    pub operator: Option<String>,
    /// Its uid, when it has one.
    pub uid: Option<String>,
    /// The subtask index.
    pub subtask: u32,
    /// The channel-state file's size in bytes.
    pub size: u64,
    /// Records over all sections.
    pub records: u64,
    /// Where it is.
    pub stream: StreamReport,
    /// Its sections.
    pub sections: Vec<ChannelSectionReport>,
    /// The verification of its bytes, sections and their agreement with `_metadata`.
    pub verification: Verification,
}

/// What `inspect` reports about one checkpoint.
#[derive(Clone, Debug, Serialize)]
pub struct InspectReport {
    /// The checkpoint's directory.
    pub checkpoint_dir: String,
    /// The root or job directory the user gave, when the checkpoint was chosen as the latest
    /// complete one there.
    pub selected_from: Option<String>,
    /// The `_metadata` file.
    pub metadata_file: String,
    /// Its size in bytes.
    pub metadata_size: u64,
    /// Its format version.
    pub format_version: u16,
    /// The job's name.
    pub job_name: String,
    /// The job's id.
    pub job_id: String,
    /// The checkpoint's id.
    pub checkpoint_id: u64,
    /// `checkpoint`, `savepoint` or `synchronous savepoint`.
    pub kind: String,
    /// When it was triggered, UTC, ISO-8601.
    pub trigger_time: String,
    /// When it was triggered, ms since the Unix epoch.
    pub trigger_timestamp_ms: u64,
    /// When it completed, UTC, ISO-8601.
    pub completion_time: String,
    /// When it completed, ms since the Unix epoch.
    pub completion_timestamp_ms: u64,
    /// The Weir version that wrote it.
    pub weir_version: String,
    /// Total bytes of state it references, in-flight data included.
    pub state_size: u64,
    /// Bytes of in-flight data (channel state) it references.
    pub in_flight_size: u64,
    /// Whether it is an unaligned checkpoint that persisted in-flight data.
    pub unaligned: bool,
    /// Every operator, in `_metadata` order.
    pub operators: Vec<OperatorReport>,
    /// The in-flight data of each subtask that persisted any, in `_metadata` order.
    pub in_flight: Vec<InFlightReport>,
    /// Files verified: `_metadata` and every distinct state file.
    pub files_verified: u64,
    /// Their total size in bytes.
    pub bytes_verified: u64,
    /// Every problem found; empty when the checkpoint is intact.
    pub problems: Vec<Problem>,
}

/// What `verify` reports.
#[derive(Clone, Debug, Serialize)]
pub struct VerifyReport {
    /// The checkpoint's directory.
    pub checkpoint_dir: String,
    /// The root or job directory the user gave, when the checkpoint was chosen there.
    pub selected_from: Option<String>,
    /// The checkpoint's id (unknown when `_metadata` is corrupt and the directory is not
    /// named `chk-<n>`).
    pub checkpoint_id: Option<u64>,
    /// The job's name (unknown when `_metadata` is corrupt).
    pub job_name: Option<String>,
    /// Files verified.
    pub files_verified: u64,
    /// Their total size in bytes.
    pub bytes_verified: u64,
    /// Every problem found; empty when the checkpoint is intact.
    pub problems: Vec<Problem>,
}

// ---------------------------------------------------------------------------------------------
// Opening a path.

/// A user-given path opened as checkpoint storage.
pub(crate) struct Opened {
    /// The path as the user gave it, for messages.
    pub(crate) shown: String,
    /// The storage root, as paths under it are shown.
    root: Root,
    pub(crate) storage: OpendalCheckpointStorage,
    /// The user's path relative to `root`: `""` or `chk-<n>/`.
    pub(crate) rel: String,
}

/// Where the storage root of an opened path is.
enum Root {
    /// A local directory (absolute): paths under it are shown as local paths.
    Local(PathBuf),
    /// An S3 prefix: paths under it are shown as `s3://bucket/prefix/…` (this URL, normalised,
    /// without a trailing `/`).
    S3(String),
}

/// A checkpoint directory found under a path.
struct Found {
    id: Option<u64>,
    location: CheckpointLocation,
    complete: bool,
}

impl Opened {
    /// How `rel` (a path relative to the storage root) is shown: a local path, or an `s3://`
    /// URL.
    pub(crate) fn display(&self, rel: &str) -> String {
        let rel = rel.trim_end_matches('/');
        match &self.root {
            Root::Local(root) if rel.is_empty() => root.display().to_string(),
            Root::Local(root) => root.join(rel).display().to_string(),
            Root::S3(url) if rel.is_empty() => url.clone(),
            Root::S3(url) => format!("{url}/{rel}"),
        }
    }

    /// Whether the storage root is on S3.
    fn is_s3(&self) -> bool {
        matches!(self.root, Root::S3(_))
    }
}

/// The id of a directory named `chk-<n>`, in canonical decimal (the storage's one parser).
fn parse_chk(name: &str) -> Option<u64> {
    weir_checkpoint::storage::parse_checkpoint_dir(name).map(|id| id.0)
}

/// Opens `path`: an `s3://bucket/prefix` URL (configured from the AWS variables) or a local
/// directory.
pub(crate) fn open(path: &Path) -> Result<Opened, CliError> {
    // `file:///dir` is how a job prints its local locations.
    if let Some(local) = path.to_str().and_then(|p| p.strip_prefix("file://")) {
        return open_local(Path::new(local));
    }
    match path.to_str().filter(|p| is_s3_url(p)) {
        Some(url) => open_s3(url, |name| std::env::var(name).ok()),
        None => open_local(path),
    }
}

/// Opens `s3://bucket/prefix[/<job-id>[/chk-<n>]]` as the job does (`--from`): configured from
/// the standard AWS variables (looked up by `var`), a trailing `chk-<n>` opened from its parent.
/// Nothing is requested here: a prefix that holds nothing is "no checkpoint" when it is listed.
fn open_s3(url: &str, var: impl Fn(&str) -> Option<String>) -> Result<Opened, CliError> {
    let shown = url.to_string();
    let trimmed = url.trim_end_matches('/');
    let (root_url, rel) = match trimmed.rsplit_once('/') {
        Some((parent, name)) if parse_chk(name).is_some() && parent.len() > "s3://".len() => {
            (parent, format!("{name}/"))
        }
        _ => (trimmed, String::new()),
    };
    let usage = |e: CheckpointError| match e {
        CheckpointError::Config(msg) => CliError::Usage(format!("cannot open '{shown}': {msg}")),
        e => CliError::Failed(format!("cannot open '{shown}' as checkpoint storage: {e}")),
    };
    let config = S3Config::from_url_and_vars(root_url, var).map_err(usage)?;
    let root = Root::S3(config.url());
    let storage = OpendalCheckpointStorage::s3(config).map_err(usage)?;
    Ok(Opened {
        shown,
        root,
        storage,
        rel,
    })
}

/// Opens a local directory.
fn open_local(path: &Path) -> Result<Opened, CliError> {
    let shown = path.display().to_string();
    let meta = std::fs::metadata(path).map_err(|e| {
        if e.kind() == std::io::ErrorKind::NotFound {
            CliError::Usage(format!("'{shown}' does not exist"))
        } else {
            CliError::Usage(format!("cannot read '{shown}': {e}"))
        }
    })?;
    if !meta.is_dir() {
        return Err(CliError::Usage(format!(
            "'{shown}' is not a directory: expected a checkpoint root (holding <job-id>/chk-<n>), \
             a job directory or a chk-<n> directory"
        )));
    }
    let absolute = std::fs::canonicalize(path)
        .or_else(|_| std::path::absolute(path))
        .map_err(|e| CliError::Usage(format!("cannot resolve '{shown}': {e}")))?;
    // A `chk-<n>` directory is opened from its parent, so that its id comes from its name (and a
    // corrupt or missing `_metadata` is reported, not fatal to finding it).
    let chk_name = absolute
        .file_name()
        .and_then(|n| n.to_str())
        .filter(|n| parse_chk(n).is_some())
        .map(str::to_string);
    let (root, rel) = match (chk_name, absolute.parent()) {
        (Some(name), Some(parent)) => (parent.to_path_buf(), format!("{name}/")),
        _ => (absolute.clone(), String::new()),
    };
    let storage = OpendalCheckpointStorage::fs(&root).map_err(|e| {
        CliError::Failed(format!("cannot open '{shown}' as checkpoint storage: {e}"))
    })?;
    Ok(Opened {
        shown,
        root: Root::Local(root),
        storage,
        rel,
    })
}

/// Whether the storage root itself holds a `_metadata` file.
async fn root_has_metadata(opened: &Opened) -> bool {
    match &opened.root {
        Root::Local(root) => root.join(METADATA_FILE).is_file(),
        Root::S3(_) => matches!(
            opened.storage.operator().stat(METADATA_FILE).await,
            Ok(meta) if meta.mode().is_file()
        ),
    }
}

/// Every checkpoint under the opened path, sorted by id (as `find_checkpoints`).
async fn find(opened: &Opened) -> Result<Vec<Found>, CliError> {
    // opendal 0.59's fs lister panics on a symbolic link to a directory ("mode DIR not match
    // with path …"); that is reported as an error naming the path, not as a crash.
    let listed = AssertUnwindSafe(opened.storage.find_checkpoints(&opened.rel))
        .catch_unwind()
        .await
        .map_err(|payload| {
            CliError::Failed(format!(
                "cannot list checkpoints under '{}': the storage library failed ({}){}",
                opened.shown,
                panic_message(payload.as_ref()),
                if opened.is_s3() {
                    ""
                } else {
                    "; a symbolic link to a directory inside it is a known cause"
                }
            ))
        })?;
    match listed {
        Ok(listings) => Ok(listings
            .into_iter()
            .map(|l| Found {
                id: Some(l.id.0),
                location: l.location,
                complete: l.complete,
            })
            .collect()),
        // A directory that holds a `_metadata` but is not named `chk-<n>` (a savepoint moved
        // elsewhere): its id comes from `_metadata`, which failed; it is still one checkpoint.
        Err(CheckpointError::Corrupt { .. })
            if opened.rel.is_empty() && root_has_metadata(opened).await =>
        {
            Ok(vec![Found {
                id: None,
                location: CheckpointLocation { dir: String::new() },
                complete: true,
            }])
        }
        Err(e) => Err(CliError::Failed(format!(
            "cannot list checkpoints under '{}': {e}",
            opened.shown
        ))),
    }
}

/// The message of a caught panic.
pub use weir_core::panic::panic_message;

fn no_checkpoint(opened: &Opened) -> CliError {
    let shown = &opened.shown;
    if opened.is_s3() {
        CliError::Usage(format!(
            "no checkpoint under '{shown}': nothing there is a checkpoint root (holding \
             <job-id>/chk-<n>/), a job prefix (holding chk-<n>/) or a chk-<n> prefix (on S3 a \
             prefix nothing was written to is empty, not missing: check the bucket and prefix)"
        ))
    } else {
        CliError::Usage(format!(
            "no checkpoint under '{shown}': expected a checkpoint root (holding \
             <job-id>/chk-<n>), a job directory (holding chk-<n>) or a chk-<n> directory"
        ))
    }
}

// ---------------------------------------------------------------------------------------------
// Reading `_metadata`.

/// `_metadata`, read and checked.
struct LoadedMetadata {
    metadata: CheckpointMetadata,
    format_version: u16,
    size: u64,
}

enum MetadataRead {
    Ok(Box<LoadedMetadata>),
    /// Why it is corrupt, and its size in bytes.
    Corrupt(String, u64),
    Unreadable(String),
}

async fn read_metadata(opened: &Opened, found: &Found) -> MetadataRead {
    let rel = found.location.metadata_path();
    let shown = opened.display(&rel);
    let bytes = match opened.storage.operator().read(&rel).await {
        Ok(buffer) => buffer.to_vec(),
        Err(e) if e.kind() == opendal::ErrorKind::NotFound => {
            return MetadataRead::Unreadable("_metadata does not exist".to_string());
        }
        Err(e) => return MetadataRead::Unreadable(format!("cannot read '{shown}': {e}")),
    };
    let size = bytes.len() as u64;
    // The envelope first, for its version and a reason without the path (the caller names the
    // file); then the payload, as `read_metadata` decodes it.
    let format_version = match codec::open(
        METADATA_FILE,
        METADATA_MAGIC,
        &METADATA_READ_VERSIONS,
        &bytes,
    ) {
        Ok((version, _)) => version,
        Err(CoreError::Corrupt { reason, .. }) => return MetadataRead::Corrupt(reason, size),
        Err(e) => return MetadataRead::Corrupt(e.to_string(), size),
    };
    let metadata = match CheckpointMetadata::from_bytes(METADATA_FILE, &bytes) {
        Ok(m) => m,
        Err(CheckpointError::Corrupt { reason, .. }) => {
            return MetadataRead::Corrupt(reason, size);
        }
        Err(e) => return MetadataRead::Corrupt(e.to_string(), size),
    };
    if let Err(reason) = metadata.check_location(&found.location) {
        return MetadataRead::Corrupt(reason, size);
    }
    MetadataRead::Ok(Box::new(LoadedMetadata {
        metadata,
        format_version,
        size,
    }))
}

// ---------------------------------------------------------------------------------------------
// list.

/// The name of the directory (or S3 prefix) that holds `path`, a local path or an `s3://` URL:
/// the job directory of a checkpoint directory.
fn parent_name(path: &str) -> Option<&str> {
    let separators = ['/', std::path::MAIN_SEPARATOR];
    let mut segments = path.trim_end_matches(separators).rsplit(separators);
    segments.next()?;
    segments.next().filter(|name| !name.is_empty())
}

/// Lists every checkpoint under `root` (a storage root, a job directory or a `chk-<n>`
/// directory), sorted by job, then id. Corrupt checkpoints are entries, not errors; a path that
/// does not exist or holds no checkpoint is a [`CliError::Usage`].
pub async fn list(root: &Path) -> Result<Vec<ListEntry>, CliError> {
    let opened = open(root)?;
    let found = find(&opened).await?;
    if found.is_empty() {
        return Err(no_checkpoint(&opened));
    }
    let mut entries = Vec::with_capacity(found.len());
    for f in &found {
        let path = opened.display(&f.location.dir);
        let dir_job_id = parent_name(&path)
            .and_then(JobId::parse)
            .map(|j| j.to_string());
        let mut entry = ListEntry {
            status: ListStatus::Incomplete,
            id: f.id,
            path,
            job_name: None,
            job_id: dir_job_id,
            completed_at: None,
            completion_timestamp_ms: None,
            kind: None,
            state_size: None,
            in_flight_size: None,
            unaligned: None,
            reason: None,
        };
        if f.complete {
            match read_metadata(&opened, f).await {
                MetadataRead::Ok(loaded) => {
                    let m = &loaded.metadata;
                    entry.status = ListStatus::Completed;
                    entry.id = Some(m.checkpoint_id.0);
                    entry.job_name = Some(m.job_name.clone());
                    entry.job_id = Some(m.job_id.to_string());
                    entry.completed_at = Some(format_time(m.completion_timestamp_ms));
                    entry.completion_timestamp_ms = Some(m.completion_timestamp_ms);
                    entry.kind = Some(kind_name(m.kind).to_string());
                    entry.state_size = Some(m.state_size());
                    entry.in_flight_size = Some(m.in_flight_size());
                    entry.unaligned = Some(!m.in_flight.is_empty());
                }
                MetadataRead::Corrupt(reason, _) => {
                    entry.status = ListStatus::Corrupt;
                    entry.reason = Some(format!("_metadata: {reason}"));
                }
                MetadataRead::Unreadable(reason) => {
                    entry.status = ListStatus::Unreadable;
                    entry.reason = Some(format!("_metadata: {reason}"));
                }
            }
        }
        entries.push(entry);
    }
    // By job (its name, known from any readable `_metadata` of the job), then id.
    let names: BTreeMap<String, String> = entries
        .iter()
        .filter_map(|e| Some((e.job_id.clone()?, e.job_name.clone()?)))
        .collect();
    entries.sort_by_cached_key(|e| {
        let name = e
            .job_name
            .clone()
            .or_else(|| e.job_id.as_ref().and_then(|j| names.get(j).cloned()))
            .unwrap_or_default();
        (name, e.job_id.clone(), e.id, e.path.clone())
    });
    Ok(entries)
}

/// Renders a listing as a table, one line per checkpoint.
pub fn render_list(entries: &[ListEntry]) -> String {
    let dash = || "-".to_string();
    let rows: Vec<[String; 7]> = entries
        .iter()
        .map(|e| {
            [
                e.status.as_str().to_string(),
                e.id.map_or_else(|| "?".to_string(), |i| i.to_string()),
                e.job_name.clone().unwrap_or_else(dash),
                e.job_id.clone().unwrap_or_else(dash),
                e.completed_at.clone().unwrap_or_else(dash),
                e.kind.clone().unwrap_or_else(dash),
                e.state_size.map_or_else(dash, size_text),
            ]
        })
        .collect();
    let header = [
        "STATUS",
        "ID",
        "JOB",
        "JOB ID",
        "COMPLETED (UTC)",
        "KIND",
        "STATE SIZE",
    ];
    let mut widths = header.map(str::len);
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut s = String::new();
    let line = |s: &mut String, cells: &[&str], last: &str| {
        for (i, (cell, w)) in cells.iter().zip(widths).enumerate() {
            // The id is right-aligned; the rest left.
            if i == 1 {
                let _ = write!(s, "{cell:>w$}  ");
            } else {
                let _ = write!(s, "{cell:<w$}  ");
            }
        }
        s.push_str(last);
        let trimmed = s.trim_end().len();
        s.truncate(trimmed);
        s.push('\n');
    };
    line(&mut s, &header, "PATH");
    for (row, e) in rows.iter().zip(entries) {
        let cells: Vec<&str> = row.iter().map(String::as_str).collect();
        let last = match (&e.reason, e.unaligned, e.in_flight_size) {
            (Some(reason), _, _) => format!("{}  ({reason})", e.path),
            (None, Some(true), Some(size)) => {
                format!("{}  (unaligned: {} in flight)", e.path, size_text(size))
            }
            _ => e.path.clone(),
        };
        line(&mut s, &cells, &last);
    }
    s
}

// ---------------------------------------------------------------------------------------------
// inspect and verify.

/// The outcome of checking a checkpoint.
enum Checked {
    Report(Box<InspectReport>),
    /// `_metadata` is corrupt, so nothing else can be checked.
    MetadataCorrupt {
        checkpoint_dir: String,
        selected_from: Option<String>,
        id: Option<u64>,
        /// `_metadata`'s size in bytes.
        size: u64,
        problem: Problem,
    },
}

/// Inspects one checkpoint: the `chk-<n>` directory `path`, or the latest complete checkpoint
/// under a root or job directory. Every file is verified; failed checks are in
/// [`InspectReport::problems`] and in each handle's verification. A corrupt `_metadata` is a
/// [`CliError::Failed`].
pub async fn inspect(path: &Path) -> Result<InspectReport, CliError> {
    match check(path).await? {
        Checked::Report(report) => Ok(*report),
        Checked::MetadataCorrupt { problem, .. } => Err(CliError::Failed(format!(
            "corrupt checkpoint metadata '{}': {}",
            problem.file, problem.reason
        ))),
    }
}

/// Verifies one checkpoint (chosen as by [`inspect`]): `_metadata` and every file it references.
pub async fn verify(path: &Path) -> Result<VerifyReport, CliError> {
    Ok(match check(path).await? {
        Checked::Report(r) => VerifyReport {
            checkpoint_dir: r.checkpoint_dir,
            selected_from: r.selected_from,
            checkpoint_id: Some(r.checkpoint_id),
            job_name: Some(r.job_name),
            files_verified: r.files_verified,
            bytes_verified: r.bytes_verified,
            problems: r.problems,
        },
        Checked::MetadataCorrupt {
            checkpoint_dir,
            selected_from,
            id,
            size,
            problem,
        } => VerifyReport {
            checkpoint_dir,
            selected_from,
            checkpoint_id: id,
            job_name: None,
            files_verified: 1,
            bytes_verified: size,
            problems: vec![problem],
        },
    })
}

/// Renders a verification: an `OK:` line, or one `CORRUPT:` line per problem.
pub fn render_verify(r: &VerifyReport) -> String {
    let mut s = String::new();
    if let Some(from) = &r.selected_from {
        let _ = writeln!(
            s,
            "Verifying {} (the latest complete checkpoint under {from})",
            r.checkpoint_dir
        );
    }
    if r.problems.is_empty() {
        let _ = writeln!(
            s,
            "OK: checkpoint {} of job {}: {} files, {} bytes verified",
            r.checkpoint_id
                .map_or_else(|| "?".to_string(), |i| i.to_string()),
            r.job_name.as_deref().unwrap_or("?"),
            r.files_verified,
            r.bytes_verified
        );
    } else {
        for p in &r.problems {
            let _ = writeln!(s, "CORRUPT: {}: {}", p.file, p.reason);
        }
    }
    s
}

/// Chooses the checkpoint under `path` and checks it.
async fn check(path: &Path) -> Result<Checked, CliError> {
    let opened = open(path)?;
    let found = find(&opened).await?;
    if found.is_empty() {
        return Err(no_checkpoint(&opened));
    }
    // The path itself is a checkpoint directory: that one, complete or not.
    let chosen = if let Some(f) = found.iter().find(|f| f.location.dir == opened.rel) {
        if !f.complete {
            return Err(CliError::Usage(format!(
                "'{}' is an incomplete checkpoint: it has no _metadata",
                opened.shown
            )));
        }
        f
    } else {
        // A root or job directory: the checkpoint a restore from it would try first.
        match found.iter().rev().find(|f| f.complete) {
            Some(f) => f,
            None => {
                return Err(CliError::Usage(format!(
                    "no complete checkpoint under '{}': {} checkpoint director{} without _metadata",
                    opened.shown,
                    found.len(),
                    if found.len() == 1 { "y" } else { "ies" }
                )));
            }
        }
    };
    let checkpoint_dir = opened.display(&chosen.location.dir);
    let selected_from = (chosen.location.dir != opened.rel).then(|| opened.shown.clone());
    let metadata_file = opened.display(&chosen.location.metadata_path());
    let loaded = match read_metadata(&opened, chosen).await {
        MetadataRead::Ok(loaded) => loaded,
        MetadataRead::Corrupt(reason, size) => {
            return Ok(Checked::MetadataCorrupt {
                checkpoint_dir,
                selected_from,
                id: chosen.id,
                size,
                problem: Problem {
                    file: metadata_file,
                    reason,
                },
            });
        }
        MetadataRead::Unreadable(reason) => {
            return Err(CliError::Failed(format!(
                "cannot read the checkpoint metadata '{metadata_file}': {reason}"
            )));
        }
    };
    let mut checker = Checker {
        opened: &opened,
        location: &chosen.location,
        metadata_file: metadata_file.clone(),
        problems: Vec::new(),
        files: BTreeMap::new(),
    };
    let m = &loaded.metadata;
    for reason in verify::metadata_self_problems(m) {
        checker.problems.push(Problem {
            file: checker.metadata_file.clone(),
            reason,
        });
    }
    let mut operators = Vec::with_capacity(m.operators.len());
    for op in &m.operators {
        operators.push(checker.operator(m, op).await);
    }
    let mut in_flight = Vec::with_capacity(m.in_flight.len());
    for entry in &m.in_flight {
        in_flight.push(checker.in_flight(m, entry).await);
    }
    let files_verified = 1 + checker.files.len() as u64;
    let bytes_verified =
        saturating_sum(checker.files.values().copied()).saturating_add(loaded.size);
    Ok(Checked::Report(Box::new(InspectReport {
        checkpoint_dir,
        selected_from,
        metadata_file,
        metadata_size: loaded.size,
        format_version: loaded.format_version,
        job_name: m.job_name.clone(),
        job_id: m.job_id.to_string(),
        checkpoint_id: m.checkpoint_id.0,
        kind: kind_name(m.kind).to_string(),
        trigger_time: format_time(m.trigger_timestamp_ms),
        trigger_timestamp_ms: m.trigger_timestamp_ms,
        completion_time: format_time(m.completion_timestamp_ms),
        completion_timestamp_ms: m.completion_timestamp_ms,
        weir_version: m.weir_version.clone(),
        state_size: m.state_size(),
        in_flight_size: m.in_flight_size(),
        unaligned: !m.in_flight.is_empty(),
        operators,
        in_flight,
        files_verified,
        bytes_verified,
        problems: checker.problems,
    })))
}

/// Checks the state of one checkpoint, collecting problems and the files seen.
struct Checker<'a> {
    opened: &'a Opened,
    location: &'a CheckpointLocation,
    metadata_file: String,
    problems: Vec<Problem>,
    /// Every distinct state file (relative to the storage root) and its size.
    files: BTreeMap<String, u64>,
}

/// What a stream's problems are about: which file, and, for inline state, which part of
/// `_metadata`.
struct Subject {
    file: String,
    prefix: String,
}

impl Checker<'_> {
    /// The file of a handle relative to the storage root, resolved lexically; `None` when it
    /// leaves the root.
    fn resolve(&self, path: &str) -> Option<String> {
        let mut parts: Vec<&str> = self
            .location
            .dir
            .split('/')
            .filter(|s| !s.is_empty())
            .collect();
        if path.is_empty() || path.starts_with('/') {
            return None;
        }
        for seg in path.split('/') {
            match seg {
                "" | "." => {}
                ".." => {
                    parts.pop()?;
                }
                s => parts.push(s),
            }
        }
        Some(parts.join("/"))
    }

    fn stream_report(&self, stream: &StreamStateHandle) -> StreamReport {
        match stream {
            StreamStateHandle::Inline(_) => StreamReport {
                inline: true,
                file: None,
                checksum: None,
            },
            StreamStateHandle::File { path, .. } | StreamStateHandle::LegacyFile { path, .. } => {
                StreamReport {
                    inline: false,
                    file: Some(match self.resolve(path) {
                        Some(rel) => self.opened.display(&rel),
                        None => path.clone(),
                    }),
                    checksum: stream.checksum_text(),
                }
            }
        }
    }

    fn subject(&self, stream: &StreamStateHandle, what: &str) -> Subject {
        match stream {
            StreamStateHandle::Inline(_) => Subject {
                file: self.metadata_file.clone(),
                prefix: format!("inline {what}: "),
            },
            StreamStateHandle::File { path, .. } | StreamStateHandle::LegacyFile { path, .. } => {
                Subject {
                    file: match self.resolve(path) {
                        Some(rel) => self.opened.display(&rel),
                        None => path.clone(),
                    },
                    prefix: String::new(),
                }
            }
        }
    }

    fn note_file(&mut self, stream: &StreamStateHandle) {
        if let Some(path) = stream.path()
            && let Some(rel) = self.resolve(path)
        {
            self.files.insert(rel, stream.size());
        }
    }

    /// Reads a whole stream (verifying a file's size and CRC-32).
    async fn read_whole(&self, stream: &StreamStateHandle) -> Result<bytes::Bytes, String> {
        self.opened
            .storage
            .read_state(self.location, stream, None)
            .await
            .map_err(|e| reason_of(&e))
    }

    /// The raw bytes of a file whose verified read failed, to locate the damage; `None` when
    /// they cannot be read either.
    async fn read_raw(&self, stream: &StreamStateHandle) -> Option<Vec<u8>> {
        let rel = self.resolve(stream.path()?)?;
        self.opened
            .storage
            .operator()
            .read(&rel)
            .await
            .ok()
            .map(|b| b.to_vec())
    }

    async fn operator(&mut self, m: &CheckpointMetadata, op: &OperatorState) -> OperatorReport {
        let mut subtasks = Vec::with_capacity(op.subtasks.len());
        for (&index, state) in &op.subtasks {
            let who = verify::who(op, index);
            let mut keyed = Vec::with_capacity(state.keyed.len());
            let mut frames = Vec::with_capacity(state.keyed.len());
            for h in &state.keyed {
                let (report, frame) = self.keyed(m, op, h, &who).await;
                keyed.push(report);
                frames.extend(frame);
            }
            // The frames of a subtask's keyed files, its incremental chain as a whole.
            if m.has_identity_frames()
                && frames.len() == state.keyed.len()
                && let Err(reason) =
                    verify::check_keyed_frames(m, op.operator_id, index, &state.keyed, &frames)
                && let Some(last) = state.keyed.last()
            {
                let subject = self.subject(&last.stream, &format!("keyed state of {who}"));
                self.problems.push(Problem {
                    file: subject.file,
                    reason: format!("{}{reason}", subject.prefix),
                });
                if let Some(r) = keyed.last_mut() {
                    r.verification.ok = false;
                    r.verification.detail = reason;
                }
            }
            let mut operator = Vec::with_capacity(state.operator.len());
            for h in &state.operator {
                operator.push(self.operator_state(m, op, index, h, &who).await);
            }
            let mut native = Vec::with_capacity(state.native.len());
            for h in &state.native {
                native.push(self.native(m, op.operator_id, index, h, &who).await);
            }
            subtasks.push(SubtaskReport {
                subtask: index,
                keyed,
                operator,
                native,
            });
        }
        OperatorReport {
            operator_id: op.operator_id.to_string(),
            uid: op.uid.clone(),
            name: op.name.clone(),
            parallelism: op.parallelism,
            max_parallelism: op.max_parallelism,
            state_size: op.state_size(),
            subtasks,
        }
    }

    /// Checks one keyed handle as a restore reads it (the header by its range), then the
    /// whole file: size, digest, identity frame (returned, for the chain check) and every
    /// key-group section.
    async fn keyed(
        &mut self,
        m: &CheckpointMetadata,
        op: &OperatorState,
        h: &KeyedStateHandle,
        who: &str,
    ) -> (KeyedHandleReport, Option<FileIdentity>) {
        self.note_file(&h.stream);
        let subject = self.subject(&h.stream, &format!("keyed state of {who}"));
        let mut errors: Vec<String> = Vec::new();
        let range = h.key_group_range;

        // The header, read by its range as a restore reads it.
        let mut states = Vec::new();
        let mut header_max_parallelism = None;
        match self
            .opened
            .storage
            .read_state(self.location, &h.stream, Some(h.header))
            .await
        {
            Ok(bytes) => match verify::check_keyed_header(op, h, &bytes) {
                Ok(header) => {
                    header_max_parallelism = Some(header.max_parallelism);
                    states = header
                        .states
                        .iter()
                        .map(|s| KeyedStateReport {
                            id: s.id,
                            name: s.name.clone(),
                            kind: s.kind.to_string(),
                            key_type: s.key_type.clone(),
                            value_type: s.value_type.clone(),
                            serializer_version: s.serializer_version,
                        })
                        .collect();
                }
                Err(e) => errors.extend(e),
            },
            Err(e) => errors.push(format!("header: {}", reason_of(&e))),
        }

        // The whole stream (size and digest of a file), its frame, then every section.
        let mut sections_checked = None;
        let mut frame = None;
        match self.read_whole(&h.stream).await {
            Ok(bytes) => {
                if h.end != bytes.len() as u64 {
                    errors.push(format!(
                        "the handle says the stream ends at byte {}, it has {} bytes",
                        h.end,
                        bytes.len()
                    ));
                }
                if m.has_identity_frames() {
                    match weir_core::identity::open_frame(&bytes) {
                        Ok((identity, _)) => frame = Some(identity),
                        Err(e) => errors.push(e.to_string()),
                    }
                }
                match check_sections(h, &bytes) {
                    Ok(n) => sections_checked = Some(n),
                    Err(section_errors) => errors.extend(section_errors),
                }
            }
            Err(reason) => {
                errors.push(reason);
                // Locate the damage: the key groups whose sections fail their own checksums.
                if let Some(raw) = self.read_raw(&h.stream).await
                    && let Err(section_errors) = check_sections(h, &raw)
                {
                    errors.extend(section_errors);
                }
            }
        }

        let verification = self.conclude(
            &subject,
            errors,
            match (&h.stream, sections_checked) {
                (StreamStateHandle::Inline(_), Some(n)) => format!(
                    "inline (covered by _metadata's checksum); header and {n} key-group sections \
                     checked"
                ),
                (_, Some(n)) => format!(
                    "size and {} match; header and {n} key-group sections checked",
                    checksum_name(&h.stream)
                ),
                (_, None) => String::new(),
            },
        );
        let report = KeyedHandleReport {
            key_groups: range.into(),
            max_parallelism: header_max_parallelism,
            states,
            size: h.stream.size(),
            stream: self.stream_report(&h.stream),
            verification,
        };
        (report, frame)
    }

    async fn operator_state(
        &mut self,
        m: &CheckpointMetadata,
        op: &OperatorState,
        subtask: u32,
        h: &OperatorStateHandle,
        who: &str,
    ) -> OperatorHandleReport {
        self.note_file(&h.stream);
        let subject = self.subject(&h.stream, &format!("operator state of {who}"));
        let mut errors = Vec::new();
        match self.read_whole(&h.stream).await {
            Ok(bytes) => {
                let expected =
                    verify::expected(m, op.operator_id, subtask, None, StateFileKind::Operator);
                if let Err(e) = verify::open_file(m, &bytes, &expected)
                    .and_then(|at| verify::check_operator_payload(h, &bytes[at..]))
                {
                    errors.push(e);
                }
            }
            Err(reason) => errors.push(reason),
        }
        let verification = self.conclude(
            &subject,
            errors,
            if matches!(h.stream, StreamStateHandle::Inline(_)) {
                "inline (covered by _metadata's checksum); content decoded".to_string()
            } else {
                format!(
                    "size and {} match; content decoded",
                    checksum_name(&h.stream)
                )
            },
        );
        OperatorHandleReport {
            states: h
                .states
                .iter()
                .map(|(name, mode)| OperatorStateEntry {
                    name: name.clone(),
                    mode: verify::mode_name(*mode).to_string(),
                })
                .collect(),
            size: h.stream.size(),
            stream: self.stream_report(&h.stream),
            verification,
        }
    }

    /// Verifies the channel-state file of one subtask's in-flight data: its size and digest, its
    /// identity frame and envelope, every section's batch framing and record count, and the
    /// sections against the summaries `_metadata` records for them.
    async fn in_flight(
        &mut self,
        m: &CheckpointMetadata,
        entry: &SubtaskInFlight,
    ) -> InFlightReport {
        let h = &entry.handle;
        let op = operator_by_id(m, entry.operator_id);
        let who = match op {
            Some(op) => verify::who(op, entry.subtask),
            None => format!("operator {}, subtask {}", entry.operator_id, entry.subtask),
        };
        self.note_file(&h.stream);
        let subject = self.subject(&h.stream, &format!("in-flight data of {who}"));
        let mut errors = Vec::new();
        let mut checked = None;
        match self.read_whole(&h.stream).await {
            Ok(bytes) => {
                let expected = verify::expected(
                    m,
                    entry.operator_id,
                    entry.subtask,
                    None,
                    StateFileKind::ChannelState,
                );
                match verify::open_file(m, &bytes, &expected) {
                    Ok(at) => match verify::check_channel_payload(
                        &h.sections,
                        &bytes[at..],
                        MAX_SECTION_PROBLEMS,
                    ) {
                        Ok(sections) => checked = Some(sections.len()),
                        Err(e) => errors.extend(e),
                    },
                    Err(e) => errors.push(e),
                }
            }
            Err(reason) => errors.push(reason),
        }
        let verification = self.conclude(
            &subject,
            errors,
            match (&h.stream, checked) {
                (StreamStateHandle::Inline(_), Some(n)) => format!(
                    "inline (covered by _metadata's checksum); {n} section{} decoded and checked \
                     against _metadata",
                    if n == 1 { "" } else { "s" }
                ),
                (_, Some(n)) => format!(
                    "size and {} match; {n} section{} decoded and checked against _metadata",
                    checksum_name(&h.stream),
                    if n == 1 { "" } else { "s" }
                ),
                (_, None) => String::new(),
            },
        );
        let name_of = |id: OperatorId| operator_by_id(m, id).map(|o| o.name.clone());
        InFlightReport {
            operator_id: entry.operator_id.to_string(),
            operator: op.map(|o| o.name.clone()),
            uid: op.and_then(|o| o.uid.clone()),
            subtask: entry.subtask,
            size: h.size(),
            records: saturating_sum(h.sections.iter().map(|s| s.records)),
            stream: self.stream_report(&h.stream),
            sections: h
                .sections
                .iter()
                .map(|s| ChannelSectionReport {
                    direction: verify::direction_name(s.direction).to_string(),
                    channel: s.channel.to_string(),
                    from_operator_id: s.channel.from.to_string(),
                    from_operator: name_of(s.channel.from),
                    producer: s.channel.producer,
                    to_operator_id: s.channel.to.to_string(),
                    to_operator: name_of(s.channel.to),
                    consumer: s.channel.consumer,
                    records: s.records,
                    bytes: s.bytes,
                })
                .collect(),
            verification,
        }
    }

    /// Records a stream's errors as problems and returns its verification.
    fn conclude(&mut self, subject: &Subject, errors: Vec<String>, ok: String) -> Verification {
        if errors.is_empty() {
            return Verification {
                ok: true,
                detail: ok,
            };
        }
        let detail = errors.join("; ");
        for e in errors {
            self.problems.push(Problem {
                file: subject.file.clone(),
                reason: format!("{}{e}", subject.prefix),
            });
        }
        Verification { ok: false, detail }
    }
}

/// Checks every key-group section of a whole keyed-state stream; returns how many were checked,
/// or what failed (at most [`MAX_SECTION_PROBLEMS`] section failures, then a count).
fn check_sections(h: &KeyedStateHandle, stream: &[u8]) -> Result<usize, Vec<String>> {
    let part = whole_stream_part(h, stream).map_err(|e| vec![e.to_string()])?;
    let header = SnapshotHeader::decode(part.header).map_err(|e| vec![e.to_string()])?;
    verify::check_keyed_sections(&header, &part, &h.key_group_range, MAX_SECTION_PROBLEMS)
}

/// How a file handle's bytes are checked, for verdicts.
fn checksum_name(stream: &StreamStateHandle) -> &'static str {
    match stream {
        StreamStateHandle::LegacyFile { .. } => "CRC-32",
        _ => "xxh3-128 digest",
    }
}

fn operator_by_id(m: &CheckpointMetadata, id: OperatorId) -> Option<&OperatorState> {
    m.operators.iter().find(|o| o.operator_id == id)
}

/// Renders an inspection as text.
pub fn render_inspect(r: &InspectReport) -> String {
    let mut s = String::new();
    match &r.selected_from {
        Some(from) => {
            let _ = writeln!(
                s,
                "Checkpoint {} (the latest complete checkpoint under {from})",
                r.checkpoint_dir
            );
        }
        None => {
            let _ = writeln!(s, "Checkpoint {}", r.checkpoint_dir);
        }
    }
    let took = r
        .completion_timestamp_ms
        .saturating_sub(r.trigger_timestamp_ms);
    let _ = writeln!(s, "  job:            {} ({})", r.job_name, r.job_id);
    let _ = writeln!(s, "  checkpoint:     {} ({})", r.checkpoint_id, r.kind);
    let _ = writeln!(s, "  triggered:      {}", r.trigger_time);
    let _ = writeln!(
        s,
        "  completed:      {} (took {took} ms)",
        r.completion_time
    );
    let _ = writeln!(s, "  weir version:   {}", r.weir_version);
    let _ = writeln!(s, "  format version: {}", r.format_version);
    let _ = writeln!(
        s,
        "  _metadata:      {} ({} bytes, checksum OK)",
        r.metadata_file, r.metadata_size
    );
    let _ = writeln!(s, "  state size:     {}", size_text(r.state_size));
    if r.in_flight.is_empty() {
        let _ = writeln!(s, "  in-flight data: none");
    } else {
        let _ = writeln!(
            s,
            "  in-flight data: {} in {} subtask{} (unaligned checkpoint)",
            size_text(r.in_flight_size),
            r.in_flight.len(),
            if r.in_flight.len() == 1 { "" } else { "s" }
        );
    }
    let _ = writeln!(s, "  operators:      {}", r.operators.len());
    for op in &r.operators {
        s.push('\n');
        let uid = match &op.uid {
            Some(uid) => format!("uid {uid:?}"),
            None => "(no uid)".to_string(),
        };
        let _ = writeln!(
            s,
            "Operator {uid}, id {}, name {:?}: parallelism {}, max parallelism {}, state {}",
            op.operator_id,
            op.name,
            op.parallelism,
            op.max_parallelism,
            if op.subtasks.is_empty() {
                "none".to_string()
            } else {
                size_text(op.state_size)
            }
        );
        for sub in &op.subtasks {
            render_subtask(&mut s, sub);
        }
    }
    for f in &r.in_flight {
        s.push('\n');
        let operator = match (&f.operator, &f.uid) {
            (Some(name), Some(uid)) => format!("operator {name:?} (uid {uid:?})"),
            (Some(name), None) => format!("operator {name:?} (id {})", f.operator_id),
            _ => format!("operator {} (not in the checkpoint)", f.operator_id),
        };
        let _ = writeln!(
            s,
            "In-flight data of {operator}, subtask {}: {} section{}, {} records, {}, {}",
            f.subtask,
            f.sections.len(),
            if f.sections.len() == 1 { "" } else { "s" },
            f.records,
            size_text(f.size),
            where_(&f.stream)
        );
        for c in &f.sections {
            let names = match (&c.from_operator, &c.to_operator) {
                (Some(from), Some(to)) => format!(" ({from:?} -> {to:?})"),
                _ => String::new(),
            };
            let _ = writeln!(
                s,
                "  {:<6} channel {}{names}: {} records, {}",
                c.direction,
                c.channel,
                c.records,
                size_text(c.bytes)
            );
        }
        let _ = writeln!(s, "  verification: {}", verdict(&f.verification));
    }
    s.push('\n');
    if r.problems.is_empty() {
        let _ = writeln!(
            s,
            "Verification: OK: {} files, {} bytes verified",
            r.files_verified, r.bytes_verified
        );
    } else {
        let _ = writeln!(
            s,
            "Verification: {} problem{} in {} files, {} bytes:",
            r.problems.len(),
            if r.problems.len() == 1 { "" } else { "s" },
            r.files_verified,
            r.bytes_verified
        );
        for p in &r.problems {
            let _ = writeln!(s, "  CORRUPT: {}: {}", p.file, p.reason);
        }
    }
    s
}

/// Renders one subtask's state: keyed, operator and native, each with its verification.
fn render_subtask(s: &mut String, sub: &SubtaskReport) {
    let _ = writeln!(s, "  subtask {}:", sub.subtask);
    for k in &sub.keyed {
        let _ = writeln!(
            s,
            "    keyed state: key groups [{}, {}] ({}), {}, {}",
            k.key_groups.start,
            k.key_groups.end,
            k.key_groups.count,
            size_text(k.size),
            where_(&k.stream)
        );
        for st in &k.states {
            let _ = writeln!(
                s,
                "      state {:?}: {}, key {}, value {}",
                st.name, st.kind, st.key_type, st.value_type
            );
        }
        let _ = writeln!(s, "      verification: {}", verdict(&k.verification));
    }
    for o in &sub.operator {
        let states: Vec<String> = o
            .states
            .iter()
            .map(|e| format!("{:?} ({})", e.name, e.mode))
            .collect();
        let _ = writeln!(
            s,
            "    operator state: {}, {}, {}",
            if states.is_empty() {
                "no states".to_string()
            } else {
                states.join(", ")
            },
            size_text(o.size),
            where_(&o.stream)
        );
        let _ = writeln!(s, "      verification: {}", verdict(&o.verification));
    }
    native::render(s, &sub.native);
}

fn where_(stream: &StreamReport) -> String {
    match (&stream.file, &stream.checksum) {
        (Some(file), Some(sum)) => format!("file {file} ({sum})"),
        (Some(file), None) => format!("file {file}"),
        _ => "inline in _metadata".to_string(),
    }
}

fn verdict(v: &Verification) -> String {
    if v.ok {
        format!("OK ({})", v.detail)
    } else {
        format!("FAILED: {}", v.detail)
    }
}

// ---------------------------------------------------------------------------------------------
// Formatting.

/// A time in ms since the Unix epoch as UTC ISO-8601 with milliseconds.
fn format_time(ms: u64) -> String {
    match UNIX_EPOCH.checked_add(Duration::from_millis(ms)) {
        Some(t) => humantime::format_rfc3339_millis(t).to_string(),
        None => format!("{ms} ms after the Unix epoch"),
    }
}

fn kind_name(kind: SnapshotKind) -> &'static str {
    match kind {
        SnapshotKind::Checkpoint => "checkpoint",
        SnapshotKind::Savepoint => "savepoint",
        SnapshotKind::SynchronousSavepoint => "synchronous savepoint",
    }
}

/// A size in bytes, and in binary units when that says more (`1536 bytes (1.5 KiB)`).
fn size_text(bytes: u64) -> String {
    if bytes < 1024 {
        format!("{bytes} bytes")
    } else {
        format!("{bytes} bytes ({})", human_size(bytes))
    }
}

/// Bytes in binary units (`1.5 KiB`).
fn human_size(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["KiB", "MiB", "GiB", "TiB", "PiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut value = bytes as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.1} {}", UNITS.get(unit).copied().unwrap_or("PiB"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_are_human() {
        assert_eq!(human_size(0), "0 B");
        assert_eq!(human_size(1023), "1023 B");
        assert_eq!(human_size(1536), "1.5 KiB");
        assert_eq!(human_size(5 * 1024 * 1024), "5.0 MiB");
    }

    #[test]
    fn times_are_utc_iso8601() {
        assert_eq!(format_time(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(format_time(1_700_000_000_123), "2023-11-14T22:13:20.123Z");
    }

    #[test]
    fn chk_names() {
        assert_eq!(parse_chk("chk-12"), Some(12));
        assert_eq!(parse_chk("chk-012"), None);
        assert_eq!(parse_chk("chk-"), None);
        assert_eq!(parse_chk("shared"), None);
    }

    #[test]
    fn parent_names_of_local_paths_and_s3_urls() {
        assert_eq!(parent_name("/tmp/ckpt/job/chk-3"), Some("job"));
        assert_eq!(parent_name("s3://bkt/p/job/chk-3"), Some("job"));
        assert_eq!(parent_name("s3://bkt/job/chk-3/"), Some("job"));
        assert_eq!(parent_name("s3://bkt"), None);
        assert_eq!(parent_name("/chk-3"), None);
    }

    #[test]
    fn s3_paths_are_shown_as_urls_under_the_normalised_root() {
        let creds = |name: &str| match name {
            "AWS_ACCESS_KEY_ID" => Some("a".to_string()),
            "AWS_SECRET_ACCESS_KEY" => Some("s".to_string()),
            _ => None,
        };
        // A trailing chk-<n> is opened from its parent; doubled `/` are normalised.
        let o = open_s3("s3://bkt//p/job/chk-3/", creds).unwrap();
        assert_eq!(o.rel, "chk-3/");
        assert_eq!(o.shown, "s3://bkt//p/job/chk-3/");
        assert_eq!(o.display(""), "s3://bkt/p/job");
        assert_eq!(o.display("chk-3/"), "s3://bkt/p/job/chk-3");
        assert_eq!(
            o.display("chk-3/_metadata"),
            "s3://bkt/p/job/chk-3/_metadata"
        );
        // A bucket named chk-<n>, and a bucket's root.
        let o = open_s3("s3://chk-3", creds).unwrap();
        assert_eq!((o.rel.as_str(), o.display("")), ("", "s3://chk-3".into()));
        let o = open_s3("s3://bkt/chk-4", creds).unwrap();
        assert_eq!(o.rel, "chk-4/");
        assert_eq!(o.display("chk-4/x"), "s3://bkt/chk-4/x");
        // Bad input is a usage error naming the problem.
        let usage = |url: &str, var: &dyn Fn(&str) -> Option<String>| match open_s3(url, var) {
            Err(CliError::Usage(msg)) => msg,
            other => panic!("{url}: {:?}", other.err()),
        };
        let msg = usage("s3:///x", &creds);
        assert!(
            msg.contains("s3:///x") && msg.contains("no bucket"),
            "{msg}"
        );
        let msg = usage("s3://bkt/p", &|_| None);
        assert!(msg.contains("no credentials"), "{msg}");
    }
}
