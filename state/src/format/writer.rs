//! Writing one key group's section: its blocks, compressed when that makes it smaller.

use super::header::SnapshotHeader;
use super::section::BlockKind;
use super::{
    BLOCK_HEADER_LEN, Compression, EMPTY_SECTION_LEN, FORMAT_VERSION_V3, MAX_COMPRESSED_BLOCKS_LEN,
    SECTION_COMPRESSED,
};
use crate::StateError;
use std::fmt;
use weir_core::CoreError;
use weir_core::keygroup::KeyGroup;

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
    /// in ascending state id, at most [`MAX_STATES`](super::MAX_STATES) of them; with overlays
    /// (format version 3), in non-decreasing state id, several blocks of one state applied in
    /// order.
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
