//! # gear-net
//!
//! GEAR-rs over the network, on gRPC (tonic/prost; the interface is
//! `proto/gear.proto`):
//!
//! * [`server`]: a shard server hosting one or several
//!   [`gear_api::ReplayTable`]s, each under its name — spec and region,
//!   sampling (the shard draws with the table's strategy, gathers the
//!   windows and re-checks each slot's generation, redrawing torn rows),
//!   priority updates, streamed remote inserts, info, health, the list of
//!   tables;
//! * [`metrics`]: the server's Prometheus metrics and their HTTP endpoint;
//! * [`client`]: [`AsyncClusterClient`] (and [`ClusterClient`], a blocking
//!   wrapper over it), which samples one table across shards with one
//!   table's distribution (into the caller's buffers if asked), routes
//!   priority updates to the owning shard, spreads writers (whole
//!   trajectories, or one streamed while it is written), and leaves out
//!   (and reports) shards that fail;
//! * [`cluster_file`]: the cluster file (TOML) trainers and actors read;
//! * [`auth`]: the cluster token every call carries;
//! * [`tls`]: TLS (and mutual TLS) when the configs name certificates;
//! * [`rdma_settings`]: which RDMA device port the data plane opens.
//!
//! Contract: nothing received from the network can panic a server or a
//! client; every field is checked before use ([`convert`], the client's
//! reply decoder), every client call has a deadline that covers the last
//! byte of its reply.

#![warn(missing_docs)]
// tonic fixes the error type of every handler as `Status` (176 bytes); the
// checks that feed handlers return it too rather than box and unbox it.
#![allow(clippy::result_large_err)]

pub mod alloc;
pub mod auth;
mod body;
mod channel;
pub mod client;
pub mod cluster_file;
pub mod codec;
pub mod committed;
pub mod connect;
pub mod convert;
pub mod error;
pub mod metrics;
pub mod rdma_settings;
pub mod server;
pub mod tls;

/// The generated gRPC messages and services (`gear.v1`).
#[allow(missing_docs, clippy::all)]
pub mod proto {
    tonic::include_proto!("gear.v1");
    // The server, generated on its own (build.rs): its `Sample` replies are
    // `crate::server::SampleReplyOut`.
    include!(concat!(env!("OUT_DIR"), "/server/gear.v1.rs"));
}

pub use client::{
    AsyncClusterClient, BatchRows, ClusterBatch, ClusterClient, ClusterConfig, ClusterSample, DataPlane, LostShard,
    PriorityUpdates, RemoteKey, RemoteTrajectory, ShardInfo, ShardSpec, ShardTables, TableStatus, TrajectoryStream,
    WriteTarget,
};
pub use error::{Error, Result};
pub use metrics::{MetricsConfig, MetricsServer};
pub use rdma_settings::RdmaSettings;
pub use server::{
    DataPlaneServer, NamedTable, ServedTables, ServerConfig, ServerHandle, ShardService, StrategyInfo, DEFAULT_TABLE,
};
pub use tls::ClientTls;
