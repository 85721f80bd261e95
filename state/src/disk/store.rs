//! [`DiskKeyedStore`]: the [`KeyedStore`] that keeps state in sorted runs on local disk, with a
//! memtable in front, a flush thread that turns full memtables into runs, and a compaction
//! thread that merges runs.
//!
//! Every key is stored under its key group and state, `key group (u16, big-endian) | state
//! (u16, big-endian) | key`, so one state's entries in one key group, and a subtask's whole
//! key-group range, are one contiguous range of keys (Flink's RocksDB layout).
//!
//! The task thread owns the active memtable and a snapshot of the current [`Version`] (the
//! memtables being flushed and the runs, newest first); the threads publish new versions under
//! a mutex and bump a generation the task thread checks with one atomic load per access. A
//! snapshot's synchronous part moves the active memtable into the version and keeps that
//! version: its cost does not depend on the amount of state.

use super::DiskOptions;
use super::bloom::key_hash;
use super::bulk::DiskBulkLoad;
use super::merge::{Layers, Memtable, merge};
use super::run::{DirGuard, Run, RunIdentity, RunWriter};
use crate::StateError;
use crate::keyed::{NativeFile, NativeFiles};
use crate::store::{BulkLoad, EntryVisitor, FrozenFiles, FrozenStore, KeyedStore, StoreStateId};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use weir_core::keygroup::{KeyGroup, KeyGroupRange};

/// The format of the disk store's native snapshots that this build writes: its run files, whose
/// newest version is 2 (each file also carries its own version).
pub const NATIVE_FORMAT: &str = "weir-disk-runs/2";

/// The native snapshot formats this build restores: `weir-disk-runs/1`, written by the builds
/// before run format 2 (its files are version 1, or version 2 from the builds between, and each
/// file's own version is checked), and [`NATIVE_FORMAT`]. A build that knows only
/// `weir-disk-runs/1` refuses a newer snapshot by this name, before it opens a file.
pub const NATIVE_FORMATS_READ: &[&str] = &["weir-disk-runs/1", NATIVE_FORMAT];

/// The memtables being flushed and the runs: what a read sees below the active memtable.
#[derive(Debug, Default)]
pub(crate) struct Version {
    /// Full memtables waiting for the flush thread, newest first.
    pub(super) immutables: Vec<Arc<Memtable>>,
    /// Runs, newest first.
    pub(super) runs: Vec<Arc<Run>>,
}

/// Counters of one store's or one backend's work, for tests, benchmarks and logs.
#[derive(Debug, Default)]
pub struct DiskStats {
    /// Stores opened (one per keyed operator's subtask and attempt).
    pub stores: AtomicU64,
    /// Directories of processes that no longer run, removed before the first store opened.
    pub dead_stores_removed: AtomicU64,
    /// Memtables written as runs.
    pub flushes: AtomicU64,
    /// Bytes of runs written by flushes.
    pub flushed_bytes: AtomicU64,
    /// Compactions finished.
    pub compactions: AtomicU64,
    /// Bytes of runs written by compactions.
    pub compacted_bytes: AtomicU64,
    /// Point lookups answered by a run (a block read from disk).
    pub block_reads: AtomicU64,
    /// Snapshots frozen.
    pub snapshots: AtomicU64,
    /// States restored by a bulk load: written as one run each, without the memtable.
    pub bulk_loads: AtomicU64,
    /// Entries those bulk loads wrote.
    pub bulk_loaded_entries: AtomicU64,
}

pub(super) struct Inner {
    pub(super) version: Arc<Version>,
    pub(super) generation: u64,
    next_run: u64,
    pub(super) error: Option<StateError>,
    /// Versions the task thread let go of last, for the flush thread to drop: dropping one may
    /// free a memtable or delete an obsolete run's file, which the task thread must not wait
    /// for (a snapshot's synchronous part, a record's state access).
    retired: Vec<Arc<Version>>,
}

pub(super) struct Shared {
    inner: Mutex<Inner>,
    changed: Condvar,
    generation: AtomicU64,
    stop: AtomicBool,
    pub(super) dir: Arc<DirGuard>,
    name: String,
    /// The key groups the store owns: the clip of the runs it writes.
    pub(super) range: KeyGroupRange,
    pub(super) options: DiskOptions,
    pub(super) stats: Arc<DiskStats>,
}

