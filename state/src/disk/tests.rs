//! Tests of the disk store's parts: run files (round trip, damage, foreign files), compaction
//! choice, and the store against a model under flushes and compactions.

use super::run::{DirGuard, Run, RunCursor, RunIdentity, RunWriter};
use super::store::pick_compaction;
use super::*;
use crate::store::KeyedStore;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;

fn identity(run_id: u64) -> RunIdentity {
    RunIdentity {
        store: "test-store".to_string(),
        run_id,
    }
}

/// Every key group a test key can fall in (its first two bytes, "ke").
fn clip() -> weir_core::keygroup::KeyGroupRange {
    weir_core::keygroup::KeyGroupRange::new(0, u32::from(u16::MAX))
}

fn key(i: u32) -> Vec<u8> {
    format!("key-{i:08}").into_bytes()
}

/// A run of keys 0, 2, 4, ... below `n`, every third one deleted.
fn write_run(dir: &std::path::Path, n: u32, bloom: u32) -> std::path::PathBuf {
    let path = dir.join("a.run");
    let mut w = RunWriter::create(&path, &identity(7), bloom).unwrap();
    for i in (0..n).step_by(2) {
        let value = (i % 3 != 0).then(|| i.to_le_bytes().to_vec());
        w.add(&key(i), value.as_deref()).unwrap();
    }
    w.finish().unwrap()
}

fn guard(dir: &std::path::Path) -> Arc<DirGuard> {
    // The guard of a temporary directory: leaking it keeps `remove_dir_all` to tempdir's drop.
    let g = Arc::new(DirGuard {
        path: dir.to_path_buf(),
        lock: None,
    });
    std::mem::forget(Arc::clone(&g));
    g
}

/// Checks a run written by [`write_run`] with `n`: every lookup, and cursors across its
/// partitions.
fn assert_reads(run: &Run, n: u32) {
    assert_eq!(run.entries, u64::from(n / 2));
    let (mut block, mut value) = (Vec::new(), Vec::new());
    // Every key of a small run; in a large one, a stride that meets odd and even keys, and
    // the last ones.
    let step = if n > 50_000 { 37 } else { 1 };
    for i in (0..=n).step_by(step).chain(n - 3..=n) {
        let k = key(i);
        let got = run
            .get(&k, bloom::key_hash(&k), &mut block, &mut value)
            .unwrap();
        let want = (i % 2 == 0 && i < n).then_some(i % 3 != 0);
        assert_eq!(got, want, "key {i}");
        if got == Some(true) {
            assert_eq!(value, i.to_le_bytes());
        }
    }
    // A cursor from an absent key to an end bound sees exactly the keys between, and one from
    // the start sees them all.
    let (from, to) = (n / 2 - 1, n * 3 / 4 + 1);
    let end = key(to);
    let mut c = RunCursor::seek(run, &key(from), Some(&end)).unwrap();
    let mut seen = Vec::new();
    while c.valid() {
        seen.push(c.key().to_vec());
        c.advance().unwrap();
    }
    let want: Vec<Vec<u8>> = (from + 1..to).step_by(2).map(key).collect();
    assert_eq!(seen, want);
    let mut c = RunCursor::seek(run, b"", None).unwrap();
    let mut count = 0;
    while c.valid() {
        count += 1;
        c.advance().unwrap();
    }
    assert_eq!(count, n / 2);
}

#[test]
fn a_run_answers_lookups_and_cursors() {
    let dir = tempfile::tempdir().unwrap();
    for (n, bloom) in [(20_000, 0), (20_000, 10), (300_000, 0), (300_000, 10)] {
        let path = write_run(dir.path(), n, bloom);
        let run = Run::open(&path, &identity(7), clip(), Some(guard(dir.path()))).unwrap();
        // 150,000 entries of ~18 bytes: ~700 blocks, so partitions of 64 blocks.
        if n == 300_000 {
            assert!(run.partitions() > 5, "{} partitions", run.partitions());
        }
        assert_reads(&run, n);
    }
}

