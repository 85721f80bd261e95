//! The on-disk keyed-state backend (`disk`, Flink's embedded RocksDB backend in shape): keyed
//! state larger than memory, in immutable sorted runs on local disk behind a memtable.
//!
//! - [`store`]: [`DiskKeyedStore`], the [`KeyedStore`](crate::store::KeyedStore) itself: the
//!   key-group prefix layout, the flush and compaction threads, snapshots by freezing.
//! - `run`: the run file format (versioned, identified, a digest per block) and its reader.
//! - `merge`: the memtable, and the newest-wins merge of memtables and runs.
//! - `index`: a run's index and filter, in partitions loaded when first read.
//! - `bloom`: the bloom filter of a run's partition.
//! - `bulk`: the bulk load of a restored state straight into a run.
//!
//! [`DiskStateBackend`](crate::DiskStateBackend) gives each keyed operator's subtask a store of its own under one local
//! directory; every typed state kind, TTL and timers come from
//! [`StoreKeyedStateBackend`](crate::store::StoreKeyedStateBackend) over it, and its
//! snapshots are the canonical keyed snapshot format (a disk snapshot restores into the heap
//! backend and the other way round, at any parallelism).

mod bloom;
mod bulk;
mod index;
mod merge;
mod restore;
mod run;
pub mod store;

pub(crate) use run::check_file as check_run_file;
pub use store::{DiskKeyedStore, DiskStats, NATIVE_FORMAT, NATIVE_FORMATS_READ};

/// How a [`DiskKeyedStore`] sizes its memtables, filters and compactions.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct DiskOptions {
    /// A memtable is handed to the flush thread when it holds about this many bytes (Flink's
    /// `state.backend.rocksdb.writebuffer.size`). Default 8 MiB.
    pub memtable_bytes: usize,
    /// Writes wait while this many full memtables wait for the flush thread. Default 2.
    pub max_immutable_memtables: usize,
    /// Bits of bloom filter per key in each run above the oldest (the oldest run, which holds
    /// most keys, has none: a lookup that reaches it would read a block anyway). Default 10.
    pub bloom_bits_per_key: u32,
    /// Universal compaction's size ratio, in percent: a run joins a merge of newer runs when it
    /// is at most `100 + size_ratio` percent of their total. Default 100.
    pub size_ratio: u32,
    /// Writes wait while the store has this many runs, and from this many on compaction merges
    /// the newest runs whatever their sizes, down to half as many (RocksDB's
    /// `level0_stop_writes_trigger`, 36 by default, where universal compaction counts every
    /// sorted run). Each run costs every point lookup a filter probe and every restore a file
    /// to open, so this bound keeps both from growing with the state when writes outpace
    /// compaction. Default 32; at least 4.
    pub max_runs: usize,
}

impl Default for DiskOptions {
    fn default() -> Self {
        DiskOptions {
            memtable_bytes: 8 << 20,
            max_immutable_memtables: 2,
            bloom_bits_per_key: 10,
            size_ratio: 100,
            max_runs: 32,
        }
    }
}

impl DiskOptions {
    /// These options with memtables of `bytes` (at least 4 KiB).
    pub fn with_memtable_bytes(mut self, bytes: usize) -> Self {
        self.memtable_bytes = bytes.max(4096);
        self
    }
}

/// The process id a store's or a restore's directory name carries (`...-p<pid>-...`).
fn owner_pid(name: &str) -> Option<u32> {
    name.split('-')
        .find_map(|part| part.strip_prefix('p')?.parse().ok())
}

/// The lock file of a store's directory.
pub const LOCK_FILE: &str = "LOCK";

/// Removes, under a backend's directory, the stores and restore downloads of processes that no
/// longer run (a killed process cannot remove its own), and returns how many went. A store's
/// directory goes when its `LOCK` can be locked (the advisory lock a live store holds, in any
/// process namespace); a directory without one (a restore's download) when the process its
/// name carries does not run (Linux only). Anything else is left alone.
pub fn remove_dead_stores(dir: &std::path::Path) -> usize {
    let mut removed = 0;
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(pid) = owner_pid(&name) else {
            continue;
        };
        if !entry.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        let dead = match std::fs::File::open(entry.path().join(LOCK_FILE)) {
            // Locked here and now: its store is gone (the lock goes with the directory).
            Ok(lock) => lock.try_lock().is_ok(),
            Err(_) => {
                cfg!(target_os = "linux")
                    && !std::path::Path::new("/proc").join(pid.to_string()).exists()
            }
        };
        if dead && std::fs::remove_dir_all(entry.path()).is_ok() {
            removed += 1;
        }
    }
    removed
}

/// LEB128 varints, as the run format writes lengths.
pub(crate) mod varint {
    /// Appends `n`.
    pub(crate) fn put(out: &mut Vec<u8>, mut n: u64) {
        while n >= 0x80 {
            out.push((n as u8) | 0x80);
            n >>= 7;
        }
        out.push(n as u8);
    }

    /// Reads one at `*at` and moves past it.
    pub(crate) fn get(bytes: &[u8], at: &mut usize) -> Result<u64, String> {
        let mut n = 0u64;
        for shift in (0..64).step_by(7) {
            let Some(&b) = bytes.get(*at) else {
                return Err("a length runs past its block".to_string());
            };
            *at += 1;
            n |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Ok(n);
            }
        }
        Err("a length of more than 64 bits".to_string())
    }
}

#[cfg(test)]
mod model_tests;
#[cfg(test)]
mod tests;
