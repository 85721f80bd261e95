//! A restore's first half, shared by the keyed backends: it checks and reads the snapshot parts
//! a subtask is handed into per-state blocks that wait, as bytes, until their state is
//! registered with its types, and then decodes them (key groups in parallel for a large state).
//!
//! The heap backend decodes them into its tables; the store backend
//! (`store`) into its `KeyedStore`. Either writes a state
//! that is never registered back into its snapshots as the bytes it read.

use crate::StateError;
use crate::format::{
    self, BlockKind, Compression, MAX_STATES, SERIALIZER_VERSION, SectionWriter, SnapshotHeader,
    StateKind, StateMeta,
};
use crate::keyed::{RestoreFilePart, RestorePart, StateKey, StateValue};
use rustc_hash::FxBuildHasher;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use weir_core::CoreError;
use weir_core::keygroup::{KeyGroup, KeyGroupRange, KeyHash, murmur_hash};

/// One state's entries in one key group, decoded.
pub(crate) type Group<K, V> = hashbrown::HashMap<K, V, FxBuildHasher>;

mod file;
pub(crate) use file::RestoreFile;

/// A state's bytes in one key group, restored but not decoded yet.
#[derive(Clone)]
pub(crate) struct RawGroup {
    entry_count: u32,
    entries: RawEntries,
}

/// Where a restored block's entries are.
#[derive(Clone)]
pub(crate) enum RawEntries {
    /// A slice of the restored bytes (or of a decompressed section), shared, not copied.
    Memory(bytes::Bytes),
    /// In a section of a local file the restore was handed: read, and checked again, when its
    /// state is registered or written back (see [`file`]).
    File(file::FileBlock),
}

impl RawEntries {
    /// The entries' length (decompressed).
    pub(crate) fn len(&self) -> usize {
        match self {
            RawEntries::Memory(bytes) => bytes.len(),
            RawEntries::File(block) => block.len(),
        }
    }

    /// The entries, read from the file if they are in one.
    pub(crate) fn load(&self) -> Result<bytes::Bytes, StateError> {
        match self {
            RawEntries::Memory(bytes) => Ok(bytes.clone()),
            RawEntries::File(block) => block.load(),
        }
    }
}

/// One restored block: entries or tombstones. A key group of a restored incremental chain has
/// several, applied in order.
#[derive(Clone)]
pub(crate) struct RawBlock {
    kind: BlockKind,
    raw: RawGroup,
}

/// A key group's section as a restore reads it: checked, and its blocks copied out of the
/// restored bytes (or located in the restored file).
#[derive(Default)]
pub(crate) struct ReadSection {
    /// How the section was stored.
    compression: Compression,
    /// The blocks, by state id in the snapshot's header, in order.
    blocks: Vec<(i16, RawBlock)>,
}

/// Checks (and decompresses) the section of `kg` by `header`'s version and copies its blocks,
/// to be kept until their states are registered.
pub(crate) fn read_section(
    header: &SnapshotHeader,
    kg: KeyGroup,
    bytes: &[u8],
    stored: &bytes::Bytes,
) -> Result<ReadSection, StateError> {
    let section = header.parse_section(kg, bytes)?;
    Ok(ReadSection {
        compression: section.compression(),
        blocks: section
            .iter()
            .map(|block| {
                let raw = RawGroup {
                    entry_count: block.entry_count,
                    entries: RawEntries::Memory(section.shared_entries(&block, stored)),
                };
                (
                    block.state_id,
                    RawBlock {
                        kind: block.kind,
                        raw,
                    },
                )
            })
            .collect(),
    })
}

/// A restored state waiting for its registration.
#[derive(Clone)]
pub(crate) struct PendingState {
    pub kind: StateKind,
    pub key_type: String,
    pub value_type: String,
    pub serializer_version: u32,
    /// By `kg - range.start`: the blocks restored for the key group, in order (one for a full
    /// snapshot; more from an incremental chain).
    pub groups: Vec<Vec<RawBlock>>,
}

impl PendingState {
    /// Whether any key group has more than one block, or a tombstone: writing the state back
    /// then needs format version 3.
    pub(crate) fn has_overlays(&self) -> bool {
        self.groups.iter().any(|blocks| {
            blocks.len() > 1 || blocks.iter().any(|b| b.kind == BlockKind::Tombstones)
        })
    }

