//! Checkpoints and processes: a checkpointing child killed or stopped
//! mid-write, a large table restored while its pages fault in, and a
//! checkpoint taken while writer processes and a sampler run.

use super::{names_in, obs_byte, pattern_spec, temp_dir, write_pattern, ARG, OBS, ROLE};
use gear_api::{latest_checkpoint, ReplayTable, SampleConfig};
use gear_core::{RandomSource, WindowSpec, Xoshiro256};
use gear_sampler::{StrategyKind, StrategyParams};
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Reads every stored trajectory once (a FIFO sampler over the whole
/// table) and checks each row's bytes against its pattern. Returns the
/// rows checked.
fn check_every_row(table: &ReplayTable) -> u64 {
    let size = table.info().unwrap().size;
    assert!(size > 0);
    let mut sampler = table.sampler(SampleConfig::new(size as usize, WindowSpec::first(16))).unwrap();
    let b = sampler.sample().unwrap();
    let ids: &[i64] = b.column("id").unwrap().as_slice().unwrap();
    let obs: &[u8] = b.column("obs").unwrap().as_slice().unwrap();
    let mut keys = b.keys().to_vec();
    keys.sort();
    keys.dedup();
    assert_eq!(keys.len() as u64, size, "a FIFO batch of the table's size reads every row once");
    for (r, &len) in b.lengths().iter().enumerate() {
        let id = ids[r * 16];
        for s in 0..16 {
            let real = s < len as usize;
            assert_eq!(ids[r * 16 + s], if real { id } else { 0 }, "row {r} step {s}");
            for i in 0..OBS {
                let want = if real { obs_byte(id, s as u64, i) } else { 0 };
                assert_eq!(obs[(r * 16 + s) * OBS + i], want, "row {r} (id {id}) step {s} byte {i}");
            }
        }
    }
    size
}

fn restore_fifo(path: &Path, capacity: u64) -> gear_api::Result<ReplayTable> {
    ReplayTable::builder(pattern_spec(capacity))
        .sampler_kind(StrategyKind::Fifo, StrategyParams::default())
        .restore(path)
}

/// A child process that is killed when dropped, so a failing test leaves
/// no child running.
struct ChildGuard(Child);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn spawn(role: &str, arg: &str) -> ChildGuard {
    ChildGuard(
        Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "child_entry", "--nocapture", "--test-threads=1"])
            .env(ROLE, role)
            .env(ARG, arg)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap(),
    )
}

/// Waits (30 s at most) for a line holding `word` on the child's
/// stdout.
fn wait_line(child: &mut Child, word: &'static str) {
    let out = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines() {
            let Ok(line) = line else { break };
            if line.contains(word) {
                let _ = tx.send(());
            }
        }
    });
    rx.recv_timeout(Duration::from_secs(30)).unwrap_or_else(|_| panic!("child never said {word}"));
}

