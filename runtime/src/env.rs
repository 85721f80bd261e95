//! The DataStream API: [`StreamEnvironment`], [`DataStream`] and [`KeyedStream`], which build the
//! StreamGraph and the typed factories that deployment turns into running chains.

use crate::cluster::ClusterRole;
#[cfg(feature = "cluster")]
use crate::cluster::taskexecutor::run_task_manager;
use crate::config::{JobConfig, StorageConfig};
use crate::deploy::{
    EnumeratorFactory, NodeFactory, OperatorContext, OperatorFactory, SourceFactory, TypedNode,
};
use crate::error::JobError;
use crate::file_sink::FileSink;
use crate::job::JobClient;
use crate::keyed::{
    KeyFn, KeyedBase, KeyedProcessFunction, ProcessOperator, ReduceOperator, SumOperator,
};
use crate::master::run_job;
use crate::operator::{Chained, OneInputOperator, Output, SubtaskInfo};
use crate::ops::{FilterOperator, FlatMapOperator, MapOperator};
use crate::restart::RestartStrategy;
use crate::sink::SharedResult;
use crate::sink::{
    CollectHandle, LatestHandle, LatestPerKeySink, PrintSink, Printable, TwoPhaseCommitSink,
};
use crate::source::{IndexSplitEnumerator, IndexedSource, SourceFunction, SplitEnumerator};
use crate::spec::{JobResult, JobSpec};
use crate::writer::KeyHashFn;
use std::any::Any;
use std::cell::RefCell;
use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::marker::PhantomData;
use std::ops::Add;
use std::path::PathBuf;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;
use weir_core::config::{CheckpointConfig, CheckpointingMode};
use weir_core::graph::{JobGraph, StreamGraph};
use weir_core::ids::NodeId;
use weir_core::keygroup::compute_default_max_parallelism;
use weir_core::partition::Partitioner;
use weir_network::Data;
use weir_state::{StateKey, StateValue};

mod connect_broadcast;
pub use connect_broadcast::{BroadcastConnectedStream, KeyedBroadcastConnectedStream};

/// Splits the generator starts with, per reader: readers come back to the enumerator for work,
/// so assignment, its checkpointed state and reassignment on restore are exercised all the time.
const GENERATOR_SPLITS_PER_READER: u32 = 4;

struct EnvInner {
    config: JobConfig,
    graph: StreamGraph,
    factories: Vec<Arc<dyn NodeFactory>>,
    key_hashes: HashMap<(NodeId, NodeId), Arc<dyn Any + Send + Sync>>,
    enumerators: HashMap<NodeId, EnumeratorFactory>,
    /// Handles whose published values the job manager gathers in cluster mode.
    results: Vec<Arc<dyn SharedResult>>,
    /// Edges whose partitioner was chosen by default (forward, or rebalance when parallelism
    /// differs), so a later parallelism change can re-choose it.
    defaulted: HashSet<(NodeId, NodeId)>,
    explicit_parallelism: HashSet<NodeId>,
    /// What makes the job, as built, impossible to run (a window of size 0): `execute` fails
    /// naming each.
    build_errors: Vec<String>,
}

/// Where a job is built and from which it runs (Flink's `StreamExecutionEnvironment`).
#[derive(Clone)]
pub struct StreamEnvironment {
    inner: Rc<RefCell<EnvInner>>,
}

impl Default for StreamEnvironment {
    fn default() -> Self {
        Self::new()
    }
}

impl StreamEnvironment {
    /// An environment with the default configuration: parallelism 1, checkpointing off.
    pub fn new() -> Self {
        Self::with_config(JobConfig::default())
    }

    /// An environment with `config`.
    pub fn with_config(config: JobConfig) -> Self {
        let graph = StreamGraph::new(config.job_name.clone());
        StreamEnvironment {
            inner: Rc::new(RefCell::new(EnvInner {
                config,
                graph,
                factories: Vec::new(),
                key_hashes: HashMap::new(),
                enumerators: HashMap::new(),
                results: Vec::new(),
                defaulted: HashSet::new(),
                explicit_parallelism: HashSet::new(),
                build_errors: Vec::new(),
            })),
        }
    }