    pub(crate) fn meta(&self, id: i16, name: &str) -> StateMeta {
        StateMeta {
            id,
            name: name.to_string(),
            kind: self.kind,
            key_type: self.key_type.clone(),
            value_type: self.value_type.clone(),
            serializer_version: self.serializer_version,
        }
    }

    /// An upper bound of the entries this state restores: its blocks' entry counts (a chain's
    /// later blocks may replace or remove earlier ones' entries).
    pub(crate) fn entries_at_most(&self) -> u64 {
        self.groups
            .iter()
            .flatten()
            .map(|b| u64::from(b.raw.entry_count))
            .sum()
    }

    /// Writes this state's blocks of the key group at `index` back as they were read.
    pub(crate) fn write_group(
        &self,
        index: usize,
        state_id: i16,
        section: &mut SectionWriter,
    ) -> Result<(), StateError> {
        for block in self.groups.get(index).into_iter().flatten() {
            let raw = &block.raw;
            if raw.entry_count > 0 {
                let entries = raw.entries.load()?;
                section.any_block(block.kind, state_id, raw.entry_count, &entries)?;
            }
        }
        Ok(())
    }
}

/// Decodes a restored state's bytes into a fresh table, checking that each key belongs to
/// the key group it was found in and appears once.
///
/// Key groups are decoded independently; a large state (at least [`PARALLEL_MIN_BYTES`])
/// spreads them over a few scoped threads. Either way the result is the same, and a failure
/// is that of the first failing key group in order.
pub(crate) fn decode_pending<K: StateKey, V: StateValue>(
    name: &str,
    pending: &PendingState,
    range: KeyGroupRange,
    max_parallelism: u32,
) -> Result<Vec<Arc<Group<K, V>>>, StateError> {
    decode_pending_window(
        name,
        pending,
        range,
        max_parallelism,
        0..pending.groups.len(),
    )
}

/// As [`decode_pending`], for the key groups at `window` (indices into `range`) only: a store
/// takes a large restored state in windows, so a registration's decoded entries are bounded by
/// a window's, not the state's (see [`pending_windows`]).
pub(crate) fn decode_pending_window<K: StateKey, V: StateValue>(
    name: &str,
    pending: &PendingState,
    range: KeyGroupRange,
    max_parallelism: u32,
    window: std::ops::Range<usize>,
) -> Result<Vec<Arc<Group<K, V>>>, StateError> {
    let raws = pending.groups.get(window.clone()).ok_or_else(|| {
        StateError::Restore(format!(
            "state '{name}': key groups {window:?} of {} were asked for",
            pending.groups.len()
        ))
    })?;
    let start = range.start + window.start as u32;
    let key_groups = KeyGroupOf::new(max_parallelism);
    let decode = |index: usize| -> Result<Group<K, V>, StateError> {
        let kg = start + index as u32;
        match raws.get(index).map(Vec::as_slice) {
            None | Some([]) => Ok(Group::default()),
            Some([only]) if only.kind == BlockKind::Entries => {
                decode_group(name, kg, key_groups, &only.raw)
            }
            Some(blocks) => apply_blocks(name, kg, key_groups, blocks),
        }
    };
    let bytes = raws
        .iter()
        .flatten()
        .map(|block| block.raw.entries.len())
        .sum();
    let busy = raws
        .iter()
        .filter(|blocks| blocks.iter().any(|b| b.raw.entry_count > 0))
        .count();
    let groups = in_order_until_error(raws.len(), threads_for(bytes, busy), decode)
        .into_iter()
        .map(|table| table.map(Arc::new))
        .collect::<Result<Vec<_>, _>>()?;
    if groups.len() != raws.len() {
        return Err(StateError::Restore(format!(
            "state '{name}': {} of {} key groups were decoded",
            groups.len(),
            raws.len()
        )));
    }
    Ok(groups)
}

