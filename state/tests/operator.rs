//! Tests of operator list state: round trips, isolation, type and mode checks, and
//! redistribution for each mode.

// Tests may unwrap; clippy's `allow-unwrap-in-tests` covers `#[test]` functions, not the helpers
// of an integration test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use weir_core::handle::OperatorStateMode::{self, Broadcast, SplitDistribute, Union};
use weir_state::operator::redistribute;
use weir_state::{OperatorStateBackend, StateError};

fn blob(b: &OperatorStateBackend) -> Vec<u8> {
    let mut out = Vec::new();
    let n = b.snapshot().write_to(&mut out).unwrap();
    assert_eq!(n, out.len() as u64);
    out
}

/// A subtask's blob holding `split`, `union` and `broadcast` lists.
fn subtask(split: &[u64], union: &[&str], broadcast: &[u32]) -> Vec<u8> {
    let mut b = OperatorStateBackend::new();
    let s = b.list_state::<u64>("offsets", SplitDistribute).unwrap();
    let u = b.list_state::<String>("seen", Union).unwrap();
    let c = b.list_state::<u32>("rules", Broadcast).unwrap();
    b.update(&s, split).unwrap();
    let union: Vec<String> = union.iter().map(|s| s.to_string()).collect();
    b.update(&u, &union).unwrap();
    b.update(&c, broadcast).unwrap();
    blob(&b)
}

/// What a new subtask holds after restoring `blob`.
fn read<T: weir_state::StateValue>(blob: &[u8], name: &str, mode: OperatorStateMode) -> Vec<T> {
    let mut b = OperatorStateBackend::new();
    b.restore(&[blob]).unwrap();
    let s = b.list_state::<T>(name, mode).unwrap();
    b.get(&s).unwrap()
}

#[test]
fn round_trip() {
    let mut b = OperatorStateBackend::new();
    assert!(b.is_empty());
    let s = b
        .list_state::<(String, u64)>("offsets", SplitDistribute)
        .unwrap();
    let again = b
        .list_state::<(String, u64)>("offsets", SplitDistribute)
        .unwrap();
    assert_eq!(s.id(), again.id());
    b.add(&s, &("p0".to_string(), 10)).unwrap();
    b.add(&s, &("p1".to_string(), 20)).unwrap();
    assert!(!b.is_empty());
    let snapshot = b.snapshot();
    assert_eq!(
        snapshot.states(),
        vec![("offsets".to_string(), SplitDistribute)]
    );
    assert!(!snapshot.is_empty());
    let mut out = Vec::new();
    snapshot.write_to(&mut out).unwrap();
    assert_eq!(&out[0..4], b"WOPS");

    let mut r = OperatorStateBackend::new();
    r.restore(&[&out]).unwrap();
    let rs = r
        .list_state::<(String, u64)>("offsets", SplitDistribute)
        .unwrap();
    assert_eq!(
        r.get(&rs).unwrap(),
        vec![("p0".to_string(), 10), ("p1".to_string(), 20)]
    );
}

#[test]
fn snapshot_is_isolated_from_later_updates() {
    let mut b = OperatorStateBackend::new();
    let s = b.list_state::<u64>("offsets", SplitDistribute).unwrap();
    b.update(&s, &[1, 2, 3]).unwrap();
    let snapshot = b.snapshot();
    b.add(&s, &4).unwrap();
    b.update(&s, &[9]).unwrap();
    let mut out = Vec::new();
    snapshot.write_to(&mut out).unwrap();
    assert_eq!(read::<u64>(&out, "offsets", SplitDistribute), vec![1, 2, 3]);
    assert_eq!(b.get(&s).unwrap(), vec![9]);
}

#[test]
fn mode_and_type_mismatches_are_incompatible() {
    let mut b = OperatorStateBackend::new();
    let _ = b.list_state::<u64>("offsets", SplitDistribute).unwrap();
    let e = b.list_state::<u64>("offsets", Union).unwrap_err();
    assert!(
        matches!(&e, StateError::Incompatible { name, .. } if name == "offsets"),
        "{e}"
    );
    let e = b
        .list_state::<String>("offsets", SplitDistribute)
        .unwrap_err();
    assert!(e.to_string().contains("u64"), "{e}");

    // After a restore too.
    let out = subtask(&[1], &["a"], &[7]);
    let mut r = OperatorStateBackend::new();
    r.restore(&[&out]).unwrap();
    let e = r.list_state::<u64>("seen", SplitDistribute).unwrap_err();
    assert!(e.to_string().contains("Union"), "{e}");
    let e = r.list_state::<u32>("offsets", SplitDistribute).unwrap_err();
    assert!(matches!(e, StateError::Incompatible { .. }));
}

#[test]
fn restore_merges_several_snapshots() {
    let a = subtask(&[1, 2], &["x"], &[7, 8]);
    let b = subtask(&[3], &["y"], &[7, 8]);
    let mut r = OperatorStateBackend::new();
    r.restore(&[&a, &b]).unwrap();
    let s = r.list_state::<u64>("offsets", SplitDistribute).unwrap();
    let u = r.list_state::<String>("seen", Union).unwrap();
    let c = r.list_state::<u32>("rules", Broadcast).unwrap();
    assert_eq!(r.get(&s).unwrap(), vec![1, 2, 3]);
    assert_eq!(r.get(&u).unwrap(), vec!["x".to_string(), "y".to_string()]);
    assert_eq!(r.get(&c).unwrap(), vec![7, 8]);
}

