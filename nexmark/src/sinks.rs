//! Where a query's rows go: part files written exactly once (`--output`), or nowhere but a
//! count (the benchmark's blackhole, as nexmark-flink's `'connector' = 'blackhole'`).

use crate::rows::Row;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use weir_runtime::DataStream;
use weir_runtime::operator::{Chained, OneInputOperator, OpResult, Output};
use weir_runtime::sink::Printable;

impl Printable for Row {
    fn print(&self, out: &mut dyn std::io::Write) -> std::io::Result<()> {
        write!(out, "{self}")
    }
}

/// Counts the rows it drops.
#[derive(Clone, Debug, Default)]
pub struct Blackhole(Arc<AtomicU64>);

impl Blackhole {
    /// Rows dropped so far, over all subtasks and attempts.
    pub fn rows(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

struct Drop(Arc<AtomicU64>);

impl OneInputOperator<Row> for Drop {
    type Out = ();

    fn process(&mut self, _: Row, _: &mut dyn Output<()>) -> OpResult {
        self.0.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    fn process_batch(&mut self, batch: Vec<Row>, _: &mut dyn Output<()>) -> OpResult {
        self.0.fetch_add(batch.len() as u64, Ordering::Relaxed);
        Ok(())
    }
}

/// Drops every row of `rows`, counting them.
pub fn blackhole(rows: DataStream<Row>) -> Blackhole {
    let counter = Blackhole::default();
    let count = counter.0.clone();
    rows.transform::<()>("Blackhole Sink", move |_, next| {
        Box::new(Chained::new(Drop(count.clone()), next))
    });
    counter
}

/// The directory `--output FILE` keeps its part files in: `FILE.parts`, the same for a run
/// and the run that resumes it, so the result is every part file of both.
pub fn parts_dir(output: &Path) -> PathBuf {
    let mut name = output.as_os_str().to_owned();
    name.push(".parts");
    PathBuf::from(name)
}

/// Every line of every part file under `dir`.
pub fn read_parts(dir: &Path) -> std::io::Result<Vec<String>> {
    let mut lines = Vec::new();
    if !dir.exists() {
        return Ok(lines);
    }
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        if entry.file_name().to_string_lossy().starts_with("part-") {
            let text = std::fs::read_to_string(entry.path())?;
            lines.extend(text.lines().map(str::to_string));
        }
    }
    Ok(lines)
}
