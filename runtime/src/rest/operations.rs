//! The REST API's asynchronous operations (Flink's trigger ids): a checkpoint, savepoint or
//! stop runs in the background and its result is fetched by id under the path of its kind. A
//! trigger refused because another checkpoint is in progress is retried, as Flink queues it;
//! the store keeps the last [`MAX_OPERATIONS`]; ended results nobody fetched yet keep the server
//! up a little past its job's end.

use crate::error::JobError;
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::future::Future;
use std::sync::Mutex;
use std::time::Duration;

/// Operations kept; the oldest ended ones go first.
const MAX_OPERATIONS: usize = 1024;
/// How long a refused trigger is retried.
const RETRY_FOR: Duration = Duration::from_secs(600);

/// What an operation snapshots.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Kind {
    /// `POST /jobs/:jobid/checkpoints`.
    Checkpoint,
    /// `POST /jobs/:jobid/savepoints` and `/stop`.
    Savepoint,
}

/// An operation's state (Flink's `QueueStatus` and its result).
#[derive(Clone, Debug)]
pub(super) enum Operation {
    InProgress,
    Completed(String),
    Failed(String),
}

#[derive(Default)]
struct Store {
    operations: BTreeMap<String, (Kind, Operation)>,
    /// Ids, oldest first.
    order: VecDeque<String>,
    /// Ended, not fetched yet.
    unread: BTreeSet<String>,
}

/// Every operation of one REST server.
#[derive(Default)]
pub(super) struct Operations {
    store: Mutex<Store>,
    next: std::sync::atomic::AtomicU64,
}

impl Operations {
    /// Whether an ended operation's result is still unread.
    pub fn any_unread(&self) -> bool {
        self.store.lock().is_ok_and(|s| !s.unread.is_empty())
    }

    /// A new operation of `kind`, in progress; its id.
    pub fn begin(&self, kind: Kind) -> String {
        let n = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let wall = weir_core::sim::wall_clock().as_nanos();
        let id = format!(
            "{:032x}",
            weir_core::ids::stable_hash128(format!("{n}-{wall}").as_bytes())
        );
        if let Ok(mut s) = self.store.lock() {
            s.operations
                .insert(id.clone(), (kind, Operation::InProgress));
            s.order.push_back(id.clone());
            while s.order.len() > MAX_OPERATIONS {
                let Some(pos) = s
                    .order
                    .iter()
                    .position(|o| !matches!(s.operations.get(o), Some((_, Operation::InProgress))))
                else {
                    break;
                };
                if let Some(old) = s.order.remove(pos) {
                    s.operations.remove(&old);
                    s.unread.remove(&old);
                }
            }
        }
        id
    }

    /// Operation `id` ended with `result`.
    pub fn end(&self, id: &str, result: Result<String, JobError>) {
        if let Ok(mut s) = self.store.lock()
            && let Some((_, op)) = s.operations.get_mut(id)
        {
            *op = match result {
                Ok(path) => Operation::Completed(path),
                Err(e) => Operation::Failed(e.to_string()),
            };
            s.unread.insert(id.to_string());
        }
    }

    /// Operation `id` of `kind`, if there is one; fetching an ended one marks it read.
    pub fn get(&self, kind: Kind, id: &str) -> Option<Operation> {
        let mut s = self.store.lock().ok()?;
        let op = match s.operations.get(id) {
            Some((k, op)) if *k == kind => op.clone(),
            _ => return None,
        };
        if !matches!(op, Operation::InProgress) {
            s.unread.remove(id);
        }
        Some(op)
    }
}

/// Runs `trigger` until it is not refused for a checkpoint in progress (or for
/// [`RETRY_FOR`]): Flink queues such a request, and so does this.
pub(super) async fn retrying<F, Fut>(mut trigger: F) -> Result<String, JobError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<String, JobError>>,
{
    let deadline = tokio::time::Instant::now() + RETRY_FOR;
    loop {
        match trigger().await {
            Err(JobError::Snapshot(m))
                if m.contains("not triggered") && tokio::time::Instant::now() < deadline =>
            {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            other => return other,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn results_are_found_under_their_own_kind_and_old_ones_go() {
        let ops = Operations::default();
        let c = ops.begin(Kind::Checkpoint);
        assert!(matches!(
            ops.get(Kind::Checkpoint, &c),
            Some(Operation::InProgress)
        ));
        assert!(
            ops.get(Kind::Savepoint, &c).is_none(),
            "not a savepoint's id"
        );
        ops.end(&c, Ok("file:///x".into()));
        assert!(ops.any_unread());
        assert!(matches!(
            ops.get(Kind::Checkpoint, &c),
            Some(Operation::Completed(_))
        ));
        assert!(!ops.any_unread());
        for _ in 0..MAX_OPERATIONS + 10 {
            let id = ops.begin(Kind::Savepoint);
            ops.end(&id, Ok(String::new()));
        }
        assert!(
            ops.get(Kind::Checkpoint, &c).is_none(),
            "the oldest ended ones go"
        );
        let store = ops.store.lock().unwrap();
        assert!(store.operations.len() <= MAX_OPERATIONS);
    }
}
