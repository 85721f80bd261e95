//! Mutations of keyed-snapshot restores: of one piece of a stream (its header, one section, the
//! blocks inside a compressed section), of a handle, of a whole stream, and of the chain.

use crate::mutate::{self, reseal_crc};
use crate::rng::Rng;
use crate::targets::keyed::{Input, Part, VERSIONS};

/// A section's bytes before its blocks: key group and block count.
const SECTION_HEAD: usize = 6;
/// A compressed section's bytes before its payload: key group, count, codec, blocks length.
const COMPRESSED_HEAD: usize = 11;
/// A block's bytes before its entries: state id, entry count, entries length.
const BLOCK_HEAD: usize = 14;
/// The most a mutation decompresses a section to.
const MAX_PLAIN: usize = 1 << 20;

/// A stream cut at its handle's offsets: the header and each section, when the handle still
/// describes the stream (header first, sections in order, up to its end).
fn pieces(part: &Part) -> Option<(Vec<u8>, Vec<Vec<u8>>)> {
    let h = &part.handle;
    let (start, header_end) = (
        usize::try_from(h.header.0).ok()?,
        usize::try_from(h.header.1).ok()?,
    );
    let end = usize::try_from(h.end).ok()?;
    let header = part.stream.get(start..header_end)?.to_vec();
    let mut sections = Vec::with_capacity(h.offsets.len());
    let mut at = header_end;
    for (i, &offset) in h.offsets.iter().enumerate() {
        let from = usize::try_from(offset).ok()?;
        let to = match h.offsets.get(i + 1) {
            Some(&next) => usize::try_from(next).ok()?,
            None => end,
        };
        if from != at {
            return None;
        }
        sections.push(part.stream.get(from..to)?.to_vec());
        at = to;
    }
    (at == end && end <= part.stream.len()).then_some((header, sections))
}

/// Puts the pieces back together, with the handle's offsets for them.
fn assemble(part: &mut Part, header: Vec<u8>, sections: Vec<Vec<u8>>) {
    let mut stream = header;
    let header_end = stream.len() as u64;
    let mut offsets = Vec::with_capacity(sections.len());
    for s in sections {
        offsets.push(stream.len() as u64);
        stream.extend_from_slice(&s);
    }
    part.handle.header = (0, header_end);
    part.handle.offsets = offsets;
    part.handle.end = stream.len() as u64;
    part.stream = stream;
}

/// The pieces of the corpus's streams, to splice from: taken apart once.
#[derive(Debug, Default)]
pub struct Donors {
    headers: Vec<Vec<u8>>,
    sections: Vec<Vec<u8>>,
    streams: Vec<Vec<u8>>,
}

impl Donors {
    /// The pieces of every part of `corpus`.
    pub fn of(corpus: &[Input]) -> Donors {
        let mut donors = Donors::default();
        for part in corpus.iter().flat_map(|i| &i.parts) {
            donors.streams.push(part.stream.clone());
            if let Some((header, sections)) = pieces(part) {
                donors.headers.push(header);
                donors.sections.extend(sections);
            }
        }
        donors
    }
}

fn slices(v: &[Vec<u8>]) -> Vec<&[u8]> {
    v.iter().map(Vec::as_slice).collect()
}

/// Mutates one piece of one stream (its header or a section), keeping the handle in step.
pub fn piece(rng: &mut Rng, input: &mut Input, donors: &Donors) {
    let n = input.parts.len();
    let Some(part) = input.parts.get_mut(rng.below(n)) else {
        return;
    };
    let Some((mut header, mut sections)) = pieces(part) else {
        // An earlier mutation broke the handle: damage the stream as it is.
        let own = part.stream.clone();
        mutate::bytes(rng, &mut part.stream, &[&own]);
        return;
    };
    if sections.is_empty() || rng.percent(25) {
        mutate::enveloped(rng, &mut header, &slices(&donors.headers), &VERSIONS);
    } else {
        let donors = slices(&donors.sections);
        let i = rng.below(sections.len());
        match rng.below(10) {
            // A whole section from elsewhere (another key group's, another snapshot's).
            0 => {
                if let Some(d) = rng.pick(&donors) {
                    sections[i] = d.to_vec();
                }
            }
            1 => {
                let copy = sections[i].clone();
                sections.insert(i, copy);
            }
            2 => {
                sections.remove(i);
            }
            _ => section(rng, &mut sections[i], &donors),
        }
    }
    assemble(part, header, sections);
}

