//! Hidden entry points for the fuzzer (`weir-fuzz`): the frame reader and the frame checks of
//! both ends of a connection, run over bytes in memory, and the frame encoder for its seeds.
//!
//! Nothing here is a supported API. It exists so that the fuzzer runs the production decoder
//! ([`read_frame`](super::wire::read_frame) and the per-type checks the connection readers apply)
//! rather than a copy of it.

use super::wire::{
    CANCEL, CREDIT, DATA, END, ERROR, FromProducer, HELLO, PRIORITY, REQUEST, STAMP_LEN,
    frame_header, from_consumer, from_producer, hello_address, read_frame,
};
use crate::ChannelId;
use std::future::Future;
use std::net::SocketAddr;
use std::task::{Context, Poll, Waker};

/// The frame types, by name.
pub const KINDS: [(&str, u8); 8] = [
    ("hello", HELLO),
    ("request", REQUEST),
    ("credit", CREDIT),
    ("cancel", CANCEL),
    ("data", DATA),
    ("priority", PRIORITY),
    ("end", END),
    ("error", ERROR),
];

/// Which end of a connection reads the bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reader {
    /// The producer's transport, reading what a consumer sends: a hello, then requests,
    /// credits and cancels.
    Producer,
    /// The consumer's transport, reading what a producer sends: elements, ends and errors.
    Consumer,
}

/// One frame as read and checked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CheckedFrame {
    /// Its type.
    pub kind: u8,
    /// Its channel.
    pub channel: ChannelId,
    /// The encoded element of a data or priority frame (after the stamp), as the receiving
    /// channel hands it to its [`ElementCodec`](crate::ElementCodec).
    pub element: Option<Vec<u8>>,
}

/// A frame as the transport writes it.
pub fn encode_frame(kind: u8, channel: &ChannelId, payload: &[u8]) -> Vec<u8> {
    let mut out = frame_header(kind, channel, payload).to_vec();
    out.extend_from_slice(payload);
    out
}

/// The payload of a consumer's hello announcing `addr`.
pub fn hello_payload(addr: SocketAddr) -> Vec<u8> {
    super::wire::hello_payload(addr)
}

/// The payload of a priority element: its stamp, then the element (as `TcpSender` builds it).
pub fn priority_payload(stamp: u64, element: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(STAMP_LEN + element.len());
    out.extend_from_slice(&stamp.to_le_bytes());
    out.extend_from_slice(element);
    out
}

/// Reads `bytes` as `reader` reads a connection, up to its clean end: every frame, checked as
/// the connection reader checks it. An error is what would fail the connection.
pub fn read_frames(bytes: &[u8], reader: Reader) -> Result<Vec<CheckedFrame>, String> {
    let mut rest = bytes;
    let mut frames = Vec::new();
    while let Some(frame) = now(read_frame(&mut rest))?? {
        let element = match reader {
            Reader::Producer if frames.is_empty() => {
                hello_address(&frame)?;
                None
            }
            Reader::Producer => {
                from_consumer(&frame)?;
                None
            }
            Reader::Consumer => match from_producer(&frame)? {
                FromProducer::Data => Some(frame.payload),
                // The receiver decodes what follows the stamp.
                FromProducer::Priority(_) => frame.payload.get(STAMP_LEN..).map(<[u8]>::to_vec),
                FromProducer::End | FromProducer::Error => None,
            },
        };
        frames.push(CheckedFrame {
            kind: frame.kind,
            channel: frame.id,
            element,
        });
    }
    Ok(frames)
}

/// Runs a future over bytes in memory, which never waits.
fn now<F: Future>(future: F) -> Result<F::Output, String> {
    let mut future = std::pin::pin!(future);
    match future
        .as_mut()
        .poll(&mut Context::from_waker(Waker::noop()))
    {
        Poll::Ready(output) => Ok(output),
        Poll::Pending => Err("reading bytes in memory waited".to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use weir_core::ids::EdgeId;

    fn id() -> ChannelId {
        ChannelId {
            generation: 3,
            edge: EdgeId(1),
            producer: 2,
            consumer: 0,
        }
    }

    #[test]
    fn frames_read_back_as_written_and_damage_is_an_error() {
        let addr: SocketAddr = "127.0.0.1:6121".parse().unwrap();
        let mut consumer = encode_frame(HELLO, &id(), &hello_payload(addr));
        consumer.extend(encode_frame(REQUEST, &id(), &4u32.to_le_bytes()));
        consumer.extend(encode_frame(CANCEL, &id(), &[]));
        let frames = read_frames(&consumer, Reader::Producer).unwrap();
        let kinds: Vec<u8> = frames.iter().map(|f| f.kind).collect();
        assert_eq!(kinds, vec![HELLO, REQUEST, CANCEL]);
        assert!(
            frames
                .iter()
                .all(|f| f.channel == id() && f.element.is_none())
        );

        let mut producer = encode_frame(DATA, &id(), b"element");
        producer.extend(encode_frame(
            PRIORITY,
            &id(),
            &priority_payload(7, b"barrier"),
        ));
        producer.extend(encode_frame(END, &id(), &[]));
        let frames = read_frames(&producer, Reader::Consumer).unwrap();
        let elements: Vec<Option<&[u8]>> = frames.iter().map(|f| f.element.as_deref()).collect();
        assert_eq!(
            elements,
            vec![Some(&b"element"[..]), Some(&b"barrier"[..]), None]
        );

        // A truncated frame, a corrupt one, a short priority frame, a request to a consumer.
        let err = read_frames(&producer[..producer.len() - 1], Reader::Consumer).unwrap_err();
        assert!(err.contains("truncated"), "{err}");
        let mut corrupt = producer.clone();
        corrupt[30] ^= 1;
        let err = read_frames(&corrupt, Reader::Consumer).unwrap_err();
        assert!(err.contains("corrupt"), "{err}");
        let err =
            read_frames(&encode_frame(PRIORITY, &id(), &[1, 2]), Reader::Consumer).unwrap_err();
        assert!(err.contains("stamp"), "{err}");
        let err = read_frames(&consumer, Reader::Consumer).unwrap_err();
        assert!(err.contains("frame type 1 from a producer"), "{err}");
        let err = read_frames(&producer, Reader::Producer).unwrap_err();
        assert!(err.contains("no hello"), "{err}");
    }
}
