//! The word-count job of the checkpointing notes, as a library so that the binary, the tests and
//! the benchmarks build exactly the same job.
//!
//! Random ints 1..9 (record `i`'s value depends only on the seed and `i`) → `to_string` →
//! tokenizer `("7", 1)` → key by word → running sum → sink. The sink keeps the latest total per
//! word (exactly once, through checkpoints) and, with `print`, prints every update as Flink does.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};
use weir_runtime::operator::{Cancellation, Chained, OneInputOperator, OpResult, Output};
use weir_runtime::source::RandomIntGenerator;
use weir_runtime::testing::Gate;
use weir_runtime::{
    CheckpointingMode, CompactString, LatestHandle, RestartStrategy, StreamEnvironment,
};

/// The job's options (the binary's flags).
#[derive(Clone, Debug)]
pub struct WordCountOptions {
    /// Records over all source subtasks; `None`: unbounded.
    pub records: Option<u64>,
    /// Parallelism of every operator.
    pub parallelism: u32,
    /// Max parallelism; `None`: Flink's default.
    pub max_parallelism: Option<u32>,
    /// Generator seed.
    pub seed: u64,
    /// Checkpoint interval; `None`: off.
    pub checkpoint_interval: Option<Duration>,
    /// Checkpoint directory.
    pub checkpoint_dir: PathBuf,
    /// Injected failures: the map fails once when its subtasks have seen this many records in
    /// total, for each value.
    pub fail_after: Vec<u64>,
    /// Start from this checkpoint or checkpoint root.
    pub from: Option<PathBuf>,
    /// Print every update.
    pub print: bool,
    /// Also write every update, exactly once, as `(word,count)` lines into part files here.
    pub running_sums: Option<PathBuf>,
    /// Restart strategy; `None`: the default.
    pub restart: Option<RestartStrategy>,
    /// Records per batch.
    pub batch_size: usize,
    /// Completed checkpoints to keep.
    pub retain: u32,
    /// Also checkpoint every N records emitted by the sources.
    pub checkpoint_every_records: Option<u64>,
    /// Where savepoints go.
    pub savepoint_dir: Option<PathBuf>,
    /// Restore even if some state maps to no operator.
    pub allow_non_restored_state: bool,
    /// Restore even if the checkpoint was taken with other `records` or `seed`.
    pub allow_changed_sources: bool,
    /// Checkpointing mode.
    pub mode: CheckpointingMode,
    /// Credits per channel.
    pub buffers_per_channel: usize,
    /// A pause per record before the sink, to create backpressure.
    pub sink_delay: Option<Duration>,
    /// A gate before the sink, for backpressure that a test controls.
    pub sink_gate: Option<Arc<Gate>>,
    /// Unaligned checkpoints.
    pub unaligned: bool,
    /// With `unaligned`: align first, switch to unaligned after this long (0: start unaligned).
    pub aligned_checkpoint_timeout: Duration,
    /// How keyed-state snapshots compress each key group.
    pub snapshot_compression: weir_runtime::Compression,
    /// Incremental checkpoints of keyed state.
    pub incremental: bool,
    /// Where keyed state lives (default: the heap).
    pub state_backend: Arc<dyn weir_runtime::StateBackend>,
    /// The generator draws values from `1..=key_space`, so the keyed state has up to this many
    /// keys (default 9: the digits).
    pub key_space: u64,
    /// Keep the final total per key, in memory at the job's end ([`Totals`]). Off for a key
    /// space larger than memory: `running_sums` is then the job's output.
    pub totals: bool,
}

impl Default for WordCountOptions {
    fn default() -> Self {
        WordCountOptions {
            records: Some(20_000_000),
            parallelism: 1,
            max_parallelism: None,
            seed: 42,
            checkpoint_interval: None,
            checkpoint_dir: PathBuf::from("weir-checkpoints"),
            fail_after: Vec::new(),
            from: None,
            print: false,
            running_sums: None,
            restart: None,
            batch_size: 1024,
            retain: 1,
            checkpoint_every_records: None,
            savepoint_dir: None,
            allow_non_restored_state: false,
            allow_changed_sources: false,
            mode: CheckpointingMode::ExactlyOnce,
            buffers_per_channel: 2,
            sink_delay: None,
            sink_gate: None,
            unaligned: false,
            aligned_checkpoint_timeout: Duration::ZERO,
            snapshot_compression: weir_runtime::Compression::None,
            incremental: false,
            state_backend: Arc::new(weir_runtime::HeapStateBackend),
            key_space: DIGITS,
            totals: true,
        }
    }
}

/// Fails the map operator once at each threshold of records seen (over all subtasks and
/// attempts).
#[derive(Debug, Default)]
pub struct FailureInjector {
    seen: AtomicU64,
    thresholds: Vec<u64>,
    next: AtomicUsize,
}

