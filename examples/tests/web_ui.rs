//! The web UI in headless Chromium, against a real `word_count` process: the page's timeline
//! shows the checkpoints the job's own log reports as completed (and nothing else), the job
//! graph shows its vertices, a checkpoint's per-subtask details are drawn, the savepoint button
//! writes a savepoint on disk, and the cancel button (after its confirm dialog) cancels the
//! job. A screenshot is kept under `target/web-ui/`.

#[path = "support/processes.rs"]
mod processes;
#[path = "support/webdriver.rs"]
mod webdriver;

use processes::{Processes, StderrLines};
use serde_json::Value;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use webdriver::Browser;

/// The ids of the checkpoints (not savepoints) the job's log reports as completed.
fn logged_completed(lines: &[String]) -> BTreeSet<u64> {
    lines
        .iter()
        .filter_map(|l| {
            let rest = &l[l.find("checkpoint ")? + "checkpoint ".len()..];
            let mut words = rest.split_whitespace();
            let id = words.next()?.parse().ok()?;
            (words.next()? == "Checkpoint" && words.next()? == "COMPLETED:").then_some(id)
        })
        .collect()
}

/// Where the screenshot goes: `target/web-ui/` of this workspace.
fn screenshot_dir() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR").map_or_else(
        || Path::new(env!("CARGO_MANIFEST_DIR")).join("../target"),
        PathBuf::from,
    );
    let dir = target.join("web-ui");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The timeline's completed checkpoint ids as the page draws them.
fn timeline_completed(browser: &Browser) -> BTreeSet<u64> {
    let v = browser.script(
        "return [...document.querySelectorAll('#checkpoint-timeline rect.cp-bar.duration')]\
         .filter(r => r.dataset.status === 'COMPLETED' && r.dataset.kind !== 'SAVEPOINT')\
         .map(r => Number(r.dataset.checkpointId))",
    );
    v.as_array()
        .unwrap()
        .iter()
        .map(|n| n.as_u64().unwrap())
        .collect()
}

