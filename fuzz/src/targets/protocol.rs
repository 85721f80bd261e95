//! The cluster protocol target: the task protocol's decoder (a version byte, then postcard
//! messages) on mutated batches of every message kind, each way.

use crate::harness::{Target, hex};
use crate::mutate;
use crate::rng::Rng;
use weir_runtime::cluster::fuzzing::{self, Direction};

/// `protocol::decode` of both directions.
pub struct Protocol;

/// One encoded batch of messages and the side that decodes it.
#[derive(Clone, Debug)]
pub struct Input {
    /// Which way the batch goes.
    pub direction: Direction,
    /// The bytes.
    pub bytes: Vec<u8>,
}

impl Target for Protocol {
    type Input = Input;

    fn name(&self) -> &'static str {
        "protocol"
    }

    fn seeds(&self) -> Vec<Input> {
        fuzzing::seeds()
            .unwrap_or_default()
            .into_iter()
            .map(|(direction, bytes)| Input { direction, bytes })
            .collect()
    }

    fn mutate(&self, input: &mut Input, corpus: &[Input], rng: &mut Rng) {
        let donors: Vec<&[u8]> = corpus
            .iter()
            .map(|i| i.bytes.get(1..).unwrap_or_default())
            .collect();
        // Mostly behind the version byte, which a peer of the same build always gets right.
        if input.bytes.len() > 1 && rng.percent(90) {
            let mut body = input.bytes.split_off(1);
            mutate::bytes(rng, &mut body, &donors);
            input.bytes.extend(body);
        } else {
            mutate::bytes(rng, &mut input.bytes, &donors);
        }
    }

    fn run(&self, input: &Input) -> Result<(), String> {
        fuzzing::decode(input.direction, &input.bytes).map(|_| ())
    }

    fn describe(&self, input: &Input) -> String {
        format!("{:?}: {}", input.direction, hex(&input.bytes))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_seeds_are_every_batch_of_the_runtime() {
        let seeds = Protocol.seeds();
        assert_eq!(seeds.len(), 7);
        for s in &seeds {
            Protocol.run(s).unwrap();
        }
    }
}
