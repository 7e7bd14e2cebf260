//! Proves the layout is the architecture: every import inside `src/` runs down the table of
//! layers below, and no two files of `src/` import each other in a circle.
//!
//! The test reads the source as text. It follows the module tree from `src/lib.rs` (so test-only
//! modules, declared under `#[cfg(test)]`, are left out with everything else under that
//! attribute), then resolves every `crate::`, `super::` and `self::` path, and every path through a
//! child module, to the file that defines its longest module prefix. Comments and string literals
//! are blanked first, so a path in prose does not count.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// The units of `src/` and the units each may import, from the top down. A file belongs to the
/// longest unit that prefixes its module path: `router::shard::owner` is in `router::shard`,
/// `router::metrics` in `router` (the router's services: every router module that is not one of
/// its cores). Within one unit a file may import any other file of it, as long as no circle forms.
/// The README's "Architecture" section says the same in words; change both together.
const MAY_IMPORT: &[(&str, &[&str])] = &[
    // The router's cores, in the order a request meets them: the front accepts and parses, the API
    // runs the request's phases, then the sync and control cores, which drive the shards'
    // owners through their queues; the shard holds what every core reads.
    (
        "router::front",
        &[
            "router::api",
            "router::control",
            "router::shard",
            "router",
            "net",
            "logic",
            "wire",
            "base",
        ],
    ),
    (
        "router::api",
        &[
            "router::control",
            "router::shard",
            "router",
            "net",
            "logic",
            "wire",
            "base",
        ],
    ),
    (
        "router::sync",
        &[
            "router::control",
            "router::shard",
            "router",
            "net",
            "logic",
            "wire",
            "base",
        ],
    ),
    (
        "router::control",
        &["router::shard", "router", "net", "logic", "wire", "base"],
    ),
    ("router::shard", &["router", "net", "logic", "wire", "base"]),
    // The router's services: accounting, audit, configuration, errors, metrics, providers.
    ("router", &["net", "logic", "wire", "base"]),
    // The other two binaries: neither imports the router, nor each other.
    ("agent", &["net", "logic", "wire", "base"]),
    ("simulated_engine", &["wire", "base"]),
    // What the binaries share: the agent tunnel (both ends) and trace export.
    ("net", &["wire", "base"]),
    // Pure logic: no I/O, no clock, no task.
    ("logic", &["wire", "base"]),
    // Wire formats: the HTTP/1.1 codec, body fields, the control protocol.
    ("wire", &["base"]),
    // Leaves.
    ("base", &[]),
];

/// One `src/` file: its module path and the imports found in it.
struct SourceFile {
    module: Vec<String>,
    path: PathBuf,
    imports: Vec<Import>,
}

/// One path a file names: where, and the absolute module path it resolves to.
struct Import {
    line: usize,
    text: String,
    target: Vec<String>,
    /// `pub use path as name`: the name this file re-exports it under. A re-export is followed
    /// to its definition when another file names it, and is no dependency of its own for the
    /// circle check (it is still held to the layer table).
    reexport: Option<String>,
}

#[test]
fn imports_run_down_the_layers() {
    let tree = SourceTree::read(Path::new(env!("CARGO_MANIFEST_DIR")).join("src"));
    let violations = tree.wrong_way_imports();
    assert!(
        violations.is_empty(),
        "{} import(s) run against the layer table in tests/architecture.rs:\n{}",
        violations.len(),
        violations.join("\n")
    );
}

#[test]
fn no_circle_between_files() {
    let tree = SourceTree::read(Path::new(env!("CARGO_MANIFEST_DIR")).join("src"));
    let circles = tree.circles();
    assert!(
        circles.is_empty(),
        "files of src/ that import each other in a circle:\n{}",
        circles.join("\n")
    );
}

