//! The shape of each crate's source: import cycles between its top-level modules (a failure),
//! and functions over [`MAX_FN_LINES`] or files over [`MAX_FILE_LINES`] outside tests (reported).
//!
//! A module `a` uses `b` when its code, comments and strings left out, names `crate::b` (alone
//! or in a `crate::{b::…, …}` group). Test code (an item under `#[cfg(test)]`) is left out too.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// A non-test function longer than this many lines is reported.
pub const MAX_FN_LINES: usize = 150;
/// A file with more non-test lines than this is reported.
pub const MAX_FILE_LINES: usize = 800;

/// What one crate's sources showed.
#[derive(Debug, Default)]
pub struct Findings {
    /// Each import cycle, as its modules sorted.
    pub cycles: Vec<Vec<String>>,
    /// `file:line fn name is N lines`.
    pub long_fns: Vec<String>,
    /// `file is N lines`.
    pub long_files: Vec<String>,
}

/// `text` with comments and the contents of string and char literals blanked out (newlines
/// kept, so line numbers stay), for finding paths and braces.
pub fn code_only(text: &str) -> String {
    let b: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    let blank = |c: char| if c == '\n' { '\n' } else { ' ' };
    while i < b.len() {
        let c = b[i];
        let next = b.get(i + 1).copied();
        if c == '/' && next == Some('/') {
            while i < b.len() && b[i] != '\n' {
                out.push(' ');
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            let mut depth = 0;
            while i < b.len() {
                if b[i] == '/' && b.get(i + 1) == Some(&'*') {
                    depth += 1;
                    out.push_str("  ");
                    i += 2;
                } else if b[i] == '*' && b.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    out.push_str("  ");
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    out.push(blank(b[i]));
                    i += 1;
                }
            }
        } else if c == 'r' && (next == Some('"') || next == Some('#')) && raw_string_at(&b, i) {
            // r"…" or r#"…"#: ends at a quote followed by as many hashes.
            let mut j = i + 1;
            let mut hashes = 0;
            while b.get(j) == Some(&'#') {
                hashes += 1;
                j += 1;
            }
            out.push_str(&" ".repeat(j + 1 - i));
            i = j + 1;
            while i < b.len() {
                if b[i] == '"' && (1..=hashes).all(|k| b.get(i + k) == Some(&'#')) {
                    out.push_str(&" ".repeat(hashes + 1));
                    i += hashes + 1;
                    break;
                }
                out.push(blank(b[i]));
                i += 1;
            }
        } else if c == '"' {
            out.push(' ');
            i += 1;
            while i < b.len() && b[i] != '"' {
                if b[i] == '\\' {
                    out.push(' ');
                    i += 1;
                }
                if i < b.len() {
                    out.push(blank(b[i]));
                    i += 1;
                }
            }
            out.push(' ');
            i += 1;
        } else if c == '\'' && next == Some('\\') {
            // '\n', '\'', '\u{..}'
            // The escaped character is skipped, then the closing quote.
            let mut j = i + 3;
            while j < b.len() && b[j] != '\'' {
                j += 1;
            }
            out.push_str(&" ".repeat(j + 1 - i));
            i = j + 1;
        } else if c == '\'' && b.get(i + 2) == Some(&'\'') {
            out.push_str("   ");
            i += 3;
        } else {
            out.push(c);
            i += 1;
        }
    }
    out
}

/// Whether `b[i..]` starts a raw string (`r"` or `r#…"`), not an identifier ending in `r`.
fn raw_string_at(b: &[char], i: usize) -> bool {
    // `br"…"` and `cr"…"` are raw strings too.
    let ident = |c: char| c.is_alphanumeric() || c == '_';
    let prefixed = i > 0 && matches!(b[i - 1], 'b' | 'c') && (i < 2 || !ident(b[i - 2]));
    if i > 0 && ident(b[i - 1]) && !prefixed {
        return false;
    }
    let mut j = i + 1;
    while b.get(j) == Some(&'#') {
        j += 1;
    }
    b.get(j) == Some(&'"')
}

