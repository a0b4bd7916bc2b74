//! `gear serve`: creates the shared tables a config file describes (one,
//! or several under `[[tables]]`; or restores them from checkpoints) and
//! keeps them until SIGINT or SIGTERM, reclaiming dead writers' slots and
//! printing a status line per table every second (counters, and the
//! writers and samplers waiting, on what and for how long); answers remote
//! clients with `[grpc]` and Prometheus scrapes with `[metrics]`.
//! `--dry-run` checks the config and prints the memory it needs without
//! creating anything.

use crate::config::{in_file, ServeConfig, TableConfig};
use crate::persist;
use crate::signals;
use gear_api::{Error, ReplayTable, Result};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// `gear serve`'s restore and checkpoint flags.
#[derive(clap::Args, Debug)]
pub struct ServePersistence {
    /// Start from this checkpoint (a file, or a directory whose newest
    /// checkpoint is read). With `[[tables]]`: a directory holding each
    /// table's under its name, as --checkpoint-dir writes them.
    #[arg(long)]
    pub restore: Option<PathBuf>,
    /// Write numbered checkpoints here: every --checkpoint-every seconds, on
    /// SIGUSR1 and at shutdown. With `[[tables]]`: into a subdirectory per
    /// table name.
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
/// the tables, and the memory they need.
pub fn dry_run(config: &Path) -> Result<()> {
    let cfg = ServeConfig::load(config)?;
    // Bytes each directory must hold, in the order they first appear.
    let mut per_dir: Vec<(PathBuf, u64)> = Vec::new();
    for t in &cfg.tables {
        let builder = t.builder().map_err(|e| in_file(config, e))?;
        let bytes = builder.check().map_err(|e| in_file(config, e))?;
        let spec = t.spec()?;
        let dir = table_dir(t);
        let shm = if t.shm() == t.name { String::new() } else { format!(", shared memory `{}`", t.shm()) };
        println!(
            "table `{}`: {} columns, T={}, capacity {} trajectories ({} B per step{shm})",
            t.name,
            spec.columns().len(),
            spec.max_len(),
            spec.capacity(),
            spec.step_bytes()
        );
        println!(
            "  memory: {} in {} (trajectory data {}, header and slot records {})",
            format_bytes(bytes),
            dir.display(),
            format_bytes(spec.data_bytes()),
            format_bytes(bytes - spec.data_bytes())
        );
        if dir.join(t.shm()).exists() {
            println!(
                "  note: {} exists: a table of a running server makes `gear serve` fail; one left by a crashed \
                 server is replaced",
                dir.join(t.shm()).display()
            );
        }
        match per_dir.iter_mut().find(|(d, _)| *d == dir) {
            Some((_, total)) => *total += bytes,
            None => per_dir.push((dir, bytes)),
        }
    }
    for (dir, bytes) in &per_dir {
        match free_bytes(dir) {
            Some(free) if free < *bytes => {
                return Err(Error::Config(format!(
                    "{} has {} free, the table{} need{} {}: enlarge it (e.g. `docker run --shm-size`), make the \
                     tables smaller (capacity, max_len), or set `dir` to a larger file system",
                    dir.display(),
                    format_bytes(free),
                    if cfg.tables.len() > 1 { "s" } else { "" },
                    if cfg.tables.len() > 1 { "" } else { "s" },
                    format_bytes(*bytes)
                )))
            }
            Some(free) => {
                println!("{}: {} free, {} needed", dir.display(), format_bytes(free), format_bytes(*bytes))
            }
            None => println!("{}: free space unknown (it may not exist yet)", dir.display()),
        }
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
    if let Some(m) = &cfg.metrics {
        println!("metrics: http://{}/metrics", m.listen);
    }
    println!("config {} is valid; `gear serve --config {}` would start it", config.display(), config.display());
    Ok(())
}

/// Where table `cfg` of `config` is restored from: the `--restore` path of
/// a one-table config, `DIR/<name>` of a `[[tables]]` one.
fn restore_path(config: &ServeConfig, cfg: &TableConfig, restore: &Path) -> Result<PathBuf> {
    if !config.several {
        return Ok(restore.to_owned());
    }
    let path = restore.join(&cfg.name);
    if !path.exists() {
        return Err(Error::Config(format!(
            "--restore {}: no checkpoint of table `{}` ({} does not exist); a config with [[tables]] restores \
             each table from the subdirectory (or file) of its name, as --checkpoint-dir writes them",
            restore.display(),
            cfg.name,
            path.display()
        )));
    }
    Ok(path)
}

/// Creates (or restores) one table of the config, saying where a restored
/// one came from.
fn open_table(config: &Path, cfg: &ServeConfig, t: &TableConfig, restore: Option<&Path>) -> Result<ReplayTable> {
    let Some(restore) = restore else {
        return t.builder().and_then(|b| b.build()).map_err(|e| in_file(config, e));
    };
    let path = restore_path(cfg, t, restore)?;
    let started = Instant::now();
    let table = t.builder().map_err(|e| in_file(config, e))?.restore(&path)?;
    let file = if path.is_dir() { gear_api::latest_checkpoint(&path)? } else { Some(path.clone()) };
    let which = if cfg.several { format!("table `{}`: ", t.name) } else { String::new() };
    println!(
        "{which}restored {} trajectories from {} in {:.1} s",
        table.info()?.size,
        file.as_deref().unwrap_or(&path).display(),
        started.elapsed().as_secs_f64()
    );
    Ok(table)
}

/// `gear serve`: runs until SIGINT/SIGTERM (or `options.seconds`).
pub fn serve(config: &Path, options: &ServeOptions, persistence: &ServePersistence) -> Result<()> {
    let cfg = ServeConfig::load(config)?;
    // This process only serves: its reply buffers (tens of MB) come from the
    // heap and are reused (gear_net::alloc's module doc).
    gear_net::alloc::serve_every_message_from_the_heap();
    if std::env::var_os(EXIT_WITH_PARENT).is_some() {
        // SAFETY: asking for SIGTERM when the parent dies has no
        // memory-safety preconditions; SIGTERM then stops this server as
        // Ctrl-C would.
        unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM as libc::c_ulong) };
    }
    // Should a second signal end the process at once, the files go too:
    // each is registered before its table creates it and stays registered
    // until after the tables are dropped (declared first, dropped last), so
    // no signal finds a table file it does not know.
    let mut _remove_files = Vec::with_capacity(cfg.tables.len());
    let mut tables = Vec::with_capacity(cfg.tables.len());
    for t in &cfg.tables {
        _remove_files.push(signals::remove_on_exit(table_dir(t).join(t.shm())));
        tables.push(open_table(config, &cfg, t, persistence.restore.as_deref())?);
    }
    let mut schedule = persistence.checkpoint_dir.as_ref().map(|dir| {
        let every = persistence.checkpoint_every.and_then(|s| Duration::try_from_secs_f64(s).ok());
        // A [[tables]] config: a subdirectory per table.
        let dirs = cfg.tables.iter().map(|t| if cfg.several { dir.join(&t.name) } else { dir.clone() }).collect();
        persist::CheckpointSchedule::new(dirs, every, persistence.keep)
    });
    let net = |e: gear_net::Error| Error::Backend(Box::new(e));
    let named = cfg
        .tables
        .iter()
        .zip(&tables)
        .map(|(t, table)| {
            let (kind, params) = t.strategy()?;
            Ok(gear_net::NamedTable::new(t.name.clone(), table.clone(), gear_net::StrategyInfo { kind, params }))
        })
        .collect::<Result<Vec<_>>>()?;
    let served = gear_net::ServedTables::new(named).map_err(net)?;
    let metrics = match &cfg.metrics {
        Some(m) => {
            let server = gear_net::MetricsServer::start(m, served.clone()).map_err(net)?;
            println!("metrics on http://{}/metrics", server.local_addr());
            Some(server)
        }
        None => None,
    };
    let grpc = match &cfg.grpc {
        Some(g) => {
            let handle = gear_net::ServerHandle::serve(served.clone(), g).map_err(net)?;
            println!("grpc listening on {} (shard {})", handle.local_addr(), g.shard);
            Some(handle)
        }
        None => None,
    };
    for (t, table) in cfg.tables.iter().zip(&tables) {
        let spec = table.spec();
        let shm = if t.shm() == t.name { String::new() } else { format!(", shared memory `{}`", t.shm()) };
        println!(
            "serving table `{}` ({} columns, T={}, capacity {}, {} in {}{shm}); stop with Ctrl-C",
            t.name,
            spec.columns().len(),
            spec.max_len(),
            spec.capacity(),
            format_bytes(table.region_bytes()),
            table_dir(t).display()
        );
    }
    let start = Instant::now();
    let until = options.seconds.and_then(|s| Duration::try_from_secs_f64(s).ok());
    let mut last = Instant::now();
    while !signals::stop_requested() && until.is_none_or(|u| start.elapsed() < u) {
        std::thread::sleep(Duration::from_millis(100));
        if let Some(s) = schedule.as_mut() {
            s.tick(&tables)?;
        }
        if last.elapsed() >= Duration::from_secs(1) {
            last = Instant::now();
            for (t, table) in cfg.tables.iter().zip(&tables) {
                let reclaimed = table.reclaim_dead()?;
                if !options.quiet {
                    let name = if cfg.several { Some(t.name.as_str()) } else { None };
                    eprintln!("{}", status_line(table, name, start.elapsed(), reclaimed)?);
                }
            }
        }
    }
    drop(metrics);
    if let Some(handle) = grpc {
        handle.stop().map_err(net)?;
    }
    if let Some(s) = schedule.as_mut() {
        s.finish(&tables)?;
    }
    for (t, table) in cfg.tables.iter().zip(&tables) {
        table.close();
        println!("table `{}` closed", t.name);
    }
    Ok(())
}

/// One status line: fill, counters, and who waits on what; `name` (a
/// server of several tables) says which table.
pub fn status_line(table: &ReplayTable, name: Option<&str>, elapsed: Duration, reclaimed_now: u64) -> Result<String> {
    let i = table.info()?;
    let waiting = i.waiting_summary();
    Ok(format!(
        "[{:6.1}s]{} size {}/{} inserts {} samples {} evicted {} reclaimed {}{}{}",
        elapsed.as_secs_f64(),
        name.map_or_else(String::new, |n| format!(" {n}:")),
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
