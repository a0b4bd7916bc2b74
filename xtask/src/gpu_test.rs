//! `cargo xtask gpu-test`: packs everything a GPU machine needs to check
//! GEAR's GPU path, into a self-contained folder (default
//! `target/gpu-test/`) whose one command, `./run.sh` (`all`), runs it and
//! writes one report file to bring back; it runs it here when this machine
//! has a GPU.
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
//! The package (stripped, release): gear-cuda's tests (the device suite on
//! CUDA, NVRTC checks, unit tests), gear-api's CUDA sampler suite
//! (`gear_api_cuda`), the conformance suite with CUDA among its backends
//! (`tests_conformance`: GPU selection and the device cache), the `gear`
//! binary with the `cuda` feature (bench, `device-soak`, `train-bench`),
//! `cuda_bench`, the criterion benches, and `rdma_loopback` when gear-rdma's
//! `rdma` feature builds here. `run.sh` is `xtask/src/gpu_run.sh` with the
//! package's lists filled in; see its header for the steps.
//!
//! The package carries no NVRTC: the kernels are compiled to PTX and CUBIN
//! when gear-cuda is built (`gear-cuda/build.rs`), with the NVRTC this
//! command installs the way `.ci/run` does (`gear-cuda/ci/install-nvrtc.sh`
//! into `.ci/nvrtc`) unless `GEAR_NVRTC_DIR` names one; it refuses to pack
//! a gear-cuda built without kernel images. The GPU machine needs only the
//! NVIDIA driver (CUDA 13, r580 or newer) and a glibc at least as new as the
//! one the binaries were linked against (`run.sh` prints the requirement).
//! The folder must stay under [`MAX_PACKAGE_BYTES`] (the tool that carries
//! it takes at most 64 MiB).

use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// Usage text for `cargo xtask help`.
pub const USAGE: &str = "gpu-test [--out DIR] [--run | --build-only]
    pack every CUDA test, the conformance suite, `gear` (bench, device-soak,
    train-bench), the benches and rdma_loopback (stripped, kernels precompiled
    to PTX/CUBIN with an NVRTC installed on the way) into DIR (default
    target/gpu-test) with a run.sh for GPU machines without cargo; run it
    when a GPU is present. On the GPU machine: `cd DIR && ./run.sh` (all;
    needs only the NVIDIA driver), which writes one report file";

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
fn cargo_executables(
    root: &Path,
    krate: &str,
    args: &[&str],
    role: &'static str,
    env: &[(String, String)],
) -> Result<Vec<Artifact>> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut cmd = Command::new(&cargo);
    cmd.current_dir(root).args(args).arg("--message-format=json").stdout(Stdio::piped()).stderr(Stdio::inherit());
    cmd.envs(env.iter().map(|(k, v)| (k, v)));
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

/// The package's `run.sh`: `xtask/src/gpu_run.sh` with its lists filled
/// in (test binaries, criterion benches, the commit, the glibc needed).
fn run_script(tests: &[Artifact], benches: &[Artifact], glibc: &str, commit: &str) -> String {
    let names = |a: &[Artifact]| a.iter().map(|a| a.name.as_str()).collect::<Vec<_>>().join(" ");
    include_str!("gpu_run.sh")
        .replace("@TESTS@", &names(tests))
        .replace("@BENCHES@", &names(benches))
        .replace("@COMMIT@", commit)
        .replace("@GLIBC@", glibc)
}

/// The commit the package is built from, with `-dirty` when the working
/// tree has changes.
fn commit_of(root: &Path) -> String {
    let git = |args: &[&str]| {
        Command::new("git")
            .current_dir(root)
            .args(args)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
    };
    let head = git(&["rev-parse", "--short=12", "HEAD"]).unwrap_or_else(|| "unknown".into());
    let dirty = git(&["status", "--porcelain", "--untracked-files=no"]).is_some_and(|s| !s.is_empty());
    if dirty {
        format!("{head}-dirty")
    } else {
        head
    }
}

