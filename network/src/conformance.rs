//! The transport conformance suite: the [`Transport`] contract as executable checks. Every
//! transport (in-process now, TCP later) must pass [`run_all`].
//!
//! Each check takes a fresh transport from `make` with the given credits per channel and panics
//! with a message naming the violated rule.
//!
//! A transport whose ends live in different processes runs the suite through [`Split`], which
//! opens producers' ends on one instance and consumers' ends on another. News crosses such a
//! transport with a delay (a dropped consumer end, a priority element): the checks wait for it,
//! up to [`PATIENCE`], where an in-process transport delivers it at once.

use crate::channel::{open_input, open_output};
use crate::{ChannelId, Delivery, ElementCodec, NetworkError, RawReceiver, RawSender, Transport};
use std::future::poll_fn;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};
use weir_core::element::{CheckpointBarrier, CheckpointOptions, Event, StreamElement};
use weir_core::ids::{CheckpointId, EdgeId};

fn id(generation: u64, producer: u32, consumer: u32) -> ChannelId {
    ChannelId {
        generation,
        edge: EdgeId(7),
        producer,
        consumer,
    }
}

/// How long a check waits for news to cross a transport.
pub const PATIENCE: Duration = Duration::from_secs(10);

/// Two instances of a transport as one, as in two processes: producers' ends open on
/// `producer`, consumers' ends on `consumer`; releasing releases both.
#[derive(Debug)]
pub struct Split<P, C> {
    /// Where producers' ends open.
    pub producer: P,
    /// Where consumers' ends open.
    pub consumer: C,
}

impl<P: Transport, C: Transport> Transport for Split<P, C> {
    fn open_output(
        &self,
        id: ChannelId,
        codec: ElementCodec,
    ) -> Result<Box<dyn RawSender>, NetworkError> {
        self.producer.open_output(id, codec)
    }

    fn open_input(
        &self,
        id: ChannelId,
        codec: ElementCodec,
    ) -> Result<Box<dyn RawReceiver>, NetworkError> {
        self.consumer.open_input(id, codec)
    }

    fn release_before(&self, generation: u64) {
        self.producer.release_before(generation);
        self.consumer.release_before(generation);
    }
}

/// Lets other tasks of the runtime run (a transport's connections) before resuming.
async fn yield_now() {
    let mut yielded = false;
    poll_fn(|cx| {
        if yielded {
            Poll::Ready(())
        } else {
            yielded = true;
            cx.waker().wake_by_ref();
            Poll::Pending
        }
    })
    .await
}

/// Expands to one test per check, for a transport made by `$make(credits)`:
///
/// ```ignore
/// mod my_transport {
///     weir_network::transport_conformance!(|credits| MyTransport::new(credits));
/// }
/// ```
///
/// Each check is a `#[tokio::test]` of its own, named after it. Needs the `conformance` feature
/// of `weir-network`, and `tokio` (with `macros` and `rt-multi-thread`) among the
/// dev-dependencies.
#[macro_export]
macro_rules! transport_conformance {
    ($make:expr $(,)?) => {
        $crate::transport_conformance!(@each $make;
            order_is_kept => order_is_kept(4),
            ends_open_once_in_any_order => ends_open_once_in_any_order(4),
            producer_close_ends_the_stream => producer_close_ends_the_stream(4),
            consumer_drop_disconnects => consumer_drop_disconnects(4),
            generations_are_independent => generations_are_independent(4),
            many_channels_do_not_block_each_other => many_channels_do_not_block_each_other(1),
            priority_elements_keep_their_order => priority_elements_keep_their_order(4),
            priority_overtakes_exactly_the_unread_elements =>
                priority_overtakes_exactly_the_unread_elements(2),
            priority_to_a_dropped_consumer_disconnects =>
                priority_to_a_dropped_consumer_disconnects(4),
        );

        #[::tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn credits_bound_in_flight() {
            let transport = ($make)(2);
            $crate::conformance::credits_bound_in_flight(&transport, 2).await;
        }

        #[::tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn priority_needs_no_credit_and_overtakes_the_queue() {
            let transport = ($make)(2);
            $crate::conformance::priority_needs_no_credit_and_overtakes_the_queue(&transport, 2)
                .await;
        }
    };
    (@each $make:expr; $($name:ident => $check:ident($credits:expr),)*) => {
        $(
            #[::tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() {
                let transport = ($make)($credits);
                $crate::conformance::$check(&transport).await;
            }
        )*
    };
}

