//! Per-key-group compression of keyed snapshots (format version 2) through the heap backend:
//! round trips with every codec, restore by key-group range, damage detection, the version 1
//! snapshots written before compression existed, and the ratio on compressible state.

// Tests may unwrap; clippy's `allow-unwrap-in-tests` covers `#[test]` functions, not the helpers
// of an integration test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use weir_core::handle::{KeyedStateHandle, StreamStateHandle};
use weir_core::keygroup::{KeyGroupRange, assign_to_key_group};
use weir_state::format::{
    self, FORMAT_VERSION_V1, FORMAT_VERSION_V2, SECTION_COMPRESSED, SnapshotHeader,
};
use weir_state::{
    Compression, HeapKeyedStateBackend, KeyedStateBackend, RestorePart, StateError, ValueState,
    ValueStateDescriptor,
};

const MAX_P: u32 = 128;
/// Bytes of a compressed section before its payload: key group, count, codec, length.
const COMPRESSED_HEADER: usize = 4 + 2 + 1 + 4;

type Content = (BTreeMap<String, u64>, BTreeMap<String, String>);

fn all_groups() -> KeyGroupRange {
    KeyGroupRange::new(0, MAX_P - 1)
}

struct Filled {
    backend: HeapKeyedStateBackend<String>,
    count: ValueState<u64>,
    session: ValueState<String>,
}

/// A backend over `range` with `n` keys (those of the range) in two states: a counter and a
/// string of similar text, as sessions or events would be.
fn filled(range: KeyGroupRange, compression: Compression, n: usize) -> Filled {
    let mut backend =
        HeapKeyedStateBackend::<String>::new(MAX_P, range).with_compression(compression);
    let count = backend
        .value_state(&ValueStateDescriptor::<u64>::new("count"))
        .unwrap();
    let session = backend
        .value_state(&ValueStateDescriptor::<String>::new("session"))
        .unwrap();
    for i in 0..n {
        let key = format!("user-{i:07}");
        let kg = assign_to_key_group(&key, MAX_P);
        if !range.contains(kg) {
            continue;
        }
        backend.update(count, &key, kg, i as u64 * 3);
        backend.update(
            session,
            &key,
            kg,
            format!(
                "page=/catalog/item/{} referrer=/search?q=shoes agent=Mozilla/5.0 status=ok",
                i % 977
            ),
        );
    }
    Filled {
        backend,
        count,
        session,
    }
}

fn content(b: &mut HeapKeyedStateBackend<String>) -> Content {
    let count = b
        .value_state(&ValueStateDescriptor::<u64>::new("count"))
        .unwrap();
    let session = b
        .value_state(&ValueStateDescriptor::<String>::new("session"))
        .unwrap();
    content_of(b, count, session)
}

fn content_of(
    b: &HeapKeyedStateBackend<String>,
    count: ValueState<u64>,
    session: ValueState<String>,
) -> Content {
    (
        b.entries(count).map(|(k, v)| (k.clone(), *v)).collect(),
        b.entries(session)
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
    )
}

/// A snapshot of `b` written into memory: its handle (inline stream left empty) and its bytes.
fn written(b: &mut HeapKeyedStateBackend<String>) -> (KeyedStateHandle, Vec<u8>) {
    let mut bytes = Vec::new();
    let layout = b.snapshot().unwrap().write_to(&mut bytes).unwrap();
    (
        layout.into_handle(StreamStateHandle::Inline(Vec::new())),
        bytes,
    )
}

/// Restores the key groups `range` from a snapshot, handing over only their sections' bytes,
/// as a subtask reading its share of a file would.
fn restore_range(
    b: &mut HeapKeyedStateBackend<String>,
    (handle, bytes): &(KeyedStateHandle, Vec<u8>),
    range: KeyGroupRange,
) -> Result<(), StateError> {
    let (h_start, h_end) = handle.header;
    let (start, end) = handle.byte_range_for(&range).unwrap();
    b.restore(&[RestorePart {
        handle,
        header: &bytes[h_start as usize..h_end as usize],
        sections: bytes::Bytes::copy_from_slice(&bytes[start as usize..end as usize]),
        sections_offset: start,
    }])
}

fn restore_whole(
    b: &mut HeapKeyedStateBackend<String>,
    w: &(KeyedStateHandle, Vec<u8>),
) -> Result<(), StateError> {
    b.restore(&[format::whole_stream_part(&w.0, &w.1)?])
}