impl Shared {
    pub(super) fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Installs `version` and wakes every waiter. The version it replaces, if no one else
    /// holds it, goes to the flush thread to be dropped outside the lock.
    pub(super) fn publish(&self, inner: &mut Inner, version: Version) {
        self.publish_quietly(inner, version);
        self.changed.notify_all();
    }

    /// [`publish`](Self::publish) without waking anyone. A snapshot's synchronous part
    /// publishes so: the flush thread, woken there, was placed on the task thread's core and
    /// took it over for a scheduler slice, milliseconds of the synchronous part on a busy
    /// machine (p99 7 ms at 10M keys, 6 µs without the wake-up). Its asynchronous part wakes
    /// the flush thread instead, on its own thread; so do writes that must wait for it.
    fn publish_quietly(&self, inner: &mut Inner, version: Version) {
        let old = std::mem::replace(&mut inner.version, Arc::new(version));
        if Arc::strong_count(&old) == 1 {
            inner.retired.push(old);
        }
        inner.generation += 1;
        self.generation.store(inner.generation, Ordering::Release);
    }

    fn fail(&self, error: StateError) {
        let mut inner = self.lock();
        if inner.error.is_none() {
            inner.error = Some(error);
        }
        inner.generation += 1;
        self.generation.store(inner.generation, Ordering::Release);
        self.changed.notify_all();
    }

    pub(super) fn new_run_path(&self) -> (PathBuf, RunIdentity) {
        let mut inner = self.lock();
        let run_id = inner.next_run;
        inner.next_run += 1;
        (
            self.dir.path.join(format!("{run_id:010}.run")),
            RunIdentity {
                store: self.name.clone(),
                run_id,
            },
        )
    }

    /// Writes what `layers` hold in `[from, end)` as a new run; `None` if it is empty.
    fn write_run(
        &self,
        layers: &Layers<'_>,
        deletions: bool,
        bloom: bool,
    ) -> Result<Option<Arc<Run>>, StateError> {
        let (path, identity) = self.new_run_path();
        let bits = if bloom {
            self.options.bloom_bits_per_key
        } else {
            0
        };
        let mut writer = RunWriter::create(&path, &identity, bits)?;
        let mut n = 0u64;
        merge(layers, &[], None, deletions, &mut |k, v| {
            n += 1;
            if n.is_multiple_of(4096) && self.stop.load(Ordering::Relaxed) {
                return Err(StateError::Disk {
                    path: path.clone(),
                    reason: "the store was closed during the write".to_string(),
                });
            }
            writer.add(k, v)
        })
        .inspect_err(|_| {
            let _ = std::fs::remove_file(&path);
        })?;
        if writer.entries() == 0 {
            drop(writer);
            let _ = std::fs::remove_file(&path);
            return Ok(None);
        }
        let path = writer.finish()?;
        Ok(Some(Arc::new(Run::open(
            &path,
            &identity,
            self.range,
            Some(Arc::clone(&self.dir)),
        )?)))
    }
}

/// Turns the oldest full memtable into a run, one after another, until the store stops; drops
/// the versions the task thread retired.
fn flush_loop(shared: &Shared) {
    loop {
        let memtable = loop {
            let mut inner = shared.lock();
            let retired = std::mem::take(&mut inner.retired);
            if !retired.is_empty() {
                drop(inner);
                drop(retired);
                continue;
            }
            if shared.stop.load(Ordering::Acquire) {
                return;
            }
            if let Some(m) = inner.version.immutables.last() {
                break Arc::clone(m);
            }
            drop(
                shared
                    .changed
                    .wait(inner)
                    .unwrap_or_else(|p| p.into_inner()),
            );
        };
        let layers = Layers {
            active: None,
            memtables: vec![&memtable],
            runs: &[],
        };
        match shared.write_run(&layers, true, true) {
            Ok(run) => {
                if let Some(r) = &run {
                    shared.stats.flushes.fetch_add(1, Ordering::Relaxed);
                    shared
                        .stats
                        .flushed_bytes
                        .fetch_add(r.bytes, Ordering::Relaxed);
                }
                let mut inner = shared.lock();
                let _ = memtable.flushed.set(run.clone());
                let old = Arc::clone(&inner.version);
                let immutables = old
                    .immutables
                    .iter()
                    .filter(|m| !Arc::ptr_eq(m, &memtable))
                    .cloned()
                    .collect();
                let runs = run.into_iter().chain(old.runs.iter().cloned()).collect();
                shared.publish(&mut inner, Version { immutables, runs });
                // Unlocked first: the last hold of a version may free a memtable.
                drop(inner);
                drop(old);
            }
            Err(e) => {
                shared.fail(e);
                return;
            }
        }
    }
}

