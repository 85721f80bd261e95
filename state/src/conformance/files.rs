//! A restore handed its sections in local files ([`KeyedStateBackend::restore_file_parts`]):
//! the same state as from memory, whatever the backend keeps of the files, and damage named.

use super::SuiteKey;
use super::helpers::{Cx, Subject, Written, finish, fresh, keys, part_for};
use crate::StateError;
use crate::format::Compression;
use crate::heap::HeapKeyedStateBackend;
use crate::keyed::{KeyedStateBackend, RestoreFilePart, ValueStateDescriptor};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use weir_core::CoreError;
use weir_core::keygroup::{KeyGroupRange, assign_to_key_group};

/// Restoring from files gives what restoring the same parts from memory gives: checked for a
/// full snapshot and an incremental chain (overlays and tombstones), uncompressed and
/// compressed, for the whole range and for a rescaled part of it, with the files unlinked
/// right after the restore:
/// - a snapshot taken before any state is registered is byte for byte the memory restore's
///   (the restored blocks written back);
/// - every state, registered after that, holds the chain's values;
/// - a flipped byte in a section is an error naming its key group, at the restore or at the
///   registration; a file shorter than its sections, or missing, is an error at the restore.
///
/// A file changed after the restore may fail the registration, never give other values.
pub fn check_restore_from_files<K: SuiteKey, B: KeyedStateBackend<K>>(
    make: impl Fn(u32, KeyGroupRange) -> B,
) {
    let cx = Cx::new::<B>("restore from files");
    let dir = TempDir::new(&cx);
    let max_p = 16;
    for compression in [Compression::None, Compression::Lz4] {
        let (chain, counts, names) = source_chain::<K>(&cx, max_p, compression);
        for range in [KeyGroupRange::new(0, max_p - 1), KeyGroupRange::new(5, 12)] {
            let what = format!("{compression}, key groups {range}");
            let links: Vec<&Written> = chain.iter().collect();
            let files = dir.write_parts(&cx, &links, &range, true);

            // Before any registration: the same bytes as a restore from memory.
            let mut from_memory = fresh(&cx, &make, max_p, range);
            let parts: Vec<_> = links.iter().map(|w| part_for(&cx, w, &range)).collect();
            cx.ok("restoring from memory", from_memory.b.restore(&parts));
            let mut from_files = fresh(&cx, &make, max_p, range);
            cx.ok(
                &format!("restoring from files ({what})"),
                from_files.b.restore_file_parts(&files.parts(&links)),
            );
            files.remove();
            let (got, expected) = (from_files.write().bytes, from_memory.write().bytes);
            if got != expected {
                let at = got
                    .iter()
                    .zip(&expected)
                    .take_while(|(a, b)| a == b)
                    .count();
                cx.fail(format!(
                    "{what}: a snapshot before any registration has the memory restore's bytes: \
                     {} bytes against {}, first different at byte {at}",
                    got.len(),
                    expected.len()
                ));
            }

            // Then registered: the chain's values, key group by key group.
            let files = dir.write_parts(&cx, &links, &range, compression == Compression::None);
            let mut r = fresh(&cx, &make, max_p, range);
            cx.ok(
                "restoring from files",
                r.b.restore_file_parts(&files.parts(&links)),
            );
            files.remove();
            let expected: HashMap<K, u64> = counts
                .iter()
                .filter(|(k, _)| range.contains(assign_to_key_group(*k, max_p)))
                .map(|(k, v)| (k.clone(), *v))
                .collect();
            let count = r.register::<u64>("count");
            let all: Vec<K> = keys::<K>(KEYS)
                .into_iter()
                .filter(|k| range.contains(assign_to_key_group(k, max_p)))
                .collect();
            r.read_back(
                &format!("{what}: 'count' after the restore"),
                count,
                &expected,
                &all,
            );
            let expected_names: HashMap<K, String> = names
                .iter()
                .filter(|(k, _)| range.contains(assign_to_key_group(*k, max_p)))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            let name = r.register::<String>("name");
            r.read_back(
                &format!("{what}: 'name' after the restore"),
                name,
                &expected_names,
                &all,
            );
        }
        check_damage(&cx, &make, &dir, &chain, compression);
    }
}

const KEYS: u64 = 300;

