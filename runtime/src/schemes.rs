//! Checkpoint storage by URL scheme: a process registers a factory for its own storage's
//! scheme once (as Flink loads a file-system plugin per scheme), and every place that takes a
//! location then reaches it: `--checkpoint-dir`, `restore_from` / `--from`, savepoint
//! directories, and the task managers of a cluster (each builds the job's storage from its URL).

use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock, PoisonError, RwLock};
use weir_checkpoint::{CheckpointError, CheckpointStorage};

/// Makes a checkpoint storage rooted at a URL of its scheme (`mystore://bucket/prefix`). The
/// storage's [`CheckpointStorage::location_path`] should give URLs of the same form, so that a
/// printed checkpoint path can be passed back to `--from`.
pub type StorageFactory =
    Arc<dyn Fn(&str) -> Result<Arc<dyn CheckpointStorage>, CheckpointError> + Send + Sync>;

/// The schemes Weir serves itself.
const BUILT_IN: [&str; 3] = ["s3", "file", "memory"];

fn registry() -> &'static RwLock<BTreeMap<String, StorageFactory>> {
    static REGISTRY: OnceLock<RwLock<BTreeMap<String, StorageFactory>>> = OnceLock::new();
    REGISTRY.get_or_init(RwLock::default)
}

/// Registers `factory` for URLs `scheme://…` in this process (replacing an earlier one). Every
/// process of a cluster must register the same scheme before the job starts. A scheme must be
/// a letter followed by letters, digits, `+`, `-` or `.` (RFC 3986), and not one of Weir's own
/// (`s3`, `file`, `memory`); anything else is a [`CheckpointError::Config`] naming it.
///
/// ```
/// use std::sync::Arc;
/// use weir_checkpoint::OpendalCheckpointStorage;
/// // `demo:///abs/path` is a local directory (a real factory would parse its own URLs).
/// weir_runtime::register_storage_scheme("demo", |url: &str| {
///     let dir = url.trim_start_matches("demo://");
///     Ok(Arc::new(OpendalCheckpointStorage::fs(dir)?) as _)
/// })
/// .unwrap();
/// assert!(weir_runtime::register_storage_scheme("s3", |_: &str| unreachable!()).is_err());
/// ```
pub fn register_storage_scheme(
    scheme: &str,
    factory: impl Fn(&str) -> Result<Arc<dyn CheckpointStorage>, CheckpointError>
    + Send
    + Sync
    + 'static,
) -> Result<(), CheckpointError> {
    let valid = scheme.starts_with(|c: char| c.is_ascii_alphabetic())
        && scheme
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'));
    if !valid {
        return Err(CheckpointError::Config(format!(
            "{scheme:?} is not a URL scheme: a letter, then letters, digits, '+', '-' or '.'"
        )));
    }
    let scheme = scheme.to_ascii_lowercase();
    if BUILT_IN.contains(&scheme.as_str()) {
        return Err(CheckpointError::Config(format!(
            "{scheme}:// is Weir's own storage scheme and cannot be registered"
        )));
    }
    registry()
        .write()
        .unwrap_or_else(PoisonError::into_inner)
        .insert(scheme, Arc::new(factory));
    Ok(())
}

/// The scheme of a `scheme://…` URL, lower-cased; `None` for a path.
pub(crate) fn scheme_of(location: &str) -> Option<String> {
    let (scheme, _) = location.split_once("://")?;
    let valid = scheme.starts_with(|c: char| c.is_ascii_alphabetic())
        && scheme
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'));
    valid.then(|| scheme.to_ascii_lowercase())
}

/// Whether `location` is a URL of a registered (custom) scheme.
pub(crate) fn is_registered(location: &str) -> bool {
    scheme_of(location).is_some_and(|s| {
        registry()
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .contains_key(&s)
    })
}

/// The storage rooted at `url`, from its scheme's factory; an error names a scheme that no
/// factory was registered for in this process.
pub(crate) fn open(url: &str) -> Result<Arc<dyn CheckpointStorage>, CheckpointError> {
    let scheme = scheme_of(url)
        .ok_or_else(|| CheckpointError::Config(format!("{url:?} is not a URL (scheme://…)")))?;
    let factory = registry()
        .read()
        .unwrap_or_else(PoisonError::into_inner)
        .get(&scheme)
        .cloned()
        .ok_or_else(|| unregistered(&scheme))?;
    factory(url)
}

/// The error for a `scheme://` that is neither Weir's nor registered.
pub(crate) fn unregistered(scheme: &str) -> CheckpointError {
    CheckpointError::Config(format!(
        "no checkpoint storage is registered for {scheme}:// in this process (Weir serves s3:// \
         and local paths; register others with weir_runtime::register_storage_scheme)"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use weir_checkpoint::OpendalCheckpointStorage;

    #[test]
    fn schemes_are_parsed_as_rfc_3986_says() {
        assert_eq!(scheme_of("My+Store://b/p").as_deref(), Some("my+store"));
        assert_eq!(scheme_of("/tmp/a://b"), None);
        assert_eq!(scheme_of("relative/dir"), None);
        assert_eq!(scheme_of("1x://b"), None);
    }

    #[test]
    fn a_registered_scheme_opens_and_others_are_named() {
        register_storage_scheme("unit-test-mem", |_: &str| {
            Ok(Arc::new(OpendalCheckpointStorage::memory()?) as _)
        })
        .unwrap();
        assert!(is_registered("unit-test-mem://x"));
        assert!(open("UNIT-TEST-MEM://x").is_ok());
        let e = open("nowhere://x").err().unwrap().to_string();
        assert!(e.contains("nowhere://"), "{e}");
        for bad in ["", "1a", "a b", "s3", "FILE"] {
            assert!(
                register_storage_scheme(bad, |_: &str| unreachable!()).is_err(),
                "{bad}"
            );
        }
    }
}
