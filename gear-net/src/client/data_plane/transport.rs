//! The byte-range transport, its registered batch buffer and its
//! connections to the shards, and which shards' rows are gathered instead.

use std::sync::Arc;
use std::time::Instant;

use gear_core::{HeapRegion, RemoteAccess, Transport};
use tokio::runtime::Handle;

use super::{Connection, DataPlane, DataPlaneState, Deadline, MAX_RANGE_BATCH_BYTES, RETRY_AFTER};
use crate::client::cluster::{status, within, ClientCore};
use crate::client::ClusterSample;
use crate::connect::{remote_from_reply, request_from_endpoint};
use crate::error::{Error, Result};

impl ClientCore {
    /// Makes the byte-range transport the config asks for, once.
    pub(super) fn make_transport(&self, st: &mut DataPlaneState) {
        st.tried = true;
        st.transport = match self.config.data_plane {
            DataPlane::ShardGather => None,
            DataPlane::ByteRangeTcp => self.tcp_transport(),
            DataPlane::ByteRange => {
                st.supplied.take().or_else(|| self.rdma_transport()).or_else(|| self.tcp_transport())
            }
            // Without RDMA, Auto gathers on the shards: no TCP transport is
            // made.
            DataPlane::Auto => st.supplied.take().or_else(|| self.rdma_transport()),
        };
        st.connections = (0..self.shards.len()).map(|_| None).collect();
        st.gather_only = vec![None; self.shards.len()];
        st.connect_backoff = vec![None; self.shards.len()];
        *self.transport_kind.lock() = st.transport.as_ref().map(|t| t.kind());
    }

    /// Registers a batch buffer of at least `bytes` unless a registration
    /// of as much failed less than [`RETRY_AFTER`] ago; whether it is
    /// there (else the shards gather such batches).
    pub(super) fn register_batch_buffer(&self, st: &mut DataPlaneState, bytes: u64) -> bool {
        if st.register_backoff.is_some_and(|(failed, until)| bytes >= failed && Instant::now() < until) {
            return false;
        }
        match self.ensure_buffer(st, bytes) {
            Ok(()) => true,
            Err(e) => {
                tracing::warn!(
                    "a batch buffer of {bytes} bytes cannot be registered with the data plane ({e}); the shards \
                     gather such batches for {RETRY_AFTER:?}"
                );
                st.register_backoff = Some((bytes, Instant::now() + RETRY_AFTER));
                false
            }
        }
    }

    /// Bytes of one batch of `request`; `None` if the spec cannot be had or
    /// the request is not valid for it (rows, window, column names).
    pub(super) async fn batch_bytes(&self, request: &ClusterSample, deadline: Deadline) -> Option<u64> {
        let spec = self.cached_spec(deadline).await.ok()?;
        if request.rows == 0 || request.rows > crate::convert::MAX_SAMPLE_ROWS {
            return None;
        }
        let row = crate::client::assemble::row_bytes(&spec, request)?
            .into_iter()
            .try_fold(0u64, |sum, bytes| sum.checked_add(u64::try_from(bytes).ok()?))?;
        // Larger batches go the gather way, whose message limit refuses them.
        row.checked_mul(request.rows).filter(|&b| b <= MAX_RANGE_BATCH_BYTES)
    }

    fn rdma_transport(&self) -> Option<Box<dyn Transport>> {
        match self.config.rdma.device_transport() {
            Ok(t) => Some(t),
            Err(e) => {
                tracing::info!("rdma data plane unavailable ({e})");
                None
            }
        }
    }

    fn tcp_transport(&self) -> Option<Box<dyn Transport>> {
        let config = gear_tcp::TcpConfig {
            connect_timeout: self.config.connect_timeout,
            call_timeout: self.config.call_timeout,
            headers: vec![("authorization".into(), format!("Bearer {}", self.config.token))],
            ..gear_tcp::TcpConfig::default()
        };
        match gear_tcp::TcpTransport::new(config) {
            Ok(t) => Some(Box::new(t)),
            Err(e) => {
                tracing::warn!("tcp data plane unavailable ({e})");
                None
            }
        }
    }

