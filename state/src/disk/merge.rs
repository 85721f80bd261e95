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

/// A memtable entry: the key and its value, `None` for a deletion.
type MemEntry = (Box<[u8]>, Option<Vec<u8>>);

/// Visits a merge's entries: a key and its value, `None` for a deletion.
pub(crate) type MergeVisitor<'a> = dyn FnMut(&[u8], Option<&[u8]>) -> Result<(), StateError> + 'a;

/// The writes not yet in a run: entries in arrival order behind a hash table for point access,
/// sorted only when a scan, a snapshot or the flush reads them in order. `None` is a deletion.
#[derive(Default)]
pub(crate) struct Memtable {
    entries: Vec<MemEntry>,
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

    fn find(&self, key: &[u8], hash: u64) -> Option<usize> {
        self.table
            .find(hash, |&i| &*self.entries[i as usize].0 == key)
            .map(|&i| i as usize)
    }

    /// `Some(Some(v))` written, `Some(None)` deleted, `None` not here; `hash` is
    /// [`key_hash`](super::bloom::key_hash) of `key`.
    pub(crate) fn get(&self, key: &[u8], hash: u64) -> Option<Option<&[u8]>> {
        self.find(key, hash).map(|i| self.entries[i].1.as_deref())
    }

    /// Writes `value` (`None`: deletes) for `key`, whose hash is `hash`.
    pub(crate) fn set(&mut self, key: &[u8], hash: u64, value: Option<&[u8]>) {
        debug_assert!(self.sorted.get().is_none(), "a sorted memtable is frozen");
        match self.find(key, hash) {
            Some(i) => {
                let slot = &mut self.entries[i].1;
                let old = slot.as_ref().map_or(0, Vec::len);
                match (slot.as_mut(), value) {
                    (Some(v), Some(new)) => {
                        v.clear();
                        v.extend_from_slice(new);
                    }
                    (_, new) => *slot = new.map(<[u8]>::to_vec),
                }
                self.bytes = self.bytes - old + value.map_or(0, <[u8]>::len);
            }
            None => {
                self.bytes += key.len() + value.map_or(0, <[u8]>::len) + ENTRY_OVERHEAD;
                let i = self.entries.len() as u32;
                self.entries.push((key.into(), value.map(<[u8]>::to_vec)));
                let entries = &self.entries;
                self.table
                    .insert_unique(hash, i, |&j| xxh3_64(&entries[j as usize].0));
            }
        }
    }

    fn key(&self, i: u32) -> &[u8] {
        &self.entries[i as usize].0
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
    fn head(&self) -> Option<&'a MemEntry> {
        let memtable = self.memtable;
        self.order
            .get(self.at)
            .map(|&i| &memtable.entries[i as usize])
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
            Source::Mem(m) => m.head().map(|(k, _)| &**k),
            Source::Run(c) => c.valid().then(|| c.key()),
        }
    }

    fn value(&self) -> Option<&[u8]> {
        match self {
            Source::Mem(m) => m.head().and_then(|(_, v)| v.as_deref()),
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
