//! The incremental snapshot checks: deltas, chains and their restore rules.

use super::helpers::{
    Cx, SplitMix64, Subject, Written, content, finish, fresh, full, header_of, keys, restored,
    whole_part,
};
use super::{MODEL_KEYS, MODEL_SEED, SuiteKey};
use crate::format;
use crate::keyed::{KeyedStateBackend, SnapshotScope, StateValue, ValueState};
use std::collections::{BTreeMap, HashMap, HashSet};
use weir_core::keygroup::{KeyGroupRange, assign_to_key_group};

/// How many random cases [`run_incremental_checks`] runs per key type.
pub const INCREMENTAL_CASES: u32 = 9;

/// Runs the incremental checks. `make` must return a fresh, empty backend in incremental mode
/// whose chains may hold at least 4 snapshots.
pub fn run_incremental_checks<K: SuiteKey, B: KeyedStateBackend<K>>(
    make: impl Fn(u32, KeyGroupRange) -> B,
) {
    check_incremental_model(&make, MODEL_SEED, INCREMENTAL_CASES);
    check_incremental_restore_rules(&make);
}

/// Random changes over a run of checkpoints, each confirmed, aborted or left pending at random,
/// with savepoints between:
/// - every incremental snapshot is a delta on the latest confirmed checkpoint (none after
///   [`KeyedStateBackend::start_new_chain`]), or a full one;
/// - a delta holds every key whose value differs from the base's, with its current value (a
///   removed key as a tombstone), and no key untouched since the base's snapshot;
/// - a savepoint ([`KeyedStateBackend::snapshot`]) is self-contained and holds the whole state;
/// - every chain, restored whole and split over two backends, reads back the state of its
///   moment, and a full snapshot of the restored backend holds exactly that state.
pub fn check_incremental_model<K: SuiteKey, B: KeyedStateBackend<K>>(
    make: &impl Fn(u32, KeyGroupRange) -> B,
    seed: u64,
    cases: u32,
) {
    let cx = Cx::new::<B>("incremental_model");
    let mut rng = SplitMix64(seed ^ 0x696e_6372);
    for case in 0..cases {
        let max_p = [4u32, 16, 128][case as usize % 3];
        let mut b = fresh(&cx, make, max_p, full(max_p));
        let count = b.register::<u64>("count");
        let mut late: Option<ValueState<String>> = None;
        let mut counts: HashMap<K, u64> = HashMap::new();
        let mut names: HashMap<K, String> = HashMap::new();
        let mut store: Vec<Written> = Vec::new();
        let mut chains: BTreeMap<u64, Vec<usize>> = BTreeMap::new();
        let mut confirmed: Option<u64> = None;
        let mut pending: Vec<u64> = Vec::new();
        let mut touched_since: BTreeMap<u64, HashSet<K>> = BTreeMap::new();
        let mut counts_at: BTreeMap<u64, HashMap<K, u64>> = BTreeMap::new();
        for id in 1..=12u64 {
            incremental_model_changes(
                &mut b,
                &mut rng,
                count,
                late,
                &mut counts,
                &mut names,
                &mut touched_since,
            );
            if id == 4 {
                late = Some(b.register::<String>("late"));
            }
            if rng.below(4) == 0 {
                let snapshot = cx.ok("snapshot (a savepoint)", b.b.snapshot());
                cx.eq(
                    "a savepoint taken in incremental mode is self-contained",
                    &snapshot.scope(),
                    &SnapshotScope::SelfContained,
                );
                let w = finish::<K>(&cx, snapshot, max_p, full(max_p));
                cx.eq(
                    "a savepoint holds the whole state",
                    &content::<K, u64>(&cx, &w, "count"),
                    &counts,
                );
            }
            let snapshot = cx.ok("snapshot_incremental", b.b.snapshot_incremental(id));
            let base = match snapshot.scope() {
                SnapshotScope::Incremental { base } => base,
                SnapshotScope::SelfContained => cx.fail(format!(
                    "snapshot_incremental({id}) of a backend in incremental mode is \
                     self-contained"
                )),
            };
            let w = finish::<K>(&cx, snapshot, max_p, full(max_p));
            let header = header_of(&cx, &w);
            cx.eq(
                "a delta's header says it is one",
                &header.delta,
                &base.is_some(),
            );
            let mut chain = Vec::new();
            if let Some(base) = base {
                cx.eq(
                    &format!("checkpoint {id}'s delta is on the latest confirmed checkpoint"),
                    &Some(base),
                    &confirmed,
                );
                check_delta_content(&cx, &w, id, base, &counts, &touched_since, &counts_at);
                chain = chains[&base].clone();
            }
            store.push(w);
            chain.push(store.len() - 1);
            let links: Vec<&Written> = chain.iter().map(|&i| &store[i]).collect();
            verify_chain(&cx, make, max_p, &links, &counts, late.map(|_| &names));
            chains.insert(id, chain);
            touched_since.insert(id, HashSet::new());
            counts_at.insert(id, counts.clone());
            // Confirm this checkpoint or an earlier one still pending (so that snapshots taken
            // after it hold changes its confirmation must not drop), abort it, or leave it.
            pending.push(id);
            pending.retain(|&p| confirmed.is_none_or(|c| p > c));
            match rng.below(5) {
                0 => {
                    b.b.notify_checkpoint_aborted(id);
                    pending.retain(|&p| p != id);
                }
                1 => {}
                2 if rng.below(3) == 0 => {
                    // The base's files are gone: the next snapshot is full.
                    b.b.start_new_chain();
                    pending.clear();
                    confirmed = None;
                }
                2 => {
                    let oldest = pending[0];
                    b.b.notify_checkpoint_complete(oldest);
                    confirmed = Some(oldest);
                }
                _ => {
                    b.b.notify_checkpoint_complete(id);
                    confirmed = Some(id);
                }
            }
        }
    }
}

