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
use config::{ServeConfig, TableConfig};
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
fn the_local_cluster_example_parses_and_is_small() {
    let c = shard_config("local/shard.toml");
    assert!(c.grpc.is_some(), "a [grpc] section (gear cluster up sets listen and shard)");
    let bytes = c.builder().unwrap().check().unwrap();
    assert!(bytes < 64 << 20, "three local shards fit any /dev/shm: {bytes} bytes each");
}

#[test]
fn the_multi_table_example_parses() {
    let c = ServeConfig::load(&deploy("multi-table/shard.toml")).unwrap();
    assert!(c.several);
    let names: Vec<(&str, &str)> = c.tables.iter().map(|t| (t.name.as_str(), t.shm())).collect();
    assert_eq!(names, [("replay", "replay-shard0"), ("queue", "queue-shard0")]);
    for t in &c.tables {
        t.builder().unwrap_or_else(|e| panic!("table `{}`: {e}", t.name));
    }
    let (replay, queue) = (&c.tables[0], &c.tables[1]);
    assert_eq!((replay.sampler.kind.as_str(), queue.sampler.kind.as_str()), ("prioritized", "fifo"));
    assert_eq!(queue.max_times_sampled, Some(1));
    assert_eq!(queue.rate_limiter.as_ref().and_then(|l| l.queue), Some(1024));
    assert_eq!(c.grpc.as_ref().map(|g| g.shard), Some(0));
    assert!(c.metrics.is_some());
    let cluster = ClusterFile::load(&deploy("multi-table/cluster.toml")).unwrap();
    assert_eq!(cluster.table.as_deref(), Some("replay"));
    let mut with_token = cluster.clone();
    with_token.token = Some("0123456789abcdef0".into());
    assert_eq!(with_token.client_config().unwrap().table, "replay");
}

#[test]
fn the_readme_multi_table_config_parses_and_builds() {
    let readme = std::fs::read_to_string(deploy("../README.md")).unwrap();
    let block = readme
        .split("```toml\n")
        .skip(1)
        .map(|b| b.split("```").next().unwrap())
        .find(|b| b.contains("[[tables]]"))
        .expect("the README shows a [[tables]] config");
    let c = ServeConfig::parse(block).unwrap();
    let names: Vec<&str> = c.tables.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["replay", "queue"]);
    for t in &c.tables {
        t.builder().unwrap_or_else(|e| panic!("table `{}`: {e}", t.name));
    }
    assert!(c.grpc.is_some() && c.metrics.is_some());
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

