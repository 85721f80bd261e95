//! A scenario: the job's settings and the fault rates, all drawn from one seed.

use std::time::Duration;
use weir_core::ids::JobId;
use weir_core::splitmix::{SplitMix, splitmix64};

/// How barriers are handled in a scenario.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Barriers {
    /// Aligned exactly-once barriers.
    Aligned,
    /// Unaligned checkpoints: barriers overtake in-flight data, which is persisted.
    Unaligned,
    /// Aligned first, unaligned once the alignment takes longer than a timeout.
    Alternating,
    /// Barriers tracked, never aligned: records may count twice after a recovery.
    AtLeastOnce,
}

/// Everything a seed decides before the job starts.
#[derive(Clone, Debug)]
pub struct Scenario {
    /// The seed.
    pub seed: u64,
    /// The barrier handling.
    pub barriers: Barriers,
    /// Records the source emits, over its two subtasks.
    pub records: u64,
    /// Distinct keys.
    pub keys: u64,
    /// Records per batch.
    pub batch_size: usize,
    /// Checkpoint interval (virtual time).
    pub interval: Duration,
    /// Checkpoint timeout.
    pub timeout: Duration,
    /// Concurrent checkpoints allowed.
    pub max_concurrent: u32,
    /// Checkpoint failures tolerated before the job fails over (`None`: any number).
    pub tolerable_failures: Option<u32>,
    /// Faults are injected until this virtual time; after it the job must finish.
    pub faults_until: Duration,
    /// The most task failures injected.
    pub max_failures: u32,
    /// Per mille: a task failure at a checkpoint step (before or after the synchronous
    /// snapshot, during upload, alignment or restore).
    pub step_failure: u64,
    /// Per 100,000: a task failure after a batch of records.
    pub record_failure: u64,
    /// Per mille: a lost acknowledgement or notification.
    pub message_loss: u64,
    /// Per mille: a late acknowledgement or notification.
    pub message_delay: u64,
    /// Storage write and read fault rates.
    pub storage_faults: (f64, f64),
    /// The longest storage operation (each waits a seeded time up to it).
    pub storage_delay: Duration,
    /// When the process running the job is killed (its runtime dropped, nothing cleaned up);
    /// the job is then resumed from its job directory's latest complete checkpoint.
    pub kill_at: Option<Duration>,
    /// When a savepoint is taken beside the checkpoints.
    pub savepoint_at: Option<Duration>,
    /// When the job is stopped with a savepoint; it is then resumed from that savepoint.
    pub stop_at: Option<Duration>,
    /// Incremental keyed snapshots (shared files, chains of deltas).
    pub incremental: bool,
    /// The keyed state backend: `heap` or `memory-store`.
    pub state_backend: &'static str,
    /// Completed checkpoints retained.
    pub retained: u32,
    /// Per mille: a task pauses before a step (the lever on the interleaving).
    pub pause: u64,
    /// The longest pause.
    pub max_pause: Duration,
    /// The task managers the subtasks run on (their slots), if any: none runs them all in the
    /// job's process.
    pub task_managers: Vec<u32>,
    /// Per mille: a task manager given a deployment's subtasks is lost while it runs them.
    pub task_manager_loss: u64,
    /// The most task managers lost.
    pub max_task_manager_losses: u32,
    /// How long a deployment waits for slots.
    pub slot_timeout: Duration,
    /// The heartbeat timeout: how long until the job master notices a lost task manager.
    pub heartbeat_timeout: Duration,
    /// The longest wait for a lost task manager's replacement.
    pub max_replacement: Duration,
}

