//! What a state file says it is: the identity frame at the head of every state file Weir
//! writes, and the digest a handle records of a file's bytes.
//!
//! A state file (keyed, operator, channel state, an incremental link) is
//! `identity frame | payload`, where the payload is the file's own format (the keyed snapshot
//! format, operator state, channel state) and the frame is a [`crate::codec`] envelope (magic
//! `WFID`, version 1) around a postcard [`FileIdentity`]: the job, the checkpoint, the operator,
//! the subtask and its key groups, the kind and the payload's format version. A file copied in
//! from another checkpoint, job, operator or subtask still passes its own checksums; its frame
//! tells it apart, and [`FileIdentity::check`] names the difference.
//!
//! The frame is written by the runtime around what a backend serialized, so backends know
//! nothing of it; a keyed handle's offsets count from the start of the file, frame included.

use crate::CoreError;
use crate::element::SnapshotKind;
use crate::ids::{CheckpointId, JobId, OperatorId, SubtaskIndex};
use crate::keygroup::KeyGroupRange;
use serde::{Deserialize, Serialize};
use std::fmt;

/// Magic bytes of an identity frame.
pub const IDENTITY_MAGIC: [u8; 4] = *b"WFID";
/// The identity frame version this build writes and reads.
pub const IDENTITY_VERSION: u16 = 1;
/// The largest identity frame a reader accepts: a frame is about 90 bytes, so anything longer
/// is damage, refused before it is read.
pub const MAX_IDENTITY_FRAME_LEN: u64 = 4096;

/// What a state file holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum StateFileKind {
    /// A self-contained keyed snapshot (the keyed snapshot format).
    Keyed,
    /// A link of an incremental chain (a full snapshot starting a chain, or a delta), stored as
    /// shared state.
    KeyedLink,
    /// Operator state (list, union, broadcast).
    Operator,
    /// The in-flight data of an unaligned checkpoint.
    ChannelState,
    /// A file of a backend's native snapshot (the disk backend's run), shared.
    NativeFile,
    /// The manifest of a backend's native snapshot.
    NativeManifest,
}

impl fmt::Display for StateFileKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            StateFileKind::Keyed => "keyed state",
            StateFileKind::KeyedLink => "incremental keyed state",
            StateFileKind::Operator => "operator state",
            StateFileKind::ChannelState => "channel state",
            StateFileKind::NativeFile => "native keyed state file",
            StateFileKind::NativeManifest => "native keyed state manifest",
        })
    }
}

/// Whom a state file belongs to. Written at the head of the file, checked on every read.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileIdentity {
    /// The job (one run of it: every run gets a fresh id).
    pub job_id: JobId,
    /// The checkpoint or savepoint that wrote the file.
    pub checkpoint_id: CheckpointId,
    /// Checkpoint or savepoint.
    pub snapshot: SnapshotKind,
    /// The operator whose state it is; for channel state, the head operator of the chain.
    pub operator_id: OperatorId,
    /// The subtask that wrote it.
    pub subtask: SubtaskIndex,
    /// The key groups of a keyed file; `None` for operator and channel state.
    pub key_groups: Option<KeyGroupRange>,
    /// What the payload is.
    pub kind: StateFileKind,
    /// For a link of an incremental chain that is a delta: the checkpoint whose link it builds
    /// on (the chain's previous link). `None` for everything else.
    pub base: Option<CheckpointId>,
    /// The payload's own format version (read from its header when the file was written).
    pub format_version: u16,
}

impl fmt::Display for FileIdentity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} of job {}, {} {}, operator {}, subtask {}",
            self.kind,
            self.job_id,
            snapshot_word(self.snapshot),
            self.checkpoint_id.0,
            self.operator_id,
            self.subtask
        )?;
        if let Some(r) = self.key_groups {
            write!(f, ", key groups {r}")?;
        }
        if let Some(b) = self.base {
            write!(f, ", a delta on checkpoint {}", b.0)?;
        }
        Ok(())
    }
}

fn snapshot_word(kind: SnapshotKind) -> &'static str {
    match kind {
        SnapshotKind::Checkpoint => "checkpoint",
        SnapshotKind::Savepoint | SnapshotKind::SynchronousSavepoint => "savepoint",
    }
}

/// What a reader expects of a file's identity: everything a handle and its `_metadata` imply.
/// The payload's format version is the payload's own business and is not compared.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExpectedIdentity {
    /// The job of the `_metadata` that references the file.
    pub job_id: JobId,
    /// The checkpoint that wrote the file: the `_metadata`'s own for its files, the link's for a
    /// link of an incremental chain.
    pub checkpoint_id: CheckpointId,
    /// The operator.
    pub operator_id: OperatorId,
    /// The subtask.
    pub subtask: SubtaskIndex,
    /// The key groups the handle says the file covers.
    pub key_groups: Option<KeyGroupRange>,
    /// What the handle says the file holds.
    pub kind: StateFileKind,
}

