//! `nexmark`: runs one Nexmark query on Weir (or, with `--reference`, computes its result
//! without the engine) over nexmark-flink's generated events, and prints one line of figures.

use anyhow::{Context, Result, bail};
use clap::Parser;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};
use weir_nexmark::sinks::{blackhole, parts_dir, read_parts};
use weir_nexmark::{GeneratorConfig, Query, queries, reference, result_lines};
use weir_runtime::testing::Failures;
use weir_runtime::{JobClient, JobError, RestartStrategy, StorageConfig, StreamEnvironment};

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Runs a Nexmark query (q0, q1, q2, q3, q4, q5, q7, q8, q11) over generated events.
#[derive(Parser, Debug)]
#[command(after_help = "Prints: query=… p=… events=… seconds=… events_per_s=… \
    events_per_core_s=… checkpoints=… rows=…. Exit codes: 0 finished (or stopped with a \
    savepoint), 1 the job failed, 2 bad flags.")]
struct Args {
    /// The query: q0, q1, q2, q3, q4, q5, q7, q8 or q11.
    #[arg(long)]
    query: Query,
    /// Events in all (over every source subtask).
    #[arg(long, default_value_t = 10_000_000, value_parser = clap::value_parser!(u64).range(1..))]
    events: u64,
    /// Seeds every event's random draws.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Events per second of event time (nexmark-flink's first-event.rate, its benchmark's TPS).
    #[arg(long, default_value_t = 10_000_000, value_parser = clap::value_parser!(u64).range(1..))]
    event_rate: u64,
    /// Subtasks per operator.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=1024))]
    parallelism: u32,
    /// Key groups, the most subtasks a savepoint of this run can be rescaled to.
    #[arg(long, default_value_t = 128, value_parser = clap::value_parser!(u32).range(1..=32768))]
    max_parallelism: u32,
    /// Checkpoint interval (e.g. 1s, 500ms).
    #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
    checkpoint_interval: Duration,
    /// Where checkpoints go.
    #[arg(long, default_value = "weir-checkpoints")]
    checkpoint_dir: PathBuf,
    /// Where savepoints go.
    #[arg(long, default_value = "weir-savepoints")]
    savepoint_dir: PathBuf,
    /// Inject one failure once K events have gone through the source, over all subtasks.
    #[arg(long)]
    fail_after: Option<u64>,
    /// Start from a savepoint or checkpoint directory.
    #[arg(long)]
    from: Option<PathBuf>,
    /// Once the sources have emitted K events in this run, stop with a savepoint (its path is
    /// printed as `savepoint=…`).
    #[arg(long)]
    stop_with_savepoint_after: Option<u64>,
    /// Write the query's result as sorted lines (its rows go exactly once into part files
    /// under FILE.parts, which a resumed run adds to).
    #[arg(long)]
    output: Option<PathBuf>,
    /// Compute the result with the plain single-threaded reference instead of the engine.
    #[arg(long)]
    reference: bool,
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
    let code = match runtime.block_on(run(&args)) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("Error: {e:?}");
            if e.downcast_ref::<JobError>()
                .is_some_and(|j| matches!(j, JobError::Invalid(_) | JobError::Graph(_)))
            {
                2
            } else {
                1
            }
        }
    };
    runtime.shutdown_timeout(Duration::from_millis(100));
    ExitCode::from(code)
}

fn config(args: &Args) -> GeneratorConfig {
    GeneratorConfig {
        seed: args.seed,
        events: Some(args.events),
        event_rate: args.event_rate,
        ..GeneratorConfig::default()
    }
}

