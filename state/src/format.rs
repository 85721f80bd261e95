//! The keyed snapshot format: a checksummed header with every state's metadata, then one
//! checksummed section per key group, so that a restore reads only the key groups it owns.
//!
//! # Layout (format version 1)
//!
//! A snapshot of a backend owning key groups `range` is one byte stream:
//!
//! ```text
//! stream   := header section(range.start) section(range.start + 1) ... section(range.end)
//!
//! header   := magic "WKSH" | version u16 LE (1) | flags u16 LE | payload length u64 LE
//!             | payload | CRC-32 u32 LE of everything before it          (weir_core::codec::seal)
//! payload  := postcard(HeaderV1)
//! HeaderV1 := key_group_range { start u32, end u32 } | max_parallelism u32 | states: [StateMeta]
//! StateMeta:= id i16 | name string | kind string | key_type string | value_type string
//!             | serializer_version u32
//!
//! section  := key_group u32 LE | block_count u16 LE | block* | CRC-32 u32 LE of the section
//!             before it
//! block    := state_id i16 LE | entry_count u32 LE | entries_len u64 LE | entries
//! entries  := (postcard(key) postcard(value))*, sorted by the bytes of postcard(key)
//! ```
//!
//! - **flags** is the envelope's flags field. Bit 0 means "key-group sections are compressed";
//!   it is reserved and always 0 in this version, as are the other bits. A reader rejects any
//!   flag it does not know.
//! - **states** are numbered `0..n` in order (`id == index`); at most `i16::MAX` of them.
//!   `kind` is `"value"` today; `"list"`, `"map"`, `"reducing"` and `"aggregating"` are reserved
//!   names for the kinds to come. `key_type` and `value_type` are Rust type names
//!   (`std::any::type_name`), checked on restore. `serializer_version` is 1: postcard.
//! - Every key group of the range has a section, in order, even an empty one (10 bytes), so the
//!   offsets are uniform. A section has one block per state with at least one entry in that key
//!   group, in ascending state id. Blocks carry their byte length, so a restore can keep a
//!   state's bytes without knowing its value type until the state is registered.
//! - Entries are sorted by their encoded key, so equal state gives byte-identical snapshots.
//! - The writer returns a [`KeyedSnapshotLayout`](crate::KeyedSnapshotLayout): the header's byte
//!   range, each section's start offset and the end. A restore slices one key group's section
//!   out of a [`RestorePart`] with those offsets ([`part_sections`]), and checks its key group
//!   and checksum ([`parse_section`]).
//!
//! The same description, with the version history, is in `docs/keyed-snapshot-format.md`.

use crate::StateError;
use crate::keyed::RestorePart;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use std::collections::HashSet;
use std::fmt;
use weir_core::CoreError;
use weir_core::codec;
use weir_core::handle::KeyedStateHandle;
use weir_core::keygroup::{KeyGroup, KeyGroupRange, UPPER_BOUND_MAX_PARALLELISM};

/// The header's magic bytes.
pub const MAGIC: [u8; 4] = *b"WKSH";
/// The format version this build writes.
pub const FORMAT_VERSION: u16 = 1;
/// The format versions this build reads.
pub const READABLE_VERSIONS: &[u16] = &[1];
/// Header flag bit 0: key-group sections are compressed. Reserved: never set in version 1.
pub const FLAG_KEY_GROUP_COMPRESSION: u16 = 1;
/// The serializer version recorded for postcard-encoded keys and values.
pub const SERIALIZER_VERSION: u32 = 1;
/// The most states a snapshot can number (state ids are `i16`).
pub const MAX_STATES: usize = i16::MAX as usize;
/// Bytes of a section without blocks: key group, block count and checksum.
pub const EMPTY_SECTION_LEN: usize = 4 + 2 + 4;
/// Bytes of a block before its entries: state id, entry count and entries length.
const BLOCK_HEADER_LEN: usize = 2 + 4 + 8;