/// Splits a restored state's key groups into consecutive windows of at most `max_bytes` of
/// restored blocks each (a key group larger than that is a window of its own), covering every
/// key group in order.
pub(crate) fn pending_windows(
    pending: &PendingState,
    max_bytes: usize,
) -> Vec<std::ops::Range<usize>> {
    let mut windows = Vec::new();
    let (mut start, mut bytes) = (0, 0usize);
    for (i, blocks) in pending.groups.iter().enumerate() {
        let group: usize = blocks.iter().map(|b| b.raw.entries.len()).sum();
        if i > start && bytes + group > max_bytes {
            windows.push(start..i);
            (start, bytes) = (i, 0);
        }
        bytes += group;
    }
    if start < pending.groups.len() {
        windows.push(start..pending.groups.len());
    }
    windows
}

/// A restore reads (checks and copies), or a registration decodes, at least this many bytes of
/// key groups on several threads.
const PARALLEL_MIN_BYTES: usize = 1 << 20;

/// The most threads a restore or a registration uses (the calling thread included).
const MAX_RESTORE_THREADS: usize = 4;

/// How many threads to process `bytes` in `items` independent key groups with.
pub(crate) fn threads_for(bytes: usize, items: usize) -> usize {
    if bytes < PARALLEL_MIN_BYTES || items < 2 {
        return 1;
    }
    std::thread::available_parallelism()
        .map_or(1, usize::from)
        .min(MAX_RESTORE_THREADS)
        .min(items)
}

/// Runs `work` for the items `0..count` in order, up to the first that fails: the results of
/// `0..=first failure` (all of them if none fails), in order, exactly as a serial loop that
/// stops at the first error would give them.
///
/// With `threads > 1`, scoped threads (the calling thread being one) take the items in turn; a
/// thread skips an item only when an earlier one has failed, so every item up to the first
/// failure is run, and the result does not depend on the threads' timing.
pub(crate) fn in_order_until_error<T: Send>(
    count: usize,
    threads: usize,
    work: impl Fn(usize) -> Result<T, StateError> + Sync,
) -> Vec<Result<T, StateError>> {
    if threads <= 1 {
        let mut results = Vec::with_capacity(count);
        for index in 0..count {
            let result = work(index);
            let failed = result.is_err();
            results.push(result);
            if failed {
                break;
            }
        }
        return results;
    }
    let next = AtomicUsize::new(0);
    let first_failed = AtomicUsize::new(usize::MAX);
    let worker = || {
        let mut done = Vec::new();
        loop {
            let index = next.fetch_add(1, Ordering::Relaxed);
            if index >= count {
                return done;
            }
            if index > first_failed.load(Ordering::Relaxed) {
                continue;
            }
            let result = work(index);
            if result.is_err() {
                first_failed.fetch_min(index, Ordering::Relaxed);
            }
            done.push((index, result));
        }
    };
    let mut results = std::thread::scope(|scope| {
        // A helper the system refuses to start is done without: the others take its share.
        let helpers: Vec<_> = (1..threads)
            .filter_map(|_| {
                std::thread::Builder::new()
                    .name("weir-state-restore".to_string())
                    .spawn_scoped(scope, worker)
                    .ok()
            })
            .collect();
        let mut results = worker();
        for helper in helpers {
            match helper.join() {
                Ok(theirs) => results.extend(theirs),
                Err(panic) => std::panic::resume_unwind(panic),
            }
        }
        results
    });
    results.sort_unstable_by_key(|(index, _)| *index);
    let end = first_failed.into_inner().saturating_add(1).min(count);
    // Every item below the first failure ran, so the sorted results start with `0..end`.
    results
        .into_iter()
        .enumerate()
        .take_while(|(position, (index, _))| position == index && *index < end)
        .map(|(_, (_, result))| result)
        .collect()
}

/// Computes key groups as [`assign_to_key_group`](weir_core::keygroup::assign_to_key_group)
/// does, with the modulo by the max parallelism done by multiplication (Lemire's "fastmod"), as
/// the divisor is fixed for a whole restore.
#[derive(Clone, Copy, Debug)]
pub(crate) struct KeyGroupOf {
    max_parallelism: u32,
    /// `ceil(2^64 / max_parallelism)`, wrapping to 0 for a max parallelism of 1.
    multiplier: u64,
}

