//! Tests of the keyed snapshot format: header, sections, entries and restore parts.

use super::header::{
    HEADER_WHAT, HeaderV2WireRef, HeaderWireRef, StateMetaWireRef, seal_with_flags,
};
use super::*;
use weir_core::codec;
use weir_core::keygroup::KeyGroupRange;

fn header() -> SnapshotHeader {
    SnapshotHeader {
        flags: 0,
        compression: Compression::None,
        overlays: false,
        delta: false,
        key_group_range: KeyGroupRange::new(3, 9),
        max_parallelism: 128,
        states: vec![StateMeta {
            id: 0,
            name: "count".to_string(),
            kind: StateKind::Value,
            key_type: "alloc::string::String".to_string(),
            value_type: "u64".to_string(),
            serializer_version: SERIALIZER_VERSION,
        }],
    }
}

#[test]
fn header_round_trips_and_starts_with_magic() {
    let h = header();
    let bytes = h.encode().unwrap();
    assert_eq!(&bytes[0..4], b"WKSH");
    assert_eq!(u16::from_le_bytes([bytes[4], bytes[5]]), 1);
    assert_eq!(SnapshotHeader::decode(&bytes).unwrap(), h);
}

#[test]
fn header_rejects_flags_and_damage() {
    let bytes = header().encode().unwrap();
    let mut flagged = bytes.clone();
    flagged[6] = 1;
    let e = SnapshotHeader::decode(&flagged).unwrap_err().to_string();
    assert!(e.contains("keyed snapshot header"), "{e}");
    for i in 0..bytes.len() {
        let mut b = bytes.clone();
        b[i] ^= 0x10;
        assert!(
            SnapshotHeader::decode(&b).is_err(),
            "flip at {i} went unnoticed"
        );
    }
    let mut compressed = header();
    compressed.flags = FLAG_KEY_GROUP_COMPRESSION;
    assert!(compressed.encode().is_err());
}

#[test]
fn header_rejects_unknown_kind_and_bad_ids() {
    let wire = HeaderWireRef {
        key_group_range: KeyGroupRange::new(0, 1),
        max_parallelism: 2,
        states: vec![StateMetaWireRef {
            id: 0,
            name: "s",
            kind: "histogram",
            key_type: "k",
            value_type: "v",
            serializer_version: 1,
        }],
    };
    let sealed = codec::seal(MAGIC, 1, &codec::encode("t", &wire).unwrap());
    let e = SnapshotHeader::decode(&sealed).unwrap_err().to_string();
    assert!(e.contains("unknown kind 'histogram'"), "{e}");

    let wire = HeaderWireRef {
        states: vec![StateMetaWireRef {
            id: 4,
            name: "s",
            kind: "value",
            key_type: "k",
            value_type: "v",
            serializer_version: 1,
        }],
        ..wire
    };
    let sealed = codec::seal(MAGIC, 1, &codec::encode("t", &wire).unwrap());
    let e = SnapshotHeader::decode(&sealed).unwrap_err().to_string();
    assert!(e.contains("id 4 at position 0"), "{e}");
}

#[test]
fn sections_round_trip_and_name_their_key_group() {
    let mut enc = EntryEncoder::new();
    let (a, b) = ("b".to_string(), "a".to_string());
    let entries = [(&a, &1u64), (&b, &2u64)];
    let (count, bytes) = enc.encode(entries.iter().copied()).unwrap();
    assert_eq!(count, 2);
    let bytes = bytes.to_vec();

    let mut w = SectionWriter::new();
    w.begin(7);
    w.block(0, count, &bytes).unwrap();
    w.block(3, 0, &[]).unwrap();
    assert!(w.block(3, 0, &[]).is_err(), "ids must ascend");
    let section = w.finish().unwrap().to_vec();

    let parsed = parse_section(7, &section).unwrap();
    assert_eq!(parsed.compression(), Compression::None);
    let blocks: Vec<StateBlock<'_>> = parsed.iter().collect();
    assert_eq!(blocks.len(), 2);
    assert_eq!(blocks[0].state_id, 0);
    let mut seen = Vec::new();
    decode_entries::<String, u64>("t", blocks[0].entry_count, blocks[0].entries, |k, v| {
        seen.push((k, v));
        Ok(())
    })
    .unwrap();
    // Sorted by encoded key: "a" before "b".
    assert_eq!(seen, vec![("a".to_string(), 2), ("b".to_string(), 1)]);

    let e = parse_section(8, &section).unwrap_err().to_string();
    assert!(
        e.contains("key group 8") && e.contains("key group 7"),
        "{e}"
    );
    for i in 0..section.len() {
        let mut s = section.clone();
        s[i] ^= 0x01;
        let e = parse_section(7, &s).unwrap_err().to_string();
        assert!(e.contains("key group 7"), "{e}");
    }
    let e = parse_section(7, &section[..5]).unwrap_err().to_string();
    assert!(e.contains("truncated"), "{e}");
}

