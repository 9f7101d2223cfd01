//! The import rules of the crate, checked on its sources: [`crate::model`] at the bottom (with the leaves
//! [`crate::quantity`] and [`crate::common`]), the pairs above it, and no pair importing another but through the
//! side inputs listed in [`ALLOWED`] (which form no cycle). A test fails, naming the file and line, when an
//! import breaks them.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The pair modules: each reconciles one resource, and may import only the bottom and [`ALLOWED`].
const PAIRS: [&str; 7] = ["pod", "sandbox", "volume", "claim", "probe", "eviction", "image"];

/// The bottom of the crate, and what each of its modules may import.
const BOTTOM: [(&str, &[&str]); 3] =
    [("quantity", &[]), ("model", &["quantity"]), ("common", &["model", "quantity"])];

/// An import of one pair by another that the rules allow: files under `from` (a path under `src/`) may import
/// paths starting with `to`; `why` says which side input or relation it is.
struct Allowed {
    from: &'static str,
    to: &'static str,
    why: &'static str,
}

/// The only imports of a pair by another: what a reconciler reads of another pair's stores among its side
/// inputs, and the sandbox pair's wiring (its relation on the volume stores).
const ALLOWED: [Allowed; 6] = [
    Allowed {
        from: "pod/",
        to: "sandbox::status",
        why: "the sandbox pair's stores (SandboxView), a side input",
    },
    Allowed { from: "pod/", to: "probe::results", why: "the probe results the prober writes, a side input" },
    Allowed { from: "pod/", to: "probe::status", why: "the probe results as container status shows them" },
    Allowed {
        from: "pod/",
        to: "volume::status",
        why: "the volume pair's stores (VolumeGate), a side input",
    },
    Allowed {
        from: "sandbox/",
        to: "volume::status",
        why: "the volume pair's stores (VolumeGate), a side input",
    },
    Allowed {
        from: "sandbox/pair.rs",
        to: "volume::",
        why: "the sandbox pair's wiring: its relation on the volume stores (key: the pod of a volume)",
    },
];

/// One import of a top-level module of the crate: the path after `crate::` (`sandbox::status::SandboxView`),
/// and where it is.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Import {
    line: usize,
    path: String,
}

impl Import {
    /// The top-level module imported.
    fn module(&self) -> &str {
        self.path.split("::").next().unwrap_or_default()
    }
}

/// The crate-level paths `source` imports (in `use` lines, paths in code and `use crate::{…}` groups), outside
/// comments. `depth` is the number of modules between the file and the crate root (`pod/gc.rs`: 2), for paths
/// through `super::`.
fn imports(source: &str, depth: usize) -> Vec<Import> {
    let mut out = Vec::new();
    for (n, line) in source.lines().enumerate() {
        let code = line.split("//").next().unwrap_or_default();
        let mut rest = code;
        while let Some((at, root_len)) = next_root(rest, depth) {
            let after = &rest[at + root_len..];
            if let Some(group) = after.strip_prefix('{') {
                for path in group_heads(group) {
                    out.push(Import { line: n + 1, path });
                }
            } else {
                let path: String =
                    after.chars().take_while(|c| c.is_alphanumeric() || *c == '_' || *c == ':').collect();
                if !path.is_empty() {
                    out.push(Import { line: n + 1, path: path.trim_end_matches(':').to_owned() });
                }
            }
            rest = &rest[at + root_len..];
        }
    }
    out
}

/// Where the next path from the crate root starts in `code`: the offset of `crate::`, `nodelet_resources::` or
/// `super::` repeated `depth` times, and its length.
fn next_root(code: &str, depth: usize) -> Option<(usize, usize)> {
    let supers = "super::".repeat(depth.max(1));
    let mut roots = vec!["crate::".to_owned(), "nodelet_resources::".to_owned()];
    if depth > 0 {
        roots.push(supers);
    }
    roots
        .iter()
        .filter_map(|root| {
            let mut from = 0;
            while let Some(i) = code[from..].find(root.as_str()) {
                let at = from + i;
                let word_start = !code[..at].ends_with(|c: char| c.is_alphanumeric() || c == '_' || c == ':');
                if word_start {
                    return Some((at, root.len()));
                }
                from = at + root.len();
            }
            None
        })
        .min()
}

/// The paths of a `{…}` group (after its `{`), each as far as its first `{` or `,`: `model::pod::X, sandbox`
/// gives `model::pod::X` and `sandbox`.
fn group_heads(group: &str) -> Vec<String> {
    let mut heads = Vec::new();
    let mut depth = 0;
    let mut current = String::new();
    for c in group.chars() {
        match c {
            '{' => depth += 1,
            '}' if depth == 0 => break,
            '}' => depth -= 1,
            ',' if depth == 0 => heads.push(std::mem::take(&mut current)),
            _ if depth == 0 && !c.is_whitespace() => current.push(c),
            _ => {}
        }
    }
    heads.push(current);
    heads
        .into_iter()
        .map(|h| h.trim_end_matches(':').split(" as ").next().unwrap_or_default().to_owned())
        .filter(|h| !h.is_empty() && h != "self")
        .collect()
}

/// Why `file` (a path under `src/`, in module `from`) may not import `import`, if it may not.
fn violation(file: &str, from: &str, import: &Import) -> Option<String> {
    let to = import.module();
    if to == from || to.is_empty() {
        return None;
    }
    if let Some((_, allowed)) = BOTTOM.iter().find(|(m, _)| *m == from) {
        return (!allowed.contains(&to))
            .then(|| format!("{from} is at the bottom and may import only {allowed:?}"));
    }
    if !PAIRS.contains(&from) {
        return None;
    }
    if BOTTOM.iter().any(|(m, _)| *m == to) {
        return None;
    }
    let allowed = ALLOWED.iter().any(|a| file.starts_with(a.from) && import.path.starts_with(a.to));
    (!allowed).then(|| {
        format!("the pair {from} imports {to}: a pair imports only model, quantity, common and the side inputs listed in ALLOWED")
    })
}