/// The NVRTC library directory to build gear-cuda's kernel images with:
/// `GEAR_NVRTC_DIR`, else `.ci/nvrtc`, installed there first by
/// `gear-cuda/ci/install-nvrtc.sh` (as `.ci/run` does) when missing.
fn nvrtc_dir(root: &Path) -> Result<PathBuf> {
    if let Some(d) = std::env::var_os("GEAR_NVRTC_DIR").filter(|d| !d.is_empty()) {
        return Ok(PathBuf::from(d));
    }
    let default = root.join(".ci/nvrtc/nvidia/cu13/lib");
    if default.join("libnvrtc.so.13").exists() {
        return Ok(default);
    }
    eprintln!("gpu-test: installing NVRTC with gear-cuda/ci/install-nvrtc.sh");
    let out = Command::new("bash")
        .current_dir(root)
        .arg("gear-cuda/ci/install-nvrtc.sh")
        .stderr(Stdio::inherit())
        .output()
        .context("running gear-cuda/ci/install-nvrtc.sh")?;
    if !out.status.success() {
        bail!(
            "gear-cuda/ci/install-nvrtc.sh failed ({}); set GEAR_NVRTC_DIR to an NVRTC 13 library directory",
            out.status
        );
    }
    let dir = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    if !dir.join("libnvrtc.so.13").exists() {
        bail!("install-nvrtc.sh printed {}, which has no libnvrtc.so.13", dir.display());
    }
    Ok(dir)
}

/// gear-rdma's build environment (cmake and libclang from
/// `gear-rdma/ci/install-build-deps.sh`, as `.ci/run` installs them), as
/// the variables to set, or why it is not there.
fn rdma_build_env(root: &Path) -> std::result::Result<Vec<(String, String)>, String> {
    let script = r#"build_env="$(bash gear-rdma/ci/install-build-deps.sh)" && eval "$build_env" && \
        printf '%s\0' "PATH=$PATH" "LIBCLANG_PATH=${LIBCLANG_PATH:-}" "BINDGEN_EXTRA_CLANG_ARGS=${BINDGEN_EXTRA_CLANG_ARGS:-}""#;
    let out = Command::new("bash")
        .current_dir(root)
        .args(["-c", script])
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| format!("running install-build-deps.sh: {e}"))?;
    if !out.status.success() {
        return Err(format!("install-build-deps.sh failed ({})", out.status));
    }
    Ok(parse_env(&out.stdout))
}

