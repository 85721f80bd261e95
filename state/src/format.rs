//! The keyed snapshot format: a checksummed header with every state's metadata, then one
//! checksummed section per key group, so that a restore reads only the key groups it owns.
//!
//! # Layout (format versions 1 and 2; version 3, for deltas, is described in
//! `docs/keyed-snapshot-format.md`)
//!
//! A snapshot of a backend owning key groups `range` is one byte stream:
//!
//! ```text
//! stream   := header section(range.start) section(range.start + 1) ... section(range.end)
//!
//! header   := magic "WKSH" | version u16 LE (1 or 2) | flags u16 LE | payload length u64 LE
//!             | payload | CRC-32 u32 LE of everything before it          (weir_core::codec::seal)
//! payload  := postcard(HeaderV1)                                    (version 1)
//!           | postcard(HeaderV1) codec u8                           (version 2)
//! HeaderV1 := key_group_range { start u32, end u32 } | max_parallelism u32 | states: [StateMeta]
//! StateMeta:= id i16 | name string | kind string | key_type string | value_type string
//!             | serializer_version u32
//!
//! section  := key_group u32 LE | block_count u16 LE | block* | CRC-32 u32 LE of the section
//!             before it                                           (uncompressed; bit 15 clear)
//!           | key_group u32 LE | (0x8000 | block_count) u16 LE | codec u8 | blocks_len u32 LE
//!             | codec(block*) | CRC-32 u32 LE of the section before it     (compressed; version 2)
//! block    := state_id i16 LE | entry_count u32 LE | entries_len u64 LE | entries
//! entries  := (postcard(key) postcard(value))*, sorted by the bytes of postcard(key)
//! ```
//!
//! - **version** is 1 for an uncompressed snapshot ([`Compression::None`], the default), written
//!   byte for byte as before compression existed, and 2 for a snapshot written with a codec.
//! - **flags** is the envelope's flags field. Bit 0 ([`FLAG_KEY_GROUP_COMPRESSION`]) means "key-group
//!   sections may be compressed": always 0 in version 1, always set in version 2. Every other bit
//!   is reserved and 0. A reader rejects any flag it does not know, and a flag that disagrees
//!   with the version.
//! - **codec** (version 2) names the codec the writer compressed sections with: 1 is LZ4 (the
//!   LZ4 block format, `lz4_flex`), 2 is zstd (one zstd frame, level [`ZSTD_LEVEL`]); 0 and any
//!   other value are a corrupt header. See [`Compression::id`].
//! - **states** are numbered `0..n` in order (`id == index`); at most `i16::MAX` of them.
//!   `kind` is one of `"value"`, `"list"`, `"map"`, `"reducing"` and `"aggregating"`; the
//!   value is what the state stores per key (the list, the map, the accumulator; wrapped in
//!   `TtlValue` for a TTL state). `key_type` and `value_type` are Rust type names
//!   (`std::any::type_name`), checked on restore. `serializer_version` is 1: postcard.
//! - Every key group of the range has a section, in order, even an empty one (10 bytes), so the
//!   offsets are uniform. A section has one block per state with at least one entry in that key
//!   group, in ascending state id. Blocks carry their byte length, so a restore can keep a
//!   state's bytes without knowing its value type until the state is registered.
//! - **Compressed sections** (version 2): bit 15 of the block count marks one; the low 15 bits
//!   are the block count (at most `i16::MAX` states, so a count never needs bit 15). `codec`
//!   repeats the header's codec, so a section is self-describing; `blocks_len` is the length of
//!   the blocks before compression, at most [`MAX_COMPRESSED_BLOCKS_LEN`]. The CRC covers the
//!   bytes as stored (compressed). A version 2 writer stores a section uncompressed, in the
//!   version 1 form, when compressing would not make it smaller (an empty section, a tiny one,
//!   incompressible values) or its blocks exceed [`MAX_COMPRESSED_BLOCKS_LEN`]; a reader tells
//!   the two forms apart by bit 15.
//! - A reader refuses a `blocks_len` larger than [`MAX_COMPRESSED_BLOCKS_LEN`] or than the codec
//!   can expand the stored bytes to, or (zstd) other than the content size the frame records,
//!   before allocating anything, and any failure of the codec or
//!   mismatch of the decompressed length is a [`CoreError::Corrupt`] naming the key group.
//! - Entries are sorted by their encoded key, so equal state gives byte-identical snapshots
//!   (with the same codec: LZ4 and zstd are deterministic for one build of the codec).
//! - The writer returns a [`KeyedSnapshotLayout`](crate::KeyedSnapshotLayout): the header's byte
//!   range, each section's start offset and the end. A restore slices one key group's section
//!   out of a [`RestorePart`] with those offsets ([`part_sections`]), and checks its key group
//!   and checksum, and decompresses it ([`parse_section`]): only the key groups it owns.
//!
//! The same description, with the version history and version 3 (overlay blocks: tombstones
//! and several blocks of one state per section, written by incremental checkpoints), is in
//! `docs/keyed-snapshot-format.md`. This build writes versions 1 to 3 and reads all of them
//! ([`READABLE_VERSIONS`]).

use crate::StateError;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use std::collections::HashSet;
use std::fmt;
use std::str::FromStr;
use weir_core::CoreError;
use weir_core::codec;
use weir_core::handle::KeyedStateHandle;
use weir_core::keygroup::{KeyGroup, KeyGroupRange, UPPER_BOUND_MAX_PARALLELISM};

/// The header's magic bytes.
pub const MAGIC: [u8; 4] = *b"WKSH";
/// The format version of uncompressed snapshots ([`Compression::None`]).
pub const FORMAT_VERSION_V1: u16 = 1;
/// The format version of snapshots whose key-group sections are compressed.
pub const FORMAT_VERSION_V2: u16 = 2;
/// The newest format version this build writes. Uncompressed snapshots are still written as
/// [`FORMAT_VERSION_V1`], byte for byte as before; see [`SnapshotHeader::version`].
pub const FORMAT_VERSION: u16 = FORMAT_VERSION_V3;
/// The format version of snapshots with overlay blocks: tombstones, and several blocks of one
/// state in a section, applied in order. Incremental snapshots (deltas) are written in it, and so
/// is a full snapshot that carries a restored delta chain of a state not registered yet.
pub const FORMAT_VERSION_V3: u16 = 3;
/// The format versions this build reads.
pub const READABLE_VERSIONS: &[u16] = &[FORMAT_VERSION_V1, FORMAT_VERSION_V2, FORMAT_VERSION_V3];
/// Header flag bit 0: key-group sections may be compressed, with the codec the header names.
/// Never set in version 1, always set in version 2.
pub const FLAG_KEY_GROUP_COMPRESSION: u16 = 1;
/// Header flag bit 1 (version 3): the snapshot is a delta. It holds only what changed since an
/// earlier snapshot of the same key groups, and a restore applies it on top of that snapshot
/// (and the deltas between), in order.
pub const FLAG_DELTA: u16 = 2;
/// Bit 15 of a section's block count: the section's blocks are compressed.
pub const SECTION_COMPRESSED: u16 = 0x8000;
/// The most a compressed section's blocks may hold uncompressed (1 GiB). The writer stores larger
/// sections uncompressed; a reader refuses a compressed section claiming more, before allocating.
pub const MAX_COMPRESSED_BLOCKS_LEN: usize = 1 << 30;
pub use crate::zstd_codec::ZSTD_LEVEL;
/// The serializer version recorded for postcard-encoded keys and values.
pub const SERIALIZER_VERSION: u32 = 1;
/// The most states a snapshot can number (state ids are `i16`).
pub const MAX_STATES: usize = i16::MAX as usize;
/// Bytes of a section without blocks: key group, block count and checksum.
pub const EMPTY_SECTION_LEN: usize = 4 + 2 + 4;
/// Bytes of a block before its entries: state id, entry count and entries length.
const BLOCK_HEADER_LEN: usize = 2 + 4 + 8;
/// Bytes of a compressed section before its payload: key group, block count, codec and the
/// blocks' uncompressed length.
const COMPRESSED_SECTION_HEADER_LEN: usize = 4 + 2 + 1 + 4;

