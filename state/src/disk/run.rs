//! The on-disk backend's sorted runs: immutable files of entries sorted by key, written once by
//! a flush or a compaction and read by point lookups and range cursors, every block checked by
//! its digest.
//!
//! A run file (format version 1, integers little-endian):
//!
//! ```text
//! header  "WRUN" | version u16 | identity length u32 | postcard RunIdentity
//! blocks  entries: key length (LEB128) | tag (LEB128: 0 = deleted, n + 1 = value of n bytes)
//!         | key | value; a block ends after the entry that passes BLOCK_SIZE, then the offset
//!         (u32) of every RESTART_INTERVAL-th entry from the first, then their number (u32): a
//!         lookup searches the restarts by binary search and walks at most that many entries
//! index   per block: key length u32 | first key | offset u64 | length u32 | xxh3-64 of the block;
//!         then the last key: length u32 | key
//! bloom   probes u32 | bits (none when the footer's bloom offset equals the footer's)
//! footer  index offset u64 | bloom offset u64 | entries u64 | deleted u64 | blocks u64
//!         | xxh3-64 of header, index, bloom and the footer's five numbers u64 | version u16
//!         | "WRNE" | 2 zero bytes
//! ```
//!
//! Opening a run reads the header, index, filter and footer and checks their digest and the
//! identity; each block is checked when it is read. A damaged or foreign file is an error that
//! names it.

use super::bloom::{self, Bloom};
use super::varint;
use crate::StateError;
use serde::{Deserialize, Serialize};
use std::fs::File;
use std::io::{BufWriter, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use weir_core::keygroup::{KeyGroup, KeyGroupRange};
use xxhash_rust::xxh3::{Xxh3, xxh3_64};

/// Magic bytes at the head of a run file.
pub(crate) const RUN_MAGIC: [u8; 4] = *b"WRUN";
/// Magic bytes at the end of a run file.
pub(crate) const RUN_END_MAGIC: [u8; 4] = *b"WRNE";
/// The run format version this build writes and reads.
pub(crate) const RUN_VERSION: u16 = 1;
/// A block ends after the entry that takes it past this many bytes.
pub(crate) const BLOCK_SIZE: usize = 4096;
/// Every this many entries of a block, its offset is recorded for binary search.
pub(crate) const RESTART_INTERVAL: u32 = 8;
const FOOTER_LEN: u64 = 56;
/// The largest identity a reader accepts.
const MAX_IDENTITY_LEN: u32 = 4096;
/// The largest key or value the format takes: anything longer in a file is damage.
pub(crate) const MAX_ENTRY_LEN: u64 = 1 << 31;

/// What a run file says it is: whose store wrote it, and which run.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct RunIdentity {
    /// The store that wrote it (its operator and subtask, as in its directory name).
    pub store: String,
    /// The run's number in that store.
    pub run_id: u64,
}

/// Deletes the store's directory once the store and every run in it are gone.
#[derive(Debug)]
pub(crate) struct DirGuard {
    pub path: PathBuf,
    /// The directory's lock, held while it lives (`None` for a directory not locked).
    pub lock: Option<std::fs::File>,
}

impl Drop for DirGuard {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
        drop(self.lock.take());
    }
}

/// An entry read from a run: `None` is a deletion (a tombstone).
pub(crate) type Entry<'a> = (&'a [u8], Option<&'a [u8]>);

#[derive(Clone, Copy, Debug)]
struct BlockEntry {
    key_start: u32,
    key_len: u32,
    offset: u64,
    len: u32,
    digest: u64,
}

/// The key group of a stored key (its first two bytes, big-endian).
pub(crate) fn key_group_of(key: &[u8]) -> KeyGroup {
    match key {
        [a, b, ..] => KeyGroup::from(u16::from_be_bytes([*a, *b])),
        _ => KeyGroup::MAX,
    }
}

