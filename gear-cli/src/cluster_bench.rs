//! `gear bench --shards N`: N `gear serve` processes on loopback, remote
//! writers (one per shard) inserting through gRPC, one trainer sampling
//! across every shard, and beside them a plain TCP loopback stream of the
//! same number of bytes, measured in the same run.

use crate::bench::BenchConfig;
use gear_api::{Error, Result};
use gear_core::WindowSpec;
use gear_net::{ClusterClient, ClusterConfig, ClusterSample, DataPlane, RemoteTrajectory, WriteTarget};
use serde::Serialize;
use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// What `gear bench --shards N` reports.
#[derive(Clone, Debug, Serialize)]
pub struct ClusterBenchReport {
    /// Shard server processes.
    pub shards: usize,
    /// Bytes of one trajectory.
    pub trajectory_bytes: u64,
    /// Remote inserts: trajectories per second, and GB/s of step bytes.
    pub insert_traj_per_s: f64,
    /// Step bytes inserted per second.
    pub insert_gb_per_s: f64,
    /// A plain TCP loopback stream of the inserted bytes.
    pub tcp_insert_gb_per_s: f64,
    /// Remote sampling: batch bytes received per second.
    pub sample_gb_per_s: f64,
    /// A plain TCP loopback stream of the sampled bytes.
    pub tcp_sample_gb_per_s: f64,
    /// How the sampled windows travelled (`--data-plane`).
    pub data_plane: String,
    /// Remote sampling: batches per second.
    pub sample_batches_per_s: f64,
}

/// Parses `--data-plane`: `gather` (each shard gathers its rows),
/// `byte-range` (the trainer reads byte ranges: RDMA where it runs, else
/// TCP), `byte-range-tcp`, or `auto` (the client's default).
pub fn parse_data_plane(s: &str) -> std::result::Result<DataPlane, String> {
    match s {
        "gather" => Ok(DataPlane::ShardGather),
        "byte-range" => Ok(DataPlane::ByteRange),
        "byte-range-tcp" => Ok(DataPlane::ByteRangeTcp),
        "auto" => Ok(DataPlane::Auto),
        other => Err(format!("data plane `{other}`: expected gather, byte-range, byte-range-tcp or auto")),
    }
}

fn net(e: gear_net::Error) -> Error {
    Error::Backend(Box::new(e))
}

fn io(e: std::io::Error) -> Error {
    Error::Config(format!("bench: {e}"))
}

/// Shard processes, killed when dropped.
struct Servers(Vec<Child>);

impl Drop for Servers {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// The bench's directory (shard configs and table files), removed when
/// dropped: on success and on every error, after the servers are gone.
struct BenchDir(std::path::PathBuf);

impl Drop for BenchDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// GB/s of a plain TCP stream of `total` bytes in writes of `chunk` bytes.
fn tcp_stream_gb_per_s(total: u64, chunk: usize) -> Result<f64> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").map_err(io)?;
    let addr = listener.local_addr().map_err(io)?;
    let reader = std::thread::spawn(move || -> std::io::Result<u64> {
        let (mut s, _) = listener.accept()?;
        let mut buf = vec![0u8; 1 << 20];
        let mut got = 0u64;
        loop {
            let n = s.read(&mut buf)?;
            if n == 0 {
                return Ok(got);
            }
            got += n as u64;
        }
    });
    let mut s = std::net::TcpStream::connect(addr).map_err(io)?;
    s.set_nodelay(true).map_err(io)?;
    let data = vec![7u8; chunk.max(1)];
    let start = Instant::now();
    let mut sent = 0u64;
    while sent < total {
        let n = (total - sent).min(data.len() as u64) as usize;
        s.write_all(&data[..n]).map_err(io)?;
        sent += n as u64;
    }
    drop(s);
    let got = reader.join().map_err(|_| Error::Config("tcp reader panicked".into()))?.map_err(io)?;
    let secs = start.elapsed().as_secs_f64();
    if got != total {
        return Err(Error::Config(format!("tcp stream moved {got} of {total} bytes")));
    }
    Ok(total as f64 / secs / 1e9)
}

/// Most shard servers one bench starts on this machine: each is a process
/// with its own table, so more only measures the machine running out.
pub const MAX_BENCH_SHARDS: usize = 64;

