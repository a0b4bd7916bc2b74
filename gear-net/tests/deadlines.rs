//! Deadlines to the last byte: a shard whose reply stops part way (a proxy
//! that stops forwarding, as a partitioned link would) is left out of the
//! batch within the call's deadline, and a connection that stops answering
//! is closed by its keepalive pings, over plain TCP and TLS.
//!
//! "Returned before the deadline plus slack" is a correctness check with
//! generous slack (the proxy holds the reply for far longer), never a
//! speed assertion.

#[allow(dead_code)]
mod common;
mod proxy;

use gear_api::{ReplayTable, StepValue};
use gear_core::{ColumnSpec, DType, TableSpec, WindowSpec};
use gear_net::{
    BatchRows, ClientTls, ClusterBatch, ClusterClient, ClusterConfig, ClusterSample, RemoteTrajectory, ServerConfig,
    ServerHandle, StrategyInfo, WriteTarget,
};
use gear_sampler::{StrategyKind, StrategyParams};
use proxy::Proxy;
use std::time::{Duration, Instant};

const TOKEN: &str = "deadline-test-token-0123";
/// Bytes of one step's `obs`: a batch is MiBs, many DATA frames.
const OBS: u64 = 16 << 10;
const CALL_TIMEOUT: Duration = Duration::from_secs(3);
/// Far below how long the proxy holds a reply (for ever).
const SLACK: Duration = Duration::from_secs(4);

fn within(seconds: u64, body: impl FnOnce() + Send + 'static) {
    common::within("deadlines", seconds, body);
}

fn spec() -> TableSpec {
    TableSpec::new(vec![ColumnSpec::new("obs", DType::U8, vec![OBS])], 2, 64).unwrap()
}

/// A shard holding 8 two-step trajectories whose every byte is their id
/// (`first_id..first_id + 8`).
fn shard(s: u32, first_id: u8, config: Option<ServerConfig>) -> ServerHandle {
    let table = ReplayTable::builder(spec()).seed(u64::from(s)).build().unwrap();
    for id in first_id..first_id + 8 {
        let mut t = table.writer().begin(None).unwrap();
        t.append_column(0, 2, StepValue::bytes(&vec![id; 2 * OBS as usize])).unwrap();
        t.end().unwrap();
    }
    let config = config.unwrap_or_else(|| ServerConfig::new("127.0.0.1:0".parse().unwrap(), s, TOKEN));
    let strategy = StrategyInfo { kind: StrategyKind::Uniform, params: StrategyParams::default() };
    ServerHandle::start(table, &config, strategy).unwrap()
}

fn config(addresses: Vec<String>) -> ClusterConfig {
    let mut config = ClusterConfig::new(addresses, TOKEN);
    config.call_timeout = CALL_TIMEOUT;
    config.mass_refresh = Duration::from_secs(3600);
    config
}

fn request() -> ClusterSample {
    ClusterSample { rows: 64, window: WindowSpec::last(2), columns: vec![], random_start: false }
}

/// Every row's bytes are its trajectory's id; returns each row's id.
fn ids(batch: &ClusterBatch) -> Vec<u8> {
    let row = 2 * OBS as usize;
    (0..batch.keys.len())
        .map(|r| {
            let bytes = &batch.columns[0][r * row..(r + 1) * row];
            assert!(bytes.iter().all(|&b| b == bytes[0]), "row {r} is torn");
            bytes[0]
        })
        .collect()
}

#[test]
fn a_shard_whose_reply_stops_part_way_is_left_out_within_the_deadline() {
    within(90, || {
        let servers = [shard(0, 10, None), shard(1, 100, None)];
        let proxy = Proxy::start(servers[1].local_addr());
        let cluster =
            ClusterClient::new(config(vec![servers[0].local_addr().to_string(), proxy.addr().to_string()])).unwrap();
        let first = cluster.sample(&request()).unwrap();
        assert!(first.lost.is_empty(), "{:?}", first.lost);
        assert!(ids(&first).iter().any(|&id| id >= 100), "shard 1 gave rows through the proxy");

        // Shard 1's next reply stops after its first 64 KiB (its headers
        // and part of its columns): the link went silent mid-reply.
        proxy.pass_from_shard(64 << 10);
        let start = Instant::now();
        let batch = cluster.sample(&request()).unwrap();
        let took = start.elapsed();
        assert!(took < CALL_TIMEOUT + SLACK, "sample returned after {took:?}, deadline {CALL_TIMEOUT:?}");
        let lost: Vec<usize> = batch.lost.iter().map(|l| l.shard).collect();
        assert_eq!(lost, [1], "{:?}", batch.lost);
        assert!(batch.lost[0].reason.to_lowercase().contains("deadline"), "{:?}", batch.lost);
        assert_eq!(batch.keys.len(), 64);
        assert!(ids(&batch).iter().all(|&id| (10..18).contains(&id)), "every row from shard 0");
        assert!(batch.weights.iter().all(|&w| w > 0.0 && w <= 1.0));

        // While it stays silent, each batch (into reused buffers) still
        // returns within the deadline, without it.
        let sizes = cluster.column_bytes(&request()).unwrap();
        let mut column = vec![0u8; sizes[0]];
        let mut rows = BatchRows::default();
        for _ in 0..2 {
            let start = Instant::now();
            cluster.sample_into(&request(), &mut [&mut column[..]], &mut rows).unwrap();
            let took = start.elapsed();
            assert!(took < CALL_TIMEOUT + SLACK, "sample_into returned after {took:?}");
            assert!(rows.keys.iter().all(|k| k.shard == 0));
            assert!(rows.lost.iter().any(|l| l.shard == 1), "{:?}", rows.lost);
        }
    });
}

