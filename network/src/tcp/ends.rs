//! The channel ends handed to tasks: [`TcpSender`] queues encoded elements for the connection's
//! writer under the credit window; [`TcpReceiver`] hands out what the connection's reader filed.

use super::MAX_FRAME;
use super::lock;
use super::state::{In, Out};
use super::wire::{CANCEL, FRAME_OVERHEAD, Frame, STAMP_LEN};
use crate::{AnyElement, ChannelId, Delivery, ElementCodec, NetworkError, RawReceiver, RawSender};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

pub(super) struct TcpSender {
    pub(super) id: ChannelId,
    pub(super) codec: ElementCodec,
    pub(super) out: Arc<Mutex<Out>>,
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

pub(super) struct TcpReceiver {
    pub(super) id: ChannelId,
    pub(super) codec: ElementCodec,
    pub(super) input: Arc<Mutex<In>>,
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
