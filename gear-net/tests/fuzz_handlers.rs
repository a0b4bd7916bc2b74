//! The shard server's message handlers fed arbitrary bytes: a raw gRPC
//! client (a codec that sends bytes as they are, no protobuf) calls every
//! method of `gear.v1.Shard` with random message bodies, and random but
//! well-formed insert streams. Every call must end in a reply or a status;
//! no handler may panic (a panic hook in this process counts them, since the
//! server runs in it), the server keeps answering, and the trajectory
//! stored before the fuzzing keeps its bytes.

use gear_api::{ReplayTable, SampleConfig, StepValue};
use gear_core::{ColumnSpec, DType, TableSpec, WindowSpec};
use gear_net::proto::{InsertChunk, Key, PriorityUpdate, SampleRequest, UpdateRequest};
use gear_net::{ServerConfig, ServerHandle, StrategyInfo};
use gear_sampler::{StrategyKind, StrategyParams};
use proptest::prelude::*;
use prost::Message;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;
use std::time::Duration;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::codegen::http::uri::PathAndQuery;
use tonic::transport::{Channel, Endpoint};
use tonic::{Request, Status};

const TOKEN: &str = "fuzz-token-0123456789";

/// Panics seen anywhere in this process since the hook was installed.
static PANICS: AtomicUsize = AtomicUsize::new(0);

/// Sends `Vec<u8>` message bodies as they are and reads replies as bytes.
#[derive(Clone, Copy, Default)]
struct RawCodec;

impl Codec for RawCodec {
    type Encode = Vec<u8>;
    type Decode = Vec<u8>;
    type Encoder = RawCodec;
    type Decoder = RawCodec;
    fn encoder(&mut self) -> RawCodec {
        RawCodec
    }
    fn decoder(&mut self) -> RawCodec {
        RawCodec
    }
}

impl Encoder for RawCodec {
    type Item = Vec<u8>;
    type Error = Status;
    fn encode(&mut self, item: Vec<u8>, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        use bytes::BufMut;
        dst.put_slice(&item);
        Ok(())
    }
}

impl Decoder for RawCodec {
    type Item = Vec<u8>;
    type Error = Status;
    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Vec<u8>>, Status> {
        use bytes::Buf;
        let mut out = vec![0u8; src.remaining()];
        src.copy_to_slice(&mut out);
        Ok(Some(out))
    }
}

/// One server for every case, with one known trajectory stored before any
/// fuzzing, and the runtime the raw client runs on.
struct Fixture {
    server: ServerHandle,
    table: ReplayTable,
    runtime: tokio::runtime::Runtime,
    channel: Channel,
}

const STEPS: u64 = 4;

fn known_step(t: u64) -> [f32; 3] {
    [t as f32, 0.5, -(t as f32)]
}

fn fixture() -> &'static Fixture {
    static FIXTURE: OnceLock<Fixture> = OnceLock::new();
    FIXTURE.get_or_init(|| {
        let default_hook = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            PANICS.fetch_add(1, Ordering::SeqCst);
            default_hook(info);
        }));
        let spec = TableSpec::new(
            vec![ColumnSpec::new("obs", DType::F32, vec![3]), ColumnSpec::new("done", DType::U8, vec![])],
            8,
            16,
        )
        .unwrap();
        let table = ReplayTable::builder(spec).seed(1).build().unwrap();
        let mut traj = table.writer().begin(None).unwrap();
        for t in 0..STEPS {
            let obs: Vec<u8> = known_step(t).iter().flat_map(|v| v.to_le_bytes()).collect();
            traj.append_step(&[StepValue::bytes(&obs), StepValue::bytes(&[0])]).unwrap();
        }
        traj.end().unwrap();
        let config = ServerConfig {
            max_message_bytes: Some(1 << 20),
            ..ServerConfig::new("127.0.0.1:0".parse().unwrap(), 0, TOKEN)
        };
        let strategy = StrategyInfo { kind: StrategyKind::Uniform, params: StrategyParams::default() };
        let server = ServerHandle::start(table.clone(), &config, strategy).unwrap();
        let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
        let channel = runtime.block_on(async {
            Endpoint::from_shared(format!("http://{}", server.local_addr()))
                .unwrap()
                .timeout(Duration::from_secs(10))
                .connect()
                .await
                .unwrap()
        });
        Fixture { server, table, runtime, channel }
    })
}

fn authorized<T>(message: T) -> Request<T> {
    let mut request = Request::new(message);
    request.metadata_mut().insert("authorization", format!("Bearer {TOKEN}").parse().unwrap());
    request
}

/// Calls unary method `path` with `body`; any reply or status is fine.
fn unary(path: &'static str, body: Vec<u8>) {
    let f = fixture();
    f.runtime.block_on(async {
        let mut grpc = tonic::client::Grpc::new(f.channel.clone());
        grpc.ready().await.unwrap();
        let _ = grpc.unary(authorized(body), PathAndQuery::from_static(path), RawCodec).await;
    });
}

/// Streams `messages` to `Insert`; any reply or status is fine.
fn insert_stream(messages: Vec<Vec<u8>>) {
    let f = fixture();
    f.runtime.block_on(async {
        let mut grpc = tonic::client::Grpc::new(f.channel.clone());
        grpc.ready().await.unwrap();
        let stream = tokio_stream::iter(messages);
        let _ = grpc
            .client_streaming(authorized(stream), PathAndQuery::from_static("/gear.v1.Shard/Insert"), RawCodec)
            .await;
    });
}

