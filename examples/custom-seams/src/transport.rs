//! A user's transport layer: [`CountingTransport`] wraps the engine's transport (given to the
//! layer `env.set_transport` takes), counts the channels each deployment generation opens and
//! the elements sent, and forwards everything else unchanged.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use weir_network::{
    AnyElement, ChannelId, ElementCodec, NetworkError, RawReceiver, RawSender, Transport,
};

/// Ends opened in one deployment generation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Opened {
    /// Producer ends (`open_output`).
    pub outputs: u64,
    /// Consumer ends (`open_input`).
    pub inputs: u64,
}

/// What every [`CountingTransport`] sharing these counters has done.
#[derive(Debug, Default)]
pub struct TransportCounters {
    /// Ends opened, per deployment generation (one per attempt of the job).
    opened: Mutex<BTreeMap<u64, Opened>>,
    /// Elements (batches and events) sent in order, each using a credit.
    pub elements_sent: AtomicU64,
    /// Priority elements sent (unaligned checkpoint barriers).
    pub priority_sent: AtomicU64,
    /// `release_before` calls (one per failover).
    pub releases: AtomicU64,
}

impl TransportCounters {
    /// Ends opened, per deployment generation.
    pub fn opened(&self) -> BTreeMap<u64, Opened> {
        self.opened
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Channels opened over all generations (producer ends: each channel has one).
    pub fn channels(&self) -> u64 {
        self.opened().values().map(|o| o.outputs).sum()
    }

    fn open(&self, generation: u64, output: bool) {
        let mut opened = self.opened.lock().unwrap_or_else(PoisonError::into_inner);
        let entry = opened.entry(generation).or_default();
        if output {
            entry.outputs += 1;
        } else {
            entry.inputs += 1;
        }
    }

    /// `transport_channels=… transport_generations=… …`, as the job's summary line prints it.
    pub fn summary(&self) -> String {
        let opened = self.opened();
        let inputs: u64 = opened.values().map(|o| o.inputs).sum();
        format!(
            "transport_channels={} transport_inputs={inputs} transport_generations={} \
             transport_elements={} transport_priority={} transport_releases={}",
            self.channels(),
            opened.len(),
            self.elements_sent.load(Ordering::SeqCst),
            self.priority_sent.load(Ordering::SeqCst),
            self.releases.load(Ordering::SeqCst)
        )
    }
}

/// A [`Transport`] layer: counts into [`TransportCounters`], then does exactly what `inner`
/// does (every method of the trait forwarded; producer ends wrapped to count what they send).
pub struct CountingTransport {
    inner: Arc<dyn Transport>,
    counters: Arc<TransportCounters>,
}

impl fmt::Debug for CountingTransport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CountingTransport")
            .field("counters", &self.counters)
            .finish()
    }
}

impl CountingTransport {
    /// `inner`, counted into `counters`.
    pub fn new(inner: Arc<dyn Transport>, counters: Arc<TransportCounters>) -> CountingTransport {
        CountingTransport { inner, counters }
    }

    /// The layer for `env.set_transport(..)`: wraps the engine's transport in a
    /// [`CountingTransport`] counting into `counters`.
    pub fn layer(
        counters: Arc<TransportCounters>,
    ) -> impl Fn(Arc<dyn Transport>) -> Arc<dyn Transport> + Send + Sync + 'static {
        move |own| Arc::new(CountingTransport::new(own, counters.clone())) as Arc<dyn Transport>
    }

    /// What it counts into.
    pub fn counters(&self) -> &Arc<TransportCounters> {
        &self.counters
    }
}

impl Transport for CountingTransport {
    fn open_output(
        &self,
        id: ChannelId,
        codec: ElementCodec,
    ) -> Result<Box<dyn RawSender>, NetworkError> {
        let inner = self.inner.open_output(id, codec)?;
        self.counters.open(id.generation, true);
        Ok(Box::new(CountingSender {
            inner,
            counters: self.counters.clone(),
        }))
    }

    fn open_input(
        &self,
        id: ChannelId,
        codec: ElementCodec,
    ) -> Result<Box<dyn RawReceiver>, NetworkError> {
        let inner = self.inner.open_input(id, codec)?;
        self.counters.open(id.generation, false);
        Ok(inner)
    }

    fn release_before(&self, generation: u64) {
        self.counters.releases.fetch_add(1, Ordering::Relaxed);
        self.inner.release_before(generation);
    }
}

/// A producer end that counts what it sends.
struct CountingSender {
    inner: Box<dyn RawSender>,
    counters: Arc<TransportCounters>,
}

impl RawSender for CountingSender {
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), NetworkError>> {
        self.inner.poll_ready(cx)
    }

    fn start_send(&mut self, element: AnyElement) -> Result<(), (AnyElement, NetworkError)> {
        self.inner.start_send(element)?;
        self.counters.elements_sent.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    fn send_priority(&mut self, element: AnyElement) -> Result<(), (AnyElement, NetworkError)> {
        self.inner.send_priority(element)?;
        self.counters.priority_sent.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}
