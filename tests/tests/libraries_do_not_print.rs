//! Libraries do not print: the library crates log through `tracing` and
//! leave stdout and stderr to the program that links them (the `gear`
//! binary installs a subscriber; a trainer chooses its own). Tests
//! (`#[cfg(test)]` modules, `tests/`, benches, examples) may print.

use std::path::{Path, PathBuf};

/// The library crates: everything but the `gear` binary, xtask and tests.
const LIBRARIES: [&str; 11] = [
    "gear-core",
    "gear-cpu",
    "gear-sampler",
    "gear-cuda",
    "gear-device",
    "gear-rdma",
    "gear-tcp",
    "gear-api",
    "gear-net",
    "gear-hdf5",
    "gear-py",
];

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap().filter_map(Result::ok) {
        let path = entry.path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// Lines of `text` before its first `#[cfg(test)]` that print, with their
/// numbers; comments are skipped.
fn printing_lines(text: &str) -> Vec<(usize, String)> {
    text.lines()
        .enumerate()
        .take_while(|(_, l)| l.trim() != "#[cfg(test)]")
        .filter(|(_, l)| !l.trim_start().starts_with("//"))
        .filter(|(_, l)| ["println!(", "eprintln!(", "print!(", "eprint!(", "dbg!("].iter().any(|m| l.contains(m)))
        .map(|(i, l)| (i + 1, l.trim().to_owned()))
        .collect()
}

#[test]
fn library_crates_log_instead_of_printing() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let mut found = Vec::new();
    for lib in LIBRARIES {
        let src = root.join(lib).join("src");
        if !src.is_dir() {
            continue;
        }
        let mut files = Vec::new();
        rust_files(&src, &mut files);
        for f in files {
            let text = std::fs::read_to_string(&f).unwrap();
            for (line, code) in printing_lines(&text) {
                found.push(format!("{}:{line}: {code}", f.strip_prefix(root).unwrap().display()));
            }
        }
    }
    assert!(found.is_empty(), "library code prints (log with tracing::warn!/info! instead):\n{}", found.join("\n"));
}

#[test]
fn the_check_sees_prints_and_skips_tests_and_comments() {
    let text = "fn a() {\n    eprintln!(\"x\");\n    // println!(\"doc\")\n}\n#[cfg(test)]\nmod t { fn b() { println!(\"ok\") } }\n";
    assert_eq!(printing_lines(text), vec![(2, "eprintln!(\"x\");".to_owned())]);
}
