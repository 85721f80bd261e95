//! The wire format: frames (length, checksum, type, channel, payload), their encoding and
//! reading, and the checks of what each end of a connection may send.

use super::MAX_FRAME;
use crate::ChannelId;
use std::net::SocketAddr;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use weir_core::ids::EdgeId;

pub(super) const MAGIC: &[u8; 8] = b"WEIRNET2";
pub(super) const ID_LEN: usize = 20;
pub(super) const LEN_LEN: usize = 4;
pub(super) const CRC_LEN: usize = 4;
/// The bytes `len` counts besides the payload: checksum, type, channel.
pub(super) const FRAME_OVERHEAD: usize = CRC_LEN + 1 + ID_LEN;
pub(super) const HEADER_LEN: usize = LEN_LEN + FRAME_OVERHEAD;
pub(super) const STAMP_LEN: usize = 8;

pub(super) const HELLO: u8 = 1;
pub(super) const REQUEST: u8 = 2;
pub(super) const CREDIT: u8 = 3;
pub(super) const CANCEL: u8 = 4;
pub(super) const DATA: u8 = 10;
pub(super) const PRIORITY: u8 = 11;
pub(super) const END: u8 = 12;
pub(super) const ERROR: u8 = 13;

/// A frame to write.
pub(super) struct Frame {
    pub(super) kind: u8,
    pub(super) id: ChannelId,
    pub(super) payload: Vec<u8>,
}

impl Frame {
    pub(super) fn new(kind: u8, id: ChannelId, payload: Vec<u8>) -> Frame {
        Frame { kind, id, payload }
    }
}

pub(super) fn encode_id(id: &ChannelId, out: &mut [u8]) {
    out[0..8].copy_from_slice(&id.generation.to_le_bytes());
    out[8..12].copy_from_slice(&id.edge.0.to_le_bytes());
    out[12..16].copy_from_slice(&id.producer.to_le_bytes());
    out[16..20].copy_from_slice(&id.consumer.to_le_bytes());
}

pub(super) fn decode_id(b: &[u8; ID_LEN]) -> ChannelId {
    let u32_at = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
    let mut generation = [0u8; 8];
    generation.copy_from_slice(&b[0..8]);
    ChannelId {
        generation: u64::from_le_bytes(generation),
        edge: EdgeId(u32_at(8)),
        producer: u32_at(12),
        consumer: u32_at(16),
    }
}

/// The id of frames about no channel.
pub(super) const NO_CHANNEL: ChannelId = ChannelId {
    generation: 0,
    edge: EdgeId(0),
    producer: 0,
    consumer: 0,
};

/// The checksum of a frame: its type and channel (`head`), then its payload.
pub(super) fn checksum(head: &[u8], payload: &[u8]) -> u32 {
    let mut hasher = crc32fast::Hasher::new();
    hasher.update(head);
    hasher.update(payload);
    hasher.finalize()
}

/// The header of a frame carrying `payload`: length, checksum, type and channel.
pub(super) fn frame_header(kind: u8, id: &ChannelId, payload: &[u8]) -> [u8; HEADER_LEN] {
    let mut header = [0u8; HEADER_LEN];
    // Callers keep payloads within MAX_FRAME, so this fits a u32.
    let len = (FRAME_OVERHEAD + payload.len()) as u32;
    header[..LEN_LEN].copy_from_slice(&len.to_le_bytes());
    let (crc, head) = header[LEN_LEN..].split_at_mut(CRC_LEN);
    head[0] = kind;
    encode_id(id, &mut head[1..]);
    crc.copy_from_slice(&checksum(head, payload).to_le_bytes());
    header
}

pub(super) async fn write_frame<W: AsyncWrite + Unpin>(
    w: &mut W,
    kind: u8,
    id: &ChannelId,
    payload: &[u8],
) -> std::io::Result<()> {
    w.write_all(&frame_header(kind, id, payload)).await?;
    w.write_all(payload).await
}

/// Fills `buf` from inside a frame, where the end of the stream is an error.
pub(super) async fn read_within_frame<R: AsyncRead + Unpin>(
    r: &mut R,
    buf: &mut [u8],
) -> Result<(), String> {
    match r.read_exact(buf).await {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
            Err("the peer closed the connection mid-frame (a truncated frame)".into())
        }
        Err(e) => Err(format!("reading a frame: {e}")),
    }
}

/// The first step of reading a frame's payload.
pub(super) const PAYLOAD_CHUNK: usize = 64 * 1024;