/// How a keyed snapshot's key-group sections are compressed (Flink's
/// `execution.checkpointing.snapshot-compression`). Off by default.
///
/// Parses from and displays as `none`, `lz4` or `zstd` (parsing ignores ASCII case), and
/// serializes (serde) as the same lowercase names.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Compression {
    /// Sections are stored as they are; the snapshot is written in format version 1.
    #[default]
    None,
    /// LZ4, block format (`lz4_flex`): fast, a moderate ratio.
    Lz4,
    /// zstd at level [`ZSTD_LEVEL`]: a better ratio, somewhat slower.
    Zstd,
}

impl Compression {
    /// Every codec, `None` first.
    pub const ALL: [Compression; 3] = [Compression::None, Compression::Lz4, Compression::Zstd];

    /// The codec's name: `none`, `lz4` or `zstd`.
    pub fn as_str(self) -> &'static str {
        match self {
            Compression::None => "none",
            Compression::Lz4 => "lz4",
            Compression::Zstd => "zstd",
        }
    }

    /// The codec's id in a version 2 header and in a compressed section: 0 none (never written),
    /// 1 LZ4, 2 zstd.
    pub fn id(self) -> u8 {
        match self {
            Compression::None => 0,
            Compression::Lz4 => 1,
            Compression::Zstd => 2,
        }
    }

    /// The codec an id stands for, if any.
    pub fn from_id(id: u8) -> Option<Compression> {
        Some(match id {
            0 => Compression::None,
            1 => Compression::Lz4,
            2 => Compression::Zstd,
            _ => return None,
        })
    }

    /// Whether this codec compresses at all.
    pub fn is_enabled(self) -> bool {
        self != Compression::None
    }

    /// The format version a snapshot written with this codec has.
    pub fn format_version(self) -> u16 {
        if self.is_enabled() {
            FORMAT_VERSION_V2
        } else {
            FORMAT_VERSION_V1
        }
    }

    /// The header flags a snapshot written with this codec has.
    pub fn header_flags(self) -> u16 {
        if self.is_enabled() {
            FLAG_KEY_GROUP_COMPRESSION
        } else {
            0
        }
    }

    /// The most bytes `stored` compressed bytes can decompress to with this codec: LZ4 expands
    /// a byte to at most 255 (a match-length byte), zstd to at most 32 KiB (a 4-byte RLE block
    /// of 128 KiB).
    fn max_expansion(self, stored: usize) -> usize {
        let ratio = match self {
            Compression::None => 1,
            Compression::Lz4 => 255,
            Compression::Zstd => 32 * 1024,
        };
        stored.saturating_mul(ratio)
    }
}

impl fmt::Display for Compression {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A string that names no [`Compression`] this build has.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ParseCompressionError {
    /// No codec has the name.
    #[error("unknown snapshot compression '{0}': expected none, lz4 or zstd")]
    Unknown(String),
    /// `zstd`, in a build without weir-state's `zstd` feature.
    #[error("snapshot compression 'zstd': {}", crate::zstd_codec::MISSING)]
    NotBuilt,
}

impl FromStr for Compression {
    type Err = ParseCompressionError;

    fn from_str(s: &str) -> Result<Compression, ParseCompressionError> {
        match Compression::ALL
            .into_iter()
            .find(|c| c.as_str().eq_ignore_ascii_case(s.trim()))
        {
            Some(Compression::Zstd) if !crate::zstd_codec::AVAILABLE => {
                Err(ParseCompressionError::NotBuilt)
            }
            Some(c) => Ok(c),
            None => Err(ParseCompressionError::Unknown(s.to_string())),
        }
    }
}

/// What a state holds; recorded in the header so that a restore registers it as the same kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum StateKind {
    /// One value per key.
    Value,
    /// A list per key (`Vec<V>`, or `Vec<TtlValue<V>>` with TTL).
    List,
    /// A map per key (`BTreeMap<UK, UV>`, entries wrapped in `TtlValue` with TTL).
    Map,
    /// A reduced value per key.
    Reducing,
    /// An accumulator per key.
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
    /// The envelope flags: [`Compression::header_flags`] of `compression` (0 in version 1,
    /// [`FLAG_KEY_GROUP_COMPRESSION`] in version 2).
    pub flags: u16,
    /// The codec the sections were compressed with; [`Compression::None`] in version 1.
    pub compression: Compression,
    /// Whether sections may hold overlay blocks (tombstones, several blocks of one state),
    /// which makes the snapshot format version 3.
    pub overlays: bool,
    /// Whether the snapshot is a delta on top of earlier ones ([`FLAG_DELTA`]); implies
    /// `overlays`.
    pub delta: bool,
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

/// Version 2's payload: version 1's, then the codec. (Postcard writes a nested struct as its
/// fields, so this is the concatenation.)
#[derive(Serialize)]
struct HeaderV2WireRef<'a> {
    v1: HeaderWireRef<'a>,
    codec: u8,
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
struct HeaderV2Wire {
    v1: HeaderWire,
    codec: u8,
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

/// [`codec::seal`] with `flags` in the envelope's flags field (which `seal` leaves 0).
fn seal_with_flags(version: u16, flags: u16, payload: &[u8]) -> Vec<u8> {
    let mut out = codec::seal(MAGIC, version, payload);
    if flags != 0 {
        let body_end = out.len() - codec::ENVELOPE_TRAILER_LEN;
        out[6..8].copy_from_slice(&flags.to_le_bytes());
        let crc = crc32fast::hash(&out[..body_end]);
        out[body_end..].copy_from_slice(&crc.to_le_bytes());
    }
    out
}

impl SnapshotHeader {
    /// The format version [`encode`](Self::encode) writes: 3 with overlays (or as a delta),
    /// else 1 without compression and 2 with.
    pub fn version(&self) -> u16 {
        if self.overlays || self.delta {
            FORMAT_VERSION_V3
        } else {
            self.compression.format_version()
        }
    }

    /// The envelope flags this header is written with.
    pub fn expected_flags(&self) -> u16 {
        let delta = if self.delta { FLAG_DELTA } else { 0 };
        self.compression.header_flags() | delta
    }

    /// Checks and parses the section of `key_group` by this header's version: overlay blocks
    /// are allowed in version 3 only. See [`parse_section`].
    pub fn parse_section<'a>(
        &self,
        key_group: KeyGroup,
        bytes: &'a [u8],
    ) -> Result<Section<'a>, StateError> {
        parse_section_with(key_group, bytes, self.version() == FORMAT_VERSION_V3)
    }

