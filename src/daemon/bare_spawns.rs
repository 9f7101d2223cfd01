//! Keeps every long-lived task on the [`Supervisor`](super::Supervisor): a test scans the workspace's
//! non-test Rust sources for bare `tokio::spawn(` and `task::spawn(` and fails, naming the file and line, for
//! any that [`ALLOWED`] does not list with its reason. What may stay bare: per-request or per-connection work
//! owned by its server or client session, and short tasks whose handle their owner awaits. A long-lived task
//! (a populator, a watch loop, an event stream, a prober's worker) runs on the supervisor, or on a task the
//! supervisor runs (a `JoinSet` it owns), or is handed to the daemon as a future.
//!
//! Test code is skipped: `#[cfg(test)]` items (`mod … {`, `fn … {`) up to their closing brace, the files of a
//! `#[cfg(test)] mod x;`, and the `tests/`, `benches/`, `examples/` and `bench/` directories.

use std::path::{Path, PathBuf};

/// A bare spawn that may stay: the file (relative to the workspace root), a piece of its line, and why.
struct Allowed {
    file: &'static str,
    line: &'static str,
    why: &'static str,
}

const fn allow(file: &'static str, line: &'static str, why: &'static str) -> Allowed {
    Allowed { file, line, why }
}

/// Every bare spawn outside tests, with its reason.
const ALLOWED: &[Allowed] = &[
    allow(
        "src/daemon/supervisor.rs",
        "self.watch(name, policy, tokio::spawn(task))",
        "the supervisor itself",
    ),
    allow(
        "src/daemon/supervisor.rs",
        "tokio::spawn(make()).await",
        "the supervisor itself (a restartable task)",
    ),
    allow("server/src/conn.rs", "tokio::spawn(async move {", "per connection, owned by its server"),
    allow(
        "server/src/streaming.rs",
        "tokio::spawn(port_forward::serve(",
        "per connection, owned by its server",
    ),
    allow("server/src/streaming.rs", "tokio::spawn(relay(", "per connection, owned by its server"),
    allow("server/src/streaming.rs", "tokio::spawn(async move {", "per connection, owned by its server"),
    allow(
        "drivers/cri/src/client.rs",
        "let call = tokio::spawn(async move {",
        "per request, awaited by its caller",
    ),
    allow("cli/src/cp.rs", "tokio::spawn(async move {", "the CLI client's session"),
    allow("cli/src/port_forward.rs", "tokio::spawn(async move {", "the CLI client's session, per connection"),
    allow("cli/src/session.rs", "tokio::spawn(", "the CLI client's session"),
    allow("cli/src/stream.rs", "tokio::spawn(async move {", "the CLI client's session, per connection"),
    allow(
        "deploy/images/grpc-health/src/main.rs",
        "tokio::spawn(poll);",
        "a test image's own program (not nodelet): its poller lives as long as its process",
    ),
];

/// The directory a file's child modules live in.
fn module_dir(file: &Path) -> PathBuf {
    let parent = file.parent().map(Path::to_path_buf).unwrap_or_default();
    match file.file_stem().and_then(|s| s.to_str()) {
        Some("mod" | "lib" | "main") | None => parent,
        Some(stem) => parent.join(stem),
    }
}

/// The bare spawns of one file's source (1-based line numbers and the lines), skipping `#[cfg(test)]` items
/// and comments; adds the paths of its `#[cfg(test)] mod x;` to `test_modules`.
fn spawns(file: &Path, source: &str, test_modules: &mut Vec<PathBuf>) -> Vec<(usize, String)> {
    lines_with(file, source, test_modules, |line| {
        line.contains("tokio::spawn(") || line.contains("task::spawn(")
    })
}

/// A spawn on the [`Supervisor`](super::Supervisor): `sup.spawn(`, `supervisor.spawn(`,
/// `supervisor().spawn(`, `outer.spawn(` and their `spawn_restartable(`.
fn supervisor_spawn(line: &str) -> bool {
    ["sup", "supervisor", "supervisor()", "outer"]
        .iter()
        .any(|r| line.contains(&format!("{r}.spawn(")) || line.contains(&format!("{r}.spawn_restartable(")))
        || line.trim_start().starts_with(".spawn(")
        || line.trim_start().starts_with(".spawn_restartable(")
}

