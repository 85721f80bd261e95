//! The Kafka source's reader (Flink's `KafkaSourceReader`): one consumer per subtask, assigned
//! the partitions its enumerator hands it, each partition's next offset in operator state, so a
//! restore resumes exactly after the last record a checkpoint counted.

use crate::client::Connection;
use crate::split::{KafkaSplit, SplitStart, StartingOffsets, TopicPartition, decode};
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::Message;
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{Offset, TopicPartitionList};
use serde::{Deserialize, Serialize};
use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use weir_core::handle::OperatorStateMode;
use weir_core::ids::CheckpointId;
use weir_runtime::operator::SubtaskInfo;
use weir_runtime::source::{SourceFunction, SourceStatus};
use weir_runtime::{ParseErrorPolicy, TaskError};
use weir_state::{OperatorListState, OperatorStateBackend};

/// A record as the consumer read it, for the deserializer.
#[derive(Clone, Copy, Debug)]
pub struct KafkaRecord<'a> {
    /// Its topic.
    pub topic: &'a str,
    /// Its partition.
    pub partition: i32,
    /// Its offset.
    pub offset: i64,
    /// Its timestamp, ms since the epoch, when it has one.
    pub timestamp: Option<i64>,
    /// Its key.
    pub key: Option<&'a [u8]>,
    /// Its value.
    pub payload: Option<&'a [u8]>,
}

/// Turns a record into the stream's element; an `Err` says why it does not parse.
pub type Deserializer<T> = Arc<dyn Fn(&KafkaRecord<'_>) -> Result<T, String> + Send + Sync>;

/// Counters a source shares with the job's client.
#[derive(Debug, Default)]
pub struct SourceMetrics {
    /// Records skipped because they did not parse (Flink's `numRecordsInErrors`).
    pub records_skipped: AtomicU64,
    /// Offset commits to the consumer group after completed checkpoints.
    pub offsets_committed: AtomicU64,
    /// Records read (Flink's `numRecordsIn` of the source), replays after a restore included.
    pub records_read: AtomicU64,
}

/// What every reader of a source shares.
pub(crate) struct ReaderConfig<T> {
    pub connection: Connection,
    pub group_id: Option<String>,
    pub deserializer: Deserializer<T>,
    pub policy: ParseErrorPolicy,
    pub metrics: Arc<SourceMetrics>,
    /// Per-partition watermarks trail the largest record timestamp by this many ms.
    pub watermark_bound: Option<i64>,
    /// How often an unbounded reader asks for new partitions.
    pub discovery_interval: Duration,
}

/// A split as a checkpoint holds it: the partition, its next offset, where it stops, and the
/// largest record timestamp read (the partition's watermark).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct SplitCheckpoint {
    tp: TopicPartition,
    next: i64,
    stop: Option<i64>,
    max_timestamp: i64,
}

/// A split being read.
struct Reading {
    tp: TopicPartition,
    next: i64,
    stop: Option<i64>,
    max_timestamp: i64,
    finished: bool,
}

/// The operator state of the splits.
const SPLITS: &str = "kafka-partition-splits";
/// How long a reader waits before asking again after an empty answer.
const ASK_AGAIN: Duration = Duration::from_millis(100);
/// How many checkpoints' offsets wait for their completion.
const REMEMBERED: usize = 16;

/// The reader; see the module doc.
pub(crate) struct KafkaSourceReader<T> {
    config: Arc<ReaderConfig<T>>,
    consumer: Option<BaseConsumer>,
    splits: Vec<Reading>,
    list: Option<OperatorListState<SplitCheckpoint>>,
    no_more_splits: bool,
    next_ask: Instant,
    /// The offsets each recent checkpoint recorded, committed when it completes.
    snapshots: VecDeque<(CheckpointId, Vec<(TopicPartition, i64)>)>,
    subtask: u32,
}

impl<T> KafkaSourceReader<T> {
    pub(crate) fn new(config: Arc<ReaderConfig<T>>) -> Self {
        KafkaSourceReader {
            config,
            consumer: None,
            splits: Vec::new(),
            list: None,
            no_more_splits: false,
            next_ask: Instant::now(),
            snapshots: VecDeque::new(),
            subtask: 0,
        }
    }

