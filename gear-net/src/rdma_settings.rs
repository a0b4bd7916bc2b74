//! Which RDMA device port a shard server or a cluster client opens for the
//! byte-range data plane. Used only where gear-net opens the device itself
//! (built with the `rdma` feature, no transport injected); a transport
//! given to [`ServerHandle::start_with_transport`](crate::ServerHandle::start_with_transport)
//! or [`ClusterClient::with_transport`](crate::ClusterClient::with_transport)
//! brings its own.

use serde::Deserialize;

use crate::error::{Error, Result};

/// The RDMA device, port and GID table entry to open.
///
/// The default is the first device, port 1 and GID index 0. On InfiniBand
/// GID 0 is right; on RoCE v2 it usually is not: index 0 is commonly the
/// RoCE v1 or link-local GID, and the routable RoCE v2 GID sits at another
/// index (`show_gids` from rdma-core lists them; often 3).
///
/// ```toml
/// [grpc.rdma]          # in a shard config; `[rdma]` in a cluster file
/// device = "mlx5_0"    # else the first device
/// port = 1
/// gid_index = 3
/// ```
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(default, deny_unknown_fields)]
pub struct RdmaSettings {
    /// The device's name (`ibv_devices` lists them); `None`: the first one.
    pub device: Option<String>,
    /// The port of the device, numbered from 1.
    pub port: u8,
    /// The entry of the port's GID table this side is addressed by.
    pub gid_index: u8,
}

impl Default for RdmaSettings {
    fn default() -> Self {
        RdmaSettings { device: None, port: 1, gid_index: 0 }
    }
}

impl RdmaSettings {
    /// Refuses settings no device can have: port 0 (ports are numbered
    /// from 1) and an empty device name. The messages name the key
    /// (`rdma.port`, `rdma.device`).
    pub fn validate(&self) -> Result<()> {
        if self.port == 0 {
            return Err(Error::Config("rdma.port is 0; device ports are numbered from 1".into()));
        }
        if self.device.as_deref().is_some_and(|d| d.trim().is_empty()) {
            return Err(Error::Config("rdma.device is empty; name a device or leave the key out for the first".into()));
        }
        Ok(())
    }

    /// The transport server over the device these settings name; an error
    /// (`Unavailable` without the `rdma` feature or a device) otherwise.
    pub fn device_server(&self) -> gear_core::Result<Box<dyn gear_core::TransportServer>> {
        gear_rdma::device_server(self.device.as_deref(), self.port, self.gid_index)
    }

    /// The client transport over the device these settings name; an error
    /// (`Unavailable` without the `rdma` feature or a device) otherwise.
    pub fn device_transport(&self) -> gear_core::Result<Box<dyn gear_core::Transport>> {
        gear_rdma::device_transport(self.device.as_deref(), self.port, self.gid_index, gear_rdma::RdmaConfig::default())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn absurd_settings_are_refused_by_key() {
        assert!(RdmaSettings::default().validate().is_ok());
        let port = RdmaSettings { port: 0, ..RdmaSettings::default() }.validate().unwrap_err().to_string();
        assert!(port.contains("rdma.port"), "{port}");
        let device =
            RdmaSettings { device: Some(" ".into()), ..RdmaSettings::default() }.validate().unwrap_err().to_string();
        assert!(device.contains("rdma.device"), "{device}");
        let named = RdmaSettings { device: Some("mlx5_0".into()), port: 2, gid_index: 3 };
        assert!(named.validate().is_ok());
    }
}