/// What a state holds; recorded in the header so that a restore registers it as the same kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum StateKind {
    /// One value per key.
    Value,
    /// A list per key (reserved).
    List,
    /// A map per key (reserved).
    Map,
    /// A reduced value per key (reserved).
    Reducing,
    /// An aggregate per key (reserved).
    Aggregating,
}

impl StateKind {
    /// The name written in the header.
    pub fn as_str(self) -> &'static str {
        match self {
            StateKind::Value => "value",
            StateKind::List => "list",
            StateKind::Map => "map",
            StateKind::Reducing => "reducing",
            StateKind::Aggregating => "aggregating",
        }
    }

    /// The kind a header name stands for, if any.
    pub fn parse(name: &str) -> Option<StateKind> {
        Some(match name {
            "value" => StateKind::Value,
            "list" => StateKind::List,
            "map" => StateKind::Map,
            "reducing" => StateKind::Reducing,
            "aggregating" => StateKind::Aggregating,
            _ => return None,
        })
    }
}

impl fmt::Display for StateKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One state's metadata in the header.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StateMeta {
    /// The state's id: its index in the header, and the id its blocks carry.
    pub id: i16,
    /// The state's name, unique within the operator.
    pub name: String,
    /// What the state holds.
    pub kind: StateKind,
    /// The key type's name.
    pub key_type: String,
    /// The value type's name.
    pub value_type: String,
    /// The version of the encoding of keys and values ([`SERIALIZER_VERSION`]).
    pub serializer_version: u32,
}

/// A snapshot's header: the key groups it covers and every state's metadata.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SnapshotHeader {
    /// The envelope flags; 0 in version 1 (see [`FLAG_KEY_GROUP_COMPRESSION`]).
    pub flags: u16,
    /// The key groups the snapshot has sections for.
    pub key_group_range: KeyGroupRange,
    /// The max parallelism the keys were hashed with.
    pub max_parallelism: u32,
    /// The states, with `states[i].id == i`.
    pub states: Vec<StateMeta>,
}

#[derive(Serialize)]
struct HeaderWireRef<'a> {
    key_group_range: KeyGroupRange,
    max_parallelism: u32,
    states: Vec<StateMetaWireRef<'a>>,
}

#[derive(Serialize)]
struct StateMetaWireRef<'a> {
    id: i16,
    name: &'a str,
    kind: &'a str,
    key_type: &'a str,
    value_type: &'a str,
    serializer_version: u32,
}

#[derive(Deserialize)]
struct HeaderWire {
    key_group_range: KeyGroupRange,
    max_parallelism: u32,
    states: Vec<StateMetaWire>,
}

#[derive(Deserialize)]
struct StateMetaWire {
    id: i16,
    name: String,
    kind: String,
    key_type: String,
    value_type: String,
    serializer_version: u32,
}

const HEADER_WHAT: &str = "keyed snapshot header";

fn header_corrupt(reason: String) -> StateError {
    StateError::Core(CoreError::Corrupt {
        what: HEADER_WHAT.to_string(),
        reason,
    })
}

impl SnapshotHeader {
    /// Encodes the header in its envelope.
    pub fn encode(&self) -> Result<Vec<u8>, StateError> {
        if self.flags != 0 {
            return Err(StateError::Core(CoreError::Encode {
                what: HEADER_WHAT.to_string(),
                reason: format!(
                    "flags {:#06x} are not supported by format version {FORMAT_VERSION}",
                    self.flags
                ),
            }));
        }
        if self.states.len() > MAX_STATES {
            return Err(StateError::TooManyStates {
                name: self
                    .states
                    .last()
                    .map(|s| s.name.clone())
                    .unwrap_or_default(),
                count: self.states.len(),
                max: MAX_STATES,
            });
        }
        let wire = HeaderWireRef {
            key_group_range: self.key_group_range,
            max_parallelism: self.max_parallelism,
            states: self
                .states
                .iter()
                .map(|s| StateMetaWireRef {
                    id: s.id,
                    name: &s.name,
                    kind: s.kind.as_str(),
                    key_type: &s.key_type,
                    value_type: &s.value_type,
                    serializer_version: s.serializer_version,
                })
                .collect(),
        };
        let payload = codec::encode(HEADER_WHAT, &wire)?;
        Ok(codec::seal(MAGIC, FORMAT_VERSION, &payload))
    }