    /// The configuration, to read or change.
    pub fn config_mut(&self) -> std::cell::RefMut<'_, JobConfig> {
        std::cell::RefMut::map(self.inner.borrow_mut(), |i| &mut i.config)
    }

    /// Sets the job's name (and so its id and checkpoint directory).
    pub fn set_job_name(&self, name: &str) -> &Self {
        let mut i = self.inner.borrow_mut();
        i.config.job_name = name.to_string();
        i.graph.job_name = name.to_string();
        self
    }

    /// Sets the default parallelism of operators added from now on.
    pub fn set_parallelism(&self, parallelism: u32) -> &Self {
        self.config_mut().parallelism = parallelism;
        self
    }

    /// Sets the max parallelism (number of key groups) of every operator.
    pub fn set_max_parallelism(&self, max_parallelism: u32) -> &Self {
        self.config_mut().max_parallelism = Some(max_parallelism);
        self
    }

    /// Turns on periodic checkpoints every `interval` (exactly-once, aligned).
    pub fn enable_checkpointing(&self, interval: Duration) -> &Self {
        self.config_mut().checkpoint.interval = Some(interval);
        self
    }

    /// Sets the checkpointing mode.
    pub fn set_checkpointing_mode(&self, mode: CheckpointingMode) -> &Self {
        self.config_mut().checkpoint.mode = mode;
        self
    }

    /// The checkpoint options, to change timeout, retention and the rest.
    pub fn checkpoint_config(&self) -> std::cell::RefMut<'_, CheckpointConfig> {
        std::cell::RefMut::map(self.inner.borrow_mut(), |i| &mut i.config.checkpoint)
    }

    /// Where checkpoints go.
    pub fn set_checkpoint_storage(&self, storage: StorageConfig) -> &Self {
        self.config_mut().storage = storage;
        self
    }

    /// Applies configuration keys in Flink's names (`state.backend.type`,
    /// `state.backend.disk.local-dir`, `state.backend.incremental`,
    /// `state.checkpoints.num-retained`; [`crate::settings::KEYS`]). An unknown key or a bad
    /// value is an error naming it, and changes nothing.
    pub fn configure(&self, settings: &[(String, String)]) -> Result<&Self, crate::JobError> {
        crate::settings::apply(&mut self.config_mut(), settings)?;
        Ok(self)
    }

    /// Where the job keeps its keyed state (Flink's `env.setStateBackend`): a factory of one
    /// keyed backend per keyed operator and subtask. The default is
    /// [`HeapStateBackend`](weir_state::HeapStateBackend); any [`StateBackend`] works, a
    /// custom one typically as a [`KeyedStore`](weir_state::store::KeyedStore) of bytes.
    pub fn set_state_backend(&self, backend: impl weir_state::StateBackend) -> &Self {
        self.config_mut().state_backend = Arc::new(backend);
        self
    }

    /// Wraps or replaces the transport the job's subtasks exchange records through (see
    /// [`TransportLayer`](crate::config::TransportLayer)): `layer` gets the engine's own and
    /// returns the one to use.
    pub fn set_transport(
        &self,
        layer: impl Fn(Arc<dyn weir_network::Transport>) -> Arc<dyn weir_network::Transport>
        + Send
        + Sync
        + 'static,
    ) -> &Self {
        self.config_mut().transport = Some(crate::config::TransportLayer(Arc::new(layer)));
        self
    }

    /// Checkpoints into a local directory (opendal's fs service). For S3, use
    /// [`set_checkpoint_storage`](Self::set_checkpoint_storage) with [`StorageConfig::S3`] (or
    /// [`StorageConfig::from_location`]).
    pub fn set_checkpoint_dir(&self, dir: impl Into<PathBuf>) -> &Self {
        self.set_checkpoint_storage(StorageConfig::Filesystem(dir.into()))
    }

    /// The restart strategy.
    pub fn set_restart_strategy(&self, strategy: RestartStrategy) -> &Self {
        self.config_mut().restart = Some(strategy);
        self
    }

    /// Where savepoints go when a request names no directory.
    pub fn set_savepoint_dir(&self, dir: impl Into<PathBuf>) -> &Self {
        self.config_mut().savepoint_dir = Some(dir.into());
        self
    }

    /// Restores even if the checkpoint has state for operators this job no longer has.
    pub fn set_allow_non_restored_state(&self, allow: bool) -> &Self {
        self.config_mut().allow_non_restored_state = allow;
        self
    }

    /// Declares a source setting that decides what a replay reads (a topic, a file, a record
    /// count, a seed). Every checkpoint records these in its job fingerprint, and a restore into
    /// a job whose settings differ is refused, naming the difference, unless
    /// [`set_allow_changed_sources`](Self::set_allow_changed_sources).
    pub fn set_source_config(&self, key: &str, value: impl ToString) -> &Self {
        self.config_mut()
            .source_config
            .insert(key.to_string(), value.to_string());
        self
    }

    /// Restores even though the source settings differ from the checkpoint's (the user
    /// vouches that the sources still replay the same records).
    pub fn set_allow_changed_sources(&self, allow: bool) -> &Self {
        self.config_mut().allow_changed_sources = allow;
        self
    }

    /// Starts the job from a checkpoint directory, or from the latest complete checkpoint under
    /// a checkpoint root (like `flink run -s`). An `s3://bucket/prefix` path is read from S3,
    /// configured from the AWS environment variables as [`StorageConfig::from_location`] does.
    pub fn restore_from(&self, path: impl Into<PathBuf>) -> &Self {
        self.config_mut().restore_from = Some(path.into());
        self
    }

    fn add_node<I: Data, O: Data>(
        &self,
        name: &str,
        input: Option<(NodeId, Option<Partitioner>)>,
        node: TypedNode<I, O>,
    ) -> NodeId {
        let mut i = self.inner.borrow_mut();
        let parallelism = i.config.parallelism;
        let id = i.graph.add_node(name, None, parallelism, 0);
        i.factories.push(Arc::new(node));
        if let Some((from, partitioner)) = input {
            let p = match partitioner {
                Some(p) => p,
                None => {
                    i.defaulted.insert((from, id));
                    if i.graph.node(from).parallelism == parallelism {
                        Partitioner::Forward
                    } else {
                        Partitioner::Rebalance
                    }
                }
            };
            i.graph.add_edge(from, id, p);
        }
        id
    }

    /// A source built per subtask by `factory`.
    pub fn add_source<T: Data>(
        &self,
        name: &str,
        factory: impl Fn(&SubtaskInfo) -> Box<dyn SourceFunction<T>> + Send + Sync + 'static,
    ) -> DataStream<T> {
        let factory: SourceFactory<T> = Arc::new(factory);
        let node = self.add_node::<(), T>(
            name,
            None,
            TypedNode {
                source: Some(factory),
                operator: None,
            },
        );
        DataStream::new(self.clone(), node)
    }

    /// A source whose splits a [`SplitEnumerator`] hands out (Flink's `fromSource` with a
    /// `Source` that has its own enumerator): `readers` builds the reader of each subtask, and
    /// `enumerator` builds, in the job master, the enumerator for the source's parallelism. The
    /// enumerator's state is checkpointed with the job; readers ask it for splits by returning
    /// [`SourceStatus::NeedSplits`](crate::source::SourceStatus::NeedSplits).
    pub fn add_source_with_enumerator<T: Data>(
        &self,
        name: &str,
        readers: impl Fn(&SubtaskInfo) -> Box<dyn SourceFunction<T>> + Send + Sync + 'static,
        enumerator: impl Fn(u32) -> Box<dyn SplitEnumerator> + Send + Sync + 'static,
    ) -> DataStream<T> {
        let stream = self.add_source(name, readers);
        let enumerator: EnumeratorFactory = Arc::new(enumerator);
        self.inner
            .borrow_mut()
            .enumerators
            .insert(stream.node, enumerator);
        stream
    }

    /// A replayable source of `count` records (`None`: unbounded) where record `i` is `make(i)`;
    /// the counterpart of Flink's `DataGeneratorSource`.
    pub fn from_generator<T: Data>(
        &self,
        count: Option<u64>,
        make: impl Fn(u64) -> T + Send + Sync + 'static,
    ) -> DataStream<T> {
        let make: Arc<dyn Fn(u64) -> T + Send + Sync> = Arc::new(make);
        // An unbounded reader never finishes its split, so it would never ask for another: every
        // split goes out at the start.
        let per_reader = if count.is_some() {
            GENERATOR_SPLITS_PER_READER
        } else {
            1
        };
        self.indexed_source("Generator Source", count, make, per_reader, None)
    }

    /// [`from_generator`](Self::from_generator) with watermarks generated per split inside the
    /// source (Flink's `fromSource(source, WatermarkStrategy.forBoundedOutOfOrderness(..)
    /// .withTimestampAssigner(..))`): each split's watermark trails the largest `timestamp` it
    /// emitted by `max_out_of_orderness`, and the source's is the minimum over the splits it
    /// reads, checkpointed per split. Each reader owns one split (every `p`-th record, in
    /// order) and takes the splits it owns before it emits anything, so that no split is handed
    /// out after the watermark passed its records; a reader
    /// that restores several (after a rescale to fewer subtasks) reads them a batch at a time,
    /// far more out of order than any one, and its watermark follows the slowest.
    pub fn from_generator_with_watermarks<T: Data>(
        &self,
        count: Option<u64>,
        make: impl Fn(u64) -> T + Send + Sync + 'static,
        max_out_of_orderness: Duration,
        timestamp: impl Fn(&T) -> i64 + Send + Sync + 'static,
    ) -> DataStream<T> {
        let make: Arc<dyn Fn(u64) -> T + Send + Sync> = Arc::new(make);
        let per_reader = 1;
        let bound = i64::try_from(max_out_of_orderness.as_millis()).unwrap_or(i64::MAX);
        self.indexed_source(
            "Generator Source",
            count,
            make,
            per_reader,
            Some((Arc::new(timestamp), bound)),
        )
    }

    /// A source over indices whose splits an [`IndexSplitEnumerator`] hands out.
    fn indexed_source<T: Data>(
        &self,
        name: &str,
        count: Option<u64>,
        make: Arc<dyn Fn(u64) -> T + Send + Sync>,
        splits_per_reader: u32,
        watermarks: Option<(crate::split_watermarks::TimestampFn<T>, i64)>,
    ) -> DataStream<T> {
        let owned = watermarks.is_some();
        let stream = self.add_source(name, move |_| {
            let source = IndexedSource::new(count, make.clone());
            let source = match &watermarks {
                Some((timestamp, bound)) => source.with_watermarks(timestamp.clone(), *bound),
                None => source,
            };
            Box::new(source) as Box<dyn SourceFunction<T>>
        });
        let enumerator: EnumeratorFactory = Arc::new(move |parallelism| {
            let splits = parallelism.saturating_mul(splits_per_reader);
            Box::new(if owned {
                IndexSplitEnumerator::owned(splits, parallelism)
            } else {
                IndexSplitEnumerator::new(splits)
            }) as Box<dyn SplitEnumerator>
        });
        self.inner
            .borrow_mut()
            .enumerators
            .insert(stream.node, enumerator);
        stream
    }

    /// The lines of the files in `dir`, read once, each file a split with its byte offset in
    /// split state (Flink's `FileSource.forRecordStreamFormat(new TextLineInputFormat(), dir)`);
    /// [`FileSource`](crate::FileSource) also monitors a directory and parses lines. Fails when
    /// `dir` cannot be listed.
    pub fn read_text_files(
        &self,
        dir: impl Into<PathBuf>,
    ) -> Result<DataStream<String>, crate::JobError> {
        crate::FileSource::text_lines(dir).build(self)
    }

    /// A replayable source of the elements of `items`.
    pub fn from_collection<T: Data + Sync>(&self, items: Vec<T>) -> DataStream<T> {
        let items = Arc::new(items);
        let n = items.len() as u64;
        let make: Arc<dyn Fn(u64) -> T + Send + Sync> =
            Arc::new(move |i| items[i as usize].clone());
        // One split per reader: at parallelism 1 the elements come out in the collection's order.
        self.indexed_source("Collection Source", Some(n), make, 1, None)
    }

    /// The StreamGraph as built so far, with max parallelism filled in.
    pub fn stream_graph(&self) -> StreamGraph {
        let i = self.inner.borrow();
        let mut g = i.graph.clone();
        for n in &mut g.nodes {
            n.max_parallelism = i
                .config
                .max_parallelism
                .unwrap_or_else(|| compute_default_max_parallelism(n.parallelism));
        }
        g.assign_auto_ids();
        g
    }

    /// Chains the graph into a JobGraph (validating parallelism, edges and uids).
    pub fn job_graph(&self) -> Result<JobGraph, JobError> {
        Ok(JobGraph::from_stream_graph(&self.stream_graph())?)
    }

    pub(crate) fn into_spec(self) -> Result<JobSpec, JobError> {
        // The settings first: a graph error can be a consequence of one (a max parallelism out
        // of range).
        self.inner.borrow().config.validate()?;
        let build_errors = self.inner.borrow().build_errors.clone();
        if !build_errors.is_empty() {
            return Err(JobError::Invalid(build_errors.join("; ")));
        }
        let job = self.job_graph()?;
        let i = self.inner.borrow();
        Ok(JobSpec {
            config: i.config.clone(),
            job,
            factories: i.factories.clone(),
            key_hashes: i.key_hashes.clone(),
            enumerators: i.enumerators.clone(),
            results: i.results.clone(),
        })
    }

    /// Runs the job to its end (Flink's `execute`).
    pub fn execute(self) -> impl Future<Output = Result<JobResult, JobError>> + Send + 'static {
        self.execute_with(JobClient::default())
    }

    /// Runs the job; `client` can cancel it, trigger checkpoints and savepoints, or stop it with
    /// a savepoint.
    ///
    /// In cluster mode ([`JobConfig::cluster`]), a job manager runs the job master and deploys
    /// the subtasks to task managers; a task manager runs what it is deployed until the job
    /// manager shuts it down, and its result carries only its own source count (the client
    /// has no effect there).
    pub fn execute_with(
        self,
        canceller: JobClient,
    ) -> impl Future<Output = Result<JobResult, JobError>> + Send + 'static {
        let spec = self.into_spec();
        async move {
            let spec = spec?;
            match spec.config.cluster.clone() {
                #[cfg(feature = "cluster")]
                Some(ClusterRole::TaskManager(options)) => run_task_manager(spec, options).await,
                #[cfg(not(feature = "cluster"))]
                Some(ClusterRole::TaskManager(_)) => {
                    Err(JobError::Invalid(crate::cluster::MISSING.to_string()))
                }
                _ => run_job(spec, canceller).await,
            }
        }
    }
}

