//! The lease on a job directory: what a run writes into its lock, how it renews it, and how
//! another run tells an abandoned lock (its holder killed) from a held one.
//!
//! A run holds `<job-id>/` through a lock file of some generation
//! ([`CheckpointStorage::take_lock`]). Its content is the holder's name, the lease it promises
//! and a renewal counter. The holder rewrites it every third of the lease
//! ([`LeaseKeeper`]). Another run judges a lock as Kubernetes' leader election does, without
//! comparing clocks: it reads the lock, waits one lease (and a fifth), and reads it again. An
//! unchanged lock was not renewed for a whole lease: its holder is gone, and the directory may be
//! taken over by creating the next generation's lock, which only one taker can do. A holder that
//! was only frozen finds the newer generation at its next renewal and stops
//! ([`CheckpointError::LockLost`]).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Mutex;
use tracing::{debug, warn};
use weir_checkpoint::storage::JobLock;
use weir_checkpoint::{CheckpointError, CheckpointStorage};
use weir_core::ids::JobId;

/// The lease a lock promises when it names none (written before leases, or damaged), and the
/// default of `JobConfig::job_lock_lease` (Kubernetes' leader-election lease is 15 s too).
pub(crate) const DEFAULT_JOB_LOCK_LEASE: Duration = Duration::from_secs(15);

/// The most characters of the holder a lock file keeps, so that its lease and renewal lines
/// always fit in what a reader reads back (1,000 characters).
const MAX_HOLDER_CHARS: usize = 200;

/// The shortest lease a lock may promise: a damaged lock cannot make a reader judge a live holder
/// at once.
const MIN_JOB_LOCK_LEASE: Duration = Duration::from_millis(100);

/// The longest lease a lock may promise: a damaged or hostile lock cannot make a reader wait
/// longer.
pub(crate) const MAX_JOB_LOCK_LEASE: Duration = Duration::from_secs(3600);

/// What a lock file holds: who, the lease promised, and a counter each renewal raises.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct LockContent {
    pub holder: String,
    pub lease: Duration,
    pub renewal: u64,
}

impl LockContent {
    /// The file's text: the holder on the first line (what a refusal names), then the lease.
    pub fn render(&self) -> String {
        format!(
            "{}\nlease_ms {}\nrenewal {}\n",
            self.holder
                .lines()
                .next()
                .unwrap_or("")
                .chars()
                .take(MAX_HOLDER_CHARS)
                .collect::<String>(),
            self.lease.as_millis(),
            self.renewal
        )
    }

    /// Reads a lock's text. A lock without a lease line (written before leases, or damaged)
    /// promises the default lease.
    pub fn parse(text: &str) -> LockContent {
        let mut lines = text.lines();
        let holder = lines.next().unwrap_or("").to_string();
        let mut lease = DEFAULT_JOB_LOCK_LEASE;
        let mut renewal = 0;
        for line in lines {
            if let Some(ms) = line
                .strip_prefix("lease_ms ")
                .and_then(|v| v.parse::<u64>().ok())
            {
                // A damaged or hostile lock cannot make a reader wait for ever.
                lease = Duration::from_millis(ms).clamp(MIN_JOB_LOCK_LEASE, MAX_JOB_LOCK_LEASE);
            } else if let Some(n) = line.strip_prefix("renewal ").and_then(|v| v.parse().ok()) {
                renewal = n;
            }
        }
        LockContent {
            holder,
            lease,
            renewal,
        }
    }
}

/// What two readings of a lock, one lease apart, say of its directory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Liveness {
    /// No lock: nobody holds the directory.
    Free,
    /// The lock changed (renewed, released and taken again, taken over): a run holds it.
    Held { holder: String },
    /// The lock stayed as it was for a whole lease: its holder is gone. The directory may be
    /// taken over with the next generation.
    Abandoned { generation: u64, holder: String },
}

/// Judges a directory from two readings of its lock taken a lease apart.
pub(crate) fn judge(first: Option<&JobLock>, second: Option<&JobLock>) -> Liveness {
    match (first, second) {
        (_, None) => Liveness::Free,
        (Some(a), Some(b)) if a == b => Liveness::Abandoned {
            generation: b.generation,
            holder: LockContent::parse(&b.content).holder,
        },
        (_, Some(b)) => Liveness::Held {
            holder: LockContent::parse(&b.content).holder,
        },
    }
}

/// How long to watch a lock that promises `lease` before judging it.
pub(crate) fn watch_time(lease: Duration) -> Duration {
    lease + lease / 5
}

