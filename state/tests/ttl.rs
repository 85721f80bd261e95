//! State time-to-live with a controllable clock: expiry per kind, update types, visibility, and
//! cleanup on access, in full snapshots and incrementally.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;
use weir_core::handle::{KeyedStateHandle, StreamStateHandle};
use weir_core::ids::OperatorId;
use weir_core::keygroup::{KeyGroupRange, assign_to_key_group};
use weir_state::{
    AggregateFunction, AggregatingStateDescriptor, HeapStateBackend, KeyedAccess, KeyedBackend,
    KeyedBackendParameters, KeyedStateBackend, ListStateDescriptor, MapStateDescriptor,
    MemoryStoreStateBackend, ReducingStateDescriptor, RestorePart, StateBackend, StateTtlConfig,
    TtlUpdateType, TtlValue, TtlVisibility, ValueState, ValueStateDescriptor,
};

const MAX_P: u32 = 128;

/// The backend under test: each test runs on the heap and on the memory store.
type B = KeyedBackend<String>;

thread_local! {
    static BACKEND: std::cell::Cell<&'static str> = const { std::cell::Cell::new("heap") };
}

fn backend() -> B {
    let range = KeyGroupRange::new(0, MAX_P - 1);
    let chosen: &dyn StateBackend = match BACKEND.get() {
        "heap" => &HeapStateBackend,
        _ => &MemoryStoreStateBackend,
    };
    let parameters = KeyedBackendParameters::new(OperatorId(1), "ttl", 0, MAX_P, range);
    KeyedBackend::create(chosen, &parameters).unwrap()
}

/// The values of a TTL value state, through `for_each_entry`.
fn entries(b: &mut B, raw: ValueState<TtlValue<u64>>) -> Vec<u64> {
    let mut values = Vec::new();
    b.for_each_entry(raw, &mut |_, v| values.push(v.value));
    values
}

fn ttl(ms: u64) -> StateTtlConfig {
    StateTtlConfig::new(Duration::from_millis(ms))
}

fn at<'a>(b: &'a mut B, key: &'a String, now: i64) -> KeyedAccess<'a, String, B> {
    let kg = assign_to_key_group(key, MAX_P);
    KeyedAccess::new(b, key, kg).at(now)
}

fn a_value_expires_after_its_ttl_since_the_last_write() {
    let mut b = backend();
    let s = b
        .value_state(&ValueStateDescriptor::<u64>::new("v").enable_ttl(ttl(100)))
        .unwrap();
    let k = "a".to_string();
    at(&mut b, &k, 1_000).update(s, 7);
    assert_eq!(at(&mut b, &k, 1_099).value(s), Some(&7));
    // Reading does not renew it with the default update type.
    assert_eq!(
        at(&mut b, &k, 1_100).value(s),
        None,
        "expired at write + ttl"
    );
    // Never-return-expired removed it on that read: even a lenient read sees nothing.
    at(&mut b, &k, 2_000).update(s, 8);
    assert_eq!(at(&mut b, &k, 2_050).value(s), Some(&8));
}

fn on_read_and_write_renews_on_every_read() {
    let mut b = backend();
    let s = b
        .value_state(
            &ValueStateDescriptor::<u64>::new("v")
                .enable_ttl(ttl(100).update_type(TtlUpdateType::OnReadAndWrite)),
        )
        .unwrap();
    let k = "a".to_string();
    at(&mut b, &k, 0).update(s, 1);
    for now in [90, 180, 270, 360] {
        assert_eq!(at(&mut b, &k, now).value(s), Some(&1), "renewed at {now}");
    }
    assert_eq!(at(&mut b, &k, 460).value(s), None);
}

fn return_expired_if_not_cleaned_up_returns_it_until_a_cleanup() {
    let mut b = backend();
    let s = b
        .value_state(
            &ValueStateDescriptor::<u64>::new("v").enable_ttl(
                ttl(10)
                    .visibility(TtlVisibility::ReturnExpiredIfNotCleanedUp)
                    .incremental_cleanup(0),
            ),
        )
        .unwrap();
    let k = "a".to_string();
    at(&mut b, &k, 0).update(s, 5);
    assert_eq!(
        at(&mut b, &k, 50).value(s),
        Some(&5),
        "expired but still stored"
    );
    // A cleanup pass over every key group removes it.
    b.cleanup_expired(
        weir_state::ValueState::<weir_state::TtlValue<u64>>::from_id(s.id),
        usize::MAX,
        50,
    );
    assert_eq!(at(&mut b, &k, 50).value(s), None);
}