#[test]
fn every_module_belongs_to_a_unit() {
    let tree = SourceTree::read(Path::new(env!("CARGO_MANIFEST_DIR")).join("src"));
    let loose: Vec<String> = tree
        .files
        .iter()
        .filter(|file| !file.module.is_empty() && unit_of(&file.module).is_none())
        .map(|file| file.path.display().to_string())
        .collect();
    assert!(
        loose.is_empty(),
        "modules outside every unit of the layer table: {loose:?}"
    );
}

/// The checker checks: a wrong-way import and a circle written into a copy of the rules' input
/// are found and named.
#[test]
fn the_checker_finds_a_wrong_way_import_and_a_circle() {
    let mut tree = SourceTree {
        files: Vec::new(),
        by_module: BTreeMap::new(),
    };
    let mut add = |module: &str, path: &str, imports: &[&str]| {
        let module: Vec<String> = module.split("::").map(str::to_owned).collect();
        tree.by_module.insert(module.clone(), tree.files.len());
        tree.files.push(SourceFile {
            module,
            path: PathBuf::from(path),
            imports: imports
                .iter()
                .map(|target| Import {
                    line: 1,
                    text: format!("crate::{target}"),
                    target: target.split("::").map(str::to_owned).collect(),
                    reexport: None,
                })
                .collect(),
        });
    };
    add(
        "logic::limits",
        "src/logic/limits.rs",
        &["router::shard::Shard"],
    );
    add(
        "router::shard",
        "src/router/shard.rs",
        &["logic::limits::Bucket"],
    );
    add("base::a", "src/base/a.rs", &["base::b::B"]);
    add("base::b", "src/base/b.rs", &["base::a::A"]);
    let violations = tree.wrong_way_imports();
    assert_eq!(violations.len(), 1, "{violations:?}");
    assert!(
        violations[0].starts_with("src/logic/limits.rs:1: logic imports router::shard"),
        "{violations:?}"
    );
    let circles = tree.circles();
    assert_eq!(circles.len(), 2, "{circles:?}");
}

fn unit_of(module: &[String]) -> Option<&'static str> {
    let joined = module.join("::");
    MAY_IMPORT
        .iter()
        .map(|(unit, _)| *unit)
        .filter(|unit| joined == *unit || joined.starts_with(&format!("{unit}::")))
        .max_by_key(|unit| unit.len())
}

struct SourceTree {
    files: Vec<SourceFile>,
    by_module: BTreeMap<Vec<String>, usize>,
}

impl SourceTree {
    /// Follows the module tree from `lib.rs`, skipping modules declared under `#[cfg(test)]`.
    fn read(src: PathBuf) -> SourceTree {
        let mut tree = SourceTree {
            files: Vec::new(),
            by_module: BTreeMap::new(),
        };
        let mut pending = vec![(Vec::<String>::new(), src.join("lib.rs"))];
        while let Some((module, path)) = pending.pop() {
            let text = std::fs::read_to_string(&path)
                .unwrap_or_else(|error| panic!("reading {}: {error}", path.display()));
            let code = without_test_items(&blank_comments_and_literals(&text));
            let children = child_modules(&code);
            // `a.rs` keeps its children in `a/`; `lib.rs` and `mod.rs` beside themselves.
            let file_name = path.file_name().unwrap().to_str().unwrap();
            let child_dir = if file_name == "lib.rs" || file_name == "mod.rs" {
                path.parent().unwrap().to_path_buf()
            } else {
                path.with_extension("")
            };
            for child in &children {
                let flat = child_dir.join(format!("{child}.rs"));
                let nested = child_dir.join(child).join("mod.rs");
                let child_path = if flat.exists() { flat } else { nested };
                let mut child_module = module.clone();
                child_module.push(child.clone());
                pending.push((child_module, child_path));
            }
            let imports = imports(&code, &module, &children);
            tree.by_module.insert(module.clone(), tree.files.len());
            let relative = path
                .strip_prefix(src.parent().unwrap())
                .unwrap_or(&path)
                .to_path_buf();
            tree.files.push(SourceFile {
                module,
                path: relative,
                imports,
            });
        }
        tree
    }