/// Judges the job directories `jobs`: reads their locks, waits once for the longest lease any
/// of them promises, and reads them again. Directories without a lock are free at once.
pub(crate) async fn observe(
    storage: &dyn CheckpointStorage,
    jobs: &[JobId],
) -> Result<BTreeMap<JobId, Liveness>, CheckpointError> {
    let mut first = BTreeMap::new();
    let mut unreadable = BTreeMap::new();
    for &job in jobs {
        match storage.read_lock(job).await {
            Ok(lock) => {
                first.insert(job, lock);
            }
            // A directory whose lock cannot be read is left alone, as if held.
            Err(e) => {
                warn!(%job, error = %e, "cannot read the job directory's lock: leaving it alone");
                unreadable.insert(
                    job,
                    Liveness::Held {
                        holder: format!("unknown: {e}"),
                    },
                );
            }
        }
    }
    let wait = first
        .values()
        .flatten()
        .map(|l| watch_time(LockContent::parse(&l.content).lease))
        .max();
    if let Some(wait) = wait {
        debug!(
            ?wait,
            locked = first.values().flatten().count(),
            "watching job directory locks"
        );
        tokio::time::sleep(wait).await;
    }
    let mut out = unreadable;
    for (job, before) in first {
        let judged = match &before {
            None => judge(None, None),
            Some(_) => match storage.read_lock(job).await {
                Ok(after) => judge(before.as_ref(), after.as_ref()),
                Err(e) => Liveness::Held {
                    holder: format!("unknown: {e}"),
                },
            },
        };
        out.insert(job, judged);
    }
    Ok(out)
}

/// Takes `job` over as judged: generation 0 when free, the next one when abandoned. `None` when
/// it is held, or another run took it first.
pub(crate) async fn take_over(
    storage: &dyn CheckpointStorage,
    job: JobId,
    liveness: &Liveness,
    content: &LockContent,
) -> Result<Option<u64>, CheckpointError> {
    let generation = match liveness {
        Liveness::Free => 0,
        // A damaged lock file of the last generation there is: left alone.
        Liveness::Abandoned { generation, .. } => match generation.checked_add(1) {
            Some(next) => next,
            None => return Ok(None),
        },
        Liveness::Held { .. } => return Ok(None),
    };
    match storage.take_lock(job, generation, &content.render()).await {
        Ok(()) => Ok(Some(generation)),
        Err(CheckpointError::Locked { holder, .. }) => {
            warn!(%job, %holder, "another run took the job directory first");
            Ok(None)
        }
        Err(e) => Err(e),
    }
}

/// Takes a run's own job directory: generation 0 of a fresh directory (every run's, unless the
/// job id is fixed). When it is locked (a fixed job id run again), the lock is watched for one
/// lease: a holder that renews it is running, and the run is refused with
/// [`CheckpointError::Locked`]; an abandoned one (its run killed) is taken over with the next
/// generation. Returns the generation held.
pub(crate) async fn take_job_directory(
    storage: &dyn CheckpointStorage,
    job: JobId,
    content: &LockContent,
) -> Result<u64, CheckpointError> {
    let refusal = match storage.lock_job(job, &content.render()).await {
        // (A failed read here is not a reason to stop: the check is a defence against lock
        // files deleted by hand, and the first renewal finds a newer generation too.)
        Ok(()) => match storage.read_lock(job).await {
            // A newer generation beside the fresh `_lock` (its older files deleted by hand):
            // give `_lock` back and judge the newer one.
            Ok(Some(newer)) if newer.generation > 0 => {
                storage.delete_file(&format!("{job}/_lock")).await?;
                CheckpointError::Locked {
                    path: format!("{job}"),
                    holder: LockContent::parse(&newer.content).holder,
                }
            }
            _ => return Ok(0),
        },
        Err(e @ CheckpointError::Locked { .. }) => e,
        Err(e) => return Err(e),
    };
    tracing::info!(%job, "the job directory is locked: watching its lease to see whether its holder runs");
    let seen = observe(storage, &[job]).await?;
    match take_over(storage, job, &seen[&job], content).await? {
        Some(generation) => {
            warn!(%job, "took over the job directory of a run that stopped renewing its lease");
            Ok(generation)
        }
        None => Err(refusal),
    }
}

/// How long [`LeaseKeeper::release`] waits for a round of renewals under way.
const RELEASE_WAIT: Duration = Duration::from_secs(5);

