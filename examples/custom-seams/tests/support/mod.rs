//! What this crate's job tests share: the word counts computed without the engine, the
//! exactly-once check of committed running counts, and a time bound on every job.
// Each test binary uses its own subset of these.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::future::Future;
use std::path::Path;
use std::time::Duration;
use weir_example_custom_seams::word;

/// How long one job of a test may run before the test fails as a hang.
pub const JOB_LIMIT: Duration = Duration::from_secs(60);

/// `future`, failing the test if it has not ended within [`JOB_LIMIT`].
pub async fn bounded<F: Future>(what: &str, future: F) -> F::Output {
    tokio::time::timeout(JOB_LIMIT, future)
        .await
        .unwrap_or_else(|_| panic!("{what} still running after {JOB_LIMIT:?}: a hang"))
}

/// Each word's total over records `0..records` under `seed`, counted here, in a loop over the
/// generator's definition, without the engine.
pub fn expected_totals(records: u64, seed: u64) -> BTreeMap<String, i64> {
    let mut totals = BTreeMap::new();
    for i in 0..records {
        *totals.entry(word(seed, i).to_string()).or_insert(0) += 1;
    }
    totals
}

/// Checks committed running counts `(word, n)` against `expected` totals: each word's counts,
/// sorted, are exactly 1, 2, …, its total, each once. A lost update or one committed twice
/// shows here even where they would cancel out in a total.
pub fn assert_exactly_once(committed: &[(String, i64)], expected: &BTreeMap<String, i64>) {
    let mut counts: BTreeMap<&str, Vec<i64>> = BTreeMap::new();
    for (w, n) in committed {
        counts.entry(w.as_str()).or_default().push(*n);
    }
    assert_eq!(
        counts.keys().copied().collect::<Vec<_>>(),
        expected.keys().map(String::as_str).collect::<Vec<_>>(),
        "the committed words are not the generated ones"
    );
    for (w, ns) in &mut counts {
        ns.sort_unstable();
        let total = expected[*w];
        assert_eq!(
            ns.len() as i64,
            total,
            "word {w}: {} running counts committed for a total of {total}",
            ns.len()
        );
        if let Some((got, want)) = ns.iter().zip(1..).find(|(got, want)| **got != *want) {
            panic!("word {w}: committed {got} where {want} belongs: lost or committed twice");
        }
    }
}

/// The running counts committed as `(word,n)` lines into the part files under `dir` (the
/// exactly-once file sink, `write_to_files`). Every visible file must be a committed
/// `part-<subtask>-<transaction>`: in-progress files are hidden (`.…`), and none may be left.
pub fn read_committed(dir: &Path) -> Vec<(String, i64)> {
    let mut committed = Vec::new();
    let entries = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("cannot list the committed output {}: {e}", dir.display()));
    for entry in entries {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if name.starts_with('.') {
            continue;
        }
        assert!(
            name.starts_with("part-"),
            "a foreign file {name} in {}",
            dir.display()
        );
        for line in std::fs::read_to_string(&path).unwrap().lines() {
            let (w, n) = line
                .strip_prefix('(')
                .and_then(|l| l.strip_suffix(')'))
                .and_then(|l| l.split_once(','))
                .unwrap_or_else(|| panic!("{name}: not a (word,n) line: {line:?}"));
            let n = n
                .parse()
                .unwrap_or_else(|e| panic!("{name}: {line:?}: {e}"));
            committed.push((w.to_string(), n));
        }
    }
    committed
}
