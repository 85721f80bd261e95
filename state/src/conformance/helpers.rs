//! Shared helpers: the check context [`Cx`], the backend under test, snapshots written and read.

use super::SuiteKey;
use crate::StateError;
use crate::format;
use crate::format::{EMPTY_SECTION_LEN, SnapshotHeader, StateKind};
use crate::keyed::{
    KeyedSnapshot, KeyedSnapshotLayout, KeyedStateBackend, RestorePart, StateKey, StateValue,
    ValueState, ValueStateDescriptor,
};
use std::any::type_name;
use std::collections::HashMap;
use std::fmt::{Debug, Display};
use std::marker::PhantomData;
use std::panic::{AssertUnwindSafe, catch_unwind};
use weir_core::handle::{KeyedStateHandle, StreamStateHandle};
use weir_core::keygroup::{KeyGroup, KeyGroupRange, assign_to_key_group};
use weir_core::panic::panic_message;

/// The check being run and the backend it runs on, for failure messages.
pub(super) struct Cx {
    pub(super) check: String,
    pub(super) backend: &'static str,
}

impl Cx {
    pub(super) fn new<B>(check: impl Into<String>) -> Cx {
        Cx {
            check: check.into(),
            backend: type_name::<B>(),
        }
    }

    #[track_caller]
    pub(super) fn fail(&self, msg: impl Display) -> ! {
        panic!(
            "keyed-state conformance [{}] on {}: {msg}",
            self.check, self.backend
        )
    }

    #[track_caller]
    pub(super) fn must(&self, cond: bool, msg: impl FnOnce() -> String) {
        if !cond {
            self.fail(msg())
        }
    }

    #[track_caller]
    pub(super) fn eq<T: PartialEq + Debug + ?Sized>(&self, rule: &str, actual: &T, expected: &T) {
        if actual != expected {
            self.fail(format!("{rule}: got {actual:?}, expected {expected:?}"))
        }
    }

    #[track_caller]
    pub(super) fn ok<T, E: Display>(&self, op: &str, r: Result<T, E>) -> T {
        match r {
            Ok(v) => v,
            Err(e) => self.fail(format!("{op} failed unexpectedly: {e}")),
        }
    }

    /// Runs `f`, which must return an error, and never panic.
    #[track_caller]
    pub(super) fn err<T>(
        &self,
        rule: &str,
        f: impl FnOnce() -> Result<T, StateError>,
    ) -> StateError {
        match self.no_panic(rule, f) {
            Ok(_) => self.fail(format!("{rule}, but it succeeded")),
            Err(e) => e,
        }
    }

    /// Runs `f`, turning a panic into a failure of the rule that errors must not panic.
    #[track_caller]
    pub(super) fn no_panic<T>(&self, op: &str, f: impl FnOnce() -> T) -> T {
        match catch_unwind(AssertUnwindSafe(f)) {
            Ok(v) => v,
            Err(p) => self.fail(format!(
                "{op} panicked ({}); bad input must be an error, never a panic",
                panic_message(p.as_ref())
            )),
        }
    }

    /// Compares two maps, naming a few of the keys that differ.
    #[track_caller]
    pub(super) fn same_map<K: Debug + Eq + std::hash::Hash, V: Debug + PartialEq>(
        &self,
        rule: &str,
        actual: &HashMap<K, V>,
        expected: &HashMap<K, V>,
    ) {
        if actual == expected {
            return;
        }
        let mut diffs: Vec<String> = Vec::new();
        for (k, v) in expected {
            match actual.get(k) {
                None => diffs.push(format!("{k:?} is missing (expected {v:?})")),
                Some(a) if a != v => diffs.push(format!("{k:?} is {a:?}, expected {v:?}")),
                Some(_) => {}
            }
        }
        for (k, v) in actual {
            if !expected.contains_key(k) {
                diffs.push(format!("{k:?} = {v:?} should not be there"));
            }
        }
        let more = diffs.len().saturating_sub(5);
        diffs.truncate(5);
        self.fail(format!(
            "{rule}: {} entries, expected {}; {}{}",
            actual.len(),
            expected.len(),
            diffs.join("; "),
            if more > 0 {
                format!("; and {more} more")
            } else {
                String::new()
            }
        ))
    }
}

