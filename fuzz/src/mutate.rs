//! Byte mutations of valid encodings: bit flips, byte sets, truncation, extension, splices from
//! other seeds, huge values over length fields, duplicated and deleted ranges; and re-sealing a
//! mutated envelope payload, so that mutations reach past the checksum.

use crate::rng::Rng;

/// The longest input a mutation makes: mutations stop growing an input beyond this.
pub const MAX_INPUT: usize = 256 * 1024;

/// Values worth writing over a length or count field: boundaries and huge lengths.
const HUGE: [u64; 16] = [
    0,
    1,
    0x7f,
    0x80,
    0xff,
    0xffff,
    0x8000,
    0x7fff_ffff,
    0x8000_0000,
    0xffff_ffff,
    1 << 30,
    (1 << 30) + 1,
    1 << 32,
    1 << 40,
    i64::MAX as u64,
    u64::MAX,
];

/// Bytes worth setting.
const INTERESTING: [u8; 8] = [0, 1, 0x7f, 0x80, 0xfe, 0xff, 0x10, 0x40];

/// Applies one random mutation to `data`; `donors` are other valid encodings (of the same
/// format) to splice from.
pub fn bytes(rng: &mut Rng, data: &mut Vec<u8>, donors: &[&[u8]]) {
    let len = data.len();
    match rng.below(12) {
        0 | 1 if len > 0 => {
            let i = rng.below(len);
            data[i] ^= 1 << rng.below(8);
        }
        2 if len > 0 => {
            let i = rng.below(len);
            data[i] = if rng.percent(50) {
                INTERESTING[rng.below(INTERESTING.len())]
            } else {
                rng.byte()
            };
        }
        3 if len > 0 => data.truncate(rng.below(len)),
        4 => {
            let n = 1 + rng.below(64);
            let fill = rng.byte();
            let random = rng.percent(50);
            data.extend((0..n).map(|_| if random { rng.byte() } else { fill }));
        }
        5 => splice(rng, data, donors),
        6 | 7 => huge_value(rng, data),
        8 if len > 0 => {
            // Duplicate a range in place.
            let start = rng.below(len);
            let n = 1 + rng.below((len - start).min(4096));
            let copy = data[start..start + n].to_vec();
            let at = if rng.percent(70) {
                start + n
            } else {
                rng.below(len + 1)
            };
            data.splice(at..at, copy);
        }
        9 if len > 0 => {
            let start = rng.below(len);
            let n = 1 + rng.below((len - start).min(64));
            data.drain(start..start + n);
        }
        10 if len > 0 => {
            // Off by a little: a length field one too long or too short.
            let i = rng.below(len);
            let delta = [1u8, 2, 4, 0xff, 0xfe][rng.below(5)];
            data[i] = data[i].wrapping_add(delta);
        }
        _ => {
            let at = rng.below(len + 1);
            let n = 1 + rng.below(16);
            let inserted: Vec<u8> = (0..n).map(|_| rng.byte()).collect();
            data.splice(at..at, inserted);
        }
    }
    if data.len() > MAX_INPUT {
        data.truncate(MAX_INPUT);
    }
}

/// Inserts or overwrites a chunk of a donor (or of `data` itself) at a random place.
fn splice(rng: &mut Rng, data: &mut Vec<u8>, donors: &[&[u8]]) {
    let own = data.clone();
    let donor: &[u8] = match rng.pick(donors) {
        Some(d) if !d.is_empty() => d,
        _ => &own,
    };
    if donor.is_empty() {
        return;
    }
    let start = rng.below(donor.len());
    let n = 1 + rng.below((donor.len() - start).min(1024));
    let chunk = &donor[start..start + n];
    let at = rng.below(data.len() + 1);
    if rng.percent(50) {
        data.splice(at..at, chunk.iter().copied());
    } else {
        let end = (at + n).min(data.len());
        data.splice(at..end, chunk.iter().copied());
    }
}

/// Writes a huge (or boundary) value at a random place: as a little-endian u16, u32 or u64 over
/// what is there, or as a postcard varint in place of the varint there.
fn huge_value(rng: &mut Rng, data: &mut Vec<u8>) {
    let mut value = HUGE[rng.below(HUGE.len())];
    if rng.percent(20) {
        value = value.wrapping_add(data.len() as u64);
    }
    let at = rng.below(data.len() + 1);
    let encoded: Vec<u8> = match rng.below(4) {
        0 => (value as u16).to_le_bytes().to_vec(),
        1 => (value as u32).to_le_bytes().to_vec(),
        2 => value.to_le_bytes().to_vec(),
        _ => {
            let old = varint_len(&data[at..]);
            let new = varint(value);
            data.splice(at..at + old, new);
            return;
        }
    };
    let end = (at + encoded.len()).min(data.len());
    data.splice(at..end, encoded);
}

/// The bytes of the varint starting `bytes` (at most 10), or 0 when it is empty.
fn varint_len(bytes: &[u8]) -> usize {
    bytes
        .iter()
        .take(10)
        .position(|b| b & 0x80 == 0)
        .map_or(bytes.len().min(10), |i| i + 1)
}

