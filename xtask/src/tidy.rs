//! `cargo xtask tidy`: the workspace's dependency direction, the `//!` first line of `.rs` files,
//! and each crate's shape (no import cycle between its modules; long functions and files reported).

use anyhow::{Context, Result, bail};
use serde_json::Value;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The allowed internal dependencies (normal, dev and build) of each workspace package.
const ALLOWED: &[(&str, &[&str])] = &[
    ("weir-core", &[]),
    ("weir-state", &["weir-core"]),
    ("weir-checkpoint", &["weir-core"]),
    ("weir-network", &["weir-core"]),
    (
        "weir-runtime",
        &["weir-core", "weir-state", "weir-checkpoint", "weir-network"],
    ),
    ("weir-examples", &["weir-runtime", "weir-core"]),
    // The Kafka connectors: a user of the public API (a source with a split enumerator, a sink
    // with operator state); its example reuses the word count's generator.
    (
        "weir-kafka",
        &["weir-runtime", "weir-core", "weir-state", "weir-examples"],
    ),
    // The Nexmark benchmark: a user of the public API, like the examples.
    ("weir-nexmark", &["weir-runtime", "weir-core"]),
    // Plugs its own keyed store, checkpoint storage and transport into jobs, and runs each
    // seam's conformance suite: it implements the seams' traits, so it depends on their crates.
    (
        "weir-example-custom-seams",
        &[
            "weir-core",
            "weir-state",
            "weir-checkpoint",
            "weir-network",
            "weir-runtime",
        ],
    ),
    (
        "weir-fuzz",
        &[
            "weir-core",
            "weir-state",
            "weir-checkpoint",
            "weir-network",
            "weir-runtime",
        ],
    ),
    // Runs whole jobs under seeded faults: the runtime's public API, the storage it wraps in
    // faults, and the hooks in core.
    (
        "weir-sim",
        &["weir-core", "weir-checkpoint", "weir-runtime"],
    ),
    ("xtask", &[]),
];

/// A dependency of one workspace package on another.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Edge {
    /// The depending package.
    pub from: String,
    /// The package depended on.
    pub to: String,
    /// `normal`, `dev` or `build`.
    pub kind: String,
}

/// Runs both checks, reporting every problem found before failing.
pub fn run(root: &Path) -> Result<()> {
    let metadata = cargo_metadata(root)?;
    let edges = internal_edges(&metadata)?;
    let mut problems = check_edges(&edges);
    let files = rust_files(root)?;
    for file in &files {
        let text = match std::fs::read_to_string(root.join(file)) {
            Ok(text) => text,
            // Tracked but deleted in the work tree: nothing to check.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e).with_context(|| format!("reading {}", file.display())),
        };
        if !starts_with_doc_line(&text) {
            problems.push(format!(
                "{}: the first line must be a `//!` doc line",
                file.display()
            ));
        }
    }
    let mut notes = Vec::new();
    for (name, src) in crate_sources(root, &metadata)? {
        let in_crate: Vec<PathBuf> = files
            .iter()
            .filter(|f| f.starts_with(&src))
            .cloned()
            .collect();
        let found = crate::structure::check_crate(root, &src, &in_crate)
            .with_context(|| format!("reading the sources of {name}"))?;
        for cycle in found.cycles {
            problems.push(format!(
                "{name}: an import cycle between its modules: {} (a module names another through \
                 `crate::`; move what they share into a module both use)",
                cycle.join(" <-> ")
            ));
        }
        notes.extend(
            found
                .long_fns
                .into_iter()
                .map(|f| format!("{f} (over {} lines)", crate::structure::MAX_FN_LINES)),
        );
        notes.extend(
            found
                .long_files
                .into_iter()
                .map(|f| format!("{f} (over {})", crate::structure::MAX_FILE_LINES)),
        );
    }
    for n in &notes {
        println!("tidy: note: {n}");
    }
    if !problems.is_empty() {
        for p in &problems {
            eprintln!("tidy: {p}");
        }
        bail!("tidy found {} problem(s)", problems.len());
    }
    println!(
        "tidy: ok ({} internal dependency edges, {} .rs files)",
        edges.len(),
        files.len()
    );
    Ok(())
}

/// Each workspace package's name and its `src` directory, relative to `root`.
fn crate_sources(root: &Path, metadata: &Value) -> Result<Vec<(String, PathBuf)>> {
    let root = std::fs::canonicalize(root).unwrap_or_else(|_| root.to_path_buf());
    let mut out = Vec::new();
    for package in metadata["packages"].as_array().into_iter().flatten() {
        let name = package["name"].as_str().unwrap_or("?").to_string();
        let Some(manifest) = package["manifest_path"].as_str() else {
            continue;
        };
        let dir = Path::new(manifest).parent().unwrap_or(Path::new(""));
        let rel = dir.strip_prefix(&root).unwrap_or(dir);
        out.push((name, rel.join("src")));
    }
    Ok(out)
}

