//! Cluster files: how trainers and actors reach the shard servers (TOML),
//! and `gear cluster-info`, which reads one and asks every shard its
//! counters. Every key: docs/CONFIG.md; `gear config example cluster`
//! prints a commented one. Relative paths are taken from the working
//! directory, as in `[grpc]`.

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
        Self::parse(&text).map_err(|e| crate::config::in_file(path, e))
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

/// Whether `e` says the shard is not listening (yet): refused or
/// unreachable connections, as right after `gear serve` starts (it listens
/// once its table exists).
fn not_up(e: &gear_net::Error) -> bool {
    match e {
        gear_net::Error::Status { status, .. } => status.code() == tonic::Code::Unavailable,
        gear_net::Error::Transport(_) => true,
        _ => false,
    }
}

/// Prints what `show` makes of each shard's answer to `ask`, or the error
/// of each shard that did not answer (it names the shard); fails, after
/// every shard was asked, when any did not answer.
pub fn each_shard<T>(
    client: &ClusterClient,
    mut ask: impl FnMut(usize) -> gear_net::Result<T>,
    mut show: impl FnMut(usize, T),
) -> Result<()> {
    let mut failed = 0;
    for s in 0..client.shards() {
        match ask(s) {
            Ok(answer) => show(s, answer),
            Err(e) => {
                failed += 1;
                println!("{e}");
            }
        }
    }
    if failed > 0 {
        return Err(Error::Config(format!("{failed} of {} shards did not answer", client.shards())));
    }
    Ok(())
}

/// `gear cluster-info`: every shard's counters, or why it did not answer.
/// A shard that is not listening yet is asked again for up to `wait`
/// (saying so), so that this works right after the servers start.
pub fn cluster_info(path: &Path, wait: Duration) -> Result<()> {
    let client = ClusterClient::new(ClusterFile::load(path)?.client_config()?).map_err(net)?;
    let deadline = std::time::Instant::now() + wait;
    let ask = |s: usize| {
        let mut said = false;
        loop {
            match client.info(s) {
                Err(e) if not_up(&e) && std::time::Instant::now() < deadline => {
                    if !said {
                        eprintln!(
                            "shard {s} is not answering yet ({e}); it may still be starting (`gear serve` listens \
                             once its table is created): waiting up to {:.0} s",
                            deadline.saturating_duration_since(std::time::Instant::now()).as_secs_f64()
                        );
                        said = true;
                    }
                    std::thread::sleep(Duration::from_millis(250));
                }
                other => break other,
            }
        }
    };
    each_shard(&client, ask, |s, i| {
        println!(
            "shard {s}: size {}/{} inserts {} samples {} evictions {} (incarnation {:#x})",
            i.size, i.capacity, i.inserts, i.samples, i.evictions, i.incarnation
        )
    })
}