#[test]
fn corrupt_blobs_are_errors() {
    let out = subtask(&[1, 2], &["x"], &[7]);
    for i in 0..out.len() {
        let mut bad = out.clone();
        bad[i] ^= 0x20;
        let mut r = OperatorStateBackend::new();
        assert!(r.restore(&[&bad]).is_err(), "flip at {i}");
        assert!(r.is_empty());
        assert!(redistribute(&[&bad], 2).is_err());
    }
    let mut r = OperatorStateBackend::new();
    assert!(r.restore(&[&out[..out.len() - 1]]).is_err());
}

#[test]
fn redistribute_two_to_three() {
    let old = [
        subtask(&[0, 1, 2], &["a"], &[7, 8]),
        subtask(&[3, 4], &["b"], &[7, 8]),
    ];
    let old: Vec<&[u8]> = old.iter().map(Vec::as_slice).collect();
    let new = redistribute(&old, 3).unwrap();
    assert_eq!(new.len(), 3);

    // Split: 5 elements in contiguous chunks 2, 2, 1.
    let split: Vec<Vec<u64>> = new
        .iter()
        .map(|b| read(b, "offsets", SplitDistribute))
        .collect();
    assert_eq!(split, vec![vec![0, 1], vec![2, 3], vec![4]]);
    // Union: everything everywhere, in old subtask order.
    for b in &new {
        assert_eq!(read::<String>(b, "seen", Union), vec!["a", "b"]);
        assert_eq!(read::<u32>(b, "rules", Broadcast), vec![7, 8]);
    }
}

#[test]
fn split_remainders_rotate_between_states_like_flink() {
    // Two split states of 4 elements over 3 subtasks: the first gives its extra element to
    // subtask 0, the second starts at subtask 1, the first that got no extra.
    let mut b = OperatorStateBackend::new();
    let a = b.list_state::<u64>("a", SplitDistribute).unwrap();
    let c = b.list_state::<u64>("b", SplitDistribute).unwrap();
    b.update(&a, &[0, 1, 2, 3]).unwrap();
    b.update(&c, &[10, 11, 12, 13]).unwrap();
    let old = blob(&b);
    let new = redistribute(&[&old], 3).unwrap();
    let a: Vec<Vec<u64>> = new.iter().map(|b| read(b, "a", SplitDistribute)).collect();
    let c: Vec<Vec<u64>> = new.iter().map(|b| read(b, "b", SplitDistribute)).collect();
    assert_eq!(a, vec![vec![0, 1], vec![2], vec![3]]);
    assert_eq!(c, vec![vec![13], vec![10, 11], vec![12]]);
}

#[test]
fn redistribute_three_to_one() {
    let old = [
        subtask(&[0, 1], &["a"], &[1]),
        subtask(&[], &["b"], &[2]),
        subtask(&[2], &[], &[3]),
    ];
    let old: Vec<&[u8]> = old.iter().map(Vec::as_slice).collect();
    let new = redistribute(&old, 1).unwrap();
    assert_eq!(new.len(), 1);
    assert_eq!(
        read::<u64>(&new[0], "offsets", SplitDistribute),
        vec![0, 1, 2]
    );
    assert_eq!(read::<String>(&new[0], "seen", Union), vec!["a", "b"]);
    assert_eq!(read::<u32>(&new[0], "rules", Broadcast), vec![1]);
}

#[test]
fn redistribute_keeps_split_state_in_place_at_the_same_parallelism() {
    let old = [
        subtask(&[0, 1, 2], &["a"], &[1]),
        subtask(&[], &["b"], &[1]),
    ];
    let old: Vec<&[u8]> = old.iter().map(Vec::as_slice).collect();
    let new = redistribute(&old, 2).unwrap();
    assert_eq!(
        read::<u64>(&new[0], "offsets", SplitDistribute),
        vec![0, 1, 2]
    );
    assert!(read::<u64>(&new[1], "offsets", SplitDistribute).is_empty());
    assert_eq!(read::<String>(&new[1], "seen", Union), vec!["a", "b"]);
}

#[test]
fn redistribute_rejects_disagreeing_subtasks_and_zero() {
    let mut a = OperatorStateBackend::new();
    let s = a.list_state::<u64>("x", SplitDistribute).unwrap();
    a.add(&s, &1).unwrap();
    let mut b = OperatorStateBackend::new();
    let u = b.list_state::<u64>("x", Union).unwrap();
    b.add(&u, &1).unwrap();
    let (a, b) = (blob(&a), blob(&b));
    let e = redistribute(&[&a, &b], 2).unwrap_err();
    assert!(
        matches!(&e, StateError::Incompatible { name, .. } if name == "x"),
        "{e}"
    );
    assert!(redistribute(&[&a], 0).is_err());
}
