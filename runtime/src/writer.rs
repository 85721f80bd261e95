//! The record writer: the end of a chain branch that feeds a network exchange. It partitions
//! records into per-channel batches, queues full batches and events, and sends them as credits
//! allow (Flink's `RecordWriter` + `ResultPartition`).

use crate::error::TaskError;
use crate::operator::{Lifecycle, OpResult, Output, RestoreContext};
use std::collections::VecDeque;
use std::sync::Arc;
use std::task::{Context, Poll};
use weir_core::channel_state::{ChannelDirection, ChannelInfo, ChannelSection};
use weir_core::element::{CheckpointBarrier, Event, StreamElement, Watermark};
use weir_core::keygroup::KeyGroupAssigner;
use weir_core::partition::RoundRobin;
use weir_network::{Data, Sender};

/// A record's key hash (its Java `hashCode`), for hash partitioning.
pub type KeyHashFn<T> = Arc<dyn Fn(&T) -> i32 + Send + Sync>;

/// How the writer picks channels.
pub enum ChannelSelector<T> {
    /// Subtask i → channel 0 (the one consumer with the same index).
    Forward,
    /// Round-robin.
    Rebalance(RoundRobin),
    /// By key group.
    Hash {
        /// The key hash.
        key_hash: KeyHashFn<T>,
        /// The consumer's max parallelism.
        max_parallelism: u32,
    },
    /// Every channel.
    Broadcast,
}

/// Writes records and events to the channels of one exchange.
pub struct RecordWriter<T> {
    channels: Vec<Sender<T>>,
    /// What each channel is called in channel state.
    infos: Vec<ChannelInfo>,
    selector: ChannelSelector<T>,
    /// A hash exchange's key groups over the channels, without a division per record.
    assigner: KeyGroupAssigner,
    buffers: Vec<Vec<T>>,
    queued: Vec<VecDeque<StreamElement<T>>>,
    batch_size: usize,
    any_queued: bool,
}

impl<T: Data> RecordWriter<T> {
    /// A writer over `channels` (channel `i` goes to consumer subtask `i`; for forward edges,
    /// the single channel to the same-index consumer).
    pub fn new(
        channels: Vec<Sender<T>>,
        infos: Vec<ChannelInfo>,
        selector: ChannelSelector<T>,
        batch_size: usize,
    ) -> Self {
        let n = channels.len();
        debug_assert_eq!(infos.len(), n);
        let max_parallelism = match &selector {
            ChannelSelector::Hash {
                max_parallelism, ..
            } => *max_parallelism,
            _ => 1,
        };
        RecordWriter {
            assigner: KeyGroupAssigner::new(max_parallelism.max(1), (n as u32).max(1)),
            channels,
            infos,
            selector,
            buffers: (0..n).map(|_| Vec::with_capacity(batch_size)).collect(),
            queued: (0..n).map(|_| VecDeque::new()).collect(),
            batch_size: batch_size.max(1),
            any_queued: false,
        }
    }

    #[inline]
    fn add(&mut self, channel: usize, record: T) {
        let buf = &mut self.buffers[channel];
        buf.push(record);
        if buf.len() >= self.batch_size {
            self.queue_full(channel);
        }
    }

    /// Channel `channel`'s batch is full: it is queued, and a new one begun.
    #[inline(never)]
    fn queue_full(&mut self, channel: usize) {
        let full = std::mem::replace(
            &mut self.buffers[channel],
            Vec::with_capacity(self.batch_size),
        );
        self.queued[channel].push_back(StreamElement::Batch(full));
        self.any_queued = true;
    }

    /// Every record of `batch` to the one channel, in order: a whole batch as it is when no
    /// partial one is waiting.
    fn add_batch(&mut self, batch: Vec<T>) {
        if self.buffers[0].is_empty() && batch.len() == self.batch_size {
            self.queued[0].push_back(StreamElement::Batch(batch));
            self.any_queued = true;
            return;
        }
        for record in batch {
            self.add(0, record);
        }
    }

    fn flush_partial(&mut self) {
        for (buf, q) in self.buffers.iter_mut().zip(&mut self.queued) {
            if !buf.is_empty() {
                let cap = buf.len().max(16);
                q.push_back(StreamElement::Batch(std::mem::replace(
                    buf,
                    Vec::with_capacity(cap),
                )));
                self.any_queued = true;
            }
        }
    }

