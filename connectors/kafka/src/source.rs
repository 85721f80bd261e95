//! The Kafka source (Flink's `KafkaSource`): its options, the checks it makes before the job
//! starts, and how it is added to a job (a reader per subtask, an enumerator in the job master).

use crate::client::{Connection, list_partitions};
use crate::enumerator::KafkaSplitEnumerator;
use crate::reader::{Deserializer, KafkaRecord, KafkaSourceReader, ReaderConfig, SourceMetrics};
use crate::split::{StartingOffsets, StoppingOffsets};
use std::sync::Arc;
use std::time::Duration;
use weir_runtime::ParseErrorPolicy;
use weir_runtime::source::{SourceFunction, SplitEnumerator};
use weir_runtime::{DataStream, StreamEnvironment};

/// A Kafka source; [`build`](Self::build) adds it to a job.
pub struct KafkaSource<T> {
    connection: Connection,
    topics: Vec<String>,
    group_id: Option<String>,
    starting: StartingOffsets,
    stopping: StoppingOffsets,
    discovery_interval: Duration,
    deserializer: Deserializer<T>,
    policy: ParseErrorPolicy,
    watermark_bound: Option<Duration>,
    metrics: Arc<SourceMetrics>,
}

impl<T: weir_runtime::Data> KafkaSource<T> {
    /// A source of `topics` whose records `deserializer` turns into elements: unbounded,
    /// starting at the earliest offsets, discovering new partitions every 30 s.
    pub fn new(
        connection: Connection,
        topics: impl IntoIterator<Item = impl Into<String>>,
        deserializer: impl Fn(&KafkaRecord<'_>) -> Result<T, String> + Send + Sync + 'static,
    ) -> Self {
        KafkaSource {
            connection,
            topics: topics.into_iter().map(Into::into).collect(),
            group_id: None,
            starting: StartingOffsets::Earliest,
            stopping: StoppingOffsets::Never,
            discovery_interval: Duration::from_secs(30),
            deserializer: Arc::new(deserializer),
            policy: ParseErrorPolicy::Fail,
            watermark_bound: None,
            metrics: Arc::default(),
        }
    }

    /// The consumer group: offsets are committed to it when a checkpoint completes (for
    /// monitoring), and [`StartingOffsets::Committed`] starts from them.
    pub fn group_id(mut self, group: impl Into<String>) -> Self {
        self.group_id = Some(group.into());
        self
    }

    /// Where partitions start the first time they are read.
    pub fn starting_offsets(mut self, starting: StartingOffsets) -> Self {
        self.starting = starting;
        self
    }

    /// Reads up to each partition's end as it is when first assigned, then ends (Flink's
    /// `setBounded(OffsetsInitializer.latest())`). Partitions are listed once.
    pub fn bounded(mut self) -> Self {
        self.stopping = StoppingOffsets::Latest;
        self
    }

    /// How often partitions that appeared are looked for (unbounded sources).
    pub fn partition_discovery_interval(mut self, interval: Duration) -> Self {
        self.discovery_interval = interval.max(Duration::from_millis(10));
        self
    }

    /// What happens to a record that does not parse.
    pub fn on_parse_error(mut self, policy: ParseErrorPolicy) -> Self {
        self.policy = policy;
        self
    }

    /// Per-partition watermarks: each partition's trails the largest record timestamp read
    /// from it by `max_out_of_orderness`; a reader's is the least over its unfinished
    /// partitions (Flink's `WatermarkStrategy.forBoundedOutOfOrderness` on a Kafka source).
    pub fn with_watermarks(mut self, max_out_of_orderness: Duration) -> Self {
        self.watermark_bound = Some(max_out_of_orderness);
        self
    }

    /// The source's counters.
    pub fn metrics(&self) -> Arc<SourceMetrics> {
        self.metrics.clone()
    }

    /// Adds the source to `env` as `name`. Fails, naming the problem, when the cluster does
    /// not answer within the request timeout or a topic does not exist.
    pub fn build(self, env: &StreamEnvironment, name: &str) -> Result<DataStream<T>, String> {
        if self.topics.is_empty() {
            return Err("a Kafka source needs at least one topic".into());
        }
        self.connection.partitions(&self.topics)?;
        let config = Arc::new(ReaderConfig {
            connection: self.connection.clone(),
            group_id: self.group_id.clone(),
            deserializer: self.deserializer,
            policy: self.policy,
            metrics: self.metrics,
            watermark_bound: self
                .watermark_bound
                .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX)),
            discovery_interval: self.discovery_interval,
        });
        let (connection, topics) = (self.connection, self.topics);
        let (starting, stopping, interval) =
            (self.starting, self.stopping, self.discovery_interval);
        let stream = env.add_source_with_enumerator(
            name,
            move |_| Box::new(KafkaSourceReader::new(config.clone())) as Box<dyn SourceFunction<T>>,
            move |parallelism| {
                let (connection, topics) = (connection.clone(), topics.clone());
                let consumer = connection.admin_consumer();
                let list = Box::new(move || {
                    let consumer = consumer.as_ref().map_err(Clone::clone)?;
                    list_partitions(
                        consumer,
                        &topics,
                        connection.request_timeout,
                        &connection.bootstrap_servers,
                    )
                });
                Box::new(KafkaSplitEnumerator::new(
                    parallelism,
                    starting,
                    stopping,
                    list,
                    interval,
                )) as Box<dyn SplitEnumerator>
            },
        );
        Ok(stream)
    }
}
