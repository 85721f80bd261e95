//! Native snapshots of a store backend (Flink's native incremental checkpoints): the store's
//! own immutable files, shipped as they are, and a manifest with the states' metadata; and
//! their restore, which hands the files back to the store and reserves each state's number
//! until it is registered with its types.
//!
//! A manifest (version 1, integers little-endian):
//!
//! ```text
//! "WNKM" | version u16 | header length u32 | the keyed snapshot header (the canonical
//! format's, listing every state with the number its entries are stored under)
//! | files length u32 | postcard(NativeFiles) | xxh3-64 of everything before
//! ```

use super::{ErasedCell, Registered, SnapshotFilter, StoreKeyedStateBackend, StoreStateId};
use crate::StateError;
use crate::format::{Compression, SnapshotHeader, StateKind, StateMeta};
use crate::keyed::{KeyedSnapshot, KeyedSnapshotLayout, NativeFiles, NativeRestorePart, StateKey};
use crate::restored::incompatible;
use crate::store::FrozenFiles;
use std::any::{Any, type_name};
use std::collections::BTreeMap;
use xxhash_rust::xxh3::xxh3_64;

/// Magic bytes of a native snapshot's manifest.
pub const NATIVE_MANIFEST_MAGIC: [u8; 4] = *b"WNKM";
/// The manifest version this build writes and reads.
const MANIFEST_VERSION: u16 = 1;
/// The largest manifest a reader accepts (a manifest lists files and states: kilobytes).
const MAX_MANIFEST_LEN: usize = 64 << 20;

/// The cell of a state restored from a native snapshot and not registered yet: its entries
/// are in the store under its number, written out raw by snapshots until it is registered.
pub(super) struct Reserved;

impl ErasedCell for Reserved {
    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }

    fn flush(
        &mut self,
        _store: &mut dyn super::KeyedStore,
        _id: StoreStateId,
    ) -> Result<(), StateError> {
        Ok(())
    }

    fn forget(&mut self) {}

    fn snapshot_filter(&self, _now_ms: i64) -> Option<SnapshotFilter> {
        None
    }
}

/// Checks the registration of a reserved state against what its snapshot recorded.
pub(super) fn check_reserved(
    name: &str,
    reserved: &Registered,
    kind: StateKind,
    value_type: &str,
) -> Result<(), StateError> {
    if reserved.kind != kind || reserved.value_type != value_type {
        return Err(incompatible(
            name,
            format!(
                "it was snapshotted as a {} state of `{}`, and is now registered as a {kind} \
                 state of `{value_type}`",
                reserved.kind, reserved.value_type
            ),
        ));
    }
    Ok(())
}

impl<K: StateKey> StoreKeyedStateBackend<K> {
    /// This backend, with checkpoints (`snapshot_incremental`) taken as native snapshots when
    /// its store has them: the runtime then ships the store's files, each once.
    pub fn with_native_snapshots(mut self, native: bool) -> Self {
        self.native = native;
        self
    }

    /// The header that lists every state by the number its entries are stored under.
    fn native_header(&self) -> SnapshotHeader {
        let key_type = type_name::<K>();
        let states = (0i16..)
            .zip(&self.states)
            .map(|(id, s)| StateMeta {
                id,
                name: s.name.clone(),
                kind: s.kind,
                key_type: key_type.to_string(),
                value_type: s.value_type.to_string(),
                serializer_version: crate::format::SERIALIZER_VERSION,
            })
            .collect();
        let header = SnapshotHeader {
            flags: 0,
            compression: Compression::None,
            overlays: false,
            delta: false,
            key_group_range: self.range,
            max_parallelism: self.max_parallelism,
            states,
        };
        SnapshotHeader {
            flags: header.expected_flags(),
            ..header
        }
    }

