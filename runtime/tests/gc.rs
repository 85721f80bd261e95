//! `weir checkpoints gc` on a real job's checkpoint root with garbage added beside it: it lists
//! exactly the incomplete directories, unreferenced shared files and dead job directories, skips
//! a job directory whose lock is being renewed, deletes only with `--delete`, and every complete
//! checkpoint still verifies afterwards.
#![cfg(feature = "cli")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "support/bounded.rs"]
mod bounded;
use bounded::BoundedCommand;

#[path = "support/checkpointed.rs"]
mod checkpointed;

use checkpointed::{KeyedJob, complete_ids};
use std::collections::BTreeSet;
use std::path::Path;
use std::process::{Command, Output};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use weir_runtime::StreamEnvironment;

fn weir(args: &[&str], path: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_weir"))
        .args(args)
        .arg(path)
        .output_bounded()
        .expect("cannot run the weir binary")
}

/// The `KIND path` lines of gc's report.
fn items(out: &Output) -> BTreeSet<String> {
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| !l.starts_with("gc: ") && !l.starts_with("SKIPPED"))
        .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gc_lists_and_deletes_only_what_no_complete_checkpoint_needs() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("ck");
    let env = StreamEnvironment::new();
    env.set_job_name("gc-test")
        .set_parallelism(2)
        .enable_checkpointing(Duration::from_millis(20))
        .set_checkpoint_dir(&root);
    env.checkpoint_config().num_retained = 2;
    env.config_mut().incremental = true;
    KeyedJob {
        keys: 20_000,
        records: 200_000,
        warm_up: 40_000,
        wanted: 3,
        give_up: Duration::from_secs(60),
    }
    .run(env, root.clone())
    .await;
    let kept = complete_ids(&root);
    assert!(!kept.is_empty(), "the job left complete checkpoints");
    let job = std::fs::read_dir(&root)
        .unwrap()
        .flatten()
        .next()
        .unwrap()
        .path();
    let r = |p: &Path| p.display().to_string();
    // Garbage: an incomplete checkpoint with a file, an empty one, an unreferenced shared file.
    std::fs::create_dir_all(job.join("chk-900")).unwrap();
    std::fs::write(job.join("chk-900/keyed-0"), b"partial").unwrap();
    std::fs::create_dir_all(job.join("chk-901")).unwrap();
    std::fs::create_dir_all(job.join("shared")).unwrap();
    std::fs::write(job.join("shared/orphan"), b"left by a killed upload").unwrap();
    // A run killed before its first checkpoint: a stale lock and an incomplete directory.
    let dead = root.join("0000000000000000000000000000dead");
    std::fs::create_dir_all(dead.join("chk-1")).unwrap();
    std::fs::write(dead.join("chk-1/keyed-0"), b"x").unwrap();
    std::fs::write(
        dead.join("_lock"),
        "process 1 on h\nlease_ms 200\nrenewal 9\n",
    )
    .unwrap();
    // A running job's directory: its lock renewed all along, so gc must leave it alone.
    let live = root.join("00000000000000000000000000000a1e");
    std::fs::create_dir_all(live.join("chk-1")).unwrap();
    std::fs::write(live.join("chk-1/keyed-0"), b"being written").unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let renewer = {
        let (stop, lock) = (stop.clone(), live.join("_lock"));
        std::thread::spawn(move || {
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                n += 1;
                // Written aside and renamed over, as a storage replaces a file: a reader never
                // sees it half written (a truncated lock reads as held by nobody named).
                let tmp = lock.with_extension("tmp");
                std::fs::write(&tmp, format!("process 2 on h\nlease_ms 200\nrenewal {n}\n"))
                    .unwrap();
                std::fs::rename(&tmp, &lock).unwrap();
                std::thread::sleep(Duration::from_millis(20));
            }
        })
    };

    let expected: BTreeSet<String> = [
        format!("INCOMPLETE {}", r(&job.join("chk-900"))),
        format!("INCOMPLETE {}", r(&job.join("chk-901"))),
        format!("UNREFERENCED {}", r(&job.join("shared/orphan"))),
        format!("EMPTY-JOB {}", r(&dead)),
    ]
    .into();
    // A job directory, or a checkpoint directory, is not a root: refused, nothing looked at.
    for wrong in [job.clone(), job.join(format!("chk-{}", kept[0]))] {
        let o = weir(&["checkpoints", "gc"], &wrong);
        assert_eq!(o.status.code(), Some(2), "{o:?}");
    }
    let listed = weir(&["checkpoints", "gc"], &root);
    assert!(listed.status.success(), "{listed:?}");
    assert_eq!(
        items(&listed),
        expected,
        "{}",
        String::from_utf8_lossy(&listed.stdout)
    );
    let text = String::from_utf8_lossy(&listed.stdout).to_string();
    assert!(
        text.contains(&format!(
            "SKIPPED      {}: held by a running job (process 2 on h)",
            r(&live)
        )),
        "{text}"
    );
    assert!(
        job.join("chk-900/keyed-0").exists() && job.join("shared/orphan").exists() && dead.exists()
    );

    let deleted = weir(&["checkpoints", "gc", "--delete"], &root);
    assert!(deleted.status.success(), "{deleted:?}");
    assert_eq!(items(&deleted), expected);
    stop.store(true, Ordering::Relaxed);
    renewer.join().unwrap();
    assert!(!job.join("chk-900").exists() && !job.join("chk-901").exists());
    assert!(!job.join("shared/orphan").exists() && !dead.exists());
    assert!(
        live.join("chk-1/keyed-0").exists(),
        "the running job's files stay"
    );
    assert_eq!(complete_ids(&root), kept, "every complete checkpoint stays");
    for id in kept {
        let v = weir(&["checkpoints", "verify"], &job.join(format!("chk-{id}")));
        assert!(
            v.status.success(),
            "chk-{id} must still verify: {}",
            String::from_utf8_lossy(&v.stdout)
        );
    }
    // Nothing left to collect but the directory whose renewals have stopped: now abandoned.
    let again = weir(&["checkpoints", "gc"], &root);
    assert_eq!(
        items(&again),
        BTreeSet::from([format!("EMPTY-JOB {}", r(&live))]),
        "{}",
        String::from_utf8_lossy(&again.stdout)
    );
}
