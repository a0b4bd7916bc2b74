//! Shard servers as real processes on loopback (`gear serve` with a
//! `[grpc]` section), driven through gear-net's cluster client: remote
//! writers into every shard, a trainer checking every row's bytes, a shard
//! killed with SIGKILL and restarted, tokens and bad requests refused.
//! Every test runs under a deadline; on expiry its children are killed.

use gear_core::{Pad, WindowSpec};
use gear_net::{ClusterClient, ClusterConfig, ClusterSample, Error, RemoteTrajectory, WriteTarget};
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::sync::Mutex;
use std::time::{Duration, Instant};

const TOKEN: &str = "test-token-0123456789";
const MAX_LEN: u64 = 16;
const OBS: usize = 48;

/// Child pids, killed if a test overruns its deadline.
static CHILDREN: Mutex<Vec<u32>> = Mutex::new(Vec::new());

/// Runs `body` with a deadline; on expiry, kills every child and fails.
fn with_deadline(seconds: u64, body: impl FnOnce() + Send + 'static) {
    let (tx, rx) = mpsc::channel();
    let t = std::thread::spawn(move || {
        body();
        let _ = tx.send(());
    });
    match rx.recv_timeout(Duration::from_secs(seconds)) {
        Ok(()) => t.join().unwrap(),
        Err(mpsc::RecvTimeoutError::Disconnected) => {
            if let Err(p) = t.join() {
                std::panic::resume_unwind(p);
            }
        }
        Err(mpsc::RecvTimeoutError::Timeout) => {
            for &pid in CHILDREN.lock().unwrap().iter() {
                // SAFETY: kill has no memory-safety preconditions.
                unsafe { libc::kill(pid as i32, libc::SIGKILL) };
            }
            panic!("test overran its {seconds} s deadline; children killed");
        }
    }
}

/// One `gear serve` process.
struct ShardProcess {
    child: Child,
    addr: String,
    /// The metrics endpoint, when the config has `[metrics]`.
    metrics: Option<String>,
}

impl ShardProcess {
    fn start(dir: &std::path::Path, shard: u32, listen: &str, token: Option<&str>) -> ShardProcess {
        let name = format!("gearnet-{}-{shard}-{}", std::process::id(), dir.file_name().unwrap().to_string_lossy());
        let config = dir.join(format!("shard{shard}.toml"));
        std::fs::write(
            &config,
            format!(
                r#"name = "{name}"
dir = "{dir}"
max_len = {MAX_LEN}
capacity = 64
seed = {shard}
[[columns]]
name = "id"
dtype = "i64"
[[columns]]
name = "t"
dtype = "i32"
[[columns]]
name = "obs"
dtype = "u8"
shape = [{OBS}]
[grpc]
listen = "{listen}"
shard = {shard}
"#,
                dir = dir.display()
            ),
        )
        .unwrap();
        Self::spawn(&config, token, &[]).unwrap()
    }

    /// `gear serve --config config ARGS`, once it listens; `Err` with its
    /// stderr if it exits first.
    fn spawn(config: &std::path::Path, token: Option<&str>, args: &[&std::ffi::OsStr]) -> Result<ShardProcess, String> {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_gear"));
        cmd.args(["serve", "--config"]).arg(config).args(args).stdout(Stdio::piped()).stderr(Stdio::piped());
        match token {
            Some(t) => cmd.env("GEAR_TOKEN", t),
            None => cmd.env_remove("GEAR_TOKEN"),
        };
        let mut child = cmd.spawn().unwrap();
        CHILDREN.lock().unwrap().push(child.id());
        let stdout = child.stdout.take().unwrap();
        let stderr = child.stderr.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut metrics = None;
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if let Some(rest) = line.strip_prefix("metrics on http://") {
                    metrics = rest.strip_suffix("/metrics").map(str::to_owned);
                }
                if let Some(rest) = line.strip_prefix("grpc listening on ") {
                    let _ = tx.send((rest.split_whitespace().next().unwrap_or_default().to_owned(), metrics.clone()));
                }
            }
        });
        // Status lines go to stderr, read to its end (a full pipe would
        // stall the server); the last ones explain a failed start.
        let (etx, erx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut last = std::collections::VecDeque::new();
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if last.len() == 50 {
                    last.pop_front();
                }
                last.push_back(line);
            }
            let _ = etx.send(Vec::from(last).join("\n"));
        });
        match rx.recv_timeout(Duration::from_secs(20)) {
            Ok((addr, metrics)) => Ok(ShardProcess { child, addr, metrics }),
            Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                Err(erx.recv_timeout(Duration::from_secs(5)).unwrap_or_default())
            }
        }
    }

    /// Stops the server as Ctrl-C would (its shutdown checkpoints run) and
    /// waits for it to exit.
    fn interrupt(&mut self) {
        // SAFETY: kill has no memory-safety preconditions.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let status = self.child.wait().unwrap();
        assert!(status.success(), "gear serve exited with {status}");
    }

    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for ShardProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

