//! The codec: postcard for values, and a versioned, checksummed envelope for every file Weir writes.
//!
//! An envelope is `magic (4 bytes) | format version (u16 LE) | flags (u16 LE) | payload length
//! (u64 LE) | payload | CRC-32 of everything before it (u32 LE)`. Opening one checks each field and
//! names what failed, so a truncated or corrupt file is reported, never misread.

use crate::CoreError;
use serde::{Serialize, de::DeserializeOwned};

/// Encodes a value with postcard.
pub fn encode<T: Serialize + ?Sized>(what: &str, value: &T) -> Result<Vec<u8>, CoreError> {
    postcard::to_stdvec(value).map_err(|e| CoreError::Encode {
        what: what.to_string(),
        reason: e.to_string(),
    })
}

/// The length of a value's postcard encoding, without encoding it (0 if it cannot be encoded).
pub fn encoded_len<T: Serialize + ?Sized>(value: &T) -> u64 {
    postcard::serialize_with_flavor::<T, postcard::ser_flavors::Size, usize>(
        value,
        postcard::ser_flavors::Size::default(),
    )
    .map_or(0, |n| n as u64)
}

/// Appends a value's postcard encoding to `out`.
pub fn encode_into<T: Serialize + ?Sized>(
    what: &str,
    value: &T,
    out: &mut Vec<u8>,
) -> Result<(), CoreError> {
    let taken = std::mem::take(out);
    *out = postcard::to_extend(value, taken).map_err(|e| CoreError::Encode {
        what: what.to_string(),
        reason: e.to_string(),
    })?;
    Ok(())
}

/// Decodes a value that must fill `bytes` exactly.
pub fn decode<T: DeserializeOwned>(what: &str, bytes: &[u8]) -> Result<T, CoreError> {
    let (value, rest) = postcard::take_from_bytes(bytes).map_err(|e| CoreError::Decode {
        what: what.to_string(),
        reason: e.to_string(),
    })?;
    if !rest.is_empty() {
        return Err(CoreError::Decode {
            what: what.to_string(),
            reason: format!("{} trailing bytes", rest.len()),
        });
    }
    Ok(value)
}

/// Decodes one value from the front of `bytes` and returns the rest.
pub fn decode_prefix<'a, T: DeserializeOwned>(
    what: &str,
    bytes: &'a [u8],
) -> Result<(T, &'a [u8]), CoreError> {
    postcard::take_from_bytes(bytes).map_err(|e| CoreError::Decode {
        what: what.to_string(),
        reason: e.to_string(),
    })
}

/// Length of an envelope's header.
pub const ENVELOPE_HEADER_LEN: usize = 16;
/// Length of an envelope's trailer (the checksum).
pub const ENVELOPE_TRAILER_LEN: usize = 4;

/// Wraps `payload` in an envelope.
pub fn seal(magic: [u8; 4], version: u16, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(ENVELOPE_HEADER_LEN + payload.len() + ENVELOPE_TRAILER_LEN);
    out.extend_from_slice(&magic);
    out.extend_from_slice(&version.to_le_bytes());
    out.extend_from_slice(&0u16.to_le_bytes());
    out.extend_from_slice(&(payload.len() as u64).to_le_bytes());
    out.extend_from_slice(payload);
    let crc = crc32fast::hash(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    out
}

/// Opens an envelope: checks magic, version (one of `versions`), length and checksum, and
/// returns the version and the payload. `what` names the file in errors.
pub fn open<'a>(
    what: &str,
    magic: [u8; 4],
    versions: &[u16],
    bytes: &'a [u8],
) -> Result<(u16, &'a [u8]), CoreError> {
    let corrupt = |reason: String| CoreError::Corrupt {
        what: what.to_string(),
        reason,
    };
    if bytes.len() < ENVELOPE_HEADER_LEN + ENVELOPE_TRAILER_LEN {
        return Err(corrupt(format!(
            "truncated: {} bytes is shorter than the {}-byte envelope",
            bytes.len(),
            ENVELOPE_HEADER_LEN + ENVELOPE_TRAILER_LEN
        )));
    }
    if bytes[0..4] != magic {
        return Err(corrupt(format!(
            "bad magic {:?}, expected {:?}",
            String::from_utf8_lossy(&bytes[0..4]),
            String::from_utf8_lossy(&magic)
        )));
    }
    let version = u16::from_le_bytes([bytes[4], bytes[5]]);
    if !versions.contains(&version) {
        return Err(corrupt(format!(
            "format version {version} is not one this build reads ({versions:?})"
        )));
    }
    let mut len8 = [0u8; 8];
    len8.copy_from_slice(&bytes[8..16]);
    let len = u64::from_le_bytes(len8);
    // A damaged length near u64::MAX promises more than any file holds; it must not overflow.
    let expected = len.checked_add((ENVELOPE_HEADER_LEN + ENVELOPE_TRAILER_LEN) as u64);
    if expected != Some(bytes.len() as u64) {
        return Err(corrupt(format!(
            "length mismatch: the header promises a payload of {len} bytes, the file has {}",
            bytes.len()
        )));
    }
    let body_end = bytes.len() - ENVELOPE_TRAILER_LEN;
    let mut crc4 = [0u8; 4];
    crc4.copy_from_slice(&bytes[body_end..]);
    let stored = u32::from_le_bytes(crc4);
    let actual = crc32fast::hash(&bytes[..body_end]);
    if stored != actual {
        return Err(corrupt(format!(
            "checksum mismatch: stored {stored:08x}, computed {actual:08x}"
        )));
    }
    Ok((version, &bytes[ENVELOPE_HEADER_LEN..body_end]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn envelope_round_trips_and_detects_damage() {
        let sealed = seal(*b"TEST", 3, b"hello");
        let (v, p) = open("t", *b"TEST", &[3], &sealed).unwrap();
        assert_eq!((v, p), (3, &b"hello"[..]));

        let mut flipped = sealed.clone();
        flipped[17] ^= 1;
        let e = open("t", *b"TEST", &[3], &flipped).unwrap_err();
        assert!(e.to_string().contains("checksum mismatch"), "{e}");

        let e = open("t", *b"TEST", &[3], &sealed[..sealed.len() - 1]).unwrap_err();
        assert!(e.to_string().contains("length mismatch"), "{e}");
        let e = open("t", *b"TEST", &[3], &sealed[..3]).unwrap_err();
        assert!(e.to_string().contains("truncated"), "{e}");
        let e = open("t", *b"NOPE", &[3], &sealed).unwrap_err();
        assert!(e.to_string().contains("bad magic"), "{e}");
        let e = open("t", *b"TEST", &[1, 2], &sealed).unwrap_err();
        assert!(e.to_string().contains("format version 3"), "{e}");
    }

    #[test]
    fn a_payload_length_near_u64_max_is_a_length_mismatch() {
        // Found by `weir-fuzz` (channel-state and codec targets): the expected file length
        // overflowed (a panic with overflow checks, a wrapped comparison without).
        for len in [u64::MAX, u64::MAX - 19, u64::MAX - 20] {
            let mut sealed = seal(*b"TEST", 1, b"");
            sealed[8..16].copy_from_slice(&len.to_le_bytes());
            let e = open("t", *b"TEST", &[1], &sealed).unwrap_err();
            assert!(e.to_string().contains("length mismatch"), "{len}: {e}");
        }
    }

    #[test]
    fn decode_rejects_trailing_bytes() {
        let mut b = encode("n", &7u32).unwrap();
        b.push(0);
        assert!(decode::<u32>("n", &b).is_err());
    }
}
