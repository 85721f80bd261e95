//! The graph model: StreamGraph (operators as written) → JobGraph (operator chains) →
//! ExecutionGraph (parallel subtasks and their numbered attempts).
//!
//! Chaining follows Flink's `isChainable`: an edge is chained when it is a forward edge between
//! operators of equal parallelism, the downstream operator has exactly one input, and neither
//! side's chaining strategy forbids it. A chain is a tree rooted at its head operator.

use crate::CoreError;
use crate::ids::{AttemptNumber, EdgeId, NodeId, OperatorId, SubtaskIndex, VertexId};
use crate::keygroup::check_parallelism;
use crate::partition::Partitioner;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Whether an operator may be chained to its neighbours (Flink's `ChainingStrategy`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum ChainingStrategy {
    /// Chain with predecessor and successors where the edges allow.
    #[default]
    Always,
    /// Never chain to the predecessor; successors may chain to it.
    Head,
    /// Never chain.
    Never,
}

/// One operator as the user wrote it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StreamNode {
    /// Its id: its position in the order the graph was built.
    pub id: NodeId,
    /// A display name ("Map", "Sum", ...).
    pub name: String,
    /// The user's `uid`, if set.
    pub uid: Option<String>,
    /// The stable operator id: from `uid`, or else from the node's position in the graph.
    pub operator_id: OperatorId,
    /// Parallelism.
    pub parallelism: u32,
    /// Max parallelism: the number of key groups of keyed state.
    pub max_parallelism: u32,
    /// Chaining strategy.
    pub chaining: ChainingStrategy,
}

/// A data exchange between two operators.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StreamEdge {
    /// Upstream operator.
    pub source: NodeId,
    /// Downstream operator.
    pub target: NodeId,
    /// How records pick their channel.
    pub partitioner: Partitioner,
}

/// The logical dataflow: operators and exchanges, before chaining.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct StreamGraph {
    /// The job's name.
    pub job_name: String,
    /// Operators, in the order they were added (topological).
    pub nodes: Vec<StreamNode>,
    /// Exchanges.
    pub edges: Vec<StreamEdge>,
}

impl StreamGraph {
    /// An empty graph.
    pub fn new(job_name: impl Into<String>) -> StreamGraph {
        StreamGraph {
            job_name: job_name.into(),
            ..StreamGraph::default()
        }
    }

    /// Adds an operator. Without a `uid`, its operator id derives from its position and name.
    pub fn add_node(
        &mut self,
        name: impl Into<String>,
        uid: Option<String>,
        parallelism: u32,
        max_parallelism: u32,
    ) -> NodeId {
        let id = NodeId(self.nodes.len() as u32);
        let name = name.into();
        let operator_id = match &uid {
            Some(uid) => OperatorId::from_uid(uid),
            None => OperatorId::from_uid(&format!("\u{0}auto/{}/{}", id.0, name)),
        };
        self.nodes.push(StreamNode {
            id,
            name,
            uid,
            operator_id,
            parallelism,
            max_parallelism,
            chaining: ChainingStrategy::Always,
        });
        id
    }

    /// Sets a node's `uid` (and so its operator id).
    pub fn set_uid(&mut self, node: NodeId, uid: &str) {
        let n = &mut self.nodes[node.0 as usize];
        n.uid = Some(uid.to_string());
        n.operator_id = OperatorId::from_uid(uid);
    }

    /// Adds an exchange.
    pub fn add_edge(&mut self, source: NodeId, target: NodeId, partitioner: Partitioner) {
        self.edges.push(StreamEdge {
            source,
            target,
            partitioner,
        });
    }

    /// A node by id.
    pub fn node(&self, id: NodeId) -> &StreamNode {
        &self.nodes[id.0 as usize]
    }

    /// The edges into `id`.
    pub fn inputs(&self, id: NodeId) -> impl Iterator<Item = &StreamEdge> {
        self.edges.iter().filter(move |e| e.target == id)
    }

