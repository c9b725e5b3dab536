//! ARCHITECTURE.md's module map is the truth about the crate's imports: every module
//! under `src/` is named in it, every `crate::` import is one its row allows, the
//! import graph between top-level modules has no loop, and no handler imports the
//! dispatcher or another handler.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, reason = "tests fail loudly")]

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

const HANDLERS: [&str; 5] = ["connect", "forward", "git", "routes", "transparent"];
const DISPATCHER: &str = "proxy";

/// Every module of the library, by path (`door::authorize`), with its source.
fn modules() -> BTreeMap<String, String> {
    fn walk(dir: &Path, root: &Path, out: &mut BTreeMap<String, String>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(&path, root, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let rel = path.strip_prefix(root).unwrap().with_extension("");
                let name = rel.to_str().unwrap().replace('/', "::");
                if name != "lib" && name != "main" {
                    out.insert(name, std::fs::read_to_string(&path).unwrap());
                }
            }
        }
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut out = BTreeMap::new();
    walk(&root, &root, &mut out);
    out
}

/// The top-level modules `source` (a module of `own`) imports through `crate::`,
/// outside comments and its test module.
fn imports(source: &str, own: &str, top_level: &BTreeSet<String>) -> BTreeSet<String> {
    let code = source.split("#[cfg(test)]").next().unwrap_or_default();
    let mut out = BTreeSet::new();
    for line in code.lines() {
        let line = line.split("//").next().unwrap_or_default();
        for (i, _) in line.match_indices("crate::") {
            // `egress_gateway::crate` never occurs; `$crate::` in macros is not ours.
            if line[..i].ends_with('$') || line[..i].ends_with(|c: char| c.is_alphanumeric() || c == '_') {
                continue;
            }
            let rest = &line[i + "crate::".len()..];
            let name: String = rest.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
            if top_level.contains(&name) && name != own {
                out.insert(name);
            }
        }
    }
    out
}

/// The module map's rows: module -> (its row's text, what it may import).
fn map() -> BTreeMap<String, (String, BTreeSet<String>)> {
    let text = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("ARCHITECTURE.md")).unwrap();
    let mut rows = BTreeMap::new();
    for line in text.lines().filter(|l| l.starts_with("| `")) {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        assert_eq!(cells.len(), 5, "a module map row has three cells: {line}");
        let module = cells[1].trim_matches('`').to_string();
        let allowed = cells[3].split(',').map(|s| s.trim().trim_matches('`').to_string()).filter(|s| !s.is_empty());
        rows.insert(module, (line.to_string(), allowed.collect()));
    }
    rows
}

#[test]
fn import_extraction_sees_crate_paths_and_skips_comments_and_tests() {
    let top: BTreeSet<String> = ["door", "proxy", "policy"].iter().map(|s| s.to_string()).collect();
    let src = "use crate::door::{self, Refusal};\n// crate::proxy in a comment\nlet x = crate::policy::decide(a);\n\
               #[cfg(test)]\nmod tests { use crate::proxy::Shared; }\n";
    let got = imports(src, "connect", &top);
    assert_eq!(got, ["door", "policy"].iter().map(|s| s.to_string()).collect());
}

#[test]
fn every_module_is_on_the_map_and_imports_only_what_its_row_allows() {
    let modules = modules();
    let map = map();
    let top_level: BTreeSet<String> = modules.keys().map(|m| m.split("::").next().unwrap().to_string()).collect();
    let all_rows: String = map.values().map(|(row, _)| row.as_str()).collect::<Vec<_>>().join("\n");

    let mut problems = Vec::new();
    for module in modules.keys() {
        if !all_rows.contains(&format!("`{module}`")) {
            problems.push(format!("{module} is not named in ARCHITECTURE.md's module map"));
        }
    }
    // The file index (`## Files`) names every file too.
    let text = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("ARCHITECTURE.md")).unwrap();
    for module in modules.keys().filter(|m| m.contains("::")) {
        let file = module.replace("::", "/");
        if !text.contains(&format!("`{file}`")) {
            problems.push(format!("src/{file}.rs is not listed under ARCHITECTURE.md's Files"));
        }
    }
    for top in &top_level {
        if !map.contains_key(top) {
            problems.push(format!("{top} has no row of its own in the module map"));
        }
    }
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (module, source) in &modules {
        let own = module.split("::").next().unwrap();
        let allowed = map.get(own).map(|(_, a)| a.clone()).unwrap_or_default();
        for import in imports(source, own, &top_level) {
            if !allowed.contains(&import) {
                problems.push(format!("{module} imports {import}, which the map's row for {own} does not allow"));
            }
            graph.entry(own.to_string()).or_default().insert(import);
        }
    }
    assert!(problems.is_empty(), "ARCHITECTURE.md and the code disagree:\n{}", problems.join("\n"));

    // Handlers import neither the dispatcher nor each other: not in the map, and not
    // in the code.
    for h in HANDLERS {
        let (_, allowed) = &map[h];
        let imported = graph.get(h).cloned().unwrap_or_default();
        for other in HANDLERS.iter().chain([&DISPATCHER]).filter(|o| **o != h) {
            assert!(!allowed.contains(*other), "the map lets handler {h} import {other}");
            assert!(!imported.contains(*other), "handler {h} imports {other}");
        }
    }
    assert!(
        graph.get(DISPATCHER).is_some_and(|d| HANDLERS.iter().all(|h| d.contains(*h))),
        "the dispatcher picks every handler"
    );

    // No loops between top-level modules.
    fn visit<'a>(
        m: &'a str,
        graph: &'a BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<&'a str>,
        done: &mut BTreeSet<&'a str>,
    ) {
        if let Some(at) = path.iter().position(|p| *p == m) {
            panic!("import loop: {} -> {m}", path[at..].join(" -> "));
        }
        if done.contains(m) {
            return;
        }
        path.push(m);
        for next in graph.get(m).into_iter().flatten() {
            visit(next, graph, path, done);
        }
        path.pop();
        done.insert(m);
    }
    let mut done = BTreeSet::new();
    for m in graph.keys() {
        visit(m, &graph, &mut Vec::new(), &mut done);
    }
}
