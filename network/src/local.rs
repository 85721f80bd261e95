//! The in-process transport: each channel is a bounded queue of owned elements, shared by its two
//! ends. Nothing is serialized; a batch changes hands with one pointer move.

use crate::{
    AnyElement, ChannelConfig, ChannelId, Delivery, ElementCodec, NetworkError, RawReceiver,
    RawSender, Transport,
};
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

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
                tx_woken_at: Duration::ZERO,
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

/// How long a consumer may hold back waking a producer that waits for credit while less than
/// half its queue is free (the clock is the simulation's under one).
const CREDIT_WAKE_BATCHING: Duration = Duration::from_millis(1);

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
    /// When the consumer last woke a producer waiting for credit.
    tx_woken_at: Duration,
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
            // A producer waiting for credit is woken once more than half the queue is free, or
            // when a millisecond has passed since the last wake-up, not at each element taken:
            // a busy pipeline's producer then sends several batches per wake-up instead of one
            // per thread switch (word_count at p=1 used 10 % less CPU), and a slow consumer
            // (under back pressure, a batch takes milliseconds) still gets the next batch as
            // soon as a credit is free, so aligned barriers are not held back.
            let waker = if q.tx_waker.is_none() {
                None
            } else if q.items.len() * 2 < q.capacity {
                q.tx_woken_at = weir_core::sim::wall_clock();
                q.tx_waker.take()
            } else {
                let now = weir_core::sim::wall_clock();
                if now.saturating_sub(q.tx_woken_at) >= CREDIT_WAKE_BATCHING {
                    q.tx_woken_at = now;
                    q.tx_waker.take()
                } else {
                    None
                }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{ElementCodec, Transport};
    use std::cell::Cell;
    use std::rc::Rc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::task::Wake;
    use weir_core::element::StreamElement;
    use weir_core::sim::{Delivery, FaultPoint, Message, Mutation, Observed, Simulator};

    /// A clock the test moves, read by the channels through the simulation hook.
    struct Clock(Cell<Duration>);

    impl Simulator for Clock {
        fn wall_clock(&self) -> Duration {
            self.0.get()
        }
        fn fail_at(&self, _: FaultPoint, _: &str) -> bool {
            false
        }
        fn deliver(&self, _: Message, _: &str) -> Delivery {
            Delivery::Now
        }
        fn pause(&self, _: &str) -> Option<Duration> {
            None
        }
        fn mutation(&self) -> Option<Mutation> {
            None
        }
        fn record(&self, _: std::fmt::Arguments<'_>) {}
        fn observe(&self, _: Observed) {}
    }

    /// Counts its wake-ups.
    struct Wakes(AtomicUsize);

    impl Wake for Wakes {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[test]
    fn a_producer_waiting_for_credit_is_woken_when_half_is_free_or_a_millisecond_has_passed() {
        let clock = Rc::new(Clock(Cell::new(Duration::from_secs(1_000))));
        let _sim = weir_core::sim::install(clock.clone());
        let t = LocalTransport::new(ChannelConfig {
            buffers_per_channel: 4,
        });
        let id = ChannelId {
            generation: 1,
            edge: weir_core::ids::EdgeId(0),
            producer: 0,
            consumer: 0,
        };
        let codec = ElementCodec::of::<u8>();
        let mut tx = t.open_output(id, codec).expect("open output");
        let mut rx = t.open_input(id, codec).expect("open input");
        let wakes = Arc::new(Wakes(AtomicUsize::new(0)));
        let waker = Waker::from(wakes.clone());
        let mut cx = Context::from_waker(&waker);
        let woken = || wakes.0.load(Ordering::SeqCst);
        let fill = |tx: &mut Box<dyn RawSender>, cx: &mut Context<'_>| {
            while tx.poll_ready(cx).is_ready() {
                tx.start_send(Box::new(StreamElement::<u8>::Batch(vec![1])))
                    .expect("send within credit");
            }
        };
        let take = |rx: &mut Box<dyn RawReceiver>| {
            let Poll::Ready(Some(Ok(_))) = rx.poll_recv(&mut Context::from_waker(&waker)) else {
                panic!("an element was queued");
            };
        };
        // The first wake-up comes at the first free credit (none came for a long time).
        fill(&mut tx, &mut cx);
        take(&mut rx);
        assert_eq!(woken(), 1, "the first free credit wakes a waiting producer");
        // Within the millisecond: not at 1 or 2 free of 4, but at 3 (more than half).
        fill(&mut tx, &mut cx);
        take(&mut rx);
        take(&mut rx);
        assert_eq!(
            woken(),
            1,
            "woken again within a millisecond, with half free"
        );
        take(&mut rx);
        assert_eq!(woken(), 2, "more than half free must wake the producer");
        // A millisecond after the last wake-up, one free credit wakes it again.
        fill(&mut tx, &mut cx);
        clock.0.set(clock.0.get() + CREDIT_WAKE_BATCHING);
        take(&mut rx);
        assert_eq!(
            woken(),
            3,
            "a millisecond after the last wake-up, one credit must wake it"
        );
    }
}