/// Mutates a section, mostly sealing it again so its checksum holds.
fn section(rng: &mut Rng, section: &mut Vec<u8>, donors: &[&[u8]]) {
    let compressed = section.len() >= COMPRESSED_HEAD + 4 && section[5] & 0x80 != 0;
    if compressed && rng.percent(50) && recompress(rng, section) {
        return;
    }
    if rng.percent(15) || section.len() < 4 {
        // Left with a broken checksum, mostly.
        mutate::bytes(rng, section, donors);
        return;
    }
    let mut body = section[..section.len() - 4].to_vec();
    if !compressed && rng.percent(60) {
        if rng.percent(50) {
            block_entries(rng, &mut body, SECTION_HEAD, &[]);
        } else {
            block_field(rng, &mut body, SECTION_HEAD);
        }
    } else {
        let bodies: Vec<&[u8]> = donors
            .iter()
            .map(|d| &d[..d.len().saturating_sub(4)])
            .collect();
        mutate::bytes(rng, &mut body, &bodies);
    }
    body.extend_from_slice(&[0; 4]);
    reseal_crc(&mut body);
    *section = body;
}

/// Where the blocks of `body` (starting at `first`) begin, as far as their lengths hold.
fn block_heads(body: &[u8], first: usize) -> Vec<usize> {
    let mut heads = Vec::new();
    let mut at = first;
    while at + BLOCK_HEAD <= body.len() {
        heads.push(at);
        let len = u64::from_le_bytes(body[at + 6..at + 14].try_into().unwrap_or([0xff; 8]));
        match usize::try_from(len)
            .ok()
            .and_then(|l| (at + BLOCK_HEAD).checked_add(l))
        {
            Some(next) if next <= body.len() => at = next,
            _ => break,
        }
    }
    heads
}

/// Mutates the entries of one block of `body` (blocks starting at `first`) and sets its length
/// to theirs, so the framing holds and the entries' decoder sees the damage; sometimes the
/// entry count is off by one too.
fn block_entries(rng: &mut Rng, body: &mut Vec<u8>, first: usize, donors: &[&[u8]]) {
    let Some(&at) = rng.pick(&block_heads(body, first)) else {
        return;
    };
    let len = u64::from_le_bytes(body[at + 6..at + 14].try_into().unwrap_or([0; 8]));
    let start = at + BLOCK_HEAD;
    let end = usize::try_from(len)
        .ok()
        .and_then(|l| start.checked_add(l))
        .map_or(body.len(), |end| end.min(body.len()));
    let mut entries = body[start..end].to_vec();
    mutate::bytes(rng, &mut entries, donors);
    body[at + 6..at + 14].copy_from_slice(&(entries.len() as u64).to_le_bytes());
    if rng.percent(20) {
        let count = u32::from_le_bytes(body[at + 2..at + 6].try_into().unwrap_or([0; 4]));
        let count = if rng.percent(50) {
            count.wrapping_add(1)
        } else {
            count.wrapping_sub(1)
        };
        body[at + 2..at + 6].copy_from_slice(&count.to_le_bytes());
    }
    body.splice(start..end, entries);
}

/// Overwrites one field of one block of `body` (blocks starting at `first`), or the section's
/// block count, with a boundary value.
fn block_field(rng: &mut Rng, body: &mut [u8], first: usize) {
    let heads = block_heads(body, first);
    let Some(&at) = rng.pick(&heads).filter(|_| rng.percent(85)) else {
        // The block count, when the body has one.
        if first == SECTION_HEAD && body.len() >= SECTION_HEAD {
            let count = [0u16, 1, 2, 5, 0x7fff, 0x8000, 0x8001, 0xffff][rng.below(8)];
            body[4..6].copy_from_slice(&count.to_le_bytes());
        }
        return;
    };
    match rng.below(3) {
        0 => {
            let id = [0i16, 1, 2, 3, 4, 5, -1, !1, !3, !4, i16::MAX, i16::MIN][rng.below(12)];
            body[at..at + 2].copy_from_slice(&id.to_le_bytes());
        }
        1 => {
            let old = u32::from_le_bytes(body[at + 2..at + 6].try_into().unwrap_or([0; 4]));
            let count = [
                0,
                1,
                old.wrapping_add(1),
                old.wrapping_sub(1),
                u32::MAX,
                1 << 31,
            ][rng.below(6)];
            body[at + 2..at + 6].copy_from_slice(&count.to_le_bytes());
        }
        _ => {
            let old = u64::from_le_bytes(body[at + 6..at + 14].try_into().unwrap_or([0; 8]));
            let left = (body.len() - at - BLOCK_HEAD) as u64;
            let len = [
                0,
                old.wrapping_add(1),
                old.wrapping_sub(1),
                left,
                left + 1,
                u64::MAX,
                1 << 32,
            ][rng.below(7)];
            body[at + 6..at + 14].copy_from_slice(&len.to_le_bytes());
        }
    }
}

