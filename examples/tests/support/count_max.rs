//! The job the restore tests of the disk backend share: generator → map (fails once on request)
//! → key_by → reduce (count, max) → latest per key, checkpointing every 50 ms into files, and
//! its totals computed without the engine.
// Each test file uses its own subset of these.
#![allow(dead_code)]

use super::complete_checkpoints;
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use weir_runtime::{DiskStateBackend, LatestHandle, StreamEnvironment};

pub const RECORDS: u64 = 100_000;
/// Keys: enough state that run files are files, not inlined into `_metadata`.
pub const KEY_SPACE: u64 = 20_000;
/// A failing job fails once, at a record past this one, once three checkpoints completed (one
/// to restore, older ones to fall back to).
pub const FAIL_AFTER: u64 = 40_000;

pub fn key(i: u64) -> u64 {
    weir_runtime::source::splitmix64(i) % KEY_SPACE
}

/// The totals, against those computed without the engine.
pub fn assert_exact(got: &BTreeMap<u64, (i64, i64)>) {
    let mut expected: BTreeMap<u64, (i64, i64)> = BTreeMap::new();
    for i in 0..RECORDS {
        let e = expected.entry(key(i)).or_insert((0, i64::MIN));
        e.0 += 1;
        e.1 = e.1.max(i as i64);
    }
    assert_eq!(
        got, &expected,
        "totals against the independently computed ones"
    );
}

pub type Hook = Box<dyn Fn() + Send + Sync>;

/// The job `name` at `parallelism`, on `backend`, with incremental checkpoints every 50 ms into
/// `dir/checkpoints` (every file a file, none inline, so that restores fetch them; three
/// retained, to fall back to). When `fail` is given, it fails once (after calling it).
pub fn job(
    name: &str,
    dir: &Path,
    backend: impl weir_runtime::state::StateBackend,
    parallelism: u32,
    fail: Option<Hook>,
) -> (StreamEnvironment, LatestHandle<u64, (i64, i64)>) {
    let env = StreamEnvironment::new();
    env.set_job_name(name)
        .set_parallelism(parallelism)
        .enable_checkpointing(Duration::from_millis(50));
    let storage = weir_runtime::checkpoint::OpendalCheckpointStorage::fs(dir.join("checkpoints"))
        .unwrap()
        .with_inline_threshold(0);
    env.set_checkpoint_storage(weir_runtime::config::StorageConfig::Custom(Arc::new(
        storage,
    )));
    env.set_state_backend(backend);
    env.config_mut().incremental = true;
    env.config_mut().checkpoint.num_retained = 3;
    // Little in flight, so that barriers pass quickly and checkpoints complete while the
    // source still reads.
    env.config_mut().buffers_per_channel = 2;
    env.config_mut().batch_size = 64;
    let fired = Arc::new(AtomicBool::new(fail.is_none()));
    let hook: Arc<Hook> = Arc::new(fail.unwrap_or_else(|| Box::new(|| {})));
    let checkpoints = dir.join("checkpoints");
    let handle = env
        .from_generator(Some(RECORDS), |i| i)
        .uid("source")
        .map(move |i: u64| {
            // Paced, so that checkpoints complete between records.
            if i.is_multiple_of(100) {
                std::thread::sleep(Duration::from_millis(1));
            }
            if i >= FAIL_AFTER
                && i.is_multiple_of(1_000)
                && !fired.load(Ordering::SeqCst)
                && complete_checkpoints(&checkpoints).len() >= 3
                && !fired.swap(true, Ordering::SeqCst)
            {
                hook();
                panic!("injected failure at record {i}");
            }
            (key(i), 1i64, i as i64)
        })
        .uid("fail-once")
        .key_by(|t: &(u64, i64, i64)| &t.0)
        .reduce(|a, b| (a.0, a.1 + b.1, a.2.max(b.2)))
        .uid("reduce")
        .map(|(k, count, max)| (k, (count, max)))
        .uid("pairs")
        .latest_per_key();
    (env, handle)
}

/// The disk backend under `dir/state`, with small memtables (many runs).
pub fn disk(dir: &Path) -> DiskStateBackend {
    DiskStateBackend::new(dir.join("state"))
        .with_options(weir_runtime::state::DiskOptions::default().with_memtable_bytes(256 << 10))
}
