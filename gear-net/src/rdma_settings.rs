//! Which RDMA device port a shard server or a cluster client opens for the
//! byte-range data plane, with the path settings of its queue pairs and a
//! shard's bounds on them. Used only where gear-net opens the device itself
//! (built with the `rdma` feature, no transport injected); a transport
//! given to [`ServerHandle::start_with_transport`](crate::ServerHandle::start_with_transport)
//! or [`ClusterClient::with_transport`](crate::ClusterClient::with_transport)
//! brings its own.

use serde::Deserialize;

use crate::error::{Error, Result};

/// The RDMA device, port and GID table entry to open, the path settings
/// of every queue pair, and (on a shard) the bounds on client queue pairs.
///
/// The default is the first device, port 1, and the GID index chosen from
/// the port's GID table: its RoCE v2 entry of an IPv4 address, else of an
/// IPv6 address, else index 0 (InfiniBand, where 0 is right). On RoCE v2
/// index 0 is usually the link-local RoCE v1 entry, which does not cross
/// a router; set `gid_index` to override the choice (`show_gids` from
/// rdma-core lists the table).
///
/// ```toml
/// [grpc.rdma]          # in a shard config; `[rdma]` in a cluster file
/// device = "mlx5_0"    # else the first device
/// port = 1
/// gid_index = 3        # else chosen from the GID table
/// traffic_class = 106  # GRH traffic class (RoCE v2: DSCP 26 and ECN 10)
/// service_level = 3    # 0 to 15
/// # A shard's bounds (a client ignores them):
/// max_queue_pairs = 4096
/// max_queue_pairs_per_client = 256
/// idle_timeout_ms = 60000
/// ```
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(default, deny_unknown_fields)]
pub struct RdmaSettings {
    /// The device's name (`ibv_devices` lists them); `None`: the first one.
    pub device: Option<String>,
    /// The port of the device, numbered from 1.
    pub port: u8,
    /// The entry of the port's GID table this side is addressed by;
    /// `None`: the routable RoCE v2 entry where the port has one, else 0.
    pub gid_index: Option<u8>,
    /// Traffic class of every queue pair's global route header (on RoCE
    /// v2 the IP header's DSCP in the upper six bits, ECN in the lower two).
    pub traffic_class: u8,
    /// Service level of every queue pair's address vector, 0 to 15 (the
    /// virtual lane on InfiniBand; a priority where a RoCE fabric maps it).
    pub service_level: u8,
    /// A shard's bound on queue pairs over all its clients.
    pub max_queue_pairs: usize,
    /// A shard's bound on queue pairs of one client host (one GID).
    pub max_queue_pairs_per_client: usize,
    /// A shard reaps client connections idle (no sample) this long, in
    /// milliseconds, when it needs room for a new one.
    pub idle_timeout_ms: u64,
}

impl Default for RdmaSettings {
    fn default() -> Self {
        let server = gear_rdma::RdmaServerConfig::default();
        RdmaSettings {
            device: None,
            port: 1,
            gid_index: None,
            traffic_class: 0,
            service_level: 0,
            max_queue_pairs: server.max_queue_pairs,
            max_queue_pairs_per_client: server.max_queue_pairs_per_client,
            idle_timeout_ms: server.idle_timeout.as_millis() as u64,
        }
    }
}

impl RdmaSettings {
    /// Refuses settings no device can have: port 0 (ports are numbered
    /// from 1), an empty device name, a service level above 15, bounds of
    /// 0. The messages name the key (`rdma.port`, `rdma.device`, ...).
    pub fn validate(&self) -> Result<()> {
        if self.port == 0 {
            return Err(Error::Config("rdma.port is 0; device ports are numbered from 1".into()));
        }
        if self.device.as_deref().is_some_and(|d| d.trim().is_empty()) {
            return Err(Error::Config("rdma.device is empty; name a device or leave the key out for the first".into()));
        }
        if self.service_level > gear_rdma::verbs::MAX_SERVICE_LEVEL {
            return Err(Error::Config(format!(
                "rdma.service_level is {}; service levels are 0 to {}",
                self.service_level,
                gear_rdma::verbs::MAX_SERVICE_LEVEL
            )));
        }
        for (key, value) in
            [("max_queue_pairs", self.max_queue_pairs), ("max_queue_pairs_per_client", self.max_queue_pairs_per_client)]
        {
            if value == 0 {
                return Err(Error::Config(format!("rdma.{key} is 0; a shard needs room for one client at least")));
            }
        }
        Ok(())
    }

    /// The bounds and path settings of a shard's RDMA server.
    pub fn server_config(&self) -> gear_rdma::RdmaServerConfig {
        gear_rdma::RdmaServerConfig {
            max_queue_pairs: self.max_queue_pairs,
            max_queue_pairs_per_client: self.max_queue_pairs_per_client,
            idle_timeout: std::time::Duration::from_millis(self.idle_timeout_ms),
            traffic_class: self.traffic_class,
            service_level: self.service_level,
            ..gear_rdma::RdmaServerConfig::default()
        }
    }

    /// The tuning of a client's RDMA transport: the defaults with these
    /// path settings.
    pub fn transport_config(&self) -> gear_rdma::RdmaConfig {
        gear_rdma::RdmaConfig {
            traffic_class: self.traffic_class,
            service_level: self.service_level,
            ..gear_rdma::RdmaConfig::default()
        }
    }

    /// The transport server over the device these settings name; an error
    /// (`Unavailable` without the `rdma` feature or a device) otherwise.
    pub fn device_server(&self) -> gear_core::Result<Box<dyn gear_core::TransportServer>> {
        gear_rdma::device_server(self.device.as_deref(), self.port, self.gid_index, self.server_config())
    }

    /// The client transport over the device these settings name; an error
    /// (`Unavailable` without the `rdma` feature or a device) otherwise.
    pub fn device_transport(&self) -> gear_core::Result<Box<dyn gear_core::Transport>> {
        gear_rdma::device_transport(self.device.as_deref(), self.port, self.gid_index, self.transport_config())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn absurd_settings_are_refused_by_key() {
        assert!(RdmaSettings::default().validate().is_ok());
        let refused = |s: RdmaSettings| s.validate().unwrap_err().to_string();
        let port = refused(RdmaSettings { port: 0, ..RdmaSettings::default() });
        assert!(port.contains("rdma.port"), "{port}");
        let device = refused(RdmaSettings { device: Some(" ".into()), ..RdmaSettings::default() });
        assert!(device.contains("rdma.device"), "{device}");
        let level = refused(RdmaSettings { service_level: 16, ..RdmaSettings::default() });
        assert!(level.contains("rdma.service_level is 16"), "{level}");
        let bound = refused(RdmaSettings { max_queue_pairs_per_client: 0, ..RdmaSettings::default() });
        assert!(bound.contains("rdma.max_queue_pairs_per_client is 0"), "{bound}");
        let named = RdmaSettings {
            device: Some("mlx5_0".into()),
            port: 2,
            gid_index: Some(3),
            traffic_class: 106,
            service_level: 15,
            ..RdmaSettings::default()
        };
        assert!(named.validate().is_ok());
        let server = named.server_config();
        assert_eq!((server.traffic_class, server.service_level), (106, 15));
        assert_eq!(server.idle_timeout, std::time::Duration::from_secs(60));
        let client = named.transport_config();
        assert_eq!((client.traffic_class, client.service_level), (106, 15));
    }
}