#[test]
fn empty_section_is_ten_bytes() {
    let mut w = SectionWriter::new();
    w.begin(0);
    assert_eq!(w.finish().unwrap().len(), EMPTY_SECTION_LEN);
    for c in Compression::ALL {
        let mut w = SectionWriter::with_compression(c);
        w.begin(0);
        assert_eq!(w.finish().unwrap().len(), EMPTY_SECTION_LEN, "{c}");
    }
}

#[test]
fn decode_entries_rejects_wrong_counts_and_types() {
    let mut enc = EntryEncoder::new();
    let k = 5u32;
    let v = "hello".to_string();
    let (count, bytes) = enc.encode([(&k, &v)]).unwrap();
    let bytes = bytes.to_vec();
    assert!(decode_entries::<u32, String>("t", count + 1, &bytes, |_, _| Ok(())).is_err());
    assert!(decode_entries::<u32, String>("t", 0, &bytes, |_, _| Ok(())).is_err());
    // A string read as (u32 key, u64 value) leaves bytes over or fails; it never panics.
    let _ = decode_entries::<u32, u64>("t", count, &bytes, |_, _| Ok(()));
}

fn compressed_header(c: Compression) -> SnapshotHeader {
    SnapshotHeader {
        flags: c.header_flags(),
        compression: c,
        ..header()
    }
}

/// Recomputes a section's trailing checksum after a test damaged it on purpose.
fn reseal(section: &mut [u8]) {
    let end = section.len() - 4;
    let crc = crc32fast::hash(&section[..end]);
    section[end..].copy_from_slice(&crc.to_le_bytes());
}

/// A section of key group 5 with one block of `n` similar entries (compressible), written by
/// `w`, and the same section uncompressed.
fn similar_section(w: &mut SectionWriter, n: u32) -> (Vec<u8>, Vec<u8>) {
    let keys: Vec<String> = (0..n).map(|i| format!("user-{i:06}")).collect();
    let values: Vec<String> = (0..n)
        .map(|i| format!("session of user {i}: clicked, scrolled, clicked, left"))
        .collect();
    let mut enc = EntryEncoder::new();
    let (count, entries) = enc.encode(keys.iter().zip(&values)).unwrap();
    let entries = entries.to_vec();
    w.begin(5);
    w.block(0, count, &entries).unwrap();
    w.block(2, count, &entries).unwrap();
    let stored = w.finish().unwrap().to_vec();
    let mut raw = SectionWriter::new();
    raw.begin(5);
    raw.block(0, count, &entries).unwrap();
    raw.block(2, count, &entries).unwrap();
    (stored, raw.finish().unwrap().to_vec())
}

fn blocks_of<'a>(section: &'a Section<'_>) -> Vec<StateBlock<'a>> {
    section.iter().collect()
}

#[test]
fn compression_names_parse_and_display() {
    for c in Compression::ALL {
        assert_eq!(c.to_string().parse::<Compression>().unwrap(), c);
        assert_eq!(Compression::from_id(c.id()), Some(c));
    }
    assert_eq!(" LZ4 ".parse::<Compression>().unwrap(), Compression::Lz4);
    assert_eq!("Zstd".parse::<Compression>().unwrap(), Compression::Zstd);
    let e = "gzip".parse::<Compression>().unwrap_err().to_string();
    assert!(
        e.contains("'gzip'") && e.contains("none, lz4 or zstd"),
        "{e}"
    );
    assert_eq!(Compression::default(), Compression::None);
    assert_eq!(Compression::from_id(3), None);
}