impl FailureInjector {
    /// Failures at each of `thresholds` (sorted here).
    pub fn new(mut thresholds: Vec<u64>) -> Self {
        thresholds.sort_unstable();
        FailureInjector {
            seen: AtomicU64::new(0),
            thresholds,
            next: AtomicUsize::new(0),
        }
    }

    /// Counts one record; panics (a task failure) when a threshold is reached.
    #[inline]
    pub fn record(&self) {
        let n = self.seen.fetch_add(1, Ordering::Relaxed) + 1;
        let i = self.next.load(Ordering::Relaxed);
        if let Some(&t) = self.thresholds.get(i)
            && n >= t
            && self
                .next
                .compare_exchange(i, i + 1, Ordering::SeqCst, Ordering::SeqCst)
                .is_ok()
        {
            panic!(
                "injected failure {} of {} after {n} records",
                i + 1,
                self.thresholds.len()
            );
        }
    }

    /// Failures injected so far.
    pub fn injected(&self) -> usize {
        self.next.load(Ordering::SeqCst)
    }
}

/// A pause per record (`--sink-delay`), busy: a sleep this short would take the scheduler's
/// granularity instead. It watches the task's cancellation signal while it waits, so a
/// cancelled job stops within one record however long the pause.
pub struct SinkDelay {
    delay: Duration,
    cancellation: Cancellation,
}

impl<T: Send + 'static> OneInputOperator<T> for SinkDelay {
    type Out = T;

    fn process(&mut self, record: T, out: &mut dyn Output<T>) -> OpResult {
        // Past the clock's range (a delay only the API can give) it waits for cancellation.
        let until = Instant::now().checked_add(self.delay);
        while until.is_none_or(|u| Instant::now() < u) {
            self.cancellation.check()?;
            std::hint::spin_loop();
        }
        out.push(record)
    }
}

/// A word: a short string kept inline (`CompactString`, up to 24 bytes), so that a record costs
/// no heap allocation on the source's thread and no free on the sum's. It hashes, serializes
/// and prints as the same text in a `String` does.
pub type Word = CompactString;

/// `x` as a [`Word`], in decimal: `itoa`'s digits copied into the inline string. This is
/// `to_compact_string` without its generic formatting: 2.3 instead of 11.7 ns per number on
/// the machine of 2026-12-04 (a tenth of `word_count`'s CPU per record).
#[inline]
pub fn number_word(x: i64) -> Word {
    Word::new(itoa::Buffer::new().format(x))
}

/// The tokenizer of the notes: one `(word, 1)` per word.
pub fn tokenize(line: Word) -> Option<(Word, i64)> {
    Some((line, 1))
}

/// The final totals of a word-count job, by word (none when the job does not keep them).
#[derive(Clone)]
pub struct Totals(Option<LatestHandle<Word, i64>>);

impl Totals {
    /// The latest total per word, as plain strings (empty when the job keeps no totals).
    pub fn get(&self) -> BTreeMap<String, i64> {
        self.0
            .iter()
            .flat_map(LatestHandle::get)
            .map(|(word, total)| (word.into_string(), total))
            .collect()
    }

    /// Whether the job keeps its final totals.
    pub fn kept(&self) -> bool {
        self.0.is_some()
    }
}

/// Builds the job; returns the environment and the handle of the final totals.
pub fn build(opts: &WordCountOptions) -> (StreamEnvironment, Totals, Arc<FailureInjector>) {
    let env = StreamEnvironment::new();
    env.set_job_name("word_count")
        .set_parallelism(opts.parallelism);
    if let Some(m) = opts.max_parallelism {
        env.set_max_parallelism(m);
    }
    if let Some(i) = opts.checkpoint_interval {
        env.enable_checkpointing(i);
    }
    env.set_checkpoint_dir(&opts.checkpoint_dir);
    if let Some(r) = &opts.restart {
        env.set_restart_strategy(r.clone());
    }
    if let Some(from) = &opts.from {
        env.restore_from(from);
    }
    {
        let mut config = env.config_mut();
        config.batch_size = opts.batch_size;
        config.checkpoint.num_retained = opts.retain;
        config.checkpoint.every_records = opts.checkpoint_every_records;
        config.savepoint_dir = opts.savepoint_dir.clone();
        config.allow_non_restored_state = opts.allow_non_restored_state;
        config.allow_changed_sources = opts.allow_changed_sources;
        // What decides the records a replay reads: the checkpoint records them, and a restore
        // with other values is refused.
        config.source_config.insert(
            "records".to_string(),
            opts.records
                .map_or_else(|| "unbounded".to_string(), |r| r.to_string()),
        );
        config
            .source_config
            .insert("seed".to_string(), opts.seed.to_string());
        if opts.key_space != DIGITS {
            config
                .source_config
                .insert("key_space".to_string(), opts.key_space.to_string());
        }
        config.checkpoint.mode = opts.mode;
        config.buffers_per_channel = opts.buffers_per_channel;
        config.checkpoint.unaligned = opts.unaligned;
        config.checkpoint.aligned_checkpoint_timeout = opts.aligned_checkpoint_timeout;
        config.snapshot_compression = opts.snapshot_compression;
        config.incremental = opts.incremental;
        config.state_backend = opts.state_backend.clone();
    }
    let generator = generator(opts.seed, opts.key_space);
    let injector = Arc::new(FailureInjector::new(opts.fail_after.clone()));
    let numbers = env
        .from_generator(opts.records, move |i| generator.value(i))
        .uid("source");
    let words = if opts.fail_after.is_empty() {
        numbers.map(number_word)
    } else {
        let inj = injector.clone();
        numbers.map(move |x: i64| {
            inj.record();
            number_word(x)
        })
    }
    .uid("to-string");
    let counts = words
        .flat_map(tokenize)
        .uid("tokenizer")
        .key_by(|t: &(Word, i64)| &t.0)
        .sum()
        .uid("sum");
    let counts = match opts.sink_delay {
        Some(delay) if !delay.is_zero() => counts
            .transform::<(Word, i64)>("Sink Delay", move |ctx, next| {
                let delay = SinkDelay {
                    delay,
                    cancellation: ctx.info.cancellation.clone(),
                };
                Box::new(Chained::new(delay, next))
            })
            .uid("sink-delay"),
        _ => counts,
    };
    let counts = match &opts.sink_gate {
        Some(gate) => counts.through_gate(gate).uid("sink-gate"),
        None => counts,
    };
    if opts.print {
        counts.clone().print().uid("print");
    }
    if let Some(dir) = &opts.running_sums {
        counts.clone().write_to_files(dir).uid("running-sums");
    }
    // `sum` emits on the subtask that owns each word: the stream is already partitioned by the
    // word, so the sink chains to it without a shuffle.
    let totals = opts.totals.then(|| {
        counts
            .reinterpret_as_keyed(|t: &(Word, i64)| &t.0)
            .latest_per_key()
    });
    (env, Totals(totals), injector)
}