    /// Encodes the header in its envelope.
    pub fn encode(&self) -> Result<Vec<u8>, StateError> {
        let flags = self.expected_flags();
        if self.flags != flags {
            return Err(StateError::Core(CoreError::Encode {
                what: HEADER_WHAT.to_string(),
                reason: format!(
                    "flags {:#06x} do not fit compression {} (delta: {}), which is written as \
                     format version {} with flags {flags:#06x}",
                    self.flags,
                    self.compression,
                    self.delta,
                    self.version()
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
        let payload = if self.version() == FORMAT_VERSION_V3 || self.compression.is_enabled() {
            codec::encode(
                HEADER_WHAT,
                &HeaderV2WireRef {
                    v1: wire,
                    codec: self.compression.id(),
                },
            )?
        } else {
            codec::encode(HEADER_WHAT, &wire)?
        };
        Ok(seal_with_flags(self.version(), flags, &payload))
    }

    /// Opens and checks a header of any readable version: envelope, flags, codec, and the
    /// consistency of its fields.
    pub fn decode(bytes: &[u8]) -> Result<SnapshotHeader, StateError> {
        let (version, payload) = codec::open(HEADER_WHAT, MAGIC, READABLE_VERSIONS, bytes)?;
        // `open` checked that the envelope is complete, so the flags field is there.
        let flags = match bytes.get(6..8) {
            Some(&[a, b]) => u16::from_le_bytes([a, b]),
            _ => return Err(header_corrupt("truncated before the flags".to_string())),
        };
        let (wire, compression) = match version {
            FORMAT_VERSION_V1 => {
                if flags != 0 {
                    return Err(header_corrupt(format!(
                        "flags {flags:#06x} are not supported by format version 1 (bit 0, \
                         key-group compression, comes with format version 2)"
                    )));
                }
                let wire: HeaderWire = codec::decode(HEADER_WHAT, payload)?;
                (wire, Compression::None)
            }
            FORMAT_VERSION_V3 => {
                if flags & !(FLAG_KEY_GROUP_COMPRESSION | FLAG_DELTA) != 0 {
                    return Err(header_corrupt(format!(
                        "flags {flags:#06x} are not supported by format version 3, which knows \
                         bit 0 (key-group compression) and bit 1 (delta)"
                    )));
                }
                let wire: HeaderV2Wire = codec::decode(HEADER_WHAT, payload)?;
                let compression = Compression::from_id(wire.codec).ok_or_else(|| {
                    header_corrupt(format!(
                        "unknown compression codec id {} (0 is none, 1 is lz4, 2 is zstd)",
                        wire.codec
                    ))
                })?;
                if (flags & FLAG_KEY_GROUP_COMPRESSION != 0) != compression.is_enabled() {
                    return Err(header_corrupt(format!(
                        "flags {flags:#06x} disagree with the codec {compression}: bit 0 is set \
                         exactly when sections may be compressed"
                    )));
                }
                (wire.v1, compression)
            }
            _ => {
                if flags != FLAG_KEY_GROUP_COMPRESSION {
                    return Err(header_corrupt(format!(
                        "flags {flags:#06x} are not supported by format version {version}, which \
                         has exactly bit 0 (key-group compression) set"
                    )));
                }
                let wire: HeaderV2Wire = codec::decode(HEADER_WHAT, payload)?;
                let compression = Compression::from_id(wire.codec)
                    .filter(|c| c.is_enabled())
                    .ok_or_else(|| {
                        header_corrupt(format!(
                            "unknown compression codec id {} (1 is lz4, 2 is zstd)",
                            wire.codec
                        ))
                    })?;
                (wire.v1, compression)
            }
        };
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
            compression,
            overlays: version == FORMAT_VERSION_V3,
            delta: flags & FLAG_DELTA != 0,
            key_group_range: range,
            max_parallelism: wire.max_parallelism,
            states,
        })
    }
}

/// Builds one key group's section, compressed or not. Reuse one writer for all sections of a
/// snapshot: it keeps its buffers (and its zstd context).
#[derive(Default)]
pub struct SectionWriter {
    /// The section in its uncompressed form, without its checksum until `finish`.
    buf: Vec<u8>,
    blocks: u16,
    last_id: Option<i16>,
    compression: Compression,
    /// Whether overlay blocks may be written (format version 3).
    overlays: bool,
    /// The compressed form of the section, when `finish` stores it so.
    packed: Vec<u8>,
    zstd: Option<crate::zstd_codec::Compressor>,
}

impl fmt::Debug for SectionWriter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SectionWriter")
            .field("len", &self.buf.len())
            .field("blocks", &self.blocks)
            .field("last_id", &self.last_id)
            .field("compression", &self.compression)
            .finish_non_exhaustive()
    }
}

impl SectionWriter {
    /// A writer of uncompressed sections, with no section begun.
    pub fn new() -> SectionWriter {
        SectionWriter::default()
    }

    /// A writer that compresses each section with `compression` when that makes it smaller.
    pub fn with_compression(compression: Compression) -> SectionWriter {
        SectionWriter {
            compression,
            ..SectionWriter::default()
        }
    }

    /// A writer for the sections `header` describes: its codec, and overlay blocks when it is
    /// format version 3.
    pub fn for_header(header: &SnapshotHeader) -> SectionWriter {
        SectionWriter {
            compression: header.compression,
            overlays: header.version() == FORMAT_VERSION_V3,
            ..SectionWriter::default()
        }
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
    /// in ascending state id, at most [`MAX_STATES`] of them; with overlays (format version 3),
    /// in non-decreasing state id, several blocks of one state applied in order.
    pub fn block(
        &mut self,
        state_id: i16,
        entry_count: u32,
        entries: &[u8],
    ) -> Result<(), StateError> {
        self.any_block(BlockKind::Entries, state_id, entry_count, entries)
    }

    /// Appends a tombstone block (format version 3 only): `keys` holds `key_count` encoded keys
    /// whose entries of state `state_id` are removed.
    pub fn tombstones(
        &mut self,
        state_id: i16,
        key_count: u32,
        keys: &[u8],
    ) -> Result<(), StateError> {
        self.any_block(BlockKind::Tombstones, state_id, key_count, keys)
    }

    /// Appends a block of `kind`.
    pub fn any_block(
        &mut self,
        kind: BlockKind,
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
        let out_of_order = match self.last_id {
            Some(last) if self.overlays => last > state_id,
            Some(last) => last >= state_id,
            None => false,
        };
        if state_id < 0 || out_of_order {
            return Err(encode_err(format!(
                "state id {state_id} is negative or not above the previous block's {:?}",
                self.last_id
            )));
        }
        if kind == BlockKind::Tombstones && !self.overlays {
            return Err(encode_err(
                "tombstone blocks need format version 3 (a header with overlays)".to_string(),
            ));
        }
        if self.buf.len() < EMPTY_SECTION_LEN - 4 {
            return Err(encode_err("no section begun".to_string()));
        }
        // Bit 15 of the count marks a compressed section, so a count must stay below it.
        self.blocks = self
            .blocks
            .checked_add(1)
            .filter(|&n| n & SECTION_COMPRESSED == 0)
            .ok_or_else(|| encode_err("too many blocks in one section".to_string()))?;
        self.last_id = Some(state_id);
        self.buf.reserve(BLOCK_HEADER_LEN + entries.len());
        let wire_id = match kind {
            BlockKind::Entries => state_id,
            BlockKind::Tombstones => !state_id,
        };
        self.buf.extend_from_slice(&wire_id.to_le_bytes());
        self.buf.extend_from_slice(&entry_count.to_le_bytes());
        self.buf
            .extend_from_slice(&(entries.len() as u64).to_le_bytes());
        self.buf.extend_from_slice(entries);
        Ok(())
    }

    /// Ends the section: sets the block count, compresses the blocks if the writer has a codec
    /// and that makes the section smaller, appends the checksum and returns the bytes.
    pub fn finish(&mut self) -> Result<&[u8], StateError> {
        if let Some(count) = self.buf.get_mut(4..6) {
            count.copy_from_slice(&self.blocks.to_le_bytes());
        }
        if self.compress()? {
            let crc = crc32fast::hash(&self.packed);
            self.packed.extend_from_slice(&crc.to_le_bytes());
            return Ok(&self.packed);
        }
        let crc = crc32fast::hash(&self.buf);
        self.buf.extend_from_slice(&crc.to_le_bytes());
        Ok(&self.buf)
    }

    /// Builds the compressed form of the section in `packed` (without its checksum); false when
    /// the section is to be stored uncompressed.
    fn compress(&mut self) -> Result<bool, StateError> {
        let Some(blocks) = self.buf.get(EMPTY_SECTION_LEN - 4..) else {
            return Ok(false);
        };
        if !self.compression.is_enabled() || self.blocks == 0 {
            return Ok(false);
        }
        let Ok(blocks_len) = u32::try_from(blocks.len()) else {
            return Ok(false);
        };
        if blocks.len() > MAX_COMPRESSED_BLOCKS_LEN {
            return Ok(false);
        }
        let encode_err = |reason: String| {
            let key_group = self
                .buf
                .first_chunk::<4>()
                .map_or(0, |kg| u32::from_le_bytes(*kg));
            StateError::Core(CoreError::Encode {
                what: format!("keyed snapshot section of key group {key_group}"),
                reason,
            })
        };
        self.packed.clear();
        self.packed.extend_from_slice(&self.buf[..4]);
        self.packed
            .extend_from_slice(&(self.blocks | SECTION_COMPRESSED).to_le_bytes());
        self.packed.push(self.compression.id());
        self.packed.extend_from_slice(&blocks_len.to_le_bytes());
        let start = self.packed.len();
        let written = match self.compression {
            Compression::None => return Ok(false),
            Compression::Lz4 => {
                self.packed.resize(
                    start + lz4_flex::block::get_maximum_output_size(blocks.len()),
                    0,
                );
                lz4_flex::block::compress_into(blocks, &mut self.packed[start..])
                    .map_err(|e| encode_err(format!("lz4: {e}")))?
            }
            Compression::Zstd => {
                let compressor = match &mut self.zstd {
                    Some(c) => c,
                    None => self
                        .zstd
                        .insert(crate::zstd_codec::Compressor::new().map_err(encode_err)?),
                };
                compressor
                    .compress(blocks, &mut self.packed, start)
                    .map_err(encode_err)?
            }
        };
        self.packed.truncate(start + written);
        Ok(self.packed.len() < self.buf.len())
    }
}

/// What a block holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BlockKind {
    /// Entries: `(postcard(key) postcard(value))*`. In a delta, or after earlier blocks of the
    /// same state, each replaces the key's entry.
    Entries,
    /// Keys whose entries are removed: `postcard(key)*` (format version 3; written with the
    /// state id bitwise negated, `!id`, so a negative id on the wire).
    Tombstones,
}

/// One state's entries in one key group, as read from a section.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StateBlock<'a> {
    /// The state's id in the snapshot's header.
    pub state_id: i16,
    /// Entries or tombstones.
    pub kind: BlockKind,
    /// How many entries `entries` holds.
    pub entry_count: u32,
    /// The encoded entries (see [`decode_entries`]).
    pub entries: &'a [u8],
}

