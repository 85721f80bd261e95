//! `kafka_word_count`: the word count from a Kafka topic to a Kafka topic, exactly once.
//!
//! ```text
//! kafka_word_count --mock-cluster --records 100000 --fail-after 40000 --output totals.csv
//! kafka_word_count --bootstrap-servers HOST:9092 --produce 100000 --seed 7
//! kafka_word_count --bootstrap-servers HOST:9092 --bounded --output totals.csv
//! ```

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use anyhow::{Context, bail};
use clap::Parser;
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};
use weir_kafka::rdkafka::mocking::MockCluster;
use weir_kafka::word_count::{self, KafkaWordCount};
use weir_kafka::{Connection, DeliveryGuarantee, MarkerMode, ParseErrorPolicy};
use weir_runtime::JobStatus;

/// The word count from a topic to a topic, with checkpoints and injected failures.
#[derive(Parser, Debug)]
#[command(version, about)]
struct Args {
    /// The Kafka cluster.
    #[arg(long, conflicts_with = "mock_cluster")]
    bootstrap_servers: Option<String>,
    /// Start librdkafka's mock cluster in this process, fill the input topic with `--records`
    /// records, run the job over them and check the output a `read_committed` consumer sees.
    #[arg(long)]
    mock_cluster: bool,
    /// Only fill the input topic with this many records (record `i` is the number `word_count`
    /// generates for `--seed`), then exit.
    #[arg(long)]
    produce: Option<u64>,
    /// With `--mock-cluster`: the records to produce first. Otherwise: the records the input
    /// holds, for the check of the output (implies `--bounded`).
    #[arg(long)]
    records: Option<u64>,
    /// The generator's seed.
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// Values are drawn from 1..=N.
    #[arg(long, default_value_t = weir_examples::DIGITS)]
    key_space: u64,
    /// The input topic.
    #[arg(long, default_value = "numbers")]
    input_topic: String,
    /// The output topic (word → running total).
    #[arg(long, default_value = "word-counts")]
    output_topic: String,
    /// Partitions of each topic the mock cluster creates.
    #[arg(long, default_value_t = 4)]
    partitions: i32,
    /// Read to the input's end as it is at the start, then stop.
    #[arg(long)]
    bounded: bool,
    /// Parallelism.
    #[arg(short, long, default_value_t = 2)]
    parallelism: u32,
    /// Checkpoint interval (`0` turns checkpoints off).
    #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
    checkpoint_interval: Duration,
    /// Where checkpoints go.
    #[arg(long, default_value = "/tmp/weir-kafka-checkpoints")]
    checkpoint_dir: PathBuf,
    /// Restore from this checkpoint, or the latest under this checkpoint root.
    #[arg(long)]
    from: Option<PathBuf>,
    /// Fail once after this many records (repeatable).
    #[arg(long)]
    fail_after: Vec<u64>,
    /// `exactly-once` (Kafka transactions) or `at-least-once`.
    #[arg(long, default_value = "exactly-once")]
    delivery: String,
    /// The prefix of the sink's transactional ids.
    #[arg(long, default_value = "kafka-word-count")]
    transactional_id_prefix: String,
    /// Where the exactly-once sink commits its marker: `in-transaction` (brokers) or
    /// `after-commit` (librdkafka's mock cluster, which keeps no offsets sent to a transaction;
    /// the default with `--mock-cluster`).
    #[arg(long)]
    marker: Option<String>,
    /// The sink's transaction timeout.
    #[arg(long, default_value = "15min", value_parser = humantime::parse_duration)]
    transaction_timeout: Duration,
    /// What to do with an input record that is not a number: `fail` or `skip`.
    #[arg(long, default_value = "fail")]
    on_parse_error: String,
    /// How long a request to the cluster may take.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    request_timeout: Duration,
    /// Write the totals a `read_committed` consumer sees as `word,total` lines.
    #[arg(long)]
    output: Option<PathBuf>,
    /// Measure end-to-end latency instead (with `--mock-cluster`): produce this many records/s
    /// for `--latency-seconds` while the job runs, and report a record's produce time to its
    /// `read_committed` visibility.
    #[arg(long)]
    latency_rate: Option<u64>,
    /// How long the latency measurement produces.
    #[arg(long, default_value_t = 10)]
    latency_seconds: u64,
}