    /// Opens and checks a header: envelope, flags, and the consistency of its fields.
    pub fn decode(bytes: &[u8]) -> Result<SnapshotHeader, StateError> {
        let (_version, payload) = codec::open(HEADER_WHAT, MAGIC, READABLE_VERSIONS, bytes)?;
        // `open` checked that the envelope is complete, so the flags field is there.
        let flags = match bytes.get(6..8) {
            Some(&[a, b]) => u16::from_le_bytes([a, b]),
            _ => return Err(header_corrupt("truncated before the flags".to_string())),
        };
        if flags != 0 {
            return Err(header_corrupt(format!(
                "flags {flags:#06x} are not supported (bit 0, key-group compression, is reserved)"
            )));
        }
        let wire: HeaderWire = codec::decode(HEADER_WHAT, payload)?;
        if wire.max_parallelism == 0 || wire.max_parallelism > UPPER_BOUND_MAX_PARALLELISM {
            return Err(header_corrupt(format!(
                "max parallelism {} is out of bounds",
                wire.max_parallelism
            )));
        }
        let range = wire.key_group_range;
        if !range.is_empty() && range.end >= wire.max_parallelism {
            return Err(header_corrupt(format!(
                "key-group range {range} does not fit max parallelism {}",
                wire.max_parallelism
            )));
        }
        if wire.states.len() > MAX_STATES {
            return Err(header_corrupt(format!(
                "{} states, more than the {MAX_STATES} the format can number",
                wire.states.len()
            )));
        }
        let mut states: Vec<StateMeta> = Vec::with_capacity(wire.states.len());
        let mut names = HashSet::with_capacity(wire.states.len());
        for (index, s) in wire.states.into_iter().enumerate() {
            if usize::try_from(s.id).ok() != Some(index) {
                return Err(header_corrupt(format!(
                    "state '{}' has id {} at position {index}",
                    s.name, s.id
                )));
            }
            if !names.insert(s.name.clone()) {
                return Err(header_corrupt(format!("state '{}' appears twice", s.name)));
            }
            let Some(kind) = StateKind::parse(&s.kind) else {
                return Err(header_corrupt(format!(
                    "state '{}' has unknown kind '{}'",
                    s.name, s.kind
                )));
            };
            states.push(StateMeta {
                id: s.id,
                name: s.name,
                kind,
                key_type: s.key_type,
                value_type: s.value_type,
                serializer_version: s.serializer_version,
            });
        }
        Ok(SnapshotHeader {
            flags,
            key_group_range: range,
            max_parallelism: wire.max_parallelism,
            states,
        })
    }
}

/// Builds one key group's section. Reuse one writer for all sections of a snapshot.
#[derive(Debug, Default)]
pub struct SectionWriter {
    buf: Vec<u8>,
    blocks: u16,
    last_id: Option<i16>,
}

impl SectionWriter {
    /// A writer with no section begun.
    pub fn new() -> SectionWriter {
        SectionWriter::default()
    }

    /// Starts the section of `key_group`, discarding any unfinished one.
    pub fn begin(&mut self, key_group: KeyGroup) {
        self.buf.clear();
        self.buf.extend_from_slice(&key_group.to_le_bytes());
        self.buf.extend_from_slice(&0u16.to_le_bytes());
        self.blocks = 0;
        self.last_id = None;
    }

