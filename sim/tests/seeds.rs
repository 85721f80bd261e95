//! The CI budget of the deterministic simulation: every schedule of the first 1,000 seeds keeps
//! every invariant (`cargo xtask chaos sim --seeds N` runs more).

#[test]
fn the_first_thousand_seeds_keep_every_invariant() {
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get());
    let report = weir_sim::run_seeds(0, 1_000, None, threads);
    assert_eq!(report.runs, 1_000);
    // The schedules do what they are for: they fail tasks, restart and complete checkpoints.
    assert!(report.failures > 300, "{} task failures", report.failures);
    assert!(report.restarts > 300, "{} restarts", report.restarts);
    assert!(
        report.checkpoints > 5_000,
        "{} checkpoints",
        report.checkpoints
    );
    // Task managers are lost both ways, and deployments wait for their replacements past the
    // slot timeout.
    let (crashed, cut_off) = report.task_managers_lost;
    assert!(crashed > 30, "{crashed} task managers crashed");
    assert!(cut_off > 30, "{cut_off} task managers cut off");
    assert!(
        report.no_resources > 3,
        "{} deployments short of slots",
        report.no_resources
    );
    if let Some(o) = report.failed.first() {
        panic!(
            "{} of 1,000 schedules broke an invariant; the first, seed {}:\n  {}\nreplay: {}\n{}",
            report.failed.len(),
            o.scenario.seed,
            o.violations.join("\n  "),
            o.replay_command(),
            o.trace.join("\n")
        );
    }
}