impl KeyGroupOf {
    pub(crate) fn new(max_parallelism: u32) -> KeyGroupOf {
        let max_parallelism = max_parallelism.max(1);
        KeyGroupOf {
            max_parallelism,
            multiplier: (u64::MAX / u64::from(max_parallelism)).wrapping_add(1),
        }
    }

    /// `murmur_hash(key.key_hash()) % max_parallelism`.
    #[inline]
    pub(crate) fn of<K: KeyHash + ?Sized>(self, key: &K) -> KeyGroup {
        let hash = murmur_hash(key.key_hash()) as u32;
        let low = self.multiplier.wrapping_mul(u64::from(hash));
        ((u128::from(low) * u128::from(self.max_parallelism)) >> 64) as u32
    }
}

/// Decodes one state's entries in key group `kg` into a table sized for them, checking that each
/// key belongs to `kg` and appears once.
pub(crate) fn decode_group<K: StateKey, V: StateValue>(
    name: &str,
    kg: KeyGroup,
    key_groups: KeyGroupOf,
    raw: &RawGroup,
) -> Result<Group<K, V>, StateError> {
    let entries = raw.entries.load()?;
    let (entry_count, bytes) = (raw.entry_count, &entries[..]);
    // An entry takes at least a byte (a non-empty key), so the bytes bound what a damaged count
    // could make us allocate.
    let capacity = (entry_count as usize).min(bytes.len());
    let mut map = Group::<K, V>::with_capacity_and_hasher(capacity, FxBuildHasher);
    let what = || format!("state '{name}' in key group {kg}");
    format::decode_entries_with(what, entry_count, bytes, |k, v| {
        let actual = key_groups.of(&k);
        if actual != kg {
            return Err(misplaced(what(), actual, kg));
        }
        if map.insert(k, v).is_some() {
            return Err(duplicate(what()));
        }
        Ok(())
    })?;
    Ok(map)
}

/// Decodes a key group restored from an incremental chain: the first block (the full
/// snapshot's, if it has entries there), then each later block in order, entries replacing and
/// tombstones removing.
pub(crate) fn apply_blocks<K: StateKey, V: StateValue>(
    name: &str,
    kg: KeyGroup,
    key_groups: KeyGroupOf,
    blocks: &[RawBlock],
) -> Result<Group<K, V>, StateError> {
    let (mut map, rest) = match blocks.split_first() {
        Some((first, rest)) if first.kind == BlockKind::Entries => {
            (decode_group(name, kg, key_groups, &first.raw)?, rest)
        }
        _ => (Group::<K, V>::default(), blocks),
    };
    let what = || format!("state '{name}' in key group {kg}");
    for block in rest {
        let raw = &block.raw;
        let entries = raw.entries.load()?;
        match block.kind {
            BlockKind::Entries => {
                format::decode_entries_with(what, raw.entry_count, &entries, |k: K, v: V| {
                    let actual = key_groups.of(&k);
                    if actual != kg {
                        return Err(misplaced(what(), actual, kg));
                    }
                    map.insert(k, v);
                    Ok(())
                })?
            }
            BlockKind::Tombstones => {
                format::decode_keys_with(what, raw.entry_count, &entries, |k: K| {
                    let actual = key_groups.of(&k);
                    if actual != kg {
                        return Err(misplaced(what(), actual, kg));
                    }
                    map.remove(&k);
                    Ok(())
                })?
            }
        }
    }
    Ok(map)
}

#[cold]
#[inline(never)]
fn misplaced(what: String, actual: KeyGroup, kg: KeyGroup) -> StateError {
    StateError::Core(CoreError::Corrupt {
        what,
        reason: format!("a key of key group {actual} was found in key group {kg}"),
    })
}

#[cold]
#[inline(never)]
fn duplicate(what: String) -> StateError {
    StateError::Core(CoreError::Corrupt {
        what,
        reason: "a key appears twice".to_string(),
    })
}

pub(crate) fn incompatible(name: &str, reason: String) -> StateError {
    StateError::Incompatible {
        name: name.to_string(),
        reason,
    }
}

