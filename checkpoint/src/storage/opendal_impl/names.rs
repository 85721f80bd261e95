//! The names and paths of the layout: `_metadata` and its temporary, state file names allowed,
//! and directory paths resolved and normalised inside the storage root.

use crate::CheckpointError;
use crate::storage::CheckpointLocation;

pub(super) use crate::storage::parse_checkpoint_dir as parse_chk;

/// The name of the file whose presence marks a checkpoint complete.
pub(super) const METADATA_FILE: &str = "_metadata";
/// Where `_metadata` is written before it is renamed into place, on services that can rename.
pub(super) const METADATA_INPROGRESS_FILE: &str = "_metadata.inprogress";

/// Checks that `name` is a plain file name that may hold state.
pub(super) fn validate_state_name(name: &str) -> Result<(), CheckpointError> {
    let bad = |why: &str| {
        Err(CheckpointError::Config(format!(
            "invalid state file name {name:?}: {why}"
        )))
    };
    if name.is_empty() {
        return bad("it is empty");
    }
    if name == "." || name == ".." {
        return bad("it must be a plain file name");
    }
    if name.contains(['/', '\\']) {
        return bad("it must be a plain file name, without '/' or '\\'");
    }
    if name.contains('\0') || name.chars().any(char::is_control) {
        return bad("it contains control characters");
    }
    if name == METADATA_FILE || name == METADATA_INPROGRESS_FILE {
        return bad("the name is reserved for the checkpoint's metadata");
    }
    Ok(())
}

/// A location's directory as a prefix: empty, or ending in `/`.
pub(super) fn dir_of(location: &CheckpointLocation) -> String {
    let dir = location.dir.trim_start_matches('/');
    if dir.is_empty() || dir.ends_with('/') {
        dir.to_string()
    } else {
        format!("{dir}/")
    }
}

/// Resolves `rel` (a handle's path) against `dir`, lexically, refusing to leave the root.
pub(super) fn resolve(dir: &str, rel: &str) -> Result<String, CheckpointError> {
    if rel.is_empty() || rel.starts_with('/') || rel.ends_with('/') || rel.contains('\\') {
        return Err(CheckpointError::Config(format!(
            "invalid state file path {rel:?} in location '{dir}': it must be a relative file path"
        )));
    }
    let mut parts: Vec<&str> = dir.split('/').filter(|s| !s.is_empty()).collect();
    for seg in rel.split('/') {
        match seg {
            "" | "." => {}
            ".." => {
                if parts.pop().is_none() {
                    return Err(CheckpointError::Config(format!(
                        "state file path {rel:?} in location '{dir}' leaves the storage root"
                    )));
                }
            }
            s => parts.push(s),
        }
    }
    Ok(parts.join("/"))
}

/// Normalises a user-given directory path (relative to the root) to `""` or `a/b/`.
pub(super) fn normalize_dir(path: &str) -> Result<String, CheckpointError> {
    let trimmed = path.trim_matches('/');
    if trimmed.is_empty() {
        return Ok(String::new());
    }
    let mut out = String::with_capacity(trimmed.len() + 1);
    for seg in trimmed.split('/') {
        match seg {
            "" | "." => {}
            ".." => {
                return Err(CheckpointError::Config(format!(
                    "checkpoint path {path:?} must not contain '..'"
                )));
            }
            s => {
                out.push_str(s);
                out.push('/');
            }
        }
    }
    Ok(out)
}

/// The last segment of a directory prefix (`"a/chk-3/"` → `"chk-3"`).
pub(super) fn last_segment(dir: &str) -> &str {
    dir.trim_end_matches('/').rsplit('/').next().unwrap_or("")
}

#[cfg(test)]
mod tests {
    use super::*;
    use weir_core::ids::CheckpointId;

    #[test]
    fn chk_names_parse_only_in_canonical_form() {
        assert_eq!(parse_chk("chk-7"), Some(CheckpointId(7)));
        assert_eq!(parse_chk("chk-0"), Some(CheckpointId(0)));
        for bad in [
            "chk-", "chk-007", "chk-+7", "chk-7a", "chk--1", "shared", "chk-7/",
        ] {
            assert_eq!(parse_chk(bad), None, "{bad}");
        }
    }

    #[test]
    fn state_names_must_be_plain() {
        assert!(validate_state_name("op-1-subtask-0.keyed").is_ok());
        for bad in [
            "",
            ".",
            "..",
            "a/b",
            "/a",
            "a\\b",
            "_metadata",
            "_metadata.inprogress",
            "a\nb",
        ] {
            assert!(
                matches!(validate_state_name(bad), Err(CheckpointError::Config(_))),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn handle_paths_resolve_inside_the_root() {
        assert_eq!(resolve("j/chk-1/", "s").unwrap(), "j/chk-1/s");
        assert_eq!(resolve("j/chk-1/", "../shared/x").unwrap(), "j/shared/x");
        assert_eq!(resolve("", "s").unwrap(), "s");
        assert!(resolve("j/chk-1/", "../../../etc/passwd").is_err());
        assert!(resolve("j/chk-1/", "/etc/passwd").is_err());
        assert!(resolve("j/chk-1/", "").is_err());
    }

    #[test]
    fn user_paths_normalise() {
        assert_eq!(normalize_dir("").unwrap(), "");
        assert_eq!(normalize_dir("/").unwrap(), "");
        assert_eq!(normalize_dir("a/chk-3").unwrap(), "a/chk-3/");
        assert_eq!(normalize_dir("/a//chk-3/").unwrap(), "a/chk-3/");
        assert!(normalize_dir("a/../b").is_err());
        assert_eq!(last_segment("a/chk-3/"), "chk-3");
        assert_eq!(last_segment(""), "");
    }
}
