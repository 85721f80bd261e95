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
use serde::Serialize;
use std::io::Write;
use std::path::PathBuf;
use weir_checkpoint::CheckpointStorage;

mod check;
mod format;
mod jobs;
mod native;
mod open;
mod render;
mod report;
pub use check::{inspect, verify};
pub use native::{NativeFileReport, NativeHandleReport, NativeManifestReport};
pub use open::list;
pub use render::{render_inspect, render_list, render_verify};
pub use report::{
    ChannelSectionReport, InFlightReport, KeyGroups, KeyedHandleReport, KeyedStateReport,
    ListEntry, ListStatus, OperatorHandleReport, OperatorStateEntry, Problem, StreamReport,
    Verification, VerifyReport,
};

/// The message of a caught panic.
pub use weir_core::panic::panic_message;

use open::open;
// What `native.rs` takes from here besides the reports: the checker it extends and the
// formatting its rendering shares.
use check::{Checker, checksum_name};
use format::{size_text, verdict, where_};

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
            let storage: std::sync::Arc<dyn CheckpointStorage> =
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
// The report of `inspect`: here, not in `report.rs`, because a subtask's report holds the native
// snapshots' reports (`native.rs`), which are built on `report.rs` and `check.rs`.

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
