//! `cargo xtask bench [name]`: the named benchmarks, the binaries each builds, and running one.

use crate::bench::{Bench, backpressure, network, state, state_disk};
use crate::{bench_kafka, bench_nexmark, bench_wordcount};
use anyhow::{Result, bail};
use std::path::Path;

/// A named benchmark: a function of the [`Bench`] context.
struct Named {
    name: &'static str,
    what: &'static str,
    /// The arguments of the `cargo build --release ...` that makes its binary.
    build: &'static [&'static str],
    run: fn(&Bench) -> Result<()>,
}

/// Builds the `word_count` binary, as the README's first command does (default features).
/// With it, the bare loop the `wordcount` benchmark compares it with.
const WORD_COUNT: &[&str] = &[
    "-p",
    "weir-examples",
    "--bin",
    "word_count",
    "--bin",
    "bare_loop",
];

/// Builds the `word_count` binary with cluster mode.
const WORD_COUNT_CLUSTER: &[&str] = &[
    "-p",
    "weir-examples",
    "--bin",
    "word_count",
    "--features",
    "weir-examples/cluster",
];

/// The named benchmarks; the first is the default.
const BENCHES: &[Named] = &[
    Named {
        name: "wordcount",
        what: "word_count throughput with and without checkpoints, checkpoint latency, recovery time",
        build: WORD_COUNT,
        run: bench_wordcount::wordcount,
    },
    Named {
        name: "backpressure",
        what: "checkpoints under backpressure (a sink busy 2us per record): aligned, unaligned, alternating",
        build: WORD_COUNT,
        run: backpressure,
    },
    Named {
        name: "network",
        what: "word_count at p=4 on two task managers over TCP (a job manager and two task managers, separate processes, loopback) against one process; bytes per record on the wire",
        build: WORD_COUNT_CLUSTER,
        run: network,
    },
    Named {
        name: "state-disk",
        what: "disk keyed-state backend against heap at 1M, 10M and 50M keys: write and read speed, checkpoint sync pause, incremental bytes, recovery with and without local files, RSS, state size; word_count --key-space 10000000 on disk against heap",
        build: &[
            "-p",
            "weir-state",
            "--example",
            "state_disk_bench",
            "-p",
            "weir-examples",
            "--bin",
            "word_count",
        ],
        run: state_disk,
    },
    Named {
        name: "nexmark",
        what: "Nexmark q0-q5, q7, q8, q11 at p=1 and p=2, 10M events, 1 s checkpoints: events per core-second against nexmark-flink's published Flink figures",
        build: &["-p", "weir-nexmark", "--bin", "nexmark"],
        run: bench_nexmark::nexmark,
    },
    Named {
        name: "kafka",
        what: "kafka_word_count on librdkafka's mock cluster at p=2 with 1 s checkpoints: exactly-once against at-least-once records/s, and end-to-end latency p50/p99",
        build: &["-p", "weir-kafka", "--bin", "kafka_word_count"],
        run: |b| bench_kafka::kafka(&b.kafka_word_count, &b.scratch),
    },
    Named {
        name: "state",
        what: "heap keyed-state backend at 1M and 10M keys: checkpoint pause, copy-on-write, write and restore speed",
        build: &["-p", "weir-state", "--example", "state_bench"],
        run: state,
    },
];

/// The benchmark names, for the usage text.
pub fn names() -> Vec<&'static str> {
    BENCHES.iter().map(|b| b.name).collect()
}

/// Runs the benchmark called `args[0]` (default: the first in [`BENCHES`]).
pub fn run(root: &Path, args: &[String]) -> Result<()> {
    let name = args.first().map_or(BENCHES[0].name, String::as_str);
    let Some(bench) = BENCHES.iter().find(|b| b.name == name) else {
        bail!("unknown benchmark `{name}`; known: {}", names().join(", "));
    };
    if args.len() > 1 {
        bail!("bench takes at most one argument (a benchmark name)");
    }
    let mut build = crate::cargo(root);
    build.args(["build", "--release"]).args(bench.build);
    crate::run_cmd(build)?;
    let target = crate::tidy::target_dir(root)?;
    let release = target.join("release");
    let ctx = Bench {
        word_count: release.join("word_count"),
        bare_loop: release.join("bare_loop"),
        nexmark: release.join("nexmark"),
        kafka_word_count: release.join("kafka_word_count"),
        state_bench: release.join("examples").join("state_bench"),
        state_disk_bench: release.join("examples").join("state_disk_bench"),
        scratch: target.join("xtask-bench"),
    };
    println!("\nbench `{name}`: {}\n", bench.what);
    (bench.run)(&ctx)
}
