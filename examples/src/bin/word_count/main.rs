//! `word_count`: the job of the checkpointing notes, with checkpoints, failure injection and
//! restore from a checkpoint.

use anyhow::{Context, Result, anyhow, bail};
use clap::Parser;
use clap::builder::RangedU64ValueParser;
use std::collections::BTreeMap;
use std::io::Write;
use std::ops::RangeInclusive;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;
use weir_examples::{WordCountOptions, build, write_totals};
use weir_runtime::cluster::ClusterRole;
use weir_runtime::config::{DEFAULT_TASK_CANCELLATION_TIMEOUT, limits};
use weir_runtime::{CheckpointingMode, JobClient, JobError, JobResult, JobStatus, StorageConfig};

/// Records cross threads (made by a source, freed by a sink): mimalloc frees them without the
/// lock contention glibc's allocator shows here (measured: 60% of the time in malloc/free).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// `mi_option_purge_delay` in mimalloc 3's `mi_option_e` (libmimalloc-sys 0.1.49, pinned; the
/// crate names no constant for it).
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// Returns freed memory to the system at once rather than after mimalloc's delay (1 s, and 10 s
/// for arenas): memtables and blocks that the disk backend frees on its flush and compaction
/// threads otherwise stay resident (measured at 30 s of a 50M-key run: ~280 MB RSS by default,
/// ~50 MB with this and without transparent huge pages; heap word_count's records/s unchanged
/// within noise). `MIMALLOC_PURGE_DELAY` in the environment still wins.
fn tune_allocator() {
    if std::env::var_os("MIMALLOC_PURGE_DELAY").is_none() {
        // SAFETY: `mi_option_set` stores an integer in mimalloc's option table; it takes no
        // pointer, and mimalloc reads the option under its own synchronisation.
        #[allow(unsafe_code)]
        unsafe {
            libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, 0)
        };
    }
}

