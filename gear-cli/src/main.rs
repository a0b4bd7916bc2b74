//! The `gear` command: `gear demo` runs the main job on the CPU default;
//! `gear bench` measures insert and sample throughput against memcpy;
//! `gear serve` creates a shared table from a config file and keeps it;
//! `gear cluster up --local N` starts a cluster on this machine and `gear
//! cluster-info` asks every shard of a cluster file its counters; `gear
//! inspect` and `gear sample` look inside a table; `gear config example`
//! prints a config that runs as it is.

mod bench;
mod children;
mod cluster_bench;
mod cluster_config;
mod cluster_demo;
mod cluster_local;
mod config;
mod demo;
mod device_bench;
mod examples;
mod import;
mod inspect;
mod persist;
mod progress;
mod serve;
mod signals;

use crate::bench::{run_bench, run_bench_processes, BenchConfig};
use crate::demo::{run_demo, DemoConfig};
use crate::progress::Progress;
use clap::{Parser, Subcommand};
use gear_api::Result;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

#[derive(Parser)]
#[command(name = "gear", version, about = "GEAR-rs: GPU-centric experience replay for large sequence models")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Actor processes write Atari-shaped episodes into a shared table while
    /// a trainer process samples windows with prioritized replay, checks
    /// every row and updates priorities.
    Demo {
        /// Actors.
        #[arg(long, default_value_t = 3)]
        actors: usize,
        /// Run actors and trainer as threads of this process instead.
        #[arg(long)]
        threads: bool,
        /// Seconds to run.
        #[arg(long, default_value_t = 5.0, value_parser = seconds_arg)]
        seconds: f64,
        /// Table capacity in episodes.
        #[arg(long, default_value_t = 512)]
        capacity: u64,
        /// Rows per batch.
        #[arg(long, default_value_t = 64)]
        batch: usize,
        /// Steps per sampled window.
        #[arg(long, default_value_t = 32)]
        window: u64,
        /// Instead: actor threads write through the cluster client into the
        /// shards of this cluster file, a trainer samples across them.
        #[arg(long, conflicts_with_all = ["threads", "capacity", "window"])]
        cluster: Option<PathBuf>,
    },
    /// Insert and sample throughput, with a memcpy of the same bytes as the
    /// reference.
    Bench {
        #[command(flatten)]
        config: BenchConfig,
        /// Writer processes inserting concurrently while one sampler process
        /// samples (0: one process, inserting then sampling).
        #[arg(long, default_value_t = 0)]
        writers: usize,
        /// Print one JSON object instead of a table.
        #[arg(long)]
        json: bool,
        /// Backend: cpu, or cuda (zero-copy gather, device-cache gather and a
        /// device-to-device copy of the same bytes; needs the `cuda` feature
        /// and a GPU).
        #[arg(long, default_value = "cpu")]
        backend: String,
        /// Instead: checkpoint and restore a full table of this shape,
        /// beside a plain sequential write and read of the same bytes in
        /// --checkpoint-dir.
        #[arg(long)]
        checkpoint: bool,
        /// Directory for --checkpoint's files, which must exist (default:
        /// the system's temporary directory); the files are removed after.
        #[arg(long)]
        checkpoint_dir: Option<PathBuf>,
        /// Rounds of --checkpoint (medians are reported).
        #[arg(long, default_value_t = 3)]
        rounds: usize,
        /// Shard servers (`gear serve` processes on loopback) for a remote
        /// bench: gRPC writers and cross-shard sampling beside a plain TCP
        /// stream of the same bytes (0: the local bench).
        #[arg(long, default_value_t = 0)]
        shards: usize,
        /// With --shards: how sampled windows travel: `gather` (each shard
        /// gathers its rows), `byte-range` (the trainer reads byte ranges
        /// of the shards' regions: RDMA where it runs, else TCP),
        /// `byte-range-tcp`, or `auto`.
        #[arg(long, default_value = "auto", value_parser = crate::cluster_bench::parse_data_plane)]
        data_plane: gear_net::DataPlane,
    },
    /// Creates the shared tables a TOML config describes (one, or several
    /// under `[[tables]]`) and serves them until interrupted: reclaims dead
    /// writers' slots and prints their counters and who waits on what;
    /// answers remote clients with `[grpc]`, Prometheus scrapes with
    /// `[metrics]`.
    Serve {
        /// The config (docs/CONFIG.md; `gear config example serve` prints
        /// one, `gear config example tables` one with several tables).
        #[arg(long)]
        config: PathBuf,
        /// Check the config and print the memory the table needs, without
        /// creating it.
        #[arg(long)]
        dry_run: bool,
        /// Stop after this many seconds (default: until SIGINT/SIGTERM).
        #[arg(long, value_parser = seconds_arg)]
        seconds: Option<f64>,
        /// No status line every second.
        #[arg(long)]
        quiet: bool,
        #[command(flatten)]
        persistence: serve::ServePersistence,
    },
    /// Reads a cluster file (shard addresses, token, TLS; docs/CONFIG.md)
    /// and prints every shard's tables and their counters (only the file's
    /// `table` if it names one).
    ClusterInfo {
        /// The cluster file.
        #[arg(long)]
        cluster: PathBuf,
        /// Seconds to wait for shards that are not listening yet (still
        /// creating their tables).
        #[arg(long, default_value_t = 10.0, value_parser = seconds_or_zero)]
        wait: f64,
        /// Print the figures live: every second, per shard and table, with
        /// rates (inserts, rows sampled, MB in and out) since the last
        /// refresh and the rate-limiter and lock waits.
        #[arg(long)]
        watch: bool,
        /// With --watch: seconds between refreshes.
        #[arg(long, default_value_t = 1.0, value_parser = seconds_arg, requires = "watch")]
        interval: f64,
        /// With --watch: stop after this many refreshes (default: until
        /// interrupted).
        #[arg(long, requires = "watch")]
        count: Option<u64>,
    },
    /// A cluster on this machine: `gear cluster up --local 3 --config
    /// shard.toml`.
    Cluster {
        #[command(subcommand)]
        command: ClusterCommand,
    },
    /// Configs: `gear config example [serve|tables|cluster]` prints a
    /// commented one that runs as it is.
    Config {
        #[command(subcommand)]
        command: ConfigCommand,
    },
    /// A shared table's spec, fill, rate limiter and waiting writers and
    /// samplers (`--cluster FILE`: every shard's); no name: the tables in
    /// /dev/shm.
    Inspect(inspect::Target),
    /// Draws a few rows from a shared table (or a cluster) and prints their
    /// values.
    Sample(inspect::SampleArgs),
    /// Imports an HDF5 dataset (D4RL or Minari layout) into the table a
    /// config names: the served one, or a new one written to --checkpoint.
    Import(import::ImportArgs),
    /// Exports a table's committed trajectories to an HDF5 file (D4RL or
    /// Minari layout).
    Export(import::ExportArgs),
    /// Writer processes evict fast while a prefetching device sampler (ring
    /// 2, then 3; selection on the device) checks every row it draws and
    /// counts redrawn rows, timeouts and torn batches. Fails on a bad row
    /// or a timeout.
    DeviceSoak {
        /// Device: cuda (needs the `cuda` feature and a GPU) or cpu-device
        /// (gear-device's CPU device; its figures are not GPU figures).
        #[arg(long, default_value = "cuda")]
        backend: String,
        #[command(flatten)]
        config: device_bench::SoakConfig,
        /// Print one JSON object.
        #[arg(long)]
        json: bool,
    },
    /// The GPU trainer stand-in (issue 29): a kernel on the trainer's stream
    /// reads each batch and takes --step-ms, fed by the device sampler
    /// (prefetching) and by a host gather into pinned memory copied to the
    /// device before each step; steps/s and data-wait share per batch size
    /// and window length.
    TrainBench {
        /// Device: cuda or cpu-device (see device-soak).
        #[arg(long, default_value = "cuda")]
        backend: String,
        #[command(flatten)]
        config: device_bench::TrainConfig,
        /// Print one JSON object.
        #[arg(long)]
        json: bool,
    },
    #[command(hide = true)]
    DeviceSoakWriter {
        #[arg(long)]
        table: String,
        #[arg(long)]
        id: u64,
        #[arg(long, value_parser = seconds_arg)]
        seconds: f64,
    },
    #[command(hide = true)]
    DemoActor {
        #[arg(long)]
        table: String,
        #[arg(long)]
        id: u64,
        #[arg(long, value_parser = seconds_arg)]
        seconds: f64,
        #[arg(long)]
        seed: u64,
    },
    #[command(hide = true)]
    DemoTrainer {
        #[arg(long)]
        table: String,
        #[arg(long, value_parser = seconds_arg)]
        seconds: f64,
        #[arg(long)]
        batch: usize,
        #[arg(long)]
        window: u64,
    },
    #[command(hide = true)]
    BenchWriter {
        #[arg(long)]
        table: String,
        #[arg(long)]
        steps: u64,
        #[arg(long)]
        step_bytes: u64,
        #[arg(long)]
        count: u64,
        #[arg(long, default_value_t = 1)]
        insert_batch: u64,
        #[arg(long, default_value_t = 0)]
        start_at_ns: u64,
    },
    #[command(hide = true)]
    BenchSampler {
        #[arg(long)]
        table: String,
        #[arg(long)]
        batches: u64,
        #[arg(long)]
        batch: usize,
        #[arg(long, allow_hyphen_values = true)]
        window_offset: i64,
        #[arg(long)]
        window_len: u64,
        #[arg(long)]
        random_offsets: bool,
        #[arg(long, default_value_t = 0)]
        until_inserts: u64,
        #[arg(long, default_value_t = 0)]
        start_at_ns: u64,
    },
}

