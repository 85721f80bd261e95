//! The word-count job the binary and the tests run, with all three custom seams on: keyed state
//! in [`BTreeMapStateBackend`], checkpoints through a registered `counting://` storage, and
//! records through a [`CountingTransport`].

use crate::store::BTreeMapStateBackend;
use crate::transport::{CountingTransport, TransportCounters};
use std::sync::Arc;
use std::time::Duration;
use weir_checkpoint::CheckpointError;
use weir_runtime::testing::Injector;
use weir_runtime::{DataStream, RestartStrategy, StorageConfig, StreamEnvironment};

/// The words record `i` is drawn from ([`word`]).
pub const WORDS: [&str; 16] = [
    "alder", "ash", "beech", "birch", "cedar", "elm", "fir", "hazel", "larch", "maple", "oak",
    "pine", "rowan", "spruce", "willow", "yew",
];

/// The word of record `i` under `seed`: depends only on both (splitmix64), so any parallelism,
/// replay or restore reads the same records. Skewed: earlier words come up more often.
pub fn word(seed: u64, i: u64) -> &'static str {
    let mut z = seed ^ i.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    let n = WORDS.len() as u64;
    let index = (z % n).min((z >> 32) % n);
    WORDS[index as usize]
}

/// How the job runs.
#[derive(Clone, Debug)]
pub struct JobOptions {
    /// The job's name (and so its id and fingerprint).
    pub name: String,
    /// Records over all source subtasks.
    pub records: u64,
    /// The seed of [`word`].
    pub seed: u64,
    /// Parallelism of every operator.
    pub parallelism: u32,
    /// Key groups; equal across the runs of a rescale.
    pub max_parallelism: u32,
    /// Checkpoint interval.
    pub checkpoint_interval: Duration,
    /// Checkpoint root: a URL of a registered scheme, e.g. `counting:///abs/dir`.
    pub checkpoint_root: String,
    /// Restore from this checkpoint (or the latest complete one under this root).
    pub from: Option<String>,
    /// Restarts allowed after failures (0: the first failure fails the job).
    pub restart_attempts: u32,
    /// Completed checkpoints kept.
    pub retain: u32,
}

impl Default for JobOptions {
    fn default() -> Self {
        JobOptions {
            name: "custom-seams".to_string(),
            records: 200_000,
            seed: 42,
            parallelism: 2,
            max_parallelism: 128,
            checkpoint_interval: Duration::from_millis(20),
            checkpoint_root: String::new(),
            from: None,
            restart_attempts: 0,
            retain: 2,
        }
    }
}

/// The custom seams a configured job runs on, to read their counters.
#[derive(Debug)]
pub struct Seams {
    /// The keyed-state backend (its counters: [`BTreeMapStateBackend::counters`]).
    pub state: Arc<BTreeMapStateBackend>,
    /// The transport layer's counters.
    pub transport: Arc<TransportCounters>,
}

/// Configures `env` from `opts` with all three custom seams: a fresh [`BTreeMapStateBackend`],
/// a [`CountingTransport`] layer, and checkpoints in `opts.checkpoint_root`, which must be a URL
/// of a scheme registered in this process (e.g. by
/// [`register_counting_scheme`](crate::register_counting_scheme)); anything else is a
/// [`CheckpointError::Config`].
pub fn configure(env: &StreamEnvironment, opts: &JobOptions) -> Result<Seams, CheckpointError> {
    let storage = StorageConfig::from_location(&opts.checkpoint_root)?;
    if !matches!(storage, StorageConfig::Registered(_)) {
        return Err(CheckpointError::Config(format!(
            "{:?} is not a URL of a registered storage scheme (e.g. counting:///abs/dir)",
            opts.checkpoint_root
        )));
    }
    let seams = Seams {
        state: BTreeMapStateBackend::new(),
        transport: Arc::default(),
    };
    env.set_job_name(&opts.name)
        .set_parallelism(opts.parallelism)
        .set_max_parallelism(opts.max_parallelism)
        .enable_checkpointing(opts.checkpoint_interval)
        .set_checkpoint_storage(storage)
        .set_state_backend(seams.state.clone())
        .set_transport(CountingTransport::layer(seams.transport.clone()))
        .set_restart_strategy(match opts.restart_attempts {
            0 => RestartStrategy::NoRestart,
            attempts => RestartStrategy::FixedDelay {
                attempts,
                delay: Duration::ZERO,
            },
        })
        // What decides the records a replay reads: a restore with other values is refused.
        .set_source_config("records", opts.records)
        .set_source_config("seed", opts.seed);
    env.checkpoint_config().num_retained = opts.retain;
    if let Some(from) = &opts.from {
        env.restore_from(from);
    }
    Ok(seams)
}

/// The job's operators: `opts.records` generated words → `injector` (failures, pacing) →
/// `(word, 1)` → key by word → running sum (keyed state in the store). Returns the running
/// counts `(word, n)`, for the caller's exactly-once sink.
pub fn running_counts<I: Injector>(
    env: &StreamEnvironment,
    opts: &JobOptions,
    injector: &Arc<I>,
) -> DataStream<(String, i64)> {
    let seed = opts.seed;
    env.from_generator(Some(opts.records), move |i| word(seed, i).to_string())
        .uid("source")
        .inject_failures(injector)
        .uid("inject")
        .map(|w: String| (w, 1i64))
        .uid("pairs")
        .key_by(|t: &(String, i64)| &t.0)
        .sum()
        .uid("sum")
}
