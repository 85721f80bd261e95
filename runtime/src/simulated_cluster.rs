//! Task managers under a deterministic simulation: a job of one process places each
//! deployment's subtasks on the simulation's task managers as the cluster's job master does
//! ([`crate::placement::place_on_slots`]), waits for enough slots up to the slot timeout
//! ([`JobError::NoResources`] after it, which the restart strategy retries), and acts out the
//! loss of a task manager the simulation decides: a crash (its subtasks end at once and their
//! channels close, as a connection resets) or a freeze (stuck or cut off: they make no progress
//! and say nothing), noticed after the heartbeat timeout as
//! [`TaskError::TaskManagerLost`], the report the cluster's job master sends when its
//! membership loses a task manager, and a replacement with the same slots after a delay.

use crate::error::{JobError, TaskError};
use crate::gateway::{Running, SubtaskControl};
use crate::placement::{place_on_slots, slots_needed};
use crate::task::{TaskEvent, TaskReport};
use std::sync::{Arc, Mutex, PoisonError};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use weir_checkpoint::coordinator::TaskKey;
use weir_core::graph::JobGraph;
use weir_core::sim::{Observed, SimulatedCluster, TaskManagerLoss};

/// The simulated task managers of a job of one process.
pub(crate) struct SimulatedTaskManagers {
    cluster: SimulatedCluster,
    /// Per task manager: until when it is gone (lost, its replacement not yet registered).
    gone_until: Arc<Mutex<Vec<Option<Instant>>>>,
    /// The current deployment's pending losses.
    losses: Vec<JoinHandle<()>>,
}

impl SimulatedTaskManagers {
    /// The task managers of the simulation running on this thread, if it places subtasks on
    /// any.
    pub fn of_simulation() -> Option<SimulatedTaskManagers> {
        let cluster = weir_core::sim::cluster()?;
        let gone_until = Arc::new(Mutex::new(vec![None; cluster.slots.len()]));
        Some(SimulatedTaskManagers {
            cluster,
            gone_until,
            losses: Vec::new(),
        })
    }

    /// Where each subtask of `job` runs (its task manager's index), once the task managers
    /// present offer enough slots; [`JobError::NoResources`] if they do not within the slot
    /// timeout.
    pub async fn place(&mut self, job: &JobGraph) -> Result<Vec<(TaskKey, usize)>, JobError> {
        self.disarm();
        let needed = slots_needed(job);
        let give_up = Instant::now() + self.cluster.slot_timeout;
        loop {
            let now = Instant::now();
            let (slots, back) = {
                let gone = self
                    .gone_until
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner);
                let present = |tm: usize| gone[tm].is_none_or(|until| until <= now);
                let slots: Vec<usize> = (0..gone.len())
                    .filter(|tm| present(*tm))
                    .flat_map(|tm| (0..self.cluster.slots[tm]).map(move |_| tm))
                    .collect();
                let back = gone.iter().flatten().filter(|u| **u > now).min().copied();
                (slots, back)
            };
            if slots.len() >= needed {
                return Ok(place_on_slots(job, &slots));
            }
            match back {
                Some(back) if back <= give_up => tokio::time::sleep_until(back).await,
                _ => {
                    tokio::time::sleep_until(give_up).await;
                    weir_core::sim::observe(Observed::NoResources);
                    return Err(JobError::NoResources(format!(
                        "the job needs {needed} slots, and within {:?} the registered task \
                         managers offer {}",
                        self.cluster.slot_timeout,
                        slots.len()
                    )));
                }
            }
        }
    }

    /// Asks the simulation, for each task manager given subtasks of `generation` (in order),
    /// whether it is lost while it runs them, and arms each loss.
    pub fn arm(
        &mut self,
        generation: u64,
        running: &Running,
        placed: &[(TaskKey, usize)],
        reports: &mpsc::UnboundedSender<TaskReport>,
    ) {
        for tm in 0..self.cluster.slots.len() {
            let tasks: Vec<TaskKey> = placed
                .iter()
                .filter(|(_, t)| *t == tm)
                .map(|(k, _)| *k)
                .collect();
            let Some(&first) = tasks.first() else {
                continue;
            };
            let Some(loss) = weir_core::sim::task_manager_loss(tm) else {
                continue;
            };
            let controls: Vec<SubtaskControl> =
                tasks.iter().filter_map(|t| running.control(*t)).collect();
            let lost = Lost {
                tm,
                generation,
                first,
                loss,
                controls,
                gone_until: self.gone_until.clone(),
                reports: reports.clone(),
            };
            self.losses.push(tokio::spawn(lost.act_out()));
        }
    }

    /// The deployment is stopped: a loss still to come no longer happens. One that happened
    /// keeps its task manager gone until its replacement, and the job master still hears of it
    /// after the heartbeat timeout (while it waits for the stop, as the cluster's does).
    pub fn disarm(&mut self) {
        for l in self.losses.drain(..) {
            l.abort();
        }
    }
}

impl Drop for SimulatedTaskManagers {
    fn drop(&mut self) {
        self.disarm();
    }
}

/// One task manager's loss, to act out.
struct Lost {
    tm: usize,
    generation: u64,
    /// The subtask whose failure reports the loss.
    first: TaskKey,
    loss: TaskManagerLoss,
    controls: Vec<SubtaskControl>,
    gone_until: Arc<Mutex<Vec<Option<Instant>>>>,
    reports: mpsc::UnboundedSender<TaskReport>,
}

impl Lost {
    async fn act_out(self) {
        let Lost {
            tm, loss, first, ..
        } = self;
        tokio::time::sleep(loss.after).await;
        self.gone_until
            .lock()
            .unwrap_or_else(PoisonError::into_inner)[tm] =
            Some(Instant::now() + loss.replaced_after);
        weir_core::sim::observe(Observed::TaskManagerLost {
            task_manager: tm,
            crash: loss.crash,
        });
        weir_core::sim::record(format_args!(
            "its {} subtasks of generation {} stop; a replacement registers in {:?}",
            self.controls.len(),
            self.generation,
            loss.replaced_after
        ));
        for c in &self.controls {
            if loss.crash {
                c.kill();
            } else {
                c.freeze();
            }
        }
        // Noticed after the heartbeat timeout even if the deployment is stopped meanwhile: not
        // one of the losses `disarm` aborts.
        let (generation, reports) = (self.generation, self.reports);
        tokio::spawn(async move {
            tokio::time::sleep(loss.detected_after).await;
            weir_core::sim::record(format_args!(
                "the job master notices task manager {tm} is lost"
            ));
            let _ = reports.send(TaskReport {
                generation,
                task: first,
                event: TaskEvent::Failed(TaskError::TaskManagerLost {
                    task_manager: format!("{tm} (simulated)"),
                    reason: format!("no heartbeat for {:?}", loss.detected_after),
                }),
            });
        });
    }
}
