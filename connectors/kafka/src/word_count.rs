//! The word count from a topic to a topic (`kafka_word_count`), as a library so that the binary,
//! the tests and the benchmark build the same job: filling the input topic, the job itself, and
//! what a `read_committed` consumer of the output sees, checked against independently computed
//! counts.

use crate::{
    Connection, DeliveryGuarantee, KafkaRecord, KafkaSink, KafkaSource, ParseErrorPolicy,
    SinkMetrics, SourceMetrics,
};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::{Offset, TopicPartitionList};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};
use weir_examples::{FailureInjector, Word};
use weir_runtime::{RestartStrategy, StreamEnvironment, ToCompactString};

/// The job's options.
#[derive(Clone, Debug)]
pub struct KafkaWordCount {
    /// The cluster.
    pub connection: Connection,
    /// The topic the numbers are read from.
    pub input: String,
    /// The topic the running totals go to.
    pub output: String,
    /// Parallelism of every operator.
    pub parallelism: u32,
    /// Checkpoint interval; `None`: off.
    pub checkpoint_interval: Option<Duration>,
    /// Where checkpoints go.
    pub checkpoint_dir: PathBuf,
    /// Start from this checkpoint or checkpoint root.
    pub from: Option<PathBuf>,
    /// Injected failures: the tokenizer fails once when its subtasks saw this many records.
    pub fail_after: Vec<u64>,
    /// The sink's guarantee.
    pub guarantee: DeliveryGuarantee,
    /// Read to the input's end as it is at the start, then end; otherwise run until stopped.
    pub bounded: bool,
    /// What happens to an input record that is not a number.
    pub on_parse_error: ParseErrorPolicy,
    /// The sink's transaction timeout.
    pub transaction_timeout: Duration,
    /// Where the sink commits its marker ([`crate::MarkerMode`]): after each commit on
    /// librdkafka's mock cluster.
    pub marker: crate::MarkerMode,
}

/// The job and its counters.
pub struct Built {
    /// The job, ready to execute.
    pub env: StreamEnvironment,
    /// The source's counters.
    pub source: Arc<SourceMetrics>,
    /// The sink's counters.
    pub sink: Arc<SinkMetrics>,
}

/// Builds the job: numbers → words → running count per word → the output topic, keyed by word.
pub fn build(opts: &KafkaWordCount) -> Result<Built, String> {
    let env = StreamEnvironment::new();
    env.set_job_name("kafka_word_count")
        .set_parallelism(opts.parallelism);
    if let Some(i) = opts.checkpoint_interval {
        env.enable_checkpointing(i);
    }
    env.set_checkpoint_dir(&opts.checkpoint_dir);
    if let Some(from) = &opts.from {
        env.restore_from(from);
    }
    if !opts.fail_after.is_empty() {
        env.set_restart_strategy(RestartStrategy::FixedDelay {
            attempts: opts.fail_after.len() as u32 + 3,
            delay: Duration::from_millis(100),
        });
    }
    let mut source = KafkaSource::new(opts.connection.clone(), [opts.input.clone()], parse)
        .on_parse_error(opts.on_parse_error)
        .group_id(format!("{}-word-count", opts.input))
        .partition_discovery_interval(Duration::from_secs(5));
    if opts.bounded {
        source = source.bounded();
    }
    let source_metrics = source.metrics();
    let injector = Arc::new(FailureInjector::new(opts.fail_after.clone()));
    let words = source.build(&env, "Kafka Source")?.uid("kafka-source");
    let counts = words
        .map(move |w: Word| {
            injector.record();
            (w, 1i64)
        })
        .uid("tokenizer")
        .key_by(|t: &(Word, i64)| &t.0)
        .sum()
        .uid("sum");
    let sink = KafkaSink::new(
        opts.connection.clone(),
        opts.output.clone(),
        |(word, total): &(Word, i64), key: &mut Vec<u8>, value: &mut Vec<u8>| {
            key.extend_from_slice(word.as_bytes());
            value.extend_from_slice(total.to_compact_string().as_bytes());
        },
    )
    .delivery_guarantee(opts.guarantee.clone())
    .transaction_timeout(opts.transaction_timeout)
    .marker(opts.marker);
    let sink_metrics = sink.metrics();
    sink.sink(counts)?.uid("kafka-sink");
    Ok(Built {
        env,
        source: source_metrics,
        sink: sink_metrics,
    })
}

