//! The kinds' registration, mismatch after restore, snapshot isolation and round trip.

use super::SuiteKey;
use super::helpers::{
    Cx, Subject, Written, check_written, expect_incompatible, fresh, full, restored,
};
use super::kind_model::{
    Acc, K_AGGREGATING, K_LIST, K_MAP, K_REDUCING, K_VALUE, KindOp, KindsModel, SumU64,
    check_kinds_written, expect_incompatible_kinds, fold,
};
#[cfg(doc)]
use crate::StateError;
use crate::format::StateKind;
use crate::keyed::{
    AggregatingStateDescriptor, KeyedStateBackend, ListStateDescriptor, MapStateDescriptor,
    ReducingStateDescriptor, ValueStateDescriptor,
};
use std::any::type_name;
use std::collections::{BTreeMap, HashSet};
use weir_core::keygroup::{
    KeyGroupRange, assign_to_key_group, compute_key_group_range_for_operator_index,
};
use weir_core::panic::panic_message;

/// Registering each kind twice with the same name and types returns the same handle; another
/// kind under a registered name, even with the same per-key value type, or another element
/// type, is [`StateError::Incompatible`] naming the state and both kinds or types; the
/// registered states still work after a refusal.
pub fn check_kind_registration<K: SuiteKey, B: KeyedStateBackend<K>>(
    make: impl Fn(u32, KeyGroupRange) -> B,
) {
    let cx = Cx::new::<B>("state kind registration");
    let mut b = fresh(&cx, &make, 8, full(8));
    let k = b.kinds();
    let again = b.kinds();
    let ids = [
        k.value.id,
        k.list.raw.id,
        k.map.raw.id,
        k.reducing.raw.id,
        k.aggregating.raw.id,
    ];
    cx.eq(
        "registering each kind again with the same name and types returns the same handle",
        &[
            again.value.id,
            again.list.raw.id,
            again.map.raw.id,
            again.reducing.raw.id,
            again.aggregating.raw.id,
        ],
        &ids,
    );
    cx.eq(
        "five states get five handles",
        &ids.iter().collect::<HashSet<_>>().len(),
        &5,
    );
    refuse_other_kinds(&cx, &mut b, "registered");
    let key = K::nth(1);
    let mut model = KindsModel::new();
    for op in [
        KindOp::Update(1, 3),
        KindOp::ListAdd(1, "l".into()),
        KindOp::MapPut(1, 2, "m".into()),
        KindOp::Reduce(1, 4),
        KindOp::Aggregate(1, 5),
    ] {
        b.step(&k, &mut model, &op);
    }
    b.read_kinds(
        "the registered states work after refused registrations",
        &k,
        &model,
        &[key],
    );
}