/// The states a restore read and no registration has taken yet, and which key groups it
/// handed over.
#[derive(Clone, Default)]
pub(crate) struct Restored {
    /// Restored states not registered yet, by name.
    pub pending: BTreeMap<String, Arc<PendingState>>,
    /// Which key groups have been restored, by `kg - range.start`; empty before any restore.
    pub restored: Vec<bool>,
    /// The files of parts restored from files ([`Restored::restore_files`]), while any block
    /// still holds them.
    pub files: Vec<std::sync::Weak<RestoreFile>>,
    /// Whether the blocks of pending states are in buffers of their own. A restore shares them
    /// with the bytes it was handed (no copy while states are registered and decoded); the first
    /// snapshot copies what is still pending, so that a state never registered does not keep
    /// the whole restore buffer alive.
    pub owned: bool,
}

impl Restored {
    /// Nothing restored.
    pub(crate) fn new() -> Restored {
        Restored {
            owned: true,
            ..Restored::default()
        }
    }

    /// Copies the blocks of states still pending out of the restore's shared buffers (once).
    pub(crate) fn own_pending_bytes(&mut self) {
        if self.owned {
            return;
        }
        for pending in self.pending.values_mut() {
            for block in Arc::make_mut(pending).groups.iter_mut().flatten() {
                if let RawEntries::Memory(bytes) = &block.raw.entries {
                    block.raw.entries = RawEntries::Memory(bytes::Bytes::copy_from_slice(bytes));
                }
            }
        }
        self.owned = true;
    }