/// Every `.rs` file under `dir`.
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    for entry in entries {
        let path = entry.unwrap_or_else(|e| panic!("{}: {e}", dir.display())).path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The module of `file` (relative to `src/`) and its depth below the crate root.
fn module_of(file: &Path) -> (String, usize) {
    let parts: Vec<String> = file.iter().map(|p| p.to_string_lossy().into_owned()).collect();
    let top = parts.first().map(|p| p.trim_end_matches(".rs").to_owned()).unwrap_or_default();
    let last = parts.last().map(String::as_str).unwrap_or_default();
    let depth = if last == "mod.rs" || last == "lib.rs" { parts.len() - 1 } else { parts.len() };
    (top, depth)
}

/// Whether `edges` (module → modules it imports) have a cycle; the first one found, if so.
fn cycle(edges: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        node: &str,
        edges: &BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(i) = path.iter().position(|p| p == node) {
            let mut found = path[i..].to_vec();
            found.push(node.to_owned());
            return Some(found);
        }
        if done.contains(node) {
            return None;
        }
        path.push(node.to_owned());
        for next in edges.get(node).into_iter().flatten() {
            if let Some(found) = visit(next, edges, path, done) {
                return Some(found);
            }
        }
        path.pop();
        done.insert(node.to_owned());
        None
    }
    let mut done = BTreeSet::new();
    edges.keys().find_map(|node| visit(node, edges, &mut Vec::new(), &mut done))
}

#[test]
fn no_pair_imports_another_but_through_its_side_inputs() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    files.sort();
    // The crate's top-level modules: a path through `super::` from an inline module (`mod tests`) that names
    // none of them stays inside its own module.
    let top: BTreeSet<String> =
        files.iter().filter_map(|p| Some(module_of(p.strip_prefix(&src).ok()?).0)).collect();
    let mut violations = Vec::new();
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for path in &files {
        let rel = path.strip_prefix(&src).unwrap_or(path);
        let (from, depth) = module_of(rel);
        let source = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let file = rel.to_string_lossy();
        for import in imports(&source, depth).into_iter().filter(|i| top.contains(i.module())) {
            if import.module() != from
                && (PAIRS.contains(&from.as_str()) || BOTTOM.iter().any(|(m, _)| *m == from))
            {
                edges.entry(from.clone()).or_default().insert(import.module().to_owned());
            }
            if let Some(why) = violation(&file, &from, &import) {
                violations.push(format!("src/{file}:{}: crate::{}: {why}", import.line, import.path));
            }
        }
    }
    assert!(violations.is_empty(), "imports that break the layering:\n{}", violations.join("\n"));
    assert_eq!(cycle(&edges), None, "a cycle between the modules: {edges:?}");
}

/// The allowed imports form no cycle between pairs.
#[test]
fn the_allowed_imports_form_no_cycle() {
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for a in &ALLOWED {
        let from = a.from.split('/').next().unwrap_or_default().to_owned();
        let to = a.to.split("::").next().unwrap_or_default().to_owned();
        assert!(!a.why.is_empty());
        edges.entry(from).or_default().insert(to);
    }
    assert_eq!(cycle(&edges), None);
}

/// The scanner finds imports in every form, ignores comments, and the rules catch a pair importing another.
#[test]
fn the_scanner_catches_a_pair_importing_another() {
    let source = "use crate::model::pod::DesiredPod;\n\
                  // crate::pod::gc::plan in a comment\n\
                  use crate::{model::actual::PodActual, pod::reconciler::finished};\n\
                  let x = crate::eviction::verdict::Admission::new(); // crate::image\n\
                  use super::super::probe::results::ProbeResults;\n\
                  use super::ops::SandboxOp;\n";
    let found: Vec<(usize, String)> = imports(source, 2).into_iter().map(|i| (i.line, i.path)).collect();
    assert_eq!(
        found,
        vec![
            (1, "model::pod::DesiredPod".to_owned()),
            (3, "model::actual::PodActual".to_owned()),
            (3, "pod::reconciler::finished".to_owned()),
            (4, "eviction::verdict::Admission::new".to_owned()),
            (5, "probe::results::ProbeResults".to_owned()),
        ]
    );
    let broken: Vec<usize> = imports(source, 2)
        .iter()
        .filter(|i| violation("sandbox/reconciler.rs", "sandbox", i).is_some())
        .map(|i| i.line)
        .collect();
    assert_eq!(broken, vec![3, 4, 5], "pod, eviction and probe from the sandbox pair");
    let pod = imports("use crate::sandbox::status::SandboxView;\nuse crate::sandbox::ops::SandboxOp;\n", 2);
    let broken: Vec<usize> =
        pod.iter().filter(|i| violation("pod/status.rs", "pod", i).is_some()).map(|i| i.line).collect();
    assert_eq!(broken, vec![2], "the pod pair reads the sandbox pair's status, not its operations");
    let model = imports("use crate::common::clock::Clock;\n", 1);
    assert!(violation("model/mod.rs", "model", &model[0]).is_some(), "the model imports no helper of common");
    let mut edges = BTreeMap::new();
    edges.insert("pod".to_owned(), BTreeSet::from(["sandbox".to_owned()]));
    edges.insert("sandbox".to_owned(), BTreeSet::from(["pod".to_owned()]));
    assert_eq!(cycle(&edges), Some(vec!["pod".to_owned(), "sandbox".to_owned(), "pod".to_owned()]));
}
