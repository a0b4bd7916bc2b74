//! `gear serve`: creates the shared table a config file describes (or
//! restores it from a checkpoint) and keeps it until SIGINT or SIGTERM,
//! reclaiming dead writers' slots and printing a status line every second
//! (counters, and the writers and samplers waiting, on what and for how
//! long); `--dry-run` checks the config and prints the memory it needs
//! without creating anything.

use crate::config::{in_file, TableConfig};
use crate::persist;
use crate::signals;
use gear_api::{Error, ReplayTable, Result};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// `gear serve`'s restore and checkpoint flags.
#[derive(clap::Args, Debug)]
pub struct ServePersistence {
    /// Start from this checkpoint (a file, or a directory whose newest
    /// checkpoint is read).
    #[arg(long)]
    pub restore: Option<PathBuf>,
    /// Write numbered checkpoints here: every --checkpoint-every seconds, on
    /// SIGUSR1 and at shutdown.
    #[arg(long)]
    pub checkpoint_dir: Option<PathBuf>,
    /// Seconds between checkpoints (needs --checkpoint-dir).
    #[arg(long, value_parser = crate::seconds_arg, requires = "checkpoint_dir")]
    pub checkpoint_every: Option<f64>,
    /// Checkpoints kept in --checkpoint-dir (the oldest are removed).
    #[arg(long, default_value_t = 3)]
    pub keep: usize,
}

/// `gear serve`'s other flags.
#[derive(Debug, Default)]
pub struct ServeOptions {
    /// Stop after this many seconds.
    pub seconds: Option<f64>,
    /// Print no status lines (the start and stop lines still appear).
    pub quiet: bool,
}

/// Set by a parent `gear` (`gear cluster up`) that starts servers: the
/// server stops (closing and removing its table) when that parent dies.
pub const EXIT_WITH_PARENT: &str = "GEAR_EXIT_WITH_PARENT";

/// Where shared tables go when a config names no `dir`.
pub const DEFAULT_TABLE_DIR: &str = "/dev/shm";

/// The directory a config's table file goes to.
fn table_dir(cfg: &TableConfig) -> PathBuf {
    cfg.dir.clone().unwrap_or_else(|| PathBuf::from(DEFAULT_TABLE_DIR))
}

/// Bytes free for unprivileged users on the file system holding `dir`, if
/// it can be asked.
fn free_bytes(dir: &Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt;
    let path = std::ffi::CString::new(dir.as_os_str().as_bytes()).ok()?;
    // SAFETY: `path` is a valid C string and `st` a writable statvfs for the
    // call to fill.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    if unsafe { libc::statvfs(path.as_ptr(), &mut st) } != 0 {
        return None;
    }
    Some(st.f_bavail as u64 * st.f_frsize as u64)
}

/// Bytes as MB (GB from 10 GB on), for the lines users read.
pub fn format_bytes(bytes: u64) -> String {
    if bytes >= 10_000_000_000 {
        format!("{:.1} GB", bytes as f64 / 1e9)
    } else {
        format!("{:.1} MB", bytes as f64 / 1e6)
    }
}

/// `gear serve --dry-run`: everything `gear serve` checks before it creates
/// the table, and the memory the table needs.
pub fn dry_run(config: &Path) -> Result<()> {
    let cfg = TableConfig::load(config)?;
    let builder = cfg.builder().map_err(|e| in_file(config, e))?;
    let bytes = builder.check().map_err(|e| in_file(config, e))?;
    let spec = cfg.spec()?;
    let dir = table_dir(&cfg);
    println!(
        "table `{}`: {} columns, T={}, capacity {} trajectories ({} B per step)",
        cfg.name,
        spec.columns().len(),
        spec.max_len(),
        spec.capacity(),
        spec.step_bytes()
    );
    println!(
        "memory: {} in {} (trajectory data {}, header and slot records {})",
        format_bytes(bytes),
        dir.display(),
        format_bytes(spec.data_bytes()),
        format_bytes(bytes - spec.data_bytes())
    );
    match free_bytes(&dir) {
        Some(free) if free < bytes => {
            return Err(Error::Config(format!(
                "{} has {} free, the table needs {}: enlarge it (e.g. `docker run --shm-size`), make the table \
                 smaller (capacity, max_len), or set `dir` to a larger file system",
                dir.display(),
                format_bytes(free),
                format_bytes(bytes)
            )))
        }
        Some(free) => println!("{}: {} free", dir.display(), format_bytes(free)),
        None => println!("{}: free space unknown (it may not exist yet)", dir.display()),
    }
    if dir.join(&cfg.name).exists() {
        println!(
            "note: {} exists: a table of a running server makes `gear serve` fail; one left by a crashed \
             server is replaced",
            dir.join(&cfg.name).display()
        );
    }
    if let Some(g) = &cfg.grpc {
        let token = match gear_net::auth::resolve_token(g.token.as_deref()) {
            Ok(_) if g.token.is_some() => "from the config".to_owned(),
            Ok(_) => "from GEAR_TOKEN".to_owned(),
            Err(gear_net::Error::Config(what)) => return Err(Error::Config(format!("[grpc]: {what}"))),
            Err(e) => return Err(Error::Backend(Box::new(e))),
        };
        println!("grpc: shard {} on {} (token {token})", g.shard, g.listen);
    }
    println!("config {} is valid; `gear serve --config {}` would start it", config.display(), config.display());
    Ok(())
}

