//! A job's data transport is the user's choice (`StreamEnvironment::set_transport`): a layer
//! that counts the channels opened per deployment generation sees every exchange of the first
//! run and again of the restored one after a failure, and the totals stay exact; a layer that
//! replaces the engine's transport with another carries the whole job. Uses only the public
//! API.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;
use support::{Bounded, Failures, assert_resumed};

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use weir_network::{
    ChannelConfig, ChannelId, ElementCodec, LocalTransport, NetworkError, RawReceiver, RawSender,
    Transport,
};
use weir_runtime::{JobStatus, RestartStrategy, StreamEnvironment};

const RECORDS: u64 = 300_000;
const KEYS: u64 = 13;

/// Counts the ends opened per generation, then delegates.
struct Counting {
    inner: Arc<dyn Transport>,
    /// Per generation: (outputs, inputs).
    opened: Mutex<BTreeMap<u64, (u64, u64)>>,
}

impl Transport for Counting {
    fn open_output(
        &self,
        id: ChannelId,
        codec: ElementCodec,
    ) -> Result<Box<dyn RawSender>, NetworkError> {
        self.opened
            .lock()
            .unwrap()
            .entry(id.generation)
            .or_default()
            .0 += 1;
        self.inner.open_output(id, codec)
    }

    fn open_input(
        &self,
        id: ChannelId,
        codec: ElementCodec,
    ) -> Result<Box<dyn RawReceiver>, NetworkError> {
        self.opened
            .lock()
            .unwrap()
            .entry(id.generation)
            .or_default()
            .1 += 1;
        self.inner.open_input(id, codec)
    }

    fn release_before(&self, generation: u64) {
        self.inner.release_before(generation);
    }
}

/// source → (key, 1) → key_by → sum → latest per key, parallelism 2: 2 × 2 channels over the
/// keyed exchange per generation.
fn job(
    dir: &std::path::Path,
    failures: &Arc<Failures>,
) -> (StreamEnvironment, weir_runtime::LatestHandle<u64, i64>) {
    let env = StreamEnvironment::new();
    env.set_job_name("transport-layer")
        .set_parallelism(2)
        .set_checkpoint_dir(dir)
        .enable_checkpointing(Duration::from_millis(10))
        .set_restart_strategy(RestartStrategy::FixedDelay {
            attempts: 2,
            delay: Duration::ZERO,
        });
    let totals = env
        .from_generator(Some(RECORDS), |i| i)
        .inject_failures(failures)
        .map(|i: u64| (i % KEYS, 1i64))
        .key_by(|t: &(u64, i64)| &t.0)
        .sum()
        .reinterpret_as_keyed(|t: &(u64, i64)| &t.0)
        .latest_per_key();
    (env, totals)
}

fn expected() -> BTreeMap<u64, i64> {
    let mut m = BTreeMap::new();
    for i in 0..RECORDS {
        *m.entry(i % KEYS).or_insert(0) += 1;
    }
    m
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_counting_layer_sees_every_generations_channels_and_the_job_stays_exact() {
    let counting: Arc<Mutex<Option<Arc<Counting>>>> = Arc::default();
    let tmp = tempfile::tempdir().unwrap();
    let failures = Failures::paced(vec![RECORDS / 2], 2_000);
    let (env, totals) = job(tmp.path(), &failures);
    let c = counting.clone();
    env.set_transport(move |own| {
        let layer = Arc::new(Counting {
            inner: own,
            opened: Mutex::default(),
        });
        *c.lock().unwrap() = Some(layer.clone());
        layer
    });
    let r = env.execute().bounded().await.unwrap();
    assert_eq!(r.status, JobStatus::Finished);
    assert_eq!(r.restarts, 1);
    assert_eq!(totals.get(), expected());
    assert_resumed(&r, RECORDS, "through the counting transport");
    let layer = counting
        .lock()
        .unwrap()
        .clone()
        .expect("the layer was applied");
    let opened = layer.opened.lock().unwrap().clone();
    // Two generations (the first, and the one restored after the failure), each opening both
    // ends of the keyed exchange's 2 × 2 channels.
    assert_eq!(opened.len(), 2, "{opened:?}");
    assert!(
        opened.values().all(|&(o, i)| o == 4 && i == 4),
        "{opened:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_layer_may_replace_the_engines_transport() {
    let tmp = tempfile::tempdir().unwrap();
    let (env, totals) = job(tmp.path(), &Failures::at(Vec::new()));
    let used: Arc<Mutex<Option<Arc<Counting>>>> = Arc::default();
    let u = used.clone();
    env.set_transport(move |_own| {
        let replacement = Arc::new(Counting {
            inner: Arc::new(LocalTransport::new(ChannelConfig {
                buffers_per_channel: 2,
            })),
            opened: Mutex::default(),
        });
        *u.lock().unwrap() = Some(replacement.clone());
        replacement
    });
    let r = env.execute().bounded().await.unwrap();
    assert_eq!(r.status, JobStatus::Finished);
    assert_eq!(totals.get(), expected());
    let replacement = used.lock().unwrap().clone().unwrap();
    assert_eq!(replacement.opened.lock().unwrap().len(), 1);
}
