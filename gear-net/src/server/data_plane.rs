//! The shard's data plane: the transport servers it could start, the
//! `Connect` handler that hands out region descriptors, and the `Sample`
//! mode that draws without gathering (`SampleRequest.ranges`), replying
//! with where each row's window is in the region.
//!
//! TCP (gear-tcp) always runs, on the shard's gRPC port behind the same
//! token check. A second transport runs beside it: the transport server
//! the caller injected ([`DataPlaneServer::with_transport_server`]), or
//! else RDMA (gear-rdma) on the device [`RdmaSettings`] name, which opens
//! only when gear-net is built with the `rdma` feature and the machine has
//! that device; otherwise the server logs why and serves TCP alone.

use std::sync::Arc;
use std::time::Duration;

use gear_core::{ExposedRegion, TransportKind, TransportServer};
use gear_tcp::TcpServer;
use tonic::{Request, Response, Status};

use super::tables::{ServedTable, ServedTables};
use super::{blocking, ranged_reply_fields, table_masses, ShardService};
use crate::connect::{endpoint_from_request, reply_from_remote};
use crate::convert::table_status;
use crate::error::{Error, Result};
use crate::metrics::RpcTimer;
use crate::proto::{ConnectReply, ConnectRequest, RowRange, SampleReply, SampleRequest};
use crate::rdma_settings::RdmaSettings;

/// The transport servers of one shard, with every served table's region
/// exposed on each.
pub struct DataPlaneServer {
    tcp: TcpServer,
    /// Per served table, in the server's order: its region on TCP.
    tcp_regions: Vec<ExposedRegion>,
    /// The second transport (RDMA), serving the kind it reports, and each
    /// table's region on it (in the server's order).
    other: Option<(Box<dyn TransportServer>, Vec<ExposedRegion>)>,
}

impl std::fmt::Debug for DataPlaneServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DataPlaneServer")
            .field("tcp", &self.tcp)
            .field("other", &self.other.as_ref().map(|(s, _)| s.kind()))
            .finish()
    }
}

/// Exposes every table of `tables` on `server`, each under its own
/// incarnation; on a failure the regions exposed so far are withdrawn.
fn expose_all(server: &dyn TransportServer, shard: u32, tables: &ServedTables) -> Result<Vec<ExposedRegion>> {
    let mut exposed = Vec::with_capacity(tables.served().len());
    for t in tables.served() {
        match server.expose(shard, t.incarnation, t.table.memory()) {
            Ok(region) => exposed.push(region),
            Err(e) => {
                for region in &exposed {
                    let _ = server.withdraw(region);
                }
                return Err(Error::Config(format!("exposing table `{}`: {e}", t.name)));
            }
        }
    }
    Ok(exposed)
}

impl DataPlaneServer {
    /// Exposes every table's region over TCP (descriptors name
    /// `tcp_address`, where the shard's gRPC server listens) and, where
    /// RDMA can run, over RDMA too, on the device, port and GID index
    /// `rdma` names.
    pub fn start(tables: &ServedTables, shard: u32, tcp_address: String, rdma: &RdmaSettings) -> Result<Self> {
        rdma.validate()?;
        let tcp = TcpServer::new(tcp_address).map_err(|e| Error::Config(e.to_string()))?;
        let tcp_regions = expose_all(&tcp, shard, tables)?;
        let other = match rdma.device_server() {
            Ok(server) => match expose_all(server.as_ref(), shard, tables) {
                Ok(exposed) => Some((server, exposed)),
                Err(e) => {
                    tracing::warn!(
                        "shard {shard}: rdma data plane off (exposing the region failed: {e}); serving tcp only"
                    );
                    None
                }
            },
            Err(e) => {
                tracing::info!("shard {shard}: rdma data plane off ({e}); serving tcp only");
                None
            }
        };
        Ok(DataPlaneServer { tcp, tcp_regions, other })
    }

    /// Exposes every table's region over TCP as [`DataPlaneServer::start`]
    /// does and over `server` (instead of opening the RDMA device).
    /// `server` must be of a kind other than TCP, which the shard serves
    /// itself.
    pub fn with_transport_server(
        tables: &ServedTables,
        shard: u32,
        tcp_address: String,
        server: Box<dyn TransportServer>,
    ) -> Result<Self> {
        if server.kind() == TransportKind::Tcp {
            return Err(Error::Config(
                "the injected transport server is tcp, which the shard serves itself; inject another kind".into(),
            ));
        }
        let tcp = TcpServer::new(tcp_address).map_err(|e| Error::Config(e.to_string()))?;
        let tcp_regions = expose_all(&tcp, shard, tables)?;
        let exposed = expose_all(server.as_ref(), shard, tables)?;
        Ok(DataPlaneServer { tcp, tcp_regions, other: Some((server, exposed)) })
    }

    /// Whether this shard serves `kind`.
    pub fn serves(&self, kind: TransportKind) -> bool {
        kind == TransportKind::Tcp || self.other.as_ref().is_some_and(|(s, _)| s.kind() == kind)
    }

    /// The TCP read service, to add to the shard's router behind its token
    /// check.
    pub fn tcp_service(&self) -> gear_tcp::proto::region_reader_server::RegionReaderServer<gear_tcp::ReadService> {
        self.tcp.service()
    }

