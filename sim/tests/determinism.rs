//! One seed, one schedule: a seed replayed gives the same decisions at the same virtual times
//! (the digest), the same trace and the same outcome, in this process, on another thread and in
//! another process.

use weir_sim::run_seed;

#[test]
fn a_seed_replays_bit_for_bit() {
    // Seed 85 crashes a task manager; seed 341 cuts one off and a deployment waits for slots
    // past the slot timeout (checked below). Which seeds do that changes with the tasks'
    // schedule: `weir-sim --seeds 1 --first-seed S` prints how many deployments were short of
    // slots.
    for seed in [3, 17, 85, 100, 121, 341, 404] {
        let first = run_seed(seed, None);
        let again = run_seed(seed, None);
        let elsewhere = std::thread::spawn(move || run_seed(seed, None))
            .join()
            .expect("the run on another thread");
        assert!(
            first.decisions > 100,
            "seed {seed}: {} decisions",
            first.decisions
        );
        for other in [&again, &elsewhere] {
            assert_eq!(
                first.digest, other.digest,
                "seed {seed}: the decisions differ"
            );
            assert_eq!(first.trace, other.trace, "seed {seed}: the traces differ");
            assert_eq!(first.virtual_time, other.virtual_time);
            assert_eq!(first.checkpoints, other.checkpoints);
            assert_eq!(first.restarts, other.restarts);
        }
        if seed == 341 {
            assert!(
                first.task_managers_lost.1 > 0 && first.no_resources > 0,
                "{first:?}"
            );
        }
    }
}

#[test]
fn different_seeds_give_different_schedules() {
    let digests: std::collections::BTreeSet<u64> =
        (0..20).map(|seed| run_seed(seed, None).digest).collect();
    assert_eq!(digests.len(), 20);
}

#[test]
fn a_seed_replays_in_another_process() {
    let seeds = [85u64, 100, 262, 2446];
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_weir-sim"));
    let out = command
        .args(["--digest", "--seeds", "1", "--first-seed"])
        .arg(seeds[0].to_string())
        .output()
        .expect("weir-sim runs");
    assert!(out.status.success(), "{out:?}");
    let mut printed = String::from_utf8_lossy(&out.stdout).into_owned();
    for seed in &seeds[1..] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_weir-sim"))
            .args(["--digest", "--seeds", "1", "--first-seed"])
            .arg(seed.to_string())
            .output()
            .expect("weir-sim runs");
        assert!(out.status.success(), "{out:?}");
        printed.push_str(&String::from_utf8_lossy(&out.stdout));
    }
    let here: String = seeds
        .iter()
        .map(|&seed| {
            let o = run_seed(seed, None);
            format!(
                "seed {seed} digest {:016x} decisions {}\n",
                o.digest, o.decisions
            )
        })
        .collect();
    assert_eq!(printed, here);
}
