//! Native snapshots of the disk store: a checkpoint lists the store's runs, a later one shares
//! the runs nothing changed, and a restore from the files (at the same key groups, split, or
//! merged) holds exactly the state of the moment, checked against a canonical snapshot taken
//! at the same moment; damaged, foreign and mismatched files are refused by name.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use weir_core::keygroup::{KeyGroupRange, assign_to_key_group};
use weir_state::disk::{DiskKeyedStore, DiskStats};
use weir_state::store::StoreKeyedStateBackend;
use weir_state::{
    DiskOptions, KeyedStateBackend, NativeFiles, NativeRestorePart, StateError, ValueState,
    ValueStateDescriptor,
};

const MAX_P: u32 = 128;

struct Fixture {
    dir: tempfile::TempDir,
    n: u32,
    /// The statistics of the last store opened.
    stats: Arc<DiskStats>,
}

impl Fixture {
    fn new() -> Fixture {
        Fixture {
            dir: tempfile::tempdir().unwrap(),
            n: 0,
            stats: Arc::new(DiskStats::default()),
        }
    }

    fn backend(&mut self, range: KeyGroupRange) -> StoreKeyedStateBackend<String> {
        self.n += 1;
        self.stats = Arc::new(DiskStats::default());
        let store = DiskKeyedStore::open(
            self.dir.path().join(format!("store-{}", self.n)),
            format!("test-{}", self.n),
            range,
            DiskOptions::default().with_memtable_bytes(32 << 10),
            Arc::clone(&self.stats),
        )
        .unwrap();
        StoreKeyedStateBackend::new(Box::new(store), MAX_P, range).with_native_snapshots(true)
    }

    /// Waits until the last store's background flushes and compactions have been still for a
    /// while (the store itself is behind the backend's seam, which has no `settle`): a
    /// compaction that ends between two snapshots rewrites runs the first one listed.
    fn quiet(&self) {
        let counts = || {
            (
                self.stats.flushes.load(std::sync::atomic::Ordering::SeqCst),
                self.stats
                    .compactions
                    .load(std::sync::atomic::Ordering::SeqCst),
            )
        };
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        let (mut last, mut still) = (counts(), 0);
        while still < 5 && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(100));
            let now = counts();
            still = if now == last { still + 1 } else { 0 };
            last = now;
        }
    }

    /// Copies a snapshot's files to "checkpoint storage" (a directory of this fixture), as the
    /// runtime uploads them, and returns the copies.
    fn upload(&self, files: &NativeFiles) -> NativeFiles {
        let remote = self.dir.path().join("remote");
        std::fs::create_dir_all(&remote).unwrap();
        let mut out = files.clone();
        for f in &mut out.files {
            let to = remote.join(&f.name);
            if !to.exists() {
                std::fs::copy(&f.path, &to).unwrap();
            }
            f.path = to;
        }
        out
    }
}

fn all() -> KeyGroupRange {
    KeyGroupRange::new(0, MAX_P - 1)
}

fn kg(key: &str) -> u32 {
    assign_to_key_group(key, MAX_P)
}

/// A native snapshot: its files (uploaded) and manifest.
fn native(
    fx: &Fixture,
    backend: &mut StoreKeyedStateBackend<String>,
    id: u64,
) -> (NativeFiles, Vec<u8>) {
    let mut snapshot = backend.snapshot_incremental(id).unwrap();
    let files = snapshot.native_files().unwrap().expect("a native snapshot");
    let files = fx.upload(&files);
    let mut manifest = Vec::new();
    snapshot.write_to(&mut manifest).unwrap();
    (files, manifest)
}

/// The canonical snapshot's bytes: equal state, equal bytes.
fn canonical(backend: &mut StoreKeyedStateBackend<String>) -> Vec<u8> {
    let mut out = Vec::new();
    backend.snapshot().unwrap().write_to(&mut out).unwrap();
    out
}

fn write(
    backend: &mut StoreKeyedStateBackend<String>,
    count: ValueState<u64>,
    keys: impl Iterator<Item = u64>,
    model: &mut BTreeMap<String, u64>,
) {
    for k in keys {
        let key = format!("key-{k}");
        let g = kg(&key);
        let v = backend.value(count, &key, g).copied().unwrap_or(0) + 1;
        backend.update(count, &key, g, v);
        model.insert(key, v);
    }
}

