//! A Kafka source's splits: one per topic partition, with where reading starts and, for a
//! bounded source, where it stops; their wire encoding; and which reader owns a partition.

use serde::{Deserialize, Serialize};

/// Where a partition's reading starts the first time it is assigned (Flink's
/// `OffsetsInitializer`). A restored split always resumes at its checkpointed offset.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum StartingOffsets {
    /// The partition's first offset.
    Earliest,
    /// The partition's end when the split is assigned: only records produced after it.
    Latest,
    /// The consumer group's committed offset; a partition without one starts at the earliest
    /// offset.
    Committed,
    /// The first offset whose record timestamp is at or after this many ms since the epoch (the
    /// end when there is none).
    Timestamp(i64),
}

/// Where a bounded source stops (Flink's `setBounded`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum StoppingOffsets {
    /// Never: the source is unbounded.
    Never,
    /// At each partition's end as it is when the partition is first assigned.
    Latest,
}

/// A topic partition.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct TopicPartition {
    /// The topic.
    pub topic: String,
    /// The partition.
    pub partition: i32,
}

impl std::fmt::Display for TopicPartition {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}-{}", self.topic, self.partition)
    }
}

/// Where a split's reading starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum SplitStart {
    /// Not resolved yet: the reader resolves it when the split is assigned.
    Initial(StartingOffsets),
    /// This offset: the next record to read.
    Offset(i64),
}

/// One partition's split: what the enumerator hands out and what a reader checkpoints.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct KafkaSplit {
    /// The partition.
    pub tp: TopicPartition,
    /// The next record to read.
    pub start: SplitStart,
    /// The first offset not to read (a bounded source); `None`: unbounded, or not resolved yet
    /// (resolved with the start).
    pub stop: Option<i64>,
    /// Stop at the partition's end as it is when the split is resolved.
    pub stop_at_latest: bool,
}

/// The version byte in front of every encoded split and enumerator state.
const VERSION: u8 = 1;

/// Encodes `value` behind the version byte.
pub(crate) fn encode<T: Serialize>(value: &T) -> Vec<u8> {
    let mut out = vec![VERSION];
    // postcard cannot fail on these types (no maps with non-string keys, no unsized data).
    out.extend(postcard::to_stdvec(value).unwrap_or_default());
    out
}

/// Decodes what [`encode`] wrote; `what` names it in the error.
pub(crate) fn decode<T: for<'de> Deserialize<'de>>(bytes: &[u8], what: &str) -> Result<T, String> {
    match bytes.split_first() {
        Some((&VERSION, rest)) => {
            postcard::from_bytes(rest).map_err(|e| format!("cannot decode a Kafka {what}: {e}"))
        }
        Some((v, _)) => Err(format!(
            "a Kafka {what} has format version {v}; this build reads version {VERSION}"
        )),
        None => Err(format!("a Kafka {what} is empty")),
    }
}

/// The reader that owns `tp` among `parallelism` readers (Flink's `KafkaSourceEnumerator`:
/// the topic's hash picks the first reader, partitions go round-robin from there), so a
/// topic's partitions spread evenly and a partition found later has a fixed owner.
pub fn owner(tp: &TopicPartition, parallelism: u32) -> u32 {
    let p = parallelism.max(1);
    // FNV-1a of the topic name: stable across builds and processes.
    let mut h: u32 = 0x811c_9dc5;
    for b in tp.topic.as_bytes() {
        h ^= u32::from(*b);
        h = h.wrapping_mul(0x0100_0193);
    }
    let start = (h & 0x7fff_ffff) % p;
    (start + (tp.partition.max(0) as u32) % p) % p
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tp(topic: &str, partition: i32) -> TopicPartition {
        TopicPartition {
            topic: topic.into(),
            partition,
        }
    }

    #[test]
    fn partitions_of_a_topic_spread_over_every_reader() {
        for p in 1..=7 {
            let mut counts = vec![0; p as usize];
            for partition in 0..(3 * p as i32) {
                counts[owner(&tp("words", partition), p) as usize] += 1;
            }
            assert!(counts.iter().all(|&c| c == 3), "p={p}: {counts:?}");
        }
    }

    #[test]
    fn a_split_round_trips_and_a_foreign_version_is_named() {
        let split = KafkaSplit {
            tp: tp("in", 3),
            start: SplitStart::Offset(17),
            stop: Some(40),
            stop_at_latest: true,
        };
        let bytes = encode(&split);
        assert_eq!(decode::<KafkaSplit>(&bytes, "split"), Ok(split));
        let mut foreign = bytes.clone();
        foreign[0] = 9;
        let err = decode::<KafkaSplit>(&foreign, "split").unwrap_err();
        assert!(err.contains("format version 9"), "{err}");
        assert!(decode::<KafkaSplit>(&bytes[..2], "split").is_err());
        assert!(decode::<KafkaSplit>(&[], "split").is_err());
    }
}
