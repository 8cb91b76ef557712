//! The layout the README describes is the layout on disk: every path its "How the engine is
//! laid out" section names exists, and the engine's files import one another without a
//! circle (a file may not reach itself through `crate::`, `super::` or `self::` paths).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The backticked paths of the README's layout section: text with a `/` or a file extension,
/// without spaces or `::`.
fn layout_paths() -> Vec<String> {
    let readme = std::fs::read_to_string(repo().join("README.md")).unwrap();
    let start = readme.find("### How the engine is laid out").expect("the layout section");
    let section = &readme[start..];
    let end = section[4..].find("\n## ").map_or(section.len(), |e| e + 4);
    section[..end]
        .split('`')
        .skip(1)
        .step_by(2)
        .filter(|t| !t.contains(' ') && !t.contains("::") && !t.contains('='))
        .filter(|t| t.contains('/') || t.ends_with(".rs") || t.ends_with(".py"))
        .map(str::to_string)
        .collect()
}

#[test]
fn every_path_the_layout_section_names_exists() {
    let bases = ["", "crates/stoker/src", "crates/stoker-python/src"];
    let paths = layout_paths();
    assert!(paths.len() > 40, "the section names its files: {paths:?}");
    let missing: Vec<&String> =
        paths.iter().filter(|p| !bases.iter().any(|b| repo().join(b).join(p.as_str()).exists())).collect();
    assert!(missing.is_empty(), "the README's layout section names paths that do not exist: {missing:?}");
}

/// A module path (`["tokens", "pipeline", "read"]`) of every file under `src`.
fn modules(src: &Path) -> BTreeMap<Vec<String>, PathBuf> {
    let mut out = BTreeMap::new();
    let mut stack = vec![src.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "rs") {
                let rel = p.strip_prefix(src).unwrap().with_extension("");
                let mut m: Vec<String> = rel.iter().map(|c| c.to_string_lossy().into_owned()).collect();
                if m.last().is_some_and(|l| l == "mod" || l == "lib") {
                    m.pop();
                }
                out.insert(m, p);
            }
        }
    }
    out
}

/// The paths a file's code names from `crate::`, `super::` or `self::` (groups expanded), as
/// absolute module paths; test modules and comments left out.
fn references(code: &str, here: &[String]) -> Vec<Vec<String>> {
    let code = code.split("#[cfg(test)]").next().unwrap_or("");
    let code: String = code.lines().map(|l| l.split("//").next().unwrap_or("")).collect::<Vec<_>>().join("\n");
    let b = code.as_bytes();
    let mut out = Vec::new();
    for root in ["crate::", "super::", "self::"] {
        let mut from = 0;
        while let Some(k) = code[from..].find(root).map(|k| k + from) {
            from = k + root.len();
            if k > 0 && (b[k - 1].is_ascii_alphanumeric() || b[k - 1] == b'_' || b[k - 1] == b':') {
                continue;
            }
            // A folder's mod.rs is its module: its `super` is its parent, as for a file.
            let base: Vec<String> = match root {
                "crate::" => vec![],
                "super::" => here[..here.len().saturating_sub(1)].to_vec(),
                _ => here.to_vec(),
            };
            expand(&code[from..], base, &mut out);
        }
    }
    out
}

/// Reads `a::b::{c, d::e}` at the start of `s` onto `base`, pushing every full path.
fn expand(s: &str, mut base: Vec<String>, out: &mut Vec<Vec<String>>) {
    let mut rest = s;
    loop {
        let id: String = rest.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
        if id.is_empty() {
            if let Some(group) = rest.strip_prefix('{') {
                let mut depth = 1;
                let mut item = String::new();
                for c in group.chars() {
                    match c {
                        '{' => depth += 1,
                        '}' => depth -= 1,
                        _ => {}
                    }
                    if depth == 0 || (depth == 1 && c == ',') {
                        let t = item.trim().split(" as ").next().unwrap_or("").trim().to_string();
                        if !t.is_empty() && t != "self" {
                            expand(&t, base.clone(), out);
                        }
                        item.clear();
                        if depth == 0 {
                            break;
                        }
                    } else {
                        item.push(c);
                    }
                }
            }
            out.push(base);
            return;
        }
        if id == "super" {
            base.pop();
        } else {
            base.push(id.clone());
        }
        rest = &rest[id.len()..];
        match rest.strip_prefix("::") {
            Some(r) => rest = r,
            None => {
                out.push(base);
                return;
            }
        }
    }
}