/// A full snapshot and a delta on it (values changed, keys removed), from the heap backend in
/// incremental mode, and what the chain holds.
#[allow(clippy::type_complexity)]
fn source_chain<K: SuiteKey>(
    cx: &Cx,
    max_p: u32,
    compression: Compression,
) -> (Vec<Written>, HashMap<K, u64>, HashMap<K, String>) {
    let range = KeyGroupRange::new(0, max_p - 1);
    let heap = HeapKeyedStateBackend::<K>::new(max_p, range)
        .with_incremental(4)
        .with_compression(compression);
    let mut h = Subject {
        b: heap,
        cx,
        _key: std::marker::PhantomData,
    };
    let count = h.register::<u64>("count");
    let name = h.register::<String>("name");
    let (mut counts, mut names) = (HashMap::new(), HashMap::new());
    for (i, k) in keys::<K>(KEYS).into_iter().enumerate() {
        h.put(count, &k, i as u64);
        counts.insert(k.clone(), i as u64);
        if i % 3 == 0 {
            let n = format!("name {i} {}", "x".repeat(i % 50));
            h.put(name, &k, n.clone());
            names.insert(k, n);
        }
    }
    let full = h.b.snapshot_incremental(1);
    let full = finish::<K>(cx, cx.ok("snapshot_incremental(1)", full), max_p, range);
    h.b.notify_checkpoint_complete(1);
    for (i, k) in keys::<K>(KEYS).into_iter().enumerate() {
        match i % 7 {
            0 => {
                h.clear(count, &k);
                counts.remove(&k);
            }
            1 => {
                h.put(count, &k, 1000 + i as u64);
                counts.insert(k.clone(), 1000 + i as u64);
            }
            _ => {}
        }
    }
    let delta = h.b.snapshot_incremental(2);
    let delta = finish::<K>(cx, cx.ok("snapshot_incremental(2)", delta), max_p, range);
    (vec![full, delta], counts, names)
}

/// Damaged, short and missing files.
fn check_damage<K: SuiteKey, B: KeyedStateBackend<K>>(
    cx: &Cx,
    make: &impl Fn(u32, KeyGroupRange) -> B,
    dir: &TempDir,
    chain: &[Written],
    compression: Compression,
) {
    let max_p = 16;
    let range = KeyGroupRange::new(0, max_p - 1);
    let full = &chain[0];
    let links = [full];
    // A byte in the middle of each key group's section, flipped before the restore: an error
    // naming the key group, at the restore or at the registration.
    for (i, &offset) in full.handle.offsets.iter().enumerate() {
        let end = full
            .handle
            .offsets
            .get(i + 1)
            .copied()
            .unwrap_or(full.handle.end);
        let files = dir.write_parts(cx, &links, &range, false);
        let at = (offset + end) / 2;
        files.flip(0, at);
        let op = format!(
            "{compression}: restoring with byte {at} of the snapshot flipped, and registering"
        );
        let mut r = fresh(cx, make, max_p, range);
        let e = cx.err(&op, || {
            r.b.restore_file_parts(&files.parts(&links))?;
            r.b.value_state(&ValueStateDescriptor::<u64>::new("count"))?;
            r.b.value_state(&ValueStateDescriptor::<String>::new("name"))
                .map(|_| ())
        });
        let kg = format!("key group {}", range.start + i as u32);
        match &e {
            StateError::Core(CoreError::Corrupt { what, .. }) if what.contains(&kg) => {}
            other => cx.fail(format!(
                "{op}: expected CoreError::Corrupt naming {kg}, got {other:?}"
            )),
        }
        files.remove();
    }
    // Flipped after the restore, every 5th byte of the largest section in turn: registering
    // both states fails, or reads what a restore from memory reads.
    let mut expected = fresh(cx, make, max_p, range);
    let parts: Vec<_> = links.iter().map(|w| part_for(cx, w, &range)).collect();
    cx.ok("restoring from memory", expected.b.restore(&parts));
    let (c, n) = (
        expected.register::<u64>("count"),
        expected.register::<String>("name"),
    );
    let all = keys::<K>(KEYS);
    let sections: Vec<(u64, u64)> = (0..full.handle.offsets.len())
        .map(|i| {
            let start = full.handle.offsets[i];
            let end = full.handle.offsets.get(i + 1).copied();
            (start, end.unwrap_or(full.handle.end))
        })
        .collect();
    let Some(&(start, end)) = sections.iter().max_by_key(|(s, e)| e - s) else {
        cx.fail("the snapshot has no section");
    };
    for at in (start..end).step_by(5) {
        let files = dir.write_parts(cx, &links, &range, false);
        let mut r = fresh(cx, make, max_p, range);
        cx.ok(
            "restoring from files",
            r.b.restore_file_parts(&files.parts(&links)),
        );
        files.flip(0, at);
        let registered = cx.no_panic("registering after the file changed", || {
            let count =
                r.b.value_state(&ValueStateDescriptor::<u64>::new("count"))?;
            let name =
                r.b.value_state(&ValueStateDescriptor::<String>::new("name"))?;
            Ok::<_, StateError>((count, name))
        });
        files.remove();
        let Ok((count, name)) = registered else {
            continue;
        };
        let mut restored = Subject {
            b: r.b,
            cx,
            _key: std::marker::PhantomData,
        };
        for k in &all {
            let rule = format!(
                "{compression}: byte {at} of the snapshot changed after the restore: the \
                 registration fails or reads what a restore from memory reads"
            );
            cx.eq(&rule, &restored.get(count, k), &expected.get(c, k));
            cx.eq(&rule, &restored.get(name, k), &expected.get(n, k));
        }
    }
    // Shorter than its sections, or missing.
    let files = dir.write_parts(cx, &links, &range, false);
    files.truncate(0, 10);
    let op = format!("{compression}: restoring from a file 10 bytes short");
    let mut r = fresh(cx, make, max_p, range);
    cx.err(&op, || r.b.restore_file_parts(&files.parts(&links)));
    files.remove();
    let mut r = fresh(cx, make, max_p, range);
    cx.err(
        &format!("{compression}: restoring from a missing file"),
        || r.b.restore_file_parts(&files.parts(&links)),
    );
}

