//! The keyed snapshot target: a heap backend restores mutated snapshots of every format version
//! still read (1; 2 with lz4 and zstd sections; 3 with deltas, tombstones and overlays), then
//! registers its states (which decodes their entries) and writes a snapshot of what it restored.
//!
//! An input is what a restore is handed: the backend's key groups, and a chain of snapshots,
//! each a handle (as `_metadata` records it) and the stream's bytes. Mutations work on one piece
//! of a stream at a time (the header, a section), sealing it again with a correct checksum most
//! of the time and re-deriving the handle's offsets, so they reach the blocks and the entries;
//! others damage the handle, the whole stream, the chain or the backend's settings.

use crate::harness::{Target, hex};
use crate::rng::Rng;
use crate::targets::keyed_mutate;
use std::sync::Arc;
use std::time::Duration;
use weir_core::handle::{KeyedStateHandle, StreamStateHandle};
use weir_core::keygroup::{
    KeyGroupRange, assign_to_key_group, compute_key_group_range_for_operator_index,
};
use weir_state::format::{self, FORMAT_VERSION_V1, FORMAT_VERSION_V2, FORMAT_VERSION_V3};
use weir_state::{
    Compression, HeapKeyedStateBackend, KeyedAccess, KeyedSnapshot, KeyedStateBackend, ListState,
    ListStateDescriptor, MapState, MapStateDescriptor, StateError, StateTtlConfig, ValueState,
    ValueStateDescriptor,
};

/// The max parallelism of the seeds.
const MAX_PARALLELISM: u32 = 16;
/// The processing time of every backend here (TTL), ms since the Unix epoch.
const NOW_MS: i64 = 1_700_000_000_000;
/// Every state registered ([`Input::register`] bits, in this order).
const ALL_STATES: u8 = 0b1111;

/// The restore of a heap backend.
pub struct Keyed {
    corpus: Vec<Input>,
    donors: keyed_mutate::Donors,
}

impl Keyed {
    /// The target, with its seeds built and taken apart for splicing.
    pub fn new() -> Keyed {
        let corpus = build_seeds().unwrap_or_default();
        let donors = keyed_mutate::Donors::of(&corpus);
        Keyed { corpus, donors }
    }
}

impl Default for Keyed {
    fn default() -> Keyed {
        Keyed::new()
    }
}

/// A restore: the backend's settings and the snapshots it is handed, in order.
#[derive(Clone, Debug)]
pub struct Input {
    /// The backend's max parallelism.
    pub max_parallelism: u32,
    /// The key groups the backend owns.
    pub range: KeyGroupRange,
    /// Which of the four states to register after the restore (bit i: state i).
    pub register: u8,
    /// The chain: a full snapshot, then deltas; or one full snapshot.
    pub parts: Vec<Part>,
}

/// One snapshot handed to the restore.
#[derive(Clone, Debug)]
pub struct Part {
    /// Its handle: key groups, header range, section offsets, end.
    pub handle: KeyedStateHandle,
    /// The stream's bytes.
    pub stream: Vec<u8>,
}

/// The descriptors of the four states every seed holds.
struct Descriptors {
    count: ValueStateDescriptor<u64>,
    names: ListStateDescriptor<String>,
    scores: MapStateDescriptor<u32, i64>,
    session: ValueStateDescriptor<u64>,
}

fn descriptors() -> Descriptors {
    Descriptors {
        count: ValueStateDescriptor::new("count"),
        names: ListStateDescriptor::new("names"),
        scores: MapStateDescriptor::new("scores"),
        session: ValueStateDescriptor::new("session")
            .enable_ttl(StateTtlConfig::new(Duration::from_secs(3600))),
    }
}

/// The registered states.
struct Handles {
    count: ValueState<u64>,
    names: ListState<String>,
    scores: MapState<u32, i64>,
    session: ValueState<u64>,
}

fn backend(range: KeyGroupRange, compression: Compression) -> HeapKeyedStateBackend<String> {
    HeapKeyedStateBackend::new(MAX_PARALLELISM, range)
        .with_compression(compression)
        .with_clock(Arc::new(|| NOW_MS))
}

/// Registers the states `mask` names, in order, as a restored operator would.
fn register(
    b: &mut HeapKeyedStateBackend<String>,
    mask: u8,
) -> Result<Option<Handles>, StateError> {
    let d = descriptors();
    let count = (mask & 1 != 0)
        .then(|| b.value_state(&d.count))
        .transpose()?;
    let names = (mask & 2 != 0)
        .then(|| b.list_state(&d.names))
        .transpose()?;
    let scores = (mask & 4 != 0)
        .then(|| b.map_state(&d.scores))
        .transpose()?;
    let session = (mask & 8 != 0)
        .then(|| b.value_state(&d.session))
        .transpose()?;
    Ok(match (count, names, scores, session) {
        (Some(count), Some(names), Some(scores), Some(session)) => Some(Handles {
            count,
            names,
            scores,
            session,
        }),
        _ => None,
    })
}