/// Where a section's blocks are: in the stored bytes (an uncompressed section), or in the buffer
/// a compressed one was decompressed into.
#[derive(Clone, Debug)]
enum Body<'a> {
    Stored(&'a [u8]),
    Decompressed(bytes::Bytes),
}

impl Body<'_> {
    fn bytes(&self) -> &[u8] {
        match self {
            Body::Stored(b) => b,
            Body::Decompressed(b) => b,
        }
    }
}

/// A block's place in its section's body.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Span {
    state_id: i16,
    kind: BlockKind,
    entry_count: u32,
    start: usize,
    end: usize,
}

impl Span {
    fn block<'s>(&self, body: &'s [u8]) -> StateBlock<'s> {
        StateBlock {
            state_id: self.state_id,
            kind: self.kind,
            entry_count: self.entry_count,
            entries: body.get(self.start..self.end).unwrap_or_default(),
        }
    }
}

/// A checked key-group section ([`parse_section`]): its blocks, borrowed from the stored bytes,
/// or held decompressed. Iterate a reference ([`iter`](Self::iter)) for [`StateBlock`]s.
#[derive(Clone, Debug)]
pub struct Section<'a> {
    key_group: KeyGroup,
    compression: Compression,
    body: Body<'a>,
    blocks: Vec<Span>,
}

impl<'a> Section<'a> {
    /// The section's key group.
    pub fn key_group(&self) -> KeyGroup {
        self.key_group
    }

    /// How the section was stored: [`Compression::None`] for an uncompressed section (every
    /// section of a version 1 snapshot, and the small ones of a version 2 snapshot).
    pub fn compression(&self) -> Compression {
        self.compression
    }

    /// The number of blocks.
    pub fn len(&self) -> usize {
        self.blocks.len()
    }

    /// Whether the key group holds no entry of any state.
    pub fn is_empty(&self) -> bool {
        self.blocks.is_empty()
    }

    /// The length of the blocks, uncompressed.
    pub fn blocks_len(&self) -> usize {
        self.body.bytes().len()
    }

    /// The block at `index`, in ascending state id.
    pub fn get(&self, index: usize) -> Option<StateBlock<'_>> {
        self.blocks
            .get(index)
            .map(|span| span.block(self.body.bytes()))
    }

    /// A block's entries as shared bytes, without copying: a slice of `stored` (the bytes the
    /// section was parsed from) for an uncompressed section, of the decompressed buffer for a
    /// compressed one. A copy only if `stored` does not hold them.
    pub fn shared_entries(&self, block: &StateBlock<'_>, stored: &bytes::Bytes) -> bytes::Bytes {
        let within = |outer: &[u8], inner: &[u8]| {
            let (o, i) = (outer.as_ptr() as usize, inner.as_ptr() as usize);
            i >= o && i + inner.len() <= o + outer.len()
        };
        match &self.body {
            Body::Stored(_) if within(stored, block.entries) => stored.slice_ref(block.entries),
            Body::Decompressed(b) if within(b, block.entries) => b.slice_ref(block.entries),
            _ => bytes::Bytes::copy_from_slice(block.entries),
        }
    }

    /// The blocks, in ascending state id.
    pub fn iter(&self) -> SectionIter<'_> {
        SectionIter {
            body: self.body.bytes(),
            spans: self.blocks.iter(),
        }
    }
}

/// The blocks of a [`Section`], borrowed from it.
#[derive(Clone, Debug)]
pub struct SectionIter<'s> {
    body: &'s [u8],
    spans: std::slice::Iter<'s, Span>,
}

impl<'s> Iterator for SectionIter<'s> {
    type Item = StateBlock<'s>;

    fn next(&mut self) -> Option<StateBlock<'s>> {
        self.spans.next().map(|span| span.block(self.body))
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        self.spans.size_hint()
    }
}

impl ExactSizeIterator for SectionIter<'_> {}

impl<'s> IntoIterator for &'s Section<'_> {
    type Item = StateBlock<'s>;
    type IntoIter = SectionIter<'s>;

    fn into_iter(self) -> SectionIter<'s> {
        self.iter()
    }
}

/// One block of a section consumed by value: it shares the section's (decompressed) bytes.
#[derive(Clone, Debug)]
pub struct SectionBlock<'a> {
    /// The state's id in the snapshot's header.
    pub state_id: i16,
    /// Entries or tombstones.
    pub kind: BlockKind,
    /// How many entries [`entries`](Self::entries) holds.
    pub entry_count: u32,
    body: Body<'a>,
    start: usize,
    end: usize,
}

impl SectionBlock<'_> {
    /// The encoded entries (see [`decode_entries`]).
    pub fn entries(&self) -> &[u8] {
        self.body
            .bytes()
            .get(self.start..self.end)
            .unwrap_or_default()
    }

    /// The block as a borrowed [`StateBlock`].
    pub fn as_block(&self) -> StateBlock<'_> {
        StateBlock {
            state_id: self.state_id,
            kind: self.kind,
            entry_count: self.entry_count,
            entries: self.entries(),
        }
    }
}

/// The blocks of a [`Section`] consumed by value.
#[derive(Debug)]
pub struct SectionBlocks<'a> {
    body: Body<'a>,
    spans: std::vec::IntoIter<Span>,
}

impl<'a> Iterator for SectionBlocks<'a> {
    type Item = SectionBlock<'a>;

    fn next(&mut self) -> Option<SectionBlock<'a>> {
        self.spans.next().map(|span| SectionBlock {
            state_id: span.state_id,
            kind: span.kind,
            entry_count: span.entry_count,
            body: self.body.clone(),
            start: span.start,
            end: span.end,
        })
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        self.spans.size_hint()
    }
}

impl ExactSizeIterator for SectionBlocks<'_> {}

impl<'a> IntoIterator for Section<'a> {
    type Item = SectionBlock<'a>;
    type IntoIter = SectionBlocks<'a>;

