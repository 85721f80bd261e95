//! The on-disk backend's memtable, and the merge of memtables and runs into one ordered view
//! where the newest entry of a key wins: what scans, snapshots and compactions read.

use super::run::{Run, RunCursor};
use crate::StateError;
use std::borrow::Cow;
use std::sync::OnceLock;
use xxhash_rust::xxh3::xxh3_64;

/// Bytes a memtable entry costs beyond its key and value (the entry, its slot in the table and
/// allocation overhead), for the size that decides when a memtable is flushed.
const ENTRY_OVERHEAD: usize = 64;

/// Where a memtable entry's key and value are in its arena; `value_len` `None` for a deletion.
#[derive(Clone, Copy)]
struct Slot {
    key_at: usize,
    key_len: usize,
    value_at: usize,
    value_len: Option<usize>,
}

/// Visits a merge's entries: a key and its value, `None` for a deletion.
pub(crate) type MergeVisitor<'a> = dyn FnMut(&[u8], Option<&[u8]>) -> Result<(), StateError> + 'a;

/// The writes not yet in a run: entries in arrival order behind a hash table for point access,
/// sorted only when a scan, a snapshot or the flush reads them in order. `None` is a deletion.
///
/// Keys and values live in one arena of bytes (a value rewritten with another length moves to
/// its end), not in an allocation each: a memtable is a few large blocks, allocated on the task
/// thread and freed whole on the flush thread, which leaves the allocator nothing to keep
/// (measured: per-entry allocations held a process of 23 MB of live heap at ~400 MB RSS).
#[derive(Default)]
pub(crate) struct Memtable {
    arena: Vec<u8>,
    entries: Vec<Slot>,
    table: hashbrown::HashTable<u32>,
    bytes: usize,
    /// Positions in key order, computed once the memtable no longer changes.
    sorted: OnceLock<Vec<u32>>,
    /// Once the flush thread wrote it: its run (`None` when it was empty).
    pub(crate) flushed: OnceLock<Option<std::sync::Arc<Run>>>,
}

impl std::fmt::Debug for Memtable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Memtable")
            .field("entries", &self.entries.len())
            .field("bytes", &self.bytes)
            .finish()
    }
}

impl Memtable {
    /// Approximate memory held.
    pub(crate) fn bytes(&self) -> usize {
        self.bytes
    }

    /// Number of entries, deletions included.
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether it holds nothing.
    pub(crate) fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    fn slot_key(&self, slot: &Slot) -> &[u8] {
        &self.arena[slot.key_at..slot.key_at + slot.key_len]
    }

    fn slot_value(&self, slot: &Slot) -> Option<&[u8]> {
        slot.value_len
            .map(|len| &self.arena[slot.value_at..slot.value_at + len])
    }

    fn find(&self, key: &[u8], hash: u64) -> Option<usize> {
        self.table
            .find(hash, |&i| self.slot_key(&self.entries[i as usize]) == key)
            .map(|&i| i as usize)
    }

    /// `Some(Some(v))` written, `Some(None)` deleted, `None` not here; `hash` is
    /// [`key_hash`](super::bloom::key_hash) of `key`.
    pub(crate) fn get(&self, key: &[u8], hash: u64) -> Option<Option<&[u8]>> {
        self.find(key, hash)
            .map(|i| self.slot_value(&self.entries[i]))
    }

    /// Appends `bytes` to the arena, returning where they start.
    fn append(&mut self, bytes: &[u8]) -> usize {
        let at = self.arena.len();
        self.arena.extend_from_slice(bytes);
        at
    }

    /// Writes `value` (`None`: deletes) for `key`, whose hash is `hash`.
    pub(crate) fn set(&mut self, key: &[u8], hash: u64, value: Option<&[u8]>) {
        debug_assert!(self.sorted.get().is_none(), "a sorted memtable is frozen");
        match self.find(key, hash) {
            Some(i) => {
                let slot = self.entries[i];
                match (slot.value_len, value) {
                    // The same length: in place (a counter's value mostly keeps its length).
                    (Some(len), Some(new)) if len == new.len() => {
                        self.arena[slot.value_at..slot.value_at + len].copy_from_slice(new);
                    }
                    (_, Some(new)) => {
                        let at = self.append(new);
                        self.entries[i].value_at = at;
                        self.entries[i].value_len = Some(new.len());
                        // The old bytes stay in the arena: counted, so the memtable still
                        // flushes at its size.
                        self.bytes += new.len();
                    }
                    (_, None) => self.entries[i].value_len = None,
                }
            }
            None => {
                self.bytes += key.len() + value.map_or(0, <[u8]>::len) + ENTRY_OVERHEAD;
                let i = self.entries.len() as u32;
                let key_at = self.append(key);
                let value_at = value.map_or(self.arena.len(), |v| self.append(v));
                self.entries.push(Slot {
                    key_at,
                    key_len: key.len(),
                    value_at,
                    value_len: value.map(<[u8]>::len),
                });
                let (entries, arena) = (&self.entries, &self.arena);
                self.table.insert_unique(hash, i, |&j| {
                    let s = &entries[j as usize];
                    xxh3_64(&arena[s.key_at..s.key_at + s.key_len])
                });
            }
        }
    }

