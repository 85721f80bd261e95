//! Sinks: print (Flink's `subtask> record`), the exactly-once two-phase-commit sink (collect,
//! for tests; part files are `file_sink`'s), and the latest-value-per-key sink that keeps final
//! totals.
//!
//! The two-phase-commit sink is Flink's `TwoPhaseCommitSinkFunction`: records since the last
//! checkpoint form the open transaction; a snapshot pre-commits it into operator state; the
//! checkpoint's completion commits it; a restore commits what the restored checkpoint had
//! pre-committed. Commits are idempotent (keyed by subtask and transaction), so the committed
//! output equals a failure-free run's.

use crate::error::TaskError;
use crate::keyed::{KeyFn, KeyedBase};
use crate::operator::{
    Lifecycle, OneInputOperator, OpResult, OperatorSnapshotParts, Output, SubtaskInfo,
};
use serde::{Serialize, de::DeserializeOwned};
use std::collections::BTreeMap;
use std::fmt::Display;
use std::io::Write;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};
use weir_core::handle::OperatorStateMode;
use weir_core::ids::{CheckpointId, OperatorId};
use weir_core::keygroup::{KeyGroup, KeyGroupRange};
use weir_state::{
    KeyedStateBackend, OperatorListState, OperatorStateBackend, StateKey, StateValue, ValueState,
    ValueStateDescriptor,
};

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// How a record prints: tuples as Flink prints them, `(a,b)`.
pub trait Printable {
    /// Writes the record.
    fn print(&self, out: &mut dyn Write) -> std::io::Result<()>;
}

macro_rules! printable_display {
    ($($t:ty),*) => {$(
        impl Printable for $t {
            fn print(&self, out: &mut dyn Write) -> std::io::Result<()> {
                write!(out, "{}", self)
            }
        }
    )*};
}
printable_display!(
    String,
    &'static str,
    i8,
    i16,
    i32,
    i64,
    u8,
    u16,
    u32,
    u64,
    usize,
    f32,
    f64,
    bool,
    char
);

impl<A: Display, B: Display> Printable for (A, B) {
    fn print(&self, out: &mut dyn Write) -> std::io::Result<()> {
        write!(out, "({},{})", self.0, self.1)
    }
}

impl<A: Display, B: Display, C: Display> Printable for (A, B, C) {
    fn print(&self, out: &mut dyn Write) -> std::io::Result<()> {
        write!(out, "({},{},{})", self.0, self.1, self.2)
    }
}

/// Prints every record to stdout as `subtask> record` (the prefix only when parallelism > 1),
/// as Flink's `print()` does. At-least-once, like Flink's.
pub struct PrintSink {
    prefix: String,
}

impl PrintSink {
    /// For subtask `info`.
    pub fn new(info: &SubtaskInfo) -> Self {
        PrintSink {
            prefix: if info.parallelism > 1 {
                format!("{}> ", info.index + 1)
            } else {
                String::new()
            },
        }
    }
}

impl<T: Printable + Send + 'static> OneInputOperator<T> for PrintSink {
    type Out = ();

    fn process(&mut self, record: T, out: &mut dyn Output<()>) -> OpResult {
        self.process_batch(vec![record], out)
    }

    fn process_batch(&mut self, batch: Vec<T>, _out: &mut dyn Output<()>) -> OpResult {
        let stdout = std::io::stdout();
        let mut w = std::io::BufWriter::new(stdout.lock());
        for r in &batch {
            let _ = w.write_all(self.prefix.as_bytes());
            let _ = r.print(&mut w);
            let _ = w.write_all(b"\n");
        }
        let _ = w.flush();
        Ok(())
    }
}

/// Where a two-phase-commit sink commits its transactions. `commit` must be idempotent: the
/// same `(subtask, transaction)` may be committed more than once after a failure.
pub trait Committer<T>: Send + Sync + 'static {
    /// Makes the records of one transaction visible.
    fn commit(&self, subtask: u32, transaction: u64, records: Vec<T>) -> Result<(), String>;
}

/// The transaction id of the records after the last checkpoint, committed at end of input.
pub const FINAL_TRANSACTION: u64 = u64::MAX;

/// The pre-committed transactions, each with the subtask that opened it: after a rescale a
/// subtask may be handed another's, and must commit it under that subtask's name (a committer
/// is idempotent per `(subtask, transaction)`).
const PENDING_STATE: &str = "pending-transactions-by-subtask";
/// The same without the subtask, as the first release wrote it; read on restore only.
const LEGACY_PENDING_STATE: &str = "pending-transactions";

