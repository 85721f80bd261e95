//! Encoding a block's entries in their deterministic order, and decoding them.

use crate::StateError;
use serde::Serialize;
use serde::de::DeserializeOwned;
use weir_core::CoreError;
use weir_core::codec;

/// Encodes a state's entries in one key group in the deterministic order: sorted by encoded key.
/// Reuse one encoder for a whole snapshot; it keeps its buffers.
#[derive(Debug, Default)]
pub struct EntryEncoder {
    buf: Vec<u8>,
    index: Vec<(usize, usize, usize)>,
    sorted: Vec<u8>,
}

impl EntryEncoder {
    /// A new encoder.
    pub fn new() -> EntryEncoder {
        EntryEncoder::default()
    }

    /// Encodes `entries` and returns their number and bytes (sorted by encoded key).
    pub fn encode<'a, K, V>(
        &mut self,
        entries: impl IntoIterator<Item = (&'a K, &'a V)>,
    ) -> Result<(u32, &[u8]), StateError>
    where
        K: Serialize + 'a,
        V: Serialize + 'a,
    {
        self.buf.clear();
        self.index.clear();
        self.sorted.clear();
        for (key, value) in entries {
            let key_start = self.buf.len();
            codec::encode_into("state key", key, &mut self.buf)?;
            let key_end = self.buf.len();
            codec::encode_into("state value", value, &mut self.buf)?;
            self.index.push((key_start, key_end, self.buf.len()));
        }
        self.sort_into_sorted()
    }

    /// Encodes `keys` (a tombstone block's) and returns their number and bytes, sorted.
    pub fn encode_keys<'a, K>(
        &mut self,
        keys: impl IntoIterator<Item = &'a K>,
    ) -> Result<(u32, &[u8]), StateError>
    where
        K: Serialize + 'a,
    {
        self.buf.clear();
        self.index.clear();
        self.sorted.clear();
        for key in keys {
            let key_start = self.buf.len();
            codec::encode_into("state key", key, &mut self.buf)?;
            self.index.push((key_start, self.buf.len(), self.buf.len()));
        }
        self.sort_into_sorted()
    }

    fn sort_into_sorted(&mut self) -> Result<(u32, &[u8]), StateError> {
        let count = u32::try_from(self.index.len()).map_err(|_| {
            StateError::Core(CoreError::Encode {
                what: "keyed snapshot block".to_string(),
                reason: format!("{} entries in one key group", self.index.len()),
            })
        })?;
        let buf = &self.buf;
        self.index
            .sort_unstable_by(|a, b| buf[a.0..a.1].cmp(&buf[b.0..b.1]));
        self.sorted.reserve(buf.len());
        for &(start, _, end) in &self.index {
            self.sorted.extend_from_slice(&buf[start..end]);
        }
        Ok((count, &self.sorted))
    }
}

/// Decodes the `entry_count` entries of a block, handing each to `f`. `what` names the state and
/// key group in errors. The entries must fill `bytes` exactly.
pub fn decode_entries<K, V>(
    what: &str,
    entry_count: u32,
    bytes: &[u8],
    f: impl FnMut(K, V) -> Result<(), StateError>,
) -> Result<(), StateError>
where
    K: DeserializeOwned,
    V: DeserializeOwned,
{
    decode_entries_with(|| what.to_string(), entry_count, bytes, f)
}

/// [`decode_entries`], with the name of the state and key group for errors built by `what` only
/// when one occurs. The loop reads the entries with one deserializer and keeps no per-entry
/// state but the position.
#[inline]
pub(crate) fn decode_entries_with<K, V>(
    what: impl Fn() -> String,
    entry_count: u32,
    bytes: &[u8],
    mut f: impl FnMut(K, V) -> Result<(), StateError>,
) -> Result<(), StateError>
where
    K: DeserializeOwned,
    V: DeserializeOwned,
{
    let mut de = postcard::Deserializer::from_bytes(bytes);
    for i in 0..entry_count {
        let key = match K::deserialize(&mut de) {
            Ok(key) => key,
            Err(e) => return Err(entry_error(what(), i, e)),
        };
        let value = match V::deserialize(&mut de) {
            Ok(value) => value,
            Err(e) => return Err(entry_error(what(), i, e)),
        };
        f(key, value)?;
    }
    match de.finalize() {
        Ok([]) => Ok(()),
        Ok(rest) => Err(StateError::Core(CoreError::Decode {
            what: what(),
            reason: format!(
                "{} bytes left after the {entry_count} entries the block declares",
                rest.len()
            ),
        })),
        Err(e) => Err(StateError::Core(CoreError::Decode {
            what: what(),
            reason: e.to_string(),
        })),
    }
}

/// Decodes the `key_count` keys of a tombstone block, handing each to `f`, as
/// [`decode_entries_with`] does entries.
pub(crate) fn decode_keys_with<K>(
    what: impl Fn() -> String,
    key_count: u32,
    bytes: &[u8],
    mut f: impl FnMut(K) -> Result<(), StateError>,
) -> Result<(), StateError>
where
    K: DeserializeOwned,
{
    let mut de = postcard::Deserializer::from_bytes(bytes);
    for i in 0..key_count {
        match K::deserialize(&mut de) {
            Ok(key) => f(key)?,
            Err(e) => return Err(entry_error(what(), i, e)),
        }
    }
    match de.finalize() {
        Ok([]) => Ok(()),
        Ok(rest) => Err(StateError::Core(CoreError::Decode {
            what: what(),
            reason: format!(
                "{} bytes left after the {key_count} tombstones the block declares",
                rest.len()
            ),
        })),
        Err(e) => Err(StateError::Core(CoreError::Decode {
            what: what(),
            reason: e.to_string(),
        })),
    }
}

#[cold]
#[inline(never)]
fn entry_error(what: String, i: u32, e: postcard::Error) -> StateError {
    StateError::Core(CoreError::Decode {
        what,
        reason: format!("entry {i}: {e}"),
    })
}