/// A stream of records of type `T`.
pub struct DataStream<T> {
    env: StreamEnvironment,
    node: NodeId,
    partitioner: Option<Partitioner>,
    _t: PhantomData<fn() -> T>,
}

impl<T> Clone for DataStream<T> {
    fn clone(&self) -> Self {
        DataStream {
            env: self.env.clone(),
            node: self.node,
            partitioner: self.partitioner,
            _t: PhantomData,
        }
    }
}

impl<T: Data> DataStream<T> {
    fn new(env: StreamEnvironment, node: NodeId) -> Self {
        DataStream {
            env,
            node,
            partitioner: None,
            _t: PhantomData,
        }
    }

    /// The StreamGraph node that produces this stream.
    pub fn node_id(&self) -> NodeId {
        self.node
    }

    /// The environment the stream belongs to (a connector reads the job's configuration, such
    /// as the checkpoint interval, from it).
    pub fn environment(&self) -> &StreamEnvironment {
        &self.env
    }

    /// Adds a one-input operator built per subtask by `factory`.
    pub fn transform<U: Data>(
        self,
        name: &str,
        factory: impl Fn(&OperatorContext, Box<dyn Output<U>>) -> Box<dyn Output<T>>
        + Send
        + Sync
        + 'static,
    ) -> DataStream<U> {
        let factory: OperatorFactory<T, U> = Arc::new(factory);
        let node = self.env.add_node::<T, U>(
            name,
            Some((self.node, self.partitioner)),
            TypedNode {
                source: None,
                operator: Some(factory),
            },
        );
        DataStream::new(self.env.clone(), node)
    }

