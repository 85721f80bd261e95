//! Heap keyed-state backend benchmark: checkpoint pause, copy-on-write cost, write and restore speed.
//!
//! `cargo xtask bench state` builds this in release and runs it; it can also run alone:
//! `state_bench [--keys 1000000,10000000] [--checkpoints 50] [--update-percent 1] [--dir DIR]`.
//!
//! For each key count, one backend holds every key group of max parallelism 128 (as one subtask
//! of parallelism 1 would) with a `ValueState<u64>` per `u64` key, and:
//!
//! 1. takes `--checkpoints` snapshots; each synchronous `snapshot()` call is timed (the pause),
//!    and while the snapshot is held (as if its asynchronous part were still writing) 1% of the
//!    keys, picked at random, are updated. The first write into each key group after a snapshot
//!    copies that group's table (copy-on-write); those first writes are timed one by one;
//! 2. switches the backend to incremental mode, takes a full incremental snapshot (checkpoint
//!    1, confirmed), updates the same share of keys, and takes checkpoint 2: a delta on 1. It
//!    reports the bytes of that delta (`incremental_bytes`, and `incremental_ratio` over the
//!    full one), its synchronous pause, and the update batch's time with change tracking on;
//! 3. writes one full snapshot with `write_to` into a `BufWriter<File>` under `--dir` (no
//!    fsync): the asynchronous part, as MB/s of snapshot bytes;
//! 4. drops the backend, reads the file back and restores it into a fresh backend, registering
//!    the state so that every entry is decoded: restore MB/s over the file size.
//!
//! It prints one line per key count (MB = 10^6 bytes):
//! `keys=N sync_pause_p50_us=.. sync_pause_p99_us=.. upload_mb_s=.. restore_mb_s=..
//! full_bytes=.. incremental_bytes=.. incremental_ratio=.. incremental_sync_pause_us=..
//! update_batch_tracked_ms=.. cow_first_write_p50_us=.. cow_first_write_p99_us=..
//! cow_copy_ms_per_checkpoint=.. update_batch_ms=.. restore_read_ms=.. restore_parse_ms=..
//! restore_decode_ms=.. upload_cpu_mb_s=.. restore_cpu_mb_s=.. restore_process_cpu_mb_s=..`; the
//! `_cpu_` speeds divide by the thread's CPU time instead of wall time, which tells on a loaded
//! machine. A large restore also works on helper threads, which `restore_cpu_mb_s` does not
//! count: `restore_process_cpu_mb_s` divides by the whole process's CPU time instead (in clock
//! ticks, 10 ms on Linux, so coarse for a short restore).

use std::error::Error;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use weir_core::handle::StreamStateHandle;
use weir_core::keygroup::{KeyGroupRange, assign_to_key_group};
use weir_state::format::whole_shared_stream_part;
use weir_state::{HeapKeyedStateBackend, KeyedStateBackend, ValueState, ValueStateDescriptor};

type Res<T> = Result<T, Box<dyn Error>>;

const MAX_PARALLELISM: u32 = 128;
const STATE: &str = "count";

struct Options {
    keys: Vec<u64>,
    checkpoints: usize,
    update_percent: f64,
    dir: PathBuf,
}

fn parse_args() -> Res<Options> {
    let mut o = Options {
        keys: vec![1_000_000, 10_000_000],
        checkpoints: 50,
        update_percent: 1.0,
        dir: PathBuf::from("target").join("state-bench"),
    };
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let mut value = || args.next().ok_or_else(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--keys" => {
                o.keys = value()?
                    .split(',')
                    .map(|k| k.trim().parse::<u64>())
                    .collect::<Result<_, _>>()?
            }
            "--checkpoints" => o.checkpoints = value()?.parse()?,
            "--update-percent" => o.update_percent = value()?.parse()?,
            "--dir" => o.dir = PathBuf::from(value()?),
            other => return Err(format!("unknown flag {other:?}").into()),
        }
    }
    if o.checkpoints == 0 || o.keys.contains(&0) {
        return Err("--checkpoints and every --keys count must be positive".into());
    }
    Ok(o)
}

/// splitmix64: a fast, seedable generator for picking the keys to update.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(weir_core::splitmix::GOLDEN_GAMMA);
        weir_core::splitmix::mix64(self.0)
    }

    fn below(&mut self, n: u64) -> u64 {
        ((u128::from(self.next()) * u128::from(n)) >> 64) as u64
    }
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

/// Nearest-rank percentile `p` (0..=100) of `values`; 0 when empty.
fn percentile(values: &[f64], p: f64) -> f64 {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    if v.is_empty() {
        return 0.0;
    }
    let rank = ((p / 100.0) * v.len() as f64).ceil().max(1.0) as usize;
    v[rank.min(v.len()) - 1]
}