/// A run of format version 1 (one index and filter for the whole run), as the build before
/// partitioned indexes wrote it: keys 0, 2, ... below 6,000, every third deleted, filter on.
#[test]
fn a_version_1_run_is_still_read() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("a.run");
    std::fs::write(&path, include_bytes!("testdata/run-v1.run")).unwrap();
    let run = Run::open(&path, &identity(7), clip(), Some(guard(dir.path()))).unwrap();
    assert_eq!(run.partitions(), 1);
    assert_reads(&run, 6_000);
}

#[test]
fn a_damaged_index_partition_fails_the_read_that_needs_it_and_empties_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_run(dir.path(), 300_000, 10);
    let mut bytes = std::fs::read(&path).unwrap();
    // The last partition ends where the top-level index starts (the footer's first number).
    let footer = bytes.len() - 56;
    let top = u64::from_le_bytes(bytes[footer..footer + 8].try_into().unwrap()) as usize;
    bytes[top - 20] ^= 0x10;
    std::fs::write(&path, &bytes).unwrap();
    // The open reads only the top-level index: it succeeds, and so do reads of other
    // partitions.
    let run = Run::open(&path, &identity(7), clip(), Some(guard(dir.path()))).unwrap();
    let (mut block, mut value) = (Vec::new(), Vec::new());
    let k = key(2);
    assert_eq!(
        run.get(&k, bloom::key_hash(&k), &mut block, &mut value)
            .unwrap(),
        Some(true)
    );
    let k = key(299_998);
    let e = run
        .get(&k, bloom::key_hash(&k), &mut block, &mut value)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("a.run") && e.contains("damaged") && e.contains("index partition"),
        "{e}"
    );
    assert_eq!(
        std::fs::metadata(&path).unwrap().len(),
        0,
        "a damaged file is emptied, so no link of it is trusted again"
    );
}

#[test]
fn a_damaged_or_foreign_run_is_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_run(dir.path(), 20_000, 10);
    let good = std::fs::read(&path).unwrap();
    let len = good.len();
    // The wrong run of the right store, and a run of another store.
    for other in [
        identity(8),
        RunIdentity {
            store: "other".to_string(),
            run_id: 7,
        },
    ] {
        let e = Run::open(&path, &other, clip(), Some(guard(dir.path()))).unwrap_err();
        assert!(e.to_string().contains("where run"), "{e}");
    }
    // A flipped byte in the index or footer fails at open; in a block, at the read.
    for (at, at_open) in [
        (len - 60, true),
        (len - 10, true),
        (len - 3, true),
        (200, false),
    ] {
        let mut bad = good.clone();
        bad[at] ^= 0x40;
        std::fs::write(&path, &bad).unwrap();
        let opened = Run::open(&path, &identity(7), clip(), Some(guard(dir.path())));
        let e = match (opened, at_open) {
            (Err(e), true) => e,
            (Ok(run), false) => {
                let (mut block, mut value) = (Vec::new(), Vec::new());
                let mut first_err = None;
                for i in (0..2_000).step_by(2) {
                    let k = key(i);
                    if let Err(e) = run.get(&k, bloom::key_hash(&k), &mut block, &mut value) {
                        first_err = Some(e);
                        break;
                    }
                }
                first_err.expect("a damaged block is read")
            }
            (r, _) => panic!("damage at {at}: open gave {:?}", r.map(|_| ())),
        };
        let text = e.to_string();
        assert!(text.contains("a.run") && text.contains("damaged"), "{text}");
    }
    // Truncated: no end magic.
    std::fs::write(&path, &good[..len / 2]).unwrap();
    let e = Run::open(&path, &identity(7), clip(), Some(guard(dir.path()))).unwrap_err();
    assert!(e.to_string().contains("truncated"), "{e}");
}

