//! Model tests of the disk store's parts (from an adversarial review): format-2 runs against a
//! BTreeMap model at partition boundaries, a flipped byte anywhere never answering wrong, bulk
//! loads racing compactions, the memtable arena, and the reads a bulk-loaded store costs.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use super::bloom::key_hash;
use super::merge::{Layers, Memtable, merge};
use super::run::{DirGuard, Run, RunCursor, RunIdentity, RunWriter};
use super::*;
use crate::store::KeyedStore;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use weir_core::keygroup::KeyGroupRange;

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

fn ident(run_id: u64) -> RunIdentity {
    RunIdentity {
        store: "review".to_string(),
        run_id,
    }
}

fn guard(dir: &std::path::Path) -> Arc<DirGuard> {
    let g = Arc::new(DirGuard {
        path: dir.to_path_buf(),
        lock: None,
    });
    std::mem::forget(Arc::clone(&g));
    g
}

type M = BTreeMap<Vec<u8>, Option<Vec<u8>>>;

fn write(path: &std::path::Path, model: &M, bloom: u32) {
    let mut w = RunWriter::create(path, &ident(1), bloom).unwrap();
    for (k, v) in model {
        w.add(k, v.as_deref()).unwrap();
    }
    w.finish().unwrap();
}

fn kg_of(key: &[u8]) -> u32 {
    match key {
        [a, b, ..] => u32::from(u16::from_be_bytes([*a, *b])),
        _ => u32::from(u16::MAX),
    }
}

/// Keys: 2-byte key group (0..groups) | random suffix of 0..max_suffix bytes.
fn model(
    rng: &mut Rng,
    n: usize,
    groups: u16,
    max_suffix: u64,
    value_len: impl Fn(&mut Rng) -> usize,
) -> M {
    model_d(rng, n, groups, max_suffix, value_len, true)
}

fn model_d(
    rng: &mut Rng,
    n: usize,
    groups: u16,
    max_suffix: u64,
    value_len: impl Fn(&mut Rng) -> usize,
    deletions: bool,
) -> M {
    let mut m = M::new();
    while m.len() < n {
        let g = rng.below(u64::from(groups)) as u16;
        let mut k = g.to_be_bytes().to_vec();
        for _ in 0..rng.below(max_suffix + 1) {
            k.push(rng.below(4) as u8 + b'a');
        }
        let v = if deletions && rng.below(5) == 0 {
            None
        } else {
            let len = value_len(rng);
            Some((0..len).map(|i| (i as u8) ^ (k.len() as u8)).collect())
        };
        m.insert(k, v);
    }
    m
}

/// Probe keys: every key, its neighbours (one byte more / less), before first, after last.
fn probes(m: &M) -> Vec<Vec<u8>> {
    let mut p = vec![Vec::new(), vec![0], vec![0xff, 0xff, 0xff], vec![0xff; 8]];
    for k in m.keys() {
        p.push(k.clone());
        let mut more = k.clone();
        more.push(0);
        p.push(more);
        if !k.is_empty() {
            p.push(k[..k.len() - 1].to_vec());
            let mut less = k.clone();
            let last = less.len() - 1;
            if less[last] > 0 {
                less[last] -= 1;
                less.push(0xff);
                p.push(less);
            }
        }
    }
    p
}

fn check_run(run: &Run, m: &M, clip: KeyGroupRange, rng: &mut Rng, what: &str) {
    let (mut block, mut value) = (Vec::new(), Vec::new());
    let probes = probes(m);
    for k in &probes {
        let got = run.get(k, key_hash(k), &mut block, &mut value).unwrap();
        let want = m.get(k).map(|v| v.is_some());
        assert_eq!(got, want, "{what}: get {k:?}");
        if got == Some(true) {
            assert_eq!(
                Some(&value),
                m.get(k).unwrap().as_ref(),
                "{what}: value of {k:?}"
            );
        }
    }
    // Cursors from a sample of probes (all if small), with and without an end bound.
    let stride = (probes.len() / 80).max(1);
    for (i, from) in probes.iter().enumerate() {
        if i % stride != 0 && i + 8 < probes.len() {
            continue;
        }
        let end_key = probes[rng.below(probes.len() as u64) as usize].clone();
        for end in [None, Some(end_key.as_slice())] {
            let mut c = RunCursor::seek(run, from, end).unwrap();
            let want: Vec<(Vec<u8>, Option<Vec<u8>>)> = m
                .range(from.clone()..)
                .filter(|(k, _)| end.is_none_or(|e| k.as_slice() < e))
                .filter(|(k, _)| clip.contains(kg_of(k)))
                .take(60)
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            let mut got = Vec::new();
            while c.valid() && got.len() < 60 {
                got.push((c.key().to_vec(), c.value().map(<[u8]>::to_vec)));
                c.advance().unwrap();
            }
            assert_eq!(got, want, "{what}: seek {from:?} end {end:?}");
        }
    }
    // A full scan.
    let mut c = RunCursor::seek(run, b"", None).unwrap();
    let mut n = 0;
    while c.valid() {
        n += 1;
        c.advance().unwrap();
    }
    assert_eq!(
        n,
        m.keys().filter(|k| clip.contains(kg_of(k))).count(),
        "{what}: full scan"
    );
}

