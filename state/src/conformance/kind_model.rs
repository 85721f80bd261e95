//! State kinds' fixtures (a state of each kind, their functions, a model) and their model check.

use super::SuiteKey;
use super::helpers::{
    Cx, SplitMix64, Subject, Written, content_of, expect_incompatible, finish, fresh, full,
    restored,
};
#[cfg(doc)]
use super::run_key_checks;
use crate::StateError;
use crate::format::StateKind;
use crate::keyed::{
    AggregateFunction, AggregatingState, AggregatingStateDescriptor, KeyedAccess,
    KeyedStateBackend, ListState, ListStateDescriptor, MapState, MapStateDescriptor, ReducingState,
    ReducingStateDescriptor, ValueState, ValueStateDescriptor,
};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt::Debug;
use weir_core::keygroup::{
    KeyGroupRange, assign_to_key_group, compute_key_group_range_for_operator_index,
};

/// The seed [`run_key_checks`] drives [`check_random_kind_models`] with.
pub const KIND_MODEL_SEED: u64 = 0x4B49_4E44_5354_4154;

/// How many random cases of [`check_random_kind_models`] [`run_key_checks`] runs per key type.
pub const KIND_MODEL_CASES: u32 = 16;

/// Keys of the kind model check are `K::nth(0..KIND_MODEL_KEYS)`: few, so operations pile up on
/// the same keys.
pub const KIND_MODEL_KEYS: u16 = 60;

/// User keys of the map state in the kind model check are `0..KIND_MODEL_USER_KEYS`.
pub const KIND_MODEL_USER_KEYS: u16 = 6;

/// The default of the kind checks' value state.
pub(super) const KIND_DEFAULT: u64 = 0xDEFA;

pub(super) const K_VALUE: &str = "k-value";
pub(super) const K_LIST: &str = "k-list";
pub(super) const K_MAP: &str = "k-map";
pub(super) const K_REDUCING: &str = "k-reducing";
pub(super) const K_AGGREGATING: &str = "k-aggregating";

/// The reduce function of the kind checks: not commutative, and `fold(0, v) != v`, so a first
/// value folded into something instead of stored as is shows, and so does a wrong order.
pub(super) fn fold(a: &u64, b: &u64) -> u64 {
    a.wrapping_mul(31).wrapping_add(*b).wrapping_add(1)
}

/// The accumulator of [`CountMinMax`]: count, min, max.
pub(super) type Acc = (u64, u32, u32);

/// The aggregate function of the kind checks: the count, min and max of `u32` inputs, read as a
/// string. Its accumulator does not start at `Default` (the min starts at `u32::MAX`), so an
/// accumulator not made by `create_accumulator` shows.
struct CountMinMax;

impl AggregateFunction<u32, Acc, String> for CountMinMax {
    fn create_accumulator(&self) -> Acc {
        (0, u32::MAX, 0)
    }

    fn add(&self, value: u32, acc: &mut Acc) {
        acc.0 += 1;
        acc.1 = acc.1.min(value);
        acc.2 = acc.2.max(value);
    }

    fn get_result(&self, acc: &Acc) -> String {
        format!("{} in {}..={}", acc.0, acc.1, acc.2)
    }

    fn merge(&self, a: Acc, b: Acc) -> Acc {
        (a.0 + b.0, a.1.min(b.1), a.2.max(b.2))
    }
}

/// What the model expects `get_result` to give for an accumulator.
pub(super) fn expected_result(acc: &Acc) -> String {
    format!("{} in {}..={}", acc.0, acc.1, acc.2)
}

/// A sum, to register a `u64` accumulator under another kind.
pub(super) struct SumU64;

impl AggregateFunction<u64, u64, u64> for SumU64 {
    fn create_accumulator(&self) -> u64 {
        0
    }

    fn add(&self, value: u64, acc: &mut u64) {
        *acc = acc.wrapping_add(value);
    }

    fn get_result(&self, acc: &u64) -> u64 {
        *acc
    }

    fn merge(&self, a: u64, b: u64) -> u64 {
        a.wrapping_add(b)
    }
}

