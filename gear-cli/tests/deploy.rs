//! The example deployment files under `deploy/` parse with the real config
//! parsers, so they cannot drift from what `gear serve` and
//! `gear cluster-info` accept.

#[allow(dead_code)]
#[path = "../src/config.rs"]
mod config;

#[allow(dead_code)]
#[path = "../src/cluster_config.rs"]
mod cluster_config;

use cluster_config::ClusterFile;
use config::TableConfig;
use std::path::{Path, PathBuf};

fn deploy(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy").join(path)
}

fn shard_config(path: &str) -> TableConfig {
    let c = TableConfig::load(&deploy(path)).unwrap();
    c.builder().unwrap_or_else(|e| panic!("{path}: {e}"));
    c
}

#[test]
fn the_three_shard_example_parses() {
    let configs: Vec<TableConfig> = (0..3).map(|s| shard_config(&format!("three-shards/shard{s}.toml"))).collect();
    for (s, c) in configs.iter().enumerate() {
        let grpc = c.grpc.as_ref().expect("a [grpc] section");
        assert_eq!(grpc.shard as usize, s);
        assert!(c.rate_limiter.is_some());
        // The files differ only in the shard id and the seed.
        let mut same = c.clone();
        same.seed = 0;
        same.grpc.as_mut().unwrap().shard = 0;
        assert_eq!(same, configs[0]);
    }
    let cluster = ClusterFile::load(&deploy("three-shards/cluster.toml")).unwrap();
    assert_eq!(cluster.shards.len(), 3);
    assert!(cluster.tls.is_none());
}

#[test]
fn the_kubernetes_shard_config_parses() {
    let c = shard_config("k8s/shard.toml");
    let grpc = c.grpc.unwrap();
    assert!(grpc.tls_cert.is_some() && grpc.tls_key.is_some());
    let manifest = std::fs::read_to_string(deploy("k8s/statefulset.yaml")).unwrap();
    for needed in ["medium: Memory", "sizeLimit", "IPC_LOCK", "clusterIP: None", "secretKeyRef", "rdma/"] {
        assert!(manifest.contains(needed), "statefulset.yaml lacks `{needed}`");
    }
}

#[test]
fn cluster_files_with_tls_read_the_ca() {
    let text = "shards = [\"a:1\"]\ntoken = \"0123456789abcdef0\"\n[tls]\nca = \"/nonexistent/ca.pem\"\n";
    let file = ClusterFile::parse(text).unwrap();
    let e = file.client_config().unwrap_err().to_string();
    assert!(e.contains("/nonexistent/ca.pem"), "{e}");
    assert!(ClusterFile::parse("shards = []\ncolour = 1").unwrap_err().to_string().contains("colour"));
}
