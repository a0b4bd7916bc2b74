//! A `gear serve` shard frozen (SIGSTOP) while it holds a pending `Sample`
//! reply: the trainer's batch returns within its deadline, the frozen
//! shard named in `lost` and its rows drawn from the other shard; the
//! shard serves again once it resumes (SIGCONT).
//!
//! Shard 1 is rate limited (its minimum size to sample is above what it
//! holds), so it has sent its response headers and is waiting to draw when
//! it is stopped: the reply's body and trailers never come. "Returned
//! before the deadline plus slack" is a correctness check with generous
//! slack (the shard stays frozen for far longer), never a speed assertion.

use gear_core::WindowSpec;
use gear_net::{ClusterClient, ClusterConfig, ClusterSample, RemoteTrajectory, WriteTarget};
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

const TOKEN: &str = "frozen-shard-token-0123";
const CALL_TIMEOUT: Duration = Duration::from_secs(3);
const SLACK: Duration = Duration::from_secs(4);
/// How long the shard stays frozen: long past the deadline and its slack.
const FROZEN_FOR: Duration = Duration::from_secs(20);

/// One `gear serve` process, killed (after a SIGCONT) when dropped.
struct ShardProcess {
    child: Child,
    addr: String,
}

impl ShardProcess {
    fn start(dir: &std::path::Path, shard: u32, limiter: &str) -> ShardProcess {
        let config = dir.join(format!("shard{shard}.toml"));
        std::fs::write(
            &config,
            format!(
                r#"name = "gear-frozen-{pid}-{shard}"
dir = "{dir}"
max_len = 4
capacity = 256
seed = {shard}
[[columns]]
name = "id"
dtype = "i64"
{limiter}
[grpc]
listen = "127.0.0.1:0"
shard = {shard}
"#,
                pid = std::process::id(),
                dir = dir.display()
            ),
        )
        .unwrap();
        let mut child = Command::new(env!("CARGO_BIN_EXE_gear"))
            .args(["serve", "--config"])
            .arg(&config)
            .env("GEAR_TOKEN", TOKEN)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if let Some(rest) = line.strip_prefix("grpc listening on ") {
                    let _ = tx.send(rest.split_whitespace().next().unwrap_or_default().to_owned());
                }
            }
        });
        let addr = rx.recv_timeout(Duration::from_secs(20)).expect("shard server did not start listening");
        ShardProcess { child, addr }
    }

    fn signal(&self, signal: libc::c_int) {
        // SAFETY: kill has no memory-safety preconditions; the pid is our child's.
        unsafe { libc::kill(self.child.id() as libc::pid_t, signal) };
    }
}

impl Drop for ShardProcess {
    fn drop(&mut self) {
        self.signal(libc::SIGCONT);
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn one(id: i64) -> RemoteTrajectory {
    RemoteTrajectory { steps: 1, columns: vec![id.to_le_bytes().to_vec().into()], priority: None }
}

#[test]
fn a_shard_frozen_with_a_pending_sample_reply_is_left_out_within_the_deadline() {
    let dir = std::env::temp_dir().join(format!("gear-frozen-shard-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let shards = [
        ShardProcess::start(&dir, 0, ""),
        // Holds 4 items, needs 100 to sample: every draw waits.
        ShardProcess::start(&dir, 1, "[rate_limiter]\nmin_size_to_sample = 100\n"),
    ];
    let mut config = ClusterConfig::new(shards.iter().map(|s| s.addr.clone()).collect(), TOKEN);
    config.call_timeout = CALL_TIMEOUT;
    config.mass_refresh = Duration::from_secs(3600);
    let cluster = ClusterClient::new(config).unwrap();
    for s in 0..2 {
        let base = 1000 * s as i64;
        cluster.insert(WriteTarget::Shard(s), (base..base + 4).map(one).collect(), 0).unwrap();
    }
    let request = ClusterSample { rows: 64, window: WindowSpec::last(1), columns: vec![], random_start: false };

    // The trainer's batch: shard 1 takes the call and waits to draw.
    let (tx, rx) = mpsc::channel();
    let trainer = std::thread::spawn(move || {
        let start = Instant::now();
        let batch = cluster.sample(&request);
        let _ = tx.send(());
        (start.elapsed(), batch, cluster)
    });
    std::thread::sleep(Duration::from_millis(500));
    shards[1].signal(libc::SIGSTOP);
    // Resumed long after the deadline: without a deadline on the whole
    // reply the batch would come back only then.
    let resumed = rx.recv_timeout(FROZEN_FOR).is_err();
    shards[1].signal(libc::SIGCONT);
    let (took, batch, cluster) = trainer.join().unwrap();
    assert!(!resumed, "the batch waited for the frozen shard to resume ({took:?})");
    assert!(took < CALL_TIMEOUT + SLACK, "the batch took {took:?}; deadline {CALL_TIMEOUT:?}");
    let batch = batch.unwrap();
    let lost: Vec<usize> = batch.lost.iter().map(|l| l.shard).collect();
    assert_eq!(lost, [1], "{:?}", batch.lost);
    assert_eq!(batch.keys.len(), 64);
    assert!(batch.keys.iter().all(|k| k.shard == 0), "every row from shard 0");
    for r in 0..64 {
        let id = i64::from_le_bytes(batch.columns[0][r * 8..r * 8 + 8].try_into().unwrap());
        assert!((0..4).contains(&id), "row {r}: id {id}");
    }

    // Resumed and given enough items, it serves again.
    cluster.insert(WriteTarget::Shard(1), (1004..1100).map(one).collect(), 0).unwrap();
    let request = ClusterSample { rows: 64, window: WindowSpec::last(1), columns: vec![], random_start: false };
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut back = false;
    while !back && Instant::now() < deadline {
        let b = cluster.sample(&request).unwrap();
        back = b.lost.is_empty() && b.keys.iter().any(|k| k.shard == 1);
    }
    assert!(back, "shard 1 did not serve again after it resumed");
    drop(shards);
    let _ = std::fs::remove_dir_all(&dir);
}
