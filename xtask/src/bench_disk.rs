//! `cargo xtask bench state-disk`: the disk keyed-state backend against heap at 1M, 10M and 50M
//! keys (`state_disk_bench`, one process per backend and key count), and `word_count
//! --key-space 10000000` records/s on disk against heap, with the targets.

use crate::lines::{last_line, median, parse_fields};
use anyhow::{Context, Result};
use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

const KEYS: [u64; 3] = [1_000_000, 10_000_000, 50_000_000];
/// Heap runs up to this many keys (it holds them all in memory).
const HEAP_MAX_KEYS: u64 = 50_000_000;
const TARGET_PAUSE_P99_US: f64 = 5_000.0;
const TARGET_INCREMENTAL: f64 = 0.05;
const TARGET_LOCAL_RECOVERY_MS: f64 = 1_000.0;
/// Local recovery at 50M keys over 10M keys: "flat".
const TARGET_RECOVERY_GROWTH: f64 = 2.0;
const TARGET_STATE_OVER_RSS: f64 = 8.0;
const TARGET_WORD_COUNT_RATIO: f64 = 0.3;
/// Interleaved word_count rounds (disk, heap, disk, heap, ...).
const ROUNDS: usize = 2;

/// One `state_disk_bench` line.
#[derive(Debug, Clone)]
struct Row {
    fields: BTreeMap<String, String>,
}

impl Row {
    fn num(&self, key: &str) -> Option<f64> {
        self.fields.get(key).and_then(|v| v.parse().ok())
    }
}

fn run_state(bench: &Path, scratch: &Path, backend: &str, keys: u64) -> Result<Row> {
    let dir = scratch.join(format!("state-disk-{backend}-{keys}"));
    let mut cmd = Command::new(bench);
    cmd.args(["--backend", backend, "--keys", &keys.to_string(), "--dir"])
        .arg(&dir);
    let out = crate::lines::run_logged(&mut cmd);
    let _ = std::fs::remove_dir_all(&dir);
    let (_, stdout) = out?;
    let line = last_line(&stdout).context("no output")?;
    println!("{line}");
    Ok(Row {
        fields: parse_fields(line)?,
    })
}

fn verdict(ok: bool) -> &'static str {
    if ok { "MET" } else { "MISSED" }
}

