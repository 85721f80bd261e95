//! The exactly-once file sink (Flink's `FileSink` in row format, rolling on every checkpoint):
//! records stream into a hidden in-progress part file as they arrive; a snapshot closes it
//! (flushed and synced) and keeps its name, length and digest in operator state; the
//! checkpoint's completion renames it to `part-<subtask>-<checkpoint>`; a restore commits what
//! the restored checkpoint had pending, after checking each file's length and digest.
//!
//! A subtask holds one write buffer, whatever the rate or the checkpoint interval, and a
//! checkpoint holds a few names: records never wait in memory or in operator state. Commits are
//! renames and idempotent (a part already renamed is left alone), so the committed files equal
//! a failure-free run's. In-progress files of a failed attempt, written after its last
//! checkpoint, stay behind as hidden `.part-*.inprogress` files (as Flink's do); readers skip
//! hidden files.

use crate::error::TaskError;
use crate::operator::{Lifecycle, OneInputOperator, OpResult, OperatorSnapshotParts, Output};
use crate::sink::{Committer, FINAL_TRANSACTION, FileCommitter, Printable};
use serde::{Deserialize, Serialize, de::DeserializeOwned};
use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use weir_core::handle::OperatorStateMode;
use weir_core::identity::{Digest, DigestHasher};
use weir_core::ids::{CheckpointId, OperatorId};
use weir_state::{OperatorListState, OperatorStateBackend};

/// The operator state of the pending part files.
const PENDING_PARTS: &str = "pending-part-files";
/// The pending transactions of the sink this one replaced, with their records: what a
/// checkpoint of an earlier release holds, committed on restore.
const RECORDS_BY_SUBTASK: &str = "pending-transactions-by-subtask";
/// The same without the subtask, as the first release wrote it.
const RECORDS: &str = "pending-transactions";
/// The write buffer of the in-progress file.
const BUFFER: usize = 64 << 10;

/// A closed in-progress file that waits for its checkpoint to complete.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
struct PendingPart {
    /// The subtask that wrote it (its committed name carries it).
    subtask: u32,
    /// The checkpoint that closed it ([`FINAL_TRANSACTION`] at end of input).
    transaction: u64,
    /// Its in-progress name in the sink's directory.
    file: String,
    len: u64,
    digest: [u8; 16],
}

/// The file being written: its name, the buffered file, and what went into it.
struct InProgress {
    file: String,
    out: std::io::BufWriter<std::fs::File>,
    len: u64,
    hasher: DigestHasher,
}

impl Write for InProgress {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.out.write(buf)?;
        self.hasher.update(&buf[..n]);
        self.len += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.out.flush()
    }
}

/// The file sink of one subtask.
pub(crate) struct FileSink<T> {
    operator_id: OperatorId,
    subtask: u32,
    dir: PathBuf,
    open: Option<InProgress>,
    /// Closed parts by transaction.
    pending: BTreeMap<u64, Vec<PendingPart>>,
    state: OperatorStateBackend,
    list: Option<OperatorListState<PendingPart>>,
    _records: std::marker::PhantomData<fn(T)>,
}

