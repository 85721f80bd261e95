//! The snapshot header: the states' metadata, key groups and codec, in a checksummed envelope.

use super::section::{Section, parse_section_with};
use super::{
    Compression, FLAG_DELTA, FLAG_KEY_GROUP_COMPRESSION, FORMAT_VERSION_V1, FORMAT_VERSION_V3,
    MAGIC, MAX_STATES, READABLE_VERSIONS, StateKind,
};
use crate::StateError;
use serde::{Deserialize, Serialize};
use std::collections::HashSet;
use weir_core::CoreError;
use weir_core::codec;
use weir_core::keygroup::{KeyGroup, KeyGroupRange, UPPER_BOUND_MAX_PARALLELISM};

/// One state's metadata in the header.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StateMeta {
    /// The state's id: its index in the header, and the id its blocks carry.
    pub id: i16,
    /// The state's name, unique within the operator.
    pub name: String,
    /// What the state holds.
    pub kind: StateKind,
    /// The key type's name.
    pub key_type: String,
    /// The value type's name.
    pub value_type: String,
    /// The version of the encoding of keys and values
    /// ([`SERIALIZER_VERSION`](super::SERIALIZER_VERSION)).
    pub serializer_version: u32,
}

/// A snapshot's header: the key groups it covers and every state's metadata.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SnapshotHeader {
    /// The envelope flags: [`Compression::header_flags`] of `compression` (0 in version 1,
    /// [`FLAG_KEY_GROUP_COMPRESSION`] in version 2).
    pub flags: u16,
    /// The codec the sections were compressed with; [`Compression::None`] in version 1.
    pub compression: Compression,
    /// Whether sections may hold overlay blocks (tombstones, several blocks of one state),
    /// which makes the snapshot format version 3.
    pub overlays: bool,
    /// Whether the snapshot is a delta on top of earlier ones ([`FLAG_DELTA`]); implies
    /// `overlays`.
    pub delta: bool,
    /// The key groups the snapshot has sections for.
    pub key_group_range: KeyGroupRange,
    /// The max parallelism the keys were hashed with.
    pub max_parallelism: u32,
    /// The states, with `states[i].id == i`.
    pub states: Vec<StateMeta>,
}

#[derive(Serialize)]
pub(super) struct HeaderWireRef<'a> {
    pub(super) key_group_range: KeyGroupRange,
    pub(super) max_parallelism: u32,
    pub(super) states: Vec<StateMetaWireRef<'a>>,
}

/// Version 2's payload: version 1's, then the codec. (Postcard writes a nested struct as its
/// fields, so this is the concatenation.)
#[derive(Serialize)]
pub(super) struct HeaderV2WireRef<'a> {
    pub(super) v1: HeaderWireRef<'a>,
    pub(super) codec: u8,
}

#[derive(Serialize)]
pub(super) struct StateMetaWireRef<'a> {
    pub(super) id: i16,
    pub(super) name: &'a str,
    pub(super) kind: &'a str,
    pub(super) key_type: &'a str,
    pub(super) value_type: &'a str,
    pub(super) serializer_version: u32,
}

#[derive(Deserialize)]
struct HeaderWire {
    key_group_range: KeyGroupRange,
    max_parallelism: u32,
    states: Vec<StateMetaWire>,
}

#[derive(Deserialize)]
struct HeaderV2Wire {
    v1: HeaderWire,
    codec: u8,
}

#[derive(Deserialize)]
struct StateMetaWire {
    id: i16,
    name: String,
    kind: String,
    key_type: String,
    value_type: String,
    serializer_version: u32,
}

pub(super) const HEADER_WHAT: &str = "keyed snapshot header";

fn header_corrupt(reason: String) -> StateError {
    StateError::Core(CoreError::Corrupt {
        what: HEADER_WHAT.to_string(),
        reason,
    })
}