    fn chain<U: Data, Op>(
        self,
        name: &str,
        make: impl Fn(&OperatorContext) -> Op + Send + Sync + 'static,
    ) -> DataStream<U>
    where
        Op: OneInputOperator<T, Out = U>,
    {
        self.transform(name, move |ctx, next| {
            Box::new(Chained::new(make(ctx), next))
        })
    }

    /// Applies `f` to every record.
    pub fn map<U: Data>(self, f: impl Fn(T) -> U + Send + Sync + 'static) -> DataStream<U> {
        let f = Arc::new(f);
        self.chain("Map", move |ctx| {
            MapOperator(f.clone(), ctx.info.cancellation.clone())
        })
    }

    /// Turns every record into zero or more.
    pub fn flat_map<U: Data, I: IntoIterator<Item = U> + 'static>(
        self,
        f: impl Fn(T) -> I + Send + Sync + 'static,
    ) -> DataStream<U> {
        let f = Arc::new(f);
        self.chain("FlatMap", move |ctx| {
            FlatMapOperator(f.clone(), ctx.info.cancellation.clone())
        })
    }

    /// Keeps the records `f` accepts.
    pub fn filter(self, f: impl Fn(&T) -> bool + Send + Sync + 'static) -> DataStream<T> {
        let f = Arc::new(f);
        self.chain("Filter", move |ctx| {
            FilterOperator(f.clone(), ctx.info.cancellation.clone())
        })
    }

    /// Reads each record's event time with `timestamp` (ms) and emits watermarks that trail the
    /// largest timestamp seen by `max_out_of_orderness` (Flink's
    /// `assignTimestampsAndWatermarks(WatermarkStrategy.forBoundedOutOfOrderness(..))`).
    /// Event-time timers downstream fire on these watermarks.
    pub fn assign_timestamps_and_watermarks(
        self,
        max_out_of_orderness: std::time::Duration,
        timestamp: impl Fn(&T) -> i64 + Send + Sync + 'static,
    ) -> DataStream<T> {
        let f = Arc::new(timestamp);
        let bound = max_out_of_orderness.as_millis() as i64;
        self.chain("Timestamps/Watermarks", move |_| {
            crate::ops::BoundedOutOfOrderness::new(f.clone(), bound)
        })
    }

    /// Merges this stream with `others` of the same type into one (Flink's `union`): the next
    /// operator reads every input's records, each input in its own order, and its watermark is
    /// the minimum over all of them. Each other stream reaches it forward when the parallelisms
    /// match and round-robin otherwise, unless it set its own partitioning (`rebalance`,
    /// `broadcast`). A stream from another environment, or this stream itself among `others`,
    /// fails `execute` naming the problem.
    pub fn union(self, others: Vec<DataStream<T>>) -> DataStream<T> {
        let env = self.env.clone();
        let own = self.node;
        let out = self.transform::<T>("Union", |_, next| next);
        let mut inner = env.inner.borrow_mut();
        let parallelism = inner.graph.node(out.node).parallelism;
        let mut seen = vec![own];
        for other in others {
            if !Rc::ptr_eq(&other.env.inner, &env.inner) {
                inner
                    .build_errors
                    .push("union: a stream of another StreamEnvironment".into());
                continue;
            }
            if seen.contains(&other.node) {
                inner.build_errors.push(
                    "union: the same stream twice (map it to a second stream first to read its \
                     records twice)"
                        .into(),
                );
                continue;
            }
            seen.push(other.node);
            let partitioner = match other.partitioner {
                Some(p) => p,
                None => {
                    inner.defaulted.insert((other.node, out.node));
                    if inner.graph.node(other.node).parallelism == parallelism {
                        Partitioner::Forward
                    } else {
                        Partitioner::Rebalance
                    }
                }
            };
            inner.graph.add_edge(other.node, out.node, partitioner);
        }
        drop(inner);
        out
    }

    /// Sends records round-robin to the next operator.
    pub fn rebalance(mut self) -> Self {
        self.partitioner = Some(Partitioner::Rebalance);
        self
    }

    /// Sends every record to every subtask of the next operator.
    pub fn broadcast(mut self) -> Self {
        self.partitioner = Some(Partitioner::Broadcast);
        self
    }

    /// Partitions by a key read from each record, so each key's records meet in one subtask with
    /// its keyed state (Flink's `keyBy`).
    pub fn key_by<K: StateKey>(
        self,
        key: impl for<'a> Fn(&'a T) -> &'a K + Send + Sync + 'static,
    ) -> KeyedStream<K, T> {
        KeyedStream {
            stream: self,
            key: Arc::new(key),
            reinterpreted: false,
        }
    }

    /// Declares a stream that is already partitioned by `key` (as the output of a keyed
    /// operation on that key is) to be keyed, without a shuffle: keyed operations on it chain
    /// directly (Flink's `DataStreamUtils.reinterpretAsKeyedStream`). A record whose key group
    /// its subtask does not own is reported as an error.
    pub fn reinterpret_as_keyed<K: StateKey>(
        self,
        key: impl for<'a> Fn(&'a T) -> &'a K + Send + Sync + 'static,
    ) -> KeyedStream<K, T> {
        KeyedStream {
            stream: self,
            key: Arc::new(key),
            reinterpreted: true,
        }
    }

    /// Sets the operator's `uid`: the stable name its state is stored under.
    pub fn uid(self, uid: &str) -> Self {
        self.env.inner.borrow_mut().graph.set_uid(self.node, uid);
        self
    }

    /// Sets the operator's display name.
    pub fn name(self, name: &str) -> Self {
        self.env.inner.borrow_mut().graph.nodes[self.node.0 as usize].name = name.to_string();
        self
    }

    /// The operator's parallelism as set so far.
    pub(crate) fn parallelism(&self) -> u32 {
        self.env.inner.borrow().graph.node(self.node).parallelism
    }

    /// Sets the operator's parallelism.
    pub fn set_parallelism(self, parallelism: u32) -> Self {
        let mut i = self.env.inner.borrow_mut();
        i.graph.nodes[self.node.0 as usize].parallelism = parallelism;
        i.explicit_parallelism.insert(self.node);
        let edges: Vec<usize> = (0..i.graph.edges.len())
            .filter(|&k| {
                let e = &i.graph.edges[k];
                (e.target == self.node || e.source == self.node)
                    && i.defaulted.contains(&(e.source, e.target))
            })
            .collect();
        for k in edges {
            let (s, t) = (i.graph.edges[k].source, i.graph.edges[k].target);
            let same = i.graph.node(s).parallelism == i.graph.node(t).parallelism;
            i.graph.edges[k].partitioner = if same {
                Partitioner::Forward
            } else {
                Partitioner::Rebalance
            };
        }
        drop(i);
        self
    }

    /// Prints every record as `subtask> record` (Flink's `print`).
    pub fn print(self) -> DataStream<()>
    where
        T: Printable,
    {
        self.transform("Print Sink", |ctx, next| {
            Box::new(Chained::new(PrintSink::new(&ctx.info), next))
        })
    }

    /// Collects every record exactly once (two-phase commit on checkpoints): the test sink.
    pub fn collect(self) -> CollectHandle<T>
    where
        T: Sync,
    {
        let handle = CollectHandle::new();
        let committer = handle.committer.clone();
        self.transform::<()>("Collect Sink", move |ctx, next| {
            Box::new(Chained::new(
                TwoPhaseCommitSink::new(ctx.operator_id, &ctx.info, committer.clone()),
                next,
            ))
        });
        handle
    }

    /// Writes records as lines into part files under `dir`, exactly once (Flink's `FileSink`,
    /// rolling on every checkpoint): records stream into a hidden in-progress file, and each
    /// checkpoint's part becomes `part-<subtask>-<checkpoint>` when the checkpoint completes.
    pub fn write_to_files(self, dir: impl Into<PathBuf>) -> DataStream<()>
    where
        T: Printable + Sync,
    {
        let dir = dir.into();
        self.transform("File Sink", move |ctx, next| {
            Box::new(Chained::new(
                FileSink::new(ctx.operator_id, ctx.info.index, dir.clone()),
                next,
            ))
        })
    }
}

