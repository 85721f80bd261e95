//! Kafka clients as the connectors configure them, and the checks a job makes before it starts:
//! the brokers answer within a timeout, and every topic exists.

use crate::split::TopicPartition;
use rdkafka::ClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::ToBytes;
use rdkafka::producer::{BaseProducer, BaseRecord, DeliveryResult, ProducerContext};
use rdkafka::types::RDKafkaErrorCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// How to reach the cluster: the brokers, librdkafka properties, and the timeout of a request
/// the connectors wait for.
#[derive(Clone, Debug)]
pub struct Connection {
    /// `bootstrap.servers`.
    pub bootstrap_servers: String,
    /// Further librdkafka properties (`security.protocol`, `client.id`, ...), applied last.
    pub properties: Vec<(String, String)>,
    /// How long a metadata, offset or transaction request may take before it is an error.
    pub request_timeout: Duration,
}

impl Connection {
    /// The brokers at `bootstrap_servers`, with a 10 s request timeout.
    pub fn new(bootstrap_servers: impl Into<String>) -> Self {
        Connection {
            bootstrap_servers: bootstrap_servers.into(),
            properties: Vec::new(),
            request_timeout: Duration::from_secs(10),
        }
    }

    /// A librdkafka client configuration with the brokers and the user's properties.
    pub fn client_config(&self) -> ClientConfig {
        self.config(&[])
    }

    /// A client configuration with the brokers, `defaults`, then the user's properties.
    pub(crate) fn config(&self, defaults: &[(&str, &str)]) -> ClientConfig {
        self.config_owning(defaults, &[])
    }

    /// [`config`](Self::config), with `owned` set after the user's properties: keys the
    /// connector's correctness rests on (a committer's `transactional.id` and marker
    /// `group.id`), which a shared property must not replace.
    pub(crate) fn config_owning(
        &self,
        defaults: &[(&str, &str)],
        owned: &[(&str, &str)],
    ) -> ClientConfig {
        let mut c = ClientConfig::new();
        c.set("bootstrap.servers", &self.bootstrap_servers);
        // librdkafka logs through its own callback; keep its noise out of a job's output.
        c.set("log_level", "3");
        for (k, v) in defaults {
            c.set(*k, *v);
        }
        for (k, v) in &self.properties {
            c.set(k, v);
        }
        for (k, v) in owned {
            c.set(*k, *v);
        }
        c
    }

    /// A consumer for metadata and offset lookups.
    pub(crate) fn admin_consumer(&self) -> Result<BaseConsumer, String> {
        self.config(&[("enable.auto.commit", "false")])
            .create()
            .map_err(|e| {
                format!(
                    "cannot create a Kafka client for {}: {e}",
                    self.bootstrap_servers
                )
            })
    }

    /// The partitions of `topics`; an error names an unreachable cluster or a missing topic.
    pub fn partitions(&self, topics: &[String]) -> Result<Vec<TopicPartition>, String> {
        let consumer = self.admin_consumer()?;
        list_partitions(
            &consumer,
            topics,
            self.request_timeout,
            &self.bootstrap_servers,
        )
    }
}

/// The partitions of `topics` as `consumer` sees them.
pub(crate) fn list_partitions(
    consumer: &BaseConsumer,
    topics: &[String],
    timeout: Duration,
    brokers: &str,
) -> Result<Vec<TopicPartition>, String> {
    let mut out = Vec::new();
    for topic in topics {
        let metadata = consumer.fetch_metadata(Some(topic), timeout).map_err(|e| {
            format!(
                "the Kafka cluster at {brokers} did not answer a metadata request for topic \
                 '{topic}' within {timeout:?}: {e}"
            )
        })?;
        let Some(t) = metadata.topics().iter().find(|t| t.name() == topic) else {
            return Err(format!("Kafka topic '{topic}' does not exist at {brokers}"));
        };
        if let Some(e) = t.error() {
            return Err(format!(
                "Kafka topic '{topic}' at {brokers} is not usable: {}",
                rdkafka::types::RDKafkaErrorCode::from(e)
            ));
        }
        if t.partitions().is_empty() {
            return Err(format!("Kafka topic '{topic}' does not exist at {brokers}"));
        }
        out.extend(t.partitions().iter().map(|p| TopicPartition {
            topic: topic.clone(),
            partition: p.id(),
        }));
    }
    Ok(out)
}

/// Queues `record`, serving delivery reports while librdkafka's queue is full.
pub(crate) fn send_waiting<C, K, P>(
    producer: &BaseProducer<C>,
    record: BaseRecord<'_, K, P, C::DeliveryOpaque>,
) -> Result<(), KafkaError>
where
    C: ProducerContext,
    K: ToBytes + ?Sized,
    P: ToBytes + ?Sized,
{
    let mut record = record;
    loop {
        match producer.send(record) {
            Ok(()) => return Ok(()),
            Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back)) => {
                record = back;
                producer.poll(Duration::from_millis(1));
            }
            Err((e, _)) => return Err(e),
        }
    }
}

/// A producer context that counts delivered records and keeps the first delivery failure (the
/// default context drops them: a flush then succeeds with records lost).
#[derive(Clone, Default)]
pub struct Deliveries {
    delivered: Arc<AtomicU64>,
    first_error: Arc<Mutex<Option<String>>>,
}

impl Deliveries {
    /// Records acknowledged by the cluster.
    pub fn delivered(&self) -> u64 {
        self.delivered.load(Ordering::Relaxed)
    }

    /// The first delivery failure, if any.
    pub fn error(&self) -> Option<String> {
        self.first_error
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

impl ClientContext for Deliveries {}

impl ProducerContext for Deliveries {
    type DeliveryOpaque = ();

    fn delivery(&self, result: &DeliveryResult<'_>, _: ()) {
        match result {
            Ok(_) => {
                self.delivered.fetch_add(1, Ordering::Relaxed);
            }
            Err((e, _)) => {
                self.first_error
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .get_or_insert_with(|| e.to_string());
            }
        }
    }
}
