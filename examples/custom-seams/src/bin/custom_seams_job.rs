//! `custom_seams_job`: the word count on a user's own keyed store, checkpoint storage and
//! transport, with failures, pacing and restores, printing what each seam did.

use anyhow::{Context, Result};
use clap::Parser;
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;
use weir_example_custom_seams::{
    JobOptions, StorageCounters, configure, counting_url, register_counting_scheme, running_counts,
};
use weir_runtime::testing::Failures;
use weir_runtime::{JobError, JobResult, JobStatus, StreamEnvironment};

/// Counts generated words with keyed state in a BTreeMap store, checkpoints in a counting://
/// storage and records through a counting transport.
#[derive(Parser, Debug)]
#[command(
    after_help = "Prints `checkpoint completed: <url>` as each checkpoint completes, \
    `restored from: <url>` and a final `summary:` line with every seam's counters. \
    Exit codes: 0 finished; 1 the job failed; 2 bad flags."
)]
struct Args {
    /// Records over all source subtasks.
    #[arg(long, default_value_t = 200_000)]
    records: u64,
    /// Seed of the generated words.
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// Parallelism of every operator.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=128))]
    parallelism: u32,
    /// Max parallelism (key groups); keep it across the runs of a rescale.
    #[arg(long, default_value_t = 128, value_parser = clap::value_parser!(u32).range(1..=32768))]
    max_parallelism: u32,
    /// Checkpoint root: counting:///abs/dir, or a path (turned into that URL).
    #[arg(long, default_value = "custom-seams-checkpoints")]
    checkpoint_dir: String,
    /// Checkpoint interval, e.g. 50ms or 1s.
    #[arg(long, default_value = "50ms", value_parser = positive_duration)]
    checkpoint_interval: Duration,
    /// Completed checkpoints kept.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=10000))]
    retain: u32,
    /// Start from a checkpoint (as printed) or the latest complete one under a root: a
    /// counting:// URL, or a path (turned into one).
    #[arg(long)]
    from: Option<String>,
    /// Where the running counts `(word,n)` are committed exactly once: a part file per
    /// subtask per checkpoint.
    #[arg(long, default_value = "custom-seams-output")]
    output: PathBuf,
    /// Fail the job once when K records were seen in total (repeatable); each failure restarts
    /// it from its latest checkpoint.
    #[arg(long, value_name = "K")]
    fail_at: Vec<u64>,
    /// Sleep 1 ms every N records (0: never), so that a run lasts long enough to be killed
    /// after a checkpoint.
    #[arg(long, value_name = "N", default_value_t = 0)]
    pace: u64,
}

/// A duration flag: humantime syntax, above zero, at most a day.
fn positive_duration(text: &str) -> Result<Duration, String> {
    let d = humantime::parse_duration(text).map_err(|e| e.to_string())?;
    if d.is_zero() || d > Duration::from_secs(24 * 3600) {
        return Err(format!("{text}: must be above 0 and at most 24h"));
    }
    Ok(d)
}

fn main() -> ExitCode {
    let args = Args::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("Error: cannot start the runtime: {e}");
            return ExitCode::from(1);
        }
    };
    let code = runtime.block_on(run(args));
    runtime.shutdown_timeout(Duration::from_millis(100));
    ExitCode::from(code)
}

/// The job's options from the flags; paths become `counting://` URLs.
fn options(args: &Args) -> Result<JobOptions> {
    Ok(JobOptions {
        records: args.records,
        seed: args.seed,
        parallelism: args.parallelism,
        max_parallelism: args.max_parallelism,
        checkpoint_interval: args.checkpoint_interval,
        checkpoint_root: counting_url(&args.checkpoint_dir).context("--checkpoint-dir")?,
        from: args
            .from
            .as_deref()
            .map(counting_url)
            .transpose()
            .context("--from")?,
        restart_attempts: u32::try_from(args.fail_at.len())
            .context("--fail-at")?
            .saturating_add(1),
        retain: args.retain,
        ..JobOptions::default()
    })
}

/// Runs the job; returns the exit code.
async fn run(args: Args) -> u8 {
    let storage = register_counting_scheme();
    storage.on_completed(|location| {
        // Printed before the storage tells the job the write is done: a kill after this line
        // leaves the checkpoint it names (a newer one is complete before this one is deleted).
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "checkpoint completed: {location}");
        let _ = out.flush();
    });
    let opts = match options(&args) {
        Ok(opts) => opts,
        Err(e) => {
            eprintln!("Error: {e:?}");
            return 2;
        }
    };
    let env = StreamEnvironment::new();
    let seams = match configure(&env, &opts) {
        Ok(seams) => seams,
        Err(e) => {
            eprintln!("Error: {e}");
            return 2;
        }
    };
    let failures = Failures::paced(args.fail_at.clone(), args.pace);
    running_counts(&env, &opts, &failures)
        .write_to_files(&args.output)
        .uid("sink");
    let result = match env.execute().await {
        Ok(result) => result,
        Err(e) => {
            eprintln!("Error: custom_seams_job failed: {e}");
            return match e {
                JobError::Invalid(_) | JobError::Graph(_) => 2,
                _ => 1,
            };
        }
    };
    let mut out = std::io::stdout().lock();
    let printed = report(&mut out, &result, &seams, &storage).and_then(|()| Ok(out.flush()?));
    match (printed, result.status) {
        (Err(e), _) => {
            eprintln!("Error: {e:?}");
            1
        }
        (Ok(()), JobStatus::Finished) => 0,
        (Ok(()), _) => 1,
    }
}

/// Prints where the job restored from, its latest checkpoint and the `summary:` line.
fn report(
    out: &mut dyn Write,
    result: &JobResult,
    seams: &weir_example_custom_seams::Seams,
    storage: &StorageCounters,
) -> Result<()> {
    if let Some(from) = &result.restored_from {
        writeln!(out, "restored from: {from}")?;
    }
    if let Some(latest) = &result.latest_checkpoint {
        writeln!(out, "latest checkpoint: {latest}")?;
    }
    writeln!(
        out,
        "summary: status={:?} emitted={} since_restore={} restarts={} checkpoints={} {} {} {}",
        result.status,
        result.source_records,
        result.source_records_since_restore,
        result.restarts,
        result.checkpoints_completed,
        seams.state.counters().get(),
        storage.get(),
        seams.transport.summary()
    )?;
    Ok(())
}