/// Writes keys `keys` (those in the backend's key groups) in round `round`.
fn write(
    b: &mut HeapKeyedStateBackend<String>,
    h: &Handles,
    keys: std::ops::Range<u32>,
    round: u32,
) {
    let range = b.key_group_range();
    for i in keys {
        let key = format!("user-{i:04}");
        let kg = assign_to_key_group(&key, MAX_PARALLELISM);
        if !range.contains(kg) {
            continue;
        }
        let mut a = KeyedAccess::new(b, &key, kg).at(NOW_MS);
        a.update(h.count, u64::from(i * round));
        a.list_add(h.names, format!("clicked item {} in round {round}", i % 7));
        a.map_put(h.scores, round, i64::from(i) - 20);
        a.update(h.session, u64::from(i) << 20);
    }
}

/// Removes keys `keys` from every state (tombstones in the next delta).
fn remove(b: &mut HeapKeyedStateBackend<String>, h: &Handles, keys: std::ops::Range<u32>) {
    let range = b.key_group_range();
    for i in keys {
        let key = format!("user-{i:04}");
        let kg = assign_to_key_group(&key, MAX_PARALLELISM);
        if !range.contains(kg) {
            continue;
        }
        let mut a = KeyedAccess::new(b, &key, kg).at(NOW_MS);
        a.clear(h.count);
        a.map_remove(h.scores, &1);
        a.clear(h.session);
    }
}

fn written(snapshot: Box<dyn KeyedSnapshot>) -> Result<Part, StateError> {
    let mut stream = Vec::new();
    let layout = snapshot.write_to(&mut stream)?;
    Ok(Part {
        handle: layout.into_handle(StreamStateHandle::Inline(Vec::new())),
        stream,
    })
}

fn all_groups() -> KeyGroupRange {
    KeyGroupRange::new(0, MAX_PARALLELISM - 1)
}

fn input(range: KeyGroupRange, register: u8, parts: Vec<Part>) -> Input {
    Input {
        max_parallelism: MAX_PARALLELISM,
        range,
        register,
        parts,
    }
}

/// A full snapshot of 60 keys in every state: format version 1, or 2 with a codec.
fn full(compression: Compression) -> Result<Part, StateError> {
    let mut b = backend(all_groups(), compression);
    let h =
        register(&mut b, ALL_STATES)?.ok_or_else(|| StateError::Restore("no handles".into()))?;
    write(&mut b, &h, 0..60, 1);
    write(&mut b, &h, 0..30, 2);
    written(b.snapshot()?)
}

/// An incremental chain: a full snapshot, then two deltas (format version 3) with changed keys
/// and tombstones.
fn chain(compression: Compression) -> Result<Vec<Part>, StateError> {
    let mut b = backend(all_groups(), compression).with_incremental(8);
    let h =
        register(&mut b, ALL_STATES)?.ok_or_else(|| StateError::Restore("no handles".into()))?;
    write(&mut b, &h, 0..60, 1);
    let first = written(b.snapshot_incremental(1)?)?;
    b.notify_checkpoint_complete(1);
    write(&mut b, &h, 10..20, 2);
    remove(&mut b, &h, 20..30);
    let second = written(b.snapshot_incremental(2)?)?;
    b.notify_checkpoint_complete(2);
    write(&mut b, &h, 25..35, 3);
    remove(&mut b, &h, 0..5);
    let third = written(b.snapshot_incremental(3)?)?;
    Ok(vec![first, second, third])
}

/// A full snapshot of a backend that restored `parts` and registered only the count: the other
/// states are carried as the restore's blocks (overlays, format version 3).
fn carried(parts: &[Part]) -> Result<Part, StateError> {
    let mut b = backend(all_groups(), Compression::None);
    let restore: Vec<_> = parts
        .iter()
        .map(|p| format::whole_stream_part(&p.handle, &p.stream))
        .collect::<Result<_, _>>()?;
    b.restore(&restore)?;
    register(&mut b, 1)?;
    written(b.snapshot()?)
}

fn build_seeds() -> Result<Vec<Input>, StateError> {
    let mut seeds = Vec::new();
    for c in Compression::ALL {
        seeds.push(input(all_groups(), ALL_STATES, vec![full(c)?]));
    }
    let plain_chain = chain(Compression::None)?;
    let zstd_chain = chain(Compression::Zstd)?;
    seeds.push(input(all_groups(), ALL_STATES, plain_chain.clone()));
    seeds.push(input(all_groups(), ALL_STATES, chain(Compression::Lz4)?));
    seeds.push(input(all_groups(), ALL_STATES, zstd_chain.clone()));
    // Rescaled: a subtask of parallelism 3 owning part of the key groups.
    let rescaled = compute_key_group_range_for_operator_index(MAX_PARALLELISM, 3, 1);
    seeds.push(input(rescaled, ALL_STATES, vec![full(Compression::Lz4)?]));
    seeds.push(input(rescaled, 0b0101, zstd_chain));
    seeds.push(input(
        all_groups(),
        ALL_STATES,
        vec![carried(&plain_chain)?],
    ));
    // Nothing registered: every state stays pending and is carried into the snapshot.
    seeds.push(input(all_groups(), 0, plain_chain));
    let mut empty = backend(all_groups(), Compression::None);
    seeds.push(input(
        all_groups(),
        ALL_STATES,
        vec![written(empty.snapshot()?)?],
    ));
    Ok(seeds)
}