/// The entries of `model` whose keys fall in `range`.
fn within(model: &BTreeMap<String, u64>, range: KeyGroupRange) -> BTreeMap<String, u64> {
    model
        .iter()
        .filter(|(k, _)| range.contains(kg(k)))
        .map(|(k, v)| (k.clone(), *v))
        .collect()
}

fn contents(
    backend: &mut StoreKeyedStateBackend<String>,
    count: ValueState<u64>,
) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    backend.for_each_entry(count, &mut |k, v| {
        out.insert(k.clone(), *v);
    });
    out
}

#[test]
fn a_native_snapshot_restores_the_state_of_its_moment_and_shares_unchanged_runs() {
    let mut fx = Fixture::new();
    let mut source = fx.backend(all());
    let count = source
        .value_state(&ValueStateDescriptor::<u64>::new("count"))
        .unwrap();
    let mut model = BTreeMap::new();
    write(&mut source, count, 0..20_000, &mut model);
    fx.quiet();
    let (first, _) = native(&fx, &mut source, 1);
    // 1% of the keys change: the next snapshot lists the earlier runs again, and its new files
    // are a small part of the whole.
    write(&mut source, count, (0..20_000).step_by(100), &mut model);
    let (second, manifest) = native(&fx, &mut source, 2);
    let at_second = canonical(&mut source);
    let expected = model.clone();
    // Later writes do not reach the snapshot.
    write(&mut source, count, 0..5_000, &mut model);

    let names = |f: &NativeFiles| f.files.iter().map(|f| f.name.clone()).collect::<Vec<_>>();
    let shared: u64 = second
        .files
        .iter()
        .filter(|f| names(&first).contains(&f.name))
        .map(|f| f.size)
        .sum();
    let total: u64 = second.files.iter().map(|f| f.size).sum();
    let new = total - shared;
    eprintln!(
        "1% churn: {new} new bytes of {total} ({:.2}%)",
        new as f64 * 100.0 / total as f64
    );
    assert!(
        new * 20 <= total,
        "new bytes {new} of {total}: {:?} then {:?}",
        names(&first),
        names(&second)
    );

    let mut restored = fx.backend(all());
    restored
        .restore_native(&[NativeRestorePart {
            manifest: &manifest,
            files: &second,
        }])
        .unwrap();
    // Before registration the reserved state is carried into canonical snapshots unchanged.
    assert_eq!(canonical(&mut restored), at_second);
    let count = restored
        .value_state(&ValueStateDescriptor::<u64>::new("count"))
        .unwrap();
    assert_eq!(contents(&mut restored, count), expected);
    // Registered with another type: refused.
    let mut again = fx.backend(all());
    again
        .restore_native(&[NativeRestorePart {
            manifest: &manifest,
            files: &second,
        }])
        .unwrap();
    let err = again
        .value_state(&ValueStateDescriptor::<String>::new("count"))
        .unwrap_err();
    assert!(matches!(err, StateError::Incompatible { .. }), "{err}");
}

#[test]
fn native_snapshots_rescale_by_key_group() {
    let mut fx = Fixture::new();
    let (low, high) = (KeyGroupRange::new(0, 63), KeyGroupRange::new(64, 127));
    // One subtask's snapshot split into two.
    let mut source = fx.backend(all());
    let count = source
        .value_state(&ValueStateDescriptor::<u64>::new("count"))
        .unwrap();
    let mut model = BTreeMap::new();
    write(&mut source, count, 0..10_000, &mut model);
    let (files, manifest) = native(&fx, &mut source, 1);
    let part = NativeRestorePart {
        manifest: &manifest,
        files: &files,
    };
    let mut halves = Vec::new();
    for range in [low, high] {
        let mut b = fx.backend(range);
        b.restore_native(&[part]).unwrap();
        let count = b
            .value_state(&ValueStateDescriptor::<u64>::new("count"))
            .unwrap();
        let want = within(&model, range);
        assert_eq!(contents(&mut b, count), want, "{range}");
        // Each half writes on, flushes and compacts runs that hold the other half's keys.
        let own = (0..10_000).filter(|k| k % 3 == 0 && range.contains(kg(&format!("key-{k}"))));
        write(&mut b, count, own, &mut BTreeMap::new());
        b.snapshot_incremental(0).unwrap();
        halves.push((b, count));
    }
    let mut model2 = BTreeMap::new();
    for (k, v) in &model {
        model2.insert(
            k.clone(),
            *v + u64::from(k[4..].parse::<u64>().unwrap() % 3 == 0),
        );
    }
    // And merged back into one.
    let snapshots: Vec<(NativeFiles, Vec<u8>)> = halves
        .iter_mut()
        .zip(1..)
        .map(|((b, _), id)| native(&fx, b, id))
        .collect();
    let parts: Vec<NativeRestorePart<'_>> = snapshots
        .iter()
        .map(|(files, manifest)| NativeRestorePart { manifest, files })
        .collect();
    let mut merged = fx.backend(all());
    merged.restore_native(&parts).unwrap();
    let count = merged
        .value_state(&ValueStateDescriptor::<u64>::new("count"))
        .unwrap();
    assert_eq!(contents(&mut merged, count), model2);
}

