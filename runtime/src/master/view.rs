//! What the job master tells its client about the job, for the REST API and the metrics: the
//! job's description before it runs (its graph and configuration) and each restore.

use super::snapshots::wall_ms;
use crate::job::{JobClient, JobView, RestoreView};
use crate::restore::RestorePoint;
use crate::spec::JobSpec;
use weir_core::ids::JobId;

/// What a job's view says before it runs: who it is, its graph and its configuration.
pub(super) fn describe(v: &mut JobView, spec: &JobSpec, job_id: JobId) {
    let config = &spec.config;
    v.job_id = job_id.to_string();
    v.name = config.job_name.clone();
    v.state = "RUNNING";
    v.start_time_ms = wall_ms();
    v.vertices = spec
        .job
        .vertices
        .iter()
        .map(|x| (x.id.0, x.name.clone(), x.parallelism))
        .collect();
    v.source_vertices = spec
        .job
        .vertices
        .iter()
        .filter(|x| x.is_source)
        .map(|x| x.id.0)
        .collect();
    v.edges = spec
        .job
        .edges
        .iter()
        .map(|e| (e.source.0, e.target.0, e.partitioner.name()))
        .collect();
    v.checkpoint_config = Some(config.checkpoint.clone());
    v.state_backend = config.state_backend.name();
    v.checkpoint_storage = match &config.storage {
        crate::config::StorageConfig::Filesystem(p) => p.display().to_string(),
        // The bucket and prefix only: never the credentials or the endpoint's user part.
        crate::config::StorageConfig::S3(s3) => format!("s3://{}/{}", s3.bucket, s3.prefix),
        crate::config::StorageConfig::Memory => "memory".into(),
        crate::config::StorageConfig::Custom(_) => "custom".into(),
        crate::config::StorageConfig::Registered(url) => weir_core::redact::redact_url(url),
    };
}

/// A restore from `point` begins.
pub(super) fn restoring(client: &JobClient, point: &RestorePoint) {
    let restore = RestoreView {
        checkpoint_id: point.metadata.checkpoint_id.0,
        path: point.describe(),
        is_savepoint: point.metadata.kind != weir_core::element::SnapshotKind::Checkpoint,
        timestamp_ms: wall_ms(),
    };
    client.update_view(|v| {
        v.last_restore = Some(restore);
        v.restores += 1;
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What the REST API shows of the checkpoint storage names no credential.
    #[test]
    fn a_job_s_view_shows_no_credentials() {
        let env = crate::StreamEnvironment::new();
        let _ = env.from_collection(vec![1u64]).collect();
        let mut spec = env.into_spec().unwrap();
        spec.config.storage = crate::config::StorageConfig::S3(crate::S3Config {
            endpoint: Some("http://user:pw@127.0.0.1:9".into()),
            region: "us-east-1".into(),
            bucket: "bucket".into(),
            prefix: "prefix".into(),
            access_key_id: Some("AKIDSECRETID".into()),
            secret_access_key: Some("SECRETKEY".into()),
            session_token: Some("SESSIONTOKEN".into()),
            path_style: true,
        });
        let mut view = crate::job::JobView::default();
        describe(&mut view, &spec, JobId(7));
        let shown = format!("{view:?}");
        for secret in ["AKIDSECRETID", "SECRETKEY", "SESSIONTOKEN", "pw"] {
            assert!(!shown.contains(secret), "{secret} in {shown}");
        }
        assert_eq!(view.checkpoint_storage, "s3://bucket/prefix");
        spec.config.storage =
            crate::config::StorageConfig::Registered("mine://key:secret@host/root".into());
        describe(&mut view, &spec, JobId(7));
        assert_eq!(view.checkpoint_storage, "mine://host/root");
    }
}
