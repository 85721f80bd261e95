//! A run's index and filter: where its blocks are, by first key, and the bloom filter of their
//! keys. Format 2 cuts them into partitions of [`PARTITION_BLOCKS`] blocks, each behind its own
//! digest and loaded the first time a read needs it, under a small top-level index read at the
//! open (RocksDB's partitioned index and filters): opening a run costs the same whatever its
//! size, which keeps a restore from local files flat in the state's size. Format 1's single
//! index and filter are one partition, loaded at the open.

use super::bloom::{self, Bloom};
use std::sync::{Arc, OnceLock};

/// Blocks per partition of a format-2 run (~64 × 4 KiB of data per partition).
pub(crate) const PARTITION_BLOCKS: u32 = 64;

/// Where one block is, and its digest.
#[derive(Clone, Copy, Debug)]
pub(crate) struct BlockEntry {
    key_start: u32,
    key_len: u32,
    pub offset: u64,
    pub len: u32,
    pub digest: u64,
}

/// The index and filter of a run of blocks: their first keys and places, and a bloom filter of
/// their keys (absent for a run written without one).
#[derive(Debug, Default)]
pub(crate) struct Partition {
    keys: Vec<u8>,
    blocks: Vec<BlockEntry>,
    bloom: Option<Bloom>,
}

impl Partition {
    /// Its number of blocks.
    pub(crate) fn len(&self) -> usize {
        self.blocks.len()
    }

    /// Block `b`.
    pub(crate) fn block(&self, b: usize) -> BlockEntry {
        self.blocks[b]
    }

    /// The block that may hold `key`: the last whose first key is at most `key`.
    pub(crate) fn block_for(&self, key: &[u8]) -> Option<usize> {
        let keys = &self.keys;
        self.blocks
            .partition_point(|e| {
                &keys[e.key_start as usize..e.key_start as usize + e.key_len as usize] <= key
            })
            .checked_sub(1)
    }

    /// False when the filter says a key with this hash is certainly absent.
    pub(crate) fn may_contain(&self, hash: u64) -> bool {
        self.bloom.as_ref().is_none_or(|b| b.may_contain(hash))
    }
}

/// Reads `n` bytes at `*at` of `bytes`, moving past them.
fn take<'a>(bytes: &'a [u8], at: &mut usize, n: usize) -> Result<&'a [u8], String> {
    let end = at.checked_add(n).ok_or("an index length overflows")?;
    let slice = bytes.get(*at..end).ok_or("the index is truncated")?;
    *at = end;
    Ok(slice)
}

fn u32_at(bytes: &[u8], at: &mut usize) -> Result<u32, String> {
    let b = take(bytes, at, 4)?;
    Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
}

fn u64_at(bytes: &[u8], at: &mut usize) -> Result<u64, String> {
    let b = take(bytes, at, 8)?;
    Ok(u64::from_le_bytes(b.try_into().map_err(|_| "8 bytes")?))
}

/// Reads `blocks` index entries (`first key length u32 | first key | offset u64 | length u32 |
/// xxh3-64`) at `*at`, each block inside `data` and after the one before.
fn parse_blocks(
    bytes: &[u8],
    at: &mut usize,
    blocks: u64,
    data: (u64, u64),
) -> Result<(Vec<u8>, Vec<BlockEntry>), String> {
    let mut keys = Vec::new();
    let mut entries = Vec::with_capacity(usize::try_from(blocks.min(1 << 24)).unwrap_or(0));
    let mut prev_end = data.0;
    for b in 0..blocks {
        let len = u32_at(bytes, at)?;
        let key = take(bytes, at, len as usize)?;
        let offset = u64_at(bytes, at)?;
        let block_len = u32_at(bytes, at)?;
        let digest = u64_at(bytes, at)?;
        let block_end = offset.checked_add(u64::from(block_len));
        if offset < prev_end || block_end.is_none_or(|e| e > data.1) || block_len == 0 {
            return Err(format!("block {b} lies outside the data"));
        }
        prev_end = offset + u64::from(block_len);
        let key_start = u32::try_from(keys.len()).map_err(|_| "an index over 4 GiB of keys")?;
        entries.push(BlockEntry {
            key_start,
            key_len: len,
            offset,
            len: block_len,
            digest,
        });
        keys.extend_from_slice(key);
    }
    Ok((keys, entries))
}

/// Reads a filter: `probes u32 | bits`.
fn parse_bloom(bytes: &[u8]) -> Result<Bloom, String> {
    if bytes.len() < 12 {
        return Err("a filter of fewer than 8 bytes".to_string());
    }
    let k = u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
    if k == 0 || k > bloom::MAX_PROBES {
        return Err(format!("a filter with {k} probes"));
    }
    Ok(Bloom::from_parts(bytes[4..].to_vec(), k))
}

