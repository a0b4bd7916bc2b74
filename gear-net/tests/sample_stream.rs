//! `SampleStream` as a client other than ours sees it (tonic's generated
//! client): each request answered by its reply and an outcome message, in
//! order, a refusal leaving the stream open for the next request; the
//! stream ends OK when the client ends its side, and a stopping server
//! ends the streams its clients keep open instead of waiting for them.

use gear_api::{ReplayTable, StepValue};
use gear_core::{ColumnSpec, DType, TableSpec};
use gear_net::proto::shard_client::ShardClient;
use gear_net::proto::{SampleReply, SampleRequest};
use gear_net::{ServerConfig, ServerHandle, StrategyInfo};
use gear_sampler::{StrategyKind, StrategyParams};
use std::time::Duration;
use tokio::sync::mpsc;
use tonic::transport::Channel;
use tonic::{Code, Request, Streaming};

const TOKEN: &str = "sample-stream-token-0123";

fn server() -> ServerHandle {
    let spec = TableSpec::new(vec![ColumnSpec::new("id", DType::I64, vec![])], 4, 32).unwrap();
    let table = ReplayTable::builder(spec).seed(3).build().unwrap();
    for id in 0..20i64 {
        let mut t = table.writer().begin(None).unwrap();
        t.append_step(&[StepValue::typed(&[id])]).unwrap();
        t.end().unwrap();
    }
    let config = ServerConfig::new("127.0.0.1:0".parse().unwrap(), 0, TOKEN);
    ServerHandle::start(table, &config, StrategyInfo { kind: StrategyKind::Uniform, params: StrategyParams::default() })
        .unwrap()
}

fn request(rows: u64) -> SampleRequest {
    SampleRequest { rows, window_len: 1, timeout_ms: 2000, ..SampleRequest::default() }
}

/// A stream to `server` (with the token when `token`): where its requests
/// go, and its answers.
async fn open(
    server: &ServerHandle,
    token: bool,
) -> Result<(mpsc::Sender<SampleRequest>, Streaming<SampleReply>), tonic::Status> {
    let channel = Channel::from_shared(format!("http://{}", server.local_addr())).unwrap().connect().await.unwrap();
    let (requests, queued) = mpsc::channel(4);
    let mut call = Request::new(tokio_stream::wrappers::ReceiverStream::new(queued));
    if token {
        call.metadata_mut().insert("authorization", format!("Bearer {TOKEN}").parse().unwrap());
    }
    let answers = ShardClient::new(channel).sample_stream(call).await?.into_inner();
    Ok((requests, answers))
}

/// One exchange: `request`'s reply and outcome.
async fn exchange(
    requests: &mpsc::Sender<SampleRequest>,
    answers: &mut Streaming<SampleReply>,
    request: SampleRequest,
) -> (SampleReply, gear_net::proto::SampleOutcome) {
    requests.send(request).await.unwrap();
    let reply = answers.message().await.unwrap().expect("a reply");
    assert!(reply.outcome.is_none(), "the first message is the reply");
    let outcome = answers.message().await.unwrap().expect("an outcome").outcome.expect("the second message's outcome");
    (reply, outcome)
}

#[test]
fn each_request_is_answered_in_order_and_a_refusal_leaves_the_stream_open() {
    let server = server();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let (requests, mut answers) = open(&server, true).await.unwrap();
        let (reply, outcome) = exchange(&requests, &mut answers, request(5)).await;
        assert_eq!(outcome.code, Code::Ok as i32, "{outcome:?}");
        assert_eq!((reply.keys.len(), reply.columns.len(), reply.columns[0].len()), (5, 1, 40));
        // Refused (an unknown column): an empty reply, the status as the
        // outcome; the stream goes on.
        let unknown = SampleRequest { columns: vec!["nope".into()], ..request(2) };
        let (reply, outcome) = exchange(&requests, &mut answers, unknown).await;
        assert_eq!(reply, SampleReply::default());
        assert_eq!(outcome.code, Code::InvalidArgument as i32, "{outcome:?}");
        assert!(outcome.message.contains("nope"), "{outcome:?}");
        // Split for another run of the shard.
        let (_, outcome) = exchange(&requests, &mut answers, SampleRequest { incarnation: 1, ..request(2) }).await;
        assert_eq!(outcome.code, Code::Aborted as i32, "{outcome:?}");
        // Sent from table memory.
        let (reply, outcome) =
            exchange(&requests, &mut answers, SampleRequest { send_from_table: true, ..request(3) }).await;
        assert_eq!(outcome.code, Code::Ok as i32, "{outcome:?}");
        assert_eq!(reply.keys.len(), 3);
        assert_eq!(reply.columns[0].len(), 24);
        // The client ends its side: the stream ends OK.
        drop(requests);
        assert!(answers.message().await.unwrap().is_none());
    });
}

#[test]
fn a_stream_without_the_token_is_refused() {
    let server = server();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let refused = runtime.block_on(async {
        match open(&server, false).await {
            Err(status) => status,
            Ok((requests, mut answers)) => {
                requests.send(request(1)).await.unwrap();
                answers.message().await.unwrap_err()
            }
        }
    });
    assert_eq!(refused.code(), Code::Unauthenticated, "{refused:?}");
}

#[test]
fn a_stopping_server_ends_the_streams_kept_open() {
    let server = server();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let (requests, mut answers) = runtime.block_on(async {
        let (requests, mut answers) = open(&server, true).await.unwrap();
        let (_, outcome) = exchange(&requests, &mut answers, request(2)).await;
        assert_eq!(outcome.code, Code::Ok as i32);
        (requests, answers)
    });
    // The stream stays open (the client keeps `requests`); a graceful
    // shutdown that waited for it would never end.
    let (done, stopped) = std::sync::mpsc::channel();
    std::thread::spawn(move || done.send(server.stop()).unwrap());
    let result = stopped.recv_timeout(Duration::from_secs(20)).expect("the server's stop waited on an open stream");
    result.unwrap();
    let ended = runtime.block_on(answers.message());
    assert!(
        matches!(&ended, Err(s) if s.code() == Code::Unavailable) || matches!(ended, Ok(None)),
        "the stream did not end: {ended:?}"
    );
    drop(requests);
}