/// Runs every check; `make(credits)` builds a fresh transport.
pub async fn run_all<T: Transport>(make: impl Fn(usize) -> T) {
    order_is_kept(&make(4)).await;
    credits_bound_in_flight(&make(2), 2).await;
    ends_open_once_in_any_order(&make(4)).await;
    producer_close_ends_the_stream(&make(4)).await;
    consumer_drop_disconnects(&make(4)).await;
    generations_are_independent(&make(4)).await;
    many_channels_do_not_block_each_other(&make(1)).await;
    priority_needs_no_credit_and_overtakes_the_queue(&make(2), 2).await;
    priority_elements_keep_their_order(&make(4)).await;
    priority_overtakes_exactly_the_unread_elements(&make(2)).await;
    priority_to_a_dropped_consumer_disconnects(&make(4)).await;
}

/// Elements arrive in the order sent, each once, batches and events alike.
pub async fn order_is_kept(t: &dyn Transport) {
    let mut tx = open_output::<u64>(t, id(1, 0, 0)).expect("open output");
    let mut rx = open_input::<u64>(t, id(1, 0, 0)).expect("open input");
    let sender = async {
        for i in 0..200u64 {
            tx.send(StreamElement::Batch(vec![i, i + 1]))
                .await
                .expect("send");
            if i % 50 == 0 {
                tx.send(StreamElement::Event(Event::CancelCheckpoint(
                    weir_core::ids::CheckpointId(i),
                )))
                .await
                .expect("send event");
            }
        }
        drop(tx);
    };
    let receiver = async {
        let mut next = 0u64;
        while let Some(e) = rx.recv().await {
            match e.expect("receive") {
                StreamElement::Batch(b) => {
                    assert_eq!(b, vec![next, next + 1], "batches out of order");
                    next += 1;
                }
                StreamElement::Event(Event::CancelCheckpoint(c)) => {
                    assert_eq!(c.0 % 50, 0);
                    assert_eq!(
                        c.0 + 1,
                        next,
                        "event out of order with the batches around it"
                    );
                }
                other => panic!("unexpected element {other:?}"),
            }
        }
        assert_eq!(next, 200, "elements lost");
    };
    futures::join!(sender, receiver);
}

/// A producer without credit is not ready; reading one element returns one credit.
pub async fn credits_bound_in_flight(t: &dyn Transport, credits: usize) {
    let mut tx = open_output::<u8>(t, id(1, 1, 1)).expect("open output");
    let mut rx = open_input::<u8>(t, id(1, 1, 1)).expect("open input");
    for i in 0..credits {
        tx.send(StreamElement::Batch(vec![i as u8]))
            .await
            .expect("send within credit");
    }
    let waker = futures::task::noop_waker();
    let mut cx = Context::from_waker(&waker);
    assert!(
        tx.poll_ready(&mut cx).is_pending(),
        "a producer must wait once {credits} buffers are in flight"
    );
    assert!(
        matches!(
            tx.start_send(StreamElement::Batch(vec![9])),
            Err(NetworkError::NoCredit(_))
        ),
        "a send without credit must be refused"
    );
    rx.recv().await.expect("an element").expect("ok");
    poll_fn(|cx| tx.poll_ready(cx))
        .await
        .expect("a credit returns after a read");
}

/// Either end may open first; opening an end twice is refused.
pub async fn ends_open_once_in_any_order(t: &dyn Transport) {
    let rx = open_input::<u8>(t, id(1, 2, 0));
    assert!(rx.is_ok(), "the consumer may open first");
    assert!(
        matches!(
            open_input::<u8>(t, id(1, 2, 0)),
            Err(NetworkError::AlreadyOpen(_))
        ),
        "opening the consumer end twice must fail"
    );
    assert!(
        open_output::<u8>(t, id(1, 2, 0)).is_ok(),
        "then the producer opens"
    );
    assert!(
        open_output::<u8>(t, id(1, 0, 2)).is_ok(),
        "the producer may open first"
    );
    assert!(
        matches!(
            open_output::<u8>(t, id(1, 0, 2)),
            Err(NetworkError::AlreadyOpen(_))
        ),
        "opening the producer end twice must fail"
    );
}

