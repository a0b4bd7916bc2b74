//! The README's async client snippet is the code of
//! `examples/async_trainer.rs` (which CI builds) between its `snippet`
//! markers, so the README shows code that compiles.

/// The lines of `text` between the line holding `begin` and the next line
/// holding `end`, trimmed.
fn between<'t>(text: &'t str, begin: &str, end: &str) -> Vec<&'t str> {
    let mut lines = text.lines().skip_while(|l| !l.contains(begin));
    assert!(lines.next().is_some(), "no `{begin}` line");
    let block: Vec<&str> = lines.take_while(|l| !l.contains(end)).map(str::trim).collect();
    assert!(!block.is_empty(), "nothing between `{begin}` and `{end}`");
    block
}

#[test]
fn the_readme_shows_the_async_example_as_it_compiles() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let readme = std::fs::read_to_string(root.join("../README.md")).unwrap();
    let example = std::fs::read_to_string(root.join("examples/async_trainer.rs")).unwrap();
    let section = readme.split("### Async client").nth(1).expect("the README has an `Async client` section");
    let shown = between(section, "```rust", "```");
    let compiled = between(&example, "// snippet begin", "// snippet end");
    assert_eq!(shown, compiled, "README.md's async client snippet differs from examples/async_trainer.rs");
}