/// An input record: the number as text, which becomes the word.
fn parse(r: &KafkaRecord<'_>) -> Result<Word, String> {
    let text = r
        .payload
        .ok_or("the record has no value")
        .and_then(|p| std::str::from_utf8(p).map_err(|_| "the value is not UTF-8"))?
        .trim();
    text.parse::<i64>()
        .map_err(|_| format!("the value {text:?} is not a number"))?;
    Ok(text.to_compact_string())
}

/// Record `i`'s value: the number `word_count` generates for the same seed.
pub fn value(seed: u64, key_space: u64, i: u64) -> i64 {
    weir_examples::generator(seed, key_space).value(i)
}

/// Produces records `0..records` of the generator into `topic` (idempotently); returns how long
/// it took.
pub fn produce(
    connection: &Connection,
    topic: &str,
    records: u64,
    seed: u64,
    key_space: u64,
) -> Result<Duration, String> {
    let started = Instant::now();
    let deliveries = crate::Deliveries::default();
    let producer: BaseProducer<crate::Deliveries> = connection
        .config(&[("enable.idempotence", "true"), ("linger.ms", "5")])
        .create_with_context(deliveries.clone())
        .map_err(|e| format!("cannot create a Kafka producer: {e}"))?;
    let generator = weir_examples::generator(seed, key_space);
    let mut text = String::new();
    for i in 0..records {
        text.clear();
        use std::fmt::Write;
        let _ = write!(text, "{}", generator.value(i));
        let record = BaseRecord::<(), str>::to(topic).payload(text.as_str());
        crate::client::send_waiting(&producer, record)
            .map_err(|e| format!("cannot produce to '{topic}': {e}"))?;
        if i % 4096 == 0 {
            producer.poll(Duration::ZERO);
        }
    }
    producer
        .flush(Duration::from_secs(60))
        .map_err(|e| format!("cannot flush the records produced to '{topic}': {e}"))?;
    check_delivered(&deliveries, records, topic)?;
    Ok(started.elapsed())
}

/// Every one of `records` acknowledged, or the first failure.
fn check_delivered(d: &crate::Deliveries, records: u64, topic: &str) -> Result<(), String> {
    if let Some(e) = d.error() {
        return Err(format!(
            "a record produced to '{topic}' was not delivered: {e}"
        ));
    }
    if d.delivered() != records {
        return Err(format!(
            "{} of {records} records produced to '{topic}' were acknowledged",
            d.delivered()
        ));
    }
    Ok(())
}

/// How many records `topic` holds: the sum over its partitions of end minus start offset.
pub fn records_kept(connection: &Connection, topic: &str) -> Result<u64, String> {
    let consumer = connection.admin_consumer()?;
    let mut kept = 0;
    for tp in connection.partitions(&[topic.to_string()])? {
        let (lo, hi) = consumer
            .fetch_watermarks(topic, tp.partition, connection.request_timeout)
            .map_err(|e| format!("cannot read the offsets of {tp}: {e}"))?;
        kept += (hi - lo).max(0) as u64;
    }
    Ok(kept)
}

/// Milliseconds since the epoch.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// One record of the output as a `read_committed` consumer saw it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Update {
    /// The word.
    pub word: String,
    /// Its running total.
    pub total: i64,
    /// When the record became visible to the consumer, ms since the epoch (its commit).
    pub seen_at: i64,
}