/// After the producer closes, the consumer reads what was sent, then `None`.
pub async fn producer_close_ends_the_stream(t: &dyn Transport) {
    let mut tx = open_output::<u8>(t, id(1, 3, 0)).expect("open output");
    let mut rx = open_input::<u8>(t, id(1, 3, 0)).expect("open input");
    tx.send(StreamElement::Event(Event::EndOfInput))
        .await
        .expect("send");
    drop(tx);
    assert_eq!(
        rx.recv()
            .await
            .expect("the element sent before closing")
            .expect("ok"),
        StreamElement::Event(Event::EndOfInput)
    );
    assert!(rx.recv().await.is_none(), "a closed channel ends with None");
}

/// After the consumer drops, the producer learns it is disconnected: at once in process, once
/// the news crosses the network otherwise (sends accepted meanwhile are discarded).
pub async fn consumer_drop_disconnects(t: &dyn Transport) {
    let mut tx = open_output::<u8>(t, id(1, 4, 0)).expect("open output");
    let rx = open_input::<u8>(t, id(1, 4, 0)).expect("open input");
    drop(rx);
    let deadline = Instant::now() + PATIENCE;
    let sent = loop {
        let r = poll_fn(|cx| match tx.poll_ready(cx) {
            Poll::Ready(r) => Poll::Ready(r),
            Poll::Pending => Poll::Ready(Ok(())),
        })
        .await;
        let sent = match r {
            Err(e) => Err(e),
            Ok(()) => tx.start_send(StreamElement::Batch(vec![1])),
        };
        match sent {
            Ok(()) | Err(NetworkError::NoCredit(_)) if Instant::now() < deadline => {
                yield_now().await
            }
            other => break other,
        }
    };
    assert!(
        matches!(sent, Err(NetworkError::Disconnected(_))),
        "sending to a dropped consumer must fail with Disconnected, got {sent:?}"
    );
}

/// The same channel in two generations are two channels; releasing old generations frees
/// their unclaimed ends.
pub async fn generations_are_independent(t: &dyn Transport) {
    let mut old_tx = open_output::<u8>(t, id(1, 5, 0)).expect("open output");
    let mut new_tx = open_output::<u8>(t, id(2, 5, 0)).expect("open output");
    let mut new_rx = open_input::<u8>(t, id(2, 5, 0)).expect("open input");
    new_tx
        .send(StreamElement::Batch(vec![2]))
        .await
        .expect("send");
    old_tx
        .send(StreamElement::Batch(vec![1]))
        .await
        .expect("send to an unclaimed end");
    assert_eq!(
        new_rx.recv().await.expect("element").expect("ok"),
        StreamElement::Batch(vec![2]),
        "generation 2 must not see generation 1's elements"
    );
    t.release_before(2);
    let sent = old_tx.send(StreamElement::Batch(vec![3])).await;
    assert!(
        matches!(sent, Err(NetworkError::Disconnected(_))),
        "releasing generation 1 must drop its unclaimed consumer end, so its producer sees Disconnected; got {sent:?}"
    );
}

/// A full channel does not stop others: credits are per channel.
pub async fn many_channels_do_not_block_each_other(t: &dyn Transport) {
    let mut full = open_output::<u8>(t, id(1, 8, 0)).expect("open output");
    let _full_rx = open_input::<u8>(t, id(1, 8, 0)).expect("open input");
    full.send(StreamElement::Batch(vec![1]))
        .await
        .expect("send");
    let mut other = open_output::<u8>(t, id(1, 8, 1)).expect("open output");
    let mut other_rx = open_input::<u8>(t, id(1, 8, 1)).expect("open input");
    other
        .send(StreamElement::Batch(vec![2]))
        .await
        .expect("a free channel must accept");
    assert_eq!(
        other_rx.recv().await.expect("element").expect("ok"),
        StreamElement::Batch(vec![2])
    );
}

/// A waker that records that it was woken.
struct Flag(AtomicBool);

