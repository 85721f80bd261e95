//! The exactly-once sink's committer: a thread that owns one transactional producer and commits
//! the batches of completed checkpoints, each in a Kafka transaction, in checkpoint order.
//!
//! A transaction also commits a *marker*: the consumer-group offset of group
//! `<transactional id>` on partition 0 of the topic is set to the batch's checkpoint, with the
//! sink's lineage as its metadata. After a restore, the committer first fences the transactional
//! id (`init_transactions` aborts whatever an earlier producer left open), then reads the marker:
//! a restored batch at or below it was committed before the failure and is not committed again.

use super::batch::PendingBatch;
use crate::client::Connection;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::{Offset, TopicPartitionList};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, mpsc};
use std::thread::JoinHandle;
use std::time::Duration;

/// How long a new committer waits for its predecessor in this process to finish.
const DRAIN_WAIT: Duration = Duration::from_secs(30);

/// Tries of one batch's transaction before the committer gives up (each after an abortable
/// error: the transaction is aborted and produced again).
const TRIES: u32 = 5;

/// What the committer does next.
pub(crate) enum Job {
    /// Commit this batch (in order).
    Commit(Arc<PendingBatch>),
}

/// What the committer and its sink share.
#[derive(Debug, Default)]
pub(crate) struct Shared {
    /// The highest checkpoint whose batch is committed (or was found committed), plus one; 0:
    /// none yet.
    committed_through: AtomicU64,
    /// Why the committer stopped.
    error: Mutex<Option<String>>,
}

impl Shared {
    /// Whether the batch of `checkpoint` is committed.
    pub(crate) fn is_committed(&self, checkpoint: u64) -> bool {
        self.committed_through.load(Ordering::Acquire) > checkpoint
    }

    /// Why the committer failed, if it did.
    pub(crate) fn error(&self) -> Option<String> {
        self.error.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn fail(&self, message: String) {
        let mut e = self.error.lock().unwrap_or_else(|p| p.into_inner());
        e.get_or_insert(message);
    }
}

/// Committer threads of sinks that were torn down (a failover in this process) and may still be
/// committing decided batches; a new committer of the same transactional id waits for them, so
/// the two never fence each other half-way through a transaction.
static DRAINING: Mutex<Option<HashMap<String, JoinHandle<()>>>> = Mutex::new(None);

/// How many committer threads are running, and a signal when one ends.
static RUNNING: (Mutex<usize>, Condvar) = (Mutex::new(0), Condvar::new());

/// Counts a committer thread while it runs.
struct Running;

impl Running {
    fn start() -> Self {
        *RUNNING.0.lock().unwrap_or_else(|p| p.into_inner()) += 1;
        Running
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let mut n = RUNNING.0.lock().unwrap_or_else(|p| p.into_inner());
        *n = n.saturating_sub(1);
        RUNNING.1.notify_all();
    }
}

/// Waits up to `timeout` until every committer thread of this process has ended: after a job
/// finished, the commits of a sink subtask the job stopped waiting for (a slow broker) go on on
/// their own threads, and a process that exits at once would leave them to its next restore.
/// Returns whether all ended.
pub fn await_commits(timeout: Duration) -> bool {
    let deadline = std::time::Instant::now() + timeout;
    let mut n = RUNNING.0.lock().unwrap_or_else(|p| p.into_inner());
    while *n > 0 {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            return false;
        }
        n = RUNNING
            .1
            .wait_timeout(n, left)
            .unwrap_or_else(|p| p.into_inner())
            .0;
    }
    true
}

/// How a committer reaches Kafka.
#[derive(Clone)]
pub(crate) struct CommitterConfig {
    pub connection: Connection,
    pub topic: String,
    pub transactional_id: String,
    pub lineage: u64,
    pub transaction_timeout: Duration,
    pub marker: super::MarkerMode,
    /// It commits batches a checkpoint restored (a missing marker is then worth a warning).
    pub restored: bool,
    pub metrics: Arc<super::SinkMetrics>,
}

/// A committer thread and its queue.
pub(crate) struct Committer {
    jobs: Option<mpsc::Sender<Job>>,
    pub shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
    transactional_id: String,
}

