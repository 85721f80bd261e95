//! Weir's data plane: moving record batches and events between subtasks.
//!
//! - [`Transport`]: the seam. It opens the two ends of a channel by [`ChannelId`]; the producer
//!   and the consumer may be in different processes (a TCP transport) or the same one.
//! - [`local`]: the in-process transport: owned batches handed over through bounded queues.
//! - [`tcp`]: the transport between processes: channels multiplexed over one TCP connection per
//!   pair of processes, with explicit credits; a [`tcp::ChannelDirectory`] says where producers
//!   live.
//! - [`channel`]: typed ends over the type-erased transport ends, and [`channel::ElementCodec`],
//!   which lets a transport that crosses processes serialize elements.
//! - `conformance` (feature `conformance`): the contract as a suite every transport must pass,
//!   one test per check through `transport_conformance!`.
//! - [`gate`]: the [`gate::InputGate`]: a consumer's channels, read fairly, each blockable (for
//!   barrier alignment).
//!
//! Priority elements (unaligned checkpoint barriers) skip the queue and need no credit; the
//! consumer learns how many queued elements each one overtook, so it can persist exactly those.
//!
//! Flow control is credit-based: a channel has `buffers_per_channel` credits; the producer waits
//! for one before each send ([`RawSender::poll_ready`]), so a slow consumer stalls its producers
//! instead of growing memory. There is no unbounded queue.
//!
//! Architecture invariant: this crate knows nothing of checkpoints, state or operators. A barrier
//! is just an [`weir_core::element::Event`] that travels in order with the batches.
#![warn(missing_docs)]

pub mod channel;
#[cfg(any(test, feature = "conformance"))]
pub mod conformance;
pub mod error;
pub mod gate;
pub mod local;
pub mod tcp;

pub use channel::{AnyElement, ElementCodec, Receiver, Sender};
pub use error::NetworkError;
pub use gate::GateItem;
pub use gate::InputGate;
pub use local::LocalTransport;
pub use tcp::{ChannelDirectory, StaticDirectory, TcpTransport};

use serde::{Serialize, de::DeserializeOwned};
use std::task::{Context, Poll};
use weir_core::ids::{EdgeId, SubtaskIndex};

/// A record type that can cross a channel: owned, sendable, and serializable for transports that
/// leave the process.
pub trait Data: Clone + Send + Serialize + DeserializeOwned + 'static {}
impl<T> Data for T where T: Clone + Send + Serialize + DeserializeOwned + 'static {}

/// Names one channel: one subpartition of a producer subtask, read by one consumer subtask.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ChannelId {
    /// The deployment generation: each (re)deployment of the job opens fresh channels.
    pub generation: u64,
    /// The JobGraph edge.
    pub edge: EdgeId,
    /// The producer subtask.
    pub producer: SubtaskIndex,
    /// The consumer subtask.
    pub consumer: SubtaskIndex,
}

/// Flow-control settings of a transport.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChannelConfig {
    /// Credits per channel: how many buffers (batches or events) may be queued before the
    /// producer must wait (Flink's `taskmanager.network.memory.buffers-per-channel`).
    pub buffers_per_channel: usize,
}

impl Default for ChannelConfig {
    fn default() -> Self {
        ChannelConfig {
            buffers_per_channel: 4,
        }
    }
}

/// An element as the consumer receives it. `overtook` is set for a priority element: the number
/// of ordinary (non-priority) elements that were queued in the channel, unread, when it was
/// sent. Those elements follow it, in their order, were sent before it, and are ready to be
/// read the moment it is (the transport already holds them).
#[derive(Debug, PartialEq)]
pub struct Delivery<E> {
    /// The element.
    pub element: E,
    /// For a priority element, how many queued elements it overtook; `None` for an element that
    /// kept its place.
    pub overtook: Option<usize>,
}

impl<E> Delivery<E> {
    /// An element that kept its place.
    pub fn in_order(element: E) -> Self {
        Delivery {
            element,
            overtook: None,
        }
    }
}

/// The producer's end of a channel, with the element type erased.
pub trait RawSender: Send {
    /// Ready when the channel has a credit. An error means the consumer is gone.
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), NetworkError>>;

    /// Sends one element using the credit [`poll_ready`](Self::poll_ready) reported. Without a
    /// credit the element is handed back in [`NetworkError::NoCredit`]-style fashion:
    /// `Err((element, error))`.
    fn start_send(&mut self, element: AnyElement) -> Result<(), (AnyElement, NetworkError)>;

    /// Sends a priority element (an unaligned checkpoint's barrier): it needs no credit, and it
    /// is delivered before every element still queued in the channel, which it reports as
    /// overtaken ([`Delivery::overtook`]). Priority elements keep their order among themselves.
    fn send_priority(&mut self, element: AnyElement) -> Result<(), (AnyElement, NetworkError)>;
}

/// The consumer's end of a channel, with the element type erased.
pub trait RawReceiver: Send {
    /// The next element in order; `Ready(None)` when the producer closed its end and everything
    /// it sent has been read.
    fn poll_recv(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Delivery<AnyElement>, NetworkError>>>;
}

/// Opens the ends of channels.
///
/// Contract:
/// - Each end of a [`ChannelId`] is opened exactly once; the order in which producer and consumer
///   open does not matter. Opening an end twice is [`NetworkError::AlreadyOpen`].
/// - Elements arrive in the order they were sent, each exactly once.
/// - A channel holds at most `buffers_per_channel` elements in flight, besides priority elements.
/// - A priority element ([`RawSender::send_priority`]) needs no credit and overtakes every
///   element still queued; its [`Delivery::overtook`] counts them exactly.
/// - When the producer's end is dropped, the consumer reads what was sent and then `None`;
///   when the consumer's end is dropped, the producer's `poll_ready` fails with
///   [`NetworkError::Disconnected`].
/// - News between the ends (an element, a priority element, a dropped end) arrives at once in
///   process, and after crossing the network otherwise: there a consumer may read an element
///   before a priority element sent after it has arrived (which then did not overtake it), and a
///   producer may send into a consumer end already dropped until it learns of it (those
///   elements are discarded).
/// - A transport between processes fails the ends of a lost connection with
///   [`NetworkError::Connection`], naming the peer; it never hangs on a dead peer.
pub trait Transport: Send + Sync + 'static {
    /// Opens the producer's end.
    fn open_output(
        &self,
        id: ChannelId,
        codec: ElementCodec,
    ) -> Result<Box<dyn RawSender>, NetworkError>;

    /// Opens the consumer's end.
    fn open_input(
        &self,
        id: ChannelId,
        codec: ElementCodec,
    ) -> Result<Box<dyn RawReceiver>, NetworkError>;

    /// Forgets every unclaimed end of generations below `generation` (after a failover).
    fn release_before(&self, generation: u64);
}