/// The runs to merge next (a prefix of the runs, newest first), by universal compaction's
/// size ratio: take the newest run, then each older run not larger than
/// `(100 + size_ratio)%` of what is taken so far; merge when that takes two or more. With
/// `max_runs` runs or more, at least the newest `len - max_runs / 2 + 1` (merged into one, they
/// leave half as many runs).
pub(crate) fn pick_compaction(sizes: &[u64], size_ratio: u32, max_runs: usize) -> Option<usize> {
    let (&first, rest) = sizes.split_first()?;
    let mut sum = u128::from(first);
    let mut taken = 1;
    for &s in rest {
        if u128::from(s) * 100 > sum * u128::from(100 + size_ratio) {
            break;
        }
        sum += u128::from(s);
        taken += 1;
    }
    let max_runs = max_runs.max(MIN_MAX_RUNS);
    if sizes.len() >= max_runs {
        taken = taken.max(sizes.len() - max_runs / 2 + 1);
    }
    (taken >= 2).then_some(taken)
}

/// The least [`DiskOptions::max_runs`](super::DiskOptions::max_runs) a store takes.
const MIN_MAX_RUNS: usize = 4;

/// Merges runs while [`pick_compaction`] finds some, until the store stops.
fn compaction_loop(shared: &Shared) {
    loop {
        let (inputs, bottom) = {
            let mut inner = shared.lock();
            loop {
                if shared.stop.load(Ordering::Acquire) {
                    return;
                }
                let runs = &inner.version.runs;
                let sizes: Vec<u64> = runs.iter().map(|r| r.bytes).collect();
                if let Some(n) =
                    pick_compaction(&sizes, shared.options.size_ratio, shared.options.max_runs)
                {
                    break (runs[..n].to_vec(), n == runs.len());
                }
                inner = shared
                    .changed
                    .wait(inner)
                    .unwrap_or_else(|p| p.into_inner());
            }
        };
        let layers = Layers {
            active: None,
            memtables: Vec::new(),
            runs: &inputs,
        };
        // The oldest runs merged: a deletion has nothing left to hide, so it goes.
        match shared.write_run(&layers, !bottom, !bottom) {
            Ok(run) => {
                shared.stats.compactions.fetch_add(1, Ordering::Relaxed);
                if let Some(r) = &run {
                    shared
                        .stats
                        .compacted_bytes
                        .fetch_add(r.bytes, Ordering::Relaxed);
                }
                let mut inner = shared.lock();
                let old = Arc::clone(&inner.version);
                // Flushes only add newer runs, so the inputs are still one stretch of runs.
                // By identity: restored runs keep the numbers of the stores that wrote them.
                let at = old
                    .runs
                    .iter()
                    .position(|r| Arc::ptr_eq(r, &inputs[0]))
                    .expect("only the compaction thread removes runs");
                debug_assert!(
                    old.runs[at..at + inputs.len()]
                        .iter()
                        .zip(&inputs)
                        .all(|(a, b)| Arc::ptr_eq(a, b))
                );
                let mut runs: Vec<Arc<Run>> = old.runs[..at].to_vec();
                runs.extend(run);
                runs.extend(old.runs[at + inputs.len()..].iter().cloned());
                for r in &inputs {
                    r.make_obsolete();
                }
                shared.publish(
                    &mut inner,
                    Version {
                        immutables: old.immutables.clone(),
                        runs,
                    },
                );
                drop(inner);
                drop(old);
            }
            Err(e) => {
                shared.fail(e);
                return;
            }
        }
    }
}

/// Keyed state in sorted runs on local disk. See the [module docs](self).
pub struct DiskKeyedStore {
    pub(super) shared: Arc<Shared>,
    pub(super) active: Memtable,
    pub(super) version: Arc<Version>,
    pub(super) seen: u64,
    key: Vec<u8>,
    block: Vec<u8>,
    workers: Vec<JoinHandle<()>>,
}

