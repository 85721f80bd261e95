//! The invariants every schedule must keep, judged against values computed without the
//! engine: the committed output, the restore points, and the files of retained checkpoints.

use crate::external::Record;
use crate::scenario::Scenario;
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;
use weir_checkpoint::CheckpointStorage;
use weir_core::element::SnapshotKind;
use weir_core::sim::Observed;

/// The sink's committed output of the keyed running count and index sum over `records`
/// records `(i % keys, 1, i)`.
///
/// Exactly once: each key's running counts, in commit order, are exactly `1, 2, …, n` where
/// `n` counts the records of that key (no gap, no duplicate), which is also the failure-free
/// output, and its last index sum is the sum of that key's record indices (a lost record and a
/// duplicated one of the same key leave the counts right, not the sum). At least once: nothing
/// is lost (each key's count and index sum reach theirs; a recovery may count records twice).
pub fn output(committed: &[Record], records: u64, keys: u64, exactly_once: bool) -> Vec<String> {
    let mut by_key: BTreeMap<u64, Vec<(i64, i64)>> = BTreeMap::new();
    for (k, count, sum) in committed {
        by_key.entry(*k).or_default().push((*count, *sum));
    }
    let mut violations = Vec::new();
    for k in 0..keys.max(1) {
        let expected = records / keys + u64::from(k < records % keys);
        // Indices k, k + keys, …: `expected` terms.
        let expected_sum = (0..expected).map(|j| (k + j * keys) as i64).sum::<i64>();
        let got = by_key.remove(&k).unwrap_or_default();
        let counts: Vec<i64> = got.iter().map(|g| g.0).collect();
        let last_sum = got.last().map(|g| g.1);
        if exactly_once {
            if let Some(bad) = first_difference(&counts, expected) {
                violations.push(format!(
                    "exactly-once: key {k} committed {} counts, expected 1..={expected}; {bad}",
                    counts.len()
                ));
            } else if expected > 0 && last_sum != Some(expected_sum) {
                violations.push(format!(
                    "exactly-once: key {k}'s index sum is {last_sum:?}, expected {expected_sum}: \
                     a record lost and another counted twice"
                ));
            }
        } else {
            let max_count = counts.iter().max().copied().unwrap_or(0);
            let max_sum = got.iter().map(|g| g.1).max().unwrap_or(0);
            if max_count < expected as i64 || max_sum < expected_sum {
                violations.push(format!(
                    "at-least-once: key {k} committed at most count {max_count} and index sum \
                     {max_sum}, expected {expected} and {expected_sum}: records lost"
                ));
            }
        }
    }
    if let Some((k, _)) = by_key.first_key_value() {
        violations.push(format!("the sink committed key {k}, which no record has"));
    }
    violations
}

/// Where `sums` first differs from `1..=n`, in words.
fn first_difference(sums: &[i64], n: u64) -> Option<String> {
    for (i, s) in sums.iter().enumerate() {
        let want = i as i64 + 1;
        if *s != want {
            let what = if *s < want { "a duplicate" } else { "a gap" };
            return Some(format!(
                "{what}: sum {s} where {want} was due (position {i})"
            ));
        }
    }
    match (sums.len() as u64).cmp(&n) {
        std::cmp::Ordering::Less => Some(format!("it stops at {}: records lost", sums.len())),
        std::cmp::Ordering::Greater => Some(format!(
            "it goes on to {}: records counted twice",
            sums.len()
        )),
        std::cmp::Ordering::Equal => None,
    }
}

/// Every restore is from a checkpoint or savepoint that completed (its `_metadata` was
/// written) before it, and never from an older one than the newest complete checkpoint (the
/// sinks may have committed its transactions; intermediate savepoints commit none and are not
/// failover restore points); a deployment starts empty only while no checkpoint completed; and
/// no restore passes a checkpoint over (no file is damaged in a simulation, and a transient
/// storage fault is retried, not a reason to fall back).
pub fn restores(observed: &[(Duration, Observed)]) -> Vec<String> {
    let mut completed = BTreeSet::new();
    // The newest checkpoint whose completion sinks commit on.
    let mut committed: Option<u64> = None;
    let mut violations = Vec::new();
    for (at, event) in observed {
        match event {
            Observed::Completed(id, kind) => {
                completed.insert(*id);
                if *kind != SnapshotKind::Savepoint {
                    committed = committed.max(Some(*id));
                }
            }
            Observed::Restored(id) if !completed.contains(id) => violations.push(format!(
                "at {at:?}, a deployment restored checkpoint {id}, which never completed"
            )),
            Observed::Restored(id) if committed.is_some_and(|c| *id < c) => {
                violations.push(format!(
                    "at {at:?}, a deployment restored checkpoint {id}, older than the newest \
                     complete checkpoint {committed:?}, whose output sinks may have committed"
                ))
            }
            Observed::Unusable { checkpoint, reason } => violations.push(format!(
                "at {at:?}, the restore found {checkpoint} unusable: {reason}"
            )),
            Observed::StartedEmpty if committed.is_some() => violations.push(format!(
                "at {at:?}, a deployment started empty although checkpoint {committed:?} had \
                 completed"
            )),
            _ => {}
        }
    }
    violations
}

/// Every checkpoint still retained (its `_metadata` present) reads whole: each file it names
/// exists and matches its digest.
pub async fn retained_checkpoints(
    storage: &dyn CheckpointStorage,
    scenario: &Scenario,
) -> Vec<String> {
    let mut violations = Vec::new();
    // Both processes' job directories (a resumed job is a new job).
    let mut listed = Vec::new();
    for process in 0..2 {
        match storage.list_checkpoints(scenario.job_id_of(process)).await {
            Ok(l) => listed.extend(l),
            Err(e) => return vec![format!("cannot list the checkpoints: {e}")],
        }
    }
    for listing in listed.iter().filter(|l| l.complete) {
        let location = &listing.location;
        let metadata = match storage.read_metadata(location).await {
            Ok(m) => m,
            Err(e) => {
                violations.push(format!("checkpoint {}: {e}", listing.id.0));
                continue;
            }
        };
        for handle in metadata.handles() {
            if let Err(e) = storage.read_state(location, handle, None).await {
                violations.push(format!(
                    "completed checkpoint {} references a file it cannot read: {e}",
                    listing.id.0
                ));
            }
        }
    }
    violations
}
