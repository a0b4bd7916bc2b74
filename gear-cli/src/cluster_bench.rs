//! `gear bench --shards N`: N `gear serve` processes on loopback, remote
//! writers (one per shard) inserting through gRPC, one trainer sampling
//! across every shard (`--sampler-threads` batches in flight), and beside them a plain TCP loopback stream of the
//! same number of bytes, measured in the same run.

use crate::bench::BenchConfig;
use gear_api::{Error, Result};
use gear_net::{BatchRows, ClusterClient, ClusterConfig, ClusterSample, DataPlane, RemoteTrajectory, WriteTarget};
use serde::Serialize;
use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
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
    /// CPU seconds per GB inserted, every process counted (the client's
    /// threads and every shard server); a shared machine's load changes
    /// throughput far more than it changes this.
    pub insert_cpu_s_per_gb: f64,
    /// CPU seconds per GB of the plain stream beside the inserts (sender
    /// and receiver).
    pub tcp_insert_cpu_s_per_gb: f64,
    /// CPU seconds per GB sampled, every process counted.
    pub sample_cpu_s_per_gb: f64,
    /// CPU seconds per GB of the plain stream beside the samples.
    pub tcp_sample_cpu_s_per_gb: f64,
    /// How the sampled windows travelled (`--data-plane`).
    pub data_plane: String,
    /// Remote sampling: batches per second.
    pub sample_batches_per_s: f64,
    /// Batches drawn at once (`--sampler-threads`), each by its own thread
    /// through the one client, as a trainer's data-loader threads would.
    pub batches_in_flight: u64,
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

/// CPU seconds of a clock (`CLOCK_THREAD_CPUTIME_ID`, `CLOCK_PROCESS_CPUTIME_ID`).
fn cpu_seconds(clock: libc::clockid_t) -> f64 {
    let mut t = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `t` is a valid, writable timespec; the clock ids are constants.
    if unsafe { libc::clock_gettime(clock, &mut t) } != 0 {
        return 0.0;
    }
    t.tv_sec as f64 + t.tv_nsec as f64 * 1e-9
}

/// CPU seconds (user and system) process `pid` has used, from
/// `/proc/<pid>/stat`; 0 where that cannot be read.
fn process_cpu_seconds(pid: u32) -> f64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { return 0.0 };
    // The command name (field 2) may hold spaces: count from its `)`.
    let fields: Vec<&str> = stat.rsplit_once(')').map_or("", |(_, rest)| rest).split_whitespace().collect();
    let ticks = |i: usize| fields.get(i).and_then(|f| f.parse::<u64>().ok()).unwrap_or(0);
    // SAFETY: sysconf with a valid name has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    // utime and stime are fields 14 and 15, that is 11 and 12 after `)`.
    (ticks(11) + ticks(12)) as f64 / hz
}

/// CPU seconds used so far by this process and the shard servers.
fn cluster_cpu_seconds(servers: &Servers) -> f64 {
    cpu_seconds(libc::CLOCK_PROCESS_CPUTIME_ID) + servers.0.iter().map(|c| process_cpu_seconds(c.id())).sum::<f64>()
}

fn net(e: gear_net::Error) -> Error {
    Error::Backend(Box::new(e))
}

fn io(e: std::io::Error) -> Error {
    Error::Config(format!("bench: {e}"))
}

/// Shard processes, killed when dropped (or when a signal ends the bench).
struct Servers(Vec<Child>, Vec<crate::signals::Registered>);

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

/// A plain TCP loopback connection the bench times beside every gRPC
/// round: [`PlainStream::transfer`] sends `n` bytes in writes of at most
/// `chunk`, and the receiver answers one byte once it has read them all, so
/// a transfer is timed end to end like a gRPC call.
struct PlainStream {
    stream: std::net::TcpStream,
    data: Vec<u8>,
    reader: Option<std::thread::JoinHandle<std::io::Result<()>>>,
    /// CPU nanoseconds the receiving thread spent on transfers.
    reader_cpu_ns: Arc<AtomicU64>,
    /// CPU seconds the sending side spent on transfers.
    sender_cpu: f64,
}

impl PlainStream {
    fn open(chunk: usize) -> Result<Self> {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").map_err(io)?;
        let addr = listener.local_addr().map_err(io)?;
        let reader_cpu_ns = Arc::new(AtomicU64::new(0));
        let cpu_ns = reader_cpu_ns.clone();
        let reader = std::thread::spawn(move || -> std::io::Result<()> {
            let (mut s, _) = listener.accept()?;
            s.set_nodelay(true)?;
            let mut buf = vec![0u8; 1 << 20];
            let mut want = [0u8; 8];
            // Each transfer: its length, then its bytes, then one byte back.
            while s.read_exact(&mut want).is_ok() {
                let started = cpu_seconds(libc::CLOCK_THREAD_CPUTIME_ID);
                let mut left = u64::from_le_bytes(want);
                while left > 0 {
                    let take = left.min(buf.len() as u64) as usize;
                    let n = s.read(&mut buf[..take])?;
                    if n == 0 {
                        return Err(std::io::ErrorKind::UnexpectedEof.into());
                    }
                    left -= n as u64;
                }
                s.write_all(&[1])?;
                let spent = cpu_seconds(libc::CLOCK_THREAD_CPUTIME_ID) - started;
                cpu_ns.fetch_add((spent * 1e9) as u64, Ordering::Relaxed);
            }
            Ok(())
        });
        let stream = std::net::TcpStream::connect(addr).map_err(io)?;
        stream.set_nodelay(true).map_err(io)?;
        Ok(PlainStream { stream, data: vec![7u8; chunk.max(1)], reader: Some(reader), reader_cpu_ns, sender_cpu: 0.0 })
    }

