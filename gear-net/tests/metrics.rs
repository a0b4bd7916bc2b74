//! The metrics endpoint, scraped over HTTP as Prometheus would: every
//! family documented in docs/CONFIG.md ("Metrics") is served and every
//! served family is documented; the counters move with traffic on each
//! table; a waiting writer shows in the waiting gauges while it waits; the
//! histograms are well formed; other paths and methods are
//! refused.

// This test uses the table and row helpers only.
#[allow(dead_code)]
mod common;

use bytes::Bytes;
use common::{spec, OBS};
use gear_api::ReplayTable;
use gear_core::WindowSpec;
use gear_net::{
    ClusterClient, ClusterConfig, ClusterSample, MetricsConfig, MetricsServer, NamedTable, RemoteTrajectory,
    ServedTables, ServerConfig, ServerHandle, StrategyInfo, WriteTarget,
};
use gear_sampler::{StrategyKind, StrategyParams};
use http_body_util::BodyExt;
use std::collections::{BTreeSet, HashMap};
use std::net::SocketAddr;
use std::time::Duration;

const TOKEN: &str = "metrics-test-token-0123456789";
const MAX_LEN: u64 = 4;

/// One sample line: its name, labels and value.
#[derive(Debug)]
struct Sample {
    name: String,
    labels: HashMap<String, String>,
    value: f64,
}

/// A scrape: the families declared by `# TYPE` lines, with their type,
/// and the sample lines.
struct Scrape {
    types: HashMap<String, String>,
    samples: Vec<Sample>,
}

impl Scrape {
    /// The value of the series `name` whose labels include `labels`;
    /// exactly one must match.
    fn value(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        let found: Vec<&Sample> = self
            .samples
            .iter()
            .filter(|s| s.name == name && labels.iter().all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(v)))
            .collect();
        assert_eq!(found.len(), 1, "{name} {labels:?}: {found:?}");
        found[0].value
    }
}

/// Parses Prometheus's text format (0.0.4); panics on a malformed line.
fn parse(text: &str) -> Scrape {
    let mut types = HashMap::new();
    let mut samples = Vec::new();
    for line in text.lines().filter(|l| !l.is_empty()) {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').expect("`# TYPE name kind`");
            assert!(types.insert(name.to_owned(), kind.to_owned()).is_none(), "{name} declared twice");
            continue;
        }
        if line.starts_with("# HELP ") {
            continue;
        }
        assert!(!line.starts_with('#'), "unknown comment: {line}");
        let (series, value) = line.rsplit_once(' ').expect("`series value`");
        let value = match value {
            "+Inf" => f64::INFINITY,
            "-Inf" => f64::NEG_INFINITY,
            v => v.parse().unwrap_or_else(|_| panic!("bad value in {line}")),
        };
        let (name, labels) = match series.split_once('{') {
            None => (series, HashMap::new()),
            Some((name, rest)) => (name, parse_labels(rest.strip_suffix('}').expect("labels end with }"))),
        };
        assert!(name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_'), "bad name in {line}");
        samples.push(Sample { name: name.to_owned(), labels, value });
    }
    Scrape { types, samples }
}

/// `k="v",k2="v2"` with the text format's escapes.
fn parse_labels(text: &str) -> HashMap<String, String> {
    let mut labels = HashMap::new();
    let mut chars = text.chars().peekable();
    while chars.peek().is_some() {
        let key: String = chars.by_ref().take_while(|&c| c != '=').collect();
        assert_eq!(chars.next(), Some('"'), "label {key} is not quoted");
        let mut value = String::new();
        loop {
            match chars.next().expect("unterminated label value") {
                '\\' => match chars.next() {
                    Some('n') => value.push('\n'),
                    Some(c) => value.push(c),
                    None => panic!("dangling escape"),
                },
                '"' => break,
                c => value.push(c),
            }
        }
        labels.insert(key, value);
        if chars.peek() == Some(&',') {
            chars.next();
        }
    }
    labels
}