#[test]
fn the_engine_s_files_import_each_other_without_a_circle() {
    let src = repo().join("crates/stoker/src");
    let mods = modules(&src);
    let folder = |m: &Vec<String>| mods[m].ends_with("mod.rs") || m.is_empty();
    // The deepest module (file) a path names.
    let resolve = |p: &[String]| (1..=p.len()).rev().map(|i| p[..i].to_vec()).find(|m| mods.contains_key(m));
    let mut edges: BTreeMap<Vec<String>, BTreeSet<Vec<String>>> = BTreeMap::new();
    for (m, path) in &mods {
        let code = std::fs::read_to_string(path).unwrap();
        let mut to: BTreeSet<Vec<String>> = references(&code, m)
            .iter()
            .filter_map(|r| resolve(r))
            // A file naming its own folder (or itself) names what the folder declares.
            .filter(|t| t != m && !m.starts_with(t))
            // A folder's mod.rs declaring and re-exporting its files is not an import.
            .filter(|t| !(folder(m) && t.starts_with(m)))
            .collect();
        // A folder stands for its files: a path into it reaches every one of them.
        if folder(m) && !m.is_empty() {
            to.extend(mods.keys().filter(|c| c.len() == m.len() + 1 && c.starts_with(m)).cloned());
        }
        edges.insert(m.clone(), to);
    }
    // Depth-first search for a back edge; the circle is the stack from its target.
    fn visit(
        m: &Vec<String>,
        edges: &BTreeMap<Vec<String>, BTreeSet<Vec<String>>>,
        state: &mut BTreeMap<Vec<String>, u8>,
        stack: &mut Vec<Vec<String>>,
    ) -> Option<Vec<String>> {
        state.insert(m.clone(), 1);
        stack.push(m.clone());
        for t in &edges[m] {
            match state.get(t).copied().unwrap_or(0) {
                1 => {
                    let at = stack.iter().position(|s| s == t).unwrap();
                    let mut circle: Vec<String> = stack[at..].iter().map(|s| s.join("::")).collect();
                    circle.push(t.join("::"));
                    return Some(circle);
                }
                0 => {
                    if let Some(c) = visit(t, edges, state, stack) {
                        return Some(c);
                    }
                }
                _ => {}
            }
        }
        stack.pop();
        state.insert(m.clone(), 2);
        None
    }
    let mut state = BTreeMap::new();
    for m in mods.keys() {
        if state.get(m).copied().unwrap_or(0) == 0 {
            if let Some(circle) = visit(m, &edges, &mut state, &mut vec![]) {
                panic!("an import circle: {}", circle.join(" -> "));
            }
        }
    }
    // The check sees imports: the loaders reach the shell, the shell reaches no kind.
    let reaches = |a: &str, b: &str| {
        let a: Vec<String> = a.split("::").map(str::to_string).collect();
        edges[&a].iter().any(|t| t.join("::") == b)
    };
    assert!(reaches("tokens::pipeline::iter", "shell::kind"));
    let room = |m: &Vec<String>| m.first().cloned().unwrap_or_default();
    let kinds = ["image", "arrays", "tokens"];
    let shell_to_kind: Vec<_> = edges
        .iter()
        .filter(|(m, _)| room(m) == "shell")
        .flat_map(|(m, to)| to.iter().filter(|t| kinds.contains(&room(t).as_str())).map(move |t| (m, t)))
        .collect();
    assert!(shell_to_kind.is_empty(), "the shell imports a kind: {shell_to_kind:?}");
    // `args` stands above every room (it builds their configs): no room imports it; what a
    // room checks by itself lives in `values`, below them all.
    let up: Vec<_> = edges
        .iter()
        .filter(|(m, _)| !matches!(room(m).as_str(), "args" | "" | "lib"))
        .flat_map(|(m, to)| to.iter().filter(|t| room(t) == "args").map(move |t| (m, t)))
        .collect();
    assert!(up.is_empty(), "a room imports args, which stands above it: {up:?}");
    assert!(reaches("args::image", "values"), "the check sees the rule books' imports");
}

