//! The connection tasks: accepting consumers' connections, connecting to producers', and each
//! connection's writer and readers.

use super::state::{Conn, Inner, OutputSlot, attach, fail_conn, fail_out};
use super::wire::{
    CREDIT, DATA, END, ERROR, Frame, FromConsumer, FromProducer, HELLO, NO_CHANNEL, PRIORITY,
    from_consumer, from_producer, hello_address, hello_payload, read_frame, write_frame,
};
use super::{CONNECT_TIMEOUT, lock};
use crate::{ChannelId, NetworkError};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, BufReader, BufWriter};
use tokio::net::{TcpListener, TcpStream};

const IO_BUFFER: usize = 64 * 1024;

/// Accepts consumers' connections while the transport lives.
pub(super) async fn accept_loop(inner: Weak<Inner>, listener: TcpListener) {
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
pub(super) fn connect(inner: &Arc<Inner>, addr: SocketAddr) -> Arc<Conn> {
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

pub(super) async fn client_conn(inner: Weak<Inner>, conn: Arc<Conn>, addr: SocketAddr) {
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

pub(super) async fn server_conn(inner: Weak<Inner>, conn: Arc<Conn>, stream: TcpStream) {
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
pub(super) struct Counted<W> {
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
pub(super) async fn writer<W: AsyncWrite + Unpin>(conn: &Conn, w: W) -> String {
    let mut w = BufWriter::with_capacity(IO_BUFFER, w);
    match write_loop(conn, &mut w).await {
        Ok(reason) => reason,
        Err(e) => format!("writing: {e}"),
    }
}

pub(super) async fn write_loop<W: AsyncWrite + Unpin>(
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

/// Reads a consumer's frames until the connection fails; returns why.
pub(super) async fn server_reader<R: AsyncRead + Unpin>(
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

pub(super) async fn serve_frames<R: AsyncRead + Unpin>(
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

pub(super) fn on_request(inner: &Inner, conn: &Arc<Conn>, id: ChannelId, credits: usize) {
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

pub(super) fn on_cancel(inner: &Inner, conn: &Arc<Conn>, id: ChannelId) {
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
pub(super) async fn client_reader<R: AsyncRead + Unpin>(conn: &Conn, r: R) -> String {
    let mut r = BufReader::with_capacity(IO_BUFFER, r);
    match receive_frames(conn, &mut r).await {
        Ok(()) => "the peer closed the connection".into(),
        Err(reason) => reason,
    }
}

pub(super) async fn receive_frames<R: AsyncRead + Unpin>(
    conn: &Conn,
    r: &mut R,
) -> Result<(), String> {
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