    /// The file that defines `target`: the one of its longest module prefix, or, where that file
    /// re-exports the next name, the file the re-export leads to.
    fn resolve(&self, target: &[String]) -> Option<usize> {
        let mut target = target.to_vec();
        for _ in 0..8 {
            let (length, file) = (1..=target.len())
                .rev()
                .find_map(|length| Some((length, *self.by_module.get(&target[..length])?)))?;
            let Some(name) = target.get(length) else {
                return Some(file);
            };
            let Some(reexport) = self.files[file]
                .imports
                .iter()
                .find(|import| import.reexport.as_ref() == Some(name))
            else {
                return Some(file);
            };
            let mut next = reexport.target.clone();
            next.extend_from_slice(&target[length + 1..]);
            target = next;
        }
        None
    }

    fn wrong_way_imports(&self) -> Vec<String> {
        let mut violations = Vec::new();
        for file in &self.files {
            let Some(from) = unit_of(&file.module) else {
                continue;
            };
            let allowed = MAY_IMPORT.iter().find(|(unit, _)| *unit == from).unwrap().1;
            for import in &file.imports {
                let Some(target) = self.resolve(&import.target) else {
                    continue;
                };
                let target_module = &self.files[target].module;
                let Some(to) = unit_of(target_module) else {
                    continue;
                };
                if to != from && !allowed.contains(&to) {
                    violations.push(format!(
                        "{}:{}: {from} imports {to} ({}); {from} may import {}",
                        file.path.display(),
                        import.line,
                        import.text,
                        if allowed.is_empty() {
                            "nothing".to_owned()
                        } else {
                            allowed.join(", ")
                        },
                    ));
                }
            }
        }
        violations
    }

    /// Every strongly connected set of two or more files, each with one edge that closes it.
    fn circles(&self) -> Vec<String> {
        let edges: Vec<BTreeMap<usize, &Import>> = self
            .files
            .iter()
            .enumerate()
            .map(|(index, file)| {
                let mut targets = BTreeMap::new();
                for import in file
                    .imports
                    .iter()
                    .filter(|import| import.reexport.is_none())
                {
                    if let Some(target) = self.resolve(&import.target) {
                        // The crate root only declares modules.
                        if target != index && !self.files[target].module.is_empty() {
                            targets.entry(target).or_insert(import);
                        }
                    }
                }
                targets
            })
            .collect();
        let mut circles = Vec::new();
        for component in strongly_connected(&edges) {
            if component.len() < 2 {
                continue;
            }
            let members: BTreeSet<usize> = component.iter().copied().collect();
            let mut text = String::new();
            for &file in &component {
                for (&target, import) in &edges[file] {
                    if members.contains(&target) {
                        let _ = writeln!(
                            text,
                            "  {}:{} -> {} ({})",
                            self.files[file].path.display(),
                            import.line,
                            self.files[target].path.display(),
                            import.text
                        );
                    }
                }
            }
            circles.push(format!("a circle of {} files:\n{text}", component.len()));
        }
        circles
    }
}

/// Tarjan's algorithm, iterative.
fn strongly_connected(edges: &[BTreeMap<usize, &Import>]) -> Vec<Vec<usize>> {
    let count = edges.len();
    let mut index = vec![usize::MAX; count];
    let mut low = vec![0; count];
    let mut on_stack = vec![false; count];
    let mut stack = Vec::new();
    let mut next = 0;
    let mut components = Vec::new();
    for root in 0..count {
        if index[root] != usize::MAX {
            continue;
        }
        let mut work: Vec<(usize, Vec<usize>)> =
            vec![(root, edges[root].keys().copied().collect())];
        index[root] = next;
        low[root] = next;
        next += 1;
        stack.push(root);
        on_stack[root] = true;
        while let Some((node, successors)) = work.last_mut() {
            let node = *node;
            if let Some(successor) = successors.pop() {
                if index[successor] == usize::MAX {
                    index[successor] = next;
                    low[successor] = next;
                    next += 1;
                    stack.push(successor);
                    on_stack[successor] = true;
                    work.push((successor, edges[successor].keys().copied().collect()));
                } else if on_stack[successor] {
                    low[node] = low[node].min(index[successor]);
                }
                continue;
            }
            work.pop();
            if let Some((parent, _)) = work.last() {
                low[*parent] = low[*parent].min(low[node]);
            }
            if low[node] == index[node] {
                let mut component = Vec::new();
                loop {
                    let member = stack.pop().unwrap();
                    on_stack[member] = false;
                    component.push(member);
                    if member == node {
                        break;
                    }
                }
                component.sort_unstable();
                components.push(component);
            }
        }
    }
    components
}