#[test]
fn uncompressed_headers_stay_version_1_and_compressed_ones_are_version_2() {
    assert_eq!(header().version(), FORMAT_VERSION_V1);
    for c in [Compression::Lz4, Compression::Zstd] {
        let h = compressed_header(c);
        let bytes = h.encode().unwrap();
        assert_eq!(u16::from_le_bytes([bytes[4], bytes[5]]), FORMAT_VERSION_V2);
        assert_eq!(
            u16::from_le_bytes([bytes[6], bytes[7]]),
            FLAG_KEY_GROUP_COMPRESSION
        );
        let decoded = SnapshotHeader::decode(&bytes).unwrap();
        assert_eq!(decoded, h);
        assert_eq!(decoded.compression, c);
        for i in 0..bytes.len() {
            let mut b = bytes.clone();
            b[i] ^= 0x10;
            assert!(
                SnapshotHeader::decode(&b).is_err(),
                "{c}: flip at {i} went unnoticed"
            );
        }
        // The flags must match the codec.
        let mut wrong = compressed_header(c);
        wrong.flags = 0;
        assert!(wrong.encode().is_err());
    }
    // A version 1 payload is a prefix of a version 2 payload: the codec is appended.
    let v1 = header().encode().unwrap();
    let v2 = compressed_header(Compression::Zstd).encode().unwrap();
    let (v1p, v2p) = (&v1[16..v1.len() - 4], &v2[16..v2.len() - 4]);
    assert_eq!(&v2p[..v1p.len()], v1p);
    assert_eq!(&v2p[v1p.len()..], &[Compression::Zstd.id()]);
}

#[test]
fn header_flags_must_agree_with_the_version_and_the_codec_must_be_known() {
    let wire = |codec: u8| {
        let h = header();
        let states = h
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
            .collect();
        let v1 = HeaderWireRef {
            key_group_range: h.key_group_range,
            max_parallelism: h.max_parallelism,
            states,
        };
        codec::encode("t", &HeaderV2WireRef { v1, codec }).unwrap()
    };
    // Version 2 without the flag, with an unknown flag, with codec "none" or an unknown one.
    for (flags, codec, expect) in [
        (0, 1, "flags 0x0000"),
        (FLAG_KEY_GROUP_COMPRESSION | 4, 1, "flags 0x0005"),
        (FLAG_KEY_GROUP_COMPRESSION, 0, "codec id 0"),
        (FLAG_KEY_GROUP_COMPRESSION, 9, "codec id 9"),
    ] {
        let sealed = seal_with_flags(FORMAT_VERSION_V2, flags, &wire(codec));
        let e = SnapshotHeader::decode(&sealed).unwrap_err().to_string();
        assert!(e.contains(expect) && e.contains(HEADER_WHAT), "{e}");
    }
    // Version 1 with the compression flag.
    let v1 = header().encode().unwrap();
    let sealed = seal_with_flags(FORMAT_VERSION_V1, 1, &v1[16..v1.len() - 4]);
    let e = SnapshotHeader::decode(&sealed).unwrap_err().to_string();
    assert!(e.contains("format version 1"), "{e}");
    // Version 3: the compression flag must agree with the codec (0 is none), unknown flags
    // are refused.
    for (flags, codec, expect) in [
        (FLAG_KEY_GROUP_COMPRESSION, 0, "disagree"),
        (FLAG_DELTA, 1, "disagree"),
        (FLAG_DELTA | 8, 0, "flags 0x000a"),
        (FLAG_DELTA, 9, "codec id 9"),
    ] {
        let sealed = seal_with_flags(FORMAT_VERSION_V3, flags, &wire(codec));
        let e = SnapshotHeader::decode(&sealed).unwrap_err().to_string();
        assert!(e.contains(expect) && e.contains(HEADER_WHAT), "{e}");
    }
    let sealed = seal_with_flags(FORMAT_VERSION_V3, FLAG_DELTA, &wire(0));
    let h = SnapshotHeader::decode(&sealed).unwrap();
    assert!(h.delta && h.overlays && h.compression == Compression::None);
    // A version this build does not read.
    let sealed = seal_with_flags(4, 1, &wire(1));
    assert!(SnapshotHeader::decode(&sealed).is_err());
}