/// The five states of the kind checks, one of each kind.
pub(super) struct Kinds {
    pub(super) value: ValueState<u64>,
    pub(super) list: ListState<String>,
    pub(super) map: MapState<u16, String>,
    pub(super) reducing: ReducingState<u64>,
    pub(super) aggregating: AggregatingState<u32, Acc, String>,
}

/// One step of the state-kind model check, on key `K::nth(k)` (the first field).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KindOp {
    /// `update` of the value state (which has a default).
    Update(u16, u64),
    /// `clear` of the value state.
    ClearValue(u16),
    /// `list_add`.
    ListAdd(u16, String),
    /// `list_add_all`, possibly of nothing.
    ListAddAll(u16, Vec<String>),
    /// `list_update`; an empty list clears.
    ListUpdate(u16, Vec<String>),
    /// `clear_raw` of the list state.
    ClearList(u16),
    /// `map_put` of a user key and value.
    MapPut(u16, u16, String),
    /// `map_remove` of a user key, present or not.
    MapRemove(u16, u16),
    /// `clear_raw` of the map state.
    ClearMap(u16),
    /// `reduce` of a value.
    Reduce(u16, u64),
    /// `clear_raw` of the reducing state.
    ClearReducing(u16),
    /// `aggregate` of an input.
    Aggregate(u16, u32),
    /// `clear_raw` of the aggregating state.
    ClearAggregating(u16),
    /// Takes a snapshot; it is written after the last operation.
    Snapshot,
}

impl KindOp {
    /// The key index the operation is on.
    pub(super) fn key(&self) -> Option<u16> {
        use KindOp::*;
        match self {
            Update(k, _)
            | ClearValue(k)
            | ListAdd(k, _)
            | ListAddAll(k, _)
            | ListUpdate(k, _)
            | ClearList(k)
            | MapPut(k, _, _)
            | MapRemove(k, _)
            | ClearMap(k)
            | Reduce(k, _)
            | ClearReducing(k)
            | Aggregate(k, _)
            | ClearAggregating(k) => Some(*k),
            Snapshot => None,
        }
    }
}

/// The kind checks' model: per key, the value, the list, the map, the reduced value and the
/// accumulator, with Flink's semantics written out on plain collections.
#[derive(Clone, Debug)]
pub(super) struct KindsModel<K> {
    pub(super) values: HashMap<K, u64>,
    pub(super) lists: HashMap<K, Vec<String>>,
    pub(super) maps: HashMap<K, BTreeMap<u16, String>>,
    pub(super) reduced: HashMap<K, u64>,
    pub(super) accs: HashMap<K, Acc>,
}

impl<K: SuiteKey> KindsModel<K> {
    pub(super) fn new() -> Self {
        KindsModel {
            values: HashMap::new(),
            lists: HashMap::new(),
            maps: HashMap::new(),
            reduced: HashMap::new(),
            accs: HashMap::new(),
        }
    }

    /// Every key with something in some state.
    pub(super) fn keys(&self) -> HashSet<K> {
        let mut keys = HashSet::new();
        keys.extend(self.values.keys().cloned());
        keys.extend(self.lists.keys().cloned());
        keys.extend(self.maps.keys().cloned());
        keys.extend(self.reduced.keys().cloned());
        keys.extend(self.accs.keys().cloned());
        keys
    }

    /// The part of the model whose keys satisfy `own`.
    pub(super) fn only(&self, own: impl Fn(&K) -> bool) -> Self {
        fn part<K: SuiteKey, V: Clone>(
            m: &HashMap<K, V>,
            own: &impl Fn(&K) -> bool,
        ) -> HashMap<K, V> {
            m.iter()
                .filter(|(k, _)| own(k))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect()
        }
        KindsModel {
            values: part(&self.values, &own),
            lists: part(&self.lists, &own),
            maps: part(&self.maps, &own),
            reduced: part(&self.reduced, &own),
            accs: part(&self.accs, &own),
        }
    }

