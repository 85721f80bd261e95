//! The TCP transport: channels between processes (task managers).
//!
//! Each process has one [`TcpTransport`], listening on one address. A producer's end stays in
//! its process; the consumer's process connects to the producer's transport (its address comes
//! from a [`ChannelDirectory`]) and requests the channel, as Flink's partition request does.
//!
//! # Connections
//!
//! One TCP connection per ordered pair of processes: a consumer transport opens one connection to
//! each producer address it reads from and multiplexes every channel over it (two processes that
//! each read from the other have two connections, one each way). The connection is opened by the
//! first `open_input` for that address and kept until it fails or the transport is dropped.
//!
//! # Frames
//!
//! Everything on a connection, both ways, is a frame: a 29-byte header, then the payload. All
//! integers are little-endian.
//!
//! | bytes  | field   |                                                                       |
//! |--------|---------|-----------------------------------------------------------------------|
//! | 0..4   | `len`   | `u32`: the bytes after this field, `25 + payload length`              |
//! | 4..8   | `crc`   | `u32`: CRC-32 (IEEE, as zlib's) of bytes `8..4 + len`                 |
//! | 8      | `type`  | `u8`: the frame type, below                                           |
//! | 9..29  | channel | the [`ChannelId`]: generation `u64`, edge, producer, consumer `u32`   |
//! | 29..   | payload | `len - 25` bytes, by type                                             |
//!
//! The checksum covers the type, the channel and the payload; `len` is checked on its own. A
//! reader refuses, failing the connection: a `len` below 25 or above [`MAX_FRAME`] (before
//! reading or allocating anything more), a stream that ends inside a frame (only an end between
//! frames is a clean close), a checksum that does not match (a corrupt frame), a consumer whose
//! first frame is not a `HELLO` with the magic, a type the other side does not send, a `REQUEST`
//! or `CREDIT` payload that is not 4 bytes, and a `PRIORITY` payload shorter than its stamp.
//!
//! Consumer to producer: `HELLO` (a magic and the consumer's own listen address, which names it
//! in errors), `REQUEST` (with the consumer's credits, a `u32`), `CREDIT` (a `u32`), `CANCEL`
//! (the consumer end was dropped). Producer to consumer: `DATA` (an element, encoded with the
//! channel's [`ElementCodec`]), `PRIORITY` (a `u64` stamp, then the element), `END` (the producer
//! end was dropped and everything before was sent), `ERROR` (a reason, UTF-8).
//!
//! # Flow control
//!
//! Credit-based, per channel. The producer may hold at most `window` ordinary elements that the
//! consumer's task has not yet read; [`RawSender::poll_ready`] is pending when it holds that many.
//! Until the consumer's request arrives, `window` is the producer transport's
//! `buffers_per_channel` (the producer may run ahead into its own buffers, like a Flink
//! subpartition); the request announces the consumer's `buffers_per_channel`, which becomes the
//! window. The consumer returns one credit each time it hands an ordinary element to its task.
//! Every accepted element is covered by the window, so the producer writes it as soon as the
//! channel is connected. The consumer's connection reader never waits on a task: it files each
//! frame into its channel's buffer, which the window bounds.
//!
//! Bounded buffers, per channel: the producer's send queue and the consumer's unread queue hold
//! at most `max(producer's, consumer's buffers_per_channel)` ordinary elements. Control frames
//! are bounded by the number of channels (at most one request, one cancel, one end and one pending
//! credit entry each). Priority elements need no credit, so the caller bounds them, as for every
//! transport: an unaligned checkpoint sends one per channel.
//!
//! # Priority elements
//!
//! The producer stamps a priority element with the number of ordinary elements it accepted
//! before it, and writes it ahead of the ordinary elements still in its send queue. The consumer
//! files it ahead of the ordinary elements it holds unread and delivers it once it holds every
//! ordinary element sent before it (those still queued at the producer are written right after
//! it without needing a credit, so this wait is short and cannot deadlock): then
//! `overtook = stamp - ordinary elements already handed to the task`, exactly the elements sent
//! before it and unread, all of which are ready to be read the moment it is.
//!
//! # Failures
//!
//! A connection that fails (the peer died, closed it, sent a truncated or corrupt frame or other
//! garbage, or could not be reached within [`CONNECT_TIMEOUT`]) fails every channel on it at both
//! ends with [`NetworkError::Connection`], naming the peer's transport address. Dropping a
//! [`TcpTransport`] closes all its connections at once, as the death of its process would.
//! A consumer reads the elements it already received before it sees the error.
//!
//! The transport spawns its tasks on the tokio runtime it was bound in (which needs its I/O and
//! time drivers enabled).
//!
//! [`ChannelId`]: crate::ChannelId
//! [`ElementCodec`]: crate::ElementCodec
//! [`NetworkError::Connection`]: crate::NetworkError::Connection
//! [`RawSender::poll_ready`]: crate::RawSender::poll_ready

mod conn;
mod directory;
mod ends;
#[doc(hidden)]
pub mod fuzzing;
mod state;
#[cfg(test)]
mod tests;
mod transport;
mod wire;

pub use directory::{ChannelDirectory, StaticDirectory};
pub use transport::TcpTransport;

use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

/// How long a consumer waits for a connection to a producer's transport.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// The largest frame, not counting its 4-byte length: an encoded element plus 25 bytes of
/// checksum, type and channel (and 8 of stamp for a priority element).
pub const MAX_FRAME: usize = 1 << 30;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}
