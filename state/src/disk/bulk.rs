//! Bulk load of a restored state into a [`DiskKeyedStore`]: its entries, already in key order,
//! written straight into one run, with no memtable, flush or compaction on the way (how
//! Flink's RocksDB backend ingests a canonical savepoint).

use super::run::{Run, RunIdentity, RunWriter};
use super::store::{DiskKeyedStore, Version, prefix};
use crate::StateError;
use crate::store::{BulkLoad, StoreStateId};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use weir_core::keygroup::KeyGroup;

/// A bulk load in progress: a run being written. Dropped unfinished, it removes its file.
pub(super) struct DiskBulkLoad<'a> {
    store: &'a mut DiskKeyedStore,
    state: StoreStateId,
    writer: Option<RunWriter>,
    path: PathBuf,
    identity: RunIdentity,
    key: Vec<u8>,
}

impl<'a> DiskBulkLoad<'a> {
    /// Starts writing the run of `state`'s entries.
    pub(super) fn start(
        store: &'a mut DiskKeyedStore,
        state: StoreStateId,
    ) -> Result<Self, StateError> {
        store.refresh()?;
        let (path, identity) = store.shared.new_run_path();
        // With filters, unlike the oldest run it joins: each restored state is a run of its
        // own, and keys are laid out by key group first, so a run spans the key range of every
        // other state; without filters a lookup would read a block from each.
        let bits = store.shared.options.bloom_bits_per_key;
        let writer = RunWriter::create(&path, &identity, bits)?;
        Ok(DiskBulkLoad {
            store,
            state,
            writer: Some(writer),
            path,
            identity,
            key: Vec::new(),
        })
    }
}

impl Drop for DiskBulkLoad<'_> {
    fn drop(&mut self) {
        if self.writer.take().is_some() {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

impl BulkLoad for DiskBulkLoad<'_> {
    fn add(&mut self, key_group: KeyGroup, key: &[u8], value: &[u8]) -> Result<(), StateError> {
        let Some(writer) = self.writer.as_mut() else {
            return Err(StateError::Restore(
                "a bulk load used after it failed".into(),
            ));
        };
        if !self.store.shared.range.contains(key_group) {
            return Err(StateError::Restore(format!(
                "a bulk load hands over key group {key_group}, outside the store's {}",
                self.store.shared.range
            )));
        }
        self.key.clear();
        self.key
            .extend_from_slice(&prefix(self.state, key_group).to_be_bytes());
        self.key.extend_from_slice(key);
        if writer.entries() > 0 && self.key.as_slice() <= writer.last_key() {
            return Err(StateError::Restore(format!(
                "a bulk load of state {} hands over a key of key group {key_group} out of order",
                self.state
            )));
        }
        writer.add(&self.key, Some(value))
    }

    fn finish(mut self: Box<Self>) -> Result<(), StateError> {
        let Some(writer) = self.writer.take() else {
            return Err(StateError::Restore(
                "a bulk load used after it failed".into(),
            ));
        };
        let entries = writer.entries();
        if entries == 0 {
            drop(writer);
            let _ = std::fs::remove_file(&self.path);
            return Ok(());
        }
        let finished = writer.finish().and_then(|path| {
            let shared = &self.store.shared;
            Run::open(
                &path,
                &self.identity,
                shared.range,
                Some(Arc::clone(&shared.dir)),
            )
        });
        let run = match finished {
            Ok(run) => Arc::new(run),
            Err(e) => {
                let _ = std::fs::remove_file(&self.path);
                return Err(e);
            }
        };
        let shared = Arc::clone(&self.store.shared);
        let mut inner = shared.lock();
        if let Some(e) = &inner.error {
            // A flush or compaction failed meanwhile: the store is broken, and says so now.
            let _ = std::fs::remove_file(&self.path);
            return Err(StateError::Disk {
                path: shared.dir.path.clone(),
                reason: format!("a background flush or compaction failed: {e}"),
            });
        }
        let old = Arc::clone(&inner.version);
        // The oldest run: nothing else holds this state's keys (it is loaded at registration,
        // before any write to it), and universal compaction expects the largest runs last.
        let mut runs = old.runs.clone();
        runs.push(run);
        shared.publish(
            &mut inner,
            Version {
                immutables: old.immutables.clone(),
                runs,
            },
        );
        self.store.take_version(&mut inner, true);
        self.store.seen = inner.generation;
        drop(inner);
        shared.stats.bulk_loads.fetch_add(1, Ordering::Relaxed);
        shared
            .stats
            .bulk_loaded_entries
            .fetch_add(entries, Ordering::Relaxed);
        Ok(())
    }
}