pub(super) fn expect_incompatible(cx: &Cx, op: &str, e: &StateError, name: &str, types: &[&str]) {
    match e {
        StateError::Incompatible { name: n, .. } if n == name => {}
        other => cx.fail(format!(
            "{op}: expected StateError::Incompatible naming '{name}', got {other:?}"
        )),
    }
    let msg = e.to_string();
    for t in types {
        cx.must(msg.contains(t), || {
            format!("{op}: the error must name the type `{t}`: {msg}")
        });
    }
}

/// The suite's deterministic generator.
pub(super) use weir_core::splitmix::SplitMix as SplitMix64;

pub(super) fn full(max_p: u32) -> KeyGroupRange {
    KeyGroupRange::new(0, max_p - 1)
}

pub(super) fn keys<K: SuiteKey>(n: u64) -> Vec<K> {
    (0..n).map(K::nth).collect()
}

/// A backend under test, with its key type fixed and small conveniences.
pub(super) struct Subject<'c, K, B> {
    pub(super) b: B,
    pub(super) cx: &'c Cx,
    pub(super) _key: PhantomData<fn() -> K>,
}

/// A fresh backend from `make`, checked to report the range and max parallelism it was made with.
pub(super) fn fresh<'c, K: SuiteKey, B: KeyedStateBackend<K>>(
    cx: &'c Cx,
    make: &impl Fn(u32, KeyGroupRange) -> B,
    max_p: u32,
    range: KeyGroupRange,
) -> Subject<'c, K, B> {
    let b = make(max_p, range);
    cx.eq(
        "key_group_range() is the range the backend was made for",
        &b.key_group_range(),
        &range,
    );
    cx.eq(
        "max_parallelism() is the one the backend was made with",
        &b.max_parallelism(),
        &max_p,
    );
    Subject {
        b,
        cx,
        _key: PhantomData,
    }
}

/// A fresh backend of `range` restored from the parts of `snapshots` that overlap it (the header
/// and only the overlapping sections), as the checkpoint layer hands them over.
pub(super) fn restored<'c, K: SuiteKey, B: KeyedStateBackend<K>>(
    cx: &'c Cx,
    make: &impl Fn(u32, KeyGroupRange) -> B,
    max_p: u32,
    range: KeyGroupRange,
    snapshots: &[&Written],
) -> Result<Subject<'c, K, B>, StateError> {
    let mut s = fresh(cx, make, max_p, range);
    let parts: Vec<RestorePart<'_>> = snapshots
        .iter()
        .filter(|w| !w.handle.key_group_range.intersection(&range).is_empty())
        .map(|w| part_for(cx, w, &range))
        .collect();
    s.b.restore(&parts)?;
    Ok(s)
}

impl<K: SuiteKey, B: KeyedStateBackend<K>> Subject<'_, K, B> {
    pub(super) fn kg(&self, key: &K) -> KeyGroup {
        assign_to_key_group(key, self.b.max_parallelism())
    }

    #[track_caller]
    pub(super) fn register<V: StateValue>(&mut self, name: &str) -> ValueState<V> {
        match self.b.value_state(&ValueStateDescriptor::<V>::new(name)) {
            Ok(s) => s,
            Err(e) => self.cx.fail(format!(
                "registering '{name}' as a value state of `{}` failed unexpectedly: {e}",
                type_name::<V>()
            )),
        }
    }

    pub(super) fn put<V: StateValue>(&mut self, s: ValueState<V>, key: &K, value: V) {
        let g = self.kg(key);
        self.b.update(s, key, g, value);
    }

    pub(super) fn get<V: StateValue>(&mut self, s: ValueState<V>, key: &K) -> Option<V> {
        let g = self.kg(key);
        self.b.value(s, key, g).cloned()
    }

    pub(super) fn clear<V: StateValue>(&mut self, s: ValueState<V>, key: &K) {
        let g = self.kg(key);
        self.b.clear(s, key, g);
    }

    /// Reads every key of `expected` and of `also` through `value`, expecting `expected`'s
    /// values (and no value for a key not in it).
    #[track_caller]
    pub(super) fn read_back<'k, V: StateValue + Debug + PartialEq>(
        &mut self,
        rule: &str,
        s: ValueState<V>,
        expected: &HashMap<K, V>,
        also: impl IntoIterator<Item = &'k K>,
    ) where
        K: 'k,
    {
        for (k, v) in expected {
            let g = self.kg(k);
            let got = self.b.value(s, k, g);
            if got != Some(v) {
                self.cx
                    .fail(format!("{rule}: {k:?} reads {got:?}, expected {v:?}"));
            }
        }
        for k in also {
            let g = self.kg(k);
            let got = self.b.value(s, k, g);
            let want = expected.get(k);
            if got != want {
                self.cx
                    .fail(format!("{rule}: {k:?} reads {got:?}, expected {want:?}"));
            }
        }
    }

    /// Snapshots and writes at once, checking the result is well formed.
    pub(super) fn write(&mut self) -> Written {
        let snapshot = self.cx.ok("snapshot", self.b.snapshot());
        finish::<K>(
            self.cx,
            snapshot,
            self.b.max_parallelism(),
            self.b.key_group_range(),
        )
    }
}

