//! The Kafka sink (Flink's `KafkaSink`), at-least-once or exactly-once.
//!
//! **At-least-once** produces each record as it arrives (an idempotent producer) and, at each
//! checkpoint's barrier, waits until every record is acknowledged: a checkpoint never completes
//! with a record not in Kafka, and a restore may write some records again.
//!
//! **Exactly-once** commits one Kafka transaction per subtask per checkpoint, when the
//! checkpoint completes. librdkafka cannot resume a transaction that another producer began
//! (Flink's `KafkaSink` does it with reflection into the Java client), so a pre-committed
//! transaction cannot outlive a failure. The sink therefore keeps a checkpoint interval's records
//! in its checkpoint instead of in an open transaction (Flink's write-ahead sink): at the barrier
//! the records since the last checkpoint become a *pending batch* in operator state; when the
//! checkpoint completes, a committer thread produces the batch in a transaction under the
//! transactional id `<prefix>-<subtask>-of-<parallelism>` and commits it together with a marker
//! (see `committer`). After a restore, the committer fences the id (aborting whatever an earlier
//! producer left open, the lingering transactions), then commits the restored pending batches
//! the marker does not show as committed. A `read_committed` consumer sees every record once.
//!
//! Records become visible when their checkpoint completes, as with Flink's exactly-once sink.
//! Each transaction lasts as long as producing one batch; `transaction.timeout.ms` must exceed
//! the checkpoint interval (checked when the sink is added), since a batch holds an interval's
//! records.

mod batch;
mod committer;

use crate::client::{Connection, Deliveries, send_waiting};
use batch::{FINAL, OpenBatch, PendingBatch};
pub use committer::await_commits;
use committer::{Committer, CommitterConfig};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use weir_core::handle::OperatorStateMode;
use weir_core::ids::{CheckpointId, OperatorId};
use weir_runtime::operator::{
    Chained, Lifecycle, OneInputOperator, OpResult, OperatorSnapshotParts, Output, RestoreContext,
};
use weir_runtime::{DataStream, TaskError};
use weir_state::{OperatorListState, OperatorStateBackend};

/// What the sink promises (Flink's `DeliveryGuarantee`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DeliveryGuarantee {
    /// Every record at least once: flushed at each checkpoint.
    AtLeastOnce,
    /// Every record exactly once for `read_committed` consumers: one transaction per subtask
    /// per checkpoint. The prefix must be unique to the job: two jobs with the same prefix fence
    /// each other's transactions.
    ExactlyOnce {
        /// The prefix of the sink's transactional ids.
        transactional_id_prefix: String,
    },
}

/// Where the exactly-once sink commits the marker that tells a restore which batches are done.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum MarkerMode {
    /// Inside each transaction (`send_offsets_to_transaction`): atomic with the batch. The
    /// default, for Kafka brokers.
    #[default]
    InTransaction,
    /// Outside, right after each commit: for a cluster that keeps no offsets sent to a
    /// transaction (librdkafka's mock cluster, which also can wait forever in
    /// `send_offsets_to_transaction` while a broker is down). Not atomic: a process that dies
    /// between a commit and its marker writes that batch again after the restore.
    AfterCommit,
}

/// Writes a record's key (left empty for none) and value into the buffers.
pub type Serializer<T> = Arc<dyn Fn(&T, &mut Vec<u8>, &mut Vec<u8>) + Send + Sync>;

/// Counters a sink shares with the job's client.
#[derive(Debug, Default)]
pub struct SinkMetrics {
    /// Records the sink took in (Flink's `numRecordsOut` of a sink).
    pub records_in: AtomicU64,
    /// Transactions committed.
    pub transactions_committed: AtomicU64,
    /// Restored batches found already committed (by their marker), so not written again.
    pub batches_found_committed: AtomicU64,
}

/// The Kafka sink; [`sink`](Self::sink) adds it to a stream.
pub struct KafkaSink<T> {
    connection: Connection,
    topic: String,
    guarantee: DeliveryGuarantee,
    serializer: Serializer<T>,
    transaction_timeout: Duration,
    marker: MarkerMode,
    metrics: Arc<SinkMetrics>,
}

/// The operator state of the pending batches: one element per subtask.
const PENDING: &str = "kafka-sink-pending-transactions";

/// One subtask's pending batches, as a checkpoint holds them.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct PendingTransactions {
    transactional_id: String,
    /// Tells this sink's markers from those an earlier job with the same id left.
    lineage: u64,
    batches: Vec<PendingBatch>,
}