/// [`check_incremental_model`]'s changes before one checkpoint: random writes and clears of
/// "count" and of "late" (once registered), applied to the models `counts` and `names` too, and
/// every key touched added to each set of `touched_since`.
fn incremental_model_changes<K: SuiteKey, B: KeyedStateBackend<K>>(
    b: &mut Subject<'_, K, B>,
    rng: &mut SplitMix64,
    count: ValueState<u64>,
    late: Option<ValueState<String>>,
    counts: &mut HashMap<K, u64>,
    names: &mut HashMap<K, String>,
    touched_since: &mut BTreeMap<u64, HashSet<K>>,
) {
    for _ in 0..rng.below(60) {
        let k = K::nth(rng.below(u64::from(MODEL_KEYS)));
        let g = b.kg(&k);
        match (rng.below(6), late) {
            (0, _) => {
                b.clear(count, &k);
                counts.remove(&k);
            }
            (1, Some(late)) => {
                let v = format!("n{}", rng.below(1000));
                b.put(late, &k, v.clone());
                names.insert(k.clone(), v);
            }
            (2, Some(late)) => {
                b.clear(late, &k);
                names.remove(&k);
            }
            (3, _) => {
                let add = rng.below(10);
                *b.b.value_mut_or_insert(count, &k, g, || 0) += add;
                *counts.entry(k.clone()).or_insert(0) += add;
            }
            _ => {
                let v = rng.below(1 << 40);
                b.put(count, &k, v);
                counts.insert(k.clone(), v);
            }
        }
        for set in touched_since.values_mut() {
            set.insert(k.clone());
        }
    }
}

/// [`check_incremental_model`]'s check of checkpoint `id`'s delta `w` on checkpoint `base`: it
/// holds every key of "count" changed since `base` with its current value, a tombstone for every
/// key removed since, and no key untouched since.
fn check_delta_content<K: SuiteKey>(
    cx: &Cx,
    w: &Written,
    id: u64,
    base: u64,
    counts: &HashMap<K, u64>,
    touched_since: &BTreeMap<u64, HashSet<K>>,
    counts_at: &BTreeMap<u64, HashMap<K, u64>>,
) {
    let (upserts, tombstones) = delta_content::<K, u64>(cx, w, "count");
    let touched = &touched_since[&base];
    let before = &counts_at[&base];
    for (k, v) in counts {
        if before.get(k) != Some(v) {
            cx.eq(
                &format!("checkpoint {id}'s delta holds {k:?}, changed since {base}"),
                &upserts.get(k),
                &Some(v),
            );
        }
    }
    for k in before.keys().filter(|k| !counts.contains_key(*k)) {
        cx.must(tombstones.contains(k), || {
            format!("checkpoint {id}'s delta has no tombstone for {k:?}, removed since {base}")
        });
    }
    for k in upserts.keys().chain(&tombstones) {
        cx.must(touched.contains(k), || {
            format!("checkpoint {id}'s delta holds {k:?}, untouched since {base}")
        });
    }
    for (k, v) in &upserts {
        cx.eq(
            &format!("checkpoint {id}'s delta holds the current value of {k:?}"),
            &counts.get(k),
            &Some(v),
        );
    }
    for k in &tombstones {
        cx.must(!counts.contains_key(k), || {
            format!("checkpoint {id}'s delta removes {k:?}, which has a value")
        });
    }
}