#[derive(Subcommand)]
enum ClusterCommand {
    /// Starts N shard servers on this machine from one table config, writes
    /// the cluster file and prints it with the token; Ctrl-C stops them all.
    Up(cluster_local::ClusterUpArgs),
}

#[derive(Subcommand)]
enum ConfigCommand {
    /// Prints a commented config that runs as it is: `serve` (a table for
    /// `gear serve --config`), `tables` (a server of several tables, with
    /// metrics) or `cluster` (a cluster file).
    Example {
        /// `serve`, `tables` or `cluster`.
        #[arg(default_value = "serve", value_parser = ["serve", "tables", "cluster"])]
        kind: String,
    },
}

/// Longest run any `--seconds` flag accepts (about 31 years): anything
/// longer is a typo, and `Duration` cannot hold much more.
const MAX_SECONDS: f64 = 1e9;

/// Parses a `--seconds` value: a finite number of seconds, 0 < s <= 1e9.
fn seconds_arg(text: &str) -> std::result::Result<f64, String> {
    let s: f64 = text.trim().parse().map_err(|_| format!("`{text}` is not a number of seconds"))?;
    if !s.is_finite() || s <= 0.0 || s > MAX_SECONDS {
        return Err(format!("{text} seconds: expected a finite number of seconds above 0 and at most {MAX_SECONDS:e}"));
    }
    Ok(s)
}