impl FileIdentity {
    /// The frame: an envelope around this identity, to be written before the payload.
    pub fn frame(&self) -> Result<Vec<u8>, CoreError> {
        let payload = crate::codec::encode("file identity", self)?;
        Ok(crate::codec::seal(
            IDENTITY_MAGIC,
            IDENTITY_VERSION,
            &payload,
        ))
    }

    /// Checks this identity against what the reader expects, naming every difference.
    pub fn check(&self, expected: &ExpectedIdentity) -> Result<(), String> {
        let mut diffs = Vec::new();
        if self.job_id != expected.job_id {
            diffs.push(format!(
                "job {} (expected {})",
                self.job_id, expected.job_id
            ));
        }
        if self.checkpoint_id != expected.checkpoint_id {
            diffs.push(format!(
                "{} {} (expected {})",
                snapshot_word(self.snapshot),
                self.checkpoint_id.0,
                expected.checkpoint_id.0
            ));
        }
        if self.operator_id != expected.operator_id {
            diffs.push(format!(
                "operator {} (expected {})",
                self.operator_id, expected.operator_id
            ));
        }
        if self.subtask != expected.subtask {
            diffs.push(format!(
                "subtask {} (expected {})",
                self.subtask, expected.subtask
            ));
        }
        if self.key_groups != expected.key_groups {
            let show = |r: Option<KeyGroupRange>| r.map_or("none".to_string(), |r| r.to_string());
            diffs.push(format!(
                "key groups {} (expected {})",
                show(self.key_groups),
                show(expected.key_groups)
            ));
        }
        if self.kind != expected.kind {
            diffs.push(format!("{} (expected {})", self.kind, expected.kind));
        }
        if diffs.is_empty() {
            Ok(())
        } else {
            Err(format!(
                "the file belongs elsewhere: it is {self}; it differs in {}",
                diffs.join(", ")
            ))
        }
    }
}

/// The length of the frame at the head of `prefix`, read from its envelope header (the first
/// [`crate::codec::ENVELOPE_HEADER_LEN`] bytes suffice), refused when it is not a frame or
/// longer than [`MAX_IDENTITY_FRAME_LEN`].
pub fn frame_len(prefix: &[u8]) -> Result<u64, CoreError> {
    let corrupt = |reason: String| CoreError::Corrupt {
        what: "identity frame".to_string(),
        reason,
    };
    if prefix.len() < crate::codec::ENVELOPE_HEADER_LEN {
        return Err(corrupt(format!(
            "truncated: {} bytes is shorter than the frame's {}-byte header",
            prefix.len(),
            crate::codec::ENVELOPE_HEADER_LEN
        )));
    }
    if prefix[0..4] != IDENTITY_MAGIC {
        return Err(corrupt(format!(
            "bad magic {:?}, expected \"WFID\": the file has no identity frame",
            String::from_utf8_lossy(&prefix[0..4])
        )));
    }
    let mut len8 = [0u8; 8];
    len8.copy_from_slice(&prefix[8..16]);
    let payload = u64::from_le_bytes(len8);
    let total = payload.saturating_add(
        (crate::codec::ENVELOPE_HEADER_LEN + crate::codec::ENVELOPE_TRAILER_LEN) as u64,
    );
    if total > MAX_IDENTITY_FRAME_LEN {
        return Err(corrupt(format!(
            "the frame claims {total} bytes, more than the {MAX_IDENTITY_FRAME_LEN} a frame may have"
        )));
    }
    Ok(total)
}

/// Splits a framed file into its identity and the offset of its payload, checking the frame's
/// envelope (magic, version, length, checksum).
pub fn open_frame(bytes: &[u8]) -> Result<(FileIdentity, usize), CoreError> {
    let len = frame_len(bytes)?;
    // At most MAX_IDENTITY_FRAME_LEN, so it fits in usize.
    let len = len as usize;
    let Some(frame) = bytes.get(..len) else {
        return Err(CoreError::Corrupt {
            what: "identity frame".to_string(),
            reason: format!(
                "truncated: the frame claims {len} bytes, the file has {}",
                bytes.len()
            ),
        });
    };
    let (_, payload) =
        crate::codec::open("identity frame", IDENTITY_MAGIC, &[IDENTITY_VERSION], frame)?;
    let identity = crate::codec::decode("identity frame", payload)?;
    Ok((identity, len))
}

/// A digest of a file's bytes: xxh3-128, so different contents give different digests (unlike
/// a CRC over a file that ends in its own CRC, which is the same residue for every file).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Digest(pub [u8; 16]);

impl Digest {
    /// The digest of `bytes`.
    pub fn of(bytes: &[u8]) -> Digest {
        Digest(xxhash_rust::xxh3::xxh3_128(bytes).to_le_bytes())
    }
}