/// Counts random words 1..9 with exactly-once keyed state, checkpointing as it goes.
#[derive(Parser, Debug)]
#[command(version, about, after_help = exit_codes_help())]
struct Args {
    /// Records over all source subtasks; 0 runs unbounded until Ctrl-C.
    #[arg(long, default_value_t = 20_000_000)]
    records: u64,
    #[arg(long, default_value_t = 2, value_parser = in_range(limits::MAX_PARALLELISM),
        help = format!("Parallelism of every operator ({}, and at most the max parallelism)",
            range_text(limits::MAX_PARALLELISM)))]
    parallelism: u32,
    #[arg(long, value_parser = in_range(limits::MAX_PARALLELISM),
        help = format!("Max parallelism: the number of key groups ({}; default: Flink's for the parallelism)",
            range_text(limits::MAX_PARALLELISM)))]
    max_parallelism: Option<u32>,
    /// Generator seed.
    #[arg(long, default_value_t = 42)]
    seed: u64,
    #[arg(long, value_parser = positive_duration,
        help = format!("Checkpoint interval, e.g. 100ms or 1s (above 0, at most {}); absent: checkpoints off",
            max_duration()))]
    checkpoint_interval: Option<Duration>,
    /// Checkpoint directory, or s3://bucket/prefix for S3 (endpoint, region and credentials from
    /// AWS_ENDPOINT_URL, AWS_REGION, AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY).
    #[arg(long, default_value = "weir-checkpoints")]
    checkpoint_dir: PathBuf,
    /// Inject one failure when the map has seen K records in total.
    #[arg(long)]
    fail_after: Option<u64>,
    /// Start from a checkpoint directory, or the latest complete checkpoint under a root (a local
    /// path or s3://bucket/prefix).
    #[arg(long)]
    from: Option<PathBuf>,
    /// Write the final total per key as `key,total` lines sorted by key.
    #[arg(long)]
    output: Option<PathBuf>,
    /// Print every update as `subtask> (word,count)`.
    #[arg(long)]
    print: bool,
    /// Also write every update as `(word,count)` lines into part files under DIR, exactly once:
    /// a file per subtask per checkpoint, committed when the checkpoint completes.
    #[arg(long, value_name = "DIR")]
    running_sums: Option<PathBuf>,
    #[arg(long, default_value_t = 1024, value_parser = in_range(limits::BATCH_SIZE),
        help = format!("Records per batch ({})", range_text(limits::BATCH_SIZE)))]
    batch_size: usize,
    #[arg(long, default_value_t = 1, value_parser = in_range(limits::RETAINED_CHECKPOINTS),
        help = format!("Completed checkpoints to keep ({})", range_text(limits::RETAINED_CHECKPOINTS)))]
    retain: u32,
    /// Also checkpoint every N records the sources emit (N at least 1).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=u64::MAX))]
    checkpoint_every_records: Option<u64>,
    /// Where savepoints go.
    #[arg(long, default_value = "weir-savepoints")]
    savepoint_dir: PathBuf,
    /// Once the sources have emitted K records in this run, stop with a savepoint and print its
    /// path.
    #[arg(long)]
    stop_with_savepoint_after: Option<u64>,
    /// With --stop-with-savepoint-after: advance event time to the end and flush first.
    #[arg(long)]
    drain: bool,
    /// Restore even if the checkpoint has state for operators this job does not have.
    #[arg(long)]
    allow_non_restored_state: bool,
    /// Restore even if the checkpoint was taken with another --records or --seed (the totals
    /// are then not those of either run).
    #[arg(long)]
    allow_changed_sources: bool,
    /// Checkpointing mode: exactly-once (aligned barriers) or at-least-once (tracked barriers).
    #[arg(long, value_enum, default_value_t = Mode::ExactlyOnce)]
    mode: Mode,
    #[arg(long, default_value_t = 2, value_parser = in_range(limits::BUFFERS_PER_CHANNEL),
        help = format!("Credits per channel: buffers in flight between two subtasks ({})",
            range_text(limits::BUFFERS_PER_CHANNEL)))]
    buffers_per_channel: usize,
    #[arg(long, value_parser = bounded_duration,
        help = format!("A busy pause per record before the sink, e.g. 10us, to create backpressure (at most {})",
            max_duration()))]
    sink_delay: Option<Duration>,
    /// Unaligned checkpoints: barriers overtake in-flight data, which is persisted with the
    /// checkpoint (exactly-once mode only).
    #[arg(long)]
    unaligned: bool,
    #[arg(long, value_parser = bounded_duration,
        help = format!("Checkpoints start aligned and switch to unaligned in a task still aligning this long \
            after the trigger, e.g. 5ms (at most {}; implies --unaligned; default: start unaligned)",
            max_duration()))]
    aligned_checkpoint_timeout: Option<Duration>,
    /// Compression of each key group in keyed-state snapshots: none, lz4 or zstd.
    #[arg(long, default_value = "none")]
    snapshot_compression: weir_runtime::Compression,
    #[arg(long, value_parser = bounded_duration,
        help = format!("On Ctrl-C, how long to wait for tasks to stop before abandoning those stuck in an \
            operator (at most {}; 0: do not wait) [default: {}]", max_duration(),
            humantime::format_duration(DEFAULT_TASK_CANCELLATION_TIMEOUT)))]
    task_cancellation_timeout: Option<Duration>,
    /// Where keyed state lives: heap (typed hash tables), disk (sorted runs on local disk under
    /// --state-dir, for state larger than memory) or memory-store (bytes in a sorted store per
    /// operator, through the KeyedStore seam).
    #[arg(long, default_value = "heap", value_parser = ["heap", "disk", "memory-store"])]
    state_backend: String,
    /// With --state-backend disk: the local directory of the keyed state (default: weir-state
    /// in the system's temporary directory).
    #[arg(long, value_name = "DIR")]
    state_dir: Option<PathBuf>,
    /// Draw the values from 1..=N instead of the digits 1..=9, so the keyed state has up to N
    /// keys (N above 0).
    #[arg(long, default_value_t = weir_examples::DIGITS,
        value_parser = clap::value_parser!(u64).range(1..=weir_examples::MAX_KEY_SPACE as i64 as u64))]
    key_space: u64,
    /// Keep no final totals: the job's end then neither collects the total of every key in
    /// memory nor prints them, for key spaces larger than memory (--running-sums is the output).
    #[arg(long, conflicts_with = "output")]
    no_totals: bool,
    /// Incremental checkpoints: each checkpoint writes only the keyed state that changed since
    /// the latest completed one (savepoints stay full).
    #[arg(long)]
    incremental: bool,
    /// A configuration key in Flink's name, KEY=VALUE, applied after the other flags; repeat
    /// for more: state.backend.type (heap, disk, memory-store), state.backend.disk.local-dir,
    /// state.backend.incremental (true, false), state.checkpoints.num-retained.
    #[arg(short = 'D', value_name = "KEY=VALUE", value_parser = weir_runtime::settings::parse_pair)]
    config: Vec<(String, String)>,
    /// With --from: who owns the restored checkpoint. no-claim: it stays its old run's, and this
    /// run's first checkpoint is full. claim: this run takes over the job directories of the runs
    /// it descends from once their locks' leases expire, deletes what the restored checkpoint
    /// does not need, and deletes that checkpoint too once --retain of its own subsume it.
    #[arg(long, value_enum, default_value_t = Claim::NoClaim)]
    claim_mode: Claim,
    #[arg(long, value_parser = lease_duration,
        help = format!("How long the run's lock on its job directory holds unrenewed (renewed every third of it);             a claim waits this long before it takes over a killed run's directory ({} to {}) [default: {}]",
            humantime::format_duration(*limits::JOB_LOCK_LEASE.start()),
            humantime::format_duration(*limits::JOB_LOCK_LEASE.end()),
            humantime::format_duration(weir_runtime::config::DEFAULT_JOB_LOCK_LEASE)))]
    job_lock_lease: Option<Duration>,
    /// Where the job's REST API (Flink's paths, and Prometheus metrics at /metrics) listens;
    /// default 127.0.0.1:8081, or the next free port up to 8099, then any.
    #[arg(long, value_name = "ADDR")]
    rest_address: Option<std::net::SocketAddr>,
    /// Serve no REST API.
    #[arg(long, conflicts_with_all = ["rest_address", "rest_allow_remote", "rest_read_only"])]
    no_rest: bool,
    /// Let --rest-address be an address other than loopback (anyone who reaches it can stop or
    /// cancel the job, unless --rest-read-only).
    #[arg(long)]
    rest_allow_remote: bool,
    /// The REST API only reads: triggers, savepoints, stop and cancel are refused.
    #[arg(long)]
    rest_read_only: bool,
    /// Cluster mode: `jobmanager` runs the job master and the checkpoint coordinator, and
    /// deploys the subtasks to task managers (with --listen); task managers are started with
    /// --jobmanager. Every process takes the same job arguments.
    #[arg(long, value_enum)]
    role: Option<Role>,
    /// With --role jobmanager: where task managers register, e.g. 127.0.0.1:6123.
    #[arg(long)]
    listen: Option<std::net::SocketAddr>,
    /// Run as a task manager of the job manager at this address.
    #[arg(long)]
    jobmanager: Option<std::net::SocketAddr>,
    #[arg(long, default_value_t = 1, value_parser = in_range(limits::MAX_PARALLELISM),
        help = format!("With --jobmanager: slots offered, each running one subtask of every operator ({})",
            range_text(limits::MAX_PARALLELISM)))]
    slots: u32,
    /// With --jobmanager: the address the data transport listens on (default: this host's
    /// address on the route to the job manager).
    #[arg(long)]
    data_bind: Option<std::net::IpAddr>,
    /// Cluster heartbeats: how often a task manager sends one (above 0, below
    /// --heartbeat-timeout).
    #[arg(long, value_parser = positive_duration, default_value = "1s")]
    heartbeat_interval: Duration,
    #[arg(long, value_parser = positive_duration, default_value = "10s",
        help = format!("Cluster heartbeats: how long without one before the other side is lost (at most {})",
            max_duration()))]
    heartbeat_timeout: Duration,
    #[arg(long, value_parser = positive_duration, default_value = "5m",
        help = format!("With --role jobmanager: how long a deployment waits for enough task slots (above 0, at most {})",
            max_duration()))]
    slot_timeout: Duration,
}

