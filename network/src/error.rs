//! The errors of `weir-network`.

use crate::ChannelId;
use std::net::SocketAddr;
use thiserror::Error;

/// A channel error.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum NetworkError {
    /// The other end is gone.
    #[error("channel {0:?} disconnected: the other end was dropped")]
    Disconnected(ChannelId),
    /// A send without a credit.
    #[error("channel {0:?} has no credit: wait for poll_ready first")]
    NoCredit(ChannelId),
    /// An end was opened twice.
    #[error("channel {0:?}: this end is already open")]
    AlreadyOpen(ChannelId),
    /// An element of another type arrived.
    #[error("channel {0:?} carried an element of an unexpected type")]
    TypeMismatch(ChannelId),
    /// An element could not be encoded or decoded.
    #[error("channel {channel:?}: {reason}")]
    Codec {
        /// The channel.
        channel: ChannelId,
        /// Why.
        reason: String,
    },
    /// The connection to the process holding the other end failed (it died, closed the
    /// connection, could not be reached, or broke the protocol).
    #[error("channel {channel:?}: connection to peer {peer} failed: {reason}")]
    Connection {
        /// The channel.
        channel: ChannelId,
        /// The peer's transport address.
        peer: SocketAddr,
        /// Why.
        reason: String,
    },
    /// No address is known for the producer of a channel.
    #[error("channel {0:?}: no address is known for its producer")]
    UnknownProducer(ChannelId),
    /// A transport could not listen.
    #[error("cannot listen on {addr}: {reason}")]
    Listen {
        /// The address asked for.
        addr: SocketAddr,
        /// Why.
        reason: String,
    },
}
