//! A standing task manager (Flink's session cluster): started with only the job manager's
//! address and its slots, it asks the job manager for its job's arguments, builds the job
//! from them with the program's own code, runs its subtasks, and when the job is over waits
//! for the next job manager at the same address, job after job, until the process is stopped.
//! It remembers the jobs it ran and tells every job manager it registers with, so that the
//! cluster's jobs are listed (`weir list`) whichever job manager runs now.

use super::membership::PastJob;
use super::rpc::JobArguments;
use super::taskexecutor::{graph_fingerprint, serve_job};
use super::taskmanager::TaskManagerSession;
use super::{JobBuilder, TaskManagerOptions};
use crate::cluster::ClusterRole;
use crate::error::JobError;
use std::time::Duration;
use tracing::{info, warn};

/// How long one attempt to reach the job manager lasts; a standing task manager then tries
/// again, for as long as it runs.
const ASK_EVERY: Duration = Duration::from_secs(2);

/// The most past jobs a task manager remembers.
const REMEMBERED: usize = 256;

/// What a standing task manager decides about the job a job manager offers.
#[derive(Debug, PartialEq, Eq)]
enum Offer {
    /// Build and run it.
    Take,
    /// The job this task manager just saw end: its job manager is finishing; wait for the
    /// next.
    Ended,
    /// Another task protocol version: the job manager would refuse this task manager.
    OtherProtocol(u8),
}

fn judge(offer: &JobArguments, ended: Option<&str>) -> Offer {
    if offer.protocol != super::TASK_PROTOCOL_VERSION {
        Offer::OtherProtocol(offer.protocol)
    } else if ended == Some(offer.job_id.as_str()) {
        Offer::Ended
    } else {
        Offer::Take
    }
}

/// Runs a standing task manager with `options` until the process ends: each job the job manager
/// at `options.jobmanager` offers is built by `build` from its arguments and run. Returns only
/// if `options` cannot work (no slots).
pub async fn run_standing_task_manager(
    options: TaskManagerOptions,
    build: JobBuilder,
) -> Result<(), JobError> {
    if options.slots == 0 {
        return Err(JobError::Invalid(
            "a task manager needs at least one slot".into(),
        ));
    }
    let mut past: Vec<PastJob> = Vec::new();
    // The job that ended last, and the last job that could not be built (said once each).
    let mut ended: Option<String> = None;
    let mut refused: Option<String> = None;
    // The last reason no job was offered, said once each (a refusal as a warning).
    let mut waiting: Option<String> = None;
    info!(jobmanager = %options.jobmanager, slots = options.slots, "standing task manager: waiting for jobs");
    loop {
        let offer = match TaskManagerSession::job_arguments(options.jobmanager, ASK_EVERY).await {
            Ok(offer) => offer,
            Err(e) => {
                if waiting.as_deref() != Some(e.reason.as_str()) {
                    if e.reason.starts_with("not reachable") {
                        info!(reason = %e.reason, "waiting for a job manager");
                    } else {
                        warn!(reason = %e.reason, "the job manager offers no job");
                    }
                    waiting = Some(e.reason);
                }
                tokio::time::sleep(ASK_EVERY / 4).await;
                continue;
            }
        };
        waiting = None;
        match judge(&offer, ended.as_deref()) {
            Offer::Take => {}
            Offer::Ended => {
                tokio::time::sleep(ASK_EVERY / 4).await;
                continue;
            }
            Offer::OtherProtocol(theirs) => {
                if refused.as_deref() != Some(offer.job_id.as_str()) {
                    warn!(
                        theirs,
                        ours = super::TASK_PROTOCOL_VERSION,
                        "the job manager speaks another task protocol version: run the same build everywhere"
                    );
                    refused = Some(offer.job_id.clone());
                }
                tokio::time::sleep(ASK_EVERY).await;
                continue;
            }
        }
        let spec = match build_job(&build, &offer, &options) {
            Ok(spec) => spec,
            Err(reason) => {
                if refused.as_deref() != Some(offer.job_id.as_str()) {
                    warn!(job = %offer.job_id, %reason, "cannot run the job manager's job");
                    refused = Some(offer.job_id.clone());
                }
                tokio::time::sleep(ASK_EVERY).await;
                continue;
            }
        };
        info!(job = %offer.job_id, name = %spec.config.job_name, "building the job manager's job");
        // Without rejoining: whoever answers at the address next may run another job with
        // the same graph, so this task manager asks for the job again first.
        let (result, job) = serve_job(spec, &options, past.clone(), false).await;
        if let Some(job) = job {
            info!(job = %job.id, state = %job.state, "job over; waiting for the next");
            past.retain(|p| p.id != job.id);
            past.push(job);
            if past.len() > REMEMBERED {
                past.remove(0);
            }
        }
        match result {
            // Over: its job manager is finishing; the next job is another one.
            Ok(_) => ended = Some(offer.job_id),
            // Lost: if the same job manager answers again, the job is joined again.
            Err(e) => warn!(error = %e, "the task manager left the job"),
        }
    }
}