    /// Applies `op` to `key`; returns what a `map_remove` removes.
    pub(super) fn apply(&mut self, key: &K, op: &KindOp) -> Option<String> {
        let key = key.clone();
        match op {
            KindOp::Update(_, v) => {
                self.values.insert(key, *v);
            }
            KindOp::ClearValue(_) => {
                self.values.remove(&key);
            }
            KindOp::ListAdd(_, v) => self.lists.entry(key).or_default().push(v.clone()),
            KindOp::ListAddAll(_, vs) => {
                if !vs.is_empty() {
                    self.lists
                        .entry(key)
                        .or_default()
                        .extend(vs.iter().cloned());
                }
            }
            KindOp::ListUpdate(_, vs) => {
                if vs.is_empty() {
                    self.lists.remove(&key);
                } else {
                    self.lists.insert(key, vs.clone());
                }
            }
            KindOp::ClearList(_) => {
                self.lists.remove(&key);
            }
            KindOp::MapPut(_, uk, v) => {
                self.maps.entry(key).or_default().insert(*uk, v.clone());
            }
            KindOp::MapRemove(_, uk) => {
                let map = self.maps.get_mut(&key)?;
                let removed = map.remove(uk);
                if map.is_empty() {
                    self.maps.remove(&key);
                }
                return removed;
            }
            KindOp::ClearMap(_) => {
                self.maps.remove(&key);
            }
            KindOp::Reduce(_, v) => {
                let new = match self.reduced.get(&key) {
                    Some(old) => fold(old, v),
                    None => *v,
                };
                self.reduced.insert(key, new);
            }
            KindOp::ClearReducing(_) => {
                self.reduced.remove(&key);
            }
            KindOp::Aggregate(_, v) => {
                let acc = self.accs.entry(key).or_insert((0, u32::MAX, 0));
                acc.0 += 1;
                acc.1 = acc.1.min(*v);
                acc.2 = acc.2.max(*v);
            }
            KindOp::ClearAggregating(_) => {
                self.accs.remove(&key);
            }
            KindOp::Snapshot => {}
        }
        None
    }
}

impl<'c, K: SuiteKey, B: KeyedStateBackend<K>> Subject<'c, K, B> {
    /// The states of `key`.
    pub(super) fn at<'s>(&'s mut self, key: &'s K) -> KeyedAccess<'s, K, B> {
        let g = self.kg(key);
        KeyedAccess::new(&mut self.b, key, g)
    }

    /// Registers the five states of the kind checks, the value state with its default.
    #[track_caller]
    pub(super) fn kinds(&mut self) -> Kinds {
        let cx: &'c Cx = self.cx;
        let registered = |what: &str, r| cx.ok(&format!("registering {what}"), r);
        Kinds {
            value: registered(
                "a value state with a default",
                self.b
                    .value_state(&ValueStateDescriptor::new(K_VALUE).with_default(KIND_DEFAULT)),
            ),
            list: cx.ok(
                "registering a list state",
                self.b.list_state(&ListStateDescriptor::new(K_LIST)),
            ),
            map: cx.ok(
                "registering a map state",
                self.b.map_state(&MapStateDescriptor::new(K_MAP)),
            ),
            reducing: cx.ok(
                "registering a reducing state",
                self.b
                    .reducing_state(&ReducingStateDescriptor::new(K_REDUCING, fold)),
            ),
            aggregating: cx.ok(
                "registering an aggregating state",
                self.b.aggregating_state(&AggregatingStateDescriptor::new(
                    K_AGGREGATING,
                    CountMinMax,
                )),
            ),
        }
    }

    /// Applies `op` to the backend and the model; a `map_remove` must return what the model
    /// removes.
    #[track_caller]
    pub(super) fn step(&mut self, k: &Kinds, model: &mut KindsModel<K>, op: &KindOp) {
        let Some(i) = op.key() else { return };
        let cx = self.cx;
        let key = K::nth(u64::from(i));
        let removed = model.apply(&key, op);
        let mut a = self.at(&key);
        match op {
            KindOp::Update(_, v) => a.update(k.value, *v),
            KindOp::ClearValue(_) => a.clear(k.value),
            KindOp::ListAdd(_, v) => a.list_add(k.list, v.clone()),
            KindOp::ListAddAll(_, vs) => a.list_add_all(k.list, vs.iter().cloned()),
            KindOp::ListUpdate(_, vs) => a.list_update(k.list, vs.clone()),
            KindOp::ClearList(_) => a.clear_raw(k.list.raw),
            KindOp::MapPut(_, uk, v) => a.map_put(k.map, *uk, v.clone()),
            KindOp::MapRemove(_, uk) => {
                let got = a.map_remove(k.map, uk);
                if got != removed {
                    cx.fail(format!(
                        "map_remove({uk}) of {key:?} returned {got:?}, expected {removed:?}"
                    ))
                }
            }
            KindOp::ClearMap(_) => a.clear_raw(k.map.raw),
            KindOp::Reduce(_, v) => a.reduce(&k.reducing, *v),
            KindOp::ClearReducing(_) => a.clear_raw(k.reducing.raw),
            KindOp::Aggregate(_, v) => a.aggregate(&k.aggregating, *v),
            KindOp::ClearAggregating(_) => a.clear_raw(k.aggregating.raw),
            KindOp::Snapshot => {}
        }
    }