/// A clap parser for an integer flag in `range`: clap's error names the flag and the range.
fn in_range<T>(range: RangeInclusive<T>) -> RangedU64ValueParser<T>
where
    T: Copy + TryInto<u64> + TryFrom<u64> + Clone + Send + Sync + 'static,
    <T as TryFrom<u64>>::Error: std::error::Error + Send + Sync + 'static,
{
    let wide = |v: T| v.try_into().unwrap_or(u64::MAX);
    RangedU64ValueParser::new().range(wide(*range.start())..=wide(*range.end()))
}

/// A range as the help texts show it.
fn range_text<T: std::fmt::Display>(range: RangeInclusive<T>) -> String {
    format!("{}..={}", range.start(), range.end())
}

/// The longest duration a flag takes, as humantime writes it.
fn max_duration() -> humantime::FormattedDuration {
    humantime::format_duration(limits::MAX_DURATION)
}

/// A duration flag: humantime syntax (`10ms`, `2s`, `1h`), at most [`limits::MAX_DURATION`].
/// The state backend `--state-backend` and `--state-dir` name.
fn state_backend(args: &Args) -> Result<Arc<dyn weir_runtime::StateBackend>> {
    match (&*args.state_backend, &args.state_dir) {
        ("disk", Some(dir)) => Ok(Arc::new(weir_runtime::state::DiskStateBackend::new(dir))),
        (_, Some(_)) => {
            bail!("--state-dir is the disk backend's directory: it needs --state-backend disk")
        }
        (name, None) => {
            weir_runtime::state::built_in_state_backend(name).map_err(|e| anyhow!("{e}"))
        }
    }
}

