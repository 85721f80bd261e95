//! Slot sharing: where each subtask of a job runs, given the slots its task managers offer
//! (the cluster's job master and a simulation's task managers place alike).

use weir_checkpoint::coordinator::TaskKey;
use weir_core::graph::JobGraph;

/// The slots a deployment of `job` needs: slot `i` runs subtask `i` of every vertex (Flink's
/// slot sharing), so as many as its highest parallelism.
pub(crate) fn slots_needed(job: &JobGraph) -> usize {
    job.vertices
        .iter()
        .map(|v| v.parallelism as usize)
        .max()
        .unwrap_or(0)
}

/// Where each subtask of `job` runs, given the offered slots in order: slot `i` runs subtask
/// `i` of every vertex. `slots` holds at least [`slots_needed`].
pub(crate) fn place_on_slots<T: Copy>(job: &JobGraph, slots: &[T]) -> Vec<(TaskKey, T)> {
    let mut placement = Vec::new();
    for v in &job.vertices {
        for (i, slot) in slots.iter().take(v.parallelism as usize).enumerate() {
            let task = TaskKey {
                vertex: v.id,
                subtask: i as u32,
            };
            placement.push((task, *slot));
        }
    }
    placement
}
