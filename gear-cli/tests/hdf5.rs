//! `gear import` and `gear export` as a user runs them: into a new table
//! kept as a checkpoint, into a served table, back out, and refused
//! arguments (clear errors, exit code 1 or 2, never a panic).

use hdf5_pure::{EnumTypeBuilder, File, FileBuilder};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

#[path = "../../gear-api/tests/common/not_regular.rs"]
mod not_regular;
use not_regular::null_device;

fn gear(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_gear")).args(args).output().unwrap();
    let (o, e) = (String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned());
    assert!(!e.contains("panicked"), "gear {args:?} panicked: {e}");
    (out.status.code().unwrap_or(-1), o, e)
}

struct Dir(PathBuf);
impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn dir(tag: &str) -> Dir {
    let d = std::env::temp_dir().join(format!("gear-cli-hdf5-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    Dir(d)
}

/// A D4RL file of 100 steps: five 20-step episodes ending in timeouts.
fn d4rl(path: &Path) {
    let n = 100u64;
    let b = EnumTypeBuilder::with_base(hdf5_pure::make_i8_type()).value("FALSE", 0).value("TRUE", 1).build().unwrap();
    let mut fb = FileBuilder::new();
    let obs: Vec<f32> = (0..n * 4).map(|i| i as f32 * 0.5).collect();
    fb.create_dataset("observations").with_f32_data(&obs).with_shape(&[n, 4]).with_chunks(&[32, 4]).with_deflate(6);
    fb.create_dataset("actions")
        .with_f32_data(&(0..n * 2).map(|i| -(i as f32)).collect::<Vec<_>>())
        .with_shape(&[n, 2]);
    fb.create_dataset("rewards").with_f32_data(&(0..n).map(|i| (i % 3) as f32).collect::<Vec<_>>());
    fb.create_dataset("terminals").with_raw_data(b.clone(), vec![0; n as usize], n);
    fb.create_dataset("timeouts").with_raw_data(b, (0..n).map(|i| u8::from(i % 20 == 19)).collect(), n);
    fb.write(path).unwrap();
}

fn config(dir: &Path, obs_dtype: &str) -> PathBuf {
    let path = dir.join(format!("table-{obs_dtype}.toml"));
    let mut text = format!(
        "name = \"gear-h5-{}-{obs_dtype}\"\ndir = \"{}\"\nmax_len = 20\ncapacity = 10\n",
        std::process::id(),
        dir.display()
    );
    for (name, dtype, shape) in [
        ("observations", obs_dtype, "[4]"),
        ("actions", "f32", "[2]"),
        ("rewards", "f32", "[]"),
        ("terminals", "bool", "[]"),
        ("timeouts", "bool", "[]"),
    ] {
        text += &format!("[[columns]]\nname = \"{name}\"\ndtype = \"{dtype}\"\nshape = {shape}\n");
    }
    std::fs::write(&path, text).unwrap();
    path
}

fn assert_same(a: &Path, b: &Path) {
    let (fa, fb) = (File::open(a).unwrap(), File::open(b).unwrap());
    let mut names = fa.root().datasets().unwrap();
    names.sort();
    let mut other = fb.root().datasets().unwrap();
    other.sort();
    assert_eq!(names, other);
    for n in names {
        let (x, y) = (fa.dataset(&n).unwrap(), fb.dataset(&n).unwrap());
        assert_eq!(x.datatype().unwrap(), y.datatype().unwrap(), "{n}");
        assert_eq!(x.shape().unwrap(), y.shape().unwrap(), "{n}");
        assert_eq!(x.read_raw().unwrap(), y.read_raw().unwrap(), "{n}");
    }
}

#[test]
fn import_to_a_checkpoint_and_export_it() {
    let d = dir("ckpt");
    let (src, cfg, ck, out) = (d.0.join("d4rl.hdf5"), config(&d.0, "f32"), d.0.join("t.ckpt"), d.0.join("out.hdf5"));
    d4rl(&src);
    let (s, c, k, o) = (src.to_str().unwrap(), cfg.to_str().unwrap(), ck.to_str().unwrap(), out.to_str().unwrap());
    // No served table and no checkpoint: the import would be lost.
    let (code, _, err) = gear(&["import", "--hdf5", s, "--config", c]);
    assert_eq!(code, 1);
    assert!(err.contains("no process serves table") && err.contains("--checkpoint"), "{err}");
    let (code, out_text, err) = gear(&["import", "--hdf5", s, "--config", c, "--checkpoint", k]);
    assert_eq!(code, 0, "{err}");
    assert!(out_text.contains("5 episodes -> 5 trajectories"), "{out_text}");
    assert!(out_text.contains("checkpoint"), "{out_text}");
    let (code, text, err) = gear(&["export", "--hdf5", o, "--config", c, "--checkpoint", k, "--deflate", "4"]);
    assert_eq!(code, 0, "{err}");
    assert!(text.contains("exported 5 trajectories"), "{text}");
    assert_same(&src, &out);
}

#[test]
fn import_into_a_served_table_and_export_it() {
    let d = dir("served");
    let (src, cfg, out) = (d.0.join("d4rl.hdf5"), config(&d.0, "f32"), d.0.join("out.hdf5"));
    d4rl(&src);
    let mut child = Command::new(env!("CARGO_BIN_EXE_gear"))
        .args(["serve", "--config", cfg.to_str().unwrap(), "--seconds", "60"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(|l| l.ok()) {
            if line.starts_with("serving") {
                let _ = tx.send(());
            }
        }
    });
    let ready = rx.recv_timeout(Duration::from_secs(30));
    let result = std::panic::catch_unwind(|| {
        ready.expect("gear serve started");
        let (code, text, err) = gear(&["import", "--hdf5", src.to_str().unwrap(), "--config", cfg.to_str().unwrap()]);
        assert_eq!(code, 0, "{err}");
        assert!(text.contains("served table"), "{text}");
        let (code, _, err) = gear(&["export", "--hdf5", out.to_str().unwrap(), "--config", cfg.to_str().unwrap()]);
        assert_eq!(code, 0, "{err}");
        assert_same(&src, &out);
    });
    let _ = child.kill();
    let _ = child.wait();
    if let Err(p) = result {
        std::panic::resume_unwind(p);
    }
}

#[test]
fn absurd_arguments_are_clear_errors() {
    let d = dir("errors");
    let (src, cfg, ck) = (d.0.join("d4rl.hdf5"), config(&d.0, "f32"), d.0.join("t.ckpt"));
    d4rl(&src);
    let (s, c, k) = (src.to_str().unwrap(), cfg.to_str().unwrap(), ck.to_str().unwrap());
    let text = d.0.join("notes.txt");
    std::fs::write(&text, "not hdf5").unwrap();
    let i32_cfg = config(&d.0, "i32");
    let cases: Vec<(Vec<&str>, i32, &str)> = vec![
        (vec!["import", "--hdf5", "/nonexistent/x.hdf5", "--config", c, "--checkpoint", k], 1, "no such file"),
        (vec!["import", "--hdf5", text.to_str().unwrap(), "--config", c, "--checkpoint", k], 1, "not an HDF5 file"),
        (
            vec!["import", "--hdf5", s, "--config", c, "--checkpoint", k, "--layout", "minari"],
            1,
            "not the Minari layout",
        ),
        (vec!["import", "--hdf5", s, "--config", c, "--checkpoint", k, "--layout", "hdf4"], 2, "invalid value"),
        (vec!["import", "--hdf5", s, "--config", c, "--checkpoint", k, "--map", "rewards"], 1, "not DATASET=COLUMN"),
        (
            vec!["import", "--hdf5", s, "--config", c, "--checkpoint", k, "--map", "rewards=reward"],
            1,
            "names column `reward`",
        ),
        (
            vec!["import", "--hdf5", s, "--config", i32_cfg.to_str().unwrap(), "--checkpoint", k],
            1,
            "dataset `observations` has dtype f32, column `observations` is i32",
        ),
        (vec!["import", "--hdf5", s, "--config", "/nonexistent.toml", "--checkpoint", k], 1, "nonexistent.toml"),
        (vec!["import", "--hdf5", s], 2, "--config"),
        (vec!["export", "--hdf5", "out.hdf5", "--checkpoint", k], 2, "--config"),
        (
            vec!["export", "--hdf5", "out.hdf5", "--config", c, "--checkpoint", "/nonexistent.ckpt"],
            1,
            "nonexistent.ckpt",
        ),
        (vec!["export", "--hdf5", "out.hdf5", "--table", "no-such-table-h5"], 1, "no-such-table-h5"),
    ];
    for (args, want, needle) in cases {
        let (code, _, err) = gear(&args);
        assert_eq!(code, want, "gear {args:?}: {err}");
        assert!(err.contains(needle), "gear {args:?} should say `{needle}`: {err}");
    }
    // Nothing was written by the refused imports.
    assert!(!ck.exists());
}

/// `--checkpoint /dev/null` (a new user's way to say "don't keep it") and
/// other targets that are not regular files are refused before the
/// import; `--no-checkpoint` is the way to keep nothing. `gear export`
/// refuses such `--hdf5` targets too.
#[test]
fn outputs_that_are_not_regular_files_are_refused_before_any_work() {
    use std::os::unix::fs::FileTypeExt;
    let d = dir("targets");
    let (src, cfg) = (d.0.join("d4rl.hdf5"), config(&d.0, "f32"));
    d4rl(&src);
    let (s, c) = (src.to_str().unwrap(), cfg.to_str().unwrap());
    let fifo = d.0.join("a-fifo");
    let cf = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: `cf` is a valid NUL-terminated path for the call.
    assert_eq!(unsafe { libc::mkfifo(cf.as_ptr(), 0o600) }, 0);
    let subdir = d.0.join("a-directory");
    std::fs::create_dir(&subdir).unwrap();
    let mut targets = vec![(fifo.clone(), "is a FIFO"), (subdir.clone(), "is a directory")];
    if let Some(null) = null_device(&d.0) {
        targets.push((null, "is a character device, not a regular file"));
    }
    for (target, word) in &targets {
        let t = target.to_str().unwrap();
        let (code, out, err) = gear(&["import", "--hdf5", s, "--config", c, "--checkpoint", t]);
        assert_eq!(code, 1, "{err}");
        assert!(err.contains(word) && err.contains("--checkpoint"), "{err}");
        assert!(!out.contains("imported"), "refused before the import: {out}");
        let (code, _, err) = gear(&["export", "--hdf5", t, "--config", c, "--checkpoint", "/nonexistent.ckpt"]);
        assert_eq!(code, 1, "{err}");
        assert!(err.contains(word) && err.contains("--hdf5"), "{err}");
    }
    for (target, _) in &targets {
        let kind = std::fs::symlink_metadata(target).unwrap().file_type();
        assert!(kind.is_fifo() || kind.is_dir() || kind.is_char_device(), "{} was replaced", target.display());
    }
    // Keeping nothing, said plainly.
    let (code, out, err) = gear(&["import", "--hdf5", s, "--config", c, "--no-checkpoint"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("kept nowhere") && out.contains("5 episodes -> 5 trajectories"), "{out}");
    let (code, _, err) = gear(&["import", "--hdf5", s, "--config", c, "--no-checkpoint", "--checkpoint", "x.ckpt"]);
    assert_eq!(code, 2, "{err}");
}