fn cargo_metadata(root: &Path) -> Result<Value> {
    let program = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let out = Command::new(program)
        .current_dir(root)
        .args(["metadata", "--format-version", "1", "--no-deps"])
        .output()
        .context("could not run `cargo metadata`")?;
    if !out.status.success() {
        bail!(
            "`cargo metadata` failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    serde_json::from_slice(&out.stdout).context("parsing `cargo metadata` output")
}

/// The target directory `cargo metadata` reports (honours `CARGO_TARGET_DIR` and config).
pub fn target_dir(root: &Path) -> Result<PathBuf> {
    let metadata = cargo_metadata(root)?;
    metadata["target_directory"]
        .as_str()
        .map(PathBuf::from)
        .context("`cargo metadata` has no target_directory")
}

/// The dependencies between workspace packages, from `cargo metadata --no-deps` JSON.
pub fn internal_edges(metadata: &Value) -> Result<Vec<Edge>> {
    let packages = metadata["packages"]
        .as_array()
        .context("`cargo metadata` output has no `packages` array")?;
    let names: BTreeSet<&str> = packages.iter().filter_map(|p| p["name"].as_str()).collect();
    let mut edges = BTreeSet::new();
    for package in packages {
        let from = package["name"]
            .as_str()
            .context("a package without a name")?;
        for dep in package["dependencies"].as_array().into_iter().flatten() {
            let to = dep["name"]
                .as_str()
                .context("a dependency without a name")?;
            if names.contains(to) {
                edges.insert(Edge {
                    from: from.to_string(),
                    to: to.to_string(),
                    kind: dep["kind"].as_str().unwrap_or("normal").to_string(),
                });
            }
        }
    }
    Ok(edges.into_iter().collect())
}

/// Every edge outside [`ALLOWED`], as a message naming it.
pub fn check_edges(edges: &[Edge]) -> Vec<String> {
    let mut problems = Vec::new();
    for e in edges {
        // A crate's tests may enable its own features (the conformance suites) through a
        // dev-dependency on itself.
        if e.from == e.to && e.kind == "dev" {
            continue;
        }
        match ALLOWED.iter().find(|(name, _)| *name == e.from) {
            None => problems.push(format!(
                "`{}` depends on `{}` ({}), but `{}` has no entry in the dependency policy \
                 (xtask/src/tidy.rs ALLOWED)",
                e.from, e.to, e.kind, e.from
            )),
            Some((_, allowed)) if !allowed.contains(&e.to.as_str()) => {
                let allowed = if allowed.is_empty() {
                    "none of the workspace's crates".to_string()
                } else {
                    allowed.join(", ")
                };
                problems.push(format!(
                    "forbidden dependency edge `{}` -> `{}` ({} dependency); `{}` may depend on: {allowed}",
                    e.from, e.to, e.kind, e.from
                ));
            }
            Some(_) => {}
        }
    }
    problems
}

/// Whether a file's very first line is a `//!` doc line.
pub fn starts_with_doc_line(text: &str) -> bool {
    text.strip_prefix('\u{feff}')
        .unwrap_or(text)
        .starts_with("//!")
}

/// The `.rs` files git knows of (tracked, plus untracked ones not ignored), relative to `root`;
/// without git, every `.rs` file under `root` outside `target` and hidden directories.
fn rust_files(root: &Path) -> Result<Vec<PathBuf>> {
    let git = Command::new("git")
        .current_dir(root)
        .args([
            "ls-files",
            "-z",
            "--cached",
            "--others",
            "--exclude-standard",
            "--",
            "*.rs",
        ])
        .output();
    match git {
        Ok(out) if out.status.success() => {
            let files: BTreeSet<PathBuf> = out
                .stdout
                .split(|b| *b == 0)
                .filter(|s| !s.is_empty())
                .map(|s| PathBuf::from(String::from_utf8_lossy(s).into_owned()))
                .collect();
            Ok(files.into_iter().collect())
        }
        _ => {
            eprintln!("tidy: git unavailable; walking the tree instead");
            let mut files = Vec::new();
            walk(root, root, &mut files)?;
            files.sort();
            Ok(files)
        }
    }
}

fn walk(root: &Path, dir: &Path, out: &mut Vec<PathBuf>) -> Result<()> {
    for entry in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let entry = entry?;
        let path = entry.path();
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if entry.file_type()?.is_dir() {
            if !name.starts_with('.') && name != "target" {
                walk(root, &path, out)?;
            }
        } else if name.ends_with(".rs") {
            out.push(path.strip_prefix(root).unwrap_or(&path).to_path_buf());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn dep(name: &str, kind: Option<&str>) -> Value {
        json!({ "name": name, "kind": kind, "path": format!("/ws/{name}") })
    }

    fn metadata(packages: Vec<(&str, Vec<Value>)>) -> Value {
        let packages: Vec<Value> = packages
            .into_iter()
            .map(|(name, deps)| json!({ "name": name, "dependencies": deps }))
            .collect();
        json!({ "packages": packages, "target_directory": "/ws/target" })
    }

    fn edge(from: &str, to: &str, kind: &str) -> Edge {
        Edge {
            from: from.into(),
            to: to.into(),
            kind: kind.into(),
        }
    }

    #[test]
    fn edges_keep_only_workspace_packages_with_their_kind() {
        let m = metadata(vec![
            ("weir-core", vec![dep("serde", None)]),
            (
                "weir-state",
                vec![
                    dep("weir-core", None),
                    dep("weir-core", Some("dev")),
                    dep("tempfile", Some("dev")),
                ],
            ),
            ("weir-runtime", vec![dep("weir-network", Some("build"))]),
            ("weir-network", vec![]),
        ]);
        let edges = internal_edges(&m).unwrap();
        assert_eq!(
            edges,
            vec![
                edge("weir-runtime", "weir-network", "build"),
                edge("weir-state", "weir-core", "dev"),
                edge("weir-state", "weir-core", "normal"),
            ]
        );
    }

    #[test]
    fn the_intended_graph_passes() {
        let edges = vec![
            edge("weir-state", "weir-core", "normal"),
            edge("weir-checkpoint", "weir-core", "normal"),
            edge("weir-network", "weir-core", "dev"),
            edge("weir-runtime", "weir-core", "normal"),
            edge("weir-runtime", "weir-state", "normal"),
            edge("weir-runtime", "weir-checkpoint", "normal"),
            edge("weir-runtime", "weir-network", "normal"),
            edge("weir-examples", "weir-runtime", "normal"),
            edge("weir-examples", "weir-core", "normal"),
            edge("weir-fuzz", "weir-state", "normal"),
            edge("weir-fuzz", "weir-network", "normal"),
            edge("weir-fuzz", "weir-runtime", "normal"),
        ];
        assert_eq!(check_edges(&edges), Vec::<String>::new());
    }

    #[test]
    fn forbidden_edges_are_named() {
        let edges = vec![
            edge("weir-core", "weir-state", "dev"),
            edge("weir-state", "weir-checkpoint", "normal"),
            edge("weir-examples", "weir-state", "build"),
            edge("xtask", "weir-core", "normal"),
            edge("weir-runtime", "weir-core", "normal"),
            edge("weir-runtime", "weir-fuzz", "dev"),
        ];
        let problems = check_edges(&edges);
        assert_eq!(problems.len(), 5, "{problems:#?}");
        assert!(problems[0].contains("`weir-core` -> `weir-state` (dev dependency)"));
        assert!(problems[0].contains("none of the workspace's crates"));
        assert!(problems[1].contains("`weir-state` -> `weir-checkpoint`"));
        assert!(problems[2].contains("`weir-examples` -> `weir-state` (build dependency)"));
        assert!(problems[3].contains("`xtask` -> `weir-core`"));
        assert!(problems[4].contains("`weir-runtime` -> `weir-fuzz`"));
    }

    #[test]
    fn unknown_packages_are_reported() {
        let problems = check_edges(&[edge("weir-sql", "weir-core", "normal")]);
        assert_eq!(problems.len(), 1);
        assert!(problems[0].contains("`weir-sql` has no entry"));
    }

    #[test]
    fn doc_line_must_come_first() {
        assert!(starts_with_doc_line("//! Crate docs.\nfn main() {}\n"));
        assert!(starts_with_doc_line("//!\n//! Spaced docs.\n"));
        assert!(starts_with_doc_line(
            "\u{feff}//! With a byte-order mark.\n"
        ));
        assert!(!starts_with_doc_line("\n//! A blank line first.\n"));
        assert!(!starts_with_doc_line("  //! Indented.\n"));
        assert!(!starts_with_doc_line("// A plain comment.\n//! Docs.\n"));
        assert!(!starts_with_doc_line("/// An item doc.\nfn f() {}\n"));
        assert!(!starts_with_doc_line("#![allow(dead_code)]\n//! Docs.\n"));
        assert!(!starts_with_doc_line(""));
    }
}