/// A keeper dropped without [`release`](LeaseKeeper::release) (a run whose setup failed after
/// it took the directory releases it; this is the backstop) stops renewing at least.
impl Drop for LeaseKeeper {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Runs `op` until it succeeds, at most 4 times, 20 ms apart and doubling: a storage's transient
/// errors (a dropped connection, a busy server) should not leave a lock behind a run.
pub(crate) async fn retrying<T, F, Fut>(mut op: F) -> Result<T, CheckpointError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, CheckpointError>>,
{
    let mut delay = Duration::from_millis(20);
    for _ in 0..3 {
        match op().await {
            Ok(v) => return Ok(v),
            Err(e) => {
                debug!(error = %e, ?delay, "a lock operation failed; retrying");
                tokio::time::sleep(delay).await;
                delay *= 2;
            }
        }
    }
    op().await
}

/// A lock a run holds: where, which directory, which generation.
type Held = (Arc<dyn CheckpointStorage>, JobId, u64);

/// Renews the locks a run holds (its own job directory and those it claimed), every third of
/// the lease, until released. A lock found taken over is reported through [`lost`](Self::lost).
pub(crate) struct LeaseKeeper {
    /// Locked for a whole round of renewals, so that once [`forget`](Self::forget) returns no
    /// renewal of that lock is under way (one could recreate a lock file being deleted).
    held: Arc<Mutex<Vec<Held>>>,
    lost: tokio::sync::watch::Receiver<Option<(String, String)>>,
    task: tokio::task::JoinHandle<()>,
}

impl LeaseKeeper {
    /// Starts renewing, as `content` promises, the locks [`hold`](Self::hold) adds.
    pub fn start(content: LockContent) -> LeaseKeeper {
        let held: Arc<Mutex<Vec<Held>>> = Arc::new(Mutex::new(Vec::new()));
        let (tx, lost) = tokio::sync::watch::channel(None);
        let dirs = held.clone();
        let task = tokio::spawn(async move {
            let mut content = content;
            let mut tick = tokio::time::interval(content.lease / 3);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            tick.tick().await;
            // When each lock was last renewed: one not renewed for a whole lease may have been
            // judged abandoned and taken over, so its holder stops.
            let mut renewed: BTreeMap<JobId, tokio::time::Instant> = BTreeMap::new();
            loop {
                tick.tick().await;
                content.renewal += 1;
                let now = dirs.lock().await;
                for (storage, job, generation) in now.iter() {
                    let (job, generation) = (*job, *generation);
                    let since = *renewed.entry(job).or_insert_with(tokio::time::Instant::now);
                    match storage.renew_lock(job, generation, &content.render()).await {
                        Ok(()) => {
                            renewed.insert(job, tokio::time::Instant::now());
                        }
                        Err(CheckpointError::LockLost { path, by }) => {
                            let _ = tx.send(Some((path, by)));
                            return;
                        }
                        // A transient error: the next renewal may succeed within the lease.
                        Err(e) if since.elapsed() < content.lease => {
                            warn!(%job, error = %e, "cannot renew the job directory's lock");
                        }
                        Err(e) => {
                            let _ = tx.send(Some((
                                format!("{job}"),
                                format!(
                                    "nobody known: its lease could not be renewed for {:?} ({e})",
                                    content.lease
                                ),
                            )));
                            return;
                        }
                    }
                }
            }
        });
        LeaseKeeper { held, lost, task }
    }

    /// Renews `job`'s lock of `generation` in `storage` from now on.
    pub async fn hold(&self, storage: Arc<dyn CheckpointStorage>, job: JobId, generation: u64) {
        self.held.lock().await.push((storage, job, generation));
    }

    /// Stops renewing `job`: when this returns, no renewal of it is under way or will start, so
    /// its directory can be deleted.
    pub async fn forget(&self, job: JobId) {
        self.held.lock().await.retain(|(_, j, _)| *j != job);
    }

    /// Resolves when a lock was found taken over, with that error; pending for ever otherwise.
    pub async fn lost(&mut self) -> CheckpointError {
        loop {
            if let Some((path, by)) = self.lost.borrow_and_update().clone() {
                return CheckpointError::LockLost { path, by };
            }
            if self.lost.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
        }
    }

