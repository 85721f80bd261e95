//! What the tests share: a mock cluster with the word count's topics, the job's options, and a
//! blocking run.

use std::path::Path;
use std::time::Duration;
use weir_kafka::rdkafka::mocking::MockCluster;
use weir_kafka::rdkafka::producer::DefaultProducerContext;
use weir_kafka::word_count::{self, KafkaWordCount, Update};
use weir_kafka::{Connection, DeliveryGuarantee, ParseErrorPolicy};
use weir_runtime::{JobError, JobResult};

pub const INPUT: &str = "numbers";
pub const OUTPUT: &str = "word-counts";
pub const SEED: u64 = 7;

/// librdkafka's mock cluster (3 brokers, on loopback ports) with both topics.
pub struct Cluster {
    pub mock: MockCluster<'static, DefaultProducerContext>,
    pub connection: Connection,
}

impl Cluster {
    pub fn new(partitions: i32) -> Self {
        init_logging();
        let mock = MockCluster::new(3).expect("mock cluster");
        for topic in [INPUT, OUTPUT] {
            mock.create_topic(topic, partitions, 3).expect("topic");
        }
        let mut connection = Connection::new(mock.bootstrap_servers());
        connection.request_timeout = Duration::from_secs(10);
        Cluster { mock, connection }
    }

    /// Produces records `0..n` of the generator into the input topic.
    pub fn produce(&self, n: u64) {
        word_count::produce(&self.connection, INPUT, n, SEED, weir_examples::DIGITS)
            .expect("produce");
    }

    /// What a `read_committed` consumer sees in the output topic.
    pub fn output(&self) -> Vec<Update> {
        word_count::read_committed(&self.connection, OUTPUT).expect("read the output")
    }

    /// The job's options: bounded, p=2, 100 ms checkpoints, exactly-once.
    pub fn options(&self, dir: &Path) -> KafkaWordCount {
        KafkaWordCount {
            connection: self.connection.clone(),
            input: INPUT.into(),
            output: OUTPUT.into(),
            parallelism: 2,
            checkpoint_interval: Some(Duration::from_millis(100)),
            checkpoint_dir: dir.to_path_buf(),
            from: None,
            fail_after: Vec::new(),
            guarantee: DeliveryGuarantee::ExactlyOnce {
                transactional_id_prefix: "test".into(),
            },
            bounded: true,
            on_parse_error: ParseErrorPolicy::Fail,
            transaction_timeout: Duration::from_secs(60),
            // The mock keeps no offsets sent to a transaction.
            marker: weir_kafka::MarkerMode::AfterCommit,
        }
    }
}

/// Runs a built job to its end.
pub fn run(env: weir_runtime::StreamEnvironment) -> Result<JobResult, JobError> {
    block_on(env.execute())
}

/// Runs a job's future (from `execute`) to its end.
pub fn block_on(
    job: impl std::future::Future<Output = Result<JobResult, JobError>>,
) -> Result<JobResult, JobError> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
        .block_on(job)
        .inspect(|_| {
            assert!(
                weir_kafka::await_commits(Duration::from_secs(120)),
                "the sink's commits did not end within 120 s"
            );
        })
}

/// The expected count of each word among the first `n` records.
pub fn expected(n: u64) -> std::collections::BTreeMap<String, i64> {
    word_count::expected_counts(n, SEED, weir_examples::DIGITS)
}

/// Logs what `RUST_LOG` asks for (a list of `target=level`), through the test harness.
fn init_logging() {
    use tracing_subscriber::prelude::*;
    if let Some(filter) = std::env::var("RUST_LOG")
        .ok()
        .and_then(|v| v.parse::<tracing_subscriber::filter::Targets>().ok())
    {
        let _ = tracing_subscriber::registry()
            .with(tracing_subscriber::fmt::layer().with_test_writer())
            .with(filter)
            .try_init();
    }
}
