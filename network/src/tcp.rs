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

use crate::{
    AnyElement, ChannelConfig, ChannelId, Delivery, ElementCodec, NetworkError, RawReceiver,
    RawSender, Transport,
};
use std::collections::{HashMap, HashSet, VecDeque};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock, Weak};
use std::task::{Context, Poll, Waker};
use std::time::Duration;
#[cfg(test)]
use std::time::Instant;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader, BufWriter};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;
use tokio::task::AbortHandle;
use weir_core::ids::{EdgeId, SubtaskIndex};

#[doc(hidden)]
pub mod fuzzing;

/// How long a consumer waits for a connection to a producer's transport.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// The largest frame, not counting its 4-byte length: an encoded element plus 25 bytes of
/// checksum, type and channel (and 8 of stamp for a priority element).
pub const MAX_FRAME: usize = 1 << 30;

const MAGIC: &[u8; 8] = b"WEIRNET2";
const ID_LEN: usize = 20;
const LEN_LEN: usize = 4;
const CRC_LEN: usize = 4;
/// The bytes `len` counts besides the payload: checksum, type, channel.
const FRAME_OVERHEAD: usize = CRC_LEN + 1 + ID_LEN;
const HEADER_LEN: usize = LEN_LEN + FRAME_OVERHEAD;
const STAMP_LEN: usize = 8;
const IO_BUFFER: usize = 64 * 1024;

const HELLO: u8 = 1;
const REQUEST: u8 = 2;
const CREDIT: u8 = 3;
const CANCEL: u8 = 4;
const DATA: u8 = 10;
const PRIORITY: u8 = 11;
const END: u8 = 12;
const ERROR: u8 = 13;

/// Tells a consumer's transport where the producer of a channel lives.
pub trait ChannelDirectory: Send + Sync {
    /// The address of the [`TcpTransport`] holding `id`'s producer end, if known.
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

/// The TCP transport of one process. See the [module docs](self).
///
/// Dropping it closes its listener and every connection, failing the channels on them.
pub struct TcpTransport {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for TcpTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TcpTransport")
            .field("local_addr", &self.inner.local_addr)
            .field("config", &self.inner.config)
            .finish_non_exhaustive()
    }
}

struct Inner {
    local_addr: SocketAddr,
    config: ChannelConfig,
    directory: Arc<dyn ChannelDirectory>,
    runtime: tokio::runtime::Handle,
    state: Mutex<State>,
    /// Bytes written to every connection, frames and handshakes included.
    bytes_sent: Arc<AtomicU64>,
}

#[derive(Default)]
struct State {
    accept_task: Option<AbortHandle>,
    /// Producer ends by channel, from either end's first appearance until `release_before`.
    outputs: HashMap<ChannelId, OutputSlot>,
    /// Consumer ends opened here, until `release_before`.
    inputs: HashSet<ChannelId>,
    /// Connections to producers' transports, by address.
    clients: HashMap<SocketAddr, Arc<Conn>>,
    /// Connections accepted from consumers' transports.
    servers: HashMap<u64, Arc<Conn>>,
    next_server: u64,
}

enum OutputSlot {
    /// The producer opened its end; no consumer requested it yet.
    Waiting(Arc<Mutex<Out>>),
    /// A consumer requested the channel before the producer opened it.
    Requested { conn: Arc<Conn>, credits: usize },
    /// The consumer requested it and went away before the producer opened it.
    Refused(NetworkError),
    /// Both ends met.
    Connected,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl TcpTransport {
    /// Listens on `addr` (port 0 picks a free port; see [`local_addr`](Self::local_addr)).
    /// Must be called within a tokio runtime, on which the transport runs its connections.
    pub fn bind(
        addr: SocketAddr,
        config: ChannelConfig,
        directory: Arc<dyn ChannelDirectory>,
    ) -> Result<TcpTransport, NetworkError> {
        let err = |reason: String| NetworkError::Listen { addr, reason };
        let runtime = tokio::runtime::Handle::try_current()
            .map_err(|e| err(format!("not within a tokio runtime: {e}")))?;
        let std_listener = std::net::TcpListener::bind(addr).map_err(|e| err(e.to_string()))?;
        std_listener
            .set_nonblocking(true)
            .map_err(|e| err(e.to_string()))?;
        let local_addr = std_listener.local_addr().map_err(|e| err(e.to_string()))?;
        let listener = {
            let _entered = runtime.enter();
            TcpListener::from_std(std_listener).map_err(|e| err(e.to_string()))?
        };
        let inner = Arc::new(Inner {
            local_addr,
            config: ChannelConfig {
                buffers_per_channel: config.buffers_per_channel.max(1),
            },
            directory,
            runtime: runtime.clone(),
            state: Mutex::new(State::default()),
            bytes_sent: Arc::default(),
        });
        let task = runtime.spawn(accept_loop(Arc::downgrade(&inner), listener));
        lock(&inner.state).accept_task = Some(task.abort_handle());
        Ok(TcpTransport { inner })
    }

    /// The address this transport listens on: what a [`ChannelDirectory`] must give for the
    /// producers in this process.
    pub fn local_addr(&self) -> SocketAddr {
        self.inner.local_addr
    }

    /// The bytes this transport has written to its connections so far: frames with their
    /// headers, credits and handshakes (what crosses the wire, before TCP/IP's own headers).
    pub fn bytes_sent(&self) -> u64 {
        self.inner.bytes_sent.load(Ordering::Relaxed)
    }

    /// The connections open now: to producers' transports and from consumers' transports.
    pub fn open_connections(&self) -> usize {
        let st = lock(&self.inner.state);
        st.clients.len() + st.servers.len()
    }
}

impl Drop for TcpTransport {
    fn drop(&mut self) {
        let (accept, conns, waiting) = {
            let mut guard = lock(&self.inner.state);
            let st = &mut *guard;
            let conns: Vec<_> = st
                .clients
                .drain()
                .map(|(_, c)| c)
                .chain(st.servers.drain().map(|(_, c)| c))
                .collect();
            let waiting: Vec<_> = st
                .outputs
                .drain()
                .filter_map(|(id, slot)| match slot {
                    OutputSlot::Waiting(out) => Some((id, out)),
                    _ => None,
                })
                .collect();
            (st.accept_task.take(), conns, waiting)
        };
        if let Some(task) = accept {
            task.abort();
        }
        for conn in conns {
            fail_conn(&conn, None, "its transport was shut down".into());
        }
        for (id, out) in waiting {
            fail_out(&out, NetworkError::Disconnected(id));
        }
    }
}

impl Transport for TcpTransport {
    fn open_output(
        &self,
        id: ChannelId,
        codec: ElementCodec,
    ) -> Result<Box<dyn RawSender>, NetworkError> {
        let out = Arc::new(Mutex::new(Out::new(
            id,
            self.inner.config.buffers_per_channel,
        )));
        let mut st = lock(&self.inner.state);
        match st.outputs.get_mut(&id) {
            None => {
                st.outputs.insert(id, OutputSlot::Waiting(out.clone()));
            }
            Some(OutputSlot::Waiting(_) | OutputSlot::Connected) => {
                return Err(NetworkError::AlreadyOpen(id));
            }
            Some(slot @ OutputSlot::Refused(_)) => {
                if let OutputSlot::Refused(e) = std::mem::replace(slot, OutputSlot::Connected) {
                    lock(&out).failure = Some(e);
                }
            }
            Some(slot @ OutputSlot::Requested { .. }) => {
                if let OutputSlot::Requested { conn, credits } =
                    std::mem::replace(slot, OutputSlot::Connected)
                {
                    // Under the state lock, so that a cancel from this connection finds it.
                    attach(&conn, &out, credits);
                }
            }
        }
        Ok(Box::new(TcpSender { id, codec, out }))
    }