    /// Reads every state of every key of `model` and of `also` through [`KeyedAccess`],
    /// expecting the model: the value (or the default), the list (empty when none), the map's
    /// entries in key order, the reduced value, the aggregate. An empty list or map must not be
    /// stored.
    #[track_caller]
    pub(super) fn read_kinds(&mut self, rule: &str, k: &Kinds, model: &KindsModel<K>, also: &[K]) {
        let cx = self.cx;
        let mut keys = model.keys();
        keys.extend(also.iter().cloned());
        for key in &keys {
            let g = self.kg(key);
            let stored_list = self.b.value(k.list.raw, key, g).is_some();
            if stored_list != model.lists.contains_key(key) {
                cx.fail(format!(
                    "{rule}: '{K_LIST}' of {key:?} has a stored list: {stored_list}, expected \
                     {} (an empty list is no list)",
                    !stored_list
                ))
            }
            let stored_map = self.b.value(k.map.raw, key, g).is_some();
            if stored_map != model.maps.contains_key(key) {
                cx.fail(format!(
                    "{rule}: '{K_MAP}' of {key:?} has a stored map: {stored_map}, expected {} \
                     (a map goes with its last entry)",
                    !stored_map
                ))
            }
            let mut a = self.at(key);
            let check = |state: &str, got: &dyn Debug, want: &dyn Debug, same: bool| {
                if !same {
                    cx.fail(format!(
                        "{rule}: '{state}' of {key:?} reads {got:?}, expected {want:?}"
                    ))
                }
            };
            let value = a.value(k.value).copied();
            let want = Some(model.values.get(key).copied().unwrap_or(KIND_DEFAULT));
            check(K_VALUE, &value, &want, value == want);

            let list = a.list(k.list).to_vec();
            let list = &list[..];
            let want = model.lists.get(key).map_or(&[][..], Vec::as_slice);
            check(K_LIST, &list, &want, list == want);

            let entries: Vec<(u16, &String)> = a.map_entries(k.map).map(|(u, v)| (*u, v)).collect();
            let want: Vec<(u16, &String)> = model
                .maps
                .get(key)
                .into_iter()
                .flat_map(|m| m.iter().map(|(u, v)| (*u, v)))
                .collect();
            check(K_MAP, &entries, &want, entries == want);
            check(
                K_MAP,
                &a.map_is_empty(k.map),
                &want.is_empty(),
                a.map_is_empty(k.map) == want.is_empty(),
            );
            for (uk, v) in &want {
                let got = a.map_get(k.map, uk).cloned();
                let contains = a.map_contains(k.map, uk);
                check(
                    K_MAP,
                    &got.as_ref(),
                    &Some(v),
                    got.as_ref() == Some(*v) && contains,
                );
            }

            let reduced = a.reduced(&k.reducing).copied();
            let want = model.reduced.get(key).copied();
            check(K_REDUCING, &reduced, &want, reduced == want);

            let aggregated = a.aggregated(&k.aggregating);
            let want = model.accs.get(key).map(expected_result);
            check(K_AGGREGATING, &aggregated, &want, aggregated == want);
        }
    }
}