    /// Sends `n` bytes and waits for the receiver's answer; returns seconds.
    fn transfer(&mut self, n: u64) -> Result<f64> {
        let cpu = cpu_seconds(libc::CLOCK_THREAD_CPUTIME_ID);
        let start = Instant::now();
        self.stream.write_all(&n.to_le_bytes()).map_err(io)?;
        let mut sent = 0u64;
        while sent < n {
            let k = (n - sent).min(self.data.len() as u64) as usize;
            self.stream.write_all(&self.data[..k]).map_err(io)?;
            sent += k as u64;
        }
        let mut ack = [0u8; 1];
        self.stream.read_exact(&mut ack).map_err(io)?;
        let secs = start.elapsed().as_secs_f64();
        self.sender_cpu += cpu_seconds(libc::CLOCK_THREAD_CPUTIME_ID) - cpu;
        Ok(secs)
    }

    /// CPU seconds both ends have spent on transfers so far.
    fn cpu(&self) -> f64 {
        self.sender_cpu + self.reader_cpu_ns.load(Ordering::Relaxed) as f64 * 1e-9
    }
}

impl Drop for PlainStream {
    fn drop(&mut self) {
        let _ = self.stream.shutdown(std::net::Shutdown::Both);
        if let Some(r) = self.reader.take() {
            let _ = r.join();
        }
    }
}

/// Most shard servers one bench starts on this machine: each is a process
/// with its own table, so more only measures the machine running out.
pub const MAX_BENCH_SHARDS: usize = 64;