/// CPU time this thread has run so far (Linux `/proc/thread-self/schedstat`), to tell a slow
/// phase from one that waited for a CPU on a loaded machine; `None` where unavailable.
fn thread_cpu() -> Option<Duration> {
    let stat = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    let ns = stat.split_whitespace().next()?.parse().ok()?;
    Some(Duration::from_nanos(ns))
}

/// CPU time this process has run so far, its ended threads included (Linux `/proc/self/stat`:
/// user and system time in clock ticks, taken as 100 a second); `None` where unavailable.
fn process_cpu() -> Option<Duration> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // The fields after the command name (in parentheses, which may hold spaces): utime and
    // stime are the 12th and 13th.
    let rest = stat.get(stat.rfind(')')? + 1..)?;
    let mut fields = rest.split_whitespace().skip(11);
    let utime: u64 = fields.next()?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some(Duration::from_millis((utime + stime) * 10))
}

/// CPU time spent since `start` (a [`thread_cpu`] reading).
fn cpu_since(start: Option<Duration>) -> Option<Duration> {
    Some(thread_cpu()?.saturating_sub(start?))
}

fn opt_mb_s(bytes: u64, d: Option<Duration>) -> String {
    d.map_or_else(|| "n/a".to_string(), |d| format!("{:.1}", mb_s(bytes, d)))
}