#[test]
fn the_web_ui_shows_the_checkpoints_and_its_buttons_take_a_savepoint_and_cancel() {
    let dir = tempfile::tempdir().unwrap();
    let path = |name: &str| dir.path().join(name).to_string_lossy().to_string();
    let mut child = Command::new(env!("CARGO_BIN_EXE_word_count"))
        .args(["--records", "0", "--parallelism", "2"])
        .args(["--checkpoint-interval", "200ms"])
        .args([
            "--checkpoint-dir",
            &path("ck"),
            "--savepoint-dir",
            &path("sp"),
        ])
        .args(["--rest-address", "127.0.0.1:0"])
        .env("RUST_LOG", "weir_runtime=info")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut log = StderrLines::read(child.stderr.take().unwrap());
    let processes = Processes(vec![child]);
    log.wait_for("REST API: http://", Duration::from_secs(60));
    let url = log
        .so_far()
        .iter()
        .find_map(|l| {
            let at = l.find("REST API: http://")?;
            l[at + "REST API: ".len()..]
                .split_whitespace()
                .next()
                .map(str::to_string)
        })
        .unwrap();

    let browser = Browser::start(1300, 2200);
    browser.navigate(&url);
    // At least five completed checkpoints drawn.
    browser.wait_for(
        "five completed checkpoints on the timeline",
        "return document.querySelectorAll(\
         '#checkpoint-timeline rect.cp-bar.duration[data-status=COMPLETED]').length >= 5",
        Duration::from_secs(60),
    );

    // The timeline against the job's own log: every bar a checkpoint the log reports as
    // completed, and between the first and the last bar, every checkpoint it reports.
    let drawn = timeline_completed(&browser);
    let logged = logged_completed(log.so_far());
    assert!(
        drawn.is_subset(&logged),
        "drawn {drawn:?}, logged {logged:?}"
    );
    let (first, last) = (*drawn.first().unwrap(), *drawn.last().unwrap());
    let between: BTreeSet<u64> = logged.range(first..=last).copied().collect();
    assert_eq!(
        drawn, between,
        "the timeline left out a completed checkpoint"
    );
    // It keeps up: a checkpoint the log reports later is drawn too.
    let newest = *logged.last().unwrap();
    let interval = browser.script(
        "return document.querySelector('#checkpoint-config tr[data-key=interval] td')\
         .textContent",
    );
    assert_eq!(interval, "200 ms");
    browser.wait_for(
        "a later checkpoint on the timeline",
        &format!(
            "return document.querySelector('#checkpoint-timeline \
             rect.cp-bar[data-checkpoint-id=\"{}\"]') !== null",
            newest + 2
        ),
        Duration::from_secs(30),
    );

    // The job graph: the two chains, parallelism 2, one hash exchange, records counted.
    let graph = browser.script(
        "return [...document.querySelectorAll('#job-graph g.vertex')].map(g => \
         g.textContent)",
    );
    let graph: Vec<&str> = graph
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert_eq!(graph.len(), 2, "{graph:?}");
    assert!(graph[0].starts_with("Generator Source"), "{graph:?}");
    assert!(
        graph.iter().all(|g| g.contains("parallelism 2")),
        "{graph:?}"
    );
    assert!(graph.iter().all(|g| g.contains(" records")), "{graph:?}");
    let edge = browser.script(
        "return [...document.querySelectorAll('#job-graph .edge-label')].map(t => \
         t.textContent)",
    );
    assert_eq!(edge, serde_json::json!(["HASH"]));

    // One checkpoint's details (the newest drawn, still in the job's history): a row per
    // subtask of each vertex, all acknowledged.
    let newest = *timeline_completed(&browser).last().unwrap();
    browser.click(&format!(
        "#checkpoint-timeline rect.cp-bar.duration[data-checkpoint-id=\"{newest}\"]"
    ));
    let rows = browser.wait_for(
        "a checkpoint's per-subtask details",
        &format!(
            "const rows = document.querySelectorAll('#checkpoint-details tr[data-subtask]'); \
             return document.getElementById('details-id').textContent.startsWith('#{newest} ') \
             && rows.length === 4 ? [...rows].map(r => r.children.length) : null"
        ),
        Duration::from_secs(10),
    );
    assert_eq!(
        rows,
        serde_json::json!([9, 9, 9, 9]),
        "every subtask acknowledged"
    );

    let png = browser.screenshot(&screenshot_dir().join("checkpoints.png"));
    assert!(png.starts_with(b"\x89PNG\r\n\x1a\n") && png.len() > 20_000);

    // The savepoint button, with a directory typed in: a savepoint on disk.
    let target = dir.path().join("ui-savepoints");
    browser.type_into("#savepoint-dir", &target.to_string_lossy());
    browser.click("#trigger-savepoint");
    let location = browser.wait_for(
        "the savepoint's location",
        "const s = document.getElementById('operation-status'); \
         return s.classList.contains('done') ? s.dataset.location : \
         (s.classList.contains('failed') ? 'FAILED: ' + s.textContent : null)",
        Duration::from_secs(60),
    );
    // Flink's form: a file URL.
    let location = location.as_str().unwrap();
    let location = PathBuf::from(location.strip_prefix("file://").unwrap_or(location));
    assert!(
        location.starts_with(&target),
        "{} is not under {}",
        location.display(),
        target.display()
    );
    let metadata = location.join("_metadata");
    assert!(
        std::fs::metadata(&metadata).is_ok_and(|m| m.len() > 0),
        "no savepoint at {}",
        metadata.display()
    );
    // The timeline draws it as a savepoint.
    browser.wait_for(
        "the savepoint on the timeline",
        "return document.querySelector(\
         '#checkpoint-timeline rect.cp-bar.savepoint[data-status=COMPLETED]') !== null",
        Duration::from_secs(10),
    );

    // The cancel button asks first; accepted, the job is cancelled and the process ends.
    browser.click("#cancel-job");
    browser.accept_dialog();
    let mut processes = processes;
    let mut child = processes.0.remove(0);
    let give_up = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < give_up, "the job did not end after cancel");
        std::thread::sleep(Duration::from_millis(50));
    };
    // word_count's exit code for a cancelled job.
    assert_eq!(status.code(), Some(130), "{status:?}");

    // Another job at the same address (a standing cluster's next job manager does this): the
    // open page follows it, its own checkpoints from 1 on.
    let address = url.trim_start_matches("http://").trim_end_matches('/');
    let mut next = Command::new(env!("CARGO_BIN_EXE_word_count"))
        .args(["--records", "0", "--checkpoint-interval", "200ms"])
        .args(["--checkpoint-dir", &path("ck2"), "--rest-address", address])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut next_log = StderrLines::read(next.stderr.take().unwrap());
    let _next = Processes(vec![next]);
    next_log.wait_for("REST API: http://", Duration::from_secs(60));
    let next_id = next_log
        .so_far()
        .iter()
        .find_map(|l| {
            l.split("(job ")
                .nth(1)
                .map(|j| j.trim_end_matches(')').to_string())
        })
        .unwrap();
    browser.wait_for(
        "the page following the new job",
        &format!(
            "return document.getElementById('job-id').textContent === '{next_id}' && \
             document.querySelector('#checkpoint-timeline rect.cp-bar[data-checkpoint-id=\"1\"]') \
             !== null && document.getElementById('job-state').textContent === 'RUNNING'"
        ),
        Duration::from_secs(30),
    );
    let _: Value = browser.script("return null");
}