/// Parses a number of seconds that may be 0 (`--wait 0`: do not wait).
fn seconds_or_zero(text: &str) -> std::result::Result<f64, String> {
    match text.trim().parse::<f64>() {
        Ok(0.0) => Ok(0.0),
        _ => seconds_arg(text),
    }
}

fn positive_seconds(seconds: f64) -> std::result::Result<Duration, ExitCode> {
    Duration::try_from_secs_f64(seconds).map_err(|_| {
        eprintln!("error: --seconds must be a positive number, got {seconds}");
        ExitCode::from(2)
    })
}

/// Prints what the libraries log on stderr: warnings and errors, unless
/// `GEAR_LOG` asks for more (`GEAR_LOG=info`, `GEAR_LOG=gear_net=debug`;
/// tracing-subscriber's filter syntax).
fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("GEAR_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .without_time()
        .with_target(false)
        .try_init();
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging();
    // Graceful: the command stops in order at the first SIGINT/SIGTERM
    // (closing its table, printing its summary); immediate: it cleans up
    // and exits at once. See signals.rs.
    let mode = match &cli.command {
        Command::Bench { .. } | Command::DeviceSoak { .. } => Some(signals::Mode::Immediate),
        Command::Demo { .. } | Command::Serve { dry_run: false, .. } | Command::Cluster { .. } => {
            Some(signals::Mode::Graceful)
        }
        Command::DemoActor { .. }
        | Command::DemoTrainer { .. }
        | Command::BenchWriter { .. }
        | Command::BenchSampler { .. }
        | Command::DeviceSoakWriter { .. } => {
            signals::as_child();
            None
        }
        _ => None,
    };
    if let Some(mode) = mode {
        signals::install(mode);
    }
    let result = match cli.command {
        Command::Demo { actors, threads, seconds, capacity, batch, window, cluster } => {
            let duration = match positive_seconds(seconds) {
                Ok(d) => d,
                Err(code) => return code,
            };
            if let Some(file) = cluster {
                return finish(cluster_demo::run(&file, duration, actors.max(1), batch as u64));
            }
            let config = DemoConfig { actors, threads, duration, capacity, batch, window, ..DemoConfig::default() };
            let mut progress = Progress::new(true);
            let summary = run_demo(&config, &mut progress);
            // The summary starts on a line of its own, after the last
            // progress line (redrawn in place on a terminal) and any ^C.
            progress.end_line();
            summary.map(|s| {
                let who = |pid: u32| if pid == 0 { "thread".to_owned() } else { format!("pid {pid}") };
                let interrupted = if s.interrupted { ", stopped by a signal" } else { "" };
                println!("gear demo summary ({:.1} s{interrupted})", s.seconds);
                for a in &s.actors {
                    println!(
                        "  actor   {:>10}: {:>6} episodes  {:>6.2} GB/s",
                        who(a.pid),
                        a.episodes,
                        a.bytes as f64 / a.seconds / 1e9
                    );
                }
                let t = &s.trainer;
                println!(
                    "  trainer {:>10}: {:>6} batches   {:>6.2} GB/s  ({} rows checked, {} priority updates)",
                    who(t.pid),
                    t.batches,
                    t.bytes as f64 / t.seconds / 1e9,
                    t.rows_checked,
                    t.priority_updates
                );
                println!(
                    "  total              : {} episodes written ({:.2} GB/s), {} evicted, {} batches sampled ({:.2} GB/s)",
                    s.episodes(),
                    s.write_gb_per_s(),
                    s.evictions,
                    t.batches,
                    s.sample_gb_per_s()
                );
            })
        }
        Command::Bench { config, shards, json, data_plane, .. } if shards > 0 => {
            crate::cluster_bench::run_cluster_bench(&config, shards, data_plane, !json).map(|r| {
                if json {
                    println!("{}", serde_json::to_string(&r).expect("report serialises"));
                    return;
                }
                println!(
                    "{} shard servers on loopback, {} B per trajectory, data plane {}, {} batch(es) in flight",
                    r.shards, r.trajectory_bytes, r.data_plane, r.batches_in_flight
                );
                println!(
                    "remote insert  {:8.3} GB/s ({:.0} traj/s)   plain TCP stream {:8.3} GB/s   ratio {:.2}",
                    r.insert_gb_per_s,
                    r.insert_traj_per_s,
                    r.tcp_insert_gb_per_s,
                    r.insert_gb_per_s / r.tcp_insert_gb_per_s
                );
                println!(
                    "remote sample  {:8.3} GB/s ({:.0} batches/s)       plain TCP stream {:8.3} GB/s   ratio {:.2}",
                    r.sample_gb_per_s,
                    r.sample_batches_per_s,
                    r.tcp_sample_gb_per_s,
                    r.sample_gb_per_s / r.tcp_sample_gb_per_s
                );
                println!(
                    "CPU s per GB   insert {:.2} (plain {:.2}, ratio {:.2})   sample {:.2} (plain {:.2}, ratio {:.2})",
                    r.insert_cpu_s_per_gb,
                    r.tcp_insert_cpu_s_per_gb,
                    r.tcp_insert_cpu_s_per_gb / r.insert_cpu_s_per_gb,
                    r.sample_cpu_s_per_gb,
                    r.tcp_sample_cpu_s_per_gb,
                    r.tcp_sample_cpu_s_per_gb / r.sample_cpu_s_per_gb
                );
            })
        }
        Command::Bench { config, writers, json, backend, checkpoint, checkpoint_dir, rounds, .. } => {
            if checkpoint {
                let dir = checkpoint_dir.unwrap_or_else(std::env::temp_dir);
                if !dir.is_dir() {
                    eprintln!(
                        "error: --checkpoint-dir {}: no such directory (create it first; the bench creates nothing \
                         it would leave behind)",
                        dir.display()
                    );
                    return ExitCode::from(2);
                }
                return finish(persist::run_checkpoint_bench(&config, &dir, rounds).map(|r| {
                    if json {
                        println!("{}", serde_json::to_string(&r).expect("report serialises"));
                        return;
                    }
                    println!("{r}");
                }));
            }
            if backend == "cuda" {
                return cuda_bench(&config, json);
            }
            if backend != "cpu" {
                eprintln!("error: unknown backend `{backend}` (expected cpu or cuda)");
                return ExitCode::from(2);
            }
            let mut progress = Progress::new(!json);
            let report = if writers == 0 {
                run_bench(&config, &mut progress)
            } else {
                run_bench_processes(&config, writers, &mut progress)
            };
            report.map(|r| {
                if json {
                    println!("{}", serde_json::to_string(&r).expect("report serialises"));
                    return;
                }
                let who =
                    if r.writers == 0 { "1 process".to_owned() } else { format!("{} writer processes", r.writers) };
                println!(
                    "backend {} sampler {} ({who}, {} B per trajectory)",
                    r.backend, r.sampler, r.trajectory_bytes
                );
                println!(
                    "  insert : {:>10.0} traj/s {:>7.2} GB/s ({:.2} x memcpy)",
                    r.insert_traj_per_s, r.insert_gb_per_s, r.insert_vs_memcpy
                );
                println!(
                    "  sample : {:>10.0} traj/s {:>7.2} GB/s ({:.2} x memcpy)",
                    r.sample_traj_per_s, r.sample_gb_per_s, r.sample_vs_memcpy
                );
                println!("  memcpy : {:>25.2} GB/s (trajectory-sized writes, the insert reference)", r.memcpy_gb_per_s);
                println!(
                    "  memcpy : {:>25.2} GB/s (the bytes a batch copies, the sample reference)",
                    r.sample_memcpy_gb_per_s
                );
                if let (Some(m2), Some(x)) = (r.memcpy_2t_gb_per_s, r.insert_vs_memcpy_2t) {
                    println!("  memcpy, 2 threads : {m2:>14.2} GB/s (insert {x:.2} x)");
                }
                println!(
                    "  random 64 B line reads : {:>6.1} M/s, {} thread(s) (sampled rows/s per line: {:.3})",
                    r.random_line_reads_per_s / 1e6,
                    if r.writers > 0 { 1 } else { r.sampler_threads.max(1) },
                    r.sample_traj_per_s / r.random_line_reads_per_s
                );
            })
        }
        Command::Serve { config, dry_run: true, .. } => serve::dry_run(&config),
        Command::Serve { config, seconds, quiet, persistence, .. } => {
            serve::serve(&config, &serve::ServeOptions { seconds, quiet }, &persistence)
        }
        Command::ClusterInfo { cluster, wait, watch, interval, count } => {
            let interval = match positive_seconds(interval) {
                Ok(d) => d,
                Err(code) => return code,
            };
            let wait = Duration::from_secs_f64(wait);
            let options = crate::cluster_config::InfoOptions { wait, watch, interval, count };
            crate::cluster_config::cluster_info(&cluster, options)
        }
        Command::Cluster { command: ClusterCommand::Up(args) } => cluster_local::cluster_up(&args),
        Command::Config { command: ConfigCommand::Example { kind } } => {
            print!("{}", examples::by_kind(&kind));
            Ok(())
        }
        Command::Inspect(target) => inspect::inspect(&target),
        Command::Sample(args) => inspect::sample(&args),
        Command::Import(args) => return import::import(&args),
        Command::Export(args) => return import::export(&args),
        Command::DeviceSoak { backend, config, json } => return device_soak(&backend, &config, json),
        Command::TrainBench { backend, config, json } => return train_bench(&backend, &config, json),
        Command::DeviceSoakWriter { table, id, seconds } => device_bench::soak_writer(&table, id, seconds),
        Command::DemoActor { table, id, seconds, seed } => crate::demo::actor_process(&table, id, seconds, seed),
        Command::DemoTrainer { table, seconds, batch, window } => {
            crate::demo::trainer_process(&table, seconds, batch, window)
        }
        Command::BenchWriter { table, steps, step_bytes, count, insert_batch, start_at_ns } => {
            crate::bench::writer_process(&table, count, steps, step_bytes, insert_batch, start_at_ns)
        }
        Command::BenchSampler {
            table,
            batches,
            batch,
            window_offset,
            window_len,
            random_offsets,
            until_inserts,
            start_at_ns,
        } => {
            let config = BenchConfig { batch, window_offset, window_len, random_offsets, ..BenchConfig::default() };
            crate::bench::sampler_process(&table, batches, &config, until_inserts, start_at_ns)
        }
    };
    finish(result)
}