/// The default key space: the digits 1..=9 of the checkpointing notes' job.
pub const DIGITS: u64 = 9;

/// The largest `--key-space`: values stay within `i64`.
pub const MAX_KEY_SPACE: u64 = i64::MAX as u64;

/// The job's generator: record `i`'s value, in `1..=key_space`, depends only on `seed` and `i`.
pub fn generator(seed: u64, key_space: u64) -> RandomIntGenerator {
    RandomIntGenerator::new(seed, 1, key_space.clamp(1, MAX_KEY_SPACE) as i64)
}

/// The totals a failure-free run must produce, computed without the engine.
pub fn expected_totals(records: u64, seed: u64) -> std::collections::BTreeMap<String, i64> {
    expected_totals_in(records, seed, DIGITS)
}

/// The totals a failure-free run over values `1..=key_space` must produce, computed without the
/// engine (a count per value, in a map when the key space is too large for an array).
pub fn expected_totals_in(
    records: u64,
    seed: u64,
    key_space: u64,
) -> std::collections::BTreeMap<String, i64> {
    let g = generator(seed, key_space);
    let mut counts: BTreeMap<i64, i64> = BTreeMap::new();
    for i in 0..records {
        *counts.entry(g.value(i)).or_default() += 1;
    }
    counts
        .into_iter()
        .map(|(value, n)| (value.to_string(), n))
        .collect()
}

/// Writes `key,total` lines sorted by key to `path` atomically: into a temporary file in the
/// same directory, synced, then renamed over `path`. A reader sees the old file or the whole
/// new one, and a failure leaves `path` as it was (and no temporary file).
pub fn write_totals(path: &Path, totals: &BTreeMap<String, i64>) -> std::io::Result<()> {
    let mut text = String::new();
    for (k, v) in totals {
        text.push_str(&format!("{k},{v}\n"));
    }
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let name = path.file_name().ok_or_else(|| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("{} does not name a file", path.display()),
        )
    })?;
    let tmp = dir.join(format!(
        ".{}.{}.tmp",
        name.to_string_lossy(),
        std::process::id()
    ));
    let written = (|| {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&tmp)?;
        f.write_all(text.as_bytes())?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written?;
    // The rename itself survives a crash once the directory is synced (where that is possible).
    if let Ok(d) = std::fs::File::open(dir) {
        let _ = d.sync_all();
    }
    Ok(())
}

/// The CPU time (user + system) this process has used so far, in seconds, from
/// `/proc/self/stat` (Linux; `None` elsewhere or if it does not parse). Its resolution is a
/// clock tick (10 ms).
pub fn process_cpu_seconds() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // The command name (field 2) is in parentheses and may hold spaces: fields after it count
    // from its closing parenthesis; utime and stime are fields 14 and 15.
    let after = &stat[stat.rfind(')')? + 1..];
    let mut fields = after.split_whitespace().skip(11);
    let user: u64 = fields.next()?.parse().ok()?;
    let system: u64 = fields.next()?.parse().ok()?;
    // USER_HZ is 100 on every Linux architecture the kernel exports to user space.
    Some((user + system) as f64 / 100.0)
}
