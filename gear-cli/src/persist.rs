//! Checkpoints from the command line: the schedule `gear serve` follows
//! (`--checkpoint-every`, SIGUSR1, at shutdown) and `gear bench
//! --checkpoint`, which times a checkpoint and a restore beside a plain
//! sequential write and read of the same bytes to the same directory.

use crate::bench::BenchConfig;
use gear_api::{CheckpointReport, ReplayTable, Result, StepValue};
use gear_core::{ColumnSpec, DType, TableSpec};
use serde::Serialize;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

static CHECKPOINT_REQUESTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_sigusr1(_: libc::c_int) {
    CHECKPOINT_REQUESTED.store(true, Ordering::Relaxed);
}

/// When `gear serve` writes checkpoints, and where.
#[derive(Debug)]
pub struct CheckpointSchedule {
    /// One directory per served table, in the server's order.
    dirs: Vec<PathBuf>,
    every: Option<Duration>,
    keep: usize,
    last: Instant,
}

impl CheckpointSchedule {
    /// Checkpoints the server's tables, the `i`-th into `dirs[i]`
    /// (numbered, the newest `keep` kept), every `every`, on SIGUSR1 and
    /// at [`CheckpointSchedule::finish`]. First removes the temporary
    /// files that writers killed mid-checkpoint left in those directories
    /// (never a live writer's).
    pub fn new(dirs: Vec<PathBuf>, every: Option<Duration>, keep: usize) -> Self {
        for dir in dirs.iter().filter(|d| d.is_dir()) {
            match gear_api::table::checkpoint::remove_stale_temporaries(dir) {
                Ok(0) => {}
                Ok(n) => {
                    eprintln!("removed {n} temporary files of checkpoints whose writer died, from {}", dir.display())
                }
                Err(e) => eprintln!("warning: {e}"),
            }
        }
        // SAFETY: the handler only stores to an atomic, which is
        // async-signal-safe; the function pointer has the C ABI signal()
        // expects.
        unsafe { libc::signal(libc::SIGUSR1, on_sigusr1 as *const () as libc::sighandler_t) };
        CheckpointSchedule { dirs, every, keep, last: Instant::now() }
    }

    /// Writes a checkpoint of every table if one is due or was asked for
    /// by SIGUSR1.
    pub fn tick(&mut self, tables: &[ReplayTable]) -> Result<()> {
        let due = self.every.is_some_and(|e| self.last.elapsed() >= e);
        if CHECKPOINT_REQUESTED.swap(false, Ordering::Relaxed) || due {
            self.write(tables)?;
        }
        Ok(())
    }

    /// The checkpoints at shutdown.
    pub fn finish(&mut self, tables: &[ReplayTable]) -> Result<()> {
        self.write(tables)
    }

    fn write(&mut self, tables: &[ReplayTable]) -> Result<()> {
        for (table, dir) in tables.iter().zip(&self.dirs) {
            let r = table.checkpoint_into(dir, self.keep)?;
            eprintln!(
                "checkpoint {}: {} trajectories ({} dropped), {:.1} MB in {:.2?} (table paused {:.2?})",
                r.path.display(),
                r.trajectories,
                r.dropped,
                r.file_bytes as f64 / 1e6,
                r.elapsed,
                r.pause
            );
        }
        self.last = Instant::now();
        Ok(())
    }
}

/// `gear bench --checkpoint` figures.
#[derive(Clone, Debug, Serialize)]
pub struct CheckpointBenchReport {
    /// Directory written to.
    pub dir: String,
    /// Trajectories in the table.
    pub trajectories: u64,
    /// Bytes of the checkpoint file.
    pub file_bytes: u64,
    /// Median GB/s of each measure over the rounds (bytes of the file).
    pub checkpoint_gb_per_s: f64,
    /// Plain sequential write of as many bytes, fsync included.
    pub plain_write_gb_per_s: f64,
    /// Restore into a fresh table.
    pub restore_gb_per_s: f64,
    /// Plain sequential read of the plain file.
    pub plain_read_gb_per_s: f64,
    /// Plain sequential read of the plain file into memory allocated for
    /// it just before (freshly mapped, faulted in by the read), as a
    /// restore must: a second reference beside the plain read into one
    /// reused 4 MiB buffer, separating the cost of taking fresh memory
    /// from the rest.
    pub plain_read_fresh_gb_per_s: f64,
    /// checkpoint / plain write.
    pub write_ratio: f64,
    /// restore / plain read.
    pub restore_ratio: f64,
    /// restore / plain read into fresh memory.
    pub restore_fresh_ratio: f64,
    /// Restore, per CPU-second of the restoring thread (GB/s of CPU time:
    /// on a machine shared with other work, wall-clock figures mostly
    /// measure the scheduler).
    pub restore_cpu_gb_per_s: f64,
    /// Restore, per CPU-second of the whole process: the restoring thread
    /// and the one that faults the table's pages in ahead of it.
    pub restore_process_cpu_gb_per_s: f64,
    /// Plain read per CPU-second.
    pub plain_read_cpu_gb_per_s: f64,
    /// Median time to build an empty table of this shape with
    /// [`gear_api::TableBuilder::build`] (allocating its memory and
    /// faulting every page in, as huge pages where the kernel has them),
    /// in ms. A restore builds its table otherwise (pages faulted in as
    /// the bytes land), so this is not a part of the restore time.
    pub table_build_ms: f64,
    /// Longest time the table lock was held for a snapshot, in µs.
    pub max_pause_us: f64,
    /// Rounds measured.
    pub rounds: usize,
}

