//! `gear import` and `gear export`: offline datasets (HDF5 files in the
//! D4RL or Minari layout, through gear-hdf5) into and out of a table.
//!
//! Which table:
//! * `--config FILE` names a shared table. When a process serves it
//!   (`gear serve --config FILE`: its backing file exists), the import
//!   attaches and inserts into the live table. When none does, the import
//!   builds the table the config describes in private memory, imports, and
//!   writes it to `--checkpoint FILE` (required then: a table this process
//!   made is gone when it exits), for `gear serve --config FILE --restore
//!   FILE`; `--no-checkpoint` keeps nothing (a check that the file
//!   imports). A `--checkpoint` or `--hdf5` output that exists and is not
//!   a regular file (`/dev/null`, a directory, a FIFO, a socket, a
//!   symbolic link) is refused before any work.
//! * `--table NAME` attaches to a served table by name (`--dir` for a
//!   backing file outside `/dev/shm`).
//!
//! `gear export` reads the served table (`--config` or `--table`), or with
//! `--checkpoint FILE --config FILE` a checkpoint.

use crate::config::TableConfig;
use crate::progress::Progress;
use gear_api::{AttachOptions, PoolConfig, ReplayTable};
use gear_hdf5::{ExportOptions, ImportOptions, Layout, Phase};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// Where the table comes from, for both commands.
#[derive(clap::Args, Debug)]
pub struct TableArgs {
    /// The table config (docs/CONFIG.md): the table it names
    /// is attached when served, else built.
    #[arg(long, required_unless_present = "table")]
    config: Option<PathBuf>,
    /// Attach to the served table of this name instead.
    #[arg(long, conflicts_with = "config")]
    table: Option<String>,
    /// Directory of the table's backing file (with --table; default /dev/shm).
    #[arg(long, requires = "table")]
    dir: Option<PathBuf>,
    /// No progress lines.
    #[arg(long)]
    quiet: bool,
}

/// `gear import`'s arguments.
#[derive(clap::Args, Debug)]
pub struct ImportArgs {
    /// The HDF5 file to import.
    #[arg(long)]
    hdf5: PathBuf,
    /// The file's layout (default: found from the file).
    #[arg(long, value_parser = ["d4rl", "minari"])]
    layout: Option<String>,
    /// DATASET=COLUMN: the column reads that dataset (repeatable).
    #[arg(long = "map", value_name = "DATASET=COLUMN")]
    map: Vec<String>,
    /// Minari: the column that receives each step's next observation
    /// (default: `next_observations` when the table has it).
    #[arg(long)]
    next_observations: Option<String>,
    /// Refuse episodes longer than the table's max_len instead of cutting
    /// them into several trajectories.
    #[arg(long)]
    no_split: bool,
    /// Skip the pass that reads every row before inserting (faster; a
    /// corrupt chunk found mid-import leaves the trajectories before it).
    #[arg(long)]
    no_verify: bool,
    /// Write the table to this checkpoint file afterwards (a regular file
    /// or a new path; required when no process serves the table, unless
    /// --no-checkpoint: the imported table would be lost).
    #[arg(long)]
    checkpoint: Option<PathBuf>,
    /// With no served table: import into a table built here and keep
    /// nothing (a check that the file imports into the config's table).
    #[arg(long, conflicts_with = "checkpoint")]
    no_checkpoint: bool,
    #[command(flatten)]
    table: TableArgs,
}

/// `gear export`'s arguments.
#[derive(clap::Args, Debug)]
pub struct ExportArgs {
    /// The HDF5 file to write.
    #[arg(long)]
    hdf5: PathBuf,
    /// The layout to write.
    #[arg(long, value_parser = ["d4rl", "minari"], default_value = "d4rl")]
    layout: String,
    /// COLUMN=DATASET: write the column under that name (repeatable).
    #[arg(long = "rename", value_name = "COLUMN=DATASET")]
    rename: Vec<String>,
    /// Store datasets chunked and deflated at this level (0-9), as D4RL's
    /// files are.
    #[arg(long, value_parser = clap::value_parser!(u32).range(0..=9))]
    deflate: Option<u32>,
    /// Read the table from this checkpoint file (with --config, for its
    /// spec) instead of a served table.
    #[arg(long)]
    checkpoint: Option<PathBuf>,
    #[command(flatten)]
    table: TableArgs,
}