    fn consumer(&self) -> Result<&BaseConsumer, TaskError> {
        self.consumer
            .as_ref()
            .ok_or_else(|| crate::source_error("the Kafka source reader is not open".into()))
    }

    /// Starts reading `splits`, resolving where each starts and stops.
    fn start(&mut self, splits: Vec<Reading>) -> Result<(), TaskError> {
        let mut tpl = TopicPartitionList::new();
        for s in &splits {
            if !s.finished {
                tpl.add_partition_offset(&s.tp.topic, s.tp.partition, Offset::Offset(s.next))
                    .map_err(|e| crate::source_error(format!("cannot assign {}: {e}", s.tp)))?;
            }
        }
        if tpl.count() > 0 {
            self.consumer()?.incremental_assign(&tpl).map_err(|e| {
                crate::source_error(format!("cannot assign Kafka partitions {tpl:?}: {e}"))
            })?;
        }
        tracing::debug!(
            subtask = self.subtask,
            splits = splits.len(),
            "Kafka splits started"
        );
        self.splits.extend(splits);
        Ok(())
    }

    /// Where a newly assigned split starts and stops, as offsets.
    fn resolve(&self, split: KafkaSplit) -> Result<Reading, TaskError> {
        let consumer = self.consumer()?;
        let timeout = self.config.connection.request_timeout;
        let tp = &split.tp;
        let err = |what: &str, e: KafkaError| {
            crate::source_error(format!(
                "cannot look up the {what} of Kafka partition {tp}: {e}"
            ))
        };
        let mut bounds = None;
        let mut watermarks = || -> Result<(i64, i64), TaskError> {
            if let Some(b) = bounds {
                return Ok(b);
            }
            let b = consumer
                .fetch_watermarks(&tp.topic, tp.partition, timeout)
                .map_err(|e| err("offsets", e))?;
            bounds = Some(b);
            Ok(b)
        };
        let next = match split.start {
            SplitStart::Offset(o) => o,
            SplitStart::Initial(StartingOffsets::Earliest) => watermarks()?.0,
            SplitStart::Initial(StartingOffsets::Latest) => watermarks()?.1,
            SplitStart::Initial(StartingOffsets::Committed) => {
                let mut q = TopicPartitionList::new();
                q.add_partition(&tp.topic, tp.partition);
                let committed = consumer
                    .committed_offsets(q, timeout)
                    .map_err(|e| err("committed offset", e))?;
                match committed.elements().first().map(|e| e.offset()) {
                    Some(Offset::Offset(o)) => o,
                    _ => watermarks()?.0,
                }
            }
            SplitStart::Initial(StartingOffsets::Timestamp(ms)) => {
                let mut q = TopicPartitionList::new();
                q.add_partition_offset(&tp.topic, tp.partition, Offset::Offset(ms))
                    .map_err(|e| err("offset for a timestamp", e))?;
                let found = consumer
                    .offsets_for_times(q, timeout)
                    .map_err(|e| err("offset for a timestamp", e))?;
                match found.elements().first().map(|e| e.offset()) {
                    Some(Offset::Offset(o)) => o,
                    _ => watermarks()?.1,
                }
            }
        };
        let stop = match (split.stop, split.stop_at_latest) {
            (Some(s), _) => Some(s),
            (None, true) => Some(watermarks()?.1),
            (None, false) => None,
        };
        Ok(Reading {
            finished: stop.is_some_and(|s| next >= s),
            tp: split.tp,
            next,
            stop,
            max_timestamp: i64::MIN,
        })
    }

    /// Whether to ask the enumerator now.
    fn should_ask(&self) -> bool {
        if self.no_more_splits {
            return false;
        }
        let bounded = self.splits.iter().any(|s| s.stop.is_some());
        // A bounded reader asks as soon as it has nothing left; an unbounded one every
        // discovery interval, for partitions that appeared.
        if bounded {
            self.splits.iter().all(|s| s.finished)
        } else {
            Instant::now() >= self.next_ask
        }
    }