    /// Reads `parts` (keeping the key groups of `range`) into the pending states, checking
    /// their headers against `max_parallelism` and `key_type`; a failure leaves `self` as it
    /// was. The caller checks that no state is registered yet.
    pub(crate) fn restore(
        &mut self,
        parts: &[RestorePart<'_>],
        range: KeyGroupRange,
        max_parallelism: u32,
        key_type: &str,
    ) -> Result<(), StateError> {
        let parts: Vec<PartSource<'_, '_>> = parts.iter().map(PartSource::Memory).collect();
        self.restore_sources(&parts, range, max_parallelism, key_type)
    }

    /// [`restore`](Self::restore) from parts in local files: each section is read and checked,
    /// and its blocks kept as places in the file (which stays open), so that what a restore
    /// holds in memory does not grow with the restored state. The blocks are read again, and
    /// checked again, when their state is registered (a window of key groups at a time) or
    /// written back into a snapshot.
    pub(crate) fn restore_files(
        &mut self,
        parts: &[RestoreFilePart<'_>],
        range: KeyGroupRange,
        max_parallelism: u32,
        key_type: &str,
    ) -> Result<(), StateError> {
        // A file several parts share is opened once, across calls too (one file descriptor per
        // file while its blocks wait).
        let mut files = Vec::with_capacity(parts.len());
        for part in parts {
            let open = self
                .files
                .iter()
                .filter_map(std::sync::Weak::upgrade)
                .find(|f| f.path() == part.path);
            let file = match open {
                Some(file) => file,
                None => {
                    let file = Arc::new(RestoreFile::open(part.path)?);
                    self.files.retain(|f| f.strong_count() > 0);
                    self.files.push(Arc::downgrade(&file));
                    file
                }
            };
            files.push(file);
        }
        let parts: Vec<PartSource<'_, '_>> = parts
            .iter()
            .zip(&files)
            .map(|(part, file)| PartSource::File(part, file))
            .collect();
        self.restore_sources(&parts, range, max_parallelism, key_type)
    }

    fn restore_sources(
        &mut self,
        parts: &[PartSource<'_, '_>],
        range: KeyGroupRange,
        max_parallelism: u32,
        key_type: &str,
    ) -> Result<(), StateError> {
        let n = range.len() as usize;
        // Work on copies, so that a failed restore leaves the backend as it was.
        let mut restored = if self.restored.is_empty() {
            vec![false; n]
        } else {
            self.restored.clone()
        };
        let mut pending = self.pending.clone();

        for source in parts {
            let part = source.handle_and_header();
            let header = SnapshotHeader::decode(part.header)?;
            if header.max_parallelism != max_parallelism {
                return Err(StateError::Restore(format!(
                    "the snapshot of key groups {} was taken with max parallelism {}, this \
                     backend has {}; key groups cannot be mapped across max parallelisms",
                    header.key_group_range, header.max_parallelism, max_parallelism
                )));
            }
            if header.key_group_range != part.handle.key_group_range {
                return Err(StateError::Restore(format!(
                    "the snapshot header covers key groups {}, its handle says {}",
                    header.key_group_range, part.handle.key_group_range
                )));
            }
            admit_states(&header, key_type, n, &mut pending)?;
            if pending.len() > MAX_STATES {
                return Err(StateError::TooManyStates {
                    name: pending.keys().next_back().cloned().unwrap_or_default(),
                    count: pending.len(),
                    max: MAX_STATES,
                });
            }
            // Checking the sections and copying their blocks out of the part is most of a
            // restore's work, independent per key group: done first, on several threads for a
            // large part, and then taken in key-group order, so that the errors are those (and
            // come in the order) of a serial restore.
            let (key_groups, read) = source.read_sections(&header, &range)?;
            let mut read = read.into_iter();
            for &kg in &key_groups {
                let index = (kg - range.start) as usize;
                match restored.get_mut(index) {
                    Some(seen) if *seen && !header.delta => {
                        return Err(StateError::Restore(format!(
                            "key group {kg} is restored twice: two snapshots (or two restores) \
                             hand it over"
                        )));
                    }
                    Some(seen) if !*seen && header.delta => {
                        return Err(StateError::Restore(format!(
                            "key group {kg} comes in a delta (an incremental snapshot) before \
                             any full snapshot of it: the chain is incomplete or out of order"
                        )));
                    }
                    Some(seen) => *seen = true,
                    None => {
                        return Err(StateError::Restore(format!(
                            "key group {kg} is outside {}",
                            range
                        )));
                    }
                }
                let section = read.next().ok_or_else(|| {
                    StateError::Restore(format!("the section of key group {kg} was not read"))
                })??;
                let stored = section.compression;
                if stored.is_enabled() && stored != header.compression {
                    return Err(StateError::Core(CoreError::Corrupt {
                        what: format!("keyed snapshot section of key group {kg}"),
                        reason: format!(
                            "it is compressed with {stored}, and the header's codec is {}",
                            header.compression
                        ),
                    }));
                }
                for (state_id, block) in section.blocks {
                    let meta = usize::try_from(state_id)
                        .ok()
                        .and_then(|i| header.states.get(i))
                        .ok_or_else(|| {
                            StateError::Core(CoreError::Corrupt {
                                what: format!("keyed snapshot section of key group {kg}"),
                                reason: format!(
                                    "state id {state_id} is not in the header's {} states",
                                    header.states.len()
                                ),
                            })
                        })?;
                    let slot = pending
                        .get_mut(&meta.name)
                        .map(Arc::make_mut)
                        .and_then(|p| p.groups.get_mut(index))
                        .ok_or_else(|| {
                            StateError::Restore(format!(
                                "state '{}' lost its place for key group {kg}",
                                meta.name
                            ))
                        })?;
                    slot.push(block);
                }
            }
        }
        self.pending = pending;
        self.restored = restored;
        self.owned = self.pending.is_empty();
        Ok(())
    }
}

/// The handle and header of a part, whatever holds its sections.
struct HandleAndHeader<'p> {
    handle: &'p weir_core::handle::KeyedStateHandle,
    header: &'p [u8],
}

/// A part handed to a restore: its sections in memory, or in a local file (opened).
enum PartSource<'p, 'a> {
    Memory(&'p RestorePart<'a>),
    File(&'p RestoreFilePart<'a>, &'p Arc<RestoreFile>),
}

impl<'p> PartSource<'p, '_> {
    fn handle_and_header(&self) -> HandleAndHeader<'p> {
        match self {
            PartSource::Memory(p) => HandleAndHeader {
                handle: p.handle,
                header: p.header,
            },
            PartSource::File(p, _) => HandleAndHeader {
                handle: p.handle,
                header: p.header,
            },
        }
    }