    fn open_input(
        &self,
        id: ChannelId,
        codec: ElementCodec,
    ) -> Result<Box<dyn RawReceiver>, NetworkError> {
        let addr = self
            .inner
            .directory
            .producer_address(&id)
            .ok_or(NetworkError::UnknownProducer(id))?;
        let mut st = lock(&self.inner.state);
        if st.inputs.contains(&id) {
            return Err(NetworkError::AlreadyOpen(id));
        }
        let credits = self.inner.config.buffers_per_channel;
        let live = st
            .clients
            .get(&addr)
            .filter(|c| lock(&c.state).failed.is_none())
            .cloned();
        let conn = match live {
            Some(conn) => conn,
            None => {
                let conn = connect(&self.inner, addr);
                st.clients.insert(addr, conn.clone());
                conn
            }
        };
        let input = Arc::new(Mutex::new(In::new(id, conn.clone())));
        {
            let mut cs = lock(&conn.state);
            cs.ins.insert(id, input.clone());
            let credits = u32::try_from(credits).unwrap_or(u32::MAX);
            cs.control
                .push_back(Frame::new(REQUEST, id, credits.to_le_bytes().to_vec()));
        }
        conn.notify.notify_one();
        st.inputs.insert(id);
        Ok(Box::new(TcpReceiver { id, codec, input }))
    }

    fn release_before(&self, generation: u64) {
        let mut released = Vec::new();
        let mut unrequested = Vec::new();
        {
            let mut st = lock(&self.inner.state);
            st.outputs.retain(|id, slot| {
                if id.generation >= generation {
                    return true;
                }
                match slot {
                    OutputSlot::Waiting(out) => released.push((*id, out.clone())),
                    OutputSlot::Requested { conn, .. } => unrequested.push((*id, conn.clone())),
                    OutputSlot::Refused(_) | OutputSlot::Connected => {}
                }
                false
            });
            st.inputs.retain(|id| id.generation >= generation);
        }
        for (id, out) in released {
            fail_out(&out, NetworkError::Disconnected(id));
        }
        // A consumer waiting for a producer that will never open sees its channel end, as
        // with the in-process transport.
        for (id, conn) in unrequested {
            conn.push_control(Frame::new(END, id, Vec::new()));
        }
    }
}

/// A frame to write.
struct Frame {
    kind: u8,
    id: ChannelId,
    payload: Vec<u8>,
}

impl Frame {
    fn new(kind: u8, id: ChannelId, payload: Vec<u8>) -> Frame {
        Frame { kind, id, payload }
    }
}

fn encode_id(id: &ChannelId, out: &mut [u8]) {
    out[0..8].copy_from_slice(&id.generation.to_le_bytes());
    out[8..12].copy_from_slice(&id.edge.0.to_le_bytes());
    out[12..16].copy_from_slice(&id.producer.to_le_bytes());
    out[16..20].copy_from_slice(&id.consumer.to_le_bytes());
}

fn decode_id(b: &[u8; ID_LEN]) -> ChannelId {
    let u32_at = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
    let mut generation = [0u8; 8];
    generation.copy_from_slice(&b[0..8]);
    ChannelId {
        generation: u64::from_le_bytes(generation),
        edge: EdgeId(u32_at(8)),
        producer: u32_at(12),
        consumer: u32_at(16),
    }
}

/// The id of frames about no channel.
const NO_CHANNEL: ChannelId = ChannelId {
    generation: 0,
    edge: EdgeId(0),
    producer: 0,
    consumer: 0,
};

/// The checksum of a frame: its type and channel (`head`), then its payload.
fn checksum(head: &[u8], payload: &[u8]) -> u32 {
    let mut hasher = crc32fast::Hasher::new();
    hasher.update(head);
    hasher.update(payload);
    hasher.finalize()
}

/// The header of a frame carrying `payload`: length, checksum, type and channel.
fn frame_header(kind: u8, id: &ChannelId, payload: &[u8]) -> [u8; HEADER_LEN] {
    let mut header = [0u8; HEADER_LEN];
    // Callers keep payloads within MAX_FRAME, so this fits a u32.
    let len = (FRAME_OVERHEAD + payload.len()) as u32;
    header[..LEN_LEN].copy_from_slice(&len.to_le_bytes());
    let (crc, head) = header[LEN_LEN..].split_at_mut(CRC_LEN);
    head[0] = kind;
    encode_id(id, &mut head[1..]);
    crc.copy_from_slice(&checksum(head, payload).to_le_bytes());
    header
}

async fn write_frame<W: AsyncWrite + Unpin>(
    w: &mut W,
    kind: u8,
    id: &ChannelId,
    payload: &[u8],
) -> std::io::Result<()> {
    w.write_all(&frame_header(kind, id, payload)).await?;
    w.write_all(payload).await
}

/// Fills `buf` from inside a frame, where the end of the stream is an error.
async fn read_within_frame<R: AsyncRead + Unpin>(r: &mut R, buf: &mut [u8]) -> Result<(), String> {
    match r.read_exact(buf).await {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
            Err("the peer closed the connection mid-frame (a truncated frame)".into())
        }
        Err(e) => Err(format!("reading a frame: {e}")),
    }
}

/// The first step of reading a frame's payload.
const PAYLOAD_CHUNK: usize = 64 * 1024;

/// Reads one frame and verifies its checksum; `None` on a clean end of the stream between
/// frames.
async fn read_frame<R: AsyncRead + Unpin>(r: &mut R) -> Result<Option<Frame>, String> {
    let mut len = [0u8; LEN_LEN];
    // No byte at all is a clean end; a part of the length is a truncated frame.
    match r.read(&mut len[..1]).await {
        Ok(0) => return Ok(None),
        Ok(_) => read_within_frame(r, &mut len[1..]).await?,
        Err(e) => return Err(format!("reading a frame: {e}")),
    }
    let len = u32::from_le_bytes(len) as usize;
    if !(FRAME_OVERHEAD..=MAX_FRAME).contains(&len) {
        return Err(format!("protocol error: a frame of {len} bytes"));
    }
    let mut head = [0u8; FRAME_OVERHEAD];
    read_within_frame(r, &mut head).await?;
    // Grown as the bytes arrive (doubling from 64 KiB), so a length the peer never backs with
    // bytes allocates at most twice what it sent.
    let want = len - FRAME_OVERHEAD;
    let mut payload = Vec::with_capacity(want.min(PAYLOAD_CHUNK));
    while payload.len() < want {
        let start = payload.len();
        let step = (want - start).min(PAYLOAD_CHUNK.max(start));
        payload.resize(start + step, 0);
        read_within_frame(r, &mut payload[start..]).await?;
    }
    let (crc, head) = head.split_at(CRC_LEN);
    let expected = u32::from_le_bytes([crc[0], crc[1], crc[2], crc[3]]);
    let computed = checksum(head, &payload);
    if expected != computed {
        return Err(format!(
            "protocol error: a corrupt frame of {len} bytes: checksum {expected:#010x} expected, \
             {computed:#010x} computed"
        ));
    }
    let mut id = [0u8; ID_LEN];
    id.copy_from_slice(&head[1..]);
    Ok(Some(Frame {
        kind: head[0],
        id: decode_id(&id),
        payload,
    }))
}

/// One TCP connection and the channels multiplexed over it.
struct Conn {
    /// Wakes the connection's writer.
    notify: Notify,
    state: Mutex<ConnState>,
}

struct ConnState {
    /// The peer's transport address (a consumer's comes with its hello).
    peer: SocketAddr,
    failed: Option<String>,
    /// Frames that carry no element: bounded by the channels on the connection.
    control: VecDeque<Frame>,
    /// Producer ends with something to write, each listed at most once.
    dirty_outs: Vec<Arc<Mutex<Out>>>,
    /// Consumer ends with credits to return, each listed at most once.
    dirty_ins: Vec<Arc<Mutex<In>>>,
    /// Producer ends served over this connection.
    outs: HashMap<ChannelId, Arc<Mutex<Out>>>,
    /// Consumer ends fed by this connection.
    ins: HashMap<ChannelId, Arc<Mutex<In>>>,
    task: Option<AbortHandle>,
}

impl Conn {
    fn new(peer: SocketAddr) -> Conn {
        Conn {
            notify: Notify::new(),
            state: Mutex::new(ConnState {
                peer,
                failed: None,
                control: VecDeque::new(),
                dirty_outs: Vec::new(),
                dirty_ins: Vec::new(),
                outs: HashMap::new(),
                ins: HashMap::new(),
                task: None,
            }),
        }
    }

    fn push_control(&self, frame: Frame) {
        {
            let mut cs = lock(&self.state);
            if cs.failed.is_some() {
                return;
            }
            cs.control.push_back(frame);
        }
        self.notify.notify_one();
    }

