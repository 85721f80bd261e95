//! Which task managers belong to the cluster and which stopped answering: registration and
//! heartbeat timeouts as a pure state machine, with time an argument (Flink's
//! `HeartbeatManager` and the resource manager's task manager registry, on the job manager's
//! side).

pub use crate::job::PastJob;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::time::Duration;

/// A registered task manager, numbered by the job manager in registration order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct TaskManagerId(pub u64);

impl fmt::Display for TaskManagerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "tm-{}", self.0)
    }
}

/// What a task manager tells the job manager when it registers.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskManagerInfo {
    /// A name for logs (host and process id by default).
    pub name: String,
    /// Slots it offers: how many subtasks of each vertex it can run.
    pub slots: u32,
    /// Where its data transport listens, for the channels of its subtasks.
    pub data_addr: SocketAddr,
    /// Its operating-system process id.
    pub pid: u32,
    /// A fingerprint of the job graph it built from its program and job arguments, which must
    /// be the job manager's; `None` for a task manager that runs no job of its own (tests).
    pub job: Option<u128>,
    /// The version of the task protocol it speaks ([`super::TASK_PROTOCOL_VERSION`]).
    pub protocol: u8,
    /// The jobs it ran before, newest last (a standing task manager's memory of the cluster's
    /// jobs, which the job manager lists beside its own).
    pub past_jobs: Vec<PastJob>,
}

/// A change of membership.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MembershipEvent {
    /// A task manager registered.
    Registered {
        /// Its id.
        id: TaskManagerId,
        /// What it offers.
        info: TaskManagerInfo,
    },
    /// A task manager sent no heartbeat for longer than the timeout: it is gone, and its
    /// subtasks with it.
    Lost {
        /// Its id.
        id: TaskManagerId,
        /// What it offered.
        info: TaskManagerInfo,
        /// How long it had been silent when the loss was noticed.
        silent_for: Duration,
    },
    /// A task manager left on its own (a clean shutdown).
    Left {
        /// Its id.
        id: TaskManagerId,
        /// What it offered.
        info: TaskManagerInfo,
    },
}

/// A heartbeat or departure from a task manager the job manager does not know: never
/// registered, or already declared lost. It must stop its subtasks and register again.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("task manager {0} is not registered (never, or declared lost after its heartbeat timeout)")]
pub struct UnknownTaskManager(pub TaskManagerId);

#[derive(Clone, Debug)]
struct Member {
    info: TaskManagerInfo,
    last_seen: Duration,
}

/// The registered task managers and their last heartbeats.
#[derive(Clone, Debug)]
pub struct Membership {
    timeout: Duration,
    next_id: u64,
    members: BTreeMap<TaskManagerId, Member>,
}

impl Membership {
    /// No task manager yet; one silent for longer than `timeout` is lost.
    pub fn new(timeout: Duration) -> Membership {
        Membership {
            timeout,
            next_id: 1,
            members: BTreeMap::new(),
        }
    }

    /// The heartbeat timeout.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// A task manager registers at `now`: it gets a new id (a task manager that comes back
    /// after being lost is a new member).
    pub fn register(&mut self, info: TaskManagerInfo, now: Duration) -> MembershipEvent {
        let id = TaskManagerId(self.next_id);
        self.next_id += 1;
        self.members.insert(
            id,
            Member {
                info: info.clone(),
                last_seen: now,
            },
        );
        MembershipEvent::Registered { id, info }
    }

    /// A heartbeat from `id` at `now`.
    pub fn heartbeat(
        &mut self,
        id: TaskManagerId,
        now: Duration,
    ) -> Result<(), UnknownTaskManager> {
        let member = self.members.get_mut(&id).ok_or(UnknownTaskManager(id))?;
        member.last_seen = member.last_seen.max(now);
        Ok(())
    }

    /// `id` leaves on its own.
    pub fn leave(&mut self, id: TaskManagerId) -> Result<MembershipEvent, UnknownTaskManager> {
        let member = self.members.remove(&id).ok_or(UnknownTaskManager(id))?;
        Ok(MembershipEvent::Left {
            id,
            info: member.info,
        })
    }