fn bounded_duration(text: &str) -> Result<Duration, String> {
    let d = humantime::parse_duration(text).map_err(|e| e.to_string())?;
    if d > limits::MAX_DURATION {
        return Err(format!(
            "{text} is longer than {} (the longest accepted)",
            max_duration()
        ));
    }
    Ok(d)
}

/// `--job-lock-lease`: within [`limits::JOB_LOCK_LEASE`].
fn lease_duration(text: &str) -> Result<Duration, String> {
    let d = humantime::parse_duration(text).map_err(|e| e.to_string())?;
    if !limits::JOB_LOCK_LEASE.contains(&d) {
        return Err(format!(
            "{text} is out of range: it must be between {} and {}",
            humantime::format_duration(*limits::JOB_LOCK_LEASE.start()),
            humantime::format_duration(*limits::JOB_LOCK_LEASE.end())
        ));
    }
    Ok(d)
}

/// `--claim-mode`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum Claim {
    NoClaim,
    Claim,
}

/// A duration flag that must also be above zero.
fn positive_duration(text: &str) -> Result<Duration, String> {
    match bounded_duration(text)? {
        d if d.is_zero() => Err(format!(
            "must be greater than zero (and at most {})",
            max_duration()
        )),
        d => Ok(d),
    }
}

/// `--role`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum Role {
    /// The job manager of a cluster.
    Jobmanager,
}

/// `--mode`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum Mode {
    /// Aligned barriers: every record counted exactly once, also after a failure.
    ExactlyOnce,
    /// Tracked barriers: never blocks; after a failure some records may count twice.
    AtLeastOnce,
}

