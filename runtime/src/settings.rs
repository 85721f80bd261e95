//! Configuration keys, in Flink's names, applied to a [`JobConfig`]: how a deployment chooses the
//! state backend and its checkpoint behaviour without changing the program
//! (`state.backend.type: disk`, or `word_count -D state.backend.type=disk`).

use crate::config::JobConfig;
use crate::error::JobError;
use std::path::PathBuf;
use std::sync::Arc;

/// The keys [`apply`] knows, each with what it takes.
pub const KEYS: [(&str, &str); 4] = [
    (
        "state.backend.type",
        "heap (typed hash tables, the default; Flink's hashmap), disk (sorted runs on local disk) or memory-store",
    ),
    (
        "state.backend.disk.local-dir",
        "the disk backend's local directory (Flink's state.backend.rocksdb.localdir)",
    ),
    (
        "state.backend.incremental",
        "true or false: incremental (for the disk backend, native) checkpoints",
    ),
    (
        "state.checkpoints.num-retained",
        "how many completed checkpoints to keep (at least 1)",
    ),
];

/// Applies `settings` (key, value) to `config`, as a whole: the backend is built once from
/// `state.backend.type` and `state.backend.disk.local-dir` together, in any order. An unknown
/// key, a bad value, or a local directory without the disk backend is an error naming it, and
/// leaves `config` unchanged.
pub fn apply(config: &mut JobConfig, settings: &[(String, String)]) -> Result<(), JobError> {
    let bad = |key: &str, value: &str, why: String| {
        JobError::Invalid(format!("configuration {key}={value:?}: {why}"))
    };
    let mut backend_type: Option<&str> = None;
    let mut local_dir: Option<PathBuf> = None;
    let mut incremental = None;
    let mut retained = None;
    let mut seen = std::collections::HashSet::new();
    for (key, value) in settings {
        let (key, value) = (key.trim(), value.trim());
        if !seen.insert(key) {
            return Err(JobError::Invalid(format!(
                "configuration key {key} is given twice"
            )));
        }
        match key {
            "state.backend.type" => {
                let name = if value == "hashmap" { "heap" } else { value };
                if !weir_state::BUILT_IN_STATE_BACKENDS.contains(&name) {
                    return Err(bad(
                        key,
                        value,
                        format!("one of {}", weir_state::BUILT_IN_STATE_BACKENDS.join(", ")),
                    ));
                }
                backend_type = Some(name);
            }
            "state.backend.disk.local-dir" => {
                if value.is_empty() {
                    return Err(bad(key, value, "an empty directory".into()));
                }
                local_dir = Some(PathBuf::from(value));
            }
            "state.backend.incremental" => {
                incremental = Some(match value {
                    "true" => true,
                    "false" => false,
                    _ => return Err(bad(key, value, "true or false".into())),
                });
            }
            "state.checkpoints.num-retained" => match value.parse::<u32>() {
                Ok(n) if n >= 1 => retained = Some(n),
                _ => return Err(bad(key, value, "a whole number, at least 1".into())),
            },
            _ => {
                let known: Vec<&str> = KEYS.iter().map(|(k, _)| *k).collect();
                return Err(JobError::Invalid(format!(
                    "unknown configuration key {key:?}; known: {}",
                    known.join(", ")
                )));
            }
        }
    }
    let backend: Option<Arc<dyn weir_state::StateBackend>> = match (backend_type, local_dir) {
        (Some("disk"), Some(dir)) => Some(Arc::new(weir_state::DiskStateBackend::new(dir))),
        (Some(other), Some(_)) => {
            return Err(JobError::Invalid(format!(
                "state.backend.disk.local-dir is the disk backend's directory, and \
                 state.backend.type is {other}"
            )));
        }
        (None, Some(_)) => {
            return Err(JobError::Invalid(
                "state.backend.disk.local-dir needs state.backend.type=disk".into(),
            ));
        }
        // The program's own backend of that type stays (its directory and options).
        (Some(name), None) if config.state_backend.name() == name => None,
        (Some(name), None) => Some(
            weir_state::built_in_state_backend(name)
                .map_err(|e| JobError::Invalid(e.to_string()))?,
        ),
        (None, None) => None,
    };
    if let Some(b) = backend {
        config.state_backend = b;
    }
    if let Some(i) = incremental {
        config.incremental = i;
    }
    if let Some(n) = retained {
        config.checkpoint.num_retained = n;
    }
    Ok(())
}

/// Parses `KEY=VALUE` (a `-D` flag's argument).
pub fn parse_pair(text: &str) -> Result<(String, String), String> {
    match text.split_once('=') {
        Some((k, v)) if !k.trim().is_empty() => Ok((k.trim().to_string(), v.trim().to_string())),
        _ => Err(format!("{text:?} is not KEY=VALUE")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(p: &[(&str, &str)]) -> Vec<(String, String)> {
        p.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn the_backend_type_key_chooses_the_backend() {
        let mut c = JobConfig::default();
        assert_eq!(c.state_backend.name(), "heap");
        apply(&mut c, &pairs(&[("state.backend.type", "disk")])).unwrap();
        assert_eq!(c.state_backend.name(), "disk");
        apply(&mut c, &pairs(&[("state.backend.type", "hashmap")])).unwrap();
        assert_eq!(c.state_backend.name(), "heap");
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().display().to_string();
        // Either order.
        apply(
            &mut c,
            &pairs(&[
                ("state.backend.disk.local-dir", &d),
                ("state.backend.type", "disk"),
                ("state.backend.incremental", "true"),
                ("state.checkpoints.num-retained", "3"),
            ]),
        )
        .unwrap();
        assert_eq!(c.state_backend.local_dir(), Some(dir.path().to_path_buf()));
        // The type alone keeps a backend of that type as the program set it.
        apply(&mut c, &pairs(&[("state.backend.type", "disk")])).unwrap();
        assert_eq!(c.state_backend.local_dir(), Some(dir.path().to_path_buf()));
        assert!(c.incremental);
        assert_eq!(c.checkpoint.num_retained, 3);
    }

    #[test]
    fn bad_keys_and_values_are_named_and_change_nothing() {
        let mut c = JobConfig::default();
        for (p, needle) in [
            (vec![("state.backend.type", "rocksdb")], "rocksdb"),
            (
                vec![("state.backend.tpye", "disk")],
                "unknown configuration key",
            ),
            (vec![("state.backend.incremental", "yes")], "true or false"),
            (vec![("state.checkpoints.num-retained", "0")], "at least 1"),
            (vec![("state.backend.disk.local-dir", "/tmp/x")], "needs"),
            (
                vec![
                    ("state.backend.type", "disk"),
                    ("state.backend.type", "heap"),
                ],
                "twice",
            ),
            (
                vec![
                    ("state.backend.type", "heap"),
                    ("state.backend.disk.local-dir", "/tmp/x"),
                ],
                "is heap",
            ),
            (
                vec![
                    ("state.backend.type", "disk"),
                    ("state.backend.incremental", "maybe"),
                ],
                "maybe",
            ),
        ] {
            let e = apply(&mut c, &pairs(&p)).unwrap_err().to_string();
            assert!(e.contains(needle), "{p:?}: {e}");
            assert_eq!(c.state_backend.name(), "heap", "{p:?} changed the backend");
            assert!(!c.incremental);
        }
        assert_eq!(
            parse_pair("a.b = c").unwrap(),
            ("a.b".to_string(), "c".to_string())
        );
        assert!(parse_pair("novalue").is_err());
        assert!(parse_pair("=v").is_err());
    }
}