/// Flink's two-phase-commit sink over a [`Committer`].
pub struct TwoPhaseCommitSink<T, C> {
    operator_id: OperatorId,
    subtask: u32,
    committer: Arc<C>,
    open: Vec<T>,
    pending: BTreeMap<u64, Vec<T>>,
    state: OperatorStateBackend,
    list: Option<OperatorListState<(u32, u64, Vec<T>)>>,
}

impl<T, C> TwoPhaseCommitSink<T, C>
where
    T: Clone + Serialize + DeserializeOwned + Send + Sync + 'static,
    C: Committer<T>,
{
    /// A sink for subtask `info` committing to `committer`.
    pub fn new(operator_id: OperatorId, info: &SubtaskInfo, committer: Arc<C>) -> Self {
        TwoPhaseCommitSink {
            operator_id,
            subtask: info.index,
            committer,
            open: Vec::new(),
            pending: BTreeMap::new(),
            state: OperatorStateBackend::new(),
            list: None,
        }
    }

    fn commit_up_to(&mut self, id: u64) -> OpResult {
        let later = match id.checked_add(1) {
            Some(next) => self.pending.split_off(&next),
            None => BTreeMap::new(),
        };
        let due = std::mem::replace(&mut self.pending, later);
        // An empty transaction publishes nothing: not committing it keeps an id that a restore
        // already committed with its records from being committed again, empty.
        for (txn, records) in due.into_iter().filter(|(_, r)| !r.is_empty()) {
            self.committer
                .commit(self.subtask, txn, records)
                .map_err(|message| TaskError::Operator {
                    operator: "two-phase-commit sink".into(),
                    message,
                })?;
        }
        Ok(())
    }
}

impl<T, C> OneInputOperator<T> for TwoPhaseCommitSink<T, C>
where
    T: Clone + Serialize + DeserializeOwned + Send + Sync + 'static,
    C: Committer<T>,
{
    type Out = ();

    fn process(&mut self, record: T, _out: &mut dyn Output<()>) -> OpResult {
        self.open.push(record);
        Ok(())
    }

    fn process_batch(&mut self, batch: Vec<T>, _out: &mut dyn Output<()>) -> OpResult {
        self.open.extend(batch);
        Ok(())
    }

    fn lifecycle(&mut self, event: &mut Lifecycle<'_>, _out: &mut dyn Output<()>) -> OpResult {
        match event {
            Lifecycle::Open(ctx) => {
                ctx.restore_operator_state(self.operator_id, &mut self.state)?;
                let commit = |subtask: u32, txn: u64, records: Vec<T>| {
                    if records.is_empty() {
                        return Ok(());
                    }
                    self.committer
                        .commit(subtask, txn, records)
                        .map_err(|message| TaskError::Operator {
                            operator: "two-phase-commit sink".into(),
                            message,
                        })
                };
                // What the restored checkpoint pre-committed belongs to a completed checkpoint:
                // commit it under the subtask that opened it.
                let list = self.state.list_state::<(u32, u64, Vec<T>)>(
                    PENDING_STATE,
                    OperatorStateMode::SplitDistribute,
                )?;
                for (subtask, txn, records) in self.state.get(&list)? {
                    commit(subtask, txn, records)?;
                }
                self.state.update(&list, &[])?;
                let legacy = self.state.list_state::<(u64, Vec<T>)>(
                    LEGACY_PENDING_STATE,
                    OperatorStateMode::SplitDistribute,
                )?;
                for (txn, records) in self.state.get(&legacy)? {
                    commit(self.subtask, txn, records)?;
                }
                self.state.update(&legacy, &[])?;
                self.list = Some(list);
            }
            Lifecycle::Snapshot(id, _, parts) => {
                let txn = std::mem::take(&mut self.open);
                self.pending.insert(id.0, txn);
                if let Some(list) = &self.list {
                    let pending: Vec<(u32, u64, Vec<T>)> = self
                        .pending
                        .iter()
                        .map(|(k, v)| (self.subtask, *k, v.clone()))
                        .collect();
                    self.state.update(list, &pending)?;
                }
                parts.push(OperatorSnapshotParts::operator_state(
                    self.operator_id,
                    &self.state,
                ));
            }
            Lifecycle::NotifyComplete(CheckpointId(id)) => self.commit_up_to(*id)?,
            // An aborted checkpoint's transaction stays pending: the next checkpoint that
            // completes commits every transaction up to its id, this one included.
            // The last records wait for the whole job to finish: if another subtask fails
            // first, this one is restored and replays them, and they must not be committed twice.
            Lifecycle::EndInput => {
                let last = std::mem::take(&mut self.open);
                self.pending.insert(FINAL_TRANSACTION, last);
            }
            Lifecycle::JobFinished => self.commit_up_to(FINAL_TRANSACTION)?,
            _ => {}
        }
        Ok(())
    }
}

