//! The seeds that found real bugs (docs/simulation.md, "Bugs it found") keep every invariant.
//! A seed's schedule changes when the code it runs changes, so these are a floor, not a proof:
//! the pure decisions each fix touched have unit tests beside them.

/// Each seed, with the bug it found.
const FOUND: [(u64, &str); 14] = [
    (
        20,
        "a transient frame read reported as corruption; a resume failing for good",
    ),
    (
        95,
        "a transient read during a restore falling back to an older checkpoint",
    ),
    (230, "the end of a job's output not covered by a checkpoint"),
    (262, "intermediate savepoints committing side effects"),
    (
        427,
        "a task manager crashing before its sinks' final commit: output lost",
    ),
    (1121, "a lost completion hanging a stop-with-savepoint"),
    (
        1961,
        "a task manager cut off as the final checkpoint completed: the job declared finished",
    ),
    (2181, "a resume failing for good on one throttled listing"),
    (2446, "a lost abort hanging a stop-with-savepoint"),
    (
        5622,
        "unaligned in-flight data lost behind a read-ahead barrier",
    ),
    (
        10009,
        "a failure after a completed stop failing over to an older checkpoint",
    ),
    (
        12211,
        "a discard cut short leaving a complete checkpoint without its files",
    ),
    (15611, "two savepoints sharing a directory"),
    (
        25095,
        "a finished task snapshotting a checkpoint it had passed by",
    ),
];

#[test]
fn the_seeds_that_found_bugs_keep_every_invariant() {
    let mut broken = Vec::new();
    for (seed, bug) in FOUND {
        let o = weir_sim::run_seed(seed, None);
        if !o.passed() {
            broken.push(format!("seed {seed} ({bug}): {:?}", o.violations));
        }
    }
    assert!(broken.is_empty(), "{broken:#?}");
}