#[test]
fn format2_runs_match_a_model_at_partition_boundaries() {
    let dir = tempfile::tempdir().unwrap();
    let g = guard(dir.path());
    let mut rng = Rng(0x1234_5678_9abc_def1);
    let all = KeyGroupRange::new(0, u32::from(u16::MAX));
    // One entry per block (values > BLOCK_SIZE): exactly n blocks.
    let mut cases: Vec<(String, M, u32)> = Vec::new();
    for n in [0usize, 1, 2, 63, 64, 65, 127, 128, 129, 191, 192, 193] {
        for bloom in [0u32, 10] {
            let m = model_d(&mut rng, n, 4, 12, |_| 4100, false);
            cases.push((format!("{n} one-entry blocks, bloom {bloom}"), m, bloom));
        }
    }
    // Mixed sizes.
    for n in [3usize, 500, 3_000] {
        for bloom in [0u32, 10] {
            let m = model(&mut rng, n, 8, 30, |r| match r.below(10) {
                0 => r.below(9000) as usize,
                1 => 0,
                _ => r.below(40) as usize,
            });
            cases.push((format!("{n} mixed, bloom {bloom}"), m, bloom));
        }
    }
    for (i, (what, m, bloom)) in cases.iter().enumerate() {
        let path = dir.path().join(format!("{i}.run"));
        write(&path, m, *bloom);
        let run = Run::open(&path, &ident(1), all, Some(Arc::clone(&g))).unwrap();
        assert_eq!(run.entries, m.len() as u64, "{what}");
        check_run(&run, m, all, &mut rng, what);
        // Clipped to key groups 1..=2 (cursors filter; gets are the caller's to clip).
        let clip = KeyGroupRange::new(1, 2);
        let run = Run::open(&path, &ident(1), clip, Some(Arc::clone(&g))).unwrap();
        check_run(&run, m, clip, &mut rng, &format!("{what}, clipped"));
        eprintln!("{what}: {} partitions", run.partitions());
        if what.contains("one-entry") {
            assert_eq!(run.partitions(), m.len().div_ceil(64), "{what}");
        }
    }
}

/// The partitions and top of a run: (offset, len) of header, each partition, top, footer.
fn regions(bytes: &[u8]) -> Vec<(&'static str, usize, usize)> {
    let footer = bytes.len() - 56;
    let top = u64::from_le_bytes(bytes[footer..footer + 8].try_into().unwrap()) as usize;
    let ident_len = u32::from_le_bytes(bytes[6..10].try_into().unwrap()) as usize;
    let mut r = vec![("header", 0, 10 + ident_len)];
    let mut at = top;
    let blocks = u64::from_le_bytes(bytes[footer + 32..footer + 40].try_into().unwrap());
    let mut counted = 0u64;
    let mut first_block = true;
    while counted < blocks {
        let kl = u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap()) as usize;
        at += 4 + kl;
        let off = u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap()) as usize;
        let len = u32::from_le_bytes(bytes[at + 8..at + 12].try_into().unwrap()) as usize;
        let nb = u32::from_le_bytes(bytes[at + 12..at + 16].try_into().unwrap());
        at += 24;
        counted += u64::from(nb);
        r.push(("partition", off, len));
        if first_block {
            // The first block: just after the header.
            r.push(("block", 10 + ident_len, 200));
            first_block = false;
        }
        // The last ~200 bytes of the block before the partition.
        r.push(("block", off - 200, 200));
    }
    r.push(("top", top, footer - top));
    r.push(("footer", footer, 56));
    r
}

