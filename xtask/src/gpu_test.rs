//! `cargo xtask gpu-test`: builds gear-cuda's test, bench and example
//! binaries, and gear-api's CUDA sampler test (`gear-api/tests/cuda.rs`,
//! feature `cuda`, packed as `gear_api_cuda`), into a self-contained folder
//! (default `target/gpu-test/`) with a `run.sh` that runs them on a GPU
//! machine that has no cargo, and runs it here when this machine has a GPU.
//!
//! xtask dependencies this module needs: `anyhow` and `serde_json` (both in
//! `[workspace.dependencies]`). Wire it up with `mod gpu_test;` and a
//! `gpu-test` subcommand that calls `gpu_test::run(&rest_of_args)`.
//!
//! ```text
//! cargo xtask gpu-test [--out DIR] [--bundle-nvrtc] [--run | --build-only]
//! ```
//!
//! * `--out DIR`: where to put `bin/`, `run.sh` (and `nvrtc/`); default
//!   `<workspace>/target/gpu-test`.
//! * `--bundle-nvrtc`: copy the NVRTC libraries (from `GEAR_NVRTC_DIR`, or
//!   `.ci/nvrtc` as `gear-cuda/ci/install-nvrtc.sh` installs them) into
//!   `DIR/nvrtc`, for GPU machines without a CUDA toolkit (about 115 MB).
//! * `--run` / `--build-only`: run `run.sh` after building, or never; by
//!   default it runs when an NVIDIA GPU is visible (`nvidia-smi -L`
//!   succeeds or `/dev/nvidia0` exists).
//!
//! `run.sh` sets `GEAR_REQUIRE_GPU=1` (a skipped device test fails), points
//! `GEAR_NVRTC_DIR` at the bundled NVRTC when present and not already set,
//! runs every test binary, then the `cuda_bench` example (and the criterion
//! benches when `GEAR_GPU_CRITERION=1`), and exits non-zero if anything
//! failed.

use anyhow::{bail, Context, Result};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// Usage text for `cargo xtask help`.
pub const USAGE: &str = "gpu-test [--out DIR] [--bundle-nvrtc] [--run | --build-only]
    build gear-cuda's test binaries and gear-api's cuda test into DIR (default
    target/gpu-test) with a run.sh
    for GPU machines without cargo; run them when a GPU is present";

#[derive(Debug, Default)]
struct Options {
    out: Option<PathBuf>,
    bundle_nvrtc: bool,
    /// `Some(true)`: always run; `Some(false)`: never; `None`: if a GPU is seen.
    run: Option<bool>,
}

fn parse(args: &[String]) -> Result<Options> {
    let mut o = Options::default();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--out" => o.out = Some(PathBuf::from(it.next().context("--out needs a directory")?)),
            "--bundle-nvrtc" => o.bundle_nvrtc = true,
            "--run" => o.run = Some(true),
            "--build-only" => o.run = Some(false),
            "-h" | "--help" => {
                println!("cargo xtask {USAGE}");
                std::process::exit(0);
            }
            other => bail!("gpu-test: unknown argument `{other}`\nusage: cargo xtask {USAGE}"),
        }
    }
    Ok(o)
}

/// One built executable of gear-cuda (or gear-api's cuda test).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Artifact {
    /// File name in `bin/`.
    name: String,
    /// `test`, `bench` or `example`.
    role: &'static str,
    path: PathBuf,
}

/// The workspace around the current directory (`cargo locate-project`),
/// else the one this xtask was built in.
fn workspace_root() -> PathBuf {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let located = Command::new(cargo)
        .args(["locate-project", "--workspace", "--message-format", "plain"])
        .stderr(Stdio::null())
        .output()
        .ok()
        .filter(|o| o.status.success())
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| Path::new(s.trim()).parent().map(Path::to_path_buf));
    located.unwrap_or_else(|| {
        Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("xtask lives in the workspace").to_path_buf()
    })
}

