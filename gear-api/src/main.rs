//! The `gear` command: `gear demo` runs the main job on the CPU default;
//! `gear bench` measures insert and sample throughput against memcpy.

use clap::{Parser, Subcommand};
use gear_api::bench::{run_bench, BenchConfig};
use gear_api::demo::{run_demo, DemoConfig};
use gear_api::progress::Progress;
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
    /// Actors write Atari-shaped episodes while a trainer samples windows
    /// with prioritized replay and updates priorities.
    Demo {
        /// Actor threads.
        #[arg(long, default_value_t = 3)]
        actors: usize,
        /// Seconds to run.
        #[arg(long, default_value_t = 5.0)]
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
    },
    /// Insert and sample throughput, with a memcpy of the same bytes as the
    /// reference.
    Bench {
        /// Steps per trajectory (T).
        #[arg(long, default_value_t = 128)]
        steps: u64,
        /// Bytes of the `obs` column per step.
        #[arg(long, default_value_t = 4096)]
        step_bytes: u64,
        /// Table capacity in trajectories.
        #[arg(long, default_value_t = 2048)]
        capacity: u64,
        /// Trajectories to insert.
        #[arg(long, default_value_t = 4096)]
        inserts: u64,
        /// Rows per batch.
        #[arg(long, default_value_t = 32)]
        batch: usize,
        /// Batches to sample.
        #[arg(long, default_value_t = 400)]
        batches: u64,
        /// Sampling strategy: uniform, prioritized, fifo, lifo, max-heap, min-heap.
        #[arg(long, default_value = "uniform")]
        sampler: String,
        /// Window start (negative: from the end).
        #[arg(long, default_value_t = 0, allow_hyphen_values = true)]
        window_offset: i64,
        /// Window length; 0 = whole trajectories.
        #[arg(long, default_value_t = 0)]
        window_len: u64,
        /// Print one JSON object instead of a table.
        #[arg(long)]
        json: bool,
        /// Backend: cpu, or cuda (zero-copy gather, device-cache gather and a
        /// device-to-device copy of the same bytes; needs the `cuda` feature
        /// and a GPU).
        #[arg(long, default_value = "cpu")]
        backend: String,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Demo { actors, seconds, capacity, batch, window } => {
            if !(seconds.is_finite() && seconds > 0.0) {
                eprintln!("error: --seconds must be a positive number, got {seconds}");
                return ExitCode::from(2);
            }
            let config = DemoConfig {
                actors,
                duration: Duration::from_secs_f64(seconds),
                capacity,
                batch,
                window,
                ..DemoConfig::default()
            };
            run_demo(&config, &mut Progress::new(true)).map(|s| {
                println!("gear demo summary ({:.1} s)", s.seconds);
                println!("  trajectories written : {}", s.trajectories);
                println!("  evicted              : {}", s.evictions);
                println!("  batches sampled      : {} ({} rows checked)", s.batches, s.rows_checked);
                println!("  priority updates     : {}", s.priority_updates);
                println!("  write                : {:.2} GB/s", s.write_gb_per_s);
                println!("  sample + gather      : {:.2} GB/s", s.sample_gb_per_s);
            })
        }
        Command::Bench {
            steps,
            step_bytes,
            capacity,
            inserts,
            batch,
            batches,
            sampler,
            window_offset,
            window_len,
            json,
            backend,
        } => {
            if backend == "cuda" {
                return cuda_bench(steps, step_bytes, capacity, batch, window_len, json);
            }
            if backend != "cpu" {
                eprintln!("error: unknown backend `{backend}` (expected cpu or cuda)");
                return ExitCode::from(2);
            }
            let config = BenchConfig {
                steps,
                step_bytes,
                capacity,
                inserts,
                batch,
                batches,
                sampler,
                window_offset,
                window_len,
                ..BenchConfig::default()
            };
            run_bench(&config, &mut Progress::new(!json)).map(|r| {
                if json {
                    println!("{}", serde_json::to_string(&r).expect("report serialises"));
                } else {
                    println!("backend {} sampler {} ({} B per trajectory)", r.backend, r.sampler, r.trajectory_bytes);
                    println!(
                        "  insert : {:>10.0} traj/s {:>7.2} GB/s ({:.2} x memcpy)",
                        r.insert_traj_per_s, r.insert_gb_per_s, r.insert_vs_memcpy
                    );
                    println!(
                        "  sample : {:>10.0} traj/s {:>7.2} GB/s ({:.2} x memcpy)",
                        r.sample_traj_per_s, r.sample_gb_per_s, r.sample_vs_memcpy
                    );
                    println!("  memcpy : {:>25.2} GB/s", r.memcpy_gb_per_s);
                }
            })
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(feature = "cuda")]
fn cuda_bench(steps: u64, step_bytes: u64, capacity: u64, batch: usize, window_len: u64, json: bool) -> ExitCode {
    let params = gear_cuda::bench::CudaBenchParams {
        // obs, then action (i32) and reward (f32) as 4-byte columns.
        step_bytes: vec![step_bytes, 4, 4],
        max_len: steps,
        capacity,
        batch,
        window: if window_len == 0 { steps } else { window_len },
        ..Default::default()
    };
    match gear_cuda::bench::run_bench(&params) {
        Ok(r) if json => {
            let v = serde_json::json!({
                "backend": "cuda",
                "device": r.device,
                "batch_bytes": r.batch_bytes,
                "zero_copy_gb_per_s": r.zero_copy.gb_per_s,
                "device_cache_gb_per_s": r.device_cache.gb_per_s,
                "d2d_copy_gb_per_s": r.device_copy.gb_per_s,
                "outputs_match": r.outputs_match,
            });
            println!("{v}");
            ExitCode::SUCCESS
        }
        Ok(r) => {
            println!("{r}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(not(feature = "cuda"))]
fn cuda_bench(_: u64, _: u64, _: u64, _: usize, _: u64, _: bool) -> ExitCode {
    eprintln!("error: this gear was built without the `cuda` feature (cargo build --release --features cuda)");
    ExitCode::FAILURE
}