/// `code` (from [`code_only`]) without the items under `#[cfg(test)]`, blanked out.
pub fn without_tests(code: &str) -> String {
    let mut out: Vec<char> = code.chars().collect();
    let text: String = out.iter().collect();
    let mut from = 0;
    while let Some(at) = text[from..].find("#[cfg(test)]") {
        let start = from + at;
        // The item ends at the `;` or the brace that closes its first `{`.
        let chars: Vec<(usize, char)> = text[start..].char_indices().collect();
        let mut depth = 0usize;
        let mut end = text.len();
        for (k, c) in chars {
            match c {
                '{' => depth += 1,
                '}' => {
                    depth = depth.saturating_sub(1);
                    if depth == 0 {
                        end = start + k + 1;
                        break;
                    }
                }
                ';' if depth == 0 && k > "#[cfg(test)]".len() => {
                    end = start + k + 1;
                    break;
                }
                _ => {}
            }
        }
        let (cs, ce) = (text[..start].chars().count(), text[..end].chars().count());
        for c in &mut out[cs..ce] {
            if *c != '\n' {
                *c = ' ';
            }
        }
        from = end;
    }
    out.into_iter().collect()
}

/// The top-level modules `code` names through `crate::`.
pub fn crate_refs(code: &str) -> BTreeSet<String> {
    let mut refs = BTreeSet::new();
    let mut rest = code;
    while let Some(at) = rest.find("crate::") {
        let before = rest[..at].chars().next_back();
        rest = &rest[at + "crate::".len()..];
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            continue; // `foo_crate::`
        }
        let trimmed = rest.trim_start();
        if let Some(group) = trimmed.strip_prefix('{') {
            // `crate::{a::X, b, c::{..}}`: the first segment of each top-level entry.
            let mut depth = 0;
            let mut entry_start = true;
            for (k, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => entry_start = true,
                    c if entry_start && (c.is_alphabetic() || c == '_') => {
                        let name: String = group[k..]
                            .chars()
                            .take_while(|c| c.is_alphanumeric() || *c == '_')
                            .collect();
                        refs.insert(name);
                        entry_start = false;
                    }
                    _ => {}
                }
            }
        } else {
            let name: String = trimmed
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            if !name.is_empty() {
                refs.insert(name);
            }
        }
    }
    refs
}

/// The functions of `code` (non-test) longer than `max` lines, as `(line, name, lines)`.
pub fn long_fns(code: &str, max: usize) -> Vec<(usize, String, usize)> {
    let lines: Vec<&str> = code.lines().collect();
    let mut found = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let l = lines[i];
        let name = l
            .split_whitespace()
            .skip_while(|w| *w != "fn")
            .nth(1)
            .map(|n| n.split(['(', '<']).next().unwrap_or(n).to_string());
        match name {
            Some(name) if !name.is_empty() && !l.trim_end().ends_with(';') => {
                let (mut depth, mut started, mut j) = (0i64, false, i);
                while j < lines.len() {
                    depth += lines[j].matches('{').count() as i64;
                    depth -= lines[j].matches('}').count() as i64;
                    started |= lines[j].contains('{');
                    if lines[j].trim_end().ends_with(';') && !started {
                        break;
                    }
                    if started && depth <= 0 {
                        break;
                    }
                    j += 1;
                }
                let n = j + 1 - i;
                if started && n > max {
                    found.push((i + 1, name, n));
                }
                i = if started { j + 1 } else { i + 1 };
            }
            _ => i += 1,
        }
    }
    found
}

/// The import cycles of a module graph (Tarjan's strongly connected components of two or more).
pub fn cycles(edges: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    struct Tarjan<'a> {
        edges: &'a BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on: BTreeSet<&'a str>,
        out: Vec<Vec<String>>,
    }
    impl<'a> Tarjan<'a> {
        fn visit(&mut self, v: &'a str) {
            let n = self.index.len();
            self.index.insert(v, n);
            self.low.insert(v, n);
            self.stack.push(v);
            self.on.insert(v);
            for w in self.edges.get(v).into_iter().flatten() {
                let w = w.as_str();
                if !self.index.contains_key(w) {
                    self.visit(w);
                    let lw = self.low[w];
                    let lv = self.low.get_mut(v).expect("visited");
                    *lv = (*lv).min(lw);
                } else if self.on.contains(w) {
                    let iw = self.index[w];
                    let lv = self.low.get_mut(v).expect("visited");
                    *lv = (*lv).min(iw);
                }
            }
            if self.low[v] == self.index[v] {
                let mut scc = Vec::new();
                while let Some(w) = self.stack.pop() {
                    self.on.remove(w);
                    scc.push(w.to_string());
                    if w == v {
                        break;
                    }
                }
                if scc.len() > 1 {
                    scc.sort();
                    self.out.push(scc);
                }
            }
        }
    }
    let mut t = Tarjan {
        edges,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on: BTreeSet::new(),
        out: Vec::new(),
    };
    for v in edges.keys() {
        if !t.index.contains_key(v.as_str()) {
            t.visit(v);
        }
    }
    t.out.sort();
    t.out
}

