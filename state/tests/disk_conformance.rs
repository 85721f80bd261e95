//! Runs the keyed-state conformance suite against the store backend over the on-disk
//! [`DiskKeyedStore`], with memtables small enough that the suite's state goes through runs,
//! flushes and compactions.

use std::sync::Arc;
use weir_core::keygroup::KeyGroupRange;
use weir_state::disk::{DiskKeyedStore, DiskStats};
use weir_state::store::StoreKeyedStateBackend;
use weir_state::{DiskOptions, StateKey};

fn disk<K: StateKey>(max_p: u32, range: KeyGroupRange) -> StoreKeyedStateBackend<K> {
    static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = std::env::temp_dir()
        .join("weir-disk-conformance")
        .join(format!("{}-{n}", std::process::id()));
    let store = DiskKeyedStore::open(
        dir,
        format!("conformance-{n}"),
        range,
        DiskOptions::default().with_memtable_bytes(4096),
        Arc::new(DiskStats::default()),
    )
    .expect("the store opens");
    StoreKeyedStateBackend::new(Box::new(store), max_p, range)
}

/// The disk store: one test per check of the suite.
mod disk_store {
    use super::disk;
    weir_state::keyed_backend_conformance!(disk::<String>, disk::<u64>);
}