    fn into_iter(self) -> SectionBlocks<'a> {
        SectionBlocks {
            body: self.body,
            spans: self.blocks.into_iter(),
        }
    }
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

/// Checks the section of `key_group` (its checksum, its key group, its framing), decompresses it
/// if it is stored compressed, whatever the codec, and returns its blocks. Every failure,
/// including a codec's on damaged or forged input, is a [`CoreError::Corrupt`] naming the key
/// group; none panics, and none allocates more than [`MAX_COMPRESSED_BLOCKS_LEN`] or than the
/// codec could expand the stored bytes to.
///
/// This reads sections of format versions 1 and 2; [`SnapshotHeader::parse_section`] reads
/// those of any version by the header's.
pub fn parse_section(key_group: KeyGroup, bytes: &[u8]) -> Result<Section<'_>, StateError> {
    parse_section_with(key_group, bytes, false)
}

/// [`parse_section`], allowing overlay blocks when `overlays` (format version 3).
fn parse_section_with(
    key_group: KeyGroup,
    bytes: &[u8],
    overlays: bool,
) -> Result<Section<'_>, StateError> {
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
    if count & SECTION_COMPRESSED == 0 {
        let blocks = parse_blocks(key_group, count, rest, overlays)?;
        return Ok(Section {
            key_group,
            compression: Compression::None,
            body: Body::Stored(rest),
            blocks,
        });
    }
    let count = count & !SECTION_COMPRESSED;
    let truncated = || {
        corrupt(format!(
            "truncated: {} bytes is shorter than a compressed section's header \
             ({COMPRESSED_SECTION_HEADER_LEN}) and checksum",
            bytes.len()
        ))
    };
    let [id] = take::<1>(&mut rest).ok_or_else(truncated)?;
    let blocks_len = u32::from_le_bytes(take::<4>(&mut rest).ok_or_else(truncated)?);
    let compression = Compression::from_id(id)
        .filter(|c| c.is_enabled())
        .ok_or_else(|| {
            corrupt(format!(
                "marked compressed with unknown codec id {id} (1 is lz4, 2 is zstd)"
            ))
        })?;
    let decompressed = decompress(key_group, compression, rest, blocks_len)?;
    let blocks = parse_blocks(key_group, count, &decompressed, overlays)?;
    Ok(Section {
        key_group,
        compression,
        body: Body::Decompressed(bytes::Bytes::from(decompressed)),
        blocks,
    })
}

/// Decompresses a section's payload into exactly `blocks_len` bytes, refusing a length that the
/// limit or the codec rules out before allocating.
fn decompress(
    key_group: KeyGroup,
    compression: Compression,
    payload: &[u8],
    blocks_len: u32,
) -> Result<Vec<u8>, StateError> {
    let corrupt = |reason: String| section_corrupt(key_group, reason);
    let len = usize::try_from(blocks_len)
        .ok()
        .filter(|&l| l <= MAX_COMPRESSED_BLOCKS_LEN)
        .ok_or_else(|| {
            corrupt(format!(
                "claims {blocks_len} bytes of blocks uncompressed, more than the \
                 {MAX_COMPRESSED_BLOCKS_LEN} a compressed section may hold; refusing to allocate"
            ))
        })?;
    if len > compression.max_expansion(payload.len()) {
        return Err(corrupt(format!(
            "claims {len} bytes of blocks uncompressed from {} bytes of {compression}, more than \
             {compression} can expand them to; refusing to allocate",
            payload.len()
        )));
    }
    let out = match compression {
        Compression::None => payload.to_vec(),
        Compression::Lz4 => {
            let mut out = vec![0u8; len];
            let n = lz4_flex::block::decompress_into(payload, &mut out)
                .map_err(|e| corrupt(format!("lz4 cannot decompress the blocks: {e}")))?;
            out.truncate(n);
            out
        }
        Compression::Zstd => crate::zstd_codec::decompress(payload, len).map_err(corrupt)?,
    };
    if out.len() != len {
        return Err(corrupt(format!(
            "the blocks decompress to {} bytes, the section claims {len}",
            out.len()
        )));
    }
    Ok(out)
}

