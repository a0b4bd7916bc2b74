//! A cluster client refuses configurations that cannot work when it is
//! made, naming what was wrong, instead of failing at the first call.

use gear_net::{ClusterClient, ClusterConfig, Error};
use std::time::Duration;

const TOKEN: &str = "client-config-token-0123456789";

fn refused(config: ClusterConfig) -> String {
    match ClusterClient::new(config) {
        Err(Error::Config(why)) => why,
        Err(e) => panic!("expected a configuration error, got {e}"),
        Ok(_) => panic!("the configuration was accepted"),
    }
}

#[test]
fn shard_addresses_need_a_host_and_a_port() {
    for (addr, why) in [
        ("nonsense", "has no port"),
        ("node0:", "valid port"),
        ("node0:0", "valid port"),
        ("node0:70000", "valid port"),
        ("node0:http", "valid port"),
        (":50051", "has no host"),
        ("[]:50051", "has no host"),
    ] {
        let msg = refused(ClusterConfig::new(vec!["127.0.0.1:50051".into(), addr.into()], TOKEN));
        assert!(msg.contains("shard 1") && msg.contains(addr) && msg.contains(why), "{addr}: {msg}");
    }
    for addr in ["127.0.0.1:50051", "node0.cluster.local:1", "[::1]:50051"] {
        ClusterClient::new(ClusterConfig::new(vec![addr.into()], TOKEN)).unwrap();
    }
}

#[test]
fn zero_deadlines_are_refused() {
    let mut config = ClusterConfig::new(vec!["127.0.0.1:50051".into()], TOKEN);
    config.call_timeout = Duration::ZERO;
    assert!(refused(config.clone()).contains("deadlines"));
    config.call_timeout = Duration::from_secs(1);
    config.connect_timeout = Duration::ZERO;
    assert!(refused(config).contains("deadlines"));
}

#[test]
fn an_unreachable_shard_says_why() {
    // Port 9 (discard) on loopback has no listener here: connecting is refused.
    let mut config = ClusterConfig::new(vec!["127.0.0.1:9".into()], TOKEN);
    config.call_timeout = Duration::from_secs(5);
    let client = ClusterClient::new(config).unwrap();
    let msg = client.info(0).unwrap_err().to_string();
    assert!(msg.starts_with("shard 0: "), "{msg}");
    assert!(msg.contains("cannot connect") && msg.to_lowercase().contains("refused"), "{msg}");
    assert!(!msg.contains("metadata"), "no debug dump of the status: {msg}");
}