/// Checks that a written snapshot holds exactly the model, each state under its kind.
#[track_caller]
pub(super) fn check_kinds_written<K: SuiteKey>(
    cx: &Cx,
    w: &Written,
    model: &KindsModel<K>,
    rule: &str,
) {
    let rule_for = |state: &str| format!("{rule} ('{state}')");
    cx.same_map(
        &rule_for(K_VALUE),
        &content_of::<K, u64>(cx, w, K_VALUE, StateKind::Value),
        &model.values,
    );
    cx.same_map(
        &rule_for(K_LIST),
        &content_of::<K, Vec<String>>(cx, w, K_LIST, StateKind::List),
        &model.lists,
    );
    cx.same_map(
        &rule_for(K_MAP),
        &content_of::<K, BTreeMap<u16, String>>(cx, w, K_MAP, StateKind::Map),
        &model.maps,
    );
    cx.same_map(
        &rule_for(K_REDUCING),
        &content_of::<K, u64>(cx, w, K_REDUCING, StateKind::Reducing),
        &model.reduced,
    );
    cx.same_map(
        &rule_for(K_AGGREGATING),
        &content_of::<K, Acc>(cx, w, K_AGGREGATING, StateKind::Aggregating),
        &model.accs,
    );
}

/// Whether `msg` has `word` as a word of its own (not inside an identifier or a path such as
/// `btree::map::BTreeMap`).
fn names_word(msg: &str, word: &str) -> bool {
    let boundary =
        |c: Option<char>| c.is_none_or(|c| !(c.is_alphanumeric() || c == '_' || c == ':'));
    msg.match_indices(word).any(|(i, _)| {
        boundary(msg[..i].chars().next_back()) && boundary(msg[i + word.len()..].chars().next())
    })
}

/// Like `expect_incompatible`, and the error must also name each of `kinds`.
#[track_caller]
pub(super) fn expect_incompatible_kinds(
    cx: &Cx,
    op: &str,
    e: &StateError,
    name: &str,
    kinds: &[StateKind],
    types: &[&str],
) {
    expect_incompatible(cx, op, e, name, types);
    let msg = e.to_string();
    for kind in kinds {
        cx.must(names_word(&msg, kind.as_str()), || {
            format!("{op}: the error must name the kind `{kind}`: {msg}")
        });
    }
}

/// Runs `ops` against a fresh backend of the whole range of `max_parallelism` holding one state
/// of each kind and a model. The live backend must agree with the model, and every snapshot
/// (one per [`KindOp::Snapshot`], and one at the end) must hold the model as it was then,
/// restored whole and split across `parallelism` backends (clamped to `1..=max_parallelism`).
pub fn check_kinds_against_model<K: SuiteKey, B: KeyedStateBackend<K>>(
    make: impl Fn(u32, KeyGroupRange) -> B,
    max_parallelism: u32,
    parallelism: u32,
    ops: &[KindOp],
) {
    let cx = Cx::new::<B>(format!(
        "kinds model (max parallelism {max_parallelism}, parallelism {parallelism}, {} ops)",
        ops.len()
    ));
    kinds_model_case(&cx, &make, max_parallelism, parallelism, ops);
}

