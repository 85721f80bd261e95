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
//!   before allocating anything, and any failure of the codec or mismatch of the decompressed
//!   length is a [`CoreError::Corrupt`](weir_core::CoreError::Corrupt) naming the key group.
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

mod entries;
mod header;
mod restore;
mod section;
#[cfg(test)]
mod tests;
mod writer;

pub use entries::{EntryEncoder, decode_entries};
pub(crate) use entries::{decode_entries_with, decode_keys_with};
pub use header::{SnapshotHeader, StateMeta};
pub use restore::{
    RestoreFilePart, RestorePart, part_sections, whole_shared_stream_part, whole_stream_part,
};
pub(crate) use restore::{read_file_part, section_spans};
pub(crate) use section::parse_section_with;
pub use section::{
    BlockKind, Section, SectionBlock, SectionBlocks, SectionIter, StateBlock, parse_section,
};
pub use writer::SectionWriter;

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

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
