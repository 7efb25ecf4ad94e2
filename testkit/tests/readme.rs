//! The README's example is the example crate's code: every `rust,ignore` block that starts
//! with `// <path>` is, line for line, a part of `examples/expire-invoices/<path>`, which CI
//! builds and runs under every fault. And the README's `Cargo.toml` names the crate's
//! dependencies.

use std::path::Path;

fn example_crate() -> &'static Path {
    Path::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../examples/expire-invoices"
    ))
}

/// The README's fenced blocks of `kind`, each as its lines.
fn blocks(kind: &str) -> Vec<Vec<String>> {
    let readme = include_str!("../README.md");
    let mut found = Vec::new();
    let mut current: Option<Vec<String>> = None;
    for line in readme.lines() {
        match &mut current {
            None if line == format!("```{kind}") => current = Some(Vec::new()),
            Some(block) if line == "```" => {
                found.push(std::mem::take(block));
                current = None;
            }
            Some(block) => block.push(line.to_owned()),
            None => {}
        }
    }
    found
}

#[test]
fn the_readme_shows_the_example_crates_code() {
    let code = blocks("rust,ignore");
    assert_eq!(code.len(), 2, "the service and its test");
    for block in code {
        let path = block[0]
            .strip_prefix("// ")
            .unwrap_or_else(|| panic!("a block names its file first: {:?}", block[0]));
        let file = std::fs::read_to_string(example_crate().join(path))
            .unwrap_or_else(|e| panic!("{path}: {e}"));
        let shown = block[1..].join("\n");
        assert!(
            file.contains(&shown),
            "README's {path} is not what examples/expire-invoices/{path} says: update one"
        );
    }
}

#[test]
fn the_readme_names_the_example_crates_dependencies() {
    let toml = blocks("toml");
    let manifest = std::fs::read_to_string(example_crate().join("Cargo.toml")).unwrap();
    let names = |text: &str| -> Vec<String> {
        let mut names: Vec<String> = text
            .lines()
            .filter(|l| !l.starts_with('[') && !l.starts_with('#') && l.contains(" = "))
            .map(|l| l.split(" = ").next().unwrap().trim().to_owned())
            .filter(|n| {
                !["name", "version", "edition", "publish", "description"].contains(&n.as_str())
            })
            .collect();
        names.sort();
        names
    };
    let readme_deps = names(&toml.last().expect("a Cargo.toml block").join("\n"));
    assert_eq!(readme_deps, names(&manifest));
}
