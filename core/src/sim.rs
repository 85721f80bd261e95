//! The hooks through which a deterministic simulation steers a job's production code: the
//! clock, injected task failures, lost or late messages, scheduling pauses and deliberate
//! protocol bugs. With no [`Simulator`] installed on the thread (every real run), each hook
//! answers "as usual" after one thread-local read.
//!
//! A simulation (`weir-sim`) runs a whole job on one thread, under a tokio runtime whose clock
//! is paused and advanced only when every task waits, and installs a seeded [`Simulator`] on
//! that thread: one seed, one schedule. The runtime asks it at the points named by
//! [`FaultPoint`] and [`Message`], and the barrier handlers, the upload, the master and the
//! restore ask [`mutated`] whether to act out one of the [`Mutation`]s, which exist only in
//! debug builds with the `mutations` feature, never in a release build. A simulation may also
//! place the subtasks on task managers ([`cluster`]) and lose them ([`task_manager_loss`]).

use std::cell::RefCell;
use std::rc::Rc;
use std::time::Duration;

/// Where a subtask may be made to fail.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum FaultPoint {
    /// A checkpoint's barrier reached the subtask; its synchronous snapshot has not run.
    BeforeSnapshot,
    /// The synchronous snapshot ran; its barrier is out and the upload not started.
    AfterSnapshot,
    /// The asynchronous part: the state is serialized and being uploaded.
    Upload,
    /// A barrier arrived on one channel while others are still awaited (alignment).
    Alignment,
    /// The subtask restores its state (at its `Open`).
    Restore,
    /// The subtask processed a batch of records.
    Records,
}

/// A control message a simulation may lose or delay.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Message {
    /// A subtask's acknowledgement of a checkpoint, to the job master.
    Acknowledge,
    /// The job master's notification that a checkpoint completed, to a subtask.
    NotifyComplete,
    /// The job master's notification that a checkpoint was aborted, to a subtask.
    NotifyAborted,
}

/// What becomes of a control message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Delivery {
    /// Sent now.
    Now,
    /// Sent after this much (virtual) time.
    Late(Duration),
    /// Never sent.
    Lost,
}

/// A deliberate protocol bug, acted out only when a simulation selects it (debug builds with the
/// `mutations` feature): the simulation must find each within its seed budget.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Mutation {
    /// A subtask acknowledges a checkpoint before its state files are durable.
    AckBeforeDurable,
    /// The aligned barrier handler unblocks a channel before the alignment completes.
    UnblockBeforeAligned,
    /// The job master notifies completion before the checkpoint's `_metadata` is written.
    NotifyBeforeMetadata,
    /// A restore takes a checkpoint that has no `_metadata`.
    RestoreWithoutMetadata,
    /// An unaligned checkpoint drops one input channel's in-flight data.
    DropInFlight,
}

impl Mutation {
    /// Every mutation, in a stable order.
    pub const ALL: [Mutation; 5] = [
        Mutation::AckBeforeDurable,
        Mutation::UnblockBeforeAligned,
        Mutation::NotifyBeforeMetadata,
        Mutation::RestoreWithoutMetadata,
        Mutation::DropInFlight,
    ];

    /// Its name on the command line (`--mutation ack-before-durable`).
    pub fn name(self) -> &'static str {
        match self {
            Mutation::AckBeforeDurable => "ack-before-durable",
            Mutation::UnblockBeforeAligned => "unblock-before-aligned",
            Mutation::NotifyBeforeMetadata => "notify-before-metadata",
            Mutation::RestoreWithoutMetadata => "restore-without-metadata",
            Mutation::DropInFlight => "drop-in-flight",
        }
    }

    /// The mutation named `name`.
    pub fn from_name(name: &str) -> Option<Mutation> {
        Mutation::ALL.into_iter().find(|m| m.name() == name)
    }
}

/// The task managers a simulated job's subtasks run on, as a session cluster would offer them:
/// slot `i` runs subtask `i` of every vertex, as the cluster's placement does.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SimulatedCluster {
    /// Each task manager's slots, in registration order.
    pub slots: Vec<u32>,
    /// How long a deployment waits for enough slots before it fails for want of resources.
    pub slot_timeout: Duration,
}