/// Decompresses a compressed section's blocks, mutates them and compresses them again with the
/// same codec, so the section's decoder gets a valid frame of damaged blocks; the claimed
/// length is usually the true one. False when the section does not decompress.
fn recompress(rng: &mut Rng, section: &mut Vec<u8>) -> bool {
    let body_end = section.len() - 4;
    let codec = section[6];
    let claimed = u32::from_le_bytes([section[7], section[8], section[9], section[10]]) as usize;
    let payload = &section[COMPRESSED_HEAD..body_end];
    if claimed > MAX_PLAIN {
        return false;
    }
    let plain = match codec {
        1 => lz4_flex::block::decompress(payload, claimed).ok(),
        2 => zstd::bulk::decompress(payload, claimed).ok(),
        _ => None,
    };
    let Some(mut plain) = plain else {
        return false;
    };
    match rng.below(3) {
        0 => block_field(rng, &mut plain, 0),
        1 => block_entries(rng, &mut plain, 0, &[]),
        _ => mutate::bytes(rng, &mut plain, &[]),
    }
    let packed = match codec {
        1 => lz4_flex::block::compress(&plain),
        _ => match zstd::bulk::compress(&plain, 1) {
            Ok(p) => p,
            Err(_) => return false,
        },
    };
    let len = plain.len() as u32;
    let claimed = if rng.percent(85) {
        len
    } else {
        [
            0,
            len.wrapping_add(1),
            len.wrapping_sub(1),
            u32::MAX,
            1 << 30,
            (1 << 30) + 1,
        ][rng.below(6)]
    };
    let mut out = section[..7].to_vec();
    out.extend_from_slice(&claimed.to_le_bytes());
    out.extend_from_slice(&packed);
    out.extend_from_slice(&[0; 4]);
    reseal_crc(&mut out);
    *section = out;
    true
}

/// Damages one field of one handle, as a forged `_metadata` could.
pub fn handle(rng: &mut Rng, input: &mut Input) {
    let n = input.parts.len();
    let Some(part) = input.parts.get_mut(rng.below(n)) else {
        return;
    };
    let len = part.stream.len() as u64;
    let h = &mut part.handle;
    let value = |rng: &mut Rng, old: u64| {
        [
            0,
            1,
            old.wrapping_add(1),
            old.wrapping_sub(1),
            len,
            len + 1,
            u64::MAX,
            1 << 32,
        ][rng.below(8)]
    };
    match rng.below(7) {
        0 => {
            let start = h.key_group_range.start;
            h.key_group_range.start = [
                0,
                1,
                start.wrapping_add(1),
                start.wrapping_sub(1),
                15,
                16,
                u32::MAX,
            ][rng.below(7)];
        }
        1 => {
            let end = h.key_group_range.end;
            h.key_group_range.end = [
                0,
                end.wrapping_add(1),
                end.wrapping_sub(1),
                15,
                16,
                1 << 15,
                u32::MAX,
            ][rng.below(7)];
        }
        2 => h.header.0 = value(rng, h.header.0),
        3 => h.header.1 = value(rng, h.header.1),
        4 => {
            let i = rng.below(h.offsets.len());
            if let Some(o) = h.offsets.get_mut(i) {
                *o = value(rng, *o);
            }
        }
        5 => h.end = value(rng, h.end),
        _ => {
            let i = rng.below(h.offsets.len());
            if rng.percent(50) && i < h.offsets.len() {
                h.offsets.remove(i);
            } else {
                let o = h.offsets.get(i).copied().unwrap_or(0);
                h.offsets.insert(i.min(h.offsets.len()), o);
            }
        }
    }
}

/// Damages a whole stream without touching its handle.
pub fn stream(rng: &mut Rng, input: &mut Input, donors: &Donors) {
    let n = input.parts.len();
    if let Some(part) = input.parts.get_mut(rng.below(n)) {
        mutate::bytes(rng, &mut part.stream, &slices(&donors.streams));
    }
}

/// Changes the chain: a snapshot dropped, repeated, moved, or taken from another seed.
pub fn chain(rng: &mut Rng, input: &mut Input, corpus: &[Input]) {
    let n = input.parts.len();
    match rng.below(4) {
        0 if n > 0 => {
            input.parts.remove(rng.below(n));
        }
        1 if n > 0 => {
            let copy = input.parts[rng.below(n)].clone();
            input.parts.insert(rng.below(n + 1), copy);
        }
        2 if n > 1 => input.parts.swap(rng.below(n), rng.below(n)),
        _ => {
            let other = corpus
                .get(rng.below(corpus.len()))
                .and_then(|i| i.parts.get(rng.below(i.parts.len())));
            if let Some(p) = other {
                input.parts.insert(rng.below(n + 1), p.clone());
            }
        }
    }
}
