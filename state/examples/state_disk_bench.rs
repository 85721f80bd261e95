//! Disk keyed-state backend benchmark, one backend and key count per process: write and read
//! speed, checkpoint sync pause, incremental bytes at 1% churn, recovery with and without local
//! files, peak RSS and state size on disk.
//!
//! `cargo xtask bench state-disk` builds this in release and runs it per backend and key count;
//! alone: `state_disk_bench --backend disk|heap --keys N [--checkpoints 20] [--dir DIR]`.
//!
//! One backend holds every key group of max parallelism 128 (one subtask at parallelism 1),
//! with a `ValueState<u64>` per `u64` key (keys are `splitmix64(i)`, so they arrive unsorted):
//!
//! 1. writes the N keys (`write_rec_s`), then reads 1M of them picked at random
//!    (`read_rec_s`);
//! 2. `--checkpoints` times: updates 1% of the keys, picked at random, and takes a checkpoint:
//!    the synchronous part is timed (the pause: `sync_pause_p50_us`, `sync_pause_p99_us`). On
//!    disk the checkpoints are native: the bytes of the files no earlier checkpoint listed,
//!    over the bytes of all files, is `incremental_ratio` (median over the checkpoints after
//!    the first); heap takes incremental deltas (the same ratio over its full snapshot);
//! 3. disk only: restores the last checkpoint into a fresh store twice, from hard links of its
//!    files (local recovery: `recovery_local_ms`) and from copies made now (a download from a
//!    file system storage: `recovery_download_ms`), each up to the first value read;
//! 4. prints `state_bytes` (disk: the files of the last checkpoint; heap: its full snapshot) and
//!    `peak_rss_bytes` (the process's high-water mark, `VmHWM`).
//!
//! One line: `backend=.. keys=N write_rec_s=.. read_rec_s=.. sync_pause_p50_us=..
//! sync_pause_p99_us=.. incremental_ratio=.. recovery_local_ms=.. recovery_download_ms=..
//! state_bytes=.. peak_rss_bytes=..` (`n/a` where a field does not apply).

use std::collections::HashSet;
use std::error::Error;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};
use weir_core::keygroup::{KeyGroupRange, assign_to_key_group};
use weir_core::splitmix::splitmix64;
use weir_state::disk::{DiskKeyedStore, DiskStats};
use weir_state::store::StoreKeyedStateBackend;
use weir_state::{
    DiskOptions, HeapKeyedStateBackend, KeyedStateBackend, NativeFiles, NativeRestorePart,
    ValueState, ValueStateDescriptor,
};

type Res<T> = Result<T, Box<dyn Error>>;

const MAX_PARALLELISM: u32 = 128;
const READS: u64 = 1_000_000;

struct Options {
    backend: String,
    keys: u64,
    checkpoints: usize,
    dir: PathBuf,
}

fn parse_args() -> Res<Options> {
    let mut o = Options {
        backend: "disk".into(),
        keys: 1_000_000,
        checkpoints: 20,
        dir: PathBuf::from("target").join("state-disk-bench"),
    };
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let mut value = || args.next().ok_or_else(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--backend" => o.backend = value()?,
            "--keys" => o.keys = value()?.parse()?,
            "--checkpoints" => o.checkpoints = value()?.parse()?,
            "--dir" => o.dir = PathBuf::from(value()?),
            other => return Err(format!("unknown flag {other:?}").into()),
        }
    }
    if o.keys == 0 || o.checkpoints < 2 {
        return Err("--keys must be positive and --checkpoints at least 2".into());
    }
    if !matches!(o.backend.as_str(), "disk" | "heap") {
        return Err(format!("--backend {:?}: disk or heap", o.backend).into());
    }
    Ok(o)
}

fn all() -> KeyGroupRange {
    KeyGroupRange::new(0, MAX_PARALLELISM - 1)
}

fn key(i: u64) -> u64 {
    splitmix64(i)
}

fn kg(k: &u64) -> u32 {
    assign_to_key_group(k, MAX_PARALLELISM)
}

/// splitmix64 stream, for picking keys.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self.0.wrapping_add(1);
        ((u128::from(splitmix64(self.0)) * u128::from(n)) >> 64) as u64
    }
}

