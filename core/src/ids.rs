//! Identifiers: jobs, graph vertices, operators (from their `uid`), subtasks, attempts, checkpoints.

use serde::{Deserialize, Serialize};
use std::fmt;

/// A job's id: 128 bits, printed as 32 hex digits as Flink prints its `JobID`.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct JobId(pub u128);

impl JobId {
    /// A job id derived from a name, so that reruns of the same job find the same checkpoint root.
    pub fn from_name(name: &str) -> JobId {
        JobId(stable_hash128(name.as_bytes()))
    }

    /// Parses 32 hex digits.
    pub fn parse(s: &str) -> Option<JobId> {
        if s.len() != 32 {
            return None;
        }
        u128::from_str_radix(s, 16).ok().map(JobId)
    }
}

impl fmt::Display for JobId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:032x}", self.0)
    }
}

impl fmt::Debug for JobId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "JobId({self})")
    }
}

/// A node of the StreamGraph: one operator as the user wrote it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct NodeId(pub u32);

/// A vertex of the JobGraph: one operator chain.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct VertexId(pub u32);

/// A JobGraph edge between two vertices (a network exchange).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct EdgeId(pub u32);

/// An operator's stable id. Derived from the user's `uid`, or from the operator's position in the
/// graph when it has none, so that state maps back to the same operator after a restart.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct OperatorId(pub u128);

impl OperatorId {
    /// The id of an operator whose `uid` is `uid`.
    pub fn from_uid(uid: &str) -> OperatorId {
        OperatorId(stable_hash128(uid.as_bytes()))
    }
}

impl fmt::Display for OperatorId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:032x}", self.0)
    }
}

impl fmt::Debug for OperatorId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "OperatorId({self})")
    }
}

/// The index of a parallel subtask, `0..parallelism`.
pub type SubtaskIndex = u32;

/// Which execution attempt of a subtask this is: 0 first, then +1 for each redeployment.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize,
)]
pub struct AttemptNumber(pub u32);

/// One execution attempt of one subtask of one vertex.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ExecutionAttemptId {
    /// The vertex (operator chain).
    pub vertex: VertexId,
    /// The subtask index within the vertex.
    pub subtask: SubtaskIndex,
    /// The attempt number.
    pub attempt: AttemptNumber,
}

impl fmt::Display for ExecutionAttemptId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "v{}[{}]#{}", self.vertex.0, self.subtask, self.attempt.0)
    }
}

/// A checkpoint's id: strictly increasing within a job, starting at 1.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct CheckpointId(pub u64);

impl fmt::Display for CheckpointId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// A stable 128-bit hash (two FNV-1a-64 lanes with different offsets). Stable across builds,
/// platforms and Rust versions, which `std`'s hashers are not: ids derived from it live in files.
pub fn stable_hash128(bytes: &[u8]) -> u128 {
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    let mut a: u64 = 0xcbf2_9ce4_8422_2325;
    let mut b: u64 = 0x84222325_cbf29ce4;
    for &byte in bytes {
        a ^= u64::from(byte);
        a = a.wrapping_mul(PRIME);
        b ^= u64::from(byte.rotate_left(3));
        b = b.wrapping_mul(PRIME);
    }
    (u128::from(a) << 64) | u128::from(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_stable_and_distinct() {
        assert_eq!(OperatorId::from_uid("sum"), OperatorId::from_uid("sum"));
        assert_ne!(OperatorId::from_uid("sum"), OperatorId::from_uid("map"));
        let j = JobId::from_name("word_count");
        assert_eq!(JobId::parse(&j.to_string()), Some(j));
        assert_eq!(JobId::parse("xyz"), None);
    }
}