/// A written snapshot: its handle (with an empty inline stream) and its bytes.
pub(super) struct Written {
    pub(super) handle: KeyedStateHandle,
    pub(super) bytes: Vec<u8>,
}

/// Writes a frozen snapshot into memory and checks it is well formed.
pub(super) fn finish<K: StateKey>(
    cx: &Cx,
    snapshot: Box<dyn KeyedSnapshot>,
    max_p: u32,
    range: KeyGroupRange,
) -> Written {
    let mut bytes = Vec::new();
    let layout = cx.ok("writing a snapshot", snapshot.write_to(&mut bytes));
    check_written::<K>(cx, layout, bytes, max_p, range)
}

/// Checks that `bytes` are a snapshot of `range` in the [`crate::format`] and that `layout`
/// describes them: header first, one section per key group in order, each with its key group
/// and a valid checksum, states of key type `K`.
pub(super) fn check_written<K: StateKey>(
    cx: &Cx,
    layout: KeyedSnapshotLayout,
    bytes: Vec<u8>,
    max_p: u32,
    range: KeyGroupRange,
) -> Written {
    cx.eq(
        "a snapshot covers exactly the backend's key groups",
        &layout.key_group_range,
        &range,
    );
    cx.eq(
        "the layout's end is the number of bytes written",
        &layout.end,
        &(bytes.len() as u64),
    );
    cx.eq("the header starts the stream", &layout.header.0, &0);
    cx.eq(
        "the layout has one section offset per key group",
        &layout.offsets.len(),
        &(range.len() as usize),
    );
    let mut at = layout.header.1;
    for (kg, &start) in range.iter().zip(&layout.offsets) {
        cx.must(start >= at && start <= layout.end, || {
            format!(
                "the section of key group {kg} starts at {start}, before the previous one ends \
                 ({at}) or after the end ({})",
                layout.end
            )
        });
        at = start;
    }
    let w = Written {
        handle: layout.into_handle(StreamStateHandle::Inline(Vec::new())),
        bytes,
    };
    let header = header_of(cx, &w);
    cx.eq(
        "the header records the backend's key groups",
        &header.key_group_range,
        &range,
    );
    cx.eq(
        "the header records the backend's max parallelism",
        &header.max_parallelism,
        &max_p,
    );
    for meta in &header.states {
        cx.eq(
            &format!("the header records state '{}' with the key type", meta.name),
            &meta.key_type.as_str(),
            &type_name::<K>(),
        );
    }
    let part = whole_part(cx, &w);
    let sections = cx.ok(
        "slicing the sections with the layout's offsets",
        format::part_sections(&part, &range),
    );
    cx.eq(
        "every key group has a section",
        &sections.len(),
        &(range.len() as usize),
    );
    for (kg, section) in sections {
        cx.must(section.len() >= EMPTY_SECTION_LEN, || {
            format!(
                "the section of key group {kg} is {} bytes, shorter than an empty one",
                section.len()
            )
        });
        let blocks = cx.ok(
            &format!("parsing the section of key group {kg}"),
            header.parse_section(kg, section),
        );
        let mut last = None;
        for block in blocks.iter() {
            cx.must(
                usize::try_from(block.state_id).is_ok_and(|i| i < header.states.len()),
                || {
                    format!(
                        "key group {kg} has a block of unknown state {}",
                        block.state_id
                    )
                },
            );
            cx.must(
                last < Some(block.state_id) || (header.overlays && last == Some(block.state_id)),
                || format!("key group {kg}'s blocks are not in ascending state id"),
            );
            cx.must(block.entry_count > 0, || {
                format!(
                    "key group {kg} has an empty block for state {}",
                    block.state_id
                )
            });
            last = Some(block.state_id);
        }
    }
    w
}

