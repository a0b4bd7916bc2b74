//! `cargo xtask gpu-test`: builds gear-cuda's test, bench and example
//! binaries, gear-api's CUDA sampler test (`gear-api/tests/cuda.rs`,
//! feature `cuda`, packed as `gear_api_cuda`), the conformance suite of the
//! `tests` crate with the CUDA sampler among its backends (`tests_conformance`)
//! and the `gear` binary with the
//! `cuda` feature, strips them, and puts them into a self-contained folder
//! (default `target/gpu-test/`) with a `run.sh` that runs them on a GPU
//! machine that has no cargo; it runs it here when this machine has a GPU.
//!
//! ```text
//! cargo xtask gpu-test [--out DIR] [--run | --build-only]
//! ```
//!
//! * `--out DIR`: where to put `bin/` and `run.sh`; default
//!   `<workspace>/target/gpu-test`.
//! * `--run` / `--build-only`: run `run.sh` after building, or never; by
//!   default it runs when an NVIDIA GPU is visible (`nvidia-smi -L`
//!   succeeds or `/dev/nvidia0` exists).
//!
//! The package carries no NVRTC: the kernels are compiled to PTX and CUBIN
//! when gear-cuda is built (`gear-cuda/build.rs`), so the build needs NVRTC
//! (`GEAR_NVRTC_DIR`, or `.ci/nvrtc` from `gear-cuda/ci/install-nvrtc.sh`)
//! and this command refuses to pack a gear-cuda built without it. The GPU
//! machine needs only the NVIDIA driver (CUDA 13, r580 or newer) and a
//! glibc at least as new as the one the binaries were linked against
//! (`run.sh` prints the requirement). The folder must stay under
//! [`MAX_PACKAGE_BYTES`] (the tool that carries it takes at most 64 MiB).
//!
//! `run.sh` sets `GEAR_REQUIRE_GPU=1` (a skipped device test fails), runs
//! every test binary, then the `cuda_bench` example and
//! `gear bench --backend cuda` (and the criterion benches when
//! `GEAR_GPU_CRITERION=1`), and exits non-zero if anything failed.

use anyhow::{bail, Context, Result};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// Usage text for `cargo xtask help`.
pub const USAGE: &str = "gpu-test [--out DIR] [--run | --build-only]
    build gear-cuda's tests, gear-api's cuda test and `gear` (stripped, kernels
    precompiled to PTX/CUBIN, no NVRTC) into DIR (default target/gpu-test) with
    a run.sh for GPU machines without cargo; run them when a GPU is present.
    On the GPU machine: `cd DIR && ./run.sh` (needs only the NVIDIA driver)";

/// The most the package may weigh: the tool that carries work to a GPU
/// machine takes at most 64 MiB, and this leaves room beside it.
pub const MAX_PACKAGE_BYTES: u64 = 30_000_000;

#[derive(Debug, Default)]
struct Options {
    out: Option<PathBuf>,
    /// `Some(true)`: always run; `Some(false)`: never; `None`: if a GPU is seen.
    run: Option<bool>,
}