/// The benchmark: `bench` is the release `state_disk_bench`, `scratch` a directory for its
/// state, and `word_count` runs `word_count --key-space 10000000` on a backend, with incremental
/// checkpoints or full ones, and returns its records/s.
pub fn state_disk(
    bench: &Path,
    scratch: &Path,
    word_count: &dyn Fn(&'static str, bool) -> Result<f64>,
) -> Result<()> {
    println!(
        "keyed state, one backend of 128 key groups, ValueState<u64> per u64 key; 20 checkpoints, \
         1% of keys updated before each; disk checkpoints are native (runs + manifest):"
    );
    let mut disk = BTreeMap::new();
    let mut heap = BTreeMap::new();
    for keys in KEYS {
        disk.insert(keys, run_state(bench, scratch, "disk", keys)?);
        if keys <= HEAP_MAX_KEYS {
            heap.insert(keys, run_state(bench, scratch, "heap", keys)?);
        }
    }
    println!(
        "\nword_count --key-space 10000000, p=2, 1 s checkpoints, {ROUNDS} interleaved rounds:"
    );
    // Incremental checkpoints, as large state runs in Flink (`state.backend.incremental`): the
    // disk backend uploads its new runs. Full ones too: every checkpoint then writes every key
    // in the canonical format on either backend (Flink's RocksDB full snapshots do the same).
    let mut rates: BTreeMap<(&str, bool), Vec<f64>> = BTreeMap::new();
    for _ in 0..ROUNDS {
        for incremental in [true, false] {
            for backend in ["disk", "heap"] {
                let rate = word_count(backend, incremental)?;
                rates.entry((backend, incremental)).or_default().push(rate);
            }
        }
    }
    let rate = |backend: &str, incremental: bool| {
        median(
            rates
                .get(&(backend, incremental))
                .map_or(&[][..], Vec::as_slice),
        )
    };
    let wc_disk = rate("disk", true).unwrap_or(0.0);
    let wc_heap = rate("heap", true).unwrap_or(f64::MAX);
    let (full_disk, full_heap) = (
        rate("disk", false).unwrap_or(0.0),
        rate("heap", false).unwrap_or(f64::MAX),
    );

    println!("\nper key count (disk / heap):");
    for keys in KEYS {
        let d = &disk[&keys];
        let h = heap.get(&keys);
        let ratio = |f: &str| match (d.num(f), h.and_then(|h| h.num(f))) {
            (Some(a), Some(b)) if b > 0.0 => format!("{:.2}x", a / b),
            _ => "n/a".into(),
        };
        println!(
            "  {keys} keys: write {:.0}/s ({} of heap), read {:.0}/s ({} of heap), sync pause p99 \
             {:.0} us (heap {}), incremental {:.2}% of full, recovery local {:.1} ms / download \
             {:.1} ms, state on disk {:.1} MB, peak RSS {:.1} MB (heap {})",
            d.num("write_rec_s").unwrap_or(0.0),
            ratio("write_rec_s"),
            d.num("read_rec_s").unwrap_or(0.0),
            ratio("read_rec_s"),
            d.num("sync_pause_p99_us").unwrap_or(f64::NAN),
            h.and_then(|h| h.num("sync_pause_p99_us"))
                .map_or("n/a".into(), |v| format!("{v:.0} us")),
            d.num("incremental_ratio").unwrap_or(f64::NAN) * 100.0,
            d.num("recovery_local_ms").unwrap_or(f64::NAN),
            d.num("recovery_download_ms").unwrap_or(f64::NAN),
            d.num("state_bytes").unwrap_or(0.0) / 1e6,
            d.num("peak_rss_bytes").unwrap_or(0.0) / 1e6,
            h.and_then(|h| h.num("peak_rss_bytes"))
                .map_or("n/a".into(), |v| format!("{:.1} MB", v / 1e6)),
        );
    }

    println!("\ntargets:");
    let big = &disk[&KEYS[2]];
    let mid = &disk[&KEYS[1]];
    let state_over_rss = big.num("state_bytes").unwrap_or(0.0)
        / big.num("peak_rss_bytes").unwrap_or(f64::MAX).max(1.0);
    println!(
        "  state / peak RSS at {} keys (state_disk_bench process): {state_over_rss:.2}x  target >= \
         {TARGET_STATE_OVER_RSS:.0}x  {}",
        KEYS[2],
        verdict(state_over_rss >= TARGET_STATE_OVER_RSS)
    );
    for (keys, d) in &disk {
        let p99 = d.num("sync_pause_p99_us").unwrap_or(f64::MAX);
        println!(
            "  sync pause p99 at {keys} keys: {p99:.0} us  target <= {TARGET_PAUSE_P99_US:.0} us  {}",
            verdict(p99 <= TARGET_PAUSE_P99_US)
        );
        let inc = d.num("incremental_ratio").unwrap_or(1.0);
        println!(
            "  incremental at {keys} keys, 1% churn: {:.2}% of full  target <= {:.0}%  {}",
            inc * 100.0,
            TARGET_INCREMENTAL * 100.0,
            verdict(inc <= TARGET_INCREMENTAL)
        );
        let local = d.num("recovery_local_ms").unwrap_or(f64::MAX);
        println!(
            "  recovery with local files at {keys} keys: {local:.1} ms  target <= \
             {TARGET_LOCAL_RECOVERY_MS:.0} ms  {}",
            verdict(local <= TARGET_LOCAL_RECOVERY_MS)
        );
    }
    let growth = big.num("recovery_local_ms").unwrap_or(f64::MAX)
        / mid.num("recovery_local_ms").unwrap_or(1.0).max(0.001);
    println!(
        "  local recovery {} -> {} keys: {growth:.2}x  target <= {TARGET_RECOVERY_GROWTH:.0}x (flat)  {}",
        KEYS[1],
        KEYS[2],
        verdict(growth <= TARGET_RECOVERY_GROWTH)
    );
    let wc = wc_disk / wc_heap;
    println!(
        "  word_count --key-space 10000000, incremental checkpoints: disk {wc_disk:.0} rec/s / \
         heap {wc_heap:.0} rec/s = {wc:.2}x  target >= {TARGET_WORD_COUNT_RATIO}x  {}",
        verdict(wc >= TARGET_WORD_COUNT_RATIO)
    );
    println!(
        "  word_count --key-space 10000000, full checkpoints: disk {full_disk:.0} rec/s / heap \
         {full_heap:.0} rec/s = {:.2}x (not a target: every checkpoint writes every key)",
        full_disk / full_heap
    );
    Ok(())
}
