//! `FaultInjectingStorage` as a storage: with no faults it passes the checkpoint-storage
//! conformance suite over the memory and fs services (with and without a delay), and with faults
//! the suite notices them.

use std::sync::Arc;
use std::time::Duration;
use weir_checkpoint::storage::conformance;
use weir_checkpoint::storage::faults::{FaultInjectingStorage, OpKind, SleepFn};
use weir_checkpoint::{CheckpointStorage, OpendalCheckpointStorage};

#[tokio::test]
async fn without_faults_it_passes_the_conformance_suite_over_memory() {
    let inner = Arc::new(OpendalCheckpointStorage::memory().unwrap());
    let storage = FaultInjectingStorage::new(inner.clone(), 1234);
    assert_eq!(storage.describe(), "memory://");
    conformance::run_all_with_raw(&storage, inner.operator()).await;
    conformance::check_inline_threshold(&storage, inner.inline_threshold()).await;
    let stats = storage.stats();
    assert_eq!(stats.injected_faults(), 0);
    assert!(stats.writes > 50 && stats.reads > 50, "{stats:?}");
    assert!(stats.operations >= stats.writes + stats.reads);
}

#[tokio::test]
async fn without_faults_it_passes_the_conformance_suite_over_fs_with_a_delay() {
    let dir = tempfile::tempdir().unwrap();
    let inner = Arc::new(OpendalCheckpointStorage::fs(dir.path()).unwrap());
    let sleep: SleepFn = Arc::new(|d| Box::pin(tokio::time::sleep(d)));
    let storage = FaultInjectingStorage::new(inner.clone(), 99)
        .with_write_faults(0.0)
        .unwrap()
        .with_read_faults(0.0)
        .unwrap()
        .with_delay(Duration::from_micros(50), sleep);
    conformance::run_all_with_raw(&storage, inner.operator()).await;
    assert_eq!(storage.injected_faults(), 0);
}

#[tokio::test]
async fn with_faults_the_suite_fails() {
    for kind in [OpKind::Write, OpKind::Read] {
        let inner = Arc::new(OpendalCheckpointStorage::memory().unwrap());
        let storage = Arc::new(FaultInjectingStorage::new(inner, 5));
        storage.set_fault_rate(kind, 0.3).unwrap();
        let s = storage.clone();
        let run = tokio::spawn(async move { conformance::run_all(s.as_ref()).await });
        let e = run.await.unwrap_err();
        assert!(
            e.is_panic(),
            "{kind}: the suite must fail on injected faults"
        );
        assert!(storage.injected_faults() > 0);
    }
}