/// Runs the cluster bench, sampling through `data_plane`; progress lines go
/// to stderr when `show_progress`.
pub fn run_cluster_bench(
    c: &BenchConfig,
    shards: usize,
    data_plane: DataPlane,
    show_progress: bool,
) -> Result<ClusterBenchReport> {
    if c.inserts == 0 || c.batches == 0 || c.batch == 0 {
        return Err(Error::Config("--inserts, --batches and --batch must each be at least 1".into()));
    }
    // The same window as the one-table bench (--window-len, --window-offset).
    let window = crate::bench::window_for(c)?;
    if shards > MAX_BENCH_SHARDS {
        return Err(Error::Config(format!(
            "--shards {shards} is above the {MAX_BENCH_SHARDS} shard servers one bench starts on one machine"
        )));
    }
    // The shard tables live where `gear serve` puts them by default, in
    // shared memory: a table on a disk file would measure page writeback.
    let shm = std::path::Path::new("/dev/shm");
    let base = if shm.is_dir() { shm.to_path_buf() } else { std::env::temp_dir() };
    let bench_dir = BenchDir(base.join(format!("gear-cluster-bench-{}", std::process::id())));
    let dir = bench_dir.0.clone();
    std::fs::create_dir_all(&dir).map_err(io)?;
    let _remove_dir = crate::signals::remove_on_exit(dir.clone());
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    let token = format!("bench-{:032x}", nanos ^ u128::from(std::process::id()));
    let exe = std::env::current_exe().map_err(io)?;
    let mut servers = Servers(Vec::new(), Vec::new());
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
            .env(crate::serve::EXIT_WITH_PARENT, "1")
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .map_err(io)?;
        let stdout = child.stdout.take();
        servers.1.push(crate::signals::kill_on_exit(child.id()));
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
        columns: vec![(0..trajectory_bytes).map(|i| (i % 251) as u8).collect::<Vec<u8>>().into()],
        priority: None,
    };
    // Remote inserts in rounds: every shard gets 16 trajectories at once
    // (one insert stream per shard, all in flight together), then the
    // plain stream moves the same bytes. Interleaving the two keeps a
    // shared machine's changing load out of the ratio.
    let mut config = ClusterConfig::new(addrs, token);
    config.data_plane = data_plane;
    let client = ClusterClient::new(config).map_err(net)?;
    let per_round = 16 * shards as u64;
    let mut plain = PlainStream::open((16 * trajectory_bytes) as usize)?;
    let (mut inserted, mut insert_secs, mut tcp_insert_secs) = (0u64, 0.0, 0.0);
    let cpu_before = (cluster_cpu_seconds(&servers), plain.cpu());
    let mut progress = crate::progress::Progress::new(show_progress);
    progress.phase("remote insert (trajectories)", c.inserts);
    while inserted < c.inserts {
        let n = (c.inserts - inserted).min(per_round);
        let batch = vec![one.clone(); n as usize];
        let start = Instant::now();
        client.insert(WriteTarget::RoundRobin, batch, 0).map_err(net)?;
        insert_secs += start.elapsed().as_secs_f64();
        tcp_insert_secs += plain.transfer(n * trajectory_bytes)?;
        inserted += n;
        progress.tick(inserted);
    }
    progress.done();
    let insert_bytes = inserted * trajectory_bytes;
    let tcp_insert_cpu = plain.cpu() - cpu_before.1;
    let insert_cpu = cluster_cpu_seconds(&servers) - cpu_before.0 - tcp_insert_cpu;

    let request = ClusterSample { rows: c.batch as u64, window, columns: vec![], random_start: false };
    // Each batch in flight has buffers of its own, reused every round, and
    // the shards' replies are decoded straight into them: what a trainer's
    // data loaders do (`sample_into`).
    let in_flight = c.sampler_threads.max(1);
    let sizes = client.column_bytes(&request).map_err(net)?;
    let batch_bytes: u64 = sizes.iter().map(|&n| n as u64).sum();
    let mut buffers: Vec<(Vec<Vec<u8>>, BatchRows)> =
        (0..in_flight).map(|_| (sizes.iter().map(|&n| vec![0u8; n]).collect(), BatchRows::default())).collect();
    let sample_into = |(columns, rows): &mut (Vec<Vec<u8>>, BatchRows)| -> gear_net::Result<()> {
        let mut views: Vec<&mut [u8]> = columns.iter_mut().map(Vec::as_mut_slice).collect();
        client.sample_into(&request, &mut views, rows)?;
        if rows.lost.is_empty() {
            Ok(())
        } else {
            Err(gear_net::Error::NoShard(format!("shards lost during the bench: {:?}", rows.lost)))
        }
    };
    sample_into(&mut buffers[0]).map_err(net)?;
    let (mut sample_bytes, mut sample_secs, mut tcp_sample_secs) = (0u64, 0.0, 0.0);
    let cpu_before = (cluster_cpu_seconds(&servers), plain.cpu());
    progress.phase("remote sample (batches)", c.batches);
    // `--sampler-threads` batches at a time, each drawn by its own thread
    // through the one client; a round is timed from the first call to the
    // last reply, then the plain stream moves the round's bytes.
    let mut done = 0u64;
    while done < c.batches {
        let k = (c.batches - done).min(in_flight) as usize;
        let start = Instant::now();
        if k == 1 {
            sample_into(&mut buffers[0]).map_err(net)?;
        } else {
            std::thread::scope(|scope| {
                let calls: Vec<_> = buffers[..k].iter_mut().map(|b| scope.spawn(move || sample_into(b))).collect();
                calls.into_iter().try_for_each(|h| {
                    h.join().unwrap_or_else(|_| Err(gear_net::Error::Config("a sampler thread panicked".into())))
                })
            })
            .map_err(net)?;
        }
        sample_secs += start.elapsed().as_secs_f64();
        let bytes = batch_bytes * k as u64;
        tcp_sample_secs += plain.transfer(bytes)?;
        sample_bytes += bytes;
        done += k as u64;
        progress.tick(done);
    }
    progress.done();
    let tcp_sample_cpu = plain.cpu() - cpu_before.1;
    let sample_cpu = cluster_cpu_seconds(&servers) - cpu_before.0 - tcp_sample_cpu;
    let data_plane = match client.data_plane_for(&request).map_err(net)? {
        Some(kind) => format!("byte-range over {}", kind.name()),
        None => "shard-gather".into(),
    };
    drop(servers);
    drop(bench_dir);
    Ok(ClusterBenchReport {
        shards,
        trajectory_bytes,
        insert_traj_per_s: inserted as f64 / insert_secs,
        insert_gb_per_s: insert_bytes as f64 / insert_secs / 1e9,
        tcp_insert_gb_per_s: insert_bytes as f64 / tcp_insert_secs / 1e9,
        sample_gb_per_s: sample_bytes as f64 / sample_secs / 1e9,
        tcp_sample_gb_per_s: sample_bytes as f64 / tcp_sample_secs / 1e9,
        insert_cpu_s_per_gb: insert_cpu / (insert_bytes as f64 / 1e9),
        tcp_insert_cpu_s_per_gb: tcp_insert_cpu / (insert_bytes as f64 / 1e9),
        sample_cpu_s_per_gb: sample_cpu / (sample_bytes as f64 / 1e9),
        tcp_sample_cpu_s_per_gb: tcp_sample_cpu / (sample_bytes as f64 / 1e9),
        data_plane,
        sample_batches_per_s: c.batches as f64 / sample_secs,
        batches_in_flight: in_flight,
    })
}