    /// Polls up to `max` records into `out`; `caught_up` when the consumer had no more.
    fn poll_into(
        &mut self,
        consumer: &BaseConsumer,
        out: &mut Vec<T>,
        max: usize,
        caught_up: &mut bool,
    ) -> Result<(), TaskError> {
        let before = out.len();
        while out.len() - before < max {
            let m = match consumer.poll(Duration::ZERO) {
                None => {
                    *caught_up = true;
                    break;
                }
                Some(Err(e)) if is_fatal(&e) => {
                    return Err(crate::source_error(format!(
                        "the Kafka consumer failed: {e}"
                    )));
                }
                Some(Err(e)) => {
                    // Broker down, a request that timed out: librdkafka retries on its own.
                    tracing::debug!(error = %e, "Kafka consumer error, retried");
                    *caught_up = true;
                    break;
                }
                Some(Ok(m)) => m,
            };
            let found = self
                .splits
                .iter_mut()
                .find(|s| s.tp.partition == m.partition() && s.tp.topic == m.topic());
            if let Some(split) = found {
                take(split, &self.config, &m, out)?;
            }
        }
        Ok(())
    }

    /// Marks bounded splits whose consumer position passed their stop (a transaction's
    /// control record can be the last offset before it).
    fn check_positions(&mut self) -> Result<(), TaskError> {
        if !self.splits.iter().any(|s| !s.finished && s.stop.is_some()) {
            return Ok(());
        }
        let position = self
            .consumer()?
            .position()
            .map_err(|e| crate::source_error(format!("cannot read the consumer position: {e}")))?;
        for s in self.splits.iter_mut().filter(|s| !s.finished) {
            let Some(stop) = s.stop else { continue };
            let at = position
                .find_partition(&s.tp.topic, s.tp.partition)
                .and_then(|e| match e.offset() {
                    Offset::Offset(o) => Some(o),
                    _ => None,
                });
            if s.next >= stop || at.is_some_and(|o| o >= stop) {
                s.finished = true;
            }
        }
        Ok(())
    }
}

/// One record: deserialized into `out`, or skipped, or an error.
fn take<T>(
    split: &mut Reading,
    config: &ReaderConfig<T>,
    m: &impl Message,
    out: &mut Vec<T>,
) -> Result<(), TaskError> {
    let offset = m.offset();
    if split.finished || offset < split.next {
        return Ok(());
    }
    if split.stop.is_some_and(|s| offset >= s) {
        split.finished = true;
        return Ok(());
    }
    split.next = offset + 1;
    let timestamp = m.timestamp().to_millis();
    if let Some(ts) = timestamp {
        split.max_timestamp = split.max_timestamp.max(ts);
    }
    if split.stop.is_some_and(|s| split.next >= s) {
        split.finished = true;
    }
    let record = KafkaRecord {
        topic: m.topic(),
        partition: m.partition(),
        offset,
        timestamp,
        key: m.key(),
        payload: m.payload(),
    };
    match (config.deserializer)(&record) {
        Ok(v) => out.push(v),
        Err(why) => match config.policy {
            ParseErrorPolicy::Fail => {
                return Err(crate::source_error(format!(
                    "the record at offset {offset} of Kafka partition {}-{} does not \
                     parse: {why} (the job fails by policy; `ParseErrorPolicy::Skip` skips \
                     and counts such records)",
                    record.topic, record.partition
                )));
            }
            ParseErrorPolicy::Skip => {
                let n = config
                    .metrics
                    .records_skipped
                    .fetch_add(1, Ordering::Relaxed);
                if n < 10 || n.is_power_of_two() {
                    tracing::warn!(
                        topic = record.topic,
                        partition = record.partition,
                        offset,
                        skipped = n + 1,
                        "skipping a Kafka record that does not parse: {why}"
                    );
                }
            }
        },
    }
    Ok(())
}

