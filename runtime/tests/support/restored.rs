//! Proving a restore from a `JobResult`: the run names what it restored from and its sources
//! resumed rather than started over. Included with `#[path]` by the runtime's and the examples'
//! test support modules.

/// Asserts that a run restored: it names the checkpoint or savepoint it restored from, and its
/// sources emitted fewer than the job's `total` records in this run (they resumed rather than
/// started over). The caller checks that the results are exact, which, with these two, is only
/// possible when the restored state was used.
pub fn assert_restored(result: &weir_runtime::JobResult, total: u64, ctx: &str) {
    let from = result
        .restored_from
        .as_deref()
        .unwrap_or_else(|| panic!("{ctx}: the run did not restore"));
    assert!(
        result.source_records_since_restore < total,
        "{ctx}: restored from {from}, the sources emitted {} of {total} records: they started over",
        result.source_records_since_restore
    );
}

/// After failures: the latest restore resumed the sources (they emitted fewer than `total`
/// records since it), which, with exact results, is only possible when the restored state was
/// used. A job whose failures all came before its first checkpoint had nothing to restore.
pub fn assert_resumed(r: &weir_runtime::JobResult, total: u64, ctx: &str) {
    if r.restarts == 0 || r.restored_from.is_none() {
        return;
    }
    assert!(
        r.source_records_since_restore < total,
        "{ctx}: after the latest restore the sources emitted {} of {total} records: they started over",
        r.source_records_since_restore
    );
}