/// Runs the cluster bench.
pub fn run_cluster_bench(c: &BenchConfig, shards: usize, data_plane: DataPlane) -> Result<ClusterBenchReport> {
    if shards > MAX_BENCH_SHARDS {
        return Err(Error::Config(format!(
            "--shards {shards} is above the {MAX_BENCH_SHARDS} shard servers one bench starts on one machine"
        )));
    }
    let bench_dir = BenchDir(std::env::temp_dir().join(format!("gear-cluster-bench-{}", std::process::id())));
    let dir = bench_dir.0.clone();
    std::fs::create_dir_all(&dir).map_err(io)?;
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    let token = format!("bench-{:032x}", nanos ^ u128::from(std::process::id()));
    let exe = std::env::current_exe().map_err(io)?;
    let mut servers = Servers(Vec::new());
    let mut addrs = Vec::new();
    for s in 0..shards {
        let config = dir.join(format!("shard{s}.toml"));
        let text = format!(
            "name = \"gear-cluster-bench-{pid}-{s}\"\ndir = \"{dir}\"\nmax_len = {t}\ncapacity = {cap}\n\
             [[columns]]\nname = \"obs\"\ndtype = \"u8\"\nshape = [{b}]\n[grpc]\nlisten = \"127.0.0.1:0\"\nshard = {s}\n",
            pid = std::process::id(),
            dir = dir.display(),
            t = c.steps,
            cap = c.capacity,
            b = c.step_bytes
        );
        std::fs::write(&config, text).map_err(io)?;
        let mut child = Command::new(&exe)
            .args(["serve", "--config"])
            .arg(&config)
            .env("GEAR_TOKEN", &token)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .map_err(io)?;
        let stdout = child.stdout.take();
        servers.0.push(child);
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in stdout.into_iter().flat_map(|o| BufReader::new(o).lines().map_while(|l| l.ok())) {
                if let Some(rest) = line.strip_prefix("grpc listening on ") {
                    let _ = tx.send(rest.split_whitespace().next().unwrap_or_default().to_owned());
                }
            }
        });
        addrs.push(
            rx.recv_timeout(Duration::from_secs(30))
                .map_err(|_| Error::Config(format!("shard {s} did not start listening")))?,
        );
    }
    let trajectory_bytes = c.steps * c.step_bytes;
    let one = RemoteTrajectory {
        steps: c.steps,
        columns: vec![(0..trajectory_bytes).map(|i| (i % 251) as u8).collect()],
        priority: None,
    };
    // Remote inserts: one writer thread per shard, batches of 16.
    let per_writer = c.inserts.div_ceil(shards as u64);
    let start = Instant::now();
    let writers: Vec<_> = (0..shards)
        .map(|s| {
            let (addrs, token, one) = (addrs.clone(), token.clone(), one.clone());
            std::thread::spawn(move || -> gear_net::Result<u64> {
                let client = ClusterClient::new(ClusterConfig::new(addrs, token))?;
                let mut done = 0;
                while done < per_writer {
                    let n = (per_writer - done).min(16);
                    client.insert(WriteTarget::Shard(s), vec![one.clone(); n as usize], 0)?;
                    done += n;
                }
                Ok(done)
            })
        })
        .collect();
    let mut inserted = 0;
    for w in writers {
        inserted += w.join().map_err(|_| Error::Config("writer panicked".into()))?.map_err(net)?;
    }
    let insert_secs = start.elapsed().as_secs_f64();
    let insert_bytes = inserted * trajectory_bytes;
    let tcp_insert = tcp_stream_gb_per_s(insert_bytes, (16 * trajectory_bytes) as usize)?;

    let mut config = ClusterConfig::new(addrs, token);
    config.data_plane = data_plane;
    let client = ClusterClient::new(config).map_err(net)?;
    let window = if c.window_len == 0 { c.steps } else { c.window_len };
    let request = ClusterSample { rows: c.batch as u64, window: WindowSpec::last(window), columns: vec![] };
    client.sample(&request).map_err(net)?;
    let start = Instant::now();
    let mut sample_bytes = 0u64;
    for _ in 0..c.batches {
        let b = client.sample(&request).map_err(net)?;
        if !b.lost.is_empty() {
            return Err(Error::Config(format!("shards lost during the bench: {:?}", b.lost)));
        }
        sample_bytes += b.columns.iter().map(|c| c.len() as u64).sum::<u64>();
    }
    let sample_secs = start.elapsed().as_secs_f64();
    let tcp_sample = tcp_stream_gb_per_s(sample_bytes, (sample_bytes / c.batches.max(1)) as usize)?;
    drop(servers);
    drop(bench_dir);
    Ok(ClusterBenchReport {
        shards,
        trajectory_bytes,
        insert_traj_per_s: inserted as f64 / insert_secs,
        insert_gb_per_s: insert_bytes as f64 / insert_secs / 1e9,
        tcp_insert_gb_per_s: tcp_insert,
        sample_gb_per_s: sample_bytes as f64 / sample_secs / 1e9,
        tcp_sample_gb_per_s: tcp_sample,
        data_plane: match client.data_plane_for(&request) {
            Some(kind) => format!("byte-range over {}", kind.name()),
            None => "shard-gather".into(),
        },
        sample_batches_per_s: c.batches as f64 / sample_secs,
    })
}