/// The text with comments and the insides of string and character literals replaced by spaces;
/// line breaks stay, so line numbers do.
fn blank_comments_and_literals(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = bytes.to_vec();
    let blank = |out: &mut Vec<u8>, from: usize, to: usize| {
        for byte in &mut out[from..to] {
            if *byte != b'\n' {
                *byte = b' ';
            }
        }
    };
    let mut at = 0;
    while at < bytes.len() {
        let rest = &bytes[at..];
        if rest.starts_with(b"//") {
            let end = memchr_newline(bytes, at);
            blank(&mut out, at, end);
            at = end;
        } else if rest.starts_with(b"/*") {
            let mut depth = 0usize;
            let mut end = at;
            while end < bytes.len() {
                if bytes[end..].starts_with(b"/*") {
                    depth += 1;
                    end += 2;
                } else if bytes[end..].starts_with(b"*/") {
                    depth -= 1;
                    end += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    end += 1;
                }
            }
            blank(&mut out, at, end);
            at = end;
        } else if let Some((open, hashes)) = raw_string_start(bytes, at) {
            let closing: Vec<u8> = std::iter::once(b'"')
                .chain(std::iter::repeat_n(b'#', hashes))
                .collect();
            let mut end = open + 1;
            while end < bytes.len() && !bytes[end..].starts_with(&closing) {
                end += 1;
            }
            blank(&mut out, open + 1, end);
            at = end + closing.len();
        } else if bytes[at] == b'"' {
            let mut end = at + 1;
            while end < bytes.len() && bytes[end] != b'"' {
                end += if bytes[end] == b'\\' { 2 } else { 1 };
            }
            blank(&mut out, at + 1, end.min(bytes.len()));
            at = end + 1;
        } else if bytes[at] == b'\'' {
            // A character literal ('x', '\n', '\u{1F600}') or a lifetime ('a).
            if bytes.get(at + 1) == Some(&b'\\') {
                let mut end = at + 2;
                while end < bytes.len() && bytes[end] != b'\'' {
                    end += 1;
                }
                blank(&mut out, at + 1, end);
                at = end + 1;
            } else {
                let width = text[at + 1..].chars().next().map_or(1, char::len_utf8);
                if bytes.get(at + 1 + width) == Some(&b'\'') {
                    blank(&mut out, at + 1, at + 1 + width);
                    at += 2 + width;
                } else {
                    at += 1;
                }
            }
        } else {
            at += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn memchr_newline(bytes: &[u8], from: usize) -> usize {
    bytes[from..]
        .iter()
        .position(|&byte| byte == b'\n')
        .map_or(bytes.len(), |offset| from + offset)
}

/// `r"`, `r#"`, `br"`, ... starting at `at` (and not inside an identifier): the index of the
/// opening quote and the number of hashes.
fn raw_string_start(bytes: &[u8], at: usize) -> Option<(usize, usize)> {
    if at > 0 && (bytes[at - 1].is_ascii_alphanumeric() || bytes[at - 1] == b'_') {
        return None;
    }
    let mut cursor = at;
    if bytes.get(cursor) == Some(&b'b') {
        cursor += 1;
    }
    if bytes.get(cursor) != Some(&b'r') {
        return None;
    }
    cursor += 1;
    let hashes = bytes[cursor..]
        .iter()
        .take_while(|&&byte| byte == b'#')
        .count();
    cursor += hashes;
    (bytes.get(cursor) == Some(&b'"')).then_some((cursor, hashes))
}

/// The code with every item under `#[cfg(test)]` blanked, line breaks kept.
fn without_test_items(code: &str) -> String {
    let mut out = code.as_bytes().to_vec();
    let bytes = code.as_bytes();
    let mut search = 0;
    while let Some(found) = code[search..].find("#[cfg(test)]") {
        let start = search + found;
        let mut at = start + "#[cfg(test)]".len();
        let mut depth = 0usize;
        // The item ends at its first `;` outside braces, or where its first brace closes.
        while at < bytes.len() {
            match bytes[at] {
                b'{' => depth += 1,
                b'}' => {
                    depth -= 1;
                    if depth == 0 {
                        at += 1;
                        break;
                    }
                }
                b';' if depth == 0 => {
                    at += 1;
                    break;
                }
                _ => {}
            }
            at += 1;
        }
        for byte in &mut out[start..at.min(bytes.len())] {
            if *byte != b'\n' {
                *byte = b' ';
            }
        }
        search = at.min(bytes.len());
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// `mod name;` declarations (file modules) of the code; `mod name { ... }` is part of the file.
fn child_modules(code: &str) -> Vec<String> {
    let mut children = Vec::new();
    let mut search = 0;
    while let Some(at) = find_word(code, "mod", search) {
        search = at + 3;
        let rest = code[search..].trim_start();
        let name_length = rest
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(rest.len());
        if name_length > 0 && rest[name_length..].trim_start().starts_with(';') {
            children.push(rest[..name_length].to_owned());
        }
    }
    children
}

/// Every path of the code into this crate, resolved to an absolute module path.
fn imports(code: &str, module: &[String], children: &[String]) -> Vec<Import> {
    let mut found = Vec::new();
    let line_of = |offset: usize| code[..offset].bytes().filter(|&byte| byte == b'\n').count() + 1;
    let mut use_spans = Vec::new();
    // `use` trees.
    let mut search = 0;
    while let Some(found_at) = find_word(code, "use", search) {
        let Some(end) = code[found_at..].find(';').map(|offset| found_at + offset) else {
            break;
        };
        use_spans.push((found_at, end));
        // `a as b` keeps a marker for its `as`; every other space goes.
        let words: Vec<&str> = code[found_at + 3..end].split_whitespace().collect();
        let tree: String = words
            .join(" ")
            .replace(" as ", "@")
            .chars()
            .filter(|c| !c.is_whitespace())
            .collect();
        let public = code[..found_at].trim_end().ends_with("pub")
            || code[..found_at].trim_end().ends_with(')');
        for (path, name) in expand_use_tree(&tree) {
            if let Some(target) = absolute(&path, module, children) {
                let reexport = public.then_some(name);
                found.push(Import {
                    line: line_of(found_at),
                    text: path.join("::"),
                    target,
                    reexport,
                });
            }
        }
        search = end;
    }
    // Paths in expressions and types: `crate::a::b`, `super::a`, `child::a`.
    let bytes = code.as_bytes();
    let mut at = 0;
    while at < bytes.len() {
        let word_start = at;
        if !(bytes[at].is_ascii_alphabetic() || bytes[at] == b'_')
            || (at > 0
                && (bytes[at - 1].is_ascii_alphanumeric()
                    || bytes[at - 1] == b'_'
                    || bytes[at - 1] == b':'))
        {
            at += 1;
            continue;
        }
        let mut segments = Vec::new();
        let mut cursor = at;
        loop {
            let start = cursor;
            while cursor < bytes.len()
                && (bytes[cursor].is_ascii_alphanumeric() || bytes[cursor] == b'_')
            {
                cursor += 1;
            }
            segments.push(code[start..cursor].to_owned());
            let after_space = cursor + code[cursor..].len() - code[cursor..].trim_start().len();
            if code[after_space..].starts_with("::") {
                let next = after_space + 2;
                let next = next + code[next..].len() - code[next..].trim_start().len();
                if next < bytes.len() && (bytes[next].is_ascii_alphabetic() || bytes[next] == b'_')
                {
                    cursor = next;
                    continue;
                }
            }
            break;
        }
        at = cursor.max(word_start + 1);
        if segments.len() < 2
            || use_spans
                .iter()
                .any(|&(from, to)| word_start >= from && word_start < to)
        {
            continue;
        }
        if let Some(target) = absolute(&segments, module, children) {
            found.push(Import {
                line: line_of(word_start),
                text: segments.join("::"),
                target,
                reexport: None,
            });
        }
    }
    found
}

fn find_word(code: &str, word: &str, from: usize) -> Option<usize> {
    let bytes = code.as_bytes();
    let mut search = from;
    while let Some(offset) = code[search..].find(word) {
        let at = search + offset;
        let before = at.checked_sub(1).map(|index| bytes[index]);
        let after = bytes.get(at + word.len()).copied();
        let boundary =
            |byte: Option<u8>| byte.is_none_or(|b| !(b.is_ascii_alphanumeric() || b == b'_'));
        if boundary(before) && boundary(after) && before != Some(b':') {
            return Some(at);
        }
        search = at + word.len();
    }
    None
}

/// `a::{b,c::{d,e@f},self}` (`@` for `as`) into `a::b`, `a::c::d`, `a::c::e`, `a`, each with the
/// name it takes here (`b`, `d`, `f`, `a`).
fn expand_use_tree(tree: &str) -> Vec<(Vec<String>, String)> {
    fn expand(tree: &str, prefix: &[String], out: &mut Vec<(Vec<String>, String)>) {
        if let Some(open) = tree.find('{') {
            let mut path = prefix.to_vec();
            path.extend(
                tree[..open]
                    .split("::")
                    .filter(|s| !s.is_empty())
                    .map(str::to_owned),
            );
            let inner = &tree[open + 1..tree.rfind('}').unwrap_or(tree.len())];
            let mut depth = 0;
            let mut start = 0;
            for (index, c) in inner.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        expand(&inner[start..index], &path, out);
                        start = index + 1;
                    }
                    _ => {}
                }
            }
            expand(&inner[start..], &path, out);
        } else {
            let (tree, alias) = match tree.split_once('@') {
                Some((tree, alias)) => (tree, Some(alias)),
                None => (tree, None),
            };
            let mut path = prefix.to_vec();
            for segment in tree.split("::").filter(|s| !s.is_empty() && *s != "*") {
                if segment != "self" || path.is_empty() {
                    path.push(segment.to_owned());
                }
            }
            if let Some(last) = path.last() {
                let name = alias.map_or_else(|| last.clone(), str::to_owned);
                out.push((path, name));
            }
        }
    }
    let tree = tree.strip_prefix("::").unwrap_or(tree);
    let mut out = Vec::new();
    expand(tree, &[], &mut out);
    out
}

/// The absolute module path `path` names from `module`, or `None` for a path outside the crate.
fn absolute(path: &[String], module: &[String], children: &[String]) -> Option<Vec<String>> {
    let (first, rest) = path.split_first()?;
    match first.as_str() {
        "crate" => Some(rest.to_vec()),
        "self" => Some(module.iter().chain(rest).cloned().collect()),
        "super" => {
            let mut base = module.to_vec();
            base.pop()?;
            let mut rest = rest;
            while rest.first().map(String::as_str) == Some("super") {
                base.pop()?;
                rest = &rest[1..];
            }
            Some(base.into_iter().chain(rest.iter().cloned()).collect())
        }
        name if children.iter().any(|child| child == name) => {
            Some(module.iter().chain(path).cloned().collect())
        }
        _ => None,
    }
}
