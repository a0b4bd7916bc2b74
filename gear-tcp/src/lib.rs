//! # gear-tcp
//!
//! The TCP transport of GEAR-rs: byte ranges of a remote shard's region
//! read over a streamed gRPC call (`proto/gear_data.proto`,
//! `gear.data.v1.RegionReader`), implementing gear-core's
//! [`Transport`](gear_core::Transport) (the trainer's side,
//! [`TcpTransport`]) and [`TransportServer`](gear_core::TransportServer)
//! (the shard's side, [`TcpServer`]). It is the fallback that runs
//! everywhere, where RDMA (gear-rdma) is unavailable.
//!
//! * The server exposes regions and hands out a tonic service
//!   ([`TcpServer::service`]) that the shard's gRPC server adds to its own
//!   router: same port, and the caller wraps it in its own interceptor (the
//!   cluster token). Every request is checked against the exposed region
//!   ([`gear_core::check_read_ops`]) and refused with `OUT_OF_RANGE` or
//!   `NOT_FOUND` before a byte is read; nothing from the network panics.
//! * The client posts a batch of reads as one streamed call on its own
//!   tokio runtime and returns a [`Ticket`](gear_core::Ticket) at once; the
//!   chunks land in the registered local buffer as they arrive.
//!
//! Connection data (the address and the region id) travels in gear-core's
//! [`RemoteRegion`](gear_core::RemoteRegion); this crate knows nothing of
//! the control plane that carries it.
//!
//! Architecture invariant: depends on gear-core only among workspace crates
//! (plus tonic, prost, tokio, tokio-stream, parking_lot and thiserror).

#![warn(missing_docs)]
// tonic fixes the error type of every handler as `Status` (176 bytes).
#![allow(clippy::result_large_err)]

pub mod client;
pub mod error;
pub mod server;

/// The generated gRPC messages and services (`gear.data.v1`).
#[allow(missing_docs, clippy::all)]
pub mod proto {
    tonic::include_proto!("gear.data.v1");
}

pub use client::{TcpConfig, TcpTransport};
pub use error::{Error, Result};
pub use server::{ReadService, TcpServer, DEFAULT_CHUNK_BYTES, MAX_RANGES};
