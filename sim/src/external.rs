//! The run's external system: where the job's two-phase-commit sink commits, outliving the
//! processes of the run (a killed process's commits stay, as in a real database). Commits are
//! idempotent per `(subtask, transaction)`, as the sink's contract asks; a repeat with other
//! records is itself a violation (a replay that differs from the original).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};
use weir_runtime::sink::{Committer, TwoPhaseCommitSink};
use weir_runtime::{DataStream, operator::Chained};

/// What the job's sink receives: a key, its running count and its running sum of record indices.
pub type Record = (u64, i64, i64);

/// The committed transactions, by subtask and transaction (a resumed job's transaction ids
/// continue past its restore point's, so they never meet the first process's).
type Transactions = BTreeMap<(u32, u64), Vec<Record>>;

/// The committed transactions of a run, and the conflicts seen.
#[derive(Default)]
pub struct External {
    committed: Mutex<(Transactions, Vec<String>)>,
}

impl External {
    /// A new, empty external system.
    pub fn new() -> Arc<External> {
        Arc::new(External::default())
    }

    /// Every committed record, by subtask, then transaction, then arrival.
    pub fn records(&self) -> Vec<Record> {
        let c = self
            .committed
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        c.0.values().flat_map(|v| v.iter().copied()).collect()
    }

    /// The repeated commits whose records differed.
    pub fn conflicts(&self) -> Vec<String> {
        self.committed
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .1
            .clone()
    }
}

impl Committer<Record> for External {
    fn commit(&self, subtask: u32, transaction: u64, records: Vec<Record>) -> Result<(), String> {
        let mut c = self
            .committed
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let shown = if transaction == weir_runtime::sink::FINAL_TRANSACTION {
            "the final transaction".to_string()
        } else {
            format!("transaction {transaction}")
        };
        weir_core::sim::record(format_args!(
            "subtask {subtask} of the sink commits {shown}: {} records",
            records.len()
        ));
        match c.0.get(&(subtask, transaction)) {
            // A replay may interleave its keys otherwise: the same records, in another order.
            Some(done) if !same_records(done, &records) => {
                let conflict = format!(
                    "transaction {transaction} of subtask {subtask} was committed twice with \
                     different records ({} then {})",
                    done.len(),
                    records.len()
                );
                c.1.push(conflict);
            }
            Some(_) => {}
            None => {
                c.0.insert((subtask, transaction), records);
            }
        }
        Ok(())
    }
}

/// The job's sink: a two-phase-commit sink committing into `external`.
pub fn sink(stream: DataStream<Record>, external: &Arc<External>) {
    let external = external.clone();
    stream.transform::<()>("Collect Sink", move |ctx, next| {
        Box::new(Chained::new(
            TwoPhaseCommitSink::new(ctx.operator_id, &ctx.info, external.clone()),
            next,
        ))
    });
}

/// Whether two commits hold the same records, in any order.
fn same_records(a: &[Record], b: &[Record]) -> bool {
    let (mut a, mut b) = (a.to_vec(), b.to_vec());
    a.sort_unstable();
    b.sort_unstable();
    a == b
}