    /// The edges out of `id`.
    pub fn outputs(&self, id: NodeId) -> impl Iterator<Item = &StreamEdge> {
        self.edges.iter().filter(move |e| e.source == id)
    }

    /// Gives every operator without a `uid` an id derived from its name, the ids of its inputs
    /// and its rank among siblings of the same name on the same inputs (as Flink's
    /// `StreamGraphHasherV2` hashes an operator's place in the graph). An operator downstream of
    /// operators with uids thus keeps its id when the graph changes elsewhere.
    pub fn assign_auto_ids(&mut self) {
        let mut seen: BTreeMap<String, u32> = BTreeMap::new();
        for i in 0..self.nodes.len() {
            if self.nodes[i].uid.is_some() {
                continue;
            }
            let id = self.nodes[i].id;
            let mut inputs: Vec<String> = self
                .inputs(id)
                .map(|e| format!("{}", self.node(e.source).operator_id))
                .collect();
            inputs.sort();
            let place = format!("{}|{}", self.nodes[i].name, inputs.join(","));
            let rank = seen.entry(place.clone()).or_insert(0);
            let key = format!("\u{0}auto|{place}|{rank}");
            *rank += 1;
            self.nodes[i].operator_id = OperatorId::from_uid(&key);
        }
    }

    /// Checks parallelism bounds, edge direction, forward-edge parallelism and uid uniqueness.
    pub fn validate(&self) -> Result<(), CoreError> {
        if self.nodes.is_empty() {
            return Err(CoreError::InvalidGraph("the job has no operators".into()));
        }
        let mut uids: BTreeMap<OperatorId, &str> = BTreeMap::new();
        for n in &self.nodes {
            check_parallelism(
                &format!("operator '{}'", n.name),
                n.parallelism,
                n.max_parallelism,
            )?;
            if let Some(prev) = uids.insert(n.operator_id, &n.name) {
                return Err(CoreError::InvalidGraph(format!(
                    "operators '{prev}' and '{}' have the same uid {:?}; uids must be unique",
                    n.name, n.uid
                )));
            }
        }
        for e in &self.edges {
            if e.source >= e.target || e.target.0 as usize >= self.nodes.len() {
                return Err(CoreError::InvalidGraph(format!(
                    "edge {:?} -> {:?} does not go forward in the graph",
                    e.source, e.target
                )));
            }
            let (s, t) = (self.node(e.source), self.node(e.target));
            if e.partitioner == Partitioner::Forward && s.parallelism != t.parallelism {
                return Err(CoreError::InvalidGraph(format!(
                    "forward partitioning does not allow a change of parallelism: '{}' has {} and '{}' has {}; use rebalance or key_by",
                    s.name, s.parallelism, t.name, t.parallelism
                )));
            }
        }
        Ok(())
    }

    /// Whether the edge can be a direct call inside one chain.
    fn is_chainable(&self, e: &StreamEdge) -> bool {
        let (s, t) = (self.node(e.source), self.node(e.target));
        e.partitioner == Partitioner::Forward
            && s.parallelism == t.parallelism
            && self.inputs(t.id).count() == 1
            && s.chaining != ChainingStrategy::Never
            && t.chaining == ChainingStrategy::Always
    }
}

/// One operator chain: a vertex of the JobGraph, run as one task per subtask.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct JobVertex {
    /// Its id.
    pub id: VertexId,
    /// The chain's operator names joined by " -> ".
    pub name: String,
    /// The chain's operators, head first, in topological order.
    pub nodes: Vec<NodeId>,
    /// Parallelism (equal for every operator in the chain).
    pub parallelism: u32,
    /// Max parallelism of the head (key groups of its keyed input).
    pub max_parallelism: u32,
    /// Whether the vertex has no inputs.
    pub is_source: bool,
}

impl JobVertex {
    /// The chain's head operator.
    pub fn head(&self) -> NodeId {
        self.nodes[0]
    }
}