/// Registrations of the kind checks' states under another kind or element type, each of which
/// must be refused; `when` says whether the states are registered or restored.
fn refuse_other_kinds<K: SuiteKey, B: KeyedStateBackend<K>>(
    cx: &Cx,
    b: &mut Subject<'_, K, B>,
    when: &str,
) {
    use StateKind::{Aggregating, List, Map, Reducing, Value};
    let list_type = type_name::<Vec<String>>();
    let map_type = type_name::<BTreeMap<u16, String>>();

    let op = format!("a {when} list state registered as a map state");
    let e = cx.err(&format!("{op} must fail"), || {
        b.b.map_state(&MapStateDescriptor::<u16, String>::new(K_LIST))
    });
    expect_incompatible_kinds(cx, &op, &e, K_LIST, &[List, Map], &[list_type, map_type]);

    let op = format!("a {when} list state registered as a value state of the same `Vec`");
    let e = cx.err(&format!("{op} must fail"), || {
        b.b.value_state(&ValueStateDescriptor::<Vec<String>>::new(K_LIST))
    });
    expect_incompatible_kinds(cx, &op, &e, K_LIST, &[List, Value], &[]);

    let op = format!("a {when} list of `String` registered as a list of `u32`");
    let e = cx.err(&format!("{op} must fail"), || {
        b.b.list_state(&ListStateDescriptor::<u32>::new(K_LIST))
    });
    expect_incompatible(cx, &op, &e, K_LIST, &[list_type, type_name::<Vec<u32>>()]);

    let op = format!("a {when} map of `u16` to `String` registered as a map of `u16` to `u64`");
    let e = cx.err(&format!("{op} must fail"), || {
        b.b.map_state(&MapStateDescriptor::<u16, u64>::new(K_MAP))
    });
    expect_incompatible(
        cx,
        &op,
        &e,
        K_MAP,
        &[map_type, type_name::<BTreeMap<u16, u64>>()],
    );

    let op = format!("a {when} map state registered as a list state");
    let e = cx.err(&format!("{op} must fail"), || {
        b.b.list_state(&ListStateDescriptor::<(u16, String)>::new(K_MAP))
    });
    expect_incompatible_kinds(cx, &op, &e, K_MAP, &[Map, List], &[]);

    let op = format!("a {when} value state of `u64` registered as a reducing state of `u64`");
    let e = cx.err(&format!("{op} must fail"), || {
        b.b.reducing_state(&ReducingStateDescriptor::<u64>::new(K_VALUE, fold))
    });
    expect_incompatible_kinds(cx, &op, &e, K_VALUE, &[Value, Reducing], &[]);

    let op = format!("a {when} reducing state of `u64` registered as a value state of `u64`");
    let e = cx.err(&format!("{op} must fail"), || {
        b.b.value_state(&ValueStateDescriptor::<u64>::new(K_REDUCING))
    });
    expect_incompatible_kinds(cx, &op, &e, K_REDUCING, &[Reducing, Value], &[]);

    let op = format!("a {when} reducing state of `u64` registered as an aggregating state");
    let e = cx.err(&format!("{op} must fail"), || {
        b.b.aggregating_state(&AggregatingStateDescriptor::new(K_REDUCING, SumU64))
    });
    expect_incompatible_kinds(cx, &op, &e, K_REDUCING, &[Reducing, Aggregating], &[]);

    let op =
        format!("a {when} aggregating state registered as a reducing state of its accumulator");
    let e = cx.err(&format!("{op} must fail"), || {
        b.b.reducing_state(&ReducingStateDescriptor::<Acc>::new(
            K_AGGREGATING,
            |a, _| *a,
        ))
    });
    expect_incompatible_kinds(cx, &op, &e, K_AGGREGATING, &[Aggregating, Reducing], &[]);

    let op = format!("a {when} aggregating state registered with another accumulator type");
    let e = cx.err(&format!("{op} must fail"), || {
        b.b.aggregating_state(&AggregatingStateDescriptor::new(K_AGGREGATING, SumU64))
    });
    expect_incompatible(
        cx,
        &op,
        &e,
        K_AGGREGATING,
        &[type_name::<Acc>(), type_name::<u64>()],
    );
}

/// After a restore, registering a state under another kind than the snapshot's (a list as a map
/// or a value, a value as a reducing state, ...) or with another element type is
/// [`StateError::Incompatible`] naming the state and both kinds or types, never a panic; the
/// right registrations then restore every kind.
pub fn check_kind_mismatch_after_restore<K: SuiteKey, B: KeyedStateBackend<K>>(
    make: impl Fn(u32, KeyGroupRange) -> B,
) {
    let cx = Cx::new::<B>("state kind mismatch after restore");
    let mut b = fresh(&cx, &make, 8, full(8));
    let k = b.kinds();
    let mut model = KindsModel::new();
    for i in 0..4 {
        for op in [
            KindOp::Update(i, u64::from(i)),
            KindOp::ListAdd(i, format!("l{i}")),
            KindOp::MapPut(i, i, format!("m{i}")),
            KindOp::Reduce(i, u64::from(i)),
            KindOp::Aggregate(i, u32::from(i)),
        ] {
            b.step(&k, &mut model, &op);
        }
    }
    let w = b.write();
    let mut r = cx.ok("restoring", restored(&cx, &make, 8, full(8), &[&w]));
    refuse_other_kinds(&cx, &mut r, "restored");
    let rk = r.kinds();
    r.read_kinds(
        "after refused registrations, the right ones restore every kind",
        &rk,
        &model,
        &[],
    );
}