/// Writes a snapshot nowhere, counting its bytes.
fn count_bytes(snapshot: Box<dyn weir_state::KeyedSnapshot>) -> Res<u64> {
    struct Counter(u64);
    impl Write for Counter {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.len() as u64;
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut counter = Counter(0);
    snapshot.write_to(&mut counter)?;
    Ok(counter.0)
}

fn mb_s(bytes: u64, d: Duration) -> f64 {
    bytes as f64 / 1e6 / d.as_secs_f64().max(1e-9)
}

fn run(keys: u64, o: &Options) -> Res<String> {
    let range = KeyGroupRange::new(0, MAX_PARALLELISM - 1);
    let mut backend = HeapKeyedStateBackend::<u64>::new(MAX_PARALLELISM, range);
    let state: ValueState<u64> = backend.value_state(&ValueStateDescriptor::new(STATE))?;
    let fill = Instant::now();
    for k in 0..keys {
        backend.update(state, &k, assign_to_key_group(&k, MAX_PARALLELISM), k);
    }
    eprintln!(
        "  keys={keys}: filled in {:.2}s",
        fill.elapsed().as_secs_f64()
    );

    // 1. Checkpoints: the synchronous pause, and the copy-on-write writes that follow.
    let updates = ((keys as f64 * o.update_percent / 100.0).round() as u64).max(1);
    let mut rng = Rng(0x5eed ^ keys);
    let mut pauses = Vec::with_capacity(o.checkpoints);
    let mut first_writes = Vec::new();
    let mut cow_per_checkpoint = Vec::with_capacity(o.checkpoints);
    let mut batches = Vec::with_capacity(o.checkpoints);
    for round in 0..o.checkpoints {
        let start = Instant::now();
        let snapshot = backend.snapshot()?;
        pauses.push(us(start.elapsed()));

        let mut written = [false; MAX_PARALLELISM as usize];
        let mut cow = Duration::ZERO;
        let batch = Instant::now();
        for _ in 0..updates {
            let k = rng.below(keys);
            let kg = assign_to_key_group(&k, MAX_PARALLELISM);
            let slot = &mut written[kg as usize];
            if *slot {
                backend.update(state, &k, kg, k + round as u64 + 1);
            } else {
                *slot = true;
                let t = Instant::now();
                backend.update(state, &k, kg, k + round as u64 + 1);
                let d = t.elapsed();
                cow += d;
                first_writes.push(us(d));
            }
        }
        batches.push(batch.elapsed().as_secs_f64() * 1e3);
        cow_per_checkpoint.push(cow.as_secs_f64() * 1e3);
        // The asynchronous part is done: the snapshot lets go of the old tables.
        drop(snapshot);
    }

    // 2. Incremental: a full snapshot starts the chain, the same share of keys changes, and the
    // next checkpoint's delta holds only those keys.
    let mut backend = backend.with_incremental(u32::MAX);
    let chain_start = count_bytes(backend.snapshot_incremental(1)?)?;
    backend.notify_checkpoint_complete(1);
    let batch = Instant::now();
    for _ in 0..updates {
        let k = rng.below(keys);
        backend.update(state, &k, assign_to_key_group(&k, MAX_PARALLELISM), k + 7);
    }
    let tracked_batch_ms = batch.elapsed().as_secs_f64() * 1e3;
    let start = Instant::now();
    let delta = backend.snapshot_incremental(2)?;
    let delta_pause = us(start.elapsed());
    let incremental_bytes = count_bytes(delta)?;
    backend.notify_checkpoint_complete(2);

    // 3. The asynchronous part: a full snapshot written to a file.
    std::fs::create_dir_all(&o.dir)?;
    let path = o
        .dir
        .join(format!("state-{keys}-{}.snap", std::process::id()));
    let result = upload_and_restore(backend, state, keys, &path);
    let _ = std::fs::remove_file(&path);
    let r = result?;

    Ok(format!(
        "keys={keys} sync_pause_p50_us={:.1} sync_pause_p99_us={:.1} upload_mb_s={:.1} \
         restore_mb_s={:.1} full_bytes={} incremental_bytes={} incremental_ratio={:.4} \
         incremental_sync_pause_us={:.1} update_batch_tracked_ms={:.2} cow_first_write_p50_us={:.1} \
         cow_first_write_p99_us={:.1} cow_copy_ms_per_checkpoint={:.2} update_batch_ms={:.2} \
         restore_read_ms={:.1} restore_parse_ms={:.1} restore_decode_ms={:.1} \
         upload_cpu_mb_s={} restore_cpu_mb_s={} restore_process_cpu_mb_s={}",
        percentile(&pauses, 50.0),
        percentile(&pauses, 99.0),
        mb_s(r.bytes, r.upload),
        mb_s(r.bytes, r.read + r.parse + r.decode),
        r.bytes,
        incremental_bytes,
        incremental_bytes as f64 / chain_start.max(1) as f64,
        delta_pause,
        tracked_batch_ms,
        percentile(&first_writes, 50.0),
        percentile(&first_writes, 99.0),
        percentile(&cow_per_checkpoint, 50.0),
        percentile(&batches, 50.0),
        r.read.as_secs_f64() * 1e3,
        r.parse.as_secs_f64() * 1e3,
        r.decode.as_secs_f64() * 1e3,
        opt_mb_s(r.bytes, r.upload_cpu),
        opt_mb_s(r.bytes, r.restore_cpu),
        opt_mb_s(r.bytes, r.restore_process_cpu),
    ))
}

struct Transfer {
    bytes: u64,
    upload: Duration,
    read: Duration,
    parse: Duration,
    decode: Duration,
    upload_cpu: Option<Duration>,
    restore_cpu: Option<Duration>,
    restore_process_cpu: Option<Duration>,
}

fn upload_and_restore(
    mut backend: HeapKeyedStateBackend<u64>,
    state: ValueState<u64>,
    keys: u64,
    path: &Path,
) -> Res<Transfer> {
    let snapshot = backend.snapshot()?;
    let cpu = thread_cpu();
    let start = Instant::now();
    let mut out = BufWriter::new(File::create(path)?);
    let layout = snapshot.write_to(&mut out)?;
    out.flush()?;
    drop(out);
    let upload = start.elapsed();
    let upload_cpu = cpu_since(cpu);
    let bytes = layout.end;
    // Keep one key's value to check the restore by.
    let probe = keys / 2;
    let expected = backend
        .value(state, &probe, assign_to_key_group(&probe, MAX_PARALLELISM))
        .copied();
    // Only the file and the fresh backend are alive during the restore.
    drop(backend);

    let handle = layout.into_handle(StreamStateHandle::File {
        path: path.display().to_string(),
        size: bytes,
        digest: weir_core::identity::Digest([0; 16]),
    });
    let cpu = thread_cpu();
    let process = process_cpu();
    let start = Instant::now();
    let stream = bytes::Bytes::from(std::fs::read(path)?);
    let read = start.elapsed();
    let start = Instant::now();
    let range = KeyGroupRange::new(0, MAX_PARALLELISM - 1);
    let mut restored = HeapKeyedStateBackend::<u64>::new(MAX_PARALLELISM, range);
    restored.restore(&[whole_shared_stream_part(&handle, &stream)?])?;
    let parse = start.elapsed();
    let start = Instant::now();
    let state: ValueState<u64> = restored.value_state(&ValueStateDescriptor::new(STATE))?;
    let decode = start.elapsed();
    let restore_cpu = cpu_since(cpu);
    let restore_process_cpu = process_cpu()
        .zip(process)
        .map(|(now, then)| now.saturating_sub(then));
    drop(stream);

    if restored.num_entries() as u64 != keys {
        return Err(format!(
            "restored {} entries, expected {keys}",
            restored.num_entries()
        )
        .into());
    }
    let got = restored
        .value(state, &probe, assign_to_key_group(&probe, MAX_PARALLELISM))
        .copied();
    if got != expected {
        return Err(format!("key {probe} restored as {got:?}, expected {expected:?}").into());
    }
    Ok(Transfer {
        bytes,
        upload,
        read,
        parse,
        decode,
        upload_cpu,
        restore_cpu,
        restore_process_cpu,
    })
}

fn main() -> Res<()> {
    let o = parse_args()?;
    for &keys in &o.keys {
        let line = run(keys, &o)?;
        println!("{line}");
    }
    Ok(())
}
