//! Cluster files: how trainers and actors reach the shard servers (TOML).
//! `gear cluster-info`, the Python package's `gear.Cluster.from_file` and
//! any Rust trainer read them with [`ClusterFile`].
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

use crate::error::{Error, Result};
use crate::{ClientTls, ClusterConfig, RdmaSettings};
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

impl ClusterTls {
    /// The client's TLS settings: reads and checks the PEM files.
    pub fn client_tls(&self) -> Result<ClientTls> {
        let tls = ClientTls::from_file(&self.ca, self.domain.clone())?;
        match (&self.cert, &self.key) {
            (Some(cert), Some(key)) => tls.with_identity_files(cert, key),
            (None, None) => Ok(tls),
            _ => Err(Error::Config("[tls]: give both cert and key, or neither".into())),
        }
    }
}

impl ClusterFile {
    /// Reads and parses a cluster file; errors name the file.
    pub fn load(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| Error::Config(format!("cannot read cluster file {}: {e}", path.display())))?;
        Self::parse_text(&text).map_err(|e| Error::Config(format!("{}: {e}", path.display())))
    }

    /// Parses cluster-file text.
    pub fn parse(text: &str) -> Result<Self> {
        Self::parse_text(text).map_err(Error::Config)
    }

    /// Parses, with the problem alone as the error (callers add where).
    fn parse_text(text: &str) -> std::result::Result<Self, String> {
        let file: ClusterFile = toml::from_str(text).map_err(|e| e.to_string())?;
        file.rdma.validate().map_err(|e| match e {
            Error::Config(what) => what,
            other => other.to_string(),
        })?;
        Ok(file)
    }

    /// The client config: resolves the token (the file's, else
    /// `$GEAR_TOKEN`) and reads the TLS files.
    pub fn client_config(&self) -> Result<ClusterConfig> {
        let token = crate::auth::resolve_token(self.token.as_deref())?;
        let mut config = ClusterConfig::new(self.shards.clone(), token);
        if let Some(table) = &self.table {
            crate::server::check_table_name(table).map_err(|e| match e {
                Error::Config(what) => Error::Config(format!("table: {what}")),
                e => e,
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
            config.tls = Some(t.client_tls()?);
        }
        Ok(config)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_keys_and_bad_rdma_settings_are_refused_naming_them() {
        let e = ClusterFile::parse("shards = []\ncolour = 1").unwrap_err().to_string();
        assert!(e.contains("colour"), "{e}");
        let e = ClusterFile::parse("shards = [\"a:1\"]\n[rdma]\nport = 0\n").unwrap_err().to_string();
        assert!(e.contains("rdma.port is 0"), "{e}");
        // One prefix, not two.
        assert_eq!(e.matches("invalid configuration").count(), 1, "{e}");
    }

    #[test]
    fn settings_reach_the_client_config() {
        let file = ClusterFile::parse(
            "shards = [\"a:1\", \"b:2\"]\ntoken = \"0123456789abcdef0\"\ncall_timeout_ms = 2500\nmass_refresh_ms = 0\n",
        )
        .unwrap();
        let config = file.client_config().unwrap();
        assert_eq!(config.shards, vec!["a:1".to_owned(), "b:2".to_owned()]);
        assert_eq!(config.call_timeout, Duration::from_millis(2500));
        assert_eq!(config.mass_refresh, Duration::ZERO);
        assert!(config.tls.is_none());
    }
}
