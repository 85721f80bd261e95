//! The kinds' semantics check: each state kind against Flink's semantics and edge cases.

use super::SuiteKey;
use super::helpers::{Cx, Subject, content, fresh, full, restored};
use super::kind_model::{
    KIND_DEFAULT, Kinds, KindsModel, check_kinds_written, expected_result, fold,
};
use crate::keyed::{KeyedAccess, KeyedStateBackend, ValueState};
use std::collections::{BTreeMap, HashMap};
use weir_core::keygroup::KeyGroupRange;

/// Each kind against Flink's semantics, edge cases included: a value state's default for a key
/// without a value and after `clear`; a list of a missing key is empty, adding nothing stores
/// nothing, `list_update(vec![])` clears; a map's entries come in key order, removing an absent
/// user key is a no-op, removing the last entry leaves no map; a reducing state stores its first
/// value as is and folds the next ones in order; an aggregating state has no result until
/// something is added, and starts from `create_accumulator`; `clear_raw` clears each kind. The
/// snapshot holds exactly the result, each state under its kind, and restores to it.
pub fn check_kind_semantics<K: SuiteKey, B: KeyedStateBackend<K>>(
    make: impl Fn(u32, KeyGroupRange) -> B,
) {
    let cx = Cx::new::<B>("state kind semantics");
    let mut b = fresh(&cx, &make, 128, full(128));
    let k = b.kinds();
    let plain = b.register::<u64>("no-default");
    let (one, two, never) = (K::nth(1), K::nth(2), K::nth(3));
    let mut model = KindsModel::<K>::new();

    // Value states.
    kind_semantics_values(&cx, &mut b, &k, plain, &one, &never, &mut model);

    // Lists.
    kind_semantics_lists(&cx, &mut b, &k, &one, &two, &never, &mut model);

    // Maps.
    kind_semantics_maps(&cx, &mut b, &k, &one, &two, &never, &mut model);

    // Reducing states.
    kind_semantics_reducing(&cx, &mut b, &k, &one, &two, &mut model);

    // Aggregating states.
    kind_semantics_aggregating(&cx, &mut b, &k, &one, &two, &mut model);

    let also = [one.clone(), two.clone(), never.clone()];
    b.read_kinds("after the operations", &k, &model, &also);
    let w = b.write();
    check_kinds_written(
        &cx,
        &w,
        &model,
        "the snapshot holds exactly what the operations left, each state under its kind",
    );
    cx.same_map(
        "the snapshot holds the value state without a default",
        &content::<K, u64>(&cx, &w, "no-default"),
        &HashMap::from([(one.clone(), 1)]),
    );
    let mut r = cx.ok("restoring", restored(&cx, &make, 128, full(128), &[&w]));
    let rk = r.kinds();
    r.read_kinds(
        "restored, every kind reads as before (the default from the descriptor registered)",
        &rk,
        &model,
        &also,
    );
}

/// [`check_kind_semantics`] of the value states, recording in `model` what they should hold.
fn kind_semantics_values<K: SuiteKey, B: KeyedStateBackend<K>>(
    cx: &Cx,
    b: &mut Subject<'_, K, B>,
    k: &Kinds,
    plain: ValueState<u64>,
    one: &K,
    never: &K,
    model: &mut KindsModel<K>,
) {
    let mut a = b.at(never);
    cx.eq(
        "a value state with a default reads the default for a key never written",
        &a.value(k.value).copied(),
        &Some(KIND_DEFAULT),
    );
    cx.eq(
        "a value state without a default reads nothing for a key never written",
        &a.value(plain).copied(),
        &None,
    );
    let mut a = b.at(one);
    a.update(k.value, 5);
    cx.eq(
        "update sets the value",
        &a.value(k.value).copied(),
        &Some(5),
    );
    a.clear(k.value);
    cx.eq(
        "a value state with a default reads the default after clear",
        &a.value(k.value).copied(),
        &Some(KIND_DEFAULT),
    );
    a.update(k.value, 9);
    a.update(plain, 1);
    model.values.insert(one.clone(), 9);
}