fn temp_dir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("gear-net-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Trajectory `id`: `steps` steps; step t holds id, t and obs bytes
/// `(id * 31 + t * 7 + j) mod 251`.
fn trajectory(id: u64, steps: u64) -> RemoteTrajectory {
    let mut cols = vec![Vec::new(), Vec::new(), Vec::new()];
    for t in 0..steps {
        cols[0].extend_from_slice(&id.to_le_bytes());
        cols[1].extend_from_slice(&(t as u32).to_le_bytes());
        cols[2].extend((0..OBS as u64).map(|j| ((id * 31 + t * 7 + j) % 251) as u8));
    }
    RemoteTrajectory { steps, columns: cols.into_iter().map(Into::into).collect(), priority: None }
}

/// Checks every valid step of every row against what was written.
fn check_rows(batch: &gear_net::ClusterBatch, window_spec: WindowSpec) -> usize {
    let window = window_spec.len;
    let rows = batch.keys.len();
    assert_eq!(batch.columns.len(), 3);
    assert_eq!(batch.columns[2].len(), rows * window as usize * OBS);
    for r in 0..rows {
        let n = batch.lengths[r];
        assert!(n >= 1 && n <= window, "row {r}: length {n}");
        // Padding at the head puts the valid steps at the end of the row.
        let first = r * window as usize + if window_spec.pad == Pad::Head { (window - n) as usize } else { 0 };
        let id = u64::from_le_bytes(batch.columns[0][first * 8..][..8].try_into().unwrap());
        for j in 0..n as usize {
            let step = first + j;
            let t = batch.starts[r] + j as u64;
            assert_eq!(
                u64::from_le_bytes(batch.columns[0][step * 8..][..8].try_into().unwrap()),
                id,
                "row {r} step {j}"
            );
            assert_eq!(u32::from_le_bytes(batch.columns[1][step * 4..][..4].try_into().unwrap()) as u64, t);
            let obs = &batch.columns[2][step * OBS..][..OBS];
            assert!(
                obs.iter().enumerate().all(|(k, &b)| b == ((id * 31 + t * 7 + k as u64) % 251) as u8),
                "row {r} step {j} (id {id}, t {t}, length {n}, start {}, shard {}): obs bytes differ: {:?}",
                batch.starts[r],
                batch.keys[r].shard,
                &obs[..8]
            );
        }
        assert!(batch.probabilities[r] > 0.0 && batch.weights[r] > 0.0);
    }
    rows
}

fn client(addrs: Vec<String>, token: &str) -> ClusterClient {
    let mut config = ClusterConfig::new(addrs, token);
    config.call_timeout = Duration::from_secs(5);
    ClusterClient::new(config).unwrap()
}

#[test]
fn three_shards_sampled_while_written_a_killed_shard_reported_and_rejoining() {
    with_deadline(90, || {
        let dir = temp_dir("three");
        let mut shards: Vec<ShardProcess> =
            (0..3).map(|s| ShardProcess::start(&dir, s, "127.0.0.1:0", Some(TOKEN))).collect();
        let addrs: Vec<String> = shards.iter().map(|s| s.addr.clone()).collect();
        let cluster = client(addrs.clone(), TOKEN);
        // Every shard gets writes of its own first, then writers spread.
        for s in 0..3 {
            let keys = cluster
                .insert(
                    WriteTarget::Shard(s),
                    (0..4).map(|i| trajectory(s as u64 * 1000 + i, 1 + i % MAX_LEN)).collect(),
                    3,
                )
                .unwrap();
            assert!(keys.iter().all(|k| k.shard == s as u32));
        }
        let window = 8;
        let request =
            ClusterSample { rows: 32, window: WindowSpec::last(window), columns: vec![], random_start: false };
        let writer_addrs = addrs.clone();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let stop_w = stop.clone();
        let writer = std::thread::spawn(move || {
            let w = client(writer_addrs, TOKEN);
            let mut id = 10_000u64;
            while !stop_w.load(std::sync::atomic::Ordering::Relaxed) {
                let batch: Vec<_> = (0..6).map(|i| trajectory(id + i, 1 + (id + i) % MAX_LEN)).collect();
                id += 6;
                // Errors are expected while a shard is down.
                let _ = w.insert(WriteTarget::RoundRobin, batch, 0);
            }
            id
        });
        let start = Instant::now();
        let mut rows = 0;
        let mut seen = [false; 3];
        while start.elapsed() < Duration::from_secs(3) {
            let b = cluster.sample(&request).unwrap();
            assert!(b.lost.is_empty(), "{:?}", b.lost);
            rows += check_rows(&b, request.window);
            for k in &b.keys {
                seen[k.shard as usize] = true;
            }
        }
        assert!(rows > 0 && seen.iter().all(|&s| s), "rows {rows}, shards seen {seen:?}");
        let old_keys = cluster.sample(&request).unwrap().keys;

        // SIGKILL shard 1 while the trainer samples: batches go on, full, from 0 and 2.
        let port = shards[1].addr.clone();
        shards[1].kill();
        let b = cluster.sample(&request).unwrap();
        assert!(b.lost.iter().any(|l| l.shard == 1), "lost: {:?}", b.lost);
        assert_eq!(check_rows(&b, request.window), 32);
        assert!(b.keys.iter().all(|k| k.shard != 1));
        for _ in 0..5 {
            check_rows(&cluster.sample(&request).unwrap(), request.window);
        }

        // Restarted on the same address (an empty table): it rejoins.
        shards[1] = ShardProcess::start(&dir, 1, &port, Some(TOKEN));
        cluster.insert(WriteTarget::Shard(1), (0..4).map(|i| trajectory(5000 + i, 5)).collect(), 0).unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        let mut rejoined = false;
        let mut from_new = false;
        while Instant::now() < deadline && !(rejoined && from_new) {
            let b = cluster.sample(&request).unwrap();
            check_rows(&b, request.window);
            rejoined |= b.rejoined.contains(&1);
            from_new |= b.keys.iter().any(|k| k.shard == 1);
        }
        assert!(rejoined && from_new, "shard 1 did not rejoin (rejoined {rejoined}, sampled {from_new})");
        // Keys of its previous run are stale, never applied to new items.
        let old: Vec<_> = old_keys.iter().filter(|k| k.shard == 1).map(|&k| (k, 5.0)).collect();
        let fresh: Vec<_> = old_keys.iter().filter(|k| k.shard != 1).map(|&k| (k, 5.0)).collect();
        if !old.is_empty() {
            assert_eq!(
                cluster.update_priorities(&old).unwrap(),
                gear_net::PriorityUpdates { applied: 0, stale: old.len() as u64 }
            );
        }
        let fresh_updates = cluster.update_priorities(&fresh).unwrap();
        assert_eq!(fresh_updates.applied + fresh_updates.stale, fresh.len() as u64);
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let written = writer.join().unwrap();
        assert!(written > 10_000, "the remote writer inserted nothing");
        for s in 0..3 {
            assert!(cluster.info(s).unwrap().inserts > 0, "shard {s} got no inserts");
        }
        drop(shards);
        let _ = std::fs::remove_dir_all(&dir);
    });
}

#[test]
fn wrong_or_missing_tokens_and_out_of_range_requests_are_refused() {
    with_deadline(60, || {
        let dir = temp_dir("refuse");
        let shard = ShardProcess::start(&dir, 0, "127.0.0.1:0", Some(TOKEN));
        let unauthenticated = |e: Error| match e {
            Error::Status { status, .. } => status.code() == tonic::Code::Unauthenticated,
            other => panic!("expected a refusal, got {other}"),
        };
        let wrong = client(vec![shard.addr.clone()], "wrong-token-0123456789");
        assert!(unauthenticated(wrong.info(0).unwrap_err()));
        assert!(unauthenticated(wrong.insert(WriteTarget::Shard(0), vec![trajectory(1, 2)], 0).unwrap_err()));
        // No token at all: a raw gRPC call without metadata.
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let status = rt
            .block_on(async {
                let mut c = gear_net::proto::shard_client::ShardClient::connect(format!("http://{}", shard.addr))
                    .await
                    .unwrap();
                c.health(gear_net::proto::HealthRequest {}).await
            })
            .unwrap_err();
        assert_eq!(status.code(), tonic::Code::Unauthenticated);

        let good = client(vec![shard.addr.clone()], TOKEN);
        good.insert(WriteTarget::Shard(0), vec![trajectory(1, 4)], 0).unwrap();
        // Refused by the client against the table's spec, or by the shard.
        let invalid = |r: ClusterSample| match good.sample(&r).unwrap_err() {
            Error::Status { status, .. } => {
                assert!(
                    matches!(status.code(), tonic::Code::InvalidArgument | tonic::Code::ResourceExhausted),
                    "{status}"
                );
            }
            Error::Core(_) | Error::Config(_) => {}
            other => panic!("expected a refusal, got {other}"),
        };
        invalid(ClusterSample { rows: 4, window: WindowSpec::last(MAX_LEN + 1), columns: vec![], random_start: false });
        invalid(ClusterSample {
            rows: 4,
            window: WindowSpec::last(4),
            columns: vec!["nope".into()],
            random_start: false,
        });
        invalid(ClusterSample { rows: 1 << 30, window: WindowSpec::last(4), columns: vec![], random_start: false });
        // A trajectory longer than the table's T, and a short buffer.
        assert!(good.insert(WriteTarget::Shard(0), vec![trajectory(2, MAX_LEN + 1)], 0).is_err());
        let mut bad = trajectory(3, 2);
        let short = bad.columns[2].len() - 1;
        bad.columns[2].truncate(short);
        assert!(good.insert(WriteTarget::Shard(0), vec![bad], 0).is_err());
        // The server is still fine.
        let b = good
            .sample(&ClusterSample { rows: 2, window: WindowSpec::last(4), columns: vec![], random_start: false })
            .unwrap();
        assert_eq!(check_rows(&b, WindowSpec::last(4)), 2);
        drop(shard);
        let _ = std::fs::remove_dir_all(&dir);
    });
}

/// The writer process of `a_writer_killed_mid_stream_loses_no_slot`: when
/// `GEAR_TEST_WRITER_ADDR` is set (only in that child), streams
/// `MAX_LEN`-step trajectories one step per message, a millisecond apart,
/// through the raw gRPC client, until killed; so a kill lands inside a
/// trajectory whose first steps the shard already holds.
#[test]
fn writer_child() {
    let Ok(addr) = std::env::var("GEAR_TEST_WRITER_ADDR") else {
        return;
    };
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    runtime.block_on(async move {
        let c = gear_net::proto::shard_client::ShardClient::connect(format!("http://{addr}")).await.unwrap();
        for id in 1_000_000u64.. {
            let (tx, rx) = tokio::sync::mpsc::channel(4);
            let mut request = tonic::Request::new(tonic::codegen::tokio_stream::wrappers::ReceiverStream::new(rx));
            request.metadata_mut().insert("authorization", format!("Bearer {TOKEN}").parse().unwrap());
            let call = tokio::spawn({
                let mut c = c.clone();
                async move { c.insert(request).await }
            });
            let t = trajectory(id, MAX_LEN);
            for step in 0..MAX_LEN as usize {
                let columns = t
                    .columns
                    .iter()
                    .map(|col| {
                        let b = col.len() / MAX_LEN as usize;
                        col.slice(step * b..(step + 1) * b)
                    })
                    .collect();
                let end = step + 1 == MAX_LEN as usize;
                let chunk = gear_net::proto::InsertChunk { steps: 1, columns, end, ..Default::default() };
                if tx.send(chunk).await.is_err() {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            drop(tx);
            let _ = call.await;
        }
    });
}

#[test]
fn a_writer_killed_mid_stream_loses_no_slot() {
    with_deadline(120, || {
        let dir = temp_dir("killed-writer");
        let shard = ShardProcess::start(&dir, 0, "127.0.0.1:0", Some(TOKEN));
        let cluster = client(vec![shard.addr.clone()], TOKEN);
        let capacity = cluster.info(0).unwrap().capacity;
        // Writers streaming one step per message, SIGKILLed at varying
        // moments: each kill most likely lands inside a trajectory.
        for round in 0..6u64 {
            let mut child = Command::new(std::env::current_exe().unwrap())
                .args(["--exact", "writer_child", "--nocapture", "--test-threads", "1"])
                .env("GEAR_TEST_WRITER_ADDR", &shard.addr)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap();
            CHILDREN.lock().unwrap().push(child.id());
            let start = cluster.info(0).unwrap().inserts;
            let deadline = Instant::now() + Duration::from_secs(20);
            // Killed only once it has committed something (it is streaming).
            while cluster.info(0).unwrap().inserts == start && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(5));
            }
            std::thread::sleep(Duration::from_millis(7 * round + 3));
            child.kill().unwrap();
            child.wait().unwrap();
        }
        // The shard serves on; every slot can still be filled: a half
        // trajectory left open by a killed writer would hold its slot, and
        // the table could not come back to `capacity` items. The shard
        // frees the last writer's slot when it sees the connection gone,
        // which on a loaded machine may come after the first inserts: it
        // has until the deadline.
        let refill = || {
            let keys = cluster
                .insert(WriteTarget::Shard(0), (0..2 * capacity).map(|i| trajectory(i, 1 + i % MAX_LEN)).collect(), 0)
                .unwrap();
            assert_eq!(keys.len() as u64, 2 * capacity);
            cluster.info(0).unwrap()
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut info = refill();
        while info.size < capacity && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(100));
            info = refill();
        }
        assert_eq!(info.size, capacity, "slots lost to killed writers: {info:?}");
        // Only whole trajectories come back, every byte as written.
        let request =
            ClusterSample { rows: 32, window: WindowSpec::last(MAX_LEN), columns: vec![], random_start: false };
        for _ in 0..20 {
            let b = cluster.sample(&request).unwrap();
            assert!(b.lost.is_empty(), "{:?}", b.lost);
            check_rows(&b, request.window);
        }
        drop(shard);
        let _ = std::fs::remove_dir_all(&dir);
    });
}