/// An open run. The file is deleted when the run is dropped after it was made obsolete (a
/// compaction replaced it); snapshots and scans that still hold it keep it readable.
///
/// A run answers only for the key groups of its `clip`: a run restored after rescaling may hold
/// keys of key groups another subtask now owns, and its entries there are not this store's.
pub(crate) struct Run {
    pub id: u64,
    /// Who wrote it: the store and its run number, also its name in checkpoints.
    pub identity: RunIdentity,
    /// The key groups it answers for.
    pub clip: KeyGroupRange,
    path: PathBuf,
    file: File,
    index_keys: Vec<u8>,
    index: Vec<BlockEntry>,
    last_key: Vec<u8>,
    bloom: Option<Bloom>,
    /// Entries, deletions included.
    pub entries: u64,
    /// Deletions.
    pub deleted: u64,
    /// The file's length in bytes.
    pub bytes: u64,
    obsolete: AtomicBool,
    _dir: Option<Arc<DirGuard>>,
}

impl std::fmt::Debug for Run {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Run")
            .field("id", &self.id)
            .field("entries", &self.entries)
            .field("deleted", &self.deleted)
            .field("bytes", &self.bytes)
            .finish()
    }
}

impl Drop for Run {
    fn drop(&mut self) {
        if self.obsolete.load(Ordering::Acquire) {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// Empties a run file found damaged, so that none of its hard links (a local-recovery copy,
/// another store's restored run) is trusted again: each fails its next open, and a restore
/// downloads the file from checkpoint storage instead.
fn quarantine(path: &Path) {
    if let Ok(file) = std::fs::OpenOptions::new().write(true).open(path) {
        let _ = file.set_len(0);
    }
}

/// Checks a run file as an open does (its end, footer, index and bloom digests and its
/// identity against `name`) and that it has `size` bytes, without keeping it: how a restore
/// decides whether a local copy can stand in for a download. Data blocks are checked when
/// read, as always.
pub(crate) fn check_file(path: &Path, name: &str, size: u64) -> Result<(), StateError> {
    let identity = parse_run_name(name)
        .ok_or_else(|| StateError::Restore(format!("{name:?} is not the name of a run")))?;
    let run = Run::open(path, &identity, KeyGroupRange::new(0, u32::MAX), None)?;
    if run.bytes != size {
        return Err(damaged(
            path,
            format!("{} bytes, and its snapshot says {size}", run.bytes),
        ));
    }
    Ok(())
}

fn damaged(path: &Path, what: impl std::fmt::Display) -> StateError {
    StateError::Disk {
        path: path.to_path_buf(),
        reason: format!("damaged run file: {what}"),
    }
}

fn io(path: &Path, e: std::io::Error) -> StateError {
    StateError::Disk {
        path: path.to_path_buf(),
        reason: e.to_string(),
    }
}

/// Writes one run, entries in ascending key order.
pub(crate) struct RunWriter {
    path: PathBuf,
    out: BufWriter<File>,
    written: u64,
    header: Vec<u8>,
    block: Vec<u8>,
    block_first: Vec<u8>,
    /// The block's entries so far, and the offsets of its restart entries.
    in_block: u32,
    restarts: Vec<u32>,
    index: Vec<u8>,
    last_key: Vec<u8>,
    bloom: Option<Bloom>,
    entries: u64,
    deleted: u64,
    blocks: u64,
}

impl RunWriter {
    /// Starts run `identity` at `path`, with a filter sized for at most `max_entries` entries
    /// when `bits_per_key` is above 0.
    pub(crate) fn create(
        path: &Path,
        identity: &RunIdentity,
        max_entries: u64,
        bits_per_key: u32,
    ) -> Result<RunWriter, StateError> {
        let file = File::create(path).map_err(|e| io(path, e))?;
        let ident = postcard::to_allocvec(identity).map_err(|e| damaged(path, e))?;
        let mut header = Vec::with_capacity(10 + ident.len());
        header.extend_from_slice(&RUN_MAGIC);
        header.extend_from_slice(&RUN_VERSION.to_le_bytes());
        header.extend_from_slice(&(ident.len() as u32).to_le_bytes());
        header.extend_from_slice(&ident);
        let mut out = BufWriter::with_capacity(1 << 16, file);
        out.write_all(&header).map_err(|e| io(path, e))?;
        Ok(RunWriter {
            path: path.to_path_buf(),
            out,
            written: header.len() as u64,
            header,
            block: Vec::with_capacity(BLOCK_SIZE * 2),
            block_first: Vec::new(),
            in_block: 0,
            restarts: Vec::new(),
            index: Vec::new(),
            last_key: Vec::new(),
            bloom: (bits_per_key > 0).then(|| Bloom::new(max_entries, bits_per_key)),
            entries: 0,
            deleted: 0,
            blocks: 0,
        })
    }

    /// Appends an entry; keys must ascend strictly.
    pub(crate) fn add(&mut self, key: &[u8], value: Option<&[u8]>) -> Result<(), StateError> {
        debug_assert!(self.entries == 0 || key > self.last_key.as_slice());
        if self.block.is_empty() {
            self.block_first.clear();
            self.block_first.extend_from_slice(key);
        }
        if self.in_block.is_multiple_of(RESTART_INTERVAL) {
            let at = u32::try_from(self.block.len()).map_err(|_| {
                damaged(
                    &self.path,
                    "a block over 4 GiB (an entry that large is refused)",
                )
            })?;
            self.restarts.push(at);
        }
        self.in_block += 1;
        varint::put(&mut self.block, key.len() as u64);
        match value {
            Some(v) => varint::put(&mut self.block, v.len() as u64 + 1),
            None => {
                varint::put(&mut self.block, 0);
                self.deleted += 1;
            }
        }
        self.block.extend_from_slice(key);
        if let Some(v) = value {
            self.block.extend_from_slice(v);
        }
        if let Some(b) = &mut self.bloom {
            b.insert(bloom::key_hash(key));
        }
        self.last_key.clear();
        self.last_key.extend_from_slice(key);
        self.entries += 1;
        if self.block.len() >= BLOCK_SIZE {
            self.finish_block()?;
        }
        Ok(())
    }

    fn finish_block(&mut self) -> Result<(), StateError> {
        if self.block.is_empty() {
            return Ok(());
        }
        for r in &self.restarts {
            self.block.extend_from_slice(&r.to_le_bytes());
        }
        self.block
            .extend_from_slice(&(self.restarts.len() as u32).to_le_bytes());
        self.restarts.clear();
        self.in_block = 0;
        let digest = xxh3_64(&self.block);
        self.index
            .extend_from_slice(&(self.block_first.len() as u32).to_le_bytes());
        self.index.extend_from_slice(&self.block_first);
        self.index.extend_from_slice(&self.written.to_le_bytes());
        self.index
            .extend_from_slice(&(self.block.len() as u32).to_le_bytes());
        self.index.extend_from_slice(&digest.to_le_bytes());
        self.out
            .write_all(&self.block)
            .map_err(|e| io(&self.path, e))?;
        self.written += self.block.len() as u64;
        self.blocks += 1;
        self.block.clear();
        Ok(())
    }

    /// Entries added so far.
    pub(crate) fn entries(&self) -> u64 {
        self.entries
    }

    /// Writes the index, filter and footer, syncs nothing (the file is a working file of this
    /// process), and returns the path.
    pub(crate) fn finish(mut self) -> Result<PathBuf, StateError> {
        self.finish_block()?;
        self.index
            .extend_from_slice(&(self.last_key.len() as u32).to_le_bytes());
        self.index.extend_from_slice(&self.last_key);
        let index_offset = self.written;
        let bloom_offset = index_offset + self.index.len() as u64;
        let mut bloom_bytes = Vec::new();
        if let Some(b) = &self.bloom {
            bloom_bytes.extend_from_slice(&b.probes().to_le_bytes());
            bloom_bytes.extend_from_slice(b.bytes());
        }
        let mut footer = Vec::with_capacity(FOOTER_LEN as usize);
        for n in [
            index_offset,
            bloom_offset,
            self.entries,
            self.deleted,
            self.blocks,
        ] {
            footer.extend_from_slice(&n.to_le_bytes());
        }
        let mut digest = Xxh3::new();
        digest.update(&self.header);
        digest.update(&self.index);
        digest.update(&bloom_bytes);
        digest.update(&footer);
        footer.extend_from_slice(&digest.digest().to_le_bytes());
        footer.extend_from_slice(&RUN_VERSION.to_le_bytes());
        footer.extend_from_slice(&RUN_END_MAGIC);
        footer.extend_from_slice(&[0, 0]);
        debug_assert_eq!(footer.len() as u64, FOOTER_LEN);
        let path = self.path.clone();
        let mut out = self.out;
        for part in [&self.index, &bloom_bytes, &footer] {
            out.write_all(part).map_err(|e| io(&path, e))?;
        }
        out.flush().map_err(|e| io(&path, e))?;
        Ok(path)
    }
}

fn le_u64(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

fn le_u32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

impl Run {
    /// Opens run `expected.run_id` of store `expected.store` at `path`, checking its footer,
    /// digest and identity.
    pub(crate) fn open(
        path: &Path,
        expected: &RunIdentity,
        clip: KeyGroupRange,
        dir: Option<Arc<DirGuard>>,
    ) -> Result<Run, StateError> {
        let file = File::open(path).map_err(|e| io(path, e))?;
        let len = file.metadata().map_err(|e| io(path, e))?.len();
        if len < FOOTER_LEN + 10 {
            return Err(damaged(
                path,
                format!("{len} bytes is shorter than any run"),
            ));
        }
        let mut footer = [0u8; FOOTER_LEN as usize];
        file.read_exact_at(&mut footer, len - FOOTER_LEN)
            .map_err(|e| io(path, e))?;
        if footer[50..54] != RUN_END_MAGIC {
            return Err(damaged(path, "no end magic (truncated, or not a run)"));
        }
        let version = u16::from_le_bytes([footer[48], footer[49]]);
        if version != RUN_VERSION {
            return Err(damaged(
                path,
                format!("format version {version}, this build reads {RUN_VERSION}"),
            ));
        }
        let index_offset = le_u64(&footer, 0);
        let bloom_offset = le_u64(&footer, 8);
        let entries = le_u64(&footer, 16);
        let deleted = le_u64(&footer, 24);
        let blocks = le_u64(&footer, 32);
        let digest = le_u64(&footer, 40);
        let meta_end = len - FOOTER_LEN;
        if !(10 <= index_offset && index_offset <= bloom_offset && bloom_offset <= meta_end) {
            return Err(damaged(path, "the footer's offsets are out of order"));
        }
        // Every entry and block takes bytes: counts beyond the file's length are damage.
        if entries > len || deleted > entries || blocks > len {
            return Err(damaged(
                path,
                format!("{entries} entries ({deleted} deleted) in {blocks} blocks of {len} bytes"),
            ));
        }
        let mut head = [0u8; 10];
        file.read_exact_at(&mut head, 0).map_err(|e| io(path, e))?;
        if head[0..4] != RUN_MAGIC {
            return Err(damaged(path, "no run magic at its head"));
        }
        let ident_len = le_u32(&head, 6);
        if ident_len > MAX_IDENTITY_LEN || 10 + u64::from(ident_len) > index_offset {
            return Err(damaged(path, format!("an identity of {ident_len} bytes")));
        }
        let mut header = vec![0u8; 10 + ident_len as usize];
        file.read_exact_at(&mut header, 0)
            .map_err(|e| io(path, e))?;
        let mut meta = vec![0u8; (meta_end - index_offset) as usize];
        file.read_exact_at(&mut meta, index_offset)
            .map_err(|e| io(path, e))?;
        let mut check = Xxh3::new();
        check.update(&header);
        check.update(&meta);
        check.update(&footer[..40]);
        if check.digest() != digest {
            return Err(damaged(
                path,
                "its index, filter or header fails its digest",
            ));
        }
        let identity: RunIdentity =
            postcard::from_bytes(&header[10..]).map_err(|e| damaged(path, e))?;
        if &identity != expected {
            return Err(damaged(
                path,
                format!(
                    "it is run {} of store {:?}, where run {} of store {:?} was expected",
                    identity.run_id, identity.store, expected.run_id, expected.store
                ),
            ));
        }
        let split = (bloom_offset - index_offset) as usize;
        let (index_bytes, bloom_bytes) = meta.split_at(split);
        let (index_keys, index, last_key) =
            parse_index(index_bytes, blocks, index_offset).map_err(|e| damaged(path, e))?;
        let bloom = if bloom_bytes.is_empty() {
            None
        } else if bloom_bytes.len() < 12 {
            return Err(damaged(path, "a filter of fewer than 8 bytes"));
        } else {
            let k = le_u32(bloom_bytes, 0);
            if k == 0 || k > bloom::MAX_PROBES {
                return Err(damaged(path, format!("a filter with {k} probes")));
            }
            Some(Bloom::from_parts(bloom_bytes[4..].to_vec(), k))
        };
        Ok(Run {
            id: expected.run_id,
            identity,
            clip,
            path: path.to_path_buf(),
            file,
            index_keys,
            index,
            last_key,
            bloom,
            entries,
            deleted,
            bytes: len,
            obsolete: AtomicBool::new(false),
            _dir: dir,
        })
    }

    /// The file.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// The name a checkpoint knows the run by: its writer's store and number.
    pub(crate) fn name(&self) -> String {
        run_name(&self.identity)
    }

    /// Whether the run answers for `key_group`.
    pub(crate) fn covers(&self, key_group: KeyGroup) -> bool {
        self.clip.contains(key_group)
    }

    /// Deletes the file when the last holder lets go of the run.
    pub(crate) fn make_obsolete(&self) {
        self.obsolete.store(true, Ordering::Release);
    }

    /// The block that may hold `key`: the last whose first key is at most `key`.
    fn block_for(&self, key: &[u8]) -> Option<usize> {
        let keys = &self.index_keys;
        self.index
            .partition_point(|e| {
                &keys[e.key_start as usize..e.key_start as usize + e.key_len as usize] <= key
            })
            .checked_sub(1)
    }

    /// Reads block `b` into `buf`, checking its digest; returns where its entries end.
    fn read_block(&self, b: usize, buf: &mut Vec<u8>) -> Result<usize, StateError> {
        let e = self.index[b];
        buf.clear();
        buf.resize(e.len as usize, 0);
        self.file
            .read_exact_at(buf, e.offset)
            .map_err(|err| io(&self.path, err))?;
        if xxh3_64(buf) != e.digest {
            quarantine(&self.path);
            return Err(damaged(
                &self.path,
                format!("block {b} at offset {} fails its digest", e.offset),
            ));
        }
        entries_end(buf).ok_or_else(|| {
            damaged(
                &self.path,
                format!("block {b} at offset {} has a bad restart table", e.offset),
            )
        })
    }

    /// Looks `key` up: `Some(Some(value))` found, `Some(None)` deleted here, `None` not in this
    /// run. The value is copied into `value`; `block` is a scratch buffer.
    pub(crate) fn get(
        &self,
        key: &[u8],
        hash: u64,
        block: &mut Vec<u8>,
        value: &mut Vec<u8>,
    ) -> Result<Option<bool>, StateError> {
        if key > self.last_key.as_slice() {
            return Ok(None);
        }
        if let Some(bloom) = &self.bloom
            && !bloom.may_contain(hash)
        {
            return Ok(None);
        }
        let Some(b) = self.block_for(key) else {
            return Ok(None);
        };
        let end = self.read_block(b, block)?;
        let entries = &block[..end];
        let mut at = restart_for(block, end, key).map_err(|e| damaged(&self.path, e))?;
        while at < end {
            let (k, v) = next_entry(entries, &mut at).map_err(|e| damaged(&self.path, e))?;
            match k.cmp(key) {
                std::cmp::Ordering::Less => continue,
                std::cmp::Ordering::Greater => return Ok(None),
                std::cmp::Ordering::Equal => {
                    return Ok(Some(match v {
                        Some(v) => {
                            value.clear();
                            value.extend_from_slice(v);
                            true
                        }
                        None => false,
                    }));
                }
            }
        }
        Ok(None)
    }
}

/// Where a block's entries end (before its restart table), if the table fits.
fn entries_end(block: &[u8]) -> Option<usize> {
    let n = block.len().checked_sub(4)?;
    let count = le_u32(block, n) as usize;
    let end = n.checked_sub(count.checked_mul(4)?)?;
    (count > 0 || end == 0).then_some(end)
}

/// The offset of the last restart entry whose key is at most `key` (0 when none is).
fn restart_for(block: &[u8], end: usize, key: &[u8]) -> Result<usize, String> {
    let count = (block.len() - 4 - end) / 4;
    let restart = |i: usize| le_u32(block, end + 4 * i) as usize;
    let (mut lo, mut hi) = (0usize, count);
    // The first restart whose key is above `key`.
    while lo < hi {
        let mid = (lo + hi) / 2;
        let mut at = restart(mid);
        if at >= end {
            return Err(format!("restart {mid} lies past the entries"));
        }
        let (k, _) = next_entry(&block[..end], &mut at)?;
        if k <= key {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    Ok(if lo == 0 { 0 } else { restart(lo - 1) })
}

/// The name of run `identity` in checkpoints: `<store>.<run>`.
pub(crate) fn run_name(identity: &RunIdentity) -> String {
    format!("{}.{:010}", identity.store, identity.run_id)
}

/// The identity a run name stands for.
pub(crate) fn parse_run_name(name: &str) -> Option<RunIdentity> {
    let (store, run) = name.rsplit_once('.')?;
    Some(RunIdentity {
        store: store.to_string(),
        run_id: run.parse().ok()?,
    })
}

/// Decodes the entry at `*at` in a block and moves past it.
pub(crate) fn next_entry<'a>(block: &'a [u8], at: &mut usize) -> Result<Entry<'a>, String> {
    let key_len = varint::get(block, at)?;
    let tag = varint::get(block, at)?;
    if key_len > MAX_ENTRY_LEN || tag > MAX_ENTRY_LEN {
        return Err(format!("an entry of {key_len} + {tag} bytes"));
    }
    let key_end = *at + key_len as usize;
    let value_len = tag.saturating_sub(1) as usize;
    let end = key_end + value_len;
    if end > block.len() {
        return Err("an entry runs past its block".to_string());
    }
    let key = &block[*at..key_end];
    let value = (tag > 0).then(|| &block[key_end..end]);
    *at = end;
    Ok((key, value))
}

/// An index read back: the blocks' first keys, the blocks, and the run's last key.
type ParsedIndex = (Vec<u8>, Vec<BlockEntry>, Vec<u8>);

fn parse_index(bytes: &[u8], blocks: u64, data_end: u64) -> Result<ParsedIndex, String> {
    let mut keys = Vec::new();
    let mut index = Vec::with_capacity(usize::try_from(blocks.min(1 << 24)).unwrap_or(0));
    let mut at = 0usize;
    let take = |at: &mut usize, n: usize| -> Result<std::ops::Range<usize>, String> {
        let r = *at..at.checked_add(n).ok_or("index length overflows")?;
        if r.end > bytes.len() {
            return Err("the index is truncated".to_string());
        }
        *at = r.end;
        Ok(r)
    };
    let mut prev_end = 0u64;
    for b in 0..blocks {
        let len = le_u32(&bytes[take(&mut at, 4)?], 0);
        let key = &bytes[take(&mut at, len as usize)?];
        let offset = le_u64(&bytes[take(&mut at, 8)?], 0);
        let block_len = le_u32(&bytes[take(&mut at, 4)?], 0);
        let digest = le_u64(&bytes[take(&mut at, 8)?], 0);
        let block_end = offset.checked_add(u64::from(block_len));
        if offset < prev_end || block_end.is_none_or(|e| e > data_end) || block_len == 0 {
            return Err(format!("block {b} lies outside the data"));
        }
        prev_end = offset + u64::from(block_len);
        let key_start = u32::try_from(keys.len()).map_err(|_| "an index over 4 GiB of keys")?;
        index.push(BlockEntry {
            key_start,
            key_len: len,
            offset,
            len: block_len,
            digest,
        });
        keys.extend_from_slice(key);
    }
    let len = le_u32(&bytes[take(&mut at, 4)?], 0);
    let last = bytes[take(&mut at, len as usize)?].to_vec();
    if at != bytes.len() {
        return Err("bytes after the index".to_string());
    }
    Ok((keys, index, last))
}

/// Reads a run's entries in order from a starting key, block by block, up to an end bound.
pub(crate) struct RunCursor<'r> {
    run: &'r Run,
    block: usize,
    buf: Vec<u8>,
    at: usize,
    /// Where the current block's entries end.
    data_end: usize,
    end: Option<&'r [u8]>,
    key: (usize, usize),
    value: Option<(usize, usize)>,
    valid: bool,
}

impl<'r> RunCursor<'r> {
    /// A cursor on the first entry at or after `from` and before `end` (exclusive).
    pub(crate) fn seek(
        run: &'r Run,
        from: &[u8],
        end: Option<&'r [u8]>,
    ) -> Result<RunCursor<'r>, StateError> {
        let mut c = RunCursor {
            run,
            block: run.block_for(from).unwrap_or(0),
            buf: Vec::with_capacity(BLOCK_SIZE * 2),
            at: 0,
            data_end: 0,
            end,
            key: (0, 0),
            value: None,
            valid: false,
        };
        if run.index.is_empty() || from > run.last_key.as_slice() {
            return Ok(c);
        }
        c.data_end = run.read_block(c.block, &mut c.buf)?;
        c.at = restart_for(&c.buf, c.data_end, from).map_err(|e| damaged(&run.path, e))?;
        loop {
            c.advance()?;
            if !c.valid || c.key() >= from {
                break;
            }
        }
        Ok(c)
    }

    /// Whether the cursor is on an entry.
    pub(crate) fn valid(&self) -> bool {
        self.valid
    }

    /// The current key.
    pub(crate) fn key(&self) -> &[u8] {
        &self.buf[self.key.0..self.key.1]
    }

    /// The current value; `None` for a deletion.
    pub(crate) fn value(&self) -> Option<&[u8]> {
        self.value.map(|(a, b)| &self.buf[a..b])
    }

    /// Moves to the next entry the run answers for (inside its clip).
    pub(crate) fn advance(&mut self) -> Result<(), StateError> {
        loop {
            self.step()?;
            if !self.valid || self.run.covers(key_group_of(self.key())) {
                return Ok(());
            }
        }
    }

    /// Moves to the next entry of the file.
    fn step(&mut self) -> Result<(), StateError> {
        if self.at >= self.data_end {
            self.block += 1;
            if self.block >= self.run.index.len() {
                self.valid = false;
                return Ok(());
            }
            self.data_end = self.run.read_block(self.block, &mut self.buf)?;
            self.at = 0;
        }
        let (k, v) = next_entry(&self.buf[..self.data_end], &mut self.at)
            .map_err(|e| damaged(&self.run.path, e))?;
        let base = self.buf.as_ptr() as usize;
        let ks = k.as_ptr() as usize - base;
        self.key = (ks, ks + k.len());
        self.value = v.map(|v| {
            let vs = v.as_ptr() as usize - base;
            (vs, vs + v.len())
        });
        self.valid = match self.end {
            Some(end) => self.key() < end,
            None => true,
        };
        Ok(())
    }
}