/// [`check_kind_semantics`] of the lists, recording in `model` what they should hold.
fn kind_semantics_lists<K: SuiteKey, B: KeyedStateBackend<K>>(
    cx: &Cx,
    b: &mut Subject<'_, K, B>,
    k: &Kinds,
    one: &K,
    two: &K,
    never: &K,
    model: &mut KindsModel<K>,
) {
    let mut a = b.at(never);
    cx.eq(
        "the list of a key never written is empty",
        &a.list(k.list).to_vec()[..],
        &[][..],
    );
    a.list_add_all(k.list, Vec::new());
    a.list_update(k.list, Vec::new());
    cx.eq(
        "adding nothing to a missing list, or updating it to nothing, stores no list",
        &b.b.value(k.list.raw, never, b.kg(never)).is_some(),
        &false,
    );
    let s = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let mut a = b.at(one);
    a.list_add(k.list, "x".into());
    a.list_add(k.list, "y".into());
    a.list_add_all(k.list, s(&["z", "x"]));
    cx.eq(
        "list_add and list_add_all append in order, duplicates kept",
        &a.list(k.list).to_vec()[..],
        &s(&["x", "y", "z", "x"])[..],
    );
    a.list_add_all(k.list, Vec::new());
    cx.eq(
        "list_add_all of nothing leaves the list",
        &a.list(k.list).count(),
        &4,
    );
    a.list_update(k.list, s(&["q", "ü"]));
    cx.eq(
        "list_update replaces the list",
        &a.list(k.list).to_vec()[..],
        &s(&["q", "ü"])[..],
    );
    a.list_update(k.list, Vec::new());
    cx.eq(
        "list_update(vec![]) clears the list",
        &a.list(k.list).to_vec()[..],
        &[][..],
    );
    cx.eq(
        "after list_update(vec![]) the key has no list",
        &b.b.value(k.list.raw, one, b.kg(one)).is_some(),
        &false,
    );
    let mut a = b.at(one);
    a.list_add(k.list, "r".into());
    cx.eq(
        "list_add after a clear starts a new list",
        &a.list(k.list).to_vec()[..],
        &s(&["r"])[..],
    );
    model.lists.insert(one.clone(), s(&["r"]));
    let mut a = b.at(two);
    a.list_add_all(k.list, s(&["c1", "c2"]));
    a.clear_raw(k.list.raw);
    cx.eq(
        "clear_raw clears a list",
        &a.list(k.list).to_vec()[..],
        &[][..],
    );
}

/// [`check_kind_semantics`] of the maps, recording in `model` what they should hold.
fn kind_semantics_maps<K: SuiteKey, B: KeyedStateBackend<K>>(
    cx: &Cx,
    b: &mut Subject<'_, K, B>,
    k: &Kinds,
    one: &K,
    two: &K,
    never: &K,
    model: &mut KindsModel<K>,
) {
    let mut a = b.at(never);
    cx.eq(
        "map_get on a key never written is None",
        &a.map_get(k.map, &1),
        &None,
    );
    cx.eq(
        "map_contains on a key never written is false",
        &a.map_contains(k.map, &1),
        &false,
    );
    cx.eq(
        "the map of a key never written is empty",
        &a.map_is_empty(k.map),
        &true,
    );
    cx.eq(
        "map_remove on a key never written removes nothing",
        &a.map_remove(k.map, &1),
        &None,
    );
    cx.eq(
        "map_remove on a key never written stores no map",
        &b.b.value(k.map.raw, never, b.kg(never)).is_some(),
        &false,
    );
    let mut a = b.at(one);
    a.map_put(k.map, 5, "five".into());
    a.map_put(k.map, 1, "one".into());
    a.map_put(k.map, 3, "three".into());
    a.map_put(k.map, 3, "THREE".into());
    let entries = |a: &mut KeyedAccess<'_, K, B>| {
        a.map_entries(k.map)
            .map(|(u, v)| (*u, v.clone()))
            .collect::<Vec<_>>()
    };
    cx.eq(
        "map_put inserts and overwrites; map_entries come in user-key order",
        &entries(&mut a),
        &vec![(1, "one".into()), (3, "THREE".into()), (5, "five".into())],
    );
    cx.eq(
        "map_get reads an entry",
        &a.map_get(k.map, &3).cloned(),
        &Some("THREE".into()),
    );
    cx.eq(
        "map_contains of an absent user key is false",
        &a.map_contains(k.map, &2),
        &false,
    );
    cx.eq(
        "map_remove of an absent user key removes nothing",
        &a.map_remove(k.map, &2),
        &None,
    );
    cx.eq(
        "map_remove returns the removed value",
        &a.map_remove(k.map, &1),
        &Some("one".into()),
    );
    a.map_remove(k.map, &5);
    cx.eq(
        "map_remove removes only its entry",
        &entries(&mut a),
        &vec![(3, "THREE".into())],
    );
    cx.eq(
        "map_remove of the last entry returns it",
        &a.map_remove(k.map, &3),
        &Some("THREE".into()),
    );
    cx.eq(
        "after removing the last entry the map is empty",
        &a.map_is_empty(k.map),
        &true,
    );
    cx.eq(
        "after removing the last entry the key has no map",
        &b.b.value(k.map.raw, one, b.kg(one)).is_some(),
        &false,
    );
    let mut a = b.at(one);
    a.map_put(k.map, 4, "four".into());
    a.clear_raw(k.map.raw);
    cx.eq("clear_raw clears a map", &a.map_is_empty(k.map), &true);
    let mut a = b.at(two);
    a.map_put(k.map, 7, "seven".into());
    a.map_put(k.map, 2, "two".into());
    model.maps.insert(
        two.clone(),
        BTreeMap::from([(2, "two".into()), (7, "seven".into())]),
    );
}

