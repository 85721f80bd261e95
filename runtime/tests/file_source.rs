//! The file source: a directory's files read exactly once through failures (every line once,
//! counted by an exactly-once sink), a monitored directory's new files, a restore that resumes at
//! the checkpointed byte offset, a file that changed under it, and lines that do not parse.

mod support;
use support::Bounded;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;
use weir_runtime::{
    FileSource, JobClient, JobError, ParseErrorPolicy, RestartStrategy, StreamEnvironment,
};

/// Writes `files` files of `lines` lines each (`w<line % 13>`); returns every line's count.
fn write_files(dir: &Path, files: usize, lines: usize) -> BTreeMap<String, i64> {
    let mut counts = BTreeMap::new();
    for f in 0..files {
        let mut text = String::new();
        for l in 0..lines {
            let w = format!("w{}", (f * 7 + l) % 13);
            text.push_str(&w);
            text.push('\n');
            *counts.entry(w).or_insert(0) += 1;
        }
        std::fs::write(dir.join(format!("in-{f}.txt")), text).unwrap();
    }
    // Hidden files are skipped (a writer's file in progress).
    std::fs::write(dir.join(".in-progress"), "not\nread\n").unwrap();
    counts
}

fn counts(lines: &[String]) -> BTreeMap<String, i64> {
    let mut out = BTreeMap::new();
    for l in lines {
        *out.entry(l.clone()).or_insert(0) += 1;
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_line_once_through_failures() {
    let tmp = tempfile::tempdir().unwrap();
    let input = tmp.path().join("in");
    std::fs::create_dir(&input).unwrap();
    let expected = write_files(&input, 6, 4_000);
    let env = StreamEnvironment::new();
    env.set_parallelism(2)
        .enable_checkpointing(Duration::from_millis(10))
        .set_checkpoint_dir(tmp.path().join("checkpoints"));
    env.config_mut().batch_size = 64;
    env.set_restart_strategy(RestartStrategy::FixedDelay {
        attempts: 5,
        delay: Duration::from_millis(10),
    });
    let seen = Arc::new(AtomicU64::new(0));
    let failures = Arc::new(AtomicU64::new(0));
    let (s, f) = (seen.clone(), failures.clone());
    let lines = env
        .read_text_files(&input)
        .unwrap()
        .map(move |l: String| {
            // Fails twice, a third and two thirds of the way.
            let n = s.fetch_add(1, Ordering::Relaxed);
            if (n == 8_000 || n == 16_000) && f.fetch_add(1, Ordering::Relaxed) < 2 {
                panic!("failing on purpose at line {n}");
            }
            l
        })
        .collect();
    let r = env.execute().bounded().await.unwrap();
    assert_eq!(failures.load(Ordering::Relaxed), 2);
    assert!(r.restarts >= 1, "{r:?}");
    let got = lines.records();
    assert_eq!(got.len(), 24_000);
    assert_eq!(counts(&got), expected);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_monitored_directory_reads_files_that_appear() {
    let tmp = tempfile::tempdir().unwrap();
    let input = tmp.path().join("in");
    std::fs::create_dir(&input).unwrap();
    write_files(&input, 1, 100);
    let env = StreamEnvironment::new();
    env.set_parallelism(2);
    let seen = Arc::new(AtomicU64::new(0));
    let s = seen.clone();
    FileSource::text_lines(&input)
        .monitor_continuously(Duration::from_millis(20))
        .build(&env)
        .unwrap()
        .map(move |l: String| {
            s.fetch_add(1, Ordering::Relaxed);
            l
        })
        .collect();
    let client = JobClient::default();
    let job = tokio::spawn(env.execute_with(client.clone()));
    let wait_for = |n: u64| {
        let seen = seen.clone();
        async move {
            for _ in 0..500 {
                if seen.load(Ordering::Relaxed) >= n {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            panic!("saw {} lines, not {n}", seen.load(Ordering::Relaxed));
        }
    };
    wait_for(100).await;
    // A file written elsewhere and renamed in, as a writer should.
    std::fs::write(tmp.path().join("next.txt"), "a\nb\nc\n").unwrap();
    std::fs::rename(tmp.path().join("next.txt"), input.join("next.txt")).unwrap();
    wait_for(103).await;
    client.cancel();
    let _ = job.await;
    assert_eq!(seen.load(Ordering::Relaxed), 103);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restore_resumes_at_the_offset_and_a_changed_file_is_named() {
    let tmp = tempfile::tempdir().unwrap();
    let input = tmp.path().join("in");
    std::fs::create_dir(&input).unwrap();
    let expected = write_files(&input, 2, 100_000);
    let root = tmp.path().join("checkpoints");
    let out = tmp.path().join("out");
    std::fs::create_dir(&out).unwrap();
    let run = |fail: bool, root: &Path, from: Option<&Path>| {
        let env = StreamEnvironment::new();
        env.set_parallelism(1)
            .enable_checkpointing(Duration::from_millis(5))
            .set_checkpoint_dir(root)
            .set_restart_strategy(RestartStrategy::NoRestart);
        env.config_mut().batch_size = 16;
        if let Some(from) = from {
            env.restore_from(from);
        }
        let failed = Arc::new(AtomicBool::new(!fail));
        let n = Arc::new(AtomicU64::new(0));
        env.read_text_files(&input)
            .unwrap()
            .map(move |l: String| {
                if n.fetch_add(1, Ordering::Relaxed) == 150_000
                    && !failed.swap(true, Ordering::Relaxed)
                {
                    panic!("failing on purpose");
                }
                l
            })
            .write_to_files(&out);
        env
    };
    let env = run(true, &root, None);
    assert!(env.execute().bounded().await.is_err());
    let env = run(false, &root, Some(&root));
    let r = env.execute().bounded().await.unwrap();
    // It restored a checkpoint and read only what came after it.
    assert!(r.restored_from.is_some(), "{r:?}");
    assert!(
        r.source_records_since_restore < 200_000 && r.source_records_since_restore > 0,
        "{}",
        r.source_records_since_restore
    );
    // What the exactly-once file sink committed over both runs: every line once.
    let mut all = Vec::new();
    for f in std::fs::read_dir(&out).unwrap() {
        let f = f.unwrap();
        if f.file_name().to_string_lossy().starts_with("part-") {
            let text = std::fs::read_to_string(f.path()).unwrap();
            all.extend(text.lines().map(str::to_string));
        }
    }
    assert_eq!(counts(&all), expected);

    // A file that changed after the checkpoint listed it: the restore names it.
    let env = run(true, &root.join("again"), None);
    assert!(env.execute().bounded().await.is_err());
    std::fs::write(input.join("in-1.txt"), "changed\n").unwrap();
    let env = run(false, &root.join("again"), Some(&root.join("again")));
    let err = env.execute().bounded().await.unwrap_err().to_string();
    assert!(err.contains("in-1.txt") && err.contains("changed"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lines_that_do_not_parse_fail_the_job_or_are_skipped_by_policy() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("numbers"), "1\n2\nthree\n4\n").unwrap();
    let parse = |l: &str| l.parse::<i64>().map_err(|e| format!("{l:?}: {e}"));
    let env = StreamEnvironment::new();
    FileSource::with_parser(tmp.path(), parse)
        .build(&env)
        .unwrap()
        .collect();
    let err = env.execute().bounded().await.unwrap_err();
    assert!(matches!(err, JobError::Failed { .. }), "{err:?}");
    let err = err.to_string();
    assert!(
        err.contains("byte 4") && err.contains("numbers") && err.contains("three"),
        "{err}"
    );

    let env = StreamEnvironment::new();
    let source = FileSource::with_parser(tmp.path(), parse).on_parse_error(ParseErrorPolicy::Skip);
    let skipped = source.skipped();
    let got = source.build(&env).unwrap().collect();
    env.execute().bounded().await.unwrap();
    assert_eq!(got.records(), vec![1, 2, 4]);
    assert_eq!(skipped.load(Ordering::Relaxed), 1);

    let env = StreamEnvironment::new();
    let missing = tmp.path().join("missing");
    assert!(env.read_text_files(&missing).is_err());
}