fn header_of((handle, bytes): &(KeyedStateHandle, Vec<u8>)) -> SnapshotHeader {
    SnapshotHeader::decode(&bytes[handle.header.0 as usize..handle.header.1 as usize]).unwrap()
}

/// The byte range of key group `kg`'s section in the stream.
fn section_range(handle: &KeyedStateHandle, kg: u32) -> std::ops::Range<usize> {
    let (start, end) = handle.byte_range_for(&KeyGroupRange::new(kg, kg)).unwrap();
    start as usize..end as usize
}

/// The first key group whose section is stored compressed.
fn first_compressed(w: &(KeyedStateHandle, Vec<u8>)) -> (u32, std::ops::Range<usize>) {
    w.0.key_group_range
        .iter()
        .map(|kg| (kg, section_range(&w.0, kg)))
        .find(|(_, r)| {
            let count = u16::from_le_bytes([w.1[r.start + 4], w.1[r.start + 5]]);
            count & SECTION_COMPRESSED != 0
        })
        .expect("a compressed section")
}

fn reseal(section: &mut [u8]) {
    let end = section.len() - 4;
    let crc = crc32fast::hash(&section[..end]);
    section[end..].copy_from_slice(&crc.to_le_bytes());
}

#[test]
fn round_trip_with_each_codec() {
    for c in Compression::ALL {
        let mut f = filled(all_groups(), c, 5_000);
        let expected = content_of(&f.backend, f.count, f.session);
        assert_eq!(f.backend.compression(), c);
        let w = written(&mut f.backend);
        let header = header_of(&w);
        assert_eq!(header.compression, c);
        let version = u16::from_le_bytes([w.1[4], w.1[5]]);
        let expected_version = if c == Compression::None {
            FORMAT_VERSION_V1
        } else {
            FORMAT_VERSION_V2
        };
        assert_eq!(version, expected_version, "{c}");

        // Restore reads any codec, whatever the restoring backend writes with.
        for own in Compression::ALL {
            let mut r =
                HeapKeyedStateBackend::<String>::new(MAX_P, all_groups()).with_compression(own);
            restore_whole(&mut r, &w).unwrap();
            assert_eq!(
                content(&mut r),
                expected,
                "written with {c}, restored by {own}"
            );
            // And the restored backend writes the same state again, with its own codec.
            let again = written(&mut r);
            assert_eq!(header_of(&again).compression, own);
            let mut r2 = HeapKeyedStateBackend::<String>::new(MAX_P, all_groups());
            restore_whole(&mut r2, &again).unwrap();
            assert_eq!(content(&mut r2), expected);
        }
    }
}

#[test]
fn restored_but_unregistered_states_are_carried_into_compressed_snapshots() {
    let mut f = filled(all_groups(), Compression::Zstd, 2_000);
    let expected = content_of(&f.backend, f.count, f.session);
    let w = written(&mut f.backend);
    let mut r = HeapKeyedStateBackend::<String>::new(MAX_P, all_groups())
        .with_compression(Compression::Lz4);
    restore_whole(&mut r, &w).unwrap();
    assert_eq!(r.pending_state_names(), vec!["count", "session"]);
    let carried = written(&mut r);
    assert_eq!(header_of(&carried).compression, Compression::Lz4);
    let mut r2 = HeapKeyedStateBackend::<String>::new(MAX_P, all_groups());
    restore_whole(&mut r2, &carried).unwrap();
    assert_eq!(content(&mut r2), expected);
}

#[test]
fn partial_restore_by_key_group_range_with_compression() {
    for c in [Compression::Lz4, Compression::Zstd] {
        let mut f = filled(all_groups(), c, 20_000);
        let (all_counts, all_sessions) = content_of(&f.backend, f.count, f.session);
        let w = written(&mut f.backend);
        let mut seen = 0;
        for range in [
            KeyGroupRange::new(0, 42),
            KeyGroupRange::new(43, 85),
            KeyGroupRange::new(86, 127),
        ] {
            let mut r = HeapKeyedStateBackend::<String>::new(MAX_P, range);
            restore_range(&mut r, &w, range).unwrap();
            let (counts, sessions) = content(&mut r);
            let expected: BTreeMap<String, u64> = all_counts
                .iter()
                .filter(|(k, _)| range.contains(assign_to_key_group(*k, MAX_P)))
                .map(|(k, v)| (k.clone(), *v))
                .collect();
            assert!(!expected.is_empty());
            assert_eq!(counts, expected, "{c} {range}");
            for (k, v) in &sessions {
                assert_eq!(all_sessions.get(k), Some(v));
            }
            assert_eq!(sessions.len(), counts.len());
            seen += counts.len();
        }
        assert_eq!(seen, all_counts.len());
    }
}