#[test]
fn compaction_takes_newer_runs_of_comparable_size() {
    assert_eq!(pick_compaction(&[], 100, 32), None);
    assert_eq!(pick_compaction(&[10], 100, 32), None);
    assert_eq!(pick_compaction(&[10, 10], 100, 32), Some(2));
    assert_eq!(pick_compaction(&[10, 40], 100, 32), None);
    assert_eq!(pick_compaction(&[10, 10, 40], 100, 32), Some(3));
    assert_eq!(pick_compaction(&[10, 10, 60], 100, 32), Some(2));
    assert_eq!(pick_compaction(&[10, 20, 60], 100, 32), Some(3));
    assert_eq!(pick_compaction(&[u64::MAX, u64::MAX], 100, 32), Some(2));
}

/// A small xorshift, so the model test needs no crate.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

type Model = BTreeMap<(u16, u32, Vec<u8>), Vec<u8>>;

fn check_against(store: &mut DiskKeyedStore, model: &Model, frozen: Option<&dyn FrozenStore>) {
    for state in 0..2u16 {
        for kg in 0..4u32 {
            let mut seen = Vec::new();
            let mut visit = |k: &[u8], v: &[u8]| {
                seen.push((k.to_vec(), v.to_vec()));
                Ok(())
            };
            match frozen {
                Some(f) => f.scan(state, kg, &mut visit).unwrap(),
                None => store.scan(state, kg, &mut visit).unwrap(),
            }
            let want: Vec<(Vec<u8>, Vec<u8>)> = model
                .range((state, kg, Vec::new())..)
                .take_while(|((s, g, _), _)| *s == state && *g == kg)
                .map(|((_, _, k), v)| (k.clone(), v.clone()))
                .collect();
            assert_eq!(seen, want, "state {state} key group {kg}");
        }
    }
}

use crate::store::FrozenStore;

/// A store named `name` over key groups 0..=127, in `dir/s`, counting into `stats`.
fn open_whole(
    dir: &std::path::Path,
    name: &str,
    options: DiskOptions,
    stats: &Arc<DiskStats>,
) -> DiskKeyedStore {
    DiskKeyedStore::open(
        dir.join("s"),
        name.to_string(),
        weir_core::keygroup::KeyGroupRange::new(0, 127),
        options,
        Arc::clone(stats),
    )
    .unwrap()
}

#[test]
fn the_store_matches_a_model_through_flushes_compactions_and_snapshots() {
    let dir = tempfile::tempdir().unwrap();
    let stats = Arc::new(DiskStats::default());
    let options = DiskOptions::default().with_memtable_bytes(8 << 10);
    let mut store = open_whole(dir.path(), "model", options, &stats);
    let mut model = Model::new();
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut frozen: Option<(Box<dyn FrozenStore>, Model)> = None;
    let mut value = Vec::new();
    for step in 0..60_000u32 {
        let state = (rng.next() % 2) as u16;
        let kg = (rng.next() % 4) as u32;
        let k = (rng.next() % 3_000).to_string().into_bytes();
        match rng.next() % 10 {
            0..=5 => {
                let v = step.to_le_bytes().to_vec();
                store.put(state, kg, &k, &v).unwrap();
                model.insert((state, kg, k), v);
            }
            6 => {
                store.delete(state, kg, &k).unwrap();
                model.remove(&(state, kg, k));
            }
            _ => {
                let found = store.get(state, kg, &k, &mut value).unwrap();
                let want = model.get(&(state, kg, k.clone()));
                assert_eq!(found.then_some(&value), want, "step {step}");
            }
        }
        if step % 15_000 == 14_999 {
            // The snapshot taken earlier still shows its moment.
            if let Some((f, at)) = &frozen {
                check_against(&mut store, at, Some(&**f));
            }
            frozen = Some((store.freeze().unwrap(), model.clone()));
            check_against(&mut store, &model, None);
        }
    }
    store.settle().unwrap();
    check_against(&mut store, &model, None);
    let (f, at) = frozen.unwrap();
    check_against(&mut store, &at, Some(&*f));
    assert!(stats.flushes.load(Ordering::Relaxed) > 10);
    assert!(stats.compactions.load(Ordering::Relaxed) > 3);
    let runs = store.runs().unwrap();
    assert!(runs < 12, "{runs} runs after settling");
    // The store's files go with it.
    let path = store.dir().to_path_buf();
    drop(store);
    drop(f);
    assert!(!path.exists());
}