    /// Appends a state's block: `entries` holds `entry_count` encoded entries. Blocks must come
    /// in ascending state id.
    pub fn block(
        &mut self,
        state_id: i16,
        entry_count: u32,
        entries: &[u8],
    ) -> Result<(), StateError> {
        let encode_err = |reason: String| {
            StateError::Core(CoreError::Encode {
                what: format!("keyed snapshot block of state {state_id}"),
                reason,
            })
        };
        if state_id < 0 || self.last_id.is_some_and(|last| last >= state_id) {
            return Err(encode_err(format!(
                "state id {state_id} is negative or not above the previous block's {:?}",
                self.last_id
            )));
        }
        if self.buf.len() < EMPTY_SECTION_LEN - 4 {
            return Err(encode_err("no section begun".to_string()));
        }
        self.blocks = self
            .blocks
            .checked_add(1)
            .ok_or_else(|| encode_err("too many blocks in one section".to_string()))?;
        self.last_id = Some(state_id);
        self.buf.reserve(BLOCK_HEADER_LEN + entries.len());
        self.buf.extend_from_slice(&state_id.to_le_bytes());
        self.buf.extend_from_slice(&entry_count.to_le_bytes());
        self.buf
            .extend_from_slice(&(entries.len() as u64).to_le_bytes());
        self.buf.extend_from_slice(entries);
        Ok(())
    }

    /// Ends the section: sets the block count, appends the checksum and returns the bytes.
    pub fn finish(&mut self) -> &[u8] {
        if let Some(count) = self.buf.get_mut(4..6) {
            count.copy_from_slice(&self.blocks.to_le_bytes());
        }
        let crc = crc32fast::hash(&self.buf);
        self.buf.extend_from_slice(&crc.to_le_bytes());
        &self.buf
    }
}

/// One state's entries in one key group, as read from a section.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StateBlock<'a> {
    /// The state's id in the snapshot's header.
    pub state_id: i16,
    /// How many entries `entries` holds.
    pub entry_count: u32,
    /// The encoded entries (see [`decode_entries`]).
    pub entries: &'a [u8],
}

fn section_corrupt(key_group: KeyGroup, reason: String) -> StateError {
    StateError::Core(CoreError::Corrupt {
        what: format!("keyed snapshot section of key group {key_group}"),
        reason,
    })
}

fn take<const N: usize>(bytes: &mut &[u8]) -> Option<[u8; N]> {
    let (head, rest) = bytes.split_first_chunk::<N>()?;
    *bytes = rest;
    Some(*head)
}

/// Checks the section of `key_group` (its checksum, its key group, its framing) and returns its
/// blocks. Every failure is a [`CoreError::Corrupt`] naming the key group.
pub fn parse_section(key_group: KeyGroup, bytes: &[u8]) -> Result<Vec<StateBlock<'_>>, StateError> {
    let corrupt = |reason: String| section_corrupt(key_group, reason);
    if bytes.len() < EMPTY_SECTION_LEN {
        return Err(corrupt(format!(
            "truncated: {} bytes is shorter than an empty section ({EMPTY_SECTION_LEN})",
            bytes.len()
        )));
    }
    let (body, crc) = bytes.split_at(bytes.len() - 4);
    let stored = u32::from_le_bytes([crc[0], crc[1], crc[2], crc[3]]);
    let actual = crc32fast::hash(body);
    if stored != actual {
        return Err(corrupt(format!(
            "checksum mismatch: stored {stored:08x}, computed {actual:08x}"
        )));
    }
    let mut rest = body;
    let truncated = || corrupt("truncated block".to_string());
    let kg = u32::from_le_bytes(take::<4>(&mut rest).ok_or_else(truncated)?);
    if kg != key_group {
        return Err(corrupt(format!(
            "the section is that of key group {kg}; the offsets are wrong"
        )));
    }
    let count = u16::from_le_bytes(take::<2>(&mut rest).ok_or_else(truncated)?);
    let mut blocks = Vec::with_capacity(usize::from(count).min(rest.len() / BLOCK_HEADER_LEN));
    let mut last: Option<i16> = None;
    for _ in 0..count {
        let state_id = i16::from_le_bytes(take::<2>(&mut rest).ok_or_else(truncated)?);
        let entry_count = u32::from_le_bytes(take::<4>(&mut rest).ok_or_else(truncated)?);
        let len = u64::from_le_bytes(take::<8>(&mut rest).ok_or_else(truncated)?);
        if state_id < 0 || last.is_some_and(|l| l >= state_id) {
            return Err(corrupt(format!(
                "state id {state_id} is negative or out of order"
            )));
        }
        last = Some(state_id);
        let len = usize::try_from(len)
            .ok()
            .filter(|&l| l <= rest.len())
            .ok_or_else(|| {
                corrupt(format!(
                    "state {state_id}'s block claims {len} bytes, {} are left",
                    rest.len()
                ))
            })?;
        let (entries, after) = rest.split_at(len);
        rest = after;
        blocks.push(StateBlock {
            state_id,
            entry_count,
            entries,
        });
    }
    if !rest.is_empty() {
        return Err(corrupt(format!(
            "{} bytes after the last block",
            rest.len()
        )));
    }
    Ok(blocks)
}