/// Whether a consumer error ends the job rather than being retried by librdkafka.
fn is_fatal(e: &KafkaError) -> bool {
    matches!(
        e.rdkafka_error_code(),
        Some(
            RDKafkaErrorCode::UnknownTopicOrPartition
                | RDKafkaErrorCode::UnknownTopic
                | RDKafkaErrorCode::TopicAuthorizationFailed
                | RDKafkaErrorCode::Fatal
        )
    )
}

impl<T: Send + 'static> SourceFunction<T> for KafkaSourceReader<T> {
    fn open(
        &mut self,
        info: &SubtaskInfo,
        state: &mut OperatorStateBackend,
    ) -> Result<(), TaskError> {
        self.subtask = info.index;
        let group = self.config.group_id.clone();
        let mut defaults = vec![
            ("enable.auto.commit", "false"),
            ("enable.auto.offset.store", "false"),
            ("isolation.level", "read_committed"),
            ("enable.partition.eof", "false"),
            // An offset retention removed (a restore long after its checkpoint) resumes at the
            // earliest record kept, not silently at the end (librdkafka's default).
            ("auto.offset.reset", "earliest"),
        ];
        if let Some(g) = &group {
            defaults.push(("group.id", g.as_str()));
        }
        let consumer: BaseConsumer = self
            .config
            .connection
            .config(&defaults)
            .create()
            .map_err(|e| crate::source_error(format!("cannot create the Kafka consumer: {e}")))?;
        self.consumer = Some(consumer);
        let list =
            state.list_state::<SplitCheckpoint>(SPLITS, OperatorStateMode::SplitDistribute)?;
        let restored: Vec<Reading> = state
            .get(&list)?
            .into_iter()
            .map(|c| Reading {
                finished: c.stop.is_some_and(|s| c.next >= s),
                tp: c.tp,
                next: c.next,
                stop: c.stop,
                max_timestamp: c.max_timestamp,
            })
            .collect();
        self.list = Some(list);
        self.start(restored)
    }

    fn next_batch(&mut self, out: &mut Vec<T>, max: usize) -> Result<SourceStatus, TaskError> {
        if self.should_ask() {
            self.next_ask = Instant::now() + self.config.discovery_interval;
            return Ok(SourceStatus::NeedSplits);
        }
        let before = out.len();
        let mut caught_up = false;
        let consumer = self
            .consumer
            .take()
            .ok_or_else(|| crate::source_error("the Kafka source reader is not open".into()))?;
        let polled = self.poll_into(&consumer, out, max, &mut caught_up);
        self.consumer = Some(consumer);
        polled?;
        self.config
            .metrics
            .records_read
            .fetch_add((out.len() - before) as u64, Ordering::Relaxed);
        if caught_up {
            self.check_positions()?;
        }
        // A reader the enumerator gave nothing (more readers than partitions) ends too.
        let all_done = self.splits.iter().all(|s| s.finished);
        if all_done && self.no_more_splits {
            for s in &self.splits {
                tracing::debug!(tp = %s.tp, next = s.next, stop = ?s.stop, "Kafka split finished");
            }
            return Ok(SourceStatus::End);
        }
        if out.len() > before {
            Ok(SourceStatus::More)
        } else {
            Ok(SourceStatus::Idle)
        }
    }

    fn snapshot_state(&mut self, state: &mut OperatorStateBackend) -> Result<(), TaskError> {
        if let Some(list) = &self.list {
            let splits: Vec<SplitCheckpoint> = self
                .splits
                .iter()
                .map(|s| SplitCheckpoint {
                    tp: s.tp.clone(),
                    next: s.next,
                    stop: s.stop,
                    max_timestamp: s.max_timestamp,
                })
                .collect();
            state.update(list, &splits)?;
        }
        Ok(())
    }

    fn snapshot_checkpoint(
        &mut self,
        checkpoint: CheckpointId,
        state: &mut OperatorStateBackend,
    ) -> Result<(), TaskError> {
        self.snapshot_state(state)?;
        let offsets = self.splits.iter().map(|s| (s.tp.clone(), s.next)).collect();
        self.snapshots.push_back((checkpoint, offsets));
        while self.snapshots.len() > REMEMBERED {
            self.snapshots.pop_front();
        }
        Ok(())
    }

    fn notify_checkpoint_complete(&mut self, checkpoint: CheckpointId) -> Result<(), TaskError> {
        let Some(i) = self.snapshots.iter().position(|(id, _)| *id == checkpoint) else {
            return Ok(());
        };
        let Some((_, offsets)) = self.snapshots.drain(..=i).next_back() else {
            return Ok(());
        };
        if self.config.group_id.is_none() || offsets.is_empty() {
            return Ok(());
        }
        // For monitoring only (as Flink's): exactly-once rests on the checkpointed offsets.
        let mut tpl = TopicPartitionList::new();
        for (tp, next) in &offsets {
            if tpl
                .add_partition_offset(&tp.topic, tp.partition, Offset::Offset(*next))
                .is_err()
            {
                return Ok(());
            }
        }
        match self.consumer()?.commit(&tpl, CommitMode::Async) {
            Ok(()) => {
                self.config
                    .metrics
                    .offsets_committed
                    .fetch_add(1, Ordering::Relaxed);
            }
            Err(e) => tracing::warn!(error = %e, "cannot commit Kafka offsets to the group"),
        }
        Ok(())
    }

    fn add_splits(&mut self, splits: Vec<Vec<u8>>) -> Result<(), TaskError> {
        let mut reading = Vec::with_capacity(splits.len());
        for bytes in splits {
            let split: KafkaSplit = decode(&bytes, "split").map_err(crate::source_error)?;
            if self.splits.iter().any(|s| s.tp == split.tp) {
                return Err(crate::source_error(format!(
                    "Kafka partition {} was assigned twice to subtask {}",
                    split.tp, self.subtask
                )));
            }
            reading.push(self.resolve(split)?);
        }
        // Nothing yet (the enumerator's first listing is under way): ask again soon. A reader
        // with partitions asks only every discovery interval.
        if reading.is_empty() && self.splits.is_empty() {
            self.next_ask = self.next_ask.min(Instant::now() + ASK_AGAIN);
        }
        self.start(reading)
    }

    fn no_more_splits(&mut self) {
        self.no_more_splits = true;
    }

    fn current_watermark(&self) -> Option<i64> {
        let bound = self.config.watermark_bound?;
        let mut open = self.splits.iter().filter(|s| !s.finished).peekable();
        open.peek()?;
        let slowest = open.map(|s| s.max_timestamp).min()?;
        (slowest != i64::MIN).then(|| slowest.saturating_sub(bound))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reader(bound: Option<i64>) -> KafkaSourceReader<i64> {
        KafkaSourceReader::new(Arc::new(ReaderConfig {
            connection: Connection::new("127.0.0.1:1"),
            group_id: None,
            deserializer: Arc::new(|_| Ok(0)),
            policy: ParseErrorPolicy::Fail,
            metrics: Arc::default(),
            watermark_bound: bound,
            discovery_interval: Duration::from_secs(1),
        }))
    }

    fn split(partition: i32, max_timestamp: i64) -> Reading {
        Reading {
            tp: TopicPartition {
                topic: "in".into(),
                partition,
            },
            next: 0,
            stop: None,
            max_timestamp,
            finished: false,
        }
    }

    #[test]
    fn the_watermark_follows_the_slowest_unfinished_partition() {
        let mut r = reader(Some(10));
        assert_eq!(r.current_watermark(), None, "no partition yet");
        r.splits = vec![split(0, 100), split(1, i64::MIN)];
        // A partition that has read nothing holds the watermark back.
        assert_eq!(r.current_watermark(), None);
        r.splits[1].max_timestamp = 50;
        assert_eq!(r.current_watermark(), Some(40));
        // A finished partition no longer holds it back.
        r.splits[1].finished = true;
        assert_eq!(r.current_watermark(), Some(90));
        assert_eq!(reader(None).current_watermark(), None);
    }
}
