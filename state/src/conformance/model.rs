//! The random model check of value states: [`ModelOp`]s run against a `HashMap` model.

use super::helpers::{Cx, SplitMix64, content, finish, fresh, full, restored};
use super::{MODEL_KEYS, SuiteKey};
use crate::keyed::KeyedStateBackend;
use std::collections::{HashMap, HashSet};
use std::fmt::Debug;
use weir_core::keygroup::{
    KeyGroupRange, assign_to_key_group, compute_key_group_range_for_operator_index,
};

/// One step of the model check.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ModelOp {
    /// Sets key `K::nth(k)`'s `count` through `value_mut_or_insert`.
    Set(u16, u64),
    /// Adds (wrapping) to key `K::nth(k)`'s `count` through `value_mut_or_insert`, from 0.
    Add(u16, u64),
    /// Sets key `K::nth(k)`'s `name` through `update`.
    Name(u16, String),
    /// Clears key `K::nth(k)` in both states.
    Clear(u16),
    /// Takes a snapshot; it is written after the last operation.
    Snapshot,
}

/// Runs `ops` against a fresh backend of the whole range of `max_parallelism` and a `HashMap`
/// model. The live backend must agree with the model, and every snapshot (one per
/// [`ModelOp::Snapshot`], and one at the end) must hold the model as it was then, restored whole
/// and split across `parallelism` backends (clamped to `1..=max_parallelism`).
pub fn check_against_model<K: SuiteKey, B: KeyedStateBackend<K>>(
    make: impl Fn(u32, KeyGroupRange) -> B,
    max_parallelism: u32,
    parallelism: u32,
    ops: &[ModelOp],
) {
    let cx = Cx::new::<B>(format!(
        "model (max parallelism {max_parallelism}, parallelism {parallelism}, {} ops)",
        ops.len()
    ));
    model_case(&cx, &make, max_parallelism, parallelism, ops);
}

/// Runs `cases` random model checks from `seed`: max parallelism 1, 7 or 128, parallelism 1 to 4,
/// up to 400 operations over [`MODEL_KEYS`] keys, names of mixed scripts. A failure names the seed
/// and case.
pub fn check_random_models<K: SuiteKey, B: KeyedStateBackend<K>>(
    make: impl Fn(u32, KeyGroupRange) -> B,
    seed: u64,
    cases: u32,
) {
    const CHARS: [char; 10] = ['a', 'q', 'z', ' ', 'é', 'ß', 'я', '語', '🦀', '\0'];
    let mut rng = SplitMix64(seed);
    for case in 0..cases {
        let max_p = [1, 7, 128][rng.below(3) as usize];
        let parallelism = (1 + rng.below(4) as u32).min(max_p);
        let len = rng.below(400) as usize;
        let ops: Vec<ModelOp> = (0..len)
            .map(|_| {
                let key = rng.below(u64::from(MODEL_KEYS)) as u16;
                match rng.below(8) {
                    0..=2 => ModelOp::Set(key, rng.next_u64()),
                    3 => ModelOp::Add(key, rng.next_u64() >> rng.below(64)),
                    4 | 5 => {
                        let n = rng.below(9) as usize;
                        let name = (0..n)
                            .map(|_| CHARS[rng.below(CHARS.len() as u64) as usize])
                            .collect();
                        ModelOp::Name(key, name)
                    }
                    6 => ModelOp::Clear(key),
                    _ => ModelOp::Snapshot,
                }
            })
            .collect();
        let cx = Cx::new::<B>(format!(
            "model (seed {seed:#x}, case {case}: max parallelism {max_p}, parallelism \
             {parallelism}, {len} ops)"
        ));
        model_case(&cx, &make, max_p, parallelism, &ops);
    }
}