/// Writes faster than compaction merges wait for it: the runs never exceed the bound by more
/// than the memtables being flushed, and compaction then merges the newest whatever their sizes.
#[test]
fn writes_wait_while_the_store_has_as_many_runs_as_allowed() {
    let dir = tempfile::tempdir().unwrap();
    let stats = Arc::new(DiskStats::default());
    let mut options = DiskOptions::default().with_memtable_bytes(4 << 10);
    options.max_runs = 4;
    let bound = options.max_runs + options.max_immutable_memtables;
    let mut store = open_whole(dir.path(), "bounded", options, &stats);
    let mut most = 0;
    let value = [7u8; 64];
    for i in 0..40_000u32 {
        store.put(0, i % 128, &i.to_be_bytes(), &value).unwrap();
        if i % 64 == 0 {
            most = most.max(store.runs().unwrap());
        }
    }
    assert!(most <= bound, "{most} runs with at most {bound} allowed");
    assert!(
        stats.flushes.load(Ordering::Relaxed) > 100,
        "the writes must have made many runs to merge"
    );
    let mut got = Vec::new();
    for i in (0..40_000u32).step_by(97) {
        assert!(
            store.get(0, i % 128, &i.to_be_bytes(), &mut got).unwrap(),
            "key {i}"
        );
        assert_eq!(got, value);
    }
}

/// A snapshot's synchronous part hands its memtable over without waking the flush thread; its
/// asynchronous part (or its drop) wakes it, so the memtable becomes a run without any write
/// that follows (a quiet state's memtables once stayed in memory for good).
#[test]
fn a_snapshot_memtable_is_flushed_once_the_snapshot_is_used_or_dropped() {
    for native in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let stats = Arc::new(DiskStats::default());
        let mut store = open_whole(dir.path(), "quiet", DiskOptions::default(), &stats);
        store.put(0, 3, b"key", b"value").unwrap();
        // The flush thread waits by now (else it would find the memtable without a wake-up).
        std::thread::sleep(std::time::Duration::from_millis(50));
        if native {
            let mut frozen = store.freeze_files().unwrap().expect("native snapshots");
            let files = frozen.files().unwrap();
            assert_eq!(files.files.len(), 1, "native = {native}");
        } else {
            let frozen = store.freeze().unwrap();
            let mut seen = 0;
            frozen
                .scan(0, 3, &mut |_, _| {
                    seen += 1;
                    Ok(())
                })
                .unwrap();
            assert_eq!(seen, 1);
        }
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while stats.flushes.load(Ordering::Relaxed) == 0 {
            assert!(
                std::time::Instant::now() < deadline,
                "the snapshot's memtable was never flushed (native = {native})"
            );
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert_eq!(store.runs().unwrap(), 1, "native = {native}");
    }
}