    /// A native snapshot, if native snapshots are on and the store has them. Restored states
    /// still waiting as canonical bytes are not in the store, so they make it a full canonical
    /// snapshot instead (`None`).
    pub(super) fn snapshot_native(&mut self) -> Result<Option<Box<dyn KeyedSnapshot>>, StateError> {
        if !self.native || !self.restored.pending.is_empty() {
            return Ok(None);
        }
        self.flush_all()?;
        let Some(frozen) = self.store.freeze_files()? else {
            return Ok(None);
        };
        Ok(Some(Box::new(NativeSnapshot {
            header: self.native_header(),
            frozen,
            files: None,
        })))
    }

    /// [`KeyedStateBackend::restore_native`](crate::KeyedStateBackend::restore_native): checks
    /// each manifest against this backend and the files handed with it, gives the files to the
    /// store, and reserves each state's number.
    pub(super) fn restore_from_files(
        &mut self,
        parts: &[NativeRestorePart<'_>],
    ) -> Result<(), StateError> {
        if !self.states.is_empty() || !self.restored.pending.is_empty() {
            return Err(StateError::Restore(format!(
                "restore must come before any state is registered or restored, and {:?} are",
                self.state_names()
            )));
        }
        let key_type = type_name::<K>();
        let mut states: BTreeMap<i16, StateMeta> = BTreeMap::new();
        for part in parts {
            let (header, files) = decode_manifest(part.manifest)?;
            if header.max_parallelism != self.max_parallelism {
                return Err(StateError::Restore(format!(
                    "a native snapshot of max parallelism {}, restored with {}",
                    header.max_parallelism, self.max_parallelism
                )));
            }
            let names =
                |f: &NativeFiles| f.files.iter().map(|f| f.name.clone()).collect::<Vec<_>>();
            if files.format != part.files.format || names(&files) != names(part.files) {
                return Err(StateError::Restore(format!(
                    "the files handed with a native snapshot ({:?}) are not those its manifest \
                     lists ({:?})",
                    names(part.files),
                    names(&files)
                )));
            }
            for meta in header.states {
                if meta.serializer_version != crate::format::SERIALIZER_VERSION {
                    return Err(incompatible(
                        &meta.name,
                        format!(
                            "serializer version {}, this build reads {}",
                            meta.serializer_version,
                            crate::format::SERIALIZER_VERSION
                        ),
                    ));
                }
                if meta.key_type != key_type {
                    return Err(incompatible(
                        &meta.name,
                        format!(
                            "the snapshot's keys are of type `{}`, this backend's are `{key_type}`",
                            meta.key_type
                        ),
                    ));
                }
                match states.get(&meta.id) {
                    Some(seen)
                        if seen.name != meta.name
                            || seen.kind != meta.kind
                            || seen.value_type != meta.value_type =>
                    {
                        return Err(StateError::Restore(format!(
                            "the native snapshots of two subtasks store different states under \
                             number {} ('{}' and '{}'): restore from a savepoint instead",
                            meta.id, seen.name, meta.name
                        )));
                    }
                    Some(_) => {}
                    None => {
                        states.insert(meta.id, meta);
                    }
                }
            }
        }
        let snapshots: Vec<&NativeFiles> = parts.iter().map(|p| p.files).collect();
        self.store.restore_files(&snapshots, self.range)?;
        for (expected, (id, meta)) in (0i16..).zip(states) {
            if id != expected {
                return Err(StateError::Restore(format!(
                    "the native snapshots number their states with a gap before {id} ('{}')",
                    meta.name
                )));
            }
            self.by_name.insert(meta.name.clone(), id as StoreStateId);
            self.states.push(Registered {
                name: meta.name,
                kind: meta.kind,
                value_type: meta.value_type.into(),
                cell: Box::new(Reserved),
            });
        }
        Ok(())
    }
}

/// A native snapshot after its synchronous part.
struct NativeSnapshot {
    header: SnapshotHeader,
    frozen: Box<dyn FrozenFiles>,
    files: Option<NativeFiles>,
}

impl KeyedSnapshot for NativeSnapshot {
    fn native_files(&mut self) -> Result<Option<NativeFiles>, StateError> {
        let files = self.frozen.files()?;
        self.files = Some(files.clone());
        Ok(Some(files))
    }

