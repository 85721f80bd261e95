//! [`StoreSnapshot`], the canonical snapshot of a store backend: its frozen store written as
//! the keyed snapshot format.

use super::{FrozenStore, SnapshotFilter, StoreStateId};
use crate::StateError;
use crate::format::{SectionWriter, SnapshotHeader};
use crate::keyed::{Expiry, KeyedSnapshot, KeyedSnapshotLayout};
use crate::restored::PendingState;
use std::sync::Arc;
use weir_core::CoreError;
use weir_core::keygroup::KeyGroup;

/// What a snapshot writes for one state.
pub(super) enum Part {
    /// A registered state: its entries in the frozen store, with TTL's cleanup if any.
    Stored(Option<SnapshotFilter>),
    /// A restored state not registered yet: its bytes as read.
    Pending(Arc<PendingState>),
}

/// The frozen view [`StoreKeyedStateBackend::snapshot`] returns.
pub(super) struct StoreSnapshot {
    pub(super) header: SnapshotHeader,
    pub(super) frozen: Box<dyn FrozenStore>,
    pub(super) parts: Vec<Part>,
}

impl StoreSnapshot {
    /// Appends the block of registered state `id` in `kg`, checking the store's order.
    fn write_stored(
        &self,
        id: i16,
        kg: KeyGroup,
        filter: Option<&SnapshotFilter>,
        entries: &mut Vec<u8>,
        section: &mut SectionWriter,
    ) -> Result<(), StateError> {
        entries.clear();
        let mut count = 0u32;
        let mut last: Option<Vec<u8>> = None;
        let store_id = StoreStateId::try_from(id).unwrap_or(StoreStateId::MAX);
        self.frozen.scan(store_id, kg, &mut |k, v| {
            if last.as_deref().is_some_and(|l| l >= k) {
                return Err(StateError::Core(CoreError::Encode {
                    what: format!("state {id} in key group {kg}"),
                    reason: "the store's scan is not in ascending order of the key bytes, or \
                             repeats a key"
                        .to_string(),
                }));
            }
            last = Some(k.to_vec());
            let value = match filter {
                None => None,
                Some(filter) => match filter(v)? {
                    Expiry::Keep => None,
                    Expiry::Drop => return Ok(()),
                    Expiry::Replace(new) => Some(new),
                },
            };
            count = count.checked_add(1).ok_or_else(|| {
                StateError::Core(CoreError::Encode {
                    what: format!("state {id} in key group {kg}"),
                    reason: "more than u32::MAX entries".to_string(),
                })
            })?;
            entries.extend_from_slice(k);
            entries.extend_from_slice(value.as_deref().unwrap_or(v));
            Ok(())
        })?;
        if count > 0 {
            section.block(id, count, entries)?;
        }
        Ok(())
    }
}

impl KeyedSnapshot for StoreSnapshot {
    fn write_to(
        self: Box<Self>,
        out: &mut dyn std::io::Write,
    ) -> Result<KeyedSnapshotLayout, StateError> {
        let header = self.header.encode()?;
        out.write_all(&header)?;
        let mut pos = header.len() as u64;
        let range = self.header.key_group_range;
        let mut offsets = Vec::with_capacity(range.len() as usize);
        let mut section = SectionWriter::for_header(&self.header);
        let mut entries = Vec::new();
        for (index, kg) in range.iter().enumerate() {
            offsets.push(pos);
            section.begin(kg);
            for (meta, part) in self.header.states.iter().zip(&self.parts) {
                match part {
                    Part::Stored(filter) => {
                        self.write_stored(meta.id, kg, filter.as_ref(), &mut entries, &mut section)?
                    }
                    Part::Pending(pending) => pending.write_group(index, meta.id, &mut section)?,
                }
            }
            let bytes = section.finish()?;
            out.write_all(bytes)?;
            pos += bytes.len() as u64;
        }
        Ok(KeyedSnapshotLayout {
            key_group_range: range,
            header: (0, header.len() as u64),
            offsets,
            end: pos,
        })
    }
}