/// Everything committed to `topic`, per partition in log order, as a `read_committed`
/// consumer reads it up to the partitions' ends.
pub fn read_committed(connection: &Connection, topic: &str) -> Result<Vec<Update>, String> {
    let consumer: BaseConsumer = connection
        .config(&[
            ("isolation.level", "read_committed"),
            ("enable.auto.commit", "false"),
            ("enable.partition.eof", "true"),
            ("group.id", "weir-read-committed"),
        ])
        .create()
        .map_err(|e| format!("cannot create a Kafka consumer: {e}"))?;
    let partitions = connection.partitions(&[topic.to_string()])?;
    let mut tpl = TopicPartitionList::new();
    for tp in &partitions {
        let (lo, _) = consumer
            .fetch_watermarks(topic, tp.partition, connection.request_timeout)
            .map_err(|e| format!("cannot read the offsets of {tp}: {e}"))?;
        if lo > 0 {
            return Err(format!(
                "{tp} starts at offset {lo}: its oldest records are gone (retention; librdkafka's \
                 mock cluster keeps about 5 MiB per partition), so the totals cannot be checked"
            ));
        }
        tpl.add_partition_offset(topic, tp.partition, Offset::Beginning)
            .map_err(|e| e.to_string())?;
    }
    consumer.assign(&tpl).map_err(|e| e.to_string())?;
    let mut at_end = std::collections::BTreeSet::new();
    let mut out = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(120);
    while at_end.len() < partitions.len() {
        if Instant::now() > deadline {
            return Err(format!("reading '{topic}' to its end took over 120 s"));
        }
        match consumer.poll(Duration::from_millis(200)) {
            None => {}
            Some(Err(rdkafka::error::KafkaError::PartitionEOF(p))) => {
                at_end.insert(p);
            }
            Some(Err(e)) => return Err(format!("cannot read '{topic}': {e}")),
            Some(Ok(m)) => {
                at_end.remove(&m.partition());
                let word = String::from_utf8_lossy(m.key().unwrap_or_default()).into_owned();
                let text = String::from_utf8_lossy(m.payload().unwrap_or_default()).into_owned();
                let total = text.parse().map_err(|_| {
                    format!("the output record {word:?} -> {text:?} is not a total")
                })?;
                out.push(Update {
                    word,
                    total,
                    seen_at: now_ms(),
                });
            }
        }
    }
    Ok(out)
}

/// The count of each word among records `0..records`, computed without the engine.
pub fn expected_counts(records: u64, seed: u64, key_space: u64) -> BTreeMap<String, i64> {
    let generator = weir_examples::generator(seed, key_space);
    let mut counts = BTreeMap::new();
    for i in 0..records {
        *counts.entry(generator.value(i).to_string()).or_insert(0) += 1;
    }
    counts
}

/// Checks that the output counts every input record exactly once: each word's updates are
/// exactly `1, 2, …, n` in order, `n` its count. Returns the final totals.
pub fn check_exactly_once(
    updates: &[Update],
    expected: &BTreeMap<String, i64>,
) -> Result<BTreeMap<String, i64>, String> {
    let mut last: BTreeMap<String, i64> = BTreeMap::new();
    let mut problems = Vec::new();
    for u in updates {
        let prev = last.get(&u.word).copied().unwrap_or(0);
        if u.total != prev + 1 && problems.len() < 10 {
            problems.push(format!(
                "word {:?}: update {} after {prev} (a duplicate or a lost update)",
                u.word, u.total
            ));
        }
        last.insert(u.word.clone(), u.total);
    }
    if &last != expected {
        let diff: Vec<String> = expected
            .iter()
            .filter(|(w, n)| last.get(*w) != Some(n))
            .take(10)
            .map(|(w, n)| format!("{w}: expected {n}, got {:?}", last.get(w)))
            .collect();
        problems.push(format!("final totals differ: {}", diff.join("; ")));
    }
    if problems.is_empty() {
        Ok(last)
    } else {
        Err(problems.join("\n"))
    }
}

/// End-to-end latency, a record's produce time to its `read_committed` visibility, in ms.
#[derive(Clone, Copy, Debug)]
pub struct Latency {
    /// Records produced (and updates seen).
    pub records: u64,
    /// Median.
    pub p50: i64,
    /// 99th percentile.
    pub p99: i64,
    /// Largest.
    pub max: i64,
}