impl std::fmt::Debug for DiskKeyedStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DiskKeyedStore")
            .field("dir", &self.shared.dir.path)
            .field("memtable_entries", &self.active.len())
            .field("runs", &self.version.runs.len())
            .finish()
    }
}

/// The 4-byte prefix of `state`'s keys in `key_group`.
pub(super) fn prefix(state: StoreStateId, key_group: KeyGroup) -> u32 {
    ((key_group & 0xffff) << 16) | u32::from(state)
}

impl DiskKeyedStore {
    /// An empty store in the directory `dir` (created; removed again when the store and its
    /// last snapshot are dropped), called `name` in its files.
    pub fn open(
        dir: PathBuf,
        name: String,
        range: KeyGroupRange,
        options: DiskOptions,
        stats: Arc<DiskStats>,
    ) -> Result<DiskKeyedStore, StateError> {
        std::fs::create_dir_all(&dir).map_err(|e| StateError::Disk {
            path: dir.clone(),
            reason: format!("cannot create the state directory: {e}"),
        })?;
        let version = Arc::new(Version::default());
        let shared = Arc::new(Shared {
            inner: Mutex::new(Inner {
                version: Arc::clone(&version),
                generation: 0,
                next_run: 0,
                error: None,
                retired: Vec::new(),
            }),
            changed: Condvar::new(),
            generation: AtomicU64::new(0),
            stop: AtomicBool::new(false),
            dir: Arc::new(DirGuard {
                lock: Some(lock_dir(&dir)?),
                path: dir,
            }),
            name,
            range,
            options,
            stats,
        });
        let mut workers = Vec::new();
        for (role, work) in [
            ("flush", flush_loop as fn(&Shared)),
            ("compaction", compaction_loop),
        ] {
            let s = Arc::clone(&shared);
            let handle = std::thread::Builder::new()
                .name(format!("weir-disk-{role}"))
                .spawn(move || {
                    // A panic is reported as the store's error, so nobody waits on a dead thread.
                    let run = std::panic::AssertUnwindSafe(|| work(&s));
                    if let Err(panic) = std::panic::catch_unwind(run) {
                        let what = panic
                            .downcast_ref::<String>()
                            .cloned()
                            .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                            .unwrap_or_default();
                        s.fail(StateError::Disk {
                            path: s.dir.path.clone(),
                            reason: format!("the {role} thread panicked: {what}"),
                        });
                    }
                })
                .map_err(|e| StateError::Disk {
                    path: shared.dir.path.clone(),
                    reason: format!("cannot start the {role} thread: {e}"),
                })?;
            workers.push(handle);
        }
        Ok(DiskKeyedStore {
            shared,
            active: Memtable::default(),
            version,
            seen: 0,
            key: Vec::new(),
            block: Vec::new(),
            workers,
        })
    }

    /// The store's directory.
    pub fn dir(&self) -> &std::path::Path {
        &self.shared.dir.path
    }

    /// Number of runs now.
    pub fn runs(&mut self) -> Result<usize, StateError> {
        self.refresh()?;
        Ok(self.version.runs.len())
    }

    /// Waits until every full memtable is a run and no compaction is due (tests and
    /// benchmarks).
    pub fn settle(&mut self) -> Result<(), StateError> {
        let shared = Arc::clone(&self.shared);
        let mut inner = shared.lock();
        shared.changed.notify_all();
        loop {
            if let Some(e) = &inner.error {
                return Err(StateError::Disk {
                    path: shared.dir.path.clone(),
                    reason: e.to_string(),
                });
            }
            let sizes: Vec<u64> = inner.version.runs.iter().map(|r| r.bytes).collect();
            if inner.version.immutables.is_empty()
                && pick_compaction(&sizes, shared.options.size_ratio, shared.options.max_runs)
                    .is_none()
            {
                break;
            }
            inner = shared
                .changed
                .wait(inner)
                .unwrap_or_else(|p| p.into_inner());
        }
        drop(inner);
        self.seen = u64::MAX;
        self.refresh()
    }

    /// Moves to the version `inner` holds; the one it leaves, if no one else holds it, goes to
    /// the flush thread to be dropped there.
    pub(super) fn take_version(&mut self, inner: &mut Inner, wake: bool) {
        let old = std::mem::replace(&mut self.version, Arc::clone(&inner.version));
        if Arc::strong_count(&old) == 1 {
            inner.retired.push(old);
            if wake {
                self.shared.changed.notify_all();
            }
        }
    }

