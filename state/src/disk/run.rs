//! The on-disk backend's sorted runs: immutable files of entries sorted by key, written once by
//! a flush or a compaction and read by point lookups and range cursors, every block checked by
//! its digest.
//!
//! A run file (format version 2, integers little-endian):
//!
//! ```text
//! header  "WRUN" | version u16 | identity length u32 | postcard RunIdentity
//! data    blocks, and after every PARTITION_BLOCKS blocks (and the last) their partition:
//! block   entries: key length (LEB128) | tag (LEB128: 0 = deleted, n + 1 = value of n bytes)
//!         | key | value; a block ends after the entry that passes BLOCK_SIZE, then the offset
//!         (u32) of every RESTART_INTERVAL-th entry from the first, then their number (u32): a
//!         lookup searches the restarts by binary search and walks at most that many entries
//! partition  per block: key length u32 | first key | offset u64 | length u32 | xxh3-64 of the
//!         block; then filter length u32 | filter (probes u32 | bits of the partition's keys),
//!         length 0 without a filter
//! top     per partition: key length u32 | first key | offset u64 | length u32 | blocks u32 |
//!         xxh3-64 of the partition; then the last key: length u32 | key
//! footer  top offset u64 | top end u64 | entries u64 | deleted u64 | blocks u64
//!         | xxh3-64 of header, top and the footer's five numbers u64 | version u16
//!         | "WRNE" | 2 zero bytes
//! ```
//!
//! Opening a run reads the header, top-level index and footer and checks their digest and the
//! identity; a partition is checked when first loaded, each block when it is read. A damaged or
//! foreign file is an error that names it. Version 1 (one index of every block, then one
//! filter, where version 2 has the top-level index) is still read: its index and filter are
//! one partition, loaded at the open.

use super::index::{self, Index, IndexWriter, Partition};
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
/// The run format version this build writes (it reads this and 1).
pub(crate) const RUN_VERSION: u16 = 2;
/// The first run format: one index and one filter for the whole run.
const RUN_VERSION_WHOLE_INDEX: u16 = 1;
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
    index: Index,
    last_key: Vec<u8>,
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

/// Checks a run file as an open does (its end, footer and top-level index digest and its
/// identity against `name`) and that it has `size` bytes, without keeping it: how a restore
/// decides whether a local copy can stand in for a download, at a cost that does not grow with
/// the run. Index partitions and data blocks are checked when read, as always.
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
    index: IndexWriter,
    last_key: Vec<u8>,
    entries: u64,
    deleted: u64,
    blocks: u64,
}

impl RunWriter {
    /// Starts run `identity` at `path`, with filters of `bits_per_key` bits per key (0: none).
    pub(crate) fn create(
        path: &Path,
        identity: &RunIdentity,
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
            index: IndexWriter::new(bits_per_key),
            last_key: Vec::new(),
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
        self.index.add_key(key);
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
        let len = u32::try_from(self.block.len())
            .map_err(|_| damaged(&self.path, "a block over 4 GiB"))?;
        let full = self
            .index
            .add_block(&self.block_first, self.written, len, digest);
        self.out
            .write_all(&self.block)
            .map_err(|e| io(&self.path, e))?;
        self.written += self.block.len() as u64;
        self.blocks += 1;
        self.block.clear();
        if full {
            self.write_partition()?;
        }
        Ok(())
    }

    /// Writes the open index partition, if it has blocks.
    fn write_partition(&mut self) -> Result<(), StateError> {
        if let Some(bytes) = self.index.finish_partition(self.written) {
            self.out.write_all(&bytes).map_err(|e| io(&self.path, e))?;
            self.written += bytes.len() as u64;
        }
        Ok(())
    }

    /// The last key added (empty before the first).
    pub(crate) fn last_key(&self) -> &[u8] {
        &self.last_key
    }

    /// Entries added so far.
    pub(crate) fn entries(&self) -> u64 {
        self.entries
    }