/// Runs the job unbounded while `rate` records/s are produced for `seconds`, tails the output
/// with a `read_committed` consumer, and matches each update with the input record it counts:
/// word `w`'s `t`-th update counts `w`'s `t`-th occurrence, whose produce time the producer
/// kept. (Within a checkpoint's batch, occurrences from different partitions may be counted in
/// another order; all of a batch becomes visible at once, so this moves no latency by more than
/// the spread of produce times inside one batch.)
pub fn measure_latency(opts: &KafkaWordCount, rate: u64, seconds: u64) -> Result<Latency, String> {
    let mut opts = opts.clone();
    opts.bounded = false;
    let records = rate.saturating_mul(seconds).max(1);
    let built = build(&opts)?;
    let client = weir_runtime::JobClient::default();
    let execution = built.env.execute_with(client.clone());
    let job = std::thread::spawn(move || {
        tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .map_err(|e| e.to_string())?
            .block_on(execution)
            .map_err(|e| e.to_string())
    });
    let connection = opts.connection.clone();
    let input = opts.input.clone();
    let producer = std::thread::spawn(move || pace(&connection, &input, records, rate));
    let seen = tail(&opts.connection, &opts.output, records, seconds + 60);
    client.cancel();
    let produced = producer.join().map_err(|_| "the producer panicked")??;
    let _ = job.join();
    let seen = seen?;
    let generator = weir_examples::generator(0, weir_examples::DIGITS);
    let mut occurrences: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    for i in 0..records {
        occurrences
            .entry(generator.value(i).to_string())
            .or_default()
            .push(i);
    }
    let mut latencies = Vec::with_capacity(seen.len());
    for u in &seen {
        let i = occurrences
            .get(&u.word)
            .and_then(|o| o.get((u.total - 1).max(0) as usize))
            .ok_or_else(|| {
                format!(
                    "update {} of {:?} counts no produced record",
                    u.total, u.word
                )
            })?;
        latencies.push(u.seen_at - produced[*i as usize]);
    }
    latencies.sort_unstable();
    let at = |q: f64| latencies[((latencies.len() - 1) as f64 * q) as usize];
    Ok(Latency {
        records,
        p50: at(0.5),
        p99: at(0.99),
        max: *latencies.last().unwrap_or(&0),
    })
}

/// Produces records `0..records` (seed 0) at `rate` per second; returns each one's produce time.
fn pace(connection: &Connection, topic: &str, records: u64, rate: u64) -> Result<Vec<i64>, String> {
    let deliveries = crate::Deliveries::default();
    let producer: BaseProducer<crate::Deliveries> = connection
        .config(&[("enable.idempotence", "true"), ("linger.ms", "1")])
        .create_with_context(deliveries.clone())
        .map_err(|e| format!("cannot create a Kafka producer: {e}"))?;
    let generator = weir_examples::generator(0, weir_examples::DIGITS);
    let started = Instant::now();
    let mut times = Vec::with_capacity(records as usize);
    for i in 0..records {
        // Keeps to the rate in steps of a millisecond's worth of records.
        let due = Duration::from_secs_f64(i as f64 / rate.max(1) as f64);
        if let Some(wait) = due.checked_sub(started.elapsed()) {
            std::thread::sleep(wait);
        }
        let text = generator.value(i).to_string();
        times.push(now_ms());
        let record = BaseRecord::<(), str>::to(topic).payload(text.as_str());
        crate::client::send_waiting(&producer, record)
            .map_err(|e| format!("cannot produce to '{topic}': {e}"))?;
        producer.poll(Duration::ZERO);
    }
    producer
        .flush(Duration::from_secs(60))
        .map_err(|e| format!("cannot flush: {e}"))?;
    check_delivered(&deliveries, records, topic)?;
    Ok(times)
}

/// Reads `topic` as a `read_committed` consumer as records arrive, until `records` updates or
/// `limit_s` seconds.
fn tail(
    connection: &Connection,
    topic: &str,
    records: u64,
    limit_s: u64,
) -> Result<Vec<Update>, String> {
    let consumer: BaseConsumer = connection
        .config(&[
            ("isolation.level", "read_committed"),
            ("enable.auto.commit", "false"),
            ("group.id", "weir-latency"),
            ("fetch.wait.max.ms", "10"),
        ])
        .create()
        .map_err(|e| format!("cannot create a Kafka consumer: {e}"))?;
    let mut tpl = TopicPartitionList::new();
    for tp in connection.partitions(&[topic.to_string()])? {
        tpl.add_partition_offset(topic, tp.partition, Offset::Beginning)
            .map_err(|e| e.to_string())?;
    }
    consumer.assign(&tpl).map_err(|e| e.to_string())?;
    let deadline = Instant::now() + Duration::from_secs(limit_s);
    let mut out = Vec::with_capacity(records as usize);
    while (out.len() as u64) < records {
        if Instant::now() > deadline {
            return Err(format!(
                "saw {} of {records} updates within {limit_s} s",
                out.len()
            ));
        }
        if let Some(Ok(m)) = consumer.poll(Duration::from_millis(50)) {
            let word = String::from_utf8_lossy(m.key().unwrap_or_default()).into_owned();
            let total = std::str::from_utf8(m.payload().unwrap_or_default())
                .ok()
                .and_then(|t| t.parse().ok())
                .ok_or("an output record is not a total")?;
            out.push(Update {
                word,
                total,
                seen_at: now_ms(),
            });
        }
    }
    Ok(out)
}