/// Runs `f` with the device `backend` names (`cuda`, `cpu-device`).
macro_rules! with_backend {
    ($backend:expr, |$dev:ident, $api:ident| $body:expr) => {{
        match $backend {
            "cpu-device" => match device_bench::cpu_device() {
                Ok($dev) => {
                    type $api = gear_device::CpuDeviceApi;
                    $body
                }
                Err(e) => Err(e),
            },
            #[cfg(feature = "cuda")]
            "cuda" => match gear_cuda::CudaDevice::new(0).and_then(|d| d.warm_up().map(|()| d)) {
                Ok($dev) => {
                    type $api = gear_cuda::CudaApi;
                    $body
                }
                Err(e) => Err(gear_api::Error::from(e)),
            },
            #[cfg(not(feature = "cuda"))]
            "cuda" => Err(gear_api::Error::Config("this gear was built without the `cuda` feature".into())),
            other => Err(gear_api::Error::Config(format!("unknown device `{other}` (expected cuda or cpu-device)"))),
        }
    }};
}

fn device_soak(backend: &str, config: &device_bench::SoakConfig, json: bool) -> ExitCode {
    let report = with_backend!(backend, |dev, Api| device_bench::run_soak::<Api>(&dev, config));
    finish(report.and_then(|r| {
        if json {
            println!("{}", serde_json::to_string(&r).expect("report serialises"));
        } else {
            println!(
                "device soak on {} ({:.1} s, {} trajectories written, {} evictions)",
                r.device, r.seconds, r.trajectories_written, r.evictions
            );
            for g in &r.rings {
                println!(
                    "  ring {}: {} batches ({} on the device), {} rows checked, {} rows redrawn, {} timeouts, {} torn",
                    g.ring, g.batches, g.device_batches, g.rows_checked, g.rows_redrawn, g.timeouts, g.torn
                );
            }
            println!("  bad rows: {}", r.bad_rows);
        }
        r.verdict()
    }))
}