impl Wake for Flag {
    fn wake(self: Arc<Self>) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// An unaligned checkpoint's barrier: the element priority sends carry in practice.
fn priority_barrier<T>(id: u64) -> StreamElement<T> {
    StreamElement::Event(Event::Barrier(CheckpointBarrier {
        id: CheckpointId(id),
        timestamp_ms: 0,
        options: CheckpointOptions::ALIGNED_CHECKPOINT.as_unaligned(),
    }))
}

/// A priority element needs no credit: it is accepted while every credit is used, it does not
/// take one (reading it returns none), and it is delivered before the `credits` elements queued,
/// which follow it in their order. Then the stream ends as usual.
pub async fn priority_needs_no_credit_and_overtakes_the_queue(t: &dyn Transport, credits: usize) {
    let mut tx = open_output::<u8>(t, id(1, 9, 0)).expect("open output");
    let mut rx = open_input::<u8>(t, id(1, 9, 0)).expect("open input");
    for i in 0..credits {
        tx.send(StreamElement::Batch(vec![i as u8]))
            .await
            .expect("send within credit");
    }
    let waker = futures::task::noop_waker();
    let mut cx = Context::from_waker(&waker);
    assert!(
        tx.poll_ready(&mut cx).is_pending(),
        "a producer must wait once {credits} buffers are in flight"
    );
    tx.send_priority(priority_barrier(1))
        .expect("a priority element must be accepted without credit");
    assert_eq!(
        rx.recv_delivery().await.expect("an element").expect("ok"),
        Delivery {
            element: priority_barrier(1),
            overtook: Some(credits),
        },
        "the priority element must come first and count the {credits} elements it overtook"
    );
    assert!(
        tx.poll_ready(&mut cx).is_pending(),
        "reading a priority element must not return a credit: it took none"
    );
    for i in 0..credits {
        assert_eq!(
            rx.recv_delivery().await.expect("an element").expect("ok"),
            Delivery::in_order(StreamElement::Batch(vec![i as u8])),
            "the overtaken elements must follow the priority element, in order, as ordinary \
             elements (overtook None)"
        );
    }
    drop(tx);
    assert!(
        rx.recv_delivery().await.is_none(),
        "a closed channel ends with None after the overtaken elements"
    );
}

/// Priority elements keep their order among themselves; each counts the ordinary elements queued
/// when it was sent (an earlier priority element is delivered before it, so it is not among
/// them); one sent to an empty channel overtook nothing and wakes a waiting consumer.
pub async fn priority_elements_keep_their_order(t: &dyn Transport) {
    let mut tx = open_output::<u8>(t, id(1, 10, 0)).expect("open output");
    let mut rx = open_input::<u8>(t, id(1, 10, 0)).expect("open input");
    let batch = |i: u8| StreamElement::Batch(vec![i]);
    let woken = Arc::new(Flag(AtomicBool::new(false)));
    let waker = Waker::from(woken.clone());
    assert!(
        rx.poll_delivery(&mut Context::from_waker(&waker))
            .is_pending(),
        "nothing was sent yet"
    );
    tx.send_priority(priority_barrier(1)).expect("priority 1");
    let deadline = Instant::now() + PATIENCE;
    while !woken.0.load(Ordering::SeqCst) && Instant::now() < deadline {
        yield_now().await;
    }
    assert!(
        woken.0.load(Ordering::SeqCst),
        "a priority element must wake a consumer waiting on an empty channel"
    );
    tx.send(batch(0)).await.expect("send");
    tx.send(batch(1)).await.expect("send");
    tx.send_priority(priority_barrier(2)).expect("priority 2");
    tx.send(batch(2)).await.expect("send");
    tx.send_priority(priority_barrier(3)).expect("priority 3");
    let expected = [
        Delivery {
            element: priority_barrier(1),
            overtook: Some(0),
        },
        Delivery {
            element: priority_barrier(2),
            overtook: Some(2),
        },
        Delivery {
            element: priority_barrier(3),
            overtook: Some(3),
        },
        Delivery::in_order(batch(0)),
        Delivery::in_order(batch(1)),
        Delivery::in_order(batch(2)),
    ];
    for (n, want) in expected.into_iter().enumerate() {
        let got = rx.recv_delivery().await.expect("an element").expect("ok");
        assert_eq!(
            got, want,
            "delivery {n}: priority elements must come first in the order sent, each counting \
             the ordinary elements queued when it was sent; then the ordinary elements in order"
        );
    }
    // Once some elements were read, only the unread ones are overtaken.
    tx.send(batch(3)).await.expect("send");
    tx.send(batch(4)).await.expect("send");
    assert_eq!(
        rx.recv_delivery().await.expect("an element").expect("ok"),
        Delivery::in_order(batch(3))
    );
    tx.send_priority(priority_barrier(4)).expect("priority 4");
    let first = rx.recv_delivery().await.expect("an element").expect("ok");
    let second = rx.recv_delivery().await.expect("an element").expect("ok");
    // In process the priority element overtakes batch 4 at once. Across a network the consumer
    // may read batch 4 before the priority element arrives, which then overtook nothing: the
    // count must be exact either way.
    let overtaking = [
        Delivery {
            element: priority_barrier(4),
            overtook: Some(1),
        },
        Delivery::in_order(batch(4)),
    ];
    let overtaken_before_arrival = [
        Delivery::in_order(batch(4)),
        Delivery {
            element: priority_barrier(4),
            overtook: Some(0),
        },
    ];
    let got = [first, second];
    assert!(
        got == overtaking || got == overtaken_before_arrival,
        "a priority element must count only the elements still unread when it arrived, and \
         the overtaken element must follow it; got {got:?}"
    );
}

/// Under concurrent sending and reading, with the producer often out of credit: every priority
/// element is followed by exactly the elements sent before it and not yet read, so the ordinary
/// elements read before it plus the `k` it overtook are exactly those sent before it; ordinary
/// elements arrive in order, each once, with `overtook == None`.
pub async fn priority_overtakes_exactly_the_unread_elements(t: &dyn Transport) {
    const BATCHES: u64 = 300;
    let mut tx = open_output::<u64>(t, id(1, 11, 0)).expect("open output");
    let mut rx = open_input::<u64>(t, id(1, 11, 0)).expect("open input");
    let sender = async {
        for i in 0..BATCHES {
            if i % 7 == 3 || i % 11 == 0 {
                // The barrier's id records how many batches were sent before it.
                tx.send_priority(priority_barrier(i))
                    .expect("send priority");
            }
            tx.send(StreamElement::Batch(vec![i])).await.expect("send");
        }
        tx.send_priority(priority_barrier(BATCHES))
            .expect("send priority");
        drop(tx);
    };
    let receiver = async {
        let mut read = 0u64;
        let mut priorities = Vec::new();
        while let Some(d) = rx.recv_delivery().await {
            let d = d.expect("receive");
            match (d.element, d.overtook) {
                (StreamElement::Batch(b), None) => {
                    assert_eq!(b, vec![read], "ordinary elements out of order or lost");
                    read += 1;
                }
                (StreamElement::Event(Event::Barrier(barrier)), Some(k)) => {
                    let sent_before = barrier.id.0;
                    assert_eq!(
                        read + k as u64,
                        sent_before,
                        "priority element {sent_before}: {read} elements were read before it, \
                         so it must have overtaken the {} sent before it and unread, not {k}",
                        sent_before.saturating_sub(read)
                    );
                    priorities.push(sent_before);
                }
                (element, overtook) => panic!(
                    "unexpected delivery {element:?} with overtook {overtook:?}: batches are \
                     ordinary, barriers here are priority"
                ),
            }
        }
        assert_eq!(read, BATCHES, "elements lost");
        assert!(
            priorities.windows(2).all(|w| w[0] < w[1]),
            "priority elements out of order: {priorities:?}"
        );
        let sent = (0..BATCHES).filter(|i| i % 7 == 3 || i % 11 == 0).count() + 1;
        assert_eq!(priorities.len(), sent, "priority elements lost");
    };
    futures::join!(sender, receiver);
}

/// A priority element to a dropped consumer fails with `Disconnected`.
pub async fn priority_to_a_dropped_consumer_disconnects(t: &dyn Transport) {
    let mut tx = open_output::<u8>(t, id(1, 12, 0)).expect("open output");
    let rx = open_input::<u8>(t, id(1, 12, 0)).expect("open input");
    tx.send(StreamElement::Batch(vec![1])).await.expect("send");
    drop(rx);
    let deadline = Instant::now() + PATIENCE;
    let sent = loop {
        match tx.send_priority(priority_barrier(1)) {
            Ok(()) if Instant::now() < deadline => yield_now().await,
            other => break other,
        }
    };
    assert!(
        matches!(sent, Err(NetworkError::Disconnected(_))),
        "a priority send to a dropped consumer must fail with Disconnected, got {sent:?}"
    );
}

#[cfg(test)]
mod tests {
    use crate::{ChannelConfig, LocalTransport};

    #[tokio::test]
    async fn local_transport_conforms() {
        super::run_all(|credits| {
            LocalTransport::new(ChannelConfig {
                buffers_per_channel: credits,
            })
        })
        .await;
    }
}