    fn push_dirty_out(&self, out: Arc<Mutex<Out>>) {
        {
            let mut cs = lock(&self.state);
            if cs.failed.is_some() {
                return;
            }
            cs.dirty_outs.push(out);
        }
        self.notify.notify_one();
    }

    fn push_dirty_in(&self, input: Arc<Mutex<In>>) {
        {
            let mut cs = lock(&self.state);
            if cs.failed.is_some() {
                return;
            }
            cs.dirty_ins.push(input);
        }
        self.notify.notify_one();
    }

    fn out(&self, id: &ChannelId) -> Option<Arc<Mutex<Out>>> {
        lock(&self.state).outs.get(id).cloned()
    }

    fn input(&self, id: &ChannelId) -> Option<Arc<Mutex<In>>> {
        lock(&self.state).ins.get(id).cloned()
    }
}

/// Fails a connection: every channel on it gets a [`NetworkError::Connection`] naming the peer,
/// its task stops, and (given the transport) the transport forgets it.
fn fail_conn(conn: &Arc<Conn>, inner: Option<&Inner>, reason: String) {
    let (peer, outs, ins, task) = {
        let mut cs = lock(&conn.state);
        if cs.failed.is_some() {
            return;
        }
        cs.failed = Some(reason.clone());
        cs.control.clear();
        cs.dirty_outs.clear();
        cs.dirty_ins.clear();
        (
            cs.peer,
            std::mem::take(&mut cs.outs),
            std::mem::take(&mut cs.ins),
            cs.task.take(),
        )
    };
    let error = |channel| NetworkError::Connection {
        channel,
        peer,
        reason: reason.clone(),
    };
    for (id, out) in outs {
        fail_out(&out, error(id));
    }
    for (id, input) in ins {
        let waker = {
            let mut s = lock(&input);
            if s.failure.is_none() && !s.ended {
                s.failure = Some(error(id));
            }
            s.conn = None;
            s.waker.take()
        };
        if let Some(w) = waker {
            w.wake();
        }
    }
    if let Some(inner) = inner {
        let mut st = lock(&inner.state);
        st.clients.retain(|_, c| !Arc::ptr_eq(c, conn));
        st.servers.retain(|_, c| !Arc::ptr_eq(c, conn));
        for (id, slot) in st.outputs.iter_mut() {
            if let OutputSlot::Requested { conn: c, .. } = slot
                && Arc::ptr_eq(c, conn)
            {
                *slot = OutputSlot::Refused(error(*id));
            }
        }
    }
    conn.notify.notify_one();
    if let Some(task) = task {
        task.abort();
    }
}

fn fail_out(out: &Mutex<Out>, error: NetworkError) {
    let waker = {
        let mut o = lock(out);
        if o.failure.is_none() && !o.ended {
            o.failure = Some(error);
        }
        o.queue.clear();
        o.priority.clear();
        o.conn = None;
        o.waker.take()
    };
    if let Some(w) = waker {
        w.wake();
    }
}

/// Serves a consumer's request for `out` over `conn` with the consumer's `credits`.
fn attach(conn: &Arc<Conn>, out: &Arc<Mutex<Out>>, credits: usize) {
    let id = lock(out).id;
    let failed = {
        let mut cs = lock(&conn.state);
        match &cs.failed {
            Some(reason) => Some(NetworkError::Connection {
                channel: id,
                peer: cs.peer,
                reason: reason.clone(),
            }),
            None => {
                cs.outs.insert(id, out.clone());
                None
            }
        }
    };
    if let Some(e) = failed {
        fail_out(out, e);
        return;
    }
    let (waker, dirty) = {
        let mut o = lock(out);
        if o.failure.is_some() {
            return;
        }
        o.window = credits.max(1);
        o.conn = Some(conn.clone());
        let dirty = if !o.queue.is_empty() || !o.priority.is_empty() || o.closed {
            o.mark_dirty()
        } else {
            None
        };
        (o.waker.take(), dirty)
    };
    if let Some(conn) = dirty {
        conn.push_dirty_out(out.clone());
    }
    if let Some(w) = waker {
        w.wake();
    }
}

/// The producer's side of a channel.
struct Out {
    id: ChannelId,
    /// How many ordinary elements may be accepted and not yet read by the consumer's task.
    window: usize,
    /// Ordinary elements accepted and not yet read by the consumer's task.
    outstanding: usize,
    /// Ordinary elements accepted in all: the stamp of the next priority element.
    accepted: u64,
    /// Encoded ordinary elements not yet taken by the writer (at most `window`).
    queue: VecDeque<Vec<u8>>,
    /// Encoded priority elements (stamp first) not yet taken by the writer.
    priority: VecDeque<Vec<u8>>,
    /// The connection serving the consumer, once it requested the channel.
    conn: Option<Arc<Conn>>,
    /// Listed in the connection's `dirty_outs`.
    dirty: bool,
    /// The producer end was dropped.
    closed: bool,
    /// `END` was taken by the writer.
    ended: bool,
    failure: Option<NetworkError>,
    waker: Option<Waker>,
}

impl Out {
    fn new(id: ChannelId, window: usize) -> Out {
        Out {
            id,
            window,
            outstanding: 0,
            accepted: 0,
            queue: VecDeque::new(),
            priority: VecDeque::new(),
            conn: None,
            dirty: false,
            closed: false,
            ended: false,
            failure: None,
            waker: None,
        }
    }

    /// Marks this end as having something to write; the connection to list it in, if it is not
    /// listed yet.
    fn mark_dirty(&mut self) -> Option<Arc<Conn>> {
        if self.dirty {
            return None;
        }
        let conn = self.conn.clone()?;
        self.dirty = true;
        Some(conn)
    }
}

struct TcpSender {
    id: ChannelId,
    codec: ElementCodec,
    out: Arc<Mutex<Out>>,
}

impl TcpSender {
    fn encode(&self, element: &AnyElement, buf: &mut Vec<u8>) -> Result<(), NetworkError> {
        (self.codec.encode)(element, buf).map_err(|reason| NetworkError::Codec {
            channel: self.id,
            reason,
        })?;
        if buf.len() + FRAME_OVERHEAD > MAX_FRAME {
            return Err(NetworkError::Codec {
                channel: self.id,
                reason: format!(
                    "an element of {} bytes exceeds the frame limit of {MAX_FRAME} bytes",
                    buf.len()
                ),
            });
        }
        Ok(())
    }

    /// Queues an encoded element (ordinary or priority) and lists the end for the writer.
    fn enqueue(
        &self,
        element: AnyElement,
        priority: bool,
    ) -> Result<(), (AnyElement, NetworkError)> {
        // The only other writer of `accepted` and the credit use is this end, so checking
        // before encoding and pushing after cannot race with another send.
        let stamp = {
            let o = lock(&self.out);
            if let Some(e) = &o.failure {
                return Err((element, e.clone()));
            }
            if !priority && o.outstanding >= o.window {
                return Err((element, NetworkError::NoCredit(self.id)));
            }
            o.accepted
        };
        let mut buf = Vec::new();
        if priority {
            buf.extend_from_slice(&stamp.to_le_bytes());
        }
        if let Err(e) = self.encode(&element, &mut buf) {
            return Err((element, e));
        }
        let conn = {
            let mut o = lock(&self.out);
            if let Some(e) = &o.failure {
                return Err((element, e.clone()));
            }
            if priority {
                o.priority.push_back(buf);
            } else {
                o.outstanding += 1;
                o.accepted += 1;
                o.queue.push_back(buf);
            }
            o.mark_dirty()
        };
        if let Some(conn) = conn {
            conn.push_dirty_out(self.out.clone());
        }
        Ok(())
    }
}

impl RawSender for TcpSender {
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), NetworkError>> {
        let mut o = lock(&self.out);
        if let Some(e) = &o.failure {
            return Poll::Ready(Err(e.clone()));
        }
        if o.outstanding < o.window {
            return Poll::Ready(Ok(()));
        }
        match &o.waker {
            Some(w) if w.will_wake(cx.waker()) => {}
            _ => o.waker = Some(cx.waker().clone()),
        }
        Poll::Pending
    }

    fn start_send(&mut self, element: AnyElement) -> Result<(), (AnyElement, NetworkError)> {
        self.enqueue(element, false)
    }

    fn send_priority(&mut self, element: AnyElement) -> Result<(), (AnyElement, NetworkError)> {
        self.enqueue(element, true)
    }
}