impl<T: weir_runtime::Data> KafkaSink<T> {
    /// A sink into `topic` that turns each record into a key and value with `serializer`;
    /// at-least-once, with a 15-minute transaction timeout for exactly-once.
    pub fn new(
        connection: Connection,
        topic: impl Into<String>,
        serializer: impl Fn(&T, &mut Vec<u8>, &mut Vec<u8>) + Send + Sync + 'static,
    ) -> Self {
        KafkaSink {
            connection,
            topic: topic.into(),
            guarantee: DeliveryGuarantee::AtLeastOnce,
            serializer: Arc::new(serializer),
            transaction_timeout: Duration::from_secs(15 * 60),
            marker: MarkerMode::InTransaction,
            metrics: Arc::default(),
        }
    }

    /// The delivery guarantee.
    pub fn delivery_guarantee(mut self, guarantee: DeliveryGuarantee) -> Self {
        self.guarantee = guarantee;
        self
    }

    /// `transaction.timeout.ms` of the exactly-once producers: at most the broker's
    /// `transaction.max.timeout.ms` (15 min by default), and more than the checkpoint interval.
    pub fn transaction_timeout(mut self, timeout: Duration) -> Self {
        self.transaction_timeout = timeout;
        self
    }

    /// Where the exactly-once sink commits its marker (see [`MarkerMode`]).
    pub fn marker(mut self, mode: MarkerMode) -> Self {
        self.marker = mode;
        self
    }

    /// The sink's counters.
    pub fn metrics(&self) -> Arc<SinkMetrics> {
        self.metrics.clone()
    }

    /// Adds the sink after `stream`. Fails, naming the problem, when the cluster does not answer
    /// within the request timeout, the topic does not exist, or the transaction timeout is not
    /// longer than the job's checkpoint interval.
    pub fn sink(self, stream: DataStream<T>) -> Result<DataStream<()>, String> {
        let interval = stream.environment().checkpoint_config().interval;
        if let (
            DeliveryGuarantee::ExactlyOnce {
                transactional_id_prefix,
            },
            Some(interval),
        ) = (&self.guarantee, interval)
        {
            if self.transaction_timeout <= interval {
                return Err(format!(
                    "the Kafka transaction timeout ({:?}) must be longer than the checkpoint \
                     interval ({interval:?}): each transaction writes one interval's records",
                    self.transaction_timeout
                ));
            }
            if transactional_id_prefix.is_empty() {
                return Err(
                    "the transactional id prefix of an exactly-once Kafka sink is empty".into(),
                );
            }
        }
        self.connection
            .partitions(std::slice::from_ref(&self.topic))?;
        let shared = Arc::new(self);
        Ok(stream.transform("Kafka Sink", move |ctx, next| {
            let writer = KafkaWriter::new(
                shared.clone(),
                ctx.operator_id,
                ctx.info.index,
                ctx.info.parallelism,
            );
            Box::new(Chained::new(writer, next))
        }))
    }
}

/// How a subtask writes.
enum Mode {
    /// Not open yet.
    Closed,
    AtLeastOnce {
        producer: BaseProducer<Deliveries>,
        deliveries: Deliveries,
    },
    ExactlyOnce(Box<Transactional>),
}

/// The exactly-once state of a subtask.
struct Transactional {
    transactional_id: String,
    lineage: u64,
    open: OpenBatch,
    /// Sealed batches not known to be committed, in checkpoint order; the flag says whether the
    /// committer has them.
    sealed: Vec<(Arc<PendingBatch>, bool)>,
    committer: Option<Committer>,
    list: OperatorListState<PendingTransactions>,
}

/// One subtask of the sink.
struct KafkaWriter<T> {
    sink: Arc<KafkaSink<T>>,
    operator_id: OperatorId,
    subtask: u32,
    parallelism: u32,
    state: OperatorStateBackend,
    mode: Mode,
    key: Vec<u8>,
    value: Vec<u8>,
}

fn sink_error(message: String) -> TaskError {
    TaskError::Operator {
        operator: "Kafka sink".into(),
        message,
    }
}

impl<T: weir_runtime::Data> KafkaWriter<T> {
    fn new(
        sink: Arc<KafkaSink<T>>,
        operator_id: OperatorId,
        subtask: u32,
        parallelism: u32,
    ) -> Self {
        KafkaWriter {
            sink,
            operator_id,
            subtask,
            parallelism,
            state: OperatorStateBackend::new(),
            mode: Mode::Closed,
            key: Vec::new(),
            value: Vec::new(),
        }
    }

    fn committer_config(&self, transactional_id: String, lineage: u64) -> CommitterConfig {
        CommitterConfig {
            connection: self.sink.connection.clone(),
            topic: self.sink.topic.clone(),
            transactional_id,
            lineage,
            transaction_timeout: self.sink.transaction_timeout,
            marker: self.sink.marker,
            restored: false,
            metrics: self.sink.metrics.clone(),
        }
    }