fn flip_byte(path: &Path, at: u64) -> PathBuf {
    let mut bytes = std::fs::read(path).unwrap();
    let at = (at as usize).min(bytes.len() - 1);
    bytes[at] ^= 0x20;
    let out = path.with_extension("damaged");
    std::fs::write(&out, bytes).unwrap();
    out
}

#[test]
fn damaged_foreign_and_mismatched_native_snapshots_are_refused_by_name() {
    let mut fx = Fixture::new();
    let mut source = fx.backend(all());
    let count = source
        .value_state(&ValueStateDescriptor::<u64>::new("count"))
        .unwrap();
    write(&mut source, count, 0..5_000, &mut BTreeMap::new());
    let (files, manifest) = native(&fx, &mut source, 1);
    let restore = |fx: &mut Fixture, manifest: &[u8], files: &NativeFiles| {
        let mut b = fx.backend(all());
        b.restore_native(&[NativeRestorePart { manifest, files }])
            .map(|()| b)
    };

    // A damaged manifest.
    let mut bad = manifest.clone();
    bad[20] ^= 1;
    let e = restore(&mut fx, &bad, &files).unwrap_err().to_string();
    assert!(e.contains("manifest is damaged"), "{e}");
    // A run whose footer is damaged: named at restore.
    let mut damaged = files.clone();
    let f = &mut damaged.files[0];
    f.path = flip_byte(&f.path, f.size - 20);
    let e = restore(&mut fx, &manifest, &damaged)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("damaged run file") && e.contains(&files.files[0].name),
        "{e}"
    );
    // A run swapped for another of the same snapshot: its identity says so.
    if files.files.len() > 1 {
        let mut swapped = files.clone();
        swapped.files[0].path = files.files[1].path.clone();
        let e = restore(&mut fx, &manifest, &swapped)
            .unwrap_err()
            .to_string();
        assert!(e.contains("where run"), "{e}");
    }
    // Files that are not the manifest's.
    let mut fewer = files.clone();
    fewer.files.pop();
    let e = restore(&mut fx, &manifest, &fewer).unwrap_err().to_string();
    assert!(e.contains("not those its manifest lists"), "{e}");
    // A damaged block is found when it is read: the access fails the task by name.
    let mut blocks = files.clone();
    let f = &mut blocks.files[0];
    f.path = flip_byte(&f.path, 100);
    let mut b = restore(&mut fx, &manifest, &blocks).unwrap();
    let count = b
        .value_state(&ValueStateDescriptor::<u64>::new("count"))
        .unwrap();
    let read = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let _ = contents(&mut b, count);
    }));
    let message = read
        .expect_err("a damaged block is read")
        .downcast_ref::<String>()
        .cloned()
        .unwrap_or_default();
    assert!(message.contains("fails its digest"), "{message}");
    // The heap backend cannot take a native snapshot, and says so.
    let mut heap = weir_state::HeapKeyedStateBackend::<String>::new(MAX_P, all());
    let e = heap
        .restore_native(&[NativeRestorePart {
            manifest: &manifest,
            files: &files,
        }])
        .unwrap_err()
        .to_string();
    assert!(e.contains("cannot restore native snapshots"), "{e}");
}

/// A canonical snapshot of `backend` (a savepoint's keyed file) and its handle.
fn savepoint(
    backend: &mut impl KeyedStateBackend<String>,
) -> (weir_core::handle::KeyedStateHandle, Vec<u8>) {
    snapshot_of(backend, None)
}

