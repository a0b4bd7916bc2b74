//! Ctrl-C and SIGTERM leave nothing in /dev/shm: `gear demo`, `gear bench`
//! and `gear serve` run as real processes, get each signal the way a user
//! sends it (SIGINT to the whole process group, as a terminal's Ctrl-C
//! does; SIGTERM to the process alone, as `kill` does), and /dev/shm is
//! listed after they exit.

use std::io::Read;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const SHM: &str = "/dev/shm";

/// Starts `gear ARGS` in a process group of its own (as a shell's job).
fn start(args: &[&str]) -> Child {
    Command::new(env!("CARGO_BIN_EXE_gear"))
        .args(args)
        .process_group(0)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Waits for `path` to exist (60 s at most: debug builds on a loaded
/// machine are slow to fill a table).
fn wait_for(path: &Path, child: &mut Child) {
    let start = Instant::now();
    while !path.exists() {
        if let Some(status) = child.try_wait().unwrap() {
            panic!("gear exited ({status}) before {} appeared: {}", path.display(), output(child).1);
        }
        assert!(start.elapsed() < Duration::from_secs(60), "{} never appeared", path.display());
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[derive(Clone, Copy, Debug)]
enum Signal {
    /// SIGINT to the process group (a terminal's Ctrl-C).
    CtrlC,
    /// SIGTERM to the process.
    Term,
}

fn send(child: &Child, signal: Signal) {
    let pid = child.id() as libc::pid_t;
    // SAFETY: kill(2) on our child (its group has its pid as id).
    let rc = unsafe {
        match signal {
            Signal::CtrlC => libc::kill(-pid, libc::SIGINT),
            Signal::Term => libc::kill(pid, libc::SIGTERM),
        }
    };
    assert_eq!(rc, 0);
}

/// Waits for the child to exit (60 s at most), then returns stdout and
/// stderr.
fn finish(child: &mut Child) -> (String, String) {
    let start = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            panic!("gear did not exit within 60 s of the signal: {}", output(child).1);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    output(child)
}

fn output(child: &mut Child) -> (String, String) {
    let (mut out, mut err) = (String::new(), String::new());
    if let Some(mut o) = child.stdout.take() {
        let _ = o.read_to_string(&mut out);
    }
    if let Some(mut e) = child.stderr.take() {
        let _ = e.read_to_string(&mut err);
    }
    (out, err)
}

/// The /dev/shm entries whose names start with `prefix`.
fn left_in_shm(prefix: &str) -> Vec<String> {
    std::fs::read_dir(SHM)
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.starts_with(prefix))
        .collect()
}

/// No process of the child's group is left (actors, trainers, writers).
fn group_gone(child: &Child) {
    let start = Instant::now();
    // SAFETY: kill with signal 0 only checks whether the group exists.
    while unsafe { libc::kill(-(child.id() as libc::pid_t), 0) } == 0 {
        assert!(start.elapsed() < Duration::from_secs(10), "processes of gear's group are still running");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn demo_leaves_nothing_in_shm_and_prints_its_summary_on_ctrl_c_and_sigterm() {
    for signal in [Signal::CtrlC, Signal::Term] {
        let mut child = start(&["demo", "--seconds", "120", "--capacity", "64", "--actors", "2"]);
        let table = format!("gear-demo-{}", child.id());
        wait_for(&Path::new(SHM).join(&table), &mut child);
        // Let the children attach and start writing.
        std::thread::sleep(Duration::from_millis(1500));
        send(&child, signal);
        let (out, err) = finish(&mut child);
        group_gone(&child);
        assert_eq!(left_in_shm(&table), Vec::<String>::new(), "{signal:?} left the demo's table in /dev/shm");
        // The summary, on lines of its own, says the run was cut short.
        assert!(
            out.lines().any(|l| l.starts_with("gear demo summary (") && l.ends_with("stopped by a signal)")),
            "{signal:?}: no summary in\n{out}\n{err}"
        );
        assert!(out.lines().any(|l| l.starts_with("  total")), "{out}");
    }
}

#[test]
fn bench_with_writer_processes_leaves_nothing_in_shm() {
    for signal in [Signal::CtrlC, Signal::Term] {
        // Far more inserts than the test waits for: the signal comes mid-run.
        let mut child = start(&[
            "bench",
            "--writers",
            "2",
            "--steps",
            "8",
            "--step-bytes",
            "4096",
            "--capacity",
            "64",
            "--inserts",
            "100000000",
            "--batches",
            "100000000",
            "--batch",
            "4",
        ]);
        let table = format!("gear-bench-{}", child.id());
        wait_for(&Path::new(SHM).join(&table), &mut child);
        std::thread::sleep(Duration::from_millis(1500));
        send(&child, signal);
        finish(&mut child);
        group_gone(&child);
        assert_eq!(left_in_shm(&table), Vec::<String>::new(), "{signal:?} left the bench's table in /dev/shm");
    }
}

/// `gear device-soak` (on gear-device's CPU device) ends at the first
/// signal with its writers and its table file gone (both were left behind
/// before: a soak killed by `timeout` kept its 35 MB table).
#[test]
fn device_soak_leaves_nothing_in_shm() {
    if gear_device::CpuDevice::new().is_err() {
        assert!(std::env::var("GEAR_REQUIRE_CXX").map_or(true, |v| v != "1"), "GEAR_REQUIRE_CXX=1: no CPU device");
        println!("skipped: the CPU device has no kernels (no C++ compiler at build time)");
        return;
    }
    for signal in [Signal::CtrlC, Signal::Term] {
        let mut child = start(&[
            "device-soak",
            "--backend",
            "cpu-device",
            "--seconds",
            "600",
            "--writers",
            "2",
            "--capacity",
            "256",
            "--max-len",
            "8",
            "--obs-bytes",
            "32",
            "--batch",
            "8",
            "--window",
            "4",
        ]);
        let table = format!("gear-device-soak-{}", child.id());
        wait_for(&Path::new(SHM).join(&table), &mut child);
        std::thread::sleep(Duration::from_millis(1500));
        send(&child, signal);
        finish(&mut child);
        group_gone(&child);
        assert_eq!(left_in_shm(&table), Vec::<String>::new(), "{signal:?} left the soak's table in /dev/shm");
    }
}

#[test]
fn serve_leaves_nothing_in_shm_on_ctrl_c_sigterm_and_a_second_signal() {
    let dir = std::env::temp_dir().join(format!("gear-signals-serve-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for (i, signals) in [vec![Signal::CtrlC], vec![Signal::Term], vec![Signal::Term, Signal::CtrlC]].iter().enumerate()
    {
        let name = format!("gear-signals-serve-{}-{i}", std::process::id());
        let config = dir.join(format!("{i}.toml"));
        std::fs::write(
            &config,
            format!("name = \"{name}\"\nmax_len = 8\ncapacity = 64\n[[columns]]\nname = \"x\"\ndtype = \"f32\"\n"),
        )
        .unwrap();
        // With a checkpoint at shutdown, so that a second signal can come
        // while the server is still stopping.
        let ckpts = dir.join(format!("ckpt{i}"));
        let mut child =
            start(&["serve", "--config", config.to_str().unwrap(), "--checkpoint-dir", ckpts.to_str().unwrap()]);
        wait_for(&Path::new(SHM).join(&name), &mut child);
        for &s in signals {
            send(&child, s);
        }
        let (out, err) = finish(&mut child);
        assert_eq!(left_in_shm(&name), Vec::<String>::new(), "{signals:?} left the served table: {out} {err}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