/// The [`Digest`] of bytes that arrive in pieces (a file read in ranges): the same value as
/// [`Digest::of`] over their concatenation.
#[derive(Clone)]
pub struct DigestHasher(xxhash_rust::xxh3::Xxh3Default);

impl Default for DigestHasher {
    fn default() -> DigestHasher {
        DigestHasher::new()
    }
}

impl DigestHasher {
    /// A hasher that has seen nothing.
    pub fn new() -> DigestHasher {
        DigestHasher(xxhash_rust::xxh3::Xxh3Default::new())
    }

    /// Adds the next piece.
    pub fn update(&mut self, bytes: &[u8]) {
        self.0.update(bytes);
    }

    /// The digest of everything added.
    pub fn finish(&self) -> Digest {
        Digest(self.0.digest128().to_le_bytes())
    }
}

impl fmt::Debug for DigestHasher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("DigestHasher")
    }
}

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for b in self.0.iter().rev() {
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Digest({self})")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_digest_in_pieces_is_the_digest_of_the_whole() {
        let bytes: Vec<u8> = (0..100_000u32).map(|i| (i * 31 % 251) as u8).collect();
        for piece in [1, 7, 4096, 99_999, 200_000] {
            let mut h = DigestHasher::new();
            for chunk in bytes.chunks(piece) {
                h.update(chunk);
            }
            assert_eq!(h.finish(), Digest::of(&bytes), "pieces of {piece}");
        }
        assert_ne!(DigestHasher::new().finish(), Digest::of(&bytes));
    }

    fn identity() -> FileIdentity {
        FileIdentity {
            job_id: JobId(7),
            checkpoint_id: CheckpointId(24),
            snapshot: SnapshotKind::Checkpoint,
            operator_id: OperatorId::from_uid("sum"),
            subtask: 1,
            key_groups: Some(KeyGroupRange::new(64, 127)),
            kind: StateFileKind::Keyed,
            base: None,
            format_version: 1,
        }
    }

    fn expected(i: &FileIdentity) -> ExpectedIdentity {
        ExpectedIdentity {
            job_id: i.job_id,
            checkpoint_id: i.checkpoint_id,
            operator_id: i.operator_id,
            subtask: i.subtask,
            key_groups: i.key_groups,
            kind: i.kind,
        }
    }

    #[test]
    fn frame_round_trips_and_names_its_length() {
        let id = identity();
        let mut file = id.frame().unwrap();
        let len = file.len();
        file.extend_from_slice(b"payload");
        assert_eq!(frame_len(&file[..16]).unwrap(), len as u64);
        let (back, offset) = open_frame(&file).unwrap();
        assert_eq!((back, offset), (id, len));
    }

    #[test]
    fn check_names_every_difference() {
        let id = identity();
        assert!(id.check(&expected(&id)).is_ok());
        let mut other = expected(&id);
        other.checkpoint_id = CheckpointId(23);
        other.subtask = 0;
        let e = id.check(&other).unwrap_err();
        assert!(e.contains("checkpoint 24 (expected 23)"), "{e}");
        assert!(e.contains("subtask 1 (expected 0)"), "{e}");
        let mut other = expected(&id);
        other.job_id = JobId(8);
        other.operator_id = OperatorId::from_uid("map");
        other.key_groups = Some(KeyGroupRange::new(0, 63));
        other.kind = StateFileKind::KeyedLink;
        let e = id.check(&other).unwrap_err();
        for needle in [
            "job ",
            "operator ",
            "key groups [64, 127]",
            "incremental keyed state",
        ] {
            assert!(e.contains(needle), "{needle} not in {e}");
        }
    }

    #[test]
    fn damaged_frames_are_refused() {
        let file = identity().frame().unwrap();
        assert!(frame_len(b"WKSH0000000000000000").is_err());
        assert!(open_frame(&file[..file.len() - 1]).is_err());
        let mut flipped = file.clone();
        flipped[20] ^= 1;
        assert!(open_frame(&flipped).is_err());
        let mut huge = file.clone();
        huge[8..16].copy_from_slice(&u64::MAX.to_le_bytes());
        let e = open_frame(&huge).unwrap_err().to_string();
        assert!(e.contains("more than"), "{e}");
    }

    #[test]
    fn digests_differ_where_crc_residues_agree() {
        let a = crate::codec::seal(*b"TEST", 1, b"one");
        let b = crate::codec::seal(*b"TEST", 1, b"two");
        assert_eq!(crc32fast::hash(&a), crc32fast::hash(&b));
        assert_ne!(Digest::of(&a), Digest::of(&b));
        assert_eq!(Digest::of(&a), Digest::of(&a.clone()));
        assert_eq!(Digest::of(b"").to_string().len(), 32);
    }
}
