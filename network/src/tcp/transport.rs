//! [`TcpTransport`]: binding, the producer and consumer ends it opens, release and shutdown.

use super::conn::{accept_loop, connect};
use super::directory::ChannelDirectory;
use super::ends::{TcpReceiver, TcpSender};
use super::lock;
use super::state::{In, Inner, Out, OutputSlot, State, attach, fail_conn, fail_out};
use super::wire::{END, Frame, REQUEST};
use crate::{
    ChannelConfig, ChannelId, ElementCodec, NetworkError, RawReceiver, RawSender, Transport,
};
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use tokio::net::TcpListener;

/// The TCP transport of one process. See the [module docs](super).
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