/// NUL-separated `KEY=VALUE` entries (empty values dropped).
fn parse_env(bytes: &[u8]) -> Vec<(String, String)> {
    bytes
        .split(|&b| b == 0)
        .filter_map(|e| std::str::from_utf8(e).ok()?.split_once('='))
        .filter(|(_, v)| !v.is_empty())
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

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
    let nvrtc = vec![("GEAR_NVRTC_DIR".to_owned(), nvrtc_dir(&root)?.display().to_string())];
    let build = |krate: &str, args: &[&str], role: &'static str| cargo_executables(&root, krate, args, role, &nvrtc);

    let mut tests = build("gear-cuda", &["test", "-p", "gear-cuda", "--release", "--no-run"], "test")?;
    if tests.is_empty() {
        bail!("cargo reported no gear-cuda test executables");
    }
    let api_args = ["test", "-p", "gear-api", "--features", "cuda", "--release", "--test", "cuda", "--no-run"];
    let api = build("gear-api", &api_args, "test")?;
    if api.is_empty() {
        bail!("cargo reported no executable for gear-api's cuda test");
    }
    tests.extend(api.into_iter().map(|a| Artifact { name: format!("gear_api_{}", a.name), ..a }));
    // The conformance suite, with the CUDA sampler among its backends.
    let conformance_args =
        ["test", "-p", "tests", "--features", "cuda", "--release", "--test", "conformance", "--no-run"];
    let conformance = build("tests", &conformance_args, "test")?;
    if conformance.is_empty() {
        bail!("cargo reported no executable for the conformance suite");
    }
    tests.extend(conformance.into_iter().map(|a| Artifact { name: format!("tests_{}", a.name), ..a }));
    let bench = build("gear-cuda", &["bench", "-p", "gear-cuda", "--no-run"], "bench")?;
    let mut examples =
        build("gear-cuda", &["build", "-p", "gear-cuda", "--release", "--example", "cuda_bench"], "example")?;
    let gear =
        build("gear-cli", &["build", "-p", "gear-cli", "--features", "cuda", "--release", "--bin", "gear"], "bin")?;
    if gear.len() != 1 {
        bail!("cargo reported {} `gear` executables, expected 1", gear.len());
    }
    // rdma_loopback needs sideway's build (cmake, libclang); without it the
    // package says so and run.sh reports the step unavailable.
    let rdma_args = ["build", "-p", "gear-rdma", "--features", "rdma", "--release", "--example", "rdma_loopback"];
    match rdma_build_env(&root)
        .and_then(|env| cargo_executables(&root, "gear-rdma", &rdma_args, "example", &env).map_err(|e| e.to_string()))
    {
        Ok(rdma) => examples.extend(rdma),
        Err(e) => eprintln!("gpu-test: rdma_loopback not packed: {e}"),
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
    let commit = commit_of(&root);
    std::fs::write(&script, run_script(&tests, &bench, &format!("{}.{}", glibc.0, glibc.1), &commit))?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755))?;
    }
    let names: Vec<&str> = tests.iter().chain(&bench).chain(&examples).chain(&gear).map(|a| a.name.as_str()).collect();
    let bytes = folder_bytes(&out)?;
    println!(
        "gpu-test: wrote {} ({bytes} bytes, commit {commit}, needs glibc >= {}.{}: {})",
        out.display(),
        glibc.0,
        glibc.1,
        names.join(", ")
    );
    check_size(bytes)?;

    let run_now = opts.run.unwrap_or_else(gpu_present);
    if !run_now {
        println!(
            "gpu-test: no GPU here (or --build-only); copy {} to a GPU machine and run ./run.sh (it writes one \
             report file)",
            out.display()
        );
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

    fn artifact(name: &str, role: &'static str) -> Artifact {
        Artifact { name: name.into(), role, path: PathBuf::new() }
    }

    #[test]
    fn script_lists_the_package_and_every_step() {
        let s = run_script(&[artifact("device", "test")], &[artifact("cuda_gather", "bench")], "2.34", "abc123");
        assert!(s.contains("tests=(device)") && s.contains("benches=(cuda_gather)"));
        assert!(s.contains("glibc=\"2.34\"") && s.contains("commit=\"abc123\""));
        for p in ["@TESTS@", "@BENCHES@", "@COMMIT@", "@GLIBC@"] {
            assert!(!s.contains(p), "{p} is filled");
        }
        for step in ["do_tests", "do_sanitize", "do_soak", "do_bench", "do_train", "do_rdma"] {
            assert!(s.contains(step), "{step}");
        }
    }

    /// A fake package: `bin/` scripts standing in for the binaries, each
    /// printing how it was called (and the GEAR_REQUIRE_GPU it saw);
    /// `failing` exits 1.
    fn fake_package(dir: &Path, tests: &[&str], failing: &str) -> PathBuf {
        let bin = dir.join("bin");
        std::fs::create_dir_all(&bin).unwrap();
        let fake = |name: &str, code: i32| {
            let body = format!(
                "#!/usr/bin/env bash\necho \"fake {name} $* GEAR_REQUIRE_GPU=${{GEAR_REQUIRE_GPU:-}}\"\nexit {code}\n"
            );
            let path = bin.join(name);
            std::fs::write(&path, body).unwrap();
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        };
        for t in tests {
            fake(t, i32::from(*t == failing));
        }
        for b in ["gear", "cuda_bench", "cuda_gather"] {
            fake(b, 0);
        }
        let arts: Vec<Artifact> = tests.iter().map(|t| artifact(t, "test")).collect();
        let script = dir.join("run.sh");
        std::fs::write(&script, run_script(&arts, &[artifact("cuda_gather", "bench")], "2.34", "c0ffee")).unwrap();
        script
    }

    /// `run.sh`'s logic, run here with fake binaries: every step runs or is
    /// reported unavailable with its reason, a failing binary fails the
    /// run, and everything lands in the one report file.
    #[test]
    fn run_sh_runs_every_step_and_writes_one_report() {
        let dir = std::env::temp_dir().join(format!("gear-run-sh-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let tests = ["gear_cuda_unit", "device", "gear_api_cuda", "tests_conformance"];
        let script = fake_package(&dir, &tests, "tests_conformance");
        let report = dir.join("report.txt");
        let sanitizer = dir.join("bin/fake-sanitizer");
        std::fs::write(&sanitizer, "#!/usr/bin/env bash\necho \"sanitizer $*\"\nexec \"${@: -2:1}\" \"${@: -1}\"\n")
            .unwrap();
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&sanitizer, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        let run = |args: &[&str], env: &[(&str, &str)]| {
            let out = Command::new("bash")
                .arg(&script)
                .args(args)
                .env("GEAR_REPORT", &report)
                .env("GEAR_SOAK_SECONDS", "1")
                .envs(env.iter().copied())
                .output()
                .unwrap();
            (out.status.code(), std::fs::read_to_string(&report).unwrap_or_default())
        };
        let (code, text) = run(&["all"], &[("COMPUTE_SANITIZER", sanitizer.to_str().unwrap())]);
        assert_eq!(code, Some(1), "a failing test fails the run:\n{text}");
        for want in [
            "built from commit c0ffee",
            "fake device --test-threads=1 GEAR_REQUIRE_GPU=1",
            "PASS         test device",
            "FAIL         test tests_conformance",
            "sanitizer --tool memcheck --error-exitcode 99",
            "PASS         compute-sanitizer racecheck gear_api_cuda",
            "fake gear device-soak --backend cuda --seconds 1",
            "PASS         soak 1s",
            "fake gear bench --backend cuda --batch 1024 --batches 200",
            "fake cuda_gather --bench",
            "fake gear train-bench --backend cuda",
            "UNAVAILABLE  rdma_loopback (not in the package",
            "run.sh: FAILED",
        ] {
            assert!(text.contains(want), "report lacks `{want}`:\n{text}");
        }
        // One step alone, on the CPU device, passing.
        let (code, text) = run(&["soak", "2"], &[("GEAR_GPU_BACKEND", "cpu-device")]);
        assert_eq!(code, Some(0), "{text}");
        assert!(text.contains("fake gear device-soak --backend cpu-device --seconds 2") && text.contains("all passed"));
        // Without a compute-sanitizer the sanitizer steps say so.
        let no_cs = !Path::new("/usr/local/cuda/bin/compute-sanitizer").exists()
            && !Command::new("bash").args(["-c", "command -v compute-sanitizer"]).status().unwrap().success();
        if no_cs {
            let (code, text) = run(&["sanitize"], &[]);
            assert_eq!(code, Some(0), "{text}");
            assert!(text.contains("UNAVAILABLE  compute-sanitizer memcheck device (no compute-sanitizer"), "{text}");
        }
        // A spent budget: the steps after it are listed, not run.
        let slow = dir.join("bin/cuda_bench");
        std::fs::write(&slow, "#!/usr/bin/env bash\nexec sleep 30\n").unwrap();
        let (code, text) = run(&["bench"], &[("GEAR_BUDGET_SECONDS", "7")]);
        assert_eq!(code, Some(1), "{text}");
        assert!(text.contains("FAIL         cuda_bench") && text.contains("timed out after"), "{text}");
        assert!(
            text.contains("NOT RUN      gear bench --backend cuda --batch 32 (GEAR_BUDGET_SECONDS=7 spent)"),
            "{text}"
        );
        assert!(text.contains("NOT RUN      criterion cuda_gather"), "{text}");
        let (code, _) = run(&["nonsense"], &[]);
        assert_eq!(code, Some(2));
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn environments_are_read_from_nul_separated_entries() {
        let env = parse_env(b"PATH=/a:/b\0LIBCLANG_PATH=\0BINDGEN_EXTRA_CLANG_ARGS=-I/x y\0");
        assert_eq!(env, [("PATH".into(), "/a:/b".into()), ("BINDGEN_EXTRA_CLANG_ARGS".into(), "-I/x y".into())]);
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