/// The lines of one file's source that `matches` (1-based line numbers and the lines), skipping
/// `#[cfg(test)]` items and comments; adds the paths of its `#[cfg(test)] mod x;` to `test_modules`.
fn lines_with(
    file: &Path,
    source: &str,
    test_modules: &mut Vec<PathBuf>,
    matches: impl Fn(&str) -> bool,
) -> Vec<(usize, String)> {
    let lines: Vec<&str> = source.lines().collect();
    let mut found = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i];
        let trimmed = line.trim_start();
        if trimmed == "#[cfg(test)]"
            && let Some(next) = lines.get(i + 1)
        {
            let indent = &line[..line.len() - trimmed.len()];
            let item = next.trim();
            if let Some(name) = item.strip_prefix("mod ").and_then(|m| m.strip_suffix(';')) {
                test_modules.push(module_dir(file).join(name));
                i += 2;
                continue;
            }
            if item.ends_with('{') {
                let close = format!("{indent}}}");
                let end = lines[i + 1..].iter().position(|l| *l == close).map_or(lines.len(), |p| i + 1 + p);
                i = end + 1;
                continue;
            }
        }
        if !trimmed.starts_with("//") && matches(line) {
            found.push((i + 1, line.trim().to_owned()));
        }
        i += 1;
    }
    found
}

/// The Rust sources of the workspace at `root` that are not test, bench or example code.
fn sources(root: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    let mut dirs = vec![root.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else { continue };
        for entry in entries.flatten() {
            let path = entry.path();
            let name = entry.file_name();
            let name = name.to_string_lossy();
            if path.is_dir() {
                let skip = name.starts_with('.')
                    || ["target", "tests", "benches", "examples", "bench", "node_modules"]
                        .contains(&name.as_ref());
                if !skip {
                    dirs.push(path);
                }
            } else if name.ends_with(".rs") {
                files.push(path);
            }
        }
    }
    files.sort();
    files
}

#[test]
fn every_bare_spawn_outside_tests_is_listed_with_its_reason() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut test_modules = Vec::new();
    let mut found = Vec::new();
    for file in sources(root) {
        let Ok(source) = std::fs::read_to_string(&file) else { continue };
        let relative = file.strip_prefix(root).unwrap_or(&file).to_path_buf();
        for (line, text) in spawns(&relative, &source, &mut test_modules) {
            found.push((relative.clone(), line, text));
        }
    }
    found.retain(|(file, _, _)| {
        !test_modules.iter().any(|m| file.starts_with(m) || *file == m.with_extension("rs"))
    });
    let mut used = vec![false; ALLOWED.len()];
    let mut unlisted = Vec::new();
    for (file, line, text) in &found {
        let entry = ALLOWED.iter().position(|a| file == Path::new(a.file) && text.contains(a.line));
        match entry {
            Some(k) => used[k] = true,
            None => unlisted.push(format!("{}:{line}: {text}", file.display())),
        }
    }
    assert!(
        unlisted.is_empty(),
        "bare spawns outside tests: run them on the Supervisor (or hand the future to the daemon), or list \
         them in ALLOWED with the reason they may stay bare:\n{}",
        unlisted.join("\n")
    );
    let stale: Vec<String> = ALLOWED
        .iter()
        .zip(&used)
        .filter(|(_, used)| !**used)
        .map(|(a, _)| format!("{}: {:?} ({})", a.file, a.line, a.why))
        .collect();
    assert!(stale.is_empty(), "ALLOWED lists spawns that are gone:\n{}", stale.join("\n"));
}