/// The README's "Layout" block: its entries (a path at the start of a line, nested two spaces
/// under the folder above it) and its whole text.
fn layout_block() -> (Vec<String>, String) {
    let readme = std::fs::read_to_string(repo().join("README.md")).unwrap();
    let start = readme.find("## Layout\n").expect("the Layout section");
    let open = readme[start..].find("```text\n").expect("its block") + start + "```text\n".len();
    let block = &readme[open..open + readme[open..].find("```").expect("the block's end")];
    let mut entries: Vec<String> = Vec::new();
    let mut parent = String::new();
    for line in block.lines() {
        let indent = line.len() - line.trim_start().len();
        let Some(name) = line.split_whitespace().next() else { continue };
        match indent {
            0 => {
                entries.push(name.to_string());
                parent = name.to_string();
            }
            2 => entries.push(format!("{parent}{name}")),
            _ => {} // a description's continuation
        }
    }
    (entries, block.to_string())
}

/// The repository's tracked files (`git ls-files`).
fn tracked() -> Vec<String> {
    let out = std::process::Command::new("git").arg("ls-files").current_dir(repo()).output().expect("run git");
    assert!(out.status.success(), "git ls-files: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap().lines().map(str::to_string).collect()
}

#[test]
fn the_readme_layout_names_every_folder_and_script_and_nothing_else() {
    let (entries, block) = layout_block();
    let missing: Vec<&String> = entries.iter().filter(|e| !repo().join(e.as_str()).exists()).collect();
    assert!(missing.is_empty(), "README's Layout names what does not exist: {missing:?}");
    let files = tracked();
    // Folders two levels down where they group (crates/X, tests/X, python/X, the engine's
    // rooms), else the top-level folder: each has an entry at or under it.
    let mut folders = BTreeSet::new();
    for f in &files {
        let parts: Vec<&str> = f.split('/').collect();
        let depth = match parts[0] {
            "crates" | "tests" | "python" => 2,
            _ => 1,
        };
        if parts.len() > depth {
            folders.insert(format!("{}/", parts[..depth].join("/")));
        }
        if f.starts_with("crates/stoker/src/") && parts.len() > 4 {
            folders.insert(format!("{}/", parts[..4].join("/")));
        }
    }
    let unnamed: Vec<&String> = folders.iter().filter(|d| !entries.iter().any(|e| e.starts_with(d.as_str()))).collect();
    assert!(unnamed.is_empty(), "folders README's Layout leaves out: {unnamed:?}");
    let scripts: Vec<&str> = files.iter().filter_map(|f| f.strip_prefix("scripts/")).collect();
    assert!(scripts.len() > 5);
    let unnamed: Vec<&&str> = scripts.iter().filter(|s| !block.contains(**s)).collect();
    assert!(unnamed.is_empty(), "scripts README's Layout leaves out: {unnamed:?}");
}

#[test]
fn every_benchmark_is_described_and_every_result_is_referenced() {
    let read = |p: &str| std::fs::read_to_string(repo().join(p)).unwrap();
    let map = read("benches/README.md");
    let refs = read("BENCHMARKS.md") + &read("DEPENDENCIES.md");
    let files = tracked();
    let scripts: Vec<&str> = files
        .iter()
        .filter_map(|f| f.strip_prefix("benches/"))
        .filter(|f| !f.contains('/') && f.ends_with(".py"))
        .collect();
    assert!(scripts.len() > 10);
    let undescribed: Vec<&&str> = scripts.iter().filter(|s| !map.contains(&format!("`{s}`"))).collect();
    assert!(undescribed.is_empty(), "benches/README.md does not describe: {undescribed:?}");
    let results: Vec<&str> = files.iter().filter_map(|f| f.strip_prefix("benches/results/")).collect();
    assert!(results.len() > 10);
    // A result is referenced by its path, or by the family name a line gives with a `*`.
    let unreferenced: Vec<&&str> = results
        .iter()
        .filter(|r| {
            !refs.contains(&format!("results/{r}"))
                && !refs.split('`').any(|t| {
                    t.strip_prefix("benches/results/")
                        .and_then(|g| g.split_once('*'))
                        .is_some_and(|(a, b)| r.starts_with(a) && r.ends_with(b) && r.len() >= a.len() + b.len())
                })
        })
        .collect();
    let stray: Vec<&String> = files
        .iter()
        .filter(|f| {
            f.starts_with("benches/results-")
                || (f.starts_with("benches/") && f.ends_with(".json") && !f.starts_with("benches/results/"))
        })
        .collect();
    assert!(stray.is_empty(), "results outside benches/results/: {stray:?}");
    assert!(unreferenced.is_empty(), "results no line of BENCHMARKS.md or DEPENDENCIES.md refers to: {unreferenced:?}");
}