impl Drop for TcpSender {
    fn drop(&mut self) {
        let conn = {
            let mut o = lock(&self.out);
            o.closed = true;
            o.waker = None;
            o.mark_dirty()
        };
        if let Some(conn) = conn {
            conn.push_dirty_out(self.out.clone());
        }
    }
}

/// The consumer's side of a channel.
struct In {
    id: ChannelId,
    conn: Option<Arc<Conn>>,
    /// Received ordinary elements not yet handed out (at most the producer's window).
    ordinary: VecDeque<Vec<u8>>,
    /// Received priority elements with their stamps, payloads still led by the stamp.
    priority: VecDeque<(u64, Vec<u8>)>,
    /// Ordinary elements received in all.
    received: u64,
    /// Ordinary elements handed to the task in all.
    handed: u64,
    /// Credits to return, once the writer takes them.
    credits: u32,
    /// Listed in the connection's `dirty_ins`.
    dirty: bool,
    /// `END` arrived.
    ended: bool,
    /// The consumer end was dropped.
    dropped: bool,
    failure: Option<NetworkError>,
    waker: Option<Waker>,
}

impl In {
    fn new(id: ChannelId, conn: Arc<Conn>) -> In {
        In {
            id,
            conn: Some(conn),
            ordinary: VecDeque::new(),
            priority: VecDeque::new(),
            received: 0,
            handed: 0,
            credits: 0,
            dirty: false,
            ended: false,
            dropped: false,
            failure: None,
            waker: None,
        }
    }

    fn register(&mut self, cx: &Context<'_>) {
        match &self.waker {
            Some(w) if w.will_wake(cx.waker()) => {}
            _ => self.waker = Some(cx.waker().clone()),
        }
    }
}

struct TcpReceiver {
    id: ChannelId,
    codec: ElementCodec,
    input: Arc<Mutex<In>>,
}

impl TcpReceiver {
    fn decode(&self, bytes: &[u8]) -> Result<AnyElement, NetworkError> {
        (self.codec.decode)(bytes).map_err(|reason| NetworkError::Codec {
            channel: self.id,
            reason,
        })
    }
}