/// The columns of `trajectory`'s steps as a `[[tables]]` entry's.
fn table_columns() -> String {
    format!(
        "[[tables.columns]]\nname = \"id\"\ndtype = \"i64\"\n[[tables.columns]]\nname = \"t\"\ndtype = \"i32\"\n\
         [[tables.columns]]\nname = \"obs\"\ndtype = \"u8\"\nshape = [{OBS}]\n"
    )
}

/// A `[[tables]]` config of a prioritized table `replay` and a queue
/// `queue` (FIFO, every item sampled once), with gRPC and metrics on free
/// ports; shared-memory names unique to this test run.
fn two_table_config(dir: &std::path::Path) -> PathBuf {
    let columns = table_columns();
    let pid = std::process::id();
    let text = format!(
        r#"[[tables]]
name = "replay"
shm_name = "gear-cli-replay-{pid}"
dir = "{dir}"
max_len = {MAX_LEN}
capacity = 32
{columns}[tables.sampler]
kind = "prioritized"
alpha = 1.0
beta = 1.0

[[tables]]
name = "queue"
shm_name = "gear-cli-queue-{pid}"
dir = "{dir}"
max_len = {MAX_LEN}
capacity = 32
max_times_sampled = 1
{columns}[tables.sampler]
kind = "fifo"
[tables.remover]
kind = "fifo"
[tables.rate_limiter]
queue = 32

[grpc]
listen = "127.0.0.1:0"
shard = 0

[metrics]
listen = "127.0.0.1:0"
"#,
        dir = dir.display()
    );
    let path = dir.join("tables.toml");
    std::fs::write(&path, text).unwrap();
    path
}