#[test]
fn a_canonical_savepoint_is_bulk_loaded_one_run_per_state_at_any_key_groups() {
    // The savepoint comes from the heap backend: a canonical file, as any backend writes it.
    let mut heap = weir_state::HeapKeyedStateBackend::<String>::new(MAX_P, all());
    let count = heap
        .value_state(&ValueStateDescriptor::<u64>::new("count"))
        .unwrap();
    let other = heap
        .value_state(&ValueStateDescriptor::<u64>::new("other"))
        .unwrap();
    let mut model = BTreeMap::new();
    for k in 0..30_000u64 {
        let key = format!("key-{k}");
        heap.update(count, &key, kg(&key), k * 3);
        model.insert(key.clone(), k * 3);
        if k.is_multiple_of(3) {
            heap.update(other, &key, kg(&key), k);
        }
    }
    let (handle, bytes) = savepoint(&mut heap);
    let mut fx = Fixture::new();
    // Into the whole range, then into a half (a rescale): each keeps only its key groups.
    for range in [all(), KeyGroupRange::new(0, MAX_P / 2 - 1)] {
        let mut disk = fx.backend(range);
        let part = weir_state::format::whole_stream_part(&handle, &bytes).unwrap();
        disk.restore(&[part]).unwrap();
        let c = disk
            .value_state(&ValueStateDescriptor::<u64>::new("count"))
            .unwrap();
        let o = disk
            .value_state(&ValueStateDescriptor::<u64>::new("other"))
            .unwrap();
        let want = within(&model, range);
        let loads = fx
            .stats
            .bulk_loads
            .load(std::sync::atomic::Ordering::SeqCst);
        let loaded = fx
            .stats
            .bulk_loaded_entries
            .load(std::sync::atomic::Ordering::SeqCst);
        let others = want
            .keys()
            .filter(|k| kg_key_index(k).is_multiple_of(3))
            .count();
        assert_eq!(loads, 2, "one bulk load per state into {range}");
        assert_eq!(loaded as usize, want.len() + others, "{range}");
        // Straight into runs: no memtable was flushed on the way.
        assert_eq!(
            fx.stats.flushes.load(std::sync::atomic::Ordering::SeqCst),
            0
        );
        assert_eq!(contents(&mut disk, c), want, "{range}");
        for (k, v) in want.iter().step_by(97) {
            assert_eq!(disk.value(c, k, kg(k)).copied(), Some(*v), "{k}");
            let expect_other = (kg_key_index(k).is_multiple_of(3)).then(|| kg_key_index(k));
            assert_eq!(disk.value(o, k, kg(k)).copied(), expect_other, "{k}");
        }
        // Writes after the load win over it, and the state snapshots as the heap's would.
        let first = want.keys().next().unwrap().clone();
        disk.update(c, &first, kg(&first), 7);
        assert_eq!(disk.value(c, &first, kg(&first)).copied(), Some(7));
        disk.update(c, &first, kg(&first), want[&first]);
        if range == all() {
            assert_eq!(canonical(&mut disk), bytes, "equal state, equal bytes");
        }
    }
}

/// The number in a test key `key-<n>`.
fn kg_key_index(key: &str) -> u64 {
    key.trim_start_matches("key-").parse().unwrap()
}

#[test]
fn a_bulk_load_refuses_keys_out_of_order_and_leaves_nothing_when_dropped() {
    let dir = tempfile::tempdir().unwrap();
    let stats = Arc::new(DiskStats::default());
    let mut store = DiskKeyedStore::open(
        dir.path().join("store"),
        "bulk".into(),
        KeyGroupRange::new(0, 9),
        DiskOptions::default(),
        Arc::clone(&stats),
    )
    .unwrap();
    use weir_state::store::KeyedStore;
    let run_files = |dir: &Path| -> usize {
        std::fs::read_dir(dir.join("store"))
            .unwrap()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().ends_with(".run"))
            .count()
    };
    {
        let mut bulk = store
            .bulk_load(0, 3)
            .unwrap()
            .expect("the disk store bulk-loads");
        bulk.add(2, b"b", b"1").unwrap();
        let e = bulk.add(2, b"a", b"2").unwrap_err().to_string();
        assert!(e.contains("out of order"), "{e}");
        let e = bulk.add(1, b"z", b"2").unwrap_err().to_string();
        assert!(e.contains("out of order"), "{e}");
        let e = bulk.add(10, b"z", b"2").unwrap_err().to_string();
        assert!(e.contains("key group 10"), "{e}");
    }
    assert_eq!(
        run_files(dir.path()),
        0,
        "an unfinished load leaves no file"
    );
    let mut bulk = store.bulk_load(0, 2).unwrap().unwrap();
    bulk.add(1, b"a", b"x").unwrap();
    bulk.add(2, b"a", b"y").unwrap();
    bulk.finish().unwrap();
    assert_eq!(run_files(dir.path()), 1);
    let mut v = Vec::new();
    assert!(store.get(0, 2, b"a", &mut v).unwrap());
    assert_eq!(v, b"y");
    assert!(
        !store.get(1, 2, b"a", &mut v).unwrap(),
        "another state's key"
    );
}