    /// Takes the newest version the threads published, or their error.
    pub(super) fn refresh(&mut self) -> Result<(), StateError> {
        if self.shared.generation.load(Ordering::Acquire) == self.seen {
            return Ok(());
        }
        let shared = Arc::clone(&self.shared);
        let mut inner = shared.lock();
        if let Some(e) = &inner.error {
            return Err(StateError::Disk {
                path: shared.dir.path.clone(),
                reason: format!("a background flush or compaction failed: {e}"),
            });
        }
        self.take_version(&mut inner, true);
        self.seen = inner.generation;
        Ok(())
    }

    fn compose(&mut self, state: StoreStateId, key_group: KeyGroup, key: &[u8]) {
        self.key.clear();
        self.key
            .extend_from_slice(&prefix(state, key_group).to_be_bytes());
        self.key.extend_from_slice(key);
    }

    /// Hands the active memtable to the flush thread; with `wait`, first waits while as many
    /// memtables as allowed are waiting already (backpressure on writes).
    fn rotate(&mut self, wait: bool) -> Result<(), StateError> {
        if self.active.is_empty() {
            return Ok(());
        }
        let shared = Arc::clone(&self.shared);
        let mut inner = shared.lock();
        // Writes wait for the flush thread, and for compaction while runs are as many as
        // allowed: compaction is the slower, and runs it cannot merge as fast as they come
        // would make every lookup and every restore slower (449 runs at 50M keys without this).
        while wait
            && inner.error.is_none()
            && (inner.version.immutables.len() >= shared.options.max_immutable_memtables
                || inner.version.runs.len() >= shared.options.max_runs.max(MIN_MAX_RUNS))
        {
            // A snapshot may have handed memtables over without waking the flush thread.
            shared.changed.notify_all();
            inner = shared
                .changed
                .wait(inner)
                .unwrap_or_else(|p| p.into_inner());
        }
        if let Some(e) = &inner.error {
            return Err(StateError::Disk {
                path: shared.dir.path.clone(),
                reason: format!("a background flush or compaction failed: {e}"),
            });
        }
        let full = Arc::new(std::mem::take(&mut self.active));
        let old = Arc::clone(&inner.version);
        let immutables = std::iter::once(full)
            .chain(old.immutables.iter().cloned())
            .collect();
        let version = Version {
            immutables,
            runs: old.runs.clone(),
        };
        // Writes wake the flush thread; a snapshot leaves it to its asynchronous part (see
        // `publish_quietly`), unless more memtables than allowed wait already.
        let wake = wait || version.immutables.len() > shared.options.max_immutable_memtables;
        if wake {
            shared.publish(&mut inner, version);
        } else {
            shared.publish_quietly(&mut inner, version);
        }
        self.take_version(&mut inner, wake);
        self.seen = inner.generation;
        Ok(())
    }

    fn write(
        &mut self,
        state: StoreStateId,
        key_group: KeyGroup,
        key: &[u8],
        value: Option<&[u8]>,
    ) -> Result<(), StateError> {
        self.refresh()?;
        self.compose(state, key_group, key);
        let hash = key_hash(&self.key);
        self.active.set(&self.key, hash, value);
        if self.active.bytes() >= self.shared.options.memtable_bytes {
            self.rotate(true)?;
        }
        Ok(())
    }
}

impl Drop for DiskKeyedStore {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        {
            let _inner = self.shared.lock();
            self.shared.changed.notify_all();
        }
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
        // The runs are this process's working files: gone with the store (a snapshot still
        // writing keeps the ones it reads until it is done).
        for r in &self.version.runs {
            r.make_obsolete();
        }
        for r in &self.shared.lock().version.runs {
            r.make_obsolete();
        }
    }
}

/// Scans `state` in `key_group` over `layers`, visiting keys without their prefix.
fn scan_layers(
    layers: &Layers<'_>,
    state: StoreStateId,
    key_group: KeyGroup,
    visit: &mut EntryVisitor<'_>,
) -> Result<(), StateError> {
    let p = prefix(state, key_group);
    let from = p.to_be_bytes();
    let end = p.checked_add(1).map(u32::to_be_bytes);
    merge(
        layers,
        &from,
        end.as_ref().map(|e| &e[..]),
        false,
        &mut |k, v| visit(&k[4..], v.expect("deletions are skipped")),
    )
}

