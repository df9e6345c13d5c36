//! The layering of ARCHITECTURE.md, checked on the source: which layer may import which,
//! what the pure core and the terminal code may never name, and no import circles between
//! files. A move that breaks the design fails here, not in review.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Each layer (a folder of `src/`) and the crate modules it may import.
const RULES: &[(&str, &[&str])] = &[
    ("core", &["core"]),
    ("io", &["core", "io", "error"]),
    ("apply", &["core", "io", "apply", "error"]),
    ("app", &["core", "io", "apply", "app", "error"]),
    ("tui", &["core", "apply", "app", "tui", "error"]),
    ("sandbox", &["core", "io", "sandbox", "error"]),
    ("sim", &["core", "sim"]),
];

/// Names that must not appear in a layer's code.
const FORBIDDEN: &[(&str, &[&str])] = &[
    (
        "core",
        &[
            "tokio::",
            "std::fs",
            "std::net",
            "kube::",
            "etcd_client::",
            "hyper::",
        ],
    ),
    ("tui", &["kube::", "etcd_client::", "k8s_openapi::"]),
    (
        "sim",
        &[
            "tokio::",
            "std::fs",
            "std::net",
            "std::thread",
            "kube::",
            "etcd_client::",
        ],
    ),
];

fn src_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// Every library source file with its module path (`tui/update/mod.rs` -> `tui::update`).
fn modules() -> BTreeMap<Vec<String>, PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                walk(&p, out);
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push(p);
            }
        }
    }
    let root = src_dir();
    let mut files = Vec::new();
    walk(&root, &mut files);
    let mut out = BTreeMap::new();
    for f in files {
        let rel = f.strip_prefix(&root).unwrap().with_extension("");
        let mut path: Vec<String> = rel.iter().map(|c| c.to_string_lossy().into()).collect();
        // The binary's files are not part of the library's layering.
        if path[0] == "main" || path[0] == "cli" {
            continue;
        }
        if path.last().is_some_and(|l| l == "mod" || l == "lib") {
            path.pop();
        }
        out.insert(path, f);
    }
    out
}