fn spec(c: &BenchConfig) -> Result<TableSpec> {
    Ok(TableSpec::new(
        vec![
            ColumnSpec::new("obs", DType::U8, vec![c.step_bytes]),
            ColumnSpec::new("action", DType::I32, vec![]),
            ColumnSpec::new("reward", DType::F32, vec![]),
        ],
        c.steps,
        c.capacity,
    )?)
}

fn io_error<'a>(path: &'a Path, op: &'static str) -> impl FnOnce(std::io::Error) -> gear_api::Error + 'a {
    move |source| gear_api::Error::CheckpointIo { op, path: path.to_owned(), source }
}

/// Writes `bytes` bytes to `path` in 4 MiB writes, then fsyncs: the
/// reference a checkpoint's speed is compared with.
fn plain_write(path: &Path, bytes: u64, buf: &[u8]) -> Result<Duration> {
    let t = Instant::now();
    let mut f = std::fs::File::create(path).map_err(io_error(path, "create"))?;
    let mut left = bytes;
    while left > 0 {
        let n = left.min(buf.len() as u64) as usize;
        f.write_all(&buf[..n]).map_err(io_error(path, "write"))?;
        left -= n as u64;
    }
    f.sync_all().map_err(io_error(path, "fsync"))?;
    Ok(t.elapsed())
}

fn plain_read(path: &Path, buf: &mut [u8]) -> Result<Duration> {
    let t = Instant::now();
    let mut f = std::fs::File::open(path).map_err(io_error(path, "open"))?;
    while f.read(buf).map_err(io_error(path, "read"))? > 0 {}
    Ok(t.elapsed())
}

/// Reads the whole file at `path` (`bytes` long) in 4 MiB reads into a
/// buffer allocated for it here: zeroed memory from the system, which the
/// kernel maps and clears page by page as the reads first touch it.
fn plain_read_fresh(path: &Path, bytes: u64) -> Result<Duration> {
    let t = Instant::now();
    let mut f = std::fs::File::open(path).map_err(io_error(path, "open"))?;
    let mut into = vec![0u8; bytes as usize];
    let mut done = 0;
    while done < into.len() {
        let end = (done + (4 << 20)).min(into.len());
        match f.read(&mut into[done..end]).map_err(io_error(path, "read"))? {
            0 => break,
            n => done += n,
        }
    }
    let elapsed = t.elapsed();
    drop(into);
    Ok(elapsed)
}

/// CPU time this thread has used, in seconds (every timed step here runs
/// on the calling thread, a restore with a helper thread besides).
fn thread_cpu_s() -> f64 {
    cpu_s(libc::CLOCK_THREAD_CPUTIME_ID)
}

/// CPU time of `clock`, in seconds.
fn cpu_s(clock: libc::clockid_t) -> f64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes one timespec through a valid pointer.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Fills a table of the bench's shape (`--steps`, `--step-bytes`,
/// `--capacity`), then alternates checkpoint, plain write, restore and
/// plain read of the same bytes in `dir`, `rounds` times.
pub fn run_checkpoint_bench(c: &BenchConfig, dir: &Path, rounds: usize) -> Result<CheckpointBenchReport> {
    let dir = dir.join(format!("gear-checkpoint-bench-{}", std::process::id()));
    // Only the bench's own folder is created (the caller checked that
    // `dir` exists), and it goes on every way out, Ctrl-C included.
    std::fs::create_dir(&dir).map_err(io_error(&dir, "create"))?;
    let _remove_dir = crate::signals::remove_on_exit(dir.clone());
    let result = measure(c, &dir, rounds.max(1));
    let _ = std::fs::remove_dir_all(&dir);
    result
}

