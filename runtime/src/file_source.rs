//! The file source (Flink's `FileSource` with a line format): the files of a directory, read
//! once or monitored for new ones, one split per file with its byte offset in split state, so a
//! restore resumes after the last line a checkpoint counted.
//!
//! Files must be complete when they appear (write them elsewhere and rename them in, as
//! `write_to_files` does); hidden files (`.name`) are skipped. A file is checked against the
//! length it had when it was listed: one that shrank, grew or vanished before it was read to
//! its end is an error naming it, never a silent gap.

use crate::error::TaskError;
use crate::operator::SubtaskInfo;
use crate::source::{SourceFunction, SourceStatus, SplitAssignment, SplitEnumerator};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeSet, VecDeque};
use std::io::{BufRead, BufReader, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use weir_core::handle::OperatorStateMode;
use weir_state::{OperatorListState, OperatorStateBackend};

/// What a source does with a record that does not parse.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ParseErrorPolicy {
    /// Fail the job, naming the record (the default): nothing is lost, a restart reads it again.
    #[default]
    Fail,
    /// Skip it and count it.
    Skip,
}

/// Turns a line (without its newline) into an element; an `Err` says why it does not parse.
pub type LineParser<T> = Arc<dyn Fn(&str) -> Result<T, String> + Send + Sync>;

/// One file's split: its name in the directory, the byte offset of the next line, and the
/// length the file had when it was listed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct FileSplit {
    file: String,
    offset: u64,
    len: u64,
}

/// The version byte in front of an encoded split or enumerator state.
const VERSION: u8 = 1;
/// The operator state of a reader's splits.
const SPLITS: &str = "file-source-splits";
/// How long a reader waits before asking again after an empty answer.
const ASK_AGAIN: Duration = Duration::from_millis(50);

fn encode<T: Serialize>(value: &T) -> Vec<u8> {
    let mut out = vec![VERSION];
    out.extend(postcard::to_stdvec(value).unwrap_or_default());
    out
}

fn decode<T: for<'de> Deserialize<'de>>(bytes: &[u8], what: &str) -> Result<T, TaskError> {
    match bytes.split_first() {
        Some((&VERSION, rest)) => postcard::from_bytes(rest)
            .map_err(|e| source_error(format!("cannot decode a file source {what}: {e}"))),
        Some((v, _)) => Err(source_error(format!(
            "a file source {what} has format version {v}; this build reads version {VERSION}"
        ))),
        None => Err(source_error(format!("a file source {what} is empty"))),
    }
}

fn source_error(message: String) -> TaskError {
    TaskError::Operator {
        operator: "file source".into(),
        message,
    }
}

/// The visible regular files of `dir` with their lengths, by name.
fn list(dir: &Path) -> Result<Vec<(String, u64)>, String> {
    let entries =
        std::fs::read_dir(dir).map_err(|e| format!("cannot list {}: {e}", dir.display()))?;
    let mut files = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| format!("cannot list {}: {e}", dir.display()))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with('.') {
            continue;
        }
        let meta = entry
            .metadata()
            .map_err(|e| format!("cannot read {}: {e}", entry.path().display()))?;
        if meta.is_file() {
            files.push((name, meta.len()));
        }
    }
    files.sort();
    Ok(files)
}

/// What the enumerator checkpoints.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
struct EnumeratorState {
    /// Every file ever listed: each is unassigned or in one reader's state (or read).
    known: BTreeSet<String>,
    unassigned: VecDeque<FileSplit>,
    listed: bool,
}

/// The file source's enumerator: lists the directory (once, or every `monitor` interval) and
/// hands each new file to the next reader that asks.
struct FileEnumerator {
    dir: PathBuf,
    monitor: Option<Duration>,
    last_listing: Option<Instant>,
    state: EnumeratorState,
}

impl FileEnumerator {
    fn refresh(&mut self) {
        let due = match (self.monitor, self.last_listing) {
            (_, None) => true,
            (Some(every), Some(at)) => at.elapsed() >= every,
            (None, Some(_)) => false,
        };
        if !due {
            return;
        }
        self.last_listing = Some(Instant::now());
        match list(&self.dir) {
            Ok(files) => {
                for (file, len) in files {
                    if self.state.known.insert(file.clone()) {
                        self.state.unassigned.push_back(FileSplit {
                            file,
                            offset: 0,
                            len,
                        });
                    }
                }
                self.state.listed = true;
            }
            Err(e) => tracing::warn!(error = %e, "the file source cannot list its directory"),
        }
    }
}

