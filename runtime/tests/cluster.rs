//! Cluster control plane across real processes: task managers (this test binary, run again as child processes) register with a job manager over RPC; a SIGKILLed one is declared lost within the heartbeat timeout, a replacement registers, and the survivors notice when the job manager goes.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use weir_runtime::cluster::{
    HeartbeatConfig, JobManagerServer, MembershipEvent, TaskManagerId, TaskManagerInfo,
    TaskManagerSession,
};

/// Set in a child process: the job manager's address to join.
const CHILD_ENV: &str = "WEIR_TEST_TASK_MANAGER_OF";
/// The name the child gives itself.
const NAME_ENV: &str = "WEIR_TEST_TASK_MANAGER_NAME";
/// The exit code of a task manager that lost its job manager.
const LOST_JOB_MANAGER: i32 = 42;

/// A timeout of 30 intervals: a survivor is declared lost only if none of 30 heartbeats got
/// through, which a loaded 2-core machine does not cause (at 12 intervals it could).
const HEARTBEATS: HeartbeatConfig = HeartbeatConfig {
    interval: Duration::from_millis(100),
    timeout: Duration::from_secs(3),
};

/// How long anything may take before the test gives up (generous: the machine is shared).
const BOUND: Duration = Duration::from_secs(30);

/// A task manager process: joins, then sends heartbeats until the job manager is lost, and
/// exits with [`LOST_JOB_MANAGER`].
async fn run_child(jobmanager: SocketAddr) -> ! {
    let name = std::env::var(NAME_ENV).unwrap_or_else(|_| "child".to_string());
    let info = TaskManagerInfo {
        name,
        slots: 2,
        data_addr: "127.0.0.1:0".parse().unwrap(),
        pid: std::process::id(),
        job: None,
        protocol: weir_runtime::cluster::TASK_PROTOCOL_VERSION,
        past_jobs: Vec::new(),
    };
    let session = match TaskManagerSession::join(jobmanager, info, BOUND).await {
        Ok(s) => s,
        Err(e) => {
            eprintln!("task manager: {e}");
            std::process::exit(1);
        }
    };
    let lost = session.heartbeats().await;
    eprintln!("task manager {}: {lost}", session.id());
    std::process::exit(LOST_JOB_MANAGER);
}

/// Starts this test binary again as a task manager of `jobmanager`.
fn spawn_task_manager(jobmanager: SocketAddr, name: &str) -> Child {
    // The harness names a test by its module path without the crate (`cluster::…` in the
    // crate's one test binary).
    let test = "task_managers_in_other_processes_are_lost_and_replaced";
    let test = match module_path!().split_once("::") {
        Some((_, module)) => format!("{module}::{test}"),
        None => test.to_string(),
    };
    Command::new(std::env::current_exe().unwrap())
        .args(["--exact", test.as_str(), "--nocapture"])
        .env(CHILD_ENV, jobmanager.to_string())
        .env(NAME_ENV, name)
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap()
}

/// The next membership event, within [`BOUND`].
async fn next(jm: &mut JobManagerServer) -> MembershipEvent {
    tokio::time::timeout(BOUND, jm.next_event())
        .await
        .expect("a membership event within the bound")
        .expect("the job manager's events ended")
}

async fn registered(jm: &mut JobManagerServer) -> (TaskManagerId, TaskManagerInfo) {
    match next(jm).await {
        MembershipEvent::Registered { id, info } => (id, info),
        other => panic!("expected a registration, got {other:?}"),
    }
}