/// A snapshot holds a list and a map state as they were at `snapshot()`: appends, in-place
/// changes of a key's list or map, replacements, removals of entries and of whole lists and maps
/// after it are absent from what it writes, even while it is written on another thread. The live
/// backend has the new content.
pub fn check_kind_snapshot_isolation<K: SuiteKey, B: KeyedStateBackend<K>>(
    make: impl Fn(u32, KeyGroupRange) -> B,
) {
    let cx = Cx::new::<B>("list and map snapshot isolation");
    let max_p = 16;
    let mut b = fresh(&cx, &make, max_p, full(max_p));
    let k = b.kinds();
    let mut model = KindsModel::new();
    for i in 0..40u16 {
        for j in 0..3u16 {
            b.step(&k, &mut model, &KindOp::ListAdd(i, format!("{i}.{j}")));
            b.step(&k, &mut model, &KindOp::MapPut(i, j, format!("{i}:{j}")));
        }
    }
    let before = model.clone();
    let snapshot = cx.ok("snapshot", b.b.snapshot());
    let writer = std::thread::spawn(move || {
        let mut bytes = Vec::new();
        snapshot.write_to(&mut bytes).map(|layout| (layout, bytes))
    });
    for i in 0..40u16 {
        let ops = match i / 8 {
            // In place: the same list and map grow and change.
            0 => vec![
                KindOp::ListAdd(i, "later".into()),
                KindOp::ListAddAll(i, vec!["a".into(), "b".into()]),
                KindOp::MapPut(i, 0, "changed".into()),
                KindOp::MapPut(i, 9, "new".into()),
            ],
            // Emptied: the list updated to nothing, the map's entries all removed.
            1 => vec![
                KindOp::ListUpdate(i, Vec::new()),
                KindOp::MapRemove(i, 0),
                KindOp::MapRemove(i, 1),
                KindOp::MapRemove(i, 2),
            ],
            // Replaced.
            2 => vec![
                KindOp::ListUpdate(i, vec!["replaced".into()]),
                KindOp::MapRemove(i, 1),
            ],
            // Cleared.
            3 => vec![KindOp::ClearList(i), KindOp::ClearMap(i)],
            _ => Vec::new(),
        };
        for op in ops {
            b.step(&k, &mut model, &op);
        }
    }
    b.step(&k, &mut model, &KindOp::ListAdd(1000, "late".into()));
    b.step(&k, &mut model, &KindOp::MapPut(1000, 1, "late".into()));
    let (layout, bytes) = match writer.join() {
        Ok(r) => cx.ok("writing the snapshot on another thread", r),
        Err(p) => cx.fail(format!(
            "writing the snapshot on another thread panicked: {}",
            panic_message(p.as_ref())
        )),
    };
    let w = check_written::<K>(&cx, layout, bytes, max_p, full(max_p));
    check_kinds_written(
        &cx,
        &w,
        &before,
        "the snapshot holds the lists and maps as they were at snapshot(), not the later changes",
    );
    let mut r = cx.ok(
        "restoring the snapshot",
        restored(&cx, &make, max_p, full(max_p), &[&w]),
    );
    let rk = r.kinds();
    let late = [K::nth(1000)];
    r.read_kinds(
        "a restored snapshot holds the lists and maps at snapshot()",
        &rk,
        &before,
        &late,
    );
    b.read_kinds(
        "the live backend has the changes made after snapshot()",
        &k,
        &model,
        &late,
    );
}