/// The code of a file without comments and without its inline `mod tests` (whose `super`
/// means the file itself).
fn code_of(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap();
    let text = match text.find("#[cfg(test)]\nmod tests {") {
        Some(i) => &text[..i],
        None => &text,
    };
    text.lines()
        .map(|l| match l.find("//") {
            Some(i) => &l[..i],
            None => l,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Expands a use tree (`a::{b, c::{d, e}}`) into full paths.
fn expand(tree: &str) -> Vec<String> {
    let tree = tree.trim();
    let Some(open) = tree.find('{') else {
        let path = tree.split(" as ").next().unwrap_or("").trim();
        return vec![path.trim_end_matches("::*").to_string()];
    };
    let prefix = tree[..open].trim_end_matches("::");
    let close = tree.rfind('}').filter(|&c| c > open).unwrap_or(tree.len());
    let inner = &tree[open + 1..close];
    let mut parts = Vec::new();
    let (mut depth, mut start) = (0, 0);
    for (i, c) in inner.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&inner[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&inner[start..]);
    parts
        .into_iter()
        .filter(|p| !p.trim().is_empty())
        .flat_map(expand)
        .map(|p| match p.as_str() {
            "self" => prefix.to_string(),
            _ => format!("{prefix}::{p}"),
        })
        .collect()
}

/// Every path a file names: its `use` trees, `crate::`/`super::` paths in its code, and
/// paths through the child modules it declares (`mod x;` ... `x::f()`).
fn paths_in(code: &str) -> Vec<String> {
    let mut out = Vec::new();
    let children: Vec<&str> = code
        .lines()
        .filter_map(|l| {
            let l = l.trim().strip_prefix("pub ").unwrap_or(l.trim());
            l.strip_prefix("mod ")?.strip_suffix(';')
        })
        .collect();
    for child in children {
        let needle = format!("{child}::");
        let mut rest = code;
        while let Some(i) = rest.find(&needle) {
            let before = rest[..i].chars().last();
            if before.is_none_or(|c| !(c.is_alphanumeric() || c == '_' || c == ':')) {
                out.push(child.to_string());
            }
            rest = &rest[i + needle.len()..];
        }
    }
    // `use` items start a line (after `pub`, `pub(crate)`, `pub(super)`).
    let mut lines = code.lines();
    while let Some(line) = lines.next() {
        let t = line.trim_start();
        let t = t
            .strip_prefix("pub(crate) ")
            .or_else(|| t.strip_prefix("pub(super) "))
            .or_else(|| t.strip_prefix("pub "))
            .unwrap_or(t);
        let Some(tree) = t.strip_prefix("use ") else {
            continue;
        };
        let mut tree = tree.to_string();
        while !tree.contains(';') {
            match lines.next() {
                Some(more) => tree.push_str(more),
                None => break,
            }
        }
        let end = tree.find(';').unwrap_or(tree.len());
        out.extend(expand(&tree[..end]));
    }
    for start in ["crate::", "super::"] {
        let mut rest = code;
        while let Some(i) = rest.find(start) {
            let tail = &rest[i..];
            let end = tail
                .find(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':'))
                .unwrap_or(tail.len());
            out.push(tail[..end].trim_end_matches(':').to_string());
            rest = &tail[end.max(1)..];
        }
    }
    out
}

/// The file a path lands in: the longest module prefix that is a file.
fn resolve(
    from: &[String],
    path: &str,
    mods: &BTreeMap<Vec<String>, PathBuf>,
    is_dir_module: bool,
) -> Option<Vec<String>> {
    let mut parts: Vec<&str> = path.split("::").filter(|p| !p.is_empty()).collect();
    // The module the path is relative to: a `mod.rs` is its folder's module; `super` of a
    // plain file is its folder.
    let mut base: Vec<String> = from.to_vec();
    match parts.first().copied() {
        Some("crate") => {
            base.clear();
            parts.remove(0);
        }
        Some("super") => {
            while parts.first() == Some(&"super") {
                parts.remove(0);
                base.pop();
            }
        }
        Some("self") => {
            parts.remove(0);
        }
        Some(first) => {
            // A child module of this one, or something external.
            let mut child = base.clone();
            child.push(first.to_string());
            if !mods.contains_key(&child) || !is_dir_module && from.len() > child.len() {
                return None;
            }
        }
        None => return None,
    }
    let mut best = None;
    let mut cur = base;
    if mods.contains_key(&cur) {
        best = Some(cur.clone());
    }
    for p in parts {
        cur.push(p.to_string());
        if mods.contains_key(&cur) {
            best = Some(cur.clone());
        } else {
            break;
        }
    }
    best
}

fn imports() -> BTreeMap<Vec<String>, BTreeSet<Vec<String>>> {
    let mods = modules();
    let mut graph = BTreeMap::new();
    for (m, file) in &mods {
        let is_dir_module = file.file_name().is_some_and(|n| n == "mod.rs");
        let mut edges = BTreeSet::new();
        for p in paths_in(&code_of(file)) {
            if let Some(target) = resolve(m, &p, &mods, is_dir_module)
                && &target != m
                && !target.is_empty()
            {
                edges.insert(target);
            }
        }
        graph.insert(m.clone(), edges);
    }
    graph
}

#[test]
fn layers_import_only_what_they_may() {
    let mut bad = Vec::new();
    for (m, edges) in imports() {
        let Some((_, allowed)) = RULES
            .iter()
            .find(|(l, _)| m.first().is_some_and(|f| f == l))
        else {
            continue;
        };
        for e in edges {
            if !allowed.contains(&e[0].as_str()) {
                bad.push(format!("{} imports {}", m.join("::"), e.join("::")));
            }
        }
    }
    assert!(bad.is_empty(), "layer rules broken:\n{}", bad.join("\n"));
}

#[test]
fn the_core_and_the_terminal_name_no_forbidden_crate() {
    let mut bad = Vec::new();
    for (m, file) in modules() {
        let code = code_of(&file);
        for (layer, names) in FORBIDDEN {
            if m.first().is_some_and(|f| f == layer) {
                for n in names.iter().filter(|n| code.contains(*n)) {
                    bad.push(format!("{} names {n}", file.display()));
                }
            }
        }
    }
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}

#[test]
fn no_import_circles_between_files() {
    let graph = imports();
    // Depth-first search for a back edge; report the circle it closes.
    fn visit(
        n: &Vec<String>,
        graph: &BTreeMap<Vec<String>, BTreeSet<Vec<String>>>,
        stack: &mut Vec<Vec<String>>,
        done: &mut BTreeSet<Vec<String>>,
        circles: &mut Vec<String>,
    ) {
        if done.contains(n) {
            return;
        }
        if let Some(i) = stack.iter().position(|s| s == n) {
            let names: Vec<String> = stack[i..].iter().map(|s| s.join("::")).collect();
            circles.push(format!("{} -> {}", names.join(" -> "), n.join("::")));
            return;
        }
        stack.push(n.clone());
        for e in graph.get(n).into_iter().flatten() {
            visit(e, graph, stack, done, circles);
        }
        stack.pop();
        done.insert(n.clone());
    }
    let mut circles = Vec::new();
    let mut done = BTreeSet::new();
    for n in graph.keys() {
        visit(n, &graph, &mut Vec::new(), &mut done, &mut circles);
    }
    assert!(
        circles.is_empty(),
        "import circles:\n{}",
        circles.join("\n")
    );
}

#[test]
fn the_checker_sees_imports() {
    // The checks above pass vacuously if nothing is found: prove the parser works.
    assert_eq!(
        expand("crate::a::{b, c::{d, e as f}, self}"),
        [
            "crate::a::b",
            "crate::a::c::d",
            "crate::a::c::e",
            "crate::a"
        ]
    );
    let graph = imports();
    let update = graph
        .get(&vec!["tui".to_string(), "update".to_string()])
        .expect("tui::update is a module");
    assert!(update.contains(&vec!["tui".to_string(), "msg".to_string()]));
    assert!(update.contains(&vec!["tui".into(), "update".into(), "popups".into()]));
}