#[test]
fn the_scan_skips_test_items_and_comments_and_finds_the_rest() {
    let source = "fn run() {\n    tokio::spawn(work());\n}\n\
                  // tokio::spawn(in_a_comment());\n\
                  #[cfg(test)]\nmod tests;\n\
                  #[cfg(test)]\nmod inline {\n    fn t() { tokio::spawn(x()); }\n}\n\
                  fn later() { tokio::task::spawn(y()); }\n";
    let mut modules = Vec::new();
    let found = spawns(Path::new("src/a.rs"), source, &mut modules);
    assert_eq!(
        found,
        vec![
            (2, "tokio::spawn(work());".to_owned()),
            (11, "fn later() { tokio::task::spawn(y()); }".to_owned()),
        ]
    );
    assert_eq!(modules, vec![PathBuf::from("src/a/tests")]);
}

/// The files of the root crate that spawn on the [`Supervisor`](super::Supervisor): the one assembly module,
/// the supervisor's `spawn_tasks` (a pair's [`NamedTask`](nodelet_resources::common::task::NamedTask)s, each
/// with the policy of its lifetime: the eviction pair spawns through it only), and nodelet's own pairs
/// assembled as extensions (`super::builtin`), which the assembly module starts through `Extension::start`
/// and which spawn on the supervisor of their `ExtensionContext`, as every extension does; everything else
/// hands its tasks to the assembly module (`NamedTask`s or futures).
const SUPERVISOR_SPAWNERS: &[&str] = &[
    "src/daemon/topology.rs",
    "src/daemon/supervisor.rs",
    "src/daemon/builtin/claims.rs",
    "src/daemon/builtin/volumes.rs",
    "src/daemon/builtin/sandboxes.rs",
    "src/daemon/builtin/pods.rs",
    "src/daemon/builtin/images.rs",
];

/// The sources the supervisor scan reads: the root crate's and those of the crates split from it, which the
/// assembly module starts the same way.
const DAEMON_SOURCES: &[&str] = &["src", "stats/src", "server/src", "sources/src", "cluster/src"];

#[test]
fn only_the_assembly_module_spawns_on_the_supervisor() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut test_modules = Vec::new();
    let mut found = Vec::new();
    for file in DAEMON_SOURCES.iter().flat_map(|dir| sources(&root.join(dir))) {
        let Ok(source) = std::fs::read_to_string(&file) else { continue };
        let relative = file.strip_prefix(root).unwrap_or(&file).to_path_buf();
        for (line, text) in lines_with(&relative, &source, &mut test_modules, supervisor_spawn) {
            found.push((relative.clone(), line, text));
        }
    }
    found.retain(|(file, _, _)| {
        !test_modules.iter().any(|m| file.starts_with(m) || *file == m.with_extension("rs"))
    });
    let spawners: Vec<&Path> = found.iter().map(|(file, _, _)| file.as_path()).collect();
    for file in SUPERVISOR_SPAWNERS {
        assert!(
            spawners.contains(&Path::new(file)),
            "{file} spawns nothing on the supervisor: the scan is broken"
        );
    }
    let elsewhere: Vec<String> = found
        .iter()
        .filter(|(file, _, _)| !SUPERVISOR_SPAWNERS.iter().any(|s| file == Path::new(s)))
        .map(|(file, line, text)| format!("{}:{line}: {text}", file.display()))
        .collect();
    assert!(
        elsewhere.is_empty(),
        "tasks spawned on the supervisor outside src/daemon/topology.rs and the built-in extensions: return \
         them as NamedTasks and spawn them in topology.rs:\n{}",
        elsewhere.join("\n")
    );
}

#[test]
fn the_supervisor_scan_finds_each_form() {
    let source = "fn start() {\n    sup.spawn(\"a\", Critical, f());\n    core.supervisor\n        \
                  .spawn_restartable(\"b\", g);\n    ctx.supervisor().spawn(\"c\", Critical, h());\n    \
                  self.tracker.spawn(x());\n}\n";
    let found = lines_with(Path::new("src/a.rs"), source, &mut Vec::new(), supervisor_spawn);
    let lines: Vec<usize> = found.iter().map(|(l, _)| *l).collect();
    assert_eq!(lines, vec![2, 4, 5]);
}