impl RawReceiver for TcpReceiver {
    fn poll_recv(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Delivery<AnyElement>, NetworkError>>> {
        let mut s = lock(&self.input);
        // A priority element waits until every ordinary element sent before it is here (they
        // are on their way, needing no credit), so that what it overtook is ready to read; the
        // ordinary elements wait behind it.
        let complete = s.received >= s.priority.front().map_or(0, |p| p.0);
        if !complete && !s.ended && s.failure.is_none() {
            s.register(cx);
            return Poll::Pending;
        }
        if let Some((stamp, bytes)) = s.priority.pop_front() {
            let overtook = usize::try_from(stamp.saturating_sub(s.handed)).unwrap_or(usize::MAX);
            drop(s);
            return Poll::Ready(Some(self.decode(&bytes[STAMP_LEN..]).map(|element| {
                Delivery {
                    element,
                    overtook: Some(overtook),
                }
            })));
        }
        if let Some(bytes) = s.ordinary.pop_front() {
            s.handed += 1;
            let conn = if s.ended {
                None
            } else {
                s.credits = s.credits.saturating_add(1);
                if s.dirty {
                    None
                } else {
                    s.dirty = true;
                    s.conn.clone()
                }
            };
            drop(s);
            if let Some(conn) = conn {
                conn.push_dirty_in(self.input.clone());
            }
            return Poll::Ready(Some(self.decode(&bytes).map(Delivery::in_order)));
        }
        if let Some(e) = &s.failure {
            return Poll::Ready(Some(Err(e.clone())));
        }
        if s.ended {
            return Poll::Ready(None);
        }
        s.register(cx);
        Poll::Pending
    }
}

impl Drop for TcpReceiver {
    fn drop(&mut self) {
        let conn = {
            let mut s = lock(&self.input);
            s.dropped = true;
            s.ordinary.clear();
            s.priority.clear();
            s.waker = None;
            let conn = s.conn.take();
            if s.ended || s.failure.is_some() {
                None
            } else {
                conn
            }
        };
        if let Some(conn) = conn {
            {
                let mut cs = lock(&conn.state);
                cs.ins.remove(&self.id);
                if cs.failed.is_some() {
                    return;
                }
                cs.control
                    .push_back(Frame::new(CANCEL, self.id, Vec::new()));
            }
            conn.notify.notify_one();
        }
    }
}

/// Accepts consumers' connections while the transport lives.
async fn accept_loop(inner: Weak<Inner>, listener: TcpListener) {
    loop {
        let (stream, addr) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(_) => {
                // Out of descriptors or a connection reset before it was accepted: try again
                // shortly rather than spin.
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        let Some(strong) = inner.upgrade() else {
            return;
        };
        let conn = Arc::new(Conn::new(addr));
        {
            let mut st = lock(&strong.state);
            let key = st.next_server;
            st.next_server += 1;
            st.servers.insert(key, conn.clone());
        }
        let task = strong
            .runtime
            .spawn(server_conn(inner.clone(), conn.clone(), stream));
        lock(&conn.state).task = Some(task.abort_handle());
    }
}

/// Opens a connection to the producer transport at `addr`: a task connects and then serves it;
/// meanwhile frames queue up, the hello first.
fn connect(inner: &Arc<Inner>, addr: SocketAddr) -> Arc<Conn> {
    let conn = Arc::new(Conn::new(addr));
    lock(&conn.state).control.push_back(Frame::new(
        HELLO,
        NO_CHANNEL,
        hello_payload(inner.local_addr),
    ));
    let task = inner
        .runtime
        .spawn(client_conn(Arc::downgrade(inner), conn.clone(), addr));
    let mut cs = lock(&conn.state);
    if cs.failed.is_none() {
        cs.task = Some(task.abort_handle());
    }
    drop(cs);
    conn
}

async fn client_conn(inner: Weak<Inner>, conn: Arc<Conn>, addr: SocketAddr) {
    let stream = match tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(addr)).await {
        Ok(Ok(stream)) => stream,
        Ok(Err(e)) => {
            fail_conn(
                &conn,
                inner.upgrade().as_deref(),
                format!("cannot connect: {e}"),
            );
            return;
        }
        Err(_) => {
            fail_conn(
                &conn,
                inner.upgrade().as_deref(),
                format!("cannot connect within {CONNECT_TIMEOUT:?}"),
            );
            return;
        }
    };
    let _ = stream.set_nodelay(true);
    let (r, w) = stream.into_split();
    let w = Counted::new(w, &inner);
    let reason = tokio::select! {
        r = client_reader(&conn, r) => r,
        w = writer(&conn, w) => w,
    };
    fail_conn(&conn, inner.upgrade().as_deref(), reason);
}

async fn server_conn(inner: Weak<Inner>, conn: Arc<Conn>, stream: TcpStream) {
    let _ = stream.set_nodelay(true);
    let (r, w) = stream.into_split();
    let w = Counted::new(w, &inner);
    let reason = tokio::select! {
        r = server_reader(&inner, &conn, r) => r,
        w = writer(&conn, w) => w,
    };
    fail_conn(&conn, inner.upgrade().as_deref(), reason);
}

/// A connection's write half that counts the bytes it writes into its transport's total.
struct Counted<W> {
    inner: W,
    sent: Arc<AtomicU64>,
}

impl<W> Counted<W> {
    fn new(inner: W, transport: &Weak<Inner>) -> Counted<W> {
        let sent = transport
            .upgrade()
            .map(|t| t.bytes_sent.clone())
            .unwrap_or_default();
        Counted { inner, sent }
    }
}

impl<W: AsyncWrite + Unpin> AsyncWrite for Counted<W> {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let polled = std::pin::Pin::new(&mut self.inner).poll_write(cx, buf);
        if let Poll::Ready(Ok(n)) = &polled {
            self.sent.fetch_add(*n as u64, Ordering::Relaxed);
        }
        polled
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// Writes what the connection's channels have to send until the connection fails; returns why.
async fn writer<W: AsyncWrite + Unpin>(conn: &Conn, w: W) -> String {
    let mut w = BufWriter::with_capacity(IO_BUFFER, w);
    match write_loop(conn, &mut w).await {
        Ok(reason) => reason,
        Err(e) => format!("writing: {e}"),
    }
}

async fn write_loop<W: AsyncWrite + Unpin>(
    conn: &Conn,
    w: &mut BufWriter<W>,
) -> std::io::Result<String> {
    let mut frames: Vec<Frame> = Vec::new();
    loop {
        let (control, outs, ins) = {
            let mut cs = lock(&conn.state);
            if let Some(reason) = &cs.failed {
                return Ok(reason.clone());
            }
            (
                std::mem::take(&mut cs.control),
                std::mem::take(&mut cs.dirty_outs),
                std::mem::take(&mut cs.dirty_ins),
            )
        };
        if control.is_empty() && outs.is_empty() && ins.is_empty() {
            w.flush().await?;
            conn.notify.notified().await;
            continue;
        }
        for f in control {
            write_frame(w, f.kind, &f.id, &f.payload).await?;
        }
        for out in outs {
            let ended = {
                let mut o = lock(&out);
                o.dirty = false;
                if o.failure.is_some() || o.ended {
                    continue;
                }
                let id = o.id;
                // Priority elements first: they overtake what is still queued here.
                frames.extend(o.priority.drain(..).map(|p| Frame::new(PRIORITY, id, p)));
                frames.extend(o.queue.drain(..).map(|d| Frame::new(DATA, id, d)));
                if o.closed {
                    frames.push(Frame::new(END, id, Vec::new()));
                    o.ended = true;
                    o.conn = None;
                    Some(id)
                } else {
                    None
                }
            };
            for f in frames.drain(..) {
                write_frame(w, f.kind, &f.id, &f.payload).await?;
            }
            if let Some(id) = ended {
                lock(&conn.state).outs.remove(&id);
            }
        }
        for input in ins {
            let (id, credits) = {
                let mut s = lock(&input);
                s.dirty = false;
                let credits = std::mem::take(&mut s.credits);
                if s.dropped || s.ended || s.failure.is_some() {
                    continue;
                }
                (s.id, credits)
            };
            if credits > 0 {
                write_frame(w, CREDIT, &id, &credits.to_le_bytes()).await?;
            }
        }
    }
}

fn payload_u32(f: &Frame) -> Result<u32, String> {
    <[u8; 4]>::try_from(f.payload.as_slice())
        .map(u32::from_le_bytes)
        .map_err(|_| format!("protocol error: frame type {} of bad length", f.kind))
}

/// A consumer's hello: the magic, then its listen address.
fn hello_payload(addr: SocketAddr) -> Vec<u8> {
    let mut hello = MAGIC.to_vec();
    hello.extend_from_slice(addr.to_string().as_bytes());
    hello
}

/// The listen address a consumer's first frame, its hello, announces.
fn hello_address(hello: &Frame) -> Result<SocketAddr, String> {
    hello
        .payload
        .strip_prefix(MAGIC.as_slice())
        .filter(|_| hello.kind == HELLO)
        .and_then(|a| std::str::from_utf8(a).ok())
        .and_then(|a| a.parse::<SocketAddr>().ok())
        .ok_or_else(|| "protocol error: no hello from a Weir transport".to_string())
}

/// A frame a consumer may send after its hello, checked.
enum FromConsumer {
    Request(u32),
    Credit(u32),
    Cancel,
}

fn from_consumer(f: &Frame) -> Result<FromConsumer, String> {
    match f.kind {
        REQUEST => payload_u32(f).map(FromConsumer::Request),
        CREDIT => payload_u32(f).map(FromConsumer::Credit),
        CANCEL => Ok(FromConsumer::Cancel),
        other => Err(format!(
            "protocol error: frame type {other} from a consumer"
        )),
    }
}

/// A frame a producer may send, checked; a priority element with its stamp.
enum FromProducer {
    Data,
    Priority(u64),
    End,
    Error,
}

fn from_producer(f: &Frame) -> Result<FromProducer, String> {
    match f.kind {
        DATA => Ok(FromProducer::Data),
        PRIORITY => <[u8; STAMP_LEN]>::try_from(f.payload.get(..STAMP_LEN).unwrap_or(&[]))
            .map(|stamp| FromProducer::Priority(u64::from_le_bytes(stamp)))
            .map_err(|_| "protocol error: a priority frame without its stamp".to_string()),
        END => Ok(FromProducer::End),
        ERROR => Ok(FromProducer::Error),
        other => Err(format!(
            "protocol error: frame type {other} from a producer"
        )),
    }
}

/// Reads a consumer's frames until the connection fails; returns why.
async fn server_reader<R: AsyncRead + Unpin>(
    inner: &Weak<Inner>,
    conn: &Arc<Conn>,
    r: R,
) -> String {
    let mut r = BufReader::with_capacity(IO_BUFFER, r);
    match serve_frames(inner, conn, &mut r).await {
        Ok(()) => "the peer closed the connection".into(),
        Err(reason) => reason,
    }
}

async fn serve_frames<R: AsyncRead + Unpin>(
    inner: &Weak<Inner>,
    conn: &Arc<Conn>,
    r: &mut R,
) -> Result<(), String> {
    let Some(hello) = read_frame(r).await? else {
        return Ok(());
    };
    let peer = hello_address(&hello)?;
    {
        // A transport listening on every interface announces 0.0.0.0: name it by the address
        // it connected from, with the port it listens on.
        let mut cs = lock(&conn.state);
        cs.peer = if peer.ip().is_unspecified() {
            SocketAddr::new(cs.peer.ip(), peer.port())
        } else {
            peer
        };
    }
    while let Some(f) = read_frame(r).await? {
        let inner = inner
            .upgrade()
            .ok_or_else(|| "the transport was shut down".to_string())?;
        match from_consumer(&f)? {
            FromConsumer::Request(credits) => on_request(&inner, conn, f.id, credits as usize),
            FromConsumer::Credit(n) => {
                let n = n as usize;
                if let Some(out) = conn.out(&f.id) {
                    let waker = {
                        let mut o = lock(&out);
                        o.outstanding = o.outstanding.saturating_sub(n);
                        o.waker.take()
                    };
                    if let Some(w) = waker {
                        w.wake();
                    }
                }
            }
            FromConsumer::Cancel => on_cancel(&inner, conn, f.id),
        }
    }
    Ok(())
}

fn on_request(inner: &Inner, conn: &Arc<Conn>, id: ChannelId, credits: usize) {
    let mut st = lock(&inner.state);
    match st.outputs.get_mut(&id) {
        None => {
            st.outputs.insert(
                id,
                OutputSlot::Requested {
                    conn: conn.clone(),
                    credits,
                },
            );
        }
        Some(slot @ OutputSlot::Waiting(_)) => {
            if let OutputSlot::Waiting(out) = std::mem::replace(slot, OutputSlot::Connected) {
                drop(st);
                attach(conn, &out, credits);
            }
        }
        Some(_) => {
            drop(st);
            conn.push_control(Frame::new(
                ERROR,
                id,
                b"the channel was requested twice".to_vec(),
            ));
        }
    }
}

fn on_cancel(inner: &Inner, conn: &Arc<Conn>, id: ChannelId) {
    {
        let mut st = lock(&inner.state);
        if let Some(slot) = st.outputs.get_mut(&id)
            && matches!(slot, OutputSlot::Requested { conn: c, .. } if Arc::ptr_eq(c, conn))
        {
            *slot = OutputSlot::Refused(NetworkError::Disconnected(id));
            return;
        }
    }
    let out = lock(&conn.state).outs.remove(&id);
    if let Some(out) = out {
        fail_out(&out, NetworkError::Disconnected(id));
    }
}

/// Reads a producer's frames until the connection fails; returns why.
async fn client_reader<R: AsyncRead + Unpin>(conn: &Conn, r: R) -> String {
    let mut r = BufReader::with_capacity(IO_BUFFER, r);
    match receive_frames(conn, &mut r).await {
        Ok(()) => "the peer closed the connection".into(),
        Err(reason) => reason,
    }
}

async fn receive_frames<R: AsyncRead + Unpin>(conn: &Conn, r: &mut R) -> Result<(), String> {
    while let Some(f) = read_frame(r).await? {
        let waker = match from_producer(&f)? {
            kind @ (FromProducer::Data | FromProducer::Priority(_)) => {
                let Some(input) = conn.input(&f.id) else {
                    continue; // The consumer end was dropped; its cancel is on its way.
                };
                let mut s = lock(&input);
                if s.dropped {
                    continue;
                }
                match kind {
                    FromProducer::Priority(stamp) => s.priority.push_back((stamp, f.payload)),
                    _ => {
                        s.received += 1;
                        s.ordinary.push_back(f.payload);
                    }
                }
                s.waker.take()
            }
            kind @ (FromProducer::End | FromProducer::Error) => {
                let Some(input) = lock(&conn.state).ins.remove(&f.id) else {
                    continue;
                };
                let peer = lock(&conn.state).peer;
                let mut s = lock(&input);
                if matches!(kind, FromProducer::End) {
                    s.ended = true;
                } else if s.failure.is_none() {
                    s.failure = Some(NetworkError::Connection {
                        channel: f.id,
                        peer,
                        reason: format!(
                            "the producer's transport refused the channel: {}",
                            String::from_utf8_lossy(&f.payload)
                        ),
                    });
                }
                s.conn = None;
                s.waker.take()
            }
        };
        if let Some(w) = waker {
            w.wake();
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::channel::{open_input, open_output};
    use crate::conformance::{self, Split};
    use std::future::poll_fn;
    use std::sync::OnceLock;
    use weir_core::element::{CheckpointBarrier, CheckpointOptions, Event, StreamElement};
    use weir_core::ids::CheckpointId;

    const BOUND: Duration = Duration::from_secs(5);

    fn loopback() -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], 0))
    }

