//! The crate's modules form no loop, at any depth: no module imports a sibling that
//! imports it back, directly or through others (the top-level modules among themselves,
//! `store::postgres::leases` among `store::postgres`'s, `extractive::units` among
//! `extractive`'s). A loop makes every module in it depend on all the others (the store
//! on the LLM layer, say), so none can be read, tested or moved alone. A module may use
//! its parent's items and its children's: those are one module's parts.
//!
//! The test reads the sources, not the compiler's view: every `crate::`, `super::` and
//! `self::` path outside comments and test-only code (an item under `#[cfg(test)]`,
//! wherever it is in the file) is an import of the deepest module it names.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

/// A module's path from the crate root: `["store", "postgres", "commit"]`.
type ModulePath = Vec<String>;

/// Every `.rs` file under `dir` but unit tests (`tests.rs` files and `tests/` folders).
fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<_> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    entries.sort();
    for path in entries {
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if path.is_dir() {
            if name != "tests" {
                sources(&path, out);
            }
        } else if name.ends_with(".rs") && name != "tests.rs" {
            out.push(path);
        }
    }
}

/// The module a file is: `store/postgres/leases.rs` and `store/postgres/leases/mod.rs`
/// are `store::postgres::leases`. `None` for the crate root, the binary's `main.rs` and
/// this test.
fn module_of(src: &Path, file: &Path) -> Option<ModulePath> {
    let relative = file.strip_prefix(src).unwrap();
    let mut path: ModulePath = relative
        .iter()
        .map(|c| c.to_string_lossy().trim_end_matches(".rs").to_owned())
        .collect();
    if path.last().is_some_and(|last| last == "mod") {
        path.pop();
    }
    match path.as_slice() {
        [] => None,
        [only] if matches!(only.as_str(), "lib" | "main" | "layering") => None,
        _ => Some(path),
    }
}

/// The code of `text` without comments and without its test-only items: each
/// `#[cfg(test)]` item (a `mod tests { ... }`, a helper `fn`, a `mod tests;`) is left out
/// up to its matching closing brace, or its semicolon.
fn code(text: &str) -> String {
    let text: String = text
        .lines()
        .map(|line| match line.find("//") {
            Some(at) if !line[..at].contains('"') => &line[..at],
            _ => line,
        })
        .collect::<Vec<_>>()
        .join("\n");
    let mut out = String::with_capacity(text.len());
    let mut rest = text.as_str();
    while let Some(at) = rest.find("#[cfg(test)]") {
        out.push_str(&rest[..at]);
        rest = &rest[at + "#[cfg(test)]".len()..];
        rest = &rest[item_end(rest)..];
    }
    out.push_str(rest);
    out
}

/// Where the item that starts `text` ends: after its matching closing brace when it has
/// a body, else after its semicolon.
fn item_end(text: &str) -> usize {
    let mut depth = 0usize;
    for (i, c) in text.char_indices() {
        match c {
            ';' if depth == 0 => return i + 1,
            '{' => depth += 1,
            '}' if depth <= 1 => return i + 1,
            '}' => depth -= 1,
            _ => {}
        }
    }
    text.len()
}

/// Every path `code` names from the crate root, `super` or `self`, as written from the
/// module `at` (a `mod.rs` file is its module's own file), groups expanded: `use
/// crate::{a, b::{c, d}}` names `a`, `b::c` and `b::d`.
fn paths(code: &str, at: &[String]) -> Vec<ModulePath> {
    let mut found = Vec::new();
    for (i, _) in code.match_indices("::") {
        let start = code[..i]
            .rfind(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':'))
            .map_or(0, |s| s + 1);
        let base: ModulePath = match &code[start..i] {
            "crate" => Vec::new(),
            "self" => at.to_vec(),
            "super" => at[..at.len().saturating_sub(1)].to_vec(),
            _ => continue,
        };
        expand(&code[i + 2..], base, &mut found);
    }
    found
}

/// The paths `rest` continues `base` with: `a::b` or a group `{a, b::{c}}`; `super::`
/// after `super::` climbs once more.
fn expand(rest: &str, mut base: ModulePath, found: &mut Vec<ModulePath>) {
    let mut rest = rest.trim_start();
    loop {
        if let Some(group) = rest.strip_prefix('{') {
            for item in split_group(group) {
                expand(item, base.clone(), found);
            }
            return;
        }
        let word = identifier(rest);
        if word.is_empty() {
            found.push(base);
            return;
        }
        if word == "super" {
            base.pop();
        } else if word != "self" {
            base.push(word.to_owned());
        }
        rest = &rest[word.len()..];
        match rest.strip_prefix("::") {
            Some(more) => rest = more.trim_start(),
            None => {
                found.push(base);
                return;
            }
        }
    }
}