fn train_bench(backend: &str, config: &device_bench::TrainConfig, json: bool) -> ExitCode {
    let report = with_backend!(backend, |dev, Api| device_bench::run_train::<Api>(&dev, config, !json));
    finish(report.map(|r| {
        if json {
            println!("{}", serde_json::to_string(&r).expect("report serialises"));
            return;
        }
        println!(
            "trainer stand-in on {} (step {} ms{})",
            r.device,
            r.step_ms,
            if backend == "cpu-device" { "; CPU device: these are not GPU figures" } else { "" }
        );
        println!(
            "{:>6} {:>6} {:>12}  {:>26}  {:>26}",
            "batch", "window", "batch MB", "gear: steps/s (wait)", "host+copy: steps/s (wait)"
        );
        for pair in r.results.chunks(2) {
            let (g, h) = (&pair[0], &pair[1]);
            println!(
                "{:>6} {:>6} {:>12.1}  {:>17.1} ({:>5.1}%)  {:>17.1} ({:>5.1}%)",
                g.batch,
                g.window,
                g.batch_bytes as f64 / 1e6,
                g.steps_per_s,
                100.0 * g.data_wait_share,
                h.steps_per_s,
                100.0 * h.data_wait_share
            );
        }
        for (b, w) in &r.skipped {
            println!("{b:>6} {w:>6}  skipped (over --max-batch-mib)");
        }
    }))
}