    fn config(credits: usize) -> ChannelConfig {
        ChannelConfig {
            buffers_per_channel: credits,
        }
    }

    /// A producer process and a consumer process.
    fn pair(credits: usize) -> Split<TcpTransport, TcpTransport> {
        let producer = TcpTransport::bind(
            loopback(),
            config(credits),
            Arc::new(StaticDirectory::new()),
        )
        .expect("bind the producer's transport");
        let consumer = TcpTransport::bind(
            loopback(),
            config(credits),
            Arc::new(StaticDirectory::everything_at(producer.local_addr())),
        )
        .expect("bind the consumer's transport");
        Split { producer, consumer }
    }

    fn id(generation: u64, producer: u32, consumer: u32) -> ChannelId {
        ChannelId {
            generation,
            edge: EdgeId(3),
            producer,
            consumer,
        }
    }

    fn barrier<T>(n: u64) -> StreamElement<T> {
        StreamElement::Event(Event::Barrier(CheckpointBarrier {
            id: CheckpointId(n),
            timestamp_ms: 0,
            options: CheckpointOptions::ALIGNED_CHECKPOINT.as_unaligned(),
        }))
    }

    #[tokio::test]
    async fn conforms_across_two_transports() {
        tokio::time::timeout(Duration::from_secs(20), conformance::run_all(pair))
            .await
            .expect("the suite must not hang");
    }

    #[tokio::test]
    async fn conforms_through_its_own_loopback() {
        // Both ends on one transport: the consumer connects to its own listener.
        let make = |credits| {
            let own = Arc::new(OnceLock::<SocketAddr>::new());
            let dir = own.clone();
            let t = TcpTransport::bind(
                loopback(),
                config(credits),
                Arc::new(move |_: &ChannelId| dir.get().copied()),
            )
            .expect("bind");
            own.set(t.local_addr()).expect("set once");
            t
        };
        tokio::time::timeout(Duration::from_secs(20), conformance::run_all(make))
            .await
            .expect("the suite must not hang");
    }

    #[tokio::test]
    async fn bind_outside_a_runtime_is_an_error() {
        let r = std::thread::spawn(|| {
            TcpTransport::bind(loopback(), config(1), Arc::new(StaticDirectory::new())).map(|_| ())
        })
        .join()
        .expect("no panic");
        assert!(matches!(r, Err(NetworkError::Listen { .. })), "{r:?}");
    }

    #[tokio::test]
    async fn an_unknown_producer_is_an_error() {
        let t = TcpTransport::bind(loopback(), config(1), Arc::new(StaticDirectory::new()))
            .expect("bind");
        assert!(matches!(
            open_input::<u8>(&t, id(1, 0, 0)),
            Err(NetworkError::UnknownProducer(_))
        ));
    }

    #[tokio::test]
    async fn a_consumer_may_request_before_the_producer_opens() {
        let t = pair(2);
        let mut rx = open_input::<u32>(&t, id(1, 0, 0)).expect("open input");
        tokio::time::sleep(Duration::from_millis(20)).await; // The request arrives first.
        let mut tx = open_output::<u32>(&t, id(1, 0, 0)).expect("open output");
        for i in 0..10 {
            tx.send(StreamElement::Batch(vec![i])).await.expect("send");
            assert_eq!(
                rx.recv().await.expect("element").expect("ok"),
                StreamElement::Batch(vec![i])
            );
        }
        drop(tx);
        assert!(rx.recv().await.is_none());
    }

    #[tokio::test]
    async fn releasing_a_requested_channel_ends_it_for_its_consumer() {
        let t = pair(2);
        let mut rx = open_input::<u32>(&t, id(1, 0, 0)).expect("open input");
        tokio::time::sleep(Duration::from_millis(20)).await;
        t.release_before(2);
        let r = tokio::time::timeout(BOUND, rx.recv())
            .await
            .expect("no hang");
        assert!(r.is_none(), "{r:?}");
    }

    #[tokio::test]
    async fn losing_the_producer_process_fails_the_consumer_naming_it() {
        let Split { producer, consumer } = pair(2);
        let producer_addr = producer.local_addr();
        let mut tx = open_output::<u32>(&producer, id(1, 0, 0)).expect("open output");
        let mut rx = open_input::<u32>(&consumer, id(1, 0, 0)).expect("open input");
        tx.send(StreamElement::Batch(vec![1])).await.expect("send");
        assert_eq!(
            rx.recv().await.expect("element").expect("ok"),
            StreamElement::Batch(vec![1])
        );
        drop(producer); // As if its process died: its connections close.
        let r = tokio::time::timeout(BOUND, rx.recv())
            .await
            .expect("the consumer must not hang");
        match r {
            Some(Err(e @ NetworkError::Connection { peer, .. })) => {
                assert_eq!(peer, producer_addr);
                assert!(e.to_string().contains(&producer_addr.to_string()), "{e}");
            }
            other => panic!("expected a connection error, got {other:?}"),
        }
        // The producer's own end fails too rather than waiting forever.
        let r = poll_fn(|cx| tx.poll_ready(cx)).await;
        assert!(r.is_err(), "{r:?}");
        assert_eq!(
            consumer.open_connections(),
            0,
            "the dead connection is forgotten"
        );
    }