/// Nearest-rank percentile `p` of `values`.
fn percentile(values: &[f64], p: f64) -> f64 {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    let rank = ((p / 100.0) * v.len() as f64).ceil().max(1.0) as usize;
    v.get(rank.min(v.len()).saturating_sub(1))
        .copied()
        .unwrap_or(0.0)
}

fn peak_rss() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmHWM:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .map_or(0, |kb| kb * 1024)
}

/// What [`drive`] measured.
struct Measured {
    write_rec_s: f64,
    read_rec_s: f64,
    pauses_us: Vec<f64>,
    ratios: Vec<f64>,
    state_bytes: u64,
}

/// Writes, reads and the checkpoint rounds on any backend; `checkpoint` takes one checkpoint
/// and returns (sync pause, new bytes, all bytes).
fn drive<B: KeyedStateBackend<u64>>(
    o: &Options,
    backend: &mut B,
    count: ValueState<u64>,
    mut checkpoint: impl FnMut(&mut B, u64) -> Res<(Duration, u64, u64)>,
) -> Res<Measured> {
    let start = Instant::now();
    for i in 0..o.keys {
        let k = key(i);
        backend.update(count, &k, kg(&k), i);
    }
    let write = o.keys as f64 / start.elapsed().as_secs_f64();
    let mut rng = Rng(7);
    let reads = READS.min(o.keys);
    let start = Instant::now();
    let mut found = 0u64;
    for _ in 0..reads {
        let k = key(rng.below(o.keys));
        found += u64::from(backend.value(count, &k, kg(&k)).is_some());
    }
    let read = reads as f64 / start.elapsed().as_secs_f64();
    if found != reads {
        return Err(format!("read {found} of {reads} keys written").into());
    }
    let mut pauses = Vec::new();
    let mut ratios = Vec::new();
    let mut last_total = 0;
    for id in 1..=o.checkpoints as u64 {
        for _ in 0..o.keys / 100 {
            let k = key(rng.below(o.keys));
            backend.update(count, &k, kg(&k), id);
        }
        let (pause, new, total) = checkpoint(backend, id)?;
        pauses.push(pause.as_secs_f64() * 1e6);
        if id > 1 {
            ratios.push(new as f64 / total.max(1) as f64);
        }
        last_total = total;
    }
    Ok(Measured {
        write_rec_s: write,
        read_rec_s: read,
        pauses_us: pauses,
        ratios,
        state_bytes: last_total,
    })
}

fn run_heap(o: &Options) -> Res<String> {
    let mut backend =
        HeapKeyedStateBackend::<u64>::new(MAX_PARALLELISM, all()).with_incremental(u32::MAX);
    let count = backend.value_state(&ValueStateDescriptor::<u64>::new("count"))?;
    let mut full_bytes = None;
    let m = drive(
        o,
        &mut backend,
        count,
        |b: &mut HeapKeyedStateBackend<u64>, id| {
            let start = Instant::now();
            let snapshot = b.snapshot_incremental(id)?;
            let pause = start.elapsed();
            let mut out = Vec::new();
            snapshot.write_to(&mut out)?;
            b.notify_checkpoint_complete(id);
            // The full size, for the ratio: the chain's first link is a full snapshot.
            let full = *full_bytes.get_or_insert(out.len() as u64);
            Ok((pause, out.len() as u64, full))
        },
    )?;
    Ok(line(o, &m, None, None))
}

fn open_disk(dir: &Path, name: &str) -> Res<StoreKeyedStateBackend<u64>> {
    let store = DiskKeyedStore::open(
        dir.join(name),
        name.to_string(),
        all(),
        DiskOptions::default(),
        Arc::new(DiskStats::default()),
    )?;
    Ok(
        StoreKeyedStateBackend::new(Box::new(store), MAX_PARALLELISM, all())
            .with_native_snapshots(true),
    )
}