    fn open(&mut self, ctx: &mut RestoreContext) -> OpResult {
        ctx.restore_operator_state(self.operator_id, &mut self.state)?;
        let list = self
            .state
            .list_state::<PendingTransactions>(PENDING, OperatorStateMode::SplitDistribute)?;
        let restored = self.state.get(&list)?;
        let prefix = match &self.sink.guarantee {
            DeliveryGuarantee::AtLeastOnce => return self.open_at_least_once(restored),
            DeliveryGuarantee::ExactlyOnce {
                transactional_id_prefix,
            } => transactional_id_prefix.clone(),
        };
        let own_id = format!("{prefix}-{}-of-{}", self.subtask, self.parallelism);
        // What the restored checkpoint left pending belongs to completed checkpoints: commit
        // it now, under the id and lineage that wrote it (another subtask's after a rescale),
        // before anything else is written. The marker of that lineage says what is done.
        for pending in restored {
            for b in &pending.batches {
                b.check().map_err(sink_error)?;
            }
            if pending.batches.is_empty() {
                continue;
            }
            let mut config =
                self.committer_config(pending.transactional_id.clone(), pending.lineage);
            config.restored = true;
            let committer = Committer::start(config).map_err(sink_error)?;
            for b in pending.batches {
                committer.commit(Arc::new(b)).map_err(sink_error)?;
            }
            committer.finish().map_err(sink_error)?;
        }
        // A new lineage from here on: this run's checkpoint ids may repeat those of the run it
        // restored (a savepoint or an older checkpoint in a new directory), and a marker of the
        // old lineage must never make a new batch look committed.
        let lineage = new_lineage();
        let committer =
            Committer::start(self.committer_config(own_id.clone(), lineage)).map_err(sink_error)?;
        self.mode = Mode::ExactlyOnce(Box::new(Transactional {
            transactional_id: own_id,
            lineage,
            open: OpenBatch::default(),
            sealed: Vec::new(),
            committer: Some(committer),
            list,
        }));
        Ok(())
    }

    /// At-least-once: the producer; batches an exactly-once run of this sink left pending are
    /// produced first (switching guarantees loses nothing; they may be written twice).
    fn open_at_least_once(&mut self, restored: Vec<PendingTransactions>) -> OpResult {
        let deliveries = Deliveries::default();
        let producer: BaseProducer<Deliveries> = self
            .sink
            .connection
            .config(&[("enable.idempotence", "true"), ("linger.ms", "5")])
            .create_with_context(deliveries.clone())
            .map_err(|e| sink_error(format!("cannot create the Kafka producer: {e}")))?;
        self.mode = Mode::AtLeastOnce {
            producer,
            deliveries,
        };
        for pending in restored {
            for b in pending.batches {
                b.check().map_err(sink_error)?;
                for (key, value) in b.records() {
                    self.produce(key, value)?;
                }
            }
        }
        self.flush()
    }

    fn write(&mut self, record: &T) -> OpResult {
        self.key.clear();
        self.value.clear();
        (self.sink.serializer)(record, &mut self.key, &mut self.value);
        let key = (!self.key.is_empty()).then_some(&self.key[..]);
        match &mut self.mode {
            Mode::Closed => Err(sink_error("the Kafka sink is not open".into())),
            Mode::ExactlyOnce(t) => {
                t.open.push(key, &self.value);
                Ok(())
            }
            Mode::AtLeastOnce { .. } => {
                let (key, value) = (
                    std::mem::take(&mut self.key),
                    std::mem::take(&mut self.value),
                );
                let produced = self.produce((!key.is_empty()).then_some(&key[..]), &value);
                (self.key, self.value) = (key, value);
                produced
            }
        }
    }

    /// At-least-once: produces one record, waiting while librdkafka's queue is full.
    fn produce(&self, key: Option<&[u8]>, value: &[u8]) -> OpResult {
        let Mode::AtLeastOnce { producer, .. } = &self.mode else {
            return Err(sink_error("the at-least-once producer is not open".into()));
        };
        let mut r = BaseRecord::to(&self.sink.topic).payload(value);
        if let Some(k) = key {
            r = r.key(k);
        }
        send_waiting(producer, r).map_err(|e| {
            sink_error(format!(
                "cannot produce to Kafka topic '{}': {e}",
                self.sink.topic
            ))
        })
    }