#[test]
fn sigkill_while_checkpointing_leaves_the_previous_checkpoint_loadable() {
    let dir = temp_dir("sigkill");
    let arg = dir.to_str().unwrap().to_owned();
    let mut rng = Xoshiro256::seed_from_u64(23);
    let mut saw_partial = false;
    for round in 0..8 {
        let mut child = spawn("checkpointer", &arg);
        wait_line(&mut child.0, "first");
        std::thread::sleep(Duration::from_micros(rng.below(60_000)));
        drop(child);
        let names: Vec<String> =
            std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
        saw_partial |= names.iter().any(|n| n.contains(".tmp."));
        let latest = latest_checkpoint(&dir).unwrap().expect("a checkpoint survives");
        assert!(!latest.to_str().unwrap().contains(".tmp."), "a partial file is never taken");
        for name in names.iter().filter(|n| !n.contains(".tmp.")) {
            let table = restore_fifo(&dir.join(name), 4096)
                .unwrap_or_else(|e| panic!("round {round}: {name} does not restore: {e}"));
            check_every_row(&table);
        }
        // Restoring the directory reads its newest checkpoint.
        restore_fifo(&dir, 4096).unwrap();
    }
    eprintln!("partial files left by killed children seen: {saw_partial}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A table large enough (69 MB of slots) for the restore to fault its
/// pages in from a second thread, written past its capacity so that the
/// file's order (oldest insert first) starts mid-table and wraps: every
/// row restores intact while that thread populates the pages around it.
#[test]
fn a_large_table_restores_every_row_while_its_pages_are_faulted_in_ahead() {
    let dir = temp_dir("large");
    let capacity = 16384;
    let table = ReplayTable::builder(pattern_spec(capacity))
        .sampler_kind(StrategyKind::Fifo, StrategyParams::default())
        .build()
        .unwrap();
    let writer = table.writer();
    for id in 1..=(capacity as i64 * 3 / 2) {
        write_pattern(&writer, id, 1 + (id as u64 * 7) % 16);
    }
    let path = dir.join("large.gear");
    let report = table.checkpoint(&path).unwrap();
    assert_eq!(report.trajectories, capacity);
    let restored = restore_fifo(&path, capacity).unwrap();
    assert_eq!(check_every_row(&restored), capacity);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The temporary files in `dir`.
fn temporaries(dir: &Path) -> Vec<String> {
    names_in(dir).into_iter().filter(|n| n.contains(".tmp.")).collect()
}

/// Waits (10 s at most) until a temporary file is in `dir`.
fn wait_for_temporary(dir: &Path) -> bool {
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if !temporaries(dir).is_empty() {
            return true;
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    false
}

#[test]
fn killed_checkpoint_writers_leave_no_temporary_files_behind() {
    use gear_api::table::checkpoint::remove_stale_temporaries;
    let dir = temp_dir("killed");
    let arg = dir.to_str().unwrap().to_owned();
    let mut rng = Xoshiro256::seed_from_u64(41);
    let mut kills_mid_write = 0;
    for round in 0..12 {
        let mut child = spawn("checkpointer", &arg);
        wait_line(&mut child.0, "first");
        // At a random moment, most often while a checkpoint is written.
        if rng.below(4) != 0 {
            wait_for_temporary(&dir);
        }
        std::thread::sleep(Duration::from_micros(rng.below(3000)));
        drop(child);
        // Each writer removed what the writers killed before it left: at
        // most the last one's file is here.
        let temps = temporaries(&dir);
        assert!(temps.len() <= 1, "round {round}: {temps:?}");
        kills_mid_write += temps.len();
        let numbered = names_in(&dir).len() - temps.len();
        assert!(numbered <= 3, "round {round}: {numbered} checkpoints kept with --keep 2");
        restore_fifo(&dir, 4096).unwrap_or_else(|e| panic!("round {round}: {e}"));
    }
    eprintln!("{kills_mid_write} of 12 kills landed while a checkpoint was being written");
    assert!(kills_mid_write > 0, "no kill landed during a write: nothing was tested");
    let left = temporaries(&dir).len();
    assert_eq!(remove_stale_temporaries(&dir).unwrap(), left);
    assert!(temporaries(&dir).is_empty());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_stopped_checkpoint_writer_keeps_its_temporary_file() {
    use gear_api::table::checkpoint::remove_stale_temporaries;
    let dir = temp_dir("stopped");
    let mut child = spawn("checkpointer", dir.to_str().unwrap());
    wait_line(&mut child.0, "first");
    let pid = child.0.id() as libc::pid_t;
    let mut rng = Xoshiro256::seed_from_u64(43);
    let mut caught = 0;
    for _ in 0..200 {
        if caught == 5 {
            break;
        }
        if !wait_for_temporary(&dir) {
            continue;
        }
        // SAFETY: kill() and waitpid() on a child this test started and
        // has not reaped (it is reaped by the guard's drop).
        unsafe {
            assert_eq!(libc::kill(pid, libc::SIGSTOP), 0);
            let mut status = 0;
            assert_eq!(libc::waitpid(pid, &mut status, libc::WUNTRACED), pid);
        }
        // The writer is stopped, its process alive: its file stays.
        let temps = temporaries(&dir);
        if !temps.is_empty() {
            assert_eq!(remove_stale_temporaries(&dir).unwrap(), 0, "{temps:?}");
            assert_eq!(temporaries(&dir), temps);
            caught += 1;
        }
        // SAFETY: as above.
        assert_eq!(unsafe { libc::kill(pid, libc::SIGCONT) }, 0);
        std::thread::sleep(Duration::from_micros(rng.below(5000)));
    }
    assert!(caught > 0, "the writer was never stopped mid-write");
    // Resumed each time, it finished those checkpoints (an error would
    // have ended it).
    assert!(child.0.try_wait().unwrap().is_none(), "the checkpointer died");
    drop(child);
    let left = temporaries(&dir).len();
    assert_eq!(remove_stale_temporaries(&dir).unwrap(), left);
    assert!(temporaries(&dir).is_empty());
    check_every_row(&restore_fifo(&dir, 4096).unwrap());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn checkpoint_taken_while_writer_processes_and_a_sampler_run_restores_every_row() {
    let dir = temp_dir("live");
    let name = format!("gear-ckpt-live-{}", std::process::id());
    let capacity = 512;
    let table = ReplayTable::builder(pattern_spec(capacity)).shared_memory(&name).build().unwrap();
    let mut writers: Vec<ChildGuard> = (0..2).map(|_| spawn("writer", &name)).collect();
    let sampling = table.clone();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stop2 = stop.clone();
    let sampler = std::thread::spawn(move || {
        let config = SampleConfig::new(16, WindowSpec::last(8)).timeout(Some(Duration::from_secs(10)));
        let mut s = sampling.sampler(config).unwrap();
        let mut rows = 0;
        while !stop2.load(std::sync::atomic::Ordering::Relaxed) {
            rows += s.sample().unwrap().rows();
        }
        rows
    });
    let deadline = Instant::now() + Duration::from_secs(20);
    while table.info().unwrap().size < capacity && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    let mut reports = Vec::new();
    for i in 0..3 {
        reports.push(table.checkpoint(dir.join(format!("live-{i}.gear"))).unwrap());
        std::thread::sleep(Duration::from_millis(100));
    }
    for w in &mut writers {
        assert!(w.0.wait().unwrap().success());
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    assert!(sampler.join().unwrap() > 0);
    for r in &reports {
        eprintln!(
            "checkpoint of {} trajectories ({} dropped, evicted during the copy): pause {:?}, total {:?}",
            r.trajectories, r.dropped, r.pause, r.elapsed
        );
        let restored = restore_fifo(&r.path, capacity).unwrap();
        assert_eq!(restored.info().unwrap().size, r.trajectories);
        if r.trajectories > 0 {
            assert_eq!(check_every_row(&restored), r.trajectories);
        }
    }
    // Writers that lap the table during a copy cost it the oldest
    // trajectories, never all of them (the copy turns to the newest).
    assert!(reports.iter().any(|r| r.trajectories > 0), "no checkpoint kept a trajectory");
    std::fs::remove_dir_all(&dir).unwrap();
}