/// All five kinds at once, through snapshot and restore, whole and rescaled 1 → 2 → 3 → 1: every
/// key's value, list, map, reduced value and aggregate comes back in the backend owning its key
/// group, and nowhere else; restored states carry their kind into the next snapshot even before
/// they are registered; merging gives back the original bytes.
pub fn check_kinds_round_trip<K: SuiteKey, B: KeyedStateBackend<K>>(
    make: impl Fn(u32, KeyGroupRange) -> B,
) {
    let cx = Cx::new::<B>("state kinds round trip and rescale 1 → 2 → 3 → 1");
    let max_p = 64;
    let mut one = fresh(&cx, &make, max_p, full(max_p));
    let k = one.kinds();
    let mut model = KindsModel::new();
    let n = 240u16;
    for i in 0..n {
        let mut ops = Vec::new();
        if i % 3 != 0 {
            ops.push(KindOp::Update(i, u64::from(i) * 7));
        }
        // `i % 5 == 0`: adding nothing, so no list.
        ops.push(KindOp::ListAddAll(
            i,
            (0..i % 5).map(|j| format!("{i}-{j}-ß")).collect(),
        ));
        for j in 0..i % 6 {
            ops.push(KindOp::MapPut(i, j * 3, format!("m{i}.{j}")));
        }
        if i % 5 != 1 {
            ops.push(KindOp::Reduce(i, u64::from(i)));
            ops.push(KindOp::Reduce(i, 1000 - u64::from(i)));
        }
        if i % 7 != 2 {
            for j in 0..1 + u32::from(i % 3) {
                ops.push(KindOp::Aggregate(i, (u32::from(i) * 13 + j) % 97));
            }
        }
        if i % 11 == 0 {
            ops.push(KindOp::ClearList(i));
            ops.push(KindOp::MapRemove(i, 0));
        }
        for op in ops {
            one.step(&k, &mut model, &op);
        }
    }
    let all: Vec<K> = (0..u64::from(n)).map(K::nth).collect();
    let original = one.write();
    check_kinds_written(
        &cx,
        &original,
        &model,
        "the snapshot holds every kind of every key",
    );

    let mut whole = cx.ok(
        "restoring the snapshot whole",
        restored(&cx, &make, max_p, full(max_p), &[&original]),
    );
    let carried = whole.write();
    check_kinds_written(
        &cx,
        &carried,
        &model,
        "restored states not registered yet keep their kind and content in the next snapshot",
    );
    let wk = whole.kinds();
    whole.read_kinds("restored whole, every kind reads back", &wk, &model, &all);
    cx.eq(
        "restored and registered in the same order, the snapshot has the original bytes",
        &whole.write().bytes,
        &original.bytes,
    );

    let mut from = vec![original];
    for parallelism in [2, 3] {
        let sources: Vec<&Written> = from.iter().collect();
        let mut parts = Vec::new();
        for p in 0..parallelism {
            let range = compute_key_group_range_for_operator_index(max_p, parallelism, p);
            let mut part = cx.ok(
                &format!("restoring key groups {range} of {parallelism}"),
                restored(&cx, &make, max_p, range, &sources),
            );
            let pk = part.kinds();
            let own = |key: &K| range.contains(assign_to_key_group(key, max_p));
            let own_model = model.only(own);
            let own_keys: Vec<K> = all.iter().filter(|key| own(key)).cloned().collect();
            part.read_kinds(
                &format!(
                    "rescaled to {parallelism}, the backend of key groups {range} reads each key \
                     of its key groups"
                ),
                &pk,
                &own_model,
                &own_keys,
            );
            let w = part.write();
            check_kinds_written(
                &cx,
                &w,
                &own_model,
                &format!(
                    "rescaled to {parallelism}, the backend of key groups {range} holds the keys \
                     of its key groups only"
                ),
            );
            parts.push(w);
        }
        from = parts;
    }
    let sources: Vec<&Written> = from.iter().collect();
    let mut merged = cx.ok(
        "merging the 3 parts",
        restored(&cx, &make, max_p, full(max_p), &sources),
    );
    let mk = merged.kinds();
    merged.read_kinds(
        "merging the parts back gives every kind of every key",
        &mk,
        &model,
        &all,
    );
    let w = merged.write();
    check_kinds_written(
        &cx,
        &w,
        &model,
        "merging the parts back gives the original state",
    );
    cx.eq(
        "merging the parts back gives the original bytes",
        &w.bytes,
        &whole.write().bytes,
    );
}