/// The metric names docs/CONFIG.md's "Metrics" section documents.
fn documented() -> BTreeSet<String> {
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/CONFIG.md")).unwrap();
    let section = doc.split("\n## Metrics").nth(1).expect("a Metrics section");
    let section = section.split("\n## ").next().unwrap();
    section
        .split('`')
        .skip(1)
        .step_by(2)
        .filter(|s| s.starts_with("gear_") && s.bytes().all(|b| b.is_ascii_lowercase() || b == b'_'))
        .map(str::to_owned)
        .collect()
}

/// `method path` over HTTP/1 with hyper's client: status, content type, body.
fn http(addr: SocketAddr, method: &str, path: &str) -> (u16, String, String) {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    runtime.block_on(async {
        let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        let (mut sender, connection) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream)).await.unwrap();
        tokio::spawn(connection);
        let request = hyper::Request::builder()
            .method(method)
            .uri(path)
            .header(hyper::header::HOST, addr.to_string())
            .body(http_body_util::Empty::<Bytes>::new())
            .unwrap();
        let response =
            tokio::time::timeout(Duration::from_secs(20), sender.send_request(request)).await.unwrap().unwrap();
        let status = response.status().as_u16();
        let content_type = response
            .headers()
            .get(hyper::header::CONTENT_TYPE)
            .map(|v| v.to_str().unwrap().to_owned())
            .unwrap_or_default();
        let body = response.into_body().collect().await.unwrap().to_bytes();
        (status, content_type, String::from_utf8(body.to_vec()).unwrap())
    })
}

fn scrape(addr: SocketAddr) -> Scrape {
    let (status, content_type, body) = http(addr, "GET", "/metrics");
    assert_eq!(status, 200, "{body}");
    assert_eq!(content_type, "text/plain; version=0.0.4; charset=utf-8");
    parse(&body)
}

fn trajectory(id: u8, steps: u64) -> RemoteTrajectory {
    let obs = vec![id; (steps * OBS) as usize];
    let ids: Vec<u8> = (0..steps).flat_map(|_| i64::from(id).to_le_bytes()).collect();
    RemoteTrajectory { steps, columns: vec![obs.into(), ids.into()], priority: Some(1.0) }
}

fn client(server: &ServerHandle, table: &str, timeout: Duration) -> ClusterClient {
    let mut config = ClusterConfig::new(vec![server.local_addr().to_string()], TOKEN);
    config.table = table.to_owned();
    config.call_timeout = timeout;
    ClusterClient::new(config).unwrap()
}

