//! Bad input: an unreachable cluster and a missing topic are named before the job starts, and a
//! record that does not parse fails the job (naming it) or is skipped and counted, by policy.

use crate::support::{Cluster, INPUT, expected, run};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use weir_kafka::rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use weir_kafka::word_count::{build, check_exactly_once};
use weir_kafka::{Connection, ParseErrorPolicy};
use weir_runtime::JobStatus;

#[test]
fn an_unreachable_cluster_is_named_within_the_timeout() {
    let cluster = Cluster::new(1);
    let dir = tempfile::tempdir().unwrap();
    let mut opts = cluster.options(dir.path());
    // A port nothing listens on.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    opts.connection = Connection::new(format!("127.0.0.1:{port}"));
    opts.connection.request_timeout = Duration::from_secs(2);
    let started = Instant::now();
    let err = build(&opts)
        .err()
        .expect("an unreachable cluster must fail the build");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    assert!(
        err.contains("did not answer") && err.contains(&port.to_string()),
        "{err}"
    );
}

#[test]
fn a_missing_topic_is_named() {
    let cluster = Cluster::new(1);
    let dir = tempfile::tempdir().unwrap();
    let mut opts = cluster.options(dir.path());
    opts.input = "no-such-topic".into();
    let err = build(&opts)
        .err()
        .expect("a missing topic must fail the build");
    assert!(err.contains("no-such-topic"), "{err}");
    let mut opts = cluster.options(dir.path());
    opts.output = "no-such-output".into();
    let err = build(&opts)
        .err()
        .expect("a missing output topic must fail the build");
    assert!(err.contains("no-such-output"), "{err}");
}

/// Produces `n` numbers with `garbage` records that are not numbers among them.
fn produce_with_garbage(cluster: &Cluster, n: u64, garbage: &[&str]) {
    cluster.produce(n);
    let producer: BaseProducer = cluster
        .connection
        .client_config()
        .create()
        .expect("a producer");
    for g in garbage {
        producer
            .send(BaseRecord::<(), str>::to(INPUT).payload(*g))
            .expect("send");
    }
    producer.flush(Duration::from_secs(10)).expect("flush");
}

#[test]
fn a_record_that_does_not_parse_fails_the_job_naming_it() {
    let cluster = Cluster::new(1);
    produce_with_garbage(&cluster, 1_000, &["seven"]);
    let dir = tempfile::tempdir().unwrap();
    let built = build(&cluster.options(dir.path())).unwrap();
    built
        .env
        .set_restart_strategy(weir_runtime::RestartStrategy::NoRestart);
    let err = run(built.env).expect_err("the job must fail").to_string();
    assert!(
        err.contains("offset 1000") && err.contains("\"seven\"") && err.contains("numbers-0"),
        "{err}"
    );
}

#[test]
fn records_that_do_not_parse_are_skipped_and_counted_by_policy() {
    let cluster = Cluster::new(1);
    let n = 5_000;
    produce_with_garbage(&cluster, n, &["x", "", "1.5", "\u{fffd}"]);
    let dir = tempfile::tempdir().unwrap();
    let mut opts = cluster.options(dir.path());
    opts.on_parse_error = ParseErrorPolicy::Skip;
    let built = build(&opts).unwrap();
    assert_eq!(run(built.env).unwrap().status, JobStatus::Finished);
    assert_eq!(built.source.records_skipped.load(Ordering::Relaxed), 4);
    check_exactly_once(&cluster.output(), &expected(n)).unwrap();
}