/// Logs warnings, or what `RUST_LOG` (a list of `target=level`) asks for, to stderr.
fn init_logging() {
    use tracing_subscriber::filter::Targets;
    use tracing_subscriber::prelude::*;
    let filter = std::env::var("RUST_LOG")
        .ok()
        .and_then(|v| v.parse::<Targets>().ok())
        .unwrap_or_else(|| Targets::new().with_default(tracing::Level::WARN));
    tracing_subscriber::registry()
        .with(tracing_subscriber::fmt::layer().with_writer(std::io::stderr))
        .with(filter)
        .init();
}

fn main() -> ExitCode {
    init_logging();
    match run(Args::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: Args) -> anyhow::Result<()> {
    let mock = if args.mock_cluster {
        let mock = MockCluster::new(3).context("cannot start the mock cluster")?;
        for topic in [&args.input_topic, &args.output_topic] {
            mock.create_topic(topic, args.partitions, 3)
                .with_context(|| format!("cannot create topic '{topic}'"))?;
        }
        Some(mock)
    } else {
        None
    };
    let servers = match (&mock, &args.bootstrap_servers) {
        (Some(m), _) => m.bootstrap_servers(),
        (None, Some(s)) => s.clone(),
        (None, None) => bail!("give --bootstrap-servers HOST:PORT, or --mock-cluster"),
    };
    let mut connection = Connection::new(servers);
    connection.request_timeout = args.request_timeout;
    if let Some(n) = args.produce {
        let took =
            word_count::produce(&connection, &args.input_topic, n, args.seed, args.key_space)
                .map_err(anyhow::Error::msg)?;
        println!(
            "produced {n} records into '{}' in {took:.2?}",
            args.input_topic
        );
        return Ok(());
    }
    if args.mock_cluster && args.latency_rate.is_none() {
        let n = args.records.unwrap_or(100_000);
        let took =
            word_count::produce(&connection, &args.input_topic, n, args.seed, args.key_space)
                .map_err(anyhow::Error::msg)?;
        eprintln!(
            "produced {n} records into '{}' in {took:.2?}",
            args.input_topic
        );
    }
    let guarantee = match args.delivery.as_str() {
        "exactly-once" => DeliveryGuarantee::ExactlyOnce {
            transactional_id_prefix: args.transactional_id_prefix.clone(),
        },
        "at-least-once" => DeliveryGuarantee::AtLeastOnce,
        other => bail!("--delivery is exactly-once or at-least-once, not {other:?}"),
    };
    let on_parse_error = match args.on_parse_error.as_str() {
        "fail" => ParseErrorPolicy::Fail,
        "skip" => ParseErrorPolicy::Skip,
        other => bail!("--on-parse-error is fail or skip, not {other:?}"),
    };
    let opts = KafkaWordCount {
        connection: connection.clone(),
        input: args.input_topic.clone(),
        output: args.output_topic.clone(),
        parallelism: args.parallelism,
        checkpoint_interval: (!args.checkpoint_interval.is_zero())
            .then_some(args.checkpoint_interval),
        checkpoint_dir: args.checkpoint_dir.clone(),
        from: args.from.clone(),
        fail_after: args.fail_after.clone(),
        guarantee,
        bounded: args.bounded || args.mock_cluster || args.records.is_some(),
        on_parse_error,
        transaction_timeout: args.transaction_timeout,
        marker: match (args.marker.as_deref(), args.mock_cluster) {
            (Some("in-transaction"), _) | (None, false) => MarkerMode::InTransaction,
            (Some("after-commit"), _) | (None, true) => MarkerMode::AfterCommit,
            (Some(other), _) => bail!("--marker is in-transaction or after-commit, not {other:?}"),
        },
    };
    if let Some(rate) = args.latency_rate {
        let l = word_count::measure_latency(&opts, rate, args.latency_seconds)
            .map_err(anyhow::Error::msg)?;
        println!(
            "latency delivery={} records={} rate={rate} p50_ms={} p99_ms={} max_ms={}",
            args.delivery, l.records, l.p50, l.p99, l.max
        );
        return Ok(());
    }
    let built = word_count::build(&opts).map_err(anyhow::Error::msg)?;
    let started = Instant::now();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the runtime")?;
    let result = runtime
        .block_on(built.env.execute())
        .context("the job failed")?;
    // Commits the job stopped waiting for (a slow broker) go on; wait for them before reading.
    if !weir_kafka::await_commits(args.transaction_timeout) {
        bail!(
            "the sink's last commits did not end within {:?}",
            args.transaction_timeout
        );
    }
    let elapsed = started.elapsed();
    if result.status != JobStatus::Finished {
        bail!("the job ended as {:?}", result.status);
    }
    let sink = &built.sink;
    let records_in = sink.records_in.load(std::sync::atomic::Ordering::Relaxed);
    eprintln!(
        "job finished in {elapsed:.2?}: {records_in} updates written, {} transactions committed, \
         {} restored batches found committed, {} input records read, {} skipped",
        sink.transactions_committed
            .load(std::sync::atomic::Ordering::Relaxed),
        sink.batches_found_committed
            .load(std::sync::atomic::Ordering::Relaxed),
        built
            .source
            .records_read
            .load(std::sync::atomic::Ordering::Relaxed),
        built
            .source
            .records_skipped
            .load(std::sync::atomic::Ordering::Relaxed),
    );
    if args.output.is_some() || args.records.is_some() || args.mock_cluster {
        verify(&args, &connection)?;
    }
    // The figures of the run, as `key=value` fields (what `cargo xtask bench kafka` reads).
    let records = built
        .source
        .records_read
        .load(std::sync::atomic::Ordering::Relaxed);
    let seconds = result.duration.as_secs_f64();
    println!(
        "summary delivery={} records={records} seconds={seconds:.3} records_per_s={:.0} \
         transactions={}",
        args.delivery,
        records as f64 / seconds.max(1e-9),
        sink.transactions_committed
            .load(std::sync::atomic::Ordering::Relaxed)
    );
    drop(mock);
    Ok(())
}

/// Reads the output as a `read_committed` consumer, writes the totals, and checks them against
/// counts computed without the engine when the input's records are known.
fn verify(args: &Args, connection: &Connection) -> anyhow::Result<()> {
    let updates =
        word_count::read_committed(connection, &args.output_topic).map_err(anyhow::Error::msg)?;
    let mut totals = std::collections::BTreeMap::new();
    for u in &updates {
        totals.insert(u.word.clone(), u.total);
    }
    if let Some(path) = &args.output {
        let mut f = std::io::BufWriter::new(
            std::fs::File::create(path)
                .with_context(|| format!("cannot create {}", path.display()))?,
        );
        for (w, t) in &totals {
            writeln!(f, "{w},{t}")?;
        }
        f.flush()?;
    }
    let records = if args.mock_cluster {
        Some(args.records.unwrap_or(100_000))
    } else {
        args.records
    };
    if let Some(n) = records {
        let expected = word_count::expected_counts(n, args.seed, args.key_space);
        word_count::check_exactly_once(&updates, &expected)
            .map_err(|e| anyhow::anyhow!("the output is not exactly once:\n{e}"))?;
        println!(
            "exactly once: {} updates over {} words, every input record counted once",
            updates.len(),
            totals.len()
        );
    } else {
        println!("{} updates over {} words", updates.len(), totals.len());
    }
    Ok(())
}
