//! The Kafka source's split enumerator (Flink's `KafkaSourceEnumerator`): it runs in the job
//! master, learns the topics' partitions from a discovery thread, and hands each partition, once,
//! to the reader that owns it. Its decisions are pure: the discovery thread is the only I/O.

use crate::split::{
    KafkaSplit, SplitStart, StartingOffsets, StoppingOffsets, TopicPartition, decode, encode, owner,
};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, mpsc};
use std::time::Duration;
use weir_runtime::TaskError;
use weir_runtime::source::{SplitAssignment, SplitEnumerator};

/// Lists the partitions of the source's topics (a metadata request).
pub type ListPartitions = Box<dyn Fn() -> Result<Vec<TopicPartition>, String> + Send>;

/// What the enumerator checkpoints.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
struct EnumeratorState {
    /// Every partition ever discovered: each is in `unassigned` or in exactly one reader's
    /// state.
    known: BTreeSet<TopicPartition>,
    /// Discovered, not handed out yet.
    unassigned: BTreeMap<TopicPartition, KafkaSplit>,
    /// The first discovery happened: later partitions start at their earliest offset.
    initial_done: bool,
}

/// The partitions the discovery thread saw last.
#[derive(Default)]
struct Discovered {
    partitions: Option<Vec<TopicPartition>>,
    error: Option<String>,
}

/// The enumerator; see the module doc.
pub struct KafkaSplitEnumerator {
    parallelism: u32,
    starting: StartingOffsets,
    stopping: StoppingOffsets,
    state: EnumeratorState,
    discovered: Arc<Mutex<Discovered>>,
    /// Dropping it stops the discovery thread.
    _stop: Option<mpsc::Sender<()>>,
}

impl KafkaSplitEnumerator {
    /// An enumerator for `parallelism` readers, fed by `list` every `interval` (once, for a
    /// bounded source) on a thread of its own.
    pub fn new(
        parallelism: u32,
        starting: StartingOffsets,
        stopping: StoppingOffsets,
        list: ListPartitions,
        interval: Duration,
    ) -> Self {
        let discovered = Arc::new(Mutex::new(Discovered::default()));
        let (stop, stopped) = mpsc::channel::<()>();
        let shared = discovered.clone();
        let once = stopping != StoppingOffsets::Never;
        let spawned = std::thread::Builder::new()
            .name("kafka-discovery".into())
            .spawn(move || discover(list, &shared, interval, once, &stopped));
        if let Err(e) = spawned {
            discovered.lock().unwrap_or_else(|p| p.into_inner()).error =
                Some(format!("cannot start the partition discovery thread: {e}"));
        }
        KafkaSplitEnumerator {
            parallelism: parallelism.max(1),
            starting,
            stopping,
            state: EnumeratorState::default(),
            discovered,
            _stop: Some(stop),
        }
    }

    /// An enumerator without discovery, fed by [`discovered`](Self::discovered) (tests).
    #[cfg(test)]
    fn manual(parallelism: u32, starting: StartingOffsets, stopping: StoppingOffsets) -> Self {
        KafkaSplitEnumerator {
            parallelism,
            starting,
            stopping,
            state: EnumeratorState::default(),
            discovered: Arc::new(Mutex::new(Discovered::default())),
            _stop: None,
        }
    }

    /// Takes in a discovery's result: partitions not seen before become unassigned splits.
    fn take_in(&mut self, partitions: Vec<TopicPartition>) {
        let start = if self.state.initial_done {
            // Flink's rule: a partition that appears later starts at its beginning, so nothing
            // written to it before it was seen is missed.
            StartingOffsets::Earliest
        } else {
            self.starting
        };
        for tp in partitions {
            if self.state.known.insert(tp.clone()) {
                let split = KafkaSplit {
                    tp: tp.clone(),
                    start: SplitStart::Initial(start),
                    stop: None,
                    stop_at_latest: self.stopping == StoppingOffsets::Latest,
                };
                self.state.unassigned.insert(tp, split);
            }
        }
        self.state.initial_done = true;
    }

    /// The last discovery's result, once.
    fn latest(&self) -> Option<Vec<TopicPartition>> {
        let mut d = self.discovered.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(e) = d.error.take() {
            tracing::warn!(error = %e, "Kafka partition discovery failed");
        }
        d.partitions.take()
    }
}

/// The discovery loop: lists the partitions now and every `interval` (once when `once`) until
/// the enumerator is dropped.
fn discover(
    list: ListPartitions,
    shared: &Mutex<Discovered>,
    interval: Duration,
    once: bool,
    stopped: &mpsc::Receiver<()>,
) {
    loop {
        let found = list();
        let ok = found.is_ok();
        {
            let mut d = shared.lock().unwrap_or_else(|p| p.into_inner());
            match found {
                Ok(partitions) => d.partitions = Some(partitions),
                Err(e) => d.error = Some(e),
            }
        }
        // A failed first listing is retried soon, whatever the interval.
        let wait = if ok {
            interval
        } else {
            interval.min(Duration::from_secs(1))
        };
        if ok && once {
            return;
        }
        match stopped.recv_timeout(wait) {
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            _ => return,
        }
    }
}