#[test]
fn version_3_headers_round_trip_and_are_written_only_with_overlays() {
    for c in Compression::ALL {
        for delta in [false, true] {
            let h = SnapshotHeader {
                flags: 0,
                compression: c,
                overlays: true,
                delta,
                ..header()
            };
            let h = SnapshotHeader {
                flags: h.expected_flags(),
                ..h
            };
            let bytes = h.encode().unwrap();
            assert_eq!(u16::from_le_bytes([bytes[4], bytes[5]]), FORMAT_VERSION_V3);
            assert_eq!(
                SnapshotHeader::decode(&bytes).unwrap(),
                h,
                "{c} delta={delta}"
            );
        }
    }
    // Without overlays the versions stay 1 and 2, byte for byte.
    assert_eq!(header().version(), FORMAT_VERSION_V1);
    assert_eq!(
        compressed_header(Compression::Lz4).version(),
        FORMAT_VERSION_V2
    );
}

#[test]
fn overlay_sections_carry_tombstones_and_repeated_states_only_in_version_3() {
    let mut enc = EntryEncoder::new();
    let (n, entries) = enc.encode([(&1u64, &10u64), (&2, &20)]).unwrap();
    let entries = entries.to_vec();
    let (k, keys) = enc.encode_keys([&3u64, &1]).unwrap();
    let keys = keys.to_vec();
    let v3 = SnapshotHeader {
        flags: FLAG_DELTA,
        overlays: true,
        delta: true,
        ..header()
    };
    for c in Compression::ALL {
        let mut w = SectionWriter::for_header(&SnapshotHeader {
            compression: c,
            flags: c.header_flags() | FLAG_DELTA,
            ..v3.clone()
        });
        w.begin(4);
        w.block(0, n, &entries).unwrap();
        w.tombstones(0, k, &keys).unwrap();
        w.block(0, n, &entries).unwrap();
        w.tombstones(2, k, &keys).unwrap();
        assert!(
            w.block(1, n, &entries).is_err(),
            "state ids must not go down"
        );
        let section = w.finish().unwrap().to_vec();
        let parsed = v3.parse_section(4, &section).unwrap();
        let kinds: Vec<(i16, BlockKind, u32)> = parsed
            .iter()
            .map(|b| (b.state_id, b.kind, b.entry_count))
            .collect();
        assert_eq!(
            kinds,
            [
                (0, BlockKind::Entries, 2),
                (0, BlockKind::Tombstones, 2),
                (0, BlockKind::Entries, 2),
                (2, BlockKind::Tombstones, 2),
            ]
        );
        let mut decoded = Vec::new();
        let block = parsed.get(1).unwrap();
        decode_keys_with(
            || "t".to_string(),
            block.entry_count,
            block.entries,
            |k: u64| {
                decoded.push(k);
                Ok(())
            },
        )
        .unwrap();
        assert_eq!(
            decoded,
            [1, 3],
            "tombstone keys are sorted by their encoding"
        );
        // A reader of versions 1 and 2 refuses the overlays.
        assert!(parse_section(4, &section).is_err(), "{c}");
    }
    // A version 1 or 2 writer refuses tombstones and repeated states.
    let mut w = SectionWriter::new();
    w.begin(4);
    assert!(w.tombstones(0, k, &keys).is_err());
    w.block(0, n, &entries).unwrap();
    assert!(w.block(0, n, &entries).is_err());
}

#[test]
fn compressed_sections_round_trip_with_each_codec() {
    for c in [Compression::Lz4, Compression::Zstd] {
        let mut w = SectionWriter::with_compression(c);
        let (stored, raw) = similar_section(&mut w, 500);
        assert!(
            stored.len() * 4 < raw.len(),
            "{c}: {} bytes stored for {} raw",
            stored.len(),
            raw.len()
        );
        assert_eq!(
            u16::from_le_bytes([stored[4], stored[5]]),
            SECTION_COMPRESSED | 2
        );
        assert_eq!(stored[6], c.id());
        let parsed = parse_section(5, &stored).unwrap();
        let expected = parse_section(5, &raw).unwrap();
        assert_eq!(parsed.compression(), c);
        assert_eq!(parsed.key_group(), 5);
        assert_eq!(parsed.blocks_len(), raw.len() - EMPTY_SECTION_LEN);
        assert_eq!(blocks_of(&parsed), blocks_of(&expected));
        // Consumed by value, the blocks share the decompressed bytes.
        let owned: Vec<SectionBlock<'_>> = parsed.clone().into_iter().collect();
        assert_eq!(owned.len(), 2);
        assert_eq!(owned[1].as_block(), blocks_of(&expected)[1]);
        // Deterministic: the same blocks give the same bytes, with a reused writer too.
        let (again, _) = similar_section(&mut w, 500);
        assert_eq!(again, stored);
    }
}

