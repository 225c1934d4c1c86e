//! The crate's modules form no loop: no top-level module imports one that imports it
//! back, directly or through others. A loop makes every module in it depend on all the
//! others (the store on the LLM layer, say), so none can be read, tested or moved alone.
//!
//! The test reads the sources, not the compiler's view: every `crate::` path outside
//! comments and test code is an import of the module it names.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

/// Every `.rs` file under `dir`, tests excluded (`tests.rs` files and `tests/` folders).
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

/// The top-level module a file belongs to; `None` for the crate root and `main.rs`.
fn module_of(src: &Path, file: &Path) -> Option<String> {
    let relative = file.strip_prefix(src).unwrap();
    let first = relative.components().next()?.as_os_str().to_string_lossy();
    let name = first.trim_end_matches(".rs");
    (!matches!(name, "lib" | "main" | "layering")).then(|| name.to_owned())
}

/// The code of `text` without comments and without its inline `#[cfg(test)] mod`, which
/// this codebase keeps at the end of a file.
fn code(text: &str) -> String {
    let end = text
        .match_indices("#[cfg(test)]")
        .map(|(at, marker)| at + marker.len())
        .find(|&after| text[after..].trim_start().starts_with("mod "))
        .map_or(text.len(), |after| after - "#[cfg(test)]".len());
    text[..end]
        .lines()
        .filter(|line| !line.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The top-level modules `code` names through `crate::`, including those in a group
/// (`crate::{a, b::c}`).
fn imported(code: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut rest = code;
    while let Some(at) = rest.find("crate::") {
        rest = &rest[at + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let mut depth = 0;
            let mut item_start = true;
            for (i, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => {
                        rest = &group[i..];
                        break;
                    }
                    '}' => depth -= 1,
                    ',' if depth == 0 => item_start = true,
                    c if item_start && (c.is_alphanumeric() || c == '_') => {
                        names.insert(identifier(&group[i..]).to_owned());
                        item_start = false;
                    }
                    c if !c.is_whitespace() => item_start = false,
                    _ => {}
                }
            }
        } else {
            names.insert(identifier(rest).to_owned());
        }
    }
    names.retain(|n| !n.is_empty() && n.chars().next().is_some_and(char::is_lowercase));
    names
}

fn identifier(text: &str) -> &str {
    let end = text
        .find(|c: char| !(c.is_alphanumeric() || c == '_'))
        .unwrap_or(text.len());
    &text[..end]
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

fn graph() -> BTreeMap<String, BTreeSet<String>> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&src, &mut files);
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for file in files {
        let Some(module) = module_of(&src, &file) else {
            continue;
        };
        let text = fs::read_to_string(&file).unwrap();
        let edges = graph.entry(module.clone()).or_default();
        edges.extend(imported(&code(&text)).into_iter().filter(|m| *m != module));
    }
    graph
}

#[test]
fn no_module_imports_one_that_imports_it_back() {
    let graph = graph();
    assert!(graph.len() > 20, "read too few modules: {graph:?}");
    if let Some(cycle) = find_loop(&graph) {
        panic!("modules import each other: {}", cycle.join(" -> "));
    }
}

#[test]
fn the_pure_core_imports_no_edge() {
    let graph = graph();
    let edges = [
        "store",
        "llm",
        "worker",
        "transport",
        "jobs",
        "metrics",
        "telemetry",
    ];
    for core in [
        "message",
        "summary",
        "facts",
        "prompt",
        "planner",
        "clearing",
        "summarizer",
    ] {
        let imports = &graph[core];
        for edge in edges {
            assert!(!imports.contains(edge), "{core} imports {edge}");
        }
    }
}

#[test]
fn imports_are_read_from_paths_and_groups() {
    let text = "use crate::{audit, demo::x, llm::{a, b}};\n// crate::commented\nfn f() { crate::store::X; }\n#[cfg(test)]\nmod tests { use crate::eval; }";
    assert_eq!(
        imported(&code(text)),
        ["audit", "demo", "llm", "store"].map(str::to_owned).into()
    );
    let cycle = BTreeMap::from([
        ("a".to_owned(), BTreeSet::from(["b".to_owned()])),
        ("b".to_owned(), BTreeSet::from(["a".to_owned()])),
    ]);
    assert_eq!(find_loop(&cycle).unwrap(), ["a", "b", "a"]);
}
