//! `gear serve` checkpoints (on SIGUSR1, on a schedule, at shutdown) and
//! restores; `gear bench --checkpoint` prints its figures. Every wait has a
//! deadline; a failing test kills the server it started.

use gear_api::{AttachOptions, ReplayTable, SampleConfig, StepValue};
use gear_core::{ColumnSpec, DType, TableSpec, WindowSpec};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn temp_dir(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("gear-cli-persist-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn config(dir: &Path, name: &str) -> PathBuf {
    let path = dir.join(format!("{name}.toml"));
    let text = format!(
        "name = \"{name}-{}\"\nmax_len = 4\ncapacity = 8\n[[columns]]\nname = \"x\"\ndtype = \"f32\"\nshape = [2]\n",
        std::process::id()
    );
    std::fs::write(&path, text).unwrap();
    path
}

fn spec() -> TableSpec {
    TableSpec::new(vec![ColumnSpec::new("x", DType::F32, vec![2])], 4, 8).unwrap()
}

/// Starts `gear serve ARGS`; returns it and a channel of its stderr lines.
fn serve(args: &[&str]) -> (Server, std::sync::mpsc::Receiver<String>) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_gear"))
        .arg("serve")
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let err = child.stderr.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(err).lines().map_while(|l| l.ok()) {
            let _ = tx.send(line);
        }
    });
    let out = child.stdout.take().unwrap();
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines().map_while(|l| l.ok()) {
            if line.starts_with("serving") {
                let _ = ready_tx.send(());
            }
        }
    });
    let server = Server(child);
    ready_rx.recv_timeout(Duration::from_secs(30)).expect("gear serve started");
    (server, rx)
}

fn wait_for(lines: &std::sync::mpsc::Receiver<String>, word: &str) -> String {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        let line = lines.recv_timeout(left).unwrap_or_else(|_| panic!("gear serve never printed {word}"));
        if line.contains(word) {
            return line;
        }
    }
}

fn checkpoints_in(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> =
        std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    names.sort();
    names
}

#[test]
fn serve_checkpoints_on_sigusr1_and_at_shutdown_and_restores_them() {
    let dir = temp_dir("signal");
    let ckpts = dir.join("ckpts");
    let cfg = config(&dir, "gear-cli-ckpt-a");
    let name = format!("gear-cli-ckpt-a-{}", std::process::id());
    let (mut server, lines) =
        serve(&["--config", cfg.to_str().unwrap(), "--checkpoint-dir", ckpts.to_str().unwrap(), "--seconds", "60"]);
    let table = ReplayTable::attach(&name, AttachOptions::default()).unwrap();
    let writer = table.writer();
    for i in 0..3 {
        let mut t = writer.begin(None).unwrap();
        t.append_step(&[StepValue::typed(&[i as f32, 1.0])]).unwrap();
        t.end().unwrap();
    }
    drop((writer, table));
    // SAFETY: kill() with a pid of a child this test started.
    assert_eq!(unsafe { libc::kill(server.0.id() as libc::pid_t, libc::SIGUSR1) }, 0);
    let line = wait_for(&lines, "checkpoint");
    assert!(line.contains("3 trajectories"), "{line}");
    // SAFETY: as above.
    assert_eq!(unsafe { libc::kill(server.0.id() as libc::pid_t, libc::SIGTERM) }, 0);
    assert!(server.0.wait().unwrap().success());
    assert_eq!(checkpoints_in(&ckpts).len(), 2, "one on SIGUSR1, one at shutdown");
    let restored = ReplayTable::builder(spec()).restore(&ckpts).unwrap();
    assert_eq!(restored.info().unwrap().size, 3);
    let mut sampler = restored.sampler(SampleConfig::new(3, WindowSpec::last(1))).unwrap();
    let xs: &[f32] = sampler.sample().unwrap().column("x").unwrap().as_slice().unwrap();
    assert!(xs.chunks(2).all(|p| p[1] == 1.0 && p[0] < 3.0));
    // `gear serve --restore` starts from it.
    let cfg_b = config(&dir, "gear-cli-ckpt-b");
    let (mut again, lines) = serve(&["--config", cfg_b.to_str().unwrap(), "--restore", ckpts.to_str().unwrap()]);
    let line = wait_for(&lines, "size");
    assert!(line.contains("size 3/8"), "{line}");
    // SAFETY: as above.
    assert_eq!(unsafe { libc::kill(again.0.id() as libc::pid_t, libc::SIGTERM) }, 0);
    assert!(again.0.wait().unwrap().success());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn serve_checkpoints_on_a_schedule_keeping_the_newest() {
    let dir = temp_dir("schedule");
    let ckpts = dir.join("ckpts");
    let cfg = config(&dir, "gear-cli-ckpt-c");
    let out = Command::new(env!("CARGO_BIN_EXE_gear"))
        .args(["serve", "--config", cfg.to_str().unwrap(), "--checkpoint-dir", ckpts.to_str().unwrap()])
        .args(["--checkpoint-every", "0.2", "--keep", "2", "--seconds", "1.2"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.matches("checkpoint ").count() >= 3, "{err}");
    let names = checkpoints_in(&ckpts);
    assert_eq!(names.len(), 2, "{names:?}");
    let bad = Command::new(env!("CARGO_BIN_EXE_gear"))
        .args(["serve", "--config", cfg.to_str().unwrap(), "--restore", cfg.to_str().unwrap(), "--seconds", "0.2"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&bad.stderr);
    assert!(!bad.status.success() && err.contains("not a GEAR checkpoint"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn bench_checkpoint_prints_both_ratios() {
    let out = Command::new(env!("CARGO_BIN_EXE_gear"))
        .args(["bench", "--checkpoint", "--json", "--capacity", "16", "--steps", "8", "--step-bytes", "512"])
        .args(["--rounds", "1"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_str(String::from_utf8_lossy(&out.stdout).trim()).unwrap();
    for k in ["checkpoint_gb_per_s", "plain_write_gb_per_s", "restore_gb_per_s", "plain_read_gb_per_s"] {
        assert!(v[k].as_f64().is_some_and(|x| x > 0.0), "{k} in {v}");
    }
    assert_eq!(v["trajectories"], 16);
}

#[test]
fn serve_removes_temporary_files_of_dead_writers_at_startup() {
    let dir = temp_dir("stale");
    let ckpts = dir.join("ckpts");
    std::fs::create_dir_all(&ckpts).unwrap();
    // What `gear serve` processes killed mid-checkpoint leave behind, and
    // files that are not theirs.
    for name in ["checkpoint-0000000001.gear.tmp.4242.0", "checkpoint-0000000002.gear.tmp.77"] {
        std::fs::write(ckpts.join(name), b"partial").unwrap();
    }
    std::fs::write(ckpts.join("notes.txt.tmp.1.0"), b"keep").unwrap();
    let cfg = config(&dir, "gear-cli-ckpt-d");
    let out = Command::new(env!("CARGO_BIN_EXE_gear"))
        .args(["serve", "--config", cfg.to_str().unwrap(), "--checkpoint-dir", ckpts.to_str().unwrap()])
        .args(["--seconds", "0.3"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("removed 2 temporary files"), "{err}");
    // The checkpoint at shutdown, and the file that was not a writer's.
    assert_eq!(checkpoints_in(&ckpts), ["checkpoint-0000000001.gear", "notes.txt.tmp.1.0"]);
    std::fs::remove_dir_all(&dir).unwrap();
}
