//! One seed, one schedule: a seed replayed gives the same decisions at the same virtual times
//! (the digest), the same trace and the same outcome, in this process and on another thread.

use weir_sim::run_seed;

#[test]
fn a_seed_replays_bit_for_bit() {
    for seed in [3, 17, 85, 121, 404] {
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
    }
}

#[test]
fn different_seeds_give_different_schedules() {
    let digests: std::collections::BTreeSet<u64> =
        (0..20).map(|seed| run_seed(seed, None).digest).collect();
    assert_eq!(digests.len(), 20);
}