fn percentile(sorted: &[Duration], p: f64) -> Option<Duration> {
    if sorted.is_empty() {
        return None;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    Some(sorted[rank.clamp(1, sorted.len()) - 1])
}

/// The storage `--checkpoint-dir` names: `s3://bucket/prefix` (configured from the AWS
/// variables) or a local directory.
fn checkpoint_storage(dir: &Path) -> Result<StorageConfig> {
    match dir.to_str() {
        Some(location) => StorageConfig::from_location(location)
            .with_context(|| format!("--checkpoint-dir {location}")),
        None => Ok(StorageConfig::Filesystem(dir.to_path_buf())),
    }
}

fn ms(d: Duration) -> String {
    format!("{:.2}", d.as_secs_f64() * 1e3)
}

/// Exit codes, listed in `--help` and the README.
mod cluster;

mod exit {
    /// The job finished (or stopped with a savepoint).
    pub const FINISHED: u8 = 0;
    /// The job failed: it could not restore, its storage failed, the restart strategy gave
    /// up, or the output could not be written.
    pub const FAILED: u8 = 1;
    /// The flags do not describe a job that can run (clap's code for usage errors too).
    pub const USAGE: u8 = 2;
    /// Cancelled by Ctrl-C (128 + SIGINT, as shells report it).
    pub const INTERRUPTED: u8 = 130;
}

/// `--help`'s last lines.
fn exit_codes_help() -> String {
    format!(
        "Exit codes: {} finished (or stopped with a savepoint); {} the job failed; {} bad flags; \
         {} cancelled by Ctrl-C (a second Ctrl-C exits at once). --output is written only when \
         the job finishes.",
        exit::FINISHED,
        exit::FAILED,
        exit::USAGE,
        exit::INTERRUPTED
    )
}

/// Logs to stderr, filtered by `RUST_LOG` (`warn` when unset): directives `target=level` or
/// `level`, comma-separated (`RUST_LOG=info,weir_runtime::master=debug`). A value that does not
/// parse is reported, and `warn` applies.
fn init_logging() {
    use tracing_subscriber::filter::Targets;
    use tracing_subscriber::prelude::*;
    let warn = || Targets::new().with_default(tracing::Level::WARN);
    let filter = match std::env::var("RUST_LOG") {
        Ok(value) => value.parse::<Targets>().unwrap_or_else(|e| {
            eprintln!("warning: RUST_LOG={value:?} does not parse ({e}); logging warnings only");
            warn()
        }),
        Err(_) => warn(),
    };
    tracing_subscriber::registry()
        .with(tracing_subscriber::fmt::layer().with_writer(std::io::stderr))
        .with(filter)
        .init();
}

fn main() -> ExitCode {
    tune_allocator();
    init_logging();
    let (args, job_given) = cluster::parse_args();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("Error: cannot start the runtime: {e}");
            return ExitCode::from(exit::FAILED);
        }
    };
    let code = runtime.block_on(run(args, job_given));
    // Nothing of the job waits to be done here; an abandoned task's thread (its own runtime,
    // already shut down) ends with the process.
    runtime.shutdown_timeout(Duration::from_millis(100));
    ExitCode::from(code)
}