pub(super) fn header_of(cx: &Cx, w: &Written) -> SnapshotHeader {
    let (start, end) = w.handle.header;
    let Some(bytes) = w.bytes.get(start as usize..end as usize) else {
        cx.fail(format!(
            "the header range [{start}, {end}) is outside the {} bytes",
            w.bytes.len()
        ))
    };
    cx.ok(
        "decoding the snapshot header",
        SnapshotHeader::decode(bytes),
    )
}

pub(super) fn whole_part<'a>(cx: &Cx, w: &'a Written) -> RestorePart<'a> {
    cx.ok(
        "slicing the snapshot",
        format::whole_stream_part(&w.handle, &w.bytes),
    )
}

/// The part a checkpoint hands a backend owning `range`: the header, and only the sections of the
/// overlapping key groups. `range` must overlap the snapshot's.
pub(super) fn part_for<'a>(cx: &Cx, w: &'a Written, range: &KeyGroupRange) -> RestorePart<'a> {
    let Some((start, end)) = w.handle.byte_range_for(range) else {
        cx.fail(format!(
            "the snapshot of key groups {} has no bytes for {range}",
            w.handle.key_group_range
        ))
    };
    let (hs, he) = w.handle.header;
    let (Some(header), Some(sections)) = (
        w.bytes.get(hs as usize..he as usize),
        w.bytes.get(start as usize..end as usize),
    ) else {
        cx.fail("the handle's ranges are outside the snapshot's bytes")
    };
    RestorePart {
        handle: &w.handle,
        header,
        sections: bytes::Bytes::copy_from_slice(sections),
        sections_offset: start,
    }
}

/// Every entry of value state `state` in a written snapshot (see [`content_of`]).
pub(super) fn content<K: SuiteKey, V: StateValue>(
    cx: &Cx,
    w: &Written,
    state: &str,
) -> HashMap<K, V> {
    content_of(cx, w, state, StateKind::Value)
}

/// Every entry of state `state`, recorded in the header as a `kind` state, in a written
/// snapshot, read with the [`crate::format`]'s own functions, checking that each key is in the
/// section of its key group, once.
pub(super) fn content_of<K: SuiteKey, V: StateValue>(
    cx: &Cx,
    w: &Written,
    state: &str,
    kind: StateKind,
) -> HashMap<K, V> {
    let header = header_of(cx, w);
    let Some(meta) = header.states.iter().find(|m| m.name == state) else {
        cx.fail(format!(
            "a registered state '{state}' is missing from the snapshot's header"
        ))
    };
    cx.eq(
        &format!("the header records '{state}' as a {kind} state"),
        &meta.kind,
        &kind,
    );
    cx.eq(
        &format!("the header records '{state}' with its value type"),
        &meta.value_type.as_str(),
        &type_name::<V>(),
    );
    let part = whole_part(cx, w);
    let sections = cx.ok(
        "slicing the sections",
        format::part_sections(&part, &w.handle.key_group_range),
    );
    let mut out = HashMap::new();
    for (kg, section) in sections {
        let blocks = cx.ok(
            &format!("parsing the section of key group {kg}"),
            header.parse_section(kg, section),
        );
        cx.must(!header.delta, || {
            format!("content_of reads full snapshots, and the one of '{state}' is a delta")
        });
        for block in blocks.iter().filter(|b| b.state_id == meta.id) {
            cx.must(block.kind == format::BlockKind::Entries, || {
                format!("a full snapshot of '{state}' holds tombstones in key group {kg}")
            });
            let what = format!("state '{state}' in key group {kg}");
            let decoded =
                format::decode_entries::<K, V>(&what, block.entry_count, block.entries, |k, v| {
                    let actual = assign_to_key_group(&k, header.max_parallelism);
                    cx.must(actual == kg, || {
                        format!("{what}: {k:?} belongs to key group {actual}")
                    });
                    cx.must(!out.contains_key(&k), || {
                        format!("{what}: {k:?} appears twice")
                    });
                    out.insert(k, v);
                    Ok(())
                });
            cx.ok(&format!("decoding {what}"), decoded);
        }
    }
    out
}