impl Scenario {
    /// The scenario of `seed`.
    pub fn from_seed(seed: u64) -> Scenario {
        let mut r = SplitMix(splitmix64(seed ^ 0x5EED_5CE7_A210));
        let barriers = match r.below(4) {
            0 => Barriers::Aligned,
            1 => Barriers::Unaligned,
            2 => Barriers::Alternating,
            _ => Barriers::AtLeastOnce,
        };
        let calm = r.below(10) == 0;
        Scenario {
            seed,
            barriers,
            records: 1_000 + r.below(3_000),
            keys: 2 + r.below(12),
            batch_size: 8 + r.below(40) as usize,
            interval: ms(3 + r.below(15)),
            timeout: ms(40 + r.below(400)),
            max_concurrent: 1 + r.below(3) as u32,
            tolerable_failures: match r.below(3) {
                0 => None,
                n => Some(n as u32 - 1),
            },
            faults_until: ms(if calm { 0 } else { 20 + r.below(300) }),
            max_failures: r.below(5) as u32,
            step_failure: r.below(60),
            record_failure: r.below(400),
            message_loss: r.below(80),
            message_delay: r.below(150),
            storage_faults: (r.below(8) as f64 / 100.0, r.below(5) as f64 / 100.0),
            storage_delay: ms(r.below(6)),
            pause: 100 + r.below(600),
            max_pause: ms(1 + r.below(4)),
            kill_at: (r.below(5) == 0).then(|| ms(5 + r.below(120))),
            savepoint_at: (r.below(4) == 0).then(|| ms(5 + r.below(120))),
            stop_at: (r.below(5) == 0).then(|| ms(5 + r.below(150))),
            incremental: r.below(2) == 0,
            state_backend: if r.below(3) == 0 {
                "memory-store"
            } else {
                "heap"
            },
            retained: 1 + r.below(3) as u32,
            // Drawn last, so that the fields above mean what they meant before.
            task_managers: match r.below(10) {
                0 | 1 => vec![2],
                2 | 3 => vec![1, 1],
                4 => vec![1, 1, 1],
                _ => Vec::new(),
            },
            task_manager_loss: 100 + r.below(400),
            max_task_manager_losses: 1 + r.below(3) as u32,
            slot_timeout: ms(5 + r.below(40)),
            heartbeat_timeout: ms(1 + r.below(60)),
            max_replacement: ms(1 + r.below(80)),
        }
    }

    /// The job id of the scenario's first process (fixed, so that a replay writes the same
    /// files).
    pub fn job_id(&self) -> JobId {
        self.job_id_of(0)
    }

    /// The job id of the scenario's `process`-th process (a resumed job is a new job).
    pub fn job_id_of(&self, process: u32) -> JobId {
        JobId((u128::from(self.seed) << 64) | (0x5111 + u128::from(process)))
    }

    /// One line naming the scenario, for the trace.
    pub fn describe(&self) -> String {
        format!(
            "seed {} · {:?} · {} records over {} keys, batches of {} · checkpoint every {:?} \
             (timeout {:?}, {} concurrent, tolerating {}) · faults until {:?}: ≤{} task failures, steps {}‰, \
             records {}/100k, messages lost {}‰ late {}‰, storage writes {:.0}% reads {:.0}% \
             (≤{:?}) · pauses {}‰ ≤{:?} · kill at {:?}, savepoint at {:?}, stop at {:?} · \
             {} backend{}, {} retained{}",
            self.seed,
            self.barriers,
            self.records,
            self.keys,
            self.batch_size,
            self.interval,
            self.timeout,
            self.max_concurrent,
            self.tolerable_failures
                .map_or("any failures".to_string(), |n| format!("{n} failures")),
            self.faults_until,
            self.max_failures,
            self.step_failure,
            self.record_failure,
            self.message_loss,
            self.message_delay,
            self.storage_faults.0 * 100.0,
            self.storage_faults.1 * 100.0,
            self.storage_delay,
            self.pause,
            self.max_pause,
            self.kill_at,
            self.savepoint_at,
            self.stop_at,
            self.state_backend,
            if self.incremental {
                ", incremental"
            } else {
                ""
            },
            self.retained,
            if self.task_managers.is_empty() {
                String::new()
            } else {
                format!(
                    " · task managers with {:?} slots (slot timeout {:?}): ≤{} lost, {}‰ per \
                     deployment, noticed within {:?}, replaced within {:?}",
                    self.task_managers,
                    self.slot_timeout,
                    self.max_task_manager_losses,
                    self.task_manager_loss,
                    self.heartbeat_timeout,
                    self.max_replacement
                )
            },
        )
    }
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}