impl<T> FileSink<T>
where
    T: Printable + Clone + Serialize + DeserializeOwned + Send + Sync + 'static,
{
    /// The sink of subtask `subtask` of operator `operator_id`, writing into `dir`.
    pub(crate) fn new(operator_id: OperatorId, subtask: u32, dir: PathBuf) -> Self {
        FileSink {
            operator_id,
            subtask,
            dir,
            open: None,
            pending: BTreeMap::new(),
            state: OperatorStateBackend::new(),
            list: None,
            _records: std::marker::PhantomData,
        }
    }

    fn error(&self, message: String) -> TaskError {
        TaskError::Operator {
            operator: "file sink".into(),
            message,
        }
    }

    /// The in-progress file, opened on the first record after a close: a new hidden name that
    /// no file has (never one a pending part may still hold).
    fn in_progress(&mut self) -> Result<&mut InProgress, TaskError> {
        if self.open.is_none() {
            std::fs::create_dir_all(&self.dir)
                .map_err(|e| self.error(format!("cannot create {}: {e}", self.dir.display())))?;
            let seed = std::hash::BuildHasher::hash_one(
                &std::collections::hash_map::RandomState::new(),
                (std::process::id(), self.subtask),
            );
            let mut attempt = 0u64;
            let (file, out) = loop {
                let file = format!(
                    ".part-{}-{:016x}.inprogress",
                    self.subtask,
                    seed.wrapping_add(attempt)
                );
                let path = self.dir.join(&file);
                match std::fs::File::create_new(&path) {
                    Ok(out) => break (file, out),
                    Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && attempt < 64 => {
                        attempt += 1;
                    }
                    Err(e) => {
                        return Err(self.error(format!("cannot create {}: {e}", path.display())));
                    }
                }
            };
            self.open = Some(InProgress {
                file,
                out: std::io::BufWriter::with_capacity(BUFFER, out),
                len: 0,
                hasher: DigestHasher::new(),
            });
        }
        Ok(self.open.as_mut().expect("opened above"))
    }

    fn write(&mut self, record: &T) -> OpResult {
        let part = self.in_progress()?;
        let written = record.print(part).and_then(|()| part.write_all(b"\n"));
        if let Err(e) = written {
            let file = part.file.clone();
            let path = self.dir.join(file);
            return Err(self.error(format!("cannot write {}: {e}", path.display())));
        }
        Ok(())
    }

    /// Closes the in-progress file, flushed and synced, as the pending part of `transaction`.
    fn close(&mut self, transaction: u64) -> OpResult {
        let Some(part) = self.open.take() else {
            return Ok(());
        };
        let path = self.dir.join(&part.file);
        let synced = part
            .out
            .into_inner()
            .map_err(|e| e.into_error())
            .and_then(|f| f.sync_data());
        if let Err(e) = synced {
            return Err(self.error(format!("cannot close {}: {e}", path.display())));
        }
        self.pending
            .entry(transaction)
            .or_default()
            .push(PendingPart {
                subtask: self.subtask,
                transaction,
                file: part.file,
                len: part.len,
                digest: part.hasher.finish().0,
            });
        Ok(())
    }

    fn commit_up_to(&mut self, id: u64) -> OpResult {
        let later = match id.checked_add(1) {
            Some(next) => self.pending.split_off(&next),
            None => BTreeMap::new(),
        };
        let due = std::mem::replace(&mut self.pending, later);
        for part in due.values().flatten() {
            commit(&self.dir, part, false).map_err(|m| self.error(m))?;
        }
        Ok(())
    }

    fn open(&mut self, ctx: &mut crate::operator::RestoreContext) -> OpResult {
        ctx.restore_operator_state(self.operator_id, &mut self.state)?;
        let list = self
            .state
            .list_state::<PendingPart>(PENDING_PARTS, OperatorStateMode::SplitDistribute)?;
        // What the restored checkpoint had pending belongs to a completed checkpoint.
        for part in self.state.get(&list)? {
            commit(&self.dir, &part, true).map_err(|m| self.error(m))?;
        }
        self.state.update(&list, &[])?;
        self.list = Some(list);
        // A checkpoint of the earlier sink holds its transactions' records.
        let committer = FileCommitter::new(self.dir.clone());
        let by_subtask = self.state.list_state::<(u32, u64, Vec<T>)>(
            RECORDS_BY_SUBTASK,
            OperatorStateMode::SplitDistribute,
        )?;
        for (subtask, txn, records) in self.state.get(&by_subtask)? {
            committer
                .commit(subtask, txn, records)
                .map_err(|m| self.error(m))?;
        }
        self.state.update(&by_subtask, &[])?;
        let legacy = self
            .state
            .list_state::<(u64, Vec<T>)>(RECORDS, OperatorStateMode::SplitDistribute)?;
        for (txn, records) in self.state.get(&legacy)? {
            committer
                .commit(self.subtask, txn, records)
                .map_err(|m| self.error(m))?;
        }
        self.state.update(&legacy, &[])?;
        Ok(())
    }
}

