//! Finding checkpoints: a user's path opened as checkpoint storage (local or `s3://`), the
//! checkpoint directories under it, each one's `_metadata` read and checked, and `list` over them.

use super::CliError;
use super::format::{format_time, kind_name};
use super::report::{ListEntry, ListStatus};
use futures::FutureExt;
use std::collections::BTreeMap;
use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};
use weir_checkpoint::metadata::{METADATA_MAGIC, METADATA_READ_VERSIONS};
use weir_checkpoint::storage::{CheckpointLocation, S3Config, is_s3_url};
use weir_checkpoint::{
    CheckpointError, CheckpointMetadata, CheckpointStorage, OpendalCheckpointStorage,
};
use weir_core::CoreError;
use weir_core::codec;
use weir_core::ids::JobId;
use weir_core::panic::panic_message;

/// The name of the file whose presence marks a checkpoint complete.
const METADATA_FILE: &str = "_metadata";

/// A user-given path opened as checkpoint storage.
pub(crate) struct Opened {
    /// The path as the user gave it, for messages.
    pub(crate) shown: String,
    /// The storage root, as paths under it are shown.
    root: Root,
    pub(crate) storage: OpendalCheckpointStorage,
    /// The user's path relative to `root`: `""` or `chk-<n>/`.
    pub(crate) rel: String,
}

/// Where the storage root of an opened path is.
enum Root {
    /// A local directory (absolute): paths under it are shown as local paths.
    Local(PathBuf),
    /// An S3 prefix: paths under it are shown as `s3://bucket/prefix/…` (this URL, normalised,
    /// without a trailing `/`).
    S3(String),
}

/// A checkpoint directory found under a path.
pub(super) struct Found {
    pub(super) id: Option<u64>,
    pub(super) location: CheckpointLocation,
    pub(super) complete: bool,
}

impl Opened {
    /// How `rel` (a path relative to the storage root) is shown: a local path, or an `s3://`
    /// URL.
    pub(crate) fn display(&self, rel: &str) -> String {
        let rel = rel.trim_end_matches('/');
        match &self.root {
            Root::Local(root) if rel.is_empty() => root.display().to_string(),
            Root::Local(root) => root.join(rel).display().to_string(),
            Root::S3(url) if rel.is_empty() => url.clone(),
            Root::S3(url) => format!("{url}/{rel}"),
        }
    }

    /// Whether the storage root is on S3.
    fn is_s3(&self) -> bool {
        matches!(self.root, Root::S3(_))
    }
}

/// The id of a directory named `chk-<n>`, in canonical decimal (the storage's one parser).
fn parse_chk(name: &str) -> Option<u64> {
    weir_checkpoint::storage::parse_checkpoint_dir(name).map(|id| id.0)
}

/// Opens `path`: an `s3://bucket/prefix` URL (configured from the AWS variables) or a local
/// directory.
pub(crate) fn open(path: &Path) -> Result<Opened, CliError> {
    // `file:///dir` is how a job prints its local locations.
    if let Some(local) = path.to_str().and_then(|p| p.strip_prefix("file://")) {
        return open_local(Path::new(local));
    }
    match path.to_str().filter(|p| is_s3_url(p)) {
        Some(url) => open_s3(url, |name| std::env::var(name).ok()),
        None => open_local(path),
    }
}

/// Opens `s3://bucket/prefix[/<job-id>[/chk-<n>]]` as the job does (`--from`): configured from
/// the standard AWS variables (looked up by `var`), a trailing `chk-<n>` opened from its parent.
/// Nothing is requested here: a prefix that holds nothing is "no checkpoint" when it is listed.
fn open_s3(url: &str, var: impl Fn(&str) -> Option<String>) -> Result<Opened, CliError> {
    let shown = url.to_string();
    let trimmed = url.trim_end_matches('/');
    let (root_url, rel) = match trimmed.rsplit_once('/') {
        Some((parent, name)) if parse_chk(name).is_some() && parent.len() > "s3://".len() => {
            (parent, format!("{name}/"))
        }
        _ => (trimmed, String::new()),
    };
    let usage = |e: CheckpointError| match e {
        CheckpointError::Config(msg) => CliError::Usage(format!("cannot open '{shown}': {msg}")),
        e => CliError::Failed(format!("cannot open '{shown}' as checkpoint storage: {e}")),
    };
    let config = S3Config::from_url_and_vars(root_url, var).map_err(usage)?;
    let root = Root::S3(config.url());
    let storage = OpendalCheckpointStorage::s3(config).map_err(usage)?;
    Ok(Opened {
        shown,
        root,
        storage,
        rel,
    })
}