/// Waits for a child to exit, within [`BOUND`].
fn wait_exit(child: &mut Child) -> std::process::ExitStatus {
    let give_up = Instant::now() + BOUND;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        assert!(Instant::now() < give_up, "a task manager did not exit");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn task_managers_in_other_processes_are_lost_and_replaced() {
    if let Ok(addr) = std::env::var(CHILD_ENV) {
        run_child(addr.parse().unwrap()).await;
    }
    let mut jm = JobManagerServer::start("127.0.0.1:0".parse().unwrap(), HEARTBEATS)
        .await
        .unwrap();
    let addr = jm.local_addr();
    let mut a = spawn_task_manager(addr, "a");
    let mut b = spawn_task_manager(addr, "b");
    let mut ids = std::collections::BTreeMap::new();
    for _ in 0..2 {
        let (id, info) = registered(&mut jm).await;
        assert_eq!(info.slots, 2);
        ids.insert(info.pid, (id, info.name));
    }
    let (a_id, _) = ids[&a.id()].clone();
    let (b_id, _) = ids[&b.id()].clone();

    // SIGKILL a: it is lost after the heartbeat timeout, not before, and b stays.
    a.kill().unwrap();
    let killed = Instant::now();
    a.wait().unwrap();
    match next(&mut jm).await {
        MembershipEvent::Lost { id, silent_for, .. } => {
            assert_eq!(id, a_id, "the killed task manager is the one lost");
            assert!(silent_for > HEARTBEATS.timeout, "{silent_for:?}");
        }
        other => panic!("expected a loss, got {other:?}"),
    }
    // Its last heartbeat came at most an interval before the kill: the loss is declared no
    // sooner than the timeout after it.
    let noticed = killed.elapsed();
    assert!(
        noticed >= HEARTBEATS.timeout - HEARTBEATS.interval,
        "the loss was declared {noticed:?} after the kill, before the timeout"
    );
    assert!(
        noticed < HEARTBEATS.timeout + Duration::from_secs(5),
        "the loss took {noticed:?}"
    );
    let members: Vec<TaskManagerId> = jm.members().into_iter().map(|(id, _)| id).collect();
    assert_eq!(members, [b_id]);

    // A replacement registers under a new id.
    let mut c = spawn_task_manager(addr, "c");
    let (c_id, c_info) = registered(&mut jm).await;
    assert_eq!(c_info.pid, c.id());
    assert!(c_id > b_id);
    assert_eq!(jm.members().len(), 2);

    // The job manager goes: each task manager notices within its timeout and exits.
    drop(jm);
    let gone = Instant::now();
    for child in [&mut b, &mut c] {
        let status = wait_exit(child);
        assert_eq!(status.code(), Some(LOST_JOB_MANAGER), "{status:?}");
    }
    // A task manager gives up one interval before the timeout, counted from its last answered
    // heartbeat (at most an interval before the job manager went).
    assert!(
        gone.elapsed() >= HEARTBEATS.timeout - 2 * HEARTBEATS.interval,
        "a task manager gave up on the job manager after {:?}, before the timeout",
        gone.elapsed()
    );
}

#[tokio::test]
async fn heartbeat_settings_are_checked() {
    let bad = HeartbeatConfig {
        interval: Duration::from_secs(5),
        timeout: Duration::from_secs(5),
    };
    let e = JobManagerServer::start("127.0.0.1:0".parse().unwrap(), bad)
        .await
        .err()
        .expect("a timeout not above the interval is refused");
    assert!(e.contains("timeout"), "{e}");
    let endless = HeartbeatConfig {
        interval: Duration::from_secs(1),
        timeout: Duration::MAX,
    };
    let e = JobManagerServer::start("127.0.0.1:0".parse().unwrap(), endless)
        .await
        .err()
        .expect("an endless timeout is refused");
    assert!(e.contains("longer than"), "{e}");
    let unreachable = TaskManagerSession::join(
        "127.0.0.1:9".parse().unwrap(),
        TaskManagerInfo {
            name: "x".into(),
            slots: 1,
            data_addr: "127.0.0.1:0".parse().unwrap(),
            pid: 0,
            job: None,
            protocol: weir_runtime::cluster::TASK_PROTOCOL_VERSION,
            past_jobs: Vec::new(),
        },
        Duration::from_millis(200),
    )
    .await;
    let e = unreachable.err().expect("nothing listens on port 9");
    assert!(e.to_string().contains("not reachable"), "{e}");
}