#[test]
fn sections_that_would_not_shrink_are_stored_uncompressed() {
    let mut enc = EntryEncoder::new();
    let (k, v) = (7u32, 1u64);
    let (count, entries) = enc.encode([(&k, &v)]).unwrap();
    let entries = entries.to_vec();
    for c in Compression::ALL {
        let mut w = SectionWriter::with_compression(c);
        w.begin(3);
        w.block(1, count, &entries).unwrap();
        let stored = w.finish().unwrap().to_vec();
        let mut raw = SectionWriter::new();
        raw.begin(3);
        raw.block(1, count, &entries).unwrap();
        assert_eq!(stored, raw.finish().unwrap(), "{c}");
        assert_eq!(
            parse_section(3, &stored).unwrap().compression(),
            Compression::None
        );
    }
}

/// The writer never produces what the reader's expansion bounds refuse: runs of zeros are
/// the most compressible input for both codecs.
#[test]
fn the_most_compressible_sections_stay_within_the_readers_bounds() {
    let zeros = vec![0u8; 8 << 20];
    for c in [Compression::Lz4, Compression::Zstd] {
        let mut w = SectionWriter::with_compression(c);
        w.begin(1);
        w.block(0, 1, &zeros).unwrap();
        let stored = w.finish().unwrap().to_vec();
        let payload = stored.len() - COMPRESSED_SECTION_HEADER_LEN - 4;
        let ratio = zeros.len() / payload;
        let parsed = parse_section(1, &stored).unwrap();
        assert_eq!(parsed.compression(), c);
        assert_eq!(parsed.get(0).unwrap().entries, &zeros[..], "{c}");
        assert!(ratio > 100, "{c}: ratio {ratio}");
    }
}

#[test]
fn a_section_counts_at_most_max_states_blocks() {
    let mut w = SectionWriter::with_compression(Compression::Lz4);
    w.begin(0);
    for id in 0..i16::MAX {
        w.block(id, 0, &[]).unwrap();
    }
    // The next count would need bit 15, the compressed marker.
    assert!(w.block(i16::MAX, 0, &[]).is_err());
    let stored = w.finish().unwrap().to_vec();
    assert_eq!(parse_section(0, &stored).unwrap().len(), MAX_STATES);
}

