//! Deployment: turns one JobGraph vertex into a running subtask's chain. Each StreamGraph node has
//! a typed factory ([`TypedNode`]) that knows its input and output types; the builder composes
//! them tail-first through type-erased boxes, so records cross chained operators as direct,
//! typed calls and only the build itself is dynamic.

use crate::error::TaskError;
use crate::operator::{Discard, Fanout, Output, SubtaskInfo, erase, unerase};
use crate::source::{SourceDriver, SourceFunction};
use crate::task::{NetworkInput, SourceInput, TaskInput};
use crate::writer::{ChannelSelector, KeyHashFn, RecordWriter};
use std::any::Any;
use std::collections::HashMap;
use std::sync::Arc;
use weir_core::channel_state::ChannelInfo;
use weir_core::graph::{JobEdge, JobGraph, JobVertex, StreamNode};
use weir_core::ids::{NodeId, OperatorId};
use weir_core::partition::{Partitioner, RoundRobin};
use weir_network::channel::{open_input, open_output};
use weir_network::{ChannelId, Data, InputGate, Transport};

/// Everything a factory needs to build one subtask.
pub(crate) struct BuildContext<'a> {
    pub transport: &'a dyn Transport,
    pub generation: u64,
    pub job: &'a JobGraph,
    pub vertex: &'a JobVertex,
    pub subtask: u32,
    pub attempt: u32,
    pub restored: bool,
    pub batch_size: usize,
    pub mode: weir_core::config::CheckpointingMode,
    pub key_hashes: &'a HashMap<(NodeId, NodeId), Arc<dyn Any + Send + Sync>>,
    /// The task's processing-time service, shared by its operators.
    pub processing_time: crate::operator::ProcessingTimeService,
    pub snapshot_compression: weir_state::Compression,
    /// Incremental keyed snapshots: the chain limit, or `None` for full snapshots.
    pub incremental: Option<u32>,
    /// The job's state backend.
    pub state_backend: &'a Arc<dyn weir_state::StateBackend>,
    /// The generation's cancellation signal, shared by its operators.
    pub cancellation: crate::operator::Cancellation,
}

impl BuildContext<'_> {
    pub fn info(&self, node: &StreamNode) -> SubtaskInfo {
        SubtaskInfo {
            cancellation: self.cancellation.clone(),
            processing_time: self.processing_time.clone(),
            snapshot_compression: self.snapshot_compression,
            incremental: self.incremental,
            state_backend: Arc::clone(self.state_backend),
            index: self.subtask,
            parallelism: node.parallelism,
            max_parallelism: node.max_parallelism,
            attempt: self.attempt,
            task_name: format!(
                "{} ({}/{})#{}",
                self.vertex.name,
                self.subtask + 1,
                self.vertex.parallelism,
                self.attempt
            ),
            restored: self.restored,
        }
    }

    /// How channel state names a channel of `edge`.
    fn channel_info(&self, edge: &JobEdge, producer: u32, consumer: u32) -> ChannelInfo {
        ChannelInfo {
            from: self.job.stream_graph.node(edge.source_node).operator_id,
            to: self.job.stream_graph.node(edge.target_node).operator_id,
            producer,
            consumer,
        }
    }

    fn channel(&self, edge: &JobEdge, producer: u32, consumer: u32) -> ChannelId {
        ChannelId {
            generation: self.generation,
            edge: edge.id,
            producer,
            consumer,
        }
    }
}

/// What an operator factory gets.
pub struct OperatorContext {
    /// The operator's stable id.
    pub operator_id: OperatorId,
    /// Its name.
    pub name: String,
    /// Where it runs.
    pub info: SubtaskInfo,
}

/// Builds a source's split enumerator for a source of the given parallelism.
pub(crate) type EnumeratorFactory =
    Arc<dyn Fn(u32) -> Box<dyn crate::source::SplitEnumerator> + Send + Sync>;

/// Builds a source function for a subtask.
pub(crate) type SourceFactory<O> =
    Arc<dyn Fn(&SubtaskInfo) -> Box<dyn SourceFunction<O>> + Send + Sync>;