/// A network exchange between two vertices.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct JobEdge {
    /// Its id.
    pub id: EdgeId,
    /// Producer vertex.
    pub source: VertexId,
    /// Consumer vertex.
    pub target: VertexId,
    /// The operator (in `source`'s chain) that produces.
    pub source_node: NodeId,
    /// The operator (head of `target`'s chain) that consumes.
    pub target_node: NodeId,
    /// How records pick their channel.
    pub partitioner: Partitioner,
    /// The consumer's max parallelism, which key-group hashing uses.
    pub target_max_parallelism: u32,
}

/// The dataflow after chaining.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct JobGraph {
    /// The job's name.
    pub job_name: String,
    /// The logical graph it was built from.
    pub stream_graph: StreamGraph,
    /// Chains, in topological order.
    pub vertices: Vec<JobVertex>,
    /// Exchanges.
    pub edges: Vec<JobEdge>,
    /// Each chained (in-task) edge, as `(source, target)`.
    pub chained_edges: Vec<(NodeId, NodeId)>,
    /// The vertex of each node.
    pub vertex_of: Vec<VertexId>,
}

impl JobGraph {
    /// Validates the StreamGraph and chains it.
    pub fn from_stream_graph(graph: &StreamGraph) -> Result<JobGraph, CoreError> {
        let mut graph = graph.clone();
        graph.assign_auto_ids();
        let graph = &graph;
        graph.validate()?;
        // Assign each node to the vertex of its chain head; nodes are topologically ordered, so
        // a node's chained predecessor always has its vertex already.
        let mut vertex_of: Vec<VertexId> = Vec::with_capacity(graph.nodes.len());
        let mut vertices: Vec<JobVertex> = Vec::new();
        let mut chained_edges = Vec::new();
        for n in &graph.nodes {
            let inputs: Vec<&StreamEdge> = graph.inputs(n.id).collect();
            let chained_input = match inputs.as_slice() {
                [e] if graph.is_chainable(e) => Some(*e),
                _ => None,
            };
            let v = match chained_input {
                Some(e) => {
                    chained_edges.push((e.source, e.target));
                    let v = vertex_of[e.source.0 as usize];
                    let vertex = &mut vertices[v.0 as usize];
                    vertex.nodes.push(n.id);
                    vertex.name.push_str(" -> ");
                    vertex.name.push_str(&n.name);
                    v
                }
                None => {
                    let v = VertexId(vertices.len() as u32);
                    vertices.push(JobVertex {
                        id: v,
                        name: n.name.clone(),
                        nodes: vec![n.id],
                        parallelism: n.parallelism,
                        max_parallelism: n.max_parallelism,
                        is_source: inputs.is_empty(),
                    });
                    v
                }
            };
            vertex_of.push(v);
        }
        let mut edges = Vec::new();
        for e in &graph.edges {
            if chained_edges.contains(&(e.source, e.target)) {
                continue;
            }
            edges.push(JobEdge {
                id: EdgeId(edges.len() as u32),
                source: vertex_of[e.source.0 as usize],
                target: vertex_of[e.target.0 as usize],
                source_node: e.source,
                target_node: e.target,
                partitioner: e.partitioner,
                target_max_parallelism: graph.node(e.target).max_parallelism,
            });
        }
        Ok(JobGraph {
            job_name: graph.job_name.clone(),
            stream_graph: graph.clone(),
            vertices,
            edges,
            chained_edges,
            vertex_of,
        })
    }

    /// A vertex by id.
    pub fn vertex(&self, id: VertexId) -> &JobVertex {
        &self.vertices[id.0 as usize]
    }

    /// The exchanges into a vertex.
    pub fn inputs(&self, id: VertexId) -> impl Iterator<Item = &JobEdge> {
        self.edges.iter().filter(move |e| e.target == id)
    }