/// A keyed snapshot's bytes and handle (`incremental`: a link of the heap's chain).
fn snapshot_of(
    backend: &mut impl KeyedStateBackend<String>,
    incremental: Option<u64>,
) -> (weir_core::handle::KeyedStateHandle, Vec<u8>) {
    let mut bytes = Vec::new();
    let snapshot = match incremental {
        Some(id) => backend.snapshot_incremental(id).unwrap(),
        None => backend.snapshot().unwrap(),
    };
    let layout = snapshot.write_to(&mut bytes).unwrap();
    let handle = layout.into_handle(weir_core::handle::StreamStateHandle::Inline(Vec::new()));
    (handle, bytes)
}

#[test]
fn a_restored_chain_is_loaded_in_windows_of_key_groups_exactly() {
    // A heap chain: a full link, then a delta that replaces, adds and removes entries.
    let mut heap =
        weir_state::HeapKeyedStateBackend::<String>::new(MAX_P, all()).with_incremental(4);
    let count = heap
        .value_state(&ValueStateDescriptor::<u64>::new("count"))
        .unwrap();
    let mut model = BTreeMap::new();
    for k in 0..20_000u64 {
        let key = format!("key-{k}");
        heap.update(count, &key, kg(&key), k * 2);
        model.insert(key, k * 2);
    }
    let base = snapshot_of(&mut heap, Some(1));
    heap.notify_checkpoint_complete(1);
    for k in (0..20_000u64).step_by(5) {
        let key = format!("key-{k}");
        heap.clear(count, &key, kg(&key));
        model.remove(&key);
    }
    for k in (1..25_000u64).step_by(7) {
        let key = format!("key-{k}");
        heap.update(count, &key, kg(&key), k * 11);
        model.insert(key, k * 11);
    }
    let delta = snapshot_of(&mut heap, Some(2));
    let parts = || {
        [&base, &delta]
            .map(|(handle, bytes)| weir_state::format::whole_stream_part(handle, bytes).unwrap())
    };
    let mut fx = Fixture::new();
    // 2 KiB windows: about 8 key groups each (the state's ~400 kB over 128 key groups), so
    // ~16 windows; 64 MiB: one.
    for window in [2 << 10, 64 << 20] {
        for range in [all(), KeyGroupRange::new(MAX_P / 4, MAX_P - 1)] {
            let mut disk = fx.backend(range).with_restore_window(window);
            disk.restore(&parts()).unwrap();
            let c = disk
                .value_state(&ValueStateDescriptor::<u64>::new("count"))
                .unwrap();
            let want = within(&model, range);
            assert_eq!(contents(&mut disk, c), want, "window {window}, {range}");
            let loads = fx
                .stats
                .bulk_loads
                .load(std::sync::atomic::Ordering::SeqCst);
            assert_eq!(loads, 1, "one bulk load, whatever the windows");
            for (k, v) in want.iter().step_by(101) {
                assert_eq!(disk.value(c, k, kg(k)).copied(), Some(*v), "{k}");
            }
            let removed = "key-5".to_string();
            if range.contains(kg(&removed)) {
                assert_eq!(disk.value(c, &removed, kg(&removed)).copied(), None);
            }
        }
    }
    // And the loaded state snapshots as the heap's does: equal state, equal bytes.
    let mut disk = fx.backend(all()).with_restore_window(2 << 10);
    disk.restore(&parts()).unwrap();
    disk.value_state(&ValueStateDescriptor::<u64>::new("count"))
        .unwrap();
    assert_eq!(canonical(&mut disk), snapshot_of(&mut heap, None).1);
}