/// The items of a group whose `{` was just read, up to its matching `}`.
fn split_group(group: &str) -> Vec<&str> {
    let mut items = Vec::new();
    let (mut depth, mut start) = (0, 0);
    for (i, c) in group.char_indices() {
        match c {
            '{' => depth += 1,
            '}' if depth == 0 => {
                items.push(&group[start..i]);
                break;
            }
            '}' => depth -= 1,
            ',' if depth == 0 => {
                items.push(&group[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    items
}

fn identifier(text: &str) -> &str {
    let end = text
        .find(|c: char| !(c.is_alphanumeric() || c == '_'))
        .unwrap_or(text.len());
    &text[..end]
}

/// The deepest of `modules` that `path` lies in (the item named last is not a module).
fn resolve(path: &[String], modules: &BTreeSet<ModulePath>) -> Option<ModulePath> {
    (1..=path.len())
        .rev()
        .map(|n| path[..n].to_vec())
        .find(|prefix| modules.contains(prefix))
}

/// For each module (the crate root as `[]`), the imports among its children: child ->
/// the siblings its files (at any depth below it) import.
type Siblings = BTreeMap<ModulePath, BTreeMap<String, BTreeSet<String>>>;

/// Every module of the crate, and the imports among the children of each.
fn read() -> (BTreeSet<ModulePath>, Siblings) {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&src, &mut files);
    let files: Vec<(ModulePath, PathBuf)> = files
        .into_iter()
        .filter_map(|file| Some((module_of(&src, &file)?, file)))
        .collect();
    let modules: BTreeSet<ModulePath> = files.iter().map(|(m, _)| m.clone()).collect();
    let mut siblings = Siblings::new();
    for (module, file) in &files {
        for parent in 0..module.len() {
            let child = &module[parent];
            (siblings.entry(module[..parent].to_vec()).or_default())
                .entry(child.clone())
                .or_default();
        }
        let text = fs::read_to_string(file).unwrap();
        for path in paths(&code(&text), module) {
            let Some(target) = resolve(&path, &modules) else {
                continue;
            };
            // Where the two part: below their deepest common ancestor, as siblings.
            let common = module
                .iter()
                .zip(&target)
                .take_while(|(a, b)| a == b)
                .count();
            if common < module.len() && common < target.len() {
                (siblings.entry(module[..common].to_vec()).or_default())
                    .entry(module[common].clone())
                    .or_default()
                    .insert(target[common].clone());
            }
        }
    }
    (modules, siblings)
}

/// A loop in `graph`, as the modules along it, the first one repeated at the end.
fn find_loop(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        node: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(at) = path.iter().position(|n| n == node) {
            let mut cycle = path[at..].to_vec();
            cycle.push(node.to_owned());
            return Some(cycle);
        }
        if done.contains(node) {
            return None;
        }
        path.push(node.to_owned());
        for next in graph.get(node).into_iter().flatten() {
            if let Some(cycle) = visit(next, graph, path, done) {
                return Some(cycle);
            }
        }
        path.pop();
        done.insert(node.to_owned());
        None
    }
    let mut done = BTreeSet::new();
    graph
        .keys()
        .find_map(|start| visit(start, graph, &mut Vec::new(), &mut done))
}

#[test]
fn no_module_imports_a_sibling_that_imports_it_back() {
    let (modules, siblings) = read();
    assert!(modules.len() > 60, "read too few modules: {modules:?}");
    for (parent, graph) in &siblings {
        if let Some(cycle) = find_loop(graph) {
            let at = if parent.is_empty() {
                "crate".to_owned()
            } else {
                parent.join("::")
            };
            panic!("modules of {at} import each other: {}", cycle.join(" -> "));
        }
    }
}

#[test]
fn the_pure_core_imports_no_edge() {
    let (modules, siblings) = read();
    let top = &siblings[&Vec::new()];
    let edges = [
        "store",
        "llm",
        "worker",
        "transport",
        "metrics",
        "telemetry",
    ];
    let core = [
        "message",
        "summary",
        "facts",
        "prompt",
        "compaction",
        "summarizer",
    ];
    for name in edges.iter().chain(&core) {
        assert!(
            modules.contains(&vec![(*name).to_owned()]),
            "no module {name}: this test names one that is gone"
        );
    }
    for core in core {
        for edge in edges {
            assert!(!top[core].contains(edge), "{core} imports {edge}");
        }
    }
}

#[test]
fn imports_are_read_from_paths_groups_and_relative_paths() {
    let text = "use crate::{audit, demo::x, llm::{a, b}};\n// crate::commented\n\
                fn f() { crate::store::X; }\nuse super::{units, clauses::y};\n\
                #[cfg(test)]\nmod tests { use crate::eval; }\nuse self::inner::z;\n\
                #[cfg(test)]\nfn helper() { crate::cli::run(); }\nfn g() { super::super::w(); }";
    let at = ["extractive".to_owned(), "cover".to_owned()];
    let found: BTreeSet<String> = paths(&code(text), &at)
        .into_iter()
        .map(|p| p.join("::"))
        .collect();
    assert_eq!(
        found,
        [
            "audit",
            "demo::x",
            "llm::a",
            "llm::b",
            "store::X",
            "extractive::units",
            "extractive::clauses::y",
            "extractive::cover::inner::z",
            "w",
        ]
        .map(str::to_owned)
        .into()
    );
    let cycle = BTreeMap::from([
        ("a".to_owned(), BTreeSet::from(["b".to_owned()])),
        ("b".to_owned(), BTreeSet::from(["a".to_owned()])),
    ]);
    assert_eq!(find_loop(&cycle).unwrap(), ["a", "b", "a"]);
}