    /// The exchanges out of a vertex.
    pub fn outputs(&self, id: VertexId) -> impl Iterator<Item = &JobEdge> {
        self.edges.iter().filter(move |e| e.source == id)
    }

    /// The operators chained directly after `node`.
    pub fn chained_outputs(&self, node: NodeId) -> impl Iterator<Item = NodeId> + '_ {
        self.chained_edges
            .iter()
            .filter(move |(s, _)| *s == node)
            .map(|(_, t)| *t)
    }

    /// The exchanges out of `node` (to other vertices).
    pub fn network_outputs(&self, node: NodeId) -> impl Iterator<Item = &JobEdge> {
        self.edges.iter().filter(move |e| e.source_node == node)
    }

    /// The total number of subtasks over all vertices.
    pub fn total_subtasks(&self) -> usize {
        self.vertices.iter().map(|v| v.parallelism as usize).sum()
    }
}

/// The lifecycle of one execution attempt (Flink's `ExecutionState`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ExecutionState {
    /// Not yet deployed.
    Created,
    /// Being deployed.
    Deploying,
    /// Processing.
    Running,
    /// Ended after its input ended.
    Finished,
    /// Being cancelled.
    Canceling,
    /// Cancelled.
    Canceled,
    /// Failed.
    Failed,
}

/// One subtask of a vertex and its current attempt.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ExecutionVertex {
    /// The vertex.
    pub vertex: VertexId,
    /// Its subtask index.
    pub subtask: SubtaskIndex,
    /// The current attempt.
    pub attempt: AttemptNumber,
    /// The current attempt's state.
    pub state: ExecutionState,
}

/// The parallel, running form of a JobGraph.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ExecutionGraph {
    /// Subtasks, grouped by vertex: `subtasks[v][i]`.
    pub subtasks: Vec<Vec<ExecutionVertex>>,
}

impl ExecutionGraph {
    /// Expands each vertex into its subtasks, all at attempt 0.
    pub fn new(job: &JobGraph) -> ExecutionGraph {
        let subtasks = job
            .vertices
            .iter()
            .map(|v| {
                (0..v.parallelism)
                    .map(|i| ExecutionVertex {
                        vertex: v.id,
                        subtask: i,
                        attempt: AttemptNumber(0),
                        state: ExecutionState::Created,
                    })
                    .collect()
            })
            .collect();
        ExecutionGraph { subtasks }
    }

    /// Moves every subtask to a new attempt, as a global failover does.
    pub fn restart_all(&mut self) {
        for ev in self.subtasks.iter_mut().flatten() {
            ev.attempt = AttemptNumber(ev.attempt.0 + 1);
            ev.state = ExecutionState::Created;
        }
    }

    /// Sets the state of every subtask.
    pub fn set_all(&mut self, state: ExecutionState) {
        for ev in self.subtasks.iter_mut().flatten() {
            ev.state = state;
        }
    }

    /// One subtask.
    pub fn get_mut(&mut self, vertex: VertexId, subtask: SubtaskIndex) -> &mut ExecutionVertex {
        &mut self.subtasks[vertex.0 as usize][subtask as usize]
    }