    /// The key groups of `range` the part holds, in order, and each one's section read up to
    /// the first that fails. Checking the sections and copying their blocks out of the part is
    /// most of a restore's work, independent per key group: done first, on several threads for
    /// a large part, and then taken in key-group order, so that the errors are those (and come
    /// in the order) of a serial restore.
    #[allow(clippy::type_complexity)]
    fn read_sections(
        &self,
        header: &SnapshotHeader,
        range: &KeyGroupRange,
    ) -> Result<(Vec<KeyGroup>, Vec<Result<ReadSection, StateError>>), StateError> {
        match self {
            PartSource::Memory(part) => {
                let sections = format::part_sections(part, range)?;
                let bytes = sections.iter().map(|(_, b)| b.len()).sum();
                let threads = threads_for(bytes, sections.len());
                let read =
                    in_order_until_error(sections.len(), threads, |i| match sections.get(i) {
                        Some(&(kg, bytes)) => read_section(header, kg, bytes, &part.sections),
                        None => Ok(ReadSection::default()),
                    });
                Ok((sections.iter().map(|(kg, _)| *kg).collect(), read))
            }
            PartSource::File(part, file) => {
                if part.at.saturating_add(part.len) > file.len() {
                    return Err(StateError::Restore(format!(
                        "the part's bytes [{}, {}) are not inside {} ({} bytes)",
                        part.at,
                        part.at.saturating_add(part.len),
                        part.path.display(),
                        file.len()
                    )));
                }
                let spans =
                    format::section_spans(part.handle, part.sections_offset, part.len, range)?
                        .into_iter()
                        .map(|(kg, span)| (kg, span.start + part.at..span.end + part.at))
                        .collect::<Vec<_>>();
                let bytes = spans.iter().map(|(_, s)| s.end - s.start).sum::<u64>();
                let threads =
                    threads_for(usize::try_from(bytes).unwrap_or(usize::MAX), spans.len());
                let read = in_order_until_error(spans.len(), threads, |i| match spans.get(i) {
                    Some((kg, span)) => file::read_section(file, header, *kg, span.clone()),
                    None => Ok(ReadSection::default()),
                });
                Ok((spans.iter().map(|(kg, _)| *kg).collect(), read))
            }
        }
    }
}

/// Adds the states `header` holds to `pending` (with `n` key groups each), checking their key
/// type and that snapshots of one restore agree on each state's kind and value type.
fn admit_states(
    header: &SnapshotHeader,
    key_type: &str,
    n: usize,
    pending: &mut BTreeMap<String, Arc<PendingState>>,
) -> Result<(), StateError> {
    for meta in &header.states {
        if meta.key_type != key_type {
            return Err(incompatible(
                &meta.name,
                format!(
                    "the snapshot's keys are of type `{}`, this backend's are `{key_type}`",
                    meta.key_type
                ),
            ));
        }
        match pending.get(&meta.name) {
            Some(p) => {
                if p.kind != meta.kind
                    || p.value_type != meta.value_type
                    || p.serializer_version != meta.serializer_version
                {
                    return Err(incompatible(
                        &meta.name,
                        format!(
                            "the snapshots disagree: one holds a {} state of `{}` \
                             (serializer {}), another a {} state of `{}` (serializer {})",
                            p.kind,
                            p.value_type,
                            p.serializer_version,
                            meta.kind,
                            meta.value_type,
                            meta.serializer_version
                        ),
                    ));
                }
            }
            None => {
                pending.insert(
                    meta.name.clone(),
                    Arc::new(PendingState {
                        kind: meta.kind,
                        key_type: meta.key_type.clone(),
                        value_type: meta.value_type.clone(),
                        serializer_version: meta.serializer_version,
                        groups: vec![Vec::new(); n],
                    }),
                );
            }
        }
    }
    Ok(())
}

