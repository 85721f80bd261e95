//! The identity-frame target: `identity::frame_len` on a file's first bytes and `open_frame` on
//! the whole (the frame at the head of every state file), then what a reader does next: check
//! the identity against what `_metadata` implies, and name it.

use crate::harness::{Target, hex};
use crate::mutate;
use crate::rng::Rng;
use weir_core::codec::ENVELOPE_HEADER_LEN;
use weir_core::element::SnapshotKind;
use weir_core::identity::{
    ExpectedIdentity, FileIdentity, IDENTITY_VERSION, StateFileKind, frame_len, open_frame,
};
use weir_core::ids::{CheckpointId, JobId, OperatorId};
use weir_core::keygroup::KeyGroupRange;

/// The identity frame of state files.
pub struct Identity;

fn identities() -> Vec<FileIdentity> {
    let base = FileIdentity {
        job_id: JobId(0x0123_4567_89ab_cdef_0011_2233_4455_6677),
        checkpoint_id: CheckpointId(42),
        snapshot: SnapshotKind::Checkpoint,
        operator_id: OperatorId::from_uid("sum"),
        subtask: 1,
        key_groups: Some(KeyGroupRange::new(64, 127)),
        kind: StateFileKind::Keyed,
        base: None,
        format_version: 2,
    };
    vec![
        base.clone(),
        FileIdentity {
            kind: StateFileKind::KeyedLink,
            base: Some(CheckpointId(41)),
            format_version: 3,
            ..base.clone()
        },
        FileIdentity {
            kind: StateFileKind::Operator,
            key_groups: None,
            subtask: 0,
            ..base.clone()
        },
        FileIdentity {
            kind: StateFileKind::ChannelState,
            key_groups: None,
            snapshot: SnapshotKind::Savepoint,
            checkpoint_id: CheckpointId(u64::MAX),
            ..base
        },
    ]
}

/// A framed file: the frame, then a few payload bytes.
fn framed(identity: &FileIdentity) -> Option<Vec<u8>> {
    let mut bytes = identity.frame().ok()?;
    bytes.extend_from_slice(b"payload after the frame");
    Some(bytes)
}

fn build_seeds() -> Vec<Vec<u8>> {
    identities().iter().filter_map(framed).collect()
}

/// What the reader of a file expects: the first seed's identity.
fn expected() -> ExpectedIdentity {
    let i = &identities()[0];
    ExpectedIdentity {
        job_id: i.job_id,
        checkpoint_id: i.checkpoint_id,
        operator_id: i.operator_id,
        subtask: i.subtask,
        key_groups: i.key_groups,
        kind: i.kind,
    }
}

/// Reads the frame as the runtime does: its length from the header, then the whole frame, then
/// the check against what `_metadata` implies, and its description.
fn read(bytes: &[u8]) -> Result<(), String> {
    let header = &bytes[..bytes.len().min(ENVELOPE_HEADER_LEN)];
    let len = frame_len(header).map_err(|e| e.to_string())?;
    let (identity, payload_at) = open_frame(bytes).map_err(|e| e.to_string())?;
    // A frame that opens must say where its payload starts, inside the file: anything else is
    // a decoder bug, which the harness reports as a panic.
    assert!(
        payload_at as u64 == len && payload_at <= bytes.len(),
        "the frame's payload offset {payload_at} disagrees with its length {len}"
    );
    let _ = identity.to_string();
    // A frame that decodes is the decoder's success whether or not it is the expected file:
    // naming the difference is the reader's next step, and must not panic either.
    let _ = identity.check(&expected());
    Ok(())
}

impl Target for Identity {
    type Input = Vec<u8>;

    fn name(&self) -> &'static str {
        "identity"
    }

    fn seeds(&self) -> Vec<Vec<u8>> {
        build_seeds()
    }

    fn mutate(&self, input: &mut Vec<u8>, corpus: &[Vec<u8>], rng: &mut Rng) {
        let donors: Vec<&[u8]> = corpus.iter().map(Vec::as_slice).collect();
        mutate::enveloped(rng, input, &donors, &[IDENTITY_VERSION]);
    }

    fn run(&self, input: &Vec<u8>) -> Result<(), String> {
        read(input)
    }

    fn describe(&self, input: &Vec<u8>) -> String {
        format!("file {}", hex(input))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_seed_is_what_the_reader_expects_and_the_others_are_named_apart() {
        let seeds = build_seeds();
        assert_eq!(seeds.len(), 4);
        for s in &seeds {
            read(s).unwrap();
        }
        let ids = identities();
        ids[0].check(&expected()).unwrap();
        for i in &ids[1..] {
            let e = i.check(&expected()).unwrap_err();
            assert!(e.contains("belongs elsewhere"), "{e}");
        }
        assert!(read(&seeds[0][..10]).is_err());
        assert!(read(b"not a frame at all, just bytes").is_err());
    }
}