fn parse(args: &[String]) -> Result<Options> {
    let mut o = Options::default();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--out" => o.out = Some(PathBuf::from(it.next().context("--out needs a directory")?)),
            "--bundle-nvrtc" => bail!(
                "gpu-test: --bundle-nvrtc is gone: kernels are compiled to PTX at build time and the package \
                 needs only the NVIDIA driver"
            ),
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
            "bin" => kinds.contains(&"bin") && !is_test,
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

fn run_script(tests: &[Artifact], bench: &[Artifact], examples: &[Artifact], glibc: &str) -> String {
    let mut s = String::from(
        r#"#!/usr/bin/env bash
# Runs gear-cuda's tests and bench on a GPU machine; needs no cargo.
# Generated by `cargo xtask gpu-test`; see gear-cuda/README.md.
#   ./run.sh                      tests (GEAR_REQUIRE_GPU=1) then the bench
#   GEAR_GPU_CRITERION=1 ./run.sh also the criterion benches
# Needs only the NVIDIA driver: the kernels are embedded as PTX/CUBIN.
set -uo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
export GEAR_REQUIRE_GPU=1
nvidia-smi -L 2>/dev/null || echo "run.sh: nvidia-smi not found or failed"
echo "run.sh: built for glibc >= @GLIBC@; here: $(ldd --version 2>/dev/null | head -n1)"
echo "GEAR_NVRTC_DIR=${GEAR_NVRTC_DIR:-<unset: not needed unless a kernel image does not load>}"
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
    s.push_str(GEAR_BENCH_LINES);
    if !bench.is_empty() {
        s.push_str("if [[ \"${GEAR_GPU_CRITERION:-0}\" == 1 ]]; then\n");
        for b in bench {
            let _ = writeln!(s, "    run {} --bench", b.name);
        }
        s.push_str("fi\n");
    }
    s = s.replace("@GLIBC@", glibc);
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

/// `gear bench --backend cuda` at batch sizes 32 to 1024, then once with an
/// odd T (127 steps: slot strides and window starts not 16-byte aligned,
/// so the gather's realigned path carries the bytes).
const GEAR_BENCH_LINES: &str = r#"for b in 32 128 256 1024; do
    run gear bench --backend cuda --batch "$b" --batches 200
done
run gear bench --backend cuda --batch 256 --steps 127 --batches 200
"#;

/// Strips symbols and debug info from `path` in place (binutils `strip`,
/// else `objcopy --strip-all`).
fn strip(path: &Path) -> Result<()> {
    for (tool, flag) in [("strip", "--strip-all"), ("objcopy", "--strip-all")] {
        match Command::new(tool).arg(flag).arg(path).status() {
            Ok(s) if s.success() => return Ok(()),
            Ok(s) => bail!("{tool} {flag} {} failed ({s})", path.display()),
            Err(_) => continue,
        }
    }
    bail!("neither `strip` nor `objcopy` found; install binutils to pack {}", path.display())
}

/// The newest `GLIBC_x.y` symbol version the ELF file at `path` needs, from
/// its dynamic symbol version strings (`None` if none is found).
fn glibc_needed(path: &Path) -> Result<Option<(u32, u32)>> {
    let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    Ok(glibc_versions(&bytes).max())
}

fn glibc_versions(bytes: &[u8]) -> impl Iterator<Item = (u32, u32)> + '_ {
    let needle = b"GLIBC_";
    bytes.windows(needle.len()).enumerate().filter(move |(_, w)| *w == needle).filter_map(move |(i, _)| {
        let rest = &bytes[i + needle.len()..];
        let end = rest.iter().position(|&b| !(b.is_ascii_digit() || b == b'.')).unwrap_or(rest.len());
        let v = std::str::from_utf8(&rest[..end]).ok()?;
        let mut it = v.split('.');
        let major = it.next()?.parse().ok()?;
        let minor = it.next().and_then(|m| m.parse().ok()).unwrap_or(0);
        Some((major, minor))
    })
}

/// Total bytes of the regular files under `dir`.
fn folder_bytes(dir: &Path) -> Result<u64> {
    let mut total = 0;
    for entry in std::fs::read_dir(dir).with_context(|| format!("listing {}", dir.display()))? {
        let entry = entry?;
        let ty = entry.file_type()?;
        if ty.is_dir() {
            total += folder_bytes(&entry.path())?;
        } else if ty.is_file() {
            total += entry.metadata()?.len();
        }
    }
    Ok(total)
}

/// Refuses a package over [`MAX_PACKAGE_BYTES`].
fn check_size(bytes: u64) -> Result<()> {
    if bytes > MAX_PACKAGE_BYTES {
        bail!("gpu-test: the package has {bytes} bytes, more than the {MAX_PACKAGE_BYTES} allowed");
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
    // The conformance suite, with the CUDA sampler as one of its backends.
    let conformance_args =
        ["test", "-p", "tests", "--features", "cuda", "--release", "--test", "conformance", "--no-run"];
    let conformance = cargo_executables(&root, "tests", &conformance_args, "test")?;
    if conformance.is_empty() {
        bail!("cargo reported no executable for the conformance suite");
    }
    tests.extend(conformance.into_iter().map(|a| Artifact { name: format!("tests_{}", a.name), ..a }));
    let bench = cargo_executables(&root, "gear-cuda", &["bench", "-p", "gear-cuda", "--no-run"], "bench")?;
    let examples = cargo_executables(
        &root,
        "gear-cuda",
        &["build", "-p", "gear-cuda", "--release", "--example", "cuda_bench"],
        "example",
    )?;
    let gear = cargo_executables(
        &root,
        "gear-cli",
        &["build", "-p", "gear-cli", "--features", "cuda", "--release", "--bin", "gear"],
        "bin",
    )?;
    if gear.len() != 1 {
        bail!("cargo reported {} `gear` executables, expected 1", gear.len());
    }

    let bin = out.join("bin");
    if bin.exists() {
        std::fs::remove_dir_all(&bin).with_context(|| format!("clearing {}", bin.display()))?;
    }
    std::fs::create_dir_all(&bin)?;
    let mut glibc = (2, 2);
    for a in tests.iter().chain(&bench).chain(&examples).chain(&gear) {
        let dest = bin.join(&a.name);
        std::fs::copy(&a.path, &dest).with_context(|| format!("copying {} to {}", a.path.display(), bin.display()))?;
        strip(&dest)?;
        glibc = glibc.max(glibc_needed(&dest)?.unwrap_or((2, 2)));
    }
    // Without NVRTC at build time the binaries would need it at run time.
    let probe = tests.iter().find(|a| a.name == "gear_cuda_unit").context("no gear-cuda unit-test binary")?;
    let marker = b".target sm_80";
    let embedded = std::fs::read(bin.join(&probe.name))?.windows(marker.len()).any(|w| w == marker);
    if !embedded {
        bail!(
            "gear-cuda was built without NVRTC, so no PTX is embedded; run gear-cuda/ci/install-nvrtc.sh (or set \
             GEAR_NVRTC_DIR) and build again"
        );
    }
    let script = out.join("run.sh");
    std::fs::write(&script, run_script(&tests, &bench, &examples, &format!("{}.{}", glibc.0, glibc.1)))?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755))?;
    }
    let names: Vec<&str> = tests.iter().chain(&bench).chain(&examples).chain(&gear).map(|a| a.name.as_str()).collect();
    let bytes = folder_bytes(&out)?;
    println!(
        "gpu-test: wrote {} ({bytes} bytes, needs glibc >= {}.{}: {})",
        out.display(),
        glibc.0,
        glibc.1,
        names.join(", ")
    );
    check_size(bytes)?;

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
        let s = run_script(&[a("device", "test")], &[a("cuda_gather", "bench")], &[a("cuda_bench", "example")], "2.34");
        let t = s.find("run device").unwrap();
        let e = s.find("run cuda_bench").unwrap();
        let g = s.find("run gear bench --backend cuda").unwrap();
        assert!(t < e && e < g && s.contains("GEAR_REQUIRE_GPU=1") && s.contains("run cuda_gather --bench"));
        assert!(s.contains("glibc >= 2.34") && !s.contains("@GLIBC@") && !s.contains("nvrtc/"));
    }

    #[test]
    fn package_size_limit() {
        assert!(check_size(MAX_PACKAGE_BYTES).is_ok());
        // What `--bundle-nvrtc` used to make: 219 MB.
        assert!(check_size(219_000_000).is_err());
        const { assert!(MAX_PACKAGE_BYTES < 64 << 20) };
    }

    #[test]
    fn newest_glibc_symbol_version() {
        let elf = b"\0GLIBC_2.2.5\0GLIBC_2.34\0GLIBC_PRIVATE\0GLIBC_2.17\0";
        assert_eq!(glibc_versions(elf).max(), Some((2, 34)));
        assert_eq!(glibc_versions(b"none").max(), None);
    }

    /// Section names of a little-endian ELF64 file (empty if it is not one).
    fn elf_sections(b: &[u8]) -> Vec<String> {
        let u16_at = |o: usize| b.get(o..o + 2).map_or(0, |s| u16::from_le_bytes([s[0], s[1]]) as usize);
        let u32_at = |o: usize| b.get(o..o + 4).map_or(0, |s| u32::from_le_bytes(s.try_into().unwrap()) as usize);
        let u64_at = |o: usize| b.get(o..o + 8).map_or(0, |s| u64::from_le_bytes(s.try_into().unwrap()) as usize);
        if !b.starts_with(b"\x7fELF") || b.get(4) != Some(&2) {
            return Vec::new();
        }
        let (shoff, shentsize, shnum, shstrndx) = (u64_at(0x28), u16_at(0x3a), u16_at(0x3c), u16_at(0x3e));
        let strtab = u64_at(shoff + shstrndx * shentsize + 0x18);
        (0..shnum)
            .map(|i| {
                let name = strtab + u32_at(shoff + i * shentsize);
                let end = b[name..].iter().position(|&c| c == 0).map_or(b.len(), |e| name + e);
                String::from_utf8_lossy(&b[name..end]).into_owned()
            })
            .collect()
    }

    /// A packed binary is stripped: no symbol table or line tables left.
    #[test]
    fn strip_removes_symbols_and_line_tables() {
        let me = std::env::current_exe().unwrap();
        let before = std::fs::read(&me).unwrap();
        let sections = elf_sections(&before);
        if !sections.iter().any(|s| s == ".symtab") {
            println!("skipped: this test binary has no symbol table to strip ({sections:?})");
            return;
        }
        let dir = std::env::temp_dir().join(format!("gear-strip-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let copy = dir.join("bin");
        std::fs::copy(&me, &copy).unwrap();
        if let Err(e) = strip(&copy) {
            std::fs::remove_dir_all(&dir).ok();
            println!("skipped: {e}");
            return;
        }
        let after = std::fs::read(&copy).unwrap();
        std::fs::remove_dir_all(&dir).ok();
        let left = elf_sections(&after);
        assert!(!left.is_empty() && after.len() < before.len());
        assert!(!left.iter().any(|s| [".symtab", ".debug_info", ".debug_line"].contains(&s.as_str())), "{left:?}");
    }
}