    #[tokio::test]
    async fn losing_the_consumer_process_fails_the_producer_naming_it() {
        let Split { producer, consumer } = pair(2);
        let consumer_addr = consumer.local_addr();
        let mut tx = open_output::<u32>(&producer, id(1, 0, 0)).expect("open output");
        let mut rx = open_input::<u32>(&consumer, id(1, 0, 0)).expect("open input");
        tx.send(StreamElement::Batch(vec![1])).await.expect("send");
        rx.recv().await.expect("element").expect("ok");
        tx.send(StreamElement::Batch(vec![2])).await.expect("send");
        tx.send(StreamElement::Batch(vec![3])).await.expect("send");
        drop(consumer);
        let r: Result<(), NetworkError> = tokio::time::timeout(BOUND, async {
            loop {
                poll_fn(|cx| tx.poll_ready(cx)).await?;
                tx.start_send(StreamElement::Batch(vec![4]))?;
            }
        })
        .await
        .expect("the producer must not hang");
        match r {
            Err(e @ NetworkError::Connection { peer, .. }) => {
                assert_eq!(
                    peer, consumer_addr,
                    "the peer is named by its transport address"
                );
                assert!(e.to_string().contains(&consumer_addr.to_string()), "{e}");
            }
            other => panic!("expected a connection error, got {other:?}"),
        }
        // The consumer's end on the dead transport reads what it received, then fails.
        let r = loop {
            match rx.recv().await {
                Some(Ok(_)) => {}
                other => break other,
            }
        };
        assert!(matches!(r, Some(Err(_))), "{r:?}");
        tokio::time::timeout(BOUND, async {
            while producer.open_connections() > 0 {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        })
        .await
        .expect("the dead connection is forgotten");
    }

    #[tokio::test]
    async fn an_unreachable_producer_fails_the_consumer_naming_it() {
        let dead = std::net::TcpListener::bind(loopback()).expect("bind");
        let addr = dead.local_addr().expect("addr");
        drop(dead);
        let t = TcpTransport::bind(
            loopback(),
            config(2),
            Arc::new(StaticDirectory::everything_at(addr)),
        )
        .expect("bind");
        let mut rx = open_input::<u32>(&t, id(1, 0, 0)).expect("open input");
        let r = tokio::time::timeout(BOUND, rx.recv())
            .await
            .expect("no hang");
        assert!(
            matches!(&r, Some(Err(NetworkError::Connection { peer, .. })) if *peer == addr),
            "{r:?}"
        );
    }

    #[tokio::test]
    async fn a_peer_that_breaks_the_protocol_is_a_connection_error() {
        let liar = TcpListener::bind(loopback()).await.expect("bind");
        let addr = liar.local_addr().expect("addr");
        let server = tokio::spawn(async move {
            let (mut s, _) = liar.accept().await.expect("accept");
            // A frame of an absurd length.
            s.write_all(&[0xff; 64]).await.expect("write");
            tokio::time::sleep(BOUND).await;
        });
        let t = TcpTransport::bind(
            loopback(),
            config(2),
            Arc::new(StaticDirectory::everything_at(addr)),
        )
        .expect("bind");
        let mut rx = open_input::<u32>(&t, id(1, 0, 0)).expect("open input");
        let r = tokio::time::timeout(BOUND, rx.recv())
            .await
            .expect("no hang");
        match r {
            Some(Err(NetworkError::Connection { peer, reason, .. })) => {
                assert_eq!(peer, addr);
                assert!(reason.contains("protocol"), "{reason}");
            }
            other => panic!("expected a connection error, got {other:?}"),
        }
        server.abort();
    }

    /// A frame as a peer writes it.
    async fn frame(kind: u8, id: &ChannelId, payload: &[u8]) -> Vec<u8> {
        let mut bytes = Vec::new();
        write_frame(&mut bytes, kind, id, payload)
            .await
            .expect("write to memory");
        bytes
    }

    /// The encoding of `Batch(batch)` on a `u32` channel.
    fn batch_payload(batch: Vec<u32>) -> Vec<u8> {
        let element: AnyElement = Box::new(StreamElement::Batch(batch));
        let mut bytes = Vec::new();
        (ElementCodec::of::<u32>().encode)(&element, &mut bytes).expect("encode");
        bytes
    }

    /// A fake producer's transport: accepts one consumer's connection, checks its hello and its
    /// request for `id(1, 0, 0)`, writes `bytes`, closes its side of the connection if `close`,
    /// and reads until the consumer closes it.
    async fn fake_producer(
        bytes: Vec<u8>,
        close: bool,
    ) -> (SocketAddr, tokio::task::JoinHandle<()>) {
        let listener = TcpListener::bind(loopback()).await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let task = tokio::spawn(async move {
            let (s, _) = listener.accept().await.expect("accept");
            let (r, mut w) = s.into_split();
            let mut r = BufReader::new(r);
            let hello = read_frame(&mut r).await.expect("a hello").expect("a frame");
            assert_eq!(hello.kind, HELLO);
            let request = read_frame(&mut r)
                .await
                .expect("a request")
                .expect("a frame");
            assert_eq!((request.kind, request.id), (REQUEST, id(1, 0, 0)));
            w.write_all(&bytes).await.expect("write");
            if close {
                w.shutdown().await.expect("close");
            }
            // Until the consumer fails the connection and closes it.
            while let Ok(Some(_)) = read_frame(&mut r).await {}
        });
        (addr, task)
    }

    /// A consumer's transport reading `id(1, 0, 0)` from the producer at `addr`.
    fn consumer_of(addr: SocketAddr) -> TcpTransport {
        TcpTransport::bind(
            loopback(),
            config(2),
            Arc::new(StaticDirectory::everything_at(addr)),
        )
        .expect("bind")
    }

    #[tokio::test]
    async fn a_producer_that_closes_mid_frame_is_a_connection_error() {
        let good = frame(DATA, &id(1, 0, 0), &batch_payload(vec![7])).await;
        let promised = frame(DATA, &id(1, 0, 0), &batch_payload((0..100).collect())).await;
        // Cut inside the length, inside the header, inside the payload.
        for cut in [2, LEN_LEN + 10, HEADER_LEN + 10] {
            let mut bytes = good.clone();
            bytes.extend_from_slice(&promised[..cut]);
            let (addr, producer) = fake_producer(bytes, true).await;
            let t = consumer_of(addr);
            let mut rx = open_input::<u32>(&t, id(1, 0, 0)).expect("open input");
            tokio::time::timeout(BOUND, async {
                let first = rx.recv().await.expect("element").expect("ok");
                assert_eq!(first, StreamElement::Batch(vec![7]), "cut at {cut}");
                match rx.recv().await {
                    Some(Err(e @ NetworkError::Connection { peer, .. })) => {
                        assert_eq!(peer, addr, "cut at {cut}");
                        assert!(e.to_string().contains(&addr.to_string()), "{e}");
                        let NetworkError::Connection { reason, .. } = e else {
                            unreachable!()
                        };
                        assert!(reason.contains("mid-frame"), "cut at {cut}: {reason}");
                    }
                    other => panic!("cut at {cut}: expected a connection error, got {other:?}"),
                }
            })
            .await
            .expect("the consumer must not hang");
            tokio::time::timeout(BOUND, producer)
                .await
                .expect("the consumer closes the connection")
                .expect("the fake producer");
        }
    }

    #[tokio::test]
    async fn a_producer_that_sends_a_corrupt_frame_is_a_connection_error() {
        let mut bytes = frame(DATA, &id(1, 0, 0), &batch_payload(vec![7])).await;
        let mut corrupt = frame(DATA, &id(1, 0, 0), &batch_payload(vec![8])).await;
        // Flip a bit of the payload: still a well-formed element (8 becomes 9), but not the one
        // the checksum covers.
        let last = corrupt.len() - 1;
        corrupt[last] ^= 1;
        assert_eq!(
            (ElementCodec::of::<u32>().decode)(&corrupt[HEADER_LEN..])
                .expect("decodes")
                .downcast::<StreamElement<u32>>()
                .map(|e| *e)
                .expect("of its type"),
            StreamElement::Batch(vec![9])
        );
        let expected = u32::from_le_bytes(
            corrupt[LEN_LEN..LEN_LEN + CRC_LEN]
                .try_into()
                .expect("4 bytes"),
        );
        let computed = checksum(
            &corrupt[LEN_LEN + CRC_LEN..HEADER_LEN],
            &corrupt[HEADER_LEN..],
        );
        bytes.extend_from_slice(&corrupt);
        // The fake keeps the connection open: only the checksum can fail it.
        let (addr, producer) = fake_producer(bytes, false).await;
        let t = consumer_of(addr);
        let mut rx = open_input::<u32>(&t, id(1, 0, 0)).expect("open input");
        tokio::time::timeout(BOUND, async {
            let first = rx.recv().await.expect("element").expect("ok");
            assert_eq!(first, StreamElement::Batch(vec![7]));
            match rx.recv().await {
                Some(Err(NetworkError::Connection { peer, reason, .. })) => {
                    assert_eq!(peer, addr);
                    assert!(reason.contains("corrupt"), "{reason}");
                    assert!(
                        reason.contains(&format!("checksum {expected:#010x} expected"))
                            && reason.contains(&format!("{computed:#010x} computed")),
                        "{reason}"
                    );
                }
                other => panic!("expected a connection error, got {other:?}"),
            }
        })
        .await
        .expect("the consumer must not hang");
        tokio::time::timeout(BOUND, producer)
            .await
            .expect("the consumer closes the connection")
            .expect("the fake producer");
    }

    #[tokio::test]
    async fn a_consumer_that_sends_a_corrupt_frame_fails_the_producer_naming_it() {
        let t = TcpTransport::bind(loopback(), config(1), Arc::new(StaticDirectory::new()))
            .expect("bind");
        let mut tx = open_output::<u32>(&t, id(1, 0, 0)).expect("open output");
        // A fake consumer's transport, announcing the address it connects from as its own.
        let stream = TcpStream::connect(t.local_addr()).await.expect("connect");
        let consumer_addr = stream.local_addr().expect("addr");
        let (r, mut w) = stream.into_split();
        let mut r = BufReader::new(r);
        let mut hello = MAGIC.to_vec();
        hello.extend_from_slice(consumer_addr.to_string().as_bytes());
        w.write_all(&frame(HELLO, &NO_CHANNEL, &hello).await)
            .await
            .expect("write");
        w.write_all(&frame(REQUEST, &id(1, 0, 0), &1u32.to_le_bytes()).await)
            .await
            .expect("write");
        // The one credit goes to this element, which arrives intact.
        tx.send(StreamElement::Batch(vec![7])).await.expect("send");
        let data = tokio::time::timeout(BOUND, read_frame(&mut r))
            .await
            .expect("no hang")
            .expect("a frame with its checksum")
            .expect("a frame");
        assert_eq!((data.kind, data.id), (DATA, id(1, 0, 0)));
        assert_eq!(data.payload, batch_payload(vec![7]));
        // A credit of 1 with a flipped byte would grant 254.
        let mut credit = frame(CREDIT, &id(1, 0, 0), &1u32.to_le_bytes()).await;
        credit[HEADER_LEN] ^= 0xff;
        w.write_all(&credit).await.expect("write");
        let r = tokio::time::timeout(BOUND, poll_fn(|cx| tx.poll_ready(cx)))
            .await
            .expect("the producer must not hang");
        match r {
            Err(e @ NetworkError::Connection { peer, .. }) => {
                assert_eq!(peer, consumer_addr, "the peer is named by its hello");
                assert!(e.to_string().contains(&consumer_addr.to_string()), "{e}");
                let NetworkError::Connection { reason, .. } = e else {
                    unreachable!()
                };
                assert!(
                    reason.contains("corrupt") && reason.contains("checksum"),
                    "{reason}"
                );
            }
            other => panic!("expected a connection error, got {other:?}"),
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn many_channels_share_one_connection() {
        const CHANNELS: u32 = 64;
        const BATCHES: u64 = 100;
        let t = Arc::new(pair(2));
        let mut tasks = Vec::new();
        for c in 0..CHANNELS {
            let mut tx = open_output::<u64>(&t.producer, id(1, c, 0)).expect("open output");
            let mut rx = open_input::<u64>(&t.consumer, id(1, c, 0)).expect("open input");
            tasks.push(tokio::spawn(async move {
                for i in 0..BATCHES {
                    tx.send(StreamElement::Batch(vec![u64::from(c), i]))
                        .await
                        .expect("send");
                }
            }));
            tasks.push(tokio::spawn(async move {
                let mut next = 0;
                while let Some(e) = rx.recv().await {
                    assert_eq!(
                        e.expect("ok"),
                        StreamElement::Batch(vec![u64::from(c), next])
                    );
                    next += 1;
                }
                assert_eq!(next, BATCHES);
            }));
        }
        tokio::time::timeout(BOUND, async {
            for task in tasks {
                task.await.expect("task");
            }
        })
        .await
        .expect("no hang");
        assert_eq!(
            t.consumer.open_connections(),
            1,
            "one connection to the producer"
        );
        assert_eq!(
            t.producer.open_connections(),
            1,
            "one connection from the consumer"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn large_elements_cross_intact() {
        const MIB: usize = 1 << 20;
        let t = pair(2);
        let mut tx = open_output::<u8>(&t.producer, id(1, 0, 0)).expect("open output");
        let mut rx = open_input::<u8>(&t.consumer, id(1, 0, 0)).expect("open input");
        let batch = |i: usize| -> Vec<u8> { (0..MIB).map(|j| (i * 31 + j) as u8).collect() };
        let sender = tokio::spawn(async move {
            for i in 0..8 {
                tx.send(StreamElement::Batch(batch(i))).await.expect("send");
            }
        });
        // 8 MiB built, checked and compared in a debug build: seconds on a loaded 2-core
        // machine (it once took over 5 s under a parallel build), so a longer bound.
        tokio::time::timeout(BOUND * 6, async {
            for i in 0..8 {
                match rx.recv().await.expect("element").expect("ok") {
                    StreamElement::Batch(b) => assert!(b == batch(i), "batch {i} corrupted"),
                    other => panic!("unexpected {other:?}"),
                }
            }
            assert!(rx.recv().await.is_none());
        })
        .await
        .expect("no hang");
        sender.await.expect("sender");
    }

    /// Under real parallelism every priority element's count is exact, and what it overtook is
    /// ready to read the moment it is.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn priority_counts_are_exact_under_parallelism() {
        const BATCHES: u64 = 2000;
        let t = pair(3);
        let mut tx = open_output::<u64>(&t.producer, id(1, 0, 0)).expect("open output");
        let mut rx = open_input::<u64>(&t.consumer, id(1, 0, 0)).expect("open input");
        let sender = tokio::spawn(async move {
            for i in 0..BATCHES {
                if i % 13 == 5 {
                    tx.send_priority(barrier(i)).expect("priority");
                }
                tx.send(StreamElement::Batch(vec![i])).await.expect("send");
            }
        });
        let receiver = tokio::spawn(async move {
            let mut read = 0u64;
            let mut priorities = 0;
            let noop = futures::task::noop_waker();
            while let Some(d) = rx.recv_delivery().await {
                let d = d.expect("ok");
                match (d.element, d.overtook) {
                    (StreamElement::Batch(b), None) => {
                        assert_eq!(b, vec![read]);
                        read += 1;
                    }
                    (StreamElement::Event(Event::Barrier(b)), Some(k)) => {
                        assert_eq!(read + k as u64, b.id.0, "an inexact count");
                        priorities += 1;
                        for _ in 0..k {
                            let next = rx.poll_delivery(&mut Context::from_waker(&noop));
                            match next {
                                Poll::Ready(Some(Ok(Delivery {
                                    element: StreamElement::Batch(b),
                                    overtook: None,
                                }))) => {
                                    assert_eq!(b, vec![read]);
                                    read += 1;
                                }
                                other => panic!("an overtaken element is not ready: {other:?}"),
                            }
                        }
                    }
                    (e, k) => panic!("unexpected {e:?} {k:?}"),
                }
                if read.is_multiple_of(97) {
                    tokio::task::yield_now().await; // Let the queue fill now and then.
                }
            }
            assert_eq!(read, BATCHES);
            assert_eq!(priorities, (0..BATCHES).filter(|i| i % 13 == 5).count());
        });
        tokio::time::timeout(BOUND, async {
            sender.await.expect("sender");
            receiver.await.expect("receiver");
        })
        .await
        .expect("no hang");
    }

    /// Not a benchmark: shows the order of magnitude, asserts only that everything arrives.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn throughput_smoke() {
        const BATCHES: u64 = 10_000;
        const ROWS: u64 = 64;
        let t = pair(ChannelConfig::default().buffers_per_channel);
        let mut tx = open_output::<u64>(&t.producer, id(1, 0, 0)).expect("open output");
        let mut rx = open_input::<u64>(&t.consumer, id(1, 0, 0)).expect("open input");
        let start = Instant::now();
        let sender = tokio::spawn(async move {
            for i in 0..BATCHES {
                tx.send(StreamElement::Batch((i..i + ROWS).collect()))
                    .await
                    .expect("send");
            }
        });
        let mut n = 0u64;
        let mut sum = 0u64;
        tokio::time::timeout(BOUND, async {
            while let Some(e) = rx.recv().await {
                if let StreamElement::Batch(b) = e.expect("ok") {
                    n += 1;
                    sum = sum.wrapping_add(b[0]);
                }
            }
        })
        .await
        .expect("no hang");
        sender.await.expect("sender");
        assert_eq!(n, BATCHES);
        assert_eq!(sum, BATCHES * (BATCHES - 1) / 2);
        let secs = start.elapsed().as_secs_f64();
        eprintln!(
            "tcp transport: {BATCHES} batches of {ROWS} u64 in {secs:.3}s: {:.0} batches/s",
            BATCHES as f64 / secs
        );
    }
}