/// Opens a local directory.
fn open_local(path: &Path) -> Result<Opened, CliError> {
    let shown = path.display().to_string();
    let meta = std::fs::metadata(path).map_err(|e| {
        if e.kind() == std::io::ErrorKind::NotFound {
            CliError::Usage(format!("'{shown}' does not exist"))
        } else {
            CliError::Usage(format!("cannot read '{shown}': {e}"))
        }
    })?;
    if !meta.is_dir() {
        return Err(CliError::Usage(format!(
            "'{shown}' is not a directory: expected a checkpoint root (holding <job-id>/chk-<n>), \
             a job directory or a chk-<n> directory"
        )));
    }
    let absolute = std::fs::canonicalize(path)
        .or_else(|_| std::path::absolute(path))
        .map_err(|e| CliError::Usage(format!("cannot resolve '{shown}': {e}")))?;
    // A `chk-<n>` directory is opened from its parent, so that its id comes from its name (and a
    // corrupt or missing `_metadata` is reported, not fatal to finding it).
    let chk_name = absolute
        .file_name()
        .and_then(|n| n.to_str())
        .filter(|n| parse_chk(n).is_some())
        .map(str::to_string);
    let (root, rel) = match (chk_name, absolute.parent()) {
        (Some(name), Some(parent)) => (parent.to_path_buf(), format!("{name}/")),
        _ => (absolute.clone(), String::new()),
    };
    let storage = OpendalCheckpointStorage::fs(&root).map_err(|e| {
        CliError::Failed(format!("cannot open '{shown}' as checkpoint storage: {e}"))
    })?;
    Ok(Opened {
        shown,
        root: Root::Local(root),
        storage,
        rel,
    })
}

/// Whether the storage root itself holds a `_metadata` file.
async fn root_has_metadata(opened: &Opened) -> bool {
    match &opened.root {
        Root::Local(root) => root.join(METADATA_FILE).is_file(),
        Root::S3(_) => matches!(
            opened.storage.operator().stat(METADATA_FILE).await,
            Ok(meta) if meta.mode().is_file()
        ),
    }
}

/// Every checkpoint under the opened path, sorted by id (as `find_checkpoints`).
pub(super) async fn find(opened: &Opened) -> Result<Vec<Found>, CliError> {
    // opendal 0.59's fs lister panics on a symbolic link to a directory ("mode DIR not match
    // with path …"); that is reported as an error naming the path, not as a crash.
    let listed = AssertUnwindSafe(opened.storage.find_checkpoints(&opened.rel))
        .catch_unwind()
        .await
        .map_err(|payload| {
            CliError::Failed(format!(
                "cannot list checkpoints under '{}': the storage library failed ({}){}",
                opened.shown,
                panic_message(payload.as_ref()),
                if opened.is_s3() {
                    ""
                } else {
                    "; a symbolic link to a directory inside it is a known cause"
                }
            ))
        })?;
    match listed {
        Ok(listings) => Ok(listings
            .into_iter()
            .map(|l| Found {
                id: Some(l.id.0),
                location: l.location,
                complete: l.complete,
            })
            .collect()),
        // A directory that holds a `_metadata` but is not named `chk-<n>` (a savepoint moved
        // elsewhere): its id comes from `_metadata`, which failed; it is still one checkpoint.
        Err(CheckpointError::Corrupt { .. })
            if opened.rel.is_empty() && root_has_metadata(opened).await =>
        {
            Ok(vec![Found {
                id: None,
                location: CheckpointLocation { dir: String::new() },
                complete: true,
            }])
        }
        Err(e) => Err(CliError::Failed(format!(
            "cannot list checkpoints under '{}': {e}",
            opened.shown
        ))),
    }
}