/// How a simulated task manager is lost while it runs a deployment's subtasks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TaskManagerLoss {
    /// After its deployment.
    pub after: Duration,
    /// Its process dies (its subtasks end at once, their connections close); otherwise it is
    /// cut off or stuck: its subtasks stop making progress and say nothing.
    pub crash: bool,
    /// Until the job master notices (the heartbeat timeout).
    pub detected_after: Duration,
    /// Until a replacement registers with the same slots, from the loss.
    pub replaced_after: Duration,
}

/// What a simulation decides. Every answer must follow from its seed and the order of the
/// questions alone, so that a run replays bit for bit.
pub trait Simulator {
    /// Wall-clock time since the Unix epoch, in the simulation's virtual time.
    fn wall_clock(&self) -> Duration;
    /// Whether `task` fails at `point`.
    fn fail_at(&self, point: FaultPoint, task: &str) -> bool;
    /// What becomes of `message` from or to `task`.
    fn deliver(&self, message: Message, task: &str) -> Delivery;
    /// How long `task` pauses before its next step, if at all: the simulation's lever on the
    /// order in which tasks run (and so on the interleaving across channels).
    fn pause(&self, task: &str) -> Option<Duration>;
    /// The deliberate bug this run acts out, if any.
    fn mutation(&self) -> Option<Mutation>;
    /// Records an event of the schedule in the run's trace.
    fn record(&self, event: std::fmt::Arguments<'_>);
    /// What the job master did, for the simulation's invariants.
    fn observe(&self, event: Observed);
    /// The task managers the job's subtasks run on; `None`: all in the job's process, none
    /// can be lost apart from it.
    fn cluster(&self) -> Option<SimulatedCluster> {
        None
    }
    /// Whether task manager `task_manager`, given subtasks to run, is lost while it runs them,
    /// and how.
    fn task_manager_loss(&self, task_manager: usize) -> Option<TaskManagerLoss> {
        let _ = task_manager;
        None
    }
}

/// What a job master reports to a simulation as it happens.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Observed {
    /// Checkpoint or savepoint `id`'s `_metadata` was written: it is complete.
    Completed(u64, crate::element::SnapshotKind),
    /// A deployment restores from checkpoint or savepoint `id`.
    Restored(u64),
    /// A deployment starts with no state.
    StartedEmpty,
    /// Task manager `task_manager` is lost: it crashed (or else was cut off).
    TaskManagerLost {
        /// Its index in [`SimulatedCluster::slots`].
        task_manager: usize,
        /// Whether its process died.
        crash: bool,
    },
    /// A deployment found too few slots within the slot timeout (a task manager lost, its
    /// replacement not yet registered).
    NoResources,
    /// A restore found the checkpoint in `checkpoint` (its directory) unusable and falls back.
    Unusable {
        /// The checkpoint's directory.
        checkpoint: String,
        /// Why.
        reason: String,
    },
}

thread_local! {
    static SIMULATOR: RefCell<Option<Rc<dyn Simulator>>> = const { RefCell::new(None) };
}

/// Installs `simulator` on this thread until the returned guard drops.
pub fn install(simulator: Rc<dyn Simulator>) -> Installed {
    let previous = SIMULATOR.with(|s| s.borrow_mut().replace(simulator));
    Installed { previous }
}

/// Keeps a [`Simulator`] installed; dropping it restores what was installed before.
#[must_use = "the simulator is uninstalled when this drops"]
pub struct Installed {
    previous: Option<Rc<dyn Simulator>>,
}

impl Drop for Installed {
    fn drop(&mut self) {
        let previous = self.previous.take();
        SIMULATOR.with(|s| *s.borrow_mut() = previous);
    }
}

fn with<R>(f: impl FnOnce(&dyn Simulator) -> R) -> Option<R> {
    // The simulator is cloned out so that it may itself call a hook.
    let sim = SIMULATOR.with(|s| s.borrow().clone())?;
    Some(f(&*sim))
}

/// Whether a simulation runs on this thread.
pub fn active() -> bool {
    SIMULATOR.with(|s| s.borrow().is_some())
}

/// Wall-clock time since the Unix epoch: the simulation's virtual time if one runs here.
pub fn wall_clock() -> Duration {
    with(|s| s.wall_clock()).unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
    })
}

