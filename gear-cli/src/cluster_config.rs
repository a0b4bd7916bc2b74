//! Cluster files (parsed by gear-net's [`ClusterFile`], which documents the
//! format) and `gear cluster-info`, which reads one and asks every shard
//! its counters.

use gear_api::{Error, Result};
pub use gear_net::cluster_file::ClusterFile;
use gear_net::ClusterClient;
use std::path::Path;

fn net(e: gear_net::Error) -> Error {
    Error::Backend(Box::new(e))
}

/// `gear cluster-info`: every shard's counters, or why it did not answer.
pub fn cluster_info(path: &Path) -> Result<()> {
    let client =
        ClusterClient::new(ClusterFile::load(path).map_err(net)?.client_config().map_err(net)?).map_err(net)?;
    let mut failed = 0;
    for s in 0..client.shards() {
        match client.info(s) {
            Ok(i) => println!(
                "shard {s}: size {}/{} inserts {} samples {} evictions {} (incarnation {:#x})",
                i.size, i.capacity, i.inserts, i.samples, i.evictions, i.incarnation
            ),
            Err(e) => {
                failed += 1;
                // The error names the shard already.
                println!("{e}");
            }
        }
    }
    if failed > 0 {
        return Err(Error::Backend(format!("{failed} of {} shards did not answer", client.shards()).into()));
    }
    Ok(())
}