fn table_client(addr: &str, table: &str) -> ClusterClient {
    let mut config = ClusterConfig::new(vec![addr.to_owned()], TOKEN);
    config.call_timeout = Duration::from_secs(5);
    config.table = table.to_owned();
    ClusterClient::new(config).unwrap()
}

/// The body of `GET /metrics` (HTTP/1.0, so the server closes after it).
fn get_metrics(addr: &str) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").unwrap();
    let mut response = String::new();
    s.read_to_string(&mut response).unwrap();
    assert!(response.starts_with("HTTP/1.0 200"), "{response}");
    response.split_once("\r\n\r\n").unwrap().1.to_owned()
}

/// Ids of a batch's rows, in order (every row checked first).
fn ids(batch: &gear_net::ClusterBatch, window: WindowSpec) -> Vec<u64> {
    check_rows(batch, window);
    (0..batch.keys.len())
        .map(|r| {
            let n = batch.lengths[r];
            let first = r * window.len as usize + if window.pad == Pad::Head { (window.len - n) as usize } else { 0 };
            u64::from_le_bytes(batch.columns[0][first * 8..][..8].try_into().unwrap())
        })
        .collect()
}

#[test]
fn a_server_of_two_tables_checkpoints_and_restores_both() {
    with_deadline(120, || {
        let dir = temp_dir("tables");
        let config = two_table_config(&dir);
        let checkpoints = dir.join("ckpt");
        let args = [std::ffi::OsStr::new("--checkpoint-dir"), checkpoints.as_os_str()];
        let mut server = ShardProcess::spawn(&config, Some(TOKEN), &args).unwrap();
        let replay = table_client(&server.addr, "replay");
        let queue = table_client(&server.addr, "queue");
        let mut prioritized: Vec<RemoteTrajectory> = (1..=6).map(|id| trajectory(id, 1 + id % MAX_LEN)).collect();
        for (i, t) in prioritized.iter_mut().enumerate() {
            t.priority = Some(i as f64 + 1.0);
        }
        replay.insert(WriteTarget::Shard(0), prioritized, 0).unwrap();
        queue.insert(WriteTarget::Shard(0), (101..=105).map(|id| trajectory(id, 3)).collect(), 2).unwrap();
        let window = WindowSpec::first(MAX_LEN);
        let two = ClusterSample { rows: 2, window, columns: vec![], random_start: false };
        assert_eq!(ids(&queue.sample(&two).unwrap(), window), [101, 102]);

        // The metrics endpoint of the process counts per table.
        let metrics = get_metrics(server.metrics.as_deref().expect("a metrics address"));
        for line in ["gear_table_inserts_total{table=\"replay\"} 6", "gear_table_inserts_total{table=\"queue\"} 5"] {
            assert!(metrics.lines().any(|l| l == line), "no `{line}` in:\n{metrics}");
        }
        // `gear cluster-info` lists both tables of the shard, once and live.
        let cluster_file = dir.join("cluster.toml");
        std::fs::write(&cluster_file, format!("shards = [\"{}\"]\ntoken = \"{TOKEN}\"\n", server.addr)).unwrap();
        let info = |extra: &[&str]| {
            let out = Command::new(env!("CARGO_BIN_EXE_gear"))
                .args(["cluster-info", "--cluster"])
                .arg(&cluster_file)
                .args(extra)
                .output()
                .unwrap();
            assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
            String::from_utf8(out.stdout).unwrap()
        };
        let once = info(&[]);
        assert!(once.contains("table `replay` (prioritized): size 6/32"), "{once}");
        assert!(once.contains("table `queue` (fifo): size 3/32"), "{once}");
        let live = info(&["--watch", "--count", "2", "--interval", "0.2"]);
        assert_eq!(live.matches("gear cluster-info --watch").count(), 2, "{live}");
        assert_eq!(live.lines().filter(|l| l.starts_with("0     replay")).count(), 2, "{live}");
        assert_eq!(live.lines().filter(|l| l.starts_with("0     queue")).count(), 2, "{live}");

        // Stopped, it checkpoints each table into a directory of its name.
        server.interrupt();
        for table in ["replay", "queue"] {
            let found = gear_api::latest_checkpoint(checkpoints.join(table)).unwrap();
            assert!(found.is_some(), "no checkpoint of `{table}` in {}", checkpoints.display());
        }
        // A restore directory without a table's checkpoint is refused.
        let empty = dir.join("empty");
        std::fs::create_dir_all(&empty).unwrap();
        let e = ShardProcess::spawn(&config, Some(TOKEN), &[std::ffi::OsStr::new("--restore"), empty.as_os_str()])
            .err()
            .expect("a restore without checkpoints must fail");
        assert!(e.contains("no checkpoint of table `replay`") && e.contains("empty/replay"), "{e}");

        // Restored: both tables as they were, the queue's order included.
        let restore = [std::ffi::OsStr::new("--restore"), checkpoints.as_os_str()];
        let server = ShardProcess::spawn(&config, Some(TOKEN), &restore).unwrap();
        let replay = table_client(&server.addr, "replay");
        let queue = table_client(&server.addr, "queue");
        let three = ClusterSample { rows: 3, window, columns: vec![], random_start: false };
        assert_eq!(ids(&queue.sample(&three).unwrap(), window), [103, 104, 105]);
        let batch = replay.sample(&ClusterSample { rows: 64, window, columns: vec![], random_start: false }).unwrap();
        for (r, id) in ids(&batch, window).into_iter().enumerate() {
            assert!((1..=6).contains(&id), "row {r}: id {id}");
            // Priorities came back: probability id / 21.
            assert!((batch.probabilities[r] - id as f64 / 21.0).abs() < 1e-9, "id {id}: {}", batch.probabilities[r]);
        }
        drop(server);
        let _ = std::fs::remove_dir_all(&dir);
    });
}