#[test]
fn the_endpoint_serves_every_documented_metric_and_counts_the_traffic() {
    let prioritized = StrategyInfo { kind: StrategyKind::Prioritized, params: StrategyParams::default() };
    let fifo = StrategyInfo { kind: StrategyKind::Fifo, params: StrategyParams::default() };
    let replay =
        ReplayTable::builder(spec(MAX_LEN, 16)).sampler_kind(prioritized.kind, prioritized.params).build().unwrap();
    let queue = ReplayTable::builder(spec(MAX_LEN, 16))
        .sampler_kind(StrategyKind::Fifo, StrategyParams::default())
        .max_times_sampled(1)
        .queue(2)
        .unwrap()
        .build()
        .unwrap();
    let tables = ServedTables::new(vec![
        NamedTable::new("replay", replay.clone(), prioritized),
        NamedTable::new("queue", queue.clone(), fifo),
    ])
    .unwrap();
    let server =
        ServerHandle::serve(tables.clone(), &ServerConfig::new("127.0.0.1:0".parse().unwrap(), 0, TOKEN)).unwrap();
    let metrics = MetricsServer::start(&MetricsConfig { listen: "127.0.0.1:0".parse().unwrap() }, tables).unwrap();
    let addr = metrics.local_addr();

    // Before any traffic: the families are the documented ones.
    let before = scrape(addr);
    let served: BTreeSet<String> = before.types.keys().cloned().collect();
    assert_eq!(served, documented(), "served families (left) and docs/CONFIG.md's Metrics section (right) differ");
    assert_eq!(before.types["gear_rpc_duration_seconds"], "histogram");
    assert_eq!(before.value("gear_shard_info", &[("shard", "0")]), 1.0);
    assert_eq!(before.value("gear_table_info", &[("table", "queue"), ("sampler", "fifo")]), 1.0);
    assert_eq!(before.value("gear_table_inserts_total", &[("table", "replay")]), 0.0);
    assert_eq!(before.value("gear_table_capacity", &[("table", "queue")]), 16.0);

    // Traffic: 5 trajectories into replay in one call, 3 batches and a
    // priority update from it; 2 into the queue, drained, then a sample
    // that waits on the empty queue and times out, a writer that waits on
    // the full queue, and a call naming no table.
    let r = client(&server, "replay", Duration::from_secs(5));
    r.insert(WriteTarget::Shard(0), (1..=5).map(|i| trajectory(i, 3)).collect(), 0).unwrap();
    let request = ClusterSample { rows: 8, window: WindowSpec::last(2), columns: vec![], random_start: false };
    let mut keys = Vec::new();
    for _ in 0..3 {
        keys = r.sample(&request).unwrap().keys;
    }
    r.update_priorities(&[(keys[0], 2.0)]).unwrap();
    let q = client(&server, "queue", Duration::from_millis(400));
    q.insert(WriteTarget::Shard(0), vec![trajectory(7, 1), trajectory(8, 1)], 0).unwrap();
    let one = ClusterSample { rows: 1, window: WindowSpec::last(1), columns: vec![], random_start: false };
    q.sample(&one).unwrap();
    q.sample(&one).unwrap();
    assert!(q.sample_shard(0, &one).is_err(), "the queue is empty");
    for id in [9, 10] {
        common::insert(&queue, id, 1);
    }
    let blocked = queue.writer().with_timeout(Duration::from_millis(100)).begin(None);
    assert!(blocked.is_err(), "the queue is full");
    assert!(client(&server, "", Duration::from_secs(5)).info(0).is_err(), "two tables: a name is needed");

    let after = scrape(addr);
    // Every documented family has series now.
    for name in documented() {
        let kind = &after.types[&name];
        let has = |n: &str| after.samples.iter().any(|s| s.name == n);
        let present = if kind == "histogram" { has(&format!("{name}_bucket")) } else { has(&name) };
        assert!(present, "{name} has no series after traffic");
    }
    let v = |name: &str, labels: &[(&str, &str)]| after.value(name, labels);
    assert_eq!(v("gear_table_inserts_total", &[("table", "replay")]), 5.0);
    assert_eq!(v("gear_table_inserts_total", &[("table", "queue")]), 4.0);
    assert_eq!(v("gear_table_samples_total", &[("table", "replay")]), 24.0);
    assert_eq!(v("gear_table_samples_total", &[("table", "queue")]), 2.0);
    assert_eq!(v("gear_table_retired_total", &[("table", "queue")]), 2.0);
    assert_eq!(v("gear_table_size", &[("table", "queue")]), 2.0);
    let step = (OBS + 8) as f64;
    assert_eq!(v("gear_table_bytes_in_total", &[("table", "replay")]), 15.0 * step);
    assert_eq!(v("gear_table_rpc_received_bytes_total", &[("table", "replay")]), 15.0 * step);
    assert_eq!(v("gear_table_rpc_received_bytes_total", &[("table", "queue")]), 2.0 * step);
    // 3 batches of 8 rows of a 2-step window, gathered and sent.
    assert_eq!(v("gear_table_rpc_sent_bytes_total", &[("table", "replay")]), 48.0 * step);
    assert!(v("gear_table_bytes_out_total", &[("table", "replay")]) >= 48.0 * step);
    let waits = |op| v("gear_table_rate_limiter_waits_total", &[("table", "queue"), ("op", op)]);
    let waited = |op| v("gear_table_rate_limiter_wait_seconds_total", &[("table", "queue"), ("op", op)]);
    assert!(waits("sample") >= 1.0 && waited("sample") >= 0.2, "{} {}", waits("sample"), waited("sample"));
    assert!(waits("insert") >= 1.0 && waited("insert") >= 0.09, "{} {}", waits("insert"), waited("insert"));
    assert_eq!(v("gear_table_rate_limiter_waits_total", &[("table", "replay"), ("op", "insert")]), 0.0);
    assert!(v("gear_table_lock_waits_total", &[("table", "replay")]) >= 0.0);
    // Calls per method and table, their errors, and well-formed histograms.
    let calls = |method, table| v("gear_rpc_duration_seconds_count", &[("method", method), ("table", table)]);
    let errors = |method, table| v("gear_rpc_errors_total", &[("method", method), ("table", table)]);
    assert_eq!(calls("Sample", "replay"), 3.0);
    assert_eq!(calls("Insert", "replay"), 1.0);
    assert_eq!(calls("UpdatePriorities", "replay"), 1.0);
    assert_eq!((calls("Sample", "queue"), errors("Sample", "queue")), (3.0, 1.0));
    assert_eq!(errors("Sample", "replay"), 0.0);
    assert!(errors("Info", "") >= 1.0);
    for s in after.samples.iter().filter(|s| s.name == "gear_rpc_duration_seconds_count") {
        let (method, table) = (&s.labels["method"], &s.labels["table"]);
        let mut buckets: Vec<(f64, f64)> = after
            .samples
            .iter()
            .filter(|b| {
                b.name == "gear_rpc_duration_seconds_bucket"
                    && &b.labels["method"] == method
                    && &b.labels["table"] == table
            })
            .map(|b| (b.labels["le"].replace("+Inf", "inf").parse::<f64>().unwrap(), b.value))
            .collect();
        buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
        assert!(buckets.windows(2).all(|w| w[0].1 <= w[1].1), "{method} {table}: buckets not cumulative");
        assert_eq!(buckets.last().unwrap(), &(f64::INFINITY, s.value), "{method} {table}: +Inf is not the count");
        assert!(v("gear_rpc_duration_seconds_sum", &[("method", method), ("table", table)]) > 0.0);
    }

    // Nobody waits now; a writer on the full queue (it holds 9 and 10)
    // waits, and the gauges say who, on which limit, for how long.
    for s in after.samples.iter().filter(|s| s.name == "gear_table_waiting") {
        assert_eq!(s.value, 0.0, "{s:?}");
    }
    let q = queue.clone();
    let waiter = std::thread::spawn(move || q.writer().with_timeout(Duration::from_secs(60)).begin(None).map(drop));
    let full = [("table", "queue"), ("role", "writer"), ("reason", "full_table")];
    let start = std::time::Instant::now();
    let during = loop {
        let s = scrape(addr);
        if s.value("gear_table_waiting", &full) == 1.0 {
            break s;
        }
        assert!(start.elapsed() < Duration::from_secs(30), "the waiting writer never showed");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(
        during.value("gear_table_waiting", &[("table", "queue"), ("role", "sampler"), ("reason", "min_size")]),
        0.0
    );
    assert_eq!(
        during.value("gear_table_waiting", &[("table", "replay"), ("role", "writer"), ("reason", "full_table")]),
        0.0
    );
    std::thread::sleep(Duration::from_millis(300));
    let longest = scrape(addr).value("gear_table_longest_wait_seconds", &[("table", "queue"), ("role", "writer")]);
    assert!(longest >= 0.25, "{longest}");
    queue.sampler(gear_api::SampleConfig::new(1, WindowSpec::last(1))).unwrap().sample().unwrap();
    waiter.join().unwrap().unwrap();
    let released = scrape(addr);
    assert_eq!(released.value("gear_table_waiting", &full), 0.0);
    assert_eq!(released.value("gear_table_longest_wait_seconds", &[("table", "queue"), ("role", "writer")]), 0.0);

    // Only GET /metrics.
    assert_eq!(http(addr, "GET", "/").0, 404);
    assert_eq!(http(addr, "POST", "/metrics").0, 405);
    drop(metrics);
    assert!(std::net::TcpStream::connect(addr).is_err(), "the endpoint stops when dropped");
}