/// Encodes a state's entries in one key group in the deterministic order: sorted by encoded key.
/// Reuse one encoder for a whole snapshot; it keeps its buffers.
#[derive(Debug, Default)]
pub struct EntryEncoder {
    buf: Vec<u8>,
    index: Vec<(usize, usize, usize)>,
    sorted: Vec<u8>,
}

impl EntryEncoder {
    /// A new encoder.
    pub fn new() -> EntryEncoder {
        EntryEncoder::default()
    }

    /// Encodes `entries` and returns their number and bytes (sorted by encoded key).
    pub fn encode<'a, K, V>(
        &mut self,
        entries: impl IntoIterator<Item = (&'a K, &'a V)>,
    ) -> Result<(u32, &[u8]), StateError>
    where
        K: Serialize + 'a,
        V: Serialize + 'a,
    {
        self.buf.clear();
        self.index.clear();
        self.sorted.clear();
        for (key, value) in entries {
            let key_start = self.buf.len();
            codec::encode_into("state key", key, &mut self.buf)?;
            let key_end = self.buf.len();
            codec::encode_into("state value", value, &mut self.buf)?;
            self.index.push((key_start, key_end, self.buf.len()));
        }
        let count = u32::try_from(self.index.len()).map_err(|_| {
            StateError::Core(CoreError::Encode {
                what: "keyed snapshot block".to_string(),
                reason: format!("{} entries in one key group", self.index.len()),
            })
        })?;
        let buf = &self.buf;
        self.index
            .sort_unstable_by(|a, b| buf[a.0..a.1].cmp(&buf[b.0..b.1]));
        self.sorted.reserve(buf.len());
        for &(start, _, end) in &self.index {
            self.sorted.extend_from_slice(&buf[start..end]);
        }
        Ok((count, &self.sorted))
    }
}

/// Decodes the `entry_count` entries of a block, handing each to `f`. `what` names the state and
/// key group in errors. The entries must fill `bytes` exactly.
pub fn decode_entries<K, V>(
    what: &str,
    entry_count: u32,
    bytes: &[u8],
    mut f: impl FnMut(K, V) -> Result<(), StateError>,
) -> Result<(), StateError>
where
    K: DeserializeOwned,
    V: DeserializeOwned,
{
    let mut rest = bytes;
    for i in 0..entry_count {
        let (key, after): (K, _) = codec::decode_prefix(what, rest).map_err(|e| at_entry(e, i))?;
        let (value, after): (V, _) =
            codec::decode_prefix(what, after).map_err(|e| at_entry(e, i))?;
        rest = after;
        f(key, value)?;
    }
    if !rest.is_empty() {
        return Err(StateError::Core(CoreError::Decode {
            what: what.to_string(),
            reason: format!(
                "{} bytes left after the {entry_count} entries the block declares",
                rest.len()
            ),
        }));
    }
    Ok(())
}

fn at_entry(e: CoreError, i: u32) -> CoreError {
    match e {
        CoreError::Decode { what, reason } => CoreError::Decode {
            what,
            reason: format!("entry {i}: {reason}"),
        },
        other => other,
    }
}

