//! # gear-rdma
//!
//! The RDMA transport of GEAR-rs: windows of a remote shard's table read by
//! one-sided RDMA READs (InfiniBand or RoCE), implementing gear-core's
//! [`Transport`](gear_core::Transport) (the trainer's side, [`RdmaTransport`])
//! and [`TransportServer`](gear_core::TransportServer) (the shard's side,
//! [`RdmaServer`]).
//!
//! The logic (chains of at most 32 READs with only the last signalled,
//! spread over several reliable-connection queue pairs, completion
//! handling, retries, error reporting) is written against the [`Verbs`]
//! trait, which has two implementations:
//!
//! * `SidewayVerbs` (feature `rdma`): rdma-core through the `sideway`
//!   crate, which loads `libibverbs.so.1` at run time; a machine without
//!   the library or a device gets [`Error::Unavailable`], never a crash.
//!   **It has not run on RDMA hardware yet**; `cargo xtask rdma-test` is the
//!   loopback test for a machine that has a device.
//! * [`InProcessVerbs`]: a test implementation in one process (bytes move by
//!   `memcpy`), with fault injection, on which the tests of the logic run.
//!   It is not a transport for production.
//!
//! Connection data (GID, LID, MTU, QP numbers, PSNs, address, rkey) travels
//! in gear-core's plain [`RemoteRegion`](gear_core::RemoteRegion) and
//! [`PeerEndpoint`](gear_core::PeerEndpoint), which the control plane
//! carries; this crate knows nothing of the control plane.
//!
//! Architecture invariant: depends on gear-core only (plus `thiserror`, and
//! `sideway` with the `rdma` feature).

pub mod client;
pub mod config;
pub mod error;
pub mod gid;
pub mod in_process;
pub mod server;
#[cfg(feature = "rdma")]
pub mod sideway_verbs;
pub mod verbs;

pub use client::RdmaTransport;
pub use config::{RdmaConfig, RdmaServerConfig};
pub use error::{Error, Result};
pub use in_process::{InProcessFabric, InProcessVerbs};
pub use server::RdmaServer;
#[cfg(feature = "rdma")]
pub use sideway_verbs::SidewayVerbs;
pub use verbs::Verbs;

/// Opens the real RDMA device (`device` or the first, port `port_num`, GID
/// table entry `gid_index`, or when `None` the one
/// [`gid::default_gid_index`] picks from the port's table) for a transport
/// or a server. Without the `rdma` feature, or on a machine without RDMA,
/// this is [`Error::Unavailable`]: callers fall back to TCP.
#[cfg(feature = "rdma")]
pub fn open_device(device: Option<&str>, port_num: u8, gid_index: Option<u8>) -> Result<SidewayVerbs> {
    SidewayVerbs::open(device, port_num, gid_index)
}

/// Opens the real RDMA device: this build has no RDMA backend (built
/// without the `rdma` feature), so this is always [`Error::Unavailable`].
#[cfg(not(feature = "rdma"))]
pub fn open_device(device: Option<&str>, port_num: u8, gid_index: Option<u8>) -> Result<InProcessVerbs> {
    let _ = (device, port_num, gid_index);
    Err(Error::Unavailable("gear-rdma was built without the `rdma` feature".into()))
}

/// The trainer's RDMA transport over the real device, as a
/// `gear_core::Transport` chosen at run time; [`Error::Unavailable`] (as
/// `gear_core::Error::TransportUnavailable`) where RDMA cannot run.
pub fn device_transport(
    device: Option<&str>,
    port_num: u8,
    gid_index: Option<u8>,
    config: RdmaConfig,
) -> gear_core::Result<Box<dyn gear_core::Transport>> {
    config.validate()?;
    let verbs = open_device(device, port_num, gid_index)?;
    Ok(Box::new(RdmaTransport::new(verbs, config)?))
}

/// The shard's RDMA server over the real device, as a
/// `gear_core::TransportServer`; unavailable as for [`device_transport`].
pub fn device_server(
    device: Option<&str>,
    port_num: u8,
    gid_index: Option<u8>,
    config: RdmaServerConfig,
) -> gear_core::Result<Box<dyn gear_core::TransportServer>> {
    config.validate()?;
    let verbs = open_device(device, port_num, gid_index)?;
    Ok(Box::new(RdmaServer::with_config(verbs, config)?))
}