fn model_case<K: SuiteKey, B: KeyedStateBackend<K>>(
    cx: &Cx,
    make: &impl Fn(u32, KeyGroupRange) -> B,
    max_p: u32,
    parallelism: u32,
    ops: &[ModelOp],
) {
    let parallelism = parallelism.clamp(1, max_p);
    let mut b = fresh(cx, make, max_p, full(max_p));
    let count = b.register::<u64>("count");
    let name = b.register::<String>("name");
    let mut counts: HashMap<K, u64> = HashMap::new();
    let mut names: HashMap<K, String> = HashMap::new();
    let mut touched: Vec<K> = Vec::new();
    let mut seen = HashSet::new();
    let mut pending = Vec::new();
    for op in ops {
        let key = match op {
            ModelOp::Set(k, _) | ModelOp::Add(k, _) | ModelOp::Name(k, _) | ModelOp::Clear(k) => {
                let key = K::nth(u64::from(*k));
                if seen.insert(*k) {
                    touched.push(key.clone());
                }
                key
            }
            ModelOp::Snapshot => {
                pending.push((
                    cx.ok("snapshot", b.b.snapshot()),
                    counts.clone(),
                    names.clone(),
                ));
                continue;
            }
        };
        let g = b.kg(&key);
        match op {
            ModelOp::Set(_, v) => {
                *b.b.value_mut_or_insert(count, &key, g, || 0) = *v;
                counts.insert(key, *v);
            }
            ModelOp::Add(_, d) => {
                let v = b.b.value_mut_or_insert(count, &key, g, || 0);
                *v = v.wrapping_add(*d);
                let m = counts.entry(key).or_insert(0);
                *m = m.wrapping_add(*d);
            }
            ModelOp::Name(_, v) => {
                b.b.update(name, &key, g, v.clone());
                names.insert(key, v.clone());
            }
            ModelOp::Clear(_) => {
                b.b.clear(count, &key, g);
                b.b.clear(name, &key, g);
                counts.remove(&key);
                names.remove(&key);
            }
            ModelOp::Snapshot => {}
        }
    }
    b.read_back(
        "the live backend agrees with the model",
        count,
        &counts,
        &touched,
    );
    b.read_back(
        "the live backend agrees with the model",
        name,
        &names,
        &touched,
    );
    pending.push((cx.ok("snapshot", b.b.snapshot()), counts, names));

    for (i, (snapshot, counts, names)) in pending.into_iter().enumerate() {
        let w = finish::<K>(cx, snapshot, max_p, full(max_p));
        let rule = format!("snapshot {i} holds the model as it was at its snapshot()");
        cx.same_map(&rule, &content::<K, u64>(cx, &w, "count"), &counts);
        cx.same_map(&rule, &content::<K, String>(cx, &w, "name"), &names);

        let mut whole = cx.ok(
            "restoring the whole snapshot",
            restored(cx, make, max_p, full(max_p), &[&w]),
        );
        let c = whole.register::<u64>("count");
        let n = whole.register::<String>("name");
        let rule = format!("snapshot {i}, restored whole, reads back as the model");
        whole.read_back(&rule, c, &counts, &touched);
        whole.read_back(&rule, n, &names, &touched);

        let mut seen_counts = HashMap::new();
        let mut seen_names = HashMap::new();
        for p in 0..parallelism {
            let range = compute_key_group_range_for_operator_index(max_p, parallelism, p);
            let mut part = cx.ok(
                &format!("restoring key groups {range}"),
                restored(cx, make, max_p, range, &[&w]),
            );
            let c = part.register::<u64>("count");
            let n = part.register::<String>("name");
            let own = |k: &&K| range.contains(assign_to_key_group(*k, max_p));
            let own_keys: Vec<&K> = touched.iter().filter(own).collect();
            let own_counts: HashMap<K, u64> = counts
                .iter()
                .filter(|(k, _)| own(k))
                .map(|(k, v)| (k.clone(), *v))
                .collect();
            let own_names: HashMap<K, String> = names
                .iter()
                .filter(|(k, _)| own(k))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            let rule = format!(
                "snapshot {i}, restored into key groups {range} of {parallelism}, reads back as \
                 the model"
            );
            part.read_back(&rule, c, &own_counts, own_keys.iter().copied());
            part.read_back(&rule, n, &own_names, own_keys.iter().copied());
            let pw = part.write();
            let rule = format!(
                "snapshot {i}, restored into key groups {range}, holds only its key groups"
            );
            for (k, v) in content::<K, u64>(cx, &pw, "count") {
                cx.must(seen_counts.insert(k.clone(), v).is_none(), || {
                    format!("{rule}: {k:?} is in two parts")
                });
            }
            for (k, v) in content::<K, String>(cx, &pw, "name") {
                cx.must(seen_names.insert(k.clone(), v).is_none(), || {
                    format!("{rule}: {k:?} is in two parts")
                });
            }
        }
        let rule = format!("snapshot {i}, split across {parallelism}, holds the model");
        cx.same_map(&rule, &seen_counts, &counts);
        cx.same_map(&rule, &seen_names, &names);
    }
}