#[test]
fn a_flipped_byte_in_a_compressed_section_names_its_key_group() {
    for c in [Compression::Lz4, Compression::Zstd] {
        let mut f = filled(all_groups(), c, 20_000);
        let w = written(&mut f.backend);
        let (kg, range) = first_compressed(&w);
        let mut damaged = w.clone();
        // Inside the compressed payload, the checksum left as it was.
        damaged.1[range.start + COMPRESSED_HEADER + (range.len() - COMPRESSED_HEADER - 4) / 2] ^=
            0x20;
        let mut r = HeapKeyedStateBackend::<String>::new(MAX_P, all_groups());
        let e = restore_whole(&mut r, &damaged).unwrap_err().to_string();
        assert!(
            e.contains(&format!("key group {kg}")) && e.contains("checksum"),
            "{c}: {e}"
        );
        assert!(
            r.pending_state_names().is_empty(),
            "a failed restore leaves nothing"
        );

        // A subtask that does not own that key group never reads it.
        let others = if kg == 0 {
            KeyGroupRange::new(1, MAX_P - 1)
        } else {
            KeyGroupRange::new(0, kg - 1)
        };
        let mut r = HeapKeyedStateBackend::<String>::new(MAX_P, others);
        restore_range(&mut r, &damaged, others).unwrap();
    }
}

#[test]
fn a_broken_payload_behind_a_valid_checksum_fails_in_the_decompressor_cleanly() {
    for c in [Compression::Lz4, Compression::Zstd] {
        let mut f = filled(all_groups(), c, 20_000);
        let w = written(&mut f.backend);
        let (kg, range) = first_compressed(&w);
        let payload = range.start + COMPRESSED_HEADER..range.end - 4;
        let forge = |edit: &dyn Fn(&mut [u8])| {
            let mut damaged = w.clone();
            edit(&mut damaged.1[payload.clone()]);
            reseal(&mut damaged.1[range.clone()]);
            let mut r = HeapKeyedStateBackend::<String>::new(MAX_P, all_groups());
            restore_whole(&mut r, &damaged).unwrap_err().to_string()
        };
        let name = format!("key group {kg}");
        let cannot = format!("{c} cannot decompress");

        // Garbage where the payload was.
        let e = forge(&|p| {
            for (i, b) in p.iter_mut().enumerate() {
                *b = (i as u8).wrapping_mul(151) ^ 0xa5;
            }
        });
        assert!(e.contains(&name) && e.contains(&cannot), "{c}: {e}");
        // The second half zeroed: the codec runs out of input, or its output is short.
        let e = forge(&|p| {
            let half = p.len() / 2;
            p[half..].fill(0);
        });
        assert!(e.contains(&name), "{c}: {e}");
        // The first bytes broken (zstd's magic, LZ4's first token).
        let e = forge(&|p| p[..4].fill(0xff));
        assert!(e.contains(&name) && e.contains(&cannot), "{c}: {e}");
    }
}

#[test]
fn a_section_compressed_with_another_codec_than_the_header_names_is_refused() {
    let mut f = filled(all_groups(), Compression::Lz4, 20_000);
    let w = written(&mut f.backend);
    let (kg, _) = first_compressed(&w);
    let mut header = header_of(&w);
    header.compression = Compression::Zstd;
    let forged = header.encode().unwrap();
    assert_eq!(forged.len() as u64, w.0.header.1, "same header length");
    let mut damaged = w.clone();
    damaged.1[..forged.len()].copy_from_slice(&forged);
    let mut r = HeapKeyedStateBackend::<String>::new(MAX_P, all_groups());
    let e = restore_whole(&mut r, &damaged).unwrap_err().to_string();
    assert!(
        e.contains(&format!("key group {kg}")) && e.contains("lz4") && e.contains("zstd"),
        "{e}"
    );
}

