//! Cluster files: how trainers and actors reach the shard servers (TOML),
//! and `gear cluster-info`, which reads one and asks every shard its
//! tables' counters (once, or live with `--watch`).
//!
//! ```toml
//! shards = ["node0:50051", "node1:50051", "node2:50051"]  # index = shard id
//! # table = "replay"              # the table clients use (else each shard's only one)
//! # token = "..."                 # else the GEAR_TOKEN environment variable
//! # call_timeout_ms = 10000       # deadline of every call
//! # connect_timeout_ms = 1000
//! # free_space_refresh_ms = 500   # WriteTarget::MostFree asks sizes this often
//! # mass_refresh_ms = 100         # a shard's mass from its replies is used this long (0: ask every batch)
//!
//! [tls]                           # optional: the servers have tls_cert/tls_key
//! ca = "ca.pem"                   # the CA that signed the servers' certificates
//! domain = "gear.cluster.local"   # the name in their certificates (else each host)
//! # cert = "client.pem"           # mutual TLS: this client's certificate
//! # key = "client.key"            # and key
//!
//! [rdma]                          # optional: the RDMA device byte-range reads use
//! # device = "mlx5_0"             # else the first device
//! # port = 1                      # from 1
//! # gid_index = 3                 # else the RoCE v2 IPv4/IPv6 entry, else 0 (`show_gids`)
//! # traffic_class = 0             # GRH traffic class (RoCE v2 DSCP and ECN bits)
//! # service_level = 0             # 0 to 15
//! ```
//!
//! Relative paths are taken from the working directory, as in `[grpc]`.

use gear_api::{Error, Result};
use gear_net::{ClientTls, ClusterClient, ClusterConfig, RdmaSettings};
use serde::Deserialize;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// A cluster file.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ClusterFile {
    /// `host:port` of each shard server, in shard order.
    pub shards: Vec<String>,
    /// The table clients use, by its name on the shards (else each
    /// shard's only table).
    pub table: Option<String>,
    /// The cluster token (else `$GEAR_TOKEN`).
    pub token: Option<String>,
    /// Deadline of every call, in milliseconds.
    pub call_timeout_ms: Option<u64>,
    /// Deadline of connecting, in milliseconds.
    pub connect_timeout_ms: Option<u64>,
    /// How often writers spread by free space ask the shards' sizes.
    pub free_space_refresh_ms: Option<u64>,
    /// How long a shard's mass, from its last reply, splits batches before
    /// the shards are asked again (0: before every batch).
    pub mass_refresh_ms: Option<u64>,
    /// TLS towards the shards.
    pub tls: Option<ClusterTls>,
    /// The RDMA device port the byte-range data plane opens.
    #[serde(default)]
    pub rdma: RdmaSettings,
}

/// The `[tls]` section of a cluster file.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ClusterTls {
    /// The CA certificate (PEM) the servers' certificates are signed by.
    pub ca: PathBuf,
    /// The name the servers' certificates carry.
    pub domain: Option<String>,
    /// This client's certificate (PEM), for mutual TLS.
    pub cert: Option<PathBuf>,
    /// This client's private key (PEM), for mutual TLS.
    pub key: Option<PathBuf>,
}

fn net(e: gear_net::Error) -> Error {
    Error::Backend(Box::new(e))
}

impl ClusterFile {
    /// Reads and parses a cluster file.
    pub fn load(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| Error::Config(format!("cannot read cluster file {}: {e}", path.display())))?;
        Self::parse(&text).map_err(|e| Error::Config(format!("{}: {e}", path.display())))
    }

    /// Parses cluster-file text.
    pub fn parse(text: &str) -> Result<Self> {
        let file: ClusterFile = toml::from_str(text).map_err(|e| Error::Config(e.to_string()))?;
        crate::config::check_rdma(&file.rdma, "")?;
        Ok(file)
    }

    /// The client config: resolves the token and reads the TLS files.
    pub fn client_config(&self) -> Result<ClusterConfig> {
        let token = gear_net::auth::resolve_token(self.token.as_deref()).map_err(net)?;
        let mut config = ClusterConfig::new(self.shards.clone(), token);
        if let Some(table) = &self.table {
            gear_net::server::check_table_name(table).map_err(|e| match e {
                gear_net::Error::Config(what) => Error::Config(format!("table: {what}")),
                e => net(e),
            })?;
            config.table = table.clone();
        }
        config.rdma = self.rdma.clone();
        if let Some(ms) = self.call_timeout_ms {
            config.call_timeout = Duration::from_millis(ms);
        }
        if let Some(ms) = self.connect_timeout_ms {
            config.connect_timeout = Duration::from_millis(ms);
        }
        if let Some(ms) = self.free_space_refresh_ms {
            config.free_space_refresh = Duration::from_millis(ms);
        }
        if let Some(ms) = self.mass_refresh_ms {
            config.mass_refresh = Duration::from_millis(ms);
        }
        if let Some(t) = &self.tls {
            let mut tls = ClientTls::from_file(&t.ca, t.domain.clone()).map_err(net)?;
            tls = match (&t.cert, &t.key) {
                (Some(cert), Some(key)) => tls.with_identity_files(cert, key).map_err(net)?,
                (None, None) => tls,
                _ => return Err(Error::Config("[tls]: give both cert and key, or neither".into())),
            };
            config.tls = Some(tls);
        }
        Ok(config)
    }
}

/// `gear cluster-info`'s options.
#[derive(Clone, Copy, Debug, Default)]
pub struct InfoOptions {
    /// Print the figures again every `interval`, with rates since the
    /// previous refresh, until interrupted or `count` refreshes.
    pub watch: bool,
    /// Time between two refreshes.
    pub interval: std::time::Duration,
    /// Stop after this many refreshes (`None`: until interrupted).
    pub count: Option<u64>,
}