impl Committer {
    /// Starts the committer of `config.transactional_id`, after any earlier one of it in this
    /// process finished.
    pub(crate) fn start(config: CommitterConfig) -> Result<Self, String> {
        let earlier = DRAINING
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get_or_insert_with(HashMap::new)
            .remove(&config.transactional_id);
        if let Some(t) = earlier {
            // A predecessor stuck on an unreachable broker must not hold the restore forever:
            // after a while it is fenced instead (its open transaction is aborted).
            let deadline = std::time::Instant::now() + DRAIN_WAIT;
            while !t.is_finished() && std::time::Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(10));
            }
            if t.is_finished() {
                let _ = t.join();
            } else {
                tracing::warn!(transactional_id = %config.transactional_id, wait = ?DRAIN_WAIT,
                    "the previous committer of this transactional id is still busy; fencing it");
            }
        }
        let shared = Arc::new(Shared::default());
        let (jobs, queue) = mpsc::channel();
        let id = config.transactional_id.clone();
        let s = shared.clone();
        let running = Running::start();
        let thread = std::thread::Builder::new()
            .name(format!("kafka-commit-{id}"))
            .spawn(move || {
                let _running = running;
                if let Err(e) = run(&config, &s, &queue) {
                    tracing::error!(transactional_id = %config.transactional_id, error = %e,
                        "the Kafka sink's committer failed");
                    s.fail(e);
                }
            })
            .map_err(|e| format!("cannot start the Kafka committer thread: {e}"))?;
        Ok(Committer {
            jobs: Some(jobs),
            shared,
            thread: Some(thread),
            transactional_id: id,
        })
    }

    /// Queues a batch.
    pub(crate) fn commit(&self, batch: Arc<PendingBatch>) -> Result<(), String> {
        let sent = self.jobs.as_ref().map(|j| j.send(Job::Commit(batch)));
        match sent {
            Some(Ok(())) => Ok(()),
            _ => Err(self
                .shared
                .error()
                .unwrap_or_else(|| "the Kafka committer stopped".into())),
        }
    }

    /// Waits until every queued batch is committed; the committer's error, if it failed.
    pub(crate) fn finish(mut self) -> Result<(), String> {
        self.jobs = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        match self.shared.error() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

impl Drop for Committer {
    fn drop(&mut self) {
        // Torn down (a failure elsewhere, a cancel): the queued batches belong to completed
        // checkpoints, so the thread commits them, and a successor waits for it.
        self.jobs = None;
        if let Some(t) = self.thread.take() {
            DRAINING
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .get_or_insert_with(HashMap::new)
                .insert(self.transactional_id.clone(), t);
        }
    }
}

/// The committer's life: fence, read the marker, then commit batches until the queue closes.
fn run(
    config: &CommitterConfig,
    shared: &Shared,
    queue: &mpsc::Receiver<Job>,
) -> Result<(), String> {
    let timeout = config.connection.request_timeout;
    let id = &config.transactional_id;
    let ms = config.transaction_timeout.as_millis().to_string();
    let producer: BaseProducer = config
        .connection
        .config(&[
            ("transactional.id", id.as_str()),
            ("transaction.timeout.ms", ms.as_str()),
        ])
        .create()
        .map_err(|e| format!("cannot create the Kafka producer of transactional id {id}: {e}"))?;
    let marker: BaseConsumer = config
        .connection
        .config_owning(
            &[],
            &[("group.id", id.as_str()), ("enable.auto.commit", "false")],
        )
        .create()
        .map_err(|e| format!("cannot create the marker consumer of {id}: {e}"))?;
    // Fences every earlier producer of this id and aborts the transaction it left open.
    producer.init_transactions(timeout).map_err(|e| {
        format!(
            "cannot initialize Kafka transactions for transactional id {id} at {} within \
             {timeout:?}: {e}",
            config.connection.bootstrap_servers
        )
    })?;
    let mut through = read_marker(&marker, config)?;
    if config.restored && through == 0 {
        tracing::warn!(transactional_id = %id,
            "no commit marker of this sink's lineage: the restored batches are committed now; \
             one committed before the failure is written again if its marker expired \
             (offsets.retention.minutes, 7 days by default)");
    }
    shared.committed_through.store(through, Ordering::Release);
    let group = marker
        .group_metadata()
        .ok_or_else(|| format!("the marker consumer of {id} has no group metadata"))?;
    while let Ok(Job::Commit(batch)) = queue.recv() {
        if batch.checkpoint < through {
            // Committed before the failure: the marker says so.
            config
                .metrics
                .batches_found_committed
                .fetch_add(1, Ordering::Relaxed);
            continue;
        }
        let mut tries = 0;
        loop {
            tries += 1;
            match transact(&producer, config, &batch, &group, timeout) {
                Ok(()) => {
                    tracing::debug!(transactional_id = %id, checkpoint = batch.checkpoint,
                        records = batch.records, tries, "Kafka transaction committed");
                    break;
                }
                Err(e) if tries < TRIES && abortable(&e) => {
                    tracing::warn!(transactional_id = %id, checkpoint = batch.checkpoint,
                        error = %e, "aborting the Kafka transaction to try it again");
                    producer
                        .abort_transaction(timeout)
                        .map_err(|e| format!("cannot abort the transaction of {id}: {e}"))?;
                    std::thread::sleep(Duration::from_millis(50 << tries.min(5)));
                }
                Err(e) => {
                    return Err(format!(
                        "cannot commit the Kafka transaction of checkpoint {} (transactional \
                         id {id}): {e}",
                        batch.checkpoint
                    ));
                }
            }
        }
        if config.marker == super::MarkerMode::AfterCommit {
            // Not atomic with the transaction: for clusters that keep no offsets sent to a
            // transaction (librdkafka's mock).
            let _ = marker.commit(&marker_offsets(config, batch.checkpoint)?, CommitMode::Sync);
        }
        through = batch.checkpoint.saturating_add(1);
        shared.committed_through.store(through, Ordering::Release);
        config
            .metrics
            .transactions_committed
            .fetch_add(1, Ordering::Relaxed);
    }
    Ok(())
}

/// Whether a transaction error is cured by aborting and producing the batch again.
fn abortable(e: &KafkaError) -> bool {
    match e {
        KafkaError::Transaction(t) => t.txn_requires_abort(),
        KafkaError::MessageProduction(_) | KafkaError::Flush(_) => true,
        _ => false,
    }
}

/// One batch in one transaction, with the marker. A retriable error of a transactional call is
/// retried in place (librdkafka's contract); one that requires an abort is returned.
fn transact(
    producer: &BaseProducer,
    config: &CommitterConfig,
    batch: &PendingBatch,
    group: &rdkafka::consumer::ConsumerGroupMetadata,
    timeout: Duration,
) -> Result<(), KafkaError> {
    retried(|| producer.begin_transaction())?;
    for (i, (key, value)) in batch.records().enumerate() {
        let mut record = BaseRecord::to(&config.topic).payload(value);
        if let Some(k) = key {
            record = record.key(k);
        }
        crate::client::send_waiting(producer, record)?;
        if i % 8192 == 8191 {
            producer.poll(Duration::ZERO);
        }
    }
    if config.marker == super::MarkerMode::InTransaction {
        let offsets =
            marker_offsets(config, batch.checkpoint).map_err(KafkaError::AdminOpCreation)?;
        retried(|| producer.send_offsets_to_transaction(&offsets, group, timeout))?;
    }
    retried(|| producer.commit_transaction(timeout))
}

/// Runs a transactional call again while it fails with a retriable error (a coordinator moving,
/// a broker down for a while), up to about a minute.
fn retried(mut call: impl FnMut() -> Result<(), KafkaError>) -> Result<(), KafkaError> {
    let mut tries = 0u32;
    loop {
        match call() {
            Err(KafkaError::Transaction(t)) if t.is_retriable() && tries < 60 => {
                tries += 1;
                tracing::debug!(error = %t, tries, "retrying a Kafka transactional call");
                std::thread::sleep(Duration::from_millis(100 * u64::from(tries.min(10))));
            }
            other => return other,
        }
    }
}

/// The marker of `checkpoint`: offset and lineage on partition 0 of the topic.
fn marker_offsets(config: &CommitterConfig, checkpoint: u64) -> Result<TopicPartitionList, String> {
    let mut tpl = TopicPartitionList::new();
    let mut e = tpl.add_partition(&config.topic, 0);
    e.set_offset(Offset::Offset(
        i64::try_from(checkpoint).unwrap_or(i64::MAX),
    ))
    .map_err(|e| format!("cannot set the marker offset: {e}"))?;
    e.set_metadata(format!("{:016x}", config.lineage));
    Ok(tpl)
}

/// The first checkpoint not committed yet, by the marker: 0 when the marker is absent or of
/// another lineage (an earlier job that used the same transactional id).
fn read_marker(marker: &BaseConsumer, config: &CommitterConfig) -> Result<u64, String> {
    let mut q = TopicPartitionList::new();
    q.add_partition(&config.topic, 0);
    let found = marker
        .committed_offsets(q, config.connection.request_timeout)
        .map_err(|e| {
            format!(
                "cannot read the commit marker of transactional id {}: {e}",
                config.transactional_id
            )
        })?;
    let lineage = format!("{:016x}", config.lineage);
    Ok(match found.elements().first() {
        Some(e) if e.metadata() == lineage => match e.offset() {
            Offset::Offset(o) if o >= 0 => (o as u64).saturating_add(1),
            _ => 0,
        },
        _ => 0,
    })
}