    /// The committer's failure, or the at-least-once producer's first failed delivery.
    fn check(&self) -> OpResult {
        let failed = match &self.mode {
            Mode::ExactlyOnce(t) => t.committer.as_ref().and_then(|c| c.shared.error()),
            Mode::AtLeastOnce { deliveries, .. } => deliveries.error().map(|e| {
                format!(
                    "a record was not delivered to Kafka topic '{}': {e}",
                    self.sink.topic
                )
            }),
            Mode::Closed => None,
        };
        failed.map_or(Ok(()), |e| Err(sink_error(e)))
    }

    /// At-least-once: waits until every record produced is acknowledged.
    fn flush(&self) -> OpResult {
        if let Mode::AtLeastOnce { producer, .. } = &self.mode {
            producer
                .flush(self.sink.connection.request_timeout)
                .map_err(|e| {
                    sink_error(format!(
                        "cannot flush the records for Kafka topic '{}' within {:?}: {e}",
                        self.sink.topic, self.sink.connection.request_timeout
                    ))
                })?;
        }
        self.check()
    }

    /// Seals the open batch as `checkpoint`'s and records the pending batches in operator state.
    fn seal(&mut self, checkpoint: u64) -> OpResult {
        let Mode::ExactlyOnce(t) = &mut self.mode else {
            return Ok(());
        };
        if let Some(b) = t.open.seal(checkpoint) {
            t.sealed.push((Arc::new(b), false));
        }
        if let Some(c) = &t.committer {
            t.sealed
                .retain(|(b, _)| !c.shared.is_committed(b.checkpoint));
        }
        let pending = PendingTransactions {
            transactional_id: t.transactional_id.clone(),
            lineage: t.lineage,
            batches: t.sealed.iter().map(|(b, _)| b.as_ref().clone()).collect(),
        };
        self.state.update(&t.list, &[pending])?;
        Ok(())
    }

    /// Hands the committer every sealed batch up to `checkpoint`.
    fn commit_up_to(&mut self, checkpoint: u64) -> OpResult {
        let Mode::ExactlyOnce(t) = &mut self.mode else {
            return Ok(());
        };
        let Some(c) = &t.committer else {
            return Ok(());
        };
        for (b, handed) in t.sealed.iter_mut() {
            if !*handed && b.checkpoint <= checkpoint {
                c.commit(b.clone()).map_err(sink_error)?;
                *handed = true;
            }
        }
        Ok(())
    }

    /// At the job's end: commits everything and waits for it.
    fn finish(&mut self) -> OpResult {
        self.commit_up_to(FINAL)?;
        if let Mode::ExactlyOnce(t) = &mut self.mode
            && let Some(c) = t.committer.take()
        {
            c.finish().map_err(sink_error)?;
        }
        self.flush()
    }
}

/// A lineage no earlier run of a sink chose: the time, the process and a counter, mixed.
fn new_lineage() -> u64 {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    weir_core::splitmix::splitmix64(
        nanos ^ (u64::from(std::process::id()) << 32) ^ n.rotate_left(17),
    )
}

impl<T: weir_runtime::Data> OneInputOperator<T> for KafkaWriter<T> {
    type Out = ();

    fn process(&mut self, record: T, _out: &mut dyn Output<()>) -> OpResult {
        self.sink.metrics.records_in.fetch_add(1, Ordering::Relaxed);
        self.write(&record)
    }

    fn process_batch(&mut self, batch: Vec<T>, _out: &mut dyn Output<()>) -> OpResult {
        self.check()?;
        self.sink
            .metrics
            .records_in
            .fetch_add(batch.len() as u64, Ordering::Relaxed);
        for record in &batch {
            self.write(record)?;
        }
        if let Mode::AtLeastOnce { producer, .. } = &self.mode {
            producer.poll(Duration::ZERO);
        }
        Ok(())
    }

    fn lifecycle(&mut self, event: &mut Lifecycle<'_>, _out: &mut dyn Output<()>) -> OpResult {
        match event {
            Lifecycle::Open(ctx) => self.open(ctx)?,
            Lifecycle::Snapshot(CheckpointId(id), _, parts) => {
                self.flush()?;
                self.seal(*id)?;
                parts.push(OperatorSnapshotParts::operator_state(
                    self.operator_id,
                    &self.state,
                ));
            }
            Lifecycle::NotifyComplete(CheckpointId(id)) => {
                self.check()?;
                self.commit_up_to(*id)?;
            }
            // The last records wait for the whole job: if another subtask fails first, this
            // one is restored and writes them again, and they must not be committed twice.
            Lifecycle::EndInput => {
                self.flush()?;
                self.seal(FINAL)?;
            }
            Lifecycle::JobFinished => self.finish()?,
            _ => {}
        }
        Ok(())
    }
}