fn finish(result: Result<()>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        // A network or backend error says what it is; "backend: " in front
        // would only be noise on a command line.
        Err(gear_api::Error::Backend(e)) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(feature = "cuda")]
fn cuda_bench(c: &BenchConfig, json: bool) -> ExitCode {
    let params = gear_cuda::bench::CudaBenchParams {
        // obs, then action (i32) and reward (f32) as 4-byte columns.
        step_bytes: vec![c.step_bytes, 4, 4],
        max_len: c.steps,
        capacity: c.capacity,
        batch: c.batch,
        window: if c.window_len == 0 { c.steps } else { c.window_len },
        ..Default::default()
    };
    let report = gear_cuda::bench::run_bench(&params).map_err(gear_api::Error::from).and_then(|r| {
        let e2e = crate::bench::run_cuda_sample_bench(c, &[(1, 0), (2, 0), (2, c.capacity as usize)])?;
        Ok((r, e2e))
    });
    match report {
        Ok((r, e2e)) if json => {
            let v = serde_json::json!({
                "backend": "cuda",
                "device": r.device,
                "table_memory": r.table_memory,
                "batch": r.params.batch,
                "batch_bytes": r.batch_bytes,
                "pinned_h2d_copy_gb_per_s": r.pinned_copy.gb_per_s,
                "zero_copy_gb_per_s": r.zero_copy.gb_per_s,
                "device_cache_gb_per_s": r.device_cache.gb_per_s,
                "d2d_copy_gb_per_s": r.device_copy.gb_per_s,
                "outputs_match": r.outputs_match,
                "sample": e2e,
            });
            println!("{v}");
            ExitCode::SUCCESS
        }
        Ok((r, e2e)) => {
            println!("{r}");
            for e in &e2e {
                println!(
                    "cuda_sample ring {} cache {:<5} {:>9.3} ms/batch {:>8.2} GB/s ({:.0} batches/s, {:.0}% rows from \
                     the device cache; {} batches)",
                    e.ring,
                    e.cache_entries,
                    e.ms_per_batch,
                    e.gb_per_s,
                    e.batches_per_s,
                    100.0 * e.cached_share,
                    e.batches
                );
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(not(feature = "cuda"))]
fn cuda_bench(_: &BenchConfig, _: bool) -> ExitCode {
    eprintln!("error: this gear was built without the `cuda` feature (cargo build --release --features cuda)");
    ExitCode::FAILURE
}