impl KeyedStore for DiskKeyedStore {
    fn get(
        &mut self,
        state: StoreStateId,
        key_group: KeyGroup,
        key: &[u8],
        value: &mut Vec<u8>,
    ) -> Result<bool, StateError> {
        self.refresh()?;
        self.compose(state, key_group, key);
        value.clear();
        let found = |v: Option<&[u8]>, value: &mut Vec<u8>| match v {
            Some(v) => {
                value.extend_from_slice(v);
                true
            }
            None => false,
        };
        let hash = key_hash(&self.key);
        if let Some(v) = self.active.get(&self.key, hash) {
            return Ok(found(v, value));
        }
        for m in &self.version.immutables {
            if let Some(v) = m.get(&self.key, hash) {
                return Ok(found(v, value));
            }
        }
        for r in &self.version.runs {
            if !r.covers(key_group) {
                continue;
            }
            if let Some(present) = r.get(&self.key, hash, &mut self.block, value)? {
                self.shared
                    .stats
                    .block_reads
                    .fetch_add(1, Ordering::Relaxed);
                return Ok(present);
            }
        }
        Ok(false)
    }

    fn put(
        &mut self,
        state: StoreStateId,
        key_group: KeyGroup,
        key: &[u8],
        value: &[u8],
    ) -> Result<(), StateError> {
        self.write(state, key_group, key, Some(value))
    }

    fn delete(
        &mut self,
        state: StoreStateId,
        key_group: KeyGroup,
        key: &[u8],
    ) -> Result<(), StateError> {
        self.write(state, key_group, key, None)
    }

    fn scan(
        &mut self,
        state: StoreStateId,
        key_group: KeyGroup,
        visit: &mut EntryVisitor<'_>,
    ) -> Result<(), StateError> {
        self.refresh()?;
        let layers = Layers {
            active: Some(&self.active),
            memtables: self.version.immutables.iter().map(|m| &**m).collect(),
            runs: &self.version.runs,
        };
        scan_layers(&layers, state, key_group, visit)
    }

    fn freeze(&mut self) -> Result<Box<dyn FrozenStore>, StateError> {
        self.refresh()?;
        // Never waits for the flush thread: the synchronous part stays short.
        self.rotate(false)?;
        self.shared.stats.snapshots.fetch_add(1, Ordering::Relaxed);
        Ok(Box::new(FrozenDisk {
            version: Arc::clone(&self.version),
            shared: Arc::clone(&self.shared),
            woke: AtomicBool::new(false),
        }))
    }

    fn freeze_files(&mut self) -> Result<Option<Box<dyn FrozenFiles>>, StateError> {
        self.refresh()?;
        self.rotate(false)?;
        self.shared.stats.snapshots.fetch_add(1, Ordering::Relaxed);
        Ok(Some(Box::new(FrozenRuns {
            shared: Arc::clone(&self.shared),
            version: Arc::clone(&self.version),
            runs: Vec::new(),
        })))
    }

    fn bulk_load(
        &mut self,
        state: StoreStateId,
        entries: u64,
    ) -> Result<Option<Box<dyn BulkLoad + '_>>, StateError> {
        // Its filters are sized per index partition, as it is written.
        let _ = entries;
        Ok(Some(Box::new(DiskBulkLoad::start(self, state)?)))
    }

    fn restore_files(
        &mut self,
        snapshots: &[&NativeFiles],
        range: KeyGroupRange,
    ) -> Result<(), StateError> {
        self.refresh()?;
        if !self.active.is_empty() || !self.version.runs.is_empty() {
            return Err(StateError::Restore(
                "a restore must come before anything is written".to_string(),
            ));
        }
        let mut files = Vec::new();
        for snapshot in snapshots {
            if !NATIVE_FORMATS_READ.contains(&snapshot.format.as_str()) {
                return Err(StateError::Restore(format!(
                    "a native snapshot of format {:?}: this store reads {}",
                    snapshot.format,
                    NATIVE_FORMATS_READ.join(" and ")
                )));
            }
            for file in &snapshot.files {
                let clip = file.key_groups.intersection(&range);
                if !clip.is_empty() {
                    files.push((file, clip));
                }
            }
        }
        let runs = super::restore::adopt_all(&self.shared, &files)?;
        let shared = Arc::clone(&self.shared);
        let mut inner = shared.lock();
        shared.publish(
            &mut inner,
            Version {
                immutables: Vec::new(),
                runs,
            },
        );
        self.take_version(&mut inner, true);
        self.seen = inner.generation;
        Ok(())
    }
}

