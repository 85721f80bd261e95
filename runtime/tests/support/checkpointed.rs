//! The keyed job the `weir checkpoints` tests checkpoint and then inspect, and where its
//! complete checkpoints are on disk. Included with `#[path]` by those tests.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};
use weir_runtime::StreamEnvironment;

/// The ids of the complete checkpoints (with `_metadata`) under a checkpoint root on disk
/// (`<root>/<job-id>/chk-<n>/_metadata`), sorted.
pub fn complete_ids(root: &Path) -> Vec<u64> {
    let mut ids = Vec::new();
    for job in std::fs::read_dir(root).into_iter().flatten().flatten() {
        for chk in std::fs::read_dir(job.path())
            .into_iter()
            .flatten()
            .flatten()
        {
            let name = chk.file_name().to_string_lossy().to_string();
            if let Some(id) = name.strip_prefix("chk-").and_then(|n| n.parse().ok())
                && chk.path().join("_metadata").is_file()
            {
                ids.push(id);
            }
        }
    }
    ids.sort_unstable();
    ids
}

/// generator → map → key_by → sum → latest_per_key over `keys` keys and `records` records. After
/// `warm_up` records the map slows the job down until `wanted` checkpoints taken after it (so
/// with every key in state) are complete under `on_disk`, or `give_up` passed.
pub struct KeyedJob {
    pub keys: u64,
    pub records: u64,
    pub warm_up: u64,
    pub wanted: u64,
    pub give_up: Duration,
}

impl KeyedJob {
    /// Runs the job in `env` (its name, parallelism, checkpointing and storage already set)
    /// and checks its totals.
    pub async fn run(&self, env: StreamEnvironment, on_disk: PathBuf) {
        let (keys, warm_up, wanted, give_up) = (self.keys, self.warm_up, self.wanted, self.give_up);
        let seen = AtomicU64::new(0);
        let done = AtomicBool::new(false);
        // The highest complete checkpoint id when the warm-up ended (u64::MAX: not yet).
        let base = AtomicU64::new(u64::MAX);
        let started = OnceLock::<Instant>::new();
        let totals = env
            .from_generator(Some(self.records), |i| i)
            .uid("source")
            .map(move |i: u64| {
                let n = seen.fetch_add(1, Ordering::Relaxed);
                if n >= warm_up && !done.load(Ordering::Relaxed) && n.is_multiple_of(16) {
                    let ids = complete_ids(&on_disk);
                    let last = ids.last().copied().unwrap_or(0);
                    let _ =
                        base.compare_exchange(u64::MAX, last, Ordering::SeqCst, Ordering::SeqCst);
                    let since = *started.get_or_init(Instant::now);
                    let b = base.load(Ordering::SeqCst);
                    let fresh = ids.iter().filter(|&&id| id > b).count() as u64;
                    // Bounded, so that a stalled checkpointer fails the assertions, not the run.
                    if fresh >= wanted || since.elapsed() > give_up {
                        done.store(true, Ordering::Relaxed);
                    } else {
                        std::thread::sleep(Duration::from_millis(2));
                    }
                }
                (i % keys, 1i64)
            })
            .uid("to-pairs")
            .key_by(|t: &(u64, i64)| &t.0)
            .sum()
            .uid("sum")
            .latest_per_key();
        tokio::time::timeout(Duration::from_secs(120), env.execute())
            .await
            .expect("the job hung")
            .expect("the job failed");
        let totals = totals.get();
        assert_eq!(totals.len() as u64, keys);
        assert_eq!(totals.values().sum::<i64>() as u64, self.records);
    }
}
