//! The TCP frames target: the TCP transport's frame reader and per-frame checks, on mutated
//! byte streams of either direction, then each element a data or priority frame carries
//! decoded by the channel's `ElementCodec`, as the receiving channel does.
//!
//! Mutations work on the frames (type, channel, payload, order) and encode them again with the
//! transport's own frame encoder, so lengths and checksums hold and the checks behind them are
//! reached; or on the encoded stream (lengths, checksums, truncation).

use crate::harness::{Target, hex};
use crate::mutate;
use crate::rng::Rng;
use weir_core::element::{CheckpointBarrier, CheckpointOptions, Event, StreamElement, Watermark};
use weir_core::ids::{CheckpointId, EdgeId};
use weir_network::tcp::fuzzing::{self, KINDS, Reader};
use weir_network::{AnyElement, ChannelId, ElementCodec};

/// The frame reader of either end.
pub struct Tcp;

/// One frame before encoding.
#[derive(Clone, Debug)]
pub struct Frame {
    /// Its type.
    pub kind: u8,
    /// Its channel.
    pub channel: ChannelId,
    /// Its payload.
    pub payload: Vec<u8>,
}

/// What one end reads on a connection.
#[derive(Clone, Debug)]
pub struct Input {
    /// Which end reads.
    pub reader: Reader,
    /// The frames, until a mutation of the encoded stream.
    pub frames: Option<Vec<Frame>>,
    /// The stream.
    pub bytes: Vec<u8>,
}

type Record = (String, i64);

fn kind(name: &str) -> u8 {
    KINDS
        .iter()
        .find(|(n, _)| *n == name)
        .map_or(0, |(_, k)| *k)
}

fn channel(generation: u64, consumer: u32) -> ChannelId {
    ChannelId {
        generation,
        edge: EdgeId(1),
        producer: 0,
        consumer,
    }
}

fn frame(name: &str, channel: ChannelId, payload: Vec<u8>) -> Frame {
    Frame {
        kind: kind(name),
        channel,
        payload,
    }
}

/// An element encoded as the producer's channel encodes it.
fn element(e: StreamElement<Record>) -> Vec<u8> {
    let mut out = Vec::new();
    let any: AnyElement = Box::new(e);
    // Encoding a plain element cannot fail; an empty payload would only make a weaker seed.
    let _ = (ElementCodec::of::<Record>().encode)(&any, &mut out);
    out
}

fn encode(frames: &[Frame]) -> Vec<u8> {
    frames
        .iter()
        .flat_map(|f| fuzzing::encode_frame(f.kind, &f.channel, &f.payload))
        .collect()
}

fn input(reader: Reader, frames: Vec<Frame>) -> Input {
    Input {
        reader,
        bytes: encode(&frames),
        frames: Some(frames),
    }
}

fn build_seeds() -> Vec<Input> {
    let hello = fuzzing::hello_payload("127.0.0.1:6121".parse().expect("an address"));
    let hello6 = fuzzing::hello_payload("[::]:6122".parse().expect("an address"));
    let none = channel(0, 0);
    let barrier = StreamElement::Event(Event::Barrier(CheckpointBarrier {
        id: CheckpointId(4),
        timestamp_ms: 1_700_000_000_000,
        options: CheckpointOptions::ALIGNED_CHECKPOINT,
    }));
    let batch = StreamElement::Batch(vec![("word".to_string(), 3), ("other".to_string(), -1)]);
    vec![
        input(
            Reader::Producer,
            vec![
                frame("hello", none, hello),
                frame("request", channel(2, 0), 8u32.to_le_bytes().to_vec()),
                frame("request", channel(2, 1), 2u32.to_le_bytes().to_vec()),
                frame("credit", channel(2, 0), 3u32.to_le_bytes().to_vec()),
                frame("cancel", channel(2, 1), Vec::new()),
            ],
        ),
        input(Reader::Producer, vec![frame("hello", none, hello6)]),
        input(
            Reader::Consumer,
            vec![
                frame("data", channel(2, 0), element(batch.clone())),
                frame(
                    "data",
                    channel(2, 0),
                    element(StreamElement::Event(Event::Watermark(Watermark(99)))),
                ),
                frame(
                    "priority",
                    channel(2, 0),
                    fuzzing::priority_payload(2, &element(barrier)),
                ),
                frame("data", channel(2, 1), element(batch)),
                frame("end", channel(2, 0), Vec::new()),
                frame(
                    "error",
                    channel(2, 1),
                    b"the channel was requested twice".to_vec(),
                ),
            ],
        ),
        input(Reader::Consumer, Vec::new()),
    ]
}

/// Reads the stream as its end does, and decodes every element it carries.
fn read(input: &Input) -> Result<(), String> {
    let codec = ElementCodec::of::<Record>();
    for f in fuzzing::read_frames(&input.bytes, input.reader)? {
        if let Some(bytes) = &f.element {
            (codec.decode)(bytes)?;
        }
    }
    Ok(())
}

fn mutate_frames(rng: &mut Rng, frames: &mut Vec<Frame>, corpus: &[Input]) {
    let others: Vec<&Frame> = corpus
        .iter()
        .filter_map(|i| i.frames.as_ref())
        .flatten()
        .collect();
    let n = frames.len();
    match rng.below(10) {
        0 if n > 0 => {
            frames.remove(rng.below(n));
        }
        1 => {
            if let Some(&f) = rng.pick(&others) {
                frames.insert(rng.below(n + 1), f.clone());
            }
        }
        2 if n > 1 => frames.swap(rng.below(n), rng.below(n)),
        _ if n > 0 => {
            let f = &mut frames[rng.below(n)];
            match rng.below(6) {
                0 => {
                    f.kind = match rng.pick(&KINDS) {
                        Some(&(_, k)) if rng.percent(80) => k,
                        _ => rng.byte(),
                    }
                }
                1 => f.channel.generation ^= 1 << rng.below(64),
                2 => f.channel.consumer = rng.next_u64() as u32,
                _ => {
                    let donors: Vec<&[u8]> = others.iter().map(|o| o.payload.as_slice()).collect();
                    mutate::bytes(rng, &mut f.payload, &donors);
                }
            }
        }
        _ => {}
    }
}

impl Target for Tcp {
    type Input = Input;

    fn name(&self) -> &'static str {
        "tcp"
    }

    fn seeds(&self) -> Vec<Input> {
        build_seeds()
    }

    fn mutate(&self, input: &mut Input, corpus: &[Input], rng: &mut Rng) {
        match input.frames.as_mut() {
            Some(frames) if rng.percent(70) => mutate_frames(rng, frames, corpus),
            _ => {
                self.finish(input);
                input.frames = None;
                let donors: Vec<&[u8]> = corpus.iter().map(|i| i.bytes.as_slice()).collect();
                mutate::bytes(rng, &mut input.bytes, &donors);
            }
        }
    }

    fn finish(&self, input: &mut Input) {
        if let Some(frames) = &input.frames {
            input.bytes = encode(frames);
        }
    }

    fn run(&self, input: &Input) -> Result<(), String> {
        read(input)
    }

    fn describe(&self, input: &Input) -> String {
        format!("read by the {:?} end: {}", input.reader, hex(&input.bytes))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_seed_reads_back() {
        let seeds = build_seeds();
        assert_eq!(seeds.len(), 4);
        for s in &seeds {
            read(s).unwrap();
        }
    }
}