/// The job `offer` names, built by `build`, as this task manager runs it: checked to be the
/// graph the job manager built (the same program).
fn build_job(
    build: &JobBuilder,
    offer: &JobArguments,
    options: &TaskManagerOptions,
) -> Result<crate::spec::JobSpec, String> {
    let env = build(&offer.args).map_err(|e| {
        format!(
            "its arguments {:?} do not build a job here: {e}",
            offer.args
        )
    })?;
    let mut spec = env.into_spec().map_err(|e| e.to_string())?;
    spec.config.cluster = Some(ClusterRole::TaskManager(options.clone()));
    spec.config.rest = None;
    if graph_fingerprint(&spec.job) != offer.fingerprint {
        return Err(
            "its arguments build another job graph here than the job manager built: \
                    run the same program everywhere"
                .into(),
        );
    }
    Ok(spec)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn offer(job_id: &str, protocol: u8) -> JobArguments {
        JobArguments {
            args: vec!["--records".into(), "10".into()],
            fingerprint: 7,
            job_id: job_id.into(),
            protocol,
        }
    }

    /// A program that builds another graph from the job manager's arguments (another binary)
    /// is refused, naming why; one whose arguments do not parse too.
    #[test]
    fn another_graph_or_bad_arguments_are_refused() {
        let options = TaskManagerOptions::new("127.0.0.1:1".parse().unwrap(), 1);
        let other: JobBuilder = std::sync::Arc::new(|_: &[String]| {
            let env = crate::StreamEnvironment::new();
            let _ = env.from_collection(vec![1u64, 2]).collect();
            Ok(env)
        });
        let err = build_job(&other, &offer("a", 4), &options)
            .err()
            .expect("another graph is refused");
        assert!(err.contains("another job graph"), "{err}");
        let unparsable: JobBuilder = std::sync::Arc::new(|args: &[String]| {
            Err(crate::JobError::Invalid(format!(
                "unknown flag {}",
                args[0]
            )))
        });
        let err = build_job(&unparsable, &offer("a", 4), &options)
            .err()
            .expect("bad arguments are refused");
        assert!(err.contains("unknown flag --records"), "{err}");
    }

    #[test]
    fn a_job_that_ended_is_not_joined_again_and_another_protocol_is_refused() {
        let ours = super::super::TASK_PROTOCOL_VERSION;
        assert_eq!(judge(&offer("a", ours), None), Offer::Take);
        assert_eq!(judge(&offer("a", ours), Some("a")), Offer::Ended);
        assert_eq!(judge(&offer("b", ours), Some("a")), Offer::Take);
        assert_eq!(
            judge(&offer("b", ours + 1), None),
            Offer::OtherProtocol(ours + 1)
        );
    }
}