/// [`codec::seal`] with `flags` in the envelope's flags field (which `seal` leaves 0).
pub(super) fn seal_with_flags(version: u16, flags: u16, payload: &[u8]) -> Vec<u8> {
    let mut out = codec::seal(MAGIC, version, payload);
    if flags != 0 {
        let body_end = out.len() - codec::ENVELOPE_TRAILER_LEN;
        out[6..8].copy_from_slice(&flags.to_le_bytes());
        let crc = crc32fast::hash(&out[..body_end]);
        out[body_end..].copy_from_slice(&crc.to_le_bytes());
    }
    out
}

impl SnapshotHeader {
    /// The format version [`encode`](Self::encode) writes: 3 with overlays (or as a delta),
    /// else 1 without compression and 2 with.
    pub fn version(&self) -> u16 {
        if self.overlays || self.delta {
            FORMAT_VERSION_V3
        } else {
            self.compression.format_version()
        }
    }

    /// The envelope flags this header is written with.
    pub fn expected_flags(&self) -> u16 {
        let delta = if self.delta { FLAG_DELTA } else { 0 };
        self.compression.header_flags() | delta
    }

    /// Checks and parses the section of `key_group` by this header's version: overlay blocks
    /// are allowed in version 3 only. See [`parse_section`](super::parse_section).
    pub fn parse_section<'a>(
        &self,
        key_group: KeyGroup,
        bytes: &'a [u8],
    ) -> Result<Section<'a>, StateError> {
        parse_section_with(key_group, bytes, self.version() == FORMAT_VERSION_V3)
    }

    /// Encodes the header in its envelope.
    pub fn encode(&self) -> Result<Vec<u8>, StateError> {
        let flags = self.expected_flags();
        if self.flags != flags {
            return Err(StateError::Core(CoreError::Encode {
                what: HEADER_WHAT.to_string(),
                reason: format!(
                    "flags {:#06x} do not fit compression {} (delta: {}), which is written as \
                     format version {} with flags {flags:#06x}",
                    self.flags,
                    self.compression,
                    self.delta,
                    self.version()
                ),
            }));
        }
        if self.states.len() > MAX_STATES {
            return Err(StateError::TooManyStates {
                name: self
                    .states
                    .last()
                    .map(|s| s.name.clone())
                    .unwrap_or_default(),
                count: self.states.len(),
                max: MAX_STATES,
            });
        }
        let wire = HeaderWireRef {
            key_group_range: self.key_group_range,
            max_parallelism: self.max_parallelism,
            states: self
                .states
                .iter()
                .map(|s| StateMetaWireRef {
                    id: s.id,
                    name: &s.name,
                    kind: s.kind.as_str(),
                    key_type: &s.key_type,
                    value_type: &s.value_type,
                    serializer_version: s.serializer_version,
                })
                .collect(),
        };
        let payload = if self.version() == FORMAT_VERSION_V3 || self.compression.is_enabled() {
            codec::encode(
                HEADER_WHAT,
                &HeaderV2WireRef {
                    v1: wire,
                    codec: self.compression.id(),
                },
            )?
        } else {
            codec::encode(HEADER_WHAT, &wire)?
        };
        Ok(seal_with_flags(self.version(), flags, &payload))
    }

    /// Opens and checks a header of any readable version: envelope, flags, codec, and the
    /// consistency of its fields.
    pub fn decode(bytes: &[u8]) -> Result<SnapshotHeader, StateError> {
        let (version, payload) = codec::open(HEADER_WHAT, MAGIC, READABLE_VERSIONS, bytes)?;
        // `open` checked that the envelope is complete, so the flags field is there.
        let flags = match bytes.get(6..8) {
            Some(&[a, b]) => u16::from_le_bytes([a, b]),
            _ => return Err(header_corrupt("truncated before the flags".to_string())),
        };
        let (wire, compression) = match version {
            FORMAT_VERSION_V1 => {
                if flags != 0 {
                    return Err(header_corrupt(format!(
                        "flags {flags:#06x} are not supported by format version 1 (bit 0, \
                         key-group compression, comes with format version 2)"
                    )));
                }
                let wire: HeaderWire = codec::decode(HEADER_WHAT, payload)?;
                (wire, Compression::None)
            }
            FORMAT_VERSION_V3 => {
                if flags & !(FLAG_KEY_GROUP_COMPRESSION | FLAG_DELTA) != 0 {
                    return Err(header_corrupt(format!(
                        "flags {flags:#06x} are not supported by format version 3, which knows \
                         bit 0 (key-group compression) and bit 1 (delta)"
                    )));
                }
                let wire: HeaderV2Wire = codec::decode(HEADER_WHAT, payload)?;
                let compression = Compression::from_id(wire.codec).ok_or_else(|| {
                    header_corrupt(format!(
                        "unknown compression codec id {} (0 is none, 1 is lz4, 2 is zstd)",
                        wire.codec
                    ))
                })?;
                if (flags & FLAG_KEY_GROUP_COMPRESSION != 0) != compression.is_enabled() {
                    return Err(header_corrupt(format!(
                        "flags {flags:#06x} disagree with the codec {compression}: bit 0 is set \
                         exactly when sections may be compressed"
                    )));
                }
                (wire.v1, compression)
            }
            _ => {
                if flags != FLAG_KEY_GROUP_COMPRESSION {
                    return Err(header_corrupt(format!(
                        "flags {flags:#06x} are not supported by format version {version}, which \
                         has exactly bit 0 (key-group compression) set"
                    )));
                }
                let wire: HeaderV2Wire = codec::decode(HEADER_WHAT, payload)?;
                let compression = Compression::from_id(wire.codec)
                    .filter(|c| c.is_enabled())
                    .ok_or_else(|| {
                        header_corrupt(format!(
                            "unknown compression codec id {} (1 is lz4, 2 is zstd)",
                            wire.codec
                        ))
                    })?;
                (wire.v1, compression)
            }
        };
        if wire.max_parallelism == 0 || wire.max_parallelism > UPPER_BOUND_MAX_PARALLELISM {
            return Err(header_corrupt(format!(
                "max parallelism {} is out of bounds",
                wire.max_parallelism
            )));
        }
        let range = wire.key_group_range;
        if !range.is_empty() && range.end >= wire.max_parallelism {
            return Err(header_corrupt(format!(
                "key-group range {range} does not fit max parallelism {}",
                wire.max_parallelism
            )));
        }
        if wire.states.len() > MAX_STATES {
            return Err(header_corrupt(format!(
                "{} states, more than the {MAX_STATES} the format can number",
                wire.states.len()
            )));
        }
        let mut states: Vec<StateMeta> = Vec::with_capacity(wire.states.len());
        let mut names = HashSet::with_capacity(wire.states.len());
        for (index, s) in wire.states.into_iter().enumerate() {
            if usize::try_from(s.id).ok() != Some(index) {
                return Err(header_corrupt(format!(
                    "state '{}' has id {} at position {index}",
                    s.name, s.id
                )));
            }
            if !names.insert(s.name.clone()) {
                return Err(header_corrupt(format!("state '{}' appears twice", s.name)));
            }
            let Some(kind) = StateKind::parse(&s.kind) else {
                return Err(header_corrupt(format!(
                    "state '{}' has unknown kind '{}'",
                    s.name, s.kind
                )));
            };
            states.push(StateMeta {
                id: s.id,
                name: s.name,
                kind,
                key_type: s.key_type,
                value_type: s.value_type,
                serializer_version: s.serializer_version,
            });
        }
        Ok(SnapshotHeader {
            flags,
            compression,
            overlays: version == FORMAT_VERSION_V3,
            delta: flags & FLAG_DELTA != 0,
            key_group_range: range,
            max_parallelism: wire.max_parallelism,
            states,
        })
    }
}