#[test]
fn no_flipped_byte_gives_a_wrong_answer() {
    let dir = tempfile::tempdir().unwrap();
    let g = guard(dir.path());
    let mut rng = Rng(99);
    let all = KeyGroupRange::new(0, u32::from(u16::MAX));
    // ~3 partitions, few keys per block so a full check is cheap.
    let m = model(&mut rng, 3_300, 3, 10, |r| 100 + r.below(300) as usize);
    let path = dir.path().join("d.run");
    write(&path, &m, 10);
    let good = std::fs::read(&path).unwrap();
    let regs = regions(&good);
    eprintln!("{} bytes, regions {regs:?}", good.len());
    let probes: Vec<Vec<u8>> = probes(&m).into_iter().step_by(2).collect();
    let mut flips = 0;
    let (mut refused, mut read_errors, mut unnoticed) = (0, 0, 0);
    for (name, off, len) in regs {
        let step = (len / 60).max(1);
        for at in (off..off + len).step_by(step) {
            for bit in [if at % 2 == 0 { 0x01u8 } else { 0x80 }] {
                flips += 1;
                let mut bad = good.clone();
                bad[at] ^= bit;
                std::fs::write(&path, &bad).unwrap();
                let run = match Run::open(&path, &ident(1), all, Some(Arc::clone(&g))) {
                    Err(e) => {
                        let t = e.to_string();
                        assert!(t.contains("d.run"), "{name} @{at}: {t}");
                        refused += 1;
                        continue;
                    }
                    Ok(run) => run,
                };
                let mut errored = false;
                let (mut block, mut value) = (Vec::new(), Vec::new());
                for k in &probes {
                    match run.get(k, key_hash(k), &mut block, &mut value) {
                        Ok(got) => {
                            let want = m.get(k).map(|v| v.is_some());
                            assert_eq!(got, want, "{name} @{at} ^{bit:#x}: WRONG get {k:?}");
                            if got == Some(true) {
                                assert_eq!(Some(&value), m.get(k).unwrap().as_ref());
                            }
                        }
                        Err(e) => {
                            assert!(e.to_string().contains("d.run"), "{e}");
                            errored = true;
                        }
                    }
                }
                // A full cursor scan: a prefix of the model, then maybe an error.
                match RunCursor::seek(&run, b"", None) {
                    Err(e) => {
                        assert!(e.to_string().contains("d.run"));
                        errored = true;
                    }
                    Ok(mut c) => {
                        let mut it = m.iter();
                        loop {
                            if !c.valid() {
                                assert!(it.next().is_none(), "{name} @{at}: scan ended early");
                                break;
                            }
                            let (k, v) = it.next().expect("scan past the model");
                            assert_eq!(c.key(), k.as_slice(), "{name} @{at}: WRONG scan key");
                            assert_eq!(c.value(), v.as_deref(), "{name} @{at}: WRONG scan value");
                            if let Err(e) = c.advance() {
                                assert!(e.to_string().contains("d.run"));
                                errored = true;
                                break;
                            }
                        }
                    }
                }
                if errored {
                    read_errors += 1;
                } else {
                    unnoticed += 1;
                    eprintln!("flip in {name} @{at} ^{bit:#x} noticed by nobody, answers right");
                }
            }
        }
    }
    eprintln!(
        "{flips} flips: {refused} refused at open, {read_errors} at a read, {unnoticed} unnoticed"
    );
}