/// One shard's answer: its tables, or why it did not answer.
type ShardAnswer = std::result::Result<gear_net::ShardTables, gear_net::Error>;

/// `gear cluster-info`: every shard's tables and their counters, or why it
/// did not answer; with `--watch`, live.
pub fn cluster_info(path: &Path, options: InfoOptions) -> Result<()> {
    let file = ClusterFile::load(path)?;
    let client = ClusterClient::new(file.client_config()?).map_err(net)?;
    let only = file.table.as_deref();
    let ask = || (0..client.shards()).map(|s| client.tables(s)).collect::<Vec<ShardAnswer>>();
    if !options.watch {
        let answers = ask();
        print_once(&answers, only);
        let failed = answers.iter().filter(|a| a.is_err()).count();
        if failed > 0 {
            return Err(Error::Backend(format!("{failed} of {} shards did not answer", client.shards()).into()));
        }
        return Ok(());
    }
    // SAFETY: isatty only reads the descriptor's state.
    let terminal = unsafe { libc::isatty(1) } == 1;
    let mut previous: Option<(std::time::Instant, Vec<ShardAnswer>)> = None;
    let mut refreshes = 0u64;
    loop {
        let at = std::time::Instant::now();
        let answers = ask();
        if terminal {
            // Clear the screen and go home: one frame per refresh.
            print!("\x1b[H\x1b[2J");
        }
        let since = previous.as_ref().map(|(t, a)| (at.duration_since(*t).as_secs_f64(), a.as_slice()));
        print_frame(&answers, since, only, options.interval);
        use std::io::Write as _;
        let _ = std::io::stdout().flush();
        previous = Some((at, answers));
        refreshes += 1;
        if options.count.is_some_and(|n| refreshes >= n) {
            return Ok(());
        }
        std::thread::sleep(options.interval.saturating_sub(at.elapsed()));
    }
}

/// The tables of `answer` that `only` selects (all when `None`).
fn selected<'a>(
    answer: &'a gear_net::ShardTables,
    only: Option<&'a str>,
) -> impl Iterator<Item = &'a gear_net::TableStatus> {
    answer.tables.iter().filter(move |t| only.is_none_or(|o| o == t.name))
}

fn print_once(answers: &[ShardAnswer], only: Option<&str>) {
    for (s, answer) in answers.iter().enumerate() {
        match answer {
            Ok(a) => {
                println!("shard {s}: {} table(s) (incarnation {:#x})", a.tables.len(), a.incarnation);
                for t in selected(a, only) {
                    println!(
                        "  table `{}` ({}): size {}/{} inserts {} samples {} evictions {} retired {} \
                         (incarnation {:#x})",
                        t.name,
                        t.sampler,
                        t.size,
                        t.capacity,
                        t.inserts,
                        t.samples,
                        t.evictions,
                        t.retired,
                        t.incarnation
                    );
                }
            }
            // The error names the shard already.
            Err(e) => println!("{e}"),
        }
    }
}

/// Per second between two readings of a counter (`-` without a previous one).
fn rate(now: u64, before: Option<u64>, seconds: f64, scale: f64) -> String {
    match before {
        Some(b) if seconds > 0.0 && now >= b => format!("{:.1}", (now - b) as f64 / seconds / scale),
        _ => "-".into(),
    }
}

/// One `--watch` frame: per shard and table, the fill, the rates since the
/// previous frame and the waits.
fn print_frame(
    answers: &[ShardAnswer],
    since: Option<(f64, &[ShardAnswer])>,
    only: Option<&str>,
    interval: std::time::Duration,
) {
    println!("gear cluster-info --watch: every {:.1} s; Ctrl-C stops", interval.as_secs_f64());
    println!(
        "{:<5} {:<16} {:>15} {:>10} {:>10} {:>9} {:>9} {:>22} {:>16}",
        "shard",
        "table",
        "size/capacity",
        "inserts/s",
        "rows/s",
        "MB/s in",
        "MB/s out",
        "limiter waits ins/smp",
        "lock waits"
    );
    for (s, answer) in answers.iter().enumerate() {
        let a = match answer {
            Ok(a) => a,
            Err(e) => {
                println!("{s:<5} not answering: {e}");
                continue;
            }
        };
        for t in selected(a, only) {
            // The same table of the same run, a refresh ago.
            let before = since.and_then(|(secs, prev)| {
                let prev = prev.get(s)?.as_ref().ok()?;
                let p = prev.tables.iter().find(|p| p.name == t.name && p.incarnation == t.incarnation)?;
                Some((secs, p))
            });
            let secs = before.map_or(0.0, |(secs, _)| secs);
            let p = before.map(|(_, p)| p);
            println!(
                "{:<5} {:<16} {:>15} {:>10} {:>10} {:>9} {:>9} {:>22} {:>16}",
                s,
                t.name,
                format!("{}/{}", t.size, t.capacity),
                rate(t.inserts, p.map(|p| p.inserts), secs, 1.0),
                rate(t.samples, p.map(|p| p.samples), secs, 1.0),
                rate(t.bytes_in, p.map(|p| p.bytes_in), secs, 1e6),
                rate(t.bytes_out, p.map(|p| p.bytes_out), secs, 1e6),
                format!(
                    "{}/{} ({:.1}/{:.1} s)",
                    t.waits.insert_waits,
                    t.waits.sample_waits,
                    t.waits.insert_wait.as_secs_f64(),
                    t.waits.sample_wait.as_secs_f64()
                ),
                format!("{} ({:.3} s)", t.waits.lock_waits, t.waits.lock_wait.as_secs_f64()),
            );
        }
    }
}