    /// Writes the last partition, the top-level index and the footer, syncs nothing (the file
    /// is a working file of this process), and returns the path.
    pub(crate) fn finish(mut self) -> Result<PathBuf, StateError> {
        self.finish_block()?;
        self.write_partition()?;
        let mut top = std::mem::take(&mut self.index.top);
        top.extend_from_slice(&(self.last_key.len() as u32).to_le_bytes());
        top.extend_from_slice(&self.last_key);
        let top_offset = self.written;
        let top_end = top_offset + top.len() as u64;
        let mut footer = Vec::with_capacity(FOOTER_LEN as usize);
        for n in [top_offset, top_end, self.entries, self.deleted, self.blocks] {
            footer.extend_from_slice(&n.to_le_bytes());
        }
        let mut digest = Xxh3::new();
        digest.update(&self.header);
        digest.update(&top);
        digest.update(&footer);
        footer.extend_from_slice(&digest.digest().to_le_bytes());
        footer.extend_from_slice(&RUN_VERSION.to_le_bytes());
        footer.extend_from_slice(&RUN_END_MAGIC);
        footer.extend_from_slice(&[0, 0]);
        debug_assert_eq!(footer.len() as u64, FOOTER_LEN);
        let path = self.path.clone();
        let mut out = self.out;
        for part in [&top, &footer] {
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
        if footer[54..56] != [0, 0] {
            return Err(damaged(path, "the footer's last two bytes are not zero"));
        }
        let version = u16::from_le_bytes([footer[48], footer[49]]);
        if version != RUN_VERSION && version != RUN_VERSION_WHOLE_INDEX {
            return Err(damaged(
                path,
                format!(
                    "format version {version}, this build reads {RUN_VERSION_WHOLE_INDEX} and \
                     {RUN_VERSION}"
                ),
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
        let data = (header.len() as u64, index_offset);
        let (index, last_key) = if version == RUN_VERSION_WHOLE_INDEX {
            let (index_bytes, bloom_bytes) = meta.split_at((bloom_offset - index_offset) as usize);
            index::parse_whole(index_bytes, bloom_bytes, blocks, data)
        } else if bloom_offset != meta_end {
            Err("bytes between the top-level index and the footer".to_string())
        } else {
            Index::parse_top(&meta, blocks, data)
        }
        .map_err(|e| damaged(path, e))?;
        Ok(Run {
            id: expected.run_id,
            identity,
            clip,
            path: path.to_path_buf(),
            file,
            index,
            last_key,
            entries,
            deleted,
            bytes: len,
            obsolete: AtomicBool::new(false),
            _dir: dir,
        })
    }

    /// Its index partitions (1 for a format-1 run).
    #[cfg(test)]
    pub(crate) fn partitions(&self) -> usize {
        self.index.partitions()
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

    /// Index partition `p`, loaded and checked the first time. A partition that fails its
    /// check empties the file, as a damaged block does.
    fn partition(&self, p: usize) -> Result<&Arc<Partition>, StateError> {
        let mut failed_read = None;
        let part = self.index.partition(p, |offset, len| {
            let mut buf = vec![0u8; len];
            self.file.read_exact_at(&mut buf, offset).map_err(|e| {
                let text = e.to_string();
                failed_read = Some(e);
                text
            })?;
            Ok(buf)
        });
        match part {
            Ok(part) => Ok(part),
            Err(_) if failed_read.is_some() => {
                Err(io(&self.path, failed_read.expect("checked above")))
            }
            Err(e) => {
                quarantine(&self.path);
                Err(damaged(&self.path, e))
            }
        }
    }

    /// Reads block `b` of partition `part` into `buf`, checking its digest; returns where its
    /// entries end.
    fn read_block(
        &self,
        part: &Partition,
        b: usize,
        buf: &mut Vec<u8>,
    ) -> Result<usize, StateError> {
        let e = part.block(b);
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
        if key > self.last_key.as_slice() || self.index.blocks() == 0 {
            return Ok(None);
        }
        let part = self.partition(self.index.partition_for(key))?;
        if !part.may_contain(hash) {
            return Ok(None);
        }
        let Some(b) = part.block_for(key) else {
            return Ok(None);
        };
        let end = self.read_block(part, b, block)?;
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

/// Reads a run's entries in order from a starting key, block by block, up to an end bound.
pub(crate) struct RunCursor<'r> {
    run: &'r Run,
    /// The partition it reads, and its number.
    part: Arc<Partition>,
    part_no: usize,
    /// The block within the partition.
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
        let empty = run.index.blocks() == 0 || from > run.last_key.as_slice();
        let part_no = run.index.partition_for(from);
        let part = if empty {
            Arc::default()
        } else {
            Arc::clone(run.partition(part_no)?)
        };
        let mut c = RunCursor {
            run,
            block: part.block_for(from).unwrap_or(0),
            part,
            part_no,
            buf: Vec::with_capacity(BLOCK_SIZE * 2),
            at: 0,
            data_end: 0,
            end,
            key: (0, 0),
            value: None,
            valid: false,
        };
        if empty {
            return Ok(c);
        }
        c.data_end = run.read_block(&c.part, c.block, &mut c.buf)?;
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
            if self.block >= self.part.len() {
                self.part_no += 1;
                if self.part_no >= self.run.index.partitions() {
                    self.valid = false;
                    return Ok(());
                }
                self.part = Arc::clone(self.run.partition(self.part_no)?);
                self.block = 0;
            }
            self.data_end = self.run.read_block(&self.part, self.block, &mut self.buf)?;
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
