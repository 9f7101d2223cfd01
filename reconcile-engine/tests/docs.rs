//! The complete example of the documentation is one program, copied in three places: the crate
//! docs (`src/lib.rs`) and the guide (`docs/guide.md`), whose copies run as doctests, and the
//! README. `scripts/check-engine-standalone.sh` builds the guide's copy outside the workspace.
//! These tests keep the copies identical.

const MARKER: &str = "<!-- complete example: main.rs -->";

/// The lines of the fenced `rust` block that follows the marker line in `markdown`.
fn complete_example(markdown: &str) -> Option<Vec<&str>> {
    let mut lines = markdown.lines().skip_while(|line| *line != MARKER).skip(1);
    lines.by_ref().find(|line| *line == "```rust")?;
    let mut block = Vec::new();
    for line in lines {
        if line == "```" {
            return Some(block);
        }
        block.push(line);
    }
    None
}

/// The crate-level doc comment of `src/lib.rs` as markdown.
fn crate_docs() -> String {
    include_str!("../src/lib.rs")
        .lines()
        .filter_map(|line| line.strip_prefix("//!"))
        .map(|line| line.strip_prefix(' ').unwrap_or(line))
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn the_guide_should_hold_a_complete_example() {
    let example = complete_example(include_str!("../docs/guide.md")).expect("the guide's example");
    assert!(example.iter().any(|line| line.contains("async fn main()")), "a whole program");
    assert!(example.iter().any(|line| line.contains("engine.run(")), "it runs the engine");
    assert!(example.iter().any(|line| line.contains("TextEncoder")), "it prints the metrics");
    // rustdoc hides the lines that are `#` or start with `# ` (after indentation)
    let hidden = |line: &&str| matches!(line.trim_start(), "#") || line.trim_start().starts_with("# ");
    assert!(!example.iter().any(hidden), "no hidden lines: the example is copied as it is");
}

#[test]
fn the_crate_docs_should_hold_the_guides_complete_example() {
    let guide = complete_example(include_str!("../docs/guide.md")).expect("the guide's example");
    let docs = crate_docs();
    let lib = complete_example(&docs).expect("the crate docs' example");
    assert_eq!(lib, guide);
}

#[test]
fn the_readme_should_hold_the_guides_complete_example() {
    let guide = complete_example(include_str!("../docs/guide.md")).expect("the guide's example");
    let readme = complete_example(include_str!("../README.md")).expect("the README's example");
    assert_eq!(readme, guide);
}