#[test]
fn an_insert_into_a_silent_shard_ends_within_the_deadline() {
    within(60, || {
        let server = shard(0, 10, None);
        let proxy = Proxy::start(server.local_addr());
        let cluster = ClusterClient::new(config(vec![proxy.addr().to_string()])).unwrap();
        let one = || RemoteTrajectory { steps: 1, columns: vec![vec![1u8; OBS as usize].into()], priority: None };
        cluster.insert(WriteTarget::Shard(0), vec![one()], 0).unwrap();
        proxy.partition();
        let start = Instant::now();
        let e = cluster.insert(WriteTarget::Shard(0), vec![one(), one()], 0).unwrap_err();
        let took = start.elapsed();
        assert!(took < CALL_TIMEOUT + SLACK, "insert returned after {took:?}: {e}");
        let start = Instant::now();
        assert!(cluster.info(0).is_err());
        assert!(start.elapsed() < CALL_TIMEOUT + SLACK);
    });
}

/// A CA and a `localhost` certificate it signed, as PEM files in `dir`:
/// (CA PEM, certificate path, key path).
fn tls_files(dir: &std::path::Path) -> (String, std::path::PathBuf, std::path::PathBuf) {
    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair};
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, "deadline test CA");
    let ca_key = KeyPair::generate().unwrap();
    let ca = params.self_signed(&ca_key).unwrap();
    let key = KeyPair::generate().unwrap();
    let cert = CertificateParams::new(vec!["localhost".to_owned()]).unwrap().signed_by(&key, &ca, &ca_key).unwrap();
    std::fs::create_dir_all(dir).unwrap();
    let (cert_path, key_path) = (dir.join("server.pem"), dir.join("server.key"));
    std::fs::write(&cert_path, cert.pem()).unwrap();
    std::fs::write(&key_path, key.serialize_pem()).unwrap();
    (ca.pem(), cert_path, key_path)
}

#[test]
fn keepalive_pings_close_a_connection_that_went_silent_plain_and_tls() {
    within(90, || {
        let dir = std::env::temp_dir().join(format!("gear-net-keepalive-{}", std::process::id()));
        let (ca, cert, key) = tls_files(&dir);
        for tls in [false, true] {
            let mut server_config = ServerConfig::new("127.0.0.1:0".parse().unwrap(), 0, TOKEN);
            if tls {
                server_config.tls_cert = Some(cert.clone());
                server_config.tls_key = Some(key.clone());
            }
            let server = shard(0, 10, Some(server_config));
            let proxy = Proxy::start(server.local_addr());
            let mut config = config(vec![proxy.addr().to_string()]);
            config.keepalive_interval = Duration::from_millis(200);
            config.keepalive_timeout = Duration::from_millis(300);
            if tls {
                config.tls = Some(ClientTls::new(ca.clone().into_bytes(), Some("localhost".into())).unwrap());
            }
            let cluster = ClusterClient::new(config).unwrap();
            cluster.info(0).unwrap();
            assert!(!proxy.client_closed());
            // The link goes silent both ways; no call is in flight. The
            // pings go unanswered and the client closes the connection.
            proxy.partition();
            let start = Instant::now();
            while !proxy.client_closed() && start.elapsed() < Duration::from_secs(10) {
                std::thread::sleep(Duration::from_millis(20));
            }
            assert!(proxy.client_closed(), "tls {tls}: the silent connection was still open after 10 s");
        }
        let _ = std::fs::remove_dir_all(&dir);
    });
}