/// The stream the writer produced before compression existed (format version 1), for four key
/// groups of max parallelism 4: keys "a" to "e" in a `u64` state "count" (`i * 7`), and "a",
/// "c", "e" in a `String` state "label" (`label-{key}`). Key group 3 is empty.
const V1_STREAM: &str = "574b5348010000006600000000000000000304020005636f756e740576616c756515616c\
6c6f633a3a737472696e673a3a537472696e67037536340102056c6162656c0576616c756515616c6c6f633a3a73747269\
6e673a3a537472696e6715616c6c6f633a3a737472696e673a3a537472696e67016121c50f000000000200000002000000\
060000000000000001641501651c0100010000000a000000000000000165076c6162656c2d65857bff1901000000020000\
000100000003000000000000000161000100010000000a000000000000000161076c6162656c2d61adc132140200000002\
00000002000000060000000000000001620701630e0100010000000a000000000000000163076c6162656c2d6368b56f2e\
0300000000000dd35637";

fn v1_stream() -> Vec<u8> {
    (0..V1_STREAM.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&V1_STREAM[i..i + 2], 16).unwrap())
        .collect()
}

fn v1_handle() -> KeyedStateHandle {
    KeyedStateHandle {
        key_group_range: KeyGroupRange::new(0, 3),
        header: (0, 122),
        offsets: vec![122, 176, 227, 281],
        end: 291,
        stream: StreamStateHandle::Inline(Vec::new()),
    }
}

#[test]
fn a_version_1_snapshot_of_the_old_writer_is_still_restored() {
    let w = (v1_handle(), v1_stream());
    assert_eq!(w.1.len(), 291);
    assert_eq!(header_of(&w).compression, Compression::None);
    for own in Compression::ALL {
        let mut r =
            HeapKeyedStateBackend::<String>::new(4, KeyGroupRange::new(0, 3)).with_compression(own);
        restore_whole(&mut r, &w).unwrap();
        let count = r
            .value_state(&ValueStateDescriptor::<u64>::new("count"))
            .unwrap();
        let label = r
            .value_state(&ValueStateDescriptor::<String>::new("label"))
            .unwrap();
        let counts: BTreeMap<String, u64> =
            r.entries(count).map(|(k, v)| (k.clone(), *v)).collect();
        let labels: BTreeMap<String, String> = r
            .entries(label)
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let expected: BTreeMap<String, u64> = ["a", "b", "c", "d", "e"]
            .iter()
            .enumerate()
            .map(|(i, k)| (k.to_string(), i as u64 * 7))
            .collect();
        assert_eq!(counts, expected);
        let expected: BTreeMap<String, String> = ["a", "c", "e"]
            .iter()
            .map(|k| (k.to_string(), format!("label-{k}")))
            .collect();
        assert_eq!(labels, expected);
    }
}

#[test]
fn uncompressed_snapshots_are_still_written_as_version_1_byte_for_byte() {
    let mut b = HeapKeyedStateBackend::<String>::new(4, KeyGroupRange::new(0, 3));
    let count = b
        .value_state(&ValueStateDescriptor::<u64>::new("count"))
        .unwrap();
    let label = b
        .value_state(&ValueStateDescriptor::<String>::new("label"))
        .unwrap();
    for (i, k) in ["a", "b", "c", "d", "e"].iter().enumerate() {
        let k = k.to_string();
        let g = assign_to_key_group(&k, 4);
        b.update(count, &k, g, i as u64 * 7);
        if i % 2 == 0 {
            b.update(label, &k, g, format!("label-{k}"));
        }
    }
    let (handle, bytes) = written(&mut b);
    assert_eq!(bytes, v1_stream());
    assert_eq!(handle.offsets, v1_handle().offsets);
    assert_eq!(handle.end, v1_handle().end);
}

#[test]
fn equal_state_gives_byte_identical_compressed_snapshots() {
    for c in Compression::ALL {
        let mut a = filled(all_groups(), c, 3_000);
        // The same state, inserted in another order and through overwrites.
        let mut b = HeapKeyedStateBackend::<String>::new(MAX_P, all_groups());
        b.set_compression(c);
        let count = b
            .value_state(&ValueStateDescriptor::<u64>::new("count"))
            .unwrap();
        let session = b
            .value_state(&ValueStateDescriptor::<String>::new("session"))
            .unwrap();
        let (counts, sessions) = content_of(&a.backend, a.count, a.session);
        for (k, v) in counts.iter().rev() {
            let g = assign_to_key_group(k, MAX_P);
            b.update(count, k, g, v + 1);
            b.update(session, k, g, sessions[k].clone());
            b.update(count, k, g, *v);
        }
        assert_eq!(written(&mut a.backend).1, written(&mut b).1, "{c}");
    }
}