/// Restores `links` (a chain, in order) whole and split over two backends, and checks that they
/// read back `counts` (state "count") and `names` (state "late", when registered), and that a
/// full snapshot of the whole restore holds exactly `counts`.
fn verify_chain<K: SuiteKey, B: KeyedStateBackend<K>>(
    cx: &Cx,
    make: &impl Fn(u32, KeyGroupRange) -> B,
    max_p: u32,
    links: &[&Written],
    counts: &HashMap<K, u64>,
    names: Option<&HashMap<K, String>>,
) {
    let all = keys::<K>(u64::from(MODEL_KEYS));
    let mid = max_p / 2;
    let halves = [
        KeyGroupRange::new(0, mid - 1),
        KeyGroupRange::new(mid, max_p - 1),
    ];
    for range in std::iter::once(full(max_p)).chain(halves) {
        let mut r = match restored(cx, make, max_p, range, links) {
            Ok(r) => r,
            Err(e) => cx.fail(format!(
                "restoring a chain of {} snapshots into key groups {range} failed: {e}",
                links.len()
            )),
        };
        let own = |k: &K| range.contains(assign_to_key_group(k, max_p));
        let count = r.register::<u64>("count");
        let expected: HashMap<K, u64> = counts
            .iter()
            .filter(|(k, _)| own(k))
            .map(|(k, v)| (k.clone(), *v))
            .collect();
        r.read_back(
            &format!("a chain of {} restored into {range}", links.len()),
            count,
            &expected,
            all.iter().filter(|k| own(k)),
        );
        if let Some(names) = names {
            let late = r.register::<String>("late");
            let expected: HashMap<K, String> = names
                .iter()
                .filter(|(k, _)| own(k))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            r.read_back(
                &format!("a chain of {} restored into {range}", links.len()),
                late,
                &expected,
                all.iter().filter(|k| own(k)),
            );
        }
        if range == full(max_p) {
            let w = r.write();
            cx.eq(
                "a full snapshot of a restored chain holds the state of the chain's moment",
                &content::<K, u64>(cx, &w, "count"),
                counts,
            );
        }
    }
}

/// The entries and tombstones of state `state` in a delta.
fn delta_content<K: SuiteKey, V: StateValue>(
    cx: &Cx,
    w: &Written,
    state: &str,
) -> (HashMap<K, V>, HashSet<K>) {
    let header = header_of(cx, w);
    let Some(meta) = header.states.iter().find(|m| m.name == state) else {
        cx.fail(format!(
            "state '{state}' is missing from the delta's header"
        ))
    };
    let part = whole_part(cx, w);
    let sections = cx.ok(
        "slicing the sections",
        format::part_sections(&part, &w.handle.key_group_range),
    );
    let (mut upserts, mut tombstones) = (HashMap::new(), HashSet::new());
    for (kg, section) in sections {
        let blocks = cx.ok(
            &format!("parsing the section of key group {kg}"),
            header.parse_section(kg, section),
        );
        for block in blocks.iter().filter(|b| b.state_id == meta.id) {
            let what = format!("delta of state '{state}' in key group {kg}");
            match block.kind {
                format::BlockKind::Entries => {
                    let decoded = format::decode_entries::<K, V>(
                        &what,
                        block.entry_count,
                        block.entries,
                        |k, v| {
                            cx.must(upserts.insert(k, v).is_none(), || {
                                format!("{what}: a key appears twice")
                            });
                            Ok(())
                        },
                    );
                    cx.ok(&format!("decoding {what}"), decoded);
                }
                format::BlockKind::Tombstones => {
                    let decoded = format::decode_entries::<K, ()>(
                        &what,
                        block.entry_count,
                        block.entries,
                        |k, ()| {
                            cx.must(tombstones.insert(k), || {
                                format!("{what}: a tombstone appears twice")
                            });
                            Ok(())
                        },
                    );
                    cx.ok(&format!("decoding the tombstones of {what}"), decoded);
                }
            }
        }
    }
    (upserts, tombstones)
}