/// The versions of the seeds' headers, for the unit test and the mutator.
pub const VERSIONS: [u16; 3] = [FORMAT_VERSION_V1, FORMAT_VERSION_V2, FORMAT_VERSION_V3];

/// Runs the restore `input` describes, as a keyed operator's restore does.
pub fn restore(input: &Input) -> Result<(), StateError> {
    let parts: Vec<_> = input
        .parts
        .iter()
        .map(|p| format::whole_stream_part(&p.handle, &p.stream))
        .collect::<Result<_, _>>()?;
    let mut b = HeapKeyedStateBackend::<String>::new(input.max_parallelism, input.range)
        .with_clock(Arc::new(|| NOW_MS));
    b.restore(&parts)?;
    register(&mut b, input.register)?;
    let mut out = Vec::new();
    b.snapshot()?.write_to(&mut out)?;
    Ok(())
}

impl Target for Keyed {
    type Input = Input;

    fn name(&self) -> &'static str {
        "keyed"
    }

    fn seeds(&self) -> Vec<Input> {
        self.corpus.clone()
    }

    fn mutate(&self, input: &mut Input, corpus: &[Input], rng: &mut Rng) {
        match rng.below(100) {
            0..=59 => keyed_mutate::piece(rng, input, &self.donors),
            60..=71 => keyed_mutate::handle(rng, input),
            72..=81 => keyed_mutate::stream(rng, input, &self.donors),
            82..=91 => keyed_mutate::chain(rng, input, corpus),
            _ => settings(rng, input),
        }
    }

    fn run(&self, input: &Input) -> Result<(), String> {
        restore(input).map_err(|e| e.to_string())
    }

    fn describe(&self, input: &Input) -> String {
        let mut out = format!(
            "backend: max parallelism {}, key groups {:?}, register {:#06b}\n",
            input.max_parallelism, input.range, input.register
        );
        for (i, p) in input.parts.iter().enumerate() {
            out.push_str(&format!(
                "part {i}: key groups {:?}, header {:?}, offsets {:?}, end {}\n  stream {}\n",
                p.handle.key_group_range,
                p.handle.header,
                p.handle.offsets,
                p.handle.end,
                hex(&p.stream)
            ));
        }
        out
    }
}

/// Another backend a job could restore with: another max parallelism (a job changed it) or
/// parallelism, or other states registered.
fn settings(rng: &mut Rng, input: &mut Input) {
    match rng.below(3) {
        0 => input.max_parallelism = [MAX_PARALLELISM, 8, 32, 128, 1][rng.below(5)],
        1 => {
            let parallelism = 1 + rng.below(4) as u32;
            let max = input.max_parallelism.max(1);
            input.range = compute_key_group_range_for_operator_index(
                max,
                parallelism.min(max),
                rng.below(parallelism.min(max) as usize) as u32,
            );
        }
        _ => input.register ^= 1 << rng.below(4),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_seeds_cover_every_version_codec_and_block_kind_and_restore() {
        let seeds = build_seeds().unwrap();
        assert_eq!(seeds.len(), 11);
        let mut versions = std::collections::BTreeSet::new();
        let mut codecs = std::collections::BTreeSet::new();
        let mut deltas = 0;
        for seed in &seeds {
            restore(seed).unwrap();
            for p in &seed.parts {
                let header =
                    format::SnapshotHeader::decode(&p.stream[..p.handle.header.1 as usize])
                        .unwrap();
                versions.insert(header.version());
                deltas += usize::from(header.delta);
                for (i, &start) in p.handle.offsets.iter().enumerate() {
                    let end = p.handle.offsets.get(i + 1).copied().unwrap_or(p.handle.end);
                    let kg = p.handle.key_group_range.start + i as u32;
                    let section = header
                        .parse_section(kg, &p.stream[start as usize..end as usize])
                        .unwrap();
                    codecs.insert(section.compression().as_str());
                }
            }
        }
        assert_eq!(versions.into_iter().collect::<Vec<_>>(), VERSIONS);
        assert_eq!(
            codecs.len(),
            3,
            "{codecs:?}: some sections must be stored compressed"
        );
        assert!(deltas >= 6, "{deltas} deltas");
    }
}