/// Runs a cargo command with `--message-format=json` and returns the
/// executables of `role` that the crate in directory `krate` (`gear-cuda`,
/// `gear-api`) built, from its compiler-artifact messages.
fn cargo_executables(root: &Path, krate: &str, args: &[&str], role: &'static str) -> Result<Vec<Artifact>> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut cmd = Command::new(&cargo);
    cmd.current_dir(root).args(args).arg("--message-format=json").stdout(Stdio::piped()).stderr(Stdio::inherit());
    eprintln!("gpu-test: {cargo} {}", args.join(" "));
    let out = cmd.output().with_context(|| format!("running {cargo}"))?;
    if !out.status.success() {
        bail!("`cargo {}` failed ({})", args.join(" "), out.status);
    }
    let stdout = String::from_utf8(out.stdout).context("cargo printed non-UTF-8 JSON")?;
    parse_artifacts(&stdout, krate, role)
}

fn parse_artifacts(json_lines: &str, krate: &str, role: &'static str) -> Result<Vec<Artifact>> {
    let manifest = format!("{krate}/Cargo.toml");
    let mut found = Vec::new();
    for line in json_lines.lines().filter(|l| l.starts_with('{')) {
        let v: serde_json::Value = serde_json::from_str(line).with_context(|| format!("bad cargo JSON: {line}"))?;
        if v["reason"] != "compiler-artifact" {
            continue;
        }
        let Some(exe) = v["executable"].as_str() else { continue };
        let ours = v["manifest_path"].as_str().is_some_and(|m| Path::new(m).ends_with(&manifest));
        if !ours {
            continue;
        }
        let is_test = v["profile"]["test"].as_bool().unwrap_or(false);
        let kinds: Vec<&str> =
            v["target"]["kind"].as_array().into_iter().flatten().filter_map(|k| k.as_str()).collect();
        let wanted = match role {
            "test" => is_test && !kinds.contains(&"bench"),
            "bench" => kinds.contains(&"bench"),
            _ => kinds.contains(&"example"),
        };
        if !wanted {
            continue;
        }
        let target = v["target"]["name"].as_str().context("artifact without a target name")?;
        let name = if kinds.contains(&"lib") { format!("{target}_unit") } else { target.to_owned() };
        found.push(Artifact { name, role, path: PathBuf::from(exe) });
    }
    found.sort_by(|a, b| a.name.cmp(&b.name));
    found.dedup_by(|a, b| a.name == b.name);
    Ok(found)
}

fn gpu_present() -> bool {
    let smi = Command::new("nvidia-smi")
        .arg("-L")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    smi || Path::new("/dev/nvidia0").exists()
}