/// Format 1's index and filter, read at the open: one partition, and the run's last key.
pub(crate) fn parse_whole(
    index: &[u8],
    bloom_bytes: &[u8],
    blocks: u64,
    data: (u64, u64),
) -> Result<(Index, Vec<u8>), String> {
    let mut at = 0;
    let (keys, entries) = parse_blocks(index, &mut at, blocks, data)?;
    let len = u32_at(index, &mut at)?;
    let last = take(index, &mut at, len as usize)?.to_vec();
    if at != index.len() {
        return Err("bytes after the index".to_string());
    }
    let bloom = (!bloom_bytes.is_empty())
        .then(|| parse_bloom(bloom_bytes))
        .transpose()?;
    let whole = Partition {
        keys,
        blocks: entries,
        bloom,
    };
    let index = Index {
        top_keys: Vec::new(),
        top_prefixes: vec![0],
        top: vec![PartitionRef {
            key_start: 0,
            key_len: 0,
            offset: 0,
            len: 0,
            blocks: u32::try_from(blocks).map_err(|_| "too many blocks")?,
            digest: 0,
        }],
        parts: vec![OnceLock::from(Arc::new(whole))],
        blocks,
    };
    Ok((index, last))
}

/// Where a format-2 partition is: its first key, place, blocks and digest.
#[derive(Clone, Copy, Debug)]
struct PartitionRef {
    key_start: u32,
    key_len: u32,
    offset: u64,
    len: u32,
    blocks: u32,
    digest: u64,
}

/// The first 8 bytes of `key`, zero-padded, big-endian: ordered as the keys are where they
/// differ (equal prefixes need the whole keys compared).
fn prefix(key: &[u8]) -> u64 {
    let mut b = [0u8; 8];
    let n = key.len().min(8);
    b[..n].copy_from_slice(&key[..n]);
    u64::from_be_bytes(b)
}

/// A run's index: partitions, each loaded once, when first needed.
#[derive(Debug)]
pub(crate) struct Index {
    top_keys: Vec<u8>,
    /// Each partition's first key's [`prefix`]: what a lookup searches first, in one
    /// contiguous array (every lookup searches the top index of each run it passes).
    top_prefixes: Vec<u64>,
    top: Vec<PartitionRef>,
    parts: Vec<OnceLock<Arc<Partition>>>,
    blocks: u64,
}

impl Index {
    /// Format 2's top-level index (`per partition: first key length u32 | first key | offset
    /// u64 | length u32 | blocks u32 | xxh3-64 of the partition; then the last key: length u32
    /// | key`), its partitions inside `data`, `blocks` blocks in all; and the run's last key.
    pub(crate) fn parse_top(
        bytes: &[u8],
        blocks: u64,
        data: (u64, u64),
    ) -> Result<(Index, Vec<u8>), String> {
        let mut at = 0;
        let mut top_keys = Vec::new();
        let mut top = Vec::new();
        let (mut counted, mut prev_end) = (0u64, data.0);
        while counted < blocks {
            let len = u32_at(bytes, &mut at)?;
            let key = take(bytes, &mut at, len as usize)?;
            let r = PartitionRef {
                key_start: u32::try_from(top_keys.len()).map_err(|_| "a top index over 4 GiB")?,
                key_len: len,
                offset: u64_at(bytes, &mut at)?,
                len: u32_at(bytes, &mut at)?,
                blocks: u32_at(bytes, &mut at)?,
                digest: u64_at(bytes, &mut at)?,
            };
            let end = r.offset.checked_add(u64::from(r.len));
            if r.offset < prev_end || end.is_none_or(|e| e > data.1) || r.blocks == 0 {
                return Err(format!("partition {} lies outside the data", top.len()));
            }
            prev_end = r.offset + u64::from(r.len);
            counted += u64::from(r.blocks);
            top_keys.extend_from_slice(key);
            top.push(r);
        }
        if counted != blocks {
            return Err(format!(
                "partitions of {counted} blocks, where the footer says {blocks}"
            ));
        }
        let len = u32_at(bytes, &mut at)?;
        let last = take(bytes, &mut at, len as usize)?.to_vec();
        if at != bytes.len() {
            return Err("bytes after the top-level index".to_string());
        }
        let parts = top.iter().map(|_| OnceLock::new()).collect();
        let top_prefixes = top
            .iter()
            .map(|r| prefix(&top_keys[r.key_start as usize..][..r.key_len as usize]))
            .collect();
        Ok((
            Index {
                top_keys,
                top_prefixes,
                top,
                parts,
                blocks,
            },
            last,
        ))
    }

    /// Its number of blocks.
    pub(crate) fn blocks(&self) -> u64 {
        self.blocks
    }

    /// Its number of partitions.
    pub(crate) fn partitions(&self) -> usize {
        self.top.len()
    }