async fn run(args: &Args) -> Result<()> {
    let config = config(args);
    config.validate().map_err(anyhow::Error::msg)?;
    if args.reference {
        return run_reference(args, &config);
    }
    let env = StreamEnvironment::new();
    env.set_parallelism(args.parallelism)
        .set_max_parallelism(args.max_parallelism)
        .enable_checkpointing(args.checkpoint_interval)
        .set_restart_strategy(RestartStrategy::FixedDelay {
            attempts: 3,
            delay: Duration::ZERO,
        })
        .set_savepoint_dir(&args.savepoint_dir);
    let location = args.checkpoint_dir.to_string_lossy().to_string();
    env.set_checkpoint_storage(
        StorageConfig::from_location(&location)
            .with_context(|| format!("--checkpoint-dir {location}"))?,
    );
    if let Some(from) = &args.from {
        env.restore_from(from);
    }
    // One failure once K events went through the source: injected in its chain.
    let events = queries::source(&env, &config);
    let events = match args.fail_after {
        Some(k) => events.inject_failures(&Failures::at(vec![k])),
        None => events,
    };
    let rows = queries::on(args.query, events);
    let parts = args.output.as_deref().map(parts_dir);
    if let Some(dir) = &parts
        && args.from.is_none()
        && !read_parts(dir)
            .with_context(|| format!("reading {}", dir.display()))?
            .is_empty()
    {
        return Err(JobError::Invalid(format!(
            "{} holds the rows of an earlier run: resume that run with --from, or remove it \
             (a fresh run would add its rows to them)",
            dir.display()
        ))
        .into());
    }
    let counter = match &parts {
        Some(dir) => {
            rows.write_to_files(dir).uid("nexmark-output");
            None
        }
        None => Some(blackhole(rows)),
    };
    let client = JobClient::default();
    let savepoint = std::sync::Arc::new(std::sync::Mutex::new(None));
    if let Some(k) = args.stop_with_savepoint_after {
        stop_with_savepoint_after(client.clone(), k, savepoint.clone());
    }
    let cpu_before = process_cpu_seconds();
    let started = Instant::now();
    let result = env.execute_with(client).await?;
    let seconds = started.elapsed().as_secs_f64();
    let cpu = process_cpu_seconds().zip(cpu_before).map(|(a, b)| a - b);
    let events = result.source_records_since_restore;
    let rows = match (&parts, &counter) {
        (Some(dir), _) => {
            let lines = read_parts(dir).with_context(|| format!("reading {}", dir.display()))?;
            let result = result_lines(args.query, lines);
            let n = result.len();
            if let Some(output) = &args.output {
                write_lines(output, &result)?;
            }
            n as u64
        }
        (None, Some(c)) => c.rows(),
        (None, None) => 0,
    };
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "query={} p={} events={events} seconds={seconds:.3} events_per_s={:.0} \
         events_per_core_s={} checkpoints={} rows={rows} restarts={}",
        args.query,
        args.parallelism,
        events as f64 / seconds.max(1e-9),
        cpu.map_or("n/a".to_string(), |c| format!(
            "{:.0}",
            events as f64 / c.max(1e-9)
        )),
        result.checkpoints_completed,
        result.restarts,
    )?;
    let taken = savepoint.lock().map(|s| s.clone()).unwrap_or_default();
    if let Some(path) = taken {
        writeln!(out, "savepoint={path}")?;
    }
    Ok(())
}

fn run_reference(args: &Args, config: &GeneratorConfig) -> Result<()> {
    let Some(output) = &args.output else {
        bail!("--reference needs --output FILE to write the result to");
    };
    let started = Instant::now();
    let lines = reference::run(args.query, reference::events(config, args.events));
    write_lines(output, &lines)?;
    println!(
        "query={} reference events={} seconds={:.3} rows={}",
        args.query,
        args.events,
        started.elapsed().as_secs_f64(),
        lines.len()
    );
    Ok(())
}

fn write_lines(path: &Path, lines: &[String]) -> Result<()> {
    let mut text = String::with_capacity(lines.iter().map(|l| l.len() + 1).sum());
    for line in lines {
        text.push_str(line);
        text.push('\n');
    }
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))
}

/// Once the sources emitted `k` events, stops the job with a savepoint; its path goes into
/// `taken`.
fn stop_with_savepoint_after(
    client: JobClient,
    k: u64,
    taken: std::sync::Arc<std::sync::Mutex<Option<String>>>,
) {
    tokio::spawn(async move {
        while client.source_records() < k {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        // A request can be refused while a checkpoint is in progress: retry.
        loop {
            match client.stop_with_savepoint(None, false).await {
                Ok(path) => {
                    if let Ok(mut t) = taken.lock() {
                        *t = Some(path);
                    }
                    break;
                }
                Err(e) if e.to_string().contains("not triggered") => {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                Err(e) => {
                    eprintln!("nexmark: stop-with-savepoint failed: {e}");
                    break;
                }
            }
        }
    });
}

/// User plus system CPU time of this process, in seconds (Linux; `None` elsewhere).
fn process_cpu_seconds() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    let after = &stat[stat.rfind(')')? + 1..];
    let mut fields = after.split_whitespace().skip(11);
    let user: u64 = fields.next()?.parse().ok()?;
    let system: u64 = fields.next()?.parse().ok()?;
    Some((user + system) as f64 / 100.0)
}