/// A file's length and digest, read in pieces.
fn digest_of_file(path: &Path) -> std::io::Result<(u64, [u8; 16])> {
    use std::io::Read;
    let mut file = std::fs::File::open(path)?;
    let (mut hasher, mut len, mut buf) = (DigestHasher::new(), 0u64, vec![0u8; BUFFER]);
    loop {
        match file.read(&mut buf)? {
            0 => return Ok((len, hasher.finish().0)),
            n => {
                hasher.update(&buf[..n]);
                len += n as u64;
            }
        }
    }
}

/// The committed name of a part.
fn committed_name(part: &PendingPart) -> String {
    if part.transaction == FINAL_TRANSACTION {
        format!("part-{}-final", part.subtask)
    } else {
        format!("part-{}-{:012}", part.subtask, part.transaction)
    }
}

/// Renames a pending part to its committed name; a part already committed is left alone. After
/// a restore (`check`), the in-progress file must still have the length and digest the
/// checkpoint recorded: anything else is a damaged or foreign file, and an error naming it.
fn commit(dir: &Path, part: &PendingPart, check: bool) -> Result<(), String> {
    let from = dir.join(&part.file);
    let to = dir.join(committed_name(part));
    let len = match std::fs::metadata(&from) {
        Ok(m) => m.len(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return match std::fs::metadata(&to) {
                Ok(m) if m.len() == part.len => Ok(()),
                Ok(m) => Err(format!(
                    "{} has {} bytes, where checkpoint {} committed {}",
                    to.display(),
                    m.len(),
                    part.transaction,
                    part.len
                )),
                Err(_) => Err(format!(
                    "the pending part file {} of checkpoint {} is missing, and so is {}: its \
                     records are lost",
                    from.display(),
                    part.transaction,
                    to.display()
                )),
            };
        }
        Err(e) => return Err(format!("cannot read {}: {e}", from.display())),
    };
    if check {
        let found =
            digest_of_file(&from).map_err(|e| format!("cannot read {}: {e}", from.display()))?;
        if found != (part.len, part.digest) {
            return Err(format!(
                "the pending part file {} of checkpoint {} is damaged or foreign: {len} bytes \
                 and digest {}, where the checkpoint recorded {} bytes and digest {}",
                from.display(),
                part.transaction,
                Digest(found.1),
                part.len,
                Digest(part.digest)
            ));
        }
    }
    std::fs::rename(&from, &to)
        .map_err(|e| format!("cannot commit {} as {}: {e}", from.display(), to.display()))
}

