//! `word_count` in cluster mode: the role its flags ask for, and a standing task manager (only
//! `--jobmanager` and `--slots` given), which builds each job from the arguments its job
//! manager was started with, job after job.

use super::{Args, Role, job_env};
use anyhow::{Context, Result, bail};
use clap::parser::ValueSource;
use clap::{CommandFactory, FromArgMatches};
use std::sync::Arc;
use std::time::Duration;
use weir_runtime::JobError;
use weir_runtime::cluster::{
    ClusterRole, HeartbeatConfig, JobManagerOptions, TaskManagerOptions, run_standing_task_manager,
};

/// The flags of a task manager itself (and the REST flags, which a task manager, serving no
/// REST API, ignores); any other flag is the job's.
const TASK_MANAGER_FLAGS: [&str; 10] = [
    "jobmanager",
    "slots",
    "data_bind",
    "heartbeat_interval",
    "heartbeat_timeout",
    "slot_timeout",
    "no_rest",
    "rest_address",
    "rest_allow_remote",
    "rest_read_only",
];

/// The flags (clap exits on bad ones, with its usage error), and whether any flag beyond a task
/// manager's own was given.
pub(super) fn parse_args() -> (Args, bool) {
    let command = Args::command();
    let matches = command.clone().get_matches();
    let args = Args::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    // The flags themselves (not the group clap names after the struct).
    let job_given = command.get_arguments().any(|a| {
        let id = a.get_id().as_str();
        !TASK_MANAGER_FLAGS.contains(&id)
            && matches.value_source(id) == Some(ValueSource::CommandLine)
    });
    (args, job_given)
}

/// The cluster role the flags ask for, if any.
pub(super) fn role(args: &Args) -> Result<Option<ClusterRole>> {
    let heartbeat = HeartbeatConfig {
        interval: args.heartbeat_interval,
        timeout: args.heartbeat_timeout,
    };
    match (args.role, args.jobmanager) {
        (Some(_), Some(_)) => bail!("--role jobmanager and --jobmanager exclude each other"),
        (Some(Role::Jobmanager), None) => {
            let listen = args
                .listen
                .context("--role jobmanager needs --listen ADDR, e.g. 127.0.0.1:6123")?;
            heartbeat
                .validate()
                .map_err(anyhow::Error::msg)
                .context("--heartbeat-interval / --heartbeat-timeout")?;
            let mut options = JobManagerOptions::new(listen);
            options.heartbeat = heartbeat;
            options.slot_timeout = args.slot_timeout;
            // Standing task managers build the job from the same arguments (an argument that is
            // not UTF-8 cannot be sent: then only task managers given the job's own arguments
            // can run it).
            options.job_args = std::env::args_os()
                .skip(1)
                .map(std::ffi::OsString::into_string)
                .collect::<Result<Vec<_>, _>>()
                .ok();
            if options.job_args.is_none() {
                eprintln!(
                    "warning: an argument is not UTF-8: standing task managers cannot be sent \
                     this job (start them with the job's own arguments)"
                );
            }
            Ok(Some(ClusterRole::JobManager(options)))
        }
        (None, Some(jobmanager)) => {
            if args.listen.is_some() {
                bail!("--listen is for --role jobmanager; a task manager takes --data-bind");
            }
            let mut options = TaskManagerOptions::new(jobmanager, args.slots);
            options.bind = args.data_bind;
            // A task manager outlives a job manager restart by this much.
            options.connect_timeout = args.heartbeat_timeout.max(Duration::from_secs(30));
            Ok(Some(ClusterRole::TaskManager(options)))
        }
        (None, None) => {
            if args.listen.is_some() {
                bail!("--listen needs --role jobmanager");
            }
            Ok(None)
        }
    }
}

/// A standing task manager with `options`: each job its job manager offers is built from the
/// job manager's arguments, as `word_count` builds its own job.
pub(super) async fn standing(options: TaskManagerOptions) -> Result<(), JobError> {
    let build: weir_runtime::cluster::JobBuilder = Arc::new(|job_args: &[String]| {
        let argv = std::iter::once("word_count".to_string()).chain(job_args.iter().cloned());
        let args = <Args as clap::Parser>::try_parse_from(argv)
            .map_err(|e| JobError::Invalid(e.to_string()))?;
        job_env(&args)
            .map(|(env, _)| env)
            .map_err(|e| JobError::Invalid(format!("{e:#}")))
    });
    run_standing_task_manager(options, build).await
}