/// Runs the job the flags describe (`job_given`: flags beyond a task manager's own were given);
/// returns the exit code.
async fn run(args: Args, job_given: bool) -> u8 {
    let interrupts = match Interrupts::listen() {
        Ok(i) => i,
        Err(e) => {
            eprintln!("Error: cannot listen for Ctrl-C: {e}");
            return exit::FAILED;
        }
    };
    let cluster = match cluster::role(&args) {
        Ok(role) => role,
        Err(e) => {
            eprintln!("Error: {e:?}");
            return exit::USAGE;
        }
    };
    if let Some(ClusterRole::TaskManager(options)) = &cluster
        && !job_given
    {
        // Only --jobmanager and --slots: a standing task manager, job after job.
        handle_ctrl_c(interrupts, JobClient::default(), true);
        return match cluster::standing(options.clone()).await {
            Ok(()) => exit::FINISHED,
            Err(e) => {
                eprintln!("Error: {e}");
                exit::USAGE
            }
        };
    }
    let (env, totals) = match job_env(&args) {
        Ok(built) => built,
        Err(e) => {
            eprintln!("Error: {e:?}");
            return exit::USAGE;
        }
    };
    let is_task_manager = matches!(cluster, Some(ClusterRole::TaskManager(_)));
    if !args.no_rest && !is_task_manager {
        let mut rest = weir_runtime::rest::RestOptions::loopback();
        if let Some(address) = args.rest_address {
            rest.address = address;
            rest.port_attempts = 0;
        }
        rest.allow_remote = args.rest_allow_remote;
        rest.read_only = args.rest_read_only;
        env.config_mut().rest = Some(rest);
    }
    env.config_mut().cluster = cluster;
    let client = JobClient::default();
    handle_ctrl_c(interrupts, client.clone(), is_task_manager);
    if let Some(k) = args.stop_with_savepoint_after {
        stop_with_savepoint_after(client.clone(), k, args.drain);
    }
    announce_rest_api(client.clone());
    let progress = live_line(client.clone());
    let result = match env.execute_with(client).await {
        Ok(result) => result,
        Err(e) => {
            let code = match e {
                JobError::Invalid(_) | JobError::Graph(_) => exit::USAGE,
                _ => exit::FAILED,
            };
            eprintln!(
                "Error: {:?}",
                anyhow::Error::new(e).context("word_count failed")
            );
            return code;
        }
    };
    if let Some(p) = progress {
        p.finish_and_clear();
    }
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    let reported = if is_task_manager {
        // The totals and statistics are the job manager's to report.
        writeln!(
            out,
            "task manager done: source_records={} bytes_sent={}",
            result.source_records, result.bytes_sent
        )
        .map_err(anyhow::Error::from)
    } else {
        report(
            &mut out,
            &args,
            (args.records > 0).then_some(args.records),
            &result,
            totals.kept().then(|| totals.get()).as_ref(),
        )
    };
    let flushed = reported.and_then(|()| out.flush().map_err(anyhow::Error::from));
    match (flushed, result.status) {
        (Err(e), _) => {
            eprintln!("Error: {e:?}");
            exit::FAILED
        }
        (Ok(()), JobStatus::Finished) => exit::FINISHED,
        (Ok(()), JobStatus::Canceled) => exit::INTERRUPTED,
    }
}

/// The job the flags describe, without its cluster role and REST API: its environment and
/// the totals its sink collects.
fn job_env(args: &Args) -> Result<(weir_runtime::StreamEnvironment, weir_examples::Totals)> {
    let storage = checkpoint_storage(&args.checkpoint_dir)?;
    let opts = job_options(args)?;
    let (env, totals, _injector) = build(&opts);
    env.configure(&args.config).map_err(|e| anyhow!("{e}"))?;
    env.set_checkpoint_storage(storage);
    if let Some(timeout) = args.task_cancellation_timeout {
        env.config_mut().task_cancellation_timeout = timeout;
    }
    if let Some(lease) = args.job_lock_lease {
        env.config_mut().job_lock_lease = lease;
    }
    env.config_mut().claim_mode = match args.claim_mode {
        Claim::NoClaim => weir_runtime::ClaimMode::NoClaim,
        Claim::Claim => weir_runtime::ClaimMode::Claim,
    };
    Ok((env, totals))
}

/// The job's options from the flags.
fn job_options(args: &Args) -> Result<WordCountOptions> {
    Ok(WordCountOptions {
        records: (args.records > 0).then_some(args.records),
        parallelism: args.parallelism,
        max_parallelism: args.max_parallelism,
        seed: args.seed,
        checkpoint_interval: args.checkpoint_interval,
        checkpoint_dir: args.checkpoint_dir.clone(),
        fail_after: args.fail_after.into_iter().collect(),
        from: args.from.clone(),
        print: args.print,
        running_sums: args.running_sums.clone(),
        restart: None,
        batch_size: args.batch_size,
        retain: args.retain,
        checkpoint_every_records: args.checkpoint_every_records,
        savepoint_dir: Some(args.savepoint_dir.clone()),
        allow_non_restored_state: args.allow_non_restored_state,
        allow_changed_sources: args.allow_changed_sources,
        mode: match args.mode {
            Mode::ExactlyOnce => CheckpointingMode::ExactlyOnce,
            Mode::AtLeastOnce => CheckpointingMode::AtLeastOnce,
        },
        buffers_per_channel: args.buffers_per_channel,
        sink_delay: args.sink_delay,
        sink_gate: None,
        unaligned: args.unaligned || args.aligned_checkpoint_timeout.is_some(),
        aligned_checkpoint_timeout: args.aligned_checkpoint_timeout.unwrap_or_default(),
        snapshot_compression: args.snapshot_compression,
        incremental: args.incremental,
        state_backend: state_backend(args)?,
        key_space: args.key_space,
        totals: !args.no_totals,
    })
}