/// A v1 fixture with flips: never a wrong answer either.
#[test]
fn v1_fixture_flips_never_answer_wrong() {
    let dir = tempfile::tempdir().unwrap();
    let g = guard(dir.path());
    let path = dir.path().join("v1.run");
    let good = include_bytes!("testdata/run-v1.run").to_vec();
    let ident7 = RunIdentity {
        store: "test-store".to_string(),
        run_id: 7,
    };
    let all = KeyGroupRange::new(0, u32::from(u16::MAX));
    let key = |i: u32| format!("key-{i:08}").into_bytes();
    // Flip in the footer, the index+bloom area (last ~8 KiB) and first block.
    let len = good.len();
    let mut positions: Vec<usize> = (len - 56..len).collect();
    positions.extend((len - 9000..len - 56).step_by(37));
    positions.extend((0..300).step_by(7));
    let mut version_flips_ok = 0;
    for at in positions {
        for bit in [0x01u8, 0x02, 0x80] {
            let mut bad = good.clone();
            bad[at] ^= bit;
            std::fs::write(&path, &bad).unwrap();
            let Ok(run) = Run::open(&path, &ident7, all, Some(Arc::clone(&g))) else {
                continue;
            };
            if at >= len - 8 {
                version_flips_ok += 1;
            }
            let (mut block, mut value) = (Vec::new(), Vec::new());
            // Every third key: a damaged filter or index shows on many keys at once.
            for i in (0..6_000u32).step_by(3) {
                let k = key(i);
                if let Ok(got) = run.get(&k, key_hash(&k), &mut block, &mut value) {
                    let want = (i % 2 == 0).then_some(i % 3 != 0);
                    assert_eq!(got, want, "flip @{at}^{bit}: key {i}");
                }
            }
        }
    }
    eprintln!("{version_flips_ok} flips in the footer's last 8 bytes went unnoticed");
}

/// Bulk loads of new states one after another, on a store whose other states are being
/// written (with deletions) under tiny memtables, so flushes and compactions run constantly.
#[test]
fn bulk_loads_racing_compactions_lose_nothing() {
    for seed in 1..=2u64 {
        let dir = tempfile::tempdir().unwrap();
        let stats = Arc::new(DiskStats::default());
        let range = KeyGroupRange::new(0, 7);
        let mut store = DiskKeyedStore::open(
            dir.path().join("s"),
            "bulk-race".to_string(),
            range,
            DiskOptions::default().with_memtable_bytes(4096),
            Arc::clone(&stats),
        )
        .unwrap();
        let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
        // (state, kg, key) -> value
        let mut model: BTreeMap<(u16, u32, Vec<u8>), Vec<u8>> = BTreeMap::new();
        let mut live_states: Vec<u16> = Vec::new();
        let mut value = Vec::new();
        for state in 0..24u16 {
            // Bulk-load the new state: random size (0 to a few thousand entries).
            let n = match rng.below(4) {
                0 => 0,
                1 => rng.below(20),
                _ => rng.below(4000),
            };
            let mut entries: BTreeMap<(u32, Vec<u8>), Vec<u8>> = BTreeMap::new();
            for _ in 0..n {
                let kg = rng.below(8) as u32;
                let k = format!("k{}", rng.below(5000)).into_bytes();
                let v = format!("bulk-{state}-{}", rng.below(1000)).into_bytes();
                entries.insert((kg, k), v);
            }
            {
                let mut bulk = store
                    .bulk_load(state, entries.len() as u64)
                    .unwrap()
                    .unwrap();
                for ((kg, k), v) in &entries {
                    bulk.add(*kg, k, v).unwrap();
                }
                bulk.finish().unwrap();
            }
            for ((kg, k), v) in entries {
                model.insert((state, kg, k), v);
            }
            live_states.push(state);
            // Writes to all states registered so far (puts, deletes, overwrites of bulk keys).
            for _ in 0..rng.below(1500) {
                let s = live_states[rng.below(live_states.len() as u64) as usize];
                let kg = rng.below(8) as u32;
                let k = format!("k{}", rng.below(5000)).into_bytes();
                match rng.below(5) {
                    0 => {
                        store.delete(s, kg, &k).unwrap();
                        model.remove(&(s, kg, k));
                    }
                    1 => {
                        let found = store.get(s, kg, &k, &mut value).unwrap();
                        let want = model.get(&(s, kg, k.clone()));
                        assert_eq!(found.then_some(&value), want, "seed {seed} state {s}");
                    }
                    _ => {
                        let v = format!(
                            "w{}-{}",
                            rng.next() % 100,
                            "x".repeat(rng.below(30) as usize)
                        )
                        .into_bytes();
                        store.put(s, kg, &k, &v).unwrap();
                        model.insert((s, kg, k), v);
                    }
                }
            }
        }
        let check = |store: &mut DiskKeyedStore, when: &str| {
            for &s in &live_states {
                for kg in 0..8u32 {
                    let mut seen = Vec::new();
                    store
                        .scan(s, kg, &mut |k, v| {
                            seen.push((k.to_vec(), v.to_vec()));
                            Ok(())
                        })
                        .unwrap();
                    let want: Vec<(Vec<u8>, Vec<u8>)> = model
                        .range((s, kg, Vec::new())..)
                        .take_while(|((ms, mk, _), _)| *ms == s && *mk == kg)
                        .map(|((_, _, k), v)| (k.clone(), v.clone()))
                        .collect();
                    assert_eq!(
                        seen.len(),
                        want.len(),
                        "seed {seed} {when}: state {s} kg {kg}"
                    );
                    assert_eq!(seen, want, "seed {seed} {when}: state {s} kg {kg}");
                }
            }
            let mut v = Vec::new();
            for ((s, kg, k), want) in &model {
                assert!(
                    store.get(*s, *kg, k, &mut v).unwrap(),
                    "seed {seed} {when}: lost {s} {kg} {k:?}"
                );
                assert_eq!(&v, want);
            }
        };
        check(&mut store, "before settle");
        store.settle().unwrap();
        check(&mut store, "after settle");
        eprintln!(
            "seed {seed}: bulk loads {}, flushes {}, compactions {}, runs {}",
            stats.bulk_loads.load(Ordering::Relaxed),
            stats.flushes.load(Ordering::Relaxed),
            stats.compactions.load(Ordering::Relaxed),
            store.runs().unwrap()
        );
        // A native snapshot of it restores to the same contents.
        let mut frozen = store.freeze_files().unwrap().unwrap();
        let files = frozen.files().unwrap();
        let mut second = DiskKeyedStore::open(
            dir.path().join("s2"),
            "bulk-race-2".to_string(),
            range,
            DiskOptions::default().with_memtable_bytes(4096),
            Arc::new(DiskStats::default()),
        )
        .unwrap();
        second.restore_files(&[&files], range).unwrap();
        check(&mut second, "restored");
    }
}

