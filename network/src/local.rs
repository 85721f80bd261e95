//! The in-process transport: each channel is a bounded queue of owned elements, shared by its two
//! ends. Nothing is serialized; a batch changes hands with one pointer move.

use crate::{
    AnyElement, ChannelConfig, ChannelId, Delivery, ElementCodec, NetworkError, RawReceiver,
    RawSender, Transport,
};
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};

/// The in-process transport.
#[derive(Debug, Default)]
pub struct LocalTransport {
    config: ChannelConfig,
    unclaimed: Mutex<HashMap<ChannelId, Unclaimed>>,
}

#[derive(Debug, Default)]
struct Unclaimed {
    sender: Option<LocalSender>,
    receiver: Option<LocalReceiver>,
    sender_taken: bool,
    receiver_taken: bool,
}

impl LocalTransport {
    /// A transport whose channels have `config`'s credits.
    pub fn new(config: ChannelConfig) -> LocalTransport {
        LocalTransport {
            config: ChannelConfig {
                buffers_per_channel: config.buffers_per_channel.max(1),
            },
            unclaimed: Mutex::new(HashMap::new()),
        }
    }

    fn with_entry<R>(&self, id: ChannelId, f: impl FnOnce(&mut Unclaimed) -> R) -> R {
        let mut map = lock(&self.unclaimed);
        let capacity = self.config.buffers_per_channel;
        let entry = map.entry(id).or_insert_with(|| {
            let shared = Arc::new(Mutex::new(Queue {
                items: VecDeque::with_capacity(capacity),
                priority: VecDeque::new(),
                capacity,
                rx_waker: None,
                tx_waker: None,
                tx_closed: false,
                rx_closed: false,
            }));
            Unclaimed {
                sender: Some(LocalSender {
                    id,
                    shared: shared.clone(),
                }),
                receiver: Some(LocalReceiver { shared }),
                sender_taken: false,
                receiver_taken: false,
            }
        });
        let r = f(entry);
        if entry.sender_taken && entry.receiver_taken {
            map.remove(&id);
        }
        r
    }
}

impl Transport for LocalTransport {
    fn open_output(
        &self,
        id: ChannelId,
        _codec: ElementCodec,
    ) -> Result<Box<dyn RawSender>, NetworkError> {
        self.with_entry(id, |e| {
            e.sender_taken = true;
            e.sender
                .take()
                .map(|s| Box::new(s) as Box<dyn RawSender>)
                .ok_or(NetworkError::AlreadyOpen(id))
        })
    }

    fn open_input(
        &self,
        id: ChannelId,
        _codec: ElementCodec,
    ) -> Result<Box<dyn RawReceiver>, NetworkError> {
        self.with_entry(id, |e| {
            e.receiver_taken = true;
            e.receiver
                .take()
                .map(|r| Box::new(r) as Box<dyn RawReceiver>)
                .ok_or(NetworkError::AlreadyOpen(id))
        })
    }

    fn release_before(&self, generation: u64) {
        lock(&self.unclaimed).retain(|id, _| id.generation >= generation);
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[derive(Debug)]
struct Queue {
    items: VecDeque<AnyElement>,
    /// Priority elements, each with the number of `items` queued when it was sent.
    priority: VecDeque<(AnyElement, usize)>,
    capacity: usize,
    rx_waker: Option<Waker>,
    tx_waker: Option<Waker>,
    tx_closed: bool,
    rx_closed: bool,
}

#[derive(Debug)]
struct LocalSender {
    id: ChannelId,
    shared: Arc<Mutex<Queue>>,
}

#[derive(Debug)]
struct LocalReceiver {
    shared: Arc<Mutex<Queue>>,
}

impl RawSender for LocalSender {
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), NetworkError>> {
        let mut q = lock(&self.shared);
        if q.rx_closed {
            return Poll::Ready(Err(NetworkError::Disconnected(self.id)));
        }
        if q.items.len() < q.capacity {
            return Poll::Ready(Ok(()));
        }
        match &q.tx_waker {
            Some(w) if w.will_wake(cx.waker()) => {}
            _ => q.tx_waker = Some(cx.waker().clone()),
        }
        Poll::Pending
    }

    fn start_send(&mut self, element: AnyElement) -> Result<(), (AnyElement, NetworkError)> {
        let mut q = lock(&self.shared);
        if q.rx_closed {
            return Err((element, NetworkError::Disconnected(self.id)));
        }
        if q.items.len() >= q.capacity {
            return Err((element, NetworkError::NoCredit(self.id)));
        }
        q.items.push_back(element);
        let waker = q.rx_waker.take();
        drop(q);
        if let Some(w) = waker {
            w.wake();
        }
        Ok(())
    }

    fn send_priority(&mut self, element: AnyElement) -> Result<(), (AnyElement, NetworkError)> {
        self.priority(element)
    }
}

impl LocalSender {
    fn priority(&mut self, element: AnyElement) -> Result<(), (AnyElement, NetworkError)> {
        let mut q = lock(&self.shared);
        if q.rx_closed {
            return Err((element, NetworkError::Disconnected(self.id)));
        }
        let overtook = q.items.len();
        q.priority.push_back((element, overtook));
        let waker = q.rx_waker.take();
        drop(q);
        if let Some(w) = waker {
            w.wake();
        }
        Ok(())
    }
}

impl Drop for LocalSender {
    fn drop(&mut self) {
        let mut q = lock(&self.shared);
        q.tx_closed = true;
        let waker = q.rx_waker.take();
        drop(q);
        if let Some(w) = waker {
            w.wake();
        }
    }
}

impl RawReceiver for LocalReceiver {
    fn poll_recv(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Delivery<AnyElement>, NetworkError>>> {
        let mut q = lock(&self.shared);
        if let Some((element, overtook)) = q.priority.pop_front() {
            return Poll::Ready(Some(Ok(Delivery {
                element,
                overtook: Some(overtook),
            })));
        }
        if let Some(item) = q.items.pop_front() {
            // A sender waiting for credit wakes once half the queue is free, not at each
            // element taken: it then sends several in one wake-up instead of one per thread
            // switch (a futex wake and a sleep per batch cost about a tenth of a busy
            // pipeline's CPU).
            let waker = if q.items.len() * 2 <= q.capacity {
                q.tx_waker.take()
            } else {
                None
            };
            drop(q);
            if let Some(w) = waker {
                w.wake();
            }
            return Poll::Ready(Some(Ok(Delivery::in_order(item))));
        }
        if q.tx_closed {
            return Poll::Ready(None);
        }
        match &q.rx_waker {
            Some(w) if w.will_wake(cx.waker()) => {}
            _ => q.rx_waker = Some(cx.waker().clone()),
        }
        Poll::Pending
    }
}

impl Drop for LocalReceiver {
    fn drop(&mut self) {
        let mut q = lock(&self.shared);
        q.rx_closed = true;
        q.items.clear();
        q.priority.clear();
        let waker = q.tx_waker.take();
        drop(q);
        if let Some(w) = waker {
            w.wake();
        }
    }
}