/// Runs `cases` random kind model checks from `seed`: max parallelism 1, 7 or 128, parallelism 1
/// to 4, up to 300 operations of every kind over [`KIND_MODEL_KEYS`] keys. A failure names the
/// seed and case.
pub fn check_random_kind_models<K: SuiteKey, B: KeyedStateBackend<K>>(
    make: impl Fn(u32, KeyGroupRange) -> B,
    seed: u64,
    cases: u32,
) {
    const WORDS: [&str; 6] = ["", "a", "ß", "слово", "🦀", "x y"];
    let mut rng = SplitMix64(seed);
    for case in 0..cases {
        let max_p = [1, 7, 128][rng.below(3) as usize];
        let parallelism = (1 + rng.below(4) as u32).min(max_p);
        let len = rng.below(300) as usize;
        let word = |rng: &mut SplitMix64| {
            format!(
                "{}{}",
                WORDS[rng.below(WORDS.len() as u64) as usize],
                rng.below(50)
            )
        };
        let ops: Vec<KindOp> = (0..len)
            .map(|_| {
                let key = rng.below(u64::from(KIND_MODEL_KEYS)) as u16;
                let user_key = rng.below(u64::from(KIND_MODEL_USER_KEYS)) as u16;
                match rng.below(20) {
                    0 => KindOp::Update(key, rng.next_u64()),
                    1 => KindOp::ClearValue(key),
                    2 | 3 => KindOp::ListAdd(key, word(&mut rng)),
                    4 => {
                        let n = rng.below(4);
                        KindOp::ListAddAll(key, (0..n).map(|_| word(&mut rng)).collect())
                    }
                    5 => {
                        let n = rng.below(3);
                        KindOp::ListUpdate(key, (0..n).map(|_| word(&mut rng)).collect())
                    }
                    6 => KindOp::ClearList(key),
                    7 | 8 => KindOp::MapPut(key, user_key, word(&mut rng)),
                    9 | 10 => KindOp::MapRemove(key, user_key),
                    11 => KindOp::ClearMap(key),
                    12 | 13 => KindOp::Reduce(key, rng.next_u64() >> rng.below(64)),
                    14 => KindOp::ClearReducing(key),
                    15 | 16 => KindOp::Aggregate(key, rng.next_u64() as u32),
                    17 => KindOp::ClearAggregating(key),
                    18 if rng.below(2) == 0 => KindOp::Snapshot,
                    _ => KindOp::MapPut(key, user_key, word(&mut rng)),
                }
            })
            .collect();
        let cx = Cx::new::<B>(format!(
            "kinds model (seed {seed:#x}, case {case}: max parallelism {max_p}, parallelism \
             {parallelism}, {len} ops)"
        ));
        kinds_model_case(&cx, &make, max_p, parallelism, &ops);
    }
}

fn kinds_model_case<K: SuiteKey, B: KeyedStateBackend<K>>(
    cx: &Cx,
    make: &impl Fn(u32, KeyGroupRange) -> B,
    max_p: u32,
    parallelism: u32,
    ops: &[KindOp],
) {
    let parallelism = parallelism.clamp(1, max_p);
    let mut b = fresh(cx, make, max_p, full(max_p));
    let k = b.kinds();
    let mut model = KindsModel::new();
    let mut touched: Vec<K> = Vec::new();
    let mut seen = HashSet::new();
    let mut pending = Vec::new();
    for op in ops {
        match op.key() {
            None => pending.push((cx.ok("snapshot", b.b.snapshot()), model.clone())),
            Some(i) => {
                if seen.insert(i) {
                    touched.push(K::nth(u64::from(i)));
                }
                b.step(&k, &mut model, op);
            }
        }
    }
    b.read_kinds(
        "the live backend agrees with the model",
        &k,
        &model,
        &touched,
    );
    pending.push((cx.ok("snapshot", b.b.snapshot()), model));

    for (i, (snapshot, model)) in pending.into_iter().enumerate() {
        let w = finish::<K>(cx, snapshot, max_p, full(max_p));
        check_kinds_written(
            cx,
            &w,
            &model,
            &format!("snapshot {i} holds the model as it was at its snapshot()"),
        );
        let mut whole = cx.ok(
            "restoring the whole snapshot",
            restored(cx, make, max_p, full(max_p), &[&w]),
        );
        let wk = whole.kinds();
        whole.read_kinds(
            &format!("snapshot {i}, restored whole, reads back as the model"),
            &wk,
            &model,
            &touched,
        );
        for p in 0..parallelism {
            let range = compute_key_group_range_for_operator_index(max_p, parallelism, p);
            let mut part = cx.ok(
                &format!("restoring key groups {range}"),
                restored(cx, make, max_p, range, &[&w]),
            );
            let pk = part.kinds();
            let own = |key: &K| range.contains(assign_to_key_group(key, max_p));
            let own_model = model.only(own);
            let own_keys: Vec<K> = touched.iter().filter(|key| own(key)).cloned().collect();
            part.read_kinds(
                &format!(
                    "snapshot {i}, restored into key groups {range} of {parallelism}, reads back \
                     as the model"
                ),
                &pk,
                &own_model,
                &own_keys,
            );
            let pw = part.write();
            check_kinds_written(
                cx,
                &pw,
                &own_model,
                &format!(
                    "snapshot {i}, restored into key groups {range}, holds only its key groups"
                ),
            );
        }
    }
}