/// The memtable: writes of changing lengths, deletes and re-puts against a model; `bytes`
/// grows with every moved value, never shrinks, stays constant for same-length rewrites.
#[test]
fn memtable_arena_matches_a_model() {
    let mut rng = Rng(5);
    let mut m = Memtable::default();
    let mut model: BTreeMap<Vec<u8>, Option<Vec<u8>>> = BTreeMap::new();
    let mut last_bytes = 0;
    for step in 0..50_000u32 {
        let k = format!("{}", rng.below(700)).into_bytes();
        let v = match rng.below(6) {
            0 => None,
            1 => Some(Vec::new()),
            _ => Some(vec![step as u8; rng.below(20) as usize]),
        };
        m.set(&k, key_hash(&k), v.as_deref());
        model.insert(k, v);
        assert!(m.bytes() >= last_bytes);
        last_bytes = m.bytes();
        if step % 997 == 0 {
            for (k, v) in &model {
                assert_eq!(m.get(k, key_hash(k)), Some(v.as_deref()), "step {step}");
            }
            let mut seen = Vec::new();
            let layers = Layers {
                active: Some(&m),
                memtables: Vec::new(),
                runs: &[],
            };
            merge(&layers, b"", None, true, &mut |k, v| {
                seen.push((k.to_vec(), v.map(<[u8]>::to_vec)));
                Ok(())
            })
            .unwrap();
            let want: Vec<_> = model.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
            assert_eq!(seen, want);
        }
    }
    assert_eq!(m.len(), model.len());
    // Same-length rewrites: bytes constant.
    let before = m.bytes();
    for i in 0..10_000u32 {
        let k = b"fixed".to_vec();
        m.set(&k, key_hash(&k), Some(&i.to_le_bytes()));
    }
    let after_first = m.bytes();
    for i in 0..10_000u32 {
        let k = b"fixed".to_vec();
        m.set(&k, key_hash(&k), Some(&i.to_le_bytes()));
    }
    assert_eq!(m.bytes(), after_first);
    assert!(after_first > before);
}

