//! A task manager's data transport: channels whose two ends run in this process go through the
//! in-process transport (owned batches, no serialization); the others through the TCP transport,
//! one connection per pair of task managers. Where each subtask runs comes from the deployment.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, RwLock};
use weir_core::graph::JobGraph;
use weir_core::ids::{EdgeId, SubtaskIndex, VertexId};
use weir_network::channel::ElementCodec;
use weir_network::tcp::ChannelDirectory;
use weir_network::{
    ChannelConfig, ChannelId, LocalTransport, NetworkError, RawReceiver, RawSender, TcpTransport,
    Transport,
};

/// Where each subtask of each generation runs: the data address of its task manager.
pub(crate) struct Placement {
    /// Each edge's producer and consumer vertices.
    edges: HashMap<EdgeId, (VertexId, VertexId)>,
    at: RwLock<HashMap<(u64, VertexId, SubtaskIndex), SocketAddr>>,
}

impl Placement {
    pub fn new(job: &JobGraph) -> Placement {
        Placement {
            edges: job
                .edges
                .iter()
                .map(|e| (e.id, (e.source, e.target)))
                .collect(),
            at: RwLock::default(),
        }
    }

    /// Records where the subtasks of `generation` run.
    pub fn insert(&self, generation: u64, placement: &[(VertexId, SubtaskIndex, SocketAddr)]) {
        let mut at = self.at.write().unwrap_or_else(|p| p.into_inner());
        for (v, i, addr) in placement {
            at.insert((generation, *v, *i), *addr);
        }
    }

    fn of(&self, generation: u64, vertex: VertexId, subtask: SubtaskIndex) -> Option<SocketAddr> {
        self.at
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(&(generation, vertex, subtask))
            .copied()
    }

    fn producer(&self, id: &ChannelId) -> Option<SocketAddr> {
        let (from, _) = self.edges.get(&id.edge)?;
        self.of(id.generation, *from, id.producer)
    }

    fn consumer(&self, id: &ChannelId) -> Option<SocketAddr> {
        let (_, to) = self.edges.get(&id.edge)?;
        self.of(id.generation, *to, id.consumer)
    }

    fn release_before(&self, generation: u64) {
        self.at
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|k, _| k.0 >= generation);
    }
}

impl ChannelDirectory for Placement {
    fn producer_address(&self, id: &ChannelId) -> Option<SocketAddr> {
        self.producer(id)
    }
}

/// In process when both ends are here, over TCP otherwise.
pub(crate) struct ClusterTransport {
    local: LocalTransport,
    tcp: TcpTransport,
    placement: Arc<Placement>,
}

impl ClusterTransport {
    /// Listens on `addr` for the channels other task managers read from this one.
    pub fn bind(
        addr: SocketAddr,
        config: ChannelConfig,
        placement: Arc<Placement>,
    ) -> Result<ClusterTransport, NetworkError> {
        Ok(ClusterTransport {
            local: LocalTransport::new(config),
            tcp: TcpTransport::bind(addr, config, placement.clone())?,
            placement,
        })
    }

    /// The data address other task managers connect to.
    pub fn local_addr(&self) -> SocketAddr {
        self.tcp.local_addr()
    }

    /// Bytes sent to other task managers so far.
    pub fn bytes_sent(&self) -> u64 {
        self.tcp.bytes_sent()
    }

    /// Records where the subtasks of `generation` run, before any of them opens a channel.
    pub fn place(&self, generation: u64, placement: &[(VertexId, SubtaskIndex, SocketAddr)]) {
        self.placement.insert(generation, placement);
    }

    fn is_here(&self, addr: Option<SocketAddr>) -> bool {
        addr == Some(self.tcp.local_addr())
    }
}

impl Transport for ClusterTransport {
    fn open_output(
        &self,
        id: ChannelId,
        codec: ElementCodec,
    ) -> Result<Box<dyn RawSender>, NetworkError> {
        if self.is_here(self.placement.consumer(&id)) {
            self.local.open_output(id, codec)
        } else {
            self.tcp.open_output(id, codec)
        }
    }

    fn open_input(
        &self,
        id: ChannelId,
        codec: ElementCodec,
    ) -> Result<Box<dyn RawReceiver>, NetworkError> {
        if self.is_here(self.placement.producer(&id)) {
            self.local.open_input(id, codec)
        } else {
            self.tcp.open_input(id, codec)
        }
    }

    fn release_before(&self, generation: u64) {
        self.local.release_before(generation);
        self.tcp.release_before(generation);
        self.placement.release_before(generation);
    }
}