fn list_elements_expire_one_by_one() {
    let mut b = backend();
    let s = b
        .list_state(&ListStateDescriptor::<u32>::new("l").enable_ttl(ttl(100)))
        .unwrap();
    let k = "a".to_string();
    at(&mut b, &k, 0).list_add(s, 1);
    at(&mut b, &k, 50).list_add_all(s, [2, 3]);
    let got: Vec<u32> = at(&mut b, &k, 120).list(s).copied().collect();
    assert_eq!(got, vec![2, 3], "the element written at 0 expired at 100");
    let got: Vec<u32> = at(&mut b, &k, 150).list(s).copied().collect();
    assert!(got.is_empty(), "{got:?}");
    at(&mut b, &k, 200).list_update(s, vec![9]);
    assert_eq!(
        at(&mut b, &k, 250).list(s).copied().collect::<Vec<_>>(),
        vec![9]
    );
}

fn map_entries_expire_one_by_one() {
    let mut b = backend();
    let s = b
        .map_state(&MapStateDescriptor::<String, u32>::new("m").enable_ttl(ttl(100)))
        .unwrap();
    let k = "a".to_string();
    at(&mut b, &k, 0).map_put(s, "x".into(), 1);
    at(&mut b, &k, 60).map_put(s, "y".into(), 2);
    assert_eq!(at(&mut b, &k, 99).map_get(s, &"x".into()), Some(&1));
    assert_eq!(at(&mut b, &k, 100).map_get(s, &"x".into()), None);
    let entries: Vec<(String, u32)> = at(&mut b, &k, 120)
        .map_entries(s)
        .map(|(k, v)| (k.clone(), *v))
        .collect();
    assert_eq!(entries, vec![("y".to_string(), 2)]);
    assert!(at(&mut b, &k, 200).map_is_empty(s));
}

struct Avg;
impl AggregateFunction<u64, (u64, u64), f64> for Avg {
    fn create_accumulator(&self) -> (u64, u64) {
        (0, 0)
    }
    fn add(&self, value: u64, acc: &mut (u64, u64)) {
        acc.0 += value;
        acc.1 += 1;
    }
    fn get_result(&self, acc: &(u64, u64)) -> f64 {
        acc.0 as f64 / acc.1 as f64
    }
    fn merge(&self, a: (u64, u64), b: (u64, u64)) -> (u64, u64) {
        (a.0 + b.0, a.1 + b.1)
    }
}

fn reducing_and_aggregating_states_start_over_after_expiry() {
    let mut b = backend();
    let r = b
        .reducing_state(
            &ReducingStateDescriptor::<u64>::new("r", |a, b| a + b).enable_ttl(ttl(100)),
        )
        .unwrap();
    let a = b
        .aggregating_state(&AggregatingStateDescriptor::new("a", Avg).enable_ttl(ttl(100)))
        .unwrap();
    let k = "k".to_string();
    at(&mut b, &k, 0).reduce(&r, 5);
    at(&mut b, &k, 50).reduce(&r, 6);
    assert_eq!(
        at(&mut b, &k, 120).reduced(&r),
        Some(&11),
        "renewed by the write at 50"
    );
    at(&mut b, &k, 0).aggregate(&a, 10);
    at(&mut b, &k, 10).aggregate(&a, 20);
    assert_eq!(at(&mut b, &k, 20).aggregated(&a), Some(15.0));
    at(&mut b, &k, 300).reduce(&r, 1);
    at(&mut b, &k, 300).aggregate(&a, 4);
    assert_eq!(
        at(&mut b, &k, 300).reduced(&r),
        Some(&1),
        "expired: starts over"
    );
    assert_eq!(at(&mut b, &k, 300).aggregated(&a), Some(4.0));
}

fn write(b: &mut B) -> (KeyedStateHandle, Vec<u8>) {
    let snap = b.snapshot().unwrap();
    let mut bytes = Vec::new();
    let layout = snap.write_to(&mut bytes).unwrap();
    (
        layout.into_handle(StreamStateHandle::Inline(Vec::new())),
        bytes,
    )
}

fn restore(handle: &KeyedStateHandle, bytes: &[u8]) -> B {
    let mut b = backend();
    let (h0, h1) = handle.header;
    let start = handle.offsets[0];
    b.restore(&[RestorePart {
        handle,
        header: &bytes[h0 as usize..h1 as usize],
        sections: bytes::Bytes::copy_from_slice(&bytes[start as usize..]),
        sections_offset: start,
    }])
    .unwrap();
    b
}