#[test]
fn damaged_compressed_sections_name_their_key_group() {
    for c in [Compression::Lz4, Compression::Zstd] {
        let mut w = SectionWriter::with_compression(c);
        let (stored, _) = similar_section(&mut w, 200);
        let payload = COMPRESSED_SECTION_HEADER_LEN..stored.len() - 4;

        // Any flipped bit fails the checksum.
        for i in 0..stored.len() {
            let mut s = stored.clone();
            s[i] ^= 0x04;
            let e = parse_section(5, &s).unwrap_err().to_string();
            assert!(e.contains("key group 5"), "{c}: flip at {i}: {e}");
        }

        // Forged: the checksum recomputed, so the codec or the framing must catch it.
        let forged = |edit: &dyn Fn(&mut Vec<u8>)| {
            let mut s = stored.clone();
            edit(&mut s);
            reseal(&mut s);
            parse_section(5, &s).map(|_| ()).unwrap_err().to_string()
        };
        let cannot = format!("{c} cannot decompress");
        // Garbage instead of the payload.
        let e = forged(&|s| s[payload.clone()].fill(0xff));
        assert!(e.contains("key group 5") && e.contains(&cannot), "{c}: {e}");
        // The payload cut short.
        let e = forged(&|s| {
            s.drain(payload.start + (payload.len() / 2)..payload.end);
        });
        assert!(e.contains("key group 5"), "{c}: {e}");
        // A claimed length one byte short of the real one, and one byte over.
        for delta in [-1i64, 1] {
            let e = forged(&|s| {
                let len = u32::from_le_bytes(s[7..11].try_into().unwrap());
                let len = (i64::from(len) + delta) as u32;
                s[7..11].copy_from_slice(&len.to_le_bytes());
            });
            assert!(e.contains("key group 5"), "{c} {delta}: {e}");
        }
        // Absurd lengths are refused before allocating.
        let e = forged(&|s| s[7..11].copy_from_slice(&u32::MAX.to_le_bytes()));
        assert!(
            e.contains("key group 5") && e.contains("refusing to allocate"),
            "{c}: {e}"
        );
        let e = forged(&|s| {
            let len = c.max_expansion(payload.len()) as u32 + 1;
            s[7..11].copy_from_slice(&len.to_le_bytes());
        });
        assert!(e.contains("refusing to allocate"), "{c}: {e}");
        // An unknown codec, and a compressed section cut before its length.
        let e = forged(&|s| s[6] = 0);
        assert!(e.contains("unknown codec id 0"), "{c}: {e}");
        let e = forged(&|s| s.truncate(9 + 4));
        assert!(
            e.contains("key group 5") && e.contains("truncated"),
            "{c}: {e}"
        );
        // Every flipped byte in the payload, checksum recomputed: an error or (a flip in
        // a literal byte) other entries, never a panic.
        for i in payload.clone() {
            let mut s = stored.clone();
            s[i] ^= 0x5a;
            reseal(&mut s);
            if let Err(e) = parse_section(5, &s) {
                assert!(e.to_string().contains("key group 5"), "{c}: {e}");
            }
        }
    }
}

#[test]
fn a_zstd_claim_its_frame_contradicts_is_refused_before_allocating() {
    // Found by `weir-fuzz` (keyed target): a forged section claiming far more blocks than
    // its (damaged) zstd frame holds made the reader allocate the claim, up to 32768 times
    // the stored bytes, before the codec failed. The frame's recorded content size and a
    // header that parses are now checked first.
    let mut w = SectionWriter::with_compression(Compression::Zstd);
    let (stored, _) = similar_section(&mut w, 200);
    let payload = COMPRESSED_SECTION_HEADER_LEN..stored.len() - 4;
    let claimed = |s: &[u8]| u32::from_le_bytes(s[7..11].try_into().unwrap());
    let real = claimed(&stored);
    let mut bigger = stored.clone();
    let forged = (payload.len() as u32 * 32 * 1024).min(real * 64);
    bigger[7..11].copy_from_slice(&forged.to_le_bytes());
    reseal(&mut bigger);
    let e = parse_section(5, &bigger).unwrap_err().to_string();
    assert!(
        e.contains(&format!("holds {real} bytes, the section claims {forged}"))
            && e.contains("refusing to allocate"),
        "{e}"
    );
    // A frame whose header is damaged is refused without decompressing.
    let mut garbled = stored.clone();
    garbled[payload.start..payload.start + 4].copy_from_slice(b"junk");
    reseal(&mut garbled);
    let e = parse_section(5, &garbled).unwrap_err().to_string();
    assert!(e.contains("the frame header does not parse"), "{e}");
    // The writer's own frames pass the check.
    assert_eq!(
        parse_section(5, &stored).unwrap().blocks_len(),
        real as usize
    );
}

proptest::proptest! {
    /// Random payloads behind a well-formed compressed section header, with a valid checksum:
    /// the codecs fail cleanly, never panic.
    #[test]
    fn garbage_compressed_payloads_never_panic(
        codec in 1u8..=2,
        count in 0u16..4,
        blocks_len in 0u32..4096,
        payload in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..512),
    ) {
        let mut s = Vec::new();
        s.extend_from_slice(&9u32.to_le_bytes());
        s.extend_from_slice(&(SECTION_COMPRESSED | count).to_le_bytes());
        s.push(codec);
        s.extend_from_slice(&blocks_len.to_le_bytes());
        s.extend_from_slice(&payload);
        s.extend_from_slice(&[0; 4]);
        reseal(&mut s);
        if let Err(e) = parse_section(9, &s) {
            proptest::prop_assert!(e.to_string().contains("key group 9"), "{}", e);
        }
    }
}