impl<K, V> DataStream<(K, V)>
where
    K: Data + StateKey + Ord + Sync,
    V: Data + StateValue + Sync,
{
    /// Keeps the latest value per key (the first field) in keyed state and publishes the map at
    /// end of input: the final totals of a running aggregation. It keys the stream by the first
    /// field; on a stream already partitioned by it, `reinterpret_as_keyed(..).latest_per_key()`
    /// avoids the shuffle.
    pub fn latest_per_key(self) -> LatestHandle<K, V> {
        self.key_by(|t: &(K, V)| &t.0).latest_per_key()
    }
}

/// A stream partitioned by key (Flink's `KeyedStream`).
pub struct KeyedStream<K, T> {
    stream: DataStream<T>,
    key: KeyFn<T, K>,
    /// Declared keyed without a shuffle: the stream is already partitioned by this key.
    reinterpreted: bool,
}

impl<K: StateKey, T: Data> KeyedStream<K, T> {
    /// Records why the job, as built so far, cannot run: `execute` fails naming it.
    pub(crate) fn record_build_error(&self, problem: String) {
        self.stream
            .env
            .inner
            .borrow_mut()
            .build_errors
            .push(problem);
    }

    /// Adds a keyed operator, made per subtask by `factory`, after this stream (hash-partitioned
    /// by the key, or forward when the stream was declared keyed).
    pub(crate) fn keyed<U: Data>(
        self,
        name: &str,
        factory: impl Fn(
            &OperatorContext,
            KeyedBase<K>,
            KeyFn<T, K>,
            Box<dyn Output<U>>,
        ) -> Box<dyn Output<T>>
        + Send
        + Sync
        + 'static,
    ) -> DataStream<U> {
        let key = self.key.clone();
        let hash_key = self.key.clone();
        let from = self.stream.node;
        let env = self.stream.env.clone();
        let partitioner = if self.reinterpreted {
            Partitioner::Forward
        } else {
            Partitioner::Hash
        };
        let out = self
            .stream
            .partition_by(partitioner)
            .transform(name, move |ctx, next| {
                let base = KeyedBase::new(ctx.operator_id, ctx.info.clone());
                factory(ctx, base, key.clone(), next)
            });
        let key_hash: KeyHashFn<T> = Arc::new(move |t: &T| hash_key(t).key_hash());
        env.inner.borrow_mut().key_hashes.insert(
            (from, out.node),
            Arc::new(key_hash) as Arc<dyn Any + Send + Sync>,
        );
        out
    }