/// Reads `count` blocks that must fill `body` exactly.
fn parse_blocks(
    key_group: KeyGroup,
    count: u16,
    body: &[u8],
    overlays: bool,
) -> Result<Vec<Span>, StateError> {
    let corrupt = |reason: String| section_corrupt(key_group, reason);
    let truncated = || corrupt("truncated block".to_string());
    let mut rest = body;
    let mut blocks = Vec::with_capacity(usize::from(count).min(rest.len() / BLOCK_HEADER_LEN));
    let mut last: Option<i16> = None;
    for _ in 0..count {
        let wire_id = i16::from_le_bytes(take::<2>(&mut rest).ok_or_else(truncated)?);
        let entry_count = u32::from_le_bytes(take::<4>(&mut rest).ok_or_else(truncated)?);
        let len = u64::from_le_bytes(take::<8>(&mut rest).ok_or_else(truncated)?);
        let (state_id, kind) = if wire_id < 0 && overlays {
            (!wire_id, BlockKind::Tombstones)
        } else {
            (wire_id, BlockKind::Entries)
        };
        let out_of_order = match last {
            Some(l) if overlays => l > state_id,
            Some(l) => l >= state_id,
            None => false,
        };
        if state_id < 0 || out_of_order {
            return Err(corrupt(format!(
                "state id {wire_id} is negative or out of order"
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
        let start = body.len() - rest.len();
        rest = &rest[len..];
        blocks.push(Span {
            state_id,
            kind,
            entry_count,
            start,
            end: start + len,
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
        self.sort_into_sorted()
    }

    /// Encodes `keys` (a tombstone block's) and returns their number and bytes, sorted.
    pub fn encode_keys<'a, K>(
        &mut self,
        keys: impl IntoIterator<Item = &'a K>,
    ) -> Result<(u32, &[u8]), StateError>
    where
        K: Serialize + 'a,
    {
        self.buf.clear();
        self.index.clear();
        self.sorted.clear();
        for key in keys {
            let key_start = self.buf.len();
            codec::encode_into("state key", key, &mut self.buf)?;
            self.index.push((key_start, self.buf.len(), self.buf.len()));
        }
        self.sort_into_sorted()
    }

    fn sort_into_sorted(&mut self) -> Result<(u32, &[u8]), StateError> {
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
    f: impl FnMut(K, V) -> Result<(), StateError>,
) -> Result<(), StateError>
where
    K: DeserializeOwned,
    V: DeserializeOwned,
{
    decode_entries_with(|| what.to_string(), entry_count, bytes, f)
}

/// [`decode_entries`], with the name of the state and key group for errors built by `what` only
/// when one occurs. The loop reads the entries with one deserializer and keeps no per-entry
/// state but the position.
#[inline]
pub(crate) fn decode_entries_with<K, V>(
    what: impl Fn() -> String,
    entry_count: u32,
    bytes: &[u8],
    mut f: impl FnMut(K, V) -> Result<(), StateError>,
) -> Result<(), StateError>
where
    K: DeserializeOwned,
    V: DeserializeOwned,
{
    let mut de = postcard::Deserializer::from_bytes(bytes);
    for i in 0..entry_count {
        let key = match K::deserialize(&mut de) {
            Ok(key) => key,
            Err(e) => return Err(entry_error(what(), i, e)),
        };
        let value = match V::deserialize(&mut de) {
            Ok(value) => value,
            Err(e) => return Err(entry_error(what(), i, e)),
        };
        f(key, value)?;
    }
    match de.finalize() {
        Ok([]) => Ok(()),
        Ok(rest) => Err(StateError::Core(CoreError::Decode {
            what: what(),
            reason: format!(
                "{} bytes left after the {entry_count} entries the block declares",
                rest.len()
            ),
        })),
        Err(e) => Err(StateError::Core(CoreError::Decode {
            what: what(),
            reason: e.to_string(),
        })),
    }
}

/// Decodes the `key_count` keys of a tombstone block, handing each to `f`, as
/// [`decode_entries_with`] does entries.
pub(crate) fn decode_keys_with<K>(
    what: impl Fn() -> String,
    key_count: u32,
    bytes: &[u8],
    mut f: impl FnMut(K) -> Result<(), StateError>,
) -> Result<(), StateError>
where
    K: DeserializeOwned,
{
    let mut de = postcard::Deserializer::from_bytes(bytes);
    for i in 0..key_count {
        match K::deserialize(&mut de) {
            Ok(key) => f(key)?,
            Err(e) => return Err(entry_error(what(), i, e)),
        }
    }
    match de.finalize() {
        Ok([]) => Ok(()),
        Ok(rest) => Err(StateError::Core(CoreError::Decode {
            what: what(),
            reason: format!(
                "{} bytes left after the {key_count} tombstones the block declares",
                rest.len()
            ),
        })),
        Err(e) => Err(StateError::Core(CoreError::Decode {
            what: what(),
            reason: e.to_string(),
        })),
    }
}

#[cold]
#[inline(never)]
fn entry_error(what: String, i: u32, e: postcard::Error) -> StateError {
    StateError::Core(CoreError::Decode {
        what,
        reason: format!("entry {i}: {e}"),
    })
}

/// The sections of the key groups in `range` (intersected with the part's own range), sliced out
/// of a restore part with its handle's offsets, in key-group order. The sections are not checked
/// yet; see [`parse_section`].
pub fn part_sections<'p>(
    part: &'p RestorePart<'_>,
    range: &KeyGroupRange,
) -> Result<Vec<(KeyGroup, &'p [u8])>, StateError> {
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
/// whole): slices the header and the sections out of `stream` with the handle's offsets. The
/// sections are copied; [`whole_shared_stream_part`] shares them.
pub fn whole_stream_part<'a>(
    handle: &'a KeyedStateHandle,
    stream: &'a [u8],
) -> Result<RestorePart<'a>, StateError> {
    let (header, sections) = split_stream(handle, stream)?;
    Ok(RestorePart {
        handle,
        header: &stream[header],
        sections: bytes::Bytes::copy_from_slice(&stream[sections]),
        sections_offset: handle.header.1,
    })
}

/// [`whole_stream_part`] for a stream in shared bytes: the part's sections are a slice of
/// `stream`, not a copy.
pub fn whole_shared_stream_part<'a>(
    handle: &'a KeyedStateHandle,
    stream: &'a bytes::Bytes,
) -> Result<RestorePart<'a>, StateError> {
    let (header, sections) = split_stream(handle, stream)?;
    Ok(RestorePart {
        handle,
        header: &stream[header],
        sections: stream.slice(sections),
        sections_offset: handle.header.1,
    })
}

/// The byte ranges of a whole stream's header and sections, checked against its length.
fn split_stream(
    handle: &KeyedStateHandle,
    stream: &[u8],
) -> Result<(std::ops::Range<usize>, std::ops::Range<usize>), StateError> {
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
    if end > stream.len() {
        return Err(bad());
    }
    Ok((h_start..h_end, h_end..end))
}

/// Bytes of one snapshot handed to a restore: the header, and a contiguous run of key-group
/// sections that starts at `sections_offset` within the original stream.
#[derive(Debug)]
pub struct RestorePart<'a> {
    /// The handle the bytes belong to.
    pub handle: &'a KeyedStateHandle,
    /// The bytes of `handle.header`.
    pub header: &'a [u8],
    /// Bytes of the sections, starting at `sections_offset`. Shared: a backend may keep slices
    /// of them (the blocks of states not registered yet) without copying.
    pub sections: bytes::Bytes,
    /// Offset of `sections[0]` within the stream.
    pub sections_offset: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header() -> SnapshotHeader {
        SnapshotHeader {
            flags: 0,
            compression: Compression::None,
            overlays: false,
            delta: false,
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
        let section = w.finish().unwrap().to_vec();

        let parsed = parse_section(7, &section).unwrap();
        assert_eq!(parsed.compression(), Compression::None);
        let blocks: Vec<StateBlock<'_>> = parsed.iter().collect();
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
        assert_eq!(w.finish().unwrap().len(), EMPTY_SECTION_LEN);
        for c in Compression::ALL {
            let mut w = SectionWriter::with_compression(c);
            w.begin(0);
            assert_eq!(w.finish().unwrap().len(), EMPTY_SECTION_LEN, "{c}");
        }
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

    fn compressed_header(c: Compression) -> SnapshotHeader {
        SnapshotHeader {
            flags: c.header_flags(),
            compression: c,
            ..header()
        }
    }

    /// Recomputes a section's trailing checksum after a test damaged it on purpose.
    fn reseal(section: &mut [u8]) {
        let end = section.len() - 4;
        let crc = crc32fast::hash(&section[..end]);
        section[end..].copy_from_slice(&crc.to_le_bytes());
    }

    /// A section of key group 5 with one block of `n` similar entries (compressible), written by
    /// `w`, and the same section uncompressed.
    fn similar_section(w: &mut SectionWriter, n: u32) -> (Vec<u8>, Vec<u8>) {
        let keys: Vec<String> = (0..n).map(|i| format!("user-{i:06}")).collect();
        let values: Vec<String> = (0..n)
            .map(|i| format!("session of user {i}: clicked, scrolled, clicked, left"))
            .collect();
        let mut enc = EntryEncoder::new();
        let (count, entries) = enc.encode(keys.iter().zip(&values)).unwrap();
        let entries = entries.to_vec();
        w.begin(5);
        w.block(0, count, &entries).unwrap();
        w.block(2, count, &entries).unwrap();
        let stored = w.finish().unwrap().to_vec();
        let mut raw = SectionWriter::new();
        raw.begin(5);
        raw.block(0, count, &entries).unwrap();
        raw.block(2, count, &entries).unwrap();
        (stored, raw.finish().unwrap().to_vec())
    }

    fn blocks_of<'a>(section: &'a Section<'_>) -> Vec<StateBlock<'a>> {
        section.iter().collect()
    }

    #[test]
    fn compression_names_parse_and_display() {
        for c in Compression::ALL {
            assert_eq!(c.to_string().parse::<Compression>().unwrap(), c);
            assert_eq!(Compression::from_id(c.id()), Some(c));
        }
        assert_eq!(" LZ4 ".parse::<Compression>().unwrap(), Compression::Lz4);
        assert_eq!("Zstd".parse::<Compression>().unwrap(), Compression::Zstd);
        let e = "gzip".parse::<Compression>().unwrap_err().to_string();
        assert!(
            e.contains("'gzip'") && e.contains("none, lz4 or zstd"),
            "{e}"
        );
        assert_eq!(Compression::default(), Compression::None);
        assert_eq!(Compression::from_id(3), None);
    }

    #[test]
    fn uncompressed_headers_stay_version_1_and_compressed_ones_are_version_2() {
        assert_eq!(header().version(), FORMAT_VERSION_V1);
        for c in [Compression::Lz4, Compression::Zstd] {
            let h = compressed_header(c);
            let bytes = h.encode().unwrap();
            assert_eq!(u16::from_le_bytes([bytes[4], bytes[5]]), FORMAT_VERSION_V2);
            assert_eq!(
                u16::from_le_bytes([bytes[6], bytes[7]]),
                FLAG_KEY_GROUP_COMPRESSION
            );
            let decoded = SnapshotHeader::decode(&bytes).unwrap();
            assert_eq!(decoded, h);
            assert_eq!(decoded.compression, c);
            for i in 0..bytes.len() {
                let mut b = bytes.clone();
                b[i] ^= 0x10;
                assert!(
                    SnapshotHeader::decode(&b).is_err(),
                    "{c}: flip at {i} went unnoticed"
                );
            }
            // The flags must match the codec.
            let mut wrong = compressed_header(c);
            wrong.flags = 0;
            assert!(wrong.encode().is_err());
        }
        // A version 1 payload is a prefix of a version 2 payload: the codec is appended.
        let v1 = header().encode().unwrap();
        let v2 = compressed_header(Compression::Zstd).encode().unwrap();
        let (v1p, v2p) = (&v1[16..v1.len() - 4], &v2[16..v2.len() - 4]);
        assert_eq!(&v2p[..v1p.len()], v1p);
        assert_eq!(&v2p[v1p.len()..], &[Compression::Zstd.id()]);
    }

    #[test]
    fn header_flags_must_agree_with_the_version_and_the_codec_must_be_known() {
        let wire = |codec: u8| {
            let h = header();
            let states = h
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
                .collect();
            let v1 = HeaderWireRef {
                key_group_range: h.key_group_range,
                max_parallelism: h.max_parallelism,
                states,
            };
            codec::encode("t", &HeaderV2WireRef { v1, codec }).unwrap()
        };
        // Version 2 without the flag, with an unknown flag, with codec "none" or an unknown one.
        for (flags, codec, expect) in [
            (0, 1, "flags 0x0000"),
            (FLAG_KEY_GROUP_COMPRESSION | 4, 1, "flags 0x0005"),
            (FLAG_KEY_GROUP_COMPRESSION, 0, "codec id 0"),
            (FLAG_KEY_GROUP_COMPRESSION, 9, "codec id 9"),
        ] {
            let sealed = seal_with_flags(FORMAT_VERSION_V2, flags, &wire(codec));
            let e = SnapshotHeader::decode(&sealed).unwrap_err().to_string();
            assert!(e.contains(expect) && e.contains(HEADER_WHAT), "{e}");
        }
        // Version 1 with the compression flag.
        let v1 = header().encode().unwrap();
        let sealed = seal_with_flags(FORMAT_VERSION_V1, 1, &v1[16..v1.len() - 4]);
        let e = SnapshotHeader::decode(&sealed).unwrap_err().to_string();
        assert!(e.contains("format version 1"), "{e}");
        // Version 3: the compression flag must agree with the codec (0 is none), unknown flags
        // are refused.
        for (flags, codec, expect) in [
            (FLAG_KEY_GROUP_COMPRESSION, 0, "disagree"),
            (FLAG_DELTA, 1, "disagree"),
            (FLAG_DELTA | 8, 0, "flags 0x000a"),
            (FLAG_DELTA, 9, "codec id 9"),
        ] {
            let sealed = seal_with_flags(FORMAT_VERSION_V3, flags, &wire(codec));
            let e = SnapshotHeader::decode(&sealed).unwrap_err().to_string();
            assert!(e.contains(expect) && e.contains(HEADER_WHAT), "{e}");
        }
        let sealed = seal_with_flags(FORMAT_VERSION_V3, FLAG_DELTA, &wire(0));
        let h = SnapshotHeader::decode(&sealed).unwrap();
        assert!(h.delta && h.overlays && h.compression == Compression::None);
        // A version this build does not read.
        let sealed = seal_with_flags(4, 1, &wire(1));
        assert!(SnapshotHeader::decode(&sealed).is_err());
    }

    #[test]
    fn version_3_headers_round_trip_and_are_written_only_with_overlays() {
        for c in Compression::ALL {
            for delta in [false, true] {
                let h = SnapshotHeader {
                    flags: 0,
                    compression: c,
                    overlays: true,
                    delta,
                    ..header()
                };
                let h = SnapshotHeader {
                    flags: h.expected_flags(),
                    ..h
                };
                let bytes = h.encode().unwrap();
                assert_eq!(u16::from_le_bytes([bytes[4], bytes[5]]), FORMAT_VERSION_V3);
                assert_eq!(
                    SnapshotHeader::decode(&bytes).unwrap(),
                    h,
                    "{c} delta={delta}"
                );
            }
        }
        // Without overlays the versions stay 1 and 2, byte for byte.
        assert_eq!(header().version(), FORMAT_VERSION_V1);
        assert_eq!(
            compressed_header(Compression::Lz4).version(),
            FORMAT_VERSION_V2
        );
    }

    #[test]
    fn overlay_sections_carry_tombstones_and_repeated_states_only_in_version_3() {
        let mut enc = EntryEncoder::new();
        let (n, entries) = enc.encode([(&1u64, &10u64), (&2, &20)]).unwrap();
        let entries = entries.to_vec();
        let (k, keys) = enc.encode_keys([&3u64, &1]).unwrap();
        let keys = keys.to_vec();
        let v3 = SnapshotHeader {
            flags: FLAG_DELTA,
            overlays: true,
            delta: true,
            ..header()
        };
        for c in Compression::ALL {
            let mut w = SectionWriter::for_header(&SnapshotHeader {
                compression: c,
                flags: c.header_flags() | FLAG_DELTA,
                ..v3.clone()
            });
            w.begin(4);
            w.block(0, n, &entries).unwrap();
            w.tombstones(0, k, &keys).unwrap();
            w.block(0, n, &entries).unwrap();
            w.tombstones(2, k, &keys).unwrap();
            assert!(
                w.block(1, n, &entries).is_err(),
                "state ids must not go down"
            );
            let section = w.finish().unwrap().to_vec();
            let parsed = v3.parse_section(4, &section).unwrap();
            let kinds: Vec<(i16, BlockKind, u32)> = parsed
                .iter()
                .map(|b| (b.state_id, b.kind, b.entry_count))
                .collect();
            assert_eq!(
                kinds,
                [
                    (0, BlockKind::Entries, 2),
                    (0, BlockKind::Tombstones, 2),
                    (0, BlockKind::Entries, 2),
                    (2, BlockKind::Tombstones, 2),
                ]
            );
            let mut decoded = Vec::new();
            let block = parsed.get(1).unwrap();
            decode_keys_with(
                || "t".to_string(),
                block.entry_count,
                block.entries,
                |k: u64| {
                    decoded.push(k);
                    Ok(())
                },
            )
            .unwrap();
            assert_eq!(
                decoded,
                [1, 3],
                "tombstone keys are sorted by their encoding"
            );
            // A reader of versions 1 and 2 refuses the overlays.
            assert!(parse_section(4, &section).is_err(), "{c}");
        }
        // A version 1 or 2 writer refuses tombstones and repeated states.
        let mut w = SectionWriter::new();
        w.begin(4);
        assert!(w.tombstones(0, k, &keys).is_err());
        w.block(0, n, &entries).unwrap();
        assert!(w.block(0, n, &entries).is_err());
    }

    #[test]
    fn compressed_sections_round_trip_with_each_codec() {
        for c in [Compression::Lz4, Compression::Zstd] {
            let mut w = SectionWriter::with_compression(c);
            let (stored, raw) = similar_section(&mut w, 500);
            assert!(
                stored.len() * 4 < raw.len(),
                "{c}: {} bytes stored for {} raw",
                stored.len(),
                raw.len()
            );
            assert_eq!(
                u16::from_le_bytes([stored[4], stored[5]]),
                SECTION_COMPRESSED | 2
            );
            assert_eq!(stored[6], c.id());
            let parsed = parse_section(5, &stored).unwrap();
            let expected = parse_section(5, &raw).unwrap();
            assert_eq!(parsed.compression(), c);
            assert_eq!(parsed.key_group(), 5);
            assert_eq!(parsed.blocks_len(), raw.len() - EMPTY_SECTION_LEN);
            assert_eq!(blocks_of(&parsed), blocks_of(&expected));
            // Consumed by value, the blocks share the decompressed bytes.
            let owned: Vec<SectionBlock<'_>> = parsed.clone().into_iter().collect();
            assert_eq!(owned.len(), 2);
            assert_eq!(owned[1].as_block(), blocks_of(&expected)[1]);
            // Deterministic: the same blocks give the same bytes, with a reused writer too.
            let (again, _) = similar_section(&mut w, 500);
            assert_eq!(again, stored);
        }
    }

    #[test]
    fn sections_that_would_not_shrink_are_stored_uncompressed() {
        let mut enc = EntryEncoder::new();
        let (k, v) = (7u32, 1u64);
        let (count, entries) = enc.encode([(&k, &v)]).unwrap();
        let entries = entries.to_vec();
        for c in Compression::ALL {
            let mut w = SectionWriter::with_compression(c);
            w.begin(3);
            w.block(1, count, &entries).unwrap();
            let stored = w.finish().unwrap().to_vec();
            let mut raw = SectionWriter::new();
            raw.begin(3);
            raw.block(1, count, &entries).unwrap();
            assert_eq!(stored, raw.finish().unwrap(), "{c}");
            assert_eq!(
                parse_section(3, &stored).unwrap().compression(),
                Compression::None
            );
        }
    }

    /// The writer never produces what the reader's expansion bounds refuse: runs of zeros are
    /// the most compressible input for both codecs.
    #[test]
    fn the_most_compressible_sections_stay_within_the_readers_bounds() {
        let zeros = vec![0u8; 8 << 20];
        for c in [Compression::Lz4, Compression::Zstd] {
            let mut w = SectionWriter::with_compression(c);
            w.begin(1);
            w.block(0, 1, &zeros).unwrap();
            let stored = w.finish().unwrap().to_vec();
            let payload = stored.len() - COMPRESSED_SECTION_HEADER_LEN - 4;
            let ratio = zeros.len() / payload;
            let parsed = parse_section(1, &stored).unwrap();
            assert_eq!(parsed.compression(), c);
            assert_eq!(parsed.get(0).unwrap().entries, &zeros[..], "{c}");
            assert!(ratio > 100, "{c}: ratio {ratio}");
        }
    }

    #[test]
    fn a_section_counts_at_most_max_states_blocks() {
        let mut w = SectionWriter::with_compression(Compression::Lz4);
        w.begin(0);
        for id in 0..i16::MAX {
            w.block(id, 0, &[]).unwrap();
        }
        // The next count would need bit 15, the compressed marker.
        assert!(w.block(i16::MAX, 0, &[]).is_err());
        let stored = w.finish().unwrap().to_vec();
        assert_eq!(parse_section(0, &stored).unwrap().len(), MAX_STATES);
    }

    #[test]
    fn damaged_compressed_sections_name_their_key_group() {
        for c in [Compression::Lz4, Compression::Zstd] {
            let mut w = SectionWriter::with_compression(c);
            let (stored, _) = similar_section(&mut w, 200);
            let payload = COMPRESSED_SECTION_HEADER_LEN..stored.len() - 4;

            // Any flipped bit fails the checksum.
            for i in 0..stored.len() {
                let mut s = stored.clone();
                s[i] ^= 0x04;
                let e = parse_section(5, &s).unwrap_err().to_string();
                assert!(e.contains("key group 5"), "{c}: flip at {i}: {e}");
            }

            // Forged: the checksum recomputed, so the codec or the framing must catch it.
            let forged = |edit: &dyn Fn(&mut Vec<u8>)| {
                let mut s = stored.clone();
                edit(&mut s);
                reseal(&mut s);
                parse_section(5, &s).map(|_| ()).unwrap_err().to_string()
            };
            let cannot = format!("{c} cannot decompress");
            // Garbage instead of the payload.
            let e = forged(&|s| s[payload.clone()].fill(0xff));
            assert!(e.contains("key group 5") && e.contains(&cannot), "{c}: {e}");
            // The payload cut short.
            let e = forged(&|s| {
                s.drain(payload.start + (payload.len() / 2)..payload.end);
            });
            assert!(e.contains("key group 5"), "{c}: {e}");
            // A claimed length one byte short of the real one, and one byte over.
            for delta in [-1i64, 1] {
                let e = forged(&|s| {
                    let len = u32::from_le_bytes(s[7..11].try_into().unwrap());
                    let len = (i64::from(len) + delta) as u32;
                    s[7..11].copy_from_slice(&len.to_le_bytes());
                });
                assert!(e.contains("key group 5"), "{c} {delta}: {e}");
            }
            // Absurd lengths are refused before allocating.
            let e = forged(&|s| s[7..11].copy_from_slice(&u32::MAX.to_le_bytes()));
            assert!(
                e.contains("key group 5") && e.contains("refusing to allocate"),
                "{c}: {e}"
            );
            let e = forged(&|s| {
                let len = c.max_expansion(payload.len()) as u32 + 1;
                s[7..11].copy_from_slice(&len.to_le_bytes());
            });
            assert!(e.contains("refusing to allocate"), "{c}: {e}");
            // An unknown codec, and a compressed section cut before its length.
            let e = forged(&|s| s[6] = 0);
            assert!(e.contains("unknown codec id 0"), "{c}: {e}");
            let e = forged(&|s| s.truncate(9 + 4));
            assert!(
                e.contains("key group 5") && e.contains("truncated"),
                "{c}: {e}"
            );
            // Every flipped byte in the payload, checksum recomputed: an error or (a flip in
            // a literal byte) other entries, never a panic.
            for i in payload.clone() {
                let mut s = stored.clone();
                s[i] ^= 0x5a;
                reseal(&mut s);
                if let Err(e) = parse_section(5, &s) {
                    assert!(e.to_string().contains("key group 5"), "{c}: {e}");
                }
            }
        }
    }

    #[test]
    fn a_zstd_claim_its_frame_contradicts_is_refused_before_allocating() {
        // Found by `weir-fuzz` (keyed target): a forged section claiming far more blocks than
        // its (damaged) zstd frame holds made the reader allocate the claim, up to 32768 times
        // the stored bytes, before the codec failed. The frame's recorded content size and a
        // header that parses are now checked first.
        let mut w = SectionWriter::with_compression(Compression::Zstd);
        let (stored, _) = similar_section(&mut w, 200);
        let payload = COMPRESSED_SECTION_HEADER_LEN..stored.len() - 4;
        let claimed = |s: &[u8]| u32::from_le_bytes(s[7..11].try_into().unwrap());
        let real = claimed(&stored);
        let mut bigger = stored.clone();
        let forged = (payload.len() as u32 * 32 * 1024).min(real * 64);
        bigger[7..11].copy_from_slice(&forged.to_le_bytes());
        reseal(&mut bigger);
        let e = parse_section(5, &bigger).unwrap_err().to_string();
        assert!(
            e.contains(&format!("holds {real} bytes, the section claims {forged}"))
                && e.contains("refusing to allocate"),
            "{e}"
        );
        // A frame whose header is damaged is refused without decompressing.
        let mut garbled = stored.clone();
        garbled[payload.start..payload.start + 4].copy_from_slice(b"junk");
        reseal(&mut garbled);
        let e = parse_section(5, &garbled).unwrap_err().to_string();
        assert!(e.contains("the frame header does not parse"), "{e}");
        // The writer's own frames pass the check.
        assert_eq!(
            parse_section(5, &stored).unwrap().blocks_len(),
            real as usize
        );
    }

    proptest::proptest! {
        /// Random payloads behind a well-formed compressed section header, with a valid checksum:
        /// the codecs fail cleanly, never panic.
        #[test]
        fn garbage_compressed_payloads_never_panic(
            codec in 1u8..=2,
            count in 0u16..4,
            blocks_len in 0u32..4096,
            payload in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..512),
        ) {
            let mut s = Vec::new();
            s.extend_from_slice(&9u32.to_le_bytes());
            s.extend_from_slice(&(SECTION_COMPRESSED | count).to_le_bytes());
            s.push(codec);
            s.extend_from_slice(&blocks_len.to_le_bytes());
            s.extend_from_slice(&payload);
            s.extend_from_slice(&[0; 4]);
            reseal(&mut s);
            if let Err(e) = parse_section(9, &s) {
                proptest::prop_assert!(e.to_string().contains("key group 9"), "{}", e);
            }
        }
    }
}