/// Checks one crate's `src` directory (`files`: its `.rs` files, relative to `root`).
pub fn check_crate(root: &Path, src: &Path, files: &[PathBuf]) -> std::io::Result<Findings> {
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut findings = Findings::default();
    let mut modules = BTreeSet::new();
    for file in files {
        let Ok(rel) = file.strip_prefix(src) else {
            continue;
        };
        let Some(top) = rel.components().next() else {
            continue;
        };
        let top = top
            .as_os_str()
            .to_string_lossy()
            .trim_end_matches(".rs")
            .to_string();
        let text = match std::fs::read_to_string(root.join(file)) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        };
        let code = without_tests(&code_only(&text));
        let lines = code.lines().filter(|l| !l.trim().is_empty()).count();
        let all_lines = text.lines().count();
        if lines > MAX_FILE_LINES && all_lines > MAX_FILE_LINES {
            findings.long_files.push(format!(
                "{}: {all_lines} lines ({lines} of code outside tests)",
                file.display()
            ));
        }
        for (line, name, n) in long_fns(&code, MAX_FN_LINES) {
            findings
                .long_fns
                .push(format!("{}:{line}: fn {name} is {n} lines", file.display()));
        }
        if matches!(top.as_str(), "lib" | "main" | "bin") {
            continue;
        }
        modules.insert(top.clone());
        for r in crate_refs(&code) {
            if r != top {
                edges.entry(top.clone()).or_default().insert(r);
            }
        }
    }
    // Only edges between this crate's modules (not `crate::SomeType` re-exported at the root).
    for targets in edges.values_mut() {
        targets.retain(|t| modules.contains(t));
    }
    findings.cycles = cycles(&edges);
    Ok(findings)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn comments_and_strings_are_blanked_but_lines_kept() {
        let src =
            "let a = \"crate::x // no\"; // crate::y\n/* crate::z\n */ let c = '\"'; crate::w";
        let code = code_only(src);
        assert_eq!(code.lines().count(), src.lines().count());
        assert_eq!(
            crate_refs(&code),
            ["w".to_string()].into_iter().collect::<BTreeSet<_>>()
        );
        let raw = "r#\"crate::in_raw\"# br\"C:\\\" crate::after; fn f<'a>(x: &'a str) { ['\\'', '\"']; crate::inner }";
        let refs = crate_refs(&code_only(raw));
        assert_eq!(
            refs,
            ["after", "inner"].iter().map(|s| s.to_string()).collect()
        );
    }

    #[test]
    fn groups_and_test_items_are_handled() {
        let src = "use crate::{a::X, b, c::{d, e}};\n#[cfg(test)]\nmod tests { use crate::t; }\nuse crate::f;";
        let code = without_tests(&code_only(src));
        assert_eq!(
            crate_refs(&code),
            ["a", "b", "c", "f"].iter().map(|s| s.to_string()).collect()
        );
    }

    #[test]
    fn cycles_are_found_and_chains_are_not() {
        let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        let mut add = |a: &str, b: &str| {
            edges.entry(a.into()).or_default().insert(b.into());
        };
        add("a", "b");
        add("b", "c");
        add("c", "a");
        add("c", "d");
        add("e", "d");
        assert_eq!(
            cycles(&edges),
            vec![vec!["a".to_string(), "b".into(), "c".into()]]
        );
    }

    #[test]
    fn long_functions_are_measured() {
        let body = "    x();\n".repeat(5);
        let code = format!("fn short() {{\n}}\npub async fn long() {{\n{body}}}\nfn decl();\n");
        assert_eq!(long_fns(&code, 4), vec![(3, "long".to_string(), 7)]);
    }
}