/// [`check_kind_semantics`] of the reducing states, recording in `model` what they should hold.
fn kind_semantics_reducing<K: SuiteKey, B: KeyedStateBackend<K>>(
    cx: &Cx,
    b: &mut Subject<'_, K, B>,
    k: &Kinds,
    one: &K,
    two: &K,
    model: &mut KindsModel<K>,
) {
    let mut a = b.at(one);
    cx.eq(
        "a reducing state of a key never written has no value",
        &a.reduced(&k.reducing),
        &None,
    );
    a.reduce(&k.reducing, 10);
    cx.eq(
        "the first value reduced is stored as is",
        &a.reduced(&k.reducing).copied(),
        &Some(10),
    );
    a.reduce(&k.reducing, 20);
    a.reduce(&k.reducing, 3);
    let folded = fold(&fold(&10, &20), &3);
    cx.eq(
        "later values are folded in with the reduce function, in order",
        &a.reduced(&k.reducing).copied(),
        &Some(folded),
    );
    model.reduced.insert(one.clone(), folded);
    let mut a = b.at(two);
    a.reduce(&k.reducing, 7);
    a.clear_raw(k.reducing.raw);
    cx.eq(
        "clear_raw clears a reducing state",
        &a.reduced(&k.reducing),
        &None,
    );
    a.reduce(&k.reducing, 8);
    cx.eq(
        "after a clear, the first value reduced is stored as is",
        &a.reduced(&k.reducing).copied(),
        &Some(8),
    );
    model.reduced.insert(two.clone(), 8);
}

/// [`check_kind_semantics`] of the aggregating states, recording in `model` what they should hold.
fn kind_semantics_aggregating<K: SuiteKey, B: KeyedStateBackend<K>>(
    cx: &Cx,
    b: &mut Subject<'_, K, B>,
    k: &Kinds,
    one: &K,
    two: &K,
    model: &mut KindsModel<K>,
) {
    let mut a = b.at(one);
    cx.eq(
        "aggregated() is None until something is added",
        &a.aggregated(&k.aggregating),
        &None,
    );
    a.aggregate(&k.aggregating, 5);
    cx.eq(
        "the first input is added to create_accumulator()",
        &a.aggregated(&k.aggregating),
        &Some(expected_result(&(1, 5, 5))),
    );
    a.aggregate(&k.aggregating, 2);
    a.aggregate(&k.aggregating, 9);
    cx.eq(
        "inputs are added to the accumulator",
        &a.aggregated(&k.aggregating),
        &Some(expected_result(&(3, 2, 9))),
    );
    model.accs.insert(one.clone(), (3, 2, 9));
    let mut a = b.at(two);
    a.aggregate(&k.aggregating, 4);
    a.clear_raw(k.aggregating.raw);
    cx.eq(
        "after clear_raw, aggregated() is None",
        &a.aggregated(&k.aggregating),
        &None,
    );
}
