//! The channel-state target: `decode_file` on mutated in-flight data files, then what a restore
//! does with each section: `verify` (the batch framing and record counts, before deployment)
//! and `batches` (the typed end decoding its records on replay).
//!
//! Mutations work on the sections (their batches' framing and records, counts, channels) and
//! encode the file again with the production encoder, or on the file's envelope and bytes.

use crate::harness::{Target, hex};
use crate::mutate;
use crate::rng::Rng;
use weir_core::channel_state::{
    CHANNEL_STATE_VERSION, ChannelDirection, ChannelInfo, ChannelSection, decode_file, encode_file,
};
use weir_core::element::{CheckpointBarrier, CheckpointOptions, StreamElement, Watermark};
use weir_core::ids::{CheckpointId, OperatorId};

/// `decode_file`, `verify` and `batches`.
pub struct ChannelState;

/// The record type of the channel the sections belong to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Records {
    /// `u64` records.
    Numbers,
    /// `(String, i64)` records, as a word count's keyed sum reads.
    Pairs,
    /// Stream elements of strings.
    Elements,
}

/// A channel-state file: its sections while mutations are structured, then its bytes.
#[derive(Clone, Debug)]
pub struct Input {
    /// What the channels carry.
    pub records: Records,
    /// The sections, until a mutation of the encoded file.
    pub sections: Option<Vec<ChannelSection>>,
    /// The file.
    pub bytes: Vec<u8>,
}

fn channel(producer: u32, consumer: u32) -> ChannelInfo {
    ChannelInfo {
        from: OperatorId::from_uid("source"),
        to: OperatorId::from_uid("sum"),
        producer,
        consumer,
    }
}

fn section<T: serde::Serialize>(
    direction: ChannelDirection,
    info: ChannelInfo,
    batches: &[Vec<T>],
) -> Option<ChannelSection> {
    let mut s = ChannelSection::new(direction, info);
    for b in batches {
        s.append_batch(b).ok()?;
    }
    Some(s)
}

fn input(records: Records, sections: Vec<Option<ChannelSection>>) -> Option<Input> {
    let sections: Vec<ChannelSection> = sections.into_iter().collect::<Option<_>>()?;
    let bytes = encode_file(&sections).ok()?;
    Some(Input {
        records,
        sections: Some(sections),
        bytes,
    })
}

fn build_seeds() -> Vec<Input> {
    let pairs: Vec<(String, i64)> = (0..12).map(|i| (format!("word{}", i % 5), i)).collect();
    let elements: Vec<StreamElement<String>> = vec![
        StreamElement::Batch(vec!["a".to_string(), "bb".to_string()]),
        StreamElement::Event(weir_core::element::Event::Watermark(Watermark(1_700))),
        StreamElement::Event(weir_core::element::Event::Barrier(CheckpointBarrier {
            id: CheckpointId(3),
            timestamp_ms: 1_700_000_000_000,
            options: CheckpointOptions::ALIGNED_CHECKPOINT,
        })),
    ];
    let seeds = [
        input(Records::Numbers, Vec::new()),
        input(
            Records::Numbers,
            vec![
                section(
                    ChannelDirection::Output,
                    channel(0, 1),
                    &[vec![1u64, 2, 3], vec![u64::MAX]],
                ),
                section::<u64>(ChannelDirection::Input, channel(1, 1), &[]),
            ],
        ),
        input(
            Records::Pairs,
            vec![
                section(
                    ChannelDirection::Input,
                    channel(0, 0),
                    &[pairs[..5].to_vec(), pairs[5..].to_vec()],
                ),
                section(
                    ChannelDirection::Output,
                    channel(0, 1),
                    std::slice::from_ref(&pairs),
                ),
                section(
                    ChannelDirection::Input,
                    channel(2, 0),
                    &[Vec::<(String, i64)>::new()],
                ),
            ],
        ),
        input(
            Records::Elements,
            vec![section(
                ChannelDirection::Input,
                channel(0, 0),
                &[elements.clone(), elements],
            )],
        ),
    ];
    seeds.into_iter().flatten().collect()
}

/// Decodes the file as a restore and a replay do.
fn restore(input: &Input) -> Result<(), String> {
    let sections = decode_file("chk-3/sum-0-channels", &input.bytes).map_err(|e| e.to_string())?;
    for s in &sections {
        s.verify().map_err(|e| e.to_string())?;
        let _ = s.summary();
        let n = match input.records {
            Records::Numbers => s.batches::<u64>().map(|b| b.len()),
            Records::Pairs => s.batches::<(String, i64)>().map(|b| b.len()),
            Records::Elements => s.batches::<StreamElement<String>>().map(|b| b.len()),
        };
        n.map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// One structured mutation of a section list.
fn mutate_sections(rng: &mut Rng, sections: &mut Vec<ChannelSection>, corpus: &[Input]) {
    let n = sections.len();
    let donors: Vec<&[u8]> = corpus
        .iter()
        .filter_map(|i| i.sections.as_ref())
        .flatten()
        .map(|s| s.data.as_slice())
        .collect();
    match rng.below(10) {
        0 if n > 0 => {
            sections.remove(rng.below(n));
        }
        1 => {
            let other = corpus
                .iter()
                .filter_map(|i| i.sections.as_ref())
                .flatten()
                .nth(rng.below(8));
            if let Some(s) = other {
                sections.insert(rng.below(n + 1), s.clone());
            }
        }
        _ if n > 0 => {
            let s = &mut sections[rng.below(n)];
            match rng.below(8) {
                0 => {
                    s.records = [
                        0,
                        1,
                        s.records.wrapping_add(1),
                        s.records.wrapping_sub(1),
                        u64::MAX,
                    ][rng.below(5)]
                }
                1 => {
                    s.direction = match s.direction {
                        ChannelDirection::Input => ChannelDirection::Output,
                        ChannelDirection::Output => ChannelDirection::Input,
                    }
                }
                2 => s.channel.producer = rng.next_u64() as u32,
                // A batch of another record type (when the count can take it).
                3 if s.records < u64::from(u32::MAX) => {
                    let _ = s.append_batch(&[rng.next_u64(), rng.next_u64()]);
                }
                _ => mutate::bytes(rng, &mut s.data, &donors),
            }
        }
        _ => {}
    }
}

impl Target for ChannelState {
    type Input = Input;

    fn name(&self) -> &'static str {
        "channel-state"
    }

    fn seeds(&self) -> Vec<Input> {
        build_seeds()
    }

    fn mutate(&self, input: &mut Input, corpus: &[Input], rng: &mut Rng) {
        match input.sections.as_mut() {
            Some(sections) if rng.percent(60) => mutate_sections(rng, sections, corpus),
            _ => {
                self.finish(input);
                input.sections = None;
                let donors: Vec<&[u8]> = corpus.iter().map(|i| i.bytes.as_slice()).collect();
                mutate::enveloped(rng, &mut input.bytes, &donors, &[CHANNEL_STATE_VERSION]);
            }
        }
    }

    fn finish(&self, input: &mut Input) {
        if let Some(sections) = &input.sections
            && let Ok(bytes) = encode_file(sections)
        {
            input.bytes = bytes;
        }
    }

    fn run(&self, input: &Input) -> Result<(), String> {
        restore(input)
    }

    fn describe(&self, input: &Input) -> String {
        format!("records {:?}, file {}", input.records, hex(&input.bytes))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_seed_restores() {
        let seeds = build_seeds();
        assert_eq!(seeds.len(), 4);
        for s in &seeds {
            restore(s).unwrap();
        }
    }
}
