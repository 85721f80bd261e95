//! The transport conformance suite: the [`Transport`] contract as executable checks. Every
//! transport (in-process now, TCP later) must pass [`run_all`].
//!
//! Each check takes a fresh transport from `make` with the given credits per channel and panics
//! with a message naming the violated rule.

use crate::channel::{open_input, open_output};
use crate::{ChannelId, NetworkError, Transport};
use std::future::poll_fn;
use std::task::{Context, Poll};
use weir_core::element::{Event, StreamElement};
use weir_core::ids::EdgeId;

fn id(generation: u64, producer: u32, consumer: u32) -> ChannelId {
    ChannelId {
        generation,
        edge: EdgeId(7),
        producer,
        consumer,
    }
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

/// After the consumer drops, the producer learns it is disconnected.
pub async fn consumer_drop_disconnects(t: &dyn Transport) {
    let mut tx = open_output::<u8>(t, id(1, 4, 0)).expect("open output");
    let rx = open_input::<u8>(t, id(1, 4, 0)).expect("open input");
    drop(rx);
    let r = poll_fn(|cx| match tx.poll_ready(cx) {
        Poll::Ready(r) => Poll::Ready(r),
        Poll::Pending => Poll::Ready(Ok(())),
    })
    .await;
    let sent = match r {
        Err(e) => Err(e),
        Ok(()) => tx.start_send(StreamElement::Batch(vec![1])),
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
    assert!(
        open_output::<u8>(t, id(1, 6, 0)).is_ok(),
        "a released generation's ids can be opened anew"
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