    fn key(&self, i: u32) -> &[u8] {
        self.slot_key(&self.entries[i as usize])
    }

    /// The positions of every entry in key order, sorted once: only for a memtable that no
    /// longer changes (a full one).
    fn sorted(&self) -> &[u32] {
        self.sorted.get_or_init(|| {
            let mut order: Vec<u32> = (0..self.entries.len() as u32).collect();
            order.sort_unstable_by(|&a, &b| self.key(a).cmp(self.key(b)));
            order
        })
    }

    /// The entries in `[from, end)` in key order: from the sorted positions of a full
    /// memtable, or sorted now for the active one (`changing`).
    fn range<'a>(&'a self, from: &[u8], end: Option<&[u8]>, changing: bool) -> MemSource<'a> {
        let in_range = |k: &[u8]| k >= from && end.is_none_or(|e| k < e);
        let order: Cow<'a, [u32]> = if changing {
            let mut order: Vec<u32> = (0..self.entries.len() as u32)
                .filter(|&i| in_range(self.key(i)))
                .collect();
            order.sort_unstable_by(|&a, &b| self.key(a).cmp(self.key(b)));
            Cow::Owned(order)
        } else {
            let all = self.sorted();
            let lo = all.partition_point(|&i| self.key(i) < from);
            let hi = match end {
                Some(e) => all.partition_point(|&i| self.key(i) < e),
                None => all.len(),
            };
            Cow::Borrowed(&all[lo..hi.max(lo)])
        };
        MemSource {
            memtable: self,
            order,
            at: 0,
        }
    }
}

struct MemSource<'a> {
    memtable: &'a Memtable,
    order: Cow<'a, [u32]>,
    at: usize,
}

impl<'a> MemSource<'a> {
    /// The entry at the cursor: its key and value (`None`: a deletion).
    fn head(&self) -> Option<(&'a [u8], Option<&'a [u8]>)> {
        let memtable = self.memtable;
        self.order.get(self.at).map(|&i| {
            let slot = &memtable.entries[i as usize];
            (memtable.slot_key(slot), memtable.slot_value(slot))
        })
    }
}

/// One ordered input of a merge.
enum Source<'a> {
    Mem(MemSource<'a>),
    Run(RunCursor<'a>),
}

impl Source<'_> {
    fn key(&self) -> Option<&[u8]> {
        match self {
            Source::Mem(m) => m.head().map(|(k, _)| k),
            Source::Run(c) => c.valid().then(|| c.key()),
        }
    }

    fn value(&self) -> Option<&[u8]> {
        match self {
            Source::Mem(m) => m.head().and_then(|(_, v)| v),
            Source::Run(c) => c.value(),
        }
    }

    fn advance(&mut self) -> Result<(), StateError> {
        match self {
            Source::Mem(m) => {
                m.at += 1;
                Ok(())
            }
            Source::Run(c) => c.advance(),
        }
    }
}

/// What a merge reads: memtables and runs, newest first.
pub(crate) struct Layers<'a> {
    /// The active memtable, which still changes, if the merge reads it.
    pub active: Option<&'a Memtable>,
    /// Full memtables.
    pub memtables: Vec<&'a Memtable>,
    pub runs: &'a [std::sync::Arc<Run>],
}

/// Visits every key in `[from, end)` once, newest entry first wins, in ascending order; a
/// deletion is visited as `None` when `deletions` is set and skipped otherwise.
pub(crate) fn merge(
    layers: &Layers<'_>,
    from: &[u8],
    end: Option<&[u8]>,
    deletions: bool,
    visit: &mut MergeVisitor<'_>,
) -> Result<(), StateError> {
    let mut sources: Vec<Source<'_>> =
        Vec::with_capacity(1 + layers.memtables.len() + layers.runs.len());
    if let Some(m) = layers.active {
        sources.push(Source::Mem(m.range(from, end, true)));
    }
    for m in &layers.memtables {
        sources.push(Source::Mem(m.range(from, end, false)));
    }
    for r in layers.runs {
        sources.push(Source::Run(RunCursor::seek(r, from, end)?));
    }
    let mut last: Vec<u8> = Vec::new();
    loop {
        // The smallest key; on a tie the newest source (the lowest index) wins.
        let mut winner: Option<usize> = None;
        for (i, s) in sources.iter().enumerate() {
            if let Some(k) = s.key()
                && winner.is_none_or(|w| k < sources[w].key().expect("a winner has a key"))
            {
                winner = Some(i);
            }
        }
        let Some(w) = winner else {
            return Ok(());
        };
        let value = sources[w].value();
        if value.is_some() || deletions {
            visit(sources[w].key().expect("a winner has a key"), value)?;
        }
        last.clear();
        last.extend_from_slice(sources[w].key().expect("a winner has a key"));
        for s in &mut sources {
            if s.key() == Some(last.as_slice()) {
                s.advance()?;
            }
        }
    }
}
