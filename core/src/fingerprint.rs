//! A job's fingerprint: the operators a checkpoint's state maps to and the source configuration
//! that decides what a replay reads, recorded in `_metadata` and compared on every restore.
//!
//! Two parts, compared separately:
//! - the **graph**: each operator's id (from its `uid`), uid, name and max parallelism, and the
//!   exchanges between them. Parallelism is not part of it: a restore may rescale.
//! - the **sources**: `key = value` pairs the job declares (for `word_count`, the record count
//!   and the seed). A replay after a restore re-reads its sources from the checkpointed
//!   positions; with other source settings it reads other records, and the totals are wrong
//!   without any error. A restore refuses a difference here unless the user allows it.

use crate::graph::StreamGraph;
use crate::ids::{OperatorId, stable_hash128};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// One operator as the fingerprint sees it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OperatorPrint {
    /// Its stable id.
    pub operator_id: OperatorId,
    /// Its `uid`, when set.
    pub uid: Option<String>,
    /// Its display name: what kind of operator it is ("Sum", "Map", ...).
    pub name: String,
    /// Its max parallelism (key groups).
    pub max_parallelism: u32,
}

/// A job's fingerprint.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobFingerprint {
    /// The job's name.
    pub job_name: String,
    /// Every operator, in graph order.
    pub operators: Vec<OperatorPrint>,
    /// Every exchange: upstream operator, downstream operator, partitioner name.
    pub edges: Vec<(OperatorId, OperatorId, String)>,
    /// The source configuration that decides what a replay reads.
    pub sources: BTreeMap<String, String>,
}

/// How two fingerprints differ, part by part; each entry is a sentence naming a difference.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FingerprintDiff {
    /// Differences of the graph that change what state means: an operator whose kind or max
    /// parallelism changed under the same id. Operators added or dropped are not listed here
    /// (a new operator starts empty; dropped state is the restore's `allow_non_restored_state`
    /// decision).
    pub graph: Vec<String>,
    /// Differences of the source configuration.
    pub sources: Vec<String>,
}

impl FingerprintDiff {
    /// Whether nothing differs.
    pub fn is_empty(&self) -> bool {
        self.graph.is_empty() && self.sources.is_empty()
    }
}

impl JobFingerprint {
    /// The fingerprint of a graph and its declared source configuration.
    pub fn of(graph: &StreamGraph, sources: &BTreeMap<String, String>) -> JobFingerprint {
        JobFingerprint {
            job_name: graph.job_name.clone(),
            operators: graph
                .nodes
                .iter()
                .map(|n| OperatorPrint {
                    operator_id: n.operator_id,
                    uid: n.uid.clone(),
                    name: n.name.clone(),
                    max_parallelism: n.max_parallelism,
                })
                .collect(),
            edges: graph
                .edges
                .iter()
                .map(|e| {
                    (
                        graph.node(e.source).operator_id,
                        graph.node(e.target).operator_id,
                        e.partitioner.name().to_string(),
                    )
                })
                .collect(),
            sources: sources.clone(),
        }
    }

    /// A hash of the graph part (job name, operators, edges): two checkpoints are of the same
    /// job when it is equal.
    pub fn graph_hash(&self) -> u128 {
        let graph = (&self.job_name, &self.operators, &self.edges);
        match postcard::to_stdvec(&graph) {
            Ok(bytes) => stable_hash128(&bytes),
            Err(_) => 0,
        }
    }

    /// Whether `other` is the same job with the same sources.
    pub fn same_job(&self, other: &JobFingerprint) -> bool {
        self.graph_hash() == other.graph_hash() && self.sources == other.sources
    }

    /// How a job about to restore (`self`) differs from the checkpoint's (`recorded`).
    pub fn diff(&self, recorded: &JobFingerprint) -> FingerprintDiff {
        let mut d = FingerprintDiff::default();
        for op in &self.operators {
            let Some(old) = recorded
                .operators
                .iter()
                .find(|o| o.operator_id == op.operator_id)
            else {
                continue;
            };
            let who = match &op.uid {
                Some(uid) => format!("operator uid '{uid}'"),
                None => format!("operator {}", op.operator_id),
            };
            if old.name != op.name {
                d.graph.push(format!(
                    "{who} was '{}' in the checkpoint and is '{}' in the job",
                    old.name, op.name
                ));
            }
            if old.max_parallelism != op.max_parallelism {
                d.graph.push(format!(
                    "{who} has max parallelism {} in the checkpoint and {} in the job",
                    old.max_parallelism, op.max_parallelism
                ));
            }
        }
        let keys: std::collections::BTreeSet<&String> =
            self.sources.keys().chain(recorded.sources.keys()).collect();
        for key in keys {
            match (recorded.sources.get(key), self.sources.get(key)) {
                (Some(a), Some(b)) if a != b => d.sources.push(format!(
                    "source setting '{key}' is {a} in the checkpoint and {b} in the job"
                )),
                (Some(a), None) => d.sources.push(format!(
                    "source setting '{key}' is {a} in the checkpoint and not set in the job"
                )),
                (None, Some(b)) => d.sources.push(format!(
                    "source setting '{key}' is not set in the checkpoint and is {b} in the job"
                )),
                _ => {}
            }
        }
        d
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn print(sources: &[(&str, &str)], sum_name: &str, max: u32) -> JobFingerprint {
        JobFingerprint {
            job_name: "wc".into(),
            operators: vec![
                OperatorPrint {
                    operator_id: OperatorId::from_uid("source"),
                    uid: Some("source".into()),
                    name: "Source".into(),
                    max_parallelism: max,
                },
                OperatorPrint {
                    operator_id: OperatorId::from_uid("sum"),
                    uid: Some("sum".into()),
                    name: sum_name.into(),
                    max_parallelism: max,
                },
            ],
            edges: vec![(
                OperatorId::from_uid("source"),
                OperatorId::from_uid("sum"),
                "HASH".into(),
            )],
            sources: sources
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        }
    }

    #[test]
    fn diff_names_sources_and_graph_changes() {
        let a = print(&[("records", "10"), ("seed", "42")], "Sum", 128);
        assert!(a.diff(&a).is_empty());
        assert!(a.same_job(&a.clone()));
        let b = print(&[("records", "20"), ("seed", "42")], "Sum", 128);
        let d = b.diff(&a);
        assert!(d.graph.is_empty());
        assert_eq!(
            d.sources,
            vec!["source setting 'records' is 10 in the checkpoint and 20 in the job"]
        );
        assert!(!a.same_job(&b));
        assert_eq!(a.graph_hash(), b.graph_hash());
        let c = print(&[("records", "10")], "Reduce", 256);
        let d = c.diff(&a);
        assert_eq!(d.graph.len(), 3, "{d:?}");
        assert!(
            d.graph
                .iter()
                .any(|g| g.contains("was 'Sum' in the checkpoint and is 'Reduce'")),
            "{d:?}"
        );
        assert!(d.sources[0].contains("'seed' is 42 in the checkpoint and not set"));
        assert_ne!(a.graph_hash(), c.graph_hash());
    }
}