#[test]
fn cluster_info_names_shards_that_do_not_answer() {
    let dir = std::env::temp_dir().join(format!("gear-cluster-info-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("cluster.toml");
    // Port 1 on loopback: nothing listens, the connection is refused.
    std::fs::write(&file, "shards = [\"127.0.0.1:1\"]\ntoken = \"0123456789abcdef0\"\nconnect_timeout_ms = 500\n")
        .unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_gear"))
        .args(["cluster-info", "--wait", "0", "--cluster"])
        .arg(&file)
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(!out.status.success());
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stdout.contains("shard 0: "), "{stdout}");
    assert!(stderr.contains("1 of 1 shards did not answer"), "{stderr}");
}

#[test]
fn serve_names_a_bad_tls_file_at_start() {
    let dir = std::env::temp_dir().join(format!("gear-serve-tls-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let key = dir.join("server.key");
    std::fs::write(&key, "not a key\n").unwrap();
    let config = dir.join("shard.toml");
    let text = format!(
        "name = \"gear-cli-tls-{}\"\ndir = \"{}\"\nmax_len = 4\ncapacity = 4\n[[columns]]\nname = \"x\"\ndtype = \"f32\"\n\
         [grpc]\nlisten = \"127.0.0.1:0\"\nshard = 0\ntoken = \"0123456789abcdef0\"\n\
         tls_cert = \"{}\"\ntls_key = \"{}\"\n",
        std::process::id(),
        dir.display(),
        dir.join("missing.pem").display(),
        key.display()
    );
    std::fs::write(&config, text).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_gear"))
        .args(["serve", "--seconds", "5", "--config"])
        .arg(&config)
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("missing.pem"), "{stderr}");
}

#[test]
fn cluster_files_carry_rdma_settings_and_refuse_absurd_ones() {
    let base = "shards = [\"a:1\"]\ntoken = \"0123456789abcdef0\"\n";
    let plain = ClusterFile::parse(base).unwrap();
    assert_eq!(plain.client_config().unwrap().rdma, gear_net::RdmaSettings::default());
    let text = format!("{base}[rdma]\ndevice = \"mlx5_0\"\nport = 2\ngid_index = 3\nservice_level = 5\n");
    let config = ClusterFile::parse(&text).unwrap().client_config().unwrap();
    assert_eq!(
        config.rdma,
        gear_net::RdmaSettings {
            device: Some("mlx5_0".into()),
            port: 2,
            gid_index: Some(3),
            service_level: 5,
            ..gear_net::RdmaSettings::default()
        }
    );
    let e = |rdma: &str| ClusterFile::parse(&format!("{base}[rdma]\n{rdma}\n")).unwrap_err().to_string();
    assert!(e("port = 0").contains("rdma.port is 0"), "{}", e("port = 0"));
    assert!(e("device = \"\"").contains("rdma.device is empty"), "{}", e("device = \"\""));
    assert!(e("gid_index = 300").contains("gid_index"), "{}", e("gid_index = 300"));
    assert!(e("service_level = 16").contains("rdma.service_level is 16"), "{}", e("service_level = 16"));
}

/// The keys serde expects where `text` has the unknown key `zzz_unknown`
/// (its "unknown field ..., expected one of ..." error lists them).
fn expected_keys(text: &str, parse: impl Fn(&str) -> Result<(), String>) -> Vec<String> {
    let e = parse(text).expect_err("an unknown key is refused");
    let list = e.split("expected").nth(1).unwrap_or_else(|| panic!("no list of keys in: {e}"));
    list.split('`').skip(1).step_by(2).map(str::to_owned).collect()
}

#[test]
fn docs_config_md_documents_every_key() {
    let doc = std::fs::read_to_string(deploy("../docs/CONFIG.md")).unwrap();
    let table = "name = \"t\"\nmax_len = 4\ncapacity = 8\n[[columns]]\nname = \"x\"\ndtype = \"f32\"\n";
    let serve = |t: &str| ServeConfig::parse(t).map(drop).map_err(|e| e.to_string());
    let cluster = |t: &str| ClusterFile::parse(t).map(drop).map_err(|e| e.to_string());
    let u = "zzz_unknown = 1\n";
    let grpc = "[grpc]\nlisten = \"127.0.0.1:0\"\nshard = 0\n";
    let sections = [
        ("top level", format!("{u}{table}"), true),
        ("[[columns]]", format!("{table}{u}"), true),
        ("[sampler]", format!("{table}[sampler]\nkind = \"uniform\"\n{u}"), true),
        ("[remover]", format!("{table}[remover]\nkind = \"fifo\"\n{u}"), true),
        ("[rate_limiter]", format!("{table}[rate_limiter]\n{u}"), true),
        ("[grpc]", format!("{table}{grpc}{u}"), true),
        ("[grpc.rdma]", format!("{table}{grpc}[grpc.rdma]\n{u}"), true),
        ("[metrics]", format!("{table}[metrics]\nlisten = \"127.0.0.1:0\"\n{u}"), true),
        ("[[tables]] file", format!("{u}[[tables]]\n{}", table.replace("[[columns]]", "[[tables.columns]]")), true),
        ("cluster file", format!("{u}shards = []\n"), false),
        ("[tls]", format!("shards = []\n[tls]\nca = \"ca.pem\"\n{u}"), false),
        ("[rdma]", format!("shards = []\n[rdma]\n{u}"), false),
    ];
    let mut missing = Vec::new();
    for (section, text, is_serve) in &sections {
        let keys = if *is_serve { expected_keys(text, serve) } else { expected_keys(text, cluster) };
        assert!(!keys.is_empty(), "{section}: no keys found");
        for key in keys {
            // A key, or a section: `key`, [key] or [[key]].
            if !doc.contains(&format!("`{key}`")) && !doc.contains(&format!("[{key}]")) {
                missing.push(format!("{section}: `{key}`"));
            }
        }
    }
    assert!(missing.is_empty(), "docs/CONFIG.md does not document: {missing:?}");
}

#[test]
fn every_readme_toml_block_parses_with_the_real_parsers() {
    let readme = std::fs::read_to_string(deploy("../README.md")).unwrap();
    let blocks: Vec<&str> = readme.split("```toml\n").skip(1).map(|b| b.split("```").next().unwrap()).collect();
    assert!(blocks.len() >= 4, "{} toml blocks", blocks.len());
    // A fragment ([grpc], [grpc.rdma]) goes into the smallest table config.
    let table = "name = \"t\"\nmax_len = 4\ncapacity = 8\n[[columns]]\nname = \"x\"\ndtype = \"f32\"\n";
    for block in blocks {
        if block.contains("shards = ") {
            ClusterFile::parse(block).unwrap_or_else(|e| panic!("{e}\n{block}"));
            continue;
        }
        let whole = block.contains("[[tables]]") || block.contains("name = ");
        let text = if whole {
            block.to_owned()
        } else if block.starts_with("[grpc.rdma]") {
            format!("{table}[grpc]\nlisten = \"127.0.0.1:0\"\nshard = 0\n{block}")
        } else {
            format!("{table}{block}")
        };
        let c = ServeConfig::parse(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
        for t in &c.tables {
            t.builder().unwrap_or_else(|e| panic!("table `{}`: {e}\n{block}", t.name));
        }
    }
}
