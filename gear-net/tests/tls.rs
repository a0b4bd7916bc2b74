//! TLS between clients and shard servers: a self-signed CA made here with
//! rcgen signs the server's (and a client's) certificate.

use gear_api::ReplayTable;
use gear_core::{ColumnSpec, DType, TableSpec, WindowSpec};
use gear_net::{
    ClientTls, ClusterClient, ClusterConfig, ClusterSample, Error, RemoteTrajectory, ServerConfig, ServerHandle,
    StrategyInfo, WriteTarget,
};
use gear_sampler::{StrategyKind, StrategyParams};
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair};
use std::path::{Path, PathBuf};
use std::time::Duration;

const TOKEN: &str = "tls-test-token-0123456";

/// A CA: its certificate (PEM), and what signs with it.
struct Ca {
    pem: String,
    cert: rcgen::Certificate,
    key: KeyPair,
}

fn new_ca(name: &str) -> Ca {
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, name);
    let key = KeyPair::generate().unwrap();
    let cert = params.self_signed(&key).unwrap();
    Ca { pem: cert.pem(), cert, key }
}

/// A certificate for `name` signed by `ca`: (certificate PEM, key PEM).
fn leaf(ca: &Ca, name: &str) -> (String, String) {
    let key = KeyPair::generate().unwrap();
    let cert = CertificateParams::new(vec![name.to_owned()]).unwrap().signed_by(&key, &ca.cert, &ca.key).unwrap();
    (cert.pem(), key.serialize_pem())
}

/// A fresh directory for this test's PEM files.
fn dir(test: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("gear-net-tls-{test}-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

fn server_config(cert: Option<PathBuf>, key: Option<PathBuf>, client_ca: Option<PathBuf>) -> ServerConfig {
    ServerConfig {
        tls_cert: cert,
        tls_key: key,
        tls_client_ca: client_ca,
        ..ServerConfig::new("127.0.0.1:0".parse().unwrap(), 0, TOKEN)
    }
}

fn start(config: &ServerConfig) -> gear_net::Result<ServerHandle> {
    let spec = TableSpec::new(vec![ColumnSpec::new("id", DType::I64, vec![])], 2, 16).unwrap();
    let strategy = StrategyInfo { kind: StrategyKind::Uniform, params: StrategyParams::default() };
    ServerHandle::start(ReplayTable::builder(spec).build().unwrap(), config, strategy)
}

fn client(server: &ServerHandle, tls: Option<ClientTls>, token: &str) -> ClusterClient {
    let mut config = ClusterConfig::new(vec![server.local_addr().to_string()], token);
    config.call_timeout = Duration::from_secs(3);
    config.connect_timeout = Duration::from_secs(1);
    config.tls = tls;
    ClusterClient::new(config).unwrap()
}

fn one() -> Vec<RemoteTrajectory> {
    vec![RemoteTrajectory { steps: 1, columns: vec![7i64.to_le_bytes().to_vec().into()], priority: None }]
}

fn request() -> ClusterSample {
    ClusterSample { rows: 4, window: WindowSpec::last(1), columns: vec![], random_start: false }
}

#[test]
fn tls_clients_with_the_ca_insert_and_sample_others_are_refused() {
    let d = dir("basic");
    let ca = new_ca("gear test CA");
    let (cert, key) = leaf(&ca, "localhost");
    let config = server_config(Some(write(&d, "server.pem", &cert)), Some(write(&d, "server.key", &key)), None);
    let server = start(&config).unwrap();
    let trusted = || Some(ClientTls::new(ca.pem.clone().into_bytes(), Some("localhost".into())).unwrap());

    let good = client(&server, trusted(), TOKEN);
    good.insert(WriteTarget::Shard(0), one(), 0).unwrap();
    let batch = good.sample(&request()).unwrap();
    assert_eq!(batch.columns[0], 7i64.to_le_bytes().repeat(4));

    // Plain TCP against a TLS server: refused, before the deadline.
    let e = client(&server, None, TOKEN).info(0).unwrap_err();
    eprintln!("plain client: {e}");
    assert!(matches!(e, Error::Status { .. }), "{e}");

    // A CA that did not sign the server's certificate.
    let other = new_ca("another CA");
    let e = client(&server, Some(ClientTls::new(other.pem.into_bytes(), Some("localhost".into())).unwrap()), TOKEN)
        .info(0)
        .unwrap_err();
    eprintln!("wrong CA: {e}");
    assert!(e.to_string().contains("certificate"), "{e}");

    // The token is still checked over TLS.
    let e = client(&server, trusted(), "wrong-token-0123456789").info(0).unwrap_err();
    assert!(matches!(e, Error::Status { ref status, .. } if status.code() == tonic::Code::Unauthenticated), "{e}");
    let _ = std::fs::remove_dir_all(d);
}

#[test]
fn mutual_tls_needs_a_client_certificate() {
    let d = dir("mutual");
    let ca = new_ca("gear test CA");
    let (cert, key) = leaf(&ca, "localhost");
    let ca_file = write(&d, "ca.pem", &ca.pem);
    let config =
        server_config(Some(write(&d, "server.pem", &cert)), Some(write(&d, "server.key", &key)), Some(ca_file.clone()));
    let server = start(&config).unwrap();
    let anonymous = ClientTls::from_file(&ca_file, Some("localhost".into())).unwrap();
    assert!(client(&server, Some(anonymous.clone()), TOKEN).info(0).is_err());
    let (client_cert, client_key) = leaf(&ca, "trainer-0");
    let known = anonymous
        .with_identity_files(&write(&d, "client.pem", &client_cert), &write(&d, "client.key", &client_key))
        .unwrap();
    client(&server, Some(known), TOKEN).info(0).unwrap();
    let _ = std::fs::remove_dir_all(d);
}

#[test]
fn bad_certificate_files_are_named_at_start() {
    let d = dir("bad");
    let ca = new_ca("gear test CA");
    let (cert, key) = leaf(&ca, "localhost");
    let cert = write(&d, "server.pem", &cert);
    let key = write(&d, "server.key", &key);
    let missing = d.join("missing.pem");
    let garbage = write(&d, "garbage.pem", "not a pem file\n");
    let err = |c: &ServerConfig| start(c).unwrap_err().to_string();

    let e = err(&server_config(Some(missing.clone()), Some(key.clone()), None));
    assert!(e.contains("missing.pem"), "{e}");
    let e = err(&server_config(Some(garbage.clone()), Some(key.clone()), None));
    assert!(e.contains("garbage.pem") && e.contains("no PEM certificate"), "{e}");
    let e = err(&server_config(Some(cert.clone()), Some(garbage.clone()), None));
    assert!(e.contains("garbage.pem") && e.contains("private key"), "{e}");
    let e = err(&server_config(Some(cert.clone()), Some(cert.clone()), None));
    assert!(e.contains("server.pem") && e.contains("no PEM private key"), "{e}");
    let e = err(&server_config(Some(cert.clone()), None, None));
    assert!(e.contains("tls_cert needs tls_key"), "{e}");
    let e = err(&server_config(Some(cert), Some(key), Some(garbage)));
    assert!(e.contains("garbage.pem"), "{e}");
    let e = ClientTls::from_file(&missing, None).unwrap_err().to_string();
    assert!(e.contains("missing.pem"), "{e}");
    let _ = std::fs::remove_dir_all(d);
}