fn run_script(tests: &[Artifact], bench: &[Artifact], examples: &[Artifact]) -> String {
    let mut s = String::from(
        r#"#!/usr/bin/env bash
# Runs gear-cuda's tests and bench on a GPU machine; needs no cargo.
# Generated by `cargo xtask gpu-test`; see gear-cuda/README.md.
#   ./run.sh                      tests (GEAR_REQUIRE_GPU=1) then the bench
#   GEAR_GPU_CRITERION=1 ./run.sh also the criterion benches
set -uo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
export GEAR_REQUIRE_GPU=1
if [[ -z "${GEAR_NVRTC_DIR:-}" && -d "$here/nvrtc" ]]; then
    export GEAR_NVRTC_DIR="$here/nvrtc"
fi
nvidia-smi -L 2>/dev/null || echo "run.sh: nvidia-smi not found or failed"
echo "GEAR_NVRTC_DIR=${GEAR_NVRTC_DIR:-<unset: loader search path>}"
failed=()
run() {
    local name="$1"; shift
    echo
    echo "== $name"
    if ! "$here/bin/$name" "$@"; then failed+=("$name"); fi
}
"#,
    );
    for t in tests {
        let _ = writeln!(s, "run {} --test-threads=1", t.name);
    }
    for e in examples {
        let _ = writeln!(s, "run {}", e.name);
    }
    if !bench.is_empty() {
        s.push_str("if [[ \"${GEAR_GPU_CRITERION:-0}\" == 1 ]]; then\n");
        for b in bench {
            let _ = writeln!(s, "    run {} --bench", b.name);
        }
        s.push_str("fi\n");
    }
    s.push_str(
        r#"echo
if (( ${#failed[@]} )); then
    echo "run.sh: FAILED: ${failed[*]}"
    exit 1
fi
echo "run.sh: all passed"
"#,
    );
    s
}

/// Copies the NVRTC libraries (not the `.alt` variants, not symlinks) into
/// `dest`.
fn bundle_nvrtc(root: &Path, dest: &Path) -> Result<()> {
    let src = match std::env::var_os("GEAR_NVRTC_DIR").filter(|d| !d.is_empty()) {
        Some(d) => PathBuf::from(d),
        None => root.join(".ci/nvrtc/nvidia/cu13/lib"),
    };
    if !src.is_dir() {
        bail!(
            "--bundle-nvrtc: no NVRTC at {} (run gear-cuda/ci/install-nvrtc.sh or set GEAR_NVRTC_DIR)",
            src.display()
        );
    }
    std::fs::create_dir_all(dest)?;
    let mut copied = 0;
    for entry in std::fs::read_dir(&src)? {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if !name.starts_with("libnvrtc") || name.contains(".alt.") || !name.contains(".so") {
            continue;
        }
        // Skip symlinks (libnvrtc.so -> libnvrtc.so.13): gear-cuda preloads
        // the versioned files from GEAR_NVRTC_DIR, and a second full copy
        // under another name could be loaded twice.
        if entry.file_type()?.is_symlink() {
            continue;
        }
        std::fs::copy(entry.path(), dest.join(&name)).with_context(|| format!("copying {name}"))?;
        copied += 1;
    }
    if copied == 0 {
        bail!("--bundle-nvrtc: {} holds no libnvrtc*.so*", src.display());
    }
    Ok(())
}

/// Entry point of `cargo xtask gpu-test ARGS`.
pub fn run(args: &[String]) -> Result<()> {
    let opts = parse(args)?;
    let root = workspace_root();
    let out = opts.out.clone().unwrap_or_else(|| root.join("target/gpu-test"));

    let mut tests =
        cargo_executables(&root, "gear-cuda", &["test", "-p", "gear-cuda", "--release", "--no-run"], "test")?;
    if tests.is_empty() {
        bail!("cargo reported no gear-cuda test executables");
    }
    let api_args = ["test", "-p", "gear-api", "--features", "cuda", "--release", "--test", "cuda", "--no-run"];
    let api = cargo_executables(&root, "gear-api", &api_args, "test")?;
    if api.is_empty() {
        bail!("cargo reported no executable for gear-api's cuda test");
    }
    tests.extend(api.into_iter().map(|a| Artifact { name: format!("gear_api_{}", a.name), ..a }));
    let bench = cargo_executables(&root, "gear-cuda", &["bench", "-p", "gear-cuda", "--no-run"], "bench")?;
    let examples = cargo_executables(
        &root,
        "gear-cuda",
        &["build", "-p", "gear-cuda", "--release", "--example", "cuda_bench"],
        "example",
    )?;

    let bin = out.join("bin");
    if bin.exists() {
        std::fs::remove_dir_all(&bin).with_context(|| format!("clearing {}", bin.display()))?;
    }
    std::fs::create_dir_all(&bin)?;
    for a in tests.iter().chain(&bench).chain(&examples) {
        std::fs::copy(&a.path, bin.join(&a.name))
            .with_context(|| format!("copying {} to {}", a.path.display(), bin.display()))?;
    }
    if opts.bundle_nvrtc {
        bundle_nvrtc(&root, &out.join("nvrtc"))?;
    }
    let script = out.join("run.sh");
    std::fs::write(&script, run_script(&tests, &bench, &examples))?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755))?;
    }
    let names: Vec<&str> = tests.iter().chain(&bench).chain(&examples).map(|a| a.name.as_str()).collect();
    println!("gpu-test: wrote {} ({})", out.display(), names.join(", "));

    let run_now = opts.run.unwrap_or_else(gpu_present);
    if !run_now {
        println!("gpu-test: no GPU here (or --build-only); copy {} to a GPU machine and run ./run.sh", out.display());
        return Ok(());
    }
    let status = Command::new("bash").arg(&script).status().context("running run.sh")?;
    if !status.success() {
        bail!("gpu-test: {} failed ({status})", script.display());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn picks_gear_cuda_executables_by_role() {
        let lines = [
            r#"{"reason":"compiler-artifact","manifest_path":"/w/gear-cuda/Cargo.toml","target":{"name":"gear_cuda","kind":["lib"]},"profile":{"test":true},"executable":"/t/gear_cuda-1"}"#,
            r#"{"reason":"compiler-artifact","manifest_path":"/w/gear-cuda/Cargo.toml","target":{"name":"device","kind":["test"]},"profile":{"test":true},"executable":"/t/device-2"}"#,
            r#"{"reason":"compiler-artifact","manifest_path":"/w/gear-cuda/Cargo.toml","target":{"name":"gear_cuda","kind":["lib"]},"profile":{"test":false},"executable":null}"#,
            r#"{"reason":"compiler-artifact","manifest_path":"/w/gear-core/Cargo.toml","target":{"name":"gear_core","kind":["lib"]},"profile":{"test":true},"executable":"/t/gear_core-3"}"#,
            r#"{"reason":"compiler-artifact","manifest_path":"/w/gear-cuda/Cargo.toml","target":{"name":"cuda_bench","kind":["example"]},"profile":{"test":false},"executable":"/t/cuda_bench"}"#,
            r#"{"reason":"build-finished","success":true}"#,
        ]
        .join("\n");
        let tests = parse_artifacts(&lines, "gear-cuda", "test").unwrap();
        let names: Vec<&str> = tests.iter().map(|a| a.name.as_str()).collect();
        assert_eq!(names, ["device", "gear_cuda_unit"]);
        let ex = parse_artifacts(&lines, "gear-cuda", "example").unwrap();
        assert_eq!(ex.len(), 1);
        assert_eq!(ex[0].path, PathBuf::from("/t/cuda_bench"));
    }

    #[test]
    fn picks_gear_api_cuda_test_only_for_gear_api() {
        let lines = [
            r#"{"reason":"compiler-artifact","manifest_path":"/w/gear-api/Cargo.toml","target":{"name":"cuda","kind":["test"]},"profile":{"test":true},"executable":"/t/cuda-4"}"#,
            r#"{"reason":"compiler-artifact","manifest_path":"/w/gear-cuda/Cargo.toml","target":{"name":"gear_cuda","kind":["lib"]},"profile":{"test":false},"executable":null}"#,
        ]
        .join("\n");
        let api = parse_artifacts(&lines, "gear-api", "test").unwrap();
        assert_eq!(api.len(), 1);
        assert_eq!((api[0].name.as_str(), &api[0].path), ("cuda", &PathBuf::from("/t/cuda-4")));
        assert!(parse_artifacts(&lines, "gear-cuda", "test").unwrap().is_empty());
    }

    #[test]
    fn script_runs_tests_then_bench() {
        let a = |name: &str, role| Artifact { name: name.into(), role, path: PathBuf::new() };
        let s = run_script(&[a("device", "test")], &[a("cuda_gather", "bench")], &[a("cuda_bench", "example")]);
        let t = s.find("run device").unwrap();
        let e = s.find("run cuda_bench").unwrap();
        assert!(t < e && s.contains("GEAR_REQUIRE_GPU=1") && s.contains("run cuda_gather --bench"));
    }
}
