//! Tests of the TCP transport: the conformance suite over real sockets, failures, fake peers
//! that break the protocol, and load.

use super::wire::{
    CRC_LEN, CREDIT, DATA, HEADER_LEN, HELLO, LEN_LEN, MAGIC, NO_CHANNEL, REQUEST, checksum,
    read_frame, write_frame,
};
use super::{StaticDirectory, TcpTransport};
use crate::channel::{open_input, open_output};
use crate::conformance::{self, Split};
use crate::{
    AnyElement, ChannelConfig, ChannelId, Delivery, ElementCodec, NetworkError, Transport,
};
use std::future::poll_fn;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::OnceLock;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use tokio::io::{AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use weir_core::element::{CheckpointBarrier, CheckpointOptions, Event, StreamElement};
use weir_core::ids::CheckpointId;
use weir_core::ids::EdgeId;

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
    let t =
        TcpTransport::bind(loopback(), config(1), Arc::new(StaticDirectory::new())).expect("bind");
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
async fn fake_producer(bytes: Vec<u8>, close: bool) -> (SocketAddr, tokio::task::JoinHandle<()>) {
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
    let t =
        TcpTransport::bind(loopback(), config(1), Arc::new(StaticDirectory::new())).expect("bind");
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