/// A key rewritten forever with alternating lengths in a store: memtables flush, and the
/// store keeps answering right.
#[test]
fn alternating_length_rewrites_flush() {
    let dir = tempfile::tempdir().unwrap();
    let stats = Arc::new(DiskStats::default());
    let mut store = DiskKeyedStore::open(
        dir.path().join("s"),
        "alt".to_string(),
        KeyGroupRange::new(0, 0),
        DiskOptions::default().with_memtable_bytes(4096),
        Arc::clone(&stats),
    )
    .unwrap();
    let mut v = Vec::new();
    for i in 0..20_000u32 {
        let val = vec![1u8; 1 + (i % 2) as usize];
        store.put(0, 0, b"k", &val).unwrap();
        if i % 3 == 0 {
            store.delete(0, 0, b"k").unwrap();
            store.put(0, 0, b"k", &val).unwrap();
        }
        assert!(store.get(0, 0, b"k", &mut v).unwrap());
        assert_eq!(v, val);
    }
    store.settle().unwrap();
    assert!(stats.flushes.load(Ordering::Relaxed) > 0);
}

/// Read syscalls of the calling thread so far: the gets' own, not those of the store's
/// background threads or of tests running beside this one (`/proc/self/io` counts the whole
/// process, and failed this test under `cargo test`'s parallel threads).
fn syscr() -> u64 {
    std::fs::read_to_string("/proc/thread-self/io")
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("syscr: "))
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

/// Read amplification after a canonical restore of several states: each bulk run spans
/// (key-group-major) every other state's keys, so without filters a get would read a block
/// from each (4.5 read syscalls per get measured before bulk runs had filters).
#[test]
fn bulk_runs_without_filters_cost_a_block_read_each() {
    const STATES: u16 = 6;
    const GROUPS: u32 = 16;
    for bulk in [true, false] {
        let dir = tempfile::tempdir().unwrap();
        let range = KeyGroupRange::new(0, GROUPS - 1);
        let mut store = DiskKeyedStore::open(
            dir.path().join("s"),
            "amp".to_string(),
            range,
            DiskOptions::default().with_memtable_bytes(64 << 10),
            Arc::new(DiskStats::default()),
        )
        .unwrap();
        for s in 0..STATES {
            if bulk {
                let mut b = store.bulk_load(s, 0).unwrap().unwrap();
                for kg in 0..GROUPS {
                    for i in 0..(if s == 0 { 100 } else { 2_000u32 }) {
                        b.add(kg, format!("k{i:06}").as_bytes(), b"value-value")
                            .unwrap();
                    }
                }
                b.finish().unwrap();
            } else {
                for kg in 0..GROUPS {
                    for i in 0..(if s == 0 { 100 } else { 2_000u32 }) {
                        store
                            .put(s, kg, format!("k{i:06}").as_bytes(), b"value-value")
                            .unwrap();
                    }
                }
            }
        }
        for settled in [false, true] {
            if settled || !bulk {
                store.settle().unwrap();
            }
            if settled && !bulk {
                continue;
            }
            let runs = store.runs().unwrap();
            let mut v = Vec::new();
            // Warm the partitions.
            for kg in 0..GROUPS {
                for s in 0..STATES {
                    let _ = store.get(s, kg, b"k000000", &mut v).unwrap();
                }
            }
            let before = syscr();
            let mut found = 0;
            for i in 0..1_000u32 {
                let kg = i % GROUPS;
                let s = (i % u32::from(STATES)) as u16;
                let s = if s == 0 { 1 } else { s };
                found += u32::from(
                    store
                        .get(s, kg, format!("k{:06}", (i * 7) % 2_000).as_bytes(), &mut v)
                        .unwrap(),
                );
                // a miss: a new key
                found += u32::from(
                    store
                        .get(s, kg, format!("n{i:06}").as_bytes(), &mut v)
                        .unwrap(),
                );
            }
            let reads = syscr() - before;
            let per_get = reads as f64 / 2000.0;
            assert!(
                per_get < 1.5,
                "{per_get:.2} read syscalls per get (bulk {bulk}, settled {settled})"
            );
            eprintln!(
                "{}: {runs} runs, {found} found of 1000 hits + 1000 misses: {reads} read syscalls ({:.2} per get)",
                if bulk {
                    if settled {
                        "bulk-loaded, settled"
                    } else {
                        "bulk-loaded"
                    }
                } else {
                    "put + settled"
                },
                reads as f64 / 2000.0
            );
        }
    }
}