/// Runs restored from another store keep its run numbers, and the new store numbers its own
/// runs from 0 too: flushes and compactions that mix them must keep every write (a compaction
/// that found its inputs by number replaced the wrong runs).
#[test]
fn restored_runs_and_new_runs_with_the_same_numbers_compact_correctly() {
    let dir = tempfile::tempdir().unwrap();
    let range = weir_core::keygroup::KeyGroupRange::new(0, 3);
    let options = DiskOptions::default().with_memtable_bytes(8 << 10);
    let open = |name: &str| {
        DiskKeyedStore::open(
            dir.path().join(name),
            name.to_string(),
            range,
            options.clone(),
            Arc::new(DiskStats::default()),
        )
        .unwrap()
    };
    let mut model = Model::new();
    let mut rng = Rng(7);
    let mut write = |store: &mut DiskKeyedStore, model: &mut Model, n: u32| {
        for step in 0..n {
            let (state, kg) = ((rng.next() % 2) as u16, (rng.next() % 4) as u32);
            let k = (rng.next() % 2_000).to_string().into_bytes();
            if rng.next().is_multiple_of(8) {
                store.delete(state, kg, &k).unwrap();
                model.remove(&(state, kg, k));
            } else {
                let v = step.to_le_bytes().to_vec();
                store.put(state, kg, &k, &v).unwrap();
                model.insert((state, kg, k), v);
            }
        }
    };
    let mut first = open("first");
    write(&mut first, &mut model, 20_000);
    let mut frozen = first.freeze_files().unwrap().unwrap();
    let files = frozen.files().unwrap();
    assert!(files.files.len() > 1, "{files:?}");
    let mut second = open("second");
    second.restore_files(&[&files], range).unwrap();
    drop(frozen);
    drop(first);
    check_against(&mut second, &model, None);
    write(&mut second, &mut model, 40_000);
    second.settle().unwrap();
    check_against(&mut second, &model, None);
}

/// A snapshot names its format `weir-disk-runs/2`; one named `weir-disk-runs/1` (the builds
/// before, whose runs each carry their own version) is restored all the same, and an unknown
/// name is refused, named, before any file is read.
#[test]
fn native_snapshots_are_told_apart_by_their_format_name() {
    let dir = tempfile::tempdir().unwrap();
    let range = weir_core::keygroup::KeyGroupRange::new(0, 3);
    let open = |name: &str| {
        DiskKeyedStore::open(
            dir.path().join(name),
            name.to_string(),
            range,
            DiskOptions::default().with_memtable_bytes(8 << 10),
            Arc::new(DiskStats::default()),
        )
        .unwrap()
    };
    let mut first = open("first");
    for i in 0..5_000u32 {
        first.put(0, i % 4, &key(i), &i.to_le_bytes()).unwrap();
    }
    let mut frozen = first.freeze_files().unwrap().unwrap();
    let mut files = frozen.files().unwrap();
    assert_eq!(files.format, "weir-disk-runs/2");
    files.format = "weir-disk-runs/1".to_string();
    let mut older = open("older");
    older.restore_files(&[&files], range).unwrap();
    let mut value = Vec::new();
    for i in (0..5_000u32).step_by(97) {
        assert!(older.get(0, i % 4, &key(i), &mut value).unwrap(), "key {i}");
        assert_eq!(value, i.to_le_bytes());
    }
    files.format = "weir-disk-runs/3".to_string();
    let mut newer = open("newer");
    let refused = newer
        .restore_files(&[&files], range)
        .unwrap_err()
        .to_string();
    assert!(
        refused.contains("\"weir-disk-runs/3\"") && refused.contains("weir-disk-runs/2"),
        "{refused}"
    );
}

/// The directories a killed process left are removed; a store whose lock is held (whatever
/// its name says), a download of a running process (this one) and anything else are kept.
#[test]
fn directories_of_dead_processes_are_removed() {
    let dir = tempfile::tempdir().unwrap();
    let me = std::process::id();
    let dead = "0123abcd-s0-a0-p999999999-0-00ff";
    let mine = format!("restore-p{me}-0");
    let other = "not-a-store";
    for name in [dead, mine.as_str(), "restore-p999999998-3", other] {
        std::fs::create_dir_all(dir.path().join(name).join("x")).unwrap();
    }
    // A dead store's lock file, not held: removed.
    std::fs::write(dir.path().join(dead).join(LOCK_FILE), b"").unwrap();
    // A live store named as if its process were dead (another pid namespace): its lock is
    // held, so it stays.
    let live_name = "4567abcd-s0-a0-p999999997-0-00ff";
    let live = DiskKeyedStore::open(
        dir.path().join(live_name),
        live_name.to_string(),
        weir_core::keygroup::KeyGroupRange::new(0, 1),
        DiskOptions::default(),
        Arc::new(DiskStats::default()),
    )
    .unwrap();
    let removed = remove_dead_stores(dir.path());
    let left: std::collections::BTreeSet<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    if cfg!(target_os = "linux") {
        assert_eq!(removed, 2);
        let kept = [mine, other.to_string(), live_name.to_string()];
        assert_eq!(left, kept.into_iter().collect());
    } else {
        assert_eq!(removed, 0);
    }
    drop(live);
}

