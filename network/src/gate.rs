//! The input gate: all channels a consumer subtask reads on one input, polled fairly, each of
//! which can be blocked (Flink's `SingleInputGate`, minus the checkpoint logic that wraps it).

use crate::{Data, NetworkError, Receiver};
use std::future::poll_fn;
use std::task::{Context, Poll};
use weir_core::element::StreamElement;

/// What the gate yields: an element from a channel, or the news that a channel's producer closed.
#[derive(Debug, PartialEq)]
pub enum GateItem<T> {
    /// An element from channel `.0`.
    Element(usize, StreamElement<T>),
    /// A priority element from channel `.0` that overtook `.2` queued elements, which follow it.
    Priority(usize, StreamElement<T>, usize),
    /// Channel `.0` closed: its producer dropped its end. Normal after `EndOfInput`, a producer
    /// failure otherwise.
    Closed(usize),
}

/// A consumer's channels on one input.
pub struct InputGate<T> {
    channels: Vec<Receiver<T>>,
    blocked: Vec<bool>,
    closed: Vec<bool>,
    open: usize,
    next: usize,
}

impl<T: Data> InputGate<T> {
    /// A gate over `channels`; channel `i` is `channels[i]`.
    pub fn new(channels: Vec<Receiver<T>>) -> Self {
        let n = channels.len();
        InputGate {
            channels,
            blocked: vec![false; n],
            closed: vec![false; n],
            open: n,
            next: 0,
        }
    }

    /// The number of channels.
    pub fn num_channels(&self) -> usize {
        self.channels.len()
    }

    /// Stops reading channel `i` until it is unblocked; its producer backs up behind it.
    pub fn block(&mut self, i: usize) {
        self.blocked[i] = true;
    }

    /// Resumes reading channel `i`.
    pub fn unblock(&mut self, i: usize) {
        self.blocked[i] = false;
    }

    /// Resumes reading every channel.
    pub fn unblock_all(&mut self) {
        self.blocked.iter_mut().for_each(|b| *b = false);
    }

    /// Whether channel `i` is blocked.
    pub fn is_blocked(&self, i: usize) -> bool {
        self.blocked[i]
    }

    /// Whether every channel closed.
    pub fn is_finished(&self) -> bool {
        self.open == 0
    }

    /// The next item from any unblocked channel, round-robin; `Ready(None)` once all channels are
    /// closed. Pending while every open channel is blocked.
    pub fn poll_next(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<GateItem<T>, NetworkError>>> {
        let n = self.channels.len();
        if self.open == 0 {
            return Poll::Ready(None);
        }
        for k in 0..n {
            let i = (self.next + k) % n;
            if self.blocked[i] || self.closed[i] {
                continue;
            }
            match self.channels[i].poll_delivery(cx) {
                Poll::Pending => continue,
                Poll::Ready(Some(Ok(d))) => {
                    self.next = (i + 1) % n;
                    return Poll::Ready(Some(Ok(match d.overtook {
                        None => GateItem::Element(i, d.element),
                        Some(k) => GateItem::Priority(i, d.element, k),
                    })));
                }
                Poll::Ready(Some(Err(e))) => return Poll::Ready(Some(Err(e))),
                Poll::Ready(None) => {
                    self.closed[i] = true;
                    self.open -= 1;
                    self.next = (i + 1) % n;
                    return Poll::Ready(Some(Ok(GateItem::Closed(i))));
                }
            }
        }
        Poll::Pending
    }

    /// Reads up to `max` elements of channel `i` that are ready now, whether or not it is
    /// blocked: the elements a priority element overtook, which its transport already holds.
    /// Stops early at the channel's end or when nothing more is ready.
    pub fn take_ready(&mut self, i: usize, max: usize) -> Result<Vec<GateItem<T>>, NetworkError> {
        let waker = futures::task::noop_waker();
        let mut cx = Context::from_waker(&waker);
        let mut out = Vec::new();
        while out.len() < max && !self.closed[i] {
            match self.channels[i].poll_delivery(&mut cx) {
                Poll::Ready(Some(Ok(d))) => out.push(match d.overtook {
                    None => GateItem::Element(i, d.element),
                    Some(k) => GateItem::Priority(i, d.element, k),
                }),
                Poll::Ready(Some(Err(e))) => return Err(e),
                Poll::Ready(None) => {
                    self.closed[i] = true;
                    self.open -= 1;
                    out.push(GateItem::Closed(i));
                }
                Poll::Pending => break,
            }
        }
        Ok(out)
    }

    /// Waits for the next item.
    pub async fn next(&mut self) -> Option<Result<GateItem<T>, NetworkError>> {
        poll_fn(|cx| self.poll_next(cx)).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::channel::{open_input, open_output};
    use crate::{ChannelConfig, ChannelId, LocalTransport};
    use weir_core::ids::EdgeId;

    fn id(p: u32) -> ChannelId {
        ChannelId {
            generation: 0,
            edge: EdgeId(0),
            producer: p,
            consumer: 0,
        }
    }

    #[tokio::test]
    async fn gate_skips_blocked_channels_and_reports_closes() {
        let t = LocalTransport::new(ChannelConfig::default());
        let mut txs = Vec::new();
        let mut rxs = Vec::new();
        for p in 0..2 {
            txs.push(open_output::<u32>(&t, id(p)).unwrap());
            rxs.push(open_input::<u32>(&t, id(p)).unwrap());
        }
        let mut gate = InputGate::new(rxs);
        txs[0].send(StreamElement::Batch(vec![10])).await.unwrap();
        txs[1].send(StreamElement::Batch(vec![20])).await.unwrap();
        gate.block(0);
        assert_eq!(
            gate.next().await.unwrap().unwrap(),
            GateItem::Element(1, StreamElement::Batch(vec![20]))
        );
        let waker = futures::task::noop_waker();
        let mut cx = Context::from_waker(&waker);
        assert!(gate.poll_next(&mut cx).is_pending(), "channel 0 is blocked");
        gate.unblock_all();
        assert_eq!(
            gate.next().await.unwrap().unwrap(),
            GateItem::Element(0, StreamElement::Batch(vec![10]))
        );
        txs.clear();
        let mut closed = vec![];
        while let Some(item) = gate.next().await {
            match item.unwrap() {
                GateItem::Closed(i) => closed.push(i),
                other => panic!("unexpected {other:?}"),
            }
        }
        closed.sort();
        assert_eq!(closed, [0, 1]);
        assert!(gate.is_finished());
    }
}
