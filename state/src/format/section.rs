//! Reading one key group's section: checking, decompressing and framing its blocks.

use super::{
    BLOCK_HEADER_LEN, COMPRESSED_SECTION_HEADER_LEN, Compression, EMPTY_SECTION_LEN,
    MAX_COMPRESSED_BLOCKS_LEN, SECTION_COMPRESSED,
};
use crate::StateError;
use weir_core::CoreError;
use weir_core::keygroup::KeyGroup;

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
    /// The encoded entries (see [`decode_entries`](super::decode_entries)).
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
    /// The encoded entries (see [`decode_entries`](super::decode_entries)).
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
/// This reads sections of format versions 1 and 2;
/// [`SnapshotHeader::parse_section`](super::SnapshotHeader::parse_section) reads those of any
/// version by the header's.
pub fn parse_section(key_group: KeyGroup, bytes: &[u8]) -> Result<Section<'_>, StateError> {
    parse_section_with(key_group, bytes, false)
}

/// [`parse_section`], allowing overlay blocks when `overlays` (format version 3).
pub(crate) fn parse_section_with(
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