    /// Unaligned step 2: the barrier overtakes everything queued (including partly filled
    /// batches), which becomes this writer's output channel state.
    fn emit_priority_barrier(
        &mut self,
        barrier: CheckpointBarrier,
        sections: &mut Vec<ChannelSection>,
    ) -> OpResult {
        self.flush_partial();
        for ((ch, q), info) in self.channels.iter_mut().zip(&self.queued).zip(&self.infos) {
            let mut section = ChannelSection::new(ChannelDirection::Output, *info);
            for e in q {
                if let StreamElement::Batch(batch) = e {
                    section.append_batch(batch)?;
                }
            }
            if section.records > 0 {
                sections.push(section);
            }
            ch.send_priority(StreamElement::Event(Event::Barrier(barrier)))?;
        }
        Ok(())
    }

    /// Queues the output channel state of a restored unaligned checkpoint ahead of anything new.
    fn restore_in_flight(&mut self, ctx: &mut RestoreContext) -> OpResult {
        for (c, info) in self.infos.iter().enumerate() {
            for section in ctx.take_in_flight(ChannelDirection::Output, info) {
                for batch in section.batches::<T>()? {
                    self.queued[c].push_back(StreamElement::Batch(batch));
                    self.any_queued = true;
                }
            }
        }
        Ok(())
    }

    fn broadcast_event(&mut self, event: Event) {
        self.flush_partial();
        for q in &mut self.queued {
            q.push_back(StreamElement::Event(event.clone()));
        }
        self.any_queued = true;
    }
}

impl<T: Data> Output<T> for RecordWriter<T> {
    #[inline]
    fn push(&mut self, record: T) -> OpResult {
        let assigner = self.assigner;
        match &mut self.selector {
            ChannelSelector::Forward => self.add(0, record),
            ChannelSelector::Rebalance(rr) => {
                let c = rr.next_channel() as usize;
                self.add(c, record);
            }
            ChannelSelector::Hash { key_hash, .. } => {
                let c = assigner.operator_index(assigner.key_group_for_hash(key_hash(&record)));
                self.add(c as usize, record);
            }
            ChannelSelector::Broadcast => {
                for c in 0..self.channels.len() {
                    self.add(c, record.clone());
                }
            }
        }
        Ok(())
    }

    /// A batch: the selector is matched once, and a hash exchange computes each record's
    /// channel in one loop. With one channel (a forward edge, or any exchange to one consumer)
    /// every record goes there: no key is hashed, and a batch that fills one is queued as it is.
    fn push_batch(&mut self, batch: Vec<T>) -> OpResult {
        if self.channels.len() == 1 {
            self.add_batch(batch);
            return Ok(());
        }
        if let ChannelSelector::Hash { key_hash, .. } = &self.selector {
            let (key_hash, assigner) = (Arc::clone(key_hash), self.assigner);
            for record in batch {
                let c = assigner.operator_index(assigner.key_group_for_hash(key_hash(&record)));
                self.add(c as usize, record);
            }
            return Ok(());
        }
        for record in batch {
            self.push(record)?;
        }
        Ok(())
    }

    fn watermark(&mut self, watermark: Watermark) -> OpResult {
        self.broadcast_event(Event::Watermark(watermark));
        Ok(())
    }

    fn watermark_status(&mut self, status: weir_core::element::WatermarkStatus) -> OpResult {
        self.broadcast_event(Event::WatermarkStatus(status));
        Ok(())
    }

    fn lifecycle(&mut self, event: &mut Lifecycle<'_>) -> OpResult {
        match event {
            Lifecycle::Open(ctx) => self.restore_in_flight(ctx)?,
            Lifecycle::EmitBarrier(b) => self.broadcast_event(Event::Barrier(*b)),
            Lifecycle::EmitPriorityBarrier(b, sections) => {
                self.emit_priority_barrier(*b, sections)?
            }
            Lifecycle::EmitCancelMarker(id) => self.broadcast_event(Event::CancelCheckpoint(*id)),
            Lifecycle::EndInput => self.broadcast_event(Event::EndOfInput),
            Lifecycle::FlushPartial => self.flush_partial(),
            _ => {}
        }
        Ok(())
    }

    fn poll_flush(&mut self, cx: &mut Context<'_>) -> Poll<OpResult> {
        if !self.any_queued {
            return Poll::Ready(Ok(()));
        }
        let mut pending = false;
        for (ch, q) in self.channels.iter_mut().zip(&mut self.queued) {
            while !q.is_empty() {
                match ch.poll_ready(cx) {
                    Poll::Ready(Ok(())) => {
                        if let Some(e) = q.pop_front()
                            && let Err(e) = ch.start_send(e)
                        {
                            return Poll::Ready(Err(TaskError::Network(e)));
                        }
                    }
                    Poll::Ready(Err(e)) => return Poll::Ready(Err(TaskError::Network(e))),
                    Poll::Pending => {
                        pending = true;
                        break;
                    }
                }
            }
        }
        if pending {
            Poll::Pending
        } else {
            self.any_queued = false;
            Poll::Ready(Ok(()))
        }
    }
}