fn full_snapshots_leave_expired_entries_out() {
    let clock = Arc::new(AtomicI64::new(0));
    let c = clock.clone();
    let mut b = backend().with_clock(Arc::new(move || c.load(Ordering::SeqCst)));
    let d = ValueStateDescriptor::<u64>::new("v").enable_ttl(ttl(100).incremental_cleanup(0));
    let s = b.value_state(&d).unwrap();
    for i in 0..1000u64 {
        let k = format!("k{i}");
        // Half the keys are written at 0, half at 90.
        at(&mut b, &k, if i % 2 == 0 { 0 } else { 90 }).update(s, i);
    }
    clock.store(150, Ordering::SeqCst);
    let (handle, bytes) = write(&mut b);
    let mut r = restore(&handle, &bytes);
    let s2 = r.value_state(&d).unwrap();
    let raw = weir_state::ValueState::<weir_state::TtlValue<u64>>::from_id(s2.id);
    let kept: Vec<u64> = entries(&mut r, raw);
    assert_eq!(
        kept.len(),
        500,
        "the 500 entries written at 0 expired by 150"
    );
    assert!(kept.iter().all(|v| v % 2 == 1));
    // Without full-snapshot cleanup, they stay.
    let mut b2 = backend().with_clock(Arc::new(|| 1_000_000));
    let d2 = ValueStateDescriptor::<u64>::new("v").enable_ttl(
        ttl(100)
            .incremental_cleanup(0)
            .without_full_snapshot_cleanup(),
    );
    let s3 = b2.value_state(&d2).unwrap();
    at(&mut b2, &"x".to_string(), 0).update(s3, 1);
    let (handle, bytes) = write(&mut b2);
    let mut r2 = restore(&handle, &bytes);
    let s4 = r2.value_state(&d2).unwrap();
    let raw = weir_state::ValueState::<weir_state::TtlValue<u64>>::from_id(s4.id);
    assert_eq!(entries(&mut r2, raw).len(), 1);
}

fn incremental_cleanup_removes_expired_entries_as_the_state_is_used() {
    let mut b = backend();
    let s = b
        .value_state(
            &ValueStateDescriptor::<u64>::new("v").enable_ttl(ttl(10).incremental_cleanup(50)),
        )
        .unwrap();
    for i in 0..2000u64 {
        at(&mut b, &format!("old{i}"), 0).update(s, i);
    }
    assert_eq!(b.num_entries().unwrap(), 2000);
    // Later accesses of one live key check 50 entries each: 2000 entries take ~40 of them.
    let live = "live".to_string();
    for n in 0..100 {
        at(&mut b, &live, 1_000 + n).update(s, n as u64);
    }
    assert_eq!(b.num_entries().unwrap(), 1, "only the live key is left");
}

fn ttl_and_plain_registrations_of_one_state_are_incompatible() {
    let mut b = backend();
    b.value_state(&ValueStateDescriptor::<u64>::new("v").enable_ttl(ttl(10)))
        .unwrap();
    let (handle, bytes) = write(&mut b);
    let mut r = restore(&handle, &bytes);
    let err = r
        .value_state(&ValueStateDescriptor::<u64>::new("v"))
        .unwrap_err()
        .to_string();
    assert!(err.contains("'v'") && err.contains("TtlValue"), "{err}");
}

fn clearing_a_ttl_state_of_any_kind_works() {
    let mut b = backend();
    let v = b
        .value_state(&ValueStateDescriptor::<u64>::new("v").enable_ttl(ttl(100)))
        .unwrap();
    let l = b
        .list_state(&ListStateDescriptor::<u32>::new("l").enable_ttl(ttl(100)))
        .unwrap();
    let m = b
        .map_state(&MapStateDescriptor::<String, u32>::new("m").enable_ttl(ttl(100)))
        .unwrap();
    let r = b
        .reducing_state(
            &ReducingStateDescriptor::<u64>::new("r", |a, b| a + b).enable_ttl(ttl(100)),
        )
        .unwrap();
    let a = b
        .aggregating_state(&AggregatingStateDescriptor::new("a", Avg).enable_ttl(ttl(100)))
        .unwrap();
    let k = "k".to_string();
    let mut s = at(&mut b, &k, 0);
    s.update(v, 1);
    s.list_add(l, 2);
    s.map_put(m, "x".into(), 3);
    s.reduce(&r, 4);
    s.aggregate(&a, 5);
    s.clear(v);
    s.list_update(l, Vec::new());
    s.clear_raw(m.raw);
    s.clear_raw(r.raw);
    s.clear_raw(a.raw);
    assert_eq!(s.value(v), None);
    assert_eq!(s.list(l).count(), 0);
    assert!(s.map_is_empty(m));
    assert_eq!(s.reduced(&r), None);
    assert_eq!(s.aggregated(&a), None);
    assert_eq!(b.num_entries().unwrap(), 0);
}

/// Runs each test on every backend.
macro_rules! on_every_backend {
    ($($test:ident),* $(,)?) => {
        mod heap {
            $(#[test]
            fn $test() {
                super::BACKEND.set("heap");
                super::$test();
            })*
        }
        mod memory_store {
            $(#[test]
            fn $test() {
                super::BACKEND.set("memory-store");
                super::$test();
            })*
        }
    };
}

on_every_backend!(
    a_value_expires_after_its_ttl_since_the_last_write,
    on_read_and_write_renews_on_every_read,
    return_expired_if_not_cleaned_up_returns_it_until_a_cleanup,
    list_elements_expire_one_by_one,
    map_entries_expire_one_by_one,
    reducing_and_aggregating_states_start_over_after_expiry,
    full_snapshots_leave_expired_entries_out,
    incremental_cleanup_removes_expired_entries_as_the_state_is_used,
    ttl_and_plain_registrations_of_one_state_are_incompatible,
    clearing_a_ttl_state_of_any_kind_works,
);