/// A restore of many runs opens them on several threads: every value comes back, in the runs'
/// order (newest wins), and one damaged run among them fails the restore, named. The runs come
/// from four stores of a quarter of the key groups each (one store's compaction leaves too few).
#[test]
fn a_restore_of_many_runs_opens_them_in_parallel_exactly_and_refuses_a_damaged_one() {
    let dir = tempfile::tempdir().unwrap();
    let stats = Arc::new(DiskStats::default());
    let halves: Vec<_> = (0..4)
        .map(|q| weir_core::keygroup::KeyGroupRange::new(q * 32, q * 32 + 31))
        .collect();
    let mut snapshots = Vec::new();
    let mut frozen_all = Vec::new();
    for (h, half) in halves.iter().enumerate() {
        let mut store = DiskKeyedStore::open(
            dir.path().join(format!("half-{h}")),
            format!("half-{h}"),
            *half,
            DiskOptions::default().with_memtable_bytes(4 << 10),
            Arc::clone(&stats),
        )
        .unwrap();
        // Every key written twice, the second value in a later run than the first.
        for round in 0..2u32 {
            for i in (0..6_000u32).filter(|i| half.contains(i % 128)) {
                store
                    .put(0, i % 128, &key(i), &(i + round * 1_000_000).to_le_bytes())
                    .unwrap();
            }
        }
        let mut frozen = store.freeze_files().unwrap().unwrap();
        snapshots.push(frozen.files().unwrap());
        frozen_all.push((frozen, store));
    }
    let runs: usize = snapshots.iter().map(|f| f.files.len()).sum();
    assert!(
        runs >= 16,
        "{runs} runs: too few to open on several threads"
    );
    let range = weir_core::keygroup::KeyGroupRange::new(0, 127);
    let refs: Vec<&crate::keyed::NativeFiles> = snapshots.iter().collect();
    let mut second = open_whole(
        &dir.path().join("2"),
        "second",
        DiskOptions::default(),
        &stats,
    );
    second.restore_files(&refs, range).unwrap();
    let mut value = Vec::new();
    for i in 0..6_000u32 {
        assert!(
            second.get(0, i % 128, &key(i), &mut value).unwrap(),
            "key {i}"
        );
        assert_eq!(value, (i + 1_000_000).to_le_bytes(), "key {i}");
    }
    // One run of the second quarter, damaged in its index: the restore names it.
    let victim = snapshots[1].files[snapshots[1].files.len() / 2].clone();
    let mut bytes = std::fs::read(&victim.path).unwrap();
    let at = bytes.len() - 70;
    bytes[at] ^= 0xff;
    let copy = dir.path().join("damaged");
    std::fs::create_dir_all(&copy).unwrap();
    let mut damaged = snapshots.clone();
    for f in damaged.iter_mut().flat_map(|s| s.files.iter_mut()) {
        let to = copy.join(&f.name);
        if f.name == victim.name {
            std::fs::write(&to, &bytes).unwrap();
        } else {
            std::fs::copy(&f.path, &to).unwrap();
        }
        f.path = to;
    }
    let refs: Vec<&crate::keyed::NativeFiles> = damaged.iter().collect();
    let mut third = open_whole(
        &dir.path().join("3"),
        "third",
        DiskOptions::default(),
        &stats,
    );
    let e = third.restore_files(&refs, range).unwrap_err();
    assert!(e.to_string().contains(&victim.name), "{e}");
}