/// Builds a chained operator in front of its downstream.
pub(crate) type OperatorFactory<I, O> =
    Arc<dyn Fn(&OperatorContext, Box<dyn Output<O>>) -> Box<dyn Output<I>> + Send + Sync>;

/// The type-erased face of a [`TypedNode`].
pub(crate) trait NodeFactory: Send + Sync {
    fn build_source(
        &self,
        ctx: &BuildContext<'_>,
        node: &StreamNode,
        next: Box<dyn Any>,
    ) -> Result<Box<dyn TaskInput>, TaskError>;
    fn build_operator(
        &self,
        ctx: &BuildContext<'_>,
        node: &StreamNode,
        next: Box<dyn Any>,
    ) -> Result<Box<dyn Any>, TaskError>;
    fn build_network_input(
        &self,
        ctx: &BuildContext<'_>,
        node: &StreamNode,
        head: Box<dyn Any>,
        edges: &[&JobEdge],
    ) -> Result<Box<dyn TaskInput>, TaskError>;
    fn output_writer(
        &self,
        ctx: &BuildContext<'_>,
        edge: &JobEdge,
    ) -> Result<Box<dyn Any>, TaskError>;
    fn fanout(&self, node: &StreamNode, outs: Vec<Box<dyn Any>>)
    -> Result<Box<dyn Any>, TaskError>;
    fn discard(&self) -> Box<dyn Any>;
}

/// A node with input type `I` and output type `O` (sources have `I = ()`).
pub(crate) struct TypedNode<I, O> {
    pub source: Option<SourceFactory<O>>,
    pub operator: Option<OperatorFactory<I, O>>,
}

fn build_error(node: &StreamNode, message: &str) -> TaskError {
    TaskError::Operator {
        operator: node.name.clone(),
        message: format!("internal build error: {message}"),
    }
}

impl<I: Data, O: Data> NodeFactory for TypedNode<I, O> {
    fn build_source(
        &self,
        ctx: &BuildContext<'_>,
        node: &StreamNode,
        next: Box<dyn Any>,
    ) -> Result<Box<dyn TaskInput>, TaskError> {
        let factory = self
            .source
            .as_ref()
            .ok_or_else(|| build_error(node, "not a source"))?;
        let info = ctx.info(node);
        let next = unerase::<O>(next, &node.name)?;
        let source = factory(&info);
        Ok(Box::new(SourceInput {
            driver: SourceDriver::new(node.operator_id, info, source, next, ctx.batch_size),
            ended: false,
        }))
    }

    fn build_operator(
        &self,
        ctx: &BuildContext<'_>,
        node: &StreamNode,
        next: Box<dyn Any>,
    ) -> Result<Box<dyn Any>, TaskError> {
        let factory = self
            .operator
            .as_ref()
            .ok_or_else(|| build_error(node, "not an operator"))?;
        let op_ctx = OperatorContext {
            operator_id: node.operator_id,
            name: node.name.clone(),
            info: ctx.info(node),
        };
        let next = unerase::<O>(next, &node.name)?;
        Ok(erase::<I>(factory(&op_ctx, next)))
    }

    fn build_network_input(
        &self,
        ctx: &BuildContext<'_>,
        node: &StreamNode,
        head: Box<dyn Any>,
        edges: &[&JobEdge],
    ) -> Result<Box<dyn TaskInput>, TaskError> {
        let head = unerase::<I>(head, &node.name)?;
        let mut receivers = Vec::new();
        let mut infos = Vec::new();
        for edge in edges {
            let producers = ctx.job.vertex(edge.source).parallelism;
            let range = if edge.partitioner == Partitioner::Forward {
                ctx.subtask..ctx.subtask + 1
            } else {
                0..producers
            };
            for p in range {
                receivers.push(open_input::<I>(
                    ctx.transport,
                    ctx.channel(edge, p, ctx.subtask),
                )?);
                infos.push(ctx.channel_info(edge, p, ctx.subtask));
            }
        }
        Ok(Box::new(NetworkInput::new(
            InputGate::new(receivers),
            infos,
            head,
            ctx.mode,
        )))
    }