/// Ctrl-C (SIGINT), listened for from the moment this is made: one that comes before the
/// first await is not lost, nor does it kill the process.
struct Interrupts {
    #[cfg(unix)]
    signal: tokio::signal::unix::Signal,
}

impl Interrupts {
    fn listen() -> std::io::Result<Interrupts> {
        Ok(Interrupts {
            #[cfg(unix)]
            signal: tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())?,
        })
    }

    /// The next Ctrl-C; false if no more can come.
    async fn next(&mut self) -> bool {
        #[cfg(unix)]
        return self.signal.recv().await.is_some();
        #[cfg(not(unix))]
        return tokio::signal::ctrl_c().await.is_ok();
    }
}

/// The first Ctrl-C cancels the job (a task manager exits at once: its subtasks are the job
/// manager's to restore); a second one exits at once, whatever is still running.
fn handle_ctrl_c(mut interrupts: Interrupts, client: JobClient, is_task_manager: bool) {
    tokio::spawn(async move {
        if !interrupts.next().await {
            return;
        }
        if is_task_manager {
            eprintln!("word_count: the task manager exits (Ctrl-C)");
            std::process::exit(exit::INTERRUPTED.into());
        }
        eprintln!("word_count: cancelling (Ctrl-C); press Ctrl-C again to exit at once");
        client.cancel();
        if interrupts.next().await {
            eprintln!("word_count: exiting at once (second Ctrl-C)");
            std::process::exit(exit::INTERRUPTED.into());
        }
    });
}

/// `--stop-with-savepoint-after K`: once the sources emitted `k` records, stops the job with a
/// savepoint.
/// When stdout is a terminal, one live line: records/s, records, checkpoints and the last
/// checkpoint's duration, redrawn five times a second (plain lines otherwise, as before).
fn live_line(client: JobClient) -> Option<indicatif::ProgressBar> {
    use std::io::IsTerminal;
    if !std::io::stdout().is_terminal() {
        return None;
    }
    let bar = indicatif::ProgressBar::with_draw_target(
        None,
        indicatif::ProgressDrawTarget::stdout_with_hz(5),
    );
    if let Ok(style) = indicatif::ProgressStyle::with_template("{spinner} {msg}") {
        bar.set_style(style);
    }
    let line = bar.clone();
    tokio::spawn(async move {
        let mut last = (std::time::Instant::now(), client.source_records());
        loop {
            tokio::time::sleep(Duration::from_millis(200)).await;
            let view = client.view();
            if view.end_time_ms.is_some() || line.is_finished() {
                return;
            }
            let (now, records) = (std::time::Instant::now(), client.source_records());
            let rate = (records - last.1) as f64 / (now - last.0).as_secs_f64().max(1e-3);
            last = (now, records);
            let latest = client.checkpoint_stats().into_iter().rev().find(|s| {
                s.status == weir_runtime::checkpoint::coordinator::CheckpointStatus::Completed
            });
            let duration = latest
                .and_then(|s| s.end_to_end)
                .map_or("-".to_string(), |d| {
                    format!("{:.1} ms", d.as_secs_f64() * 1e3)
                });
            line.set_message(format!(
                "{rate:.0} records/s · {records} records · {} checkpoints (last {duration})",
                view.completed
            ));
            line.tick();
        }
    });
    Some(bar)
}