/// `gear serve`: runs until SIGINT/SIGTERM (or `options.seconds`).
pub fn serve(config: &Path, options: &ServeOptions, persistence: &ServePersistence) -> Result<()> {
    let cfg = TableConfig::load(config)?;
    if std::env::var_os(EXIT_WITH_PARENT).is_some() {
        // SAFETY: asking for SIGTERM when the parent dies has no
        // memory-safety preconditions; SIGTERM then stops this server as
        // Ctrl-C would.
        unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM as libc::c_ulong) };
    }
    let table = match &persistence.restore {
        Some(path) => {
            let started = Instant::now();
            let table = cfg.builder().map_err(|e| in_file(config, e))?.restore(path)?;
            let file = if path.is_dir() { gear_api::latest_checkpoint(path)? } else { Some(path.clone()) };
            println!(
                "restored {} trajectories from {} in {:.1} s",
                table.info()?.size,
                file.as_deref().unwrap_or(path).display(),
                started.elapsed().as_secs_f64()
            );
            table
        }
        None => cfg.builder().and_then(|b| b.build()).map_err(|e| in_file(config, e))?,
    };
    // Should a second signal end the process at once, the file goes too.
    let _remove_file = signals::remove_on_exit(table_dir(&cfg).join(&cfg.name));
    let mut schedule = persistence.checkpoint_dir.as_ref().map(|dir| {
        let every = persistence.checkpoint_every.and_then(|s| Duration::try_from_secs_f64(s).ok());
        persist::CheckpointSchedule::new(dir.clone(), every, persistence.keep)
    });
    let grpc = match &cfg.grpc {
        Some(g) => {
            let (kind, params) = cfg.strategy()?;
            let handle = gear_net::ServerHandle::start(table.clone(), g, gear_net::StrategyInfo { kind, params })
                .map_err(|e| Error::Backend(Box::new(e)))?;
            println!("grpc listening on {} (shard {})", handle.local_addr(), g.shard);
            Some(handle)
        }
        None => None,
    };
    let spec = table.spec();
    println!(
        "serving table `{}` ({} columns, T={}, capacity {}, {} in {}); stop with Ctrl-C",
        cfg.name,
        spec.columns().len(),
        spec.max_len(),
        spec.capacity(),
        format_bytes(table.region_bytes()),
        table_dir(&cfg).display()
    );
    let start = Instant::now();
    let until = options.seconds.and_then(|s| Duration::try_from_secs_f64(s).ok());
    let mut last = Instant::now();
    while !signals::stop_requested() && until.is_none_or(|u| start.elapsed() < u) {
        std::thread::sleep(Duration::from_millis(100));
        if let Some(s) = schedule.as_mut() {
            s.tick(&table)?;
        }
        if last.elapsed() >= Duration::from_secs(1) {
            last = Instant::now();
            let reclaimed = table.reclaim_dead()?;
            if !options.quiet {
                eprintln!("{}", status_line(&table, start.elapsed(), reclaimed)?);
            }
        }
    }
    if let Some(handle) = grpc {
        handle.stop().map_err(|e| Error::Backend(Box::new(e)))?;
    }
    if let Some(s) = schedule.as_mut() {
        s.finish(&table)?;
    }
    table.close();
    println!("table `{}` closed", cfg.name);
    Ok(())
}

/// One status line: fill, counters, and who waits on what.
pub fn status_line(table: &ReplayTable, elapsed: Duration, reclaimed_now: u64) -> Result<String> {
    let i = table.info()?;
    let waiting = i.waiting_summary();
    Ok(format!(
        "[{:6.1}s] size {}/{} inserts {} samples {} evicted {} reclaimed {}{}{}",
        elapsed.as_secs_f64(),
        i.size,
        i.capacity,
        i.inserts,
        i.samples,
        i.evictions,
        i.reclaimed,
        if reclaimed_now > 0 { format!(" (+{reclaimed_now})") } else { String::new() },
        if waiting.is_empty() { String::new() } else { format!(" | waiting: {waiting}") }
    ))
}