pub(super) fn no_checkpoint(opened: &Opened) -> CliError {
    let shown = &opened.shown;
    if opened.is_s3() {
        CliError::Usage(format!(
            "no checkpoint under '{shown}': nothing there is a checkpoint root (holding \
             <job-id>/chk-<n>/), a job prefix (holding chk-<n>/) or a chk-<n> prefix (on S3 a \
             prefix nothing was written to is empty, not missing: check the bucket and prefix)"
        ))
    } else {
        CliError::Usage(format!(
            "no checkpoint under '{shown}': expected a checkpoint root (holding \
             <job-id>/chk-<n>), a job directory (holding chk-<n>) or a chk-<n> directory"
        ))
    }
}

// ---------------------------------------------------------------------------------------------
// Reading `_metadata`.

/// `_metadata`, read and checked.
pub(super) struct LoadedMetadata {
    pub(super) metadata: CheckpointMetadata,
    pub(super) format_version: u16,
    pub(super) size: u64,
}

pub(super) enum MetadataRead {
    Ok(Box<LoadedMetadata>),
    /// Why it is corrupt, and its size in bytes.
    Corrupt(String, u64),
    Unreadable(String),
}

pub(super) async fn read_metadata(opened: &Opened, found: &Found) -> MetadataRead {
    let rel = found.location.metadata_path();
    let shown = opened.display(&rel);
    let bytes = match opened.storage.operator().read(&rel).await {
        Ok(buffer) => buffer.to_vec(),
        Err(e) if e.kind() == opendal::ErrorKind::NotFound => {
            return MetadataRead::Unreadable("_metadata does not exist".to_string());
        }
        Err(e) => return MetadataRead::Unreadable(format!("cannot read '{shown}': {e}")),
    };
    let size = bytes.len() as u64;
    // The envelope first, for its version and a reason without the path (the caller names the
    // file); then the payload, as `read_metadata` decodes it.
    let format_version = match codec::open(
        METADATA_FILE,
        METADATA_MAGIC,
        &METADATA_READ_VERSIONS,
        &bytes,
    ) {
        Ok((version, _)) => version,
        Err(CoreError::Corrupt { reason, .. }) => return MetadataRead::Corrupt(reason, size),
        Err(e) => return MetadataRead::Corrupt(e.to_string(), size),
    };
    let metadata = match CheckpointMetadata::from_bytes(METADATA_FILE, &bytes) {
        Ok(m) => m,
        Err(CheckpointError::Corrupt { reason, .. }) => {
            return MetadataRead::Corrupt(reason, size);
        }
        Err(e) => return MetadataRead::Corrupt(e.to_string(), size),
    };
    if let Err(reason) = metadata.check_location(&found.location) {
        return MetadataRead::Corrupt(reason, size);
    }
    MetadataRead::Ok(Box::new(LoadedMetadata {
        metadata,
        format_version,
        size,
    }))
}

// ---------------------------------------------------------------------------------------------
// list.

/// The name of the directory (or S3 prefix) that holds `path`, a local path or an `s3://` URL:
/// the job directory of a checkpoint directory.
fn parent_name(path: &str) -> Option<&str> {
    let separators = ['/', std::path::MAIN_SEPARATOR];
    let mut segments = path.trim_end_matches(separators).rsplit(separators);
    segments.next()?;
    segments.next().filter(|name| !name.is_empty())
}