impl SplitEnumerator for FileEnumerator {
    fn assign(&mut self, _subtask: u32) -> SplitAssignment {
        self.refresh();
        match self.state.unassigned.pop_front() {
            Some(split) => SplitAssignment::Splits(vec![encode(&split)]),
            None if self.monitor.is_none() && self.state.listed => SplitAssignment::NoMoreSplits,
            None => SplitAssignment::Splits(Vec::new()),
        }
    }

    fn snapshot(&self) -> Result<Vec<u8>, TaskError> {
        Ok(encode(&self.state))
    }

    fn restore(&mut self, state: Option<&[u8]>) -> Result<(), TaskError> {
        self.state = match state {
            Some(bytes) => decode(bytes, "enumerator state")?,
            None => EnumeratorState::default(),
        };
        Ok(())
    }
}

/// The file being read.
struct Open {
    split: FileSplit,
    reader: BufReader<std::fs::File>,
}

/// A reader of the file source.
struct FileReader<T> {
    dir: PathBuf,
    parse: LineParser<T>,
    policy: ParseErrorPolicy,
    skipped: Arc<AtomicU64>,
    current: Option<Open>,
    queued: VecDeque<FileSplit>,
    list: Option<OperatorListState<FileSplit>>,
    no_more_splits: bool,
    next_ask: Instant,
    line: String,
}

impl<T> FileReader<T> {
    /// Opens `split` at its offset, after checking the file still has its listed length.
    fn open_split(&self, split: FileSplit) -> Result<Open, TaskError> {
        let path = self.dir.join(&split.file);
        let mut file = std::fs::File::open(&path).map_err(|e| {
            source_error(format!(
                "cannot open {} (listed with {} bytes, read to byte {}): {e}",
                path.display(),
                split.len,
                split.offset
            ))
        })?;
        let len = file
            .metadata()
            .map_err(|e| source_error(format!("cannot read {}: {e}", path.display())))?
            .len();
        if len != split.len || split.offset > len {
            return Err(source_error(format!(
                "{} has {len} bytes, but had {} when it was listed (read to byte {}): it changed, \
                 and its lines cannot be read exactly once",
                path.display(),
                split.len,
                split.offset
            )));
        }
        file.seek(SeekFrom::Start(split.offset))
            .map_err(|e| source_error(format!("cannot seek in {}: {e}", path.display())))?;
        Ok(Open {
            split,
            reader: BufReader::with_capacity(64 << 10, file),
        })
    }

    /// The next line of the open file into `out`; false at the file's end.
    fn read_line(&mut self, out: &mut Vec<T>) -> Result<bool, TaskError> {
        let Some(open) = self.current.as_mut() else {
            return Ok(false);
        };
        self.line.clear();
        let path = self.dir.join(&open.split.file);
        let n = open
            .reader
            .read_line(&mut self.line)
            .map_err(|e| source_error(format!("cannot read {}: {e}", path.display())))?;
        if n == 0 || open.split.offset >= open.split.len {
            return Ok(false);
        }
        let at = open.split.offset;
        open.split.offset += n as u64;
        let text = self.line.strip_suffix('\n').unwrap_or(&self.line);
        let text = text.strip_suffix('\r').unwrap_or(text);
        match (self.parse)(text) {
            Ok(v) => out.push(v),
            Err(why) if self.policy == ParseErrorPolicy::Fail => {
                return Err(source_error(format!(
                    "the line at byte {at} of {} does not parse: {why} (the job fails by policy; \
                     `ParseErrorPolicy::Skip` skips and counts such lines)",
                    path.display()
                )));
            }
            Err(why) => {
                let n = self.skipped.fetch_add(1, Ordering::Relaxed);
                if n < 10 || n.is_power_of_two() {
                    tracing::warn!(file = %path.display(), byte = at, skipped = n + 1,
                        "skipping a line that does not parse: {why}");
                }
            }
        }
        Ok(true)
    }
}