/// Reads one frame and verifies its checksum; `None` on a clean end of the stream between
/// frames.
pub(super) async fn read_frame<R: AsyncRead + Unpin>(r: &mut R) -> Result<Option<Frame>, String> {
    let mut len = [0u8; LEN_LEN];
    // No byte at all is a clean end; a part of the length is a truncated frame.
    match r.read(&mut len[..1]).await {
        Ok(0) => return Ok(None),
        Ok(_) => read_within_frame(r, &mut len[1..]).await?,
        Err(e) => return Err(format!("reading a frame: {e}")),
    }
    let len = u32::from_le_bytes(len) as usize;
    if !(FRAME_OVERHEAD..=MAX_FRAME).contains(&len) {
        return Err(format!("protocol error: a frame of {len} bytes"));
    }
    let mut head = [0u8; FRAME_OVERHEAD];
    read_within_frame(r, &mut head).await?;
    // Grown as the bytes arrive (doubling from 64 KiB), so a length the peer never backs with
    // bytes allocates at most twice what it sent.
    let want = len - FRAME_OVERHEAD;
    let mut payload = Vec::with_capacity(want.min(PAYLOAD_CHUNK));
    while payload.len() < want {
        let start = payload.len();
        let step = (want - start).min(PAYLOAD_CHUNK.max(start));
        payload.resize(start + step, 0);
        read_within_frame(r, &mut payload[start..]).await?;
    }
    let (crc, head) = head.split_at(CRC_LEN);
    let expected = u32::from_le_bytes([crc[0], crc[1], crc[2], crc[3]]);
    let computed = checksum(head, &payload);
    if expected != computed {
        return Err(format!(
            "protocol error: a corrupt frame of {len} bytes: checksum {expected:#010x} expected, \
             {computed:#010x} computed"
        ));
    }
    let mut id = [0u8; ID_LEN];
    id.copy_from_slice(&head[1..]);
    Ok(Some(Frame {
        kind: head[0],
        id: decode_id(&id),
        payload,
    }))
}

pub(super) fn payload_u32(f: &Frame) -> Result<u32, String> {
    <[u8; 4]>::try_from(f.payload.as_slice())
        .map(u32::from_le_bytes)
        .map_err(|_| format!("protocol error: frame type {} of bad length", f.kind))
}

/// A consumer's hello: the magic, then its listen address.
pub(super) fn hello_payload(addr: SocketAddr) -> Vec<u8> {
    let mut hello = MAGIC.to_vec();
    hello.extend_from_slice(addr.to_string().as_bytes());
    hello
}

/// The listen address a consumer's first frame, its hello, announces.
pub(super) fn hello_address(hello: &Frame) -> Result<SocketAddr, String> {
    hello
        .payload
        .strip_prefix(MAGIC.as_slice())
        .filter(|_| hello.kind == HELLO)
        .and_then(|a| std::str::from_utf8(a).ok())
        .and_then(|a| a.parse::<SocketAddr>().ok())
        .ok_or_else(|| "protocol error: no hello from a Weir transport".to_string())
}

/// A frame a consumer may send after its hello, checked.
pub(super) enum FromConsumer {
    Request(u32),
    Credit(u32),
    Cancel,
}

pub(super) fn from_consumer(f: &Frame) -> Result<FromConsumer, String> {
    match f.kind {
        REQUEST => payload_u32(f).map(FromConsumer::Request),
        CREDIT => payload_u32(f).map(FromConsumer::Credit),
        CANCEL => Ok(FromConsumer::Cancel),
        other => Err(format!(
            "protocol error: frame type {other} from a consumer"
        )),
    }
}

/// A frame a producer may send, checked; a priority element with its stamp.
pub(super) enum FromProducer {
    Data,
    Priority(u64),
    End,
    Error,
}

pub(super) fn from_producer(f: &Frame) -> Result<FromProducer, String> {
    match f.kind {
        DATA => Ok(FromProducer::Data),
        PRIORITY => <[u8; STAMP_LEN]>::try_from(f.payload.get(..STAMP_LEN).unwrap_or(&[]))
            .map(|stamp| FromProducer::Priority(u64::from_le_bytes(stamp)))
            .map_err(|_| "protocol error: a priority frame without its stamp".to_string()),
        END => Ok(FromProducer::End),
        ERROR => Ok(FromProducer::Error),
        other => Err(format!(
            "protocol error: frame type {other} from a producer"
        )),
    }
}