/// A directory of the check's own, removed at the end.
struct TempDir(PathBuf);

impl TempDir {
    fn new(cx: &Cx) -> TempDir {
        use std::sync::atomic::{AtomicU64, Ordering};
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let dir =
            std::env::temp_dir().join(format!("weir-conformance-files-{}-{n}", std::process::id()));
        cx.ok(
            "creating a temporary directory",
            std::fs::create_dir_all(&dir),
        );
        TempDir(dir)
    }

    /// Writes, per snapshot, the bytes a subtask owning `range` downloads (the sections from
    /// the first it owns to the last): each to a file of its own, or all one after the other
    /// into one file (after a few bytes of something else) when `shared`.
    fn write_parts(
        &self,
        cx: &Cx,
        links: &[&Written],
        range: &KeyGroupRange,
        shared: bool,
    ) -> Files {
        use std::sync::atomic::{AtomicU64, Ordering};
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let mut files = Files::default();
        let mut contents: Vec<(PathBuf, Vec<u8>)> = Vec::new();
        for w in links {
            let Some((start, end)) = w.handle.byte_range_for(range) else {
                cx.fail(format!("no bytes of key groups {range} in the snapshot"));
            };
            if !shared || contents.is_empty() {
                let n = NEXT.fetch_add(1, Ordering::Relaxed);
                let prefix = if shared { vec![0xA5; 3] } else { Vec::new() };
                contents.push((self.0.join(format!("part-{n}")), prefix));
            }
            let Some((path, bytes)) = contents.last_mut() else {
                cx.fail("no file to write to");
            };
            files.parts.push(PartFile {
                path: path.clone(),
                at: bytes.len() as u64,
                len: end - start,
                sections_offset: start,
            });
            bytes.extend_from_slice(&w.bytes[start as usize..end as usize]);
        }
        for (path, bytes) in contents {
            cx.ok("writing a part", std::fs::write(&path, bytes));
        }
        files
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// One snapshot's part of a restore: where it is.
struct PartFile {
    path: PathBuf,
    at: u64,
    len: u64,
    sections_offset: u64,
}

/// The parts of one restore, one per snapshot.
#[derive(Default)]
struct Files {
    parts: Vec<PartFile>,
}

impl Files {
    fn parts<'a>(&'a self, links: &[&'a Written]) -> Vec<RestoreFilePart<'a>> {
        links
            .iter()
            .zip(&self.parts)
            .map(|(w, p)| RestoreFilePart {
                handle: &w.handle,
                header: &w.bytes[w.handle.header.0 as usize..w.handle.header.1 as usize],
                path: p.path.as_path(),
                at: p.at,
                len: p.len,
                sections_offset: p.sections_offset,
            })
            .collect()
    }

    /// The offset in its file of the byte at `at` of the stream of part `part`.
    fn file_offset(&self, part: usize, at: u64) -> u64 {
        let p = &self.parts[part];
        p.at + at - p.sections_offset
    }

    /// Flips the byte at `at` of part `part`'s stream.
    fn flip(&self, part: usize, at: u64) {
        let at = self.file_offset(part, at);
        edit(&self.parts[part].path, |bytes| {
            if let Some(b) = bytes.get_mut(at as usize) {
                *b ^= 0x10;
            }
        });
    }

    fn truncate(&self, part: usize, by: usize) {
        edit(&self.parts[part].path, |bytes| {
            bytes.truncate(bytes.len().saturating_sub(by))
        });
    }

    fn remove(&self) {
        for p in &self.parts {
            let _ = std::fs::remove_file(&p.path);
        }
    }
}

/// Rewrites `path` in place (the same inode, as a disk's damage would).
fn edit(path: &Path, change: impl FnOnce(&mut Vec<u8>)) {
    use std::io::{Seek, Write};
    let Ok(mut bytes) = std::fs::read(path) else {
        return;
    };
    change(&mut bytes);
    if let Ok(mut f) = std::fs::OpenOptions::new().write(true).open(path) {
        let _ = f.set_len(bytes.len() as u64);
        let _ = f.seek(std::io::SeekFrom::Start(0));
        let _ = f.write_all(&bytes);
    }
}