/// The rules of restoring incremental chains:
/// - a delta without its base, or before it, is an error naming a key group;
/// - a restored chain's state that is not registered is carried into the next full snapshot
///   (with its overlays) and, unchanged, past later deltas; registered later, it reads the
///   chain's values;
/// - the first incremental snapshot after a restore is a full one.
pub fn check_incremental_restore_rules<K: SuiteKey, B: KeyedStateBackend<K>>(
    make: &impl Fn(u32, KeyGroupRange) -> B,
) {
    let cx = Cx::new::<B>("incremental_restore_rules");
    let max_p = 8;
    let mut b = fresh(&cx, make, max_p, full(max_p));
    let a = b.register::<u64>("a");
    let other = b.register::<u64>("b");
    let mut a_model = HashMap::new();
    let mut b_model = HashMap::new();
    for (i, k) in keys::<K>(60).into_iter().enumerate() {
        b.put(a, &k, i as u64);
        b.put(other, &k, 2 * i as u64);
        a_model.insert(k.clone(), i as u64);
        b_model.insert(k, 2 * i as u64);
    }
    let take = |b: &mut Subject<'_, K, B>, id: u64| {
        let snapshot = cx.ok("snapshot_incremental", b.b.snapshot_incremental(id));
        let scope = snapshot.scope();
        (finish::<K>(&cx, snapshot, max_p, full(max_p)), scope)
    };
    let (w1, scope) = take(&mut b, 1);
    cx.eq(
        "the first incremental snapshot is full",
        &scope,
        &SnapshotScope::Incremental { base: None },
    );
    b.b.notify_checkpoint_complete(1);
    for (i, k) in keys::<K>(10).into_iter().enumerate() {
        b.put(a, &k, 100 + i as u64);
        b.clear(other, &k);
        a_model.insert(k.clone(), 100 + i as u64);
        b_model.remove(&k);
    }
    let (w2, scope) = take(&mut b, 2);
    cx.eq(
        "a snapshot after a confirmed checkpoint is a delta on it",
        &scope,
        &SnapshotScope::Incremental { base: Some(1) },
    );
    for links in [vec![&w2], vec![&w2, &w1]] {
        match restored(&cx, make, max_p, full(max_p), &links) {
            Ok(_) => cx.fail(format!(
                "a delta restored without its base before it ({} snapshots) was accepted",
                links.len()
            )),
            Err(e) => cx.must(e.to_string().contains("key group"), || {
                format!("a delta without its base: the error should name a key group: {e}")
            }),
        }
    }
    // Restore the chain registering only "a": "b" stays pending, with overlays.
    let mut r = match restored(&cx, make, max_p, full(max_p), &[&w1, &w2]) {
        Ok(r) => r,
        Err(e) => cx.fail(format!("restoring a chain failed: {e}")),
    };
    let a2 = r.register::<u64>("a");
    r.read_back("the chain's 'a'", a2, &a_model, []);
    let (w7, scope) = take(&mut r, 7);
    cx.eq(
        "the first incremental snapshot after a restore is full",
        &scope,
        &SnapshotScope::Incremental { base: None },
    );
    r.b.notify_checkpoint_complete(7);
    let k0 = K::nth(0);
    r.put(a2, &k0, 7);
    a_model.insert(k0, 7);
    let (w8, scope) = take(&mut r, 8);
    cx.eq(
        "a snapshot after a confirmed checkpoint is a delta on it",
        &scope,
        &SnapshotScope::Incremental { base: Some(7) },
    );
    let savepoint = r.write();
    for links in [vec![&w7, &w8], vec![&savepoint]] {
        let mut again = match restored(&cx, make, max_p, full(max_p), &links) {
            Ok(r) => r,
            Err(e) => cx.fail(format!("restoring what a restored chain wrote failed: {e}")),
        };
        let b2 = again.register::<u64>("b");
        let a3 = again.register::<u64>("a");
        again.read_back(
            "a state never registered, carried through a restore and its snapshots",
            b2,
            &b_model,
            keys::<K>(10).iter(),
        );
        again.read_back("'a' through a restore and its snapshots", a3, &a_model, []);
    }
}
