//! The codec target: `codec::open` (the versioned, checksummed envelope of every file) and
//! `codec::decode` / `decode_prefix` of the postcard values those files and messages carry.

use crate::harness::{Target, hex};
use crate::mutate;
use crate::rng::Rng;
use weir_core::channel_state::{ChannelDirection, ChannelInfo, ChannelSectionSummary};
use weir_core::codec;
use weir_core::element::{CheckpointBarrier, CheckpointOptions, Event, StreamElement, Watermark};
use weir_core::handle::{
    KeyedStateHandle, OperatorStateHandle, OperatorStateMode, OperatorSubtaskState,
    StreamStateHandle, TaskStateSnapshot,
};
use weir_core::ids::{CheckpointId, OperatorId};
use weir_core::keygroup::KeyGroupRange;

/// The envelope, and the postcard values inside it.
pub struct Codec;

/// What an envelope's payload holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Payload {
    /// A stream element of `(String, i64)` records.
    Element,
    /// A task's state snapshot (what an acknowledgement carries).
    TaskState,
    /// Keyed state handles.
    Handles,
    /// A key-group range and channel section summaries.
    Summaries,
}

/// The magic and versions every sealed seed uses.
const MAGIC: [u8; 4] = *b"WFZZ";
const VERSIONS: [u16; 2] = [1, 2];

/// One sealed value.
#[derive(Clone, Debug)]
pub struct Input {
    /// What it holds.
    pub payload: Payload,
    /// The envelope.
    pub bytes: Vec<u8>,
}

fn task_state() -> TaskStateSnapshot {
    let mut state = TaskStateSnapshot::default();
    state.operators.insert(
        OperatorId::from_uid("sum"),
        OperatorSubtaskState {
            keyed: handles(),
            operator: vec![OperatorStateHandle {
                states: vec![("offsets".to_string(), OperatorStateMode::Union)],
                stream: StreamStateHandle::Inline(vec![5; 9]),
            }],
            native: Vec::new(),
        },
    );
    state
}

fn handles() -> Vec<KeyedStateHandle> {
    vec![KeyedStateHandle {
        key_group_range: KeyGroupRange::new(2, 5),
        header: (0, 40),
        offsets: vec![40, 50, 60, 70],
        end: 80,
        stream: StreamStateHandle::File {
            path: "shared/sum-0-1".to_string(),
            size: 80,
            digest: weir_core::identity::Digest([7; 16]),
        },
    }]
}

fn summaries() -> (KeyGroupRange, Vec<ChannelSectionSummary>) {
    let channel = ChannelInfo {
        from: OperatorId::from_uid("a"),
        to: OperatorId::from_uid("b"),
        producer: 1,
        consumer: 2,
    };
    (
        KeyGroupRange::new(0, 127),
        vec![ChannelSectionSummary {
            direction: ChannelDirection::Output,
            channel,
            records: 10,
            bytes: 200,
        }],
    )
}

fn sealed<T: serde::Serialize>(payload: Payload, version: u16, value: &T) -> Option<Input> {
    let bytes = codec::seal(MAGIC, version, &codec::encode("seed", value).ok()?);
    Some(Input { payload, bytes })
}

fn build_seeds() -> Vec<Input> {
    let batch: StreamElement<(String, i64)> =
        StreamElement::Batch(vec![("a".to_string(), 1), ("bb".to_string(), -7)]);
    let barrier: StreamElement<(String, i64)> =
        StreamElement::Event(Event::Barrier(CheckpointBarrier {
            id: CheckpointId(9),
            timestamp_ms: 1_700_000_000_000,
            options: CheckpointOptions::ALIGNED_CHECKPOINT,
        }));
    let watermark: StreamElement<(String, i64)> =
        StreamElement::Event(Event::Watermark(Watermark::MAX));
    [
        sealed(Payload::Element, 1, &batch),
        sealed(Payload::Element, 2, &barrier),
        sealed(Payload::Element, 1, &watermark),
        sealed(Payload::TaskState, 2, &task_state()),
        sealed(Payload::TaskState, 1, &TaskStateSnapshot::default()),
        sealed(Payload::Handles, 1, &handles()),
        sealed(Payload::Summaries, 2, &summaries()),
    ]
    .into_iter()
    .flatten()
    .collect()
}

/// Opens the envelope and decodes its payload, whole and as a prefix, then reads what it holds.
fn open(input: &Input) -> Result<(), String> {
    let (_, payload) =
        codec::open("fuzz", MAGIC, &VERSIONS, &input.bytes).map_err(|e| e.to_string())?;
    let e = |e: weir_core::CoreError| e.to_string();
    match input.payload {
        Payload::Element => {
            let _: (StreamElement<(String, i64)>, &[u8]) =
                codec::decode_prefix("element", payload).map_err(e)?;
            let _: StreamElement<(String, i64)> = codec::decode("element", payload).map_err(e)?;
        }
        Payload::TaskState => {
            let s: TaskStateSnapshot = codec::decode("task state", payload).map_err(e)?;
            let _ = (s.state_size(), s.in_flight_size());
        }
        Payload::Handles => {
            let handles: Vec<KeyedStateHandle> = codec::decode("handles", payload).map_err(e)?;
            for h in &handles {
                let _ = h.byte_range_for(&KeyGroupRange::new(0, 3));
                let _ = h.offset_of(h.key_group_range.end);
            }
        }
        Payload::Summaries => {
            let (range, _): (KeyGroupRange, Vec<ChannelSectionSummary>) =
                codec::decode("summaries", payload).map_err(e)?;
            let _ = (range.len(), range.iter().take(4).count());
        }
    }
    Ok(())
}

impl Target for Codec {
    type Input = Input;

    fn name(&self) -> &'static str {
        "codec"
    }

    fn seeds(&self) -> Vec<Input> {
        build_seeds()
    }

    fn mutate(&self, input: &mut Input, corpus: &[Input], rng: &mut Rng) {
        let donors: Vec<&[u8]> = corpus
            .iter()
            .filter(|i| i.payload == input.payload)
            .map(|i| i.bytes.as_slice())
            .collect();
        mutate::enveloped(rng, &mut input.bytes, &donors, &VERSIONS);
    }

    fn run(&self, input: &Input) -> Result<(), String> {
        open(input)
    }

    fn describe(&self, input: &Input) -> String {
        format!(
            "payload {:?}, envelope {}",
            input.payload,
            hex(&input.bytes)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_seed_opens_and_decodes() {
        let seeds = build_seeds();
        assert_eq!(seeds.len(), 7);
        for s in &seeds {
            open(s).unwrap();
        }
    }
}