/// Collects committed records in memory: the exactly-once test sink.
pub struct CollectCommitter<T> {
    committed: Mutex<BTreeMap<(u32, u64), Vec<T>>>,
}

impl<T: Send + 'static> CollectCommitter<T> {
    fn new() -> Self {
        CollectCommitter {
            committed: Mutex::new(BTreeMap::new()),
        }
    }
}

impl<T: Send + 'static> Committer<T> for CollectCommitter<T> {
    fn commit(&self, subtask: u32, transaction: u64, records: Vec<T>) -> Result<(), String> {
        lock(&self.committed)
            .entry((subtask, transaction))
            .or_insert(records);
        Ok(())
    }
}

/// The handle a test reads collected records from.
pub struct CollectHandle<T> {
    pub(crate) committer: Arc<CollectCommitter<T>>,
}

impl<T> Clone for CollectHandle<T> {
    fn clone(&self) -> Self {
        CollectHandle {
            committer: self.committer.clone(),
        }
    }
}

impl<T: Clone + Send + 'static> CollectHandle<T> {
    pub(crate) fn new() -> Self {
        CollectHandle {
            committer: Arc::new(CollectCommitter::new()),
        }
    }

    /// Every committed record, by subtask, then transaction, then arrival.
    pub fn records(&self) -> Vec<T> {
        lock(&self.committer.committed)
            .values()
            .flat_map(|v| v.iter().cloned())
            .collect()
    }

    /// The committed records of each subtask, in order.
    pub fn records_by_subtask(&self) -> BTreeMap<u32, Vec<T>> {
        let mut out: BTreeMap<u32, Vec<T>> = BTreeMap::new();
        for ((s, _), v) in lock(&self.committer.committed).iter() {
            out.entry(*s).or_default().extend(v.iter().cloned());
        }
        out
    }
}

/// Writes each committed transaction as a file `part-<subtask>-<transaction>` of printed lines,
/// created atomically (temporary file, then rename), so a commit is all or nothing and a repeat
/// is a no-op.
pub struct FileCommitter {
    dir: PathBuf,
}

impl FileCommitter {
    /// Into `dir`, created if needed.
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        FileCommitter { dir: dir.into() }
    }
}

impl<T: Printable + Send + 'static> Committer<T> for FileCommitter {
    fn commit(&self, subtask: u32, transaction: u64, records: Vec<T>) -> Result<(), String> {
        let name = if transaction == FINAL_TRANSACTION {
            format!("part-{subtask}-final")
        } else {
            format!("part-{subtask}-{transaction:012}")
        };
        let path = self.dir.join(&name);
        if path.exists() || records.is_empty() {
            return Ok(());
        }
        let fail = |e: std::io::Error| format!("cannot commit {}: {e}", path.display());
        std::fs::create_dir_all(&self.dir).map_err(fail)?;
        let tmp = self.dir.join(format!(".{name}.inprogress"));
        let mut w = std::io::BufWriter::new(std::fs::File::create(&tmp).map_err(fail)?);
        for r in &records {
            r.print(&mut w).map_err(fail)?;
            w.write_all(b"\n").map_err(fail)?;
        }
        w.into_inner()
            .map_err(|e| fail(e.into_error()))?
            .sync_all()
            .map_err(fail)?;
        std::fs::rename(&tmp, &path).map_err(fail)?;
        Ok(())
    }
}

/// Keeps the latest value per key (for example a running count's final total) in keyed state,
/// so that a restore at any parallelism hands each key to the subtask that owns its key group,
/// and at end of input publishes what it holds to its [`LatestHandle`]. Publishing again after a
/// restart overwrites with the same values.
///
/// Its input must be partitioned by the key, as the output of a keyed operation on that key is
/// (Flink's `reinterpretAsKeyedStream`): a record whose key group this subtask does not own is an
/// error that says so.
pub struct LatestPerKeySink<K: StateKey, A, V> {
    base: KeyedBase<K>,
    key: KeyFn<(A, V), K>,
    range: KeyGroupRange,
    state: Option<ValueState<V>>,
    handle: LatestHandle<K, V>,
    /// A batch's latest record per key, not yet written to the state.
    recent: crate::minibatch::LatestInBatch,
}

/// The final values a [`LatestPerKeySink`] published.
pub struct LatestHandle<K, V> {
    map: Arc<Mutex<BTreeMap<K, V>>>,
}

impl<K, V> Clone for LatestHandle<K, V> {
    fn clone(&self) -> Self {
        LatestHandle {
            map: self.map.clone(),
        }
    }
}

impl<K: Ord + Clone, V: Clone> LatestHandle<K, V> {
    pub(crate) fn new() -> Self {
        LatestHandle {
            map: Arc::new(Mutex::new(BTreeMap::new())),
        }
    }