/// Lists every checkpoint under `root` (a storage root, a job directory or a `chk-<n>`
/// directory), sorted by job, then id. Corrupt checkpoints are entries, not errors; a path that
/// does not exist or holds no checkpoint is a [`CliError::Usage`].
pub async fn list(root: &Path) -> Result<Vec<ListEntry>, CliError> {
    let opened = open(root)?;
    let found = find(&opened).await?;
    if found.is_empty() {
        return Err(no_checkpoint(&opened));
    }
    let mut entries = Vec::with_capacity(found.len());
    for f in &found {
        let path = opened.display(&f.location.dir);
        let dir_job_id = parent_name(&path)
            .and_then(JobId::parse)
            .map(|j| j.to_string());
        let mut entry = ListEntry {
            status: ListStatus::Incomplete,
            id: f.id,
            path,
            job_name: None,
            job_id: dir_job_id,
            completed_at: None,
            completion_timestamp_ms: None,
            kind: None,
            state_size: None,
            in_flight_size: None,
            unaligned: None,
            reason: None,
        };
        if f.complete {
            match read_metadata(&opened, f).await {
                MetadataRead::Ok(loaded) => {
                    let m = &loaded.metadata;
                    entry.status = ListStatus::Completed;
                    entry.id = Some(m.checkpoint_id.0);
                    entry.job_name = Some(m.job_name.clone());
                    entry.job_id = Some(m.job_id.to_string());
                    entry.completed_at = Some(format_time(m.completion_timestamp_ms));
                    entry.completion_timestamp_ms = Some(m.completion_timestamp_ms);
                    entry.kind = Some(kind_name(m.kind).to_string());
                    entry.state_size = Some(m.state_size());
                    entry.in_flight_size = Some(m.in_flight_size());
                    entry.unaligned = Some(!m.in_flight.is_empty());
                }
                MetadataRead::Corrupt(reason, _) => {
                    entry.status = ListStatus::Corrupt;
                    entry.reason = Some(format!("_metadata: {reason}"));
                }
                MetadataRead::Unreadable(reason) => {
                    entry.status = ListStatus::Unreadable;
                    entry.reason = Some(format!("_metadata: {reason}"));
                }
            }
        }
        entries.push(entry);
    }
    // By job (its name, known from any readable `_metadata` of the job), then id.
    let names: BTreeMap<String, String> = entries
        .iter()
        .filter_map(|e| Some((e.job_id.clone()?, e.job_name.clone()?)))
        .collect();
    entries.sort_by_cached_key(|e| {
        let name = e
            .job_name
            .clone()
            .or_else(|| e.job_id.as_ref().and_then(|j| names.get(j).cloned()))
            .unwrap_or_default();
        (name, e.job_id.clone(), e.id, e.path.clone())
    });
    Ok(entries)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chk_names() {
        assert_eq!(parse_chk("chk-12"), Some(12));
        assert_eq!(parse_chk("chk-012"), None);
        assert_eq!(parse_chk("chk-"), None);
        assert_eq!(parse_chk("shared"), None);
    }

    #[test]
    fn parent_names_of_local_paths_and_s3_urls() {
        assert_eq!(parent_name("/tmp/ckpt/job/chk-3"), Some("job"));
        assert_eq!(parent_name("s3://bkt/p/job/chk-3"), Some("job"));
        assert_eq!(parent_name("s3://bkt/job/chk-3/"), Some("job"));
        assert_eq!(parent_name("s3://bkt"), None);
        assert_eq!(parent_name("/chk-3"), None);
    }

    #[test]
    fn s3_paths_are_shown_as_urls_under_the_normalised_root() {
        let creds = |name: &str| match name {
            "AWS_ACCESS_KEY_ID" => Some("a".to_string()),
            "AWS_SECRET_ACCESS_KEY" => Some("s".to_string()),
            _ => None,
        };
        // A trailing chk-<n> is opened from its parent; doubled `/` are normalised.
        let o = open_s3("s3://bkt//p/job/chk-3/", creds).unwrap();
        assert_eq!(o.rel, "chk-3/");
        assert_eq!(o.shown, "s3://bkt//p/job/chk-3/");
        assert_eq!(o.display(""), "s3://bkt/p/job");
        assert_eq!(o.display("chk-3/"), "s3://bkt/p/job/chk-3");
        assert_eq!(
            o.display("chk-3/_metadata"),
            "s3://bkt/p/job/chk-3/_metadata"
        );
        // A bucket named chk-<n>, and a bucket's root.
        let o = open_s3("s3://chk-3", creds).unwrap();
        assert_eq!((o.rel.as_str(), o.display("")), ("", "s3://chk-3".into()));
        let o = open_s3("s3://bkt/chk-4", creds).unwrap();
        assert_eq!(o.rel, "chk-4/");
        assert_eq!(o.display("chk-4/x"), "s3://bkt/chk-4/x");
        // Bad input is a usage error naming the problem.
        let usage = |url: &str, var: &dyn Fn(&str) -> Option<String>| match open_s3(url, var) {
            Err(CliError::Usage(msg)) => msg,
            other => panic!("{url}: {:?}", other.err()),
        };
        let msg = usage("s3:///x", &creds);
        assert!(
            msg.contains("s3:///x") && msg.contains("no bucket"),
            "{msg}"
        );
        let msg = usage("s3://bkt/p", &|_| None);
        assert!(msg.contains("no credentials"), "{msg}");
    }
}
