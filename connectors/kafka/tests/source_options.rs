//! The source's start positions (latest, the group's committed offsets with the earliest as
//! fallback, a timestamp) and the offsets it commits to its group when checkpoints complete.

use crate::support::{Cluster, INPUT, block_on};
use std::sync::atomic::Ordering;
use std::time::Duration;
use weir_kafka::rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use weir_kafka::rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use weir_kafka::rdkafka::{Offset, TopicPartitionList};
use weir_kafka::{KafkaSource, StartingOffsets};
use weir_runtime::StreamEnvironment;

/// Produces `values` into partition 0 of the input, each with `timestamp`.
fn produce_at(cluster: &Cluster, values: std::ops::Range<u64>, timestamp: i64) {
    let producer: BaseProducer = cluster
        .connection
        .client_config()
        .create()
        .expect("a producer");
    for v in values {
        let text = v.to_string();
        producer
            .send(
                BaseRecord::<(), str>::to(INPUT)
                    .partition(0)
                    .payload(&text)
                    .timestamp(timestamp),
            )
            .expect("send");
    }
    producer.flush(Duration::from_secs(10)).expect("flush");
}

/// Reads the input, bounded, from `start` (with `group`), returning the values read.
fn read(cluster: &Cluster, start: StartingOffsets, group: &str) -> Vec<u64> {
    let env = StreamEnvironment::new();
    env.set_parallelism(1);
    let got = KafkaSource::new(cluster.connection.clone(), [INPUT], |r| {
        let text = std::str::from_utf8(r.payload.unwrap_or_default()).map_err(|e| e.to_string())?;
        text.parse::<u64>().map_err(|e| e.to_string())
    })
    .starting_offsets(start)
    .group_id(group)
    .bounded()
    .build(&env, "Kafka Source")
    .unwrap()
    .collect();
    block_on(env.execute()).unwrap();
    let mut values = got.records();
    values.sort_unstable();
    values
}

#[test]
fn each_start_position_reads_what_it_names() {
    let cluster = Cluster::new(1);
    produce_at(&cluster, 0..100, 1_000_000);
    produce_at(&cluster, 100..200, 2_000_000);
    // The group `seen` committed offset 150; the group `new` nothing.
    let consumer: BaseConsumer = cluster
        .connection
        .client_config()
        .set("group.id", "seen")
        .create()
        .unwrap();
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(INPUT, 0, Offset::Offset(150))
        .unwrap();
    consumer.commit(&tpl, CommitMode::Sync).unwrap();

    assert_eq!(
        read(&cluster, StartingOffsets::Earliest, "a"),
        (0..200).collect::<Vec<_>>()
    );
    assert!(read(&cluster, StartingOffsets::Latest, "b").is_empty());
    // librdkafka's mock does not look offsets up by timestamp (its ListOffsets handler answers
    // "none": a FIXME in librdkafka 2.12), so only the answer "no record at or after it" is
    // seen here, which starts at the end, as Kafka defines it. A broker finds offset 100.
    assert!(read(&cluster, StartingOffsets::Timestamp(1_500_000), "c").is_empty());
    assert_eq!(
        read(&cluster, StartingOffsets::Committed, "seen"),
        (150..200).collect::<Vec<_>>()
    );
    assert_eq!(
        read(&cluster, StartingOffsets::Committed, "new"),
        (0..200).collect::<Vec<_>>(),
        "a group without offsets starts at the earliest"
    );
}

#[test]
fn completed_checkpoints_commit_the_offsets_to_the_group() {
    let cluster = Cluster::new(1);
    produce_at(&cluster, 0..20_000, 1_000_000);
    let env = StreamEnvironment::new();
    env.set_parallelism(1)
        .enable_checkpointing(Duration::from_millis(10));
    let dir = tempfile::tempdir().unwrap();
    env.set_checkpoint_dir(dir.path());
    env.config_mut().batch_size = 64;
    let source = KafkaSource::new(cluster.connection.clone(), [INPUT], |r| Ok(r.offset))
        .group_id("monitor")
        .bounded();
    let metrics = source.metrics();
    source
        .build(&env, "Kafka Source")
        .unwrap()
        .map(|o: i64| {
            // Slow enough for checkpoints to complete while it reads.
            if o % 500 == 0 {
                std::thread::sleep(Duration::from_millis(2));
            }
            o
        })
        .collect();
    block_on(env.execute()).unwrap();
    assert!(metrics.offsets_committed.load(Ordering::Relaxed) > 0);
    let consumer: BaseConsumer = cluster
        .connection
        .client_config()
        .set("group.id", "monitor")
        .create()
        .unwrap();
    let mut q = TopicPartitionList::new();
    q.add_partition(INPUT, 0);
    let committed = consumer
        .committed_offsets(q, Duration::from_secs(10))
        .unwrap();
    match committed.elements()[0].offset() {
        Offset::Offset(o) => assert!(o > 0 && o <= 20_000, "{o}"),
        other => panic!("no offset committed: {other:?}"),
    }
}