    /// Whether every subtask is in `state`.
    pub fn all_in(&self, state: ExecutionState) -> bool {
        self.subtasks.iter().flatten().all(|ev| ev.state == state)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn word_count(p: u32) -> StreamGraph {
        let mut g = StreamGraph::new("wc");
        let src = g.add_node("Source", None, p, 128);
        let map = g.add_node("Map", None, p, 128);
        let flat = g.add_node("FlatMap", None, p, 128);
        let sum = g.add_node("Sum", Some("sum".into()), p, 128);
        let sink = g.add_node("Sink", None, p, 128);
        g.add_edge(src, map, Partitioner::Forward);
        g.add_edge(map, flat, Partitioner::Forward);
        g.add_edge(flat, sum, Partitioner::Hash);
        g.add_edge(sum, sink, Partitioner::Forward);
        g
    }

    #[test]
    fn word_count_chains_into_two_vertices() {
        let jg = JobGraph::from_stream_graph(&word_count(2)).unwrap();
        let names: Vec<&str> = jg.vertices.iter().map(|v| v.name.as_str()).collect();
        assert_eq!(names, ["Source -> Map -> FlatMap", "Sum -> Sink"]);
        assert_eq!(jg.edges.len(), 1);
        assert_eq!(jg.edges[0].partitioner, Partitioner::Hash);
        assert!(jg.vertices[0].is_source && !jg.vertices[1].is_source);
        let mut eg = ExecutionGraph::new(&jg);
        assert_eq!(eg.subtasks.iter().flatten().count(), 4);
        eg.restart_all();
        assert!(
            eg.subtasks
                .iter()
                .flatten()
                .all(|e| e.attempt == AttemptNumber(1))
        );
    }

    #[test]
    fn operator_ids_are_stable_across_builds_and_follow_uid() {
        let (a, b) = (word_count(1), word_count(4));
        for (x, y) in a.nodes.iter().zip(&b.nodes) {
            assert_eq!(x.operator_id, y.operator_id);
        }
        assert_eq!(a.nodes[3].operator_id, OperatorId::from_uid("sum"));
    }

    #[test]
    fn auto_ids_follow_the_inputs_not_the_position() {
        let mut with_extra = StreamGraph::new("wc");
        let src = with_extra.add_node("Source", Some("src".into()), 1, 128);
        let extra = with_extra.add_node("Filter", None, 1, 128);
        let sum = with_extra.add_node("Sum", Some("sum".into()), 1, 128);
        let sink = with_extra.add_node("Sink", None, 1, 128);
        with_extra.add_edge(src, extra, Partitioner::Forward);
        with_extra.add_edge(extra, sum, Partitioner::Hash);
        with_extra.add_edge(sum, sink, Partitioner::Forward);
        let mut plain = word_count(1);
        plain.set_uid(NodeId(0), "src");
        let a = JobGraph::from_stream_graph(&with_extra).unwrap();
        let b = JobGraph::from_stream_graph(&plain).unwrap();
        let sink_id = |g: &JobGraph| {
            g.stream_graph
                .nodes
                .iter()
                .find(|n| n.name == "Sink")
                .unwrap()
                .operator_id
        };
        assert_eq!(sink_id(&a), sink_id(&b), "a sink after a uid keeps its id");
        let map_id = |g: &JobGraph| g.stream_graph.nodes[1].operator_id;
        assert_ne!(
            map_id(&a),
            map_id(&b),
            "different operators at the same position differ"
        );
        // Two same-named siblings on the same input get distinct ids.
        let mut twins = StreamGraph::new("t");
        let s = twins.add_node("Source", None, 1, 128);
        let x = twins.add_node("Sink", None, 1, 128);
        let y = twins.add_node("Sink", None, 1, 128);
        twins.add_edge(s, x, Partitioner::Forward);
        twins.add_edge(s, y, Partitioner::Forward);
        let t = JobGraph::from_stream_graph(&twins).unwrap();
        assert_ne!(
            t.stream_graph.nodes[1].operator_id,
            t.stream_graph.nodes[2].operator_id
        );
    }

    #[test]
    fn bad_graphs_are_named() {
        let mut g = word_count(2);
        g.nodes[1].parallelism = 3;
        let e = JobGraph::from_stream_graph(&g).unwrap_err().to_string();
        assert!(e.contains("forward partitioning"), "{e}");
        let mut g = word_count(2);
        g.nodes[0].parallelism = 0;
        let e = JobGraph::from_stream_graph(&g).unwrap_err().to_string();
        assert!(e.contains("invalid parallelism 0"), "{e}");
        let mut g = word_count(2);
        g.set_uid(NodeId(0), "sum");
        let e = JobGraph::from_stream_graph(&g).unwrap_err().to_string();
        assert!(e.contains("same uid"), "{e}");
    }
}