/// Streams `messages` to `SampleStream` and reads every answer; any
/// answer or status is fine.
fn sample_stream(messages: Vec<Vec<u8>>) {
    let f = fixture();
    f.runtime.block_on(async {
        let mut grpc = tonic::client::Grpc::new(f.channel.clone());
        grpc.ready().await.unwrap();
        let stream = tokio_stream::iter(messages);
        let path = PathAndQuery::from_static("/gear.v1.Shard/SampleStream");
        if let Ok(response) = grpc.streaming(authorized(stream), path, RawCodec).await {
            let mut answers = response.into_inner();
            while let Ok(Some(_)) = answers.message().await {}
        }
    });
}

/// The server still answers, nothing panicked, and the trajectory stored
/// first still holds its bytes.
fn server_is_intact() {
    let f = fixture();
    assert_eq!(PANICS.load(Ordering::SeqCst), 0, "a handler panicked");
    assert!(!f.server.is_finished(), "the server stopped");
    let mut sampler = f.table.sampler(SampleConfig::new(64, WindowSpec::last(8))).unwrap();
    let batch = sampler.sample().unwrap();
    let known: Vec<u8> = (0..STEPS).flat_map(known_step).flat_map(|v| v.to_le_bytes()).collect();
    let rows = batch.lengths().len();
    let obs = batch.column_at(0).bytes;
    let row_bytes = obs.len() / rows;
    let found = (0..rows).any(|r| {
        let row = &obs[r * row_bytes..(r + 1) * row_bytes];
        batch.lengths()[r] == STEPS && row.windows(known.len()).any(|w| w == known.as_slice())
    });
    // Uniform draws of 64 rows from at most 16 items miss one with
    // probability below (15/16)^64 < 2%; sample again before failing.
    if !found {
        let again = sampler.sample().unwrap();
        let obs = again.column_at(0).bytes;
        assert!(
            (0..rows).any(|r| obs[r * row_bytes..(r + 1) * row_bytes].windows(known.len()).any(|w| w == known)),
            "the trajectory stored before fuzzing lost its bytes"
        );
    }
}

const UNARY: [&str; 6] = [
    "/gear.v1.Shard/Health",
    "/gear.v1.Shard/ListTables",
    "/gear.v1.Shard/GetSpec",
    "/gear.v1.Shard/Info",
    "/gear.v1.Shard/Sample",
    "/gear.v1.Shard/UpdatePriorities",
];

/// A table name as requests give it: none (the only table), the served
/// one, or anything.
fn table_name() -> impl Strategy<Value = String> {
    prop_oneof![3 => Just(String::new()), 2 => Just(gear_net::DEFAULT_TABLE.to_owned()), 1 => any::<String>()]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_bodies_never_panic_a_handler(method in 0..UNARY.len(), body in proptest::collection::vec(any::<u8>(), 0..256)) {
        unary(UNARY[method], body);
        server_is_intact();
    }

    #[test]
    fn well_formed_but_absurd_sample_requests_never_panic(
        rows in prop_oneof![0..70u64, any::<u64>()],
        window_offset in prop_oneof![-10..10i64, any::<i64>()],
        window_len in prop_oneof![0..10u64, any::<u64>()],
        pad in any::<i32>(),
        columns in proptest::collection::vec(prop_oneof![Just("obs".to_owned()), Just("done".to_owned()), "[a-z]{0,3}"], 0..3),
        timeout_ms in prop_oneof![0..20u64, any::<u64>()],
        ranges in any::<bool>(),
        incarnation in prop_oneof![3 => Just(0u64), 1 => any::<u64>()],
        data_plane_session in any::<u64>(),
        table in table_name(),
        random_start in any::<bool>(),
        send_from_table in any::<bool>(),
    ) {
        let body = SampleRequest {
            rows,
            window_offset,
            window_len,
            pad,
            columns,
            timeout_ms,
            ranges,
            incarnation,
            data_plane_session,
            table,
            random_start,
            send_from_table,
        }
        .encode_to_vec();
        unary("/gear.v1.Shard/Sample", body.clone());
        // The same request twice on one stream.
        sample_stream(vec![body.clone(), body]);
        server_is_intact();
    }

    #[test]
    fn arbitrary_sample_streams_never_panic(messages in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..128), 0..6)) {
        sample_stream(messages);
        server_is_intact();
    }

    #[test]
    fn well_formed_but_absurd_priority_updates_never_panic(
        updates in proptest::collection::vec((any::<u32>(), any::<u64>(), 0..20u32, any::<u32>(), any::<f64>(), any::<bool>()), 0..8),
        table in table_name(),
    ) {
        let updates = updates
            .into_iter()
            .map(|(shard, incarnation, slot, generation, priority, keyed)| PriorityUpdate {
                key: keyed.then_some(Key { shard: shard % 2, incarnation, slot, generation }),
                priority,
            })
            .collect();
        unary("/gear.v1.Shard/UpdatePriorities", UpdateRequest { updates, table }.encode_to_vec());
        server_is_intact();
    }

    #[test]
    fn arbitrary_insert_streams_never_panic(messages in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..128), 0..6)) {
        insert_stream(messages);
        server_is_intact();
    }

    #[test]
    fn well_formed_but_absurd_chunks_never_panic(
        chunks in proptest::collection::vec(
            (any::<u64>(), proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..64), 0..4), proptest::option::of(any::<f64>()), any::<bool>(), table_name(), proptest::option::of(prop_oneof![Just(0u64), Just(u64::MAX), 0..50u64])),
            1..6,
        )
    ) {
        let messages = chunks
            .into_iter()
            .map(|(steps, columns, priority, end, table, begin_wait_ms)| {
                // Mostly small step counts, so some chunks pass the size checks.
                let steps = if steps % 4 == 0 { steps } else { steps % 9 };
                let columns = columns.into_iter().map(Into::into).collect();
                InsertChunk { steps, columns, priority, end, table, begin_wait_ms }.encode_to_vec()
            })
            .collect();
        insert_stream(messages);
        server_is_intact();
    }
}