impl SplitEnumerator for KafkaSplitEnumerator {
    fn assign(&mut self, subtask: u32) -> SplitAssignment {
        if let Some(partitions) = self.latest() {
            self.take_in(partitions);
        }
        let mine: Vec<TopicPartition> = self
            .state
            .unassigned
            .keys()
            .filter(|tp| owner(tp, self.parallelism) == subtask)
            .cloned()
            .collect();
        let splits: Vec<Vec<u8>> = mine
            .iter()
            .filter_map(|tp| self.state.unassigned.remove(tp))
            .map(|s| encode(&s))
            .collect();
        // A bounded source lists its partitions once: after that, a reader with nothing new
        // is done.
        if splits.is_empty() && self.state.initial_done && self.stopping != StoppingOffsets::Never {
            return SplitAssignment::NoMoreSplits;
        }
        SplitAssignment::Splits(splits)
    }

    fn snapshot(&self) -> Result<Vec<u8>, TaskError> {
        Ok(encode(&self.state))
    }

    fn restore(&mut self, state: Option<&[u8]>) -> Result<(), TaskError> {
        let Some(bytes) = state else {
            // Without it, every partition would look new and be read again from its start.
            return Err(crate::source_error(
                "the checkpoint has the Kafka source but no state of its split enumerator: \
                 restoring would read every partition again"
                    .into(),
            ));
        };
        self.state = decode(bytes, "split enumerator state").map_err(crate::source_error)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tps(topic: &str, n: i32) -> Vec<TopicPartition> {
        (0..n)
            .map(|partition| TopicPartition {
                topic: topic.into(),
                partition,
            })
            .collect()
    }

    fn splits(a: SplitAssignment) -> Vec<KafkaSplit> {
        match a {
            SplitAssignment::Splits(s) => s.iter().map(|b| decode(b, "split").unwrap()).collect(),
            SplitAssignment::NoMoreSplits => panic!("no more splits"),
        }
    }

    fn feed(e: &KafkaSplitEnumerator, partitions: Vec<TopicPartition>) {
        e.discovered.lock().unwrap().partitions = Some(partitions);
    }

    #[test]
    fn each_partition_goes_once_to_its_owner_and_later_ones_start_at_the_beginning() {
        let mut e =
            KafkaSplitEnumerator::manual(2, StartingOffsets::Latest, StoppingOffsets::Never);
        // Nothing discovered yet: an empty answer, not the end.
        assert_eq!(e.assign(0), SplitAssignment::Splits(vec![]));
        feed(&e, tps("in", 4));
        let first = splits(e.assign(0));
        let second = splits(e.assign(1));
        assert_eq!(first.len() + second.len(), 4);
        assert!(first.iter().all(|s| owner(&s.tp, 2) == 0));
        assert!(
            first
                .iter()
                .chain(&second)
                .all(|s| s.start == SplitStart::Initial(StartingOffsets::Latest))
        );
        // Asked again: nothing new.
        assert!(splits(e.assign(0)).is_empty());
        // A checkpoint, then a partition appears; a restored enumerator hands out only it.
        let snapshot = e.snapshot().unwrap();
        let mut restored =
            KafkaSplitEnumerator::manual(3, StartingOffsets::Latest, StoppingOffsets::Never);
        restored.restore(Some(&snapshot)).unwrap();
        feed(&restored, tps("in", 5));
        let new: Vec<KafkaSplit> = (0..3).flat_map(|s| splits(restored.assign(s))).collect();
        assert_eq!(new.len(), 1);
        assert_eq!(new[0].tp.partition, 4);
        assert_eq!(new[0].start, SplitStart::Initial(StartingOffsets::Earliest));
    }

    #[test]
    fn a_bounded_source_ends_once_its_partitions_are_out() {
        let mut e =
            KafkaSplitEnumerator::manual(1, StartingOffsets::Earliest, StoppingOffsets::Latest);
        assert_eq!(e.assign(0), SplitAssignment::Splits(vec![]));
        feed(&e, tps("in", 2));
        let s = splits(e.assign(0));
        assert_eq!(s.len(), 2);
        assert!(s.iter().all(|s| s.stop_at_latest));
        assert_eq!(e.assign(0), SplitAssignment::NoMoreSplits);
    }

    #[test]
    fn a_restore_without_enumerator_state_or_with_damaged_state_fails() {
        let mut e =
            KafkaSplitEnumerator::manual(1, StartingOffsets::Earliest, StoppingOffsets::Never);
        assert!(e.restore(None).is_err());
        let err = e.restore(Some(&[1, 0xff, 0xff])).unwrap_err();
        assert!(err.to_string().contains("enumerator"), "{err}");
    }
}
