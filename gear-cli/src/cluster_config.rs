//! Cluster files: how trainers and actors reach the shard servers (TOML),
//! and `gear cluster-info`, which reads one and asks every shard its
//! counters.
//!
//! ```toml
//! shards = ["node0:50051", "node1:50051", "node2:50051"]  # index = shard id
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

/// `gear cluster-info`: every shard's counters, or why it did not answer.
pub fn cluster_info(path: &Path) -> Result<()> {
    let client = ClusterClient::new(ClusterFile::load(path)?.client_config()?).map_err(net)?;
    let mut failed = 0;
    for s in 0..client.shards() {
        match client.info(s) {
            Ok(i) => println!(
                "shard {s}: size {}/{} inserts {} samples {} evictions {} (incarnation {:#x})",
                i.size, i.capacity, i.inserts, i.samples, i.evictions, i.incarnation
            ),
            Err(e) => {
                failed += 1;
                // The error names the shard already.
                println!("{e}");
            }
        }
    }
    if failed > 0 {
        return Err(Error::Backend(format!("{failed} of {} shards did not answer", client.shards()).into()));
    }
    Ok(())
}