/// Checks that a restored state can be registered as a `kind` state of `value_type`.
pub(crate) fn check_registration(
    name: &str,
    pending: &PendingState,
    kind: StateKind,
    value_type: &str,
) -> Result<(), StateError> {
    if pending.kind != kind {
        return Err(incompatible(
            name,
            format!(
                "the snapshot holds it as a {} state of `{}`, and it is now \
                 registered as a {kind} state of `{value_type}`",
                pending.kind, pending.value_type
            ),
        ));
    }
    if pending.value_type != value_type {
        return Err(incompatible(
            name,
            format!(
                "the snapshot holds values of type `{}`, and it is now registered \
                 with values of type `{value_type}`",
                pending.value_type
            ),
        ));
    }
    if pending.serializer_version != SERIALIZER_VERSION {
        return Err(incompatible(
            name,
            format!(
                "the snapshot's serializer version is {}, this build reads {}",
                pending.serializer_version, SERIALIZER_VERSION
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use weir_core::keygroup::assign_to_key_group;

    #[test]
    fn in_order_until_error_stops_at_the_first_failure_whatever_the_threads() {
        let work = |i: usize| {
            if i == 7 || i == 12 {
                Err(StateError::Restore(i.to_string()))
            } else {
                Ok(i)
            }
        };
        for threads in 1..=4 {
            let results = in_order_until_error(20, threads, work);
            assert_eq!(results.len(), 8, "{threads} threads");
            for (i, result) in results.iter().enumerate().take(7) {
                assert_eq!(result.as_ref().ok(), Some(&i), "{threads} threads");
            }
            assert!(
                matches!(&results[7], Err(StateError::Restore(m)) if m == "7"),
                "{threads} threads"
            );
            let all = in_order_until_error(20, threads, Ok::<usize, StateError>);
            let all: Vec<usize> = all.into_iter().map(Result::unwrap).collect();
            assert_eq!(all, (0..20).collect::<Vec<_>>(), "{threads} threads");
            assert!(in_order_until_error(0, threads, work).is_empty());
        }
    }

    #[test]
    fn pending_windows_cover_every_key_group_in_order_within_the_bound() {
        let block = |len: usize| RawBlock {
            kind: BlockKind::Entries,
            raw: RawGroup {
                entry_count: 1,
                entries: RawEntries::Memory(bytes::Bytes::from(vec![0u8; len])),
            },
        };
        // Key groups of 0 to 39 bytes in one or two blocks, one of 100 (over the bound).
        let groups: Vec<Vec<RawBlock>> = (0..50usize)
            .map(|i| match i {
                17 => vec![block(100)],
                i if i % 3 == 0 => vec![block(i % 20), block(i % 7)],
                i => vec![block(i % 40)],
            })
            .collect();
        let sizes: Vec<usize> = groups
            .iter()
            .map(|g| g.iter().map(|b| b.raw.entries.len()).sum())
            .collect();
        let pending = PendingState {
            kind: StateKind::Value,
            key_type: String::new(),
            value_type: String::new(),
            serializer_version: 0,
            groups,
        };
        for max in [1, 40, 64, 1000, usize::MAX] {
            let windows = pending_windows(&pending, max);
            let mut next = 0;
            for w in &windows {
                assert_eq!(w.start, next, "max {max}: {windows:?}");
                assert!(w.end > w.start, "max {max}: {windows:?}");
                let bytes: usize = sizes[w.clone()].iter().sum();
                assert!(
                    bytes <= max || w.len() == 1,
                    "max {max}: {w:?} holds {bytes} B"
                );
                // A window ends only where the next key group would pass the bound.
                if w.end < sizes.len() {
                    assert!(
                        bytes + sizes[w.end] > max,
                        "max {max}: {w:?} could take more"
                    );
                }
                next = w.end;
            }
            assert_eq!(next, 50, "max {max}");
        }
        assert_eq!(pending_windows(&pending, usize::MAX), vec![0..50]);
        assert_eq!(pending.entries_at_most(), 67);
        let empty = PendingState {
            groups: Vec::new(),
            ..pending
        };
        assert!(pending_windows(&empty, 10).is_empty());
    }

    #[test]
    fn key_group_of_is_assign_to_key_group() {
        for max_p in [
            1, 2, 3, 5, 7, 8, 100, 127, 128, 129, 1000, 4096, 32767, 32768,
        ] {
            let of = KeyGroupOf::new(max_p);
            for i in 0..5000u64 {
                for k in [i, i.wrapping_mul(0x9e37_79b9_7f4a_7c15), u64::MAX - i] {
                    assert_eq!(of.of(&k), assign_to_key_group(&k, max_p), "{k} of {max_p}");
                }
                let s = format!("key-{i}");
                assert_eq!(of.of(&s), assign_to_key_group(&s, max_p), "{s} of {max_p}");
            }
            for k in [i32::MIN, -1, 0, 1, i32::MAX] {
                assert_eq!(of.of(&k), assign_to_key_group(&k, max_p), "{k} of {max_p}");
            }
        }
    }
}