/// Whether `task` must fail at `point` (never outside a simulation).
pub fn fail_at(point: FaultPoint, task: &str) -> bool {
    with(|s| s.fail_at(point, task)).unwrap_or(false)
}

/// What becomes of `message` from or to `task` ([`Delivery::Now`] outside a simulation).
pub fn deliver(message: Message, task: &str) -> Delivery {
    with(|s| s.deliver(message, task)).unwrap_or(Delivery::Now)
}

/// How long `task` pauses before its next step (never outside a simulation).
pub fn pause(task: &str) -> Option<Duration> {
    with(|s| s.pause(task)).flatten()
}

/// The simulated task managers the job's subtasks run on (none outside a simulation).
pub fn cluster() -> Option<SimulatedCluster> {
    with(|s| s.cluster()).flatten()
}

/// Whether simulated task manager `task_manager` is lost while it runs the subtasks it was
/// given, and how (never outside a simulation).
pub fn task_manager_loss(task_manager: usize) -> Option<TaskManagerLoss> {
    with(|s| s.task_manager_loss(task_manager)).flatten()
}

/// Tells the simulation what the job master did (nothing outside a simulation).
pub fn observe(event: Observed) {
    with(|s| s.observe(event));
}

/// Records an event in the simulation's trace (nothing outside a simulation).
pub fn record(event: std::fmt::Arguments<'_>) {
    with(|s| s.record(event));
}

/// Whether this run acts out `mutation`: only in a debug build with the `mutations` feature,
/// under a simulation that selected it.
#[inline]
pub fn mutated(mutation: Mutation) -> bool {
    #[cfg(all(feature = "mutations", debug_assertions))]
    {
        with(|s| s.mutation() == Some(mutation)).unwrap_or(false)
    }
    #[cfg(not(all(feature = "mutations", debug_assertions)))]
    {
        let _ = mutation;
        false
    }
}

/// Whether this build can act out mutations at all (a debug build with `mutations`).
pub const MUTATIONS_BUILT_IN: bool = cfg!(all(feature = "mutations", debug_assertions));

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    struct Fixed {
        fails: Cell<u32>,
    }

    impl Simulator for Fixed {
        fn wall_clock(&self) -> Duration {
            Duration::from_secs(7)
        }
        fn fail_at(&self, point: FaultPoint, _: &str) -> bool {
            self.fails.set(self.fails.get() + 1);
            point == FaultPoint::Upload
        }
        fn deliver(&self, _: Message, _: &str) -> Delivery {
            Delivery::Lost
        }
        fn pause(&self, _: &str) -> Option<Duration> {
            Some(Duration::from_millis(3))
        }
        fn mutation(&self) -> Option<Mutation> {
            Some(Mutation::DropInFlight)
        }
        fn record(&self, _: std::fmt::Arguments<'_>) {}
        fn observe(&self, _: Observed) {}
    }

    #[test]
    fn hooks_answer_as_usual_without_a_simulator_and_ask_it_while_installed() {
        assert!(!active());
        assert!(!fail_at(FaultPoint::Upload, "t"));
        assert_eq!(deliver(Message::Acknowledge, "t"), Delivery::Now);
        assert_eq!(pause("t"), None);
        assert!(wall_clock() > Duration::from_secs(1_700_000_000));
        {
            let sim = Rc::new(Fixed {
                fails: Cell::new(0),
            });
            let _installed = install(sim.clone());
            assert!(active());
            assert!(fail_at(FaultPoint::Upload, "t"));
            assert!(!fail_at(FaultPoint::Restore, "t"));
            assert_eq!(sim.fails.get(), 2);
            assert_eq!(deliver(Message::NotifyComplete, "t"), Delivery::Lost);
            assert_eq!(pause("t"), Some(Duration::from_millis(3)));
            assert_eq!(wall_clock(), Duration::from_secs(7));
            assert_eq!(mutated(Mutation::DropInFlight), MUTATIONS_BUILT_IN);
            assert!(!mutated(Mutation::AckBeforeDurable));
        }
        assert!(!active());
    }

    #[test]
    fn mutations_round_trip_their_names() {
        for m in Mutation::ALL {
            assert_eq!(Mutation::from_name(m.name()), Some(m));
        }
        assert_eq!(Mutation::from_name("nope"), None);
    }
}