fn run_disk(o: &Options) -> Res<String> {
    let _ = std::fs::remove_dir_all(&o.dir);
    std::fs::create_dir_all(&o.dir)?;
    let mut backend = open_disk(&o.dir, "bench-source")?;
    let count = backend.value_state(&ValueStateDescriptor::<u64>::new("count"))?;
    let mut seen: HashSet<String> = HashSet::new();
    let mut last: Option<(NativeFiles, Vec<u8>)> = None;
    let local = o.dir.join("local");
    std::fs::create_dir_all(&local)?;
    let m = drive(
        o,
        &mut backend,
        count,
        |b: &mut StoreKeyedStateBackend<u64>, id| {
            let start = Instant::now();
            let mut snapshot = b.snapshot_incremental(id)?;
            let pause = start.elapsed();
            let mut files = snapshot.native_files()?.ok_or("no native snapshot")?;
            let total: u64 = files.files.iter().map(|f| f.size).sum();
            let new: u64 = files
                .files
                .iter()
                .filter(|f| !seen.contains(&f.name))
                .map(|f| f.size)
                .sum();
            // Local recovery keeps hard links of each checkpoint's files, as the runtime does.
            for f in &mut files.files {
                let link = local.join(&f.name);
                if seen.insert(f.name.clone()) {
                    std::fs::hard_link(&f.path, &link)?;
                }
                f.path = link;
            }
            let mut manifest = Vec::new();
            snapshot.write_to(&mut manifest)?;
            b.notify_checkpoint_complete(id);
            last = Some((files, manifest));
            Ok((pause, new, total))
        },
    )?;
    drop(backend);
    let (files, manifest) = last.ok_or("no checkpoint")?;
    let probe = key(o.keys / 2);
    // With local files: link them into a fresh store.
    let start = Instant::now();
    let restored = restore_and_read(&o.dir, "bench-local", &files, &manifest, probe)?;
    let local_ms = start.elapsed().as_secs_f64() * 1e3;
    // Closing the store (its threads, its directory) is not part of the recovery.
    drop(restored);
    // Without: copy each file first (a download from a file system storage), then the same.
    let downloads = o.dir.join("downloads");
    std::fs::create_dir_all(&downloads)?;
    // The page cache holds the files either way: the copy is the download's cost here.
    let start = Instant::now();
    let mut copied = files.clone();
    for f in &mut copied.files {
        let to = downloads.join(&f.name);
        std::fs::copy(&f.path, &to)?;
        f.path = to;
    }
    let restored = restore_and_read(&o.dir, "bench-download", &copied, &manifest, probe)?;
    let download_ms = start.elapsed().as_secs_f64() * 1e3;
    drop(restored);
    let out = line(o, &m, Some(local_ms), Some(download_ms));
    let _ = std::fs::remove_dir_all(&o.dir);
    Ok(out)
}

/// Restores `files` into a fresh store and reads `probe` (the first record processed);
/// returns the store, open.
fn restore_and_read(
    dir: &Path,
    name: &str,
    files: &NativeFiles,
    manifest: &[u8],
    probe: u64,
) -> Res<StoreKeyedStateBackend<u64>> {
    let mut b = open_disk(dir, name)?;
    b.restore_native(&[NativeRestorePart { manifest, files }])?;
    let count = b.value_state(&ValueStateDescriptor::<u64>::new("count"))?;
    if b.value(count, &probe, kg(&probe)).is_none() {
        return Err(format!("the restored state has no key {probe}").into());
    }
    Ok(b)
}

fn line(o: &Options, m: &Measured, local_ms: Option<f64>, download_ms: Option<f64>) -> String {
    let opt = |v: Option<f64>| v.map_or_else(|| "n/a".to_string(), |v| format!("{v:.1}"));
    let (write, read, state) = (m.write_rec_s, m.read_rec_s, m.state_bytes);
    let pauses = &m.pauses_us;
    let mut r = m.ratios.clone();
    r.sort_by(f64::total_cmp);
    let ratio = r.get(r.len() / 2).copied();
    format!(
        "backend={} keys={} write_rec_s={write:.0} read_rec_s={read:.0} sync_pause_p50_us={:.1} \
         sync_pause_p99_us={:.1} incremental_ratio={} recovery_local_ms={} \
         recovery_download_ms={} state_bytes={state} peak_rss_bytes={}",
        o.backend,
        o.keys,
        percentile(pauses, 50.0),
        percentile(pauses, 99.0),
        ratio.map_or_else(|| "n/a".to_string(), |v| format!("{v:.4}")),
        opt(local_ms),
        opt(download_ms),
        peak_rss(),
    )
}

fn main() {
    let result = parse_args().and_then(|o| match o.backend.as_str() {
        "heap" => run_heap(&o),
        _ => run_disk(&o),
    });
    match result {
        Ok(line) => println!("{line}"),
        Err(e) => {
            eprintln!("state_disk_bench: {e}");
            std::process::exit(1);
        }
    }
}