    /// The partition that may hold `key`: the last whose first key is at most `key` (the first
    /// when none is).
    pub(crate) fn partition_for(&self, key: &[u8]) -> usize {
        let kp = prefix(key);
        // Below `lo` the first keys are smaller (a smaller prefix), from `hi` larger; between,
        // the prefixes are equal and the whole keys decide.
        let lo = self.top_prefixes.partition_point(|&p| p < kp);
        let hi = lo + self.top_prefixes[lo..].partition_point(|&p| p == kp);
        let keys = &self.top_keys;
        let equal = self.top[lo..hi].partition_point(|r| {
            &keys[r.key_start as usize..r.key_start as usize + r.key_len as usize] <= key
        });
        (lo + equal).saturating_sub(1)
    }

    /// Partition `p`, read by `read(offset, length)` and checked the first time.
    pub(crate) fn partition(
        &self,
        p: usize,
        read: impl FnOnce(u64, usize) -> Result<Vec<u8>, String>,
    ) -> Result<&Arc<Partition>, String> {
        if let Some(part) = self.parts[p].get() {
            return Ok(part);
        }
        let r = self.top[p];
        let bytes = read(r.offset, r.len as usize)?;
        if xxhash_rust::xxh3::xxh3_64(&bytes) != r.digest {
            return Err(format!(
                "index partition {p} at offset {} fails its digest",
                r.offset
            ));
        }
        let mut at = 0;
        // The blocks of a partition come just before it.
        let (keys, blocks) = parse_blocks(&bytes, &mut at, u64::from(r.blocks), (0, r.offset))
            .map_err(|e| format!("index partition {p}: {e}"))?;
        let bloom_len = u32_at(&bytes, &mut at)? as usize;
        let bloom_bytes = take(&bytes, &mut at, bloom_len)?;
        if at != bytes.len() {
            return Err(format!("index partition {p}: bytes after its filter"));
        }
        let bloom = (bloom_len > 0)
            .then(|| parse_bloom(bloom_bytes))
            .transpose()
            .map_err(|e| format!("index partition {p}: {e}"))?;
        let part = Arc::new(Partition {
            keys,
            blocks,
            bloom,
        });
        Ok(self.parts[p].get_or_init(|| part))
    }
}

/// Builds format 2's partitions and top-level index while a run is written.
#[derive(Debug, Default)]
pub(crate) struct IndexWriter {
    /// Bits of filter per key; 0: no filter.
    bits_per_key: u32,
    /// The open partition: its index entries, its first key, blocks and keys' hashes.
    part: Vec<u8>,
    part_first: Vec<u8>,
    part_blocks: u32,
    hashes: Vec<u64>,
    /// The top-level index so far.
    pub top: Vec<u8>,
}

impl IndexWriter {
    /// A writer whose partitions have filters of `bits_per_key` bits per key (0: none).
    pub(crate) fn new(bits_per_key: u32) -> IndexWriter {
        IndexWriter {
            bits_per_key,
            ..IndexWriter::default()
        }
    }

    /// Notes a key of the open partition (for its filter).
    pub(crate) fn add_key(&mut self, key: &[u8]) {
        if self.bits_per_key > 0 {
            self.hashes.push(bloom::key_hash(key));
        }
    }

    /// Adds a finished block; true when the partition is full and should be written.
    pub(crate) fn add_block(&mut self, first: &[u8], offset: u64, len: u32, digest: u64) -> bool {
        if self.part_blocks == 0 {
            self.part_first.clear();
            self.part_first.extend_from_slice(first);
        }
        self.part
            .extend_from_slice(&(first.len() as u32).to_le_bytes());
        self.part.extend_from_slice(first);
        self.part.extend_from_slice(&offset.to_le_bytes());
        self.part.extend_from_slice(&len.to_le_bytes());
        self.part.extend_from_slice(&digest.to_le_bytes());
        self.part_blocks += 1;
        self.part_blocks >= PARTITION_BLOCKS
    }

    /// The open partition's bytes, to be written at `offset`, with its entry in the top-level
    /// index; `None` when it has no block.
    pub(crate) fn finish_partition(&mut self, offset: u64) -> Option<Vec<u8>> {
        if self.part_blocks == 0 {
            return None;
        }
        let mut bytes = std::mem::take(&mut self.part);
        if self.bits_per_key > 0 {
            let mut b = Bloom::new(self.hashes.len() as u64, self.bits_per_key);
            for h in self.hashes.drain(..) {
                b.insert(h);
            }
            bytes.extend_from_slice(&(4 + b.bytes().len() as u32).to_le_bytes());
            bytes.extend_from_slice(&b.probes().to_le_bytes());
            bytes.extend_from_slice(b.bytes());
        } else {
            bytes.extend_from_slice(&0u32.to_le_bytes());
        }
        let top = &mut self.top;
        top.extend_from_slice(&(self.part_first.len() as u32).to_le_bytes());
        top.extend_from_slice(&self.part_first);
        top.extend_from_slice(&offset.to_le_bytes());
        top.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
        top.extend_from_slice(&self.part_blocks.to_le_bytes());
        top.extend_from_slice(&xxhash_rust::xxh3::xxh3_64(&bytes).to_le_bytes());
        self.part_blocks = 0;
        Some(bytes)
    }
}