#[test]
fn tiny_sections_are_stored_uncompressed_in_a_compressed_snapshot() {
    for c in [Compression::Lz4, Compression::Zstd] {
        // One counter for a few keys: sections of a block of an entry or two, which no codec
        // shrinks.
        let mut b = HeapKeyedStateBackend::<String>::new(MAX_P, all_groups()).with_compression(c);
        let count = b
            .value_state(&ValueStateDescriptor::<u64>::new("count"))
            .unwrap();
        for i in 0..40u64 {
            let key = format!("k{i}");
            let kg = assign_to_key_group(&key, MAX_P);
            b.update(count, &key, kg, i);
        }
        let w = written(&mut b);
        assert_eq!(header_of(&w).compression, c);
        let part = format::whole_stream_part(&w.0, &w.1).unwrap();
        let mut blocks = 0;
        for (kg, bytes) in format::part_sections(&part, &all_groups()).unwrap() {
            let section = format::parse_section(kg, bytes).unwrap();
            assert_eq!(
                section.compression(),
                Compression::None,
                "{c}: key group {kg}"
            );
            blocks += section.len();
        }
        assert!(blocks > 0);
        // The same sections as an uncompressed snapshot's: only the header differs.
        let mut plain = HeapKeyedStateBackend::<String>::new(MAX_P, all_groups());
        let plain_count = plain
            .value_state(&ValueStateDescriptor::<u64>::new("count"))
            .unwrap();
        for (k, v) in b.entries(count) {
            plain.update(plain_count, k, assign_to_key_group(k, MAX_P), *v);
        }
        let p = written(&mut plain);
        assert_eq!(w.1[w.0.header.1 as usize..], p.1[p.0.header.1 as usize..]);

        let mut r = HeapKeyedStateBackend::<String>::new(MAX_P, all_groups());
        restore_whole(&mut r, &w).unwrap();
        let restored = r
            .value_state(&ValueStateDescriptor::<u64>::new("count"))
            .unwrap();
        assert_eq!(r.entries(restored).count(), 40);
    }
}

#[test]
fn compression_shrinks_compressible_state() {
    let mut sizes = BTreeMap::new();
    for c in Compression::ALL {
        let mut f = filled(all_groups(), c, 100_000);
        let w = written(&mut f.backend);
        sizes.insert(c.to_string(), w.1.len());
    }
    let raw = sizes["none"] as f64;
    let (lz4, zstd) = (sizes["lz4"] as f64 / raw, sizes["zstd"] as f64 / raw);
    println!(
        "100k keys: none {} bytes, lz4 {} ({lz4:.3}), zstd {} ({zstd:.3})",
        sizes["none"], sizes["lz4"], sizes["zstd"]
    );
    // Measured: lz4 0.185, zstd 0.107 of the uncompressed snapshot.
    assert!(lz4 < 0.3, "lz4 ratio {lz4:.3}");
    assert!(zstd < 0.2, "zstd ratio {zstd:.3}");
    assert!(zstd < lz4, "zstd {zstd:.3} should beat lz4 {lz4:.3}");
}

#[test]
fn compression_setting_parses_displays_and_serializes_as_its_name() {
    for (c, name) in [
        (Compression::None, "none"),
        (Compression::Lz4, "lz4"),
        (Compression::Zstd, "zstd"),
    ] {
        assert_eq!(c.to_string(), name);
        assert_eq!(name.parse::<Compression>().unwrap(), c);
        let json = serde_json::to_string(&c).unwrap();
        assert_eq!(json, format!("\"{name}\""));
        assert_eq!(serde_json::from_str::<Compression>(&json).unwrap(), c);
    }
    assert!("snappy".parse::<Compression>().is_err());
    assert!(serde_json::from_str::<Compression>("\"snappy\"").is_err());
    assert_eq!(Compression::default(), Compression::None);
    let b = HeapKeyedStateBackend::<String>::new(MAX_P, all_groups());
    assert_eq!(b.compression(), Compression::None, "off by default");
}
