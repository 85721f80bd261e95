//! The shared state of a transport, its connections and its channel ends, and how it fails:
//! the structures the transport, the connection tasks and the ends all lock.

use super::directory::ChannelDirectory;
use super::lock;
use super::wire::Frame;
use crate::{ChannelConfig, ChannelId, NetworkError};
use std::collections::{HashMap, HashSet, VecDeque};
use std::net::SocketAddr;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::task::{Context, Waker};
use tokio::sync::Notify;
use tokio::task::AbortHandle;

pub(super) struct Inner {
    pub(super) local_addr: SocketAddr,
    pub(super) config: ChannelConfig,
    pub(super) directory: Arc<dyn ChannelDirectory>,
    pub(super) runtime: tokio::runtime::Handle,
    pub(super) state: Mutex<State>,
    /// Bytes written to every connection, frames and handshakes included.
    pub(super) bytes_sent: Arc<AtomicU64>,
}

#[derive(Default)]
pub(super) struct State {
    pub(super) accept_task: Option<AbortHandle>,
    /// Producer ends by channel, from either end's first appearance until `release_before`.
    pub(super) outputs: HashMap<ChannelId, OutputSlot>,
    /// Consumer ends opened here, until `release_before`.
    pub(super) inputs: HashSet<ChannelId>,
    /// Connections to producers' transports, by address.
    pub(super) clients: HashMap<SocketAddr, Arc<Conn>>,
    /// Connections accepted from consumers' transports.
    pub(super) servers: HashMap<u64, Arc<Conn>>,
    pub(super) next_server: u64,
}

pub(super) enum OutputSlot {
    /// The producer opened its end; no consumer requested it yet.
    Waiting(Arc<Mutex<Out>>),
    /// A consumer requested the channel before the producer opened it.
    Requested { conn: Arc<Conn>, credits: usize },
    /// The consumer requested it and went away before the producer opened it.
    Refused(NetworkError),
    /// Both ends met.
    Connected,
}

/// One TCP connection and the channels multiplexed over it.
pub(super) struct Conn {
    /// Wakes the connection's writer.
    pub(super) notify: Notify,
    pub(super) state: Mutex<ConnState>,
}

pub(super) struct ConnState {
    /// The peer's transport address (a consumer's comes with its hello).
    pub(super) peer: SocketAddr,
    pub(super) failed: Option<String>,
    /// Frames that carry no element: bounded by the channels on the connection.
    pub(super) control: VecDeque<Frame>,
    /// Producer ends with something to write, each listed at most once.
    pub(super) dirty_outs: Vec<Arc<Mutex<Out>>>,
    /// Consumer ends with credits to return, each listed at most once.
    pub(super) dirty_ins: Vec<Arc<Mutex<In>>>,
    /// Producer ends served over this connection.
    pub(super) outs: HashMap<ChannelId, Arc<Mutex<Out>>>,
    /// Consumer ends fed by this connection.
    pub(super) ins: HashMap<ChannelId, Arc<Mutex<In>>>,
    pub(super) task: Option<AbortHandle>,
}

impl Conn {
    pub(super) fn new(peer: SocketAddr) -> Conn {
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

    pub(super) fn push_control(&self, frame: Frame) {
        {
            let mut cs = lock(&self.state);
            if cs.failed.is_some() {
                return;
            }
            cs.control.push_back(frame);
        }
        self.notify.notify_one();
    }

    pub(super) fn push_dirty_out(&self, out: Arc<Mutex<Out>>) {
        {
            let mut cs = lock(&self.state);
            if cs.failed.is_some() {
                return;
            }
            cs.dirty_outs.push(out);
        }
        self.notify.notify_one();
    }

    pub(super) fn push_dirty_in(&self, input: Arc<Mutex<In>>) {
        {
            let mut cs = lock(&self.state);
            if cs.failed.is_some() {
                return;
            }
            cs.dirty_ins.push(input);
        }
        self.notify.notify_one();
    }

    pub(super) fn out(&self, id: &ChannelId) -> Option<Arc<Mutex<Out>>> {
        lock(&self.state).outs.get(id).cloned()
    }

    pub(super) fn input(&self, id: &ChannelId) -> Option<Arc<Mutex<In>>> {
        lock(&self.state).ins.get(id).cloned()
    }
}

/// Fails a connection: every channel on it gets a [`NetworkError::Connection`] naming the peer,
/// its task stops, and (given the transport) the transport forgets it.
pub(super) fn fail_conn(conn: &Arc<Conn>, inner: Option<&Inner>, reason: String) {
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

pub(super) fn fail_out(out: &Mutex<Out>, error: NetworkError) {
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
pub(super) fn attach(conn: &Arc<Conn>, out: &Arc<Mutex<Out>>, credits: usize) {
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
pub(super) struct Out {
    pub(super) id: ChannelId,
    /// How many ordinary elements may be accepted and not yet read by the consumer's task.
    pub(super) window: usize,
    /// Ordinary elements accepted and not yet read by the consumer's task.
    pub(super) outstanding: usize,
    /// Ordinary elements accepted in all: the stamp of the next priority element.
    pub(super) accepted: u64,
    /// Encoded ordinary elements not yet taken by the writer (at most `window`).
    pub(super) queue: VecDeque<Vec<u8>>,
    /// Encoded priority elements (stamp first) not yet taken by the writer.
    pub(super) priority: VecDeque<Vec<u8>>,
    /// The connection serving the consumer, once it requested the channel.
    pub(super) conn: Option<Arc<Conn>>,
    /// Listed in the connection's `dirty_outs`.
    pub(super) dirty: bool,
    /// The producer end was dropped.
    pub(super) closed: bool,
    /// `END` was taken by the writer.
    pub(super) ended: bool,
    pub(super) failure: Option<NetworkError>,
    pub(super) waker: Option<Waker>,
}

impl Out {
    pub(super) fn new(id: ChannelId, window: usize) -> Out {
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
    pub(super) fn mark_dirty(&mut self) -> Option<Arc<Conn>> {
        if self.dirty {
            return None;
        }
        let conn = self.conn.clone()?;
        self.dirty = true;
        Some(conn)
    }
}

/// The consumer's side of a channel.
pub(super) struct In {
    pub(super) id: ChannelId,
    pub(super) conn: Option<Arc<Conn>>,
    /// Received ordinary elements not yet handed out (at most the producer's window).
    pub(super) ordinary: VecDeque<Vec<u8>>,
    /// Received priority elements with their stamps, payloads still led by the stamp.
    pub(super) priority: VecDeque<(u64, Vec<u8>)>,
    /// Ordinary elements received in all.
    pub(super) received: u64,
    /// Ordinary elements handed to the task in all.
    pub(super) handed: u64,
    /// Credits to return, once the writer takes them.
    pub(super) credits: u32,
    /// Listed in the connection's `dirty_ins`.
    pub(super) dirty: bool,
    /// `END` arrived.
    pub(super) ended: bool,
    /// The consumer end was dropped.
    pub(super) dropped: bool,
    pub(super) failure: Option<NetworkError>,
    pub(super) waker: Option<Waker>,
}

impl In {
    pub(super) fn new(id: ChannelId, conn: Arc<Conn>) -> In {
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

    pub(super) fn register(&mut self, cx: &Context<'_>) {
        match &self.waker {
            Some(w) if w.will_wake(cx.waker()) => {}
            _ => self.waker = Some(cx.waker().clone()),
        }
    }
}