/// Prints where the REST API listens (to stderr) once it does.
fn announce_rest_api(client: JobClient) {
    tokio::spawn(async move {
        loop {
            let view = client.view();
            if let Some(address) = view.rest_address {
                eprintln!("REST API: http://{address} (job {})", view.job_id);
                return;
            }
            if view.end_time_ms.is_some() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    });
}

fn stop_with_savepoint_after(client: JobClient, k: u64, drain: bool) {
    tokio::spawn(async move {
        while client.source_records() < k {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        // A request can be refused while a checkpoint is in progress: retry until it is
        // taken or the job has ended.
        loop {
            match client.stop_with_savepoint(None, drain).await {
                Ok(_) => break,
                Err(e) if e.to_string().contains("not triggered") => {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                Err(e) => {
                    eprintln!("word_count: stop-with-savepoint failed: {e}");
                    break;
                }
            }
        }
    });
}

/// Prints the totals, checkpoints and summary of a job that ended, and writes `--output` if it
/// finished.
fn report(
    out: &mut dyn Write,
    args: &Args,
    records: Option<u64>,
    result: &JobResult,
    totals: Option<&BTreeMap<String, i64>>,
) -> Result<()> {
    if let Some(totals) = totals
        && !args.print
    {
        let line: Vec<String> = totals.iter().map(|(k, v)| format!("{k}={v}")).collect();
        writeln!(out, "totals: {}", line.join(" "))?;
    }
    // A cancelled run's totals are partial: the file is left as it was.
    if let Some(path) = &args.output
        && let Some(totals) = totals
        && result.status == JobStatus::Finished
    {
        write_totals(path, totals).with_context(|| format!("cannot write {}", path.display()))?;
    }
    for s in &result.checkpoint_history {
        writeln!(out, "{s}")?;
    }
    if let Some(from) = &result.restored_from {
        writeln!(out, "restored from: {from}")?;
    }
    if let Some(latest) = &result.latest_checkpoint {
        writeln!(out, "latest checkpoint: {latest}")?;
    }
    if result.status == JobStatus::Canceled {
        writeln!(out, "job cancelled")?;
    }
    if let Some(savepoint) = &result.savepoint {
        writeln!(out, "stopped with savepoint: {savepoint}")?;
    }
    writeln!(out, "{}", summary(records, result))?;
    Ok(())
}

/// The `summary:` line.
fn summary(records: Option<u64>, result: &JobResult) -> String {
    let mut durations = result.checkpoint_durations.clone();
    durations.sort();
    let records = match records {
        Some(n) if result.status == JobStatus::Finished && result.savepoint.is_none() => n,
        _ => result.source_records,
    };
    let secs = result.duration.as_secs_f64();
    let mut summary = format!(
        "summary: records={records} emitted={} since_restore={} seconds={secs:.3} records_per_s={:.0} checkpoints={} restarts={}",
        result.source_records,
        result.source_records_since_restore,
        records as f64 / secs.max(1e-9),
        result.checkpoints_completed,
        result.restarts
    );
    if let Some(running) = result.running_duration {
        let running = running.as_secs_f64();
        summary.push_str(&format!(
            " running_seconds={running:.3} running_records_per_s={:.0}",
            records as f64 / running.max(1e-9)
        ));
    }
    if let (Some(p50), Some(p99)) = (percentile(&durations, 50.0), percentile(&durations, 99.0)) {
        summary.push_str(&format!(
            " checkpoint_p50_ms={} checkpoint_p99_ms={}",
            ms(p50),
            ms(p99)
        ));
    }
    if result.checkpoint_in_flight.iter().any(|b| *b > 0) {
        let mut bytes = result.checkpoint_in_flight.clone();
        bytes.sort_unstable();
        let mean = bytes.iter().sum::<u64>() as f64 / bytes.len() as f64;
        summary.push_str(&format!(
            " in_flight_bytes_p50={} in_flight_bytes_mean={mean:.0}",
            bytes[bytes.len() / 2]
        ));
    }
    if let Some(r) = result.recovery_times.first() {
        summary.push_str(&format!(" recovery_ms={}", ms(*r)));
    }
    if let Some(cpu) = weir_examples::process_cpu_seconds() {
        summary.push_str(&format!(" cpu_seconds={cpu:.2}"));
    }
    summary
}