impl<T> OneInputOperator<T> for FileSink<T>
where
    T: Printable + Clone + Serialize + DeserializeOwned + Send + Sync + 'static,
{
    type Out = ();

    fn process(&mut self, record: T, _out: &mut dyn Output<()>) -> OpResult {
        self.write(&record)
    }

    fn process_batch(&mut self, batch: Vec<T>, _out: &mut dyn Output<()>) -> OpResult {
        for record in &batch {
            self.write(record)?;
        }
        Ok(())
    }

    fn lifecycle(&mut self, event: &mut Lifecycle<'_>, _out: &mut dyn Output<()>) -> OpResult {
        match event {
            Lifecycle::Open(ctx) => self.open(ctx)?,
            Lifecycle::Snapshot(id, _, parts) => {
                self.close(id.0)?;
                if let Some(list) = &self.list {
                    let pending: Vec<PendingPart> =
                        self.pending.values().flatten().cloned().collect();
                    self.state.update(list, &pending)?;
                }
                parts.push(OperatorSnapshotParts::operator_state(
                    self.operator_id,
                    &self.state,
                ));
            }
            Lifecycle::NotifyComplete(CheckpointId(id)) => self.commit_up_to(*id)?,
            // An aborted checkpoint's part stays pending: the next checkpoint that completes
            // commits every part up to its id, this one included.
            // The last records wait for the whole job to finish: if another subtask fails
            // first, this one is restored and replays them, and they must not be committed twice.
            Lifecycle::EndInput => self.close(FINAL_TRANSACTION)?,
            Lifecycle::JobFinished => self.commit_up_to(FINAL_TRANSACTION)?,
            _ => {}
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::operator::{Discard, RestoreContext, RestoredOperatorState};
    use crate::sink::TwoPhaseCommitSink;
    use weir_core::element::SnapshotKind;

    type Sink = FileSink<(String, i64)>;

    fn op() -> OperatorId {
        OperatorId::from_uid("files")
    }

    fn open(
        sink: &mut dyn OneInputOperator<(String, i64), Out = ()>,
        blobs: Vec<Vec<u8>>,
    ) -> OpResult {
        let mut ctx = RestoreContext::default();
        if !blobs.is_empty() {
            ctx.operators.insert(
                op(),
                RestoredOperatorState {
                    keyed: Vec::new(),
                    operator: blobs,
                    native: Vec::new(),
                },
            );
        }
        sink.lifecycle(&mut Lifecycle::Open(&mut ctx), &mut Discard)
    }

    fn write(sink: &mut Sink, records: &[(&str, i64)]) {
        let batch = records.iter().map(|(w, c)| (w.to_string(), *c)).collect();
        sink.process_batch(batch, &mut Discard).unwrap();
    }

    /// Snapshot `id`; returns the operator state blob.
    fn snapshot(sink: &mut dyn OneInputOperator<(String, i64), Out = ()>, id: u64) -> Vec<u8> {
        let mut parts = Vec::new();
        sink.lifecycle(
            &mut Lifecycle::Snapshot(CheckpointId(id), SnapshotKind::Checkpoint, &mut parts),
            &mut Discard,
        )
        .unwrap();
        let mut blob = Vec::new();
        parts
            .pop()
            .unwrap()
            .operator
            .unwrap()
            .write_to(&mut blob)
            .unwrap();
        blob
    }

    fn complete(sink: &mut Sink, id: u64) -> OpResult {
        sink.lifecycle(
            &mut Lifecycle::NotifyComplete(CheckpointId(id)),
            &mut Discard,
        )
    }

    /// The directory's files: committed ones with contents, and how many are hidden.
    fn files(dir: &Path) -> (BTreeMap<String, String>, usize) {
        let (mut committed, mut hidden) = (BTreeMap::new(), 0);
        for e in std::fs::read_dir(dir).unwrap().flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if name.starts_with('.') {
                assert!(name.ends_with(".inprogress"), "{name}");
                hidden += 1;
            } else {
                committed.insert(name, std::fs::read_to_string(e.path()).unwrap());
            }
        }
        (committed, hidden)
    }

    #[test]
    fn records_stream_into_a_part_that_the_completed_checkpoint_renames() {
        let dir = tempfile::tempdir().unwrap();
        let mut sink = Sink::new(op(), 1, dir.path().to_path_buf());
        open(&mut sink, Vec::new()).unwrap();
        write(&mut sink, &[("a", 1), ("b", 1)]);
        // Streamed before any checkpoint: nothing waits in memory beyond the write buffer.
        assert_eq!(files(dir.path()), (BTreeMap::new(), 1));
        snapshot(&mut sink, 3);
        write(&mut sink, &[("a", 2)]);
        snapshot(&mut sink, 4); // aborted: committed with the next completion
        snapshot(&mut sink, 5); // nothing written: no part
        write(&mut sink, &[("c", 1)]);
        assert_eq!(files(dir.path()).1, 3);
        complete(&mut sink, 4).unwrap();
        let (committed, hidden) = files(dir.path());
        assert_eq!(hidden, 1, "the open part stays in progress");
        let want: BTreeMap<String, String> = [
            ("part-1-000000000003", "(a,1)\n(b,1)\n"),
            ("part-1-000000000004", "(a,2)\n"),
        ]
        .iter()
        .map(|(n, c)| (n.to_string(), c.to_string()))
        .collect();
        assert_eq!(committed, want);
        sink.lifecycle(&mut Lifecycle::EndInput, &mut Discard)
            .unwrap();
        sink.lifecycle(&mut Lifecycle::JobFinished, &mut Discard)
            .unwrap();
        let (committed, hidden) = files(dir.path());
        assert_eq!(hidden, 0);
        assert_eq!(committed["part-1-final"], "(c,1)\n");
        // A repeated completion commits nothing twice.
        complete(&mut sink, 4).unwrap();
        assert_eq!(files(dir.path()).0.len(), 3);
    }

    #[test]
    fn a_restore_commits_the_checkpoint_s_pending_parts_once_even_at_another_subtask() {
        let dir = tempfile::tempdir().unwrap();
        let mut first = Sink::new(op(), 0, dir.path().to_path_buf());
        open(&mut first, Vec::new()).unwrap();
        write(&mut first, &[("x", 1)]);
        let blob = snapshot(&mut first, 7);
        write(&mut first, &[("lost", 1)]); // after the checkpoint: replayed, never committed
        drop(first); // the failure: checkpoint 7 completed, its notification never came
        for subtask in [2, 3] {
            // Twice: a restore that fails after its commit is restored again.
            let mut again = Sink::new(op(), subtask, dir.path().to_path_buf());
            open(&mut again, vec![blob.clone()]).unwrap();
        }
        let (committed, hidden) = files(dir.path());
        assert_eq!(committed.len(), 1);
        assert_eq!(committed["part-0-000000000007"], "(x,1)\n");
        assert_eq!(hidden, 1, "the failed attempt's open part is left, hidden");
    }

    #[test]
    fn a_damaged_foreign_or_lost_pending_part_is_an_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let mut first = Sink::new(op(), 0, dir.path().to_path_buf());
        open(&mut first, Vec::new()).unwrap();
        write(&mut first, &[("x", 1), ("y", 2)]);
        let blob = snapshot(&mut first, 7);
        let pending = std::fs::read_dir(dir.path())
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .next()
            .unwrap();
        let name = pending.file_name().unwrap().to_string_lossy().into_owned();
        let restore = |blob: &Vec<u8>| {
            let mut s = Sink::new(op(), 0, dir.path().to_path_buf());
            open(&mut s, vec![blob.clone()]).unwrap_err().to_string()
        };
        // The same length, another byte: only the digest tells.
        std::fs::write(&pending, "(x,1)\n(y,3)\n").unwrap();
        let e = restore(&blob);
        assert!(e.contains(&name) && e.contains("damaged or foreign"), "{e}");
        std::fs::write(&pending, "(x,1)\n").unwrap();
        let e = restore(&blob);
        assert!(e.contains("6 bytes") && e.contains("12 bytes"), "{e}");
        std::fs::remove_file(&pending).unwrap();
        let e = restore(&blob);
        assert!(e.contains(&name) && e.contains("records are lost"), "{e}");
        // Committed already, but not what the checkpoint wrote.
        std::fs::write(dir.path().join("part-0-000000000007"), "(x,1)\n").unwrap();
        let e = restore(&blob);
        assert!(
            e.contains("part-0-000000000007") && e.contains("6 bytes"),
            "{e}"
        );
        assert_eq!(files(dir.path()).0.len(), 1, "nothing else was committed");
    }

    #[test]
    fn a_checkpoint_of_the_record_keeping_sink_restores_into_the_file_sink() {
        struct Nothing;
        impl Committer<(String, i64)> for Nothing {
            fn commit(&self, _: u32, _: u64, _: Vec<(String, i64)>) -> Result<(), String> {
                Ok(())
            }
        }
        let info = crate::operator::SubtaskInfo {
            processing_time: Default::default(),
            snapshot_compression: Default::default(),
            incremental: None,
            state_backend: std::sync::Arc::new(weir_state::HeapStateBackend),
            index: 1,
            parallelism: 2,
            max_parallelism: 128,
            attempt: 0,
            task_name: "sink (2/2)#0".into(),
            restored: false,
            cancellation: Default::default(),
        };
        let mut old = TwoPhaseCommitSink::new(op(), &info, std::sync::Arc::new(Nothing));
        open(&mut old, Vec::new()).unwrap();
        old.process_batch(vec![("w".into(), 5)], &mut Discard)
            .unwrap();
        let blob = snapshot(&mut old, 9);
        let dir = tempfile::tempdir().unwrap();
        let mut sink = Sink::new(op(), 0, dir.path().to_path_buf());
        open(&mut sink, vec![blob]).unwrap();
        let (committed, hidden) = files(dir.path());
        assert_eq!(committed["part-1-000000000009"], "(w,5)\n");
        assert_eq!((committed.len(), hidden), (1, 0));
    }
}