/// The sections of the key groups in `range` (intersected with the part's own range), sliced out
/// of a restore part with its handle's offsets, in key-group order. The sections are not checked
/// yet; see [`parse_section`].
pub fn part_sections<'a>(
    part: &RestorePart<'a>,
    range: &KeyGroupRange,
) -> Result<Vec<(KeyGroup, &'a [u8])>, StateError> {
    let handle = part.handle;
    let own = handle.key_group_range;
    if handle.offsets.len() != own.len() as usize {
        return Err(StateError::Restore(format!(
            "the handle for key groups {own} has {} section offsets, expected {}",
            handle.offsets.len(),
            own.len()
        )));
    }
    let overlap = own.intersection(range);
    let mut out = Vec::with_capacity(overlap.len() as usize);
    let part_end = part
        .sections_offset
        .saturating_add(part.sections.len() as u64);
    for kg in overlap.iter() {
        let i = (kg - own.start) as usize;
        let (Some(&start), end) = (handle.offsets.get(i), handle.offsets.get(i + 1)) else {
            return Err(StateError::Restore(format!(
                "no section offset for key group {kg}"
            )));
        };
        let end = end.copied().unwrap_or(handle.end);
        if end < start || start < part.sections_offset || end > part_end {
            return Err(StateError::Restore(format!(
                "key group {kg}'s section [{start}, {end}) is not inside the bytes handed to the \
                 restore [{}, {part_end})",
                part.sections_offset
            )));
        }
        let (rel_start, rel_end) = (
            (start - part.sections_offset) as usize,
            (end - part.sections_offset) as usize,
        );
        match part.sections.get(rel_start..rel_end) {
            Some(bytes) => out.push((kg, bytes)),
            None => {
                return Err(StateError::Restore(format!(
                    "key group {kg}'s section is out of the part's bytes"
                )));
            }
        }
    }
    Ok(out)
}