/// Runs `gear import`; errors are printed, and the exit code says.
pub fn import(args: &ImportArgs) -> ExitCode {
    report(run_import(args))
}

/// Runs `gear export`.
pub fn export(args: &ExportArgs) -> ExitCode {
    report(run_export(args))
}

fn report(r: Result<(), String>) -> ExitCode {
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// `A=B` pairs.
fn pairs(items: &[String], what: &str) -> Result<Vec<(String, String)>, String> {
    items
        .iter()
        .map(|s| match s.split_once('=') {
            Some((a, b)) if !a.is_empty() && !b.is_empty() => Ok((a.to_owned(), b.to_owned())),
            _ => Err(format!("`{s}` is not {what}")),
        })
        .collect()
}

/// The served table `args` names, if a process serves it; `Ok(None)` when
/// the config's table has no backing file.
fn served(args: &TableArgs) -> Result<Option<ReplayTable>, String> {
    let e = |e: gear_api::Error| e.to_string();
    if let Some(name) = &args.table {
        let opts = AttachOptions { dir: args.dir.clone(), ..AttachOptions::default() };
        let t = ReplayTable::attach(name, opts).map_err(|err| format!("table `{name}`: {err}"))?;
        return Ok(Some(t));
    }
    let path = args.config.as_deref().ok_or("give --config or --table")?;
    let cfg = TableConfig::load(path).map_err(e)?;
    let dir = cfg.dir.clone().unwrap_or_else(|| PathBuf::from("/dev/shm"));
    if !dir.join(cfg.shm()).exists() {
        return Ok(None);
    }
    let opts =
        AttachOptions { dir: cfg.dir.clone(), expected: Some(cfg.spec().map_err(e)?), ..AttachOptions::default() };
    let t = ReplayTable::attach(cfg.shm(), opts).map_err(|err| format!("table `{}`: {err}", cfg.shm()))?;
    Ok(Some(t))
}

fn run_import(args: &ImportArgs) -> Result<(), String> {
    let options = ImportOptions {
        layout: args.layout.as_deref().map(str::parse::<Layout>).transpose().map_err(|e| e.to_string())?,
        mapping: pairs(&args.map, "DATASET=COLUMN")?,
        next_observations: args.next_observations.clone(),
        split_long_episodes: !args.no_split,
        verify: !args.no_verify,
        ..ImportOptions::default()
    };
    if !args.hdf5.exists() {
        return Err(format!("{}: no such file", args.hdf5.display()));
    }
    if let Some(out) = &args.checkpoint {
        // Refused before the import, not after it: `/dev/null` is not a
        // way to keep nothing (--no-checkpoint is).
        check_target(out, "--checkpoint")?;
    }
    let (table, checkpoint) = match served(&args.table)? {
        Some(t) => {
            println!("importing into the served table `{}`", t.name().unwrap_or("?"));
            (t, args.checkpoint.clone())
        }
        None => {
            let cfg =
                TableConfig::load(args.table.config.as_deref().unwrap_or(Path::new(""))).map_err(|e| e.to_string())?;
            if args.checkpoint.is_none() && !args.no_checkpoint {
                return Err(format!(
                    "no process serves table `{}` (start `gear serve --config ...` first), and without \
                     --checkpoint FILE the imported table would be lost when this command exits \
                     (--no-checkpoint: import only to check the file, keeping nothing)",
                    cfg.name
                ));
            }
            let t = cfg.builder().and_then(|b| b.pool(PoolConfig::Host).build()).map_err(|e| e.to_string())?;
            match &args.checkpoint {
                Some(out) => println!(
                    "no process serves table `{}`: importing into a new table, written to {}",
                    cfg.name,
                    out.display()
                ),
                None => println!(
                    "no process serves table `{}`: importing into a new table, kept nowhere (--no-checkpoint)",
                    cfg.name
                ),
            }
            (t, args.checkpoint.clone())
        }
    };
    let mut progress = Progress::new(!args.table.quiet);
    let mut phase = None;
    let result = gear_hdf5::import_with_progress(&table, &args.hdf5, &options, &mut |p| {
        if phase != Some(p.phase) {
            if phase.is_some() {
                progress.done();
            }
            progress.phase(if p.phase == Phase::Verify { "verify" } else { "insert" }, p.total_steps);
            phase = Some(p.phase);
        }
        progress.tick(p.steps_done);
    });
    if phase.is_some() {
        progress.done();
    }
    let r = result.map_err(|e| e.to_string())?;
    println!(
        "imported {} ({}): {} episodes -> {} trajectories ({} episodes longer than T={} split), {} steps, {:.1} MB in {:.2?}",
        r.path.display(),
        r.layout,
        r.episodes,
        r.trajectories,
        r.split_episodes,
        table.spec().max_len(),
        r.steps,
        r.bytes as f64 / 1e6,
        r.elapsed
    );
    for (column, dataset) in &r.columns {
        println!("  column {column:<24} <- {dataset}");
    }
    if !r.unused_datasets.is_empty() {
        println!("  datasets no column reads: {}", r.unused_datasets.join(", "));
    }
    if r.dropped_final_observations > 0 {
        println!(
            "  final observations of {} episodes dropped (no next-observation column)",
            r.dropped_final_observations
        );
    }
    if r.evicted > 0 {
        println!("  {} trajectories already in the table were evicted to make room", r.evicted);
    }
    if let Some(path) = checkpoint {
        let c = table.checkpoint(&path).map_err(|e| e.to_string())?;
        println!(
            "checkpoint {}: {} trajectories, {:.1} MB",
            c.path.display(),
            c.trajectories,
            c.file_bytes as f64 / 1e6
        );
    }
    Ok(())
}

/// Refuses an output path that exists and is not a regular file (a device
/// such as `/dev/null`, a directory, a FIFO, a socket, a symbolic link),
/// before any work; the library checks again when it writes.
fn check_target(path: &Path, flag: &str) -> Result<(), String> {
    gear_api::table::checkpoint::files::check_replaceable(path).map_err(|e| format!("{flag} {}: {e}", path.display()))
}

fn run_export(args: &ExportArgs) -> Result<(), String> {
    check_target(&args.hdf5, "--hdf5")?;
    let options = ExportOptions {
        layout: args.layout.parse::<Layout>().map_err(|e| e.to_string())?,
        rename: pairs(&args.rename, "COLUMN=DATASET")?,
        deflate: args.deflate,
        ..ExportOptions::default()
    };
    let table = match (&args.checkpoint, &args.table.config) {
        (Some(ckpt), Some(config)) => {
            let cfg = TableConfig::load(config).map_err(|e| e.to_string())?;
            cfg.builder().and_then(|b| b.pool(PoolConfig::Host).restore(ckpt)).map_err(|e| e.to_string())?
        }
        (Some(_), None) => return Err("--checkpoint needs --config (the table's spec)".into()),
        _ => match served(&args.table)? {
            Some(t) => t,
            None => {
                return Err(format!(
                    "no process serves the table of {} (start `gear serve`, or give --checkpoint FILE)",
                    args.table.config.as_deref().unwrap_or(Path::new("?")).display()
                ))
            }
        },
    };
    let r = gear_hdf5::export(&table, &args.hdf5, &options).map_err(|e| e.to_string())?;
    println!(
        "exported {} trajectories ({} episodes, {} steps) to {} ({}, {:.1} MB) in {:.2?}",
        r.trajectories,
        r.episodes,
        r.steps,
        r.path.display(),
        r.layout,
        r.file_bytes as f64 / 1e6,
        r.elapsed
    );
    if r.terminals_from_ends {
        println!("  `terminals` marks each trajectory's last step (the table has no terminals column)");
    }
    if r.dropped > 0 {
        println!("  {} trajectories were evicted during the export and left out", r.dropped);
    }
    Ok(())
}