    /// Connects to `shard` (again after it restarted).
    pub(super) fn connection(
        &self,
        rt: &Handle,
        st: &mut DataPlaneState,
        shard: usize,
        incarnation: u64,
        deadline: Deadline,
    ) -> Result<()> {
        if st.connections[shard].as_ref().is_some_and(|c| c.incarnation == incarnation) {
            return Ok(());
        }
        let transport = st.transport.as_ref().ok_or_else(|| Error::Config("no transport".into()))?;
        if let Some(old) = st.connections[shard].take() {
            let _ = transport.disconnect(&old.handle);
        }
        let pending = transport.prepare_connection(shard as u32)?;
        let session = pending.endpoint.session();
        let answer = (|| {
            let mut c = self.shards[shard].grpc.clone();
            let mut request = request_from_endpoint(&pending.endpoint);
            request.table = self.config.table.clone();
            let reply = rt.block_on(within(deadline, c.connect_data_plane(request))).map_err(|s| status(shard, s))?;
            let mut remote = remote_from_reply(&reply).map_err(|what| Error::Malformed { shard, what })?;
            if let RemoteAccess::Tcp { peer, .. } = &mut remote.access {
                // The data service shares the shard's gRPC port: dial the
                // address this client reaches the shard at, not the one the
                // shard listens on (0.0.0.0, a private name).
                peer.address = self.config.shards[shard].clone();
            }
            Ok::<_, Error>((reply.incarnation, remote))
        })();
        let (incarnation, remote) = match answer {
            Ok(answer) => answer,
            Err(e) => {
                // No answer to connect with: free what was prepared.
                let _ = transport.abort(pending);
                return Err(e);
            }
        };
        let handle = transport.connect(pending, &remote)?;
        st.connections[shard] = Some(Connection { incarnation, handle });
        st.session = session;
        Ok(())
    }

    /// Whether `shard`'s rows are gathered: it refused to connect over the
    /// transport in the incarnation it answered `Info` with this batch, or
    /// a connect failed less than [`RETRY_AFTER`] ago.
    pub(super) fn is_gather_only(&self, st: &DataPlaneState, shard: usize) -> bool {
        if st.connect_backoff[shard].is_some_and(|until| Instant::now() < until) {
            return true;
        }
        let known = self.state.lock()[shard].incarnation;
        st.gather_only[shard].is_some_and(|refused| known == Some(refused))
    }

    /// A connect to `shard` failed with `e`: gather its rows, for its
    /// incarnation when it does not serve the transport, else for
    /// [`RETRY_AFTER`].
    pub(super) fn note_connect_failure(&self, st: &mut DataPlaneState, shard: usize, incarnation: u64, e: &Error) {
        let kind = st.transport.as_ref().map_or("the transport", |t| t.kind().name());
        let address = &self.config.shards[shard];
        match e {
            Error::Status { status, .. } if status.code() == tonic::Code::FailedPrecondition => {
                tracing::info!(
                    "shard {shard} ({address}) does not serve {kind} ({}); its rows are gathered by the shard",
                    status.message()
                );
                st.gather_only[shard] = Some(incarnation);
            }
            e => {
                tracing::warn!(
                    "shard {shard} ({address}): {kind} connect failed ({e}); its rows are gathered by the shard for \
                     {RETRY_AFTER:?}"
                );
                st.connect_backoff[shard] = Some(Instant::now() + RETRY_AFTER);
            }
        }
    }

    /// Registers a batch buffer of at least `bytes`, once (again only when
    /// a larger batch needs more).
    pub(super) fn ensure_buffer(&self, st: &mut DataPlaneState, bytes: u64) -> Result<()> {
        if st.buffer.as_ref().is_some_and(|(_, b)| b.len() >= bytes) {
            return Ok(());
        }
        let transport = st.transport.as_ref().ok_or_else(|| Error::Config("no transport".into()))?;
        if let Some((_, old)) = st.buffer.take() {
            transport.release_local(&old)?;
        }
        let len = usize::try_from(bytes.max(1))
            .map_err(|_| Error::Config(format!("a batch of {bytes} bytes is too large")))?;
        let region = Arc::new(HeapRegion::zeroed(len));
        let local = transport.register_local(region.clone())?;
        st.buffer = Some((region, local));
        Ok(())
    }
}