    /// The published values, sorted by key.
    pub fn get(&self) -> BTreeMap<K, V> {
        lock(&self.map).clone()
    }
}

/// A handle whose published values cross processes: in cluster mode, each task manager sends
/// what its sinks published when the job finishes, and the job manager merges it into its own
/// handle (the program built the same handles in every process, in the same order).
#[cfg_attr(not(feature = "cluster"), allow(dead_code))]
pub(crate) trait SharedResult: Send + Sync {
    /// What this process published, encoded.
    fn encode(&self) -> Result<Vec<u8>, String>;
    /// Adds what another process published.
    fn merge(&self, bytes: &[u8]) -> Result<(), String>;
}

impl<K, V> SharedResult for LatestHandle<K, V>
where
    K: Ord + Clone + Serialize + DeserializeOwned + Send + 'static,
    V: Clone + Serialize + DeserializeOwned + Send + 'static,
{
    fn encode(&self) -> Result<Vec<u8>, String> {
        postcard::to_stdvec(&*lock(&self.map)).map_err(|e| format!("cannot encode results: {e}"))
    }

    fn merge(&self, bytes: &[u8]) -> Result<(), String> {
        let other: BTreeMap<K, V> =
            postcard::from_bytes(bytes).map_err(|e| format!("corrupt results: {e}"))?;
        // Values published at the end of input are final: the same key has the same value
        // wherever (and however often) it was published.
        lock(&self.map).extend(other);
        Ok(())
    }
}

impl<K: StateKey + Ord, A, V: StateValue> LatestPerKeySink<K, A, V> {
    /// A sink over `base`'s keyed state, keyed by `key`, publishing into `handle`.
    pub fn new(base: KeyedBase<K>, key: KeyFn<(A, V), K>, handle: LatestHandle<K, V>) -> Self {
        let range = base.key_group_range();
        LatestPerKeySink {
            base,
            key,
            range,
            state: None,
            handle,
            recent: Default::default(),
        }
    }
}

impl<K: StateKey + Ord, A, V: StateValue> LatestPerKeySink<K, A, V> {
    /// Keeps each key's latest value in the batch as its state, the state's table found once
    /// and each key written once ([`LatestInBatch`](crate::minibatch::LatestInBatch)). By
    /// reference: moving each record out of the batch copied its key through the stack in
    /// overlapping parts, a store-forwarding stall that was two thirds of this loop's time.
    fn keep(&mut self, state: ValueState<V>, batch: &[(A, V)]) -> OpResult {
        let (assigner, range) = (self.base.assigner(), self.range);
        let mut latest = self.base.backend.value_access(state);
        let key = &self.key;
        self.recent
            .keep_latest(batch, |r| key(r), assigner, range, &mut latest)
            .map_err(|kg| not_partitioned(kg, range))
    }
}

/// A record of key group `kg` reached a subtask that owns `range`.
fn not_partitioned(kg: KeyGroup, range: KeyGroupRange) -> TaskError {
    TaskError::Operator {
        operator: "Latest-per-key Sink".into(),
        message: format!(
            "a key of key group {kg} arrived at a subtask that owns key groups {range}: the \
             stream was declared keyed (reinterpret_as_keyed) but is not partitioned by that key"
        ),
    }
}

fn not_open() -> TaskError {
    TaskError::Operator {
        operator: "Latest-per-key Sink".into(),
        message: "a record arrived before the operator was opened".into(),
    }
}

impl<K: StateKey + Ord, A: Send + 'static, V: StateValue> OneInputOperator<(A, V)>
    for LatestPerKeySink<K, A, V>
{
    type Out = ();

    #[inline]
    fn process(&mut self, record: (A, V), _out: &mut dyn Output<()>) -> OpResult {
        let state = self.state.ok_or_else(not_open)?;
        self.keep(state, std::slice::from_ref(&record))
    }

    fn process_batch(&mut self, batch: Vec<(A, V)>, _out: &mut dyn Output<()>) -> OpResult {
        let state = self.state.ok_or_else(not_open)?;
        self.keep(state, &batch)
    }

    fn lifecycle(&mut self, event: &mut Lifecycle<'_>, _out: &mut dyn Output<()>) -> OpResult {
        if self.base.lifecycle(event)? {
            self.state = Some(
                self.base
                    .backend()
                    .value_state(&ValueStateDescriptor::<V>::new("latest"))?,
            );
        }
        if let (Lifecycle::EndInput, Some(state)) = (event, self.state) {
            let mut map = lock(&self.handle.map);
            self.base.backend().for_each_entry(state, &mut |k, v| {
                map.insert(k.clone(), v.clone());
            });
        }
        Ok(())
    }
}