    /// Declares lost, and removes, every task manager silent for longer than the timeout at
    /// `now`.
    pub fn tick(&mut self, now: Duration) -> Vec<MembershipEvent> {
        let timeout = self.timeout;
        let lost: Vec<TaskManagerId> = self
            .members
            .iter()
            .filter(|(_, m)| now.saturating_sub(m.last_seen) > timeout)
            .map(|(id, _)| *id)
            .collect();
        lost.into_iter()
            .filter_map(|id| {
                let member = self.members.remove(&id)?;
                Some(MembershipEvent::Lost {
                    id,
                    silent_for: now.saturating_sub(member.last_seen),
                    info: member.info,
                })
            })
            .collect()
    }

    /// When the next loss can be noticed, if there is any member: call [`tick`](Self::tick)
    /// then (or earlier).
    pub fn next_deadline(&self) -> Option<Duration> {
        self.members
            .values()
            .map(|m| m.last_seen.saturating_add(self.timeout))
            .min()
    }

    /// The registered task managers, by id.
    pub fn members(&self) -> impl Iterator<Item = (TaskManagerId, &TaskManagerInfo)> {
        self.members.iter().map(|(id, m)| (*id, &m.info))
    }

    /// Whether `id` is registered.
    pub fn contains(&self, id: TaskManagerId) -> bool {
        self.members.contains_key(&id)
    }

    /// Slots over every registered task manager.
    pub fn total_slots(&self) -> u32 {
        self.members.values().map(|m| m.info.slots).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(name: &str, slots: u32) -> TaskManagerInfo {
        TaskManagerInfo {
            name: name.to_string(),
            slots,
            data_addr: "127.0.0.1:7000".parse().unwrap_or_else(|_| unreachable!()),
            pid: 1,
            job: None,
            protocol: crate::cluster::TASK_PROTOCOL_VERSION,
            past_jobs: Vec::new(),
        }
    }

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn a_silent_task_manager_is_lost_after_the_timeout_and_only_then() {
        let mut m = Membership::new(ms(500));
        let a = match m.register(info("a", 2), ms(0)) {
            MembershipEvent::Registered { id, .. } => id,
            other => panic!("{other:?}"),
        };
        let b = match m.register(info("b", 2), ms(100)) {
            MembershipEvent::Registered { id, .. } => id,
            other => panic!("{other:?}"),
        };
        assert_ne!(a, b);
        assert_eq!(m.total_slots(), 4);
        assert_eq!(m.next_deadline(), Some(ms(500)));
        // b keeps beating, a falls silent.
        for t in (200..=1000).step_by(200) {
            m.heartbeat(b, ms(t)).unwrap_or_else(|e| panic!("{e}"));
            let lost = m.tick(ms(t));
            if t <= 500 {
                assert!(lost.is_empty(), "at {t} ms: {lost:?}");
            } else if t == 600 {
                assert_eq!(
                    lost,
                    vec![MembershipEvent::Lost {
                        id: a,
                        info: info("a", 2),
                        silent_for: ms(600),
                    }]
                );
            } else {
                assert!(lost.is_empty(), "at {t} ms: {lost:?}");
            }
        }
        assert_eq!(m.members().map(|(id, _)| id).collect::<Vec<_>>(), [b]);
        // A lost member's heartbeat is refused: it must register again, under a new id.
        assert_eq!(m.heartbeat(a, ms(1000)), Err(UnknownTaskManager(a)));
        match m.register(info("a", 2), ms(1000)) {
            MembershipEvent::Registered { id, .. } => assert!(id > b),
            other => panic!("{other:?}"),
        }
        assert!(matches!(m.leave(b), Ok(MembershipEvent::Left { id, .. }) if id == b));
        assert_eq!(m.leave(b), Err(UnknownTaskManager(b)));
    }

    #[test]
    fn late_heartbeats_do_not_move_time_back() {
        let mut m = Membership::new(ms(100));
        let MembershipEvent::Registered { id, .. } = m.register(info("a", 1), ms(50)) else {
            panic!("expected a registration")
        };
        m.heartbeat(id, ms(120)).unwrap_or_else(|e| panic!("{e}"));
        m.heartbeat(id, ms(60)).unwrap_or_else(|e| panic!("{e}"));
        assert!(m.tick(ms(220)).is_empty());
        assert_eq!(m.tick(ms(221)).len(), 1);
        assert_eq!(m.next_deadline(), None);
    }
}