impl<T: Send + 'static> SourceFunction<T> for FileReader<T> {
    fn open(
        &mut self,
        _info: &SubtaskInfo,
        state: &mut OperatorStateBackend,
    ) -> Result<(), TaskError> {
        let list = state.list_state::<FileSplit>(SPLITS, OperatorStateMode::SplitDistribute)?;
        self.queued = state.get(&list)?.into();
        self.list = Some(list);
        Ok(())
    }

    fn next_batch(&mut self, out: &mut Vec<T>, max: usize) -> Result<SourceStatus, TaskError> {
        let before = out.len();
        while out.len() - before < max {
            if self.current.is_none() {
                match self.queued.pop_front() {
                    Some(split) => self.current = Some(self.open_split(split)?),
                    None => break,
                }
            }
            if !self.read_line(out)? {
                self.current = None;
            }
        }
        if out.len() > before {
            return Ok(SourceStatus::More);
        }
        if self.no_more_splits {
            return Ok(SourceStatus::End);
        }
        if Instant::now() >= self.next_ask {
            return Ok(SourceStatus::NeedSplits);
        }
        Ok(SourceStatus::Idle)
    }

    fn snapshot_state(&mut self, state: &mut OperatorStateBackend) -> Result<(), TaskError> {
        if let Some(list) = &self.list {
            let splits: Vec<FileSplit> = self
                .current
                .iter()
                .map(|o| o.split.clone())
                .chain(self.queued.iter().cloned())
                .collect();
            state.update(list, &splits)?;
        }
        Ok(())
    }

    fn add_splits(&mut self, splits: Vec<Vec<u8>>) -> Result<(), TaskError> {
        if splits.is_empty() {
            self.next_ask = Instant::now() + ASK_AGAIN;
        }
        for bytes in splits {
            self.queued.push_back(decode(&bytes, "split")?);
        }
        Ok(())
    }

    fn no_more_splits(&mut self) {
        self.no_more_splits = true;
    }
}

/// A file source; [`build`](Self::build) adds it to a job.
pub struct FileSource<T> {
    dir: PathBuf,
    monitor: Option<Duration>,
    parse: LineParser<T>,
    policy: ParseErrorPolicy,
    skipped: Arc<AtomicU64>,
}

impl FileSource<String> {
    /// The lines of the files in `dir`, as text.
    pub fn text_lines(dir: impl Into<PathBuf>) -> Self {
        FileSource::with_parser(dir, |line| Ok(line.to_string()))
    }
}

impl<T: crate::Data> FileSource<T> {
    /// The lines of the files in `dir`, each turned into an element by `parse` (JSON lines, CSV
    /// rows: any line format); read once.
    pub fn with_parser(
        dir: impl Into<PathBuf>,
        parse: impl Fn(&str) -> Result<T, String> + Send + Sync + 'static,
    ) -> Self {
        FileSource {
            dir: dir.into(),
            monitor: None,
            parse: Arc::new(parse),
            policy: ParseErrorPolicy::Fail,
            skipped: Arc::default(),
        }
    }

    /// Keeps watching the directory, listing it every `interval` for new files; the source
    /// never ends (Flink's `monitorContinuously`).
    pub fn monitor_continuously(mut self, interval: Duration) -> Self {
        self.monitor = Some(interval.max(Duration::from_millis(10)));
        self
    }

    /// What happens to a line that does not parse.
    pub fn on_parse_error(mut self, policy: ParseErrorPolicy) -> Self {
        self.policy = policy;
        self
    }

    /// Lines skipped because they did not parse.
    pub fn skipped(&self) -> Arc<AtomicU64> {
        self.skipped.clone()
    }

    /// Adds the source to `env`. Fails, naming it, when the directory cannot be listed.
    pub fn build(
        self,
        env: &crate::StreamEnvironment,
    ) -> Result<crate::DataStream<T>, crate::JobError> {
        list(&self.dir).map_err(crate::JobError::Invalid)?;
        let FileSource {
            dir,
            monitor,
            parse,
            policy,
            skipped,
        } = self;
        let readers_dir = dir.clone();
        Ok(env.add_source_with_enumerator(
            "File Source",
            move |_| {
                Box::new(FileReader {
                    dir: readers_dir.clone(),
                    parse: parse.clone(),
                    policy,
                    skipped: skipped.clone(),
                    current: None,
                    queued: VecDeque::new(),
                    list: None,
                    no_more_splits: false,
                    next_ask: Instant::now(),
                    line: String::new(),
                }) as Box<dyn SourceFunction<T>>
            },
            move |_| {
                Box::new(FileEnumerator {
                    dir: dir.clone(),
                    monitor,
                    last_listing: None,
                    state: EnumeratorState::default(),
                }) as Box<dyn SplitEnumerator>
            },
        ))
    }
}