/// Takes the store directory's lock (`LOCK`, an exclusive advisory lock held as long as the
/// store lives): how a later process tells a dead store's directory from a live one, in any
/// process namespace.
fn lock_dir(dir: &Path) -> Result<std::fs::File, StateError> {
    let path = dir.join(super::LOCK_FILE);
    let fail = |e: String| StateError::Disk {
        path: path.clone(),
        reason: format!("cannot lock the store directory: {e}"),
    };
    let file = std::fs::File::create(&path).map_err(|e| fail(e.to_string()))?;
    file.try_lock().map_err(|e| fail(e.to_string()))?;
    Ok(file)
}

/// A native snapshot of the store: the frozen version, whose memtables become runs once the
/// flush thread has written them.
struct FrozenRuns {
    shared: Arc<Shared>,
    version: Arc<Version>,
    /// The runs listed, kept until the snapshot is dropped.
    runs: Vec<Arc<Run>>,
}

impl Drop for FrozenRuns {
    /// A snapshot dropped before its asynchronous part listed its files (an aborted
    /// checkpoint) still has the flush thread woken for its memtable.
    fn drop(&mut self) {
        let _inner = self.shared.lock();
        self.shared.changed.notify_all();
    }
}

impl FrozenFiles for FrozenRuns {
    fn files(&mut self) -> Result<NativeFiles, StateError> {
        let mut runs: Vec<Arc<Run>> = Vec::new();
        {
            let mut inner = self.shared.lock();
            // The synchronous part handed its memtable over without waking the flush thread.
            self.shared.changed.notify_all();
            for memtable in &self.version.immutables {
                loop {
                    if let Some(flushed) = memtable.flushed.get() {
                        runs.extend(flushed.iter().cloned());
                        break;
                    }
                    if let Some(e) = &inner.error {
                        return Err(StateError::Disk {
                            path: self.shared.dir.path.clone(),
                            reason: format!("the flush the snapshot waits for failed: {e}"),
                        });
                    }
                    if self.shared.stop.load(Ordering::Acquire) {
                        return Err(StateError::Disk {
                            path: self.shared.dir.path.clone(),
                            reason: "the store was closed before the snapshot's memtable was \
                                     written"
                                .to_string(),
                        });
                    }
                    inner = self
                        .shared
                        .changed
                        .wait(inner)
                        .unwrap_or_else(|p| p.into_inner());
                }
            }
        }
        runs.extend(self.version.runs.iter().cloned());
        let files = runs
            .iter()
            .map(|r| NativeFile {
                name: r.name(),
                key_groups: r.clip,
                size: r.bytes,
                path: r.path().to_path_buf(),
            })
            .collect();
        self.runs = runs;
        Ok(NativeFiles {
            format: NATIVE_FORMAT.to_string(),
            files,
        })
    }
}

/// A store's memtables and runs at a snapshot: they stay readable (and their files on disk)
/// until the snapshot is written.
struct FrozenDisk {
    version: Arc<Version>,
    /// To wake the flush thread, which the synchronous part left asleep.
    shared: Arc<Shared>,
    woke: AtomicBool,
}

impl FrozenDisk {
    /// Wakes the flush thread for the memtable the synchronous part handed over, once: from
    /// the asynchronous part's first scan, or when the snapshot goes unscanned.
    fn wake_flush(&self) {
        if !self.woke.swap(true, Ordering::AcqRel) {
            let _inner = self.shared.lock();
            self.shared.changed.notify_all();
        }
    }
}

impl Drop for FrozenDisk {
    fn drop(&mut self) {
        self.wake_flush();
    }
}

impl FrozenStore for FrozenDisk {
    fn scan(
        &self,
        state: StoreStateId,
        key_group: KeyGroup,
        visit: &mut EntryVisitor<'_>,
    ) -> Result<(), StateError> {
        self.wake_flush();
        let layers = Layers {
            active: None,
            memtables: self.version.immutables.iter().map(|m| &**m).collect(),
            runs: &self.version.runs,
        };
        scan_layers(&layers, state, key_group, visit)
    }
}
