//! Partitioners: how a producer subtask picks the consumer channel(s) for a record.

use crate::keygroup::{KeyGroup, compute_operator_index_for_key_group};
use serde::{Deserialize, Serialize};

/// The exchange pattern of an edge.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Partitioner {
    /// Subtask `i` sends to subtask `i`; both sides have the same parallelism. Chainable.
    Forward,
    /// Round-robin over all consumers.
    Rebalance,
    /// By key: a record goes to the subtask owning its key group.
    Hash,
    /// Every record to every consumer.
    Broadcast,
}

impl Partitioner {
    /// A short name, as Flink prints it in plans.
    pub fn name(&self) -> &'static str {
        match self {
            Partitioner::Forward => "FORWARD",
            Partitioner::Rebalance => "REBALANCE",
            Partitioner::Hash => "HASH",
            Partitioner::Broadcast => "BROADCAST",
        }
    }
}

/// The consumer channel of a key group under hash partitioning (Flink's
/// `KeyGroupStreamPartitioner`): the subtask that owns the key group.
#[inline]
pub fn channel_for_key_group(key_group: KeyGroup, max_parallelism: u32, channels: u32) -> u32 {
    compute_operator_index_for_key_group(max_parallelism, channels, key_group)
}

/// Round-robin channel selection that starts at a per-producer offset, so that producers do not
/// all start on channel 0.
#[derive(Clone, Debug)]
pub struct RoundRobin {
    next: u32,
    channels: u32,
}

impl RoundRobin {
    /// Starts at `start % channels`.
    pub fn new(start: u32, channels: u32) -> RoundRobin {
        RoundRobin {
            next: start % channels.max(1),
            channels: channels.max(1),
        }
    }

    /// The next channel.
    pub fn next_channel(&mut self) -> u32 {
        let c = self.next;
        self.next += 1;
        if self.next == self.channels {
            self.next = 0;
        }
        c
    }
}
