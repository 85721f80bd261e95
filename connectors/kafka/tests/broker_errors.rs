//! Broker errors injected by the mock cluster while the job runs (failed produce, transaction
//! and fetch requests, a broker down and back): the output is still exactly once.

use crate::support::{Cluster, block_on, expected};
use std::time::Duration;
use weir_kafka::rdkafka::types::{RDKafkaApiKey, RDKafkaRespErr};
use weir_kafka::word_count::{build, check_exactly_once};
use weir_runtime::JobStatus;

#[test]
fn request_errors_and_a_broker_down_leave_the_output_exactly_once() {
    use RDKafkaRespErr::*;
    let cluster = Cluster::new(4);
    let n = 200_000;
    cluster.produce(n);
    let dir = tempfile::tempdir().unwrap();
    let mut opts = cluster.options(dir.path());
    opts.checkpoint_interval = Some(Duration::from_millis(200));
    let built = build(&opts).unwrap();
    let mock = &cluster.mock;
    let execution = built.env.execute();
    let job = std::thread::scope(|s| {
        let job = s.spawn(|| block_on(execution));
        std::thread::sleep(Duration::from_millis(300));
        mock.request_errors(
            RDKafkaApiKey::Produce,
            &[RD_KAFKA_RESP_ERR_NOT_ENOUGH_REPLICAS; 4],
        );
        mock.request_errors(
            RDKafkaApiKey::AddPartitionsToTxn,
            &[RD_KAFKA_RESP_ERR_COORDINATOR_LOAD_IN_PROGRESS; 2],
        );
        mock.request_errors(
            RDKafkaApiKey::EndTxn,
            &[RD_KAFKA_RESP_ERR_NOT_COORDINATOR; 2],
        );
        mock.request_errors(
            RDKafkaApiKey::Fetch,
            &[RD_KAFKA_RESP_ERR_NOT_LEADER_FOR_PARTITION; 3],
        );
        std::thread::sleep(Duration::from_millis(300));
        mock.broker_down(2).unwrap();
        std::thread::sleep(Duration::from_millis(1500));
        mock.broker_up(2).unwrap();
        job.join().unwrap()
    });
    assert_eq!(job.unwrap().status, JobStatus::Finished);
    check_exactly_once(&cluster.output(), &expected(n)).unwrap();
}
