//! The operator-state target: `OperatorStateBackend::restore` on mutated blobs, reading every
//! state back as a source would, and `redistribute` to a new parallelism with each new
//! subtask's blobs restored and read in turn (a rescaled restore).

use crate::harness::{Target, hex};
use crate::mutate;
use crate::rng::Rng;
use weir_core::handle::OperatorStateMode;
use weir_state::operator::{READABLE_VERSIONS, redistribute};
use weir_state::{OperatorStateBackend, StateError};

/// Operator state restore and redistribution.
pub struct Operator;

/// The blobs of the old subtasks, and the new parallelism.
#[derive(Clone, Debug)]
pub struct Input {
    /// One blob per old subtask.
    pub blobs: Vec<Vec<u8>>,
    /// The parallelism to redistribute to.
    pub parallelism: u32,
}

fn blob(subtask: u64, elements: u64) -> Result<Vec<u8>, StateError> {
    let mut b = OperatorStateBackend::new();
    let offsets = b.list_state::<u64>("offsets", OperatorStateMode::SplitDistribute)?;
    let splits = b.list_state::<String>("splits", OperatorStateMode::Union)?;
    let rules = b.list_state::<(String, i64)>("rules", OperatorStateMode::Broadcast)?;
    for i in 0..elements {
        b.add(&offsets, &(subtask * 1000 + i))?;
        b.add(&splits, &format!("split-{subtask}-{i}"))?;
    }
    b.update(
        &rules,
        &[("min".to_string(), -5), ("max".to_string(), 1 << 40)],
    )?;
    let mut out = Vec::new();
    b.snapshot().write_to(&mut out)?;
    Ok(out)
}

fn build_seeds() -> Result<Vec<Input>, StateError> {
    let empty = {
        let mut out = Vec::new();
        OperatorStateBackend::new().snapshot().write_to(&mut out)?;
        out
    };
    Ok(vec![
        Input {
            blobs: vec![blob(0, 3)?],
            parallelism: 1,
        },
        Input {
            blobs: vec![blob(0, 4)?, blob(1, 1)?, blob(2, 0)?],
            parallelism: 2,
        },
        Input {
            blobs: vec![blob(0, 2)?, empty],
            parallelism: 3,
        },
    ])
}

/// Reads every state a source of this job registers.
fn read_back(b: &mut OperatorStateBackend) -> Result<usize, StateError> {
    let offsets = b.list_state::<u64>("offsets", OperatorStateMode::SplitDistribute)?;
    let splits = b.list_state::<String>("splits", OperatorStateMode::Union)?;
    let rules = b.list_state::<(String, i64)>("rules", OperatorStateMode::Broadcast)?;
    Ok(b.get(&offsets)?.len() + b.get(&splits)?.len() + b.get(&rules)?.len())
}

fn restore(input: &Input) -> Result<(), StateError> {
    let blobs: Vec<&[u8]> = input.blobs.iter().map(Vec::as_slice).collect();
    let mut b = OperatorStateBackend::new();
    b.restore(&blobs)?;
    read_back(&mut b)?;
    let mut out = Vec::new();
    b.snapshot().write_to(&mut out)?;
    for new in redistribute(&blobs, input.parallelism)? {
        let mut b = OperatorStateBackend::new();
        b.restore(&[&new])?;
        read_back(&mut b)?;
    }
    Ok(())
}

impl Target for Operator {
    type Input = Input;

    fn name(&self) -> &'static str {
        "operator"
    }

    fn seeds(&self) -> Vec<Input> {
        build_seeds().unwrap_or_default()
    }

    fn mutate(&self, input: &mut Input, corpus: &[Input], rng: &mut Rng) {
        let donors: Vec<&[u8]> = corpus
            .iter()
            .flat_map(|i| &i.blobs)
            .map(Vec::as_slice)
            .collect();
        let n = input.blobs.len();
        match rng.below(10) {
            0 if n > 0 => {
                input.blobs.remove(rng.below(n));
            }
            1 => {
                if let Some(d) = rng.pick(&donors) {
                    input.blobs.insert(rng.below(n + 1), d.to_vec());
                }
            }
            // The job's parallelism, not the file's: realistic values only.
            2 => input.parallelism = rng.below(9) as u32,
            _ if n > 0 => {
                let i = rng.below(n);
                mutate::enveloped(rng, &mut input.blobs[i], &donors, READABLE_VERSIONS);
            }
            _ => {}
        }
    }

    fn run(&self, input: &Input) -> Result<(), String> {
        restore(input).map_err(|e| e.to_string())
    }

    fn describe(&self, input: &Input) -> String {
        let blobs: Vec<String> = input.blobs.iter().map(|b| hex(b)).collect();
        format!(
            "parallelism {}, blobs [{}]",
            input.parallelism,
            blobs.join(", ")
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_seed_restores_and_redistributes() {
        let seeds = build_seeds().unwrap();
        assert_eq!(seeds.len(), 3);
        for s in &seeds {
            restore(s).unwrap();
        }
    }
}
