//! A shard whose sample replies disagree with the table's spec (a column
//! too many, rows of the wrong size) is a clear `Malformed` error naming
//! it, never a panic or a batch of misplaced bytes, whichever shard's reply
//! comes first.

use gear_api::{ReplayTable, StepValue};
use gear_core::{ColumnSpec, DType, TableSpec, WindowSpec};
use gear_net::proto::shard_server::{Shard, ShardServer};
use gear_net::proto::{
    ConnectReply, ConnectRequest, HealthReply, HealthRequest, InfoReply, InfoRequest, InsertChunk, InsertReply,
    ListTablesReply, ListTablesRequest, SampleRequest, SpecReply, SpecRequest, UpdateReply, UpdateRequest,
};
use gear_net::server::SampleReplyOut;
use gear_net::{
    ClusterClient, ClusterConfig, ClusterSample, Error, ServerConfig, ServerHandle, ShardService, StrategyInfo,
};
use gear_sampler::{StrategyKind, StrategyParams};
use std::time::Duration;
use tonic::{Request, Response, Status, Streaming};

const TOKEN: &str = "tampered-replies-token-01";

fn spec() -> TableSpec {
    TableSpec::new(vec![ColumnSpec::new("id", DType::I64, vec![]), ColumnSpec::new("obs", DType::U8, vec![3])], 4, 32)
        .unwrap()
}

fn strategy() -> StrategyInfo {
    StrategyInfo { kind: StrategyKind::Uniform, params: StrategyParams::default() }
}

fn table(first_id: i64) -> ReplayTable {
    let table = ReplayTable::builder(spec()).build().unwrap();
    let writer = table.writer();
    for id in first_id..first_id + 20 {
        let mut t = writer.begin(Some(1.0)).unwrap();
        t.append_step(&[StepValue::typed(&[id]), StepValue::typed(&[1u8, 2, 3])]).unwrap();
        t.end().unwrap();
    }
    table
}

/// How the tampering shard bends its sample replies.
#[derive(Clone, Copy, Debug)]
enum Tamper {
    /// A copy of the last column appended.
    ExtraColumn,
    /// The first column's bytes twice over: whole rows, of twice the size.
    DoubledRows,
}

/// A real shard whose sample replies are bent by `tamper`.
struct TamperingShard {
    inner: ShardService,
    tamper: Tamper,
}

#[tonic::async_trait]
impl Shard for TamperingShard {
    async fn health(&self, r: Request<HealthRequest>) -> Result<Response<HealthReply>, Status> {
        self.inner.health(r).await
    }
    async fn list_tables(&self, r: Request<ListTablesRequest>) -> Result<Response<ListTablesReply>, Status> {
        self.inner.list_tables(r).await
    }
    async fn get_spec(&self, r: Request<SpecRequest>) -> Result<Response<SpecReply>, Status> {
        self.inner.get_spec(r).await
    }
    async fn info(&self, r: Request<InfoRequest>) -> Result<Response<InfoReply>, Status> {
        self.inner.info(r).await
    }
    type SampleStreamStream = <ShardService as Shard>::SampleStreamStream;
    // The service alone refuses it (`UNIMPLEMENTED`): the client then asks
    // this shard with `Sample` calls, which it bends.
    async fn sample_stream(
        &self,
        r: Request<Streaming<SampleRequest>>,
    ) -> Result<Response<Self::SampleStreamStream>, Status> {
        self.inner.sample_stream(r).await
    }
    async fn sample(&self, r: Request<SampleRequest>) -> Result<Response<SampleReplyOut>, Status> {
        let mut reply = self.inner.sample(r).await?.into_inner().into_reply()?;
        match self.tamper {
            Tamper::ExtraColumn => {
                let last = reply.columns.last().cloned().unwrap_or_default();
                reply.columns.push(last);
            }
            Tamper::DoubledRows => {
                let first = reply.columns[0].to_vec();
                reply.columns[0] = [first.clone(), first].concat().into();
            }
        }
        Ok(Response::new(reply.into()))
    }
    async fn update_priorities(&self, r: Request<UpdateRequest>) -> Result<Response<UpdateReply>, Status> {
        self.inner.update_priorities(r).await
    }
    async fn insert(&self, r: Request<Streaming<InsertChunk>>) -> Result<Response<InsertReply>, Status> {
        self.inner.insert(r).await
    }
    async fn connect_data_plane(&self, r: Request<ConnectRequest>) -> Result<Response<ConnectReply>, Status> {
        self.inner.connect_data_plane(r).await
    }
}

/// Serves a tampering shard 1 on a free port for as long as the returned
/// runtime lives.
fn serve_tampering(tamper: Tamper) -> (tokio::runtime::Runtime, std::net::SocketAddr) {
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    let listener = runtime.block_on(tokio::net::TcpListener::bind("127.0.0.1:0")).unwrap();
    let addr = listener.local_addr().unwrap();
    let shard = TamperingShard { inner: ShardService::new(table(1000), 1, strategy(), 64 << 20), tamper };
    runtime.spawn(
        tonic::transport::Server::builder()
            .add_service(ShardServer::new(shard))
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );
    (runtime, addr)
}

#[test]
fn a_shard_replying_other_shapes_than_the_spec_is_malformed_not_a_panic() {
    let honest =
        ServerHandle::start(table(0), &ServerConfig::new("127.0.0.1:0".parse().unwrap(), 0, TOKEN), strategy())
            .unwrap();
    for tamper in [Tamper::ExtraColumn, Tamper::DoubledRows] {
        let (_runtime, tampering) = serve_tampering(tamper);
        let mut config = ClusterConfig::new(vec![honest.local_addr().to_string(), tampering.to_string()], TOKEN);
        config.call_timeout = Duration::from_secs(10);
        let client = ClusterClient::new(config).unwrap();
        // 64 rows over two equal shards: both get some (all but 2^-63).
        let request =
            ClusterSample { rows: 64, window: WindowSpec::first(1), columns: Vec::new(), random_start: false };
        for _ in 0..5 {
            match client.sample(&request) {
                Err(Error::Malformed { shard: 1, what }) => {
                    assert!(what.contains("bytes per row [8, 3] of the table's spec"), "{tamper:?}: {what}")
                }
                other => panic!("{tamper:?}: expected shard 1's reply refused, got {other:?}"),
            }
        }
    }
}