    /// A running reduce per key.
    pub fn reduce(self, f: impl Fn(&T, &T) -> T + Send + Sync + 'static) -> DataStream<T>
    where
        T: StateValue,
    {
        let f = Arc::new(f);
        self.keyed("Reduce", move |_, base, key, next| {
            let f = f.clone();
            Box::new(Chained::new(
                ReduceOperator::new(base, key, move |a: &T, b: &T| f(a, b)),
                next,
            ))
        })
    }

    /// Runs a keyed process function; `make` builds one instance per subtask.
    pub fn process<O: Data, P>(
        self,
        name: &str,
        make: impl Fn() -> P + Send + Sync + 'static,
    ) -> DataStream<O>
    where
        P: KeyedProcessFunction<K, T, O>,
    {
        self.keyed(name, move |_, base, key, next| {
            Box::new(Chained::new(
                ProcessOperator::<K, T, O, P>::new(base, key, make()),
                next,
            ))
        })
    }
}

impl<K, A, V> KeyedStream<K, (A, V)>
where
    K: StateKey + Ord + Sync,
    A: Data,
    V: Data + StateValue + Sync,
{
    /// Keeps the latest value (the second field) per key in keyed state and publishes the map at
    /// end of input.
    pub fn latest_per_key(self) -> LatestHandle<K, V> {
        let handle = LatestHandle::new();
        let h = handle.clone();
        self.stream
            .env
            .inner
            .borrow_mut()
            .results
            .push(Arc::new(handle.clone()));
        self.keyed::<()>("Latest-per-key Sink", move |_, base, key, next| {
            Box::new(Chained::new(
                LatestPerKeySink::new(base, key, h.clone()),
                next,
            ))
        });
        handle
    }
}

impl<K, A, N> KeyedStream<K, (A, N)>
where
    K: StateKey,
    A: Data,
    N: Data + StateValue + Copy + Default + Add<Output = N>,
{
    /// A running sum of the second field per key (Flink's `sum(1)` on a `Tuple2`).
    pub fn sum(self) -> DataStream<(A, N)> {
        self.keyed("Sum", |_, base, key, next| {
            Box::new(Chained::new(SumOperator::new(base, key), next))
        })
    }
}

impl<T: Data> DataStream<T> {
    fn partition_by(mut self, p: Partitioner) -> Self {
        self.partitioner = Some(p);
        self
    }
}