    /// Writes the manifest (the files are listed first by
    /// [`native_files`](KeyedSnapshot::native_files), which this calls if nobody did).
    fn write_to(
        mut self: Box<Self>,
        out: &mut dyn std::io::Write,
    ) -> Result<KeyedSnapshotLayout, StateError> {
        let files = match self.files.take() {
            Some(f) => f,
            None => self.frozen.files()?,
        };
        let manifest = encode_manifest(&self.header, &files)?;
        out.write_all(&manifest)?;
        let end = manifest.len() as u64;
        Ok(KeyedSnapshotLayout {
            key_group_range: self.header.key_group_range,
            header: (0, end),
            offsets: vec![end; self.header.key_group_range.len() as usize],
            end,
        })
    }
}

fn manifest_corrupt(what: impl std::fmt::Display) -> StateError {
    StateError::Restore(format!("a native snapshot's manifest is damaged: {what}"))
}

/// A manifest's bytes.
pub(crate) fn encode_manifest(
    header: &SnapshotHeader,
    files: &NativeFiles,
) -> Result<Vec<u8>, StateError> {
    let header = header.encode()?;
    let files = postcard::to_allocvec(files).map_err(manifest_corrupt)?;
    let mut out = Vec::with_capacity(header.len() + files.len() + 22);
    out.extend_from_slice(&NATIVE_MANIFEST_MAGIC);
    out.extend_from_slice(&MANIFEST_VERSION.to_le_bytes());
    out.extend_from_slice(&(header.len() as u32).to_le_bytes());
    out.extend_from_slice(&header);
    out.extend_from_slice(&(files.len() as u32).to_le_bytes());
    out.extend_from_slice(&files);
    let digest = xxh3_64(&out);
    out.extend_from_slice(&digest.to_le_bytes());
    Ok(out)
}

/// Opens and checks a manifest.
pub(crate) fn decode_manifest(bytes: &[u8]) -> Result<(SnapshotHeader, NativeFiles), StateError> {
    if bytes.len() > MAX_MANIFEST_LEN {
        return Err(manifest_corrupt(format!("{} bytes", bytes.len())));
    }
    let Some((body, digest)) = bytes.split_last_chunk::<8>() else {
        return Err(manifest_corrupt("truncated"));
    };
    if body.get(..4) != Some(&NATIVE_MANIFEST_MAGIC[..]) {
        return Err(manifest_corrupt("no manifest magic"));
    }
    if xxh3_64(body) != u64::from_le_bytes(*digest) {
        return Err(manifest_corrupt("it fails its digest"));
    }
    let Some(&[lo, hi]) = body.get(4..6) else {
        return Err(manifest_corrupt("truncated"));
    };
    let version = u16::from_le_bytes([lo, hi]);
    if version != MANIFEST_VERSION {
        return Err(manifest_corrupt(format!(
            "version {version}, this build reads {MANIFEST_VERSION}"
        )));
    }
    let mut at = 6usize;
    let mut take = |n: usize| -> Result<&[u8], StateError> {
        let end = at.checked_add(n).filter(|&e| e <= body.len());
        let end = end.ok_or_else(|| manifest_corrupt("truncated"))?;
        let slice = &body[at..end];
        at = end;
        Ok(slice)
    };
    let len = u32::from_le_bytes(take(4)?.try_into().expect("4 bytes")) as usize;
    let header = SnapshotHeader::decode(take(len)?)?;
    let len = u32::from_le_bytes(take(4)?.try_into().expect("4 bytes")) as usize;
    let files: NativeFiles = postcard::from_bytes(take(len)?).map_err(manifest_corrupt)?;
    if at != body.len() {
        return Err(manifest_corrupt("bytes after its files"));
    }
    Ok((header, files))
}
