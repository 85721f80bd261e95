//! Typed channel ends over the type-erased transport ends, and the codec a transport uses when
//! elements must leave the process.

use crate::{ChannelId, Data, Delivery, NetworkError, RawReceiver, RawSender};
use std::any::Any;
use std::future::poll_fn;
use std::marker::PhantomData;
use std::task::{Context, Poll};
use weir_core::element::StreamElement;

/// A `StreamElement<T>` with `T` erased. In-process transports move it as is; others encode it
/// with the channel's [`ElementCodec`].
pub type AnyElement = Box<dyn Any + Send>;

/// Encodes and decodes the erased elements of one channel type (postcard).
#[derive(Clone, Copy)]
pub struct ElementCodec {
    /// Appends the element's encoding.
    pub encode: fn(&AnyElement, &mut Vec<u8>) -> Result<(), String>,
    /// Decodes one element.
    pub decode: fn(&[u8]) -> Result<AnyElement, String>,
}

impl std::fmt::Debug for ElementCodec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ElementCodec")
    }
}

impl ElementCodec {
    /// The codec of `StreamElement<T>`.
    pub fn of<T: Data>() -> ElementCodec {
        fn encode<T: Data>(e: &AnyElement, out: &mut Vec<u8>) -> Result<(), String> {
            let e = e
                .downcast_ref::<StreamElement<T>>()
                .ok_or_else(|| "element of an unexpected type".to_string())?;
            weir_core::codec::encode_into("stream element", e, out).map_err(|e| e.to_string())
        }
        fn decode<T: Data>(b: &[u8]) -> Result<AnyElement, String> {
            let e: StreamElement<T> =
                weir_core::codec::decode("stream element", b).map_err(|e| e.to_string())?;
            Ok(Box::new(e))
        }
        ElementCodec {
            encode: encode::<T>,
            decode: decode::<T>,
        }
    }
}

/// The producer's typed end of a channel.
pub struct Sender<T> {
    id: ChannelId,
    raw: Box<dyn RawSender>,
    _t: PhantomData<fn(T)>,
}

impl<T: Data> Sender<T> {
    /// Wraps a raw end.
    pub fn new(id: ChannelId, raw: Box<dyn RawSender>) -> Self {
        Sender {
            id,
            raw,
            _t: PhantomData,
        }
    }

    /// The channel.
    pub fn id(&self) -> ChannelId {
        self.id
    }

    /// Ready when the channel has a credit.
    pub fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), NetworkError>> {
        self.raw.poll_ready(cx)
    }

    /// Sends using the credit [`poll_ready`](Self::poll_ready) reported.
    pub fn start_send(&mut self, element: StreamElement<T>) -> Result<(), NetworkError> {
        self.raw.start_send(Box::new(element)).map_err(|(_, e)| e)
    }

    /// Sends a priority element: no credit needed, ahead of everything queued.
    pub fn send_priority(&mut self, element: StreamElement<T>) -> Result<(), NetworkError> {
        self.raw
            .send_priority(Box::new(element))
            .map_err(|(_, e)| e)
    }

    /// Waits for a credit, then sends.
    pub async fn send(&mut self, element: StreamElement<T>) -> Result<(), NetworkError> {
        poll_fn(|cx| self.raw.poll_ready(cx)).await?;
        self.raw.start_send(Box::new(element)).map_err(|(_, e)| e)
    }
}

/// The consumer's typed end of a channel.
pub struct Receiver<T> {
    id: ChannelId,
    raw: Box<dyn RawReceiver>,
    _t: PhantomData<fn() -> T>,
}

impl<T: Data> Receiver<T> {
    /// Wraps a raw end.
    pub fn new(id: ChannelId, raw: Box<dyn RawReceiver>) -> Self {
        Receiver {
            id,
            raw,
            _t: PhantomData,
        }
    }

    /// The channel.
    pub fn id(&self) -> ChannelId {
        self.id
    }

    /// The next element with its priority facts; `None` when the producer closed.
    pub fn poll_delivery(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Delivery<StreamElement<T>>, NetworkError>>> {
        match self.raw.poll_recv(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(e))),
            Poll::Ready(Some(Ok(d))) => Poll::Ready(Some(
                d.element
                    .downcast::<StreamElement<T>>()
                    .map(|b| Delivery {
                        element: *b,
                        overtook: d.overtook,
                    })
                    .map_err(|_| NetworkError::TypeMismatch(self.id)),
            )),
        }
    }

    /// The next element; `None` when the producer closed.
    pub fn poll_recv(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<StreamElement<T>, NetworkError>>> {
        self.poll_delivery(cx)
            .map(|o| o.map(|r| r.map(|d| d.element)))
    }

    /// Waits for the next element with its priority facts.
    pub async fn recv_delivery(
        &mut self,
    ) -> Option<Result<Delivery<StreamElement<T>>, NetworkError>> {
        poll_fn(|cx| self.poll_delivery(cx)).await
    }

    /// Waits for the next element.
    pub async fn recv(&mut self) -> Option<Result<StreamElement<T>, NetworkError>> {
        poll_fn(|cx| self.poll_recv(cx)).await
    }
}

/// Opens a typed producer end.
pub fn open_output<T: Data>(
    transport: &dyn crate::Transport,
    id: ChannelId,
) -> Result<Sender<T>, NetworkError> {
    Ok(Sender::new(
        id,
        transport.open_output(id, ElementCodec::of::<T>())?,
    ))
}

/// Opens a typed consumer end.
pub fn open_input<T: Data>(
    transport: &dyn crate::Transport,
    id: ChannelId,
) -> Result<Receiver<T>, NetworkError> {
    Ok(Receiver::new(
        id,
        transport.open_input(id, ElementCodec::of::<T>())?,
    ))
}
