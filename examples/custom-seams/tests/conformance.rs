//! The three seams' conformance suites on this crate's implementations, one test per check:
//! `BTreeMapStore` (through `StoreKeyedStateBackend`), `CountingStorage` and
//! `CountingTransport`; and a `BTreeMapStore` whose freeze shares the live maps, which the keyed
//! suite must refuse.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use weir_core::keygroup::{KeyGroup, KeyGroupRange};
use weir_example_custom_seams::{BTreeMapStore, CountingStorage, CountingTransport};
use weir_network::{ChannelConfig, LocalTransport};
use weir_state::StateError;
use weir_state::StateKey;
use weir_state::store::{
    EntryVisitor, FrozenStore, KeyedStore, StoreKeyedStateBackend, StoreStateId,
};

fn btreemap<K: StateKey>(max_p: u32, range: KeyGroupRange) -> StoreKeyedStateBackend<K> {
    StoreKeyedStateBackend::new(Box::new(BTreeMapStore::new()), max_p, range)
}

/// `BTreeMapStore` through the typed store backend: one test per keyed-state check.
mod btreemap_store {
    use super::btreemap;
    weir_state::keyed_backend_conformance!(btreemap::<String>, btreemap::<u64>);
}

/// A fresh `CountingStorage` over a temporary directory of its own (removed with it).
async fn counting_storage() -> CountingStorage {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("checkpoints");
    CountingStorage::fs("counting-conformance", &root, Arc::default())
        .unwrap()
        .with_guard(dir)
}

/// `CountingStorage`: one test per checkpoint-storage check.
mod counting_storage {
    use super::counting_storage;
    weir_checkpoint::checkpoint_storage_conformance!(counting_storage);
}

/// `CountingTransport` over the in-process transport with `credits` per channel.
fn counting_transport(credits: usize) -> CountingTransport {
    let local = LocalTransport::new(ChannelConfig {
        buffers_per_channel: credits,
    });
    CountingTransport::new(Arc::new(local), Arc::default())
}

/// `CountingTransport`: one test per transport check.
mod counting_transport {
    use super::counting_transport;
    weir_network::transport_conformance!(counting_transport);
}

/// The storage's counters see what the suite does, and its URLs name its directory.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_storage_counts_what_the_suite_does() {
    let storage = counting_storage().await;
    weir_checkpoint::storage::conformance::check_read_after_write(&storage).await;
    weir_checkpoint::storage::conformance::check_metadata_round_trip(&storage).await;
    let counts = storage.counters().get();
    assert!(
        counts.state_writes > 0 && counts.state_reads > 0,
        "{counts:?}"
    );
    assert!(
        counts.metadata_writes > 0 && counts.metadata_reads > 0,
        "{counts:?}"
    );
    let completed = storage.counters().completed();
    assert_eq!(completed.len() as u64, counts.metadata_writes);
    use weir_checkpoint::CheckpointStorage;
    let url = storage.describe();
    assert!(url.starts_with("counting-conformance:///"), "{url}");
    assert!(
        completed.iter().all(|c| c.starts_with(&url)),
        "{completed:?}"
    );
}

/// A `BTreeMapStore` whose freeze hands out the live maps: writes after a snapshot's
/// synchronous part leak into what it writes out.
struct LeakyFreeze {
    live: BTreeMapStore,
    /// The shared maps: the live store writes them, the "frozen" view reads them.
    shared: Arc<std::sync::Mutex<BTreeMapStore>>,
}

impl LeakyFreeze {
    fn new() -> Self {
        LeakyFreeze {
            live: BTreeMapStore::new(),
            shared: Arc::default(),
        }
    }
}

impl KeyedStore for LeakyFreeze {
    fn get(
        &mut self,
        state: StoreStateId,
        kg: KeyGroup,
        key: &[u8],
        value: &mut Vec<u8>,
    ) -> Result<bool, StateError> {
        self.live.get(state, kg, key, value)
    }

    fn put(
        &mut self,
        state: StoreStateId,
        kg: KeyGroup,
        key: &[u8],
        value: &[u8],
    ) -> Result<(), StateError> {
        self.shared.lock().unwrap().put(state, kg, key, value)?;
        self.live.put(state, kg, key, value)
    }

    fn delete(&mut self, state: StoreStateId, kg: KeyGroup, key: &[u8]) -> Result<(), StateError> {
        self.shared.lock().unwrap().delete(state, kg, key)?;
        self.live.delete(state, kg, key)
    }

    fn scan(
        &mut self,
        state: StoreStateId,
        kg: KeyGroup,
        visit: &mut EntryVisitor<'_>,
    ) -> Result<(), StateError> {
        self.live.scan(state, kg, visit)
    }

    fn freeze(&mut self) -> Result<Box<dyn FrozenStore>, StateError> {
        Ok(Box::new(SharedView(self.shared.clone())))
    }
}

/// The "frozen" view of [`LeakyFreeze`]: the maps the live store still writes.
struct SharedView(Arc<std::sync::Mutex<BTreeMapStore>>);

impl FrozenStore for SharedView {
    fn scan(
        &self,
        state: StoreStateId,
        kg: KeyGroup,
        visit: &mut EntryVisitor<'_>,
    ) -> Result<(), StateError> {
        self.0.lock().unwrap().scan(state, kg, visit)
    }
}

/// The suite refuses a store whose frozen view changes after the freeze: a snapshot written
/// after later updates holds them. `snapshot_isolation` catches it when its writer thread loses
/// the race with those updates; the model check, which writes its snapshots after the updates
/// that follow them, catches it every time.
#[test]
fn a_freeze_that_shares_the_live_maps_fails_the_keyed_suite() {
    fn leaky<K: StateKey>(max_p: u32, range: KeyGroupRange) -> StoreKeyedStateBackend<K> {
        StoreKeyedStateBackend::new(Box::new(LeakyFreeze::new()), max_p, range)
    }
    let failed = std::panic::catch_unwind(|| {
        weir_state::conformance::run_all(leaky::<String>, leaky::<u64>)
    });
    let message = failed
        .err()
        .and_then(|p| p.downcast_ref::<String>().cloned())
        .expect("the keyed suite passed a store whose freeze shares the live maps");
    assert!(
        message.contains("keyed-state conformance [") && message.contains("as it was at"),
        "{message}"
    );
}
