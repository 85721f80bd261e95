//! Kafka connectors for Weir (Flink's `flink-connector-kafka`): a source whose partition
//! offsets are checkpointed, so a restore resumes exactly where the checkpoint was, and a sink
//! with at-least-once or exactly-once (transactional) delivery.
//!
//! The crate uses only Weir's public API: the source is a [`SourceFunction`] with a
//! [`SplitEnumerator`], the sink a [`OneInputOperator`] with operator state.
//!
//! [`SourceFunction`]: weir_runtime::source::SourceFunction
//! [`SplitEnumerator`]: weir_runtime::source::SplitEnumerator
//! [`OneInputOperator`]: weir_runtime::operator::OneInputOperator

mod client;
mod enumerator;
mod reader;
mod sink;
mod source;
mod split;
pub mod word_count;

pub use client::{Connection, Deliveries};
pub use enumerator::KafkaSplitEnumerator;
pub use reader::{Deserializer, KafkaRecord, SourceMetrics};
pub use sink::{DeliveryGuarantee, KafkaSink, MarkerMode, Serializer, SinkMetrics, await_commits};
pub use source::KafkaSource;
pub use split::{KafkaSplit, SplitStart, StartingOffsets, StoppingOffsets, TopicPartition, owner};
pub use weir_runtime::ParseErrorPolicy;

/// Re-exported for tests and tools that start librdkafka's in-process mock cluster.
pub use rdkafka;

use weir_runtime::TaskError;

/// An error of the Kafka source, as the task reports it.
pub(crate) fn source_error(message: String) -> TaskError {
    TaskError::Operator {
        operator: "Kafka source".into(),
        message,
    }
}