/// `value` as a postcard (LEB128) varint.
pub fn varint(mut value: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(10);
    loop {
        let byte = (value & 0x7f) as u8;
        value >>= 7;
        if value == 0 {
            out.push(byte);
            return out;
        }
        out.push(byte | 0x80);
    }
}

/// Recomputes the trailing CRC-32 of a section or envelope (over everything before it).
pub fn reseal_crc(bytes: &mut [u8]) {
    if bytes.len() < 4 {
        return;
    }
    let end = bytes.len() - 4;
    let crc = crc32fast::hash(&bytes[..end]);
    bytes[end..].copy_from_slice(&crc.to_le_bytes());
}

/// An envelope taken apart (`weir_core::codec`'s layout): the payload is whatever lies between
/// the 16-byte header and the 4-byte checksum, whatever the length field says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Envelope {
    /// The magic bytes.
    pub magic: [u8; 4],
    /// The format version.
    pub version: u16,
    /// The flags field.
    pub flags: u16,
    /// The payload.
    pub payload: Vec<u8>,
}

impl Envelope {
    /// Takes `bytes` apart; `None` when they are shorter than an empty envelope.
    pub fn split(bytes: &[u8]) -> Option<Envelope> {
        let header = bytes.get(..16)?;
        let payload = bytes.get(16..bytes.len().checked_sub(4)?)?;
        Some(Envelope {
            magic: [header[0], header[1], header[2], header[3]],
            version: u16::from_le_bytes([header[4], header[5]]),
            flags: u16::from_le_bytes([header[6], header[7]]),
            payload: payload.to_vec(),
        })
    }

    /// Seals the envelope again with the production sealer: a correct length and checksum.
    pub fn seal(&self) -> Vec<u8> {
        let mut out = weir_core::codec::seal(self.magic, self.version, &self.payload);
        out[6..8].copy_from_slice(&self.flags.to_le_bytes());
        reseal_crc(&mut out);
        out
    }
}

/// One mutation of an envelope-framed encoding: mostly of its payload, sealed again with a
/// correct length and checksum (so the payload's decoder sees it); sometimes of its version or
/// flags, sealed again; sometimes of the raw bytes (so the envelope's own checks see it).
/// `versions` are the versions worth trying.
pub fn enveloped(rng: &mut Rng, data: &mut Vec<u8>, donors: &[&[u8]], versions: &[u16]) {
    let Some(mut envelope) = Envelope::split(data).filter(|_| rng.percent(80)) else {
        bytes(rng, data, donors);
        return;
    };
    if rng.percent(85) {
        let payloads: Vec<Vec<u8>> = donors
            .iter()
            .filter_map(|d| Envelope::split(d).map(|e| e.payload))
            .collect();
        let payloads: Vec<&[u8]> = payloads.iter().map(Vec::as_slice).collect();
        bytes(rng, &mut envelope.payload, &payloads);
    } else if rng.percent(60) {
        envelope.version = match rng.pick(versions) {
            Some(&v) if rng.percent(80) => v,
            _ => rng.next_u64() as u16,
        };
    } else {
        envelope.flags ^= 1 << rng.below(16);
    }
    *data = envelope.seal();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn varints_match_postcard_and_their_length_is_found() {
        for v in [0u64, 1, 127, 128, 300, u32::MAX as u64, u64::MAX] {
            let ours = varint(v);
            assert_eq!(ours, weir_core::codec::encode("v", &v).unwrap(), "{v}");
            assert_eq!(varint_len(&ours), ours.len());
        }
        assert_eq!(varint_len(&[]), 0);
        assert_eq!(
            varint_len(&[0x80, 0x80]),
            2,
            "a cut-off varint is all its bytes"
        );
    }

    #[test]
    fn mutations_replay_from_their_seed_and_keep_inputs_bounded() {
        let seed = b"a valid encoding, more or less".to_vec();
        let run = |s: u64| {
            let mut rng = Rng::new(s);
            let mut data = seed.clone();
            for _ in 0..200 {
                bytes(&mut rng, &mut data, &[b"donor bytes"]);
                assert!(data.len() <= MAX_INPUT);
            }
            data
        };
        assert_eq!(run(11), run(11));
        assert_ne!(run(11), run(12));
    }

    #[test]
    fn an_enveloped_mutation_keeps_the_envelope_valid_when_it_reseals() {
        let sealed = weir_core::codec::seal(*b"TEST", 2, b"payload bytes");
        let env = Envelope::split(&sealed).unwrap();
        assert_eq!(env.payload, b"payload bytes");
        assert_eq!(env.seal(), sealed);
        let mut resealed_ok = 0;
        for s in 0..200 {
            let mut rng = Rng::new(s);
            let mut data = sealed.clone();
            enveloped(&mut rng, &mut data, &[], &[1, 2]);
            if weir_core::codec::open("t", *b"TEST", &[1, 2], &data).is_ok() {
                resealed_ok += 1;
            }
        }
        // Most mutations are re-sealed payloads or versions, which the envelope accepts.
        assert!(resealed_ok > 80, "{resealed_ok} of 200");
    }
}