    fn output_writer(
        &self,
        ctx: &BuildContext<'_>,
        edge: &JobEdge,
    ) -> Result<Box<dyn Any>, TaskError> {
        let consumers = ctx.job.vertex(edge.target).parallelism;
        let mut senders = Vec::new();
        let mut infos = Vec::new();
        let range = if edge.partitioner == Partitioner::Forward {
            ctx.subtask..ctx.subtask + 1
        } else {
            0..consumers
        };
        for c in range {
            senders.push(open_output::<O>(
                ctx.transport,
                ctx.channel(edge, ctx.subtask, c),
            )?);
            infos.push(ctx.channel_info(edge, ctx.subtask, c));
        }
        let selector = match edge.partitioner {
            Partitioner::Forward => ChannelSelector::Forward,
            Partitioner::Rebalance => {
                ChannelSelector::Rebalance(RoundRobin::new(ctx.subtask, consumers))
            }
            Partitioner::Broadcast => ChannelSelector::Broadcast,
            Partitioner::Hash => {
                let key_hash = ctx
                    .key_hashes
                    .get(&(edge.source_node, edge.target_node))
                    .and_then(|a| a.clone().downcast::<KeyHashFn<O>>().ok())
                    .ok_or_else(|| TaskError::Operator {
                        operator: format!("edge {:?}", edge.id),
                        message: "internal build error: hash edge without a key".into(),
                    })?;
                ChannelSelector::Hash {
                    key_hash: (*key_hash).clone(),
                    max_parallelism: edge.target_max_parallelism,
                }
            }
        };
        Ok(erase::<O>(Box::new(RecordWriter::new(
            senders,
            infos,
            selector,
            ctx.batch_size,
        ))))
    }

    fn fanout(
        &self,
        node: &StreamNode,
        outs: Vec<Box<dyn Any>>,
    ) -> Result<Box<dyn Any>, TaskError> {
        let outs = outs
            .into_iter()
            .map(|o| unerase::<O>(o, &node.name))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(erase::<O>(Box::new(Fanout::new(outs))))
    }

    fn discard(&self) -> Box<dyn Any> {
        erase::<O>(Box::new(Discard))
    }
}

/// Builds the task input (and the whole chain behind it) of one subtask of `ctx.vertex`.
pub(crate) fn build_task(
    ctx: &BuildContext<'_>,
    factories: &[Arc<dyn NodeFactory>],
) -> Result<Box<dyn TaskInput>, TaskError> {
    let head = ctx.vertex.head();
    let node = ctx.job.stream_graph.node(head);
    let factory = &factories[head.0 as usize];
    if ctx.vertex.is_source {
        let next = build_output(ctx, factories, head)?;
        factory.build_source(ctx, node, next)
    } else {
        let head_input = build_input(ctx, factories, head)?;
        let edges: Vec<&JobEdge> = ctx.job.inputs(ctx.vertex.id).collect();
        factory.build_network_input(ctx, node, head_input, &edges)
    }
}

fn build_output(
    ctx: &BuildContext<'_>,
    factories: &[Arc<dyn NodeFactory>],
    node: NodeId,
) -> Result<Box<dyn Any>, TaskError> {
    let factory = &factories[node.0 as usize];
    let mut outs = Vec::new();
    for child in ctx.job.chained_outputs(node) {
        outs.push(build_input(ctx, factories, child)?);
    }
    for edge in ctx.job.network_outputs(node) {
        outs.push(factory.output_writer(ctx, edge)?);
    }
    match outs.len() {
        0 => Ok(factory.discard()),
        1 => Ok(outs.remove(0)),
        _ => factory.fanout(ctx.job.stream_graph.node(node), outs),
    }
}

fn build_input(
    ctx: &BuildContext<'_>,
    factories: &[Arc<dyn NodeFactory>],
    node: NodeId,
) -> Result<Box<dyn Any>, TaskError> {
    let next = build_output(ctx, factories, node)?;
    factories[node.0 as usize].build_operator(ctx, ctx.job.stream_graph.node(node), next)
}