    /// Answers a `Connect` for the region of table `table` (its index in
    /// the server's order).
    fn accept(&self, table: usize, req: &ConnectRequest) -> std::result::Result<ConnectReply, Status> {
        let endpoint = endpoint_from_request(req).map_err(Status::invalid_argument)?;
        let missing = || Status::internal(format!("table {table} has no exposed region"));
        let remote = match endpoint.kind() {
            TransportKind::Tcp => self.tcp.accept(self.tcp_regions.get(table).ok_or_else(missing)?, &endpoint),
            kind => match &self.other {
                Some((server, exposed)) if server.kind() == kind => {
                    server.accept(exposed.get(table).ok_or_else(missing)?, &endpoint)
                }
                _ => return Err(Status::failed_precondition(format!("this shard does not serve {}", kind.name()))),
            },
        };
        remote.map(|r| reply_from_remote(&r)).map_err(|e| accept_status(&e))
    }

    /// Notes that the client with `session` still uses its connection to
    /// table `table`'s region (it asked for a ranged draw of that table): a
    /// transport server that bounds its connections reaps idle ones first.
    pub fn keep_alive(&self, table: usize, session: u64) {
        if let Some((server, exposed)) = &self.other {
            if let Some(region) = exposed.get(table) {
                server.keep_alive(region, session);
            }
        }
    }
}

/// The status a failed accept answers with. Only a malformed endpoint is
/// the request's fault (`INVALID_ARGUMENT`); the rest are the shard's
/// state, for which a client gathers that shard's rows instead:
/// no room for the client's queue pairs (`RESOURCE_EXHAUSTED`), a
/// transport this shard cannot serve (`FAILED_PRECONDITION`), a device or
/// region that failed or went away (`UNAVAILABLE`).
fn accept_status(e: &gear_core::Error) -> Status {
    use gear_core::Error as E;
    let msg = format!("data plane connect: {e}");
    match e {
        E::Descriptor(_) => Status::invalid_argument(msg),
        E::Exhausted(_) => Status::resource_exhausted(msg),
        E::TransportUnavailable(_) | E::Unsupported(_) => Status::failed_precondition(msg),
        E::Transport(_) | E::InvalidHandle(_) | E::Timeout(_) | E::Busy(_) => Status::unavailable(msg),
        _ => Status::internal(msg),
    }
}

impl ShardService {
    /// Serves `data_plane` through `Connect` and ranged samples.
    pub fn with_data_plane(mut self, data_plane: Arc<DataPlaneServer>) -> Self {
        self.data_plane = Some(data_plane);
        self
    }

    pub(super) async fn accept_data_plane(
        &self,
        request: Request<ConnectRequest>,
        timer: &mut RpcTimer,
    ) -> std::result::Result<Response<ConnectReply>, Status> {
        let (index, _) = self.tables.find(&request.get_ref().table)?;
        timer.table(index);
        let dp = self.data_plane.as_ref().ok_or_else(|| Status::failed_precondition("this shard has no data plane"))?;
        Ok(Response::new(dp.accept(index, request.get_ref())?))
    }

    /// `Sample` with `ranges` from `served` (at `index` in the server's
    /// order): draw, and reply with where the windows are.
    pub(super) async fn sample_ranges(
        &self,
        (index, served): (usize, &ServedTable),
        req: SampleRequest,
    ) -> std::result::Result<Response<SampleReply>, Status> {
        if self.data_plane.is_none() {
            return Err(Status::failed_precondition("this shard has no data plane"));
        }
        let spec = served.table.spec();
        if let Some(dp) = &self.data_plane {
            dp.keep_alive(index, req.data_plane_session);
        }
        let (window, columns) = crate::convert::sample_shape(spec, &req)?;
        let timeout = Some(Duration::from_millis(req.timeout_ms.clamp(1, 600_000)));
        let table = served.table.clone();
        let (rows, random_start) = (req.rows as usize, req.random_start);
        let drawn =
            blocking(move || table.draw_ranges(rows, window, random_start, &columns, timeout).map_err(table_status))
                .await?;
        let reply = ranged_reply_fields(self.shard, served.incarnation, &drawn, table_masses(&served.table)?);
        Ok(Response::new(SampleReply {
            row_ranges: drawn
                .iter()
                .map(|r| RowRange {
                    offsets: r.columns.iter().map(|c| c.start).collect(),
                    lens: r.columns.iter().map(|c| c.end - c.start).collect(),
                    generation_offset: r.generation_offset,
                    dst_step: r.window.dst_step,
                    generation: r.generation,
                })
                .collect(),
            ..reply
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accept_failures_answer_with_the_status_of_their_cause() {
        use gear_core::Error as E;
        let code = |e: E| accept_status(&e).code();
        assert_eq!(code(E::Descriptor("gid".into())), tonic::Code::InvalidArgument);
        assert_eq!(code(E::Exhausted("queue pairs".into())), tonic::Code::ResourceExhausted);
        assert_eq!(code(E::TransportUnavailable("no device".into())), tonic::Code::FailedPrecondition);
        assert_eq!(code(E::Transport("ibv_create_qp failed".into())), tonic::Code::Unavailable);
        assert_eq!(code(E::InvalidHandle("region 1 was withdrawn".into())), tonic::Code::Unavailable);
        let status = accept_status(&E::Exhausted("the server holds 4096 queue pairs".into()));
        assert!(status.message().contains("4096 queue pairs"), "{}", status.message());
    }
}