fn measure(c: &BenchConfig, dir: &Path, rounds: usize) -> Result<CheckpointBenchReport> {
    let table = ReplayTable::builder(spec(c)?).seed(c.seed).build()?;
    let writer = table.writer();
    let obs: Vec<u8> = (0..c.step_bytes * c.steps).map(|i| (i * 31 % 251) as u8).collect();
    let actions: Vec<i32> = (0..c.steps as i32).collect();
    let rewards: Vec<f32> = (0..c.steps).map(|i| i as f32).collect();
    for _ in 0..c.capacity {
        let mut t = writer.begin(None)?;
        t.append_column("obs", c.steps, StepValue::bytes(&obs))?;
        t.append_column("action", c.steps, StepValue::typed(&actions))?;
        t.append_column("reward", c.steps, StepValue::typed(&rewards))?;
        t.end()?;
    }
    let ckpt = dir.join("table.gear");
    let plain = dir.join("plain.bin");
    let mut buf = vec![7u8; 4 << 20];
    let (mut cw, mut pw, mut rs, mut pr, mut pause) = (Vec::new(), Vec::new(), Vec::new(), Vec::new(), 0f64);
    let (mut build_ms, mut rs_cpu, mut pr_cpu, mut prf) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut rs_pcpu = Vec::new();
    let mut last: Option<CheckpointReport> = None;
    for _ in 0..rounds {
        let r = table.checkpoint(&ckpt)?;
        let gb = r.file_bytes as f64 / 1e9;
        cw.push(gb / r.elapsed.as_secs_f64());
        pause = pause.max(r.pause.as_secs_f64() * 1e6);
        pw.push(gb / plain_write(&plain, r.file_bytes, &buf)?.as_secs_f64());
        let (t, cpu, pcpu) = (Instant::now(), thread_cpu_s(), cpu_s(libc::CLOCK_PROCESS_CPUTIME_ID));
        let restored = ReplayTable::builder(spec(c)?).restore(&ckpt)?;
        rs.push(gb / t.elapsed().as_secs_f64());
        rs_cpu.push(gb / (thread_cpu_s() - cpu));
        rs_pcpu.push(gb / (cpu_s(libc::CLOCK_PROCESS_CPUTIME_ID) - pcpu));
        // With the restored table still held, so the fresh buffer cannot
        // take the pages it would free: both get memory alike.
        prf.push(gb / plain_read_fresh(&plain, r.file_bytes)?.as_secs_f64());
        drop(restored);
        let cpu = thread_cpu_s();
        pr.push(gb / plain_read(&plain, &mut buf)?.as_secs_f64());
        pr_cpu.push(gb / (thread_cpu_s() - cpu));
        let t = Instant::now();
        drop(ReplayTable::builder(spec(c)?).build()?);
        build_ms.push(t.elapsed().as_secs_f64() * 1e3);
        last = Some(r);
    }
    let last = last.expect("at least one round");
    let (cw, pw, rs, pr) = (median(cw), median(pw), median(rs), median(pr));
    let build_ms = median(build_ms);
    let prf = median(prf);
    Ok(CheckpointBenchReport {
        dir: dir.display().to_string(),
        trajectories: last.trajectories,
        file_bytes: last.file_bytes,
        checkpoint_gb_per_s: cw,
        plain_write_gb_per_s: pw,
        restore_gb_per_s: rs,
        plain_read_gb_per_s: pr,
        write_ratio: cw / pw,
        restore_ratio: rs / pr,
        plain_read_fresh_gb_per_s: prf,
        restore_fresh_ratio: rs / prf,
        table_build_ms: build_ms,
        restore_cpu_gb_per_s: median(rs_cpu),
        restore_process_cpu_gb_per_s: median(rs_pcpu),
        plain_read_cpu_gb_per_s: median(pr_cpu),
        max_pause_us: pause,
        rounds,
    })
}

impl std::fmt::Display for CheckpointBenchReport {
    /// The report as `gear bench --checkpoint` prints it.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let r = self;
        writeln!(
            f,
            "checkpoint of {} trajectories, {:.1} MB in {} ({} rounds, medians)",
            r.trajectories,
            r.file_bytes as f64 / 1e6,
            r.dir,
            r.rounds
        )?;
        writeln!(
            f,
            "  checkpoint : {:>6.2} GB/s  plain write + fsync : {:>6.2} GB/s  ratio {:.2}",
            r.checkpoint_gb_per_s, r.plain_write_gb_per_s, r.write_ratio
        )?;
        writeln!(
            f,
            "  restore    : {:>6.2} GB/s  plain read          : {:>6.2} GB/s  ratio {:.2}",
            r.restore_gb_per_s, r.plain_read_gb_per_s, r.restore_ratio
        )?;
        writeln!(
            f,
            "  plain read into fresh memory : {:>6.2} GB/s  restore / that : {:.2}",
            r.plain_read_fresh_gb_per_s, r.restore_fresh_ratio
        )?;
        writeln!(f, "  build of an empty table (pre-faulted, timed apart): {:.0} ms", r.table_build_ms)?;
        writeln!(
            f,
            "  per CPU-second: restore {:.2} GB/s ({:.2} with its prefault thread), plain read {:.2} GB/s",
            r.restore_cpu_gb_per_s, r.restore_process_cpu_gb_per_s, r.plain_read_cpu_gb_per_s
        )?;
        write!(f, "  longest table pause for a snapshot: {:.0} us", r.max_pause_us)
    }
}
