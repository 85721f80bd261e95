//! Where producers live: the [`ChannelDirectory`] seam and the hand-filled [`StaticDirectory`].

use crate::ChannelId;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::RwLock;
use weir_core::ids::{EdgeId, SubtaskIndex};

/// Tells a consumer's transport where the producer of a channel lives.
pub trait ChannelDirectory: Send + Sync {
    /// The address of the [`TcpTransport`] holding `id`'s producer end, if known.
    ///
    /// [`TcpTransport`]: super::TcpTransport
    fn producer_address(&self, id: &ChannelId) -> Option<SocketAddr>;
}

impl<F> ChannelDirectory for F
where
    F: Fn(&ChannelId) -> Option<SocketAddr> + Send + Sync,
{
    fn producer_address(&self, id: &ChannelId) -> Option<SocketAddr> {
        self(id)
    }
}

/// A [`ChannelDirectory`] filled by hand: the address of each producer subtask of each edge and
/// generation, with an optional fallback for the rest.
#[derive(Debug, Default)]
pub struct StaticDirectory {
    fallback: Option<SocketAddr>,
    producers: RwLock<HashMap<(u64, EdgeId, SubtaskIndex), SocketAddr>>,
}

impl StaticDirectory {
    /// An empty directory.
    pub fn new() -> Self {
        StaticDirectory::default()
    }

    /// A directory that places every producer at `addr` (one producer process).
    pub fn everything_at(addr: SocketAddr) -> Self {
        StaticDirectory {
            fallback: Some(addr),
            producers: RwLock::default(),
        }
    }

    /// Places producer subtask `producer` of `edge` in `generation` at `addr`.
    pub fn insert(&self, generation: u64, edge: EdgeId, producer: SubtaskIndex, addr: SocketAddr) {
        self.producers
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert((generation, edge, producer), addr);
    }

    /// Forgets the producers of generations below `generation`.
    pub fn release_before(&self, generation: u64) {
        self.producers
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|k, _| k.0 >= generation);
    }
}

impl ChannelDirectory for StaticDirectory {
    fn producer_address(&self, id: &ChannelId) -> Option<SocketAddr> {
        self.producers
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(&(id.generation, id.edge, id.producer))
            .copied()
            .or(self.fallback)
    }
}