/// `gear serve` with a `[[tables]]` config whose tables hold items, each
/// with its own pattern: `windows` (prioritized windows of 4 steps every
/// 2) and `dqn` (one-step transitions, uniform, room for 4 trajectories
/// so later inserts evict). Remote inserts make the pattern's items on the
/// shard; every sampled row is an item's window of the bytes written,
/// under an item key; priority updates by item key apply, and an evicted
/// trajectory's item keys (and a trajectory's key once evicted) report
/// stale.
#[test]
fn a_server_of_item_tables_makes_samples_and_retires_items_per_table() {
    with_deadline(120, || {
        let dir = temp_dir("items");
        let columns = table_columns();
        let pid = std::process::id();
        let text = format!(
            r#"[[tables]]
name = "windows"
shm_name = "gear-cli-windows-{pid}"
dir = "{dir}"
max_len = {MAX_LEN}
capacity = 8
items_per_trajectory = 8
{columns}[tables.sampler]
kind = "prioritized"
alpha = 1.0
beta = 1.0
[tables.items]
pattern = "windows"
len = 4
stride = 2
tail = false

[[tables]]
name = "dqn"
shm_name = "gear-cli-dqn-{pid}"
dir = "{dir}"
max_len = {MAX_LEN}
capacity = 4
items_per_trajectory = {MAX_LEN}
{columns}[tables.sampler]
kind = "uniform"
[tables.items]
pattern = "transitions"
n_step = 1

[grpc]
listen = "127.0.0.1:0"
shard = 0
"#,
            dir = dir.display()
        );
        let config = dir.join("items.toml");
        std::fs::write(&config, text).unwrap();
        let server = ShardProcess::spawn(&config, Some(TOKEN), &[]).unwrap();
        let windows = table_client(&server.addr, "windows");
        let dqn = table_client(&server.addr, "dqn");
        assert_eq!(windows.spec(0).unwrap().table.items_per_trajectory(), 8);
        assert_eq!(dqn.spec(0).unwrap().table.items_per_trajectory(), MAX_LEN);

        // 10 steps: windows starting at 0, 2, 4, 6 (no tail); 9 transitions.
        let traj_keys =
            windows.insert(WriteTarget::Shard(0), (1..=3).map(|id| trajectory(id, 10)).collect(), 0).unwrap();
        assert_eq!(windows.info(0).unwrap().size, 12, "four windows per trajectory");
        let window = WindowSpec::first(4);
        let request = ClusterSample { rows: 64, window, columns: vec![], random_start: false };
        let mut items = std::collections::HashSet::new();
        for _ in 0..6 {
            let b = windows.sample(&request).unwrap();
            assert!(b.lost.is_empty(), "{:?}", b.lost);
            check_rows(&b, window);
            for r in 0..b.keys.len() {
                let k = b.keys[r];
                assert!(gear_core::SlotKey { slot: k.slot, generation: k.generation }.is_item(), "row {r}: {k:?}");
                assert_eq!(b.lengths[r], 4, "row {r}: an item is four steps");
                assert!(b.starts[r].is_multiple_of(2) && b.starts[r] <= 6, "row {r}: starts at {}", b.starts[r]);
                items.insert(k);
            }
        }
        assert_eq!(items.len(), 12, "every window of every trajectory drawn");
        // One item keeps its priority, the rest next to none: only it is drawn.
        let keep = *items.iter().next().unwrap();
        let updates: Vec<_> = items.iter().map(|&k| (k, if k == keep { 4.0 } else { 1e-12 })).collect();
        assert_eq!(windows.update_priorities(&updates).unwrap().applied, 12);
        let b = windows.sample(&request).unwrap();
        check_rows(&b, window);
        assert!(b.keys.iter().all(|&k| k == keep), "only the item with a priority is drawn");
        assert!(traj_keys.iter().all(|k| !gear_core::SlotKey { slot: k.slot, generation: k.generation }.is_item()));

        // dqn: two-step transition items; 4 trajectories of 5 steps, then
        // 4 more evict them (FIFO), and every key of the first 4 is stale.
        let first = dqn.insert(WriteTarget::Shard(0), (11..=14).map(|id| trajectory(id, 5)).collect(), 0).unwrap();
        assert_eq!(dqn.info(0).unwrap().size, 16, "four transitions per 5-step trajectory");
        let two = WindowSpec::first(2);
        let mut old_items = std::collections::HashSet::new();
        for _ in 0..8 {
            let b = dqn.sample(&ClusterSample { rows: 64, window: two, columns: vec![], random_start: false }).unwrap();
            check_rows(&b, two);
            assert!(b.lengths.iter().all(|&n| n == 2), "a transition is (t, t + 1)");
            old_items.extend(b.keys.iter().copied());
        }
        assert_eq!(old_items.len(), 16);
        dqn.insert(WriteTarget::Shard(0), (21..=24).map(|id| trajectory(id, 5)).collect(), 0).unwrap();
        let info = dqn.info(0).unwrap();
        assert_eq!((info.size, info.evictions), (16, 4), "{info:?}");
        let stale: Vec<_> = old_items.iter().chain(&first).map(|&k| (k, 2.0)).collect();
        let u = dqn.update_priorities(&stale).unwrap();
        assert_eq!((u.applied, u.stale), (0, stale.len() as u64), "evicted items' and trajectories' keys are stale");
        for _ in 0..4 {
            let b = dqn.sample(&ClusterSample { rows: 64, window: two, columns: vec![], random_start: false }).unwrap();
            assert!((21..=24).contains(&ids(&b, two)[0]) && ids(&b, two).iter().all(|id| (21..=24).contains(id)));
            assert!(b.keys.iter().all(|k| !old_items.contains(k)), "no evicted item drawn");
        }
        // The windows table was left alone by the other table's evictions.
        assert_eq!(windows.info(0).unwrap().size, 12);
        drop(server);
        let _ = std::fs::remove_dir_all(&dir);
    });
}