/// A restore part for a whole snapshot stream held in memory (an inline handle, a file read
/// whole): slices the header and the sections out of `stream` with the handle's offsets.
pub fn whole_stream_part<'a>(
    handle: &'a KeyedStateHandle,
    stream: &'a [u8],
) -> Result<RestorePart<'a>, StateError> {
    let (h_start, h_end) = handle.header;
    let bad = || {
        StateError::Restore(format!(
            "the handle's header range [{h_start}, {h_end}) and end {} do not fit a stream of {} \
             bytes",
            handle.end,
            stream.len()
        ))
    };
    let h_start = usize::try_from(h_start).map_err(|_| bad())?;
    let h_end = usize::try_from(h_end).map_err(|_| bad())?;
    let end = usize::try_from(handle.end).map_err(|_| bad())?;
    if h_start > h_end || h_end > end {
        return Err(bad());
    }
    let header = stream.get(h_start..h_end).ok_or_else(bad)?;
    let sections = stream.get(h_end..end).ok_or_else(bad)?;
    Ok(RestorePart {
        handle,
        header,
        sections,
        sections_offset: handle.header.1,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header() -> SnapshotHeader {
        SnapshotHeader {
            flags: 0,
            key_group_range: KeyGroupRange::new(3, 9),
            max_parallelism: 128,
            states: vec![StateMeta {
                id: 0,
                name: "count".to_string(),
                kind: StateKind::Value,
                key_type: "alloc::string::String".to_string(),
                value_type: "u64".to_string(),
                serializer_version: SERIALIZER_VERSION,
            }],
        }
    }

    #[test]
    fn header_round_trips_and_starts_with_magic() {
        let h = header();
        let bytes = h.encode().unwrap();
        assert_eq!(&bytes[0..4], b"WKSH");
        assert_eq!(u16::from_le_bytes([bytes[4], bytes[5]]), 1);
        assert_eq!(SnapshotHeader::decode(&bytes).unwrap(), h);
    }

    #[test]
    fn header_rejects_flags_and_damage() {
        let bytes = header().encode().unwrap();
        let mut flagged = bytes.clone();
        flagged[6] = 1;
        let e = SnapshotHeader::decode(&flagged).unwrap_err().to_string();
        assert!(e.contains("keyed snapshot header"), "{e}");
        for i in 0..bytes.len() {
            let mut b = bytes.clone();
            b[i] ^= 0x10;
            assert!(
                SnapshotHeader::decode(&b).is_err(),
                "flip at {i} went unnoticed"
            );
        }
        let mut compressed = header();
        compressed.flags = FLAG_KEY_GROUP_COMPRESSION;
        assert!(compressed.encode().is_err());
    }

    #[test]
    fn header_rejects_unknown_kind_and_bad_ids() {
        let wire = HeaderWireRef {
            key_group_range: KeyGroupRange::new(0, 1),
            max_parallelism: 2,
            states: vec![StateMetaWireRef {
                id: 0,
                name: "s",
                kind: "histogram",
                key_type: "k",
                value_type: "v",
                serializer_version: 1,
            }],
        };
        let sealed = codec::seal(MAGIC, 1, &codec::encode("t", &wire).unwrap());
        let e = SnapshotHeader::decode(&sealed).unwrap_err().to_string();
        assert!(e.contains("unknown kind 'histogram'"), "{e}");

        let wire = HeaderWireRef {
            states: vec![StateMetaWireRef {
                id: 4,
                name: "s",
                kind: "value",
                key_type: "k",
                value_type: "v",
                serializer_version: 1,
            }],
            ..wire
        };
        let sealed = codec::seal(MAGIC, 1, &codec::encode("t", &wire).unwrap());
        let e = SnapshotHeader::decode(&sealed).unwrap_err().to_string();
        assert!(e.contains("id 4 at position 0"), "{e}");
    }

    #[test]
    fn sections_round_trip_and_name_their_key_group() {
        let mut enc = EntryEncoder::new();
        let (a, b) = ("b".to_string(), "a".to_string());
        let entries = [(&a, &1u64), (&b, &2u64)];
        let (count, bytes) = enc.encode(entries.iter().copied()).unwrap();
        assert_eq!(count, 2);
        let bytes = bytes.to_vec();

        let mut w = SectionWriter::new();
        w.begin(7);
        w.block(0, count, &bytes).unwrap();
        w.block(3, 0, &[]).unwrap();
        assert!(w.block(3, 0, &[]).is_err(), "ids must ascend");
        let section = w.finish().to_vec();

        let blocks = parse_section(7, &section).unwrap();
        assert_eq!(blocks.len(), 2);
        assert_eq!(blocks[0].state_id, 0);
        let mut seen = Vec::new();
        decode_entries::<String, u64>("t", blocks[0].entry_count, blocks[0].entries, |k, v| {
            seen.push((k, v));
            Ok(())
        })
        .unwrap();
        // Sorted by encoded key: "a" before "b".
        assert_eq!(seen, vec![("a".to_string(), 2), ("b".to_string(), 1)]);

        let e = parse_section(8, &section).unwrap_err().to_string();
        assert!(
            e.contains("key group 8") && e.contains("key group 7"),
            "{e}"
        );
        for i in 0..section.len() {
            let mut s = section.clone();
            s[i] ^= 0x01;
            let e = parse_section(7, &s).unwrap_err().to_string();
            assert!(e.contains("key group 7"), "{e}");
        }
        let e = parse_section(7, &section[..5]).unwrap_err().to_string();
        assert!(e.contains("truncated"), "{e}");
    }

    #[test]
    fn empty_section_is_ten_bytes() {
        let mut w = SectionWriter::new();
        w.begin(0);
        assert_eq!(w.finish().len(), EMPTY_SECTION_LEN);
    }

    #[test]
    fn decode_entries_rejects_wrong_counts_and_types() {
        let mut enc = EntryEncoder::new();
        let k = 5u32;
        let v = "hello".to_string();
        let (count, bytes) = enc.encode([(&k, &v)]).unwrap();
        let bytes = bytes.to_vec();
        assert!(decode_entries::<u32, String>("t", count + 1, &bytes, |_, _| Ok(())).is_err());
        assert!(decode_entries::<u32, String>("t", 0, &bytes, |_, _| Ok(())).is_err());
        // A string read as (u32 key, u64 value) leaves bytes over or fails; it never panics.
        let _ = decode_entries::<u32, u64>("t", count, &bytes, |_, _| Ok(()));
    }
}