    /// Stops renewing and releases every lock still held (each its own generation and older,
    /// so a successor's lock stays).
    pub async fn release(mut self) {
        // A round of renewals under way holds `held` across its requests: waiting for it means
        // no renewal is in flight when the locks go (a late one would recreate a deleted lock
        // file), and aborting while holding it means none starts after. A round stuck on a
        // storage that does not answer is not waited for longer than a third of the lease: it
        // is dropped (its request with it), and the locks go anyway.
        let mutex = self.held.clone();
        let guard = tokio::time::timeout(RELEASE_WAIT, mutex.lock()).await.ok();
        self.task.abort();
        let _ = (&mut self.task).await;
        let held: Vec<Held> = match guard {
            Some(guard) => guard.clone(),
            None => mutex.lock().await.clone(),
        };
        for (storage, job, generation) in held {
            if let Err(e) = retrying(|| storage.release_lock(job, generation)).await {
                warn!(%job, error = %e, "cannot give the job directory up");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lock(generation: u64, content: &str) -> JobLock {
        JobLock {
            generation,
            content: content.to_string(),
        }
    }

    #[test]
    fn content_round_trips_and_old_locks_promise_the_default() {
        let c = LockContent {
            holder: "process 7 on h".into(),
            lease: Duration::from_millis(1500),
            renewal: 4,
        };
        assert_eq!(LockContent::parse(&c.render()), c);
        let old = LockContent::parse("process 1 on h, since 5 ms after the Unix epoch");
        assert_eq!(old.lease, DEFAULT_JOB_LOCK_LEASE);
        assert_eq!(
            old.holder,
            "process 1 on h, since 5 ms after the Unix epoch"
        );
        // A zero lease is read as the shortest, and a holder name that would push the lease out
        // of what a reader reads back is cut.
        assert_eq!(
            LockContent::parse("x\nlease_ms 0").lease,
            Duration::from_millis(100)
        );
        let long = LockContent {
            holder: "h".repeat(5000),
            lease: Duration::from_secs(2),
            renewal: 1,
        };
        let text = long.render();
        assert!(text.len() < 1000, "{}", text.len());
        assert_eq!(LockContent::parse(&text).lease, Duration::from_secs(2));
        // A hostile lease is capped at the longest a lease may be.
        assert_eq!(
            LockContent::parse("x\nlease_ms 99999999999999").lease,
            Duration::from_secs(3600)
        );
    }

    #[test]
    fn an_unchanged_lock_is_abandoned_a_changed_one_held() {
        let a = lock(0, "run a\nlease_ms 100\nrenewal 3\n");
        let renewed = lock(0, "run a\nlease_ms 100\nrenewal 4\n");
        let taken = lock(1, "run b\nlease_ms 100\nrenewal 0\n");
        assert_eq!(judge(None, None), Liveness::Free);
        assert_eq!(judge(Some(&a), None), Liveness::Free);
        assert_eq!(
            judge(Some(&a), Some(&a)),
            Liveness::Abandoned {
                generation: 0,
                holder: "run a".into()
            }
        );
        assert_eq!(
            judge(Some(&a), Some(&renewed)),
            Liveness::Held {
                holder: "run a".into()
            }
        );
        assert_eq!(
            judge(Some(&a), Some(&taken)),
            Liveness::Held {
                holder: "run b".into()
            }
        );
        assert_eq!(
            judge(None, Some(&a)),
            Liveness::Held {
                holder: "run a".into()
            }
        );
        assert_eq!(watch_time(Duration::from_secs(5)), Duration::from_secs(6));
    }

    #[tokio::test]
    async fn a_kept_lease_is_held_a_dead_one_abandoned_and_taken_over_once() {
        let storage: Arc<dyn CheckpointStorage> =
            Arc::new(weir_checkpoint::OpendalCheckpointStorage::memory().unwrap());
        let (live, dead) = (JobId(1), JobId(2));
        let content = |holder: &str| LockContent {
            holder: holder.into(),
            lease: Duration::from_millis(150),
            renewal: 0,
        };
        storage
            .take_lock(live, 0, &content("live").render())
            .await
            .unwrap();
        storage
            .take_lock(dead, 0, &content("dead").render())
            .await
            .unwrap();
        let mut keeper = LeaseKeeper::start(content("live"));
        keeper.hold(storage.clone(), live, 0).await;
        let seen = observe(&*storage, &[live, dead, JobId(3)]).await.unwrap();
        assert_eq!(
            seen[&live],
            Liveness::Held {
                holder: "live".into()
            }
        );
        assert_eq!(
            seen[&dead],
            Liveness::Abandoned {
                generation: 0,
                holder: "dead".into()
            }
        );
        assert_eq!(seen[&JobId(3)], Liveness::Free);
        // A damaged lock of the last generation there is cannot be taken over (no overflow).
        let last = Liveness::Abandoned {
            generation: u64::MAX,
            holder: "x".into(),
        };
        assert_eq!(
            take_over(&*storage, JobId(9), &last, &content("a"))
                .await
                .unwrap(),
            None
        );
        // Two takers of the dead directory: one wins.
        let a = take_over(&*storage, dead, &seen[&dead], &content("a"))
            .await
            .unwrap();
        let b = take_over(&*storage, dead, &seen[&dead], &content("b"))
            .await
            .unwrap();
        assert_eq!((a, b), (Some(1), None));
        // The live one taken over (as if it had been frozen): its keeper reports the loss.
        storage
            .take_lock(live, 1, &content("thief").render())
            .await
            .unwrap();
        let lost = tokio::time::timeout(Duration::from_secs(10), keeper.lost())
            .await
            .unwrap();
        assert!(
            matches!(&lost, CheckpointError::LockLost { by, .. } if by == "thief"),
            "{lost:?}"
        );
        keeper.release().await;
        // Releasing generation 0 left the thief's lock.
        assert_eq!(
            storage.read_lock(live).await.unwrap().map(|l| l.generation),
            Some(1)
        );
    }
}
